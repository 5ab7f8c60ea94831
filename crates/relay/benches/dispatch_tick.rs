//! `cargo bench -p ankusa-relay --bench dispatch_tick`: the dispatch tick's read half
//! (`active_tenants` plus `due_for_tenant` for each) must not grow with the backlog or the
//! tenant count. See `common`.
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

mod common;

use ankusa_relay::dispatch::pipeline::plan::{plan_tick, Cursors, TickLimits};

fn main() -> std::process::ExitCode {
    let limits = TickLimits::default();
    let cursors = Cursors::default();
    common::run("dispatch_tick", |store, now| {
        let plan = plan_tick(store, now, &limits, &cursors).expect("tick");
        assert_eq!(plan.tenants_visited as u64, common::ACTIVE);
    })
}
