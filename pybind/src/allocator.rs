//! The heap of the engine inside Python (Python's own objects keep pymalloc): mimalloc, the
//! allocator of tensorwire's binaries, for the same reasons (`tools/ptr1-bench/src/main.rs`):
//! HTTP/2's per-frame buffers reuse freed pages instead of faulting in fresh ones, and a
//! burst's memory goes back to the system once idle.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_arena_eager_commit`: its place in mimalloc 2's `mi_option_e` (`mimalloc.h`);
/// `libmimalloc-sys` names no constant for it.
const ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

/// Commits arena memory as it is used rather than up front: measured, a Ray consumer that
/// receives a 256 MiB array otherwise holds 1.11x the array instead of 1.09x
/// (`pybind/tests/test_ray.py`, the consumer's peak RSS).
pub(crate) fn configure() {
    // SAFETY: `mi_option_set` stores a value in mimalloc's option table (an atomic per option,
    // read when an arena is next made); both arguments are plain integers.
    unsafe { libmimalloc_sys::mi_option_set(ARENA_EAGER_COMMIT, 0) };
}
