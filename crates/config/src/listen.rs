//! Binding a listen address from the configuration. The default listeners are `[::]:PORT`:
//! on Linux one socket on `[::]` takes IPv6 and IPv4 alike (unless the host sets
//! `net.ipv6.bindv6only`), so the same configuration serves a single-stack IPv4, a
//! single-stack IPv6 and a dual-stack cluster. Where the kernel has no IPv6 at all (booted
//! with `ipv6.disable=1`), `[::]` cannot bind and the unspecified IPv4 address is bound
//! instead.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

use serde::{Deserialize, Serialize};

use crate::{in_range, ConfigError};

/// What one client may hold of a listener (`ingest.connections`, `admin.connections`): a
/// few hundred connections that send nothing, or a byte a second, must not take a node
/// off the air. Read when the listener starts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionLimits {
    /// Connections open at once; one more is closed as it is accepted.
    pub max: usize,
    /// From a connection's start, or from the end of its last response, until a request's
    /// headers are whole: a connection that sends them slower, or sits idle, is closed.
    pub header_read_timeout_ms: u64,
    /// From a request's headers until its body is whole: a body that takes longer is cut
    /// and the request fails (408 where it can still be answered).
    pub body_read_timeout_ms: u64,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max: 4_096,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 60_000,
        }
    }
}

impl ConnectionLimits {
    pub(crate) fn validate(&self, section: &str) -> Result<(), ConfigError> {
        in_range(
            &format!("{section}.connections.max"),
            self.max,
            1..=1_000_000,
        )?;
        in_range(
            &format!("{section}.connections.header_read_timeout_ms"),
            self.header_read_timeout_ms,
            100..=600_000,
        )?;
        in_range(
            &format!("{section}.connections.body_read_timeout_ms"),
            self.body_read_timeout_ms,
            100..=3_600_000,
        )
    }
}

/// Binds `addr` (non-blocking, for an async runtime), falling back from `[::]` to
/// `0.0.0.0` on the same port when the kernel refuses IPv6.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let listener = match TcpListener::bind(addr) {
        Err(e) if addr.ip().is_unspecified() && addr.is_ipv6() && no_ipv6(&e) => {
            TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port())))?
        }
        other => other?,
    };
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// The errors of binding an IPv6 socket on a kernel without IPv6.
fn no_ipv6(e: &std::io::Error) -> bool {
    // EAFNOSUPPORT (97): no IPv6 sockets; EADDRNOTAVAIL (99): IPv6 disabled on every link.
    matches!(e.raw_os_error(), Some(97 | 99))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_v6_listener_takes_ipv4_too() {
        let l = bind("[::]:0".parse().unwrap()).unwrap();
        let port = l.local_addr().unwrap().port();
        l.set_nonblocking(false).unwrap();
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (s, peer) = l.accept().unwrap();
        assert_eq!(
            peer.ip().to_canonical(),
            std::net::IpAddr::from(Ipv4Addr::LOCALHOST)
        );
        drop((c, s));
    }
}
