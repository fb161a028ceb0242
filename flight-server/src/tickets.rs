//! What travels between GetFlightInfo and DoGet: a self-contained ticket — the session and
//! query whose plan the server keeps, and, for when that plan is gone, the SQL and its bound
//! parameters — and, for per-tablet endpoints, the partition to read.

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::StreamWriter;
use datafusion::common::ScalarValue;
use prost::Message;
use tonic::Status;

/// The handle inside a `TicketStatementQuery`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct QueryTicket {
    /// The query's random id in its session (its plan, CancelFlightInfo); all endpoints of one
    /// FlightInfo share it.
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
    /// The session that planned the query and keeps its plan under `id`.
    #[prost(string, tag = "9")]
    pub session: String,
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

/// The parameter rows of a ticket: the client's bytes. They are decoded as they are, with
/// arrow-ipc's `StreamDecoder`, which takes only the bytes there are: its `StreamReader`
/// allocates the body length a message declares before reading it, so a ticket could ask for
/// any amount of memory (an allocation failure aborts the server). Its schema decoding panics
/// on some malformed schemas (`Int type with bit width of 320 ... not supported`, arrow-ipc 59):
/// caught here, since a malformed ticket is the client's error.
pub fn decode_params(bytes: &[u8]) -> Result<Option<RecordBatch>, Status> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let malformed = |_| Status::invalid_argument("malformed parameters in ticket");
    let decode = || -> Result<RecordBatch, ArrowError> {
        let mut decoder = StreamDecoder::new();
        let mut buffer = Buffer::from(bytes);
        let mut batches = Vec::new();
        while let Some(batch) = decoder.decode(&mut buffer)? {
            batches.push(batch);
        }
        decoder.finish()?;
        let schema = decoder
            .schema()
            .ok_or_else(|| ArrowError::IpcError("no schema".into()))?;
        concat_batches(&schema, &batches)
    };
    match std::panic::catch_unwind(decode) {
        Ok(batch) => Ok(Some(batch.map_err(malformed)?)),
        Err(_) => Err(Status::invalid_argument("malformed parameters in ticket")),
    }
}

/// The most parameter rows one statement runs with: a row of NULL-typed columns (or of no
/// columns) takes no bytes, so the count is not bounded by what the client sent.
pub const MAX_PARAM_ROWS: usize = 1 << 20;

/// The parameter sets to run a statement with: one per row of `params`, or a single empty set.
pub fn param_rows(params: Option<&RecordBatch>) -> Result<Vec<Vec<ScalarValue>>, Status> {
    let Some(batch) = params else {
        return Ok(vec![vec![]]);
    };
    if batch.num_rows() > MAX_PARAM_ROWS {
        return Err(Status::invalid_argument(format!(
            "{} parameter rows; at most {MAX_PARAM_ROWS} may be bound at once",
            batch.num_rows()
        )));
    }
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
