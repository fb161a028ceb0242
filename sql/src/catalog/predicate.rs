//! Filter pushdown: DataFusion expressions → storage column predicates.
//!
//! Only simple conjuncts are converted: `col <op> literal` (either side), `BETWEEN`, `IN (list)`,
//! `IS [NOT] NULL`. A literal is converted to the column's type only when the conversion is
//! lossless (`int_col < 1.5` is not pushed: as an integer it would become `< 1`). Storage
//! evaluates pushed filters exactly (and uses them to skip rowsets and pages), so they are
//! reported to DataFusion as exact and not applied again above the scan, except filters on
//! parameters, whose bound values may not convert (see `NyalaTable::supports_filters_pushdown`).

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{Between, BinaryExpr, Expr, Operator};
use datafusion::physical_expr::expressions::{
    BinaryExpr as PhysicalBinaryExpr, CaseExpr, Column, InListExpr, IsNotNullExpr, Literal,
};
use datafusion::physical_expr::PhysicalExpr;
use nyala_storage::{ColumnPredicate, JoinFilter, PredicateOp, Scalar, Schema};

/// The storage predicates equivalent to `expr` (a conjunction), or None if it cannot be pushed.
pub fn to_predicates(schema: &Schema, expr: &Expr) -> Option<Vec<ColumnPredicate>> {
    match expr {
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::And,
            right,
        }) => {
            let mut preds = to_predicates(schema, left)?;
            preds.extend(to_predicates(schema, right)?);
            Some(preds)
        }
        // `c = 1 OR c = 2 OR c IN (3, 4)` (DataFusion writes short IN lists this way): an IN list.
        Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::Or,
            right,
        }) => {
            let values_of = |e: &Expr| match to_predicates(schema, e)?.as_slice() {
                [ColumnPredicate {
                    column,
                    op: PredicateOp::Eq(v),
                }] => Some((*column, vec![v.clone()])),
                [ColumnPredicate {
                    column,
                    op: PredicateOp::InList(values),
                }] => Some((*column, values.clone())),
                _ => None,
            };
            let (column, mut values) = values_of(left)?;
            let (other, more) = values_of(right)?;
            if column != other {
                return None;
            }
            values.extend(more);
            Some(vec![ColumnPredicate {
                column,
                op: PredicateOp::InList(values),
            }])
        }
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let (column, literal, op) = match (left.as_ref(), right.as_ref()) {
                (Expr::Column(c), Expr::Literal(v, _)) => (c, v, *op),
                (Expr::Literal(v, _), Expr::Column(c)) => (c, v, op.swap()?),
                _ => return None,
            };
            let (column, value) = column_and_value(schema, &column.name, literal)?;
            let op = comparison(op, value)?;
            Some(vec![ColumnPredicate { column, op }])
        }
        Expr::Between(Between {
            expr,
            negated: false,
            low,
            high,
        }) => {
            let (Expr::Column(c), Expr::Literal(low, _), Expr::Literal(high, _)) =
                (expr.as_ref(), low.as_ref(), high.as_ref())
            else {
                return None;
            };
            let (column, low) = column_and_value(schema, &c.name, low)?;
            let (_, high) = column_and_value(schema, &c.name, high)?;
            Some(vec![
                ColumnPredicate {
                    column,
                    op: PredicateOp::GtEq(low),
                },
                ColumnPredicate {
                    column,
                    op: PredicateOp::LtEq(high),
                },
            ])
        }
        Expr::InList(list) if !list.negated => {
            let Expr::Column(c) = list.expr.as_ref() else {
                return None;
            };
            let column = schema.column_index(&c.name)?;
            let values = list
                .list
                .iter()
                .map(|item| match item {
                    Expr::Literal(v, _) => column_and_value(schema, &c.name, v).map(|(_, v)| v),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?;
            Some(vec![ColumnPredicate {
                column,
                op: PredicateOp::InList(values),
            }])
        }
        Expr::IsNull(inner) | Expr::IsNotNull(inner) => {
            let Expr::Column(c) = inner.as_ref() else {
                return None;
            };
            let column = schema.column_index(&c.name)?;
            let op = if matches!(expr, Expr::IsNull(_)) {
                PredicateOp::IsNull
            } else {
                PredicateOp::IsNotNull
            };
            Some(vec![ColumnPredicate { column, op }])
        }
        _ => None,
    }
}

/// `column <op> value` as a storage predicate, for the comparisons storage evaluates.
fn comparison(op: Operator, value: Scalar) -> Option<PredicateOp> {
    Some(match op {
        Operator::Eq => PredicateOp::Eq(value),
        Operator::Lt => PredicateOp::Lt(value),
        Operator::LtEq => PredicateOp::LtEq(value),
        Operator::Gt => PredicateOp::Gt(value),
        Operator::GtEq => PredicateOp::GtEq(value),
        _ => return None,
    })
}

