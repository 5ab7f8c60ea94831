//! What the broker sinks' benches (`nats`, `kafka`) share: a drain's measure and the
//! report of their rounds — the relay, the transitions twin and the bare client alternated,
//! judged on the median round.

use std::time::{Duration, Instant};

/// A drain's deliveries per second and CPU per delivery: this process's and the broker's,
/// and this process's by thread name (µs per delivery).
#[derive(Debug, Clone)]
pub struct Drain {
    pub rate: f64,
    pub cpu_us: f64,
    pub broker_us: f64,
    pub by_thread: Vec<(String, f64)>,
}

/// Times `f`, which delivers `n` messages, with this process's CPU and the broker's
/// (process `pid`).
pub async fn measure<F: std::future::Future<Output = ()>>(n: u64, pid: u32, f: F) -> Drain {
    let threads = super::thread_cpu();
    let (started, cpu0, broker0) = (Instant::now(), super::cpu_time(), super::process_cpu(pid));
    f.await;
    let secs = started.elapsed().as_secs_f64();
    let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    Drain {
        rate: n as f64 / secs,
        cpu_us: per(super::cpu_time() - cpu0),
        broker_us: per(super::process_cpu(pid) - broker0),
        by_thread: super::cpu_by_thread(&threads, &super::thread_cpu())
            .into_iter()
            .map(|(name, cpu)| (name, per(cpu)))
            .filter(|(_, us)| *us >= 0.05)
            .collect(),
    }
}

/// Measures `node` draining its backlog of `backlog` hooks to sink `sink` (read off the
/// sink's own counter: encoding every metric to read one would be work of the node's
/// measured window that no delivery does), then stops it.
pub async fn node_drain(
    node: ankusa_relay::node::Node,
    sink: &str,
    backlog: u64,
    pid: u32,
) -> Drain {
    let meters = node.metrics.sink_meters(sink);
    let delivered = || {
        meters
            .attempt(ankusa_relay::metrics::AttemptLabel::Delivered)
            .get()
    };
    let before = delivered();
    let started = Instant::now();
    let d = measure(backlog - before, pid, async {
        while delivered() < backlog {
            assert!(
                started.elapsed() < Duration::from_secs(900),
                "the backlog never drained"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    node.shutdown().await.expect("shutdown");
    d
}

/// One round: the relay's drain, the twin's, the bare client's.
pub type Round = (Drain, Drain, Drain);

/// Prints the rounds' table (`title` above it), the threads of the median round and the
/// verdict of `bench`: PASS if the relay's CPU per delivery is at most `rule` × the twin's
/// in the median round (by that ratio). The rate against the bare client's is printed with
/// the ceiling a relay making the store's moves (`moves`) has where the client, RocksDB and
/// the broker share the cores.
pub fn report(
    bench: &str,
    title: &str,
    rounds: &[Round],
    moves: &Drain,
    rule: f64,
) -> std::process::ExitCode {
    let of_twin = |i: usize| rounds[i].0.cpu_us / rounds[i].1.cpu_us;
    let of_bare = |i: usize| rounds[i].0.rate / rounds[i].2.rate;
    let mut order: Vec<usize> = (0..rounds.len()).collect();
    order.sort_by(|a, b| of_twin(*a).total_cmp(&of_twin(*b)));
    let median = order[order.len() / 2];
    println!("\n{bench} — {title}");
    println!("| run | deliveries/s | CPU per delivery (µs) | broker CPU per delivery (µs) | relay CPU / twin's | relay rate / bare's |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (k, (r, t, b)) in rounds.iter().enumerate() {
        for (name, d) in [("relay", r), ("transitions twin", t), ("bare client", b)] {
            let ratios = if name == "relay" {
                format!("{:.2}× | {:.0}%", of_twin(k), of_bare(k) * 100.0)
            } else {
                " | ".into()
            };
            println!(
                "| {name}, round {} | {:.0} | {:.1} | {:.1} | {ratios} |",
                k + 1,
                d.rate,
                d.cpu_us,
                d.broker_us,
            );
        }
    }
    println!(
        "| the store's moves alone | {:.0} | {:.1} | {:.1} | | |",
        moves.rate, moves.cpu_us, moves.broker_us
    );
    let (r, t, b) = rounds[median].clone();
    // Where the relay's CPU goes, against the twin's, in the median round (threads that
    // ended within a run are in its total only).
    println!("\n| thread (median round) | relay µs per delivery | twin µs per delivery |");
    println!("|---|---:|---:|");
    let mut names: Vec<&String> = r
        .by_thread
        .iter()
        .chain(&t.by_thread)
        .map(|(n, _)| n)
        .collect();
    names.sort();
    names.dedup();
    let of = |d: &Drain, name: &str| {
        d.by_thread
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0.0, |(_, us)| *us)
    };
    for name in names {
        println!("| {name} | {:.1} | {:.1} |", of(&r, name), of(&t, name));
    }
    let ceiling = (b.cpu_us + b.broker_us) / (b.cpu_us + b.broker_us + moves.cpu_us);
    println!(
        "\nmedian round {}: relay {:.1} µs per delivery against the twin's {:.1} µs = {:.2}× (pass: <= {rule}×); \
         rate {:.0}/s, {:.0}% of the bare client's {:.0}/s (the issue's rule, >= 70%: printed; the ceiling of a relay making the store's moves here: {:.0}%)",
        median + 1,
        r.cpu_us,
        t.cpu_us,
        of_twin(median),
        r.rate,
        of_bare(median) * 100.0,
        b.rate,
        ceiling * 100.0
    );
    if of_twin(median) <= rule {
        println!("{bench}: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("{bench}: FAIL");
        std::process::ExitCode::FAILURE
    }
}
