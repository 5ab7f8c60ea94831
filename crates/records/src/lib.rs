//! The values of the Ankusa store, encoded and decoded, without RocksDB: the versioned
//! codec every value uses ([`codec`]), the hook envelope, the delivery row, the dead row's
//! value and the hook log's record and events. Every decoder answers a [`DecodeError`] for
//! bytes it does not understand, never a panic (fuzzed: `fuzz/fuzz_targets/values.rs`).

pub mod codec;
pub mod moved;

use ankusa_keyspace::{AtMs, EventKey, EventKind, TenantOrd};
use codec::{Dec, DecodeError, Enc};

/// The tenant of a hook whose source names none.
pub const DEFAULT_TENANT: &str = "default";

/// The value of a dead row (`?x`): whose it is and what the DLQ lists, without a hook read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeadValue {
    pub ord: TenantOrd,
    pub size: u32,
    pub source: String,
    pub hook_id: String,
    /// The sink's id (empty for a row dead-lettered before version 4, or imported).
    pub sink: String,
}

/// Version 4 added the sink's id; version 3 still decodes, without it.
const DEAD_VALUE_VERSION: u8 = 4;

impl DeadValue {
    /// Version 3 when the sink is not known (what releases before version 4 read).
    pub fn encode(&self) -> Vec<u8> {
        let version = if self.sink.is_empty() {
            3
        } else {
            DEAD_VALUE_VERSION
        };
        let mut e = Enc::with_version(version);
        e.u32(self.ord.0)
            .u32(self.size)
            .str(&self.source)
            .str(&self.hook_id);
        if version >= 4 {
            e.str(&self.sink);
        }
        e.finish()
    }
    pub fn decode(v: &[u8]) -> Result<DeadValue, DecodeError> {
        let mut d = Dec::new(v, "dead value");
        let version = d.version_of(&[3, DEAD_VALUE_VERSION])?;
        let mut out = DeadValue {
            ord: TenantOrd(d.u32()?),
            size: d.u32()?,
            source: d.string()?,
            hook_id: d.string()?,
            sink: String::new(),
        };
        if version >= 4 {
            out.sink = d.string()?;
        }
        d.end()?;
        Ok(out)
    }
}

/// The hook envelope stored in `hooks`: everything delivery needs, including the sink ids
/// of its fan-out list as they were at ingest.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Envelope {
    pub id: String,
    /// `None` files the hook under [`DEFAULT_TENANT`].
    pub tenant: Option<String>,
    pub source: String,
    pub received_at: AtMs,
    pub content_type: String,
    pub sinks: Vec<String>,
    pub body: Vec<u8>,
    /// The request headers its source forwards to sinks (`sources[].forward_headers`):
    /// lower-case names, raw values, in the order received.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// Version 2 added the forwarded headers (after the body); version 1 still decodes, with
/// none.
const ENVELOPE_VERSION: u8 = 2;

/// Builds an [`Envelope`] from an id and a source; everything else starts empty (no
/// tenant, so the `default` one; `application/json`; no sinks; an empty body; received at
/// 0; no forwarded headers). What tests, benches and fixtures write hooks with.
#[derive(Debug, Clone)]
#[must_use]
pub struct EnvelopeBuilder(Envelope);

impl EnvelopeBuilder {
    pub fn tenant(mut self, tenant: Option<&str>) -> Self {
        self.0.tenant = tenant.map(str::to_owned);
        self
    }

    pub fn received_at(mut self, at: AtMs) -> Self {
        self.0.received_at = at;
        self
    }

    pub fn content_type(mut self, content_type: &str) -> Self {
        self.0.content_type = content_type.to_owned();
        self
    }

    pub fn sinks<S: Into<String>>(mut self, sinks: impl IntoIterator<Item = S>) -> Self {
        self.0.sinks = sinks.into_iter().map(Into::into).collect();
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.0.body = body.into();
        self
    }

    pub fn header(mut self, name: &str, value: impl Into<Vec<u8>>) -> Self {
        self.0.headers.push((name.to_owned(), value.into()));
        self
    }

    pub fn build(self) -> Envelope {
        self.0
    }
}

impl Envelope {
    /// A builder starting from `id` and `source` ([`EnvelopeBuilder`]).
    pub fn builder(id: impl Into<String>, source: impl Into<String>) -> EnvelopeBuilder {
        EnvelopeBuilder(Envelope {
            id: id.into(),
            tenant: None,
            source: source.into(),
            received_at: AtMs(0),
            content_type: "application/json".into(),
            sinks: Vec::new(),
            body: Vec::new(),
            headers: Vec::new(),
        })
    }

