//! What travels between GetFlightInfo and DoGet: a self-contained ticket (the SQL, its bound
//! parameters and, for per-tablet endpoints, the partition to read), and the server-side state
//! that outlives one call: prepared statements and cancellable queries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use datafusion::common::ScalarValue;
use prost::Message;
use tokio::sync::watch;
use tonic::Status;

/// The handle inside a `TicketStatementQuery`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct QueryTicket {
    /// The query's id, for CancelFlightInfo; all endpoints of one FlightInfo share it.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(string, tag = "2")]
    pub sql: String,
    /// Bound parameter rows as an Arrow IPC stream; empty when there are none.
    #[prost(bytes = "vec", tag = "3")]
    pub params: Vec<u8>,
    /// For a per-tablet endpoint: the partition (tablet) to read, of `partitions`.
    #[prost(uint32, optional, tag = "4")]
    pub partition: Option<u32>,
    #[prost(uint32, tag = "5")]
    pub partitions: u32,
    /// A DDL/DML statement already run at GetFlightInfo: its row count.
    #[prost(uint64, optional, tag = "6")]
    pub count: Option<u64>,
    /// That statement was DDL: its result has no columns and no rows.
    #[prost(bool, tag = "7")]
    pub ddl: bool,
    /// For per-tablet endpoints: the snapshot all of them read at.
    #[prost(uint64, optional, tag = "8")]
    pub snapshot: Option<u64>,
}

impl QueryTicket {
    pub fn decode_handle(handle: &[u8]) -> Result<Self, Status> {
        QueryTicket::decode(handle).map_err(|_| Status::invalid_argument("malformed ticket"))
    }
}

/// Parameter rows (one batch, one column per placeholder) → IPC bytes, and back.
pub fn encode_params(params: Option<&RecordBatch>) -> Result<Vec<u8>, Status> {
    let Some(batch) = params else {
        return Ok(vec![]);
    };
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, &batch.schema())
        .map_err(|e| Status::internal(e.to_string()))?;
    writer
        .write(batch)
        .map_err(|e| Status::internal(e.to_string()))?;
    writer
        .finish()
        .map_err(|e| Status::internal(e.to_string()))?;
    drop(writer);
    Ok(out)
}

pub fn decode_params(bytes: &[u8]) -> Result<Option<RecordBatch>, Status> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let malformed = |_| Status::invalid_argument("malformed parameters in ticket");
    let reader = StreamReader::try_new(bytes, None).map_err(malformed)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>().map_err(malformed)?;
    Ok(Some(concat_batches(&schema, &batches).map_err(malformed)?))
}

/// The parameter sets to run a statement with: one per row of `params`, or a single empty set.
pub fn param_rows(params: Option<&RecordBatch>) -> Result<Vec<Vec<ScalarValue>>, Status> {
    let Some(batch) = params else {
        return Ok(vec![vec![]]);
    };
    (0..batch.num_rows())
        .map(|row| {
            batch
                .columns()
                .iter()
                .map(|c| ScalarValue::try_from_array(c, row).map(unwrap_union))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| Status::invalid_argument(format!("unsupported parameter value: {e}")))
        })
        .collect()
}

/// Some clients (flightsql-dbapi) send each parameter as a dense union of the types they know;
/// the value is the union's selected child.
fn unwrap_union(value: ScalarValue) -> ScalarValue {
    match value {
        ScalarValue::Union(Some((_, inner)), _, _) => unwrap_union(*inner),
        ScalarValue::Union(None, _, _) => ScalarValue::Null,
        other => other,
    }
}

/// Concatenates the batches of a parameter upload (DoPut) into one batch, None if no rows.
pub fn concat_params(
    schema: Option<SchemaRef>,
    batches: Vec<RecordBatch>,
) -> Result<Option<RecordBatch>, Status> {
    let Some(schema) = schema.or_else(|| batches.first().map(|b| b.schema())) else {
        return Ok(None);
    };
    if schema.fields().is_empty() {
        return Ok(None);
    }
    let batch =
        concat_batches(&schema, &batches).map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(Some(batch))
}

