//! Randomised model-based test of a tablet: random INSERT/UPSERT/UPDATE/DELETE batches (some of
//! which must be rejected), scans with predicates, snapshot scans, flushes and reopen, all checked
//! against a BTreeMap. `NYALA_MODEL_ITERS` sets the number of steps (default 400),
//! `NYALA_MODEL_SEED` the random seed (default 42). Module `fuzz`: damaged tablet files opened.

mod fuzz;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::Int64Type;
use nyala_storage::{
    ColumnPredicate, ColumnSchema, ColumnType, FailPoint, JoinFilter, MaintenanceKind, PredicateOp,
    Scalar, ScanSpec, Schema, StorageError, Tablet, TabletOptions, Timestamp, WriteBatch,
    WriteKind,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Model = BTreeMap<i64, (Option<String>, i64)>;

fn schema() -> Schema {
    let col = |name: &str, column_type, nullable| ColumnSchema::new(name, column_type, nullable);
    Schema::new(
        vec![
            col("s", ColumnType::String, true),
            col("k", ColumnType::Int64, false),
            col("v", ColumnType::Int64, false),
        ],
        vec![1],
    )
    .unwrap()
}

fn rows(schema: &Schema, entries: &[(i64, Option<String>, i64)]) -> RecordBatch {
    RecordBatch::try_new(
        schema.arrow_schema(),
        vec![
            Arc::new(StringArray::from(
                entries.iter().map(|e| e.1.clone()).collect::<Vec<_>>(),
            )) as ArrayRef,
            Arc::new(Int64Array::from(
                entries.iter().map(|e| e.0).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                entries.iter().map(|e| e.2).collect::<Vec<_>>(),
            )),
        ],
    )
    .unwrap()
}

fn scan(tablet: &Tablet, snapshot: Timestamp, min_v: Option<i64>) -> Model {
    let predicates = min_v
        .map(|m| {
            vec![ColumnPredicate {
                column: 2,
                op: PredicateOp::GtEq(Scalar(Arc::new(Int64Array::from(vec![m])))),
            }]
        })
        .unwrap_or_default();
    scan_with(tablet, snapshot, predicates)
}

/// A scan that pins the key to `keys` (`=` for one key, else IN), which the tablet answers by
/// looking the keys up.
fn lookup(tablet: &Tablet, snapshot: Timestamp, keys: &[i64]) -> Model {
    let scalar = |k: i64| Scalar(Arc::new(Int64Array::from(vec![k])));
    let op = match keys {
        [k] => PredicateOp::Eq(scalar(*k)),
        many => PredicateOp::InList(many.iter().map(|&k| scalar(k)).collect()),
    };
    scan_with(tablet, snapshot, vec![ColumnPredicate { column: 1, op }])
}

/// The keys a lookup of `keys` that reads only the key column finds, sorted.
fn lookup_keys(tablet: &Tablet, snapshot: Timestamp, keys: &[i64]) -> Vec<i64> {
    let scalar = |k: i64| Scalar(Arc::new(Int64Array::from(vec![k])));
    let op = match keys {
        [k] => PredicateOp::Eq(scalar(*k)),
        many => PredicateOp::InList(many.iter().map(|&k| scalar(k)).collect()),
    };
    let spec = ScanSpec {
        projection: Some(vec![1]),
        predicates: vec![ColumnPredicate { column: 1, op }],
        snapshot,
        limit: None,
        batch_size: 7,
        string_views: false,
        changes_since: None,
    };
    let mut found: Vec<i64> = (tablet.scan(&spec).unwrap())
        .flat_map(|b| {
            let b = b.unwrap();
            b.column(0).as_primitive::<Int64Type>().values().to_vec()
        })
        .collect();
    found.sort();
    found
}

/// A scan with a join filter (bounds and bloom filter) of `keys` on the key column.
fn join_filtered(tablet: &Tablet, snapshot: Timestamp, keys: &[i64]) -> Model {
    let scalar = |k: i64| Scalar(Arc::new(Int64Array::from(vec![k])));
    let bounds =
        (keys.iter().min().copied().map(scalar)).zip(keys.iter().max().copied().map(scalar));
    let mut filter = JoinFilter::new(arrow::datatypes::DataType::Int64, bounds, false);
    let keys: ArrayRef = Arc::new(Int64Array::from(keys.to_vec()));
    filter.add_bloom(&[keys], 1 << 10).unwrap();
    let op = PredicateOp::join_filter(Arc::new(filter));
    scan_with(tablet, snapshot, vec![ColumnPredicate { column: 1, op }])
}

fn scan_with(tablet: &Tablet, snapshot: Timestamp, predicates: Vec<ColumnPredicate>) -> Model {
    scan_columns(tablet, snapshot, predicates, vec![1, 0, 2])
}

/// The rows without column v (0 in its place): a scan that reads no column updates change.
fn scan_without_v(tablet: &Tablet, snapshot: Timestamp) -> Model {
    scan_columns(tablet, snapshot, vec![], vec![1, 0])
}

fn without_v(model: &Model) -> Model {
    model
        .iter()
        .map(|(k, (s, _))| (*k, (s.clone(), 0)))
        .collect()
}

/// A scan of k, s and v (or of the first `projection.len()` of them); the same rows whether
/// strings are read as `Utf8` or as `Utf8View`.
fn scan_columns(
    tablet: &Tablet,
    snapshot: Timestamp,
    predicates: Vec<ColumnPredicate>,
    projection: Vec<usize>,
) -> Model {
    let spec = ScanSpec {
        projection: Some(projection),
        predicates,
        snapshot,
        limit: None,
        batch_size: 7,
        string_views: false,
        changes_since: None,
    };
    let rows = scan_spec(tablet, &spec);
    let views = ScanSpec {
        string_views: true,
        ..spec
    };
    assert_eq!(scan_spec(tablet, &views), rows, "string views differ");
    rows
}

fn scan_spec(tablet: &Tablet, spec: &ScanSpec) -> Model {
    let with_v = spec.projection.as_ref().is_some_and(|p| p.len() == 3);
    let mut out = Model::new();
    for batch in tablet.scan(spec).unwrap() {
        let batch = batch.unwrap();
        let k = batch.column(0).as_primitive::<Int64Type>();
        let s: Vec<Option<String>> = match spec.string_views {
            true => (batch.column(1).as_string_view().iter())
                .map(|s| s.map(str::to_string))
                .collect(),
            false => (batch.column(1).as_string::<i32>().iter())
                .map(|s| s.map(str::to_string))
                .collect(),
        };
        for (i, s) in s.into_iter().enumerate() {
            let v = match with_v {
                true => batch.column(2).as_primitive::<Int64Type>().value(i),
                false => 0,
            };
            assert!(
                out.insert(k.value(i), (s, v)).is_none(),
                "key {} returned twice",
                k.value(i)
            );
        }
    }
    out
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn random_operations_match_a_model() {
    run_model(
        env_or("NYALA_MODEL_ITERS", 400) as usize,
        env_or("NYALA_MODEL_SEED", 42),
    );
}

/// The long run: 5 000 steps for each of 8 seeds (a few minutes).
/// `cargo test -p nyala-storage --test model -- --ignored`
#[test]
#[ignore]
fn long_random_runs_match_a_model() {
    for seed in 1..=8 {
        run_model(5_000, seed);
    }
}

fn run_model(iterations: usize, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let schema = schema();
    let options = TabletOptions {
        flush_threshold_bytes: 1 << 20,
        rowset_target_bytes: 4 << 10,
        ..TabletOptions::default()
    };
    let mut tablet = Tablet::create(dir.path(), schema.clone(), options.clone()).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = Model::new();
    let mut index = 0u64;
    // Hybrid times from now on: well within the history retention.
    let mut ts = now().0;
    // (snapshot, the log index of its write, the rows then)
    let mut snapshots: Vec<(Timestamp, u64, Model)> = Vec::new();
    // Every change of each key: (ts, log index), for diff scans.
    let mut changes: Vec<(i64, u64, u64)> = Vec::new();
    let mut compactions = 0;
    // The most column files (major delta compactions of some columns) seen at once.
    let mut column_files = 0;
    for _ in 0..iterations {
        index += 1;
        ts += 1;
        let n = rng.random_range(1..6);
        let mut keys: Vec<i64> = (0..n).map(|_| rng.random_range(-40..40)).collect();
        let entries: Vec<(i64, Option<String>, i64)> = keys
            .iter()
            .map(|&k| {
                (
                    k,
                    rng.random_bool(0.8)
                        .then(|| format!("s{}", rng.random_range(0..5))),
                    rng.random_range(-100..100),
                )
            })
            .collect();
        let mut distinct = keys.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let unique = distinct.len() == keys.len();
        let op = rng.random_range(0..10);
        let mut ignored_count = None;
        let before = model.clone();
        let (kind, batch, expect_ok) = match op {
            0 | 1 => {
                let ok = unique && keys.iter().all(|k| !model.contains_key(k));
                if ok {
                    for e in &entries {
                        model.insert(e.0, (e.1.clone(), e.2));
                    }
                }
                (WriteKind::Insert, rows(&schema, &entries), ok)
            }
            2 => {
                for e in &entries {
                    model.insert(e.0, (e.1.clone(), e.2));
                }
                (WriteKind::Upsert, rows(&schema, &entries), true)
            }
            3 | 4 => {
                let ok = unique && keys.iter().all(|k| model.contains_key(k));
                if ok {
                    for e in &entries {
                        model.get_mut(&e.0).unwrap().1 = e.2;
                    }
                }
                let full = rows(&schema, &entries);
                let update = full.project(&[1, 2]).unwrap();
                (WriteKind::Update, update, ok)
            }
            5 => {
                let ok = unique && keys.iter().all(|k| model.contains_key(k));
                if ok {
                    for k in &keys {
                        model.remove(k);
                    }
                }
                (
                    WriteKind::Delete,
                    rows(&schema, &entries).project(&[1]).unwrap(),
                    ok,
                )
            }
            7 => {
                // The first row of each new key goes in; existing and repeated keys are skipped.
                let mut inserted = 0;
                for e in &entries {
                    if let std::collections::btree_map::Entry::Vacant(slot) = model.entry(e.0) {
                        slot.insert((e.1.clone(), e.2));
                        inserted += 1;
                    }
                }
                ignored_count = Some(inserted);
                (WriteKind::InsertIgnore, rows(&schema, &entries), true)
            }
            6 => {
                tablet.flush().unwrap();
                continue;
            }
            8 => {
                // One of the compactions the tablet proposes; history must survive it.
                let ops = tablet.maintenance_ops();
                if !ops.is_empty() {
                    let op = &ops[rng.random_range(0..ops.len())];
                    tablet.compact(&op.kind).unwrap();
                    compactions += 1;
                    column_files = column_files.max(tablet.column_file_count());
                }
                keys.clear(); // nothing written
                (WriteKind::Upsert, rows(&schema, &[]), true)
            }
            _ => {
                drop(tablet);
                tablet = Tablet::open(dir.path(), options.clone()).unwrap();
                // Not flushed: the WAL would replay these; here the model forgets them too,
                // and snapshots after the last flush are no longer what the tablet holds.
                model = scan(&tablet, Timestamp(u64::MAX), None);
                let durable = tablet.durable_index();
                snapshots.retain(|(_, i, _)| *i <= durable);
                changes.retain(|(_, _, i)| *i <= durable);
                continue;
            }
        };
        let result = tablet.apply(index, Timestamp(ts), &WriteBatch::new(kind, batch));
        assert_eq!(result.is_ok(), expect_ok, "{kind:?} {keys:?}: {result:?}");
        if let (Some(expected), Ok(count)) = (ignored_count, &result) {
            assert_eq!(*count, expected, "rows INSERT IGNORE reports for {keys:?}");
        }
        if !expect_ok {
            assert_eq!(model, before);
        }
        if result.is_ok() {
            // Keys an INSERT IGNORE skipped did not change; every other key written did.
            let changed = keys
                .iter()
                .filter(|k| kind != WriteKind::InsertIgnore || !before.contains_key(k));
            changes.extend(changed.map(|&k| (k, ts, index)));
        }
        assert_eq!(scan(&tablet, Timestamp(u64::MAX), None), model);
        assert_eq!(
            scan_without_v(&tablet, Timestamp(u64::MAX)),
            without_v(&model)
        );
        let min_v = rng.random_range(-100..100);
        let filtered: Model = model
            .iter()
            .filter(|(_, (_, v))| *v >= min_v)
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        assert_eq!(scan(&tablet, Timestamp(u64::MAX), Some(min_v)), filtered);
        // A key range, which rowsets turn into a range of row ordinals.
        let (low, high) = (rng.random_range(-45..45), rng.random_range(-45..45));
        let scalar = |k: i64| Scalar(Arc::new(Int64Array::from(vec![k])));
        let (low_op, high_op) = match rng.random_range(0..3) {
            0 => (
                PredicateOp::GtEq(scalar(low)),
                PredicateOp::Lt(scalar(high)),
            ),
            1 => (
                PredicateOp::Gt(scalar(low)),
                PredicateOp::LtEq(scalar(high)),
            ),
            _ => (
                PredicateOp::Eq(scalar(low)),
                PredicateOp::LtEq(scalar(high)),
            ),
        };
        let in_range = |k: i64| match (&low_op, &high_op) {
            (PredicateOp::GtEq(_), _) => k >= low && k < high,
            (PredicateOp::Gt(_), _) => k > low && k <= high,
            _ => k == low && k <= high,
        };
        let expected: Model = model
            .iter()
            .filter(|(k, _)| in_range(**k))
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let predicates = vec![
            ColumnPredicate {
                column: 1,
                op: low_op.clone(),
            },
            ColumnPredicate {
                column: 1,
                op: high_op.clone(),
            },
        ];
        assert_eq!(
            scan_with(&tablet, Timestamp(u64::MAX), predicates),
            expected,
            "keys {low_op:?} and {high_op:?}"
        );
        snapshots.push((Timestamp(ts), index, model.clone()));
        if let Some((old_ts, _, old_model)) = snapshots.get(rng.random_range(0..snapshots.len())) {
            assert_eq!(
                &scan(&tablet, *old_ts, None),
                old_model,
                "snapshot at {old_ts:?}"
            );
            assert_eq!(
                scan_without_v(&tablet, *old_ts),
                without_v(old_model),
                "k and s at {old_ts:?}"
            );
            // Key lookups, at the same snapshot, of keys present and absent.
            let wanted: Vec<i64> = (0..rng.random_range(1..4))
                .map(|_| rng.random_range(-45..45))
                .collect();
            let expected: Model = old_model
                .iter()
                .filter(|(k, _)| wanted.contains(k))
                .map(|(k, v)| (*k, v.clone()))
                .collect();
            assert_eq!(
                lookup(&tablet, *old_ts, &wanted),
                expected,
                "lookup of {wanted:?} at {old_ts:?}"
            );
            // Reading the key alone (as UPDATE and DELETE do) finds the same rows.
            assert_eq!(
                lookup_keys(&tablet, *old_ts, &wanted),
                expected.keys().copied().collect::<Vec<_>>(),
                "key-only lookup of {wanted:?} at {old_ts:?}"
            );
            // A join's keys as a runtime filter: few enough of them are looked up in the
            // MemRowSet and the rowsets' key indexes instead of every row being read.
            assert_eq!(
                join_filtered(&tablet, *old_ts, &wanted),
                expected,
                "join filter of {wanted:?} at {old_ts:?}"
            );
            // The changes from that snapshot to another one after it (or to now).
            let later = snapshots.iter().filter(|s| s.0 >= *old_ts);
            let later: Vec<_> = later.collect();
            let (to_ts, _, to_model) = later[rng.random_range(0..later.len())];
            assert_eq!(
                diff(&tablet, *old_ts, *to_ts),
                expected_diff(&changes, (*old_ts, old_model), (*to_ts, to_model)),
                "changes after {old_ts:?} up to {to_ts:?}"
            );
        }
    }
    assert!(iterations < 100 || compactions > 0, "no compaction ran");
    eprintln!("seed {seed}: {compactions} compactions, at most {column_files} column files");
}

/// One row of a diff scan: key, change, commit time (micros), s, v.
type DiffRow = (i64, String, i64, Option<String>, Option<i64>);

/// What a diff scan of `(since, to]` returns, sorted by key.
fn diff(tablet: &Tablet, since: Timestamp, to: Timestamp) -> Vec<DiffRow> {
    let spec = ScanSpec {
        projection: None,
        predicates: vec![],
        snapshot: to,
        limit: None,
        batch_size: 5,
        string_views: false,
        changes_since: Some(since),
    };
    let mut out = Vec::new();
    for batch in tablet.scan(&spec).unwrap() {
        let batch = batch.unwrap();
        let s = batch.column(0).as_string::<i32>();
        let k = batch.column(1).as_primitive::<Int64Type>();
        let v = batch.column(2).as_primitive::<Int64Type>();
        let change = batch.column(3).as_string::<i32>();
        let time = (batch.column(4)).as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
        for i in 0..batch.num_rows() {
            out.push((
                k.value(i),
                change.value(i).to_string(),
                time.value(i),
                s.is_valid(i).then(|| s.value(i).to_string()),
                v.is_valid(i).then(|| v.value(i)),
            ));
        }
    }
    out.sort();
    out
}

/// What a diff scan of `(since, to]` must return, from the changes made and the rows at both
/// ends.
fn expected_diff(
    changes: &[(i64, u64, u64)],
    (since, before): (Timestamp, &Model),
    (to, after): (Timestamp, &Model),
) -> Vec<DiffRow> {
    let mut last: BTreeMap<i64, u64> = BTreeMap::new();
    for &(k, ts, _) in changes {
        if ts > since.0 && ts <= to.0 {
            let newest = last.entry(k).or_insert(ts);
            *newest = (*newest).max(ts);
        }
    }
    let row = |k: i64, change: &str, ts: u64, image: Option<&(Option<String>, i64)>| {
        let micros = Timestamp(ts).micros() as i64;
        match image {
            Some((s, v)) => (k, change.to_string(), micros, s.clone(), Some(*v)),
            None => (k, change.to_string(), micros, None, None),
        }
    };
    let mut out: Vec<DiffRow> = (last.into_iter())
        .map(|(k, ts)| match (before.get(&k), after.get(&k)) {
            (None, Some(now)) => row(k, "insert", ts, Some(now)),
            (Some(_), Some(now)) => row(k, "update", ts, Some(now)),
            (Some(then), None) => row(k, "delete", ts, Some(then)),
            (None, None) => row(k, "delete", ts, None),
        })
        .collect();
    out.sort();
    out
}

fn now() -> Timestamp {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    Timestamp::from_micros(micros)
}

#[test]
fn files_of_an_interrupted_flush_are_ignored_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let schema = schema();
    let tablet = Tablet::create(dir.path(), schema.clone(), TabletOptions::default()).unwrap();
    tablet
        .apply(
            1,
            Timestamp(1),
            &WriteBatch::new(WriteKind::Insert, rows(&schema, &[(1, None, 1)])),
        )
        .unwrap();
    tablet.flush().unwrap();
    drop(tablet);
    // A crash after writing a rowset file but before the metadata switch.
    std::fs::write(
        dir.path().join("rowset-0000000099.parquet"),
        b"half written",
    )
    .unwrap();
    let tablet = Tablet::open(dir.path(), TabletOptions::default()).unwrap();
    assert_eq!(scan(&tablet, Timestamp(u64::MAX), None).len(), 1);
    assert_eq!(tablet.durable_index(), 1);
    assert!(!dir.path().join("rowset-0000000099.parquet").exists());
}

/// Crash tests: a flush, a schema change or a compaction fails at the n-th time it reaches a
/// step (a rowset or delta file written, the new metadata staged, the metadata switched), the
/// tablet is dropped as a crash would leave it, and the reopened tablet must hold either the
/// state before the operation or the state after it, with no stray files, and keep working.
#[test]
fn a_crash_at_any_step_of_a_flush_compaction_or_schema_change_leaves_the_old_or_the_new_state() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let schema = schema();
    let entry = |k: i64| (k, Some(format!("s{}", k % 3)), k * 10);
    let durable: Model = (0..3000).map(|k| (k, (entry(k).1, entry(k).2))).collect();
    for step in [
        "rowset_written",
        "columns_written",
        "delta_written",
        "metadata_staged",
        "metadata_switched",
    ] {
        for nth in 1..=3 {
            for operation in ["flush", "alter", "compact", "apply_redo"] {
                let alter = operation == "alter";
                let dir = tempfile::tempdir().unwrap();
                let armed = Arc::new(AtomicBool::new(false));
                let hits = Arc::new(AtomicUsize::new(0));
                let (a, h) = (armed.clone(), hits.clone());
                let options = TabletOptions {
                    flush_threshold_bytes: 1 << 30,
                    rowset_target_bytes: 4 << 10,
                    fail_point: Some(FailPoint(Arc::new(move |s: &str| {
                        a.load(Ordering::SeqCst)
                            && s == step
                            && h.fetch_add(1, Ordering::SeqCst) + 1 == nth
                    }))),
                    ..TabletOptions::default()
                };
                let tablet = Tablet::create(dir.path(), schema.clone(), options).unwrap();
                let write = |index: u64, kind, entries: Vec<(i64, Option<String>, i64)>| {
                    let batch = rows(&schema, &entries);
                    let rows = match kind {
                        WriteKind::Update => batch.project(&[1, 2]).unwrap(),
                        WriteKind::Delete => batch.project(&[1]).unwrap(),
                        _ => batch,
                    };
                    tablet
                        .apply(index, Timestamp(index), &WriteBatch::new(kind, rows))
                        .unwrap();
                };
                write(1, WriteKind::Insert, (0..3000).map(entry).collect());
                tablet.flush().unwrap();
                // Deltas on flushed rows, and rows only in memory.
                write(2, WriteKind::Update, vec![(5, None, -5), (2500, None, -1)]);
                write(3, WriteKind::Delete, vec![entry(7)]);
                write(4, WriteKind::Insert, (5000..5100).map(entry).collect());
                let mut after = durable.clone();
                after.get_mut(&5).unwrap().1 = -5;
                after.get_mut(&2500).unwrap().1 = -1;
                after.remove(&7);
                after.extend((5000..5100).map(|k| (k, (entry(k).1, entry(k).2))));
                if operation == "compact" || operation == "apply_redo" {
                    tablet.flush().unwrap();
                }
                armed.store(true, Ordering::SeqCst);
                let result = if operation == "compact" {
                    let rowsets = tablet.rowset_ids();
                    tablet.compact(&MaintenanceKind::MergeRowsets { rowsets })
                } else if operation == "apply_redo" {
                    // Major delta compactions of the updated column, rowset by rowset.
                    tablet.rowset_ids().into_iter().try_for_each(|rowset| {
                        tablet.compact(&MaintenanceKind::ApplyRedo { rowset })
                    })
                } else if alter {
                    let mut added = schema
                        .with_column_added(ColumnSchema {
                            default: Some("7".into()),
                            ..ColumnSchema::new("extra", ColumnType::Int64, true)
                        })
                        .unwrap();
                    added = added.with_column_renamed("extra", "x").unwrap();
                    tablet.alter_schema(5, &added)
                } else {
                    tablet.flush()
                };
                let failed = hits.load(Ordering::SeqCst) >= nth;
                assert_eq!(result.is_err(), failed, "{step} #{nth} {operation}");
                // A failed operation leaves the tablet as it was, in memory too.
                let now = scan(&tablet, Timestamp(u64::MAX), None);
                assert_eq!(now, after, "{step} #{nth} {operation}: before reopening");
                drop(tablet);
                let tablet = Tablet::open(dir.path(), TabletOptions::default()).unwrap();
                let got = scan(&tablet, Timestamp(u64::MAX), None);
                let what = format!("{step} #{nth} {operation}");
                if !failed || step == "metadata_switched" {
                    assert_eq!(got, after, "{what}: the new state");
                } else if got != after {
                    assert_eq!(got, durable, "{what}: neither the old nor the new state");
                }
                if got == durable {
                    assert_eq!(tablet.schema().columns().len(), 3, "{what}");
                }
                if operation == "apply_redo" && !failed {
                    // The two rowsets with updated rows have their new column.
                    assert_eq!(tablet.column_file_count(), 2, "{what}");
                }
                // Only the metadata and the files it names are left.
                let files = std::fs::read_dir(dir.path()).unwrap().count();
                let named =
                    tablet.rowset_count() + tablet.column_file_count() + tablet.delta_file_count();
                assert_eq!(files, named + 1, "{what}: stray files");
                // The tablet keeps working: new rows, a flush (new rowset ids) and a reopen.
                if tablet.schema().columns().len() == 3 {
                    let rows = rows(&schema, &[entry(9000)]);
                    let batch = WriteBatch::new(WriteKind::Insert, rows);
                    tablet.apply(100, Timestamp(100), &batch).unwrap();
                }
                tablet.flush().unwrap();
                let expected = scan(&tablet, Timestamp(u64::MAX), None);
                drop(tablet);
                let tablet = Tablet::open(dir.path(), TabletOptions::default()).unwrap();
                assert_eq!(scan(&tablet, Timestamp(u64::MAX), None), expected, "{what}");
            }
        }
    }
}

