//! The blocking half of a tick: the plan's candidates read, assigned round robin across
//! tenants within the sinks' and tenants' slots, and claimed in one batch.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::plan::{plan_cycle, plan_hinted, Cursors, TenantWork, TickLimits, TickPlan};
use super::slots::{TenantSlot, TenantSlots, Weights};
use super::{Job, TOP_INFLIGHT};
use crate::dispatch::delivery::{ClaimSlot, Deliverer};
use crate::dispatch::DispatchError;
use ankusa_keyspace::{AtMs, DueKey, Seq, SinkIdx, TenantOrd};
use ankusa_queue::deliveries::{self, DueRow, InflightRow, Tx};
use ankusa_queue::engine::Store;
use ankusa_records::{DeliveryRow, Envelope};

/// What the claim half of a tick needs besides the store.
pub(super) struct ClaimCtx {
    pub(super) deliverer: Arc<Deliverer>,
    pub(super) tenants: TenantSlots,
    pub(super) weights: Weights,
    /// Free global delivery permits: the most rows this tick may claim.
    pub(super) free: usize,
}

/// What [`claim_tick`] answers.
pub(super) struct Claimed {
    /// The cursors after the tick.
    pub(super) cursors: Cursors,
    /// The rows it claimed, to deliver.
    pub(super) jobs: Vec<Job>,
    /// The tenants it visited (`ankusa_dispatch_active_tenants`).
    pub(super) visited: usize,
    /// It was a full tick (not only the hinted tenants).
    pub(super) full: bool,
}

/// One tick's blocking half, asked of the [`Ticker`].
struct TickRequest {
    limits: TickLimits,
    cursors: Cursors,
    interval_ms: u64,
    ctx: ClaimCtx,
    reply: tokio::sync::oneshot::Sender<Result<Claimed, DispatchError>>,
}

/// The thread every tick's blocking half runs on (`ankusa-ticks`), one tick at a time, as
/// the pipeline asks for them.
///
/// A thread of its own rather than the blocking pool: each tick ran on whichever pool
/// thread was idle, its reads and decoding on cold caches and another thread's allocator
/// heap; on one thread the claim side of a delivery cost about a tenth less in the
/// `delivery` bench (docs/performance.md). A tick that panics answers an error and the
/// thread goes on with the next; it ends once the pipeline drops the ticker.
pub(super) struct Ticker {
    tx: std::sync::mpsc::Sender<TickRequest>,
    thread: std::thread::JoinHandle<()>,
}

impl Ticker {
    pub(super) fn spawn(store: Arc<Store>) -> std::io::Result<Ticker> {
        let (tx, rx) = std::sync::mpsc::channel::<TickRequest>();
        let thread = std::thread::Builder::new()
            .name("ankusa-ticks".into())
            .spawn(move || {
                for r in rx {
                    let TickRequest {
                        limits,
                        cursors,
                        interval_ms,
                        ctx,
                        reply,
                    } = r;
                    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        claim_tick(&store, limits, cursors, interval_ms, &ctx)
                    }))
                    .unwrap_or_else(|p| Err(DispatchError::panicked("dispatch tick", &p)));
                    // A pipeline that stopped waiting (a stop) no longer wants the answer.
                    let _ = reply.send(out);
                }
            })?;
        Ok(Ticker { tx, thread })
    }

    /// Runs one tick's blocking half on the thread.
    pub(super) async fn tick(
        &self,
        limits: TickLimits,
        cursors: Cursors,
        interval_ms: u64,
        ctx: ClaimCtx,
    ) -> Result<Claimed, DispatchError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let asked = TickRequest {
            limits,
            cursors,
            interval_ms,
            ctx,
            reply,
        };
        if self.tx.send(asked).is_err() {
            return Err(DispatchError::Gone("dispatch tick"));
        }
        answer
            .await
            .unwrap_or(Err(DispatchError::Gone("dispatch tick")))
    }

    /// Ends the thread (after the tick it runs, if any) and waits for it.
    pub(super) fn join(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}

