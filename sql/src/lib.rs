//! Nyala's SQL layer: DataFusion with Nyala tables inside.
//!
//! A [`Database`] owns the engine (master catalog + tablet server) and hands out [`Session`]s.
//! A session takes one SQL statement at a time: our own DDL (`CREATE TABLE ... DISTRIBUTE BY`,
//! `DROP TABLE`, `SHOW TABLES`, `DESCRIBE`) is parsed with sqlparser and executed against the
//! catalog; everything else (queries, INSERT/UPSERT/UPDATE/DELETE, EXPLAIN) is planned and run by
//! DataFusion through the [`NyalaTable`](table::NyalaTable) provider, which turns scans into
//! tablet scans and DML into primary-key mutations.
//!
//! Every statement yields an Arrow stream: queries their rows, DML and DDL one row with a
//! `count` column (rows affected; 0 for DDL), so Flight SQL and the shell treat them alike.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema, SchemaRef};
use datafusion::catalog::{CatalogProvider, MemoryCatalogProvider};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::{collect, execute_stream, memory::MemoryStream, ExecutionPlan};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::Statement as DFStatement;
use nyala_engine::{Client, PartitionSchema};
use nyala_storage::TabletOptions;

mod catalog;
mod dml;
mod error;
mod predicate;
mod scan;
pub mod statement;
mod table;

pub use error::SqlError;

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

/// Options for opening an embedded database.
#[derive(Debug, Clone, Default)]
pub struct DatabaseOptions {
    /// MemRowSet size in bytes at which a tablet flushes to a DiskRowSet (None: storage default).
    pub flush_threshold_bytes: Option<usize>,
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
        let dir = data_dir.to_path_buf();
        let client = tokio::task::spawn_blocking(move || Client::open_embedded(&dir, tablet_options))
            .await
            .map_err(|e| SqlError::Invalid(format!("opening the database failed: {e}")))??;
        Ok(Arc::new(Database { client }))
    }

    /// A new SQL session over this database.
    pub fn session(self: &Arc<Self>) -> Session {
        let config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG_NAME, SCHEMA_NAME)
            .with_create_default_catalog_and_schema(false)
            .with_information_schema(true);
        let ctx = SessionContext::new_with_config(config);
        let catalog = MemoryCatalogProvider::new();
        // Registering a schema into a fresh in-memory catalog cannot fail.
        let _ = catalog.register_schema(
            SCHEMA_NAME,
            Arc::new(catalog::NyalaSchemaProvider::new(self.client.clone())),
        );
        ctx.register_catalog(CATALOG_NAME, Arc::new(catalog));
        Session { db: self.clone(), ctx }
    }

    /// Names and Arrow schemas of all user tables, sorted by name.
    pub fn tables(&self) -> Vec<(String, SchemaRef)> {
        self.client.tables().iter().map(|t| (t.name.clone(), t.schema.arrow_schema())).collect()
    }

    /// Primary-key column names of `table`, in key order.
    pub fn primary_key(&self, table: &str) -> Option<Vec<String>> {
        let table = self.client.table(table).ok()?;
        Some(table.schema.key_columns().iter().map(|&i| table.schema.columns()[i].name.clone()).collect())
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
    DropTable { name: String, if_exists: bool },
    /// A result computed at planning time (SHOW TABLES, DESCRIBE).
    Rows(RecordBatch),
    Plan(Arc<dyn ExecutionPlan>),
}

impl PlannedStatement {
    pub fn kind(&self) -> StatementKind {
        self.kind
    }

    /// Schema of the result stream (`count: UInt64` for DML and DDL).
    pub fn schema(&self) -> SchemaRef {
        match &self.action {
            Action::CreateTable(_) | Action::DropTable { .. } => count_schema(),
            Action::Rows(batch) => batch.schema(),
            Action::Plan(plan) => plan.schema(),
        }
    }

