//! The tablet server's RPC service: writes and scans of its replicas, their creation, schema
//! changes, deletion and membership changes, and tablet copies. Handlers that touch files run
//! on tokio's blocking pool, so a slow disk never stalls the RPC threads.

use std::sync::Arc;
use std::time::Duration;

use nyala_raft::MembershipChange;
use nyala_storage::{ScanSpec, Schema, Timestamp, WriteBatch, WriteOutcome};
use tonic::{Request, Response, Status};

use super::replica::{ClientRequest, Peers, TabletReplica};
use super::scanners::Scanners;
use super::tablet_copy::{receive_copy, CopySessions};
use super::TabletServer;
use crate::rpc;
use crate::rpc::proto::common::{Empty, Peer, ServerStatus, TabletRef};
use crate::rpc::proto::tserver::batched_call::Call;
use crate::rpc::proto::tserver::tablet_server_service_server::{self, TabletServerServiceServer};
use crate::rpc::proto::tserver::{
    AlterSchemaRequest, BatchedAnswer, CallBatch, CallBatchResponse, ChangeMembershipRequest,
    CloneTabletRequest, CloneTabletResponse, CopyTabletRequest, CreateReplicaRequest,
    FetchChunkRequest, FetchChunkResponse, MembershipChangeKind, RequestId, SafeSnapshotResponse,
    ScanNextRequest, ScanOpenRequest, ScanResponse, TabletFiles, TransferLeadershipRequest,
    TxnFinishRequest, TxnPrepareResponse, TxnRequest, TxnWriteRequest, WaitForWriteRequest,
    WaitForWriteResponse, WriteRequest, WriteResponse,
};
use crate::{EngineError, Result};

/// Longest a WaitForWrite call or a waiting ScanOpen waits (a client waiting longer calls
/// again).
const MAX_WAIT_MS: u64 = 60_000;

/// The RPC service of one tablet server.
pub struct TabletServerService {
    server: Arc<TabletServer>,
    scanners: Arc<Scanners>,
    copies: Arc<CopySessions>,
}

impl TabletServerService {
    pub fn new(server: Arc<TabletServer>) -> Self {
        Self {
            server,
            scanners: Arc::default(),
            copies: Arc::default(),
        }
    }

    /// The gRPC service.
    pub fn into_server(self) -> TabletServerServiceServer<Self> {
        TabletServerServiceServer::new(self)
            .max_decoding_message_size(rpc::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(rpc::MAX_MESSAGE_BYTES)
    }

    /// The replica a write goes to and its batch, once the server takes writes (memory).
    async fn admitted_write(
        &self,
        tablet_id: &str,
        batch: &bytes::Bytes,
    ) -> Result<(Arc<super::replica::TabletReplica>, WriteBatch)> {
        let replica = self.server.replica(tablet_id)?;
        let batch = WriteBatch::decode(batch)?;
        self.server.admit_write().await?;
        Ok((replica, batch))
    }

    fn respond<T>(&self, result: Result<T>) -> std::result::Result<Response<T>, Status> {
        rpc::respond(result, |id| self.server.address_of(id))
    }
}

/// Refuses a tablet id that could name something outside the server's tablets directory.
fn check_tablet_id(id: &str) -> Result<()> {
    let fine = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    match !id.is_empty() && id.chars().all(fine) {
        true => Ok(()),
        false => Err(EngineError::InvalidTable(format!("bad tablet id {id:?}"))),
    }
}

fn parse_schema(json: &str) -> Result<Schema> {
    serde_json::from_str(json).map_err(|e| EngineError::InvalidTable(format!("bad schema: {e}")))
}

#[tonic::async_trait]
impl tablet_server_service_server::TabletServerService for TabletServerService {
    async fn create_replica(
        &self,
        request: Request<CreateReplicaRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        let create = request.into_inner();
        let server = self.server.clone();
        let peers = Peers {
            voters: create.peers.iter().map(|p| p.server_id).collect(),
            addresses: (create.peers.into_iter())
                .map(|p| (p.server_id, p.address))
                .collect(),
        };
        if !create.clone_of.is_empty() {
            let (id, source) = (&create.tablet_id, &create.clone_of);
            let cloned = async {
                check_tablet_id(id)?;
                if !peers.voters.contains(&server.server_id()) {
                    return Err(EngineError::InvalidTable(format!(
                        "clone {id}: server {} is not among its replicas {:?}",
                        server.server_id(),
                        peers.voters
                    )));
                }
                (server.open_clone(id, source, create.clone_index, Some(peers))).await
            };
            return self.respond(cloned.await.map(|()| Empty {}));
        }
        let created = rpc::blocking(move || {
            let schema = parse_schema(&create.schema_json)?;
            server
                .create_replicated_tablet(&create.tablet_id, &schema, peers)
                .map(|_| Empty {})
        })
        .await;
        self.respond(created)
    }

