//! Bulk ingest: Arrow batches loaded into a table (Flight SQL `CommandStatementIngest`, the
//! shell's `\copy`), creating, appending to or replacing it.
//!
//! Each incoming batch is aligned to the table's columns by name, cast losslessly, and inserted
//! through DataFusion like an `INSERT`, so a load streams: only one batch is held at a time.
//! As with `INSERT`, a failure stops the load; the rows of earlier batches stay applied.

use std::sync::Arc;

use arrow::array::{new_null_array, RecordBatch};
use arrow::compute::{cast_with_options, CastOptions};
use arrow::datatypes::SchemaRef;
use datafusion::dataframe::DataFrameWriteOptions;
use futures::{Stream, TryStreamExt};

use crate::partitioning::PartitionSpec;
use crate::session::Session;
use crate::statement::{CreateTableSpec, Ddl, Nullability};
use crate::{Result, SqlError};

/// What to do about the target table before loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngestMode {
    /// Create the table; fail if it exists.
    Create,
    /// Append to the table; fail if it does not exist.
    Append,
    /// Append, creating the table first if it does not exist.
    CreateOrAppend,
    /// Drop the table if it exists and create it anew from the data's schema.
    Replace,
}

/// The table a load goes into, and how a created table is keyed and distributed.
#[derive(Debug, Clone)]
pub struct IngestTarget {
    pub table: String,
    pub mode: IngestMode,
    /// Primary-key columns of a created table; empty means the first column.
    pub primary_key: Vec<String>,
    /// Hash buckets of a created table over its primary key (1: a single tablet).
    pub buckets: u32,
}

impl Session {
    /// Loads `batches` (of schema `schema`) into the target table; returns the rows loaded.
    pub async fn ingest<S>(
        &self,
        target: &IngestTarget,
        schema: SchemaRef,
        batches: S,
    ) -> Result<u64>
    where
        S: Stream<Item = Result<RecordBatch>> + Send,
    {
        // The name is taken verbatim, as a quoted identifier (ADBC drivers quote it too).
        let name = target.table.clone();
        let exists = self.db.client.table(&name).is_ok();
        let create = match (target.mode, exists) {
            (IngestMode::Create, true) => {
                return Err(SqlError::Invalid(format!("table '{name}' already exists")))
            }
            (IngestMode::Append, false) => {
                return Err(SqlError::Invalid(format!("table '{name}' does not exist")))
            }
            (IngestMode::Append | IngestMode::CreateOrAppend, true) => None,
            (IngestMode::Create | IngestMode::CreateOrAppend | IngestMode::Replace, _) => {
                // Derive the new schema before dropping anything, so bad input changes nothing.
                Some(table_spec(&name, &schema, target)?)
            }
        };
        if let Some(spec) = create {
            if exists {
                Ddl::DropTable {
                    name: name.clone(),
                    if_exists: true,
                }
                .apply(&self.db.client)
                .await?;
            }
            Ddl::CreateTable(spec).apply(&self.db.client).await?;
        }
        let table = self.db.client.table(&name)?.schema.arrow_schema();
        let mut loaded = 0;
        let mut batches = std::pin::pin!(batches);
        while let Some(batch) = batches.try_next().await? {
            if batch.num_rows() == 0 {
                continue;
            }
            let aligned = align(&batch, &table, &name)?;
            let result = self
                .ctx
                .read_batch(aligned)?
                .write_table(&name, DataFrameWriteOptions::new())
                .await
                .map_err(SqlError::from);
            match result {
                Ok(counts) => loaded += count_of(&counts),
                Err(e) if loaded > 0 => {
                    return Err(SqlError::Invalid(format!(
                        "{e}; the load stopped after {loaded} rows had been applied"
                    )))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(loaded)
    }
}

/// The row count in the result of a DDL/DML statement (its one `count` row); 0 if absent.
pub fn count_of(batches: &[RecordBatch]) -> u64 {
    batches
        .first()
        .and_then(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<arrow::array::UInt64Array>()
                .map(|c| c.value(0))
        })
        .unwrap_or(0)
}

/// The table a load creates: the data's columns, keyed by the chosen columns (NOT NULL; the
/// first column by default), hash-partitioned on them when `buckets` > 1.
fn table_spec(name: &str, schema: &SchemaRef, target: &IngestTarget) -> Result<CreateTableSpec> {
    let key: Vec<String> = if target.primary_key.is_empty() {
        schema
            .fields()
            .first()
            .map(|f| vec![f.name().clone()])
            .unwrap_or_default()
    } else {
        target.primary_key.clone()
    };
    CreateTableSpec::from_arrow(
        name,
        schema.fields(),
        "the data",
        Nullability::Nullable,
        &key,
        &PartitionSpec::hash_key(target.buckets),
    )
}

/// `batch` with the table's columns in the table's order: matched by name, cast without loss,
/// absent ones NULL. Columns the table does not have are an error.
fn align(batch: &RecordBatch, table: &SchemaRef, name: &str) -> Result<RecordBatch> {
    let source = batch.schema();
    if let Some(extra) = source
        .fields()
        .iter()
        .find(|f| table.index_of(f.name()).is_err())
    {
        return Err(SqlError::Invalid(format!(
            "table '{name}' has no column '{}'",
            extra.name()
        )));
    }
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    let columns = table
        .fields()
        .iter()
        .map(|field| match source.index_of(field.name()) {
            Ok(i) if batch.column(i).data_type() == field.data_type() => {
                Ok(batch.column(i).clone())
            }
            Ok(i) => cast_with_options(batch.column(i), field.data_type(), &options).map_err(|e| {
                SqlError::Invalid(format!(
                    "column '{}': cannot load {} values as {}: {e}",
                    field.name(),
                    batch.column(i).data_type(),
                    field.data_type()
                ))
            }),
            Err(_) => Ok(new_null_array(field.data_type(), batch.num_rows())),
        })
        .collect::<Result<Vec<_>>>()?;
    RecordBatch::try_new(Arc::clone(table), columns)
        .map_err(|e| SqlError::Invalid(format!("table '{name}': {e}")))
}
