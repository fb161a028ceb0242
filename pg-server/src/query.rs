//! Statements from PostgreSQL clients, in the simple protocol (a `Query` message with one or
//! more statements as text) and the extended one (Parse, Bind, Describe, Execute, Sync, which
//! clients pipeline in one round trip). Both go through the session layer as Flight SQL's do:
//! the text is prepared once per session and kept (so a statement sent again is only bound and
//! run, and a lookup by the whole primary key takes the key-lookup path), queries stream their
//! rows through `arrow-pg`'s encoders, and portals with a row limit (a fetch size) are
//! suspended and resumed by pgwire.

use std::fmt::Debug;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use arrow_pg::datatypes::df::deserialize_parameters;
use arrow_pg::datatypes::{encode_recordbatch, into_pg_type};
use async_trait::async_trait;
use datafusion::common::{ParamValues, ScalarValue};
use futures::{Sink, SinkExt, StreamExt};
use nyala_server::{ClientSession, ServerError};
use nyala_sql::{PreparedStatement, StatementKind};
use pgwire::api::copy::CopyHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::{Entry, PortalStore};
use pgwire::api::{ClientInfo, ClientPortalStore, Type, DEFAULT_NAME};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};
use pgwire::messages::extendedquery::{Bind, BindComplete, Execute};
use pgwire::messages::PgWireBackendMessage;
use pgwire::types::format::FormatOptions;

use crate::copy::{CopyIn, CopySpec, Direction};
use crate::corked::Corked;
use crate::errors::{error_info, pg_error};
use crate::results::{encoded_as, pg_fields, sent_batch, LastFields};
use crate::settings::{self, ParameterStatement};
use crate::{Connection, SessionCell, Shared};

/// A statement of a PostgreSQL client, parsed: one the session layer runs, or one about the
/// connection's PostgreSQL parameters ([`settings`]).
#[derive(Clone)]
pub(crate) enum PgStatement {
    Sql(Box<PreparedStatement>),
    Parameter(ParameterStatement),
    Copy(CopySpec),
}

/// Whether `name` is one of Nyala's settings (the session's), not a PostgreSQL parameter.
fn is_nyala_setting(name: &str) -> bool {
    name.starts_with("nyala.") || name.starts_with("datafusion.") || name == "statement_timeout"
}

/// The statement handlers of one connection.
pub(crate) struct Queries {
    shared: Arc<Shared>,
    session: SessionCell,
    copy: CopyCell,
    fields: LastFields,
}

impl Queries {
    pub(crate) fn new(connection: &Connection) -> Self {
        Self {
            shared: connection.shared.clone(),
            session: connection.session.clone(),
            copy: connection.copy.clone(),
            fields: LastFields::default(),
        }
    }

    fn session(&self) -> PgWireResult<Arc<ClientSession>> {
        self.session.get().cloned().ok_or_else(|| {
            pg_error(ServerError::Unauthenticated(
                "the connection has not authenticated".into(),
            ))
        })
    }

    /// `sql` parsed and, unless it is about a PostgreSQL parameter, prepared (or found
    /// prepared) in `session`; statements that read PostgreSQL's catalog are rewritten first.
    async fn prepare(
        &self,
        session: &ClientSession,
        sql: &str,
    ) -> Result<PgStatement, ServerError> {
        if let Some(parameter) = settings::recognise(sql, is_nyala_setting)? {
            return Ok(PgStatement::Parameter(parameter));
        }
        if let Some(copy) = crate::copy::recognise(sql)? {
            return Ok(PgStatement::Copy(copy));
        }
        let rewritten = crate::catalog::rewritten(sql);
        let sql = rewritten.as_deref().unwrap_or(sql);
        Ok(PgStatement::Sql(Box::new(session.statement(sql).await?)))
    }

