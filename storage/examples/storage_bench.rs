//! Tablet storage benchmark: one tablet against the same rows written as one Parquet file and
//! read with the parquet crate, all in one run so the ratios compare like with like.
//!
//! ```text
//! cargo build --release -p nyala-storage --example storage_bench
//! $CARGO_TARGET_DIR/release/examples/storage_bench --rows 10000000
//! ```
//!
//! Rows are `(k BIGINT key, v BIGINT, s STRING)`, inserted in batches of 1 000 in shuffled key
//! order with the tablet flushing whenever its MemRowSet reaches the flush threshold (inline, so
//! insert throughput includes flushing). Scans report the median of `--runs` warm runs.

use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::Int64Type;
use clap::Parser;
use nyala_storage::{
    ColumnPredicate, ColumnSchema, ColumnType, MaintenanceKind, PredicateOp, Scalar, ScanSpec,
    Schema, Tablet, TabletOptions, Timestamp, WriteBatch, WriteKind,
};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

#[derive(Parser)]
struct Args {
    /// Rows to insert.
    #[arg(long, default_value_t = 10_000_000)]
    rows: usize,
    /// Warm runs per scan; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Random point lookups.
    #[arg(long, default_value_t = 2_000)]
    lookups: usize,
    /// Also write the figures as JSON to this file (the schema of `bench/results/*.json`, which
    /// `bench/render.py` turns into the guide's benchmarks page).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// What the run measured, printed as it comes and kept for the JSON file: scans side by side
/// with the same scan of the Parquet file, and the other figures as text.
#[derive(Default)]
struct Results {
    scans: std::cell::RefCell<Vec<Vec<serde_json::Value>>>,
    figures: std::cell::RefCell<Vec<[String; 2]>>,
}

impl Results {
    fn say(&self, figure: &str, result: String) {
        println!("{figure}: {result}");
        self.figures.borrow_mut().push([figure.to_string(), result]);
    }

    fn write(&self, args: &Args, path: &std::path::Path) {
        let commit = std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        let load: Vec<f64> = std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .filter_map(|v| v.parse().ok())
            .collect();
        let report = serde_json::json!({
            "benchmark": "storage",
            "title": "Tablet storage against one Parquet file (parquet crate), same rows, same run",
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "commit": commit,
            "date": chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            "machine": {
                "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
                "load_average": load,
            },
            "baseline": "the same rows as one Parquet file (LZ4), read with the parquet crate",
            "parameters": {"rows": args.rows, "runs": args.runs, "lookups": args.lookups},
            "tables": [
                {
                    "title": format!("Full scans of one column, median of {} warm runs", args.runs),
                    "columns": ["scan", "tablet s", "tablet M rows/s", "Parquet s", "tablet/Parquet"],
                    "rows": *self.scans.borrow(),
                },
                {
                    "title": "Other figures",
                    "columns": ["figure", "result"],
                    "rows": *self.figures.borrow(),
                },
            ],
        });
        let text = serde_json::to_string_pretty(&report).expect("json") + "\n";
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).expect("creating the JSON file's directory");
        }
        std::fs::write(path, text).expect("writing the JSON file");
        println!("results written to {}", path.display());
    }
}

const BATCH: usize = 1_000;

fn schema() -> Schema {
    let column = |name: &str, column_type, nullable| ColumnSchema::new(name, column_type, nullable);
    Schema::new(
        vec![
            column("k", ColumnType::Int64, false),
            column("v", ColumnType::Int64, false),
            column("s", ColumnType::String, true),
        ],
        vec![0],
    )
    .expect("valid schema")
}

fn rows(schema: &Schema, keys: &[i64]) -> RecordBatch {
    RecordBatch::try_new(
        schema.arrow_schema(),
        vec![
            Arc::new(Int64Array::from(keys.to_vec())) as ArrayRef,
            Arc::new(Int64Array::from_iter_values(
                keys.iter().map(|k| k * 7 % 1_000_003),
            )),
            Arc::new(StringArray::from_iter_values(
                keys.iter()
                    .map(|k| format!("user-{:05}-{}", k % 50_000, k % 7)),
            )),
        ],
    )
    .expect("valid batch")
}

