//! The orders threads and blocks run in: in order, reversed, or shuffled by a seeded generator.

/// The order in which the threads of a block run between two barriers (and the blocks of
/// the grid run). One order hides a missing barrier; several, with the race detector, do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Thread 0 first (x fastest, then y, then z); blocks likewise.
    InOrder,
    /// The last thread first; blocks likewise.
    Reversed,
    /// A fresh pseudo-random order for every block and barrier interval, from this seed.
    Random(u64),
}

impl Schedule {
    /// In order, reversed, and two seeded random orders.
    pub const ALL: [Schedule; 4] = [
        Schedule::InOrder,
        Schedule::Reversed,
        Schedule::Random(0x5eed_0001),
        Schedule::Random(0x5eed_0002),
    ];
}

/// splitmix64: a small, seedable generator for schedules.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}
