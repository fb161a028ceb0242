//! `NyalaScanExec`: the physical scan of a Nyala table, one DataFusion partition per tablet that
//! the predicates on the hash columns leave (partition pruning).
//!
//! Each partition runs its tablet scan (projection, predicates and limit pushed into storage) on
//! a blocking thread and hands the Arrow batches over a small bounded channel, so a slow consumer
//! holds back the scan instead of letting batches pile up in memory.

use std::fmt;
use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, Field, SchemaRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{ScalarValue, Statistics};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::DynamicFilterPhysicalExpr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterPushdownPhase, FilterPushdownPropagation, PushedDown,
};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use datafusion_distributed::DistributedTaskContext;
use futures::TryStreamExt;
use nyala_engine::{Client, TableHandle};
use nyala_storage::{ScanSpec, Timestamp};

use crate::catalog::predicate::physical_to_predicates;
use crate::exec::runtime_filter::filter::RuntimeFilter;
use crate::exec::runtime_filter::tablet_keys::narrowed_to_tablet;
use crate::session::settings::RuntimeFilterMode;
use crate::session::transaction::TxnSlot;

/// Longest dynamic filter text shown by EXPLAIN (IN lists from joins can be long).
const MAX_FILTER_TEXT: usize = 200;

/// Batches buffered per partition between the storage thread and DataFusion.
const CHANNEL_DEPTH: usize = 2;

#[derive(Debug, Clone)]
pub struct NyalaScanExec {
    client: Client,
    table: TableHandle,
    spec: ScanSpec,
    /// The pushed filters as SQL text, for EXPLAIN.
    pushed: Vec<String>,
    /// Filters built by joins at run time ([`crate::exec::runtime_filter`]), awaited before scanning.
    runtime: Vec<RuntimeFilter>,
    /// DataFusion's dynamic filters pushed down from joins and TopK, converted to tablet
    /// predicates where possible when the scan starts.
    dynamic: Vec<Arc<dyn PhysicalExpr>>,
    dynamic_mode: RuntimeFilterMode,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    /// The tablets (hash buckets) scanned, one partition each: those the predicates on the hash
    /// columns leave.
    tablets: Vec<usize>,
    /// The snapshot every tablet is read at, pinned for the whole statement when it runs
    /// ([`pin_snapshot`]); None: each tablet's own safe snapshot.
    snapshot: Option<Timestamp>,
    /// Set by `AS OF`: the snapshot is the user's, and the statement's does not replace it.
    as_of: bool,
    /// The statistics of each partition and of all, worked out when the planner first asks.
    statistics: Arc<std::sync::OnceLock<ScanStatistics>>,
    /// Set for a queue's long poll: a tablet whose scan finds no rows waits for some until
    /// then (see [`nyala_engine::Client::scan_tablet_waiting`]).
    wait_until: Option<tokio::time::Instant>,
    /// The filters storage applies, over the table's columns: they scale the statistics.
    /// (Most are exact and DataFusion does not filter again; one on a parameter it does, and
    /// its selectivity then counts twice in the estimate.)
    exact_filter: Option<Arc<dyn PhysicalExpr>>,
    /// In a distributed plan, which of `tablets` each task of the scan's stage reads (see
    /// [`crate::distributed`]); None: every partition is one of `tablets`.
    tasks: Option<Arc<TaskSplit>>,
}

/// The tablets of a scan split between the tasks of a distributed stage, each task's tablets
/// led by one tablet server, where the task runs.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSplit {
    /// Each task's tablets (by number); partition `p` of task `t` reads `tablets[t][p]`.
    pub tablets: Vec<Vec<usize>>,
    /// The internal RPC address of the server leading each task's tablets (empty: unknown).
    pub servers: Vec<String>,
}

/// What a decoded scan is made of (see [`NyalaScanExec::from_parts`]).
pub struct ScanParts {
    pub spec: ScanSpec,
    pub pushed: Vec<String>,
    pub tablets: Vec<usize>,
    pub snapshot: Option<Timestamp>,
    pub as_of: bool,
    pub tasks: Option<TaskSplit>,
}

/// A scan's statistics: per partition (tablet), and for the whole scan.
#[derive(Debug)]
struct ScanStatistics {
    partitions: Vec<Arc<Statistics>>,
    total: Arc<Statistics>,
}

