//! What a node hands another when a tenant's stored rows move to its new owner (a
//! scale-down's drain, a scale-up's move): a hook with every delivery it still owes, or a
//! dedupe key. The sender keeps each one in its outbox (`m:handoff_out:…`) until the
//! receiver has committed it, so this is a stored value like the others: versioned, and
//! decoded into a [`DecodeError`], never a panic.
//!
//! Nothing here is node-local: a hook is named by the sender's seq only to find its outbox
//! key again, and the receiver gives it a seq and an ordinal of its own. The delivery row's
//! `ord` is the sender's, and the receiver replaces it.

use crate::codec::{Dec, DecodeError, Enc};
use crate::{DeadValue, DeliveryRow};

/// Where a moved delivery stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MovedState {
    /// Due at `at` (ms): a first attempt (`retry` false, counted `pending`) or a retry
    /// waiting out its backoff (`retry`, counted `scheduled`).
    Due { at: u64, retry: bool },
    /// Parked for the consumers of pull sink `sink_id`, due at `at`.
    Parked {
        at: u64,
        retry: bool,
        sink_id: String,
    },
    /// Dead-lettered at `at`, with the DLQ's value (its `ord` is the sender's).
    Dead { at: u64, value: DeadValue },
}

/// One delivery a moved hook still owes: its sink (by place in the envelope's list), its
/// row (attempts so far, last status and error) and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedDelivery {
    pub sink: u16,
    pub row: DeliveryRow,
    pub state: MovedState,
}

/// One of the hook log's events of a moved hook, as stored (its key's fields and value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedEvent {
    pub sink: u16,
    pub at: u64,
    pub kind: u8,
    pub value: Vec<u8>,
}

/// A hook that moves, with everything of it the sender holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedHook {
    /// The sender's seq (its outbox key; the receiver assigns its own).
    pub seq: u64,
    /// The envelope as stored in `hooks` (body and headers included).
    pub envelope: Vec<u8>,
    /// Every delivery the hook still owes (none in flight: those wait for their attempt).
    pub deliveries: Vec<MovedDelivery>,
    /// The archive still owes the hook a copy.
    pub archive: bool,
    /// The hook log's record, if the sender logged it.
    pub log: Option<Vec<u8>>,
    pub events: Vec<MovedEvent>,
}

/// What moves: a hook, an archived copy of a delivered hook, or a dedupe key still inside
/// its window (so a provider's retry after the move is still a duplicate at the new owner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Moved {
    Hook(MovedHook),
    /// An archived copy (`?h`) still inside its retention: the receiver keeps it, under a
    /// seq of its own, until `expires` (ms), and lists and replays it as its own.
    Archived {
        /// The sender's seq (its keys: the receiver assigns its own).
        seq: u64,
        /// When the hook was received (ms): the copy's place in the tenant's archive.
        received: u64,
        expires: u64,
        /// The envelope as archived (body and headers included).
        envelope: Vec<u8>,
    },
    /// The hook log's record of a hook no longer stored (delivered, or gone), with its
    /// events: what a leaving node hands on so that `GET /v1/hooks/{id}` still explains
    /// the hook once the node is gone. The receiver keeps it under a seq of its own.
    Logged {
        /// The sender's seq (its keys).
        seq: u64,
        /// The record as stored (the envelope without its body, and the body's size).
        record: Vec<u8>,
        events: Vec<MovedEvent>,
    },
    Dedupe {
        tenant: String,
        key: Vec<u8>,
        expires: u64,
        /// The first hook's id, the duplicate's answer.
        id: String,
    },
    /// One of the tenant's own endpoints (`/v1/tenants/{t}/endpoints`), its record as
    /// stored: the receiver keeps it under the same id.
    Endpoint {
        tenant: String,
        id: String,
        record: Vec<u8>,
    },
}

const VERSION: u8 = 1;
const HOOK: u8 = 1;
const DEDUPE: u8 = 2;
const ARCHIVED: u8 = 3;
const LOGGED: u8 = 4;
const ENDPOINT: u8 = 5;
const DUE: u8 = 1;
const PARKED: u8 = 2;
const DEAD: u8 = 3;

