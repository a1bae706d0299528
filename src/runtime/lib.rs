//! I/O that pd-operator and the stand-in share: an HTTP client, the Hub's config.json GET and the model fetch, the Kubernetes client, one
//! handshake probe round against a prefill's bootstrap server, logging set-up and graceful
//! shutdown.

pub mod http_client;
pub mod hub;
pub mod kube_client;
pub mod model_fetch;
pub mod probe;
pub mod prometheus;
pub mod shutdown;
pub mod telemetry;
pub mod verdict_args;
