//! The master: the catalog of tables and where their tablets live.
//!
//! As in Kudu, the catalog is itself a tablet (`sys.catalog`) written through its own Raft log:
//! one row per table, keyed by table id, holding the table's definition as JSON. On start the
//! master scans it back into memory. DDL is serialised by one lock; creating a table makes its
//! tablets first and then commits the catalog row, so a crash in between leaves only orphan
//! tablets, which the next start deletes.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, RecordBatch, StringArray};
use nyala_storage::{
    ColumnSchema, ColumnType, ScanSpec, Schema, TabletOptions, Timestamp, WriteBatch, WriteKind,
};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use crate::clock::HybridClock;
use crate::host::{Cluster, TabletHost};
use crate::partition::{PartitionSchema, RangeSpec};
use crate::remote::DdlOp;
use crate::replica::Replication;
use crate::replica::TabletReplica;
use crate::rpc::{request, ChangeMembership, CopyTablet, Peer};
use crate::{EngineError, Result};
use std::collections::HashMap;
use std::time::Duration;

pub type TableId = String;

/// A table's definition as the catalog stores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableInfo {
    pub id: TableId,
    pub name: String,
    pub schema: Schema,
    pub partition: PartitionSchema,
    /// Tablet ids, in the partitioning's tablet order (see [`PartitionSchema`]).
    pub tablets: Vec<String>,
    /// Replicas of each tablet (0: the host's default).
    #[serde(default)]
    pub replicas: usize,
    /// The tablet servers holding each tablet's replicas, in a cluster (empty in the embedded
    /// node).
    #[serde(default)]
    pub placement: BTreeMap<String, Vec<u64>>,
}

/// One change of `ALTER TABLE ... ADD | DROP | RENAME COLUMN`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ColumnChange {
    Add(ColumnSchema),
    Drop(String),
    Rename { name: String, new_name: String },
}

pub struct Master {
    catalog: Arc<TabletReplica>,
    /// The catalog entry `tables` reflects; a replicated catalog whose followers applied more
    /// is loaded again.
    loaded: std::sync::atomic::AtomicU64,
    /// Where the masters of a replicated catalog listen, by Raft node id.
    masters: BTreeMap<u64, String>,
    host: TabletHost,
    tables: RwLock<BTreeMap<String, Arc<TableInfo>>>,
    ddl: tokio::sync::Mutex<()>,
}

/// The tablet id of the catalog.
pub const CATALOG_TABLET: &str = "sys.catalog";

fn catalog_schema() -> Result<Schema> {
    let column = |name: &str| ColumnSchema::new(name, ColumnType::String, false);
    Ok(Schema::new(
        vec![column("id"), column("name"), column("info")],
        vec![0],
    )?)
}

impl Master {
    /// Opens the catalog in `dir` (creating it on first start), loads every table, and reconciles
    /// the local tablet server with it. With `replication`, the catalog is replicated by Raft
    /// among the masters: DDL runs on the master that leads it, and the others follow.
    pub fn open(
        dir: &Path,
        clock: Arc<HybridClock>,
        host: TabletHost,
        replication: Option<Replication>,
    ) -> Result<Self> {
        let catalog_dir = dir.join("catalog");
        let masters = replication
            .as_ref()
            .map(|r| r.peers.addresses.clone())
            .unwrap_or_default();
        let catalog = if catalog_dir.join("data").exists() {
            TabletReplica::open(
                &catalog_dir,
                CATALOG_TABLET,
                TabletOptions::default(),
                clock,
                replication,
                None,
            )?
        } else {
            if catalog_dir.exists() {
                // Left by a crash during the very first start: nothing in it was acknowledged.
                std::fs::remove_dir_all(&catalog_dir)?;
            }
            TabletReplica::create(
                &catalog_dir,
                CATALOG_TABLET,
                catalog_schema()?,
                TabletOptions::default(),
                clock,
                replication,
                None,
            )?
        };
        let master = Self {
            catalog: Arc::new(catalog),
            loaded: Default::default(),
            masters,
            host,
            tables: RwLock::new(BTreeMap::new()),
            ddl: tokio::sync::Mutex::new(()),
        };
        master.load()?;
        master.reconcile_tablets()?;
        Ok(master)
    }

