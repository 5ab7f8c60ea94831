//! Every key decoder of the store on any bytes: a value or a `KeyError`, never a panic;
//! and what decodes is the canonical encoding (encoding it again gives the same bytes).
#![no_main]

use ankusa_keyspace as k;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|key: &[u8]| {
    if let Ok(seq) = k::decode_hook(key) {
        assert_eq!(k::hook(seq), key);
    }
    if let Ok((seq, sink)) = k::decode_delivery(key) {
        assert_eq!(k::delivery(seq, sink), key);
    }
    if let Ok(d) = k::decode_due(key) {
        assert_eq!(k::due(&d), key);
    }
    if let Ok(i) = k::decode_inflight(key) {
        assert_eq!(k::inflight(&i), key);
    }
    if let Ok(d) = k::decode_dead(key) {
        assert_eq!(k::dead(&d), key);
    }
    if let Ok((ord, d)) = k::decode_dead_by_tenant(key) {
        assert_eq!(k::dead_by_tenant(ord, &d), key);
    }
    if let Ok(seq) = k::decode_archive(key) {
        assert_eq!(k::archive(seq), key);
    }
    if let Ok((b, ord)) = k::decode_active(key) {
        assert_eq!(k::active(b, ord), key);
    }
    if let Ok((seq, sink)) = k::decode_claim(key) {
        assert_eq!(k::claim(seq, sink), key);
    }
    if let Ok(seq) = k::decode_cleared(key) {
        assert_eq!(k::cleared(seq), key);
    }
    if let Ok((at, dk)) = k::decode_dedupe_expiry(key) {
        assert_eq!(k::dedupe_expiry(at, &dk), key);
    }
    let _ = k::decode_due_v2(key);
    let _ = k::decode_inflight_v2(key);
    if let Ok(ord) = k::decode_tenant_name(key) {
        assert_eq!(k::tenant_name(ord), key);
    }
    if let Ok(t) = k::decode_tenant_ord(key) {
        assert_eq!(k::tenant_ord(&t), key);
    }
    if let Ok((ord, f)) = k::decode_counter(key) {
        assert_eq!(k::counter(ord, f), key);
    }
    if let Ok((seq, at)) = k::decode_audit(key) {
        assert_eq!(k::audit(seq, at), key);
    }
    if let Ok(id) = k::decode_quarantine(key) {
        assert_eq!(k::quarantine(id), key);
    }
    if let Ok(s) = k::decode_archive_segment(key) {
        assert_eq!(k::archive_segment(s), key);
    }
    let _ = k::decode_meta_migrating(key);
    if let Ok(s) = std::str::from_utf8(key) {
        let _ = k::dedupe(s, key);
        let _ = k::prefix_end(key);
    }
    if let Ok(seq) = k::decode_hook_log(key) {
        assert_eq!(k::hook_log(seq), key);
    }
    if let Ok(id) = k::decode_hook_id(key) {
        assert_eq!(k::hook_id(&id).as_deref(), Some(key));
    }
    if let Ok(e) = k::decode_hook_event(key) {
        assert_eq!(k::hook_event(&e), key);
    }
    if let Ok(a) = k::decode_archived_hook(key) {
        assert_eq!(k::archived_hook(&a), key);
    }
    if let Ok((at, seq)) = k::decode_archive_expiry(key) {
        assert_eq!(k::archive_expiry(at, seq), key);
    }
});
