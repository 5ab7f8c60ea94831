//! The real control plane the tests run against: started by `scripts/k8s-testenv.sh`
//! (`make test` runs every test under it), found through the variables it exports.
//!
//! - [`admin`]: cluster-admin on the full control plane (etcd, kube-apiserver,
//!   kube-controller-manager, kube-scheduler, kwok nodes).
//! - [`bare_admin`]: cluster-admin on a second kube-apiserver with no controllers and no
//!   ServiceMonitor CRD (an empty cluster on the same etcd under another prefix).
//! - [`operator_client`]: the operator's own identity, a ServiceAccount bound to exactly
//!   the rules of `crates/operator/src/rbac.rs` (which the chart's RBAC equals), so every
//!   operator test also tests its permissions.
//! - [`namespace`]: a fresh namespace per test; tests run in parallel processes.
//! - [`Audit`]: the API server's audit log, to count the writes a user made.

use std::path::PathBuf;
use std::time::Duration;

use ankusa_operator::rbac::CLUSTER_RULES;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use serde_json::{json, Value};

/// The namespace and name of the operator's ServiceAccount in the tests.
pub const OPERATOR_NS: &str = "ankusa-system";
pub const OPERATOR_SA: &str = "ankusa-operator";
/// The operator's user name, as the audit log records it.
pub const OPERATOR_USER: &str = "system:serviceaccount:ankusa-system:ankusa-operator";

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: these tests run against the control plane that \
             `scripts/k8s-testenv.sh run -- cargo nextest run` starts (`make test` does)"
        )
    })
}

/// The file of one of the test environment's variables.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from(env(name))
}

/// The directory of the control plane's binaries (`kubectl` among them).
pub fn bin(name: &str) -> PathBuf {
    path("ANKUSA_TESTENV_BIN").join(name)
}

async fn client_from(file: &std::path::Path) -> Client {
    let kc = Kubeconfig::read_from(file).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

pub async fn admin() -> Client {
    client_from(&path("KUBECONFIG")).await
}

pub async fn bare_admin() -> Client {
    client_from(&path("ANKUSA_TESTENV_BARE_KUBECONFIG")).await
}

fn apply() -> PatchParams {
    PatchParams::apply("ankusa-tests").force()
}

/// A new namespace `<prefix>-<random>`, with `labels`.
pub async fn namespace_with(client: &Client, prefix: &str, labels: Value) -> String {
    let name = format!("{prefix}-{:08x}", rand::random::<u32>());
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": { "name": name, "labels": labels },
    }))
    .unwrap();
    api.create(&PostParams::default(), &ns).await.unwrap();
    name
}

pub async fn namespace(client: &Client, prefix: &str) -> String {
    namespace_with(client, prefix, json!({})).await
}

/// `(group, resource, verbs)` rules as RBAC PolicyRules.
fn rules(rules: &[(&str, &str, &[&str])]) -> Vec<Value> {
    rules
        .iter()
        .map(|(group, resource, verbs)| {
            json!({ "apiGroups": [group], "resources": [resource], "verbs": verbs })
        })
        .collect()
}

/// Server-side apply of `obj`, read as `K`, through `api` (idempotent: tests race for it).
async fn put<K>(api: Api<K>, obj: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
    let typed: K = serde_json::from_value(obj).unwrap();
    api.patch(&name, &apply(), &Patch::Apply(&typed))
        .await
        .unwrap();
}

