//! A planned statement: everything decided about a statement before it runs.
//!
//! Planning and running are separate so a client can learn a statement's kind and result schema
//! first (Flight SQL answers `GetFlightInfo` before `DoGet`), run a query more than once, or read
//! a scan-only query's tablets as separate partitions that agree on one snapshot. What a
//! statement does when run is kept as the least that still needs doing: DDL as parsed, a result
//! already computed, or DataFusion's physical plan.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::util::display::array_value_to_string;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::{LogicalPlan, Statement};
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{execute_stream, ExecutionPlan};
use futures::TryStreamExt;

use crate::backup::{backup_schema, restore_schema};
use crate::exec::scan;
use crate::ingest::count_of;
use crate::limits::interrupt::{detached, Interrupt, Stop};
use crate::limits::timeout::limited;
use crate::parse::statement::{BackupSpec, CopyFileSpec, CreateTableSpec, Ddl, RestoreSpec};
use crate::plan::lookup::{BoundLookup, BoundMutation};
use crate::plan::steps::Step;
use crate::results::{
    client_schema, client_stream, count_batch, count_schema, empty_schema, no_rows, one_stream,
    stream_of,
};
use crate::session::settings;
use crate::session::transaction::TxnControl;
use crate::session::Session;
use crate::{Result, SqlError};

/// What kind of statement a planned statement is; Flight SQL answers queries with rows and
/// updates with a count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatementKind {
    Query,
    Dml,
    Ddl,
}

/// What a client needs to know about a statement before running it (Flight SQL prepared
/// statements): its kind, the schema of its result and of its parameters (`$1`, `$2`, ...).
#[derive(Debug, Clone)]
pub struct StatementInfo {
    pub kind: StatementKind,
    pub schema: SchemaRef,
    pub parameters: SchemaRef,
}

/// One statement, parsed and planned, not yet run.
pub struct PlannedStatement {
    pub(crate) kind: StatementKind,
    pub(crate) session: Session,
    pub(crate) action: Action,
}

/// What running a planned statement does.
pub(crate) enum Action {
    /// Nyala's DDL, applied to the catalog as parsed.
    Ddl(Ddl),
    /// CREATE TABLE ... AS SELECT: the table, then the INSERT of the query's rows.
    CreateTableAs {
        spec: CreateTableSpec,
        insert: String,
    },
    /// A result computed at planning time (SHOW TABLES, DESCRIBE).
    Rows(RecordBatch),
    /// `SET name = value`, applied to the session when run.
    Setting(LogicalPlan),
    /// `BEGIN`, `COMMIT` or `ROLLBACK`.
    Transaction(TxnControl),
    /// A prepared query that reads one row by its whole primary key ([`crate::plan::lookup`]).
    Lookup(BoundLookup),
    /// A prepared UPDATE or DELETE of one row by its whole primary key ([`crate::plan::lookup`]).
    KeyMutation(BoundMutation),
    Plan(Arc<dyn ExecutionPlan>),
    /// Plans run in order in one transaction ([`crate::plan::on_conflict`],
    /// [`crate::plan::merge`]).
    Steps(Vec<Step<Arc<dyn ExecutionPlan>>>),
    /// `COPY table FROM 'file'` ([`crate::copy`]).
    CopyFrom {
        spec: CopyFileSpec,
        table: String,
        columns: Vec<String>,
    },
    /// `COPY table | (query) TO 'file'` ([`crate::copy`]): the query's plan.
    CopyTo {
        spec: CopyFileSpec,
        plan: Arc<dyn ExecutionPlan>,
    },
    /// `BACKUP ...` ([`crate::backup`]): its steps are its rows.
    Backup(BackupSpec),
    /// `RESTORE ...` ([`crate::backup`]): its steps are its rows.
    Restore(RestoreSpec),
}

impl PlannedStatement {
    pub fn kind(&self) -> StatementKind {
        self.kind
    }

