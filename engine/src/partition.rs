//! Hash partitioning (Kudu paper 3.2): the partition key of a row is the memcmp-comparable
//! encoding of its hash columns; its xxh64 modulo the bucket count picks the tablet. The same key
//! encoding as the primary key, so the mapping is stable across versions and processes.

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::{concat, take_record_batch};
use nyala_storage::{encode_key_columns, ColumnPredicate, PredicateOp, Scalar, Schema};
use serde::{Deserialize, Serialize};

use crate::{EngineError, Result};

/// Most value combinations of the hash columns that partition pruning enumerates.
pub const MAX_PRUNING_COMBINATIONS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionSchema {
    /// Indexes (into the table schema) of the hash columns; a subset of the primary key.
    pub hash_columns: Vec<usize>,
    pub num_buckets: u32,
}

impl PartitionSchema {
    /// Validates the partitioning against the table schema.
    pub fn new(schema: &Schema, hash_columns: Vec<usize>, num_buckets: u32) -> Result<Self> {
        if num_buckets == 0 || num_buckets > 1024 {
            return Err(EngineError::InvalidTable(format!(
                "the number of hash buckets must be between 1 and 1024, got {num_buckets}"
            )));
        }
        for &c in &hash_columns {
            let Some(column) = schema.columns().get(c) else {
                return Err(EngineError::InvalidTable(format!(
                    "hash column #{c} does not exist"
                )));
            };
            if !schema.is_key_column(c) {
                return Err(EngineError::InvalidTable(format!(
                    "hash column '{}' is not part of the primary key",
                    column.name
                )));
            }
        }
        let mut sorted = hash_columns.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != hash_columns.len() {
            return Err(EngineError::InvalidTable(
                "a hash column is listed twice".into(),
            ));
        }
        Ok(Self {
            hash_columns,
            num_buckets,
        })
    }

    /// One bucket over all key columns: the partitioning of a table created without DISTRIBUTE BY.
    pub fn single(schema: &Schema) -> Self {
        Self {
            hash_columns: schema.key_columns().to_vec(),
            num_buckets: 1,
        }
    }

    /// The bucket of every row of `batch` (a batch with the table's columns, or at least the hash
    /// columns at the table's column positions resolved by name).
    pub fn buckets(&self, schema: &Schema, batch: &RecordBatch) -> Result<Vec<u32>> {
        if self.num_buckets == 1 {
            return Ok(vec![0; batch.num_rows()]);
        }
        let columns: Vec<ArrayRef> = self
            .hash_columns
            .iter()
            .map(|&c| {
                let name = &schema.columns()[c].name;
                batch.column_by_name(name).cloned().ok_or_else(|| {
                    EngineError::InvalidTable(format!("missing partition column '{name}'"))
                })
            })
            .collect::<Result<_>>()?;
        let mut key = Vec::with_capacity(32);
        Ok((0..batch.num_rows())
            .map(|row| {
                key.clear();
                encode_key_columns(&columns, row, &mut key);
                (xxhash_rust::xxh64::xxh64(&key, 0) % self.num_buckets as u64) as u32
            })
            .collect())
    }

    /// The buckets that can hold rows passing `predicates` (a conjunction): when every hash
    /// column has an equality or IN-list predicate, the buckets of their value combinations
    /// (at most [`MAX_PRUNING_COMBINATIONS`]); otherwise None (every bucket).
    pub fn prune(&self, schema: &Schema, predicates: &[ColumnPredicate]) -> Option<Vec<u32>> {
        let mut choices: Vec<&[Scalar]> = Vec::with_capacity(self.hash_columns.len());
        for &c in &self.hash_columns {
            let values = predicates
                .iter()
                .filter(|p| p.column == c)
                .find_map(|p| match &p.op {
                    PredicateOp::Eq(v) => Some(std::slice::from_ref(v)),
                    PredicateOp::InList(values) => Some(values.as_slice()),
                    _ => None,
                })?;
            choices.push(values);
        }
        let combinations = choices.iter().map(|c| c.len()).product::<usize>();
        if combinations > MAX_PRUNING_COMBINATIONS {
            return None;
        }
        if combinations == 0 {
            return Some(vec![]);
        }
        // Column j of combination i takes choice (i / stride_j) % len_j.
        let mut columns = Vec::with_capacity(choices.len());
        let mut stride = 1;
        for values in &choices {
            let picked: Vec<&dyn arrow::array::Array> = (0..combinations)
                .map(|i| values[(i / stride) % values.len()].0.as_ref())
                .collect();
            columns.push(concat(&picked).ok()?);
            stride *= values.len();
        }
        let fields: Vec<arrow::datatypes::Field> = self
            .hash_columns
            .iter()
            .zip(&columns)
            .map(|(&c, a)| {
                arrow::datatypes::Field::new(&schema.columns()[c].name, a.data_type().clone(), true)
            })
            .collect();
        let batch = RecordBatch::try_new(
            std::sync::Arc::new(arrow::datatypes::Schema::new(fields)),
            columns,
        )
        .ok()?;
        let mut buckets = self.buckets(schema, &batch).ok()?;
        buckets.sort_unstable();
        buckets.dedup();
        Some(buckets)
    }

    /// Splits `batch` into one batch per bucket that has rows, preserving row order within a bucket.
    pub fn split(&self, schema: &Schema, batch: &RecordBatch) -> Result<Vec<(u32, RecordBatch)>> {
        let buckets = self.buckets(schema, batch)?;
        if self.num_buckets == 1 {
            return Ok(vec![(0, batch.clone())]);
        }
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); self.num_buckets as usize];
        for (row, bucket) in buckets.into_iter().enumerate() {
            rows[bucket as usize].push(row as u32);
        }
        let mut out = Vec::new();
        for (bucket, indexes) in rows.into_iter().enumerate() {
            if indexes.is_empty() {
                continue;
            }
            let indexes = UInt32Array::from(indexes);
            out.push((bucket as u32, take_record_batch(batch, &indexes)?));
        }
        Ok(out)
    }
}
