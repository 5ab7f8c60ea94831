//! The lease book: which leases this node has out, per sink, and in what order they
//! expire. Memory only: the leases themselves are rows in the store (`?k`), and a boot
//! makes every inflight row due again with its lease gone, so the book starts empty.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use ankusa_keyspace::{AtMs, Seq, SinkIdx};
use ankusa_queue::deliveries::Lease;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    sink_id: String,
    nonce: u64,
    deadline: AtMs,
}

/// A lease whose deadline came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub sink_id: String,
    pub seq: Seq,
    pub sink: SinkIdx,
    pub nonce: u64,
}

#[derive(Debug, Default)]
pub struct Book {
    leases: HashMap<(Seq, SinkIdx), Entry>,
    /// Deadlines, soonest first; an entry whose lease was extended or ended since is
    /// skipped when it comes up.
    order: BinaryHeap<Reverse<(AtMs, Seq, SinkIdx, u64)>>,
    counts: HashMap<String, usize>,
    /// The last [`Book::EXPIRED_KEPT`] leases that expired, so a late ack is told
    /// "expired" rather than "unknown".
    expired: std::collections::HashSet<(Seq, SinkIdx, u64)>,
    expired_order: std::collections::VecDeque<(Seq, SinkIdx, u64)>,
}

impl Book {
    /// A lease made or extended.
    pub fn insert(&mut self, sink_id: &str, seq: Seq, sink: SinkIdx, lease: &Lease) {
        let entry = Entry {
            sink_id: sink_id.to_owned(),
            nonce: lease.nonce,
            deadline: lease.deadline,
        };
        match self.leases.insert((seq, sink), entry) {
            Some(old) if old.sink_id == sink_id => {}
            Some(old) => {
                self.uncount(&old.sink_id);
                *self.counts.entry(sink_id.to_owned()).or_default() += 1;
            }
            None => *self.counts.entry(sink_id.to_owned()).or_default() += 1,
        }
        self.order
            .push(Reverse((lease.deadline, seq, sink, lease.nonce)));
        // Extensions leave stale entries behind: rebuild once they outnumber the leases.
        if self.order.len() > 4 * self.leases.len() + 1_024 {
            self.order = self
                .leases
                .iter()
                .map(|((seq, sink), e)| Reverse((e.deadline, *seq, *sink, e.nonce)))
                .collect();
        }
    }

    fn uncount(&mut self, sink_id: &str) {
        if let Some(n) = self.counts.get_mut(sink_id) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(sink_id);
            }
        }
    }

    /// A lease ended (settled, expired, or found gone).
    pub fn remove(&mut self, seq: Seq, sink: SinkIdx, nonce: u64) {
        if self
            .leases
            .get(&(seq, sink))
            .is_some_and(|e| e.nonce == nonce)
        {
            if let Some(e) = self.leases.remove(&(seq, sink)) {
                self.uncount(&e.sink_id);
            }
        }
    }

    /// The most expired leases remembered.
    pub const EXPIRED_KEPT: usize = 65_536;

    /// A lease ended by its expiry.
    pub fn expired(&mut self, seq: Seq, sink: SinkIdx, nonce: u64) {
        if self.expired.insert((seq, sink, nonce)) {
            self.expired_order.push_back((seq, sink, nonce));
        }
        while self.expired_order.len() > Self::EXPIRED_KEPT {
            if let Some(old) = self.expired_order.pop_front() {
                self.expired.remove(&old);
            }
        }
    }

    /// Whether this lease ended by expiring, lately.
    pub fn expired_lately(&self, seq: Seq, sink: SinkIdx, nonce: u64) -> bool {
        self.expired.contains(&(seq, sink, nonce))
    }

    /// Leases out on `sink_id`.
    pub fn count(&self, sink_id: &str) -> usize {
        self.counts.get(sink_id).copied().unwrap_or(0)
    }

    pub fn counts(&self) -> BTreeMap<String, usize> {
        self.counts.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// Up to `limit` leases whose deadline is at or before `now`, soonest first. They stay
    /// in the book until [`Book::remove`]d (or extended).
    pub fn due(&mut self, now: AtMs, limit: usize) -> Vec<Due> {
        let mut out = Vec::new();
        while out.len() < limit {
            let Some(Reverse((deadline, seq, sink, nonce))) = self.order.peek().copied() else {
                break;
            };
            if deadline > now {
                break;
            }
            self.order.pop();
            match self.leases.get(&(seq, sink)) {
                Some(e) if e.nonce == nonce && e.deadline == deadline => out.push(Due {
                    sink_id: e.sink_id.clone(),
                    seq,
                    sink,
                    nonce,
                }),
                // Extended (a later entry stands for it), or ended.
                _ => {}
            }
        }
        out
    }

    /// The soonest deadline in the book (possibly of a lease since extended).
    pub fn next_deadline(&self) -> Option<AtMs> {
        self.order.peek().map(|Reverse((at, ..))| *at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(nonce: u64, deadline: u64) -> Lease {
        Lease {
            nonce,
            deadline: AtMs(deadline),
            claimed_at: AtMs(0),
            attempt: 1,
            sinks: 1,
            sink_hash: 0,
        }
    }

    #[test]
    fn leases_come_due_in_deadline_order_and_an_extension_replaces_its_entry() {
        let mut b = Book::default();
        b.insert("s", Seq(1), SinkIdx(0), &lease(10, 300));
        b.insert("s", Seq(2), SinkIdx(0), &lease(20, 100));
        b.insert("t", Seq(3), SinkIdx(1), &lease(30, 200));
        assert_eq!((b.count("s"), b.count("t")), (2, 1));
        // Seq 2 is extended past the others.
        b.insert("s", Seq(2), SinkIdx(0), &lease(20, 1_000));
        assert_eq!(b.count("s"), 2);
        let due: Vec<Seq> = b.due(AtMs(500), 10).into_iter().map(|d| d.seq).collect();
        assert_eq!(due, vec![Seq(3), Seq(1)]);
        // Due leases stay counted until removed; a stale nonce removes nothing.
        b.remove(Seq(3), SinkIdx(1), 999);
        assert_eq!(b.count("t"), 1);
        b.remove(Seq(3), SinkIdx(1), 30);
        b.remove(Seq(1), SinkIdx(0), 10);
        assert_eq!((b.count("s"), b.count("t")), (1, 0));
        assert_eq!(b.next_deadline(), Some(AtMs(1_000)));
        assert_eq!(b.due(AtMs(999), 10), Vec::new());
        assert_eq!(b.due(AtMs(1_000), 10).len(), 1);
    }

    #[test]
    fn stale_entries_of_extensions_are_bounded() {
        let mut b = Book::default();
        b.insert("s", Seq(1), SinkIdx(0), &lease(1, 10));
        for d in 0..10_000 {
            b.insert("s", Seq(1), SinkIdx(0), &lease(1, 20 + d));
        }
        assert!(b.order.len() <= 4 + 1_024 + 1, "{}", b.order.len());
        assert_eq!(b.count("s"), 1);
    }
}