    /// Schema of the result stream: `count: UInt64` for DML, no columns for DDL and SET.
    pub fn schema(&self) -> SchemaRef {
        match &self.action {
            Action::Ddl(_) | Action::Setting(_) | Action::Transaction(_) => empty_schema(),
            Action::CreateTableAs { .. }
            | Action::KeyMutation(_)
            | Action::Steps(_)
            | Action::CopyFrom { .. }
            | Action::CopyTo { .. } => count_schema(),
            Action::Rows(batch) => batch.schema(),
            Action::Lookup(lookup) => lookup.schema(),
            Action::Plan(plan) => client_schema(&plan.schema()),
            Action::Backup(_) => backup_schema(),
            Action::Restore(_) => restore_schema(),
        }
    }

    /// The stages of a distributed query, as EXPLAIN shows them (None: it runs on one
    /// coordinator; see [`crate::distributed`]).
    pub fn stages(&self) -> Option<String> {
        match &self.action {
            Action::Plan(plan) if plan.is::<datafusion_distributed::DistributedExec>() => Some(
                datafusion_distributed::display_plan_ascii(plan.as_ref(), false),
            ),
            _ => None,
        }
    }

    /// For a query that only projects and filters one table's scan, the number of its output
    /// partitions, one per tablet; each can be run on its own with [`Self::execute_partition`].
    pub fn tablet_partitions(&self) -> Option<usize> {
        fn scan_only(plan: &Arc<dyn ExecutionPlan>) -> bool {
            if plan.is::<scan::NyalaScanExec>() {
                return true;
            }
            let passes_through = plan.is::<ProjectionExec>()
                || plan.is::<FilterExec>()
                || plan.is::<CooperativeExec>();
            let children = plan.children();
            passes_through
                && children.len() == 1
                && partitions(children[0]) == partitions(plan)
                && scan_only(children[0])
        }
        // In a transaction, the statement runs whole in its session (which holds the rows
        // the transaction wrote).
        if self.session.in_transaction() {
            return None;
        }
        match &self.action {
            Action::Plan(plan) if self.kind == StatementKind::Query && scan_only(plan) => {
                Some(partitions(plan))
            }
            _ => None,
        }
    }

    /// The snapshot this statement would read at if run now (None if it reads no table). Pass
    /// it to [`Self::execute_partition`] so separately fetched partitions agree.
    pub async fn snapshot(&self) -> Result<Option<u64>> {
        match &self.action {
            Action::Plan(plan) => Ok(scan::statement_snapshot(plan).await?.map(|t| t.0)),
            _ => Ok(None),
        }
    }

    /// Runs partition `partition` of a query for which [`Self::tablet_partitions`] is `Some(n)`
    /// with `partition < n`, at `snapshot` (from [`Self::snapshot`]; None: a fresh one). The
    /// snapshot comes back from a client, so one in the future is refused
    /// ([`scan::returned_snapshot`]).
    pub async fn execute_partition(
        &self,
        partition: usize,
        snapshot: Option<u64>,
    ) -> Result<SendableRecordBatchStream> {
        match (&self.action, self.tablet_partitions()) {
            (Action::Plan(plan), Some(n)) if partition < n => {
                let plan = match snapshot {
                    Some(ts) => scan::with_snapshot(plan.clone(), scan::returned_snapshot(ts)?)?,
                    None => self.session.pin(plan.clone()).await?,
                };
                run(&self.session, plan, Some(partition)).await
            }
            _ => Err(SqlError::Invalid(format!(
                "partition {partition} does not exist for this statement (its tables changed since it was planned?)"
            ))),
        }
    }

    /// Runs a query (a statement of kind [`StatementKind::Query`]); it can run several times.
    pub async fn execute_query(&self) -> Result<SendableRecordBatchStream> {
        match (&self.action, self.kind) {
            (Action::Plan(plan), StatementKind::Query) => {
                let plan = self.session.pin(plan.clone()).await?;
                run(&self.session, plan, None).await
            }
            (Action::Rows(batch), _) => one_stream(vec![batch.clone()]),
            (Action::Lookup(lookup), _) => {
                let txn = self.session.transaction();
                let rows = lookup.run(&self.session.db.client, txn.as_deref()).await?;
                stream_of(lookup.schema(), rows)
            }
            // Within the statement's timeout, but not waiting for a turn among queries.
            (Action::Backup(spec), _) => {
                let deadline = deadline(&self.session);
                Ok(limited(self.session.backup(spec.clone()), deadline, None))
            }
            (Action::Restore(spec), _) => {
                let deadline = deadline(&self.session);
                Ok(limited(self.session.restore(spec.clone()), deadline, None))
            }
            _ => Err(SqlError::Invalid(
                "this statement is not a query: run it as an update".into(),
            )),
        }
    }

