//! `store inspect | migrate | verify | fixture`: a closed store, from the command line.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ankusa_keyspace::Family;
use ankusa_queue::engine::{migrate, OpenOptions, Store, SUPPORTED_FORMAT};
use ankusa_queue::{counters, fold, tenants};
use anyhow::Context;

pub(super) fn open_existing(data: &Path, read_only: bool) -> anyhow::Result<Store> {
    let opts = OpenOptions {
        create_if_missing: false,
        read_only,
        ..OpenOptions::default()
    };
    Store::open(data, &opts).with_context(|| format!("opening the store at {}", data.display()))
}

pub(super) fn inspect(data: &Path) -> anyhow::Result<ExitCode> {
    let store = open_existing(data, true)?;
    let format = store.format()?;
    println!("store:    {}", data.display());
    println!("format:   {format} (this binary supports {SUPPORTED_FORMAT})");
    match migrate::in_progress(&store)? {
        Some((to, cursor)) => println!(
            "migrating: to format {to}, cursor {} bytes (resumes on the next boot or `store migrate`)",
            cursor.len()
        ),
        None => println!("migrating: no"),
    }
    let cfs: Vec<&str> = store.column_families().iter().map(|c| c.name()).collect();
    println!("column families: {}", cfs.join(", "));
    println!("{:<18} {:<11} {:>12}", "family", "cf", "keys");
    for fam in Family::of_format(format) {
        let n = fold::rows_in(&store, *fam)?;
        println!("{:<18} {:<11} {:>12}", fam.name(), fam.cf().name(), n);
    }
    if format >= 3 {
        let c = counters::node(&store)?;
        println!("tenants:  {}", tenants::count(&store)?);
        println!(
            "node counters: pending={} scheduled={} inflight={} dead={} bytes={} archive_pending={}",
            c.pending, c.scheduled, c.inflight, c.dead, c.bytes, c.archive_pending
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn migrate_cmd(data: &Path, dry_run: bool) -> anyhow::Result<ExitCode> {
    let registry = ankusa_queue::formats::builtin();
    if dry_run {
        let store = open_existing(data, true)?;
        let pending = migrate::pending(&store, &registry, SUPPORTED_FORMAT)?;
        if pending.is_empty() {
            println!("store at format {}: no pending migrations", store.format()?);
        }
        for p in pending {
            println!("{p}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let store = open_existing(data, false)?;
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let started = std::time::Instant::now();
    let out = migrate::run(&store, &registry, SUPPORTED_FORMAT, |p| {
        let rate = p.rows as f64 / started.elapsed().as_secs_f64().max(1e-3);
        let line = format!(
            "{} -> {}: step {}, {} rows, {:.0} rows/s{}",
            p.from,
            p.to,
            p.steps,
            p.rows,
            rate,
            if p.finished { ", done" } else { "" }
        );
        if tty {
            // One line, rewritten in place.
            print!("\r\x1b[2K{line}");
            if p.finished {
                println!();
            }
        } else {
            println!("{line}");
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
        ControlFlow::Continue(())
    })?;
    match out {
        migrate::Outcome::Done {
            format,
            steps,
            rows,
        } => {
            println!("store at format {format} ({steps} steps, {rows} rows moved)")
        }
        migrate::Outcome::Stopped { format, steps } => {
            println!("stopped at format {format} after {steps} steps")
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn fixture(format: u32, out: &Path) -> anyhow::Result<ExitCode> {
    let dir = tempfile_dir()?;
    let data = dir.join("store");
    match format {
        2 => ankusa_queue::formats::fixture::write_v2(&data)?,
        _ => ankusa_queue::formats::fixture::write_v3(&data)?,
    }
    ankusa_queue::engine::tarball::pack(&data, out)?;
    let _ = std::fs::remove_dir_all(&dir);
    println!("wrote a format {format} fixture store to {}", out.display());
    Ok(ExitCode::SUCCESS)
}

pub(super) fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "ankusa-fixture-{}-{}",
        std::process::id(),
        ankusa_keyspace::now_ms()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

pub(super) fn verify(data: &Path) -> anyhow::Result<ExitCode> {
    let store = open_existing(data, true)?;
    let mismatches = fold::verify(&store)?;
    if mismatches.is_empty() {
        println!("counters equal a fold of the families");
        return Ok(ExitCode::SUCCESS);
    }
    for m in &mismatches {
        eprintln!(
            "ord {}: stored {:?} but the families fold to {:?}",
            m.ord.0, m.stored, m.folded
        );
    }
    Ok(ExitCode::FAILURE)
}
