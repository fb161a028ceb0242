//! The shapes of results. Every statement answers with an Arrow stream whose schema is known
//! before it runs, so a client can treat all statements alike: queries stream their rows, DML
//! answers one row with a `count` column (rows affected), DDL and SET no columns and no rows,
//! and the statements answered from the catalog (SHOW, DESCRIBE) string columns.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::memory::MemoryStream;

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
