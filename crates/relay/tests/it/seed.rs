//! Stores seeded through the library, shared by the integration tests and the benches
//! (which include this file with `#[path]`).

use std::path::Path;

use ankusa_keyspace::{AtMs, Family};
use ankusa_queue::deliveries::{self, Tx};
use ankusa_queue::writer::Assembler;
use ankusa_records::Envelope;
use ankusa_store::{OpenOptions, Rows, Store};

/// A format-3 store at `dir` holding `rows` dead rows (one sink, `s`, each) over `tenants`
/// tenants (`tenant-0`, …) from `source`, bodies of `body` bytes, dead-lettered a minute
/// ago; closed again.
pub fn store_with_dead(dir: &Path, rows: u64, tenants: u64, source: &str, body: usize) {
    let store = Store::open(dir, &OpenOptions::default()).expect("open");
    let mut asm = Assembler::open(&store, 1_000_000).expect("assembler");
    let now = ankusa_keyspace::now_ms();
    let mut n = 0;
    while n < rows {
        let envs: Vec<Envelope> = (n..(n + 1_000).min(rows))
            .map(|i| {
                Envelope::builder(format!("hk_{i}"), source)
                    .tenant(Some(&format!("tenant-{}", i % tenants)))
                    .received_at(AtMs(now - 120_000))
                    .sinks(["s"])
                    .body(vec![b'x'; body])
                    .build()
            })
            .collect();
        let b = asm.assemble(&store, &envs, false).expect("assemble");
        asm.commit(&store, b, false).expect("commit");
        n += envs.len() as u64;
    }
    loop {
        let due: Vec<deliveries::DueRow> = store
            .scan_family(Family::Due)
            .expect("scan")
            .take(5_000)
            .map(|kv| {
                let (k, v) = kv.expect("row");
                deliveries::DueRow::decode(&k, &v).expect("due row")
            })
            .collect();
        if due.is_empty() {
            break;
        }
        let mut tx = Tx::new();
        for r in &due {
            let inflight = deliveries::claim(&mut tx, r);
            deliveries::dead_letter(
                &mut tx,
                &inflight,
                AtMs(now - 60_000),
                "it",
                "hk",
                "s",
                None,
            );
        }
        tx.commit(&store, false).expect("dead-letter");
    }
    store.sync_wal().expect("sync");
}
