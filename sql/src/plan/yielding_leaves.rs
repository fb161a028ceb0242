//! [`YieldingLeaves`]: the physical optimizer rule that makes plans yield to the runtime now
//! and then, so a statement timeout can stop them (see [`crate::limits`]).

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::joins::NestedLoopJoinExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::probe_slices::ProbeSlicesExec;
use crate::exec::scan::NyalaScanExec;

/// Puts every source of rows except tablet scans behind a [`CooperativeExec`], so the
/// operators above it yield to the runtime now and then, and the probe input of every
/// nested-loop join behind a [`ProbeSlicesExec`] (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct YieldingLeaves;

impl YieldingLeaves {
    fn wrap(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        let yields = plan.is::<CooperativeExec>() || plan.is::<NyalaScanExec>();
        match plan.children().is_empty() && !yields {
            true => Arc::new(CooperativeExec::new(plan)),
            false => plan,
        }
    }

    /// `join`'s probe input sliced, if `join` is a nested-loop join that does not have it yet.
    fn slice_probe(join: &Arc<dyn ExecutionPlan>) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(nlj) = join.downcast_ref::<NestedLoopJoinExec>() else {
            return Ok(None);
        };
        if nlj.right().is::<ProbeSlicesExec>() {
            return Ok(None);
        }
        // The buffered side's rows, as far as its statistics know.
        let statistics =
            StatisticsContext::new().compute(nlj.left().as_ref(), &StatisticsArgs::new());
        let buffered = statistics?.num_rows;
        let rows = match buffered.get_value() {
            Some(&n) => PAIRS_PER_SLICE / n.max(1),
            None => UNKNOWN_BUFFERED_SLICE_ROWS,
        };
        let probe = Arc::new(ProbeSlicesExec::new(
            nlj.right().clone(),
            rows.clamp(1, MAX_SLICE_ROWS),
        ));
        let children = vec![nlj.left().clone(), probe as Arc<dyn ExecutionPlan>];
        let keep = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
        Ok(Some(join.clone().replace_children(children, keep)?))
    }
}

impl PhysicalOptimizerRule for YieldingLeaves {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = plan
            .transform_down(|node| {
                if node.is::<CooperativeExec>() {
                    return Ok(Transformed::no(node));
                }
                let node = match Self::slice_probe(&node)? {
                    Some(sliced) => sliced,
                    None => node,
                };
                let children: Vec<_> = node.children().into_iter().cloned().collect();
                let wrapped: Vec<_> = children.iter().cloned().map(Self::wrap).collect();
                if wrapped
                    .iter()
                    .zip(&children)
                    .all(|(w, c)| Arc::ptr_eq(w, c))
                {
                    return Ok(Transformed::no(node));
                }
                let keep = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
                Ok(Transformed::yes(node.replace_children(wrapped, keep)?))
            })?
            .data;
        Ok(Self::wrap(plan))
    }

    fn name(&self) -> &str {
        "nyala_yielding_leaves"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Pairs of buffered and probe rows a nested-loop join evaluates per probe slice, roughly.
const PAIRS_PER_SLICE: usize = 1 << 20;
/// Probe rows per slice when the buffered side's size is unknown.
const UNKNOWN_BUFFERED_SLICE_ROWS: usize = 16;
/// Probe rows per slice at most (DataFusion's default batch size).
const MAX_SLICE_ROWS: usize = 8192;
