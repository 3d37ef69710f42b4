//! Keeping long-lived maps from holding on to their peak size.
//!
//! `HashMap` never gives capacity back when entries are removed. The
//! session maps grow with the number of chats busy *at once* (thousands in a
//! burst) but normally hold a handful, so without shrinking a single burst
//! would pin its peak size for the life of the process.
//!
//! Also the allocator's own tuning ([`tune_allocator`]), which the binary
//! applies at start.

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

/// glibc's malloc, tuned for a process whose threads (tokio workers, the
/// store thread) allocate and free each other's memory all the time: by
/// default it hands freed memory back to the kernel at every chance
/// (`madvise`, with TLB shootdowns across cores) and keeps up to eight
/// arenas per core. A high trim threshold, a fixed mmap threshold and four
/// arenas took `cargo bench --bench pipeline` from about 290 to about
/// 215 us of CPU per update; `cargo bench --bench footprint` keeps an eye
/// on the idle RSS this may cost (none measured). With the `mimalloc`
/// feature (the default) Rust's heap is mimalloc's and this tunes only what
/// C code (SQLite) allocates. Call first thing in `main`.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; meant to be called first
    // thing in main, before other threads allocate.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 4);
    }
}

/// Hands the heap's free pages back to the kernel now, whatever the trim
/// threshold: for a thread that just freed a lot and is about to idle (the
/// store thread, see `store::batch`). With the `mimalloc` feature (the
/// default) this trims what C code (SQLite) freed; mimalloc purges its
/// own pages by itself.
pub(crate) fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the kernel; it is
    // thread-safe (it takes each arena's lock).
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::shrink_when_sparse;

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
