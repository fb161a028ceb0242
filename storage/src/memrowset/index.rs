//! The MemRowSet's ordered index: encoded keys to values.
//!
//! Most tables take a `BTreeMap`. A queue table's new rows come in runs of neighbouring keys
//! instead: a batch of one queue's new positions, all at the end of that queue's range. Its
//! index is [`Runs`]: sorted leaves of up to [`LEAF_KEYS`] keys under a `BTreeMap` of each
//! leaf's lower bound, which remembers the leaf the last insert went to. An insert whose key
//! falls within that leaf's bounds goes straight to it (a comparison with each bound and one
//! with the leaf's last key) instead of searching from the root of a tree of every key; only
//! the first key of a run searches the map of bounds, which holds one key per leaf. Keys in random
//! order pay for the extra level (about a quarter more per insert than a `BTreeMap`,
//! `storage_bench`), hence the choice: by table, and for other tables by how their keys come
//! (a `BTreeMap` that finds its first keys coming in order becomes [`Runs`],
//! [`KeyIndex::into_runs`]; see `MemRowSet::push`). A `BTreeMap` searches from its root for
//! every key, also for the next key of a sorted load, which goes after all the others: a
//! tenth of a bulk load's CPU.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::scan::KeyRange;
use crate::KeyBytes;

/// Most keys a leaf holds. An insert into a full leaf splits it at the insert's place.
const LEAF_KEYS: usize = 64;

const NO_LEAF: u32 = u32::MAX;

#[derive(Clone)]
struct Leaf<V> {
    /// Every key of the leaf is at or above this bound and below the next leaf's.
    lower: KeyBytes,
    /// The leaf after this one in key order.
    next: u32,
    entries: Vec<(KeyBytes, V)>,
}

#[derive(Clone)]
pub enum KeyIndex<V> {
    Tree(BTreeMap<KeyBytes, V>),
    Runs(Runs<V>),
}

impl<V> KeyIndex<V> {
    /// An empty index for rows that come in runs of neighbouring keys (`runs`) or in any order.
    pub fn new(runs: bool) -> Self {
        match runs {
            true => KeyIndex::Runs(Runs::default()),
            false => KeyIndex::Tree(BTreeMap::new()),
        }
    }

    /// Whether `key` comes after every key held (true when none is).
    pub fn after_last(&self, key: &[u8]) -> bool {
        match self {
            KeyIndex::Tree(t) => t.last_key_value().is_none_or(|(last, _)| &last[..] < key),
            KeyIndex::Runs(r) => r.after_last(key),
        }
    }

    /// The same entries in a [`Runs`] index.
    pub fn into_runs(self) -> Self
    where
        V: Default + 'static,
    {
        match self {
            KeyIndex::Tree(t) => {
                let mut runs = Runs::default();
                for (key, value) in t {
                    // In key order: each goes at the end of the leaf of the one before.
                    *runs.get_or_default(key) = value;
                }
                KeyIndex::Runs(runs)
            }
            runs => runs,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            KeyIndex::Tree(t) => t.len(),
            KeyIndex::Runs(r) => r.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, key: &[u8]) -> Option<&V> {
        match self {
            // A key after the last one (the next key of a sorted load) is missing, found with
            // one comparison instead of a search (its insert then searches once, not twice).
            KeyIndex::Tree(_) if self.after_last(key) => None,
            KeyIndex::Tree(t) => t.get(key),
            KeyIndex::Runs(r) => r.get(key),
        }
    }

    pub fn contains_key(&self, key: &[u8]) -> bool {
        self.get(key).is_some()
    }

    /// The value of `key`, inserted as `V::default()` if the key is new.
    pub fn get_or_default(&mut self, key: KeyBytes) -> &mut V
    where
        V: Default,
    {
        match self {
            KeyIndex::Tree(t) => t.entry(key).or_default(),
            KeyIndex::Runs(r) => r.get_or_default(key),
        }
    }

    /// Removes `key`; returns its value.
    pub fn remove(&mut self, key: &[u8]) -> Option<V> {
        match self {
            KeyIndex::Tree(t) => t.remove(key),
            KeyIndex::Runs(r) => r.remove(key),
        }
    }

    /// Entries in key order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (&KeyBytes, &V)> + '_> {
        static ALL: KeyRange = KeyRange {
            lower: Vec::new(),
            upper: None,
        };
        self.range(&ALL)
    }

