//! [`RuntimeFilterRule`]: the physical optimizer rule that wraps the build side of a hash join
//! in a [`RuntimeFilterBuildExec`] and attaches a [`RuntimeFilter`] to each
//! Nyala scan its probe-side keys come from.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{JoinType, NullEquality};
use datafusion::error::Result;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::runtime_filter::build::RuntimeFilterBuildExec;
use crate::exec::runtime_filter::filter::{FilterSlot, RuntimeFilter};
use crate::exec::runtime_filter::routing::keep_routed_dynamic_filters;
use crate::exec::scan::NyalaScanExec;
use crate::session::settings::RuntimeFilterMode;

/// The physical optimizer rule that attaches runtime filters to hash joins over Nyala scans.
#[derive(Debug, Default)]
pub struct RuntimeFilterRule {
    next_id: std::sync::atomic::AtomicUsize,
}

impl RuntimeFilterRule {
    /// The rule's name among the physical optimizer's.
    pub const NAME: &'static str = "nyala_runtime_filters";
}

impl PhysicalOptimizerRule for RuntimeFilterRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mode = RuntimeFilterMode::of(config);
        if mode == RuntimeFilterMode::Off {
            return Ok(plan);
        }
        let plan = keep_routed_dynamic_filters(&plan)?;
        plan.transform_up(|node| {
            let Some(join) = node.downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(node));
            };
            match self.attach(&node, join, mode)? {
                Some(new) => Ok(Transformed::yes(new)),
                None => Ok(Transformed::no(node)),
            }
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        Self::NAME
    }

    fn schema_check(&self) -> bool {
        true
    }
}

impl RuntimeFilterRule {
    fn attach(
        &self,
        node: &Arc<dyn ExecutionPlan>,
        join: &HashJoinExec,
        mode: RuntimeFilterMode,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        // Removing probe rows that match no build key is only correct when such rows do not
        // appear in the output, and the build side must be complete before the probe starts.
        let probe_rows_without_match_dropped = matches!(
            join.join_type(),
            JoinType::Inner
                | JoinType::Left
                | JoinType::LeftSemi
                | JoinType::LeftAnti
                | JoinType::LeftMark
                | JoinType::RightSemi
        );
        // A null-aware anti join (NOT IN) must see the probe side's NULLs, which filters drop.
        // A join that collects its build side has every key in one partition; a partitioned
        // join's build partitions each hold one hash partition's, and the filter is published
        // when the last of them ends: each builds without reading the probe side, so the
        // probe-side scans can wait for all of them (DataFusion's own dynamic filter of such
        // a join waits for every partition's build side the same way).
        let built_whole = matches!(
            join.partition_mode(),
            PartitionMode::CollectLeft | PartitionMode::Partitioned
        );
        if !built_whole
            || !probe_rows_without_match_dropped
            || join.null_aware
            || join.left().is::<RuntimeFilterBuildExec>()
        {
            return Ok(None);
        }
        let left_schema = join.left().schema();
        let right_schema = join.right().schema();
        let slot = FilterSlot::new(
            self.next_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        );
        let replaces: Vec<u64> = node
            .dynamic_expressions_produced()
            .iter()
            .filter_map(|e| e.expression_id())
            .collect();
        let mut probe = join.right().clone();
        let mut keys = Vec::new();
        for (left, right) in join.on() {
            let Some(column) = right.downcast_ref::<Column>() else {
                continue;
            };
            if left.data_type(&left_schema)? != right.data_type(&right_schema)? {
                continue;
            }
            let filter = |column: usize| RuntimeFilter {
                slot: slot.clone(),
                key: keys.len(),
                column,
            };
            if let Some(new_probe) = attach_to_scan(&probe, column.index(), &filter, &replaces) {
                probe = new_probe;
                keys.push(left.clone());
            }
        }
        if keys.is_empty() {
            return Ok(None);
        }
        let pass_nulls = join.null_equality() == NullEquality::NullEqualsNull;
        let build = Arc::new(RuntimeFilterBuildExec::try_new(
            join.left().clone(),
            keys,
            slot,
            mode,
            pass_nulls,
        )?);
        Ok(Some(replace_children(node, vec![build, probe])?))
    }
}

