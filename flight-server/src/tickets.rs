//! What travels between GetFlightInfo and DoGet: a self-contained ticket — the session and
//! query whose plan the server keeps, and, for when that plan is gone, the SQL and its bound
//! parameters — and, for per-tablet endpoints, the partition to read.

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::StreamReader;
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
