//! Primary-key lookups without the query engine's fixed costs.
//!
//! A prepared query that returns columns of one row picked by its whole primary key
//! (`SELECT a, b FROM t WHERE k1 = $1 AND k2 = $2`) is what serving workloads run most. Planning
//! it with DataFusion at every execution (optimizer rules, physical planning, an operator
//! pipeline with its own threads and channels) costs far more than reading the row. Such a
//! statement is recognised once, when it is prepared, from its optimized logical plan; each
//! execution binds the key, finds the one tablet that can hold it (the partitioning of the key
//! columns), reads that tablet at its own safe snapshot and returns the row as it is stored.
//!
//! The fast path is taken only where it gives exactly DataFusion's answer: the plan is a
//! projection of plain columns over a filter over a Nyala table scan (no `AS OF`, no LIMIT), the
//! filter is a conjunction of `key column = parameter or literal` covering every key column, and
//! the bound values convert losslessly to the key columns' types (then storage evaluates the
//! predicates exactly). Anything else, including a value that would need a lossy conversion, is
//! planned by DataFusion as before.

use std::collections::BTreeSet;
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::ScalarValue;
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{BinaryExpr, Expr, LogicalPlan, Operator};
use nyala_engine::{Client, TableHandle};
use nyala_storage::{PredicateOp, ScanSpec};

use crate::params::cast_params;
use crate::predicate::to_predicates;
use crate::table::NyalaTable;
use crate::{Result, SqlError};

/// A prepared query recognised as a lookup by the whole primary key.
#[derive(Clone)]
pub(crate) struct KeyLookup {
    table: TableHandle,
    /// The WHERE clause: one equality per key column, with the statement's placeholders.
    filter: Expr,
    /// The types the statement implies for its parameters `$1..$n`.
    parameters: Vec<Option<DataType>>,
    /// Table columns returned, in order.
    columns: Vec<usize>,
    /// The result schema promised to the client (the statement's).
    schema: SchemaRef,
}

/// One execution of a [`KeyLookup`], its key bound.
pub(crate) struct BoundLookup {
    table: TableHandle,
    spec: ScanSpec,
    /// The tablet that can hold the key; None when no tablet can (a range partition missing).
    tablet: Option<usize>,
    schema: SchemaRef,
}

