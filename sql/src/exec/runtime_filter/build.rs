//! [`RuntimeFilterBuildExec`]: passes a hash join's build side through to the join and, once
//! every build row is seen, publishes the min/max and bloom filter of each join key into the
//! join's [`FilterSlot`].

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::functions_aggregate::min_max::{MaxAccumulator, MinAccumulator};
use datafusion::logical_expr::Accumulator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::{Stream, StreamExt};
use nyala_storage::{JoinFilter, Scalar};

use crate::exec::runtime_filter::filter::{FilterSlot, KeyFilter};
use crate::session::settings::RuntimeFilterMode;

/// Build sides with more keys than this get a bloom filter sized for this many (its
/// false-positive rate rises, its size does not): 4 M keys, about 5 MB.
const MAX_BLOOM_KEYS: usize = 4 << 20;
/// Above this many build keys no bloom filter is built at all (min/max still is).
const MAX_KEYS_KEPT: usize = 16 << 20;

/// Passes a hash join's build side through and builds the key filters from it.
#[derive(Debug)]
pub struct RuntimeFilterBuildExec {
    input: Arc<dyn ExecutionPlan>,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    /// The keys' types.
    types: Vec<DataType>,
    slot: Arc<FilterSlot>,
    mode: RuntimeFilterMode,
    pass_nulls: bool,
    state: Arc<Mutex<BuildState>>,
}

#[derive(Debug, Default)]
struct BuildState {
    /// Input partitions not yet finished.
    running: usize,
    /// Per key: the values seen (until there are too many), min and max accumulators, how
    /// many values were not NULL and whether one was.
    values: Vec<Vec<ArrayRef>>,
    rows: usize,
    non_null: Vec<usize>,
    nulls: Vec<bool>,
    mins: Vec<Option<MinAccumulator>>,
    maxs: Vec<Option<MaxAccumulator>>,
}

impl RuntimeFilterBuildExec {
    pub(crate) fn try_new(
        input: Arc<dyn ExecutionPlan>,
        keys: Vec<Arc<dyn PhysicalExpr>>,
        slot: Arc<FilterSlot>,
        mode: RuntimeFilterMode,
        pass_nulls: bool,
    ) -> Result<Self> {
        let schema = input.schema();
        let types = keys
            .iter()
            .map(|k| k.data_type(&schema))
            .collect::<Result<Vec<DataType>>>()?;
        let state = BuildState {
            running: input.output_partitioning().partition_count(),
            values: vec![Vec::new(); keys.len()],
            rows: 0,
            non_null: vec![0; keys.len()],
            nulls: vec![false; keys.len()],
            mins: types
                .iter()
                .map(|t| MinAccumulator::try_new(t).ok())
                .collect(),
            maxs: types
                .iter()
                .map(|t| MaxAccumulator::try_new(t).ok())
                .collect(),
        };
        Ok(Self {
            input,
            keys,
            types,
            slot,
            mode,
            pass_nulls,
            state: Arc::new(Mutex::new(state)),
        })
    }

    fn observe(&self, batch: &RecordBatch) -> Result<()> {
        let columns = self
            .keys
            .iter()
            .map(|k| k.evaluate(batch)?.into_array(batch.num_rows()))
            .collect::<Result<Vec<_>>>()?;
        let mut state = self.state.lock().map_err(poisoned)?;
        state.rows += batch.num_rows();
        let keep_values = self.mode == RuntimeFilterMode::Bloom && state.rows <= MAX_KEYS_KEPT;
        for (i, column) in columns.into_iter().enumerate() {
            state.non_null[i] += column.len() - column.null_count();
            state.nulls[i] |= column.null_count() > 0;
            if let Some(min) = &mut state.mins[i] {
                min.update_batch(std::slice::from_ref(&column))?;
            }
            if let Some(max) = &mut state.maxs[i] {
                max.update_batch(std::slice::from_ref(&column))?;
            }
            if keep_values {
                state.values[i].push(column);
            } else {
                state.values[i].clear();
            }
        }
        Ok(())
    }

