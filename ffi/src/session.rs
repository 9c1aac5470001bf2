//! Sessions from C: a worker that cannot map the table registers through a
//! reaper's listener and gets an ordinary `livereg_worker`; a reaper serves
//! sessions on an address.

use crate::boundary::{copy_out, guard, hand_out, handle, output, text};
use crate::reaper::livereg_reaper;
use crate::sized::{read_in, write_out, SizedStruct};
use crate::types::livereg_result;
use crate::worker::livereg_worker;
use livereg::{Address, ConnectOptions, TlsClient};
use std::ffi::{c_char, c_void};
use std::path::PathBuf;
use std::time::Duration;

/// How `livereg_connect` opens a session.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct livereg_connect_options {
    /// The listener's token, NUL-terminated (required by `tcp://`
    /// listeners); NULL: none.
    pub token: *const c_char,
    /// How long to wait for the connection and the answer, in ms; 0: the
    /// default (2,000).
    pub connect_timeout_ms: u64,
    /// For a `tls://` address (required there): the CA (PEM file) the
    /// listener's certificate must chain to; NULL: none.
    pub tls_ca_file: *const c_char,
    /// For a listener that requires client certificates: this client's
    /// certificate and key (PEM files); NULL: none.
    pub tls_cert_file: *const c_char,
    /// See `tls_cert_file`.
    pub tls_key_file: *const c_char,
}

// SAFETY: an integer and raw pointers only: all-zero is NULL and 0.
unsafe impl SizedStruct for livereg_connect_options {
    const NAME: &'static str = "livereg_connect_options";
    const SIZES: &'static [usize] = &[40];
    /// Unchanged since the oldest supported release.
    const LEGACY_SIZE: usize = 40;
}
const _: () = assert!(std::mem::size_of::<livereg_connect_options>() == 40);

/// The defaults: no token, the default timeout, no TLS files.
fn default_connect_options() -> livereg_connect_options {
    livereg_connect_options {
        token: std::ptr::null(),
        connect_timeout_ms: 0,
        tls_ca_file: std::ptr::null(),
        tls_cert_file: std::ptr::null(),
        tls_key_file: std::ptr::null(),
    }
}

/// `livereg_connect_options_default_sized(out, size)`: the defaults in the
/// caller's struct of `size` bytes (the header's `livereg_connect_options_default`
/// passes its `sizeof`).
///
/// # Safety
///
/// `out` is NULL (nothing is written) or writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn livereg_connect_options_default_sized(
    out: *mut livereg_connect_options,
    size: usize,
) {
    // A size no header declared writes nothing; `livereg_last_error` says why.
    // SAFETY: `out` is NULL or writable for `size` bytes (this function's
    // `# Safety`), as `write_out` requires.
    let _ = guard(|| unsafe { write_out(out, size, &default_connect_options()) });
}

/// `livereg_connect_options_default(out)`, as programs built before sizes
/// travelled call it: writes the struct as they declared it.
///
/// # Safety
///
/// `out` is NULL (nothing is written) or writable for the struct of the
/// oldest supported header.
#[no_mangle]
pub unsafe extern "C" fn livereg_connect_options_default(out: *mut livereg_connect_options) {
    // SAFETY: this function's `# Safety`, with that struct's size.
    unsafe { livereg_connect_options_default_sized(out, livereg_connect_options::LEGACY_SIZE) }
}

/// `livereg_connect_sized(address, opts, opts_size, instance_id, label,
/// out)`: `opts` (of `opts_size` bytes) and `label` may be NULL.
///
/// # Safety
///
/// `address` is a NUL-terminated string; `opts` is NULL or points to an
/// initialised struct of `opts_size` bytes whose strings are NULL or
/// NUL-terminated; `label` is NULL or NUL-terminated; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_connect_sized(
    address: *const c_char,
    opts: *const livereg_connect_options,
    opts_size: usize,
    instance_id: u64,
    label: *const c_char,
    out: *mut *mut livereg_worker,
) -> livereg_result {
    guard(|| {
        // SAFETY: the output rule (`output`), this function's `# Safety`.
        let out = unsafe { output(out, "out") }?;
        // SAFETY: the string rule (`text`), this function's `# Safety`.
        let address = unsafe { text(address, "address") }?;
        let label = if label.is_null() {
            ""
        } else {
            // SAFETY: as `address`.
            unsafe { text(label, "label") }?
        };
        let mut options = ConnectOptions::default();
        // SAFETY: `opts` is NULL or readable for `opts_size` bytes (this
        // function's `# Safety`), as `read_in` requires.
        if let Some(opts) = unsafe { read_in(opts, opts_size) }? {
            if !opts.token.is_null() {
                // SAFETY: the string rule (`text`), this function's `# Safety`.
                options.token = Some(unsafe { text(opts.token, "token") }?.as_bytes().to_vec());
            }
            if opts.connect_timeout_ms > 0 {
                options.connect_timeout = Some(Duration::from_millis(opts.connect_timeout_ms));
            }
            // SAFETY: each is NULL or NUL-terminated (this function's
            // `# Safety`), as `optional_path` requires.
            let (ca, cert, key) = unsafe {
                (
                    optional_path(opts.tls_ca_file, "tls_ca_file")?,
                    optional_path(opts.tls_cert_file, "tls_cert_file")?,
                    optional_path(opts.tls_key_file, "tls_key_file")?,
                )
            };
            options.tls = ca.map(|ca| TlsClient { ca, cert, key });
        }
        let worker = livereg::connect(address, instance_id, label, &options)?;
        hand_out(out, livereg_worker(worker));
        Ok(())
    })
}

