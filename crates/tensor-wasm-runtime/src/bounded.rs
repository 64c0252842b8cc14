//! [`BoundedLru`]: a map capped by entry count and by bytes that evicts its least recently
//! used entries, for the runtime's caches (loaded modules, compiled artifacts on disk,
//! blueprint kernels), so that no sequence of requests can grow them without bound.
//!
//! A lookup ([`BoundedLru::get`]) takes `&self` and only stamps the entry with the clock
//! (atomic loads and at most one store), so a cache behind an `RwLock` is read under the shared lock on
//! the hot path; inserting and removing need the exclusive lock. Eviction scans for the
//! oldest stamp, linear in the number of entries, and only runs when an insert passes a
//! bound (after a compile or a load, which costs far more).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};

/// The two bounds of a [`BoundedLru`]; both hold after every insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheBounds {
    /// Most entries kept (0: nothing is kept).
    pub max_entries: usize,
    /// Most bytes kept, summed over the sizes given at insert. An entry larger than this
    /// on its own is not kept.
    pub max_bytes: u64,
}

impl CacheBounds {
    /// A bound on entries only.
    pub const fn entries(max_entries: usize) -> Self {
        CacheBounds {
            max_entries,
            max_bytes: u64::MAX,
        }
    }
}

#[derive(Debug)]
struct Slot<V> {
    value: V,
    bytes: u64,
    /// Clock value at the last insert or lookup.
    used: AtomicU64,
}

/// A map with at most [`CacheBounds::max_entries`] entries and
/// [`CacheBounds::max_bytes`] bytes, evicting least recently used entries first.
#[derive(Debug)]
pub struct BoundedLru<K, V> {
    bounds: CacheBounds,
    slots: HashMap<K, Slot<V>>,
    bytes: u64,
    clock: AtomicU64,
}

impl<K: Eq + Hash + Clone, V> BoundedLru<K, V> {
    /// An empty map with `bounds`.
    pub fn new(bounds: CacheBounds) -> Self {
        BoundedLru {
            bounds,
            slots: HashMap::new(),
            bytes: 0,
            clock: AtomicU64::new(0),
        }
    }

    /// The bounds this map keeps.
    pub fn bounds(&self) -> CacheBounds {
        self.bounds
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Bytes held (the sum of the sizes given at insert).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// The value of `key`, marking it most recently used.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.slots.get(key)?;
        // The clock only advances on insert, so a lookup is a load and, at most once
        // between two inserts, a store: no shared counter is contended on the hot path.
        // Entries used since the last insert tie; any of them may be evicted first.
        let now = self.clock.load(Ordering::Relaxed);
        if slot.used.load(Ordering::Relaxed) != now {
            slot.used.store(now, Ordering::Relaxed);
        }
        Some(&slot.value)
    }

    /// Whether `key` is held (without marking it used).
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.slots.contains_key(key)
    }

    /// Inserts `value` of size `bytes` under `key` (replacing what was there) as the most
    /// recently used entry, then evicts least recently used entries until both bounds
    /// hold, the new one too if it alone is above the byte bound. Returns the evicted
    /// entries (a replaced value is dropped, not returned).
    pub fn insert(&mut self, key: K, value: V, bytes: u64) -> Vec<(K, V)> {
        let used = AtomicU64::new(self.tick());
        if let Some(old) = self.slots.insert(key, Slot { value, bytes, used }) {
            self.bytes -= old.bytes;
        }
        self.bytes += bytes;
        let mut evicted = Vec::new();
        while self.slots.len() > self.bounds.max_entries || self.bytes > self.bounds.max_bytes {
            let Some(oldest) = self
                .slots
                .iter()
                .min_by_key(|(_, slot)| slot.used.load(Ordering::Relaxed))
                .map(|(key, _)| key.clone())
            else {
                break;
            };
            if let Some(value) = self.remove(&oldest) {
                evicted.push((oldest, value));
            }
        }
        evicted
    }

    /// Removes `key`, returning its value.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.slots.remove(key)?;
        self.bytes -= slot.bytes;
        Some(slot.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys<V>(evicted: &[(String, V)]) -> Vec<&str> {
        evicted.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn the_entry_bound_evicts_the_least_recently_used() {
        let mut lru = BoundedLru::new(CacheBounds::entries(3));
        for key in ["a", "b", "c"] {
            assert!(lru.insert(key.to_owned(), key.len(), 1).is_empty());
        }
        // `a` is used, so `b` is now the oldest.
        assert_eq!(lru.get("a"), Some(&1));
        let evicted = lru.insert("d".to_owned(), 1, 1);
        assert_eq!(keys(&evicted), ["b"]);
        assert_eq!(lru.len(), 3);
        assert!(lru.contains("a") && lru.contains("c") && lru.contains("d"));
        assert!(lru.get("b").is_none());
    }

    #[test]
    fn the_byte_bound_evicts_as_many_as_needed() {
        let mut lru = BoundedLru::new(CacheBounds {
            max_entries: 100,
            max_bytes: 10,
        });
        lru.insert("a".to_owned(), (), 4);
        lru.insert("b".to_owned(), (), 4);
        lru.insert("c".to_owned(), (), 2);
        assert_eq!(lru.bytes(), 10);
        let evicted = lru.insert("d".to_owned(), (), 7);
        assert_eq!(keys(&evicted), ["a", "b"]);
        assert_eq!(lru.bytes(), 9);
        assert_eq!(lru.len(), 2);
    }

    #[test]
    fn an_entry_above_the_byte_bound_is_not_kept() {
        let mut lru = BoundedLru::new(CacheBounds {
            max_entries: 100,
            max_bytes: 10,
        });
        lru.insert("small".to_owned(), (), 3);
        let evicted = lru.insert("huge".to_owned(), (), 11);
        assert_eq!(keys(&evicted), ["small", "huge"]);
        assert!(lru.is_empty());
        assert_eq!(lru.bytes(), 0);
    }

    #[test]
    fn replacing_and_removing_keep_the_byte_count() {
        let mut lru = BoundedLru::new(CacheBounds::entries(10));
        lru.insert("a".to_owned(), 1, 5);
        assert!(
            lru.insert("a".to_owned(), 2, 3).is_empty(),
            "a replace evicts nothing"
        );
        assert_eq!((lru.len(), lru.bytes()), (1, 3));
        assert_eq!(lru.get("a"), Some(&2));
        assert_eq!(lru.remove("a"), Some(2));
        assert_eq!(lru.remove("a"), None);
        assert_eq!((lru.len(), lru.bytes()), (0, 0));
    }

    #[test]
    fn a_zero_entry_bound_keeps_nothing() {
        let mut lru = BoundedLru::new(CacheBounds::entries(0));
        assert_eq!(keys(&lru.insert("a".to_owned(), (), 0)), ["a"]);
        assert!(lru.is_empty());
    }

    #[test]
    fn many_inserts_never_pass_either_bound() {
        let bounds = CacheBounds {
            max_entries: 16,
            max_bytes: 1000,
        };
        let mut lru = BoundedLru::new(bounds);
        let mut evictions = 0;
        for i in 0..2000u64 {
            evictions += lru.insert(format!("k{}", i % 300), i, (i * 37) % 200).len();
            if i % 3 == 0 {
                lru.get(&format!("k{}", i % 50));
            }
            assert!(lru.len() <= bounds.max_entries);
            assert!(lru.bytes() <= bounds.max_bytes);
            let sum: u64 = lru.slots.values().map(|s| s.bytes).sum();
            assert_eq!(sum, lru.bytes());
        }
        assert!(evictions > 1000);
    }
}
