//! `pd-operator sim`: a GPU-free stand-in for SGLang engines and the router. A prefill serves a
//! bootstrap server that answers like SGLang 0.5.23's and registers one row per rank, each with a
//! listening port; a decode and the router serve their health endpoints.

pub mod bootstrap;
pub mod engine;
pub mod flags;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SimError {
    #[error("engine flags: {0}")]
    Flags(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("server on {addr} failed: {source}")]
    Serve { addr: String, source: std::io::Error },
}
