//! The operators' client of a cluster's masters (`nyala admin`): it asks each master in turn
//! until one answers; operations that change the cluster are answered only by the master
//! leading the catalog (the others say NotLeaderMaster, and the next is asked).

use std::future::Future;
use std::time::Duration;

use crate::rpc;
use crate::rpc::proto::master::master_service_client::MasterServiceClient;
use crate::rpc::proto::master::{
    LeaderStepDownRequest, LeaderStepDownResponse, ListServersRequest, ListServersResponse,
    ListTabletsRequest, ListTabletsResponse, RebalanceRequest, ReplicaMove,
};
use crate::{EngineError, Result};

/// How long one call may take: a replica move copies a tablet and waits for it to catch up.
const CALL_TIMEOUT: Duration = Duration::from_secs(900);

/// A client of the masters listening at the given internal RPC addresses.
///
/// ```no_run
/// # use nyala_engine::client::AdminClient;
/// # async fn sketch() -> nyala_engine::Result<()> {
/// let admin = AdminClient::new(vec!["127.0.0.1:7051".into()]);
/// let events = admin.list_tablets("events").await?;
/// println!("{} table(s)", events.tables.len());
/// while let Some(moved) = admin.rebalance_once().await? { println!("{moved:?}"); }
/// # Ok(()) }
/// ```
pub struct AdminClient {
    masters: Vec<String>,
}

impl AdminClient {
    pub fn new(masters: Vec<String>) -> Self {
        Self { masters }
    }

    /// Calls the masters in turn until one answers; the last error if none does.
    async fn call<T, F, Fut>(&self, call: F) -> Result<T>
    where
        F: Fn(MasterServiceClient<rpc::RpcChannel>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut last_error = EngineError::Unavailable("no master given".into());
        for address in &self.masters {
            let answer = match rpc::connect_with_timeout(address, CALL_TIMEOUT).await {
                Ok(channel) => call(rpc::master(channel)).await.map_err(rpc::from_status),
                Err(e) => Err(e),
            };
            match answer {
                Ok(answer) => return Ok(answer.into_inner()),
                Err(e @ (EngineError::NotLeaderMaster { .. } | EngineError::Unavailable(_))) => {
                    last_error = e;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error)
    }

    /// The tablets of `table` (empty: every table) with their replicas.
    pub async fn list_tablets(&self, table: &str) -> Result<ListTabletsResponse> {
        self.call(|mut master| async move {
            let request = ListTabletsRequest {
                table: table.to_string(),
            };
            master.list_tablets(request).await
        })
        .await
    }

    /// Every tablet server the masters know, live or not.
    pub async fn list_servers(&self) -> Result<ListServersResponse> {
        self.call(|mut master| async move { master.list_servers(ListServersRequest {}).await })
            .await
    }

    /// Moves one replica to even out the servers; None when they are even.
    pub async fn rebalance_once(&self) -> Result<Option<ReplicaMove>> {
        let answer = self
            .call(|mut master| async move { master.rebalance_once(RebalanceRequest {}).await })
            .await?;
        Ok(answer.moved)
    }

    /// Has the leader of `tablet` hand leadership to another replica.
    pub async fn leader_step_down(&self, tablet: &str) -> Result<LeaderStepDownResponse> {
        self.call(|mut master| async move {
            let request = LeaderStepDownRequest {
                tablet_id: tablet.to_string(),
            };
            master.leader_step_down(request).await
        })
        .await
    }
}
