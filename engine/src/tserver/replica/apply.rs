//! The replicated state machine of a tablet: what applying a committed log entry does, on
//! every replica, leader or follower, and again when the log is replayed after a crash.
//!
//! Apply is deterministic (decision 1 in ARCHITECTURE.md): it uses only the entry (its
//! timestamp, chosen by the leader) and the tablet's state. A client's request applied before
//! (sent again after its answer was lost) is answered with what it did then and not applied
//! twice. Applying an entry also ends its in-flight write, changes what storage holds back
//! (prepared transactions, a queue's turns), wakes readers waiting for new rows and tells the
//! server's maintenance there was a write.

use std::path::PathBuf;
use std::sync::Arc;

use nyala_raft::StateMachine;
use nyala_storage::{StorageError, Tablet, TabletOp, Timestamp, WriteOutcome};

use super::entry::LoggedOp;
use super::inflight::Inflight;
use super::peers::Peers;
use super::staging::clone_staging_dir;
use crate::clock::HybridClock;
use crate::tserver::maintenance::signal::MaintenanceSignal;
use crate::Result;

/// The replicated state machine: applies logged writes to the tablet.
pub struct TabletStateMachine {
    pub(super) tablet: Arc<Tablet>,
    pub(super) inflight: Inflight,
    pub(super) clock: Arc<HybridClock>,
    /// The replica's directory (its `peers.json`) and how to tell its server where new members
    /// listen; for replicated tablets.
    pub(super) dir: PathBuf,
    pub(super) learn: Option<Arc<dyn Fn(u64, String) + Send + Sync>>,
    /// Told of every applied write (the tablet server's maintenance).
    pub(super) maintenance: Option<Arc<MaintenanceSignal>>,
}

impl TabletStateMachine {
    /// Stages the clone `target` of this tablet, as log entry `index`, beside the replica's
    /// directory (see [`clone_staging_dir`]), for the server to open as a replica of its own.
    /// An entry replayed after the clone became a replica does nothing.
    fn stage_clone(
        &self,
        index: u64,
        target: &str,
        as_of: Option<Timestamp>,
    ) -> Result<(), StorageError> {
        let tablets = self.dir.parent().ok_or_else(|| {
            StorageError::Corruption(format!("{} has no parent directory", self.dir.display()))
        })?;
        if tablets.join(target).exists() {
            return Ok(());
        }
        let staging = clone_staging_dir(tablets, target);
        if staging.exists() {
            std::fs::remove_dir_all(&staging)?;
        }
        let cloned = self.tablet.make_clone(&staging.join("data"), index, as_of);
        if cloned.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        cloned
    }

    /// Applies `op`, logged as entry `index` at `ts`, to the tablet.
    fn apply_op(
        &self,
        index: u64,
        ts: Timestamp,
        op: &TabletOp,
    ) -> Result<WriteOutcome, StorageError> {
        let tablet = &self.tablet;
        let committed_at = |at: Timestamp| {
            move |rows| WriteOutcome {
                rows,
                conflicts: Vec::new(),
                visible_at: Some(at),
            }
        };
        match op {
            TabletOp::Write(batch) => tablet.apply_write(index, ts, batch),
            TabletOp::AlterSchema(schema) => {
                (tablet.alter_schema(index, schema)).map(|()| WriteOutcome::default())
            }
            TabletOp::TxnWrite {
                txn,
                batch,
                prepare,
            } => {
                let written = tablet.apply_txn_write(index, ts, *txn, batch);
                // (A write that left nothing here, all its rows in conflict, prepares nothing:
                // its statement aborts.)
                match written {
                    Ok(outcome) if *prepare && tablet.txn_state(*txn).is_some() => {
                        (tablet.prepare_txn(index, ts, *txn)).map(|_| outcome)
                    }
                    written => written,
                }
            }
            TabletOp::TxnPrepare { txn } => {
                (tablet.prepare_txn(index, ts, *txn)).map(|_| WriteOutcome::default())
            }
            TabletOp::TxnUnprepare { txn } => {
                (tablet.unprepare_txn(index, *txn)).map(|()| WriteOutcome::default())
            }
            TabletOp::TxnCommit { txn, commit_ts } => {
                // A commit without prepare (one participant) commits at its own timestamp.
                let at = match commit_ts.0 {
                    0 => ts,
                    _ => *commit_ts,
                };
                self.clock.observe(at);
                tablet.commit_txn(index, at, *txn).map(committed_at(at))
            }
            TabletOp::TxnAbort { txn } => {
                (tablet.abort_txn(index, *txn)).map(|()| WriteOutcome::default())
            }
            TabletOp::Clone { target, as_of } => self
                .stage_clone(index, target, *as_of)
                .map(|()| WriteOutcome::default()),
        }
    }
}

