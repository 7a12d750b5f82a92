//! Which half of a block: the two data halves and the parity, and their codes in a trailer.

use std::fmt;

/// One of the two data halves of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Half {
    /// The first half of the stream (header and start of the payload), kept by target data 1.
    Data1,
    /// The second half of the stream, kept by target data 2.
    Data2,
}

impl Half {
    /// The other data half.
    pub fn other(self) -> Half {
        match self {
            Half::Data1 => Half::Data2,
            Half::Data2 => Half::Data1,
        }
    }
}

impl fmt::Display for Half {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Slot::from(*self).fmt(f)
    }
}

/// Any of the three halves of a block, i.e. which storage target keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    /// The data 1 half.
    Data1,
    /// The data 2 half.
    Data2,
    /// The parity half.
    Parity,
}

impl Slot {
    /// The three slots, in the order of the group in a trailer.
    pub(super) const ALL: [Slot; 3] = [Slot::Data1, Slot::Data2, Slot::Parity];

    /// The slot's code in a trailer.
    pub(super) fn code(self) -> u8 {
        match self {
            Slot::Data1 => 1,
            Slot::Data2 => 2,
            Slot::Parity => 3,
        }
    }

    /// The slot a trailer's code names, if any.
    pub(super) fn from_code(code: u8) -> Option<Slot> {
        match code {
            1 => Some(Slot::Data1),
            2 => Some(Slot::Data2),
            3 => Some(Slot::Parity),
            _ => None,
        }
    }

    /// Position of this slot's shard checksum in the group.
    pub(super) fn group_pos(self) -> usize {
        match self {
            Slot::Data1 => 0,
            Slot::Data2 => 1,
            Slot::Parity => 2,
        }
    }
}

impl From<Half> for Slot {
    fn from(half: Half) -> Slot {
        match half {
            Half::Data1 => Slot::Data1,
            Half::Data2 => Slot::Data2,
        }
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Slot::Data1 => "data 1",
            Slot::Data2 => "data 2",
            Slot::Parity => "parity",
        })
    }
}
