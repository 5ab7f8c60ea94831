//! Shared harness of the tick benches (docs/performance.md, `dispatch_tick` and `gauges`): builds stores along two axes,
//! runs 3 000 merging batches per second against the store while it measures, and applies
//! the pass rule.
//!
//! Cells: 10³, 10⁴, 10⁵ and 10⁶ queued rows (1 000 tenants), and 10, 10³ and 10⁵ tenants
//! (10⁵ rows); in every cell 8 tenants have rows due now and the others' rows are due an
//! hour ahead or dead. A cell's figure is the 10th percentile of 1 000 ticks, the lowest of
//! three rounds. PASS only if the slowest cell is within 2× of the fastest (counted as at
//! least 1 ms) and under 50 ms, with the merge load at ≥ 90% of 3 000 batches/s throughout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ankusa_keyspace::{AtMs, CounterField, TenantOrd};
use ankusa_queue::deliveries::{self, Tx};
use ankusa_queue::writer::Assembler;
use ankusa_queue::{counters, Delta};
use ankusa_records::Envelope;
use ankusa_store::{OpenOptions, Rows, Store};

pub const NOW: u64 = 1_800_000_000_000;
pub const ACTIVE: u64 = 8;
const ROWS_PER_ACTIVE: u64 = 32;
const MERGE_RATE: u64 = 3_000;
const TICKS: usize = 1_000;
const ROUNDS: usize = 3;

pub struct Cell {
    pub label: String,
    pub rows: u64,
    pub tenants: u64,
}

pub fn cells() -> Vec<Cell> {
    let mut v = Vec::new();
    for rows in [1_000u64, 10_000, 100_000, 1_000_000] {
        v.push(Cell {
            label: format!("rows={rows}"),
            rows,
            tenants: 1_000,
        });
    }
    for tenants in [10u64, 1_000, 100_000] {
        v.push(Cell {
            label: format!("tenants={tenants}"),
            rows: 100_000,
            tenants,
        });
    }
    v
}

fn envelope(tenant: u64, at: u64, n: u64) -> Envelope {
    Envelope::builder(format!("hk_{n}"), "bench")
        .tenant(Some(&format!("tenant-{tenant}")))
        .received_at(AtMs(at))
        .sinks(["sink"])
        .build()
}

/// A store with `rows` queued rows over `tenants` tenants, 8 of them with rows due now.
pub fn build(cell: &Cell, dir: &std::path::Path) -> Store {
    let store = Store::open(dir, &OpenOptions::default()).expect("open store");
    let mut asm = Assembler::open(&store, 1_000_000).expect("assembler");
    let mut batch = Vec::with_capacity(1_000);
    let flush = |batch: &mut Vec<Envelope>, asm: &mut Assembler| {
        let b = asm.assemble(&store, batch, false).expect("assemble");
        asm.commit(&store, b, false).expect("commit");
        batch.clear();
    };
    let active_rows = ACTIVE * ROWS_PER_ACTIVE;
    for n in 0..cell.rows {
        let env = if n < active_rows {
            // Tenants 0..8 are the active ones: rows due over the last 30 seconds.
            envelope(n % ACTIVE, NOW - 30_000 + n * 100, n)
        } else {
            // Every tenant has at least one row; the rest spread over all tenants. They
            // are due an hour (or more) ahead.
            let t = ACTIVE + (n - active_rows) % (cell.tenants - ACTIVE).max(1);
            envelope(t, NOW + 3_600_000 + n, n)
        };
        batch.push(env);
        if batch.len() == 1_000 {
            flush(&mut batch, &mut asm);
        }
    }
    if !batch.is_empty() {
        flush(&mut batch, &mut asm);
    }
    // A tenth of the inactive rows are dead: claimed and dead-lettered.
    let mut tx = Tx::new();
    let mut moved = 0;
    for t in (ACTIVE..cell.tenants).step_by(10) {
        // With fewer rows than tenants, not every tenant has one.
        let Some(ord) = ankusa_queue::tenants::ord(&store, &format!("tenant-{t}")).expect("read")
        else {
            continue;
        };
        if let Some(r) = deliveries::first_due(&store, ord).expect("first_due") {
            let f = deliveries::claim(&mut tx, &r);
            deliveries::dead_letter(&mut tx, &f, AtMs(NOW - 1), "bench", "hk", "s", None);
            moved += 1;
            if moved % 1_000 == 0 {
                std::mem::take(&mut tx)
                    .commit(&store, false)
                    .expect("commit");
            }
        }
    }
    tx.commit(&store, false).expect("commit");
    store.flush().expect("flush");
    store
}

