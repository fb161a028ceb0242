//! The catalog as a coordinator that is not a master sees it (a tablet server serving Flight
//! SQL): the tables and the tablet servers' last reports, fetched from a master every
//! [`REFRESH_INTERVAL`] over a kept connection (the tables only when the catalog changed), and
//! DDL sent to the master that leads the catalog.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use super::meta_cache::MetaCache;
use crate::catalog::{Catalog, CatalogContents, DdlOp, TableInfo, UserInfo, ViewInfo};
use crate::rpc;
use crate::rpc::proto::master::master_service_client::MasterServiceClient;
use crate::rpc::proto::master::{ClusterViewRequest, DdlRequest};
use crate::{EngineError, Result};

const REFRESH_INTERVAL: Duration = Duration::from_millis(500);

/// The masters' catalog, cached, and where DDL goes.
pub struct RemoteCatalog {
    masters: Vec<String>,
    tables: RwLock<BTreeMap<String, Arc<TableInfo>>>,
    views: RwLock<BTreeMap<String, Arc<ViewInfo>>>,
    users: RwLock<BTreeMap<String, Arc<UserInfo>>>,
    /// The catalog version `tables` holds.
    version: std::sync::atomic::AtomicU64,
    channels: Mutex<BTreeMap<String, rpc::RpcChannel>>,
    meta: Arc<MetaCache>,
}

impl RemoteCatalog {
    /// Fetches the catalog from one of `masters` and keeps it (and `meta`'s view of the tablet
    /// servers) fresh in the background.
    pub async fn connect(masters: Vec<String>, meta: Arc<MetaCache>) -> Result<Arc<Self>> {
        let remote = Arc::new(Self {
            masters,
            tables: RwLock::default(),
            views: RwLock::default(),
            users: RwLock::default(),
            version: Default::default(),
            channels: Mutex::default(),
            meta,
        });
        remote.refresh().await?;
        let weak = Arc::downgrade(&remote);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REFRESH_INTERVAL).await;
                let Some(remote) = weak.upgrade() else { return };
                if let Err(e) = remote.refresh().await {
                    tracing::debug!(error = %e, "cannot refresh the catalog");
                }
            }
        });
        Ok(remote)
    }

    async fn master(&self, address: &str) -> Result<MasterServiceClient<rpc::RpcChannel>> {
        if let Some(channel) = self.channels.lock().get(address) {
            return Ok(rpc::master(channel.clone()));
        }
        let channel = rpc::connect(address).await?;
        self.channels
            .lock()
            .insert(address.to_string(), channel.clone());
        Ok(rpc::master(channel))
    }

    /// A call's result; a connection that failed is made again next time.
    fn checked<T>(
        &self,
        address: &str,
        answer: std::result::Result<tonic::Response<T>, tonic::Status>,
    ) -> Result<T> {
        let answer = answer.map_err(rpc::from_status);
        if let Err(EngineError::Unavailable(_)) = &answer {
            self.channels.lock().remove(address);
        }
        answer.map(tonic::Response::into_inner)
    }

    /// Reads the catalog (if it changed) and the tablet servers' last reports from the first
    /// master that answers.
    pub async fn refresh(&self) -> Result<()> {
        let mut last_error = EngineError::Unavailable("no master configured".into());
        for address in &self.masters {
            let known = self.version.load(std::sync::atomic::Ordering::Acquire);
            let answer = match self.master(address).await {
                Ok(mut master) => {
                    let request = ClusterViewRequest {
                        catalog_version: known,
                    };
                    self.checked(address, master.cluster_view(request).await)
                }
                Err(e) => Err(e),
            };
            let view = match answer {
                Ok(view) => view,
                Err(e) => {
                    last_error = e;
                    continue;
                }
            };
            if let Some(json) = &view.catalog_json {
                let contents: CatalogContents = serde_json::from_str(json)
                    .map_err(|e| EngineError::CatalogCorrupted(e.to_string()))?;
                *self.tables.write() = (contents.tables.into_iter())
                    .map(|t| (t.name.clone(), Arc::new(t)))
                    .collect();
                *self.views.write() = (contents.views.into_iter())
                    .map(|v| (v.name.clone(), Arc::new(v)))
                    .collect();
                *self.users.write() = (contents.users.into_iter())
                    .map(|u| (u.name.clone(), Arc::new(u)))
                    .collect();
                self.version
                    .store(view.catalog_version, std::sync::atomic::Ordering::Release);
            }
            for server in view.servers {
                if let Some(status) = &server.status {
                    self.meta.observe(&server.address, status);
                }
            }
            return Ok(());
        }
        Err(last_error)
    }
}

#[async_trait::async_trait]
impl Catalog for RemoteCatalog {
    /// Runs `op` on the master leading the catalog, then fetches the catalog again.
    async fn ddl(&self, op: DdlOp) -> Result<bool> {
        let op_json =
            serde_json::to_string(&op).map_err(|e| EngineError::InvalidTable(e.to_string()))?;
        let mut last_error = EngineError::Unavailable("no master reachable".into());
        for address in &self.masters {
            let answer = match self.master(address).await {
                Ok(mut master) => {
                    let request = DdlRequest {
                        op_json: op_json.clone(),
                    };
                    self.checked(address, master.ddl(request).await)
                }
                Err(e) => Err(e),
            };
            match answer {
                Ok(done) => {
                    self.refresh().await?;
                    return Ok(done.applied);
                }
                // Not the leading master, or not reachable: try the next.
                Err(e @ (EngineError::NotLeaderMaster { .. } | EngineError::Unavailable(_))) => {
                    last_error = e
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error)
    }

    fn table(&self, name: &str) -> Option<Arc<TableInfo>> {
        self.tables.read().get(name).cloned()
    }

    fn tables(&self) -> Vec<Arc<TableInfo>> {
        self.tables.read().values().cloned().collect()
    }

    fn views(&self) -> Vec<Arc<ViewInfo>> {
        self.views.read().values().cloned().collect()
    }

    fn users(&self) -> Vec<Arc<UserInfo>> {
        self.users.read().values().cloned().collect()
    }
}