    /// Version 1 when there are no forwarded headers (what every release reads), else
    /// version 2.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with_body(&self.body)
    }

    /// [`Envelope::encode`] with `body` in place of the envelope's own, sized once (the
    /// value is built on the writer's path for every hook: no regrowing, no copy of a body
    /// that is not stored).
    fn encode_with_body(&self, body: &[u8]) -> Vec<u8> {
        let version = if self.headers.is_empty() {
            1
        } else {
            ENVELOPE_VERSION
        };
        let len = |b: usize| 4 + b;
        let size = 1
            + len(self.id.len())
            + 1
            + self.tenant.as_deref().map_or(0, |t| len(t.len()))
            + len(self.source.len())
            + 8
            + len(self.content_type.len())
            + 2
            + self.sinks.iter().map(|s| len(s.len())).sum::<usize>()
            + len(body.len())
            + if version >= 2 {
                2 + self
                    .headers
                    .iter()
                    .map(|(n, v)| len(n.len()) + len(v.len()))
                    .sum::<usize>()
            } else {
                0
            };
        let mut e = Enc::with_version_and_capacity(version, size);
        e.str(&self.id);
        match &self.tenant {
            Some(t) => e.u8(1).str(t),
            None => e.u8(0),
        };
        e.str(&self.source)
            .u64(self.received_at.0)
            .str(&self.content_type)
            .u16(self.sinks.len() as u16);
        for s in &self.sinks {
            e.str(s);
        }
        e.bytes(body);
        if version >= 2 {
            e.u16(self.headers.len() as u16);
            for (name, value) in &self.headers {
                e.str(name).bytes(value);
            }
        }
        e.finish()
    }

    pub fn decode(v: &[u8]) -> Result<Envelope, DecodeError> {
        let mut d = Dec::new(v, "hook envelope");
        let version = d.version_of(&[1, ENVELOPE_VERSION])?;
        let id = d.string()?;
        let tenant = match d.u8()? {
            0 => None,
            _ => Some(d.string()?),
        };
        let source = d.string()?;
        let received_at = AtMs(d.u64()?);
        let content_type = d.string()?;
        let n = d.u16()?;
        let mut sinks = Vec::with_capacity(n as usize);
        for _ in 0..n {
            sinks.push(d.string()?);
        }
        let body = d.bytes()?.to_vec();
        let mut headers = Vec::new();
        if version >= 2 {
            for _ in 0..d.u16()? {
                headers.push((d.string()?, d.bytes()?.to_vec()));
            }
        }
        d.end()?;
        Ok(Envelope {
            id,
            tenant,
            source,
            received_at,
            content_type,
            sinks,
            body,
            headers,
        })
    }

    /// The tenant the hook is filed under.
    pub fn tenant_or_default(&self) -> &str {
        self.tenant.as_deref().unwrap_or(DEFAULT_TENANT)
    }
}

/// The delivery row in `deliveries`: what the index keys do not say.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeliveryRow {
    pub ord: TenantOrd,
    pub size: u32,
    pub attempts: u32,
    pub last_attempt_at: u64,
    /// HTTP status of the last attempt (0: none, or no response).
    pub last_status: u16,
    pub last_error: String,
}

const ROW_VERSION: u8 = 1;

impl DeliveryRow {
    pub fn encode(&self) -> Vec<u8> {
        Enc::with_version(ROW_VERSION)
            .u32(self.ord.0)
            .u32(self.size)
            .u32(self.attempts)
            .u64(self.last_attempt_at)
            .u16(self.last_status)
            .str(&self.last_error)
            .finish()
    }
    pub fn decode(v: &[u8]) -> Result<DeliveryRow, DecodeError> {
        let mut d = Dec::new(v, "delivery row");
        d.version(ROW_VERSION)?;
        let out = DeliveryRow {
            ord: TenantOrd(d.u32()?),
            size: d.u32()?,
            attempts: d.u32()?,
            last_attempt_at: d.u64()?,
            last_status: d.u16()?,
            last_error: d.string()?,
        };
        d.end()?;
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------
// The hook log.

/// The longest error message an event keeps (bytes; cut at a character boundary).
pub const MAX_ERROR_BYTES: usize = 256;

/// A hook as the log keeps it: its envelope without the body, and the body's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    pub envelope: Envelope,
    pub body_len: u32,
}

const RECORD_VERSION: u8 = 1;

impl LogRecord {
    pub fn of(env: &Envelope) -> LogRecord {
        LogRecord {
            envelope: Envelope {
                body: Vec::new(),
                ..env.clone()
            },
            body_len: env.body.len() as u32,
        }
    }

