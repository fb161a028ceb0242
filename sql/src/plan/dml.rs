//! DML execution: DataFusion computes the rows, [`NyalaSink`] turns them into primary-key
//! mutations.
//!
//! - INSERT / UPSERT: the rows of the source plan (all table columns) are inserted or upserted.
//! - UPDATE and DELETE: DataFusion's DML plan is rewritten into a [`MutationNode`] whose input
//!   selects the target rows like any query (filters, subqueries and joins, runtime filters
//!   included) and yields their key columns, plus for an UPDATE the new values of the assigned
//!   columns; they become `Update` or `Delete` mutations by key.
//!
//! UPDATE and DELETE run in [`crate::exec::mutation::ConditionalMutationExec`], which writes each
//! row only if it has not changed since the statement read it and reads the others again.
//!
//! A statement is atomic: rows that fit in one write to one tablet are that write, which the
//! tablet applies entirely or not at all; more rows, or rows of several tablets, are written in
//! a transaction that commits at one timestamp in all of them (or aborts in all).

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, Column, DFSchema, DFSchemaRef, TableReference};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::sink::DataSink;
use datafusion::datasource::source_as_provider;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::{QueryPlanner, SessionState};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::execution_props::ExecutionProps;
use datafusion::logical_expr::expr::physical_name;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{
    DmlStatement, Expr, Extension, LogicalPlan, LogicalPlanBuilder, TableSource,
    UserDefinedLogicalNode, UserDefinedLogicalNodeCore, Values, WriteOp,
};
use datafusion::physical_expr::create_physical_expr;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use futures::StreamExt;
use nyala_engine::{Client, EngineError, TableHandle, Written};
use nyala_storage::{Timestamp, WriteKind};

use crate::catalog::table::NyalaTable;
use crate::limits::Interrupt;
use crate::session::transaction::TxnSlot;

#[derive(Debug)]
pub struct NyalaSink {
    client: Client,
    table: TableHandle,
    kind: WriteKind,
    /// Schema of the rows this sink receives.
    schema: SchemaRef,
}

impl NyalaSink {
    pub fn new(client: Client, table: TableHandle, kind: WriteKind, schema: SchemaRef) -> Self {
        Self {
            client,
            table,
            kind,
            schema,
        }
    }

    pub(crate) fn verb(&self) -> &'static str {
        match self.kind {
            WriteKind::Insert => "INSERT",
            WriteKind::InsertIgnore => "INSERT IGNORE",
            WriteKind::Upsert => "UPSERT",
            WriteKind::Update => "UPDATE",
            WriteKind::Delete => "DELETE",
        }
    }
}

impl DisplayAs for NyalaSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "NyalaSink: {} {}", self.verb(), self.table.name)
    }
}

#[async_trait]
impl DataSink for NyalaSink {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(
        &self,
        data: SendableRecordBatchStream,
        context: &Arc<TaskContext>,
    ) -> Result<u64> {
        match self.write_statement(data, None, context).await? {
            Outcome::Written(rows) => Ok(rows),
            // Unconditional writes have no conflicts.
            Outcome::Conflict => Err(DataFusionError::Internal(format!(
                "{} met a conflict",
                self.verb()
            ))),
        }
    }
}

/// What writing a statement's rows did.
pub(crate) enum Outcome {
    /// All its rows were written, this many.
    Written(u64),
    /// A row changed after the statement's snapshot, or is locked by a transaction in
    /// progress: nothing was written, the statement must read its rows again.
    Conflict,
}

impl NyalaSink {
    pub(crate) fn table_id(&self) -> &str {
        &self.table.id
    }

