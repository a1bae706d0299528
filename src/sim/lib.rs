//! `pd-sim`: a GPU-free stand-in for SGLang engines (the router in front is SGLang's own
//! model gateway, `smg`). Engines serve
//! SGLang 0.5.23's API (generation, info, health, metrics) under a timing model. A prefill serves a
//! bootstrap server that answers like SGLang's and registers one row per rank, each with a TCP port
//! that serves the KV of the rooms it computed; a decode resolves the prefill with the handshake
//! core and has every decode rank pull its share of the KV from the prefill ranks its rank map
//! names, checksummed, before it streams tokens.

pub mod bootstrap;
pub mod engine;
pub mod flags;
pub mod hub;
pub mod kv;
pub mod loadgen;
pub mod metrics;
pub mod model_dir;
pub mod openai;
pub mod openloop;
pub mod pd;
pub mod rooms;
pub mod serve;
pub mod transfer;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SimError {
    #[error("engine flags: {0}")]
    Flags(String),
    /// The model directory as SGLang refuses it (`model_dir`), in its words.
    #[error("{0}")]
    Model(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("server on {addr} failed: {source}")]
    Serve { addr: String, source: std::io::Error },
    #[error("cannot write to stdout: {0}")]
    Output(std::io::Error),
}
