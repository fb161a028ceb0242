//! The client the SQL layer uses: DDL through the master, writes split by partition key and sent
//! to each tablet, scans of one tablet at a time.
//!
//! A write of one batch is atomic per tablet, not across tablets: when one tablet rejects its
//! part (say, a duplicate key), the parts already accepted by other tablets stay, and
//! [`WriteError`] says how many rows were applied.

use std::path::Path;
use std::sync::Arc;

use arrow::array::RecordBatch;
use futures::future::join_all;
use nyala_storage::{
    ScanIterator, ScanSpec, Schema, TabletOptions, Timestamp, WriteBatch, WriteKind,
};

use crate::clock::HybridClock;
use crate::host::{Cluster, TabletHost};
use crate::master::{ColumnChange, Master, TableInfo};
use crate::partition::{PartitionSchema, RangeSpec};
use crate::remote::{DdlOp, RemoteMaster};
use crate::tserver::TabletServer;
use crate::{EngineError, Result};

/// Upper bound on the Arrow memory of one replicated write; larger batches are split so a log
/// entry never grows without bound.
const MAX_WRITE_BYTES: usize = 8 << 20;

/// A write that failed after `applied` rows of it had been applied (in other tablets).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct WriteError {
    pub applied: usize,
    #[source]
    pub error: EngineError,
}

#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    master: MasterHandle,
    host: TabletHost,
}

/// The catalog: this process's master, or the masters of the cluster a coordinator belongs to.
enum MasterHandle {
    Local(Master),
    Remote(Arc<RemoteMaster>),
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Client")
    }
}

/// A table as the client sees it: its definition, for routing and scans.
pub type TableHandle = Arc<TableInfo>;

impl Client {
    /// Opens an embedded single node (master and tablet server in this process) in `data_dir`,
    /// holding at most about `memory_limit` bytes of unflushed data over all its tablets.
    pub fn open_embedded(
        data_dir: &Path,
        options: TabletOptions,
        memory_limit: usize,
    ) -> Result<Self> {
        let clock = Arc::new(HybridClock::new());
        let tserver = TabletServer::open(
            &data_dir.join("tserver"),
            options,
            memory_limit,
            clock.clone(),
            None,
        )?;
        let host = TabletHost::Local(tserver);
        let master = Master::open(&data_dir.join("master"), clock, host.clone(), None)?;
        Ok(Self {
            inner: Arc::new(Inner {
                master: MasterHandle::Local(master),
                host,
            }),
        })
    }

