//! Fuzz targets: what a Flight SQL client sends, as bytes — a GetFlightInfo command, a DoGet
//! ticket, a DoAction body — random, or a valid message of each kind with a few bytes changed,
//! through the service's own entry points (arrow-flight's `Any`/`Command` decoding, then Nyala's
//! handlers: tickets and their parameters, prepared statement handles, session options,
//! metadata filter patterns). An error status is fine; a panic is a bug. Also the Basic/Bearer
//! header and the LIKE patterns on their own. See the `nyala-fuzzing` crate for the budget:
//! `NYALA_FUZZ_SECS=600 cargo test --release -p nyala-flight --lib fuzz_`.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest, CommandGetCatalogs,
    CommandGetCrossReference, CommandGetDbSchemas, CommandGetExportedKeys, CommandGetImportedKeys,
    CommandGetPrimaryKeys, CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables,
    CommandGetXdbcTypeInfo, CommandPreparedStatementQuery, CommandStatementQuery,
    CommandStatementUpdate, ProstMessageExt, TicketStatementQuery,
};
use arrow_flight::{
    Action, CancelFlightInfoRequest, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo,
    Ticket,
};
use futures::StreamExt;
use nyala_fuzzing::{sample_or_noise, Arbitrary, Fuzz, Unstructured};
use prost::Message;
use tonic::Request;

use crate::auth::{Auth, Caller};
use crate::session::SessionRef;
use crate::session_options::{OptionValue, SessionOptionValue, SetSessionOptionsRequest};
use crate::tickets::{decode_params, encode_params, param_rows, QueryTicket};
use crate::NyalaFlightService;
use nyala_server::Sessions;

/// A server over a database with one table, and a runtime to call it on.
struct Server {
    runtime: tokio::runtime::Runtime,
    service: NyalaFlightService,
    sessions: Arc<Sessions>,
    _dir: tempfile::TempDir,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let db = runtime.block_on(async {
            let db = nyala_sql::Database::open(dir.path(), Default::default())
                .await
                .unwrap();
            for sql in [
                "CREATE TABLE t (k BIGINT, s STRING, PRIMARY KEY (k)) \
                 DISTRIBUTE BY HASH (k) INTO 2 BUCKETS",
                "INSERT INTO t VALUES (1, 'a'), (2, NULL), (3, 'c')",
            ] {
                let stream = db.session().execute(sql).await.unwrap();
                datafusion::physical_plan::common::collect(stream)
                    .await
                    .unwrap();
            }
            db
        });
        let sessions = Sessions::new(db.clone(), Duration::from_secs(3600));
        let service = NyalaFlightService::new(db, sessions.clone(), None).unwrap();
        Server {
            runtime,
            service,
            sessions,
            _dir: dir,
        }
    })
}

/// Parameter rows as a ticket or DoPut carries them: the IPC messages of one batch.
fn params() -> Vec<FlightData> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("b", DataType::Utf8, true),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(vec![Some(1), None])),
            Arc::new(StringArray::from(vec![Some("x"), Some("")])),
        ],
    )
    .unwrap();
    encode_params(Some(&batch)).unwrap()
}

/// `params()` with the header and body of each message kept or replaced by noise.
fn params_or_noise(u: &mut Unstructured) -> arbitrary::Result<Vec<FlightData>> {
    let mut messages = params();
    for message in &mut messages {
        message.data_header = sample_or_noise(u, &[message.data_header.to_vec()])?.into();
        message.data_body = sample_or_noise(u, &[message.data_body.to_vec()])?.into();
    }
    Ok(messages)
}

fn ticket(sql: &str, params: Vec<FlightData>, partition: Option<u32>) -> Vec<u8> {
    let handle = QueryTicket {
        id: 7,
        sql: sql.into(),
        params,
        partition,
        partitions: 2,
        count: None,
        ddl: false,
        snapshot: partition.map(|_| 1),
        session: "00000000000000000000000000000000".into(),
        transaction: None,
    };
    TicketStatementQuery {
        statement_handle: handle.encode_to_vec().into(),
    }
    .as_any()
    .encode_to_vec()
}