    /// The catalog's replica (for the Raft messages of a replicated catalog).
    pub fn catalog(&self) -> &Arc<TabletReplica> {
        &self.catalog
    }

    /// Loads the catalog again if its replica applied entries since the last load (a follower
    /// of a replicated catalog learns DDL this way).
    fn refresh(&self) {
        let applied = self.catalog.last_applied();
        if applied > self.loaded.load(std::sync::atomic::Ordering::Acquire) {
            if let Err(e) = self.load() {
                tracing::error!(error = %e, "cannot reload the catalog");
            }
        }
    }

    fn load(&self) -> Result<()> {
        let applied = self.catalog.last_applied();
        let spec = ScanSpec {
            projection: Some(vec![2]),
            predicates: vec![],
            snapshot: Timestamp(0),
            limit: None,
            batch_size: 1024,
        };
        let mut tables = BTreeMap::new();
        for batch in self.catalog.scan(spec, None)? {
            let batch = batch?;
            let infos = batch
                .column(0)
                .as_any()
                .downcast_ref::<StringArray>()
                .ok_or_else(|| {
                    EngineError::CatalogCorrupted("info column is not a string".into())
                })?;
            for info in infos.iter().flatten() {
                let info: TableInfo = serde_json::from_str(info)
                    .map_err(|e| EngineError::CatalogCorrupted(e.to_string()))?;
                tables.insert(info.name.clone(), Arc::new(info));
            }
        }
        *self.tables.write() = tables;
        self.loaded
            .store(applied, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Deletes tablets no table owns (a crash during CREATE or DROP TABLE) and recreates tablets
    /// a table owns but the server lacks.
    fn reconcile_tablets(&self) -> Result<()> {
        // In a cluster, tablet servers own their replicas (re-replication is the cluster's).
        let TabletHost::Local(tserver) = &self.host else {
            return Ok(());
        };
        let tables = self.tables.read().clone();
        let owned: HashSet<&str> = tables
            .values()
            .flat_map(|t| t.tablets.iter().map(String::as_str))
            .collect();
        for id in tserver.tablet_ids() {
            if !owned.contains(id.as_str()) {
                tracing::warn!(tablet = %id, "deleting orphan tablet");
                tserver.delete_tablet(&id)?;
            }
        }
        for table in tables.values() {
            for id in &table.tablets {
                match tserver.replica(id) {
                    Err(_) => {
                        tracing::error!(table = %table.name, tablet = %id, "tablet missing; recreating it empty");
                        tserver.create_tablet(id, &table.schema)?;
                    }
                    // A schema change committed to the catalog that a crash kept from this
                    // tablet: finish it.
                    Ok(replica) if *replica.schema() != table.schema => {
                        tracing::warn!(table = %table.name, tablet = %id, "finishing an interrupted schema change");
                        futures::executor::block_on(replica.alter_schema(&table.schema))?;
                    }
                    Ok(_) => {}
                }
            }
        }
        Ok(())
    }

    pub fn table(&self, name: &str) -> Option<Arc<TableInfo>> {
        self.refresh();
        self.tables.read().get(name).cloned()
    }

    /// All tables, sorted by name.
    pub fn tables(&self) -> Vec<Arc<TableInfo>> {
        self.refresh();
        self.tables.read().values().cloned().collect()
    }

    /// Creates a table and its tablets. Returns `Ok(false)` if it exists and `if_not_exists`.
    /// `replicas`: replicas of each tablet (0: the default).
    pub async fn create_table(
        &self,
        name: &str,
        schema: Schema,
        partition: PartitionSchema,
        if_not_exists: bool,
        replicas: usize,
    ) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        if self.table(name).is_some() {
            return if if_not_exists {
                Ok(false)
            } else {
                Err(EngineError::TableExists(name.into()))
            };
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let info = TableInfo {
            tablets: (0..partition.num_tablets())
                .map(|t| format!("{id}-{t}"))
                .collect(),
            id,
            name: name.to_string(),
            schema,
            partition,
            replicas,
            placement: BTreeMap::new(),
        };
        self.create_tablets_and_commit(&info.tablets, info.clone())
            .await?;
        Ok(true)
    }

    /// Creates `tablets` (with the table's schema), then commits `info` to the catalog; if
    /// either fails, the new tablets are deleted and nothing changes.
    async fn create_tablets_and_commit(
        &self,
        tablets: &[String],
        mut info: TableInfo,
    ) -> Result<()> {
        let mut created = Ok(());
        for t in tablets {
            match self
                .host
                .create_tablet(t, &info.schema, info.replicas)
                .await
            {
                Ok(servers) if servers.is_empty() => {}
                Ok(servers) => {
                    info.placement.insert(t.clone(), servers);
                }
                Err(e) => {
                    created = Err(e);
                    break;
                }
            }
        }
        let committed = match created {
            Ok(()) => self.write_catalog(WriteKind::Upsert, &info).await,
            Err(e) => Err(e),
        };
        if let Err(e) = committed {
            for tablet in tablets {
                let _ = self.delete_tablet(&info, tablet).await;
            }
            return Err(e);
        }
        self.tables
            .write()
            .insert(info.name.clone(), Arc::new(info));
        Ok(())
    }

    /// Re-replication, one tablet at a time (on the master that leads the catalog): a tablet
    /// with a replica on a server silent for longer than `unavailable`, or that the tablet's
    /// leader has not heard from for that long, gets a new replica on a
    /// live server that has none: copied from the leader, added as a learner, promoted to voter
    /// once it has caught up, and then the silent member is removed and the catalog updated.
    /// Returns whether a tablet was repaired.
    pub async fn repair_once(&self, cluster: &Cluster, unavailable: Duration) -> Result<bool> {
        if self.catalog.group_state().leader != self.catalog.node_id() {
            return Ok(false);
        }
        self.delete_stale_replicas(cluster).await;
        for table in self.tables() {
            for (tablet, servers) in &table.placement {
                // A member whose server is silent, or whom the leader does not hear from.
                let gone = |s: u64| {
                    cluster.silent_for(s).is_none_or(|t| t > unavailable)
                        || cluster
                            .unreachable_for(tablet, s)
                            .is_some_and(|t| t > unavailable)
                };
                let Some(&dead) = servers.iter().find(|s| gone(**s)) else {
                    continue;
                };
                let Some(leader) = cluster
                    .leader_of(tablet)
                    .filter(|l| servers.contains(l) && *l != dead)
                else {
                    continue;
                };
                let mut candidates: Vec<(u64, String, usize)> = cluster
                    .live_servers()
                    .into_iter()
                    .filter(|(id, _, _)| {
                        !servers.contains(id) && cluster.replica_status(*id, tablet).is_none()
                    })
                    .collect();
                candidates.sort_by_key(|(id, _, held)| (*held, *id));
                let Some((target, target_address, _)) = candidates.into_iter().next() else {
                    tracing::warn!(%tablet, "no live server to re-replicate to");
                    continue;
                };
                tracing::info!(%tablet, dead, target, "re-replicating");
                self.replace_replica(
                    cluster,
                    &table,
                    tablet,
                    servers,
                    leader,
                    dead,
                    target,
                    target_address,
                )
                .await?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Deletes replicas that live servers hold but that belong to no table, or that their
    /// tablet's group no longer counts as members (a server back after it was replaced, or a
    /// copy whose re-replication failed).
    async fn delete_stale_replicas(&self, cluster: &Cluster) {
        // Holding the DDL lock: a table being created has replicas before the catalog has it.
        let _ddl = self.ddl.lock().await;
        let placement: HashMap<String, Vec<u64>> = self
            .tables()
            .iter()
            .flat_map(|t| {
                t.tablets
                    .iter()
                    .map(move |id| (id.clone(), t.placement.get(id).cloned().unwrap_or_default()))
            })
            .collect();
        for (server, _, _) in cluster.live_servers() {
            for replica in cluster.replicas_of(server) {
                let tablet = &replica.tablet_id;
                let stale = match placement.get(tablet) {
                    None => true,
                    Some(servers) if servers.contains(&server) => false,
                    Some(_) => cluster
                        .leader_of(tablet)
                        .and_then(|l| cluster.replica_status(l, tablet))
                        .is_some_and(|r| {
                            !r.voters.contains(&server) && !r.learners.contains(&server)
                        }),
                };
                if !stale {
                    continue;
                }
                tracing::info!(%tablet, server, "deleting a stale replica");
                let deleted = cluster
                    .call_server(
                        server,
                        request::Kind::DeleteReplica(crate::rpc::TabletRef {
                            tablet_id: tablet.clone(),
                        }),
                    )
                    .await;
                if let Err(e) = deleted {
                    tracing::warn!(%tablet, server, error = %e, "cannot delete a stale replica");
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn replace_replica(
        &self,
        cluster: &Cluster,
        table: &TableInfo,
        tablet: &str,
        servers: &[u64],
        leader: u64,
        dead: u64,
        target: u64,
        target_address: String,
    ) -> Result<()> {
        let ok = |r: crate::rpc::RpcResponse| {
            if r.error.is_empty() {
                Ok(())
            } else {
                Err(EngineError::Remote(r.error))
            }
        };
        let mut peers: Vec<Peer> = Vec::new();
        for &s in servers.iter().filter(|&&s| s != dead) {
            peers.push(Peer {
                server_id: s,
                address: cluster.address(s)?,
            });
        }
        peers.push(Peer {
            server_id: target,
            address: target_address.clone(),
        });
        ok(cluster
            .call_server(
                target,
                request::Kind::CopyTablet(CopyTablet {
                    tablet_id: tablet.into(),
                    source: cluster.address(leader)?,
                    peers,
                }),
            )
            .await?)?;
        let change = |change: &str, server: u64, address: String| {
            let change = ChangeMembership {
                tablet_id: tablet.into(),
                change: change.into(),
                server_id: server,
                address,
            };
            async move {
                cluster
                    .call_leader(tablet, || request::Kind::ChangeMembership(change.clone()))
                    .await
                    .map(drop)
            }
        };
        change("add_learner", target, target_address.clone()).await?;
        // Promote once the learner has applied what the leader had committed, as the
        // servers' reports tell.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
        loop {
            let reported = cluster.report_received();
            let mut reported = std::pin::pin!(reported);
            reported.as_mut().enable();
            let committed = cluster
                .leader_of(tablet)
                .and_then(|l| cluster.replica_status(l, tablet))
                .map(|r| r.commit);
            let applied = cluster
                .replica_status(target, tablet)
                .map(|r| r.last_applied);
            if let (Some(c), Some(a)) = (committed, applied) {
                if a >= c {
                    break;
                }
            }
            if tokio::time::timeout_at(deadline, reported).await.is_err() {
                return Err(EngineError::Unavailable(format!(
                    "the new replica of tablet {tablet} did not catch up"
                )));
            }
        }
        change("add_voter", target, target_address).await?;
        change("remove", dead, String::new()).await?;
        let _ddl = self.ddl.lock().await;
        let Some(current) = self.table(&table.name) else {
            return Ok(());
        };
        let mut updated = (*current).clone();
        if let Some(placed) = updated.placement.get_mut(tablet) {
            placed.retain(|&s| s != dead);
            placed.push(target);
        }
        self.write_catalog(WriteKind::Upsert, &updated).await?;
        self.tables
            .write()
            .insert(updated.name.clone(), Arc::new(updated));
        Ok(())
    }

    /// Deletes tablet `id` of table `info` wherever its replicas are.
    async fn delete_tablet(&self, info: &TableInfo, id: &str) -> Result<()> {
        let servers = info.placement.get(id).cloned().unwrap_or_default();
        self.host.delete_tablet(id, &servers).await
    }

    /// The table called `name`, or a TableNotFound error.
    fn existing(&self, name: &str) -> Result<Arc<TableInfo>> {
        self.table(name)
            .ok_or_else(|| EngineError::TableNotFound(name.into()))
    }

    /// Runs one DDL statement; whether it did something (a CREATE or DROP with IF [NOT]
    /// EXISTS may not).
    pub async fn ddl(&self, op: DdlOp) -> Result<bool> {
        match op {
            DdlOp::CreateTable {
                name,
                schema,
                partition,
                if_not_exists,
                replicas,
            } => {
                self.create_table(&name, schema, partition, if_not_exists, replicas)
                    .await
            }
            DdlOp::DropTable { name, if_exists } => self.drop_table(&name, if_exists).await,
            DdlOp::RenameTable { name, new_name } => {
                self.rename_table(&name, &new_name).await.map(|()| true)
            }
            DdlOp::AlterColumns { name, changes } => {
                self.alter_columns(&name, &changes).await.map(|()| true)
            }
            DdlOp::AddRangePartition { name, range } => {
                self.add_range_partition(&name, &range).await.map(|()| true)
            }
            DdlOp::DropRangePartition { name, range } => self
                .drop_range_partition(&name, &range)
                .await
                .map(|()| true),
        }
    }

    /// Drops a table and deletes its tablets. Returns `Ok(false)` if it is absent and `if_exists`.
    pub async fn drop_table(&self, name: &str, if_exists: bool) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        let Some(info) = self.table(name) else {
            return if if_exists {
                Ok(false)
            } else {
                Err(EngineError::TableNotFound(name.into()))
            };
        };
        self.write_catalog(WriteKind::Delete, &info).await?;
        self.tables.write().remove(name);
        for tablet in &info.tablets {
            if let Err(e) = self.delete_tablet(&info, tablet).await {
                // The catalog no longer owns it: the next start deletes it.
                tracing::warn!(tablet = %tablet, error = %e, "could not delete tablet of dropped table");
            }
        }
        Ok(true)
    }

    /// Renames a table; its tablets and data stay as they are.
    pub async fn rename_table(&self, name: &str, new_name: &str) -> Result<()> {
        let _ddl = self.ddl.lock().await;
        let info = self.existing(name)?;
        if self.table(new_name).is_some() {
            return Err(EngineError::TableExists(new_name.into()));
        }
        let renamed = TableInfo {
            name: new_name.to_string(),
            ..(*info).clone()
        };
        self.write_catalog(WriteKind::Upsert, &renamed).await?;
        let mut tables = self.tables.write();
        tables.remove(name);
        tables.insert(new_name.to_string(), Arc::new(renamed));
        Ok(())
    }

    /// Adds, drops or renames columns. The catalog commits the new schema first, then every
    /// tablet rewrites its data to it through its log; a crash in between is finished on the
    /// next start (see `reconcile_tablets`).
    pub async fn alter_columns(&self, name: &str, changes: &[ColumnChange]) -> Result<()> {
        let _ddl = self.ddl.lock().await;
        let info = self.existing(name)?;
        let mut schema = info.schema.clone();
        for change in changes {
            schema = match change {
                ColumnChange::Add(column) => schema.with_column_added(column.clone())?,
                ColumnChange::Drop(column) => schema.with_column_dropped(column)?,
                ColumnChange::Rename { name, new_name } => {
                    schema.with_column_renamed(name, new_name)?
                }
            };
        }
        // Partition columns are key columns, which stay; only their positions may move.
        let sources = info.schema.sources_in(&schema);
        let partition = info
            .partition
            .with_columns_moved(|c| sources[c].unwrap_or(c));
        let altered = TableInfo {
            schema,
            partition,
            ..(*info).clone()
        };
        self.write_catalog(WriteKind::Upsert, &altered).await?;
        self.tables
            .write()
            .insert(name.to_string(), Arc::new(altered.clone()));
        for tablet in &altered.tablets {
            self.host.alter_schema(tablet, &altered.schema).await?;
        }
        Ok(())
    }

    /// Adds a range partition to a range-partitioned table: its tablets (one per hash bucket
    /// combination) are created, then the catalog commits them.
    pub async fn add_range_partition(&self, name: &str, range: &RangeSpec) -> Result<()> {
        let _ddl = self.ddl.lock().await;
        let info = self.existing(name)?;
        let (partition, at) = info.partition.add_range(&info.schema, range)?;
        let per_range = partition.tablets_per_range();
        let prefix = uuid::Uuid::new_v4().simple().to_string();
        let new: Vec<String> = (0..per_range)
            .map(|c| format!("{}-{}-{c}", info.id, &prefix[..8]))
            .collect();
        let mut tablets = info.tablets.clone();
        tablets.splice(at * per_range..at * per_range, new.iter().cloned());
        let added = TableInfo {
            partition,
            tablets,
            ..(*info).clone()
        };
        self.create_tablets_and_commit(&new, added).await
    }

    /// Drops a range partition, deleting its tablets and their rows.
    pub async fn drop_range_partition(&self, name: &str, range: &RangeSpec) -> Result<()> {
        let _ddl = self.ddl.lock().await;
        let info = self.existing(name)?;
        let (partition, at) = info.partition.drop_range(&info.schema, range)?;
        let per_range = info.partition.tablets_per_range();
        let mut tablets = info.tablets.clone();
        let removed: Vec<String> = tablets
            .drain(at * per_range..(at + 1) * per_range)
            .collect();
        let dropped = TableInfo {
            partition,
            tablets,
            ..(*info).clone()
        };
        self.write_catalog(WriteKind::Upsert, &dropped).await?;
        self.tables
            .write()
            .insert(name.to_string(), Arc::new(dropped));
        for tablet in &removed {
            if let Err(e) = self.delete_tablet(&info, tablet).await {
                tracing::warn!(tablet = %tablet, error = %e, "could not delete tablet of dropped range");
            }
        }
        Ok(())
    }

    async fn write_catalog(&self, kind: WriteKind, info: &TableInfo) -> Result<()> {
        let json = serde_json::to_string(info)
            .map_err(|e| EngineError::CatalogCorrupted(e.to_string()))?;
        let schema = self.catalog.schema().arrow_schema();
        let rows = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec![info.id.as_str()])) as Arc<dyn Array>,
                Arc::new(StringArray::from(vec![info.name.as_str()])),
                Arc::new(StringArray::from(vec![json])),
            ],
        )?;
        match self.catalog.write(&WriteBatch { kind, rows }).await {
            Ok(_) => {
                // Our own change is in `tables` already.
                self.loaded.fetch_max(
                    self.catalog.last_applied(),
                    std::sync::atomic::Ordering::AcqRel,
                );
                Ok(())
            }
            Err(EngineError::Raft(nyala_raft::RaftError::NotLeader { leader_hint })) => {
                Err(EngineError::NotLeaderMaster {
                    leader: leader_hint.map(|l| match self.masters.get(&l) {
                        Some(address) => format!("the master at {address}"),
                        None => format!("master {l}"),
                    }),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Flushes and stops the catalog tablet.
    pub fn shutdown(&self) -> Result<()> {
        self.catalog.shutdown()
    }
}
