//! Client sessions: each client has its own SQL settings, transaction, prepared statements and
//! queries waiting to be fetched, and nothing of it is visible to other clients. Both front
//! ends keep their clients' sessions here.
//!
//! A request names its session by the session's id (Flight SQL's session cookie), by a bearer
//! token issued in it, or by the connection it arrives on ([`Sessions::resolve`]); a PostgreSQL
//! connection has exactly one session, opened when it starts ([`Sessions::open`]). Handles
//! (sessions, prepared statements, queries, tokens) are random, so nobody reaches another
//! client's state by guessing. A session ends when it is closed, when the connection that
//! created it closes (unless the client used its id or token on another connection too), or, if
//! no connection owns it, after `idle_timeout` without a request; it releases what it holds
//! and its token stops working.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use nyala_sql::{Database, PlannedStatement, PreparedStatement};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::error::{Result, ServerError};
use crate::limits::{self, MAX_PENDING_PLANS, MAX_PENDING_QUERIES, MAX_PREPARED_STATEMENTS};

/// Statements sent as text (not prepared) that a session keeps planned, by their text, so a
/// statement sent again is only re-bound; the oldest go first. Longer statements are not kept.
const MAX_CACHED_STATEMENTS: usize = 64;
const MAX_CACHED_STATEMENT_BYTES: usize = 16 << 10;

/// A random handle: 128 bits as 32 hex digits, from the thread's cryptographically secure
/// generator (seeded from the OS, so no system call per handle).
fn random_handle() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// All sessions of a server.
pub struct Sessions {
    db: Arc<Database>,
    idle_timeout: Duration,
    started: Instant,
    registry: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    sessions: HashMap<String, Arc<ClientSession>>,
    /// Bearer token → the session it was issued in.
    tokens: HashMap<String, String>,
    /// Connection → the session of its requests that carry neither cookie nor token.
    connections: HashMap<u64, String>,
}

/// [`ClientSession::connection`] of a session no connection owns.
const NO_CONNECTION: u64 = 0;

/// One client's session.
pub struct ClientSession {
    id: String,
    sql: nyala_sql::Session,
    /// The connection whose closing ends the session, or [`NO_CONNECTION`] once the session
    /// was used from another connection too (by its cookie or token).
    connection: AtomicU64,
    /// Milliseconds since the registry started, at the last request.
    last_used: AtomicU64,
    /// Shared by the session and its handles for transactions begun by an action.
    state: Arc<Mutex<SessionState>>,
    /// The transaction begun by an action this handle runs requests in (None: the session).
    transaction: Option<u64>,
}

#[derive(Default)]
struct SessionState {
    prepared: HashMap<String, Prepared>,
    /// Statements sent as text, planned (see [`MAX_CACHED_STATEMENTS`]).
    statements: HashMap<String, PreparedStatement>,
    statement_order: VecDeque<String>,
    pending: HashMap<u64, Arc<PendingQuery>>,
    pending_order: VecDeque<u64>,
    /// The plans of the pending queries together.
    pending_plans: usize,
    /// Queries being fetched, for cancellation.
    running: HashMap<u64, Weak<PendingQuery>>,
    /// Transactions begun by an action (Flight SQL's BeginTransaction), by id, each on a SQL
    /// session of its own: only requests naming one run in it.
    transactions: HashMap<u64, nyala_sql::Session>,
}

/// A prepared statement and the parameters last bound to it.
#[derive(Clone)]
pub struct Prepared {
    pub statement: PreparedStatement,
    pub params: Option<RecordBatch>,
    /// The transaction begun by an action that the statement was prepared in, and runs in.
    pub transaction: Option<u64>,
}

/// A query planned at GetFlightInfo, waiting for its endpoints to be fetched: one plan per
/// parameter row.
pub struct PendingQuery {
    pub plans: Vec<PlannedStatement>,
    endpoints: usize,
    fetched: AtomicU64,
    cancelled: watch::Sender<bool>,
}

impl PendingQuery {
    /// A receiver that turns true when the query is cancelled.
    pub fn cancelled(&self) -> watch::Receiver<bool> {
        self.cancelled.subscribe()
    }
}

