//! Keys of a core's slabs: they identify a connection or an operation across slot reuse.

/// Identifies a connection on a core across slot reuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ConnKey {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

/// Identifies an operation across slot reuse; it is the SQE's `user_data`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct OpKey {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl OpKey {
    pub(crate) fn user_data(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.index)
    }

    pub(crate) fn from_user_data(user_data: u64) -> Self {
        Self {
            index: u32::try_from(user_data & 0xFFFF_FFFF).unwrap_or(u32::MAX),
            generation: u32::try_from(user_data >> 32).unwrap_or(u32::MAX),
        }
    }
}

/// A key of a [`crate::uring::slab::Slab`]: a slot index and the slot's generation.
pub(crate) trait SlabKey: Copy {
    fn new(index: u32, generation: u32) -> Self;
    fn index(self) -> u32;
    fn generation(self) -> u32;
}

macro_rules! slab_key {
    ($key:ty) => {
        impl SlabKey for $key {
            fn new(index: u32, generation: u32) -> Self {
                Self { index, generation }
            }

            fn index(self) -> u32 {
                self.index
            }

            fn generation(self) -> u32 {
                self.generation
            }
        }
    };
}

slab_key!(ConnKey);
slab_key!(OpKey);
