//! The log's tests: appends, compression, recycled segments, overwrites by new leaders,
//! truncation and reopening, checked against the entries appended.

use std::fs::File;
use std::path::Path;

use raft::eraftpb::Entry;
use raft::Storage as _;

use super::compression::{ENTRIES_SKIPPED, MISSES_BEFORE_SKIPPING};
use super::segment::{spares, SPARE, SPARES};
use super::DurableLog;

fn entry(index: u64, data: Vec<u8>) -> Entry {
    let mut e = Entry::default();
    e.index = index;
    e.term = 1;
    e.data = data.into();
    e
}

/// Large entries are stored compressed where that is smaller, small and incompressible ones
/// as they are, and all of them read back as written.
#[test]
fn entries_are_compressed_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let repetitive = |i: u64| format!("row {i} ").repeat(500).into_bytes();
    let random: Vec<u8> = (0..4000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let entries = vec![
        entry(1, repetitive(1)),
        entry(2, b"tiny".to_vec()),
        entry(3, random.clone()),
        entry(4, repetitive(4)),
    ];
    let raw: usize = entries.iter().map(|e| e.data.len()).sum();
    {
        let mut log = DurableLog::open(dir.path(), &[1], 1 << 20, true).unwrap();
        log.append(&entries).unwrap();
        assert!(
            (log.bytes() as usize) < raw / 2,
            "{} bytes for {raw}",
            log.bytes()
        );
    }
    let log = DurableLog::open(dir.path(), &[1], 1 << 20, true).unwrap();
    let read = log
        .storage()
        .entries(1, 5, u64::MAX, raft::GetEntriesContext::empty(false))
        .unwrap();
    assert_eq!(read, entries);
}

/// A log whose entries do not compress stops trying for a while (they are stored as they
/// are, compressible or not), then tries again; every entry reads back as written.
#[test]
fn a_log_of_incompressible_entries_stops_compressing_for_a_while() {
    let dir = tempfile::tempdir().unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut random = || {
        (0..2000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect::<Vec<u8>>()
    };
    let repetitive = "the same row again ".repeat(100).into_bytes();
    let mut log = DurableLog::open(dir.path(), &[1], 1 << 24, false).unwrap();
    let mut index = 0;
    // The growth of the log by one entry of `data`.
    let mut append = |log: &mut DurableLog, data: Vec<u8>| {
        index += 1;
        let before = log.bytes();
        log.append(&[entry(index, data)]).unwrap();
        (log.bytes() - before) as usize
    };
    let stored_whole = |grown: usize, len: usize| grown > len;
    for _ in 0..MISSES_BEFORE_SKIPPING {
        let data = random();
        assert!(stored_whole(append(&mut log, data), 2000));
    }
    // Compressible, but within the entries the log does not try to compress.
    for _ in 0..ENTRIES_SKIPPED {
        let grown = append(&mut log, repetitive.clone());
        assert!(stored_whole(grown, repetitive.len()));
    }
    // Tried again, and compressed.
    let grown = append(&mut log, repetitive.clone());
    assert!(grown < repetitive.len() / 4, "{grown}");
    // A miss or two among compressible entries does not stop it.
    let data = random();
    append(&mut log, data);
    let grown = append(&mut log, repetitive.clone());
    assert!(grown < repetitive.len() / 4, "{grown}");
    let last = log.last_index();
    let written = read_all(&log, 1, last + 1);
    drop(log);
    let log = DurableLog::open(dir.path(), &[1], 1 << 24, false).unwrap();
    assert_eq!(read_all(&log, 1, last + 1), written);
    assert_eq!(written.len() as u64, last);
}

fn read_all(log: &DurableLog, from: u64, to: u64) -> Vec<Entry> {
    let context = raft::GetEntriesContext::empty(false);
    log.storage().entries(from, to, u64::MAX, context).unwrap()
}

fn lengths(dir: &Path) -> Vec<(String, u64)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| {
            (
                e.file_name().to_string_lossy().to_string(),
                e.metadata().unwrap().len(),
            )
        })
        .filter(|(name, _)| name.ends_with(".seg") || name.starts_with(SPARE))
        .collect();
    files.sort();
    files
}