impl Sessions {
    pub fn new(db: Arc<Database>, idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            db,
            idle_timeout,
            started: Instant::now(),
            registry: Mutex::default(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn create(&self, registry: &mut Registry) -> Arc<ClientSession> {
        let session = Arc::new(ClientSession {
            id: random_handle(),
            sql: self.db.session(),
            connection: AtomicU64::new(NO_CONNECTION),
            last_used: AtomicU64::new(self.now_ms()),
            state: Arc::default(),
            transaction: None,
        });
        registry
            .sessions
            .insert(session.id.clone(), session.clone());
        session
    }

    /// The session a request belongs to, and whether it was created for this request: the one
    /// with id `id`, else the one bearer token `token` was issued in, else the one of
    /// `connection` (a number its front end gives each connection), else a new one that ends
    /// with that connection.
    pub fn resolve(
        &self,
        id: Option<&str>,
        token: Option<&str>,
        connection: Option<u64>,
    ) -> Result<(Arc<ClientSession>, bool)> {
        let mut registry = self.registry.lock();
        let by_token = match token {
            Some(token) => Some(registry.tokens.get(token).cloned().ok_or_else(|| {
                ServerError::Unauthenticated("invalid or expired token: authenticate again".into())
            })?),
            None => None,
        };
        let adopted = id.or(by_token.as_deref());
        let found = match adopted.and_then(|id| registry.sessions.get(id)).cloned() {
            Some(session) => {
                // Used from another connection: the session outlives the one that created it.
                let owner = session.connection.load(Ordering::Relaxed);
                if connection.is_none_or(|c| c != owner) {
                    session.connection.store(NO_CONNECTION, Ordering::Relaxed);
                }
                Some(session)
            }
            None => connection
                .and_then(|c| registry.connections.get(&c))
                .and_then(|id| registry.sessions.get(id))
                .cloned(),
        };
        let (session, created) = match found {
            Some(session) => (session, false),
            None => {
                let session = self.create(&mut registry);
                if let Some(connection) = connection {
                    registry.connections.insert(connection, session.id.clone());
                    session.connection.store(connection, Ordering::Relaxed);
                }
                (session, true)
            }
        };
        session.last_used.store(self.now_ms(), Ordering::Relaxed);
        Ok((session, created))
    }

    /// A number for a new client connection, unique among this server's connections (of
    /// either protocol).
    pub fn next_connection(&self) -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(NO_CONNECTION + 1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    }

    /// A new session for `connection` (from [`Self::next_connection`]), which ends when
    /// [`Self::connection_closed`] says the connection closed.
    pub fn open(&self, connection: u64) -> Arc<ClientSession> {
        let mut registry = self.registry.lock();
        let session = self.create(&mut registry);
        registry.connections.insert(connection, session.id.clone());
        session.connection.store(connection, Ordering::Relaxed);
        session
    }

    /// A new bearer token for `session` (after a successful password handshake).
    pub fn issue_token(&self, session: &ClientSession) -> String {
        let token = random_handle();
        let mut registry = self.registry.lock();
        registry.tokens.insert(token.clone(), session.id.clone());
        // Clients may authenticate on one connection and use the token on others.
        session.connection.store(NO_CONNECTION, Ordering::Relaxed);
        token
    }

    /// The session with id `id`, if it is open.
    pub fn get(&self, id: &str) -> Option<Arc<ClientSession>> {
        self.registry.lock().sessions.get(id).cloned()
    }

    /// Ends session `id`: its prepared statements, queries and tokens are gone.
    pub fn close(&self, id: &str) -> bool {
        let mut registry = self.registry.lock();
        if registry.sessions.remove(id).is_none() {
            return false;
        }
        registry.tokens.retain(|_, s| s != id);
        registry.connections.retain(|_, s| s != id);
        true
    }

    /// A connection closed: the session it created ends, unless it was used elsewhere too.
    pub fn connection_closed(&self, connection: u64) {
        let mut registry = self.registry.lock();
        let Some(id) = registry.connections.remove(&connection) else {
            return;
        };
        let owned = registry
            .sessions
            .get(&id)
            .is_some_and(|s| s.connection.load(Ordering::Relaxed) == connection);
        if owned {
            registry.sessions.remove(&id);
            registry.tokens.retain(|_, s| *s != id);
        }
    }

    /// Ends the sessions idle for longer than the idle timeout, but for those of open
    /// connections (they end with their connection); how many.
    pub fn expire_idle(&self) -> usize {
        let now = self.now_ms();
        let timeout = self.idle_timeout.as_millis() as u64;
        let mut registry = self.registry.lock();
        let before = registry.sessions.len();
        registry.sessions.retain(|_, s| {
            s.connection.load(Ordering::Relaxed) != NO_CONNECTION
                || now.saturating_sub(s.last_used.load(Ordering::Relaxed)) <= timeout
        });
        let Registry {
            sessions,
            tokens,
            connections,
        } = &mut *registry;
        tokens.retain(|_, id| sessions.contains_key(id));
        connections.retain(|_, id| sessions.contains_key(id));
        before - sessions.len()
    }

    /// Expires idle sessions every so often, as long as the registry exists.
    pub fn spawn_expiry(self: &Arc<Self>) {
        let period = (self.idle_timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
        let sessions = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(sessions) = sessions.upgrade() else {
                    return;
                };
                let expired = sessions.expire_idle();
                if expired > 0 {
                    tracing::debug!(expired, "idle sessions ended");
                }
            }
        });
    }

