//! `COPY t [(columns)] FROM 'path or glob' (FORMAT parquet | csv | json [, HEADER] [, DELIMITER
//! 'c'])` and `COPY t | (query) TO 'path' (FORMAT ...)`: tables loaded from and written to files
//! on the server, by the administrator only.
//!
//! COPY FROM reads the files in name order on the blocking pool ([`read`]), each batch matched
//! to the table's columns as a bulk ingest matches them, and streams them into one sink, so
//! the load is one statement: atomic (a transaction of its own, or the session's), and a bad
//! row fails it, naming its file and line (or row). COPY TO runs the query and writes its rows
//! to a file beside the target, renamed into place when complete ([`write`]).

mod read;
mod write;

pub(crate) use write::write as copy_to;

use std::path::PathBuf;

use datafusion::datasource::sink::DataSink;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use nyala_storage::WriteKind;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::exec::sink::NyalaSink;
use crate::ingest::loaded_schema;
use crate::limits::interrupt::detached;
use crate::parse::statement::CopyFileSpec;
use crate::session::Session;
use crate::{Result, SqlError};

/// Rows per batch read from a file.
const BATCH_ROWS: usize = 64 * 1024;

impl Session {
    /// `COPY table [(columns)] FROM 'path'`: returns the rows loaded.
    pub(crate) async fn copy_from(
        &self,
        spec: &CopyFileSpec,
        name: &str,
        columns: &[String],
    ) -> Result<u64> {
        let table = self.db.client.table(name)?;
        let files = files(&spec.path)?;
        let reader = read::Reader::new(spec, name, &table.schema, columns)?;
        let schema = loaded_schema(&table.schema);
        let (sender, receiver) = mpsc::channel(2);
        let reading = tokio::task::spawn_blocking(move || reader.read(&files, &sender));
        let rows = Box::pin(RecordBatchStreamAdapter::new(
            schema.clone(),
            ReceiverStream::new(receiver),
        ));
        let sink = NyalaSink::new(self.db.client.clone(), table, WriteKind::Insert, schema)
            .for_statement("COPY");
        let context = self.task_ctx();
        // In a task of its own: the load is written whole or not at all even if the client
        // goes away meanwhile.
        let written = detached(async move { sink.write_all(rows, &context).await }).await?;
        // (The reader stops when the sink stops taking its batches.)
        let _ = reading.await;
        Ok(written?)
    }
}

/// The files `path` names: itself, or those its glob pattern matches, in name order.
fn files(path: &str) -> Result<Vec<PathBuf>> {
    let pattern = path.contains(['*', '?', '[']);
    if !pattern {
        return match std::fs::metadata(path) {
            Ok(meta) if meta.is_file() => Ok(vec![PathBuf::from(path)]),
            Ok(_) => Err(SqlError::Invalid(format!("COPY: '{path}' is not a file"))),
            Err(e) => Err(SqlError::Invalid(format!(
                "COPY: cannot read '{path}': {e}"
            ))),
        };
    }
    let matches = glob::glob(path)
        .map_err(|e| SqlError::Invalid(format!("COPY: '{path}' is not a valid pattern: {e}")))?;
    let mut files = Vec::new();
    for entry in matches {
        let entry = entry.map_err(|e| SqlError::Invalid(format!("COPY: {e}")))?;
        if entry.is_file() {
            files.push(entry);
        }
    }
    if files.is_empty() {
        return Err(SqlError::Invalid(format!("COPY: no file matches '{path}'")));
    }
    files.sort();
    Ok(files)
}
