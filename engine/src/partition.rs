//! Partitioning (Kudu paper 3.2): zero or more hash levels, then an optional range level.
//!
//! A row's bucket in a hash level is the xxh64 of the memcmp-comparable encoding of that level's
//! columns (seeded by the level's position) modulo its bucket count. Its range key is the same
//! encoding of the range columns; the range partitions are disjoint half-open intervals of range
//! keys, and a row outside all of them is rejected. Every range partition holds one tablet per
//! combination of hash buckets, so tablet `r * B + c` is range `r` and bucket combination `c`
//! (mixed radix, first level most significant), with `B` the product of the bucket counts.
//!
//! A table without a declared key is keyed by its hidden auto_incrementing_id alone, which the
//! tablet's leader assigns after the row's tablet is chosen: its one hash level places id `i` in
//! bucket `i % buckets`, a new row goes to any bucket (a batch's rows spread over them), and the
//! leader gives it an id of its bucket ([`PartitionSchema::auto_ids`]).

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray, UInt32Array};
use arrow::compute::{cast_with_options, take_record_batch, CastOptions};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use nyala_storage::{
    encode_key_columns, equality_combinations, AutoIds, ColumnPredicate, ColumnType, PredicateOp,
    Scalar, Schema,
};
use serde::{Deserialize, Serialize};

use crate::{EngineError, Result};

/// Most value combinations of a level's columns that partition pruning enumerates.
pub const MAX_PRUNING_COMBINATIONS: usize = 1024;
/// Most buckets in one hash level.
pub const MAX_BUCKETS: u32 = 1024;
/// Most tablets one table may have.
pub const MAX_TABLETS: usize = 10_000;

/// One hash level: `HASH (columns) INTO buckets BUCKETS`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HashLevel {
    /// Indexes (into the table schema) of the hash columns; a subset of the primary key.
    pub columns: Vec<usize>,
    pub buckets: u32,
}

/// A range bound as written: the value of each range column (as text) and whether the bound
/// itself is in the range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundSpec {
    pub values: Vec<String>,
    pub inclusive: bool,
}

/// A hash level as written, by column names (none: the primary key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashSpec {
    pub columns: Vec<String>,
    pub buckets: u32,
}

/// A range partition as written; `None` is unbounded. `hash`: the range's own hash levels
/// (Kudu 1.17's range-specific hash schemas); empty: the table's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeSpec {
    pub lower: Option<BoundSpec>,
    pub upper: Option<BoundSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hash: Vec<HashSpec>,
}

/// A checked range bound: its values in their type's canonical text, and its range key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RangeBound {
    pub values: Vec<String>,
    pub inclusive: bool,
    /// For a lower bound, the smallest range key in the range; for an upper bound, the smallest
    /// range key above it.
    key: Vec<u8>,
}

/// One range partition: the range keys from `lower` (inclusive) to `upper` (exclusive).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RangePartition {
    pub lower: Option<RangeBound>,
    pub upper: Option<RangeBound>,
    /// The types of the range columns, for quoting the values in [`fmt::Display`].
    quoted: Vec<bool>,
    /// The range's own hash levels (None: the table's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<Vec<HashLevel>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionSchema {
    pub hash: Vec<HashLevel>,
    /// The range columns (a subset of the primary key); empty when there is no range level,
    /// and then `ranges` is one unbounded range.
    pub range_columns: Vec<usize>,
    /// Sorted and disjoint.
    pub ranges: Vec<RangePartition>,
}

impl PartitionSchema {
    /// Validates the partitioning against the table schema. Without range columns the table
    /// has one unbounded range; with them, exactly the ranges given (possibly none yet).
    pub fn new(
        schema: &Schema,
        hash: Vec<HashLevel>,
        range_columns: Vec<usize>,
        ranges: Vec<RangeSpec>,
    ) -> Result<Self> {
        if schema.is_keyless() {
            let auto = schema.key_columns();
            if hash.len() > 1 || hash.iter().any(|l| l.columns != auto) || !range_columns.is_empty()
            {
                return Err(EngineError::InvalidTable(
                    "a table without a primary key is distributed by its hidden \
                     auto_incrementing_id alone: DISTRIBUTE BY HASH INTO n BUCKETS"
                        .into(),
                ));
            }
        }
        check_hash_levels(schema, &hash)?;
        check_key_columns(schema, &range_columns, "range")?;
        if range_columns.is_empty() && !ranges.is_empty() {
            return Err(EngineError::InvalidTable(
                "range partitions need range columns: RANGE (column, ...)".into(),
            ));
        }
        let mut partition = Self {
            hash,
            range_columns,
            ranges: vec![],
        };
        if partition.range_columns.is_empty() {
            partition.ranges.push(RangePartition::unbounded());
        }
        for spec in &ranges {
            let range = partition.range(schema, spec)?;
            partition.insert_range(range)?;
        }
        if partition.num_tablets() > MAX_TABLETS {
            return Err(EngineError::InvalidTable(format!(
                "the partitioning makes {} tablets; at most {MAX_TABLETS} are allowed",
                partition.num_tablets()
            )));
        }
        Ok(partition)
    }

    /// One tablet: the partitioning of a table created without DISTRIBUTE BY.
    pub fn single() -> Self {
        Self {
            hash: vec![],
            range_columns: vec![],
            ranges: vec![RangePartition::unbounded()],
        }
    }

