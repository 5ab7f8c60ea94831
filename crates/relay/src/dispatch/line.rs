//! A sink's request line: who sends next when one of the sink's requests ends.
//!
//! Rows claimed for a sink wait here for one of its request slots. A FIFO line (a plain
//! semaphore) would put a quiet tenant's fresh row behind every row a flooding tenant had
//! claimed before it; this line takes turns between *tenants* instead:
//!
//! - a tenant that starts waiting while it had nothing waiting joins the *fresh* turns and
//!   is served before the tenants already taking turns (fewest waiting first: a tenant's
//!   first row never queues behind another tenant's backlog);
//! - a tenant served with more rows waiting goes to the back of the turns (round robin,
//!   one row per turn);
//! - within a tenant, rows go in the order they joined.
//!
//! The line holds at most `limit` requests in flight, and the limit follows the sink's
//! adaptive controller ([`super::control`]): [`Line::set_limit`] after each attempt. The
//! last [`Line::reserve`] slots of the limit go only to tenants with no request in flight
//! at the sink: a flood's requests, all started and ended together, would otherwise make a
//! quiet tenant wait for the next of them to end (up to a whole request's time). A row that
//! finds nobody waiting and a slot it may take takes it at once; otherwise a slot is
//! handed from the request that ends straight to the next in line (a wake-up, no tick in
//! between). A waiter that gives up (its task cut at shutdown) loses nothing: a slot
//! handed to it goes on to the next.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use ankusa_keyspace::TenantOrd;

#[derive(Debug, Default)]
struct State {
    /// The most requests in flight (≥ 1).
    limit: usize,
    /// Requests in flight (slots out, handed-off ones included).
    in_flight: usize,
    /// Requests in flight by tenant.
    by_tenant: HashMap<TenantOrd, usize>,
    /// Waiters by tenant, in the order they joined.
    waiting: HashMap<TenantOrd, VecDeque<oneshot::Sender<Slot>>>,
    /// Tenants that had nothing waiting when their first waiter joined: served first.
    fresh: VecDeque<TenantOrd>,
    /// Tenants served before and still waiting: round robin.
    turns: VecDeque<TenantOrd>,
    /// Waiters in the line.
    queued: usize,
}

impl State {
    /// The next tenant to serve, taken out of its turn: the first of the fresh ones, then
    /// of the turns, that may have a slot now.
    fn next_turn(&mut self) -> Option<TenantOrd> {
        let open_to_all = self.open_to_all();
        let by_tenant = &self.by_tenant;
        let may = |t: &TenantOrd| open_to_all || !by_tenant.contains_key(t);
        if let Some(i) = self.fresh.iter().position(may) {
            return self.fresh.remove(i);
        }
        let i = self.turns.iter().position(may)?;
        self.turns.remove(i)
    }

    /// Whether a slot may go to a tenant with a request in flight (the newcomers' reserve
    /// is not reached).
    fn open_to_all(&self) -> bool {
        self.in_flight + Line::reserve(self.limit) < self.limit
    }

    /// Whether a free slot may go to `tenant`: below the reserve, or it has none in flight.
    fn may_start(&self, tenant: TenantOrd) -> bool {
        self.open_to_all() || !self.by_tenant.contains_key(&tenant)
    }

    fn ended(&mut self, tenant: TenantOrd) {
        self.in_flight -= 1;
        if let Some(n) = self.by_tenant.get_mut(&tenant) {
            *n -= 1;
            if *n == 0 {
                self.by_tenant.remove(&tenant);
            }
        }
    }
}

/// One sink's request line.
#[derive(Debug)]
pub struct Line {
    state: Mutex<State>,
}

/// One request slot of a line; the slot goes to the next in line when this is dropped.
#[derive(Debug)]
pub struct Slot {
    line: Arc<Line>,
    tenant: TenantOrd,
    /// False for a slot its waiter never took (its drop must not end it twice).
    armed: bool,
}

impl Line {
    pub fn new(limit: usize) -> Arc<Line> {
        Arc::new(Line {
            state: Mutex::new(State {
                limit: limit.max(1),
                ..State::default()
            }),
        })
    }

