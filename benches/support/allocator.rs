//! The binary's allocator under the `mimalloc` feature (the default;
//! `src/main.rs`), declared again for a bench that runs the engine in its
//! own process: its figures are then those of what that build ships.
//! With `--no-default-features` both use glibc's malloc.

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