/// A row the tick read, with its hook (if the hook is still there and decodes).
pub(super) struct Candidate {
    pub(super) row: DueRow,
    pub(super) envelope: Option<Arc<Envelope>>,
    /// The hook is there but does not decode (see [`Job::corrupt`]).
    pub(super) corrupt: Option<Arc<str>>,
}

/// A row the dispatch tick found that does not decode: counted as corruption and logged,
/// and the error's text for the dead row it becomes.
fn corrupt_row(u: deliveries::Undecodable) -> Arc<str> {
    let err = u.corruption();
    tracing::error!(error = %err, "dispatch: a row does not decode; its delivery is dead-lettered");
    err.to_string().into()
}

/// The blocking half of a tick: plan (a full scan, or the hinted tenants), read the
/// candidates' hooks (a row's sink is named by its hook), assign rows round robin across
/// tenants — each row only with a free slot of its sink and of its tenant — claim the
/// assigned rows (one batch), clean the markers of the tenants read, and read the claimed
/// rows' delivery rows.
pub(super) fn claim_tick(
    store: &Store,
    limits: TickLimits,
    mut cursors: Cursors,
    interval_ms: u64,
    ctx: &ClaimCtx,
) -> Result<Claimed, DispatchError> {
    let now = AtMs(ankusa_keyspace::now_ms());
    let full = cursors.full_due(now, interval_ms);
    // No tenant reads more rows than the tick can claim.
    let read = TickLimits {
        rows_per_tenant: limits.rows_per_tenant.min(ctx.free.max(1)),
        ..limits
    };
    let plan = if full {
        if cursors.cycle_over(now) {
            cursors.read_cycle(store, now, read.max_markers)?;
        }
        let plan = plan_cycle(store, now, &read, &mut cursors)?;
        cursors.scanned(now, &plan);
        plan
    } else {
        cursors.backlog = false;
        TickPlan::default()
    };
    // The hinted tenants, every tick: their fresh rows never wait behind a full tick's
    // order or a backlog another sink holds up.
    let hinted = if cursors.hinted.tenants.is_empty() {
        TickPlan::default()
    } else {
        plan_hinted(store, now, &read, &cursors)?
    };
    // Paused tenants: the markers the read met go, and so do their hints (a resume puts
    // the markers back, and the ticks find them there).
    for (ord, buckets) in &plan.paused {
        deliveries::drop_markers(store, *ord, buckets)?;
    }
    if !cursors.paused.is_empty() {
        let paused = cursors.paused.clone();
        cursors.hinted.tenants.retain(|o, _| !paused.holds(*o));
    }
    // Hinted tenants the budget did not reach keep their hints: the next tick's hinted
    // read goes on with them, with no full read of the active index.
    let work = candidates(store, &plan, &hinted)?;
    // Rows of pull sinks are parked for their consumers (the pull gateway), all of them, with
    // no slot: they leave the due rows, and no later tick reads them again.
    let (work, parked) = park_pulls(store, &ctx.deliverer, work)?;
    let start = cursors.rotation;
    cursors.rotation = cursors.rotation.wrapping_add(1);
    let weight_of = ctx.weights.resolve(store)?;
    let picked = assign(&work, start, ctx.free, &ctx.tenants, &weight_of, |c| {
        c.envelope
            .as_deref()
            .and_then(|env| {
                let id = env.sinks.get(c.row.key.sink.0 as usize)?;
                ctx.deliverer
                    .sink_for(env.tenant_or_default(), id)
                    .ok()
                    .flatten()
            })
            .map_or(SinkSlot::NotNeeded, |sink| {
                sink.try_claim(c.row.key.ord)
                    .map_or(SinkSlot::Refused, SinkSlot::Taken)
            })
    });
    let mut tx = Tx::new();
    let claims: Vec<InflightRow> = picked
        .iter()
        .map(|p| deliveries::claim(&mut tx, &work[p.tenant].1[p.row].row))
        .collect();
    // One unit per claim, in order: a row another writer moved first (purged, say) is
    // not ours to deliver.
    let committed = tx.commit(store, false)?;
    // A tick that parked rows made progress, whatever it claimed.
    let parked_any = !parked.is_empty();
    let mut claimed_keys: HashSet<DueKey> = parked.into_iter().collect();
    let mut jobs_in = Vec::new();
    for ((p, row), moved) in picked.into_iter().zip(claims).zip(committed.moved) {
        if moved {
            claimed_keys.insert(work[p.tenant].1[p.row].row.key);
            jobs_in.push((p, row));
        }
    }
    let left_any = after_full_reads(store, &mut cursors, &plan.work, &claimed_keys, now)?;
    let (left_hinted, cut_hinted) = after_hinted_reads(&mut cursors, &hinted.work, &claimed_keys);
    let left_any = left_any || cut_hinted;
    // Work left where only a full read finds it again calls for one; work a hint still
    // points at is the hinted read's.
    cursors.backlog |= left_any;
    cursors.blocked = (left_any || left_hinted) && jobs_in.is_empty() && !parked_any;
    let jobs = jobs_of(store, &work, jobs_in)?;
    // Once a second: the tenants holding the most deliveries in flight, by name.
    if now.0 >= cursors.named_at.0.saturating_add(1_000) {
        cursors.named_at = now;
        cursors.top_inflight = Some(top_inflight(store, &ctx.tenants)?);
    }
    Ok(Claimed {
        cursors,
        jobs,
        visited: plan.tenants_visited + hinted.tenants_visited,
        full,
    })
}

