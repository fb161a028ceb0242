//! Transactions across tablets, coordinated by the client, as Kudu coordinates its multi-row
//! transactions: each tablet written becomes a participant and keeps the transaction's writes
//! aside (their keys locked) through its own log; the commit prepares every participant
//! (through its log), takes the largest prepare timestamp as the one commit timestamp, records
//! the decision in the transaction status table, and then has every participant apply the
//! writes at that timestamp. A transaction with one participant commits through that tablet's
//! log alone. A statement's last write to a tablet prepares it there in the same log entry
//! (see [`Transaction::write`]); the commit prepares only the others.
//!
//! The decision is an INSERT of the transaction's row into the status table (a replicated
//! table like any other): the first decision recorded holds, so a coordinator committing and a
//! participant aborting an abandoned transaction ([`Client::resolve_txn`]) cannot both win.
//! A participant holding a transaction that was never decided for long aborts it there.
//!
//! A transaction whose writes lock no keys (inserts into queue tables, which take new
//! positions) is acknowledged once its decision is recorded, and its participants are told
//! after: nothing it wrote is visible before they apply the commit, and a read that could see
//! it waits for that (the prepared transaction holds its snapshots back), so the answer comes
//! a log round sooner without anyone seeing less. A transaction that locked keys waits for
//! every participant, since a later writer of those keys would otherwise meet its locks.
//!
//! Once every participant has applied a commit, no one reads its decision again: the
//! coordinator deletes such rows, many in one write every [`TRIM_EVERY`], so the status table
//! holds the transactions in flight, not every transaction ever committed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arrow::array::{AsArray, Int64Array, RecordBatch};
use arrow::datatypes::Int64Type;
use futures::future::join_all;
use nyala_storage::{
    ColumnPredicate, ColumnSchema, ColumnType, PredicateOp, Scalar, ScanSpec, Schema, StorageError,
    Timestamp, WriteKind,
};
use parking_lot::Mutex;

use super::{Client, TableHandle, WriteError, Written};
use crate::catalog::DdlOp;
use crate::partition::PartitionSchema;
use crate::{EngineError, Result};

/// The transaction status table: one row per decided transaction (its commit timestamp, or
/// -1 for an abort). Not visible to users.
pub const STATUS_TABLE: &str = "__nyala_transactions";

/// How often a coordinator deletes the status rows of its settled transactions.
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Transactions whose every participant applied the commit, their status rows not yet deleted.
#[derive(Default)]
pub(super) struct Settled {
    txns: Vec<u64>,
    /// Whether a task deletes them.
    trimming: bool,
}

/// A transaction in progress: the tablets it wrote, with its prepare timestamp in those that
/// prepared it already. Clones are the same transaction.
#[derive(Clone)]
pub struct Transaction {
    id: u64,
    client: Client,
    participants: Arc<Mutex<BTreeMap<String, Option<Timestamp>>>>,
    /// Whether a write may have locked keys: anything but an insert into a queue table.
    locks_keys: Arc<AtomicBool>,
}

/// Deletes the status rows of settled transactions every [`TRIM_EVERY`], until none are left
/// or the client is gone (it does not keep the client's server alive in between). A row whose
/// delete fails stays (a participant reading it would find the truth).
async fn trim_settled(client: super::WeakClient) {
    loop {
        tokio::time::sleep(TRIM_EVERY).await;
        let Some(client) = client.upgrade() else {
            return;
        };
        let txns = {
            let mut settled = client.settled.lock();
            if settled.txns.is_empty() {
                settled.trimming = false;
                return;
            }
            std::mem::take(&mut settled.txns)
        };
        if let Err(e) = client.delete_decisions(txns).await {
            tracing::warn!(error = %e, "cannot delete the status rows of settled transactions");
        }
    }
}

impl Client {
    /// Starts a transaction; its writes become visible together when it commits.
    pub fn begin(&self) -> Transaction {
        Transaction {
            // Never 0 (0 means "no transaction" on the wire).
            id: rand::random::<u64>() | 1,
            client: self.clone(),
            participants: Arc::default(),
            locks_keys: Arc::default(),
        }
    }

