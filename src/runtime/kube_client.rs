//! The Kubernetes client of every pd-operator process: kube's own layers (base URI, auth, extra
//! headers, retries of 429/503/504) over HTTP/2, as client-go talks to the apiserver.
//!
//! kube's default client speaks HTTP/1.1 only, so every request in flight holds a TLS connection
//! of its own: a controller applying a few hundred children at once opened (and paid a handshake
//! on both ends for) a few hundred connections. Over HTTP/2 all requests and watches share one
//! connection, and a ping notices a peer that went away without closing it.

use std::time::Duration;

use hyper_util::client::legacy::Builder;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use kube::{Client, Config};
use tower::ServiceBuilder;
use tower::retry::RetryLayer;

/// How often an idle connection is pinged, and how long the answer may take before the
/// connection is dropped (client-go's HTTP/2 health check reads after 30 s and waits 15 s).
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// A client from the kubeconfig or the in-cluster service account, as `Client::try_default`.
pub async fn connect() -> kube::Result<Client> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    from_config(config)
}

/// A client for `config` that offers HTTP/2 (and falls back to HTTP/1.1 where the server does not).
pub fn from_config(config: Config) -> kube::Result<Client> {
    // The connector offers h2 and http/1.1 by ALPN itself (`enable_all_versions`).
    let tls = config.rustls_client_config()?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http().enable_all_versions().wrap_connector(http);
    let hyper = Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| RetryLayer::new(RetryPolicy::server_retry())))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace))
}
