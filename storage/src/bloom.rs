//! Join filters: runtime filters built from the keys of a join's build side, the smallest and
//! largest key (used to skip row groups by their statistics, and per row) and optionally a bloom
//! filter of the keys.
//!
//! The filter is a split-block bloom filter (Putze et al.'s cache-efficient blocked design, as in
//! Parquet and Kudu: one 256-bit block per key, one bit set in each of its eight 32-bit words),
//! so checking a value touches one cache line. Fixed-width values are hashed from their 64-bit
//! integer image with a multiply-xorshift mix, strings and binaries with XXH3; the build keys
//! and the probe column have the same Arrow type (the SQL layer makes sure of it), so equal
//! values hash equally. Checks run column at a time over the Arrow buffers.
//!
//! Integer-like keys (integers, dates, timestamps) are also kept sorted: a column whose values
//! ascend in a batch (a key column read in key order) is tested by a merge with them instead,
//! exactly and without hashing each row.
//!
//! A filter only ever removes rows that cannot match, so it may be switched off at any time. It
//! switches itself off when, after a warm-up, it removes less than a tenth of the rows it checks:
//! then checking costs more than the rows it saves (the heuristic of Kudu's bloom-filter
//! predicate).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use arrow::buffer::BooleanBuffer;
use arrow::compute::kernels::cmp;
use arrow::datatypes::{
    DataType, Date32Type, Date64Type, Decimal128Type, Float32Type, Float64Type, Int16Type,
    Int32Type, Int64Type, Int8Type, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use twox_hash::XxHash3_64;

use crate::{Scalar, StorageError};

/// Rows a filter checks before it may switch itself off.
pub const BLOOM_WARMUP_ROWS: u64 = 1 << 16;
/// A filter that removes less than 1/`BLOOM_MIN_REMOVED_FRACTION` of the rows it checks is
/// switched off after the warm-up.
const BLOOM_MIN_REMOVED_FRACTION: u64 = 10;
/// Filter bits per key: about 1 % false positives for a split-block filter.
const BITS_PER_KEY: usize = 12;
/// A filter of at most this many keys also keeps the keys themselves, which a scan of the
/// first key column can look up in the key indexes instead of reading every row.
const MAX_LISTED_KEYS: usize = 1 << 16;
/// A filter of integer-like keys keeps them sorted when there are at most this many (8 bytes
/// each), to test a column whose values ascend by a merge instead of the bloom filter.
const MAX_SORTED_KEYS: usize = 1 << 20;

/// The split-block bloom filter: 256-bit blocks, eight salted bits per key.
pub(crate) struct SplitBlockFilter {
    blocks: Vec<[u32; 8]>,
}

/// Odd constants that pick one bit in each word of a block (Parquet's and Kudu's salts).
const SALT: [u32; 8] = [
    0x47b6137b, 0x44974d91, 0x8824ad5b, 0xa2b7289d, 0x705495c7, 0x2df1424b, 0x9efc4947, 0x5c6bfb31,
];

impl SplitBlockFilter {
    pub(crate) fn with_keys(keys: usize) -> Self {
        let blocks = (keys * BITS_PER_KEY)
            .div_ceil(256)
            .next_power_of_two()
            .max(1);
        SplitBlockFilter {
            blocks: vec![[0; 8]; blocks],
        }
    }

    fn block(&self, hash: u64) -> usize {
        (((hash >> 32) * self.blocks.len() as u64) >> 32) as usize
    }

    fn mask(hash: u64) -> [u32; 8] {
        let low = hash as u32;
        SALT.map(|salt| 1u32 << (low.wrapping_mul(salt) >> 27))
    }

    pub(crate) fn insert(&mut self, hash: u64) {
        let i = self.block(hash);
        let mask = Self::mask(hash);
        for (word, bit) in self.blocks[i].iter_mut().zip(mask) {
            *word |= bit;
        }
    }

    pub(crate) fn check(&self, hash: u64) -> bool {
        let block = &self.blocks[self.block(hash)];
        let mask = Self::mask(hash);
        // Branch-free over the eight words.
        let mut missing = 0u32;
        for (word, bit) in block.iter().zip(mask) {
            missing |= (word & bit) ^ bit;
        }
        missing == 0
    }

    pub(crate) fn bytes(&self) -> usize {
        self.blocks.len() * 32
    }
}

/// The hash of a fixed-width value's 64-bit image.
fn hash_u64(v: u64) -> u64 {
    let h = (v ^ 0x2545_f491_4f6c_dd1d).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^ (h >> 29)
}

pub(crate) fn hash_bytes(v: &[u8]) -> u64 {
    XxHash3_64::oneshot(v)
}

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
pub struct JoinFilter {
    /// Smallest and largest build key (one-element arrays of the key type).
    bounds: Option<(Scalar, Scalar)>,
    bloom: Option<SplitBlockFilter>,
    data_type: DataType,
    /// Whether NULL passes (a join where NULL equals NULL and the build side has a NULL key).
    pass_nulls: bool,
    keys: usize,
    /// The keys, when there are at most [`MAX_LISTED_KEYS`]; and their key encodings
    /// (sorted, distinct), made when first asked for.
    listed: Option<Vec<ArrayRef>>,
    encoded: OnceLock<Option<Vec<Vec<u8>>>>,
    /// The keys' 64-bit integer images, sorted and distinct, when their values order as those
    /// images (integers, dates, timestamps) and there are at most [`MAX_SORTED_KEYS`]: a
    /// column whose values ascend (a key column read in key order, several rows per key) is
    /// tested by a merge with them — exact, and cheaper than hashing and probing each row.
    sorted: Option<Vec<i64>>,
    pub stats: Arc<FilterStats>,
}

impl fmt::Debug for JoinFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "JoinFilter(bounds: {:?}, bloom: {} keys in {} bytes)",
            self.bounds,
            self.keys,
            self.bloom.as_ref().map_or(0, SplitBlockFilter::bytes)
        )
    }
}