    /// Records `commit` (a commit timestamp, or None for an abort) as the decision on
    /// transaction `txn`, unless a decision is recorded already; returns the one that holds.
    pub async fn decide_txn(
        &self,
        txn: u64,
        commit: Option<Timestamp>,
    ) -> Result<Option<Timestamp>> {
        let table = self.status_table().await?;
        let value = commit.map_or(-1, |t| t.0 as i64);
        let row = RecordBatch::try_new(
            table.schema.arrow_schema(),
            vec![
                Arc::new(Int64Array::from(vec![txn as i64])),
                Arc::new(Int64Array::from(vec![value])),
            ],
        )?;
        match self.write(&table, WriteKind::Insert, &row).await {
            Ok(_) => Ok(commit),
            Err(WriteError {
                error: EngineError::Storage(StorageError::DuplicateKey { .. }),
                ..
            }) => self.txn_decision(&table, txn).await?.ok_or_else(|| {
                EngineError::Remote(format!(
                    "transaction {txn} has a decision that cannot be read"
                ))
            }),
            Err(e) => Err(e.error),
        }
    }

    /// The decision recorded on transaction `txn`: None if there is none, else its commit
    /// timestamp (None inside: aborted).
    async fn txn_decision(
        &self,
        table: &TableHandle,
        txn: u64,
    ) -> Result<Option<Option<Timestamp>>> {
        let spec = ScanSpec {
            projection: Some(vec![1]),
            predicates: vec![ColumnPredicate {
                column: 0,
                op: PredicateOp::Eq(Scalar(Arc::new(Int64Array::from(vec![txn as i64])))),
            }],
            snapshot: Timestamp(0),
            limit: None,
            batch_size: 16,
            string_views: false,
            changes_since: None,
        };
        let (client, table) = (self.clone(), table.clone());
        crate::rpc::blocking(move || {
            for batch in client.scan_tablet(&table, 0, spec, None)? {
                let batch = batch?;
                if let Some(values) = batch.column(0).as_primitive_opt::<Int64Type>() {
                    if !values.is_empty() {
                        let value = values.value(0);
                        return Ok(Some((value >= 0).then_some(Timestamp(value as u64))));
                    }
                }
            }
            Ok(None)
        })
        .await
    }

    /// The status table, created the first time a transaction needs it.
    async fn status_table(&self) -> Result<TableHandle> {
        if let Some(table) = self.catalog.table(STATUS_TABLE) {
            return Ok(table);
        }
        let schema = Schema::new(
            vec![
                ColumnSchema::new("txn_id", ColumnType::Int64, false),
                ColumnSchema::new("commit_ts", ColumnType::Int64, false),
            ],
            vec![0],
        )?;
        self.catalog
            .ddl(DdlOp::CreateTable {
                name: STATUS_TABLE.into(),
                schema,
                partition: PartitionSchema::single(),
                if_not_exists: true,
                replicas: 0,
                owner: None,
            })
            .await?;
        self.catalog
            .table(STATUS_TABLE)
            .ok_or_else(|| EngineError::TableNotFound(STATUS_TABLE.into()))
    }

    /// Every participant of transaction `txn` applied its commit: none will read its status
    /// row again, which goes with the next batch of such rows.
    fn forget_decision(&self, txn: u64) {
        let mut settled = self.settled.lock();
        settled.txns.push(txn);
        if !std::mem::replace(&mut settled.trimming, true) {
            tokio::spawn(trim_settled(self.downgrade()));
        }
    }

    async fn delete_decisions(&self, txns: Vec<u64>) -> Result<()> {
        let table = self.status_table().await?;
        let key = table.schema.arrow_schema().field(0).clone();
        let ids = Int64Array::from_iter_values(txns.into_iter().map(|t| t as i64));
        let rows = RecordBatch::try_new(
            Arc::new(arrow::datatypes::Schema::new(vec![key])),
            vec![Arc::new(ids)],
        )?;
        let deleted = self.write(&table, WriteKind::Delete, &rows).await;
        deleted.map(drop).map_err(|e| e.error)
    }

    /// Ends transaction `txn`, abandoned in tablet `tablet` (its coordinator is gone): as
    /// decided, or, if nothing was decided, by recording an abort. Returns whether it committed.
    pub async fn resolve_txn(&self, tablet: &str, txn: u64) -> Result<bool> {
        let decision = self.decide_txn(txn, None).await?;
        self.tablets.finish_txn(tablet, txn, decision).await?;
        self.written_at(decision);
        Ok(decision.is_some())
    }
}

