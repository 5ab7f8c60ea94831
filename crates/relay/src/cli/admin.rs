//! `admin …`: the admin API of one node, or of every node of a Relay merged
//! ([`super::client`]). Each command reads the API's typed bodies (`ankusa_api::admin`),
//! merges them with their [`Merge`], and prints the result as JSON (`--json`) or a table.

use std::process::ExitCode;

use hyper::Method;
use serde::Serialize;

use super::backup::backup_pull;
use super::client::{
    self as c, body, fold, is_code, json_cell, opt_cell, table, time_cell, Nodes, NodesOut,
    TenantRow, TenantsOut,
};
use super::listing::{self, Cursor, Listing, Position, QuarantineRow};
use super::{AdminCommand, DlqCommand, HooksCommand, QuarantineCommand, TenantCommand};
use ankusa_api::admin::{
    Deleted, DlqItem, DlqPage, EraseState, HookOut, LimitsView, Overrides, PauseState, PurgeReport,
    QuarantinePage, QuarantineReplayRequest, QuarantineReplayed, ReplayRequest, Retried,
    RetryRequest, Revived, TenantView, TenantsTop,
};
use ankusa_api::error::ErrorCode;
use ankusa_api::merge::Merge;

/// What a command prints.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Answer {
    Nodes(NodesOut),
    Tenants(TenantsOut),
    Tenant(TenantRow),
    Dlq(Listing<DlqItem>),
    Quarantine(Listing<QuarantineRow>),
    Hook(Box<HookOut>),
    /// A report of what the call did (summed over the nodes): printed field by field.
    Report(serde_json::Value),
    /// An answer printed as its JSON.
    Json(serde_json::Value),
}

/// `admin …`: one call per node, merged.
pub(super) fn admin(
    urls: &[String],
    all_addresses: bool,
    token: &str,
    json_out: bool,
    timeout: std::time::Duration,
    command: AdminCommand,
) -> anyhow::Result<ExitCode> {
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
    let out = rt.block_on(answer(&nodes, &command))?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", text(&out, ankusa_keyspace::now_ms()));
    }
    Ok(ExitCode::SUCCESS)
}

/// Each node's page of a listing (`None`: a node at its end, not asked), at once.
async fn pages<T: serde::de::DeserializeOwned>(
    nodes: &Nodes,
    path: impl Fn(usize) -> Option<String>,
) -> anyhow::Result<Vec<Option<T>>> {
    let calls = (0..nodes.urls.len()).map(|i| {
        let p = path(i);
        async move {
            match p {
                Some(p) => nodes.call(i, Method::GET, &p, None).await.map(Some),
                None => Ok(None),
            }
        }
    });
    futures_util::future::join_all(calls)
        .await
        .into_iter()
        .collect()
}

/// `dlq list`: a page of every node's dead rows, merged, with the cursor of the next.
async fn dlq_list(nodes: &Nodes, command: &AdminCommand) -> anyhow::Result<Listing<DlqItem>> {
    let AdminCommand::Dlq {
        command:
            DlqCommand::List {
                tenant,
                source,
                window,
                limit,
                before,
            },
    } = command
    else {
        unreachable!("dlq_list is called for dlq list");
    };
    let (from_ms, to_ms) = window.ms(ankusa_keyspace::now_ms())?;
    let mut query = format!("limit={limit}");
    if let Some(t) = tenant {
        query.push_str(&format!("&tenant={}", c::q(t)));
    }
    if let Some(s) = source {
        query.push_str(&format!("&source={}", c::q(s)));
    }
    if let Some(f) = from_ms {
        query.push_str(&format!("&from_ms={f}"));
    }
    // `to_ms` only starts a node's first page: its cursor goes on from there.
    let cursor = Cursor::parse(before.as_deref().unwrap_or(""), nodes.urls.len())?;
    let path = |i: usize| match cursor.of(i) {
        Position::End => None,
        Position::Newest => Some(match to_ms {
            Some(t) => format!("/v1/dlq?{query}&to_ms={t}"),
            None => format!("/v1/dlq?{query}"),
        }),
        Position::Before(b) => Some(format!("/v1/dlq?{query}&before={}", c::q(b))),
    };
    let pages: Vec<Option<DlqPage>> = pages(nodes, path).await?;
    Ok(listing::merge_dlq(pages, &cursor, *limit))
}