/// A client with the operator's ServiceAccount token on the server `admin` talks to,
/// and its kubeconfig (for an operator process; removed when dropped).
pub async fn operator_identity(
    admin: &Client,
    admin_kubeconfig: &std::path::Path,
) -> (Client, tempfile::TempPath) {
    let sa_api: Api<ServiceAccount> = Api::namespaced(admin.clone(), OPERATOR_NS);
    put(
        Api::<Namespace>::all(admin.clone()),
        json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": OPERATOR_NS } }),
    )
    .await;
    put(
        sa_api.clone(),
        json!({ "apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": { "name": OPERATOR_SA, "namespace": OPERATOR_NS } }),
    )
    .await;
    let rbac = "rbac.authorization.k8s.io/v1";
    let subjects =
        json!([{ "kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NS }]);
    put(
        Api::<ClusterRole>::all(admin.clone()),
        json!({ "apiVersion": rbac, "kind": "ClusterRole",
                "metadata": { "name": "ankusa-operator-tests" },
                "rules": rules(CLUSTER_RULES) }),
    )
    .await;
    put(
        Api::<ClusterRoleBinding>::all(admin.clone()),
        json!({ "apiVersion": rbac, "kind": "ClusterRoleBinding",
                "metadata": { "name": "ankusa-operator-tests" },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": "ankusa-operator-tests" },
                "subjects": subjects }),
    )
    .await;
    // The leader-election rules, in the operator's namespace.
    put(
        Api::<Role>::namespaced(admin.clone(), OPERATOR_NS),
        json!({ "apiVersion": rbac, "kind": "Role",
                "metadata": { "name": "ankusa-operator-leader", "namespace": OPERATOR_NS },
                "rules": rules(ankusa_operator::rbac::LEADER_RULES) }),
    )
    .await;
    put(
        Api::<RoleBinding>::namespaced(admin.clone(), OPERATOR_NS),
        json!({ "apiVersion": rbac, "kind": "RoleBinding",
                "metadata": { "name": "ankusa-operator-leader", "namespace": OPERATOR_NS },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                             "name": "ankusa-operator-leader" },
                "subjects": subjects }),
    )
    .await;

    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": { "expirationSeconds": 7200 },
    }))
    .unwrap();
    // The ServiceAccount controller may not have seen the account yet; retry briefly.
    let mut token = None;
    for _ in 0..50 {
        match sa_api
            .create_token_request(OPERATOR_SA, &PostParams::default(), &request)
            .await
        {
            Ok(t) => {
                token = t.status.map(|s| s.token);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let token = token.expect("a token for the operator's ServiceAccount");
    let mut kc: Value =
        serde_yaml::from_str(&std::fs::read_to_string(admin_kubeconfig).unwrap()).unwrap();
    kc["users"][0]["user"] = json!({ "token": token });
    let file = tempfile::Builder::new()
        .prefix("operator-kubeconfig-")
        .tempfile()
        .unwrap()
        .into_temp_path();
    std::fs::write(&file, serde_yaml::to_string(&kc).unwrap()).unwrap();
    // RBAC is applied asynchronously in the authorizer's cache: wait until it allows.
    let client = client_from(&file).await;
    let relays: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &ankusa_operator::controller::relay_api_resource(),
    );
    for _ in 0..100 {
        if relays.list(&Default::default()).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (client, file)
}

/// The operator's identity on the full control plane.
pub async fn operator_client() -> (Client, tempfile::TempPath) {
    operator_identity(&admin().await, &path("KUBECONFIG")).await
}

/// The operator's identity on the bare API server.
pub async fn bare_operator_client() -> Client {
    operator_identity(&bare_admin().await, &path("ANKUSA_TESTENV_BARE_KUBECONFIG"))
        .await
        .0
}

/// The Events of `ns`.
pub async fn events(client: &Client, ns: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
}

/// A write the audit log recorded.
#[derive(Debug, Clone)]
pub struct Write {
    pub verb: String,
    pub resource: String,
    pub uri: String,
}

/// The full API server's audit log from a mark on.
pub struct Audit {
    from: usize,
}

impl Audit {
    /// Everything logged so far is before the mark.
    pub fn mark() -> Audit {
        Audit {
            from: Self::lines().len(),
        }
    }

    fn lines() -> Vec<String> {
        std::fs::read_to_string(path("ANKUSA_TESTENV_AUDIT_LOG"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The writes `user` made in `namespace` since the mark (dry runs are not writes).
    pub fn writes(&self, user: &str, namespace: &str) -> Vec<Write> {
        Self::lines()
            .iter()
            .skip(self.from)
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["stage"] == "ResponseComplete")
            .filter(|e| e["user"]["username"] == user)
            .filter(|e| e["objectRef"]["namespace"] == namespace)
            .filter(|e| {
                !e["requestURI"]
                    .as_str()
                    .unwrap_or("")
                    .contains("dryRun=All")
            })
            .map(|e| Write {
                verb: e["verb"].as_str().unwrap_or("").to_owned(),
                resource: e["objectRef"]["resource"].as_str().unwrap_or("").to_owned(),
                uri: e["requestURI"].as_str().unwrap_or("").to_owned(),
            })
            .collect()
    }
}

/// Poll `f` every 100 ms until it answers `Some`, at most `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
