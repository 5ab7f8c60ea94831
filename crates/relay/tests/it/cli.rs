//! The command line: inspection, migration listing, bad input, and a node that serves.

use std::time::{Duration, Instant};

use ankusa_keyspace::Cf;
use ankusa_keyspace::Family;
use ankusa_store::{Op, OpenOptions, Rows, Store};

use crate::support::*;

#[test]
fn store_inspect_reports_format_families_counts_and_counters() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    store_with_hooks(&data, 9);
    let out = run(&["store", "inspect", "--data", data.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("format:   3 (this binary supports 3)"),
        "{stdout}"
    );
    assert!(stdout.contains("migrating: no"), "{stdout}");
    // 9 hooks × 2 sinks, each with a due row and a delivery row; 9 archive obligations.
    for (family, n) in [
        ("hooks", 9),
        ("deliveries", 18),
        ("due", 18),
        ("archive_pending", 9),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(family))
            .unwrap_or_else(|| panic!("no {family} line in {stdout}"));
        assert_eq!(
            line.split_whitespace().last(),
            Some(n.to_string().as_str()),
            "{line}"
        );
    }
    assert!(stdout.contains("tenants:  3"), "{stdout}");
    assert!(stdout.contains("pending=18 scheduled=0"), "{stdout}");

    let out = run(&["store", "verify", "--data", data.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("counters equal a fold"));
}

#[test]
fn store_migrate_dry_run_on_a_current_store_lists_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    store_with_hooks(&data, 1);
    let out = run(&[
        "store",
        "migrate",
        "--data",
        data.to_str().unwrap(),
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "store at format 3: no pending migrations\n"
    );
}

