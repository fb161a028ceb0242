//! What clients do on this server, for operators: the statements running now and the last
//! [`RECENT_STATEMENTS`] finished (an excerpt of the text, the user, duration, rows, outcome),
//! each running one cancellable from the web UI; and the statement metrics (count and
//! latency by kind, rows, errors by class, running statements, open sessions).
//!
//! A statement is registered when it starts to run ([`Activity::start`]) and the returned
//! [`TrackedStatement`] goes with its work: a query's result stream carries it, counting rows
//! as batches pass (one atomic add per batch), and it is recorded as finished when dropped —
//! when the stream ends, fails, or the client goes away.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use nyala_server::{activity::Activity, run::BatchStream};
//! # fn sketch(activity: &Arc<Activity>, sql: &str, user: &str, stream: BatchStream) -> BatchStream {
//! let statement = activity.start(sql, user, "query"); // running from now on
//! let rows = statement.follow(stream); // counts rows, stops when cancelled, finishes at the end
//! # rows }
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use nyala_sql::{Interrupt, Stop};
use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::error::{Result, ServerError};
use crate::session::Sessions;

/// Finished statements kept for the web UI.
pub const RECENT_STATEMENTS: usize = 100;
/// Characters of a statement's text kept (its start and end).
pub const TEXT_EXCERPT_CHARS: usize = 300;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: &'static str,
    class: &'static str,
}

/// A statement running now.
#[derive(Debug)]
pub struct RunningStatement {
    pub id: u64,
    /// The session that runs it, where known.
    session: Option<String>,
    /// An excerpt of the text (see [`TEXT_EXCERPT_CHARS`]).
    pub text: String,
    pub user: String,
    /// `query`, `update` (DML and DDL) or `ingest`.
    pub kind: &'static str,
    pub started_at: SystemTime,
    started: Instant,
    rows: AtomicU64,
    cancel: watch::Sender<bool>,
    /// A distributed query's stages, once planned.
    stages: OnceLock<String>,
}

impl RunningStatement {
    /// A distributed query's stages, as EXPLAIN shows them.
    pub fn stages(&self) -> Option<&str> {
        self.stages.get().map(String::as_str)
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Rows returned (queries) so far.
    pub fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    pub fn cancelled(&self) -> bool {
        *self.cancel.borrow()
    }
}

/// A statement that finished.
#[derive(Clone, Debug)]
pub struct FinishedStatement {
    pub id: u64,
    pub text: String,
    pub user: String,
    pub kind: &'static str,
    pub started_at: SystemTime,
    pub duration: Duration,
    /// Rows returned (queries) or changed (updates, ingest).
    pub rows: u64,
    /// The error it ended with, if any.
    pub error: Option<String>,
}

/// The statements of one server (see the module comment).
pub struct Activity {
    next_id: AtomicU64,
    running: Mutex<BTreeMap<u64, Arc<RunningStatement>>>,
    recent: Mutex<VecDeque<FinishedStatement>>,
    sessions: OnceLock<Weak<Sessions>>,
    duration: Family<KindLabels, Histogram, fn() -> Histogram>,
    rows: Family<KindLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    cancelled: Counter,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            next_id: AtomicU64::new(1),
            running: Mutex::default(),
            recent: Mutex::default(),
            sessions: OnceLock::new(),
            duration: Family::new_with_constructor(nyala_engine::metrics::latency_histogram),
            rows: Family::default(),
            errors: Family::default(),
            cancelled: Counter::default(),
        }
    }
}

impl std::fmt::Debug for Activity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Activity").finish_non_exhaustive()
    }
}

