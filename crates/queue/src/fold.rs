//! The counters recomputed the slow way: a fold over the families they summarise.
//!
//! This is the oracle of the property and crash tests ("counters equal a fold of the
//! families") and of `ankusa-relay store verify`. It reads every due, waiting pull, inflight,
//! dead and archive row, so it never runs on a request path or a gauge tick.

use std::collections::BTreeMap;

use super::counters::{self, Counters};
use super::deliveries::{ArchiveObligation, DeadRow, DueRow, InflightRow, Kind, PulledRow};
use ankusa_keyspace::{CounterField, Family, TenantOrd};
use ankusa_store::{merge, Rows, Store};

use crate::QueueError;

/// Per-ordinal counts from the families; ord 0 holds the node total.
pub fn fold(store: &Store) -> Result<BTreeMap<TenantOrd, Counters>, QueueError> {
    let mut out: BTreeMap<TenantOrd, Counters> = BTreeMap::new();
    let mut add = |ord: TenantOrd, f: CounterField, d: i64| {
        out.entry(ord).or_default().add(f, d);
        out.entry(TenantOrd::AGGREGATE).or_default().add(f, d);
    };
    for kv in store.scan_family(Family::Due)? {
        let (k, v) = kv?;
        let r = DueRow::decode(&k, &v)?;
        let f = match r.kind {
            Kind::First => CounterField::Pending,
            Kind::Retry => CounterField::Scheduled,
        };
        add(r.key.ord, f, 1);
        add(r.key.ord, CounterField::Bytes, r.size as i64);
    }
    for kv in store.scan_family(Family::Pulled)? {
        let (k, v) = kv?;
        let r = PulledRow::decode(&k, &v)?;
        let f = match r.kind {
            Kind::First => CounterField::Pending,
            Kind::Retry => CounterField::Scheduled,
        };
        add(r.key.ord, f, 1);
        add(r.key.ord, CounterField::Bytes, r.size as i64);
    }
    for kv in store.scan_family(Family::Inflight)? {
        let (k, v) = kv?;
        let r = InflightRow::decode(&k, &v)?;
        add(r.key.ord, CounterField::Inflight, 1);
        add(r.key.ord, CounterField::Bytes, r.size as i64);
    }
    let mut by_tenant = 0i64;
    for kv in store.scan_family(Family::DeadByTenant)? {
        kv?;
        by_tenant += 1;
    }
    let mut dead = 0i64;
    for kv in store.scan_family(Family::Dead)? {
        let (k, v) = kv?;
        let r = DeadRow::decode(&k, &v)?;
        add(r.value.ord, CounterField::Dead, 1);
        add(r.value.ord, CounterField::Bytes, r.value.size as i64);
        dead += 1;
    }
    if dead != by_tenant {
        return Err(QueueError::corrupt(
            Family::DeadByTenant,
            format!("{dead} dead rows but {by_tenant} by-tenant rows"),
        ));
    }
    for kv in store.scan_family(Family::Archive)? {
        let (k, v) = kv?;
        let ob = ArchiveObligation::decode(&k, &v)?;
        add(ob.ord, CounterField::ArchivePending, 1);
    }
    Ok(out)
}

/// Every counter row as stored (zero rows included), per ordinal.
pub fn stored(store: &Store) -> Result<BTreeMap<TenantOrd, Counters>, QueueError> {
    let mut out: BTreeMap<TenantOrd, Counters> = BTreeMap::new();
    let (lo, end) = Family::Counters.bounds();
    for kv in store.scan(Family::Counters, &lo, &end, ankusa_store::Dir::Forward)? {
        let (k, v) = kv?;
        let (ord, field) = ankusa_keyspace::decode_counter(&k)?;
        let n = merge::decode(&v).ok_or_else(|| {
            QueueError::corrupt(
                Family::Counters,
                format!("undecodable value at {}", ankusa_keyspace::hex(&k)),
            )
        })?;
        out.entry(ord).or_default().add(field, n);
    }
    Ok(out)
}

/// A tenant whose stored counters differ from the fold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub ord: TenantOrd,
    pub stored: Counters,
    pub folded: Counters,
}

/// How many rows `family` holds (its sentinels left out): a scan of the whole family, for
/// `store inspect`.
pub fn rows_in(store: &Store, family: Family) -> Result<u64, QueueError> {
    Ok(store
        .scan_family(family)?
        .try_fold(0u64, |n, kv| kv.map(|_| n + 1))?)
}

/// Compares the stored counters with the fold; empty when they agree everywhere (a tenant
/// with all-zero counters and no rows agrees).
pub fn verify(store: &Store) -> Result<Vec<Mismatch>, QueueError> {
    let folded = fold(store)?;
    let stored = stored(store)?;
    let mut ords: Vec<TenantOrd> = folded.keys().chain(stored.keys()).copied().collect();
    ords.sort();
    ords.dedup();
    let mut out = Vec::new();
    for ord in ords {
        let f = folded.get(&ord).copied().unwrap_or_default();
        let s = stored.get(&ord).copied().unwrap_or_default();
        if f != s {
            out.push(Mismatch {
                ord,
                stored: s,
                folded: f,
            });
        }
    }
    // The scan above and the point read must agree too (the point read is what serves).
    let node = counters::node(store)?;
    if node
        != stored
            .get(&TenantOrd::AGGREGATE)
            .copied()
            .unwrap_or_default()
    {
        out.push(Mismatch {
            ord: TenantOrd::AGGREGATE,
            stored: node,
            folded: folded
                .get(&TenantOrd::AGGREGATE)
                .copied()
                .unwrap_or_default(),
        });
    }
    Ok(out)
}
