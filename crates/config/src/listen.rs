//! Binding a listen address from the configuration. The default listeners are `[::]:PORT`:
//! on Linux one socket on `[::]` takes IPv6 and IPv4 alike (unless the host sets
//! `net.ipv6.bindv6only`), so the same configuration serves a single-stack IPv4, a
//! single-stack IPv6 and a dual-stack cluster. Where the kernel has no IPv6 at all (booted
//! with `ipv6.disable=1`), `[::]` cannot bind and the unspecified IPv4 address is bound
//! instead.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

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
