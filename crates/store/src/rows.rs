//! Rows: the atomic batches of [`Op`]s a store applies and the reads of its families by
//! key ([`Rows`]), and the bounded scans ([`Scan`]).
//!
//! The row API is a trait, not inherent methods of [`Store`], so that only a crate that
//! names it reaches rows: the queue crate, which owns every row change and every family
//! read. The node holds its store through `ankusa_queue::engine`, which re-exports the
//! handle, its options and its errors but neither this trait nor [`Op`]: a write or a read
//! by key in the node does not compile (docs/architecture.md).

use std::sync::atomic::Ordering;

use ankusa_keyspace::{Cf, Family};
use rocksdb::{Direction, IteratorMode, ReadOptions, WriteBatch, WriteOptions};

use crate::{cf_slot, family_slot, Store, StoreError};

/// One change in an atomic batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put {
        cf: Cf,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        cf: Cf,
        key: Vec<u8>,
    },
    /// Deletes `[from, to)`.
    DeleteRange {
        cf: Cf,
        from: Vec<u8>,
        to: Vec<u8>,
    },
    /// A merge operand (only `counters` has a merge operator).
    Merge {
        cf: Cf,
        key: Vec<u8>,
        operand: Vec<u8>,
    },
}

impl Op {
    pub fn put(cf: Cf, key: Vec<u8>, value: impl Into<Vec<u8>>) -> Op {
        Op::Put {
            cf,
            key,
            value: value.into(),
        }
    }
    pub fn delete(cf: Cf, key: Vec<u8>) -> Op {
        Op::Delete { cf, key }
    }
    pub fn cf(&self) -> Cf {
        match self {
            Op::Put { cf, .. }
            | Op::Delete { cf, .. }
            | Op::DeleteRange { cf, .. }
            | Op::Merge { cf, .. } => *cf,
        }
    }
    /// The key the op writes (the start of the range for `DeleteRange`).
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Put { key, .. } | Op::Delete { key, .. } | Op::Merge { key, .. } => key,
            Op::DeleteRange { from, .. } => from,
        }
    }
}

/// A raw key and value.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// Scan direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Forward,
    Reverse,
}

/// Writes and reads of rows by key: the queue's way into the store.
pub trait Rows {
    /// Applies `ops` as one atomic batch; `sync` waits for the WAL to reach the disk.
    ///
    /// An error does not say the batch is absent: a write whose WAL sync failed stays
    /// applied (and readable, and in the WAL a restart replays). A caller that hands out
    /// keys from memory reads them from the store again after a failure (the ingest
    /// writer's `Assembler`); a transition checks its rows under the lock anyway.
    fn write(&self, ops: Vec<Op>, sync: bool) -> Result<(), StoreError>;

    /// One point read.
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// Point reads of many keys of one column family in one call.
    fn multi_get(&self, cf: Cf, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError>;

    /// Scans `[from, to)` of `family` in `dir` order, skipping its sentinels.
    ///
    /// The iterator is bounded to exactly `[from, to)`; it ends cleanly when it runs out,
    /// unless the range reaches the family's end in scan direction: then it must meet the
    /// family's sentinel there, and running dry first is [`StoreError::Corruption`]. An
    /// iterator error is an error. `from`/`to` are clamped to the family.
    fn scan(
        &self,
        family: Family,
        from: &[u8],
        to: &[u8],
        dir: Dir,
    ) -> Result<Scan<'_>, StoreError>;

    /// The first row of `[from, to)` in `dir` order: one seek, counted as a seek rather
    /// than a scan in [`crate::StoreStats`].
    fn first(
        &self,
        family: Family,
        from: &[u8],
        to: &[u8],
        dir: Dir,
    ) -> Result<Option<KeyValue>, StoreError>;

    /// Every key/value of a family (sentinels excluded), in order.
    fn scan_family(&self, family: Family) -> Result<Scan<'_>, StoreError>;

    /// Every raw key/value of a column family, sentinels included (inspection and tests
    /// that compare whole stores).
    fn dump_cf(&self, cf: Cf) -> Result<Vec<KeyValue>, StoreError>;
}

impl Rows for Store {
    fn write(&self, ops: Vec<Op>, sync: bool) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::ReadOnly);
        }
        let mut batch = WriteBatch::default();
        for op in ops {
            let cf = self.handle(op.cf())?;
            match op {
                Op::Put { key, value, .. } => batch.put_cf(cf, key, value),
                Op::Delete { key, .. } => batch.delete_cf(cf, key),
                Op::DeleteRange { from, to, .. } => batch.delete_range_cf(cf, from, to),
                Op::Merge { key, operand, .. } => batch.merge_cf(cf, key, operand),
            }
        }
        // A synced write is written, then the WAL synced apart from the write queue: the
        // unsynced writes that arrive meanwhile (claims, outcomes) go on instead of
        // queueing behind the fsync. The batch is visible before it is durable, so what a
        // reader does with it before `write` returns may have to be done again after a
        // crash (at-least-once, as for any unsynced write); its caller acks only after.
        let written = self.db.write_opt(batch, &WriteOptions::default());
        let written = match written {
            Ok(()) if sync => self.db.flush_wal(true),
            other => other,
        };
        self.health_of(written)
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.stats.point_reads[cf_slot(cf)].fetch_add(1, Ordering::Relaxed);
        Ok(self.db.get_cf(self.handle(cf)?, key)?)
    }

    fn multi_get(&self, cf: Cf, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.stats.point_reads[cf_slot(cf)].fetch_add(keys.len() as u64, Ordering::Relaxed);
        let h = self.handle(cf)?;
        self.db
            .batched_multi_get_cf(h, keys, false)
            .into_iter()
            .map(|r| r.map(|v| v.map(|p| p.to_vec())).map_err(StoreError::from))
            .collect()
    }

    fn scan(
        &self,
        family: Family,
        from: &[u8],
        to: &[u8],
        dir: Dir,
    ) -> Result<Scan<'_>, StoreError> {
        self.stats.scans[family_slot(family)].fetch_add(1, Ordering::Relaxed);
        self.range(family, from, to, dir)
    }

    fn first(
        &self,
        family: Family,
        from: &[u8],
        to: &[u8],
        dir: Dir,
    ) -> Result<Option<KeyValue>, StoreError> {
        self.stats.seeks[family_slot(family)].fetch_add(1, Ordering::Relaxed);
        self.range(family, from, to, dir)?.next().transpose()
    }

    fn scan_family(&self, family: Family) -> Result<Scan<'_>, StoreError> {
        let (lo, end) = family.bounds();
        self.scan(family, &lo, &end, Dir::Forward)
    }

    fn dump_cf(&self, cf: Cf) -> Result<Vec<KeyValue>, StoreError> {
        let h = self.handle(cf)?;
        let mut out = Vec::new();
        for kv in self
            .db
            .iterator_cf(h, IteratorMode::From(&[], Direction::Forward))
        {
            let (k, v) = kv?;
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }
}