    /// Writes all rows of `data` as one statement: entirely or not at all. Rows that fit in
    /// one write to one tablet are that write; more become a transaction (see
    /// [`nyala_engine::Transaction`]). With `unchanged_since`, a row changed since that snapshot
    /// (or locked by a transaction in progress) makes the statement write nothing and report
    /// [`Outcome::Conflict`].
    pub(crate) async fn write_statement(
        &self,
        mut data: SendableRecordBatchStream,
        unchanged_since: Option<Timestamp>,
        context: &TaskContext,
    ) -> Result<Outcome> {
        // Asked to stop, the statement stops while it reads, never in a write it has begun.
        let interrupt = Interrupt::of(context);
        if let Some(txn) = TxnSlot::of(context) {
            // In the session's transaction: written when all rows are known (the statement's
            // reads of the table do not see its own writes), at the transaction's snapshot.
            let mut batches = Vec::new();
            loop {
                match self.next_batch(&mut data, &interrupt).await {
                    Ok(Some(batch)) => batches.push(batch),
                    Ok(None) => break,
                    Err(e) => {
                        txn.fail(&e.strip_backtrace()).await;
                        return Err(e);
                    }
                }
            }
            let rows = txn
                .write(&self.table, self.kind, batches, self.verb())
                .await?;
            return Ok(Outcome::Written(rows));
        }
        let Some(first) = self.next_batch(&mut data, &interrupt).await? else {
            return Ok(Outcome::Written(0));
        };
        let second = self.next_batch(&mut data, &interrupt).await?;
        let single = second.is_none()
            && (self.client.is_single_write(&self.table, &first)).map_err(|e| self.failed(e))?;
        if single {
            let written = match unchanged_since {
                None => (self.client.write(&self.table, self.kind, &first).await)
                    .map(|rows| Written { rows, conflicts: 0 }),
                Some(snapshot) => {
                    (self.client)
                        .write_unchanged_since(&self.table, self.kind, &first, snapshot)
                        .await
                }
            };
            return match written {
                Ok(w) if w.conflicts == 0 => Ok(Outcome::Written(w.rows as u64)),
                Ok(_) => Ok(Outcome::Conflict),
                Err(e) => Err(self.failed(e.error)),
            };
        }
        let txn = self.client.begin();
        let written = async {
            let mut rows = 0u64;
            let mut batch = Some(first);
            let mut next = second;
            while let Some(rows_now) = batch {
                // The last write prepares the tablets it writes.
                let last = next.is_none();
                let written = txn
                    .write(&self.table, self.kind, &rows_now, unchanged_since, last)
                    .await;
                match written {
                    Ok(w) if w.conflicts == 0 => rows += w.rows as u64,
                    Ok(_) => return Ok(Outcome::Conflict),
                    Err(e) if unchanged_since.is_some() && is_locked(&e.error) => {
                        return Ok(Outcome::Conflict)
                    }
                    Err(e) => return Err(self.failed(e.error)),
                }
                batch = next.take();
                if batch.is_some() {
                    next = self.next_batch(&mut data, &interrupt).await?;
                }
            }
            Ok(Outcome::Written(rows))
        }
        .await;
        match written {
            Ok(Outcome::Written(rows)) => {
                txn.commit().await.map_err(|e| match e {
                    // Not "changed nothing": the status table decides.
                    e @ EngineError::OutcomeUnknown(_) => {
                        DataFusionError::External(Box::new(crate::SqlError::Engine(e)))
                    }
                    e => self.failed(e),
                })?;
                Ok(Outcome::Written(rows))
            }
            other => {
                txn.abort().await;
                other
            }
        }
    }

    /// The next batch of `data` with rows, in the table's types; an error if the statement is
    /// asked to stop first.
    async fn next_batch(
        &self,
        data: &mut SendableRecordBatchStream,
        interrupt: &Interrupt,
    ) -> Result<Option<RecordBatch>> {
        interrupt.unless_stopped(self.next_rows(data)).await
    }

    async fn next_rows(&self, data: &mut SendableRecordBatchStream) -> Result<Option<RecordBatch>> {
        while let Some(batch) = data.next().await {
            let batch = batch.map_err(|e| self.failed(e.find_root().strip_backtrace()))?;
            if batch.num_rows() > 0 {
                let batch = self.with_table_types(batch);
                return batch
                    .map(Some)
                    .map_err(|e| self.failed(e.find_root().strip_backtrace()));
            }
        }
        Ok(None)
    }

    /// Wraps an error of the statement, which wrote nothing.
    fn failed(&self, error: impl fmt::Display) -> DataFusionError {
        DataFusionError::Execution(format!("{error}; the {} changed nothing", self.verb()))
    }

