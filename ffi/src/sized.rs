//! Structs that travel with their size: the C ABI's rule for growing a
//! struct a caller fills (or lends the library to fill) without breaking a
//! program built against an earlier header.
//!
//! A released struct never changes what its bytes mean; it only grows, by
//! fields added at its end. Every function taking such a struct has a
//! `_sized` entry point that takes the caller's `sizeof` beside it (the
//! header's macro of the plain name passes it, so a rebuilt program always
//! sends the size its header declared), and the library then:
//!
//! - reads (or writes) only the caller's bytes: the fields past them are
//!   zero for a caller that did not know them (off, NULL, the default);
//! - refuses, as `LIVEREG_INCOMPATIBLE`, a larger struct whose bytes past
//!   the library's own are not all zero: a field this library does not
//!   know was set, by a program built against a newer header;
//! - refuses a size no header ever declared.
//!
//! The plain entry points that programs of earlier releases call, without
//! a size, read and write exactly the struct their release declared
//! (`LEGACY_SIZE`), forever.

use livereg::Error;
use std::mem::size_of;

/// A `#[repr(C)]` struct of the C ABI whose size travels with it.
///
/// # Safety
///
/// Every field is an integer, a raw pointer, an `Option` of a function
/// pointer or an array of those, so all-zero bytes are a valid value, and
/// any byte pattern of a field is one (padding included); `SIZES` lists
/// sizes at field boundaries only.
pub(crate) unsafe trait SizedStruct: Copy {
    /// Its name in the header, for errors.
    const NAME: &'static str;
    /// Every size it had in a released header, smallest first; the last is
    /// `size_of::<Self>()`.
    const SIZES: &'static [usize];
    /// The size the plain entry points (without a size) read and write:
    /// the struct as the oldest supported release declared it.
    const LEGACY_SIZE: usize;
}

/// The size a caller passed, checked: one some header declared, or larger
/// than this library's (a newer header).
fn check_size<T: SizedStruct>(size: usize) -> Result<(), Error> {
    if size > size_of::<T>() || T::SIZES.contains(&size) {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "{} of {size} bytes: expected the size a livereg.h declared ({:?}), \
         or a larger one from a newer header",
        T::NAME,
        T::SIZES
    )))
}

/// The all-zero value: every field off, NULL or 0.
fn zeroed<T: SizedStruct>() -> T {
    // SAFETY:
    // - `SizedStruct`'s contract: all-zero bytes are a valid `T`.
    unsafe { std::mem::zeroed() }
}

/// The caller's struct at `from` of `size` bytes, as this library's `T`:
/// its bytes, then zeros for the fields it did not know; `None` for NULL.
///
/// # Errors
///
/// `InvalidArgument` for a size no header declared; `Incompatible` for a
/// larger struct with a byte past this library's struct set (a field this
/// library does not know).
///
/// # Safety
///
/// `from` is NULL or readable for `size` bytes for the call.
pub(crate) unsafe fn read_in<T: SizedStruct>(
    from: *const T,
    size: usize,
) -> Result<Option<T>, Error> {
    if from.is_null() {
        return Ok(None);
    }
    check_size::<T>(size)?;
    let mut value = zeroed::<T>();
    let ours = size_of::<T>();
    let bytes = from.cast::<u8>();
    // SAFETY:
    // - `from` is readable for `size >= min(size, ours)` bytes (this
    //   function's `# Safety`); the copy is byte-wise, so its alignment is
    //   not relied on;
    // - `value` is a local `T`, writable for `ours` bytes, not overlapping;
    // - any bytes at field boundaries make a valid `T` (`SizedStruct`).
    unsafe {
        std::ptr::copy_nonoverlapping(bytes, (&mut value as *mut T).cast::<u8>(), size.min(ours))
    };
    for offset in ours..size {
        // SAFETY:
        // - `offset < size`: within the caller's readable bytes (this
        //   function's `# Safety`).
        if unsafe { bytes.add(offset).read() } != 0 {
            return Err(Error::Incompatible(format!(
                "{} of {size} bytes has byte {offset} set, past the {ours} bytes this \
                 liblivereg ({}) knows: a field of a newer livereg.h; install a library \
                 at least as new as the header the program was built with",
                T::NAME,
                crate::version::VERSION
            )));
        }
    }
    Ok(Some(value))
}

