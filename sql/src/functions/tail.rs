//! `tail(table, after_position, wait_ms)`: a queue table's rows after a position, in position
//! order, waiting for the first to arrive (a long poll).
//!
//! ```sql
//! SELECT pos, body FROM tail('inbox', 41, 5000) WHERE user_id = 'u1' LIMIT 100;
//! ```
//!
//! The table must have a column `GENERATED ALWAYS AS POSITION`. The scan reads the rows with a
//! position above `after_position` that pass the WHERE conditions storage evaluates, sorted
//! by position. If there are none, it waits until a write commits in one of the tablets it
//! reads (the tablets wake their waiters; nothing polls), then reads again, for at most
//! `wait_ms` in all; an empty result means nothing arrived in time. A tail of one tablet (a
//! WHERE that names the queue) waits where the tablet is: its scan itself waits and reads
//! again, so in a cluster a commit reaches the consumer without further round trips, and one
//! that brings only other queues' rows does not wake the statement. A consumer that goes on
//! from the last position it saw never sees a row at or below it: positions increase with
//! the order in which each tablet's log makes rows visible.
//!
//! The function and its table are here; the operator that reads and waits is
//! [`TailExec`](crate::exec::tail::TailExec), and a prepared consumer's poll binds its position
//! into a plan made once ([`PreparedTail`](crate::plan::prepared_tail::PreparedTail)).

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{col, lit, ColumnarValue, Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, Ident, Value, ValueWithSpan, VisitMut,
};
use nyala_engine::{Client, TableHandle};

use crate::catalog::table::NyalaTable;
use crate::exec::tail::TailExec;
use crate::functions::parameters;

pub const FUNCTION: &str = "tail";

/// Longest a tail (or a wait for changes) waits (`wait_ms` above it is an error).
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(600);

/// Lets a prepared consumer pass its position as a parameter: in a SELECT that reads nothing
/// but `tail('t', $n, wait_ms)` (no joins; the table named by a string), the call becomes
/// `tail('t', <lowest position>, wait_ms)` and `<position column> > $n` joins its WHERE, which
/// the tail honours as it does `after_position`: its reads and its wait take the condition.
/// A parameter in any other argument, or in another shape of query, is refused when the
/// function is called.
pub(crate) fn lower_parameters<V: VisitMut>(node: &mut V, client: &Client) {
    let lower = |args: &[FunctionArg]| {
        let [FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::Value(ValueWithSpan {
            value: Value::SingleQuotedString(table),
            ..
        }))), _, _] = args
        else {
            return None;
        };
        let table = client
            .table(datafusion::common::TableReference::parse_str(table).table())
            .ok()?;
        let position = &table.schema.columns()[table.schema.position_column()?].name;
        let lowest = SqlExpr::value(Value::Number(i64::MIN.to_string(), false));
        Some((Ident::with_quote('"', position), lowest))
    };
    parameters::lower_parameter(node, FUNCTION, 1, &lower);
}

/// The `tail` table function.
#[derive(Debug)]
pub struct TailFunction {
    pub client: Client,
}

impl TableFunctionImpl for TailFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let [name, after, wait] = args.exprs() else {
            return Err(DataFusionError::Plan(format!(
                "{FUNCTION}(table, after_position, wait_ms) takes three arguments"
            )));
        };
        let evaluate = |expr: &Expr| -> Result<ScalarValue> {
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
            if let Some(id) = parameter {
                return Err(DataFusionError::Plan(format!(
                    "{FUNCTION}: parameter {id} cannot be an argument here: only \
                     after_position can be a parameter, when {FUNCTION}(...) is all its \
                     SELECT reads (no joins) and names its table as a string"
                )));
            }
            let physical =
                (args.session()).create_physical_expr(expr.clone(), &DFSchema::empty())?;
            let options = RecordBatchOptions::new().with_row_count(Some(1));
            let schema = Arc::new(arrow::datatypes::Schema::empty());
            let one_row = RecordBatch::try_new_with_options(schema, vec![], &options)?;
            match physical.evaluate(&one_row)? {
                ColumnarValue::Scalar(value) => Ok(value),
                ColumnarValue::Array(array) => ScalarValue::try_from_array(&array, 0),
            }
        };
        let ScalarValue::Utf8(Some(name)) = evaluate(name)? else {
            return Err(DataFusionError::Plan(format!(
                "{FUNCTION}: the first argument is a table name"
            )));
        };
        let integer = |value: ScalarValue, what: &str| match value
            .cast_to(&arrow::datatypes::DataType::Int64)
        {
            Ok(ScalarValue::Int64(Some(v))) => Ok(v),
            _ => Err(DataFusionError::Plan(format!(
                "{FUNCTION}: {what} must be a whole number, got {value}"
            ))),
        };
        let after = integer(evaluate(after)?, "after_position")?;
        let wait = integer(evaluate(wait)?, "wait_ms")?;
        let wait = u64::try_from(wait)
            .ok()
            .map(Duration::from_millis)
            .filter(|w| *w <= MAX_WAIT)
            .ok_or_else(|| {
                DataFusionError::Plan(format!(
                    "{FUNCTION}: wait_ms must be from 0 to {}",
                    MAX_WAIT.as_millis()
                ))
            })?;
        let reference = datafusion::common::TableReference::parse_str(&name);
        let table = (self.client.table(reference.table()))
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        let Some(position) = table.schema.position_column() else {
            return Err(DataFusionError::Plan(format!(
                "{FUNCTION} reads a queue table (one with a column GENERATED ALWAYS AS \
                 POSITION); '{}' has none",
                table.name
            )));
        };
        Ok(Arc::new(TailTable {
            client: self.client.clone(),
            inner: NyalaTable::new(self.client.clone(), table.clone()),
            table,
            position,
            after,
            wait,
        }))
    }
}

/// A queue table read from a position on.
#[derive(Debug)]
pub(crate) struct TailTable {
    client: Client,
    inner: NyalaTable,
    table: TableHandle,
    /// The position column.
    position: usize,
    after: i64,
    wait: Duration,
}

#[async_trait]
impl TableProvider for TailTable {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(self.exec(projection, filters, limit)?))
    }
}

impl TailTable {
    /// The queue table's definition.
    pub(crate) fn handle(&self) -> TableHandle {
        self.table.clone()
    }

    /// The table's scan (see [`TableProvider::scan`]), which needs nothing of the session.
    pub(crate) fn exec(
        &self,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<TailExec> {
        let all: Vec<usize> = (0..self.table.schema.columns().len()).collect();
        let asked = projection.cloned().unwrap_or(all);
        // The position is read to sort by, if the query does not ask for it.
        let mut read = asked.clone();
        if !read.contains(&self.position) {
            read.push(self.position);
        }
        let name = &self.table.schema.columns()[self.position].name;
        let mut filters = filters.to_vec();
        filters.push(col(datafusion::common::Column::new_unqualified(name)).gt(lit(self.after)));
        let scan = self.inner.scan_exec(Some(read.clone()), &filters, None)?;
        let sort_by = read.iter().position(|&c| c == self.position).unwrap_or(0);
        TailExec::try_new(
            self.client.clone(),
            self.table.clone(),
            scan,
            sort_by,
            (0..asked.len()).collect(),
            limit,
            self.wait,
            FUNCTION,
        )
    }
}