struct Clock {
    ts: u64,
    index: u64,
}

impl Clock {
    /// Hybrid times from now: the history stays within the retention, so flushes write UNDO
    /// records as they would in a server.
    fn from_now() -> Clock {
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_micros() as u64;
        Clock {
            ts: Timestamp::from_micros(micros).0,
            index: 0,
        }
    }

    fn next(&mut self) -> (u64, Timestamp) {
        self.ts += 1;
        self.index += 1;
        (self.index, Timestamp(self.ts))
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * p) as usize]
}

/// Sums column `column` (INT64: the values; STRING: the lengths) of a tablet scan.
fn scan_tablet(tablet: &Tablet, column: usize, snapshot: Timestamp) -> (u64, Duration) {
    let start = Instant::now();
    let spec = ScanSpec {
        projection: Some(vec![column]),
        predicates: vec![],
        snapshot,
        limit: None,
        batch_size: 64 * 1024,
        string_views: false,
        changes_since: None,
    };
    let mut sum = 0u64;
    for batch in tablet.scan(&spec).expect("scan") {
        sum = sum.wrapping_add(fold(batch.expect("batch").column(0)));
    }
    (sum, start.elapsed())
}

fn scan_parquet(path: &std::path::Path, column: usize) -> (u64, Duration) {
    let start = Instant::now();
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(File::open(path).expect("open")).expect("parquet");
    let mask = ProjectionMask::roots(builder.parquet_schema(), [column]);
    let mut sum = 0u64;
    for batch in builder
        .with_projection(mask)
        .with_batch_size(64 * 1024)
        .build()
        .expect("reader")
    {
        sum = sum.wrapping_add(fold(batch.expect("batch").column(0)));
    }
    (sum, start.elapsed())
}

fn fold(column: &ArrayRef) -> u64 {
    match column.data_type() {
        arrow::datatypes::DataType::Int64 => column
            .as_primitive::<Int64Type>()
            .values()
            .iter()
            .fold(0u64, |a, &v| a.wrapping_add(v as u64)),
        _ => {
            let strings = column.as_string::<i32>();
            (strings.value_offsets()[strings.len()] - strings.value_offsets()[0]) as u64
        }
    }
}