impl Moved {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::with_version(VERSION);
        match self {
            Moved::Hook(h) => {
                e.u8(HOOK).u64(h.seq).bytes(&h.envelope);
                e.u32(h.deliveries.len() as u32);
                for d in &h.deliveries {
                    e.u16(d.sink).bytes(&d.row.encode());
                    match &d.state {
                        MovedState::Due { at, retry } => {
                            e.u8(DUE).u64(*at).u8(*retry as u8);
                        }
                        MovedState::Parked { at, retry, sink_id } => {
                            e.u8(PARKED).u64(*at).u8(*retry as u8).str(sink_id);
                        }
                        MovedState::Dead { at, value } => {
                            e.u8(DEAD).u64(*at).bytes(&value.encode());
                        }
                    }
                }
                e.u8(h.archive as u8);
                match &h.log {
                    Some(r) => e.u8(1).bytes(r),
                    None => e.u8(0),
                };
                encode_events(&mut e, &h.events);
            }
            Moved::Dedupe {
                tenant,
                key,
                expires,
                id,
            } => {
                e.u8(DEDUPE).str(tenant).bytes(key).u64(*expires).str(id);
            }
            Moved::Archived {
                seq,
                received,
                expires,
                envelope,
            } => {
                e.u8(ARCHIVED)
                    .u64(*seq)
                    .u64(*received)
                    .u64(*expires)
                    .bytes(envelope);
            }
            Moved::Logged {
                seq,
                record,
                events,
            } => {
                e.u8(LOGGED).u64(*seq).bytes(record);
                encode_events(&mut e, events);
            }
            Moved::Endpoint { tenant, id, record } => {
                e.u8(ENDPOINT).str(tenant).str(id).bytes(record);
            }
        }
        e.finish()
    }

    pub fn decode(v: &[u8]) -> Result<Moved, DecodeError> {
        let mut d = Dec::new(v, "moved item");
        d.version(VERSION)?;
        let bad = |reason| DecodeError {
            what: "moved item",
            reason,
        };
        let out = match d.u8()? {
            HOOK => {
                let seq = d.u64()?;
                let envelope = d.bytes()?.to_vec();
                let n = d.u32()? as usize;
                // Each delivery takes at least 15 bytes: a count past what is left is damage.
                let mut deliveries = Vec::with_capacity(n.min(v.len() / 15));
                for _ in 0..n {
                    let sink = d.u16()?;
                    let row = DeliveryRow::decode(d.bytes()?)?;
                    let state = match d.u8()? {
                        DUE => MovedState::Due {
                            at: d.u64()?,
                            retry: flag(d.u8()?).ok_or_else(|| bad("bad flag"))?,
                        },
                        PARKED => MovedState::Parked {
                            at: d.u64()?,
                            retry: flag(d.u8()?).ok_or_else(|| bad("bad flag"))?,
                            sink_id: d.string()?,
                        },
                        DEAD => MovedState::Dead {
                            at: d.u64()?,
                            value: DeadValue::decode(d.bytes()?)?,
                        },
                        _ => return Err(bad("unknown delivery state")),
                    };
                    deliveries.push(MovedDelivery { sink, row, state });
                }
                let archive = flag(d.u8()?).ok_or_else(|| bad("bad flag"))?;
                let log = match d.u8()? {
                    0 => None,
                    1 => Some(d.bytes()?.to_vec()),
                    _ => return Err(bad("bad flag")),
                };
                let events = decode_events(&mut d, v.len())?;
                Moved::Hook(MovedHook {
                    seq,
                    envelope,
                    deliveries,
                    archive,
                    log,
                    events,
                })
            }
            DEDUPE => Moved::Dedupe {
                tenant: d.string()?,
                key: d.bytes()?.to_vec(),
                expires: d.u64()?,
                id: d.string()?,
            },
            ARCHIVED => Moved::Archived {
                seq: d.u64()?,
                received: d.u64()?,
                expires: d.u64()?,
                envelope: d.bytes()?.to_vec(),
            },
            LOGGED => Moved::Logged {
                seq: d.u64()?,
                record: d.bytes()?.to_vec(),
                events: decode_events(&mut d, v.len())?,
            },
            ENDPOINT => Moved::Endpoint {
                tenant: d.string()?,
                id: d.string()?,
                record: d.bytes()?.to_vec(),
            },
            _ => return Err(bad("unknown kind")),
        };
        d.end()?;
        Ok(out)
    }

    /// The bytes it carries, about (the receiver's batch bound).
    pub fn weight(&self) -> usize {
        match self {
            Moved::Hook(h) => {
                h.envelope.len()
                    + h.log.as_ref().map_or(0, Vec::len)
                    + h.events.iter().map(|e| e.value.len() + 16).sum::<usize>()
                    + h.deliveries.len() * 64
            }
            Moved::Dedupe { key, id, .. } => key.len() + id.len() + 16,
            Moved::Archived { envelope, .. } => envelope.len() + 24,
            Moved::Logged { record, events, .. } => {
                record.len() + events.iter().map(|e| e.value.len() + 16).sum::<usize>()
            }
            Moved::Endpoint { tenant, id, record } => tenant.len() + id.len() + record.len(),
        }
    }
}