    /// The record of `env`, encoded (what ingest writes).
    pub fn encode_envelope(env: &Envelope) -> Vec<u8> {
        Enc::with_version(RECORD_VERSION)
            .u32(env.body.len() as u32)
            .bytes(&env.encode_with_body(&[]))
            .finish()
    }

    pub fn decode(v: &[u8]) -> Result<LogRecord, DecodeError> {
        let mut d = Dec::new(v, "hook log record");
        d.version(RECORD_VERSION)?;
        let body_len = d.u32()?;
        let envelope = Envelope::decode(d.bytes()?)?;
        d.end()?;
        Ok(LogRecord { envelope, body_len })
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Delivered,
    Retry,
    Dead,
}

/// Why an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// No response within the sink's timeout.
    Timeout,
    /// No connection, or it broke before an answer.
    Connection,
    /// The sink answered with a status that is not 2xx.
    Status,
    /// The request could not be built (a header value of the sink's config).
    Request,
    /// The hook's sink is no longer in the configuration.
    Unconfigured,
    /// A pull consumer gave the delivery back (`nack`).
    Nacked,
    /// A pull consumer's lease ran out before an ack.
    LeaseExpired,
    /// A tenant endpoint's address is one the node does not deliver to (private,
    /// loopback, link-local…: `endpoints.allow_private` is off).
    AddressRefused,
}

impl ErrorClass {
    /// The name the API and the logs show (as serialized).
    pub fn name(self) -> &'static str {
        match self {
            ErrorClass::Timeout => "timeout",
            ErrorClass::Connection => "connection",
            ErrorClass::Status => "status",
            ErrorClass::Request => "request",
            ErrorClass::Unconfigured => "unconfigured",
            ErrorClass::Nacked => "nacked",
            ErrorClass::LeaseExpired => "lease_expired",
            ErrorClass::AddressRefused => "address_refused",
        }
    }

    pub fn byte(c: Option<ErrorClass>) -> u8 {
        match c {
            None => 0,
            Some(ErrorClass::Timeout) => 1,
            Some(ErrorClass::Connection) => 2,
            Some(ErrorClass::Status) => 3,
            Some(ErrorClass::Request) => 4,
            Some(ErrorClass::Unconfigured) => 5,
            Some(ErrorClass::Nacked) => 6,
            Some(ErrorClass::LeaseExpired) => 7,
            Some(ErrorClass::AddressRefused) => 8,
        }
    }
    pub fn of(b: u8) -> Result<Option<ErrorClass>, DecodeError> {
        Ok(match b {
            0 => None,
            1 => Some(ErrorClass::Timeout),
            2 => Some(ErrorClass::Connection),
            3 => Some(ErrorClass::Status),
            4 => Some(ErrorClass::Request),
            5 => Some(ErrorClass::Unconfigured),
            6 => Some(ErrorClass::Nacked),
            7 => Some(ErrorClass::LeaseExpired),
            8 => Some(ErrorClass::AddressRefused),
            _ => return Err(bad("error class")),
        })
    }
}

fn bad(reason: &'static str) -> DecodeError {
    DecodeError {
        what: "hook event",
        reason,
    }
}

/// One event of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// When it happened (an attempt: when its outcome was committed).
    pub at: AtMs,
    /// The attempt's number (1 = first); for a replay or a recovery, the attempts made
    /// before it (0 if unknown).
    pub attempt: u32,
    pub outcome: Option<AttemptOutcome>,
    /// HTTP status (0: none).
    pub status: u16,
    pub class: Option<ErrorClass>,
    pub error: String,
    pub latency_us: u64,
    /// When the delivery is due next (a retry, a replay, a recovery), or was dead-lettered.
    pub next_at: Option<AtMs>,
}

const EVENT_VERSION: u8 = 1;

impl Event {
    pub fn encode(&self) -> Vec<u8> {
        let outcome = match self.outcome {
            None => 0,
            Some(AttemptOutcome::Delivered) => 1,
            Some(AttemptOutcome::Retry) => 2,
            Some(AttemptOutcome::Dead) => 3,
        };
        Enc::with_version(EVENT_VERSION)
            .u32(self.attempt)
            .u8(outcome)
            .u16(self.status)
            .u8(ErrorClass::byte(self.class))
            .str(error_head(&self.error))
            .u64(self.latency_us)
            .u64(self.next_at.map_or(u64::MAX, |a| a.0))
            .finish()
    }