fn main() {
    let args = Args::parse();
    let dir = tempfile::tempdir().expect("temp dir");
    let schema = schema();
    let options = TabletOptions::default();
    let tablet = Tablet::create(&dir.path().join("tablet"), schema.clone(), options.clone())
        .expect("tablet");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut keys: Vec<i64> = (0..args.rows as i64).collect();
    keys.shuffle(&mut rng);
    let mut clock = Clock::from_now();
    let results = Results::default();

    // Inserts, flushing whenever the MemRowSet is full.
    let mut latencies = Vec::with_capacity(args.rows / BATCH + 1);
    let mut flushing = Duration::ZERO;
    let start = Instant::now();
    for chunk in keys.chunks(BATCH) {
        let batch = WriteBatch::new(WriteKind::Insert, rows(&schema, chunk));
        let (index, ts) = clock.next();
        let t = Instant::now();
        tablet.apply(index, ts, &batch).expect("insert");
        latencies.push(t.elapsed());
        if tablet.needs_flush() {
            let t = Instant::now();
            tablet.flush().expect("flush");
            flushing += t.elapsed();
        }
    }
    let t = Instant::now();
    tablet.flush().expect("flush");
    flushing += t.elapsed();
    let insert_time = start.elapsed();
    results.say(
        "insert",
        format!(
            "{} rows in {:.2} s = {:.0} rows/s (of which flushing {:.2} s); \
             per {BATCH}-row batch p50 {:.0} µs, p99 {:.0} µs",
            args.rows,
            insert_time.as_secs_f64(),
            args.rows as f64 / insert_time.as_secs_f64(),
            flushing.as_secs_f64(),
            percentile(&mut latencies, 0.5).as_secs_f64() * 1e6,
            percentile(&mut latencies, 0.99).as_secs_f64() * 1e6,
        ),
    );

    for updates in [false, true] {
        sustained_ingest(
            &schema,
            &dir.path().join("ingest"),
            args.rows / 2,
            updates,
            &mut rng,
            &results,
        );
    }

    // The same rows in key order, as one Parquet file (LZ4, dictionary, as the crate defaults).
    let parquet_path = dir.path().join("same.parquet");
    {
        let props = WriterProperties::builder()
            .set_compression(Compression::LZ4_RAW)
            .build();
        let file = File::create(&parquet_path).expect("create");
        let mut writer =
            ArrowWriter::try_new(file, schema.arrow_schema(), Some(props)).expect("writer");
        let sorted: Vec<i64> = (0..args.rows as i64).collect();
        for chunk in sorted.chunks(64 * 1024) {
            writer.write(&rows(&schema, chunk)).expect("write");
        }
        writer.close().expect("close");
    }
    let tablet_bytes = tablet.disk_bytes();
    let history_bytes = delta_file_bytes(&dir.path().join("tablet"));
    let parquet_bytes = std::fs::metadata(&parquet_path).expect("stat").len();
    results.say(
        "bytes on disk per row",
        format!(
            "tablet {:.2} (base data with the encoded key column {:.2}, UNDO history {:.2}), \
             parquet {:.2}; base/parquet {:.2}x",
            tablet_bytes as f64 / args.rows as f64,
            (tablet_bytes - history_bytes) as f64 / args.rows as f64,
            history_bytes as f64 / args.rows as f64,
            parquet_bytes as f64 / args.rows as f64,
            (tablet_bytes - history_bytes) as f64 / parquet_bytes as f64
        ),
    );
    results.say(
        "memory held for key lookups",
        format!(
            "{:.1} bytes per row ({} rowsets)",
            tablet.key_index_bytes() as f64 / args.rows as f64,
            tablet.rowset_count()
        ),
    );
    let now = Timestamp(u64::MAX - 1);
    let report = |what: &str, tablet_column: usize, parquet_column: usize, snapshot| {
        let _ = scan_tablet(&tablet, tablet_column, snapshot);
        let _ = scan_parquet(&parquet_path, parquet_column);
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        let (mut a, mut b) = (0, 0);
        for _ in 0..args.runs {
            let (sum, t) = scan_tablet(&tablet, tablet_column, snapshot);
            ours.push(t);
            a = sum;
            let (sum, t) = scan_parquet(&parquet_path, parquet_column);
            theirs.push(t);
            b = sum;
        }
        let (ours, theirs) = (median(ours), median(theirs));
        results.scans.borrow_mut().push(vec![
            format!(
                "{what}{}",
                if a == b {
                    ""
                } else {
                    " (results differ: updated rows)"
                }
            )
            .into(),
            ours.as_secs_f64().into(),
            (args.rows as f64 / ours.as_secs_f64() / 1e6).into(),
            theirs.as_secs_f64().into(),
            (ours.as_secs_f64() / theirs.as_secs_f64()).into(),
        ]);
        println!(
            "{what}: tablet {:.3} s ({:.0} M rows/s), parquet {:.3} s, tablet/parquet {:.2}x{}",
            ours.as_secs_f64(),
            args.rows as f64 / ours.as_secs_f64() / 1e6,
            theirs.as_secs_f64(),
            ours.as_secs_f64() / theirs.as_secs_f64(),
            if a == b {
                ""
            } else {
                " (results differ: updated rows)"
            }
        );
        ours
    };
    let fresh = report("full scan of INT64 v", 1, 1, now);
    report("full scan of STRING s", 2, 2, now);

    // A key range of 1 % of the rows: each rowset reads only the ordinals of the range.
    let width = (args.rows / 100) as i64;
    let range = |start: i64| ScanSpec {
        projection: Some(vec![1]),
        predicates: vec![
            ColumnPredicate {
                column: 0,
                op: PredicateOp::GtEq(Scalar(Arc::new(Int64Array::from(vec![start])))),
            },
            ColumnPredicate {
                column: 0,
                op: PredicateOp::Lt(Scalar(Arc::new(Int64Array::from(vec![start + width])))),
            },
        ],
        snapshot: now,
        limit: None,
        batch_size: 64 * 1024,
        string_views: false,
        changes_since: None,
    };
    let mut times = Vec::new();
    for run in 0..args.runs.max(1) {
        let start = Instant::now();
        let rows: usize = tablet
            .scan(&range(run as i64 * width * 7))
            .expect("scan")
            .map(|b| b.expect("batch").num_rows())
            .sum();
        assert_eq!(rows as i64, width);
        times.push(start.elapsed());
    }
    let range_time = median(times);
    results.say(
        "scan of v for a key range of 1 % of the rows",
        format!(
            "{:.4} s, {:.1}x faster than the full scan",
            range_time.as_secs_f64(),
            fresh.as_secs_f64() / range_time.as_secs_f64()
        ),
    );

    // Point lookups through the scan path (an equality predicate on the key).
    let lookups = |rng: &mut rand::rngs::StdRng| {
        let start = Instant::now();
        for _ in 0..args.lookups {
            let k = rng.random_range(0..args.rows as i64);
            let spec = ScanSpec {
                projection: Some(vec![0, 1, 2]),
                predicates: vec![ColumnPredicate {
                    column: 0,
                    op: PredicateOp::Eq(Scalar(Arc::new(Int64Array::from(vec![k])))),
                }],
                snapshot: now,
                limit: None,
                batch_size: 1024,
                string_views: false,
                changes_since: None,
            };
            let found: usize = tablet
                .scan(&spec)
                .expect("scan")
                .map(|b| b.expect("batch").num_rows())
                .sum();
            assert_eq!(found, 1, "key {k}");
        }
        let lookup_time = start.elapsed();
        results.say(
            &format!(
                "point lookups by primary key (warm, {} rowsets, key pages cached {:.1} MB)",
                tablet.rowset_count(),
                options.page_cache.bytes() as f64 / 1e6,
            ),
            format!(
                "{:.0} per second, {:.0} µs each",
                args.lookups as f64 / lookup_time.as_secs_f64(),
                lookup_time.as_secs_f64() * 1e6 / args.lookups as f64
            ),
        );
    };
    lookups(&mut rng);

    // Rowset compaction: every flush of shuffled keys covers the whole key range, so every
    // rowset overlaps every other; merging them leaves rowsets with disjoint key ranges.
    let start = Instant::now();
    let rowsets_before = tablet.rowset_count();
    let merges = run_maintenance(&tablet, |k| {
        matches!(k, MaintenanceKind::MergeRowsets { .. })
    });
    results.say(
        "rowset compaction",
        format!(
            "{merges} merges in {:.2} s, {rowsets_before} -> {} rowsets",
            start.elapsed().as_secs_f64(),
            tablet.rowset_count()
        ),
    );
    lookups(&mut rng);
    report("full scan of INT64 v after rowset compaction", 1, 1, now);

    // Update 10 % of the rows, then scan with the deltas in memory and after they are merged.
    let mut updated: Vec<i64> = (0..args.rows as i64).filter(|k| k % 10 == 3).collect();
    updated.shuffle(&mut rng);
    let start = Instant::now();
    for chunk in updated.chunks(BATCH) {
        let batch = WriteBatch::new(
            WriteKind::Update,
            RecordBatch::try_new(
                Arc::new(schema.arrow_schema().project(&[0, 1]).expect("projection")),
                vec![
                    Arc::new(Int64Array::from(chunk.to_vec())) as ArrayRef,
                    Arc::new(Int64Array::from(vec![-1i64; chunk.len()])),
                ],
            )
            .expect("batch"),
        );
        let (index, ts) = clock.next();
        tablet.apply(index, ts, &batch).expect("update");
    }
    results.say(
        &format!("update of 10 % of the rows (scattered, {BATCH} per batch)"),
        format!(
            "{:.0} rows/s",
            updated.len() as f64 / start.elapsed().as_secs_f64()
        ),
    );
    let with_deltas = report(
        "after updating 10 %, deltas in memory: scan of v",
        1,
        1,
        now,
    );
    report(
        "after updating 10 % of v, deltas in memory: scan of s",
        2,
        2,
        now,
    );
    let start = Instant::now();
    tablet.flush().expect("flush");
    results.say(
        "flush of the updates as REDO files",
        format!("{:.2} s", start.elapsed().as_secs_f64()),
    );
    let in_files = report("after updating 10 %, REDO files: scan of v", 1, 1, now);
    // Major delta compaction of the same files twice: on a copy of the tablet rewriting whole
    // rowsets (column files disabled), and on the tablet rewriting only the updated column.
    let tablet_dir = dir.path().join("tablet");
    let copy_dir = dir.path().join("copy");
    std::fs::create_dir(&copy_dir).expect("copy dir");
    for entry in std::fs::read_dir(&tablet_dir).expect("tablet dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), copy_dir.join(entry.file_name())).expect("copy");
    }
    let whole_options = TabletOptions {
        max_column_files: 0,
        ..options.clone()
    };
    let whole = Tablet::open(&copy_dir, whole_options).expect("copy");
    let (applied, whole_time, whole_bytes) = apply_redo(&whole, &copy_dir);
    let whole_scan = median(
        (0..args.runs)
            .map(|_| scan_tablet(&whole, 1, now).1)
            .collect(),
    );
    drop(whole);
    std::fs::remove_dir_all(&copy_dir).expect("remove copy");
    let (_, columns_time, columns_bytes) = apply_redo(&tablet, &tablet_dir);
    results.say(
        &format!("major delta compaction of {applied} rowsets"),
        format!(
            "rewriting only the updated column {:.2} s, {:.1} MB written; rewriting whole \
             rowsets {:.2} s, {:.1} MB written; {:.1}x faster",
            columns_time.as_secs_f64(),
            columns_bytes as f64 / 1e6,
            whole_time.as_secs_f64(),
            whole_bytes as f64 / 1e6,
            whole_time.as_secs_f64() / columns_time.as_secs_f64()
        ),
    );
    let compacted = report("after major delta compaction: scan of v", 1, 1, now);
    report("after major delta compaction: scan of s", 2, 2, now);
    results.say(
        "scan of v vs fresh",
        format!(
            "deltas in memory {:.2}x, in REDO files {:.2}x, compacted {:.2}x (whole rowsets \
             rewritten: {:.2}x)",
            with_deltas.as_secs_f64() / fresh.as_secs_f64(),
            in_files.as_secs_f64() / fresh.as_secs_f64(),
            compacted.as_secs_f64() / fresh.as_secs_f64(),
            whole_scan.as_secs_f64() / fresh.as_secs_f64()
        ),
    );
    lookups(&mut rng);
    if let Some(path) = &args.json {
        results.write(&args, path);
    }
}

