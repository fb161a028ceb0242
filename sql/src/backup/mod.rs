//! `BACKUP` and `RESTORE`: consistent copies of tables as Parquet files, and tables made
//! again from them (Kudu's kudu-backup, in SQL).
//!
//! A backup is a directory on the server that runs the statement: one folder per table with a
//! Parquet file per tablet, and `manifest.json` ([`manifest`]), written last, which lists the
//! tables (schema, partitioning, options), the files with their sizes and checksums, the
//! snapshot and the parent backup. Every table is read at one snapshot ([`take`]): a full
//! backup scans it, an incremental one diff-scans it from its parent's snapshot (the rows whose
//! keys changed, each with its `_change`). A restore ([`restore`]) follows the parent chain to
//! the full backup, checks every file, creates the tables, and loads each key's newest row
//! across the chain (a key deleted in a later backup is left out), so a table is written once
//! whatever the chain's length.
//!
//! Both statements answer with a row per step done (`step` of `steps`), so a client can show
//! progress (`nyala admin backup`); a backup whose statement stops before its last step
//! leaves no manifest, and a restore that fails drops the tables it created.

mod manifest;
mod restore;
mod take;

use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef};
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use tokio::sync::mpsc;

use crate::parse::statement::{BackupSpec, RestoreSpec};
use crate::session::Session;
use crate::{Result, SqlError};

/// The result of BACKUP: a row per file written, the manifest last.
pub(crate) fn backup_schema() -> SchemaRef {
    Arc::new(ArrowSchema::new(vec![
        Field::new("step", DataType::UInt64, false),
        Field::new("steps", DataType::UInt64, false),
        Field::new("table_name", DataType::Utf8, true),
        Field::new("rows", DataType::UInt64, false),
        Field::new("bytes", DataType::UInt64, false),
        Field::new("file", DataType::Utf8, true),
    ]))
}

/// The result of RESTORE: a row per table and view restored.
pub(crate) fn restore_schema() -> SchemaRef {
    Arc::new(ArrowSchema::new(vec![
        Field::new("step", DataType::UInt64, false),
        Field::new("steps", DataType::UInt64, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("rows", DataType::UInt64, false),
    ]))
}

impl Session {
    /// Runs `BACKUP`: a stream of its steps as they are done.
    pub(crate) fn backup(&self, spec: BackupSpec) -> SendableRecordBatchStream {
        let client = self.db.client.clone();
        Progress::run(backup_schema(), |progress| {
            take::take(client, spec, progress)
        })
    }

    /// Runs `RESTORE`: a stream of its steps as they are done.
    pub(crate) fn restore(&self, spec: RestoreSpec) -> SendableRecordBatchStream {
        let session = self.clone();
        Progress::run(restore_schema(), |progress| async move {
            session.restore_backup(spec, progress).await
        })
    }
}

/// Where a backup or restore reports its steps: the statement's result stream.
#[derive(Clone)]
pub(crate) struct Progress {
    schema: SchemaRef,
    sender: mpsc::Sender<Result<RecordBatch>>,
}

impl Progress {
    /// Runs `work` in a task of its own, its steps (and its error, if it fails) the stream
    /// returned; the work sees the stream dropped through [`Progress::is_closed`].
    fn run<F, W>(schema: SchemaRef, work: W) -> SendableRecordBatchStream
    where
        W: FnOnce(Progress) -> F,
        F: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        let (sender, receiver) = mpsc::channel(16);
        let progress = Progress {
            schema: schema.clone(),
            sender,
        };
        let failed = progress.sender.clone();
        let work = work(progress);
        tokio::spawn(async move {
            if let Err(e) = work.await {
                let _ = failed.send(Err(e)).await;
            }
        });
        let rows = futures::stream::unfold(receiver, |mut receiver| async move {
            let next = receiver.recv().await?;
            Some((
                next.map_err(|e| DataFusionError::External(Box::new(e))),
                receiver,
            ))
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, rows))
    }

    pub(crate) fn sender(&self) -> mpsc::Sender<Result<RecordBatch>> {
        self.sender.clone()
    }

    /// Whether the statement's result is no longer read (its client went away or stopped it).
    pub(crate) fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// A backup's step: a tablet's file written (`path` None: an incremental backup's tablet
    /// where nothing changed), or the manifest (`table` None).
    async fn file(
        &self,
        step: u64,
        steps: u64,
        table: Option<&str>,
        rows: u64,
        bytes: u64,
        path: Option<&Path>,
    ) -> Result<()> {
        self.send(vec![
            Arc::new(UInt64Array::from(vec![step])),
            Arc::new(UInt64Array::from(vec![steps])),
            Arc::new(StringArray::from(vec![table])),
            Arc::new(UInt64Array::from(vec![rows])),
            Arc::new(UInt64Array::from(vec![bytes])),
            Arc::new(StringArray::from(vec![
                path.map(|p| p.display().to_string())
            ])),
        ])
        .await
    }

    /// A restore's step: a table or view restored.
    async fn restored(
        &self,
        step: u64,
        steps: u64,
        name: &str,
        kind: &str,
        rows: u64,
    ) -> Result<()> {
        self.send(vec![
            Arc::new(UInt64Array::from(vec![step])),
            Arc::new(UInt64Array::from(vec![steps])),
            Arc::new(StringArray::from(vec![name])),
            Arc::new(StringArray::from(vec![kind])),
            Arc::new(UInt64Array::from(vec![rows])),
        ])
        .await
    }

    async fn send(&self, columns: Vec<ArrayRef>) -> Result<()> {
        let batch = RecordBatch::try_new(self.schema.clone(), columns)?;
        self.sender.send(Ok(batch)).await.map_err(|_| stopped())
    }
}

/// `work` (file work, a tablet's scan) on the blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| SqlError::Invalid(format!("a backup's or restore's file work failed: {e}")))?
}

/// The error of a backup or restore whose statement stopped being read.
fn stopped() -> SqlError {
    SqlError::Cancelled("the statement was stopped before it was complete".into())
}