/// Per tenant, the rows of both reads, oldest first, once each, with their hooks: one read
/// of every hook. A hook that is gone is an orphan (its rows are dropped); one that does not
/// decode is corruption, never read as gone: its rows are dead-lettered with the error.
fn candidates(store: &Store, plan: &TickPlan, hinted: &TickPlan) -> Result<Work, DispatchError> {
    let mut order: Vec<TenantOrd> = Vec::new();
    let mut rows_of: HashMap<TenantOrd, Vec<DueRow>> = HashMap::new();
    for w in plan.work.iter().chain(&hinted.work) {
        let rows = rows_of.entry(w.ord).or_insert_with(|| {
            order.push(w.ord);
            Vec::new()
        });
        rows.extend(w.rows.iter().copied());
    }
    for rows in rows_of.values_mut() {
        rows.sort();
        rows.dedup_by_key(|r| r.key);
    }
    let mut seqs: Vec<Seq> = rows_of.values().flatten().map(|r| r.key.seq).collect();
    seqs.sort();
    seqs.dedup();
    let hooks = deliveries::envelopes_each(store, &seqs)?;
    let mut envs: HashMap<Seq, Arc<Envelope>> = HashMap::with_capacity(seqs.len());
    let mut corrupt: HashMap<Seq, Arc<str>> = HashMap::new();
    for (s, v) in seqs.into_iter().zip(hooks) {
        match v {
            None => {}
            Some(Ok(env)) => {
                envs.insert(s, Arc::new(env));
            }
            Some(Err(u)) => {
                corrupt.insert(s, corrupt_row(u));
            }
        }
    }
    Ok(order
        .iter()
        .map(|ord| {
            let rows = rows_of[ord]
                .iter()
                .map(|r| Candidate {
                    row: *r,
                    envelope: envs.get(&r.key.seq).cloned(),
                    corrupt: corrupt.get(&r.key.seq).cloned(),
                })
                .collect();
            (*ord, rows)
        })
        .collect())
}

/// Where a read stopped: the first row it left (for want of a slot), or none.
fn left_at(w: &TenantWork, claimed: &HashSet<DueKey>) -> Option<AtMs> {
    w.rows
        .iter()
        .find(|r| !claimed.contains(&r.key))
        .map(|r| r.key.at)
}

