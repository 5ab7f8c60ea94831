//! How the nodes of a Relay know each other's requests: each is signed, never a static
//! header a captured request would give away.
//!
//! `ankusa-node-auth: v1 node=<name> t=<unix ms> nonce=<32 hex> body=<sha256 hex> sig=<hex>`,
//! where `sig` is HMAC-SHA256, keyed by the cluster secret (`cluster.token`), over
//! `ankusa-node-v1`, the method, the path and query the node asks for (not a path of the
//! other node's base URL: a proxy's, taken off on the way), the node's name, `t`, the
//! nonce and the body's digest, one per line. The receiver checks the signature from the
//! head alone (constant time), `t` within [`TOLERANCE_MS`] of its clock, and that it has not
//! seen the nonce within that window (a bounded set: past [`REPLAY_CEILING`] nonces a call
//! is refused as unavailable, for its sender to retry), all before it reads the body; then
//! that the body matches its digest. A per-request HMAC rather than mutual TLS: the secret
//! the operator already distributes is the whole credential, with no certificates to issue,
//! rotate or trust, and the check costs microseconds; the traffic itself is not encrypted
//! (keep it inside the cluster's network, behind the NetworkPolicy the operator applies).

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderValue, Method};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The header a node's request carries.
pub const AUTH_HEADER: &str = "ankusa-node-auth";
/// How far a request's time may be from the receiver's clock.
pub const TOLERANCE_MS: u64 = 30_000;
/// The most nonces remembered at once (each for twice [`TOLERANCE_MS`]).
pub const REPLAY_CEILING: usize = 1 << 20;

/// Why a node's request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no node signature ({AUTH_HEADER})")]
    Missing,
    #[error("a malformed node signature: {0}")]
    Malformed(&'static str),
    #[error("the node signature does not match (another cluster secret?)")]
    BadSignature,
    #[error("the request's time is {0} ms from this node's clock (at most {TOLERANCE_MS})")]
    Stale(u64),
    #[error("a request seen before (a replay)")]
    Replayed,
    #[error("too many recent node requests to remember; try again")]
    Full,
    #[error("the body does not match its signed digest")]
    BodyMismatch,
}

impl Refused {
    /// The metric's label.
    pub fn kind(&self) -> &'static str {
        match self {
            Refused::Missing | Refused::Malformed(_) => "malformed",
            Refused::BadSignature => "bad_signature",
            Refused::Stale(_) => "stale",
            Refused::Replayed => "replayed",
            Refused::Full => "full",
            Refused::BodyMismatch => "body_mismatch",
        }
    }
}

/// A node's request whose head checked out: who sent it, and the body it promised.
#[derive(Debug, Clone)]
pub struct Signed {
    pub node: String,
    body: [u8; 32],
}

impl Signed {
    /// Whether `body` is the one signed.
    pub fn check_body(&self, body: &[u8]) -> Result<(), Refused> {
        let d: [u8; 32] = Sha256::digest(body).into();
        if bool::from(d.ct_eq(&self.body)) {
            Ok(())
        } else {
            Err(Refused::BodyMismatch)
        }
    }
}

/// Signs and checks node requests with the cluster secret.
pub struct NodeAuth {
    key: Vec<u8>,
    me: String,
    seen: Mutex<Seen>,
}

impl std::fmt::Debug for NodeAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeAuth").field("me", &self.me).finish()
    }
}

/// Nonces of the last window, oldest first.
#[derive(Default)]
struct Seen {
    order: VecDeque<(u64, [u8; 16])>,
    set: HashSet<[u8; 16]>,
}

impl NodeAuth {
    pub fn new(key: &[u8], me: &str) -> NodeAuth {
        NodeAuth {
            key: key.to_vec(),
            me: me.to_owned(),
            seen: Mutex::new(Seen::default()),
        }
    }

