//! A small in-memory Kubernetes API server on 127.0.0.1 for the operator's I/O tests.
//!
//! It speaks enough of the real protocol for the requests the operator makes, over real
//! HTTP through a real `kube::Client`: GET of an object or a label-selected list, server-side
//! apply (`PATCH` with `application/apply-patch+yaml`, creating or merging, bumping
//! `resourceVersion` only when something changed, recording the field manager), the status
//! subresource, POST (Events, Leases), PUT with optimistic concurrency, and discovery of
//! `monitoring.coreos.com/v1` when the test says the Prometheus Operator is installed.
//! Every request is logged for the assertions.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Value};

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub content_type: String,
    pub body: Value,
}

/// An object's key: (API prefix, namespace, plural, name).
pub type Key = (String, String, String, String);

#[derive(Default)]
pub struct Inner {
    pub objects: BTreeMap<Key, Value>,
    pub requests: Vec<Request>,
    pub monitoring_api: bool,
    /// Writes to a path containing one of these are refused with 422 (an admission or
    /// validation failure, e.g. an immutable field).
    pub refuse: Vec<String>,
    rv: u64,
    uid: u64,
}

#[derive(Clone, Default)]
pub struct ApiServer {
    pub inner: Arc<Mutex<Inner>>,
}

fn status(code: u16, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn ok(v: &Value) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        v.to_string(),
    )
        .into_response()
}

/// Fields of `patch` set into `base`; objects merge key by key, everything else replaces.
fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                match b.get_mut(k) {
                    Some(bv) if bv.is_object() && v.is_object() => merge(bv, v),
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

fn matches_selector(obj: &Value, selector: &str) -> bool {
    let labels = &obj["metadata"]["labels"];
    selector
        .split(',')
        .filter(|s| !s.is_empty())
        .all(|term| match term.split_once('=') {
            Some((k, v)) => labels.get(k).and_then(Value::as_str) == Some(v),
            None => labels.get(term).is_some(),
        })
}

/// A Secret's `stringData` becomes `data`, as the API server does.
fn normalise(obj: &mut Value) {
    if let Some(sd) = obj.as_object_mut().and_then(|o| o.remove("stringData")) {
        if let Some(m) = sd.as_object() {
            for (k, v) in m {
                let enc = base64::engine::general_purpose::STANDARD
                    .encode(v.as_str().unwrap_or_default());
                obj["data"][k] = json!(enc);
            }
        }
    }
}

impl Inner {
    fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    pub fn get(&self, prefix: &str, ns: &str, plural: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&(prefix.into(), ns.into(), plural.into(), name.into()))
    }

    /// Put an object as another client would (a test's fixture).
    pub fn put(&mut self, prefix: &str, ns: &str, plural: &str, mut obj: Value) {
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        self.uid += 1;
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(format!("uid-{}", self.uid));
        }
        obj["metadata"]["resourceVersion"] = json!(self.next_rv());
        if obj["metadata"]["generation"].is_null() {
            obj["metadata"]["generation"] = json!(1);
        }
        obj["metadata"]["namespace"] = json!(ns);
        self.objects
            .insert((prefix.into(), ns.into(), plural.into(), name), obj);
    }

    /// Requests that wrote something (not GETs).
    pub fn writes(&self) -> Vec<&Request> {
        self.requests.iter().filter(|r| r.method != "GET").collect()
    }
}