/// The snapshot a statement reads at: the newest safe snapshot of the tablets its Nyala scans
/// read (None when it reads no table), so it sees one consistent state of all of them that
/// holds every write acknowledged before it started (see [`nyala_engine::Client::safe_snapshot`]).
pub async fn statement_snapshot(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<Timestamp>> {
    let mut scans = Vec::new();
    plan.apply(|node| {
        // A scan whose predicates leave no tablet reads nothing at any snapshot.
        let reads = |s: &&NyalaScanExec| !s.as_of && !s.tablets.is_empty();
        if let Some(scan) = node.downcast_ref::<NyalaScanExec>().filter(reads) {
            scans.push((
                scan.client.clone(),
                scan.table.clone(),
                scan.tablets.clone(),
            ));
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let mut snapshot: Option<Timestamp> = None;
    for (client, table, tablets) in scans {
        let safe = client
            .safe_snapshot_of(&table, &tablets)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        snapshot = Some(snapshot.map_or(safe, |s| s.max(safe)));
    }
    Ok(snapshot)
}

/// `plan` with every Nyala scan reading at `snapshot`.
pub fn with_snapshot(
    plan: Arc<dyn ExecutionPlan>,
    snapshot: Timestamp,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(
        |node| match node.downcast_ref::<NyalaScanExec>().filter(|s| !s.as_of) {
            Some(scan) => {
                let mut scan = scan.clone();
                scan.snapshot = Some(snapshot);
                Ok(Transformed::yes(Arc::new(scan) as Arc<dyn ExecutionPlan>))
            }
            None => Ok(Transformed::no(node)),
        },
    )
    .map(|t| t.data)
}

/// How far ahead of this machine's clock a snapshot handed back by a client (in a ticket) may
/// be: the tablets' clocks that chose it may run a little ahead of this one.
const MAX_SNAPSHOT_AHEAD: std::time::Duration = std::time::Duration::from_secs(10);

/// A snapshot that came back from a client, as a [`Timestamp`] to read at, unless it lies
/// further in the future than clocks can differ: reading at it would move the clocks of the
/// tablets read past it, and with them the timestamps of every later write.
pub fn returned_snapshot(snapshot: u64) -> crate::Result<Timestamp> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let latest = u64::try_from((now + MAX_SNAPSHOT_AHEAD).as_micros()).unwrap_or(u64::MAX);
    match Timestamp(snapshot) {
        ts if ts.micros() <= latest => Ok(ts),
        ts => Err(crate::SqlError::Invalid(format!(
            "snapshot {} is in the future; run the query again",
            ts.display()
        ))),
    }
}

/// `plan` with every Nyala scan reading at the statement's snapshot ([`statement_snapshot`]).
pub async fn pin_snapshot(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    match statement_snapshot(&plan).await? {
        Some(snapshot) => with_snapshot(plan, snapshot),
        None => Ok(plan),
    }
}

/// The schema of all of `table`'s columns as a scan by `spec` returns them.
fn full_schema(table: &TableHandle, spec: &ScanSpec) -> SchemaRef {
    match spec.string_views {
        true => table.schema.arrow_view_schema(),
        false => table.schema.arrow_schema(),
    }
}

/// `schema` (a table's, or the columns a scan of it returns) with the columns a diff scan adds
/// (see [`ScanSpec::changes_since`]): every table column nullable (a deleted key's other
/// columns may be NULL), then the change (a `Utf8View` with `string_views`) and its time.
pub fn with_change_columns(schema: &SchemaRef, string_views: bool) -> SchemaRef {
    let strings = match string_views {
        true => DataType::Utf8View,
        false => DataType::Utf8,
    };
    let [change, time] = nyala_storage::change_fields();
    let fields: Vec<Field> = (schema.fields().iter())
        .map(|f| f.as_ref().clone().with_nullable(true))
        .chain([change.with_data_type(strings), time])
        .collect();
    Arc::new(arrow::datatypes::Schema::new(fields))
}

impl NyalaScanExec {
    /// The id of the table scanned.
    pub fn table_id(&self) -> &str {
        &self.table.id
    }

    /// The table scanned.
    pub fn table(&self) -> &TableHandle {
        &self.table
    }

    /// The client the scan reads through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Whether the scan is a queue's long poll (its tablets wait for rows).
    pub fn waits(&self) -> bool {
        self.wait_until.is_some()
    }

    /// The tablets (by number) the scan reads.
    pub fn tablets(&self) -> &[usize] {
        &self.tablets
    }

    /// The snapshot the scan reads at, once pinned.
    pub fn snapshot(&self) -> Option<Timestamp> {
        self.snapshot
    }

    /// Whether the scan reads the table `AS OF` a time the user chose.
    pub fn is_as_of(&self) -> bool {
        self.as_of
    }

    pub fn try_new(
        client: Client,
        table: TableHandle,
        spec: ScanSpec,
        pushed: Vec<String>,
    ) -> Result<Self> {
        let full = full_schema(&table, &spec);
        let schema = match &spec.projection {
            Some(p) => Arc::new(full.project(p)?),
            None => full,
        };
        // With no tablet to scan, the one partition of the plan is empty.
        let tablets = table.partition.prune(&table.schema, &spec.predicates);
        let properties = scan_properties(&schema, tablets.len());
        Ok(Self {
            client,
            table,
            spec,
            pushed,
            runtime: Vec::new(),
            dynamic: Vec::new(),
            dynamic_mode: RuntimeFilterMode::Bloom,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
            tablets,
            snapshot: None,
            as_of: false,
            statistics: Arc::default(),
            wait_until: None,
            exact_filter: None,
            tasks: None,
        })
    }

    /// What [`Self::from_parts`] rebuilds the scan from on another server. (Runtime filters
    /// stay behind: joins of this process fill them in; DataFusion's dynamic filters travel on
    /// their own, see [`Self::with_dynamic_filters`].)
    pub fn parts(&self) -> ScanParts {
        ScanParts {
            spec: self.spec.clone(),
            pushed: self.pushed.clone(),
            tablets: self.tablets.clone(),
            snapshot: self.snapshot,
            as_of: self.as_of,
            tasks: self.tasks.as_deref().cloned(),
        }
    }

    /// The scan of `table` that [`Self::parts`] described, reading through `client`.
    pub fn from_parts(client: Client, table: TableHandle, parts: ScanParts) -> Result<Self> {
        let changes_since = parts.spec.changes_since;
        let mut scan = Self::try_new(client, table, parts.spec, parts.pushed)?;
        if let Some(since) = changes_since {
            scan = scan.changes_since(since);
        }
        if parts.tablets.iter().any(|&t| t >= scan.table.tablets.len()) {
            return Err(DataFusionError::Internal(format!(
                "a scan of {} names a tablet it does not have",
                scan.table.name
            )));
        }
        scan.tablets = parts.tablets;
        scan.snapshot = parts.snapshot;
        scan.as_of = parts.as_of;
        Ok(match parts.tasks {
            Some(tasks) => scan.split(tasks),
            None => scan.with_partitions(scan.tablets.len()),
        })
    }

    /// The scan as the tasks of a distributed stage read it: task `t` reads `tasks.tablets[t]`,
    /// one partition each (a task with fewer tablets has empty partitions).
    pub fn split(&self, tasks: TaskSplit) -> Self {
        let partitions = tasks.tablets.iter().map(Vec::len).max().unwrap_or(0);
        let mut scan = self.with_partitions(partitions);
        scan.tasks = Some(Arc::new(tasks));
        scan.statistics = Arc::default();
        scan
    }

    /// The task split, in a distributed plan.
    pub fn task_split(&self) -> Option<&TaskSplit> {
        self.tasks.as_deref()
    }

    /// The scan with `partitions` partitions (at least one).
    fn with_partitions(&self, partitions: usize) -> Self {
        let mut scan = self.clone();
        scan.properties = scan_properties(&self.schema, partitions);
        scan
    }

    /// The tablet partition `partition` reads in the task `context` runs (None: none).
    fn tablet_of(&self, partition: usize, context: &Arc<TaskContext>) -> Option<usize> {
        match &self.tasks {
            None => self.tablets.get(partition).copied(),
            Some(tasks) => {
                let task = DistributedTaskContext::from_ctx(context).task_index;
                tasks.tablets.get(task)?.get(partition).copied()
            }
        }
    }

    /// The number of partitions the scan has.
    fn partitions(&self) -> usize {
        self.properties.partitioning.partition_count()
    }

    /// This scan, whose statistics estimate what passes `filter` (over the table's columns):
    /// the filters DataFusion left to storage alone.
    pub fn with_exact_filter(self, filter: Option<Arc<dyn PhysicalExpr>>) -> Self {
        Self {
            exact_filter: filter,
            statistics: Arc::default(),
            ..self
        }
    }

    /// The scan as a diff scan: the rows whose keys changed after `since` and up to its
    /// snapshot, with their change and its time after the columns (see
    /// [`ScanSpec::changes_since`]). Planners know nothing of their number.
    pub fn changes_since(mut self, since: Timestamp) -> Self {
        self.spec.changes_since = Some(since);
        self.schema = with_change_columns(&self.schema, self.spec.string_views);
        self.properties = scan_properties(&self.schema, self.partitions());
        self
    }

    /// The scan reading at `snapshot` whatever the statement's snapshot is.
    pub fn pinned_at(self, snapshot: Timestamp) -> Self {
        Self {
            snapshot: Some(snapshot),
            as_of: true,
            ..self
        }
    }

    /// The scan, each of whose tablets waits until `deadline` for rows if it has none.
    pub fn waiting_until(self, deadline: tokio::time::Instant) -> Self {
        Self {
            wait_until: Some(deadline),
            ..self
        }
    }

    /// Whether joins or TopK hand this scan filters while the query runs (so its plan cannot
    /// run a second time as it is).
    pub fn has_runtime_filters(&self) -> bool {
        !self.runtime.is_empty() || !self.dynamic.is_empty()
    }

    /// The row limit pushed into storage, if any.
    pub fn limit(&self) -> Option<usize> {
        self.spec.limit
    }

    /// The table column of output column `column`.
    pub fn table_column(&self, column: usize) -> Option<usize> {
        match &self.spec.projection {
            Some(p) => p.get(column).copied(),
            None => (column < self.schema.fields().len()).then_some(column),
        }
    }

    /// Statistics of every tablet scanned, from the tablets' row counts and the ranges their
    /// files record (all inexact: rows in memory and updates are not in the ranges; the scan's
    /// predicates are not applied). A single-column primary key has as many values as rows.
    fn compute_statistics(&self) -> ScanStatistics {
        if self.spec.changes_since.is_some() {
            let unknown = Arc::new(Statistics::new_unknown(&self.schema));
            return ScanStatistics {
                partitions: vec![unknown.clone(); self.tablets.len()],
                total: unknown,
            };
        }
        let full = full_schema(&self.table, &self.spec);
        let unique_key = match self.table.schema.key_columns() {
            [key] => Some(*key),
            _ => None,
        };
        // Ranges are stored values (`Utf8` strings); the scan's types may differ (`Utf8View`).
        let inexact = |range: Option<&ArrayRef>, c: usize| {
            range
                .and_then(|values| ScalarValue::try_from_array(values, 0).ok())
                .and_then(|value| value.cast_to(full.field(c).data_type()).ok())
                .map_or(Precision::Absent, Precision::Inexact)
        };
        let tablet = |b: usize| {
            let rows = self.client.estimated_rows(&self.table, Some(b));
            let ranges = self.client.column_ranges(&self.table, b);
            let mut statistics = Statistics::new_unknown(&full);
            statistics.num_rows = Precision::Inexact(rows);
            for (c, stats) in statistics.column_statistics.iter_mut().enumerate() {
                if let Some(range) = ranges.get(c) {
                    stats.min_value = inexact(range.min.as_ref(), c);
                    stats.max_value = inexact(range.max.as_ref(), c);
                    stats.null_count = range
                        .null_count
                        .map_or(Precision::Absent, |n| Precision::Inexact(n as usize));
                }
                if unique_key == Some(c) {
                    stats.distinct_count = Precision::Inexact(rows);
                }
            }
            statistics
        };
        let tablets: Vec<Statistics> = self.tablets.iter().map(|&b| tablet(b)).collect();
        let mut total = Statistics::try_merge_iter(&tablets, &full)
            .unwrap_or_else(|_| Statistics::new_unknown(&full));
        // Tablets hold different keys: their distinct key values add up.
        if let Some(stats) = unique_key.and_then(|c| total.column_statistics.get_mut(c)) {
            stats.distinct_count = total.num_rows;
        }
        let columns = self.table_columns();
        let finish = |statistics: Statistics| {
            Arc::new(self.filtered(statistics, &full).project(Some(&columns)))
        };
        ScanStatistics {
            partitions: tablets.into_iter().map(finish).collect(),
            total: finish(total),
        }
    }

    /// `statistics` (over the table's columns) scaled by the filters storage applies exactly,
    /// as DataFusion estimates a filter's.
    fn filtered(&self, statistics: Statistics, full: &SchemaRef) -> Statistics {
        let Some(filter) = &self.exact_filter else {
            return statistics;
        };
        let input = Arc::new(EmptyExec::new(full.clone()));
        let estimate = FilterExec::try_new(filter.clone(), input).and_then(|exec| {
            exec.statistics_from_inputs(&[Arc::new(statistics.clone())], &StatisticsArgs::new())
        });
        match estimate {
            Ok(estimate) => estimate.as_ref().clone(),
            Err(_) => statistics,
        }
    }

    fn table_columns(&self) -> Vec<usize> {
        (0..self.schema.fields().len())
            .filter_map(|c| self.table_column(c))
            .collect()
    }

    /// This scan with `filter` added; DataFusion's dynamic filters from the same join
    /// (`replaces`, by expression id) are dropped, as the runtime filter does their work.
    pub fn with_runtime_filter(&self, filter: RuntimeFilter, replaces: &[u64]) -> Self {
        let mut scan = self.clone();
        scan.runtime.push(filter);
        scan.dynamic
            .retain(|d| d.expression_id().is_none_or(|id| !replaces.contains(&id)));
        scan
    }

    /// DataFusion's dynamic filters handed to this scan, and what it makes of them.
    pub fn dynamic_filters(&self) -> &[Arc<dyn PhysicalExpr>] {
        &self.dynamic
    }

    /// How the scan turns DataFusion's dynamic filters into storage predicates.
    pub fn dynamic_mode(&self) -> RuntimeFilterMode {
        self.dynamic_mode
    }

    /// This scan with DataFusion's dynamic filters `dynamic`, used as `mode` says (a scan
    /// rebuilt on another server, its filters shared with the joins decoded with it).
    pub fn with_dynamic_filters(
        self,
        dynamic: Vec<Arc<dyn PhysicalExpr>>,
        mode: RuntimeFilterMode,
    ) -> Self {
        Self {
            dynamic,
            dynamic_mode: mode,
            ..self
        }
    }

    /// This scan with only the dynamic filters that `keep` accepts.
    pub fn retaining_dynamic_filters(&self, keep: impl Fn(&Arc<dyn PhysicalExpr>) -> bool) -> Self {
        let mut scan = self.clone();
        scan.dynamic.retain(|d| keep(d));
        scan
    }

    /// The scan spec with the runtime and dynamic filters known now added.
    async fn spec_with_filters(
        spec: ScanSpec,
        runtime: Vec<RuntimeFilter>,
        dynamic: Vec<Arc<dyn PhysicalExpr>>,
        dynamic_mode: RuntimeFilterMode,
        schema: nyala_storage::Schema,
        columns: Vec<usize>,
    ) -> Result<ScanSpec> {
        let mut spec = spec;
        for filter in &runtime {
            let filters = filter.slot.wait().await;
            if let Some(key) = filters.get(filter.key) {
                spec.predicates.extend(key.predicates(filter.column));
            }
        }
        if dynamic_mode != RuntimeFilterMode::Off {
            for expr in &dynamic {
                let current = match expr.downcast_ref::<DynamicFilterPhysicalExpr>() {
                    Some(dynamic) => dynamic.current()?,
                    None => expr.clone(),
                };
                let in_lists = dynamic_mode == RuntimeFilterMode::Bloom;
                spec.predicates.extend(physical_to_predicates(
                    &schema, &columns, &current, in_lists,
                ));
            }
        }
        Ok(spec)
    }
}

/// The properties of a scan returning `schema` in `partitions` partitions (at least one).
fn scan_properties(schema: &SchemaRef, partitions: usize) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema.clone()),
        Partitioning::UnknownPartitioning(partitions.max(1)),
        EmissionType::Incremental,
        Boundedness::Bounded,
    ))
}