/// Valid commands (as `Any`), the bytes of a GetFlightInfo descriptor or a DoGet ticket.
fn commands() -> &'static [Vec<u8>] {
    static SAMPLES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SAMPLES.get_or_init(|| {
        let s = |v: &str| Some(v.to_string());
        vec![
            CommandStatementQuery {
                query: "SELECT k, s FROM t WHERE k > 1".into(),
                transaction_id: None,
            }
            .as_any()
            .encode_to_vec(),
            CommandStatementUpdate {
                query: "UPSERT INTO t VALUES (4, 'd')".into(),
                transaction_id: None,
            }
            .as_any()
            .encode_to_vec(),
            CommandPreparedStatementQuery {
                prepared_statement_handle: "0123456789abcdef0123456789abcdef".into(),
            }
            .as_any()
            .encode_to_vec(),
            CommandGetTables {
                catalog: s("nyala"),
                db_schema_filter_pattern: s("pub%"),
                table_name_filter_pattern: s("_%"),
                table_types: vec!["TABLE".into()],
                include_schema: true,
            }
            .as_any()
            .encode_to_vec(),
            CommandGetDbSchemas {
                catalog: s("nyala"),
                db_schema_filter_pattern: s("%"),
            }
            .as_any()
            .encode_to_vec(),
            CommandGetCatalogs {}.as_any().encode_to_vec(),
            CommandGetTableTypes {}.as_any().encode_to_vec(),
            CommandGetSqlInfo {
                info: vec![0, 1, 500, 10_000],
            }
            .as_any()
            .encode_to_vec(),
            CommandGetXdbcTypeInfo { data_type: Some(4) }
                .as_any()
                .encode_to_vec(),
            CommandGetPrimaryKeys {
                catalog: s("nyala"),
                db_schema: s("public"),
                table: "t".into(),
            }
            .as_any()
            .encode_to_vec(),
            CommandGetExportedKeys {
                catalog: None,
                db_schema: None,
                table: "t".into(),
            }
            .as_any()
            .encode_to_vec(),
            CommandGetImportedKeys {
                catalog: None,
                db_schema: None,
                table: "t".into(),
            }
            .as_any()
            .encode_to_vec(),
            CommandGetCrossReference {
                pk_table: "t".into(),
                fk_table: "t".into(),
                ..Default::default()
            }
            .as_any()
            .encode_to_vec(),
            ticket("SELECT k FROM t WHERE k = $1 OR s = $2", params(), None),
            ticket("SELECT * FROM t", vec![], Some(1)),
        ]
    })
}

const ACTIONS: &[&str] = &[
    "CreatePreparedStatement",
    "ClosePreparedStatement",
    "CancelQuery",
    "CancelFlightInfo",
    "SetSessionOptions",
    "GetSessionOptions",
    "CloseSession",
    "BeginTransaction",
    "EndTransaction",
    "CreatePreparedSubstraitPlan",
];

/// Valid bodies of the actions, in the order of [`ACTIONS`] (empty where none is needed).
fn action_bodies() -> &'static [Vec<u8>] {
    static SAMPLES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SAMPLES.get_or_init(|| {
        let info = FlightInfo::new()
            .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(commands()[13].clone())));
        let option = |v: OptionValue| SessionOptionValue {
            option_value: Some(v),
        };
        let options = HashMap::from([
            (
                "nyala.runtime_filters".to_string(),
                option(OptionValue::StringValue("minmax".into())),
            ),
            (
                "datafusion.execution.batch_size".to_string(),
                option(OptionValue::Int64Value(1024)),
            ),
            (
                "datafusion.optimizer.max_passes".to_string(),
                option(OptionValue::DoubleValue(2.0)),
            ),
        ]);
        vec![
            ActionCreatePreparedStatementRequest {
                query: "SELECT s FROM t WHERE k = ?".into(),
                transaction_id: None,
            }
            .as_any()
            .encode_to_vec(),
            ActionClosePreparedStatementRequest {
                prepared_statement_handle: "0123456789abcdef0123456789abcdef".into(),
            }
            .as_any()
            .encode_to_vec(),
            arrow_flight::sql::ActionCancelQueryRequest {
                info: info.encode_to_vec().into(),
            }
            .as_any()
            .encode_to_vec(),
            CancelFlightInfoRequest { info: Some(info) }.encode_to_vec(),
            SetSessionOptionsRequest {
                session_options: options,
            }
            .encode_to_vec(),
            vec![],
            vec![],
            vec![],
            vec![],
            vec![],
        ]
    })
}

