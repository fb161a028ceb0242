//! The Raft layer as a tablet uses it: proposals apply once, in order; after a crash the log
//! replays exactly what the state machine had not made durable; torn tails are cut, damaged
//! records are errors. Includes a randomised run against a model, and (module `fuzz`) damaged
//! logs opened.

mod fuzz;

use std::path::{Path, PathBuf};
use std::time::Duration;

use nyala_raft::{RaftConfig, RaftNode, StateMachine};
use nyala_testkit::wait_until;
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
    fn apply(&mut self, index: u64, command: &bytes::Bytes) -> Self::Output {
        assert!(index > self.applied, "entry {index} applied twice");
        self.applied = index;
        self.items
            .push(u64::from_le_bytes(command[..].try_into().unwrap()));
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
    // (A segment ends with an 8-byte end record; 3 bytes of the entry go too.)
    let last = segments(dir.path()).last().unwrap().clone();
    let len = std::fs::metadata(&last).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .unwrap()
        .set_len(len - 8 - 3)
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

/// An empty entry is a new leader's no-op, never applied: an empty command would wait for ever.
#[tokio::test]
async fn empty_commands_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path());
    let err = node.propose(vec![]).await.expect_err("refused");
    assert!(err.to_string().contains("empty command"), "{err}");
    node.propose(1u64.to_le_bytes().to_vec()).await.unwrap();
}

#[tokio::test]
async fn durable_prefix_of_the_log_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path());
    for i in 0..60u64 {
        node.propose(i.to_le_bytes().to_vec()).await.unwrap();
    }
    let before = segments(dir.path()).len();
    let bytes_before = node.log_bytes();
    let on_disk = |dir: &Path| -> u64 {
        segments(dir)
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum()
    };
    // The log's bytes are its records' (each segment also ends with an 8-byte end record).
    assert_eq!(bytes_before + 8 * before as u64, on_disk(dir.path()));
    node.with_state_machine(|sm| sm.flush()).unwrap();
    node.propose(60u64.to_le_bytes().to_vec()).await.unwrap();
    let after = segments(dir.path()).len();
    assert!(after < before, "segments {before} → {after}");
    assert!(node.log_bytes() < bytes_before);
    // (A segment written over a recycled one keeps that file's length.)
    assert!(node.log_bytes() + 8 * after as u64 <= on_disk(dir.path()));
    // Once everything is durable, the newest segment goes too (within a few ticks).
    node.with_state_machine(|sm| sm.flush()).unwrap();
    wait_until("the log to be dropped", Duration::from_secs(10), || async {
        on_disk(dir.path()) == 0
    })
    .await;
    drop(node);
    let node = self::node(dir.path());
    assert_eq!(items(&node), (0..61).collect::<Vec<_>>());
    node.propose(61u64.to_le_bytes().to_vec()).await.unwrap();
    drop(node);
    let node = self::node(dir.path());
    assert_eq!(items(&node), (0..62).collect::<Vec<_>>());
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

mod cluster {
    //! Groups of three in-process nodes over a network that loses, delays (so reorders) and
    //! duplicates messages: a leader is elected, proposals commit on every node in one order,
    //! and killing the leader (then restarting it from its log) loses no acknowledged command.

    use std::collections::HashMap;
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use nyala_raft::{Message, RaftConfig, RaftNode, Transport};
    use nyala_testkit::wait_until;
    use parking_lot::Mutex;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::Recorder;

    type Node = Arc<RaftNode<Recorder>>;

    struct Network {
        nodes: Mutex<HashMap<u64, Node>>,
        /// (delivery time, message)
        queue: Mutex<Vec<(Instant, Message)>>,
        rng: Mutex<StdRng>,
        loss: f64,
        /// Every message is lost while set.
        cut: AtomicBool,
        stop: AtomicBool,
    }