    /// The same partitioning after the table's columns moved: column `c` is now `moved(c)`.
    pub fn with_columns_moved(&self, moved: impl Fn(usize) -> usize) -> Self {
        let mut partition = self.clone();
        for level in &mut partition.hash {
            level.columns.iter_mut().for_each(|c| *c = moved(*c));
        }
        partition
            .range_columns
            .iter_mut()
            .for_each(|c| *c = moved(*c));
        for level in partition
            .ranges
            .iter_mut()
            .flat_map(|r| r.hash.iter_mut().flatten())
        {
            level.columns.iter_mut().for_each(|c| *c = moved(*c));
        }
        partition
    }

    /// The hash levels of range partition `r`: its own, or the table's.
    fn range_hash(&self, r: usize) -> &[HashLevel] {
        match self.ranges.get(r).and_then(|range| range.hash.as_deref()) {
            Some(levels) => levels,
            None => &self.hash,
        }
    }

    /// The tablets of range partition `r`: one per combination of its hash buckets, after
    /// those of the ranges before it.
    pub fn range_tablets(&self, r: usize) -> std::ops::Range<usize> {
        let count = |r: usize| buckets_product(self.range_hash(r));
        let start = (0..r).map(count).sum();
        start..start + count(r)
    }

    /// The range partition holding tablet `tablet`, and the tablet's bucket combination in it.
    fn range_of_tablet(&self, tablet: usize) -> (usize, usize) {
        let mut start = 0;
        for r in 0..self.ranges.len() {
            let count = buckets_product(self.range_hash(r));
            if tablet < start + count {
                return (r, tablet - start);
            }
            start += count;
        }
        (self.ranges.len().saturating_sub(1), 0)
    }

    pub fn num_tablets(&self) -> usize {
        (0..self.ranges.len()).fold(0usize, |n, r| {
            n.saturating_add(buckets_product(self.range_hash(r)))
        })
    }

