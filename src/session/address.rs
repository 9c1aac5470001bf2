//! Where a reaper listens for sessions: `unix:PATH`, `tcp://HOST:PORT` or
//! `tls://HOST:PORT`.

use crate::error::{Error, Result};
use std::fmt;
use std::path::PathBuf;

/// A session address. A name that starts with `unix:`, `tcp://` or `tls://`
/// is an address; anything else names a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// A Unix stream socket at an absolute path.
    Unix(PathBuf),
    /// A TCP endpoint: `HOST:PORT`, the host an IPv4 address, `[IPv6]` or a
    /// DNS name.
    Tcp(String),
    /// A TCP endpoint speaking TLS (rustls): the listener presents a
    /// certificate, the client verifies it against a CA it is given.
    Tls(String),
}

const UNIX: &str = "unix:";
const TCP: &str = "tcp://";
const TLS: &str = "tls://";

impl Address {
    /// Whether a listener at this address must be given a token: a
    /// network listener must, unless it is `tls://` and checks client
    /// certificates (`client_certificates`); a `unix:` socket is guarded by
    /// its file mode.
    pub fn needs_token(&self, client_certificates: bool) -> bool {
        match self {
            Address::Unix(_) => false,
            Address::Tcp(_) => true,
            Address::Tls(_) => !client_certificates,
        }
    }

    /// Whether `name` is a session address rather than a table name.
    pub fn is_address(name: &str) -> bool {
        name.starts_with(UNIX) || name.starts_with(TCP) || name.starts_with(TLS)
    }

    /// Parses `unix:/ABSOLUTE/PATH`, `tcp://HOST:PORT` or `tls://HOST:PORT`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming what was expected and what was
    /// found.
    ///
    /// # Examples
    ///
    /// ```
    /// use livereg::Address;
    ///
    /// assert_eq!(Address::parse("tcp://[::1]:7070")?, Address::Tcp("[::1]:7070".into()));
    /// assert!(Address::parse("unix:relative.sock").is_err());
    /// # Ok::<(), livereg::Error>(())
    /// ```
    pub fn parse(text: &str) -> Result<Address> {
        let wrong = |why: &str| {
            Error::InvalidArgument(format!(
                "address '{text}': {why}, expected unix:/ABSOLUTE/PATH, tcp://HOST:PORT or tls://HOST:PORT"
            ))
        };
        if let Some(path) = text.strip_prefix(UNIX) {
            if !path.starts_with('/') {
                return Err(wrong("the socket path is not absolute"));
            }
            // sun_path holds 108 bytes, the last one a NUL.
            if path.len() > 107 {
                return Err(wrong(&format!(
                    "the path is {} bytes, at most 107 fit",
                    path.len()
                )));
            }
            return Ok(Address::Unix(PathBuf::from(path)));
        }
        let (endpoint, tls) = match (text.strip_prefix(TCP), text.strip_prefix(TLS)) {
            (Some(endpoint), _) => (endpoint, false),
            (_, Some(endpoint)) => (endpoint, true),
            _ => return Err(wrong("no scheme")),
        };
        let Some((host, port)) = endpoint.rsplit_once(':') else {
            return Err(wrong("no port"));
        };
        if host.is_empty() || host.contains('/') {
            return Err(wrong(&format!("host '{host}'")));
        }
        if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
            return Err(wrong("an IPv6 host must be in brackets"));
        }
        if port.parse::<u16>().is_err() {
            return Err(wrong(&format!("port '{port}' is not 0 to 65535")));
        }
        Ok(if tls {
            Address::Tls(endpoint.to_owned())
        } else {
            Address::Tcp(endpoint.to_owned())
        })
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(path) => write!(f, "{UNIX}{}", path.display()),
            Address::Tcp(endpoint) => write!(f, "{TCP}{endpoint}"),
            Address::Tls(endpoint) => write!(f, "{TLS}{endpoint}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_print_back() {
        for text in [
            "unix:/run/livereg.sock",
            "tcp://127.0.0.1:7070",
            "tcp://[::1]:1",
            "tcp://reaper.node-3.svc:65535",
            "tls://reaper.node-3.svc:7071",
        ] {
            assert_eq!(Address::parse(text).unwrap().to_string(), text);
        }
        assert!(Address::is_address("unix:/x") && Address::is_address("tcp://h:1"));
        assert!(Address::is_address("tls://h:1"));
        assert!(!Address::is_address("gpu-workers") && !Address::is_address("/dev/shm/t"));
    }

    #[test]
    fn bad_addresses_say_what_was_expected() {
        for (text, says) in [
            ("unix:run.sock", "not absolute"),
            ("tcp://host", "no port"),
            ("tcp://host:99999", "port '99999'"),
            ("tcp://::1:80", "brackets"),
            ("tcp://:80", "host ''"),
            ("udp://h:1", "no scheme"),
        ] {
            let message = Address::parse(text).unwrap_err().to_string();
            assert!(message.contains(says), "{text}: {message}");
            assert!(message
                .contains("expected unix:/ABSOLUTE/PATH, tcp://HOST:PORT or tls://HOST:PORT"));
        }
        assert!(Address::parse(&format!("unix:/{}", "x".repeat(107))).is_err());
    }
}