/// A prepared statement: its SQL and the parameters last bound to it.
#[derive(Clone)]
pub struct Prepared {
    pub sql: String,
    pub params: Option<RecordBatch>,
}

/// Prepared statements by handle, until the client closes them (bounded: the oldest go first).
#[derive(Default)]
pub struct PreparedStatements {
    next: AtomicU64,
    statements: Mutex<HashMap<u64, Prepared>>,
}

const MAX_PREPARED: usize = 10_000;
const HANDLE_PREFIX: &str = "nyala-prepared-";

impl PreparedStatements {
    pub fn insert(&self, sql: String) -> Vec<u8> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut map) = self.statements.lock() {
            if map.len() >= MAX_PREPARED {
                if let Some(&oldest) = map.keys().min() {
                    map.remove(&oldest);
                }
            }
            map.insert(id, Prepared { sql, params: None });
        }
        format!("{HANDLE_PREFIX}{id}").into_bytes()
    }

    fn id(handle: &[u8]) -> Result<u64, Status> {
        std::str::from_utf8(handle)
            .ok()
            .and_then(|h| h.strip_prefix(HANDLE_PREFIX))
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| Status::invalid_argument("malformed prepared statement handle"))
    }

    pub fn get(&self, handle: &[u8]) -> Result<Prepared, Status> {
        let id = Self::id(handle)?;
        let map = self
            .statements
            .lock()
            .map_err(|_| Status::internal("prepared statements poisoned"))?;
        map.get(&id).cloned().ok_or_else(|| {
            Status::not_found(
                "unknown prepared statement (closed, or prepared on another server run)",
            )
        })
    }

    pub fn bind(&self, handle: &[u8], params: Option<RecordBatch>) -> Result<(), Status> {
        let id = Self::id(handle)?;
        let mut map = self
            .statements
            .lock()
            .map_err(|_| Status::internal("prepared statements poisoned"))?;
        let prepared = map
            .get_mut(&id)
            .ok_or_else(|| Status::not_found("unknown prepared statement"))?;
        prepared.params = params;
        Ok(())
    }

    pub fn close(&self, handle: &[u8]) -> Result<(), Status> {
        let id = Self::id(handle)?;
        if let Ok(mut map) = self.statements.lock() {
            map.remove(&id);
        }
        Ok(())
    }
}

/// Queries handed out by GetFlightInfo, so CancelFlightInfo can stop them.
#[derive(Default)]
pub struct Queries {
    next: AtomicU64,
    cancel: Mutex<HashMap<u64, watch::Sender<bool>>>,
}

const MAX_TRACKED_QUERIES: usize = 10_000;

impl Queries {
    /// A new query id.
    pub fn register(&self) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        if let Ok(mut map) = self.cancel.lock() {
            if map.len() >= MAX_TRACKED_QUERIES {
                // Forget queries nobody is reading; their tickets still run, just not cancellable.
                map.retain(|_, sender| sender.receiver_count() > 0);
            }
            map.insert(id, watch::channel(false).0);
        }
        id
    }

    /// A receiver that turns true when query `id` is cancelled; an error if it already was.
    pub fn start(&self, id: u64) -> Result<watch::Receiver<bool>, Status> {
        let map = self
            .cancel
            .lock()
            .map_err(|_| Status::internal("query registry poisoned"))?;
        match map.get(&id) {
            Some(sender) if *sender.borrow() => Err(Status::cancelled("the query was cancelled")),
            Some(sender) => Ok(sender.subscribe()),
            // Unknown (e.g. issued before a restart): runs, but cannot be cancelled.
            None => Ok(watch::channel(false).1),
        }
    }

    /// Cancels query `id`; false if it is unknown.
    pub fn cancel(&self, id: u64) -> bool {
        let Ok(map) = self.cancel.lock() else {
            return false;
        };
        match map.get(&id) {
            Some(sender) => {
                sender.send_replace(true);
                true
            }
            None => false,
        }
    }
}