impl KeyLookup {
    /// `plan` (an optimized query plan with result schema `schema`) as a key lookup, if it is one.
    pub(crate) fn recognise(
        plan: &LogicalPlan,
        schema: &SchemaRef,
        parameters: &[Option<DataType>],
    ) -> Option<Self> {
        let (projection, input) = match plan {
            LogicalPlan::Projection(p) => (Some(&p.expr), p.input.as_ref()),
            other => (None, other),
        };
        let (mut conjuncts, input) = match input {
            LogicalPlan::Filter(f) => (split_conjunction(&f.predicate), f.input.as_ref()),
            other => (Vec::new(), other),
        };
        let LogicalPlan::TableScan(scan) = input else {
            return None;
        };
        if scan.fetch.is_some() {
            return None;
        }
        conjuncts.extend(scan.filters.iter().flat_map(split_conjunction));
        let provider = source_as_provider(&scan.source).ok()?;
        let (table, as_of) = provider.downcast_ref::<NyalaTable>()?.handle();
        if as_of {
            return None;
        }
        let column_index = |e: &Expr| match e {
            Expr::Column(c) => table.schema.column_index(&c.name),
            _ => None,
        };
        let columns: Vec<usize> = match (projection, &scan.projection) {
            (Some(exprs), _) => exprs.iter().map(column_index).collect::<Option<_>>()?,
            (None, Some(projection)) => projection.clone(),
            (None, None) => (0..table.schema.columns().len()).collect(),
        };
        let stored = table.schema.arrow_schema();
        let same_types = schema.fields().len() == columns.len()
            && (schema.fields().iter().zip(&columns))
                .all(|(field, &c)| field.data_type() == stored.field(c).data_type());
        // Every conjunct compares a key column with a value; together they cover the key.
        let mut keyed = BTreeSet::new();
        let mut filter: Vec<Expr> = Vec::new();
        for conjunct in conjuncts {
            if filter.contains(conjunct) {
                continue; // the filter above the scan repeats the filters pushed into it
            }
            let Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Eq,
                right,
            }) = conjunct
            else {
                return None;
            };
            let value = |e: &Expr| matches!(e, Expr::Placeholder(_) | Expr::Literal(..));
            let key = match (column_index(left), column_index(right)) {
                (Some(c), None) if value(right) => c,
                (None, Some(c)) if value(left) => c,
                _ => return None,
            };
            if !table.schema.is_key_column(key) {
                return None;
            }
            keyed.insert(key);
            filter.push(conjunct.clone());
        }
        let whole_key = table.schema.key_columns().iter().all(|k| keyed.contains(k));
        let filter = filter.into_iter().reduce(Expr::and)?;
        (same_types && whole_key).then(|| KeyLookup {
            filter,
            table,
            parameters: parameters.to_vec(),
            columns,
            schema: schema.clone(),
        })
    }

    /// The lookup of the key `params` give, or None where the values do not convert losslessly
    /// to the key's types (DataFusion plans that execution instead).
    pub(crate) fn bind(&self, params: &[ScalarValue]) -> Result<Option<BoundLookup>> {
        let values = cast_params(&self.parameters, params)?;
        let bound = self
            .filter
            .clone()
            .transform(|e| match e {
                Expr::Placeholder(p) => {
                    let value = p
                        .id
                        .strip_prefix('$')
                        .and_then(|n| n.parse::<usize>().ok())
                        .and_then(|n| values.get(n.checked_sub(1)?))
                        .ok_or_else(|| {
                            datafusion::error::DataFusionError::Plan(format!(
                                "no value bound for parameter {}",
                                p.id
                            ))
                        })?;
                    Ok(Transformed::yes(Expr::Literal(value.clone(), None)))
                }
                other => Ok(Transformed::no(other)),
            })?
            .data;
        let schema = &self.table.schema;
        let Some(predicates) = to_predicates(schema, &bound) else {
            return Ok(None);
        };
        let exact = predicates
            .iter()
            .all(|p| matches!(p.op, PredicateOp::Eq(_)) && schema.is_key_column(p.column));
        if !exact || predicates.len() < schema.key_columns().len() {
            return Ok(None);
        }
        let tablet = self.table.partition.prune(schema, &predicates).first().copied();
        Ok(Some(BoundLookup {
            table: self.table.clone(),
            spec: ScanSpec {
                projection: Some(self.columns.clone()),
                predicates,
                snapshot: nyala_storage::Timestamp(0), // the tablet's safe snapshot, when run
                limit: None,
                batch_size: 1024,
            },
            tablet,
            schema: self.schema.clone(),
        }))
    }
}

impl BoundLookup {
    pub(crate) fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Reads the row (none or one) at the tablet's safe snapshot, which includes every write
    /// this client saw acknowledged.
    pub(crate) async fn run(&self, client: &Client) -> Result<Vec<RecordBatch>> {
        let Some(tablet) = self.tablet else {
            return Ok(Vec::new());
        };
        let snapshot = client.safe_snapshot_of(&self.table, &[tablet]).await?;
        let (client, table, spec) = (client.clone(), self.table.clone(), self.spec.clone());
        // Opening a scan may wait for writes in flight below the snapshot.
        let batches = tokio::task::spawn_blocking(move || {
            client
                .scan_tablet(&table, tablet, spec, Some(snapshot))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(nyala_engine::EngineError::from)
        })
        .await
        .map_err(|e| SqlError::DataFusion(format!("the key lookup did not finish: {e}")))??;
        // The scan's schema has the table's names; the client was promised the statement's.
        batches
            .into_iter()
            .filter(|b| b.num_rows() > 0)
            .map(|b| Ok(RecordBatch::try_new(self.schema.clone(), b.columns().to_vec())?))
            .collect()
    }
}
