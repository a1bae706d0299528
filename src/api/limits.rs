//! The largest value each count of the spec may take. The CRD's schema carries them, so the
//! apiserver refuses a larger one; `validate` checks them again for a spec that skipped the schema
//! (`pd-operator validate -f`, a direct call to the webhook), before any rule does arithmetic on
//! them. Each is far above what a real deployment uses, so no real spec meets it.

/// Each parallel width of one instance (`tp`, `dp`, `attnDp`, `pp`, `attnCp`, `dcp`). The
/// largest single SGLang instances run today span a few NVL72 racks (a few hundred GPUs).
pub const MAX_PARALLEL_SIZE: u32 = 1024;

/// GPUs one instance uses (`tp × pp × dp`): the same bound as one width, so that the rank maps
/// the handshake computes (one entry per decode rank) stay a few thousand entries long.
pub const MAX_GPUS_PER_INSTANCE: u64 = 1024;

/// `gpusPerNode`: 8 on HGX/DGX and most AMD nodes, 4 on GB200 trays, 16 on the largest NPU nodes.
pub const MAX_GPUS_PER_NODE: u32 = 16;

/// Instance counts: `spec.replicas`, each role's `replicas`, the scaling bounds, a `PDRole`'s
/// replicas, `maxUnavailable` and `partition`. The operator's own pods-per-PDDeployment limit
/// (`--max-pods-per-deployment`) is usually the tighter bound; this one keeps the products of
/// counts within integer range.
pub const MAX_INSTANCES: i32 = 4096;

/// `router.replicas`: one gateway pod routes thousands of requests a second.
pub const MAX_ROUTER_REPLICAS: i32 = 64;

/// `kvTransfer.pageSize` in tokens: SGLang's page sizes are 1 to 256 (64 for DSA, 256 for
/// DeepSeek-V4); a page above 4096 tokens is no real layout.
pub const MAX_PAGE_SIZE: u32 = 4096;

/// `recovery.maxRestarts`: recreations of one instance within the window; a budget above a few
/// dozen is no budget.
pub const MAX_RESTARTS: i32 = 100;

/// `recovery.windowSeconds`: a day.
pub const MAX_RECOVERY_WINDOW_SECONDS: i32 = 86_400;

/// `recovery.hangSeconds`: an hour without progress is no liveness check.
pub const MAX_HANG_SECONDS: i32 = 3_600;

/// `recovery.startupSeconds`: a day of loading weights.
pub const MAX_STARTUP_SECONDS: i32 = 86_400;
