//! The driver of Nyala's fuzz tests, on stable Rust (no libFuzzer): each crate's `fuzz` test
//! module names a target — how to build an input from bytes ([`arbitrary`]) and what to do with
//! it — and [`Fuzz::run`] feeds it random bytes until its budget is spent. A target passes when
//! no input panics, on the test's thread or on a thread of the code under test that it watches
//! (a Raft thread, a tokio worker), and none hangs ([`within`]): an error or a valid result is
//! fine. When one fails, its bytes are shrunk to a small input that still fails, and the test
//! fails showing that input (for a regression test) and how to rerun it.
//!
//! Budget and reproduction, from the environment (see README.md, "Fuzzing"):
//! - `NYALA_FUZZ_SECS=600`: run each target for that long (the default is a fixed number of
//!   inputs per target, a few seconds in all, so the test suites stay fast);
//! - `NYALA_FUZZ_ITERS=n`: run each target on `n` inputs;
//! - `NYALA_FUZZ_SEED=s`: the seed (default 0; with `NYALA_FUZZ_SECS`, a new one each run,
//!   printed);
//! - `NYALA_FUZZ_LOG=1`: print each input before it runs — the way to find an input that aborts
//!   the process (a stack overflow cannot be caught).
//!
//! Besides the driver: [`ByteEdit`]s, the mutations of a valid file or message (bit flips,
//! truncation, boundary integers, inserted and removed bytes) that the targets apply.

use std::fmt::Debug;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

pub use arbitrary::{self, Arbitrary, Unstructured};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Panics seen since the hook was installed on the threads of the code under test that a
/// target watches ([`Fuzz::watch_threads`]): a Raft thread, a tokio worker. Such a panic is a
/// finding even if nobody looks at that thread's result. A panic on a check's own thread is
/// judged by whether it reaches the driver: code under test may catch one on purpose, as
/// storage does around the Parquet reader (and other tests of the same binary run on threads
/// of their own, not watched).
static PANICS: AtomicU64 = AtomicU64::new(0);
/// Set while a failing input is shrunk: its many panics are not printed.
static QUIET: AtomicBool = AtomicBool::new(false);
/// Name prefixes of the watched threads, of all targets that ran.
static WATCHED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

thread_local! {
    /// This thread runs a check (the driver's, or one it handed to [`within`]).
    static CHECKING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            let name = thread.name().unwrap_or_default();
            let watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
            if !CHECKING.get() && watched.iter().any(|p| name.starts_with(p)) {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            drop(watched);
            // A check's own panics are reported by the driver (with the input to rerun); many
            // are caught by the code under test on purpose. Printing each with its backtrace
            // filled gigabytes of captured test output in long runs.
            if !QUIET.load(Ordering::SeqCst) && !CHECKING.get() {
                previous(info);
            }
        }));
    });
}

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// One fuzz target: its name (in messages and in the seed of its inputs), how many inputs it
/// gets by default, and the most random bytes one input is made from.
pub struct Fuzz {
    name: &'static str,
    iterations: u64,
    max_len: usize,
    watched: &'static [&'static str],
}

impl Fuzz {
    pub fn new(name: &'static str, default_iterations: u64) -> Self {
        Self {
            name,
            iterations: default_iterations,
            max_len: 4096,
            watched: &[],
        }
    }