    /// Runs the statement; DDL and DML are applied when this returns, queries stream.
    pub async fn execute(self) -> Result<SendableRecordBatchStream> {
        self.execute_until(Interrupt::default()).await
    }

    /// Runs the statement as [`Self::execute`] does; one that changes something stops when
    /// `interrupt` asks, where stopping leaves nothing changed (see [`Interrupt`]). It runs in
    /// a task of its own, so a caller that goes away meanwhile (a client that disconnects)
    /// stops it the same way instead of cutting a write in two.
    pub async fn execute_until(self, interrupt: Interrupt) -> Result<SendableRecordBatchStream> {
        if self.kind == StatementKind::Query {
            return self.execute_query().await;
        }
        interrupt.check()?;
        let stop_if_dropped = interrupt.stop_on_drop();
        let applied = detached(self.apply(interrupt)).await;
        stop_if_dropped.disarm();
        applied?
    }

    /// Applies a statement that changes something (see [`Self::execute_until`]).
    pub(crate) async fn apply(self, interrupt: Interrupt) -> Result<SendableRecordBatchStream> {
        if let Some(txn) = self.session.transaction() {
            let ddl = matches!(self.action, Action::Ddl(_) | Action::CreateTableAs { .. });
            if ddl && txn.has_written() {
                return Err(SqlError::NotSupported(
                    "DDL in a transaction that has written rows (DDL is not transactional: \
                     COMMIT or ROLLBACK first)"
                        .into(),
                ));
            }
            if matches!(self.action, Action::CreateTableAs { .. }) {
                return Err(SqlError::NotSupported(
                    "CREATE TABLE ... AS SELECT inside a transaction".into(),
                ));
            }
        }
        match self.action {
            Action::Transaction(control) => {
                match control {
                    TxnControl::Begin { read_only } => {
                        self.session.begin(read_only)?;
                    }
                    TxnControl::Commit => self.session.commit().await?,
                    TxnControl::Rollback => self.session.rollback().await,
                    savepoint => self.session.savepoint(&savepoint)?,
                }
                no_rows()
            }
            Action::Ddl(ddl) => {
                let user = self.session.user();
                let own_password =
                    matches!(&ddl, Ddl::AlterUser { name, .. } if Some(name) == user.as_ref());
                ddl.apply(&self.session.db.client, user).await?;
                if own_password {
                    self.session.keep_login();
                }
                no_rows()
            }
            Action::CreateTableAs { spec, insert } => {
                self.session.create_table_as(spec, &insert, interrupt).await
            }
            Action::Rows(batch) => one_stream(vec![batch]),
            Action::Lookup(_) | Action::Backup(_) | Action::Restore(_) => {
                self.execute_query().await
            }
            Action::KeyMutation(mutation) => {
                let rows = mutation.run(&self.session.db.client).await?;
                one_stream(vec![count_batch(rows)])
            }
            Action::CopyFrom {
                spec,
                table,
                columns,
            } => {
                let rows = self.session.copy_from(&spec, &table, &columns).await?;
                one_stream(vec![count_batch(rows)])
            }
            Action::CopyTo { spec, plan } => {
                let plan = self.session.pin(plan).await?;
                let rows = run(&self.session, plan, None).await?;
                one_stream(vec![count_batch(crate::copy::copy_to(rows, &spec).await?)])
            }
            Action::Setting(plan) => {
                self.session.ctx.execute_logical_plan(plan).await?;
                no_rows()
            }
            Action::Plan(plan) => {
                let plan = self.session.pin(plan).await?;
                one_stream(run_to_end(&self.session, plan, &interrupt).await?)
            }
            Action::Steps(plans) => {
                let session = &self.session;
                let own = session.transaction().is_none();
                if own {
                    session.begin(false)?;
                }
                let steps = async {
                    let mut count = 0;
                    for step in plans {
                        let plan = session.pin(step.plan().clone()).await?;
                        let rows = run_to_end(session, plan, &interrupt).await?;
                        match step {
                            Step::Change(_) => count += count_of(&rows),
                            Step::Stage(_, staged) => staged.set(rows)?,
                            Step::Refuse(_, error) => {
                                if let Some(row) = first_row(&rows)? {
                                    return Err(SqlError::Invalid(error.replace("{row}", &row)));
                                }
                            }
                        }
                    }
                    Ok::<_, SqlError>(count)
                };
                let count = match (steps.await, own) {
                    (Ok(count), true) => session.commit().await.map(|()| count),
                    (Err(e), true) => {
                        session.rollback().await;
                        Err(e)
                    }
                    (result, false) => result,
                }?;
                one_stream(vec![count_batch(count)])
            }
        }
    }
}

