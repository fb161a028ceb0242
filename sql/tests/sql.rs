//! The SQL layer end to end in one process: statements through a `Session` over a real database
//! directory, results checked as a user sees them, errors leave tables unchanged, data survives
//! reopening.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::util::pretty::pretty_format_batches;
use datafusion::physical_plan::common::collect;
use nyala_sql::{Database, DatabaseOptions, Session};

async fn open(dir: &std::path::Path) -> (Arc<Database>, Session) {
    let db = Database::open(dir, DatabaseOptions::default())
        .await
        .unwrap();
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
    let e = error(&s, "INSERT INTO metrics VALUES ('q', '2026-01-01T00:00:00', 'cpu', 1.0), ('a', '2026-01-01T00:00:00', 'cpu', 9.0)").await;
    assert!(e.contains("duplicate") && e.contains("applied"), "{e}");
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
    {
        let (_db, s) = open(dir.path()).await;
        assert!(text(&s, "SELECT count(*) FROM metrics")
            .await
            .contains("| 4 "));
        run(&s, "UPDATE metrics SET value = 100 WHERE host = 'b'").await;
        // Dropped without shutdown: the Raft logs must bring the update back.
    }
    let (_db, s) = open(dir.path()).await;
    let got = text(&s, "SELECT sum(value) FROM metrics").await;
    assert!(got.contains("| 109.0 "), "{got}");
}
