//! The engine's metrics, in the Prometheus data model (`prometheus-client`), for a process's
//! `/metrics` page.
//!
//! Two kinds, by how they are kept:
//! - **Events** (rows written and scanned, flushes, compactions, RPCs) are counters and
//!   histograms of this process ([`engine`]), bumped where the event happens: one atomic
//!   add per batch or operation, never per row, never a lock on the write or scan path.
//! - **State** (each tablet's memory, rowsets, Raft term and commit index; the servers a master
//!   knows) is read from the live objects when the page is scraped, by collectors that hold
//!   them weakly, so a scrape costs nothing between scrapes and sees no stale tablets. They
//!   live with what they read, as Kudu keeps metrics per subsystem:
//!   [`crate::tserver::metrics`] and [`crate::master::metrics`]. This module knows neither:
//!   it is the counters, the RPC layer and the gauges the collectors fill.
//!
//! Names follow Prometheus's conventions: `nyala_` and the subsystem first, the unit last
//! (`_bytes`, `_seconds`), counters end in `_total` (the encoder adds it).
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use std::sync::Arc;
//! # use nyala_engine::clock::HybridClock;
//! # use nyala_engine::storage::TabletOptions;
//! # use nyala_engine::tserver::{TabletServer, DEFAULT_MEMORY_LIMIT};
//! # let dir = tempfile::tempdir()?;
//! # let clock = Arc::new(HybridClock::new());
//! let server = TabletServer::open(dir.path(), TabletOptions::default(), DEFAULT_MEMORY_LIMIT, clock, None)?;
//! let mut registry = prometheus_client::registry::Registry::default();
//! nyala_engine::metrics::register(&mut registry);
//! nyala_engine::tserver::metrics::register_tablet_server(&mut registry, &server);
//!
//! let mut page = String::new();
//! prometheus_client::encoding::text::encode(&mut page, &registry)?;
//! assert!(page.contains("nyala_server_replicas 0"));
//! # server.shutdown()?;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::TypedMetric;
use prometheus_client::registry::Registry;

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

/// Gauges of one family with labels, filled at scrape time (by the collectors of
/// `tserver::metrics` and `master::metrics`).
pub(crate) struct Gauges {
    name: &'static str,
    help: &'static str,
    family: Family<Vec<(&'static str, String)>, Gauge>,
}

impl Gauges {
    pub(crate) fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            family: Family::default(),
        }
    }

    pub(crate) fn set(&self, labels: &[(&'static str, &str)], value: i64) {
        let labels = labels.iter().map(|(k, v)| (*k, v.to_string())).collect();
        self.family.get_or_create(&labels).set(value);
    }

    pub(crate) fn encode(&self, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
        encode(encoder, self.name, self.help, &self.family)
    }
}

/// Encodes one family of metrics a collector made.
pub(crate) fn encode(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: &(impl EncodeMetric + TypedMetric),
) -> std::fmt::Result {
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}
