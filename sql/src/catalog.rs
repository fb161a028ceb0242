//! The `nyala.public` schema as DataFusion sees it: every table of the master's catalog, looked
//! up at planning time, so tables created by other sessions are visible at once.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::SchemaProvider;
use datafusion::datasource::TableProvider;
use datafusion::error::{DataFusionError, Result};
use nyala_engine::Client;

use crate::table::NyalaTable;

#[derive(Debug)]
pub struct NyalaSchemaProvider {
    client: Client,
}

impl NyalaSchemaProvider {
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

#[async_trait]
impl SchemaProvider for NyalaSchemaProvider {
    fn table_names(&self) -> Vec<String> {
        self.client
            .tables()
            .iter()
            .map(|t| t.name.clone())
            .collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>, DataFusionError> {
        Ok(self.client.table(name).ok().map(|table| {
            Arc::new(NyalaTable::new(self.client.clone(), table)) as Arc<dyn TableProvider>
        }))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.client.table(name).is_ok()
    }
}
