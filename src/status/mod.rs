//! The observers: what the table says, read without taking part. The
//! status of a table and its registrations (`report.rs`), a process's
//! metrics (`metrics.rs`) and their OpenMetrics text (`openmetrics.rs`),
//! the files processes own (`owned.rs`),
//! and a table's status asked of its listener (`remote.rs`). It
//! may import the table, the sessions (their records, the status question)
//! and the shared types; the reaper side and the fleet import it.

pub(crate) mod metrics;
pub(crate) mod openmetrics;
pub(crate) mod owned;
pub(crate) mod remote;
pub(crate) mod report;

pub use metrics::ProcessMetrics;
pub use owned::{OwnedFilesStatus, OwnerStatus};
pub use remote::remote_status;
pub use report::{ExitDetection, RegistrationState, RegistrationStatus, RemoteStatus, Status};
