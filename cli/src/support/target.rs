//! What `run`, `worker`, `status` and `probe` act on: a table by name, or a
//! reaper's listener by address (`unix:PATH`, `tcp://HOST:PORT`,
//! `tls://HOST:PORT`) for a process that cannot map the table. A token is
//! read from `--token-file` or `LIVEREG_TOKEN`, never from argv (argv is
//! public).

use livereg::{Address, ConnectOptions, Error, Table, TlsClient, Worker};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `--token-file`: the token of a listener (to serve or to reach).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TokenArgs {
    /// File holding the listener's token (its first line); else
    /// `LIVEREG_TOKEN`. A token is never an argument: argv is public.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

/// How to reach a listener: its token, and for `tls://` the CA (and a
/// client certificate); shared by every command that can take an address.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SessionArgs {
    #[command(flatten)]
    pub token: TokenArgs,
    /// For a tls:// address: the CA (PEM) the listener's certificate must
    /// chain to.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// For a tls:// listener that requires client certificates: this
    /// client's certificate (PEM), with --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// This client's private key (PEM), with --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl SessionArgs {
    /// The options of a connection to a listener.
    pub fn options(&self) -> Result<ConnectOptions, String> {
        Ok(ConnectOptions {
            token: self.token.token()?,
            connect_timeout: None,
            tls: self.tls_ca.as_ref().map(|ca| TlsClient {
                ca: ca.clone(),
                cert: self.tls_cert.clone(),
                key: self.tls_key.clone(),
            }),
        })
    }
}

impl TokenArgs {
    /// The token: the file's first line, or `LIVEREG_TOKEN`, or none.
    ///
    /// # Errors
    ///
    /// The file cannot be read, or holds an empty first line.
    pub fn token(&self) -> Result<Option<Vec<u8>>, String> {
        match &self.token_file {
            Some(path) => read_token(path).map(Some),
            None => Ok(std::env::var("LIVEREG_TOKEN")
                .ok()
                .filter(|t| !t.is_empty())
                .map(String::into_bytes)),
        }
    }
}

/// The token in a token file, read as every livereg client reads one
/// ([`livereg::read_token_file`]: its first line, trimmed; refused if
/// others can read it).
///
/// # Errors
///
/// The file's problem, in words naming it.
pub fn read_token(path: &Path) -> Result<Vec<u8>, String> {
    livereg::read_token_file(path).map_err(|e| e.to_string())
}

/// A table, or a listener's address.
pub enum Target {
    Table(Table),
    Session {
        address: String,
        options: ConnectOptions,
    },
}

impl Target {
    /// Opens `name`: an address if it starts with `unix:` or `tcp://`.
    pub fn open(name: &str, session: &SessionArgs) -> Result<Target, String> {
        if Address::is_address(name) {
            Address::parse(name).map_err(|e| e.to_string())?;
            return Ok(Target::Session {
                address: name.to_owned(),
                options: session.options()?,
            });
        }
        Table::open(name)
            .map(Target::Table)
            .map_err(|e| e.to_string())
    }

    /// Registers `instance` with `label`.
    pub fn register(&self, instance: u64, label: &str) -> Result<Worker, Error> {
        match self {
            Target::Table(table) => table.register(instance, label),
            Target::Session { address, options } => {
                livereg::connect(address, instance, label, options)
            }
        }
    }

    /// The reap timeout, when it can be known before registering.
    pub fn reap_timeout(&self) -> Option<Duration> {
        match self {
            Target::Table(table) => Some(table.reap_timeout()),
            Target::Session { .. } => None,
        }
    }
}

/// Who registers: the table, the instance id and its label (`run`, `worker`).
#[derive(clap::Args)]
pub struct Registrant {
    /// Table name, or a reaper's listener (`unix:PATH`, `tcp://HOST:PORT`).
    pub name: String,
    /// Instance id to register.
    #[arg(long)]
    pub instance: u64,
    /// Label.
    #[arg(long, default_value = "")]
    pub label: String,
    #[command(flatten)]
    pub token: SessionArgs,
}
