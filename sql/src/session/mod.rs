//! A session: one client's conversation with the database, one statement at a time.
//!
//! It is where a parsed statement meets the catalog. Nyala's own statements are planned
//! completely here (DDL is carried as parsed, SHOW is answered); everything else becomes
//! DataFusion's logical plan, kept with its placeholders until values are bound (see
//! [`crate::plan::prepared`]), then planned physically with Nyala's scan and mutation operators. The
//! session also holds the settings `SET` changes, which is why each client gets its own.
//!
//! A logical plan nests at most [`MAX_PLAN_DEPTH`] operators (CTEs that read one another and
//! subqueries stack up): some of DataFusion's optimizer rules recurse without stack protection,
//! so a deeper plan is refused before they run.

pub(crate) mod access;
pub mod settings;
pub(crate) mod transaction;

use datafusion::common::tree_node::{TreeNodeRecursion, TreeNodeVisitor};
use datafusion::common::ScalarValue;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder, Statement};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{Ident, ObjectName, Statement as SqlStatement, TableObject};
use std::collections::HashMap;
use std::sync::Arc;

use crate::catalog::schema as catalog;
use crate::database::Database;
use crate::exec::scan;
use crate::functions::as_of;
use crate::parse::parser::NyalaParser;
use crate::parse::statement::{object_name, Ddl, NyalaStatement};
use crate::plan::dml;
use crate::plan::params::bind;
use crate::plan::planned::{statement_kind, Action, PlannedStatement, StatementKind};
use crate::plan::prepared::Draft;
use crate::session::access::{Authorizer, Login, Principal, Requirements};
use crate::session::settings::NyalaOptions;
use crate::session::transaction::{OpenTxn, TxnSlot};
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
    /// Parses and plans exactly one statement (a trailing `;` is allowed).
    pub async fn plan(&self, sql: &str) -> Result<PlannedStatement> {
        self.plan_with_params(sql, &[]).await
    }

    /// Plans one statement with `params` bound to its placeholders (`$1` or `?`, in order).
    pub async fn plan_with_params(
        &self,
        sql: &str,
        params: &[ScalarValue],
    ) -> Result<PlannedStatement> {
        let (_, draft) = self.authorized_draft(sql).await?;
        self.plan_draft(draft, params).await
    }

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

    /// `sql` parsed, checked against the session's privileges, and drafted; what it needs.
    pub(crate) async fn authorized_draft(&self, sql: &str) -> Result<(Requirements, Draft)> {
        let statement = NyalaParser::parse_sql(sql)?;
        let controls_txn = match &statement {
            NyalaStatement::DataFusion(s) => TxnControl::of(s)?.is_some(),
            _ => false,
        };
        if !controls_txn {
            self.check_transaction()?;
        }
        // Its walks recurse as deep as the statement nests (up to the parser's limit): a long
        // statement may nest deep, so it is walked on a stack of its own.
        let needs = match sql.len() > REQUIREMENTS_ON_OWN_STACK {
            true => stacker::grow(64 << 20, || Requirements::of(&statement))?,
            false => Requirements::of(&statement)?,
        };
        self.authorize(&needs)?;
        Ok((needs, self.draft(statement).await?))
    }

    /// Plans and executes exactly one statement.
    pub async fn execute(&self, sql: &str) -> Result<SendableRecordBatchStream> {
        self.plan(sql).await?.execute().await
    }

    /// Splits a script into its statements (quote- and comment-aware).
    pub fn split_statements(sql: &str) -> Result<Vec<String>> {
        NyalaParser::split_statements(sql)
    }

    /// A parsed statement as a logical plan still to be bound, or planned completely where it
    /// has none (Nyala's DDL and SHOW statements).
    pub(crate) async fn draft(&self, statement: NyalaStatement) -> Result<Draft> {
        let planned = |kind, action| {
            Ok(Draft::Planned(PlannedStatement {
                kind,
                session: self.clone(),
                action,
            }))
        };
        if let NyalaStatement::DataFusion(statement) = &statement {
            if let Some(control) = TxnControl::of(statement)? {
                return planned(StatementKind::Ddl, Action::Transaction(control));
            }
        }
        match statement {
            NyalaStatement::Ddl(Ddl::CreateView {
                name,
                sql,
                or_replace,
            }) => {
                self.check_view(&name, &sql).await?;
                let ddl = Ddl::CreateView {
                    name,
                    sql,
                    or_replace,
                };
                planned(StatementKind::Ddl, Action::Ddl(ddl))
            }
            NyalaStatement::Ddl(ddl) => planned(StatementKind::Ddl, Action::Ddl(ddl)),
            NyalaStatement::CloneTable {
                name,
                source,
                if_not_exists,
                as_of,
            } => {
                let as_of = match as_of {
                    Some(time) => Some(self.time_of(&time).await?),
                    None => None,
                };
                let ddl = Ddl::CloneTable {
                    name,
                    source,
                    if_not_exists,
                    as_of,
                };
                planned(StatementKind::Ddl, Action::Ddl(ddl))
            }
            NyalaStatement::CreateTableAs(ctas) => {
                planned(StatementKind::Dml, self.plan_create_table_as(ctas).await?)
            }
            NyalaStatement::Show(show) => {
                planned(StatementKind::Query, Action::Rows(self.show(&show)?))
            }
            NyalaStatement::UpdateFrom { update, explain } => {
                let mut plan = self.plan_update_from(*update).await?;
                let mut kind = StatementKind::Dml;
                if let Some((verbose, analyze)) = explain {
                    plan = LogicalPlanBuilder::from(plan)
                        .explain(verbose, analyze)?
                        .build()?;
                    kind = StatementKind::Query;
                }
                Ok(Draft::Logical { kind, plan })
            }
            NyalaStatement::DataFusion(statement) => {
                let plan = self.logical_plan(statement).await?;
                let kind = statement_kind(&plan)?;
                Ok(Draft::Logical { kind, plan })
            }
            NyalaStatement::InsertIgnore(statement) => {
                let plan = self.logical_plan(statement).await?;
                let kind = statement_kind(&plan)?;
                let plan = dml::plan_insert_ignore(plan)?;
                Ok(Draft::Logical { kind, plan })
            }
        }
    }

    /// Refuses a view whose query does not plan now, or reads the view itself (directly or
    /// through other views: CREATE OR REPLACE would make it endless).
    async fn check_view(&self, name: &str, sql: &str) -> Result<()> {
        let plan = catalog::view_plan(&self.ctx.state(), sql).await?;
        check_plan_depth(&plan)?;
        match catalog::reads_view(&self.db.client, sql, name)? {
            true => Err(SqlError::Invalid(format!(
                "view '{name}' cannot read itself"
            ))),
            false => Ok(()),
        }
    }

    /// Binds `params` to a logical plan's placeholders and plans it physically.
    pub(crate) async fn plan_logical(
        &self,
        kind: StatementKind,
        plan: LogicalPlan,
        params: &[ScalarValue],
    ) -> Result<PlannedStatement> {
        let action = if let LogicalPlan::Statement(statement) = &plan {
            let plan = LogicalPlan::Statement(settings::checked_set(statement)?);
            Action::Setting(bind(plan, params)?)
        } else {
            let plan = dml::plan_mutations(bind(plan, params)?)?;
            let state = self.ctx.state();
            Action::Plan(match dml::inserts_values(&plan) {
                true => {
                    let analyzed = state.analyzer().execute_and_check(
                        plan,
                        state.config_options(),
                        |_, _| {},
                    )?;
                    match dml::inserts_values(&analyzed) {
                        true => dml::plan_values_insert(&analyzed, &state).await?,
                        false => {
                            (state.query_planner())
                                .create_physical_plan(&analyzed, &state)
                                .await?
                        }
                    }
                }
                false => state.create_physical_plan(&plan).await?,
            })
        };
        Ok(PlannedStatement {
            kind,
            session: self.clone(),
            action,
        })
    }

    /// DataFusion's plan of `statement`, its AS OF clauses turned into what DataFusion plans.
    pub(crate) async fn logical_plan(
        &self,
        mut statement: Box<SqlStatement>,
    ) -> Result<LogicalPlan> {
        as_of::lower(&mut statement)?;
        crate::functions::tail::lower_parameters(&mut statement, &self.db.client);
        self.refuse_assigned_columns(&statement)?;
        self.name_assigned_columns(&mut statement);
        let plan = self
            .ctx
            .state()
            .statement_to_plan(DFStatement::Statement(statement))
            .await?;
        check_plan_depth(&plan)?;
        Ok(plan)
    }

    /// An INSERT whose column list names a queue table's POSITION column (even to give it
    /// NULL) is refused: the database assigns it.
    fn refuse_assigned_columns(&self, statement: &SqlStatement) -> Result<()> {
        let insert = match statement {
            SqlStatement::Explain { statement, .. } => match statement.as_ref() {
                SqlStatement::Insert(insert) => insert,
                _ => return Ok(()),
            },
            SqlStatement::Insert(insert) => insert,
            _ => return Ok(()),
        };
        let TableObject::TableName(name) = &insert.table else {
            return Ok(());
        };
        let Some(table) = object_name(name)
            .ok()
            .and_then(|n| self.db.client.table(&n).ok())
        else {
            return Ok(());
        };
        let Some(position) = table.schema.position_column() else {
            return Ok(());
        };
        let position = &table.schema.columns()[position].name;
        let named = |column: &ObjectName| {
            (column.0.last().and_then(|part| part.as_ident()))
                .is_some_and(|ident| crate::parse::statement::normalize_ident(ident) == *position)
        };
        match insert.columns.iter().any(named) {
            true => Err(SqlError::Invalid(format!(
                "column '{position}' is GENERATED ALWAYS AS POSITION: the database assigns it, \
                 so leave it out of INSERT"
            ))),
            false => Ok(()),
        }
    }

    /// An INSERT without a column list into a table with a NON UNIQUE PRIMARY KEY lists the
    /// table's columns except auto_incrementing_id, which the database assigns.
    fn name_assigned_columns(&self, statement: &mut SqlStatement) {
        let insert = match statement {
            SqlStatement::Explain { statement, .. } => match statement.as_mut() {
                SqlStatement::Insert(insert) => insert,
                _ => return,
            },
            SqlStatement::Insert(insert) => insert,
            _ => return,
        };
        if !insert.columns.is_empty() {
            return;
        }
        let TableObject::TableName(name) = insert.table.clone() else {
            return;
        };
        let Some(table) = object_name(&name)
            .ok()
            .and_then(|n| self.db.client.table(&n).ok())
        else {
            return;
        };
        if let Some(hidden) = table.schema.auto_increment_column() {
            insert.columns = table
                .schema
                .columns()
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != hidden)
                .map(|(_, c)| ObjectName::from(vec![Ident::with_quote('"', &c.name)]))
                .collect();
        }
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

