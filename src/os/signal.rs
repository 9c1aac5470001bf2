//! Raising a signal in the calling thread.

/// Raises `signal` in the calling thread: its handler has run when this
/// returns (unless the thread blocks it).
pub(crate) fn raise_here(signal: i32) -> std::io::Result<()> {
    // SAFETY: `raise` takes a plain integer; an invalid signal number is
    // refused with EINVAL, not undefined.
    if unsafe { libc::raise(signal) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore)] // a system call
    fn a_signal_number_out_of_range_is_refused() {
        let error = raise_here(100_000).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EINVAL));
    }
}
