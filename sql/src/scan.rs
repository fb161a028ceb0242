//! `NyalaScanExec`: the physical scan of a Nyala table, one DataFusion partition per tablet.
//!
//! Each partition runs its tablet scan (projection, predicates and limit pushed into storage) on
//! a blocking thread and hands the Arrow batches over a small bounded channel, so a slow consumer
//! holds back the scan instead of letting batches pile up in memory.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use nyala_engine::{Client, TableHandle};
use nyala_storage::ScanSpec;

/// Batches buffered per partition between the storage thread and DataFusion.
const CHANNEL_DEPTH: usize = 2;

#[derive(Debug)]
pub struct NyalaScanExec {
    client: Client,
    table: TableHandle,
    spec: ScanSpec,
    /// The pushed filters as SQL text, for EXPLAIN.
    pushed: Vec<String>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl NyalaScanExec {
    pub fn try_new(
        client: Client,
        table: TableHandle,
        spec: ScanSpec,
        pushed: Vec<String>,
    ) -> Result<Self> {
        let full = table.schema.arrow_schema();
        let schema = match &spec.projection {
            Some(p) => Arc::new(full.project(p)?),
            None => full,
        };
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(table.tablets.len()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self {
            client,
            table,
            spec,
            pushed,
            schema,
            properties,
        })
    }
}

impl DisplayAs for NyalaScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let columns: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        write!(
            f,
            "NyalaScanExec: table={}, tablets={}, projection=[{}]",
            self.table.name,
            self.table.tablets.len(),
            columns.join(", ")
        )?;
        if !self.pushed.is_empty() {
            write!(f, ", predicates=[{}]", self.pushed.join(" AND "))?;
        }
        if let Some(limit) = self.spec.limit {
            write!(f, ", limit={limit}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for NyalaScanExec {
    fn name(&self) -> &str {
        "NyalaScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "NyalaScanExec has no children".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let scan = self
            .client
            .scan_tablet(&self.table, partition, self.spec.clone(), None)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL_DEPTH);
        tokio::task::spawn_blocking(move || {
            for batch in scan {
                let batch = batch.map_err(|e| DataFusionError::External(Box::new(e)));
                let failed = batch.is_err();
                // The receiver is gone when the query was cancelled or finished early (LIMIT).
                if tx.blocking_send(batch).is_err() || failed {
                    break;
                }
            }
        });
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}