#[test]
fn a_missing_data_dir_is_a_clear_error_and_nothing_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("absent");
    for args in [
        vec!["store", "inspect", "--data"],
        vec!["store", "migrate", "--dry-run", "--data"],
        vec!["store", "migrate", "--data"],
        vec!["store", "verify", "--data"],
    ] {
        let mut args = args.clone();
        args.push(data.to_str().unwrap());
        let out = run(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = text(&out.stderr);
        assert!(err.contains("does not exist"), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one clear line: {err}");
        assert!(!data.exists(), "{args:?} created the data dir");
    }
}

#[test]
fn a_newer_store_is_refused_by_every_command_and_left_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    store_with_hooks(&data, 3);
    {
        // What a newer binary's migration leaves: the format file raised before the batch
        // that stamps `m:format`.
        let store = Store::open(&data, &OpenOptions::default()).unwrap();
        store.record_format(7).unwrap();
        store
            .write(
                vec![Op::put(
                    Cf::Default,
                    ankusa_keyspace::META_FORMAT.to_vec(),
                    7u32.to_be_bytes(),
                )],
                true,
            )
            .unwrap();
    }
    let before = files(&data);
    for args in [
        vec!["store", "inspect", "--data"],
        vec!["store", "migrate", "--data"],
        vec!["store", "verify", "--data"],
    ] {
        let mut args = args.clone();
        args.push(data.to_str().unwrap());
        let out = run(&args);
        assert!(!out.status.success());
        let err = text(&out.stderr);
        assert!(
            err.contains("store format 7 is newer than this binary supports (format 3)"),
            "{err}"
        );
    }
    let after = files(&data);
    let names = |fs: &[(String, Vec<u8>)]| {
        fs.iter()
            .map(|(n, b)| (n.clone(), b.len()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(&after),
        names(&before),
        "the refused store's files changed"
    );
    assert_eq!(after, before, "the refused store was modified");
}

#[test]
fn a_corrupted_family_is_reported_not_read_as_empty() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    store_with_hooks(&data, 4);
    {
        let store = Store::open(&data, &OpenOptions::default()).unwrap();
        store
            .write(vec![Op::delete(Cf::Index, Family::Due.hi())], true)
            .unwrap();
    }
    for sub in ["inspect", "verify"] {
        let out = run(&["store", sub, "--data", data.to_str().unwrap()]);
        assert!(
            !out.status.success(),
            "{sub} succeeded on a corrupted store"
        );
        let err = text(&out.stderr);
        assert!(
            err.contains(
                "store corruption in family due: scan ended before the family's hi sentinel"
            ),
            "{sub}: {err}"
        );
    }
}

#[test]
fn a_bad_config_is_refused_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("relay.yaml");
    std::fs::write(&cfg, "data_dir: ./x\ntenants:\n  max: 0\n").unwrap();
    let out = run(&["run", "--config", cfg.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("tenants.max: 0 is outside 1..=4294967294"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        !dir.path().join("x").exists(),
        "a refused config opened a store"
    );
}

#[test]
fn run_opens_the_store_and_serves_health_readiness_and_node_status() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    store_with_hooks(&data, 6);
    let spec = proc_node();
    let port = spec.admin_port().unwrap();
    let _node = Proc::start(dir.path(), &spec);
    assert_eq!(http_get(port, "/healthz").unwrap(), (200, "ok\n".into()));
    assert_eq!(
        http_get(port, "/v1/node").unwrap().0,
        401,
        "node status needs a token"
    );
    let (status, body) = http_get_admin(port, "/v1/node").unwrap();
    assert_eq!(status, 200);
    let node: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(node["store_format"], 3);
    assert_eq!(node["supported_format"], 3);
    assert_eq!(node["tenants"], 3);
    // 6 hooks × 2 sinks; the node's config names neither sink, so the pipeline may already
    // have dead-lettered some: the rows are all still counted somewhere.
    let c = &node["counters"];
    let rows = queued_rows(c);
    assert_eq!(rows, 12, "{c}");
    assert_eq!(c["archive_pending"], 6);
    assert_eq!(node["migrating_to"], serde_json::Value::Null);
}

#[test]
fn version_json_names_the_supported_store_format() {
    let out = run(&["version", "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["store_format"], 3);
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
}

/// `make run`'s configuration loads, and carries the admin token the README's `/v1/node`
/// call uses.
#[test]
fn the_quickstart_configuration_loads_with_the_readmes_admin_token() {
    let root = crate::support::repo();
    // On its own: no environment variable needed.
    let c = ankusa_config::Config::load(
        &root.join("examples/quickstart.yaml"),
        Vec::<(String, String)>::new(),
    )
    .unwrap();
    assert_eq!(c.admin.tokens.len(), 1);
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(readme.contains("Bearer quickstart-admin-token"));
    let yaml = std::fs::read_to_string(root.join("examples/quickstart.yaml")).unwrap();
    assert!(yaml.contains("\"quickstart-admin-token\""));
}

/// `config check` gives the answer `run` would give — the same message and exit code —
/// without touching a store; the examples check clean (the Relay example's inline config
/// with its secrets' variables set).
#[test]
fn config_check_answers_what_run_would_without_a_store() {
    let root = crate::support::repo();
    let quickstart = root.join("examples/quickstart.yaml");
    let out = run(&["config", "check", quickstart.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(": ok (6 sources"),
        "{}",
        text(&out.stdout)
    );
    // The Relay example's inline configuration, as the operator would render it.
    let relay: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(root.join("examples/relay.yaml")).unwrap())
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let inline = dir.path().join("inline.yaml");
    std::fs::write(
        &inline,
        serde_yaml::to_string(&relay["spec"]["config"]["inline"]).unwrap(),
    )
    .unwrap();
    let out = bin()
        .args(["config", "check", inline.to_str().unwrap()])
        .envs([
            ("GITHUB_WEBHOOK_SECRET", "g"),
            ("STRIPE_WEBHOOK_SECRET", "s"),
            ("SHOPIFY_WEBHOOK_SECRET", "h"),
            ("SINK_SECRET", "whsec_c2luaw=="),
            ("ADMIN_TOKEN", "0123456789abcdef0123456789abcdef"),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Refusals: a validation error, a secret that is not set, a sink URL that does not
    // parse — each the same from `config check` as from `run`, and no store is made.
    for (name, body) in [
        ("range", "data_dir: ./x\ntenants:\n  max: 0\n"),
        (
            "secret",
            "data_dir: ./x\nsinks: [{ id: s, url: \"http://127.0.0.1:9/\" }]\nroutes: [{ id: r, sinks: [s] }]\nsources: [{ id: g, verify: { scheme: github, secret: { env: ANKUSA_TEST_UNSET_SECRET } }, route: r }]\n",
        ),
        (
            "url",
            "data_dir: ./x\nsinks: [{ id: s, url: \"http://exa mple/\" }]\nroutes: [{ id: r, sinks: [s] }]\n",
        ),
    ] {
        let cfg = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&cfg, body).unwrap();
        let check = run(&["config", "check", cfg.to_str().unwrap()]);
        let started = bin()
            .current_dir(dir.path())
            .args(["run", "--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(check.status.code(), Some(1), "{name}: {}", text(&check.stderr));
        assert_eq!(started.status.code(), Some(1), "{name}: {}", text(&started.stderr));
        assert_eq!(text(&check.stderr), text(&started.stderr), "{name}");
        assert!(text(&check.stderr).contains("ankusa-relay: error:"), "{name}");
        assert!(!dir.path().join("x").exists(), "{name}: a refused config made a store");
    }
    // A type error names the key and its line and column; an override's, its variable.
    let cfg = dir.path().join("type.yaml");
    std::fs::write(
        &cfg,
        "data_dir: ./x\nsinks:\n  - id: s\n    url: http://127.0.0.1:9/\n    timeout_ms: 5s\n",
    )
    .unwrap();
    let out = run(&["config", "check", cfg.to_str().unwrap()]);
    assert_eq!(
        text(&out.stderr).trim_end(),
        "ankusa-relay: error: invalid config: sinks[0].timeout_ms: invalid type: string \"5s\", expected u64 (line 5, column 17)"
    );
    let out = bin()
        .args(["config", "check", inline.to_str().unwrap()])
        .env("ANKUSA_TENANTS__MAXX", "3")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(
        err.contains("unknown field `maxx`") && err.contains("(from ANKUSA_TENANTS__MAXX)"),
        "{err}"
    );
    // A misspelt first segment is refused too, with the key it likely meant; what was
    // applied and what was left alone is listed.
    let out = bin()
        .args(["config", "check", inline.to_str().unwrap()])
        .env("ANKUSA_TENANT__MAX", "5")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("tenant: not a configuration key (did you mean `tenants`?)")
            && err.contains("(from ANKUSA_TENANT__MAX)"),
        "{err}"
    );
    let out = bin()
        .args(["config", "check", quickstart.to_str().unwrap()])
        .env("ANKUSA_TENANTS__MAX", "7")
        .env("ANKUSA_ADMIN_TOKEN", "t")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("override: tenants.max from ANKUSA_TENANTS__MAX\n")
            && said.contains("not configuration, ignored: ANKUSA_ADMIN_TOKEN\n"),
        "{said}"
    );
}

/// The README's quickstart, as a newcomer runs it: the node `make run` starts
/// (`run --config examples/quickstart.yaml`, its store under `./data/quickstart`), then each
/// command of the README's first shell block exactly as written — the sink in the
/// background, the curls — and the answers the README promises: a 202 with the hook's
/// id, the sink printing it with `signature ok`, and the node's status with the token.
#[test]
fn the_readmes_quickstart_works_as_written() {
    let root = crate::support::repo();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let block = readme
        .split("```sh\n")
        .nth(2)
        .and_then(|b| b.split("```").next())
        .expect("the README's quickstart block");
    // Lines continued with a backslash are one command.
    let commands: Vec<String> = block
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.replace(
                "./target/debug/ankusa-relay",
                env!("CARGO_BIN_EXE_ankusa-relay"),
            )
        })
        .collect();
    assert_eq!(commands.len(), 3, "{commands:#?}");
    assert!(
        commands[0].contains(" sink --listen 127.0.0.1:9999"),
        "{}",
        commands[0]
    );
    let dir = tempfile::tempdir().unwrap();
    let _node = Proc {
        child: bin()
            .current_dir(dir.path())
            .args(["run", "--config"])
            .arg(root.join("examples/quickstart.yaml"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    };
    let mut sink = Proc {
        child: std::process::Command::new("sh")
            .args(["-c", &format!("exec {}", commands[0])])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(http_get(8080, "/readyz"), Ok((200, _))) {
        assert!(
            Instant::now() < deadline,
            "the quickstart node never became ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        dir.path().join("data/quickstart").is_dir(),
        "the store is under ./data/quickstart"
    );
    let sh = |c: &str| {
        let out = std::process::Command::new("sh")
            .args(["-c", c])
            .output()
            .expect("sh");
        assert!(out.status.success(), "{c}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let ack = sh(&commands[1]);
    assert!(ack.starts_with("HTTP/1.1 202"), "{ack}");
    let id = ack
        .split("\"id\":\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a hook id in the answer")
        .to_owned();
    assert!(id.starts_with("hk_"), "{ack}");
    let node: serde_json::Value = serde_json::from_str(&sh(&commands[2])).unwrap();
    assert_eq!(node["store_format"], 3, "{node}");
    assert_eq!(node["tenants"], 1, "{node}");
    // The sink prints the hook, its signature checked.
    let mut out = sink.child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(&mut out)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).expect("the sink printed the hook");
        if line.contains(&id) {
            assert!(line.contains("signature ok"), "{line}");
            assert!(line.contains("tenant acme, source demo"), "{line}");
            break;
        }
    }
}

/// A second node on a store another one holds says so once, naming the holder's pid.
#[test]
fn a_second_node_on_a_held_store_names_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    let first = proc_node().data_dir(&data);
    let node = Proc::start(dir.path(), &first);
    let other = tempfile::tempdir().unwrap();
    let cfg = other.path().join("relay.yaml");
    std::fs::write(&cfg, proc_node().data_dir(&data).yaml_at(other.path())).unwrap();
    let out = run(&["run", "--config", cfg.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains(&format!(
            "is held by another process (pid {}?)",
            node.child.id()
        )),
        "{err}"
    );
    assert_eq!(
        last.matches("LOCK").count(),
        0,
        "RocksDB's own words: {err}"
    );
    drop(node);
}

/// `sink` answers what it is told: `--status` to every delivery, `--fail-status` to the
/// share `--fail-rate` names (every other one at 0.5), and prints each answer and, with
/// `--print-headers`, each header.
#[test]
fn the_sink_fails_on_purpose_and_prints_headers() {
    use std::io::BufRead;
    let (_sink, mut out, _, port) = demo_sink([
        "--status",
        "202",
        "--fail-rate",
        "0.5",
        "--fail-status",
        "500",
        "--print-headers",
    ]);
    let statuses: Vec<u16> = (0..4)
        .map(|i| {
            let h = [
                format!("x-probe: {i}"),
                "content-type: application/json".into(),
            ];
            http_raw(port, "POST", "/hooks", &h, "{}", Duration::from_secs(5))
                .unwrap()
                .0
        })
        .collect();
    assert_eq!(statuses, vec![202, 500, 202, 500]);
    let mut said = String::new();
    while !said.contains("x-probe: 3") {
        let mut l = String::new();
        assert!(out.read_line(&mut l).unwrap() > 0, "{said}");
        said.push_str(&l);
    }
    assert!(said.contains("→ 202") && said.contains("→ 500"), "{said}");
    assert!(said.contains("  x-probe: 0\n"), "{said}");
    // Nonsense is refused before it listens.
    let out = run(&["sink", "--listen", "127.0.0.1:0", "--fail-rate", "2"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--fail-rate 2 is outside 0..=1"),
        "{}",
        text(&out.stderr)
    );
}
