//! Due hints: the tenants the writer has just given due work, handed to the dispatch tick
//! in memory so fresh hooks are claimed without a scan of the active index.
//!
//! A hint is only a shortcut. The store stays the truth: every due row still has its
//! marker, and the tick's full scan (at least every `dispatch.tick_interval_ms`) finds
//! whatever a hint did not name — a replay, a retry coming due, a hint dropped at the
//! ceiling. A hint carries the earliest `at` the writer enqueued for the tenant, so the
//! tick's read of that tenant starts there instead of at the tenant's first tombstone.
//!
//! Rows that become due later (retries) are hinted ahead: [`DueHints::add_later`] keeps
//! them in a timer ordered by `at`, the pipeline sleeps until the earliest, and a take at
//! or after it turns them into hints — a retry is claimed when it comes due, without a
//! scan.
//!
//! Bounded: at most [`DueHints::CAPACITY`] tenants wait, and as many timer entries; past
//! either a hint is refused and the set marked overflowed, which makes the next tick a
//! full scan (a timer entry refused is found by a full scan when it comes due).

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use ankusa_keyspace::{AtMs, TenantOrd};

/// The hints waiting for the next tick, and the tick's wake-up.
#[derive(Debug, Default)]
pub struct DueHints {
    waiting: Mutex<Waiting>,
    wake: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Waiting {
    now: Hinted,
    /// Rows due later: `(at, tenant)`, earliest first.
    later: BTreeSet<(AtMs, TenantOrd)>,
}

/// What a tick takes: per tenant the earliest hinted `at`, and whether any hint was
/// refused since the last take.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Hinted {
    pub tenants: HashMap<TenantOrd, AtMs>,
    pub overflowed: bool,
}

impl Hinted {
    /// Adds one hint, keeping the earliest `at` per tenant; past `capacity` tenants the
    /// hint is refused and the set marked overflowed.
    pub fn add(&mut self, ord: TenantOrd, at: AtMs, capacity: usize) {
        let full = self.tenants.len() >= capacity;
        match self.tenants.entry(ord) {
            Entry::Occupied(mut e) => {
                let floor = e.get_mut();
                *floor = (*floor).min(at);
            }
            Entry::Vacant(_) if full => self.overflowed = true,
            Entry::Vacant(e) => {
                e.insert(at);
            }
        }
    }

    /// Takes in another set (the hints a tick left for later).
    pub fn merge(&mut self, other: Hinted, capacity: usize) {
        self.overflowed |= other.overflowed;
        for (ord, at) in other.tenants {
            self.add(ord, at, capacity);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty() && !self.overflowed
    }
}

impl DueHints {
    /// The most tenants waiting (the node's `tenants.max` is usually far below it).
    pub const CAPACITY: usize = 65_536;

    /// The writer, after a commit: these tenants have due rows from `at` on. Wakes the
    /// tick (not for none: a batch whose deliveries all started at its commit has nothing
    /// for a tick).
    pub fn add(&self, due: impl IntoIterator<Item = (TenantOrd, AtMs)>) {
        let mut any = false;
        {
            let mut w = self.lock();
            for (ord, at) in due {
                w.now.add(ord, at, Self::CAPACITY);
                any = true;
            }
        }
        if any {
            self.wake.notify_one();
        }
    }

    /// Rows that become due at their `at` (retries): hinted when it comes. Wakes the
    /// pipeline so it can sleep until the earliest.
    pub fn add_later(&self, due: impl IntoIterator<Item = (TenantOrd, AtMs)>) {
        let mut added = false;
        {
            let mut w = self.lock();
            for (ord, at) in due {
                if w.later.len() >= Self::CAPACITY {
                    w.now.overflowed = true;
                    break;
                }
                added |= w.later.insert((at, ord));
            }
        }
        if added {
            self.wake.notify_one();
        }
    }

    /// Everything hinted now, and the timer's entries due by `now`, leaving neither.
    pub fn take(&self, now: AtMs) -> Hinted {
        let mut w = self.lock();
        while let Some(&(at, ord)) = w.later.first() {
            if at > now {
                break;
            }
            w.later.pop_first();
            w.now.add(ord, at, Self::CAPACITY);
        }
        std::mem::take(&mut w.now)
    }

    /// When the earliest timer entry comes due.
    pub fn next_later(&self) -> Option<AtMs> {
        self.lock().later.first().map(|(at, _)| *at)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves once a hint arrives (at once if one arrived since the last wait).
    pub async fn arrived(&self) {
        self.wake.notified().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_keeps_its_earliest_hint_and_the_ceiling_refuses_new_tenants() {
        let mut h = Hinted::default();
        h.add(TenantOrd(1), AtMs(50), 2);
        h.add(TenantOrd(1), AtMs(40), 2);
        h.add(TenantOrd(1), AtMs(60), 2);
        h.add(TenantOrd(2), AtMs(70), 2);
        assert!(!h.overflowed);
        h.add(TenantOrd(3), AtMs(10), 2);
        assert!(h.overflowed, "a third tenant is past the ceiling");
        assert_eq!(h.tenants.len(), 2);
        assert_eq!(h.tenants[&TenantOrd(1)], AtMs(40));
        // A known tenant is still taken at the ceiling.
        h.add(TenantOrd(2), AtMs(5), 2);
        assert_eq!(h.tenants[&TenantOrd(2)], AtMs(5));
    }

    #[tokio::test]
    async fn a_hint_wakes_the_tick_and_is_taken_once() {
        let hints = std::sync::Arc::new(DueHints::default());
        let waiter = {
            let hints = hints.clone();
            tokio::spawn(async move {
                hints.arrived().await;
                hints.take(AtMs(1_000))
            })
        };
        hints.add([(TenantOrd(7), AtMs(1_000))]);
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("task");
        assert_eq!(got.tenants[&TenantOrd(7)], AtMs(1_000));
        assert!(hints.take(AtMs(1_000)).is_empty());
    }

    #[test]
    fn a_later_row_is_hinted_when_it_comes_due_and_not_before() {
        let hints = DueHints::default();
        hints.add_later([(TenantOrd(1), AtMs(5_000)), (TenantOrd(2), AtMs(3_000))]);
        assert_eq!(hints.next_later(), Some(AtMs(3_000)));
        assert!(hints.take(AtMs(2_999)).is_empty());
        let t = hints.take(AtMs(4_000));
        assert_eq!(t.tenants.len(), 1);
        assert_eq!(t.tenants[&TenantOrd(2)], AtMs(3_000));
        assert_eq!(hints.next_later(), Some(AtMs(5_000)));
        assert_eq!(hints.take(AtMs(9_000)).tenants[&TenantOrd(1)], AtMs(5_000));
        assert_eq!(hints.next_later(), None);
    }
}
