//! What a scan asks for: the [`ScanSpec`] and its column predicates, how rows are tested
//! against them ([`predicate_mask`]), and what they say about keys — the range of encoded keys
//! a scan can only return, or the few keys it looks up one by one. Rowset readers, the
//! MemRowSet and the wire encoding share this vocabulary; the tablet's scan
//! (`tablet/scan.rs`) puts the sources together and runs it.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, BooleanBufferBuilder, RecordBatch};
use arrow::buffer::BooleanBuffer;
use arrow::compute::kernels::{boolean, cmp};
use arrow::compute::{is_not_null, is_null};
use arrow::datatypes::DataType;

use crate::bloom::JoinFilter;
use crate::{Scalar, Schema, StorageError, Timestamp};

#[derive(Clone, Debug)]
pub enum PredicateOp {
    Eq(Scalar),
    Lt(Scalar),
    LtEq(Scalar),
    Gt(Scalar),
    GtEq(Scalar),
    InList(Vec<Scalar>),
    IsNull,
    IsNotNull,
    /// A runtime filter: the value may be one of a join's build keys. `check_bounds: false`
    /// where statistics already prove every row within the filter's bounds.
    JoinFilter {
        filter: Arc<JoinFilter>,
        check_bounds: bool,
    },
}

impl PredicateOp {
    pub fn join_filter(filter: Arc<JoinFilter>) -> Self {
        PredicateOp::JoinFilter {
            filter,
            check_bounds: true,
        }
    }

    pub(crate) fn is_join_filter(&self) -> bool {
        matches!(self, PredicateOp::JoinFilter { .. })
    }
}

#[derive(Clone, Debug)]
pub struct ColumnPredicate {
    pub column: usize,
    pub op: PredicateOp,
}

/// What a scan reads ([`Tablet::scan`](crate::Tablet::scan)): the rows visible at `snapshot`
/// that pass every predicate (ANDed), with the `projection` columns, at most `limit` rows, in
/// batches of about `batch_size` rows. Predicates pinning every key column to a few values
/// make it a lookup of those keys.
///
/// ```no_run
/// # use nyala_storage::*;
/// # fn sketch(tablet: &Tablet, key: Scalar, snapshot: Timestamp) -> Result<(), StorageError> {
/// let spec = ScanSpec {
///     projection: Some(vec![0, 2]), // table columns, in output order
///     predicates: vec![ColumnPredicate { column: 0, op: PredicateOp::Eq(key) }],
///     snapshot, limit: None, batch_size: 1024, string_views: false, changes_since: None,
/// };
/// for batch in tablet.scan(&spec)? { let _columns_0_and_2 = batch?; }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ScanSpec {
    /// Table column indexes to return, in this order; None = all columns.
    pub projection: Option<Vec<usize>>,
    pub predicates: Vec<ColumnPredicate>,
    pub snapshot: Timestamp,
    pub limit: Option<usize>,
    pub batch_size: usize,
    /// Return string columns as `Utf8View` (the query engine's string type, which rowsets
    /// decode into without copying values) instead of `Utf8`. Not sent to other servers: a
    /// remote scan returns `Utf8`.
    pub string_views: bool,
    /// Makes the scan a diff scan (Kudu's): instead of the rows visible at `snapshot`, the rows
    /// whose keys changed after this time and up to the snapshot, each as it is at the
    /// snapshot (a deleted one as it was at this time), followed by two columns, the change
    /// and its time ([`CHANGE_COLUMN`](crate::CHANGE_COLUMN),
    /// [`COMMIT_TIME_COLUMN`](crate::COMMIT_TIME_COLUMN), microseconds). A tablet server
    /// reads a diff scan to the end of its snapshot's microsecond, so that a consumer who goes
    /// on from the last commit time it received misses nothing and sees nothing twice.
    pub changes_since: Option<Timestamp>,
}

pub type ScanIterator = Box<dyn Iterator<Item = Result<RecordBatch, StorageError>> + Send>;