impl JoinFilter {
    /// A filter of values of `data_type` between `bounds` (inclusive; None: no bounds). NULL
    /// passes only with `pass_nulls` (a join where NULL equals NULL and the build side has a
    /// NULL key; it then has no bounds).
    pub fn new(data_type: DataType, bounds: Option<(Scalar, Scalar)>, pass_nulls: bool) -> Self {
        JoinFilter {
            bounds,
            bloom: None,
            data_type,
            pass_nulls,
            keys: 0,
            listed: None,
            encoded: OnceLock::new(),
            sorted: None,
            stats: Arc::default(),
        }
    }

    /// Adds a bloom filter of every non-null value of `keys` (arrays of the filter's type),
    /// sized for at most `max_keys` keys (more keys raise the false-positive rate, never the
    /// size). A few keys are also kept as they are (see [`Self::encoded_keys`]).
    pub fn add_bloom(&mut self, keys: &[ArrayRef], max_keys: usize) -> Result<(), StorageError> {
        let count: usize = keys.iter().map(|k| k.len() - k.null_count()).sum();
        let mut filter = SplitBlockFilter::with_keys(count.clamp(1, max_keys.max(1)));
        for array in keys {
            if !same_values(array.data_type(), &self.data_type) {
                return Err(StorageError::InvalidPredicate(format!(
                    "bloom filter keys of types {} and {}",
                    self.data_type,
                    array.data_type()
                )));
            }
            let mut hashes = Vec::with_capacity(array.len());
            map_hashes(array.as_ref(), |hash| {
                hashes.push(hash);
                true
            })?;
            let nulls = array.logical_nulls();
            for (i, hash) in hashes.into_iter().enumerate() {
                if nulls.as_ref().is_none_or(|n| n.is_valid(i)) {
                    filter.insert(hash);
                }
            }
        }
        self.bloom = Some(filter);
        self.keys = count;
        self.listed = (count <= MAX_LISTED_KEYS).then(|| keys.to_vec());
        self.sorted = match count <= MAX_SORTED_KEYS && orders_as_i64(&self.data_type) {
            true => sorted_images(keys),
            false => None,
        };
        Ok(())
    }

    /// The keys the filter keeps as they are (at most [`MAX_LISTED_KEYS`]), NULLs included.
    pub fn listed(&self) -> Option<&[ArrayRef]> {
        self.listed.as_deref()
    }

