//! [`QueryMemoryPool`]: the memory of one query, a budget of its own inside the pool all
//! running queries share, so one query's sort cannot take what the others need.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryLimit, MemoryPool, MemoryReservation};

/// The memory of one query: at most `limit` bytes of its own, taken from the server's pool.
#[derive(Debug)]
pub(crate) struct QueryMemoryPool {
    limit: usize,
    server_limit: usize,
    used: AtomicUsize,
    server: Arc<dyn MemoryPool>,
}

impl QueryMemoryPool {
    /// A pool of `limit` bytes inside `server`, the pool of all queries (of `server_limit`
    /// bytes).
    pub(crate) fn new(limit: usize, server_limit: usize, server: Arc<dyn MemoryPool>) -> Self {
        Self {
            limit,
            server_limit,
            used: AtomicUsize::new(0),
            server,
        }
    }
}

impl fmt::Display for QueryMemoryPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "query pool ({} of {} bytes)",
            self.reserved(),
            self.limit
        )
    }
}

impl MemoryPool for QueryMemoryPool {
    fn name(&self) -> &str {
        "query"
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.used.fetch_add(additional, Ordering::Relaxed);
        self.server.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.used.fetch_sub(shrink, Ordering::Relaxed);
        self.server.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(additional).filter(|&n| n <= self.limit)
            })
            .map_err(|_| {
                DataFusionError::ResourcesExhausted(format!(
                    "the query exceeded its memory limit of {} MiB ({} wanted {} more bytes)",
                    self.limit >> 20,
                    reservation.consumer().name(),
                    additional
                ))
            })?;
        self.server.try_grow(reservation, additional).map_err(|_| {
            self.used.fetch_sub(additional, Ordering::Relaxed);
            DataFusionError::ResourcesExhausted(format!(
                "the running queries together exceeded the server's query memory of {} MiB; \
                 retry when fewer run",
                self.server_limit >> 20
            ))
        })
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit)
    }
}
