//! Nyala's Arrow Flight SQL service.
//!
//! GetFlightInfo plans a statement (so its schema, or its error, comes back at once) and returns
//! self-contained tickets ([`tickets::QueryTicket`]: the SQL, bound parameters, a query id);
//! DoGet plans it again and streams the result batch by batch, never holding it whole. A plain
//! single-table SELECT (projection and filters) gets one endpoint per tablet, with this server's
//! location, so parallel readers fetch tablets side by side.
//!
//! DDL and DML sent as queries (ADBC does this) run at GetFlightInfo, since such clients never
//! fetch their result; sent as updates (DoPut) they return the count. Every statement can be
//! prepared (the JDBC driver prepares everything), with `?` or `$n` parameters bound by DoPut;
//! several parameter rows run the statement once per row. Bulk ingest loads Arrow batches
//! into a table as they arrive.
//!
//! Every client has its own session ([`session`]): settings, prepared statements (kept planned
//! and re-bound per execution) and the plans of queries between GetFlightInfo and DoGet, so a
//! query is planned once. Tickets stay self-contained: a ticket whose plan is gone (its
//! session ended, or another server serves it) is planned again from its text.
//! Authentication, when configured, is checked for every call by the session layer.

use std::pin::Pin;
use std::sync::Arc;

use arrow::array::{RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightServiceServer;
use arrow_flight::sql::metadata::{SqlInfoData, XdbcTypeInfoData};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionBeginTransactionRequest, ActionBeginTransactionResult, ActionCancelQueryRequest,
    ActionCancelQueryResult, ActionClosePreparedStatementRequest,
    ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult,
    ActionEndTransactionRequest, Any, CommandGetCatalogs, CommandGetCrossReference,
    CommandGetDbSchemas, CommandGetExportedKeys, CommandGetImportedKeys, CommandGetPrimaryKeys,
    CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables, CommandGetXdbcTypeInfo,
    CommandPreparedStatementQuery, CommandPreparedStatementUpdate, CommandStatementIngest,
    CommandStatementQuery, CommandStatementUpdate, DoPutPreparedStatementResult, EndTransaction,
    ProstMessageExt, SqlInfo, TableExistsOption, TableNotExistOption, TicketStatementQuery,
};
use arrow_flight::{
    Action, ActionType, CancelFlightInfoRequest, CancelFlightInfoResult, CancelStatus,
    FlightDescriptor, FlightEndpoint, FlightInfo, IpcMessage, SchemaAsIpc, Ticket,
};
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use nyala_sql::{
    Database, IngestMode, IngestTarget, PlannedStatement, PreparedStatement, SqlError,
    StatementKind, CATALOG_NAME, SCHEMA_NAME,
};
use prost::Message;
use tonic::{Request, Response, Status, Streaming};

pub use nyala_server::activity;
pub mod admin;
pub mod auth;
pub mod connection;
pub mod embedded;
mod errors;
#[cfg(test)]
mod fuzz;
pub mod limits;
mod metadata;
pub mod session;
mod session_options;
mod tickets;
mod upload;
pub mod web;

use activity::Activity;
use auth::{Auth, Caller};
use errors::bounded_message;
use nyala_server::run::BatchStream;
use nyala_server::{excerpt, ClientSession, ServerError, Sessions};
use session::{caller_of, session_of, SessionLayer};
use tickets::QueryTicket;
use upload::Upload;

/// Request header (`true`) asking for one endpoint even where there could be one per tablet.
pub const SINGLE_ENDPOINT_HEADER: &str = "x-nyala-single-endpoint";

type DoGetStream =
    Pin<Box<dyn Stream<Item = Result<arrow_flight::FlightData, Status>> + Send + 'static>>;

/// The Flight SQL service over one database.
pub struct NyalaFlightService {
    db: Arc<Database>,
    sessions: Arc<Sessions>,
    /// The URI clients reach this server at, given as the location of per-tablet endpoints.
    location: Option<String>,
    sql_info: SqlInfoData,
    xdbc_types: XdbcTypeInfoData,
    /// The statements running and run, for operators.
    activity: Arc<Activity>,
}

/// How long a session may go without a request before it ends, unless configured.
pub const DEFAULT_SESSION_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// How a server is reached and who may use it.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// Location advertised in per-tablet endpoints, e.g. `grpc+tcp://10.0.0.5:50051`.
    pub location: Option<String>,
    /// The TLS certificate chain and private key (PEM) to serve with; None: plaintext.
    pub tls: Option<TlsIdentity>,
    /// Sessions (and their tokens) idle for longer end; None: [`DEFAULT_SESSION_IDLE_TIMEOUT`].
    pub session_idle_timeout: Option<std::time::Duration>,
    /// Where the statements run are recorded (the web UI shows them); None: nowhere shown.
    pub activity: Option<Arc<Activity>>,
}

