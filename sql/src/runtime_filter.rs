//! Runtime filters: when a hash join's build side is small, the min/max and a bloom filter of
//! its join keys are pushed into the Nyala scans of the probe side, so tablets skip rowsets,
//! row groups and rows that cannot match instead of shipping the whole table to the join
//! (`kudu-bloom-filter-predicate.txt`).
//!
//! [`RuntimeFilterRule`] (a physical optimizer rule) finds hash joins that collect their build
//! side (`PartitionMode::CollectLeft`) and whose probe-side join keys are columns of a Nyala
//! table reached through projections, filters and repartitioning only. It wraps the build side
//! in a [`RuntimeFilterBuildExec`], which passes the build rows through to the join and, when
//! they are all seen, publishes one [`KeyFilter`] per key into a shared [`FilterSlot`]. Each
//! probe-side [`NyalaScanExec`] waits for the slot before it starts its tablet scan and adds the
//! filters to the scan's predicates. The join polls its probe side only after the build side
//! is complete, so the wait never holds anything up.
//!
//! The filters are an optimisation only: the join still matches every row exactly, so a filter
//! may be skipped (unsupported types, a bloom filter that switched itself off) at any point.
//! `SET nyala.runtime_filters = 'off' | 'minmax' | 'bloom'` chooses what is built (default
//! `bloom`: min/max and bloom); `off` also ignores DataFusion's own dynamic filters.

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{JoinType, NullEquality, ScalarValue};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::functions_aggregate::min_max::{MaxAccumulator, MinAccumulator};
use datafusion::logical_expr::Accumulator;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::{Stream, StreamExt};
use nyala_storage::{ColumnPredicate, JoinFilter, PredicateOp, Scalar};
use tokio::sync::watch;

use crate::scan::NyalaScanExec;
use crate::settings::NyalaOptions;

/// Build sides with more keys than this get a bloom filter sized for this many (its
/// false-positive rate rises, its size does not): 4 M keys, about 5 MB.
const MAX_BLOOM_KEYS: usize = 4 << 20;
/// Above this many build keys no bloom filter is built at all (min/max still is).
const MAX_KEYS_KEPT: usize = 16 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeFilterMode {
    Off,
    MinMax,
    Bloom,
}

impl RuntimeFilterMode {
    pub fn parse(value: &str) -> Option<Self> {
        match value.to_ascii_lowercase().as_str() {
            "off" | "false" | "none" => Some(Self::Off),
            "minmax" | "min_max" => Some(Self::MinMax),
            "bloom" | "on" | "true" => Some(Self::Bloom),
            _ => None,
        }
    }

    pub fn of(config: &ConfigOptions) -> Self {
        config
            .extensions
            .get::<NyalaOptions>()
            .and_then(|o| Self::parse(&o.runtime_filters))
            .unwrap_or(Self::Bloom)
    }
}

/// The filter for one join key, built from the build side's values of that key.
#[derive(Debug)]
pub struct KeyFilter {
    /// No probe row can match: the build side has no key that matches anything.
    pub no_keys: bool,
    /// Bounds and bloom filter of the keys (None: nothing to filter with, e.g. NULL = NULL
    /// joins without a bloom filter).
    pub filter: Option<Arc<JoinFilter>>,
}

impl KeyFilter {
    /// The scan predicates on table column `column` that this filter implies.
    pub fn predicates(&self, column: usize) -> Vec<ColumnPredicate> {
        let op = if self.no_keys {
            PredicateOp::InList(vec![])
        } else if let Some(filter) = &self.filter {
            PredicateOp::join_filter(filter.clone())
        } else {
            return vec![];
        };
        vec![ColumnPredicate { column, op }]
    }

