//! The SQL layer end to end in one process: statements through a `Session` over a real database
//! directory, results checked as a user sees them, errors leave tables unchanged, data survives
//! reopening. Module `backup`: BACKUP and RESTORE round trips. Module `fuzz`: random and mutated statements parsed, planned and run. Module
//! `runtime_filters`: joins over pseudo-random tables give the same rows with runtime filters
//! on as off.

mod backup;
mod fuzz;
mod runtime_filters;

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, RecordBatch};
use arrow::util::pretty::pretty_format_batches;
use datafusion::physical_plan::common::collect;
use nyala_sql::{Database, DatabaseOptions, Session};
use nyala_testkit::wait_until;

async fn open(dir: &std::path::Path) -> (Arc<Database>, Session) {
    let db = Database::open(dir, DatabaseOptions::default())
        .await
        .unwrap();
    let session = db.session();
    (db, session)
}

/// Drops `db` without shutting it down (a crash, as far as its files know) and opens `dir`
/// again once its background work has stopped as well: a maintenance round holds the tablet
/// server and goes on writing files in the directory, and the server holds the directory's
/// lock until it is dropped (its last part), so the open is tried again while the directory is
/// in use. (A crashed process has no such round left.)
async fn crash_and_reopen(
    dir: &std::path::Path,
    db: Arc<Database>,
    session: Session,
) -> (Arc<Database>, Session) {
    drop((db, session));
    // A liveness bound, not a timing measurement: a round ends.
    let release = "the dropped database to let go of its directory";
    let db = wait_until(release, Duration::from_secs(60), || async {
        match Database::open(dir, DatabaseOptions::default()).await {
            Ok(db) => Ok(db),
            Err(e) if e.to_string().contains("in use by another Nyala server") => Err(e),
            Err(e) => panic!("reopening {}: {e}", dir.display()),
        }
    })
    .await;
    let session = db.session();
    (db, session)
}

async fn run(session: &Session, sql: &str) -> Vec<RecordBatch> {
    let stream = session
        .execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    collect(stream).await.unwrap()
}

async fn text(session: &Session, sql: &str) -> String {
    pretty_format_batches(&run(session, sql).await)
        .unwrap()
        .to_string()
}

/// The BIGINT values of the first column of `batches`.
fn first_i64s(batches: &[RecordBatch]) -> Vec<i64> {
    let columns = batches.iter().map(|b| {
        let column = b.column(0).as_any();
        column
            .downcast_ref::<arrow::array::Int64Array>()
            .unwrap()
            .clone()
    });
    columns
        .flat_map(|c| c.iter().flatten().collect::<Vec<_>>())
        .collect()
}

/// The row count a DML statement reports.
fn affected(batches: &[RecordBatch]) -> i64 {
    let count = arrow::compute::cast(batches[0].column(0), &arrow::datatypes::DataType::Int64);
    first_i64s(&[RecordBatch::try_from_iter([("count", count.unwrap())]).unwrap()])[0]
}

/// What a long poll waiting up to 10 minutes answers, which must come from a commit waking it:
/// a hang guard (a fifth of the wait), not a measurement of how soon.
async fn woken_before_its_wait_ends<T>(poll: impl std::future::Future<Output = T>) -> T {
    (tokio::time::timeout(Duration::from_secs(120), poll).await)
        .expect("the long poll was not woken by the commit")
}

async fn error(session: &Session, sql: &str) -> String {
    match session.execute(sql).await {
        Err(e) => e.to_string(),
        Ok(stream) => match collect(stream).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{sql} should fail"),
        },
    }
}

const METRICS: &str =
    "CREATE TABLE metrics (host STRING, ts TIMESTAMP, metric STRING, value DOUBLE, \
    PRIMARY KEY (host, metric, ts)) DISTRIBUTE BY HASH (host, metric) INTO 4 BUCKETS";

async fn load_metrics(session: &Session) {
    run(session, METRICS).await;
    run(
        session,
        "INSERT INTO metrics VALUES ('a', '2026-01-01T00:00:00', 'cpu', 0.5), \
         ('a', '2026-01-01T00:01:00', 'cpu', 7.5), ('a', '2026-01-01T00:00:00', 'mem', 1.0), \
         ('b', '2026-01-01T00:00:00', 'cpu', 3.0), ('c', '2026-01-01T00:00:00', 'cpu', 20.0)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_through_sql() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    load_metrics(&s).await;
    assert!(text(&s, "SELECT count(*) FROM metrics")
        .await
        .contains("| 5 "));

    run(&s, "UPDATE metrics SET value = value * 2 WHERE host = 'a'").await;
    run(&s, "DELETE FROM metrics WHERE value > 10").await;
    run(
        &s,
        "UPSERT INTO metrics VALUES ('b', '2026-01-01T00:00:00', 'cpu', 4.0)",
    )
    .await;
    let got = text(
        &s,
        "SELECT host, metric, value FROM metrics ORDER BY host, metric, value",
    )
    .await;
    let expected = "\
+------+--------+-------+
| host | metric | value |
+------+--------+-------+
| a    | cpu    | 1.0   |
| a    | mem    | 2.0   |
| b    | cpu    | 4.0   |
+------+--------+-------+";
    assert_eq!(got, expected);

    let got = text(
        &s,
        "SELECT host, avg(value) AS a FROM metrics GROUP BY host ORDER BY host",
    )
    .await;
    assert!(got.contains("| a    | 1.5 |"), "{got}");

    run(
        &s,
        "CREATE TABLE hosts (host STRING PRIMARY KEY, dc STRING)",
    )
    .await;
    run(&s, "INSERT INTO hosts VALUES ('a', 'east'), ('b', 'west')").await;
    let got = text(&s, "SELECT h.dc, sum(m.value) AS v FROM metrics m JOIN hosts h ON m.host = h.host GROUP BY h.dc ORDER BY h.dc").await;
    assert!(
        got.contains("| east | 3.0 |") && got.contains("| west | 4.0 |"),
        "{got}"
    );

    let tables = text(&s, "SHOW TABLES").await;
    assert!(tables.contains("hosts") && tables.contains("metrics"));
    let describe = text(&s, "DESCRIBE metrics").await;
    assert!(
        describe.contains("| ts          | TIMESTAMP | NO       | YES         |"),
        "{describe}"
    );

    let plan = text(&s, "EXPLAIN SELECT value FROM metrics WHERE host = 'a'").await;
    assert!(
        plan.contains("NyalaScanExec: table=metrics, tablets=4")
            && plan.contains("predicates=[host = "),
        "{plan}"
    );

    run(&s, "DROP TABLE hosts").await;
    assert!(error(&s, "SELECT * FROM hosts").await.contains("hosts"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    load_metrics(&s).await;
    let before = text(&s, "SELECT * FROM metrics ORDER BY host, metric, ts").await;
    for (sql, needle) in [
        ("SELEC 1", "syntax error"),
        ("SELECT * FROM nope", "nope"),
        ("SELECT nope FROM metrics", "nope"),
        (
            "INSERT INTO metrics VALUES ('a', '2026-01-01T00:00:00', 'cpu', 9.0)",
            "duplicate",
        ),
        (
            "INSERT INTO metrics VALUES ('x', 'not a time', 'cpu', 9.0)",
            "not a time",
        ),
        (
            "INSERT INTO metrics VALUES (NULL, '2026-01-01T00:00:00', 'cpu', 9.0)",
            "null",
        ),
        (
            "UPDATE metrics SET host = 'z' WHERE host = 'a'",
            "primary key",
        ),
        ("CREATE TABLE metrics (a INT PRIMARY KEY)", "already exists"),
        ("DROP TABLE nope", "nope"),
    ] {
        let e = error(&s, sql).await;
        assert!(e.to_lowercase().contains(needle), "{sql}: {e}");
    }
    assert_eq!(
        text(&s, "SELECT * FROM metrics ORDER BY host, metric, ts").await,
        before
    );
    // A new row in one tablet and a duplicate in another: the statement changes nothing.
    let e = error(&s, "INSERT INTO metrics VALUES ('q', '2026-01-01T00:00:00', 'cpu', 1.0), ('a', '2026-01-01T00:00:00', 'cpu', 9.0)").await;
    assert!(
        e.contains("duplicate") && e.contains("changed nothing"),
        "{e}"
    );
    assert_eq!(
        text(&s, "SELECT * FROM metrics ORDER BY host, metric, ts").await,
        before
    );
}

/// Statements that nest too deep are refused with a clear error (they overflowed the stack of
/// the thread planning them); the same shapes within the limits run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_statements_are_refused_not_a_stack_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    load_metrics(&s).await;
    let chain = |n: usize, term: &dyn Fn(usize) -> String, op: &str| {
        (0..n).map(term).collect::<Vec<_>>().join(op)
    };
    let or = |n| {
        let terms = chain(n, &|i| format!("value = {i}"), " OR ");
        format!("SELECT count(*) FROM metrics WHERE {terms}")
    };
    let and = |n| {
        let terms = chain(n, &|i| format!("host <> 'h{i}'"), " AND ");
        format!("SELECT count(*) FROM metrics WHERE {terms}")
    };
    let plus = |n| format!("SELECT {}", chain(n, &|_| "1".into(), " + "));
    let concat = |n| format!("SELECT {}", chain(n, &|_| "'a'".into(), " || "));
    let ctes = |n: usize| {
        let defs = chain(
            n,
            &|i| match i {
                0 => "c0 AS (SELECT 1 AS x)".to_string(),
                i => format!("c{i} AS (SELECT * FROM c{})", i - 1),
            },
            ", ",
        );
        format!("WITH {defs} SELECT * FROM c{}", n - 1)
    };
    for shape in [&or as &dyn Fn(usize) -> String, &and, &plus, &concat] {
        let e = error(&s, &shape(10_000)).await;
        assert!(e.contains("nests expressions deeper than"), "{e}");
        run(&s, &shape(400)).await;
    }
    let e = error(&s, &ctes(1_000)).await;
    assert!(e.contains("nests more than 1000 operators"), "{e}");
    run(&s, &ctes(300)).await;
    let nested = format!("SELECT {}1{}", "(".repeat(10_000), ")".repeat(10_000));
    assert!(error(&s, &nested).await.contains("recursion limit"));
    // Shapes sqlparser parses one way and then another at every level: time exponential in
    // the depth, unless the parser's work is bounded (found by tests/python/fuzz_traffic.py;
    // 45 levels of NOT ( froze a server). The bound is a liveness check, generous.
    let started = std::time::Instant::now();
    let not = format!("SELECT {}true{}", "NOT (".repeat(45), ")".repeat(45));
    let cast = format!("SELECT {}1{}", "CAST((".repeat(26), ") AS INT)".repeat(26));
    let exists = format!("SELECT {}1{}", "EXISTS (SELECT ".repeat(30), ")".repeat(30));
    let scalar = format!("SELECT {}1{}", "(SELECT (".repeat(25), "))".repeat(25));
    for deep in [not, cast, exists, scalar] {
        let e = error(&s, &deep).await;
        assert!(
            e.contains("too complex") || e.contains("recursion limit") || e.contains("nests"),
            "{e}"
        );
    }
    // Queries in queries: DataFusion's checks of a plan take time exponential in their depth
    // (found by fuzz_traffic: 23 levels of scalar subqueries took 11 s to plan), so at most 16
    // nest, the statement's own query included.
    let subqueries = |n: usize| format!("SELECT {}1{}", "(SELECT ".repeat(n), ")".repeat(n));
    let e = error(&s, &subqueries(16)).await;
    assert!(
        e.contains("nests queries (subqueries, derived tables) deeper than the 16"),
        "{e}"
    );
    assert!(text(&s, &subqueries(15)).await.contains("| 1"));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let shallow = format!("SELECT {}true{}", "NOT (".repeat(8), ")".repeat(8));
    assert!(text(&s, &shallow).await.contains("true"));
    // Still serving.
    assert!(text(&s, "SELECT count(*) FROM metrics").await.contains('5'));
}

/// A statement over its timeout is cancelled with a clear error; the session's setting
/// overrides the server's; a bad value is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_cancels_a_long_query() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    let e = error(&s, "SET statement_timeout = 'soon'").await;
    assert!(e.contains("a duration such as 30s"), "{e}");
    run(&s, "SET statement_timeout = '300ms'").await;
    let started = std::time::Instant::now();
    let e = error(&s, "SELECT sum(value) FROM generate_series(1, 3000000000)").await;
    assert!(
        e.contains("canceling statement due to statement timeout"),
        "{e}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "cancelled after {:?}",
        started.elapsed()
    );
    // A nested-loop join of a million rows with a million, whose filter keeps nothing: its
    // probe side comes in slices, so the join yields and the timeout ends it (debug build,
    // shared machine: the bound is a liveness check, generous; minutes without slices).
    let started = std::time::Instant::now();
    let e = error(
        &s,
        "SELECT count(*) FROM generate_series(1, 1000000) a, generate_series(1, 1000000) b \
         WHERE a.value + b.value = 7",
    )
    .await;
    assert!(e.contains("statement timeout"), "{e}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "cancelled after {:?}",
        started.elapsed()
    );
    let plan = text(
        &s,
        "EXPLAIN SELECT count(*) FROM generate_series(1, 100) a, \
         generate_series(1, 100) b WHERE a.value < b.value",
    )
    .await;
    assert!(plan.contains("ProbeSlicesExec"), "{plan}");
    run(&s, "SET statement_timeout = 0").await;
    let pairs = "SELECT count(*) FROM generate_series(1, 300) a, generate_series(1, 300) b \
         WHERE a.value < b.value";
    assert!(text(&s, pairs).await.contains("44850"));
    assert!(text(&s, "SELECT count(*) FROM generate_series(1, 1000)")
        .await
        .contains("1000"));
}

/// A statement that changes rows stops on its timeout, or when its caller goes away, only
/// where that leaves nothing changed: the rows an INSERT had written in a transaction of its own
/// are rolled back at once (not left locked until the transaction is taken for abandoned), and
/// a timeout inside the session's transaction fails that transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_statement_changes_nothing_and_locks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE t (k BIGINT PRIMARY KEY, v BIGINT) DISTRIBUTE BY HASH (k) INTO 4 BUCKETS",
    )
    .await;
    let endless = "INSERT INTO t SELECT value, 0 FROM generate_series(1, 3000000000)";
    // Its first batches written, the INSERT is still reading when its time is up.
    run(&s, "SET statement_timeout = '500ms'").await;
    let e = error(&s, endless).await;
    assert!(e.contains("statement timeout"), "{e}");
    run(&s, "SET statement_timeout = 0").await;
    // (A write to a locked row waits 10 s for it, then fails.)
    run(&s, "INSERT INTO t VALUES (1, 1)").await;
    assert_eq!(first_i64s(&run(&s, "SELECT count(*) FROM t").await), [1]);

    // The caller goes away (a client disconnects): the same.
    let other = s.clone();
    let gone = tokio::time::timeout(std::time::Duration::from_millis(500), async move {
        let endless = "INSERT INTO t SELECT value + 10, 0 FROM generate_series(1, 3000000000)";
        let stream = other.execute(endless).await?;
        collect(stream).await.map_err(nyala_sql::SqlError::from)
    })
    .await;
    assert!(gone.is_err(), "{gone:?}");
    run(&s, "INSERT INTO t VALUES (11, 2)").await;
    assert_eq!(
        first_i64s(&run(&s, "SELECT k FROM t ORDER BY k").await),
        [1, 11]
    );

    // In a transaction, the timeout fails the transaction.
    run(&s, "SET statement_timeout = '500ms'").await;
    run(&s, "BEGIN").await;
    run(&s, "INSERT INTO t VALUES (3, 3)").await;
    let e = error(
        &s,
        "UPDATE t SET v = 9 WHERE k IN (SELECT value FROM generate_series(1, 3000000000))",
    )
    .await;
    assert!(e.contains("statement timeout"), "{e}");
    let e = error(&s, "SELECT count(*) FROM t").await;
    assert!(e.contains("rolled back"), "{e}");
    run(&s, "ROLLBACK").await;
    let rows = run(&s, "SELECT k, v FROM t ORDER BY k").await;
    assert_eq!(first_i64s(&rows), [1, 11]);
}

/// A query over its memory limit fails with the limit in the message (or spills); other
/// statements keep running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_over_its_memory_limit_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let options = DatabaseOptions {
        limits: nyala_sql::QueryLimits {
            query_memory_bytes: 1 << 20,
            ..Default::default()
        },
        ..Default::default()
    };
    let db = Database::open(dir.path(), options).await.unwrap();
    let s = db.session();
    let join = "SELECT count(*) FROM generate_series(1, 2000000) a \
                JOIN generate_series(1, 2000000) b ON a.value = b.value";
    let e = error(&s, join).await;
    assert!(e.contains("memory limit of 1 MiB"), "{e}");
    // Sorting spills to disk instead.
    let sorted = "SELECT value FROM generate_series(1, 300000) ORDER BY value DESC LIMIT 1";
    assert!(text(&s, sorted).await.contains("300000"));
    load_metrics(&s).await;
    assert!(text(&s, "SELECT count(*) FROM metrics").await.contains('5'));
}

