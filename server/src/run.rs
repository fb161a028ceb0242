//! Running a client's statements: the one place both front ends run them through, so that
//! every statement is shown to operators while it runs ([`Activity`]), can be cancelled, and
//! stops the same way whichever protocol sent it.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use datafusion::common::ScalarValue;
//! # use nyala_server::{activity::Activity, ClientSession, Result};
//! # async fn sketch(session: &ClientSession, activity: &Arc<Activity>, params: Vec<ScalarValue>)
//! #     -> Result<()> {
//! let statement = session.statement("UPDATE t SET v = $1 WHERE k = $2").await?;
//! let changed = session.run_update(activity, &statement, &[params]).await?; // rows changed
//! let query = session.statement("SELECT v FROM t").await?;
//! let (schema, rows) = session.run_query(activity, &query, &[]).await?; // a BatchStream
//! # Ok(()) }
//! ```

use std::pin::Pin;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::ScalarValue;
use futures::{Stream, StreamExt, TryStreamExt};
use nyala_sql::{Interrupt, PreparedStatement, SqlError, StatementKind};
use tokio::sync::watch;

use crate::activity::{Activity, TrackedStatement};
use crate::error::{Result, ServerError};
use crate::session::ClientSession;

/// Batches of a result as they are computed.
pub type BatchStream = Pin<Box<dyn Stream<Item = Result<RecordBatch>> + Send + 'static>>;

/// How the activity of a server names statements of `kind`.
pub fn kind_label(kind: StatementKind) -> &'static str {
    match kind {
        StatementKind::Query => "query",
        StatementKind::Dml => "dml",
        StatementKind::Ddl => "ddl",
    }
}

impl ClientSession {
    /// Registers statement `sql` of `kind`, which this session starts to run, in `activity`.
    pub fn track(
        &self,
        activity: &Arc<Activity>,
        sql: &str,
        kind: StatementKind,
    ) -> TrackedStatement {
        activity.start_in(Some(self.id()), sql, &self.user_name(), kind_label(kind))
    }

    /// Runs a DDL or DML statement once per parameter row; the total count. A statement
    /// cancelled meanwhile stops where stopping changes nothing (see [`Interrupt`]).
    pub async fn run_update(
        &self,
        activity: &Arc<Activity>,
        statement: &PreparedStatement,
        rows: &[Vec<ScalarValue>],
    ) -> Result<u64> {
        let kind = statement.info().kind;
        if kind == StatementKind::Ddl {
            self.forget_statements();
        }
        let tracked = self.track(activity, statement.sql(), kind);
        let interrupt = Interrupt::default();
        let work = self.run_rows(statement, rows, &interrupt);
        tracked.run_to_end(work, &interrupt, |total| *total).await
    }

    /// Runs a DDL or DML statement once per parameter row (see [`Self::run_update`]).
    async fn run_rows(
        &self,
        statement: &PreparedStatement,
        rows: &[Vec<ScalarValue>],
        interrupt: &Interrupt,
    ) -> Result<u64> {
        let mut total = 0;
        for (i, row) in rows.iter().enumerate() {
            let result = async {
                let planned = self.sql().plan_prepared(statement, row).await?;
                let applied = planned.execute_until(interrupt.clone()).await?;
                let batches: Vec<RecordBatch> = applied.try_collect().await?;
                Ok::<_, SqlError>(nyala_sql::count_of(&batches))
            }
            .await;
            match result {
                Ok(count) => total += count,
                Err(e) if i > 0 => {
                    return Err(ServerError::invalid(format!(
                        "{e} (parameter row {}; the {i} rows before it were applied)",
                        i + 1
                    )))
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(total)
    }

    /// Runs a query with `params` bound: the schema of its rows and the rows as they come,
    /// shown in `activity` until the stream ends or is dropped, and stopped when cancelled.
    pub async fn run_query(
        &self,
        activity: &Arc<Activity>,
        statement: &PreparedStatement,
        params: &[ScalarValue],
    ) -> Result<(SchemaRef, BatchStream)> {
        let tracked = self.track(activity, statement.sql(), StatementKind::Query);
        let started = async {
            let planned = self.sql().plan_prepared(statement, params).await?;
            tracked.planned(&planned);
            Ok::<_, ServerError>(planned.execute_query().await?)
        }
        .await;
        let stream = started.inspect_err(|e| tracked.failed(e))?;
        let schema = stream.schema();
        let stream = Box::pin(stream.map_err(|e| ServerError::from(SqlError::from(e))));
        Ok((schema, tracked.follow(stream)))
    }
}

impl TrackedStatement {
    /// `stream`, which carries the statement from now on: it counts the rows that pass, records
    /// the error the stream fails with, stops it when the statement is cancelled, and finishes
    /// the statement when it ends or is dropped.
    pub fn follow(self, stream: BatchStream) -> BatchStream {
        let stream = cancellable(stream, self.cancellation());
        Box::pin(stream.map(move |batch| {
            match &batch {
                Ok(batch) => self.add_rows(batch.num_rows() as u64),
                Err(e) => self.failed(e),
            }
            batch
        }))
    }
}

/// `stream`, stopped with a cancelled error once `cancelled` turns true.
pub fn cancellable(stream: BatchStream, mut cancelled: watch::Receiver<bool>) -> BatchStream {
    let mut flag = cancelled.clone();
    let stopped = async move {
        if cancelled.wait_for(|c| *c).await.is_err() {
            // Nobody can cancel this statement any more.
            std::future::pending::<()>().await;
        }
    };
    let error = futures::stream::once(async move { *flag.borrow_and_update() }).filter_map(
        |was_cancelled| async move { was_cancelled.then(|| Err(ServerError::cancelled())) },
    );
    Box::pin(stream.take_until(stopped).chain(error))
}
