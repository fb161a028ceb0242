//! [`TailExec`]: the operator of the long polls, `tail(table, after_position, wait_ms)` (see
//! [`crate::functions::tail`]) and `changes(table, from, NULL, wait_ms)` (see
//! [`crate::functions::changes`]): it reads a queue's rows after a position, or a table's
//! changes after a time, sorted by position or commit time, and when there are none waits for
//! a commit in the tablets it reads, then reads again.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::compute::{concat_batches, sort_to_indices, take_record_batch};
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    collect, DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use nyala_engine::{Client, TableHandle};

use crate::exec::scan::{self, NyalaScanExec};

/// Reads a queue's new rows (or a table's changes), waiting for the first to arrive. Each
/// execution waits and reads anew: a plan can run again.
#[derive(Debug, Clone)]
pub(crate) struct TailExec {
    client: Client,
    table: TableHandle,
    scan: Arc<NyalaScanExec>,
    /// The column of the scan's output to sort by (the position, or the commit time).
    sort_by: usize,
    /// The columns of the scan's output that are the result's.
    output: Vec<usize>,
    /// The table function it runs (for EXPLAIN).
    function: &'static str,
    limit: Option<usize>,
    wait: Duration,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl TailExec {
    /// The tail of the rows `scan` reads (the column `sort_by` among them): at most `limit`
    /// of them, in the order of that column, with the columns `output`, waiting up to `wait`
    /// for the first; for the table function `function`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn try_new(
        client: Client,
        table: TableHandle,
        scan: NyalaScanExec,
        sort_by: usize,
        output: Vec<usize>,
        limit: Option<usize>,
        wait: Duration,
        function: &'static str,
    ) -> Result<Self> {
        let schema = Arc::new(scan.schema().project(&output)?);
        Ok(TailExec {
            client,
            table,
            scan: Arc::new(scan),
            sort_by,
            output,
            function,
            limit,
            wait,
            properties: Arc::new(PlanProperties::new(
                EquivalenceProperties::new(schema.clone()),
                Partitioning::UnknownPartitioning(1),
                EmissionType::Final,
                Boundedness::Bounded,
            )),
            schema,
        })
    }

    /// The scan of the queue table it runs (see [`crate::plan::reusable`]).
    pub(crate) fn scan(&self) -> &NyalaScanExec {
        &self.scan
    }

    /// The rows after the position, sorted, once some arrived or the wait is over.
    async fn rows(&self, context: Arc<TaskContext>) -> Result<RecordBatch> {
        let deadline = tokio::time::Instant::now() + self.wait;
        if let [_] = self.scan.tablets() {
            // One tablet (the WHERE names a queue): it waits for rows itself, and answers with
            // them as soon as a commit brings some.
            let plan = Arc::new((*self.scan).clone().waiting_until(deadline));
            let batches = collect(plan, context).await?;
            return self.sorted(concat_batches(&self.scan.schema(), &batches)?);
        }
        // Where the rows a wait heard of are visible (no round to the tablets for a snapshot).
        let mut woken_at = None;
        loop {
            let plan = match woken_at.take() {
                Some(snapshot) => scan::with_snapshot(self.scan.clone(), snapshot)?,
                None => scan::pin_snapshot(self.scan.clone()).await?,
            };
            let snapshot = (plan.downcast_ref::<NyalaScanExec>()).and_then(|s| s.snapshot());
            let batches = collect(plan, context.clone()).await?;
            let rows = concat_batches(&self.scan.schema(), &batches)?;
            let now = tokio::time::Instant::now();
            if rows.num_rows() > 0 || now >= deadline {
                return self.sorted(rows);
            }
            let Some(snapshot) = snapshot else {
                return self.sorted(rows);
            };
            // Nothing yet: wait for a commit in one of the tablets read, then read again.
            let tablets = self.scan.tablets().to_vec();
            woken_at =
                (self
                    .client
                    .wait_for_write(&self.table, &tablets, snapshot, deadline - now))
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
        }
    }

    /// `rows` in order, at most `limit` of them, with the columns asked for.
    fn sorted(&self, rows: RecordBatch) -> Result<RecordBatch> {
        let order = sort_to_indices(rows.column(self.sort_by), None, self.limit)?;
        let rows = take_record_batch(&rows, &order)?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows.num_rows()));
        let columns = self
            .output
            .iter()
            .map(|&c| rows.column(c).clone())
            .collect();
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &options,
        )?)
    }
}

impl DisplayAs for TailExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "TailExec: {}('{}') waiting up to {} ms",
            self.function,
            self.table.name,
            self.wait.as_millis()
        )
    }
}

impl ExecutionPlan for TailExec {
    fn name(&self) -> &str {
        "TailExec"
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
        match children.is_empty() {
            true => Ok(self),
            false => Err(DataFusionError::Internal("TailExec has no children".into())),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "TailExec has one partition, not {partition}"
            )));
        }
        let this = self.clone();
        let rows = futures::stream::once(async move { this.rows(context).await });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            rows,
        )))
    }
}
