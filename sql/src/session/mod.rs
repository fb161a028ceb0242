//! A session: one client's conversation with the database, one statement at a time.
//!
//! It holds what a client's statements share: the user it runs as ([`access`]), the settings
//! `SET` changes ([`settings`], which is why each client gets its own), the transaction `BEGIN`
//! opened ([`transaction`]), and DataFusion's state with Nyala's tables in it ([`open`]). How
//! it turns a statement into a plan is [`crate::plan::planner`].

pub(crate) mod access;
mod open;
pub mod settings;
pub(crate) mod transaction;

use datafusion::execution::TaskContext;
use datafusion::logical_expr::{LogicalPlan, Statement};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use std::collections::HashMap;
use std::sync::Arc;

use crate::database::Database;
use crate::exec::scan;
use crate::parse::parser::NyalaParser;
use crate::session::access::{Authorizer, Login, Principal, Requirements};
use crate::session::settings::NyalaOptions;
use crate::session::transaction::{OpenTxn, TxnControl, TxnSlot};
use crate::{Result, SqlError};

/// A SQL session: DataFusion session state plus access to the database.
#[derive(Clone)]
pub struct Session {
    pub(crate) db: Arc<Database>,
    pub(crate) ctx: SessionContext,
    /// Who the session runs as (see [`crate::session::access`]).
    pub(crate) principal: Arc<Principal>,
    /// The transaction `BEGIN` opened, if any (see [`crate::session::transaction`]).
    pub(crate) txn: Arc<TxnSlot>,
}

impl Session {
    /// The user the session runs as (None: not authenticated).
    pub fn user(&self) -> Option<String> {
        self.principal.name()
    }

    /// The users' tables this session's user may see, sorted by name.
    pub fn visible_tables(&self) -> Vec<nyala_engine::TableHandle> {
        let mut tables = self.db.client.tables();
        tables.retain(|table| self.may_see(&table.name));
        tables
    }

    /// Runs the session as `user` (after the server checked its password).
    pub fn log_in(&self, user: &nyala_engine::UserInfo) {
        self.principal.set(Some(Login {
            name: user.name.clone(),
            password_hash: user.password_hash.clone(),
        }))
    }

    /// A new session of the same database, as the same user and with this one's settings,
    /// but with a transaction slot of its own: what a transaction that only requests naming
    /// it run in (Flight SQL's BeginTransaction) runs on.
    pub fn sibling(&self) -> Session {
        let sibling = self.db.session();
        sibling.principal.set(self.login());
        let options = self.ctx.state().config_options().clone();
        *sibling.ctx.state_ref().write().config_mut().options_mut() = options.as_ref().clone();
        sibling
    }

    /// The user the session runs as, with the password hash it logged in with.
    pub fn login(&self) -> Option<Login> {
        self.principal.login()
    }

    /// After the session's user changed its own password: the session goes on with the new one.
    pub(crate) fn keep_login(&self) {
        let Some(mut login) = self.login() else {
            return;
        };
        if let Some(user) = self.db.client.user(&login.name) {
            login.password_hash = user.password_hash.clone();
            self.principal.set(Some(login));
        }
    }

    /// Whether the session's user may see the table or view `name`.
    pub fn may_see(&self, name: &str) -> bool {
        let user = self.user();
        Authorizer {
            client: &self.db.client,
        }
        .sees(user.as_deref(), name)
    }

    /// An error naming what is missing unless the session's user holds what `needs` asks.
    pub(crate) fn authorize(&self, needs: &Requirements) -> Result<()> {
        let user = self.user();
        Authorizer {
            client: &self.db.client,
        }
        .check(user.as_deref(), needs)
    }

    /// Splits a script into its statements (quote- and comment-aware).
    pub fn split_statements(sql: &str) -> Result<Vec<String>> {
        NyalaParser::split_statements(sql)
    }

    /// The session's settings (`SET` names) and their current values.
    pub fn settings(&self) -> Vec<(String, Option<String>)> {
        use datafusion::common::config::{ConfigExtension, ExtensionOptions};
        let state = self.ctx.state();
        let options = state.config_options();
        // Extensions list their entries without their prefix.
        let nyala = options
            .extensions
            .get::<NyalaOptions>()
            .map(|o| o.entries())
            .unwrap_or_default()
            .into_iter()
            .map(|entry| {
                let prefix = NyalaOptions::PREFIX;
                (format!("{prefix}.{}", entry.key), entry.value)
            });
        options
            .entries()
            .into_iter()
            .filter(|entry| entry.key.starts_with("datafusion."))
            .map(|entry| (entry.key, entry.value))
            .chain(nyala)
            .collect()
    }

