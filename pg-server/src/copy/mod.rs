//! `COPY t [(columns)] FROM STDIN` and `COPY t | (query) TO STDOUT`, in text, CSV and binary
//! format (PostgreSQL's `COPY`, psql's `\copy`, psycopg's `cursor.copy()`). COPY to or from a file
//! on the server is a statement of the session layer's (`nyala_sql`'s `copy`).
//!
//! Rows copied in are loaded through the bulk ingest path, as a Flight SQL ingest is: all of
//! them or, on an error, none. The client's data is kept until it says it is done (at most
//! [`MAX_COPY_BYTES`]), then parsed against the table's columns: in text and CSV every value
//! as PostgreSQL writes it in text (`\N` or an unquoted empty CSV field is NULL, `bytea` as
//! `\x` hex), cast to its column's type; in binary every value in its type's binary form
//! ([`binary`]). Rows copied out are encoded by `arrow-pg` as PostgreSQL writes them.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BinaryArray, RecordBatch, StringArray};
use arrow::compute::CastOptions;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::sql::sqlparser::ast::{
    CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget, Statement,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use futures::StreamExt;
use nyala_server::run::BatchStream;
use nyala_server::{ClientSession, ServerError};
use nyala_sql::{IngestMode, IngestTarget, SqlError};
use pgwire::api::results::{CopyCsvOptions, CopyEncoder, CopyResponse, CopyTextOptions, FieldInfo};
use pgwire::error::PgWireResult;
use pgwire::messages::copy::CopyData;

use crate::errors::pg_error;

mod binary;

/// The most bytes one `COPY ... FROM STDIN` may send (larger loads: several COPYs, or Flight
/// SQL's bulk ingest, which streams).
pub(crate) const MAX_COPY_BYTES: usize = 256 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Text,
    Csv,
    Binary,
}

/// A parsed COPY statement.
#[derive(Debug, Clone)]
pub(crate) struct CopySpec {
    pub(crate) direction: Direction,
    pub(crate) format: Format,
    delimiter: Option<char>,
    null: Option<String>,
    header: bool,
    quote: Option<char>,
    escape: Option<char>,
}

#[derive(Debug, Clone)]
pub(crate) enum Direction {
    /// Into `table`, its `columns` (all when empty).
    In { table: String, columns: Vec<String> },
    /// The rows of `query`.
    Out { query: String },
}

/// `sql` as a COPY statement; None for other statements.
pub(crate) fn recognise(sql: &str) -> Result<Option<CopySpec>, ServerError> {
    if !sql
        .trim_start()
        .get(..4)
        .is_some_and(|w| w.eq_ignore_ascii_case("copy"))
    {
        return Ok(None);
    }
    let mut statements = Parser::parse_sql(&PostgreSqlDialect {}, sql)
        .map_err(|e| ServerError::from(SqlError::from(e)))?;
    let Some(Statement::Copy {
        source,
        to,
        target,
        options,
        legacy_options,
        ..
    }) = (statements.len() == 1).then(|| statements.remove(0))
    else {
        return Ok(None);
    };
    if let CopyTarget::File { .. } = target {
        return Ok(None); // a file on the server: the session layer's statement
    }
    let direction = match (to, &target, source) {
        (
            false,
            CopyTarget::Stdin,
            CopySource::Table {
                table_name,
                columns,
            },
        ) => Direction::In {
            table: nyala_sql::statement::object_name(&table_name)?,
            columns: columns
                .iter()
                .map(nyala_sql::statement::normalize_ident)
                .collect(),
        },
        (
            true,
            CopyTarget::Stdout,
            CopySource::Table {
                table_name,
                columns,
            },
        ) => Direction::Out {
            query: nyala_sql::statement::copy_table_query(&table_name, &columns),
        },
        (true, CopyTarget::Stdout, CopySource::Query(query)) => Direction::Out {
            query: query.to_string(),
        },
        (false, _, CopySource::Query(_)) => {
            return Err(ServerError::invalid("COPY FROM loads a table, not a query"))
        }
        _ => {
            return Err(SqlError::NotSupported(
                "COPY to or from a program on the server: use STDIN or STDOUT, or a file".into(),
            )
            .into())
        }
    };
    let mut spec = CopySpec {
        direction,
        format: Format::Text,
        delimiter: None,
        null: None,
        header: false,
        quote: None,
        escape: None,
    };
    for option in options {
        match option {
            CopyOption::Format(name) => {
                spec.format = match name.value.to_ascii_lowercase().as_str() {
                    "text" => Format::Text,
                    "csv" => Format::Csv,
                    "binary" => Format::Binary,
                    other => {
                        return Err(ServerError::invalid(format!(
                            "COPY format \"{other}\" not recognized"
                        )))
                    }
                }
            }
            CopyOption::Delimiter(c) => spec.delimiter = Some(c),
            CopyOption::Null(s) => spec.null = Some(s),
            CopyOption::Header(h) => spec.header = h,
            CopyOption::Quote(c) => spec.quote = Some(c),
            CopyOption::Escape(c) => spec.escape = Some(c),
            CopyOption::Freeze(_) | CopyOption::Encoding(_) => {}
            other => {
                return Err(SqlError::NotSupported(format!("COPY option {other}")).into());
            }
        }
    }
    for option in legacy_options {
        match option {
            CopyLegacyOption::Binary => spec.format = Format::Binary,
            CopyLegacyOption::Delimiter(c) => spec.delimiter = Some(c),
            CopyLegacyOption::Null(s) => spec.null = Some(s),
            CopyLegacyOption::Csv(csv) => {
                spec.format = Format::Csv;
                for option in csv {
                    match option {
                        CopyLegacyCsvOption::Header => spec.header = true,
                        CopyLegacyCsvOption::Quote(c) => spec.quote = Some(c),
                        CopyLegacyCsvOption::Escape(c) => spec.escape = Some(c),
                        other => {
                            return Err(
                                SqlError::NotSupported(format!("COPY option {other}")).into()
                            )
                        }
                    }
                }
            }
            other => return Err(SqlError::NotSupported(format!("COPY option {other}")).into()),
        }
    }
    let text_options = spec.delimiter.is_some()
        || spec.null.is_some()
        || spec.header
        || spec.quote.is_some()
        || spec.escape.is_some();
    if spec.format == Format::Binary && text_options {
        return Err(ServerError::invalid(
            "COPY in binary format takes no DELIMITER, NULL, HEADER, QUOTE or ESCAPE",
        ));
    }
    Ok(Some(spec))
}