    /// A coordinator of the cluster whose masters listen at `masters`: it reads the catalog
    /// and the tablet servers from them, and sends DDL to the one that leads the catalog.
    pub async fn connect_cluster(masters: Vec<String>) -> Result<Self> {
        let cluster = Cluster::new(3, tokio::runtime::Handle::current());
        let remote = RemoteMaster::connect(masters, cluster.clone()).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                master: MasterHandle::Remote(remote),
                host: TabletHost::Cluster(cluster),
            }),
        })
    }

    /// Opens the master of a cluster in `data_dir` (its catalog, replicated among the masters
    /// with `replication`), whose tablets live on the tablet servers `cluster` knows from their
    /// heartbeats.
    pub fn open_cluster(
        data_dir: &Path,
        cluster: Arc<Cluster>,
        replication: Option<crate::replica::Replication>,
    ) -> Result<Self> {
        let clock = Arc::new(HybridClock::new());
        let host = TabletHost::Cluster(cluster);
        let master = Master::open(&data_dir.join("master"), clock, host.clone(), replication)?;
        Ok(Self {
            inner: Arc::new(Inner {
                master: MasterHandle::Local(master),
                host,
            }),
        })
    }

    /// Runs one DDL statement on the catalog: this process's master, or the cluster's leading
    /// master; whether it did something.
    pub async fn ddl(&self, op: DdlOp) -> Result<bool> {
        match &self.inner.master {
            MasterHandle::Local(m) => m.ddl(op).await,
            MasterHandle::Remote(r) => r.ddl(op).await,
        }
    }

    pub async fn create_table(
        &self,
        name: &str,
        schema: Schema,
        partition: PartitionSchema,
        if_not_exists: bool,
        replicas: usize,
    ) -> Result<bool> {
        self.ddl(DdlOp::CreateTable {
            name: name.into(),
            schema,
            partition,
            if_not_exists,
            replicas,
        })
        .await
    }

    pub async fn rename_table(&self, name: &str, new_name: &str) -> Result<()> {
        let (name, new_name) = (name.into(), new_name.into());
        self.ddl(DdlOp::RenameTable { name, new_name })
            .await
            .map(drop)
    }

    pub async fn alter_columns(&self, name: &str, changes: &[ColumnChange]) -> Result<()> {
        let (name, changes) = (name.into(), changes.to_vec());
        self.ddl(DdlOp::AlterColumns { name, changes })
            .await
            .map(drop)
    }

    pub async fn add_range_partition(&self, name: &str, range: &RangeSpec) -> Result<()> {
        let (name, range) = (name.into(), range.clone());
        self.ddl(DdlOp::AddRangePartition { name, range })
            .await
            .map(drop)
    }

    pub async fn drop_range_partition(&self, name: &str, range: &RangeSpec) -> Result<()> {
        let (name, range) = (name.into(), range.clone());
        self.ddl(DdlOp::DropRangePartition { name, range })
            .await
            .map(drop)
    }

    pub async fn drop_table(&self, name: &str, if_exists: bool) -> Result<bool> {
        let name = name.into();
        self.ddl(DdlOp::DropTable { name, if_exists }).await
    }

    pub fn table(&self, name: &str) -> Result<TableHandle> {
        let table = match &self.inner.master {
            MasterHandle::Local(m) => m.table(name),
            MasterHandle::Remote(r) => r.table(name),
        };
        table.ok_or_else(|| EngineError::TableNotFound(name.into()))
    }

    pub fn tables(&self) -> Vec<TableHandle> {
        match &self.inner.master {
            MasterHandle::Local(m) => m.tables(),
            MasterHandle::Remote(r) => r.tables(),
        }
    }

    /// Writes `rows` (see [`WriteBatch`] for the columns each kind needs) to `table`.
    /// Returns the number of rows applied.
    pub async fn write(
        &self,
        table: &TableInfo,
        kind: WriteKind,
        rows: &RecordBatch,
    ) -> Result<usize, WriteError> {
        let parts = table
            .partition
            .split(&table.schema, rows)
            .map_err(|error| WriteError { applied: 0, error })?;
        let writes = parts.into_iter().map(|(tablet, rows)| async move {
            let tablet = &table.tablets[tablet];
            let mut applied = 0;
            for chunk in chunks(&rows) {
                applied += self
                    .inner
                    .host
                    .write(tablet, &WriteBatch { kind, rows: chunk })
                    .await
                    .map_err(|error| WriteError { applied, error })?;
            }
            Ok::<usize, WriteError>(applied)
        });
        let mut applied = 0;
        let mut first_error = None;
        for result in join_all(writes).await {
            match result {
                Ok(n) => applied += n,
                Err(e) => {
                    applied += e.applied;
                    first_error.get_or_insert(e.error);
                }
            }
        }
        match first_error {
            None => Ok(applied),
            Some(error) => Err(WriteError { applied, error }),
        }
    }

    /// Scans tablet number `tablet` of `table` at `snapshot` (None: that tablet's current safe snapshot).
    pub fn scan_tablet(
        &self,
        table: &TableInfo,
        tablet: usize,
        spec: ScanSpec,
        snapshot: Option<Timestamp>,
    ) -> Result<ScanIterator> {
        let tablet = table.tablets.get(tablet).ok_or_else(|| {
            EngineError::TabletNotFound(format!("tablet {tablet} of table {}", table.name))
        })?;
        self.inner.host.scan(tablet, spec, snapshot)
    }

    /// About how many rows tablet number `tablet` holds (all tablets: None), for planning.
    pub fn estimated_rows(&self, table: &TableInfo, tablet: Option<usize>) -> usize {
        let tablets = match tablet {
            Some(b) => table.tablets.get(b..=b).unwrap_or_default(),
            None => &table.tablets[..],
        };
        tablets
            .iter()
            .filter_map(|t| self.inner.host.stats(t).ok())
            .map(|s| s.estimated_rows)
            .sum()
    }

    /// A snapshot at which every tablet of `table` has applied every write it will ever take
    /// below it: reading all of them at it gives one consistent, repeatable view.
    pub fn safe_snapshot(&self, table: &TableInfo) -> Result<Timestamp> {
        let mut snapshot = Timestamp(u64::MAX);
        for t in &table.tablets {
            snapshot = snapshot.min(self.inner.host.safe_snapshot(t)?);
        }
        Ok(snapshot)
    }

    /// The size and shape of each tablet of `table`, in tablet order.
    pub fn tablet_stats(&self, table: &TableInfo) -> Result<Vec<TabletStats>> {
        table
            .tablets
            .iter()
            .map(|t| {
                let mut stats = self.inner.host.stats(t)?;
                // The catalog knows where every replica was placed.
                if let Some(servers) = table.placement.get(t) {
                    stats.replicas = servers.len();
                }
                Ok(stats)
            })
            .collect()
    }

    /// Starts re-replication in the background (a cluster's master): replicas on tablet
    /// servers silent for longer than `unavailable` are re-created elsewhere.
    pub fn start_repairs(&self, unavailable: std::time::Duration) {
        let TabletHost::Cluster(cluster) = &self.inner.host else {
            return;
        };
        let cluster = cluster.clone();
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                let Some(inner) = inner.upgrade() else { return };
                let MasterHandle::Local(master) = &inner.master else {
                    return;
                };
                if let Err(e) = master.repair_once(&cluster, unavailable).await {
                    tracing::warn!(error = %e, "re-replication failed; retrying");
                }
            }
        });
    }

    /// The catalog's replica (None on a coordinator that is not a master).
    pub fn catalog(&self) -> Option<Arc<crate::replica::TabletReplica>> {
        match &self.inner.master {
            MasterHandle::Local(m) => Some(m.catalog().clone()),
            MasterHandle::Remote(_) => None,
        }
    }

    /// Flushes every tablet and the catalog, then stops them.
    pub fn shutdown(&self) -> Result<()> {
        let tablets = match &self.inner.host {
            TabletHost::Local(tserver) => tserver.shutdown(),
            TabletHost::Cluster(_) => Ok(()),
        };
        let catalog = match &self.inner.master {
            MasterHandle::Local(m) => m.shutdown(),
            MasterHandle::Remote(_) => Ok(()),
        };
        tablets.and(catalog)
    }
}