    /// Runs `statement` with `params` bound: a query's rows in `format`, or what it changed.
    async fn execute<C: ClientInfo>(
        &self,
        client: &mut C,
        session: &ClientSession,
        statement: &PgStatement,
        params: Vec<ScalarValue>,
        format: &Format,
    ) -> Result<Response, ServerError> {
        let options = format_options(client);
        let statement = match statement {
            PgStatement::Sql(statement) => statement,
            PgStatement::Parameter(parameter) => {
                return parameter_response(client, parameter, format, options)
            }
            PgStatement::Copy(copy) => return self.copy(session, copy).await,
        };
        let kind = statement.info().kind;
        if kind == StatementKind::Query {
            let (schema, batches) = session
                .run_query(&self.shared.activity, statement, &params)
                .await?;
            let (fields, encoded) = self.fields.describe(&schema, format, options)?;
            let rows = batches
                .map(move |batch| {
                    let batch = batch.and_then(|b| sent_batch(b).map_err(ServerError::from));
                    let rows: Box<dyn Iterator<Item = PgWireResult<_>> + Send + Sync> = match batch
                    {
                        Ok(batch) => encode_recordbatch(encoded.clone(), batch),
                        Err(e) => Box::new(std::iter::once(Err(pg_error(e)))),
                    };
                    futures::stream::iter(rows)
                })
                .flatten();
            return Ok(Response::Query(QueryResponse::new(fields, rows)));
        }
        let count = session
            .run_update(&self.shared.activity, statement, &[params])
            .await?;
        Ok(completion(statement.sql(), kind, count))
    }
}

impl Queries {
    /// Starts a COPY: asks the client for the rows of a COPY FROM STDIN (the [`Copies`]
    /// handler takes them), or sends the rows of a COPY TO STDOUT.
    async fn copy(
        &self,
        session: &ClientSession,
        spec: &CopySpec,
    ) -> Result<Response, ServerError> {
        match &spec.direction {
            Direction::In { table, columns } => {
                let session = self.session().map_err(|_| {
                    ServerError::Unauthenticated("the connection has not authenticated".into())
                })?;
                let copy = CopyIn::start(spec.clone(), session, table.clone(), columns.clone());
                let copy = copy.await?;
                let response = copy.response();
                *self.copy.lock() = Some(copy);
                Ok(Response::CopyIn(response))
            }
            Direction::Out { query } => {
                let statement = session.statement(query).await?;
                if statement.info().kind != StatementKind::Query {
                    return Err(ServerError::invalid("COPY (...) TO takes a query"));
                }
                let (schema, batches) = session
                    .run_query(&self.shared.activity, &statement, &[])
                    .await?;
                let options = Arc::new(FormatOptions::default());
                let fields = Arc::new(pg_fields(&schema, &Format::UnifiedText, options)?);
                let fields = encoded_as(&fields);
                Ok(Response::CopyOut(spec.copy_out(fields, batches)))
            }
        }
    }
}

/// The data of the COPY FROM STDIN in progress on a connection.
pub(crate) type CopyCell = Arc<parking_lot::Mutex<Option<CopyIn>>>;

/// Takes the rows of a COPY FROM STDIN as the client sends them, and loads them when it is done.
pub(crate) struct Copies {
    shared: Arc<Shared>,
    copy: CopyCell,
}

impl Copies {
    pub(crate) fn new(connection: &Connection) -> Self {
        Self {
            shared: connection.shared.clone(),
            copy: connection.copy.clone(),
        }
    }
}

#[async_trait]
impl CopyHandler for Copies {
    async fn on_copy_data<C>(&self, _client: &mut C, data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let Some(copy) = self.copy.lock().as_mut() {
            copy.receive(&data.data);
        }
        Ok(())
    }

    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let copy = self.copy.lock().take();
        let Some(copy) = copy else {
            return Err(pg_error(ServerError::invalid(
                "no COPY FROM STDIN is in progress",
            )));
        };
        let rows = copy.finish(&self.shared.activity).await.map_err(pg_error)?;
        let tag = Tag::new("COPY").with_rows(rows as usize);
        client
            .send(PgWireBackendMessage::CommandComplete(tag.into()))
            .await?;
        Ok(())
    }

    async fn on_copy_fail<C>(&self, _client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.copy.lock().take();
        pg_error(nyala_sql::SqlError::Cancelled(format!(
            "COPY FROM STDIN failed on the client's side: {}; nothing was loaded",
            fail.message
        )))
    }
}

