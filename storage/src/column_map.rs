//! Files written under an older schema, read as the table's columns are now.
//!
//! A schema change does not rewrite files (Kudu's AlterSchema): each file keeps the columns it
//! was written with, named by column id, and a read maps them onto the table's current columns
//! ([`ColumnMap`]). A column added since reads as its DEFAULT (or NULL) in every row, a dropped
//! one is never read, a renamed one is found by its id. Rewrites (compactions) write the current
//! columns, so old layouts fade as files are rewritten.

use std::sync::Arc;

use arrow::array::{new_null_array, Array, ArrayRef, RecordBatch, StringArray, UInt32Array};
use arrow::compute::{cast, take};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};

use crate::scan::{predicate_mask, ColumnPredicate};
use crate::{ColumnSchema, Schema, StorageError};

/// How the columns of a file (its "written" columns, in file order) map onto the table's.
#[derive(Debug)]
pub(crate) struct ColumnMap {
    /// The table's schema the map is for.
    table: Arc<Schema>,
    /// For each table column: its position among the file's columns, if the file holds it.
    sources: Vec<Option<usize>>,
    /// For each of the file's columns: the table column it is, if not dropped.
    targets: Vec<Option<usize>>,
    /// The file's names of its columns (for rowsets; delta files are read by position).
    names: Vec<String>,
}

impl ColumnMap {
    /// The map of a file holding the columns with ids `ids` under the names `names` onto
    /// `table`; None when the file holds exactly the table's columns under their names.
    pub(crate) fn new(ids: &[u32], names: &[&str], table: &Arc<Schema>) -> Option<Arc<ColumnMap>> {
        let same_names =
            (table.columns().iter().map(|c| c.name.as_str())).eq(names.iter().copied());
        match same_names && ids == table.ids().as_slice() {
            true => None,
            false => Some(Self::build(
                ids,
                names.iter().map(|n| n.to_string()).collect(),
                table,
            )),
        }
    }

    /// The map of a delta file holding the columns with ids `ids` onto `table` (its columns
    /// are read by position, whatever their names); None when they are the table's.
    pub(crate) fn by_ids(ids: &[u32], table: &Arc<Schema>) -> Option<Arc<ColumnMap>> {
        match ids == table.ids().as_slice() {
            true => None,
            false => Some(Self::build(ids, Vec::new(), table)),
        }
    }

    fn build(ids: &[u32], names: Vec<String>, table: &Arc<Schema>) -> Arc<ColumnMap> {
        let table_ids = table.ids();
        let sources = table_ids
            .iter()
            .map(|id| ids.iter().position(|i| i == id))
            .collect();
        let targets = ids
            .iter()
            .map(|id| table_ids.iter().position(|i| i == id))
            .collect();
        Arc::new(ColumnMap {
            table: table.clone(),
            sources,
            targets,
            names,
        })
    }

    /// How many columns the file holds.
    pub(crate) fn file_width(&self) -> usize {
        self.targets.len()
    }

    pub(crate) fn table(&self) -> &Arc<Schema> {
        &self.table
    }

    /// The file's position of table column `c`, if the file holds it.
    pub(crate) fn source(&self, c: usize) -> Option<usize> {
        self.sources.get(c).copied().flatten()
    }

    /// The table column at the file's position `o`, if it was not dropped.
    pub(crate) fn target(&self, o: usize) -> Option<usize> {
        self.targets.get(o).copied().flatten()
    }

    /// The file's positions of those of the table columns `columns` it holds, in order.
    pub(crate) fn file_columns(&self, columns: &[usize]) -> Vec<usize> {
        columns.iter().filter_map(|&c| self.source(c)).collect()
    }

    /// `predicates` on table columns as predicates on the file's columns; None if a predicate
    /// on a column the file does not hold excludes its DEFAULT, so that no row of the file
    /// passes (a predicate its DEFAULT passes is left out).
    pub(crate) fn file_predicates(
        &self,
        predicates: &[ColumnPredicate],
    ) -> Result<Option<Vec<ColumnPredicate>>, StorageError> {
        let mut out = Vec::with_capacity(predicates.len());
        for p in predicates {
            match self.source(p.column) {
                Some(o) => out.push(ColumnPredicate {
                    column: o,
                    op: p.op.clone(),
                }),
                None => {
                    let field = self.table.arrow_schema().field(p.column).clone();
                    let column = default_column(&self.table.columns()[p.column], 1)?;
                    let one = RecordBatch::try_new(
                        Arc::new(ArrowSchema::new(vec![field.with_nullable(true)])),
                        vec![column],
                    )?;
                    let mask = predicate_mask(&self.table, std::slice::from_ref(p), &one)?;
                    if !(mask.is_valid(0) && mask.value(0)) {
                        return Ok(None);
                    }
                }
            }
        }
        Ok(Some(out))
    }