/// What [`Client::tablet_stats`] reports of one tablet.
#[derive(Clone, Debug, Default)]
pub struct TabletStats {
    pub id: String,
    /// Rows in memory and on disk, counting deleted and updated rows too.
    pub estimated_rows: usize,
    pub disk_bytes: u64,
    /// Unflushed data.
    pub memory_bytes: usize,
    /// DiskRowSets.
    pub rowsets: usize,
    /// UNDO and REDO delta files of all rowsets.
    pub delta_files: usize,
    /// Column files of all rowsets (new base data of updated columns).
    pub column_files: usize,
    /// Compactions run since the server started.
    pub compactions: u64,
    /// Where its leader is ("local" in the embedded node).
    pub leader: String,
    pub replicas: usize,
}

/// Splits a batch into slices of at most [`MAX_WRITE_BYTES`] of Arrow memory (zero-copy).
fn chunks(rows: &RecordBatch) -> Vec<RecordBatch> {
    let bytes = rows.get_array_memory_size().max(1);
    let n = rows.num_rows();
    if bytes <= MAX_WRITE_BYTES || n <= 1 {
        return vec![rows.clone()];
    }
    let per_chunk = (n * MAX_WRITE_BYTES / bytes).max(1);
    (0..n)
        .step_by(per_chunk)
        .map(|start| rows.slice(start, per_chunk.min(n - start)))
        .collect()
}
