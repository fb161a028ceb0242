//! The shell's connection to an embedded database (`nyala sql` without `--connect`).

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use futures::TryStreamExt;
use nyala_shell::Connection;
use nyala_sql::{Database, Session};

pub struct EmbeddedConnection {
    db: Arc<Database>,
    session: Session,
}

impl EmbeddedConnection {
    pub fn new(db: Arc<Database>) -> Self {
        let session = db.session();
        Self { db, session }
    }

    pub async fn close(self) -> anyhow::Result<()> {
        self.db.shutdown().await?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Connection for EmbeddedConnection {
    async fn execute(&self, sql: &str) -> anyhow::Result<(SchemaRef, Vec<RecordBatch>)> {
        let planned = self.session.plan(sql).await?;
        let schema = planned.schema();
        let batches = planned.execute().await?.try_collect().await.map_err(|e| anyhow::anyhow!(e.strip_backtrace()))?;
        Ok((schema, batches))
    }
}
