//! BACKUP and RESTORE through SQL: a full backup and a chain of incremental ones restore each
//! table row by row as it was at each backup's snapshot; bad input changes nothing.

use std::path::Path;

use crate::{error, open, run, text};
use nyala_sql::Session;

/// What a user sees of the test's tables: every row of each, in key order.
async fn contents(s: &Session, orders: &str, events: &str, inbox: &str) -> [String; 3] {
    [
        text(s, &format!("SELECT * FROM {orders} ORDER BY id")).await,
        text(s, &format!("SELECT k, v FROM {events} ORDER BY k, v")).await,
        text(
            s,
            &format!("SELECT user_id, body FROM {inbox} ORDER BY user_id, pos"),
        )
        .await,
    ]
}

/// `BACKUP ...`, checked to end with its manifest; returns the rows it reports.
async fn backup(s: &Session, sql: &str) -> String {
    let out = text(s, sql).await;
    assert!(out.contains("manifest.json"), "{sql}: {out}");
    out
}

fn quoted(path: &Path) -> String {
    format!("'{}'", path.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_backup_and_an_incremental_chain_restore_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let backups = tempfile::tempdir().unwrap();
    let [full, first, second] = ["full", "incr-1", "incr-2"].map(|b| backups.path().join(b));
    let (mut db, mut s) = open(&dir.path().join("db")).await;
    for sql in [
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, region STRING, amount DOUBLE, \
         at TIMESTAMP, price DECIMAL(12, 2)) DISTRIBUTE BY HASH (id) INTO 3 BUCKETS \
         WITH (history_max_age_secs = 86400)",
        "CREATE TABLE events (k STRING, v BIGINT, NON UNIQUE PRIMARY KEY (k))",
        "CREATE TABLE inbox (user_id STRING, pos BIGINT GENERATED ALWAYS AS POSITION, \
         body STRING, PRIMARY KEY (user_id, pos)) DISTRIBUTE BY HASH (user_id) INTO 2 BUCKETS",
        "CREATE VIEW eu AS SELECT id, amount FROM orders WHERE region = 'eu'",
        "INSERT INTO orders SELECT value, CASE WHEN value % 3 = 0 THEN 'eu' \
         WHEN value % 3 = 1 THEN 'us' END, value * 1.5, \
         to_timestamp_micros(value * 1000000), CAST(value AS DECIMAL(12, 2)) / 4 \
         FROM generate_series(1, 3000) AS g(value)",
        "INSERT INTO events VALUES ('a', 1), ('a', 1), ('b', 2), ('c', 3)",
        "INSERT INTO inbox (user_id, body) VALUES ('u1', 'one'), ('u2', 'two'), ('u1', 'three')",
    ] {
        run(&s, sql).await;
    }
    let out = backup(&s, &format!("BACKUP DATABASE TO {}", quoted(&full))).await;
    // A file per tablet (3 + 1 + 2), then the manifest: 7 steps.
    assert!(out.contains("| 7    | 7     |"), "{out}");
    let at_full = contents(&s, "orders", "events", "inbox").await;

    // Updates, deletes, inserts and a transaction over several tablets.
    for sql in [
        "UPDATE orders SET amount = amount + 1, region = 'eu' WHERE id % 10 = 0",
        "DELETE FROM orders WHERE id % 7 = 0",
        "INSERT INTO orders SELECT value, 'ap', 0.5, NULL AS at, NULL AS price \
         FROM generate_series(3001, 3200) AS g(value)",
        "BEGIN",
        "DELETE FROM orders WHERE id BETWEEN 100 AND 120",
        "INSERT INTO orders VALUES (5000, 'eu', 1.0, NULL, 9.99), (5001, 'us', 2.0, NULL, 0.01)",
        "COMMIT",
        "DELETE FROM events WHERE k = 'b'",
        "INSERT INTO events VALUES ('a', 4), ('d', 5)",
        "INSERT INTO inbox (user_id, body) VALUES ('u2', 'four')",
    ] {
        run(&s, sql).await;
    }
    let sql = format!(
        "BACKUP DATABASE TO {} INCREMENTAL FROM {}",
        quoted(&first),
        quoted(&full)
    );
    backup(&s, &sql).await;
    let at_first = contents(&s, "orders", "events", "inbox").await;

    // The rows move to files (a restart flushes them); then more changes, some to keys the
    // first incremental backup holds.
    db.shutdown().await.unwrap();
    drop((db, s));
    (db, s) = open(&dir.path().join("db")).await;
    for sql in [
        "DELETE FROM orders WHERE id BETWEEN 3001 AND 3050",
        "UPSERT INTO orders VALUES (7, 'eu', 70.0, NULL, 7.00), (5000, 'us', 3.0, NULL, NULL)",
        "UPDATE orders SET price = 1.25 WHERE id % 10 = 0",
        "DELETE FROM events WHERE k = 'a' AND v = 4",
    ] {
        run(&s, sql).await;
    }
    let sql = format!(
        "BACKUP DATABASE TO {} INCREMENTAL FROM {}",
        quoted(&second),
        quoted(&first)
    );
    backup(&s, &sql).await;
    let at_second = contents(&s, "orders", "events", "inbox").await;
    run(
        &s,
        "INSERT INTO orders VALUES (9999, 'eu', 0.0, NULL, NULL)",
    )
    .await;

    // Each table restored from each backup is as it was when that backup was taken.
    for (i, (from, expected)) in [
        (&full, &at_full),
        (&first, &at_first),
        (&second, &at_second),
    ]
    .into_iter()
    .enumerate()
    {
        for table in ["orders", "events", "inbox"] {
            let sql = format!("RESTORE TABLE {table} FROM {} AS {table}_{i}", quoted(from));
            let out = text(&s, &sql).await;
            assert!(out.contains(&format!("{table}_{i}")), "{out}");
        }
        let [o, e, q] = ["orders", "events", "inbox"].map(|t| format!("{t}_{i}"));
        let restored = contents(&s, &o, &e, &q).await;
        assert_eq!(&restored, expected, "restored from backup {i}");
    }
    // The restored table is the same table: keys, partitions, options.
    let shown = text(&s, "SHOW CREATE TABLE orders_2").await;
    assert!(shown.contains("HASH (id) INTO 3 BUCKETS"), "{shown}");
    assert!(shown.contains("history_max_age_secs = 86400"), "{shown}");
    let queue = text(&s, "SHOW CREATE TABLE inbox_2").await;
    assert!(queue.contains("GENERATED ALWAYS AS POSITION"), "{queue}");

    // A whole database, into a new one: its tables and views.
    let other = tempfile::tempdir().unwrap();
    let (db2, s2) = open(other.path()).await;
    let out = text(&s2, &format!("RESTORE DATABASE FROM {}", quoted(&second))).await;
    assert!(out.contains("| 4    | 4     | eu"), "{out}");
    assert_eq!(contents(&s2, "orders", "events", "inbox").await, at_second);
    let eu = text(&s2, "SELECT count(*) FROM eu").await;
    let expected_eu = "SELECT count(*) FROM orders_2 WHERE region = 'eu'";
    assert_eq!(eu, text(&s, expected_eu).await);
    // A restored table takes writes as any other, the database assigning positions and ids.
    run(
        &s2,
        "INSERT INTO inbox (user_id, body) VALUES ('u1', 'five')",
    )
    .await;
    run(&s2, "INSERT INTO events VALUES ('a', 1)").await;
    let u1 = text(
        &s2,
        "SELECT body FROM inbox WHERE user_id = 'u1' ORDER BY pos",
    )
    .await;
    assert!(u1.find("three") < u1.find("five"), "{u1}");
    db2.shutdown().await.unwrap();
    db.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_backups_and_restores_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let backups = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v STRING) DISTRIBUTE BY HASH (id) INTO 2 BUCKETS",
    )
    .await;
    run(&s, "CREATE TABLE u (id BIGINT PRIMARY KEY)").await;
    run(
        &s,
        "INSERT INTO t SELECT value, 'x' FROM generate_series(1, 100) AS g(value)",
    )
    .await;
    let one = backups.path().join("one");
    backup(&s, &format!("BACKUP TABLE t TO {}", quoted(&one))).await;

    let missing = backups.path().join("missing");
    let e = error(
        &s,
        &format!("RESTORE TABLE t FROM {} AS t2", quoted(&missing)),
    )
    .await;
    assert!(e.contains("holds no complete backup"), "{e}");
    let e = error(&s, &format!("BACKUP TABLE t TO {}", quoted(&one))).await;
    assert!(e.contains("already holds a backup"), "{e}");
    let e = error(&s, "BACKUP TABLE t TO '/proc/nyala-backup'").await;
    assert!(e.contains("cannot create /proc/nyala-backup"), "{e}");
    let e = error(&s, &format!("BACKUP TABLE nope TO {}", quoted(&missing))).await;
    assert!(e.contains("nope"), "{e}");
    let e = error(&s, &format!("RESTORE TABLE t FROM {}", quoted(&one))).await;
    assert!(e.contains("'t' already exists"), "{e}");
    let e = error(&s, &format!("RESTORE TABLE u FROM {} AS u2", quoted(&one))).await;
    assert!(e.contains("holds no table 'u'"), "{e}");
    let e = error(
        &s,
        &format!(
            "BACKUP TABLE u TO {} INCREMENTAL FROM {}",
            quoted(&missing),
            quoted(&one)
        ),
    )
    .await;
    assert!(e.contains("table 'u' is not in the parent backup"), "{e}");
    assert!(!missing.join("manifest.json").exists());
    let e = error(&s, &format!("BACKUP TABLE t, t TO {}", quoted(&missing))).await;
    assert!(e.contains("table 't' is named twice"), "{e}");
    let e = error(&s, "BACKUP DATABASE").await;
    assert!(e.contains("Expected: TO"), "{e}");
    run(&s, "BEGIN").await;
    let e = error(&s, &format!("BACKUP TABLE t TO {}", quoted(&missing))).await;
    assert!(e.contains("inside a transaction"), "{e}");
    run(&s, "ROLLBACK").await;

    // A damaged file: nothing is created.
    let copy = backups.path().join("damaged");
    std::fs::create_dir_all(copy.join("t")).unwrap();
    for name in ["manifest.json", "t/00000.parquet", "t/00001.parquet"] {
        std::fs::copy(one.join(name), copy.join(name)).unwrap();
    }
    let file = copy.join("t/00001.parquet");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();
    let e = error(&s, &format!("RESTORE TABLE t FROM {} AS t3", quoted(&copy))).await;
    assert!(e.contains("00001.parquet is damaged"), "{e}");
    let e = error(&s, "SELECT * FROM t3").await;
    assert!(e.contains("t3"), "{e}");

    // A parent older than the table keeps its history.
    run(&s, "ALTER TABLE t SET (history_max_age_secs = 1)").await;
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let late = backups.path().join("late");
    let e = error(
        &s,
        &format!(
            "BACKUP TABLE t TO {} INCREMENTAL FROM {}",
            quoted(&late),
            quoted(&one)
        ),
    )
    .await;
    assert!(e.contains("history_max_age_secs"), "{e}");
    assert!(!late.join("manifest.json").exists());
    db.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_inserted_and_deleted_between_backups_restore_into_not_null_columns() {
    let dir = tempfile::tempdir().unwrap();
    let backups = tempfile::tempdir().unwrap();
    let (db, s) = open(dir.path()).await;
    run(
        &s,
        "CREATE TABLE strict (id BIGINT PRIMARY KEY, v BIGINT NOT NULL, w STRING NOT NULL) \
         DISTRIBUTE BY HASH (id) INTO 2 BUCKETS",
    )
    .await;
    run(&s, "INSERT INTO strict VALUES (1, 10, 'a'), (2, 20, 'b')").await;
    let full = backups.path().join("full");
    backup(&s, &format!("BACKUP TABLE strict TO {}", quoted(&full))).await;
    for sql in [
        "INSERT INTO strict VALUES (3, 30, 'c')",
        "DELETE FROM strict WHERE id = 3",
        "UPDATE strict SET v = 21 WHERE id = 2",
        "DELETE FROM strict WHERE id = 1",
    ] {
        run(&s, sql).await;
    }
    let incremental = backups.path().join("incremental");
    let sql = format!(
        "BACKUP TABLE strict TO {} INCREMENTAL FROM {}",
        quoted(&incremental),
        quoted(&full)
    );
    let out = backup(&s, &sql).await;
    // Keys 1, 2 and 3 changed (3 came and went): three rows over the two files.
    assert!(
        out.contains("| 3    | 3     |            | 3    |"),
        "{out}"
    );
    let sql = format!("RESTORE TABLE strict FROM {} AS back", quoted(&incremental));
    run(&s, &sql).await;
    assert_eq!(
        text(&s, "SELECT * FROM back ORDER BY id").await,
        text(&s, "SELECT * FROM strict ORDER BY id").await
    );
    db.shutdown().await.unwrap();
}
