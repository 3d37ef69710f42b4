//! Keeping long-lived maps from holding on to their peak size.
//!
//! `HashMap` never gives capacity back when entries are removed. The
//! session maps grow with the number of chats busy *at once* (thousands in a
//! burst) but normally hold a handful, so without shrinking a single burst
//! would pin its peak size for the life of the process.

use std::collections::HashMap;
use std::hash::Hash;

/// Shrink `map` to twice its length once it is less than a quarter full
/// (amortised O(1) per removal: each shrink follows at least as many
/// removals as it rehashes).
pub(crate) fn shrink_when_sparse<K: Eq + Hash, V>(map: &mut HashMap<K, V>) {
    const FLOOR: usize = 64;
    let capacity = map.capacity();
    if capacity > FLOOR && map.len() < capacity / 4 {
        map.shrink_to((map.len() * 2).max(FLOOR));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drained_map_gives_its_capacity_back() {
        let mut map: HashMap<u32, u32> = (0..10_000).map(|i| (i, i)).collect();
        for i in 0..10_000 {
            map.remove(&i);
            shrink_when_sparse(&mut map);
        }
        assert!(map.capacity() <= 128, "capacity {}", map.capacity());
    }
}