/// After the full reads' claims: each tenant's markers cleaned (or the cleanup put off),
/// and its cursor where its rows go on. Whether any tenant has rows left.
fn after_full_reads(
    store: &Store,
    cursors: &mut Cursors,
    work: &[TenantWork],
    claimed: &HashSet<DueKey>,
    now: AtMs,
) -> Result<bool, DispatchError> {
    let mut left_any = false;
    for w in work {
        // Where the tenant's rows go on, if any are left: its first row left for want of
        // a slot, or after a read its share or the budget cut, its last row read.
        let goes_on = left_at(w, claimed).or(w.rows.last().filter(|_| w.more).map(|r| r.key.at));
        // Rows are still due from there on. With every marker the read met from that
        // second on, the cleanup is put off to the tenant's next turn, which carries
        // those markers (`requeue`), and its read — a seek over the tombstones of the
        // rows claimed so far — is skipped. None of them is stale when the row left for
        // want of a slot is itself still due; after a cut read, the last row's second is
        // stale if the rest are due in later seconds, and the next turn's cleanup
        // deletes it.
        let put_off = goes_on.is_some_and(|at| w.buckets.iter().all(|b| *b >= at.bucket()));
        if !put_off {
            deliveries::cleanup_markers(store, w.ord, &w.buckets, now)?;
        }
        match goes_on {
            // Rows left for want of a slot, or a full share (more may wait): the next
            // read starts there, and the tenant's next turn is at the cycle's end.
            Some(at) => {
                cursors.advance(w.ord, at);
                cursors.requeue(w, at);
                left_any = true;
            }
            // Drained up to now (hinted rows included): the next read starts at its
            // oldest marker.
            None => {
                cursors.evict(w.ord);
                cursors.hinted.tenants.remove(&w.ord);
            }
        }
    }
    Ok(left_any)
}

/// After the hinted reads' claims: each hint kept, moved or dropped. Whether a hint still
/// points at rows left, and whether rows were left that only a full read finds again.
fn after_hinted_reads(
    cursors: &mut Cursors,
    work: &[TenantWork],
    claimed: &HashSet<DueKey>,
) -> (bool, bool) {
    let (mut left_hinted, mut left_any) = (false, false);
    for w in work {
        match (left_at(w, claimed), w.rows.last()) {
            // Rows no slot could take, all of them read: the hint stays at the first, so
            // the next tick offers them again (a quiet tenant keeps its turn).
            (Some(at), _) if !w.more => {
                cursors.hinted.tenants.insert(w.ord, at);
                left_hinted = true;
            }
            // A full read of rows no slot could take: the hint goes (a later hint starts
            // at its own rows, not behind these); the full reads hold them, from a fresh
            // read of the active index (the cycle's may not hold the tenant).
            (Some(_), _) => {
                cursors.hinted.tenants.remove(&w.ord);
                cursors.cycle.stale = true;
                left_any = true;
            }
            // Every row read was claimed, and the share or the budget cut the read: the
            // hint goes on from the last.
            (None, Some(last)) if w.more => {
                cursors.hinted.tenants.insert(w.ord, last.key.at);
                left_hinted = true;
            }
            _ => {
                cursors.hinted.tenants.remove(&w.ord);
            }
        }
    }
    (left_hinted, left_any)
}

/// The claimed rows as jobs, with their delivery rows (one read). A delivery row that does
/// not decode is corruption: the row is dead-lettered with the error (and a fresh state),
/// not sent on a made-up attempt count.
fn jobs_of(
    store: &Store,
    work: &Work,
    claimed: Vec<(Picked<ClaimSlot>, InflightRow)>,
) -> Result<Vec<Job>, DispatchError> {
    let pairs: Vec<(Seq, SinkIdx)> = claimed
        .iter()
        .map(|(_, r)| (r.key.seq, r.key.sink))
        .collect();
    let states = deliveries::delivery_rows_each(store, &pairs)?;
    Ok(claimed
        .into_iter()
        .zip(states)
        .map(|((p, row), state)| {
            let candidate = &work[p.tenant].1[p.row];
            let fresh = DeliveryRow {
                ord: row.key.ord,
                size: row.size,
                ..DeliveryRow::default()
            };
            let (state, corrupt) = match state {
                None => (fresh, candidate.corrupt.clone()),
                Some(Ok(s)) => (s, candidate.corrupt.clone()),
                Some(Err(u)) => (fresh, Some(corrupt_row(u))),
            };
            Job {
                state,
                envelope: candidate.envelope.clone(),
                corrupt,
                row,
                sink_slot: p.sink_slot,
                tenant_slot: p.tenant_slot,
            }
        })
        .collect())
}