    pub fn decode(key: &EventKey, v: &[u8]) -> Result<Event, DecodeError> {
        let mut d = Dec::new(v, "hook event");
        d.version(EVENT_VERSION)?;
        let attempt = d.u32()?;
        let outcome = match d.u8()? {
            0 => None,
            1 => Some(AttemptOutcome::Delivered),
            2 => Some(AttemptOutcome::Retry),
            3 => Some(AttemptOutcome::Dead),
            _ => return Err(bad("outcome")),
        };
        let status = d.u16()?;
        let class = ErrorClass::of(d.u8()?)?;
        let error = d.string()?;
        let latency_us = d.u64()?;
        let next = d.u64()?;
        d.end()?;
        Ok(Event {
            kind: key.kind,
            at: key.at,
            attempt,
            outcome,
            status,
            class,
            error,
            latency_us,
            next_at: (next != u64::MAX).then_some(AtMs(next)),
        })
    }
}

/// The part of an error message the hook log keeps: its first [`MAX_ERROR_BYTES`], cut at
/// a character boundary (what a DLQ row's error is cut to as well).
pub fn error_head(s: &str) -> &str {
    truncate(s, MAX_ERROR_BYTES)
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use ankusa_keyspace::{Seq, SinkIdx};
    use proptest::prelude::*;

    fn envelope() -> impl Strategy<Value = Envelope> {
        (
            "\\PC{0,20}",
            proptest::option::of("\\PC{1,20}"),
            "\\PC{0,10}",
            any::<u64>(),
            proptest::collection::vec("[a-z]{1,8}", 0..4),
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::vec(
                (
                    "[a-z-]{1,10}",
                    proptest::collection::vec(any::<u8>(), 0..10),
                ),
                0..3,
            ),
        )
            .prop_map(|(id, tenant, source, at, sinks, body, headers)| Envelope {
                id,
                tenant,
                source,
                received_at: AtMs(at),
                content_type: "application/json".into(),
                sinks,
                body,
                headers,
            })
    }

    proptest! {
        #[test]
        fn values_round_trip(env in envelope(), ord in any::<u32>(), n in any::<u32>(), at in any::<u64>(), err in "\\PC{0,300}") {
            let encoded = env.encode();
            // Sized once: the capacity computed up front is the value's exact size.
            prop_assert_eq!(encoded.capacity(), encoded.len());
            prop_assert_eq!(Envelope::decode(&encoded).unwrap(), env.clone());
            let rec = LogRecord::decode(&LogRecord::encode_envelope(&env)).unwrap();
            prop_assert_eq!(rec, LogRecord::of(&env));
            let row = DeliveryRow { ord: TenantOrd(ord), size: n, attempts: n, last_attempt_at: at, last_status: 503, last_error: err.clone() };
            prop_assert_eq!(DeliveryRow::decode(&row.encode()).unwrap(), row);
            for sink in ["", "s"] {
                let dead = DeadValue { ord: TenantOrd(ord), size: n, source: env.source.clone(), hook_id: env.id.clone(), sink: sink.into() };
                prop_assert_eq!(DeadValue::decode(&dead.encode()).unwrap(), dead);
            }
            let key = EventKey { seq: Seq(1), sink: SinkIdx(0), at: AtMs(at), kind: EventKind::Attempt };
            let ev = Event { kind: EventKind::Attempt, at: AtMs(at), attempt: n, outcome: Some(AttemptOutcome::Retry), status: 500, class: Some(ErrorClass::Status), error: err.clone(), latency_us: at, next_at: Some(AtMs(at / 2)) };
            let back = Event::decode(&key, &ev.encode()).unwrap();
            prop_assert!(back.error.len() <= MAX_ERROR_BYTES && err.starts_with(&back.error));
            prop_assert_eq!(Event { error: back.error.clone(), ..ev }, back);
        }

        #[test]
        fn any_bytes_decode_to_a_value_or_an_error_never_a_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Envelope::decode(&b);
            let _ = DeliveryRow::decode(&b);
            let _ = DeadValue::decode(&b);
            let _ = LogRecord::decode(&b);
            let key = EventKey { seq: Seq(1), sink: SinkIdx(0), at: AtMs(0), kind: EventKind::Replayed };
            let _ = Event::decode(&key, &b);
        }
    }
}
