//! Scan specifications as bytes, for scans that another server runs: a JSON description with
//! each predicate value as a one-row Arrow IPC stream.
//!
//! A join filter travels as its bounds only (two range predicates, or nothing without bounds):
//! join filters only ever drop rows the join would drop anyway, so a weaker filter changes no
//! result. Shipping the bloom filter itself is left for later.

use std::io::Cursor;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Field, Schema as ArrowSchema};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use serde::{Deserialize, Serialize};

use crate::scan::{ColumnPredicate, PredicateOp, ScanSpec};
use crate::{Scalar, StorageError, Timestamp};

#[derive(Serialize, Deserialize)]
struct WireSpec {
    projection: Option<Vec<usize>>,
    predicates: Vec<WirePredicate>,
    snapshot: u64,
    limit: Option<usize>,
    batch_size: usize,
    /// [`ScanSpec::changes_since`] (absent from older servers' requests).
    #[serde(default)]
    changes_since: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct WirePredicate {
    column: usize,
    op: String,
    /// One-row Arrow IPC streams.
    values: Vec<Vec<u8>>,
}

fn encode_scalar(scalar: &Scalar) -> Result<Vec<u8>, StorageError> {
    let field = Field::new("v", scalar.0.data_type().clone(), true);
    let batch = RecordBatch::try_new(
        Arc::new(ArrowSchema::new(vec![field])),
        vec![scalar.0.clone()],
    )?;
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, &batch.schema())?;
    writer.write(&batch)?;
    writer.finish()?;
    drop(writer);
    Ok(out)
}

fn decode_scalar(bytes: &[u8]) -> Result<Scalar, StorageError> {
    let bad = || StorageError::InvalidPredicate("a predicate value is damaged".into());
    let mut reader = StreamReader::try_new(Cursor::new(bytes), None)?;
    let batch = reader.next().ok_or_else(bad)??;
    if batch.num_columns() != 1 || batch.num_rows() != 1 {
        return Err(bad());
    }
    Ok(Scalar(batch.column(0).clone()))
}

impl ScanSpec {
    /// The spec as bytes for [`ScanSpec::decode`] on another server.
    pub fn encode(&self) -> Result<Vec<u8>, StorageError> {
        let mut predicates = Vec::new();
        for p in &self.predicates {
            let mut push = |op: &str, values: &[&Scalar]| -> Result<(), StorageError> {
                predicates.push(WirePredicate {
                    column: p.column,
                    op: op.into(),
                    values: values
                        .iter()
                        .map(|v| encode_scalar(v))
                        .collect::<Result<_, _>>()?,
                });
                Ok(())
            };
            match &p.op {
                PredicateOp::Eq(v) => push("=", &[v])?,
                PredicateOp::Lt(v) => push("<", &[v])?,
                PredicateOp::LtEq(v) => push("<=", &[v])?,
                PredicateOp::Gt(v) => push(">", &[v])?,
                PredicateOp::GtEq(v) => push(">=", &[v])?,
                PredicateOp::InList(values) => push("in", &values.iter().collect::<Vec<_>>())?,
                PredicateOp::IsNull => push("is null", &[])?,
                PredicateOp::IsNotNull => push("is not null", &[])?,
                PredicateOp::JoinFilter { filter, .. } => {
                    if let Some((low, high)) = filter.bounds() {
                        push(">=", &[low])?;
                        push("<=", &[high])?;
                    }
                }
            }
        }
        let wire = WireSpec {
            projection: self.projection.clone(),
            predicates,
            snapshot: self.snapshot.0,
            limit: self.limit,
            batch_size: self.batch_size,
            changes_since: self.changes_since.map(|t| t.0),
        };
        serde_json::to_vec(&wire).map_err(|e| StorageError::InvalidPredicate(e.to_string()))
    }

    /// The spec [`ScanSpec::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<ScanSpec, StorageError> {
        let wire: WireSpec = serde_json::from_slice(bytes)
            .map_err(|e| StorageError::InvalidPredicate(format!("bad scan request: {e}")))?;
        let mut predicates = Vec::with_capacity(wire.predicates.len());
        for p in wire.predicates {
            let mut values = p
                .values
                .iter()
                .map(|v| decode_scalar(v))
                .collect::<Result<Vec<_>, _>>()?;
            let mut one = || {
                values.pop().ok_or_else(|| {
                    StorageError::InvalidPredicate(format!("{} needs a value", p.op))
                })
            };
            let op = match p.op.as_str() {
                "=" => PredicateOp::Eq(one()?),
                "<" => PredicateOp::Lt(one()?),
                "<=" => PredicateOp::LtEq(one()?),
                ">" => PredicateOp::Gt(one()?),
                ">=" => PredicateOp::GtEq(one()?),
                "in" => PredicateOp::InList(values),
                "is null" => PredicateOp::IsNull,
                "is not null" => PredicateOp::IsNotNull,
                other => {
                    return Err(StorageError::InvalidPredicate(format!(
                        "unknown operator '{other}'"
                    )))
                }
            };
            predicates.push(ColumnPredicate {
                column: p.column,
                op,
            });
        }
        Ok(ScanSpec {
            projection: wire.projection,
            predicates,
            snapshot: Timestamp(wire.snapshot),
            limit: wire.limit,
            batch_size: wire.batch_size.max(1),
            string_views: false,
            changes_since: wire.changes_since.map(Timestamp),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};

    #[test]
    fn specs_survive_the_round_trip() {
        let int = |v: i64| Scalar(Arc::new(Int64Array::from(vec![v])));
        let spec = ScanSpec {
            projection: Some(vec![2, 0]),
            predicates: vec![
                ColumnPredicate {
                    column: 0,
                    op: PredicateOp::GtEq(int(5)),
                },
                ColumnPredicate {
                    column: 1,
                    op: PredicateOp::InList(vec![
                        Scalar(Arc::new(StringArray::from(vec!["a"]))),
                        Scalar(Arc::new(StringArray::from(vec!["b"]))),
                    ]),
                },
                ColumnPredicate {
                    column: 2,
                    op: PredicateOp::IsNull,
                },
            ],
            snapshot: Timestamp(42),
            limit: Some(10),
            batch_size: 100,
            string_views: false,
            changes_since: Some(Timestamp(7)),
        };
        let back = ScanSpec::decode(&spec.encode().unwrap()).unwrap();
        assert_eq!(format!("{back:?}"), format!("{spec:?}"));
        assert!(ScanSpec::decode(b"{}").is_err());
    }
}
