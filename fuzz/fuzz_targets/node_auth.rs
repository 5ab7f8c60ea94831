//! The signed node request header (`ankusa-node-auth`): any header value is an answer or a
//! refusal, never a panic, and never an acceptance without the key; a request a node signs
//! checks once under the same key, path and body — and fails with any of them changed, or
//! sent again.
#![no_main]

use ankusa_verify::node::{is_node_name, NodeAuth, Refused, AUTH_HEADER};
use http::{HeaderMap, HeaderValue, Method};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, arbitrary::Arbitrary)]
struct Input {
    key: Vec<u8>,
    node: String,
    post: bool,
    path: String,
    other_path: String,
    body: Vec<u8>,
    other_body: Vec<u8>,
    forged: Vec<u8>,
    now_ms: u32,
    skew_ms: i32,
}

fn with(v: HeaderValue) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(AUTH_HEADER, v);
    h
}

fuzz_target!(|i: Input| {
    let method = if i.post { Method::POST } else { Method::GET };
    let now = u64::from(i.now_ms) + 10_000_000;
    let receiver = NodeAuth::new(&i.key, "receiver");
    // Anything a client sends: refused (it holds no key), never a panic.
    if let Ok(v) = HeaderValue::from_bytes(&i.forged) {
        let r = receiver.verify(&method, &i.path, &with(v), now);
        assert!(r.is_err(), "a forged header passed: {:?}", i.forged);
    }
    // What a node signs.
    let name = if i.node.is_empty() {
        "relay-0"
    } else {
        i.node.as_str()
    };
    let sender = NodeAuth::new(&i.key, name);
    let v = sender.sign(&method, &i.path, &i.body, now);
    let then = now.saturating_add_signed(i64::from(i.skew_ms));
    let fresh = then.abs_diff(now) <= ankusa_verify::node::TOLERANCE_MS;
    match receiver.verify(&method, &i.path, &with(v.clone()), then) {
        Ok(signed) => {
            assert!(fresh, "a stale request passed");
            assert_eq!(signed.node, name);
            assert!(signed.check_body(&i.body).is_ok());
            if i.other_body != i.body {
                assert_eq!(signed.check_body(&i.other_body), Err(Refused::BodyMismatch));
            }
            // Sent again: a replay.
            assert_eq!(
                receiver
                    .verify(&method, &i.path, &with(v.clone()), then)
                    .err(),
                Some(Refused::Replayed)
            );
        }
        // A valid node name's request fails only on time; a sender under a name no node
        // has (the configuration refuses one) is refused somehow.
        Err(Refused::Stale(_)) => assert!(!fresh),
        Err(_) if !is_node_name(name) => {}
        Err(e) => panic!("a node's own request refused: {e}"),
    }
    // Under another key it never checks (one byte flipped: HMAC pads a short key with
    // zeros, so `k` and `k\0` are the same key and not "another").
    let mut other_key = i.key.clone();
    match other_key.first_mut() {
        Some(b) => *b ^= 1,
        None => other_key.push(1),
    }
    let other = NodeAuth::new(&other_key, "receiver");
    assert!(other
        .verify(&method, &i.path, &with(v.clone()), now)
        .is_err());
    // Nor under another path.
    if i.other_path != i.path {
        let fresh_receiver = NodeAuth::new(&i.key, "receiver");
        assert!(fresh_receiver
            .verify(&method, &i.other_path, &with(v), now)
            .is_err());
    }
});
