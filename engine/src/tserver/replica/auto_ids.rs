//! The auto_incrementing_id of a table with a NON UNIQUE PRIMARY KEY: the leader gives each
//! inserted row the next id, in log order, before the write is logged, so every replica applies
//! the same ids. Clients leave the column out (or NULL).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use nyala_storage::AUTO_INCREMENT_COLUMN;

use crate::{EngineError, Result};

/// `rows` with auto_incrementing_id `first`, `first + 1`, ... (replacing the column's NULLs).
pub(super) fn with_auto_ids(rows: &RecordBatch, first: i64, n: i64) -> Result<RecordBatch> {
    let mut fields: Vec<Field> = Vec::with_capacity(rows.num_columns() + 1);
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(rows.num_columns() + 1);
    for (field, column) in rows.schema().fields().iter().zip(rows.columns()) {
        if field.name() == AUTO_INCREMENT_COLUMN {
            if column.null_count() != column.len() {
                return Err(EngineError::Unsupported(format!(
                    "{AUTO_INCREMENT_COLUMN} is assigned by the database; leave it out of INSERT"
                )));
            }
            continue;
        }
        fields.push(field.as_ref().clone());
        columns.push(column.clone());
    }
    fields.push(Field::new(AUTO_INCREMENT_COLUMN, DataType::Int64, false));
    columns.push(Arc::new(Int64Array::from_iter_values(first..first + n)));
    Ok(RecordBatch::try_new(
        Arc::new(ArrowSchema::new(fields)),
        columns,
    )?)
}
