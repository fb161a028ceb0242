//! COPY TO: a query's rows written to a file on the blocking pool, into a file beside the
//! target first, synced and renamed into place when complete, so the target is either as it
//! was or the whole result.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::Compression;
use datafusion::parquet::file::properties::WriterProperties;
use futures::TryStreamExt;
use tokio::sync::mpsc;

use crate::parse::statement::{CopyFileSpec, FileFormat};
use crate::{Result, SqlError};

/// Writes `rows` to the file `spec` names; returns how many.
pub(crate) async fn write(mut rows: SendableRecordBatchStream, spec: &CopyFileSpec) -> Result<u64> {
    let target = PathBuf::from(&spec.path);
    let partial = partial_path(&target)?;
    let schema = rows.schema();
    let (sender, receiver) = mpsc::channel::<RecordBatch>(2);
    let writing = {
        let (spec, partial) = (spec.clone(), partial.clone());
        tokio::task::spawn_blocking(move || write_file(&partial, &spec, schema, receiver))
    };
    let sent = async {
        while let Some(batch) = rows.try_next().await? {
            if sender.send(batch).await.is_err() {
                break; // the writer failed: its error says why
            }
        }
        Ok::<_, SqlError>(())
    }
    .await;
    drop(sender);
    let written = writing
        .await
        .map_err(|e| SqlError::Invalid(format!("COPY TO: the writer failed: {e}")))?;
    let done = sent.and(written).and_then(|rows| {
        std::fs::rename(&partial, &target)
            .map_err(|e| SqlError::Invalid(format!("COPY TO '{}': {e}", target.display())))?;
        if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| SqlError::Invalid(format!("COPY TO '{}': {e}", target.display())))?;
        }
        Ok(rows)
    });
    if done.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    done
}

/// The file a COPY TO writes first, beside `target`.
fn partial_path(target: &Path) -> Result<PathBuf> {
    let name = target.file_name().ok_or_else(|| {
        SqlError::Invalid(format!("COPY TO '{}': not a file name", target.display()))
    })?;
    let mut partial = name.to_os_string();
    partial.push(".nyala-partial");
    Ok(target.with_file_name(partial))
}

/// Writes the batches `receiver` gets into `path` in `spec`'s format, durably.
fn write_file(
    path: &Path,
    spec: &CopyFileSpec,
    schema: SchemaRef,
    mut receiver: mpsc::Receiver<RecordBatch>,
) -> Result<u64> {
    let failed =
        |e: &dyn std::fmt::Display| SqlError::Invalid(format!("COPY TO '{}': {e}", spec.path));
    let file = File::create(path).map_err(|e| failed(&e))?;
    let out = BufWriter::with_capacity(1 << 20, file);
    let mut rows = 0u64;
    let out = match spec.format {
        FileFormat::Parquet => {
            let properties = WriterProperties::builder()
                .set_compression(Compression::LZ4_RAW)
                .build();
            let mut writer =
                ArrowWriter::try_new(out, schema, Some(properties)).map_err(|e| failed(&e))?;
            while let Some(batch) = receiver.blocking_recv() {
                rows += batch.num_rows() as u64;
                writer.write(&batch).map_err(|e| failed(&e))?;
            }
            writer.into_inner().map_err(|e| failed(&e))?
        }
        FileFormat::Csv => {
            let mut writer = arrow::csv::WriterBuilder::new()
                .with_header(spec.header)
                .with_delimiter(spec.delimiter)
                .build(out);
            while let Some(batch) = receiver.blocking_recv() {
                rows += batch.num_rows() as u64;
                writer.write(&batch).map_err(|e| failed(&e))?;
            }
            writer.into_inner()
        }
        FileFormat::Json => {
            let mut writer = arrow::json::LineDelimitedWriter::new(out);
            while let Some(batch) = receiver.blocking_recv() {
                rows += batch.num_rows() as u64;
                writer.write(&batch).map_err(|e| failed(&e))?;
            }
            writer.finish().map_err(|e| failed(&e))?;
            writer.into_inner()
        }
    };
    let file = out.into_inner().map_err(|e| failed(&e))?;
    file.sync_all().map_err(|e| failed(&e))?;
    Ok(rows)
}