fn encode_events(e: &mut Enc, events: &[MovedEvent]) {
    e.u32(events.len() as u32);
    for ev in events {
        e.u16(ev.sink).u64(ev.at).u8(ev.kind).bytes(&ev.value);
    }
}

/// `total`: the item's length, which bounds a count read from damaged bytes.
fn decode_events(d: &mut Dec<'_>, total: usize) -> Result<Vec<MovedEvent>, DecodeError> {
    let n = d.u32()? as usize;
    // Each event takes at least 15 bytes: a count past what is left is damage.
    let mut events = Vec::with_capacity(n.min(total / 15));
    for _ in 0..n {
        events.push(MovedEvent {
            sink: d.u16()?,
            at: d.u64()?,
            kind: d.u8()?,
            value: d.bytes()?.to_vec(),
        });
    }
    Ok(events)
}

fn flag(b: u8) -> Option<bool> {
    match b {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ankusa_keyspace::TenantOrd;

    fn hook() -> Moved {
        Moved::Hook(MovedHook {
            seq: 42,
            envelope: b"envelope bytes".to_vec(),
            deliveries: vec![
                MovedDelivery {
                    sink: 0,
                    row: DeliveryRow {
                        ord: TenantOrd(7),
                        size: 14,
                        attempts: 3,
                        last_attempt_at: 1_000,
                        last_status: 503,
                        last_error: "busy".into(),
                    },
                    state: MovedState::Due {
                        at: 2_000,
                        retry: true,
                    },
                },
                MovedDelivery {
                    sink: 1,
                    row: DeliveryRow::default(),
                    state: MovedState::Parked {
                        at: 3_000,
                        retry: false,
                        sink_id: "pull-a".into(),
                    },
                },
                MovedDelivery {
                    sink: 2,
                    row: DeliveryRow::default(),
                    state: MovedState::Dead {
                        at: 4_000,
                        value: DeadValue {
                            ord: TenantOrd(7),
                            size: 14,
                            source: "github".into(),
                            hook_id: "hk_1".into(),
                            sink: "sink-c".into(),
                        },
                    },
                },
            ],
            archive: true,
            log: Some(b"record".to_vec()),
            events: vec![MovedEvent {
                sink: 0,
                at: 1_000,
                kind: 1,
                value: b"event".to_vec(),
            }],
        })
    }

    #[test]
    fn moved_items_round_trip_and_damage_is_an_error() {
        let dedupe = Moved::Dedupe {
            tenant: "acme".into(),
            key: b"delivery-1".to_vec(),
            expires: 9_000,
            id: "hk_1".into(),
        };
        let archived = Moved::Archived {
            seq: 9,
            received: 1_000,
            expires: 86_401_000,
            envelope: b"archived envelope".to_vec(),
        };
        let logged = Moved::Logged {
            seq: 11,
            record: b"record".to_vec(),
            events: vec![MovedEvent {
                sink: 1,
                at: 5_000,
                kind: 2,
                value: b"delivered".to_vec(),
            }],
        };
        let endpoint = Moved::Endpoint {
            tenant: "acme".into(),
            id: "ep_0123456789abcdef".into(),
            record: br#"{"v":1}"#.to_vec(),
        };
        for m in [hook(), dedupe, archived, logged, endpoint] {
            let bytes = m.encode();
            assert_eq!(Moved::decode(&bytes).unwrap(), m);
            for cut in 0..bytes.len() {
                assert!(Moved::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(Moved::decode(&longer).is_err());
        }
    }
}
