//! Leader election on a Lease, against the in-memory API server: one leader at a time, a
//! live Lease is respected, an expired one is taken over.

use std::time::Duration;

use ankusa_operator::leader::{try_acquire, LeaseSettings, Outcome};
use serde_json::json;

use crate::apiserver::ApiServer;

fn settings(identity: &str) -> LeaseSettings {
    LeaseSettings {
        name: "ankusa-operator".into(),
        namespace: "ankusa-system".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(15),
        renew_every: Duration::from_secs(5),
    }
}

#[tokio::test]
async fn two_replicas_never_lead_at_once() {
    let (server, client) = ApiServer::start().await;
    let (a, b) = (settings("operator-a"), settings("operator-b"));
    assert_eq!(try_acquire(&client, &a).await.unwrap(), Outcome::Leading);
    assert_eq!(
        try_acquire(&client, &b).await.unwrap(),
        Outcome::Following("operator-a".into())
    );
    // Renewing keeps it.
    assert_eq!(try_acquire(&client, &a).await.unwrap(), Outcome::Leading);
    assert_eq!(
        try_acquire(&client, &b).await.unwrap(),
        Outcome::Following("operator-a".into())
    );

    // operator-a stops renewing: once the Lease has expired, operator-b takes it over.
    {
        let mut inner = server.lock();
        let key = (
            "/apis/coordination.k8s.io/v1".to_owned(),
            "ankusa-system".to_owned(),
            "leases".to_owned(),
            "ankusa-operator".to_owned(),
        );
        let lease = inner.objects.get_mut(&key).unwrap();
        lease["spec"]["renewTime"] = json!("2026-01-01T00:00:00.000000Z");
    }
    assert_eq!(try_acquire(&client, &b).await.unwrap(), Outcome::Leading);
    assert_eq!(
        try_acquire(&client, &a).await.unwrap(),
        Outcome::Following("operator-b".into())
    );
    let inner = server.lock();
    let lease = inner
        .get(
            "/apis/coordination.k8s.io/v1",
            "ankusa-system",
            "leases",
            "ankusa-operator",
        )
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "operator-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
}

#[tokio::test]
async fn a_stale_write_loses_the_race() {
    // Both replicas read the expired Lease; the first write wins, the second gets a 409
    // and follows.
    let (server, client) = ApiServer::start().await;
    let a = settings("operator-a");
    assert_eq!(try_acquire(&client, &a).await.unwrap(), Outcome::Leading);
    let key = (
        "/apis/coordination.k8s.io/v1".to_owned(),
        "ankusa-system".to_owned(),
        "leases".to_owned(),
        "ankusa-operator".to_owned(),
    );
    server.lock().objects.get_mut(&key).unwrap()["spec"]["renewTime"] =
        json!("2026-01-01T00:00:00.000000Z");
    let (b, c) = (settings("operator-b"), settings("operator-c"));
    let (rb, rc) = tokio::join!(try_acquire(&client, &b), try_acquire(&client, &c));
    let outcomes = [rb.unwrap(), rc.unwrap()];
    let leaders = outcomes.iter().filter(|o| **o == Outcome::Leading).count();
    assert_eq!(leaders, 1, "{outcomes:?}");
}
