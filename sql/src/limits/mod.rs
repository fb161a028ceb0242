//! What one statement may use, so that one client's query cannot exhaust the server for the
//! others.
//!
//! - **Memory**: each query gets a pool of its own ([`QueryMemoryPool`](memory_pool::QueryMemoryPool)) inside the server's
//!   pool for all queries. DataFusion's operators reserve from it; those that can spill (sorts,
//!   aggregations) do when a reservation is refused, the others fail the query with a message
//!   that names the limit. Writes hold no reservation, so a query over its budget never stops a
//!   write.
//! - **Time**: a statement runs at most its session's `statement_timeout` (or the server's
//!   default); then its stream ends with an error and dropping it cancels the work. That needs
//!   the work to yield now and then: DataFusion's operators loop over their input until it
//!   returns Pending, and some sources never do (`generate_series` claims to cooperate with
//!   tokio's budget but does not), so [`YieldingLeaves`](crate::plan::yielding_leaves::YieldingLeaves) puts every such source behind a
//!   `CooperativeExec`. Tablet scans yield by themselves (their rows come through a channel).
//!   A nested-loop join evaluates its filter over every buffered row against a whole probe
//!   batch between two polls of its probe input, for seconds with a million rows buffered; so
//!   its probe input comes in slices of about a million pairs' worth of rows, which yield to
//!   the runtime every 10 ms ([`ProbeSlicesExec`](crate::exec::probe_slices::ProbeSlicesExec)). A statement that
//!   changes rows is not dropped: its timeout asks it to stop through its [`Interrupt`], which
//!   it does only where nothing is changed, so a timeout never leaves half a write behind
//!   ([`interrupt`]; a query's stream ends at its deadline, [`timeout`]).
//! - **Admission**: at most [`QueryLimits::max_running_queries`] queries run at once; more wait
//!   their turn (within their timeout) instead of all competing for memory and cores.
//!   Statements that change rows are not queued behind queries.

pub(crate) mod interrupt;
mod memory_pool;
pub(crate) mod timeout;

use std::sync::Arc;
use std::time::Duration;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::TaskContext;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::limits::interrupt::Interrupt;
use crate::limits::memory_pool::QueryMemoryPool;

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

    /// `base` with a memory pool of one query's own, inside the server's (a query's, or a
    /// worker's task of another server's query).
    pub(crate) fn query_runtime(&self, base: &Arc<RuntimeEnv>) -> Result<Arc<RuntimeEnv>> {
        let pool = QueryMemoryPool::new(
            self.config.query_memory_bytes,
            self.config.server_memory_bytes,
            self.server.clone(),
        );
        RuntimeEnvBuilder::from_runtime_env(base)
            .with_memory_pool(Arc::new(pool))
            .build_arc()
    }

    /// `base` with a memory pool of the query's own, inside the server's, and the statement's
    /// `interrupt` if it changes rows.
    pub(crate) fn task_context(
        &self,
        base: Arc<TaskContext>,
        interrupt: Option<&Interrupt>,
    ) -> Result<Arc<TaskContext>> {
        let runtime = self.query_runtime(&base.runtime_env())?;
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
