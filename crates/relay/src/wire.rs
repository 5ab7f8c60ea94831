//! The node's own types as the wire types of `ankusa_api` show them: the queue's counters,
//! a source's backlog, a delivery's state, a hook-log event's kind and outcome, an audit
//! row, a tenant's limits. The queue and the configuration keep their types free of the
//! wire (no serde shape of theirs is an API); these are the one place each is translated.

use ankusa_api::admin::{self as wire, AuditRecord, Limits};

/// The queue's counters as the API serves them.
pub fn counters(c: ankusa_queue::counters::Counters) -> ankusa_api::node::Counters {
    ankusa_api::node::Counters {
        pending: c.pending,
        scheduled: c.scheduled,
        inflight: c.inflight,
        dead: c.dead,
        bytes: c.bytes,
        archive_pending: c.archive_pending,
    }
}

/// A source's waiting work.
pub fn backlog(b: ankusa_queue::deliveries::SourceBacklog) -> wire::SourceBacklog {
    wire::SourceBacklog {
        pending: b.pending,
        scheduled: b.scheduled,
        inflight: b.inflight,
        bytes: b.bytes,
        rows_read: b.rows_read,
        exact: b.exact,
    }
}

/// Where a delivery is.
pub fn state(s: ankusa_queue::hooklog::DeliveryState) -> wire::DeliveryState {
    use ankusa_queue::hooklog::DeliveryState as S;
    match s {
        S::Pending => wire::DeliveryState::Pending,
        S::Scheduled => wire::DeliveryState::Scheduled,
        S::Inflight => wire::DeliveryState::Inflight,
        S::Delivered => wire::DeliveryState::Delivered,
        S::Dead => wire::DeliveryState::Dead,
        S::Queued => wire::DeliveryState::Queued,
        S::Purged => wire::DeliveryState::Purged,
        S::Gone => wire::DeliveryState::Gone,
    }
}

/// What a hook-log event was.
pub fn event_kind(k: ankusa_keyspace::EventKind) -> wire::EventKind {
    use ankusa_keyspace::EventKind as K;
    match k {
        K::Attempt => wire::EventKind::Attempt,
        K::Replayed => wire::EventKind::Replayed,
        K::Recovered => wire::EventKind::Recovered,
        K::Claimed => wire::EventKind::Claimed,
        K::Acked => wire::EventKind::Acked,
        K::Nacked => wire::EventKind::Nacked,
        K::Expired => wire::EventKind::Expired,
        K::Purged => wire::EventKind::Purged,
    }
}

/// How an attempt ended.
pub fn outcome(o: ankusa_records::AttemptOutcome) -> wire::AttemptOutcome {
    use ankusa_records::AttemptOutcome as O;
    match o {
        O::Delivered => wire::AttemptOutcome::Delivered,
        O::Retry => wire::AttemptOutcome::Retry,
        O::Dead => wire::AttemptOutcome::Dead,
    }
}

/// Why an attempt failed.
pub fn error_class(c: ankusa_records::ErrorClass) -> wire::ErrorClass {
    use ankusa_records::ErrorClass as C;
    match c {
        C::Timeout => wire::ErrorClass::Timeout,
        C::Connection => wire::ErrorClass::Connection,
        C::Status => wire::ErrorClass::Status,
        C::Request => wire::ErrorClass::Request,
        C::Unconfigured => wire::ErrorClass::Unconfigured,
        C::Nacked => wire::ErrorClass::Nacked,
        C::LeaseExpired => wire::ErrorClass::LeaseExpired,
        C::AddressRefused => wire::ErrorClass::AddressRefused,
    }
}

/// One audit row.
pub fn audit(r: ankusa_queue::audit::Record) -> AuditRecord {
    AuditRecord {
        seq: r.seq,
        at_ms: r.at_ms,
        who: r.who,
        action: r.action,
        tenant: r.tenant,
        detail: r.detail,
    }
}

/// A tenant's limits.
pub fn limits(l: &ankusa_config::TenantLimits) -> Limits {
    Limits {
        ingest_per_second: l.ingest_per_second,
        ingest_burst: l.ingest_burst,
        queued_bytes: l.queued_bytes,
        archive_bytes: l.archive_bytes,
    }
}

#[cfg(test)]
mod tests {
    use ankusa_api::admin as wire;

    /// Each translated name is the one the node wrote before the wire types had their own
    /// (`EventKind::name`, `ErrorClass::name`).
    #[test]
    fn event_kinds_and_error_classes_keep_their_names() {
        for b in 1..=7u8 {
            let Some(k) = ankusa_keyspace::EventKind::from_byte(b) else {
                continue;
            };
            let text = serde_json::to_string(&super::event_kind(k)).unwrap();
            assert_eq!(text, format!("\"{}\"", k.name()));
        }
        for c in [
            ankusa_records::ErrorClass::Timeout,
            ankusa_records::ErrorClass::LeaseExpired,
            ankusa_records::ErrorClass::Unconfigured,
            ankusa_records::ErrorClass::AddressRefused,
        ] {
            let text = serde_json::to_string(&super::error_class(c)).unwrap();
            assert_eq!(text, format!("\"{}\"", c.name()));
        }
        let s = super::state(ankusa_queue::hooklog::DeliveryState::Gone);
        assert_eq!(s, wire::DeliveryState::Gone);
    }
}