/// Which rows of `batch` (holding at least the predicate columns, by name) pass `predicates`.
/// Join filters run last, on the rows the other predicates left, so their statistics count
/// only the rows they decide.
pub fn predicate_mask(
    schema: &Schema,
    predicates: &[ColumnPredicate],
    batch: &RecordBatch,
) -> Result<BooleanArray, StorageError> {
    let mut mask = BooleanArray::new(BooleanBuffer::new_set(batch.num_rows()), None);
    let ordered = predicates
        .iter()
        .filter(|p| !p.op.is_join_filter())
        .chain(predicates.iter().filter(|p| p.op.is_join_filter()));
    for p in ordered {
        let name = &schema.columns()[p.column].name;
        let column = batch
            .column_by_name(name)
            .ok_or_else(|| StorageError::InvalidPredicate(format!("column '{name}' not read")))?;
        let on_column = |e: arrow::error::ArrowError| {
            StorageError::InvalidPredicate(format!("on column '{name}': {e}"))
        };
        mask = match &p.op {
            PredicateOp::JoinFilter {
                filter,
                check_bounds,
            } => {
                // NULL (unknown) from an earlier predicate means the row is out.
                if let Some(nulls) = mask.nulls() {
                    mask = BooleanArray::new(mask.values() & nulls.inner(), None);
                }
                let live = mask.true_count();
                if live == mask.len() {
                    filter.evaluate(column.as_ref(), *check_bounds)?
                } else if live == 0 {
                    return Ok(mask);
                } else {
                    // Check only the rows still live, then spread the answers back.
                    let rows = arrow::compute::filter(column, &mask).map_err(on_column)?;
                    let checked = filter.evaluate(rows.as_ref(), *check_bounds)?;
                    let mut out = BooleanBufferBuilder::new(mask.len());
                    out.append_n(mask.len(), false);
                    for (j, i) in mask.values().set_indices().enumerate() {
                        if checked.value(j) {
                            out.set_bit(i, true);
                        }
                    }
                    BooleanArray::new(out.finish(), None)
                }
            }
            op => boolean::and(&mask, &evaluate(column, op).map_err(on_column)?)?,
        };
    }
    Ok(mask)
}

fn evaluate(column: &ArrayRef, op: &PredicateOp) -> Result<BooleanArray, arrow::error::ArrowError> {
    let s = |v: &Scalar| v.datum_of(column.data_type());
    Ok(match op {
        PredicateOp::Eq(v) => cmp::eq(column, &s(v)?)?,
        PredicateOp::Lt(v) => cmp::lt(column, &s(v)?)?,
        PredicateOp::LtEq(v) => cmp::lt_eq(column, &s(v)?)?,
        PredicateOp::Gt(v) => cmp::gt(column, &s(v)?)?,
        PredicateOp::GtEq(v) => cmp::gt_eq(column, &s(v)?)?,
        PredicateOp::InList(values) => {
            let mut acc = BooleanArray::from(vec![false; column.len()]);
            for v in values {
                acc = boolean::or_kleene(&acc, &cmp::eq(column, &s(v)?)?)?;
            }
            acc
        }
        PredicateOp::IsNull => is_null(column.as_ref())?,
        PredicateOp::IsNotNull => is_not_null(column.as_ref())?,
        PredicateOp::JoinFilter { .. } => {
            return Err(arrow::error::ArrowError::InvalidArgumentError(
                "join filters are evaluated by predicate_mask".into(),
            ))
        }
    })
}

/// Most keys a scan looks up one by one instead of reading the rowsets.
const MAX_POINT_KEYS: usize = 256;

/// A join filter on the first key column that lists at most one key per this many rows of a
/// rowset (or of the MemRowSet) has its keys looked up there instead of every row read.
pub(crate) const ROWS_PER_LISTED_KEY: usize = 16;

/// The keys a join filter on the first key column lists ([`JoinFilter::encoded_keys`]):
/// whole keys (`whole`: a one-column key), or the prefixes of keys whose first column has a
/// fixed-width encoding.
pub(crate) struct ListedKeys<'a> {
    pub keys: &'a [Vec<u8>],
    pub whole: bool,
}

impl ListedKeys<'_> {
    /// Each listed prefix as the range of the keys that start with it.
    pub(crate) fn prefix_ranges(&self) -> impl Iterator<Item = KeyRange> + '_ {
        self.keys.iter().map(|prefix| KeyRange {
            lower: prefix.clone(),
            upper: successor(prefix),
        })
    }
}

/// The keys the join filters of `predicates` list for the first key column, if any.
pub(crate) fn listed_keys<'a>(
    schema: &Schema,
    predicates: &'a [ColumnPredicate],
) -> Option<ListedKeys<'a>> {
    let first = schema.key_columns()[0];
    let whole = schema.key_columns().len() == 1;
    let column_type = schema.columns()[first].column_type.arrow_type();
    if !whole && !fixed_width(&column_type) {
        return None;
    }
    let keys = predicates
        .iter()
        .filter(|p| p.column == first)
        .find_map(|p| match &p.op {
            // Keys of another type would encode differently (the SQL layer never builds such
            // a filter; evaluating one is an error).
            PredicateOp::JoinFilter { filter, .. } if filter.has_values_of(&column_type) => {
                filter.encoded_keys()
            }
            _ => None,
        })?;
    Some(ListedKeys { keys, whole })
}

/// Whether values of `data_type` have a fixed-width key encoding, so that a larger value's
/// key is larger whatever key columns follow it.
pub(crate) fn fixed_width(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Date32
            | DataType::Timestamp(..)
            | DataType::Decimal128(..)
    )
}