impl CopySpec {
    fn wire_format(&self) -> i8 {
        match self.format {
            Format::Binary => 1,
            _ => 0,
        }
    }

    fn delimiter(&self) -> char {
        self.delimiter.unwrap_or(match self.format {
            Format::Csv => ',',
            _ => '\t',
        })
    }

    fn null(&self) -> String {
        self.null.clone().unwrap_or_else(|| match self.format {
            Format::Csv => String::new(),
            _ => "\\N".into(),
        })
    }

    /// The rows of a `COPY ... TO STDOUT`, encoded.
    pub(crate) fn copy_out(
        &self,
        fields: Arc<Vec<FieldInfo>>,
        batches: BatchStream,
    ) -> CopyResponse {
        let fields = match self.format {
            Format::Binary => binary::fields(&fields),
            Format::Text | Format::Csv => fields,
        };
        let mut encoder = match self.format {
            Format::Csv => CopyEncoder::new_csv(
                fields.clone(),
                CopyCsvOptions {
                    delimiter: self.delimiter().to_string().into(),
                    quote: self.quote.unwrap_or('"').to_string().into(),
                    escape: self.escape.or(self.quote).unwrap_or('"').to_string().into(),
                    null_string: self.null().into(),
                    force_quote: vec![],
                },
            ),
            Format::Binary => CopyEncoder::new_binary(fields.clone()),
            Format::Text => CopyEncoder::new_text(
                fields.clone(),
                CopyTextOptions {
                    delimiter: self.delimiter().to_string().into(),
                    null_string: self.null().into(),
                },
            ),
        };
        let header = (self.header && self.format == Format::Csv).then(|| {
            let names: Vec<&str> = fields.iter().map(|f| f.name()).collect();
            let line = format!("{}\n", names.join(&self.delimiter().to_string()));
            Ok(CopyData::new(line.into_bytes().into()))
        });
        let columns = fields.len();
        let rows = batches.flat_map(move |batch| {
            let encoded = batch
                .and_then(|b| crate::results::sent_batch(b).map_err(ServerError::from))
                .map_err(pg_error)
                .and_then(|batch| encode(&mut encoder, &fields, &batch));
            futures::stream::iter(match encoded {
                Ok(rows) => rows.into_iter().map(Ok).collect::<Vec<_>>(),
                Err(e) => vec![Err(e)],
            })
        });
        let stream = futures::stream::iter(header).chain(rows);
        match self.format {
            Format::Binary => binary::response(columns, stream),
            Format::Text | Format::Csv => CopyResponse::new(self.wire_format(), columns, stream),
        }
    }

