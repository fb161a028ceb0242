//! The master's RPC service: tablet servers' reports in, the cluster view and DDL for
//! coordinators. DDL runs only on the master that leads the replicated catalog; the others
//! answer NotLeaderMaster, and the coordinator tries the next. So do rebalancing and leader
//! step-downs, which operators ask for (`nyala admin`).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::registry::TServerRegistry;
use super::Master;
use crate::catalog::{CatalogContents, DdlOp};
use crate::rpc;
use crate::rpc::proto::master::master_service_server::{self, MasterServiceServer};
use crate::rpc::proto::master::{
    ClusterViewRequest, ClusterViewResponse, DdlRequest, DdlResponse, HeartbeatRequest,
    HeartbeatResponse, LeaderStepDownRequest, LeaderStepDownResponse, ListServersRequest,
    ListServersResponse, ListTabletsRequest, ListTabletsResponse, RebalanceRequest,
    RebalanceResponse,
};
use crate::{EngineError, Result};

pub struct MasterService {
    master: Arc<Master>,
    registry: Arc<TServerRegistry>,
}

impl MasterService {
    pub fn new(master: Arc<Master>, registry: Arc<TServerRegistry>) -> Self {
        Self { master, registry }
    }

    /// The gRPC service.
    pub fn into_server(self) -> MasterServiceServer<Self> {
        MasterServiceServer::new(self)
            .max_decoding_message_size(rpc::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(rpc::MAX_MESSAGE_BYTES)
    }

    fn respond<T>(&self, result: Result<T>) -> std::result::Result<Response<T>, Status> {
        rpc::respond(result, |_| None)
    }
}

#[tonic::async_trait]
impl master_service_server::MasterService for MasterService {
    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> std::result::Result<Response<HeartbeatResponse>, Status> {
        let heartbeat = request.into_inner();
        let Some(status) = heartbeat.status else {
            return Err(Status::invalid_argument("a heartbeat without a status"));
        };
        let known = self.registry.report(
            heartbeat.address,
            status,
            heartbeat.full,
            &heartbeat.removed,
        );
        Ok(Response::new(HeartbeatResponse { need_full: !known }))
    }

    async fn cluster_view(
        &self,
        request: Request<ClusterViewRequest>,
    ) -> std::result::Result<Response<ClusterViewResponse>, Status> {
        let known = request.into_inner().catalog_version;
        let contents = CatalogContents {
            tables: self.master.tables().iter().map(|t| (**t).clone()).collect(),
            views: self.master.views().iter().map(|v| (**v).clone()).collect(),
            users: self.master.users().iter().map(|u| (**u).clone()).collect(),
        };
        let json = match serde_json::to_string(&contents) {
            Ok(json) => json,
            Err(e) => return self.respond(Err(EngineError::CatalogCorrupted(e.to_string()))),
        };
        // The version is the catalog's digest: equal versions hold the same tables.
        let version = xxhash_rust::xxh64::xxh64(json.as_bytes(), 0).max(1);
        Ok(Response::new(ClusterViewResponse {
            catalog_json: (known != version).then_some(json),
            servers: self.registry.view(),
            catalog_version: version,
        }))
    }

    async fn ddl(
        &self,
        request: Request<DdlRequest>,
    ) -> std::result::Result<Response<DdlResponse>, Status> {
        let done = async {
            let op: DdlOp = serde_json::from_str(&request.into_inner().op_json)
                .map_err(|e| EngineError::InvalidTable(format!("bad DDL: {e}")))?;
            self.master.ddl(op).await
        }
        .await;
        self.respond(done.map(|applied| DdlResponse { applied }))
    }

    async fn list_tablets(
        &self,
        request: Request<ListTabletsRequest>,
    ) -> std::result::Result<Response<ListTabletsResponse>, Status> {
        let table = request.into_inner().table;
        self.respond(self.master.list_tablets(&self.registry, &table))
    }

    async fn list_servers(
        &self,
        _request: Request<ListServersRequest>,
    ) -> std::result::Result<Response<ListServersResponse>, Status> {
        Ok(Response::new(super::admin::list_servers(&self.registry)))
    }

    async fn rebalance_once(
        &self,
        _request: Request<RebalanceRequest>,
    ) -> std::result::Result<Response<RebalanceResponse>, Status> {
        let moved = self.master.rebalance_once(&self.registry).await;
        self.respond(moved.map(|moved| RebalanceResponse { moved }))
    }

    async fn leader_step_down(
        &self,
        request: Request<LeaderStepDownRequest>,
    ) -> std::result::Result<Response<LeaderStepDownResponse>, Status> {
        let tablet = request.into_inner().tablet_id;
        let done = self.master.leader_step_down(&self.registry, &tablet).await;
        self.respond(done.map(|(old_leader, new_leader)| LeaderStepDownResponse {
            old_leader,
            new_leader,
        }))
    }
}
