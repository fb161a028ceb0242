//! Re-replication (Kudu's re-replication of under-replicated tablets), on the master that
//! leads the catalog, one tablet at a time: a member on a server that has been silent, or that
//! its tablet's leader has not heard from, for longer than the unavailability timeout is
//! replaced by a copy on a live server that has none. The copy joins as a learner, becomes a
//! voter once it has caught up, then the silent member is removed and the catalog updated.
//! Replicas that belong to no table, or to no group any more, are deleted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use nyala_storage::WriteKind;

use super::registry::TServerRegistry;
use super::Master;
use crate::catalog::TableInfo;
use crate::rpc::proto::common::{Peer, TabletRef};
use crate::rpc::proto::tserver::{
    ChangeMembershipRequest, CopyTabletRequest, MembershipChangeKind,
};
use crate::{EngineError, Result};

/// How often the leading master looks for tablets to repair.
const REPAIR_INTERVAL: Duration = Duration::from_secs(1);

impl Master {
    /// Starts re-replication in the background: replicas on tablet servers silent for longer
    /// than `unavailable` are re-created elsewhere. Stops when the master is dropped.
    pub fn start_repairs(self: &Arc<Self>, registry: Arc<TServerRegistry>, unavailable: Duration) {
        let master = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REPAIR_INTERVAL).await;
                let Some(master) = master.upgrade() else {
                    return;
                };
                if let Err(e) = master.repair_once(&registry, unavailable).await {
                    tracing::warn!(error = %e, "re-replication failed; retrying");
                }
            }
        });
    }

    /// Re-replication, one tablet at a time (on the master that leads the catalog): a tablet
    /// with a replica on a server silent for longer than `unavailable`, or that the tablet's
    /// leader has not heard from for that long, gets a new replica on a
    /// live server that has none: copied from the leader, added as a learner, promoted to voter
    /// once it has caught up, and then the silent member is removed and the catalog updated.
    /// Returns whether a tablet was repaired.
    pub async fn repair_once(
        &self,
        registry: &TServerRegistry,
        unavailable: Duration,
    ) -> Result<bool> {
        if self.catalog.group_state().leader != self.catalog.node_id() {
            return Ok(false);
        }
        self.delete_stale_replicas(registry).await;
        for table in self.tables() {
            for (tablet, servers) in &table.placement {
                // A member whose server is silent, or whom the leader does not hear from.
                let gone = |s: u64| {
                    registry.silent_for(s).is_none_or(|t| t > unavailable)
                        || registry
                            .unreachable_for(tablet, s)
                            .is_some_and(|t| t > unavailable)
                };
                let Some(&dead) = servers.iter().find(|s| gone(**s)) else {
                    continue;
                };
                let Some(leader) = registry
                    .meta()
                    .leader_of(tablet)
                    .filter(|l| servers.contains(l) && *l != dead)
                else {
                    continue;
                };
                let mut candidates: Vec<(u64, String, usize)> = registry
                    .live_servers()
                    .into_iter()
                    .filter(|(id, _, _)| {
                        !servers.contains(id) && registry.replica_status(*id, tablet).is_none()
                    })
                    .collect();
                candidates.sort_by_key(|(id, _, held)| (*held, *id));
                let Some((target, target_address, _)) = candidates.into_iter().next() else {
                    tracing::warn!(%tablet, "no live server to re-replicate to");
                    continue;
                };
                tracing::info!(%tablet, dead, target, "re-replicating");
                crate::metrics::engine().replica_moves.inc();
                self.replace_replica(
                    registry,
                    &table,
                    tablet,
                    servers,
                    leader,
                    dead,
                    target,
                    target_address,
                )
                .await?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Deletes replicas that live servers hold but that belong to no table, or that their
    /// tablet's group no longer counts as members (a server back after it was replaced, or a
    /// copy whose re-replication failed). Not while a replica moves: its copy is in no group
    /// until the leader has added it and reported so (deleting it there left a rebalance
    /// waiting for a learner that was gone).
    async fn delete_stale_replicas(&self, registry: &TServerRegistry) {
        // Holding the DDL lock: a table being created has replicas before the catalog has it.
        let _ddl = self.ddl.lock().await;
        // (A move takes the DDL lock while it holds this one: not waited for here.)
        let Ok(_no_move) = self.moves.try_lock() else {
            return;
        };
        let placement: HashMap<String, Vec<u64>> = self
            .tables()
            .iter()
            .flat_map(|t| {
                t.tablets
                    .iter()
                    .map(move |id| (id.clone(), t.placement.get(id).cloned().unwrap_or_default()))
            })
            .collect();
        for (server, _, _) in registry.live_servers() {
            for replica in registry.replicas_of(server) {
                let tablet = &replica.tablet_id;
                let stale = match placement.get(tablet) {
                    None => true,
                    Some(servers) if servers.contains(&server) => false,
                    Some(_) => registry
                        .meta()
                        .leader_of(tablet)
                        .and_then(|l| registry.replica_status(l, tablet))
                        .is_some_and(|r| {
                            !r.voters.contains(&server) && !r.learners.contains(&server)
                        }),
                };
                if !stale {
                    continue;
                }
                tracing::info!(%tablet, server, "deleting a stale replica");
                let request = TabletRef {
                    tablet_id: tablet.clone(),
                };
                let deleted = registry
                    .meta()
                    .call_server(
                        server,
                        |mut c| async move { c.delete_replica(request).await },
                    )
                    .await;
                if let Err(e) = deleted {
                    tracing::warn!(%tablet, server, error = %e, "cannot delete a stale replica");
                }
            }
        }
    }

    /// Replaces the replica of `tablet` on `leaving` by a new one on `target`: copied from
    /// the leader, added as a learner, promoted once caught up; then `leaving` is removed from
    /// the group and the catalog updated. One move at a time (`moves`).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn replace_replica(
        &self,
        registry: &TServerRegistry,
        table: &TableInfo,
        tablet: &str,
        servers: &[u64],
        leader: u64,
        leaving: u64,
        target: u64,
        target_address: String,
    ) -> Result<()> {
        let _move = self.moves.lock().await;
        let mut peers: Vec<Peer> = Vec::new();
        for &s in servers.iter().filter(|&&s| s != leaving) {
            peers.push(Peer {
                server_id: s,
                address: registry.address(s)?,
            });
        }
        peers.push(Peer {
            server_id: target,
            address: target_address.clone(),
        });
        let copy = CopyTabletRequest {
            tablet_id: tablet.into(),
            source: registry.address(leader)?,
            peers,
        };
        registry
            .meta()
            .call_server(target, |mut c| async move { c.copy_tablet(copy).await })
            .await?;
        let change = |change: MembershipChangeKind, server: u64, address: String| {
            let change = ChangeMembershipRequest {
                tablet_id: tablet.into(),
                change: change as i32,
                server_id: server,
                address,
            };
            async move {
                registry
                    .meta()
                    .call_leader(tablet, |mut c| {
                        let change = change.clone();
                        async move { c.change_membership(change).await }
                    })
                    .await
                    .map(drop)
            }
        };
        change(
            MembershipChangeKind::AddLearner,
            target,
            target_address.clone(),
        )
        .await?;
        // Promote once the learner has applied what the leader had committed, as the
        // servers' reports tell.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
        loop {
            let reported = registry.report_received();
            let mut reported = std::pin::pin!(reported);
            reported.as_mut().enable();
            let committed = registry
                .meta()
                .leader_of(tablet)
                .and_then(|l| registry.replica_status(l, tablet))
                .map(|r| r.commit);
            let applied = registry
                .replica_status(target, tablet)
                .map(|r| r.last_applied);
            if let (Some(c), Some(a)) = (committed, applied) {
                if a >= c {
                    break;
                }
            }
            if tokio::time::timeout_at(deadline, reported).await.is_err() {
                return Err(EngineError::Unavailable(format!(
                    "the new replica of tablet {tablet} did not catch up"
                )));
            }
        }
        change(MembershipChangeKind::AddVoter, target, target_address).await?;
        change(MembershipChangeKind::Remove, leaving, String::new()).await?;
        let _ddl = self.ddl.lock().await;
        let Some(current) = self.table(&table.name) else {
            return Ok(());
        };
        let mut updated = (*current).clone();
        if let Some(placed) = updated.placement.get_mut(tablet) {
            placed.retain(|&s| s != leaving);
            placed.push(target);
        }
        self.write_catalog(WriteKind::Upsert, &updated).await?;
        self.tables
            .write()
            .insert(updated.name.clone(), Arc::new(updated));
        Ok(())
    }
}
