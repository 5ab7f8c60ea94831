//! The counters' merge operator: associative signed 64-bit addition.
//!
//! A counter row is only ever written as a merge operand (a delta), never read, changed and
//! put back, so concurrent batches from any number of writers add into the same row without
//! losing a count, and a batch's deltas commit atomically with its row changes.
//!
//! Encoding (operands and stored values alike): `<<version::8, value::64-signed>>`, big
//! endian, version 1. A value that does not decode makes the merge fail, which RocksDB
//! reports as corruption on the read, never as a silent zero. Addition wraps, which keeps
//! the operator associative for every input (a real counter never comes near 2^63).
//!
//! Partial merge (operands only, no base value) returns the sum of the operands, so
//! compaction collapses a run of operands into one and a read applies at most the
//! operands written since the last flush.

/// The encoding version byte of an operand or value.
pub const VERSION: u8 = 1;

/// Encodes a delta (or a value) as a merge operand.
pub fn encode(delta: i64) -> [u8; 9] {
    let mut out = [0u8; 9];
    out[0] = VERSION;
    out[1..].copy_from_slice(&delta.to_be_bytes());
    out
}

/// Decodes an operand or value; `None` if it is not a version-1 encoding.
pub fn decode(bytes: &[u8]) -> Option<i64> {
    match bytes {
        [VERSION, rest @ ..] if rest.len() == 8 => {
            let mut a = [0u8; 8];
            a.copy_from_slice(rest);
            Some(i64::from_be_bytes(a))
        }
        _ => None,
    }
}

/// Sums an optional base value and a run of operands; `None` if any does not decode.
pub fn sum<'a>(base: Option<&[u8]>, operands: impl IntoIterator<Item = &'a [u8]>) -> Option<i64> {
    let mut total = match base {
        Some(b) => decode(b)?,
        None => 0,
    };
    for op in operands {
        total = total.wrapping_add(decode(op)?);
    }
    Some(total)
}

/// The name RocksDB records for the operator (it must never change for existing stores).
pub const NAME: &str = "ankusa.i64_add.v1";

/// Full merge: base value (if any) plus every operand.
pub fn full_merge(
    _key: &[u8],
    existing: Option<&[u8]>,
    operands: &rocksdb::MergeOperands,
) -> Option<Vec<u8>> {
    sum(existing, operands).map(|v| encode(v).to_vec())
}

/// Partial merge: the sum of a run of operands, itself an operand.
pub fn partial_merge(
    _key: &[u8],
    _existing: Option<&[u8]>,
    operands: &rocksdb::MergeOperands,
) -> Option<Vec<u8>> {
    sum(None, operands).map(|v| encode(v).to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn enc_all(v: &[i64]) -> Vec<Vec<u8>> {
        v.iter().map(|d| encode(*d).to_vec()).collect()
    }

    proptest! {
        #[test]
        fn addition_is_associative(a in any::<i64>(), b in any::<i64>(), c in any::<i64>()) {
            let ab = encode(sum(None, [&encode(a)[..], &encode(b)[..]]).unwrap());
            let bc = encode(sum(None, [&encode(b)[..], &encode(c)[..]]).unwrap());
            prop_assert_eq!(
                sum(Some(&ab), [&encode(c)[..]]),
                sum(Some(&encode(a)), [&bc[..]])
            );
        }

        #[test]
        fn partial_merges_equal_a_full_merge(base in proptest::option::of(any::<i32>()), ops in proptest::collection::vec(any::<i32>(), 0..40), split in 0usize..40) {
            // Deltas of i32 range so the exact sum fits in i64 and can be checked directly.
            let ops: Vec<i64> = ops.into_iter().map(i64::from).collect();
            let base_v = base.map(|b| encode(i64::from(b)));
            let enc = enc_all(&ops);
            let full = sum(base_v.as_ref().map(|b| &b[..]), enc.iter().map(|o| o.as_slice()));
            let split = split.min(ops.len());
            let left = encode(sum(None, enc[..split].iter().map(|o| o.as_slice())).unwrap());
            let right = encode(sum(None, enc[split..].iter().map(|o| o.as_slice())).unwrap());
            let staged = sum(base_v.as_ref().map(|b| &b[..]), [&left[..], &right[..]]);
            prop_assert_eq!(full, staged);
            let exact: i64 = base.map(i64::from).unwrap_or(0) + ops.iter().sum::<i64>();
            prop_assert_eq!(full, Some(exact));
        }

        #[test]
        fn values_past_2_pow_31_and_negative_deltas_are_exact(big in (1i64 << 31)..(1i64 << 50), neg in -(1i64 << 40)..0) {
            let total = sum(None, [&encode(big)[..], &encode(big)[..], &encode(neg)[..]]).unwrap();
            prop_assert_eq!(total, 2 * big + neg);
            prop_assert_eq!(decode(&encode(total)), Some(total));
        }
    }

    #[test]
    fn an_undecodable_operand_fails_the_merge() {
        assert_eq!(sum(None, [&b"12"[..]]), None);
        assert_eq!(sum(Some(&[2, 0, 0, 0, 0, 0, 0, 0, 1][..]), []), None);
        assert_eq!(decode(&encode(-5)), Some(-5));
    }
}
