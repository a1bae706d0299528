//! The decode-side bootstrap handshake: the pure core and the sidecar around it.

pub mod core;
pub mod pyvalue;