const STATEMENTS: &[&str] = &[
    "SELECT * FROM t",
    "SELECT k, s FROM t WHERE k = $1 AND s = $2",
    "SELECT ?",
    "INSERT INTO t VALUES (?, ?)",
    "CREATE TABLE IF NOT EXISTS u (k INT PRIMARY KEY)",
    "SET datafusion.execution.batch_size = 0",
    "SELECT count(*) FROM t AS OF now()",
];

/// A command whose encoding is valid and whose fields are anything: strings, patterns,
/// numbers, and tickets that name any partition, snapshot, session, count or parameters.
fn structured(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    let text = |u: &mut Unstructured| -> arbitrary::Result<String> {
        match u.ratio(1, 2)? {
            true => Ok(u
                .choose(&["t", "%", "_", "nyala", "public", "%t%", "", "T"])?
                .to_string()),
            false => u.arbitrary(),
        }
    };
    let maybe = |u: &mut Unstructured| -> arbitrary::Result<Option<String>> {
        Ok(match u.arbitrary()? {
            true => Some(text(u)?),
            false => None,
        })
    };
    let sql = |u: &mut Unstructured| -> arbitrary::Result<String> {
        match u.ratio(3, 4)? {
            true => Ok(u.choose(STATEMENTS)?.to_string()),
            false => u.arbitrary(),
        }
    };
    Ok(match u.int_in_range(0..=8)? {
        0 => CommandStatementQuery {
            query: sql(u)?,
            transaction_id: None,
        }
        .as_any()
        .encode_to_vec(),
        1 => CommandGetTables {
            catalog: maybe(u)?,
            db_schema_filter_pattern: maybe(u)?,
            table_name_filter_pattern: maybe(u)?,
            table_types: vec![text(u)?],
            include_schema: u.arbitrary()?,
        }
        .as_any()
        .encode_to_vec(),
        2 => CommandGetDbSchemas {
            catalog: maybe(u)?,
            db_schema_filter_pattern: maybe(u)?,
        }
        .as_any()
        .encode_to_vec(),
        3 => CommandGetSqlInfo {
            info: u.arbitrary()?,
        }
        .as_any()
        .encode_to_vec(),
        4 => CommandGetXdbcTypeInfo {
            data_type: u.arbitrary()?,
        }
        .as_any()
        .encode_to_vec(),
        5 => CommandGetPrimaryKeys {
            catalog: maybe(u)?,
            db_schema: maybe(u)?,
            table: text(u)?,
        }
        .as_any()
        .encode_to_vec(),
        6 => CommandGetCrossReference {
            pk_catalog: maybe(u)?,
            pk_db_schema: maybe(u)?,
            pk_table: text(u)?,
            fk_catalog: maybe(u)?,
            fk_db_schema: maybe(u)?,
            fk_table: text(u)?,
        }
        .as_any()
        .encode_to_vec(),
        7 => CommandPreparedStatementQuery {
            prepared_statement_handle: Vec::<u8>::arbitrary(u)?.into(),
        }
        .as_any()
        .encode_to_vec(),
        _ => {
            let handle = QueryTicket {
                id: u.arbitrary()?,
                sql: sql(u)?,
                params: params_or_noise(u)?,
                partition: u.arbitrary()?,
                partitions: u.int_in_range(0..=3)?,
                count: u.arbitrary()?,
                ddl: u.arbitrary()?,
                snapshot: u.arbitrary()?,
                session: text(u)?,
                transaction: u.arbitrary()?,
            };
            TicketStatementQuery {
                statement_handle: handle.encode_to_vec().into(),
            }
            .as_any()
            .encode_to_vec()
        }
    })
}