    fn describe(&self) -> String {
        if self.no_keys {
            return "no build keys".into();
        }
        let Some(filter) = &self.filter else {
            return "none".into();
        };
        let mut parts = Vec::new();
        if let Some((min, max)) = filter.bounds() {
            let value = |s: &Scalar| {
                ScalarValue::try_from_array(&s.0, 0)
                    .map_or_else(|e| e.to_string(), |v| v.to_string())
            };
            parts.push(format!("min={}, max={}", value(min), value(max)));
        }
        if filter.has_bloom() {
            parts.push(format!("bloom({} keys)", filter.num_keys()));
        }
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        let stats = &filter.stats;
        parts.push(format!(
            "checked={}, removed={}{}",
            load(&stats.checked),
            load(&stats.removed),
            if stats.disabled() {
                ", switched off"
            } else {
                ""
            }
        ));
        parts.join(", ")
    }
}

/// Where a build side publishes its key filters for the probe-side scans.
pub struct FilterSlot {
    id: usize,
    filters: watch::Sender<Option<Arc<Vec<KeyFilter>>>>,
}

impl fmt::Debug for FilterSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FilterSlot({})", self.id)
    }
}

impl FilterSlot {
    fn new(id: usize) -> Arc<Self> {
        Arc::new(FilterSlot {
            id,
            filters: watch::channel(None).0,
        })
    }

    /// The published filters, waiting for them if the build side is still running.
    pub async fn wait(&self) -> Arc<Vec<KeyFilter>> {
        let mut rx = self.filters.subscribe();
        let published = rx.wait_for(Option::is_some).await;
        // The sender lives in `self`, so waiting can only end with a value.
        match published {
            Ok(filters) => filters.clone().unwrap_or_default(),
            Err(_) => Arc::default(),
        }
    }

    /// A one-line account of the filters for EXPLAIN (ANALYZE).
    pub fn describe(&self, key: usize) -> String {
        match self.filters.borrow().as_ref().and_then(|f| f.get(key)) {
            Some(filter) => format!("#{}: {}", self.id, filter.describe()),
            None => format!("#{}: pending", self.id),
        }
    }
}

/// A runtime filter as a probe-side scan sees it: which key of which slot, on which column.
#[derive(Debug, Clone)]
pub struct RuntimeFilter {
    pub slot: Arc<FilterSlot>,
    pub key: usize,
    /// The table column the key is compared with.
    pub column: usize,
}

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
    fn try_new(
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
        self.slot.filters.send_replace(Some(Arc::new(filters)));
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
            self.slot.id,
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

/// The physical optimizer rule that attaches runtime filters to hash joins over Nyala scans.
#[derive(Debug, Default)]
pub struct RuntimeFilterRule {
    next_id: std::sync::atomic::AtomicUsize,
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
        "nyala_runtime_filters"
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
        if *join.partition_mode() != PartitionMode::CollectLeft
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
/// limits none).
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
    let child_column = if let Some(projection) = plan.downcast_ref::<ProjectionExec>() {
        let expr = &projection.expr().get(column)?.expr;
        expr.downcast_ref::<Column>()?.index()
    } else if let Some(filter_exec) = plan.downcast_ref::<FilterExec>() {
        match filter_exec.projection() {
            Some(p) => *p.get(column)?,
            None => column,
        }
    } else if matches!(
        plan.name(),
        "RepartitionExec"
            | "CoalesceBatchesExec"
            | "CoalescePartitionsExec"
            | "CooperativeExec"
            | "SortExec"
    ) {
        column
    } else {
        return None;
    };
    // Below a limit (a TopK sort, a fetch), removing rows would change which rows are kept.
    if plan.fetch().is_some() {
        return None;
    }
    let child = plan.children().first().copied()?.clone();
    let new_child = attach_to_scan(&child, child_column, filter, replaces)?;
    replace_children(plan, vec![new_child]).ok()
}

fn replace_children(
    plan: &Arc<dyn ExecutionPlan>,
    children: Vec<Arc<dyn ExecutionPlan>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let options = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
    plan.clone().replace_children(children, options)
}
