//! What a build side hands to the probe-side scans: one [`KeyFilter`] per join key, published
//! into a shared [`FilterSlot`] that each scan with a [`RuntimeFilter`] waits for before it
//! starts its tablet scan.

use std::fmt;
use std::sync::Arc;

use datafusion::common::ScalarValue;
use nyala_storage::{ColumnPredicate, JoinFilter, PredicateOp, Scalar};
use tokio::sync::watch;

/// The filter for one join key, built from the build side's values of that key.
#[derive(Debug)]
pub struct KeyFilter {
    /// No probe row can match: the build side has no key that matches anything.
    pub no_keys: bool,
    /// Bounds and bloom filter of the keys (None: nothing to filter with, e.g. NULL = NULL
    /// joins without a bloom filter).
    pub filter: Option<Arc<JoinFilter>>,
}

impl KeyFilter {
    /// The scan predicates on table column `column` that this filter implies.
    pub fn predicates(&self, column: usize) -> Vec<ColumnPredicate> {
        let op = if self.no_keys {
            PredicateOp::InList(vec![])
        } else if let Some(filter) = &self.filter {
            PredicateOp::join_filter(filter.clone())
        } else {
            return vec![];
        };
        vec![ColumnPredicate { column, op }]
    }

    fn describe(&self) -> String {
        if self.no_keys {
            return "no build keys".into();
        }
        let Some(filter) = &self.filter else {
            return "none".into();
        };
        let mut parts = Vec::new();
        if let Some((min, max)) = filter.bounds() {
            let value = |s: &Scalar| {
                ScalarValue::try_from_array(&s.0, 0)
                    .map_or_else(|e| e.to_string(), |v| v.to_string())
            };
            parts.push(format!("min={}, max={}", value(min), value(max)));
        }
        if filter.has_bloom() {
            parts.push(format!("bloom({} keys)", filter.num_keys()));
        }
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        let stats = &filter.stats;
        parts.push(format!(
            "checked={}, removed={}{}",
            load(&stats.checked),
            load(&stats.removed),
            if stats.disabled() {
                ", switched off"
            } else {
                ""
            }
        ));
        parts.join(", ")
    }
}

/// Where a build side publishes its key filters for the probe-side scans.
pub struct FilterSlot {
    id: usize,
    filters: watch::Sender<Option<Arc<Vec<KeyFilter>>>>,
}

impl fmt::Debug for FilterSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FilterSlot({})", self.id)
    }
}

impl FilterSlot {
    pub(crate) fn new(id: usize) -> Arc<Self> {
        Arc::new(FilterSlot {
            id,
            filters: watch::channel(None).0,
        })
    }

    /// The published filters, waiting for them if the build side is still running.
    pub async fn wait(&self) -> Arc<Vec<KeyFilter>> {
        let mut rx = self.filters.subscribe();
        let published = rx.wait_for(Option::is_some).await;
        // The sender lives in `self`, so waiting can only end with a value.
        match published {
            Ok(filters) => filters.clone().unwrap_or_default(),
            Err(_) => Arc::default(),
        }
    }

    /// The slot's number, which EXPLAIN shows with the build side and with each scan.
    pub(crate) fn id(&self) -> usize {
        self.id
    }

    /// Hands `filters` to the scans waiting for them.
    pub(crate) fn publish(&self, filters: Vec<KeyFilter>) {
        self.filters.send_replace(Some(Arc::new(filters)));
    }

    /// Takes the filters back, for a run of the plan again: its scans wait for that run's.
    pub(crate) fn reset(&self) {
        self.filters.send_replace(None);
    }

    /// A one-line account of the filters for EXPLAIN (ANALYZE).
    pub fn describe(&self, key: usize) -> String {
        match self.filters.borrow().as_ref().and_then(|f| f.get(key)) {
            Some(filter) => format!("#{}: {}", self.id, filter.describe()),
            None => format!("#{}: pending", self.id),
        }
    }
}

/// A runtime filter as a probe-side scan sees it: which key of which slot, on which column.
#[derive(Debug, Clone)]
pub struct RuntimeFilter {
    pub slot: Arc<FilterSlot>,
    pub key: usize,
    /// The table column the key is compared with.
    pub column: usize,
}