/// A command: mostly a valid one with a few bytes changed, or valid bytes of anything.
fn command(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    match u.ratio(1, 2)? {
        true => sample_or_noise(u, commands()),
        false => structured(u),
    }
}

/// One call from a client.
#[derive(Debug)]
enum Call {
    GetFlightInfo(Vec<u8>),
    DoGet(Vec<u8>),
    DoAction { kind: String, body: Vec<u8> },
}

fn call(u: &mut Unstructured) -> arbitrary::Result<Call> {
    Ok(match u.int_in_range(0..=2)? {
        0 => Call::GetFlightInfo(command(u)?),
        1 => Call::DoGet(command(u)?),
        _ => {
            let i = u.choose_index(ACTIONS.len())?;
            let kind = match u.ratio(1, 16)? {
                true => u.arbitrary()?,
                false => ACTIONS[i].to_string(),
            };
            let body = sample_or_noise(u, std::slice::from_ref(&action_bodies()[i]))?;
            Call::DoAction { kind, body }
        }
    })
}

/// A request in a new session, as the session layer hands it to the service.
fn request<T>(server: &Server, message: T) -> Request<T> {
    let (session, _) = server.sessions.resolve(None, None, None).unwrap();
    let mut request = Request::new(message);
    request.extensions_mut().insert(Caller::Anyone);
    request.extensions_mut().insert(SessionRef(session));
    request
}

/// Reads at most 16 items of a response stream, for at most `limit`.
async fn drain<T>(stream: impl futures::Stream<Item = T>, limit: Duration) {
    let _ = tokio::time::timeout(limit, stream.take(16).for_each(|_| async {})).await;
}

/// Makes the call and reads what comes back, boundedly. Error statuses are fine.
async fn make(server: &Server, call: Call) {
    let service = &server.service;
    let limit = Duration::from_secs(3);
    match call {
        Call::GetFlightInfo(cmd) => {
            let descriptor = FlightDescriptor::new_cmd(cmd);
            let call = service.get_flight_info(request(server, descriptor));
            let _ = tokio::time::timeout(limit, call).await;
        }
        Call::DoGet(ticket) => {
            let call = service.do_get(request(server, Ticket::new(ticket)));
            if let Ok(Ok(response)) = tokio::time::timeout(limit, call).await {
                drain(response.into_inner(), limit).await;
            }
        }
        Call::DoAction { kind, body } => {
            let action = Action::new(kind, body);
            let call = service.do_action(request(server, action));
            if let Ok(Ok(response)) = tokio::time::timeout(limit, call).await {
                drain(response.into_inner(), limit).await;
            }
        }
    }
}

#[test]
fn fuzz_flight_calls_are_answered_or_refused() {
    let server = server();
    Fuzz::new("flight_calls", 3000)
        .watch_threads(&["tokio-rt-worker"])
        .run(call, |call| {
            server.runtime.block_on(make(server, call));
        });
}

/// The parameters a ticket carries (an Arrow IPC stream), decoded and split into rows.
#[test]
fn fuzz_ticket_parameters_decode_or_fail() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    Fuzz::new("ticket_params", 3000).run(params_or_noise, |messages| {
        if let Ok(batch) = runtime.block_on(decode_params(&messages)) {
            let _ = param_rows(batch.as_ref());
        }
    });
}

