//! Transactions of a session: `BEGIN` ... `COMMIT` / `ROLLBACK` with snapshot isolation.
//!
//! A transaction is the engine's multi-tablet [`Transaction`] (Kudu's multi-row transactions:
//! each tablet written keeps the writes aside with their keys locked until the commit applies
//! them all at one timestamp) held open across statements, plus what SQL needs on top:
//!
//! - **One snapshot.** Every statement reads at the snapshot the transaction's first statement
//!   took, so it sees the database as it was then.
//! - **Its own writes.** The rows it wrote are kept here too, per table ([`TableOverlay`]):
//!   a scan of such a table hides the stored versions of those keys and adds the
//!   transaction's versions that pass the scan's predicates, so later statements read what
//!   earlier ones wrote.
//! - **First writer wins.** Every write carries the snapshot as its condition
//!   ([`nyala_storage::WriteBatch::unchanged_since`]): a row another transaction changed
//!   since, or holds locked now, makes the statement fail with a retryable serialization
//!   error, and the transaction is rolled back (PostgreSQL's REPEATABLE READ behaves so).
//!
//! A statement that fails while writing leaves the transaction failed: it is rolled back, the
//! statements that follow are refused until ROLLBACK (or COMMIT, which then reports the
//! rollback). A transaction dropped without an end (its session expired) is rolled back.
//!
//! The transaction is reached from inside DataFusion's plans (scans and sinks) through the
//! session's configuration ([`TxnSlot`] is an extension of it).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::compute::{concat_batches, filter_record_batch};
use arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;
use nyala_engine::{Client, TableHandle, Transaction};
use nyala_storage::{
    encode_keys, predicate_mask, ColumnPredicate, PredicateOp, Scalar, ScanSpec, Timestamp,
    WriteKind,
};
use parking_lot::Mutex;

use crate::{Result, SqlError};

/// `BEGIN`, `COMMIT` and `ROLLBACK`: statements that start and end transactions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TxnControl {
    Begin { read_only: bool },
    Commit,
    Rollback,
    Savepoint(String),
    Release(String),
    RollbackTo(String),
}

impl TxnControl {
    /// The transaction statement `statement` is (None: it is another kind of statement);
    /// an error for the forms Nyala does not support.
    pub(crate) fn of(statement: &SqlStatement) -> Result<Option<Self>> {
        use datafusion::sql::sqlparser::ast::{
            TransactionAccessMode, TransactionIsolationLevel, TransactionMode,
        };
        Ok(Some(match statement {
            SqlStatement::StartTransaction {
                modes, statements, ..
            } => {
                if !statements.is_empty() {
                    return Err(SqlError::NotSupported("BEGIN ... END blocks".into()));
                }
                let mut read_only = false;
                for mode in modes {
                    match mode {
                        TransactionMode::AccessMode(TransactionAccessMode::ReadOnly) => {
                            read_only = true
                        }
                        TransactionMode::AccessMode(TransactionAccessMode::ReadWrite) => {}
                        TransactionMode::IsolationLevel(
                            TransactionIsolationLevel::RepeatableRead
                            | TransactionIsolationLevel::Snapshot,
                        ) => {}
                        TransactionMode::IsolationLevel(level) => {
                            return Err(SqlError::NotSupported(format!(
                                "ISOLATION LEVEL {level}: transactions run at REPEATABLE READ \
                                 (snapshot isolation)"
                            )))
                        }
                    }
                }
                TxnControl::Begin { read_only }
            }
            SqlStatement::Commit { chain: false, .. } => TxnControl::Commit,
            SqlStatement::Rollback {
                chain: false,
                savepoint: None,
            } => TxnControl::Rollback,
            SqlStatement::Rollback {
                chain: false,
                savepoint: Some(name),
            } => TxnControl::RollbackTo(name.value.clone()),
            SqlStatement::Commit { .. } | SqlStatement::Rollback { .. } => {
                return Err(SqlError::NotSupported("COMMIT/ROLLBACK AND CHAIN".into()))
            }
            SqlStatement::Savepoint { name } => TxnControl::Savepoint(name.value.clone()),
            SqlStatement::ReleaseSavepoint { name } => TxnControl::Release(name.value.clone()),
            _ => return Ok(None),
        }))
    }
}

