//! Which DiskRowSets a key lookup must consult: an interval tree over each rowset's key range
//! [first key, last key] (Kudu's RowSetTree), so a lookup visits only the rowsets whose range
//! covers the key, in O(log n + k) for n rowsets and k answers, before their bloom filters.
//!
//! Ranges are sorted by first key; a segment tree over that order keeps the largest last key of
//! every segment, so a search descends only into segments that can still cover the key.

/// The key ranges of a tablet's rowsets; rebuilt whenever the set of rowsets changes.
#[derive(Default)]
pub struct RowSetTree {
    /// (first key, last key, rowset index), sorted by first key.
    ranges: Vec<(Vec<u8>, Vec<u8>, usize)>,
    /// Segment tree over `ranges`: the largest last key in each node's segment (node 1 is the
    /// root; node i has children 2i and 2i + 1).
    max_last: Vec<Vec<u8>>,
}

impl RowSetTree {
    /// A tree over `bounds`, the (first key, last key) of rowset 0, 1, ...
    pub fn new(bounds: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>) -> Self {
        let mut ranges: Vec<(Vec<u8>, Vec<u8>, usize)> = bounds
            .into_iter()
            .enumerate()
            .map(|(i, (first, last))| (first, last, i))
            .collect();
        ranges.sort();
        let mut tree = RowSetTree {
            max_last: vec![Vec::new(); 4 * ranges.len().max(1)],
            ranges,
        };
        if !tree.ranges.is_empty() {
            tree.build(1, 0, tree.ranges.len());
        }
        tree
    }

    fn build(&mut self, node: usize, lo: usize, hi: usize) -> Vec<u8> {
        let max = if hi - lo == 1 {
            self.ranges[lo].1.clone()
        } else {
            let mid = (lo + hi) / 2;
            let left = self.build(2 * node, lo, mid);
            let right = self.build(2 * node + 1, mid, hi);
            left.max(right)
        };
        self.max_last[node] = max.clone();
        max
    }

    /// The rowsets whose key range covers `key`, in no particular order.
    pub fn covering(&self, key: &[u8]) -> Vec<usize> {
        let mut out = Vec::new();
        // Only ranges starting at or before the key can cover it.
        let starts = self.ranges.partition_point(|r| r.0.as_slice() <= key);
        if starts > 0 {
            self.search(1, 0, self.ranges.len(), starts, key, &mut out);
        }
        out
    }

    fn search(
        &self,
        node: usize,
        lo: usize,
        hi: usize,
        starts: usize,
        key: &[u8],
        out: &mut Vec<usize>,
    ) {
        if lo >= starts || self.max_last[node].as_slice() < key {
            return;
        }
        if hi - lo == 1 {
            out.push(self.ranges[lo].2);
            return;
        }
        let mid = (lo + hi) / 2;
        self.search(2 * node, lo, mid, starts, key, out);
        self.search(2 * node + 1, mid, hi, starts, key, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_exactly_the_covering_ranges() {
        let key = |v: u32| v.to_be_bytes().to_vec();
        let mut state = 12345u64;
        let mut next = |n: u32| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) as u32) % n
        };
        for n in [0, 1, 2, 3, 7, 50] {
            let bounds: Vec<(u32, u32)> = (0..n)
                .map(|_| {
                    let a = next(1000);
                    (a, a + next(300))
                })
                .collect();
            let tree = RowSetTree::new(bounds.iter().map(|&(a, b)| (key(a), key(b))));
            for probe in 0..1400 {
                let mut got = tree.covering(&key(probe));
                got.sort_unstable();
                let want: Vec<usize> = (0..bounds.len())
                    .filter(|&i| bounds[i].0 <= probe && probe <= bounds[i].1)
                    .collect();
                assert_eq!(got, want, "n={n} probe={probe}");
            }
        }
    }
}
