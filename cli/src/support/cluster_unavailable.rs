//! Beyond one host, in a `livereg` built without the `etcd` feature: the
//! options parse, and asking for them fails in one line saying how to build
//! them in.

use crate::support::etcd_args::{EtcdArgs, PublishArgs, MISSING};
use crate::support::outcome::Outcome;
use livereg::{DropEvent, Table};

/// Where a reaper's drop handler sends end reasons: nowhere.
#[derive(Clone)]
pub struct Ends;

impl Ends {
    pub fn new() -> Ends {
        Ends
    }

    pub fn ended(&self, _event: &DropEvent) {}

    /// Never publishing in this build.
    pub fn etcd_connected(&self) -> Option<bool> {
        None
    }
}

/// Publishing options: none can exist in this build.
pub enum Publishing {}

/// A running publisher: none can exist in this build.
pub enum Running {}

impl Publishing {
    /// `None` without `--etcd`; with it, the one-line refusal.
    pub fn checked(args: &PublishArgs) -> Result<Option<Publishing>, String> {
        match args.etcd.etcd {
            Some(_) => Err(format!("--etcd: {MISSING}")),
            None => Ok(None),
        }
    }

    pub fn start(self, _table: &Table, _ends: &Ends) -> Result<Running, String> {
        match self {}
    }
}

impl Running {
    pub fn stop(self) {
        match self {}
    }
}

/// `livereg status --cluster`: the one-line refusal.
pub fn show(_args: &EtcdArgs, _json: bool) -> Outcome {
    Err(format!("status --cluster: {MISSING}").into())
}

/// `livereg status --cluster --watch`: the one-line refusal.
pub fn follow(_args: &EtcdArgs, _json: bool) -> Outcome {
    Err(format!("status --cluster --watch: {MISSING}").into())
}