/// History older than the retention is refused to scans and dropped by rewrites: rows deleted
/// before it disappear from the files, and UNDO records before it go.
#[test]
fn history_beyond_the_retention_is_refused_and_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let schema = schema();
    let options = TabletOptions {
        history_max_age: std::time::Duration::from_secs(3600),
        ..TabletOptions::default()
    };
    let tablet = Tablet::create(dir.path(), schema.clone(), options).unwrap();
    let hours_ago = |h: f64| Timestamp(now().0 - Timestamp::from_micros((h * 3.6e9) as u64).0);
    let write = |index, ts, kind, entries: Vec<(i64, Option<String>, i64)>| {
        let batch = rows(&schema, &entries);
        let rows = match kind {
            WriteKind::Delete => batch.project(&[1]).unwrap(),
            _ => batch,
        };
        tablet
            .apply(index, ts, &WriteBatch::new(kind, rows))
            .unwrap();
    };
    // Two hours ago: 100 rows, 10 of them deleted. Half an hour ago: 20 rows changed.
    write(
        1,
        hours_ago(2.0),
        WriteKind::Insert,
        (0..100).map(|k| (k, None, k)).collect(),
    );
    write(
        2,
        hours_ago(1.9),
        WriteKind::Delete,
        (0..10).map(|k| (k, None, k)).collect(),
    );
    write(
        3,
        hours_ago(0.5),
        WriteKind::Upsert,
        (10..30).map(|k| (k, None, -k)).collect(),
    );
    tablet.flush().unwrap();
    assert_eq!(
        tablet.estimated_rows(),
        90,
        "rows deleted before the retention are gone"
    );
    let then = scan(&tablet, hours_ago(0.75), None);
    assert_eq!(then.len(), 90);
    assert_eq!(then[&10], (None, 10), "the version before the upsert");
    assert_eq!(scan(&tablet, now(), None)[&10], (None, -10));
    let too_old = tablet.scan(&ScanSpec {
        projection: None,
        predicates: vec![],
        snapshot: hours_ago(1.5),
        limit: None,
        batch_size: 100,
        string_views: false,
        changes_since: None,
    });
    let message = too_old
        .err()
        .expect("a scan beyond the retention fails")
        .to_string();
    assert!(
        message.contains("older than the history retention"),
        "{message}"
    );
    // Updates now go to REDO files; compactions merge them into the base data and keep
    // the history within the retention.
    write(
        4,
        now(),
        WriteKind::Upsert,
        (30..40).map(|k| (k, None, 0)).collect(),
    );
    tablet.flush().unwrap();
    write(
        5,
        now(),
        WriteKind::Upsert,
        (40..50).map(|k| (k, None, 0)).collect(),
    );
    tablet.flush().unwrap();
    let before = tablet.delta_file_count();
    let ops = tablet.maintenance_ops();
    assert!(
        matches!(
            ops.first().map(|o| &o.kind),
            Some(MaintenanceKind::ApplyRedo { .. })
        ),
        "{ops:?}"
    );
    let expected_then = scan(&tablet, hours_ago(0.75), None);
    let expected_now = scan(&tablet, now(), None);
    tablet.compact(&ops[0].kind).unwrap();
    assert!(tablet.delta_file_count() < before);
    assert_eq!(scan(&tablet, hours_ago(0.75), None), expected_then);
    assert_eq!(scan(&tablet, now(), None), expected_now);
}