/// `livereg_connect(address, opts, instance_id, label, out)`, as programs
/// built before sizes travelled call it: reads the struct as they declared it.
///
/// # Safety
///
/// As `livereg_connect_sized`, `opts` of the oldest supported header's size.
#[no_mangle]
pub unsafe extern "C" fn livereg_connect(
    address: *const c_char,
    opts: *const livereg_connect_options,
    instance_id: u64,
    label: *const c_char,
    out: *mut *mut livereg_worker,
) -> livereg_result {
    let size = livereg_connect_options::LEGACY_SIZE;
    // SAFETY: this function's `# Safety` is `livereg_connect_sized`'s.
    unsafe { livereg_connect_sized(address, opts, size, instance_id, label, out) }
}

/// A path from a C string that may be NULL.
///
/// # Safety
///
/// `path` is NULL or a NUL-terminated string valid for the call.
unsafe fn optional_path(
    path: *const c_char,
    argument: &str,
) -> Result<Option<PathBuf>, livereg::Error> {
    if path.is_null() {
        return Ok(None);
    }
    // SAFETY: the string rule (`text`), this function's `# Safety`.
    Ok(Some(PathBuf::from(unsafe { text(path, argument) }?)))
}

/// `livereg_worker_get_info(worker, buf, cap, len)`: the server's info area,
/// from the table or as the listener last delivered it.
///
/// # Safety
///
/// `worker` is a live handle; `buf` is writable for `cap` bytes (or NULL
/// with `cap` 0); `len` is writable.
#[no_mangle]
pub unsafe extern "C" fn livereg_worker_get_info(
    worker: *const livereg_worker,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> livereg_result {
    guard(|| {
        // SAFETY: the handle rule (`handle`), this function\'s `# Safety`.
        let worker = unsafe { handle(worker) }?;
        // SAFETY: the output rule (`output`), this function's `# Safety`.
        let len = unsafe { output(len, "len") }?;
        let info = worker.0.info()?;
        *len = info.len();
        // SAFETY: the buffer rule (`copy_out`), this function's `# Safety`.
        unsafe { copy_out(&info, buf.cast::<u8>(), cap, "the info") }
    })
}

/// `livereg_reaper_listen(reaper, address, token)`: serves sessions at
/// `address` for the reaper's life; `token` may be NULL (not for `tcp://`).
///
/// # Safety
///
/// `reaper` is NULL or a live handle; `address` is NUL-terminated; `token`
/// is NULL or NUL-terminated. From the reaper's own callback it is refused
/// (`LIVEREG_BUSY`).
#[no_mangle]
pub unsafe extern "C" fn livereg_reaper_listen(
    reaper: *mut livereg_reaper,
    address: *const c_char,
    token: *const c_char,
) -> livereg_result {
    guard(|| {
        // SAFETY: the string rule (`text`), this function's `# Safety`.
        let address = Address::parse(unsafe { text(address, "address") }?)?;
        let token = if token.is_null() {
            None
        } else {
            // SAFETY: as `address`.
            Some(unsafe { text(token, "token") }?.as_bytes().to_vec())
        };
        if crate::reaper::inside_own_scan(reaper) {
            // Its scan holds the reaper: from its own callback, refused.
            return Err(crate::reaper::reentered("livereg_reaper_listen"));
        }
        // SAFETY: the handle rule (`handle`), this function's `# Safety`:
        // only a shared reference (a driven reaper's own callback may be
        // scanning it).
        match unsafe { handle(reaper) }? {
            livereg_reaper::Driven { reaper, .. } => reaper
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .listen(address, token),
            livereg_reaper::Thread(thread) => thread.listen(address, token),
        }
    })
}