/// The first row of `batches`, its values written out as `(v1, v2, ...)`.
fn first_row(batches: &[RecordBatch]) -> Result<Option<String>> {
    let Some(batch) = batches.iter().find(|b| b.num_rows() > 0) else {
        return Ok(None);
    };
    let values = (batch.columns().iter())
        .map(|column| array_value_to_string(column, 0))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(Some(format!("({})", values.join(", "))))
}

/// Runs partition `partition` of query `plan` (None: all of it) within the statement's limits:
/// a memory pool of its own, its timeout, and a turn among running queries.
async fn run(
    session: &Session,
    plan: Arc<dyn ExecutionPlan>,
    partition: Option<usize>,
) -> Result<SendableRecordBatchStream> {
    let limits = &session.db.limits;
    let deadline = deadline(session);
    let permit = limits.admit(deadline.map(|(at, _)| at)).await?;
    let task = limits.task_context(session.task_ctx(), None)?;
    let stream = client_stream(match partition {
        Some(partition) => plan.execute(partition, task)?,
        None => execute_stream(plan, task)?,
    });
    Ok(limited(stream, deadline, Some(permit)))
}

/// Runs `plan`, which changes rows, to its end within the statement's limits: a memory pool of
/// its own, and its timeout, which stops it through `interrupt` rather than by dropping it (see
/// [`Interrupt`]). It does not wait behind queries for a turn.
async fn run_to_end(
    session: &Session,
    plan: Arc<dyn ExecutionPlan>,
    interrupt: &Interrupt,
) -> Result<Vec<RecordBatch>> {
    let task = (session.db.limits).task_context(session.task_ctx(), Some(interrupt))?;
    let work = execute_stream(plan, task)?.try_collect::<Vec<_>>();
    let Some(timeout) = timeout(session) else {
        return Ok(work.await?);
    };
    tokio::pin!(work);
    tokio::select! {
        done = &mut work => Ok(done?),
        () = tokio::time::sleep(timeout) => {
            interrupt.stop(Stop::Timeout(timeout));
            Ok(work.await?)
        }
    }
}

/// When a statement starting now times out, and its timeout.
fn deadline(session: &Session) -> Option<(tokio::time::Instant, std::time::Duration)> {
    timeout(session).map(|t| (tokio::time::Instant::now() + t, t))
}

/// The session's statement timeout (or the server's default).
fn timeout(session: &Session) -> Option<std::time::Duration> {
    let state = session.ctx.state_ref();
    let state = state.read();
    settings::statement_timeout(state.config_options(), session.db.limits.default_timeout())
}

fn partitions(plan: &Arc<dyn ExecutionPlan>) -> usize {
    plan.properties().output_partitioning().partition_count()
}

/// The kind of a statement DataFusion planned; the kinds of statement DataFusion plans but
/// Nyala does not run (its DDL, COPY, transactions) are refused.
pub(crate) fn statement_kind(plan: &LogicalPlan) -> Result<StatementKind> {
    match plan {
        LogicalPlan::Dml(_) => Ok(StatementKind::Dml),
        LogicalPlan::Statement(Statement::SetVariable(_)) => Ok(StatementKind::Ddl),
        LogicalPlan::Ddl(_) | LogicalPlan::Copy(_) | LogicalPlan::Statement(_) => Err(
            SqlError::NotSupported(format!("{} statements", plan.display())),
        ),
        _ => Ok(StatementKind::Query),
    }
}
