//! The archive (browse, replay), the audit trail and the quarantine (browse, verify again).

use std::fmt::Write;
use std::sync::Arc;

use axum::http::Method;

use super::{body, page, Page};
use crate::console::html::{csrf_field, esc, hidden, plural, table, time_el};
use crate::console::{field, Console, Form, Viewer};
use crate::http::percent_encode as enc;
use ankusa_api::admin::{
    ArchivePage, ArchiveReplayRequest, AuditPage, AuditRecord, QuarantineItem, QuarantinePage,
    QuarantineReplayRequest, QuarantineReplayed, Replayed,
};

pub(super) async fn archive(c: &Arc<Console>, v: &Viewer, q: &Form, fragment: bool) -> Page {
    let tenant = field(q, "tenant")
        .map(str::to_owned)
        .or_else(|| v.portal.clone());
    let base = esc(&v.base);
    let form = format!(
        "<form method=\"get\" action=\"{base}/archive\" class=\"row\"><label for=\"a-tenant\">Tenant</label><input id=\"a-tenant\" name=\"tenant\" value=\"{}\" required><button type=\"submit\">Browse</button></form>",
        esc(tenant.as_deref().unwrap_or(""))
    );
    let Some(t) = tenant else {
        let body = format!("<h1>Archive</h1><p>A tenant's archived hooks, newest first.</p>{form}");
        return Ok(page(v, "Archive", "Archive", body, fragment, false));
    };
    let mut path = format!("/v1/archive?tenant={}&limit=50", enc(&t));
    if let Some(b) = field(q, "before") {
        let _ = write!(path, "&before={}", enc(b));
    }
    let r: ArchivePage = c.call(v, Method::GET, &path, None).await?;
    let csrf = csrf_field(&v.csrf);
    let rows: Vec<Vec<String>> = r
        .items
        .iter()
        .map(|a| {
            vec![
                format!("<code>{}</code>", esc(&a.id)),
                esc(&a.source),
                time_el(a.received_ms),
                time_el(a.expires_ms),
                format!("{} B", a.size),
                format!(
                    "<form method=\"post\" action=\"{base}/archive/replay\" class=\"inline\">{csrf}{}{}<button type=\"submit\" aria-label=\"Replay archived hook {}\">Replay</button></form>",
                    hidden("tenant", &t),
                    hidden("ids", &a.id),
                    esc(&a.id)
                ),
            ]
        })
        .collect();
    let next = r.next.as_deref().map(|n| {
        format!(
            "<p><a rel=\"next\" href=\"{base}/archive?tenant={}&amp;before={}\">Older</a></p>",
            enc(&t),
            enc(n)
        )
    });
    let body = format!(
        "<h1>Archive of {}</h1>{form}{}{}",
        esc(&t),
        table(
            "Archived hooks, newest first",
            &["Hook", "Source", "Received", "Kept until", "Size", "Action"],
            &rows
        ),
        next.unwrap_or_default()
    );
    Ok(page(v, "Archive", "Archive", body, fragment, true))
}

pub(super) async fn archive_replay(c: &Arc<Console>, v: &Viewer, form: &Form) -> Page {
    let tenant = field(form, "tenant")
        .map(str::to_owned)
        .or_else(|| v.portal.clone())
        .unwrap_or_default();
    let ids: Vec<&str> = field(form, "ids")
        .map(|i| i.split(',').map(str::trim).collect())
        .unwrap_or_default();
    let base = esc(&v.base);
    if field(form, "confirm") != Some("yes") {
        let body = format!(
            "<h1>Replay from the archive?</h1><p role=\"status\">{} of {} will be committed again as new hooks and delivered.</p>\
<form method=\"post\" action=\"{base}/archive/replay\" class=\"inline\">{}{}{}{}<button type=\"submit\" autofocus>Replay</button></form> <a href=\"{base}/archive?tenant={}\">Cancel</a>",
            plural(ids.len() as i64, "archived hook"),
            esc(&tenant),
            csrf_field(&v.csrf),
            hidden("tenant", &tenant),
            hidden("ids", &ids.join(",")),
            hidden("confirm", "yes"),
            enc(&tenant),
        );
        return Ok(page(v, "Confirm replay", "Archive", body, false, false));
    }
    let req = ArchiveReplayRequest {
        tenant: tenant.clone(),
        from_ms: None,
        to_ms: None,
        ids: ids.iter().map(|i| (*i).to_owned()).collect(),
        limit: None,
        after: None,
    };
    let r: Replayed = c
        .call(v, Method::POST, "/v1/archive/replay", body(&req))
        .await?;
    let body = format!(
        "<h1>Replayed</h1><p role=\"status\">{} archived hooks committed again.</p><p><a href=\"{base}/archive?tenant={}\">Back to the archive</a></p>",
        r.replayed,
        enc(&tenant)
    );
    Ok(page(v, "Replayed", "Archive", body, false, false))
}

/// A listing the API pages by a numeric `before` (audit, quarantine): 50 rows, the cells
/// `cells` makes of each, and an "Older" link.
#[allow(
    clippy::too_many_arguments,
    reason = "a listing named by its parts; two callers"
)]
async fn cursor_list<P: CursorPage>(
    c: &Arc<Console>,
    v: &Viewer,
    q: &Form,
    fragment: bool,
    (api, page_path, name): (&str, &str, &str),
    (title, intro, caption): (&str, &str, &str),
    headers: &[&str],
    cells: impl Fn(&P::Item) -> Vec<String>,
) -> Page {
    let mut path = format!("{api}?limit=50");
    if let Some(b) = field(q, "before") {
        let _ = write!(path, "&before={}", enc(b));
    }
    let r: P = c.call(v, Method::GET, &path, None).await?;
    let (items, next) = r.parts();
    let rows: Vec<Vec<String>> = items.iter().map(cells).collect();
    let next = next.map(|n| {
        format!(
            "<p><a rel=\"next\" href=\"{}{page_path}?before={n}\">Older</a></p>",
            esc(&v.base)
        )
    });
    let body = format!(
        "<h1>{}</h1>{intro}{}{}",
        esc(title),
        table(caption, headers, &rows),
        next.unwrap_or_default()
    );
    Ok(page(v, name, name, body, fragment, true))
}

