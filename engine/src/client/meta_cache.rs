//! What a client knows of a cluster's tablet servers (Kudu's meta cache): where each listens,
//! what each last reported of its replicas, and which server leads each tablet, learnt from
//! the servers' reports (on a master, as they arrive; on a coordinator, from the master's view)
//! and from NotLeader answers. It keeps one connection per server and routes a call to a
//! tablet's leader, following hints and retrying while a leader is elected.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use super::batched::Batches;
use super::TabletStats;
use crate::rpc;
use crate::rpc::proto::common::{ReplicaStatus, ServerStatus};
use crate::rpc::proto::tserver::batched_call::Call;
use crate::rpc::proto::tserver::tablet_server_service_client::TabletServerServiceClient;
use crate::rpc::proto::tserver::WriteResponse;
use crate::{EngineError, Result};

/// A server whose report is older than this is taken for dead.
pub const SERVER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a call keeps looking for a tablet's leader.
const LEADER_DEADLINE: Duration = Duration::from_secs(30);
/// Most time between two attempts to reach a tablet's leader when no new leader was named.
const LEADER_RETRY: Duration = Duration::from_millis(50);
/// Leaders named by NotLeader answers asked at once, in a row, before waiting.
const MAX_HINTS_FOLLOWED: usize = 3;

/// A tablet server's client over a kept connection.
pub type TServerClient = TabletServerServiceClient<rpc::RpcChannel>;

struct KnownServer {
    address: String,
    replicas: Vec<ReplicaStatus>,
    seen: Instant,
}

#[derive(Default)]
pub struct MetaCache {
    servers: RwLock<HashMap<u64, KnownServer>>,
    leaders: RwLock<HashMap<String, u64>>,
    channels: Mutex<HashMap<String, rpc::RpcChannel>>,
    /// Writes waiting to go to each server together.
    batches: Batches,
    /// Notified after every report, for calls that wait for a tablet's leader to be known.
    reported: tokio::sync::Notify,
}

impl MetaCache {
    /// Records a server's full report.
    pub fn observe(&self, address: &str, status: &ServerStatus) {
        self.servers.write().insert(
            status.server_id,
            KnownServer {
                address: address.to_string(),
                replicas: status.replicas.clone(),
                seen: Instant::now(),
            },
        );
        let mut leaders = self.leaders.write();
        for replica in &status.replicas {
            if replica.leader != 0 {
                leaders.insert(replica.tablet_id.clone(), replica.leader);
            }
        }
        drop(leaders);
        self.reported.notify_waiters();
    }

    pub fn address(&self, server: u64) -> Result<String> {
        self.servers
            .read()
            .get(&server)
            .map(|s| s.address.clone())
            .ok_or_else(|| EngineError::Unavailable(format!("tablet server {server} is unknown")))
    }

    /// The addresses of the servers that reported within [`SERVER_TIMEOUT`], sorted.
    pub fn live_addresses(&self) -> Vec<String> {
        let servers = self.servers.read();
        let live = servers
            .values()
            .filter(|s| s.seen.elapsed() < SERVER_TIMEOUT);
        let mut addresses: Vec<String> = live.map(|s| s.address.clone()).collect();
        addresses.sort();
        addresses
    }

    /// The leader of `tablet` as last reported or learnt.
    pub fn leader_of(&self, tablet: &str) -> Option<u64> {
        self.leaders.read().get(tablet).copied()
    }

    async fn channel(&self, address: &str) -> Result<rpc::RpcChannel> {
        if let Some(channel) = self.channels.lock().get(address) {
            return Ok(channel.clone());
        }
        let channel = rpc::connect(address).await?;
        self.channels
            .lock()
            .insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    /// Calls the tablet server at `address` over the connection kept for it (made again after
    /// the connection failed).
    pub async fn call_address<T, F, Fut>(&self, address: &str, call: F) -> Result<T>
    where
        F: FnOnce(TServerClient) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let called = |channel| async move {
            let answer = call(rpc::tserver(channel)).await;
            answer
                .map(tonic::Response::into_inner)
                .map_err(rpc::from_status)
        };
        self.over_channel(address, called).await
    }

