use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    limit_malloc_arenas();
    let cli = pd_operator::cli::Cli::parse();
    pd_runtime::telemetry::init(&cli.logging);
    pd_operator::cli::run(cli)
}

/// glibc gives a thread that finds the arenas busy a heap of its own (up to 8 a core) and keeps
/// what each heap grew to; the controller's live heap is about a third of its RSS at 200
/// PDDeployments (heaptrack), the rest mostly freed memory held in those heaps. Two arenas serve
/// the runtime's busy workers without a heap per thread.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn limit_malloc_arenas() {
    // SAFETY: glibc's mallopt only sets an allocator parameter; called before any other thread.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}
