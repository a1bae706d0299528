//! The decode-side bootstrap handshake's pure part: SGLang's checks and rank map (`core`), Python
//! literal parsing (`pyvalue`), and the sidecar's contract with the controller. The probe round
//! and the sidecar are pd-operator's (`pd_operator::handshake`).

pub mod core;
pub mod pyvalue;

/// The pod condition the sidecar sets on its decode pod (the pod's readiness gate): True once
/// every prefill passed, False with SGLang's text otherwise. The sidecar's contract with the
/// controller and the rendered pods, so it lives here rather than with either.
pub const HANDSHAKE_CONDITION: &str = "pd.inference.dev/handshake";
/// Pod annotation where the sidecar publishes the rank map (JSON list of `RankTargets`).
pub const RANK_MAP_ANNOTATION: &str = "pd.inference.dev/rank-map";
