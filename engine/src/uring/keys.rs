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
