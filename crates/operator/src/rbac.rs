//! The permissions the operator's code uses, one line per API call site kind. The chart's
//! RBAC (`charts/ankusa/templates/rbac.yaml`) grants exactly these; a test renders the chart
//! and compares, so a new call without a grant (or a grant without a call) fails the build.

/// (API group, resource, verbs) granted cluster-wide.
pub const CLUSTER_RULES: &[(&str, &str, &[&str])] = &[
    // controller: the watch of Relays.
    ("ankusa.dev", "relays", &["get", "list", "watch"]),
    // controller::apply::write_status: server-side apply of the status subresource.
    ("ankusa.dev", "relays/status", &["patch"]),
    // Owned objects carry a controller owner reference with blockOwnerDeletion, which a
    // server enforcing owner-reference permissions allows only with this.
    ("ankusa.dev", "relays/finalizers", &["update"]),
    // controller::observe + apply::apply_owned + the owned-object watches. Server-side apply that
    // creates an object is authorised as `create`.
    // ...and apply::stop_one_pod: a node restore deletes the StatefulSet with its pods
    // orphaned, then the one pod it restores.
    (
        "apps",
        "statefulsets",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    ("", "services", &["get", "list", "watch", "create", "patch"]),
    // Owned ConfigMaps, and the user's configMapRef.
    (
        "",
        "configmaps",
        &["get", "list", "watch", "create", "patch"],
    ),
    (
        "policy",
        "poddisruptionbudgets",
        &["get", "list", "watch", "create", "patch"],
    ),
    // controller::ensure_token: the operator's own token Secret.
    ("", "secrets", &["get", "create", "patch"]),
    // controller::observe: the Relay's pods; probe_format: the probe Job's pod (its
    // termination message).
    ("", "pods", &["list", "delete"]),
    // controller::observe: the nodes' volume claims (those that outlived a scale-down are
    // backed up before an upgrade); controller::apply::create_claims: a bootstrap's data
    // claims, made before the StatefulSet so they can be restored into;
    // controller::expand: a data claim grown to spec.storage.size.
    ("", "persistentvolumeclaims", &["list", "create", "patch"]),
    // controller::expand: whether the claims' StorageClass allows volume expansion.
    ("storage.k8s.io", "storageclasses", &["get"]),
    // controller::observe::observe_jobs + apply::create_job: image probe and backup Jobs.
    ("batch", "jobs", &["list", "watch", "create", "patch"]),
    // The deletes: an optional object no longer asked for (a ServiceMonitor whose
    // monitoring was turned off, an Ingress, HTTPRoute or NetworkPolicy taken out of the
    // spec), by controller::apply::apply_owned.
    (
        "monitoring.coreos.com",
        "servicemonitors",
        &["get", "create", "patch", "delete"],
    ),
    (
        "networking.k8s.io",
        "ingresses",
        &["get", "create", "patch", "delete"],
    ),
    (
        "networking.k8s.io",
        "networkpolicies",
        &["get", "create", "patch", "delete"],
    ),
    (
        "gateway.networking.k8s.io",
        "httproutes",
        &["get", "create", "patch", "delete"],
    ),
    // controller::events::event: events.k8s.io/v1 Events (a repeat is a patch of its series).
    ("events.k8s.io", "events", &["create", "patch"]),
    // controller::observe::observe_create_failures: the StatefulSet's and Jobs'
    // `FailedCreate` Events (core/v1, read by their involved object's fields); and
    // controller::claim::observe_refusals: other installs' refusals of a Relay.
    ("", "events", &["list"]),
    // controller::claim: whether the install a Relay names renews its Lease.
    ("coordination.k8s.io", "leases", &["get"]),
];

/// (API group, resource, verbs) granted in the operator's own namespace.
pub const LEADER_RULES: &[(&str, &str, &[&str])] = &[(
    "coordination.k8s.io",
    "leases",
    &["get", "create", "update"],
)];