    /// The slots of `limit` kept for tenants with no request in flight: a sixteenth,
    /// rounded up, from a limit of 4 (below it a tenant alone would lose too much).
    pub fn reserve(limit: usize) -> usize {
        if limit >= 4 {
            limit.div_ceil(16)
        } else {
            0
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a request slot for one of `tenant`'s rows.
    pub async fn acquire(self: &Arc<Self>, tenant: TenantOrd) -> Slot {
        let rx = {
            let mut s = self.lock();
            // Nobody waiting and a slot free for this tenant: the turn is its own at once
            // (what `fill` would hand it), with no hand-off and no wake-up.
            if s.queued == 0 && s.in_flight < s.limit && s.may_start(tenant) {
                return self.start(&mut s, tenant);
            }
            let (tx, rx) = oneshot::channel();
            let q = s.waiting.entry(tenant).or_default();
            q.push_back(tx);
            if q.len() == 1 {
                s.fresh.push_back(tenant);
            }
            s.queued += 1;
            self.fill(&mut s);
            rx
        };
        match rx.await {
            Ok(slot) => slot,
            // The line never drops a waiter's sender without sending (see `fill`); should
            // it, waiting again is still correct.
            Err(_) => Box::pin(self.acquire(tenant)).await,
        }
    }

    /// Requests in flight and rows waiting (the tests' view; an attempt reads them from
    /// [`Line::set_limit`]).
    #[cfg(test)]
    fn usage(&self) -> (usize, usize) {
        let s = self.lock();
        (s.in_flight, s.queued)
    }

    /// Sets the most requests in flight (the sink's adaptive limit). A raise lets waiters
    /// in at once; a cut takes effect as requests end. Answers the requests in flight and the
    /// rows waiting after it (one lock for both, after each attempt).
    pub fn set_limit(self: &Arc<Self>, limit: usize) -> (usize, usize) {
        let mut s = self.lock();
        s.limit = limit.max(1);
        self.fill(&mut s);
        (s.in_flight, s.queued)
    }

    /// A slot out to `tenant`: counted in flight until it is dropped.
    fn start(self: &Arc<Self>, s: &mut State, tenant: TenantOrd) -> Slot {
        s.in_flight += 1;
        *s.by_tenant.entry(tenant).or_default() += 1;
        Slot {
            line: self.clone(),
            tenant,
            armed: true,
        }
    }

    /// Hands slots to waiters, in turn, while the limit allows.
    fn fill(self: &Arc<Self>, s: &mut State) {
        while s.queued > 0 && s.in_flight < s.limit {
            let Some(tenant) = s.next_turn() else {
                return;
            };
            let Some(q) = s.waiting.get_mut(&tenant) else {
                continue;
            };
            let Some(tx) = q.pop_front() else {
                s.waiting.remove(&tenant);
                continue;
            };
            s.queued -= 1;
            if q.is_empty() {
                s.waiting.remove(&tenant);
            } else {
                s.turns.push_back(tenant);
            }
            let slot = self.start(s, tenant);
            if let Err(mut slot) = tx.send(slot) {
                // The waiter gave up: the slot goes on to the next.
                slot.armed = false;
                s.ended(tenant);
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let line = self.line.clone();
        let mut s = line.lock();
        s.ended(self.tenant);
        line.fill(&mut s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn order_served(line: &Arc<Line>, joins: &[u32]) -> Vec<u32> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for &t in joins {
            let (line, tx) = (line.clone(), tx.clone());
            tokio::spawn(async move {
                let slot = line.acquire(TenantOrd(t)).await;
                tx.send((t, slot)).unwrap();
            });
            // Join in this order.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        drop(tx);
        let mut served = Vec::new();
        while let Some((t, slot)) = rx.recv().await {
            served.push(t);
            drop(slot);
        }
        served
    }

    #[tokio::test]
    async fn a_quiet_tenant_is_served_before_a_flood_already_waiting() {
        let line = Line::new(1);
        let first = line.acquire(TenantOrd(9)).await;
        // Tenant 1 floods, then tenant 2 joins with one row, then tenant 1 again.
        let served = tokio::spawn({
            let line = line.clone();
            async move { order_served(&line, &[1, 1, 1, 1, 2, 1]).await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(line.usage(), (1, 6));
        drop(first);
        // Tenant 1 was fresh first and takes one turn; tenant 2 joined fresh and goes
        // before tenant 1's remaining rows.
        assert_eq!(served.await.unwrap(), vec![1, 2, 1, 1, 1, 1]);
        assert_eq!(line.usage(), (0, 0));
    }

    #[tokio::test]
    async fn tenants_with_backlogs_take_turns() {
        let line = Line::new(1);
        let first = line.acquire(TenantOrd(9)).await;
        let served = tokio::spawn({
            let line = line.clone();
            async move { order_served(&line, &[1, 1, 1, 2, 2, 2, 3]).await }
        });
        tokio::time::sleep(Duration::from_millis(40)).await;
        drop(first);
        assert_eq!(served.await.unwrap(), vec![1, 2, 3, 1, 2, 1, 2]);
    }

    #[tokio::test]
    async fn the_limit_bounds_requests_and_follows_the_controller() {
        let line = Line::new(2);
        let a = line.acquire(TenantOrd(1)).await;
        let b = line.acquire(TenantOrd(1)).await;
        let waiter = tokio::spawn({
            let line = line.clone();
            async move { line.acquire(TenantOrd(2)).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(line.usage(), (2, 1));
        // A cut: the next request to end is not handed on.
        line.set_limit(1);
        drop(a);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(line.usage(), (1, 1));
        assert!(!waiter.is_finished());
        // A raise lets the waiter in at once.
        line.set_limit(2);
        let c = waiter.await.unwrap();
        assert_eq!(line.usage(), (2, 0));
        drop((b, c));
        assert_eq!(line.usage(), (0, 0));
    }

    #[tokio::test]
    async fn the_last_slots_wait_for_a_tenant_with_nothing_in_flight() {
        assert_eq!(
            [1, 3, 4, 16, 17, 128].map(Line::reserve),
            [0, 0, 1, 1, 2, 8]
        );
        let line = Line::new(4);
        let mut flood = Vec::new();
        for _ in 0..3 {
            flood.push(line.acquire(TenantOrd(1)).await);
        }
        // The flood's fourth row waits: the last slot is kept.
        let fourth = tokio::spawn({
            let line = line.clone();
            async move { line.acquire(TenantOrd(1)).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(line.usage(), (3, 1));
        // A quiet tenant takes it at once.
        let quiet = line.acquire(TenantOrd(2)).await;
        assert_eq!(line.usage(), (4, 1));
        // A flood request ends: the flood is at the reserve, its row still waits.
        drop(flood.pop());
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(line.usage(), (3, 1));
        // The quiet one ends: the flood's row goes.
        drop(quiet);
        let fourth = tokio::time::timeout(Duration::from_secs(1), fourth)
            .await
            .expect("served")
            .unwrap();
        assert_eq!(line.usage(), (3, 0));
        drop((fourth, flood));
        assert_eq!(line.usage(), (0, 0));
    }

    #[test]
    fn a_free_slot_is_taken_at_once_within_the_reserve() {
        use futures_util::FutureExt;
        let line = Line::new(4);
        // Nobody waits and slots are free: each acquire is served in its first poll.
        let flood: Vec<Slot> = (0..3)
            .map(|_| {
                line.acquire(TenantOrd(1))
                    .now_or_never()
                    .expect("a free slot, at once")
            })
            .collect();
        assert_eq!(line.usage(), (3, 0));
        // The last slot is the newcomers': the flood's fourth row is not served at once
        // (this waiter gives up; the line counts it until a slot passes it by).
        assert!(line.acquire(TenantOrd(1)).now_or_never().is_none());
        assert_eq!(line.usage(), (3, 1));
        // A tenant with nothing in flight takes the last slot at once.
        let quiet = line
            .acquire(TenantOrd(2))
            .now_or_never()
            .expect("the reserve, at once");
        assert_eq!(line.usage(), (4, 1));
        drop(quiet);
        drop(flood);
        assert_eq!(line.usage(), (0, 0));
    }

    #[tokio::test]
    async fn a_slot_handed_to_a_waiter_that_gave_up_goes_to_the_next() {
        let line = Line::new(1);
        let first = line.acquire(TenantOrd(1)).await;
        let gone = tokio::spawn({
            let line = line.clone();
            async move { line.acquire(TenantOrd(2)).await }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let next = tokio::spawn({
            let line = line.clone();
            async move { line.acquire(TenantOrd(3)).await }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        gone.abort();
        let _ = gone.await;
        drop(first);
        let slot = tokio::time::timeout(Duration::from_secs(1), next)
            .await
            .expect("the next waiter is served")
            .unwrap();
        assert_eq!(line.usage(), (1, 0));
        drop(slot);
        assert_eq!(line.usage(), (0, 0));
    }
}
