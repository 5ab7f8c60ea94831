//! Fixture stores for upgrade tests and the `store fixture` command.
//!
//! Both formats hold the same story: four tenants — `default` (hooks naming no tenant),
//! `acme`, `globex`, and `deadonly` (only dead rows) — with pending, retrying, inflight and
//! dead deliveries and archive obligations. The format-2 fixture adds a hook that does not
//! decode and rows whose hook is missing (both file under `default` when migrated). Times
//! are fixed: "past" rows are due in 2023, "future" ones in 2096.

use std::path::Path;

use super::legacy::v2::{State, Writer};
use crate::deliveries::{self, Tx};
use crate::writer::Assembler;
use crate::QueueError;
use ankusa_keyspace::{AtMs, Seq, SinkIdx};
use ankusa_records::{DeliveryRow, Envelope};
use ankusa_store::{OpenOptions, Store};

/// Due long ago.
pub const PAST: u64 = 1_700_000_000_000;
/// Due far ahead.
pub const FUTURE: u64 = 4_000_000_000_000;

fn env(n: u64, tenant: Option<&str>, sinks: usize) -> Envelope {
    Envelope::builder(format!("fx_{n}"), "fixture")
        .tenant(tenant)
        .received_at(AtMs(PAST + n))
        .sinks((0..sinks).map(|i| format!("sink{i}")))
        .body(format!(r#"{{"fixture":{n}}}"#).into_bytes())
        .build()
}

/// Writes the format-2 fixture store at `dir`.
pub fn write_v2(dir: &Path) -> Result<(), QueueError> {
    let w = Writer::create(dir)?;
    let past = |n| State::Due { at: AtMs(PAST + n) };
    let future = |n| State::Due {
        at: AtMs(FUTURE + n),
    };
    let dead = |n| State::Dead {
        at: AtMs(PAST + 10_000 + n),
    };
    let hooks: Vec<(Option<&str>, Vec<State>, bool)> = vec![
        (Some("acme"), vec![past(1), future(1)], true),
        (Some("acme"), vec![State::Inflight, past(2)], false),
        (Some("acme"), vec![dead(3)], true),
        (Some("globex"), vec![past(4)], false),
        (Some("globex"), vec![dead(5), future(5)], false),
        (None, vec![past(6)], true),
        (None, vec![State::Inflight], false),
        (Some("deadonly"), vec![dead(8)], false),
        (Some("deadonly"), vec![dead(9), dead(10)], true),
    ];
    for (i, (tenant, states, archive)) in hooks.into_iter().enumerate() {
        let n = i as u64 + 1;
        let e = env(n, tenant, states.len());
        let size = e.encode().len() as u32;
        let rows: Vec<(SinkIdx, State)> = states
            .into_iter()
            .enumerate()
            .map(|(s, st)| (SinkIdx(s as u16), st))
            .collect();
        w.hook(Seq(n), Some(&e), size, &rows, archive)?;
    }
    // A hook that does not decode, and rows whose hook is gone.
    w.raw_hook(Seq(20), b"\xffnot an envelope".to_vec())?;
    w.hook(Seq(20), None, 16, &[(SinkIdx(0), past(20))], false)?;
    w.hook(
        Seq(21),
        None,
        32,
        &[(SinkIdx(0), past(21)), (SinkIdx(1), State::Inflight)],
        true,
    )?;
    Ok(w.store.flush()?)
}

/// Writes the format-3 fixture store at `dir`, through the writer and the transitions.
pub fn write_v3(dir: &Path) -> Result<(), QueueError> {
    let store = Store::open(dir, &OpenOptions::default())?;
    let mut asm = Assembler::open(&store, 1_000_000)?;
    let envs = vec![
        env(1, Some("acme"), 2),
        env(2, Some("acme"), 2),
        env(3, Some("acme"), 1),
        env(4, Some("globex"), 1),
        env(5, Some("globex"), 2),
        env(6, None, 1),
        env(7, None, 1),
        env(8, Some("deadonly"), 1),
        env(9, Some("deadonly"), 2),
    ];
    let batch = asm.assemble(&store, &envs, true)?;
    asm.commit(&store, batch, true)?;
    // seq n is env n: move some rows on.
    let due: Vec<_> = deliveries::due_rows(&store)?;
    let mut tx = Tx::new();
    for r in due {
        let (seq, sink) = (r.key.seq.0, r.key.sink.0);
        let inflight = match (seq, sink) {
            (1, 1) | (2, 0) | (3, 0) | (5, 0) | (7, 0) | (8, 0) | (9, _) => {
                deliveries::claim(&mut tx, &r)
            }
            _ => continue,
        };
        match seq {
            1 => {
                let row = DeliveryRow {
                    ord: r.key.ord,
                    size: r.size,
                    attempts: 1,
                    last_status: 503,
                    last_error: "HTTP 503".into(),
                    ..DeliveryRow::default()
                };
                deliveries::retry(&mut tx, &inflight, AtMs(FUTURE + seq), &row);
            }
            2 | 7 => {} // stays inflight, as a crash leaves it
            _ => {
                deliveries::dead_letter(
                    &mut tx,
                    &inflight,
                    AtMs(PAST + 10_000 + seq),
                    "fixture",
                    &format!("fx_{seq}"),
                    "",
                    None,
                );
            }
        }
    }
    tx.commit(&store, true)?;
    Ok(store.flush()?)
}
