//! [`StagedRows`]: rows one step of a statement computed for the steps after it (a MERGE's
//! source rows joined with its target once, read by each action's step). The steps are
//! planned together, before any runs, so the table hands its rows out when a step's plan
//! runs, not when it is planned.

use std::fmt;
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::{Field, Schema as ArrowSchema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::TableType;
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};

/// Rows kept in memory by one step of a statement for the steps after it.
#[derive(Debug)]
pub(crate) struct StagedRows {
    schema: SchemaRef,
    batches: Arc<Mutex<Vec<RecordBatch>>>,
}

impl StagedRows {
    /// Rows with the columns of `schema`, all of them nullable.
    pub(crate) fn new(schema: &ArrowSchema) -> Arc<Self> {
        let fields: Vec<Field> = (schema.fields().iter())
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        Arc::new(StagedRows {
            schema: Arc::new(ArrowSchema::new(fields)),
            batches: Arc::default(),
        })
    }

    /// Replaces the rows by `batches`, which have the table's columns.
    pub(crate) fn set(&self, batches: Vec<RecordBatch>) -> Result<()> {
        let batches = (batches.into_iter())
            .map(|b| RecordBatch::try_new(self.schema.clone(), b.columns().to_vec()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        *self.batches.lock().unwrap_or_else(|e| e.into_inner()) = batches;
        Ok(())
    }
}

#[async_trait]
impl TableProvider for StagedRows {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = match projection {
            Some(columns) => Arc::new(self.schema.project(columns)?),
            None => self.schema.clone(),
        };
        Ok(Arc::new(StagedRowsExec {
            properties: Arc::new(PlanProperties::new(
                EquivalenceProperties::new(schema),
                Partitioning::UnknownPartitioning(1),
                EmissionType::Incremental,
                Boundedness::Bounded,
            )),
            schema: self.schema.clone(),
            batches: self.batches.clone(),
            projection: projection.cloned(),
        }))
    }
}

/// Reads [`StagedRows`]' rows as they are when it runs.
#[derive(Debug)]
pub(crate) struct StagedRowsExec {
    /// The table's schema (before the projection).
    schema: SchemaRef,
    batches: Arc<Mutex<Vec<RecordBatch>>>,
    projection: Option<Vec<usize>>,
    properties: Arc<PlanProperties>,
}

impl DisplayAs for StagedRowsExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "StagedRowsExec")
    }
}

impl ExecutionPlan for StagedRowsExec {
    fn name(&self) -> &str {
        "StagedRowsExec"
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
        _: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let batches = self
            .batches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Ok(Box::pin(MemoryStream::try_new(
            batches,
            self.schema.clone(),
            self.projection.clone(),
        )?))
    }
}
