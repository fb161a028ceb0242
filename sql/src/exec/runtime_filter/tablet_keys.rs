//! A join filter's listed keys narrowed to the tablet a scan reads: a key can only be in the
//! tablet the table's partitioning puts it in, so each tablet looks up its own keys in its
//! key indexes instead of every one (20 tablets and 2,000 keys: 2,000 lookups, not 40,000).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray};
use arrow::datatypes::{Field, Schema as ArrowSchema};
use arrow::record_batch::RecordBatch;
use nyala_engine::TableInfo;
use nyala_storage::{PredicateOp, ScanSpec};

/// `spec` with each join filter on the table's first key column that lists its keys narrowed
/// to those of tablet `tablet`; a filter whose keys cannot be placed (partitioned by other
/// columns too, a key outside every range) stays whole.
pub(crate) fn narrowed_to_tablet(table: &TableInfo, tablet: usize, mut spec: ScanSpec) -> ScanSpec {
    if table.tablets.len() < 2 {
        return spec;
    }
    let first = table.schema.key_columns()[0];
    for predicate in spec.predicates.iter_mut().filter(|p| p.column == first) {
        let PredicateOp::JoinFilter { filter, .. } = &mut predicate.op else {
            continue;
        };
        let Some(keep) = (filter.listed()).and_then(|keys| in_tablet(table, tablet, keys)) else {
            continue;
        };
        if let Ok(Some(narrowed)) = filter.narrowed(&keep) {
            *filter = Arc::new(narrowed);
        }
    }
    spec
}

/// Whether each of `keys` (values of the first key column) belongs in tablet `tablet` (NULL:
/// yes, for a filter NULL passes); None if the partitioning cannot tell from them alone.
fn in_tablet(table: &TableInfo, tablet: usize, keys: &[ArrayRef]) -> Option<BooleanArray> {
    let column = &table.schema.columns()[table.schema.key_columns()[0]];
    // As the column's own type: the partitioning hashes values as rows are written (a join's
    // string keys may come as views, which encode otherwise).
    let data_type = column.column_type.arrow_type();
    let field = Field::new(&column.name, data_type.clone(), true);
    let schema = Arc::new(ArrowSchema::new(vec![field]));
    let mut flags = Vec::with_capacity(keys.iter().map(|k| k.len()).sum());
    for array in keys {
        let values = arrow::compute::cast(array, &data_type).ok()?;
        let batch = RecordBatch::try_new(schema.clone(), vec![values]).ok()?;
        let tablets = table.partition.tablets(&table.schema, &batch).ok()?;
        flags.extend((tablets.iter().enumerate()).map(|(i, &t)| t == tablet || array.is_null(i)));
    }
    Some(BooleanArray::from(flags))
}
