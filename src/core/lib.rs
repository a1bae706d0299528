//! The pure core of pd-operator: what a PDDeployment means and what it becomes, with no
//! Kubernetes client and no async runtime. Its modules stand in layers; each imports only its own
//! layer and those below, with no cycle (`tests/layers.rs` keeps it so; docs/architecture.md
//! draws it).

// Vocabulary and facts: names of what the operator creates, findings, pod and Job facts, the
// SGLang releases judged, what a remote system may say back.
pub mod findings;
pub mod hub_id;
pub mod manifest;
pub mod names;
pub mod pod;
pub mod release;
pub mod remote;
pub mod stand_in;

// What SGLang and the Hugging Face Hub do: the model's facts, SGLang's flags and start-up
// resolution, the handshake's checks and rank map, the Hub's URLs and answers.
pub mod handshake;
pub mod hub;
pub mod model;
pub mod resolve;
pub mod sglang_args;

// The rules: what a spec may ask for (`validate`), the bounds on every count, the egress the
// platform allows, and the offline report over manifests.
pub mod bounds;
pub mod egress;
pub mod offline;
pub mod validate;

// The model's sources: where the weights are mounted from, the fetch Job, the config.json read.
pub mod model_fetch;
pub mod model_read;
pub mod model_source;

// The child objects of a PDDeployment and their argv.
pub mod render;

// The engine dry run: its pod, its verdict and the gate it keeps.
pub mod dryrun;

// The controller's pure decisions and the status they add up to.
pub mod children;
pub mod plan;
pub mod planner;
#[cfg(test)]
mod pod_security;
pub mod recovery;
pub mod scaling;
pub mod sets;
pub mod sidecar;
pub mod status;