impl Store {
    fn range(
        &self,
        family: Family,
        from: &[u8],
        to: &[u8],
        dir: Dir,
    ) -> Result<Scan<'_>, StoreError> {
        let (lo, end) = family.bounds();
        let from = if from < lo.as_slice() {
            lo.clone()
        } else {
            from.to_vec()
        };
        let to = if to > end.as_slice() {
            end.clone()
        } else {
            to.to_vec()
        };
        // A range that reaches the family's end in scan direction holds the sentinel
        // there: a well-formed family yields it, a damaged one runs dry.
        let to_sentinel = match dir {
            Dir::Forward => to == end,
            Dir::Reverse => from == lo,
        };
        let mut ro = ReadOptions::default();
        // Exactly the range: nothing past it is read, tombstones included.
        ro.set_iterate_lower_bound(from.clone());
        ro.set_iterate_upper_bound(to.clone());
        let mut it = self.db.raw_iterator_cf_opt(self.handle(family.cf())?, ro);
        match dir {
            Dir::Forward => it.seek(&from),
            Dir::Reverse => {
                it.seek_for_prev(&to);
                if it.valid() && it.key().is_some_and(|k| k >= to.as_slice()) {
                    it.prev();
                }
            }
        }
        Ok(Scan {
            it,
            family,
            lo,
            hi: family.hi(),
            from,
            to,
            dir,
            to_sentinel,
            done: false,
        })
    }
}

/// The two sentinel puts of a family.
pub fn sentinel_ops(family: Family) -> [Op; 2] {
    [
        Op::put(family.cf(), family.lo(), Vec::new()),
        Op::put(family.cf(), family.hi(), Vec::new()),
    ]
}

/// A range scan; see [`Rows::scan`].
pub struct Scan<'a> {
    it: rocksdb::DBRawIterator<'a>,
    family: Family,
    lo: Vec<u8>,
    hi: Vec<u8>,
    from: Vec<u8>,
    to: Vec<u8>,
    dir: Dir,
    /// The range reaches the family's end in scan direction: its sentinel must be met.
    to_sentinel: bool,
    done: bool,
}

impl Iterator for Scan<'_> {
    type Item = Result<KeyValue, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        loop {
            if !self.it.valid() {
                self.done = true;
                if let Err(e) = self.it.status() {
                    return Some(Err(e.into()));
                }
                if !self.to_sentinel {
                    return None;
                }
                let which = match self.dir {
                    Dir::Forward => "hi",
                    Dir::Reverse => "lo",
                };
                return Some(Err(StoreError::corruption(
                    self.family,
                    format!("scan ended before the family's {which} sentinel"),
                )));
            }
            let key = self.it.key().unwrap_or_default();
            // The end of the range, or the sentinel at the end of the family in scan
            // direction: a clean end. The sentinel behind us is skipped.
            let (past, behind) = match self.dir {
                Dir::Forward => (
                    key >= self.to.as_slice() || key == self.hi.as_slice(),
                    self.lo.as_slice(),
                ),
                Dir::Reverse => (
                    key < self.from.as_slice() || key == self.lo.as_slice(),
                    self.hi.as_slice(),
                ),
            };
            if past {
                self.done = true;
                return None;
            }
            if key == behind {
                self.advance();
                continue;
            }
            let item = (key.to_vec(), self.it.value().unwrap_or_default().to_vec());
            self.advance();
            return Some(Ok(item));
        }
    }
}

impl Scan<'_> {
    fn advance(&mut self) {
        match self.dir {
            Dir::Forward => self.it.next(),
            Dir::Reverse => self.it.prev(),
        }
    }
}

/// Runs `f` and counts the deleted entries (tombstones) RocksDB's reads stepped over on
/// this thread while it ran: what tests and benches use to show a read path does not walk
/// what was deleted.
pub fn tombstones_walked<T>(f: impl FnOnce() -> T) -> (T, u64) {
    use rocksdb::perf::{set_perf_stats, PerfContext, PerfMetric, PerfStatsLevel};
    set_perf_stats(PerfStatsLevel::EnableCount);
    let mut ctx = PerfContext::default();
    ctx.reset();
    let out = f();
    let walked = ctx.metric(PerfMetric::InternalDeleteSkippedCount);
    set_perf_stats(PerfStatsLevel::Disable);
    (out, walked)
}
