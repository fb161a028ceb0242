//! [`ProbeSlicesExec`]: a nested-loop join's probe input in slices small enough that the join
//! evaluates its filter over a bounded number of row pairs between two polls, yielding to the
//! runtime every [`YIELD_EVERY`] (see [`crate::limits`]).

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{Stream, StreamExt};

/// How long a sliced probe input lets its consumer compute before it yields to the runtime.
const YIELD_EVERY: Duration = Duration::from_millis(10);

/// The probe input of a nested-loop join in slices of `rows` rows, yielding to the runtime
/// when [`YIELD_EVERY`] has passed since it last did (see [`crate::limits`]).
#[derive(Debug)]
pub(crate) struct ProbeSlicesExec {
    input: Arc<dyn ExecutionPlan>,
    rows: usize,
}

impl ProbeSlicesExec {
    /// `input` in slices of `rows` rows.
    pub(crate) fn new(input: Arc<dyn ExecutionPlan>, rows: usize) -> Self {
        Self { input, rows }
    }

    /// The rows of a slice.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }
}

impl DisplayAs for ProbeSlicesExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "ProbeSlicesExec: rows={}", self.rows)
    }
}

impl ExecutionPlan for ProbeSlicesExec {
    fn name(&self) -> &str {
        "ProbeSlicesExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("ProbeSlicesExec needs an input".into()))?;
        Ok(Arc::new(Self {
            input,
            rows: self.rows,
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Ok(Box::pin(Slices {
            input: self.input.execute(partition, context)?,
            rows: self.rows,
            current: None,
            yielded: std::time::Instant::now(),
        }))
    }
}

/// The stream of a [`ProbeSlicesExec`].
struct Slices {
    input: SendableRecordBatchStream,
    rows: usize,
    /// The batch being sliced and the offset of its next slice.
    current: Option<(RecordBatch, usize)>,
    yielded: std::time::Instant,
}

impl Stream for Slices {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.yielded.elapsed() >= YIELD_EVERY {
            self.yielded = std::time::Instant::now();
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        loop {
            if let Some((batch, offset)) = self.current.take() {
                if offset < batch.num_rows() {
                    let len = self.rows.min(batch.num_rows() - offset);
                    let slice = batch.slice(offset, len);
                    self.current = Some((batch, offset + len));
                    return Poll::Ready(Some(Ok(slice)));
                }
            }
            match self.input.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(batch))) => self.current = Some((batch, 0)),
                other => return other,
            }
        }
    }
}

impl RecordBatchStream for Slices {
    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }
}