    /// Entries in `range`, in key order.
    pub fn range<'a>(
        &'a self,
        range: &'a KeyRange,
    ) -> Box<dyn Iterator<Item = (&'a KeyBytes, &'a V)> + 'a> {
        let (lower, upper) = (&range.lower[..], range.upper.as_deref());
        if upper.is_some_and(|upper| upper <= lower) {
            return Box::new(std::iter::empty());
        }
        match self {
            KeyIndex::Tree(t) => {
                let end = upper.map_or(Bound::Unbounded, Bound::Excluded);
                Box::new(t.range::<[u8], _>((Bound::Included(lower), end)))
            }
            KeyIndex::Runs(r) => Box::new(r.range(lower, upper)),
        }
    }

    /// Entries in key order, taken.
    pub fn into_entries(self) -> Box<dyn Iterator<Item = (KeyBytes, V)>>
    where
        V: 'static,
    {
        match self {
            KeyIndex::Tree(t) => Box::new(t.into_iter()),
            KeyIndex::Runs(r) => Box::new(r.into_entries()),
        }
    }
}

/// The index of keys that come in runs (see the module's comment).
#[derive(Clone)]
pub struct Runs<V> {
    /// Each leaf's lower bound, to its place in `leaves`. The first leaf's bound is the empty
    /// key, below every other.
    bounds: BTreeMap<KeyBytes, u32>,
    leaves: Vec<Leaf<V>>,
    /// The leaf of the last insert.
    hint: u32,
    len: usize,
}

impl<V> Default for Runs<V> {
    fn default() -> Self {
        Runs {
            bounds: BTreeMap::new(),
            leaves: Vec::new(),
            hint: NO_LEAF,
            len: 0,
        }
    }
}

impl<V> Runs<V> {
    fn get(&self, key: &[u8]) -> Option<&V> {
        // Near the last insert, the leaf is known (a run's next key is looked up before it is
        // inserted).
        let id = match self.covers(self.hint as usize, key) {
            true => self.hint as usize,
            false => self.leaf_of(key)?,
        };
        let leaf = &self.leaves[id];
        let i = leaf.find(key).ok()?;
        Some(&leaf.entries[i].1)
    }

    fn after_last(&self, key: &[u8]) -> bool {
        // The last key held: in the last leaf that holds any (a leaf emptied by removals stays).
        let mut leaves = self.bounds.values().rev();
        let last = leaves.find_map(|&id| self.leaves[id as usize].entries.last());
        last.is_none_or(|(k, _)| &k[..] < key)
    }

    fn get_or_default(&mut self, key: KeyBytes) -> &mut V
    where
        V: Default,
    {
        if self.leaves.is_empty() {
            self.bounds.insert(KeyBytes::new(), 0);
            self.leaves.push(Leaf {
                lower: KeyBytes::new(),
                next: NO_LEAF,
                entries: Vec::with_capacity(LEAF_KEYS),
            });
            self.hint = 0;
        }
        let mut id = self.hint as usize;
        if !self.covers(id, &key) {
            id = self.leaf_of(&key).expect("the first leaf covers every key");
        }
        let i = match self.leaves[id].find(&key) {
            Ok(i) => {
                self.hint = id as u32;
                return &mut self.leaves[id].entries[i].1;
            }
            Err(i) => i,
        };
        self.len += 1;
        let (id, i) = match self.leaves[id].entries.len() < LEAF_KEYS {
            true => (id, i),
            false => self.split(id, i, &key),
        };
        self.hint = id as u32;
        let entries = &mut self.leaves[id].entries;
        entries.insert(i, (key, V::default()));
        &mut entries[i].1
    }

