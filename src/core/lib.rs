//! The pure core of pd-operator: what a PDDeployment means and what it becomes, with no
//! Kubernetes client and no async runtime. Model facts (`model`), the SGLang release judged
//! (`release`), SGLang's start-up resolution (`resolve`), the rules (`validate`), the handshake's
//! checks and rank map (`handshake`), the objects and argv (`render`), and the controller's pure
//! decisions (`plan`, `recovery`, `sets`, `status`). `bounds` keeps what one object may ask for bounded.

pub mod bounds;
pub mod children;
pub mod dryrun;
pub mod egress;
pub mod handshake;
pub mod hub;
pub mod hub_id;
pub mod manifest;
pub mod model;
pub mod model_fetch;
pub mod model_read;
pub mod offline;
pub mod plan;
pub mod planner;
#[cfg(test)]
mod pod_security;
pub mod recovery;
pub mod release;
pub mod remote;
pub mod render;
pub mod resolve;
pub mod scaling;
pub mod sets;
pub mod sglang_args;
pub mod sidecar;
pub mod stand_in;
pub mod status;
pub mod validate;