    /// Runs `call` over the connection kept for the server at `address`; a call that finds
    /// the server unreachable drops the connection, to be made again next time.
    async fn over_channel<T, F, Fut>(&self, address: &str, call: F) -> Result<T>
    where
        F: FnOnce(rpc::RpcChannel) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let result = call(self.channel(address).await?).await;
        if let Err(EngineError::Unavailable(_)) = &result {
            self.channels.lock().remove(address);
        }
        result
    }

    /// Calls tablet server `server`.
    pub async fn call_server<T, F, Fut>(&self, server: u64, call: F) -> Result<T>
    where
        F: FnOnce(TServerClient) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let address = self.address(server)?;
        self.call_address(&address, call).await
    }

    /// Calls the leader of `tablet`, following NotLeader hints and waiting for reports while
    /// none is known; the leader that answered, and its answer. An error after
    /// [`LEADER_DEADLINE`].
    pub async fn call_leader<T, F, Fut>(&self, tablet: &str, call: F) -> Result<(u64, T)>
    where
        F: Fn(TServerClient) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        (self.leader_loop(tablet, |leader| self.call_server(leader, &call))).await
    }

    /// [`Self::call_leader`] for a write or a transaction's step (`call` makes the request):
    /// it goes in one `Batch` call with the others made to the same server at the same time
    /// (see `engine/src/client/batched.rs`).
    pub async fn call_leader_batched(
        &self,
        tablet: &str,
        call: impl Fn() -> Call,
    ) -> Result<(u64, WriteResponse)> {
        let call = &call;
        let batched = |leader| async move {
            let address = self.address(leader)?;
            let batched = |channel| self.batches.call(&address, channel, call());
            self.over_channel(&address, batched).await
        };
        self.leader_loop(tablet, batched).await
    }

    /// Runs `call` on the leader of `tablet` as [`Self::call_leader`] describes.
    async fn leader_loop<T, F, Fut>(&self, tablet: &str, call: F) -> Result<(u64, T)>
    where
        F: Fn(u64) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let started = Instant::now();
        let mut last_error = String::from("no leader known");
        let mut followed_hints = 0;
        while started.elapsed() < LEADER_DEADLINE {
            let reported = self.reported.notified();
            let mut reported = std::pin::pin!(reported);
            reported.as_mut().enable();
            let Some(leader) = self.leader_of(tablet) else {
                // Until a server's report names one.
                let left = LEADER_DEADLINE.saturating_sub(started.elapsed());
                let _ = tokio::time::timeout(left, reported).await;
                continue;
            };
            match call(leader).await {
                Ok(answer) => return Ok((leader, answer)),
                Err(e @ EngineError::Raft(nyala_raft::RaftError::NotLeader { leader_hint })) => {
                    last_error = e.to_string();
                    let hint = leader_hint.filter(|&hint| hint != leader);
                    let mut leaders = self.leaders.write();
                    match hint {
                        Some(hint) => leaders.insert(tablet.to_string(), hint),
                        None => leaders.remove(tablet),
                    };
                    drop(leaders);
                    if hint.is_some() && followed_hints < MAX_HINTS_FOLLOWED {
                        // A named leader is asked at once, a few times in a row.
                        followed_hints += 1;
                        continue;
                    }
                }
                Err(e @ EngineError::Raft(nyala_raft::RaftError::Stopped)) => {
                    // The replica there stopped (deleted, moved, its log failed): another
                    // leads, or will.
                    self.leaders.write().remove(tablet);
                    last_error = e.to_string();
                }
                Err(e @ EngineError::Unavailable(_)) => {
                    // The leader is unreachable: wait for the next one to be reported.
                    self.leaders.write().remove(tablet);
                    last_error = e.to_string();
                }
                Err(e) => return Err(e),
            }
            // Until the next report (enabled above, so one that came meanwhile counts), at
            // most LEADER_RETRY: hints may be stale for a while.
            followed_hints = 0;
            let _ = tokio::time::timeout(LEADER_RETRY, reported).await;
        }
        Err(EngineError::Unavailable(format!(
            "tablet {tablet} has no reachable leader: {last_error}"
        )))
    }

    /// Tablet `id` as the live servers last reported it.
    pub fn stats(&self, id: &str) -> TabletStats {
        let servers = self.servers.read();
        let leader = self.leader_of(id);
        let mut stats = TabletStats {
            id: id.to_string(),
            leader: leader
                .and_then(|l| servers.get(&l))
                .map(|s| s.address.clone())
                .unwrap_or_default(),
            ..TabletStats::default()
        };
        let live = servers
            .iter()
            .filter(|(_, s)| s.seen.elapsed() < SERVER_TIMEOUT);
        for (&server, known) in live {
            if let Some(r) = known.replicas.iter().find(|r| r.tablet_id == id) {
                stats.replicas += 1;
                if Some(server) == leader {
                    stats.estimated_rows = r.estimated_rows as usize;
                    stats.disk_bytes = r.disk_bytes;
                }
            }
        }
        stats
    }
}
