//! The lease book: which leases this node has out, per sink, and in what order they
//! expire. Memory only: the leases themselves are rows in the store (`?k`), and a boot
//! makes every inflight row due again with its lease gone, so the book starts empty.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use std::sync::Arc;

use ankusa_keyspace::{AtMs, Seq, SinkIdx, TenantOrd};
use ankusa_queue::deliveries::Lease;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    sink_id: String,
    nonce: u64,
    deadline: AtMs,
    /// Who claimed it (`None`: a lease a boot found, whose consumer is not stored).
    consumer: Option<Arc<str>>,
    ord: TenantOrd,
    hook: Option<Arc<HookName>>,
}

/// Who holds a lease: the consumer that claimed it, and the tenant whose hook it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub consumer: Option<Arc<str>>,
    pub ord: TenantOrd,
    /// The hook's id and tenant, as the claim read them (`None`: a lease a boot found, or
    /// an extension, which keeps what the book has; always `None` when no spans are
    /// built): what a settle's span names.
    pub hook: Option<Arc<HookName>>,
}

/// A leased hook's id and tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookName {
    pub id: String,
    pub tenant: String,
}

/// A lease whose deadline came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub sink_id: String,
    pub seq: Seq,
    pub sink: SinkIdx,
    pub nonce: u64,
    pub ord: TenantOrd,
}

#[derive(Debug, Default)]
pub struct Book {
    leases: HashMap<(Seq, SinkIdx), Entry>,
    /// Deadlines, soonest first; an entry whose lease was extended or ended since is
    /// skipped when it comes up.
    order: BinaryHeap<Reverse<(AtMs, Seq, SinkIdx, u64)>>,
    counts: HashMap<String, usize>,
    /// Leases out per sink and consumer, and per sink and tenant.
    by_consumer: HashMap<(String, Arc<str>), usize>,
    by_tenant: HashMap<(String, TenantOrd), usize>,
    /// The last [`Book::EXPIRED_KEPT`] leases that expired, so a late ack is told
    /// "expired" rather than "unknown".
    expired: std::collections::HashSet<(Seq, SinkIdx, u64)>,
    expired_order: std::collections::VecDeque<(Seq, SinkIdx, u64)>,
}

impl Book {
    /// A lease made (by `holder`), or extended (its holder stays).
    pub fn insert(
        &mut self,
        sink_id: &str,
        seq: Seq,
        sink: SinkIdx,
        lease: &Lease,
        holder: Holder,
    ) {
        match self.leases.get_mut(&(seq, sink)) {
            Some(e) if e.sink_id == sink_id => {
                e.nonce = lease.nonce;
                e.deadline = lease.deadline;
            }
            _ => {
                let entry = Entry {
                    sink_id: sink_id.to_owned(),
                    nonce: lease.nonce,
                    deadline: lease.deadline,
                    consumer: holder.consumer,
                    ord: holder.ord,
                    hook: holder.hook,
                };
                self.tally(&entry, true);
                if let Some(old) = self.leases.insert((seq, sink), entry) {
                    self.tally(&old, false);
                }
            }
        }
        self.order
            .push(Reverse((lease.deadline, seq, sink, lease.nonce)));
        self.compact_order();
    }

    /// Extensions and revocations leave stale entries behind: rebuilt once they outnumber
    /// the leases.
    fn compact_order(&mut self) {
        if self.order.len() > 4 * self.leases.len() + 1_024 {
            self.order = self
                .leases
                .iter()
                .map(|((seq, sink), e)| Reverse((e.deadline, *seq, *sink, e.nonce)))
                .collect();
        }
    }