    /// Threads the code under test runs on (by name prefix, e.g. `"tokio-rt-worker"`): a
    /// panic on one of them fails the target too.
    pub fn watch_threads(self, watched: &'static [&'static str]) -> Self {
        Self { watched, ..self }
    }

    /// The most bytes one input is made from (default 4 096).
    pub fn max_len(self, max_len: usize) -> Self {
        Self { max_len, ..self }
    }

    /// Builds inputs with `generate` from random bytes and runs `check` on each, within the
    /// budget; panics (failing the test) with a shrunk input if `check` panicked on any.
    /// Inputs `generate` refuses (an `arbitrary` error) are skipped.
    pub fn run<T: Debug>(
        &self,
        generate: impl Fn(&mut Unstructured) -> arbitrary::Result<T>,
        check: impl Fn(T),
    ) {
        count_panics();
        (WATCHED.lock().unwrap_or_else(|e| e.into_inner())).extend(self.watched);
        let secs: Option<f64> = env("NYALA_FUZZ_SECS");
        let iterations = env("NYALA_FUZZ_ITERS").or(match secs {
            Some(_) => None,
            None => Some(self.iterations),
        });
        let until = secs.map(|s| Instant::now() + Duration::from_secs_f64(s));
        let seed = env("NYALA_FUZZ_SEED").unwrap_or_else(|| match secs {
            Some(_) => rand::random::<u64>() >> 16,
            None => 0,
        });
        let log = std::env::var_os("NYALA_FUZZ_LOG").is_some_and(|v| v != "0");
        if secs.is_some() || log {
            // Printed first too: an input that aborts the process leaves no closing line.
            eprintln!("fuzz {}: NYALA_FUZZ_SEED={seed}", self.name);
        }
        let started = Instant::now();
        let fails = |data: &[u8], log: bool| -> Option<String> {
            let before = PANICS.load(Ordering::SeqCst);
            CHECKING.set(true);
            let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
                let Ok(input) = generate(&mut Unstructured::new(data)) else {
                    return;
                };
                if log {
                    eprintln!("fuzz {}: {input:?}", self.name);
                }
                check(input)
            }));
            CHECKING.set(false);
            match outcome {
                Err(payload) => Some(panic_message(&*payload)),
                Ok(()) if PANICS.load(Ordering::SeqCst) != before => Some(format!(
                    "a panic on a {:?} thread (printed above)",
                    self.watched
                )),
                Ok(()) => None,
            }
        };
        let mut done = 0u64;
        while iterations.is_none_or(|n| done < n) && until.is_none_or(|t| Instant::now() < t) {
            let data = self.bytes(seed, done);
            if let Some(message) = fails(&data, log) {
                let small = shrink(data, |d| fails(d, false).is_some());
                let input = generate(&mut Unstructured::new(&small));
                panic!(
                    "fuzz target `{}` panicked: {message}\n\
                     rerun: NYALA_FUZZ_SEED={seed} NYALA_FUZZ_ITERS={}\n\
                     shrunk input: {input:?}\nits bytes: {small:?}",
                    self.name,
                    done + 1,
                );
            }
            done += 1;
        }
        eprintln!(
            "fuzz {}: {done} inputs in {:.1?} (NYALA_FUZZ_SEED={seed})",
            self.name,
            started.elapsed()
        );
    }

    /// The random bytes of input `index`: short and long inputs alike.
    fn bytes(&self, seed: u64, index: u64) -> Vec<u8> {
        let name = self.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        let mut rng =
            StdRng::seed_from_u64(seed ^ name ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let max = [16, 256, 4096, self.max_len][rng.random_range(0..4)].min(self.max_len);
        let mut data = vec![0u8; rng.random_range(0..=max)];
        rng.fill(&mut data[..]);
        data
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    match (
        payload.downcast_ref::<&str>(),
        payload.downcast_ref::<String>(),
    ) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic".to_string(),
    }
}

/// The smallest bytes found (removing chunks, then zeroing bytes) that still fail, within a
/// minute and a few thousand tries.
fn shrink(mut data: Vec<u8>, fails: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    QUIET.store(true, Ordering::SeqCst);
    let until = Instant::now() + Duration::from_secs(60);
    let mut tries = 0;
    let mut budget = || {
        tries += 1;
        tries <= 4000 && Instant::now() < until
    };
    let mut chunk = data.len().div_ceil(2);
    'chunks: while chunk > 0 {
        let mut at = 0;
        while at < data.len() {
            if !budget() {
                break 'chunks;
            }
            let mut smaller = data.clone();
            smaller.drain(at..(at + chunk).min(data.len()));
            if fails(&smaller) {
                data = smaller;
            } else {
                at += chunk;
            }
        }
        chunk /= 2;
    }
    for at in 0..data.len() {
        if data[at] != 0 && budget() {
            let mut simpler = data.clone();
            simpler[at] = 0;
            if fails(&simpler) {
                data = simpler;
            }
        }
    }
    QUIET.store(false, Ordering::SeqCst);
    data
}

/// Runs `f` on a thread of its own and returns what it returns; panics if `f` panicked (with its
/// message) or took longer than `limit` (a hang is a finding too; the thread is left behind).
pub fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        CHECKING.set(true);
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(value) => value,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("no answer after {limit:?}: the input hangs")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match thread.join() {
            Err(payload) => panic::resume_unwind(payload),
            Ok(()) => unreachable!("the thread ended without an answer"),
        },
    }
}

/// A number near a valid one, small, or anything: what a structured mutation sets a field to.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Num {
    Near(i8),
    Small(u8),
    Any(u64),
}

impl Num {
    pub fn apply(self, current: u64) -> u64 {
        match self {
            Num::Near(d) => current.saturating_add_signed(d as i64),
            Num::Small(v) => v as u64,
            Num::Any(v) => v,
        }
    }
}

