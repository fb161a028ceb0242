//! The open scans of a tablet server. A scan that another server runs here is opened once and
//! read in chunks of about [`SCAN_CHUNK_BYTES`], each one Arrow IPC stream, so a large result
//! never has to fit in one message; a scanner nobody reads for [`SCANNER_IDLE`] is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use nyala_storage::ScanIterator;
use parking_lot::Mutex;

use crate::rpc;
use crate::rpc::proto::tserver::ScanResponse;
use crate::{EngineError, Result};

/// Rows per scanner answer, about.
const SCAN_CHUNK_BYTES: usize = 8 << 20;
/// A scanner (or tablet copy session) nobody asked anything of for this long is dropped.
pub(crate) const SCANNER_IDLE: Duration = Duration::from_secs(120);

/// Open scans of a server, by scanner id.
#[derive(Default)]
pub struct Scanners {
    open: Mutex<HashMap<u64, (ScanIterator, Instant)>>,
    next_id: AtomicU64,
}

impl Scanners {
    pub fn open(&self, iter: ScanIterator) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let mut open = self.open.lock();
        open.retain(|_, (_, used)| used.elapsed() < SCANNER_IDLE);
        open.insert(id, (iter, Instant::now()));
        id
    }

    /// The next rows of scanner `id`; the scanner closes when it has no more. Blocking: it
    /// reads the tablet.
    pub fn next_rows(&self, id: u64) -> Result<ScanResponse> {
        let (mut iter, _) = self.open.lock().remove(&id).ok_or_else(|| {
            EngineError::Unsupported(format!("scanner {id} does not exist (expired?)"))
        })?;
        let mut batches: Vec<RecordBatch> = Vec::new();
        let mut bytes = 0;
        let mut done = false;
        while bytes < SCAN_CHUNK_BYTES {
            let Some(batch) = iter.next() else {
                done = true;
                break;
            };
            let batch = batch?;
            bytes += batch.get_array_memory_size();
            batches.push(batch);
        }
        let ipc = rpc::encode_rows(&batches)?;
        if !done {
            self.open.lock().insert(id, (iter, Instant::now()));
        }
        Ok(ScanResponse {
            scanner_id: id,
            done,
            ipc: ipc.into(),
        })
    }
}
