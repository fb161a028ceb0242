//! The embedded single node (`nyala serve`): a master and one tablet server in this process.
//! The master places every tablet in the local tablet server and the client reads and writes
//! them in process, through the same seams a cluster uses over RPC
//! ([`TabletPlacement`], [`Tablets`]).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use nyala_storage::{
    ColumnRange, ScanIterator, ScanSpec, Schema, TabletOptions, Timestamp, WriteBatch, WriteOutcome,
};

use crate::catalog::TableInfo;
use crate::client::{Client, TabletStats, Tablets, TxnWritten};
use crate::clock::HybridClock;
use crate::master::{Master, TabletPlacement};
use crate::tserver::TabletServer;
use crate::{EngineError, Result};

/// An embedded single node: the client of its catalog and tablets, and its tablet server
/// (for operators: its maintenance, its replicas' state).
pub struct EmbeddedNode {
    pub client: Client,
    pub server: Arc<TabletServer>,
}

/// Opens an embedded single node in `data_dir`, holding at most about `memory_limit` bytes of
/// unflushed data over all its tablets. Blocking: it opens every tablet.
///
/// ```
/// # use nyala_engine::{DdlOp, PartitionSchema};
/// # use nyala_engine::storage::{ColumnSchema, ColumnType, Schema, TabletOptions};
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let node = nyala_engine::embedded::open(dir.path(), TabletOptions::default(), 2 << 30)?;
/// let schema = Schema::new(vec![ColumnSchema::new("id", ColumnType::Int64, false)], vec![0])?;
/// let partition = PartitionSchema::single();
/// node.client.ddl(DdlOp::CreateTable { name: "events".into(), schema, partition,
///     if_not_exists: false, replicas: 0, owner: None }).await?;
/// assert_eq!(node.client.table("events")?.tablets.len(), 1);
/// # node.client.shutdown()?;
/// # Ok(()) }
/// ```
pub fn open(data_dir: &Path, options: TabletOptions, memory_limit: usize) -> Result<EmbeddedNode> {
    let clock = Arc::new(HybridClock::new());
    let server = TabletServer::open(
        &data_dir.join("tserver"),
        options,
        memory_limit,
        clock.clone(),
        None,
    )?;
    let local = Arc::new(LocalTablets(server.clone()));
    let master = Arc::new(Master::open(
        &data_dir.join("master"),
        clock,
        local.clone(),
        None,
    )?);
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let (weak_master, weak_local) = (Arc::downgrade(&master), Arc::downgrade(&local));
        let client = move || {
            let (master, local) = (weak_master.upgrade(), weak_local.upgrade());
            let client = master.zip(local).map(|(m, l)| Client::new(m, l));
            std::future::ready(client)
        };
        runtime.spawn(crate::tserver::txns::resolve_abandoned(
            Arc::downgrade(&server),
            client,
        ));
    }
    Ok(EmbeddedNode {
        client: Client::new(master, local),
        server,
    })
}

/// The tablets of this process's tablet server.
struct LocalTablets(Arc<TabletServer>);

#[async_trait::async_trait]
impl TabletPlacement for LocalTablets {
    async fn create_tablet(&self, id: &str, schema: &Schema, replicas: usize) -> Result<Vec<u64>> {
        if replicas > 1 {
            return Err(EngineError::InvalidTable(format!(
                "replicas = {replicas}: this single node has one tablet server; run a \
                 cluster (nyala master + nyala tserver) for more replicas"
            )));
        }
        let (server, id, schema) = (self.0.clone(), id.to_string(), schema.clone());
        crate::rpc::blocking(move || server.create_tablet(&id, &schema)).await?;
        Ok(vec![])
    }

    async fn delete_tablet(&self, id: &str, _servers: &[u64]) -> Result<()> {
        let (server, id) = (self.0.clone(), id.to_string());
        crate::rpc::blocking(move || server.delete_tablet(&id)).await
    }

    async fn alter_schema(&self, id: &str, schema: &Schema) -> Result<()> {
        self.0.replica(id)?.alter_schema(schema).await
    }

    async fn clone_tablet(
        &self,
        id: &str,
        source: &str,
        as_of: Option<Timestamp>,
    ) -> Result<Vec<u64>> {
        let index = self.0.replica(source)?.clone_to(id, as_of).await?;
        self.0.open_clone(id, source, index, None).await?;
        Ok(vec![])
    }