    /// The rows of `data`, sent by a `COPY ... FROM STDIN`, as a batch of `schema`'s columns.
    fn parse(&self, data: &[u8], schema: &SchemaRef) -> Result<RecordBatch, ServerError> {
        let columns = match self.format {
            Format::Binary => binary::columns(data, schema)?,
            Format::Text | Format::Csv => self.text_columns(data, schema)?,
        };
        let null_in_not_null = (schema.fields().iter())
            .zip(&columns)
            .find(|(field, column)| !field.is_nullable() && column.null_count() > 0);
        if let Some((field, _)) = null_in_not_null {
            return Err(ServerError::invalid(format!(
                "COPY column {}: NULL in a NOT NULL column",
                field.name()
            )));
        }
        RecordBatch::try_new(schema.clone(), columns)
            .map_err(|e| ServerError::from(SqlError::from(e)))
    }

    /// The columns of `data` in text or CSV format, each cast from text to its field's type.
    fn text_columns(&self, data: &[u8], schema: &SchemaRef) -> Result<Vec<ArrayRef>, ServerError> {
        let text = std::str::from_utf8(data)
            .map_err(|e| ServerError::invalid(format!("COPY data is not UTF-8: {e}")))?;
        let rows = match self.format {
            Format::Csv => self.csv_rows(text, schema.fields().len())?,
            _ => self.text_rows(text, schema.fields().len())?,
        };
        (schema.fields().iter().enumerate())
            .map(|(i, field)| {
                let values: Vec<Option<&str>> = rows.iter().map(|r| r[i].as_deref()).collect();
                typed(field, values)
            })
            .collect()
    }

    /// PostgreSQL's text format: a row per line, fields split by the delimiter, backslash
    /// escapes, the NULL string for NULL.
    fn text_rows(&self, text: &str, width: usize) -> Result<Vec<Vec<Option<String>>>, ServerError> {
        let delimiter = self.delimiter();
        let null = self.null();
        let mut rows = Vec::new();
        for (n, line) in text.split('\n').enumerate() {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line == "\\." || (line.is_empty() && n + 1 == text.split('\n').count()) {
                continue;
            }
            if self.header && n == 0 {
                continue;
            }
            let fields: Vec<Option<String>> = line
                .split(delimiter)
                .map(|field| (field != null).then(|| unescape(field)))
                .collect();
            check_width(fields.len(), width, n + 1)?;
            rows.push(fields);
        }
        Ok(rows)
    }

    /// CSV: quoted fields, the quote doubled (or escaped) inside them; an unquoted field equal
    /// to the NULL string (empty by default) is NULL.
    fn csv_rows(&self, text: &str, width: usize) -> Result<Vec<Vec<Option<String>>>, ServerError> {
        let delimiter = self.delimiter();
        let quote = self.quote.unwrap_or('"');
        let escape = self.escape.unwrap_or(quote);
        let null = self.null();
        let mut rows = Vec::new();
        let mut row: Vec<Option<String>> = Vec::new();
        let mut field = String::new();
        let (mut quoted, mut in_quotes, mut line) = (false, false, 1);
        let mut chars = text.chars().peekable();
        let finish_field = |row: &mut Vec<Option<String>>, field: &mut String, quoted: bool| {
            let value = std::mem::take(field);
            row.push((quoted || value != null).then_some(value));
        };
        while let Some(c) = chars.next() {
            if in_quotes {
                if c == escape && chars.peek() == Some(&quote) {
                    // An escaped quote (with the default escape, a doubled one).
                    chars.next();
                    field.push(quote);
                } else if c == quote {
                    in_quotes = false;
                } else {
                    field.push(c);
                }
                continue;
            }
            match c {
                c if c == quote => {
                    in_quotes = true;
                    quoted = true;
                }
                c if c == delimiter => {
                    finish_field(&mut row, &mut field, quoted);
                    quoted = false;
                }
                '\r' if chars.peek() == Some(&'\n') => {}
                '\n' => {
                    finish_field(&mut row, &mut field, quoted);
                    quoted = false;
                    let done = std::mem::take(&mut row);
                    let header = self.header && line == 1;
                    let end_marker = done.len() == 1 && done[0].as_deref() == Some("\\.");
                    if !header && !end_marker {
                        check_width(done.len(), width, line)?;
                        rows.push(done);
                    }
                    line += 1;
                }
                c => field.push(c),
            }
        }
        if in_quotes {
            return Err(ServerError::invalid(format!(
                "COPY line {line}: unterminated CSV quoted field"
            )));
        }
        if !field.is_empty() || quoted || !row.is_empty() {
            finish_field(&mut row, &mut field, quoted);
            if !(self.header && line == 1) {
                check_width(row.len(), width, line)?;
                rows.push(row);
            }
        }
        Ok(rows)
    }
}

