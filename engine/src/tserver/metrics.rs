//! A tablet server's state as metrics: each replica's memory, files and Raft state, and the
//! server's memory against its limit, read from the live server when `/metrics` is scraped
//! (the state half of [`crate::metrics`]; events are counted there, where they happen).
//!
//! The collector holds the server weakly: a scrape of a stopped server shows nothing, and
//! nothing is kept between scrapes.

use std::sync::{Arc, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::{encode, Gauges};
use crate::tserver::replica::TabletReplica;
use crate::tserver::TabletServer;

/// Raft state of replicas, one series per tablet: term, leader, indexes, followers' lag.
pub(crate) struct RaftGauges {
    term: Gauges,
    leader: Gauges,
    commit: Gauges,
    applied: Gauges,
    lag: Gauges,
    log: Gauges,
}

impl RaftGauges {
    pub(crate) fn new() -> Self {
        Self {
            term: Gauges::new("nyala_raft_term", "The Raft term a replica is in"),
            leader: Gauges::new(
                "nyala_raft_leader",
                "The server id of the leader a replica knows (0: none)",
            ),
            commit: Gauges::new("nyala_raft_commit_index", "A replica's Raft commit index"),
            applied: Gauges::new(
                "nyala_raft_applied_index",
                "The last log entry a replica applied",
            ),
            lag: Gauges::new(
                "nyala_raft_follower_lag_entries",
                "On a leader: committed entries a member's log does not have yet",
            ),
            log: Gauges::new("nyala_raft_log_bytes", "Bytes of a replica's log on disk"),
        }
    }

    pub(crate) fn add(&self, replica: &TabletReplica) {
        let tablet = replica.id();
        let group = replica.group_state();
        let labels = [("tablet", tablet)];
        self.term.set(&labels, group.term as i64);
        self.leader.set(&labels, group.leader as i64);
        self.commit.set(&labels, group.commit as i64);
        self.applied.set(&labels, replica.last_applied() as i64);
        self.log.set(&labels, replica.log_bytes() as i64);
        if group.leader == replica.node_id() {
            for (member, matched) in &group.matched {
                if *member != group.leader {
                    let follower = member.to_string();
                    self.lag.set(
                        &[("tablet", tablet), ("follower", &follower)],
                        group.commit.saturating_sub(*matched) as i64,
                    );
                }
            }
        }
    }

    pub(crate) fn encode(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        for gauges in [
            &self.term,
            &self.leader,
            &self.commit,
            &self.applied,
            &self.lag,
            &self.log,
        ] {
            gauges.encode(encoder)?;
        }
        Ok(())
    }
}

/// The state of a tablet server's replicas, read at every scrape.
#[derive(Debug)]
struct TabletServerCollector(Weak<TabletServer>);

impl Collector for TabletServerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let Some(server) = self.0.upgrade() else {
            return Ok(());
        };
        let memory = Gauges::new(
            "nyala_tablet_memory_bytes",
            "Unflushed data (MemRowSet and deltas) of a tablet replica",
        );
        let disk = Gauges::new(
            "nyala_tablet_disk_bytes",
            "A tablet replica's files on disk",
        );
        let rows = Gauges::new(
            "nyala_tablet_estimated_rows",
            "Rows of a tablet replica in memory and on disk, deleted and updated ones included",
        );
        let rowsets = Gauges::new("nyala_tablet_rowsets", "DiskRowSets of a tablet replica");
        let deltas = Gauges::new(
            "nyala_tablet_delta_files",
            "UNDO and REDO delta files of a tablet replica",
        );
        let raft = RaftGauges::new();
        let replicas = server.replicas();
        for replica in &replicas {
            let labels = [("tablet", replica.id())];
            let tablet = replica.tablet();
            memory.set(&labels, tablet.memory_bytes() as i64);
            disk.set(&labels, tablet.disk_bytes() as i64);
            rows.set(&labels, tablet.estimated_rows() as i64);
            rowsets.set(&labels, tablet.rowset_count() as i64);
            deltas.set(&labels, tablet.delta_file_count() as i64);
            raft.add(replica);
        }
        for gauges in [&memory, &disk, &rows, &rowsets, &deltas] {
            gauges.encode(&mut encoder)?;
        }
        raft.encode(&mut encoder)?;
        let total = Gauge::<i64>::default();
        total.set(server.memory_bytes() as i64);
        encode(
            &mut encoder,
            "nyala_server_memory_bytes",
            "Unflushed data of all the server's tablet replicas",
            &total,
        )?;
        let limit = Gauge::<i64>::default();
        limit.set(server.memory_limit() as i64);
        encode(
            &mut encoder,
            "nyala_server_memory_limit_bytes",
            "The unflushed data the server's replicas may hold together before writers wait",
            &limit,
        )?;
        let count = Gauge::<i64>::default();
        count.set(replicas.len() as i64);
        encode(
            &mut encoder,
            "nyala_server_replicas",
            "Tablet replicas on this server",
            &count,
        )
    }
}

/// Registers the state of `server`'s replicas (memory, files, Raft) in `registry`.
pub fn register_tablet_server(registry: &mut Registry, server: &Arc<TabletServer>) {
    registry.register_collector(Box::new(TabletServerCollector(Arc::downgrade(server))));
}