/// What `purge --dry-run` says a purge would remove: the due rows (pending and scheduled)
/// and dead rows of the kinds named; rows in flight are never purged.
#[derive(Debug, Serialize)]
struct PurgePreview {
    dry_run: bool,
    due: i64,
    dead: i64,
    inflight_kept: i64,
}

/// `purge T --confirm T`: the purge on every node that holds the tenant; with `--dry-run`,
/// what it would remove, from the tenant's counters summed over the nodes.
async fn purge(
    nodes: &Nodes,
    tenant: &str,
    kinds: &str,
    confirm: Option<&str>,
    dry_run: bool,
) -> anyhow::Result<Answer> {
    let (mut due, mut dead) = (false, false);
    for k in kinds.split(',').map(str::trim) {
        match k {
            "pending" => due = true,
            "dead" => dead = true,
            _ => anyhow::bail!("--kinds {kinds:?}: the kinds are pending and dead"),
        }
    }
    if dry_run {
        let counters = tenant_row(nodes, tenant).await?.view.counters;
        return report(Some(PurgePreview {
            dry_run: true,
            due: if due {
                counters.pending + counters.scheduled
            } else {
                0
            },
            dead: if dead { counters.dead } else { 0 },
            inflight_kept: counters.inflight,
        }));
    }
    let confirm = confirm.unwrap_or_default();
    anyhow::ensure!(
        confirm == tenant,
        "--confirm {confirm:?} is not {tenant:?}: a purge cannot be undone"
    );
    let path = format!("/v1/tenants/{}/queue?kinds={}", c::q(tenant), c::q(kinds));
    report(fold(
        knowing::<PurgeReport>(nodes, Method::DELETE, &path, None).await?,
    ))
}

/// A report for printing: what the nodes' answers add up to.
fn report(folded: Option<impl Serialize>) -> anyhow::Result<Answer> {
    Ok(Answer::Report(serde_json::to_value(folded)?))
}

