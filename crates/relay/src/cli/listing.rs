//! Listings merged from every node, newest first, and paged: the DLQ's and the
//! quarantine's. Each node pages on its own cursor; the merged listing's cursor holds one
//! per node (`<node>:<cursor>`, comma-separated, `<node>:end` for a node with nothing
//! older), so the next page starts each node where the last one left it.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail};
use serde::Serialize;

use ankusa_api::admin::{DlqItem, DlqPage, QuarantineItem, QuarantinePage};

/// A merged listing: each node's rows, ids as `<node>/<id>`, newest first, and the cursor
/// of the page after it (none: every node is at its end).
#[derive(Debug, Serialize)]
pub struct Listing<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

/// Where a node's next page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// Its newest row.
    Newest,
    /// Just before the row with this cursor.
    Before(String),
    /// Nothing older is left.
    End,
}

/// A merged listing's cursor: a position per node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor(BTreeMap<usize, Position>);

impl Cursor {
    /// Reads `0:<cursor>,1:end,…` (a node not named starts at its newest row).
    pub fn parse(text: &str, nodes: usize) -> anyhow::Result<Cursor> {
        let mut at = BTreeMap::new();
        for part in text.split(',').filter(|p| !p.is_empty()) {
            let (n, c) = part.split_once(':').ok_or_else(|| {
                anyhow!("--before {text:?}: a cursor is <node>:<cursor>,…, as `next` prints it")
            })?;
            let n: usize = n
                .parse()
                .map_err(|_| anyhow!("--before {text:?}: {n:?} is not a node's number"))?;
            if n >= nodes {
                bail!("--before {text:?}: there are {nodes} nodes");
            }
            let p = match c {
                "end" => Position::End,
                "" => bail!("--before {text:?}: node {n} has an empty cursor"),
                c => Position::Before(c.to_owned()),
            };
            at.insert(n, p);
        }
        Ok(Cursor(at))
    }

    /// Node `i`'s position.
    pub fn of(&self, i: usize) -> &Position {
        self.0.get(&i).unwrap_or(&Position::Newest)
    }

    /// `None` when every node of `nodes` is at its end: there is no next page.
    fn render(&self, nodes: usize) -> Option<String> {
        if (0..nodes).all(|i| *self.of(i) == Position::End) {
            return None;
        }
        let parts: Vec<String> = (0..nodes)
            .filter_map(|i| match self.of(i) {
                Position::Newest => None,
                Position::Before(c) => Some(format!("{i}:{c}")),
                Position::End => Some(format!("{i}:end")),
            })
            .collect();
        Some(parts.join(","))
    }
}

/// One node's page: its rows, newest first, and its own cursor for more (`None`: no more).
/// A node at its end is not asked: its page is `None`.
pub struct NodePage<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

/// The `limit` newest rows of every node's page, each with its node, and the cursor after
/// them: a node all of whose rows are shown goes on from its own `next`; one some of whose
/// rows are shown, from the last shown; one none of whose rows are shown stays where it was.
pub fn merge_pages<T>(
    pages: Vec<Option<NodePage<T>>>,
    prev: &Cursor,
    limit: usize,
    at_ms: impl Fn(&T) -> u64,
    id: impl Fn(&T) -> String,
) -> (Vec<(usize, T)>, Option<String>) {
    let nodes = pages.len();
    let mut all: Vec<(usize, T)> = Vec::new();
    let mut returned = vec![0usize; nodes];
    let mut nexts: Vec<Option<String>> = vec![None; nodes];
    let mut asked = vec![false; nodes];
    for (i, page) in pages.into_iter().enumerate() {
        if let Some(p) = page {
            asked[i] = true;
            returned[i] = p.items.len();
            nexts[i] = p.next;
            all.extend(p.items.into_iter().map(|t| (i, t)));
        }
    }
    // Newest first; a tie keeps node order (the sort is stable).
    all.sort_by_key(|(_, t)| std::cmp::Reverse(at_ms(t)));
    all.truncate(limit);
    let mut next = Cursor::default();
    for i in 0..nodes {
        let shown: Vec<&T> = all
            .iter()
            .filter(|(n, _)| *n == i)
            .map(|(_, t)| t)
            .collect();
        let p = if !asked[i] {
            prev.of(i).clone()
        } else if shown.len() == returned[i] {
            nexts[i].clone().map_or(Position::End, Position::Before)
        } else if let Some(last) = shown.last() {
            Position::Before(id(last))
        } else {
            prev.of(i).clone()
        };
        next.0.insert(i, p);
    }
    (all, next.render(nodes))
}