impl Activity {
    /// Registers the statement metrics in `registry`.
    pub fn register(self: &Arc<Self>, registry: &mut Registry) {
        registry.register(
            "nyala_statement_duration_seconds",
            "Statements run, by kind (query, update, ingest), and how long they ran",
            self.duration.clone(),
        );
        registry.register(
            "nyala_statement_rows",
            "Rows statements returned (queries) or changed (updates, ingest), by kind",
            self.rows.clone(),
        );
        registry.register(
            "nyala_statement_errors",
            "Statements that failed, by kind and class of error",
            self.errors.clone(),
        );
        registry.register(
            "nyala_statements_cancelled",
            "Statements cancelled (from the web UI, or by a client)",
            self.cancelled.clone(),
        );
        registry.register_collector(Box::new(ActivityCollector(Arc::downgrade(self))));
    }

    /// Counts the sessions of `sessions` in the metrics (once; the server's sessions).
    pub fn watch_sessions(&self, sessions: &Arc<Sessions>) {
        let _ = self.sessions.set(Arc::downgrade(sessions));
    }

    /// Registers a statement that starts to run; it is running until the returned value is
    /// dropped.
    pub fn start(self: &Arc<Self>, text: &str, user: &str, kind: &'static str) -> TrackedStatement {
        self.start_in(None, text, user, kind)
    }

    /// [`Self::start`] for a statement of session `session`, which
    /// [`Self::cancel_session`] cancels.
    pub fn start_in(
        self: &Arc<Self>,
        session: Option<&str>,
        text: &str,
        user: &str,
        kind: &'static str,
    ) -> TrackedStatement {
        let statement = Arc::new(RunningStatement {
            session: session.map(str::to_string),
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            text: crate::excerpt(&nyala_sql::redact_passwords(text), TEXT_EXCERPT_CHARS),
            user: user.to_string(),
            kind,
            started_at: SystemTime::now(),
            started: Instant::now(),
            rows: AtomicU64::new(0),
            cancel: watch::channel(false).0,
            stages: OnceLock::new(),
        });
        self.running.lock().insert(statement.id, statement.clone());
        TrackedStatement {
            activity: self.clone(),
            statement,
            error: Mutex::new(None),
        }
    }

    /// The statements running now, oldest first.
    pub fn running(&self) -> Vec<Arc<RunningStatement>> {
        self.running.lock().values().cloned().collect()
    }

    /// The last statements finished, newest first.
    pub fn recent(&self) -> Vec<FinishedStatement> {
        self.recent.lock().iter().rev().cloned().collect()
    }

    /// Cancels running statement `id`; false if no such statement runs.
    pub fn cancel(&self, id: u64) -> bool {
        let Some(statement) = self.running.lock().get(&id).cloned() else {
            return false;
        };
        self.cancel_statement(&statement);
        true
    }

    /// Cancels the statements session `session` runs now (a PostgreSQL CancelRequest); how
    /// many.
    pub fn cancel_session(&self, session: &str) -> usize {
        let statements: Vec<_> = (self.running.lock().values())
            .filter(|s| s.session.as_deref() == Some(session))
            .cloned()
            .collect();
        statements.iter().for_each(|s| self.cancel_statement(s));
        statements.len()
    }

    fn cancel_statement(&self, statement: &RunningStatement) {
        if !statement.cancel.send_replace(true) {
            self.cancelled.inc();
        }
    }

    fn finish(&self, statement: &RunningStatement, error: Option<(&'static str, String)>) {
        self.running.lock().remove(&statement.id);
        let duration = statement.started.elapsed();
        let labels = KindLabels {
            kind: statement.kind,
        };
        self.duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
        self.rows.get_or_create(&labels).inc_by(statement.rows());
        if let Some((class, _)) = &error {
            self.errors
                .get_or_create(&ErrorLabels {
                    kind: statement.kind,
                    class,
                })
                .inc();
        }
        let mut recent = self.recent.lock();
        if recent.len() == RECENT_STATEMENTS {
            recent.pop_front();
        }
        recent.push_back(FinishedStatement {
            id: statement.id,
            text: statement.text.clone(),
            user: statement.user.clone(),
            kind: statement.kind,
            started_at: statement.started_at,
            duration,
            rows: statement.rows(),
            error: error.map(|(_, message)| message),
        });
    }
}

/// A running statement's registration (see [`Activity::start`]); recorded as finished when
/// dropped.
pub struct TrackedStatement {
    activity: Arc<Activity>,
    statement: Arc<RunningStatement>,
    /// The error it failed with: its class and message.
    error: Mutex<Option<(&'static str, String)>>,
}

impl TrackedStatement {
    /// Adds `n` rows returned or changed.
    pub fn add_rows(&self, n: u64) {
        self.statement.rows.fetch_add(n, Ordering::Relaxed);
    }

