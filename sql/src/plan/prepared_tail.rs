//! A prepared `tail` whose parameters are only in its WHERE, a prepared consumer's poll: planned
//! physically once, when prepared; each execution binds the values into the tail's scan and
//! the filter above it.

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchemaRef, ParamValues, ScalarValue};
use datafusion::datasource::source_as_provider;
use datafusion::datasource::TableProvider;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::execution_props::ExecutionProps;
use datafusion::logical_expr::expr_rewriter::unnormalize_cols;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{Expr, Filter, LogicalPlan};
use datafusion::physical_expr::create_physical_expr;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::tail::TailExec;
use crate::functions::tail::TailTable;
use crate::plan::reusable::reusable;

/// A prepared tail whose parameters are all in its WHERE (the form [`lower_parameters`](crate::functions::tail::lower_parameters) gives
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
        if tails != 1 || !reusable(&plan) {
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
