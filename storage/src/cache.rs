//! A cache of decoded pages of rowsets, shared by the tablets of a server (Kudu's block cache,
//! for the pages that key lookups read: pages of keys, and the data pages that hold the rows
//! found): the least recently used pages are evicted beyond its capacity in bytes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, ArrayRef};
use parking_lot::Mutex;

/// A page: (the id of its rowset's key index or of a file, the page number; for data pages
/// the column's position in the file and the page number, see [`data_page`]).
pub(crate) type PageId = (u64, u32);

/// The [`PageId`] of data page `page` (counted over the file's row groups) of the column at
/// `position` of file `file`; None beyond the numbers it has room for.
pub(crate) fn data_page(file: u64, position: usize, page: usize) -> Option<PageId> {
    let (position, page) = (u32::try_from(position).ok()?, u32::try_from(page).ok()?);
    (position < 1 << 12 && page < 1 << 20).then_some((file, position << 20 | page))
}

pub struct PageCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Each page with the tick of its last use.
    pages: HashMap<PageId, (ArrayRef, u64)>,
    /// Pages by last use, oldest first.
    by_use: BTreeMap<u64, PageId>,
    tick: u64,
    bytes: usize,
}

/// Ids for [`PageId`]: one per rowset key index and per file opened in the process.
static NEXT_INDEX_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn next_index_id() -> u64 {
    NEXT_INDEX_ID.fetch_add(1, Ordering::Relaxed)
}

impl PageCache {
    pub fn new(capacity_bytes: usize) -> Self {
        PageCache {
            capacity: capacity_bytes,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Bytes of the pages held.
    pub fn bytes(&self) -> usize {
        self.inner.lock().bytes
    }

    pub(crate) fn get(&self, id: PageId) -> Option<ArrayRef> {
        let mut inner = self.inner.lock();
        inner.tick += 1;
        let tick = inner.tick;
        let (page, used) = inner.pages.get_mut(&id)?;
        let (page, previous) = (page.clone(), std::mem::replace(used, tick));
        inner.by_use.remove(&previous);
        inner.by_use.insert(tick, id);
        Some(page)
    }

    pub(crate) fn insert(&self, id: PageId, page: ArrayRef) {
        let size = page.get_array_memory_size();
        if size > self.capacity {
            return;
        }
        let mut inner = self.inner.lock();
        if inner.pages.contains_key(&id) {
            return;
        }
        inner.tick += 1;
        let tick = inner.tick;
        inner.pages.insert(id, (page, tick));
        inner.by_use.insert(tick, id);
        inner.bytes += size;
        while inner.bytes > self.capacity {
            let Some((_, oldest)) = inner.by_use.pop_first() else {
                break;
            };
            if let Some((page, _)) = inner.pages.remove(&oldest) {
                inner.bytes -= page.get_array_memory_size();
            }
        }
    }
}

impl std::fmt::Debug for PageCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PageCache({} of {} bytes)", self.bytes(), self.capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn evicts_the_least_recently_used_pages_beyond_its_capacity() {
        let page = |n: usize| -> ArrayRef {
            Arc::new(arrow::array::BinaryArray::from_iter_values(
                (0..n).map(|i| i.to_be_bytes()),
            ))
        };
        let size = page(100).get_array_memory_size();
        let cache = PageCache::new(size * 3);
        for p in 0..3 {
            cache.insert((1, p), page(100));
        }
        assert!(cache.get((1, 0)).is_some());
        cache.insert((1, 3), page(100));
        assert!(
            cache.get((1, 1)).is_none(),
            "the least recently used page went"
        );
        assert!(cache.get((1, 0)).is_some() && cache.get((1, 3)).is_some());
        assert!(cache.bytes() <= size * 3);
        cache.insert((2, 0), page(100_000));
        assert!(
            cache.get((2, 0)).is_none(),
            "a page larger than the cache is not kept"
        );
    }
}
