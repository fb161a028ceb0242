//! Nyala's Arrow Flight SQL service.
//!
//! Statements travel as text: GetFlightInfo plans a statement (so its schema, or its error,
//! comes back at once) and returns a ticket carrying the SQL; DoGet plans it again and streams
//! the result batch by batch. DDL and DML sent as queries (ADBC does this) run at DoGet and
//! return their `count` row; sent as updates (DoPut) they return the count. Prepared statements
//! have the SQL text as their handle, because the JDBC driver prepares every statement.
//! Catalog metadata (catalogs, schemas, tables, table types, primary keys, SQL info) is answered
//! from the database's catalog.

use std::pin::Pin;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightServiceServer;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, Any, CommandGetCatalogs, CommandGetDbSchemas,
    CommandGetPrimaryKeys, CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables,
    CommandPreparedStatementQuery, CommandPreparedStatementUpdate, CommandStatementQuery,
    CommandStatementUpdate, ProstMessageExt, SqlInfo, TicketStatementQuery,
};
use arrow_flight::{Action, FlightDescriptor, FlightEndpoint, FlightInfo, IpcMessage, SchemaAsIpc, Ticket};
use futures::{Stream, TryStreamExt};
use nyala_sql::{Database, Session, SqlError, StatementKind, CATALOG_NAME, SCHEMA_NAME};
use prost::Message;
use tonic::{Request, Response, Status, Streaming};

pub mod embedded;

/// Prefix of the ticket handle of an already executed DDL/DML statement; SQL never starts with NUL.
const COUNT_HANDLE: &str = "\0count:";

type DoGetStream = Pin<Box<dyn Stream<Item = Result<arrow_flight::FlightData, Status>> + Send + 'static>>;

/// The Flight SQL service over one database.
pub struct NyalaFlightService {
    db: Arc<Database>,
    session: Session,
    sql_info: SqlInfoData,
}

impl NyalaFlightService {
    pub fn new(db: Arc<Database>) -> anyhow::Result<Self> {
        let mut info = SqlInfoDataBuilder::new();
        info.append(SqlInfo::FlightSqlServerName, "Nyala");
        info.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
        info.append(SqlInfo::FlightSqlServerArrowVersion, "59");
        info.append(SqlInfo::FlightSqlServerReadOnly, false);
        info.append(SqlInfo::FlightSqlServerSql, true);
        info.append(SqlInfo::FlightSqlServerSubstrait, false);
        info.append(SqlInfo::FlightSqlServerTransaction, 0i32);
        info.append(SqlInfo::FlightSqlServerCancel, false);
        let session = db.session();
        Ok(Self { db, session, sql_info: info.build()? })
    }
}

/// A SQL error as a gRPC status: the user's mistakes are InvalidArgument, the rest Internal.
pub fn status(e: SqlError) -> Status {
    match &e {
        SqlError::NotSupported(_) => Status::unimplemented(e.to_string()),
        // Everything else a statement can fail with is about the statement or the data it
        // touches (parse, planning, types, duplicate keys): the client's to fix.
        _ => Status::invalid_argument(e.to_string()),
    }
}

fn utf8(bytes: &[u8], what: &str) -> Result<String, Status> {
    String::from_utf8(bytes.to_vec()).map_err(|_| Status::invalid_argument(format!("{what} is not valid UTF-8")))
}

fn flight_info(schema: &Schema, ticket: Vec<u8>, descriptor: FlightDescriptor) -> Result<FlightInfo, Status> {
    let info = FlightInfo::new()
        .try_with_schema(schema)
        .map_err(|e| Status::internal(e.to_string()))?
        .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(ticket)))
        .with_descriptor(descriptor);
    Ok(info)
}

fn batch_stream(schema: SchemaRef, batches: impl Stream<Item = Result<RecordBatch, FlightError>> + Send + 'static) -> DoGetStream {
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(batches)
        .map_err(|e| Status::internal(e.to_string()));
    Box::pin(stream)
}

