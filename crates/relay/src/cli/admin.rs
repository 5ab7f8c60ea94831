//! `admin …`: the admin API of one node, or of every node of a Relay merged
//! (`admin::client`).

use std::process::ExitCode;

use super::{AdminCommand, DlqCommand, HooksCommand, QuarantineCommand, TenantCommand};

use super::backup::backup_pull;

/// `admin …`: one call per node, merged.
pub(super) fn admin(
    urls: &[String],
    all_addresses: bool,
    token: &str,
    json_out: bool,
    timeout: std::time::Duration,
    command: AdminCommand,
) -> anyhow::Result<ExitCode> {
    use crate::admin::client::{self as c, cell, table, Nodes};
    use hyper::Method;
    let rt = tokio::runtime::Runtime::new()?;
    let nodes = rt.block_on(Nodes::resolve(urls, all_addresses, token, timeout))?;
    if let AdminCommand::Backup { to, keep } = &command {
        for url in &nodes.urls {
            let (_, rest) = url.split_once("://").unwrap_or(("", url));
            let dir = to.join(rest.replace([':', '/'], "_"));
            backup_pull(url, token, &dir, *keep, timeout, None)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let out: serde_json::Value = rt.block_on(async {
        anyhow::Ok(match &command {
            AdminCommand::Node => {
                c::merge_nodes(&nodes.urls, nodes.all(Method::GET, "/v1/node", None).await?)
            }
            AdminCommand::Tenants { top } => c::merge_tenants(
                nodes
                    .all(Method::GET, &format!("/v1/tenants?top={top}"), None)
                    .await?,
                *top,
            ),
            AdminCommand::Tenant {
                command: Some(TenantCommand::Erase { tenant, confirm }),
                ..
            } => {
                anyhow::ensure!(
                    confirm == tenant,
                    "--confirm {confirm:?} is not {tenant:?}: an erase cannot be undone"
                );
                let path = format!("/v1/tenants/{}?confirm={}", c::q(tenant), c::q(confirm));
                let answers = knowing(&nodes, Method::DELETE, &path, None).await?;
                let mut sum = c::sum_reports(&answers);
                sum["tenant"] = serde_json::json!(tenant);
                sum
            }
            AdminCommand::Tenant {
                tenant: None,
                command: None,
            } => anyhow::bail!("name a tenant: `admin tenant T`, or `admin tenant erase T --confirm T`"),
            AdminCommand::Tenant {
                tenant: Some(tenant),
                ..
            } => {
                let path = format!("/v1/tenants/{}", c::q(tenant));
                let mut answers = Vec::new();
                for i in 0..nodes.urls.len() {
                    // A node that never saw the tenant answers 404: not an error here.
                    answers.push(match nodes.call(i, Method::GET, &path, None).await {
                        Ok(v) => Some(v),
                        Err(e) if e.to_string().contains(": 404 not_found") => None,
                        Err(e) => return Err(e),
                    });
                }
                c::merge_tenant(tenant, answers)
                    .ok_or_else(|| anyhow::anyhow!("no node holds tenant {tenant:?}"))?
            }
            AdminCommand::Dlq {
                command: DlqCommand::List { tenant, limit },
            } => {
                let mut path = format!("/v1/dlq?limit={limit}");
                if let Some(t) = tenant {
                    path.push_str(&format!("&tenant={}", c::q(t)));
                }
                c::merge_items(nodes.all(Method::GET, &path, None).await?, "at_ms", *limit)
            }
            AdminCommand::Dlq {
                command:
                    DlqCommand::Replay {
                        ids,
                        tenant,
                        source,
                        from_ms,
                        to_ms,
                        limit,
                    },
            } => {
                let filter = serde_json::json!({
                    "tenant": tenant, "source": source, "from_ms": from_ms, "to_ms": to_ms, "limit": limit,
                });
                let mut body: Vec<serde_json::Value> = vec![filter; nodes.urls.len()];
                if !ids.is_empty() {
                    let mut by_node: Vec<Vec<String>> = vec![Vec::new(); nodes.urls.len()];
                    for id in ids {
                        let (n, own) = c::split_id(id, nodes.urls.len())?;
                        by_node[n].push(own);
                    }
                    for (b, own) in body.iter_mut().zip(by_node) {
                        b["ids"] = serde_json::json!(own);
                    }
                }
                let mut answers = Vec::new();
                for (i, b) in body.iter().enumerate() {
                    // A node given no ids of an id replay has nothing to do.
                    if !ids.is_empty() && b["ids"].as_array().is_some_and(|a| a.is_empty()) {
                        continue;
                    }
                    answers.push(nodes.call(i, Method::POST, "/v1/dlq/replay", Some(b)).await?);
                }
                c::sum_reports(&answers)
            }
            AdminCommand::Purge { tenant, kinds } => {
                let path = format!("/v1/tenants/{}/queue?kinds={}", c::q(tenant), c::q(kinds));
                let answers = knowing(&nodes, Method::DELETE, &path, None).await?;
                let mut sum = c::sum_reports(&answers);
                sum["tenant"] = serde_json::json!(tenant);
                sum
            }
            AdminCommand::Retry {
                tenant,
                sink,
                hook,
            } => {
                let path = format!("/v1/tenants/{}/retry", c::q(tenant));
                let body = serde_json::json!({ "sink": sink, "hook_id": hook });
                let answers = knowing(&nodes, Method::POST, &path, Some(&body)).await?;
                let mut sum = c::sum_reports(&answers);
                sum["tenant"] = serde_json::json!(tenant);
                sum
            }
            AdminCommand::Pause { tenant } | AdminCommand::Resume { tenant } => {
                let verb = match &command {
                    AdminCommand::Pause { .. } => "pause",
                    _ => "resume",
                };
                let path = format!("/v1/tenants/{}/{verb}", c::q(tenant));
                let answers = knowing(&nodes, Method::POST, &path, None).await?;
                let mut sum = c::sum_reports(&answers);
                sum["tenant"] = serde_json::json!(tenant);
                sum
            }
            AdminCommand::Limits { tenant, set, clear } => {
                let path = format!("/v1/tenants/{}/limits", c::q(tenant));
                let answers = if *clear {
                    nodes.all(Method::DELETE, &path, None).await?
                } else if !set.is_empty() {
                    let body = c::limits_body(set)?;
                    nodes.all(Method::PUT, &path, Some(&body)).await?
                } else {
                    nodes.all(Method::GET, &path, None).await?
                };
                c::merge_limits(answers)
            }
            AdminCommand::Quarantine {
                command: QuarantineCommand::List { limit },
            } => c::merge_items(
                nodes
                    .all(Method::GET, &format!("/v1/quarantine?limit={limit}"), None)
                    .await?,
                "at_ms",
                *limit,
            ),
            AdminCommand::Quarantine {
                command: QuarantineCommand::Delete { id },
            } => match id {
                Some(id) => {
                    let (n, own) = c::split_id(id, nodes.urls.len())?;
                    let path = format!("/v1/quarantine?id={}", c::q(&own));
                    nodes.call(n, Method::DELETE, &path, None).await?
                }
                None => c::sum_reports(&nodes.all(Method::DELETE, "/v1/quarantine", None).await?),
            },
            AdminCommand::Hooks {
                command: HooksCommand::Get { id, body },
            } => {
                let path = format!("/v1/hooks/{}?body={body}", c::q(id));
                let mut found = None;
                for i in 0..nodes.urls.len() {
                    // A node whose log does not have the hook answers 404: ask the next.
                    match nodes.call(i, Method::GET, &path, None).await {
                        Ok(v) => {
                            found = Some(v);
                            break;
                        }
                        Err(e) if e.to_string().contains(": 404 not_found") => {}
                        Err(e) => return Err(e),
                    }
                }
                found.ok_or_else(|| anyhow::anyhow!("no node's hook log has hook {id:?}"))?
            }
            AdminCommand::Backup { .. } => unreachable!("handled above"),
        })
    })?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    let counters = ["pending", "scheduled", "inflight", "dead", "bytes"];
    let text = match &command {
        AdminCommand::Node => {
            let mut rows: Vec<Vec<String>> = out["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|n| {
                    let mut r = vec![
                        cell(&n["node"]),
                        cell(&n["url"]),
                        cell(&n["version"]),
                        cell(&n["store_format"]),
                        cell(&n["tenants"]),
                    ];
                    r.extend(counters.iter().map(|k| cell(&n["counters"][*k])));
                    r
                })
                .collect();
            let mut total = vec![
                "all".into(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ];
            total.extend(counters.iter().map(|k| cell(&out["counters"][*k])));
            rows.push(total);
            let mut h = vec!["node", "url", "version", "format", "tenants"];
            h.extend(counters);
            table(&h, &rows)
        }
        AdminCommand::Tenants { .. }
        | AdminCommand::Tenant {
            command: None,
            tenant: Some(_),
        } => {
            let list = match &command {
                AdminCommand::Tenant { .. } => vec![out.clone()],
                _ => out["tenants"].as_array().cloned().unwrap_or_default(),
            };
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|t| {
                    let mut r = vec![cell(&t["tenant"])];
                    r.extend(counters.iter().map(|k| cell(&t["counters"][*k])));
                    r.push(cell(&t["nodes"]));
                    r.push(match t["paused_since_ms"].as_u64() {
                        Some(ms) => c::when(ms, ankusa_keyspace::now_ms()),
                        None => String::new(),
                    });
                    r
                })
                .collect();
            let mut h = vec!["tenant"];
            h.extend(counters);
            h.push("nodes");
            h.push("paused");
            table(&h, &rows)
        }
        AdminCommand::Dlq {
            command: DlqCommand::List { .. },
        } => items_table(
            &out,
            &[
                "id",
                "tenant",
                "at_ms",
                "hook_id",
                "source",
                "sink",
                "attempts",
                "last_error",
            ],
        ),
        AdminCommand::Quarantine {
            command: QuarantineCommand::List { .. },
        } => items_table(&out, &["id", "source", "at_ms", "reason"]),
        AdminCommand::Hooks { .. } => hook_text(&out),
        _ => {
            let rows: Vec<Vec<String>> = out
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| vec![k.clone(), cell(v)])
                .collect();
            table(&["field", "value"], &rows)
        }
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// Every answer to one call from the nodes that know its tenant (a 404 is "not here").
async fn knowing(
    nodes: &crate::admin::client::Nodes,
    method: hyper::Method,
    path: &str,
    body: Option<&serde_json::Value>,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut answers = Vec::new();
    for i in 0..nodes.urls.len() {
        match nodes.call(i, method.clone(), path, body).await {
            Ok(v) => answers.push(v),
            Err(e) if e.to_string().contains(": 404 not_found") => {}
            Err(e) => return Err(e),
        }
    }
    Ok(answers)
}

/// A table of `rows`' `columns`, times shown as times.
fn json_table(rows: &[&serde_json::Value], columns: &[&str]) -> String {
    use crate::admin::client::{cell_of, table, time_header};
    let now = ankusa_keyspace::now_ms();
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|i| columns.iter().map(|k| cell_of(k, &i[*k], now)).collect())
        .collect();
    let headers: Vec<&str> = columns.iter().map(|c| time_header(c)).collect();
    table(&headers, &rows)
}

/// A listing's `items` as a table of `columns`.
fn items_table(out: &serde_json::Value, columns: &[&str]) -> String {
    let items: Vec<&serde_json::Value> = out["items"].as_array().into_iter().flatten().collect();
    json_table(&items, columns)
}

/// A hook from the hook log as text: its fields, a line per sink, a line per event, and
/// the body if it was asked for.
pub(super) fn hook_text(h: &serde_json::Value) -> String {
    use crate::admin::client::{cell, cell_of, time_header};
    let now = ankusa_keyspace::now_ms();
    let mut out = String::new();
    for k in [
        "id",
        "tenant",
        "source",
        "received_ms",
        "size",
        "content_type",
        "stored",
        "tenant_paused_since_ms",
    ] {
        if h[k].is_null() {
            continue;
        }
        let name = time_header(k);
        out.push_str(&format!("{name:<13} {}\n", cell_of(k, &h[k], now)));
    }
    for (name, value) in h["headers"].as_object().into_iter().flatten() {
        out.push_str(&format!("header        {name}: {}\n", cell(value)));
    }
    let sinks: Vec<&serde_json::Value> = h["sinks"].as_array().into_iter().flatten().collect();
    out.push('\n');
    out.push_str(&json_table(
        &sinks,
        &["sink", "state", "attempts", "next_attempt_ms"],
    ));
    let cols = [
        "sink",
        "kind",
        "at_ms",
        "attempt",
        "outcome",
        "status",
        "error",
        "latency_ms",
        "next_at_ms",
    ];
    // Each event with its sink's name, for one table of every sink's timeline.
    let events: Vec<serde_json::Value> = sinks
        .iter()
        .flat_map(|s| {
            s["events"].as_array().into_iter().flatten().map(|e| {
                let mut e = e.clone();
                e["sink"] = s["sink"].clone();
                e
            })
        })
        .collect();
    if !events.is_empty() {
        out.push('\n');
        out.push_str(&json_table(&events.iter().collect::<Vec<_>>(), &cols));
    }
    if let Some(b) = h["body"].as_str().or(h["body_base64"].as_str()) {
        out.push_str(&format!(
            "\nbody{}:\n{b}\n",
            if h["body"].is_null() { " (base64)" } else { "" }
        ));
    }
    out
}
