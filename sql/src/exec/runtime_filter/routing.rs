//! DataFusion's dynamic filters kept only on the scan columns they were made for: each is
//! followed down from the operator that makes it by column position, and taken from the scans
//! it does not reach that way (see the [module documentation](super) for why).

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::JoinType;
use datafusion::error::Result;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::scan::NyalaScanExec;

/// A dynamic filter on its way from the operator that makes it (a hash join, a TopK, an
/// aggregate) down to the scans that apply it: its id, and the expressions it tests (a join's
/// probe keys, a TopK's sort keys) over the output of the operator reached, followed column
/// by column by position.
#[derive(Clone)]
struct Route {
    id: u64,
    keys: Vec<Arc<dyn PhysicalExpr>>,
}

/// `plan` with each Nyala scan keeping only the dynamic filters that reach it on the columns
/// they were made for.
pub(crate) fn keep_routed_dynamic_filters(
    plan: &Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    Ok(keep_routed(plan, &[])?.data)
}

/// `plan` with each Nyala scan keeping only the dynamic filters that reach it on the columns
/// they were made for: those whose keys there are the keys of a route into the scan. `routes`
/// are the filters on their way into `plan` from above.
fn keep_routed(
    plan: &Arc<dyn ExecutionPlan>,
    routes: &[Route],
) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    if let Some(scan) = plan.downcast_ref::<NyalaScanExec>() {
        let routed = |filter: &Arc<dyn PhysicalExpr>| {
            let keys: Vec<_> = filter.children().into_iter().cloned().collect();
            routes.iter().any(|route| {
                filter.expression_id() == Some(route.id) && same_by_position(&route.keys, &keys)
            })
        };
        let kept = scan.retaining_dynamic_filters(routed);
        if kept.dynamic_filters().len() == scan.dynamic_filters().len() {
            return Ok(Transformed::no(plan.clone()));
        }
        return Ok(Transformed::yes(Arc::new(kept) as Arc<dyn ExecutionPlan>));
    }
    let made: Vec<Route> = (plan.dynamic_expressions_produced().iter())
        .filter_map(|filter| {
            Some(Route {
                id: filter.expression_id()?,
                keys: filter.children().into_iter().cloned().collect(),
            })
        })
        .collect();
    // A hash join pushes its filter into its probe side, a TopK or an aggregate into its input.
    let made_into = match plan.is::<HashJoinExec>() {
        true => 1,
        false => 0,
    };
    let mut children = Vec::new();
    let mut changed = false;
    for (i, child) in plan.children().into_iter().enumerate() {
        let mut into_child: Vec<Route> = (routes.iter())
            .filter_map(|route| route_into(plan, i, route))
            .collect();
        if i == made_into {
            into_child.extend(made.iter().cloned());
        }
        let child = keep_routed(child, &into_child)?;
        changed |= child.transformed;
        children.push(child.data);
    }
    if !changed {
        return Ok(Transformed::no(plan.clone()));
    }
    // Only scans lost filters: every operator's properties stay as they were.
    let keep = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Keep);
    Ok(Transformed::yes(
        plan.clone().replace_children(children, keep)?,
    ))
}

/// `route` below `plan`, in its input `child`, if `plan` passes all the filter's columns there.
fn route_into(plan: &Arc<dyn ExecutionPlan>, child: usize, route: &Route) -> Option<Route> {
    let keys = (route.keys.iter())
        .map(|key| rewrite_columns(key, &|column: &Column| input_column(plan, child, column)))
        .collect::<Option<Vec<_>>>()?;
    Some(Route { id: route.id, keys })
}

/// Output column `column` of `plan` as an expression over its input `child`, where DataFusion
/// pushes a filter on the column below `plan`: at the same position through operators that
/// only move or sort rows, through a projection's expression or a filter's projection, to the
/// side of a hash join it comes from, and below an aggregate as its grouping expression.
fn input_column(
    plan: &Arc<dyn ExecutionPlan>,
    child: usize,
    column: &Column,
) -> Option<Arc<dyn PhysicalExpr>> {
    let at =
        |index: usize| Some(Arc::new(Column::new(column.name(), index)) as Arc<dyn PhysicalExpr>);
    if let Some(projection) = plan.downcast_ref::<ProjectionExec>() {
        return Some(projection.expr().get(column.index())?.expr.clone());
    }
    if let Some(filter) = plan.downcast_ref::<FilterExec>() {
        return match filter.projection() {
            Some(p) => at(*p.get(column.index())?),
            None => at(column.index()),
        };
    }
    if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
        return join_input_column(join, child, column);
    }
    if let Some(aggregate) = plan.downcast_ref::<AggregateExec>() {
        // Grouping sets leave grouping columns NULL in some groups: no filter goes below them.
        let group_by = aggregate.group_expr();
        return match group_by.is_single() {
            true => Some(group_by.expr().get(column.index())?.0.clone()),
            false => None,
        };
    }
    match plan.name() {
        // Filters from above stay above a TopK: below it they would change the rows it keeps.
        "SortExec" if plan.fetch().is_some() => None,
        "RepartitionExec"
        | "CoalescePartitionsExec"
        | "CoalesceBatchesExec"
        | "CooperativeExec"
        | "SortExec"
        | "SortPreservingMergeExec"
        | "BufferExec"
        | "UnionExec" => at(column.index()),
        _ => None,
    }
}

