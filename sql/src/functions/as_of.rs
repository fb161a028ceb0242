//! Time travel: `SELECT ... FROM t AS OF <time>` (also `FOR SYSTEM_TIME AS OF <time>`).
//!
//! The parser leaves the clause on the table reference as sqlparser's
//! [`TableVersion::ForSystemTimeAsOf`]. DataFusion's SQL planner does not look at table
//! versions, so before a statement is planned [`lower`] turns every versioned reference
//! `t AS OF <expr> [alias]` into a call of the table function [`FUNCTION`],
//! `nyala_as_of('t', <expr>) AS alias` (the alias defaults to the table name, so `t.column` keeps
//! working). The function evaluates `<expr>` (a constant such as
//! `TIMESTAMP '2026-11-23 10:00:00'` or `now() - INTERVAL '5 minutes'`, in UTC) and returns the
//! table with every scan of it pinned to that time. Storage refuses times older than the history
//! retention with a clear error.

use std::ops::ControlFlow;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, TimeUnit};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::datasource::TableProvider;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::{ColumnarValue, Expr};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, Ident, ObjectName, TableAlias, TableFactor,
    TableFunctionArgs as SqlFunctionArgs, TableVersion, Value, VisitMut, VisitorMut,
};
use nyala_engine::Client;
use nyala_storage::Timestamp;

use crate::catalog::table::NyalaTable;
use crate::{Result, SqlError};

pub const FUNCTION: &str = "nyala_as_of";

/// Turns every table reference read `AS OF` a time in `node` into a call of [`FUNCTION`].
pub(crate) fn lower<V: VisitMut>(node: &mut V) -> Result<()> {
    struct Lower;
    impl VisitorMut for Lower {
        type Break = Box<SqlError>;
        fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<Self::Break> {
            let TableFactor::Table {
                name,
                alias,
                args,
                version,
                ..
            } = factor
            else {
                return ControlFlow::Continue(());
            };
            let time = match version.take() {
                None => return ControlFlow::Continue(()),
                Some(_) if args.is_some() => {
                    return ControlFlow::Break(Box::new(SqlError::NotSupported(format!(
                        "AS OF on the table function {name}: AS OF reads a table as it was"
                    ))))
                }
                Some(TableVersion::ForSystemTimeAsOf(time)) => time,
                Some(other) => {
                    return ControlFlow::Break(Box::new(SqlError::NotSupported(format!(
                        "{other} (supported: AS OF <time>, FOR SYSTEM_TIME AS OF <time>)"
                    ))))
                }
            };
            let default_alias = || {
                name.0
                    .last()
                    .and_then(|part| part.as_ident())
                    .map(|ident| TableAlias {
                        explicit: true,
                        name: ident.clone(),
                        columns: vec![],
                        at: None,
                    })
            };
            *alias = alias.take().or_else(default_alias);
            let argument = |expr| FunctionArg::Unnamed(FunctionArgExpr::Expr(expr));
            *args = Some(SqlFunctionArgs {
                args: vec![
                    argument(SqlExpr::value(Value::SingleQuotedString(name.to_string()))),
                    argument(time),
                ],
                settings: None,
            });
            *name = ObjectName::from(vec![Ident::new(FUNCTION)]);
            ControlFlow::Continue(())
        }
    }
    match node.visit(&mut Lower) {
        ControlFlow::Break(e) => Err(*e),
        ControlFlow::Continue(()) => Ok(()),
    }
}

/// The `nyala_as_of(table, time)` table function.
#[derive(Debug)]
pub struct AsOfFunction {
    pub client: Client,
}

impl TableFunctionImpl for AsOfFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let [name, time] = args.exprs() else {
            return Err(DataFusionError::Plan(format!(
                "{FUNCTION} takes a table name and a time"
            )));
        };
        let session = args.session();
        let ScalarValue::Utf8(Some(name)) = evaluate(session, name)? else {
            return Err(DataFusionError::Plan(format!(
                "{FUNCTION}: the first argument is a table name"
            )));
        };
        let snapshot = snapshot_at(evaluate(session, time)?, "AS OF")?;
        let reference = datafusion::common::TableReference::parse_str(&name);
        let table = self
            .client
            .table(reference.table())
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        Ok(Arc::new(
            NyalaTable::new(self.client.clone(), table).pinned_at(snapshot),
        ))
    }
}

/// The value of the constant expression `expr` (`now() - INTERVAL '5 minutes'`).
pub(crate) fn evaluate(session: &dyn Session, expr: &Expr) -> DfResult<ScalarValue> {
    let physical = session.create_physical_expr(expr.clone(), &DFSchema::empty())?;
    let one_row = RecordBatch::try_new_with_options(
        Arc::new(arrow::datatypes::Schema::empty()),
        vec![],
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(1)),
    )?;
    match physical.evaluate(&one_row)? {
        ColumnarValue::Scalar(value) => Ok(value),
        ColumnarValue::Array(array) => ScalarValue::try_from_array(&array, 0),
    }
}

/// The snapshot that reads what was committed at `time` (a time in the past, in UTC); `what`
/// names the time in errors ("AS OF").
pub(crate) fn snapshot_at(time: ScalarValue, what: &str) -> DfResult<Timestamp> {
    let micros = match time.cast_to(&DataType::Timestamp(TimeUnit::Microsecond, None)) {
        Ok(ScalarValue::TimestampMicrosecond(Some(micros), _)) => micros,
        _ => {
            return Err(DataFusionError::Plan(format!(
                "{what} needs a time, got {time}"
            )))
        }
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let micros = u64::try_from(micros)
        .map_err(|_| DataFusionError::Plan(format!("{what} {time} is before 1970")))?;
    if micros > now {
        return Err(DataFusionError::Plan(format!(
            "{what} {} is in the future",
            Timestamp::from_micros(micros).display()
        )));
    }
    // Every version written within that microsecond is included.
    Ok(Timestamp::from_micros(micros).end_of_microsecond())
}

/// The snapshot of `AS OF <time>` outside a query (`CREATE TABLE ... CLONE t AS OF`), `time`
/// planned in the session's `state`.
pub(crate) async fn time_of(state: &SessionState, time: &SqlExpr) -> Result<Timestamp> {
    let expr = state.create_logical_expr(&time.to_string(), &DFSchema::empty())?;
    // now() is a constant of the statement, replaced before evaluation.
    let context = SimplifyContext::builder().with_current_time().build();
    let expr = ExprSimplifier::new(context).simplify(expr)?;
    Ok(snapshot_at(evaluate(state, &expr)?, "AS OF")?)
}