fn check_width(found: usize, width: usize, line: usize) -> Result<(), ServerError> {
    match found == width {
        true => Ok(()),
        false => Err(ServerError::invalid(format!(
            "COPY line {line}: {found} fields where the table's columns copied are {width}"
        ))),
    }
}

/// A text-format field with its backslash escapes resolved.
fn unescape(field: &str) -> String {
    if !field.contains('\\') {
        return field.to_string();
    }
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('b') => out.push('\u{8}'),
            Some('f') => out.push('\u{c}'),
            Some('v') => out.push('\u{b}'),
            Some(d @ '0'..='7') => {
                let mut code = d.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match chars.peek().and_then(|c| c.to_digit(8)) {
                        Some(digit) => {
                            code = code * 8 + digit;
                            chars.next();
                        }
                        None => break,
                    }
                }
                out.extend(char::from_u32(code));
            }
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// `values` (text, None for NULL) as a column of `field`'s type.
fn typed(field: &Field, values: Vec<Option<&str>>) -> Result<ArrayRef, ServerError> {
    let column_error =
        |e: String| ServerError::invalid(format!("COPY column {}: {e}", field.name()));
    match field.data_type() {
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
            let bytes = values
                .iter()
                .map(|v| v.map(bytea).transpose())
                .collect::<Result<Vec<_>, _>>()
                .map_err(column_error)?;
            let array: ArrayRef = Arc::new(BinaryArray::from(
                bytes.iter().map(|b| b.as_deref()).collect::<Vec<_>>(),
            ));
            arrow::compute::cast(&array, field.data_type()).map_err(|e| column_error(e.to_string()))
        }
        data_type => {
            let text: ArrayRef = Arc::new(StringArray::from(values));
            let options = CastOptions {
                safe: false,
                ..Default::default()
            };
            arrow::compute::cast_with_options(&text, data_type, &options)
                .map_err(|e| column_error(e.to_string()))
        }
    }
}

/// A `bytea` in PostgreSQL's hex form (`\x0aff`), or its characters as they are.
fn bytea(text: &str) -> Result<Vec<u8>, String> {
    let Some(hex) = text.strip_prefix("\\x") else {
        return Ok(text.as_bytes().to_vec());
    };
    if hex.len() % 2 != 0 {
        return Err(format!(
            "invalid bytea {text:?}: an odd number of hex digits"
        ));
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| format!("invalid bytea {text:?}"))
        })
        .collect()
}

/// Every row of `batch`, encoded as one CopyData each.
fn encode(
    encoder: &mut CopyEncoder,
    fields: &Arc<Vec<FieldInfo>>,
    batch: &RecordBatch,
) -> PgWireResult<Vec<CopyData>> {
    let schema = batch.schema();
    let mut rows = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        for (column, array) in batch.columns().iter().enumerate() {
            arrow_pg::encoder::encode_value(
                encoder,
                array,
                row,
                schema.field(column),
                &fields[column],
            )?;
        }
        rows.push(encoder.take_copy());
    }
    Ok(rows)
}

/// A `COPY ... FROM STDIN` in progress: what the client has sent so far.
pub(crate) struct CopyIn {
    pub(crate) spec: CopySpec,
    pub(crate) session: Arc<ClientSession>,
    pub(crate) table: String,
    /// The columns copied, with their types.
    pub(crate) schema: SchemaRef,
    pub(crate) data: Vec<u8>,
    /// Why the copy failed while data arrived (reported when the client says it is done).
    pub(crate) failed: Option<ServerError>,
}