/// 3 000 merging batches per second, until stopped.
pub struct MergeLoad {
    stop: Arc<AtomicBool>,
    batches: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl MergeLoad {
    pub fn start(store: Arc<Store>, tenants: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let batches = Arc::new(AtomicU64::new(0));
        let (s, b) = (stop.clone(), batches.clone());
        let handle = std::thread::spawn(move || {
            let period = Duration::from_nanos(1_000_000_000 / MERGE_RATE);
            let start = Instant::now();
            let mut i: u64 = 0;
            while !s.load(Ordering::Relaxed) {
                let ord = TenantOrd(1 + (i.wrapping_mul(2_654_435_761) % tenants) as u32);
                let d = if i.is_multiple_of(2) { 1 } else { -1 };
                let ops = counters::ops(&[
                    Delta::new(ord, CounterField::Bytes, 100 * d),
                    Delta::new(ord, CounterField::Scheduled, d),
                ]);
                store.write(ops, false).expect("merge batch");
                i += 1;
                b.store(i, Ordering::Relaxed);
                let due = start + period * (i as u32);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
            }
        });
        MergeLoad {
            stop,
            batches,
            handle: Some(handle),
        }
    }

    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }
}

impl Drop for MergeLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn p10(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 10]
}

pub struct Measured {
    pub label: String,
    pub p10: Duration,
    pub merge_rate: f64,
}

/// Builds every cell, measures `tick` in each under the merge load, prints the table and
/// applies the pass rule. Returns the process exit code.
pub fn run(name: &str, tick: impl Fn(&Store, AtMs)) -> std::process::ExitCode {
    let mut results = Vec::new();
    for cell in cells() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t0 = Instant::now();
        let store = Arc::new(build(&cell, dir.path()));
        let built = t0.elapsed();
        let load = MergeLoad::start(store.clone(), cell.tenants);
        for _ in 0..100 {
            tick(&store, AtMs(NOW));
        }
        let started = Instant::now();
        let b0 = load.batches();
        let mut best = Duration::MAX;
        for _ in 0..ROUNDS {
            let mut samples = Vec::with_capacity(TICKS);
            for _ in 0..TICKS {
                let t = Instant::now();
                tick(&store, AtMs(NOW));
                samples.push(t.elapsed());
            }
            best = best.min(p10(samples));
        }
        let merge_rate = (load.batches() - b0) as f64 / started.elapsed().as_secs_f64();
        drop(load);
        eprintln!(
            "{name}: {:<16} built in {:>6.1}s, p10 {:>8.3} ms, merges {:>6.0}/s",
            cell.label,
            built.as_secs_f64(),
            best.as_secs_f64() * 1e3,
            merge_rate
        );
        results.push(Measured {
            label: cell.label,
            p10: best,
            merge_rate,
        });
    }
    report(name, &results)
}

fn report(name: &str, results: &[Measured]) -> std::process::ExitCode {
    let fastest = results.iter().map(|r| r.p10).min().unwrap_or_default();
    let slowest = results.iter().map(|r| r.p10).max().unwrap_or_default();
    let floor = fastest.max(Duration::from_millis(1));
    println!("\n{name} — p10 of {TICKS} ticks, lowest of {ROUNDS} rounds, {MERGE_RATE} merging batches/s");
    println!("| cell | p10 (ms) | ratio to fastest | merges/s |");
    println!("|---|---:|---:|---:|");
    for r in results {
        println!(
            "| {} | {:.3} | {:.2} | {:.0} |",
            r.label,
            r.p10.as_secs_f64() * 1e3,
            r.p10.as_secs_f64() / fastest.as_secs_f64(),
            r.merge_rate
        );
    }
    let ratio_ok = slowest <= floor * 2;
    let abs_ok = slowest < Duration::from_millis(50);
    let load_ok = results
        .iter()
        .all(|r| r.merge_rate >= MERGE_RATE as f64 * 0.9);
    println!(
        "\nslowest {:.3} ms, fastest {:.3} ms (floor {:.3} ms): within 2x {}, under 50 ms {}, merge load held {}",
        slowest.as_secs_f64() * 1e3,
        fastest.as_secs_f64() * 1e3,
        floor.as_secs_f64() * 1e3,
        ratio_ok,
        abs_ok,
        load_ok
    );
    if ratio_ok && abs_ok && load_ok {
        println!("{name}: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("{name}: FAIL");
        std::process::ExitCode::FAILURE
    }
}