/// What a statement about a PostgreSQL parameter answers (see [`settings`]).
fn parameter_response<C: ClientInfo>(
    client: &mut C,
    parameter: &ParameterStatement,
    format: &Format,
    options: Arc<FormatOptions>,
) -> Result<Response, ServerError> {
    match parameter {
        ParameterStatement::Set { name, value } => {
            client.metadata_mut().insert(name.clone(), value.clone());
            Ok(Response::Execution(Tag::new("SET")))
        }
        ParameterStatement::SetTransaction => Ok(Response::Execution(Tag::new("SET"))),
        ParameterStatement::Show(name) => {
            let value = settings::shown(name, client.metadata().get(name))?;
            let batch = RecordBatch::try_new(
                show_schema(name),
                vec![Arc::new(arrow::array::StringArray::from(vec![value]))],
            )
            .map_err(nyala_sql::SqlError::from)?;
            let fields = Arc::new(pg_fields(&batch.schema(), format, options)?);
            let rows = encode_recordbatch(fields.clone(), batch).collect::<Vec<_>>();
            Ok(Response::Query(QueryResponse::new(
                fields,
                futures::stream::iter(rows),
            )))
        }
    }
}

/// The result of `SHOW name`: one text column named after the parameter.
fn show_schema(name: &str) -> SchemaRef {
    Arc::new(Schema::new(vec![arrow::datatypes::Field::new(
        name,
        DataType::Utf8,
        false,
    )]))
}

/// What a statement that is not a query answers: its command tag with the rows it changed,
/// or the start or end of a transaction.
fn completion(sql: &str, kind: StatementKind, count: u64) -> Response {
    let words = leading_words(sql);
    let first = words.first().map(String::as_str).unwrap_or("");
    let rows = count as usize;
    match first {
        "BEGIN" | "START" => Response::TransactionStart(Tag::new("BEGIN")),
        "COMMIT" | "END" => Response::TransactionEnd(Tag::new("COMMIT")),
        // ROLLBACK TO SAVEPOINT: the transaction goes on.
        "ROLLBACK" if words.get(1).is_some_and(|w| w == "TO") => {
            Response::Execution(Tag::new("ROLLBACK"))
        }
        "ROLLBACK" | "ABORT" => Response::TransactionEnd(Tag::new("ROLLBACK")),
        "INSERT" | "UPSERT" => Response::Execution(Tag::new("INSERT").with_oid(0).with_rows(rows)),
        "UPDATE" | "DELETE" | "MERGE" => Response::Execution(Tag::new(first).with_rows(rows)),
        _ if kind == StatementKind::Dml => Response::Execution(Tag::new(first).with_rows(rows)),
        "CREATE" | "DROP" | "ALTER" if words.len() > 1 => {
            Response::Execution(Tag::new(&format!("{first} {}", words[1])))
        }
        _ => Response::Execution(Tag::new(first)),
    }
}

/// The first two words of a statement, upper case, past comments.
fn leading_words(sql: &str) -> Vec<String> {
    let mut rest = sql.trim_start();
    loop {
        if let Some(after) = rest.strip_prefix("--") {
            rest = after.split_once('\n').map_or("", |(_, r)| r).trim_start();
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.split_once("*/").map_or("", |(_, r)| r).trim_start();
        } else {
            break;
        }
    }
    rest.split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .filter(|w| !w.is_empty())
        .take(2)
        .map(str::to_ascii_uppercase)
        .collect()
}

fn format_options<C: ClientInfo>(client: &C) -> Arc<FormatOptions> {
    Arc::new(FormatOptions::from_client_metadata(client.metadata()))
}

#[async_trait]
impl SimpleQueryHandler for Queries {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let session = self.session()?;
        let error = |e: ServerError| Response::Error(Box::new(error_info(&e)));
        let texts = match nyala_sql::Session::split_statements(query) {
            Ok(texts) => texts,
            Err(e) => return Ok(vec![error(e.into())]),
        };
        let mut responses = Vec::with_capacity(texts.len());
        // As PostgreSQL: the statements after one that fails are not run.
        for text in texts {
            let ran = match self.prepare(&session, &text).await {
                Ok(statement) => {
                    let format = Format::UnifiedText;
                    (self.execute(client, &session, &statement, vec![], &format)).await
                }
                Err(e) => Err(e),
            };
            match ran {
                Ok(response) => responses.push(response),
                Err(e) => {
                    responses.push(error(e));
                    break;
                }
            }
        }
        if responses.is_empty() {
            responses.push(Response::EmptyQuery);
        }
        Ok(responses)
    }
}

