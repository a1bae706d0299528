//! How the process uses glibc's allocator. The controller's live heap is about a third of its RSS
//! at 200 PDDeployments (heaptrack); the rest is memory the program freed that glibc keeps: heaps
//! per thread, and free pages inside the heaps between chunks still in use, which glibc returns
//! only from a heap's top. Other builds (musl, macOS) keep their allocator's defaults.

use std::time::Duration;

/// How often the controller hands free pages back to the kernel. A pass walks the free lists of
/// every arena (a few milliseconds at a 100 MiB heap), so once every few seconds costs nothing
/// measurable while a burst's freed pages are back with the kernel before the next burst.
pub const GIVE_BACK_EVERY: Duration = Duration::from_secs(5);

/// Sets the allocator up before any other thread starts. glibc gives a thread that finds the
/// arenas busy a heap of its own (up to 8 a core) and keeps what each heap grew to; two arenas
/// serve the runtime's busy workers without a heap per thread.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn tune() {
    // SAFETY: mallopt only sets an allocator parameter; main calls this before any other thread.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
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
