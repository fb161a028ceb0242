//! Partitioning by column names: the clause of CREATE TABLE (parsed by
//! [`crate::parse::parser::NyalaParser`]) before the table's columns are known, turned into the
//! engine's [`PartitionSchema`] once they are, and rendered back for SHOW CREATE TABLE.
//!
//! The syntax is Kudu's and Impala's:
//!
//! ```text
//! DISTRIBUTE BY HASH (a, b) INTO 16 BUCKETS, HASH (c) INTO 4 BUCKETS,
//!               RANGE (ts) (PARTITION VALUES < '2026-01-01',
//!                           PARTITION '2026-01-01' <= VALUES < '2027-01-01',
//!                           PARTITION VALUE = '2030-01-01')
//! PARTITION BY HASH (a) PARTITIONS 4, RANGE (ts) SPLIT ROWS (('2026-01-01'), ('2027-01-01'))
//! DISTRIBUTE BY HASH (a) INTO 2 BUCKETS,
//!               RANGE (ts) (PARTITION VALUES < '2026-01-01',
//!                           PARTITION '2026-01-01' <= VALUES HASH (a) INTO 16 BUCKETS)
//! ```
//!
//! The last form gives a range partition hash levels of its own (Kudu 1.17's range-specific
//! hash schemas): a recent, busy range may have more buckets than old ones.
//!
//! A hash level without columns hashes the whole primary key; `RANGE (ts)` without partitions
//! is one unbounded range. A table without a primary key is distributed by its hidden
//! auto_incrementing_id ([`KEYLESS_BUCKETS`] buckets unless the clause gives a count). Names are resolved here and limits (bucket counts, tablets) are the
//! engine's to check, so a clause means the same whether it came from SQL or from a load.

use nyala_engine::{HashLevel, PartitionSchema, RangeSpec};
use nyala_storage::Schema;

use crate::{Result, SqlError};

/// The hash buckets of a table without a primary key created without DISTRIBUTE BY.
pub const KEYLESS_BUCKETS: u32 = 4;

/// A partitioning clause by column names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PartitionSpec {
    /// Hash levels: column names (empty: the primary key) and bucket count.
    pub hash: Vec<(Vec<String>, u32)>,
    /// The range level: column names and range partitions.
    pub range: Option<(Vec<String>, Vec<RangeSpec>)>,
}

impl PartitionSpec {
    /// One hash level over the primary key (or a single tablet for 1 bucket).
    pub fn hash_key(buckets: u32) -> Self {
        Self {
            hash: if buckets > 1 {
                vec![(vec![], buckets)]
            } else {
                vec![]
            },
            range: None,
        }
    }

    /// The engine's partitioning for a table with `schema`.
    pub fn resolve(&self, schema: &Schema) -> Result<PartitionSchema> {
        let indexes = |names: &[String], what: &str| {
            names
                .iter()
                .map(|n| {
                    schema.column_index(n).ok_or_else(|| {
                        SqlError::Invalid(format!("unknown column '{n}' in DISTRIBUTE BY {what}"))
                    })
                })
                .collect::<Result<Vec<_>>>()
        };
        let keyless = schema.is_keyless();
        let default = [(vec![], KEYLESS_BUCKETS)];
        let levels = match (keyless, self.hash.is_empty() && self.range.is_none()) {
            (true, true) => &default[..],
            _ => &self.hash[..],
        };
        let hash = levels
            .iter()
            .map(|(names, buckets)| {
                Ok(HashLevel {
                    columns: match names.is_empty() {
                        true if keyless => schema.key_columns().to_vec(),
                        true => schema.declared_key_columns().to_vec(),
                        false => indexes(names, "HASH")?,
                    },
                    buckets: *buckets,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (range_columns, ranges) = match &self.range {
            Some((names, ranges)) => (indexes(names, "RANGE")?, ranges.clone()),
            None => (vec![], vec![]),
        };
        Ok(PartitionSchema::new(schema, hash, range_columns, ranges)?)
    }
}

/// The partitioning clause that recreates `partition` (None: a single tablet; a table without a
/// primary key says `HASH INTO 1 BUCKETS`, as its default is several).
pub fn render(schema: &Schema, partition: &PartitionSchema) -> Option<String> {
    let names = |columns: &[usize]| schema.column_list(columns);
    let mut levels: Vec<String> = partition
        .hash
        .iter()
        .map(|l| match schema.is_keyless() {
            true => format!("HASH INTO {} BUCKETS", l.buckets),
            false => format!("HASH ({}) INTO {} BUCKETS", names(&l.columns), l.buckets),
        })
        .collect();
    if !partition.range_columns.is_empty() {
        let mut range = format!("RANGE ({})", names(&partition.range_columns));
        if !matches!(partition.ranges.as_slice(), [only] if only.is_unbounded()) {
            let list: Vec<String> = partition
                .ranges
                .iter()
                .map(|r| {
                    let hash = (r.hash.iter().flatten())
                        .map(|l| {
                            format!(" HASH ({}) INTO {} BUCKETS", names(&l.columns), l.buckets)
                        })
                        .collect::<Vec<_>>()
                        .join(",");
                    format!("PARTITION {r}{hash}")
                })
                .collect();
            range.push_str(&format!(" ({})", list.join(", ")));
        }
        levels.push(range);
    }
    if levels.is_empty() && schema.is_keyless() {
        levels.push("HASH INTO 1 BUCKETS".into());
    }
    (!levels.is_empty()).then(|| format!("DISTRIBUTE BY {}", levels.join(", ")))
}