    /// Checks `spec` against the range columns' types.
    fn range(&self, schema: &Schema, spec: &RangeSpec) -> Result<RangePartition> {
        if self.range_columns.is_empty() {
            return Err(EngineError::InvalidTable(
                "the table has no range partitioning".into(),
            ));
        }
        let quoted = self
            .range_columns
            .iter()
            .map(|&c| {
                !matches!(
                    schema.columns()[c].column_type,
                    ColumnType::Int8
                        | ColumnType::Int16
                        | ColumnType::Int32
                        | ColumnType::Int64
                        | ColumnType::Decimal { .. }
                        | ColumnType::Bool
                )
            })
            .collect();
        let bound = |b: &BoundSpec, lower: bool| -> Result<RangeBound> {
            let (values, mut key) = self.encode_bound(schema, &b.values)?;
            // The successor of a key in memcmp order is the key followed by a zero byte.
            if lower != b.inclusive {
                key.push(0);
            }
            Ok(RangeBound {
                values,
                inclusive: b.inclusive,
                key,
            })
        };
        let hash = match spec.hash.is_empty() {
            true => None,
            false => {
                let levels = (spec.hash.iter())
                    .map(|level| {
                        let columns = match level.columns.is_empty() {
                            true => schema.declared_key_columns().to_vec(),
                            false => (level.columns.iter())
                                .map(|name| {
                                    schema.column_index(name).ok_or_else(|| {
                                        EngineError::InvalidTable(format!(
                                            "unknown column '{name}' in a range partition's HASH"
                                        ))
                                    })
                                })
                                .collect::<Result<_>>()?,
                        };
                        Ok(HashLevel {
                            columns,
                            buckets: level.buckets,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                check_hash_levels(schema, &levels)?;
                Some(levels)
            }
        };
        let range = RangePartition {
            lower: spec.lower.as_ref().map(|b| bound(b, true)).transpose()?,
            upper: spec.upper.as_ref().map(|b| bound(b, false)).transpose()?,
            quoted,
            hash,
        };
        if let (Some(l), Some(u)) = (&range.lower, &range.upper) {
            if l.key >= u.key {
                return Err(EngineError::InvalidTable(format!(
                    "range partition {range} is empty: its lower bound is not below its upper bound"
                )));
            }
        }
        Ok(range)
    }

    /// The canonical text and the range key of a bound's values.
    fn encode_bound(&self, schema: &Schema, values: &[String]) -> Result<(Vec<String>, Vec<u8>)> {
        if values.len() != self.range_columns.len() {
            return Err(EngineError::InvalidTable(format!(
                "a range bound needs {} value(s), one per range column ({}), got {}",
                self.range_columns.len(),
                schema.column_list(&self.range_columns),
                values.len()
            )));
        }
        let options = CastOptions {
            safe: false,
            ..Default::default()
        };
        let mut arrays = Vec::with_capacity(values.len());
        let mut canonical = Vec::with_capacity(values.len());
        for (&c, text) in self.range_columns.iter().zip(values) {
            let column = &schema.columns()[c];
            let array = cast_with_options(
                &StringArray::from(vec![text.as_str()]),
                &column.column_type.arrow_type(),
                &options,
            )
            .map_err(|_| {
                EngineError::InvalidTable(format!(
                    "range bound '{text}' is not a valid {} for column '{}'",
                    column.column_type.sql_name(),
                    column.name
                ))
            })?;
            if let ColumnType::Varchar { length } = column.column_type {
                if text.chars().count() > length as usize {
                    return Err(EngineError::InvalidTable(format!(
                        "range bound '{text}' is longer than column '{}' allows ({length})",
                        column.name
                    )));
                }
            }
            canonical.push(format_value(&array, 0));
            arrays.push(array);
        }
        let mut key = Vec::new();
        encode_key_columns(&arrays, 0, &mut key);
        Ok((canonical, key))
    }

    /// Inserts `range` in order; an error if it overlaps another one.
    fn insert_range(&mut self, range: RangePartition) -> Result<usize> {
        let lower = |r: &RangePartition| r.lower.as_ref().map(|b| b.key.clone());
        let at = self.ranges.partition_point(|r| lower(r) < lower(&range));
        let overlaps_next = self.ranges.get(at).is_some_and(|next| match &range.upper {
            None => true,
            Some(u) => next.lower.as_ref().is_none_or(|l| l.key < u.key),
        });
        let overlaps_previous = at > 0
            && self.ranges[at - 1]
                .upper
                .as_ref()
                .is_none_or(|u| range.lower.as_ref().is_none_or(|l| l.key < u.key));
        if overlaps_next || overlaps_previous {
            let other = if overlaps_next {
                &self.ranges[at]
            } else {
                &self.ranges[at - 1]
            };
            return Err(EngineError::InvalidTable(format!(
                "range partition {range} overlaps range partition {other}"
            )));
        }
        self.ranges.insert(at, range);
        Ok(at)
    }

    /// The partitioning with range `spec` added, and the new range's position.
    pub fn add_range(&self, schema: &Schema, spec: &RangeSpec) -> Result<(Self, usize)> {
        let range = self.range(schema, spec)?;
        let mut added = self.clone();
        let at = added.insert_range(range)?;
        if added.num_tablets() > MAX_TABLETS {
            return Err(EngineError::InvalidTable(format!(
                "the table would have {} tablets; at most {MAX_TABLETS} are allowed",
                added.num_tablets()
            )));
        }
        Ok((added, at))
    }

    /// The partitioning without range `spec` (which must match an existing range exactly), and
    /// the dropped range's position.
    pub fn drop_range(&self, schema: &Schema, spec: &RangeSpec) -> Result<(Self, usize)> {
        let range = self.range(schema, spec)?;
        let key = |b: &Option<RangeBound>| b.as_ref().map(|b| b.key.clone());
        let at = self
            .ranges
            .iter()
            .position(|r| key(&r.lower) == key(&range.lower) && key(&r.upper) == key(&range.upper))
            .ok_or_else(|| {
                EngineError::InvalidTable(format!("there is no range partition {range}"))
            })?;
        let mut dropped = self.clone();
        dropped.ranges.remove(at);
        Ok((dropped, at))
    }

    /// `HASH (a) bucket 1 of 4, HASH (b) bucket 0 of 2` and the range of tablet `tablet`.
    pub fn describe(&self, schema: &Schema, tablet: usize) -> (String, String) {
        let (r, mut combination) = self.range_of_tablet(tablet);
        let levels = self.range_hash(r);
        let mut buckets = vec![0; levels.len()];
        for (l, level) in levels.iter().enumerate().rev() {
            buckets[l] = combination % level.buckets as usize;
            combination /= level.buckets as usize;
        }
        let hash = levels
            .iter()
            .zip(&buckets)
            .map(|(level, b)| {
                format!(
                    "HASH ({}) bucket {b} of {}",
                    schema.column_list(&level.columns),
                    level.buckets
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let range = match self.range_columns.is_empty() {
            true => String::new(),
            false => self.ranges[r].to_string(),
        };
        (hash, range)
    }

    /// For a table without a declared key, the auto_incrementing_ids tablet `tablet` gives
    /// the rows inserted into it: those of its bucket (None: any, or another kind of table).
    pub fn auto_ids(&self, schema: &Schema, tablet: usize) -> Option<AutoIds> {
        match self.hash.as_slice() {
            [level] if schema.is_keyless() && level.buckets > 1 => Some(AutoIds {
                residue: (tablet % level.buckets as usize) as u32,
                modulus: level.buckets,
            }),
            _ => None,
        }
    }

    /// The tablet of every row of `batch` (a batch with at least the partition columns, found
    /// by name); an error naming the first row outside every range partition.
    pub fn tablets(&self, schema: &Schema, batch: &RecordBatch) -> Result<Vec<usize>> {
        if self.range_columns.is_empty() {
            return hash_combinations(schema, &self.hash, batch);
        }
        let ranges = self.row_ranges(schema, batch)?;
        if self.ranges.iter().all(|r| r.hash.is_none()) {
            // Every range hashed alike: one pass over the batch.
            let per_range = buckets_product(&self.hash);
            let combinations = hash_combinations(schema, &self.hash, batch)?;
            return Ok((ranges.into_iter().zip(combinations))
                .map(|(r, c)| r * per_range + c)
                .collect());
        }
        // Each range's rows by its own hash levels.
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); self.ranges.len()];
        for (row, &r) in ranges.iter().enumerate() {
            rows[r].push(row as u32);
        }
        let mut tablets = vec![0usize; batch.num_rows()];
        for (r, indexes) in rows.into_iter().enumerate() {
            if indexes.is_empty() {
                continue;
            }
            let indexes = UInt32Array::from(indexes);
            let rows = take_record_batch(batch, &indexes)?;
            let start = self.range_tablets(r).start;
            let combinations = hash_combinations(schema, self.range_hash(r), &rows)?;
            for (row, c) in indexes.values().iter().zip(combinations) {
                tablets[*row as usize] = start + c;
            }
        }
        Ok(tablets)
    }

    /// The range partition of every row of `batch`; an error naming the first row outside
    /// every range partition.
    fn row_ranges(&self, schema: &Schema, batch: &RecordBatch) -> Result<Vec<usize>> {
        let columns = columns_by_name(schema, &self.range_columns, batch)?;
        let mut key = Vec::with_capacity(16);
        let mut ranges = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            key.clear();
            encode_key_columns(&columns, row, &mut key);
            let Some(range) = self.range_of(&key) else {
                let values = self
                    .range_columns
                    .iter()
                    .zip(&columns)
                    .map(|(&c, a)| format!("{}={}", schema.columns()[c].name, format_value(a, row)))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(EngineError::NoRangePartition(format!(
                    "row ({values}) is outside every range partition of the table \
                     (ALTER TABLE ... ADD RANGE PARTITION adds one)"
                )));
            };
            ranges.push(range);
        }
        Ok(ranges)
    }

    /// The range partition holding range key `key`.
    fn range_of(&self, key: &[u8]) -> Option<usize> {
        let after = self
            .ranges
            .partition_point(|r| r.lower.as_ref().is_none_or(|l| l.key.as_slice() <= key));
        let at = after.checked_sub(1)?;
        let range = &self.ranges[at];
        range
            .upper
            .as_ref()
            .is_none_or(|u| key < u.key.as_slice())
            .then_some(at)
    }

    /// Splits `batch` into one batch per tablet that has rows, preserving row order within a
    /// tablet. Nothing is returned when any row is outside every range.
    pub fn split(&self, schema: &Schema, batch: &RecordBatch) -> Result<Vec<(usize, RecordBatch)>> {
        if self.num_tablets() == 1 {
            // Still checks the rows against the one range.
            self.tablets(schema, batch)?;
            return Ok(vec![(0, batch.clone())]);
        }
        let tablets = self.tablets(schema, batch)?;
        if let Some(&first) = tablets.first() {
            if tablets.iter().all(|&t| t == first) {
                // All to one tablet (a batch of one queue's messages, say): taken as it is.
                return Ok(vec![(first, batch.clone())]);
            }
        }
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); self.num_tablets()];
        for (row, tablet) in tablets.into_iter().enumerate() {
            rows[tablet].push(row as u32);
        }
        let mut out = Vec::new();
        for (tablet, indexes) in rows.into_iter().enumerate() {
            if indexes.is_empty() {
                continue;
            }
            let indexes = UInt32Array::from(indexes);
            out.push((tablet, take_record_batch(batch, &indexes)?));
        }
        Ok(out)
    }

    /// The tablets that can hold rows passing `predicates` (a conjunction), in order.
    /// A hash level is pruned when each of its columns has an equality or IN-list predicate
    /// (at most [`MAX_PRUNING_COMBINATIONS`] value combinations); the range level by equality
    /// and IN lists on all range columns, or by comparisons on a single range column.
    pub fn prune(&self, schema: &Schema, predicates: &[ColumnPredicate]) -> Vec<usize> {
        let ranges = self.prune_ranges(schema, predicates);
        let mut tablets = Vec::new();
        let mut table_levels = None;
        for (r, _) in ranges.iter().enumerate().filter(|(_, hit)| **hit) {
            let levels = self.range_hash(r);
            let allowed = match self.ranges[r].hash {
                None => table_levels
                    .get_or_insert_with(|| allowed_buckets(schema, levels, predicates))
                    .clone(),
                Some(_) => allowed_buckets(schema, levels, predicates),
            };
            let span = self.range_tablets(r);
            for t in span.clone() {
                let mut combination = t - span.start;
                let mut kept = true;
                for (level, hit) in levels.iter().zip(&allowed).rev() {
                    let bucket = combination % level.buckets as usize;
                    combination /= level.buckets as usize;
                    if hit.as_ref().is_some_and(|h| !h[bucket]) {
                        kept = false;
                    }
                }
                if kept {
                    tablets.push(t);
                }
            }
        }
        tablets
    }

    /// Which range partitions can hold rows passing `predicates`.
    fn prune_ranges(&self, schema: &Schema, predicates: &[ColumnPredicate]) -> Vec<bool> {
        let all = vec![true; self.ranges.len()];
        if self.range_columns.is_empty() {
            return all;
        }
        if let Some(points) = combinations(schema, &self.range_columns, predicates) {
            let mut hit = vec![false; self.ranges.len()];
            let mut key = Vec::new();
            for row in 0..points.num_rows() {
                key.clear();
                encode_key_columns(points.columns(), row, &mut key);
                if let Some(r) = self.range_of(&key) {
                    hit[r] = true;
                }
            }
            return hit;
        }
        let [column] = self.range_columns[..] else {
            return all;
        };
        let arrow_type = schema.columns()[column].column_type.arrow_type();
        let encode = |v: &Scalar| {
            (v.0.data_type() == &arrow_type && v.0.len() == 1 && !v.0.is_null(0)).then(|| {
                let mut key = Vec::new();
                encode_key_columns(std::slice::from_ref(&v.0), 0, &mut key);
                key
            })
        };
        // The range keys [low, high) (high None: unbounded) that can hold matching rows.
        let mut low: Vec<u8> = Vec::new();
        let mut high: Option<Vec<u8>> = None;
        for p in predicates.iter().filter(|p| p.column == column) {
            let (bound, is_low) = match &p.op {
                PredicateOp::Gt(v) => (
                    encode(v).map(|mut k| {
                        k.push(0);
                        k
                    }),
                    true,
                ),
                PredicateOp::GtEq(v) => (encode(v), true),
                PredicateOp::Lt(v) => (encode(v), false),
                PredicateOp::LtEq(v) => (
                    encode(v).map(|mut k| {
                        k.push(0);
                        k
                    }),
                    false,
                ),
                _ => continue,
            };
            let Some(bound) = bound else { continue };
            if is_low {
                low = low.max(bound);
            } else {
                high = Some(high.map_or(bound.clone(), |h| h.min(bound)));
            }
        }
        self.ranges
            .iter()
            .map(|r| {
                let below = r.upper.as_ref().is_some_and(|u| u.key <= low);
                let above = match (&r.lower, &high) {
                    (Some(l), Some(h)) => l.key >= *h,
                    _ => false,
                };
                !below && !above
            })
            .collect()
    }
}

/// Checks hash levels against the table: bucket counts, key columns, no column twice.
fn check_hash_levels(schema: &Schema, hash: &[HashLevel]) -> Result<()> {
    let mut hashed = Vec::new();
    for level in hash {
        if level.buckets == 0 || level.buckets > MAX_BUCKETS {
            return Err(EngineError::InvalidTable(format!(
                "the number of hash buckets must be between 1 and {MAX_BUCKETS}, got {}",
                level.buckets
            )));
        }
        if level.columns.is_empty() {
            return Err(EngineError::InvalidTable(
                "a hash level needs at least one column".into(),
            ));
        }
        check_key_columns(schema, &level.columns, "hash")?;
        for &c in &level.columns {
            if hashed.contains(&c) {
                return Err(EngineError::InvalidTable(format!(
                    "column '{}' is in two hash levels",
                    schema.columns()[c].name
                )));
            }
            hashed.push(c);
        }
    }
    // Checked before anything multiplies bucket counts: seven levels of 1 024 buckets would
    // wrap a usize.
    let product = hash.iter().try_fold(1usize, |n, level| {
        n.checked_mul(level.buckets as usize)
            .filter(|&n| n <= MAX_TABLETS)
    });
    if product.is_none() {
        let levels: Vec<String> = hash.iter().map(|l| l.buckets.to_string()).collect();
        return Err(EngineError::InvalidTable(format!(
            "the hash levels make {} tablets per range; at most {MAX_TABLETS} are allowed",
            levels.join(" × ")
        )));
    }
    Ok(())
}

/// Tablets per range hashed by `levels`: the product of their bucket counts (checked against
/// [`MAX_TABLETS`] by [`check_hash_levels`]).
fn buckets_product(levels: &[HashLevel]) -> usize {
    (levels.iter()).fold(1usize, |n, l| n.saturating_mul(l.buckets as usize))
}

/// Every row's combination of buckets in hash levels `levels` (mixed radix, the first level
/// most significant).
fn hash_combinations(
    schema: &Schema,
    levels: &[HashLevel],
    batch: &RecordBatch,
) -> Result<Vec<usize>> {
    let mut combinations = vec![0usize; batch.num_rows()];
    for (l, level) in levels.iter().enumerate() {
        let buckets = level_buckets(schema, level, l, batch)?;
        for (c, b) in combinations.iter_mut().zip(buckets) {
            *c = *c * level.buckets as usize + b as usize;
        }
    }
    Ok(combinations)
}

/// For each hash level, the buckets rows passing `predicates` can be in (None: any).
fn allowed_buckets(
    schema: &Schema,
    levels: &[HashLevel],
    predicates: &[ColumnPredicate],
) -> Vec<Option<Vec<bool>>> {
    (levels.iter().enumerate())
        .map(|(l, level)| {
            combinations(schema, &level.columns, predicates).and_then(|batch| {
                let mut hit = vec![false; level.buckets as usize];
                for b in level_buckets(schema, level, l, &batch).ok()? {
                    hit[b as usize] = true;
                }
                Some(hit)
            })
        })
        .collect()
}

fn check_key_columns(schema: &Schema, columns: &[usize], what: &str) -> Result<()> {
    for (i, &c) in columns.iter().enumerate() {
        let Some(column) = schema.columns().get(c) else {
            return Err(EngineError::InvalidTable(format!(
                "{what} column #{c} does not exist"
            )));
        };
        if !schema.is_key_column(c) {
            return Err(EngineError::InvalidTable(format!(
                "{what} column '{}' is not part of the primary key",
                column.name
            )));
        }
        let keyless_hash = what == "hash" && schema.is_keyless();
        let assigned =
            schema.auto_increment_column() == Some(c) || schema.position_column() == Some(c);
        if assigned && !keyless_hash {
            return Err(EngineError::InvalidTable(format!(
                "{what} column '{}' is assigned after a row's tablet is chosen, so it cannot \
                 partition the table",
                column.name
            )));
        }
        if columns[..i].contains(&c) {
            return Err(EngineError::InvalidTable(format!(
                "{what} column '{}' is listed twice",
                column.name
            )));
        }
    }
    Ok(())
}

/// The columns `columns` of the table, found by name in `batch`.
fn columns_by_name(
    schema: &Schema,
    columns: &[usize],
    batch: &RecordBatch,
) -> Result<Vec<ArrayRef>> {
    columns
        .iter()
        .map(|&c| {
            let name = &schema.columns()[c].name;
            batch.column_by_name(name).cloned().ok_or_else(|| {
                EngineError::InvalidTable(format!("missing partition column '{name}'"))
            })
        })
        .collect()
}

/// The bucket of every row of `batch` in hash level `level` (the `l`-th).
fn level_buckets(
    schema: &Schema,
    level: &HashLevel,
    l: usize,
    batch: &RecordBatch,
) -> Result<Vec<u32>> {
    if level.buckets == 1 {
        return Ok(vec![0; batch.num_rows()]);
    }
    if schema.is_keyless() {
        return Ok(auto_id_buckets(schema, level.buckets, batch));
    }
    let columns = columns_by_name(schema, &level.columns, batch)?;
    let mut key = Vec::with_capacity(32);
    Ok((0..batch.num_rows())
        .map(|row| {
            key.clear();
            encode_key_columns(&columns, row, &mut key);
            (xxhash_rust::xxh64::xxh64(&key, l as u64) % level.buckets as u64) as u32
        })
        .collect())
}

/// Where the rows of a batch go in the hash level of a table keyed by its auto_incrementing_id
/// alone: a row with an id to the bucket `id % buckets`; new rows (no id yet) spread over the
/// buckets, from a bucket that moves on with each batch.
fn auto_id_buckets(schema: &Schema, buckets: u32, batch: &RecordBatch) -> Vec<u32> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ids = (schema.auto_increment_column())
        .and_then(|c| batch.column_by_name(&schema.columns()[c].name))
        .and_then(|ids| {
            ids.as_any()
                .downcast_ref::<arrow::array::Int64Array>()
                .cloned()
        });
    let start = NEXT.fetch_add(1, Ordering::Relaxed);
    (0..batch.num_rows())
        .map(|row| match &ids {
            Some(ids) if ids.is_valid(row) => ids.value(row).rem_euclid(i64::from(buckets)) as u32,
            _ => (start.wrapping_add(row as u32)) % buckets,
        })
        .collect()
}

/// [`equality_combinations`] of `columns` as a batch with those columns.
fn combinations(
    schema: &Schema,
    columns: &[usize],
    predicates: &[ColumnPredicate],
) -> Option<RecordBatch> {
    let arrays = equality_combinations(schema, columns, predicates, MAX_PRUNING_COMBINATIONS)?;
    let fields: Vec<arrow::datatypes::Field> = columns
        .iter()
        .zip(&arrays)
        .map(|(&c, a)| {
            arrow::datatypes::Field::new(&schema.columns()[c].name, a.data_type().clone(), true)
        })
        .collect();
    RecordBatch::try_new(
        std::sync::Arc::new(arrow::datatypes::Schema::new(fields)),
        arrays,
    )
    .ok()
}

fn format_value(array: &ArrayRef, row: usize) -> String {
    ArrayFormatter::try_new(array.as_ref(), &FormatOptions::default())
        .map(|f| f.value(row).to_string())
        .unwrap_or_default()
}

impl RangePartition {
    fn unbounded() -> Self {
        Self {
            lower: None,
            upper: None,
            quoted: vec![],
            hash: None,
        }
    }

