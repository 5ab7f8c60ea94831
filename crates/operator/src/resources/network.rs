//! The Relay's network objects: the Services (headless, client, ingest), the Ingress and
//! HTTPRoute to the ingest Service, the NetworkPolicy, and the ServiceMonitor.

use std::collections::BTreeMap;

use ankusa_crds::relay::Relay;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{json, Value};

use super::jobs::JOB_APP_NAME;
use super::{
    annotated, metadata, selector_labels, typed, ADMIN_PORT, INGEST_PORT, METRICS_TOKEN_KEY,
};
use crate::names::{Names, ResourceError};

pub(super) fn ports() -> Value {
    json!([
        { "name": "ingest", "port": INGEST_PORT, "targetPort": "ingest", "protocol": "TCP" },
        { "name": "admin", "port": ADMIN_PORT, "targetPort": "admin", "protocol": "TCP" },
    ])
}

/// Label telling a Relay's two Services apart (`nodes` or `client`): the ServiceMonitor
/// selects `nodes` only, so each pod is scraped once.
pub const SERVICE_LABEL: &str = "ankusa.dev/service";

/// A Service of the relay's pods on the ingest and admin ports, with `spec` added;
/// `role` is its [`SERVICE_LABEL`].
pub(super) fn service(
    relay: &Relay,
    name: &str,
    role: &str,
    mut spec: Value,
) -> Result<Service, ResourceError> {
    let names = Names::of(relay)?;
    spec["selector"] = json!(selector_labels(&names.relay));
    spec["ports"] = ports();
    let mut meta = metadata(relay, name)?;
    meta["labels"][SERVICE_LABEL] = json!(role);
    typed(
        "Service",
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": spec,
        }),
    )
}

/// The headless Service: a DNS name per pod, ready or not (the operator polls a pod
/// that is starting or migrating, and Prometheus scrapes it).
pub fn headless_service(relay: &Relay) -> Result<Service, ResourceError> {
    let names = Names::of(relay)?;
    service(
        relay,
        &names.headless,
        "nodes",
        json!({ "clusterIP": "None", "publishNotReadyAddresses": true }),
    )
}

/// The client Service: ingest for providers, admin for operators of the relay.
pub fn client_service(relay: &Relay) -> Result<Service, ResourceError> {
    let names = Names::of(relay)?;
    service(
        relay,
        &names.client,
        "client",
        json!({ "type": "ClusterIP" }),
    )
}

/// The ingest Service: the ingest port alone, so that a NodePort or LoadBalancer exposes
/// to providers what they send to and nothing else.
pub fn ingest_service(relay: &Relay) -> Result<Service, ResourceError> {
    let names = Names::of(relay)?;
    let want = &relay.spec.ingest.service;
    let mut spec = json!({
        "type": want.type_,
        "selector": selector_labels(&names.relay),
        "ports": [{ "name": "ingest", "port": INGEST_PORT, "targetPort": "ingest", "protocol": "TCP" }],
    });
    if let Some(p) = &want.external_traffic_policy {
        spec["externalTrafficPolicy"] = json!(p);
    }
    if !want.load_balancer_source_ranges.is_empty() {
        spec["loadBalancerSourceRanges"] = json!(want.load_balancer_source_ranges);
    }
    if let Some(c) = &want.load_balancer_class {
        spec["loadBalancerClass"] = json!(c);
    }
    let mut meta = annotated(relay, &names.ingest, &want.annotations)?;
    meta["labels"][SERVICE_LABEL] = json!("ingest");
    typed(
        "Service",
        json!({ "apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec }),
    )
}

/// The path prefix providers post to (`/ingest/{source}`); both an Ingress's `Prefix` and
/// an HTTPRoute's `PathPrefix` match it element by element.
pub const INGEST_PATH: &str = "/ingest";

/// The Ingress of `spec.ingest.ingress`: `https://<host>/ingest/` to the ingest Service.
pub fn ingress(relay: &Relay) -> Result<Option<Ingress>, ResourceError> {
    let Some(want) = &relay.spec.ingest.ingress else {
        return Ok(None);
    };
    let names = Names::of(relay)?;
    let meta = annotated(relay, &names.ingest, &want.annotations)?;
    let mut spec = json!({
        "rules": [{
            "host": want.host,
            "http": { "paths": [{
                "path": INGEST_PATH,
                "pathType": "Prefix",
                "backend": { "service": { "name": names.ingest, "port": { "name": "ingest" } } },
            }] },
        }],
    });
    if let Some(class) = &want.class_name {
        spec["ingressClassName"] = json!(class);
    }
    if let Some(secret) = &want.tls_secret_name {
        spec["tls"] = json!([{ "hosts": [want.host], "secretName": secret }]);
    }
    typed(
        "Ingress",
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": meta,
            "spec": spec,
        }),
    )
    .map(Some)
}

/// The Gateway API's `HTTPRoute` resource.
pub fn http_route_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute"),
        "httproutes",
    )
}

/// The HTTPRoute of `spec.ingest.httpRoute`: `/ingest/` on its Gateways to the ingest
/// Service.
pub fn http_route(relay: &Relay) -> Result<Option<DynamicObject>, ResourceError> {
    let Some(want) = &relay.spec.ingest.http_route else {
        return Ok(None);
    };
    let names = Names::of(relay)?;
    let meta = annotated(relay, &names.ingest, &want.annotations)?;
    let parents: Vec<Value> = want
        .parent_refs
        .iter()
        .map(|g| {
            let mut r = json!({
                "group": "gateway.networking.k8s.io",
                "kind": "Gateway",
                "name": g.name,
            });
            if let Some(ns) = &g.namespace {
                r["namespace"] = json!(ns);
            }
            if let Some(section) = &g.section_name {
                r["sectionName"] = json!(section);
            }
            r
        })
        .collect();
    let mut spec = json!({
        "parentRefs": parents,
        "rules": [{
            "matches": [{ "path": { "type": "PathPrefix", "value": INGEST_PATH } }],
            "backendRefs": [{ "group": "", "kind": "Service", "name": names.ingest, "port": INGEST_PORT }],
        }],
    });
    if !want.hostnames.is_empty() {
        spec["hostnames"] = json!(want.hostnames);
    }
    typed(
        "HTTPRoute",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": meta,
            "spec": spec,
        }),
    )
    .map(Some)
}

