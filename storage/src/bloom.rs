//! Bloom-filter predicates: runtime filters built from the keys of a join's build side.
//!
//! The filter is Parquet's split-block bloom filter (Putze et al.'s cache-efficient blocked
//! design: one 256-bit block per key, eight bits set in it), so checking a value touches one
//! cache line. A value is hashed from its little-endian bytes (its UTF-8 or binary bytes for
//! strings), which is the same for the build keys and the probe column as long as both have the
//! same Arrow type; the SQL layer makes sure they do.
//!
//! A filter only ever removes rows that cannot match, so it may be switched off at any time. It
//! switches itself off when, after a warm-up, it removes less than a tenth of the rows it checks:
//! then hashing costs more than the rows it saves (the heuristic of Kudu's bloom-filter predicate).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, BooleanBufferBuilder};
use arrow::datatypes::DataType;
use parquet::bloom_filter::Sbbf;

use crate::StorageError;

/// Rows a filter checks before it may switch itself off.
pub const BLOOM_WARMUP_ROWS: u64 = 1 << 16;
/// A filter that removes less than 1/`BLOOM_MIN_REMOVED_FRACTION` of the rows it checks is
/// switched off after the warm-up.
const BLOOM_MIN_REMOVED_FRACTION: u64 = 10;
/// False-positive probability the filter is sized for.
const BLOOM_FPP: f64 = 0.01;

/// What a filter did, shared by every tablet scan of one query.
#[derive(Debug, Default)]
pub struct FilterStats {
    pub checked: AtomicU64,
    pub removed: AtomicU64,
    disabled: AtomicBool,
}

impl FilterStats {
    pub fn disabled(&self) -> bool {
        self.disabled.load(Ordering::Relaxed)
    }

    fn record(&self, checked: u64, removed: u64) {
        let checked = self.checked.fetch_add(checked, Ordering::Relaxed) + checked;
        let removed = self.removed.fetch_add(removed, Ordering::Relaxed) + removed;
        if checked >= BLOOM_WARMUP_ROWS && removed * BLOOM_MIN_REMOVED_FRACTION < checked {
            self.disabled.store(true, Ordering::Relaxed);
        }
    }
}

/// A column predicate "the value may be one of the build keys".
pub struct BloomPredicate {
    filter: Sbbf,
    data_type: DataType,
    /// Whether NULL passes (a join where NULL equals NULL and the build side has a NULL key).
    pass_nulls: bool,
    keys: usize,
    pub stats: Arc<FilterStats>,
}

impl fmt::Debug for BloomPredicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BloomPredicate({} keys, {} bytes)",
            self.keys,
            self.filter.num_blocks() * 32
        )
    }
}

impl BloomPredicate {
    /// A filter holding every non-null value of `keys` (arrays of one type), sized for at most
    /// `max_keys` keys (more keys raise the false-positive rate, never the size).
    pub fn build(
        keys: &[ArrayRef],
        pass_nulls: bool,
        max_keys: usize,
    ) -> Result<Self, StorageError> {
        let data_type = keys
            .first()
            .map(|k| k.data_type().clone())
            .unwrap_or(DataType::Null);
        let count: usize = keys.iter().map(|k| k.len() - k.null_count()).sum();
        let sized_for = count.clamp(1, max_keys.max(1)) as u64;
        let mut filter = Sbbf::new_with_ndv_fpp(sized_for, BLOOM_FPP)
            .map_err(|e| StorageError::InvalidPredicate(format!("bloom filter: {e}")))?;
        for array in keys {
            if array.data_type() != &data_type {
                return Err(StorageError::InvalidPredicate(format!(
                    "bloom filter keys of types {data_type} and {}",
                    array.data_type()
                )));
            }
            for_each_value(array.as_ref(), |value| {
                if let Some(bytes) = value {
                    filter.insert(bytes);
                }
            })?;
        }
        Ok(BloomPredicate {
            filter,
            data_type,
            pass_nulls,
            keys: count,
            stats: Arc::default(),
        })
    }

    pub fn num_keys(&self) -> usize {
        self.keys
    }