/// Every combination of the values that `=` and IN-list predicates allow for `columns`: one
/// array per column, row `i` of them being combination `i`. None when a column has no such
/// predicate, a value is not of the column's type, or there are more than `max` combinations.
pub fn equality_combinations(
    schema: &Schema,
    columns: &[usize],
    predicates: &[ColumnPredicate],
    max: usize,
) -> Option<Vec<ArrayRef>> {
    let mut choices: Vec<&[Scalar]> = Vec::with_capacity(columns.len());
    for &c in columns {
        let values = predicates
            .iter()
            .filter(|p| p.column == c)
            .find_map(|p| match &p.op {
                PredicateOp::Eq(v) => Some(std::slice::from_ref(v)),
                PredicateOp::InList(values) => Some(values.as_slice()),
                _ => None,
            })?;
        if !values.iter().all(|v| fits(schema, c, v)) {
            return None;
        }
        choices.push(values);
    }
    let combinations = choices.iter().map(|c| c.len()).product::<usize>();
    if combinations > max {
        return None;
    }
    // Column j of combination i takes choice (i / stride_j) % len_j.
    let mut arrays = Vec::with_capacity(choices.len());
    let mut stride = 1;
    for (values, &c) in choices.iter().zip(columns) {
        let picked: Vec<&dyn Array> = (0..combinations)
            .map(|i| values[(i / stride) % values.len()].0.as_ref())
            .collect();
        let array = match picked.is_empty() {
            true => arrow::array::new_empty_array(&schema.columns()[c].column_type.arrow_type()),
            false => arrow::compute::concat(&picked).ok()?,
        };
        arrays.push(array);
        stride *= values.len().max(1);
    }
    Some(arrays)
}

/// Whether `value` is one non-null value of column `c`'s type.
fn fits(schema: &Schema, c: usize, value: &Scalar) -> bool {
    let arrow_type = schema.columns()[c].column_type.arrow_type();
    value.0.data_type() == &arrow_type && value.0.len() == 1 && value.0.is_valid(0)
}

/// Encoded keys from `lower` on and below `upper` (None: to the end).
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct KeyRange {
    pub lower: Vec<u8>,
    pub upper: Option<Vec<u8>>,
}

/// The range of encoded keys a scan can only return, when its predicates give the leading key
/// columns one value each (`=`): the keys that start with their encoding, and from the lower
/// bound of the next key column on if that is an integer (`queue = 'u1' AND pos > 41`, a
/// queue's tail). The whole range of keys otherwise. The predicates still filter the rows.
pub(crate) fn key_range(schema: &Schema, predicates: &[ColumnPredicate]) -> KeyRange {
    let on = |c: usize| predicates.iter().filter(move |p| p.column == c);
    let keys = schema.key_columns();
    let mut values = Vec::new();
    for &c in keys {
        let eq = on(c).find_map(|p| match &p.op {
            PredicateOp::Eq(v) if fits(schema, c, v) => Some(v.0.clone()),
            _ => None,
        });
        match eq {
            Some(v) => values.push(v),
            None => break,
        }
    }
    if values.is_empty() {
        return KeyRange::default();
    }
    let mut lower = Vec::new();
    crate::key::encode_key_prefix(&values, 0, values.len() == keys.len(), &mut lower);
    let upper = successor(&lower);
    if let Some(&c) = keys.get(values.len()) {
        let fixed_width = fixed_width(&schema.columns()[c].column_type.arrow_type());
        let bound = on(c).find_map(|p| match &p.op {
            PredicateOp::Gt(v) | PredicateOp::GtEq(v) if fixed_width && fits(schema, c, v) => {
                Some(v.0.clone())
            }
            _ => None,
        });
        if let Some(bound) = bound {
            crate::key::encode_key_prefix(&[bound], 0, false, &mut lower);
        }
    }
    KeyRange { lower, upper }
}

/// The smallest byte string above every string that starts with `prefix`; None if there is
/// none (all bytes 0xFF).
fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut next = prefix.to_vec();
    while let Some(last) = next.pop() {
        if last < u8::MAX {
            next.push(last + 1);
            return Some(next);
        }
    }
    None
}

/// The encoded keys a scan can only return, when its predicates give every key column one value
/// (`=`) or a short IN list; None otherwise.
pub(crate) fn point_keys(schema: &Schema, predicates: &[ColumnPredicate]) -> Option<Vec<Vec<u8>>> {
    let columns = equality_combinations(schema, schema.key_columns(), predicates, MAX_POINT_KEYS)?;
    let rows = columns.first().map_or(0, |c| c.len());
    let mut keys: Vec<Vec<u8>> = (0..rows)
        .map(|row| {
            let mut key = Vec::new();
            crate::key::encode_key_columns(&columns, row, &mut key);
            key
        })
        .collect();
    keys.sort_unstable();
    keys.dedup();
    Some(keys)
}
