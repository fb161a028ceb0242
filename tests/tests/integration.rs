//! Nyala as a user meets it: a real `nyala serve` process, spoken to over Arrow Flight SQL.
//!
//! The binary is taken from `NYALA_BIN`, or next to the test executable's directory
//! (`target/debug/nyala`); `tests/run.sh` builds it first.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use std::sync::Arc;

use arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::util::pretty::pretty_format_batches;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{
    ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult, CommandGetDbSchemas,
    CommandGetExportedKeys, CommandGetTables, CommandGetXdbcTypeInfo,
    CommandPreparedStatementQuery, CommandStatementIngest, ProstMessageExt, TableDefinitionOptions,
    TableExistsOption, TableNotExistOption,
};
use arrow_flight::{
    CancelFlightInfoRequest, CancelFlightInfoResult, CancelStatus, FlightData, FlightDescriptor,
    FlightInfo,
};
use futures::TryStreamExt;
use prost::Message;
use tonic::transport::Channel;

fn nyala_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("NYALA_BIN") {
        return bin.into();
    }
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("nyala")
}

/// Starts `nyala <args> --data-dir <data_dir>`; returns the process and the first line it
/// prints (where it listens).
fn spawn_nyala(args: &[&str], data_dir: &Path) -> (Child, String) {
    spawn_nyala_with_env(args, data_dir, &[])
}