impl NyalaFlightService {
    pub fn new(
        db: Arc<Database>,
        sessions: Arc<Sessions>,
        location: Option<String>,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            db,
            sessions,
            location,
            sql_info: metadata::sql_info()?,
            xdbc_types: metadata::xdbc_types()?,
            activity: Arc::default(),
        })
    }

    /// Records statements in `activity`.
    pub fn with_activity(self, activity: Arc<Activity>) -> Self {
        Self { activity, ..self }
    }
}

/// A server's TLS identity: its certificate chain and private key, PEM.
#[derive(Clone)]
pub struct TlsIdentity {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity").finish_non_exhaustive()
    }
}

impl TlsIdentity {
    /// Reads the PEM files; an error names the file that cannot be read.
    pub fn read(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<Self> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))
        };
        Ok(Self {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
        })
    }
}

/// A client's mistake as a gRPC status, with a message of bounded length: an error that quotes
/// a statement (a parse error's token, say) is cut to its start and end ([`errors`]).
fn invalid(message: impl std::fmt::Display) -> Status {
    Status::invalid_argument(bounded_message(&message.to_string()))
}

/// The session a request that names transaction `id` (begun by BeginTransaction) runs in:
/// that transaction's; a request that names none runs in the session, and so commits on its
/// own unless the session's SQL `BEGIN` opened a transaction (the Flight SQL spec has
/// requests without a transaction id auto-commit).
fn in_transaction(
    session: &Arc<ClientSession>,
    id: Option<&bytes::Bytes>,
) -> Result<Arc<ClientSession>, Status> {
    let id = match id {
        Some(id) => Some(transaction_id(id)?),
        None => None,
    };
    session.in_transaction(id).map_err(status)
}

/// A transaction id as BeginTransaction handed it out.
fn transaction_id(id: &[u8]) -> Result<u64, Status> {
    let id = <[u8; 8]>::try_from(id).map_err(|_| invalid("malformed transaction id"))?;
    Ok(u64::from_be_bytes(id))
}

/// An error of the session layer (a SQL error among them) as a gRPC status with a message of
/// bounded length: the user's mistakes are InvalidArgument, the rest say what kind of failure
/// it was.
pub fn status(e: impl Into<ServerError>) -> Status {
    let e = match e.into() {
        ServerError::Sql(e) => e,
        ServerError::Unauthenticated(m) => return Status::unauthenticated(bounded_message(&m)),
        ServerError::NotFound(m) => return Status::not_found(bounded_message(&m)),
        ServerError::TooLarge(m) => return Status::invalid_argument(bounded_message(&m)),
        ServerError::TooMany(m) => return Status::resource_exhausted(bounded_message(&m)),
    };
    let code = match &e {
        SqlError::NotSupported(_) => tonic::Code::Unimplemented,
        SqlError::PermissionDenied(_) => tonic::Code::PermissionDenied,
        SqlError::Cancelled(_) => tonic::Code::Cancelled,
        // Retryable: the transaction met a concurrent one.
        SqlError::Conflict(_) => tonic::Code::Aborted,
        // A limit of one statement: its memory, its statement_timeout.
        SqlError::Exhausted(_) => tonic::Code::ResourceExhausted,
        // Retryable later: the server is busy, or a server it needs is unreachable.
        SqlError::Engine(
            nyala_engine::EngineError::Busy(_)
            | nyala_engine::EngineError::Unavailable(_)
            | nyala_engine::EngineError::OutcomeUnknown(_),
        ) => tonic::Code::Unavailable,
        // Everything else a statement can fail with is about the statement or the data it
        // touches (parse, planning, types, duplicate keys): the client's to fix.
        _ => tonic::Code::InvalidArgument,
    };
    Status::new(code, bounded_message(&e.to_string()))
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(bounded_message(&e.to_string()))
}

fn flight_info(
    schema: &Schema,
    endpoints: Vec<FlightEndpoint>,
    descriptor: FlightDescriptor,
) -> Result<FlightInfo, Status> {
    let mut info = FlightInfo::new()
        .try_with_schema(schema)
        .map_err(internal)?
        .with_descriptor(descriptor);
    for endpoint in endpoints {
        info = info.with_endpoint(endpoint);
    }
    Ok(info)
}

/// FlightInfo whose one ticket is the command itself (catalog metadata requests).
fn command_info(
    schema: &Schema,
    command: impl ProstMessageExt,
    descriptor: FlightDescriptor,
) -> Result<Response<FlightInfo>, Status> {
    let endpoint = FlightEndpoint::new().with_ticket(Ticket::new(command.as_any().encode_to_vec()));
    Ok(Response::new(flight_info(
        schema,
        vec![endpoint],
        descriptor,
    )?))
}

fn batch_stream(
    schema: SchemaRef,
    batches: impl Stream<Item = Result<RecordBatch, ServerError>> + Send + 'static,
) -> DoGetStream {
    let batches = batches.map_err(|e| FlightError::Tonic(Box::new(status(e))));
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(batches)
        .map_err(|e| match e {
            FlightError::Tonic(status) => *status,
            e => invalid(e),
        });
    Box::pin(stream)
}