    /// Nonces remembered now.
    pub fn remembered(&self) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set
            .len()
    }

    /// The header for this node's request.
    pub fn sign(
        &self,
        method: &Method,
        path_and_query: &str,
        body: &[u8],
        now_ms: u64,
    ) -> HeaderValue {
        let nonce: [u8; 16] = rand::random();
        let digest: [u8; 32] = Sha256::digest(body).into();
        let sig = self.mac(method, path_and_query, &self.me, now_ms, &nonce, &digest);
        let value = format!(
            "v1 node={} t={now_ms} nonce={} body={} sig={}",
            self.me,
            hex::encode(nonce),
            hex::encode(digest),
            hex::encode(sig)
        );
        // Node names are DNS labels: always a valid header value.
        HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("v1"))
    }

    /// Checks a request's head: its signature, its time and its nonce (remembered). The
    /// body is checked once read ([`Signed::check_body`]).
    pub fn verify(
        &self,
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        now_ms: u64,
    ) -> Result<Signed, Refused> {
        let v = headers.get(AUTH_HEADER).ok_or(Refused::Missing)?;
        let v = v.to_str().map_err(|_| Refused::Malformed("not text"))?;
        let rest = v.strip_prefix("v1 ").ok_or(Refused::Malformed("not v1"))?;
        let (mut node, mut t, mut nonce, mut body, mut sig) = (None, None, None, None, None);
        let mut fields = 0u8;
        for part in rest.split(' ') {
            let (name, x) = part
                .split_once('=')
                .ok_or(Refused::Malformed("a field without ="))?;
            let bit = match name {
                "node" => 1,
                "t" => 2,
                "nonce" => 4,
                "body" => 8,
                "sig" => 16,
                _ => return Err(Refused::Malformed("an unknown field")),
            };
            if fields & bit != 0 {
                return Err(Refused::Malformed("a repeated field"));
            }
            fields |= bit;
            match name {
                "node" => node = Some(x),
                "t" => t = x.parse::<u64>().ok(),
                "nonce" => nonce = hex_array::<16>(x),
                "body" => body = hex_array::<32>(x),
                _ => sig = hex_array::<32>(x),
            }
        }
        let node = node
            .filter(|n| is_node_name(n))
            .ok_or(Refused::Malformed("node"))?;
        let t = t.ok_or(Refused::Malformed("t"))?;
        let nonce = nonce.ok_or(Refused::Malformed("nonce"))?;
        let body = body.ok_or(Refused::Malformed("body"))?;
        let sig = sig.ok_or(Refused::Malformed("sig"))?;
        let want = self.mac(method, path_and_query, node, t, &nonce, &body);
        if !bool::from(want.ct_eq(&sig)) {
            return Err(Refused::BadSignature);
        }
        let off = t.abs_diff(now_ms);
        if off > TOLERANCE_MS {
            return Err(Refused::Stale(off));
        }
        self.remember(nonce, now_ms)?;
        Ok(Signed {
            node: node.to_owned(),
            body,
        })
    }

    /// Records `nonce`, refusing one seen within the window; forgets those older than it.
    fn remember(&self, nonce: [u8; 16], now_ms: u64) -> Result<(), Refused> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let horizon = now_ms.saturating_sub(2 * TOLERANCE_MS);
        while seen.order.front().is_some_and(|(at, _)| *at < horizon) {
            if let Some((_, n)) = seen.order.pop_front() {
                seen.set.remove(&n);
            }
        }
        if seen.set.contains(&nonce) {
            return Err(Refused::Replayed);
        }
        if seen.set.len() >= REPLAY_CEILING {
            return Err(Refused::Full);
        }
        seen.set.insert(nonce);
        seen.order.push_back((now_ms, nonce));
        Ok(())
    }

    fn mac(
        &self,
        method: &Method,
        path_and_query: &str,
        node: &str,
        t: u64,
        nonce: &[u8; 16],
        body: &[u8; 32],
    ) -> [u8; 32] {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        m.update(
            format!(
                "ankusa-node-v1\n{method}\n{path_and_query}\n{node}\n{t}\n{}\n{}",
                hex::encode(nonce),
                hex::encode(body)
            )
            .as_bytes(),
        );
        m.finalize().into_bytes().into()
    }
}

/// A node name: a DNS label (what a StatefulSet's pod names are), at most 63 bytes.
/// Whether `n` can name a node in a signed request (a pod's name is).
pub fn is_node_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 63
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

fn hex_array<const N: usize>(s: &str) -> Option<[u8; N]> {
    let v = hex::decode(s).ok()?;
    v.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: HeaderValue) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTH_HEADER, v);
        h
    }

    #[test]
    fn a_signed_request_checks_once_and_nothing_else_does() {
        let a = NodeAuth::new(b"secret-0123456789", "relay-0");
        let b = NodeAuth::new(b"secret-0123456789", "relay-1");
        let now = 1_800_000_000_000;
        let m = Method::POST;
        let h = headers(a.sign(&m, "/ingest/gh?x=1", b"{}", now));
        let signed = b.verify(&m, "/ingest/gh?x=1", &h, now + 5).unwrap();
        assert_eq!(signed.node, "relay-0");
        signed.check_body(b"{}").unwrap();
        assert_eq!(signed.check_body(b"{ }"), Err(Refused::BodyMismatch));
        // The same request again: a replay.
        assert_eq!(
            b.verify(&m, "/ingest/gh?x=1", &h, now + 6).unwrap_err(),
            Refused::Replayed
        );
        // Another path, method, secret or time.
        let h2 = headers(a.sign(&m, "/ingest/gh", b"{}", now));
        assert_eq!(
            b.verify(&m, "/ingest/other", &h2, now).unwrap_err(),
            Refused::BadSignature
        );
        assert_eq!(
            b.verify(&Method::PUT, "/ingest/gh", &h2, now).unwrap_err(),
            Refused::BadSignature
        );
        let other = NodeAuth::new(b"another-secret-0123", "relay-1");
        assert_eq!(
            other.verify(&m, "/ingest/gh", &h2, now).unwrap_err(),
            Refused::BadSignature
        );
        assert_eq!(
            b.verify(&m, "/ingest/gh", &h2, now + TOLERANCE_MS + 1)
                .unwrap_err(),
            Refused::Stale(TOLERANCE_MS + 1)
        );
        assert_eq!(
            b.verify(&m, "/ingest/gh", &HeaderMap::new(), now)
                .unwrap_err(),
            Refused::Missing
        );
        for bad in [
            "v2 node=a",
            "v1 node=a t=1",
            "v1 node=a b=c",
            "v1 node=a t=x nonce=00 body=00 sig=00",
        ] {
            assert!(matches!(
                b.verify(&m, "/", &headers(HeaderValue::from_static(bad)), now),
                Err(Refused::Malformed(_))
            ));
        }
    }

    #[test]
    fn the_replay_window_forgets_what_is_past_it_and_is_bounded() {
        let a = NodeAuth::new(b"k", "n");
        let now = 1_000_000_000;
        a.remember([1; 16], now).unwrap();
        assert_eq!(a.remember([1; 16], now + 1), Err(Refused::Replayed));
        // Past the window the nonce is forgotten (a request that old is stale anyway).
        a.remember([2; 16], now + 2 * TOLERANCE_MS + 1).unwrap();
        assert_eq!(a.remembered(), 1);
    }
}