    async fn delete_replica(
        &self,
        request: Request<TabletRef>,
    ) -> std::result::Result<Response<Empty>, Status> {
        let tablet = request.into_inner();
        let server = self.server.clone();
        let deleted = rpc::blocking(move || server.delete_tablet(&tablet.tablet_id)).await;
        self.respond(deleted.map(|()| Empty {}))
    }

    async fn alter_schema(
        &self,
        request: Request<AlterSchemaRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        let alter = request.into_inner();
        let altered = async {
            let schema = parse_schema(&alter.schema_json)?;
            let replica = self.server.replica(&alter.tablet_id)?;
            replica.alter_schema(&schema).await
        }
        .await;
        self.respond(altered.map(|()| Empty {}))
    }

    async fn clone_tablet(
        &self,
        request: Request<CloneTabletRequest>,
    ) -> std::result::Result<Response<CloneTabletResponse>, Status> {
        let clone = request.into_inner();
        let cloned = async {
            check_tablet_id(&clone.target_id)?;
            let replica = self.server.replica(&clone.tablet_id)?;
            let as_of = (clone.as_of != 0).then_some(Timestamp(clone.as_of));
            let index = replica.clone_to(&clone.target_id, as_of).await?;
            let known = TabletReplica::peers(replica.dir())?.unwrap_or_default();
            let peers = (replica.group_state().voters.into_iter())
                .map(|server_id| {
                    let address = (known.addresses.get(&server_id).cloned())
                        .or_else(|| self.server.address_of(server_id))
                        .ok_or_else(|| {
                            EngineError::Unavailable(format!("no address of server {server_id}"))
                        })?;
                    Ok(Peer { server_id, address })
                })
                .collect::<Result<_>>()?;
            Ok(CloneTabletResponse { index, peers })
        };
        self.respond(cloned.await)
    }

    async fn write(
        &self,
        request: Request<WriteRequest>,
    ) -> std::result::Result<Response<WriteResponse>, Status> {
        let write = request.into_inner();
        let written = async {
            let (replica, batch) = self.admitted_write(&write.tablet_id, &write.batch).await?;
            replica
                .write_request(&batch, client_request(write.request))
                .await
        }
        .await;
        self.respond(written.map(write_response))
    }

    async fn txn_write(
        &self,
        request: Request<TxnWriteRequest>,
    ) -> std::result::Result<Response<WriteResponse>, Status> {
        let write = request.into_inner();
        let written = async {
            let (replica, batch) = self.admitted_write(&write.tablet_id, &write.batch).await?;
            let request = client_request(write.request);
            let written = (replica.txn_write(write.txn_id, &batch, write.prepare, request)).await;
            if matches!(written, Ok((_, Some(_)))) {
                crate::client::crash_point("txn-participant-prepared");
            }
            written
        }
        .await;
        self.respond(written.map(|(outcome, prepared)| WriteResponse {
            prepare_ts: prepared.map_or(0, |t| t.0),
            ..write_response(outcome)
        }))
    }

