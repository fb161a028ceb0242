//! UPDATE and DELETE as PostgreSQL runs them at READ COMMITTED.
//!
//! The statement reads its target rows at its snapshot and writes them on condition that they
//! have not changed since ([`nyala_storage::WriteBatch::unchanged_since`]); the tablet checks
//! the condition when it applies the write, in log order. A row that did change (a concurrent
//! statement updated or deleted it after the snapshot) is read again at a newer snapshot, where
//! the WHERE clause and the assignments are evaluated on its newest version; a row that no
//! longer matches is left alone. So no update is lost to a concurrent one, and no statement
//! reports 0 rows for a row that exists.
//!
//! Rows are read again by planning the statement's input once more with the conflicting keys
//! as a filter (pushed into the scans like any key predicate), so joins and subqueries see the
//! newer snapshot too.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{BooleanArray, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, ScalarValue};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionState;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{lit, Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    execute_stream, DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, PlanProperties,
};
use futures::StreamExt;
use nyala_storage::{encode_keys, Timestamp};

use crate::dml::NyalaSink;
use crate::scan::{self, NyalaScanExec};

/// How often a statement reads rows again before it gives up on them: each round, a
/// concurrent statement that changed one of them has committed, so rounds only repeat under
/// a stream of writes to the same rows.
const MAX_REREADS: u32 = 1_000;

/// Longest pause between two rounds (the pause grows with the rounds, with jitter, so
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

    /// Writes the input's rows, then reads again and writes the rows that conflicted, until
    /// none does. Returns the number of rows changed.
    async fn run(&self, context: Arc<TaskContext>) -> Result<u64> {
        let mut snapshot = read_snapshot(&self.input, self.sink.table_id());
        let mut stream = self.input.execute(0, context.clone())?;
        let mut wanted: Option<HashSet<Vec<u8>>> = None;
        let mut applied = 0usize;
        for round in 0..=MAX_REREADS {
            let mut conflicts = Vec::new();
            while let Some(batch) = stream.next().await {
                let mut batch = batch?;
                if let Some(keys) = &wanted {
                    batch = self.only(batch, keys)?;
                }
                if batch.num_rows() == 0 {
                    continue;
                }
                let written = self.sink.write_batch(batch, snapshot, applied).await?;
                applied += written.rows;
                conflicts.extend(written.conflicts);
            }
            if conflicts.is_empty() {
                return Ok(applied as u64);
            }
            if round == MAX_REREADS {
                break;
            }
            tokio::time::sleep(pause(round)).await;
            let (plan, keys) = self.reread(&conflicts)?;
            let plan = self.state.create_physical_plan(&plan).await?;
            let at = scan::statement_snapshot(&plan).await?;
            let plan = match at {
                Some(at) => scan::with_snapshot(plan, at)?,
                None => plan,
            };
            snapshot = at;
            stream = execute_stream(plan, context.clone())?;
            wanted = Some(keys);
        }
        Err(DataFusionError::Execution(format!(
            "{} could not finish: rows it changes were changed by other statements {} times in \
             a row; run it again",
            self.sink.verb(),
            MAX_REREADS
        )))
    }

    /// The statement's input restricted to the keys of `conflicts` (each key column IN its
    /// values; the exact keys are picked by [`Self::only`]), and those keys.
    fn reread(&self, conflicts: &[RecordBatch]) -> Result<(LogicalPlan, HashSet<Vec<u8>>)> {
        let schema = self.sink.table_schema();
        let mut keys = HashSet::new();
        for batch in conflicts {
            keys.extend(encode_keys(schema, batch).map_err(external)?);
        }
        let mut predicate: Option<Expr> = None;
        for &c in schema.key_columns() {
            let name = &schema.columns()[c].name;
            let mut values = HashSet::new();
            let mut list = Vec::new();
            for batch in conflicts {
                let column = batch.column_by_name(name).ok_or_else(|| {
                    DataFusionError::Internal(format!("conflicting rows without key column {name}"))
                })?;
                for row in 0..batch.num_rows() {
                    let value = ScalarValue::try_from_array(column, row)?;
                    if values.insert(value.clone()) {
                        list.push(lit(value));
                    }
                }
            }
            let column = Expr::Column(Column::from_name(name)).in_list(list, false);
            predicate = Some(match predicate {
                None => column,
                Some(p) => p.and(column),
            });
        }
        let mut plan = LogicalPlanBuilder::from(self.logical.as_ref().clone());
        if let Some(predicate) = predicate {
            plan = plan.filter(predicate)?;
        }
        Ok((plan.build()?, keys))
    }

    /// The rows of `batch` whose key is one of `keys`.
    fn only(&self, batch: RecordBatch, keys: &HashSet<Vec<u8>>) -> Result<RecordBatch> {
        let encoded = encode_keys(self.sink.table_schema(), &batch).map_err(external)?;
        let keep: BooleanArray = encoded.iter().map(|k| Some(keys.contains(k))).collect();
        Ok(arrow::compute::filter_record_batch(&batch, &keep)?)
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

/// The pause before re-reading round `round` + 1: random, up to a bound that doubles each
/// round from 100 µs to [`MAX_PAUSE`].
fn pause(round: u32) -> Duration {
    let bound = Duration::from_micros(100u64 << round.min(16)).min(MAX_PAUSE);
    bound.mul_f64(rand::random::<f64>())
}

fn external(e: nyala_storage::StorageError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
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
        Ok(Box::pin(RecordBatchStreamAdapter::new(count_schema(), count)))
    }
}