/// Dead rows from every node's page, newest first, `limit` of them.
pub fn merge_dlq(pages: Vec<Option<DlqPage>>, prev: &Cursor, limit: usize) -> Listing<DlqItem> {
    let pages = pages
        .into_iter()
        .map(|p| {
            p.map(|p| NodePage {
                items: p.items,
                next: p.next,
            })
        })
        .collect();
    let (rows, next) = merge_pages(pages, prev, limit, |i: &DlqItem| i.at_ms, |i| i.id.clone());
    let items = rows
        .into_iter()
        .map(|(n, mut it)| {
            it.id = format!("{n}/{}", it.id);
            it.node = Some(n.to_string());
            it
        })
        .collect();
    Listing { items, next }
}

/// A quarantined request of a merged listing: its id is `<node>/<id>`.
#[derive(Debug, Serialize)]
pub struct QuarantineRow {
    pub id: String,
    pub node: usize,
    pub source: String,
    pub at_ms: u64,
    pub reason: String,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body_base64_preview: String,
}

/// Quarantined requests from every node's page, newest first, `limit` of them.
pub fn merge_quarantine(
    pages: Vec<Option<QuarantinePage>>,
    prev: &Cursor,
    limit: usize,
) -> Listing<QuarantineRow> {
    let pages = pages
        .into_iter()
        .map(|p| {
            p.map(|p| NodePage {
                items: p.items,
                next: p.next.map(|n| n.to_string()),
            })
        })
        .collect();
    let (rows, next) = merge_pages(
        pages,
        prev,
        limit,
        |q: &QuarantineItem| q.at_ms,
        |q| q.id.to_string(),
    );
    let items = rows
        .into_iter()
        .map(|(i, q)| QuarantineRow {
            id: format!("{i}/{}", q.id),
            node: i,
            source: q.source,
            at_ms: q.at_ms,
            reason: q.reason,
            detail: q.detail,
            tenant: q.tenant,
            headers: q.headers,
            body_base64_preview: q.body_base64_preview,
        })
        .collect();
    Listing { items, next }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two nodes' rows, paged 3 at a time through the merged cursor: every row once, newest
    /// first, and no next page after the last.
    #[test]
    fn paging_a_merged_listing_shows_every_row_once_in_order() {
        // Node 0 holds rows at 10, 8, 6, 4, 2; node 1 at 9, 5, 1 (ids are the times).
        let held = [vec![10u64, 8, 6, 4, 2], vec![9, 5, 1]];
        let page_of = |node: usize, pos: &Position, limit: usize| -> Option<NodePage<u64>> {
            let rows: Vec<u64> = held[node]
                .iter()
                .copied()
                .filter(|&t| match pos {
                    Position::Newest => true,
                    Position::Before(c) => t < c.parse().unwrap(),
                    Position::End => false,
                })
                .collect();
            if *pos == Position::End {
                return None;
            }
            let items: Vec<u64> = rows.iter().copied().take(limit).collect();
            let next = (rows.len() > limit).then(|| items.last().unwrap().to_string());
            Some(NodePage { items, next })
        };
        let mut cursor = Cursor::default();
        let mut seen = Vec::new();
        for _ in 0..10 {
            let pages = (0..2).map(|n| page_of(n, cursor.of(n), 3)).collect();
            let (rows, next) = merge_pages(pages, &cursor, 3, |t| *t, |t| t.to_string());
            seen.extend(rows.into_iter().map(|(_, t)| t));
            match next {
                Some(n) => cursor = Cursor::parse(&n, 2).unwrap(),
                None => break,
            }
        }
        assert_eq!(seen, vec![10, 9, 8, 6, 5, 4, 2, 1]);
    }

    #[test]
    fn the_dlq_merges_newest_first_with_node_ids() {
        let row = |id: &str, at_ms: u64| DlqItem {
            id: id.into(),
            at_ms,
            ..DlqItem::default()
        };
        let page = |items| DlqPage {
            items,
            ..DlqPage::default()
        };
        let d = merge_dlq(
            vec![
                Some(page(vec![row("5.1.0", 5), row("2.1.0", 2)])),
                Some(page(vec![row("9.4.0", 9)])),
            ],
            &Cursor::default(),
            2,
        );
        let ids: Vec<&str> = d.items.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["1/9.4.0", "0/5.1.0"]);
        // Node 0's second row was not shown: its next page starts after its first; node 1
        // has nothing older.
        assert_eq!(d.next.as_deref(), Some("0:5.1.0,1:end"));
    }

    #[test]
    fn a_cursor_reads_back_and_bad_ones_are_refused() {
        let c = Cursor::parse("0:17.3.0,1:end", 2).unwrap();
        assert_eq!(*c.of(0), Position::Before("17.3.0".into()));
        assert_eq!(*c.of(1), Position::End);
        assert_eq!(c.render(2).as_deref(), Some("0:17.3.0,1:end"));
        assert_eq!(
            Cursor::parse("1:end", 2).unwrap().render(2).as_deref(),
            Some("1:end")
        );
        assert_eq!(Cursor::parse("0:end,1:end", 2).unwrap().render(2), None);
        for bad in ["x", "2:5", "a:5", "0:"] {
            assert!(Cursor::parse(bad, 2).is_err(), "{bad}");
        }
    }
}
