//! The decode-side bootstrap handshake at run time: the sidecar that gates a decode pod's
//! readiness on a probe round (`pd_runtime::probe`) and publishes the rank map. The checks
//! themselves are `pd_core::handshake::core`.

pub mod sidecar;
