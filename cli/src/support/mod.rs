//! What the subcommands share: arguments (durations, targets, etcd), the
//! daemon's logging, signals and systemd notification, the metrics
//! endpoint, the cluster view.

#[cfg_attr(not(feature = "etcd"), path = "cluster_unavailable.rs")]
pub mod cluster;
pub mod duration;
pub mod etcd_args;
pub mod logging;
pub mod metrics_endpoint;
pub mod notify;
pub mod outcome;
#[cfg(test)]
pub mod sample_status;
pub mod signals;
pub mod target;
