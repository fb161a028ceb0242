//! The engine's metrics, in the Prometheus data model (`prometheus-client`), for a process's
//! `/metrics` page.
//!
//! Two kinds, by how they are kept:
//! - **Events** (rows written and scanned, flushes, compactions, RPCs) are counters and
//!   histograms of this process ([`engine`]), bumped where the event happens: one atomic
//!   add per batch or operation, never per row, never a lock on the write or scan path.
//! - **State** (each tablet's memory, rowsets, Raft term and commit index; the servers a master
//!   knows) is read from the live objects when the page is scraped, by collectors
//!   ([`register_tablet_server`], [`register_master`]) that hold them weakly, so a scrape
//!   costs nothing between scrapes and sees no stale tablets.
//!
//! Names follow Prometheus's conventions: `nyala_` and the subsystem first, the unit last
//! (`_bytes`, `_seconds`), counters end in `_total` (the encoder adds it).
//!
//! ```ignore
//! let mut registry = prometheus_client::registry::Registry::default();
//! nyala_engine::metrics::register(&mut registry);
//! nyala_engine::metrics::register_tablet_server(&mut registry, &server);
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::TypedMetric;
use prometheus_client::registry::Registry;

use crate::master::{Master, TServerRegistry};
use crate::tserver::replica::TabletReplica;
use crate::tserver::TabletServer;

/// Latency buckets from 100 µs to about 26 s, four times apart.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0001, 4.0, 10)
}

/// A histogram of durations in seconds (see [`latency_buckets`]).
pub fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// The labels of an RPC's metrics: the gRPC service and method it called.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    pub service: String,
    pub method: String,
}

/// The labels of a failed RPC: which, and its gRPC status code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcErrorLabels {
    pub service: String,
    pub method: String,
    pub code: String,
}

/// The labels of a maintenance operation: what kind it is (`flush`, or a compaction's kind).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub kind: &'static str,
}

type LatencyFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The event metrics of this process's engine (see the module comment).
pub struct EngineMetrics {
    /// Rows tablet replicas applied from writes (on every replica, leaders and followers).
    pub rows_written: Counter,
    /// Arrow memory of the write batches applied.
    pub bytes_written: Counter,
    /// Rows tablet scans returned.
    pub rows_scanned: Counter,
    /// Arrow memory of the batches tablet scans returned.
    pub bytes_scanned: Counter,
    /// Writes refused because the server's unflushed data stayed over its limit.
    pub writes_rejected: Counter,
    /// Flushes and compactions by kind, with their durations.
    pub maintenance_duration: LatencyFamily<OpLabels>,
    /// Flushes and compactions that failed, by kind.
    pub maintenance_failures: Family<OpLabels, Counter>,
    /// Internal and Flight RPCs served, by service and method, with their durations.
    pub rpc_duration: LatencyFamily<RpcLabels>,
    /// RPCs answered with an error status.
    pub rpc_errors: Family<RpcErrorLabels, Counter>,
    /// Tablet replicas a master re-created or moved (re-replication and rebalancing).
    pub replica_moves: Counter,
    /// Leadership transfers asked for (leader step-downs).
    pub leader_transfers: Counter,
}

static ENGINE: LazyLock<EngineMetrics> = LazyLock::new(|| EngineMetrics {
    rows_written: Counter::default(),
    bytes_written: Counter::default(),
    rows_scanned: Counter::default(),
    bytes_scanned: Counter::default(),
    writes_rejected: Counter::default(),
    maintenance_duration: Family::new_with_constructor(latency_histogram),
    maintenance_failures: Family::default(),
    rpc_duration: Family::new_with_constructor(latency_histogram),
    rpc_errors: Family::default(),
    replica_moves: Counter::default(),
    leader_transfers: Counter::default(),
});

/// This process's engine metrics.
pub fn engine() -> &'static EngineMetrics {
    &ENGINE
}

impl EngineMetrics {
    /// Counts one flush or compaction of `kind` that took `elapsed`, failed or not.
    pub fn maintenance_done(&self, kind: &'static str, elapsed: Duration, ok: bool) {
        let labels = OpLabels { kind };
        self.maintenance_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if !ok {
            self.maintenance_failures.get_or_create(&labels).inc();
        }
    }
}