    /// Re-labels the batch with the table's field definitions (names, nullability, timezone),
    /// which also rejects NULLs in NOT NULL columns with a clear error.
    fn with_table_types(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let table = self.table.schema.arrow_schema();
        let fields = batch
            .schema()
            .fields()
            .iter()
            .map(|f| {
                table
                    .field_with_name(f.name())
                    .map(|t| Arc::new(t.clone()))
                    .map_err(|_| DataFusionError::Plan(format!("unknown column '{}'", f.name())))
            })
            .collect::<Result<Vec<_>>>()?;
        let schema = Arc::new(arrow::datatypes::Schema::new(fields));
        let mut columns = Vec::with_capacity(batch.num_columns());
        for (column, field) in batch.columns().iter().zip(schema.fields()) {
            if column.data_type() == field.data_type() {
                columns.push(column.clone());
            } else {
                columns.push(arrow::compute::cast(column, field.data_type())?);
            }
        }
        RecordBatch::try_new(schema, columns).map_err(|e| {
            DataFusionError::Execution(e.to_string().replace("Invalid argument error: ", ""))
        })
    }
}

/// Whether `error` is a write meeting a row a transaction in progress has locked.
fn is_locked(error: &EngineError) -> bool {
    matches!(
        error,
        EngineError::Storage(nyala_storage::StorageError::Locked { .. })
    )
}

/// A DELETE, an UPDATE or an INSERT IGNORE of a Nyala table in a logical plan. Its input yields
/// the key columns of the target rows (named as in the table) and, for an UPDATE, the new values
/// of the assigned columns; for an INSERT IGNORE, the new rows.
#[derive(Clone)]
pub struct MutationNode {
    table: TableReference,
    target: Arc<dyn TableSource>,
    kind: WriteKind,
    input: Arc<LogicalPlan>,
    schema: DFSchemaRef,
}

/// Whether `plan` inserts rows given as values (`INSERT INTO t [(columns)] VALUES ...`, the
/// values maybe cast and put in the table's column order): nothing but projections over a
/// `Values` below the insert, of literals, columns, casts and operators (no function call:
/// the optimizer replaces `now()` by the statement's time; no subquery, no table read). The
/// logical optimizer's rewrites have nothing to gain in such a plan and cost about a third of
/// a single-row INSERT's planning, so it is only analyzed (types coerced), then planned by
/// [`plan_values_insert`].
pub(crate) fn inserts_values(plan: &LogicalPlan) -> bool {
    let LogicalPlan::Dml(DmlStatement {
        op: WriteOp::Insert(_),
        input,
        ..
    }) = plan
    else {
        return false;
    };
    let mut values = true;
    let plain = |e: &Expr| {
        matches!(
            e,
            Expr::Literal(..)
                | Expr::Column(_)
                | Expr::Alias(_)
                | Expr::Cast(_)
                | Expr::TryCast(_)
                | Expr::Negative(_)
                | Expr::Not(_)
                | Expr::IsNull(_)
                | Expr::IsNotNull(_)
                | Expr::BinaryExpr(_)
        )
    };
    let _ = input.apply_with_subqueries(|node| {
        values &= matches!(node, LogicalPlan::Projection(_) | LogicalPlan::Values(_));
        let _ = node.apply_expressions(|e| {
            values &= !e.exists(|e| Ok(!plain(e)))?;
            Ok(TreeNodeRecursion::Continue)
        });
        Ok(match values {
            true => TreeNodeRecursion::Continue,
            false => TreeNodeRecursion::Stop,
        })
    });
    values
}

/// The physical plan of an INSERT of values ([`inserts_values`]), `plan` analyzed: the
/// values and the projections over them planned as DataFusion's physical planner plans them,
/// under the table's insert, without the physical optimizer. Its rules find nothing to
/// rearrange in constants feeding one sink, and were over half of such an INSERT's physical
/// planning.
pub(crate) async fn plan_values_insert(
    plan: &LogicalPlan,
    state: &SessionState,
) -> Result<Arc<dyn ExecutionPlan>> {
    let LogicalPlan::Dml(DmlStatement {
        target,
        op: WriteOp::Insert(op),
        input,
        ..
    }) = plan
    else {
        return internal_err!("not an INSERT of values: {plan}");
    };
    let rows = values_exec(input, state.execution_props())?;
    source_as_provider(target)?
        .insert_into(state, rows, *op)
        .await
}

