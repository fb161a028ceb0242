//! Raft between servers: the transport that carries every replica's messages out, and the
//! consensus service that hands incoming ones to the replicas.
//!
//! [`RaftRouter`] is the [`Transport`] of every replica on a server: messages for the same
//! destination server, from all its tablets, go out together in one `Step` call, over one
//! connection per destination. Messages that cannot be delivered are dropped; Raft sends them
//! again. [`ConsensusService`] decodes each message (bounded protobuf decoding, see
//! `nyala_raft::decode_message`) and steps the replica of its tablet, found through the
//! [`RaftGroups`] of the server (a tablet server's replicas, a master's catalog).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use nyala_raft::{Message, Transport};
use parking_lot::{Mutex, RwLock};
use tokio::sync::mpsc;

use crate::rpc;
use crate::rpc::proto::common::Empty;
use crate::rpc::proto::consensus::consensus_service_server;
use crate::rpc::proto::consensus::{RaftBatch, RaftEnvelope};

/// Most messages one `Step` call carries.
const MAX_BATCH: usize = 4096;

/// The Raft groups a server takes part in, by tablet id.
pub trait RaftGroups: Send + Sync + 'static {
    /// Steps the replica of `tablet_id` with `message`; gives the message back (to try the
    /// next groups) if this server holds no such replica.
    fn step(&self, tablet_id: &str, message: Message) -> Option<Message>;
}

/// Sends the Raft messages of all replicas on this server to the other servers.
pub struct RaftRouter {
    addresses: Arc<RwLock<HashMap<u64, String>>>,
    outboxes: Mutex<HashMap<u64, mpsc::UnboundedSender<RaftEnvelope>>>,
    runtime: tokio::runtime::Handle,
}

impl RaftRouter {
    pub fn new(runtime: tokio::runtime::Handle) -> Arc<Self> {
        Arc::new(Self {
            addresses: Arc::default(),
            outboxes: Mutex::default(),
            runtime,
        })
    }

    /// Records where servers listen.
    pub fn learn(&self, addresses: &BTreeMap<u64, String>) {
        let mut known = self.addresses.write();
        for (id, address) in addresses {
            known.insert(*id, address.clone());
        }
    }

    pub fn address(&self, server_id: u64) -> Option<String> {
        self.addresses.read().get(&server_id).cloned()
    }

    /// A function that records where a server listens.
    pub fn learner(self: &Arc<Self>) -> Arc<dyn Fn(u64, String) + Send + Sync> {
        let router = self.clone();
        Arc::new(move |id, address| {
            router.learn(&BTreeMap::from([(id, address)]));
        })
    }

    /// The transport of the replica of `tablet_id` on this server.
    pub fn transport(self: &Arc<Self>, tablet_id: &str) -> Box<dyn Transport> {
        Box::new(ReplicaTransport {
            tablet_id: tablet_id.to_string(),
            router: self.clone(),
        })
    }

    fn send(&self, tablet_id: &str, messages: Vec<Message>) {
        for message in messages {
            let to = message.to;
            let encoded = match nyala_raft::encode_message(&message) {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode a raft message");
                    continue;
                }
            };
            let envelope = RaftEnvelope {
                tablet_id: tablet_id.to_string(),
                message: encoded.into(),
            };
            let _ = self.outbox(to).send(envelope);
        }
    }

    /// The queue of messages to server `to`, drained by a task that sends everything queued in
    /// one call.
    fn outbox(&self, to: u64) -> mpsc::UnboundedSender<RaftEnvelope> {
        let mut outboxes = self.outboxes.lock();
        if let Some(tx) = outboxes.get(&to) {
            return tx.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel::<RaftEnvelope>();
        self.runtime.spawn(deliver(to, rx, self.addresses.clone()));
        outboxes.insert(to, tx.clone());
        tx
    }
}

/// Sends what is queued for server `to`, batch by batch, until the router is dropped.
async fn deliver(
    to: u64,
    mut rx: mpsc::UnboundedReceiver<RaftEnvelope>,
    addresses: Arc<RwLock<HashMap<u64, String>>>,
) {
    let mut client = None;
    while let Some(first) = rx.recv().await {
        let mut messages = vec![first];
        while messages.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(m) => messages.push(m),
                Err(_) => break,
            }
        }
        let Some(address) = addresses.read().get(&to).cloned() else {
            continue;
        };
        if client.is_none() {
            client = rpc::connect(&address).await.ok().map(rpc::consensus);
        }
        let Some(c) = client.as_mut() else {
            // Unreachable: wait a little before trying the next batch.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let sent =
            tokio::time::timeout(Duration::from_secs(2), c.step(RaftBatch { messages })).await;
        if !matches!(sent, Ok(Ok(_))) {
            client = None;
        }
    }
}

struct ReplicaTransport {
    tablet_id: String,
    router: Arc<RaftRouter>,
}

impl Transport for ReplicaTransport {
    fn send(&self, messages: Vec<Message>) {
        self.router.send(&self.tablet_id, messages);
    }
}

/// The consensus service of a server: Raft messages in, to the replicas of `groups`.
pub struct ConsensusService {
    groups: Vec<Arc<dyn RaftGroups>>,
}

impl ConsensusService {
    pub fn new(groups: Vec<Arc<dyn RaftGroups>>) -> Self {
        Self { groups }
    }

    /// The gRPC service.
    pub fn into_server(self) -> consensus_service_server::ConsensusServiceServer<Self> {
        consensus_service_server::ConsensusServiceServer::new(self)
            .max_decoding_message_size(rpc::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(rpc::MAX_MESSAGE_BYTES)
    }
}

#[tonic::async_trait]
impl consensus_service_server::ConsensusService for ConsensusService {
    async fn step(
        &self,
        request: tonic::Request<RaftBatch>,
    ) -> Result<tonic::Response<Empty>, tonic::Status> {
        for envelope in request.into_inner().messages {
            let message = nyala_raft::decode_message(&envelope.message)
                .map_err(|e| tonic::Status::invalid_argument(format!("bad Raft message: {e}")))?;
            // Lost messages are part of Raft's model: one for a replica this server does not
            // hold (deleted, not yet created) is dropped.
            let mut message = Some(message);
            for groups in &self.groups {
                let Some(m) = message else { break };
                message = groups.step(&envelope.tablet_id, m);
            }
        }
        Ok(tonic::Response::new(Empty {}))
    }
}