/// Most bytes of rows a transaction keeps for reading its own writes (its writes in the
/// tablets are not bounded by this, only what it would read back).
pub const MAX_TXN_BYTES: usize = 256 << 20;

/// The session's open transaction, if any; an extension of the session's configuration, so
/// scans and sinks find it when they run.
#[derive(Default)]
pub struct TxnSlot {
    open: Mutex<Option<Arc<OpenTxn>>>,
}

impl TxnSlot {
    pub(crate) fn current(&self) -> Option<Arc<OpenTxn>> {
        self.open.lock().clone()
    }

    /// The slot of the session whose statement runs in `context`.
    pub(crate) fn of(context: &TaskContext) -> Option<Arc<OpenTxn>> {
        context
            .session_config()
            .get_extension::<TxnSlot>()
            .and_then(|slot| slot.current())
    }

    /// Starts a transaction; an error if one is open already.
    pub(crate) fn begin(&self, client: &Client, read_only: bool) -> Result<u64> {
        let mut open = self.open.lock();
        if open.is_some() {
            return Err(SqlError::Invalid(
                "a transaction is already in progress; COMMIT or ROLLBACK it first".into(),
            ));
        }
        let txn = Arc::new(OpenTxn {
            txn: client.begin(),
            client: client.clone(),
            read_only,
            snapshot: Mutex::new(None),
            overlay: Mutex::new(HashMap::new()),
            failed: Mutex::new(None),
            wrote: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            savepoints: Mutex::new(Vec::new()),
            ended: AtomicBool::new(false),
        });
        let id = txn.id();
        *open = Some(txn);
        Ok(id)
    }

    /// Takes the open transaction out of the slot, to end it.
    pub(crate) fn take(&self) -> Option<Arc<OpenTxn>> {
        self.open.lock().take()
    }
}

/// A transaction in progress in a session.
pub struct OpenTxn {
    txn: Transaction,
    client: Client,
    read_only: bool,
    /// The snapshot every statement reads at, taken by the first statement.
    snapshot: Mutex<Option<Timestamp>>,
    /// What the transaction wrote, by table id.
    overlay: Mutex<HashMap<String, Arc<TableOverlay>>>,
    /// Why the transaction failed, once a statement failed in it.
    failed: Mutex<Option<String>>,
    wrote: AtomicBool,
    /// Write statements run in the transaction (those that failed too).
    writes: AtomicU64,
    /// Savepoints, oldest first, with the writes run before each.
    savepoints: Mutex<Vec<(String, u64)>>,
    ended: AtomicBool,
}

impl OpenTxn {
    pub fn id(&self) -> u64 {
        self.txn.id()
    }

    /// Whether the transaction has written anything (DDL is refused from then on).
    pub(crate) fn has_written(&self) -> bool {
        self.wrote.load(Ordering::Acquire)
    }

    /// An error unless statements may still run in the transaction.
    pub(crate) fn check_usable(&self) -> Result<()> {
        match self.failed.lock().as_ref() {
            Some(reason) => Err(SqlError::Invalid(format!(
                "the transaction was rolled back because a statement in it failed ({reason}); \
                 end it with ROLLBACK"
            ))),
            None => Ok(()),
        }
    }

    /// The transaction's snapshot, if a statement took one.
    pub(crate) fn snapshot(&self) -> Option<Timestamp> {
        *self.snapshot.lock()
    }

    /// The transaction's snapshot, `candidate` if no statement took one before.
    pub(crate) fn snapshot_or(&self, candidate: Timestamp) -> Timestamp {
        *self.snapshot.lock().get_or_insert(candidate)
    }

    /// The transaction's snapshot, taken now (from `table`'s tablets: no older than a write
    /// acknowledged in any) if none was.
    pub(crate) async fn snapshot_for(&self, table: &TableHandle) -> DFResult<Timestamp> {
        if let Some(snapshot) = self.snapshot() {
            return Ok(snapshot);
        }
        let now = (self.client.safe_snapshot(table).await)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(self.snapshot_or(now))
    }

