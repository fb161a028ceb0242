//! The `nyala.public` schema as DataFusion sees it: every table and view of the master's
//! catalog, looked up at planning time, so those created by other sessions are visible at once.
//! A view is its query's SQL text, planned with the reading statement's session each time. Next to it,
//! `nyala.sys` holds system tables computed at planning time: `sys.partitions`, one row per
//! tablet of every table (what `SHOW PARTITIONS t` shows for one table).

use std::sync::{Arc, Weak};

use arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use async_trait::async_trait;
use datafusion::catalog::{MemTable, SchemaProvider};
use datafusion::datasource::{TableProvider, ViewTable};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::DFParser;
use datafusion::sql::resolve::resolve_table_references;
use nyala_engine::{Client, TableHandle, TabletStats};
use parking_lot::RwLock;

use crate::catalog::table::NyalaTable;
use crate::session::access::{Authorizer, Principal};

pub struct NyalaSchemaProvider {
    client: Client,
    /// The session's user: only what it may see is listed.
    principal: Arc<Principal>,
    /// The session's state, to plan the queries of views with (weak: the state holds this
    /// provider).
    state: Weak<RwLock<SessionState>>,
}

impl std::fmt::Debug for NyalaSchemaProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NyalaSchemaProvider").finish()
    }
}

impl NyalaSchemaProvider {
    pub fn new(
        client: Client,
        state: Weak<RwLock<SessionState>>,
        principal: Arc<Principal>,
    ) -> Self {
        Self {
            client,
            state,
            principal,
        }
    }
}

#[async_trait]
impl SchemaProvider for NyalaSchemaProvider {
    /// Tables, then views: those the session's user may see.
    fn table_names(&self) -> Vec<String> {
        let tables = self.client.tables().into_iter().map(|t| t.name.clone());
        let views = self.client.views().into_iter().map(|v| v.name.clone());
        visible(&self.client, &self.principal, tables.chain(views))
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>, DataFusionError> {
        if let Ok(table) = self.client.table(name) {
            return Ok(Some(Arc::new(NyalaTable::new(self.client.clone(), table))));
        }
        let Some(view) = self.client.view(name) else {
            return Ok(None);
        };
        let state = (self.state.upgrade())
            .ok_or_else(|| DataFusionError::Plan("the session has ended".into()))?;
        let state = state.read().clone();
        let plan = view_plan(&state, &view.sql)
            .await
            .map_err(|e| DataFusionError::Plan(format!("view '{name}' cannot be read: {e}")))?;
        Ok(Some(Arc::new(ViewTable::new(plan, Some(view.sql.clone())))))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.client.table(name).is_ok() || self.client.view(name).is_some()
    }
}

/// The logical plan of a view's query, as every statement that reads the view plans it.
pub(crate) async fn view_plan(state: &SessionState, sql: &str) -> Result<LogicalPlan> {
    state.create_logical_plan(sql).await
}

/// Whether the query `sql` reads the view `name`, directly or through the views it reads (the
/// views in the catalog read no view in a cycle, so this ends).
pub(crate) fn reads_view(client: &Client, sql: &str, name: &str) -> Result<bool> {
    for statement in DFParser::parse_sql(sql)? {
        let (tables, _ctes) = resolve_table_references(&statement, true)?;
        for table in tables {
            if table.table() == name {
                return Ok(true);
            }
            if let Some(view) = client.view(table.table()) {
                if reads_view(client, &view.sql, name)? {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

/// The names among `names` that `principal` may see.
pub(crate) fn visible(
    client: &Client,
    principal: &Principal,
    names: impl Iterator<Item = String>,
) -> Vec<String> {
    let authorizer = Authorizer { client };
    let user = principal.name();
    names
        .filter(|name| authorizer.sees(user.as_deref(), name))
        .collect()
}

/// The `nyala.sys` schema.
#[derive(Debug)]
pub struct SysSchemaProvider {
    client: Client,
    principal: Arc<Principal>,
}

impl SysSchemaProvider {
    pub const NAME: &'static str = "sys";

    pub fn new(client: Client, principal: Arc<Principal>) -> Self {
        Self { client, principal }
    }
}

#[async_trait]
impl SchemaProvider for SysSchemaProvider {
    fn table_names(&self) -> Vec<String> {
        vec!["partitions".into()]
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>, DataFusionError> {
        if name != "partitions" {
            return Ok(None);
        }
        let mut tables = self.client.tables();
        let seen = visible(
            &self.client,
            &self.principal,
            tables.iter().map(|t| t.name.clone()),
        );
        tables.retain(|t| seen.contains(&t.name));
        let batch = partitions(&self.client, &tables)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(Some(Arc::new(MemTable::try_new(
            batch.schema(),
            vec![vec![batch]],
        )?)))
    }

    fn table_exist(&self, name: &str) -> bool {
        name == "partitions"
    }
}

/// One row per tablet of `tables`: the table, the tablet's position, hash buckets and range, its
/// id, leader, replicas, about how many rows it holds, its bytes on disk and its unflushed bytes
/// in memory.
pub fn partitions(client: &Client, tables: &[TableHandle]) -> Result<RecordBatch, crate::SqlError> {
    let mut table_names = Vec::new();
    let mut tablets = Vec::new();
    let mut hash = Vec::new();
    let mut range = Vec::new();
    let mut stats = Vec::new();
    for table in tables {
        for (t, stat) in client.tablet_stats(table)?.into_iter().enumerate() {
            let (h, r) = table.partition.describe(&table.schema, t);
            table_names.push(table.name.clone());
            tablets.push(t as u64);
            hash.push(h);
            range.push(r);
            stats.push(stat);
        }
    }
    let count = |f: &dyn Fn(&TabletStats) -> u64| -> ArrayRef {
        Arc::new(UInt64Array::from_iter_values(stats.iter().map(f)))
    };
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("table_name", Arc::new(StringArray::from(table_names))),
        ("tablet", Arc::new(UInt64Array::from(tablets))),
        ("hash_buckets", Arc::new(StringArray::from(hash))),
        ("range", Arc::new(StringArray::from(range))),
        (
            "tablet_id",
            Arc::new(StringArray::from_iter_values(
                stats.iter().map(|s| s.id.as_str()),
            )),
        ),
        (
            "leader",
            Arc::new(StringArray::from_iter_values(
                stats.iter().map(|s| s.leader.as_str()),
            )),
        ),
        ("replicas", count(&|s| s.replicas as u64)),
        ("estimated_rows", count(&|s| s.estimated_rows as u64)),
        ("disk_bytes", count(&|s| s.disk_bytes)),
        ("memory_bytes", count(&|s| s.memory_bytes as u64)),
        ("rowsets", count(&|s| s.rowsets as u64)),
        ("delta_files", count(&|s| s.delta_files as u64)),
        ("column_files", count(&|s| s.column_files as u64)),
        ("compactions", count(&|s| s.compactions)),
    ];
    Ok(RecordBatch::try_from_iter(columns)?)
}
