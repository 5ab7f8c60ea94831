//! A lease's id as consumers see it, and its parts.

use ankusa_keyspace::{Seq, SinkIdx};

/// A lease's id as consumers see it: `<seq>.<sink index>.<nonce>` (hex), after
/// `<node>~` in a Relay of several nodes.
pub fn lease_id(node: Option<&str>, seq: Seq, sink: SinkIdx, nonce: u64) -> String {
    let id = format!("{:x}.{:x}.{:016x}", seq.0, sink.0, nonce);
    match node {
        Some(n) => format!("{n}~{id}"),
        None => id,
    }
}

/// A lease id, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRef<'a> {
    /// The node that holds it (`None`: a single node's).
    pub node: Option<&'a str>,
    pub seq: Seq,
    pub sink: SinkIdx,
    pub nonce: u64,
}

impl LeaseRef<'_> {
    pub(super) fn key(&self) -> (Seq, SinkIdx, u64) {
        (self.seq, self.sink, self.nonce)
    }
}

/// Parses a lease id (`None`: not one).
pub fn parse_lease_id(id: &str) -> Option<LeaseRef<'_>> {
    let (node, rest) = match id.rsplit_once('~') {
        Some((n, r)) if !n.is_empty() => (Some(n), r),
        Some(_) => return None,
        None => (None, id),
    };
    let mut parts = rest.split('.');
    let seq = u64::from_str_radix(parts.next()?, 16).ok()?;
    let sink = u16::from_str_radix(parts.next()?, 16).ok()?;
    let nonce = u64::from_str_radix(parts.next()?, 16).ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some(LeaseRef {
        node,
        seq: Seq(seq),
        sink: SinkIdx(sink),
        nonce,
    })
}

#[cfg(test)]
mod tests {
    use super::{lease_id, parse_lease_id};
    use ankusa_keyspace::{Seq, SinkIdx};

    #[test]
    fn lease_ids_round_trip_and_reject_what_is_not_one() {
        let id = lease_id(None, Seq(0x1234), SinkIdx(2), 0xdead_beef);
        assert_eq!(id, "1234.2.00000000deadbeef");
        let p = parse_lease_id(&id).unwrap();
        assert_eq!(
            (p.node, p.key()),
            (None, (Seq(0x1234), SinkIdx(2), 0xdead_beef))
        );
        let id = lease_id(Some("relay-1.nodes"), Seq(1), SinkIdx(0), 7);
        assert_eq!(id, "relay-1.nodes~1.0.0000000000000007");
        let p = parse_lease_id(&id).unwrap();
        assert_eq!(
            (p.node, p.key()),
            (Some("relay-1.nodes"), (Seq(1), SinkIdx(0), 7))
        );
        for bad in [
            "",
            "1.2",
            "1.2.3.4",
            "x.2.3",
            "1.10000.3",
            "1.2.zz",
            "~1.2.3",
        ] {
            assert_eq!(parse_lease_id(bad), None, "{bad}");
        }
    }
}