/// `BEGIN`, `COMMIT` and `ROLLBACK`: statements that start and end transactions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TxnControl {
    Begin { read_only: bool },
    Commit,
    Rollback,
    Savepoint(String),
    Release(String),
    RollbackTo(String),
}

impl TxnControl {
    /// The transaction statement `statement` is (None: it is another kind of statement);
    /// an error for the forms Nyala does not support.
    fn of(statement: &SqlStatement) -> Result<Option<Self>> {
        use datafusion::sql::sqlparser::ast::{
            TransactionAccessMode, TransactionIsolationLevel, TransactionMode,
        };
        Ok(Some(match statement {
            SqlStatement::StartTransaction {
                modes, statements, ..
            } => {
                if !statements.is_empty() {
                    return Err(SqlError::NotSupported("BEGIN ... END blocks".into()));
                }
                let mut read_only = false;
                for mode in modes {
                    match mode {
                        TransactionMode::AccessMode(TransactionAccessMode::ReadOnly) => {
                            read_only = true
                        }
                        TransactionMode::AccessMode(TransactionAccessMode::ReadWrite) => {}
                        TransactionMode::IsolationLevel(
                            TransactionIsolationLevel::RepeatableRead
                            | TransactionIsolationLevel::Snapshot,
                        ) => {}
                        TransactionMode::IsolationLevel(level) => {
                            return Err(SqlError::NotSupported(format!(
                                "ISOLATION LEVEL {level}: transactions run at REPEATABLE READ \
                                 (snapshot isolation)"
                            )))
                        }
                    }
                }
                TxnControl::Begin { read_only }
            }
            SqlStatement::Commit { chain: false, .. } => TxnControl::Commit,
            SqlStatement::Rollback {
                chain: false,
                savepoint: None,
            } => TxnControl::Rollback,
            SqlStatement::Rollback {
                chain: false,
                savepoint: Some(name),
            } => TxnControl::RollbackTo(name.value.clone()),
            SqlStatement::Commit { .. } | SqlStatement::Rollback { .. } => {
                return Err(SqlError::NotSupported("COMMIT/ROLLBACK AND CHAIN".into()))
            }
            SqlStatement::Savepoint { name } => TxnControl::Savepoint(name.value.clone()),
            SqlStatement::ReleaseSavepoint { name } => TxnControl::Release(name.value.clone()),
            _ => return Ok(None),
        }))
    }
}