    async fn txn_prepare(
        &self,
        request: Request<TxnRequest>,
    ) -> std::result::Result<Response<TxnPrepareResponse>, Status> {
        let prepare = request.into_inner();
        let prepared = async {
            let replica = self.server.replica(&prepare.tablet_id)?;
            let prepared = replica.prepare_txn(prepare.txn_id).await;
            if prepared.is_ok() {
                crate::client::crash_point("txn-participant-prepared");
            }
            prepared
        }
        .await;
        self.respond(prepared.map(|ts| TxnPrepareResponse { prepare_ts: ts.0 }))
    }

    async fn txn_finish(
        &self,
        request: Request<TxnFinishRequest>,
    ) -> std::result::Result<Response<WriteResponse>, Status> {
        let finish = request.into_inner();
        let finished = async {
            let replica = self.server.replica(&finish.tablet_id)?;
            let commit = finish.commit.then_some(Timestamp(finish.commit_ts));
            replica.finish_txn(finish.txn_id, commit).await
        }
        .await;
        self.respond(finished.map(write_response))
    }

    async fn batch(
        &self,
        request: Request<CallBatch>,
    ) -> std::result::Result<Response<CallBatchResponse>, Status> {
        let calls = request
            .into_inner()
            .calls
            .into_iter()
            .map(|call| async move {
                let answer = match call.call {
                    Some(Call::Write(write)) => self.write(Request::new(write)).await,
                    Some(Call::TxnWrite(write)) => self.txn_write(Request::new(write)).await,
                    Some(Call::TxnFinish(finish)) => self.txn_finish(Request::new(finish)).await,
                    None => Err(Status::invalid_argument("a batched call without a request")),
                };
                match answer {
                    Ok(response) => BatchedAnswer {
                        response: Some(response.into_inner()),
                        ..BatchedAnswer::default()
                    },
                    Err(status) => BatchedAnswer {
                        response: None,
                        code: status.code() as i32,
                        message: status.message().to_string(),
                        details: status.details().to_vec().into(),
                    },
                }
            });
        let answers = futures::future::join_all(calls).await;
        Ok(Response::new(CallBatchResponse { answers }))
    }

    async fn scan_open(
        &self,
        request: Request<ScanOpenRequest>,
    ) -> std::result::Result<Response<ScanResponse>, Status> {
        let open = request.into_inner();
        let (server, scanners) = (self.server.clone(), self.scanners.clone());
        let opened = async move {
            let replica = server.replica(&open.tablet_id)?;
            let spec = ScanSpec::decode(&open.spec)?;
            if !open.this_replica {
                replica.confirm_leader().await?;
            }
            let snapshot = (spec.snapshot.0 != 0).then_some(spec.snapshot);
            let iter = match open.wait_ms {
                0 => None,
                wait => {
                    let wait = Duration::from_millis(wait.min(MAX_WAIT_MS));
                    Some(replica.scan_waiting(spec.clone(), snapshot, wait).await?)
                }
            };
            rpc::blocking(move || {
                let iter = match iter {
                    Some(iter) => iter,
                    None => replica.scan(spec, snapshot)?,
                };
                scanners.next_rows(scanners.open(iter))
            })
            .await
        };
        self.respond(opened.await)
    }

    async fn scan_next(
        &self,
        request: Request<ScanNextRequest>,
    ) -> std::result::Result<Response<ScanResponse>, Status> {
        let id = request.into_inner().scanner_id;
        let scanners = self.scanners.clone();
        self.respond(rpc::blocking(move || scanners.next_rows(id)).await)
    }

    async fn safe_snapshot(
        &self,
        request: Request<TabletRef>,
    ) -> std::result::Result<Response<SafeSnapshotResponse>, Status> {
        let snapshot = async {
            let replica = self.server.replica(&request.into_inner().tablet_id)?;
            // A snapshot at least as new as every write acknowledged before the call.
            replica.confirm_leader().await?;
            Ok(SafeSnapshotResponse {
                snapshot: replica.safe_snapshot().0,
            })
        };
        self.respond(snapshot.await)
    }