    impl Network {
        fn start(loss: f64, seed: u64) -> Arc<Network> {
            let net = Arc::new(Network {
                nodes: Mutex::new(HashMap::new()),
                queue: Mutex::new(Vec::new()),
                rng: Mutex::new(StdRng::seed_from_u64(seed)),
                loss,
                cut: AtomicBool::new(false),
                stop: AtomicBool::new(false),
            });
            let n = net.clone();
            std::thread::spawn(move || {
                while !n.stop.load(Ordering::Acquire) {
                    let now = Instant::now();
                    let due: Vec<Message> = {
                        let mut queue = n.queue.lock();
                        let (due, later) = queue.drain(..).partition(|(at, _)| *at <= now);
                        *queue = later;
                        due.into_iter().map(|(_, m)| m).collect()
                    };
                    for message in due {
                        let to = n.nodes.lock().get(&message.to).cloned();
                        if let Some(node) = to {
                            node.step(message);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            net
        }

        fn send(&self, messages: Vec<Message>) {
            if self.cut.load(Ordering::Acquire) {
                return;
            }
            let mut rng = self.rng.lock();
            let mut queue = self.queue.lock();
            for message in messages {
                if rng.random_bool(self.loss) {
                    continue;
                }
                let copies = if rng.random_bool(0.05) { 2 } else { 1 };
                for _ in 0..copies {
                    let delay = Duration::from_millis(rng.random_range(0..15));
                    queue.push((Instant::now() + delay, message.clone()));
                }
            }
        }
    }

    struct Link(Arc<Network>);

    impl Transport for Link {
        fn send(&self, messages: Vec<Message>) {
            self.0.send(messages);
        }
    }

    fn open(net: &Arc<Network>, dir: &Path, id: u64) -> Node {
        let mut config = RaftConfig::new(id, dir.join("wal")).with_voters(vec![1, 2, 3]);
        config.tick = Duration::from_millis(20);
        config.segment_bytes = 512;
        let node = Arc::new(
            RaftNode::open_with_transport(config, Recorder::open(dir), Box::new(Link(net.clone())))
                .unwrap(),
        );
        net.nodes.lock().insert(id, node.clone());
        node
    }

    /// Proposes `value` at whichever node leads; true if acknowledged.
    async fn propose(net: &Arc<Network>, value: u64) -> bool {
        let leader = wait_until("a leader", Duration::from_secs(20), || async {
            net.nodes.lock().values().find(|n| n.is_leader()).cloned()
        })
        .await;
        let proposal = leader.propose(value.to_le_bytes().to_vec());
        matches!(
            tokio::time::timeout(Duration::from_secs(5), proposal).await,
            Ok(Ok(_))
        )
    }

    fn items(node: &Node) -> Vec<u64> {
        node.with_state_machine(|sm| sm.items.clone()).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lossy_reordering_network_and_a_killed_leader_lose_no_acknowledged_command() {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let net = Network::start(0.1, 7);
        for id in 1..=3 {
            open(&net, dirs[id as usize - 1].path(), id);
        }
        let mut acknowledged = Vec::new();
        let mut value = 0u64;
        for round in 0..3 {
            for _ in 0..40 {
                value += 1;
                if propose(&net, value).await {
                    acknowledged.push(value);
                }
            }
            // Some state machines flush, so their logs are truncated.
            let any = net.nodes.lock().values().next().cloned().unwrap();
            any.with_state_machine(|sm| sm.flush()).unwrap();
            // Kill the leader, keep writing, then bring it back from its log.
            let leader = loop {
                if let Some(l) = net.nodes.lock().values().find(|n| n.is_leader()) {
                    break l.clone();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let id = (1..=3).find(|i| net.nodes.lock()[i].is_leader()).unwrap();
            net.nodes.lock().remove(&id);
            leader.shutdown();
            drop(leader);
            let killed_at = Instant::now();
            value += 1;
            let first_after = propose(&net, value).await;
            if first_after {
                acknowledged.push(value);
            }
            eprintln!(
                "round {round}: leader {id} killed; next write {} after {:?}",
                if first_after {
                    "acknowledged"
                } else {
                    "failed"
                },
                killed_at.elapsed()
            );
            for _ in 0..20 {
                value += 1;
                if propose(&net, value).await {
                    acknowledged.push(value);
                }
            }
            open(&net, dirs[id as usize - 1].path(), id);
        }
        assert!(
            acknowledged.len() > 100,
            "{} acknowledged",
            acknowledged.len()
        );
        // Every node ends with the same commands, in the same order, each acknowledged one once.
        let nodes: Vec<Node> = (1..=3).map(|i| net.nodes.lock()[&i].clone()).collect();
        let converged = || async {
            let all: Vec<Vec<u64>> = nodes.iter().map(items).collect();
            let same = all.iter().all(|a| *a == all[0]);
            (same && all[0].contains(acknowledged.last().unwrap())).then(|| all[0].clone())
        };
        let applied = wait_until("the nodes to converge", Duration::from_secs(30), converged).await;
        let mut seen = applied.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), applied.len(), "a command applied twice");
        for v in &acknowledged {
            assert!(applied.contains(v), "acknowledged {v} lost");
        }
        net.stop.store(true, Ordering::Release);
    }

    /// Idle members sleep until a tick acts, but the clock keeps running: with no message to
    /// wake anyone, a leader cut off from its followers steps down after an election timeout
    /// (its quorum check), and the followers campaign after theirs. Joined again, the group
    /// elects a leader and commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cut_off_leader_steps_down_and_its_followers_campaign() {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let net = Network::start(0.0, 5);
        let nodes: Vec<Node> = (1..=3)
            .map(|id| open(&net, dirs[id as usize - 1].path(), id))
            .collect();
        assert!(propose(&net, 1).await);
        net.cut.store(true, Ordering::Release);
        // Election timeouts of 15 to 30 ticks of 20 ms; the bound is for liveness only (leaders
        // that never wake would never step down), as generous as the other waits here.
        wait_until(
            "the leaders to step down",
            Duration::from_secs(20),
            || async {
                let leaders: Vec<_> = nodes.iter().map(|n| n.leader()).collect();
                match leaders.iter().any(Option::is_some) {
                    true => Err(format!("leaders still known: {leaders:?}")),
                    false => Ok(()),
                }
            },
        )
        .await;
        net.cut.store(false, Ordering::Release);
        assert!(propose(&net, 2).await);
        wait_until("the group to recover", Duration::from_secs(20), || async {
            nodes.iter().all(|n| items(n) == [1, 2])
        })
        .await;
        net.stop.store(true, Ordering::Release);
    }

    /// A leader serves a read only once a majority confirmed, after the read was asked, that
    /// it still leads, and once every entry committed before is applied (Raft's ReadIndex).
    /// A follower serves none, and a leader cut off from its group answers no read until it
    /// steps down, then NotLeader: it never answers from a state a newer leader may have moved
    /// past.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_are_served_by_a_leader_a_majority_confirms() {
        use nyala_raft::RaftError;
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let net = Network::start(0.0, 11);
        let nodes: Vec<Node> = (1..=3)
            .map(|id| open(&net, dirs[id as usize - 1].path(), id))
            .collect();
        assert!(propose(&net, 1).await);
        let leader = (nodes.iter().find(|n| n.is_leader()).cloned()).expect("a leader");
        let index = (tokio::time::timeout(Duration::from_secs(10), leader.read_index()).await)
            .expect("a read answered")
            .expect("the leader confirmed");
        assert!(leader.last_applied() >= index);
        assert_eq!(items(&leader), [1]);
        let follower = (nodes.iter().find(|n| !n.is_leader()).cloned()).unwrap();
        let read = follower.read_index().await;
        assert!(matches!(read, Err(RaftError::NotLeader { .. })), "{read:?}");
        net.cut.store(true, Ordering::Release);
        // Answered once the leader steps down (election timeouts of 15 to 30 ticks of 20 ms;
        // the bound is for liveness only).
        let read = tokio::time::timeout(Duration::from_secs(20), leader.read_index()).await;
        let read = read.expect("a cut-off leader answers once it steps down");
        assert!(matches!(read, Err(RaftError::NotLeader { .. })), "{read:?}");
        net.stop.store(true, Ordering::Release);
    }

    /// A replica is replaced: a new node starts from a copy of a member's state machine (files
    /// and the log position they correspond to), joins as a learner, catches up from the log,
    /// becomes a voter, and the old member is removed. One change at a time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_member_is_replaced_by_a_copy_that_learns_then_votes() {
        use nyala_raft::MembershipChange;
        let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
        let net = Network::start(0.0, 11);
        for id in 1..=3 {
            open(&net, dirs[id as usize - 1].path(), id);
        }
        for v in 1..=50 {
            assert!(propose(&net, v).await);
        }
        let leader = net
            .nodes
            .lock()
            .values()
            .find(|n| n.is_leader())
            .cloned()
            .unwrap();
        // The copy: the leader's state machine, flushed, and the log position it is at.
        let target = dirs[3].path().to_path_buf();
        let copied = leader
            .checkpoint(move |sm, describe| {
                sm.flush();
                std::fs::copy(&sm.file, target.join("sm")).unwrap();
                describe(sm.durable)
            })
            .unwrap();
        nyala_raft::create_log_at(
            &dirs[3].path().join("wal"),
            copied.index,
            copied.term,
            copied.voters.clone(),
            vec![4],
        )
        .unwrap();
        let new = open(&net, dirs[3].path(), 4);
        leader
            .change_membership(MembershipChange::AddLearner(4), vec![])
            .await
            .unwrap();
        for v in 51..=60 {
            assert!(propose(&net, v).await);
        }
        wait_until(
            "the learner to catch up",
            Duration::from_secs(20),
            || async { items(&new).len() >= 60 },
        )
        .await;
        leader
            .change_membership(MembershipChange::AddVoter(4), vec![])
            .await
            .unwrap();
        let old = if leader.group_state().leader == 3 {
            2
        } else {
            3
        };
        leader
            .change_membership(MembershipChange::Remove(old), vec![])
            .await
            .unwrap();
        let removed = net.nodes.lock().remove(&old).unwrap();
        removed.shutdown();
        assert_eq!(leader.group_state().voters.len(), 3);
        for v in 61..=70 {
            assert!(propose(&net, v).await);
        }
        let members: Vec<Node> = net.nodes.lock().values().cloned().collect();
        wait_until("the members to agree", Duration::from_secs(20), || async {
            let all: Vec<Vec<u64>> = members.iter().map(items).collect();
            match all.iter().all(|a| *a == (1..=70).collect::<Vec<_>>()) {
                true => Ok(()),
                false => Err(format!("members differ: {all:?}")),
            }
        })
        .await;
        net.stop.store(true, Ordering::Release);
    }
}