/// A mutation of valid bytes (a file, a message). Positions are taken modulo the length, so any
/// edit applies to any bytes.
#[derive(Debug, Clone, Arbitrary)]
pub enum ByteEdit {
    FlipBit {
        at: u32,
        bit: u8,
    },
    SetByte {
        at: u32,
        value: u8,
    },
    /// A little-endian integer with a boundary value, where lengths and offsets are.
    SetInt {
        at: u32,
        width: Width,
        value: Boundary,
    },
    Truncate {
        at: u32,
    },
    Remove {
        at: u32,
        len: u16,
    },
    Insert {
        at: u32,
        bytes: Vec<u8>,
    },
    /// Copies `len` bytes from `from` over the bytes at `at`.
    Copy {
        from: u32,
        at: u32,
        len: u16,
    },
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Width {
    W1,
    W2,
    W4,
    W8,
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Boundary {
    Zero,
    One,
    Max,
    SignedMax,
    SignedMin,
    Other(u64),
}

impl ByteEdit {
    pub fn apply(&self, bytes: &mut Vec<u8>) {
        let len = bytes.len();
        let pos = |at: u32| if len == 0 { 0 } else { at as usize % len };
        match self {
            ByteEdit::FlipBit { at, bit } if len > 0 => bytes[pos(*at)] ^= 1 << (bit % 8),
            ByteEdit::SetByte { at, value } if len > 0 => bytes[pos(*at)] = *value,
            ByteEdit::SetInt { at, width, value } if len > 0 => {
                let width = match width {
                    Width::W1 => 1,
                    Width::W2 => 2,
                    Width::W4 => 4,
                    Width::W8 => 8,
                };
                let bits = 8 * width as u32;
                let value = match value {
                    Boundary::Zero => 0,
                    Boundary::One => 1,
                    Boundary::Max => u64::MAX,
                    Boundary::SignedMax => u64::MAX >> (65 - bits),
                    Boundary::SignedMin => 1 << (bits - 1),
                    Boundary::Other(v) => *v,
                };
                let at = pos(*at);
                let end = (at + width).min(len);
                bytes[at..end].copy_from_slice(&value.to_le_bytes()[..end - at]);
            }
            ByteEdit::Truncate { at } => bytes.truncate(pos(*at)),
            ByteEdit::Remove { at, len: n } if len > 0 => {
                let at = pos(*at);
                bytes.drain(at..(at + *n as usize).min(len));
            }
            ByteEdit::Insert { at, bytes: new } => {
                let at = if len == 0 {
                    0
                } else {
                    *at as usize % (len + 1)
                };
                bytes.splice(at..at, new.iter().copied());
            }
            ByteEdit::Copy { from, at, len: n } if len > 0 => {
                let (from, at) = (pos(*from), pos(*at));
                let n = (*n as usize).min(len - from).min(len - at);
                bytes.copy_within(from..from + n, at);
            }
            _ => {}
        }
    }
}

/// `bytes` with `edits` applied in order.
pub fn edited(bytes: &[u8], edits: &[ByteEdit]) -> Vec<u8> {
    let mut bytes = bytes.to_vec();
    for edit in edits {
        edit.apply(&mut bytes);
    }
    bytes
}

/// One to `max` edits (few, so that most inputs stay close to valid).
pub fn some_edits(u: &mut Unstructured, max: usize) -> arbitrary::Result<Vec<ByteEdit>> {
    let n = u.int_in_range(1..=max.max(1))?;
    (0..n).map(|_| ByteEdit::arbitrary(u)).collect()
}

/// One of the valid `samples` with a few edits, or as it is, or random bytes (one time in
/// eight each): what a decoder of those samples is fed.
pub fn sample_or_noise(u: &mut Unstructured, samples: &[Vec<u8>]) -> arbitrary::Result<Vec<u8>> {
    if samples.is_empty() || u.ratio(1, 8)? {
        return Vec::<u8>::arbitrary(u);
    }
    let sample = u.choose(samples)?;
    match u.ratio(1, 7)? {
        true => Ok(sample.clone()),
        false => Ok(edited(sample, &some_edits(u, 3)?)),
    }
}

/// The files directly in `dir`, by name, with their bytes, sorted by name: the sample a target
/// damages.
pub fn files_in(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("the directory to sample")
        .map(|e| e.expect("a directory entry").path())
        .map(|p| {
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let bytes = std::fs::read(&p).expect("a sample file");
            (name, bytes)
        })
        .collect();
    files.sort();
    files
}
