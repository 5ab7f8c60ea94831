//! Test support shared by the queue, dispatch and metrics unit tests: a store with the
//! writer's assembler, and the invariant checks every test wants. Built for this crate's
//! tests and, with the `test-support` feature, for the node crate's; a failure in it is a
//! failed test, so it panics rather than returning errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;

use super::deliveries::{DeadRow, DueRow, InflightRow, Tx};
use super::writer::Assembler;
use super::{deliveries, fold, QueueError};
use ankusa_keyspace::Cf;
use ankusa_keyspace::{AtMs, Bucket, Family, Seq, TenantOrd};
use ankusa_records::Envelope;
use ankusa_store::{OpenOptions, Rows, Store};

/// A store and the writer's assembler.
pub struct Harness {
    _dir: tempfile::TempDir,
    pub store: Arc<Store>,
    pub asm: Assembler,
    hooks: u64,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    pub fn new() -> Self {
        Self::with_max(1_000_000)
    }

    pub fn with_max(max: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("db"), &OpenOptions::default()).unwrap();
        let asm = Assembler::open(&store, max).unwrap();
        Harness {
            _dir: dir,
            store: Arc::new(store),
            asm,
            hooks: 0,
        }
    }

    /// A hook envelope for `tenant` (None = default) with `sinks` sinks, received at `at`.
    pub fn envelope(tenant: Option<&str>, sinks: usize, at: u64, n: u64) -> Envelope {
        Envelope::builder(format!("hk_{n}"), "src")
            .tenant(tenant)
            .received_at(AtMs(at))
            .sinks((0..sinks).map(|i| format!("sink{i}")))
            .body(vec![b'x'; (n % 7) as usize * 10])
            .build()
    }

    /// Ingests one hook through the writer's assembler, due at `at`.
    pub fn ingest(&mut self, tenant: Option<&str>, sinks: usize, at: u64, archive: bool) -> Seq {
        self.try_ingest(tenant, sinks, at, archive).unwrap()
    }

    pub fn try_ingest(
        &mut self,
        tenant: Option<&str>,
        sinks: usize,
        at: u64,
        archive: bool,
    ) -> Result<Seq, QueueError> {
        self.hooks += 1;
        let env = Self::envelope(tenant, sinks, at, self.hooks);
        let batch = self.asm.assemble(&self.store, &[env], archive).unwrap();
        let mut out = self.asm.commit(&self.store, batch, false).unwrap();
        out.remove(0)
    }

    /// Ingests one hook whose deliveries to the sinks set in `started` (bit i: sink i)
    /// start at the commit, as the writer does while the pipeline has caught up: those
    /// rows are written inflight. Returns the seq and the rows started.
    pub fn ingest_started(
        &mut self,
        tenant: Option<&str>,
        sinks: usize,
        at: u64,
        archive: bool,
        started: u8,
    ) -> (Seq, Vec<InflightRow>) {
        self.hooks += 1;
        let env = Self::envelope(tenant, sinks, at, self.hooks);
        let starts = MaskStarts(started);
        let mut batch = self
            .asm
            .assemble_except(&self.store, &[env], archive, &[], Some(&starts))
            .unwrap();
        let rows: Vec<InflightRow> = batch.started.drain(..).map(|(_, r, _)| r).collect();
        let seq = self
            .asm
            .commit(&self.store, batch, false)
            .unwrap()
            .remove(0)
            .unwrap();
        (seq, rows)
    }

    pub fn ord(&self, tenant: &str) -> TenantOrd {
        super::tenants::ord(&self.store, tenant).unwrap().unwrap()
    }

    pub fn due_rows(&self) -> Vec<DueRow> {
        due_rows(&self.store)
    }

    pub fn inflight_rows(&self) -> Vec<InflightRow> {
        inflight_rows(&self.store)
    }

    pub fn dead_rows(&self) -> Vec<DeadRow> {
        dead_rows(&self.store)
    }

    pub fn markers(&self) -> BTreeSet<(Bucket, TenantOrd)> {
        self.store
            .scan_family(Family::Active)
            .unwrap()
            .map(|kv| ankusa_keyspace::decode_active(&kv.unwrap().0).unwrap())
            .collect()
    }

    /// Builds and commits one transaction.
    pub fn commit(&self, f: impl FnOnce(&mut Tx)) {
        let mut tx = Tx::new();
        f(&mut tx);
        tx.commit(&self.store, false).unwrap();
    }

    pub fn assert_counters_equal_fold(&self) {
        let mismatches = fold::verify(&self.store).unwrap();
        assert!(
            mismatches.is_empty(),
            "counters differ from the fold: {mismatches:#?}"
        );
    }

    /// No hook was reclaimed too early: every delivery row and archive obligation still
    /// has its hook.
    pub fn assert_every_need_has_its_hook(&self) {
        let mut needs: Vec<Seq> = Vec::new();
        for kv in self.store.scan_family(Family::Deliveries).unwrap() {
            needs.push(ankusa_keyspace::decode_delivery(&kv.unwrap().0).unwrap().0);
        }
        for kv in self.store.scan_family(Family::Archive).unwrap() {
            let (k, v) = kv.unwrap();
            needs.push(deliveries::ArchiveObligation::decode(&k, &v).unwrap().seq);
        }
        for seq in needs {
            assert!(
                self.store
                    .get(Cf::Hooks, &ankusa_keyspace::hook(seq))
                    .unwrap()
                    .is_some(),
                "hook {seq:?} is gone while a row or an obligation still needs it"
            );
        }
    }

    pub fn assert_every_due_row_has_its_marker(&self) {
        let markers = self.markers();
        for r in self.due_rows() {
            assert!(
                markers.contains(&(r.key.at.bucket(), r.key.ord)),
                "due row {r:?} has no marker"
            );
        }
    }
}

