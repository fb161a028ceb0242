//! The tablet servers of a cluster as the master knows them from their reports (Kudu's
//! TSManager): where each listens, when it was last heard from, the status of each of its
//! replicas, and which members each tablet's leader no longer hears from. Re-replication and
//! the placement of new tablets decide from it; every report is passed on to the master's own
//! [`MetaCache`], through which it calls the servers.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use crate::client::meta_cache::SERVER_TIMEOUT;
use crate::client::MetaCache;
use crate::rpc::proto::common::{ReplicaStatus, ServerStatus};
use crate::rpc::proto::master::ServerReport;
use crate::Result;

/// A tablet server as the master knows it, for operators (the cluster page, `nyala admin`).
#[derive(Clone, Debug)]
pub struct ServerSummary {
    pub id: u64,
    pub address: String,
    /// Heard from within [`SERVER_TIMEOUT`].
    pub live: bool,
    pub silent_for: Duration,
    /// Replicas it last reported, and how many of them lead their tablet.
    pub replicas: usize,
    pub leaders: usize,
}

/// What the master knows of one tablet server.
struct ServerEntry {
    address: String,
    last_seen: Instant,
    status: ServerStatus,
}

pub struct TServerRegistry {
    servers: RwLock<BTreeMap<u64, ServerEntry>>,
    /// Since when each tablet's leader has reported a member it does not hear from, by
    /// (tablet, server).
    inactive_since: RwLock<HashMap<(String, u64), Instant>>,
    /// Notified after every report, for those who wait for what reports tell (how far a
    /// replica has applied).
    reported: tokio::sync::Notify,
    meta: Arc<MetaCache>,
}

impl TServerRegistry {
    pub fn new(meta: Arc<MetaCache>) -> Arc<Self> {
        Arc::new(Self {
            servers: RwLock::default(),
            inactive_since: RwLock::default(),
            reported: tokio::sync::Notify::new(),
            meta,
        })
    }

    /// The master's view of the servers, through which it calls them.
    pub fn meta(&self) -> &Arc<MetaCache> {
        &self.meta
    }

    /// Records a tablet server's report: its full status, or (`full` false) the replicas that
    /// changed since its last report and those it no longer holds. Returns false if an
    /// incremental report came from a server this master does not know: it must send a full
    /// one.
    pub fn report(
        &self,
        address: String,
        status: ServerStatus,
        full: bool,
        removed: &[String],
    ) -> bool {
        let mut servers = self.servers.write();
        let entry = match servers.get_mut(&status.server_id) {
            Some(entry) if !full => entry,
            None if !full => return false,
            _ => servers.entry(status.server_id).or_insert(ServerEntry {
                address: address.clone(),
                last_seen: Instant::now(),
                status: ServerStatus {
                    server_id: status.server_id,
                    replicas: vec![],
                },
            }),
        };
        if full {
            entry.status.replicas.clear();
        }
        entry.address = address;
        entry.last_seen = Instant::now();
        entry.status.replicas.retain(|r| {
            !removed.contains(&r.tablet_id)
                && !status.replicas.iter().any(|n| n.tablet_id == r.tablet_id)
        });
        entry
            .status
            .replicas
            .extend(status.replicas.iter().cloned());
        self.meta.observe(&entry.address, &entry.status);
        drop(servers);
        let mut inactive = self.inactive_since.write();
        for replica in &status.replicas {
            if replica.leader == status.server_id {
                inactive
                    .retain(|(t, s), _| *t != replica.tablet_id || replica.inactive.contains(s));
                for &member in &replica.inactive {
                    inactive
                        .entry((replica.tablet_id.clone(), member))
                        .or_insert_with(Instant::now);
                }
            }
        }
        drop(inactive);
        self.reported.notify_waiters();
        true
    }

    /// Resolves after the next report. Enable it (see [`tokio::sync::Notified::enable`])
    /// before looking at what reports told so far, so a report in between is not missed.
    pub fn report_received(&self) -> tokio::sync::futures::Notified<'_> {
        self.reported.notified()
    }

    /// Every live server's address and last report (for coordinators that are not masters).
    pub fn view(&self) -> Vec<ServerReport> {
        self.servers
            .read()
            .values()
            .filter(|s| s.last_seen.elapsed() < SERVER_TIMEOUT)
            .map(|s| ServerReport {
                address: s.address.clone(),
                status: Some(s.status.clone()),
            })
            .collect()
    }

    /// Every server that ever reported to this master, live or not, by id.
    pub fn servers(&self) -> Vec<ServerSummary> {
        self.servers
            .read()
            .iter()
            .map(|(id, s)| ServerSummary {
                id: *id,
                address: s.address.clone(),
                live: s.last_seen.elapsed() < SERVER_TIMEOUT,
                silent_for: s.last_seen.elapsed(),
                replicas: s.status.replicas.len(),
                leaders: s.status.replicas.iter().filter(|r| r.leader == *id).count(),
            })
            .collect()
    }

    /// The servers heard from recently: (id, address, replicas held).
    pub fn live_servers(&self) -> Vec<(u64, String, usize)> {
        self.servers
            .read()
            .iter()
            .filter(|(_, s)| s.last_seen.elapsed() < SERVER_TIMEOUT)
            .map(|(id, s)| (*id, s.address.clone(), s.status.replicas.len()))
            .collect()
    }

    /// Counts a replica placed on `server` before the server reports it, so the next tablet
    /// of the same table goes elsewhere.
    pub fn count_placed(&self, server: u64, tablet_id: &str) {
        if let Some(entry) = self.servers.write().get_mut(&server) {
            entry.status.replicas.push(ReplicaStatus {
                tablet_id: tablet_id.into(),
                ..Default::default()
            });
        }
    }

    /// How long ago server `id` was last heard from (None: never).
    pub fn silent_for(&self, id: u64) -> Option<Duration> {
        self.servers.read().get(&id).map(|s| s.last_seen.elapsed())
    }

    /// How long the leader of `tablet` has not heard from its member `server` (None: it
    /// does).
    pub fn unreachable_for(&self, tablet: &str, server: u64) -> Option<Duration> {
        self.inactive_since
            .read()
            .get(&(tablet.to_string(), server))
            .map(Instant::elapsed)
    }

    /// Every replica server `id` last reported.
    pub fn replicas_of(&self, id: u64) -> Vec<ReplicaStatus> {
        self.servers
            .read()
            .get(&id)
            .map(|s| s.status.replicas.clone())
            .unwrap_or_default()
    }

    /// What server `id` last reported of its replica of `tablet`.
    pub fn replica_status(&self, id: u64, tablet: &str) -> Option<ReplicaStatus> {
        let servers = self.servers.read();
        let status = &servers.get(&id)?.status;
        status
            .replicas
            .iter()
            .find(|r| r.tablet_id == tablet)
            .cloned()
    }

    pub fn address(&self, server: u64) -> Result<String> {
        self.meta.address(server)
    }
}
