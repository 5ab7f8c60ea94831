//! Leader election on the real API server's Lease: one leader at a time, a live Lease is
//! respected, one nobody renews is taken over after the lease duration as the follower's
//! own clock measures it; and two operator processes, the leader SIGKILLed, or stopped
//! with SIGTERM (it releases the Lease).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ankusa_operator::leader::{Elector, LeaseSettings, Outcome};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::cluster::{self, OPERATOR_NS};

fn settings(lease: &str, identity: &str, secs: u64) -> LeaseSettings {
    LeaseSettings {
        lease_duration: Duration::from_secs(secs),
        renew_deadline: Duration::from_secs(secs.saturating_sub(1).max(1)),
        renew_every: Duration::from_millis(200),
        ..LeaseSettings::new(lease, OPERATOR_NS, identity)
    }
}

#[tokio::test]
async fn two_replicas_never_lead_at_once() {
    let (client, _) = cluster::operator_client().await;
    let lease = format!("lease-{:08x}", rand::random::<u32>());
    let mut a = Elector::new(client.clone(), settings(&lease, "operator-a", 3));
    let mut b = Elector::new(client.clone(), settings(&lease, "operator-b", 3));
    assert_eq!(a.try_acquire().await.unwrap(), Outcome::Leading);
    assert_eq!(
        b.try_acquire().await.unwrap(),
        Outcome::Following("operator-a".into())
    );
    assert_eq!(a.try_acquire().await.unwrap(), Outcome::Leading);
    assert_eq!(
        b.try_acquire().await.unwrap(),
        Outcome::Following("operator-a".into())
    );

    // A holder whose renewTime reads as long past (its clock is behind) is not expired:
    // the follower goes by its own clock since it last saw the Lease change.
    let admin = cluster::admin().await;
    let leases: Api<Lease> = Api::namespaced(admin, OPERATOR_NS);
    leases
        .patch(
            &lease,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "renewTime": "2020-01-01T00:00:00.000000Z" } })),
        )
        .await
        .unwrap();
    assert_eq!(
        b.try_acquire().await.unwrap(),
        Outcome::Following("operator-a".into())
    );

    // operator-a stops renewing: once the Lease has not changed for its duration (3 s)
    // by operator-b's clock, operator-b takes it over.
    let started = Instant::now();
    let took = loop {
        if b.try_acquire().await.unwrap() == Outcome::Leading {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never taken over"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        took >= Duration::from_millis(2800),
        "taken over after {took:?}, before the lease ran out"
    );
    assert_eq!(
        a.try_acquire().await.unwrap(),
        Outcome::Following("operator-b".into())
    );
    let l = leases.get(&lease).await.unwrap().spec.unwrap();
    assert_eq!(l.holder_identity.as_deref(), Some("operator-b"));
    assert_eq!(l.lease_transitions, Some(1));
}

#[tokio::test]
async fn a_stale_write_loses_the_race() {
    // Two followers see the same expired Lease; the first write wins, the other's write
    // carries a stale resourceVersion, gets a 409 and follows.
    let (client, _) = cluster::operator_client().await;
    let lease = format!("race-{:08x}", rand::random::<u32>());
    let mut a = Elector::new(client.clone(), settings(&lease, "operator-a", 1));
    assert_eq!(a.try_acquire().await.unwrap(), Outcome::Leading);
    let mut b = Elector::new(client.clone(), settings(&lease, "operator-b", 1));
    let mut c = Elector::new(client.clone(), settings(&lease, "operator-c", 1));
    assert!(matches!(
        b.try_acquire().await.unwrap(),
        Outcome::Following(_)
    ));
    assert!(matches!(
        c.try_acquire().await.unwrap(),
        Outcome::Following(_)
    ));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (rb, rc) = tokio::join!(b.try_acquire(), c.try_acquire());
    let outcomes = [rb.unwrap(), rc.unwrap()];
    let leaders = outcomes.iter().filter(|o| **o == Outcome::Leading).count();
    assert_eq!(leaders, 1, "{outcomes:?}");
}

struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn operator(kubeconfig: &std::path::Path, lease: &str, identity: &str, ns: &str) -> Operator {
    operator_with_lease(kubeconfig, lease, identity, ns, 4)
}

