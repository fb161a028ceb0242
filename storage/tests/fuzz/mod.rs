//! Fuzz targets: a flushed and compacted tablet's files (DiskRowSet and column files, UNDO and
//! REDO delta files, the tablet metadata) damaged — bytes flipped, cut, inserted, sometimes with
//! the checksum in the metadata made to match so that the Parquet readers see the damage; the
//! metadata's JSON edited field by field — and the tablet opened, scanned, written, flushed and
//! compacted. Each step may fail with an error; none may panic. See the `nyala-fuzzing` crate
//! for the budget (`NYALA_FUZZ_SECS`, `NYALA_FUZZ_SEED`, ...):
//! `NYALA_FUZZ_SECS=600 cargo test --release -p nyala-storage --test model fuzz_`.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arrow::array::{Int64Array, RecordBatch};
use nyala_fuzzing::{some_edits, ByteEdit, Fuzz, Num, Unstructured};
use nyala_storage::{
    ColumnCompression, ColumnEncoding, ColumnPredicate, ColumnSchema, ColumnType, MaintenanceKind,
    PredicateOp, Scalar, ScanSpec, Schema, Tablet, TabletOptions, Timestamp, WriteBatch, WriteKind,
};
use serde_json::Value;

use super::rows;

fn options() -> TabletOptions {
    TabletOptions {
        flush_threshold_bytes: 1 << 30,
        // The fixed timestamps below (1970) stay within the history: nothing is dropped.
        history_max_age: Duration::from_secs(100 * 365 * 24 * 3600),
        ..TabletOptions::default()
    }
}

/// The model test's columns (s, k, v), stored with several encodings and compressions.
fn schema() -> Schema {
    let column = |name: &str, column_type, nullable, encoding, compression| ColumnSchema {
        encoding,
        compression,
        ..ColumnSchema::new(name, column_type, nullable)
    };
    Schema::new(
        vec![
            column(
                "s",
                ColumnType::String,
                true,
                ColumnEncoding::Prefix,
                ColumnCompression::Zstd,
            ),
            column(
                "k",
                ColumnType::Int64,
                false,
                ColumnEncoding::Delta,
                ColumnCompression::Default,
            ),
            column(
                "v",
                ColumnType::Int64,
                false,
                ColumnEncoding::BitShuffle,
                ColumnCompression::None,
            ),
        ],
        vec![1],
    )
    .unwrap()
}

fn ts(n: u64) -> Timestamp {
    Timestamp::from_micros(n * 1_000_000)
}

/// The files of a tablet (name, bytes): two overlapping rowsets, updates and deletes flushed
/// as REDO files, a major delta compaction's column files and per-column UNDO files, and REDO
/// files after those. Timestamps are fixed, so the files are the same on every run.
fn valid_tablet() -> &'static Vec<(String, Vec<u8>)> {
    static FILES: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    FILES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let schema = schema();
        let tablet = Tablet::create(dir.path(), schema.clone(), options()).unwrap();
        let entry = |k: i64| (k, Some(format!("s{}", k % 7)), k);
        let steps: [(WriteKind, Vec<_>); 6] = [
            (WriteKind::Insert, (0..600).step_by(2).map(entry).collect()),
            (WriteKind::Insert, (1..600).step_by(2).map(entry).collect()),
            (
                WriteKind::Update,
                (0..600).step_by(5).map(|k| (k, None, -k)).collect(),
            ),
            (WriteKind::Delete, vec![entry(20), entry(21)]),
            (WriteKind::Upsert, vec![entry(21), entry(1000)]),
            (
                WriteKind::Update,
                (40..600).step_by(20).map(|k| (k, None, 7)).collect(),
            ),
        ];
        for (i, (kind, entries)) in steps.into_iter().enumerate() {
            let batch = rows(&schema, &entries);
            let rows = match kind {
                WriteKind::Update => batch.project(&[1, 2]).unwrap(),
                WriteKind::Delete => batch.project(&[1]).unwrap(),
                _ => batch,
            };
            let index = i as u64 + 1;
            tablet
                .apply(index, ts(index), &WriteBatch::new(kind, rows))
                .unwrap();
            tablet.flush().unwrap();
            if i == 4 {
                for op in tablet.maintenance_ops() {
                    if matches!(op.kind, MaintenanceKind::ApplyRedo { .. }) {
                        tablet.compact(&op.kind).unwrap();
                    }
                }
            }
        }
        assert!(tablet.column_file_count() > 0 && tablet.delta_file_count() > 2);
        drop(tablet);
        nyala_fuzzing::files_in(dir.path())
    })
}