    /// `SET name = value`: refused with an error for an unknown name or a bad value.
    pub async fn set(&self, name: &str, value: &str) -> Result<()> {
        let name = settings::canonical_name(name);
        if !self.settings().iter().any(|(known, _)| *known == name) {
            return Err(SqlError::Invalid(format!("unknown setting '{name}'")));
        }
        let statement = Statement::SetVariable(datafusion::logical_expr::SetVariable {
            variable: name,
            value: value.to_string(),
        });
        let statement = settings::checked_set(&statement)?;
        self.ctx
            .execute_logical_plan(LogicalPlan::Statement(statement))
            .await?;
        Ok(())
    }

    /// The transaction in progress in this session, if any.
    pub(crate) fn transaction(&self) -> Option<Arc<OpenTxn>> {
        self.txn.current()
    }

    /// Whether a transaction is in progress in this session.
    pub fn in_transaction(&self) -> bool {
        self.txn.current().is_some()
    }

    /// The id of the transaction in progress in this session, if any.
    pub fn transaction_id(&self) -> Option<u64> {
        self.txn.current().map(|t| t.id())
    }

    /// An error if a statement may not run now: the transaction in progress failed.
    pub(crate) fn check_transaction(&self) -> Result<()> {
        match self.txn.current() {
            Some(txn) => txn.check_usable(),
            None => Ok(()),
        }
    }

    /// Starts a transaction (`BEGIN`); returns its id.
    pub fn begin(&self, read_only: bool) -> Result<u64> {
        self.txn.begin(&self.db.client, read_only)
    }

    /// Commits the transaction in progress (`COMMIT`); without one, does nothing.
    pub async fn commit(&self) -> Result<()> {
        match self.txn.take() {
            Some(txn) => txn.commit().await,
            None => Ok(()),
        }
    }

    /// `SAVEPOINT`, `RELEASE SAVEPOINT` or `ROLLBACK TO SAVEPOINT` in the transaction in
    /// progress; an error without one, as in PostgreSQL.
    pub(crate) fn savepoint(&self, control: &TxnControl) -> Result<()> {
        let Some(txn) = self.txn.current() else {
            return Err(SqlError::Invalid(
                "savepoints can only be used in transaction blocks (after BEGIN)".into(),
            ));
        };
        match control {
            TxnControl::Savepoint(name) => txn.savepoint(name),
            TxnControl::Release(name) => txn.release(name),
            TxnControl::RollbackTo(name) => txn.rollback_to(name),
            _ => Ok(()),
        }
    }

    /// Rolls the transaction in progress back (`ROLLBACK`); without one, does nothing.
    pub async fn rollback(&self) {
        if let Some(txn) = self.txn.take() {
            txn.rollback().await;
        }
    }

    /// `plan` with every scan reading at the statement's snapshot: the transaction's, in one.
    pub(crate) async fn pin(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(txn) = self.txn.current() else {
            return Ok(scan::pin_snapshot(plan).await?);
        };
        let snapshot = match txn.snapshot() {
            Some(snapshot) => snapshot,
            None => match scan::statement_snapshot(&plan).await? {
                Some(snapshot) => txn.snapshot_or(snapshot),
                None => return Ok(plan),
            },
        };
        Ok(scan::with_snapshot(plan, snapshot)?)
    }

    /// A context to run a plan of this session in: the session's configuration and runtime.
    /// Without the function registries `SessionContext::task_ctx` copies (a few hundred
    /// functions, each cloned with its name): a physical plan holds its functions resolved.
    /// That copy was 2 % of the server's CPU in bulk ingest, done for every batch.
    pub(crate) fn task_ctx(&self) -> Arc<TaskContext> {
        Arc::new(TaskContext::new(
            None,
            self.ctx.session_id(),
            self.ctx.copied_config(),
            HashMap::new(),
            HashMap::new(),
            HashMap::new(),
            HashMap::new(),
            self.ctx.runtime_env(),
        ))
    }

    /// The DataFusion context, for metadata queries (catalogs, schemas, tables).
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }
}
