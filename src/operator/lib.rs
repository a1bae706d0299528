//! pd-operator: the controller, the admission webhook, the admin endpoints and the handshake
//! sidecar, over the pure core (`pd_core`) and the API types (`pd_api`).

pub mod allocator;
pub mod cli;
pub mod controller;
pub mod handshake;
pub mod model_fetch;
pub mod model_read;
pub mod webhook;
