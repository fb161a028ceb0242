//! What one statement may use, so that one client's query cannot exhaust the server for the
//! others.
//!
//! - **Memory**: each query gets a pool of its own ([`QueryMemoryPool`]) inside the server's
//!   pool for all queries. DataFusion's operators reserve from it; those that can spill (sorts,
//!   aggregations) do when a reservation is refused, the others fail the query with a message
//!   that names the limit. Writes hold no reservation, so a query over its budget never stops a
//!   write.
//! - **Time**: a statement runs at most its session's `statement_timeout` (or the server's
//!   default); then its stream ends with an error and dropping it cancels the work. That needs
//!   the work to yield now and then: DataFusion's operators loop over their input until it
//!   returns Pending, and some sources never do (`generate_series` claims to cooperate with
//!   tokio's budget but does not), so [`YieldingLeaves`] puts every such source behind a
//!   `CooperativeExec`. Tablet scans yield by themselves (their rows come through a channel).
//!   A nested-loop join evaluates its filter over every buffered row against a whole probe
//!   batch between two polls of its probe input, for seconds with a million rows buffered; so
//!   its probe input comes in slices of about [`PAIRS_PER_SLICE`] pairs' worth of rows, which
//!   yield to the runtime every [`YIELD_EVERY`] ([`ProbeSlicesExec`]). A statement that
//!   changes rows is not dropped: its timeout asks it to stop through its [`Interrupt`], which
//!   it does only where nothing is changed, so a timeout never leaves half a write behind.
//! - **Admission**: at most [`QueryLimits::max_running_queries`] queries run at once; more wait
//!   their turn (within their timeout) instead of all competing for memory and cores.
//!   Statements that change rows are not queued behind queries.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryLimit, MemoryPool, MemoryReservation,
};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::joins::NestedLoopJoinExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Limits on what statements may use.
#[derive(Debug, Clone)]
pub struct QueryLimits {
    /// Memory one query's operators may reserve.
    pub query_memory_bytes: usize,
    /// Memory all running queries together may reserve.
    pub server_memory_bytes: usize,
    /// Queries that run at once; more wait their turn.
    pub max_running_queries: usize,
    /// How long a statement may run when its session does not say (None: no limit).
    pub statement_timeout: Option<Duration>,
}

impl Default for QueryLimits {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self {
            query_memory_bytes: 2 << 30,
            server_memory_bytes: 8 << 30,
            max_running_queries: (4 * cores).max(16),
            statement_timeout: None,
        }
    }
}

/// The limits of one database, and what they count against.
pub(crate) struct Limits {
    config: QueryLimits,
    server: Arc<dyn MemoryPool>,
    running: Arc<Semaphore>,
}

impl Limits {
    pub(crate) fn new(config: QueryLimits) -> Self {
        Self {
            server: Arc::new(GreedyMemoryPool::new(config.server_memory_bytes)),
            running: Arc::new(Semaphore::new(config.max_running_queries.max(1))),
            config,
        }
    }

    pub(crate) fn default_timeout(&self) -> Option<Duration> {
        self.config.statement_timeout
    }

    /// `base` with a memory pool of the query's own, inside the server's, and the statement's
    /// `interrupt` if it changes rows.
    pub(crate) fn task_context(
        &self,
        base: Arc<TaskContext>,
        interrupt: Option<&Interrupt>,
    ) -> Result<Arc<TaskContext>> {
        let pool = QueryMemoryPool {
            limit: self.config.query_memory_bytes,
            server_limit: self.config.server_memory_bytes,
            used: AtomicUsize::new(0),
            server: self.server.clone(),
        };
        let runtime = RuntimeEnvBuilder::from_runtime_env(&base.runtime_env())
            .with_memory_pool(Arc::new(pool))
            .build_arc()?;
        let task = Arc::try_unwrap(base).unwrap_or_else(|shared| {
            TaskContext::new(
                shared.task_id(),
                shared.session_id(),
                shared.session_config().clone(),
                shared.scalar_functions().clone(),
                shared.higher_order_functions().clone(),
                shared.aggregate_functions().clone(),
                shared.window_functions().clone(),
                shared.runtime_env(),
            )
        });
        let task = match interrupt {
            Some(interrupt) => {
                let config =
                    (task.session_config().clone()).with_extension(Arc::new(interrupt.clone()));
                task.with_session_config(config)
            }
            None => task,
        };
        Ok(Arc::new(task.with_runtime(runtime)))
    }

