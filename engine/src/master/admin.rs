//! What operators ask of a master (`nyala admin`, the web UI's cluster page): every tablet with
//! where the catalog placed its replicas and what each replica last reported, the tablet
//! servers, moving replicas to even the servers out (rebalancing) and having a tablet's leader
//! step down.
//!
//! Rebalancing moves one replica per call, through the same steps as re-replication
//! ([`Master::replace_replica`]: copy, learner, voter, removal, catalog), from the live server
//! that holds the most replicas to the one that holds the fewest, while they differ by more
//! than one. A replica that leads its tablet is moved only after handing leadership over.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use super::registry::{ServerSummary, TServerRegistry};
use super::Master;
use crate::client::meta_cache::SERVER_TIMEOUT;
use crate::rpc::proto::master::{
    ListServersResponse, ListTabletsResponse, ReplicaMove, ReplicaReport, ServerInfo, TableTablets,
    TabletReplicas,
};
use crate::rpc::proto::tserver::TransferLeadershipRequest;
use crate::{EngineError, Result};

/// How long a step-down waits for the new leader to report itself.
const STEP_DOWN_TIMEOUT: Duration = Duration::from_secs(15);

/// The servers `registry` knows, live or not, for operators.
pub fn list_servers(registry: &TServerRegistry) -> ListServersResponse {
    ListServersResponse {
        servers: registry.servers().iter().map(server_info).collect(),
    }
}

fn server_info(s: &ServerSummary) -> ServerInfo {
    ServerInfo {
        server_id: s.id,
        address: s.address.clone(),
        live: s.live,
        silent_ms: s.silent_for.as_millis() as u64,
        replicas: s.replicas as u32,
        leaders: s.leaders as u32,
    }
}

impl Master {
    /// Errs with NotLeaderMaster unless this master leads the catalog (operations that change
    /// the cluster run there).
    fn ensure_leading(&self) -> Result<()> {
        let group = self.catalog.group_state();
        match group.leader == self.catalog.node_id() {
            true => Ok(()),
            false => Err(self.not_leader((group.leader != 0).then_some(group.leader))),
        }
    }

    /// The tablets of `table` (empty: of every table), each with its replicas: those the
    /// catalog placed and any other server that reports one.
    pub fn list_tablets(
        &self,
        registry: &TServerRegistry,
        table: &str,
    ) -> Result<ListTabletsResponse> {
        let tables = match table {
            "" => self.tables(),
            name => vec![self.existing(name)?],
        };
        let servers: HashMap<u64, ServerSummary> =
            registry.servers().into_iter().map(|s| (s.id, s)).collect();
        let tables = tables
            .iter()
            .map(|t| TableTablets {
                name: t.name.clone(),
                id: t.id.clone(),
                tablets: t
                    .tablets
                    .iter()
                    .map(|tablet| {
                        let placement = t.placement.get(tablet).cloned().unwrap_or_default();
                        let reporting = servers
                            .keys()
                            .filter(|&&s| registry.replica_status(s, tablet).is_some());
                        let members: BTreeSet<u64> =
                            placement.iter().chain(reporting).copied().collect();
                        TabletReplicas {
                            tablet_id: tablet.clone(),
                            placement,
                            replicas: members
                                .into_iter()
                                .map(|s| ReplicaReport {
                                    server_id: s,
                                    live: servers.get(&s).is_some_and(|s| s.live),
                                    status: registry.replica_status(s, tablet),
                                })
                                .collect(),
                        }
                    })
                    .collect(),
            })
            .collect();
        Ok(ListTabletsResponse { tables })
    }

