//! Network partitions between processes on one machine: every server is reached through a
//! TCP proxy on loopback, which knows which process each connection comes from (the owner
//! of the connecting socket, found in `/proc`) and cuts the connections a partition forbids.
//!
//! A partition is a set of blocked (from process, to server) pairs; connections already open
//! across a newly blocked pair are closed, new ones are closed as soon as they are accepted.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use std::sync::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The blocked (from pid, to server index) pairs; every proxy watches it.
#[derive(Clone)]
pub struct Network {
    blocked: Arc<watch::Sender<HashSet<(u32, usize)>>>,
    /// The pids of the processes taking part, by server index (the only ones looked up).
    pids: Arc<Mutex<Vec<u32>>>,
    /// Connections opened through the proxies, and cut by partitions.
    opened: Arc<AtomicUsize>,
    cut: Arc<AtomicUsize>,
}

impl Network {
    pub fn new() -> Self {
        Self {
            blocked: Arc::new(watch::channel(HashSet::new()).0),
            pids: Arc::default(),
            opened: Arc::default(),
            cut: Arc::default(),
        }
    }

    /// Connections opened through the proxies so far, and how many partitions cut.
    pub fn connections(&self) -> (usize, usize) {
        (
            self.opened.load(Ordering::Relaxed),
            self.cut.load(Ordering::Relaxed),
        )
    }

    /// Records that server `index` now runs as process `pid`.
    pub fn set_pid(&self, index: usize, pid: u32) {
        let mut pids = self.pids.lock().unwrap();
        if pids.len() <= index {
            pids.resize(index + 1, 0);
        }
        pids[index] = pid;
    }

    /// Cuts server `index` off from every other server, both ways.
    pub fn isolate(&self, index: usize) {
        self.cut_off(index, &[]);
    }

    /// Cuts server `index` off from every other server but those in `spared`, both ways.
    pub fn cut_off(&self, index: usize, spared: &[usize]) {
        let pids = self.pids.lock().unwrap().clone();
        let mut blocked = HashSet::new();
        for (other, &pid) in pids.iter().enumerate() {
            if other != index && !spared.contains(&other) {
                blocked.insert((pid, index));
                blocked.insert((pids[index], other));
            }
        }
        self.blocked.send_replace(blocked);
    }

    /// Lets every server reach every other again.
    pub fn heal(&self) {
        self.blocked.send_replace(HashSet::new());
    }

    /// Starts a proxy for server `index`, listening at `listen` and forwarding to `target`.
    pub async fn proxy(&self, index: usize, listen: &str, target: String) {
        let listener = TcpListener::bind(listen).await.unwrap();
        let network = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok((inbound, peer)) = listener.accept().await else {
                    continue;
                };
                let network = network.clone();
                let target = target.clone();
                tokio::spawn(async move {
                    let pids = network.pids.lock().unwrap().clone();
                    let from = tokio::task::spawn_blocking(move || owner(peer.port(), &pids))
                        .await
                        .ok()
                        .flatten();
                    network.forward(index, from, inbound, &target).await;
                });
            }
        });
    }

    /// Forwards one connection while the partition allows it.
    async fn forward(&self, to: usize, from: Option<u32>, mut inbound: TcpStream, target: &str) {
        let mut partition = self.blocked.subscribe();
        let allowed = |blocked: &HashSet<(u32, usize)>| match from {
            Some(pid) => !blocked.contains(&(pid, to)),
            None => true,
        };
        self.opened.fetch_add(1, Ordering::Relaxed);
        if !allowed(&partition.borrow_and_update()) {
            self.cut.fetch_add(1, Ordering::Relaxed);
            let _ = inbound.shutdown().await;
            return;
        }
        let Ok(mut outbound) = TcpStream::connect(target).await else {
            return;
        };
        let _ = inbound.set_nodelay(true);
        let _ = outbound.set_nodelay(true);
        let copy = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
        tokio::pin!(copy);
        loop {
            tokio::select! {
                _ = &mut copy => return,
                changed = partition.changed() => {
                    if changed.is_err() || !allowed(&partition.borrow_and_update()) {
                        self.cut.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                }
            }
        }
    }
}

/// The process among `pids` that owns the loopback socket whose local port is `port`.
fn owner(port: u16, pids: &[u32]) -> Option<u32> {
    let tcp = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!("0100007F:{port:04X}");
    let inode = tcp.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&local.as_str())).then(|| fields.get(9).map(|s| s.to_string()))?
    })?;
    let socket = format!("socket:[{inode}]");
    pids.iter().copied().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == socket)
            })
        })
    })
}