fn one_batch(batch: RecordBatch) -> Response<DoGetStream> {
    Response::new(batch_stream(
        batch.schema(),
        futures::stream::iter([Ok::<_, ServerError>(batch)]),
    ))
}

fn count_batch(count: u64) -> Result<RecordBatch, Status> {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]));
    RecordBatch::try_new(schema, vec![Arc::new(UInt64Array::from(vec![count]))]).map_err(internal)
}

/// The parameter schema sent to clients. Timestamp parameters are declared in milliseconds:
/// the Flight SQL JDBC driver writes epoch milliseconds into whatever timestamp vector the
/// server declares (apache/arrow-java#838), so any other unit would store wrong instants.
/// Clients that send their own types lose nothing: bound values are cast to the statement's
/// types whatever unit they arrive in.
fn advertised_parameters(parameters: &Schema) -> Schema {
    let fields = parameters
        .fields()
        .iter()
        .map(|field| match field.data_type() {
            DataType::Timestamp(_, tz) => field
                .as_ref()
                .clone()
                .with_data_type(DataType::Timestamp(TimeUnit::Millisecond, tz.clone())),
            _ => field.as_ref().clone(),
        });
    Schema::new(fields.collect::<Vec<_>>())
}

/// Reads the parameter rows uploaded with a DoPut: one batch whose rows are the parameter rows.
async fn read_params(
    request: Request<PeekableFlightDataStream>,
) -> Result<Option<RecordBatch>, Status> {
    tickets::read_params(Upload::new(request.into_inner())).await
}

impl NyalaFlightService {
    /// GetFlightInfo for `statement` with optional parameter rows. Queries are planned now
    /// and kept in the session until their endpoints are fetched: one per tablet for plain
    /// scans, else one. DDL and DML run now (clients such as ADBC never fetch the result of a
    /// statement they consider an update); their ticket carries the count.
    async fn info_for(
        &self,
        session: &ClientSession,
        statement: &PreparedStatement,
        params: Option<&RecordBatch>,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        // Clients that read only the first endpoint (flightsql-dbapi, hence SQLAlchemy) ask for
        // a single one with this header.
        let per_tablet = request
            .metadata()
            .get(SINGLE_ENDPOINT_HEADER)
            .is_none_or(|v| v != "true");
        let descriptor = request.into_inner();
        let rows = tickets::param_rows(params)?;
        let info = statement.info();
        let mut ticket = QueryTicket {
            sql: statement.sql().to_string(),
            session: session.id().to_string(),
            transaction: session.transaction(),
            ..Default::default()
        };
        if info.kind != StatementKind::Query {
            let count = session.run_update(&self.activity, statement, &rows).await;
            ticket.count = Some(count.map_err(status)?);
            ticket.ddl = info.kind == StatementKind::Ddl;
            let endpoint = self.endpoint(&ticket, false);
            return Ok(Response::new(flight_info(
                &info.schema,
                vec![endpoint],
                descriptor,
            )?));
        }
        let mut plans = Vec::with_capacity(rows.len());
        for row in &rows {
            plans.push(
                session
                    .sql()
                    .plan_prepared(statement, row)
                    .await
                    .map_err(status)?,
            );
        }
        let Some(first) = plans.first() else {
            return Err(invalid("no parameter rows were bound"));
        };
        let schema = first.schema();
        let partitions = match plans.len() {
            1 if per_tablet => first.tablet_partitions().filter(|n| *n > 1),
            _ => None,
        };
        // Every endpoint reads at one snapshot, taken now.
        let snapshot = match partitions {
            Some(_) => first.snapshot().await.map_err(status)?,
            None => None,
        };
        ticket.params = tickets::encode_params(params)?;
        ticket.id = session.add_query(plans, partitions.unwrap_or(1));
        let endpoints = match partitions {
            Some(n) => (0..n as u32)
                .map(|i| {
                    let ticket = QueryTicket {
                        partition: Some(i),
                        partitions: n as u32,
                        snapshot,
                        ..ticket.clone()
                    };
                    self.endpoint(&ticket, true)
                })
                .collect(),
            None => vec![self.endpoint(&ticket, false)],
        };
        Ok(Response::new(flight_info(&schema, endpoints, descriptor)?))
    }

    fn endpoint(&self, ticket: &QueryTicket, located: bool) -> FlightEndpoint {
        let ticket = TicketStatementQuery {
            statement_handle: ticket.encode_to_vec().into(),
        };
        let endpoint =
            FlightEndpoint::new().with_ticket(Ticket::new(ticket.as_any().encode_to_vec()));
        match (&self.location, located) {
            (Some(location), true) => endpoint.with_location(location.clone()),
            _ => endpoint,
        }
    }

