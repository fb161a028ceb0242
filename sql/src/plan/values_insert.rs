//! INSERT ... VALUES planned without the optimizers: a plan of constants feeding one sink has
//! nothing for their rules to improve, and they were most of a single-row INSERT's planning.

use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, DFSchema};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::source_as_provider;
use datafusion::error::Result;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::execution_props::ExecutionProps;
use datafusion::logical_expr::expr::physical_name;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{DmlStatement, Expr, LogicalPlan, Values, WriteOp};
use datafusion::physical_expr::create_physical_expr;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::ExecutionPlan;

/// Whether `plan` inserts rows given as values (`INSERT INTO t [(columns)] VALUES ...`, the
/// values maybe cast and put in the table's column order): nothing but projections over a
/// `Values` below the insert, of literals, columns, casts and operators (no function call:
/// the optimizer replaces `now()` by the statement's time; no subquery, no table read). The
/// logical optimizer's rewrites have nothing to gain in such a plan and cost about a third of
/// a single-row INSERT's planning, so it is only analyzed (types coerced), then planned by
/// [`plan_values_insert`].
pub(crate) fn inserts_values(plan: &LogicalPlan) -> bool {
    let LogicalPlan::Dml(DmlStatement {
        op: WriteOp::Insert(_),
        input,
        ..
    }) = plan
    else {
        return false;
    };
    let mut values = true;
    let plain = |e: &Expr| {
        matches!(
            e,
            Expr::Literal(..)
                | Expr::Column(_)
                | Expr::Alias(_)
                | Expr::Cast(_)
                | Expr::TryCast(_)
                | Expr::Negative(_)
                | Expr::Not(_)
                | Expr::IsNull(_)
                | Expr::IsNotNull(_)
                | Expr::BinaryExpr(_)
        )
    };
    let _ = input.apply_with_subqueries(|node| {
        values &= matches!(node, LogicalPlan::Projection(_) | LogicalPlan::Values(_));
        let _ = node.apply_expressions(|e| {
            values &= !e.exists(|e| Ok(!plain(e)))?;
            Ok(TreeNodeRecursion::Continue)
        });
        Ok(match values {
            true => TreeNodeRecursion::Continue,
            false => TreeNodeRecursion::Stop,
        })
    });
    values
}

/// The physical plan of an INSERT of values ([`inserts_values`]), `plan` analyzed: the
/// values and the projections over them planned as DataFusion's physical planner plans them,
/// under the table's insert, without the physical optimizer. Its rules find nothing to
/// rearrange in constants feeding one sink, and were over half of such an INSERT's physical
/// planning.
pub(crate) async fn plan_values_insert(
    plan: &LogicalPlan,
    state: &SessionState,
) -> Result<Arc<dyn ExecutionPlan>> {
    let LogicalPlan::Dml(DmlStatement {
        target,
        op: WriteOp::Insert(op),
        input,
        ..
    }) = plan
    else {
        return internal_err!("not an INSERT of values: {plan}");
    };
    let rows = values_exec(input, state.execution_props())?;
    source_as_provider(target)?
        .insert_into(state, rows, *op)
        .await
}

/// The rows of `plan`, projections over a `Values`, as DataFusion's physical planner plans
/// them.
fn values_exec(plan: &LogicalPlan, props: &ExecutionProps) -> Result<Arc<dyn ExecutionPlan>> {
    let physical = |e: &Expr, schema: &DFSchema| {
        create_physical_expr(e, schema, props, &PhysicalPlanningContext::default())
    };
    match plan {
        LogicalPlan::Values(Values { values, schema }) => {
            let rows = values
                .iter()
                .map(|row| row.iter().map(|e| physical(e, schema)).collect())
                .collect::<Result<Vec<_>>>()?;
            Ok(MemorySourceConfig::try_new_as_values(
                schema.inner().clone(),
                rows,
            )?)
        }
        LogicalPlan::Projection(projection) => {
            let input = values_exec(&projection.input, props)?;
            let from = projection.input.schema();
            let exprs = (projection.expr.iter())
                .map(|e| {
                    // A column keeps its input's name (the planner's rule: a logical column
                    // may name a derived one).
                    let alias = match e {
                        Expr::Column(c) => match from.index_of_column(c) {
                            Ok(i) => input.schema().field(i).name().clone(),
                            Err(_) => physical_name(e)?,
                        },
                        _ => physical_name(e)?,
                    };
                    Ok(ProjectionExpr {
                        expr: physical(e, from)?,
                        alias,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Arc::new(ProjectionExec::try_new_with_schema_metadata(
                exprs,
                input,
                projection.schema.as_arrow(),
            )?))
        }
        other => internal_err!("not a projection of values: {other}"),
    }
}
