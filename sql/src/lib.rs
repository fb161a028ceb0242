//! Nyala's SQL layer: DataFusion with Nyala tables inside.
//!
//! A [`Database`] owns the engine (master catalog + tablet server) and hands out [`Session`]s.
//! A session takes one SQL statement at a time: our own DDL (`CREATE TABLE ... DISTRIBUTE BY`,
//! `DROP TABLE`, `SHOW TABLES`, `DESCRIBE`) is parsed with sqlparser and executed against the
//! catalog; everything else (queries, INSERT/UPSERT/UPDATE/DELETE, EXPLAIN) is planned and run by
//! DataFusion through the [`NyalaTable`](table::NyalaTable) provider, which turns scans into
//! tablet scans and DML into primary-key mutations.
//!
//! Every statement yields an Arrow stream: queries their rows, DML one row with a `count`
//! column (rows affected), DDL and SET no columns and no rows; a statement's
//! [`PlannedStatement::schema`] is always the schema of its stream.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef};
use datafusion::catalog::{CatalogProvider, MemoryCatalogProvider};
use datafusion::common::ScalarValue;
use datafusion::common::TableReference;
use datafusion::datasource::provider_as_source;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::SessionStateBuilder;
use datafusion::logical_expr::{DmlStatement, LogicalPlan, LogicalPlanBuilder, Statement, WriteOp};
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{collect, execute_stream, memory::MemoryStream, ExecutionPlan};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    AssignmentTarget, Ident, ObjectName, Statement as DFSqlStatement, TableFactor, TableObject,
    Update, UpdateTableFromKind,
};
use nyala_engine::{Client, ColumnChange, RangeSpec};
use nyala_storage::{ColumnCompression, ColumnEncoding, ColumnType, TabletOptions, Timestamp};

mod as_of;
mod catalog;
mod dml;
mod error;
mod ingest;
pub mod partitioning;
mod predicate;
mod prepared;
pub mod runtime_filter;
mod scan;
pub mod statement;
mod table;

pub use error::SqlError;
pub use ingest::{count_of, IngestMode, IngestTarget};
pub use prepared::PreparedStatement;

use prepared::Draft;

use statement::{CreateTableSpec, NyalaStatement};

pub type Result<T, E = SqlError> = std::result::Result<T, E>;

/// The catalog and schema names under which Nyala's tables appear to SQL and Flight SQL clients.
pub const CATALOG_NAME: &str = "nyala";
pub const SCHEMA_NAME: &str = "public";

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

/// Options for opening an embedded database.
#[derive(Debug, Clone, Default)]
pub struct DatabaseOptions {
    /// MemRowSet size in bytes at which a tablet flushes to a DiskRowSet (None: storage default).
    pub flush_threshold_bytes: Option<usize>,
    /// Unflushed data all tablets together may hold before writers wait (None: 2 GiB).
    pub memory_limit_bytes: Option<usize>,
    /// How far back `AS OF` reads may go (None: storage default, 15 minutes).
    pub history_max_age: Option<std::time::Duration>,
}

/// An open Nyala database: catalog, tablets and the SQL engine over them.
pub struct Database {
    client: Client,
}

impl Database {
    /// Opens (creating if needed) the database stored in `data_dir`, replaying logs as needed.
    pub async fn open(data_dir: &Path, options: DatabaseOptions) -> Result<Arc<Database>> {
        let mut tablet_options = TabletOptions::default();
        if let Some(bytes) = options.flush_threshold_bytes {
            tablet_options.flush_threshold_bytes = bytes;
        }
        if let Some(age) = options.history_max_age {
            tablet_options.history_max_age = age;
        }
        let dir = data_dir.to_path_buf();
        let memory_limit = options
            .memory_limit_bytes
            .unwrap_or(nyala_engine::tserver::DEFAULT_MEMORY_LIMIT);
        let client = tokio::task::spawn_blocking(move || {
            nyala_engine::embedded::open(&dir, tablet_options, memory_limit)
        })
        .await
        .map_err(|e| SqlError::Invalid(format!("opening the database failed: {e}")))??;
        Ok(Arc::new(Database { client }))
    }

