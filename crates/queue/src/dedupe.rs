//! The idempotency keys' rows: `<<?u, tenant, key>>` in `index`, whose value is when the
//! entry expires and the first hook's id, and their expiry index (`dedupe.window_ms`).
//! The writer reads and writes them in its batches ([`crate::writer`]); the sweep here
//! removes the expired ones; the admin API looks up the first hook of a key.

use ankusa_keyspace::{AtMs, Cf, Family};
use ankusa_store::{Dir, Op, Rows, Store};

use crate::QueueError;

/// `?u` value: `<<expires_at::64>>` then the first hook's id.
pub(crate) fn value(expires: u64, id: &str) -> Vec<u8> {
    let mut v = expires.to_be_bytes().to_vec();
    v.extend_from_slice(id.as_bytes());
    v
}

/// The two rows that keep idempotency key `key` until `expires`: its entry (with the first
/// hook's id) and its place in the expiry index.
pub(crate) fn keep(key: &[u8], expires: u64, id: &str) -> [Op; 2] {
    [
        Op::put(
            Cf::Index,
            ankusa_keyspace::dedupe_expiry(AtMs(expires), key),
            Vec::new(),
        ),
        Op::put(Cf::Index, key.to_vec(), value(expires, id)),
    ]
}

pub(crate) fn decode_value(v: &[u8]) -> Option<(u64, String)> {
    let (e, id) = v.split_at_checked(8)?;
    Some((
        u64::from_be_bytes(e.try_into().ok()?),
        String::from_utf8(id.to_vec()).ok()?,
    ))
}

/// The dedupe row at `key`: its expiry and hook id. A value that does not decode is
/// corruption, reported (counted under `family="dedupe"` and logged with its key) and then
/// treated as no entry: ingest takes the hook as new and its own entry replaces the damaged
/// one, the sweep removes it. Refusing the key forever would lose every later hook of it.
pub(crate) fn read_value(key: &[u8], v: &[u8]) -> Option<(u64, String)> {
    let d = decode_value(v);
    if d.is_none() {
        let err = QueueError::corrupt_at(
            Family::Dedupe,
            key,
            format!("bad value {}", ankusa_keyspace::hex(v)),
        );
        tracing::error!(error = %err, "a dedupe row does not decode");
    }
    d
}

/// The first hook a tenant's idempotency key (the provider's delivery id) was taken as,
/// while its dedupe entry lives (`dedupe.window_ms`): one point read.
pub fn first_hook_of(
    store: &Store,
    tenant: &str,
    key: &[u8],
) -> Result<Option<String>, QueueError> {
    let Some(k) = ankusa_keyspace::dedupe(tenant, key) else {
        return Ok(None);
    };
    let now = ankusa_keyspace::now_ms();
    Ok(store
        .get(ankusa_keyspace::Cf::Index, &k)?
        .and_then(|v| read_value(&k, &v))
        .filter(|(expires, _)| *expires > now)
        .map(|(_, id)| id))
}

/// Deletes up to `limit` dedupe keys that expired before `now`; returns how many.
pub fn sweep_expired(store: &Store, now: u64, limit: usize) -> Result<u64, QueueError> {
    let (lo, to) = ankusa_keyspace::dedupe_expired_before(ankusa_keyspace::AtMs(now));
    let mut ops = Vec::new();
    let mut n = 0;
    let expired: Vec<(ankusa_keyspace::AtMs, Vec<u8>)> = store
        .scan(Family::DedupeExpiry, &lo, &to, Dir::Forward)?
        .take(limit)
        .map(|kv| kv.and_then(|(k, _)| Ok(ankusa_keyspace::decode_dedupe_expiry(&k)?)))
        .collect::<Result<_, _>>()?;
    let values = store.multi_get(
        ankusa_keyspace::Cf::Index,
        &expired.iter().map(|(_, u)| u.clone()).collect::<Vec<_>>(),
    )?;
    for ((at, u), v) in expired.into_iter().zip(values) {
        ops.push(Op::delete(
            ankusa_keyspace::Cf::Index,
            ankusa_keyspace::dedupe_expiry(at, &u),
        ));
        // A newer hook may have renewed the key; only its own expiry removes it (and a
        // damaged entry, reported, goes with the expiry that names it).
        let remove = v
            .as_deref()
            .is_some_and(|v| read_value(&u, v).is_none_or(|(e, _)| e == at.0));
        if remove {
            ops.push(Op::delete(ankusa_keyspace::Cf::Index, u));
        }
        n += 1;
    }
    if !ops.is_empty() {
        store.write(ops, false)?;
    }
    Ok(n)
}