    /// Records how `planned`, the statement, runs: a distributed query's stages.
    pub fn planned(&self, planned: &nyala_sql::PlannedStatement) {
        if let Some(stages) = planned.stages() {
            let _ = self.statement.stages.set(stages);
        }
    }

    /// Records that the statement failed with `error`.
    pub fn failed(&self, error: &ServerError) {
        self.failed_with(error.class(), &error.to_string());
    }

    /// Records that the statement failed with an error of `class` saying `message` (a front
    /// end's own error, not the session layer's).
    pub fn failed_with(&self, class: &'static str, message: &str) {
        let message = crate::excerpt(message, TEXT_EXCERPT_CHARS);
        *self.error.lock() = Some((class, message));
    }

    /// Resolves when the statement is cancelled (never, if it is not).
    pub async fn cancelled(&self) {
        let mut cancelled = self.statement.cancel.subscribe();
        if cancelled.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// A receiver that turns true when the statement is cancelled.
    pub fn cancellation(&self) -> watch::Receiver<bool> {
        self.statement.cancel.subscribe()
    }

    /// Runs `work` unless the statement is cancelled first; records its outcome and, for
    /// `Ok`, the rows `rows` counts.
    pub async fn run<T>(
        &self,
        work: impl std::future::Future<Output = Result<T>>,
        rows: impl FnOnce(&T) -> u64,
    ) -> Result<T> {
        let done = tokio::select! {
            done = work => done,
            () = self.cancelled() => Err(ServerError::cancelled()),
        };
        self.record(done, rows)
    }

    /// Runs `work`, which changes rows, to its end: cancelling the statement asks `interrupt`
    /// to stop it, which it does only where that changes nothing (see [`Interrupt`]). Records
    /// its outcome as [`Self::run`] does.
    pub async fn run_to_end<T>(
        &self,
        work: impl std::future::Future<Output = Result<T>>,
        interrupt: &Interrupt,
        rows: impl FnOnce(&T) -> u64,
    ) -> Result<T> {
        tokio::pin!(work);
        let done = tokio::select! {
            done = &mut work => done,
            () = self.cancelled() => {
                interrupt.stop(Stop::Cancelled("the statement was cancelled".into()));
                work.await
            }
        };
        self.record(done, rows)
    }

    fn record<T>(&self, done: Result<T>, rows: impl FnOnce(&T) -> u64) -> Result<T> {
        match &done {
            Ok(value) => self.add_rows(rows(value)),
            Err(error) => self.failed(error),
        }
        done
    }
}

impl Drop for TrackedStatement {
    fn drop(&mut self) {
        let error = self.error.lock().take();
        self.activity.finish(&self.statement, error);
    }
}

/// Running statements and open sessions, read at every scrape.
#[derive(Debug)]
struct ActivityCollector(Weak<Activity>);

impl ActivityCollector {
    fn gauge(
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        value: usize,
    ) -> std::fmt::Result {
        let gauge = Gauge::<i64>::default();
        gauge.set(value as i64);
        gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
    }
}

impl Collector for ActivityCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let Some(activity) = self.0.upgrade() else {
            return Ok(());
        };
        Self::gauge(
            &mut encoder,
            "nyala_statements_running",
            "Statements running now",
            activity.running.lock().len(),
        )?;
        if let Some(sessions) = activity.sessions.get().and_then(Weak::upgrade) {
            Self::gauge(
                &mut encoder,
                "nyala_sessions",
                "Client sessions open",
                sessions.count(),
            )?;
        }
        Ok(())
    }
}