impl CopyIn {
    /// Starts a copy into `table` (its `columns`, all when empty).
    pub(crate) async fn start(
        spec: CopySpec,
        session: Arc<ClientSession>,
        table: String,
        columns: Vec<String>,
    ) -> Result<Self, ServerError> {
        let provider = session
            .sql()
            .context()
            .table_provider(table.as_str())
            .await
            .map_err(|e| ServerError::from(SqlError::from(e)))?;
        let schema = provider.schema();
        let fields: Vec<Field> = match columns.is_empty() {
            true => schema.fields().iter().map(|f| f.as_ref().clone()).collect(),
            false => columns
                .iter()
                .map(|name| {
                    (schema.field_with_name(name).cloned()).map_err(|_| {
                        ServerError::invalid(format!(
                            "column \"{name}\" of table {table} does not exist"
                        ))
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        let fields = fields.into_iter().map(|f| {
            let data_type = match f.data_type() {
                DataType::Utf8View => DataType::Utf8,
                DataType::BinaryView => DataType::Binary,
                other => other.clone(),
            };
            f.with_data_type(data_type)
        });
        Ok(Self {
            spec,
            session,
            table,
            schema: Arc::new(Schema::new(fields.collect::<Vec<_>>())),
            data: Vec::new(),
            failed: None,
        })
    }

    /// The CopyInResponse that asks the client for the data.
    pub(crate) fn response(&self) -> CopyResponse {
        CopyResponse::new(
            self.spec.wire_format(),
            self.schema.fields().len(),
            futures::stream::empty(),
        )
    }

    /// Keeps `data`, within [`MAX_COPY_BYTES`] (beyond, the copy fails when it ends).
    pub(crate) fn receive(&mut self, data: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        if self.data.len() + data.len() > MAX_COPY_BYTES {
            self.data = Vec::new();
            self.failed = Some(ServerError::TooLarge(format!(
                "COPY sent more than {MAX_COPY_BYTES} bytes; split the load into several COPYs \
                 (or use Flight SQL's bulk ingest, which streams)"
            )));
            return;
        }
        self.data.extend_from_slice(data);
    }

    /// Loads what was sent; the rows loaded.
    pub(crate) async fn finish(
        self,
        activity: &Arc<nyala_server::activity::Activity>,
    ) -> Result<u64, ServerError> {
        if let Some(failed) = self.failed {
            return Err(failed);
        }
        let batch = self.spec.parse(&self.data, &self.schema)?;
        let target = IngestTarget {
            table: self.table.clone(),
            mode: IngestMode::Append,
            primary_key: vec![],
            buckets: 1,
        };
        let tracked = activity.start_in(
            Some(self.session.id()),
            &format!("COPY {} FROM STDIN", self.table),
            &self.session.user_name(),
            "ingest",
        );
        let schema = self.schema.clone();
        let load = async {
            let batches = futures::stream::iter([Ok(batch)]);
            Ok(self.session.sql().ingest(&target, schema, batches).await?)
        };
        tracked.run(load, |rows| *rows).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(sql: &str) -> CopySpec {
        recognise(sql).unwrap().expect("a COPY")
    }

    #[test]
    fn text_and_csv_rows_are_parsed_as_postgresql_writes_them() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int32, false),
            Field::new("s", DataType::Utf8, true),
            Field::new("b", DataType::Binary, true),
        ]));
        let text = spec("COPY t FROM STDIN");
        let batch = text
            .parse(b"1\ta\\tb\t\\\\x00ff\n2\t\\N\t\\N\n\\.\n", &schema)
            .unwrap();
        assert_eq!(batch.num_rows(), 2);
        let s = batch
            .column(1)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(s.value(0), "a\tb");
        assert!(s.is_null(1));
        let b = batch
            .column(2)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap();
        assert_eq!(b.value(0), &[0, 255]);

        let csv = spec("COPY t FROM STDIN WITH (FORMAT csv, HEADER true)");
        let batch = csv
            .parse(b"k,s,b\n1,\"x, \"\"y\"\"\n z\",\n2,\"\",\n", &schema)
            .unwrap();
        let s = batch
            .column(1)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(s.value(0), "x, \"y\"\n z");
        assert_eq!(s.value(1), "");
        assert!(batch.column(2).is_null(0));
    }

    #[test]
    fn binary_is_recognised_in_both_syntaxes() {
        let binary = spec("COPY t FROM STDIN WITH (FORMAT binary)");
        assert_eq!(binary.format, Format::Binary);
        assert_eq!(binary.wire_format(), 1);
        assert_eq!(spec("COPY t TO STDOUT BINARY").format, Format::Binary);
    }

    #[test]
    fn bad_copies_are_refused_with_the_reason() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, false)]));
        let text = spec("COPY t FROM STDIN");
        let e = text.parse(b"1\t2\n", &schema).unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
        let e = text.parse(b"x\n", &schema).unwrap_err().to_string();
        assert!(e.contains("column k"), "{e}");
        // A server file: the session layer's statement, not the front end's.
        assert!(recognise("COPY t FROM '/etc/passwd'").unwrap().is_none());
        assert!(recognise("COPY t TO PROGRAM 'ls'").is_err());
        let binary = recognise("COPY t FROM STDIN WITH (FORMAT binary, DELIMITER ',')");
        assert!(binary.is_err());
        assert!(recognise("SELECT 1").unwrap().is_none());
    }
}