    /// Counts `e` in (`up`) or out of its sink's, its consumer's and its tenant's leases.
    fn tally(&mut self, e: &Entry, up: bool) {
        fn add<K: std::hash::Hash + Eq>(m: &mut HashMap<K, usize>, k: K, up: bool) {
            if up {
                *m.entry(k).or_default() += 1;
            } else if let Some(n) = m.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&k);
                }
            }
        }
        add(&mut self.counts, e.sink_id.clone(), up);
        if let Some(c) = &e.consumer {
            add(&mut self.by_consumer, (e.sink_id.clone(), c.clone()), up);
        }
        add(&mut self.by_tenant, (e.sink_id.clone(), e.ord), up);
    }

    /// The id and tenant of the hook leased as `(seq, sink)`, if the claim was this
    /// process's.
    pub fn hook(&self, seq: Seq, sink: SinkIdx) -> Option<Arc<HookName>> {
        self.leases.get(&(seq, sink)).and_then(|e| e.hook.clone())
    }

    /// Leases out on `sink_id` claimed by `consumer`.
    pub fn consumer_count(&self, sink_id: &str, consumer: &Arc<str>) -> usize {
        self.by_consumer
            .get(&(sink_id.to_owned(), consumer.clone()))
            .copied()
            .unwrap_or(0)
    }

    /// Leases out on `sink_id` of tenant `ord`'s hooks.
    pub fn tenant_count(&self, sink_id: &str, ord: TenantOrd) -> usize {
        self.by_tenant
            .get(&(sink_id.to_owned(), ord))
            .copied()
            .unwrap_or(0)
    }

    /// Makes every lease of the tenants `held` says are held due now (a pause, an erase):
    /// the expiry takes them back. How many.
    pub fn revoke(&mut self, now: AtMs, held: impl Fn(TenantOrd) -> bool) -> usize {
        let mut n = 0;
        for ((seq, sink), e) in &mut self.leases {
            if e.deadline > now && held(e.ord) {
                e.deadline = now;
                self.order.push(Reverse((now, *seq, *sink, e.nonce)));
                n += 1;
            }
        }
        self.compact_order();
        n
    }

    /// A lease ended (settled, expired, or found gone).
    pub fn remove(&mut self, seq: Seq, sink: SinkIdx, nonce: u64) {
        if self
            .leases
            .get(&(seq, sink))
            .is_some_and(|e| e.nonce == nonce)
        {
            if let Some(e) = self.leases.remove(&(seq, sink)) {
                self.tally(&e, false);
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
                    ord: e.ord,
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

    fn holder(consumer: &str, ord: u32) -> Holder {
        Holder {
            consumer: Some(Arc::from(consumer)),
            ord: TenantOrd(ord),
            hook: None,
        }
    }

    #[test]
    fn leases_are_counted_by_consumer_and_tenant_and_a_held_tenants_are_revoked() {
        let mut b = Book::default();
        let (c, d) = (Arc::<str>::from("c"), Arc::<str>::from("d"));
        b.insert("s", Seq(1), SinkIdx(0), &lease(1, 1_000), holder("c", 1));
        b.insert("s", Seq(2), SinkIdx(0), &lease(2, 1_000), holder("c", 2));
        b.insert("s", Seq(3), SinkIdx(0), &lease(3, 1_000), holder("d", 2));
        b.insert("t", Seq(4), SinkIdx(1), &lease(4, 1_000), holder("c", 2));
        // An extension keeps its holder, whoever extends it.
        b.insert("s", Seq(2), SinkIdx(0), &lease(2, 2_000), holder("d", 9));
        assert_eq!(
            (b.consumer_count("s", &c), b.consumer_count("s", &d)),
            (2, 1)
        );
        assert_eq!(
            (
                b.tenant_count("s", TenantOrd(2)),
                b.tenant_count("t", TenantOrd(2))
            ),
            (2, 1)
        );
        // Tenant 2 paused: its three leases come due now; tenant 1's stays.
        assert_eq!(b.revoke(AtMs(500), |o| o == TenantOrd(2)), 3);
        let due: Vec<(Seq, TenantOrd)> = b
            .due(AtMs(500), 10)
            .iter()
            .map(|d| (d.seq, d.ord))
            .collect();
        assert_eq!(due.len(), 3);
        assert!(due.iter().all(|(_, o)| *o == TenantOrd(2)), "{due:?}");
        b.remove(Seq(3), SinkIdx(0), 3);
        assert_eq!(b.consumer_count("s", &d), 0);
        assert_eq!(b.tenant_count("s", TenantOrd(2)), 1);
    }

    #[test]
    fn leases_come_due_in_deadline_order_and_an_extension_replaces_its_entry() {
        let mut b = Book::default();
        b.insert("s", Seq(1), SinkIdx(0), &lease(10, 300), holder("c", 1));
        b.insert("s", Seq(2), SinkIdx(0), &lease(20, 100), holder("c", 1));
        b.insert("t", Seq(3), SinkIdx(1), &lease(30, 200), holder("c", 1));
        assert_eq!((b.count("s"), b.count("t")), (2, 1));
        // Seq 2 is extended past the others.
        b.insert("s", Seq(2), SinkIdx(0), &lease(20, 1_000), holder("c", 1));
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
        b.insert("s", Seq(1), SinkIdx(0), &lease(1, 10), holder("c", 1));
        for d in 0..10_000 {
            b.insert("s", Seq(1), SinkIdx(0), &lease(1, 20 + d), holder("c", 1));
        }
        assert!(b.order.len() <= 4 + 1_024 + 1, "{}", b.order.len());
        assert_eq!(b.count("s"), 1);
    }
}