/// Flushes whose key ranges all overlap (a queue tablet's two queues, or scattered keys) are
/// merged only with rowsets of alike size, as the maintenance thread runs them: each flushed
/// row is rewritten about log2(flushes) times, not once per later flush, and a key is in about
/// as many rowsets.
#[test]
fn merges_of_overlapping_flushes_rewrite_each_row_a_few_times() {
    const FLUSHES: i64 = 32;
    const ROWS: i64 = 100;
    let schema = schema();
    let dir = tempfile::tempdir().unwrap();
    let tablet = Tablet::create(dir.path(), schema.clone(), TabletOptions::default()).unwrap();
    // How many flushes each rowset holds, and how many flushes merges rewrote in all.
    let mut holds: BTreeMap<u64, i64> = BTreeMap::new();
    let mut rewritten = 0;
    for f in 0..FLUSHES {
        let entries: Vec<_> = (0..ROWS).map(|i| (i * FLUSHES + f, None, f)).collect();
        let batch = WriteBatch::new(WriteKind::Insert, rows(&schema, &entries));
        tablet.apply(f as u64 + 1, now(), &batch).unwrap();
        tablet.flush().unwrap();
        let flushed: Vec<u64> = tablet
            .rowset_ids()
            .into_iter()
            .filter(|id| !holds.contains_key(id))
            .collect();
        assert_eq!(flushed.len(), 1);
        holds.insert(flushed[0], 1);
        while let Some(op) = tablet
            .maintenance_ops()
            .into_iter()
            .find(|op| op.score >= 1.0 && matches!(op.kind, MaintenanceKind::MergeRowsets { .. }))
        {
            let MaintenanceKind::MergeRowsets { rowsets } = &op.kind else {
                unreachable!()
            };
            let merged: i64 = rowsets.iter().map(|id| holds.remove(id).unwrap()).sum();
            rewritten += merged;
            tablet.compact(&op.kind).unwrap();
            let made: Vec<u64> = tablet
                .rowset_ids()
                .into_iter()
                .filter(|id| !holds.contains_key(id))
                .collect();
            assert_eq!(made.len(), 1, "{op:?}");
            holds.insert(made[0], merged);
        }
    }
    let log2 = FLUSHES.ilog2() as i64;
    assert!(
        rewritten <= FLUSHES * log2,
        "merges rewrote {rewritten} flushes of {FLUSHES}"
    );
    assert!(tablet.rowset_count() as i64 <= log2 + 1, "{holds:?}");
    let expected: Model = (0..ROWS * FLUSHES)
        .map(|k| (k, (None, k % FLUSHES)))
        .collect();
    assert_eq!(scan(&tablet, now(), None), expected);
}

/// A queue tablet's flushes (two queues, so every flush overlaps every other) are merged four
/// alike rowsets at a time: each row is rewritten about log4(flushes) times.
#[test]
fn a_queue_tablet_merges_four_alike_rowsets_at_a_time() {
    const FLUSHES: u64 = 32;
    let dir = tempfile::tempdir().unwrap();
    let tablet = Tablet::create(dir.path(), queue_schema(), TabletOptions::default()).unwrap();
    let mut holds: BTreeMap<u64, u64> = BTreeMap::new();
    let mut rewritten = 0;
    let mut merges = 0;
    for f in 0..FLUSHES {
        let bodies: Vec<String> = (0..100).map(|i| format!("f{f}r{i}")).collect();
        let mut batch = queue_rows(&bodies);
        let queues: Vec<&str> = (0..100).map(|i| ["q", "r"][i % 2]).collect();
        let mut columns = batch.rows.columns().to_vec();
        columns[0] = Arc::new(StringArray::from(queues));
        batch.rows = RecordBatch::try_new(batch.rows.schema(), columns).unwrap();
        tablet.apply(f + 1, now(), &batch).unwrap();
        tablet.flush().unwrap();
        let flushed: Vec<u64> = (tablet.rowset_ids().into_iter())
            .filter(|id| !holds.contains_key(id))
            .collect();
        holds.insert(flushed[0], 1);
        while let Some(op) = (tablet.maintenance_ops().into_iter())
            .find(|op| op.score >= 1.0 && matches!(op.kind, MaintenanceKind::MergeRowsets { .. }))
        {
            let MaintenanceKind::MergeRowsets { rowsets } = &op.kind else {
                unreachable!()
            };
            assert_eq!(rowsets.len(), 4, "{op:?}");
            let merged: u64 = rowsets.iter().map(|id| holds.remove(id).unwrap()).sum();
            rewritten += merged;
            merges += 1;
            tablet.compact(&op.kind).unwrap();
            let made: Vec<u64> = (tablet.rowset_ids().into_iter())
                .filter(|id| !holds.contains_key(id))
                .collect();
            holds.insert(made[0], merged);
        }
    }
    // Four merges of 4 flushes, then one of the 4 merged rowsets, twice: each row is rewritten
    // twice (log4 of 16).
    assert_eq!((merges, rewritten), (10, 64), "{holds:?}");
    assert_eq!(tablet.rowset_count(), 2, "{holds:?}");
    assert_eq!(queue_scan(&tablet, now()).len(), 100 * FLUSHES as usize);
}

/// A damaged rowset or delta file is reported when the tablet opens, naming the file, instead
/// of being read.
#[test]
fn damaged_files_are_reported_on_open() {
    let schema = schema();
    for prefix in ["rowset-", "delta-"] {
        let dir = tempfile::tempdir().unwrap();
        let tablet = Tablet::create(dir.path(), schema.clone(), TabletOptions::default()).unwrap();
        let entries: Vec<_> = (0..1000).map(|k| (k, Some(format!("s{k}")), k)).collect();
        let batch = WriteBatch::new(WriteKind::Insert, rows(&schema, &entries));
        tablet.apply(1, now(), &batch).unwrap();
        tablet.flush().unwrap();
        drop(tablet);
        let path = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
            .unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
        let error = Tablet::open(dir.path(), TabletOptions::default())
            .err()
            .expect("a damaged file is found")
            .to_string();
        assert!(
            error.contains("damaged") && error.contains(prefix),
            "{prefix}: {error}"
        );
    }
}

/// A major delta compaction of a rowset whose updates changed one column writes only that
/// column (a column file next to the untouched rowset file) and per-column UNDO records; scans,
/// predicates on the rewritten column and lookups at every snapshot are unchanged, across a
/// reopen, and a rowset compaction folds the column files back into rowset files.
#[test]
fn major_delta_compaction_rewrites_only_the_updated_columns() {
    let dir = tempfile::tempdir().unwrap();
    let schema = schema();
    let options = TabletOptions {
        flush_threshold_bytes: 1 << 30,
        ..TabletOptions::default()
    };
    let mut tablet = Tablet::create(dir.path(), schema.clone(), options.clone()).unwrap();
    let mut index = 0;
    let mut write = |tablet: &Tablet, kind, entries: Vec<(i64, Option<String>, i64)>| {
        let batch = rows(&schema, &entries);
        let rows = match kind {
            WriteKind::Update => batch.project(&[1, 2]).unwrap(),
            WriteKind::Delete => batch.project(&[1]).unwrap(),
            _ => batch,
        };
        index += 1;
        let ts = now();
        tablet
            .apply(index, ts, &WriteBatch::new(kind, rows))
            .unwrap();
        tablet.flush().unwrap();
        ts
    };
    let entry = |k: i64| (k, Some(format!("s{}", k % 7)), k);
    // Two rowsets with overlapping key ranges.
    write(
        &tablet,
        WriteKind::Insert,
        (0..4000).step_by(2).map(entry).collect(),
    );
    let t0 = write(
        &tablet,
        WriteKind::Insert,
        (1..4000).step_by(2).map(entry).collect(),
    );
    let m0 = scan(&tablet, t0, None);
    let t1 = write(
        &tablet,
        WriteKind::Update,
        (0..4000).step_by(5).map(|k| (k, None, -k)).collect(),
    );
    let t2 = write(&tablet, WriteKind::Delete, vec![entry(20), entry(21)]);
    let t3 = write(
        &tablet,
        WriteKind::Update,
        (40..4000).step_by(20).map(|k| (k, None, 7)).collect(),
    );
    let snapshots: Vec<(Timestamp, Model)> = [t0, t1, t2, t3]
        .iter()
        .map(|&t| (t, scan(&tablet, t, None)))
        .collect();
    assert_eq!(snapshots[0].1, m0);
    let files = |prefix: &str| -> Vec<(String, u64)> {
        let mut files: Vec<(String, u64)> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into(),
                    e.metadata().unwrap().len(),
                )
            })
            .collect();
        files.sort();
        files
    };
    let rowset_files = files("rowset-");
    let check = |tablet: &Tablet, snapshots: &[(Timestamp, Model)], what: &str| {
        for (t, expected) in snapshots {
            assert_eq!(&scan(tablet, *t, None), expected, "{what}: scan at {t:?}");
            let passing: Model = expected
                .iter()
                .filter(|(_, (_, v))| *v >= 5)
                .map(|(k, v)| (*k, v.clone()))
                .collect();
            assert_eq!(
                scan(tablet, *t, Some(5)),
                passing,
                "{what}: v >= 5 at {t:?}"
            );
            let keys = [0, 10, 11, 20, 21, 40, 3990];
            let found: Model = expected
                .iter()
                .filter(|(k, _)| keys.contains(k))
                .map(|(k, v)| (*k, v.clone()))
                .collect();
            assert_eq!(lookup(tablet, *t, &keys), found, "{what}: lookups at {t:?}");
        }
    };
    for op in tablet.maintenance_ops() {
        if matches!(op.kind, MaintenanceKind::ApplyRedo { .. }) {
            tablet.compact(&op.kind).unwrap();
        }
    }
    assert_eq!(tablet.column_file_count(), 2, "one column file per rowset");
    assert_eq!(
        files("rowset-"),
        rowset_files,
        "rowset files are not rewritten"
    );
    for (name, bytes) in files("columns-") {
        let rowset = rowset_files.iter().map(|f| f.1).min().unwrap();
        assert!(
            bytes * 2 < rowset,
            "{name} ({bytes} bytes) holds one column"
        );
    }
    check(&tablet, &snapshots, "after the major delta compaction");
    // Updates of the other column and another compaction: a second column file each.
    let update_s = rows(
        &schema,
        &(0..4000)
            .step_by(3)
            .filter(|k| ![20, 21].contains(k))
            .map(|k| (k, Some(format!("t{k}")), 0))
            .collect::<Vec<_>>(),
    );
    let t4 = now();
    let batch = WriteBatch::new(WriteKind::Update, update_s.project(&[0, 1]).unwrap());
    tablet.apply(100, t4, &batch).unwrap();
    tablet.flush().unwrap();
    let mut snapshots = snapshots;
    snapshots.push((t4, scan(&tablet, t4, None)));
    for op in tablet.maintenance_ops() {
        if matches!(op.kind, MaintenanceKind::ApplyRedo { .. }) {
            tablet.compact(&op.kind).unwrap();
        }
    }
    assert_eq!(
        tablet.column_file_count(),
        4,
        "a second column file per rowset"
    );
    assert_eq!(
        files("rowset-"),
        rowset_files,
        "rowset files are not rewritten"
    );
    check(&tablet, &snapshots, "after a second major delta compaction");
    drop(tablet);
    tablet = Tablet::open(dir.path(), options).unwrap();
    check(&tablet, &snapshots, "after reopening");
    let rowsets = tablet.rowset_ids();
    tablet
        .compact(&MaintenanceKind::MergeRowsets { rowsets })
        .unwrap();
    assert_eq!(tablet.column_file_count(), 0);
    check(&tablet, &snapshots, "after the rowset compaction");
}

/// Key lookups and key ranges over rowsets of many pages: the sparse index (first key of each
/// page, bloom filter) finds every present key, no absent one, and ranges whose bounds fall on
/// and between page boundaries return exactly their rows, while holding a few bytes per row.
#[test]
fn the_sparse_key_index_finds_keys_and_ranges_across_pages() {
    let dir = tempfile::tempdir().unwrap();
    let schema = schema();
    let tablet = Tablet::create(dir.path(), schema.clone(), TabletOptions::default()).unwrap();
    let entries: Vec<_> = (0..100_000).step_by(2).map(|k| (k, None, k)).collect();
    let batch = WriteBatch::new(WriteKind::Insert, rows(&schema, &entries));
    tablet.apply(1, now(), &batch).unwrap();
    tablet.flush().unwrap();
    let model: Model = entries.iter().map(|e| (e.0, (None, e.2))).collect();
    let per_row = tablet.key_index_bytes() as f64 / model.len() as f64;
    assert!(per_row < 4.0, "{per_row} bytes per row for key lookups");
    let at = Timestamp(u64::MAX);
    // Pages hold 4 096 rows: keys 8 190 and 8 192 end and start the first two.
    let mut probes = vec![
        -1, 0, 1, 2, 8190, 8191, 8192, 8193, 16384, 99998, 99999, 100000,
    ];
    let mut rng = StdRng::seed_from_u64(5);
    probes.extend((0..60).map(|_| rng.random_range(-10..100_010)));
    for k in &probes {
        let expected: Model = model
            .get_key_value(k)
            .map(|(k, v)| (*k, v.clone()))
            .into_iter()
            .collect();
        assert_eq!(lookup(&tablet, at, &[*k]), expected, "lookup of {k}");
    }
    assert_eq!(
        lookup(&tablet, at, &probes[..6]).len(),
        3,
        "a batch of lookups"
    );
    for _ in 0..30 {
        let (a, b) = (
            probes[rng.random_range(0..probes.len())],
            probes[rng.random_range(0..probes.len())],
        );
        let scalar = |k: i64| Scalar(Arc::new(Int64Array::from(vec![k])));
        let predicates = vec![
            ColumnPredicate {
                column: 1,
                op: PredicateOp::GtEq(scalar(a)),
            },
            ColumnPredicate {
                column: 1,
                op: PredicateOp::Lt(scalar(b)),
            },
        ];
        let expected: Model = model
            .range(a..b.max(a))
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        assert_eq!(scan_with(&tablet, at, predicates), expected, "[{a}, {b})");
    }
}

