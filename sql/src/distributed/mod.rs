//! Distributed execution: a cluster's queries run where the data is, on datafusion-distributed.
//!
//! Every tablet server is a worker: datafusion-distributed's worker service is mounted on its
//! internal RPC server ([`worker`]) and reached with the cluster secret ([`workers`]). A
//! coordinator plans a query as before, then datafusion-distributed cuts the plan into stages
//! at its repartitions and collected build sides; the stages that scan run one task per tablet
//! server leading the scanned tablets, on that server ([`tasks`]), where the scan reads the
//! tablets through the local scan path. Partial aggregates and the rows of joins move between
//! workers over Arrow Flight; the coordinator runs the last stage. Nyala's operators travel in
//! the stages as [`codec`] writes them; every scan reads at the statement's snapshot, pinned
//! before the plan is sent.
//!
//! `SET nyala.distributed = auto | on | off` chooses ([`planner`]): `auto` distributes queries
//! that scan at least [`planner::AUTO_MIN_ROWS`] rows in a cluster of more than one tablet
//! server. Statements in a transaction, DML and the embedded node keep one coordinator.

mod codec;
pub(crate) mod planner;
mod tasks;
pub(crate) mod workers;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::error::DataFusionError;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion_distributed::{
    DistributedExt, SessionStateBuilderExt, Worker, WorkerQueryContext, WorkerSessionBuilder,
};

pub use planner::AUTO_MIN_ROWS;

use crate::database::Database;
use codec::NyalaCodec;
use planner::{ChoosingPlanner, UnfilteredPlanner};
use workers::TabletServerWorkers;

/// `builder` (a cluster session's, with Nyala's planner set) as a coordinating session:
/// datafusion-distributed's planner chosen per statement, the cluster's tablet servers as
/// its workers.
pub(crate) fn coordinating(builder: SessionStateBuilder, db: &Database) -> SessionStateBuilder {
    let client = db.client();
    let mut builder = builder
        .with_query_planner(Arc::new(UnfilteredPlanner))
        .with_distributed_planner();
    let distributed = builder.query_planner().take();
    let builder = match distributed {
        Some(distributed) => builder.with_query_planner(Arc::new(ChoosingPlanner {
            distributed,
            client: client.clone(),
        })),
        None => builder,
    };
    builder
        .with_distributed_worker_resolver(TabletServerWorkers {
            client: client.clone(),
        })
        .with_distributed_channel_resolver(db.channels.clone())
        .with_distributed_user_codec(NyalaCodec::new(client))
        .with_distributed_desired_task_count_handler(tasks::desired_task_count)
        .with_distributed_scale_up_leaf_node_handler(tasks::scale_up)
        .with_distributed_route_tasks_handler(tasks::route)
}

/// The database a worker runs its tasks over, once it is connected.
pub type WorkerDatabase = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = crate::Result<Arc<Database>>> + Send>> + Send + Sync,
>;

/// The worker service of a tablet server, running stages of other coordinators' queries over
/// the database `database` gives (connected to the cluster, scanning this server's tablets
/// in process).
pub fn worker(database: WorkerDatabase) -> Worker {
    Worker::from_session_builder(WorkerSession { database })
}

/// Builds the session a worker runs one task in: Nyala's functions and codec, a memory pool
/// of the query's own inside the server's.
struct WorkerSession {
    database: WorkerDatabase,
}

#[async_trait]
impl WorkerSessionBuilder for WorkerSession {
    async fn build_session_state(
        &self,
        ctx: WorkerQueryContext,
    ) -> Result<SessionState, DataFusionError> {
        let db = (self.database)()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let functions = db.functions();
        let mut builder = ctx.builder;
        let runtime = match builder.runtime_env().clone() {
            Some(base) => base,
            None => Arc::default(),
        };
        let runtime = db.limits.query_runtime(&runtime)?;
        Ok(builder
            .with_runtime_env(runtime)
            .with_scalar_functions(functions.scalar_functions().values().cloned().collect())
            .with_aggregate_functions(functions.aggregate_functions().values().cloned().collect())
            .with_window_functions(functions.window_functions().values().cloned().collect())
            .with_distributed_user_codec(NyalaCodec::new(db.client()))
            .with_distributed_channel_resolver(db.channels.clone())
            .build())
    }
}
