//! How the shell prints results: an aligned table (default), CSV, JSON or one `column = value`
//! line per field, chosen with `\mode` or `--mode`.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use arrow::util::pretty::pretty_format_batches;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputMode {
    Table,
    Csv,
    Json,
    Line,
}

impl std::str::FromStr for OutputMode {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        <OutputMode as clap::ValueEnum>::from_str(s, true)
            .map_err(|_| anyhow::anyhow!("unknown output mode '{s}' (table, csv, json or line)"))
    }
}

/// The count of a DDL/DML result (a single `count: UInt64` column), None for query results.
fn update_count(schema: &SchemaRef, batches: &[RecordBatch]) -> Option<u64> {
    let [field] = schema.fields().iter().collect::<Vec<_>>()[..] else {
        return None;
    };
    if field.name() != "count" || field.data_type() != &DataType::UInt64 {
        return None;
    }
    Some(
        batches
            .iter()
            .find(|b| b.num_rows() > 0)
            .and_then(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<UInt64Array>()
                    .map(|a| a.value(0))
            })
            .unwrap_or(0),
    )
}

/// `batch` with its nested columns (arrays) as the text the table shows (`[a, b]`): CSV has no
/// nested values.
fn nested_as_text(batch: &RecordBatch) -> anyhow::Result<RecordBatch> {
    if !batch
        .schema()
        .fields()
        .iter()
        .any(|f| f.data_type().is_nested())
    {
        return Ok(batch.clone());
    }
    let options = FormatOptions::default();
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if !field.data_type().is_nested() {
            fields.push(field.as_ref().clone());
            columns.push(column.clone());
            continue;
        }
        let formatter = ArrayFormatter::try_new(column.as_ref(), &options)?;
        let text: StringArray = (0..column.len())
            .map(|row| {
                column
                    .is_valid(row)
                    .then(|| formatter.value(row).to_string())
            })
            .collect();
        fields.push(Field::new(field.name(), DataType::Utf8, true));
        columns.push(Arc::new(text));
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// Formats a statement result as the shell prints it.
pub fn format_result(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    mode: OutputMode,
) -> anyhow::Result<String> {
    if let Some(count) = update_count(schema, batches) {
        return Ok(format!("OK, {count} rows"));
    }
    // DDL and SET: a result without columns.
    if schema.fields().is_empty() {
        return Ok("OK".to_string());
    }
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    match mode {
        OutputMode::Table => {
            let empty = [RecordBatch::new_empty(schema.clone())];
            let table = pretty_format_batches(if batches.is_empty() { &empty } else { batches })?;
            Ok(format!(
                "{table}\n({rows} row{})",
                if rows == 1 { "" } else { "s" }
            ))
        }
        OutputMode::Csv => {
            let mut out = Vec::new();
            {
                let mut writer = arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(&mut out);
                if batches.is_empty() {
                    writer.write(&nested_as_text(&RecordBatch::new_empty(schema.clone()))?)?;
                }
                for batch in batches {
                    writer.write(&nested_as_text(batch)?)?;
                }
            }
            Ok(String::from_utf8(out)?.trim_end().to_string())
        }
        OutputMode::Json => {
            let mut writer = arrow::json::ArrayWriter::new(Vec::new());
            for batch in batches {
                writer.write(batch)?;
            }
            writer.finish()?;
            let out = String::from_utf8(writer.into_inner())?;
            Ok(if out.is_empty() {
                "[]".to_string()
            } else {
                out
            })
        }
        OutputMode::Line => {
            let width = schema
                .fields()
                .iter()
                .map(|f| f.name().len())
                .max()
                .unwrap_or(0);
            let options = FormatOptions::default().with_null("NULL");
            let mut records = Vec::new();
            for batch in batches {
                let formatters = batch
                    .columns()
                    .iter()
                    .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
                    .collect::<Result<Vec<_>, _>>()?;
                for row in 0..batch.num_rows() {
                    let lines: Vec<String> = schema
                        .fields()
                        .iter()
                        .zip(&formatters)
                        .map(|(f, fmt)| format!("{:>width$} = {}", f.name(), fmt.value(row)))
                        .collect();
                    records.push(lines.join("\n"));
                }
            }
            Ok(records.join("\n\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::Int64Array;

    use super::*;

    fn sample() -> (SchemaRef, Vec<RecordBatch>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("a,b"), None])),
            ],
        )
        .unwrap();
        (schema, vec![batch])
    }

    #[test]
    fn every_mode() {
        let (schema, batches) = sample();
        assert_eq!(
            format_result(&schema, &batches, OutputMode::Csv).unwrap(),
            "id,name\n1,\"a,b\"\n2,"
        );
        assert_eq!(
            format_result(&schema, &batches, OutputMode::Json).unwrap(),
            r#"[{"id":1,"name":"a,b"},{"id":2}]"#
        );
        assert_eq!(
            format_result(&schema, &batches, OutputMode::Line).unwrap(),
            "  id = 1\nname = a,b\n\n  id = 2\nname = NULL"
        );
        let table = format_result(&schema, &batches, OutputMode::Table).unwrap();
        assert!(
            table.contains("| a,b  |") && table.ends_with("(2 rows)"),
            "{table}"
        );
    }

    #[test]
    fn counts_print_as_ok() {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "count",
            DataType::UInt64,
            false,
        )]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(UInt64Array::from(vec![3]))])
                .unwrap();
        assert_eq!(
            format_result(&schema, &[batch], OutputMode::Json).unwrap(),
            "OK, 3 rows"
        );
    }
}
