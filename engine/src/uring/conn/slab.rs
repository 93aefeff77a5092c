//! The connections of one core, by key: a slot is reused for a new connection only with a new
//! generation, so a stale key (an event for a connection closed meanwhile) finds nothing.

use crate::uring::conn::{Conn, ConnKey};

struct Slot {
    generation: u32,
    conn: Option<Conn>,
}

/// The connections of one core.
#[derive(Default)]
pub(crate) struct ConnSlab {
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
}

impl ConnSlab {
    pub(crate) fn insert(&mut self, conn: Conn) -> ConnKey {
        self.live += 1;
        match self.free.pop() {
            Some(index) => {
                let slot = &mut self.slots[index as usize];
                slot.generation = slot.generation.wrapping_add(1);
                slot.conn = Some(conn);
                ConnKey {
                    index,
                    generation: slot.generation,
                }
            }
            None => {
                let index = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                self.slots.push(Slot {
                    generation: 0,
                    conn: Some(conn),
                });
                ConnKey {
                    index,
                    generation: 0,
                }
            }
        }
    }

    pub(crate) fn get_mut(&mut self, key: ConnKey) -> Option<&mut Conn> {
        let slot = self.slots.get_mut(key.index as usize)?;
        if slot.generation != key.generation {
            return None;
        }
        slot.conn.as_mut()
    }

    pub(crate) fn remove(&mut self, key: ConnKey) -> Option<Conn> {
        let slot = self.slots.get_mut(key.index as usize)?;
        if slot.generation != key.generation {
            return None;
        }
        let conn = slot.conn.take()?;
        self.free.push(key.index);
        self.live -= 1;
        Some(conn)
    }

    /// Keys of every connection.
    pub(crate) fn keys(&self) -> Vec<ConnKey> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.conn.is_some())
            .map(|(index, slot)| ConnKey {
                index: u32::try_from(index).unwrap_or(u32::MAX),
                generation: slot.generation,
            })
            .collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }
}