/// [`spawn_nyala`] with `env` added to the process's environment.
fn spawn_nyala_with_env(args: &[&str], data_dir: &Path, env: &[(&str, &str)]) -> (Child, String) {
    let mut child = Command::new(nyala_bin())
        .args(args)
        .envs(env.iter().copied())
        .arg("--data-dir")
        .arg(data_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start nyala (build it with: cargo build -p nyala-flight --bin nyala)");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

/// A `nyala serve` child process; killed with SIGKILL on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(data_dir: &Path) -> Server {
        Self::start_with(data_dir, &[])
    }

    fn start_with(data_dir: &Path, args: &[&str]) -> Server {
        let mut all = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--pg-addr",
            "127.0.0.1:0",
        ];
        all.extend(args);
        let (child, line) = spawn_nyala(&all, data_dir);
        let addr = line
            .split_whitespace()
            .find(|w| w.starts_with("grpc://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .replace("grpc://", "http://");
        Server { child, addr }
    }

    async fn client(&self) -> FlightSqlServiceClient<Channel> {
        let channel = Channel::from_shared(self.addr.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        FlightSqlServiceClient::new(channel)
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn query(
    client: &mut FlightSqlServiceClient<Channel>,
    sql: &str,
) -> Result<Vec<RecordBatch>, String> {
    let info = client
        .execute(sql.to_string(), None)
        .await
        .map_err(|e| e.to_string())?;
    let mut batches = Vec::new();
    for endpoint in info.endpoint {
        let stream = client
            .do_get(endpoint.ticket.unwrap())
            .await
            .map_err(|e| e.to_string())?;
        batches.extend(
            stream
                .try_collect::<Vec<_>>()
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(batches)
}

async fn text(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> String {
    let batches = query(client, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    pretty_format_batches(&batches).unwrap().to_string()
}

async fn update(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<i64, String> {
    client
        .execute_update(sql.to_string(), None)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_metadata_and_errors_over_flight_sql() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut c = server.client().await;
    update(
        &mut c,
        "CREATE TABLE metrics (host STRING, ts TIMESTAMP, metric STRING, value DOUBLE, \
        PRIMARY KEY (host, metric, ts)) DISTRIBUTE BY HASH (host, metric) INTO 4 BUCKETS",
    )
    .await
    .unwrap();
    let n = update(
        &mut c,
        "INSERT INTO metrics VALUES ('a', '2026-01-01T00:00:00', 'cpu', 0.5), \
        ('a', '2026-01-01T00:01:00', 'cpu', 7.5), ('b', '2026-01-01T00:00:00', 'cpu', 3.0), \
        ('c', '2026-01-01T00:00:00', 'mem', 20.0)",
    )
    .await
    .unwrap();
    assert_eq!(n, 4);
    let e = update(
        &mut c,
        "INSERT INTO metrics VALUES ('a', '2026-01-01T00:00:00', 'cpu', 1.0)",
    )
    .await
    .unwrap_err();
    assert!(
        e.contains("duplicate primary key") && e.contains("host='a'"),
        "{e}"
    );
    assert_eq!(
        update(
            &mut c,
            "UPDATE metrics SET value = value * 2 WHERE host = 'a'"
        )
        .await
        .unwrap(),
        2
    );
    assert_eq!(
        update(&mut c, "DELETE FROM metrics WHERE value > 10")
            .await
            .unwrap(),
        2
    );
    // DML sent as a query, as ADBC does, returns its count too.
    assert!(text(
        &mut c,
        "UPSERT INTO metrics VALUES ('b', '2026-01-01T00:00:00', 'cpu', 4.0)"
    )
    .await
    .contains("| 1 "));
    let got = text(
        &mut c,
        "SELECT host, avg(value) AS v FROM metrics GROUP BY host ORDER BY host",
    )
    .await;
    assert_eq!(got, "+------+-----+\n| host | v   |\n+------+-----+\n| a    | 1.0 |\n| b    | 4.0 |\n+------+-----+");
    assert!(text(&mut c, "SHOW TABLES").await.contains("metrics"));
    assert!(text(&mut c, "DESCRIBE metrics").await.contains("TIMESTAMP"));
    let plan = text(&mut c, "EXPLAIN SELECT value FROM metrics WHERE host = 'a'").await;
    assert!(
        plan.contains("NyalaScanExec") && plan.contains("predicates="),
        "{plan}"
    );

    for (sql, needle) in [
        ("SELEC 1", "syntax"),
        ("SELECT * FROM nope", "nope"),
        ("SELECT nope FROM metrics", "nope"),
        ("UPDATE metrics SET host = 'x'", "primary key"),
        (
            "INSERT INTO metrics VALUES (NULL, '2026-01-01T00:00:00', 'cpu', 1.0)",
            "null",
        ),
    ] {
        let e = query(&mut c, sql).await.unwrap_err();
        assert!(e.contains(needle), "{sql}: {e}");
    }
    assert!(text(&mut c, "SELECT count(*) AS n FROM metrics")
        .await
        .contains("| 2 |"));

    // Metadata as JDBC/ADBC ask for it.
    let info = c.get_catalogs().await.unwrap();
    let batches: Vec<RecordBatch> = c
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(pretty_format_batches(&batches)
        .unwrap()
        .to_string()
        .contains("nyala"));
    let info = c
        .get_db_schemas(CommandGetDbSchemas {
            catalog: None,
            db_schema_filter_pattern: None,
        })
        .await
        .unwrap();
    let batches: Vec<RecordBatch> = c
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(pretty_format_batches(&batches)
        .unwrap()
        .to_string()
        .contains("public"));
    let info = c
        .get_tables(CommandGetTables {
            include_schema: true,
            table_name_filter_pattern: Some("met%".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let batches: Vec<RecordBatch> = c
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);

    // Prepared statements (the JDBC driver's path for every statement).
    let mut prepared = c
        .prepare("SELECT count(*) FROM metrics".into(), None)
        .await
        .unwrap();
    let info = prepared.execute().await.unwrap();
    let batches: Vec<RecordBatch> = c
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(pretty_format_batches(&batches)
        .unwrap()
        .to_string()
        .contains("| 2 "));
    let mut insert = c
        .prepare(
            "INSERT INTO metrics VALUES ('d', '2026-01-01T00:00:00', 'cpu', 1.0)".into(),
            None,
        )
        .await
        .unwrap();
    assert_eq!(insert.execute_update().await.unwrap(), 1);

    // Garbage tickets get an error and the server keeps answering.
    assert!(c
        .do_get(arrow_flight::Ticket::new(b"garbage".to_vec()))
        .await
        .is_err());
    update(&mut c, "DROP TABLE metrics").await.unwrap();
    assert!(query(&mut c, "SELECT * FROM metrics").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected_rows = 0i64;
    let mut expected_sum = 0i64;
    {
        let server = Server::start(dir.path());
        let mut c = server.client().await;
        update(&mut c, "CREATE TABLE events (id BIGINT PRIMARY KEY, v BIGINT) DISTRIBUTE BY HASH (id) INTO 3 BUCKETS").await.unwrap();
        server.kill();
    }
    for round in 0..3i64 {
        let server = Server::start(dir.path());
        let mut c = server.client().await;
        let got = text(
            &mut c,
            "SELECT count(*) AS n, coalesce(sum(v), 0) AS s FROM events",
        )
        .await;
        assert!(
            got.contains(&format!("| {expected_rows} "))
                && got.contains(&format!(" {expected_sum} ")),
            "round {round}: {got}"
        );
        for statement in 0..5i64 {
            let base = round * 1000 + statement * 100;
            let values: Vec<String> = (base..base + 50)
                .map(|i| format!("({i}, {})", i % 7))
                .collect();
            let n = update(
                &mut c,
                &format!("INSERT INTO events VALUES {}", values.join(", ")),
            )
            .await
            .unwrap();
            expected_rows += n;
            expected_sum += (base..base + 50).map(|i| i % 7).sum::<i64>();
        }
        update(
            &mut c,
            &format!(
                "UPDATE events SET v = v + 1 WHERE id < {}",
                round * 1000 + 10
            ),
        )
        .await
        .unwrap();
        expected_sum += text(
            &mut c,
            &format!(
                "SELECT count(*) AS n FROM events WHERE id < {}",
                round * 1000 + 10
            ),
        )
        .await
        .lines()
        .nth(3)
        .and_then(|l| l.trim_matches(|c| c == '|' || c == ' ').parse::<i64>().ok())
        .unwrap();
        server.kill();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let server = Server::start(dir.path());
    let mut c = server.client().await;
    let got = text(
        &mut c,
        "SELECT count(*) AS n, count(DISTINCT id) AS d, sum(v) AS s FROM events",
    )
    .await;
    assert!(
        got.contains(&format!(
            "| {expected_rows} | {expected_rows} | {expected_sum} |"
        )),
        "{got}"
    );
}

/// A crash while a replica's directory is made (creation, tablet copy, clone) or deleted
/// (DROP TABLE, a moved replica) leaves a directory beside the replicas, never half a replica:
/// the next start removes what was left and opens the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_made_or_deleted_when_the_server_died_is_cleaned_up_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let tablets = dir.path().join("tserver").join("tablets");
    {
        let server = Server::start(dir.path());
        let mut c = server.client().await;
        update(
            &mut c,
            "CREATE TABLE kept (id BIGINT PRIMARY KEY) DISTRIBUTE BY HASH (id) INTO 2 BUCKETS",
        )
        .await
        .unwrap();
        update(&mut c, "INSERT INTO kept VALUES (1), (2), (3)")
            .await
            .unwrap();
        update(&mut c, "CREATE TABLE dropped (id BIGINT PRIMARY KEY)")
            .await
            .unwrap();
        update(&mut c, "DROP TABLE dropped").await.unwrap();
        server.kill();
    }
    let replicas = |tablets: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(tablets)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        names
    };
    // The two of `kept` and the transaction status table's (the INSERT spans two tablets).
    let before = replicas(&tablets);
    assert_eq!(before.len(), 3, "{before:?}");
    // What a kill leaves: a replica half deleted (its metadata gone first), one half built
    // (no metadata yet), a tablet copy half received.
    let half_deleted = tablets.join(format!(".deleted-{}", before[0]));
    copy_dir(&tablets.join(&before[0]), &half_deleted);
    std::fs::remove_file(half_deleted.join("data").join("metadata")).unwrap();
    std::fs::create_dir_all(tablets.join(".new-t9").join("data")).unwrap();
    std::fs::create_dir_all(tablets.join(".copy-t8")).unwrap();
    std::fs::write(tablets.join(".copy-t8").join("rowset-1"), b"partial").unwrap();
    let server = Server::start(dir.path());
    let mut c = server.client().await;
    let got = text(&mut c, "SELECT count(*) AS n FROM kept").await;
    assert!(got.contains("| 3 |"), "{got}");
    assert_eq!(replicas(&tablets), before);
}

/// Copies directory `from` to `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_command_against_server_and_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.addr.replace("http://", "grpc://");
    let out = Command::new(nyala_bin())
        .args(["sql", "--connect", &url, "-c", "CREATE TABLE t (k INT PRIMARY KEY, s STRING); INSERT INTO t VALUES (1, 'one'), (2, 'two'); SELECT * FROM t ORDER BY k;"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("| 2 | two |") && stdout.contains("(2 rows)"),
        "{stdout}"
    );
    let out = Command::new(nyala_bin())
        .args(["sql", "--connect", &url, "-c", "SELECT * FROM missing"])
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("missing"));

    let embedded = tempfile::tempdir().unwrap();
    let dir_arg = embedded.path().to_str().unwrap();
    let out = Command::new(nyala_bin())
        .args([
            "sql",
            "--data-dir",
            dir_arg,
            "-c",
            "CREATE TABLE e (k INT PRIMARY KEY); INSERT INTO e VALUES (7)",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(nyala_bin())
        .args(["sql", "--data-dir", dir_arg, "-c", "SELECT k FROM e"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("| 7 |"));
}

async fn fetch(
    client: &mut FlightSqlServiceClient<Channel>,
    info: FlightInfo,
) -> Result<Vec<RecordBatch>, String> {
    let mut batches = Vec::new();
    for endpoint in info.endpoint {
        let stream = client
            .do_get(endpoint.ticket.unwrap())
            .await
            .map_err(|e| e.to_string())?;
        batches.extend(
            stream
                .try_collect::<Vec<_>>()
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(batches)
}

fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

fn people(ids: &[i64], names: &[&str]) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ids.to_vec())),
            Arc::new(StringArray::from(names.to_vec())),
        ],
    )
    .unwrap()
}

fn ingest_command(
    table: &str,
    if_not_exist: TableNotExistOption,
    if_exists: TableExistsOption,
) -> CommandStatementIngest {
    CommandStatementIngest {
        table_definition_options: Some(TableDefinitionOptions {
            if_not_exist: if_not_exist as i32,
            if_exists: if_exists as i32,
        }),
        table: table.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_ingest_endpoints_and_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut c = server.client().await;
    update(&mut c, "CREATE TABLE p (id BIGINT PRIMARY KEY, name STRING, score DOUBLE) DISTRIBUTE BY HASH (id) INTO 4 BUCKETS").await.unwrap();

    // Prepared INSERT with three parameter rows runs once per row.
    let mut insert = c
        .prepare("INSERT INTO p VALUES (?, ?, ?)".into(), None)
        .await
        .unwrap();
    let types: Vec<DataType> = insert
        .parameter_schema()
        .unwrap()
        .fields()
        .iter()
        .map(|f| f.data_type().clone())
        .collect();
    assert_eq!(types, [DataType::Int64, DataType::Utf8, DataType::Float64]);
    let params = RecordBatch::try_new(
        Arc::new(insert.parameter_schema().unwrap().clone()),
        vec![
            Arc::new(Int64Array::from(vec![1, 2, 3])),
            Arc::new(StringArray::from(vec!["ann", "bob", "cy"])),
            Arc::new(arrow::array::Float64Array::from(vec![1.5, 2.5, 3.5])),
        ],
    )
    .unwrap();
    insert.set_parameters(params).unwrap();
    assert_eq!(insert.execute_update().await.unwrap(), 3);

    // A query with a parameter, re-executed with a new value; ints bind to the BIGINT column.
    let mut select = c
        .prepare("SELECT name FROM p WHERE id = $1".into(), None)
        .await
        .unwrap();
    for (id, name) in [(2i32, "bob"), (3, "cy")] {
        let schema = Arc::new(Schema::new(vec![Field::new("$1", DataType::Int32, false)]));
        select
            .set_parameters(
                RecordBatch::try_new(
                    schema,
                    vec![Arc::new(arrow::array::Int32Array::from(vec![id]))],
                )
                .unwrap(),
            )
            .unwrap();
        let info = select.execute().await.unwrap();
        let got = pretty_format_batches(&fetch(&mut c, info).await.unwrap())
            .unwrap()
            .to_string();
        assert!(got.contains(name), "{got}");
    }
    // Binding the wrong number of parameters is an error, not a panic.
    let mut bad = c
        .prepare("SELECT name FROM p WHERE id = ?".into(), None)
        .await
        .unwrap();
    let e = match bad.execute().await {
        Ok(info) => fetch(&mut c, info).await.unwrap_err(),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("parameter"), "{e}");

    // A plain scan gets one endpoint per tablet, each with this server's location.
    let info = c
        .execute("SELECT id, name FROM p WHERE score > 0".into(), None)
        .await
        .unwrap();
    assert_eq!(info.endpoint.len(), 4);
    assert!(info.endpoint.iter().all(|e| e
        .location
        .first()
        .is_some_and(|l| l.uri.starts_with("grpc+tcp://127.0.0.1:"))));
    assert_eq!(rows(&fetch(&mut c, info).await.unwrap()), 3);
    let info = c
        .execute("SELECT count(*) FROM p".into(), None)
        .await
        .unwrap();
    assert_eq!(info.endpoint.len(), 1);

    // Bulk ingest: create, append, replace; failures leave the table as it was.
    let created = ingest_command(
        "people",
        TableNotExistOption::Create,
        TableExistsOption::Fail,
    );
    let batches =
        futures::stream::iter([Ok(people(&[1, 2], &["a", "b"])), Ok(people(&[3], &["c"]))]);
    assert_eq!(c.execute_ingest(created.clone(), batches).await.unwrap(), 3);
    let e = c
        .execute_ingest(created, futures::stream::iter([Ok(people(&[9], &["z"]))]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    let append = ingest_command(
        "people",
        TableNotExistOption::Fail,
        TableExistsOption::Append,
    );
    assert_eq!(
        c.execute_ingest(
            append.clone(),
            futures::stream::iter([Ok(people(&[4], &["d"]))])
        )
        .await
        .unwrap(),
        1
    );
    let e = c
        .execute_ingest(append, futures::stream::iter([Ok(people(&[1], &["dup"]))]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("duplicate"), "{e}");
    assert!(text(&mut c, "SELECT count(*) AS n FROM people")
        .await
        .contains("| 4 |"));
    let replace = ingest_command(
        "people",
        TableNotExistOption::Create,
        TableExistsOption::Replace,
    );
    assert_eq!(
        c.execute_ingest(replace, futures::stream::iter([Ok(people(&[7], &["g"]))]))
            .await
            .unwrap(),
        1
    );
    assert!(text(&mut c, "SELECT id, name FROM people")
        .await
        .contains("| 7  | g    |"));
    let missing = ingest_command(
        "nobody",
        TableNotExistOption::Fail,
        TableExistsOption::Append,
    );
    assert!(c
        .execute_ingest(missing, futures::stream::iter([Ok(people(&[1], &["a"]))]))
        .await
        .is_err());

    // Metadata JDBC asks for: type info, and (empty) foreign keys.
    let info = c
        .get_xdbc_type_info(CommandGetXdbcTypeInfo { data_type: None })
        .await
        .unwrap();
    let types = pretty_format_batches(&fetch(&mut c, info).await.unwrap())
        .unwrap()
        .to_string();
    assert!(
        types.contains("BIGINT") && types.contains("TIMESTAMP"),
        "{types}"
    );
    let info = c
        .get_exported_keys(CommandGetExportedKeys {
            table: "p".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rows(&fetch(&mut c, info).await.unwrap()), 0);

    // CancelFlightInfo: a cancelled query's tickets fail with "cancelled".
    let info = c.execute("SELECT * FROM p".into(), None).await.unwrap();
    let action = arrow_flight::Action {
        r#type: "CancelFlightInfo".into(),
        body: CancelFlightInfoRequest {
            info: Some(info.clone()),
        }
        .encode_to_vec()
        .into(),
    };
    let result: Vec<arrow_flight::Result> = c
        .inner_mut()
        .do_action(action)
        .await
        .unwrap()
        .into_inner()
        .try_collect()
        .await
        .unwrap();
    let status = CancelFlightInfoResult::decode(result[0].body.clone())
        .unwrap()
        .status;
    assert_eq!(status, CancelStatus::Cancelled as i32);
    let e = fetch(&mut c, info).await.unwrap_err();
    assert!(e.contains("cancelled"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_with_bearer_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--user", "alice", "--password", "s3cret-pw"]);
    let mut anonymous = server.client().await;
    let e = query(&mut anonymous, "SELECT 1").await.unwrap_err();
    assert!(e.contains("authentication required"), "{e}");
    let mut wrong = server.client().await;
    let e = wrong
        .handshake("alice", "guess")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("invalid username or password"), "{e}");
    let mut forged = server.client().await;
    forged.set_token("not-a-token".into());
    assert!(query(&mut forged, "SELECT 1")
        .await
        .unwrap_err()
        .contains("invalid or expired token"));

    let mut c = server.client().await;
    c.handshake("alice", "s3cret-pw").await.unwrap();
    assert!(c.token().is_some());
    assert!(text(&mut c, "SELECT 41 + 1 AS answer").await.contains("42"));
    let out = Command::new(nyala_bin())
        .args([
            "sql",
            "--connect",
            &server.addr.replace("http://", "grpc://"),
            "--user",
            "alice",
            "-c",
            "SELECT 'ok' AS s",
        ])
        .env("NYALA_PASSWORD", "s3cret-pw")
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A raw DoPut: a first message naming `command`, then `messages` as they are; the server's
/// error, if any.
async fn raw_put(
    client: &mut FlightSqlServiceClient<Channel>,
    command: &impl ProstMessageExt,
    messages: Vec<FlightData>,
) -> Result<(), String> {
    let first = FlightData {
        flight_descriptor: Some(FlightDescriptor::new_cmd(command.as_any().encode_to_vec())),
        ..Default::default()
    };
    let stream = futures::stream::iter(std::iter::once(first).chain(messages));
    let result = async {
        let answers = client.inner_mut().do_put(stream).await?.into_inner();
        answers.try_collect::<Vec<_>>().await
    };
    result.await.map(drop).map_err(|e| {
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        e.message().to_string()
    })
}

/// Changes entry `i` — a pair of i64 — of a record batch header's buffers (offset, length) or,
/// with `nodes`, of its field nodes (length, null count).
fn rewrite_batch_header(
    data: &mut FlightData,
    nodes: bool,
    i: usize,
    change: impl Fn([i64; 2]) -> [i64; 2],
) {
    let mut header = data.data_header.to_vec();
    let at = {
        let message = arrow::ipc::root_as_message(&header).unwrap();
        let batch = message.header_as_record_batch().unwrap();
        let entries = match nodes {
            true => batch.nodes().unwrap().bytes(),
            false => batch.buffers().unwrap().bytes(),
        };
        entries.as_ptr() as usize - header.as_ptr() as usize + i * 16
    };
    let old = |at: usize| i64::from_le_bytes(header[at..at + 8].try_into().unwrap());
    let values = change([old(at), old(at + 8)]);
    header[at..at + 8].copy_from_slice(&values[0].to_le_bytes());
    header[at + 8..at + 16].copy_from_slice(&values[1].to_le_bytes());
    data.data_header = header.into();
}

/// Crafted Arrow IPC sent with DoPut, for a bulk ingest and for a prepared statement's
/// parameters: each upload gets an error saying what is wrong with it, and the server goes on
/// serving with the table as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_uploads_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut c = server.client().await;
    update(&mut c, "CREATE TABLE t (id BIGINT PRIMARY KEY, flag BOOL)")
        .await
        .unwrap();
    update(
        &mut c,
        "INSERT INTO t VALUES (1, true), (2, false), (3, NULL)",
    )
    .await
    .unwrap();
    let before = text(&mut c, "SELECT * FROM t ORDER BY id").await;

    // 300 rows: ids from 1000 (new keys: loaded, they would show), flags a third NULL.
    let ids = Int64Array::from_iter_values(1000..1300);
    let flags =
        arrow::array::BooleanArray::from_iter((0..300).map(|i| (i % 3 != 1).then_some(i % 2 == 0)));
    let batch =
        RecordBatch::try_from_iter([("id", Arc::new(ids) as _), ("flag", Arc::new(flags) as _)])
            .unwrap();
    let valid =
        arrow_flight::utils::batches_to_flight_data(&batch.schema(), vec![batch.clone()]).unwrap();
    let [schema, body] = [valid[0].clone(), valid[1].clone()];
    let changed = |f: &dyn Fn(&mut FlightData)| {
        let mut body = body.clone();
        f(&mut body);
        vec![schema.clone(), body]
    };
    let body_len = body.data_body.len() as i64;
    let cases: Vec<(Vec<FlightData>, &str)> = vec![
        (
            changed(&|m| m.data_header = vec![0x5a; 64].into()),
            "unreadable message header",
        ),
        (vec![body.clone()], "prior to Schema"),
        (
            changed(&|m| rewrite_batch_header(m, false, 1, |_| [body_len - 8, 64])),
            "lies outside the message body",
        ),
        (
            changed(&|m| m.data_body = m.data_body.slice(..100)),
            "lies outside the message body",
        ),
        // flag's validity bitmap (buffer 2) cut to a byte: arrow-buffer asserts its length.
        (
            changed(&|m| rewrite_batch_header(m, false, 2, |[offset, _]| [offset, 1])),
            "malformed Arrow data",
        ),
        (
            changed(&|m| rewrite_batch_header(m, true, 1, |[rows, _]| [rows, rows + 1])),
            "with 301 nulls",
        ),
        (
            changed(&|m| rewrite_batch_header(m, true, 0, |_| [1 << 40, 0])),
            "at most 16777216 are allowed per batch",
        ),
    ];
    let ingest = ingest_command("t", TableNotExistOption::Fail, TableExistsOption::Append);
    let prepare = ActionCreatePreparedStatementRequest {
        query: "SELECT count(*) FROM t WHERE id = ? OR flag = ?".into(),
        transaction_id: None,
    };
    let action = arrow_flight::Action {
        r#type: "CreatePreparedStatement".into(),
        body: prepare.as_any().encode_to_vec().into(),
    };
    let results: Vec<arrow_flight::Result> = c
        .inner_mut()
        .do_action(action)
        .await
        .unwrap()
        .into_inner()
        .try_collect()
        .await
        .unwrap();
    let prepared: ActionCreatePreparedStatementResult =
        arrow_flight::sql::Any::decode(results[0].body.clone())
            .unwrap()
            .unpack()
            .unwrap()
            .unwrap();
    let bind = CommandPreparedStatementQuery {
        prepared_statement_handle: prepared.prepared_statement_handle,
    };
    for (messages, needle) in cases {
        let e = raw_put(&mut c, &ingest, messages.clone())
            .await
            .unwrap_err();
        assert!(e.contains(needle), "ingest: {needle}: {e}");
        let e = raw_put(&mut c, &bind, messages).await.unwrap_err();
        assert!(e.contains(needle), "parameters: {needle}: {e}");
        assert_eq!(text(&mut c, "SELECT * FROM t ORDER BY id").await, before);
    }
    // An ingest whose schema the table does not have, without a batch.
    let zz = Schema::new(vec![Field::new("zz", DataType::Binary, true)]);
    let only_schema = arrow_flight::utils::batches_to_flight_data(&zz, vec![]).unwrap();
    let e = raw_put(&mut c, &ingest, only_schema).await.unwrap_err();
    assert!(e.contains("no column 'zz'"), "{e}");
    // The valid upload is loaded, and binds.
    raw_put(&mut c, &ingest, valid.clone()).await.unwrap();
    assert!(text(&mut c, "SELECT count(*) AS n FROM t")
        .await
        .contains("| 303 |"));
    raw_put(&mut c, &bind, valid).await.unwrap();
}

/// A 50 M-row result streams through the server: its peak memory stays far below the result's
/// size (400 MB of BIGINTs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_results_stream_without_buffering() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut c = server.client().await;
    let info = c
        .execute(
            "SELECT value FROM generate_series(1, 50000000)".into(),
            None,
        )
        .await
        .unwrap();
    let mut stream = c
        .do_get(info.endpoint[0].ticket.clone().unwrap())
        .await
        .unwrap();
    let mut n = 0usize;
    let mut last = 0i64;
    while let Some(batch) = stream.try_next().await.unwrap() {
        n += batch.num_rows();
        if batch.num_rows() > 0 {
            let values = batch
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            last = values.value(values.len() - 1);
        }
    }
    assert_eq!((n, last), (50_000_000, 50_000_000));
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let peak_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(
        peak_kb < 150 * 1024,
        "server peak memory {peak_kb} kB while streaming"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_filters_over_flight_sql() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut c = server.client().await;
    update(
        &mut c,
        "CREATE TABLE facts (id BIGINT PRIMARY KEY, v BIGINT) DISTRIBUTE BY HASH (id) INTO 4 BUCKETS",
    )
    .await
    .unwrap();
    update(
        &mut c,
        "INSERT INTO facts SELECT value, value * 2 FROM generate_series(1, 50000) AS t(value)",
    )
    .await
    .unwrap();
    update(
        &mut c,
        "CREATE TABLE dim (id BIGINT PRIMARY KEY, name STRING)",
    )
    .await
    .unwrap();
    update(
        &mut c,
        "INSERT INTO dim VALUES (1, 'first'), (25000, 'middle'), (50000, 'last'), (99999, 'none')",
    )
    .await
    .unwrap();
    let join = "SELECT d.name, f.v FROM facts f JOIN dim d ON f.id = d.id ORDER BY f.v";
    let expected = text(&mut c, join).await;
    assert!(expected.contains("| middle | 50000  |"), "{expected}");

    let facts_scan = |plan: String| -> String {
        (plan.lines())
            .find(|l| l.contains("NyalaScanExec: table=facts"))
            .unwrap_or_else(|| panic!("{plan}"))
            .to_string()
    };
    let count = |scan: &str, name: &str| -> u64 {
        let after = scan.split(name).nth(1).unwrap_or_else(|| panic!("{scan}"));
        after
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{scan}"))
    };
    // On the primary key the tablets look the 4 keys up instead of reading every row: only
    // the rows found are checked against the filter.
    let scan = facts_scan(text(&mut c, &format!("EXPLAIN ANALYZE {join}")).await);
    assert!(scan.contains("bloom(4 keys)"), "{scan}");
    assert_eq!(count(&scan, "output_rows="), 3, "{scan}");
    assert!(count(&scan, "checked=") < 100, "{scan}");
    // On another column every row is checked against the bloom filter of the 4 keys and
    // nearly all are removed in the tablets (a few false positives may pass).
    let on_v = "SELECT d.name, f.v FROM facts f JOIN dim d ON f.v = d.id ORDER BY f.v";
    assert!(text(&mut c, on_v).await.contains("| last   | 50000 |"));
    let scan = facts_scan(text(&mut c, &format!("EXPLAIN ANALYZE {on_v}")).await);
    assert!(scan.contains("bloom(4 keys)"), "{scan}");
    assert_eq!(count(&scan, "checked="), 50_000, "{scan}");
    assert!(count(&scan, "removed=") > 45_000, "{scan}");
    // Below an aggregate grouping by the join key, the keys still reach the scan: the 3 rows
    // are looked up and only their groups are built.
    let grouped = "SELECT d.name, a.total FROM dim d JOIN (SELECT id, sum(v) AS total FROM facts \
                   GROUP BY id) a ON a.id = d.id ORDER BY d.name";
    let rows = text(&mut c, grouped).await;
    assert!(rows.contains("| middle | 50000  |"), "{rows}");
    let scan = facts_scan(text(&mut c, &format!("EXPLAIN ANALYZE {grouped}")).await);
    assert!(scan.contains("bloom(4 keys)"), "{scan}");
    assert_eq!(count(&scan, "output_rows="), 3, "{scan}");

    update(&mut c, "SET nyala.runtime_filters = off")
        .await
        .unwrap();
    assert_eq!(text(&mut c, join).await, expected);
    let plan = text(&mut c, &format!("EXPLAIN ANALYZE {join}")).await;
    assert!(!plan.contains("runtime_filters="), "{plan}");
    let e = update(&mut c, "SET nyala.runtime_filters = maybe")
        .await
        .unwrap_err();
    assert!(e.contains("expected off, minmax or bloom"), "{e}");
    update(&mut c, "SET nyala.runtime_filters = bloom")
        .await
        .unwrap();

    // Writes that pick their rows with a join or a subquery change exactly those rows.
    let n = update(
        &mut c,
        "UPDATE facts SET v = 0 WHERE id IN (SELECT id FROM dim WHERE name <> 'last')",
    )
    .await
    .unwrap();
    assert_eq!(n, 2);
    let n = update(&mut c, "DELETE FROM facts WHERE id IN (SELECT id FROM dim)")
        .await
        .unwrap();
    assert_eq!(n, 3);
    let left = text(&mut c, "SELECT count(*), sum(v) FROM facts").await;
    let sum = (1..=50_000_i64).map(|i| i * 2).sum::<i64>() - 2 * 50_000 - 2 * 25_000 - 2;
    assert!(left.contains(&format!("| 49997    | {sum} ")), "{left}");
}

#[path = "support/slt.rs"]
mod slt;

#[path = "support/linearizability.rs"]
mod linearizability;
#[path = "support/proxy.rs"]
mod proxy;

/// Every `tests/slt/*.slt` file, each against a fresh server, through Flight SQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqllogictest_files_over_flight_sql() {
    // Cargo sets CARGO_MANIFEST_DIR when it runs the test; the compile-time value can name
    // another checkout when the build is reused from a shared target directory.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into());
    let dir = Path::new(&manifest).join("slt");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .slt files in {}", dir.display());
    let mut failures = Vec::new();
    for file in &files {
        let data = tempfile::tempdir().unwrap();
        let server = Server::start(data.path());
        let client = server.client().await;
        let mut runner = sqllogictest::Runner::new(move || {
            let client = client.clone();
            async move { Ok::<_, slt::FlightError>(slt::FlightDb { client }) }
        });
        if let Err(e) = runner.run_file_async(file).await {
            failures.push(format!("{}\n{}", file.display(), e.display(false)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The tablet endpoints of one FlightInfo read at one snapshot, taken at GetFlightInfo: rows
/// written between GetFlightInfo and the DoGets are not seen by any of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tablet_endpoints_read_one_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut c = server.client().await;
    update(
        &mut c,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) DISTRIBUTE BY HASH (id) INTO 4 BUCKETS",
    )
    .await
    .unwrap();
    update(
        &mut c,
        "INSERT INTO t SELECT value, value * 1 FROM generate_series(1, 1000) AS s(value)",
    )
    .await
    .unwrap();
    let info = c.execute("SELECT id, v FROM t".into(), None).await.unwrap();
    assert_eq!(info.endpoint.len(), 4);
    update(
        &mut c,
        "INSERT INTO t SELECT value, value * 1 FROM generate_series(1001, 2000) AS s(value)",
    )
    .await
    .unwrap();
    update(&mut c, "DELETE FROM t WHERE id <= 500")
        .await
        .unwrap();
    let mut seen = 0;
    for endpoint in info.endpoint {
        let stream = c.do_get(endpoint.ticket.unwrap()).await.unwrap();
        let batches: Vec<RecordBatch> = stream.try_collect().await.unwrap();
        seen += rows(&batches);
    }
    assert_eq!(
        seen, 1000,
        "the endpoints read the table as it was at GetFlightInfo"
    );
    assert!(text(&mut c, "SELECT count(*) FROM t")
        .await
        .contains("| 1500 "));
}

mod cluster {
    //! Tablet servers as separate processes (`nyala tserver`), replicating a tablet with Raft
    //! over internal RPC: the leader is killed with SIGKILL while clients write, writes resume
    //! on a new leader, the killed server comes back from its log, and every replica ends with
    //! every acknowledged row exactly once.

    use std::path::Path;
    use std::process::Child;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use arrow::array::{Array, Int64Array, RecordBatch, StringArray};
    use nyala_engine::client::meta_cache::TServerClient;
    use nyala_engine::rpc;
    use nyala_engine::rpc::proto::common::{Empty, Peer, ServerStatus};
    use nyala_engine::rpc::proto::tserver::{
        CreateReplicaRequest, ScanNextRequest, ScanOpenRequest, WriteRequest,
    };
    use nyala_engine::storage::{
        ColumnSchema, ColumnType, ScanSpec, Schema, Timestamp, WriteBatch, WriteKind,
    };

    use nyala_testkit::wait_until;

    use super::{linearizability, proxy};

    struct TabletServerProcess {
        child: Child,
        id: u64,
        addr: String,
    }

    impl TabletServerProcess {
        fn start(dir: &Path, addr: &str) -> Self {
            Self::start_with(dir, addr, &[])
        }

        fn start_with(dir: &Path, addr: &str, args: &[&str]) -> Self {
            Self::start_with_env(dir, addr, args, &[])
        }

        fn start_with_env(dir: &Path, addr: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
            let mut all = vec!["tserver", "--rpc-addr", addr];
            all.extend(args);
            let (child, line) = super::spawn_nyala_with_env(&all, dir, env);
            // "Nyala tablet server <id> listening on <addr> (data: ...)"
            let words: Vec<&str> = line.split_whitespace().collect();
            let id = words
                .get(3)
                .and_then(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("no server id in {line:?}"));
            Self {
                child,
                id,
                addr: words[6].to_string(),
            }
        }

        fn kill(&mut self) {
            self.child.kill().unwrap();
            self.child.wait().unwrap();
        }
    }

    impl Drop for TabletServerProcess {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// A `nyala master` process (catalog + Flight SQL); killed on drop.
    struct MasterProcess {
        child: Child,
    }

    impl MasterProcess {
        fn start(dir: &Path, rpc: &str, flight: &str) -> Self {
            Self::start_with(dir, rpc, flight, &[])
        }

        fn start_with(dir: &Path, rpc: &str, flight: &str, args: &[&str]) -> Self {
            Self::start_with_env(dir, rpc, flight, args, &[])
        }

        fn start_with_env(
            dir: &Path,
            rpc: &str,
            flight: &str,
            args: &[&str],
            env: &[(&str, &str)],
        ) -> Self {
            let mut all = vec!["master", "--rpc-addr", rpc, "--flight-addr", flight];
            all.extend(args);
            let (child, line) = super::spawn_nyala_with_env(&all, dir, env);
            assert!(line.contains("listening"), "{line}");
            Self { child }
        }
    }

    impl Drop for MasterProcess {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn start_tserver(dir: &Path, addr: &str, masters: &str) -> TabletServerProcess {
        TabletServerProcess::start_with(dir, addr, &["--masters", masters])
    }

    async fn sql(flight: &str, statement: &str) -> Result<Vec<RecordBatch>, String> {
        let channel = tonic::transport::Channel::from_shared(flight.to_string())
            .unwrap()
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let mut client = arrow_flight::sql::client::FlightSqlServiceClient::new(channel);
        // BACKUP and RESTORE answer with their steps, as queries do.
        let answers_rows = ["SELECT", "SHOW", "BACKUP", "RESTORE"];
        if answers_rows.iter().any(|word| statement.starts_with(word)) {
            super::query(&mut client, statement).await
        } else {
            client
                .execute_update(statement.to_string(), None)
                .await
                .map(|_| vec![])
                .map_err(|e| e.to_string())
        }
    }

    fn column_i64(batches: &[RecordBatch], c: usize) -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| {
                let a =
                    arrow::compute::cast(b.column(c), &arrow::datatypes::DataType::Int64).unwrap();
                a.as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .iter()
                    .flatten()
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// SQL over Flight against a master and three tablet servers: a table with three replicas
    /// per tablet takes writes from two clients while the leader of one of its tablets is
    /// killed; every acknowledged row is there exactly once, also after the whole cluster
    /// restarts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sql_on_a_cluster_survives_killing_a_leader_and_a_full_restart() {
        let mut cluster = TestCluster::start(3, &[]);
        let flight_url = cluster.url.clone();
        // The servers register with their first heartbeat.
        let create = "CREATE TABLE events (id BIGINT PRIMARY KEY, writer BIGINT) \
                      DISTRIBUTE BY HASH (id) INTO 3 BUCKETS WITH (replicas = 3)";
        ddl_when_ready(&flight_url, create).await;
        let replicas = sql(
            &flight_url,
            "SELECT replicas FROM sys.partitions WHERE table_name = 'events'",
        )
        .await
        .unwrap();
        assert_eq!(column_i64(&replicas, 0), vec![3, 3, 3]);
        let writers = Writers::start(&flight_url, "events", 10);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let leader_of_tablet_0 =
            "SELECT leader FROM sys.partitions WHERE table_name = 'events' AND tablet = 0";
        let victim = wait_until("tablet 0's leader", Duration::from_secs(20), || async {
            let leaders = sql(&flight_url, leader_of_tablet_0).await.unwrap();
            let leader =
                arrow::util::display::array_value_to_string(leaders[0].column(0), 0).unwrap();
            let victim = cluster.servers.iter().position(|s| s.addr == leader);
            victim.ok_or_else(|| format!("no leader reported: {leader:?}"))
        })
        .await;
        cluster.servers[victim].kill();
        let killed = Instant::now();
        // Reads may fail while the tablet changes leader (UNAVAILABLE: a replica still
        // applying writes of the old leader's term); they must work again within the wait.
        let count = |url: String| async move {
            loop {
                match sql(&url, "SELECT count(*) FROM events").await {
                    Ok(batches) => return column_i64(&batches, 0)[0],
                    Err(e) if killed.elapsed() < Duration::from_secs(30) => {
                        eprintln!("count during the failover: {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => panic!("reads did not resume: {e}"),
                }
            }
        };
        let before = count(flight_url.clone()).await;
        while count(flight_url.clone()).await <= before {
            assert!(
                killed.elapsed() < Duration::from_secs(30),
                "writes did not resume"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "leader killed; writes resumed within {:?}",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let acknowledged = writers.finish().await;
        let stored = stored_exactly_once(&flight_url, "events", &acknowledged, 10).await;
        // Restart everything: the catalog and every row come back.
        cluster.restart_server(victim);
        cluster.restart_all();
        let restored = "the stored rows after the restart";
        wait_until(restored, Duration::from_secs(30), || async {
            let batches = sql(&flight_url, "SELECT id FROM events").await?;
            let mut after = column_i64(&batches, 0);
            after.sort_unstable();
            match after == stored {
                true => Ok(()),
                false => Err("rows differ after the restart".to_string()),
            }
        })
        .await;
    }

    /// A bank: transfers between two accounts are one UPDATE each (the two rows are often in
    /// different tablets, so it is a transaction), run by two clients while the leader of a
    /// tablet is killed and restarted. Every snapshot a reader sees holds the same total and
    /// every account, and so does the end; the transfers acknowledged moved money.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bank_transfers_keep_the_total_under_leader_kills() {
        const ACCOUNTS: i64 = 16;
        const TOTAL: i64 = ACCOUNTS * 100;
        let mut cluster = TestCluster::start(3, &[]);
        let url = cluster.url.clone();
        let create = "CREATE TABLE bank (id BIGINT PRIMARY KEY, balance BIGINT) \
                      DISTRIBUTE BY HASH (id) INTO 4 BUCKETS WITH (replicas = 3)";
        ddl_when_ready(&url, create).await;
        sql(
            &url,
            &format!("INSERT INTO bank SELECT value, 100 FROM generate_series(1, {ACCOUNTS})"),
        )
        .await
        .unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let running = || !stop.load(std::sync::atomic::Ordering::Acquire);
        let transfers = (0..2u64).map(|seed| {
            let (url, stop) = (url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut state = 0x9E3779B97F4A7C15u64 ^ seed;
                let mut acknowledged = 0;
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let from = (state % ACCOUNTS as u64) as i64 + 1;
                    let to = from % ACCOUNTS + 1;
                    let amount = (state >> 32) % 10 + 1;
                    let transfer = format!(
                        "UPDATE bank SET balance = balance + CASE WHEN id = {from} \
                         THEN -{amount} ELSE {amount} END WHERE id IN ({from}, {to})"
                    );
                    match sql(&url, &transfer).await {
                        Ok(_) => acknowledged += 1,
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
                acknowledged
            })
        });
        let transfers: Vec<_> = transfers.collect();
        let reader = {
            let (url, stop) = (url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut snapshots = 0;
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    let read = "SELECT sum(balance), count(*) FROM bank";
                    if let Ok(batches) = sql(&url, read).await {
                        let (sum, count) = (column_i64(&batches, 0), column_i64(&batches, 1));
                        assert_eq!(
                            (sum[0], count[0]),
                            (TOTAL, ACCOUNTS),
                            "a snapshot saw half a transfer"
                        );
                        snapshots += 1;
                    }
                }
                snapshots
            })
        };
        tokio::time::sleep(Duration::from_secs(2)).await;
        let leaders = sql(
            &url,
            "SELECT leader FROM sys.partitions WHERE table_name = 'bank' AND tablet = 0",
        )
        .await
        .unwrap();
        let leader = arrow::util::display::array_value_to_string(leaders[0].column(0), 0).unwrap();
        let victim = cluster
            .servers
            .iter()
            .position(|s| s.addr == leader)
            .unwrap_or(0);
        cluster.servers[victim].kill();
        tokio::time::sleep(Duration::from_secs(3)).await;
        cluster.restart_server(victim);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(running());
        stop.store(true, std::sync::atomic::Ordering::Release);
        let mut acknowledged = 0;
        for transfer in transfers {
            acknowledged += transfer.await.unwrap();
        }
        let snapshots = reader.await.unwrap();
        eprintln!("{acknowledged} transfers acknowledged, {snapshots} snapshots checked");
        assert!(acknowledged > 0 && snapshots > 0);
        let read = "SELECT sum(balance), count(*) FROM bank";
        let batches = wait_until(
            "the bank to be read after the kill",
            Duration::from_secs(30),
            || sql(&url, read),
        )
        .await;
        assert_eq!(
            (column_i64(&batches, 0)[0], column_i64(&batches, 1)[0]),
            (TOTAL, ACCOUNTS)
        );
    }

    /// A statement writing every tablet of a three-server cluster (so a transaction) while a
    /// process crashes at a step of its commit: the coordinator once every participant has
    /// prepared (nothing decided: it must abort everywhere), the coordinator once the commit
    /// is recorded (it must commit everywhere), and a participant's leader once its prepare is
    /// applied (either, but everywhere). Once the process is back, the statement's rows are all
    /// there or none are, what the client was told holds, and the keys are free again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_at_any_step_of_a_commit_commits_everywhere_or_nowhere() {
        // Enough rows that the statement writes every tablet.
        const ROWS: i64 = 64;
        let mut cluster = TestCluster::start(3, &[]);
        let url = cluster.url.clone();
        let create = "CREATE TABLE t (id BIGINT PRIMARY KEY, step BIGINT) \
                      DISTRIBUTE BY HASH (id) INTO 4 BUCKETS WITH (replicas = 3)";
        ddl_when_ready(&url, create).await;
        // The first transaction creates the transaction status table, before any crash.
        let insert = |step: i64| {
            format!(
                "INSERT INTO t SELECT value + {step} * 100, {step} FROM generate_series(1, {ROWS})"
            )
        };
        sql(&url, &insert(0)).await.unwrap();
        let count = |step: i64| {
            let url = url.clone();
            async move {
                let read = format!("SELECT count(*) FROM t WHERE step = {step}");
                sql(&url, &read).await.map(|b| column_i64(&b, 0)[0])
            }
        };
        let steps = [
            (1, "txn-prepared", Some(0)),
            (2, "txn-decided", Some(ROWS)),
            (3, "txn-participant-prepared", None),
        ];
        for (step, crash_at, outcome) in steps {
            let env = [("NYALA_CRASH_AT", crash_at)];
            let crashing_server = match crash_at {
                "txn-participant-prepared" => {
                    cluster.servers[0].kill();
                    cluster.servers[0] = cluster.server_with_env(0, &env);
                    // Restarted, it leads nothing: it must lead a participant to crash.
                    let leads = cluster.lead_a_tablet(0, "t").await;
                    eprintln!("step 3: tablet server 0 leads a tablet of t: {leads}");
                    Some(0)
                }
                _ => {
                    cluster.start_master_with_env(&env);
                    None
                }
            };
            // The statement runs until the process crashes (a participant's crash may leave it
            // to finish through other replicas).
            let answer = format!("step {step}'s answer");
            let acknowledged = wait_until(&answer, Duration::from_secs(30), || async {
                match sql(&url, &insert(step)).await {
                    Ok(_) => Ok(true),
                    Err(e) if e.contains("duplicate") => Ok(true),
                    Err(_) if crashing_server.is_none() => Ok(false),
                    Err(e) => Err(e),
                }
            })
            .await;
            match crashing_server {
                Some(i) => {
                    // It crashed if it still led a participant when the statement ran (when
                    // it got a leadership, in every run seen; else the statement ran without
                    // it).
                    let child = &mut cluster.servers[i].child;
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    eprintln!("step {step}: tablet server exited: {:?}", child.try_wait());
                    let _ = child.kill();
                    let _ = child.wait();
                    cluster.restart_server(i);
                }
                None => {
                    assert!(!acknowledged, "step {step}: the coordinator did not crash");
                    cluster.start_master();
                }
            }
            // The tablets end the transaction: as decided, or aborted.
            let resolved = format!("step {step} to be resolved");
            let stored = wait_until(&resolved, Duration::from_secs(60), || async {
                match count(step).await {
                    Ok(n) if Some(n) == outcome || (outcome.is_none() && (n == 0 || n == ROWS)) => {
                        Some(n)
                    }
                    Ok(n) => {
                        assert!(
                            n == 0 || n == ROWS,
                            "step {step}: {n} of the statement's {ROWS} rows are visible"
                        );
                        None
                    }
                    Err(_) => None,
                }
            })
            .await;
            eprintln!("step {step} ({crash_at}): acknowledged {acknowledged}, {stored} rows");
            if acknowledged {
                assert_eq!(
                    stored, ROWS,
                    "step {step}: an acknowledged statement was lost"
                );
            }
            if stored == 0 {
                // Its keys are free: the same statement now commits whole.
                let unlocked = format!("step {step}'s keys to be unlocked");
                let statement = insert(step);
                wait_until(&unlocked, Duration::from_secs(30), || sql(&url, &statement)).await;
                assert_eq!(count(step).await.unwrap(), ROWS);
            }
        }
        assert_eq!(count(0).await.unwrap(), ROWS);
    }

    /// Single-row reads and writes by four clients through the master, while one tablet
    /// server at a time is cut off from all the others (or from all but the master) by a
    /// network partition (every server is reached through a proxy that cuts connections) and
    /// then healed: each key's history
    /// must be linearizable (a write acknowledged is seen by every read that starts after it,
    /// reads never go back in time). `NYALA_PARTITION_SECS` sets the length of the run
    /// (default 20; the long run, `single_row_operations_stay_linearizable_for_ten_minutes`,
    /// is ignored unless asked for).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn single_row_operations_stay_linearizable_across_partitions() {
        partition_run(env_or("NYALA_PARTITION_SECS", 20)).await;
    }

    /// The long partition run (see the README's Tests section).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "ten minutes; run with --ignored"]
    async fn single_row_operations_stay_linearizable_for_ten_minutes() {
        partition_run(600).await;
    }

    async fn partition_run(seconds: u64) {
        use linearizability::{check, Kind, Op};
        const KEYS: i64 = 4;
        let network = proxy::Network::new();
        let master_dir = tempfile::tempdir().unwrap();
        let (master_rpc, master_proxy, flight) = (free_port(), free_port(), free_port());
        let master = MasterProcess::start(master_dir.path(), &master_rpc, &flight);
        network.set_pid(0, master.child.id());
        network.proxy(0, &master_proxy, master_rpc.clone()).await;
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let mut servers = Vec::new();
        let mut advertised_addrs = Vec::new();
        for (i, dir) in dirs.iter().enumerate() {
            let (real, advertised) = (free_port(), free_port());
            advertised_addrs.push(advertised.clone());
            network.proxy(i + 1, &advertised, real.clone()).await;
            let args = ["--masters", &master_proxy, "--rpc-advertise", &advertised];
            let server = TabletServerProcess::start_with(dir.path(), &real, &args);
            network.set_pid(i + 1, server.child.id());
            servers.push(server);
        }
        let url = format!("http://{flight}");
        let create = "CREATE TABLE reg (id BIGINT PRIMARY KEY, v BIGINT) \
                      DISTRIBUTE BY HASH (id) INTO 2 BUCKETS WITH (replicas = 3)";
        ddl_when_ready(&url, create).await;
        let started = Instant::now();
        let now = move || started.elapsed().as_micros() as u64;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clients: Vec<_> = (0..4i64)
            .map(|client| {
                let (url, stop) = (url.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut history: Vec<(i64, Op)> = Vec::new();
                    let mut state = 0x2545F4914F6CDD1Du64 ^ client as u64;
                    let mut written = 0;
                    while !stop.load(std::sync::atomic::Ordering::Acquire) {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        let key = (state % KEYS as u64) as i64;
                        let write = (state >> 8) % 2 == 0;
                        let value = client * 1_000_000 + written;
                        let statement = match write {
                            true => format!("UPSERT INTO reg VALUES ({key}, {value})"),
                            false => format!("SELECT v FROM reg WHERE id = {key}"),
                        };
                        let invoked = now();
                        let answer =
                            tokio::time::timeout(Duration::from_secs(3), sql(&url, &statement))
                                .await;
                        let returned = now();
                        let kind = match (write, answer) {
                            (true, Ok(Ok(_))) => Some((Kind::Write(Some(value)), Some(returned))),
                            (true, _) => Some((Kind::Write(Some(value)), None)),
                            (false, Ok(Ok(batches))) => {
                                let values = column_i64(&batches, 0);
                                assert!(values.len() <= 1, "key {key} read {values:?}");
                                Some((Kind::Read(values.first().copied()), Some(returned)))
                            }
                            (false, _) => None,
                        };
                        if write {
                            written += 1;
                        }
                        if let Some((kind, returned)) = kind {
                            let op = Op {
                                kind,
                                invoked,
                                returned,
                            };
                            history.push((key, op));
                        }
                    }
                    history
                })
            })
            .collect();
        // The nemesis: every few seconds, cut a tablet server off (the leader of a tablet, or
        // any), then heal.
        let mut state = 0x9E3779B97F4A7C15u64;
        let mut partitions = 0;
        while started.elapsed() < Duration::from_secs(seconds) {
            tokio::time::sleep(Duration::from_secs(2)).await;
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let leader = format!(
                "SELECT leader FROM sys.partitions WHERE table_name = 'reg' AND tablet = {}",
                state % 2
            );
            let leader = match sql(&url, &leader).await {
                Ok(b) if b.first().is_some_and(|b| b.num_rows() > 0) => {
                    arrow::util::display::array_value_to_string(b[0].column(0), 0).ok()
                }
                _ => None,
            };
            let victim = match leader.and_then(|l| advertised_addrs.iter().position(|a| *a == l)) {
                Some(i) if (state >> 16) % 4 != 0 => i + 1,
                _ => 1 + ((state >> 24) % 3) as usize,
            };
            // Half the time the master still reaches it (so may take it for a leader still).
            match (state >> 32) % 2 {
                0 => network.isolate(victim),
                _ => network.cut_off(victim, &[0]),
            }
            partitions += 1;
            tokio::time::sleep(Duration::from_secs(3)).await;
            network.heal();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.store(true, std::sync::atomic::Ordering::Release);
        let mut histories: Vec<Vec<Op>> = vec![Vec::new(); KEYS as usize];
        for client in clients {
            for (key, op) in client.await.unwrap() {
                histories[key as usize].push(op);
            }
        }
        let acknowledged: usize = (histories.iter().flatten())
            .filter(|op| op.returned.is_some())
            .count();
        let unknown = histories.iter().flatten().count() - acknowledged;
        let (opened, cut) = network.connections();
        eprintln!(
            "{partitions} partitions cut {cut} of {opened} connections; {acknowledged} \
             operations acknowledged, {unknown} writes of unknown outcome"
        );
        assert!(acknowledged > 0 && cut > 0);
        for (key, ops) in histories.iter().enumerate() {
            if let Err(e) = check(None, ops) {
                panic!("key {key}: {e}");
            }
        }
        drop(servers);
    }

    /// Jepsen's Kudu tests, from the outside: a master and `servers` tablet servers (every
    /// server reached through a proxy that can cut it off), six clients each connected to
    /// the Flight SQL port of a different tablet server doing single-key reads, UPSERTs of
    /// values unique in the run and compare-and-set UPDATEs on a few keys, two clients moving
    /// money between five accounts in `BEGIN ... COMMIT`, and readers of `sum(bal)` (alone and
    /// in a transaction). Meanwhile, every 2 to 5 s, one of: kill -9 and restart of a tablet
    /// server on its directory, SIGSTOP/SIGCONT of a tablet server or of the master for 1 to
    /// 4 s, kill -9 and restart of the master, a tablet server cut off from the others. Each
    /// key's history must be linearizable as a compare-and-set register, and every total the
    /// same. `NYALA_FAULT_SECS` sets the length of the run (default 25; the long runs are
    /// ignored unless asked for), `NYALA_FAULT_SERVERS` the tablet servers (3), and
    /// `NYALA_FAULT_SEED` repeats a run (each run prints its own).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_writes_and_transfers_stay_correct_under_faults() {
        let servers = env_or("NYALA_FAULT_SERVERS", 3);
        fault_run(servers, env_or("NYALA_FAULT_SECS", 25)).await;
    }

    /// The long fault runs (see the manual's testing page): five minutes with 3 and with 5
    /// tablet servers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "five minutes; run with --ignored"]
    async fn reads_writes_and_transfers_stay_correct_under_faults_for_five_minutes() {
        fault_run(3, 300).await;
        fault_run(5, 300).await;
    }

    /// A tablet server of a fault run: where it listens, what it runs as.
    struct FaultServer {
        dir: tempfile::TempDir,
        real: String,
        advertised: String,
        flight: String,
        process: Option<TabletServerProcess>,
    }

    impl FaultServer {
        fn start(&mut self, masters: &str) -> u32 {
            let args = [
                "--masters",
                masters,
                "--rpc-advertise",
                &self.advertised,
                "--flight-addr",
                &self.flight,
            ];
            let process = TabletServerProcess::start_with(self.dir.path(), &self.real, &args);
            let pid = process.child.id();
            self.process = Some(process);
            pid
        }
    }

    fn signal(pid: u32, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// A pseudo-random number generator (xorshift), so a run can be repeated.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: u64) -> u64 {
            (self.next() >> 11) % n
        }
    }

    async fn fault_run(servers: usize, seconds: u64) {
        use linearizability::{check, Kind, Op};
        const KEYS: i64 = 5;
        const ACCOUNTS: i64 = 5;
        const TOTAL: i64 = 500;
        // The faults and the clients' choices follow from one seed, printed to repeat a run.
        let seed = env_or(
            "NYALA_FAULT_SEED",
            (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH))
                .unwrap()
                .as_nanos() as u64
                | 1,
        );
        eprintln!("fault run with {servers} tablet servers, NYALA_FAULT_SEED={seed}");
        let network = proxy::Network::new();
        let master_dir = tempfile::tempdir().unwrap();
        let (master_rpc, master_proxy, master_flight) = (free_port(), free_port(), free_port());
        let mut master = Some(MasterProcess::start(
            master_dir.path(),
            &master_rpc,
            &master_flight,
        ));
        network.set_pid(0, master.as_ref().unwrap().child.id());
        network.proxy(0, &master_proxy, master_rpc.clone()).await;
        let mut tservers: Vec<FaultServer> = Vec::new();
        for i in 0..servers {
            let mut server = FaultServer {
                dir: tempfile::tempdir().unwrap(),
                real: free_port(),
                advertised: free_port(),
                flight: free_port(),
                process: None,
            };
            network
                .proxy(i + 1, &server.advertised, server.real.clone())
                .await;
            network.set_pid(i + 1, server.start(&master_proxy));
            tservers.push(server);
        }
        let urls: Vec<String> = (tservers.iter())
            .map(|s| format!("http://{}", s.flight))
            .collect();
        let master_url = format!("http://{master_flight}");
        ddl_when_ready(
            &master_url,
            "CREATE TABLE reg (id BIGINT PRIMARY KEY, v BIGINT) \
             DISTRIBUTE BY HASH (id) INTO 2 BUCKETS WITH (replicas = 3)",
        )
        .await;
        ddl_when_ready(
            &master_url,
            "CREATE TABLE bank (id BIGINT PRIMARY KEY, bal BIGINT) \
             DISTRIBUTE BY HASH (id) INTO 3 BUCKETS WITH (replicas = 3)",
        )
        .await;
        let accounts: Vec<String> = (0..ACCOUNTS)
            .map(|a| format!("({a}, {})", TOTAL / ACCOUNTS))
            .collect();
        let insert = format!("INSERT INTO bank VALUES {}", accounts.join(", "));
        ddl_when_ready(&master_url, &insert).await;

        let started = Instant::now();
        let now = move || started.elapsed().as_micros() as u64;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let running = |stop: &Arc<std::sync::atomic::AtomicBool>| {
            !stop.load(std::sync::atomic::Ordering::Acquire)
        };
        // The register clients: each on its own tablet server.
        let registers: Vec<_> = (0..6i64)
            .map(|client| {
                let (url, stop) = (urls[client as usize % servers].clone(), stop.clone());
                tokio::spawn(async move {
                    let mut history: Vec<(i64, Op)> = Vec::new();
                    let mut rng = Rng(seed ^ (0x2545F4914F6CDD1D + client as u64));
                    let mut last_read = [None; KEYS as usize];
                    let mut written = 0;
                    while running(&stop) {
                        let key = rng.below(KEYS as u64) as i64;
                        written += 1;
                        let value = client * 1_000_000 + written;
                        let (statement, kind) = match (rng.below(3), last_read[key as usize]) {
                            (0, _) => (
                                format!("SELECT v FROM reg WHERE id = {key}"),
                                Kind::Read(None),
                            ),
                            (1, Some(old)) => (
                                format!(
                                    "UPDATE reg SET v = {value} WHERE id = {key} AND v = {old}"
                                ),
                                Kind::Cas(old, value),
                            ),
                            _ => (
                                format!("UPSERT INTO reg VALUES ({key}, {value})"),
                                Kind::Write(Some(value)),
                            ),
                        };
                        // A server that cannot be reached gets no request: nothing to record.
                        let Ok(channel) = connect(&url).await else {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        };
                        let mut session =
                            arrow_flight::sql::client::FlightSqlServiceClient::new(channel);
                        let invoked = now();
                        let call = async {
                            match &kind {
                                Kind::Read(_) => {
                                    let batches = super::query(&mut session, &statement).await?;
                                    let values = column_i64(&batches, 0);
                                    assert!(values.len() <= 1, "key {key} read {values:?}");
                                    Ok(values.first().copied())
                                }
                                _ => super::update(&mut session, &statement).await.map(Some),
                            }
                        };
                        let answer = tokio::time::timeout(Duration::from_secs(5), call).await;
                        let returned = now();
                        let answer = answer.map_err(|_| "timed out".to_string()).and_then(|a| a);
                        let (kind, returned) = match (kind, answer) {
                            (Kind::Read(_), Ok(value)) => {
                                last_read[key as usize] = value;
                                (Kind::Read(value), Some(returned))
                            }
                            // A read that failed says nothing.
                            (Kind::Read(_), Err(_)) => continue,
                            (Kind::Cas(old, new), Ok(Some(1))) => {
                                (Kind::Cas(old, new), Some(returned))
                            }
                            (Kind::Cas(old, _), Ok(Some(0))) => {
                                (Kind::CasFailed(old), Some(returned))
                            }
                            (Kind::Cas(_, _), Ok(rows)) => {
                                panic!("a compare-and-set of one key changed {rows:?} rows")
                            }
                            (kind, Ok(_)) => (kind, Some(returned)),
                            (kind, Err(_)) => (kind, None),
                        };
                        history.push((
                            key,
                            Op {
                                kind,
                                invoked,
                                returned,
                            },
                        ));
                    }
                    history
                })
            })
            .collect();
        // Transfers, and readers of the total: each on its own tablet server.
        let bank: Vec<_> = (0..4usize)
            .map(|client| {
                let (url, stop) = (urls[(client + 1) % servers].clone(), stop.clone());
                tokio::spawn(async move {
                    let mut rng = Rng(seed ^ (0x9E3779B97F4A7C15 + client as u64));
                    let (mut transfers, mut totals) = (0, 0);
                    while running(&stop) {
                        let Ok(channel) = connect(&url).await else {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        };
                        let mut session =
                            arrow_flight::sql::client::FlightSqlServiceClient::new(channel);
                        let (from, to) = (rng.below(ACCOUNTS as u64), rng.below(ACCOUNTS as u64));
                        let amount = 1 + rng.below(5);
                        let statements: Vec<String> = match (client % 2, rng.below(2)) {
                            (0, _) => vec![
                                "BEGIN".into(),
                                format!("UPDATE bank SET bal = bal - {amount} WHERE id = {from}"),
                                format!("UPDATE bank SET bal = bal + {amount} WHERE id = {to}"),
                                "COMMIT".into(),
                            ],
                            (_, 0) => vec!["SELECT sum(bal) FROM bank".into()],
                            _ => vec![
                                "BEGIN".into(),
                                "SELECT sum(bal) FROM bank".into(),
                                "COMMIT".into(),
                            ],
                        };
                        let run = async {
                            let mut total = None;
                            for statement in &statements {
                                if statement.starts_with("SELECT") {
                                    let batches = super::query(&mut session, statement).await?;
                                    total = column_i64(&batches, 0).first().copied();
                                } else {
                                    super::update(&mut session, statement).await?;
                                }
                            }
                            Ok::<_, String>(total)
                        };
                        match tokio::time::timeout(Duration::from_secs(5), run).await {
                            Ok(Ok(Some(total))) => {
                                assert_eq!(total, TOTAL, "a total of the accounts: {statements:?}");
                                totals += 1;
                            }
                            Ok(Ok(None)) => transfers += 1,
                            _ => {}
                        }
                    }
                    (transfers, totals)
                })
            })
            .collect();

        // The nemesis.
        let mut rng = Rng(seed ^ 0xD1B54A32D192ED03);
        let mut faults: Vec<String> = Vec::new();
        while started.elapsed() < Duration::from_secs(seconds) {
            tokio::time::sleep(Duration::from_millis(2000 + rng.below(3000))).await;
            let victim = rng.below(servers as u64) as usize;
            let pause = Duration::from_millis(1000 + rng.below(3000));
            match rng.below(5) {
                0 => {
                    let server = &mut tservers[victim];
                    if let Some(mut process) = server.process.take() {
                        process.kill();
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    network.set_pid(victim + 1, server.start(&master_proxy));
                    faults.push(format!("kill -9 and restart of tablet server {victim}"));
                }
                1 => {
                    let pid = tservers[victim].process.as_ref().unwrap().child.id();
                    signal(pid, "-STOP");
                    tokio::time::sleep(pause).await;
                    signal(pid, "-CONT");
                    faults.push(format!("tablet server {victim} paused for {pause:?}"));
                }
                2 => {
                    let pid = master.as_ref().unwrap().child.id();
                    signal(pid, "-STOP");
                    tokio::time::sleep(pause).await;
                    signal(pid, "-CONT");
                    faults.push(format!("master paused for {pause:?}"));
                }
                3 => {
                    drop(master.take());
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    let restarted =
                        MasterProcess::start(master_dir.path(), &master_rpc, &master_flight);
                    network.set_pid(0, restarted.child.id());
                    master = Some(restarted);
                    faults.push("kill -9 and restart of the master".into());
                }
                _ => {
                    network.isolate(victim + 1);
                    tokio::time::sleep(pause).await;
                    network.heal();
                    faults.push(format!("tablet server {victim} cut off for {pause:?}"));
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.store(true, std::sync::atomic::Ordering::Release);
        let mut histories: Vec<Vec<Op>> = vec![Vec::new(); KEYS as usize];
        for client in registers {
            for (key, op) in client.await.unwrap() {
                histories[key as usize].push(op);
            }
        }
        let (mut transfers, mut totals) = (0, 0);
        for client in bank {
            let (t, s) = client.await.unwrap();
            transfers += t;
            totals += s;
        }
        let acknowledged: usize = (histories.iter().flatten())
            .filter(|op| op.returned.is_some())
            .count();
        let unknown = histories.iter().flatten().count() - acknowledged;
        let cas = (histories.iter().flatten())
            .filter(|op| matches!(op.kind, Kind::Cas(..)) && op.returned.is_some())
            .count();
        eprintln!(
            "{servers} tablet servers, {} faults ({}); {acknowledged} register operations \
             acknowledged ({cas} compare-and-sets took effect), {unknown} of unknown outcome; \
             {transfers} transfers committed, {totals} totals read",
            faults.len(),
            faults.join(", ")
        );
        assert!(acknowledged > 0 && transfers > 0 && totals > 0);
        for (key, ops) in histories.iter().enumerate() {
            if let Err(e) = check(None, ops) {
                panic!("key {key}: {e}");
            }
        }
        // After the faults, the money is all there.
        let b = wait_until("the bank to be read", Duration::from_secs(30), || {
            sql(&urls[0], "SELECT sum(bal) FROM bank")
        })
        .await;
        assert_eq!(column_i64(&b, 0), vec![TOTAL]);
        drop(tservers);
    }

    async fn connect(flight: &str) -> Result<tonic::transport::Channel, String> {
        let endpoint = tonic::transport::Channel::from_shared(flight.to_string()).unwrap();
        endpoint.connect().await.map_err(|e| e.to_string())
    }

    /// A queue table in a cluster: positions keep increasing after its tablet's leader is
    /// killed and another takes over, and a long-polling tail through the master wakes when a
    /// row commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queue_positions_increase_across_a_leader_change() {
        let mut cluster = TestCluster::start(3, &[]);
        let url = cluster.url.clone();
        let create = "CREATE TABLE inbox (user_id STRING, pos BIGINT GENERATED ALWAYS AS \
                      POSITION, body STRING, PRIMARY KEY (user_id, pos)) WITH (replicas = 3)";
        ddl_when_ready(&url, create).await;
        let insert = |body: String| {
            let url = url.clone();
            async move {
                let statement =
                    format!("INSERT INTO inbox (user_id, body) VALUES ('u1', '{body}')");
                wait_until("an insert into the queue", Duration::from_secs(30), || {
                    sql(&url, &statement)
                })
                .await;
            }
        };
        for i in 0..5 {
            insert(format!("before-{i}")).await;
        }
        let positions = |url: String| async move {
            let read = "SELECT pos FROM tail('inbox', 0, 0) WHERE user_id = 'u1'";
            column_i64(&sql(&url, read).await.unwrap(), 0)
        };
        let before = positions(url.clone()).await;
        assert_eq!(before.len(), 5);
        let tablet = "SELECT leader FROM sys.partitions WHERE table_name = 'inbox'";
        let leaders = sql(&url, tablet).await.unwrap();
        let leader = arrow::util::display::array_value_to_string(leaders[0].column(0), 0).unwrap();
        let victim = cluster.servers.iter().position(|s| s.addr == leader);
        cluster.servers[victim.expect("the queue's tablet has a leader")].kill();
        // A consumer long-polls from the last position while a new leader is elected.
        let last = *before.last().unwrap();
        let consumer = {
            let url = url.clone();
            tokio::spawn(async move {
                let read = format!(
                    "SELECT pos, body FROM tail('inbox', {last}, 20000) WHERE user_id = 'u1'"
                );
                let rows = wait_until("rows in the tail", Duration::from_secs(60), || async {
                    let rows = sql(&url, &read).await.ok()?;
                    (rows.iter().map(|b| b.num_rows()).sum::<usize>() > 0).then_some(rows)
                })
                .await;
                column_i64(&rows, 0)
            })
        };
        for i in 0..5 {
            insert(format!("after-{i}")).await;
        }
        let woken = consumer.await.unwrap();
        assert!(woken.iter().all(|&p| p > last), "{woken:?} after {last}");
        let all = positions(url.clone()).await;
        assert_eq!(all.len(), 10);
        assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
        assert_eq!(&all[..5], &before[..]);
    }

    /// A clone in a cluster: every replica of each source tablet clones it in its own data
    /// directory (hard links), through the tablet's log; the clone's tablets are Raft groups of
    /// their own, which keep serving when a server is killed, and outlive the source.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_replica_clones_its_tablet_and_the_clone_survives_a_kill() {
        let mut cluster = TestCluster::start(3, &[]);
        let url = cluster.url.clone();
        ddl_when_ready(
            &url,
            "CREATE TABLE src (id BIGINT PRIMARY KEY, v STRING) \
             DISTRIBUTE BY HASH (id) INTO 2 BUCKETS WITH (replicas = 3)",
        )
        .await;
        let values: Vec<String> = (0..200).map(|i| format!("({i}, 'v{i}')")).collect();
        until_ok(
            &url,
            &format!("UPSERT INTO src VALUES {}", values.join(", ")),
        )
        .await;
        until_ok(&url, "CREATE TABLE copy CLONE src").await;
        let count = |table: &str| {
            let (url, read) = (url.clone(), format!("SELECT count(*) FROM {table}"));
            async move { column_i64(&until_ok(&url, &read).await, 0)[0] }
        };
        assert_eq!(count("copy").await, 200);
        // Each server holds its own replica of both clone tablets, linked to its source files.
        for dir in &cluster.dirs {
            let linked = linked_rowsets(&dir.path().join("tablets"));
            assert!(
                linked >= 4,
                "{linked} linked rowset files in {}",
                dir.path().display()
            );
        }
        until_ok(&url, "DELETE FROM src WHERE id < 100").await;
        until_ok(&url, "UPSERT INTO copy VALUES (1000, 'new')").await;
        assert_eq!((count("src").await, count("copy").await), (100, 201));
        // A server goes down: the clone's groups elect leaders among the others.
        cluster.servers[0].kill();
        until_ok(&url, "UPSERT INTO copy VALUES (1001, 'newer')").await;
        assert_eq!(count("copy").await, 202);
        cluster.restart_server(0);
        until_ok(&url, "DROP TABLE src").await;
        assert_eq!(count("copy").await, 202);
    }

    /// Runs `statement` until it succeeds (30 s at most): a retry must be harmless.
    async fn until_ok(url: &str, statement: &str) -> Vec<RecordBatch> {
        wait_until(statement, Duration::from_secs(30), || sql(url, statement)).await
    }

    /// Files named `rowset-*` under the tablet directories in `tablets` that have another link.
    fn linked_rowsets(tablets: &Path) -> usize {
        use std::os::unix::fs::MetadataExt;
        let mut linked = 0;
        for tablet in std::fs::read_dir(tablets).unwrap() {
            let data = tablet.unwrap().path().join("data");
            for file in std::fs::read_dir(data).into_iter().flatten() {
                let file = file.unwrap();
                let rowset = file.file_name().to_string_lossy().starts_with("rowset-");
                linked += usize::from(rowset && file.metadata().unwrap().nlink() > 1);
            }
        }
        linked
    }

    /// Writers insert rows through the master while tablet servers (and sometimes the master)
    /// are killed with SIGKILL and restarted at random, one process down at a time (kills land
    /// in the middle of statements' transactions: writes, prepares, decisions, commits); at the
    /// end every acknowledged row is stored exactly once and every statement whole or absent. `NYALA_FAULT_ROUNDS` sets the number of
    /// kills (default 4; the long run in the README uses 50).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn random_process_kills_lose_no_acknowledged_row() {
        let rounds: usize = env_or("NYALA_FAULT_ROUNDS", 4);
        let mut cluster = TestCluster::start(3, &[]);
        let url = cluster.url.clone();
        let create = "CREATE TABLE facts (id BIGINT PRIMARY KEY, w BIGINT) \
                      DISTRIBUTE BY HASH (id) INTO 3 BUCKETS WITH (replicas = 3)";
        ddl_when_ready(&url, create).await;
        let writers = Writers::start(&url, "facts", 5);
        // A small deterministic generator: which process, how long it stays down.
        let mut state = 0x2545F4914F6CDD1Du64;
        let mut random = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for round in 0..rounds {
            tokio::time::sleep(Duration::from_millis(500 + random(1500))).await;
            let victim = random(4) as usize;
            let down = Duration::from_millis(200 + random(2000));
            if victim == 3 {
                cluster.master = None;
                tokio::time::sleep(down).await;
                cluster.start_master();
            } else {
                cluster.servers[victim].kill();
                tokio::time::sleep(down).await;
                cluster.restart_server(victim);
            }
            eprintln!("fault round {round}: killed {victim} for {down:?}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let acknowledged = writers.finish().await;
        assert!(!acknowledged.is_empty());
        let stored = stored_exactly_once(&url, "facts", &acknowledged, 5).await;
        eprintln!(
            "{} rows acknowledged, {} stored, after {rounds} kills",
            acknowledged.len(),
            stored.len()
        );
    }

    /// Three masters replicate the catalog: DDL runs on the one that leads it (the others say
    /// which one does), every master serves queries and writes, and when the leading master is
    /// killed another takes over DDL while new clients keep working.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_masters_survive_losing_the_leader() {
        let master_dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let rpcs: Vec<String> = (0..3).map(|_| free_port()).collect();
        let flights: Vec<String> = (0..3).map(|_| free_port()).collect();
        let list = rpcs.join(",");
        let mut masters: Vec<Option<MasterProcess>> = (0..3)
            .map(|i| {
                Some(MasterProcess::start_with(
                    master_dirs[i].path(),
                    &rpcs[i],
                    &flights[i],
                    &["--masters", &list],
                ))
            })
            .collect();
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let _servers: Vec<TabletServerProcess> = (0..3)
            .map(|i| start_tserver(dirs[i].path(), &free_port(), &list))
            .collect();
        let urls: Vec<String> = flights.iter().map(|f| format!("http://{f}")).collect();
        // DDL succeeds on the leading master; the others name it.
        let ddl = |statement: String, alive: Vec<usize>| {
            let urls = urls.clone();
            async move {
                let taken = format!("a master to take {statement}");
                wait_until(&taken, Duration::from_secs(30), || async {
                    for &i in &alive {
                        match sql(&urls[i], &statement).await {
                            Ok(_) => return Some(i),
                            Err(e) => assert!(
                                e.contains("does not lead the catalog")
                                    || e.contains("replicas")
                                    || e.contains("transport")
                                    || e.contains("unavailable")
                                    || e.contains("no reachable leader"),
                                "{e}"
                            ),
                        }
                    }
                    None
                })
                .await
            }
        };
        let leader = ddl(
            "CREATE TABLE m (k BIGINT PRIMARY KEY) DISTRIBUTE BY HASH (k) INTO 2 BUCKETS WITH (replicas = 3)".into(),
            vec![0, 1, 2],
        )
        .await;
        // Every master sees the table (followers learn it from the catalog's log) and writes.
        for (i, url) in urls.iter().enumerate() {
            let insert = format!("INSERT INTO m VALUES ({i})");
            wait_until(
                &format!("master {i} to insert"),
                Duration::from_secs(10),
                || sql(url, &insert),
            )
            .await;
        }
        drop(masters[leader].take());
        let alive: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
        let new_leader = ddl(
            "CREATE TABLE n (k BIGINT PRIMARY KEY)".into(),
            alive.clone(),
        )
        .await;
        assert_ne!(new_leader, leader);
        for &i in &alive {
            sql(&urls[i], &format!("INSERT INTO m VALUES ({})", 10 + i))
                .await
                .unwrap();
        }
        let rows = sql(&urls[alive[0]], "SELECT k FROM m ORDER BY k")
            .await
            .unwrap();
        let mut expected: Vec<i64> = (0..3).collect();
        expected.extend(alive.iter().map(|&i| 10 + i as i64));
        assert_eq!(column_i64(&rows, 0), expected);
        let tables = sql(&urls[alive[1]], "SHOW TABLES").await.unwrap();
        assert_eq!(tables.iter().map(|b| b.num_rows()).sum::<usize>(), 2);
    }

    /// The members of `tablet` as the leader among `addrs` reports them.
    async fn voters(addrs: &[String], tablet: &str) -> Option<Vec<u64>> {
        for addr in addrs {
            let Some(status) = status(addr).await else {
                continue;
            };
            if let Some(r) = status.replicas.iter().find(|r| r.tablet_id == tablet) {
                if r.leader == status.server_id && r.learners.is_empty() {
                    let mut v = r.voters.clone();
                    v.sort_unstable();
                    return Some(v);
                }
            }
        }
        None
    }

    /// A tablet server that dies for good loses its replicas: each is copied from its tablet's
    /// leader to a live server, joins as a learner, catches up, becomes a voter, and the dead
    /// member is removed, until every tablet has 3 voters again; the new replicas then carry
    /// the tablets when another original server dies. `NYALA_REREPLICATION_ROWS` sets the rows
    /// loaded first (default 20 000; about 1.5 M make a 100 MB tablet).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_servers_replicas_are_recreated_elsewhere() {
        let rows: u64 = env_or("NYALA_REREPLICATION_ROWS", 20_000);
        let mut cluster = TestCluster::start(4, &["--follower-unavailable-secs", "3"]);
        let url = cluster.url.clone();
        let addrs = cluster.addrs.clone();
        let create = "CREATE TABLE r (k BIGINT PRIMARY KEY, v STRING) WITH (replicas = 3)";
        ddl_when_ready(&url, create).await;
        let insert = format!(
            "INSERT INTO r SELECT value, 'a value of some length, row ' || value \
             FROM generate_series(1, {rows}) AS g(value)"
        );
        sql(&url, &insert).await.unwrap();
        let tablets = sql(
            &url,
            "SELECT tablet_id, disk_bytes FROM sys.partitions WHERE table_name = 'r'",
        )
        .await
        .unwrap();
        let tablet = arrow::util::display::array_value_to_string(tablets[0].column(0), 0).unwrap();
        let live_addrs = |dead: &[usize]| -> Vec<String> {
            (0..4)
                .filter(|i| !dead.contains(i))
                .map(|i| addrs[i].clone())
                .collect()
        };
        let before = voters(&live_addrs(&[]), &tablet).await.expect("a leader");
        assert_eq!(before.len(), 3);
        // Kill a member that does not lead, for good.
        let leader = leader(&live_addrs(&[]), &tablet).await.unwrap();
        let victim = cluster
            .servers
            .iter()
            .position(|s| before.contains(&s.id) && s.addr != leader)
            .unwrap();
        cluster.servers[victim].kill();
        let size = sql(
            &url,
            "SELECT disk_bytes FROM sys.partitions WHERE table_name = 'r'",
        )
        .await
        .unwrap();
        eprintln!("tablet on disk: {} bytes", column_i64(&size, 0)[0]);
        let killed = Instant::now();
        let dead_id = cluster.servers[victim].id;
        let re_replicated = "the tablet to be re-replicated";
        let after = wait_until(re_replicated, Duration::from_secs(600), || async {
            let v = voters(&live_addrs(&[victim]), &tablet).await?;
            (v.len() == 3 && !v.contains(&dead_id)).then_some(v)
        })
        .await;
        eprintln!(
            "{rows} rows: re-replicated {:?} after the member was killed \
             (3 s of that is the unavailability timeout)",
            killed.elapsed()
        );
        // The new member votes: with another original member gone, the tablet still works.
        let second = cluster
            .servers
            .iter()
            .position(|s| after.contains(&s.id) && before.contains(&s.id) && s.addr != leader)
            .unwrap();
        cluster.servers[second].kill();
        sql(&url, "INSERT INTO r VALUES (0, 'after two deaths')")
            .await
            .unwrap();
        let count = sql(&url, "SELECT count(*) FROM r").await.unwrap();
        assert_eq!(column_i64(&count, 0), vec![rows as i64 + 1]);
        // The server replaced first comes back: its stale replica is deleted.
        cluster.restart_server(victim);
        wait_until(
            "the stale replica to go",
            Duration::from_secs(30),
            || async {
                let status = status(&addrs[victim]).await.unwrap();
                status.replicas.iter().all(|r| r.tablet_id != tablet)
            },
        )
        .await;
    }

    /// A tablet server started with `--flight-addr` serves Flight SQL as a coordinator: DDL
    /// goes to the master, reads and writes to the tablets' leaders, and what it does is what
    /// the master's endpoint sees.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tablet_server_coordinates_sql() {
        let master_dir = tempfile::tempdir().unwrap();
        let (rpc, flight) = (free_port(), free_port());
        let _master = MasterProcess::start(master_dir.path(), &rpc, &flight);
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let coordinator = free_port();
        let _servers: Vec<TabletServerProcess> = (0..3)
            .map(|i| match i {
                0 => TabletServerProcess::start_with(
                    dirs[i].path(),
                    &free_port(),
                    &["--masters", &rpc, "--flight-addr", &coordinator],
                ),
                _ => start_tserver(dirs[i].path(), &free_port(), &rpc),
            })
            .collect();
        let via_tserver = format!("http://{coordinator}");
        // The coordinator listens once it has reached the master.
        let create = "CREATE TABLE c (k BIGINT PRIMARY KEY, v STRING) \
                      DISTRIBUTE BY HASH (k) INTO 2 BUCKETS WITH (replicas = 3)";
        ddl_when_ready(&via_tserver, create).await;
        sql(
            &via_tserver,
            "INSERT INTO c SELECT value, 'x' FROM generate_series(1, 100) AS g(value)",
        )
        .await
        .unwrap();
        sql(&via_tserver, "ALTER TABLE c ADD COLUMN w BIGINT DEFAULT 7")
            .await
            .unwrap();
        let query = "SELECT count(*), sum(w) FROM c";
        let here = sql(&via_tserver, query).await.unwrap();
        assert_eq!(column_i64(&here, 0), vec![100]);
        assert_eq!(column_i64(&here, 1), vec![700]);
        let there = sql(&format!("http://{flight}"), query).await.unwrap();
        assert_eq!(column_i64(&there, 1), vec![700]);
        // The table's history retention reaches every replica; changes() reads the tablets
        // where they are, through diff scans.
        let an_hour_ago = "now() - INTERVAL '1 hour'";
        let changes = format!(
            "SELECT count(*), sum(w) FROM changes('c', {an_hour_ago}, NULL) WHERE _change = 'insert'"
        );
        let e = sql(&via_tserver, &changes).await.unwrap_err();
        assert!(e.contains("history retention"), "{e}");
        sql(
            &via_tserver,
            "ALTER TABLE c SET (history_max_age_secs = 7200)",
        )
        .await
        .unwrap();
        for url in [&via_tserver, &format!("http://{flight}")] {
            let read = sql(url, &changes).await.unwrap();
            assert_eq!(column_i64(&read, 0), vec![100]);
            assert_eq!(column_i64(&read, 1), vec![700]);
        }
        // A backup taken through one server reads every tablet where it is, at one snapshot;
        // a restore through another makes the table again, with its replicas.
        let backups = tempfile::tempdir().unwrap();
        let (full, incremental) = (backups.path().join("full"), backups.path().join("incr"));
        let take = format!("BACKUP TABLE c TO '{}'", full.display());
        sql(&via_tserver, &take).await.unwrap();
        sql(&via_tserver, "DELETE FROM c WHERE k <= 10")
            .await
            .unwrap();
        let take = format!(
            "BACKUP TABLE c TO '{}' INCREMENTAL FROM '{}'",
            incremental.display(),
            full.display()
        );
        sql(&via_tserver, &take).await.unwrap();
        let restore = format!("RESTORE TABLE c FROM '{}' AS c2", incremental.display());
        sql(&format!("http://{flight}"), &restore).await.unwrap();
        let restored = sql(&via_tserver, "SELECT count(*), sum(w), min(k) FROM c2")
            .await
            .unwrap();
        assert_eq!(column_i64(&restored, 0), vec![90]);
        assert_eq!(column_i64(&restored, 1), vec![630]);
        assert_eq!(column_i64(&restored, 2), vec![11]);
        let replicas = "SELECT CAST(min(replicas) AS BIGINT) FROM sys.partitions \
                        WHERE table_name = 'c2'";
        let replicas = sql(&via_tserver, replicas).await.unwrap();
        assert_eq!(column_i64(&replicas, 0), vec![3]);
        let shown = sql(&via_tserver, "SHOW CREATE TABLE c2").await.unwrap();
        let shown = arrow::util::pretty::pretty_format_batches(&shown)
            .unwrap()
            .to_string();
        assert!(
            shown.contains("WITH (replicas = 3, history_max_age_secs = 7200)"),
            "{shown}"
        );
        let e = sql(&via_tserver, "CREATE TABLE c (k BIGINT PRIMARY KEY)")
            .await
            .unwrap_err();
        assert!(e.contains("already exists"), "{e}");
        // A table without a key: its tablets on other servers give out ids of their own
        // buckets, so every row has its own id and is found where its id says.
        sql(
            &via_tserver,
            "CREATE TABLE nk (v STRING) WITH (replicas = 3)",
        )
        .await
        .unwrap();
        sql(&via_tserver, "INSERT INTO nk SELECT v FROM c")
            .await
            .unwrap();
        for _ in 0..3 {
            sql(
                &format!("http://{flight}"),
                "INSERT INTO nk VALUES ('y'), ('y')",
            )
            .await
            .unwrap();
        }
        let ids = "SELECT count(*), count(DISTINCT auto_incrementing_id) FROM nk";
        let ids = sql(&via_tserver, ids).await.unwrap();
        assert_eq!(column_i64(&ids, 0), vec![96]);
        assert_eq!(column_i64(&ids, 1), vec![96]);
        let found = "SELECT count(*) FROM nk AS a WHERE EXISTS \
                     (SELECT 1 FROM nk AS b WHERE b.auto_incrementing_id = a.auto_incrementing_id)";
        assert_eq!(
            column_i64(&sql(&via_tserver, found).await.unwrap(), 0),
            vec![96]
        );
        let one = sql(&via_tserver, "SELECT max(auto_incrementing_id) FROM nk")
            .await
            .unwrap();
        let lookup = format!(
            "SELECT count(*) FROM nk WHERE auto_incrementing_id = {}",
            column_i64(&one, 0)[0]
        );
        assert_eq!(
            column_i64(&sql(&via_tserver, &lookup).await.unwrap(), 0),
            vec![1]
        );
        sql(&via_tserver, "DELETE FROM nk WHERE v = 'y'")
            .await
            .unwrap();
        let left = sql(&format!("http://{flight}"), "SELECT count(*) FROM nk")
            .await
            .unwrap();
        assert_eq!(column_i64(&left, 0), vec![90]);
    }

    /// With `--cluster-secret-file`, the servers of a cluster talk to each other (DDL, writes,
    /// scans work through the master's Flight SQL) and refuse internal calls without it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn internal_rpc_needs_the_cluster_secret() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "0123456789abcdef0123456789abcdef\n").unwrap();
        let secret = secret.to_str().unwrap();
        let (rpc, flight) = (free_port(), free_port());
        let _master = MasterProcess::start_with(
            &dir.path().join("m"),
            &rpc,
            &flight,
            &["--cluster-secret-file", secret],
        );
        let tserver = TabletServerProcess::start_with(
            &dir.path().join("t"),
            &free_port(),
            &["--masters", &rpc, "--cluster-secret-file", secret],
        );
        let url = format!("http://{flight}");
        ddl_when_ready(
            &url,
            "CREATE TABLE s (k BIGINT PRIMARY KEY) WITH (replicas = 1)",
        )
        .await;
        sql(&url, "INSERT INTO s VALUES (1), (2)").await.unwrap();
        let count = sql(&url, "SELECT count(*) FROM s").await.unwrap();
        assert_eq!(column_i64(&count, 0), vec![2]);

        // This test process has no secret.
        let mut master = rpc::master(rpc::connect(&rpc).await.unwrap());
        let request = nyala_engine::rpc::proto::master::ClusterViewRequest { catalog_version: 0 };
        let refused = master.cluster_view(request).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
        assert!(refused.message().contains("cluster secret"), "{refused}");
        let mut server = tserver_client(&tserver.addr).await;
        let refused = server.status(Empty {}).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
    }

    /// A statement's writes to tablets led by the same server go in one `Batch` call, each
    /// answered as its own call would be: rows land, and a duplicate key in one tablet fails
    /// the whole statement with its own error and changes nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_to_one_server_travel_in_one_call() {
        let dir = tempfile::tempdir().unwrap();
        let (rpc, flight, http) = (free_port(), free_port(), free_port());
        let _master = MasterProcess::start(&dir.path().join("m"), &rpc, &flight);
        let _tserver = TabletServerProcess::start_with(
            &dir.path().join("t"),
            &free_port(),
            &["--masters", &rpc, "--http-addr", &http],
        );
        let url = format!("http://{flight}");
        ddl_when_ready(
            &url,
            "CREATE TABLE b (k BIGINT PRIMARY KEY, v STRING) \
             DISTRIBUTE BY HASH (k) INTO 4 BUCKETS WITH (replicas = 1)",
        )
        .await;
        let insert = "INSERT INTO b SELECT value, 'x' FROM generate_series(1, 100) AS g(value)";
        sql(&url, insert).await.unwrap();
        let e = sql(
            &url,
            "INSERT INTO b VALUES (101, 'y'), (102, 'y'), (103, 'y'), (50, 'y')",
        )
        .await
        .unwrap_err();
        assert!(e.contains("duplicate primary key"), "{e}");
        let count = sql(
            &url,
            "SELECT count(*), count(*) FILTER (WHERE v = 'y') FROM b",
        )
        .await
        .unwrap();
        assert_eq!(column_i64(&count, 0), vec![100]);
        assert_eq!(column_i64(&count, 1), vec![0]);

        let metrics = http_get(&http, "/metrics");
        let batches: f64 = (metrics.lines())
            .find(|l| l.starts_with("nyala_rpc_duration_seconds_count") && l.contains("\"Batch\""))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0);
        assert!(batches >= 2.0, "no Batch calls in:\n{metrics}");
    }

    /// The body of `GET path` at `addr` (plain HTTP/1.0).
    fn http_get(addr: &str, path: &str) -> String {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    }

    async fn tserver_client(addr: &str) -> TServerClient {
        rpc::tserver(rpc::connect(addr).await.unwrap())
    }

    /// A master and tablet servers on fixed loopback ports, each with its own data directory,
    /// so any of them can be killed and restarted where it was.
    struct TestCluster {
        master_dir: tempfile::TempDir,
        rpc: String,
        flight: String,
        master_args: Vec<String>,
        /// Flight SQL of the master.
        url: String,
        master: Option<MasterProcess>,
        dirs: Vec<tempfile::TempDir>,
        addrs: Vec<String>,
        servers: Vec<TabletServerProcess>,
    }

    impl TestCluster {
        fn start(servers: usize, master_args: &[&str]) -> Self {
            let flight = free_port();
            let mut cluster = Self {
                master_dir: tempfile::tempdir().unwrap(),
                rpc: free_port(),
                url: format!("http://{flight}"),
                flight,
                master_args: master_args.iter().map(|a| a.to_string()).collect(),
                master: None,
                dirs: (0..servers).map(|_| tempfile::tempdir().unwrap()).collect(),
                addrs: (0..servers).map(|_| free_port()).collect(),
                servers: Vec::new(),
            };
            cluster.start_master();
            cluster.servers = (0..servers).map(|i| cluster.server(i)).collect();
            cluster
        }

        fn start_master(&mut self) {
            self.start_master_with_env(&[]);
        }

        /// Starts the master again with `env` added to its environment.
        fn start_master_with_env(&mut self, env: &[(&str, &str)]) {
            self.master = None;
            let args: Vec<&str> = self.master_args.iter().map(String::as_str).collect();
            self.master = Some(MasterProcess::start_with_env(
                self.master_dir.path(),
                &self.rpc,
                &self.flight,
                &args,
                env,
            ));
        }

        fn server(&self, i: usize) -> TabletServerProcess {
            self.server_with_env(i, &[])
        }

        /// Tablet server `i` started with `env` added to its environment.
        fn server_with_env(&self, i: usize, env: &[(&str, &str)]) -> TabletServerProcess {
            let args = ["--masters", self.rpc.as_str()];
            TabletServerProcess::start_with_env(self.dirs[i].path(), &self.addrs[i], &args, env)
        }

        /// Moves leaderships of `table`'s tablets (`nyala admin leader-step-down`) until tablet
        /// server `i`, just restarted, leads one of them; whether it does within a minute (a
        /// step-down picks the replica that applied most, which may never be this one).
        async fn lead_a_tablet(&self, i: usize, table: &str) -> bool {
            let query = format!(
                "SELECT tablet_id, leader FROM sys.partitions WHERE table_name = '{table}'"
            );
            // (tablet, leader) as the master last heard.
            let leaders = || async {
                let Ok(batches) = sql(&self.url, &query).await else {
                    return Vec::new();
                };
                (batches.iter())
                    .flat_map(|b| {
                        (0..b.num_rows()).map(move |r| {
                            let value = |c: usize| {
                                arrow::util::display::array_value_to_string(b.column(c), r).unwrap()
                            };
                            (value(0), value(1))
                        })
                    })
                    .collect::<Vec<(String, String)>>()
            };
            let leads = |tablets: &[(String, String)]| {
                tablets
                    .iter()
                    .any(|(_, leader)| *leader == self.servers[i].addr)
            };
            // What the master knew of it from before its restart goes first.
            let deadline = Instant::now() + Duration::from_secs(20);
            while leads(&leaders().await) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let deadline = Instant::now() + Duration::from_secs(60);
            for attempt in 0.. {
                if Instant::now() >= deadline {
                    break;
                }
                let tablets = leaders().await;
                if leads(&tablets) {
                    return true;
                }
                if let Some((tablet, _)) = tablets.get(attempt % tablets.len().max(1)) {
                    let _ = std::process::Command::new(super::nyala_bin())
                        .args(["admin", "--masters", &self.rpc, "leader-step-down", tablet])
                        .output()
                        .unwrap();
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            false
        }

        /// Starts tablet server `i` again on its data directory.
        fn restart_server(&mut self, i: usize) {
            self.servers[i] = self.server(i);
        }

        /// Kills every process, then starts them all again.
        fn restart_all(&mut self) {
            self.master = None;
            for server in &mut self.servers {
                server.kill();
            }
            self.start_master();
            for i in 0..self.servers.len() {
                self.restart_server(i);
            }
        }
    }

    /// Runs DDL once the master can place it (the tablet servers register with their first
    /// heartbeat).
    async fn ddl_when_ready(url: &str, statement: &str) {
        wait_until(statement, Duration::from_secs(20), || sql(url, statement)).await;
    }

    /// Two clients inserting `(id, writer)` rows, `batch` per statement, each remembering the
    /// ids acknowledged.
    struct Writers {
        stop: Arc<std::sync::atomic::AtomicBool>,
        tasks: Vec<tokio::task::JoinHandle<Vec<i64>>>,
    }

    impl Writers {
        fn start(url: &str, table: &str, batch: i64) -> Self {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let tasks = (0..2i64)
                .map(|w| {
                    let (url, table, stop) = (url.to_string(), table.to_string(), stop.clone());
                    tokio::spawn(async move {
                        let mut acknowledged = Vec::new();
                        let mut next = 0i64;
                        while !stop.load(std::sync::atomic::Ordering::Acquire) {
                            let ids: Vec<i64> =
                                (0..batch).map(|i| (next * batch + i) * 2 + w).collect();
                            let values: Vec<String> =
                                ids.iter().map(|id| format!("({id}, {w})")).collect();
                            let insert =
                                format!("INSERT INTO {table} VALUES {}", values.join(", "));
                            match sql(&url, &insert).await {
                                Ok(_) => acknowledged.extend(ids),
                                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                            }
                            next += 1;
                        }
                        acknowledged
                    })
                })
                .collect();
            Self { stop, tasks }
        }

        /// Stops the writers; every id acknowledged.
        async fn finish(self) -> Vec<i64> {
            self.stop.store(true, std::sync::atomic::Ordering::Release);
            let mut acknowledged = Vec::new();
            for task in self.tasks {
                acknowledged.extend(task.await.unwrap());
            }
            acknowledged
        }
    }

    /// The ids stored in `table` (sorted), checked: none twice, every acknowledged one there,
    /// and every INSERT of [`Writers`] (`batch` rows over several tablets) whole or absent.
    async fn stored_exactly_once(
        url: &str,
        table: &str,
        acknowledged: &[i64],
        batch: i64,
    ) -> Vec<i64> {
        let read = format!("SELECT id FROM {table}");
        let batches = wait_until(&read, Duration::from_secs(30), || sql(url, &read)).await;
        let mut stored = column_i64(&batches, 0);
        stored.sort_unstable();
        let mut distinct = stored.clone();
        distinct.dedup();
        assert_eq!(distinct.len(), stored.len(), "a row stored twice");
        for id in acknowledged {
            assert!(
                stored.binary_search(id).is_ok(),
                "acknowledged row {id} lost"
            );
        }
        // Writer w's statement n inserted the ids (n * batch + i) * 2 + w, i < batch.
        let mut statements: std::collections::BTreeMap<(i64, i64), i64> = Default::default();
        for id in &stored {
            *statements.entry((id % 2, id / 2 / batch)).or_default() += 1;
        }
        for ((writer, n), rows) in statements {
            assert_eq!(
                rows, batch,
                "writer {writer}'s statement {n} is partly stored"
            );
        }
        stored
    }

    /// The number in environment variable `name`, or `default`.
    fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// An address no process listens on now, for a server to start at: a port below the range
    /// the kernel takes outgoing connections' ports from (32768-60999 by default), so that no
    /// test's connection can take it before the server binds it (a master once failed to
    /// start so, with a port from that range). Never the same port twice in one run.
    fn free_port() -> String {
        use std::sync::atomic::{AtomicU32, Ordering};
        const FIRST: u32 = 20_000;
        const PORTS: u32 = 12_000;
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let start = std::process::id() % PORTS;
        for _ in 0..PORTS {
            let port = FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % PORTS;
            if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port as u16)) {
                return listener.local_addr().unwrap().to_string();
            }
        }
        panic!("no free port in {FIRST}-{}", FIRST + PORTS - 1)
    }

    fn schema() -> Schema {
        Schema::new(
            vec![
                ColumnSchema::new("k", ColumnType::Int64, false),
                ColumnSchema::new("v", ColumnType::String, true),
            ],
            vec![0],
        )
        .unwrap()
    }

    /// The tablet server at `addr`, if it answers.
    async fn tserver(addr: &str) -> Option<TServerClient> {
        Some(rpc::tserver(rpc::connect(addr).await.ok()?))
    }

    /// What the tablet server at `addr` reports of its replicas, if it answers.
    async fn status(addr: &str) -> Option<ServerStatus> {
        let mut client = tserver(addr).await?;
        Some(client.status(Empty {}).await.ok()?.into_inner())
    }

    /// The leader of `tablet` as the reachable servers report it.
    async fn leader(addrs: &[String], tablet: &str) -> Option<String> {
        for addr in addrs {
            let Some(status) = status(addr).await else {
                continue;
            };
            let Some(replica) = status.replicas.iter().find(|r| r.tablet_id == tablet) else {
                continue;
            };
            if replica.leader == status.server_id {
                return Some(addr.clone());
            }
        }
        None
    }

    /// Writes keys `keys` to whichever server leads, until acknowledged; the time it took.
    async fn write(addrs: &[String], tablet: &str, keys: std::ops::Range<i64>) -> Duration {
        let started = Instant::now();
        let rows = RecordBatch::try_new(
            schema().arrow_schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(keys.clone())),
                Arc::new(StringArray::from_iter_values(
                    keys.clone().map(|k| format!("v{k}")),
                )),
            ],
        )
        .unwrap();
        let batch = WriteBatch::new(WriteKind::Upsert, rows).encode();
        loop {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no write for 60 s"
            );
            let Some(addr) = leader(addrs, tablet).await else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            let Some(mut client) = tserver(&addr).await else {
                continue;
            };
            let response = client
                .write(WriteRequest {
                    tablet_id: tablet.into(),
                    batch: batch.clone().into(),
                    request: None,
                })
                .await
                .map_err(rpc::from_status);
            match response {
                Ok(_) => return started.elapsed(),
                Err(
                    nyala_engine::EngineError::Raft(_) | nyala_engine::EngineError::Unavailable(_),
                ) => {}
                Err(e) => panic!("write failed: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn scan_keys(addr: &str, tablet: &str) -> Vec<i64> {
        let mut client = tserver(addr).await.unwrap();
        let spec = ScanSpec {
            projection: Some(vec![0]),
            predicates: vec![],
            snapshot: Timestamp(0),
            limit: None,
            batch_size: 1000,
            string_views: false,
            changes_since: None,
        };
        let mut answer = client
            .scan_open(ScanOpenRequest {
                tablet_id: tablet.into(),
                spec: spec.encode().unwrap().into(),
                wait_ms: 0,
                this_replica: true,
            })
            .await
            .unwrap()
            .into_inner();
        let mut batches = rpc::decode_rows(std::mem::take(&mut answer.ipc)).unwrap();
        while !answer.done {
            let scanner_id = answer.scanner_id;
            answer = client
                .scan_next(ScanNextRequest { scanner_id })
                .await
                .unwrap()
                .into_inner();
            batches.extend(rpc::decode_rows(std::mem::take(&mut answer.ipc)).unwrap());
        }
        let mut keys = Vec::new();
        for batch in batches {
            let k = batch
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            keys.extend(k.iter().flatten());
        }
        keys.sort_unstable();
        keys
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replicated_tablet_survives_killing_its_leader() {
        let rounds: usize = env_or("NYALA_FAILOVER_ROUNDS", 2);
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let addrs: Vec<String> = (0..3).map(|_| free_port()).collect();
        let mut servers: Vec<TabletServerProcess> = (0..3)
            .map(|i| TabletServerProcess::start(dirs[i].path(), &addrs[i]))
            .collect();
        let tablet = "t1";
        let peers: Vec<Peer> = servers
            .iter()
            .map(|s| Peer {
                server_id: s.id,
                address: s.addr.clone(),
            })
            .collect();
        for server in &servers {
            let mut client = tserver(&server.addr).await.unwrap();
            client
                .create_replica(CreateReplicaRequest {
                    tablet_id: tablet.into(),
                    schema_json: serde_json::to_string(&schema()).unwrap(),
                    peers: peers.clone(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        let mut next = 0i64;
        let mut failovers = Vec::new();
        for round in 0..rounds {
            for _ in 0..10 {
                write(&addrs, tablet, next..next + 100).await;
                next += 100;
            }
            let leader = leader(&addrs, tablet).await.expect("a leader");
            let victim = servers.iter().position(|s| s.addr == leader).unwrap();
            servers[victim].kill();
            let took = write(&addrs, tablet, next..next + 100).await;
            next += 100;
            eprintln!("round {round}: leader killed, next write acknowledged after {took:?}");
            failovers.push(took);
            for _ in 0..5 {
                write(&addrs, tablet, next..next + 100).await;
                next += 100;
            }
            servers[victim] = TabletServerProcess::start(dirs[victim].path(), &addrs[victim]);
        }
        failovers.sort();
        eprintln!(
            "leader kill to first acknowledged write: median {:?} of {}",
            failovers[failovers.len() / 2],
            failovers.len()
        );
        // Every replica, the restarted ones too, ends with every acknowledged row, once.
        let expected: Vec<i64> = (0..next).collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        for addr in &addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            wait_until(&format!("every row on {addr}"), left, || async {
                let keys = scan_keys(addr, tablet).await;
                match keys == expected {
                    true => Ok(()),
                    false => Err(format!(
                        "{addr} has {} of {} rows",
                        keys.len(),
                        expected.len()
                    )),
                }
            })
            .await;
        }
    }
}
