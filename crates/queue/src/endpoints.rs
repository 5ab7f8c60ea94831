//! Tenants' own endpoints (`/v1/tenants/{t}/endpoints`): `m:endpoint:<tenant id>\0<id>` in
//! meta → the endpoint's record (JSON, read and written by the node; opaque here).
//!
//! Keyed by the tenant's id, not its ordinal: a tenant sets its endpoints up before its
//! first hook. A tenant's records are one range (tenant ids hold no control character, so
//! `\0` ends the id): listed, counted and erased with one scan each, bounded by
//! `endpoints.max_per_tenant`.

use ankusa_keyspace::{Cf, Family};
use ankusa_store::{Dir, Op, Rows, Store};

use crate::{Change, QueueError};

const PREFIX: &[u8] = b"m:endpoint:";
/// The end of [`PREFIX`]'s range.
const END: &[u8] = b"m:endpoint;";

/// The first key of tenant `tenant`'s range.
fn tenant_prefix(tenant: &str) -> Vec<u8> {
    let mut k = PREFIX.to_vec();
    k.extend_from_slice(tenant.as_bytes());
    k.push(0);
    k
}

/// The key of tenant `tenant`'s endpoint `id`.
pub fn key(tenant: &str, id: &str) -> Vec<u8> {
    let mut k = tenant_prefix(tenant);
    k.extend_from_slice(id.as_bytes());
    k
}

/// The change that writes endpoint `id` of `tenant` as `record` (or, with `None`, deletes it).
pub fn op(tenant: &str, id: &str, record: Option<Vec<u8>>) -> Change {
    Change(match record {
        Some(v) => Op::put(Cf::Default, key(tenant, id), v),
        None => Op::delete(Cf::Default, key(tenant, id)),
    })
}

/// Endpoint `id` of `tenant`, as stored.
pub fn get(store: &Store, tenant: &str, id: &str) -> Result<Option<Vec<u8>>, QueueError> {
    Ok(store.get(Cf::Default, &key(tenant, id))?)
}

/// Tenant `tenant`'s endpoints, `(id, record)` in id order.
pub fn of_tenant(store: &Store, tenant: &str) -> Result<Vec<(String, Vec<u8>)>, QueueError> {
    let lo = tenant_prefix(tenant);
    // The prefix ends with 0: its range ends where the same bytes end with 1.
    let mut hi = lo[..lo.len() - 1].to_vec();
    hi.push(1);
    let mut out = Vec::new();
    for kv in store.scan(Family::Meta, &lo, &hi, Dir::Forward)? {
        let (k, v) = kv?;
        let id = std::str::from_utf8(&k[lo.len()..])
            .map_err(|_| QueueError::corrupt_at(Family::Meta, &k, "an endpoint id not UTF-8"))?;
        out.push((id.to_owned(), v));
    }
    Ok(out)
}

/// The changes that delete every endpoint of `tenant` (its erase).
pub fn erase_ops(store: &Store, tenant: &str) -> Result<Vec<Change>, QueueError> {
    Ok(of_tenant(store, tenant)?
        .into_iter()
        .map(|(id, _)| op(tenant, &id, None))
        .collect())
}

/// A page of the endpoints stored, in key order.
#[derive(Debug, Default)]
pub struct Page {
    /// `(tenant, id, record)`.
    pub items: Vec<(String, String, Vec<u8>)>,
    /// The key to go on after (absent: the last page).
    pub next: Option<Vec<u8>>,
}

/// At most `limit` endpoints after key `after` (from the first without one): what a handoff
/// pass walks.
pub fn page(store: &Store, after: Option<&[u8]>, limit: usize) -> Result<Page, QueueError> {
    let from = match after {
        Some(k) => {
            let mut k = k.to_vec();
            k.push(0);
            k
        }
        None => PREFIX.to_vec(),
    };
    let mut out = Page::default();
    for kv in store.scan(Family::Meta, &from, END, Dir::Forward)? {
        let (k, v) = kv?;
        if out.items.len() == limit {
            out.next = out.items.last().map(|(t, id, _)| key(t, id));
            break;
        }
        let (tenant, id) = decode_key(&k)?;
        out.items.push((tenant, id, v));
    }
    Ok(out)
}

/// A key's tenant and id.
fn decode_key(k: &[u8]) -> Result<(String, String), QueueError> {
    let rest = &k[PREFIX.len().min(k.len())..];
    let split = rest.iter().position(|b| *b == 0);
    let parts = split.map(|at| (&rest[..at], &rest[at + 1..]));
    match parts.map(|(t, i)| (std::str::from_utf8(t), std::str::from_utf8(i))) {
        Some((Ok(tenant), Ok(id))) => Ok((tenant.to_owned(), id.to_owned())),
        _ => Err(QueueError::corrupt_at(
            Family::Meta,
            k,
            "an endpoint key that does not decode",
        )),
    }
}

/// Every endpoint stored, `(tenant, id, record)`: what a node counts at boot.
pub fn all(store: &Store) -> Result<Vec<(String, String, Vec<u8>)>, QueueError> {
    let mut out = Vec::new();
    for kv in store.scan(Family::Meta, PREFIX, END, Dir::Forward)? {
        let (k, v) = kv?;
        let (tenant, id) = decode_key(&k)?;
        out.push((tenant, id, v));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_ends_where_the_prefix_does() {
        assert_eq!(ankusa_keyspace::prefix_end(PREFIX).as_deref(), Some(END));
    }

    #[test]
    fn a_tenant_s_range_holds_its_endpoints_and_no_other_tenant_s() {
        let h = crate::testkit::Harness::new();
        let store = &*h.store;
        let w = |t: &str, id: &str, v: &[u8]| {
            crate::commit(store, vec![op(t, id, Some(v.to_vec()))], false).unwrap()
        };
        w("a", "ep_2", b"2");
        w("a", "ep_1", b"1");
        // A tenant whose id extends another's is not in its range.
        w("ab", "ep_3", b"3");
        w("a b", "ep_4", b"4");
        assert_eq!(
            of_tenant(store, "a").unwrap(),
            vec![
                ("ep_1".into(), b"1".to_vec()),
                ("ep_2".into(), b"2".to_vec())
            ]
        );
        assert_eq!(get(store, "ab", "ep_3").unwrap(), Some(b"3".to_vec()));
        assert_eq!(all(store).unwrap().len(), 4);
        crate::commit(store, erase_ops(store, "a").unwrap(), false).unwrap();
        assert!(of_tenant(store, "a").unwrap().is_empty());
        let left: Vec<_> = all(store).unwrap().into_iter().map(|e| e.1).collect();
        assert_eq!(left, ["ep_4", "ep_3"]);
        // Paged: one at a time, then none left.
        let first = page(store, None, 1).unwrap();
        assert_eq!(first.items[0].1, "ep_4");
        let second = page(store, first.next.as_deref(), 1).unwrap();
        assert_eq!(second.items[0].1, "ep_3");
        assert!(second.next.is_none(), "{second:?}");
    }
}