/// Inserts `rows` shuffled rows into a new tablet in batches (with `updates`, each followed by
/// a batch of updates of random rows inserted before) while a background thread does what a
/// tablet server's maintenance thread does (flush when the MemRowSet is full, then the best
/// compaction), and prints the latency of the writes.
fn sustained_ingest(
    schema: &Schema,
    dir: &std::path::Path,
    rows_n: usize,
    updates: bool,
    rng: &mut rand::rngs::StdRng,
    results: &Results,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let tablet =
        Arc::new(Tablet::create(dir, schema.clone(), TabletOptions::default()).expect("tablet"));
    let mut keys: Vec<i64> = (0..rows_n as i64).collect();
    keys.shuffle(rng);
    let done = Arc::new(AtomicBool::new(false));
    let background = {
        let (tablet, done) = (tablet.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut flushes, mut compactions) = (0, 0);
            while !done.load(Ordering::Relaxed) {
                if tablet.needs_flush() {
                    tablet.flush().expect("flush");
                    flushes += 1;
                } else if let Some(op) = tablet
                    .maintenance_ops()
                    .into_iter()
                    .find(|op| op.score >= 1.0)
                {
                    tablet.compact(&op.kind).expect("compaction");
                    compactions += 1;
                } else {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            (flushes, compactions)
        })
    };
    let mut clock = Clock::from_now();
    let mut latencies = Vec::with_capacity(rows_n / BATCH + 1);
    let start = Instant::now();
    let update_schema = Arc::new(schema.arrow_schema().project(&[0, 1]).expect("projection"));
    for (i, chunk) in keys.chunks(BATCH).enumerate() {
        let mut batches = vec![WriteBatch::new(WriteKind::Insert, rows(schema, chunk))];
        // And as many updates of v, of random rows inserted before.
        if updates && i > 0 {
            let inserted = &keys[..i * BATCH];
            let mut targets: Vec<i64> = (0..BATCH)
                .map(|_| inserted[rng.random_range(0..inserted.len())])
                .collect();
            targets.sort_unstable();
            targets.dedup();
            let values = Int64Array::from(vec![-1i64; targets.len()]);
            let columns: Vec<ArrayRef> =
                vec![Arc::new(Int64Array::from(targets)), Arc::new(values)];
            batches.push(WriteBatch::new(
                WriteKind::Update,
                RecordBatch::try_new(update_schema.clone(), columns).expect("batch"),
            ));
        }
        for batch in batches {
            let (index, ts) = clock.next();
            let t = Instant::now();
            tablet.apply(index, ts, &batch).expect("write");
            latencies.push(t.elapsed());
        }
    }
    let elapsed = start.elapsed();
    done.store(true, Ordering::Relaxed);
    let (flushes, compactions) = background.join().expect("maintenance thread");
    let stalls = latencies
        .iter()
        .filter(|l| **l > Duration::from_millis(100))
        .count();
    let p50 = percentile(&mut latencies, 0.5);
    let p99 = percentile(&mut latencies, 0.99);
    let max = latencies.iter().max().copied().unwrap_or_default();
    results.say(
        &format!(
            "sustained ingest with background flushes and compactions{}",
            if updates { ", as many updates" } else { "" }
        ),
        format!(
            "{rows_n} rows inserted in {:.2} s = {:.0} inserted rows/s, {flushes} flushes and \
             {compactions} compactions meanwhile; per {BATCH}-row batch p50 {:.0} µs, p99 {:.0} \
             µs (p99/p50 {:.1}), max {:.1} ms, {stalls} stalls over 100 ms",
            elapsed.as_secs_f64(),
            rows_n as f64 / elapsed.as_secs_f64(),
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6,
            p99.as_secs_f64() / p50.as_secs_f64(),
            max.as_secs_f64() * 1e3,
        ),
    );
    drop(tablet);
    std::fs::remove_dir_all(dir).expect("remove");
}