/// The tenants holding the most deliveries in flight, by name.
fn top_inflight(
    store: &Store,
    tenants: &TenantSlots,
) -> Result<Vec<(String, usize)>, DispatchError> {
    let mut top = Vec::new();
    for (ord, n) in tenants.top(TOP_INFLIGHT) {
        if let Some(name) = ankusa_queue::tenants::name(store, ord)? {
            top.push((name, n));
        }
    }
    Ok(top)
}

/// A tick's candidates, by tenant.
type Work = Vec<(TenantOrd, Vec<Candidate>)>;

/// Parks the candidates whose sink is a pull sink (one batch) and wakes their consumers;
/// the rest, and the keys of the rows that left the due rows.
fn park_pulls(
    store: &Store,
    deliverer: &Deliverer,
    work: Work,
) -> Result<(Work, Vec<ankusa_keyspace::DueKey>), DispatchError> {
    // One load of the installed sinks for the whole tick; with no pull sink, nothing to do.
    let sinks = deliverer.current();
    if sinks.pull.is_empty() {
        return Ok((work, Vec::new()));
    }
    let pull_sink = |c: &Candidate| {
        c.envelope
            .as_deref()
            .and_then(|env| env.sinks.get(c.row.key.sink.0 as usize))
            .filter(|id| sinks.pull.contains(id.as_str()))
            .cloned()
    };
    if !work
        .iter()
        .flat_map(|(_, cs)| cs)
        .any(|c| pull_sink(c).is_some())
    {
        return Ok((work, Vec::new()));
    }
    let mut tx = Tx::new();
    let mut parking = Vec::new();
    let mut rest = Vec::with_capacity(work.len());
    for (ord, cands) in work {
        let mut keep = Vec::with_capacity(cands.len());
        for c in cands {
            match pull_sink(&c) {
                Some(id) => {
                    deliveries::park(&mut tx, &c.row, &id);
                    parking.push((c.row.key, id));
                }
                None => keep.push(c),
            }
        }
        rest.push((ord, keep));
    }
    let committed = tx.commit(store, false)?;
    let mut by_sink: HashMap<String, Vec<ankusa_keyspace::DueKey>> = HashMap::new();
    let mut parked = Vec::new();
    for ((key, id), moved) in parking.into_iter().zip(committed.moved) {
        if moved {
            parked.push(key);
            by_sink.entry(id).or_default().push(key);
        }
    }
    for (id, keys) in by_sink {
        deliverer.pull_wake.parked(&id, &keys);
    }
    Ok((rest, parked))
}

/// A candidate the round robin gave a slot: `work[tenant].1[row]`.
pub(super) struct Picked<S> {
    pub(super) tenant: usize,
    pub(super) row: usize,
    pub(super) sink_slot: Option<S>,
    pub(super) tenant_slot: TenantSlot,
}

/// A row's claim on its sink's slots (`S`: the slot, [`ClaimSlot`] in the node).
pub(super) enum SinkSlot<S> {
    /// The row needs no sink (an orphan, a sink no longer configured).
    NotNeeded,
    /// One of the sink's claim slots, taken.
    Taken(S),
    /// The sink is full, over its adaptive limit, or its breaker is open.
    Refused,
}

