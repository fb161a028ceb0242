//! What travels between GetFlightInfo and DoGet: a self-contained ticket — the session and
//! query whose plan the server keeps, and, for when that plan is gone, the SQL and its bound
//! parameters — and, for per-tablet endpoints, the partition to read. Also the parameter rows
//! themselves, as uploaded with DoPut and as carried in tickets.
//!
//! A ticket comes back from the client, who may have changed any byte of it: its parameters
//! are decoded as an upload ([`Upload`]) and its text is held to the limits of statements.

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Schema};
use arrow_flight::FlightData;
use datafusion::common::ScalarValue;
use futures::TryStreamExt;
use prost::Message;
use tonic::Status;

use crate::limits;
use crate::upload::Upload;

/// The handle inside a `TicketStatementQuery`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct QueryTicket {
    /// The query's random id in its session (its plan, CancelFlightInfo); all endpoints of one
    /// FlightInfo share it.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(string, tag = "2")]
    pub sql: String,
    /// Bound parameter rows as the IPC messages of one batch (schema first); none when there
    /// are none. (Tag 3, an IPC stream, is no longer used.)
    #[prost(message, repeated, tag = "10")]
    pub params: Vec<FlightData>,
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
    /// The transaction (begun by BeginTransaction) the query runs in, if any.
    #[prost(uint64, optional, tag = "11")]
    pub transaction: Option<u64>,
}

impl QueryTicket {
    pub fn decode_handle(handle: &[u8]) -> Result<Self, Status> {
        QueryTicket::decode(handle).map_err(|_| Status::invalid_argument("malformed ticket"))
    }
}

/// Parameter rows (one batch, one column per placeholder) → IPC messages, and back.
pub fn encode_params(params: Option<&RecordBatch>) -> Result<Vec<FlightData>, Status> {
    let Some(batch) = params else {
        return Ok(vec![]);
    };
    arrow_flight::utils::batches_to_flight_data(&batch.schema(), vec![batch.clone()])
        .map_err(crate::internal)
}

pub async fn decode_params(messages: &[FlightData]) -> Result<Option<RecordBatch>, Status> {
    if messages.is_empty() {
        return Ok(None);
    }
    read_params(Upload::of_messages(messages.to_vec())).await
}

/// Reads uploaded parameter rows, within the limits on parameters: one batch whose rows are the
/// parameter rows, None if there are no columns.
pub async fn read_params(mut upload: Upload) -> Result<Option<RecordBatch>, Status> {
    let mut batches = Vec::new();
    let mut rows = 0;
    while let Some(batch) = upload.try_next().await? {
        rows += batch.num_rows();
        limits::parameter_rows(rows, upload.bytes())?;
        batches.push(batch);
    }
    let Some(schema) = upload.schema().cloned() else {
        return Ok(None);
    };
    nyala_server::limits::parameter_count(schema.fields().len()).map_err(crate::status)?;
    // A schema without rows binds nothing (and arrow's empty batch of some uploaded types
    // panics: `ArrayData::new_null`).
    if schema.fields().is_empty() || batches.is_empty() {
        return Ok(None);
    }
    let batch = concat_batches(&schema, &batches).map_err(crate::invalid)?;
    Ok(Some(without_dictionaries(batch)?))
}

/// `batch` with its dictionary-encoded columns decoded: a parameter is a value (and rows of
/// parameters travel on in tickets, whose encoding has no dictionaries).
fn without_dictionaries(batch: RecordBatch) -> Result<RecordBatch, Status> {
    let schema = batch.schema();
    let dictionary = |t: &DataType| matches!(t, DataType::Dictionary(..));
    if !schema.fields().iter().any(|f| dictionary(f.data_type())) {
        return Ok(batch);
    }
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let (field, column) = match field.data_type() {
            DataType::Dictionary(_, values) => {
                let decoded = arrow::compute::cast(column, values)
                    .map_err(|e| crate::invalid(format!("parameter {}: {e}", field.name())))?;
                (
                    field
                        .as_ref()
                        .clone()
                        .with_data_type(values.as_ref().clone()),
                    decoded,
                )
            }
            _ => (field.as_ref().clone(), column.clone()),
        };
        fields.push(field);
        columns.push(column);
    }
    RecordBatch::try_new(std::sync::Arc::new(Schema::new(fields)), columns).map_err(crate::invalid)
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
                .map_err(|e| crate::invalid(format!("unsupported parameter value: {e}")))
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