    /// The rows the transaction wrote to table `table_id`, as of now.
    pub(crate) fn overlay(&self, table_id: &str) -> Option<Arc<TableOverlay>> {
        self.overlay.lock().get(table_id).cloned()
    }

    /// Marks the transaction failed (for `reason`) and rolls its writes back in the tablets.
    pub(crate) async fn fail(&self, reason: &str) {
        let first = {
            let mut failed = self.failed.lock();
            let first = failed.is_none();
            failed.get_or_insert_with(|| reason.to_string());
            first
        };
        if first {
            self.txn.abort().await;
        }
    }

    /// Commits: all its writes become visible at one timestamp. A failed transaction is
    /// rolled back instead, and that is the error.
    pub(crate) async fn commit(&self) -> Result<()> {
        self.ended.store(true, Ordering::Release);
        if let Err(e) = self.check_usable() {
            self.txn.abort().await;
            return Err(e);
        }
        self.txn.commit().await.map_err(|e| match e {
            // Decided or not, the status table says; not "rolled back".
            e @ nyala_engine::EngineError::OutcomeUnknown(_) => SqlError::Engine(e),
            e => SqlError::Invalid(format!(
                "COMMIT failed, the transaction was rolled back: {e}"
            )),
        })
    }

    /// Rolls back: none of its writes becomes visible.
    pub(crate) async fn rollback(&self) {
        self.ended.store(true, Ordering::Release);
        self.txn.abort().await;
    }

    /// `SAVEPOINT name`.
    pub(crate) fn savepoint(&self, name: &str) -> Result<()> {
        self.check_usable()?;
        let writes = self.writes.load(Ordering::Acquire);
        self.savepoints.lock().push((name.to_string(), writes));
        Ok(())
    }

    /// `RELEASE SAVEPOINT name`: forgets it and the savepoints set after it.
    pub(crate) fn release(&self, name: &str) -> Result<()> {
        self.check_usable()?;
        let mut savepoints = self.savepoints.lock();
        let at = savepoint_position(&savepoints, name)?;
        savepoints.truncate(at);
        Ok(())
    }

    /// `ROLLBACK TO SAVEPOINT name`, which Nyala can do where the transaction wrote nothing
    /// since the savepoint (a read that failed leaves nothing to undo): its writes are in the
    /// tablets, and they cannot undo part of a transaction's.
    pub(crate) fn rollback_to(&self, name: &str) -> Result<()> {
        let mut savepoints = self.savepoints.lock();
        let at = savepoint_position(&savepoints, name)?;
        if self.writes.load(Ordering::Acquire) > savepoints[at].1 {
            return Err(SqlError::NotSupported(format!(
                "ROLLBACK TO SAVEPOINT {name} after the transaction wrote since it: Nyala \
                 cannot undo part of a transaction's writes; ROLLBACK the whole transaction"
            )));
        }
        savepoints.truncate(at + 1);
        Ok(())
    }

    /// Writes `rows` to `table` in the transaction, on condition that they have not changed
    /// since its snapshot, and keeps them for reading back. Returns the rows written. Any
    /// failure fails the transaction.
    pub(crate) async fn write(
        &self,
        table: &TableHandle,
        kind: WriteKind,
        batches: Vec<RecordBatch>,
        verb: &str,
    ) -> DFResult<u64> {
        self.writes.fetch_add(1, Ordering::AcqRel);
        let written = self.write_checked(table, kind, batches, verb).await;
        if let Err(e) = &written {
            self.fail(&e.strip_backtrace()).await;
        }
        written
    }

