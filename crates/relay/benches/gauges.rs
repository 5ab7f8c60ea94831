//! `cargo bench -p ankusa-relay --bench gauges`: the queue gauge tick (six counter reads of
//! ord 0, the oldest due age from the active index, the top tenants by pending from the
//! active sample) must not grow with the backlog or the tenant count. See `common`.
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

mod common;

fn main() -> std::process::ExitCode {
    common::run("gauges", |store, now| {
        let g = ankusa_relay::metrics::gauges::read(store, now).expect("gauge tick");
        assert_eq!(g.top_pending.len() as u64, common::ACTIVE);
    })
}