/// Registers the engine's event metrics (see [`engine`]) in `registry`.
pub fn register(registry: &mut Registry) {
    let m = engine();
    registry.register(
        "nyala_tablet_written_rows",
        "Rows applied to tablet replicas by writes",
        m.rows_written.clone(),
    );
    registry.register(
        "nyala_tablet_written_bytes",
        "Arrow memory of the write batches applied to tablet replicas",
        m.bytes_written.clone(),
    );
    registry.register(
        "nyala_tablet_scanned_rows",
        "Rows returned by tablet scans",
        m.rows_scanned.clone(),
    );
    registry.register(
        "nyala_tablet_scanned_bytes",
        "Arrow memory of the batches returned by tablet scans",
        m.bytes_scanned.clone(),
    );
    registry.register(
        "nyala_tablet_writes_rejected",
        "Writes refused because unflushed data stayed over the server's memory limit",
        m.writes_rejected.clone(),
    );
    registry.register(
        "nyala_maintenance_duration_seconds",
        "Flushes and compactions run, by kind, and how long they took",
        m.maintenance_duration.clone(),
    );
    registry.register(
        "nyala_maintenance_failures",
        "Flushes and compactions that failed, by kind",
        m.maintenance_failures.clone(),
    );
    registry.register(
        "nyala_rpc_duration_seconds",
        "RPCs served, by service and method, and how long they took to answer",
        m.rpc_duration.clone(),
    );
    registry.register(
        "nyala_rpc_errors",
        "RPCs answered with an error, by service, method and gRPC status code",
        m.rpc_errors.clone(),
    );
    registry.register(
        "nyala_master_replica_moves",
        "Tablet replicas the master re-created elsewhere (re-replication, rebalancing)",
        m.replica_moves.clone(),
    );
    registry.register(
        "nyala_raft_leader_transfers",
        "Leadership transfers (leader step-downs) asked of tablet leaders",
        m.leader_transfers.clone(),
    );
}

/// A tablet scan that counts the rows and bytes it returns.
pub(crate) struct CountedScan(pub nyala_storage::ScanIterator);

impl Iterator for CountedScan {
    type Item = <nyala_storage::ScanIterator as Iterator>::Item;

    fn next(&mut self) -> Option<Self::Item> {
        let next = self.0.next();
        if let Some(Ok(batch)) = &next {
            engine().rows_scanned.inc_by(batch.num_rows() as u64);
            engine()
                .bytes_scanned
                .inc_by(batch.get_array_memory_size() as u64);
        }
        next
    }
}

/// A tower layer for tonic servers that times every RPC and counts its errors (see
/// [`EngineMetrics::rpc_duration`]). The time is until the answer's headers: a streamed
/// answer's rows are not in it.
#[derive(Clone, Copy, Debug, Default)]
pub struct RpcMetricsLayer;

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcMetricsService { inner }
    }
}

/// See [`RpcMetricsLayer`].
#[derive(Clone, Debug)]
pub struct RpcMetricsService<S> {
    inner: S,
}

/// gRPC's status code for a method the server does not have.
const UNIMPLEMENTED: &str = "12";

impl<S, B, R> tower::Service<http::Request<B>> for RpcMetricsService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // "/package.Service/Method"
        let (service, method) = request
            .uri()
            .path()
            .trim_start_matches('/')
            .split_once('/')
            .map(|(s, m)| (s.rsplit('.').next().unwrap_or(s).to_string(), m.to_string()))
            .unwrap_or_default();
        let started = Instant::now();
        let answered = self.inner.call(request);
        Box::pin(async move {
            let response = answered.await?;
            let status = response
                .headers()
                .get("grpc-status")
                .and_then(|s| s.to_str().ok());
            // The path is the caller's: methods the server does not have share one label, so
            // callers cannot make new series.
            let labels = match status {
                Some(UNIMPLEMENTED) => RpcLabels {
                    service: "unknown".into(),
                    method: "unknown".into(),
                },
                _ => RpcLabels { service, method },
            };
            let m = engine();
            m.rpc_duration
                .get_or_create(&labels)
                .observe(started.elapsed().as_secs_f64());
            if let Some(code) = status.filter(|s| *s != "0") {
                let code = code
                    .parse::<i32>()
                    .map(|c| format!("{:?}", tonic::Code::from(c)))
                    .unwrap_or_else(|_| "Unknown".into());
                m.rpc_errors
                    .get_or_create(&RpcErrorLabels {
                        service: labels.service,
                        method: labels.method,
                        code,
                    })
                    .inc();
            }
            Ok(response)
        })
    }
}

/// Gauges of one family with labels, filled at scrape time.
struct Gauges {
    name: &'static str,
    help: &'static str,
    family: Family<Vec<(&'static str, String)>, Gauge>,
}

impl Gauges {
    fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            family: Family::default(),
        }
    }

    fn set(&self, labels: &[(&'static str, &str)], value: i64) {
        let labels = labels.iter().map(|(k, v)| (*k, v.to_string())).collect();
        self.family.get_or_create(&labels).set(value);
    }

    fn encode(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        encode(encoder, self.name, self.help, &self.family)
    }
}

/// Encodes one family of metrics a collector made.
fn encode(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: &(impl EncodeMetric + TypedMetric),
) -> std::fmt::Result {
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// Raft state of replicas, one series per tablet: term, leader, indexes, followers' lag.
struct RaftGauges {
    term: Gauges,
    leader: Gauges,
    commit: Gauges,
    applied: Gauges,
    lag: Gauges,
    log: Gauges,
}

impl RaftGauges {
    fn new() -> Self {
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

    fn add(&self, replica: &TabletReplica) {
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

    fn encode(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
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