/// The command's calls, and their answers merged.
async fn answer(nodes: &Nodes, command: &AdminCommand) -> anyhow::Result<Answer> {
    let n = nodes.urls.len();
    Ok(match command {
        AdminCommand::Node => {
            let all = nodes.all(Method::GET, "/v1/node", None).await?;
            Answer::Nodes(c::merge_nodes(&nodes.urls, all))
        }
        AdminCommand::Tenants { top } => {
            let path = format!("/v1/tenants?top={top}");
            let all: Vec<TenantsTop> = nodes.all(Method::GET, &path, None).await?;
            Answer::Tenants(c::merge_tenants(all, *top))
        }
        AdminCommand::Tenant {
            command: Some(TenantCommand::Erase { tenant, confirm }),
            ..
        } => {
            anyhow::ensure!(
                confirm == tenant,
                "--confirm {confirm:?} is not {tenant:?}: an erase cannot be undone"
            );
            let path = format!("/v1/tenants/{}?confirm={}", c::q(tenant), c::q(confirm));
            report(fold(
                knowing::<EraseState>(nodes, Method::DELETE, &path, None).await?,
            ))?
        }
        AdminCommand::Tenant {
            tenant: None,
            command: None,
        } => {
            anyhow::bail!("name a tenant: `admin tenant T`, or `admin tenant erase T --confirm T`")
        }
        AdminCommand::Tenant {
            tenant: Some(tenant),
            ..
        } => Answer::Tenant(tenant_row(nodes, tenant).await?),
        AdminCommand::Dlq {
            command: DlqCommand::List { .. },
        } => Answer::Dlq(dlq_list(nodes, command).await?),
        AdminCommand::Dlq {
            command:
                DlqCommand::Replay {
                    ids,
                    tenant,
                    source,
                    window,
                    limit,
                    dry_run,
                },
        } => {
            let (from_ms, to_ms) = window.ms(ankusa_keyspace::now_ms())?;
            let filter = ReplayRequest {
                ids: Vec::new(),
                tenant: tenant.clone(),
                source: source.clone(),
                from_ms,
                to_ms,
                limit: *limit,
                dry_run: *dry_run,
            };
            report(fold(replay(nodes, ids, filter).await?))?
        }
        AdminCommand::Purge {
            tenant,
            kinds,
            confirm,
            dry_run,
        } => purge(nodes, tenant, kinds, confirm.as_deref(), *dry_run).await?,
        AdminCommand::Retry { tenant, sink, hook } => {
            let path = format!("/v1/tenants/{}/retry", c::q(tenant));
            let req = RetryRequest {
                sink: sink.clone(),
                hook_id: hook.clone(),
                limit: None,
            };
            let b = body(&req)?;
            report(fold(
                knowing::<Retried>(nodes, Method::POST, &path, Some(&b)).await?,
            ))?
        }
        AdminCommand::Pause { tenant } | AdminCommand::Resume { tenant } => {
            let verb = match command {
                AdminCommand::Pause { .. } => "pause",
                _ => "resume",
            };
            let path = format!("/v1/tenants/{}/{verb}", c::q(tenant));
            report(fold(
                knowing::<PauseState>(nodes, Method::POST, &path, None).await?,
            ))?
        }
        AdminCommand::Limits { tenant, set, clear } => {
            let path = format!("/v1/tenants/{}/limits", c::q(tenant));
            let answers: Vec<LimitsView> = if *clear {
                nodes.all(Method::DELETE, &path, None).await?
            } else if !set.is_empty() {
                let b = body(&overrides(set)?)?;
                nodes.all(Method::PUT, &path, Some(&b)).await?
            } else {
                nodes.all(Method::GET, &path, None).await?
            };
            report(fold(answers))?
        }
        AdminCommand::Endpoints { command } => {
            Answer::Json(super::endpoints::answer(nodes, command).await?)
        }
        AdminCommand::Quarantine {
            command: QuarantineCommand::List { limit, before },
        } => {
            let cursor = Cursor::parse(before.as_deref().unwrap_or(""), n)?;
            let path = |i: usize| match cursor.of(i) {
                Position::End => None,
                Position::Newest => Some(format!("/v1/quarantine?limit={limit}")),
                Position::Before(b) => {
                    Some(format!("/v1/quarantine?limit={limit}&before={}", c::q(b)))
                }
            };
            let pages: Vec<Option<QuarantinePage>> = pages(nodes, path).await?;
            Answer::Quarantine(listing::merge_quarantine(pages, &cursor, *limit))
        }
        AdminCommand::Quarantine {
            command: QuarantineCommand::Replay { .. },
        } => report(fold(quarantine_replay(nodes, command).await?))?,
        AdminCommand::Quarantine {
            command: QuarantineCommand::Delete { id },
        } => {
            let deleted: Vec<Deleted> = match id {
                Some(id) => {
                    let (node, own) = c::split_id(id, n)?;
                    let path = format!("/v1/quarantine?id={}", c::q(&own));
                    vec![nodes.call(node, Method::DELETE, &path, None).await?]
                }
                None => nodes.all(Method::DELETE, "/v1/quarantine", None).await?,
            };
            report(fold(deleted))?
        }
        AdminCommand::Hooks {
            command: HooksCommand::Get { id, body },
        } => Answer::Hook(Box::new(hook(nodes, id, *body).await?)),
        AdminCommand::Backup { .. } => anyhow::bail!("a backup is pulled, not merged"),
    })
}