/// With one query running at a time, a second waits its turn, and gives up at its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_beyond_the_running_limit_wait_their_turn() {
    let dir = tempfile::tempdir().unwrap();
    let options = DatabaseOptions {
        limits: nyala_sql::QueryLimits {
            max_running_queries: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    let db = Database::open(dir.path(), options).await.unwrap();
    let first = db.session();
    let second = db.session();
    // A query holds its turn while its stream is open.
    let open = first
        .execute("SELECT * FROM generate_series(1, 10)")
        .await
        .unwrap();
    run(&second, "SET statement_timeout = '200ms'").await;
    let e = error(&second, "SELECT 1").await;
    assert!(e.contains("waiting for one of the 1 queries"), "{e}");
    drop(open);
    assert!(text(&second, "SELECT 41 + 1").await.contains("42"));
}

/// A bulk ingest appending to table `table`.
fn append_to(table: &str) -> nyala_sql::IngestTarget {
    nyala_sql::IngestTarget {
        table: table.into(),
        mode: nyala_sql::IngestMode::Append,
        primary_key: vec![],
        buckets: 1,
    }
}

/// `batch` as an ingest's stream.
fn ingest_stream(
    batches: Vec<RecordBatch>,
) -> impl futures::Stream<Item = nyala_sql::Result<RecordBatch>> + Send {
    futures::stream::iter(batches.into_iter().map(Ok))
}

/// A batch that fails stops a load; the error counts the rows of the batches applied before it,
/// each whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_batch_stops_an_ingest_and_the_error_counts_the_rows_applied() {
    use arrow::array::{ArrayRef, Int64Array};
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE t (id BIGINT PRIMARY KEY) DISTRIBUTE BY HASH (id) INTO 4 BUCKETS",
    )
    .await;
    run(&s, "INSERT INTO t VALUES (150)").await;
    let append = append_to("t");
    let ids = |from: i64| {
        let ids = Arc::new(Int64Array::from_iter_values(from..from + 100)) as ArrayRef;
        RecordBatch::try_from_iter([("id", ids)]).unwrap()
    };
    // The second of four batches holds a key the table has.
    let data: Vec<RecordBatch> = [0, 100, 200, 300].into_iter().map(ids).collect();
    let e = s
        .ingest(&append, data[0].schema(), ingest_stream(data))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("duplicate"), "{e}");
    let applied: i64 = e
        .split("the load stopped after ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of the rows applied: {e}"));
    let count = |sql: &str| {
        let sql = sql.to_string();
        let s = &s;
        async move { first_i64s(&run(s, &sql).await)[0] }
    };
    assert_eq!(count("SELECT count(*) FROM t").await, 1 + applied, "{e}");
    assert_eq!(count("SELECT count(*) FROM t WHERE id < 100").await, 100);
    assert_eq!(
        count("SELECT count(*) FROM t WHERE id BETWEEN 100 AND 199").await,
        1
    );
    assert_eq!(applied, 100, "{e}");
    assert_eq!(count("SELECT count(*) FROM t WHERE id >= 200").await, 0);

    // A first batch that fails, alone, applies nothing and says nothing of a count.
    let e = s
        .ingest(&append, ids(150).schema(), ingest_stream(vec![ids(150)]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("duplicate") && !e.contains("the load stopped"),
        "{e}"
    );
    assert_eq!(count("SELECT count(*) FROM t").await, 1 + applied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_refuses_data_that_does_not_match_the_table() {
    use arrow::array::{ArrayRef, BinaryArray, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, name STRING, flag BOOL NOT NULL DEFAULT true, \
         score DOUBLE DEFAULT 1.5)",
    )
    .await;
    run(&s, "INSERT INTO t VALUES (1, 'one', false, 0.0)").await;
    let before = text(&s, "SELECT * FROM t ORDER BY id").await;
    let append = append_to("t");
    let batch = |columns: Vec<(&str, ArrayRef)>| RecordBatch::try_from_iter(columns).unwrap();
    let ids = |ids: Vec<i64>| Arc::new(Int64Array::from(ids)) as ArrayRef;
    let bytes = |n: usize| Arc::new(BinaryArray::from(vec![&b"x"[..]; n])) as ArrayRef;
    let cases = [
        // One unknown BINARY column, with and without rows.
        (
            batch(vec![("zz", bytes(1))]),
            vec!["no column 'zz' (Binary", "no column 'id'"],
        ),
        (
            batch(vec![("zz", bytes(0))]),
            vec!["no column 'zz' (Binary", "no column 'id'"],
        ),
        (
            batch(vec![("id", ids(vec![2])), ("flag", bytes(1))]),
            vec!["'flag' is BOOL and cannot hold the data's Binary values"],
        ),
        (
            batch(vec![
                ("id", ids(vec![2])),
                ("ID", ids(vec![3])),
                ("extra", bytes(1)),
            ]),
            vec!["no column 'ID'", "no column 'extra'"],
        ),
    ];
    for (data, needles) in cases {
        let schema = data.schema();
        let e = s
            .ingest(&append, schema, ingest_stream(vec![data]))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("does not match table 't', nothing was loaded"),
            "{e}"
        );
        for needle in needles {
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }
    // A schema without batches is checked too; a column given twice is refused.
    let twice = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("id", DataType::Int64, false),
    ]));
    let e = s
        .ingest(&append, twice, ingest_stream(vec![]))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("column 'id' appears twice"), "{e}");
    assert_eq!(text(&s, "SELECT * FROM t ORDER BY id").await, before);

    // Columns left out take their DEFAULT, else NULL; castable types are cast.
    let data = batch(vec![
        (
            "id",
            Arc::new(StringArray::from(vec!["2", "3"])) as ArrayRef,
        ),
        (
            "name",
            Arc::new(StringArray::from(vec![Some("two"), None])) as ArrayRef,
        ),
    ]);
    let loaded = s
        .ingest(&append, data.schema(), ingest_stream(vec![data]))
        .await
        .unwrap();
    assert_eq!(loaded, 2);
    let rows = text(&s, "SELECT id, name, flag, score FROM t ORDER BY id").await;
    assert!(rows.contains("| 2  | two  | true  | 1.5   |"), "{rows}");
    assert!(rows.contains("| 3  |      | true  | 1.5   |"), "{rows}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_is_opened_by_one_database_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    run(&s, "CREATE TABLE t (k BIGINT PRIMARY KEY)").await;
    let second = Database::open(dir.path(), DatabaseOptions::default()).await;
    let e = second.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("in use by another Nyala server"), "{e}");
    // The first goes on; once it is gone, the directory opens again.
    run(&s, "INSERT INTO t VALUES (1)").await;
    db.shutdown().await.unwrap();
    let (_db, s) = crash_and_reopen(dir.path(), db, s).await;
    assert_eq!(first_i64s(&run(&s, "SELECT k FROM t").await), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_reopen_with_and_without_flush() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (db, s) = open(dir.path()).await;
        load_metrics(&s).await;
        run(&s, "DELETE FROM metrics WHERE host = 'c'").await;
        db.shutdown().await.unwrap();
    }
    let (_db, s) = {
        let (db, s) = open(dir.path()).await;
        assert!(text(&s, "SELECT count(*) FROM metrics")
            .await
            .contains("| 4 "));
        run(&s, "UPDATE metrics SET value = 100 WHERE host = 'b'").await;
        // Dropped without shutdown: the Raft logs must bring the update back.
        crash_and_reopen(dir.path(), db, s).await
    };
    let got = text(&s, "SELECT sum(value) FROM metrics").await;
    assert!(got.contains("| 109.0 "), "{got}");
}

/// Big (k, c) with 20 000 rows over 4 tablets: keys 0..14 999 flushed into three DiskRowSets
/// per tablet of 5 000 consecutive keys each, 15 000..19 999 in the MemRowSets. And a small
/// table whose keys are the lowest and highest of big's plus NULLs and misses.
async fn load_join_tables(dir: &std::path::Path) -> (Arc<Database>, Session) {
    let (mut db, mut s) = open(dir).await;
    run(
        &s,
        "CREATE TABLE big (k BIGINT, c STRING, v BIGINT, n BIGINT NULL, PRIMARY KEY (k, c)) \
         DISTRIBUTE BY HASH (k) INTO 4 BUCKETS",
    )
    .await;
    for start in (0..20_000).step_by(5_000) {
        run(
            &s,
            &format!(
                "INSERT INTO big SELECT value, CAST(value % 3 AS STRING), value * 10, \
                 CASE WHEN value % 7 = 0 THEN NULL ELSE value % 100 END \
                 FROM generate_series({start}, {}) AS g(value)",
                start + 4_999
            ),
        )
        .await;
        if start < 15_000 {
            // Shutting down flushes each tablet's MemRowSet into a new DiskRowSet.
            db.shutdown().await.unwrap();
            drop(s);
            drop(db);
            (db, s) = open(dir).await;
        }
    }
    run(
        &s,
        "CREATE TABLE small (id BIGINT PRIMARY KEY, k BIGINT NULL, c STRING NULL, w BIGINT)",
    )
    .await;
    run(
        &s,
        "INSERT INTO small SELECT value, CASE WHEN value < 50 THEN value \
         WHEN value < 100 THEN 19900 + value WHEN value < 105 THEN NULL ELSE 100000 + value END, \
         CAST(value % 3 AS STRING), value AS w FROM generate_series(0, 109) AS g(value)",
    )
    .await;
    (db, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_give_the_same_rows_with_and_without_runtime_filters() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = load_join_tables(dir.path()).await;
    let queries = [
        "SELECT b.k, b.c, b.v, s.w FROM big b JOIN small s ON b.k = s.k ORDER BY b.k, b.c, s.w",
        "SELECT b.k, b.c, s.id FROM big b JOIN small s ON b.k = s.k AND b.c = s.c ORDER BY 1, 2, 3",
        "SELECT s.id, b.k, b.v FROM small s LEFT JOIN big b ON b.k = s.k ORDER BY 1, 2, 3",
        "SELECT b.k, b.v FROM big b LEFT JOIN small s ON b.k = s.k WHERE b.k % 97 = 0 ORDER BY 1",
        "SELECT k, c FROM big WHERE k IN (SELECT k FROM small) ORDER BY 1, 2",
        "SELECT count(*) FROM big b WHERE NOT EXISTS (SELECT 1 FROM small s WHERE s.k = b.k)",
        "SELECT count(*) FROM big WHERE k NOT IN (SELECT k FROM small WHERE k IS NOT NULL)",
        "SELECT count(*) FROM big WHERE k NOT IN (SELECT k FROM small)",
        "SELECT count(*) FROM small WHERE k NOT IN (SELECT k FROM big)",
        "SELECT count(*) FROM small WHERE k NOT IN (SELECT n FROM big)",
        "SELECT b.k, b.n, s.id FROM big b JOIN small s ON b.n = s.k ORDER BY 1, 3",
        "SELECT b.k, s.id FROM big b JOIN small s ON b.n IS NOT DISTINCT FROM s.k \
         WHERE b.k < 300 ORDER BY 1, 2",
        "SELECT b.k FROM big b JOIN small s ON b.k = s.k WHERE s.w < 0",
        "SELECT b.k FROM big b JOIN small s ON b.k = s.k + 1 WHERE b.v > 500 ORDER BY 1",
        "SELECT b.k, s.id FROM big b JOIN (SELECT id, k FROM small WHERE k IS NULL) s \
         ON b.k = s.k",
        "SELECT s.w, b.v FROM big b JOIN small s ON b.k = s.k ORDER BY b.v",
        "SELECT s.id, t.k FROM small s JOIN (SELECT k FROM big ORDER BY v DESC LIMIT 60) t \
         ON t.k = s.k ORDER BY 1, 2",
        // Filters placed below another join: on its inner side, an outer join's preserved
        // and null-extended sides, a semi join's.
        "SELECT x.k, x.w FROM small s2 JOIN (SELECT b.k, s.w FROM big b JOIN small s \
         ON b.k = s.k) x ON s2.w = x.w WHERE s2.id < 5 ORDER BY 1, 2",
        "SELECT x.id, x.v FROM small s2 JOIN (SELECT s.id, b.v FROM small s LEFT JOIN big b \
         ON b.k = s.k) x ON s2.w = x.v ORDER BY 1, 2",
        "SELECT x.id, x.v FROM small s2 JOIN (SELECT s.id, b.v FROM small s LEFT JOIN big b \
         ON b.k = s.k) x ON s2.id = x.id WHERE s2.w < 7 ORDER BY 1, 2",
        "SELECT x.k, x.v FROM small s2 JOIN (SELECT b.k, b.v FROM big b FULL JOIN small s \
         ON b.k = s.k) x ON s2.k = x.k ORDER BY 1, 2",
        "SELECT count(*), sum(x.w) FROM small s2 JOIN (SELECT s.w FROM small s \
         WHERE s.k IN (SELECT k FROM big)) x ON s2.w = x.w WHERE s2.id < 20",
        // ...and below aggregates, by what they group by (not by their results, nor through
        // grouping sets, whose totals span groups).
        "SELECT s.id, a.total, a.n FROM small s JOIN (SELECT k, sum(v) AS total, count(*) AS n \
         FROM big GROUP BY k) a ON a.k = s.k ORDER BY 1",
        "SELECT s.id, a.k FROM small s JOIN (SELECT k, sum(v) AS total FROM big GROUP BY k) a \
         ON a.total = s.w ORDER BY 1, 2",
        "SELECT s.id, a.c, a.total FROM small s JOIN (SELECT c, k % 3 AS m, sum(v) AS total \
         FROM big GROUP BY ROLLUP (c, k % 3)) a ON a.c = s.c AND a.m IS NOT DISTINCT FROM NULL \
         ORDER BY 1, 2",
        "SELECT s.id, a.total FROM small s JOIN (SELECT k, sum(v) AS total FROM big \
         WHERE k % 5 = 0 GROUP BY k HAVING sum(v) > 100) a ON a.k = s.k ORDER BY 1",
    ];
    let mut expected = Vec::new();
    run(&s, "SET nyala.runtime_filters = off").await;
    for query in queries {
        expected.push(text(&s, query).await);
    }
    // Joins that collect their build side (these small ones, by default), then joins that
    // hash-partition both sides, whose filters hold the keys of every build partition.
    for partitioned in [false, true] {
        if partitioned {
            force_partitioned_joins(&s).await;
        }
        for (query, expected) in queries.iter().zip(&expected) {
            for mode in ["minmax", "bloom"] {
                run(&s, &format!("SET nyala.runtime_filters = {mode}")).await;
                let got = text(&s, query).await;
                assert_eq!(
                    &got, expected,
                    "{query} with {mode}, partitioned: {partitioned}"
                );
            }
        }
    }
    let plan = text(
        &s,
        "EXPLAIN ANALYZE SELECT count(*) FROM big b JOIN small s ON b.k = s.k",
    )
    .await;
    assert!(
        plan.contains("mode=Partitioned") && plan.contains("RuntimeFilterBuildExec"),
        "{plan}"
    );
    assert!(
        counter(scan_line(&plan, "big"), "removed") > 10_000,
        "{plan}"
    );
    // The inner join finds 100 keys, 3 rows each? No: one row per key (c = k % 3).
    let joined = text(&s, "SELECT count(*) FROM big b JOIN small s ON b.k = s.k").await;
    assert!(joined.contains("| 100 "), "{joined}");
}

/// The `NyalaScanExec` line of `table` in an EXPLAIN output.
/// Scans give DataFusion the row counts of their tablets and the value ranges and NULL counts
/// their files record, for join planning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scans_report_column_ranges_from_their_files() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = load_join_tables(dir.path()).await;
    run(&s, "SET datafusion.explain.show_statistics = true").await;
    let plan = text(&s, "EXPLAIN SELECT k, n FROM big").await;
    let line = scan_line(&plan, "big");
    // Keys 0..14 999 are in files, the rest in memory (not counted in the ranges).
    assert!(line.contains("Rows=Inexact(20000)"), "{line}");
    assert!(
        line.contains("Min=Inexact(Int64(0)) Max=Inexact(Int64(14999))"),
        "{line}"
    );
    // n: NULL for every seventh value among the 15 000 rows in files.
    assert!(line.contains("Null=Inexact(2143)"), "{line}");
}

/// Filters on string columns in files (decoded as dictionaries to be tested, or as views)
/// select the same rows as on rows in memory, and the strings come back as `Utf8` (the query
/// engine works on `Utf8View`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_filters_on_flushed_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE strs (k BIGINT PRIMARY KEY, s STRING NULL) DISTRIBUTE BY HASH (k) INTO 2 BUCKETS",
    )
    .await;
    let insert = "INSERT INTO strs SELECT value, CASE WHEN value % 5 = 0 THEN NULL \
                  ELSE chr(97 + CAST(value % 4 AS INT)) END FROM generate_series(1, 2000) AS g(value)";
    run(&s, insert).await;
    let queries = [
        "SELECT count(*), min(s), max(s) FROM strs WHERE s = 'b'",
        "SELECT count(*), min(s), max(s) FROM strs WHERE s IN ('a', 'c')",
        "SELECT count(*), min(s), max(s) FROM strs WHERE s < 'c'",
        "SELECT count(*), min(s), max(s) FROM strs WHERE s >= 'c' AND s <> 'd'",
        "SELECT count(*) FROM strs WHERE s IS NULL",
        "SELECT s, count(*) FROM strs WHERE s IN ('d', 'zz') GROUP BY s",
        "SELECT s, count(*), min(k) FROM strs GROUP BY s ORDER BY s",
        "SELECT count(*) FROM strs WHERE s LIKE 'a%' OR s > 'c'",
        "SELECT a.s, count(*) FROM strs a JOIN strs b ON a.s = b.s WHERE a.k < 40 AND b.k < 30 \
         GROUP BY a.s ORDER BY a.s",
        "SELECT k, upper(s), s || '!', length(s) FROM strs WHERE k < 6 ORDER BY k",
    ];
    let mut in_memory = Vec::new();
    for q in queries {
        in_memory.push(text(&s, q).await);
    }
    // Shutting down flushes the rows into DiskRowSets.
    db.shutdown().await.unwrap();
    drop(s);
    drop(db);
    let (_db, s) = open(dir.path()).await;
    for (q, expected) in queries.iter().zip(&in_memory) {
        assert_eq!(&text(&s, q).await, expected, "{q}");
    }
    assert!(in_memory[0].contains("| 400      | b"), "{}", in_memory[0]);
    // Rows in files and in memory together.
    run(&s, "UPDATE strs SET s = 'e' WHERE k % 100 = 1").await;
    let mixed = text(
        &s,
        "SELECT s, count(*) FROM strs WHERE s >= 'd' GROUP BY s ORDER BY s",
    )
    .await;
    assert!(
        mixed.contains("| d | 400      |") && mixed.contains("| e | 20       |"),
        "{mixed}"
    );
    let rows = run(
        &s,
        "SELECT k, s, upper(s) AS u FROM strs WHERE k < 3 ORDER BY k",
    )
    .await;
    for field in rows[0].schema().fields().iter().skip(1) {
        assert_eq!(
            field.data_type(),
            &arrow::datatypes::DataType::Utf8,
            "{field}"
        );
    }
}

/// A transaction that changed rows of a table keyed by a string reads its own rows in place of
/// the stored ones, whether those are in files or in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_reads_its_writes_to_a_table_keyed_by_strings() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    run(&s, "CREATE TABLE names (name STRING PRIMARY KEY, v BIGINT)").await;
    run(&s, "INSERT INTO names VALUES ('a', 1), ('b', 2), ('c', 3)").await;
    db.shutdown().await.unwrap();
    drop(s);
    drop(db);
    let (_db, s) = open(dir.path()).await;
    run(&s, "INSERT INTO names VALUES ('d', 4)").await;
    run(&s, "BEGIN").await;
    run(&s, "UPDATE names SET v = 20 WHERE name = 'b'").await;
    run(&s, "UPDATE names SET v = 40 WHERE name = 'd'").await;
    let inside = text(&s, "SELECT name, v FROM names ORDER BY name").await;
    run(&s, "ROLLBACK").await;
    let after = text(&s, "SELECT name, v FROM names ORDER BY name").await;
    let rows = |t: &str| {
        t.lines()
            .filter(|l| l.starts_with("| ") && !l.contains("name"))
            .count()
    };
    assert_eq!(rows(&inside), 4, "{inside}");
    assert!(
        inside.contains("| b    | 20 |") && inside.contains("| d    | 40 |"),
        "{inside}"
    );
    assert!(
        after.contains("| b    | 2 |") && after.contains("| d    | 4 |"),
        "{after}"
    );
}

fn scan_line<'a>(plan: &'a str, table: &str) -> &'a str {
    plan.lines()
        .find(|l| l.contains(&format!("NyalaScanExec: table={table},")))
        .unwrap_or_else(|| panic!("no scan of {table} in {plan}"))
}

