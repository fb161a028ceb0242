//! `changes(table, from, to [, wait_ms])`: the rows whose keys changed after `from` and up to
//! `to`, each key once, as a change stream (Kudu's diff scan, in SQL).
//!
//! ```sql
//! SELECT * FROM changes('orders', TIMESTAMP '2026-11-28 10:00:00', NULL, 5000) WHERE region = 'eu';
//! ```
//!
//! Each row is the key's row as it is at `to`, then `_change` (`insert` if the key had no row
//! at `from`, `delete` if it has none at `to`, else `update`) and `_commit_time` (the time of
//! its last change in the window), ordered by `_commit_time`. A deleted key's other columns
//! are as they were at `from` (NULL if it was inserted within the window too). `to` NULL
//! means the statement's snapshot (read to the end of its microsecond); with `wait_ms`, an
//! empty window waits up to that long for the first commit after `from`, as `tail()` does.
//!
//! A consumer that calls again with `from` = the largest `_commit_time` it received gets every
//! later change exactly once: a window holds every commit up to its end, to the microsecond,
//! and a transaction's rows share one commit time. Storage does the diff
//! ([`nyala_storage::ScanSpec::changes_since`]); the operator that sorts and waits is
//! [`TailExec`](crate::exec::tail::TailExec), as for `tail()`.

use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::ScalarValue;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, FunctionArg, Ident, Value, VisitMut};
use nyala_engine::{Client, TableHandle};
use nyala_storage::{Timestamp, CHANGE_COLUMN, COMMIT_TIME_COLUMN};

use crate::catalog::table::NyalaTable;
use crate::exec::scan::with_change_columns;
use crate::exec::tail::TailExec;
use crate::functions::as_of::{evaluate, snapshot_at};
use crate::functions::parameters;
use crate::functions::tail::MAX_WAIT;

pub const FUNCTION: &str = "changes";

/// The `changes` table function.
#[derive(Debug)]
pub struct ChangesFunction {
    pub client: Client,
}

impl TableFunctionImpl for ChangesFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let (name, from, to, wait) = match args.exprs() {
            [name, from, to] => (name, from, to, None),
            [name, from, to, wait] => (name, from, to, Some(wait)),
            _ => {
                return Err(DataFusionError::Plan(format!(
                    "{FUNCTION}(table, from, to [, wait_ms]) takes three or four arguments"
                )))
            }
        };
        let session = args.session();
        let value = |expr: &Expr| -> Result<ScalarValue> {
            refuse_parameters(expr)?;
            evaluate(session, expr)
        };
        let ScalarValue::Utf8(Some(name)) = value(name)? else {
            return Err(DataFusionError::Plan(format!(
                "{FUNCTION}: the first argument is a table name"
            )));
        };
        // NULL: `WHERE _commit_time > time` says (see `lower_parameters`).
        let since = match value(from)? {
            from if from.is_null() => None,
            from => Some(snapshot_at(from, &format!("{FUNCTION}: from"))?),
        };
        let to = match value(to)? {
            to if to.is_null() => None,
            to => Some(snapshot_at(to, &format!("{FUNCTION}: to"))?),
        };
        let wait = match wait.map(value).transpose()? {
            None => Duration::ZERO,
            Some(wait) => match wait.cast_to(&arrow::datatypes::DataType::Int64) {
                Ok(ScalarValue::Int64(Some(ms))) => u64::try_from(ms)
                    .ok()
                    .map(Duration::from_millis)
                    .filter(|w| *w <= MAX_WAIT)
                    .ok_or_else(|| {
                        DataFusionError::Plan(format!(
                            "{FUNCTION}: wait_ms must be from 0 to {}",
                            MAX_WAIT.as_millis()
                        ))
                    })?,
                _ => {
                    return Err(DataFusionError::Plan(format!(
                        "{FUNCTION}: wait_ms must be a whole number, got {wait}"
                    )))
                }
            },
        };
        if to.is_some() && !wait.is_zero() {
            return Err(DataFusionError::Plan(format!(
                "{FUNCTION}: wait_ms needs to = NULL (a window that ends in the past has \
                 nothing to wait for)"
            )));
        }
        let reference = datafusion::common::TableReference::parse_str(&name);
        let table = (self.client.table(reference.table()))
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        if let Some(clash) = (table.schema.columns().iter())
            .find(|c| c.name == CHANGE_COLUMN || c.name == COMMIT_TIME_COLUMN)
        {
            return Err(DataFusionError::Plan(format!(
                "{FUNCTION}: table '{}' has a column named '{}', which {FUNCTION}() adds",
                table.name, clash.name
            )));
        }
        let inner = NyalaTable::new(self.client.clone(), table.clone());
        Ok(Arc::new(ChangesTable {
            client: self.client.clone(),
            // (Strings are views, as the table's: see `NyalaTable::schema`.)
            schema: with_change_columns(&inner.schema(), true),
            inner,
            table,
            since,
            to,
            wait,
        }))
    }
}

/// Whether `filter` reads `_change` or `_commit_time` (which storage does not filter by).
fn on_added_columns(filter: &Expr) -> bool {
    (filter.column_refs().iter()).any(|c| c.name == CHANGE_COLUMN || c.name == COMMIT_TIME_COLUMN)
}