/// Statements longer than this (bytes) are checked for privileges on a stack of their own.
const REQUIREMENTS_ON_OWN_STACK: usize = 256;

/// Most operators of a logical plan nested in one another, subqueries included.
pub const MAX_PLAN_DEPTH: usize = 1000;

/// Refuses a plan deeper than [`MAX_PLAN_DEPTH`]. The walk stops at that depth (and
/// DataFusion's tree walks grow their stack as they go).
fn check_plan_depth(plan: &LogicalPlan) -> Result<()> {
    struct Depth {
        current: usize,
        exceeded: bool,
    }
    impl<'n> TreeNodeVisitor<'n> for Depth {
        type Node = LogicalPlan;
        fn f_down(&mut self, _: &'n LogicalPlan) -> datafusion::common::Result<TreeNodeRecursion> {
            self.current += 1;
            self.exceeded = self.current > MAX_PLAN_DEPTH;
            Ok(match self.exceeded {
                true => TreeNodeRecursion::Stop,
                false => TreeNodeRecursion::Continue,
            })
        }
        fn f_up(&mut self, _: &'n LogicalPlan) -> datafusion::common::Result<TreeNodeRecursion> {
            self.current -= 1;
            Ok(TreeNodeRecursion::Continue)
        }
    }
    let mut depth = Depth {
        current: 0,
        exceeded: false,
    };
    plan.visit_with_subqueries(&mut depth)?;
    match depth.exceeded {
        true => Err(SqlError::Invalid(format!(
            "the query nests more than {MAX_PLAN_DEPTH} operators (through CTEs that read one \
             another, subqueries or views); simplify it"
        ))),
        false => Ok(()),
    }
}
