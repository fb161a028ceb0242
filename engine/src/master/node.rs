//! A master process's parts put together: the catalog, the registry of tablet servers their
//! reports fill, the placement of tablets on them, and a client (for Flight SQL on the master)
//! that reads the catalog in process and the tablets over RPC.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::placement::ClusterPlacement;
use super::registry::TServerRegistry;
use super::service::MasterService;
use super::Master;
use crate::client::{Client, MetaCache, RemoteTablets};
use crate::clock::HybridClock;
use crate::consensus::ConsensusService;
use crate::tserver::replica::Replication;
use crate::Result;

pub struct MasterNode {
    pub master: Arc<Master>,
    pub registry: Arc<TServerRegistry>,
    pub client: Client,
}

impl MasterNode {
    /// Opens the master whose catalog is in `data_dir/master` (replicated among the masters
    /// with `replication`); new tablets get `default_replicas` replicas. Blocking: it reads
    /// the catalog.
    pub fn open(
        data_dir: &Path,
        default_replicas: usize,
        replication: Option<Replication>,
        runtime: tokio::runtime::Handle,
    ) -> Result<Self> {
        let meta = Arc::new(MetaCache::default());
        let registry = TServerRegistry::new(meta.clone());
        let placement = ClusterPlacement::new(registry.clone(), default_replicas);
        let master = Arc::new(Master::open(
            &data_dir.join("master"),
            Arc::new(HybridClock::new()),
            Arc::new(placement),
            replication,
        )?);
        let tablets = RemoteTablets::new(meta, runtime);
        let client = Client::new(master.clone(), Arc::new(tablets));
        Ok(Self {
            master,
            registry,
            client,
        })
    }

    /// The master's RPC services: its own, and consensus for a replicated catalog.
    pub fn services(&self) -> (MasterService, ConsensusService) {
        (
            MasterService::new(self.master.clone(), self.registry.clone()),
            ConsensusService::new(vec![self.master.clone()]),
        )
    }

    /// Starts re-replication (see [`Master::start_repairs`]).
    pub fn start_repairs(&self, unavailable: Duration) {
        self.master
            .start_repairs(self.registry.clone(), unavailable);
    }
}
