pub mod api;
pub mod model;
pub mod render;
pub mod validate;
pub mod manifest;
pub mod handshake;
pub mod cli;
pub mod telemetry;