/// An operator process whose Lease lasts `lease_s` seconds (renewed every second, given up
/// one second before it expires).
fn operator_with_lease(
    kubeconfig: &std::path::Path,
    lease: &str,
    identity: &str,
    ns: &str,
    lease_s: u64,
) -> Operator {
    let child = Command::new(env!("CARGO_BIN_EXE_ankusa-operator"))
        .args([
            "run",
            "--watch-namespace",
            ns,
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .args([
            "--lease-name",
            lease,
            "--lease-namespace",
            OPERATOR_NS,
            "--identity",
            identity,
        ])
        .args([
            "--lease-duration-s",
            &lease_s.to_string(),
            "--renew-deadline-s",
            &(lease_s - 1).to_string(),
            "--retry-period-s",
            "1",
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Operator(child)
}

/// SIGTERM to an operator this test started, by its PID, and its exit: its status and
/// when the signal went.
fn terminate(op: &mut Operator) -> (std::process::ExitStatus, Instant) {
    let pid = i32::try_from(op.0.id()).unwrap();
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let sent = Instant::now();
    (op.0.wait().unwrap(), sent)
}

async fn holder(leases: &Api<Lease>, lease: &str) -> Option<String> {
    leases
        .get_opt(lease)
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

/// Two operator processes with the operator's ServiceAccount: one leads; the follower
/// applies nothing; SIGKILL the leader and the follower takes over within the lease
/// duration (plus its retry period) and reconciles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_follower_takes_over_from_a_killed_leader() {
    let admin = cluster::admin().await;
    let (_, kubeconfig) = cluster::operator_client().await;
    let ns = cluster::namespace(&admin, "leader").await;
    let lease = format!("op-{:08x}", rand::random::<u32>());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), OPERATOR_NS);

    let mut first = operator(&kubeconfig, &lease, "operator-a", &ns);
    let leader = cluster::eventually(Duration::from_secs(30), "a leader", || async {
        holder(&leases, &lease).await
    })
    .await;
    assert_eq!(leader, "operator-a");
    let _second = operator(&kubeconfig, &lease, "operator-b", &ns);
    // A Relay for the leader to reconcile; only operator-a may write.
    let audit = crate::cluster::Audit::mark();
    let relay: ankusa_crds::relay::Relay = serde_json::from_value(json!({
        "apiVersion": "ankusa.dev/v1alpha1", "kind": "Relay",
        "metadata": { "name": "relay", "namespace": ns },
        "spec": { "image": "ghcr.io/ankusa/relay:0.1.0" },
    }))
    .unwrap();
    let relays: Api<ankusa_crds::relay::Relay> = Api::namespaced(admin.clone(), &ns);
    relays.create(&Default::default(), &relay).await.unwrap();
    cluster::eventually(
        Duration::from_secs(30),
        "the leader's reconcile",
        || async { relays.get("relay").await.unwrap().status.map(|_| ()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(holder(&leases, &lease).await.as_deref(), Some("operator-a"));
    let writes = audit.writes(cluster::OPERATOR_USER, &ns);
    assert!(!writes.is_empty());
    // Every object the operator applies gets an Event naming the replica that did it:
    // all of them are the leader's.
    let events = cluster::events(&admin, &ns).await;
    let ours: Vec<_> = events
        .iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("ankusa-operator"))
        .collect();
    assert!(!ours.is_empty());
    for e in ours {
        assert_eq!(
            e.reporting_instance.as_deref(),
            Some("operator-a"),
            "{e:#?}"
        );
    }

    // SIGKILL the leader.
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    let killed = Instant::now();
    cluster::eventually(Duration::from_secs(20), "operator-b leading", || async {
        (holder(&leases, &lease).await.as_deref() == Some("operator-b")).then_some(())
    })
    .await;
    let took = killed.elapsed();
    // Lease 4 s after the follower last saw it renewed (at most one retry period before the
    // kill), plus its next look (one retry period) and the API's latency on a busy machine.
    assert!(took <= Duration::from_secs(8), "takeover took {took:?}");
    // The new leader reconciles: a drifted object is applied back.
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(admin.clone(), &ns)
        .delete("relay", &Default::default())
        .await
        .unwrap();
    cluster::eventually(
        Duration::from_secs(30),
        "the new leader's repair",
        || async {
            Api::<k8s_openapi::api::core::v1::Service>::namespaced(admin.clone(), &ns)
                .get_opt("relay")
                .await
                .unwrap()
                .map(|_| ())
        },
    )
    .await;
}

/// A leader stopped cleanly (SIGTERM, as a rolling update or a drain stops it) empties the
/// Lease once its controller has stopped, so the follower leads at its next look rather
/// than after the lease duration: here a 30 s Lease changes hands in a few seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_releases_the_lease() {
    let admin = cluster::admin().await;
    let (_, kubeconfig) = cluster::operator_client().await;
    let ns = cluster::namespace(&admin, "release").await;
    let lease = format!("op-{:08x}", rand::random::<u32>());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), OPERATOR_NS);
    let mut first = operator_with_lease(&kubeconfig, &lease, "operator-a", &ns, 30);
    let leader = cluster::eventually(Duration::from_secs(30), "a leader", || async {
        holder(&leases, &lease).await
    })
    .await;
    assert_eq!(leader, "operator-a");
    let _second = operator_with_lease(&kubeconfig, &lease, "operator-b", &ns, 30);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(holder(&leases, &lease).await.as_deref(), Some("operator-a"));

    let (exit, stopped) = terminate(&mut first);
    assert!(exit.success(), "the leader's exit on SIGTERM: {exit:?}");
    cluster::eventually(Duration::from_secs(30), "operator-b leading", || async {
        (holder(&leases, &lease).await.as_deref() == Some("operator-b")).then_some(())
    })
    .await;
    let took = stopped.elapsed();
    // The follower looks every second; without the release it would wait out the 30 s.
    assert!(took <= Duration::from_secs(8), "takeover took {took:?}");
}

/// A follower waiting for the Lease stops at once on SIGTERM, with a clean exit: its
/// handler is installed before it waits (as a pod's PID 1 it would otherwise ignore the
/// signal and hold up every rollout for its grace period). The leader keeps the Lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_stops_at_once_on_sigterm() {
    let admin = cluster::admin().await;
    let (_, kubeconfig) = cluster::operator_client().await;
    let ns = cluster::namespace(&admin, "follower").await;
    let lease = format!("op-{:08x}", rand::random::<u32>());
    let leases: Api<Lease> = Api::namespaced(admin.clone(), OPERATOR_NS);
    let _first = operator_with_lease(&kubeconfig, &lease, "operator-a", &ns, 30);
    cluster::eventually(Duration::from_secs(30), "operator-a leading", || async {
        (holder(&leases, &lease).await.as_deref() == Some("operator-a")).then_some(())
    })
    .await;
    let mut second = operator_with_lease(&kubeconfig, &lease, "operator-b", &ns, 30);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (exit, stopped) = terminate(&mut second);
    let took = stopped.elapsed();
    assert!(exit.success(), "the follower's exit on SIGTERM: {exit:?}");
    assert!(
        took <= Duration::from_secs(3),
        "the follower took {took:?} to stop"
    );
    assert_eq!(holder(&leases, &lease).await.as_deref(), Some("operator-a"));
}