impl StateMachine for TabletStateMachine {
    type Output = Result<WriteOutcome, StorageError>;

    fn durable_index(&self) -> u64 {
        self.tablet.durable_index()
    }

    fn apply(&mut self, index: u64, command: &bytes::Bytes) -> Self::Output {
        let logged = LoggedOp::decode(command)?;
        // A replayed entry may carry a timestamp ahead of this process's clock.
        self.clock.observe(logged.ts);
        let tablet = &self.tablet;
        // A request applied before (sent again after its answer was lost) is answered with
        // what it did then.
        let result = match logged.request {
            Some(id) => match tablet.applied_request(id) {
                Some(known) => known,
                None => {
                    tablet.begin_request(id, index, logged.ts);
                    let result = self.apply_op(index, logged.ts, &logged.op);
                    tablet.end_request(id, result.as_ref().ok());
                    result
                }
            },
            None => self.apply_op(index, logged.ts, &logged.op),
        };
        let holds = tablet.take_holds();
        self.inflight.change_holds(&holds);
        // Rows waiting for their turn (a queue's) are not visible yet: then only the turns
        // this entry applied count.
        let visible = (result.as_ref().ok())
            .and_then(|outcome| outcome.visible_at.filter(|_| outcome.rows > 0))
            .filter(|_| !tablet.turns_waiting());
        if let Some(at) = visible.max(holds.visible) {
            // Wakes the readers waiting for new rows (queue tails).
            self.inflight.written.send_if_modified(|newest| {
                let newer = at.0 > *newest;
                *newest = (*newest).max(at.0);
                newer
            });
        }
        if let Ok(outcome) = &result {
            // Rows count when they become visible (a transaction's at its commit), bytes when
            // they arrive.
            let metrics = crate::metrics::engine();
            if !matches!(logged.op, TabletOp::TxnWrite { .. }) {
                metrics.rows_written.inc_by(outcome.rows as u64);
            }
            if let TabletOp::Write(batch) | TabletOp::TxnWrite { batch, .. } = &logged.op {
                let bytes = nyala_storage::rows_bytes(&batch.rows) as u64;
                metrics.bytes_written.inc_by(bytes);
            }
        }
        self.inflight.remove(logged.ts.0);
        if let Some(maintenance) = &self.maintenance {
            maintenance.wrote();
        }
        result
    }