/// A rowset's predicates run after decoding while most rows pass them and as a row filter
/// while few do, switching between row groups (64 K rows) as the share that passes changes;
/// either way a scan returns the same rows, also with rows hidden by later deletes and
/// updates, and with a string predicate (decoded as dictionaries).
#[test]
fn predicates_switch_between_row_groups_as_their_selectivity_changes() {
    let dir = tempfile::tempdir().unwrap();
    let schema = schema();
    let tablet = Tablet::create(dir.path(), schema.clone(), TabletOptions::default()).unwrap();
    const GROUP: i64 = 64 * 1024;
    // Row groups 0 and 3: every row passes; 1, 2 and 4: one in a hundred.
    let passes = |k: i64| matches!(k / GROUP, 0 | 3) || k % 100 == 0;
    let entries: Vec<_> = (0..5 * GROUP)
        .map(|k| match passes(k) {
            true => (k, Some("pass".to_string()), 1),
            false => (k, Some("fail".to_string()), 0),
        })
        .collect();
    let batch = WriteBatch::new(WriteKind::Insert, rows(&schema, &entries));
    tablet.apply(1, now(), &batch).unwrap();
    tablet.flush().unwrap();
    let mut model: Model = entries.iter().map(|e| (e.0, (e.1.clone(), e.2))).collect();
    // Hidden rows: some deleted, some updated (one of them to pass, one to fail).
    let gone: Vec<i64> = vec![5, 1000, GROUP + 100, 3 * GROUP + 7, 4 * GROUP + 200];
    let batch = rows(
        &schema,
        &gone.iter().map(|&k| (k, None, 0)).collect::<Vec<_>>(),
    );
    let batch = batch.project(&[1]).unwrap();
    tablet
        .apply(2, now(), &WriteBatch::new(WriteKind::Delete, batch))
        .unwrap();
    for k in &gone {
        model.remove(k);
    }
    let changed = [
        (GROUP + 1, Some("pass".to_string()), 1),
        (3 * GROUP + 9, Some("fail".to_string()), 0),
    ];
    let batch = WriteBatch::new(WriteKind::Update, rows(&schema, &changed));
    tablet.apply(3, now(), &batch).unwrap();
    for (k, s, v) in changed {
        model.insert(k, (s, v));
    }
    let at = Timestamp(u64::MAX);
    let scalar = |v: i64| Scalar(Arc::new(Int64Array::from(vec![v])));
    let on_v = vec![ColumnPredicate {
        column: 2,
        op: PredicateOp::GtEq(scalar(1)),
    }];
    let expected: Model = model
        .iter()
        .filter(|(_, (_, v))| *v >= 1)
        .map(|(k, row)| (*k, row.clone()))
        .collect();
    assert_eq!(scan_with(&tablet, at, on_v), expected);
    let on_s = vec![ColumnPredicate {
        column: 0,
        op: PredicateOp::Eq(Scalar(Arc::new(StringArray::from(vec!["pass"])))),
    }];
    assert_eq!(scan_with(&tablet, at, on_s), expected);
    // Only the predicate's own column and the key: after decoding throughout.
    let on_k = vec![ColumnPredicate {
        column: 1,
        op: PredicateOp::Lt(scalar(2 * GROUP + 5)),
    }];
    let expected: Model = model
        .range(..2 * GROUP + 5)
        .map(|(k, row)| (*k, row.clone()))
        .collect();
    assert_eq!(scan_with(&tablet, at, on_k), expected);
}

/// A write applied while a flush is writing its files (here: from the flush's own fail-point
/// hook, on another thread) completes without waiting for the flush, and the flush keeps it:
/// flushes no longer hold writers off.
#[test]
fn writes_go_on_while_a_flush_writes_its_files() {
    use std::sync::{Mutex, OnceLock, Weak};
    let dir = tempfile::tempdir().unwrap();
    let schema = schema();
    let me: Arc<OnceLock<Weak<Tablet>>> = Arc::default();
    let done: Arc<Mutex<Vec<bool>>> = Arc::default();
    let (hook_me, hook_done, hook_schema) = (me.clone(), done.clone(), schema.clone());
    let options = TabletOptions {
        fail_point: Some(FailPoint(Arc::new(move |step: &str| {
            if step == "rowset_written" && hook_done.lock().unwrap().is_empty() {
                let tablet = hook_me.get().and_then(Weak::upgrade).unwrap();
                let schema = hook_schema.clone();
                let writer = std::thread::spawn(move || {
                    let batch =
                        WriteBatch::new(WriteKind::Insert, rows(&schema, &[(1000, None, 1)]));
                    tablet.apply(3, now(), &batch).unwrap();
                    let update = WriteBatch::new(
                        WriteKind::Update,
                        rows(&schema, &[(1, None, -1)]).project(&[1, 2]).unwrap(),
                    );
                    tablet.apply(4, now(), &update).unwrap();
                });
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while !writer.is_finished() && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                hook_done.lock().unwrap().push(writer.is_finished());
            }
            false
        }))),
        ..TabletOptions::default()
    };
    let tablet = Arc::new(Tablet::create(dir.path(), schema.clone(), options).unwrap());
    me.set(Arc::downgrade(&tablet)).unwrap();
    let entries: Vec<_> = (0..100).map(|k| (k, None, k)).collect();
    let batch = WriteBatch::new(WriteKind::Insert, rows(&schema, &entries));
    tablet.apply(1, now(), &batch).unwrap();
    let update = WriteBatch::new(
        WriteKind::Update,
        rows(&schema, &[(2, None, -2)]).project(&[1, 2]).unwrap(),
    );
    tablet.apply(2, now(), &update).unwrap();
    tablet.flush().unwrap();
    assert_eq!(
        *done.lock().unwrap(),
        vec![true],
        "the writes did not wait for the flush"
    );
    let mut expected: Model = entries.iter().map(|e| (e.0, (None, e.2))).collect();
    expected.insert(1000, (None, 1));
    expected.insert(1, (None, -1));
    expected.insert(2, (None, -2));
    assert_eq!(scan(&tablet, Timestamp(u64::MAX), None), expected);
    // The rows written during the flush are in memory, then in files after the next flush.
    assert!(tablet.memory_bytes() > 0);
    tablet.flush().unwrap();
    assert_eq!(tablet.memory_bytes(), 0);
    assert_eq!(scan(&tablet, Timestamp(u64::MAX), None), expected);
}