fn shorten(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

impl DisplayAs for NyalaScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let columns: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        write!(f, "NyalaScanExec: table={}, ", self.table.name)?;
        if self.tablets.len() == self.table.tablets.len() {
            write!(f, "tablets={}", self.tablets.len())?;
        } else {
            write!(
                f,
                "tablets={} of {}",
                self.tablets.len(),
                self.table.tablets.len()
            )?;
        }
        if let Some(tasks) = &self.tasks {
            let described: Vec<String> = (tasks.tablets.iter().enumerate())
                .map(|(t, tablets)| {
                    let server = tasks.servers.get(t).map_or("", String::as_str);
                    format!("{t}@{server}: {tablets:?}")
                })
                .collect();
            write!(f, ", tasks=[{}]", described.join("; "))?;
        }
        write!(f, ", projection=[{}]", columns.join(", "))?;
        if !self.pushed.is_empty() {
            write!(f, ", predicates=[{}]", self.pushed.join(" AND "))?;
        }
        if let Some(limit) = self.spec.limit {
            write!(f, ", limit={limit}")?;
        }
        if let Some(snapshot) = self.snapshot.filter(|_| self.as_of) {
            write!(f, ", as_of={}", snapshot.display())?;
        } else if let Some(snapshot) = self.snapshot {
            write!(f, ", snapshot={}", snapshot.0)?;
        }
        if !self.runtime.is_empty() {
            let filters: Vec<String> = self
                .runtime
                .iter()
                .map(|r| {
                    let column = &self.table.schema.columns()[r.column].name;
                    format!("{column} {}", r.slot.describe(r.key))
                })
                .collect();
            write!(f, ", runtime_filters=[{}]", filters.join("; "))?;
        }
        if !self.dynamic.is_empty() {
            let filters: Vec<String> = self
                .dynamic
                .iter()
                .map(|d| match d.downcast_ref::<DynamicFilterPhysicalExpr>() {
                    Some(dynamic) => dynamic
                        .current()
                        .map(|c| c.to_string())
                        .unwrap_or_else(|e| e.to_string()),
                    None => d.to_string(),
                })
                .map(|text| shorten(text, MAX_FILTER_TEXT))
                .collect();
            write!(f, ", dynamic_filters=[{}]", filters.join("; "))?;
        }
        Ok(())
    }
}

