//! Raft between servers: the transport that carries every replica's messages out, and the
//! consensus service that hands incoming ones to the replicas.
//!
//! [`RaftRouter`] is the [`Transport`] of every replica on a server: messages for the same
//! destination server, from all its tablets, go out together, batch by batch, on one `Step`
//! stream per destination that stays open (no call and no answer per batch). Messages that
//! cannot be delivered are dropped; Raft sends them again. [`ConsensusService`] decodes each message (bounded protobuf decoding, see
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

    /// The queue of messages to server `to`, drained by a task that sends everything queued as
    /// one batch of its stream.
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

/// Sends what is queued for server `to`, batch by batch, on a stream that stays open, until
/// the router is dropped. A stream that failed (the server went away, or stopped answering
/// pings) is opened again for the next batch; batches that find no stream, or a full one,
/// are dropped, and Raft sends their messages again.
async fn deliver(
    to: u64,
    mut rx: mpsc::UnboundedReceiver<RaftEnvelope>,
    addresses: Arc<RwLock<HashMap<u64, String>>>,
) {
    let mut stream: Option<futures::channel::mpsc::Sender<RaftBatch>> = None;
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
        if stream.as_ref().is_none_or(|s| s.is_closed()) {
            stream = open_stream(&address).await;
        }
        let Some(open) = stream.as_mut() else {
            // Unreachable: wait a little before trying the next batch.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if let Err(e) = open.try_send(RaftBatch { messages }) {
            if e.is_disconnected() {
                stream = None;
            }
        }
    }
}

/// Batches a stream holds before it refuses more (its server is not keeping up).
const STREAM_BATCHES: usize = 256;

/// Opens a `Step` stream to the server at `address`: what is sent into the returned sender
/// goes out in order; it is closed once the stream has failed.
async fn open_stream(address: &str) -> Option<futures::channel::mpsc::Sender<RaftBatch>> {
    let channel = rpc::connect_for_streams(address).await.ok()?;
    let (tx, rx) = futures::channel::mpsc::channel(STREAM_BATCHES);
    let mut client = rpc::consensus(channel);
    tokio::spawn(async move {
        // Ends (dropping `rx`, which closes `tx`) when the connection fails.
        if let Err(status) = client.step(rx).await {
            tracing::debug!(error = %status, "a Raft stream ended");
        }
    });
    Some(tx)
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
    /// Turns true when the server stops: its streams then end (a server shutting down waits
    /// for its calls to end, and another server's stream would never end on its own).
    stopping: Option<tokio::sync::watch::Receiver<bool>>,
}

impl ConsensusService {
    pub fn new(groups: Vec<Arc<dyn RaftGroups>>) -> Self {
        Self {
            groups,
            stopping: None,
        }
    }

    /// The service, its streams ending once `stopping` turns true.
    pub fn ending_streams_on(self, stopping: tokio::sync::watch::Receiver<bool>) -> Self {
        Self {
            stopping: Some(stopping),
            ..self
        }
    }

    /// Resolves once the server stops (never, without [`Self::ending_streams_on`]).
    async fn stopped(&self) {
        let mut stopping = self.stopping.clone();
        if let Some(stopping) = &mut stopping {
            if stopping.wait_for(|stop| *stop).await.is_ok() {
                return;
            }
        }
        std::future::pending().await
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
        request: tonic::Request<tonic::Streaming<RaftBatch>>,
    ) -> Result<tonic::Response<Empty>, tonic::Status> {
        let mut batches = request.into_inner();
        loop {
            let batch = tokio::select! {
                batch = batches.message() => batch?,
                () = self.stopped() => None,
            };
            let Some(batch) = batch else { break };
            for envelope in batch.messages {
                let message = nyala_raft::decode_message(&envelope.message).map_err(|e| {
                    tonic::Status::invalid_argument(format!("bad Raft message: {e}"))
                })?;
                // Lost messages are part of Raft's model: one for a replica this server does
                // not hold (deleted, not yet created) is dropped.
                let mut message = Some(message);
                for groups in &self.groups {
                    let Some(m) = message else { break };
                    message = groups.step(&envelope.tablet_id, m);
                }
            }
        }
        Ok(tonic::Response::new(Empty {}))
    }
}