async fn handle(
    State(server): State<ApiServer>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let query: BTreeMap<String, String> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), percent_decode(v)))
        .collect();
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body_v: Value = if body.is_empty() {
        Value::Null
    } else if content_type.contains("yaml") {
        serde_yaml::from_slice(&body).unwrap_or(Value::Null)
    } else {
        serde_json::from_slice(&body).unwrap_or(Value::Null)
    };
    let mut inner = server.inner.lock().unwrap();
    inner.requests.push(Request {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        content_type: content_type.clone(),
        body: body_v.clone(),
    });

    if method != Method::GET && inner.refuse.iter().any(|r| path.contains(r.as_str())) {
        return status(422, "Invalid", format!("{path}: spec: Forbidden: updates to statefulset spec for fields other than 'replicas', 'template' and 'updateStrategy' are forbidden"));
    }

    if path == "/apis/monitoring.coreos.com/v1" {
        return if inner.monitoring_api {
            ok(&json!({
                "kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": "monitoring.coreos.com/v1",
                "resources": [{
                    "name": "servicemonitors", "singularName": "servicemonitor",
                    "namespaced": true, "kind": "ServiceMonitor",
                    "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"],
                }],
            }))
        } else {
            status(
                404,
                "NotFound",
                "the server could not find the requested resource".into(),
            )
        };
    }

    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // `/<prefix>/namespaces/<ns>/<plural>[/<name>[/<sub>]]`, or `/<prefix>/<plural>` for a
    // list across namespaces (namespace "*").
    let (prefix, ns, plural, name, sub) = match segs.iter().position(|s| *s == "namespaces") {
        Some(i) => (
            format!("/{}", segs[..i].join("/")),
            segs.get(i + 1).copied().unwrap_or_default().to_owned(),
            segs.get(i + 2).copied().unwrap_or_default().to_owned(),
            segs.get(i + 3).map(|s| (*s).to_owned()),
            segs.get(i + 4).copied(),
        ),
        None if segs.len() >= 3 && method == Method::GET => (
            format!("/{}", segs[..segs.len() - 1].join("/")),
            "*".to_owned(),
            segs[segs.len() - 1].to_owned(),
            None,
            None,
        ),
        None => return status(404, "NotFound", format!("no route {path}")),
    };
    // A watch: the initial list was the state; no further events are sent, and the
    // connection stays open as a real watch does until its timeout.
    if query.get("watch").map(String::as_str) == Some("true")
        || query.get("watch").map(String::as_str) == Some("1")
    {
        drop(inner);
        let body = axum::body::Body::from_stream(futures::stream::pending::<
            Result<Bytes, std::convert::Infallible>,
        >());
        return (StatusCode::OK, [("content-type", "application/json")], body).into_response();
    }
    let key = |n: &str| (prefix.clone(), ns.clone(), plural.clone(), n.to_owned());

    match (method.as_str(), name) {
        ("GET", None) => {
            let selector = query.get("labelSelector").cloned().unwrap_or_default();
            let items: Vec<Value> = inner
                .objects
                .iter()
                .filter(|((p, n, pl, _), o)| {
                    p == &prefix
                        && (n == &ns || ns == "*")
                        && pl == &plural
                        && matches_selector(o, &selector)
                })
                .map(|(_, o)| o.clone())
                .collect();
            let rv = inner.rv.to_string();
            ok(&json!({
                "apiVersion": "v1", "kind": "List",
                "metadata": { "resourceVersion": rv }, "items": items,
            }))
        }
        ("GET", Some(n)) => match inner.objects.get(&key(&n)) {
            Some(o) => ok(o),
            None => status(404, "NotFound", format!("{plural} \"{n}\" not found")),
        },
        ("POST", None) => {
            let mut obj = body_v;
            let n = match obj["metadata"]["name"].as_str() {
                Some(n) => n.to_owned(),
                None => {
                    inner.uid += 1;
                    let n = format!(
                        "{}{}",
                        obj["metadata"]["generateName"].as_str().unwrap_or("obj-"),
                        inner.uid
                    );
                    obj["metadata"]["name"] = json!(n);
                    n
                }
            };
            if inner.objects.contains_key(&key(&n)) {
                return status(
                    409,
                    "AlreadyExists",
                    format!("{plural} \"{n}\" already exists"),
                );
            }
            inner.put(&prefix, &ns, &plural, obj);
            let stored = inner.objects.get(&key(&n)).cloned().unwrap_or_default();
            (
                StatusCode::CREATED,
                [("content-type", "application/json")],
                stored.to_string(),
            )
                .into_response()
        }
        ("PUT", Some(n)) => {
            let Some(existing) = inner.objects.get(&key(&n)).cloned() else {
                return status(404, "NotFound", format!("{plural} \"{n}\" not found"));
            };
            if body_v["metadata"]["resourceVersion"] != existing["metadata"]["resourceVersion"] {
                return status(409, "Conflict", "the object has been modified".into());
            }
            let mut obj = body_v;
            obj["metadata"]["uid"] = existing["metadata"]["uid"].clone();
            obj["metadata"]["resourceVersion"] = json!(inner.next_rv());
            inner.objects.insert(key(&n), obj.clone());
            ok(&obj)
        }
        ("PATCH", Some(n)) => {
            let manager = query.get("fieldManager").cloned().unwrap_or_default();
            let existing = inner.objects.get(&key(&n)).cloned();
            let mut patch = body_v;
            normalise(&mut patch);
            let obj = match (existing, sub) {
                (None, Some(_)) => {
                    return status(404, "NotFound", format!("{plural} \"{n}\" not found"))
                }
                (Some(mut cur), Some("status")) => {
                    let before = cur.clone();
                    if content_type.contains("apply-patch") {
                        cur["status"] = patch["status"].clone();
                    } else {
                        merge(&mut cur["status"], &patch["status"]);
                    }
                    if cur != before {
                        cur["metadata"]["resourceVersion"] = json!(inner.next_rv());
                    }
                    cur
                }
                (None, _) => {
                    inner.uid += 1;
                    let mut obj = patch;
                    obj["metadata"]["uid"] = json!(format!("uid-{}", inner.uid));
                    obj["metadata"]["resourceVersion"] = json!(inner.next_rv());
                    obj["metadata"]["generation"] = json!(1);
                    obj["metadata"]["creationTimestamp"] = json!("2026-11-30T00:00:00Z");
                    obj["metadata"]["managedFields"] =
                        json!([{ "manager": manager, "operation": "Apply" }]);
                    obj
                }
                (Some(cur), _) => {
                    let mut next = cur.clone();
                    if let Some(s) = patch.as_object_mut() {
                        s.remove("status");
                    }
                    merge(&mut next, &patch);
                    if next != cur {
                        next["metadata"]["resourceVersion"] = json!(inner.next_rv());
                        if next.get("spec") != cur.get("spec") {
                            let g = cur["metadata"]["generation"].as_i64().unwrap_or(1);
                            next["metadata"]["generation"] = json!(g + 1);
                        }
                    }
                    next
                }
            };
            inner.objects.insert(key(&n), obj.clone());
            ok(&obj)
        }
        _ => status(405, "MethodNotAllowed", format!("{method} {path}")),
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl ApiServer {
    /// Serve on 127.0.0.1 and return a client for it.
    pub async fn start() -> (ApiServer, kube::Client) {
        let server = ApiServer::default();
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(server.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        config.default_namespace = "default".into();
        let client = kube::Client::try_from(config).unwrap();
        (server, client)
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }
}