    /// Called when an input partition ends; the last one publishes the filters.
    fn finish_partition(&self) -> Result<()> {
        let mut state = self.state.lock().map_err(poisoned)?;
        state.running = state.running.saturating_sub(1);
        if state.running > 0 {
            return Ok(());
        }
        let mut filters = Vec::with_capacity(self.keys.len());
        for i in 0..self.keys.len() {
            let bound = |v: Option<ScalarValue>| {
                v.filter(|v| !v.is_null())
                    .and_then(|v| v.to_array_of_size(1).ok())
                    .map(Scalar)
            };
            let min = bound(state.mins[i].as_mut().and_then(|m| m.evaluate().ok()));
            let max = bound(state.maxs[i].as_mut().and_then(|m| m.evaluate().ok()));
            let values = std::mem::take(&mut state.values[i]);
            // With NULL = NULL semantics a NULL build key matches NULL probe rows, which
            // bounds would remove.
            let nulls_match = self.pass_nulls && state.nulls[i];
            let bounds = if nulls_match { None } else { min.zip(max) };
            let mut filter = JoinFilter::new(self.types[i].clone(), bounds, nulls_match);
            if self.mode == RuntimeFilterMode::Bloom && state.rows <= MAX_KEYS_KEPT {
                // Types the bloom filter cannot hash just get no bloom filter.
                let _ = filter.add_bloom(&values, MAX_BLOOM_KEYS);
            }
            let useful = filter.bounds().is_some() || filter.has_bloom();
            filters.push(KeyFilter {
                no_keys: state.non_null[i] == 0 && !nulls_match,
                filter: useful.then(|| Arc::new(filter)),
            });
        }
        self.slot.publish(filters);
        Ok(())
    }
}

fn poisoned<T>(_: T) -> DataFusionError {
    DataFusionError::Internal("runtime filter state poisoned".into())
}

impl DisplayAs for RuntimeFilterBuildExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> = self.keys.iter().map(|k| k.to_string()).collect();
        write!(
            f,
            "RuntimeFilterBuildExec: #{} keys=[{}], mode={:?}",
            self.slot.id(),
            keys.join(", "),
            self.mode
        )
    }
}

impl ExecutionPlan for RuntimeFilterBuildExec {
    fn name(&self) -> &str {
        "RuntimeFilterBuildExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        for key in &self.keys {
            if f(key)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children.pop().ok_or_else(|| {
            DataFusionError::Internal("RuntimeFilterBuildExec needs an input".into())
        })?;
        Ok(Arc::new(Self::try_new(
            input,
            self.keys.clone(),
            self.slot.clone(),
            self.mode,
            self.pass_nulls,
        )?))
    }

    /// A run again (each step of a recursive query runs a reset copy of its plan) builds the
    /// filters anew: the probe-side scans, which share the slot, must wait for this run's
    /// keys instead of taking the last run's.
    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        self.slot.reset();
        Ok(Arc::new(Self::try_new(
            self.input.clone(),
            self.keys.clone(),
            self.slot.clone(),
            self.mode,
            self.pass_nulls,
        )?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let build = Arc::new(Self {
            input: self.input.clone(),
            keys: self.keys.clone(),
            types: self.types.clone(),
            slot: self.slot.clone(),
            mode: self.mode,
            pass_nulls: self.pass_nulls,
            state: self.state.clone(),
        });
        Ok(Box::pin(BuildStream {
            input,
            build,
            done: false,
        }))
    }
}

struct BuildStream {
    input: SendableRecordBatchStream,
    build: Arc<RuntimeFilterBuildExec>,
    done: bool,
}

impl Stream for BuildStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let item = match self.input.poll_next_unpin(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(item) => item,
        };
        let item = match item {
            Some(Ok(batch)) => Some(self.build.observe(&batch).map(|()| batch)),
            Some(Err(e)) => Some(Err(e)),
            None => {
                self.done = true;
                return Poll::Ready(self.build.finish_partition().err().map(Err));
            }
        };
        Poll::Ready(item)
    }
}

impl RecordBatchStream for BuildStream {
    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }
}
