//! `livereg._native`: the Python package's extension module, over the Rust
//! crate directly. The package (`python/livereg`) re-exports it and adds what
//! is Python by nature: the `Reason` enum, the asyncio driver, the LMCache
//! adapter.

mod beat_thread;
mod callbacks;
mod errors;
mod event;
mod exiting;
mod logging;
mod reaper;
mod reaper_life;
mod renamed;
mod seconds;
mod session;
mod table;
mod version;
mod worker;

use pyo3::prelude::*;

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    logging::install();
    errors::add(module)?;
    module.add_class::<table::Table>()?;
    module.add_class::<worker::Worker>()?;
    module.add_class::<worker::BusyScope>()?;
    module.add_class::<beat_thread::BeatThread>()?;
    module.add_class::<reaper::Reaper>()?;
    module.add_class::<reaper::DrivenReaper>()?;
    module.add_class::<event::DropEvent>()?;
    module.add_function(wrap_pyfunction!(table::create, module)?)?;
    module.add_function(wrap_pyfunction!(table::open, module)?)?;
    module.add_function(wrap_pyfunction!(table::unlink, module)?)?;
    module.add_function(wrap_pyfunction!(session::connect, module)?)?;
    module.add_function(wrap_pyfunction!(session::remote_status, module)?)?;
    module.add_function(wrap_pyfunction!(session::is_address, module)?)?;
    module.add_function(wrap_pyfunction!(session::read_token_file, module)?)?;
    module.add_function(wrap_pyfunction!(exiting::_stop_reapers_at_exit, module)?)?;
    module.add_function(wrap_pyfunction!(version::native_version, module)?)?;
    module.add("__version__", version::PACKAGE_VERSION)?;
    module.add("INFO_MAX", livereg::INFO_MAX)?;
    module.add("LABEL_MAX", livereg::LABEL_MAX)?;
    module.add("BEATS_PER_TIMEOUT", livereg::BEATS_PER_TIMEOUT)?;
    module.add(
        "DEFAULT_REGISTRATION_GRACE",
        livereg::DEFAULT_REGISTRATION_GRACE.as_secs_f64(),
    )?;
    let reasons: Vec<(String, u8)> = livereg::Reason::ALL
        .iter()
        .map(|reason| (reason.as_str().to_uppercase(), *reason as u8))
        .collect();
    module.add("_REASONS", reasons)?;
    let hook = module.getattr("_stop_reapers_at_exit")?;
    module
        .py()
        .import("atexit")?
        .call_method1("register", (hook,))?;
    Ok(())
}