/// One damage to the tablet's files.
#[derive(Debug)]
enum Damage {
    /// Raw bytes of a file (the metadata too). With `fix_checksum`, the checksum the metadata
    /// keeps of it is made to match, so that the damage reaches the reader.
    Bytes {
        file: String,
        edits: Vec<ByteEdit>,
        fix_checksum: bool,
    },
    /// One value of the metadata's JSON (a JSON pointer) replaced or removed; the metadata's
    /// CRC made to match.
    Metadata {
        at: String,
        edit: JsonEdit,
    },
    Remove {
        file: String,
    },
}

#[derive(Debug)]
enum JsonEdit {
    Number(Num),
    Negative(i8),
    Text(String),
    Bool(bool),
    Null,
    EmptyArray,
    EmptyObject,
    /// The value at another pointer.
    CopyOf(String),
    /// Removed from its object or array.
    Remove,
}

/// JSON pointers to every value in `value`, depth first (objects and arrays too).
fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
    let escape = |key: &str| key.replace('~', "~0").replace('/', "~1");
    match value {
        Value::Object(map) => map
            .iter()
            .for_each(|(k, v)| pointers(v, format!("{at}/{}", escape(k)), out)),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .for_each(|(i, v)| pointers(v, format!("{at}/{i}"), out)),
        _ => {}
    }
    out.push(at);
}

/// Damage to the valid tablet's files: mostly to a Parquet file with its checksum made to
/// match, else raw bytes of any file, a metadata value, or a file removed.
fn damage(u: &mut Unstructured) -> arbitrary::Result<Damage> {
    let files = valid_tablet();
    let file = |u: &mut Unstructured, parquet: bool| -> arbitrary::Result<String> {
        let names: Vec<&String> = (files.iter().map(|(n, _)| n))
            .filter(|n| !parquet || n.ends_with(".parquet"))
            .collect();
        Ok(u.choose(&names)?.to_string())
    };
    let json = metadata_json(&files.iter().find(|(n, _)| n == "metadata").unwrap().1).unwrap();
    let mut all = Vec::new();
    pointers(&json, String::new(), &mut all);
    Ok(match u.int_in_range(0..=19)? {
        0..=8 => Damage::Bytes {
            file: file(u, true)?,
            edits: some_edits(u, 3)?,
            fix_checksum: true,
        },
        9..=11 => Damage::Bytes {
            file: file(u, false)?,
            edits: some_edits(u, 3)?,
            fix_checksum: u.arbitrary()?,
        },
        12..=17 => Damage::Metadata {
            at: u.choose(&all)?.clone(),
            edit: match u.int_in_range(0..=8)? {
                0 => JsonEdit::Number(u.arbitrary()?),
                1 => JsonEdit::Negative(u.arbitrary()?),
                2 => JsonEdit::Text(u.arbitrary()?),
                3 => JsonEdit::Bool(u.arbitrary()?),
                4 => JsonEdit::Null,
                5 => JsonEdit::EmptyArray,
                6 => JsonEdit::EmptyObject,
                7 => JsonEdit::CopyOf(u.choose(&all)?.clone()),
                _ => JsonEdit::Remove,
            },
        },
        _ => Damage::Remove {
            file: file(u, false)?,
        },
    })
}

fn input(u: &mut Unstructured) -> arbitrary::Result<Vec<Damage>> {
    let n = u.int_in_range(1..=3)?;
    (0..n).map(|_| damage(u)).collect()
}

/// The JSON of a metadata file and back (behind the CRC line `tablet/metadata.rs` writes).
fn metadata_json(bytes: &[u8]) -> Option<Value> {
    serde_json::from_slice(bytes.get(9..)?).ok()
}

fn metadata_bytes(json: &Value) -> Vec<u8> {
    let json = serde_json::to_vec(json).unwrap();
    let mut out = format!("{:08x}\n", crc32fast::hash(&json)).into_bytes();
    out.extend_from_slice(&json);
    out
}

