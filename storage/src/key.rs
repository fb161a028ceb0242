//! Order-preserving primary-key encoding (Kudu paper 3.2).
//!
//! A composite key becomes one byte string whose memcmp order equals the tuple order of the key
//! values: integers (and TIMESTAMP/DATE) big-endian with the sign bit flipped; strings and binary
//! verbatim when they are the last key column, otherwise with 0x00 escaped as 0x00 0x01 and
//! terminated by 0x00 0x00 (so a prefix sorts first). The same encoding feeds partitioning, the
//! MemRowSet index and the DiskRowSet key index.

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Int16Type, Int32Type, Int64Type, Int8Type,
    TimestampMicrosecondType,
};
use arrow::util::display::{ArrayFormatter, FormatOptions};

use crate::{Schema, StorageError};

/// Appends the encoding of row `row` of `key_columns` (in key order) to `out`.
/// Unsupported key types encode nothing; schemas never have them (see [`Schema::new`]).
pub fn encode_key_columns(key_columns: &[ArrayRef], row: usize, out: &mut Vec<u8>) {
    encode_key_prefix(key_columns, row, true, out)
}

/// Appends the encoding of row `row` of the leading key columns `columns` to `out`; `whole`
/// when they are all the key columns (the last one is then encoded as a key's last column).
pub(crate) fn encode_key_prefix(columns: &[ArrayRef], row: usize, whole: bool, out: &mut Vec<u8>) {
    let last = match whole {
        true => columns.len().saturating_sub(1),
        false => usize::MAX,
    };
    for (i, column) in columns.iter().enumerate() {
        match column.data_type() {
            DataType::Int8 => out.push((column.as_primitive::<Int8Type>().value(row) as u8) ^ 0x80),
            DataType::Int16 => out.extend_from_slice(
                &((column.as_primitive::<Int16Type>().value(row) as u16) ^ 0x8000).to_be_bytes(),
            ),
            DataType::Int32 => out.extend_from_slice(
                &((column.as_primitive::<Int32Type>().value(row) as u32) ^ (1 << 31)).to_be_bytes(),
            ),
            DataType::Date32 => out.extend_from_slice(
                &((column.as_primitive::<Date32Type>().value(row) as u32) ^ (1 << 31))
                    .to_be_bytes(),
            ),
            DataType::Int64 => out.extend_from_slice(
                &((column.as_primitive::<Int64Type>().value(row) as u64) ^ (1 << 63)).to_be_bytes(),
            ),
            DataType::Timestamp(_, _) => out.extend_from_slice(
                &((column.as_primitive::<TimestampMicrosecondType>().value(row) as u64)
                    ^ (1 << 63))
                    .to_be_bytes(),
            ),
            // Two's complement with the sign bit flipped sorts as the value does.
            DataType::Decimal128(_, _) => out.extend_from_slice(
                &((column.as_primitive::<Decimal128Type>().value(row) as u128) ^ (1 << 127))
                    .to_be_bytes(),
            ),
            DataType::Utf8 => encode_bytes(
                column.as_string::<i32>().value(row).as_bytes(),
                i == last,
                out,
            ),
            DataType::Utf8View => encode_bytes(
                column.as_string_view().value(row).as_bytes(),
                i == last,
                out,
            ),
            DataType::Binary => encode_bytes(column.as_binary::<i32>().value(row), i == last, out),
            _ => {}
        }
    }
}

/// Whether values of `data_type` encode as keys (by [`encode_key_prefix`]).
pub(crate) fn encodes(data_type: &DataType) -> bool {
    use arrow::datatypes::TimeUnit::Microsecond;
    matches!(
        data_type,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Date32
            | DataType::Int64
            | DataType::Timestamp(Microsecond, _)
            | DataType::Decimal128(_, _)
            | DataType::Utf8
            | DataType::Utf8View
            | DataType::Binary
    )
}

fn encode_bytes(bytes: &[u8], last: bool, out: &mut Vec<u8>) {
    if last {
        out.extend_from_slice(bytes);
        return;
    }
    for &b in bytes {
        out.push(b);
        if b == 0 {
            out.push(1);
        }
    }
    out.extend_from_slice(&[0, 0]);
}

/// The key columns of `batch` (found by name), in key order.
pub fn key_arrays(schema: &Schema, batch: &RecordBatch) -> Result<Vec<ArrayRef>, StorageError> {
    schema
        .key_columns()
        .iter()
        .map(|&k| {
            let name = &schema.columns()[k].name;
            batch.column_by_name(name).cloned().ok_or_else(|| {
                StorageError::SchemaMismatch(format!("missing primary key column '{name}'"))
            })
        })
        .collect()
}

/// An encoded key as the MemRowSet holds it: inline up to 24 bytes, as most keys are, so
/// that its index compares the keys inside its nodes instead of following a pointer to each
/// (and a row's key takes no allocation of its own).
pub type KeyBytes = smallvec::SmallVec<[u8; 24]>;

/// Encoded keys of every row of `batch`.
pub fn encode_keys(schema: &Schema, batch: &RecordBatch) -> Result<Vec<Vec<u8>>, StorageError> {
    row_keys(schema, batch)
}

/// Encoded keys of every row of `batch`, as `K` (a `Vec<u8>` or [`KeyBytes`]).
pub(crate) fn row_keys<K: for<'a> From<&'a [u8]>>(
    schema: &Schema,
    batch: &RecordBatch,
) -> Result<Vec<K>, StorageError> {
    let columns = key_arrays(schema, batch)?;
    let mut key = Vec::with_capacity(32);
    Ok((0..batch.num_rows())
        .map(|row| {
            key.clear();
            encode_key_columns(&columns, row, &mut key);
            K::from(key.as_slice())
        })
        .collect())
}

