//! The client the SQL layer uses: DDL through the master, writes split by partition key and sent
//! to each tablet, scans of one tablet at a time.
//!
//! A write of one batch is atomic per tablet, not across tablets: when one tablet rejects its
//! part (say, a duplicate key), the parts already accepted by other tablets stay, and
//! [`WriteError`] says how many rows were applied.

use std::sync::Arc;

use arrow::array::RecordBatch;
use futures::future::join_all;
use nyala_storage::{
    ColumnRange, ScanIterator, ScanSpec, Timestamp, WriteBatch, WriteKind, WriteOutcome,
};

use crate::catalog::{Catalog, DdlOp, TableInfo, UserInfo, ViewInfo};
use crate::{EngineError, Result};

pub mod admin;
mod batched;
pub mod meta_cache;
pub mod remote_catalog;
pub mod tablets;
mod txn;

pub use admin::AdminClient;
pub use meta_cache::MetaCache;
pub use remote_catalog::RemoteCatalog;
pub use tablets::{RemoteTablets, TabletStats, Tablets, TxnWritten};
pub(crate) use txn::crash_point;
pub use txn::{Transaction, STATUS_TABLE};

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

/// What a write did: the rows applied, and how many rows were refused because they changed
/// after the snapshot they were read at (see [`Client::write_unchanged_since`]).
#[derive(Debug, Default)]
pub struct Written {
    pub rows: usize,
    pub conflicts: usize,
}

impl Written {
    /// Adds what one write did.
    fn absorb(&mut self, outcome: WriteOutcome) {
        self.rows += outcome.rows;
        self.conflicts += outcome.conflicts.len();
    }
}

/// How long a write waits for rows a transaction in progress has locked (it commits or aborts
/// within milliseconds, or is ended as abandoned within seconds).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `write` again while it meets rows locked by a transaction in progress, pausing longer
/// each time, for at most [`LOCK_WAIT`].
pub(crate) async fn when_unlocked<F, Fut, T>(write: F) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let started = std::time::Instant::now();
    let mut pause = std::time::Duration::from_micros(500);
    loop {
        match write().await {
            Err(EngineError::Storage(nyala_storage::StorageError::Locked { .. }))
                if started.elapsed() + pause < LOCK_WAIT =>
            {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_millis(50));
            }
            result => return result,
        }
    }
}

/// The names of the database's own tables begin with this.
pub const SYSTEM_PREFIX: &str = "__nyala_";

fn is_system_table(name: &str) -> bool {
    name.starts_with(SYSTEM_PREFIX)
}

/// The client the SQL layer uses.
///
/// ```no_run
/// # use nyala_engine::Client;
/// # use nyala_engine::storage::{ScanSpec, Timestamp, WriteKind};
/// # async fn sketch(rows: arrow::array::RecordBatch) -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::connect_cluster(vec!["master:7051".into()]).await?;
/// let table = client.table("events")?;
/// client.write(&table, WriteKind::Insert, &rows).await?;
/// let spec = ScanSpec { projection: None, predicates: vec![], snapshot: Timestamp(0),
///     limit: None, batch_size: 1024, string_views: false, changes_since: None };
/// for batch in client.scan_tablet(&table, 0, spec, None)? { let _rows = batch?; }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    catalog: Arc<dyn Catalog>,
    tablets: Arc<dyn Tablets>,
    /// The newest timestamp a write through this client became visible at: statements never
    /// read below it, so they see every write acknowledged before them, whichever tablets the
    /// writes and the reads went to.
    last_write: Arc<std::sync::atomic::AtomicU64>,
    /// Transactions whose status rows no participant will read again, to be deleted.
    settled: Arc<parking_lot::Mutex<txn::Settled>>,
    /// Read-held by each commit answered before its tablets were told, until they are
    /// ([`Client::wait_for_commits`]).
    telling: Arc<tokio::sync::RwLock<()>>,
}

/// A [`Client`] that does not keep its catalog and tablets alive: for background work that
/// must not hold a server its users have let go of.
pub(crate) struct WeakClient {
    catalog: std::sync::Weak<dyn Catalog>,
    tablets: std::sync::Weak<dyn Tablets>,
    last_write: Arc<std::sync::atomic::AtomicU64>,
    settled: Arc<parking_lot::Mutex<txn::Settled>>,
    telling: Arc<tokio::sync::RwLock<()>>,
}

