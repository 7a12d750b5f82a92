//! [`CallMap`]: the calls in flight on one connection, keyed by call id, with one call kept
//! inline.
//!
//! Most connections carry one call at a time. Kept in a hash table, that call costs the
//! table's control bytes and its bucket, two cache lines of their own per connection, each
//! a miss when many connections take turns; kept inline it lies in the connection's state,
//! next to what the call touches anyway. Further calls go to an [`IdMap`], which allocates
//! only once a connection has had two calls in flight at the same time.

use crate::ids::IdMap;

/// Calls in flight by id: the first one inline, the others in a table (see the module docs).
/// Iteration order is unspecified, as a hash map's.
#[derive(Debug)]
pub(crate) struct CallMap<V> {
    /// A call kept inline; when it is `None`, the table may still hold calls.
    first: Option<(u64, V)>,
    rest: IdMap<u64, V>,
}

impl<V> Default for CallMap<V> {
    fn default() -> Self {
        CallMap {
            first: None,
            rest: IdMap::default(),
        }
    }
}

impl<V> CallMap<V> {
    pub(crate) fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_none() && self.rest.is_empty()
    }

    pub(crate) fn contains_key(&self, id: &u64) -> bool {
        self.get(id).is_some()
    }

    pub(crate) fn get(&self, id: &u64) -> Option<&V> {
        match &self.first {
            Some((k, v)) if k == id => Some(v),
            // The table is empty nearly always: no lookup then (an empty table's lookup
            // reads its control bytes, the cache line this map exists to spare).
            _ if self.rest.is_empty() => None,
            _ => self.rest.get(id),
        }
    }

    pub(crate) fn get_mut(&mut self, id: &u64) -> Option<&mut V> {
        match &mut self.first {
            Some((k, v)) if k == id => Some(v),
            _ if self.rest.is_empty() => None,
            _ => self.rest.get_mut(id),
        }
    }

    /// Inserts the call `id`, returning the one it replaces, as a map does.
    pub(crate) fn insert(&mut self, id: u64, value: V) -> Option<V> {
        match &mut self.first {
            Some((k, v)) if *k == id => Some(std::mem::replace(v, value)),
            None if !self.rest.contains_key(&id) => {
                self.first = Some((id, value));
                None
            }
            _ => self.rest.insert(id, value),
        }
    }

    pub(crate) fn remove(&mut self, id: &u64) -> Option<V> {
        match &self.first {
            Some((k, _)) if k == id => self.first.take().map(|(_, v)| v),
            _ if self.rest.is_empty() => None,
            _ => self.rest.remove(id),
        }
    }

    /// Keeps the calls for which `keep` says so.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&u64, &mut V) -> bool) {
        if let Some((k, v)) = &mut self.first {
            if !keep(k, v) {
                self.first = None;
            }
        }
        self.rest.retain(keep);
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&u64, &V)> {
        self.first
            .as_ref()
            .map(|(k, v)| (k, v))
            .into_iter()
            .chain(&self.rest)
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&u64, &mut V)> {
        self.first
            .as_mut()
            .map(|(k, v)| (&*k, v))
            .into_iter()
            .chain(&mut self.rest)
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.iter_mut().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::CallMap;
    use std::collections::BTreeMap;

    /// The map answers as a `BTreeMap` given the same operations does, whichever of its two
    /// places each call is in.
    #[test]
    fn it_behaves_as_a_map() {
        let mut map = CallMap::default();
        let mut model = BTreeMap::new();
        // A fixed pseudo-random sequence of inserts, replacements, removals and lookups over
        // a few ids, so that the inline place empties and refills while the table holds calls.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for step in 0..5_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = x % 6;
            match x % 7 {
                0..=2 => assert_eq!(map.insert(id, step), model.insert(id, step), "insert {id}"),
                3 | 4 => assert_eq!(map.remove(&id), model.remove(&id), "remove {id}"),
                5 => {
                    if let (Some(v), Some(m)) = (map.get_mut(&id), model.get_mut(&id)) {
                        *v += 1;
                        *m += 1;
                    }
                }
                _ => map.retain(|k, v| {
                    let keep = (*k + *v) % 3 != 0;
                    if !keep {
                        model.remove(k);
                    }
                    keep
                }),
            }
            assert_eq!(map.len(), model.len());
            assert_eq!(map.is_empty(), model.is_empty());
            for id in 0..6 {
                assert_eq!(map.get(&id), model.get(&id), "get {id}");
                assert_eq!(map.contains_key(&id), model.contains_key(&id));
            }
            let mut seen: Vec<(u64, u64)> = map.iter().map(|(k, v)| (*k, *v)).collect();
            seen.sort_unstable();
            let expected: Vec<(u64, u64)> = model.iter().map(|(k, v)| (*k, *v)).collect();
            assert_eq!(seen, expected);
        }
        map.retain(|_, _| false);
        assert!(map.is_empty());
        assert_eq!(map.values().count(), 0);
    }

    /// One call at a time never allocates a table: the call stays inline.
    #[test]
    fn one_call_at_a_time_stays_inline() {
        let mut map = CallMap::default();
        for id in 1..100u64 {
            assert_eq!(map.insert(id, id * 2), None);
            assert_eq!(map.get(&id), Some(&(id * 2)));
            assert_eq!(map.remove(&id), Some(id * 2));
        }
        assert_eq!(map.rest.capacity(), 0);
        map.insert(1, 1);
        map.insert(2, 2);
        assert_eq!(map.len(), 2);
        assert!(map.rest.capacity() > 0, "a second call goes to the table");
    }
}
