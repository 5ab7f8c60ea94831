//! How a relay-wide call folds the answers of several nodes into one: [`Merge`], on the
//! typed bodies, so the node that fans a call out (the admin API's owner routing) and the
//! command line that asks each node itself add the same fields the same way, and a body
//! whose field is renamed fails to compile here, not to add up at run time.
//!
//! Sums are of what each node did or holds (rows revived, counters, changed nodes);
//! times are the earliest (a pause since, the oldest due row); flags are "any" (`more`)
//! or "all" (`exact`). The nodes that gave no answer are the merged body's `unavailable`.

use crate::admin::{
    Deleted, EraseState, LimitsView, PauseState, PurgeReport, QuarantineReplayed, Retried, Revived,
    SourceBacklog, SourceView, TenantView, TenantsTop,
};
use crate::node::Counters;

/// A body several nodes answer to one call, and how two of them become one.
pub trait Merge {
    /// Adds another node's answer to the same call to this one.
    fn merge(&mut self, other: &Self);
    /// Names the nodes that gave no answer (what they hold is missing from the sum).
    fn set_unavailable(&mut self, nodes: Vec<String>);
}

fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

impl Counters {
    /// Another node's (or tenant's) counters added to these.
    pub fn add(&mut self, o: &Counters) {
        self.pending += o.pending;
        self.scheduled += o.scheduled;
        self.inflight += o.inflight;
        self.dead += o.dead;
        self.bytes += o.bytes;
        self.archive_pending += o.archive_pending;
    }

    /// How `GET /v1/tenants` orders tenants, greatest first (on one node and merged): the
    /// most pending, then the most scheduled, then the most dead.
    pub fn work_order(&self) -> (i64, i64, i64) {
        (self.pending, self.scheduled, self.dead)
    }
}

impl Merge for TenantView {
    /// Counters and refusals summed; the earliest pause, erase and oldest due row. The
    /// ordinal is one node's own, so a merged view has none.
    fn merge(&mut self, o: &Self) {
        self.counters.add(&o.counters);
        self.paused_since_ms = earliest(self.paused_since_ms, o.paused_since_ms);
        self.erasing_since_ms = earliest(self.erasing_since_ms, o.erasing_since_ms);
        self.oldest_due_at_ms = earliest(self.oldest_due_at_ms, o.oldest_due_at_ms);
        self.quota_refusals += o.quota_refusals;
        self.ord = None;
    }
    fn set_unavailable(&mut self, nodes: Vec<String>) {
        self.unavailable = nodes;
    }
}

impl Merge for TenantsTop {
    /// One row per tenant, its views merged ([`TenantView`]'s merge); the nodes' counts of
    /// tenants summed. Call [`TenantsTop::ranked`] once every answer is in.
    fn merge(&mut self, o: &Self) {
        for t in &o.tenants {
            match self.tenants.iter_mut().find(|m| m.tenant == t.tenant) {
                Some(m) => m.merge(t),
                None => self.tenants.push(t.clone()),
            }
        }
        self.total += o.total;
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        self.registered = sum(self.registered, o.registered);
        self.owned = sum(self.owned, o.owned);
        for t in &mut self.tenants {
            t.ord = None;
        }
    }
    fn set_unavailable(&mut self, nodes: Vec<String>) {
        self.unavailable = Some(nodes);
    }
}

impl TenantsTop {
    /// A merged answer as one node's reads: the most work first (unless it is a listing by
    /// name, which keeps the names' order), `top` of them; `total` the Relay's registered
    /// tenants when its nodes keep a registry, else the sum of the nodes' own counts.
    pub fn ranked(mut self, top: usize, by_work: bool) -> TenantsTop {
        if by_work {
            self.tenants.sort_by(|a, b| {
                b.counters
                    .work_order()
                    .cmp(&a.counters.work_order())
                    .then_with(|| a.tenant.cmp(&b.tenant))
            });
        } else {
            self.tenants.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        }
        self.tenants.truncate(top);
        if let Some(r) = self.registered.take() {
            self.total = r;
        }
        self.owned = None;
        self
    }
}

impl Merge for SourceBacklog {
    fn merge(&mut self, o: &Self) {
        self.pending += o.pending;
        self.scheduled += o.scheduled;
        self.inflight += o.inflight;
        self.bytes += o.bytes;
        self.rows_read += o.rows_read;
        self.exact &= o.exact;
    }
    fn set_unavailable(&mut self, _: Vec<String>) {}
}