impl WeakClient {
    /// The client, while its catalog and tablets live.
    pub(crate) fn upgrade(&self) -> Option<Client> {
        Some(Client {
            catalog: self.catalog.upgrade()?,
            tablets: self.tablets.upgrade()?,
            last_write: self.last_write.clone(),
            settled: self.settled.clone(),
            telling: self.telling.clone(),
        })
    }
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
        Self {
            catalog,
            tablets,
            last_write: Arc::default(),
            settled: Arc::default(),
            telling: Arc::default(),
        }
    }

    /// This client, not keeping its catalog and tablets alive.
    pub(crate) fn downgrade(&self) -> WeakClient {
        WeakClient {
            catalog: Arc::downgrade(&self.catalog),
            tablets: Arc::downgrade(&self.tablets),
            last_write: self.last_write.clone(),
            settled: self.settled.clone(),
            telling: self.telling.clone(),
        }
    }

    /// A coordinator of the cluster whose masters listen at `masters`: it reads the catalog
    /// and the tablet servers from them, and sends DDL to the one that leads the catalog.
    pub async fn connect_cluster(masters: Vec<String>) -> Result<Self> {
        Self::connect_cluster_at(masters, None).await
    }

    /// [`Client::connect_cluster`] from a process that is also the tablet server `local`:
    /// the tablets it leads are scanned in process.
    pub async fn connect_cluster_at(
        masters: Vec<String>,
        local: Option<Arc<crate::tserver::TabletServer>>,
    ) -> Result<Self> {
        let meta = Arc::new(MetaCache::default());
        let catalog = RemoteCatalog::connect(masters, meta.clone()).await?;
        let mut tablets = RemoteTablets::new(meta, tokio::runtime::Handle::current());
        if let Some(local) = local {
            tablets = tablets.with_local(local);
        }
        Ok(Self::new(catalog, Arc::new(tablets)))
    }

    /// The internal RPC addresses of the cluster's live tablet servers (empty in the
    /// embedded node).
    pub fn tablet_servers(&self) -> Vec<String> {
        self.tablets.servers()
    }

    /// Runs one DDL statement on the catalog: this process's master, or the cluster's leading
    /// master; whether it did something.
    /// Tables named with [`SYSTEM_PREFIX`] are the database's own, out of users' reach.
    pub async fn ddl(&self, op: DdlOp) -> Result<bool> {
        if op.table_names().any(is_system_table) {
            return Err(EngineError::InvalidTable(format!(
                "table names beginning with {SYSTEM_PREFIX} are reserved"
            )));
        }
        self.catalog.ddl(op).await
    }

    pub fn table(&self, name: &str) -> Result<TableHandle> {
        (self.catalog.table(name))
            .filter(|_| !is_system_table(name))
            .ok_or_else(|| EngineError::TableNotFound(name.into()))
    }

    /// The users' tables.
    pub fn tables(&self) -> Vec<TableHandle> {
        let mut tables = self.catalog.tables();
        tables.retain(|t| !is_system_table(&t.name));
        tables
    }

    /// All views, sorted by name.
    pub fn views(&self) -> Vec<Arc<ViewInfo>> {
        self.catalog.views()
    }

    /// All users, sorted by name.
    pub fn users(&self) -> Vec<Arc<UserInfo>> {
        self.catalog.users()
    }

    /// The user called `name`, if there is one.
    pub fn user(&self, name: &str) -> Option<Arc<UserInfo>> {
        self.catalog.users().into_iter().find(|u| u.name == name)
    }

    /// The view called `name`, if there is one.
    pub fn view(&self, name: &str) -> Option<Arc<ViewInfo>> {
        self.catalog.views().into_iter().find(|v| v.name == name)
    }

    /// Writes `rows` (see [`WriteBatch`] for the columns each kind needs) to `table`. Returns the
    /// number of rows applied.
    pub async fn write(
        &self,
        table: &TableInfo,
        kind: WriteKind,
        rows: &RecordBatch,
    ) -> Result<usize, WriteError> {
        self.write_rows(table, kind, rows, None, None, false)
            .await
            .map(|w| w.rows)
    }

    /// Whether `rows` go to one tablet in one write (which applies entirely or not at all; more
    /// need a [`Transaction`] to be atomic).
    pub fn is_single_write(&self, table: &TableInfo, rows: &RecordBatch) -> Result<bool> {
        // (The tablet of each row, without splitting the rows.)
        let tablets = table.partition.tablets(&table.schema, rows)?;
        let one_tablet = tablets.windows(2).all(|pair| pair[0] == pair[1]);
        Ok(one_tablet && chunks(rows).len() == 1)
    }

    /// Updates or deletes the rows `rows` name, read at `snapshot`, if they have not changed
    /// since: a tablet's write in which some did (or are gone) applies nothing and counts them
    /// in [`Written::conflicts`], for the caller to read them again (see
    /// [`WriteBatch::unchanged_since`]).
    pub async fn write_unchanged_since(
        &self,
        table: &TableInfo,
        kind: WriteKind,
        rows: &RecordBatch,
        snapshot: Timestamp,
    ) -> Result<Written, WriteError> {
        self.write_rows(table, kind, rows, Some(snapshot), None, false)
            .await
    }

    /// Writes `rows` to the tablets they belong to: each tablet's share in writes of its own,
    /// or, with `txn`, as writes of that transaction (each tablet becoming a participant). A
    /// write meeting rows a transaction in progress has locked waits for them, except a
    /// conditional one in a transaction (see [`when_unlocked`]).
    ///
    /// With `last`, these are the transaction's last writes: if it has several participants
    /// then, each tablet's last write also prepares it there (one log entry instead of two).
    pub(crate) async fn write_rows(
        &self,
        table: &TableInfo,
        kind: WriteKind,
        rows: &RecordBatch,
        unchanged_since: Option<Timestamp>,
        txn: Option<&Transaction>,
        last: bool,
    ) -> Result<Written, WriteError> {
        let parts = table
            .partition
            .split(&table.schema, rows)
            .map_err(|error| WriteError { applied: 0, error })?;
        if let Some(txn) = txn {
            txn.writes(&table.schema, kind);
        }
        let prepare = last
            && txn.is_some_and(|txn| {
                txn.participants_with(parts.iter().map(|(t, _)| &table.tablets[*t])) > 1
            });
        let writes = parts.into_iter().map(|(index, rows)| async move {
            let tablet = &table.tablets[index];
            if let Some(txn) = txn {
                txn.joins(tablet);
            }
            let mut written = Written::default();
            let chunks = chunks(&rows);
            let n = chunks.len();
            for (i, chunk) in chunks.into_iter().enumerate() {
                let mut batch = WriteBatch::new(kind, chunk);
                batch.unchanged_since = unchanged_since;
                batch.auto_ids = table.partition.auto_ids(&table.schema, index);
                let write = || async {
                    let Some(txn) = txn else {
                        return self.tablets.write(tablet, &batch).await;
                    };
                    let prepare = prepare && i + 1 == n;
                    let done = self.tablets.txn_write(tablet, txn.id(), &batch, prepare);
                    let done = done.await?;
                    if let Some(at) = done.prepared {
                        txn.prepared(tablet, at);
                    }
                    Ok(done.outcome)
                };
                // A conditional write in a transaction does not wait for locks while holding
                // its own: its statement starts again instead (two could wait for each other).
                let outcome = match (txn, unchanged_since) {
                    (Some(_), Some(_)) => write().await,
                    _ => when_unlocked(write).await,
                };
                let outcome = outcome.map_err(|error| WriteError {
                    applied: written.rows,
                    error,
                })?;
                self.written_at(outcome.visible_at);
                written.absorb(outcome);
            }
            Ok::<Written, WriteError>(written)
        });
        let mut written = Written::default();
        let mut first_error = None;
        for result in join_all(writes).await {
            match result {
                Ok(part) => {
                    written.rows += part.rows;
                    written.conflicts += part.conflicts;
                }
                Err(e) => {
                    written.rows += e.applied;
                    first_error.get_or_insert(e.error);
                }
            }
        }
        match first_error {
            None => Ok(written),
            Some(error) => Err(WriteError {
                applied: written.rows,
                error,
            }),
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

    /// [`Self::scan_tablet`], waiting up to `timeout` for rows to read (see
    /// [`Tablets::scan_waiting`]): a queue's long poll of one tablet.
    pub async fn scan_tablet_waiting(
        &self,
        table: &TableInfo,
        tablet: usize,
        spec: ScanSpec,
        snapshot: Option<Timestamp>,
        timeout: std::time::Duration,
    ) -> Result<ScanIterator> {
        let tablet = table.tablets.get(tablet).ok_or_else(|| {
            EngineError::TabletNotFound(format!("tablet {tablet} of table {}", table.name))
        })?;
        self.tablets
            .scan_waiting(tablet, spec, snapshot, timeout)
            .await
    }

    /// [`Self::scan_tablet`] at `snapshot`, if it can start without waiting (see
    /// [`Tablets::scan_if_ready`]).
    pub fn scan_tablet_if_ready(
        &self,
        table: &TableInfo,
        tablet: usize,
        spec: ScanSpec,
        snapshot: Timestamp,
    ) -> Option<Result<ScanIterator>> {
        let id = table.tablets.get(tablet)?;
        self.tablets.scan_if_ready(id, spec, snapshot)
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

    /// What tablet number `tablet` of `table` knows of its columns' values (see
    /// [`Tablets::column_ranges`]), by table column.
    pub fn column_ranges(&self, table: &TableInfo, tablet: usize) -> Vec<ColumnRange> {
        table
            .tablets
            .get(tablet)
            .map_or_else(Vec::new, |id| self.tablets.column_ranges(id))
    }

    /// A snapshot no older than any write to `table` acknowledged before the call, by this
    /// client or any other: the newest of its tablets' safe snapshots, each asked of a leader
    /// that confirmed it leads (a tablet whose own is older waits, when read at it, for its
    /// writes in flight below it). Reading all of them at it gives one consistent, repeatable
    /// view that includes every write acknowledged before.
    pub async fn safe_snapshot(&self, table: &TableInfo) -> Result<Timestamp> {
        let all: Vec<usize> = (0..table.tablets.len()).collect();
        self.safe_snapshot_of(table, &all).await
    }

    /// [`Client::safe_snapshot`] for reading only the tablets numbered `tablets` of `table`:
    /// the others need not have applied anything (a key lookup asks the one tablet it reads).
    /// With no tablets, it is the newest write this client saw acknowledged.
    pub async fn safe_snapshot_of(
        &self,
        table: &TableInfo,
        tablets: &[usize],
    ) -> Result<Timestamp> {
        let ids = tablets.iter().filter_map(|&t| table.tablets.get(t));
        let snapshots = join_all(ids.map(|t| self.tablets.safe_snapshot(t)));
        let mut snapshot: Option<Timestamp> = None;
        for tablet in snapshots.await {
            let tablet = tablet?;
            snapshot = Some(snapshot.map_or(tablet, |s| s.max(tablet)));
        }
        let last_write = Timestamp(self.last_write.load(std::sync::atomic::Ordering::Acquire));
        Ok(snapshot.map_or(last_write, |s| s.max(last_write)))
    }

    /// Waits up to `timeout` for rows to become visible above `after` in any of the tablets
    /// numbered `tablets` of `table` (a commit there wakes the wait at once). Returns, if some
    /// did, a snapshot to read them at: when they became visible (or this client's newest
    /// write, if later), which every tablet can serve without asking for its safe snapshot.
    pub async fn wait_for_write(
        &self,
        table: &TableInfo,
        tablets: &[usize],
        after: Timestamp,
        timeout: std::time::Duration,
    ) -> Result<Option<Timestamp>> {
        let ids = tablets.iter().filter_map(|&t| table.tablets.get(t));
        let waits = ids.map(|id| Box::pin(self.tablets.wait_for_write(id, after, timeout)));
        let waits: Vec<_> = waits.collect();
        if waits.is_empty() {
            tokio::time::sleep(timeout).await;
            return Ok(None);
        }
        // The first tablet to answer decides: rows arrived there, or the time is up.
        let (newest, _, _) = futures::future::select_all(waits).await;
        let newest = newest?;
        let last_write = Timestamp(self.last_write.load(std::sync::atomic::Ordering::Acquire));
        Ok((newest > after).then(|| newest.max(last_write)))
    }

    /// A write through this client became visible at `at`.
    fn written_at(&self, at: Option<Timestamp>) {
        if let Some(at) = at {
            (self.last_write).fetch_max(at.0, std::sync::atomic::Ordering::AcqRel);
        }
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

    /// Waits, for at most 10 s, until the tablets of every commit this client answered at its
    /// decision have been told (before a server stops: otherwise they end those transactions
    /// only when they find them abandoned, and reads of their rows wait until then).
    pub async fn wait_for_commits(&self) {
        let told = self.telling.write();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), told).await;
    }

    /// Flushes every tablet and the catalog, then stops them.
    pub fn shutdown(&self) -> Result<()> {
        let tablets = self.tablets.shutdown();
        tablets.and(self.catalog.shutdown())
    }
}

/// Splits a batch into slices of at most [`MAX_WRITE_BYTES`] of Arrow memory (zero-copy).
fn chunks(rows: &RecordBatch) -> Vec<RecordBatch> {
    let bytes = nyala_storage::rows_bytes(rows).max(1);
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

#[cfg(test)]
mod tests {
    use arrow::array::{ArrayRef, AsArray, Int64Array};
    use arrow::datatypes::Int64Type;
    use nyala_storage::{ColumnSchema, ColumnType, Schema, TabletOptions};

    use super::*;
    use crate::embedded::EmbeddedNode;
    use crate::partition::{HashLevel, PartitionSchema};

    fn schema() -> Schema {
        let columns = vec![
            ColumnSchema::new("k", ColumnType::Int64, false),
            ColumnSchema::new("v", ColumnType::Int64, false),
        ];
        Schema::new(columns, vec![0]).unwrap()
    }

    fn create(name: &str, buckets: u32) -> DdlOp {
        let hash = vec![HashLevel {
            columns: vec![0],
            buckets,
        }];
        DdlOp::CreateTable {
            name: name.into(),
            schema: schema(),
            partition: PartitionSchema::new(&schema(), hash, vec![], vec![]).unwrap(),
            if_not_exists: false,
            replicas: 0,
            owner: None,
        }
    }

    /// Rows (`k`, `k * 10`) for every `k` in `keys`.
    fn rows(keys: impl IntoIterator<Item = i64>) -> RecordBatch {
        let keys: Vec<i64> = keys.into_iter().collect();
        let values: Vec<i64> = keys.iter().map(|k| k * 10).collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(Int64Array::from(values)),
        ];
        RecordBatch::try_new(schema().arrow_schema(), columns).unwrap()
    }

    fn spec() -> ScanSpec {
        ScanSpec {
            projection: None,
            predicates: Vec::new(),
            snapshot: Timestamp(0),
            limit: None,
            batch_size: 1024,
            string_views: false,
            changes_since: None,
        }
    }

    /// The keys of each tablet of `table`, read at `snapshot` (None: each tablet's own).
    fn keys_by_tablet(
        client: &Client,
        table: &TableInfo,
        snapshot: Option<Timestamp>,
    ) -> Vec<Vec<i64>> {
        (0..table.tablets.len())
            .map(|tablet| {
                let scan = client.scan_tablet(table, tablet, spec(), snapshot).unwrap();
                let batches = scan.map(Result::unwrap);
                let keys = batches.flat_map(|b| {
                    let keys = b.column(0).as_primitive::<Int64Type>().clone();
                    keys.values().to_vec()
                });
                keys.collect()
            })
            .collect()
    }

    fn node(dir: &std::path::Path) -> EmbeddedNode {
        crate::embedded::open(dir, TabletOptions::default(), 64 << 20).unwrap()
    }

    /// Tables named with the system prefix cannot be created, and those the database made
    /// for itself are not shown to users.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn system_tables_are_out_of_users_reach() {
        let dir = tempfile::tempdir().unwrap();
        let client = node(dir.path()).client;
        let hidden = format!("{SYSTEM_PREFIX}hidden");
        assert!(matches!(
            client.ddl(create(&hidden, 1)).await,
            Err(EngineError::InvalidTable(_))
        ));
        // The database's own, through the catalog itself.
        client.catalog.ddl(create(&hidden, 1)).await.unwrap();
        client.ddl(create("mine", 1)).await.unwrap();
        assert!(client.catalog.table(&hidden).is_some());
        assert!(matches!(
            client.table(&hidden),
            Err(EngineError::TableNotFound(_))
        ));
        let names: Vec<String> = client.tables().iter().map(|t| t.name.clone()).collect();
        assert_eq!(names, ["mine"]);
        client.shutdown().unwrap();
    }

    /// A write is split by partition key: each row lands in the one tablet its key hashes to,
    /// and reading every tablet at the client's snapshot gives back every row once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rows_go_to_the_tablets_of_their_keys() {
        let dir = tempfile::tempdir().unwrap();
        let client = node(dir.path()).client;
        client.ddl(create("t", 4)).await.unwrap();
        let table = client.table("t").unwrap();
        assert_eq!(
            client.safe_snapshot_of(&table, &[]).await.unwrap(),
            Timestamp(0)
        );
        assert!(client.is_single_write(&table, &rows([5])).unwrap());
        let batch = rows(0..100);
        assert!(!client.is_single_write(&table, &batch).unwrap());
        let written = client.write(&table, WriteKind::Insert, &batch).await;
        assert_eq!(written.unwrap(), 100);

        // The newest write this client saw acknowledged.
        assert!(client.safe_snapshot_of(&table, &[]).await.unwrap() > Timestamp(0));
        let snapshot = client.safe_snapshot(&table).await.unwrap();
        let by_tablet = keys_by_tablet(&client, &table, Some(snapshot));
        let routed = table.partition.tablets(&table.schema, &batch).unwrap();
        for (tablet, keys) in by_tablet.iter().enumerate() {
            assert!(!keys.is_empty(), "tablet {tablet} got no rows");
            for k in keys {
                assert_eq!(routed[*k as usize], tablet, "key {k}");
            }
        }
        let mut all: Vec<i64> = by_tablet.concat();
        all.sort();
        assert_eq!(all, (0..100).collect::<Vec<_>>());
        client.shutdown().unwrap();
    }

    /// A write is atomic per tablet only: when one tablet refuses its part (a duplicate key),
    /// the others' parts stay, and the error says how many rows were applied.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_write_says_what_other_tablets_applied() {
        let dir = tempfile::tempdir().unwrap();
        let client = node(dir.path()).client;
        client.ddl(create("t", 4)).await.unwrap();
        let table = client.table("t").unwrap();
        client
            .write(&table, WriteKind::Insert, &rows([0]))
            .await
            .unwrap();
        // Key 0 again, with new keys in every tablet.
        let batch = rows((0..1).chain(100..200));
        let routed = table.partition.tablets(&table.schema, &batch).unwrap();
        let refused_tablet = routed[0];
        let others = routed.iter().filter(|t| **t != refused_tablet).count();
        assert!(others > 0 && others < 100);
        let failed = client.write(&table, WriteKind::Insert, &batch).await;
        let Err(WriteError { applied, error }) = failed else {
            panic!("a duplicate key was written");
        };
        assert!(matches!(
            error,
            EngineError::Storage(nyala_storage::StorageError::DuplicateKey { .. })
        ));
        assert_eq!(applied, others);
        let snapshot = client.safe_snapshot(&table).await.unwrap();
        let by_tablet = keys_by_tablet(&client, &table, Some(snapshot));
        assert_eq!(by_tablet.concat().len(), 1 + others);
        assert_eq!(by_tablet[refused_tablet], [0]);
        client.shutdown().unwrap();
    }

    /// A batch over the size of one log entry is cut into slices of at most that size, in
    /// order, none lost; a smaller one goes whole.
    #[test]
    fn large_batches_are_cut_into_log_entry_sized_chunks() {
        assert_eq!(chunks(&rows(0..10)).len(), 1);
        // Two BIGINT columns: 16 bytes a row, so 1 M rows are 16 MiB.
        let n = 1 << 20;
        let batch = rows(0..n);
        let cut = chunks(&batch);
        assert!(cut.len() >= 2);
        let mut next = 0;
        for chunk in &cut {
            assert!(nyala_storage::rows_bytes(chunk) <= MAX_WRITE_BYTES);
            let keys = chunk.column(0).as_primitive::<Int64Type>();
            assert_eq!(keys.value(0), next);
            next += chunk.num_rows() as i64;
        }
        assert_eq!(next, n);
    }
}
