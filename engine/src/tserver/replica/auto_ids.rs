//! The auto_incrementing_id of a table with a NON UNIQUE PRIMARY KEY: the leader gives each
//! inserted row the next id, in log order, before the write is logged, so every replica applies
//! the same ids. Clients leave the column out (or NULL).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use nyala_storage::AUTO_INCREMENT_COLUMN;

use crate::{EngineError, Result};

/// `rows` with auto_incrementing_id `first`, `first + step`, ... (replacing the column's NULLs).
pub(super) fn with_auto_ids(
    rows: &RecordBatch,
    first: i64,
    n: i64,
    step: i64,
) -> Result<RecordBatch> {
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
    columns.push(Arc::new(Int64Array::from_iter_values(
        (0..n).map(|i| first + i * step),
    )));
    Ok(RecordBatch::try_new(
        Arc::new(ArrowSchema::new(fields)),
        columns,
    )?)
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, StringArray};
    use arrow::datatypes::Int64Type;

    use super::*;

    fn rows(ids: Option<Vec<Option<i64>>>) -> RecordBatch {
        let mut fields = vec![Field::new("name", DataType::Utf8, false)];
        let mut columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from(vec!["a", "b", "c"]))];
        if let Some(ids) = ids {
            fields.insert(0, Field::new(AUTO_INCREMENT_COLUMN, DataType::Int64, true));
            columns.insert(0, Arc::new(Int64Array::from(ids)));
        }
        RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns).unwrap()
    }

    /// Rows get consecutive ids from `first` in the last column, whether the client left the
    /// column out or sent it NULL.
    #[test]
    fn inserted_rows_get_consecutive_ids() {
        for given in [None, Some(vec![None, None, None])] {
            let with_ids = with_auto_ids(&rows(given), 40, 3, 1).unwrap();
            let schema = with_ids.schema();
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            assert_eq!(names, ["name", AUTO_INCREMENT_COLUMN]);
            let ids = with_ids.column(1).as_primitive::<Int64Type>();
            assert_eq!(ids.values().as_ref(), [40, 41, 42]);
            assert_eq!(with_ids.column(0).as_string::<i32>().value(2), "c");
        }
    }

    #[test]
    fn an_id_given_by_the_client_is_refused() {
        let given = rows(Some(vec![None, Some(7), None]));
        assert!(matches!(
            with_auto_ids(&given, 0, 3, 1),
            Err(EngineError::Unsupported(_))
        ));
    }
}