    pub fn is_unbounded(&self) -> bool {
        self.lower.is_none() && self.upper.is_none()
    }
}

impl fmt::Display for RangePartition {
    /// Impala's notation: `'a' <= VALUES < 'b'`, `VALUES < 10`, `UNBOUNDED`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values = |b: &RangeBound| {
            let literals: Vec<String> = b
                .values
                .iter()
                .zip(&self.quoted)
                .map(|(v, &q)| match q {
                    true => format!("'{}'", v.replace('\'', "''")),
                    false => v.clone(),
                })
                .collect();
            match literals.as_slice() {
                [one] => one.clone(),
                many => format!("({})", many.join(", ")),
            }
        };
        let op = |b: &RangeBound| if b.inclusive { "<=" } else { "<" };
        match (&self.lower, &self.upper) {
            (None, None) => f.write_str("UNBOUNDED"),
            (Some(l), None) => write!(f, "{} {} VALUES", values(l), op(l)),
            (None, Some(u)) => write!(f, "VALUES {} {}", op(u), values(u)),
            (Some(l), Some(u)) if l.inclusive && u.inclusive && l.values == u.values => {
                write!(f, "VALUE = {}", values(l))
            }
            (Some(l), Some(u)) => {
                write!(f, "{} {} VALUES {} {}", values(l), op(l), op(u), values(u))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use nyala_storage::ColumnSchema;

    use super::*;

    fn schema() -> Schema {
        let column = |name: &str, column_type| ColumnSchema::new(name, column_type, false);
        Schema::new(
            vec![
                column("host", ColumnType::String),
                column("ts", ColumnType::Int64),
                column("v", ColumnType::Double),
            ],
            vec![0, 1],
        )
        .unwrap()
    }

    #[test]
    fn bucket_products_that_overflow_are_refused() {
        let columns = (0..7)
            .map(|i| ColumnSchema::new(format!("k{i}"), ColumnType::Int64, false))
            .collect();
        let schema = Schema::new(columns, (0..7).collect()).unwrap();
        let levels = |buckets| {
            (0..7)
                .map(|c| HashLevel {
                    columns: vec![c],
                    buckets,
                })
                .collect::<Vec<_>>()
        };
        let error = PartitionSchema::new(&schema, levels(1024), vec![], vec![]).unwrap_err();
        assert!(
            error.to_string().contains("at most 10000"),
            "unexpected error: {error}"
        );
        let ok = PartitionSchema::new(&schema, levels(1), vec![], vec![]).unwrap();
        assert_eq!(ok.num_tablets(), 1);
    }

    fn bound(v: i64, inclusive: bool) -> Option<BoundSpec> {
        Some(BoundSpec {
            values: vec![v.to_string()],
            inclusive,
        })
    }

    fn partitioned() -> PartitionSchema {
        PartitionSchema::new(
            &schema(),
            vec![HashLevel {
                columns: vec![0],
                buckets: 3,
            }],
            vec![1],
            vec![
                RangeSpec {
                    hash: vec![],
                    lower: None,
                    upper: bound(0, false),
                },
                RangeSpec {
                    hash: vec![],
                    lower: bound(10, true),
                    upper: bound(20, false),
                },
                RangeSpec {
                    hash: vec![],
                    lower: bound(0, true),
                    upper: bound(10, false),
                },
                RangeSpec {
                    hash: vec![],
                    lower: bound(30, true),
                    upper: bound(30, true),
                },
            ],
        )
        .unwrap()
    }

    fn rows(hosts: &[&str], ts: &[i64]) -> RecordBatch {
        RecordBatch::try_from_iter(vec![
            (
                "host",
                Arc::new(StringArray::from(hosts.to_vec())) as ArrayRef,
            ),
            ("ts", Arc::new(Int64Array::from(ts.to_vec()))),
        ])
        .unwrap()
    }

    #[test]
    fn rows_go_to_their_range_and_bucket() {
        let p = partitioned();
        assert_eq!(p.num_tablets(), 12);
        let shown: Vec<String> = p.ranges.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "VALUES < 0",
                "0 <= VALUES < 10",
                "10 <= VALUES < 20",
                "VALUE = 30"
            ]
        );
        let tablets = p
            .tablets(
                &schema(),
                &rows(&["a", "a", "a", "a", "a"], &[-5, 0, 9, 19, 30]),
            )
            .unwrap();
        let ranges: Vec<usize> = tablets.iter().map(|t| t / 3).collect();
        assert_eq!(ranges, [0, 1, 1, 2, 3]);
        let buckets: Vec<usize> = tablets.iter().map(|t| t % 3).collect();
        assert!(buckets.iter().all(|&b| b == buckets[0]));
        for outside in [20, 29, 31] {
            let e = p.tablets(&schema(), &rows(&["a"], &[outside])).unwrap_err();
            assert!(e.to_string().contains(&format!("ts={outside}")), "{e}");
        }
    }

