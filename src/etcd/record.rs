//! The key schema and the value published for one registration.

use super::error::EtcdError;
use crate::event::Reason;
use serde::{Deserialize, Serialize};

/// What a key holds: one live registration of one host's table (JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterRecord {
    /// The host that published it.
    pub host: String,
    /// The table (its name; for a table opened by path, the file name).
    pub table: String,
    /// The worker's instance id.
    pub instance_id: u64,
    /// Its label.
    pub label: String,
    /// Its pid, in the registrant's PID namespace.
    pub pid: u32,
    /// Its slot and the slot's generation: together they name this
    /// registration, even after the id registers again.
    pub slot: u32,
    /// See `slot`.
    pub generation: u32,
    /// When it registered, as Unix time (the publisher's wall clock).
    pub registered_unix_seconds: f64,
    /// The host reaper's boot token (changes whenever that reaper restarts).
    pub boot_token: u64,
    /// `null` while live; the end reason in the last value before the delete.
    pub ended: Option<Reason>,
    /// Whether its process has begun to exit (written at once; absent
    /// while false, as records before it had none).
    #[serde(default, skip_serializing_if = "is_false")]
    pub dying: bool,
}

fn is_false(value: &bool) -> bool {
    !value
}

impl ClusterRecord {
    /// The value's JSON text.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a record serialises")
    }
}

/// `<prefix>` without a trailing `/`.
pub(crate) fn trim_prefix(prefix: &str) -> &str {
    prefix.trim_end_matches('/')
}

/// The name a table has in keys: its name, or a path's file name.
pub(crate) fn table_component(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// `<prefix>/<host>/<table>/`: every key of one host's table.
pub(crate) fn table_prefix(prefix: &str, host: &str, table: &str) -> String {
    format!("{}/{host}/{}/", trim_prefix(prefix), table_component(table))
}

/// `<prefix>/<host>/<table>/<instance_id>`.
pub(crate) fn key(prefix: &str, host: &str, table: &str, instance_id: u64) -> String {
    format!("{}{instance_id}", table_prefix(prefix, host, table))
}

/// Splits a key under `<prefix>/` into host, table and instance id; `None`
/// for a key of another shape.
pub(crate) fn parse_key<'k>(prefix: &str, key: &'k str) -> Option<(&'k str, &'k str, u64)> {
    let rest = key.strip_prefix(trim_prefix(prefix))?.strip_prefix('/')?;
    let mut parts = rest.split('/');
    let (host, table, id) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || host.is_empty() || table.is_empty() {
        return None;
    }
    Some((host, table, id.parse().ok()?))
}

/// A key component (the host) must be non-empty and free of `/`.
pub(crate) fn check_component(what: &str, value: &str) -> Result<(), EtcdError> {
    if value.is_empty() || value.contains('/') {
        return Err(EtcdError::InvalidOptions(format!(
            "etcd {what} name '{value}': expected a non-empty name without '/'"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_through_the_schema() {
        let key = key("/livereg/", "node-1", "/dev/shm/kv", 42);
        assert_eq!(key, "/livereg/node-1/kv/42");
        assert_eq!(parse_key("/livereg", &key), Some(("node-1", "kv", 42)));
    }

    #[test]
    fn keys_of_another_shape_are_not_registrations() {
        for key in [
            "/livereg/node-1/kv",
            "/livereg/node-1/kv/x",
            "/livereg/node-1/kv/1/2",
            "/livereg//kv/1",
            "/liveregs/node-1/kv/1",
            "/other/node-1/kv/1",
        ] {
            assert_eq!(parse_key("/livereg", key), None, "{key}");
        }
    }

    #[test]
    fn a_host_with_a_slash_is_refused() {
        let error = check_component("host", "a/b").unwrap_err().to_string();
        assert!(
            error.contains("'a/b'") && error.contains("without '/'"),
            "{error}"
        );
        assert!(check_component("host", "").is_err());
    }

    #[test]
    fn an_ended_record_carries_its_reason_in_json() {
        let record = ClusterRecord {
            host: "h".into(),
            table: "t".into(),
            instance_id: 7,
            label: "gpu0".into(),
            pid: 10,
            slot: 1,
            generation: 2,
            registered_unix_seconds: 1.5,
            boot_token: 3,
            ended: Some(Reason::ProcessExited),
            dying: false,
        };
        let json = record.to_json();
        assert!(json.contains(r#""ended":"process_exited""#), "{json}");
        assert_eq!(
            serde_json::from_str::<ClusterRecord>(&json).unwrap(),
            record
        );
    }
}