/// Who the operator is, for the NetworkPolicy's admin rule: its namespace (any, when not
/// known) and its pods' labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorPeer {
    pub namespace: Option<String>,
    pub labels: BTreeMap<String, String>,
}

impl Default for OperatorPeer {
    fn default() -> Self {
        OperatorPeer {
            namespace: None,
            labels: BTreeMap::from([(
                "app.kubernetes.io/name".to_owned(),
                "ankusa-operator".to_owned(),
            )]),
        }
    }
}

impl OperatorPeer {
    /// `NAMESPACE` and `k=v,k=v` labels, as the chart passes them (`POD_NAMESPACE`,
    /// `ANKUSA_OPERATOR_POD_LABELS`); what is missing keeps its default.
    pub fn from_parts(namespace: Option<String>, labels: Option<&str>) -> OperatorPeer {
        let mut peer = OperatorPeer {
            namespace: namespace.filter(|n| !n.is_empty()),
            ..OperatorPeer::default()
        };
        if let Some(l) = labels.filter(|l| !l.trim().is_empty()) {
            peer.labels = l
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect();
        }
        peer
    }

    fn peer(&self) -> Value {
        let namespaces = match &self.namespace {
            Some(ns) => json!({ "matchLabels": { "kubernetes.io/metadata.name": ns } }),
            None => json!({}),
        };
        json!({ "namespaceSelector": namespaces, "podSelector": { "matchLabels": self.labels } })
    }
}

/// The NetworkPolicy of `spec.networkPolicy` (`None` when it is off). It selects the
/// relay pods, for ingress only, and admits:
/// 1. ingest from `ingestFrom` (anyone when empty);
/// 2. ingest and admin from the Relay's other nodes (forwards, relay-wide admin);
/// 3. admin from the operator (it polls `/v1/node`) and the Relay's backup Jobs (they pull
///    a checkpoint);
/// 4. admin from `metricsFrom` (scrapers) and from `adminFrom`, each when not empty.
pub fn network_policy(
    relay: &Relay,
    operator: &OperatorPeer,
) -> Result<Option<NetworkPolicy>, ResourceError> {
    let want = &relay.spec.network_policy;
    if !want.enabled {
        return Ok(None);
    }
    let names = Names::of(relay)?;
    let port = |name: &str| json!({ "port": name, "protocol": "TCP" });
    let own = json!({ "podSelector": { "matchLabels": selector_labels(&names.relay) } });
    let mut jobs = selector_labels(&names.relay);
    jobs.insert("app.kubernetes.io/name".into(), JOB_APP_NAME.into());
    let jobs = json!({ "podSelector": { "matchLabels": jobs } });
    let mut ingest = json!({ "ports": [port("ingest")] });
    if !want.ingest_from.is_empty() {
        ingest["from"] = json!(want.ingest_from);
    }
    let mut rules = vec![
        ingest,
        json!({ "ports": [port("ingest"), port("admin")], "from": [own] }),
        json!({ "ports": [port("admin")], "from": [operator.peer(), jobs] }),
    ];
    for peers in [&want.metrics_from, &want.admin_from] {
        if !peers.is_empty() {
            rules.push(json!({ "ports": [port("admin")], "from": peers }));
        }
    }
    typed(
        "NetworkPolicy",
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": metadata(relay, &names.network_policy)?,
            "spec": {
                "podSelector": { "matchLabels": selector_labels(&names.relay) },
                "policyTypes": ["Ingress"],
                "ingress": rules,
            },
        }),
    )
    .map(Some)
}

/// The Prometheus Operator's `ServiceMonitor` resource.
pub fn service_monitor_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
        "servicemonitors",
    )
}

/// A ServiceMonitor scraping every node's `/metrics` through the headless Service.
pub fn service_monitor(relay: &Relay) -> Result<DynamicObject, ResourceError> {
    let names = Names::of(relay)?;
    let sm = &relay.spec.monitoring.service_monitor;
    let mut meta = metadata(relay, &names.service_monitor)?;
    for (k, v) in &sm.labels {
        meta["labels"][k] = json!(v);
    }
    // The scrapes carry the metrics-scope token from the operator's Secret: they keep
    // working when the configuration says `admin.metrics.token_required`.
    let mut endpoint = json!({
        "port": "admin",
        "path": "/metrics",
        "interval": sm.interval,
        "authorization": {
            "type": "Bearer",
            "credentials": { "name": names.token_secret, "key": METRICS_TOKEN_KEY },
        },
    });
    if !sm.relabelings.is_empty() {
        endpoint["relabelings"] = json!(sm.relabelings);
    }
    // The headless Service only: selecting both Services would scrape every pod twice.
    let mut selector = selector_labels(&names.relay);
    selector.insert(SERVICE_LABEL.into(), "nodes".into());
    typed(
        "ServiceMonitor",
        json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": meta,
            "spec": {
                "selector": { "matchLabels": selector },
                "namespaceSelector": { "matchNames": [names.namespace] },
                "endpoints": [endpoint],
            },
        }),
    )
}
