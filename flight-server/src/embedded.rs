//! The shell's connection to an embedded database (`nyala sql` without `--connect`).

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use futures::stream::BoxStream;
use futures::TryStreamExt;
use nyala_shell::Connection;
use nyala_sql::{Database, IngestMode, IngestTarget, Session, SqlError};

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
        let batches = planned
            .execute()
            .await?
            .try_collect()
            .await
            .map_err(|e| anyhow::anyhow!(e.strip_backtrace()))?;
        Ok((schema, batches))
    }

    async fn ingest(
        &self,
        table: &str,
        schema: SchemaRef,
        batches: BoxStream<'static, anyhow::Result<RecordBatch>>,
    ) -> anyhow::Result<u64> {
        let target = IngestTarget {
            table: table.to_string(),
            mode: IngestMode::Append,
            primary_key: vec![],
            buckets: 1,
        };
        let batches = batches.map_err(|e| SqlError::Invalid(format!("{e:#}")));
        Ok(self.session.ingest(&target, schema, batches).await?)
    }
}
