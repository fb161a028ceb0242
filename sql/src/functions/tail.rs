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

use std::fmt;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::compute::{concat_batches, sort_to_indices, take_record_batch};
use arrow::datatypes::DataType;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, DFSchemaRef, ParamValues, ScalarValue};
use datafusion::datasource::source_as_provider;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionState;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::execution_props::ExecutionProps;
use datafusion::logical_expr::expr_rewriter::unnormalize_cols;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{col, lit, ColumnarValue, Expr, TableProviderFilterPushDown};
use datafusion::logical_expr::{Filter, LogicalPlan};
use datafusion::physical_expr::create_physical_expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    collect, DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr as SqlExpr, FunctionArg, FunctionArgExpr, Ident, ObjectName, Select,
    TableFactor, TableWithJoins, Value, ValueWithSpan, VisitMut, VisitorMut,
};
use nyala_engine::{Client, TableHandle};

use crate::catalog::table::NyalaTable;
use crate::exec::scan::{self, NyalaScanExec};

pub const FUNCTION: &str = "tail";

/// Longest a tail waits (`wait_ms` above it is an error).
const MAX_WAIT: Duration = Duration::from_secs(600);

/// Lets a prepared consumer pass its position as a parameter: in a SELECT that reads nothing
/// but `tail('t', $n, wait_ms)` (no joins; the table named by a string), the call becomes
/// `tail('t', <lowest position>, wait_ms)` and `<position column> > $n` joins its WHERE, which
/// the tail honours as it does `after_position`: its reads and its wait take the condition.
/// A parameter in any other argument, or in another shape of query, is refused when the
/// function is called.
pub(crate) fn lower_parameters<V: VisitMut>(node: &mut V, client: &Client) {
    struct Lower<'a>(&'a Client);
    impl VisitorMut for Lower<'_> {
        type Break = ();
        fn pre_visit_select(&mut self, select: &mut Select) -> ControlFlow<()> {
            if let Some(condition) = parameter_condition(&mut select.from, self.0) {
                select.selection = Some(match select.selection.take() {
                    Some(other) => SqlExpr::BinaryOp {
                        left: Box::new(SqlExpr::Nested(Box::new(other))),
                        op: BinaryOperator::And,
                        right: Box::new(condition),
                    },
                    None => condition,
                });
            }
            ControlFlow::Continue(())
        }
    }
    let _ = node.visit(&mut Lower(client));
}

/// For `FROM tail('t', $n, wait_ms) [AS alias]` alone: replaces `$n` by the lowest position
/// and returns `<position column> > $n`.
fn parameter_condition(from: &mut [TableWithJoins], client: &Client) -> Option<SqlExpr> {
    let [TableWithJoins { relation, joins }] = from else {
        return None;
    };
    let TableFactor::Table {
        name,
        alias,
        args: Some(args),
        ..
    } = relation
    else {
        return None;
    };
    let is_tail = |name: &ObjectName| match name.0.as_slice() {
        [part] => part
            .as_ident()
            .is_some_and(|i| crate::parse::statement::normalize_ident(i) == FUNCTION),
        _ => false,
    };
    if !joins.is_empty() || !is_tail(name) || alias.as_ref().is_some_and(|a| !a.columns.is_empty())
    {
        return None;
    }
    let [FunctionArg::Unnamed(FunctionArgExpr::Expr(table)), FunctionArg::Unnamed(FunctionArgExpr::Expr(after)), _] =
        args.args.as_mut_slice()
    else {
        return None;
    };
    let (
        SqlExpr::Value(ValueWithSpan {
            value: Value::SingleQuotedString(table),
            ..
        }),
        SqlExpr::Value(ValueWithSpan {
            value: Value::Placeholder(_),
            ..
        }),
    ) = (&*table, &*after)
    else {
        return None;
    };
    let table = client
        .table(datafusion::common::TableReference::parse_str(table).table())
        .ok()?;
    let position = &table.schema.columns()[table.schema.position_column()?].name;
    let column = Ident::with_quote('"', position);
    let column = match alias {
        Some(alias) => SqlExpr::CompoundIdentifier(vec![alias.name.clone(), column]),
        None => SqlExpr::Identifier(column),
    };
    let lowest = SqlExpr::value(Value::Number(i64::MIN.to_string(), false));
    Some(SqlExpr::BinaryOp {
        left: Box::new(column),
        op: BinaryOperator::Gt,
        right: Box::new(std::mem::replace(after, lowest)),
    })
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
    fn exec(
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
        let schema = Arc::new(
            scan.schema()
                .project(&(0..asked.len()).collect::<Vec<_>>())?,
        );
        Ok(TailExec {
            client: self.client.clone(),
            table: self.table.clone(),
            scan: Arc::new(scan),
            sort_by,
            output: asked.len(),
            limit,
            wait: self.wait,
            properties: Arc::new(PlanProperties::new(
                EquivalenceProperties::new(schema.clone()),
                Partitioning::UnknownPartitioning(1),
                EmissionType::Final,
                Boundedness::Bounded,
            )),
            schema,
        })
    }
}