/// Random writes on one thread while another flushes and compacts without pause: every write
/// succeeds or fails as the model says, and scans, snapshots and a reopen agree with it.
#[test]
fn random_writes_during_flushes_and_compactions_match_a_model() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let schema = schema();
    let options = TabletOptions {
        rowset_target_bytes: 4 << 10,
        ..TabletOptions::default()
    };
    let tablet = Arc::new(Tablet::create(dir.path(), schema.clone(), options.clone()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let background = {
        let (tablet, stop) = (tablet.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                tablet.flush().unwrap();
                for op in tablet.maintenance_ops() {
                    tablet.compact(&op.kind).unwrap();
                }
                let rowsets = tablet.rowset_ids();
                if rowsets.len() > 1 {
                    tablet
                        .compact(&MaintenanceKind::MergeRowsets { rowsets })
                        .unwrap();
                }
                rounds += 1;
            }
            rounds
        })
    };
    let mut rng = StdRng::seed_from_u64(env_or("NYALA_MODEL_SEED", 42));
    let mut model = Model::new();
    let mut snapshots: Vec<(Timestamp, Model)> = Vec::new();
    let steps = env_or("NYALA_MODEL_ITERS", 400) * 2;
    for index in 1..=steps {
        let keys: Vec<i64> = (0..rng.random_range(1..8))
            .map(|_| rng.random_range(0..300))
            .collect();
        let mut distinct = keys.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let unique = distinct.len() == keys.len();
        let entries: Vec<(i64, Option<String>, i64)> = keys
            .iter()
            .map(|&k| {
                (
                    k,
                    rng.random_bool(0.5).then(|| format!("s{index}")),
                    rng.random_range(-9..9),
                )
            })
            .collect();
        let ts = now();
        let (kind, batch, ok) = match rng.random_range(0..4) {
            0 => {
                let ok = unique && keys.iter().all(|k| !model.contains_key(k));
                (WriteKind::Insert, rows(&schema, &entries), ok)
            }
            1 => (WriteKind::Upsert, rows(&schema, &entries), true),
            2 => {
                let ok = unique && keys.iter().all(|k| model.contains_key(k));
                let batch = rows(&schema, &entries).project(&[1, 2]).unwrap();
                (WriteKind::Update, batch, ok)
            }
            _ => {
                let ok = unique && keys.iter().all(|k| model.contains_key(k));
                (
                    WriteKind::Delete,
                    rows(&schema, &entries).project(&[1]).unwrap(),
                    ok,
                )
            }
        };
        let result = tablet.apply(index, ts, &WriteBatch::new(kind, batch));
        assert_eq!(result.is_ok(), ok, "{kind:?} {keys:?}: {result:?}");
        if ok {
            for e in &entries {
                match kind {
                    WriteKind::Delete => {
                        model.remove(&e.0);
                    }
                    WriteKind::Update => model.get_mut(&e.0).unwrap().1 = e.2,
                    _ => {
                        model.insert(e.0, (e.1.clone(), e.2));
                    }
                }
            }
        }
        if index % 10 == 0 {
            assert_eq!(
                scan(&tablet, Timestamp(u64::MAX), None),
                model,
                "step {index}"
            );
            snapshots.push((ts, model.clone()));
            let (old, expected) = &snapshots[rng.random_range(0..snapshots.len())];
            assert_eq!(
                &scan(&tablet, *old, None),
                expected,
                "snapshot at step {index}"
            );
            let probe: Vec<i64> = (0..3).map(|_| rng.random_range(0..300)).collect();
            let found: Model = expected
                .iter()
                .filter(|(k, _)| probe.contains(k))
                .map(|(k, v)| (*k, v.clone()))
                .collect();
            assert_eq!(
                lookup(&tablet, *old, &probe),
                found,
                "lookups at step {index}"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = background.join().unwrap();
    assert!(rounds > 0);
    assert_eq!(scan(&tablet, Timestamp(u64::MAX), None), model);
    tablet.flush().unwrap();
    drop(tablet);
    let tablet = Tablet::open(dir.path(), options).unwrap();
    assert_eq!(
        scan(&tablet, Timestamp(u64::MAX), None),
        model,
        "after reopening"
    );
    for (t, expected) in &snapshots {
        assert_eq!(
            &scan(&tablet, *t, None),
            expected,
            "snapshot after reopening"
        );
    }
}

/// Deleted rows stay in their rowset until the deletion is older than the history retention:
/// a rowset whose REDO records are recent deletions only is not rewritten (again and again) for
/// them, and once they are older than the retention, rewriting it drops the rows.
#[test]
fn recent_deletions_alone_do_not_trigger_rewrites() {
    let dir = tempfile::tempdir().unwrap();
    let schema = schema();
    let options = TabletOptions {
        history_max_age: std::time::Duration::from_secs(3600),
        ..TabletOptions::default()
    };
    let tablet = Tablet::create(dir.path(), schema.clone(), options).unwrap();
    let hours_ago = |h: f64| Timestamp(now().0 - Timestamp::from_micros((h * 3.6e9) as u64).0);
    let entries: Vec<_> = (0..100).map(|k| (k, None, k)).collect();
    let insert = WriteBatch::new(WriteKind::Insert, rows(&schema, &entries));
    tablet.apply(1, hours_ago(3.0), &insert).unwrap();
    tablet.flush().unwrap();
    let delete = |index, ts, keys: std::ops::Range<i64>| {
        let gone: Vec<_> = keys.map(|k| (k, None, k)).collect();
        let batch = WriteBatch::new(
            WriteKind::Delete,
            rows(&schema, &gone).project(&[1]).unwrap(),
        );
        tablet.apply(index, ts, &batch).unwrap();
        tablet.flush().unwrap();
    };
    let rewrites = |tablet: &Tablet| {
        let ops = tablet.maintenance_ops();
        ops.into_iter()
            .filter(|op| matches!(op.kind, MaintenanceKind::ApplyRedo { .. }))
            .count()
    };
    delete(2, now(), 0..10);
    assert_eq!(rewrites(&tablet), 0, "10 % of the rows deleted just now");
    delete(3, hours_ago(2.0), 50..60);
    // The older deletions are in a file of their own, beyond the retention: worth a rewrite.
    assert_eq!(rewrites(&tablet), 1);
    let op = tablet.maintenance_ops().remove(0);
    tablet.compact(&op.kind).unwrap();
    assert_eq!(
        tablet.estimated_rows(),
        90,
        "rows deleted before the retention are gone"
    );
    assert_eq!(rewrites(&tablet), 0);
    assert_eq!(scan(&tablet, Timestamp(u64::MAX), None).len(), 80);
}

/// Conditional UPDATEs and DELETEs (`WriteBatch::unchanged_since`) among random writes,
/// flushes and compactions: every row whose key changed after the batch's snapshot, or is
/// gone, is reported, and then nothing is applied; else the batch applies as an unconditional
/// one would.
/// (A refusal of an unchanged row is allowed: the check is conservative for rows just
/// flushed.)
#[test]
fn conditional_writes_refuse_rows_changed_after_their_snapshot() {
    for seed in 1..=env_or("NYALA_MODEL_SEEDS", 4) {
        let dir = tempfile::tempdir().unwrap();
        let schema = schema();
        let options = TabletOptions {
            flush_threshold_bytes: 1 << 20,
            rowset_target_bytes: 4 << 10,
            ..TabletOptions::default()
        };
        let tablet = Tablet::create(dir.path(), schema.clone(), options).unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut model = Model::new();
        // The timestamp of each key's last write.
        let mut changed: BTreeMap<i64, u64> = BTreeMap::new();
        let mut ts = now().0;
        let (mut refused, mut spurious) = (0, 0);
        for index in 1..=600u64 {
            ts += 1;
            let keys: Vec<i64> = {
                let mut k: Vec<i64> = (0..rng.random_range(1..6))
                    .map(|_| rng.random_range(0..30))
                    .collect();
                k.sort_unstable();
                k.dedup();
                k
            };
            let entries: Vec<(i64, Option<String>, i64)> = keys
                .iter()
                .map(|&k| (k, Some(format!("s{index}")), rng.random_range(-100..100)))
                .collect();
            match rng.random_range(0..8) {
                0 | 1 => {
                    let batch = WriteBatch::new(WriteKind::Upsert, rows(&schema, &entries));
                    tablet.apply(index, Timestamp(ts), &batch).unwrap();
                    for e in &entries {
                        model.insert(e.0, (e.1.clone(), e.2));
                        changed.insert(e.0, ts);
                    }
                }
                2 => tablet.flush().unwrap(),
                3 => {
                    if let Some(op) = tablet.maintenance_ops().first() {
                        tablet.compact(&op.kind).unwrap();
                    }
                }
                op => {
                    let snapshot = ts - rng.random_range(1..20);
                    let delete = op == 7;
                    let full = rows(&schema, &entries);
                    let (kind, batch) = match delete {
                        true => (WriteKind::Delete, full.project(&[1]).unwrap()),
                        false => (WriteKind::Update, full.project(&[1, 2]).unwrap()),
                    };
                    let batch = WriteBatch::new(kind, batch).unchanged_since(Timestamp(snapshot));
                    let outcome = tablet.apply_write(index, Timestamp(ts), &batch).unwrap();
                    let refused_all = !outcome.conflicts.is_empty();
                    for (row, e) in entries.iter().enumerate() {
                        let conflict = outcome.conflicts.contains(&(row as u32));
                        let must = !model.contains_key(&e.0)
                            || changed.get(&e.0).is_some_and(|&at| at > snapshot);
                        assert!(
                            conflict || !must,
                            "seed {seed}: key {} changed at {:?} (snapshot {snapshot}) was not refused",
                            e.0,
                            changed.get(&e.0)
                        );
                        if conflict {
                            refused += 1;
                            spurious += usize::from(!must);
                        }
                        if refused_all {
                            continue;
                        }
                        changed.insert(e.0, ts);
                        if delete {
                            model.remove(&e.0);
                        } else {
                            model.get_mut(&e.0).unwrap().1 = e.2;
                        }
                    }
                    let applied = if refused_all { 0 } else { entries.len() };
                    assert_eq!(outcome.rows, applied);
                }
            }
            assert_eq!(
                scan(&tablet, Timestamp(u64::MAX), None),
                model,
                "seed {seed}, step {index}"
            );
        }
        assert!(refused > 0, "seed {seed}: no conditional write conflicted");
        assert!(
            spurious < refused,
            "seed {seed}: {spurious} of {refused} refusals were spurious"
        );
    }
}

/// A transaction's writes: checked when written (against the tablet and its own earlier
/// writes), invisible and locked until the commit applies them at the commit timestamp,
/// dropped by an abort, and kept across a flush and a reopen.
#[test]
fn transactions_apply_at_commit_and_survive_flush_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let schema = schema();
    let options = TabletOptions::default();
    let mut tablet = Tablet::create(dir.path(), schema.clone(), options.clone()).unwrap();
    let row = |k: i64, v: i64| (k, Some(format!("s{k}")), v);
    let t0 = now().0;
    let insert = |rows: &[(i64, Option<String>, i64)]| {
        WriteBatch::new(WriteKind::Insert, self::rows(&schema, rows))
    };
    tablet
        .apply(1, Timestamp(t0), &insert(&[row(1, 10)]))
        .unwrap();
    // Transaction 7 inserts 2 and 3, then updates 3 and deletes 1.
    tablet
        .apply_txn_write(2, Timestamp(t0 + 1), 7, &insert(&[row(2, 20), row(3, 30)]))
        .unwrap();
    let update = WriteBatch::new(
        WriteKind::Update,
        rows(&schema, &[row(3, 31)]).project(&[1, 2]).unwrap(),
    );
    tablet
        .apply_txn_write(3, Timestamp(t0 + 2), 7, &update)
        .unwrap();
    let delete = WriteBatch::new(
        WriteKind::Delete,
        rows(&schema, &[row(1, 0)]).project(&[1]).unwrap(),
    );
    tablet
        .apply_txn_write(4, Timestamp(t0 + 3), 7, &delete)
        .unwrap();
    // Its own checks: 2 exists for it now; 9 does not.
    let again = tablet.apply_txn_write(5, Timestamp(t0 + 4), 7, &insert(&[row(2, 0)]));
    assert!(
        matches!(again, Err(StorageError::DuplicateKey { .. })),
        "{again:?}"
    );
    let missing = WriteBatch::new(
        WriteKind::Delete,
        rows(&schema, &[row(9, 0)]).project(&[1]).unwrap(),
    );
    let missing = tablet.apply_txn_write(6, Timestamp(t0 + 5), 7, &missing);
    assert!(
        matches!(missing, Err(StorageError::KeyNotFound { .. })),
        "{missing:?}"
    );
    let before: Model = [(1, (Some("s1".into()), 10))].into();
    assert_eq!(
        scan(&tablet, Timestamp(u64::MAX), None),
        before,
        "pending rows are invisible"
    );
    // Other writes to its keys are refused; a conditional one reports a conflict.
    let other = tablet.apply(7, Timestamp(t0 + 6), &insert(&[row(2, 0)]));
    assert!(
        matches!(other, Err(StorageError::Locked { .. })),
        "{other:?}"
    );
    let conditional = WriteBatch::new(
        WriteKind::Update,
        rows(&schema, &[row(1, 11)]).project(&[1, 2]).unwrap(),
    )
    .unchanged_since(Timestamp(t0 + 6));
    let outcome = tablet
        .apply_write(8, Timestamp(t0 + 7), &conditional)
        .unwrap();
    assert_eq!((outcome.rows, outcome.conflicts), (0, vec![0]));
    let other_txn = tablet.apply_txn_write(9, Timestamp(t0 + 8), 8, &insert(&[row(3, 0)]));
    assert!(
        matches!(other_txn, Err(StorageError::Locked { .. })),
        "{other_txn:?}"
    );
    // Transaction 8 inserts 5 and aborts.
    tablet
        .apply_txn_write(10, Timestamp(t0 + 9), 8, &insert(&[row(5, 50)]))
        .unwrap();
    tablet.abort_txn(11, 8).unwrap();
    // A flush and a reopen keep transaction 7 (prepared) pending, with its locks.
    tablet.prepare_txn(12, Timestamp(t0 + 10), 7).unwrap();
    tablet
        .apply(13, Timestamp(t0 + 11), &insert(&[row(6, 60)]))
        .unwrap();
    tablet.flush().unwrap();
    drop(tablet);
    tablet = Tablet::open(dir.path(), options).unwrap();
    assert_eq!(tablet.durable_index(), 13);
    let pending = tablet.pending_txns();
    assert_eq!(pending.len(), 1);
    assert_eq!(
        (pending[0].txn, pending[0].prepared),
        (7, Some(Timestamp(t0 + 10)))
    );
    let locked = tablet.apply(14, Timestamp(t0 + 12), &insert(&[row(3, 0)]));
    assert!(
        matches!(locked, Err(StorageError::Locked { .. })),
        "{locked:?}"
    );
    let committed = t0 + 13;
    assert_eq!(tablet.commit_txn(15, Timestamp(committed), 7).unwrap(), 4);
    assert!(tablet.pending_txns().is_empty());
    let after: Model = [
        (2, (Some("s2".into()), 20)),
        (3, (Some("s3".into()), 31)),
        (6, (Some("s6".into()), 60)),
    ]
    .into();
    assert_eq!(scan(&tablet, Timestamp(committed), None), after);
    let just_before: Model = [(1, (Some("s1".into()), 10)), (6, (Some("s6".into()), 60))].into();
    assert_eq!(scan(&tablet, Timestamp(committed - 1), None), just_before);
    // The keys are free again.
    tablet
        .apply(16, Timestamp(t0 + 14), &insert(&[row(1, 1)]))
        .unwrap();
    // And the committed rows survive a flush and a reopen like any.
    tablet.flush().unwrap();
    drop(tablet);
    let tablet = Tablet::open(dir.path(), TabletOptions::default()).unwrap();
    assert_eq!(scan(&tablet, Timestamp(u64::MAX), None).len(), 4);
    assert!(tablet.pending_txns().is_empty());
}

/// A transaction that writes one key several times (a DELETE then an UPSERT of it, an INSERT
/// then an UPDATE, ...) commits its last write of the key, also after the tablet flushes,
/// compacts and reopens: all its writes share the commit timestamp, so storage must not be
/// left to order them.
#[test]
fn a_transaction_writing_a_key_twice_commits_its_last_write() {
    let dir = tempfile::tempdir().unwrap();
    let schema = schema();
    let options = TabletOptions::default();
    let mut tablet = Tablet::create(dir.path(), schema.clone(), options.clone()).unwrap();
    let t0 = now().0;
    let full = |k: i64, v: i64| rows(&schema, &[(k, Some(format!("s{k}.{v}")), v)]);
    let batch = |kind: WriteKind, k: i64, v: i64| {
        let rows = full(k, v);
        let rows = match kind {
            WriteKind::Update => rows.project(&[1, 2]).unwrap(),
            WriteKind::Delete => rows.project(&[1]).unwrap(),
            _ => rows,
        };
        WriteBatch::new(kind, rows)
    };
    use WriteKind::{Delete, Insert, Update, Upsert};
    // Per key: whether it exists before the transaction, then its writes in it (v values).
    let cases: Vec<(bool, Vec<(WriteKind, i64)>)> = vec![
        (true, vec![(Delete, 0), (Upsert, 1)]),
        (true, vec![(Delete, 0), (Insert, 2)]),
        (true, vec![(Update, 3), (Delete, 0)]),
        (true, vec![(Update, 4), (Update, 5)]),
        (true, vec![(Upsert, 6), (Update, 7)]),
        (true, vec![(Delete, 0), (Insert, 8), (Update, 9)]),
        (false, vec![(Insert, 10), (Delete, 0)]),
        (false, vec![(Insert, 11), (Update, 12)]),
        (false, vec![(Upsert, 13), (Upsert, 14)]),
        (false, vec![(Insert, 15), (Delete, 0), (Insert, 16)]),
    ];
    // Keys 0-9 with their rows flushed, 10-19 in the MemRowSet.
    let mut index = 0;
    let mut model = Model::new();
    for on_disk in [true, false] {
        for (case, (exists, _)) in cases.iter().enumerate() {
            let k = case as i64 + if on_disk { 0 } else { 10 };
            if *exists {
                index += 1;
                tablet
                    .apply(index, Timestamp(t0 + index), &batch(Insert, k, 100))
                    .unwrap();
                model.insert(k, (Some(format!("s{k}.100")), 100));
            }
        }
        if on_disk {
            tablet.flush().unwrap();
        }
    }
    let txn = 7;
    let mut expected = model.clone();
    for on_disk in [true, false] {
        for (case, (_, writes)) in cases.iter().enumerate() {
            let k = case as i64 + if on_disk { 0 } else { 10 };
            for &(kind, v) in writes {
                index += 1;
                tablet
                    .apply_txn_write(index, Timestamp(t0 + index), txn, &batch(kind, k, v))
                    .unwrap();
                match kind {
                    Delete => drop(expected.remove(&k)),
                    Update => expected.get_mut(&k).unwrap().1 = v,
                    _ => drop(expected.insert(k, (Some(format!("s{k}.{v}")), v))),
                }
            }
        }
    }
    index += 1;
    let committed = Timestamp(t0 + index);
    tablet.commit_txn(index, committed, txn).unwrap();
    assert_eq!(scan(&tablet, committed, None), expected, "at the commit");
    assert_eq!(
        scan(&tablet, Timestamp(committed.0 - 1), None),
        model,
        "before it"
    );
    tablet.flush().unwrap();
    assert_eq!(scan(&tablet, committed, None), expected, "after a flush");
    // The older rowset (the rows deleted at the commit) is rewritten, which places it after
    // the newer one (the rows inserted at the commit): a merge must still order each key's
    // versions at the commit timestamp as they were written.
    let older = tablet.rowset_ids()[0];
    tablet
        .compact(&MaintenanceKind::MergeRedo { rowset: older })
        .unwrap();
    tablet
        .compact(&MaintenanceKind::ApplyRedo { rowset: older })
        .unwrap();
    assert_eq!(
        scan(&tablet, committed, None),
        expected,
        "after delta compactions"
    );
    let rowsets = tablet.rowset_ids();
    tablet
        .compact(&MaintenanceKind::MergeRowsets { rowsets })
        .unwrap();
    assert_eq!(
        scan(&tablet, committed, None),
        expected,
        "after a rowset compaction"
    );
    drop(tablet);
    tablet = Tablet::open(dir.path(), options).unwrap();
    assert_eq!(scan(&tablet, committed, None), expected, "after a reopen");
    assert_eq!(scan(&tablet, Timestamp(u64::MAX), None), expected);
}

/// Applies `kind` of `entries` as log entry `index` at `ts`.
fn write(
    tablet: &Tablet,
    index: u64,
    ts: Timestamp,
    kind: WriteKind,
    entries: &[(i64, Option<String>, i64)],
) {
    let schema = tablet.schema();
    let batch = WriteBatch::new(kind, rows(&schema, entries));
    tablet.apply(index, ts, &batch).unwrap();
}

/// The rows a scan without columns counts.
fn count(tablet: &Tablet, snapshot: Timestamp) -> usize {
    let spec = ScanSpec {
        projection: Some(vec![]),
        predicates: vec![],
        snapshot,
        limit: None,
        batch_size: 8192,
        string_views: false,
        changes_since: None,
    };
    let batches = tablet.scan(&spec).unwrap();
    batches.map(|b| b.unwrap().num_rows()).sum()
}

/// The number of files named `rowset-*` in `dir` that are also linked elsewhere, and of those
/// that are not.
fn shared_and_own_rowsets(dir: &std::path::Path) -> (usize, usize) {
    use std::os::unix::fs::MetadataExt;
    let mut counts = (0, 0);
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().starts_with("rowset-") {
            match entry.metadata().unwrap().nlink() > 1 {
                true => counts.0 += 1,
                false => counts.1 += 1,
            }
        }
    }
    counts
}