/// Writes `value` into the caller's struct at `to` of `size` bytes: its
/// first `size` bytes, then zeros for fields of a newer header that this
/// library does not know. NULL writes nothing.
///
/// # Errors
///
/// `InvalidArgument` for a size no header declared.
///
/// # Safety
///
/// `to` is NULL or writable for `size` bytes for the call.
pub(crate) unsafe fn write_out<T: SizedStruct>(
    to: *mut T,
    size: usize,
    value: &T,
) -> Result<(), Error> {
    if to.is_null() {
        return Ok(());
    }
    check_size::<T>(size)?;
    let ours = size_of::<T>();
    let bytes = to.cast::<u8>();
    // SAFETY:
    // - `to` is writable for `size` bytes (this function's `# Safety`); the
    //   copy is byte-wise, so its alignment is not relied on;
    // - `value` is readable for `ours >= min(size, ours)` bytes and is not
    //   the caller's memory.
    unsafe {
        std::ptr::copy_nonoverlapping((value as *const T).cast::<u8>(), bytes, size.min(ours));
    }
    if size > ours {
        // SAFETY:
        // - `ours..size` is within the caller's writable bytes (as above).
        unsafe { bytes.add(ours).write_bytes(0, size - ours) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Grown {
        old: u64,
        new: u64,
    }

    // SAFETY: two integers: all-zero and any bytes are valid.
    unsafe impl SizedStruct for Grown {
        const NAME: &'static str = "grown";
        const SIZES: &'static [usize] = &[8, 16];
        const LEGACY_SIZE: usize = 8;
    }

    #[test]
    fn an_older_struct_is_read_with_its_fields_only_and_the_new_ones_zero() {
        let old = [7u64];
        // SAFETY: the pointer is to a local array of at least `size` bytes.
        let read = unsafe { read_in(old.as_ptr().cast::<Grown>(), size_of::<u64>()) };
        let read = read.unwrap().unwrap();
        assert_eq!(read, Grown { old: 7, new: 0 });
    }

    #[test]
    fn a_newer_struct_with_its_unknown_fields_zero_is_read() {
        let newer = [7u64, 8, 0];
        // SAFETY: the pointer is to a local array of at least `size` bytes.
        let read = unsafe { read_in(newer.as_ptr().cast::<Grown>(), 24) }
            .unwrap()
            .unwrap();
        assert_eq!(read, Grown { old: 7, new: 8 });
    }

    #[test]
    fn a_newer_struct_with_an_unknown_field_set_is_refused_naming_it() {
        let newer = [7u64, 8, 9];
        // SAFETY: the pointer is to a local array of at least `size` bytes.
        let error = unsafe { read_in(newer.as_ptr().cast::<Grown>(), 24) }.unwrap_err();
        assert!(matches!(error, Error::Incompatible(_)), "{error}");
        assert!(error.to_string().contains("byte 16"), "{error}");
    }

    #[test]
    fn a_size_no_header_declared_is_refused() {
        let value = [0u64; 2];
        for size in [0, 4, 12] {
            // SAFETY: the pointer is to a local array of at least `size` bytes.
            let error = unsafe { read_in(value.as_ptr().cast::<Grown>(), size) }.unwrap_err();
            assert!(
                matches!(error, Error::InvalidArgument(_)),
                "{size}: {error}"
            );
        }
    }

    #[test]
    fn writing_an_older_struct_touches_only_its_bytes() {
        let mut memory = [1u64, 0xAAAA];
        // SAFETY: the pointer is to a local array of at least `size` bytes.
        unsafe {
            write_out(
                memory.as_mut_ptr().cast::<Grown>(),
                8,
                &Grown { old: 5, new: 6 },
            )
        }
        .unwrap();
        assert_eq!(memory, [5, 0xAAAA]);
    }

    #[test]
    fn writing_a_newer_struct_zeroes_the_fields_this_library_does_not_know() {
        let mut memory = [1u64, 2, 3];
        // SAFETY: the pointer is to a local array of at least `size` bytes.
        unsafe {
            write_out(
                memory.as_mut_ptr().cast::<Grown>(),
                24,
                &Grown { old: 5, new: 6 },
            )
        }
        .unwrap();
        assert_eq!(memory, [5, 6, 0]);
    }
}
