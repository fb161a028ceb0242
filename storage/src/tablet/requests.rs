//! Requests applied on a client's behalf, by the client's request id, with what each did
//! (Kudu's result tracker): a write sent again (its answer was lost, its leader changed
//! before it answered) finds its first application here and is answered with that, instead
//! of being applied twice on top of later writes.
//!
//! Every replica keeps the same record: it is changed only by applying log entries, and
//! forgets by the entries' timestamps, not by its own clock. A record is kept for
//! [`REQUEST_RETENTION`] of log time; a request older than that is not taken (see
//! [`Tablet::request_expired`]), so none can slip past a forgotten record. The records of
//! entries a flush made durable go into the tablet's metadata with it (entries after it are
//! replayed from the log, and recorded again).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Tablet;
use crate::{StorageError, Timestamp, WriteOutcome};

/// How long (in log time) a request's outcome is kept. Its client stops sending it well
/// before: a request older than half of this is refused.
pub const REQUEST_RETENTION: Duration = Duration::from_secs(120);

/// A client's request: the client's random id and the request's number among its requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestId {
    pub client: u64,
    pub seq: u64,
}

/// One request applied here.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Applied {
    id: RequestId,
    /// Its log entry and that entry's timestamp.
    index: u64,
    ts: Timestamp,
    /// What it did; None while it is being applied (or if a flush caught it then, unknown).
    outcome: Option<WriteOutcome>,
}

/// The requests applied within the retention, oldest first.
#[derive(Clone, Default)]
pub(super) struct Requests {
    by_id: HashMap<RequestId, Applied>,
    order: VecDeque<RequestId>,
}

impl RequestId {
    /// Appends the request id to a log entry, before its op.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.push(crate::write::REQUEST);
        out.extend_from_slice(&self.client.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
    }

    /// The request id a log entry's op bytes start with, if any, and the op's bytes.
    pub fn split(bytes: &[u8]) -> Result<(Option<RequestId>, &[u8]), StorageError> {
        let Some((&crate::write::REQUEST, rest)) = bytes.split_first() else {
            return Ok((None, bytes));
        };
        let short = || StorageError::Corruption("log entry shorter than its request id".into());
        let (client, rest) = rest.split_first_chunk::<8>().ok_or_else(short)?;
        let (seq, rest) = rest.split_first_chunk::<8>().ok_or_else(short)?;
        let id = RequestId {
            client: u64::from_le_bytes(*client),
            seq: u64::from_le_bytes(*seq),
        };
        Ok((Some(id), rest))
    }
}

impl Requests {
    pub(super) fn from_persisted(applied: Vec<Applied>) -> Requests {
        let mut requests = Requests::default();
        for a in applied {
            requests.order.push_back(a.id);
            requests.by_id.insert(a.id, a);
        }
        requests
    }

    /// The records of entries up to `durable_index`: what a metadata file written for it
    /// holds.
    pub(super) fn persisted(&self, durable_index: u64) -> Vec<Applied> {
        // (An id sent again after a failure stands twice in `order`: once here.)
        let mut seen = std::collections::HashSet::new();
        (self.order.iter())
            .filter(|id| seen.insert(**id))
            .filter_map(|id| self.by_id.get(id))
            .filter(|a| a.index <= durable_index)
            .cloned()
            .collect()
    }

    /// Forgets the requests applied more than the retention before `now` (log time).
    fn forget_before(&mut self, now: Timestamp) {
        let retention = REQUEST_RETENTION.as_micros() as u64;
        let oldest = Timestamp::from_micros(now.micros().saturating_sub(retention));
        while let Some(id) = self.order.front() {
            match self.by_id.get(id) {
                Some(a) if a.ts >= oldest => break,
                _ => {
                    self.by_id.remove(id);
                    self.order.pop_front();
                }
            }
        }
    }
}

impl Tablet {
    /// What request `id` did when it was applied here, if it was: then it must not be
    /// applied again. An error where it was applied but what it did is not known (a flush
    /// caught it being applied): its client cannot be told more than that.
    pub fn applied_request(&self, id: RequestId) -> Option<Result<WriteOutcome, StorageError>> {
        let state = self.state.read();
        let applied = state.requests.by_id.get(&id)?;
        Some(applied.outcome.clone().ok_or_else(|| {
            StorageError::OutcomeUnknown(format!(
                "request {} of client {:x} was applied at log entry {}, but what it did is no \
                 longer known",
                id.seq, id.client, applied.index
            ))
        }))
    }

    /// Records that request `id` is applied by log entry `index` at `ts`, before it is: a
    /// flush in between persists it (with its outcome unknown) only once the entry is
    /// durable. Forgets the requests older than the retention.
    pub fn begin_request(&self, id: RequestId, index: u64, ts: Timestamp) {
        let mut state = self.state.write();
        let requests = &mut state.requests;
        requests.forget_before(ts);
        let applied = Applied {
            id,
            index,
            ts,
            outcome: None,
        };
        if requests.by_id.insert(id, applied).is_none() {
            requests.order.push_back(id);
        }
    }

    /// What request `id`, begun by [`Self::begin_request`], did: kept with it, or, for a
    /// request that changed nothing (failed), forgotten: sent again, it is applied again.
    pub fn end_request(&self, id: RequestId, outcome: Option<&WriteOutcome>) {
        let mut state = self.state.write();
        let requests = &mut state.requests;
        match outcome {
            Some(outcome) => {
                if let Some(applied) = requests.by_id.get_mut(&id) {
                    applied.outcome = Some(outcome.clone());
                }
            }
            // (Its place in `order` goes when the requests before it are forgotten.)
            None => {
                requests.by_id.remove(&id);
            }
        }
    }

    /// Whether a request first sent at `sent` (the client's clock) is too old to be taken at
    /// `now`: its record could already be forgotten had it been applied.
    pub fn request_expired(sent: Timestamp, now: Timestamp) -> bool {
        let limit = (REQUEST_RETENTION / 2).as_micros() as u64;
        now.micros().saturating_sub(sent.micros()) > limit
    }
}