    async fn write_checked(
        &self,
        table: &TableHandle,
        kind: WriteKind,
        batches: Vec<RecordBatch>,
        verb: &str,
    ) -> DFResult<u64> {
        self.check_usable()
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        if self.read_only {
            return Err(DataFusionError::Execution(format!(
                "{verb} cannot run in a READ ONLY transaction"
            )));
        }
        if kind == WriteKind::InsertIgnore {
            return Err(DataFusionError::NotImplemented(
                "INSERT IGNORE inside a transaction is not supported".into(),
            ));
        }
        if batches.is_empty() {
            return Ok(0);
        }
        self.wrote.store(true, Ordering::Release);
        let snapshot = self.snapshot_for(table).await?;
        let before = self.overlay(&table.id);
        let mut changes: Vec<(Vec<u8>, Option<RecordBatch>)> = Vec::new();
        let mut rows = 0u64;
        for batch in batches {
            let written = (self.txn.write(table, kind, &batch, Some(snapshot), false)).await;
            match written {
                Ok(w) if w.conflicts == 0 => rows += w.rows as u64,
                Ok(_) => return Err(serialization_failure(verb, &table.name)),
                Err(e) if is_locked(&e.error) => {
                    return Err(serialization_failure(verb, &table.name))
                }
                Err(e) => {
                    return Err(DataFusionError::Execution(format!(
                        "{}; the {verb} failed and the transaction was rolled back",
                        e.error
                    )))
                }
            }
            let images = self.images(table, kind, &batch, before.as_deref(), &changes, snapshot);
            changes.extend(images.await?);
        }
        self.keep(table, changes)?;
        Ok(rows)
    }

    /// The rows as `batch` (written with `kind`) leaves them, by key: whole rows (None where
    /// deleted). An UPDATE names only some columns: the others come from the transaction's own
    /// version of the row, else from the row at the snapshot.
    async fn images(
        &self,
        table: &TableHandle,
        kind: WriteKind,
        batch: &RecordBatch,
        before: Option<&TableOverlay>,
        earlier: &[(Vec<u8>, Option<RecordBatch>)],
        snapshot: Timestamp,
    ) -> DFResult<Vec<(Vec<u8>, Option<RecordBatch>)>> {
        let storage_error = |e: nyala_storage::StorageError| DataFusionError::External(Box::new(e));
        if table.schema.position_column().is_some() && kind == WriteKind::Insert {
            // A queue's new rows have no position (no key) until the commit gives them one:
            // the transaction reads them after it commits.
            return Ok(Vec::new());
        }
        let keys = encode_keys(&table.schema, batch).map_err(storage_error)?;
        if kind == WriteKind::Delete {
            return Ok(keys.into_iter().map(|k| (k, None)).collect());
        }
        let full = table.schema.arrow_schema();
        let complete = full
            .fields()
            .iter()
            .all(|f| batch.column_by_name(f.name()).is_some());
        if complete {
            let rows = batch.project(&column_order(&full, batch)?)?;
            let rows = RecordBatch::try_new(full.clone(), rows.columns().to_vec())?;
            return Ok((keys.into_iter().enumerate())
                .map(|(i, k)| (k, Some(rows.slice(i, 1))))
                .collect());
        }
        // Each key's whole row before this write: written earlier in this statement, earlier
        // in the transaction, or as stored at the snapshot.
        let earlier: HashMap<&[u8], &Option<RecordBatch>> =
            earlier.iter().map(|(k, r)| (k.as_slice(), r)).collect();
        let mut base: HashMap<Vec<u8>, RecordBatch> = HashMap::new();
        let mut missing = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let known = match earlier.get(key.as_slice()) {
                Some(row) => Some((*row).clone()),
                None => before.and_then(|o| o.rows.get(key).cloned()),
            };
            match known {
                Some(Some(row)) => {
                    base.insert(key.clone(), row);
                }
                Some(None) => {}
                None => missing.push(i as u32),
            }
        }
        if !missing.is_empty() {
            let wanted = arrow::compute::take_record_batch(
                batch,
                &arrow::array::UInt32Array::from(missing),
            )?;
            base.extend(read_rows(&self.client, table, &wanted, snapshot).await?);
        }
        let mut images = Vec::with_capacity(keys.len());
        for (i, key) in keys.into_iter().enumerate() {
            let Some(row) = base.get(&key) else {
                return Err(DataFusionError::Execution(format!(
                    "the row {} changed in the transaction while it was written",
                    nyala_storage::format_key(&table.schema, batch, i)
                )));
            };
            let columns: Vec<ArrayRef> = (full.fields().iter().enumerate())
                .map(|(c, f)| match batch.column_by_name(f.name()) {
                    Some(new) => new.slice(i, 1),
                    None => row.column(c).clone(),
                })
                .collect();
            images.push((key, Some(RecordBatch::try_new(full.clone(), columns)?)));
        }
        Ok(images)
    }

    /// Adds a statement's written rows to what the transaction reads back.
    fn keep(
        &self,
        table: &TableHandle,
        changes: Vec<(Vec<u8>, Option<RecordBatch>)>,
    ) -> DFResult<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut overlay = self.overlay.lock();
        let bytes: usize = overlay.values().map(|o| o.bytes).sum();
        let entry = overlay.entry(table.id.clone()).or_insert_with(|| {
            Arc::new(TableOverlay {
                schema: table.schema.arrow_schema(),
                rows: BTreeMap::new(),
                bytes: 0,
            })
        });
        // Scans still running keep the version they started with.
        let table_overlay = Arc::make_mut(entry);
        let mut added = 0;
        for (key, row) in changes {
            // (Each row is a slice of its statement's batch: counted alone, not the whole
            // buffers it shares.)
            added += key.len() + row.as_ref().map_or(0, nyala_storage::rows_bytes);
            table_overlay.rows.insert(key, row);
        }
        table_overlay.bytes += added;
        if bytes + added > MAX_TXN_BYTES {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "the transaction wrote more than {} MB; write large amounts in statements of \
                 their own (each is atomic)",
                MAX_TXN_BYTES >> 20
            )));
        }
        Ok(())
    }
}