    /// A membership change carries `<server id>=<address>` of the member it adds.
    fn membership_changed(&mut self, voters: &[u64], learners: &[u64], context: &[u8]) {
        let mut peers = Peers::read(&self.dir).ok().flatten().unwrap_or_default();
        if let Some((id, address)) = std::str::from_utf8(context)
            .ok()
            .and_then(|c| c.split_once('='))
            .and_then(|(id, a)| Some((id.parse::<u64>().ok()?, a.to_string())))
        {
            if let Some(learn) = &self.learn {
                learn(id, address.clone());
            }
            peers.addresses.insert(id, address);
        }
        peers.voters = voters.iter().chain(learners).copied().collect();
        if let Err(e) = peers.write(&self.dir) {
            tracing::error!(dir = %self.dir.display(), error = %e, "cannot record the tablet's members");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use arrow::array::{ArrayRef, Int64Array, RecordBatch};
    use nyala_storage::{
        ColumnSchema, ColumnType, RequestId, Schema, TabletOptions, WriteBatch, WriteKind,
    };
    use parking_lot::Mutex;

    use super::*;

    type Learned = Arc<Mutex<Vec<(u64, String)>>>;

    /// A state machine over a new tablet (`k`, `v`: BIGINT) in `dir`, and what it learns of
    /// new members' addresses.
    fn state_machine(dir: &Path) -> (TabletStateMachine, Learned) {
        let schema = Schema::new(
            vec![
                ColumnSchema::new("k", ColumnType::Int64, false),
                ColumnSchema::new("v", ColumnType::Int64, false),
            ],
            vec![0],
        )
        .unwrap();
        let tablet = Tablet::create(&dir.join("data"), schema, TabletOptions::default());
        let learned = Learned::default();
        let learner = learned.clone();
        let sm = TabletStateMachine {
            tablet: Arc::new(tablet.unwrap()),
            inflight: Inflight::default(),
            clock: Arc::new(HybridClock::new()),
            dir: dir.to_path_buf(),
            learn: Some(Arc::new(move |id, address| {
                learner.lock().push((id, address))
            })),
            maintenance: Some(Arc::default()),
        };
        (sm, learned)
    }

    /// The stamped log entry of inserting (`k`, `v`), for `request` if given, proposed at `ts`
    /// (marked in flight, as the leader does).
    fn insert(
        sm: &TabletStateMachine,
        k: i64,
        request: Option<RequestId>,
        ts: Timestamp,
    ) -> bytes::Bytes {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![k])),
            Arc::new(Int64Array::from(vec![k * 10])),
        ];
        let rows = RecordBatch::try_new(sm.tablet.schema().arrow_schema(), columns).unwrap();
        let op = TabletOp::Write(WriteBatch::new(WriteKind::Insert, rows));
        let mut entry = LoggedOp::frame(&op, request);
        LoggedOp::stamp(&mut entry, ts);
        sm.inflight.lock().writes.insert(ts.0);
        entry.into()
    }

    /// A request applied again (its answer lost, the client sent it again) is answered with
    /// what it did the first time instead of failing as a duplicate key; the same insert
    /// without a request fails. Either way the entry's write is no longer in flight.
    #[test]
    fn a_request_applied_again_is_answered_as_before() {
        let dir = tempfile::tempdir().unwrap();
        let (mut sm, _) = state_machine(dir.path());
        let request = RequestId { client: 1, seq: 1 };
        let ts = sm.clock.now();
        let entry = insert(&sm, 1, Some(request), ts);
        let first = sm.apply(1, &entry).unwrap();
        assert_eq!((first.rows, first.visible_at), (1, Some(ts)));
        assert!(sm.inflight.applied(ts));
        assert_eq!(*sm.inflight.written.borrow(), ts.0);

        let again = insert(&sm, 1, Some(request), sm.clock.now());
        assert_eq!(sm.apply(2, &again).unwrap(), first);

        let later = sm.clock.now();
        let duplicate = insert(&sm, 1, None, later);
        assert!(matches!(
            sm.apply(3, &duplicate),
            Err(StorageError::DuplicateKey { .. })
        ));
        assert!(sm.inflight.applied(later));
    }

    /// An entry stamped ahead of this process's clock (replayed, or from a leader whose clock
    /// runs ahead) moves the clock past it, so later writes here are stamped above it.
    #[test]
    fn an_entry_ahead_of_the_clock_moves_the_clock() {
        let dir = tempfile::tempdir().unwrap();
        let (mut sm, _) = state_machine(dir.path());
        let ahead = Timestamp::from_micros(sm.clock.now().micros() + 10_000_000);
        let entry = insert(&sm, 1, None, ahead);
        sm.apply(1, &entry).unwrap();
        assert!(sm.clock.now() > ahead);
    }

    #[test]
    fn a_damaged_entry_applies_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (mut sm, _) = state_machine(dir.path());
        let ts = sm.clock.now();
        let entry = insert(&sm, 1, None, ts).slice(..8);
        assert!(matches!(
            sm.apply(1, &entry),
            Err(StorageError::Corruption(_))
        ));
        assert_eq!(sm.tablet.estimated_rows(), 0);
    }

    /// A membership change records the group's members (voters and learners) in `peers.json`
    /// and where an added member listens, and tells the server; a later change keeps the
    /// addresses known.
    #[test]
    fn a_membership_change_records_the_members() {
        let dir = tempfile::tempdir().unwrap();
        let (mut sm, learned) = state_machine(dir.path());
        sm.membership_changed(&[1, 2], &[3], b"3=c:7051");
        let peers = Peers::read(dir.path()).unwrap().unwrap();
        assert_eq!(peers.voters, [1, 2, 3]);
        assert_eq!(peers.addresses.get(&3).map(String::as_str), Some("c:7051"));
        assert_eq!(*learned.lock(), [(3, "c:7051".to_string())]);

        sm.membership_changed(&[1, 3], &[], b"");
        let peers = Peers::read(dir.path()).unwrap().unwrap();
        assert_eq!(peers.voters, [1, 3]);
        assert_eq!(peers.addresses.len(), 1);
        assert_eq!(learned.lock().len(), 1);
    }
}