    #[test]
    fn overlapping_and_empty_ranges_are_rejected() {
        let p = partitioned();
        let spec = |l, u| RangeSpec {
            hash: vec![],
            lower: bound(l, true),
            upper: bound(u, false),
        };
        let e = p.add_range(&schema(), &spec(15, 25)).unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
        let e = p.add_range(&schema(), &spec(25, 25)).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        let (added, at) = p.add_range(&schema(), &spec(20, 30)).unwrap();
        assert_eq!(at, 3);
        assert_eq!(added.num_tablets(), 15);
        let (dropped, at) = added.drop_range(&schema(), &spec(0, 10)).unwrap();
        assert_eq!(at, 1);
        assert!(dropped.tablets(&schema(), &rows(&["a"], &[5])).is_err());
        assert!(dropped.drop_range(&schema(), &spec(0, 10)).is_err());
        let e = p
            .add_range(
                &schema(),
                &RangeSpec {
                    hash: vec![],
                    lower: Some(BoundSpec {
                        values: vec!["x".into()],
                        inclusive: true,
                    }),
                    upper: None,
                },
            )
            .unwrap_err();
        assert!(e.to_string().contains("not a valid INT64"), "{e}");
    }

    #[test]
    fn pruning_keeps_every_tablet_that_can_match() {
        let p = partitioned();
        let s = schema();
        let eq = |c, v: ArrayRef| ColumnPredicate {
            column: c,
            op: PredicateOp::Eq(Scalar(v)),
        };
        let int = |v: i64| Arc::new(Int64Array::from(vec![v])) as ArrayRef;
        let host = |v: &str| Arc::new(StringArray::from(vec![v])) as ArrayRef;
        let batch = rows(&["q"], &[12]);
        let tablet = p.tablets(&s, &batch).unwrap()[0];
        assert_eq!(p.prune(&s, &[eq(0, host("q")), eq(1, int(12))]), [tablet]);
        let by_range = p.prune(
            &s,
            &[ColumnPredicate {
                column: 1,
                op: PredicateOp::GtEq(Scalar(int(10))),
            }],
        );
        assert_eq!(by_range, (6..12).collect::<Vec<_>>());
        let below = p.prune(
            &s,
            &[ColumnPredicate {
                column: 1,
                op: PredicateOp::Lt(Scalar(int(0))),
            }],
        );
        assert_eq!(below, [0, 1, 2]);
        // A value of another type does not prune.
        let wrong = Arc::new(arrow::array::Int32Array::from(vec![12])) as ArrayRef;
        assert_eq!(p.prune(&s, &[eq(1, wrong)]).len(), 12);
    }

