//! The decode-side bootstrap handshake: the pure core, one probe round, and the sidecar.

pub mod core;
pub mod probe;
pub mod pyvalue;
pub mod sidecar;
