//! Bulk ingest: Arrow batches loaded into a table (Flight SQL `CommandStatementIngest`, the
//! shell's `\copy`), creating, appending to or replacing it.
//!
//! The data's schema is matched to the table's once, before anything is written: every column
//! of the data must be a column of the table whose type it can be cast to, and every column of
//! the table the data leaves out must take its DEFAULT or NULL; otherwise the load is refused
//! with one error naming every mismatch, and nothing changes. Each incoming batch is then
//! aligned to the table's columns, cast, and written by the sink an `INSERT` ends in (without
//! planning a statement for each batch), so a load streams: only one batch is held at a time.
//! Each batch is atomic; a failure while
//! loading (a duplicate key, a value that does not cast) stops the load, and the rows of
//! earlier batches stay applied, unless the load runs in a transaction (its rows then commit
//! or roll back with it).

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef, RecordBatch};
use arrow::compute::{can_cast_types, cast_with_options, CastOptions};
use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::ScalarValue;
use datafusion::datasource::sink::DataSink;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{stream, Stream, TryStreamExt};
use nyala_engine::Privilege;
use nyala_storage::{Schema as TableSchema, WriteKind};

use crate::exec::sink::NyalaSink;
use crate::limits::interrupt::detached;
use crate::parse::partitioning::PartitionSpec;
use crate::parse::statement::{CreateTableSpec, Ddl, Nullability};
use crate::session::access::Requirements;
use crate::session::Session;
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
        // What the equivalent statements need: replacing a table is a DROP TABLE (ownership),
        // appending an INSERT.
        let needs = match (target.mode, exists) {
            (IngestMode::Replace, true) => Requirements::owner(&name),
            (IngestMode::Append | IngestMode::CreateOrAppend, true) => {
                Requirements::privilege(&name, Privilege::Insert)
            }
            _ => Requirements::default(),
        };
        self.authorize(&needs)?;
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
            if self.transaction().is_some_and(|txn| txn.has_written()) {
                return Err(SqlError::NotSupported(
                    "creating or replacing a table in a transaction that has written rows \
                     (DDL is not transactional: COMMIT or ROLLBACK first)"
                        .into(),
                ));
            }
            if exists {
                Ddl::DropTable {
                    name: name.clone(),
                    if_exists: true,
                }
                .apply(&self.db.client, None)
                .await?;
            }
            Ddl::CreateTable(spec)
                .apply(&self.db.client, self.user())
                .await?;
        }
        // A created table was made from the data's schema, so only appends can fail this, and
        // they fail before anything is written.
        let table = self.db.client.table(&name)?;
        let columns = ColumnMapping::new(&name, &schema, &table.schema)?;
        let context = self.task_ctx();
        let mut loaded = 0;
        let mut batches = std::pin::pin!(batches);
        loop {
            let result = async {
                let Some(batch) = batches.try_next().await? else {
                    return Ok(None);
                };
                if batch.num_rows() == 0 {
                    return Ok(Some(0));
                }
                let rows = columns.apply(&batch, &schema)?;
                let sink = NyalaSink::new(
                    self.db.client.clone(),
                    table.clone(),
                    WriteKind::Insert,
                    rows.schema(),
                );
                let rows = RecordBatchStreamAdapter::new(rows.schema(), stream::iter([Ok(rows)]));
                // In a task of its own: a batch is written whole even if the client goes away
                // meanwhile.
                let context = context.clone();
                let write = async move { sink.write_all(Box::pin(rows), &context).await };
                Ok(Some(detached(write).await??))
            }
            .await;
            match result {
                Ok(Some(count)) => loaded += count,
                Ok(None) => break,
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

/// Where each column of the table takes its values from in a load.
enum Source {
    /// The data's column at this index, cast to the table's type where it differs.
    Data(usize),
    /// The column's DEFAULT (the data leaves it out).
    Default(ScalarValue),
    /// NULL (the data leaves out a nullable column without DEFAULT).
    Null,
}

/// The columns a load gives a table: all but the auto_incrementing_id of a table with a non-unique
/// key or none, which the tablet assigns.
pub(crate) fn loaded_schema(table: &TableSchema) -> SchemaRef {
    let arrow = table.arrow_schema();
    match table.auto_increment_column() {
        None => arrow,
        Some(assigned) => {
            let kept: Vec<usize> = (0..arrow.fields().len())
                .filter(|&i| i != assigned)
                .collect();
            Arc::new(
                arrow
                    .project(&kept)
                    .unwrap_or_else(|_| arrow.as_ref().clone()),
            )
        }
    }
}

/// The data's columns matched to a table's, by name.
pub(crate) struct ColumnMapping {
    table_name: String,
    table: SchemaRef,
    sources: Vec<Source>,
}

impl ColumnMapping {
    /// Matches the columns of `data` to those of table `name`, or an error naming every column
    /// the table does not have, every column left out that needs a value, and every column whose
    /// type cannot be loaded into the table's.
    pub(crate) fn new(name: &str, data: &Schema, table: &TableSchema) -> Result<Self> {
        let arrow = loaded_schema(table);
        let mut problems = Vec::new();
        let mut seen = HashSet::new();
        for field in data.fields() {
            if !seen.insert(field.name()) {
                problems.push(format!(
                    "column '{}' appears twice in the data",
                    field.name()
                ));
            } else if arrow.field_with_name(field.name()).is_err() {
                problems.push(format!(
                    "the table has no column '{}' ({} in the data)",
                    field.name(),
                    field.data_type()
                ));
            }
        }
        let mut sources = Vec::with_capacity(arrow.fields().len());
        let assigned = table.auto_increment_column();
        let columns = (table.columns().iter().enumerate())
            .filter(|(i, _)| Some(*i) != assigned)
            .map(|(_, c)| c);
        for (column, field) in columns.zip(arrow.fields()) {
            let source = match data.index_of(field.name()) {
                Ok(i) => {
                    let from = data.field(i).data_type();
                    if from != field.data_type() && !can_cast_types(from, field.data_type()) {
                        problems.push(format!(
                            "column '{}' is {} and cannot hold the data's {from} values",
                            field.name(),
                            column.column_type.sql_name()
                        ));
                    }
                    Source::Data(i)
                }
                Err(_) => match &column.default {
                    Some(text) => {
                        let value = ScalarValue::try_from_string(text.clone(), field.data_type())
                            .map_err(|e| {
                            SqlError::Invalid(format!(
                                "column '{}': its DEFAULT {text} is not a {}: {e}",
                                field.name(),
                                column.column_type.sql_name()
                            ))
                        })?;
                        Source::Default(value)
                    }
                    None if field.is_nullable() => Source::Null,
                    None => {
                        problems.push(format!(
                            "the data has no column '{}' (NOT NULL, without DEFAULT)",
                            field.name()
                        ));
                        Source::Null
                    }
                },
            };
            sources.push(source);
        }
        if !problems.is_empty() {
            return Err(SqlError::Invalid(format!(
                "the data does not match table '{name}', nothing was loaded: {}",
                problems.join("; ")
            )));
        }
        Ok(Self {
            table_name: name.to_string(),
            table: arrow,
            sources,
        })
    }

    /// The first row of `batch` (of the load's schema) without a value for a NOT NULL column
    /// of the table, and that column.
    pub(crate) fn first_missing(&self, batch: &RecordBatch) -> Option<(usize, &str)> {
        let table = self.table.fields().iter().zip(&self.sources);
        (table.filter(|(field, _)| !field.is_nullable()))
            .filter_map(|(field, source)| match source {
                Source::Data(i) => {
                    let nulls = batch.column(*i).logical_nulls()?;
                    if nulls.null_count() == 0 {
                        return None;
                    }
                    let row = (0..nulls.len()).find(|&r| nulls.is_null(r))?;
                    Some((row, field.name().as_str()))
                }
                _ => None,
            })
            .min_by_key(|(row, _)| *row)
    }

    /// `batch` (of the load's schema `data`) as a batch of the table: its columns in the
    /// table's order, cast without loss, left-out ones filled.
    pub(crate) fn apply(&self, batch: &RecordBatch, data: &Schema) -> Result<RecordBatch> {
        if batch.schema_ref().fields() != data.fields() {
            return Err(SqlError::Invalid(format!(
                "a batch's columns differ from those the load declared: {} instead of {}",
                batch.schema_ref(),
                data
            )));
        }
        let options = CastOptions {
            safe: false,
            ..Default::default()
        };
        let rows = batch.num_rows();
        let columns = self
            .table
            .fields()
            .iter()
            .zip(&self.sources)
            .map(|(field, source)| match source {
                Source::Data(i) if batch.column(*i).data_type() == field.data_type() => {
                    Ok(batch.column(*i).clone())
                }
                Source::Data(i) => cast_with_options(batch.column(*i), field.data_type(), &options)
                    .map_err(|e| {
                        SqlError::Invalid(format!(
                            "column '{}': cannot load {} values as {}: {e}",
                            field.name(),
                            batch.column(*i).data_type(),
                            field.data_type()
                        ))
                    }),
                Source::Default(value) => Ok(value.to_array_of_size(rows)?),
                Source::Null => Ok(new_null_array(field.data_type(), rows)),
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        RecordBatch::try_new(Arc::clone(&self.table), columns)
            .map_err(|e| SqlError::Invalid(format!("table '{}': {e}", self.table_name)))
    }
}