/// The time of a filter `_commit_time > time` (a literal, once parameters are bound; a
/// parameter while the statement is prepared).
fn after_time(filter: &Expr) -> Option<&Expr> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = filter else {
        return None;
    };
    match (left.as_ref(), op, right.as_ref()) {
        (Expr::Column(c), Operator::Gt, time @ (Expr::Literal(..) | Expr::Placeholder(_)))
            if c.name == COMMIT_TIME_COLUMN =>
        {
            Some(time)
        }
        _ => None,
    }
}

/// Lets a prepared consumer pass `from` as a parameter: in a SELECT that reads nothing but
/// `changes('t', $n, ...)` (no joins), the call becomes `changes('t', NULL, ...)` and
/// `_commit_time > $n` joins its WHERE, which the function takes as the window's start once
/// the parameter is bound. (The time is chosen when a statement is planned; a parameter's
/// value is known only when it runs.)
pub(crate) fn lower_parameters<V: VisitMut>(node: &mut V) {
    let lower =
        |_: &[FunctionArg]| Some((Ident::new(COMMIT_TIME_COLUMN), SqlExpr::value(Value::Null)));
    parameters::lower_parameter(node, FUNCTION, 1, &lower);
}

/// Parameters cannot be arguments: the window is chosen when the statement is planned.
fn refuse_parameters(expr: &Expr) -> Result<()> {
    let mut parameter = None;
    expr.apply(|e| {
        Ok(match e {
            Expr::Placeholder(p) => {
                parameter = Some(p.id.clone());
                TreeNodeRecursion::Stop
            }
            _ => TreeNodeRecursion::Continue,
        })
    })?;
    match parameter {
        Some(id) => Err(DataFusionError::Plan(format!(
            "{FUNCTION}: parameter {id} cannot be an argument here: only from can be a \
             parameter, when {FUNCTION}(...) is all its SELECT reads (no joins)"
        ))),
        None => Ok(()),
    }
}

/// A table's changes within a window.
#[derive(Debug)]
pub(crate) struct ChangesTable {
    client: Client,
    inner: NyalaTable,
    table: TableHandle,
    /// The table's columns (all nullable), then `_change` and `_commit_time`.
    schema: SchemaRef,
    /// `from`; None: given by a filter `_commit_time > time` instead.
    since: Option<Timestamp>,
    /// None: the statement's snapshot.
    to: Option<Timestamp>,
    wait: Duration,
}

impl ChangesTable {
    /// The table's definition.
    pub(crate) fn handle(&self) -> TableHandle {
        self.table.clone()
    }
}

#[async_trait]
impl TableProvider for ChangesTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        // Storage filters the rows it returns by the table's columns; DataFusion filters by
        // the change and its time, and a `_commit_time > time` reaches the scan too (it may be
        // the window's start).
        let own: Vec<usize> = (0..filters.len())
            .filter(|&i| !on_added_columns(filters[i]))
            .collect();
        let passed: Vec<&Expr> = own.iter().map(|&i| filters[i]).collect();
        let mut answers: Vec<_> = (filters.iter())
            .map(|f| match after_time(f).is_some() {
                true => TableProviderFilterPushDown::Inexact,
                false => TableProviderFilterPushDown::Unsupported,
            })
            .collect();
        for (i, answer) in own
            .into_iter()
            .zip(self.inner.supports_filters_pushdown(&passed)?)
        {
            answers[i] = answer;
        }
        Ok(answers)
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let columns = self.table.schema.columns().len();
        let asked: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..columns + 2).collect(),
        };
        // The scan returns the table columns asked for, then the change and its time.
        let read: Vec<usize> = asked.iter().copied().filter(|&c| c < columns).collect();
        let output: Vec<usize> = (asked.iter())
            .map(|&c| match c.checked_sub(columns) {
                Some(added) => read.len() + added,
                None => read.iter().position(|&r| r == c).unwrap_or(0),
            })
            .collect();
        // The window starts at `from`, or where `_commit_time > time` says (the later of
        // the two).
        let mut since = self.since;
        for time in filters.iter().filter_map(after_time) {
            let Expr::Literal(time, _) = time else {
                return Err(DataFusionError::Plan(format!(
                    "{FUNCTION}: _commit_time > {time}: the parameter has no value"
                )));
            };
            let after = snapshot_at(time.clone(), &format!("{FUNCTION}: _commit_time >"))?;
            since = Some(since.map_or(after, |s| s.max(after)));
        }
        let since = since.ok_or_else(|| {
            DataFusionError::Plan(format!(
                "{FUNCTION}: from must be a time (the largest _commit_time received, to go \
                 on), or NULL with WHERE _commit_time > time"
            ))
        })?;
        let own: Vec<Expr> = (filters.iter())
            .filter(|f| !on_added_columns(f))
            .cloned()
            .collect();
        // The limit is the tail's (after sorting by commit time), not the storage scan's.
        let scan = self.inner.scan_exec(Some(read.clone()), &own, None)?;
        let scan = scan.changes_since(since);
        let scan = match self.to {
            Some(to) => scan.pinned_at(to),
            None => scan,
        };
        Ok(Arc::new(TailExec::try_new(
            self.client.clone(),
            self.table.clone(),
            scan,
            read.len() + 1,
            output,
            limit,
            self.wait,
            FUNCTION,
        )?))
    }
}
