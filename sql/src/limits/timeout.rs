//! A query's statement timeout: its result stream ends with an error at the deadline, and
//! dropping the plan's stream cancels the work.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

/// `stream`, ended with an error at `deadline` (a statement timeout of `timeout`), holding
/// `permit` (its turn to run) until it ends or is dropped.
pub(crate) fn limited(
    stream: SendableRecordBatchStream,
    deadline: Option<(Instant, Duration)>,
    permit: Option<OwnedSemaphorePermit>,
) -> SendableRecordBatchStream {
    Box::pin(Limited {
        schema: stream.schema(),
        stream: Some(stream),
        deadline: deadline.map(|(at, timeout)| (Box::pin(tokio::time::sleep_until(at)), timeout)),
        _permit: permit,
    })
}

struct Limited {
    schema: SchemaRef,
    /// None once ended (by the deadline).
    stream: Option<SendableRecordBatchStream>,
    deadline: Option<(Pin<Box<Sleep>>, Duration)>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Stream for Limited {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.stream.is_none() {
            return Poll::Ready(None);
        }
        // The deadline first: polling the plan spends the task's tokio budget, after which
        // the timer would not say it has elapsed.
        if let Some((sleep, timeout)) = self.deadline.as_mut() {
            if sleep.poll_unpin(cx).is_ready() {
                let timeout = *timeout;
                // Dropping the plan's stream cancels its work.
                self.stream = None;
                return Poll::Ready(Some(Err(statement_timeout(timeout))));
            }
        }
        match self.stream.as_mut() {
            Some(stream) => stream.poll_next_unpin(cx),
            None => Poll::Ready(None),
        }
    }
}

impl RecordBatchStream for Limited {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// The error of a statement cancelled by its timeout.
pub(crate) fn statement_timeout(timeout: Duration) -> DataFusionError {
    DataFusionError::ResourcesExhausted(format!(
        "canceling statement due to statement timeout ({} ms; SET statement_timeout to change it)",
        timeout.as_millis()
    ))
}