#[test]
fn a_clone_shares_the_files_and_is_independent_of_its_source() {
    let dir = tempfile::tempdir().unwrap();
    let (src, copy) = (dir.path().join("src"), dir.path().join("clone"));
    let tablet = Tablet::create(&src, schema(), TabletOptions::default()).unwrap();
    let t0 = now();
    let at = |n: u64| Timestamp(t0.0 + n);
    let entries: Vec<_> = (0..100).map(|k| (k, Some(format!("s{k}")), k)).collect();
    write(&tablet, 1, at(1), WriteKind::Insert, &entries);
    tablet.flush().unwrap();
    let updated: Vec<_> = (0..10).map(|k| (k, None, 1000 + k)).collect();
    write(&tablet, 2, at(2), WriteKind::Update, &updated);
    let more: Vec<_> = (100..120).map(|k| (k, None, k)).collect();
    write(&tablet, 3, at(3), WriteKind::Insert, &more);

    tablet.make_clone(&copy, 4, None).unwrap();
    let clone = Tablet::open(&copy, TabletOptions::default()).unwrap();
    let expected = scan(&tablet, at(3), None);
    assert_eq!(expected.len(), 120);
    assert_eq!(scan(&clone, at(3), None), expected);
    assert_eq!(clone.durable_index(), 0, "the clone's log starts empty");
    let (shared, own) = shared_and_own_rowsets(&copy);
    assert!(shared >= 2 && own == 0, "{shared} shared, {own} copied");

    // Writes to either never show in the other.
    write(&clone, 1, at(10), WriteKind::Upsert, &[(0, None, -1)]);
    write(&tablet, 4, at(11), WriteKind::Delete, &[(1, None, 0)]);
    let (in_clone, in_source) = (scan(&clone, at(12), None), scan(&tablet, at(12), None));
    assert_eq!(in_clone[&0].1, -1);
    assert_eq!(in_source[&0].1, 1000);
    assert!(in_clone.contains_key(&1) && !in_source.contains_key(&1));

    // The source compacts and goes away; the clone keeps its rows, across a reopen.
    tablet.flush().unwrap();
    for op in tablet.maintenance_ops() {
        tablet.compact(&op.kind).unwrap();
    }
    drop(tablet);
    std::fs::remove_dir_all(&src).unwrap();
    clone.flush().unwrap();
    drop(clone);
    let clone = Tablet::open(&copy, TabletOptions::default()).unwrap();
    assert_eq!(scan(&clone, at(12), None), in_clone);
}

#[test]
fn a_clone_as_of_a_time_copies_only_the_rowsets_written_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let (src, copy) = (dir.path().join("src"), dir.path().join("clone"));
    let tablet = Tablet::create(&src, schema(), TabletOptions::default()).unwrap();
    let t0 = now();
    let at = |n: u64| Timestamp(t0.0 + n);
    let old: Vec<_> = (0..50).map(|k| (k, Some(format!("s{k}")), k)).collect();
    write(&tablet, 1, at(1), WriteKind::Insert, &old);
    tablet.flush().unwrap();
    let untouched: Vec<_> = (50..60).map(|k| (k, None, k)).collect();
    write(&tablet, 2, at(2), WriteKind::Insert, &untouched);
    tablet.flush().unwrap();
    // In memory, to be flushed with rows inserted after the clone's time.
    write(&tablet, 3, at(3), WriteKind::Insert, &[(80, None, 80)]);
    let then = scan(&tablet, at(3), None);
    // After the clone's time: updates and deletes of the first rowset (flushed to a REDO
    // file, and in memory), new rows.
    write(&tablet, 4, at(4), WriteKind::Update, &[(3, None, 333)]);
    write(&tablet, 5, at(5), WriteKind::Delete, &[(4, None, 0)]);
    write(&tablet, 6, at(6), WriteKind::Insert, &[(70, None, 70)]);
    write(&tablet, 7, at(7), WriteKind::Upsert, &[(5, None, 555)]);

    tablet.make_clone(&copy, 8, Some(at(3))).unwrap();
    let clone = Tablet::open(&copy, TabletOptions::default()).unwrap();
    assert_eq!(scan(&clone, at(8), None), then);
    assert_eq!(scan(&clone, at(3), None), then);
    assert_eq!(count(&clone, at(8)), then.len());
    // The two old rowsets are linked (without the REDO file of the later changes); the one
    // flushed from memory holds rows of both sides of the time, and is rewritten.
    let (shared, own) = shared_and_own_rowsets(&copy);
    assert_eq!((shared, own), (2, 1));
    assert_eq!(
        clone.delta_file_count(),
        3,
        "an UNDO file per rowset, no REDO file"
    );
    // The source is as it was.
    let now_in_source = scan(&tablet, at(8), None);
    assert_eq!(now_in_source[&3].1, 333);
    assert!(!now_in_source.contains_key(&4));

    // Older than the history kept: refused.
    let too_old = Timestamp(t0.0 - Timestamp::from_micros(3600 * 1_000_000).0);
    let err = tablet
        .make_clone(&dir.path().join("too-old"), 9, Some(too_old))
        .unwrap_err();
    assert!(err.to_string().contains("history"), "{err}");
}

/// A row updated after its flush (the update in its rowset's DeltaMemStore, changing no key
/// column) is found by a lookup that reads only its key, as UPDATE and DELETE read it.
#[test]
fn a_key_only_lookup_finds_a_row_updated_after_its_flush() {
    let dir = tempfile::tempdir().unwrap();
    let tablet = Tablet::create(dir.path(), schema(), TabletOptions::default()).unwrap();
    let t0 = now();
    let at = |n: u64| Timestamp(t0.0 + n);
    write(
        &tablet,
        1,
        at(1),
        WriteKind::Insert,
        &[(1, None, 1), (2, None, 2)],
    );
    tablet.flush().unwrap();
    write(&tablet, 2, at(3), WriteKind::Update, &[(1, None, 10)]);
    assert_eq!(lookup_keys(&tablet, at(4), &[1]), [1]);
    assert_eq!(lookup_keys(&tablet, at(4), &[1, 2]), [1, 2]);
    assert_eq!(lookup(&tablet, at(4), &[1])[&1].1, 10);
    write(&tablet, 3, at(5), WriteKind::Delete, &[(1, None, 0)]);
    assert_eq!(lookup_keys(&tablet, at(6), &[1, 2]), [2]);
    assert_eq!(
        lookup_keys(&tablet, at(4), &[1]),
        [1],
        "as of before the DELETE"
    );
}

/// A join filter on the first key column whose keys are few for the rows looks them up:
/// whole keys in the key index (one-column keys), pages of key prefixes (the first column of
/// several), in the MemRowSet and in the rowsets, with updated and deleted rows among them.
/// The rows found are those a full scan with the filter finds.
#[test]
fn a_join_filter_with_few_keys_finds_their_rows_through_the_key_indexes() {
    let col = |name: &str| ColumnSchema::new(name, ColumnType::Int64, false);
    for key_columns in [vec![0], vec![0, 1]] {
        let schema = Schema::new(vec![col("a"), col("b"), col("v")], key_columns.clone()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let tablet = Tablet::create(dir.path(), schema.clone(), TabletOptions::default()).unwrap();
        // One-column keys: a = i; two: (i / 10, i % 10).
        let n = 200_000i64;
        let (a, b): (Vec<i64>, Vec<i64>) = match key_columns.len() {
            1 => ((0..n).collect(), vec![0; n as usize]),
            _ => (
                (0..n).map(|i| i / 10).collect(),
                (0..n).map(|i| i % 10).collect(),
            ),
        };
        let batch = |a: Vec<i64>, b: Vec<i64>, v: Vec<i64>| {
            let columns: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from(a)),
                Arc::new(Int64Array::from(b)),
                Arc::new(Int64Array::from(v)),
            ];
            RecordBatch::try_new(schema.arrow_schema(), columns).unwrap()
        };
        let t0 = now();
        let insert = batch(a.clone(), b.clone(), (0..n).collect());
        let insert = WriteBatch::new(WriteKind::Insert, insert);
        tablet.apply(1, Timestamp(t0.0 + 1), &insert).unwrap();
        let wanted = [3i64, 1_000, 3_999, 77_777];
        // Before the writes below, or after them (key 3's rows updated to v = -1, key
        // 1 000's deleted).
        let expected = |written: bool| -> Vec<(i64, i64, i64)> {
            let mut rows: Vec<(i64, i64, i64)> = (0..n as usize)
                .filter(|&i| wanted.contains(&a[i]) && !(written && a[i] == 1_000))
                .map(|i| (a[i], b[i], if written && a[i] == 3 { -1 } else { i as i64 }))
                .collect();
            rows.sort();
            rows
        };
        let filtered = |at: u64| {
            let scalar = |k: i64| Scalar(Arc::new(Int64Array::from(vec![k])));
            let mut filter = JoinFilter::new(
                arrow::datatypes::DataType::Int64,
                Some((scalar(3), scalar(77_777))),
                false,
            );
            let keys: ArrayRef = Arc::new(Int64Array::from(wanted.to_vec()));
            filter.add_bloom(&[keys], 1 << 10).unwrap();
            let spec = ScanSpec {
                projection: Some(vec![0, 1, 2]),
                predicates: vec![ColumnPredicate {
                    column: 0,
                    op: PredicateOp::join_filter(Arc::new(filter)),
                }],
                snapshot: Timestamp(t0.0 + at),
                limit: None,
                batch_size: 1024,
                string_views: false,
                changes_since: None,
            };
            let mut rows: Vec<(i64, i64, i64)> = Vec::new();
            for b in tablet.scan(&spec).unwrap() {
                let b = b.unwrap();
                let column = |c: usize| b.column(c).as_primitive::<Int64Type>().values().to_vec();
                let (a, bb, v) = (column(0), column(1), column(2));
                rows.extend((0..b.num_rows()).map(|i| (a[i], bb[i], v[i])));
            }
            rows.sort();
            rows
        };
        let what = format!("{} key column(s)", key_columns.len());
        assert_eq!(filtered(2), expected(false), "in memory, {what}");
        tablet.flush().unwrap();
        assert_eq!(filtered(2), expected(false), "flushed, {what}");
        // The rows of key 3 updated, those of 1 000 deleted.
        let a_ref = &a;
        let rows_of = |key: i64| (0..n as usize).filter(move |&i| a_ref[i] == key);
        let (ua, ub): (Vec<i64>, Vec<i64>) = rows_of(3).map(|i| (a[i], b[i])).unzip();
        let update = batch(ua.clone(), ub, vec![-1; ua.len()]);
        let update = WriteBatch::new(WriteKind::Update, update);
        tablet.apply(2, Timestamp(t0.0 + 3), &update).unwrap();
        let (da, db): (Vec<i64>, Vec<i64>) = rows_of(1_000).map(|i| (a[i], b[i])).unzip();
        let keys = batch(da.clone(), db, vec![0; da.len()]);
        let keys = keys.project(&key_columns).unwrap();
        let delete = WriteBatch::new(WriteKind::Delete, keys);
        tablet.apply(3, Timestamp(t0.0 + 4), &delete).unwrap();
        assert_eq!(filtered(5), expected(true), "after writes, {what}");
        assert_eq!(filtered(2), expected(false), "as of before them, {what}");
        tablet.flush().unwrap();
        assert_eq!(filtered(5), expected(true), "flushed again, {what}");
    }
}

/// A queue table: (queue, pos GENERATED ALWAYS AS POSITION, body).
fn queue_schema() -> Schema {
    let col = |name: &str, column_type| ColumnSchema::new(name, column_type, false);
    Schema::new(
        vec![
            col("queue", ColumnType::String),
            col("pos", ColumnType::Int64),
            col("body", ColumnType::String),
        ],
        vec![0, 1],
    )
    .unwrap()
    .with_position(1)
    .unwrap()
}

/// Rows of queue `q` with `bodies`, the position left to the tablet.
fn queue_rows(bodies: &[String]) -> WriteBatch {
    let schema = Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("queue", arrow::datatypes::DataType::Utf8, false),
        arrow::datatypes::Field::new("body", arrow::datatypes::DataType::Utf8, false),
    ]));
    let queue = StringArray::from(vec!["q"; bodies.len()]);
    let body = StringArray::from(bodies.to_vec());
    let rows = RecordBatch::try_new(schema, vec![Arc::new(queue), Arc::new(body)]).unwrap();
    WriteBatch::new(WriteKind::Insert, rows)
}

/// The queue's rows visible at `snapshot`: body → position.
fn queue_scan(tablet: &Tablet, snapshot: Timestamp) -> BTreeMap<String, i64> {
    let spec = ScanSpec {
        projection: None,
        predicates: vec![],
        snapshot,
        limit: None,
        batch_size: 64,
        string_views: false,
        changes_since: None,
    };
    let mut rows = BTreeMap::new();
    for batch in tablet.scan(&spec).unwrap() {
        let batch = batch.unwrap();
        let positions = batch.column(1).as_primitive::<Int64Type>();
        let bodies = batch.column(2).as_string::<i32>();
        for (body, pos) in bodies.iter().zip(positions.values()) {
            assert!(
                rows.insert(body.unwrap().to_string(), *pos).is_none(),
                "twice"
            );
        }
    }
    rows
}

/// Transactions inserting into one queue tablet are prepared, decided and committed in any
/// order, beside plain inserts, aborts, flushes and reopens: rows take positions in the order
/// they become visible, so a reader at any snapshot the replica lets it read at never sees a
/// position above one that appears later. Checked against a model of what was committed when.
#[test]
fn queue_rows_take_positions_in_the_order_they_become_visible() {
    for seed in 0..6 {
        run_queue_turns(seed, 400);
    }
}