/// The column index and the literal as a value of the column's type, if lossless and not NULL.
fn column_and_value(schema: &Schema, name: &str, literal: &ScalarValue) -> Option<(usize, Scalar)> {
    let column = schema.column_index(name)?;
    Some((column, value_for_column(schema, column, literal)?))
}

/// `literal` as a value of column `column`'s type, if the conversion is lossless and not NULL.
fn value_for_column(schema: &Schema, column: usize, literal: &ScalarValue) -> Option<Scalar> {
    if literal.is_null() {
        // `col = NULL` is never true; leave such filters to DataFusion.
        return None;
    }
    let column_type = &schema.columns()[column].column_type;
    if column_type.is_array() {
        // Storage compares scalars; a comparison of arrays is left to DataFusion.
        return None;
    }
    let target: DataType = column_type.arrow_type();
    let converted = literal.cast_to(&target).ok()?;
    if converted.is_null() || converted.cast_to(&literal.data_type()).ok()? != *literal {
        return None;
    }
    Some(Scalar(converted.to_array_of_size(1).ok()?))
}

/// Storage predicates implied by a physical filter expression over a scan's output, whose
/// column `i` is table column `columns[i]`: the convertible conjuncts of `expr` (each one a
/// necessary condition, so dropping the others only lets more rows through). IN lists are
/// converted only when `in_lists` is set, those of more than [`MAX_IN_LIST`] values (the keys
/// of a join's build side) into bloom filters.
pub fn physical_to_predicates(
    schema: &Schema,
    columns: &[usize],
    expr: &Arc<dyn PhysicalExpr>,
    in_lists: bool,
) -> Vec<ColumnPredicate> {
    let predicates = implied_predicates(schema, columns, expr, in_lists);
    (predicates.into_iter())
        .map(|p| match p.op {
            PredicateOp::InList(values) => ColumnPredicate {
                column: p.column,
                op: key_set(values),
            },
            _ => p,
        })
        .collect()
}

/// [`physical_to_predicates`], with IN lists as they are.
fn implied_predicates(
    schema: &Schema,
    columns: &[usize],
    expr: &Arc<dyn PhysicalExpr>,
    in_lists: bool,
) -> Vec<ColumnPredicate> {
    let column_of = |e: &Arc<dyn PhysicalExpr>| {
        e.downcast_ref::<Column>()
            .and_then(|c| columns.get(c.index()).copied())
    };
    let literal_of =
        |e: &Arc<dyn PhysicalExpr>| e.downcast_ref::<Literal>().map(|l| l.value().clone());
    if let Some(binary) = expr.downcast_ref::<PhysicalBinaryExpr>() {
        let op = *binary.op();
        if op == Operator::And {
            let mut predicates = implied_predicates(schema, columns, binary.left(), in_lists);
            predicates.extend(implied_predicates(
                schema,
                columns,
                binary.right(),
                in_lists,
            ));
            return predicates;
        }
        let (column, literal, op) = match (column_of(binary.left()), literal_of(binary.right())) {
            (Some(c), Some(v)) => (c, v, Some(op)),
            _ => match (literal_of(binary.left()), column_of(binary.right())) {
                (Some(v), Some(c)) => (c, v, op.swap()),
                _ => return vec![],
            },
        };
        return op
            .zip(value_for_column(schema, column, &literal))
            .and_then(|(op, value)| comparison(op, value))
            .map(|op| vec![ColumnPredicate { column, op }])
            .unwrap_or_default();
    }
    if let Some(list) = expr.downcast_ref::<InListExpr>() {
        let Some(column) = column_of(list.expr()) else {
            return vec![];
        };
        if !in_lists || list.negated() {
            return vec![];
        }
        // A NULL item never makes the IN list true, so it can be left out.
        let values = list
            .list()
            .iter()
            .filter_map(|item| match literal_of(item) {
                Some(v) if v.is_null() => None,
                Some(v) => Some(value_for_column(schema, column, &v)),
                None => Some(None),
            })
            .collect::<Option<Vec<_>>>();
        return match values {
            Some(values) => vec![ColumnPredicate {
                column,
                op: PredicateOp::InList(values),
            }],
            None => vec![],
        };
    }
    if let Some(case) = expr.downcast_ref::<CaseExpr>() {
        return any_branch(schema, columns, case, in_lists);
    }
    if let Some(inner) = expr.downcast_ref::<IsNotNullExpr>() {
        if let Some(column) = column_of(inner.arg()) {
            return vec![ColumnPredicate {
                column,
                op: PredicateOp::IsNotNull,
            }];
        }
    }
    vec![]
}

