//! What the dispatch tick parked for pull sinks, in memory: per sink, the tenants with
//! rows waiting and where each one's oldest unclaimed row may be, and a wake-up for the
//! claims waiting on it.
//!
//! Claimed rows leave tombstones in front of the waiting ones until compaction drops them;
//! a claim that sought from a tenant's start, or walked the index to find the next tenant
//! with rows, would step over every one of them. So the tick, the one writer of parked
//! rows, tells this index each row it parks; a claim visits only the tenants listed and
//! reads each from its floor (the key of the last row it claimed there, lowered again by
//! any row parked below it). It is a hint: the store is the truth, a boot fills the index
//! from the store, and the gateway rebuilds it from the store every
//! [`PullWake::RESCAN`] so nothing a lost hint hides waits longer.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use ankusa_keyspace::{AtMs, DueKey, Seq, SinkIdx, TenantOrd};

/// Where a tenant's scan starts: the key fields of a parked row (`None`: the tenant's
/// first row).
pub type Floor = Option<(AtMs, Seq, SinkIdx)>;

#[derive(Debug, Default)]
struct Sink {
    notify: Arc<tokio::sync::Notify>,
    tenants: BTreeMap<TenantOrd, Listed>,
}

/// A listed tenant: its floor, and a count of the parks that touched it (a claim moves the
/// floor only if no park came between its read and its update).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Listed {
    floor: Floor,
    parks: u64,
}

/// A listed tenant as a claim reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Visit {
    pub ord: TenantOrd,
    pub floor: Floor,
    parks: u64,
}

/// The parked rows' index and wake-ups of every pull sink.
#[derive(Debug, Default)]
pub struct PullWake {
    by_sink: Mutex<HashMap<String, Sink>>,
}

impl PullWake {
    /// How often the gateway rebuilds the index from the store.
    pub const RESCAN: std::time::Duration = std::time::Duration::from_secs(10);
    /// The most sinks indexed (pull sink ids are configured; a claim of another sink is
    /// refused before it gets here).
    const CAPACITY: usize = 4_096;

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sink>> {
        self.by_sink.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sink<'a>(m: &'a mut HashMap<String, Sink>, sink: &str) -> &'a mut Sink {
        if m.len() >= Self::CAPACITY && !m.contains_key(sink) {
            m.clear();
        }
        m.entry(sink.to_owned()).or_default()
    }

    /// The wake-up of claims waiting on `sink`.
    pub fn of(&self, sink: &str) -> Arc<tokio::sync::Notify> {
        Self::sink(&mut self.lock(), sink).notify.clone()
    }

    /// Rows (their due keys) were parked for `sink`: their tenants are listed, each floor
    /// lowered to the lowest of them, and the claims waiting wake.
    pub fn parked(&self, sink: &str, rows: &[DueKey]) {
        let mut m = self.lock();
        let s = Self::sink(&mut m, sink);
        for k in rows {
            let key = (k.at, k.seq, k.sink);
            let l = s.tenants.entry(k.ord).or_insert(Listed {
                floor: Some(key),
                parks: 0,
            });
            l.parks += 1;
            if l.floor.is_some_and(|f| key < f) {
                l.floor = Some(key);
            }
        }
        s.notify.notify_waiters();
    }

    /// Lists those of `tenants` not listed for `sink`, from their first row (a boot, a
    /// rescan); a listed tenant keeps its floor (every park lowers it as it lands).
    pub fn listed(&self, sink: &str, tenants: impl IntoIterator<Item = TenantOrd>) {
        let mut m = self.lock();
        let s = Self::sink(&mut m, sink);
        for t in tenants {
            s.tenants.entry(t).or_insert(Listed {
                floor: None,
                parks: 0,
            });
        }
    }

    /// Up to `n` listed tenants of `sink` from `from` on, wrapping around once; or, with
    /// `only`, those of them that are listed.
    pub fn tenants(
        &self,
        sink: &str,
        from: TenantOrd,
        n: usize,
        only: Option<&[TenantOrd]>,
    ) -> Vec<Visit> {
        let mut m = self.lock();
        let s = Self::sink(&mut m, sink);
        let visit = |(ord, l): (&TenantOrd, &Listed)| Visit {
            ord: *ord,
            floor: l.floor,
            parks: l.parks,
        };
        match only {
            Some(ords) => ords
                .iter()
                .filter_map(|o| s.tenants.get_key_value(o).map(visit))
                .take(n)
                .collect(),
            None => s
                .tenants
                .range(from..)
                .chain(s.tenants.range(..from))
                .take(n)
                .map(visit)
                .collect(),
        }
    }

    /// A claim read tenant `v` of `sink` from its floor and claimed up to `last` (or found
    /// nothing there: `None`). If no park touched the tenant since the read, the floor
    /// moves up to `last`, or the tenant is unlisted; otherwise the index stays as the park
    /// left it (a few tombstones more to step over, never a row missed).
    pub fn claimed(&self, sink: &str, v: Visit, last: Floor) {
        let mut m = self.lock();
        let s = Self::sink(&mut m, sink);
        let Some(l) = s.tenants.get_mut(&v.ord) else {
            return;
        };
        if l.parks != v.parks {
            return;
        }
        match last {
            Some(k) => l.floor = Some(k),
            None => {
                s.tenants.remove(&v.ord);
            }
        }
    }

    /// Tenants listed for `sink` (a gauge, tests).
    pub fn listed_count(&self, sink: &str) -> usize {
        self.lock().get(sink).map_or(0, |s| s.tenants.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ord: u32, at: u64, seq: u64) -> DueKey {
        DueKey {
            ord: TenantOrd(ord),
            at: AtMs(at),
            seq: Seq(seq),
            sink: SinkIdx(0),
        }
    }

    #[test]
    fn parks_list_tenants_at_their_lowest_row_and_claims_move_the_floor_up() {
        let w = PullWake::default();
        w.parked("q", &[key(1, 10, 5), key(1, 5, 9), key(2, 7, 1)]);
        let t = w.tenants("q", TenantOrd(0), 10, None);
        let floors: Vec<(u32, Floor)> = t.iter().map(|v| (v.ord.0, v.floor)).collect();
        assert_eq!(
            floors,
            vec![
                (1, Some((AtMs(5), Seq(9), SinkIdx(0)))),
                (2, Some((AtMs(7), Seq(1), SinkIdx(0))))
            ]
        );
        // A claim of tenant 1 up to (10, 5): the floor moves there.
        w.claimed("q", t[0], Some((AtMs(10), Seq(5), SinkIdx(0))));
        let t1 = w.tenants("q", TenantOrd(1), 1, None)[0];
        assert_eq!(t1.floor, Some((AtMs(10), Seq(5), SinkIdx(0))));
        // A park between a claim's read and its update: the update changes nothing.
        w.parked("q", &[key(1, 3, 2)]);
        w.claimed("q", t1, None);
        assert_eq!(
            w.tenants("q", TenantOrd(1), 1, None)[0].floor,
            Some((AtMs(3), Seq(2), SinkIdx(0)))
        );
        // Found empty from its floor, no park since: unlisted.
        w.claimed("q", t[1], None);
        assert_eq!(w.listed_count("q"), 1);
        // The round robin wraps around from `from`.
        w.parked("q", &[key(5, 1, 1), key(9, 1, 1)]);
        let order: Vec<u32> = w
            .tenants("q", TenantOrd(6), 10, None)
            .iter()
            .map(|v| v.ord.0)
            .collect();
        assert_eq!(order, vec![9, 1, 5]);
    }
}