/// A page the API cursors by a number: its rows and the next cursor.
trait CursorPage: serde::de::DeserializeOwned {
    type Item;
    fn parts(self) -> (Vec<Self::Item>, Option<u64>);
}

impl CursorPage for AuditPage {
    type Item = AuditRecord;
    fn parts(self) -> (Vec<AuditRecord>, Option<u64>) {
        (self.items, self.next)
    }
}

impl CursorPage for QuarantinePage {
    type Item = QuarantineItem;
    fn parts(self) -> (Vec<QuarantineItem>, Option<u64>) {
        (self.items, self.next)
    }
}

pub(super) async fn audit(c: &Arc<Console>, v: &Viewer, q: &Form, fragment: bool) -> Page {
    cursor_list::<AuditPage>(
        c,
        v,
        q,
        fragment,
        ("/v1/audit", "/audit", "Audit"),
        (
            "Audit trail",
            "",
            "Admin actions on this node, newest first",
        ),
        &["At", "Who", "Action", "Tenant", "Detail"],
        |a| {
            vec![
                time_el(a.at_ms),
                esc(&a.who),
                format!("<code>{}</code>", esc(&a.action)),
                esc(a.tenant.as_deref().unwrap_or("")),
                format!("<code>{}</code>", esc(&a.detail.to_string())),
            ]
        },
    )
    .await
}

pub(super) async fn quarantine(c: &Arc<Console>, v: &Viewer, q: &Form, fragment: bool) -> Page {
    let base = esc(&v.base);
    let csrf = csrf_field(&v.csrf);
    let intro = format!(
        "<p class=\"muted\">Requests that failed verification, kept for inspection. Fixed a source's secret? Verify them again: those that pass are ingested and leave the quarantine.</p>\
<form method=\"post\" action=\"{base}/quarantine/replay\" class=\"inline\">{csrf}<button type=\"submit\">Verify every request again…</button></form>"
    );
    cursor_list::<QuarantinePage>(
        c,
        v,
        q,
        fragment,
        ("/v1/quarantine", "/quarantine", "Quarantine"),
        ("Quarantine", &intro, "Quarantined requests, newest first"),
        &["At", "Source", "Tenant", "Reason", "Headers", ""],
        |e| {
            // One header a line, `name: value`, as a request shows them.
            let headers: Vec<String> = e
                .headers
                .iter()
                .map(|(k, v)| format!("{}: {}", esc(k), esc(v)))
                .collect();
            vec![
                time_el(e.at_ms),
                format!("<code>{}</code>", esc(&e.source)),
                e.tenant.as_deref().map(esc).unwrap_or_default(),
                format!(
                    "<code>{}</code><br><span class=\"muted\">{}</span>",
                    esc(&e.reason),
                    esc(&e.detail)
                ),
                format!("<pre class=\"headers\">{}</pre>", headers.join("\n")),
                format!(
                    "<form method=\"post\" action=\"{base}/quarantine/replay\" class=\"inline\">{csrf}{}<button type=\"submit\" aria-label=\"Verify quarantined request {} again\">Verify again</button></form>",
                    hidden("ids", &e.id.to_string()),
                    e.id
                ),
            ]
        },
    )
    .await
}

/// `POST /ui/quarantine/replay`: first a confirmation that counts what would be verified
/// again (the API's dry run), then the replay and what it came to.
pub(super) async fn quarantine_replay(c: &Arc<Console>, v: &Viewer, form: &Form) -> Page {
    let ids: Vec<u64> = field(form, "ids")
        .map(|i| i.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_default();
    let base = esc(&v.base);
    let mut req = QuarantineReplayRequest {
        ids: ids.clone(),
        dry_run: true,
        ..Default::default()
    };
    if field(form, "confirm") != Some("yes") {
        let r: QuarantineReplayed = c
            .call(v, Method::POST, "/v1/quarantine/replay", body(&req))
            .await?;
        let ids_text: Vec<String> = ids.iter().map(u64::to_string).collect();
        let body = format!(
            "<h1>Verify again?</h1><p role=\"status\"><strong>{}</strong> {} will be verified again with the sources' secrets of now; those that pass are ingested and leave the quarantine.</p>\
<form method=\"post\" action=\"{base}/quarantine/replay\" class=\"inline\">{}{}{}<button type=\"submit\" autofocus>Verify again</button></form> <a href=\"{base}/quarantine\">Cancel</a>",
            r.matched,
            if r.matched == 1 { "quarantined request" } else { "quarantined requests" },
            csrf_field(&v.csrf),
            hidden("ids", &ids_text.join(",")),
            hidden("confirm", "yes"),
        );
        return Ok(page(v, "Verify again", "Quarantine", body, false, false));
    }
    req.dry_run = false;
    let r: QuarantineReplayed = c
        .call(v, Method::POST, "/v1/quarantine/replay", body(&req))
        .await?;
    let body = format!(
        "<h1>Verified again</h1><p role=\"status\">{} ingested, {} already received (duplicates), {} still failing, {} refused for now.</p><p><a href=\"{base}/quarantine\">Back to the quarantine</a></p>",
        r.ingested, r.duplicates, r.still_failing, r.refused
    );
    Ok(page(v, "Verified again", "Quarantine", body, false, false))
}
