//! Internal RPC between Nyala servers (tonic gRPC, prost messages; decision 5).
//!
//! One gRPC method, `/nyala.Internal/Call`, carries a request envelope whose variants are the
//! operations a tablet server offers: Raft messages (batched per destination server), creating a
//! replica of a replicated tablet, writes to a tablet's leader, scans and status. The messages are
//! declared here with prost's derive macros, so no protoc is needed to build.
//!
//! [`RaftRouter`] is the Raft transport of every replica on a server: messages for the same
//! destination server, from all its tablets, go out together in one RPC.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use nyala_raft::{MembershipChange, Message, RaftError, Transport};
use nyala_storage::{ScanIterator, ScanSpec, Schema, WriteBatch};
use parking_lot::{Mutex, RwLock};
use tokio::sync::mpsc;
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};

use crate::client::Client;
use crate::host::Cluster;
use crate::master::TableInfo;
use crate::master::CATALOG_TABLET;
use crate::remote::DdlOp;
use crate::replica::{CopyPosition, Peers, TabletReplica};
use crate::tserver::TabletServer;
use crate::{EngineError, Result};

/// Most bytes of one RPC message (a write batch or a scan result).
const MAX_MESSAGE_BYTES: usize = 256 << 20;
const CALL_PATH: &str = "/nyala.Internal/Call";

#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcRequest {
    #[prost(
        oneof = "request::Kind",
        tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16"
    )]
    pub kind: Option<request::Kind>,
}

