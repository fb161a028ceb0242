//! UPDATE and DELETE as PostgreSQL runs them at READ COMMITTED, made atomic by restarting.
//!
//! The statement reads its target rows at its snapshot and writes them on condition that they
//! have not changed since ([`nyala_storage::WriteBatch::unchanged_since`]); the tablet checks
//! the condition when it applies the write, in log order. If a row did change (a concurrent
//! statement updated or deleted it after the snapshot), or a transaction in progress holds
//! it, the statement writes nothing and starts again at a newer snapshot, where the WHERE
//! clause and the assignments see the row's newest version (Oracle restarts statements the
//! same way). So no update is lost to a concurrent one, no statement reports 0 rows for a row
//! that exists, and every statement changes its rows at one timestamp.
//!
//! A restart plans the statement's input again from its logical plan, so joins, subqueries
//! and runtime filters start afresh.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionState;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    execute_stream, DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, PlanProperties,
};
use nyala_storage::Timestamp;

use crate::exec::scan::{self, NyalaScanExec};
use crate::exec::sink::{NyalaSink, Outcome};
use crate::limits::interrupt::Interrupt;

/// How often a statement starts again before it gives up: each time, a concurrent statement
/// that changed one of its rows has committed, so restarts only repeat under a stream of
/// writes to the same rows.
pub(crate) const MAX_RESTARTS: u32 = 1_000;

/// Longest pause before a restart (the pause grows with the restarts, with jitter, so
/// statements contending for one row take turns instead of colliding again).
const MAX_PAUSE: Duration = Duration::from_millis(20);

/// Runs an UPDATE or DELETE whose input yields the target rows' keys (and new values).
#[derive(Clone)]
pub struct ConditionalMutationExec {
    input: Arc<dyn ExecutionPlan>,
    /// The statement's input as a logical plan, planned again to read conflicting rows.
    logical: Arc<LogicalPlan>,
    state: Arc<SessionState>,
    sink: Arc<NyalaSink>,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for ConditionalMutationExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConditionalMutationExec")
            .field("sink", &self.sink)
            .finish()
    }
}

impl ConditionalMutationExec {
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        logical: Arc<LogicalPlan>,
        state: Arc<SessionState>,
        sink: Arc<NyalaSink>,
    ) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(count_schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            input,
            logical,
            state,
            sink,
            properties,
        }
    }

    /// Runs the statement, starting again at a newer snapshot after a conflict. Returns the
    /// number of rows changed.
    async fn run(&self, context: Arc<TaskContext>) -> Result<u64> {
        let mut plan = self.input.clone();
        for restart in 0..=MAX_RESTARTS {
            let snapshot = read_snapshot(&plan, self.sink.table_id());
            let rows = execute_stream(plan, context.clone())?;
            match self.sink.write_statement(rows, snapshot, &context).await? {
                Outcome::Written(rows) => return Ok(rows),
                Outcome::Conflict if restart == MAX_RESTARTS => break,
                Outcome::Conflict => {}
            }
            tokio::time::sleep(pause(restart)).await;
            Interrupt::of(&context).check()?;
            plan = self.state.create_physical_plan(&self.logical).await?;
            plan = scan::pin_snapshot(plan).await?;
        }
        Err(DataFusionError::Execution(format!(
            "{} could not finish: rows it changes were changed by other statements {} times in \
             a row; run it again",
            self.sink.verb(),
            MAX_RESTARTS
        )))
    }
}

/// The snapshot the scans of the target table in `plan` read at (pinned for the statement).
fn read_snapshot(plan: &Arc<dyn ExecutionPlan>, table_id: &str) -> Option<Timestamp> {
    let mut snapshot = None;
    // The closure never fails.
    let _ = plan.apply(|node| {
        if let Some(scan) = node.downcast_ref::<NyalaScanExec>() {
            if scan.table_id() == table_id && !scan.is_as_of() {
                snapshot = scan.snapshot();
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    snapshot
}

/// The pause before restart `restart` + 1: random, up to a bound that doubles each time from
/// 100 µs to [`MAX_PAUSE`].
pub(crate) fn pause(restart: u32) -> Duration {
    let bound = Duration::from_micros(100u64 << restart.min(16)).min(MAX_PAUSE);
    bound.mul_f64(rand::random::<f64>())
}

fn count_schema() -> SchemaRef {
    Arc::new(ArrowSchema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]))
}

impl DisplayAs for ConditionalMutationExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        self.sink.fmt_as(t, f)
    }
}

impl ExecutionPlan for ConditionalMutationExec {
    fn name(&self) -> &str {
        "ConditionalMutationExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children.pop().ok_or_else(|| {
            DataFusionError::Internal("ConditionalMutationExec needs an input".into())
        })?;
        Ok(Arc::new(Self {
            input,
            ..self.as_ref().clone()
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "ConditionalMutationExec has one partition, not {partition}"
            )));
        }
        let this = self.clone();
        let count = futures::stream::once(async move {
            let rows = this.run(context).await?;
            Ok(RecordBatch::try_new(
                count_schema(),
                vec![Arc::new(UInt64Array::from(vec![rows]))],
            )?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            count_schema(),
            count,
        )))
    }
}