impl Transaction {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Writes `rows` in the transaction (see [`Client::write_unchanged_since`] for
    /// `unchanged_since`). A write that fails leaves the transaction to be aborted.
    ///
    /// With `last`, the transaction's last write: each tablet it writes is prepared by it (if
    /// the transaction has more than one participant), which saves the commit a log entry in
    /// each. The transaction must then commit or abort, and write nothing more.
    pub async fn write(
        &self,
        table: &TableHandle,
        kind: WriteKind,
        rows: &RecordBatch,
        unchanged_since: Option<Timestamp>,
        last: bool,
    ) -> Result<Written, WriteError> {
        (self.client)
            .write_rows(table, kind, rows, unchanged_since, Some(self), last)
            .await
    }

    /// The transaction writes rows of kind `kind` into a table of schema `schema`.
    pub(super) fn writes(&self, schema: &Schema, kind: WriteKind) {
        let queue_insert = schema.position_column().is_some()
            && matches!(kind, WriteKind::Insert | WriteKind::InsertIgnore);
        if !queue_insert {
            self.locks_keys.store(true, Ordering::Release);
        }
    }

    /// Tablet `tablet` is about to take a write of the transaction.
    pub(super) fn joins(&self, tablet: &str) {
        let mut participants = self.participants.lock();
        if !participants.contains_key(tablet) {
            participants.insert(tablet.to_string(), None);
        }
    }

    /// How many participants the transaction has with `tablets` among them.
    pub(super) fn participants_with<'a>(&self, tablets: impl Iterator<Item = &'a String>) -> usize {
        let participants = self.participants.lock();
        let new: BTreeSet<&String> = tablets.filter(|t| !participants.contains_key(*t)).collect();
        participants.len() + new.len()
    }

    /// A write prepared the transaction in tablet `tablet`, at `at`.
    pub(super) fn prepared(&self, tablet: &str, at: Timestamp) {
        self.participants
            .lock()
            .insert(tablet.to_string(), Some(at));
    }

    /// Commits: every write becomes visible at one timestamp, or, if this fails, none does
    /// (unless the failure came after the decision to commit, which then completes). A
    /// transaction across tablets that locked no keys returns once the commit is decided, its
    /// tablets told after (see the module comment).
    pub async fn commit(&self) -> Result<()> {
        let participants: Vec<(String, Option<Timestamp>)> = (self.participants.lock().iter())
            .map(|(t, p)| (t.clone(), *p))
            .collect();
        let tablets = &self.client.tablets;
        match participants.as_slice() {
            [] => Ok(()),
            [(only, _)] => {
                let commit = || tablets.finish_txn(only, self.id, Some(Timestamp(0)));
                let finished = super::when_unlocked(commit).await?;
                self.client.written_at(finished.visible_at);
                Ok(())
            }
            _ => {
                let prepared = join_all(participants.iter().map(|(t, prepared)| async move {
                    match prepared {
                        Some(at) => Ok(*at),
                        None => self.prepare(t).await,
                    }
                }));
                let prepared = newest(prepared.await);
                let commit_ts = match prepared {
                    Ok(ts) => ts,
                    Err(e) => {
                        self.abort().await;
                        return Err(e);
                    }
                };
                crash_point("txn-prepared");
                match self.client.decide_txn(self.id, Some(commit_ts)).await {
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        self.abort().await;
                        return Err(EngineError::Busy(
                            "the transaction was aborted while it committed (it took too long); \
                             run it again"
                                .into(),
                        ));
                    }
                    Err(e) => {
                        // The decision may have been recorded without the answer arriving: the
                        // status table decides, when the tablets resolve the transaction.
                        return Err(EngineError::OutcomeUnknown(e.to_string()));
                    }
                }
                crash_point("txn-decided");
                self.client.written_at(Some(commit_ts));
                let told = participants.into_iter().map(|(t, _)| t).collect();
                let finish = self.clone().finish(told, commit_ts);
                match self.locks_keys.load(Ordering::Acquire) {
                    true => finish.await,
                    false => {
                        let telling = self.client.telling.clone().read_owned().await;
                        tokio::spawn(async move {
                            finish.await;
                            drop(telling);
                        });
                    }
                }
                Ok(())
            }
        }
    }

    /// Tells `tablets` that the transaction committed at `commit_ts` (decided already).
    async fn finish(self, tablets: Vec<String>, commit_ts: Timestamp) {
        let finished = join_all(
            (tablets.iter()).map(|t| (self.client.tablets).finish_txn(t, self.id, Some(commit_ts))),
        );
        let mut delivered = true;
        for (tablet, result) in tablets.iter().zip(finished.await) {
            if let Err(e) = result {
                // Decided: the tablet completes the commit when it resolves the transaction,
                // reading the decision.
                tracing::warn!(tablet, txn = self.id, error = %e, "commit not delivered");
                delivered = false;
            }
        }
        if delivered {
            self.client.forget_decision(self.id);
        }
    }

    /// Prepares the transaction in tablet `tablet`; returns the prepare timestamp.
    async fn prepare(&self, tablet: &str) -> Result<Timestamp> {
        self.client.tablets.prepare_txn(tablet, self.id).await
    }

    /// Aborts: no write of the transaction becomes visible.
    pub async fn abort(&self) {
        let participants: Vec<String> = self.participants.lock().keys().cloned().collect();
        let tablets = &self.client.tablets;
        let aborted = join_all(
            participants
                .iter()
                .map(|t| tablets.finish_txn(t, self.id, None)),
        );
        for (tablet, result) in participants.iter().zip(aborted.await) {
            if let Err(e) = result {
                // The tablet aborts it when it finds it abandoned.
                tracing::warn!(tablet, txn = self.id, error = %e, "abort not delivered");
            }
        }
    }
}