    /// DoGet of a ticket from [`Self::info_for`]: the plans its session kept, or, when they
    /// are gone, the statement planned again in the caller's session.
    async fn stream_ticket(
        &self,
        caller: &Arc<ClientSession>,
        handle: &[u8],
    ) -> Result<Response<DoGetStream>, Status> {
        let ticket = QueryTicket::decode_handle(handle)?;
        match ticket.count {
            Some(_) if ticket.ddl => {
                let nothing = futures::stream::empty();
                return Ok(Response::new(batch_stream(
                    Arc::new(Schema::empty()),
                    nothing,
                )));
            }
            Some(count) => return Ok(one_batch(count_batch(count)?)),
            None => {}
        }
        let owner = self.sessions.get(&ticket.session);
        let pending = match &owner {
            Some(owner) => owner.fetch_query(ticket.id).map_err(status)?,
            None => None,
        };
        let (plans, cancelled) = match pending {
            Some(query) => {
                let cancelled = query.cancelled();
                (Plans::Kept(query), cancelled)
            }
            None => {
                nyala_server::limits::statement_text(&ticket.sql).map_err(status)?;
                let params = tickets::decode_params(&ticket.params).await?;
                let mut plans = Vec::new();
                // A transaction is its session's: the one that planned the query.
                let caller = match (&owner, ticket.transaction) {
                    (Some(owner), Some(_)) => owner.in_transaction(ticket.transaction),
                    _ => caller.in_transaction(ticket.transaction),
                };
                let caller = caller.map_err(status)?;
                for row in tickets::param_rows(params.as_ref())? {
                    plans.push(
                        caller
                            .sql()
                            .plan_with_params(&ticket.sql, &row)
                            .await
                            .map_err(status)?,
                    );
                }
                let never = tokio::sync::watch::channel(false).1;
                (Plans::Planned(plans), never)
            }
        };
        let Some(first) = plans.get().first() else {
            return Err(invalid("no parameter rows were bound"));
        };
        let schema = first.schema();
        // Each endpoint of a query read tablet by tablet is fetched (and shown) on its own.
        let text = match ticket.partition {
            Some(i) => format!("[tablet {} of {}] {}", i + 1, ticket.partitions, ticket.sql),
            None => ticket.sql.clone(),
        };
        let tracked = caller.track(&self.activity, &text, StatementKind::Query);
        tracked.planned(first);
        // The first plan starts now, so its errors are the call's; the plans of later
        // parameter rows start one after another as the stream reaches them (each holds a turn
        // among running queries while it runs).
        let first = run_ticket(first, &ticket)
            .await
            .inspect_err(|e| tracked.failed(e))
            .map_err(status)?;
        let plans = Arc::new(plans);
        let later = {
            let plans = plans.clone();
            futures::stream::iter(1..plans.get().len())
                .then(move |i| {
                    let (plans, ticket) = (plans.clone(), ticket.clone());
                    async move { run_ticket(&plans.get()[i], &ticket).await }
                })
                .map(|started| match started {
                    Ok(stream) => stream,
                    Err(e) => Box::pin(futures::stream::once(async move { Err(e) })),
                })
                .flatten()
        };
        // The stream keeps the query (and so its cancellation) alive until it ends.
        let batches = first.chain(later).map(move |batch| {
            let _ = &plans;
            batch
        });
        let batches = nyala_server::run::cancellable(Box::pin(batches), cancelled);
        // The stream carries the statement: it is finished when the stream ends or is dropped.
        Ok(Response::new(batch_stream(schema, tracked.follow(batches))))
    }

    /// A statement sent as an update (DoPut): DDL or DML, run once per parameter row.
    async fn update(
        &self,
        session: &ClientSession,
        statement: &PreparedStatement,
        params: Option<&RecordBatch>,
    ) -> Result<i64, Status> {
        if statement.info().kind == StatementKind::Query {
            return Err(invalid(
                "a query cannot be executed as an update; use a query command",
            ));
        }
        let rows = tickets::param_rows(params)?;
        let count = session.run_update(&self.activity, statement, &rows).await;
        Ok(count.map_err(status)? as i64)
    }

    /// Cancels the queries of `info`'s endpoints; whether any was found.
    fn cancel(&self, info: &FlightInfo) -> bool {
        let mut found = false;
        for endpoint in &info.endpoint {
            let Some(ticket) = &endpoint.ticket else {
                continue;
            };
            let Ok(any) = Any::decode(ticket.ticket.clone()) else {
                continue;
            };
            let Ok(Some(statement)) = any.unpack::<TicketStatementQuery>() else {
                continue;
            };
            if let Ok(query) = QueryTicket::decode_handle(&statement.statement_handle) {
                found |= self.sessions.cancel(&query.session, query.id);
            }
        }
        found
    }
}

/// The plans a DoGet runs: those its session kept since GetFlightInfo, or planned anew.
enum Plans {
    Kept(Arc<nyala_server::session::PendingQuery>),
    Planned(Vec<PlannedStatement>),
}

impl Plans {
    fn get(&self) -> &[PlannedStatement] {
        match self {
            Plans::Kept(query) => &query.plans,
            Plans::Planned(plans) => plans,
        }
    }
}