    /// This filter for the rows of one partition: only the listed keys `keep` marks (one flag
    /// per row of [`Self::listed`], in order), with a bloom filter and sorted keys of their
    /// own; bounds, NULL handling and statistics as this filter's. None if it lists no keys.
    pub fn narrowed(&self, keep: &BooleanArray) -> Result<Option<JoinFilter>, StorageError> {
        let Some(listed) = &self.listed else {
            return Ok(None);
        };
        if keep.len() != listed.iter().map(|a| a.len()).sum::<usize>() {
            return Err(StorageError::InvalidPredicate(
                "a join filter narrowed by flags for another number of keys".into(),
            ));
        }
        let mut offset = 0;
        let mut kept = Vec::with_capacity(listed.len());
        for array in listed {
            let flags = keep.slice(offset, array.len());
            kept.push(arrow::compute::filter(array, &flags)?);
            offset += array.len();
        }
        let mut narrowed =
            JoinFilter::new(self.data_type.clone(), self.bounds.clone(), self.pass_nulls);
        narrowed.add_bloom(&kept, usize::MAX)?;
        narrowed.stats = self.stats.clone();
        Ok(Some(narrowed))
    }

    /// The filter's keys as one-column primary keys encode them (sorted, distinct; no NULL),
    /// when it keeps them ([`MAX_LISTED_KEYS`]) and their type can be a key's.
    pub(crate) fn encoded_keys(&self) -> Option<&[Vec<u8>]> {
        let encode = || {
            let arrays = self.listed.as_ref()?;
            if !crate::key::encodes(&self.data_type) {
                return None;
            }
            let mut keys = Vec::with_capacity(self.keys);
            for array in arrays {
                for row in (0..array.len()).filter(|&r| array.is_valid(r)) {
                    let mut key = Vec::new();
                    crate::key::encode_key_columns(std::slice::from_ref(array), row, &mut key);
                    keys.push(key);
                }
            }
            keys.sort_unstable();
            keys.dedup();
            Some(keys)
        };
        self.encoded.get_or_init(encode).as_deref()
    }

    /// Whether the filter's keys are values of `data_type` (strings or binaries in any
    /// layout).
    pub(crate) fn has_values_of(&self, data_type: &DataType) -> bool {
        same_values(&self.data_type, data_type)
    }

    pub fn bounds(&self) -> Option<&(Scalar, Scalar)> {
        self.bounds.as_ref()
    }

    pub fn has_bloom(&self) -> bool {
        self.bloom.is_some()
    }

    /// Keys in the bloom filter.
    pub fn num_keys(&self) -> usize {
        self.keys
    }

    /// Which values of `column` may be build keys (checking the bounds only if `check_bounds`);
    /// all true once the filter switched off.
    pub fn evaluate(
        &self,
        column: &dyn Array,
        check_bounds: bool,
    ) -> Result<BooleanArray, StorageError> {
        let all = || BooleanArray::new(BooleanBuffer::new_set(column.len()), None);
        if self.stats.disabled() {
            return Ok(all());
        }
        if !same_values(column.data_type(), &self.data_type) {
            return Err(StorageError::InvalidPredicate(format!(
                "join filter of {} keys applied to a {} column",
                self.data_type,
                column.data_type()
            )));
        }
        let mut keep: Option<BooleanBuffer> = None;
        if let (true, Some((min, max))) = (check_bounds, &self.bounds) {
            let s = |v: &Scalar| v.datum_of(column.data_type());
            let inside = arrow::compute::and(
                &cmp::gt_eq(&column, &s(min)?)?,
                &cmp::lt_eq(&column, &s(max)?)?,
            )?;
            // NULL compares as unknown: not inside.
            keep = Some(match inside.nulls() {
                Some(nulls) => inside.values() & nulls.inner(),
                None => inside.values().clone(),
            });
        }
        if let Some(bloom) = &self.bloom {
            let merged = (self.sorted.as_deref()).and_then(|keys| merge_with(column, keys));
            let mut hits = match merged {
                Some(hits) => hits,
                None => {
                    // A run of equal values is checked once: equal hashes, equal answers.
                    let mut last: Option<(u64, bool)> = None;
                    map_hashes(column, |hash| match last {
                        Some((previous, hit)) if previous == hash => hit,
                        _ => {
                            let hit = bloom.check(hash);
                            last = Some((hash, hit));
                            hit
                        }
                    })?
                }
            };
            if let Some(nulls) = column.logical_nulls() {
                hits = if self.pass_nulls {
                    &hits | &!nulls.inner()
                } else {
                    &hits & nulls.inner()
                };
            }
            keep = Some(match keep {
                Some(inside) => &inside & &hits,
                None => hits,
            });
        }
        let Some(keep) = keep else {
            return Ok(all());
        };
        self.stats.record(
            column.len() as u64,
            (column.len() - keep.count_set_bits()) as u64,
        );
        Ok(BooleanArray::new(keep, None))
    }
}