fn edit_json(root: &mut Value, at: &str, edit: &JsonEdit) {
    let new = match edit {
        JsonEdit::Number(n) => {
            let current = root.pointer(at).and_then(Value::as_u64).unwrap_or(0);
            Value::from(n.apply(current))
        }
        JsonEdit::Negative(n) => Value::from(-(*n as i64).abs() - 1),
        JsonEdit::Text(s) => Value::from(s.clone()),
        JsonEdit::Bool(b) => Value::from(*b),
        JsonEdit::Null => Value::Null,
        JsonEdit::EmptyArray => Value::Array(vec![]),
        JsonEdit::EmptyObject => Value::Object(Default::default()),
        JsonEdit::CopyOf(other) => root.pointer(other).cloned().unwrap_or_default(),
        JsonEdit::Remove => {
            let Some((parent, last)) = at.rsplit_once('/') else {
                return;
            };
            let last = last.replace("~1", "/").replace("~0", "~");
            match root.pointer_mut(parent) {
                Some(Value::Object(map)) => {
                    map.remove(&last);
                }
                Some(Value::Array(items)) => {
                    if let Some(i) = last.parse().ok().filter(|&i: &usize| i < items.len()) {
                        items.remove(i);
                    }
                }
                _ => {}
            }
            return;
        }
    };
    if let Some(target) = root.pointer_mut(at) {
        *target = new;
    }
}

/// Replaces every number `old` in the metadata with `new` (checksums are the only such
/// numbers: 32 random bits).
fn replace_checksum(value: &mut Value, old: u32, new: u32) {
    match value {
        Value::Number(n) if n.as_u64() == Some(old as u64) => *value = Value::from(new),
        Value::Array(items) => items.iter_mut().for_each(|v| replace_checksum(v, old, new)),
        Value::Object(map) => map.values_mut().for_each(|v| replace_checksum(v, old, new)),
        _ => {}
    }
}

/// `files` (the metadata among them) with `damage` done to them.
fn damaged(mut files: Vec<(String, Vec<u8>)>, damage: &[Damage]) -> Vec<(String, Vec<u8>)> {
    let position =
        |files: &[(String, Vec<u8>)], name: &str| files.iter().position(|(n, _)| n == name);
    // Edits the metadata's JSON, if it is still JSON.
    let with_metadata = |files: &mut Vec<(String, Vec<u8>)>, edit: &dyn Fn(&mut Value)| {
        let Some(m) = position(files, "metadata") else {
            return;
        };
        if let Some(mut json) = metadata_json(&files[m].1) {
            edit(&mut json);
            files[m].1 = metadata_bytes(&json);
        }
    };
    for damage in damage {
        match damage {
            Damage::Bytes {
                file,
                edits,
                fix_checksum,
            } => {
                let Some(at) = position(&files, file) else {
                    continue;
                };
                let old = crc32fast::hash(&files[at].1);
                edits.iter().for_each(|e| e.apply(&mut files[at].1));
                let new = crc32fast::hash(&files[at].1);
                if *fix_checksum && file != "metadata" {
                    with_metadata(&mut files, &|json| replace_checksum(json, old, new));
                }
            }
            Damage::Metadata { at, edit } => {
                with_metadata(&mut files, &|json| edit_json(json, at, edit));
            }
            Damage::Remove { file } => files.retain(|(n, _)| n != file),
        }
    }
    files
}

/// Reads everything at a few snapshots: full scans, a predicate, key lookups. Errors are fine.
fn read_all(tablet: &Tablet) {
    let key = |k: i64| Scalar(Arc::new(Int64Array::from(vec![k])));
    for snapshot in [ts(2), ts(4), Timestamp(u64::MAX)] {
        let lookups = [0, 10, 21, 599, 1000].map(key).to_vec();
        let predicates = [
            vec![],
            vec![ColumnPredicate {
                column: 2,
                op: PredicateOp::GtEq(key(5)),
            }],
            vec![ColumnPredicate {
                column: 1,
                op: PredicateOp::InList(lookups),
            }],
        ];
        for predicates in predicates {
            let spec = ScanSpec {
                projection: None,
                predicates,
                snapshot,
                limit: None,
                batch_size: 100,
                string_views: false,
                changes_since: None,
            };
            if let Ok(batches) = tablet.scan(&spec) {
                batches.for_each(drop);
            }
        }
    }
}