    /// Waits for a query's turn to run, until the statement's `deadline` or at most
    /// [`MAX_QUEUE_WAIT`]; the turn lasts as long as the permit. (Open result streams hold
    /// turns, so a client that leaves many unread can keep others waiting: the wait is
    /// bounded.)
    pub(crate) async fn admit(&self, deadline: Option<Instant>) -> Result<OwnedSemaphorePermit> {
        let queue_limit = Instant::now() + MAX_QUEUE_WAIT;
        let until = deadline.map_or(queue_limit, |d| d.min(queue_limit));
        let running = self.config.max_running_queries;
        let permit = tokio::time::timeout_at(until, self.running.clone().acquire_owned())
            .await
            .map_err(|_| match deadline {
                Some(deadline) if deadline <= queue_limit => {
                    DataFusionError::ResourcesExhausted(format!(
                        "canceling statement due to statement timeout: it was still waiting \
                         for one of the {running} queries running at once to finish"
                    ))
                }
                _ => DataFusionError::ResourcesExhausted(format!(
                    "the server is busy: {running} queries are running and this one waited \
                     {} s for its turn; retry later",
                    MAX_QUEUE_WAIT.as_secs()
                )),
            })?;
        permit.map_err(|_| DataFusionError::Execution("the server is shutting down".into()))
    }
}

/// Longest a query waits for its turn to run.
const MAX_QUEUE_WAIT: Duration = Duration::from_secs(30);

/// The memory of one query: at most `limit` bytes of its own, taken from the server's pool.
#[derive(Debug)]
struct QueryMemoryPool {
    limit: usize,
    server_limit: usize,
    used: AtomicUsize,
    server: Arc<dyn MemoryPool>,
}

impl fmt::Display for QueryMemoryPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "query pool ({} of {} bytes)",
            self.reserved(),
            self.limit
        )
    }
}

impl MemoryPool for QueryMemoryPool {
    fn name(&self) -> &str {
        "query"
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.used.fetch_add(additional, Ordering::Relaxed);
        self.server.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.used.fetch_sub(shrink, Ordering::Relaxed);
        self.server.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(additional).filter(|&n| n <= self.limit)
            })
            .map_err(|_| {
                DataFusionError::ResourcesExhausted(format!(
                    "the query exceeded its memory limit of {} MiB ({} wanted {} more bytes)",
                    self.limit >> 20,
                    reservation.consumer().name(),
                    additional
                ))
            })?;
        self.server.try_grow(reservation, additional).map_err(|_| {
            self.used.fetch_sub(additional, Ordering::Relaxed);
            DataFusionError::ResourcesExhausted(format!(
                "the running queries together exceeded the server's query memory of {} MiB; \
                 retry when fewer run",
                self.server_limit >> 20
            ))
        })
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit)
    }
}

/// Why a statement that changes rows is asked to stop.
#[derive(Debug, Clone)]
pub enum Stop {
    /// Its `statement_timeout` (this long) passed.
    Timeout(Duration),
    /// It was cancelled, or its client went away: why.
    Cancelled(String),
}

impl Stop {
    /// The error the statement fails with when it stops for this reason.
    fn error(&self) -> DataFusionError {
        match self {
            Stop::Timeout(timeout) => statement_timeout(*timeout),
            Stop::Cancelled(why) => {
                DataFusionError::External(Box::new(crate::SqlError::Cancelled(why.clone())))
            }
        }
    }
}

/// A request to stop a statement that changes rows (DML, DDL, COMMIT). Unlike a query, such a
/// statement is never dropped in the middle: it stops where stopping leaves nothing changed
/// (while it reads the rows it is about to write, between restarts), and a write it has sent
/// finishes, or is rolled back, before it returns. So an error always means that the statement
/// changed nothing, and a statement that has written reports what it did even when it was
/// asked to stop meanwhile. Found by the statement's plan in its task context's configuration.
#[derive(Debug, Clone)]
pub struct Interrupt(Arc<watch::Sender<Option<Stop>>>);

impl Default for Interrupt {
    fn default() -> Self {
        Self(Arc::new(watch::channel(None).0))
    }
}

impl Interrupt {
    /// Asks the statement to stop (the first reason given is the one it reports).
    pub fn stop(&self, why: Stop) {
        self.0.send_if_modified(|stop| {
            let first = stop.is_none();
            stop.get_or_insert(why);
            first
        });
    }

    /// The statement's error if it has been asked to stop.
    pub(crate) fn check(&self) -> Result<()> {
        match &*self.0.borrow() {
            Some(stop) => Err(stop.error()),
            None => Ok(()),
        }
    }

    /// `work`, unless the statement is asked to stop first (then `work` is dropped): for work
    /// that writes nothing.
    pub(crate) async fn unless_stopped<T>(
        &self,
        work: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let mut stopped = self.0.subscribe();
        tokio::select! {
            biased;
            // (The sender lives as long as `self`: waiting fails never.)
            Ok(stop) = stopped.wait_for(Option::is_some) => {
                Err(stop.as_ref().map_or_else(statement_cancelled, Stop::error))
            }
            done = work => done,
        }
    }

    /// The interrupt of the statement running in `context` (one never used, if none).
    pub(crate) fn of(context: &TaskContext) -> Interrupt {
        (context.session_config().get_extension::<Interrupt>())
            .map_or_else(Interrupt::default, |i| i.as_ref().clone())
    }

    /// Stops the statement (as cancelled by its client going away) when the guard is dropped
    /// before [`StopOnDrop::disarm`].
    pub(crate) fn stop_on_drop(&self) -> StopOnDrop {
        StopOnDrop(Some(self.clone()))
    }
}