    /// Deletes tablets no table owns (a crash during CREATE or DROP TABLE), recreates tablets
    /// a table owns but the server lacks, and finishes schema changes a crash interrupted.
    fn reconcile(&self, tables: &[Arc<TableInfo>]) -> Result<()> {
        let server = &self.0;
        let owned: HashSet<&str> = tables
            .iter()
            .flat_map(|t| t.tablets.iter().map(String::as_str))
            .collect();
        for id in server.tablet_ids() {
            if !owned.contains(id.as_str()) {
                tracing::warn!(tablet = %id, "deleting orphan tablet");
                server.delete_tablet(&id)?;
            }
        }
        for table in tables {
            for id in &table.tablets {
                match server.replica(id) {
                    Err(_) => {
                        tracing::error!(table = %table.name, tablet = %id, "tablet missing; recreating it empty");
                        server.create_tablet(id, &table.schema)?;
                    }
                    // A schema change committed to the catalog that a crash kept from this
                    // tablet: finish it (before the node serves anything).
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
}

#[async_trait::async_trait]
impl Tablets for LocalTablets {
    async fn write(&self, id: &str, batch: &WriteBatch) -> Result<WriteOutcome> {
        self.0.admit_write().await?;
        self.0.replica(id)?.write(batch).await
    }

    async fn txn_write(
        &self,
        id: &str,
        txn: u64,
        batch: &WriteBatch,
        prepare: bool,
    ) -> Result<TxnWritten> {
        self.0.admit_write().await?;
        let replica = self.0.replica(id)?;
        let (outcome, prepared) = replica.txn_write(txn, batch, prepare, None).await?;
        Ok(TxnWritten { outcome, prepared })
    }

    async fn prepare_txn(&self, id: &str, txn: u64) -> Result<Timestamp> {
        self.0.replica(id)?.prepare_txn(txn).await
    }

    async fn finish_txn(
        &self,
        id: &str,
        txn: u64,
        commit: Option<Timestamp>,
    ) -> Result<WriteOutcome> {
        self.0.replica(id)?.finish_txn(txn, commit).await
    }

    fn scan(&self, id: &str, spec: ScanSpec, snapshot: Option<Timestamp>) -> Result<ScanIterator> {
        self.0.replica(id)?.scan(spec, snapshot)
    }

    fn scan_if_ready(
        &self,
        id: &str,
        spec: ScanSpec,
        snapshot: Timestamp,
    ) -> Option<Result<ScanIterator>> {
        match self.0.replica(id) {
            Ok(replica) => replica.scan_if_ready(spec, snapshot),
            Err(e) => Some(Err(e)),
        }
    }

    async fn scan_waiting(
        &self,
        id: &str,
        spec: ScanSpec,
        snapshot: Option<Timestamp>,
        timeout: std::time::Duration,
    ) -> Result<ScanIterator> {
        let replica = self.0.replica(id)?;
        replica.scan_waiting(spec, snapshot, timeout).await
    }

    async fn safe_snapshot(&self, id: &str) -> Result<Timestamp> {
        Ok(self.0.replica(id)?.safe_snapshot())
    }

    async fn wait_for_write(
        &self,
        id: &str,
        after: Timestamp,
        timeout: std::time::Duration,
    ) -> Result<Timestamp> {
        let replica = self.0.replica(id)?;
        Ok(replica.wait_for_write(after, timeout).await)
    }

    fn stats(&self, id: &str) -> Result<TabletStats> {
        let replica = self.0.replica(id)?;
        let tablet = replica.tablet();
        Ok(TabletStats {
            id: id.to_string(),
            estimated_rows: tablet.estimated_rows(),
            disk_bytes: tablet.disk_bytes(),
            memory_bytes: tablet.memory_bytes(),
            rowsets: tablet.rowset_count(),
            delta_files: tablet.delta_file_count(),
            column_files: tablet.column_file_count(),
            compactions: tablet.compactions(),
            leader: "local".into(),
            replicas: 1,
        })
    }

    fn column_ranges(&self, id: &str) -> Vec<ColumnRange> {
        self.0
            .replica(id)
            .map_or_else(|_| Vec::new(), |replica| replica.tablet().column_ranges())
    }

    fn shutdown(&self) -> Result<()> {
        self.0.shutdown()
    }
}