/// Output column `column` of `join` over its input `child` (0: build, 1: probe), where
/// DataFusion pushes a filter on it below the join: to the side the column comes from when the
/// join outputs that side's rows whatever the other holds, and for a semi join's key also to
/// the other side, as the key it equals there.
fn join_input_column(
    join: &HashJoinExec,
    child: usize,
    column: &Column,
) -> Option<Arc<dyn PhysicalExpr>> {
    let index = match &join.projection {
        Some(projection) => *projection.get(column.index())?,
        None => column.index(),
    };
    let lengths = [join.left(), join.right()].map(|side| side.schema().fields().len());
    let join_type = *join.join_type();
    let (side, index) = match join_type {
        JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full
            if index >= lengths[0] =>
        {
            (1, index - lengths[0])
        }
        JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full => (0, index),
        JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => (0, index),
        JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => (1, index),
    };
    // A mark join's mark column comes from neither side.
    if index >= lengths[side] {
        return None;
    }
    let kept = match join_type {
        JoinType::Inner | JoinType::LeftSemi | JoinType::RightSemi => [true, true],
        JoinType::Left | JoinType::LeftAnti | JoinType::LeftMark => [true, false],
        JoinType::Right | JoinType::RightAnti | JoinType::RightMark => [false, true],
        JoinType::Full => [false, false],
    };
    if side == child {
        return kept[side]
            .then(|| Arc::new(Column::new(column.name(), index)) as Arc<dyn PhysicalExpr>);
    }
    // Each row a semi join outputs has a key equal to one of the other side's.
    let semi = matches!(
        (join_type, side),
        (JoinType::LeftSemi, 0) | (JoinType::RightSemi, 1)
    );
    if !semi {
        return None;
    }
    join.on().iter().find_map(|(left, right)| {
        let (own, other) = if side == 0 {
            (left, right)
        } else {
            (right, left)
        };
        (own.downcast_ref::<Column>()?.index() == index).then(|| other.clone())
    })
}

/// `expr` with each column replaced by `input`'s expression for it; None if it has none for one.
fn rewrite_columns(
    expr: &Arc<dyn PhysicalExpr>,
    input: &dyn Fn(&Column) -> Option<Arc<dyn PhysicalExpr>>,
) -> Option<Arc<dyn PhysicalExpr>> {
    let mut complete = true;
    let rewritten = expr.clone().transform_down(|e| {
        match e.downcast_ref::<Column>().map(input) {
            None => Ok(Transformed::no(e)),
            // The replacement is over the input already: its columns are not replaced again.
            Some(Some(replacement)) => {
                Ok(Transformed::new(replacement, true, TreeNodeRecursion::Jump))
            }
            Some(None) => {
                complete = false;
                Ok(Transformed::new(e, false, TreeNodeRecursion::Stop))
            }
        }
    });
    match (rewritten, complete) {
        (Ok(rewritten), true) => Some(rewritten.data),
        _ => None,
    }
}

/// Whether `a` and `b` are the same expressions of the same columns, whatever the columns are
/// called (pushdown keeps the names a filter's columns have above).
fn same_by_position(a: &[Arc<dyn PhysicalExpr>], b: &[Arc<dyn PhysicalExpr>]) -> bool {
    let unnamed = |e: &Arc<dyn PhysicalExpr>| {
        rewrite_columns(e, &|c: &Column| {
            Some(Arc::new(Column::new("", c.index())) as Arc<dyn PhysicalExpr>)
        })
    };
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(a, b)| match (unnamed(a), unnamed(b)) {
                (Some(a), Some(b)) => a == b,
                _ => false,
            })
}