/// The rows of `plan`, projections over a `Values`, as DataFusion's physical planner plans
/// them.
fn values_exec(plan: &LogicalPlan, props: &ExecutionProps) -> Result<Arc<dyn ExecutionPlan>> {
    let physical = |e: &Expr, schema: &DFSchema| {
        create_physical_expr(e, schema, props, &PhysicalPlanningContext::default())
    };
    match plan {
        LogicalPlan::Values(Values { values, schema }) => {
            let rows = values
                .iter()
                .map(|row| row.iter().map(|e| physical(e, schema)).collect())
                .collect::<Result<Vec<_>>>()?;
            Ok(MemorySourceConfig::try_new_as_values(
                schema.inner().clone(),
                rows,
            )?)
        }
        LogicalPlan::Projection(projection) => {
            let input = values_exec(&projection.input, props)?;
            let from = projection.input.schema();
            let exprs = (projection.expr.iter())
                .map(|e| {
                    // A column keeps its input's name (the planner's rule: a logical column
                    // may name a derived one).
                    let alias = match e {
                        Expr::Column(c) => match from.index_of_column(c) {
                            Ok(i) => input.schema().field(i).name().clone(),
                            Err(_) => physical_name(e)?,
                        },
                        _ => physical_name(e)?,
                    };
                    Ok(ProjectionExpr {
                        expr: physical(e, from)?,
                        alias,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Arc::new(ProjectionExec::try_new_with_schema_metadata(
                exprs,
                input,
                projection.schema.as_arrow(),
            )?))
        }
        other => internal_err!("not a projection of values: {other}"),
    }
}

/// Rewrites DataFusion's DELETE and UPDATE plans (anywhere in `plan`, under EXPLAIN too) into
/// [`MutationNode`]s. DataFusion's own path would hand the table only the WHERE conjuncts that
/// mention the target table, losing subqueries and joins: `DELETE ... WHERE k IN (SELECT ...)`
/// would delete every row.
pub fn plan_mutations(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up(|node| match node {
        LogicalPlan::Dml(dml) if matches!(dml.op, WriteOp::Delete | WriteOp::Update) => {
            Ok(Transformed::yes(MutationNode::try_new(dml)?))
        }
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
}

/// Rewrites the INSERT of `plan` (an INSERT, or EXPLAIN of one) into a [`MutationNode`] that
/// skips rows whose key exists or repeats.
pub fn plan_insert_ignore(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up(|node| match node {
        LogicalPlan::Dml(dml) if matches!(dml.op, WriteOp::Insert(InsertOp::Append)) => {
            Ok(Transformed::yes(LogicalPlan::Extension(Extension {
                node: Arc::new(MutationNode {
                    table: dml.table_name,
                    target: dml.target,
                    kind: WriteKind::InsertIgnore,
                    input: dml.input,
                    schema: dml.output_schema,
                }),
            })))
        }
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
}

impl MutationNode {
    /// The table the node writes.
    pub(crate) fn target(&self) -> &Arc<dyn TableSource> {
        &self.target
    }

    fn try_new(dml: DmlStatement) -> Result<LogicalPlan> {
        let provider = source_as_provider(&dml.target)?;
        let Some(table) = provider.downcast_ref::<NyalaTable>() else {
            return Ok(LogicalPlan::Dml(dml));
        };
        let input = dml.input.as_ref();
        let columns = table.column_names();
        if input.schema().fields().len() != columns.len() {
            return Err(DataFusionError::Plan(format!(
                "{} of '{}' selects {} columns, the table has {}",
                dml.op,
                dml.table_name,
                input.schema().fields().len(),
                columns.len()
            )));
        }
        // Input columns are the table's, in order: for DELETE the target rows as they are,
        // for UPDATE the rows as they will be.
        let mut wanted = table.key_columns();
        let kind = match dml.op {
            WriteOp::Update => {
                for (i, name) in assigned_columns(input, &dml.table_name)? {
                    if wanted.contains(&i) {
                        return Err(DataFusionError::Plan(format!(
                            "cannot update primary key column '{name}'; delete the row and insert it with the new key"
                        )));
                    }
                    wanted.push(i);
                }
                WriteKind::Update
            }
            _ => WriteKind::Delete,
        };
        let exprs = wanted.iter().map(|&i| {
            Expr::Column(Column::from(input.schema().qualified_field(i))).alias(&columns[i])
        });
        let projected = LogicalPlanBuilder::from(input.clone())
            .project(exprs)?
            .build()?;
        Ok(LogicalPlan::Extension(Extension {
            node: Arc::new(MutationNode {
                table: dml.table_name,
                target: dml.target,
                kind,
                input: Arc::new(projected),
                schema: dml.output_schema,
            }),
        }))
    }
}

/// The (index, name) of the columns an UPDATE's input projection assigns: every column that is
/// not the target table's own column passed through.
fn assigned_columns(input: &LogicalPlan, table: &TableReference) -> Result<Vec<(usize, String)>> {
    let LogicalPlan::Projection(projection) = input else {
        return Err(DataFusionError::Plan(
            "UPDATE plan has an unexpected shape".into(),
        ));
    };
    let mut aliases = vec![table.clone()];
    input.apply(|node| {
        if let LogicalPlan::SubqueryAlias(alias) = node {
            if matches!(alias.input.as_ref(), LogicalPlan::TableScan(scan) if scan.table_name.resolved_eq(table))
            {
                aliases.push(alias.alias.clone());
            }
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    })?;
    let mut assigned = Vec::new();
    for (i, (expr, field)) in projection
        .expr
        .iter()
        .zip(projection.schema.fields())
        .enumerate()
    {
        let unchanged = matches!(
            expr.clone().unalias(),
            Expr::Column(c) if c.name == *field.name()
                && c.relation.as_ref().is_none_or(|r| aliases.iter().any(|a| a.resolved_eq(r)))
        );
        if !unchanged {
            assigned.push((i, field.name().clone()));
        }
    }
    Ok(assigned)
}

impl fmt::Debug for MutationNode {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        UserDefinedLogicalNodeCore::fmt_for_explain(self, f)
    }
}

impl PartialEq for MutationNode {
    fn eq(&self, other: &Self) -> bool {
        self.table == other.table && self.kind == other.kind && self.input == other.input
    }
}

impl Eq for MutationNode {}

impl PartialOrd for MutationNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        (&self.table, self.kind, &self.input).partial_cmp(&(&other.table, other.kind, &other.input))
    }
}

impl Hash for MutationNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.table.hash(state);
        self.kind.hash(state);
        self.input.hash(state);
    }
}

impl UserDefinedLogicalNodeCore for MutationNode {
    fn name(&self) -> &str {
        "NyalaMutation"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "NyalaMutation: {} {}", self.kind_name(), self.table)
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        let input = inputs
            .pop()
            .ok_or_else(|| DataFusionError::Internal("NyalaMutation needs an input".into()))?;
        Ok(Self {
            input: Arc::new(input),
            ..self.clone()
        })
    }
}

/// Plans [`MutationNode`]s: the selected rows go into the table's sink.
struct MutationPlanner;

#[async_trait]
impl ExtensionPlanner for MutationPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(mutation) = node.as_any().downcast_ref::<MutationNode>() else {
            return Ok(None);
        };
        let provider = source_as_provider(&mutation.target)?;
        let (Some(table), [input]) = (provider.downcast_ref::<NyalaTable>(), physical_inputs)
        else {
            return Err(DataFusionError::Internal(format!(
                "cannot plan {} of '{}'",
                mutation.kind_name(),
                mutation.table
            )));
        };
        if mutation.kind == WriteKind::InsertIgnore {
            return Ok(Some(table.sink(input.clone(), mutation.kind)));
        }
        let (Some(state), [logical]) = (
            session.as_any().downcast_ref::<SessionState>(),
            logical_inputs,
        ) else {
            return Err(DataFusionError::Internal(format!(
                "cannot plan {} of '{}' outside a session",
                mutation.kind_name(),
                mutation.table
            )));
        };
        Ok(Some(table.conditional_sink(
            input.clone(),
            mutation.kind,
            Arc::new((*logical).clone()),
            Arc::new(state.clone()),
        )))
    }
}

impl MutationNode {
    pub(crate) fn kind(&self) -> WriteKind {
        self.kind
    }

    /// The plan yielding the target rows' keys (and, for an UPDATE, the new values).
    pub(crate) fn input(&self) -> &LogicalPlan {
        &self.input
    }

    fn kind_name(&self) -> &'static str {
        match self.kind {
            WriteKind::Update => "UPDATE",
            WriteKind::InsertIgnore => "INSERT IGNORE",
            _ => "DELETE",
        }
    }
}

/// DataFusion's physical planner with Nyala's logical nodes added.
#[derive(Debug)]
pub struct NyalaQueryPlanner;

#[async_trait]
impl QueryPlanner for NyalaQueryPlanner {
    async fn create_physical_plan(
        &self,
        plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(MutationPlanner)])
            .create_physical_plan(plan, session)
            .await
    }
}