/// Whether values of `data_type` order as their 64-bit integer images (as arrow casts them to
/// `Int64`).
fn orders_as_i64(data_type: &DataType) -> bool {
    use DataType::*;
    matches!(
        data_type,
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | Date32 | Date64 | Timestamp(..)
    )
}

/// The non-null values of `arrays` as `Int64`, sorted and distinct; None if one cannot be cast.
fn sorted_images(arrays: &[ArrayRef]) -> Option<Vec<i64>> {
    let mut images = Vec::new();
    for array in arrays {
        let cast = arrow::compute::cast(array, &DataType::Int64).ok()?;
        images.extend(cast.as_primitive::<Int64Type>().iter().flatten());
    }
    images.sort_unstable();
    images.dedup();
    Some(images)
}

/// Which slots of `column` hold one of `keys` (sorted, distinct `Int64` images), found by
/// walking both in order; None unless the column's values (as `Int64`, NULL slots included)
/// ascend.
fn merge_with(column: &dyn Array, keys: &[i64]) -> Option<BooleanBuffer> {
    let cast = arrow::compute::cast(column, &DataType::Int64).ok()?;
    let values = cast.as_primitive::<Int64Type>().values();
    if !values.windows(2).all(|pair| pair[0] <= pair[1]) {
        return None;
    }
    let first = values.first().copied().unwrap_or(i64::MAX);
    let mut next = keys.partition_point(|&k| k < first);
    Some(BooleanBuffer::collect_bool(values.len(), |i| {
        let value = values[i];
        while next < keys.len() && keys[next] < value {
            next += 1;
        }
        next < keys.len() && keys[next] == value
    }))
}

/// `f(hash)` for each slot of `array` (whatever a NULL slot holds: callers mask NULLs out),
/// packed into bits.
fn map_hashes(
    array: &dyn Array,
    mut f: impl FnMut(u64) -> bool,
) -> Result<BooleanBuffer, StorageError> {
    let n = array.len();
    macro_rules! primitive {
        ($t:ty) => {{
            let values = array.as_primitive::<$t>().values();
            BooleanBuffer::collect_bool(n, |i| f(hash_u64(values[i].to_bits_u64())))
        }};
    }
    macro_rules! bytes {
        ($array:expr) => {{
            let array = $array;
            BooleanBuffer::collect_bool(n, |i| {
                f(if array.is_valid(i) {
                    hash_bytes(array.value(i).as_ref())
                } else {
                    0
                })
            })
        }};
    }
    Ok(match array.data_type() {
        DataType::Int8 => primitive!(Int8Type),
        DataType::Int16 => primitive!(Int16Type),
        DataType::Int32 => primitive!(Int32Type),
        DataType::Int64 => primitive!(Int64Type),
        DataType::UInt8 => primitive!(UInt8Type),
        DataType::UInt16 => primitive!(UInt16Type),
        DataType::UInt32 => primitive!(UInt32Type),
        DataType::UInt64 => primitive!(UInt64Type),
        DataType::Float32 => primitive!(Float32Type),
        DataType::Float64 => primitive!(Float64Type),
        DataType::Date32 => primitive!(Date32Type),
        DataType::Date64 => primitive!(Date64Type),
        DataType::Decimal128(_, _) => primitive!(Decimal128Type),
        DataType::Timestamp(unit, _) => match unit {
            arrow::datatypes::TimeUnit::Second => primitive!(TimestampSecondType),
            arrow::datatypes::TimeUnit::Millisecond => primitive!(TimestampMillisecondType),
            arrow::datatypes::TimeUnit::Microsecond => primitive!(TimestampMicrosecondType),
            arrow::datatypes::TimeUnit::Nanosecond => primitive!(TimestampNanosecondType),
        },
        DataType::Boolean => {
            let values = array.as_boolean().values();
            BooleanBuffer::collect_bool(n, |i| f(hash_u64(u64::from(values.value(i)))))
        }
        DataType::Utf8 => bytes!(array.as_string::<i32>()),
        DataType::LargeUtf8 => bytes!(array.as_string::<i64>()),
        DataType::Utf8View => bytes!(array.as_string_view()),
        DataType::Binary => bytes!(array.as_binary::<i32>()),
        DataType::LargeBinary => bytes!(array.as_binary::<i64>()),
        DataType::BinaryView => bytes!(array.as_binary_view()),
        other => {
            return Err(StorageError::InvalidPredicate(format!(
                "no bloom filter for {other} values"
            )))
        }
    })
}

