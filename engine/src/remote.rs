//! The catalog as a coordinator that is not a master sees it (a tablet server serving Flight
//! SQL): tables and the cluster's tablet servers fetched from a master every 500 ms (over a
//! connection kept open), DDL sent to the master that leads the catalog.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use nyala_storage::Schema;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use crate::host::Cluster;
use crate::master::{ColumnChange, TableInfo};
use crate::partition::{PartitionSchema, RangeSpec};
use crate::rpc::{request, DdlRequest, StatusRequest};
use crate::{EngineError, Result};

/// A DDL statement sent to the leading master.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum DdlOp {
    CreateTable {
        name: String,
        schema: Schema,
        partition: PartitionSchema,
        if_not_exists: bool,
        replicas: usize,
    },
    DropTable {
        name: String,
        if_exists: bool,
    },
    RenameTable {
        name: String,
        new_name: String,
    },
    AlterColumns {
        name: String,
        changes: Vec<ColumnChange>,
    },
    AddRangePartition {
        name: String,
        range: RangeSpec,
    },
    DropRangePartition {
        name: String,
        range: RangeSpec,
    },
}

/// The masters' catalog, cached, and where DDL goes.
pub struct RemoteMaster {
    masters: Vec<String>,
    tables: RwLock<BTreeMap<String, Arc<TableInfo>>>,
    cluster: Arc<Cluster>,
}

impl RemoteMaster {
    /// Fetches the catalog from one of `masters` and keeps it (and `cluster`'s view of the
    /// tablet servers) fresh in the background.
    pub async fn connect(masters: Vec<String>, cluster: Arc<Cluster>) -> Result<Arc<Self>> {
        let remote = Arc::new(Self {
            masters,
            tables: RwLock::default(),
            cluster,
        });
        remote.refresh().await?;
        let weak = Arc::downgrade(&remote);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let Some(remote) = weak.upgrade() else { return };
                if let Err(e) = remote.refresh().await {
                    tracing::debug!(error = %e, "cannot refresh the catalog");
                }
            }
        });
        Ok(remote)
    }

    /// Reads the catalog and the tablet servers' last heartbeats from the first master that
    /// answers.
    pub async fn refresh(&self) -> Result<()> {
        let mut last_error = EngineError::Unavailable("no master configured".into());
        for master in &self.masters {
            let answer = self
                .cluster
                .call_address(master, request::Kind::ClusterView(StatusRequest {}))
                .await;
            match answer {
                Ok(view) if view.error.is_empty() => {
                    let tables: Vec<TableInfo> = serde_json::from_str(&view.catalog_json)
                        .map_err(|e| EngineError::CatalogCorrupted(e.to_string()))?;
                    *self.tables.write() = tables
                        .into_iter()
                        .map(|t| (t.name.clone(), Arc::new(t)))
                        .collect();
                    for server in view.servers {
                        if let Some(status) = server.status {
                            self.cluster.heartbeat(server.address, status);
                        }
                    }
                    return Ok(());
                }
                Ok(view) => last_error = EngineError::Remote(view.error),
                Err(e) => last_error = e,
            }
        }
        Err(last_error)
    }

    pub fn table(&self, name: &str) -> Option<Arc<TableInfo>> {
        self.tables.read().get(name).cloned()
    }

    pub fn tables(&self) -> Vec<Arc<TableInfo>> {
        self.tables.read().values().cloned().collect()
    }

    /// Runs `op` on the master leading the catalog; the answer's `rows` (1 when a CREATE or
    /// DROP did something). The catalog is fetched again afterwards.
    pub async fn ddl(&self, op: DdlOp) -> Result<bool> {
        let json =
            serde_json::to_string(&op).map_err(|e| EngineError::InvalidTable(e.to_string()))?;
        let mut last_error = EngineError::Unavailable("no master reachable".into());
        for master in &self.masters {
            let answer = self
                .cluster
                .call_address(
                    master,
                    request::Kind::Ddl(DdlRequest { json: json.clone() }),
                )
                .await;
            match answer {
                Ok(r) if r.error.is_empty() => {
                    self.refresh().await?;
                    return Ok(r.rows > 0);
                }
                // Not the leading master: try the next.
                Ok(r) if r.not_leader => last_error = EngineError::Remote(r.error),
                Ok(r) => return Err(EngineError::Remote(r.error)),
                Err(e) => last_error = e,
            }
        }
        Err(last_error)
    }
}
