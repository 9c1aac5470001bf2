//! Every host's registrations, read back from etcd (`livereg status
//! --cluster`).

use super::error::EtcdError;
use super::options::EtcdOptions;
use super::record::{self, ClusterRecord};
use etcd_client::GetOptions;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// How long the read may take, connection included.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What etcd holds under a prefix, grouped by host.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterStatus {
    /// The prefix read.
    pub prefix: String,
    /// Hosts by name.
    pub hosts: Vec<HostStatus>,
    /// Keys under the prefix that are not `<host>/<table>/<instance_id>`
    /// with a record as value.
    pub foreign_keys: usize,
}

/// One host's published tables.
#[derive(Clone, Debug, Serialize)]
pub struct HostStatus {
    /// The host's name.
    pub host: String,
    /// Seconds until its first lease expires if its reaper stops keeping it
    /// alive (`None`: no lease of its is still held).
    pub lease_ttl_seconds: Option<i64>,
    /// Its live registrations, over all its tables.
    pub live: usize,
    /// Its tables by name.
    pub tables: Vec<ClusterTable>,
}

/// One table of one host.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterTable {
    /// The table's name.
    pub table: String,
    /// The lease its keys are under (hex, as `etcdctl lease` prints it).
    pub lease: String,
    /// Seconds left on that lease (`None`: it just expired).
    pub lease_ttl_seconds: Option<i64>,
    /// Its live registrations by instance id.
    pub registrations: Vec<ClusterRecord>,
}

impl ClusterStatus {
    /// Reads every key under `options.prefix` and the TTL left on each
    /// lease, reaching etcd as `options` say (endpoints, TLS, credentials;
    /// the host and TTL are not used).
    ///
    /// # Errors
    ///
    /// [`EtcdError::Etcd`] or [`EtcdError::Timeout`] if etcd cannot be read
    /// (unreachable, a certificate that does not verify, refused
    /// credentials); [`EtcdError::InvalidOptions`] for an empty endpoint list
    /// or endpoints that disagree with the TLS setting.
    pub fn fetch(options: &EtcdOptions) -> Result<ClusterStatus, EtcdError> {
        super::options::check_endpoints(&options.endpoints, options.tls.is_some())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let read =
            runtime.block_on(async { tokio::time::timeout(READ_TIMEOUT, read(options)).await });
        read.unwrap_or_else(|_| {
            Err(EtcdError::Timeout {
                endpoints: options.endpoint_list(),
                context: format!("read {}", options.prefix),
                timeout: READ_TIMEOUT,
            })
        })
    }
}

/// host → table → (lease, live records).
type Grouped = BTreeMap<String, BTreeMap<String, (i64, Vec<ClusterRecord>)>>;

async fn read(options: &EtcdOptions) -> Result<ClusterStatus, EtcdError> {
    let prefix = options.prefix.as_str();
    let failed = |context: &str| {
        let context = context.to_owned();
        move |source| EtcdError::Etcd {
            endpoints: options.endpoint_list(),
            context,
            source,
        }
    };
    let mut client = super::connection::connect(options, READ_TIMEOUT)
        .await
        .map_err(failed("connect"))?;
    let under = format!("{}/", record::trim_prefix(prefix));
    let keys = client
        .get(under.as_str(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(failed(&format!("read {under}")))?;
    let (grouped, foreign_keys) = group(prefix, keys.kvs());
    let mut ttl_left: HashMap<i64, Option<i64>> = HashMap::new();
    for lease in grouped
        .values()
        .flat_map(|tables| tables.values().map(|t| t.0))
    {
        if ttl_left.contains_key(&lease) || lease == 0 {
            continue;
        }
        let left = client
            .lease_time_to_live(lease, None)
            .await
            .map_err(failed("read a lease"))?;
        ttl_left.insert(lease, (left.ttl() >= 0).then_some(left.ttl()));
    }
    Ok(ClusterStatus {
        prefix: record::trim_prefix(prefix).to_owned(),
        hosts: hosts(grouped, &ttl_left),
        foreign_keys,
    })
}

/// The live records under `prefix` by host and table, and how many keys
/// are not records.
fn group(prefix: &str, kvs: &[etcd_client::KeyValue]) -> (Grouped, usize) {
    let mut grouped = Grouped::new();
    let mut foreign_keys = 0;
    for kv in kvs {
        let key = String::from_utf8_lossy(kv.key());
        let parsed = record::parse_key(prefix, &key);
        let value = serde_json::from_slice::<ClusterRecord>(kv.value());
        let (Some((host, table, _)), Ok(value)) = (parsed, value) else {
            foreign_keys += 1;
            continue;
        };
        if value.ended.is_some() {
            // Its registration ended: the key holds its last value for a
            // moment, until the publisher's delete.
            continue;
        }
        let entry = grouped
            .entry(host.to_owned())
            .or_default()
            .entry(table.to_owned())
            .or_insert((kv.lease(), Vec::new()));
        entry.1.push(value);
    }
    (grouped, foreign_keys)
}

/// Each host with its tables, their leases' TTLs left and registrations.
fn hosts(grouped: Grouped, ttl_left: &HashMap<i64, Option<i64>>) -> Vec<HostStatus> {
    grouped
        .into_iter()
        .map(|(host, tables)| {
            let tables: Vec<ClusterTable> = tables
                .into_iter()
                .map(|(table, (lease, mut registrations))| {
                    registrations.sort_by_key(|r| r.instance_id);
                    ClusterTable {
                        table,
                        lease: format!("{lease:x}"),
                        lease_ttl_seconds: ttl_left.get(&lease).copied().flatten(),
                        registrations,
                    }
                })
                .collect();
            HostStatus {
                host,
                lease_ttl_seconds: tables.iter().filter_map(|t| t.lease_ttl_seconds).min(),
                live: tables.iter().map(|t| t.registrations.len()).sum(),
                tables,
            }
        })
        .collect()
}
