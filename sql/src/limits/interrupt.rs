//! Stopping a statement that changes rows: [`Interrupt`] asks, the statement stops only where
//! stopping leaves nothing changed, and says why ([`Stop`]).

use std::sync::Arc;
use std::time::Duration;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use tokio::sync::watch;

use crate::limits::timeout::statement_timeout;

/// Why a statement that changes rows is asked to stop.
#[derive(Debug, Clone)]
pub enum Stop {
    /// Its `statement_timeout` (this long) passed.
    Timeout(Duration),
    /// It was cancelled, or its client went away: why.
    Cancelled(String),
}

impl Stop {
    /// The error the statement fails with when it stops for this reason.
    fn error(&self) -> DataFusionError {
        match self {
            Stop::Timeout(timeout) => statement_timeout(*timeout),
            Stop::Cancelled(why) => {
                DataFusionError::External(Box::new(crate::SqlError::Cancelled(why.clone())))
            }
        }
    }
}

/// A request to stop a statement that changes rows (DML, DDL, COMMIT). Unlike a query, such a
/// statement is never dropped in the middle: it stops where stopping leaves nothing changed
/// (while it reads the rows it is about to write, between restarts), and a write it has sent
/// finishes, or is rolled back, before it returns. So an error always means that the statement
/// changed nothing, and a statement that has written reports what it did even when it was
/// asked to stop meanwhile. Found by the statement's plan in its task context's configuration.
#[derive(Debug, Clone)]
pub struct Interrupt(Arc<watch::Sender<Option<Stop>>>);

impl Default for Interrupt {
    fn default() -> Self {
        Self(Arc::new(watch::channel(None).0))
    }
}

impl Interrupt {
    /// Asks the statement to stop (the first reason given is the one it reports).
    pub fn stop(&self, why: Stop) {
        self.0.send_if_modified(|stop| {
            let first = stop.is_none();
            stop.get_or_insert(why);
            first
        });
    }

    /// The statement's error if it has been asked to stop.
    pub(crate) fn check(&self) -> Result<()> {
        match &*self.0.borrow() {
            Some(stop) => Err(stop.error()),
            None => Ok(()),
        }
    }

    /// `work`, unless the statement is asked to stop first (then `work` is dropped): for work
    /// that writes nothing.
    pub(crate) async fn unless_stopped<T>(
        &self,
        work: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let mut stopped = self.0.subscribe();
        tokio::select! {
            biased;
            // (The sender lives as long as `self`: waiting fails never.)
            Ok(stop) = stopped.wait_for(Option::is_some) => {
                Err(stop.as_ref().map_or_else(statement_cancelled, Stop::error))
            }
            done = work => done,
        }
    }

    /// The interrupt of the statement running in `context` (one never used, if none).
    pub(crate) fn of(context: &TaskContext) -> Interrupt {
        (context.session_config().get_extension::<Interrupt>())
            .map_or_else(Interrupt::default, |i| i.as_ref().clone())
    }

    /// Stops the statement (as cancelled by its client going away) when the guard is dropped
    /// before [`StopOnDrop::disarm`].
    pub(crate) fn stop_on_drop(&self) -> StopOnDrop {
        StopOnDrop(Some(self.clone()))
    }
}

/// Runs `work` in a task of its own, to its end even if the caller goes away meanwhile.
pub(crate) async fn detached<T: Send + 'static>(
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> crate::Result<T> {
    match tokio::spawn(work).await {
        Ok(done) => Ok(done),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(crate::SqlError::Cancelled(
            "the server is shutting down".into(),
        )),
    }
}

fn statement_cancelled() -> DataFusionError {
    Stop::Cancelled("the statement was cancelled".into()).error()
}

/// See [`Interrupt::stop_on_drop`].
pub(crate) struct StopOnDrop(Option<Interrupt>);

impl StopOnDrop {
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(interrupt) = self.0.take() {
            interrupt.stop(Stop::Cancelled(
                "the client went away before the statement finished".into(),
            ));
        }
    }
}