    /// Sessions open now.
    pub fn count(&self) -> usize {
        self.registry.lock().sessions.len()
    }

    /// Cancels query `query` of session `session`; false if there is no such query.
    pub fn cancel(&self, session: &str, query: u64) -> bool {
        let Some(session) = self.get(session) else {
            return false;
        };
        let state = session.state.lock();
        let pending = state
            .pending
            .get(&query)
            .cloned()
            .or_else(|| state.running.get(&query).and_then(Weak::upgrade));
        match pending {
            Some(pending) => {
                pending.cancelled.send_replace(true);
                true
            }
            None => false,
        }
    }
}

impl ClientSession {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The user the session runs as, as statements are shown to operators.
    pub fn user_name(&self) -> String {
        self.sql
            .user()
            .unwrap_or_else(|| crate::ANONYMOUS.to_string())
    }

    /// The session's SQL session (settings, DataFusion state).
    pub fn sql(&self) -> &nyala_sql::Session {
        &self.sql
    }

    /// The transaction begun by an action this handle runs requests in (None: the session).
    pub fn transaction(&self) -> Option<u64> {
        self.transaction
    }

    /// Begins a transaction that only requests naming its id run in (Flight SQL's
    /// BeginTransaction, whose spec has requests that name none commit on their own), on a
    /// SQL session of its own with this session's user and settings.
    pub fn begin_named(&self) -> Result<u64> {
        let sql = self.sql.sibling();
        let id = sql.begin(false)?;
        self.state.lock().transactions.insert(id, sql);
        Ok(id)
    }

    /// The session as a request that names `transaction` (None: none) runs in it: the
    /// session itself, or a handle on the transaction begun by an action, which shares the
    /// session's prepared statements and queries.
    pub fn in_transaction(self: &Arc<Self>, transaction: Option<u64>) -> Result<Arc<Self>> {
        let Some(id) = transaction.filter(|&id| Some(id) != self.transaction) else {
            return Ok(self.clone());
        };
        let sql = (self.state.lock().transactions.get(&id).cloned())
            .ok_or_else(Self::unknown_transaction)?;
        Ok(Arc::new(ClientSession {
            id: self.id.clone(),
            sql,
            connection: AtomicU64::new(self.connection.load(Ordering::Relaxed)),
            last_used: AtomicU64::new(self.last_used.load(Ordering::Relaxed)),
            state: self.state.clone(),
            transaction: Some(id),
        }))
    }

    /// The id of the session's transaction begun by an action, if it has exactly one.
    pub fn sole_named_transaction(&self) -> Option<u64> {
        let state = self.state.lock();
        let mut ids = state.transactions.keys();
        match (ids.next(), ids.next()) {
            (Some(&id), None) => Some(id),
            _ => None,
        }
    }

    /// The session as prepared statement `prepared` runs in it: the transaction it was
    /// prepared in while that is open; once that ended, the session's one transaction begun by
    /// an action, if it has one (ADBC keeps a statement it prepared across `commit()`, and
    /// runs it in the next transaction), else the session.
    pub fn for_prepared(self: &Arc<Self>, prepared: &Prepared) -> Result<Arc<Self>> {
        let open = |id: &u64| self.state.lock().transactions.contains_key(id);
        match prepared.transaction.filter(open) {
            Some(id) => self.in_transaction(Some(id)),
            None if prepared.transaction.is_some() => {
                self.in_transaction(self.sole_named_transaction())
            }
            None => Ok(self.clone()),
        }
    }

    /// Ends the transaction `id` begun by an action: its SQL session, to commit or roll back.
    pub fn end_named(&self, id: u64) -> Result<nyala_sql::Session> {
        let ended = self.state.lock().transactions.remove(&id);
        ended.ok_or_else(Self::unknown_transaction)
    }

    fn unknown_transaction() -> ServerError {
        ServerError::NotFound(
            "the request names a transaction that is not open in this session (it ended, or \
             was begun by another session)"
                .into(),
        )
    }

    /// Statement `sql`, planned for execution: kept from an earlier time it was sent, or
    /// planned now. Plans of tables changed by DDL since are planned again when they run.
    pub async fn statement(&self, sql: &str) -> Result<PreparedStatement> {
        if let Some(statement) = self.state.lock().statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.prepare(sql).await?;
        if sql.len() <= MAX_CACHED_STATEMENT_BYTES {
            let mut state = self.state.lock();
            while state.statements.len() >= MAX_CACHED_STATEMENTS {
                let Some(oldest) = state.statement_order.pop_front() else {
                    break;
                };
                state.statements.remove(&oldest);
            }
            if state
                .statements
                .insert(sql.to_string(), statement.clone())
                .is_none()
            {
                state.statement_order.push_back(sql.to_string());
            }
        }
        Ok(statement)
    }

