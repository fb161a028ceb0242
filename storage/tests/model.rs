//! Randomised model-based test of a tablet: random INSERT/UPSERT/UPDATE/DELETE batches (some of
//! which must be rejected), scans with predicates, snapshot scans, flushes and reopen, all checked
//! against a BTreeMap. `NYALA_MODEL_ITERS` sets the number of steps (default 400).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::Int64Type;
use nyala_storage::{
    ColumnPredicate, ColumnSchema, ColumnType, PredicateOp, Scalar, ScanSpec, Schema, Tablet,
    TabletOptions, Timestamp, WriteBatch, WriteKind,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Model = BTreeMap<i64, (Option<String>, i64)>;

fn schema() -> Schema {
    let col = |name: &str, column_type, nullable| ColumnSchema {
        name: name.into(),
        column_type,
        nullable,
        default: None,
        comment: None,
        encoding: Default::default(),
        compression: Default::default(),
    };
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

fn scan_with(tablet: &Tablet, snapshot: Timestamp, predicates: Vec<ColumnPredicate>) -> Model {
    let spec = ScanSpec {
        projection: Some(vec![1, 0, 2]),
        predicates,
        snapshot,
        limit: None,
        batch_size: 7,
    };
    let mut out = Model::new();
    for batch in tablet.scan(&spec).unwrap() {
        let batch = batch.unwrap();
        let k = batch.column(0).as_primitive::<Int64Type>();
        let s = batch.column(1).as_string::<i32>();
        let v = batch.column(2).as_primitive::<Int64Type>();
        for i in 0..batch.num_rows() {
            let s = (!s.is_null(i)).then(|| s.value(i).to_string());
            assert!(
                out.insert(k.value(i), (s, v.value(i))).is_none(),
                "key {} returned twice",
                k.value(i)
            );
        }
    }
    out
}

#[test]
fn random_operations_match_a_model() {
    let iterations: usize = std::env::var("NYALA_MODEL_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let dir = tempfile::tempdir().unwrap();
    let schema = schema();
    let options = TabletOptions {
        flush_threshold_bytes: 1 << 20,
        rowset_target_bytes: 4 << 10,
    };
    let mut tablet = Tablet::create(dir.path(), schema.clone(), options.clone()).unwrap();
    let mut rng = StdRng::seed_from_u64(42);
    let mut model = Model::new();
    let mut index = 0u64;
    let mut ts = 0u64;
    let mut snapshots: Vec<(Timestamp, Model)> = Vec::new();
    for _ in 0..iterations {
        index += 1;
        ts += 1;
        let n = rng.random_range(1..6);
        let keys: Vec<i64> = (0..n).map(|_| rng.random_range(-40..40)).collect();
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
        let op = rng.random_range(0..9);
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
                snapshots.clear(); // history before a flush is not kept
                continue;
            }
            _ => {
                drop(tablet);
                tablet = Tablet::open(dir.path(), options.clone()).unwrap();
                // Not flushed: the WAL would replay these; here the model forgets them too.
                model = scan(&tablet, Timestamp(u64::MAX), None);
                snapshots.clear();
                continue;
            }
        };
        let result = tablet.apply(index, Timestamp(ts), &WriteBatch { kind, rows: batch });
        assert_eq!(result.is_ok(), expect_ok, "{kind:?} {keys:?}: {result:?}");
        if let (Some(expected), Ok(count)) = (ignored_count, &result) {
            assert_eq!(*count, expected, "rows INSERT IGNORE reports for {keys:?}");
        }
        if !expect_ok {
            assert_eq!(model, before);
        }
        assert_eq!(scan(&tablet, Timestamp(u64::MAX), None), model);
        let min_v = rng.random_range(-100..100);
        let filtered: Model = model
            .iter()
            .filter(|(_, (_, v))| *v >= min_v)
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        assert_eq!(scan(&tablet, Timestamp(u64::MAX), Some(min_v)), filtered);
        snapshots.push((Timestamp(ts), model.clone()));
        if let Some((old_ts, old_model)) = snapshots.get(rng.random_range(0..snapshots.len())) {
            assert_eq!(
                &scan(&tablet, *old_ts, None),
                old_model,
                "snapshot at {old_ts:?}"
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
        }
    }
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
            &WriteBatch {
                kind: WriteKind::Insert,
                rows: rows(&schema, &[(1, None, 1)]),
            },
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