/// Deficit round robin with a quantum of one row: tenants take turns — those with the
/// fewest deliveries in flight first, ties from `start` — each turn giving one tenant its next row that has a slot of its sink (`sink_slot`) and of
/// the tenant, until `budget` rows are picked or no tenant can take one. Within a tenant rows
/// go oldest first; a row whose sink is full is passed over, so a slow sink never holds
/// back the tenant's rows for other sinks, and a flooding tenant gets one row per turn
/// like everyone else.
pub(super) fn assign<S>(
    work: &[(TenantOrd, Vec<Candidate>)],
    start: usize,
    budget: usize,
    tenants: &TenantSlots,
    weights: &HashMap<TenantOrd, u32>,
    sink_slot: impl Fn(&Candidate) -> SinkSlot<S>,
) -> Vec<Picked<S>> {
    let n = work.len();
    let mut picked = Vec::new();
    if n == 0 {
        return picked;
    }
    let mut next = vec![0usize; n];
    let mut open = vec![true; n];
    // The turn order: tenants with the fewest deliveries in flight first (a quiet tenant
    // before one whose backlog fills the sink), ties from the rotating start.
    let mut order: Vec<usize> = (0..n).map(|k| (start + k) % n).collect();
    let weight = |ord: &TenantOrd| weights.get(ord).copied().unwrap_or(1).max(1);
    // Each tenant's count read once: deliveries end while this sorts, and a key that
    // changes mid-sort is not an order (the standard sort panics on one).
    order.sort_by_cached_key(|t| tenants.held(work[*t].0) * 1_000 / weight(&work[*t].0) as usize);
    while picked.len() < budget {
        let mut progress = false;
        for &t in &order {
            let (ord, rows) = &work[t];
            // A tenant's turn: as many rows as its weight.
            for _ in 0..weight(ord) {
                if !open[t] || picked.len() >= budget {
                    break;
                }
                loop {
                    let Some(c) = rows.get(next[t]) else {
                        open[t] = false;
                        break;
                    };
                    if !tenants.has_room(*ord) {
                        open[t] = false;
                        break;
                    }
                    next[t] += 1;
                    let sink_slot = match sink_slot(c) {
                        SinkSlot::NotNeeded => None,
                        SinkSlot::Taken(p) => Some(p),
                        // The sink is full: this tenant's next row, if another sink's.
                        SinkSlot::Refused => continue,
                    };
                    // Only this task takes slots; others only give them back.
                    let Some(tenant_slot) = tenants.try_take(*ord) else {
                        open[t] = false;
                        break;
                    };
                    picked.push(Picked {
                        tenant: t,
                        row: next[t] - 1,
                        sink_slot,
                        tenant_slot,
                    });
                    progress = true;
                    break;
                }
            }
        }
        if !progress {
            break;
        }
    }
    picked
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Candidates of tenant `ord`: `n` rows, the i-th for sink `sinks[i % len]`.
    fn candidates(ord: u32, n: u64, sinks: &[&str]) -> (TenantOrd, Vec<Candidate>) {
        let rows = (0..n)
            .map(|i| {
                let sink = (i as usize) % sinks.len();
                Candidate {
                    row: DueRow {
                        key: ankusa_keyspace::DueKey {
                            ord: TenantOrd(ord),
                            at: AtMs(1_000 + i),
                            seq: Seq(u64::from(ord) * 1_000_000 + i),
                            sink: ankusa_keyspace::SinkIdx(sink as u16),
                        },
                        size: 10,
                        kind: deliveries::Kind::First,
                    },
                    envelope: Some(Arc::new(Envelope {
                        sinks: sinks.iter().map(|s| (*s).to_owned()).collect(),
                        ..Envelope::default()
                    })),
                    corrupt: None,
                }
            })
            .collect();
        (TenantOrd(ord), rows)
    }

    fn sink_slots<'a>(
        sinks: &'a HashMap<&'static str, Arc<tokio::sync::Semaphore>>,
    ) -> impl Fn(&Candidate) -> SinkSlot<tokio::sync::OwnedSemaphorePermit> + 'a {
        |c| {
            let slots = c
                .envelope
                .as_deref()
                .and_then(|env| env.sinks.get(c.row.key.sink.0 as usize))
                .and_then(|id| sinks.get(id.as_str()));
            match slots.map(|s| s.clone().try_acquire_owned()) {
                None => SinkSlot::NotNeeded,
                Some(Ok(p)) => SinkSlot::Taken(p),
                Some(Err(_)) => SinkSlot::Refused,
            }
        }
    }

    #[test]
    fn the_round_robin_gives_a_quiet_tenant_its_turn_beside_a_flood() {
        let work = vec![candidates(1, 1_000, &["s"]), candidates(2, 1, &["s"])];
        let sinks = HashMap::from([("s", Arc::new(tokio::sync::Semaphore::new(100)))]);
        let tenants = TenantSlots::new(1_000);
        // Whichever tenant the rotation starts with, the quiet one is in the first round.
        for start in 0..2 {
            let picked = assign(
                &work,
                start,
                2,
                &tenants,
                &HashMap::new(),
                sink_slots(&sinks),
            );
            let who: Vec<usize> = picked.iter().map(|p| p.tenant).collect();
            assert!(who.contains(&1), "start {start}: {who:?}");
        }
        // A flood alone takes the whole budget, oldest first.
        let picked = assign(
            &work[..1],
            0,
            5,
            &tenants,
            &HashMap::new(),
            sink_slots(&sinks),
        );
        let rows: Vec<usize> = picked.iter().map(|p| p.row).collect();
        assert_eq!(rows, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_tenant_of_weight_three_gets_three_rows_a_turn() {
        let work = vec![candidates(1, 100, &["s"]), candidates(2, 100, &["s"])];
        let sinks = HashMap::from([("s", Arc::new(tokio::sync::Semaphore::new(1_000)))]);
        let tenants = TenantSlots::new(1_000);
        let weights = HashMap::from([(TenantOrd(2), 3)]);
        let picked = assign(&work, 0, 40, &tenants, &weights, sink_slots(&sinks));
        let of = |t: usize| picked.iter().filter(|p| p.tenant == t).count();
        assert_eq!((of(0), of(1)), (10, 30));
    }

    #[test]
    fn a_full_sink_holds_back_only_its_own_rows_and_a_tenant_only_its_cap() {
        // Tenant 1 alternates between a full sink and a free one.
        let work = vec![
            candidates(1, 10, &["slow", "fast"]),
            candidates(2, 10, &["fast"]),
        ];
        let sinks = HashMap::from([
            ("slow", Arc::new(tokio::sync::Semaphore::new(0))),
            ("fast", Arc::new(tokio::sync::Semaphore::new(100))),
        ]);
        let tenants = TenantSlots::new(3);
        let picked = assign(&work, 0, 100, &tenants, &HashMap::new(), sink_slots(&sinks));
        let of = |t: usize| -> Vec<usize> {
            picked
                .iter()
                .filter(|p| p.tenant == t)
                .map(|p| p.row)
                .collect()
        };
        // Tenant 1's rows for `fast` (odd rows) go; its `slow` rows wait; each tenant stops
        // at its cap of 3.
        assert_eq!(of(0), vec![1, 3, 5]);
        assert_eq!(of(1), vec![0, 1, 2]);
        assert!(picked.iter().all(|p| p.sink_slot.is_some()));
        assert_eq!(tenants.usage(), (2, 3));
        assert!(!tenants.has_room(TenantOrd(1)));
        drop(picked);
        assert_eq!(tenants.usage(), (0, 0), "dropped slots are given back");
        assert_eq!(sinks["fast"].available_permits(), 100);
    }

    /// A claim context over one sink, `sink0` (the harness's hooks name it), with
    /// `free` slots.
    fn claim_ctx(free: usize) -> ClaimCtx {
        let config = ankusa_config::Config::from_yaml(
            "sinks:\n  - { id: sink0, url: \"http://127.0.0.1:9/\" }\n",
            Vec::new(),
        )
        .unwrap();
        ClaimCtx {
            deliverer: Arc::new(Deliverer::from_config(&config).unwrap()),
            tenants: TenantSlots::new(1_000),
            weights: Weights::new(Default::default()),
            free,
        }
    }

    /// A tenant whose read the tick's budget cut (behind another tenant's rows) goes on
    /// from its cursor at its next turn, and the cleanup of its markers waits for the turn
    /// that can find one stale: draining one second's 2 000 rows 16 a tick steps over the
    /// tombstones of the rows already claimed a bounded number of times, not once a tick
    /// (4 266 here; with a cleanup every tick, 129 266).
    #[test]
    fn a_tenant_the_budget_cut_goes_on_from_its_cursor_over_no_claimed_row() {
        const ROWS: u64 = 2_000;
        const FREE: usize = 16;
        let mut h = ankusa_queue::testkit::Harness::new();
        for i in 0..FREE as u64 / 2 {
            h.ingest(Some("a"), 1, 1_000 + i, false);
        }
        for i in 0..ROWS {
            h.ingest(Some("b"), 1, 1_000 + i % 1_000, false);
        }
        let ctx = claim_ctx(FREE);
        let limits = TickLimits {
            rows_per_tick: FREE,
            ..TickLimits::default()
        };
        let b = h.ord("b");
        let mut cursors = Some(Cursors::default());
        let (ticks, walked) = ankusa_queue::engine::tombstones_walked(|| {
            let (mut claimed, mut ticks) = (0, 0);
            let all = ROWS + FREE as u64 / 2;
            while claimed < all {
                let out =
                    claim_tick(&h.store, limits, cursors.take().unwrap(), 1_000, &ctx).unwrap();
                // Each tick fills its budget, never held back by a slot (the jobs, and
                // their slots, go at once); the first reads all of a, then half a share
                // of b.
                assert_eq!(out.jobs.len() as u64, (FREE as u64).min(all - claimed));
                claimed += out.jobs.len() as u64;
                ticks += 1;
                if claimed < all {
                    assert_ne!(
                        out.cursors.floor(b),
                        AtMs(0),
                        "tick {ticks}: the read of b was cut, and b keeps its cursor"
                    );
                }
                cursors = Some(out.cursors);
            }
            ticks
        });
        assert_eq!(ticks, (ROWS + FREE as u64 / 2).div_ceil(FREE as u64));
        assert!(
            walked <= 3 * ROWS,
            "{ticks} ticks stepped over {walked} tombstones"
        );
        // The turns that drained the tenants cleaned their markers.
        let active = deliveries::active_tenants_from(
            &h.store,
            ankusa_keyspace::Bucket(0),
            AtMs(ankusa_keyspace::now_ms()),
            usize::MAX,
            4096,
        )
        .unwrap();
        assert!(active.is_empty(), "a marker is left: {active:?}");
    }

    /// A hinted tenant whose read the tick's budget cut keeps its hint, at the last row
    /// read: the next tick goes on with its fresh rows (dropped, they waited for a full
    /// read of the active index).
    #[test]
    fn a_hinted_tenant_the_budget_cut_keeps_its_hint() {
        const FREE: usize = 16;
        let mut h = ankusa_queue::testkit::Harness::new();
        for i in 0..FREE as u64 / 2 {
            h.ingest(Some("a"), 1, 1_000 + i, false);
        }
        for i in 0..40 {
            h.ingest(Some("b"), 1, 1_100 + i, false);
        }
        let (a, b) = (h.ord("a"), h.ord("b"));
        let ctx = claim_ctx(FREE);
        let limits = TickLimits {
            rows_per_tick: FREE,
            ..TickLimits::default()
        };
        let mut cursors = Cursors {
            // A full read is not due: only the hinted tenants are read.
            full_at: AtMs(ankusa_keyspace::now_ms()),
            ..Cursors::default()
        };
        for ord in [a, b] {
            cursors
                .hinted
                .add(ord, AtMs(1_000), ankusa_queue::hints::DueHints::CAPACITY);
        }
        let out = claim_tick(&h.store, limits, cursors, 60_000, &ctx).unwrap();
        assert!(!out.full);
        assert_eq!(out.jobs.len(), FREE);
        let hinted = &out.cursors.hinted.tenants;
        assert!(!hinted.contains_key(&a), "a drained: {hinted:?}");
        assert_eq!(
            hinted.get(&b),
            Some(&AtMs(1_100 + FREE as u64 / 2 - 1)),
            "b goes on from the last row read"
        );
        // The next ticks take the rest of b from its hint.
        let mut cursors = out.cursors;
        let mut claimed = 0;
        for _ in 0..4 {
            let out = claim_tick(&h.store, limits, cursors, 60_000, &ctx).unwrap();
            assert!(!out.full);
            claimed += out.jobs.len();
            cursors = out.cursors;
        }
        assert_eq!(claimed, 40 - FREE / 2);
        assert!(cursors.hinted.tenants.is_empty());
    }
}