    /// The database of `client` (a master's, whose catalog is in process and whose tablets
    /// are on the cluster's tablet servers).
    pub fn with_client(client: Client) -> Arc<Database> {
        Arc::new(Database { client })
    }

    /// A new SQL session over this database.
    pub fn session(self: &Arc<Self>) -> Session {
        let config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG_NAME, SCHEMA_NAME)
            .with_create_default_catalog_and_schema(false)
            .with_information_schema(true)
            // Tablets are the unit of scan parallelism: a scan-only plan keeps one partition per
            // tablet, so Flight SQL can hand each tablet to a separate reader.
            .with_round_robin_repartition(false)
            .with_option_extension(runtime_filter::NyalaOptions::default());
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(runtime_filter::RuntimeFilterRule::default()))
            .with_query_planner(Arc::new(dml::NyalaQueryPlanner))
            .build();
        let ctx = SessionContext::new_with_state(state);
        let catalog = MemoryCatalogProvider::new();
        // Registering a schema into a fresh in-memory catalog cannot fail.
        let _ = catalog.register_schema(
            SCHEMA_NAME,
            Arc::new(catalog::NyalaSchemaProvider::new(self.client.clone())),
        );
        let _ = catalog.register_schema(
            catalog::SysSchemaProvider::NAME,
            Arc::new(catalog::SysSchemaProvider::new(self.client.clone())),
        );
        ctx.register_catalog(CATALOG_NAME, Arc::new(catalog));
        ctx.register_udtf(
            as_of::FUNCTION,
            Arc::new(as_of::AsOfFunction {
                client: self.client.clone(),
            }),
        );
        Session {
            db: self.clone(),
            ctx,
        }
    }

    /// Names and Arrow schemas of all user tables, sorted by name.
    pub fn tables(&self) -> Vec<(String, SchemaRef)> {
        self.client
            .tables()
            .iter()
            .map(|t| (t.name.clone(), t.schema.arrow_schema()))
            .collect()
    }

    /// Primary-key column names of `table`, in key order.
    pub fn primary_key(&self, table: &str) -> Option<Vec<String>> {
        let table = self.client.table(table).ok()?;
        Some(
            table
                .schema
                .key_columns()
                .iter()
                .map(|&i| table.schema.columns()[i].name.clone())
                .collect(),
        )
    }

    /// The engine client under the SQL layer.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A coordinator of the cluster whose masters listen at `masters` (a tablet server serving
    /// Flight SQL): catalog from the masters, DDL through the leading one.
    pub async fn connect_cluster(masters: Vec<String>) -> Result<Arc<Database>> {
        let client = Client::connect_cluster(masters).await?;
        Ok(Arc::new(Database { client }))
    }

    /// Flushes and stops every tablet; the database must not be used afterwards.
    pub async fn shutdown(&self) -> Result<()> {
        let client = self.client.clone();
        tokio::task::spawn_blocking(move || client.shutdown())
            .await
            .map_err(|e| SqlError::Invalid(format!("shutdown failed: {e}")))??;
        Ok(())
    }
}

/// A SQL session: DataFusion session state plus access to the database.
#[derive(Clone)]
pub struct Session {
    db: Arc<Database>,
    ctx: SessionContext,
}

/// One statement, parsed and planned, not yet run.
pub struct PlannedStatement {
    kind: StatementKind,
    session: Session,
    action: Action,
}

enum Action {
    CreateTable(CreateTableSpec),
    DropTable {
        name: String,
        if_exists: bool,
    },
    RenameTable {
        name: String,
        new_name: String,
    },
    AlterRangePartition {
        name: String,
        add: bool,
        range: RangeSpec,
    },
    AlterColumns {
        name: String,
        changes: Vec<statement::ColumnAlteration>,
    },
    /// A result computed at planning time (SHOW TABLES, DESCRIBE).
    Rows(RecordBatch),
    /// CREATE TABLE ... AS SELECT: the table, then the INSERT of the query's rows.
    CreateTableAs {
        spec: CreateTableSpec,
        insert: String,
    },
    /// `SET name = value`, applied to the session when run.
    Setting(LogicalPlan),
    Plan(Arc<dyn ExecutionPlan>),
}