    /// Runs the statement; DDL and DML are applied when this returns, queries stream.
    pub async fn execute(self) -> Result<SendableRecordBatchStream> {
        let client = &self.session.db.client;
        let batch = match self.action {
            Action::CreateTable(spec) => {
                let partition = if spec.hash_columns.is_empty() {
                    PartitionSchema::single(&spec.schema)
                } else {
                    PartitionSchema::new(&spec.schema, spec.hash_columns, spec.buckets)?
                };
                client.create_table(&spec.name, spec.schema, partition, spec.if_not_exists).await?;
                count_batch(0)
            }
            Action::DropTable { name, if_exists } => {
                client.drop_table(&name, if_exists).await?;
                count_batch(0)
            }
            Action::Rows(batch) => batch,
            Action::Plan(plan) => {
                let task = self.session.ctx.task_ctx();
                if self.kind == StatementKind::Query {
                    return Ok(execute_stream(plan, task)?);
                }
                // DML is applied entirely before the statement returns.
                let batches = collect(plan, task).await?;
                return one_stream(batches);
            }
        };
        one_stream(vec![batch])
    }
}

fn count_schema() -> SchemaRef {
    Arc::new(ArrowSchema::new(vec![Field::new("count", DataType::UInt64, false)]))
}

fn count_batch(count: u64) -> RecordBatch {
    RecordBatch::try_new(count_schema(), vec![Arc::new(UInt64Array::from(vec![count])) as ArrayRef])
        .unwrap_or_else(|_| RecordBatch::new_empty(count_schema()))
}

fn one_stream(batches: Vec<RecordBatch>) -> Result<SendableRecordBatchStream> {
    let schema = batches.first().map(|b| b.schema()).unwrap_or_else(count_schema);
    Ok(Box::pin(MemoryStream::try_new(batches, schema, None)?))
}

fn string_batch(columns: Vec<(&str, Vec<String>)>) -> Result<RecordBatch> {
    let schema = Arc::new(ArrowSchema::new(
        columns.iter().map(|(name, _)| Field::new(*name, DataType::Utf8, false)).collect::<Vec<_>>(),
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
        let (kind, action) = match statement::parse(sql)? {
            NyalaStatement::CreateTable(spec) => (StatementKind::Ddl, Action::CreateTable(spec)),
            NyalaStatement::DropTable { name, if_exists } => {
                (StatementKind::Ddl, Action::DropTable { name, if_exists })
            }
            NyalaStatement::ShowTables => {
                let names = self.db.client.tables().iter().map(|t| t.name.clone()).collect();
                (StatementKind::Query, Action::Rows(string_batch(vec![("table_name", names)])?))
            }
            NyalaStatement::Describe { name } => {
                (StatementKind::Query, Action::Rows(self.describe(&name)?))
            }
            NyalaStatement::DataFusion(statement) => {
                let state = self.ctx.state();
                let plan = state.statement_to_plan(DFStatement::Statement(statement)).await?;
                let kind = match &plan {
                    LogicalPlan::Dml(_) => StatementKind::Dml,
                    LogicalPlan::Ddl(_) | LogicalPlan::Copy(_) | LogicalPlan::Statement(_) => {
                        return Err(SqlError::NotSupported(format!(
                            "{} statements",
                            plan.display()
                        )))
                    }
                    _ => StatementKind::Query,
                };
                let plan = state.create_physical_plan(&plan).await?;
                (kind, Action::Plan(plan))
            }
        };
        Ok(PlannedStatement { kind, session: self.clone(), action })
    }

    fn describe(&self, name: &str) -> Result<RecordBatch> {
        let table = self.db.client.table(name)?;
        let columns = table.schema.columns();
        let yes_no = |b: bool| if b { "YES" } else { "NO" }.to_string();
        string_batch(vec![
            ("column_name", columns.iter().map(|c| c.name.clone()).collect()),
            ("data_type", columns.iter().map(|c| c.column_type.sql_name().to_string()).collect()),
            ("nullable", columns.iter().map(|c| yes_no(c.nullable)).collect()),
            (
                "primary_key",
                (0..columns.len()).map(|i| yes_no(table.schema.is_key_column(i))).collect(),
            ),
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

    /// The DataFusion context, for metadata queries (catalogs, schemas, tables).
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }
}
