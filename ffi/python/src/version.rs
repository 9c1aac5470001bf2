//! The releases this module was built from, as Cargo knows them: the
//! package's (`livereg.__version__`) and the native library's within it.

use pyo3::prelude::*;

/// This Python package's release (its wheel's version): the module's
/// `__version__`.
pub const PACKAGE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The release of the livereg library compiled into this module (the
/// version the C library of the same release reports).
#[pyfunction]
pub fn native_version() -> &'static str {
    livereg::VERSION
}