/// The stream of one planned query for `ticket`: its partition, or all of it.
async fn run_ticket(
    planned: &PlannedStatement,
    ticket: &QueryTicket,
) -> Result<BatchStream, ServerError> {
    let stream = match ticket.partition {
        Some(partition) if planned.tablet_partitions() == Some(ticket.partitions as usize) => {
            planned
                .execute_partition(partition as usize, ticket.snapshot)
                .await
        }
        Some(_) => Err(SqlError::Invalid(
            "the table's tablets changed since this query was planned; run it again".into(),
        )),
        None => planned.execute_query().await,
    }?;
    Ok(Box::pin(
        stream.map_err(|e| ServerError::from(SqlError::from(e))),
    ))
}

#[tonic::async_trait]
impl FlightSqlService for NyalaFlightService {
    type FlightService = NyalaFlightService;

    async fn do_handshake(
        &self,
        request: Request<Streaming<arrow_flight::HandshakeRequest>>,
    ) -> Result<
        Response<
            Pin<Box<dyn Stream<Item = Result<arrow_flight::HandshakeResponse, Status>> + Send>>,
        >,
        Status,
    > {
        let session = session_of(&request)?;
        let token = match caller_of(&request) {
            Caller::Anyone => None,
            Caller::Token(token) => Some(token),
            Caller::Password(_) => Some(self.sessions.issue_token(&session)),
        };
        let payload = token.clone().unwrap_or_default().into_bytes().into();
        let reply = arrow_flight::HandshakeResponse {
            protocol_version: 0,
            payload,
        };
        let mut response: Response<Pin<Box<dyn Stream<Item = _> + Send>>> =
            Response::new(Box::pin(futures::stream::iter([Ok(reply)])));
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse().map_err(internal)?;
            response.metadata_mut().insert("authorization", value);
        }
        Ok(response)
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = in_transaction(&session_of(&request)?, query.transaction_id.as_ref())?;
        let statement = session.statement(&query.query).await.map_err(status)?;
        self.info_for(&session, &statement, None, request).await
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let session = session_of(&request)?;
        self.stream_ticket(&session, &ticket.statement_handle).await
    }

    async fn do_put_statement_update(
        &self,
        command: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let session = in_transaction(&session_of(&request)?, command.transaction_id.as_ref())?;
        let statement = session.statement(&command.query).await.map_err(status)?;
        self.update(&session, &statement, None).await
    }

    async fn do_put_statement_ingest(
        &self,
        command: CommandStatementIngest,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        if command.temporary {
            return Err(Status::unimplemented("temporary tables are not supported"));
        }

        if command
            .catalog
            .as_deref()
            .is_some_and(|c| c != CATALOG_NAME)
            || command.schema.as_deref().is_some_and(|s| s != SCHEMA_NAME)
        {
            return Err(invalid(format!(
                "tables live in catalog '{CATALOG_NAME}', schema '{SCHEMA_NAME}'"
            )));
        }
        let options = command.table_definition_options.unwrap_or_default();
        let if_not_exist = TableNotExistOption::try_from(options.if_not_exist)
            .unwrap_or(TableNotExistOption::Unspecified);
        let if_exists = TableExistsOption::try_from(options.if_exists)
            .unwrap_or(TableExistsOption::Unspecified);
        let mode = match (if_not_exist, if_exists) {
            (
                TableNotExistOption::Create,
                TableExistsOption::Fail | TableExistsOption::Unspecified,
            ) => IngestMode::Create,
            (TableNotExistOption::Create, TableExistsOption::Append) => IngestMode::CreateOrAppend,
            (_, TableExistsOption::Replace) => IngestMode::Replace,
            (
                TableNotExistOption::Fail | TableNotExistOption::Unspecified,
                TableExistsOption::Append | TableExistsOption::Unspecified,
            ) => IngestMode::Append,
            (
                TableNotExistOption::Fail | TableNotExistOption::Unspecified,
                TableExistsOption::Fail,
            ) => {
                return Err(Status::invalid_argument(
                    "ingest options fail both when the table exists and when it does not",
                ))
            }
        };
        let option = |name: &str| {
            command
                .options
                .get(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let primary_key = option("primary_key")
            .map(|v| v.split(',').map(|c| c.trim().to_string()).collect())
            .unwrap_or_default();
        let buckets = match option("buckets") {
            Some(b) => b
                .parse()
                .map_err(|_| invalid(format!("option buckets: '{b}' is not a number")))?,
            None => 1,
        };
        let target = IngestTarget {
            table: command.table,
            mode,
            primary_key,
            buckets,
        };
        let session = session_of(&request)?;
        // ADBC (1.13) names the transaction in its statements but not in bulk ingest: an
        // ingest that names none runs in the session's one transaction begun by
        // BeginTransaction, if it has one, so that commit() and rollback() cover it.
        let session = match &command.transaction_id {
            Some(id) => session.in_transaction(Some(transaction_id(id)?)),
            None => session.in_transaction(session.sole_named_transaction()),
        };
        let session = session.map_err(status)?;
        let mut upload = Upload::new(request.into_inner());
        let first = upload.try_next().await?;
        let schema = match (upload.schema(), &first) {
            (Some(schema), _) => schema.clone(),
            (None, Some(batch)) => batch.schema(),
            (None, None) => return Err(Status::invalid_argument("ingest needs at least a schema")),
        };
        let batches = futures::stream::iter(first.map(Ok))
            .chain(upload)
            .map_err(|e| SqlError::Invalid(e.message().to_string()));
        let tracked = self.activity.start(
            &format!("INGEST INTO {}", target.table),
            &session.user_name(),
            "ingest",
        );
        let ingest = async {
            session
                .sql()
                .ingest(&target, schema, batches)
                .await
                .map_err(ServerError::from)
        };
        let loaded = tracked.run(ingest, |loaded| *loaded).await;
        let loaded = loaded.map_err(status)?;
        Ok(loaded as i64)
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let session = in_transaction(&session_of(&request)?, query.transaction_id.as_ref())?;
        let statement = session.prepare(&query.query).await.map_err(status)?;
        let info = statement.info().clone();
        let ipc = |schema: &Schema| -> Result<_, Status> {
            let message: IpcMessage = SchemaAsIpc::new(schema, &Default::default())
                .try_into()
                .map_err(internal)?;
            Ok(message.0)
        };
        // Clients (the JDBC driver among them) treat a statement with an empty dataset schema
        // as an update and run it with DoPut; DDL and DML are such statements.
        let dataset = if info.kind == StatementKind::Query {
            info.schema
        } else {
            Arc::new(Schema::empty())
        };
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: session.add_prepared(statement).map_err(status)?.into(),
            dataset_schema: ipc(&dataset)?,
            parameter_schema: ipc(&advertised_parameters(&info.parameters))?,
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<(), Status> {
        session_of(&request)?.close_prepared(&query.prepared_statement_handle);
        Ok(())
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let session = session_of(&request)?;
        let params = read_params(request).await?;
        session
            .bind(&query.prepared_statement_handle, params)
            .map_err(status)?;
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(query.prepared_statement_handle),
        })
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = session_of(&request)?;
        let prepared = session
            .prepared(&query.prepared_statement_handle)
            .map_err(status)?;
        let session = session.for_prepared(&prepared).map_err(status)?;
        self.info_for(
            &session,
            &prepared.statement,
            prepared.params.as_ref(),
            request,
        )
        .await
    }

    async fn do_get_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        // Our FlightInfo hands out statement tickets; a client that builds its own ticket from
        // the handle gets the statement run with its bound parameters.
        let session = session_of(&request)?;
        let prepared = session
            .prepared(&query.prepared_statement_handle)
            .map_err(status)?;
        let session = session.for_prepared(&prepared).map_err(status)?;
        let ticket = QueryTicket {
            sql: prepared.statement.sql().to_string(),
            params: tickets::encode_params(prepared.params.as_ref())?,
            transaction: session.transaction(),
            ..Default::default()
        };
        self.stream_ticket(&session, &ticket.encode_to_vec()).await
    }

    async fn do_put_prepared_statement_update(
        &self,
        query: CommandPreparedStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let session = session_of(&request)?;
        let prepared = session
            .prepared(&query.prepared_statement_handle)
            .map_err(status)?;
        let session = session.for_prepared(&prepared).map_err(status)?;
        let uploaded = read_params(request).await?;
        self.update(
            &session,
            &prepared.statement,
            uploaded.as_ref().or(prepared.params.as_ref()),
        )
        .await
    }

    async fn do_action_begin_transaction(
        &self,
        _query: ActionBeginTransactionRequest,
        request: Request<Action>,
    ) -> Result<ActionBeginTransactionResult, Status> {
        let session = session_of(&request)?;
        let id = session.begin_named().map_err(status)?;
        Ok(ActionBeginTransactionResult {
            transaction_id: id.to_be_bytes().to_vec().into(),
        })
    }

    async fn do_action_end_transaction(
        &self,
        query: ActionEndTransactionRequest,
        request: Request<Action>,
    ) -> Result<(), Status> {
        let session = session_of(&request)?;
        let action = EndTransaction::try_from(query.action)
            .ok()
            .filter(|action| *action != EndTransaction::Unspecified)
            .ok_or_else(|| invalid("EndTransaction needs COMMIT or ROLLBACK"))?;
        let id = transaction_id(&query.transaction_id)?;
        let ended = session.end_named(id).map_err(status)?;
        match action {
            EndTransaction::Commit => ended.commit().await.map_err(status),
            _ => {
                ended.rollback().await;
                Ok(())
            }
        }
    }

    async fn do_action_cancel_query(
        &self,
        query: ActionCancelQueryRequest,
        _request: Request<Action>,
    ) -> Result<ActionCancelQueryResult, Status> {
        let info = FlightInfo::decode(query.info)
            .map_err(|_| Status::invalid_argument("malformed FlightInfo"))?;
        if self.cancel(&info) {
            // CancelResult::CANCEL_RESULT_CANCELLED (the enum is not re-exported by arrow-flight).
            Ok(ActionCancelQueryResult { result: 1 })
        } else {
            Err(Status::not_found("no such query"))
        }
    }

    async fn do_action_fallback(
        &self,
        request: Request<Action>,
    ) -> Result<
        Response<<Self as arrow_flight::flight_service_server::FlightService>::DoActionStream>,
        Status,
    > {
        let session = session_of(&request)?;
        let action = request.into_inner();
        let reply = |body: Vec<u8>| -> Response<
            <Self as arrow_flight::flight_service_server::FlightService>::DoActionStream,
        > {
            let result = arrow_flight::Result { body: body.into() };
            Response::new(Box::pin(futures::stream::iter([Ok(result)])))
        };
        match action.r#type.as_str() {
            session_options::SET_SESSION_OPTIONS => {
                return Ok(reply(
                    session_options::set_options(&session, &action.body).await?,
                ))
            }
            session_options::GET_SESSION_OPTIONS => {
                return Ok(reply(session_options::get_options(&session)))
            }
            session_options::CLOSE_SESSION => {
                let mut response = reply(session_options::close(&self.sessions, &session));
                let cookie = session::session_cookie(session.id(), true);
                response
                    .metadata_mut()
                    .insert("set-cookie", cookie.parse().map_err(internal)?);
                return Ok(response);
            }
            "CancelFlightInfo" => {}
            other => return Err(invalid(format!("unknown action {other}"))),
        }
        let request = CancelFlightInfoRequest::decode(action.body)
            .map_err(|_| Status::invalid_argument("malformed CancelFlightInfoRequest"))?;
        let info = request.info.ok_or_else(|| {
            Status::invalid_argument("CancelFlightInfoRequest without FlightInfo")
        })?;
        let status = if self.cancel(&info) {
            CancelStatus::Cancelled
        } else {
            CancelStatus::NotCancellable
        };
        let result = CancelFlightInfoResult {
            status: status as i32,
        };
        Ok(reply(result.encode_to_vec()))
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(&query.into_builder().schema(), query, request.into_inner())
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append(CATALOG_NAME);
        Ok(one_batch(builder.build().map_err(internal)?))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(
            &query.clone().into_builder().schema(),
            query,
            request.into_inner(),
        )
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append(CATALOG_NAME, SCHEMA_NAME);
        Ok(one_batch(builder.build().map_err(internal)?))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(
            &query.clone().into_builder().schema(),
            query,
            request.into_inner(),
        )
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let session = session_of(&request)?;
        let views = self.db.views().await;
        let sees = |name: &str| session.sql().may_see(name);
        Ok(one_batch(metadata::tables(&self.db, &views, query, sees)?))
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(&query.into_builder().schema(), query, request.into_inner())
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let mut builder = query.into_builder();
        builder.append("TABLE");
        builder.append("VIEW");
        Ok(one_batch(builder.build().map_err(internal)?))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(
            &query.clone().into_builder(&self.sql_info).schema(),
            query,
            request.into_inner(),
        )
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(one_batch(
            query
                .into_builder(&self.sql_info)
                .build()
                .map_err(internal)?,
        ))
    }

    async fn get_flight_info_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(
            &metadata::primary_keys(&self.db, &query, |_| false)?.schema(),
            query,
            request.into_inner(),
        )
    }

    async fn do_get_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let session = session_of(&request)?;
        let sees = |name: &str| session.sql().may_see(name);
        Ok(one_batch(metadata::primary_keys(&self.db, &query, sees)?))
    }

    async fn get_flight_info_exported_keys(
        &self,
        query: CommandGetExportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(
            &metadata::foreign_keys_schema(),
            query,
            request.into_inner(),
        )
    }

    async fn do_get_exported_keys(
        &self,
        _query: CommandGetExportedKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(one_batch(RecordBatch::new_empty(
            metadata::foreign_keys_schema(),
        )))
    }

    async fn get_flight_info_imported_keys(
        &self,
        query: CommandGetImportedKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(
            &metadata::foreign_keys_schema(),
            query,
            request.into_inner(),
        )
    }

    async fn do_get_imported_keys(
        &self,
        _query: CommandGetImportedKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(one_batch(RecordBatch::new_empty(
            metadata::foreign_keys_schema(),
        )))
    }

    async fn get_flight_info_cross_reference(
        &self,
        query: CommandGetCrossReference,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(
            &metadata::foreign_keys_schema(),
            query,
            request.into_inner(),
        )
    }

    async fn do_get_cross_reference(
        &self,
        _query: CommandGetCrossReference,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(one_batch(RecordBatch::new_empty(
            metadata::foreign_keys_schema(),
        )))
    }

    async fn get_flight_info_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(
            &query.into_builder(&self.xdbc_types).schema(),
            query,
            request.into_inner(),
        )
    }

    async fn do_get_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        Ok(one_batch(
            query
                .into_builder(&self.xdbc_types)
                .build()
                .map_err(internal)?,
        ))
    }

    async fn do_get_fallback(
        &self,
        _request: Request<Ticket>,
        message: Any,
    ) -> Result<Response<DoGetStream>, Status> {
        Err(invalid(format!("unknown ticket type {}", message.type_url)))
    }

    async fn list_custom_actions(&self) -> Option<Vec<Result<ActionType, Status>>> {
        let action = |name: &str, description: &str| {
            Ok(ActionType {
                r#type: name.into(),
                description: description.into(),
            })
        };
        Some(vec![
            action("CancelFlightInfo", "Cancel a query by its FlightInfo"),
            action(
                session_options::SET_SESSION_OPTIONS,
                "Set session options (SQL settings)",
            ),
            action(
                session_options::GET_SESSION_OPTIONS,
                "The session's options (SQL settings)",
            ),
            action(session_options::CLOSE_SESSION, "End the session"),
        ])
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// arrow-flight answers a Flight SQL command, ticket or action whose protobuf message does not
/// decode with an Internal error quoting a `ParseError`; the mistake is the client's, so the
/// answer becomes an InvalidArgument error saying what did not decode.
fn malformed_requests_are_invalid<B>(mut response: http::Response<B>) -> http::Response<B> {
    let Some(status) = Status::from_header_map(response.headers()) else {
        return response;
    };
    let problem = match status.message().strip_prefix("ParseError(\"") {
        Some(problem) if status.code() == tonic::Code::Internal => problem.trim_end_matches("\")"),
        _ => return response,
    };
    // Replacing the status headers keeps the others (a new session's cookie).
    let _ = invalid(format!("malformed request: {problem}")).add_header(response.headers_mut());
    response
}

/// A panic while a request is handled (a bug) becomes an Internal status naming it, instead of
/// a stream reset without a word; tokio keeps the server running either way.
fn catch_panics<F, E>(
    handled: F,
) -> impl std::future::Future<Output = Result<http::Response<tonic::body::Body>, E>>
where
    F: std::future::Future<Output = Result<http::Response<tonic::body::Body>, E>>,
{
    std::panic::AssertUnwindSafe(handled)
        .catch_unwind()
        .map(|handled| {
            handled.unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(panic = %what, "a Flight SQL request handler panicked");
                let message = format!(
                    "the server failed to handle this request (a bug; please report it): {}",
                    excerpt(&what, 200)
                );
                Ok(Status::internal(message).into_http())
            })
        })
}

