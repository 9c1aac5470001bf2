//! Beyond one host: a table's live registrations published to etcd, and
//! every host's read back (feature `etcd`).
//!
//! A [`Publisher`] runs beside a reaper on its own thread. It holds **one**
//! etcd lease (kept alive at a third of its TTL) and keeps one key per live
//! registration under it:
//!
//! ```text
//! <prefix>/<host>/<table>/<instance_id>  →  {"host": …, "table": …, "instance_id": …,
//!     "label": …, "pid": …, "slot": …, "generation": …,
//!     "registered_unix_seconds": …, "boot_token": …, "ended": null}
//! ```
//!
//! When a registration ends, its key is written once more with `"ended"` set
//! to the reason and then deleted: a watcher sees why in the delete's
//! previous value (`etcdctl watch --prefix --prev-kv`). When the host (its
//! reaper) dies, the lease expires and etcd deletes its keys.
//!
//! etcd is never on the heartbeat path and never holds up the reaper: the
//! publisher works from snapshots of the table (newest state wins), so an
//! outage costs only publishing. It retries with backoff and, once back,
//! rewrites the host's keys from the table.
//!
//! [`ClusterStatus::fetch`] reads every host's keys and lease TTLs back;
//! [`ClusterWatch`] follows them: a snapshot, then each registration,
//! end (with its reason) and host gone as it happens.
//!
//! It may import the observers (a table's status), the table, the OS calls
//! and the shared types; only the crate root imports it.

mod backoff;
mod cluster;
mod connection;
mod error;
mod lease;
mod mirror;
mod options;
mod plan;
mod publisher;
mod record;
mod shared;
mod view;
mod watch;

pub use cluster::{ClusterStatus, ClusterTable, HostStatus};
pub use error::EtcdError;
pub use options::{EtcdCredentials, EtcdOptions, EtcdTls, DEFAULT_PREFIX, DEFAULT_TTL};
pub use publisher::{EndSink, Publisher};
pub use record::ClusterRecord;
pub use view::{ClusterChange, ClusterEvent};
pub use watch::{ClusterWatch, WatchCounts};

pub use crate::os::hostname::hostname;
