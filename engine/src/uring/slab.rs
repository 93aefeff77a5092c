//! A core's slabs (its connections, its operations), by key: a slot is reused only with a new
//! generation, so a stale key (an event for a connection closed meanwhile, a completion for a
//! reused slot) finds nothing.

use std::marker::PhantomData;

use crate::uring::keys::SlabKey;

struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// Values of type `T` by keys of type `K`.
pub(crate) struct Slab<K, T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    live: usize,
    key: PhantomData<K>,
}

impl<K, T> Default for Slab<K, T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            key: PhantomData,
        }
    }
}

impl<K: SlabKey, T> Slab<K, T> {
    pub(crate) fn insert(&mut self, value: T) -> K {
        self.live += 1;
        match self.free.pop() {
            Some(index) => {
                let slot = &mut self.slots[index as usize];
                slot.generation = slot.generation.wrapping_add(1);
                slot.value = Some(value);
                K::new(index, slot.generation)
            }
            None => {
                let index = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                self.slots.push(Slot {
                    generation: 0,
                    value: Some(value),
                });
                K::new(index, 0)
            }
        }
    }

    pub(crate) fn get_mut(&mut self, key: K) -> Option<&mut T> {
        let slot = self.slots.get_mut(key.index() as usize)?;
        if slot.generation != key.generation() {
            return None;
        }
        slot.value.as_mut()
    }

    pub(crate) fn remove(&mut self, key: K) -> Option<T> {
        let slot = self.slots.get_mut(key.index() as usize)?;
        if slot.generation != key.generation() {
            return None;
        }
        let value = slot.value.take()?;
        self.free.push(key.index());
        self.live -= 1;
        Some(value)
    }

    /// Keys of every value.
    pub(crate) fn keys(&self) -> Vec<K> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.value.is_some())
            .map(|(index, slot)| K::new(u32::try_from(index).unwrap_or(u32::MAX), slot.generation))
            .collect()
    }

    /// Every value.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|slot| slot.value.as_ref())
    }

    /// Values in the slab.
    pub(crate) fn len(&self) -> usize {
        self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uring::keys::ConnKey;

    #[test]
    fn a_key_of_a_removed_value_does_not_find_the_value_that_reuses_its_slot() {
        let mut slab = Slab::<ConnKey, &str>::default();
        let old = slab.insert("old");
        assert_eq!(slab.remove(old), Some("old"));
        let new = slab.insert("new");
        assert_eq!(new.index, old.index, "the slot is reused");
        assert_eq!(slab.get_mut(old), None);
        assert_eq!(slab.remove(old), None);
        assert_eq!(slab.get_mut(new).copied(), Some("new"));
        assert_eq!((slab.len(), slab.keys()), (1, vec![new]));
    }
}