    async fn wait_for_write(
        &self,
        request: Request<WaitForWriteRequest>,
    ) -> std::result::Result<Response<WaitForWriteResponse>, Status> {
        let wait = request.into_inner();
        let timeout = Duration::from_millis(wait.timeout_ms.min(MAX_WAIT_MS));
        let replica = self.server.replica(&wait.tablet_id);
        let newest = match replica {
            Ok(replica) => Ok(replica.wait_for_write(Timestamp(wait.after), timeout).await),
            Err(e) => Err(e),
        };
        self.respond(newest.map(|t| WaitForWriteResponse { newest: t.0 }))
    }

    async fn status(
        &self,
        _request: Request<Empty>,
    ) -> std::result::Result<Response<ServerStatus>, Status> {
        Ok(Response::new(self.server.status()))
    }

    async fn fetch_tablet(
        &self,
        request: Request<TabletRef>,
    ) -> std::result::Result<Response<TabletFiles>, Status> {
        let tablet = request.into_inner();
        let (server, copies) = (self.server.clone(), self.copies.clone());
        let opened = rpc::blocking(move || copies.open(&server, &tablet.tablet_id)).await;
        self.respond(opened)
    }

    async fn fetch_chunk(
        &self,
        request: Request<FetchChunkRequest>,
    ) -> std::result::Result<Response<FetchChunkResponse>, Status> {
        let fetch = request.into_inner();
        let copies = self.copies.clone();
        let chunk =
            rpc::blocking(move || copies.chunk(fetch.session, fetch.file, fetch.offset)).await;
        self.respond(chunk.map(|chunk| FetchChunkResponse {
            chunk: chunk.into(),
        }))
    }

    async fn copy_tablet(
        &self,
        request: Request<CopyTabletRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        let copy = request.into_inner();
        self.respond(receive_copy(&self.server, &copy).await.map(|()| Empty {}))
    }

    async fn change_membership(
        &self,
        request: Request<ChangeMembershipRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        let change = request.into_inner();
        let changed = async {
            let replica = self.server.replica(&change.tablet_id)?;
            let kind = match MembershipChangeKind::try_from(change.change) {
                Ok(MembershipChangeKind::AddLearner) => {
                    MembershipChange::AddLearner(change.server_id)
                }
                Ok(MembershipChangeKind::AddVoter) => MembershipChange::AddVoter(change.server_id),
                Ok(MembershipChangeKind::Remove) => MembershipChange::Remove(change.server_id),
                _ => {
                    return Err(EngineError::Unsupported(format!(
                        "membership change {}",
                        change.change
                    )))
                }
            };
            let address =
                (!change.address.is_empty()).then_some((change.server_id, change.address));
            if let Some((id, a)) = &address {
                self.server.learn_address(*id, a.clone());
            }
            replica.change_membership(kind, address).await
        }
        .await;
        self.respond(changed.map(|()| Empty {}))
    }

    async fn transfer_leadership(
        &self,
        request: Request<TransferLeadershipRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        let transfer = request.into_inner();
        let done = self
            .server
            .replica(&transfer.tablet_id)
            .and_then(|replica| replica.transfer_leadership(transfer.to_server));
        self.respond(done.map(|()| Empty {}))
    }
}

/// The client's request a write carries, if its client tracks it.
fn client_request(request: Option<RequestId>) -> Option<ClientRequest> {
    let request = request.filter(|r| r.client != 0)?;
    Some(ClientRequest {
        id: nyala_storage::RequestId {
            client: request.client,
            seq: request.seq,
        },
        sent: Timestamp::from_micros(request.sent_micros),
    })
}

fn write_response(outcome: WriteOutcome) -> WriteResponse {
    WriteResponse {
        rows: outcome.rows as u64,
        conflicts: outcome.conflicts,
        visible_at: outcome.visible_at.map_or(0, |t| t.0),
        prepare_ts: 0,
    }
}