/// A row's key for error messages: `(host='a', ts=2026-01-01T00:00:00Z)`.
pub fn format_key(schema: &Schema, batch: &RecordBatch, row: usize) -> String {
    let options = FormatOptions::default();
    let parts: Vec<String> = schema
        .key_columns()
        .iter()
        .map(|&k| {
            let name = &schema.columns()[k].name;
            let value = batch
                .column_by_name(name)
                .and_then(|c| {
                    ArrayFormatter::try_new(c.as_ref(), &options)
                        .ok()
                        .map(|f| f.value(row).to_string())
                })
                .unwrap_or_default();
            match schema.columns()[k].column_type {
                crate::ColumnType::String | crate::ColumnType::Varchar { .. } => {
                    format!("{name}='{value}'")
                }
                _ => format!("{name}={value}"),
            }
        })
        .collect();
    format!("({})", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn decimal_keys_sort_as_their_values() {
        let values: Vec<i128> = vec![i128::MIN, -10_000, -1, 0, 1, 99, i128::MAX / 3];
        let array: ArrayRef = Arc::new(
            arrow::array::Decimal128Array::from(values.clone())
                .with_precision_and_scale(38, 2)
                .unwrap(),
        );
        let keys: Vec<Vec<u8>> = (0..values.len())
            .map(|r| {
                let mut k = Vec::new();
                encode_key_columns(std::slice::from_ref(&array), r, &mut k);
                k
            })
            .collect();
        for a in 0..values.len() {
            for b in 0..values.len() {
                assert_eq!(keys[a].cmp(&keys[b]), values[a].cmp(&values[b]));
            }
        }
    }

    #[test]
    fn memcmp_order_is_tuple_order() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let strings = ["", "\0", "\0\0", "a", "a\0", "a\0b", "ab", "b", "\u{1}"];
        let n = 400;
        let s: Vec<&str> = (0..n)
            .map(|_| strings[rng.random_range(0..strings.len())])
            .collect();
        let i: Vec<i64> = (0..n)
            .map(|_| rng.random_range(-3..3) * if rng.random() { 1 } else { i64::MAX / 4 })
            .collect();
        let t: Vec<&str> = (0..n)
            .map(|_| strings[rng.random_range(0..strings.len())])
            .collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(s.clone())),
            Arc::new(Int64Array::from(i.clone())),
            Arc::new(StringArray::from(t.clone())),
        ];
        let keys: Vec<Vec<u8>> = (0..n)
            .map(|r| {
                let mut k = Vec::new();
                encode_key_columns(&columns, r, &mut k);
                k
            })
            .collect();
        for a in 0..n {
            for b in 0..n {
                let tuple = (s[a], i[a], t[a]).cmp(&(s[b], i[b], t[b]));
                assert_eq!(
                    keys[a].cmp(&keys[b]),
                    tuple,
                    "{:?} vs {:?}",
                    (s[a], i[a], t[a]),
                    (s[b], i[b], t[b])
                );
            }
        }
    }

    /// A batch repeats a key whether its keys ascend or not: both ways find the same rows.
    #[test]
    fn seen_keys_find_the_repeats() {
        let repeats = |keys: &[&[u8]]| -> Vec<bool> {
            let mut seen = SeenKeys::new(keys);
            keys.iter().map(|k| !seen.first(k)).collect()
        };
        let ascending: [&[u8]; 4] = [b"a", b"ab", b"b", b"c"];
        assert_eq!(repeats(&ascending), [false; 4]);
        let unsorted: [&[u8]; 5] = [b"b", b"a", b"b", b"c", b"a"];
        assert_eq!(repeats(&unsorted), [false, false, true, false, true]);
        // Ascending but for a repeat next to itself.
        let repeated: [&[u8]; 3] = [b"a", b"b", b"b"];
        assert_eq!(repeats(&repeated), [false, false, true]);
    }
}

/// A map by encoded key, with a fast hash (foldhash, seeded per map) instead of SipHash: a
/// transaction locks and looks up every key it writes (SipHash was a tenth of a bulk load's
/// CPU).
pub type KeyMap<V> = std::collections::HashMap<Vec<u8>, V, foldhash::fast::RandomState>;

/// The keys of a batch met so far, to find those the batch repeats. Rows of a sorted load come
/// with their keys ascending, which no key can repeat: that is checked once, with one comparison
/// per row, and the batch then needs no set (hashing every key of a bulk load into one was
/// a twentieth of its CPU). Other batches use a set with a fast hash.
pub(crate) struct SeenKeys<'a> {
    set: Option<std::collections::HashSet<&'a [u8], foldhash::fast::RandomState>>,
}

impl<'a> SeenKeys<'a> {
    /// For the keys of one batch, in row order.
    pub(crate) fn new<K: AsRef<[u8]>>(keys: &'a [K]) -> Self {
        let ascending = keys.windows(2).all(|w| w[0].as_ref() < w[1].as_ref());
        let set = (!ascending).then(|| {
            let mut set = std::collections::HashSet::default();
            set.reserve(keys.len());
            set
        });
        SeenKeys { set }
    }

    /// Whether `key` (a key of the batch, in row order) is met for the first time.
    pub(crate) fn first(&mut self, key: &'a [u8]) -> bool {
        self.set.as_mut().is_none_or(|set| set.insert(key))
    }
}
