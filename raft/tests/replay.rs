//! The Raft layer as a tablet uses it: proposals apply once, in order; after a crash the log
//! replays exactly what the state machine had not made durable; torn tails are cut, damaged
//! records are errors. Includes a randomised run against a model.

use std::path::{Path, PathBuf};

use nyala_raft::{RaftConfig, RaftNode, StateMachine};
use rand::{Rng, SeedableRng};

/// Appends commands to a Vec; "flushing" persists the Vec and its index to a file.
struct Recorder {
    file: PathBuf,
    durable: u64,
    applied: u64,
    items: Vec<u64>,
}

impl Recorder {
    fn open(dir: &Path) -> Self {
        let file = dir.join("sm");
        let (durable, items) = match std::fs::read_to_string(&file) {
            Ok(s) => {
                let mut parts = s.split(';');
                let durable = parts.next().unwrap().parse().unwrap();
                let items = parts
                    .filter(|p| !p.is_empty())
                    .map(|p| p.parse().unwrap())
                    .collect();
                (durable, items)
            }
            Err(_) => (0, Vec::new()),
        };
        Self {
            file,
            durable,
            applied: durable,
            items,
        }
    }

    fn flush(&mut self) {
        let body: Vec<String> = self.items.iter().map(u64::to_string).collect();
        std::fs::write(&self.file, format!("{};{}", self.applied, body.join(";"))).unwrap();
        self.durable = self.applied;
    }
}

impl StateMachine for Recorder {
    type Output = (u64, usize);
    fn durable_index(&self) -> u64 {
        self.durable
    }
    fn apply(&mut self, index: u64, command: &[u8]) -> Self::Output {
        assert!(index > self.applied, "entry {index} applied twice");
        self.applied = index;
        self.items
            .push(u64::from_le_bytes(command.try_into().unwrap()));
        (index, self.items.len())
    }
}

fn node(dir: &Path) -> RaftNode<Recorder> {
    let mut config = RaftConfig::new(1, dir.join("wal"));
    config.segment_bytes = 256; // many small segments
    RaftNode::open(config, Recorder::open(dir)).unwrap()
}

fn items(node: &RaftNode<Recorder>) -> Vec<u64> {
    node.with_state_machine(|sm| sm.items.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_proposals_apply_once_in_log_order() {
    let dir = tempfile::tempdir().unwrap();
    let node = std::sync::Arc::new(node(dir.path()));
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let node = node.clone();
        tasks.push(tokio::spawn(async move {
            let mut indexes = Vec::new();
            for i in 0..25u64 {
                let (index, _) = node
                    .propose((t * 1000 + i).to_le_bytes().to_vec())
                    .await
                    .unwrap();
                indexes.push(index);
            }
            indexes
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        let indexes = task.await.unwrap();
        assert!(
            indexes.windows(2).all(|w| w[0] < w[1]),
            "one caller's proposals stay in order"
        );
        all.extend(indexes);
    }
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 200);
    assert_eq!(items(&node).len(), 200);
}

#[tokio::test]
async fn restart_replays_exactly_what_was_not_durable() {
    let dir = tempfile::tempdir().unwrap();
    {
        let node = node(dir.path());
        for i in 0..10u64 {
            node.propose(i.to_le_bytes().to_vec()).await.unwrap();
        }
        node.with_state_machine(|sm| sm.flush()).unwrap();
        for i in 10..25u64 {
            node.propose(i.to_le_bytes().to_vec()).await.unwrap();
        }
        // Dropped without flushing the state machine: a crash from its point of view.
    }
    let node = node(dir.path());
    assert_eq!(items(&node), (0..25).collect::<Vec<_>>());
    node.propose(25u64.to_le_bytes().to_vec()).await.unwrap();
    drop(node);
    let node = self::node(dir.path());
    assert_eq!(items(&node), (0..26).collect::<Vec<_>>());
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs
}

#[tokio::test]
async fn torn_tail_is_cut_and_damaged_middle_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    {
        let node = node(dir.path());
        for i in 0..40u64 {
            node.propose(i.to_le_bytes().to_vec()).await.unwrap();
        }
    }
    let segs = segments(dir.path());
    assert!(segs.len() > 2, "small segments roll");
    // A crash in the middle of an append leaves a partial record after the last complete one.
    let last = segs.last().unwrap();
    let mut bytes = std::fs::read(last).unwrap();
    bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3]);
    std::fs::write(last, &bytes).unwrap();
    {
        let node = node(dir.path());
        assert_eq!(items(&node), (0..40).collect::<Vec<_>>());
        node.propose(40u64.to_le_bytes().to_vec()).await.unwrap();
    }
    {
        let node = node(dir.path());
        assert_eq!(items(&node), (0..41).collect::<Vec<_>>());
    }
    // A committed entry cut off is not a torn tail: it is reported, not silently dropped.
    let last = segments(dir.path()).last().unwrap().clone();
    let len = std::fs::metadata(&last).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let err = RaftNode::open(
        RaftConfig::new(1, dir.path().join("wal")),
        Recorder::open(dir.path()),
    )
    .err()
    .expect("a lost committed entry must not open");
    assert!(err.to_string().contains("missing"), "{err}");
    // Flip a byte in the middle of the first segment.
    let first = &segments(dir.path())[0];
    let mut bytes = std::fs::read(first).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(first, bytes).unwrap();
    let err = RaftNode::open(
        RaftConfig::new(1, dir.path().join("wal")),
        Recorder::open(dir.path()),
    )
    .err()
    .expect("a damaged record before the tail must not open");
    assert!(err.to_string().contains("corrupt"), "{err}");
}

#[tokio::test]
async fn durable_prefix_of_the_log_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path());
    for i in 0..60u64 {
        node.propose(i.to_le_bytes().to_vec()).await.unwrap();
    }
    let before = segments(dir.path()).len();
    node.with_state_machine(|sm| sm.flush()).unwrap();
    node.propose(60u64.to_le_bytes().to_vec()).await.unwrap();
    let after = segments(dir.path()).len();
    assert!(after < before, "segments {before} → {after}");
    drop(node);
    let node = self::node(dir.path());
    assert_eq!(items(&node), (0..61).collect::<Vec<_>>());
}

/// Random proposals, flushes and restarts against a model: nothing lost, nothing twice.
#[tokio::test]
async fn randomised_against_a_model() {
    let iterations: usize = std::env::var("NYALA_MODEL_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let dir = tempfile::tempdir().unwrap();
    let mut model = Vec::new();
    let mut node = Some(node(dir.path()));
    for step in 0..iterations as u64 {
        match rng.random_range(0..10) {
            0 => {
                node.as_ref()
                    .unwrap()
                    .with_state_machine(|sm| sm.flush())
                    .unwrap();
            }
            1 => {
                drop(node.take());
                node = Some(self::node(dir.path()));
                assert_eq!(items(node.as_ref().unwrap()), model);
            }
            _ => {
                node.as_ref()
                    .unwrap()
                    .propose(step.to_le_bytes().to_vec())
                    .await
                    .unwrap();
                model.push(step);
            }
        }
    }
    assert_eq!(items(node.as_ref().unwrap()), model);
}