impl ExecutionPlan for NyalaScanExec {
    fn name(&self) -> &str {
        "NyalaScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    /// The dynamic filters this scan consumes: a hash join only fills in its dynamic filter
    /// when it finds a consumer below it.
    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        for expr in &self.dynamic {
            if f(expr)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "NyalaScanExec has no children".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let client = self.client.clone();
        let table = self.table.clone();
        let tablet = match self.tablet_of(partition, &context) {
            Some(tablet) => tablet,
            None if partition < self.partitions() => {
                return Ok(Box::pin(RecordBatchStreamAdapter::new(
                    self.schema.clone(),
                    futures::stream::empty(),
                )))
            }
            None => {
                return Err(DataFusionError::Internal(format!(
                    "NyalaScanExec has no partition {partition}"
                )))
            }
        };
        let output_rows = MetricBuilder::new(&self.metrics).output_rows(partition);
        let (snapshot, wait_until) = (self.snapshot, self.wait_until);
        let filters = Self::spec_with_filters(
            self.spec.clone(),
            self.runtime.clone(),
            self.dynamic.clone(),
            self.dynamic_mode,
            self.table.schema.clone(),
            self.table_columns(),
        );
        // In a transaction that wrote the table, its rows replace the stored ones.
        // (Not in a diff scan, which reads committed changes.)
        let overlay = match self.as_of || self.spec.changes_since.is_some() {
            true => None,
            false => TxnSlot::of(&context).and_then(|txn| txn.overlay(&self.table.id)),
        };
        let schema = self.schema.clone();
        // The scan starts at the first poll, once the runtime filters it waits for are built.
        let batches = futures::stream::once(async move {
            let spec = filters.await?;
            let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL_DEPTH);
            let (spec, overlay) = match overlay {
                None => (spec, None),
                Some(overlay) => {
                    // The transaction's rows go out with the first partition.
                    let own = match partition {
                        0 => overlay.rows_matching(&table, &spec, &schema)?,
                        _ => None,
                    };
                    let (spec, asked) = overlay.widen(&table, spec);
                    (spec, Some((overlay, asked, own)))
                }
            };
            // What the tablet reads (the transaction's own rows above match the whole spec).
            let spec = narrowed_to_tablet(&table, tablet, spec);
            // A long poll's scan opens here, as it waits for rows where the tablet is.
            let waited = match wait_until {
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    let scan =
                        client.scan_tablet_waiting(&table, tablet, spec.clone(), snapshot, left);
                    Some(scan.await)
                }
                None => None,
            };
            // Opening a scan may wait (for writes and transactions below its snapshot), so it
            // happens on the blocking thread too.
            tokio::task::spawn_blocking(move || {
                if let Some(own) = overlay.as_ref().and_then(|(_, _, own)| own.clone()) {
                    if tx.blocking_send(Ok(own)).is_err() {
                        return;
                    }
                }
                let opened =
                    waited.unwrap_or_else(|| client.scan_tablet(&table, tablet, spec, snapshot));
                let scan = match opened {
                    Ok(scan) => scan,
                    Err(e) => {
                        let _ = tx.blocking_send(Err(DataFusionError::External(Box::new(e))));
                        return;
                    }
                };
                for batch in scan {
                    let mut batch = batch.map_err(|e| DataFusionError::External(Box::new(e)));
                    if let (Some((overlay, asked, _)), Ok(stored)) = (&overlay, &batch) {
                        batch = overlay.hide_replaced(&table, stored.clone(), *asked);
                    }
                    // A remote tablet returns strings as `Utf8`.
                    if let Ok(b) = &batch {
                        if b.schema().fields() != schema.fields() {
                            batch = crate::results::cast_to(b.clone(), &schema).map_err(Into::into);
                        }
                    }
                    let failed = batch.is_err();
                    // The receiver is gone when the query was cancelled or finished early (LIMIT).
                    if tx.blocking_send(batch).is_err() || failed {
                        break;
                    }
                }
            });
            Ok::<_, DataFusionError>(futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|item| (item, rx))
            }))
        })
        .try_flatten()
        .inspect_ok(move |batch| output_rows.add(batch.num_rows()));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            batches,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn partition_statistics(&self, partition: Option<usize>) -> Result<Arc<Statistics>> {
        // Row counts and column ranges steer DataFusion's join planning: the smaller side is
        // built (a small build side is collected once, which lets runtime filters reach this
        // scan), and join sizes are estimated from the keys' ranges.
        let statistics = self.statistics.get_or_init(|| self.compute_statistics());
        if self.tasks.is_some() {
            // A task's partitions are not the tablets' (the totals hold).
            return Ok(match partition {
                Some(_) => Arc::new(Statistics::new_unknown(&self.schema)),
                None => statistics.total.clone(),
            });
        }
        Ok(match partition {
            Some(p) => statistics
                .partitions
                .get(p)
                .cloned()
                .unwrap_or_else(|| Arc::new(Statistics::new_unknown(&self.schema))),
            None => statistics.total.clone(),
        })
    }

    fn handle_child_pushdown_result(
        &self,
        phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        let filters = child_pushdown_result.parent_filters;
        // Every filter stays with DataFusion as well (they are applied inexactly here).
        let results = vec![PushedDown::No; filters.len()];
        let dynamic: Vec<Arc<dyn PhysicalExpr>> = filters
            .into_iter()
            .map(|f| f.filter)
            .filter(|f| f.is::<DynamicFilterPhysicalExpr>())
            .collect();
        let mode = RuntimeFilterMode::of(config);
        if phase != FilterPushdownPhase::Post
            || dynamic.is_empty()
            || mode == RuntimeFilterMode::Off
        {
            return Ok(FilterPushdownPropagation::with_parent_pushdown_result(
                results,
            ));
        }
        let mut scan = self.clone();
        scan.dynamic.extend(dynamic);
        scan.dynamic_mode = mode;
        Ok(
            FilterPushdownPropagation::with_parent_pushdown_result(results)
                .with_updated_node(Arc::new(scan) as Arc<dyn ExecutionPlan>),
        )
    }
}
