//! The addresses a tenant's own endpoint may not reach (`endpoints.allow_private` off):
//! a URL a tenant typed must not turn the node into a client of its own network — its
//! admin listener, the cluster's services, a cloud's metadata service.
//!
//! Checked where the connection is made, against the address itself: [`Resolver`] resolves
//! a name and keeps only the addresses allowed (a name that resolves to 127.0.0.1 is
//! refused when it is connected to, whatever it resolved to when the endpoint was saved),
//! and [`refused`] answers for an address written in the URL, which the connector does
//! not resolve.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;

/// Why `ip` is refused, or `None` for an address on the public internet.
pub fn refused(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, _, _) => "unspecified",
        (127, _, _) => "loopback",
        (10, _, _) | (192, 168, _) => "private",
        (172, 16..=31, _) => "private",
        (169, 254, _) => "link-local",
        (100, 64..=127, _) => "shared (carrier-grade NAT)",
        (192, 0, 0) => "reserved (IETF protocol assignments)",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "reserved (documentation)",
        (198, 18..=19, _) => "reserved (benchmarking)",
        (224..=239, _, _) => "multicast",
        (240..=255, _, _) => "reserved",
        _ => return None,
    })
}

fn refused_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    // An IPv4 address written as IPv6 is judged as itself: ::ffff:127.0.0.1 is loopback.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return refused_v4(v4);
    }
    let s = ip.segments();
    // NAT64 (64:ff9b::/96) reaches the IPv4 address in its last 32 bits.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return refused_v4(Ipv4Addr::new(
            (s[6] >> 8) as u8,
            s[6] as u8,
            (s[7] >> 8) as u8,
            s[7] as u8,
        ));
    }
    // 6to4 (2002::/16) carries an IPv4 address in bits 16..48.
    if s[0] == 0x2002 {
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        return refused_v4(v4).map(|_| "6to4 of a refused IPv4 address");
    }
    Some(match s[0] {
        0xfc00..=0xfdff => "private (unique local)",
        0xfe80..=0xfebf => "link-local",
        0xfec0..=0xfeff => "site-local",
        0xff00..=0xffff => "multicast",
        0x2001 if s[1] == 0x0db8 => "reserved (documentation)",
        0x2001 if s[1] == 0 => "Teredo",
        0x0000 => "reserved (IPv4-compatible)",
        _ => return None,
    })
}

/// A name no allowed address answers for: the connection is not made.
#[derive(Debug)]
pub struct Refused {
    pub name: String,
    pub address: IpAddr,
    pub why: &'static str,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} resolves to {} ({}): refused (endpoints.allow_private is off)",
            self.name, self.address, self.why
        )
    }
}

impl std::error::Error for Refused {}

/// The [`Refused`] somewhere in `e`'s chain of sources, if the connector refused.
pub fn refusal_in<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e Refused> {
    let mut at = Some(e);
    while let Some(err) = at {
        if let Some(r) = err.downcast_ref::<Refused>() {
            return Some(r);
        }
        // An I/O error's own source is its inner error's source, not the inner error.
        let inner = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref());
        if let Some(r) = inner.and_then(|i| i.downcast_ref::<Refused>()) {
            return Some(r);
        }
        at = err.source();
    }
    None
}

/// The system's resolver, keeping only the addresses [`refused`] allows; none left: the
/// lookup fails with [`Refused`] (for the first address refused).
#[derive(Debug, Clone, Copy, Default)]
pub struct Resolver;

type Resolving =
    Pin<Box<dyn Future<Output = Result<std::vec::IntoIter<SocketAddr>, std::io::Error>> + Send>>;

impl tower::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = Resolving;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let (kept, out): (Vec<SocketAddr>, Vec<SocketAddr>) =
                all.into_iter().partition(|a| refused(a.ip()).is_none());
            match (kept.is_empty(), out.first()) {
                (true, Some(first)) => Err(std::io::Error::other(Refused {
                    name: host,
                    address: first.ip(),
                    why: refused(first.ip()).unwrap_or("refused"),
                })),
                _ => Ok(kept.into_iter()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_inner_address_is_refused_and_public_ones_are_not() {
        for (ip, why) in [
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("0.0.0.0", "unspecified"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("100.64.0.1", "shared (carrier-grade NAT)"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "reserved"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("2002:7f00:1::", "6to4 of a refused IPv4 address"),
            ("fd00::1", "private (unique local)"),
            ("fe80::1", "link-local"),
            ("ff02::1", "multicast"),
        ] {
            let addr: IpAddr = ip.parse().unwrap();
            assert_eq!(refused(addr), Some(why), "{ip}");
        }
        for ip in [
            "8.8.8.8",
            "172.15.0.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "64:ff9b::808:808",
            "2002:808:808::",
        ] {
            assert_eq!(refused(ip.parse().unwrap()), None, "{ip}");
        }
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_at_the_lookup() {
        use tower::ServiceExt;
        let name: Name = "localhost".parse().unwrap();
        let e = Resolver.oneshot(name).await.unwrap_err();
        let r = refusal_in(&e).expect("a refusal");
        assert_eq!(r.why, "loopback");
        assert!(e.to_string().contains("localhost resolves to"), "{e}");
        // Numeric forms the system's resolver reads as an address are names to the URL's
        // check, and refused here.
        for numeric in ["2130706433", "0x7f000001", "127.1"] {
            let name: Name = numeric.parse().unwrap();
            let e = Resolver.oneshot(name).await.unwrap_err();
            assert_eq!(
                refusal_in(&e).map(|r| r.why),
                Some("loopback"),
                "{numeric}: {e}"
            );
        }
    }
}
