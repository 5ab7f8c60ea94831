//! What a store has been asked to read since it was opened ([`StoreStats`]): scans and seeks
//! per family, point reads per column family, so tests can prove which families a code path
//! touches.

use std::sync::atomic::AtomicU64;

use ankusa_keyspace::{Cf, Family};

/// Every family: those of format 3 and the two format 2 ones only the migration reads
/// (a family added to [`Family::FORMAT3`] gets its slot without an edit here).
pub(crate) const N_FAMILIES: usize = Family::FORMAT3.len() + 2;

/// Read counters, for tests and diagnostics: which families were scanned and how many
/// point reads each column family served since open.
#[derive(Debug, Default)]
pub struct StoreStats {
    pub(crate) scans: [AtomicU64; N_FAMILIES],
    pub(crate) seeks: [AtomicU64; N_FAMILIES],
    pub(crate) point_reads: [AtomicU64; 9],
}

/// A snapshot of [`StoreStats`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    pub scans: Vec<(Family, u64)>,
    /// Single-row seeks ([`crate::Rows::first`]), counted apart from scans.
    pub seeks: Vec<(Family, u64)>,
    pub point_reads: Vec<(Cf, u64)>,
}

impl StatsSnapshot {
    pub fn scans_of(&self, family: Family) -> u64 {
        self.scans
            .iter()
            .find(|(f, _)| *f == family)
            .map_or(0, |(_, n)| *n)
    }
    pub fn seeks_of(&self, family: Family) -> u64 {
        self.seeks
            .iter()
            .find(|(f, _)| *f == family)
            .map_or(0, |(_, n)| *n)
    }
    pub fn point_reads_of(&self, cf: Cf) -> u64 {
        self.point_reads
            .iter()
            .find(|(c, _)| *c == cf)
            .map_or(0, |(_, n)| *n)
    }
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            scans: self
                .scans
                .iter()
                .map(|(f, n)| (*f, n - earlier.scans_of(*f)))
                .collect(),
            seeks: self
                .seeks
                .iter()
                .map(|(f, n)| (*f, n - earlier.seeks_of(*f)))
                .collect(),
            point_reads: self
                .point_reads
                .iter()
                .map(|(c, n)| (*c, n - earlier.point_reads_of(*c)))
                .collect(),
        }
    }
}

pub(crate) fn family_slot(f: Family) -> usize {
    f as usize
}

pub(crate) fn cf_slot(cf: Cf) -> usize {
    cf as usize
}

/// Every family a store of any supported format has, in slot order of the statistics.
pub(crate) fn every_family() -> impl Iterator<Item = Family> {
    Family::FORMAT3
        .iter()
        .chain([Family::DueV2, Family::InflightV2].iter())
        .copied()
}