/// The number after `name=` in an EXPLAIN ANALYZE line.
fn counter(line: &str, name: &str) -> u64 {
    line.split(&format!("{name}="))
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_analyze_shows_runtime_filters_per_scan() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = load_join_tables(dir.path()).await;
    let plan = text(
        &s,
        "EXPLAIN ANALYZE SELECT count(*) FROM big b JOIN small s ON b.k = s.k",
    )
    .await;
    assert!(plan.contains("RuntimeFilterBuildExec"), "{plan}");
    let scan = scan_line(&plan, "big");
    assert!(
        scan.contains("runtime_filters=[k #") && scan.contains("min=0, max=100109"),
        "{scan}"
    );
    assert!(counter(scan, "removed") > 10_000, "{scan}");
    // The scan output only what passed.
    assert!(scan.contains("output_rows="), "{scan}");

    // Keys 0..49 only: rowsets and row groups holding other keys are skipped by their
    // statistics, so fewer rows are even checked.
    let plan = text(
        &s,
        "EXPLAIN ANALYZE SELECT count(*) FROM big b JOIN small s ON b.k = s.k WHERE s.id < 50",
    )
    .await;
    let scan = scan_line(&plan, "big");
    let checked = counter(scan, "checked");
    // Two of the three DiskRowSets of each tablet are skipped; the first and the MemRowSet
    // rows are checked.
    assert!(
        scan.contains("min=0, max=49") && checked <= 10_000,
        "{scan}"
    );

    run(&s, "SET nyala.runtime_filters = off").await;
    let plan = text(
        &s,
        "EXPLAIN ANALYZE SELECT count(*) FROM big b JOIN small s ON b.k = s.k",
    )
    .await;
    assert!(!plan.contains("runtime_filters="), "{plan}");
    assert!(error(&s, "SET nyala.runtime_filters = sometimes")
        .await
        .contains("expected off, minmax or bloom"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_select_rows_with_a_join() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = load_join_tables(dir.path()).await;
    run(
        &s,
        "UPSERT INTO big SELECT b.k, b.c, b.v + s.w, b.n FROM small s JOIN big b ON b.k = s.k",
    )
    .await;
    let got = text(&s, "SELECT sum(v) FROM big").await;
    // Sum of v = 10 * sum(0..20000) plus sum of w over the 100 matched small rows (0..100).
    assert!(
        got.contains(&format!("| {} ", 10 * 19_999 * 20_000_i64 / 2 + 4_950)),
        "{got}"
    );

    run(
        &s,
        "UPDATE big SET v = 0 WHERE k IN (SELECT k FROM small WHERE id < 10)",
    )
    .await;
    let got = text(&s, "SELECT count(*) FROM big WHERE v = 0").await;
    assert!(got.contains("| 10 "), "{got}");

    run(
        &s,
        "UPDATE big SET v = 1000000 + v WHERE EXISTS \
         (SELECT 1 FROM small s WHERE s.k = big.k AND s.c = big.c)",
    )
    .await;
    let got = text(&s, "SELECT count(*), min(v) FROM big WHERE v >= 1000000").await;
    // Only the 50 lowest keys also match on c; 10 of them had v set to 0.
    assert!(got.contains("| 50 ") && got.contains("| 1000000 "), "{got}");
    let e = error(&s, "UPDATE big SET k = 1 WHERE k IN (SELECT k FROM small)").await;
    assert!(e.contains("cannot update primary key column 'k'"), "{e}");

    run(
        &s,
        "DELETE FROM big WHERE EXISTS (SELECT 1 FROM small s WHERE s.k = big.k AND s.id < 50)",
    )
    .await;
    let got = text(&s, "SELECT count(*) FROM big").await;
    assert!(got.contains("| 19950 "), "{got}");
    run(&s, "DELETE FROM big WHERE k IN (SELECT k FROM small)").await;
    let got = text(&s, "SELECT count(*) FROM big").await;
    assert!(got.contains("| 19900 "), "{got}");
    let plan = text(
        &s,
        "EXPLAIN DELETE FROM big WHERE k IN (SELECT k FROM small)",
    )
    .await;
    assert!(plan.contains("NyalaMutation: DELETE big"), "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_filters_from_datafusion_reach_the_scan() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = load_join_tables(dir.path()).await;
    // A TopK's dynamic filter is handed to the scan (and applied as far as it is known when
    // the tablet scan starts).
    let plan = text(&s, "EXPLAIN SELECT k, v FROM big ORDER BY v DESC LIMIT 3").await;
    assert!(plan.contains("dynamic_filters=["), "{plan}");
    let top = text(&s, "SELECT k, v FROM big ORDER BY v DESC LIMIT 3").await;
    assert!(top.contains("| 19999 | 199990 |"), "{top}");
    // A join's own dynamic filter is dropped where a runtime filter does its work...
    let plan = text(
        &s,
        "EXPLAIN SELECT b.v FROM big b JOIN small s ON b.k = s.k",
    )
    .await;
    let scan = scan_line(&plan, "big");
    assert!(
        scan.contains("runtime_filters=") && !scan.contains("dynamic_filters="),
        "{scan}"
    );
    // ...and with runtime filters off, neither kind reaches the scan.
    run(&s, "SET nyala.runtime_filters = off").await;
    let plan = text(
        &s,
        "EXPLAIN SELECT b.v FROM big b JOIN small s ON b.k = s.k",
    )
    .await;
    let scan = scan_line(&plan, "big");
    assert!(
        !scan.contains("runtime_filters=") && !scan.contains("dynamic_filters="),
        "{scan}"
    );
    run(&s, "SET nyala.runtime_filters = bloom").await;
}

/// A join's filter reaches a scan below another join, here the scan of `small s` that the lower
/// join collects (and starts at once, before the upper join has read its own build side).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_filter_reaches_a_scan_below_another_join() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = load_join_tables(dir.path()).await;
    let query = "SELECT count(*), sum(x.v) FROM small s2 JOIN (SELECT b.v, s.w FROM big b \
                 JOIN small s ON b.k = s.k) x ON s2.w = x.w WHERE s2.id < 5";
    let plan = text(&s, &format!("EXPLAIN ANALYZE {query}")).await;
    let below = plan
        .lines()
        .find(|l| l.contains("NyalaScanExec: table=small") && l.contains("runtime_filters=[w #"))
        .unwrap_or_else(|| panic!("no filter on w below the lower join: {plan}"));
    // 5 keys of small's 110 rows.
    assert!(counter(below, "removed") >= 100, "{below}");
    let got = text(&s, query).await;
    run(&s, "SET nyala.runtime_filters = off").await;
    assert_eq!(got, text(&s, query).await);
    assert!(got.contains("| 5 "), "{got}");

    // Below an aggregate, by the column it groups by: big's rows of the 5 keys only.
    run(&s, "SET nyala.runtime_filters = bloom").await;
    let query = "SELECT a.k, a.total FROM small s JOIN (SELECT k, sum(v) AS total FROM big \
                 GROUP BY k) a ON a.k = s.k WHERE s.id < 5 ORDER BY 1";
    let plan = text(&s, &format!("EXPLAIN ANALYZE {query}")).await;
    let scan = scan_line(&plan, "big");
    assert!(scan.contains("runtime_filters=[k #"), "{plan}");
    let got = text(&s, query).await;
    run(&s, "SET nyala.runtime_filters = off").await;
    assert_eq!(got, text(&s, query).await);
}

/// Makes DataFusion hash-partition both sides of every hash join, however small the build side
/// (which it otherwise collects whole).
async fn force_partitioned_joins(s: &Session) {
    for threshold in ["", "_rows"] {
        let sql =
            format!("SET datafusion.optimizer.hash_join_single_partition_threshold{threshold} = 0");
        run(s, &sql).await;
    }
}

/// A partitioned hash join's filter reaches the scan below an aggregate grouping by the join
/// key, with the keys of every partition's build side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_joins_filter_narrows_the_scan_below_an_aggregate() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = load_join_tables(dir.path()).await;
    let query = "SELECT s.id, a.total FROM small s \
                 JOIN (SELECT k, sum(v) AS total FROM big GROUP BY k) a ON a.k = s.k \
                 WHERE s.w < 60 ORDER BY s.id";
    run(&s, "SET nyala.runtime_filters = off").await;
    let expected = text(&s, query).await;
    run(&s, "SET nyala.runtime_filters = bloom").await;
    // Small tables join with the build side collected whole unless told otherwise.
    force_partitioned_joins(&s).await;
    let plan = text(&s, &format!("EXPLAIN ANALYZE {query}")).await;
    assert!(plan.contains("mode=Partitioned"), "{plan}");
    let scan = scan_line(&plan, "big");
    assert!(scan.contains("runtime_filters=[k #"), "{scan}");
    // 60 rows of small, 59 distinct keys (one NULL-free key range), each 3 rows in big.
    // (EXPLAIN ANALYZE writes 1 000 and more as "1.00 K".)
    let read = scan.split("output_rows=").nth(1).unwrap_or_default();
    let read = &read[..read.find([',', ']']).unwrap_or(read.len())];
    assert!(
        read.parse::<u64>().is_ok_and(|n| n < 1_000),
        "the scan of big read {read} rows: {scan}"
    );
    assert_eq!(text(&s, query).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equality_on_hash_columns_scans_only_their_tablets() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    load_metrics(&s).await;
    let point = "SELECT value FROM metrics WHERE host = 'a' AND metric = 'cpu' ORDER BY value";
    let plan = text(&s, &format!("EXPLAIN {point}")).await;
    assert!(plan.contains("tablets=1 of 4"), "{plan}");
    let got = text(&s, point).await;
    assert!(
        got.contains("| 0.5   |") && got.contains("| 7.5   |"),
        "{got}"
    );
    // Every (host, metric) pair, found through pruning, matches a full scan.
    for (host, metric) in [
        ("a", "cpu"),
        ("a", "mem"),
        ("b", "cpu"),
        ("c", "cpu"),
        ("x", "cpu"),
    ] {
        let pruned = text(
            &s,
            &format!("SELECT count(*) FROM metrics WHERE host = '{host}' AND metric = '{metric}'"),
        )
        .await;
        let full = text(
            &s,
            &format!(
                "SELECT count(*) FROM metrics WHERE host || '' = '{host}' AND metric || '' = '{metric}'"
            ),
        )
        .await;
        assert_eq!(pruned, full, "{host} {metric}");
    }
    let plan = text(
        &s,
        "EXPLAIN SELECT * FROM metrics WHERE host IN ('a', 'b') AND metric = 'cpu'",
    )
    .await;
    assert!(
        plan.contains("tablets=1 of 4") || plan.contains("tablets=2 of 4"),
        "{plan}"
    );
    let got = text(
        &s,
        "SELECT count(*) FROM metrics WHERE host IN ('a', 'b', 'c') AND metric = 'cpu'",
    )
    .await;
    assert!(got.contains("| 4 "), "{got}");
    // Only part of the hash columns: every tablet.
    let plan = text(&s, "EXPLAIN SELECT * FROM metrics WHERE host = 'a'").await;
    assert!(plan.contains("tablets=4,"), "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_and_hash_predicates_scan_only_their_tablets() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE events (host STRING, day DATE, seq BIGINT, PRIMARY KEY (host, day, seq)) \
         DISTRIBUTE BY HASH (host) INTO 3 BUCKETS, HASH (seq) INTO 2 BUCKETS, RANGE (day) \
         SPLIT ROWS (('2026-01-01'), ('2026-02-01'))",
    )
    .await;
    let mut values = Vec::new();
    for i in 0..300 {
        let day = ["2025-12-15", "2026-01-15", "2026-02-15"][i % 3];
        values.push(format!("('h{}', '{day}', {i})", i % 7));
    }
    run(
        &s,
        &format!("INSERT INTO events VALUES {}", values.join(", ")),
    )
    .await;
    for (predicate, tablets) in [
        ("day >= '2026-02-01'", "tablets=6 of 18"),
        ("day > '2026-01-31'", "tablets=12 of 18"),
        ("day > '2026-02-01'", "tablets=6 of 18"),
        ("day < '2026-01-01'", "tablets=6 of 18"),
        ("day <= '2026-01-01'", "tablets=12 of 18"),
        (
            "day BETWEEN '2026-01-02' AND '2026-01-30'",
            "tablets=6 of 18",
        ),
        ("day IN ('2025-01-01', '2026-02-20')", "tablets=12 of 18"),
        ("host = 'h1'", "tablets=6 of 18"),
        (
            "host = 'h1' AND seq = 8 AND day = '2026-02-15'",
            "tablets=1 of 18",
        ),
        ("day = '2026-01-15' AND seq IN (1, 2)", "tablets=3 of 18"),
        ("seq = 8 OR day = '2026-01-15'", "tablets=18,"),
    ] {
        let query = format!("SELECT count(*) FROM events WHERE {predicate}");
        let plan = text(&s, &format!("EXPLAIN {query}")).await;
        assert!(plan.contains(tablets), "{predicate}: {plan}");
        // The pruned scan counts what a scan of every tablet counts.
        let unpruned = predicate
            .replace("day", "(day + INTERVAL '0' DAY)")
            .replace("host", "(host || '')")
            .replace("seq", "(seq + 0)");
        assert_eq!(
            text(&s, &query).await,
            text(&s, &format!("SELECT count(*) FROM events WHERE {unpruned}")).await,
            "{predicate}"
        );
    }
    // Range partitions added and dropped survive a restart, with their rows.
    run(
        &s,
        "ALTER TABLE events DROP RANGE PARTITION VALUES < '2026-01-01'",
    )
    .await;
    run(
        &s,
        "ALTER TABLE events ADD RANGE PARTITION VALUES < '2025-01-01'",
    )
    .await;
    run(&s, "INSERT INTO events VALUES ('x', '2024-05-05', 1)").await;
    _db.shutdown().await.unwrap();
    drop((s, _db));
    let (_db, s) = open(dir.path()).await;
    let got = text(&s, "SELECT count(*) AS n FROM events").await;
    assert!(got.contains("| 201 |"), "{got}");
    let create = text(&s, "SHOW CREATE TABLE events").await;
    assert!(
        create.contains("RANGE (day) (PARTITION VALUES < '2025-01-01', PARTITION '2026-01-01' <= VALUES < '2026-02-01', PARTITION '2026-02-01' <= VALUES)"),
        "{create}"
    );
    assert!(
        error(&s, "INSERT INTO events VALUES ('x', '2025-05-05', 1)")
            .await
            .contains("outside every range partition")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_create_table_recreates_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    load_metrics(&s).await;
    run(
        &s,
        "CREATE TABLE people (id BIGINT PRIMARY KEY, name STRING NOT NULL DEFAULT 'it''s me' \
         COMMENT 'full name', born DATE DEFAULT '2000-01-01', score DOUBLE DEFAULT -1.5, balance DECIMAL(12, 2) DEFAULT 0.50, photo BINARY)",
    )
    .await;
    run(
        &s,
        "CREATE TABLE events (host STRING ENCODING PREFIX_ENCODING, day DATE, \
         seq BIGINT ENCODING DELTA COMPRESSION ZSTD, PRIMARY KEY (host, day, seq)) \
         DISTRIBUTE BY HASH (host) INTO 3 BUCKETS, HASH (seq) INTO 2 BUCKETS, RANGE (day) (\
         PARTITION VALUES < '2026-01-01', PARTITION '2026-01-01' <= VALUES < '2026-02-01', \
         PARTITION VALUE = '2030-01-01', PARTITION '2031-01-01' < VALUES)",
    )
    .await;
    run(
        &s,
        "CREATE TABLE spans (a STRING, b INT, PRIMARY KEY (a, b)) \
         PARTITION BY RANGE (a, b) SPLIT ROWS (('it''s', 5), ('z', -1))",
    )
    .await;
    run(
        &s,
        "CREATE TABLE visits (user_id BIGINT, page STRING, NON UNIQUE PRIMARY KEY (user_id)) \
         DISTRIBUTE BY HASH INTO 2 BUCKETS",
    )
    .await;
    for table in ["metrics", "people", "events", "spans", "visits"] {
        let show = run(&s, &format!("SHOW CREATE TABLE {table}")).await;
        let create = show[0]
            .column_by_name("create_statement")
            .unwrap()
            .as_any()
            .downcast_ref::<arrow::array::StringArray>()
            .unwrap()
            .value(0)
            .to_string();
        let describe = text(&s, &format!("DESCRIBE {table}")).await;
        let partitions = format!(
            "SELECT tablet, hash_buckets, range FROM sys.partitions \
             WHERE table_name = '{table}' ORDER BY tablet"
        );
        let tablets = text(&s, &partitions).await;
        run(&s, &format!("DROP TABLE {table}")).await;
        run(&s, &create).await;
        assert_eq!(
            text(&s, &format!("DESCRIBE {table}")).await,
            describe,
            "{create}"
        );
        let again = run(&s, &format!("SHOW CREATE TABLE {table}")).await;
        assert_eq!(again, show, "{create}");
        assert_eq!(text(&s, &partitions).await, tablets, "{create}");
    }
    // Defaults fill left-out columns, also after the database is reopened.
    run(&s, "INSERT INTO people (id) VALUES (7)").await;
    // Shutting down flushes the rows into DiskRowSets.
    _db.shutdown().await.unwrap();
    drop(s);
    drop(_db);
    let (_db, s) = open(dir.path()).await;
    let got = text(&s, "SELECT name, born, score, balance FROM people").await;
    assert!(
        got.contains("| it's me | 2000-01-01 | -1.5  | 0.50    |"),
        "{got}"
    );
    let metrics = text(&s, "SHOW CREATE TABLE metrics").await;
    assert!(
        metrics.contains("DISTRIBUTE BY HASH (host, metric) INTO 4 BUCKETS"),
        "{metrics}"
    );
    let events = text(&s, "SHOW CREATE TABLE events").await;
    assert!(
        events.contains("seq INT64 ENCODING DELTA COMPRESSION ZSTD"),
        "{events}"
    );
    assert!(
        events.contains("RANGE (day) (PARTITION VALUES < '2026-01-01', PARTITION '2026-01-01' <= VALUES < '2026-02-01', PARTITION VALUE = '2030-01-01', PARTITION '2031-01-01' < VALUES)"),
        "{events}"
    );
    assert!(error(&s, "SHOW CREATE TABLE nope").await.contains("nope"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_with_its_own_hash_buckets_is_pruned_by_them() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    // The old range: the table's 2 buckets; the recent one: 6 of its own.
    run(
        &s,
        "CREATE TABLE m (host STRING, day DATE, v BIGINT, PRIMARY KEY (host, day)) \
         DISTRIBUTE BY HASH (host) INTO 2 BUCKETS, RANGE (day) \
         (PARTITION VALUES < '2026-01-01', \
          PARTITION '2026-01-01' <= VALUES < '2027-01-01' HASH (host) INTO 6 BUCKETS)",
    )
    .await;
    run(
        &s,
        "ALTER TABLE m ADD RANGE PARTITION '2027-01-01' <= VALUES \
         HASH (host) INTO 2 BUCKETS, HASH (day) INTO 2 BUCKETS",
    )
    .await;
    let mut values = Vec::new();
    for i in 0..240 {
        let day = ["2025-06-01", "2026-06-01", "2027-06-01"][i % 3];
        values.push(format!("('h{i}', '{day}', {i})"));
    }
    run(&s, &format!("INSERT INTO m VALUES {}", values.join(", "))).await;
    let partitions = run(&s, "SHOW PARTITIONS m").await;
    assert_eq!(
        partitions.iter().map(|b| b.num_rows()).sum::<usize>(),
        2 + 6 + 4
    );
    let shown = text(&s, "SHOW PARTITIONS m").await;
    assert!(shown.contains("HASH (host) bucket 5 of 6"), "{shown}");
    for (predicate, tablets, rows) in [
        ("day = '2026-06-01'", "tablets=6 of 12", 80),
        ("day < '2026-01-01'", "tablets=2 of 12", 80),
        ("host = 'h4' AND day = '2026-06-01'", "tablets=1 of 12", 1),
        ("host = 'h5' AND day = '2027-06-01'", "tablets=1 of 12", 1),
        ("host = 'h5'", "tablets=4 of 12", 1),
    ] {
        let query = format!("SELECT count(*) AS n FROM m WHERE {predicate}");
        let plan = text(&s, &format!("EXPLAIN {query}")).await;
        assert!(plan.contains(tablets), "{predicate}: {plan}");
        let counted = text(&s, &query).await;
        assert!(
            counted.contains(&format!("| {rows} ")),
            "{predicate}: {counted}"
        );
    }
    let create = text(&s, "SHOW CREATE TABLE m").await;
    assert!(
        create
            .contains("PARTITION '2026-01-01' <= VALUES < '2027-01-01' HASH (host) INTO 6 BUCKETS")
            && create.contains("HASH (host) INTO 2 BUCKETS, HASH (day) INTO 2 BUCKETS)"),
        "{create}"
    );
    // Updates and deletes find each row's tablet; dropping a range drops its own tablets.
    assert_eq!(
        affected(&run(&s, "UPDATE m SET v = -v WHERE v % 2 = 0").await),
        120
    );
    // The ranges keep their levels across a restart.
    let (db, s) = crash_and_reopen(dir.path(), db, s).await;
    let plan = text(
        &s,
        "EXPLAIN SELECT * FROM m WHERE host = 'h4' AND day = '2026-06-01'",
    )
    .await;
    assert!(plan.contains("tablets=1 of 12"), "{plan}");
    run(
        &s,
        "ALTER TABLE m DROP RANGE PARTITION '2026-01-01' <= VALUES < '2027-01-01'",
    )
    .await;
    let left = text(&s, "SELECT count(*) AS n, sum(v) AS v FROM m").await;
    let expected: i64 = (0..240)
        .filter(|i| i % 3 != 1)
        .map(|i| if i % 2 == 0 { -i } else { i })
        .sum();
    assert!(left.contains(&format!("| 160 | {expected} |")), "{left}");
    let e = error(
        &s,
        "ALTER TABLE m ADD RANGE PARTITION VALUES < '2020-01-01' HASH (v) INTO 2 BUCKETS",
    )
    .await;
    assert!(e.contains("not part of the primary key"), "{e}");
    db.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_partitions_lists_every_tablet() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    load_metrics(&s).await;
    let batches = run(&s, "SHOW PARTITIONS metrics").await;
    let batch = &batches[0];
    assert_eq!(batch.num_rows(), 4);
    let rows = batch
        .column_by_name("estimated_rows")
        .unwrap()
        .as_any()
        .downcast_ref::<arrow::array::UInt64Array>()
        .unwrap();
    assert_eq!(rows.iter().flatten().sum::<u64>(), 5);
    let shown = text(&s, "SHOW PARTITIONS metrics").await;
    assert!(
        shown.contains("HASH (host, metric) bucket 3 of 4") && shown.contains("local"),
        "{shown}"
    );
    assert!(error(&s, "SHOW PARTITIONS nope").await.contains("nope"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_tables_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (db, s) = open(dir.path()).await;
        load_metrics(&s).await;
        run(&s, "ALTER TABLE metrics RENAME TO measurements").await;
        run(
            &s,
            "INSERT INTO measurements VALUES ('d', '2026-01-01T00:00:00', 'cpu', 1.0)",
        )
        .await;
        db.shutdown().await.unwrap();
    }
    let (_db, s) = open(dir.path()).await;
    assert!(text(&s, "SELECT count(*) FROM measurements")
        .await
        .contains("| 6 "));
    assert!(error(&s, "SELECT * FROM metrics").await.contains("metrics"));
    let tables = text(&s, "SHOW TABLES").await;
    assert!(
        tables.contains("measurements") && !tables.contains("| metrics"),
        "{tables}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn altered_columns_survive_restart_and_log_replay() {
    let dir = tempfile::tempdir().unwrap();
    let expected = "SELECT * FROM measurements ORDER BY host, metric, ts";
    let before;
    let (_db, s) = {
        let (db, s) = open(dir.path()).await;
        load_metrics(&s).await;
        run(&s, "ALTER TABLE metrics RENAME TO measurements").await;
        // Rows on disk and rows in memory both go through the change.
        db.shutdown().await.unwrap();
        drop((db, s));
        let (db, s) = open(dir.path()).await;
        run(
            &s,
            "INSERT INTO measurements VALUES ('d', '2026-01-01T00:00:00', 'cpu', 1.0)",
        )
        .await;
        run(
            &s,
            "ALTER TABLE measurements ADD COLUMN unit STRING DEFAULT 'pct', \
             RENAME COLUMN value TO reading",
        )
        .await;
        run(
            &s,
            "INSERT INTO measurements VALUES ('e', '2026-01-01T00:00:00', 'mem', 2.0, 'gb')",
        )
        .await;
        run(&s, "ALTER TABLE measurements DROP COLUMN reading").await;
        run(&s, "UPDATE measurements SET unit = 'x' WHERE host = 'a'").await;
        before = text(&s, expected).await;
        // No shutdown: the writes after the last change are replayed from the log.
        crash_and_reopen(dir.path(), db, s).await
    };
    assert_eq!(text(&s, expected).await, before);
    assert!(
        before.contains("| e    | 2026-01-01T00:00:00Z | mem    | gb   |"),
        "{before}"
    );
    assert!(!before.contains("reading"), "{before}");
    let describe = text(&s, "DESCRIBE measurements").await;
    assert!(
        describe.contains("unit") && !describe.contains("reading"),
        "{describe}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn column_encodings_and_compression_shape_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let rows = "SELECT value * 1000 AS id, value % 7 = 0 AS flag, \
                'host-' || (value / 1000) AS host, (value % 100) * 0.25 AS x \
                FROM generate_series(0, 99999) AS t(value)";
    {
        let (db, s) = open(dir.path()).await;
        run(
            &s,
            "CREATE TABLE plain (id BIGINT PRIMARY KEY ENCODING PLAIN_ENCODING COMPRESSION NO_COMPRESSION, \
             flag BOOL ENCODING PLAIN_ENCODING COMPRESSION NO_COMPRESSION, \
             host STRING ENCODING PLAIN_ENCODING COMPRESSION NO_COMPRESSION, \
             x DOUBLE ENCODING PLAIN_ENCODING COMPRESSION NO_COMPRESSION)",
        )
        .await;
        run(
            &s,
            "CREATE TABLE packed (id BIGINT PRIMARY KEY ENCODING DELTA COMPRESSION ZSTD, \
             flag BOOL ENCODING RLE, host STRING ENCODING PREFIX_ENCODING COMPRESSION ZSTD, \
             x DOUBLE ENCODING BIT_SHUFFLE COMPRESSION ZSTD)",
        )
        .await;
        for table in ["plain", "packed"] {
            run(&s, &format!("INSERT INTO {table} {rows}")).await;
        }
        // Shutting down flushes the rows into DiskRowSets.
        db.shutdown().await.unwrap();
    }
    let (_db, s) = open(dir.path()).await;
    let bytes = |table: &'static str| {
        let s = s.clone();
        async move {
            let batches = run(
                &s,
                &format!("SELECT sum(disk_bytes) FROM sys.partitions WHERE table_name = '{table}'"),
            )
            .await;
            let column = batches[0].column(0);
            let sums = column
                .as_any()
                .downcast_ref::<arrow::array::UInt64Array>()
                .unwrap();
            sums.value(0)
        }
    };
    let (plain, packed) = (bytes("plain").await, bytes("packed").await);
    eprintln!("100 000 rows on disk: plain {plain} bytes, packed {packed} bytes");
    assert!(packed * 3 < plain, "packed {packed} bytes vs plain {plain}");
    // Both read back exactly what was written.
    for table in ["plain", "packed"] {
        let got = text(
            &s,
            &format!(
                "SELECT count(*) AS n, sum(id) AS i, sum(CAST(flag AS INT)) AS f, \
                 count(DISTINCT host) AS h, sum(x) AS x FROM {table}"
            ),
        )
        .await;
        let expected = text(
            &s,
            &format!(
                "SELECT count(*) AS n, sum(id) AS i, sum(CAST(flag AS INT)) AS f, \
                 count(DISTINCT host) AS h, sum(x) AS x FROM ({rows})"
            ),
        )
        .await;
        assert_eq!(got, expected, "{table}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_incrementing_ids_stay_unique_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let distinct = "SELECT count(*) AS n, count(DISTINCT auto_incrementing_id) AS ids FROM log";
    {
        let (db, s) = open(dir.path()).await;
        run(
            &s,
            "CREATE TABLE log (source STRING, line STRING, NON UNIQUE PRIMARY KEY (source))",
        )
        .await;
        run(
            &s,
            "INSERT INTO log VALUES ('a', 'x'), ('a', 'x'), ('b', 'y')",
        )
        .await;
        // Flushed: the next ids must come after those on disk.
        db.shutdown().await.unwrap();
    }
    {
        let (_db, s) = open(dir.path()).await;
        run(&s, "INSERT INTO log VALUES ('a', 'x'), ('c', 'z')").await;
        run(&s, "DELETE FROM log WHERE source = 'c'").await;
        // Not flushed: the log replays these inserts, with the same ids.
    }
    let (_db, s) = open(dir.path()).await;
    let before = text(&s, "SELECT auto_incrementing_id FROM log ORDER BY 1").await;
    run(
        &s,
        "INSERT INTO log SELECT 'a', 'x' FROM generate_series(1, 100)",
    )
    .await;
    let got = text(&s, distinct).await;
    assert!(got.contains("| 104 | 104 |"), "{got}");
    let after = text(
        &s,
        "SELECT auto_incrementing_id FROM log ORDER BY 1 LIMIT 4",
    )
    .await;
    assert_eq!(before, after);
    let create = text(&s, "SHOW CREATE TABLE log").await;
    assert!(
        create.contains("NON UNIQUE PRIMARY KEY (source)")
            && !create.contains("auto_incrementing_id BIGINT"),
        "{create}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_wait_while_the_server_is_over_its_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let limit = 4 << 20;
    let db = Database::open(
        dir.path(),
        DatabaseOptions {
            // Tablets never flush on their own threshold: only memory pressure flushes them.
            flush_threshold_bytes: Some(1 << 30),
            memory_limit_bytes: Some(limit),
            ..DatabaseOptions::default()
        },
    )
    .await
    .unwrap();
    let s = db.session();
    run(
        &s,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, s STRING) DISTRIBUTE BY HASH (id) INTO 8 BUCKETS",
    )
    .await;
    let memory = "SELECT sum(memory_bytes) AS m, sum(disk_bytes) AS d FROM sys.partitions";
    let mut peak = 0;
    for part in 0..10 {
        run(
            &s,
            &format!(
                "INSERT INTO t SELECT value, repeat('x', 50) || value FROM generate_series({}, {}) AS g(value)",
                part * 20_000,
                part * 20_000 + 19_999
            ),
        )
        .await;
        peak = peak.max(sums(&s, memory).await.0);
    }
    // 200 000 rows of about 70 bytes are far more than the limit: flushed as they came, and
    // memory never held much more than the limit plus one write.
    assert!(peak <= (limit + (8 << 20)) as u64, "peak {peak}");
    let got = text(&s, "SELECT count(*) AS n, count(DISTINCT s) AS d FROM t").await;
    assert!(got.contains("| 200000 | 200000 |"), "{got}");
    assert!(sums(&s, memory).await.1 > 0, "nothing was flushed");
}

/// The two UInt64 values of a one-row query.
async fn sums(s: &Session, sql: &str) -> (u64, u64) {
    let batches = run(s, sql).await;
    let value = |c: usize| {
        batches[0]
            .column(c)
            .as_any()
            .downcast_ref::<arrow::array::UInt64Array>()
            .unwrap()
            .value(0)
    };
    (value(0), value(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_reads_every_tablet_at_one_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = load_join_tables(dir.path()).await;
    let plan = text(
        &s,
        "EXPLAIN ANALYZE SELECT count(*) FROM big b JOIN small s ON b.k = s.k",
    )
    .await;
    let snapshot = |table: &str| counter(scan_line(&plan, table), "snapshot");
    assert_eq!(snapshot("big"), snapshot("small"), "{plan}");
    // A later statement reads at a later snapshot and sees a write made in between.
    run(&s, "INSERT INTO small VALUES (1000, 7, '1', 0)").await;
    let later = text(
        &s,
        "EXPLAIN ANALYZE SELECT count(*) FROM big b JOIN small s ON b.k = s.k",
    )
    .await;
    assert!(counter(scan_line(&later, "small"), "snapshot") > snapshot("small"));
    let got = text(&s, "SELECT count(*) FROM big b JOIN small s ON b.k = s.k").await;
    assert!(got.contains("| 101 "), "{got}");
}

/// `AS OF` reads the table as it was, before and after its rows were flushed and compacted
/// and the database restarted; times beyond the history retention or in the future are
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_of_reads_past_versions_across_flushes_compactions_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let now = |s: Session| async move {
        let batches = run(&s, "SELECT CAST(now() AS VARCHAR) AS t").await;
        arrow::util::display::array_value_to_string(batches[0].column(0), 0).unwrap()
    };
    let at = |time: &str, query: &str| query.replace("{t}", &format!("t AS OF TIMESTAMP '{time}'"));
    let count_sum = "SELECT count(*) AS n, sum(v) AS s FROM {t}";
    let (first, second);
    {
        let (db, s) = open(dir.path()).await;
        run(
            &s,
            "CREATE TABLE t (k BIGINT PRIMARY KEY, v BIGINT, w VARCHAR) \
             DISTRIBUTE BY HASH (k) INTO 2 BUCKETS",
        )
        .await;
        run(
            &s,
            "INSERT INTO t SELECT value, 1, 'w' || value FROM generate_series(1, 100) AS g(value)",
        )
        .await;
        first = now(s.clone()).await;
        run(&s, "UPDATE t SET v = 10 WHERE k <= 20").await;
        run(&s, "DELETE FROM t WHERE k > 90").await;
        second = now(s.clone()).await;
        assert!(text(&s, &at(&first, count_sum))
            .await
            .contains("| 100 | 100 |"));
        assert!(text(&s, &at(&second, count_sum))
            .await
            .contains("| 90 | 270 |"));
        // Flushed: the MemRowSet's history becomes UNDO records.
        db.shutdown().await.unwrap();
    }
    let (_db, s) = open(dir.path()).await;
    assert!(text(&s, &at(&first, count_sum))
        .await
        .contains("| 100 | 100 |"));
    assert!(text(&s, &at(&second, count_sum))
        .await
        .contains("| 90 | 270 |"));
    // Updates of flushed rows: REDO records, which the maintenance thread compacts into the
    // base data when they are many (here 50 of 90 rows), rewriting only the column v.
    run(&s, "UPDATE t SET v = 100 WHERE k <= 50").await;
    let third = now(s.clone()).await;
    let compacted = "SELECT min(column_files) FROM sys.partitions WHERE table_name = 't'";
    wait_until(
        "a major delta compaction",
        Duration::from_secs(30),
        || async {
            match text(&s, compacted).await.contains("| 0 ") {
                true => Err(text(&s, "SELECT * FROM sys.partitions").await),
                false => Ok(()),
            }
        },
    )
    .await;
    let w = "SELECT count(*) FROM t WHERE w = 'w' || k AND v = 100";
    assert!(text(&s, w).await.contains("| 50 "));
    assert!(text(&s, &at(&first, count_sum))
        .await
        .contains("| 100 | 100 |"));
    assert!(text(&s, &at(&second, count_sum))
        .await
        .contains("| 90 | 270 |"));
    assert!(text(&s, &at(&third, count_sum))
        .await
        .contains("| 90 | 5040 |"));
    // A past version joined with the current one.
    let changed = "SELECT count(*) FROM t AS OF TIMESTAMP '{second}' AS old JOIN t ON old.k = t.k \
                   WHERE old.v <> t.v";
    assert!(text(&s, &changed.replace("{second}", &second))
        .await
        .contains("| 50 "));
    let e = error(&s, "SELECT * FROM t AS OF TIMESTAMP '2020-01-01 00:00:00'").await;
    assert!(e.contains("older than the history retention"), "{e}");
    let e = error(&s, "SELECT * FROM t AS OF now() + INTERVAL '1 hour'").await;
    assert!(e.contains("in the future"), "{e}");
    let e = error(&s, "SELECT * FROM nope AS OF now()").await;
    assert!(e.contains("nope"), "{e}");
    let e = error(&s, "SELECT * FROM generate_series(1, 3) AS OF now()").await;
    assert!(
        e.contains("AS OF on the table function generate_series"),
        "{e}"
    );
    let e = error(&s, "SELECT * FROM (SELECT 1) AS OF now()").await;
    assert!(e.contains("follow a table name"), "{e}");
}

/// Bucket counts, replica counts and type sizes in DDL come from clients: out of range they are
/// errors naming the number, never wrapped into another number or a panic, and nothing is
/// created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbers_in_ddl_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    let table = "CREATE TABLE t (a BIGINT, b BIGINT, PRIMARY KEY (a, b))";
    for (clause, needle) in [
        (
            "DISTRIBUTE BY HASH (a) INTO BUCKETS",
            "Expected: literal int, found: BUCKETS",
        ),
        ("DISTRIBUTE BY HASH (a) INTO -1 BUCKETS", "found: -"),
        (
            "DISTRIBUTE BY HASH (a) INTO 99999999999999999999 BUCKETS",
            "99999999999999999999",
        ),
        (
            "DISTRIBUTE BY HASH (a) INTO 4294967297 BUCKETS",
            "4294967297 is not a valid number of hash buckets",
        ),
        (
            "DISTRIBUTE BY HASH (a) INTO 0 BUCKETS",
            "between 1 and 1024, got 0",
        ),
        (
            "DISTRIBUTE BY HASH (a) INTO 1025 BUCKETS",
            "between 1 and 1024, got 1025",
        ),
        (
            "DISTRIBUTE BY HASH (a) INTO 1024 BUCKETS, HASH (b) INTO 1024 BUCKETS",
            "1024 × 1024 tablets per range; at most 10000",
        ),
        (
            "WITH (replicas = 0)",
            "replicas must be a whole number from 1",
        ),
        ("WITH (replicas = -3)", "got -3"),
        (
            "WITH (replicas = 18446744073709551616)",
            "got 18446744073709551616",
        ),
    ] {
        let sql = format!("{table} {clause}");
        let e = error(&s, &sql).await;
        assert!(e.contains(needle), "{sql}: {e}");
    }
    for (sql, needle) in [
        (
            "CREATE TABLE t (a VARCHAR(4294967297) PRIMARY KEY)",
            "VARCHAR(4294967297): the length must be 1 to 65535",
        ),
        (
            "CREATE TABLE t (a DECIMAL(256, 2) PRIMARY KEY)",
            "DECIMAL(256, 2): the precision must be 1 to 38",
        ),
        (
            "CREATE TABLE t (a DECIMAL(10, 266) PRIMARY KEY)",
            "the scale 0 to the precision",
        ),
        (
            "CREATE TABLE t (a BIGINT PRIMARY KEY) DISTRIBUTE BY RANGE (a) \
             (PARTITION VALUES < 99999999999999999999)",
            "99999999999999999999",
        ),
    ] {
        let e = error(&s, sql).await;
        assert!(e.contains(needle), "{sql}: {e}");
    }
    assert!(s.context().table_exist("t").is_ok_and(|exists| !exists));
}

/// Hash levels whose bucket counts multiply past what a tablet count can hold (1024^7 = 2^70)
/// are refused like any partitioning with too many tablets. The product is the engine's
/// (`PartitionSchema::new`); until it is computed with checked arithmetic this test fails (a
/// debug build panics on the overflow, a release build wraps it to a table of zero tablets).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_levels_whose_tablet_count_overflows_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    let columns = ["a", "b", "c", "d", "e", "f", "g"];
    let levels: Vec<String> = columns
        .iter()
        .map(|c| format!("HASH ({c}) INTO 1024 BUCKETS"))
        .collect();
    let sql = format!(
        "CREATE TABLE t ({}, PRIMARY KEY ({})) DISTRIBUTE BY {}",
        columns.map(|c| format!("{c} BIGINT")).join(", "),
        columns.join(", "),
        levels.join(", ")
    );
    let e = error(&s, &sql).await;
    assert!(e.contains("tablets"), "{e}");
    assert!(s.context().table_exist("t").is_ok_and(|exists| !exists));
}

async fn run_prepared(
    session: &Session,
    prepared: &nyala_sql::PreparedStatement,
    params: &[datafusion::common::ScalarValue],
) -> String {
    let planned = session.plan_prepared(prepared, params).await.unwrap();
    let rows = collect(planned.execute().await.unwrap()).await.unwrap();
    pretty_format_batches(&rows).unwrap().to_string()
}

/// A prepared key lookup in a transaction (ADBC's DB-API runs every statement in one, its
/// autocommit being off) reads at the transaction's snapshot and sees what the transaction
/// wrote: keys it updated, deleted and inserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_key_lookups_in_a_transaction_read_its_snapshot_and_its_writes() {
    use datafusion::common::ScalarValue;
    let dir = tempfile::tempdir().unwrap();
    let (db, s1) = open(dir.path()).await;
    let s2 = db.session();
    run(
        &s1,
        "CREATE TABLE kv (k STRING, v BIGINT, PRIMARY KEY (k)) DISTRIBUTE BY HASH (k) INTO 3 BUCKETS",
    )
    .await;
    run(&s1, "INSERT INTO kv VALUES ('a', 1), ('b', 2), ('c', 3)").await;
    let lookup = s1
        .prepare_statement("SELECT v FROM kv WHERE k = $1")
        .await
        .unwrap();
    assert!(lookup.is_keyed());
    let get = |key: &'static str| {
        let (s1, lookup) = (&s1, &lookup);
        async move {
            let params = [ScalarValue::from(key)];
            let planned = s1.plan_prepared(lookup, &params).await.unwrap();
            first_i64s(&collect(planned.execute().await.unwrap()).await.unwrap())
        }
    };
    let none = Vec::<i64>::new();
    run(&s1, "BEGIN").await;
    assert_eq!(get("a").await, [1]);
    // What others commit after the snapshot is not seen.
    run(&s2, "UPDATE kv SET v = 10 WHERE k = 'b'").await;
    run(&s2, "INSERT INTO kv VALUES ('d', 4)").await;
    assert_eq!(get("b").await, [2]);
    assert_eq!(get("d").await, none);
    // Its own writes are.
    run(&s1, "UPDATE kv SET v = 100 WHERE k = 'a'").await;
    run(&s1, "DELETE FROM kv WHERE k = 'c'").await;
    run(&s1, "INSERT INTO kv VALUES ('e', 5)").await;
    assert_eq!(get("a").await, [100]);
    assert_eq!(get("c").await, none);
    assert_eq!(get("e").await, [5]);
    assert_eq!(get("b").await, [2]);
    run(&s1, "COMMIT").await;
    assert_eq!(get("a").await, [100]);
    assert_eq!(get("b").await, [10]);
    assert_eq!(get("c").await, none);
    assert_eq!(get("d").await, [4]);
}

/// A prepared query by the whole primary key is answered without DataFusion, with the rows
/// DataFusion gives for the same statement with its values written in: present and absent
/// keys, values that need a cast, a value that cannot be the key's type, rows in memory and on
/// disk, the session's own latest write. Statements that are not such lookups are planned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_key_lookups_give_what_the_planned_query_gives() {
    use datafusion::common::ScalarValue;
    let dir = tempfile::tempdir().unwrap();
    let (mut db, mut s) = open(dir.path()).await;
    load_metrics(&s).await;
    const LOOKUP: &str =
        "SELECT value, host FROM metrics WHERE metric = $2 AND host = $1 AND ts = $3";
    let mut lookup = s.prepare_statement(LOOKUP).await.unwrap();
    assert!(lookup.is_keyed());
    let partial = s
        .prepare_statement("SELECT value FROM metrics WHERE host = $1 AND metric = $2")
        .await
        .unwrap();
    assert!(!partial.is_keyed());
    let limited = s
        .prepare_statement(
            "SELECT * FROM metrics WHERE host = $1 AND metric = $2 AND ts = $3 LIMIT 1",
        )
        .await
        .unwrap();
    assert!(!limited.is_keyed());
    let expected = |host: &str, metric: &str, ts: &str| {
        format!(
            "SELECT value, host FROM metrics WHERE metric = '{metric}' AND host = '{host}' \
             AND ts = '{ts}'"
        )
    };
    let keys = [
        ("a", "cpu", "2026-01-01T00:01:00"),
        ("a", "mem", "2026-01-01T00:00:00"),
        ("b", "cpu", "2026-01-01T00:00:00"),
        ("b", "mem", "2026-01-01T00:00:00"),
        ("zz", "cpu", "2026-01-01T00:00:00"),
    ];
    for round in 0..2 {
        for (host, metric, ts) in keys {
            let params = [
                ScalarValue::from(host),
                ScalarValue::from(metric),
                ScalarValue::from(ts), // a string, cast to the key's TIMESTAMP
            ];
            assert_eq!(
                run_prepared(&s, &lookup, &params).await,
                text(&s, &expected(host, metric, ts)).await,
                "round {round}: {host} {metric} {ts}"
            );
        }
        // The session reads its own update straight away, then the same rows from disk.
        run(
            &s,
            "UPDATE metrics SET value = value + 100 WHERE host = 'a'",
        )
        .await;
        let a = [
            ScalarValue::from("a"),
            ScalarValue::from("cpu"),
            ScalarValue::from("2026-01-01T00:01:00"),
        ];
        let got = run_prepared(&s, &lookup, &a).await;
        assert!(
            got.contains(&format!("| {}.5 ", 107 + 100 * round)),
            "{got}"
        );
        // Shutting down flushes the rows into DiskRowSets.
        db.shutdown().await.unwrap();
        (db, s) = open(dir.path()).await;
        lookup = s.prepare_statement(LOOKUP).await.unwrap();
    }
    let bad = [
        ScalarValue::from("a"),
        ScalarValue::from("cpu"),
        ScalarValue::from("not a time"),
    ];
    let e = s
        .plan_prepared(&lookup, &bad)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("parameter $3"), "{e}");
    let null = [
        ScalarValue::from("a"),
        ScalarValue::Utf8(None),
        ScalarValue::from("2026-01-01T00:00:00"),
    ];
    assert_eq!(
        run_prepared(&s, &lookup, &null).await,
        text(&s, "SELECT value, host FROM metrics WHERE false").await
    );
}

/// A prepared statement without parameters runs the plan made when it was prepared, so each
/// execution must still read the table as it is then; a statement that reads the clock gets
/// the time of each execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_see_each_execution_s_rows_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    load_metrics(&s).await;
    let count = s
        .prepare_statement("SELECT count(*) AS n, max(value) AS m FROM metrics WHERE value < 100")
        .await
        .unwrap();
    let rows = s
        .prepare_statement("SELECT host FROM metrics WHERE value > 10")
        .await
        .unwrap();
    let clock = s.prepare_statement("SELECT now() AS t").await.unwrap();
    let first = run_prepared(&s, &clock, &[]).await;
    assert!(run_prepared(&s, &count, &[]).await.contains("| 5 | 20.0 |"));
    assert!(!run_prepared(&s, &rows, &[]).await.contains("| d "));
    run(
        &s,
        "INSERT INTO metrics VALUES ('d', '2026-01-01T00:00:00', 'cpu', 50.0)",
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert!(run_prepared(&s, &count, &[]).await.contains("| 6 | 50.0 |"));
    assert!(run_prepared(&s, &rows, &[]).await.contains("| d "));
    assert_ne!(run_prepared(&s, &clock, &[]).await, first);
}

/// A prepared UPDATE or DELETE by the whole primary key writes its row without DataFusion:
/// counts 1 for a row that exists and 0 for one that does not, concurrent writers of one row
/// all succeed (each restarts after a conflict), and a row deleted meanwhile is not revived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_key_updates_and_deletes_write_their_row() {
    use datafusion::common::ScalarValue;
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    load_metrics(&s).await;
    let update = s
        .prepare_statement(
            "UPDATE metrics SET value = $1 WHERE host = $2 AND metric = 'cpu' AND ts = $3",
        )
        .await
        .unwrap();
    assert!(update.is_keyed());
    let delete = s
        .prepare_statement("DELETE FROM metrics WHERE ts = $3 AND host = $1 AND metric = $2")
        .await
        .unwrap();
    assert!(delete.is_keyed());
    let computed = s
        .prepare_statement(
            "UPDATE metrics SET value = value + $1 WHERE host = $2 AND metric = 'cpu' AND ts = $3",
        )
        .await
        .unwrap();
    assert!(!computed.is_keyed());
    fn key(host: &str) -> [ScalarValue; 2] {
        [
            ScalarValue::from(host),
            ScalarValue::from("2026-01-01T00:00:00"),
        ]
    }
    let count = |s: Session, prepared: nyala_sql::PreparedStatement, params: Vec<ScalarValue>| async move {
        let planned = s.plan_prepared(&prepared, &params).await.unwrap();
        let rows = collect(planned.execute().await.unwrap()).await.unwrap();
        nyala_sql::count_of(&rows)
    };
    fn with_value(v: f64, host: &str) -> Vec<ScalarValue> {
        [vec![ScalarValue::from(v)], key(host).to_vec()].concat()
    }
    assert_eq!(
        count(s.clone(), update.clone(), with_value(9.5, "b")).await,
        1
    );
    assert_eq!(
        count(s.clone(), update.clone(), with_value(9.5, "nobody")).await,
        0
    );
    // A string where a DOUBLE goes is cast, as DataFusion would.
    let params = [vec![ScalarValue::from("10.25")], key("c").to_vec()].concat();
    assert_eq!(count(s.clone(), update.clone(), params).await, 1);
    let got = text(
        &s,
        "SELECT host, value FROM metrics WHERE metric = 'cpu' ORDER BY host, ts",
    )
    .await;
    assert!(
        got.contains("| b    | 9.5   |") && got.contains("| c    | 10.25 |"),
        "{got}"
    );
    // Sixteen sessions write one row at once: every UPDATE counts one row.
    let mut writers = Vec::new();
    for i in 0..16 {
        let s = db.session();
        let update = update.clone();
        writers.push(tokio::spawn(async move {
            let mut counted = 0;
            for j in 0..10 {
                counted += count(
                    s.clone(),
                    update.clone(),
                    with_value((i * 100 + j) as f64, "a"),
                )
                .await;
            }
            counted
        }));
    }
    for writer in writers {
        assert_eq!(writer.await.unwrap(), 10);
    }
    let delete_b = [
        ScalarValue::from("b"),
        ScalarValue::from("cpu"),
        ScalarValue::from("2026-01-01T00:00:00"),
    ];
    assert_eq!(count(s.clone(), delete.clone(), delete_b.to_vec()).await, 1);
    assert_eq!(count(s.clone(), delete.clone(), delete_b.to_vec()).await, 0);
    assert_eq!(
        count(s.clone(), update.clone(), with_value(1.0, "b")).await,
        0
    );
    let got = text(&s, "SELECT count(*) FROM metrics WHERE host = 'b'").await;
    assert!(got.contains("| 0 "), "{got}");
}

/// Views: CREATE [OR REPLACE] VIEW and DROP VIEW, kept in the catalog across restarts, read
/// like tables (joins, filters, views of views), listed by SHOW TABLES and information_schema
/// as VIEW; bad definitions and name clashes are refused and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_are_named_queries_kept_in_the_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    load_metrics(&s).await;
    run(
        &s,
        "CREATE VIEW cpu AS SELECT host, value FROM metrics WHERE metric = 'cpu'",
    )
    .await;
    run(&s, "CREATE VIEW busy AS SELECT host, max(value) AS peak FROM cpu GROUP BY host HAVING max(value) > 5").await;
    let got = text(&s, "SELECT * FROM busy ORDER BY host").await;
    assert!(
        got.contains("| a    | 7.5  |") && got.contains("| c    | 20.0 |") && !got.contains("| b "),
        "{got}"
    );
    // A view reads the table as it is when the statement runs.
    run(
        &s,
        "INSERT INTO metrics VALUES ('b', '2026-01-02T00:00:00', 'cpu', 9.0)",
    )
    .await;
    assert!(text(&s, "SELECT * FROM busy").await.contains("| b "));
    // Another session sees the view at once.
    let other = db.session();
    assert!(text(&other, "SELECT count(*) FROM cpu")
        .await
        .contains("| 5 "));
    let listed = text(&s, "SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = 'public' ORDER BY table_name").await;
    assert!(
        listed.contains("| busy       | VIEW ") && listed.contains("| metrics    | BASE TABLE"),
        "{listed}"
    );
    assert!(text(&s, "SHOW TABLES").await.contains("| busy "));
    // Refused: a name taken, a view of a missing table, a view that would read itself.
    assert!(error(&s, "CREATE VIEW metrics AS SELECT 1")
        .await
        .contains("exists"));
    assert!(error(&s, "CREATE VIEW cpu AS SELECT 1")
        .await
        .contains("OR REPLACE"));
    assert!(error(&s, "CREATE TABLE cpu (k BIGINT PRIMARY KEY)")
        .await
        .contains("exists"));
    assert!(error(&s, "CREATE VIEW v AS SELECT * FROM nowhere")
        .await
        .contains("nowhere"));
    let e = error(
        &s,
        "CREATE OR REPLACE VIEW cpu AS SELECT host, peak AS value FROM busy",
    )
    .await;
    assert!(e.contains("cannot read itself"), "{e}");
    assert!(text(&s, "SELECT count(*) FROM cpu").await.contains("| 5 "));
    // A column list names the view's columns (TPC-H's Q15); it must name them all.
    run(
        &s,
        "CREATE VIEW peaks (machine, highest) AS SELECT host, max(value) FROM cpu GROUP BY host",
    )
    .await;
    let peaks = text(
        &s,
        "SELECT machine, highest FROM peaks ORDER BY highest DESC LIMIT 1",
    )
    .await;
    assert!(peaks.contains("| machine |"), "{peaks}");
    let e = error(&s, "CREATE VIEW bad (a) AS SELECT host, value FROM cpu").await;
    assert!(
        e.contains("contains 2 columns but only 1 names given"),
        "{e}"
    );
    run(&s, "DROP VIEW peaks").await;
    // Replaced, then survives a restart; dropped.
    run(
        &s,
        "CREATE OR REPLACE VIEW cpu AS SELECT host, value FROM metrics WHERE metric = 'mem'",
    )
    .await;
    db.shutdown().await.unwrap();
    let (db, s) = open(dir.path()).await;
    assert!(text(&s, "SELECT count(*) FROM cpu").await.contains("| 1 "));
    assert!(error(&s, "DROP TABLE cpu").await.contains("cpu"));
    run(&s, "DROP VIEW busy").await;
    run(&s, "DROP VIEW IF EXISTS busy").await;
    assert!(error(&s, "DROP VIEW busy").await.contains("busy"));
    assert!(error(&s, "SELECT * FROM busy").await.contains("busy"));
    assert!(text(&s, "SELECT count(*) FROM cpu").await.contains("| 1 "));
    drop(db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_see_their_snapshot_and_their_own_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s1) = open(dir.path()).await;
    let s2 = db.session();
    run(
        &s1,
        "CREATE TABLE acct (id BIGINT, owner STRING, balance BIGINT, PRIMARY KEY (id)) \
         DISTRIBUTE BY HASH (id) INTO 4 BUCKETS",
    )
    .await;
    run(
        &s1,
        "INSERT INTO acct VALUES (1, 'a', 100), (2, 'b', 100), (3, 'c', 100)",
    )
    .await;
    let total = "SELECT sum(balance) AS total, count(*) AS n FROM acct";

    run(&s1, "BEGIN").await;
    run(&s1, "UPDATE acct SET balance = balance - 30 WHERE id = 1").await;
    run(&s1, "UPDATE acct SET balance = balance + 30 WHERE id = 2").await;
    run(&s1, "INSERT INTO acct VALUES (4, 'd', 0)").await;
    run(&s1, "DELETE FROM acct WHERE id = 3").await;
    // Its own writes, through filters, projections without the key, and aggregates.
    let rich = text(
        &s1,
        "SELECT owner, balance FROM acct WHERE balance >= 70 ORDER BY owner",
    );
    let rich = rich.await;
    assert!(
        rich.contains("| a     | 70      |\n| b     | 130     |\n+"),
        "{rich}"
    );
    assert!(text(&s1, total).await.contains("| 200   | 3 |"));
    // Reading no column (count(*)) counts them too.
    assert!(text(&s1, "SELECT count(*) AS n FROM acct")
        .await
        .contains("| 3 |"));
    // Nobody else sees them before the commit.
    assert!(text(&s2, total).await.contains("| 300   | 3 |"));
    run(&s1, "COMMIT").await;
    assert!(text(&s2, total).await.contains("| 200   | 3 |"));
    assert_eq!(
        text(&s2, "SELECT id, balance FROM acct ORDER BY id").await,
        text(&s1, "SELECT id, balance FROM acct ORDER BY id").await
    );

    // ROLLBACK leaves nothing.
    run(&s1, "START TRANSACTION").await;
    run(&s1, "UPSERT INTO acct VALUES (1, 'a', 0), (5, 'e', 7)").await;
    assert!(text(&s1, total).await.contains("| 137   | 4 |"));
    run(&s1, "ROLLBACK").await;
    assert!(text(&s1, total).await.contains("| 200   | 3 |"));

    // A snapshot: what others commit after the transaction's first read is not seen.
    run(&s1, "BEGIN").await;
    assert!(text(&s1, total).await.contains("| 200   | 3 |"));
    run(&s2, "INSERT INTO acct VALUES (6, 'f', 1)").await;
    assert!(text(&s1, total).await.contains("| 200   | 3 |"));
    run(&s1, "COMMIT").await;
    assert!(text(&s1, total).await.contains("| 201   | 4 |"));
}

/// A transaction is charged the bytes of the rows it wrote, not each row with the whole batch
/// its statement wrote (an ADBC bulk ingest of 10 MB in a transaction, the DB-API's default,
/// was refused as more than 256 MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_counts_the_bytes_of_the_rows_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE big (k BIGINT, body STRING, PRIMARY KEY (k)) DISTRIBUTE BY HASH (k) INTO 2 BUCKETS",
    )
    .await;
    run(&s, "BEGIN").await;
    run(
        &s,
        "INSERT INTO big SELECT value, repeat('x', 200) FROM generate_series(1, 3000)",
    )
    .await;
    assert!(text(&s, "SELECT count(*) AS n FROM big")
        .await
        .contains("| 3000 |"));
    run(&s, "COMMIT").await;
    assert!(text(&s, "SELECT count(*) AS n FROM big")
        .await
        .contains("| 3000 |"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_writer_wins_and_failed_transactions_roll_back() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s1) = open(dir.path()).await;
    let s2 = db.session();
    run(
        &s1,
        "CREATE TABLE kv (k BIGINT, v BIGINT, PRIMARY KEY (k)) DISTRIBUTE BY HASH (k) INTO 2 BUCKETS",
    )
    .await;
    run(&s1, "INSERT INTO kv VALUES (1, 10), (2, 20)").await;

    // Two transactions update one row: the second fails with a retryable error.
    run(&s1, "BEGIN").await;
    run(&s2, "BEGIN").await;
    run(&s1, "UPDATE kv SET v = v + 1 WHERE k = 1").await;
    let e = error(&s2, "UPDATE kv SET v = v + 100 WHERE k = 1").await;
    assert!(e.contains("could not serialize access"), "{e}");
    let e = error(&s2, "SELECT * FROM kv").await;
    assert!(e.contains("ROLLBACK"), "{e}");
    run(&s2, "ROLLBACK").await;
    run(&s1, "COMMIT").await;
    assert!(text(&s2, "SELECT v FROM kv WHERE k = 1")
        .await
        .contains("| 11 |"));

    // A row committed by another after the snapshot cannot be overwritten.
    run(&s1, "BEGIN").await;
    assert!(text(&s1, "SELECT v FROM kv WHERE k = 2")
        .await
        .contains("| 20 |"));
    run(&s2, "UPDATE kv SET v = 21 WHERE k = 2").await;
    let e = error(&s1, "UPSERT INTO kv VALUES (2, 0)").await;
    assert!(e.contains("could not serialize access"), "{e}");
    let e = error(&s1, "COMMIT").await;
    assert!(e.contains("rolled back"), "{e}");
    assert!(text(&s1, "SELECT v FROM kv WHERE k = 2")
        .await
        .contains("| 21 |"));

    // A statement that fails in a transaction rolls all of it back.
    run(&s1, "BEGIN").await;
    run(&s1, "INSERT INTO kv VALUES (3, 30)").await;
    let e = error(&s1, "INSERT INTO kv VALUES (4, 40), (1, 0)").await;
    assert!(e.contains("duplicate"), "{e}");
    assert!(error(&s1, "COMMIT").await.contains("rolled back"));
    assert!(text(&s1, "SELECT count(*) AS n FROM kv")
        .await
        .contains("| 2 |"));

    // Transaction statements out of place, DDL after writes.
    assert!(collect(s1.execute("COMMIT").await.unwrap()).await.is_ok());
    run(&s1, "BEGIN").await;
    assert!(error(&s1, "BEGIN").await.contains("already in progress"));
    run(&s1, "CREATE TABLE early (k BIGINT, PRIMARY KEY (k))").await;
    run(&s1, "INSERT INTO kv VALUES (5, 50)").await;
    let e = error(&s1, "DROP TABLE early").await;
    assert!(e.contains("DDL"), "{e}");
    run(&s1, "COMMIT").await;
    assert!(text(&s2, "SELECT v FROM kv WHERE k = 5")
        .await
        .contains("| 50 |"));
    let e = error(&s1, "BEGIN ISOLATION LEVEL READ UNCOMMITTED").await;
    assert!(e.contains("REPEATABLE READ"), "{e}");
    run(&s1, "BEGIN READ ONLY").await;
    assert!(error(&s1, "DELETE FROM kv").await.contains("READ ONLY"));
    run(&s1, "ROLLBACK").await;
    drop(db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_tables_assign_positions_in_log_order() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE inbox (user_id STRING, pos BIGINT GENERATED ALWAYS AS POSITION, \
         body STRING, PRIMARY KEY (user_id, pos)) DISTRIBUTE BY HASH (user_id) INTO 4 BUCKETS",
    )
    .await;
    run(
        &s,
        "INSERT INTO inbox (user_id, body) VALUES ('u1', 'a'), ('u2', 'b'), ('u1', 'c')",
    )
    .await;
    run(&s, "INSERT INTO inbox (user_id, body) VALUES ('u1', 'd')").await;
    let u1 = first_i64s(
        &run(
            &s,
            "SELECT pos FROM inbox WHERE user_id = 'u1' ORDER BY pos",
        )
        .await,
    );
    assert_eq!(u1.len(), 3);
    assert!(u1.windows(2).all(|w| w[0] < w[1]), "{u1:?}");
    let bodies = text(
        &s,
        "SELECT body FROM inbox WHERE user_id = 'u1' ORDER BY pos",
    )
    .await;
    assert!(bodies.contains("| a    |\n| c    |\n| d    |"), "{bodies}");
    let shown = text(&s, "SHOW CREATE TABLE inbox").await;
    assert!(
        shown.contains("pos INT64 GENERATED ALWAYS AS POSITION"),
        "{shown}"
    );
    // Positions are the database's.
    let e = error(&s, "INSERT INTO inbox VALUES ('u1', 5, 'x')").await;
    assert!(e.contains("GENERATED ALWAYS AS POSITION"), "{e}");
    let e = error(
        &s,
        "INSERT INTO inbox (user_id, pos, body) VALUES ('u1', NULL, 'x')",
    )
    .await;
    assert!(e.contains("GENERATED ALWAYS AS POSITION"), "{e}");
    let e = error(&s, "UPSERT INTO inbox (user_id, body) VALUES ('u1', 'x')").await;
    assert!(e.contains("UPSERT"), "{e}");
    let e = error(
        &s,
        "CREATE TABLE q2 (k STRING, p BIGINT GENERATED ALWAYS AS POSITION, PRIMARY KEY (k, p)) \
         DISTRIBUTE BY HASH (p) INTO 2 BUCKETS",
    )
    .await;
    assert!(e.contains("cannot partition"), "{e}");
    let e = error(
        &s,
        "CREATE TABLE q3 (k STRING, p INT GENERATED ALWAYS AS POSITION, PRIMARY KEY (k, p))",
    )
    .await;
    assert!(e.contains("BIGINT"), "{e}");
    let e = error(
        &s,
        "CREATE TABLE q4 (k STRING, p BIGINT GENERATED ALWAYS AS POSITION, PRIMARY KEY (k))",
    )
    .await;
    assert!(e.contains("primary key"), "{e}");
    // Editing and deleting a queued message are ordinary statements by key.
    run(
        &s,
        &format!(
            "UPDATE inbox SET body = 'C' WHERE user_id = 'u1' AND pos = {}",
            u1[1]
        ),
    )
    .await;
    run(
        &s,
        &format!("DELETE FROM inbox WHERE user_id = 'u1' AND pos = {}", u1[0]),
    )
    .await;
    let bodies = text(
        &s,
        "SELECT body FROM inbox WHERE user_id = 'u1' ORDER BY pos",
    )
    .await;
    assert!(bodies.contains("| C    |\n| d    |"), "{bodies}");
    // A multi-tablet INSERT (a transaction) takes positions too; later ones stay higher.
    let many: Vec<String> = (0..20).map(|i| format!("('u{}', 'm{i}')", i % 5)).collect();
    run(
        &s,
        &format!(
            "INSERT INTO inbox (user_id, body) VALUES {}",
            many.join(", ")
        ),
    )
    .await;
    // In a transaction, new messages take positions at COMMIT (and are read back after it).
    run(&s, "BEGIN").await;
    run(
        &s,
        "INSERT INTO inbox (user_id, body) VALUES ('u9', 'in a transaction')",
    )
    .await;
    let inside = text(&s, "SELECT count(*) AS n FROM inbox WHERE user_id = 'u9'").await;
    assert!(inside.contains("| 0 |"), "{inside}");
    run(&s, "COMMIT").await;
    let after = text(&s, "SELECT body FROM inbox WHERE user_id = 'u9'").await;
    assert!(after.contains("in a transaction"), "{after}");
    // After a restart, positions go on increasing.
    let (_db, s) = crash_and_reopen(dir.path(), db, s).await;
    run(
        &s,
        "INSERT INTO inbox (user_id, body) VALUES ('u1', 'after')",
    )
    .await;
    let u1 = first_i64s(
        &run(
            &s,
            "SELECT pos FROM inbox WHERE user_id = 'u1' ORDER BY pos",
        )
        .await,
    );
    let last = text(
        &s,
        "SELECT body FROM inbox WHERE user_id = 'u1' ORDER BY pos DESC LIMIT 1",
    )
    .await;
    assert!(last.contains("after"), "{last} {u1:?}");
}

/// A queue table `inbox` (4 buckets) holding messages m0..m4 of 'u1' and x0..x4 of 'u2'.
async fn inbox_with_five_messages_each(s: &Session) {
    run(
        s,
        "CREATE TABLE inbox (user_id STRING, pos BIGINT GENERATED ALWAYS AS POSITION, \
         body STRING, PRIMARY KEY (user_id, pos)) DISTRIBUTE BY HASH (user_id) INTO 4 BUCKETS",
    )
    .await;
    for i in 0..5 {
        run(
            s,
            &format!("INSERT INTO inbox (user_id, body) VALUES ('u1', 'm{i}'), ('u2', 'x{i}')"),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_reads_a_queue_in_order_and_waits_for_new_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    inbox_with_five_messages_each(&s).await;
    let read = |after: i64, wait: u64, extra: &str| {
        format!("SELECT pos, body FROM tail('inbox', {after}, {wait}) WHERE user_id = 'u1' {extra}")
    };
    let rows = run(&s, &read(0, 0, "")).await;
    let positions = first_i64s(&rows);
    assert_eq!(positions.len(), 5);
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    let bodies = text(&s, &read(positions[1], 0, "LIMIT 2")).await;
    assert!(
        bodies.contains("| m2   |") && bodies.contains("| m3   |") && !bodies.contains("m4"),
        "{bodies}"
    );
    // Nothing after the last: an empty answer once the wait is over.
    assert_eq!(
        run(&s, &read(positions[4], 50, ""))
            .await
            .iter()
            .map(|b| b.num_rows())
            .sum::<usize>(),
        0
    );
    // A long poll returns as soon as a row commits.
    let writer = db.session();
    let insert = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        run(
            &writer,
            "INSERT INTO inbox (user_id, body) VALUES ('u2', 'other')",
        )
        .await;
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        run(
            &writer,
            "INSERT INTO inbox (user_id, body) VALUES ('u1', 'new')",
        )
        .await;
    });
    // The poll may wait 10 minutes: only the commit's wake-up ends it before the guard does.
    let woken = woken_before_its_wait_ends(text(&s, &read(positions[4], 600_000, ""))).await;
    insert.await.unwrap();
    assert!(woken.contains("| new  |"), "{woken}");
    let e = error(&s, "SELECT * FROM tail('inbox', 0, -1)").await;
    assert!(e.contains("wait_ms"), "{e}");
    run(&s, "CREATE TABLE plain (k BIGINT PRIMARY KEY)").await;
    let e = error(&s, "SELECT * FROM tail('plain', 0, 0)").await;
    assert!(e.contains("queue table"), "{e}");

    // A statement sent again (its plan kept) reads anew each time, and the table as it is now.
    let again = s
        .prepare_statement(&read(positions[4], 0, ""))
        .await
        .unwrap();
    let tail_rows = |s: Session, again: nyala_sql::PreparedStatement| async move {
        let planned = s.plan_prepared(&again, &[]).await.unwrap();
        first_i64s(&collect(planned.execute().await.unwrap()).await.unwrap()).len()
    };
    assert_eq!(tail_rows(s.clone(), again.clone()).await, 1);
    run(
        &s,
        "INSERT INTO inbox (user_id, body) VALUES ('u1', 'newer')",
    )
    .await;
    assert_eq!(tail_rows(s.clone(), again.clone()).await, 2);
    run(&s, "DROP TABLE inbox").await;
    run(
        &s,
        "CREATE TABLE inbox (user_id STRING, pos BIGINT GENERATED ALWAYS AS POSITION, \
         body STRING, PRIMARY KEY (user_id, pos))",
    )
    .await;
    assert_eq!(tail_rows(s.clone(), again.clone()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_tail_takes_its_position_as_a_parameter() {
    use arrow::datatypes::DataType;
    use datafusion::common::ScalarValue;
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    inbox_with_five_messages_each(&s).await;
    let all = first_i64s(
        &run(
            &s,
            "SELECT pos FROM tail('inbox', 0, 0) WHERE user_id = 'u1'",
        )
        .await,
    );
    assert_eq!(all.len(), 5);
    let poll = |prepared: &nyala_sql::PreparedStatement, after: i64, queue: &str| {
        let (s, prepared) = (s.clone(), prepared.clone());
        let params = [ScalarValue::from(after), ScalarValue::from(queue)];
        async move {
            let planned = s.plan_prepared(&prepared, &params).await.unwrap();
            first_i64s(&collect(planned.execute().await.unwrap()).await.unwrap())
        }
    };
    // JDBC's and ADBC's `?`: the position first, then the queue.
    let consumer = s
        .prepare_statement("SELECT pos FROM tail('inbox', ?, 0) WHERE user_id = ?")
        .await
        .unwrap();
    let parameters = consumer.info().parameters.clone();
    assert_eq!(parameters.fields().len(), 2, "{parameters:?}");
    assert_eq!(parameters.field(0).data_type(), &DataType::Int64);
    // Planned when prepared: an execution binds the values into the tail and its filter.
    assert!(consumer.is_prepared_tail());
    assert_eq!(poll(&consumer, 0, "u1").await, all);
    assert_eq!(poll(&consumer, all[2], "u1").await, all[3..]);
    assert_eq!(poll(&consumer, all[4], "u1").await, Vec::<i64>::new());
    assert_eq!(poll(&consumer, 0, "u2").await.len(), 5);
    // Under an alias, with a WHERE of its own that the position condition does not loosen.
    let aliased = s
        .prepare_statement(
            "SELECT t.pos FROM tail('inbox', $1, 0) AS t \
             WHERE t.user_id = $2 OR t.user_id = 'nobody' LIMIT 2",
        )
        .await
        .unwrap();
    assert!(aliased.is_prepared_tail());
    assert_eq!(poll(&aliased, all[0], "u1").await, all[1..3]);
    // Another execution binds other values: another queue, from its start.
    assert_eq!(
        poll(&aliased, 0, "u2").await,
        poll(&consumer, 0, "u2").await[..2]
    );
    // A plan above the tail that keeps state between executions (a TopK) is planned anew.
    let newest = s
        .prepare_statement(
            "SELECT pos FROM tail('inbox', ?, 0) WHERE user_id = ? ORDER BY pos DESC LIMIT 2",
        )
        .await
        .unwrap();
    assert!(!newest.is_prepared_tail());
    assert_eq!(poll(&newest, all[0], "u1").await, [all[4], all[3]]);
    assert_eq!(poll(&newest, all[3], "u1").await, [all[4]]);
    // A long poll through it returns as soon as a row of its queue commits.
    let waiting = s
        .prepare_statement("SELECT pos FROM tail('inbox', ?, 60000) WHERE user_id = ?")
        .await
        .unwrap();
    let writer = db.session();
    let insert = tokio::spawn(async move {
        for queue in ["u2", "u1"] {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            run(
                &writer,
                &format!("INSERT INTO inbox (user_id, body) VALUES ('{queue}', 'new')"),
            )
            .await;
        }
    });
    let woken = poll(&waiting, all[4], "u1").await;
    insert.await.unwrap();
    assert!(
        woken.len() == 1 && woken[0] > all[4],
        "{woken:?} after {all:?}"
    );
    // Only the position can be a parameter, and only where it can join the WHERE.
    for sql in [
        "SELECT pos FROM tail('inbox', 0, ?)",
        "SELECT pos FROM tail('inbox', ? + 1, 0)",
        "SELECT t.pos FROM tail('inbox', ?, 0) AS t JOIN inbox AS i ON t.pos = i.pos",
    ] {
        let e = s.prepare_statement(sql).await.err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("only after_position can be a parameter")),
            "{sql}: {e:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_waits_through_other_queues_rows_and_a_tail_of_every_tablet_wakes_too() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    // One tablet holds both queues: rows of 'b' wake the tablet's waiters but are not 'a's.
    run(
        &s,
        "CREATE TABLE shared (queue STRING, pos BIGINT GENERATED ALWAYS AS POSITION, \
         body STRING, PRIMARY KEY (queue, pos))",
    )
    .await;
    let writer = db.session();
    let insert = tokio::spawn(async move {
        for body in ["b1", "b2", "a1"] {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let queue = &body[..1];
            let sql = format!("INSERT INTO shared (queue, body) VALUES ('{queue}', '{body}')");
            run(&writer, &sql).await;
        }
    });
    let woken = text(
        &s,
        "SELECT body FROM tail('shared', 0, 60000) WHERE queue = 'a'",
    )
    .await;
    insert.await.unwrap();
    assert!(
        woken.contains("| a1   |") && !woken.contains("b1"),
        "{woken}"
    );
    // A tail of every tablet (no queue named) waits on all of them.
    run(
        &s,
        "CREATE TABLE spread (queue STRING, pos BIGINT GENERATED ALWAYS AS POSITION, \
         body STRING, PRIMARY KEY (queue, pos)) DISTRIBUTE BY HASH (queue) INTO 3 BUCKETS",
    )
    .await;
    let writer = db.session();
    let insert = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        run(
            &writer,
            "INSERT INTO spread (queue, body) VALUES ('z', 'z1')",
        )
        .await;
    });
    let woken = text(&s, "SELECT body FROM tail('spread', 0, 60000)").await;
    insert.await.unwrap();
    assert!(woken.contains("| z1   |"), "{woken}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_multi_tablet_inserts_into_a_queue_do_not_wait_for_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE q (queue STRING, pos BIGINT GENERATED ALWAYS AS POSITION, body STRING, \
         PRIMARY KEY (queue, pos)) DISTRIBUTE BY HASH (queue) INTO 6 BUCKETS",
    )
    .await;
    // Each INSERT writes every queue (so every tablet): a transaction, prepared tablet by
    // tablet in one order, so no two wait for each other for good.
    let producers: Vec<_> = (0..4)
        .map(|p| {
            let session = db.session();
            tokio::spawn(async move {
                for i in 0..10 {
                    let rows: Vec<String> =
                        (0..12).map(|q| format!("('q{q}', 'p{p}-{i}')")).collect();
                    let insert = format!("INSERT INTO q (queue, body) VALUES {}", rows.join(", "));
                    run(&session, &insert).await;
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.unwrap();
    }
    assert!(text(&s, "SELECT count(*) AS n FROM q")
        .await
        .contains("| 480 |"));
    // Within each queue, each producer's messages are in the order it sent them.
    for q in 0..12 {
        let rows = text(
            &s,
            &format!("SELECT body FROM tail('q', 0, 0) WHERE queue = 'q{q}'"),
        )
        .await;
        for p in 0..4 {
            let seen: Vec<usize> = (0..10)
                .filter_map(|i| rows.find(&format!("p{p}-{i} ")))
                .collect();
            assert!(
                seen.len() == 10 && seen.windows(2).all(|w| w[0] < w[1]),
                "q{q} p{p}: {rows}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_are_independent_of_their_source_and_survive_its_drop_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let count = |s: &Session, table: &str| {
        let (s, sql) = (s.clone(), format!("SELECT count(*) FROM {table}"));
        async move { first_i64s(&run(&s, &sql).await)[0] }
    };
    {
        let (db, s) = open(dir.path()).await;
        load_metrics(&s).await;
        run(&s, "CREATE TABLE now_copy CLONE metrics").await;
        assert_eq!(count(&s, "now_copy").await, 5);
        // The same partitioning as the source.
        let shown = text(&s, "SHOW CREATE TABLE now_copy").await;
        assert!(shown.contains("INTO 4 BUCKETS"), "{shown}");
        // Writes to either never show in the other.
        run(
            &s,
            "INSERT INTO now_copy VALUES ('z', '2026-01-01T00:00:00', 'cpu', 9.0)",
        )
        .await;
        run(&s, "UPDATE metrics SET value = 100 WHERE host = 'b'").await;
        let before_delete = first_i64s(&run(&s, "SELECT CAST(now() AS BIGINT)").await)[0];
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        run(&s, "DELETE FROM metrics WHERE host = 'a'").await;
        assert_eq!(count(&s, "now_copy").await, 6);
        assert_eq!(count(&s, "metrics").await, 2);
        let b = text(&s, "SELECT value FROM now_copy WHERE host = 'b'").await;
        assert!(b.contains("| 3.0 "), "{b}");
        // As of a time before the DELETE: the source's rows then, with the update.
        run(
            &s,
            &format!(
                "CREATE TABLE then_copy CLONE metrics AS OF to_timestamp_nanos({before_delete})"
            ),
        )
        .await;
        assert_eq!(count(&s, "then_copy").await, 5);
        // The clone flushed the source: count(*) reads its flushed update.
        assert_eq!(count(&s, "metrics").await, 2);
        let b = text(&s, "SELECT value FROM then_copy WHERE host = 'b'").await;
        assert!(b.contains("| 100.0 "), "{b}");
        // Mistakes.
        let e = error(&s, "CREATE TABLE c CLONE nowhere").await;
        assert!(e.contains("nowhere"), "{e}");
        let e = error(&s, "CREATE TABLE now_copy CLONE metrics").await;
        assert!(e.contains("now_copy"), "{e}");
        run(&s, "CREATE TABLE IF NOT EXISTS now_copy CLONE metrics").await;
        assert_eq!(count(&s, "now_copy").await, 6);
        let e = error(
            &s,
            "CREATE TABLE c CLONE metrics AS OF now() + INTERVAL '1 hour'",
        )
        .await;
        assert!(e.contains("future"), "{e}");
        let e = error(&s, "CREATE TABLE c CLONE metrics AS OF 'yesterday-ish'").await;
        assert!(e.contains("yesterday-ish") || e.contains("time"), "{e}");
        assert!(error(&s, "SELECT * FROM c").await.contains("c"));
        // The source goes; its clones stay.
        run(&s, "DROP TABLE metrics").await;
        assert_eq!(count(&s, "now_copy").await, 6);
        db.shutdown().await.unwrap();
    }
    let (_db, s) = open(dir.path()).await;
    assert_eq!(count(&s, "now_copy").await, 6);
    assert_eq!(count(&s, "then_copy").await, 5);
    run(
        &s,
        "INSERT INTO then_copy VALUES ('y', '2026-01-01T00:00:00', 'cpu', 1.0)",
    )
    .await;
    assert_eq!(count(&s, "then_copy").await, 6);
}

/// UPDATE and DELETE read the key of each row alone: a row updated after its flush (a clone
/// flushes its source) must still be found, by every later UPDATE and DELETE (found by
/// tests/python/fuzz_traffic.py: they changed nothing and reported 0 rows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_updated_after_a_flush_or_clone_can_be_updated_and_deleted_again() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE s (k BIGINT PRIMARY KEY, v STRING) DISTRIBUTE BY HASH (k) INTO 4 BUCKETS",
    )
    .await;
    run(&s, "INSERT INTO s VALUES (1, 'orig'), (2, 'orig')").await;
    run(&s, "CREATE TABLE s_clone CLONE s").await;
    for table in ["s", "s_clone"] {
        for v in ["a", "b", "c"] {
            let n = affected(&run(&s, &format!("UPDATE {table} SET v = '{v}' WHERE k = 1")).await);
            assert_eq!(n, 1, "UPDATE {table} to {v}");
        }
        let n = affected(&run(&s, &format!("DELETE FROM {table} WHERE k = 2")).await);
        assert_eq!(n, 1, "DELETE FROM {table}");
        let rows = text(&s, &format!("SELECT k, v FROM {table}")).await;
        assert!(
            rows.contains("| 1 | c |") && !rows.contains("| 2 "),
            "{table}: {rows}"
        );
    }
}

/// The current time in microseconds since the epoch.
fn now_micros() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.unwrap().as_micros() as i64
}

/// One change a `changes()` consumer received: id, region, amount, change, commit time.
type Change = (i64, Option<String>, Option<i64>, String, i64);

/// `SELECT id, region, amount, _change, _commit_time FROM changes('orders', from, to...)`.
async fn changes_of(session: &Session, from: i64, rest: &str) -> Vec<Change> {
    let sql = format!(
        "SELECT id, region, amount, _change, _commit_time FROM \
         changes('orders', to_timestamp_micros({from}), {rest})"
    );
    let mut out = Vec::new();
    for batch in run(session, &sql).await {
        let column = |i: usize, to: &arrow::datatypes::DataType| {
            arrow::compute::cast(batch.column(i), to).unwrap()
        };
        use arrow::array::AsArray;
        use arrow::datatypes::{DataType, Int64Type};
        let (id, region, amount) = (
            column(0, &DataType::Int64),
            column(1, &DataType::Utf8),
            column(2, &DataType::Int64),
        );
        let (change, time) = (column(3, &DataType::Utf8), column(4, &DataType::Int64));
        let (id, amount) = (
            id.as_primitive::<Int64Type>(),
            amount.as_primitive::<Int64Type>(),
        );
        let (region, change) = (region.as_string::<i32>(), change.as_string::<i32>());
        let time = time.as_primitive::<Int64Type>();
        for i in 0..batch.num_rows() {
            out.push((
                id.value(i),
                region.is_valid(i).then(|| region.value(i).to_string()),
                amount.is_valid(i).then(|| amount.value(i)),
                change.value(i).to_string(),
                time.value(i),
            ));
        }
    }
    out
}

/// The table's rows as a consumer of its changes holds them.
type Replica = std::collections::BTreeMap<i64, (Option<String>, Option<i64>)>;

/// Applies `changes` to `replica`; returns the largest commit time (or `from` if none).
fn replay(replica: &mut Replica, changes: &[Change], from: i64) -> i64 {
    let times: Vec<i64> = changes.iter().map(|c| c.4).collect();
    assert!(times.is_sorted(), "changes in commit order: {times:?}");
    for (id, region, amount, change, _) in changes {
        match change.as_str() {
            "delete" => replica.remove(id),
            "insert" | "update" => replica.insert(*id, (region.clone(), *amount)),
            other => panic!("change '{other}'"),
        };
    }
    times.last().copied().unwrap_or(from)
}

async fn orders(session: &Session) -> Replica {
    let mut rows = Replica::new();
    for batch in run(session, "SELECT id, region, amount FROM orders").await {
        use arrow::array::AsArray;
        use arrow::datatypes::Int64Type;
        let id = batch.column(0).as_primitive::<Int64Type>();
        let region = arrow::compute::cast(batch.column(1), &arrow::datatypes::DataType::Utf8);
        let region = region.unwrap();
        let region = region.as_string::<i32>();
        let amount = batch.column(2).as_primitive::<Int64Type>();
        for i in 0..batch.num_rows() {
            rows.insert(
                id.value(i),
                (
                    region.is_valid(i).then(|| region.value(i).to_string()),
                    amount.is_valid(i).then(|| amount.value(i)),
                ),
            );
        }
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_stream_a_tables_rows_to_a_consumer_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut db, mut s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, region STRING, amount BIGINT) \
         DISTRIBUTE BY HASH (id) INTO 3 BUCKETS",
    )
    .await;
    let start = now_micros();
    let mut replica = Replica::new();
    let mut from = start;
    let rounds: &[&[&str]] = &[
        &["INSERT INTO orders VALUES (1, 'eu', 10), (2, 'us', 20), (3, 'eu', 30)"],
        &[
            "UPDATE orders SET amount = 11 WHERE id = 1",
            "DELETE FROM orders WHERE id = 2",
            "INSERT INTO orders VALUES (4, 'eu', 40)",
            "DELETE FROM orders WHERE id = 4",
        ],
        // A transaction across tablets: its rows share one commit time.
        &[
            "BEGIN",
            "INSERT INTO orders VALUES (5, 'us', 50), (6, 'eu', 60), (7, 'us', 70)",
            "UPDATE orders SET region = 'us' WHERE id = 3",
            "COMMIT",
        ],
        &[
            "UPSERT INTO orders VALUES (2, 'eu', 21)",
            "DELETE FROM orders WHERE id = 5",
        ],
    ];
    let mut seen = Vec::new();
    for (round, statements) in rounds.iter().enumerate() {
        for sql in *statements {
            run(&s, sql).await;
        }
        if round == 3 {
            // Rows moved to files (shutting down flushes them) change nothing of what a
            // consumer reads.
            db.shutdown().await.unwrap();
            drop((db, s));
            (db, s) = open(dir.path()).await;
        }
        let received = changes_of(&s, from, "NULL").await;
        from = replay(&mut replica, &received, from);
        assert_eq!(
            replica,
            orders(&s).await,
            "after round {round}: {received:?}"
        );
        seen.push(received);
    }
    // Key 4, inserted and deleted in one window, is a deletion of a row never seen.
    let four: Vec<&Change> = seen[1].iter().filter(|c| c.0 == 4).collect();
    assert_eq!(four.len(), 1, "{:?}", seen[1]);
    assert_eq!((four[0].3.as_str(), &four[0].1), ("delete", &None));
    // A deletion carries the row as the consumer last saw it.
    let two = seen[1].iter().find(|c| c.0 == 2).unwrap();
    assert_eq!(
        (two.1.as_deref(), two.2, two.3.as_str()),
        (Some("us"), Some(20), "delete")
    );
    // The transaction's rows arrive together, at one commit time.
    let txn: Vec<i64> = seen[2].iter().map(|c| c.4).collect();
    assert!(
        txn.len() == 4 && txn.iter().all(|&t| t == txn[0]),
        "{:?}",
        seen[2]
    );
    // From the start, the whole window at once: each key once, as it is now.
    let all = changes_of(&s, start, "NULL").await;
    let mut keys: Vec<i64> = all.iter().map(|c| c.0).collect();
    keys.sort_unstable();
    assert_eq!(keys, (1..=7).collect::<Vec<_>>(), "{all:?}");
    let mut fresh = Replica::new();
    replay(&mut fresh, &all, start);
    assert_eq!(fresh, orders(&s).await);
    // WHERE on the table's columns is pushed into storage; on the change, applied after.
    let eu = changes_of(
        &s,
        start,
        "NULL) WHERE region = 'eu' AND _change <> 'delete' AND (1 = 1",
    )
    .await;
    let mut eu_keys: Vec<i64> = eu.iter().map(|c| c.0).collect();
    eu_keys.sort_unstable();
    assert_eq!(eu_keys, vec![1, 2, 6], "{eu:?}");
    // `from` given as `WHERE _commit_time > time`, or as a parameter of a prepared statement.
    let by_filter = format!(
        "SELECT id FROM changes('orders', NULL, NULL) \
         WHERE _commit_time > to_timestamp_micros({start}) ORDER BY id"
    );
    let ids = first_i64s(&run(&s, &by_filter).await);
    assert_eq!(ids, (1..=7).collect::<Vec<_>>());
    let e = error(&s, "SELECT * FROM changes('orders', NULL, NULL)").await;
    assert!(e.contains("or NULL with WHERE _commit_time > time"), "{e}");
    let sql = "SELECT id FROM changes('orders', $1, NULL) ORDER BY id";
    let prepared = s.prepare_statement(sql).await.unwrap();
    for value in [
        datafusion::common::ScalarValue::TimestampMicrosecond(Some(start), None),
        datafusion::common::ScalarValue::Utf8(Some(
            arrow::temporal_conversions::timestamp_us_to_datetime(start)
                .unwrap()
                .format("%Y-%m-%d %H:%M:%S%.6f")
                .to_string(),
        )),
    ] {
        let planned = s.plan_prepared(&prepared, &[value]).await.unwrap();
        let ids = first_i64s(&collect(planned.execute().await.unwrap()).await.unwrap());
        assert_eq!(ids, (1..=7).collect::<Vec<_>>());
    }
    // A window that ends in the past.
    let first = seen[0][0].4;
    let early = changes_of(&s, start, &format!("to_timestamp_micros({first})")).await;
    assert_eq!(early.len(), 3, "{early:?}");
    assert!(early.iter().all(|c| c.3 == "insert"), "{early:?}");

    // A long poll returns as soon as a change commits.
    let writer = db.session();
    let insert = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        run(&writer, "INSERT INTO orders VALUES (8, 'eu', 80)").await;
    });
    // The poll may wait 10 minutes: only the commit's wake-up ends it before the guard does.
    let woken = woken_before_its_wait_ends(changes_of(&s, from, "NULL, 600000")).await;
    insert.await.unwrap();
    assert_eq!(woken.len(), 1, "{woken:?}");
    assert_eq!((woken[0].0, woken[0].3.as_str()), (8, "insert"));
    let from = replay(&mut replica, &woken, from);
    assert!(changes_of(&s, from, "NULL, 50").await.is_empty());

    // Errors.
    let e = error(
        &s,
        "SELECT * FROM changes('orders', TIMESTAMP '2001-01-01 00:00:00', NULL)",
    )
    .await;
    assert!(
        e.contains("history retention") && e.contains("history_max_age_secs"),
        "{e}"
    );
    let e = error(&s, "SELECT * FROM changes('nope', now(), NULL)").await;
    assert!(e.contains("nope"), "{e}");
    let e = error(&s, "SELECT * FROM changes('orders', now(), now(), 10)").await;
    assert!(e.contains("wait_ms needs to = NULL"), "{e}");
    let e = error(&s, "SELECT * FROM changes('orders')").await;
    assert!(e.contains("takes three or four arguments"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_keeps_its_history_as_long_as_it_says() {
    let dir = tempfile::tempdir().unwrap();
    let (mut db, mut s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE kept (k BIGINT PRIMARY KEY, v STRING) WITH (history_max_age_secs = 86400)",
    )
    .await;
    run(&s, "CREATE TABLE usual (k BIGINT PRIMARY KEY, v STRING)").await;
    run(&s, "INSERT INTO kept VALUES (1, 'a')").await;
    let two_hours_ago = now_micros() - 2 * 3600 * 1_000_000;
    let read = |table: &str| {
        format!("SELECT k FROM changes('{table}', to_timestamp_micros({two_hours_ago}), NULL)")
    };
    assert_eq!(first_i64s(&run(&s, &read("kept")).await), vec![1]);
    let e = error(&s, &read("usual")).await;
    assert!(e.contains("900 s, history_max_age_secs"), "{e}");
    let e = error(&s, "SELECT * FROM usual AS OF now() - INTERVAL '2 hours'").await;
    assert!(e.contains("900 s"), "{e}");
    assert!(text(&s, "SHOW CREATE TABLE kept")
        .await
        .contains("WITH (history_max_age_secs = 86400)"));
    run(&s, "ALTER TABLE usual SET (history_max_age_secs = 36000)").await;
    run(&s, "INSERT INTO usual VALUES (2, 'b')").await;
    assert_eq!(first_i64s(&run(&s, &read("usual")).await), vec![2]);
    // Kept across a restart, in the tablets' metadata and the catalog.
    db.shutdown().await.unwrap();
    drop((db, s));
    (db, s) = open(dir.path()).await;
    assert_eq!(first_i64s(&run(&s, &read("usual")).await), vec![2]);
    assert!(text(&s, "SHOW CREATE TABLE usual")
        .await
        .contains("history_max_age_secs = 36000"));
    for (sql, message) in [
        (
            "ALTER TABLE usual SET (history_max_age_secs = 0)",
            "whole number from 1",
        ),
        (
            "ALTER TABLE usual SET (replicas = 3)",
            "supported: history_max_age_secs",
        ),
        (
            "CREATE TABLE t2 (k INT PRIMARY KEY) WITH (history_max_age_secs = 'x')",
            "whole number",
        ),
    ] {
        let e = error(&s, sql).await;
        assert!(e.contains(message), "{sql}: {e}");
    }
    drop(db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_on_conflict_does_nothing_or_updates_existing_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE stock (sku STRING PRIMARY KEY, qty BIGINT, note STRING) \
         DISTRIBUTE BY HASH (sku) INTO 3 BUCKETS",
    )
    .await;
    run(&s, "INSERT INTO stock VALUES ('a', 1, 'x'), ('b', 2, 'y')").await;
    let rows = || text(&s, "SELECT * FROM stock ORDER BY sku");
    // DO NOTHING: existing keys keep their rows.
    let sql =
        "INSERT INTO stock VALUES ('a', 10, 'new'), ('c', 3, 'z') ON CONFLICT (sku) DO NOTHING";
    assert_eq!(affected(&run(&s, sql).await), 1);
    // DO UPDATE: an existing row changes by the listed expressions only, from its own values
    // and the proposed ones (EXCLUDED); new keys are inserted (unlisted columns NULL).
    let sql = "INSERT INTO stock (sku, qty) VALUES ('a', 5), ('d', 4) \
               ON CONFLICT (sku) DO UPDATE SET qty = stock.qty + EXCLUDED.qty";
    assert_eq!(affected(&run(&s, sql).await), 2);
    // With a condition: rows it is false for stay as they are.
    let sql = "INSERT INTO stock VALUES ('a', 0, 'big'), ('b', 0, 'small') \
               ON CONFLICT DO UPDATE SET note = EXCLUDED.note WHERE stock.qty > 5";
    assert_eq!(affected(&run(&s, sql).await), 1);
    let expected = "+-----+-----+------+\n\
                    | sku | qty | note |\n\
                    +-----+-----+------+\n\
                    | a   | 6   | big  |\n\
                    | b   | 2   | y    |\n\
                    | c   | 3   | z    |\n\
                    | d   | 4   |      |\n\
                    +-----+-----+------+";
    assert_eq!(rows().await, expected);
    // From a query, and prepared with parameters (an ORM's upsert).
    let sql = "INSERT INTO stock SELECT sku, 100, 'restock' FROM stock WHERE qty < 4 \
               ON CONFLICT (sku) DO UPDATE SET qty = EXCLUDED.qty, note = EXCLUDED.note";
    assert_eq!(affected(&run(&s, sql).await), 2);
    let sql =
        "INSERT INTO stock VALUES ($1, $2, 'p') ON CONFLICT (sku) DO UPDATE SET qty = EXCLUDED.qty";
    let prepared = s.prepare_statement(sql).await.unwrap();
    for (sku, qty) in [("a", 7), ("e", 8)] {
        use datafusion::common::ScalarValue;
        let params = [ScalarValue::from(sku), ScalarValue::Int64(Some(qty))];
        let planned = s.plan_prepared(&prepared, &params).await.unwrap();
        assert_eq!(
            affected(&collect(planned.execute().await.unwrap()).await.unwrap()),
            1
        );
    }
    let qty = text(
        &s,
        "SELECT sku, qty FROM stock WHERE sku IN ('a', 'b', 'e') ORDER BY sku",
    )
    .await;
    assert!(
        qty.contains("| a   | 7   |") && qty.contains("| b   | 100 |"),
        "{qty}"
    );
    assert!(qty.contains("| e   | 8   |"), "{qty}");
    // In a transaction: it rolls back with it.
    let before = rows().await;
    run(&s, "BEGIN").await;
    run(
        &s,
        "INSERT INTO stock VALUES ('a', 0, 'gone') ON CONFLICT (sku) DO UPDATE SET qty = 0",
    )
    .await;
    assert!(text(&s, "SELECT qty FROM stock WHERE sku = 'a'")
        .await
        .contains("| 0   |"));
    run(&s, "ROLLBACK").await;
    assert_eq!(rows().await, before);
    run(&s, "BEGIN").await;
    let sql = "INSERT INTO stock VALUES ('a', 0, 'no'), ('f', 9, 'yes') ON CONFLICT DO NOTHING";
    assert_eq!(affected(&run(&s, sql).await), 1);
    run(&s, "COMMIT").await;
    let kept = text(
        &s,
        "SELECT sku, note FROM stock WHERE sku IN ('a', 'f') ORDER BY sku",
    )
    .await;
    assert!(
        kept.contains("| a   | big  |") && kept.contains("| f   | yes  |"),
        "{kept}"
    );
    // UPSERT naming some columns updates those of an existing row (a partial column update);
    // naming them all, it replaces the row.
    let sql = "UPSERT INTO stock (sku, note) VALUES ('a', 'partial'), ('z', 'new')";
    assert_eq!(affected(&run(&s, sql).await), 2);
    let partial = text(
        &s,
        "SELECT * FROM stock WHERE sku IN ('a', 'z') ORDER BY sku",
    )
    .await;
    assert!(partial.contains("| a   | 7   | partial |"), "{partial}");
    assert!(partial.contains("| z   |     | new     |"), "{partial}");
    run(
        &s,
        "UPSERT INTO stock (note, qty, sku) VALUES ('whole', 1, 'a')",
    )
    .await;
    let whole = text(&s, "SELECT * FROM stock WHERE sku = 'a'").await;
    assert!(whole.contains("| a   | 1   | whole |"), "{whole}");
    let before = rows().await;
    // Errors, changing nothing.
    let e = error(
        &s,
        "INSERT INTO stock VALUES ('a', 1, 'x') ON CONFLICT (qty) DO NOTHING",
    )
    .await;
    assert!(
        e.contains("must name the primary key of 'stock', (sku)"),
        "{e}"
    );
    let e = error(
        &s,
        "INSERT INTO stock (qty) VALUES (1) ON CONFLICT DO UPDATE SET qty = 2",
    )
    .await;
    assert!(e.contains("needs the primary key column 'sku'"), "{e}");
    let e = error(
        &s,
        "INSERT INTO stock VALUES ('a', 1, 'x') ON CONFLICT DO UPDATE SET nope = 1",
    )
    .await;
    assert!(e.contains("nope"), "{e}");
    let e = error(
        &s,
        "EXPLAIN ANALYZE UPSERT INTO stock (sku, qty) VALUES ('a', 0)",
    )
    .await;
    assert!(e.contains("EXPLAIN of an UPSERT that names some"), "{e}");
    let e = error(
        &s,
        "INSERT INTO stock VALUES ('a', 1, 'x') ON DUPLICATE KEY UPDATE qty = 2",
    )
    .await;
    assert!(e.contains("ON CONFLICT"), "{e}");
    assert_eq!(rows().await, before);
    db.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_columns_are_checked_when_written_and_read_with_json_functions() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    run(&s, "CREATE TABLE docs (id INT PRIMARY KEY, doc JSON)").await;
    run(
        &s,
        r#"INSERT INTO docs VALUES (1, '{"a": 1, "b": {"c": "x"}, "tags": ["p", "q"]}'),
           (2, '[1, 2, 3]'), (3, NULL)"#,
    )
    .await;
    // Invalid JSON is refused, naming the column and the row; nothing is written.
    let e = error(
        &s,
        r#"INSERT INTO docs VALUES (4, '{"a": 1}'), (5, '{"a": 1,}')"#,
    )
    .await;
    assert!(
        e.contains("column 'doc' of the row (id=5) is not valid JSON"),
        "{e}"
    );
    let e = error(&s, "UPDATE docs SET doc = 'nope' WHERE id = 2").await;
    assert!(e.contains("(id=2) is not valid JSON"), "{e}");
    let query = "SELECT id, doc->'b'->>'c' AS c, json_get_int(doc, 'a') AS a, \
                 json_length(doc) AS n, json_contains(doc, 'tags') AS tagged FROM docs ORDER BY id";
    let expected = "+----+---+---+---+--------+\n\
                    | id | c | a | n | tagged |\n\
                    +----+---+---+---+--------+\n\
                    | 1  | x | 1 | 3 | true   |\n\
                    | 2  |   |   | 3 | false  |\n\
                    | 3  |   |   |   | false  |\n\
                    +----+---+---+---+--------+";
    assert_eq!(text(&s, query).await, expected);
    // The column is a string marked as JSON (the canonical arrow.json extension).
    let batches = run(&s, "SELECT doc FROM docs").await;
    let field = batches[0].schema().field(0).clone();
    assert_eq!(
        field
            .metadata()
            .get("ARROW:extension:name")
            .map(String::as_str),
        Some("arrow.json")
    );
    // Kept across a restart (shutting down flushes them into DiskRowSets) and ALTER TABLE.
    db.shutdown().await.unwrap();
    drop(s);
    let (db, s) = open(dir.path()).await;
    assert_eq!(text(&s, query).await, expected);
    run(&s, "ALTER TABLE docs ADD COLUMN extra JSON").await;
    run(&s, r#"UPDATE docs SET extra = '{"z": null}' WHERE id = 1"#).await;
    let extra = text(
        &s,
        "SELECT json_get_str(extra, 'z') AS z, extra FROM docs WHERE id = 1",
    )
    .await;
    assert!(extra.contains(r#"{"z": null}"#), "{extra}");
    let show = text(&s, "SHOW CREATE TABLE docs").await;
    assert!(
        show.contains("doc JSON NULL") && show.contains("extra JSON NULL"),
        "{show}"
    );
    let e = error(&s, "CREATE TABLE bad (doc JSON PRIMARY KEY)").await;
    assert!(e.contains("cannot be part of the primary key"), "{e}");
    db.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn array_columns_hold_lists_that_unnest_aggregate_and_survive_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE posts (id INT PRIMARY KEY, tags ARRAY<STRING>, scores INT[], \
         codes ARRAY<VARCHAR(3)>)",
    )
    .await;
    let show = text(&s, "SHOW CREATE TABLE posts").await;
    assert!(
        show.contains("tags ARRAY<STRING> NULL")
            && show.contains("scores ARRAY<INT32> NULL")
            && show.contains("codes ARRAY<VARCHAR(3)> NULL"),
        "{show}"
    );
    run(
        &s,
        "INSERT INTO posts VALUES (1, ['rust', 'db'], [3, 1, 2], ['abc']), \
         (2, ARRAY['sql'], [], NULL), (3, NULL, [NULL, 5], ['x', NULL])",
    )
    .await;
    let query = "SELECT id, tags, scores, codes, cardinality(tags) AS n, \
                 array_has(tags, 'db') AS db, scores[1] AS first FROM posts ORDER BY id";
    let expected = text(&s, query).await;
    assert_eq!(
        expected,
        "+----+------------+-----------+-------+---+-------+-------+\n\
         | id | tags       | scores    | codes | n | db    | first |\n\
         +----+------------+-----------+-------+---+-------+-------+\n\
         | 1  | [rust, db] | [3, 1, 2] | [abc] | 2 | true  | 3     |\n\
         | 2  | [sql]      | []        |       | 1 | false |       |\n\
         | 3  |            | [, 5]     | [x, ] |   |       |       |\n\
         +----+------------+-----------+-------+---+-------+-------+"
    );
    // The type every client sees: a list of the element type.
    let batches = run(&s, "SELECT tags, scores FROM posts").await;
    let schema = batches[0].schema();
    use arrow::datatypes::DataType as T;
    let element = |c: usize| match schema.field(c).data_type() {
        T::List(element) => element.data_type().clone(),
        other => panic!("column {c} is {other}"),
    };
    assert!(matches!(element(0), T::Utf8 | T::Utf8View));
    assert_eq!(element(1), T::Int32);
    // UNNEST, array_agg, and filters on arrays (IS NULL is evaluated in storage).
    assert_eq!(
        text(
            &s,
            "SELECT tag, count(*) AS n FROM (SELECT unnest(tags) AS tag FROM posts) \
             GROUP BY tag ORDER BY tag"
        )
        .await,
        "+------+---+\n\
         | tag  | n |\n\
         +------+---+\n\
         | db   | 1 |\n\
         | rust | 1 |\n\
         | sql  | 1 |\n\
         +------+---+"
    );
    assert_eq!(
        text(
            &s,
            "SELECT array_agg(id ORDER BY id) AS ids FROM posts WHERE tags IS NOT NULL"
        )
        .await,
        "+--------+\n\
         | ids    |\n\
         +--------+\n\
         | [1, 2] |\n\
         +--------+"
    );
    // Updates replace whole arrays, in memory and (after the restart flushed them) on disk.
    run(
        &s,
        "UPDATE posts SET tags = array_append(tags, 'new') WHERE id = 2",
    )
    .await;
    db.shutdown().await.unwrap();
    drop(s);
    let (db, s) = open(dir.path()).await;
    run(&s, "UPDATE posts SET scores = [9] WHERE id = 1").await;
    let after = "SELECT id, tags, scores FROM posts ORDER BY id";
    let updated = "+----+------------+--------+\n\
                   | id | tags       | scores |\n\
                   +----+------------+--------+\n\
                   | 1  | [rust, db] | [9]    |\n\
                   | 2  | [sql, new] | []     |\n\
                   | 3  |            | [, 5]  |\n\
                   +----+------------+--------+";
    assert_eq!(text(&s, after).await, updated);
    db.shutdown().await.unwrap();
    drop(s);
    let (db, s) = open(dir.path()).await;
    assert_eq!(text(&s, after).await, updated);
    // What a table cannot hold is refused, naming the column.
    let e = error(&s, "INSERT INTO posts VALUES (4, NULL, NULL, ['abcd'])").await;
    assert!(e.contains("'codes'") && e.contains("3"), "{e}");
    let e = error(&s, "CREATE TABLE bad (tags ARRAY<STRING> PRIMARY KEY)").await;
    assert!(e.contains("cannot be part of the primary key"), "{e}");
    let e = error(&s, "CREATE TABLE bad (id INT PRIMARY KEY, m INT[][])").await;
    assert!(e.contains("one dimension"), "{e}");
    let e = error(&s, "CREATE TABLE bad (id INT PRIMARY KEY, m ARRAY<JSON>)").await;
    assert!(e.contains("cannot hold JSON"), "{e}");
    assert_eq!(
        first_i64s(&run(&s, "SELECT count(*) FROM posts").await),
        [3]
    );
    db.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_without_a_key_take_duplicates_and_hide_their_row_ids() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    run(&s, "CREATE TABLE ev (a INT, b STRING)").await;
    let show = text(&s, "SHOW CREATE TABLE ev").await;
    assert!(
        show.contains("a INT32 NULL,") && show.contains(") DISTRIBUTE BY HASH INTO 4 BUCKETS"),
        "{show}"
    );
    assert!(!show.contains("PRIMARY KEY"), "{show}");
    // Duplicates and NULLs are rows like any other; SELECT * shows the declared columns only.
    let insert = "INSERT INTO ev VALUES (1, 'x'), (1, 'x'), (2, NULL), (NULL, 'z')";
    assert_eq!(affected(&run(&s, insert).await), 4);
    for i in 0..20 {
        run(&s, &format!("INSERT INTO ev VALUES ({i}, 'r')")).await;
    }
    let all = run(&s, "SELECT * FROM ev").await;
    let names: Vec<String> = (all[0].schema().fields().iter())
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["a", "b"]);
    // Each row has its own id, and is where its id says: a lookup by id, pruned to one
    // tablet, finds it.
    let ids = first_i64s(&run(&s, "SELECT auto_incrementing_id FROM ev").await);
    assert_eq!(ids.len(), 24);
    assert_eq!(
        ids.iter().collect::<std::collections::HashSet<_>>().len(),
        24
    );
    for id in &ids {
        let found = run(
            &s,
            &format!("SELECT a FROM ev WHERE auto_incrementing_id = {id}"),
        )
        .await;
        assert_eq!(
            found.iter().map(|b| b.num_rows()).sum::<usize>(),
            1,
            "id {id}"
        );
    }
    // UPDATE and DELETE by WHERE; a transaction; a restart, after which new ids are new.
    assert_eq!(
        affected(&run(&s, "UPDATE ev SET b = 'one' WHERE a = 1").await),
        3
    );
    assert_eq!(
        affected(&run(&s, "DELETE FROM ev WHERE a IS NULL OR a > 10").await),
        10
    );
    run(&s, "BEGIN").await;
    run(&s, "INSERT INTO ev VALUES (100, 'txn'), (100, 'txn')").await;
    run(&s, "COMMIT").await;
    let (db, s) = crash_and_reopen(dir.path(), db, s).await;
    run(&s, "INSERT INTO ev SELECT a, b FROM ev").await;
    let counts = text(
        &s,
        "SELECT count(*) AS n, count(DISTINCT auto_incrementing_id) AS ids, \
         count(*) FILTER (WHERE b = 'one') AS ones FROM ev",
    )
    .await;
    assert!(counts.contains("| 32 | 32  | 6    |"), "{counts}");
    // CREATE TABLE AS without a key, a view and a join of such tables: no hidden ids in `*`.
    run(&s, "CREATE TABLE ev2 AS SELECT * FROM ev WHERE a = 2").await;
    run(&s, "CREATE VIEW evv AS SELECT * FROM ev").await;
    for (sql, columns) in [
        ("SELECT * FROM ev2", vec!["a", "b"]),
        ("SELECT * FROM evv", vec!["a", "b"]),
        (
            "SELECT * FROM ev JOIN ev2 ON ev.a = ev2.a",
            vec!["a", "b", "a", "b"],
        ),
        ("SELECT e.*, 1 AS one FROM ev AS e", vec!["a", "b", "one"]),
        ("SELECT * EXCLUDE (b) FROM ev", vec!["a"]),
    ] {
        let batches = run(&s, sql).await;
        let schema = batches[0].schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, columns, "{sql}");
    }
    let show = text(&s, "SHOW CREATE TABLE ev2").await;
    assert!(
        !show.contains("PRIMARY KEY") && show.contains("HASH INTO 4 BUCKETS"),
        "{show}"
    );
    run(
        &s,
        "CREATE TABLE one (a INT) DISTRIBUTE BY HASH INTO 1 BUCKETS",
    )
    .await;
    run(&s, "INSERT INTO one VALUES (1), (1)").await;
    assert!(text(&s, "SHOW CREATE TABLE one")
        .await
        .contains("HASH INTO 1 BUCKETS"));
    // Errors that change nothing.
    for (sql, expected) in [
        (
            "CREATE TABLE bad (a INT) DISTRIBUTE BY HASH (a) INTO 2 BUCKETS",
            "auto_incrementing_id alone",
        ),
        (
            "CREATE TABLE bad (a INT) DISTRIBUTE BY RANGE (a)",
            "auto_incrementing_id alone",
        ),
        (
            "CREATE TABLE bad (a INT, auto_incrementing_id BIGINT)",
            "name of the column",
        ),
        (
            "INSERT INTO ev (auto_incrementing_id, a) VALUES (5, 1)",
            "assigned by the database",
        ),
        (
            "INSERT INTO ev VALUES (1, 'x') ON CONFLICT DO NOTHING",
            "whose key the database assigns",
        ),
    ] {
        let e = error(&s, sql).await;
        assert!(e.contains(expected), "{sql}: {e}");
    }
    assert!(text(&s, "SELECT count(*) AS n FROM ev")
        .await
        .contains("| 32 |"));
    db.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_loads_files_atomically_and_writes_query_results() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(&dir.path().join("db")).await;
    let files = dir.path().join("files");
    std::fs::create_dir(&files).unwrap();
    let file = |name: &str| files.join(name).display().to_string();
    run(
        &s,
        "CREATE TABLE m (k INT PRIMARY KEY, v BIGINT DEFAULT 7, s STRING NOT NULL) \
         DISTRIBUTE BY HASH (k) INTO 3 BUCKETS",
    )
    .await;
    let rows = || text(&s, "SELECT * FROM m ORDER BY k");
    // CSV with a header, another delimiter, a quoted field, a missing value (NULL); columns
    // left out take their DEFAULT.
    std::fs::write(file("a.csv"), "k;v;s\n1;10;a\n2;;\"b;c\"\n").unwrap();
    let sql = format!(
        "COPY m FROM '{}' (FORMAT csv, HEADER, DELIMITER ';')",
        file("a.csv")
    );
    assert_eq!(affected(&run(&s, &sql).await), 2);
    std::fs::write(file("b.csv"), "3,x\n").unwrap();
    assert_eq!(
        affected(&run(&s, &format!("COPY m (k, s) FROM '{}'", file("b.csv"))).await),
        1
    );
    // JSON, one object per line.
    std::fs::write(
        file("c.json"),
        "{\"k\": 4, \"s\": \"j\", \"v\": 40}\n{\"k\": 5, \"s\": \"q\"}\n",
    )
    .unwrap();
    assert_eq!(
        affected(&run(&s, &format!("COPY m FROM '{}'", file("c.json"))).await),
        2
    );
    let expected = "+---+----+-----+\n\
                    | k | v  | s   |\n\
                    +---+----+-----+\n\
                    | 1 | 10 | a   |\n\
                    | 2 |    | b;c |\n\
                    | 3 | 7  | x   |\n\
                    | 4 | 40 | j   |\n\
                    | 5 |    | q   |\n\
                    +---+----+-----+";
    assert_eq!(rows().await, expected);
    // COPY TO, then back: Parquet and CSV keep the rows.
    let sql = format!("COPY m TO '{}'", file("m.parquet"));
    assert_eq!(affected(&run(&s, &sql).await), 5);
    let sql = format!(
        "COPY (SELECT k + 10 AS k, v, s FROM m WHERE k > 2) TO '{}' (FORMAT csv, HEADER)",
        file("m.csv")
    );
    assert_eq!(affected(&run(&s, &sql).await), 3);
    run(
        &s,
        "CREATE TABLE m2 (k INT PRIMARY KEY, v BIGINT, s STRING NOT NULL)",
    )
    .await;
    run(&s, &format!("COPY m2 FROM '{}'", file("m.parquet"))).await;
    run(
        &s,
        &format!("COPY m2 FROM '{}' (FORMAT csv, HEADER)", file("m.csv")),
    )
    .await;
    let copied = text(&s, "SELECT count(*) AS n, sum(k) AS k, sum(v) AS v FROM m2").await;
    assert!(copied.contains("| 8 | 57 | 104 |"), "{copied}");
    // Several files by a pattern, as one statement: a bad row in the second file (after a
    // first file of more rows than one batch) loads nothing, and names its file and line.
    let many: String = (100..100_100).map(|k| format!("{k},{k},r\n")).collect();
    std::fs::write(file("part-1.csv"), many).unwrap();
    std::fs::write(file("part-2.csv"), "200000,1,ok\n200001,oops,bad\n").unwrap();
    let before = rows().await;
    let e = error(&s, &format!("COPY m FROM '{}'", file("part-*.csv"))).await;
    assert!(e.contains("part-2.csv") && e.contains("at line 2"), "{e}");
    assert!(e.contains("the COPY changed nothing"), "{e}");
    std::fs::write(file("part-2.csv"), "200000,1,ok\n200001,2,\n").unwrap();
    let e = error(&s, &format!("COPY m FROM '{}'", file("part-*.csv"))).await;
    assert!(
        e.contains("part-2.csv: line 2: column 's' is NOT NULL"),
        "{e}"
    );
    assert_eq!(rows().await, before);
    std::fs::write(file("part-2.csv"), "200000,1,ok\n").unwrap();
    let sql = format!("COPY m FROM '{}'", file("part-*.csv"));
    assert_eq!(affected(&run(&s, &sql).await), 100_001);
    // In a transaction it rolls back with it.
    run(&s, "BEGIN").await;
    std::fs::write(file("t.csv"), "50,1,t\n51,2,t\n").unwrap();
    run(&s, &format!("COPY m2 FROM '{}'", file("t.csv"))).await;
    assert!(text(&s, "SELECT count(*) AS n FROM m2")
        .await
        .contains("| 10 |"));
    run(&s, "ROLLBACK").await;
    assert!(text(&s, "SELECT count(*) AS n FROM m2")
        .await
        .contains("| 8 |"));
    // Errors that change nothing.
    for (sql, expected) in [
        (format!("COPY m FROM '{}'", file("none.csv")), "cannot read"),
        (
            format!("COPY m FROM '{}'", file("nothing-*.csv")),
            "no file matches",
        ),
        (format!("COPY m FROM '{}'", file("a.txt")), "say the format"),
        (
            format!("COPY m FROM '{}' (FORMAT xml)", file("a.csv")),
            "FORMAT xml",
        ),
        (
            format!("COPY m FROM '{}' (FORMAT parquet)", file("a.csv")),
            "not a Parquet file",
        ),
        (format!("COPY nope FROM '{}'", file("a.csv")), "nope"),
        (
            format!("COPY m (nope) FROM '{}'", file("a.csv")),
            "no column 'nope'",
        ),
        (
            format!("COPY m FROM '{}' (FORMAT json, HEADER)", file("c.json")),
            "go with FORMAT csv",
        ),
        (
            format!("COPY (SELECT nope FROM m) TO '{}'", file("x.csv")),
            "nope",
        ),
        ("COPY m TO PROGRAM 'ls'".to_string(), "PROGRAM"),
    ] {
        let e = error(&s, &sql).await;
        assert!(e.contains(expected), "{sql}: {e}");
    }
    assert!(!files.join("x.csv").exists());
    db.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_applies_the_first_matching_clause_to_each_row_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE acct (region STRING, id INT, bal BIGINT, note STRING, \
         PRIMARY KEY (region, id)) DISTRIBUTE BY HASH (id) INTO 3 BUCKETS",
    )
    .await;
    run(
        &s,
        "INSERT INTO acct VALUES ('eu', 1, 10, 'a'), ('eu', 2, 20, 'b'), ('us', 1, 30, 'c'), \
         ('us', 2, 40, 'd')",
    )
    .await;
    run(
        &s,
        "CREATE TABLE moves (region STRING, id INT, amount BIGINT, PRIMARY KEY (region, id))",
    )
    .await;
    run(
        &s,
        "INSERT INTO moves VALUES ('eu', 1, 5), ('eu', 2, -20), ('us', 1, 100), ('ap', 7, 70), \
         ('ap', 8, -1)",
    )
    .await;
    let rows = || text(&s, "SELECT * FROM acct ORDER BY region, id");
    // Each source row takes the first clause that applies: emptied accounts go, the others
    // change; new positive ones come in. A row an UPDATE raises above 50 is not deleted by the
    // later clause: every clause sees the target as it was.
    let sql = "MERGE INTO acct AS a USING moves AS m ON a.region = m.region AND a.id = m.id \
               WHEN MATCHED AND a.bal + m.amount <= 0 THEN DELETE \
               WHEN MATCHED AND a.bal < 50 THEN UPDATE SET bal = a.bal + m.amount, note = 'moved' \
               WHEN MATCHED THEN DELETE \
               WHEN NOT MATCHED AND m.amount > 0 THEN INSERT (region, id, bal) \
                 VALUES (m.region, m.id, m.amount)";
    assert_eq!(affected(&run(&s, sql).await), 4);
    let expected = "+--------+----+-----+-------+\n\
                    | region | id | bal | note  |\n\
                    +--------+----+-----+-------+\n\
                    | ap     | 7  | 70  |       |\n\
                    | eu     | 1  | 15  | moved |\n\
                    | us     | 1  | 130 | moved |\n\
                    | us     | 2  | 40  | d     |\n\
                    +--------+----+-----+-------+";
    assert_eq!(rows().await, expected);
    // Target rows no source row matches (BY SOURCE), a subquery as the source, parameters.
    let sql = "MERGE INTO acct USING (SELECT region, id FROM moves WHERE amount > $1) AS m \
               ON acct.region = m.region AND acct.id = m.id \
               WHEN NOT MATCHED BY SOURCE AND acct.bal > $2 THEN UPDATE SET note = 'idle' \
               WHEN MATCHED THEN UPDATE SET bal = 0";
    let prepared = s.prepare_statement(sql).await.unwrap();
    {
        use datafusion::common::ScalarValue;
        let params = [ScalarValue::Int64(Some(50)), ScalarValue::Int64(Some(20))];
        let planned = s.plan_prepared(&prepared, &params).await.unwrap();
        let changed = collect(planned.execute().await.unwrap()).await.unwrap();
        assert_eq!(affected(&changed), 3);
    }
    let expected = "+--------+----+-----+-------+\n\
                    | region | id | bal | note  |\n\
                    +--------+----+-----+-------+\n\
                    | ap     | 7  | 0   |       |\n\
                    | eu     | 1  | 15  | moved |\n\
                    | us     | 1  | 0   | moved |\n\
                    | us     | 2  | 40  | idle  |\n\
                    +--------+----+-----+-------+";
    assert_eq!(rows().await, expected);
    // In a transaction it rolls back with it; it sees the transaction's own rows.
    let before = rows().await;
    run(&s, "BEGIN").await;
    run(&s, "INSERT INTO moves VALUES ('us', 2, 1)").await;
    let sql = "MERGE INTO acct USING moves ON acct.region = moves.region AND acct.id = moves.id \
               WHEN MATCHED THEN DELETE";
    assert_eq!(affected(&run(&s, sql).await), 4);
    assert!(text(&s, "SELECT count(*) AS n FROM acct")
        .await
        .contains("| 0 |"));
    run(&s, "ROLLBACK").await;
    assert_eq!(rows().await, before);
    // Errors, changing nothing: two source rows for one target row, a key changed, a
    // duplicate key inserted, what MERGE does not take.
    let e = error(
        &s,
        "MERGE INTO acct USING (VALUES ('eu', 1, 1), ('eu', 1, 2)) AS m (region, id, v) \
         ON acct.region = m.region AND acct.id = m.id WHEN MATCHED THEN UPDATE SET bal = m.v",
    )
    .await;
    assert!(
        e.contains(
            "more than one source row matches the row of 'acct' whose key (region, id) is (eu, 1)"
        ),
        "{e}"
    );
    let e = error(
        &s,
        "MERGE INTO acct USING moves AS m ON acct.id = m.id WHEN MATCHED THEN UPDATE SET id = 9",
    )
    .await;
    assert!(e.contains("primary key"), "{e}");
    let e = error(
        &s,
        "MERGE INTO acct USING moves AS m ON FALSE WHEN NOT MATCHED THEN \
         INSERT VALUES (m.region, m.id, m.amount, 'dup')",
    )
    .await;
    assert!(e.contains("duplicate primary key"), "{e}");
    let e = error(
        &s,
        "MERGE INTO acct USING (SELECT 1 AS id) ON acct.id = 1 WHEN MATCHED THEN DELETE",
    )
    .await;
    assert!(e.contains("needs an alias"), "{e}");
    let e = error(
        &s,
        "EXPLAIN MERGE INTO acct USING moves ON acct.id = moves.id WHEN MATCHED THEN DELETE",
    )
    .await;
    assert!(e.contains("EXPLAIN of MERGE"), "{e}");
    let e = error(
        &s,
        "MERGE INTO nowhere USING moves ON nowhere.id = moves.id WHEN MATCHED THEN DELETE",
    )
    .await;
    assert!(e.contains("nowhere"), "{e}");
    assert_eq!(rows().await, before);
    db.shutdown().await.unwrap();
}

/// Decimal `+`, `-` and `*` run without a check per value where no value can overflow: the
/// results are exact either way (near i128's limit too), NULLs stay NULL, an overflow is still
/// an error, and EXPLAIN shows the expressions as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decimal_arithmetic_is_exact_and_overflow_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE prices (k INT PRIMARY KEY, price DECIMAL(15, 2), disc DECIMAL(15, 2), \
         tax DECIMAL(15, 2), big DECIMAL(38, 0)) DISTRIBUTE BY HASH (k) INTO 2 BUCKETS",
    )
    .await;
    run(
        &s,
        "INSERT INTO prices VALUES (1, 1000.00, 0.05, 0.08, 1), (2, 19.99, 0.10, NULL, 2), \
         (3, NULL, 0.00, 0.02, 3), (4, -250.50, 0.00, 0.10, CAST('100000000000000000000000000000000000' AS DECIMAL(38, 0)))",
    )
    .await;
    let got = text(
        &s,
        "SELECT k, price * (1 - disc) AS net, price * (1 - disc) * (1 + tax) AS charge, \
         price - disc AS diff, price + big AS total FROM prices ORDER BY k",
    )
    .await;
    let expected = "\
+---+-----------+-------------+---------+----------------------------------------+
| k | net       | charge      | diff    | total                                  |
+---+-----------+-------------+---------+----------------------------------------+
| 1 | 950.0000  | 1026.000000 | 999.95  | 1001.00                                |
| 2 | 17.9910   |             | 19.89   | 21.99                                  |
| 3 |           |             |         |                                        |
| 4 | -250.5000 | -275.550000 | -250.50 | 99999999999999999999999999999999749.50 |
+---+-----------+-------------+---------+----------------------------------------+";
    assert_eq!(got, expected);
    let sums = text(
        &s,
        "SELECT sum(price * (1 - disc) * (1 + tax)) AS charged, sum(big * 100) AS scaled \
         FROM prices",
    )
    .await;
    assert!(sums.contains("| 750.450000 "), "{sums}");
    assert!(
        sums.contains("| 10000000000000000000000000000000000600 "),
        "{sums}"
    );
    // 10^35 squared does not fit: arrow's kernel reports it, as without the fast path.
    let overflow = error(&s, "SELECT big * big FROM prices").await;
    assert!(overflow.contains("Overflow"), "{overflow}");
    let plan = text(
        &s,
        "EXPLAIN SELECT price * (1 - disc) * (1 + tax), (price + disc) / tax FROM prices",
    )
    .await;
    assert!(
        plan.contains("price@0 * (1 - disc@1) * (1 + tax@2)"),
        "{plan}"
    );
    assert!(plan.contains("(price@0 + disc@1) / tax@2"), "{plan}");
}