impl Merge for SourceView {
    /// The backlogs added up; the settings are the same on every node.
    fn merge(&mut self, o: &Self) {
        self.backlog.merge(&o.backlog);
    }
    fn set_unavailable(&mut self, nodes: Vec<String>) {
        self.unavailable = nodes;
    }
}

impl Merge for LimitsView {
    /// The nodes changed and the refusals summed; the limits are the same on every node.
    fn merge(&mut self, o: &Self) {
        self.changed = match (self.changed, o.changed) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        self.refused += o.refused;
        self.last_refused_ms = self.last_refused_ms.max(o.last_refused_ms);
    }
    fn set_unavailable(&mut self, nodes: Vec<String>) {
        self.unavailable = nodes;
    }
}

impl Merge for EraseState {
    fn merge(&mut self, o: &Self) {
        self.changed += o.changed;
        self.erasing |= o.erasing;
        self.since_ms = match (self.since_ms, o.since_ms) {
            (0, b) => b,
            (a, 0) => a,
            (a, b) => a.min(b),
        };
    }
    fn set_unavailable(&mut self, nodes: Vec<String>) {
        self.unavailable = nodes;
    }
}

impl Merge for PurgeReport {
    fn merge(&mut self, o: &Self) {
        self.due += o.due;
        self.dead += o.dead;
        self.batches += o.batches;
    }
    fn set_unavailable(&mut self, nodes: Vec<String>) {
        self.unavailable = nodes;
    }
}

impl Merge for Revived {
    fn merge(&mut self, o: &Self) {
        self.revived += o.revived;
        self.matched += o.matched;
    }
    fn set_unavailable(&mut self, nodes: Vec<String>) {
        self.unavailable = nodes;
    }
}

impl Merge for QuarantineReplayed {
    fn merge(&mut self, o: &Self) {
        self.matched += o.matched;
        self.ingested += o.ingested;
        self.duplicates += o.duplicates;
        self.still_failing += o.still_failing;
        self.refused += o.refused;
        let room = 100usize.saturating_sub(self.results.len());
        self.results.extend(o.results.iter().take(room).cloned());
    }
    fn set_unavailable(&mut self, nodes: Vec<String>) {
        self.unavailable = nodes;
    }
}

impl Merge for Retried {
    fn merge(&mut self, o: &Self) {
        self.retried += o.retried;
        self.more |= o.more;
    }
    fn set_unavailable(&mut self, nodes: Vec<String>) {
        self.unavailable = nodes;
    }
}

impl Merge for Deleted {
    fn merge(&mut self, o: &Self) {
        self.deleted += o.deleted;
    }
    fn set_unavailable(&mut self, _: Vec<String>) {}
}

impl Merge for PauseState {
    fn merge(&mut self, o: &Self) {
        self.changed += o.changed;
        self.markers += o.markers;
    }
    fn set_unavailable(&mut self, nodes: Vec<String>) {
        self.unavailable = nodes;
    }
}

#[cfg(test)]
mod tests {
    use super::Merge;
    use crate::admin::{Retried, TenantView};
    use crate::node::Counters;

    #[test]
    fn two_views_of_a_tenant_sum_their_counters_and_keep_the_earliest_times() {
        let mut a = TenantView {
            tenant: "t".into(),
            ord: Some(3),
            counters: Counters {
                pending: 2,
                dead: 1,
                ..Counters::default()
            },
            paused_since_ms: Some(50),
            oldest_due_at_ms: None,
            quota_refusals: 1,
            ..TenantView::default()
        };
        let b = TenantView {
            tenant: "t".into(),
            ord: Some(9),
            counters: Counters {
                pending: 5,
                bytes: 10,
                ..Counters::default()
            },
            paused_since_ms: Some(40),
            oldest_due_at_ms: Some(7),
            quota_refusals: 2,
            ..TenantView::default()
        };
        a.merge(&b);
        assert_eq!(
            (a.counters.pending, a.counters.dead, a.counters.bytes),
            (7, 1, 10)
        );
        assert_eq!((a.paused_since_ms, a.oldest_due_at_ms), (Some(40), Some(7)));
        assert_eq!((a.quota_refusals, a.ord), (3, None));
    }

    #[test]
    fn more_is_any_nodes_more() {
        let mut a = Retried {
            tenant: "t".into(),
            retried: 3,
            more: false,
            unavailable: vec![],
        };
        a.merge(&Retried {
            tenant: "t".into(),
            retried: 4,
            more: true,
            unavailable: vec![],
        });
        assert_eq!((a.retried, a.more), (7, true));
    }
}