/// Whether values of types `a` and `b` hash alike: the same type, or strings (or binaries) in
/// different layouts (`Utf8` rows meet `Utf8View` join keys).
fn same_values(a: &DataType, b: &DataType) -> bool {
    use DataType::*;
    let strings = |t: &DataType| matches!(t, Utf8 | LargeUtf8 | Utf8View);
    let binaries = |t: &DataType| matches!(t, Binary | LargeBinary | BinaryView);
    a == b || (strings(a) && strings(b)) || (binaries(a) && binaries(b))
}

/// The 64-bit image of a fixed-width value, the same for equal values of one type.
trait ToBitsU64 {
    fn to_bits_u64(&self) -> u64;
}

macro_rules! to_bits_int {
    ($($t:ty),*) => {$(
        impl ToBitsU64 for $t {
            fn to_bits_u64(&self) -> u64 {
                *self as u64
            }
        }
    )*};
}
to_bits_int!(i8, i16, i32, i64, u8, u16, u32, u64);

impl ToBitsU64 for i128 {
    fn to_bits_u64(&self) -> u64 {
        (*self as u64) ^ hash_u64((*self >> 64) as u64)
    }
}

// -0.0 and 0.0 are equal, so they hash alike.
impl ToBitsU64 for f32 {
    fn to_bits_u64(&self) -> u64 {
        if *self == 0.0 {
            0
        } else {
            u64::from(self.to_bits())
        }
    }
}