    /// Which values of `column` may be build keys; all true once the filter switched off.
    pub fn evaluate(&self, column: &dyn Array) -> Result<BooleanArray, StorageError> {
        if self.stats.disabled() {
            return Ok(BooleanArray::from(vec![true; column.len()]));
        }
        if column.data_type() != &self.data_type {
            return Err(StorageError::InvalidPredicate(format!(
                "bloom filter of {} keys applied to a {} column",
                self.data_type,
                column.data_type()
            )));
        }
        let mut keep = BooleanBufferBuilder::new(column.len());
        let mut removed = 0u64;
        for_each_value(column, |value| {
            let pass = match value {
                Some(bytes) => self.filter.check(bytes),
                None => self.pass_nulls,
            };
            removed += u64::from(!pass);
            keep.append(pass);
        })?;
        self.stats.record(column.len() as u64, removed);
        Ok(BooleanArray::new(keep.finish(), None))
    }
}

/// Calls `f` with the bytes of each value of `array` in order (None for NULL).
fn for_each_value(array: &dyn Array, mut f: impl FnMut(Option<&[u8]>)) -> Result<(), StorageError> {
    let data_type = array.data_type();
    match data_type {
        DataType::Utf8 => array
            .as_string::<i32>()
            .iter()
            .for_each(|v| f(v.map(str::as_bytes))),
        DataType::LargeUtf8 => array
            .as_string::<i64>()
            .iter()
            .for_each(|v| f(v.map(str::as_bytes))),
        DataType::Utf8View => array
            .as_string_view()
            .iter()
            .for_each(|v| f(v.map(str::as_bytes))),
        DataType::Binary => array.as_binary::<i32>().iter().for_each(&mut f),
        DataType::LargeBinary => array.as_binary::<i64>().iter().for_each(&mut f),
        DataType::BinaryView => array.as_binary_view().iter().for_each(&mut f),
        DataType::Boolean => array
            .as_boolean()
            .iter()
            .for_each(|v| f(v.map(|b| if b { &[1u8][..] } else { &[0u8][..] }))),
        _ => {
            let Some(width) = data_type.primitive_width() else {
                return Err(StorageError::InvalidPredicate(format!(
                    "no bloom filter for {data_type} values"
                )));
            };
            let data = array.to_data();
            let values = &data.buffers()[0].as_slice()[data.offset() * width..];
            for i in 0..array.len() {
                f(array
                    .is_valid(i)
                    .then(|| &values[i * width..(i + 1) * width]));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};

    #[test]
    fn keeps_every_key_and_removes_most_others() {
        let keys: ArrayRef = Arc::new(Int64Array::from_iter_values((0..2000).map(|i| i * 7)));
        let bloom = BloomPredicate::build(&[keys], false, 1 << 20).unwrap();
        let probe = Int64Array::from_iter((0..14_000).map(Some).chain([None]));
        let keep = bloom.evaluate(&probe).unwrap();
        for i in 0..14_000 {
            if i % 7 == 0 {
                assert!(keep.value(i as usize), "key {i} removed");
            }
        }
        assert!(!keep.value(14_000), "NULL never matches");
        let kept = keep.true_count();
        assert!(kept < 2000 + 12_000 / 20, "{kept} rows kept of 14 000");
    }

    #[test]
    fn strings_sliced_arrays_and_nulls() {
        let keys: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None, Some("ccc")]));
        let bloom = BloomPredicate::build(&[keys], true, 100).unwrap();
        let probe = StringArray::from(vec![Some("x"), Some("ccc"), None, Some("a")]);
        let keep = bloom.evaluate(&probe.slice(1, 3)).unwrap();
        assert_eq!(keep, BooleanArray::from(vec![true, true, true]));
        let wrong_type = Int64Array::from(vec![1]);
        assert!(bloom.evaluate(&wrong_type).is_err());
    }

    #[test]
    fn switches_itself_off_when_it_removes_too_little() {
        let keys: ArrayRef = Arc::new(Int64Array::from_iter_values(0..100_000));
        let bloom = BloomPredicate::build(&[keys], false, 1 << 20).unwrap();
        let probe = Int64Array::from_iter_values(0..(BLOOM_WARMUP_ROWS as i64));
        assert_eq!(bloom.evaluate(&probe).unwrap().true_count(), probe.len());
        assert!(bloom.stats.disabled());
        let outside = Int64Array::from_iter_values(1_000_000..1_000_100);
        assert_eq!(bloom.evaluate(&outside).unwrap().true_count(), 100);
    }
}
