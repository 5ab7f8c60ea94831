//! Crash tests: the real binary, killed with SIGKILL under load.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ankusa_relay::queue::deliveries::{DueRow, Envelope};
use ankusa_relay::queue::{fold, tenants};
use ankusa_relay::store::keys::Family;
use ankusa_relay::store::{OpenOptions, Store};

use crate::support::*;

fn yaml(data: &std::path::Path, admin: u16, ingest: u16) -> String {
    format!(
        r#"
data_dir: {}
ingest:
  listen: 127.0.0.1:{ingest}
admin:
  listen: 127.0.0.1:{admin}
sinks:
  - {{ id: a, url: "http://127.0.0.1:9/a" }}
  - {{ id: b, url: "http://127.0.0.1:9/b" }}
routes:
  - {{ id: both, sinks: [a, b] }}
sources:
  - id: shared
    tenant: {{ header: x-tenant }}
    verify: {{ scheme: none }}
    route: both
"#,
        data.display()
    )
}

#[test]
fn every_acked_hook_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    let (admin, ingest) = (free_port(), free_port());
    let mut node = Proc::start(dir.path(), &yaml(&data, admin, ingest), admin);

    let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let load = {
        let acked = acked.clone();
        rt.spawn(async move {
            let c = client();
            let url = format!("http://127.0.0.1:{ingest}/ingest/shared");
            let tasks: Vec<_> = (0..32)
                .map(|w| {
                    let (c, url, acked) = (c.clone(), url.clone(), acked.clone());
                    tokio::spawn(async move {
                        for n in 0.. {
                            let tenant = format!("tenant-{}", (w * 7 + n) % 40);
                            let body = format!(r#"{{"w":{w},"n":{n}}}"#);
                            match try_post(&c, &url, &[("x-tenant", tenant.clone())], body).await {
                                Some(r) if r.status == 202 => {
                                    let id = r.json()["id"].as_str().unwrap().to_owned();
                                    acked.lock().unwrap().push((id, tenant));
                                }
                                Some(_) => {}
                                None => return,
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                let _ = t.await;
            }
        })
    };
    // Let the load run, then kill the node mid-commit.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while acked.lock().unwrap().len() < 3_000 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    node.kill9();
    rt.block_on(load).unwrap();
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= 3_000,
        "only {} hooks acked before the kill",
        acked.len()
    );

    // The restarted binary boots on the crashed store and reports the same counters.
    let node = Proc::start(dir.path(), &yaml(&data, admin, ingest), admin);
    let (status, body) = http_get(admin, "/v1/node").unwrap();
    assert_eq!(status, 200);
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    drop(node);

    let store = Store::open(&data, &OpenOptions::default()).unwrap();
    let hooks: HashMap<String, (u64, Envelope)> = store
        .scan_family(Family::Hooks)
        .unwrap()
        .map(|kv| {
            let (k, v) = kv.unwrap();
            let env = Envelope::decode(&v).unwrap();
            (
                env.id.clone(),
                (ankusa_relay::store::keys::decode_hook(&k).unwrap().0, env),
            )
        })
        .collect();
    let due: Vec<DueRow> = store
        .scan_family(Family::Due)
        .unwrap()
        .map(|kv| {
            let (k, v) = kv.unwrap();
            DueRow::decode(&k, &v).unwrap()
        })
        .collect();
    for (id, tenant) in &acked {
        let (seq, env) = hooks
            .get(id)
            .unwrap_or_else(|| panic!("acked hook {id} is missing after kill -9"));
        assert_eq!(env.tenant.as_deref(), Some(tenant.as_str()));
        let ord = tenants::ord(&store, tenant)
            .unwrap()
            .expect("tenant ordinal");
        let rows = due
            .iter()
            .filter(|r| r.key.seq.0 == *seq && r.key.ord == ord)
            .count();
        assert_eq!(
            rows, 2,
            "hook {id} lacks a due row per sink under its tenant's ordinal"
        );
    }
    assert!(
        fold::verify(&store).unwrap().is_empty(),
        "counters differ from the fold"
    );
    let node_pending = status["counters"]["pending"].as_i64().unwrap();
    assert_eq!(node_pending, 2 * hooks.len() as i64);
}