/// A prepared tail whose parameters are all in its WHERE (the form [`lower_parameters`] gives
/// a prepared consumer, `tail('t', ?, w) WHERE ... AND pos > ?`): an execution binds them into
/// the tail's scan and into the filter DataFusion keeps above it (a condition on a parameter
/// is pushed down inexactly), under the rest of the plan, which was planned physically once,
/// when the statement was prepared. Planning it at every execution cost about half a poll's
/// CPU.
#[derive(Debug, Clone)]
pub(crate) struct PreparedTail {
    /// The [`TailTable`] the plan reads.
    table: Arc<dyn TableProvider>,
    projection: Option<Vec<usize>>,
    /// The conditions the plan pushes into the tail's scan, and the fetch it gives it.
    pushed: Vec<Expr>,
    fetch: Option<usize>,
    /// The filter above the scan, over the scan's output.
    filter: Option<(Expr, DFSchemaRef)>,
    /// The types of the parameters.
    types: Vec<Option<DataType>>,
    /// The physical plan with a tail that has no conditions in the place of the tail.
    plan: Arc<dyn ExecutionPlan>,
}

impl PreparedTail {
    /// `optimized` (a query with parameters of `types`) as a prepared tail, if it reads one
    /// tail and nothing else, and its parameters are only in the tail's conditions and the
    /// filter right above it.
    pub(crate) async fn recognise(
        optimized: &LogicalPlan,
        types: &[Option<DataType>],
        state: &SessionState,
    ) -> Option<Self> {
        let is_tail = |plan: &LogicalPlan| match plan {
            LogicalPlan::TableScan(scan) => {
                source_as_provider(&scan.source).is_ok_and(|p| p.is::<TailTable>())
            }
            _ => false,
        };
        let (mut scans, mut tail, mut filter, mut elsewhere) = (0, None, None, false);
        optimized
            .apply_with_subqueries(|node| {
                match node {
                    LogicalPlan::TableScan(scan) => {
                        scans += 1;
                        tail = is_tail(node).then(|| scan.clone());
                    }
                    LogicalPlan::Filter(Filter {
                        predicate, input, ..
                    }) if is_tail(input) => {
                        filter = Some((predicate.clone(), input.schema().clone()));
                    }
                    _ => {
                        elsewhere |= node
                            .expressions()
                            .iter()
                            .any(crate::catalog::table::has_placeholders)
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })
            .ok()?;
        let tail = tail.filter(|_| scans == 1 && !elsewhere)?;
        // The same plan without the conditions, which are all that depends on the values.
        let unconditional = optimized
            .clone()
            .transform_up(|node| match node {
                LogicalPlan::Filter(Filter { input, .. }) if is_tail(&input) => {
                    Ok(Transformed::yes(Arc::unwrap_or_clone(input)))
                }
                LogicalPlan::TableScan(mut scan) => {
                    scan.filters.clear();
                    Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
                }
                node => Ok(Transformed::no(node)),
            })
            .ok()?
            .data;
        let planner = state.query_planner();
        let plan = planner
            .create_physical_plan(&unconditional, state)
            .await
            .ok()?;
        let mut tails = 0;
        let _ = plan.apply(|node| {
            tails += usize::from(node.is::<TailExec>());
            Ok(TreeNodeRecursion::Continue)
        });
        // The plan above the tail runs again at every execution: it may hold only operators
        // that keep no state between executions (a TopK keeps its dynamic filter).
        if tails != 1 || !crate::plan::prepared::reusable(&plan) {
            return None;
        }
        Some(PreparedTail {
            table: source_as_provider(&tail.source).ok()?,
            projection: tail.projection,
            pushed: unnormalize_cols(tail.filters),
            fetch: tail.fetch,
            filter,
            types: types.to_vec(),
            plan,
        })
    }

    /// The physical plan of one execution with `params` bound.
    pub(crate) fn plan(&self, params: &[ScalarValue]) -> crate::Result<Arc<dyn ExecutionPlan>> {
        let values = ParamValues::from(crate::plan::params::cast_params(&self.types, params)?);
        let bind = |expr: &Expr| {
            expr.clone()
                .transform_up(|e| match e {
                    Expr::Placeholder(p) => {
                        let (value, metadata) =
                            values.get_placeholders_with_values(&p.id)?.into_inner();
                        Ok(Transformed::yes(Expr::Literal(value, metadata)))
                    }
                    e => Ok(Transformed::no(e)),
                })
                .map(|bound| bound.data)
        };
        let pushed = self.pushed.iter().map(bind).collect::<Result<Vec<_>>>()?;
        let Some(table) = self.table.downcast_ref::<TailTable>() else {
            return Err(DataFusionError::Internal("a prepared tail reads a tail".into()).into());
        };
        let mut tail: Arc<dyn ExecutionPlan> =
            Arc::new(table.exec(self.projection.as_ref(), &pushed, self.fetch)?);
        if let Some((predicate, schema)) = &self.filter {
            let (props, context) = (ExecutionProps::new(), PhysicalPlanningContext::default());
            let predicate = create_physical_expr(&bind(predicate)?, schema, &props, &context)?;
            tail = Arc::new(FilterExec::try_new(predicate, tail)?);
        }
        let plan = self
            .plan
            .clone()
            .transform_up(|node| match node.is::<TailExec>() {
                true => Ok(Transformed::yes(tail.clone())),
                false => Ok(Transformed::no(node)),
            })?;
        Ok(plan.data)
    }
}

/// Reads a queue's new rows, waiting for the first to arrive. Each execution waits and reads
/// anew: a plan can run again.
#[derive(Debug, Clone)]
pub(crate) struct TailExec {
    client: Client,
    table: TableHandle,
    scan: Arc<NyalaScanExec>,
    /// The column of the scan's output to sort by (the position).
    sort_by: usize,
    /// How many of the scan's first columns are the result's.
    output: usize,
    limit: Option<usize>,
    wait: Duration,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl TailExec {
    /// The scan of the queue table it runs (see [`crate::plan::prepared`]'s reusable plans).
    pub(crate) fn scan(&self) -> &NyalaScanExec {
        &self.scan
    }

    /// The rows after the position, sorted, once some arrived or the wait is over.
    async fn rows(&self, context: Arc<TaskContext>) -> Result<RecordBatch> {
        let deadline = tokio::time::Instant::now() + self.wait;
        if let [_] = self.scan.tablets() {
            // One tablet (the WHERE names a queue): it waits for rows itself, and answers with
            // them as soon as a commit brings some.
            let plan = Arc::new((*self.scan).clone().waiting_until(deadline));
            let batches = collect(plan, context).await?;
            return self.sorted(concat_batches(&self.scan.schema(), &batches)?);
        }
        // Where the rows a wait heard of are visible (no round to the tablets for a snapshot).
        let mut woken_at = None;
        loop {
            let plan = match woken_at.take() {
                Some(snapshot) => scan::with_snapshot(self.scan.clone(), snapshot)?,
                None => scan::pin_snapshot(self.scan.clone()).await?,
            };
            let snapshot = (plan.downcast_ref::<NyalaScanExec>()).and_then(|s| s.snapshot());
            let batches = collect(plan, context.clone()).await?;
            let rows = concat_batches(&self.scan.schema(), &batches)?;
            let now = tokio::time::Instant::now();
            if rows.num_rows() > 0 || now >= deadline {
                return self.sorted(rows);
            }
            let Some(snapshot) = snapshot else {
                return self.sorted(rows);
            };
            // Nothing yet: wait for a commit in one of the tablets read, then read again.
            let tablets = self.scan.tablets().to_vec();
            woken_at =
                (self
                    .client
                    .wait_for_write(&self.table, &tablets, snapshot, deadline - now))
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
        }
    }

    /// `rows` in position order, at most `limit` of them, with the columns asked for.
    fn sorted(&self, rows: RecordBatch) -> Result<RecordBatch> {
        let order = sort_to_indices(rows.column(self.sort_by), None, self.limit)?;
        let rows = take_record_batch(&rows, &order)?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows.num_rows()));
        let columns = rows.columns()[..self.output].to_vec();
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &options,
        )?)
    }
}

impl DisplayAs for TailExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "TailExec: {} waiting up to {} ms",
            self.table.name,
            self.wait.as_millis()
        )
    }
}

impl ExecutionPlan for TailExec {
    fn name(&self) -> &str {
        "TailExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.is_empty() {
            true => Ok(self),
            false => Err(DataFusionError::Internal("TailExec has no children".into())),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "TailExec has one partition, not {partition}"
            )));
        }
        let this = self.clone();
        let rows = futures::stream::once(async move { this.rows(context).await });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            rows,
        )))
    }
}
