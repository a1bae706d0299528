pub mod api;
pub mod cli;
pub mod handshake;
pub mod manifest;
pub mod model;
pub mod render;
pub mod telemetry;
pub mod validate;