/// Under writes, a segment whose entries are durable is written over as a later segment;
/// reopened, the log holds exactly the entries appended, none from the file's earlier life,
/// also when the recycled segment took no entry before a crash. A log that settles keeps
/// no spares.
#[test]
fn durable_segments_are_written_over_and_read_back_without_their_old_entries() {
    let dir = tempfile::tempdir().unwrap();
    // Later entries are shorter: the recycled file outlasts its new records.
    let data = |i: u64| {
        let pad = if i <= 30 { 200 } else { 50 };
        format!("entry {i} {}", "x".repeat(pad)).into_bytes()
    };
    let all: Vec<Entry> = (1..=60).map(|i| entry(i, data(i))).collect();
    {
        let mut log = DurableLog::open(dir.path(), &[1], 1024, true).unwrap();
        for chunk in all[..30].chunks(3) {
            log.append(chunk).unwrap();
        }
        // Entries up to 20 are durable; 21 to 30 not yet: the log takes writes.
        log.truncate_prefix(20).unwrap();
        assert!(!log.spares.is_empty(), "{:?}", lengths(dir.path()));
        for chunk in all[30..].chunks(3) {
            log.append(chunk).unwrap();
        }
        assert_eq!(read_all(&log, 21, 61), all[20..]);
        // Some segment is a recycled file, longer than its records.
        let logical: u64 = log.segments.iter().map(|s| s.len).sum();
        let physical: u64 = log
            .segments
            .iter()
            .map(|s| std::fs::metadata(&s.path).unwrap().len())
            .sum();
        assert!(
            physical > logical + 8 * log.segments.len() as u64,
            "{physical} {logical}"
        );
        assert_eq!(log.bytes(), logical);
    }
    let log = DurableLog::open(dir.path(), &[1], 1024, true).unwrap();
    assert_eq!(read_all(&log, 21, 61), all[20..]);
    drop(log);
    // A crash right after a spare was renamed to the next segment, before its first
    // entry: a segment file starting with older entries holds none.
    let oldest = dir.path().join(&lengths(dir.path())[0].0);
    let next = dir.path().join(format!("{:020}.seg", 61));
    std::fs::copy(oldest, next).unwrap();
    let mut log = DurableLog::open(dir.path(), &[1], 1024, true).unwrap();
    assert_eq!(log.last_index(), 60);
    log.append(&[entry(61, data(61))]).unwrap();
    assert_eq!(read_all(&log, 61, 62), vec![entry(61, data(61))]);
    // Settled: no spares, and the newest segment is a new, empty file.
    log.truncate_prefix(61).unwrap();
    assert!(log.spares.is_empty() && spares(dir.path()).unwrap().is_empty());
    assert_eq!(log.bytes(), 0);
    drop(log);
    let log = DurableLog::open(dir.path(), &[1], 1024, true).unwrap();
    assert_eq!(log.last_index(), 61);
}

/// A segment in which a new leader replaced entries is deleted, never written over: its
/// replaced entries are above the next segment's first index. Also after a restart.
#[test]
fn segments_with_replaced_entries_are_not_recycled() {
    for restart in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut log = DurableLog::open(dir.path(), &[1], 1 << 20, true).unwrap();
        let old: Vec<Entry> = (1..=10).map(|i| entry(i, vec![1; 50])).collect();
        log.append(&old).unwrap();
        let new: Vec<Entry> = (6..=20)
            .map(|i| Entry {
                term: 2,
                ..entry(i, vec![2; 50])
            })
            .collect();
        log.append(&new[..3]).unwrap();
        log.append(&new[3..]).unwrap();
        if restart {
            drop(log);
            log = DurableLog::open(dir.path(), &[1], 1 << 20, true).unwrap();
        }
        assert_eq!(read_all(&log, 6, 21), new);
        log.truncate_prefix(7).unwrap();
        assert!(log.spares.is_empty(), "restart {restart}");
        assert_eq!(log.segments.len(), 1);
    }
}