    /// Statement `sql` parsed and planned for repeated execution, within the limits on a
    /// statement's text and parameters.
    pub async fn prepare(&self, sql: &str) -> Result<PreparedStatement> {
        let statement = self
            .sql
            .prepare_statement(limits::statement_text(sql)?)
            .await?;
        limits::parameter_count(statement.info().parameters.fields().len())?;
        Ok(statement)
    }

    /// Forgets the kept statements (after a SET: they were optimized with other settings).
    pub fn forget_statements(&self) {
        let mut state = self.state.lock();
        state.statements.clear();
        state.statement_order.clear();
    }

    /// Keeps `statement` under a new handle.
    pub fn add_prepared(&self, statement: PreparedStatement) -> Result<String> {
        let mut state = self.state.lock();
        if state.prepared.len() >= MAX_PREPARED_STATEMENTS {
            return Err(ServerError::TooMany(format!(
                "this session holds {MAX_PREPARED_STATEMENTS} prepared statements, the most it \
                 may; close some"
            )));
        }
        let handle = random_handle();
        state.prepared.insert(
            handle.clone(),
            Prepared {
                statement,
                params: None,
                transaction: self.transaction,
            },
        );
        Ok(handle)
    }

    fn unknown_prepared() -> ServerError {
        ServerError::NotFound(
            "unknown prepared statement (closed, prepared in another session, or the session \
             ended)"
                .into(),
        )
    }

    /// The prepared statement `handle` with its bound parameters.
    pub fn prepared(&self, handle: &[u8]) -> Result<Prepared> {
        let handle = std::str::from_utf8(handle).map_err(|_| Self::unknown_prepared())?;
        self.state
            .lock()
            .prepared
            .get(handle)
            .cloned()
            .ok_or_else(Self::unknown_prepared)
    }

    /// Binds `params` to the prepared statement `handle`.
    pub fn bind(&self, handle: &[u8], params: Option<RecordBatch>) -> Result<()> {
        let handle = std::str::from_utf8(handle).map_err(|_| Self::unknown_prepared())?;
        let mut state = self.state.lock();
        let prepared = state
            .prepared
            .get_mut(handle)
            .ok_or_else(Self::unknown_prepared)?;
        prepared.params = params;
        Ok(())
    }

    /// Closes the prepared statement `handle` (closing an unknown one is not an error).
    pub fn close_prepared(&self, handle: &[u8]) {
        if let Ok(handle) = std::str::from_utf8(handle) {
            self.state.lock().prepared.remove(handle);
        }
    }

    /// Keeps the plans of a query until its `endpoints` endpoints are fetched, making room by
    /// forgetting the oldest (a query with more plans than a session keeps is not kept); its
    /// random id.
    pub fn add_query(&self, plans: Vec<PlannedStatement>, endpoints: usize) -> u64 {
        let mut state = self.state.lock();
        let id = loop {
            let id = rand_id();
            if !state.pending.contains_key(&id) && !state.running.contains_key(&id) {
                break id;
            }
        };
        if plans.len() > MAX_PENDING_PLANS {
            return id;
        }
        while state.pending.len() >= MAX_PENDING_QUERIES
            || state.pending_plans + plans.len() > MAX_PENDING_PLANS
        {
            match state.pending_order.pop_front() {
                Some(oldest) => state.forget_query(oldest),
                None => break,
            }
        }
        state.pending_plans += plans.len();
        let query = PendingQuery {
            plans,
            endpoints,
            fetched: AtomicU64::new(0),
            cancelled: watch::channel(false).0,
        };
        state.pending.insert(id, Arc::new(query));
        state.pending_order.push_back(id);
        id
    }

    /// The plans of query `id` for one of its endpoints (None if the session no longer has
    /// them); the query stays cancellable while the returned value lives.
    pub fn fetch_query(&self, id: u64) -> Result<Option<Arc<PendingQuery>>> {
        let mut state = self.state.lock();
        let Some(query) = state.pending.get(&id).cloned() else {
            return Ok(None);
        };
        if *query.cancelled.borrow() {
            return Err(ServerError::cancelled());
        }
        let fetched = query.fetched.fetch_add(1, Ordering::Relaxed) + 1;
        if fetched as usize >= query.endpoints {
            state.forget_query(id);
            state.pending_order.retain(|q| *q != id);
        }
        state.running.retain(|_, q| q.strong_count() > 0);
        state.running.insert(id, Arc::downgrade(&query));
        Ok(Some(query))
    }
}

impl SessionState {
    /// Forgets the pending query `id` (not its place in `pending_order`).
    fn forget_query(&mut self, id: u64) {
        if let Some(query) = self.pending.remove(&id) {
            self.pending_plans -= query.plans.len();
        }
    }
}

fn rand_id() -> u64 {
    rand::random()
}
