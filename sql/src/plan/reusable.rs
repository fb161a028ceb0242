//! Physical plans that can run again as they are, so a prepared statement keeps its plan
//! instead of planning each execution anew.

use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::scan::NyalaScanExec;
use crate::exec::tail::TailExec;

/// Whether a physical plan can be executed again as it is: it is built only of operators that
/// keep no state between executions (a hash join keeps its build side, a TopK its dynamic
/// filter, a scan the filters joins give it at run time). Statement snapshots are pinned on a
/// copy at each execution.
pub(crate) fn reusable(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut reusable = true;
    let _ = plan.apply(|node| {
        let scan = (node.downcast_ref::<NyalaScanExec>())
            .or_else(|| node.downcast_ref::<TailExec>().map(TailExec::scan));
        reusable &= match scan {
            Some(scan) => !scan.has_runtime_filters(),
            None => {
                node.is::<ProjectionExec>()
                    || node.is::<FilterExec>()
                    || node.is::<PlaceholderRowExec>()
                    || node.is::<EmptyExec>()
                    || node.is::<CooperativeExec>()
                    || node.is::<CoalescePartitionsExec>()
                    || node.is::<GlobalLimitExec>()
                    || node.is::<LocalLimitExec>()
            }
        };
        Ok(match reusable {
            true => TreeNodeRecursion::Continue,
            false => TreeNodeRecursion::Stop,
        })
    });
    reusable
}