impl Drop for OpenTxn {
    /// A transaction nobody ended (its session is gone) is rolled back.
    fn drop(&mut self) {
        if self.ended.load(Ordering::Acquire) || !self.has_written() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let txn = self.txn.clone();
            runtime.spawn(async move { txn.abort().await });
        }
    }
}

/// The error of a statement that met a row another transaction changed.
/// Where the savepoint `name` (the latest of that name) is in `savepoints`.
fn savepoint_position(savepoints: &[(String, u64)], name: &str) -> Result<usize> {
    (savepoints.iter().rposition(|(saved, _)| saved == name))
        .ok_or_else(|| SqlError::Invalid(format!("savepoint \"{name}\" does not exist")))
}

fn serialization_failure(verb: &str, table: &str) -> DataFusionError {
    DataFusionError::External(Box::new(SqlError::Conflict(format!(
        "could not serialize access: a row the {verb} writes in table {table} was changed by \
         another transaction since this one began (or is being changed now); the transaction \
         was rolled back, run it again"
    ))))
}

pub(crate) fn is_locked(error: &nyala_engine::EngineError) -> bool {
    matches!(
        error,
        nyala_engine::EngineError::Storage(nyala_storage::StorageError::Locked { .. })
    )
}

/// Positions in `batch` of the columns of `schema`, by name.
fn column_order(schema: &SchemaRef, batch: &RecordBatch) -> DFResult<Vec<usize>> {
    let batch_schema = batch.schema();
    (schema.fields().iter())
        .map(|f| Ok(batch_schema.index_of(f.name())?))
        .collect()
}

/// The rows of `table` at `snapshot` whose keys are those of `keys`' rows, by key.
async fn read_rows(
    client: &Client,
    table: &TableHandle,
    keys: &RecordBatch,
    snapshot: Timestamp,
) -> DFResult<HashMap<Vec<u8>, RecordBatch>> {
    let storage_error = |e: nyala_storage::StorageError| DataFusionError::External(Box::new(e));
    let engine_error = |e: nyala_engine::EngineError| DataFusionError::External(Box::new(e));
    let wanted: HashSet<Vec<u8>> = encode_keys(&table.schema, keys)
        .map_err(storage_error)?
        .into_iter()
        .collect();
    let parts = table
        .partition
        .split(&table.schema, keys)
        .map_err(engine_error)?;
    let (client, table) = (client.clone(), table.clone());
    tokio::task::spawn_blocking(move || {
        let mut found = HashMap::new();
        for (tablet, rows) in parts {
            // Each key column among the values the keys have (then the exact keys are kept).
            let predicates = (table.schema.key_columns().iter())
                .map(|&k| {
                    let name = &table.schema.columns()[k].name;
                    let column = rows.column_by_name(name).ok_or_else(|| {
                        DataFusionError::Internal(format!("key column {name} missing"))
                    })?;
                    let values = (0..rows.num_rows()).map(|i| Scalar(column.slice(i, 1)));
                    Ok(ColumnPredicate {
                        column: k,
                        op: PredicateOp::InList(values.collect()),
                    })
                })
                .collect::<DFResult<Vec<_>>>()?;
            let spec = ScanSpec {
                projection: None,
                predicates,
                snapshot,
                limit: None,
                batch_size: 1024,
                string_views: false,
                changes_since: None,
            };
            let scan = client.scan_tablet(&table, tablet, spec, Some(snapshot));
            for batch in scan.map_err(engine_error)? {
                let batch = batch.map_err(storage_error)?;
                let keys = encode_keys(&table.schema, &batch).map_err(storage_error)?;
                for (i, key) in keys.into_iter().enumerate() {
                    if wanted.contains(&key) {
                        found.insert(key, batch.slice(i, 1));
                    }
                }
            }
        }
        Ok(found)
    })
    .await
    .map_err(|e| DataFusionError::External(Box::new(e)))?
}

