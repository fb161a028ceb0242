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
//! is complete, so the wait never holds anything up. A plan run again (each step of a
//! recursive query) empties the slot first: its scans wait for that run's keys.
//!
//! DataFusion's own dynamic filters (a hash join's keys, a TopK's threshold) reach the scans
//! through DataFusion's filter pushdown, which in DataFusion 55 finds a filter's column in an
//! operator's input by *name*. Where a schema names two columns alike (`b.id` and `c.id` after
//! a join) a filter on the second lands on the first (apache/datafusion#25244, #25296): a scan
//! would drop rows by another column's values, even on the side an outer join preserves. So
//! the rule first follows each dynamic filter down by column position and takes it from the
//! scans it did not reach that way (`keep_routed_dynamic_filters`).
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
use datafusion::physical_plan::aggregates::AggregateExec;
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

use crate::exec::scan::NyalaScanExec;
use crate::session::settings::NyalaOptions;

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

    /// A run again (each step of a recursive query runs a reset copy of its plan) builds the
    /// filters anew: the probe-side scans, which share the slot, must wait for this run's
    /// keys instead of taking the last run's.
    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        self.slot.filters.send_replace(None);
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
        let plan = keep_routed_dynamic_filters(&plan, &[])?.data;
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
        // Only a join that collects its build side (one partition, run once) has every key in
        // one place: a partitioned join's build partitions each hold one hash partition's.
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
/// they were made for: those whose keys there are the keys of a route into the scan. `routes`
/// are the filters on their way into `plan` from above.
fn keep_routed_dynamic_filters(
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
        let child = keep_routed_dynamic_filters(child, &into_child)?;
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