/// Random appends, suffix overwrites by a new term, truncations (some while the log takes
/// writes, so segments are recycled, some settling it) and reopenings, with small segments,
/// against a model of the entries the log must hold.
#[test]
fn random_appends_overwrites_truncations_and_reopens_match_a_model() {
    use rand::{Rng, SeedableRng};
    for seed in 0..8u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let dir = tempfile::tempdir().unwrap();
        let open = || DurableLog::open(dir.path(), &[1], 600, true).unwrap();
        let mut log = open();
        // The entries after the truncation point, in index order.
        let mut model: Vec<Entry> = Vec::new();
        let (mut truncated, mut term) = (0u64, 1u64);
        let mut recycled = 0;
        for step in 0..400 {
            let last = truncated + model.len() as u64;
            match rng.random_range(0..20) {
                0..=11 => {
                    let n = rng.random_range(1..5);
                    let batch: Vec<Entry> = (last + 1..=last + n)
                        .map(|i| {
                            let len = rng.random_range(1..300);
                            Entry {
                                term,
                                ..entry(i, vec![(i % 251) as u8; len])
                            }
                        })
                        .collect();
                    log.append(&batch).unwrap();
                    model.extend(batch);
                }
                12..=13 if !model.is_empty() => {
                    // A new leader replaces a suffix.
                    term += 1;
                    let from = rng.random_range(truncated + 1..=last);
                    model.truncate((from - truncated - 1) as usize);
                    let batch: Vec<Entry> = (from..from + rng.random_range(1..4))
                        .map(|i| Entry {
                            term,
                            ..entry(i, vec![term as u8; 40])
                        })
                        .collect();
                    log.append(&batch).unwrap();
                    model.extend(batch);
                }
                14..=16 if !model.is_empty() => {
                    // Durable up to a random point, or everything (the log settles).
                    let to = match rng.random_bool(0.3) {
                        true => last,
                        false => rng.random_range(truncated..=last),
                    };
                    log.truncate_prefix(to).unwrap();
                    if to > truncated {
                        model.drain(..(to - truncated) as usize);
                        truncated = to;
                    }
                    assert!(log.spares.len() <= SPARES);
                    recycled += log.spares.len();
                }
                _ => {
                    drop(log);
                    log = open();
                }
            }
            let last = truncated + model.len() as u64;
            assert_eq!(log.last_index(), last, "seed {seed} step {step}");
            if !model.is_empty() {
                assert_eq!(
                    read_all(&log, truncated + 1, last + 1),
                    model,
                    "seed {seed} step {step}"
                );
            }
        }
        assert!(
            recycled > 0,
            "seed {seed}: no segment was kept to be written over"
        );
    }
}

/// A segment created but never written before a crash holds nothing. The log that reopens
/// removes it: truncation retires a segment once the next one starts at the truncation
/// point, and the empty one would have retired the entries only the older segment holds.
#[test]
fn an_empty_segment_left_by_a_crash_does_not_make_truncation_drop_entries() {
    let dir = tempfile::tempdir().unwrap();
    let first: Vec<Entry> = (1..=10)
        .map(|i| entry(i, format!("entry {i}").into_bytes()))
        .collect();
    DurableLog::open(dir.path(), &[1], 1 << 20, true)
        .unwrap()
        .append(&first)
        .unwrap();
    // A new leader's entries from index 6 on: the segment was made, then the crash.
    File::create(dir.path().join(format!("{:020}.seg", 6))).unwrap();
    // Another leader keeps 6 and 7 and replaces the entries from 8 on.
    let newer: Vec<Entry> = (8..=9)
        .map(|i| Entry {
            term: 2,
            ..entry(i, format!("newer {i}").into_bytes())
        })
        .collect();
    {
        let mut log = DurableLog::open(dir.path(), &[1], 1 << 20, true).unwrap();
        assert_eq!(read_all(&log, 1, 11), first);
        log.append(&newer).unwrap();
        log.truncate_prefix(5).unwrap();
    }
    let log = DurableLog::open(dir.path(), &[1], 1 << 20, true).unwrap();
    let expected: Vec<Entry> = first[5..7].iter().chain(&newer).cloned().collect();
    assert_eq!(read_all(&log, 6, 10), expected);
}