    #[test]
    fn a_table_without_a_key_places_ids_by_their_residue() {
        let s = Schema::without_declared_key(vec![ColumnSchema::new("a", ColumnType::Int64, true)])
            .unwrap();
        let id = s.auto_increment_column().unwrap();
        let level = HashLevel {
            columns: vec![id],
            buckets: 4,
        };
        let p = PartitionSchema::new(&s, vec![level], vec![], vec![]).unwrap();
        // Each tablet gives out the ids of its bucket.
        for tablet in 0..4 {
            let ids = p.auto_ids(&s, tablet).unwrap();
            assert_eq!((ids.residue, ids.modulus), (tablet as u32, 4));
            assert_eq!(ids.first_at_or_after(10) % 4, tablet as i64);
            assert!((10..14).contains(&ids.first_at_or_after(10)));
        }
        // Rows with ids go to `id % 4`, and a lookup by id prunes to that tablet.
        let field = |name: &str| {
            arrow::datatypes::Field::new(name, arrow::datatypes::DataType::Int64, true)
        };
        let batch = RecordBatch::try_new(
            Arc::new(arrow::datatypes::Schema::new(vec![
                field("a"),
                field("auto_incrementing_id"),
            ])),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(Int64Array::from(vec![8, 13, 6])),
            ],
        )
        .unwrap();
        assert_eq!(p.tablets(&s, &batch).unwrap(), [0, 1, 2]);
        let eq = ColumnPredicate {
            column: id,
            op: PredicateOp::Eq(Scalar(Arc::new(Int64Array::from(vec![13])) as ArrayRef)),
        };
        assert_eq!(p.prune(&s, &[eq]), [1]);
        // New rows (no id yet) spread over the tablets.
        let new = RecordBatch::try_new(
            Arc::new(arrow::datatypes::Schema::new(vec![field("a")])),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3, 4]))],
        )
        .unwrap();
        let mut tablets = p.tablets(&s, &new).unwrap();
        tablets.sort();
        assert_eq!(tablets, [0, 1, 2, 3]);
        // Only the id can distribute it, in one hash level.
        let a = HashLevel {
            columns: vec![0],
            buckets: 2,
        };
        assert!(PartitionSchema::new(&s, vec![a], vec![], vec![]).is_err());
        assert!(PartitionSchema::new(&s, vec![], vec![id], vec![]).is_err());
    }

    #[test]
    fn a_range_with_its_own_hash_levels_has_its_own_tablets() {
        let s = schema();
        let hash = vec![HashLevel {
            columns: vec![0],
            buckets: 2,
        }];
        let range = |l, u, hash: Vec<HashSpec>| RangeSpec {
            lower: bound(l, true),
            upper: bound(u, false),
            hash,
        };
        let own = |buckets| {
            vec![HashSpec {
                columns: vec!["host".into()],
                buckets,
            }]
        };
        // [0, 10): the table's 2 buckets; [10, 20): 5 of its own; [20, 30): 2 × 3 of its own.
        let two_levels = vec![
            HashSpec {
                columns: vec!["host".into()],
                buckets: 2,
            },
            HashSpec {
                columns: vec!["ts".into()],
                buckets: 3,
            },
        ];
        let ranges = vec![
            range(0, 10, vec![]),
            range(10, 20, own(5)),
            range(20, 30, two_levels),
        ];
        let p = PartitionSchema::new(&s, hash, vec![1], ranges).unwrap();
        assert_eq!(p.num_tablets(), 2 + 5 + 6);
        assert_eq!((p.range_tablets(1), p.range_tablets(2)), (2..7, 7..13));
        let hosts: Vec<String> = (0..60).map(|i| format!("h{i}")).collect();
        let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
        let ts: Vec<i64> = (0..60).map(|i| i % 30).collect();
        let tablets = p.tablets(&s, &rows(&hosts, &ts)).unwrap();
        for (row, &t) in tablets.iter().enumerate() {
            let expected = match ts[row] {
                0..10 => 0..2,
                10..20 => 2..7,
                _ => 7..13,
            };
            assert!(
                expected.contains(&t),
                "row {row} (ts {}) in tablet {t}",
                ts[row]
            );
            // A lookup by the whole key prunes to the row's tablet.
            let eq = |c, v: ArrayRef| ColumnPredicate {
                column: c,
                op: PredicateOp::Eq(Scalar(v)),
            };
            let found = p.prune(
                &s,
                &[
                    eq(0, Arc::new(StringArray::from(vec![hosts[row]]))),
                    eq(1, Arc::new(Int64Array::from(vec![ts[row]]))),
                ],
            );
            assert_eq!(found, [t]);
            let (hash, range) = p.describe(&s, t);
            assert!(
                !range.is_empty() && hash.contains("HASH (host)"),
                "{hash} {range}"
            );
        }
        let used: std::collections::HashSet<usize> = tablets.into_iter().collect();
        assert!(
            used.len() > 8,
            "rows spread over the ranges' buckets: {used:?}"
        );
        // Adding a range with its own hash levels puts its tablets where it sorts.
        let (added, at) = p.add_range(&s, &range(-10, 0, own(4))).unwrap();
        assert_eq!((at, added.range_tablets(at)), (0, 0..4));
        assert_eq!(added.num_tablets(), 17);
        // Its levels are checked as the table's are.
        let bad = RangeSpec {
            hash: own(0),
            ..range(30, 40, vec![])
        };
        assert!(p.add_range(&s, &bad).is_err());
        let not_key = RangeSpec {
            hash: vec![HashSpec {
                columns: vec!["v".into()],
                buckets: 2,
            }],
            ..range(30, 40, vec![])
        };
        let e = p.add_range(&s, &not_key).unwrap_err().to_string();
        assert!(e.contains("not part of the primary key"), "{e}");
    }
}