    /// (A leaf left empty stays, with its bounds.)
    fn remove(&mut self, key: &[u8]) -> Option<V> {
        let id = self.leaf_of(key)?;
        let i = self.leaves[id].find(key).ok()?;
        self.len -= 1;
        Some(self.leaves[id].entries.remove(i).1)
    }

    fn range<'a>(
        &'a self,
        lower: &'a [u8],
        upper: Option<&'a [u8]>,
    ) -> impl Iterator<Item = (&'a KeyBytes, &'a V)> + 'a {
        // The leaf holding `lower` and the first key there at or above it, then on along the
        // leaves' order.
        let mut at = self.leaf_of(lower).map(|id| {
            let entries = &self.leaves[id].entries;
            (id, entries.partition_point(|(k, _)| &k[..] < lower))
        });
        std::iter::from_fn(move || loop {
            let (id, i) = at?;
            let leaf = &self.leaves[id];
            match leaf.entries.get(i) {
                Some((k, _)) if upper.is_some_and(|upper| &k[..] >= upper) => at = None,
                Some((k, v)) => {
                    at = Some((id, i + 1));
                    return Some((k, v));
                }
                None if leaf.next == NO_LEAF => at = None,
                None => at = Some((leaf.next as usize, 0)),
            }
        })
    }

    fn into_entries(mut self) -> impl Iterator<Item = (KeyBytes, V)> {
        let order: Vec<u32> = self.bounds.values().copied().collect();
        order
            .into_iter()
            .flat_map(move |id| std::mem::take(&mut self.leaves[id as usize].entries))
    }

    /// The leaf whose bounds hold `key`.
    fn leaf_of(&self, key: &[u8]) -> Option<usize> {
        let range = (Bound::Unbounded, Bound::Included(key));
        let (_, &id) = self.bounds.range::<[u8], _>(range).next_back()?;
        Some(id as usize)
    }

    fn covers(&self, id: usize, key: &[u8]) -> bool {
        let Some(leaf) = self.leaves.get(id) else {
            return false;
        };
        let below_next = match leaf.next {
            NO_LEAF => true,
            next => key < &self.leaves[next as usize].lower[..],
        };
        below_next && key >= &leaf.lower[..]
    }

    /// Makes room in full leaf `id` for `key`, which goes at `i`; returns the leaf and place
    /// it goes to now. The keys from `i` on move to a new leaf, so `key` ends its leaf and the
    /// keys that follow it in a run go there too (a split in half would leave a queue's end
    /// and the next queue's start together, and split them again every half a leaf).
    fn split(&mut self, id: usize, i: usize, key: &KeyBytes) -> (usize, usize) {
        let new = self.leaves.len();
        let old = &mut self.leaves[id];
        let mut entries = Vec::with_capacity(LEAF_KEYS);
        let (lower, at) = match old.entries.get(i) {
            Some((first, _)) => {
                let lower = first.clone();
                entries.extend(old.entries.drain(i..));
                (lower, (id, i))
            }
            // Past the end: the key starts the next leaf.
            None => (key.clone(), (new, 0)),
        };
        let next = std::mem::replace(&mut old.next, new as u32);
        self.bounds.insert(lower.clone(), new as u32);
        self.leaves.push(Leaf {
            lower,
            next,
            entries,
        });
        at
    }
}