/// The newest of the participants' prepare timestamps (the commit timestamp), or the first
/// error.
fn newest(prepared: Vec<Result<Timestamp>>) -> Result<Timestamp> {
    (prepared.into_iter()).try_fold(Timestamp(0), |newest, ts| Ok(newest.max(ts?)))
}

/// A test hook, as Kudu's crash flags: with `NYALA_CRASH_AT=<step>` in its environment, the
/// process aborts the first time a transaction reaches `step`: `txn-prepared` (a coordinator,
/// every participant prepared, nothing decided), `txn-decided` (a coordinator, the commit
/// recorded, no participant told), `txn-participant-prepared` (a participant's leader, its
/// prepare replicated and applied, the coordinator not answered).
pub(crate) fn crash_point(step: &str) {
    static CRASH_AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let at = CRASH_AT.get_or_init(|| std::env::var("NYALA_CRASH_AT").ok());
    if at.as_deref() == Some(step) {
        eprintln!("NYALA_CRASH_AT={step}: aborting the process");
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
    use nyala_storage::{
        ColumnSchema, ColumnType, ScanSpec, Schema, TabletOptions, Timestamp, WriteKind,
    };

    use crate::catalog::DdlOp;
    use crate::client::Client;
    use crate::partition::{HashLevel, PartitionSchema};

    /// Creates table `name` of `schema`, hashed on its first column into `buckets` tablets.
    async fn create_table(
        client: &Client,
        name: &str,
        schema: Schema,
        buckets: u32,
    ) -> crate::client::TableHandle {
        let hash = vec![HashLevel {
            columns: vec![0],
            buckets,
        }];
        let partition = PartitionSchema::new(&schema, hash, vec![], vec![]).unwrap();
        let create = DdlOp::CreateTable {
            name: name.into(),
            schema,
            partition,
            if_not_exists: false,
            replicas: 0,
            owner: None,
        };
        client.ddl(create).await.unwrap();
        client.table(name).unwrap()
    }

    /// Columns `k` (the key) and `v`, both BIGINT.
    fn key_value_schema() -> Schema {
        let columns = vec![
            ColumnSchema::new("k", ColumnType::Int64, false),
            ColumnSchema::new("v", ColumnType::Int64, false),
        ];
        Schema::new(columns, vec![0]).unwrap()
    }

    /// A queue table's: `queue`, `pos` (the position) and `body`, keyed by queue and position.
    fn queue_schema() -> Schema {
        let column = |name: &str, t| ColumnSchema::new(name, t, false);
        let columns = vec![
            column("queue", ColumnType::String),
            column("pos", ColumnType::Int64),
            column("body", ColumnType::String),
        ];
        Schema::new(columns, vec![0, 1])
            .unwrap()
            .with_position(1)
            .unwrap()
    }

    /// New rows of a [`queue_schema`] table: `body` into each of 16 queues.
    fn one_message_per_queue(body: &str) -> RecordBatch {
        let batch_schema = Arc::new(ArrowSchema::new(vec![
            Field::new("queue", DataType::Utf8, false),
            Field::new("body", DataType::Utf8, false),
        ]));
        let queues: Vec<String> = (0..16).map(|q| format!("q{q}")).collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(queues)),
            Arc::new(StringArray::from(vec![body; 16])),
        ];
        RecordBatch::try_new(batch_schema, columns).unwrap()
    }

    /// The rows of every tablet of `table`, at the newest snapshot.
    async fn count_rows(client: &Client, table: &crate::client::TableHandle) -> usize {
        let (client, table) = (client.clone(), table.clone());
        let rows = crate::rpc::blocking(move || {
            let mut n = 0;
            for tablet in 0..table.tablets.len() {
                let spec = ScanSpec {
                    projection: Some(vec![0]),
                    predicates: vec![],
                    snapshot: Timestamp(0),
                    limit: None,
                    batch_size: 1024,
                    string_views: false,
                    changes_since: None,
                };
                for batch in client.scan_tablet(&table, tablet, spec, None)? {
                    n += batch?.num_rows();
                }
            }
            Ok(n)
        });
        rows.await.unwrap()
    }

    /// Waits until the status table is empty: every decision recorded through `client` was
    /// settled and its row deleted. (A liveness bound: they go within a second or two.)
    async fn status_rows_are_deleted(client: &Client) {
        let status = (client.catalog.table(super::STATUS_TABLE)).expect("decisions");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while count_rows(client, &status).await > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "status rows never deleted"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Two coordinators (two clients, as two servers of a cluster) insert batches that span
    /// every tablet of one queue table at once: their transactions are prepared side by side in
    /// each tablet and their rows applied in turn; none waits for the other for good, and every
    /// row arrives once, with a position.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_coordinators_inserting_into_queue_tablets_take_turns() {
        let dir = tempfile::tempdir().unwrap();
        let node = crate::embedded::open(dir.path(), TabletOptions::default(), 1 << 30).unwrap();
        let table = create_table(&node.client, "q", queue_schema(), 4).await;
        let other = Client::new(node.client.catalog.clone(), node.client.tablets.clone());
        let producers = [node.client.clone(), other].map(|client| {
            let table = table.clone();
            tokio::spawn(async move {
                for i in 0..20 {
                    let rows = one_message_per_queue(&format!("{i}"));
                    let txn = client.begin();
                    // Prepared by the commit, or by the write itself.
                    let last = i % 2 == 1;
                    txn.write(&table, WriteKind::Insert, &rows, None, last)
                        .await
                        .unwrap();
                    txn.commit().await.unwrap();
                }
            })
        });
        for producer in producers {
            producer.await.unwrap();
        }
        let mut rows = 0;
        for tablet in 0..table.tablets.len() {
            let spec = ScanSpec {
                projection: None,
                predicates: vec![],
                snapshot: Timestamp(0),
                limit: None,
                batch_size: 1024,
                string_views: false,
                changes_since: None,
            };
            let scan = node.client.scan_tablet(&table, tablet, spec, None);
            for batch in scan.unwrap() {
                let batch = batch.unwrap();
                let positions = batch
                    .column(1)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap();
                assert_eq!(positions.null_count(), 0);
                rows += batch.num_rows();
            }
        }
        assert_eq!(rows, 2 * 20 * 16);
    }

    /// A transaction of queue inserts across tablets is answered once its commit is decided,
    /// its tablets told after; a read right after the answer, through this coordinator or
    /// another one, still finds all of it (the tablets hold their snapshots back until they
    /// apply it). Before a server stops, it waits until they are told; the status rows go
    /// once they have been.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_queue_transaction_answered_at_its_decision_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let node = crate::embedded::open(dir.path(), TabletOptions::default(), 1 << 30).unwrap();
        let table = create_table(&node.client, "q", queue_schema(), 4).await;
        let other = Client::new(node.client.catalog.clone(), node.client.tablets.clone());
        let insert = |i: usize| {
            let (client, table) = (node.client.clone(), table.clone());
            async move {
                let txn = client.begin();
                let rows = one_message_per_queue(&format!("{i}"));
                txn.write(&table, WriteKind::Insert, &rows, None, i % 2 == 0)
                    .await
                    .unwrap();
                txn.commit().await.unwrap();
                txn.id()
            }
        };
        for i in 1..=20 {
            insert(i).await;
            let reader = [&node.client, &other][i % 2];
            assert_eq!(count_rows(reader, &table).await, i * 16);
        }
        // Not read: only the wait for the commits makes sure its tablets have applied it.
        let last = insert(21).await;
        node.client.wait_for_commits().await;
        for id in &table.tablets {
            let replica = node.server.replica(id).unwrap();
            assert_eq!(replica.tablet().txn_state(last), None);
        }
        status_rows_are_deleted(&node.client).await;
    }

    /// The status table keeps a transaction's row only until every participant applied the
    /// commit: after many multi-tablet commits it empties again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_status_rows_of_settled_transactions_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let node = crate::embedded::open(dir.path(), TabletOptions::default(), 1 << 30).unwrap();
        let schema = key_value_schema();
        let table = create_table(&node.client, "t", schema.clone(), 4).await;
        for i in 0..20 {
            let keys = Int64Array::from_iter_values(i * 64..(i + 1) * 64);
            let columns: Vec<ArrayRef> = vec![Arc::new(keys.clone()), Arc::new(keys)];
            let rows = RecordBatch::try_new(schema.arrow_schema(), columns).unwrap();
            let txn = node.client.begin();
            txn.write(&table, WriteKind::Insert, &rows, None, true)
                .await
                .unwrap();
            txn.commit().await.unwrap();
        }
        status_rows_are_deleted(&node.client).await;
        assert_eq!(count_rows(&node.client, &table).await, 20 * 64);
    }

    /// A statement's last write prepares the transaction in each tablet it writes, in the same
    /// log entry: nothing more can be written in it there, and its commit prepares no tablet
    /// again (one entry fewer per tablet); with a single participant, nothing is prepared.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_last_write_of_a_transaction_prepares_its_tablets() {
        let dir = tempfile::tempdir().unwrap();
        let node = crate::embedded::open(dir.path(), TabletOptions::default(), 1 << 30).unwrap();
        let schema = key_value_schema();
        let table = create_table(&node.client, "t", schema.clone(), 2).await;
        let rows = |keys: Vec<i64>| {
            let values = Int64Array::from(keys.clone());
            let columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(keys)), Arc::new(values)];
            RecordBatch::try_new(schema.arrow_schema(), columns).unwrap()
        };
        let state = |txn: u64| -> Vec<(u64, Option<Timestamp>)> {
            (table.tablets.iter())
                .map(|id| {
                    let replica = node.server.replica(id).unwrap();
                    let prepared = replica.tablet().txn_state(txn).and_then(|t| t.prepared);
                    (replica.last_applied(), prepared)
                })
                .collect()
        };
        let count = || count_rows(&node.client, &table);

        // Plain writes first, so that no entry of the leaders' election is left to apply.
        let plain = rows((200..264).collect());
        node.client
            .write(&table, WriteKind::Insert, &plain)
            .await
            .unwrap();

        // Both tablets: prepared by the write; the commit adds only its own entry to each.
        let txn = node.client.begin();
        let before = state(txn.id());
        let keys: Vec<i64> = (0..64).collect();
        let written = txn
            .write(&table, WriteKind::Insert, &rows(keys), None, true)
            .await;
        assert_eq!(written.unwrap().rows, 64);
        let prepared = state(txn.id());
        for ((applied_before, _), (applied, at)) in before.iter().zip(&prepared) {
            assert_eq!(*applied, applied_before + 1, "one entry: the write");
            assert!(at.is_some(), "prepared by the write");
        }
        let more = txn
            .write(
                &table,
                WriteKind::Insert,
                &rows(vec![100, 101]),
                None,
                false,
            )
            .await;
        let refused = more
            .err()
            .expect("a prepared transaction takes no more writes");
        assert!(
            refused.error.to_string().contains("takes no more writes"),
            "{}",
            refused.error
        );
        // (The refused write took an entry of its own.)
        let refused = state(txn.id());
        txn.commit().await.unwrap();
        for ((applied_before, _), (applied, at)) in refused.iter().zip(&state(txn.id())) {
            assert_eq!(*applied, applied_before + 1, "one entry: the commit");
            assert_eq!(*at, None, "committed");
        }
        assert_eq!(count().await, 128);

        // One tablet: no prepare (the commit entry alone commits it).
        let key = (1000..).find(|&k| {
            let parts = table
                .partition
                .split(&table.schema, &rows(vec![k]))
                .unwrap();
            parts[0].0 == 0
        });
        let txn = node.client.begin();
        let one = rows(vec![key.unwrap()]);
        txn.write(&table, WriteKind::Insert, &one, None, true)
            .await
            .unwrap();
        assert!(state(txn.id()).iter().all(|(_, at)| at.is_none()));
        txn.commit().await.unwrap();
        assert_eq!(count().await, 129);
    }
}