fn one_batch(batch: RecordBatch) -> Response<DoGetStream> {
    Response::new(batch_stream(batch.schema(), futures::stream::iter([Ok(batch)])))
}

impl NyalaFlightService {
    /// Plans `sql` for GetFlightInfo. Queries get a ticket carrying the SQL (run at DoGet). DDL
    /// and DML run now: clients such as ADBC never fetch the result of a statement they consider
    /// an update, so waiting for DoGet would leave it unapplied. Their ticket carries the count.
    async fn info_for_sql(&self, sql: &str, descriptor: FlightDescriptor) -> Result<Response<FlightInfo>, Status> {
        let planned = self.session.plan(sql).await.map_err(status)?;
        let schema = planned.schema();
        let handle = if planned.kind() == StatementKind::Query {
            sql.as_bytes().to_vec()
        } else {
            let count = Self::count(planned).await?;
            format!("{COUNT_HANDLE}{count}").into_bytes()
        };
        let ticket = TicketStatementQuery { statement_handle: handle.into() };
        Ok(Response::new(flight_info(&schema, ticket.as_any().encode_to_vec(), descriptor)?))
    }

    async fn stream_sql(&self, handle: &[u8]) -> Result<Response<DoGetStream>, Status> {
        let handle = utf8(handle, "statement handle")?;
        if let Some(count) = handle.strip_prefix(COUNT_HANDLE) {
            let count: u64 = count.parse().map_err(|_| Status::invalid_argument("malformed ticket"))?;
            let schema = Arc::new(Schema::new(vec![Field::new("count", DataType::UInt64, false)]));
            let batch = RecordBatch::try_new(schema, vec![Arc::new(arrow::array::UInt64Array::from(vec![count]))])
                .map_err(|e| Status::internal(e.to_string()))?;
            return Ok(one_batch(batch));
        }
        let planned = self.session.plan(&handle).await.map_err(status)?;
        let schema = planned.schema();
        let stream = planned.execute().await.map_err(status)?;
        let batches = stream.map_err(|e| FlightError::ExternalError(Box::new(e)));
        Ok(Response::new(batch_stream(schema, batches)))
    }

    /// Runs a DDL or DML statement and returns its `count`.
    async fn count(planned: nyala_sql::PlannedStatement) -> Result<u64, Status> {
        let batches: Vec<RecordBatch> = planned
            .execute()
            .await
            .map_err(status)?
            .try_collect()
            .await
            .map_err(|e| Status::invalid_argument(e.strip_backtrace()))?;
        Ok(batches
            .first()
            .and_then(|b| b.column(0).as_any().downcast_ref::<arrow::array::UInt64Array>().map(|c| c.value(0)))
            .unwrap_or(0))
    }

    async fn update_sql(&self, sql: &str) -> Result<i64, Status> {
        let planned = self.session.plan(sql).await.map_err(status)?;
        if planned.kind() == StatementKind::Query {
            return Err(Status::invalid_argument("a query cannot be executed as an update; use a query command"));
        }
        Ok(Self::count(planned).await? as i64)
    }

    fn tables_batch(&self, query: CommandGetTables) -> Result<RecordBatch, Status> {
        let catalog_ok = query.catalog.as_deref().is_none_or(|c| c == CATALOG_NAME);
        let schema_ok = query.db_schema_filter_pattern.as_deref().is_none_or(|p| like(SCHEMA_NAME, p));
        let types_ok = query.table_types.is_empty() || query.table_types.iter().any(|t| t == "TABLE");
        let pattern = query.table_name_filter_pattern.clone();
        let mut builder = query.into_builder();
        if catalog_ok && schema_ok && types_ok {
            for (name, schema) in self.db.tables() {
                if pattern.as_deref().is_none_or(|p| like(&name, p)) {
                    builder
                        .append(CATALOG_NAME, SCHEMA_NAME, &name, "TABLE", &schema)
                        .map_err(|e| Status::internal(e.to_string()))?;
                }
            }
        }
        builder.build().map_err(|e| Status::internal(e.to_string()))
    }