fn run_queue_turns(seed: u64, steps: u64) {
    let dir = tempfile::tempdir().unwrap();
    let options = TabletOptions::default();
    let mut tablet = Tablet::create(dir.path(), queue_schema(), options.clone()).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut clock = now().0;
    // Open transactions: their bodies and prepare timestamp.
    let mut open: BTreeMap<u64, (Vec<String>, Option<u64>)> = BTreeMap::new();
    // Committed bodies, with the timestamp they are visible at.
    let mut committed: BTreeMap<String, u64> = BTreeMap::new();
    let mut held = std::collections::BTreeSet::new();
    let (mut next_txn, mut next_body) = (1u64, 0u64);
    // What the last read saw, and the highest position it saw.
    let (mut seen, mut seen_max) = (BTreeMap::new(), i64::MIN);
    for index in 1..=steps {
        clock += rng.random_range(1..4);
        let ts = clock;
        let mut bodies = |rng: &mut StdRng| -> Vec<String> {
            (0..rng.random_range(1..4))
                .map(|_| {
                    next_body += 1;
                    format!("b{next_body}")
                })
                .collect()
        };
        let unprepared: Vec<u64> = (open.iter().filter(|(_, t)| t.1.is_none()))
            .map(|(&id, _)| id)
            .collect();
        let prepared: Vec<u64> = (open.iter().filter(|(_, t)| t.1.is_some()))
            .map(|(&id, _)| id)
            .collect();
        match rng.random_range(0..10) {
            0..=2 => {
                let txn = match unprepared.is_empty() || rng.random_bool(0.5) {
                    true => {
                        next_txn += 1;
                        next_txn
                    }
                    false => unprepared[rng.random_range(0..unprepared.len())],
                };
                let new = bodies(&mut rng);
                tablet
                    .apply_txn_write(index, Timestamp(ts), txn, &queue_rows(&new))
                    .unwrap();
                open.entry(txn).or_default().0.extend(new);
            }
            3 | 4 if !unprepared.is_empty() => {
                let txn = unprepared[rng.random_range(0..unprepared.len())];
                tablet.prepare_txn(index, Timestamp(ts), txn).unwrap();
                open.get_mut(&txn).unwrap().1 = Some(ts);
            }
            5 | 6 if !prepared.is_empty() => {
                // The commit timestamp: the newest of the participants' prepares, at most now.
                let txn = prepared[rng.random_range(0..prepared.len())];
                let (new, p) = open.remove(&txn).unwrap();
                let at = rng.random_range(p.unwrap()..=clock);
                tablet.commit_txn(index, Timestamp(at), txn).unwrap();
                committed.extend(new.into_iter().map(|b| (b, at)));
            }
            7 if !unprepared.is_empty() => {
                // One participant: it commits at the commit entry's own timestamp.
                let txn = unprepared[rng.random_range(0..unprepared.len())];
                let (new, _) = open.remove(&txn).unwrap();
                tablet.commit_txn(index, Timestamp(ts), txn).unwrap();
                committed.extend(new.into_iter().map(|b| (b, ts)));
            }
            8 if !open.is_empty() => {
                let txns: Vec<u64> = open.keys().copied().collect();
                let txn = txns[rng.random_range(0..txns.len())];
                open.remove(&txn);
                tablet.abort_txn(index, txn).unwrap();
            }
            9 => {
                tablet.flush().unwrap();
                if rng.random_bool(0.5) {
                    drop(tablet);
                    tablet = Tablet::open(dir.path(), options.clone()).unwrap();
                    held.clear();
                }
            }
            _ => {
                let new = bodies(&mut rng);
                tablet
                    .apply(index, Timestamp(ts), &queue_rows(&new))
                    .unwrap();
                committed.extend(new.into_iter().map(|b| (b, ts)));
            }
        }
        let holds = tablet.take_holds();
        held.extend(holds.hold.iter().map(|t| t.0));
        for t in &holds.release {
            assert!(held.remove(&t.0), "seed {seed}: released {t:?}, never held");
        }
        // The newest snapshot the replica lets a scan read at without waiting.
        let snapshot = held.first().map_or(clock, |&h| h - 1);
        let visible = queue_scan(&tablet, Timestamp(snapshot));
        for (body, &at) in &committed {
            assert_eq!(
                visible.contains_key(body),
                at <= snapshot,
                "seed {seed}, entry {index}: {body} committed at {at}, read at {snapshot}"
            );
        }
        for (body, &pos) in &visible {
            assert!(
                pos > seen_max || seen.contains_key(body),
                "seed {seed}, entry {index}: {body} appeared at position {pos}, below {seen_max} seen before"
            );
        }
        seen_max = seen_max.max(visible.values().copied().max().unwrap_or(i64::MIN));
        seen = visible;
    }
    // Everything decided: no snapshot is held back, and positions follow visibility.
    for (index, (&txn, (new, p))) in (steps + 1..).zip(&open) {
        match p {
            Some(_) => {
                tablet.commit_txn(index, Timestamp(clock), txn).unwrap();
                committed.extend(new.iter().map(|b| (b.clone(), clock)));
            }
            None => tablet.abort_txn(index, txn).unwrap(),
        }
    }
    let holds = tablet.take_holds();
    held.extend(holds.hold.iter().map(|t| t.0));
    for t in &holds.release {
        held.remove(&t.0);
    }
    assert!(held.is_empty(), "seed {seed}: still held {held:?}");
    let all = queue_scan(&tablet, Timestamp(u64::MAX));
    assert_eq!(all.len(), committed.len(), "seed {seed}");
    let mut by_position: Vec<(i64, u64)> = (all.iter()).map(|(b, &p)| (p, committed[b])).collect();
    by_position.sort();
    assert!(
        by_position.windows(2).all(|w| w[0].1 <= w[1].1),
        "seed {seed}: a later position became visible earlier"
    );
}

/// A scan of one queue from a position on (a tail: `queue = q AND pos > p`) reads only that
/// queue's keys from the MemRowSet; it returns what a scan of everything returns filtered, for
/// queue names that are prefixes of one another, hold zero bytes or are empty, with rows in
/// the MemRowSet and in flushed rowsets.
#[test]
fn a_scan_of_one_queue_returns_its_rows_after_a_position() {
    let names = ["a", "ab", "a\0b", "", "b", "\u{ff}x"];
    let dir = tempfile::tempdir().unwrap();
    let tablet = Tablet::create(dir.path(), queue_schema(), TabletOptions::default()).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let mut clock = now().0;
    let scan = |snapshot: u64, predicates: Vec<ColumnPredicate>| -> Vec<(String, i64)> {
        let spec = ScanSpec {
            projection: None,
            predicates,
            snapshot: Timestamp(snapshot),
            limit: None,
            batch_size: 64,
            string_views: false,
            changes_since: None,
        };
        let mut rows = vec![];
        for batch in tablet.scan(&spec).unwrap() {
            let batch = batch.unwrap();
            let queues = batch.column(0).as_string::<i32>();
            let positions = batch.column(1).as_primitive::<Int64Type>();
            rows.extend(
                queues
                    .iter()
                    .zip(positions.values())
                    .map(|(q, p)| (q.unwrap().to_string(), *p)),
            );
        }
        rows
    };
    for index in 1..=120u64 {
        clock += 1;
        if rng.random_range(0..10) == 0 {
            tablet.flush().unwrap();
            continue;
        }
        let queue = names[rng.random_range(0..names.len())];
        let n = rng.random_range(1..20);
        let schema = Arc::new(arrow::datatypes::Schema::new(vec![
            arrow::datatypes::Field::new("queue", arrow::datatypes::DataType::Utf8, false),
            arrow::datatypes::Field::new("body", arrow::datatypes::DataType::Utf8, false),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec![queue; n])),
            Arc::new(StringArray::from(vec!["m"; n])),
        ];
        let rows = RecordBatch::try_new(schema, columns).unwrap();
        tablet
            .apply(
                index,
                Timestamp(clock),
                &WriteBatch::new(WriteKind::Insert, rows),
            )
            .unwrap();
        let all = scan(clock, vec![]);
        for queue in names {
            let positions: Vec<i64> = (all.iter().filter(|(q, _)| q == queue))
                .map(|(_, p)| *p)
                .collect();
            let after = match positions.is_empty() {
                true => 0,
                false => positions[rng.random_range(0..positions.len())] - rng.random_range(0..2),
            };
            let predicates = vec![
                ColumnPredicate {
                    column: 0,
                    op: PredicateOp::Eq(Scalar(Arc::new(StringArray::from(vec![queue])))),
                },
                ColumnPredicate {
                    column: 1,
                    op: PredicateOp::Gt(Scalar(Arc::new(Int64Array::from(vec![after])))),
                },
            ];
            let want: Vec<(String, i64)> = (all.iter().filter(|(q, p)| q == queue && *p > after))
                .cloned()
                .collect();
            assert_eq!(
                scan(clock, predicates),
                want,
                "queue {queue:?} after {after}"
            );
        }
    }
}

