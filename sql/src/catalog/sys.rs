//! The `nyala.sys` schema: system tables computed at planning time. `sys.partitions` has one
//! row per tablet of every table the session's user may see (what `SHOW PARTITIONS t` shows
//! for one table).

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use async_trait::async_trait;
use datafusion::catalog::{MemTable, SchemaProvider};
use datafusion::datasource::TableProvider;
use datafusion::error::{DataFusionError, Result};
use nyala_engine::{Client, TableHandle, TabletStats};

use crate::catalog::schema::visible;
use crate::session::access::Principal;

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
