//! Files read for COPY FROM, on the blocking pool: each file's batches matched to the table's
//! columns (by name: a Parquet file's own columns, or for CSV and JSON the columns the statement
//! lists, read as the table's types), every error naming the file and the line (CSV, JSON) or
//! row (Parquet) where it can.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{RecordBatch, RecordBatchReader};
use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use nyala_storage::Schema as TableSchema;
use tokio::sync::mpsc::Sender;

use super::BATCH_ROWS;
use crate::ingest::{loaded_schema, ColumnMapping};
use crate::parse::statement::{CopyFileSpec, FileFormat};
use crate::{Result, SqlError};

/// How the files of one COPY FROM are read.
pub(super) struct Reader {
    format: FileFormat,
    header: bool,
    delimiter: u8,
    table_name: String,
    table: TableSchema,
    /// CSV and JSON: the columns the files hold, in order, as the table's types (nullable: a
    /// missing value is reported with its line by the mapping).
    text_schema: SchemaRef,
    /// The columns the statement lists (empty: the file's, or all the table's).
    columns: Vec<String>,
}

impl Reader {
    pub(super) fn new(
        spec: &CopyFileSpec,
        table_name: &str,
        table: &TableSchema,
        columns: &[String],
    ) -> Result<Self> {
        let arrow = loaded_schema(table);
        let fields: Vec<Field> = match columns.is_empty() {
            true => (arrow.fields().iter())
                .map(|f| f.as_ref().clone())
                .collect(),
            false => (columns.iter())
                .map(|c| {
                    (arrow.field_with_name(c).cloned()).map_err(|_| {
                        SqlError::Invalid(format!("table '{table_name}' has no column '{c}'"))
                    })
                })
                .collect::<Result<_>>()?,
        };
        let fields: Vec<Field> = fields.into_iter().map(|f| f.with_nullable(true)).collect();
        Ok(Reader {
            format: spec.format,
            header: spec.header,
            delimiter: spec.delimiter,
            table_name: table_name.to_string(),
            table: table.clone(),
            text_schema: Arc::new(Schema::new(fields)),
            columns: columns.to_vec(),
        })
    }