impl PlannedStatement {
    pub fn kind(&self) -> StatementKind {
        self.kind
    }

    /// Schema of the result stream: `count: UInt64` for DML, no columns for DDL and SET.
    pub fn schema(&self) -> SchemaRef {
        match &self.action {
            Action::CreateTable(_)
            | Action::DropTable { .. }
            | Action::RenameTable { .. }
            | Action::AlterRangePartition { .. }
            | Action::AlterColumns { .. }
            | Action::Setting(_) => empty_schema(),
            Action::CreateTableAs { .. } => count_schema(),
            Action::Rows(batch) => batch.schema(),
            Action::Plan(plan) => plan.schema(),
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
        match &self.action {
            Action::Plan(plan) if self.kind == StatementKind::Query && scan_only(plan) => {
                Some(partitions(plan))
            }
            _ => None,
        }
    }

    /// The snapshot this statement would read at if run now (None if it reads no table). Pass
    /// it to [`Self::execute_partition`] so separately fetched partitions agree.
    pub fn snapshot(&self) -> Result<Option<u64>> {
        match &self.action {
            Action::Plan(plan) => Ok(scan::statement_snapshot(plan)?.map(|t| t.0)),
            _ => Ok(None),
        }
    }

    /// Runs partition `partition` of a query for which [`Self::tablet_partitions`] is `Some(n)`
    /// with `partition < n`, at `snapshot` (from [`Self::snapshot`]; None: a fresh one).
    pub fn execute_partition(
        &self,
        partition: usize,
        snapshot: Option<u64>,
    ) -> Result<SendableRecordBatchStream> {
        match (&self.action, self.tablet_partitions()) {
            (Action::Plan(plan), Some(n)) if partition < n => {
                let plan = match snapshot {
                    Some(ts) => scan::with_snapshot(plan.clone(), Timestamp(ts))?,
                    None => scan::pin_snapshot(plan.clone())?,
                };
                Ok(plan.execute(partition, self.session.ctx.task_ctx())?)
            }
            _ => Err(SqlError::Invalid(format!(
                "partition {partition} does not exist for this statement (its tables changed since it was planned?)"
            ))),
        }
    }

    /// Runs a query (a statement of kind [`StatementKind::Query`]); it can run several times.
    pub fn execute_query(&self) -> Result<SendableRecordBatchStream> {
        match (&self.action, self.kind) {
            (Action::Plan(plan), StatementKind::Query) => {
                let plan = scan::pin_snapshot(plan.clone())?;
                Ok(execute_stream(plan, self.session.ctx.task_ctx())?)
            }
            (Action::Rows(batch), _) => one_stream(vec![batch.clone()]),
            _ => Err(SqlError::Invalid(
                "this statement is not a query: run it as an update".into(),
            )),
        }
    }

    /// Runs the statement; DDL and DML are applied when this returns, queries stream.
    pub async fn execute(self) -> Result<SendableRecordBatchStream> {
        if self.kind == StatementKind::Query {
            return self.execute_query();
        }
        let client = &self.session.db.client;
        let batch = match self.action {
            Action::CreateTable(spec) => {
                create_table(client, spec).await?;
                return no_rows();
            }
            Action::CreateTableAs { spec, insert } => {
                let name = spec.name.clone();
                if !create_table(client, spec).await? {
                    // IF NOT EXISTS and the table exists: nothing is inserted.
                    return one_stream(vec![count_batch(0)]);
                }
                let inserted = async {
                    match self.session.plan(&insert).await?.action {
                        Action::Plan(plan) => Ok(collect(plan, self.session.ctx.task_ctx()).await?),
                        _ => Err(SqlError::Invalid(format!("cannot run {insert}"))),
                    }
                }
                .await;
                match inserted {
                    Ok(batches) => return one_stream(batches),
                    Err(e) => {
                        // A failed CREATE TABLE ... AS SELECT leaves no table behind.
                        client.drop_table(&name, true).await?;
                        return Err(e);
                    }
                }
            }
            Action::DropTable { name, if_exists } => {
                client.drop_table(&name, if_exists).await?;
                return no_rows();
            }
            Action::RenameTable { name, new_name } => {
                client.rename_table(&name, &new_name).await?;
                return no_rows();
            }
            Action::AlterColumns { name, changes } => {
                let schema = client.table(&name)?.schema.clone();
                let changes: Vec<ColumnChange> = changes
                    .into_iter()
                    .filter(|c| {
                        let skip = match &c.change {
                            ColumnChange::Add(column) => {
                                schema.column_index(&column.name).is_some()
                            }
                            ColumnChange::Drop(column) => schema.column_index(column).is_none(),
                            ColumnChange::Rename { .. } => false,
                        };
                        !(c.if_exists && skip)
                    })
                    .map(|c| c.change)
                    .collect();
                if !changes.is_empty() {
                    client.alter_columns(&name, &changes).await?;
                }
                return no_rows();
            }
            Action::AlterRangePartition { name, add, range } => {
                match add {
                    true => client.add_range_partition(&name, &range).await?,
                    false => client.drop_range_partition(&name, &range).await?,
                }
                return no_rows();
            }
            Action::Rows(batch) => batch,
            Action::Setting(plan) => {
                self.session.ctx.execute_logical_plan(plan).await?;
                return no_rows();
            }
            Action::Plan(plan) => {
                let plan = scan::pin_snapshot(plan)?;
                let task = self.session.ctx.task_ctx();
                // DML is applied entirely before the statement returns.
                let batches = collect(plan, task).await?;
                return one_stream(batches);
            }
        };
        one_stream(vec![batch])
    }
}

/// Creates the table of `spec`; false if it existed and IF NOT EXISTS was given.
async fn create_table(client: &Client, spec: CreateTableSpec) -> Result<bool> {
    Ok(client
        .create_table(
            &spec.name,
            spec.schema,
            spec.partition,
            spec.if_not_exists,
            spec.replicas,
        )
        .await?)
}

fn partitions(plan: &Arc<dyn ExecutionPlan>) -> usize {
    plan.properties().output_partitioning().partition_count()
}

fn statement_kind(plan: &LogicalPlan) -> Result<StatementKind> {
    match plan {
        LogicalPlan::Dml(_) => Ok(StatementKind::Dml),
        LogicalPlan::Statement(Statement::SetVariable(_)) => Ok(StatementKind::Ddl),
        LogicalPlan::Ddl(_) | LogicalPlan::Copy(_) | LogicalPlan::Statement(_) => Err(
            SqlError::NotSupported(format!("{} statements", plan.display())),
        ),
        _ => Ok(StatementKind::Query),
    }
}

/// The types of a plan's positional parameters `$1..$n` (None where nothing implies one).
fn parameter_types(plan: &LogicalPlan) -> Result<Vec<Option<DataType>>> {
    let types = plan.get_parameter_types()?;
    let mut numbered = Vec::with_capacity(types.len());
    for i in 1..=types.len() {
        match types.get(&format!("${i}")) {
            Some(t) => numbered.push(t.clone()),
            None => {
                return Err(SqlError::Invalid(format!(
                    "parameters must be numbered $1 to ${} without gaps (or all be '?')",
                    types.len()
                )))
            }
        }
    }
    Ok(numbered)
}

/// Replaces the plan's placeholders by `params`, cast to the types the statement implies.
fn bind(plan: LogicalPlan, params: &[ScalarValue]) -> Result<LogicalPlan> {
    let types = parameter_types(&plan)?;
    if types.len() != params.len() {
        return Err(SqlError::Invalid(format!(
            "the statement has {} parameter(s) but {} value(s) were bound",
            types.len(),
            params.len()
        )));
    }
    if types.is_empty() {
        return Ok(plan);
    }
    let values = params
        .iter()
        .zip(&types)
        .enumerate()
        .map(|(i, (value, expected))| match expected {
            Some(t) if value.data_type() != *t => value.cast_to(t).map_err(|_| {
                SqlError::Invalid(format!(
                    "parameter ${} = {value} cannot be used as {t}",
                    i + 1
                ))
            }),
            _ => Ok(value.clone()),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(plan.with_param_values(values)?)
}

fn count_schema() -> SchemaRef {
    Arc::new(ArrowSchema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]))
}

fn count_batch(count: u64) -> RecordBatch {
    RecordBatch::try_new(
        count_schema(),
        vec![Arc::new(UInt64Array::from(vec![count])) as ArrayRef],
    )
    .unwrap_or_else(|_| RecordBatch::new_empty(count_schema()))
}

/// The schema of a result without columns (DDL and SET).
fn empty_schema() -> SchemaRef {
    Arc::new(ArrowSchema::empty())
}

/// The result of DDL and SET: no columns, no rows.
fn no_rows() -> Result<SendableRecordBatchStream> {
    Ok(Box::pin(MemoryStream::try_new(
        vec![],
        empty_schema(),
        None,
    )?))
}

fn one_stream(batches: Vec<RecordBatch>) -> Result<SendableRecordBatchStream> {
    let schema = batches
        .first()
        .map(|b| b.schema())
        .unwrap_or_else(count_schema);
    Ok(Box::pin(MemoryStream::try_new(batches, schema, None)?))
}

fn string_batch(columns: Vec<(&str, Vec<String>)>) -> Result<RecordBatch> {
    let schema = Arc::new(ArrowSchema::new(
        columns
            .iter()
            .map(|(name, _)| Field::new(*name, DataType::Utf8, false))
            .collect::<Vec<_>>(),
    ));
    let arrays = columns
        .into_iter()
        .map(|(_, values)| Arc::new(StringArray::from(values)) as ArrayRef)
        .collect();
    Ok(RecordBatch::try_new(schema, arrays)?)
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
        let draft = self.draft(statement::parse(sql)?).await?;
        self.plan_draft(draft, params).await
    }

