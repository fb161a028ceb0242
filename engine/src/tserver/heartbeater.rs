//! The heartbeater: a tablet server's reports to the masters, every [`HEARTBEAT_INTERVAL`].
//! The first report to a master is full; later ones hold only the replicas whose status
//! changed and the ids of those removed, unless the master asks for a full one again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::TabletServer;
use crate::rpc;
use crate::rpc::proto::common::{ReplicaStatus, ServerStatus};
use crate::rpc::proto::master::master_service_client::MasterServiceClient;
use crate::rpc::proto::master::HeartbeatRequest;

const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);

/// Sends `server`'s reports (its status, and that it listens at `address`) to every one of
/// `masters`, until the process ends.
pub async fn heartbeat_loop(server: Arc<TabletServer>, address: String, masters: Vec<String>) {
    let mut clients: HashMap<String, MasterServiceClient<rpc::RpcChannel>> = HashMap::new();
    // What each master was last told (absent: it gets a full report next).
    let mut told: HashMap<String, HashMap<String, ReplicaStatus>> = HashMap::new();
    loop {
        let status = server.status();
        for master in &masters {
            if !clients.contains_key(master) {
                match rpc::connect(master).await {
                    Ok(channel) => {
                        clients.insert(master.clone(), rpc::master(channel));
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
            let heartbeat = HeartbeatRequest {
                address: address.clone(),
                status: Some(ServerStatus {
                    server_id: status.server_id,
                    replicas: changed,
                }),
                full: last.is_none(),
                removed,
            };
            match client.heartbeat(heartbeat).await {
                Ok(answer) if answer.get_ref().need_full => {
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
        tokio::time::sleep(HEARTBEAT_INTERVAL).await;
    }
}