/// Opens the damaged tablet in `dir`; if it opens: reads, a write, a flush, compactions,
/// reads again, and a reopen. The error of the first open, if any.
fn open_and_use(dir: &Path) -> Option<nyala_storage::StorageError> {
    let tablet = match Tablet::open(dir, options()) {
        Ok(tablet) => tablet,
        Err(e) => return Some(e),
    };
    read_all(&tablet);
    // A row of the valid schema (s, k, v): the damaged metadata's may differ.
    let row = rows(&schema(), &[(2000, Some("new".to_string()), 1)]);
    if let Ok(rows) = RecordBatch::try_new(tablet.schema().arrow_schema(), row.columns().to_vec()) {
        let index = tablet.durable_index().saturating_add(1);
        let batch = WriteBatch::new(WriteKind::Upsert, rows);
        let _ = tablet.apply(index, ts(7), &batch);
    }
    let _ = tablet.flush();
    for op in tablet.maintenance_ops() {
        let _ = tablet.compact(&op.kind);
    }
    read_all(&tablet);
    drop(tablet);
    if let Ok(tablet) = Tablet::open(dir, options()) {
        read_all(&tablet);
    }
    None
}

fn check(damage: Vec<Damage>) -> Option<nyala_storage::StorageError> {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in damaged(valid_tablet().clone(), &damage) {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    open_and_use(dir.path())
}

#[test]
fn fuzz_damaged_tablet_files_are_errors() {
    Fuzz::new("tablet_files", 400).run(input, |damage| {
        check(damage);
    });
}

/// What the fuzz test found, shrunk: each input was a panic, now an error saying what is
/// damaged (or, where the damage reaches only a read, a failed read).
#[test]
fn fuzz_findings_are_errors() {
    use nyala_fuzzing::{Boundary, Width};
    let metadata = |at: &str, edit| Damage::Metadata {
        at: at.into(),
        edit,
    };
    let bytes = |file: &str, edits| Damage::Bytes {
        file: file.into(),
        edits,
        fix_checksum: true,
    };
    let open_error = |damage: Damage, expected: &str| {
        let found = check(vec![damage])
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            found.contains(expected),
            "expected {expected:?}, found {found:?}"
        );
    };
    // A schema without key columns: `key_columns[0]` panicked opening the rowsets.
    open_error(
        metadata("/schema/key_columns", JsonEdit::EmptyArray),
        "a table needs a primary key",
    );
    // A REDO file said to hold no table columns: a compaction indexed the columns it lacked.
    open_error(
        metadata("/deltas/1/redo/0/columns", JsonEdit::EmptyArray),
        "does not hold the columns",
    );
    // Damaged `ARROW:schema` in a footer (checksum matching): arrow-ipc panicked decoding it
    // (`Int type with bit width ... not supported`, `Type <UNKNOWN 133> not supported`).
    for damage in [
        bytes(
            "delta-0000000013.parquet",
            vec![
                ByteEdit::SetInt {
                    at: 7911936,
                    width: Width::W1,
                    value: Boundary::Zero,
                },
                ByteEdit::SetInt {
                    at: 0,
                    width: Width::W1,
                    value: Boundary::Zero,
                },
                ByteEdit::FlipBit {
                    at: 877447005,
                    bit: 123,
                },
            ],
        ),
        bytes(
            "rowset-0000000003.parquet",
            vec![
                ByteEdit::Insert {
                    at: 2684391424,
                    bytes: vec![0, 0, 0, 0],
                },
                ByteEdit::FlipBit {
                    at: 1170037617,
                    bit: 0,
                },
                ByteEdit::FlipBit { at: 0, bit: 0 },
            ],
        ),
    ] {
        open_error(damage, "cannot be read");
    }
    // A damaged page offset (checksum matching): parquet's page reader panicked subtracting
    // (`attempt to subtract with overflow`, serialized_reader.rs) reading the REDO records.
    let damage = bytes(
        "delta-0000000012.parquet",
        vec![ByteEdit::FlipBit {
            at: 1195135418,
            bit: 0,
        }],
    );
    open_error(damage, "cannot be read");
    // A REDO record of an ordinal beyond the rowset's rows: computing the rows a scan skips
    // underflowed. Now the tablet opens and scans.
    let damage = bytes(
        "delta-0000000010.parquet",
        vec![ByteEdit::SetInt {
            at: 2982596459,
            width: Width::W1,
            value: Boundary::SignedMax,
        }],
    );
    assert!(check(vec![damage]).is_none());
}
