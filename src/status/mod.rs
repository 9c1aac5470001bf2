//! The observers: what the table says, read without taking part. The
//! status of a table and its registrations (`report.rs`), a process's
//! metrics (`metrics.rs`) and their OpenMetrics text (`openmetrics.rs`). It
//! may import the table, the sessions' records and the shared types;
//! nothing of the worker or reaper side acts on what it reads.

pub(crate) mod metrics;
pub(crate) mod openmetrics;
pub(crate) mod report;

pub use metrics::ProcessMetrics;
pub use report::{ExitDetection, RegistrationState, RegistrationStatus, RemoteStatus, Status};