/// `plan` with the runtime filter on its output column `column` attached to the Nyala scan
/// that produces the column, if the way down only moves, sorts, projects or filters rows (and
/// limits none), passes through joins whose output rows keep the column's value from the
/// side it comes from (see [`join_side_of`]), or through aggregates grouping by it.
fn attach_to_scan(
    plan: &Arc<dyn ExecutionPlan>,
    column: usize,
    filter: &dyn Fn(usize) -> RuntimeFilter,
    replaces: &[u64],
) -> Option<Arc<dyn ExecutionPlan>> {
    if let Some(scan) = plan.downcast_ref::<NyalaScanExec>() {
        if scan.limit().is_some() {
            return None;
        }
        let table_column = scan.table_column(column)?;
        return Some(Arc::new(
            scan.with_runtime_filter(filter(table_column), replaces),
        ));
    }
    let (child, child_column) = if let Some(projection) = plan.downcast_ref::<ProjectionExec>() {
        let expr = &projection.expr().get(column)?.expr;
        (0, expr.downcast_ref::<Column>()?.index())
    } else if let Some(filter_exec) = plan.downcast_ref::<FilterExec>() {
        match filter_exec.projection() {
            Some(p) => (0, *p.get(column)?),
            None => (0, column),
        }
    } else if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
        join_side_of(join, column)?
    } else if let Some(aggregate) = plan.downcast_ref::<AggregateExec>() {
        (0, grouped_column_of(aggregate, column)?)
    } else if matches!(
        plan.name(),
        "RepartitionExec"
            | "CoalesceBatchesExec"
            | "CoalescePartitionsExec"
            | "CooperativeExec"
            | "SortExec"
            | "RuntimeFilterBuildExec"
    ) {
        (0, column)
    } else {
        return None;
    };
    // Below a limit (a TopK sort, a fetch), removing rows would change which rows are kept.
    if plan.fetch().is_some() {
        return None;
    }
    let mut children: Vec<Arc<dyn ExecutionPlan>> = plan.children().into_iter().cloned().collect();
    let new_child = attach_to_scan(children.get(child)?, child_column, filter, replaces)?;
    children[child] = new_child;
    replace_children(plan, children).ok()
}

/// The input column that output column `column` of `aggregate` groups by, where rows may be
/// taken from its input by their value there: all rows of a group have that value, so the
/// groups left are those whose key the filter passes, each with its result unchanged. (Not
/// with grouping sets, whose totals span groups, nor with a limit on the groups.)
fn grouped_column_of(aggregate: &AggregateExec, column: usize) -> Option<usize> {
    let group_by = aggregate.group_expr();
    if !group_by.is_single() || aggregate.limit_options().is_some() {
        return None;
    }
    let (expr, _) = group_by.expr().get(column)?;
    expr.downcast_ref::<Column>().map(Column::index)
}

/// The input (0: build side, 1: probe side) and its column that output column `column` of
/// `join` (a join below the one whose filter is placed) comes from, when a row of that input
/// whose value there the filter rejects can only make output rows that the filter's own join
/// drops: an inner join's either side, an outer join's preserved side, a semi or anti join's
/// output side. (A null-extended side's values are not its input's.)
fn join_side_of(join: &HashJoinExec, column: usize) -> Option<(usize, usize)> {
    let column = match &join.projection {
        Some(projection) => *projection.get(column)?,
        None => column,
    };
    let left = join.left().schema().fields().len();
    let right = join.right().schema().fields().len();
    // Output columns: left then right; a semi, anti or mark join's only its own side's.
    let (side, index) = match join.join_type() {
        JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full => {
            match column < left {
                true => (0, column),
                false => (1, column - left),
            }
        }
        JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => (0, column),
        JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => (1, column),
    };
    let kept = match join.join_type() {
        JoinType::Inner => true,
        JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti | JoinType::LeftMark => side == 0,
        JoinType::Right | JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => {
            side == 1
        }
        JoinType::Full => false,
    };
    let width = [left, right][side];
    (kept && index < width).then_some((side, index))
}

fn replace_children(
    plan: &Arc<dyn ExecutionPlan>,
    children: Vec<Arc<dyn ExecutionPlan>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let options = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
    plan.clone().replace_children(children, options)
}
