//! The decode-side bootstrap handshake: the pure core, one probe round, and the sidecar.

pub mod core;
pub mod probe;
pub mod pyvalue;
pub mod sidecar;

/// The pod condition the sidecar sets on its decode pod (the pod's readiness gate): True once
/// every prefill passed, False with SGLang's text otherwise. The sidecar's contract with the
/// controller and the rendered pods, so it lives here rather than with either.
pub const HANDSHAKE_CONDITION: &str = "pd.inference.dev/handshake";
/// Pod annotation where the sidecar publishes the rank map (JSON list of `RankTargets`).
pub const RANK_MAP_ANNOTATION: &str = "pd.inference.dev/rank-map";
