//! Runtime-filter benchmark, after `kudu-bloom-filter-predicate.txt` at this machine's scale.
//!
//! A big table of `--rows` rows hash-partitioned 20 ways, flushed to DiskRowSets, and a small
//! table of 2 000 keys: the lowest and highest 1 000 keys of the big table, so its min/max
//! covers everything and only the bloom filter can skip rows. It times, with runtime filters
//! off, min/max only, and min/max + bloom:
//! - the join `big ⋈ small`,
//! - an UPSERT of the joined rows back into the big table,
//! - a low-selectivity join (95 % of the big rows match, so the bloom filter removes < 10 %
//!   and switches itself off), where the filters can only cost time.
//!
//! Run it in release mode: `cargo run --release -p nyala-sql --example join_bench`.

use std::time::{Duration, Instant};

use arrow::util::pretty::pretty_format_batches;
use clap::Parser;
use datafusion::physical_plan::common::collect;
use nyala_sql::{Database, DatabaseOptions, Session};

#[derive(Parser)]
struct Args {
    /// Rows in the big table.
    #[arg(long, default_value_t = 20_000_000)]
    rows: u64,
    /// Timed runs per measurement; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Database directory (default: a temporary one).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

const MODES: [&str; 3] = ["off", "minmax", "bloom"];
/// Rows per INSERT statement while loading.
const LOAD_CHUNK: u64 = 1_000_000;
/// Distinct values of the big table's `g` column (`id % GROUPS`).
const GROUPS: u64 = 100_000;

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let temp = tempfile::tempdir().expect("temporary directory");
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| temp.path().to_path_buf());

    let db = Database::open(&dir, DatabaseOptions::default())
        .await
        .unwrap();
    let s = db.session();
    let started = Instant::now();
    load(&s, args.rows).await;
    // Shutting down flushes every tablet, so the big table is read from DiskRowSets.
    db.shutdown().await.unwrap();
    drop(s);
    drop(db);
    println!(
        "loaded and flushed {} rows in {:.1} s",
        args.rows,
        started.elapsed().as_secs_f64()
    );
    let db = Database::open(&dir, DatabaseOptions::default())
        .await
        .unwrap();
    let s = db.session();

    let join = "SELECT count(*), sum(b.v) FROM big b JOIN small s ON b.id = s.id";
    let rows = "SELECT b.* FROM big b JOIN small s ON b.id = s.id";
    let upsert = "UPSERT INTO big SELECT b.id, b.g, b.v + 1, b.payload \
                  FROM small s JOIN big b ON b.id = s.id";
    let wide = "SELECT count(*), sum(b.v) FROM big b JOIN groups95 s ON b.g = s.g";
    let scan = "SELECT count(*), sum(v) FROM big";

    println!(
        "\nfull scan of big (id, v), for scale: {:.3} s",
        median(&s, scan, args.runs).await.as_secs_f64()
    );
    let queries = [
        ("join, count and sum", join),
        ("join, all columns", rows),
        ("upsert", upsert),
        ("low-selectivity join", wide),
    ];
    for (_, sql) in queries {
        show_plan(&s, sql).await;
    }
    for (name, sql) in queries {
        let mut times = Vec::new();
        for mode in MODES {
            run(&s, &format!("SET nyala.runtime_filters = {mode}")).await;
            times.push(median(&s, sql, args.runs).await);
        }
        let base = times[0].as_secs_f64();
        println!("\n{name}: {sql}");
        for (mode, t) in MODES.iter().zip(&times) {
            println!(
                "  {mode:>6}: {:8.3} s   speed-up vs off {:5.2}x",
                t.as_secs_f64(),
                base / t.as_secs_f64()
            );
        }
    }
}

async fn load(s: &Session, rows: u64) {
    run(
        s,
        "CREATE TABLE big (id BIGINT PRIMARY KEY, g BIGINT, v BIGINT, payload STRING) \
         DISTRIBUTE BY HASH (id) INTO 20 BUCKETS",
    )
    .await;
    let mut start = 0;
    while start < rows {
        let end = (start + LOAD_CHUNK).min(rows) - 1;
        run(
            s,
            &format!(
                "INSERT INTO big SELECT value, value % {GROUPS}, value * 3, \
                 concat('event-', CAST(value AS STRING)) FROM generate_series({start}, {end}) AS t(value)"
            ),
        )
        .await;
        start = end + 1;
    }
    run(s, "CREATE TABLE small (id BIGINT PRIMARY KEY, w BIGINT)").await;
    run(
        s,
        &format!(
            "INSERT INTO small SELECT value, value AS w FROM generate_series(0, 999) AS t(value) \
             UNION ALL SELECT value, value AS w FROM generate_series({}, {}) AS t(value)",
            rows.saturating_sub(1000),
            rows - 1
        ),
    )
    .await;
    run(s, "CREATE TABLE groups95 (g BIGINT PRIMARY KEY)").await;
    run(
        s,
        &format!(
            "INSERT INTO groups95 SELECT value FROM generate_series(0, {}) AS t(value) \
             WHERE value % 20 <> 0",
            GROUPS - 1
        ),
    )
    .await;
}

async fn run(s: &Session, sql: &str) -> Vec<arrow::array::RecordBatch> {
    let stream = s
        .execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    collect(stream)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The median time of `runs` runs of `sql`, after one warm-up run.
async fn median(s: &Session, sql: &str, runs: usize) -> Duration {
    run(s, sql).await;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        run(s, sql).await;
        times.push(started.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

async fn show_plan(s: &Session, sql: &str) {
    let plan = run(s, &format!("EXPLAIN ANALYZE {sql}")).await;
    let text = pretty_format_batches(&plan).unwrap().to_string();
    println!("\nEXPLAIN ANALYZE {sql}");
    for line in text
        .lines()
        .filter(|l| l.contains("NyalaScanExec: table=big"))
    {
        println!(
            "  {}",
            line.trim_matches(|c: char| c == '|' || c.is_whitespace())
        );
    }
}
