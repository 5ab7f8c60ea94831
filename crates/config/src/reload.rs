//! What a running node reloads (SIGHUP, or its file changing) and what needs a restart.
//! The node applies the first ([`RELOADABLE`]); the operator rolls the pods only for the
//! rest ([`restart_part`]), so a change of sources, sinks, routes or tokens reaches the
//! nodes through their ConfigMap volume without a restart.

/// The keys a running node reloads, as dotted paths.
pub const RELOADABLE: [&str; 5] = [
    "sources",
    "sinks",
    "routes",
    "admin.tokens",
    "ingest.body_limit_bytes",
];

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
}