/// One tenant's views over the nodes that hold it, added up.
async fn tenant_row(nodes: &Nodes, tenant: &str) -> anyhow::Result<TenantRow> {
    let path = format!("/v1/tenants/{}", c::q(tenant));
    let mut views = Vec::new();
    for i in 0..nodes.urls.len() {
        // A node that never saw the tenant answers 404: not an error here.
        match nodes.call::<TenantView>(i, Method::GET, &path, None).await {
            Ok(v) => views.push((i, v)),
            Err(e) if is_code(&e, ErrorCode::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    c::merge_tenant(views).ok_or_else(|| anyhow::anyhow!("no node holds tenant {tenant:?}"))
}

/// A replay on every node (the DLQ's, the quarantine's): each id (`<node>/<id>`, the
/// node's own read by `own`) goes to the node it names, and a node given none of an id
/// replay has nothing to do; without ids, `request(vec![])` goes to every node.
async fn per_node<I, Q: Serialize, A: serde::de::DeserializeOwned>(
    nodes: &Nodes,
    path: &str,
    ids: &[String],
    own: impl Fn(&str, String) -> anyhow::Result<I>,
    request: impl Fn(Vec<I>) -> Q,
) -> anyhow::Result<Vec<A>> {
    let n = nodes.urls.len();
    let mut by_node: Vec<Vec<I>> = (0..n).map(|_| Vec::new()).collect();
    for id in ids {
        let (node, o) = c::split_id(id, n)?;
        by_node[node].push(own(id, o)?);
    }
    let mut answers = Vec::new();
    for (i, ids_here) in by_node.into_iter().enumerate() {
        if !ids.is_empty() && ids_here.is_empty() {
            continue;
        }
        let b = body(&request(ids_here))?;
        answers.push(nodes.call(i, Method::POST, path, Some(&b)).await?);
    }
    Ok(answers)
}

/// A DLQ replay on every node: by `ids` (`<node>/<id>`), or by `filter`'s selection.
async fn replay(
    nodes: &Nodes,
    ids: &[String],
    filter: ReplayRequest,
) -> anyhow::Result<Vec<Revived>> {
    let own = |_: &str, o: String| Ok(o);
    per_node(nodes, "/v1/dlq/replay", ids, own, |ids| ReplayRequest {
        ids,
        ..filter.clone()
    })
    .await
}

/// A quarantine replay on every node: by ids (`<node>/<id>`, each node given its own), or
/// by the command's selection.
async fn quarantine_replay(
    nodes: &Nodes,
    command: &AdminCommand,
) -> anyhow::Result<Vec<QuarantineReplayed>> {
    let AdminCommand::Quarantine {
        command:
            QuarantineCommand::Replay {
                ids,
                source,
                reason,
                window,
                limit,
                dry_run,
            },
    } = command
    else {
        unreachable!("quarantine_replay is called for quarantine replay");
    };
    let (from_ms, to_ms) = window.ms(ankusa_keyspace::now_ms())?;
    let filter = QuarantineReplayRequest {
        ids: Vec::new(),
        source: source.clone(),
        reason: reason.clone(),
        from_ms,
        to_ms,
        limit: *limit,
        dry_run: *dry_run,
    };
    let own = |id: &str, o: String| {
        o.parse::<u64>()
            .map_err(|_| anyhow::anyhow!("{id:?}: a quarantined request's id is <node>/<number>"))
    };
    per_node(nodes, "/v1/quarantine/replay", ids, own, |ids| {
        QuarantineReplayRequest {
            ids,
            ..filter.clone()
        }
    })
    .await
}

/// Hook `id` from whichever node's log has it.
async fn hook(nodes: &Nodes, id: &str, with_body: bool) -> anyhow::Result<HookOut> {
    let path = format!("/v1/hooks/{}?body={with_body}", c::q(id));
    for i in 0..nodes.urls.len() {
        // A node whose log does not have the hook answers 404: ask the next.
        match nodes.call::<HookOut>(i, Method::GET, &path, None).await {
            Ok(h) => return Ok(h),
            Err(e) if is_code(&e, ErrorCode::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    anyhow::bail!("no node's hook log has hook {id:?}")
}

/// Every answer to one call from the nodes that know its tenant (a 404 is "not here").
async fn knowing<T: serde::de::DeserializeOwned + Merge>(
    nodes: &Nodes,
    method: Method,
    path: &str,
    body: Option<&bytes::Bytes>,
) -> anyhow::Result<Vec<T>> {
    let mut answers = Vec::new();
    for i in 0..nodes.urls.len() {
        match nodes.call(i, method.clone(), path, body).await {
            Ok(v) => answers.push(v),
            Err(e) if is_code(&e, ErrorCode::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(answers)
}

/// A tenant's own limits from `KEY=VALUE` pairs (`none`: lift the default).
fn overrides(pairs: &[String]) -> anyhow::Result<Overrides> {
    fn value<T: std::str::FromStr>(p: &str, v: &str) -> anyhow::Result<Option<T>> {
        if v == "none" {
            return Ok(None);
        }
        v.parse()
            .map(Some)
            .map_err(|_| anyhow::anyhow!("--set {p:?}: {v:?} is not a number or none"))
    }
    let mut o = Overrides::default();
    for p in pairs {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--set {p:?}: expected KEY=VALUE"))?;
        match k {
            "ingest_per_second" => o.ingest_per_second = Some(value(p, v)?),
            "ingest_burst" => o.ingest_burst = Some(value(p, v)?),
            "queued_bytes" => o.queued_bytes = Some(value(p, v)?),
            "archive_bytes" => o.archive_bytes = Some(value(p, v)?),
            _ => anyhow::bail!(
                "--set {p:?}: {k:?} is not a limit (ingest_per_second, ingest_burst, queued_bytes, archive_bytes)"
            ),
        }
    }
    Ok(o)
}

/// The line under a listing that says how to read on, when there is more.
fn next_page(next: Option<&str>) -> String {
    match next {
        Some(n) => format!("next page: --before {n}\n"),
        None => String::new(),
    }
}

/// What a command prints without `--json`.
fn text(out: &Answer, now: u64) -> String {
    match out {
        Answer::Nodes(n) => nodes_text(n),
        Answer::Tenants(t) => format!(
            "{}{} tenants in all; these {} have work, the most pending first\n",
            tenants_text(&t.tenants.iter().collect::<Vec<_>>(), now),
            t.total,
            t.tenants.len()
        ),
        Answer::Tenant(t) => tenants_text(&[t], now),
        Answer::Json(v) => format!("{}\n", serde_json::to_string_pretty(v).unwrap_or_default()),
        Answer::Dlq(l) => {
            let rows: Vec<Vec<String>> = l
                .items
                .iter()
                .map(|i| {
                    vec![
                        i.id.clone(),
                        i.tenant.clone(),
                        time_cell(Some(i.at_ms), now),
                        i.hook_id.clone(),
                        i.source.clone(),
                        i.sink.clone(),
                        i.attempts.to_string(),
                        i.last_error.clone(),
                    ]
                })
                .collect();
            let h = [
                "id",
                "tenant",
                "at",
                "hook_id",
                "source",
                "sink",
                "attempts",
                "last_error",
            ];
            table(&h, &rows) + &next_page(l.next.as_deref())
        }
        Answer::Quarantine(l) => {
            let rows: Vec<Vec<String>> = l
                .items
                .iter()
                .map(|q| {
                    vec![
                        q.id.clone(),
                        q.source.clone(),
                        q.tenant.clone().unwrap_or_else(|| "-".into()),
                        time_cell(Some(q.at_ms), now),
                        q.reason.clone(),
                        q.detail.clone(),
                    ]
                })
                .collect();
            let h = ["id", "source", "tenant", "at", "reason", "detail"];
            table(&h, &rows) + &next_page(l.next.as_deref())
        }
        Answer::Hook(h) => hook_text(h, now),
        Answer::Report(v) => {
            let rows: Vec<Vec<String>> = v
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| vec![k.clone(), json_cell(v)])
                .collect();
            table(&["field", "value"], &rows)
        }
    }
}

const COUNTERS: [&str; 5] = ["pending", "scheduled", "inflight", "dead", "bytes"];

/// The five counters a table shows.
fn counter_cells(c: &ankusa_api::node::Counters) -> [String; 5] {
    [c.pending, c.scheduled, c.inflight, c.dead, c.bytes].map(|n| n.to_string())
}

fn nodes_text(out: &NodesOut) -> String {
    let mut rows: Vec<Vec<String>> = out
        .nodes
        .iter()
        .map(|n| {
            let mut r = vec![
                n.node.to_string(),
                n.url.clone(),
                n.status.version.clone(),
                n.status.store_format.to_string(),
                n.status.tenants.to_string(),
            ];
            r.extend(counter_cells(&n.status.counters));
            r
        })
        .collect();
    let mut total = vec![
        "all".to_owned(),
        String::new(),
        String::new(),
        String::new(),
    ];
    total.push(String::new());
    total.extend(counter_cells(&out.counters));
    rows.push(total);
    let mut h = vec!["node", "url", "version", "format", "tenants"];
    h.extend(COUNTERS);
    table(&h, &rows)
}

fn tenants_text(list: &[&TenantRow], now: u64) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|t| {
            let mut r = vec![t.view.tenant.clone()];
            r.extend(counter_cells(&t.view.counters));
            r.push(format!("{:?}", t.nodes));
            r.push(match t.view.paused_since_ms {
                Some(ms) => c::when(ms, now),
                None => String::new(),
            });
            r
        })
        .collect();
    let mut h = vec!["tenant"];
    h.extend(COUNTERS);
    h.push("nodes");
    h.push("paused");
    table(&h, &rows)
}

/// A hook from the hook log as text: its fields, a line per sink, a line per event, and
/// the body if it was asked for.
fn hook_text(h: &HookOut, now: u64) -> String {
    let mut out = String::new();
    let mut field = |name: &str, value: String| out.push_str(&format!("{name:<13} {value}\n"));
    field("id", h.id.clone());
    field("tenant", h.tenant.clone());
    field("source", h.source.clone());
    field("received", time_cell(Some(h.received_ms), now));
    field("size", h.size.to_string());
    field("content_type", h.content_type.clone());
    field("stored", h.stored.to_string());
    if let Some(ms) = h.tenant_paused_since_ms {
        field("tenant_paused_since", time_cell(Some(ms), now));
    }
    for (name, value) in &h.headers {
        out.push_str(&format!("header        {name}: {value}\n"));
    }
    out.push('\n');
    let sinks: Vec<Vec<String>> = h
        .sinks
        .iter()
        .map(|s| {
            vec![
                s.sink.clone(),
                wire_name(&s.state),
                s.attempts.to_string(),
                time_cell(s.next_attempt_ms, now),
            ]
        })
        .collect();
    out.push_str(&table(
        &["sink", "state", "attempts", "next_attempt"],
        &sinks,
    ));
    // Each event with its sink's name, for one table of every sink's timeline.
    let events: Vec<Vec<String>> = h
        .sinks
        .iter()
        .flat_map(|s| s.events.iter().map(move |e| (s, e)))
        .map(|(s, e)| {
            vec![
                s.sink.clone(),
                wire_name(&e.kind),
                time_cell(Some(e.at_ms), now),
                e.attempt.to_string(),
                e.outcome.as_ref().map_or_else(|| "-".into(), wire_name),
                opt_cell(e.status),
                if e.error.is_empty() {
                    "-".into()
                } else {
                    e.error.clone()
                },
                opt_cell(e.latency_ms),
                time_cell(e.next_attempt_ms(), now),
            ]
        })
        .collect();
    if !events.is_empty() {
        out.push('\n');
        let h = [
            "sink",
            "kind",
            "at",
            "attempt",
            "outcome",
            "status",
            "error",
            "latency_ms",
            "next_at",
        ];
        out.push_str(&table(&h, &events));
    }
    match (&h.body, &h.body_base64) {
        (Some(b), _) => out.push_str(&format!("\nbody:\n{b}\n")),
        (None, Some(b)) => out.push_str(&format!("\nbody (base64):\n{b}\n")),
        (None, None) => {}
    }
    out
}

/// The wire name of an enum value of the API, as its JSON writes it (`dead`, `acked`).
fn wire_name(v: &impl Serialize) -> String {
    json_cell(&serde_json::to_value(v).unwrap_or_default())
}
