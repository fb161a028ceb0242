//! DML execution: DataFusion computes the rows, [`NyalaSink`] turns them into primary-key
//! mutations.
//!
//! - INSERT / UPSERT: the rows of the source plan (all table columns) are inserted or upserted.
//! - UPDATE and DELETE: the rows of a [`MutationNode`](crate::plan::dml::MutationNode)'s input,
//!   the target rows' key columns (plus for an UPDATE the new values of the assigned columns),
//!   become `Update` or `Delete` mutations by key; they run in
//!   [`ConditionalMutationExec`](crate::exec::mutation::ConditionalMutationExec), which writes
//!   each row only if it has not changed since the statement read it and reads the others again.
//!
//! A statement is atomic: rows that fit in one write to one tablet are that write, which the
//! tablet applies entirely or not at all; more rows, or rows of several tablets, are written in
//! a transaction that commits at one timestamp in all of them (or aborts in all).

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
use nyala_engine::{Client, EngineError, TableHandle, Written};
use nyala_storage::{Timestamp, WriteKind};

use crate::limits::interrupt::Interrupt;
use crate::session::transaction::{is_locked, TxnSlot};

#[derive(Debug)]
pub struct NyalaSink {
    client: Client,
    table: TableHandle,
    kind: WriteKind,
    /// Schema of the rows this sink receives.
    schema: SchemaRef,
    /// The statement it writes for, as errors name it (None: the one its kind says).
    statement: Option<&'static str>,
}

impl NyalaSink {
    pub fn new(client: Client, table: TableHandle, kind: WriteKind, schema: SchemaRef) -> Self {
        Self {
            client,
            table,
            kind,
            schema,
            statement: None,
        }
    }

    /// The same sink, its errors naming the statement `statement` (`COPY`).
    pub(crate) fn for_statement(self, statement: &'static str) -> Self {
        Self {
            statement: Some(statement),
            ..self
        }
    }

    pub(crate) fn verb(&self) -> &'static str {
        if let Some(statement) = self.statement {
            return statement;
        }
        match self.kind {
            WriteKind::Insert => "INSERT",
            WriteKind::InsertIgnore => "INSERT IGNORE",
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
        data: SendableRecordBatchStream,
        context: &Arc<TaskContext>,
    ) -> Result<u64> {
        match self.write_statement(data, None, context).await? {
            Outcome::Written(rows) => Ok(rows),
            // Unconditional writes have no conflicts.
            Outcome::Conflict => Err(DataFusionError::Internal(format!(
                "{} met a conflict",
                self.verb()
            ))),
        }
    }
}

/// What writing a statement's rows did.
pub(crate) enum Outcome {
    /// All its rows were written, this many.
    Written(u64),
    /// A row changed after the statement's snapshot, or is locked by a transaction in
    /// progress: nothing was written, the statement must read its rows again.
    Conflict,
}

impl NyalaSink {
    pub(crate) fn table_id(&self) -> &str {
        &self.table.id
    }

    /// Writes all rows of `data` as one statement: entirely or not at all. Rows that fit in
    /// one write to one tablet are that write; more become a transaction (see
    /// [`nyala_engine::Transaction`]). With `unchanged_since`, a row changed since that snapshot
    /// (or locked by a transaction in progress) makes the statement write nothing and report
    /// [`Outcome::Conflict`].
    pub(crate) async fn write_statement(
        &self,
        mut data: SendableRecordBatchStream,
        unchanged_since: Option<Timestamp>,
        context: &TaskContext,
    ) -> Result<Outcome> {
        // Asked to stop, the statement stops while it reads, never in a write it has begun.
        let interrupt = Interrupt::of(context);
        if let Some(txn) = TxnSlot::of(context) {
            // In the session's transaction: written when all rows are known (the statement's
            // reads of the table do not see its own writes), at the transaction's snapshot.
            let mut batches = Vec::new();
            loop {
                match self.next_batch(&mut data, &interrupt).await {
                    Ok(Some(batch)) => batches.push(batch),
                    Ok(None) => break,
                    Err(e) => {
                        txn.fail(&e.strip_backtrace()).await;
                        return Err(e);
                    }
                }
            }
            let rows = txn
                .write(&self.table, self.kind, batches, self.verb())
                .await?;
            return Ok(Outcome::Written(rows));
        }
        let Some(first) = self.next_batch(&mut data, &interrupt).await? else {
            return Ok(Outcome::Written(0));
        };
        let second = self.next_batch(&mut data, &interrupt).await?;
        let single = second.is_none()
            && (self.client.is_single_write(&self.table, &first)).map_err(|e| self.failed(e))?;
        if single {
            let written = match unchanged_since {
                None => (self.client.write(&self.table, self.kind, &first).await)
                    .map(|rows| Written { rows, conflicts: 0 }),
                Some(snapshot) => {
                    (self.client)
                        .write_unchanged_since(&self.table, self.kind, &first, snapshot)
                        .await
                }
            };
            return match written {
                Ok(w) if w.conflicts == 0 => Ok(Outcome::Written(w.rows as u64)),
                Ok(_) => Ok(Outcome::Conflict),
                Err(e) => Err(self.failed(e.error)),
            };
        }
        let txn = self.client.begin();
        let written = async {
            let mut rows = 0u64;
            let mut batch = Some(first);
            let mut next = second;
            while let Some(rows_now) = batch {
                // The last write prepares the tablets it writes.
                let last = next.is_none();
                let written = txn
                    .write(&self.table, self.kind, &rows_now, unchanged_since, last)
                    .await;
                match written {
                    Ok(w) if w.conflicts == 0 => rows += w.rows as u64,
                    Ok(_) => return Ok(Outcome::Conflict),
                    Err(e) if unchanged_since.is_some() && is_locked(&e.error) => {
                        return Ok(Outcome::Conflict)
                    }
                    Err(e) => return Err(self.failed(e.error)),
                }
                batch = next.take();
                if batch.is_some() {
                    next = self.next_batch(&mut data, &interrupt).await?;
                }
            }
            Ok(Outcome::Written(rows))
        }
        .await;
        match written {
            Ok(Outcome::Written(rows)) => {
                txn.commit().await.map_err(|e| match e {
                    // Not "changed nothing": the status table decides.
                    e @ EngineError::OutcomeUnknown(_) => {
                        DataFusionError::External(Box::new(crate::SqlError::Engine(e)))
                    }
                    e => self.failed(e),
                })?;
                Ok(Outcome::Written(rows))
            }
            other => {
                txn.abort().await;
                other
            }
        }
    }

    /// The next batch of `data` with rows, in the table's types; an error if the statement is
    /// asked to stop first.
    async fn next_batch(
        &self,
        data: &mut SendableRecordBatchStream,
        interrupt: &Interrupt,
    ) -> Result<Option<RecordBatch>> {
        interrupt.unless_stopped(self.next_rows(data)).await
    }

    async fn next_rows(&self, data: &mut SendableRecordBatchStream) -> Result<Option<RecordBatch>> {
        while let Some(batch) = data.next().await {
            let batch = batch.map_err(|e| self.failed(e.find_root().strip_backtrace()))?;
            if batch.num_rows() > 0 {
                let batch = self.with_table_types(batch);
                return batch
                    .map(Some)
                    .map_err(|e| self.failed(e.find_root().strip_backtrace()));
            }
        }
        Ok(None)
    }

    /// Wraps an error of the statement, which wrote nothing.
    fn failed(&self, error: impl fmt::Display) -> DataFusionError {
        DataFusionError::Execution(format!("{error}; the {} changed nothing", self.verb()))
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