    fn primary_keys_batch(&self, query: &CommandGetPrimaryKeys) -> Result<RecordBatch, Status> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("catalog_name", DataType::Utf8, true),
            Field::new("db_schema_name", DataType::Utf8, true),
            Field::new("table_name", DataType::Utf8, false),
            Field::new("column_name", DataType::Utf8, false),
            Field::new("key_name", DataType::Utf8, true),
            Field::new("key_sequence", DataType::Int32, false),
        ]));
        let columns = if query.catalog.as_deref().is_none_or(|c| c == CATALOG_NAME)
            && query.db_schema.as_deref().is_none_or(|s| s == SCHEMA_NAME)
        {
            self.db.primary_key(&query.table).unwrap_or_default()
        } else {
            vec![]
        };
        let n = columns.len();
        let arrays: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec![CATALOG_NAME; n])),
            Arc::new(StringArray::from(vec![SCHEMA_NAME; n])),
            Arc::new(StringArray::from(vec![query.table.as_str(); n])),
            Arc::new(StringArray::from(columns)),
            Arc::new(StringArray::from(vec![None::<&str>; n])),
            Arc::new(Int32Array::from((1..=n as i32).collect::<Vec<_>>())),
        ];
        RecordBatch::try_new(schema, arrays).map_err(|e| Status::internal(e.to_string()))
    }
}

/// SQL LIKE with `%` and `_`, as Flight SQL filter patterns use it.
fn like(value: &str, pattern: &str) -> bool {
    fn go(v: &[char], p: &[char]) -> bool {
        match p.split_first() {
            None => v.is_empty(),
            Some(('%', rest)) => (0..=v.len()).any(|i| go(&v[i..], rest)),
            Some(('_', rest)) => !v.is_empty() && go(&v[1..], rest),
            Some((c, rest)) => v.first() == Some(c) && go(&v[1..], rest),
        }
    }
    go(&value.chars().collect::<Vec<_>>(), &pattern.chars().collect::<Vec<_>>())
}

#[tonic::async_trait]
impl FlightSqlService for NyalaFlightService {
    type FlightService = NyalaFlightService;

    async fn do_handshake(
        &self,
        _request: Request<Streaming<arrow_flight::HandshakeRequest>>,
    ) -> Result<Response<Pin<Box<dyn Stream<Item = Result<arrow_flight::HandshakeResponse, Status>> + Send>>>, Status> {
        // No authentication yet (serve listens on loopback by default): accept everyone.
        let response = arrow_flight::HandshakeResponse { protocol_version: 0, payload: Default::default() };
        Ok(Response::new(Box::pin(futures::stream::iter([Ok(response)]))))
    }

    async fn get_flight_info_statement(&self, query: CommandStatementQuery, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        self.info_for_sql(&query.query, request.into_inner()).await
    }

    async fn do_get_statement(&self, ticket: TicketStatementQuery, _request: Request<Ticket>) -> Result<Response<DoGetStream>, Status> {
        self.stream_sql(&ticket.statement_handle).await
    }