impl<V> Leaf<V> {
    fn find(&self, key: &[u8]) -> Result<usize, usize> {
        // Runs append: try the end first.
        match self.entries.last() {
            Some((last, _)) if &last[..] < key => Err(self.entries.len()),
            None => Err(0),
            _ => self.entries.binary_search_by(|(k, _)| k[..].cmp(key)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn key(bytes: &[u8]) -> KeyBytes {
        KeyBytes::from_slice(bytes)
    }

    /// Random inserts, appends in runs and removals against a `BTreeMap`, in both kinds (and
    /// a tree turned into runs halfway).
    #[test]
    fn matches_a_btreemap() {
        for seed in 0..40u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut index = KeyIndex::<Vec<u32>>::new(seed % 2 == 0);
            let mut model = BTreeMap::<Vec<u8>, Vec<u32>>::new();
            let mut queues = [0u32; 4];
            for step in 0..3000u32 {
                let k: Vec<u8> = match rng.random_range(0..10) {
                    // A queue's next position: the end of its range.
                    0..=4 => {
                        let q = rng.random_range(0..queues.len());
                        queues[q] += 1;
                        [&[q as u8][..], &queues[q].to_be_bytes()].concat()
                    }
                    5..=7 => (0..rng.random_range(0..4)).map(|_| rng.random()).collect(),
                    // An existing key (a new version) or a removal.
                    _ => match model.keys().nth(rng.random_range(0..model.len().max(1))) {
                        Some(k) => k.clone(),
                        None => continue,
                    },
                };
                let after_last = model.keys().next_back().is_none_or(|last| *last < k);
                assert_eq!(index.after_last(&k), after_last, "seed {seed}");
                if step == 1500 && seed % 4 == 1 {
                    // A tree that becomes runs halfway keeps its entries.
                    index = index.into_runs();
                    assert!(matches!(index, KeyIndex::Runs(_)));
                }
                if rng.random_range(0..8) == 0 {
                    assert_eq!(index.remove(&k), model.remove(&k), "seed {seed}");
                } else {
                    index.get_or_default(key(&k)).push(step);
                    model.entry(k.clone()).or_default().push(step);
                }
                assert_eq!(index.get(&k), model.get(&k));
                assert_eq!(index.len(), model.len());
                if step % 50 == 0 {
                    let lower: Vec<u8> =
                        (0..rng.random_range(0..3)).map(|_| rng.random()).collect();
                    let upper: Option<Vec<u8>> = match rng.random_range(0..3) {
                        0 => None,
                        _ => Some((0..rng.random_range(0..3)).map(|_| rng.random()).collect()),
                    };
                    let range = KeyRange {
                        lower: lower.clone(),
                        upper: upper.clone(),
                    };
                    let got: Vec<&[u8]> = (index.range(&range)).map(|(k, _)| &k[..]).collect();
                    let want: Vec<&[u8]> = (model.keys())
                        .filter(|k| k[..] >= lower[..] && upper.as_ref().is_none_or(|u| k < &u))
                        .map(|k| &k[..])
                        .collect();
                    assert_eq!(got, want, "seed {seed}: {lower:?}..{upper:?}");
                }
            }
            let got: Vec<(Vec<u8>, Vec<u32>)> =
                index.iter().map(|(k, v)| (k.to_vec(), v.clone())).collect();
            let want: Vec<(Vec<u8>, Vec<u32>)> = model.clone().into_iter().collect();
            assert_eq!(got, want, "seed {seed}");
            let taken: Vec<(Vec<u8>, Vec<u32>)> =
                index.into_entries().map(|(k, v)| (k.to_vec(), v)).collect();
            assert_eq!(taken, want, "seed {seed}");
        }
    }

    #[test]
    fn runs_fill_leaves() {
        let mut index = Runs::<u32>::default();
        // Batches of 100 new positions of three queues in turn.
        for batch in 0..30u32 {
            let q = (batch % 3) as u8;
            for p in (batch / 3) * 100..(batch / 3 + 1) * 100 {
                *index.get_or_default(key(&[&[q][..], &p.to_be_bytes()].concat())) = p;
            }
        }
        assert_eq!(index.len, 3000);
        // A queue's keys go at the end of a leaf: leaves stay nearly full.
        assert!(
            index.leaves.len() <= 3000 / LEAF_KEYS + 6,
            "{}",
            index.leaves.len()
        );
        let keys: Vec<_> = index.range(&[], None).map(|(k, _)| k.clone()).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
    }
}
