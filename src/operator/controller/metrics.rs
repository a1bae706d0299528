//! Prometheus metrics and the admin HTTP server (`/livez`, `/readyz`, `/metrics`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub verb: String,
    pub resource: String,
}

pub struct Metrics {
    pub reconciles: Counter,
    pub errors: Family<ErrorLabels, Counter>,
    pub duration: Histogram,
    pub managed: Gauge,
    pub writes: Family<WriteLabels, Counter>,
    pub leader: Gauge,
    pub admissions: Family<DecisionLabels, Counter>,
    registry: Registry,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub decision: String,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("pd_operator");
        let reconciles = Counter::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        let managed = Gauge::default();
        let writes = Family::<WriteLabels, Counter>::default();
        let leader = Gauge::default();
        let admissions = Family::<DecisionLabels, Counter>::default();
        registry.register("admission_reviews", "Admission reviews by decision", admissions.clone());
        registry.register("reconcile", "Reconciles run", reconciles.clone());
        registry.register("reconcile_errors", "Reconcile errors by kind", errors.clone());
        registry.register("reconcile_duration_seconds", "Reconcile duration", duration.clone());
        registry.register("managed_pddeployments", "PDDeployments this controller reconciles", managed.clone());
        registry.register("api_writes", "Writes this controller sent to the API server", writes.clone());
        registry.register("leader", "1 while this replica holds the leader lease", leader.clone());
        Self { reconciles, errors, duration, managed, writes, leader, admissions, registry }
    }
}

impl Metrics {
    pub fn write(&self, verb: &str, resource: &str) {
        self.writes.get_or_create(&WriteLabels { verb: verb.into(), resource: resource.into() }).inc();
    }

    pub fn admission(&self, decision: &str) {
        self.admissions.get_or_create(&DecisionLabels { decision: decision.into() }).inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[derive(Clone)]
pub struct AdminState {
    pub metrics: Arc<Metrics>,
    /// The webhook's readiness; None when it is disabled.
    pub webhook: Option<Arc<crate::webhook::Health>>,
    /// Whether the watch caches still follow the apiserver.
    pub liveness: Arc<super::watchdog::Liveness>,
}

async fn livez(State(s): State<AdminState>) -> impl IntoResponse {
    match s.liveness.stalled() {
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
        None => (StatusCode::OK, "ok".to_owned()),
    }
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode())
}

/// Ready once the admin server answers, unless the webhook (when enabled) cannot serve yet:
/// a replica that is not leader is still ready, since it serves admission reviews.
async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    match s.webhook.as_ref().map(|w| w.ready()) {
        Some(Err(why)) => (StatusCode::SERVICE_UNAVAILABLE, why),
        _ => (StatusCode::OK, "ok"),
    }
}

pub async fn serve(
    addr: SocketAddr,
    state: AdminState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new().route("/livez", get(livez)).route("/readyz", get(readyz)).route("/metrics", get(metrics)).with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "admin server listening (/livez, /readyz, /metrics)");
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}
