//! DML execution: DataFusion computes the rows, [`NyalaSink`] turns them into primary-key
//! mutations.
//!
//! - INSERT / UPSERT: the rows of the source plan (all table columns) are inserted or upserted.
//! - UPDATE: a scan of the target rows (filters pushed down) → the new values of the assigned
//!   columns next to the key columns → `Update` mutations by key.
//! - DELETE: a scan of the key columns of the target rows → `Delete` mutations.
//!
//! Rows go to the tablets batch by batch. Each tablet applies its part of a batch entirely or not
//! at all, but a statement is not atomic across batches and tablets: when one part is rejected,
//! the error says how many rows of the statement were applied before it.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use datafusion::datasource::sink::DataSink;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType};
use futures::StreamExt;
use nyala_engine::{Client, TableHandle};
use nyala_storage::WriteKind;

#[derive(Debug)]
pub struct NyalaSink {
    client: Client,
    table: TableHandle,
    kind: WriteKind,
    /// Schema of the rows this sink receives.
    schema: SchemaRef,
}

impl NyalaSink {
    pub fn new(client: Client, table: TableHandle, kind: WriteKind, schema: SchemaRef) -> Self {
        Self {
            client,
            table,
            kind,
            schema,
        }
    }

    fn verb(&self) -> &'static str {
        match self.kind {
            WriteKind::Insert => "INSERT",
            WriteKind::Upsert => "UPSERT",
            WriteKind::Update => "UPDATE",
            WriteKind::Delete => "DELETE",
        }
    }
}

impl DisplayAs for NyalaSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "NyalaSink: {} {}", self.verb(), self.table.name)
    }
}

#[async_trait]
impl DataSink for NyalaSink {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(
        &self,
        mut data: SendableRecordBatchStream,
        _context: &Arc<TaskContext>,
    ) -> Result<u64> {
        let mut applied = 0usize;
        while let Some(batch) = data.next().await {
            let batch = batch.map_err(|e| self.failed(applied, e.find_root().strip_backtrace()))?;
            if batch.num_rows() == 0 {
                continue;
            }
            let batch = self
                .with_table_types(batch)
                .map_err(|e| self.failed(applied, e.find_root().strip_backtrace()))?;
            match self.client.write(&self.table, self.kind, &batch).await {
                Ok(n) => applied += n,
                Err(e) => {
                    applied += e.applied;
                    return Err(self.failed(applied, e.error.to_string()));
                }
            }
        }
        Ok(applied as u64)
    }
}

impl NyalaSink {
    /// Wraps an error so the client learns what the statement left behind.
    fn failed(&self, applied: usize, error: String) -> DataFusionError {
        let rows = if applied == 1 { "row" } else { "rows" };
        DataFusionError::Execution(format!(
            "{error}; {} failed after {applied} {rows} had been applied",
            self.verb()
        ))
    }

    /// Re-labels the batch with the table's field definitions (names, nullability, timezone),
    /// which also rejects NULLs in NOT NULL columns with a clear error.
    fn with_table_types(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let table = self.table.schema.arrow_schema();
        let fields = batch
            .schema()
            .fields()
            .iter()
            .map(|f| {
                table
                    .field_with_name(f.name())
                    .map(|t| Arc::new(t.clone()))
                    .map_err(|_| DataFusionError::Plan(format!("unknown column '{}'", f.name())))
            })
            .collect::<Result<Vec<_>>>()?;
        let schema = Arc::new(arrow::datatypes::Schema::new(fields));
        let mut columns = Vec::with_capacity(batch.num_columns());
        for (column, field) in batch.columns().iter().zip(schema.fields()) {
            if column.data_type() == field.data_type() {
                columns.push(column.clone());
            } else {
                columns.push(arrow::compute::cast(column, field.data_type())?);
            }
        }
        RecordBatch::try_new(schema, columns).map_err(|e| {
            DataFusionError::Execution(e.to_string().replace("Invalid argument error: ", ""))
        })
    }
}
