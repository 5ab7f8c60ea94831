//! The **transitions twin** of the delivery benches (`delivery`, `nats`): a backlog drained
//! by a plain loop that makes the store moves a delivery needs — read due rows, claim, read
//! the hooks and their delivery rows (the attempt's number), send each through the node's
//! own sink, commit the outcomes with each attempt's hook-log event, reclaim — in lock-step
//! batches of 512, with none of the pipeline's machinery (ticks, hints, slots, lines,
//! fairness). Without sending, **the store's moves alone**.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ankusa_keyspace::AtMs;
use ankusa_records::Envelope;
use ankusa_relay::dispatch::delivery::{Attempt, Deliverer, Sink};
use ankusa_store::{Rows, Store};

/// The node's client and one of its sinks, as the relay's configuration builds them.
pub struct Target {
    pub deliverer: Deliverer,
    pub sink: Arc<Sink>,
}

/// Drains `backlog` rows of `store` in lock-step batches of 512; with `target`, each
/// batch's hooks are sent through it, `concurrency` at a time, and `check`ed.
pub async fn lockstep(
    store: &Arc<Store>,
    backlog: u64,
    target: Option<&Target>,
    concurrency: usize,
    check: fn(&Attempt),
) {
    use ankusa_queue::deliveries::{self, Tx};
    use ankusa_relay::dispatch::pipeline::plan::{plan_tick, Cursors, TickLimits};
    let limits = TickLimits {
        rows_per_tick: 512,
        rows_per_tenant: 512,
        ..TickLimits::default()
    };
    let started = Instant::now();
    let mut delivered = 0u64;
    while delivered < backlog {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the twin never drained"
        );
        // Read and claim a batch, read its hooks.
        let s = store.clone();
        let (claimed, envs) = tokio::task::spawn_blocking(move || {
            let now = AtMs(ankusa_keyspace::now_ms());
            let plan = plan_tick(&s, now, &limits, &Cursors::default()).expect("plan");
            let mut tx = Tx::new();
            let mut claimed = Vec::new();
            for w in &plan.work {
                for r in &w.rows {
                    claimed.push(deliveries::claim(&mut tx, r));
                }
            }
            tx.commit(&s, false).expect("claim");
            for w in &plan.work {
                deliveries::cleanup_markers(&s, w.ord, &w.buckets, now).expect("cleanup");
            }
            let (envs, attempts) = read_claimed(&s, &claimed);
            let claimed: Vec<_> = claimed.into_iter().zip(attempts).collect();
            (claimed, envs)
        })
        .await
        .expect("read");
        if let Some(t) = target {
            send_all(t, envs, concurrency, check).await;
        }
        // Commit the outcomes with each attempt's hook-log event (the node's hook log is
        // on, as by default: a durable move of every delivery, as in `ingest`'s store
        // floor), then reclaim what they freed.
        let s = store.clone();
        let n = claimed.len() as u64;
        tokio::task::spawn_blocking(move || super::settle_attempts(&s, &claimed, true))
            .await
            .expect("commit");
        delivered += n;
    }
}

/// The hooks of `claimed` and each one's attempt number (its delivery row's attempts so
/// far, plus one).
pub fn read_claimed(
    store: &Store,
    claimed: &[ankusa_queue::deliveries::InflightRow],
) -> (Vec<Envelope>, Vec<u32>) {
    let keys: Vec<_> = claimed
        .iter()
        .map(|r| ankusa_keyspace::hook(r.key.seq))
        .collect();
    let envs = store
        .multi_get(ankusa_keyspace::Cf::Hooks, &keys)
        .expect("hooks")
        .into_iter()
        .map(|v| Envelope::decode(&v.expect("hook")).expect("envelope"))
        .collect();
    let pairs: Vec<_> = claimed.iter().map(|r| (r.key.seq, r.key.sink)).collect();
    let attempts = ankusa_queue::deliveries::delivery_rows(store, &pairs)
        .expect("delivery rows")
        .into_iter()
        .map(|st| st.map_or(0, |st| st.attempts) + 1)
        .collect();
    (envs, attempts)
}

/// Sends every envelope through the node's own sink, `concurrency` at a time.
pub async fn send_all(t: &Target, envs: Vec<Envelope>, concurrency: usize, check: fn(&Attempt)) {
    let envs = Arc::new(envs);
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (d, s, envs, next) = (
                t.deliverer.clone(),
                t.sink.clone(),
                envs.clone(),
                next.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(env) = envs.get(i) else { return };
                    check(&d.attempt(&s, env, Duration::from_secs(60)).await);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("send");
    }
}