/// What every row that a `CASE ... THEN filter ... END` filter passes satisfies. The dynamic
/// filter of a partitioned hash join is such a CASE, with one branch per partition (the bounds
/// and keys of that partition's build side, or `false` for an empty one). A row passes only
/// the branch its partition picks, so it passes one of the branches: for each column that
/// every branch constrains, the union of their IN lists and the widest of their bounds.
fn any_branch(
    schema: &Schema,
    columns: &[usize],
    case: &CaseExpr,
    in_lists: bool,
) -> Vec<ColumnPredicate> {
    let branches = (case.when_then_expr().iter().map(|(_, then)| then)).chain(case.else_expr());
    let mut alternatives = Vec::new();
    for then in branches {
        let literal = then.downcast_ref::<Literal>().map(|l| l.value());
        if let Some(ScalarValue::Boolean(None | Some(false))) = literal {
            continue; // passes no row
        }
        match implied_predicates(schema, columns, then, in_lists) {
            predicates if predicates.is_empty() => return Vec::new(),
            predicates => alternatives.push(predicates),
        }
    }
    let Some(first) = alternatives.first() else {
        return Vec::new();
    };
    let mut constrained: Vec<usize> = first.iter().map(|p| p.column).collect();
    constrained.sort_unstable();
    constrained.dedup();
    let mut union = Vec::new();
    for column in constrained {
        // Each branch's first predicate on the column of the kind `pick` takes.
        let each = |pick: &dyn Fn(&PredicateOp) -> Option<Vec<Scalar>>| {
            (alternatives.iter())
                .map(|branch| {
                    (branch.iter())
                        .filter(|p| p.column == column)
                        .find_map(|p| pick(&p.op))
                })
                .collect::<Option<Vec<Vec<Scalar>>>>()
        };
        let values = each(&|op| match op {
            PredicateOp::Eq(v) => Some(vec![v.clone()]),
            PredicateOp::InList(values) => Some(values.clone()),
            _ => None,
        });
        if let Some(values) = values {
            let op = PredicateOp::InList(values.into_iter().flatten().collect());
            union.push(ColumnPredicate { column, op });
        }
        // The lowest lower bound, then the highest upper bound.
        for least in [true, false] {
            let bounds = each(&|op| match (op, least) {
                (PredicateOp::Eq(v), _)
                | (PredicateOp::GtEq(v) | PredicateOp::Gt(v), true)
                | (PredicateOp::LtEq(v) | PredicateOp::Lt(v), false) => Some(vec![v.clone()]),
                _ => None,
            });
            if let Some(bound) = bounds.and_then(|b| extreme(b.into_iter().flatten(), least)) {
                let op = match least {
                    true => PredicateOp::GtEq(bound),
                    false => PredicateOp::LtEq(bound),
                };
                union.push(ColumnPredicate { column, op });
            }
        }
    }
    union
}

/// Most values of a join's keys tested as an IN list (row by row, value by value); more are
/// tested through a bloom filter (within the keys' bounds), which also switches itself off
/// when it removes few rows.
const MAX_IN_LIST: usize = 16;

/// "The column's value is one of `values`" (a join's build keys, of the column's type), for a
/// filter that need not be exact.
fn key_set(values: Vec<Scalar>) -> PredicateOp {
    if values.len() <= MAX_IN_LIST {
        return PredicateOp::InList(values);
    }
    let arrays: Vec<&dyn arrow::array::Array> = values.iter().map(|v| v.0.as_ref()).collect();
    let Ok(keys) = arrow::compute::concat(&arrays) else {
        return PredicateOp::InList(values);
    };
    let low = extreme(values.iter().cloned(), true);
    let high = extreme(values.iter().cloned(), false);
    let mut filter = JoinFilter::new(keys.data_type().clone(), low.zip(high), false);
    match filter.add_bloom(&[keys], values.len()) {
        Ok(()) => PredicateOp::join_filter(Arc::new(filter)),
        // A type the bloom filter cannot hash.
        Err(_) => PredicateOp::InList(values),
    }
}

/// The least (`least`) or greatest of `values` (of one type); None if they do not compare.
fn extreme(values: impl Iterator<Item = Scalar>, least: bool) -> Option<Scalar> {
    let mut best: Option<Scalar> = None;
    for value in values {
        let better = match &best {
            None => true,
            Some(b) => {
                let b = arrow::array::Scalar::new(b.0.clone());
                let beats = match least {
                    true => arrow::compute::kernels::cmp::lt(&value.0, &b),
                    false => arrow::compute::kernels::cmp::gt(&value.0, &b),
                };
                beats.ok()?.value(0)
            }
        };
        if better {
            best = Some(value);
        }
    }
    best
}