/// Serves Flight SQL for `db` on `listener`, and the PostgreSQL protocol on `pg` if given, over
/// one session layer, until `shutdown` completes.
pub async fn serve(
    db: Arc<Database>,
    listener: tokio::net::TcpListener,
    pg: Option<tokio::net::TcpListener>,
    options: ServerOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let idle_timeout = options
        .session_idle_timeout
        .unwrap_or(DEFAULT_SESSION_IDLE_TIMEOUT);
    let sessions = Sessions::new(db.clone(), idle_timeout);
    sessions.spawn_expiry();
    let activity = options.activity.unwrap_or_default();
    activity.watch_sessions(&sessions);
    let auth = Auth::new(db.client());
    let shutdown = shutdown.boxed().shared();
    let postgres = pg.map(|pg| {
        let tls = options.tls.as_ref().map(|tls| nyala_pg::TlsIdentity {
            cert_pem: tls.cert_pem.clone(),
            key_pem: tls.key_pem.clone(),
        });
        let shared = auth.shared().clone();
        let serving = nyala_pg::serve(
            sessions.clone(),
            activity.clone(),
            shared,
            pg,
            tls,
            shutdown.clone(),
        );
        tokio::spawn(serving)
    });
    let service =
        NyalaFlightService::new(db, sessions.clone(), options.location)?.with_activity(activity);
    let server =
        FlightServiceServer::new(service).max_decoding_message_size(limits::MAX_MESSAGE_BYTES);
    let layer = SessionLayer {
        sessions: sessions.clone(),
        auth,
    };
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = options.tls {
        let identity = tonic::transport::Identity::from_pem(tls.cert_pem, tls.key_pem);
        builder =
            builder.tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))?;
    }
    // Outermost, so that every status leaving the server is bounded, whoever made it.
    builder
        .layer(tower::util::MapResponseLayer::new(errors::bound_statuses))
        .layer(layer)
        .layer(tower::util::MapResponseLayer::new(
            malformed_requests_are_invalid::<tonic::body::Body>,
        ))
        .layer(tower::util::MapFutureLayer::new(catch_panics))
        .layer(nyala_engine::metrics::RpcMetricsLayer)
        .add_service(server)
        .serve_with_incoming_shutdown(connection::incoming(listener, &sessions), shutdown)
        .await?;
    if let Some(postgres) = postgres {
        postgres.await??;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_handler_answers_internal() {
        let handled = async {
            if excerpt("x", 10) == "x" {
                panic!("index out of bounds");
            }
            Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::empty()))
        };
        let Ok(response) = catch_panics(handled).await;
        let status = Status::from_header_map(response.headers()).expect("a gRPC status");
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(status.message().contains("index out of bounds"), "{status}");
    }
}
