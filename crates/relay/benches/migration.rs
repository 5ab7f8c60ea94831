//! `cargo bench -p ankusa-relay --bench migration`: the 2 → 3 migration's rows/s over
//! format-2 stores of 10⁴, 10⁵ and 10⁶ queued rows across 1 000 tenants. PASS only if the
//! rate at 10⁶ is at least half the rate at 10⁴: each step seeks past the last moved key,
//! so the cost per row must not grow with the store (no quadratic re-scan of tombstones).
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::ops::ControlFlow;
use std::time::Instant;

use ankusa_keyspace::{AtMs, Seq, SinkIdx};
use ankusa_queue::formats::legacy::v2::{State, Writer};
use ankusa_records::Envelope;
use ankusa_store::migrate::{self, Outcome};
use ankusa_store::{OpenOptions, Store};

const TENANTS: u64 = 1_000;

fn build(path: &std::path::Path, rows: u64) {
    let w = Writer::create(path).expect("create");
    for n in 1..=rows {
        let env = Envelope::builder(format!("h{n}"), "bench")
            .tenant(Some(&format!("tenant-{}", n % TENANTS)))
            .received_at(AtMs(1_600_000_000_000 + n))
            .sinks(["s"])
            .body(vec![b'x'; 64])
            .build();
        // 70% due, 15% inflight, 10% dead, 5% due later; a third owe the archive.
        let state = match n % 20 {
            0..=13 => State::Due {
                at: AtMs(1_600_000_000_000 + n),
            },
            14..=16 => State::Inflight,
            17 | 18 => State::Dead {
                at: AtMs(1_650_000_000_000 + n),
            },
            _ => State::Due {
                at: AtMs(4_000_000_000_000 + n),
            },
        };
        w.hook(Seq(n), Some(&env), 128, &[(SinkIdx(0), state)], n % 3 == 0)
            .expect("write");
    }
    w.store.flush().expect("flush");
}

fn main() -> std::process::ExitCode {
    let mut results = Vec::new();
    for rows in [10_000u64, 100_000, 1_000_000] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let t = Instant::now();
        build(&path, rows);
        let built = t.elapsed();
        let store = Store::open(&path, &OpenOptions::default()).expect("open");
        let t = Instant::now();
        let out = migrate::run(&store, &ankusa_queue::formats::builtin(), 3, |_| {
            ControlFlow::Continue(())
        })
        .expect("migrate");
        let secs = t.elapsed().as_secs_f64();
        let Outcome::Done {
            steps, rows: moved, ..
        } = out
        else {
            panic!("the migration did not finish")
        };
        eprintln!(
            "migration: {rows} rows built in {:.1}s, migrated in {secs:.2}s",
            built.as_secs_f64()
        );
        results.push((rows, moved, steps, secs, moved as f64 / secs));
    }
    println!("\nmigration 2 -> 3 — {TENANTS} tenants, 500 rows per synced step");
    println!("| queued rows | rows moved | steps | seconds | rows/s |");
    println!("|---:|---:|---:|---:|---:|");
    for (rows, moved, steps, secs, rate) in &results {
        println!("| {rows} | {moved} | {steps} | {secs:.2} | {rate:.0} |");
    }
    let ratio = results[2].4 / results[0].4;
    println!("\nrows/s at 10^6 / rows/s at 10^4 = {ratio:.2} (pass: >= 0.5)");
    if ratio >= 0.5 {
        println!("migration: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("migration: FAIL");
        std::process::ExitCode::FAILURE
    }
}