/// The `authorization` header, as any client may send it.
#[test]
fn fuzz_authorization_headers_are_identified_or_refused() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = runtime
        .block_on(nyala_sql::Database::open(dir.path(), Default::default()))
        .unwrap();
    let ada = nyala_engine::UserInfo::new("ada", "secret pass", true).unwrap();
    let create = nyala_engine::DdlOp::CreateUser {
        user: ada,
        if_not_exists: false,
    };
    runtime.block_on(db.client().ddl(create)).unwrap();
    let auth = Auth::new(db.client());
    let header = |u: &mut Unstructured| -> arbitrary::Result<Vec<u8>> {
        // base64("ada:secret pass")
        let samples = [
            b"Basic YWRhOnNlY3JldCBwYXNz".to_vec(),
            b"Bearer abc".to_vec(),
        ];
        sample_or_noise(u, &samples)
    };
    Fuzz::new("authorization", 2000).run(header, |value| {
        let mut headers = http::HeaderMap::new();
        if let Ok(value) = http::HeaderValue::from_bytes(&value) {
            headers.insert(http::header::AUTHORIZATION, value);
        }
        let identified = runtime.block_on(auth.identify(&headers));
        if value == b"Basic YWRhOnNlY3JldCBwYXNz" {
            assert!(
                matches!(identified, Ok(Caller::Password(_))),
                "{identified:?}"
            );
        }
    });
}

/// Filter patterns against names: the same answer as a table of all prefixes gives.
#[test]
fn fuzz_like_patterns_match_or_not() {
    let text = |u: &mut Unstructured| -> arbitrary::Result<(String, String)> {
        let alphabet = ['a', 'b', '%', '_', 'é'];
        let mut word = |max: usize| -> arbitrary::Result<String> {
            let n = u.int_in_range(0..=max)?;
            (0..n).map(|_| u.choose(&alphabet).copied()).collect()
        };
        Ok((word(64)?, word(64)?))
    };
    Fuzz::new("like", 5000).run(text, |(value, pattern)| {
        let expected = like_by_table(&value, &pattern);
        assert_eq!(crate::metadata::like(&value, &pattern), expected);
    });
}

/// LIKE by dynamic programming, to check the matcher against: `m[i][j]` says whether the
/// first `i` characters of the value match the first `j` of the pattern.
fn like_by_table(value: &str, pattern: &str) -> bool {
    let (v, p): (Vec<char>, Vec<char>) = (value.chars().collect(), pattern.chars().collect());
    let mut m = vec![vec![false; p.len() + 1]; v.len() + 1];
    m[0][0] = true;
    for i in 0..=v.len() {
        for j in 1..=p.len() {
            m[i][j] = match p[j - 1] {
                '%' => m[i][j - 1] || (i > 0 && m[i - 1][j]),
                c => i > 0 && (c == '_' || c == v[i - 1]) && m[i - 1][j - 1],
            };
        }
    }
    m[v.len()][p.len()]
}

/// Found by `fuzz_like_patterns_match_or_not` (slow inputs): a pattern of many `%` recursed
/// once per character (a long one overflowed the stack) and backtracked exponentially.
#[test]
fn like_patterns_take_linear_stack_and_polynomial_time() {
    use crate::metadata::like;
    assert!(like("orders", &"%".repeat(1_000_000)));
    let started = std::time::Instant::now();
    assert!(!like(&"a".repeat(200), &format!("{}b", "%a".repeat(40))));
    assert!(like(&"a".repeat(200), &"%a".repeat(40)));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// What the fuzz tests found in ticket parameters, each once a crash, now a refusal.
#[test]
fn fuzz_findings_in_ticket_parameters_are_refused() {
    // Declared sizes, bodies and schemas of crafted messages: see upload.rs's tests.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let decode = |messages: &[FlightData]| runtime.block_on(decode_params(messages));
    let valid = decode(&params()).unwrap().unwrap();
    assert_eq!((valid.num_rows(), valid.num_columns()), (2, 2));
    // Rows without columns take no bytes: 2^40 of them were as many parameter sets.
    let rows = RecordBatch::try_new_with_options(
        Arc::new(Schema::empty()),
        vec![],
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(1 << 40)),
    )
    .unwrap();
    let error = match decode(&encode_params(Some(&rows)).unwrap()) {
        Err(error) => error,
        Ok(decoded) => param_rows(decoded.as_ref()).unwrap_err(),
    };
    assert!(error.message().contains("at most"), "{error}");
}