    /// Reads `files` in order into `out`, as batches of the table's columns; stops at the
    /// first error, sent as the last item, or when `out` is closed.
    pub(super) fn read(&self, files: &[PathBuf], out: &Sender<DFResult<RecordBatch>>) {
        for file in files {
            let sent = match self.format {
                FileFormat::Parquet => self.parquet(file, out),
                FileFormat::Csv => self.csv(file, out),
                FileFormat::Json => self.json(file, out),
            };
            match sent {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    let e = DataFusionError::Execution(format!("{}: {e}", file.display()));
                    let _ = out.blocking_send(Err(e));
                    return;
                }
            }
        }
    }

    /// A Parquet file's columns, matched by name; false when `out` is closed.
    fn parquet(&self, path: &Path, out: &Sender<DFResult<RecordBatch>>) -> Result<bool> {
        let builder = ParquetRecordBatchReaderBuilder::try_new(open(path)?)
            .map_err(|e| SqlError::Invalid(format!("not a Parquet file: {e}")))?;
        let mut builder = builder.with_batch_size(BATCH_ROWS);
        if !self.columns.is_empty() {
            let file = builder.schema().clone();
            let mut wanted = Vec::with_capacity(self.columns.len());
            for column in &self.columns {
                wanted.push(file.index_of(column).map_err(|_| {
                    SqlError::Invalid(format!("the file has no column '{column}'"))
                })?);
            }
            let mask =
                datafusion::parquet::arrow::ProjectionMask::roots(builder.parquet_schema(), wanted);
            builder = builder.with_projection(mask);
        }
        let reader = builder
            .build()
            .map_err(|e| SqlError::Invalid(format!("cannot read: {e}")))?;
        let schema = reader.schema();
        let mapping = ColumnMapping::new(&self.table_name, &schema, &self.table)?;
        let mut row = 0;
        for batch in reader {
            let batch = batch.map_err(|e| SqlError::Invalid(format!("after row {row}: {e}")))?;
            let rows = batch.num_rows();
            let mapped = self.mapped(&mapping, &batch, &schema, |i| {
                format!("row {}", row + i + 1)
            })?;
            row += rows;
            if out.blocking_send(Ok(mapped)).is_err() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A CSV file, its fields in the order of the listed columns (or the table's).
    fn csv(&self, path: &Path, out: &Sender<DFResult<RecordBatch>>) -> Result<bool> {
        let reader = arrow::csv::ReaderBuilder::new(self.text_schema.clone())
            .with_header(self.header)
            .with_delimiter(self.delimiter)
            .with_batch_size(BATCH_ROWS)
            .build(BufReader::with_capacity(1 << 20, open(path)?))?;
        let mapping = ColumnMapping::new(&self.table_name, &self.text_schema, &self.table)?;
        // Lines before the first row of the next batch (one line per row).
        let mut line = usize::from(self.header);
        for batch in reader {
            let batch = batch.map_err(|e| SqlError::Invalid(file_lines(e.to_string())))?;
            let rows = batch.num_rows();
            let mapped = self.mapped(&mapping, &batch, &self.text_schema, |i| {
                format!("line {}", line + i + 1)
            })?;
            line += rows;
            if out.blocking_send(Ok(mapped)).is_err() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A file of JSON objects, one per line, their fields named as the table's columns.
    fn json(&self, path: &Path, out: &Sender<DFResult<RecordBatch>>) -> Result<bool> {
        let new_decoder = || {
            arrow::json::ReaderBuilder::new(self.text_schema.clone())
                .with_batch_size(BATCH_ROWS)
                .build_decoder()
        };
        let mapping = ColumnMapping::new(&self.table_name, &self.text_schema, &self.table)?;
        let mut input = BufReader::with_capacity(1 << 20, open(path)?);
        let mut decoder = new_decoder()?;
        // The lines of the batch being decoded (to find a bad one), and the file's line of the
        // first of them.
        let mut lines: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut number = 0;
        loop {
            let mut line = Vec::new();
            let read = (input.read_until(b'\n', &mut line))
                .map_err(|e| SqlError::Invalid(format!("cannot read: {e}")))?;
            number += 1;
            let end = read == 0;
            if !end && !line.iter().all(u8::is_ascii_whitespace) {
                decoder
                    .decode(&line)
                    .map_err(|e| SqlError::Invalid(format!("line {number}: {e}")))?;
                lines.push((number, line));
            }
            if lines.len() < BATCH_ROWS && !end {
                continue;
            }
            let batch = match decoder.flush() {
                Ok(Some(batch)) => batch,
                Ok(None) => return Ok(true),
                // Which line: each decoded alone, until one fails.
                Err(e) => {
                    for (number, line) in &lines {
                        let mut alone = new_decoder()?;
                        if let Err(e) = alone.decode(line).and_then(|_| alone.flush()) {
                            return Err(SqlError::Invalid(format!("line {number}: {e}")));
                        }
                    }
                    return Err(SqlError::Invalid(e.to_string()));
                }
            };
            let first: Vec<usize> = lines.drain(..).map(|(n, _)| n).collect();
            let mapped = self.mapped(&mapping, &batch, &self.text_schema, |i| {
                format!("line {}", first.get(i).copied().unwrap_or(0))
            })?;
            if out.blocking_send(Ok(mapped)).is_err() {
                return Ok(false);
            }
            if end {
                return Ok(true);
            }
        }
    }

    /// `batch` (of `schema`) as a batch of the table's columns; a missing value in a NOT NULL
    /// column is an error naming where it is (`place` of its row in the batch).
    fn mapped(
        &self,
        mapping: &ColumnMapping,
        batch: &RecordBatch,
        schema: &Schema,
        place: impl Fn(usize) -> String,
    ) -> Result<RecordBatch> {
        if let Some((row, column)) = mapping.first_missing(batch) {
            return Err(SqlError::Invalid(format!(
                "{}: column '{column}' is NOT NULL and the value is missing",
                place(row)
            )));
        }
        mapping.apply(batch, schema)
    }
}

fn open(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| SqlError::Invalid(format!("cannot open: {e}")))
}

/// arrow-csv's error `message`, its "at line N" (counted from 0) made the file's line.
fn file_lines(message: String) -> String {
    let Some((before, after)) = message.split_once("at line ") else {
        return message;
    };
    let digits = after
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(after.len());
    match after[..digits].parse::<usize>() {
        Ok(row) => format!("{before}at line {}{}", row + 1, &after[digits..]),
        Err(_) => message,
    }
}