/// Array columns through every way rows move: the MemRowSet, flushes, per-column updates in
/// delta stores and delta files, a major delta compaction (a column file of arrays), a rowset
/// compaction and reopening; each snapshot reads the same arrays throughout, and an array
/// cannot be a key.
#[test]
fn arrays_survive_flushes_compactions_and_reopening() {
    use arrow::array::{ListArray, ListBuilder, StringBuilder};
    type Tags = Option<Vec<Option<String>>>;
    type Rows = BTreeMap<i64, Tags>;
    let col = |name: &str, column_type, nullable| ColumnSchema::new(name, column_type, nullable);
    let array = ColumnType::Array(Box::new(ColumnType::String));
    let e = Schema::new(vec![col("tags", array.clone(), false)], vec![0]).unwrap_err();
    assert!(
        e.to_string().contains("cannot be part of the primary key"),
        "{e}"
    );
    let schema = Schema::new(
        vec![
            col("k", ColumnType::Int64, false),
            col("tags", array, true),
            col("n", ColumnType::Int64, false),
        ],
        vec![0],
    )
    .unwrap();
    let batch = |rows: &[(i64, Tags)]| {
        let mut tags = ListBuilder::new(StringBuilder::new());
        for (_, t) in rows {
            match t {
                None => tags.append_null(),
                Some(values) => {
                    for v in values {
                        tags.values().append_option(v.as_deref());
                    }
                    tags.append(true);
                }
            }
        }
        let keys = Int64Array::from_iter_values(rows.iter().map(|r| r.0));
        let n = Int64Array::from_iter_values(rows.iter().map(|r| r.0 * 10));
        RecordBatch::try_new(
            schema.arrow_schema(),
            vec![
                Arc::new(keys) as ArrayRef,
                Arc::new(tags.finish()),
                Arc::new(n),
            ],
        )
        .unwrap()
    };
    let scan = |tablet: &Tablet, snapshot| -> Rows {
        let spec = ScanSpec {
            projection: Some(vec![0, 1]),
            predicates: vec![],
            snapshot,
            limit: None,
            batch_size: 100,
            string_views: false,
            changes_since: None,
        };
        let mut out = Rows::new();
        for batch in tablet.scan(&spec).unwrap() {
            let batch = batch.unwrap();
            let keys = batch.column(0).as_primitive::<Int64Type>();
            let lists: &ListArray = batch.column(1).as_list();
            for i in 0..batch.num_rows() {
                let tags = lists.is_valid(i).then(|| {
                    let values = lists.value(i);
                    let strings =
                        arrow::compute::cast(&values, &arrow::datatypes::DataType::Utf8).unwrap();
                    (strings.as_string::<i32>().iter())
                        .map(|s| s.map(str::to_string))
                        .collect()
                });
                out.insert(keys.value(i), tags);
            }
        }
        out
    };
    let tags_of = |k: i64, round: i64| -> Tags {
        match k % 4 {
            0 => None,
            1 => Some(vec![]),
            2 => Some(vec![Some(format!("t{k}")), None]),
            _ => Some(
                (0..(k + round) % 5)
                    .map(|i| Some(format!("{round}-{i}")))
                    .collect(),
            ),
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let options = TabletOptions {
        flush_threshold_bytes: 1 << 30,
        ..TabletOptions::default()
    };
    let mut tablet = Tablet::create(dir.path(), schema.clone(), options.clone()).unwrap();
    let mut index = 0;
    let mut snapshots: Vec<(Timestamp, Rows)> = Vec::new();
    let mut expected = Rows::new();
    let mut write = |tablet: &Tablet, kind, rows: Vec<(i64, Tags)>, expected: &mut Rows| {
        index += 1;
        let ts = now();
        let rows_batch = match kind {
            WriteKind::Update => batch(&rows).project(&[0, 1]).unwrap(),
            _ => batch(&rows),
        };
        tablet
            .apply(index, ts, &WriteBatch::new(kind, rows_batch))
            .unwrap();
        expected.extend(rows);
        ts
    };
    // Two overlapping rowsets, then updates of the arrays alone (per-column deltas) in the
    // delta stores and, flushed, in delta files.
    for (start, flush) in [(0, true), (1, true)] {
        let rows = (start..3000)
            .step_by(2)
            .map(|k| (k, tags_of(k, 0)))
            .collect();
        let ts = write(&tablet, WriteKind::Insert, rows, &mut expected);
        snapshots.push((ts, expected.clone()));
        if flush {
            tablet.flush().unwrap();
        }
    }
    for round in 1..3 {
        let rows = (0..3000)
            .step_by(3)
            .map(|k| (k, tags_of(k, round)))
            .collect();
        let ts = write(&tablet, WriteKind::Update, rows, &mut expected);
        snapshots.push((ts, expected.clone()));
        assert_eq!(scan(&tablet, ts), expected, "updates in memory");
        tablet.flush().unwrap();
    }
    let check = |tablet: &Tablet, what: &str| {
        for (ts, rows) in &snapshots {
            assert_eq!(&scan(tablet, *ts), rows, "{what}: at {ts:?}");
        }
    };
    check(&tablet, "after flushes");
    for op in tablet.maintenance_ops() {
        if matches!(op.kind, MaintenanceKind::MergeRedo { .. }) {
            tablet.compact(&op.kind).unwrap();
        }
    }
    check(&tablet, "after merging delta files");
    for op in tablet.maintenance_ops() {
        if matches!(op.kind, MaintenanceKind::ApplyRedo { .. }) {
            tablet.compact(&op.kind).unwrap();
        }
    }
    assert!(
        tablet.column_file_count() > 0,
        "the arrays got column files"
    );
    check(&tablet, "after the major delta compaction");
    drop(tablet);
    tablet = Tablet::open(dir.path(), options).unwrap();
    check(&tablet, "after reopening");
    let rowsets = tablet.rowset_ids();
    tablet
        .compact(&MaintenanceKind::MergeRowsets { rowsets })
        .unwrap();
    check(&tablet, "after the rowset compaction");
}

/// Schema changes interleaved with writes, flushes, compactions and reopening, checked against
/// a model: ADD COLUMN (with or without a DEFAULT), DROP COLUMN and RENAME COLUMN change no
/// file, rows written before read an added column's DEFAULT, and every scan, lookup and
/// predicate (on old and new columns) returns what the model holds. `NYALA_MODEL_ITERS` and
/// `NYALA_MODEL_SEED` as for the other model test.
#[test]
fn random_schema_changes_match_a_model() {
    let iterations = env_or("NYALA_MODEL_ITERS", 400) as usize;
    let seed = env_or("NYALA_MODEL_SEED", 42);
    for seed in seed..seed + 3 {
        run_schema_model(iterations, seed);
    }
}

fn run_schema_model(iterations: usize, seed: u64) {
    // The model: the columns' names, and the values of each row by key.
    type Rows = BTreeMap<i64, Vec<Option<i64>>>;
    let dir = tempfile::tempdir().unwrap();
    let options = TabletOptions {
        flush_threshold_bytes: 1 << 20,
        rowset_target_bytes: 2 << 10,
        ..TabletOptions::default()
    };
    let col = |name: &str, nullable| ColumnSchema::new(name, ColumnType::Int64, nullable);
    let mut schema = Schema::new(vec![col("k", false), col("c0", true)], vec![0]).unwrap();
    let mut columns = vec!["c0".to_string()];
    let mut tablet = Tablet::create(dir.path(), schema.clone(), options.clone()).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut rows = Rows::new();
    let mut index = 0u64;
    let mut next_name = 1;
    let mut changes = 0;
    let batch =
        |schema: &Schema, keys: &[i64], values: &[Vec<Option<i64>>], only: Option<usize>| {
            let mut fields = vec![schema.arrow_schema().field(0).clone()];
            let mut arrays: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(keys.to_vec()))];
            for c in 0..schema.columns().len() - 1 {
                if only.is_some_and(|o| o != c) {
                    continue;
                }
                fields.push(schema.arrow_schema().field(c + 1).clone());
                let column: Vec<Option<i64>> = values.iter().map(|v| v[c]).collect();
                arrays.push(Arc::new(Int64Array::from(column)));
            }
            RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), arrays).unwrap()
        };
    let scan = |tablet: &Tablet, width: usize, predicate: Option<(usize, i64)>| -> Rows {
        let predicates = predicate
            .map(|(c, v)| ColumnPredicate {
                column: c + 1,
                op: PredicateOp::GtEq(Scalar(Arc::new(Int64Array::from(vec![v])))),
            })
            .into_iter()
            .collect();
        let spec = ScanSpec {
            projection: Some((0..=width).rev().collect()),
            predicates,
            snapshot: now(),
            limit: None,
            batch_size: 5,
            string_views: false,
            changes_since: None,
        };
        let mut out = Rows::new();
        for b in tablet.scan(&spec).unwrap() {
            let b = b.unwrap();
            let keys = b.column(width).as_primitive::<Int64Type>().clone();
            for i in 0..b.num_rows() {
                let values = (0..width)
                    .map(|c| {
                        let column = b.column(width - 1 - c).as_primitive::<Int64Type>();
                        column.is_valid(i).then(|| column.value(i))
                    })
                    .collect();
                out.insert(keys.value(i), values);
            }
        }
        out
    };
    for step in 0..iterations {
        index += 1;
        let width = columns.len();
        let op = rng.random_range(0..20);
        if std::env::var("NYALA_MODEL_TRACE").is_ok() {
            eprintln!("step {step}: op {op} columns {columns:?}");
        }
        let keys: Vec<i64> = {
            let mut keys: Vec<i64> = (0..rng.random_range(1..8))
                .map(|_| rng.random_range(0..60))
                .collect();
            keys.sort_unstable();
            keys.dedup();
            keys
        };
        let values: Vec<Vec<Option<i64>>> = keys
            .iter()
            .map(|_| {
                (0..width)
                    .map(|_| rng.random_bool(0.8).then(|| rng.random_range(-50..50)))
                    .collect()
            })
            .collect();
        match op {
            0..=5 => {
                let batch = batch(&schema, &keys, &values, None);
                tablet
                    .apply(index, now(), &WriteBatch::new(WriteKind::Upsert, batch))
                    .unwrap();
                rows.extend(keys.iter().copied().zip(values));
            }
            6..=8 => {
                // One column of rows that exist.
                let keys: Vec<i64> = keys.into_iter().filter(|k| rows.contains_key(k)).collect();
                if keys.is_empty() {
                    continue;
                }
                let c = rng.random_range(0..width);
                let values: Vec<Vec<Option<i64>>> = keys
                    .iter()
                    .map(|_| {
                        (0..width)
                            .map(|_| Some(rng.random_range(-50..50)))
                            .collect()
                    })
                    .collect();
                let batch = batch(&schema, &keys, &values, Some(c));
                tablet
                    .apply(index, now(), &WriteBatch::new(WriteKind::Update, batch))
                    .unwrap();
                for (k, v) in keys.iter().zip(values) {
                    rows.get_mut(k).unwrap()[c] = v[c];
                }
            }
            9 => {
                let keys: Vec<i64> = keys.into_iter().filter(|k| rows.contains_key(k)).collect();
                if keys.is_empty() {
                    continue;
                }
                let batch = RecordBatch::try_new(
                    Arc::new(arrow::datatypes::Schema::new(vec![schema
                        .arrow_schema()
                        .field(0)
                        .clone()])),
                    vec![Arc::new(Int64Array::from(keys.clone()))],
                )
                .unwrap();
                tablet
                    .apply(index, now(), &WriteBatch::new(WriteKind::Delete, batch))
                    .unwrap();
                for k in keys {
                    rows.remove(&k);
                }
            }
            10..=11 => tablet.flush().unwrap(),
            12..=13 => {
                for op in tablet.maintenance_ops().into_iter().take(2) {
                    tablet.compact(&op.kind).unwrap();
                }
            }
            14 => {
                // A clean shutdown (the log replay of unflushed writes is the engine's).
                tablet.flush().unwrap();
                drop(tablet);
                tablet = Tablet::open(dir.path(), options.clone()).unwrap();
            }
            15..=16 => {
                // ADD COLUMN, with a DEFAULT or without.
                let default = rng.random_bool(0.5).then(|| rng.random_range(-50..50));
                let name = format!("c{next_name}");
                next_name += 1;
                let column = ColumnSchema {
                    default: default.map(|d| d.to_string()),
                    ..col(&name, true)
                };
                schema = schema.with_column_added(column).unwrap();
                tablet.alter_schema(index, &schema).unwrap();
                columns.push(name);
                for values in rows.values_mut() {
                    values.push(default);
                }
                changes += 1;
            }
            17 if width > 1 => {
                let c = rng.random_range(0..width);
                schema = schema.with_column_dropped(&columns[c]).unwrap();
                tablet.alter_schema(index, &schema).unwrap();
                columns.remove(c);
                for values in rows.values_mut() {
                    values.remove(c);
                }
                changes += 1;
            }
            18 => {
                let c = rng.random_range(0..width);
                let name = format!("c{next_name}");
                next_name += 1;
                schema = schema.with_column_renamed(&columns[c], &name).unwrap();
                tablet.alter_schema(index, &schema).unwrap();
                columns[c] = name;
                changes += 1;
            }
            _ => {}
        }
        let width = columns.len();
        assert_eq!(
            scan(&tablet, width, None),
            rows,
            "seed {seed} step {step}: scan"
        );
        let c = rng.random_range(0..width);
        let at_least = rng.random_range(-50..50);
        let passing: Rows = (rows.iter())
            .filter(|(_, v)| v[c].is_some_and(|x| x >= at_least))
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        assert_eq!(
            scan(&tablet, width, Some((c, at_least))),
            passing,
            "seed {seed} step {step}: {} >= {at_least}",
            columns[c]
        );
    }
    assert!(changes > 10, "seed {seed}: only {changes} schema changes");
    // The model's columns are the tablet's, under their names, after a last reopen.
    tablet.flush().unwrap();
    drop(tablet);
    let tablet = Tablet::open(dir.path(), options).unwrap();
    let names: Vec<String> = (tablet.schema().columns().iter().skip(1))
        .map(|c| c.name.clone())
        .collect();
    assert_eq!(names, columns);
    assert_eq!(
        scan(&tablet, columns.len(), None),
        rows,
        "seed {seed}: after reopening"
    );
}

/// A schema change rewrites no file: ADD COLUMN on a tablet of flushed rows leaves its files as
/// they are, and the rows read the new column's DEFAULT.
#[test]
fn a_schema_change_rewrites_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let schema = schema();
    let tablet = Tablet::create(dir.path(), schema.clone(), TabletOptions::default()).unwrap();
    let entries: Vec<_> = (0..5000).map(|k| (k, Some(format!("s{k}")), k)).collect();
    let rows = rows(&schema, &entries);
    tablet
        .apply(1, now(), &WriteBatch::new(WriteKind::Insert, rows))
        .unwrap();
    tablet.flush().unwrap();
    let files = || -> Vec<(String, std::time::SystemTime)> {
        let mut files: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name() != "metadata")
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into(),
                    e.metadata().unwrap().modified().unwrap(),
                )
            })
            .collect();
        files.sort();
        files
    };
    let before = files();
    let added = ColumnSchema {
        default: Some("7".into()),
        ..ColumnSchema::new("w", ColumnType::Int64, false)
    };
    let changed = schema.with_column_added(added).unwrap();
    tablet.alter_schema(2, &changed).unwrap();
    let changed = changed.with_column_dropped("s").unwrap();
    tablet.alter_schema(3, &changed).unwrap();
    assert_eq!(files(), before, "no file written or rewritten");
    drop(tablet);
    let tablet = Tablet::open(dir.path(), TabletOptions::default()).unwrap();
    let spec = ScanSpec {
        projection: None,
        predicates: vec![],
        snapshot: now(),
        limit: None,
        batch_size: 1000,
        string_views: false,
        changes_since: None,
    };
    let mut n = 0;
    for b in tablet.scan(&spec).unwrap() {
        let b = b.unwrap();
        assert_eq!(b.num_columns(), 3);
        let w = b.column(2).as_primitive::<Int64Type>();
        assert!(w.iter().all(|v| v == Some(7)));
        n += b.num_rows();
    }
    assert_eq!(n, 5000);
}

/// Rows only ever inserted are read as the batches they came in, without a look at each key;
/// each write that ends that (a row skipped or superseded in its batch, a second version of a
/// key, a deletion) and each older snapshot reads through the index. Every scan, at the newest
/// snapshot and at each earlier one, has the model's rows.
#[test]
fn inserted_batches_read_whole_match_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let schema = schema();
    let tablet = Tablet::create(dir.path(), schema.clone(), TabletOptions::default()).unwrap();
    let entry = |k: i64, v: i64| (k, Some(format!("s{k}")), v);
    let steps: Vec<(WriteKind, Vec<(i64, Option<String>, i64)>)> = vec![
        (WriteKind::Insert, (0..100).map(|k| entry(k, k)).collect()),
        (
            WriteKind::Upsert,
            (100..150).map(|k| entry(k, -k)).collect(),
        ),
        (WriteKind::InsertIgnore, vec![entry(150, 1), entry(5, 2)]),
        (WriteKind::Insert, (200..210).map(|k| entry(k, k)).collect()),
        (WriteKind::Upsert, vec![entry(300, 1), entry(300, 2)]),
        (WriteKind::Update, vec![entry(7, 70)]),
        (WriteKind::Delete, vec![entry(8, 0)]),
        (WriteKind::Insert, (400..420).map(|k| entry(k, k)).collect()),
    ];
    let mut model = Model::new();
    let mut history: Vec<(Timestamp, Model)> = Vec::new();
    let mut ts = now().0;
    for (index, (kind, entries)) in steps.into_iter().enumerate() {
        ts += 1;
        for (k, s, v) in &entries {
            match kind {
                WriteKind::InsertIgnore => {
                    model.entry(*k).or_insert((s.clone(), *v));
                }
                WriteKind::Update => model.get_mut(k).unwrap().1 = *v,
                WriteKind::Delete => {
                    model.remove(k);
                }
                _ => {
                    model.insert(*k, (s.clone(), *v));
                }
            }
        }
        let batch = rows(&schema, &entries);
        let batch = match kind {
            WriteKind::Update => batch.project(&[1, 2]).unwrap(),
            WriteKind::Delete => batch.project(&[1]).unwrap(),
            _ => batch,
        };
        let written = tablet.apply(
            index as u64 + 1,
            Timestamp(ts),
            &WriteBatch::new(kind, batch),
        );
        assert!(written.is_ok(), "{kind:?}: {written:?}");
        history.push((Timestamp(ts), model.clone()));
        assert_eq!(
            scan(&tablet, Timestamp(u64::MAX), None),
            model,
            "after {kind:?}"
        );
        for (at, then) in &history {
            assert_eq!(&scan(&tablet, *at, None), then, "at {at:?} after {kind:?}");
        }
        assert_eq!(
            scan(&tablet, Timestamp(u64::MAX), Some(50)),
            model
                .iter()
                .filter(|(_, (_, v))| *v >= 50)
                .map(|(k, v)| (*k, v.clone()))
                .collect(),
        );
    }
    // Flushed, then inserted again: the new MemRowSet's batches are read whole once more.
    tablet.flush().unwrap();
    ts += 1;
    let more: Vec<_> = (500..520).map(|k| entry(k, k)).collect();
    for (k, s, v) in &more {
        model.insert(*k, (s.clone(), *v));
    }
    let batch = WriteBatch::new(WriteKind::Insert, rows(&schema, &more));
    tablet.apply(100, Timestamp(ts), &batch).unwrap();
    assert_eq!(scan(&tablet, Timestamp(u64::MAX), None), model);
}
