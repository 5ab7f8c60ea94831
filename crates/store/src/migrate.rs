//! Store-format migrations: a registry of `{from, to, migration}` and the runner.
//!
//! # Protocol
//! - A migration is a sequence of steps. `step(cursor)` reads at most [`MAX_STEP_ROWS`]
//!   rows from where `cursor` points and returns the ops that move them plus the next
//!   cursor (`None` when it is finished).
//! - The runner commits each step's ops together with the new cursor in `m:migrating:N`
//!   (N = the target format) in ONE synced batch. A process killed at any point has either
//!   committed a step with its cursor or neither, so on the next boot the runner resumes
//!   from the cursor and never re-applies a committed step.
//! - The final step's batch deletes `m:migrating:N` and stamps `m:format = N`.
//! - The first step's batch also carries the migration's `prepare` ops (the sentinels of
//!   the families it creates), so set-up and the first moved rows land together.
//! - Migrations are forward-only: nothing here ever lowers a format.

use std::ops::ControlFlow;
use std::sync::Arc;

use super::{Cf, Op, Rows, Store, StoreError};

/// The most rows a step may move.
pub const MAX_STEP_ROWS: usize = 500;

/// What one step returns.
#[derive(Debug, Default)]
pub struct Step {
    pub ops: Vec<Op>,
    /// Where the next step starts; `None` when the migration is complete.
    pub next: Option<Vec<u8>>,
    /// Rows this step moved (for progress).
    pub rows: u64,
}

/// One format change.
pub trait Migration: Send + Sync {
    fn from(&self) -> u32;
    fn to(&self) -> u32;
    /// One line for `store migrate --dry-run`.
    fn description(&self) -> &'static str;
    /// Ops committed with the first step: sentinels of the families this migration creates.
    fn prepare(&self, _store: &Store) -> Result<Vec<Op>, StoreError> {
        Ok(Vec::new())
    }
    /// Moves at most [`MAX_STEP_ROWS`] rows starting at `cursor` (empty at the start).
    fn step(&self, store: &Store, cursor: &[u8]) -> Result<Step, StoreError>;
}

/// The chain of known migrations.
#[derive(Clone, Default)]
pub struct Registry {
    migrations: Vec<Arc<dyn Migration>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.migrations.iter().map(|m| (m.from(), m.to())))
            .finish()
    }
}

impl Registry {
    pub fn new() -> Self {
        Registry::default()
    }

    pub fn register(mut self, m: Arc<dyn Migration>) -> Self {
        self.migrations.push(m);
        self
    }

    /// The migrations that take a store from `from` to `to`, in order.
    pub fn plan(&self, from: u32, to: u32) -> Result<Vec<Arc<dyn Migration>>, StoreError> {
        let mut at = from;
        let mut chain = Vec::new();
        while at < to {
            let m = self
                .migrations
                .iter()
                .find(|m| m.from() == at && m.to() > at && m.to() <= to)
                .ok_or(StoreError::NoMigrationPath { from: at, to })?;
            at = m.to();
            chain.push(m.clone());
        }
        Ok(chain)
    }
}

/// Progress reported after every committed step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub from: u32,
    pub to: u32,
    /// Steps committed by this run.
    pub steps: u64,
    /// Rows moved by this run.
    pub rows: u64,
    /// True when this step finished the migration to `to`.
    pub finished: bool,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The store is at the target format.
    Done { format: u32, steps: u64, rows: u64 },
    /// The callback asked to stop; the store resumes from its cursor next time.
    Stopped { format: u32, steps: u64 },
}

/// A pending migration, as `store migrate --dry-run` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub from: u32,
    pub to: u32,
    pub description: &'static str,
    /// True if a previous run left `m:migrating:to` (it will resume from its cursor).
    pub resuming: bool,
}

impl std::fmt::Display for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} -> {}: {}", self.from, self.to, self.description)?;
        if self.resuming {
            write!(f, " (interrupted; resumes from its cursor)")?;
        }
        Ok(())
    }
}

/// The unfinished migration marker, if any: `(to, cursor)`.
pub fn in_progress(store: &Store) -> Result<Option<(u32, Vec<u8>)>, StoreError> {
    let (lo, end) = super::Family::Meta.bounds();
    for kv in store.scan(super::Family::Meta, &lo, &end, super::Dir::Forward)? {
        let (k, v) = kv?;
        if let Some(to) = ankusa_keyspace::decode_meta_migrating(&k) {
            return Ok(Some((to, v)));
        }
    }
    Ok(None)
}

/// What a run to `target` would do, without doing it.
pub fn pending(
    store: &Store,
    registry: &Registry,
    target: u32,
) -> Result<Vec<Pending>, StoreError> {
    let format = store.format()?;
    let marker = in_progress(store)?;
    Ok(registry
        .plan(format, target)?
        .iter()
        .map(|m| Pending {
            from: m.from(),
            to: m.to(),
            description: m.description(),
            resuming: marker.as_ref().is_some_and(|(to, _)| *to == m.to()),
        })
        .collect())
}

/// Runs every pending migration up to `target`. `on_step` sees each committed step and
/// may stop the run between steps (`ControlFlow::Break`), as a crash would.
pub fn run(
    store: &Store,
    registry: &Registry,
    target: u32,
    mut on_step: impl FnMut(&Progress) -> ControlFlow<()>,
) -> Result<Outcome, StoreError> {
    let mut steps = 0u64;
    let mut rows = 0u64;
    loop {
        let format = store.format()?;
        if format >= target {
            store.ensure_added_families()?;
            return Ok(Outcome::Done {
                format,
                steps,
                rows,
            });
        }
        let chain = registry.plan(format, target)?;
        let m = &chain[0];
        let marker = ankusa_keyspace::meta_migrating(m.to());
        let cursor = store.get(Cf::Default, &marker)?;
        let mut ops = match cursor {
            None => m.prepare(store)?,
            Some(_) => Vec::new(),
        };
        let step = m
            .step(store, cursor.as_deref().unwrap_or_default())
            .map_err(|e| StoreError::Migration {
                from: m.from(),
                to: m.to(),
                step: steps,
                detail: e.to_string(),
            })?;
        let finished = step.next.is_none();
        ops.extend(step.ops);
        match step.next {
            Some(next) => ops.push(Op::put(Cf::Default, marker, next)),
            None => {
                // The format file first, so that it is never below the stamp.
                store.record_format(m.to())?;
                ops.push(Op::delete(Cf::Default, marker));
                ops.push(Op::put(
                    Cf::Default,
                    ankusa_keyspace::META_FORMAT.to_vec(),
                    m.to().to_be_bytes(),
                ));
            }
        }
        store.write(ops, true)?;
        steps += 1;
        rows += step.rows;
        let progress = Progress {
            from: m.from(),
            to: m.to(),
            steps,
            rows,
            finished,
        };
        if on_step(&progress).is_break() {
            return Ok(Outcome::Stopped {
                format: store.format()?,
                steps,
            });
        }
    }
}