impl ToBitsU64 for f64 {
    fn to_bits_u64(&self) -> u64 {
        if *self == 0.0 {
            0
        } else {
            self.to_bits()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};

    fn bloom_of(data_type: DataType, keys: ArrayRef, pass_nulls: bool, max: usize) -> JoinFilter {
        let mut filter = JoinFilter::new(data_type, None, pass_nulls);
        filter.add_bloom(&[keys], max).unwrap();
        filter
    }

    #[test]
    fn keeps_every_key_and_removes_most_others() {
        let keys: ArrayRef = Arc::new(Int64Array::from_iter_values((0..2000).map(|i| i * 7)));
        let bloom = bloom_of(DataType::Int64, keys, false, 1 << 20);
        let probe = Int64Array::from_iter((0..14_000).map(Some).chain([None]));
        let keep = bloom.evaluate(&probe, true).unwrap();
        for i in 0..14_000 {
            if i % 7 == 0 {
                assert!(keep.value(i as usize), "key {i} removed");
            }
        }
        assert!(!keep.value(14_000), "NULL never matches");
        let kept = keep.true_count();
        assert!(kept < 2000 + 12_000 / 20, "{kept} rows kept of 14 000");
    }

    /// A column whose values ascend (runs of equal values, gaps, values beyond the keys on
    /// both sides) is tested against the sorted keys by a merge: exactly the keys' rows pass,
    /// with no false positive; the same values out of order take the bloom filter and keep
    /// every key's row.
    #[test]
    fn ascending_columns_are_merged_with_the_sorted_keys() {
        let key_values: Vec<i64> = (0..5_000).map(|i| i * 6 - 9_000).collect();
        let keys: ArrayRef = Arc::new(Int64Array::from(key_values.clone()));
        let filter = bloom_of(DataType::Int64, keys, false, 1 << 20);
        let ascending: Vec<i64> = (-12_000..24_000).map(|i| i / 2).collect();
        let keep = filter
            .evaluate(&Int64Array::from(ascending.clone()), false)
            .unwrap();
        for (i, v) in ascending.iter().enumerate() {
            assert_eq!(keep.value(i), key_values.binary_search(v).is_ok(), "{v}");
        }
        // Out of order: no key's row lost (and some false positives are likely).
        let mut shuffled = ascending.clone();
        shuffled.reverse();
        let keep = filter
            .evaluate(&Int64Array::from(shuffled.clone()), false)
            .unwrap();
        for (i, v) in shuffled.iter().enumerate() {
            if key_values.binary_search(v).is_ok() {
                assert!(keep.value(i), "{v}");
            }
        }
        // Dates, and keys given in several unsorted arrays with NULLs and repeats.
        let days =
            |v: Vec<Option<i32>>| -> ArrayRef { Arc::new(arrow::array::Date32Array::from(v)) };
        let mut filter = JoinFilter::new(DataType::Date32, None, false);
        filter
            .add_bloom(
                &[
                    days(vec![Some(30), None, Some(10)]),
                    days(vec![Some(20), Some(10)]),
                ],
                100,
            )
            .unwrap();
        let probe = arrow::array::Date32Array::from((0..40).collect::<Vec<i32>>());
        let keep = filter.evaluate(&probe, false).unwrap();
        let passed: Vec<i32> = (0..40).filter(|&i| keep.value(i as usize)).collect();
        assert_eq!(passed, vec![10, 20, 30]);
    }

    /// A narrowed filter keeps exactly the flagged keys (NULL passing as before) and shares
    /// the statistics; flags for another number of keys are refused.
    #[test]
    fn narrowed_filters_keep_only_the_flagged_keys() {
        let keys: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![Some(1), None, Some(5)])),
            Arc::new(Int64Array::from(vec![Some(9), Some(12)])),
        ];
        let mut filter = JoinFilter::new(DataType::Int64, None, true);
        filter.add_bloom(&keys, 100).unwrap();
        let keep = BooleanArray::from(vec![true, true, false, false, true]);
        let narrowed = filter.narrowed(&keep).unwrap().unwrap();
        assert!(Arc::ptr_eq(&narrowed.stats, &filter.stats));
        let probe = Int64Array::from(vec![Some(1), Some(5), Some(9), Some(12), None]);
        let passed = narrowed.evaluate(&probe, false).unwrap();
        assert_eq!(
            passed,
            BooleanArray::from(vec![true, false, false, true, true])
        );
        assert!(filter.narrowed(&BooleanArray::from(vec![true])).is_err());
    }

    /// Runs of equal values (checked once each) give what each value alone gives, NULLs
    /// within a run too; keys in runs, with NULLs among them, are all kept.
    #[test]
    fn runs_of_equal_values_match_each_value_alone() {
        let keys: ArrayRef = Arc::new(Int64Array::from_iter(
            (0..1500).map(|i| (i % 7 != 3).then_some(i / 3 * 3)),
        ));
        let bloom = bloom_of(DataType::Int64, keys, false, 1 << 20);
        let runs = Int64Array::from_iter((0..6_000).map(|i| (i % 97 != 5).then_some(i / 4)));
        let keep = bloom.evaluate(&runs, true).unwrap();
        for i in 0..runs.len() {
            let alone = Int64Array::from(vec![runs.is_valid(i).then(|| runs.value(i))]);
            let expected = bloom.evaluate(&alone, true).unwrap().value(0);
            assert_eq!(keep.value(i), expected, "row {i}");
        }
        assert!(keep.true_count() >= 4 * 500 - 30, "{}", keep.true_count());
    }

    #[test]
    fn strings_sliced_arrays_and_nulls() {
        let keys: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), None, Some("ccc")]));
        let bloom = bloom_of(DataType::Utf8, keys, true, 100);
        let probe = StringArray::from(vec![Some("x"), Some("ccc"), None, Some("a")]);
        let keep = bloom.evaluate(&probe.slice(1, 3), true).unwrap();
        assert_eq!(keep, BooleanArray::from(vec![true, true, true]));
        let wrong_type = Int64Array::from(vec![1]);
        assert!(bloom.evaluate(&wrong_type, true).is_err());
    }

    #[test]
    fn switches_itself_off_when_it_removes_too_little() {
        let keys: ArrayRef = Arc::new(Int64Array::from_iter_values(0..100_000));
        let bloom = bloom_of(DataType::Int64, keys, false, 1 << 20);
        let probe = Int64Array::from_iter_values(0..(BLOOM_WARMUP_ROWS as i64));
        assert_eq!(
            bloom.evaluate(&probe, true).unwrap().true_count(),
            probe.len()
        );
        assert!(bloom.stats.disabled());
        let outside = Int64Array::from_iter_values(1_000_000..1_000_100);
        assert_eq!(bloom.evaluate(&outside, true).unwrap().true_count(), 100);
    }
}

#[cfg(test)]
mod bounds_tests {
    use super::*;
    use arrow::array::Int64Array;

    #[test]
    fn bounds_remove_nulls_and_values_outside() {
        let bound = |v: i64| Scalar(Arc::new(Int64Array::from(vec![v])));
        let filter = JoinFilter::new(DataType::Int64, Some((bound(10), bound(20))), false);
        let probe = Int64Array::from(vec![Some(5), Some(10), None, Some(20), Some(21)]);
        let keep = filter.evaluate(&probe, true).unwrap();
        assert_eq!(
            keep,
            BooleanArray::from(vec![false, true, false, true, false])
        );
        assert_eq!(filter.evaluate(&probe, false).unwrap().true_count(), 5);
    }
}
