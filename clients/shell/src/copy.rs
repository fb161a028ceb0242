//! `\copy table FROM 'file'`: loads a CSV (with a header row) or Parquet file into an existing
//! table through the connection's bulk ingest, batch by batch, with a progress bar.

use std::fs::File;
use std::path::Path;

use anyhow::{bail, Context};
use arrow::array::{RecordBatch, RecordBatchReader};
use arrow::datatypes::SchemaRef;
use futures::stream::BoxStream;
use indicatif::{ProgressBar, ProgressStyle};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::Connection;

const BATCH_ROWS: usize = 16 * 1024;

/// The parts of `\copy <table> FROM '<path>'`.
pub fn parse(command: &str) -> anyhow::Result<(String, String)> {
    let usage = "usage: \\copy <table> FROM '<file.csv|file.parquet>'";
    let rest = command.trim().strip_prefix("\\copy").context(usage)?.trim();
    let (table, rest) = rest.split_once(char::is_whitespace).context(usage)?;
    let rest = rest.trim_start();
    if rest.len() < 4 || !rest[..4].eq_ignore_ascii_case("from") {
        bail!(usage);
    }
    let path = rest[4..].trim().trim_end_matches(';').trim();
    let path = path
        .strip_prefix('\'')
        .and_then(|p| p.strip_suffix('\''))
        .unwrap_or(path);
    if path.is_empty() {
        bail!(usage);
    }
    Ok((table.to_string(), path.to_string()))
}

/// A progress bar on stderr (drawn only on a terminal); `amounts` is e.g. "{pos}/{len} rows".
fn progress(total: u64, amounts: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let template = format!("[{{elapsed_precise}}] {{bar:40}} {amounts} (eta {{eta}})");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}

/// Opens `path` as a stream of batches with its schema; the bar advances as it is read.
fn open(
    path: &Path,
) -> anyhow::Result<(
    SchemaRef,
    BoxStream<'static, anyhow::Result<RecordBatch>>,
    ProgressBar,
)> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    match extension.as_str() {
        "parquet" | "pq" => {
            let builder = ParquetRecordBatchReaderBuilder::try_new(file)
                .with_context(|| format!("{} is not a Parquet file", path.display()))?;
            let bar = progress(
                builder.metadata().file_metadata().num_rows().max(0) as u64,
                "{pos}/{len} rows",
            );
            let reader = builder.with_batch_size(BATCH_ROWS).build()?;
            let schema = reader.schema();
            let counter = bar.clone();
            let batches = futures::stream::iter(reader.map(move |b| {
                let batch = b?;
                counter.inc(batch.num_rows() as u64);
                Ok(batch)
            }));
            Ok((schema, Box::pin(batches), bar))
        }
        "csv" => {
            let size = file.metadata()?.len();
            let format = arrow::csv::reader::Format::default().with_header(true);
            let (schema, _) = format
                .infer_schema(&file, Some(1000))
                .with_context(|| format!("cannot read a CSV header from {}", path.display()))?;
            let schema = std::sync::Arc::new(schema);
            let file = File::open(path)?;
            let bar = progress(size, "{bytes}/{total_bytes}");
            let reader = arrow::csv::ReaderBuilder::new(schema.clone())
                .with_format(format)
                .with_batch_size(BATCH_ROWS)
                .build(bar.wrap_read(file))?;
            let batches = futures::stream::iter(reader.map(|b| b.map_err(anyhow::Error::from)));
            Ok((schema, Box::pin(batches), bar))
        }
        _ => bail!(
            "\\copy reads .csv (with a header row) and .parquet files, not {}",
            path.display()
        ),
    }
}

/// Runs `\copy`; returns the message to print.
pub async fn run(conn: &dyn Connection, command: &str) -> anyhow::Result<String> {
    let (table, path) = parse(command)?;
    let (schema, batches, bar) = open(Path::new(&path))?;
    let result = conn.ingest(&table, schema, batches).await;
    bar.finish_and_clear();
    Ok(format!("COPY {} rows", result?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_copy_commands() {
        assert_eq!(
            parse("\\copy t FROM '/tmp/a b.csv'").unwrap(),
            ("t".into(), "/tmp/a b.csv".into())
        );
        assert_eq!(
            parse("\\copy t from x.parquet;").unwrap(),
            ("t".into(), "x.parquet".into())
        );
        assert!(parse("\\copy t").is_err());
        assert!(parse("\\copy t TO 'x.csv'").is_err());
    }
}