/// Every due row of `store` (tests read the families whole).
pub fn due_rows(store: &Store) -> Vec<DueRow> {
    store
        .scan_family(Family::Due)
        .unwrap()
        .map(|kv| {
            let (k, v) = kv.unwrap();
            DueRow::decode(&k, &v).unwrap()
        })
        .collect()
}

/// Every inflight row of `store`.
pub fn inflight_rows(store: &Store) -> Vec<InflightRow> {
    store
        .scan_family(Family::Inflight)
        .unwrap()
        .map(|kv| {
            let (k, v) = kv.unwrap();
            InflightRow::decode(&k, &v).unwrap()
        })
        .collect()
}

/// Every dead row of `store`, newest first.
pub fn dead_rows(store: &Store) -> Vec<DeadRow> {
    deliveries::dead_page(store, None, usize::MAX).unwrap().rows
}

/// A [`Starts`](super::writer::Starts) that starts the deliveries to the sinks whose bit is
/// set (sink i: bit i of the mask), with no slots behind them.
struct MaskStarts(u8);

impl super::writer::Starts for MaskStarts {
    fn try_start(&self, _: TenantOrd, _: &str, sink: &str) -> Option<super::writer::StartSlot> {
        let i: u32 = sink.strip_prefix("sink")?.parse().ok()?;
        (i < 8 && self.0 & (1 << i) != 0).then(|| super::writer::StartSlot(Box::new(())))
    }
    fn waiting(&self) {}
    fn started(&self, _: Vec<super::writer::Started>) {}
}

/// `r` failed as corruption of `family` (a row that does not decode is never skipped).
pub fn assert_corrupt<T: std::fmt::Debug>(r: Result<T, QueueError>, family: Family) {
    match r {
        Err(QueueError::Corrupt { family: f, .. }) if f == family => {}
        other => panic!("expected corruption of {family:?}, got {other:?}"),
    }
}

/// Every key of the store that belongs to tenant `tenant` (ordinal `ord`), described: one
/// whose key or value holds the tenant id (every family but the audit trail, which keeps
/// who erased it), one keyed by its ordinal, and one whose value names its ordinal (delivery
/// and dead rows, archive obligations and expiry keys). Its `?t` row may stay, empty (the
/// tombstone). A whole scan of every family: for tests.
pub fn keys_of_tenant(store: &Store, ord: TenantOrd, tenant: &str) -> Vec<String> {
    let name = tenant.as_bytes();
    let holds = |b: &[u8]| b.windows(name.len()).any(|w| w == name);
    let ord_at = |b: &[u8], at: usize| b.get(at..at + 4) == Some(&ord.0.to_be_bytes()[..]);
    let mut found = Vec::new();
    for family in Family::FORMAT3 {
        if family == Family::Audit {
            continue;
        }
        for kv in store.scan_family(family).unwrap() {
            let (k, v) = kv.unwrap();
            let mine = match family {
                Family::TenantNames => ord_at(&k, 1) && !v.is_empty(),
                Family::Due | Family::Inflight | Family::DeadByTenant => ord_at(&k, 1),
                Family::Active => ord_at(&k, 9),
                Family::ArchivedHooks => ord_at(&k, 1),
                Family::Counters => ord_at(&k, 0),
                Family::Deliveries => ord_at(&v, 1),
                Family::Dead => ord_at(&v, 1),
                Family::Archive => ord_at(&v, 4),
                Family::ArchiveExpiry => ord_at(&v, 0),
                _ => false,
            };
            if mine || holds(&k) || holds(&v) {
                found.push(format!(
                    "{}: {} = {}",
                    family.name(),
                    ankusa_keyspace::hex(&k),
                    ankusa_keyspace::hex(&v[..v.len().min(64)])
                ));
            }
        }
    }
    found
}
