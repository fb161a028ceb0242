//! Where the master puts a table's tablets: the seam between the catalog and the tablet
//! servers. The embedded node creates them in its own tablet server (see [`crate::embedded`]);
//! a cluster's master places each tablet's replicas on the live servers that hold the fewest
//! ([`ClusterPlacement`]) and sends them CreateReplica, DeleteReplica and AlterSchema.

use std::sync::Arc;

use nyala_storage::{Schema, Timestamp};

use super::registry::TServerRegistry;
use crate::catalog::TableInfo;
use crate::rpc::proto::common::{Peer, TabletRef};
use crate::rpc::proto::tserver::{AlterSchemaRequest, CloneTabletRequest, CreateReplicaRequest};
use crate::{EngineError, Result};

/// The tablet lifecycle as the master drives it.
#[async_trait::async_trait]
pub trait TabletPlacement: Send + Sync + 'static {
    /// Creates tablet `id` with `replicas` replicas (0: the default); the servers that hold
    /// them (empty where the tablet is in this process).
    async fn create_tablet(&self, id: &str, schema: &Schema, replicas: usize) -> Result<Vec<u64>>;
    /// Deletes tablet `id`, whose replicas are on `servers`.
    async fn delete_tablet(&self, id: &str, servers: &[u64]) -> Result<()>;
    /// Changes the schema of tablet `id` through its log.
    async fn alter_schema(&self, id: &str, schema: &Schema) -> Result<()>;
    /// Creates tablet `id` as a clone of tablet `source` (now, or `as_of`), through the
    /// source's log, on the servers that hold the source's replicas; returns those servers.
    async fn clone_tablet(
        &self,
        id: &str,
        source: &str,
        as_of: Option<Timestamp>,
    ) -> Result<Vec<u64>>;
    /// After a restart: has the tablets match the catalog's `tables` where this placement owns
    /// them (deletes orphans of an interrupted CREATE or DROP, finishes interrupted schema
    /// changes). In a cluster the tablet servers own their replicas: nothing to do.
    fn reconcile(&self, _tables: &[Arc<TableInfo>]) -> Result<()> {
        Ok(())
    }
}

/// The tablets of a cluster, placed on the tablet servers the registry knows.
pub struct ClusterPlacement {
    registry: Arc<TServerRegistry>,
    /// Replicas of a new tablet when CREATE TABLE does not say.
    default_replicas: usize,
}

impl ClusterPlacement {
    pub fn new(registry: Arc<TServerRegistry>, default_replicas: usize) -> Self {
        Self {
            registry,
            default_replicas: default_replicas.max(1),
        }
    }
}

#[async_trait::async_trait]
impl TabletPlacement for ClusterPlacement {
    async fn create_tablet(&self, id: &str, schema: &Schema, replicas: usize) -> Result<Vec<u64>> {
        let mut live = self.registry.live_servers();
        let replicas = match replicas {
            0 => self.default_replicas.min(live.len().max(1)),
            n => n,
        };
        if live.len() < replicas {
            return Err(EngineError::InvalidTable(format!(
                "replicas = {replicas}: only {} tablet server(s) are alive",
                live.len()
            )));
        }
        // The least loaded servers first.
        live.sort_by_key(|(id, _, held)| (*held, *id));
        live.truncate(replicas);
        let peers: Vec<Peer> = live
            .iter()
            .map(|(server_id, address, _)| Peer {
                server_id: *server_id,
                address: address.clone(),
            })
            .collect();
        let schema_json =
            serde_json::to_string(schema).map_err(|e| EngineError::InvalidTable(e.to_string()))?;
        for (server, _, _) in &live {
            let request = CreateReplicaRequest {
                tablet_id: id.into(),
                schema_json: schema_json.clone(),
                peers: peers.clone(),
                ..Default::default()
            };
            self.registry
                .meta()
                .call_server(
                    *server,
                    |mut c| async move { c.create_replica(request).await },
                )
                .await?;
            self.registry.count_placed(*server, id);
        }
        Ok(live.into_iter().map(|(id, _, _)| id).collect())
    }

    async fn delete_tablet(&self, id: &str, servers: &[u64]) -> Result<()> {
        for &server in servers {
            let request = TabletRef {
                tablet_id: id.into(),
            };
            self.registry
                .meta()
                .call_server(
                    server,
                    |mut c| async move { c.delete_replica(request).await },
                )
                .await?;
        }
        Ok(())
    }

    async fn alter_schema(&self, id: &str, schema: &Schema) -> Result<()> {
        let schema_json =
            serde_json::to_string(schema).map_err(|e| EngineError::InvalidTable(e.to_string()))?;
        self.registry
            .meta()
            .call_leader(id, |mut c| {
                let request = AlterSchemaRequest {
                    tablet_id: id.into(),
                    schema_json: schema_json.clone(),
                };
                async move { c.alter_schema(request).await }
            })
            .await
            .map(drop)
    }

    async fn clone_tablet(
        &self,
        id: &str,
        source: &str,
        as_of: Option<Timestamp>,
    ) -> Result<Vec<u64>> {
        let meta = self.registry.meta();
        let request = CloneTabletRequest {
            tablet_id: source.into(),
            target_id: id.into(),
            as_of: as_of.map_or(0, |t| t.0),
        };
        let (_, cloned) = meta
            .call_leader(source, |mut c| {
                let request = request.clone();
                async move { c.clone_tablet(request).await }
            })
            .await?;
        let mut servers = Vec::with_capacity(cloned.peers.len());
        for peer in &cloned.peers {
            let request = CreateReplicaRequest {
                tablet_id: id.into(),
                peers: cloned.peers.clone(),
                clone_of: source.into(),
                clone_index: cloned.index,
                ..Default::default()
            };
            meta.call_server(peer.server_id, |mut c| async move {
                c.create_replica(request).await
            })
            .await?;
            self.registry.count_placed(peer.server_id, id);
            servers.push(peer.server_id);
        }
        Ok(servers)
    }
}
