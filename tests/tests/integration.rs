//! Nyala as a user meets it: a real `nyala serve` process, spoken to over Arrow Flight SQL.
//!
//! The binary is taken from `NYALA_BIN`, or next to the test executable's directory
//! (`target/debug/nyala`); `tests/run.sh` builds it first.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::util::pretty::pretty_format_batches;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{CommandGetDbSchemas, CommandGetTables};
use futures::TryStreamExt;
use tonic::transport::Channel;

fn nyala_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("NYALA_BIN") {
        return bin.into();
    }
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("nyala")
}

/// A `nyala serve` child process; killed with SIGKILL on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(data_dir: &Path) -> Server {
        let mut child = Command::new(nyala_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start nyala serve (build it with: cargo build -p nyala-flight --bin nyala)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line
            .split_whitespace()
            .find(|w| w.starts_with("grpc://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .replace("grpc://", "http://");
        Server { child, addr }
    }

    async fn client(&self) -> FlightSqlServiceClient<Channel> {
        let channel = Channel::from_shared(self.addr.clone()).unwrap().connect().await.unwrap();
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

async fn query(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<Vec<RecordBatch>, String> {
    let info = client.execute(sql.to_string(), None).await.map_err(|e| e.to_string())?;
    let mut batches = Vec::new();
    for endpoint in info.endpoint {
        let stream = client.do_get(endpoint.ticket.unwrap()).await.map_err(|e| e.to_string())?;
        batches.extend(stream.try_collect::<Vec<_>>().await.map_err(|e| e.to_string())?);
    }
    Ok(batches)
}

async fn text(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> String {
    let batches = query(client, sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    pretty_format_batches(&batches).unwrap().to_string()
}

async fn update(client: &mut FlightSqlServiceClient<Channel>, sql: &str) -> Result<i64, String> {
    client.execute_update(sql.to_string(), None).await.map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_metadata_and_errors_over_flight_sql() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut c = server.client().await;
    update(&mut c, "CREATE TABLE metrics (host STRING, ts TIMESTAMP, metric STRING, value DOUBLE, \
        PRIMARY KEY (host, metric, ts)) DISTRIBUTE BY HASH (host, metric) INTO 4 BUCKETS").await.unwrap();
    let n = update(&mut c, "INSERT INTO metrics VALUES ('a', '2026-01-01T00:00:00', 'cpu', 0.5), \
        ('a', '2026-01-01T00:01:00', 'cpu', 7.5), ('b', '2026-01-01T00:00:00', 'cpu', 3.0), \
        ('c', '2026-01-01T00:00:00', 'mem', 20.0)").await.unwrap();
    assert_eq!(n, 4);
    let e = update(&mut c, "INSERT INTO metrics VALUES ('a', '2026-01-01T00:00:00', 'cpu', 1.0)").await.unwrap_err();
    assert!(e.contains("duplicate primary key") && e.contains("host='a'"), "{e}");
    assert_eq!(update(&mut c, "UPDATE metrics SET value = value * 2 WHERE host = 'a'").await.unwrap(), 2);
    assert_eq!(update(&mut c, "DELETE FROM metrics WHERE value > 10").await.unwrap(), 2);
    // DML sent as a query, as ADBC does, returns its count too.
    assert!(text(&mut c, "UPSERT INTO metrics VALUES ('b', '2026-01-01T00:00:00', 'cpu', 4.0)").await.contains("| 1 "));
    let got = text(&mut c, "SELECT host, avg(value) AS v FROM metrics GROUP BY host ORDER BY host").await;
    assert_eq!(got, "+------+-----+\n| host | v   |\n+------+-----+\n| a    | 1.0 |\n| b    | 4.0 |\n+------+-----+");
    assert!(text(&mut c, "SHOW TABLES").await.contains("metrics"));
    assert!(text(&mut c, "DESCRIBE metrics").await.contains("TIMESTAMP"));
    let plan = text(&mut c, "EXPLAIN SELECT value FROM metrics WHERE host = 'a'").await;
    assert!(plan.contains("NyalaScanExec") && plan.contains("predicates="), "{plan}");

    for (sql, needle) in [
        ("SELEC 1", "syntax"),
        ("SELECT * FROM nope", "nope"),
        ("SELECT nope FROM metrics", "nope"),
        ("UPDATE metrics SET host = 'x'", "primary key"),
        ("INSERT INTO metrics VALUES (NULL, '2026-01-01T00:00:00', 'cpu', 1.0)", "null"),
    ] {
        let e = query(&mut c, sql).await.unwrap_err();
        assert!(e.contains(needle), "{sql}: {e}");
    }
    assert!(text(&mut c, "SELECT count(*) AS n FROM metrics").await.contains("| 2 |"));

    // Metadata as JDBC/ADBC ask for it.
    let info = c.get_catalogs().await.unwrap();
    let batches: Vec<RecordBatch> = c.do_get(info.endpoint[0].ticket.clone().unwrap()).await.unwrap().try_collect().await.unwrap();
    assert!(pretty_format_batches(&batches).unwrap().to_string().contains("nyala"));
    let info = c.get_db_schemas(CommandGetDbSchemas { catalog: None, db_schema_filter_pattern: None }).await.unwrap();
    let batches: Vec<RecordBatch> = c.do_get(info.endpoint[0].ticket.clone().unwrap()).await.unwrap().try_collect().await.unwrap();
    assert!(pretty_format_batches(&batches).unwrap().to_string().contains("public"));
    let info = c
        .get_tables(CommandGetTables { include_schema: true, table_name_filter_pattern: Some("met%".into()), ..Default::default() })
        .await
        .unwrap();
    let batches: Vec<RecordBatch> = c.do_get(info.endpoint[0].ticket.clone().unwrap()).await.unwrap().try_collect().await.unwrap();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);

    // Prepared statements (the JDBC driver's path for every statement).
    let mut prepared = c.prepare("SELECT count(*) FROM metrics".into(), None).await.unwrap();
    let info = prepared.execute().await.unwrap();
    let batches: Vec<RecordBatch> = c.do_get(info.endpoint[0].ticket.clone().unwrap()).await.unwrap().try_collect().await.unwrap();
    assert!(pretty_format_batches(&batches).unwrap().to_string().contains("| 2 "));
    let mut insert = c.prepare("INSERT INTO metrics VALUES ('d', '2026-01-01T00:00:00', 'cpu', 1.0)".into(), None).await.unwrap();
    assert_eq!(insert.execute_update().await.unwrap(), 1);

    // Garbage tickets get an error and the server keeps answering.
    assert!(c.do_get(arrow_flight::Ticket::new(b"garbage".to_vec())).await.is_err());
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
        let got = text(&mut c, "SELECT count(*) AS n, coalesce(sum(v), 0) AS s FROM events").await;
        assert!(got.contains(&format!("| {expected_rows} ")) && got.contains(&format!(" {expected_sum} ")), "round {round}: {got}");
        for statement in 0..5i64 {
            let base = round * 1000 + statement * 100;
            let values: Vec<String> = (base..base + 50).map(|i| format!("({i}, {})", i % 7)).collect();
            let n = update(&mut c, &format!("INSERT INTO events VALUES {}", values.join(", "))).await.unwrap();
            expected_rows += n;
            expected_sum += (base..base + 50).map(|i| i % 7).sum::<i64>();
        }
        update(&mut c, &format!("UPDATE events SET v = v + 1 WHERE id < {}", round * 1000 + 10)).await.unwrap();
        expected_sum += text(&mut c, &format!("SELECT count(*) AS n FROM events WHERE id < {}", round * 1000 + 10))
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
    let got = text(&mut c, "SELECT count(*) AS n, count(DISTINCT id) AS d, sum(v) AS s FROM events").await;
    assert!(got.contains(&format!("| {expected_rows} | {expected_rows} | {expected_sum} |")), "{got}");
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
    assert!(out.status.success() && stdout.contains("| 2 | two |") && stdout.contains("(2 rows)"), "{stdout}");
    let out = Command::new(nyala_bin()).args(["sql", "--connect", &url, "-c", "SELECT * FROM missing"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("missing"));

    let embedded = tempfile::tempdir().unwrap();
    let dir_arg = embedded.path().to_str().unwrap();
    let out = Command::new(nyala_bin())
        .args(["sql", "--data-dir", dir_arg, "-c", "CREATE TABLE e (k INT PRIMARY KEY); INSERT INTO e VALUES (7)"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(nyala_bin()).args(["sql", "--data-dir", dir_arg, "-c", "SELECT k FROM e"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("| 7 |"));
}