/// The rows a transaction wrote to one table: each key's version (None: deleted), whole rows
/// in the table's schema.
#[derive(Clone)]
pub(crate) struct TableOverlay {
    schema: SchemaRef,
    rows: BTreeMap<Vec<u8>, Option<RecordBatch>>,
    bytes: usize,
}

impl TableOverlay {
    /// `spec` reading what the overlay needs as well: the key columns (to hide stored rows
    /// the transaction replaced), and no limit (hidden rows would count toward it). Returns
    /// the spec and the number of columns the scan itself asked for.
    pub(crate) fn widen(&self, table: &TableHandle, mut spec: ScanSpec) -> (ScanSpec, usize) {
        spec.limit = None;
        let asked = match &mut spec.projection {
            None => self.schema.fields().len(),
            Some(projection) => {
                let asked = projection.len();
                for &key in table.schema.key_columns() {
                    if !projection.contains(&key) {
                        projection.push(key);
                    }
                }
                asked
            }
        };
        (spec, asked)
    }

    /// A stored batch (read with [`Self::widen`]'s spec) without the rows the transaction
    /// replaced, and with only the columns the scan asked for.
    pub(crate) fn hide_replaced(
        &self,
        table: &TableHandle,
        batch: RecordBatch,
        asked: usize,
    ) -> DFResult<RecordBatch> {
        let keys = encode_keys(&table.schema, &batch)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let keep: arrow::array::BooleanArray = keys
            .iter()
            .map(|k| Some(!self.rows.contains_key(k)))
            .collect();
        let batch = filter_record_batch(&batch, &keep)?;
        Ok(batch.project(&(0..asked).collect::<Vec<_>>())?)
    }

    /// The transaction's rows that pass `spec`'s predicates, with `spec`'s projection (the
    /// one the scan asked for), in the scan's output schema.
    pub(crate) fn rows_matching(
        &self,
        table: &TableHandle,
        spec: &ScanSpec,
        output: &SchemaRef,
    ) -> DFResult<Option<RecordBatch>> {
        let rows: Vec<&RecordBatch> = self.rows.values().flatten().collect();
        if rows.is_empty() {
            return Ok(None);
        }
        let rows = concat_batches(&self.schema, rows)?;
        let predicates: &[ColumnPredicate] = &spec.predicates;
        let mask = predicate_mask(&table.schema, predicates, &rows)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let rows = filter_record_batch(&rows, &mask)?;
        let rows = match &spec.projection {
            Some(projection) => rows.project(projection)?,
            None => rows,
        };
        let columns = (rows.columns().iter().zip(output.fields()))
            .map(
                |(column, field)| match column.data_type() == field.data_type() {
                    true => Ok(column.clone()),
                    false => arrow::compute::cast(column, field.data_type()),
                },
            )
            .collect::<Result<Vec<_>, _>>()?;
        // (A scan may read no column, for count(*): the batch still has its rows.)
        let options = RecordBatchOptions::new().with_row_count(Some(rows.num_rows()));
        let rows = RecordBatch::try_new_with_options(output.clone(), columns, &options)?;
        Ok(Some(rows))
    }
}
