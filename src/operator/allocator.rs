//! How the process uses glibc's allocator. The controller's live heap is about a third of its RSS
//! at 200 PDDeployments (heaptrack); the rest is memory the program freed that glibc keeps: heaps
//! per thread, large buffers kept in the heap, and free pages between chunks still in use, which
//! glibc returns only from a heap's top. Other builds (musl, macOS) keep their allocator's
//! defaults.

use std::time::Duration;

/// How often the controller hands free pages back to the kernel. A pass walks the free lists of
/// every arena (a few milliseconds at a 100 MiB heap), so once every few seconds costs nothing
/// measurable while a burst's freed pages are back with the kernel before the next burst.
pub const GIVE_BACK_EVERY: Duration = Duration::from_secs(5);

/// Blocks of this size and more are mapped on their own and unmapped when freed.
pub const MMAP_THRESHOLD: i32 = 256 << 10;

/// Sets the allocator up before any other thread starts.
/// - One arena: glibc gives a thread that finds the arenas busy a heap of its own (up to 8 a
///   core) and keeps what each heap grew to; the threads' own caches (tcache) keep most
///   allocations off the arena's lock.
/// - A fixed mmap threshold: by default glibc raises it to the size of every mapped block freed
///   (up to 32 MiB), so after the first large list answer such buffers come from the heap and
///   stay there; fixed, a list page or a watch buffer goes back to the kernel when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn tune() {
    // SAFETY: mallopt only sets allocator parameters; main calls this before any other thread.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() {}

/// Hands the free pages of every arena back to the kernel (`malloc_trim(0)`, which since glibc
/// 2.8 releases whole free pages anywhere in a heap, not only at its top), every
/// `GIVE_BACK_EVERY`, until the process ends.
pub async fn give_back_free_pages() {
    let mut tick = tokio::time::interval(GIVE_BACK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        trim();
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim takes the arenas' own locks; it only returns free pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}
