//! The client the SQL layer uses: DDL through the master, writes split by partition key and sent
//! to each tablet, scans of one tablet at a time.
//!
//! A write of one batch is atomic per tablet, not across tablets: when one tablet rejects its
//! part (say, a duplicate key), the parts already accepted by other tablets stay, and
//! [`WriteError`] says how many rows were applied.

use std::sync::Arc;

use arrow::array::RecordBatch;
use futures::future::join_all;
use nyala_storage::{ScanIterator, ScanSpec, Timestamp, WriteBatch, WriteKind};

use crate::catalog::{Catalog, DdlOp, TableInfo};
use crate::{EngineError, Result};

pub mod admin;
pub mod meta_cache;
pub mod remote_catalog;
pub mod tablets;

pub use admin::AdminClient;
pub use meta_cache::MetaCache;
pub use remote_catalog::RemoteCatalog;
pub use tablets::{RemoteTablets, TabletStats, Tablets};

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

/// The client the SQL layer uses.
///
/// ```ignore
/// let client = Client::connect_cluster(vec!["master:7051".into()]).await?;
/// let table = client.table("events")?;
/// client.write(&table, WriteKind::Insert, &rows).await?;
/// let batches = client.scan_tablet(&table, 0, ScanSpec::default(), None)?;
/// ```
#[derive(Clone)]
pub struct Client {
    catalog: Arc<dyn Catalog>,
    tablets: Arc<dyn Tablets>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Client")
    }
}

/// A table as the client sees it: its definition, for routing and scans.
pub type TableHandle = Arc<TableInfo>;

impl Client {
    /// A client of the catalog `catalog` and the tablets `tablets` (see
    /// [`crate::embedded::open`] for the embedded node, [`crate::master::MasterNode`] for a
    /// master, [`Client::connect_cluster`] for a coordinator).
    pub fn new(catalog: Arc<dyn Catalog>, tablets: Arc<dyn Tablets>) -> Self {
        Self { catalog, tablets }
    }

    /// A coordinator of the cluster whose masters listen at `masters`: it reads the catalog
    /// and the tablet servers from them, and sends DDL to the one that leads the catalog.
    pub async fn connect_cluster(masters: Vec<String>) -> Result<Self> {
        let meta = Arc::new(MetaCache::default());
        let catalog = RemoteCatalog::connect(masters, meta.clone()).await?;
        let tablets = RemoteTablets::new(meta, tokio::runtime::Handle::current());
        Ok(Self::new(catalog, Arc::new(tablets)))
    }

    /// Runs one DDL statement on the catalog: this process's master, or the cluster's leading
    /// master; whether it did something.
    pub async fn ddl(&self, op: DdlOp) -> Result<bool> {
        self.catalog.ddl(op).await
    }

    pub fn table(&self, name: &str) -> Result<TableHandle> {
        self.catalog
            .table(name)
            .ok_or_else(|| EngineError::TableNotFound(name.into()))
    }

    pub fn tables(&self) -> Vec<TableHandle> {
        self.catalog.tables()
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
                    .tablets
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
        self.tablets.scan(tablet, spec, snapshot)
    }

    /// About how many rows tablet number `tablet` holds (all tablets: None), for planning.
    pub fn estimated_rows(&self, table: &TableInfo, tablet: Option<usize>) -> usize {
        let tablets = match tablet {
            Some(b) => table.tablets.get(b..=b).unwrap_or_default(),
            None => &table.tablets[..],
        };
        tablets
            .iter()
            .filter_map(|t| self.tablets.stats(t).ok())
            .map(|s| s.estimated_rows)
            .sum()
    }

    /// A snapshot at which every tablet of `table` has applied every write it will ever take
    /// below it: reading all of them at it gives one consistent, repeatable view.
    pub async fn safe_snapshot(&self, table: &TableInfo) -> Result<Timestamp> {
        let snapshots = join_all(table.tablets.iter().map(|t| self.tablets.safe_snapshot(t)));
        let mut snapshot = Timestamp(u64::MAX);
        for tablet in snapshots.await {
            snapshot = snapshot.min(tablet?);
        }
        Ok(snapshot)
    }

    /// The size and shape of each tablet of `table`, in tablet order.
    pub fn tablet_stats(&self, table: &TableInfo) -> Result<Vec<TabletStats>> {
        table
            .tablets
            .iter()
            .map(|t| {
                let mut stats = self.tablets.stats(t)?;
                // The catalog knows where every replica was placed.
                if let Some(servers) = table.placement.get(t) {
                    stats.replicas = servers.len();
                }
                Ok(stats)
            })
            .collect()
    }

    /// Flushes every tablet and the catalog, then stops them.
    pub fn shutdown(&self) -> Result<()> {
        let tablets = self.tablets.shutdown();
        tablets.and(self.catalog.shutdown())
    }
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
