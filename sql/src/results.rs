//! The shapes of results. Every statement answers with an Arrow stream whose schema is known
//! before it runs, so a client can treat all statements alike: queries stream their rows, DML
//! answers one row with a `count` column (rows affected), DDL and SET no columns and no rows,
//! and the statements answered from the catalog (SHOW, DESCRIBE) string columns.

use std::sync::Arc;

use arrow::array::RecordBatchOptions;
use arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema as ArrowSchema, SchemaRef};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use crate::Result;

/// The schema of a DML result: the rows affected.
pub(crate) fn count_schema() -> SchemaRef {
    Arc::new(ArrowSchema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]))
}

pub(crate) fn count_batch(count: u64) -> RecordBatch {
    RecordBatch::try_new(
        count_schema(),
        vec![Arc::new(UInt64Array::from(vec![count])) as ArrayRef],
    )
    .unwrap_or_else(|_| RecordBatch::new_empty(count_schema()))
}

/// The schema of a result without columns (DDL and SET).
pub(crate) fn empty_schema() -> SchemaRef {
    Arc::new(ArrowSchema::empty())
}

/// The result of DDL and SET: no columns, no rows.
pub(crate) fn no_rows() -> Result<SendableRecordBatchStream> {
    Ok(Box::pin(MemoryStream::try_new(
        vec![],
        empty_schema(),
        None,
    )?))
}

/// Batches computed already, as a stream (a DML count without batches: the count schema).
pub(crate) fn one_stream(batches: Vec<RecordBatch>) -> Result<SendableRecordBatchStream> {
    let schema = batches
        .first()
        .map(|b| b.schema())
        .unwrap_or_else(count_schema);
    stream_of(schema, batches)
}

/// Batches of `schema` computed already (perhaps none), as a stream.
pub(crate) fn stream_of(
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<SendableRecordBatchStream> {
    Ok(Box::pin(MemoryStream::try_new(batches, schema, None)?))
}

/// A batch of non-null string columns, by name.
pub(crate) fn string_batch(columns: Vec<(&str, Vec<String>)>) -> Result<RecordBatch> {
    let schema = Arc::new(ArrowSchema::new(
        columns
            .iter()
            .map(|(name, _)| Field::new(*name, DataType::Utf8, false))
            .collect::<Vec<_>>(),
    ));
    let arrays = columns
        .into_iter()
        .map(|(_, values)| Arc::new(StringArray::from(values)) as ArrayRef)
        .collect();
    Ok(RecordBatch::try_new(schema, arrays)?)
}

/// The type clients are given for `data_type`: the query engine reads strings as `Utf8View`
/// (tables' scans return them so), and not every Flight SQL client reads view types (the JDBC
/// driver does not), so results carry them as `Utf8` (and `BinaryView` as `Binary`).
pub(crate) fn client_type(data_type: &DataType) -> DataType {
    let field = |f: &FieldRef| -> FieldRef {
        Arc::new(
            f.as_ref()
                .clone()
                .with_data_type(client_type(f.data_type())),
        )
    };
    match data_type {
        DataType::Utf8View => DataType::Utf8,
        DataType::BinaryView => DataType::Binary,
        DataType::List(f) => DataType::List(field(f)),
        DataType::LargeList(f) => DataType::LargeList(field(f)),
        DataType::FixedSizeList(f, n) => DataType::FixedSizeList(field(f), *n),
        DataType::Struct(fields) => DataType::Struct(fields.iter().map(field).collect::<Fields>()),
        DataType::Map(f, sorted) => DataType::Map(field(f), *sorted),
        other => other.clone(),
    }
}

/// `schema` as clients are given it (see [`client_type`]).
pub(crate) fn client_schema(schema: &SchemaRef) -> SchemaRef {
    let changed = |f: &FieldRef| client_type(f.data_type()) != *f.data_type();
    if !schema.fields().iter().any(changed) {
        return schema.clone();
    }
    let fields = schema.fields().iter().map(|f| {
        Arc::new(
            f.as_ref()
                .clone()
                .with_data_type(client_type(f.data_type())),
        )
    });
    Arc::new(ArrowSchema::new_with_metadata(
        fields.collect::<Fields>(),
        schema.metadata().clone(),
    ))
}

/// `batch` with the types of `schema` (same columns; types that cast).
pub(crate) fn cast_to(batch: RecordBatch, schema: &SchemaRef) -> arrow::error::Result<RecordBatch> {
    let columns = (batch.columns().iter().zip(schema.fields()))
        .map(
            |(column, field)| match column.data_type() == field.data_type() {
                true => Ok(column.clone()),
                false => arrow::compute::cast(column, field.data_type()),
            },
        )
        .collect::<arrow::error::Result<Vec<_>>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(schema.clone(), columns, &options)
}

/// `stream` as clients are given it (see [`client_type`]).
pub(crate) fn client_stream(stream: SendableRecordBatchStream) -> SendableRecordBatchStream {
    let schema = client_schema(&stream.schema());
    if Arc::ptr_eq(&schema, &stream.schema()) {
        return stream;
    }
    let target = schema.clone();
    Box::pin(RecordBatchStreamAdapter::new(
        schema,
        stream.map(move |batch| Ok(cast_to(batch?, &target)?)),
    ))
}
