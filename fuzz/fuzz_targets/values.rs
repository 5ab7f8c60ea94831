//! Every value codec of the store and queue on any bytes (the hook envelope, the delivery
//! row, the dead row's value, the hook log's record and events, a moved item — which also
//! arrives from another node in a handoff batch): a value or a
//! `DecodeError`, never a panic; and what decodes, encoded again, decodes to the same value.
#![no_main]

use ankusa_keyspace::{AtMs, EventKey, EventKind, Seq, SinkIdx};
use ankusa_records::moved::Moved;
use ankusa_records::{DeadValue, DeliveryRow, Envelope, Event, LogRecord};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|v: &[u8]| {
    if let Ok(e) = Envelope::decode(v) {
        assert_eq!(Envelope::decode(&e.encode()).unwrap(), e);
        let r = LogRecord::decode(&LogRecord::encode_envelope(&e)).unwrap();
        assert_eq!(r, LogRecord::of(&e));
    }
    if let Ok(r) = DeliveryRow::decode(v) {
        assert_eq!(DeliveryRow::decode(&r.encode()).unwrap(), r);
    }
    if let Ok(d) = DeadValue::decode(v) {
        assert_eq!(DeadValue::decode(&d.encode()).unwrap(), d);
    }
    if let Ok(m) = Moved::decode(v) {
        assert_eq!(Moved::decode(&m.encode()).unwrap(), m);
    }
    if let Ok(r) = LogRecord::decode(v) {
        assert!(r.envelope.body.is_empty() || v.len() > r.envelope.body.len());
    }
    for kind in [EventKind::Attempt, EventKind::Replayed, EventKind::Recovered] {
        let key = EventKey {
            seq: Seq(1),
            sink: SinkIdx(2),
            at: AtMs(3),
            kind,
        };
        if let Ok(e) = Event::decode(&key, v) {
            let again = Event::decode(&key, &e.encode()).unwrap();
            // The error is cut to its bound when written: a longer stored one comes back cut.
            assert_eq!(Event { error: again.error.clone(), ..e.clone() }, again);
            assert!(e.error.starts_with(&again.error));
        }
    }
});