    /// `batch`, the file's columns [`Self::file_columns`]`(columns)` of some rows (under the
    /// file's names, in any order), as the table columns `columns`: in that order, under their
    /// current names, with columns the file does not hold filled with their DEFAULT. A read
    /// string column keeps the type it was read as (`Utf8View`); a filled one is `Utf8View`
    /// if `views`.
    pub(crate) fn to_table(
        &self,
        batch: &RecordBatch,
        columns: &[usize],
        views: bool,
    ) -> Result<RecordBatch, StorageError> {
        let table = self.table.arrow_schema();
        let schema = batch.schema();
        let mut fields = Vec::with_capacity(columns.len());
        let mut arrays = Vec::with_capacity(columns.len());
        for &c in columns {
            let wanted = table.field(c);
            let (array, field) = match self.source(c) {
                Some(o) => {
                    let name = &self.names[o];
                    let i = schema.index_of(name).map_err(|_| {
                        StorageError::Corruption(format!("a file's rows lack column '{name}'"))
                    })?;
                    let field = schema.field(i).clone().with_name(wanted.name());
                    (
                        batch.column(i).clone(),
                        field.with_metadata(wanted.metadata().clone()),
                    )
                }
                None => {
                    let mut array = default_column(&self.table.columns()[c], batch.num_rows())?;
                    let mut field = wanted.clone().with_nullable(true);
                    if views && array.data_type() == &DataType::Utf8 {
                        array = cast(&array, &DataType::Utf8View)?;
                        field = field.with_data_type(DataType::Utf8View);
                    }
                    (array, field)
                }
            };
            fields.push(field);
            arrays.push(array);
        }
        Ok(RecordBatch::try_new_with_options(
            Arc::new(ArrowSchema::new(fields)),
            arrays,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )?)
    }
}

/// The columns a file written under an older schema holds: the table's column of each id it
/// names (under the file's name for it, `fields`, as its footer says), or for a column dropped
/// since, one of the footer's type. Keyed as the table is.
pub(crate) fn written_schema(
    table: &Schema,
    ids: &[u32],
    fields: &[&Field],
) -> Result<Schema, StorageError> {
    let bad = |what: &str| StorageError::Corruption(format!("a file's columns: {what}"));
    if ids.len() != fields.len() {
        return Err(bad("more ids than columns"));
    }
    let table_ids = table.ids();
    let columns = (ids.iter().zip(fields))
        .map(|(id, field)| match table_ids.iter().position(|i| i == id) {
            Some(c) => Ok(ColumnSchema {
                name: field.name().clone(),
                ..table.columns()[c].clone()
            }),
            None => {
                let column_type = crate::ColumnType::from_arrow(field.data_type())
                    .ok_or_else(|| bad("a type no column has"))?;
                Ok(ColumnSchema::new(field.name(), column_type, true))
            }
        })
        .collect::<Result<Vec<_>, StorageError>>()?;
    table.with_columns(columns, ids.to_vec())
}

/// `n` copies of `column`'s DEFAULT, or NULLs without one.
pub(crate) fn default_column(column: &ColumnSchema, n: usize) -> Result<ArrayRef, StorageError> {
    let data_type = column.column_type.arrow_type();
    let Some(text) = &column.default else {
        return Ok(new_null_array(&data_type, n));
    };
    let one = cast(&StringArray::from(vec![text.as_str()]), &data_type)?;
    if one.is_null(0) {
        return Err(StorageError::InvalidSchema(format!(
            "DEFAULT '{text}' of column '{}' is not a {}",
            column.name,
            column.column_type.sql_name()
        )));
    }
    Ok(take(&one, &UInt32Array::from(vec![0u32; n]), None)?)
}