    /// Moves one replica from the live server holding the most to the one holding the fewest
    /// (by the catalog's placement), if they differ by more than one; the move, or None when
    /// the servers are even or no replica can move (every candidate tablet has a replica on a
    /// server that is not live, or on the target already).
    pub async fn rebalance_once(&self, registry: &TServerRegistry) -> Result<Option<ReplicaMove>> {
        self.ensure_leading()?;
        let live = registry.live_servers();
        let mut held: BTreeMap<u64, usize> = live.iter().map(|(id, _, _)| (*id, 0)).collect();
        let tables = self.tables();
        for servers in tables.iter().flat_map(|t| t.placement.values()) {
            for server in servers {
                if let Some(n) = held.get_mut(server) {
                    *n += 1;
                }
            }
        }
        // The fullest (lowest id first among equals) and the emptiest.
        let Some((&from, &most)) = held
            .iter()
            .max_by_key(|(id, n)| (**n, std::cmp::Reverse(**id)))
        else {
            return Ok(None);
        };
        let Some((&to, &least)) = held.iter().min_by_key(|(id, n)| (**n, **id)) else {
            return Ok(None);
        };
        if most <= least + 1 {
            return Ok(None);
        }
        let mut candidates: Vec<_> = tables
            .iter()
            .flat_map(|t| t.placement.iter().map(move |(tablet, s)| (t, tablet, s)))
            .filter(|(_, tablet, servers)| {
                servers.contains(&from)
                    && !servers.contains(&to)
                    && servers.iter().all(|s| held.contains_key(s))
                    && registry.replica_status(to, tablet).is_none()
            })
            .collect();
        // Tablets that `from` does not lead first: they move without a leader change.
        candidates.sort_by_key(|(_, tablet, _)| registry.meta().leader_of(tablet) == Some(from));
        let Some((table, tablet, servers)) = candidates.into_iter().next() else {
            return Ok(None);
        };
        let leader = match registry.meta().leader_of(tablet) {
            Some(leader) if leader == from => self.leader_step_down(registry, tablet).await?.1,
            Some(leader) => leader,
            None => {
                return Err(EngineError::Unavailable(format!(
                    "tablet {tablet} has no known leader"
                )))
            }
        };
        let to_address = registry.address(to)?;
        tracing::info!(%tablet, from, to, "rebalancing");
        self.replace_replica(
            registry, table, tablet, servers, leader, from, to, to_address,
        )
        .await?;
        crate::metrics::engine().replica_moves.inc();
        Ok(Some(ReplicaMove {
            tablet_id: tablet.clone(),
            from_server: from,
            to_server: to,
        }))
    }

    /// Has the leader of `tablet` hand leadership to the live voter that has applied the most,
    /// and waits until that voter reports that it leads; (old leader, new leader).
    pub async fn leader_step_down(
        &self,
        registry: &TServerRegistry,
        tablet: &str,
    ) -> Result<(u64, u64)> {
        self.ensure_leading()?;
        let servers = self
            .tables()
            .iter()
            .find_map(|t| t.placement.get(tablet).cloned())
            .ok_or_else(|| EngineError::TabletNotFound(tablet.to_string()))?;
        let leader = registry
            .meta()
            .leader_of(tablet)
            .filter(|l| servers.contains(l))
            .ok_or_else(|| {
                EngineError::Unavailable(format!("tablet {tablet} has no known leader"))
            })?;
        let target = servers
            .iter()
            .copied()
            .filter(|&s| s != leader && registry.silent_for(s).is_some_and(|t| t < SERVER_TIMEOUT))
            .max_by_key(|&s| {
                registry
                    .replica_status(s, tablet)
                    .map_or(0, |r| r.last_applied)
            })
            .ok_or_else(|| {
                EngineError::Unavailable(format!(
                    "tablet {tablet} has no other live replica to lead it"
                ))
            })?;
        let request = TransferLeadershipRequest {
            tablet_id: tablet.to_string(),
            to_server: target,
        };
        registry
            .meta()
            .call_server(leader, |mut c| async move {
                c.transfer_leadership(request).await
            })
            .await?;
        let deadline = tokio::time::Instant::now() + STEP_DOWN_TIMEOUT;
        loop {
            let reported = registry.report_received();
            let mut reported = std::pin::pin!(reported);
            reported.as_mut().enable();
            if registry
                .replica_status(target, tablet)
                .is_some_and(|r| r.leader == target)
            {
                return Ok((leader, target));
            }
            if tokio::time::timeout_at(deadline, reported).await.is_err() {
                return Err(EngineError::Unavailable(format!(
                    "server {target} did not take over the leadership of tablet {tablet} \
                     within {} s",
                    STEP_DOWN_TIMEOUT.as_secs()
                )));
            }
        }
    }
}