    async fn do_put_statement_update(&self, command: CommandStatementUpdate, _request: Request<PeekableFlightDataStream>) -> Result<i64, Status> {
        self.update_sql(&command.query).await
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        _request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let planned = self.session.plan(&query.query).await.map_err(status)?;
        let schema = planned.schema();
        let message: IpcMessage = SchemaAsIpc::new(&schema, &Default::default())
            .try_into()
            .map_err(|e: arrow::error::ArrowError| Status::internal(e.to_string()))?;
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: query.query.into_bytes().into(),
            dataset_schema: message.0,
            parameter_schema: Default::default(),
        })
    }

    async fn do_action_close_prepared_statement(&self, _query: ActionClosePreparedStatementRequest, _request: Request<Action>) -> Result<(), Status> {
        Ok(())
    }

    async fn get_flight_info_prepared_statement(&self, query: CommandPreparedStatementQuery, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        let sql = utf8(&query.prepared_statement_handle, "prepared statement handle")?;
        self.info_for_sql(&sql, request.into_inner()).await
    }

    async fn do_get_prepared_statement(&self, query: CommandPreparedStatementQuery, _request: Request<Ticket>) -> Result<Response<DoGetStream>, Status> {
        self.stream_sql(&query.prepared_statement_handle).await
    }

    async fn do_put_prepared_statement_update(&self, query: CommandPreparedStatementUpdate, _request: Request<PeekableFlightDataStream>) -> Result<i64, Status> {
        let sql = utf8(&query.prepared_statement_handle, "prepared statement handle")?;
        self.update_sql(&sql).await
    }

    async fn get_flight_info_catalogs(&self, query: CommandGetCatalogs, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        Ok(Response::new(flight_info(&schema, query.as_any().encode_to_vec(), request.into_inner())?))
    }

    async fn do_get_catalogs(&self, query: CommandGetCatalogs, _request: Request<Ticket>) -> Result<Response<DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append(CATALOG_NAME);
        Ok(one_batch(builder.build().map_err(|e| Status::internal(e.to_string()))?))
    }

    async fn get_flight_info_schemas(&self, query: CommandGetDbSchemas, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        Ok(Response::new(flight_info(&schema, query.as_any().encode_to_vec(), request.into_inner())?))
    }

    async fn do_get_schemas(&self, query: CommandGetDbSchemas, _request: Request<Ticket>) -> Result<Response<DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append(CATALOG_NAME, SCHEMA_NAME);
        Ok(one_batch(builder.build().map_err(|e| Status::internal(e.to_string()))?))
    }

    async fn get_flight_info_tables(&self, query: CommandGetTables, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        Ok(Response::new(flight_info(&schema, query.as_any().encode_to_vec(), request.into_inner())?))
    }

    async fn do_get_tables(&self, query: CommandGetTables, _request: Request<Ticket>) -> Result<Response<DoGetStream>, Status> {
        Ok(one_batch(self.tables_batch(query)?))
    }

    async fn get_flight_info_table_types(&self, query: CommandGetTableTypes, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        Ok(Response::new(flight_info(&schema, query.as_any().encode_to_vec(), request.into_inner())?))
    }

    async fn do_get_table_types(&self, query: CommandGetTableTypes, _request: Request<Ticket>) -> Result<Response<DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append("TABLE");
        Ok(one_batch(builder.build().map_err(|e| Status::internal(e.to_string()))?))
    }

    async fn get_flight_info_sql_info(&self, query: CommandGetSqlInfo, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(&self.sql_info).schema();
        Ok(Response::new(flight_info(&schema, query.as_any().encode_to_vec(), request.into_inner())?))
    }

    async fn do_get_sql_info(&self, query: CommandGetSqlInfo, _request: Request<Ticket>) -> Result<Response<DoGetStream>, Status> {
        let batch = query.into_builder(&self.sql_info).build().map_err(|e| Status::internal(e.to_string()))?;
        Ok(one_batch(batch))
    }

    async fn get_flight_info_primary_keys(&self, query: CommandGetPrimaryKeys, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        let schema = self.primary_keys_batch(&query)?.schema();
        Ok(Response::new(flight_info(&schema, query.as_any().encode_to_vec(), request.into_inner())?))
    }

    async fn do_get_primary_keys(&self, query: CommandGetPrimaryKeys, _request: Request<Ticket>) -> Result<Response<DoGetStream>, Status> {
        Ok(one_batch(self.primary_keys_batch(&query)?))
    }

    async fn do_get_fallback(&self, _request: Request<Ticket>, message: Any) -> Result<Response<DoGetStream>, Status> {
        Err(Status::invalid_argument(format!("unknown ticket type {}", message.type_url)))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// Serves Flight SQL for `db` on `listener` until `shutdown` completes.
pub async fn serve(
    db: Arc<Database>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let service = NyalaFlightService::new(db)?;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tonic::transport::Server::builder()
        .add_service(FlightServiceServer::new(service).max_decoding_message_size(256 << 20))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}