pub mod request {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        Raft(super::RaftBatch),
        #[prost(message, tag = "2")]
        CreateReplica(super::CreateReplica),
        #[prost(message, tag = "3")]
        Write(super::Write),
        #[prost(message, tag = "4")]
        ScanOpen(super::ScanOpen),
        #[prost(message, tag = "5")]
        Status(super::StatusRequest),
        #[prost(message, tag = "6")]
        ScanNext(super::ScanNext),
        #[prost(message, tag = "7")]
        SafeSnapshot(super::TabletRef),
        #[prost(message, tag = "8")]
        DeleteReplica(super::TabletRef),
        #[prost(message, tag = "9")]
        AlterSchema(super::AlterSchema),
        /// To a master: a tablet server's address and the state of its replicas.
        #[prost(message, tag = "10")]
        Heartbeat(super::Heartbeat),
        /// To a tablet's leader: its files and log position, for a new replica.
        #[prost(message, tag = "11")]
        FetchTablet(super::TabletRef),
        /// To a server: create a replica of a tablet by copying it from `source`.
        #[prost(message, tag = "12")]
        CopyTablet(super::CopyTablet),
        /// To a tablet's leader: one membership change.
        #[prost(message, tag = "13")]
        ChangeMembership(super::ChangeMembership),
        /// To a master: the catalog and the tablet servers' last heartbeats.
        #[prost(message, tag = "14")]
        ClusterView(super::StatusRequest),
        /// To a master: DDL (a [`crate::remote::DdlOp`] as JSON).
        #[prost(message, tag = "15")]
        Ddl(super::DdlRequest),
        /// To a tablet's leader: the next bytes of a file of a tablet copy.
        #[prost(message, tag = "16")]
        FetchChunk(super::FetchChunk),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcResponse {
    /// Empty on success.
    #[prost(string, tag = "1")]
    pub error: String,
    /// The request went to a replica that does not lead its tablet.
    #[prost(bool, tag = "2")]
    pub not_leader: bool,
    /// The leader the replica knows of (0: none) and its address.
    #[prost(uint64, tag = "3")]
    pub leader_hint: u64,
    #[prost(string, tag = "4")]
    pub leader_address: String,
    /// Rows a write applied.
    #[prost(uint64, tag = "5")]
    pub rows: u64,
    /// A scan's rows as an Arrow IPC stream.
    #[prost(bytes = "vec", tag = "6")]
    pub ipc: Vec<u8>,
    #[prost(message, optional, tag = "7")]
    pub status: Option<ServerStatus>,
    /// The open scanner to ask for the next rows, and whether the scan is done.
    #[prost(uint64, tag = "8")]
    pub scanner_id: u64,
    #[prost(bool, tag = "9")]
    pub done: bool,
    /// A tablet's safe snapshot.
    #[prost(uint64, tag = "10")]
    pub snapshot: u64,
    #[prost(message, optional, tag = "11")]
    pub copy: Option<TabletFiles>,
    /// Every table's definition (JSON).
    #[prost(string, tag = "12")]
    pub catalog_json: String,
    #[prost(message, repeated, tag = "13")]
    pub servers: Vec<Heartbeat>,
    /// Bytes of a file of a tablet copy.
    #[prost(bytes = "vec", tag = "14")]
    pub chunk: Vec<u8>,
    /// A master that lacks a server's earlier reports asks for a full one.
    #[prost(bool, tag = "15")]
    pub need_full: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct FetchChunk {
    /// The copy session FetchTablet opened (in `scanner_id`).
    #[prost(uint64, tag = "1")]
    pub session: u64,
    #[prost(uint32, tag = "2")]
    pub file: u32,
    #[prost(uint64, tag = "3")]
    pub offset: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DdlRequest {
    #[prost(string, tag = "1")]
    pub json: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TabletFiles {
    #[prost(uint64, tag = "1")]
    pub index: u64,
    #[prost(uint64, tag = "2")]
    pub term: u64,
    #[prost(uint64, repeated, tag = "3")]
    pub voters: Vec<u64>,
    #[prost(uint64, repeated, tag = "4")]
    pub learners: Vec<u64>,
    #[prost(message, repeated, tag = "5")]
    pub files: Vec<TabletFile>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TabletFile {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint64, tag = "2")]
    pub size: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CopyTablet {
    #[prost(string, tag = "1")]
    pub tablet_id: String,
    /// The server to copy from (the tablet's leader).
    #[prost(string, tag = "2")]
    pub source: String,
    /// Every member's address, the new one's included.
    #[prost(message, repeated, tag = "3")]
    pub peers: Vec<Peer>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ChangeMembership {
    #[prost(string, tag = "1")]
    pub tablet_id: String,
    /// "add_learner", "add_voter" or "remove".
    #[prost(string, tag = "2")]
    pub change: String,
    #[prost(uint64, tag = "3")]
    pub server_id: u64,
    #[prost(string, tag = "4")]
    pub address: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RaftBatch {
    #[prost(message, repeated, tag = "1")]
    pub messages: Vec<RaftEnvelope>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RaftEnvelope {
    #[prost(string, tag = "1")]
    pub tablet_id: String,
    /// A raft-rs message, protobuf-encoded.
    #[prost(bytes = "vec", tag = "2")]
    pub message: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateReplica {
    #[prost(string, tag = "1")]
    pub tablet_id: String,
    /// The table schema as JSON.
    #[prost(string, tag = "2")]
    pub schema_json: String,
    /// The voters (server ids) and their addresses.
    #[prost(message, repeated, tag = "3")]
    pub peers: Vec<Peer>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Peer {
    #[prost(uint64, tag = "1")]
    pub server_id: u64,
    #[prost(string, tag = "2")]
    pub address: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Write {
    #[prost(string, tag = "1")]
    pub tablet_id: String,
    /// A [`WriteBatch`], encoded.
    #[prost(bytes = "vec", tag = "2")]
    pub batch: Vec<u8>,
}

/// Opens a scanner on a tablet's replica: the first rows come with the answer.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ScanOpen {
    #[prost(string, tag = "1")]
    pub tablet_id: String,
    /// A [`ScanSpec`], encoded; its snapshot 0 means the replica's safe snapshot.
    #[prost(bytes = "vec", tag = "2")]
    pub spec: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ScanNext {
    #[prost(uint64, tag = "1")]
    pub scanner_id: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TabletRef {
    #[prost(string, tag = "1")]
    pub tablet_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AlterSchema {
    #[prost(string, tag = "1")]
    pub tablet_id: String,
    #[prost(string, tag = "2")]
    pub schema_json: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusRequest {}

/// A tablet server's report: the first to a master is full, later ones hold only the replicas
/// whose status changed and the ids of those removed.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Heartbeat {
    /// Where the tablet server's internal RPC listens.
    #[prost(string, tag = "1")]
    pub address: String,
    #[prost(message, optional, tag = "2")]
    pub status: Option<ServerStatus>,
    #[prost(bool, tag = "3")]
    pub full: bool,
    #[prost(string, repeated, tag = "4")]
    pub removed: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerStatus {
    #[prost(uint64, tag = "1")]
    pub server_id: u64,
    #[prost(message, repeated, tag = "2")]
    pub replicas: Vec<ReplicaStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ReplicaStatus {
    #[prost(string, tag = "1")]
    pub tablet_id: String,
    /// The leader's server id (0: unknown).
    #[prost(uint64, tag = "2")]
    pub leader: u64,
    #[prost(uint64, tag = "3")]
    pub last_applied: u64,
    #[prost(uint64, tag = "4")]
    pub estimated_rows: u64,
    /// The group's members as this replica knows them, and its commit index.
    #[prost(uint64, repeated, tag = "5")]
    pub voters: Vec<u64>,
    #[prost(uint64, repeated, tag = "6")]
    pub learners: Vec<u64>,
    #[prost(uint64, tag = "7")]
    pub commit: u64,
    #[prost(uint64, tag = "8")]
    pub disk_bytes: u64,
    /// On the leader: members it has not heard from within an election timeout.
    #[prost(uint64, repeated, tag = "9")]
    pub inactive: Vec<u64>,
}

impl RpcResponse {
    fn error(e: impl std::fmt::Display) -> Self {
        Self {
            error: e.to_string(),
            ..Self::default()
        }
    }

    /// The answer to a request that failed with `e`: a replica that does not lead names the
    /// leader it knows of.
    fn from_error(e: &EngineError, server: &TabletServer) -> Self {
        match e {
            EngineError::Raft(RaftError::NotLeader { leader_hint }) => {
                let hint = leader_hint.unwrap_or(0);
                Self {
                    error: "not the leader".into(),
                    not_leader: true,
                    leader_hint: hint,
                    leader_address: server.address_of(hint).unwrap_or_default(),
                    ..Self::default()
                }
            }
            e => Self::error(e),
        }
    }
}

/// A spawned task's result as an answer.
fn flatten(
    result: std::result::Result<Result<RpcResponse>, tokio::task::JoinError>,
) -> RpcResponse {
    match result {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => RpcResponse::error(e),
        Err(e) => RpcResponse::error(e),
    }
}

/// Rows per scanner answer, about.
const SCAN_CHUNK_BYTES: usize = 8 << 20;
/// A scanner nobody asked for rows this long is dropped.
const SCANNER_IDLE: Duration = Duration::from_secs(120);

/// Bytes per FetchChunk answer.
const COPY_CHUNK_BYTES: u64 = 8 << 20;

/// The files of one tablet copy, held open, and when they were last read.
type CopySession = (Arc<Vec<std::fs::File>>, std::time::Instant);

/// Open tablet copies of a server, by session id.
#[derive(Default)]
struct CopySessions {
    open: Mutex<HashMap<u64, CopySession>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl CopySessions {
    fn open(&self, files: Vec<std::fs::File>) -> u64 {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let mut open = self.open.lock();
        open.retain(|_, (_, used)| used.elapsed() < SCANNER_IDLE);
        open.insert(id, (Arc::new(files), std::time::Instant::now()));
        id
    }

    /// Up to [`COPY_CHUNK_BYTES`] of file `file` of session `id` from `offset`.
    fn chunk(&self, id: u64, file: u32, offset: u64) -> Result<Vec<u8>> {
        let files = {
            let mut open = self.open.lock();
            let (files, used) = open.get_mut(&id).ok_or_else(|| {
                EngineError::Unsupported(format!("tablet copy {id} does not exist (expired?)"))
            })?;
            *used = std::time::Instant::now();
            files.clone()
        };
        let file = files
            .get(file as usize)
            .ok_or_else(|| EngineError::Unsupported(format!("no file {file} in copy {id}")))?;
        let len = file.metadata()?.len();
        let n = COPY_CHUNK_BYTES.min(len.saturating_sub(offset)) as usize;
        let mut buf = vec![0; n];
        std::os::unix::fs::FileExt::read_exact_at(file, &mut buf, offset)?;
        Ok(buf)
    }
}

/// Open scans of a server, by scanner id.
#[derive(Default)]
struct Scanners {
    open: Mutex<HashMap<u64, (ScanIterator, std::time::Instant)>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl Scanners {
    fn open(&self, iter: ScanIterator) -> u64 {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let mut open = self.open.lock();
        open.retain(|_, (_, used)| used.elapsed() < SCANNER_IDLE);
        open.insert(id, (iter, std::time::Instant::now()));
        id
    }

    /// The next rows of scanner `id` (about [`SCAN_CHUNK_BYTES`] as one Arrow IPC stream);
    /// the scanner closes when it has no more.
    fn next_rows(&self, id: u64) -> Result<RpcResponse> {
        let (mut iter, _) = self.open.lock().remove(&id).ok_or_else(|| {
            EngineError::Unsupported(format!("scanner {id} does not exist (expired?)"))
        })?;
        let mut batches: Vec<RecordBatch> = Vec::new();
        let mut bytes = 0;
        let mut done = false;
        while bytes < SCAN_CHUNK_BYTES {
            let Some(batch) = iter.next() else {
                done = true;
                break;
            };
            let batch = batch?;
            bytes += batch.get_array_memory_size();
            batches.push(batch);
        }
        let mut ipc = Vec::new();
        if let Some(first) = batches.first() {
            let mut writer = arrow::ipc::writer::StreamWriter::try_new(&mut ipc, &first.schema())?;
            for batch in &batches {
                writer.write(batch)?;
            }
            writer.finish()?;
        }
        if !done {
            self.open
                .lock()
                .insert(id, (iter, std::time::Instant::now()));
        }
        Ok(RpcResponse {
            scanner_id: id,
            done,
            ipc,
            ..RpcResponse::default()
        })
    }
}

/// How long an idle internal connection waits before TCP keepalive probes start.
const KEEPALIVE: Duration = Duration::from_secs(60);

/// The connections accepted on an internal RPC listener, with TCP_NODELAY (a small message
/// must not wait for the peer's delayed ACK: Nagle's algorithm adds 40 ms per round trip)
/// and keepalive.
pub fn incoming(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(KEEPALIVE))
}

/// A connection to another server's internal RPC.
#[derive(Clone)]
pub struct RpcClient {
    grpc: tonic::client::Grpc<tonic::transport::Channel>,
}

impl RpcClient {
    pub async fn connect(address: &str) -> Result<Self> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| EngineError::Unsupported(format!("bad address {address}: {e}")))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .tcp_keepalive(Some(KEEPALIVE))
            .connect()
            .await
            .map_err(|e| EngineError::Unavailable(format!("cannot reach {address}: {e}")))?;
        Ok(Self {
            grpc: tonic::client::Grpc::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        })
    }

    pub async fn call(&mut self, kind: request::Kind) -> Result<RpcResponse> {
        let unavailable = |e: tonic::Status| EngineError::Unavailable(e.message().to_string());
        self.grpc
            .ready()
            .await
            .map_err(|e| EngineError::Unavailable(e.to_string()))?;
        let response = self
            .grpc
            .unary(
                tonic::Request::new(RpcRequest { kind: Some(kind) }),
                http::uri::PathAndQuery::from_static(CALL_PATH),
                tonic_prost::ProstCodec::<RpcRequest, RpcResponse>::default(),
            )
            .await
            .map_err(unavailable)?;
        Ok(response.into_inner())
    }
}

impl RpcClient {
    /// Scans tablet `tablet_id` on this server with `spec` through a scanner: every batch.
    pub async fn scan(&mut self, tablet_id: &str, spec: &ScanSpec) -> Result<Vec<RecordBatch>> {
        let mut response = self
            .call(request::Kind::ScanOpen(ScanOpen {
                tablet_id: tablet_id.into(),
                spec: spec.encode()?,
            }))
            .await?;
        let mut batches = Vec::new();
        loop {
            if !response.error.is_empty() {
                return Err(EngineError::Unavailable(response.error));
            }
            if !response.ipc.is_empty() {
                let reader = arrow::ipc::reader::StreamReader::try_new(
                    std::io::Cursor::new(std::mem::take(&mut response.ipc)),
                    None,
                )?;
                for batch in reader {
                    batches.push(batch?);
                }
            }
            if response.done {
                return Ok(batches);
            }
            response = self
                .call(request::Kind::ScanNext(ScanNext {
                    scanner_id: response.scanner_id,
                }))
                .await?;
        }
    }
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
                message: encoded,
            };
            let _ = self.outbox(to).send(envelope);
        }
    }

    /// The queue of messages to server `to`, drained by a task that sends everything queued in
    /// one RPC. Messages that cannot be delivered are dropped: Raft sends them again.
    fn outbox(&self, to: u64) -> mpsc::UnboundedSender<RaftEnvelope> {
        let mut outboxes = self.outboxes.lock();
        if let Some(tx) = outboxes.get(&to) {
            return tx.clone();
        }
        let (tx, mut rx) = mpsc::unbounded_channel::<RaftEnvelope>();
        let addresses = self.addresses.clone();
        self.runtime.spawn(async move {
            let mut client: Option<RpcClient> = None;
            while let Some(first) = rx.recv().await {
                let mut messages = vec![first];
                while messages.len() < 4096 {
                    match rx.try_recv() {
                        Ok(m) => messages.push(m),
                        Err(_) => break,
                    }
                }
                let Some(address) = addresses.read().get(&to).cloned() else {
                    continue;
                };
                if client.is_none() {
                    client = RpcClient::connect(&address).await.ok();
                }
                let Some(c) = client.as_mut() else {
                    // Unreachable: wait a little before trying the next batch.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let sent = tokio::time::timeout(
                    Duration::from_secs(2),
                    c.call(request::Kind::Raft(RaftBatch { messages })),
                )
                .await;
                if !matches!(sent, Ok(Ok(_))) {
                    client = None;
                }
            }
        });
        outboxes.insert(to, tx.clone());
        tx
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

/// The internal RPC service: of a tablet server (its replicas) or of a master (heartbeats).
#[derive(Clone)]
pub struct InternalService {
    server: Option<Arc<TabletServer>>,
    cluster: Option<Arc<Cluster>>,
    /// A master's client: its catalog and DDL.
    client: Option<Client>,
    /// A master's replica of the replicated catalog.
    catalog: Option<Arc<TabletReplica>>,
    scanners: Arc<Scanners>,
    copies: Arc<CopySessions>,
}

impl InternalService {
    /// The service of a tablet server.
    pub fn new(server: Arc<TabletServer>) -> Self {
        Self {
            server: Some(server),
            cluster: None,
            client: None,
            catalog: None,
            scanners: Arc::default(),
            copies: Arc::default(),
        }
    }

    /// The service of a master, which tablet servers send heartbeats to (and, with several
    /// masters, the others the Raft messages of the catalog).
    pub fn master(cluster: Arc<Cluster>, client: Client) -> Self {
        Self {
            server: None,
            cluster: Some(cluster),
            catalog: client.catalog(),
            client: Some(client),
            scanners: Arc::default(),
            copies: Arc::default(),
        }
    }

    async fn handle(self, request: RpcRequest) -> RpcResponse {
        let Some(kind) = request.kind else {
            return RpcResponse::error("empty request");
        };
        if let request::Kind::Heartbeat(heartbeat) = kind {
            return match (&self.cluster, heartbeat.status) {
                (Some(cluster), Some(status)) => RpcResponse {
                    need_full: !cluster.report(
                        heartbeat.address,
                        status,
                        heartbeat.full,
                        &heartbeat.removed,
                    ),
                    ..RpcResponse::default()
                },
                _ => RpcResponse::error("this server is not a master"),
            };
        }
        if let request::Kind::ClusterView(_) = kind {
            let (Some(cluster), Some(client)) = (&self.cluster, &self.client) else {
                return RpcResponse::error("this server is not a master");
            };
            let tables: Vec<TableInfo> = client.tables().iter().map(|t| (**t).clone()).collect();
            return match serde_json::to_string(&tables) {
                Ok(catalog_json) => RpcResponse {
                    catalog_json,
                    servers: cluster.view(),
                    ..RpcResponse::default()
                },
                Err(e) => RpcResponse::error(e),
            };
        }
        if let request::Kind::Ddl(ddl) = kind {
            let Some(client) = &self.client else {
                return RpcResponse::error("this server is not a master");
            };
            return match run_ddl(client, &ddl.json).await {
                Ok(done) => RpcResponse {
                    rows: u64::from(done),
                    ..RpcResponse::default()
                },
                Err(e @ EngineError::NotLeaderMaster { .. }) => RpcResponse {
                    not_leader: true,
                    ..RpcResponse::error(e)
                },
                Err(e) => RpcResponse::error(e),
            };
        }
        if let request::Kind::Raft(batch) = kind {
            for envelope in batch.messages {
                let replica = match (&self.catalog, &self.server) {
                    (Some(catalog), _) if envelope.tablet_id == CATALOG_TABLET => catalog.clone(),
                    (_, Some(server)) => match server.replica(&envelope.tablet_id) {
                        Ok(replica) => replica,
                        Err(_) => continue,
                    },
                    _ => continue,
                };
                match nyala_raft::decode_message(&envelope.message) {
                    Ok(message) => replica.step(message),
                    Err(e) => return RpcResponse::error(e),
                }
            }
            return RpcResponse::default();
        }
        let Some(server) = self.server else {
            return RpcResponse::error("this server is not a tablet server");
        };
        let scanners = self.scanners;
        let copies = self.copies;
        match kind {
            request::Kind::Heartbeat(_)
            | request::Kind::Raft(_)
            | request::Kind::ClusterView(_)
            | request::Kind::Ddl(_) => unreachable!("answered above"),
            request::Kind::CreateReplica(create) => {
                let schema: Schema = match serde_json::from_str(&create.schema_json) {
                    Ok(schema) => schema,
                    Err(e) => return RpcResponse::error(format!("bad schema: {e}")),
                };
                let peers = Peers {
                    voters: create.peers.iter().map(|p| p.server_id).collect(),
                    addresses: create
                        .peers
                        .iter()
                        .map(|p| (p.server_id, p.address.clone()))
                        .collect(),
                };
                let id = create.tablet_id.clone();
                let created = tokio::task::spawn_blocking(move || {
                    server.create_replicated_tablet(&id, &schema, peers)
                })
                .await;
                match created {
                    Ok(Ok(_)) => RpcResponse::default(),
                    Ok(Err(e)) => RpcResponse::error(e),
                    Err(e) => RpcResponse::error(e),
                }
            }
            request::Kind::Write(write) => {
                let result = async {
                    let replica = server.replica(&write.tablet_id)?;
                    let batch = WriteBatch::decode(&write.batch)?;
                    server.admit_write().await?;
                    replica.write(&batch).await
                }
                .await;
                match result {
                    Ok(rows) => RpcResponse {
                        rows: rows as u64,
                        ..RpcResponse::default()
                    },
                    Err(e) => RpcResponse::from_error(&e, &server),
                }
            }
            request::Kind::ScanOpen(open) => {
                let scanners = scanners.clone();
                let opened = tokio::task::spawn_blocking(move || -> Result<RpcResponse> {
                    let replica = server.replica(&open.tablet_id)?;
                    let spec = ScanSpec::decode(&open.spec)?;
                    let snapshot = (spec.snapshot.0 != 0).then_some(spec.snapshot);
                    let iter = replica.scan(spec, snapshot)?;
                    scanners.next_rows(scanners.open(iter))
                })
                .await;
                flatten(opened)
            }
            request::Kind::ScanNext(next) => {
                let scanners = scanners.clone();
                flatten(
                    tokio::task::spawn_blocking(move || scanners.next_rows(next.scanner_id)).await,
                )
            }
            request::Kind::SafeSnapshot(tablet) => match server.replica(&tablet.tablet_id) {
                Ok(replica) => RpcResponse {
                    snapshot: replica.safe_snapshot().0,
                    ..RpcResponse::default()
                },
                Err(e) => RpcResponse::error(e),
            },
            request::Kind::DeleteReplica(tablet) => {
                let deleted =
                    tokio::task::spawn_blocking(move || server.delete_tablet(&tablet.tablet_id))
                        .await;
                flatten(deleted.map(|r| r.map(|()| RpcResponse::default())))
            }
            request::Kind::AlterSchema(alter) => {
                let result = async {
                    let schema: Schema = serde_json::from_str(&alter.schema_json)
                        .map_err(|e| EngineError::InvalidTable(format!("bad schema: {e}")))?;
                    server
                        .replica(&alter.tablet_id)?
                        .alter_schema(&schema)
                        .await
                }
                .await;
                match result {
                    Ok(()) => RpcResponse::default(),
                    Err(e) => RpcResponse::from_error(&e, &server),
                }
            }
            request::Kind::FetchTablet(tablet) => {
                let copied = tokio::task::spawn_blocking(move || -> Result<RpcResponse> {
                    let replica = server.replica(&tablet.tablet_id)?;
                    if replica.leader() != Some(server.server_id()) {
                        return Err(EngineError::Raft(RaftError::NotLeader {
                            leader_hint: replica.leader(),
                        }));
                    }
                    let copy = replica.copy()?;
                    let files = copy
                        .files
                        .iter()
                        .map(|(name, _, size)| TabletFile {
                            name: name.clone(),
                            size: *size,
                        })
                        .collect();
                    let session = copies.open(copy.files.into_iter().map(|f| f.1).collect());
                    let at = copy.position;
                    Ok(RpcResponse {
                        scanner_id: session,
                        copy: Some(TabletFiles {
                            index: at.index,
                            term: at.term,
                            voters: at.voters,
                            learners: at.learners,
                            files,
                        }),
                        ..RpcResponse::default()
                    })
                })
                .await;
                flatten(copied)
            }
            request::Kind::FetchChunk(fetch) => {
                let chunk = tokio::task::spawn_blocking(move || {
                    copies
                        .chunk(fetch.session, fetch.file, fetch.offset)
                        .map(|chunk| RpcResponse {
                            chunk,
                            ..RpcResponse::default()
                        })
                })
                .await;
                flatten(chunk)
            }
            request::Kind::CopyTablet(copy) => match receive_copy(&server, &copy).await {
                Ok(()) => RpcResponse::default(),
                Err(e) => {
                    let _ = std::fs::remove_dir_all(server.staging_dir(&copy.tablet_id));
                    RpcResponse::error(e)
                }
            },
            request::Kind::ChangeMembership(change) => {
                let result = async {
                    let replica = server.replica(&change.tablet_id)?;
                    let kind = match change.change.as_str() {
                        "add_learner" => MembershipChange::AddLearner(change.server_id),
                        "add_voter" => MembershipChange::AddVoter(change.server_id),
                        "remove" => MembershipChange::Remove(change.server_id),
                        other => {
                            return Err(EngineError::Unsupported(format!(
                                "membership change '{other}'"
                            )))
                        }
                    };
                    let address = (!change.address.is_empty())
                        .then(|| (change.server_id, change.address.clone()));
                    if let Some((id, a)) = &address {
                        server.learn_address(*id, a.clone());
                    }
                    replica.change_membership(kind, address).await
                }
                .await;
                match result {
                    Ok(()) => RpcResponse::default(),
                    Err(e) => RpcResponse::from_error(&e, &server),
                }
            }
            request::Kind::Status(_) => RpcResponse {
                status: Some(server.status()),
                ..RpcResponse::default()
            },
        }
    }
}

impl tonic::server::NamedService for InternalService {
    const NAME: &'static str = "nyala.Internal";
}

struct CallSvc(InternalService);

impl tonic::server::UnaryService<RpcRequest> for CallSvc {
    type Response = RpcResponse;
    type Future = BoxFuture<tonic::Response<RpcResponse>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<RpcRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            Ok(tonic::Response::new(
                service.handle(request.into_inner()).await,
            ))
        })
    }
}

impl<B> Service<http::Request<B>> for InternalService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let service = self.clone();
        if request.uri().path() != CALL_PATH {
            return Box::pin(async move {
                Ok(tonic::Status::unimplemented("unknown method").into_http())
            });
        }
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                RpcResponse,
                RpcRequest,
            >::default())
            .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES));
            Ok(grpc.unary(CallSvc(service), request).await)
        })
    }
}

/// Sends `server`'s heartbeat (its status, and that it listens at `address`) to the first
/// reachable of `masters` every 500 ms, until the process ends.
pub async fn heartbeat_loop(server: Arc<TabletServer>, address: String, masters: Vec<String>) {
    let mut clients: HashMap<String, RpcClient> = HashMap::new();
    // What each master was last told (None: it gets a full report next).
    let mut told: HashMap<String, HashMap<String, ReplicaStatus>> = HashMap::new();
    loop {
        let status = server.status();
        for master in &masters {
            if !clients.contains_key(master) {
                match RpcClient::connect(master).await {
                    Ok(client) => {
                        clients.insert(master.clone(), client);
                    }
                    Err(_) => continue,
                }
            }
            let Some(client) = clients.get_mut(master) else {
                continue;
            };
            let last = told.get(master);
            let changed: Vec<ReplicaStatus> = status
                .replicas
                .iter()
                .filter(|r| last.is_none_or(|l| l.get(&r.tablet_id) != Some(*r)))
                .cloned()
                .collect();
            let removed: Vec<String> = last
                .map(|l| {
                    l.keys()
                        .filter(|id| !status.replicas.iter().any(|r| &r.tablet_id == *id))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            let heartbeat = request::Kind::Heartbeat(Heartbeat {
                address: address.clone(),
                status: Some(ServerStatus {
                    server_id: status.server_id,
                    replicas: changed,
                }),
                full: last.is_none(),
                removed,
            });
            match client.call(heartbeat).await {
                Ok(answer) if answer.need_full => {
                    told.remove(master);
                }
                Ok(_) => {
                    let now = status
                        .replicas
                        .iter()
                        .map(|r| (r.tablet_id.clone(), r.clone()))
                        .collect();
                    told.insert(master.clone(), now);
                }
                Err(_) => {
                    clients.remove(master);
                    told.remove(master);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Runs DDL that a coordinator sent (on this master, which must lead the catalog).
async fn run_ddl(client: &Client, json: &str) -> Result<bool> {
    let op: DdlOp = serde_json::from_str(json)
        .map_err(|e| EngineError::InvalidTable(format!("bad DDL: {e}")))?;
    client.ddl(op).await
}

/// Creates this server's replica of `copy.tablet_id` from its leader `copy.source`: the files,
/// fetched chunk by chunk into a staging directory, then the replica, as a learner.
async fn receive_copy(server: &Arc<TabletServer>, copy: &CopyTablet) -> Result<()> {
    let mut source = RpcClient::connect(&copy.source).await?;
    let fetched = source
        .call(request::Kind::FetchTablet(TabletRef {
            tablet_id: copy.tablet_id.clone(),
        }))
        .await?;
    let files = fetched
        .copy
        .ok_or_else(|| EngineError::Remote(fetched.error.clone()))?;
    let staging = server.staging_dir(&copy.tablet_id);
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    std::fs::create_dir_all(&staging)?;
    for (i, file) in files.files.iter().enumerate() {
        if file.name.contains('/') || file.name.starts_with('.') {
            return Err(EngineError::Remote(format!("bad file name {}", file.name)));
        }
        let mut out = std::fs::File::create(staging.join(&file.name))?;
        let mut offset = 0;
        while offset < file.size {
            let answer = source
                .call(request::Kind::FetchChunk(FetchChunk {
                    session: fetched.scanner_id,
                    file: i as u32,
                    offset,
                }))
                .await?;
            if !answer.error.is_empty() || answer.chunk.is_empty() {
                return Err(EngineError::Remote(format!(
                    "copying {}: {}",
                    file.name, answer.error
                )));
            }
            std::io::Write::write_all(&mut out, &answer.chunk)?;
            offset += answer.chunk.len() as u64;
        }
        out.sync_all()?;
    }
    let peers = Peers {
        voters: files.voters.clone(),
        addresses: copy
            .peers
            .iter()
            .map(|p| (p.server_id, p.address.clone()))
            .collect(),
    };
    let position = CopyPosition {
        index: files.index,
        term: files.term,
        voters: files.voters,
        learners: files.learners,
    };
    let (server, id) = (server.clone(), copy.tablet_id.clone());
    tokio::task::spawn_blocking(move || server.install_replica(&id, position, peers))
        .await
        .map_err(|e| EngineError::Unavailable(e.to_string()))?
}