    /// A parsed statement as a logical plan still to be bound, or planned completely where it
    /// has none (Nyala's DDL and SHOW statements).
    async fn draft(&self, statement: NyalaStatement) -> Result<Draft> {
        let planned = |kind, action| {
            Ok(Draft::Planned(PlannedStatement {
                kind,
                session: self.clone(),
                action,
            }))
        };
        match statement {
            NyalaStatement::CreateTable(spec) => {
                planned(StatementKind::Ddl, Action::CreateTable(spec))
            }
            NyalaStatement::CreateTableAs(ctas) => {
                planned(StatementKind::Dml, self.plan_create_table_as(ctas).await?)
            }
            NyalaStatement::RenameTable { name, new_name } => {
                planned(StatementKind::Ddl, Action::RenameTable { name, new_name })
            }
            NyalaStatement::AlterColumns { name, changes } => {
                planned(StatementKind::Ddl, Action::AlterColumns { name, changes })
            }
            NyalaStatement::AlterRangePartition { name, add, range } => planned(
                StatementKind::Ddl,
                Action::AlterRangePartition { name, add, range },
            ),
            NyalaStatement::DropTable { name, if_exists } => {
                planned(StatementKind::Ddl, Action::DropTable { name, if_exists })
            }
            NyalaStatement::ShowTables => {
                let names = self
                    .db
                    .client
                    .tables()
                    .iter()
                    .map(|t| t.name.clone())
                    .collect();
                planned(
                    StatementKind::Query,
                    Action::Rows(string_batch(vec![("table_name", names)])?),
                )
            }
            NyalaStatement::Describe { name } => {
                planned(StatementKind::Query, Action::Rows(self.describe(&name)?))
            }
            NyalaStatement::ShowPartitions { name } => planned(
                StatementKind::Query,
                Action::Rows(self.show_partitions(&name)?),
            ),
            NyalaStatement::ShowCreateTable { name } => {
                planned(StatementKind::Query, Action::Rows(self.show_create(&name)?))
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
                if let Some(batch) = self.show_nyala_setting(&statement)? {
                    return planned(StatementKind::Query, Action::Rows(batch));
                }
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

    /// Binds `params` to a logical plan's placeholders and plans it physically.
    async fn plan_logical(
        &self,
        kind: StatementKind,
        plan: LogicalPlan,
        params: &[ScalarValue],
    ) -> Result<PlannedStatement> {
        let action = if let LogicalPlan::Statement(statement) = &plan {
            runtime_filter::check_setting(statement)?;
            Action::Setting(bind(plan, params)?)
        } else {
            let plan = dml::plan_mutations(bind(plan, params)?)?;
            Action::Plan(self.ctx.state().create_physical_plan(&plan).await?)
        };
        Ok(PlannedStatement {
            kind,
            session: self.clone(),
            action,
        })
    }

    /// `UPDATE t SET ... FROM s [WHERE ...]` as DataFusion plans an UPDATE: a projection of
    /// every column of `t`, kept or assigned, over `t` joined with `s` and filtered by WHERE.
    async fn plan_update_from(&self, update: Update) -> Result<LogicalPlan> {
        if update.returning.is_some() || update.limit.is_some() || !update.order_by.is_empty() {
            return Err(SqlError::NotSupported(
                "RETURNING, ORDER BY or LIMIT in UPDATE".into(),
            ));
        }
        let TableFactor::Table {
            name: table_name,
            alias,
            ..
        } = &update.table.relation
        else {
            return Err(SqlError::Invalid("UPDATE needs a table to update".into()));
        };
        let name = statement::object_name(table_name)?;
        let table = self.db.client.table(&name)?;
        let qualifier = match alias {
            Some(alias) => alias.name.clone(),
            None => Ident::with_quote('"', &name),
        };
        let mut assigned = std::collections::HashMap::new();
        for assignment in &update.assignments {
            let AssignmentTarget::ColumnName(target) = &assignment.target else {
                return Err(SqlError::NotSupported("tuple assignment in UPDATE".into()));
            };
            let column = target
                .0
                .last()
                .and_then(|part| part.as_ident())
                .map(statement::normalize_ident)
                .unwrap_or_default();
            if table.schema.column_index(&column).is_none() {
                return Err(SqlError::Invalid(format!(
                    "table '{name}' has no column '{column}'"
                )));
            }
            if assigned.insert(column.clone(), &assignment.value).is_some() {
                return Err(SqlError::Invalid(format!(
                    "column '{column}' is assigned twice"
                )));
            }
        }
        let columns: Vec<String> = table
            .schema
            .columns()
            .iter()
            .map(|c| {
                let column = Ident::with_quote('"', &c.name);
                match assigned.get(&c.name) {
                    Some(value) => format!("{value} AS {column}"),
                    None => format!("{qualifier}.{column} AS {column}"),
                }
            })
            .collect();
        let from = match &update.from {
            Some(UpdateTableFromKind::BeforeSet(from) | UpdateTableFromKind::AfterSet(from)) => {
                from.iter().map(ToString::to_string).collect::<Vec<_>>()
            }
            None => vec![],
        };
        let mut sql = format!(
            "SELECT {} FROM {}",
            columns.join(", "),
            std::iter::once(update.table.to_string())
                .chain(from)
                .collect::<Vec<_>>()
                .join(", ")
        );
        if let Some(selection) = &update.selection {
            sql.push_str(&format!(" WHERE {selection}"));
        }
        let NyalaStatement::DataFusion(query) = statement::parse(&sql)? else {
            return Err(SqlError::Invalid(format!("cannot plan {update}")));
        };
        let input = self.logical_plan(query).await?;
        let target = provider_as_source(self.ctx.table_provider(name.as_str()).await?);
        Ok(LogicalPlan::Dml(DmlStatement::new(
            TableReference::bare(name),
            target,
            WriteOp::Update,
            Arc::new(input),
        )))
    }

    /// DataFusion's plan of `statement`.
    async fn logical_plan(&self, mut statement: Box<DFSqlStatement>) -> Result<LogicalPlan> {
        self.name_assigned_columns(&mut statement);
        Ok(self
            .ctx
            .state()
            .statement_to_plan(DFStatement::Statement(statement))
            .await?)
    }

    /// An INSERT without a column list into a table with a NON UNIQUE PRIMARY KEY lists the
    /// table's columns except auto_incrementing_id, which the database assigns.
    fn name_assigned_columns(&self, statement: &mut DFSqlStatement) {
        let insert = match statement {
            DFSqlStatement::Explain { statement, .. } => match statement.as_mut() {
                DFSqlStatement::Insert(insert) => insert,
                _ => return,
            },
            DFSqlStatement::Insert(insert) => insert,
            _ => return,
        };
        if !insert.columns.is_empty() {
            return;
        }
        let TableObject::TableName(name) = insert.table.clone() else {
            return;
        };
        let Some(table) = statement::object_name(&name)
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

    fn describe(&self, name: &str) -> Result<RecordBatch> {
        let table = self.db.client.table(name)?;
        let columns = table.schema.columns();
        let yes_no = |b: bool| if b { "YES" } else { "NO" }.to_string();
        string_batch(vec![
            (
                "column_name",
                columns.iter().map(|c| c.name.clone()).collect(),
            ),
            (
                "data_type",
                columns
                    .iter()
                    .map(|c| c.column_type.sql_name().to_string())
                    .collect(),
            ),
            (
                "nullable",
                columns.iter().map(|c| yes_no(c.nullable)).collect(),
            ),
            (
                "primary_key",
                (0..columns.len())
                    .map(|i| yes_no(table.schema.is_key_column(i)))
                    .collect(),
            ),
            (
                "default",
                columns
                    .iter()
                    .map(|c| c.default.clone().unwrap_or_default())
                    .collect(),
            ),
            (
                "comment",
                columns
                    .iter()
                    .map(|c| c.comment.clone().unwrap_or_default())
                    .collect(),
            ),
            (
                "encoding",
                columns.iter().map(|c| c.encoding.name().into()).collect(),
            ),
            (
                "compression",
                columns
                    .iter()
                    .map(|c| c.compression.name().into())
                    .collect(),
            ),
        ])
    }

    /// The table of a CREATE TABLE ... AS SELECT takes the query's column names, types and
    /// nullability; the key columns are NOT NULL.
    async fn plan_create_table_as(&self, ctas: statement::CreateTableAsSpec) -> Result<Action> {
        let query = ctas.query.to_string();
        let plan = self.logical_plan(ctas.query).await?;
        let mut spec = CreateTableSpec::from_arrow(
            &ctas.name,
            plan.schema().fields(),
            "the query",
            statement::Nullability::FromFields,
            &ctas.key,
            &ctas.partition,
        )?;
        spec.if_not_exists = ctas.if_not_exists;
        spec.replicas = ctas.replicas;
        Ok(Action::CreateTableAs {
            insert: format!("INSERT INTO \"{}\" {query}", ctas.name.replace('"', "\"\"")),
            spec,
        })
    }

    /// `SHOW PARTITIONS`: the table's rows of `sys.partitions`, without the table name.
    fn show_partitions(&self, name: &str) -> Result<RecordBatch> {
        let table = self.db.client.table(name)?;
        let batch = catalog::partitions(&self.db.client, &[table])?;
        let columns: Vec<usize> = (1..batch.num_columns()).collect();
        Ok(batch.project(&columns)?)
    }

    /// `SHOW CREATE TABLE`: a CREATE TABLE statement that recreates the table's schema and
    /// partitioning.
    fn show_create(&self, name: &str) -> Result<RecordBatch> {
        let table = self.db.client.table(name)?;
        let schema = &table.schema;
        let names = |columns: &[usize]| schema.column_list(columns);
        let mut lines: Vec<String> = schema
            .columns()
            .iter()
            .enumerate()
            .filter(|(i, _)| schema.auto_increment_column() != Some(*i))
            .map(|(i, c)| {
                let null = if schema.is_key_column(i) {
                    ""
                } else if c.nullable {
                    " NULL"
                } else {
                    " NOT NULL"
                };
                let quote = |t: &str| format!("'{}'", t.replace('\'', "''"));
                let default = match (&c.default, c.column_type) {
                    (None, _) => String::new(),
                    (Some(v), ColumnType::Bool) => format!(" DEFAULT {v}"),
                    (Some(v), t) if t.arrow_type().is_numeric() => format!(" DEFAULT {v}"),
                    (Some(v), _) => format!(" DEFAULT {}", quote(v)),
                };
                let comment = c
                    .comment
                    .as_ref()
                    .map_or(String::new(), |t| format!(" COMMENT {}", quote(t)));
                let mut storage = String::new();
                if c.encoding != ColumnEncoding::Auto {
                    storage.push_str(&format!(" ENCODING {}", c.encoding.name()));
                }
                if c.compression != ColumnCompression::Default {
                    storage.push_str(&format!(" COMPRESSION {}", c.compression.name()));
                }
                format!(
                    "  {} {}{null}{default}{comment}{storage}",
                    c.name,
                    c.column_type.sql_name()
                )
            })
            .collect();
        let unique = match schema.auto_increment_column() {
            Some(_) => "NON UNIQUE ",
            None => "",
        };
        lines.push(format!(
            "  {unique}PRIMARY KEY ({})",
            names(schema.declared_key_columns())
        ));
        let mut sql = format!("CREATE TABLE {} (\n{}\n)", table.name, lines.join(",\n"));
        if let Some(clause) = partitioning::render(schema, &table.partition) {
            sql.push(' ');
            sql.push_str(&clause);
        }
        string_batch(vec![
            ("table_name", vec![table.name.clone()]),
            ("create_statement", vec![sql]),
        ])
    }

    /// Plans and executes exactly one statement.
    pub async fn execute(&self, sql: &str) -> Result<SendableRecordBatchStream> {
        self.plan(sql).await?.execute().await
    }

    /// Splits a script into its statements (quote- and comment-aware).
    pub fn split_statements(sql: &str) -> Result<Vec<String>> {
        statement::split_statements(sql)
    }

    /// The session's settings (`SET` names) and their current values.
    pub fn settings(&self) -> Vec<(String, Option<String>)> {
        use datafusion::common::config::{ConfigExtension, ExtensionOptions};
        let state = self.ctx.state();
        let options = state.config_options();
        // Extensions list their entries without their prefix.
        let nyala = options
            .extensions
            .get::<runtime_filter::NyalaOptions>()
            .map(|o| o.entries())
            .unwrap_or_default()
            .into_iter()
            .map(|entry| {
                let prefix = runtime_filter::NyalaOptions::PREFIX;
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

    /// `SHOW nyala.<setting>` (DataFusion's SHOW knows only its own settings), as DataFusion
    /// answers SHOW: columns `name` and `value`. None for any other statement.
    fn show_nyala_setting(&self, statement: &DFSqlStatement) -> Result<Option<RecordBatch>> {
        let DFSqlStatement::ShowVariable { variable } = statement else {
            return Ok(None);
        };
        let name = variable
            .iter()
            .map(statement::normalize_ident)
            .collect::<Vec<_>>()
            .join(".");
        if !name.starts_with("nyala.") {
            return Ok(None);
        }
        let value = self
            .settings()
            .into_iter()
            .find(|(known, _)| *known == name)
            .ok_or_else(|| SqlError::Invalid(format!("unknown setting '{name}'")))?
            .1
            .unwrap_or_default();
        Ok(Some(string_batch(vec![
            ("name", vec![name]),
            ("value", vec![value]),
        ])?))
    }

    /// `SET name = value`: refused with an error for an unknown name or a bad value.
    pub async fn set(&self, name: &str, value: &str) -> Result<()> {
        let name = name.to_ascii_lowercase();
        if !self.settings().iter().any(|(known, _)| *known == name) {
            return Err(SqlError::Invalid(format!("unknown setting '{name}'")));
        }
        let statement = Statement::SetVariable(datafusion::logical_expr::SetVariable {
            variable: name,
            value: value.to_string(),
        });
        runtime_filter::check_setting(&statement)?;
        self.ctx
            .execute_logical_plan(LogicalPlan::Statement(statement))
            .await?;
        Ok(())
    }

    /// The DataFusion context, for metadata queries (catalogs, schemas, tables).
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }
}
