//! What a running node reloads (SIGHUP, or its file changing) and what needs a restart.
//! The node applies the first ([`RELOADABLE`]); the operator rolls the pods only for the
//! rest ([`restart_part`]), so a change of sources, sinks, routes, tokens or `tenants.max`
//! reaches the nodes through their ConfigMap volume without a restart.

/// The keys a running node reloads, as dotted paths.
pub const RELOADABLE: [&str; 8] = [
    "sources",
    "sinks",
    "routes",
    "admin.tokens",
    "pull",
    "ingest.body_limit_bytes",
    "tenants.limits",
    "tenants.max",
];

/// Sets reloadable `key` of `into` to `from`'s: the one place each key of [`RELOADABLE`]
/// is named as a field.
fn copy_key(into: &mut crate::Config, from: &crate::Config, key: &str) {
    match key {
        "sources" => into.sources = from.sources.clone(),
        "sinks" => into.sinks = from.sinks.clone(),
        "routes" => into.routes = from.routes.clone(),
        "admin.tokens" => into.admin.tokens = from.admin.tokens.clone(),
        "pull" => into.pull = from.pull.clone(),
        "ingest.body_limit_bytes" => into.ingest.body_limit_bytes = from.ingest.body_limit_bytes,
        "tenants.limits" => into.tenants.limits = from.tenants.limits,
        "tenants.max" => into.tenants.max = from.tenants.max,
        other => unreachable!("{other} is not in RELOADABLE"),
    }
}

/// `config` with every reloadable key of `from`: equal to `from` when only reloadable
/// keys differ.
pub fn with_reloadables_of(config: &crate::Config, from: &crate::Config) -> crate::Config {
    let mut c = config.clone();
    for key in RELOADABLE {
        copy_key(&mut c, from, key);
    }
    c
}

/// The reloadable keys whose values differ between `a` and `b`.
pub fn changed(a: &crate::Config, b: &crate::Config) -> Vec<&'static str> {
    RELOADABLE
        .into_iter()
        .filter(|key| {
            let mut c = a.clone();
            copy_key(&mut c, b, key);
            c != *a
        })
        .collect()
}

/// A configuration document (JSON form) without its reloadable keys: what changing needs a
/// restart.
pub fn restart_part(doc: &serde_json::Value) -> serde_json::Value {
    let mut out = doc.clone();
    for key in RELOADABLE {
        let (parent, leaf) = key
            .rsplit_once('.')
            .map_or((None, key), |(p, l)| (Some(p), l));
        let holder = match parent {
            None => Some(&mut out),
            Some(p) => out.get_mut(p),
        };
        if let Some(serde_json::Value::Object(m)) = holder {
            m.remove(leaf);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restart_part_leaves_out_every_reloadable_key() {
        let doc = serde_json::json!({
            "data_dir": "/d",
            "sources": [{"id": "a"}], "sinks": [], "routes": [],
            "admin": {"tokens": [{"name": "t"}], "max_page": 5},
            "ingest": {"body_limit_bytes": 9, "listen": "[::]:8080"},
        });
        assert_eq!(
            restart_part(&doc),
            serde_json::json!({
                "data_dir": "/d",
                "admin": {"max_page": 5},
                "ingest": {"listen": "[::]:8080"},
            })
        );
        // What the configuration does not say is not added.
        assert_eq!(restart_part(&serde_json::json!({})), serde_json::json!({}));
    }

    /// The typed copy and the JSON form name the same keys: two configurations that differ
    /// in every reloadable key have the same restart part, and each key is seen to change.
    #[test]
    fn the_typed_and_the_json_forms_name_the_same_keys() {
        let load = |text: &str| crate::Config::from_yaml(text, Vec::new()).unwrap();
        let a = load("data_dir: /d\n");
        let b = load(
            "data_dir: /d\n\
             ingest: { body_limit_bytes: 4096 }\n\
             admin: { tokens: [{ name: t, secret: { value: 0123456789abcdef }, scope: admin }] }\n\
             sinks: [{ id: s, url: \"http://127.0.0.1:9/\" }]\n\
             routes: [{ id: r, sinks: [s] }]\n\
             sources: [{ id: a, verify: { scheme: none }, route: r }]\n\
             tenants: { limits: { queued_bytes: 1048576 }, max: 7 }\n\
             pull: { max_claim: 10 }\n",
        );
        assert_eq!(with_reloadables_of(&a, &b), b);
        assert_eq!(changed(&a, &b), RELOADABLE);
        let json = |c: &crate::Config| restart_part(&serde_json::to_value(c).unwrap());
        assert_eq!(json(&a), json(&b));
    }
}
