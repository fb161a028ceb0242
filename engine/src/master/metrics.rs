//! What a master knows as metrics: its tablet servers (live or not, replicas held), the
//! catalog's tables and tablets, and the Raft state of the catalog's replica, read when
//! `/metrics` is scraped (the state half of [`crate::metrics`], as
//! [`crate::tserver::metrics`] is for a tablet server).

use std::sync::{Arc, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::master::{Master, TServerRegistry};
use crate::metrics::{encode, Gauges};
use crate::tserver::metrics::RaftGauges;

/// What a master knows, read at every scrape: its tablet servers, the catalog, and the Raft
/// state of the catalog's replica.
#[derive(Debug)]
struct MasterCollector {
    master: Weak<Master>,
    registry: Weak<TServerRegistry>,
}

impl Collector for MasterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let (Some(master), Some(registry)) = (self.master.upgrade(), self.registry.upgrade())
        else {
            return Ok(());
        };
        let servers = registry.servers();
        let live = Gauges::new(
            "nyala_master_tablet_server_live",
            "Whether a tablet server was heard from recently (1) or not (0)",
        );
        let replicas = Gauges::new(
            "nyala_master_tablet_server_replicas",
            "Replicas a tablet server last reported",
        );
        for server in &servers {
            let id = server.id.to_string();
            let labels = [
                ("server", id.as_str()),
                ("address", server.address.as_str()),
            ];
            live.set(&labels, server.live as i64);
            replicas.set(&labels, server.replicas as i64);
        }
        live.encode(&mut encoder)?;
        replicas.encode(&mut encoder)?;
        let tables = master.tables();
        let count = Gauge::<i64>::default();
        count.set(tables.len() as i64);
        encode(
            &mut encoder,
            "nyala_master_tables",
            "Tables in the catalog",
            &count,
        )?;
        let tablets = Gauge::<i64>::default();
        tablets.set(tables.iter().map(|t| t.tablets.len() as i64).sum());
        encode(
            &mut encoder,
            "nyala_master_tablets",
            "Tablets of all tables in the catalog",
            &tablets,
        )?;
        let raft = RaftGauges::new();
        raft.add(master.catalog());
        raft.encode(&mut encoder)
    }
}

/// Registers what `master` and its `registry` of tablet servers know in `registry`.
pub fn register_master(
    metrics: &mut Registry,
    master: &Arc<Master>,
    registry: &Arc<TServerRegistry>,
) {
    metrics.register_collector(Box::new(MasterCollector {
        master: Arc::downgrade(master),
        registry: Arc::downgrade(registry),
    }));
}