/// Runs `work` in a task of its own, to its end even if the caller goes away meanwhile.
pub(crate) async fn detached<T: Send + 'static>(
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> crate::Result<T> {
    match tokio::spawn(work).await {
        Ok(done) => Ok(done),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(crate::SqlError::Cancelled(
            "the server is shutting down".into(),
        )),
    }
}

fn statement_cancelled() -> DataFusionError {
    Stop::Cancelled("the statement was cancelled".into()).error()
}

/// See [`Interrupt::stop_on_drop`].
pub(crate) struct StopOnDrop(Option<Interrupt>);

impl StopOnDrop {
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(interrupt) = self.0.take() {
            interrupt.stop(Stop::Cancelled(
                "the client went away before the statement finished".into(),
            ));
        }
    }
}

/// `stream`, ended with an error at `deadline` (a statement timeout of `timeout`), holding
/// `permit` (its turn to run) until it ends or is dropped.
pub(crate) fn limited(
    stream: SendableRecordBatchStream,
    deadline: Option<(Instant, Duration)>,
    permit: Option<OwnedSemaphorePermit>,
) -> SendableRecordBatchStream {
    Box::pin(Limited {
        schema: stream.schema(),
        stream: Some(stream),
        deadline: deadline.map(|(at, timeout)| (Box::pin(tokio::time::sleep_until(at)), timeout)),
        _permit: permit,
    })
}

struct Limited {
    schema: SchemaRef,
    /// None once ended (by the deadline).
    stream: Option<SendableRecordBatchStream>,
    deadline: Option<(Pin<Box<Sleep>>, Duration)>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Stream for Limited {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.stream.is_none() {
            return Poll::Ready(None);
        }
        // The deadline first: polling the plan spends the task's tokio budget, after which
        // the timer would not say it has elapsed.
        if let Some((sleep, timeout)) = self.deadline.as_mut() {
            if sleep.poll_unpin(cx).is_ready() {
                let timeout = *timeout;
                // Dropping the plan's stream cancels its work.
                self.stream = None;
                return Poll::Ready(Some(Err(statement_timeout(timeout))));
            }
        }
        match self.stream.as_mut() {
            Some(stream) => stream.poll_next_unpin(cx),
            None => Poll::Ready(None),
        }
    }
}

impl RecordBatchStream for Limited {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// The error of a statement cancelled by its timeout.
pub(crate) fn statement_timeout(timeout: Duration) -> DataFusionError {
    DataFusionError::ResourcesExhausted(format!(
        "canceling statement due to statement timeout ({} ms; SET statement_timeout to change it)",
        timeout.as_millis()
    ))
}

/// Puts every source of rows except tablet scans behind a [`CooperativeExec`], so the
/// operators above it yield to the runtime now and then, and the probe input of every
/// nested-loop join behind a [`ProbeSlicesExec`] (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct YieldingLeaves;

impl YieldingLeaves {
    fn wrap(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        let yields = plan.is::<CooperativeExec>() || plan.is::<crate::exec::scan::NyalaScanExec>();
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
        let probe = Arc::new(ProbeSlicesExec {
            input: nlj.right().clone(),
            rows: rows.clamp(1, MAX_SLICE_ROWS),
        });
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
/// How long a sliced probe input lets its consumer compute before it yields to the runtime.
const YIELD_EVERY: Duration = Duration::from_millis(10);

/// The probe input of a nested-loop join in slices of `rows` rows, yielding to the runtime
/// when [`YIELD_EVERY`] has passed since it last did (see the module documentation).
#[derive(Debug)]
pub(crate) struct ProbeSlicesExec {
    input: Arc<dyn ExecutionPlan>,
    rows: usize,
}

impl DisplayAs for ProbeSlicesExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "ProbeSlicesExec: rows={}", self.rows)
    }
}

impl ExecutionPlan for ProbeSlicesExec {
    fn name(&self) -> &str {
        "ProbeSlicesExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
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
        let input = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("ProbeSlicesExec needs an input".into()))?;
        Ok(Arc::new(Self {
            input,
            rows: self.rows,
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Ok(Box::pin(Slices {
            input: self.input.execute(partition, context)?,
            rows: self.rows,
            current: None,
            yielded: std::time::Instant::now(),
        }))
    }
}

/// The stream of a [`ProbeSlicesExec`].
struct Slices {
    input: SendableRecordBatchStream,
    rows: usize,
    /// The batch being sliced and the offset of its next slice.
    current: Option<(RecordBatch, usize)>,
    yielded: std::time::Instant,
}

impl Stream for Slices {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.yielded.elapsed() >= YIELD_EVERY {
            self.yielded = std::time::Instant::now();
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        loop {
            if let Some((batch, offset)) = self.current.take() {
                if offset < batch.num_rows() {
                    let len = self.rows.min(batch.num_rows() - offset);
                    let slice = batch.slice(offset, len);
                    self.current = Some((batch, offset + len));
                    return Poll::Ready(Some(Ok(slice)));
                }
            }
            match self.input.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(batch))) => self.current = Some((batch, 0)),
                other => return other,
            }
        }
    }
}

impl RecordBatchStream for Slices {
    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }
}