#[async_trait]
impl QueryParser for Queries {
    type Statement = PgStatement;

    async fn parse_sql<C>(
        &self,
        _client: &C,
        sql: &str,
        _types: &[Option<Type>],
    ) -> PgWireResult<Option<PgStatement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let session = self.session()?;
        Ok(Some(self.prepare(&session, sql).await.map_err(pg_error)?))
    }

    fn get_parameter_types(&self, statement: &PgStatement) -> PgWireResult<Vec<Type>> {
        let PgStatement::Sql(statement) = statement else {
            return Ok(vec![]);
        };
        (statement.info().parameters.fields().iter())
            .map(|field| into_pg_type(field.data_type()))
            .collect()
    }

    fn get_result_schema(
        &self,
        statement: &PgStatement,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        let format = format.unwrap_or(&Format::UnifiedText);
        let options = Arc::new(FormatOptions::default());
        let schema = match statement {
            PgStatement::Sql(statement) if statement.info().kind == StatementKind::Query => {
                statement.info().schema.clone()
            }
            PgStatement::Parameter(ParameterStatement::Show(name)) => show_schema(name),
            _ => return Ok(vec![]),
        };
        pg_fields(&schema, format, options).map_err(pg_error)
    }
}

#[async_trait]
impl ExtendedQueryHandler for Queries {
    type Statement = PgStatement;
    type QueryParser = Queries;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        Arc::new(Queries {
            shared: self.shared.clone(),
            session: self.session.clone(),
            copy: self.copy.clone(),
            fields: LastFields::default(),
        })
    }

    /// pgwire's Bind, answered without a flush (see [`Corked`]).
    async fn on_bind<C>(&self, client: &mut C, message: Bind) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let statement_name = message.statement_name.as_deref().unwrap_or(DEFAULT_NAME);
        match client.portal_store().get_statement(statement_name) {
            Some(Entry::Value(statement)) => {
                let portal = Portal::try_new(&message, statement)?;
                client.portal_store().put_portal(Arc::new(portal));
            }
            Some(Entry::Empty) if message.parameters.is_empty() => {
                let portal_name = message.portal_name.as_deref().unwrap_or(DEFAULT_NAME);
                client.portal_store().put_empty_portal(portal_name);
            }
            Some(Entry::Empty) => {
                let error = ServerError::invalid("an empty statement takes no parameters");
                return Err(pg_error(error));
            }
            None => return Err(PgWireError::StatementNotFound(statement_name.to_owned())),
        }
        client
            .feed(PgWireBackendMessage::BindComplete(BindComplete::new()))
            .await?;
        Ok(())
    }

    /// pgwire's Execute, answered without a flush (see [`Corked`]).
    async fn on_execute<C>(&self, client: &mut C, message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self._on_execute(&mut Corked(client), message).await
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<PgStatement>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let session = self.session()?;
        let statement = &portal.statement.statement;
        let params = match statement {
            PgStatement::Sql(prepared) => {
                let parameters = prepared.info().parameters.clone();
                // A text parameter (or one the statement implies no type for) takes the type
                // the client gave it: binding casts the value to the statement's type.
                let types = (parameters.fields().iter())
                    .map(|f| Some(f.data_type()).filter(|t| **t != DataType::Utf8))
                    .collect::<Vec<_>>();
                let mut values = match deserialize_parameters(portal, &types)? {
                    ParamValues::List(values) => values.into_iter().map(|v| v.value).collect(),
                    ParamValues::Map(_) => vec![],
                };
                // Values for parameters the client declared (in Parse) that the statement does
                // not use: a catalog query rewritten for the engine may have dropped some.
                if values.len() <= portal.statement.parameter_types.len() {
                    values.truncate(types.len());
                }
                values
            }
            PgStatement::Parameter(_) | PgStatement::Copy(_) => vec![],
        };
        let format = &portal.result_column_format;
        match self
            .execute(client, &session, statement, params, format)
            .await
        {
            Ok(response) => Ok(response),
            Err(e) => Ok(Response::Error(Box::new(error_info(&e)))),
        }
    }
}
