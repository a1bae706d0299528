//! The controller's run loop: `run` serves the admin endpoints and the webhook, and reconciles
//! while this replica holds the lease, one term of fresh caches at a time (`reconcile_term`). The
//! modules are grouped by what runs: a term's watches (`watches`) and caches (`cache`,
//! `children`, `slim`); each reconcile (`reconcile`: read → validate → render → plan → apply →
//! status) with what its steps share (`context`), write (`status_writer`, `scale`) and fail with
//! (`error`); the autoscaling planner (`planner`); the lease (`leader`); the admin endpoints
//! (`metrics`); the watchdog (`watchdog`); and what the cluster serves, asked at start
//! (`discovery`).

mod cache;
mod children;
mod context;
mod discovery;
mod error;
pub mod leader;
pub mod metrics;
mod planner;
mod reconcile;
mod scale;
mod slim;
mod status_writer;
pub mod watchdog;
mod watches;

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use metrics::{AdminState, Metrics};
use pd_core::render::RenderOptions;

pub use context::{LeaderSettings, Settings};

// The two types every step of a reconcile names, as `super::Context` and `super::Error`.
use context::Context;
use error::Error;

/// The field manager of every server-side apply the reconciler makes (the planner has its own).
const FIELD_MANAGER: &str = "pd-operator";
/// How long a term's caches may wait for their first full list. A list the apiserver never
/// answers (seen for a custom resource right after a kube-apiserver restart) would otherwise hold
/// every reconcile until the client's read timeout (295 s); past this bound the term starts its
/// watches afresh, with the bound doubled each time (up to `CACHE_READY_MAX`), so lists that are
/// merely slow (thousands of objects) get the time they need.
const CACHE_READY_BOUND: Duration = Duration::from_secs(10);
const CACHE_READY_MAX: Duration = Duration::from_secs(160);

/// Runs the controller until SIGTERM/SIGINT. With leader election it reconciles only while it
/// holds the lease; a replica that loses it (the apiserver unreachable past the renew deadline,
/// or another replica took over) stops reconciling, drops its caches and stands by again, while
/// its webhook keeps serving.
pub async fn run(client: Client, settings: Settings) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let metrics = Arc::new(Metrics::default());
    let stop = pd_runtime::shutdown::token("the controller");
    let liveness = Arc::new(watchdog::Liveness::default());
    let webhook_health = settings.webhook.as_ref().map(|_| Arc::new(crate::webhook::Health::default()));
    let admin_state = AdminState { metrics: metrics.clone(), webhook: webhook_health.clone(), liveness: liveness.clone() };
    // The admin server (probes, metrics) outlives the webhook's drain: /readyz says "draining".
    let admin_stop = CancellationToken::new();
    // Freed memory goes back to the kernel between reconcile bursts (`allocator`).
    let give_back = tokio::spawn(crate::allocator::give_back_free_pages());
    let admin = tokio::spawn(metrics::serve(settings.admin_addr, admin_state, admin_stop.clone().cancelled_owned()));
    // Asked before the webhook serves and the reconciler starts: both judge placement.gang by it.
    let workload_api = tokio::select! {
        served = async { settings.discover_workload_api && discovery::serves_pod_groups(&client).await } => served,
        _ = stop.cancelled() => false,
    };
    let settings = Settings { render: RenderOptions { workload_api, ..settings.render }, ..settings };
    // The webhook serves on every replica, leader or not, and outlives reconcile terms.
    let webhook = match (settings.webhook.clone(), webhook_health) {
        (Some(wh), Some(health)) => {
            let (client, metrics, stop) = (client.clone(), metrics.clone(), stop.clone());
            Some(tokio::spawn(async move {
                if let Err(e) = crate::webhook::serve(client, wh, workload_api, metrics, health, stop.clone().cancelled_owned()).await {
                    tracing::error!(error = %e, "the admission webhook could not start; stopping");
                    stop.cancel();
                }
            }))
        }
        _ => None,
    };
    while !stop.is_cancelled() {
        let term = stop.child_token();
        if let Some(le) = &settings.leader_election {
            let elector = leader::LeaderElector::new(client.clone(), &le.namespace, &le.lease, &le.identity, LEASE_DURATION);
            tokio::select! {
                r = elector.acquire() => r?,
                _ = stop.cancelled() => break,
            }
            metrics.leader.set(1);
            tokio::spawn(hold_lease(elector, term.clone()));
        }
        reconcile_term(&client, &settings, metrics.clone(), liveness.clone(), term).await;
        metrics.leader.set(0);
        liveness.set(None);
    }
    // The webhook drains on its own clock (`--webhook-drain`), then closes its connections.
    if let Some(webhook) = webhook {
        let _ = webhook.await;
    }
    admin_stop.cancel();
    if tokio::time::timeout(Duration::from_secs(5), admin).await.is_err() {
        warn!("the admin server did not close its connections in time");
    }
    give_back.abort();
    info!("controller stopped");
    Ok(())
}

/// How long a lease this replica holds stays valid without a renewal.
const LEASE_DURATION: Duration = Duration::from_secs(15);

/// Renews the lease until the term ends; ends the term when leadership is lost.
async fn hold_lease(elector: leader::LeaderElector, term: CancellationToken) {
    tokio::select! {
        why = elector.hold() => {
            tracing::error!(error = %why, "leadership lost; reconciling stops until this replica leads again");
            term.cancel();
        }
        _ = term.cancelled() => {}
    }
}

/// One term of reconciling: fresh caches and per-object memory, until `term` is cancelled (a stop
/// request or a lost lease); then in-flight reconciles get `SHUTDOWN_GRACE` to finish. Watches
/// whose caches get no first list within `CACHE_READY_BOUND` are started afresh within the term.
async fn reconcile_term(
    client: &Client,
    settings: &Settings,
    metrics: Arc<Metrics>,
    liveness: Arc<watchdog::Liveness>,
    term: CancellationToken,
) {
    let mut bound = CACHE_READY_BOUND;
    while !term.is_cancelled() {
        watches::run_watches(client, settings, (metrics.clone(), liveness.clone()), term.child_token(), bound).await;
        bound = (bound * 2).min(CACHE_READY_MAX);
    }
}