/// Runs the major delta compactions the tablet in `dir` proposes; returns how many ran, how
/// long they took and how many bytes of new files they wrote.
fn apply_redo(tablet: &Tablet, dir: &std::path::Path) -> (usize, Duration, u64) {
    let files = |dir| -> Vec<(std::ffi::OsString, u64)> {
        std::fs::read_dir(dir)
            .expect("tablet dir")
            .map(|e| e.expect("entry"))
            .map(|e| (e.file_name(), e.metadata().expect("stat").len()))
            .collect()
    };
    let before: std::collections::HashSet<_> = files(dir).into_iter().map(|f| f.0).collect();
    let start = Instant::now();
    let applied = run_maintenance(tablet, |k| matches!(k, MaintenanceKind::ApplyRedo { .. }));
    let time = start.elapsed();
    let written = files(dir)
        .into_iter()
        .filter(|f| !before.contains(&f.0) && f.0 != "metadata")
        .map(|f| f.1)
        .sum();
    (applied, time, written)
}

/// Runs the tablet's proposed operations of the kinds `wanted` while any is worth it; returns
/// how many ran.
fn run_maintenance(tablet: &Tablet, wanted: impl Fn(&MaintenanceKind) -> bool) -> usize {
    let mut ran = 0;
    while let Some(op) = tablet
        .maintenance_ops()
        .into_iter()
        .find(|op| op.score >= 1.0 && wanted(&op.kind))
    {
        tablet.compact(&op.kind).expect("compaction");
        ran += 1;
    }
    ran
}

/// Bytes of the UNDO and REDO files in a tablet directory.
fn delta_file_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("tablet dir")
        .map(|e| e.expect("entry"))
        .filter(|e| e.file_name().to_string_lossy().starts_with("delta-"))
        .map(|e| e.metadata().expect("stat").len())
        .sum()
}
