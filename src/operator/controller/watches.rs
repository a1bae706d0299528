//! A term's watches: the PDDeployment watch and the child caches feeding one controller run, how
//! each watch retries on its own, which PDDeployment a pod event wakes, and the watchdog that
//! checks the caches against the apiserver. Everything here lives as long as one set of watches.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;
use kube::{Client, Resource};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use pd_api::PDDeployment;
use pd_api::labels::{LABEL_DEPLOYMENT, MANAGED_BY, OPERATOR};

use super::cache::cached;
use super::children::ChildStores;
use super::metrics::Metrics;
use super::{Context, Settings, error, reconcile, watchdog};

/// Events of one PDDeployment this close together are one reconcile.
const RECONCILE_DEBOUNCE: Duration = Duration::from_millis(500);
/// How long in-flight reconciles may go on once the watches are cancelled.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
/// Each watch retries after an error within these bounds (jittered, doubling).
pub(super) const WATCH_RETRY_MIN: Duration = Duration::from_millis(500);
pub(super) const WATCH_RETRY_MAX: Duration = Duration::from_secs(4);

/// How each watch retries after an error: on its own, briefly. After an apiserver restart every
/// watch answers 410 Gone and re-lists; a backoff shared by all of them (kube-runtime's default
/// trigger backoff) paused every watch for each one's error, for up to 30 s a time, and stalled
/// reconciling for minutes.
pub(super) fn watch_backoff() -> impl Backoff {
    let retry = backon::ExponentialBuilder::default()
        .with_min_delay(WATCH_RETRY_MIN)
        .with_max_delay(WATCH_RETRY_MAX)
        .with_jitter()
        .without_max_times();
    watcher::ExponentialBackoff::from(retry)
}

/// The merged trigger stream's backoff: none, since every watch already backs off on its own.
struct NoSharedBackoff;

impl Iterator for NoSharedBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl Backoff for NoSharedBackoff {
    fn reset(&mut self) {}
}

/// The PDDeployment a pod event wakes: the one its `pd.inference.dev/deployment` label names. By
/// owner it would miss the router's pods, which the router Deployment's ReplicaSet owns: a KV set
/// surge waits for the old router pod to be gone, and its going changes nothing the PDDeployment
/// owns (the kind tier's surge waited out the 300 s resync for it).
pub(super) fn pod_deployment(pod: Pod) -> Option<reflector::ObjectRef<DeserializeGuard<PDDeployment>>> {
    let ns = pod.metadata.namespace.as_deref()?;
    let name = pod.metadata.labels.as_ref()?.get(LABEL_DEPLOYMENT)?;
    Some(reflector::ObjectRef::new(name).within(ns))
}

/// `managed-by=pd-operator`: the label every child carries and every child watch selects.
pub(super) fn managed_selector() -> String {
    format!("{MANAGED_BY}={OPERATOR}")
}

/// An API for `K` in the watched namespace, or in all namespaces.
pub(super) fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Every `watchdog::CHECK_EVERY`, compares each watch cache with a metadata list of the same
/// scope, and reports a watch that stopped delivering to `/livez`.
async fn watch_the_watches(
    client: Client,
    namespace: Option<String>,
    pdds: Store<DeserializeGuard<PDDeployment>>,
    stores: ChildStores,
    liveness: Arc<watchdog::Liveness>,
) {
    let mut tracker = watchdog::Tracker::default();
    let (ns, selector) = (namespace.as_deref(), managed_selector());
    loop {
        tokio::time::sleep(watchdog::CHECK_EVERY).await;
        let checks =
            futures::future::try_join(watchdog::check(scoped(&client, ns), None, &pdds), stores.divergence(&client, ns, &selector));
        match checks.await {
            Ok((pdd_divergence, children)) => {
                let now = Instant::now();
                for (kind, divergent) in std::iter::once(("pddeployments", pdd_divergence)).chain(children) {
                    tracker.observe(kind, divergent, now);
                }
                liveness.set(tracker.stalled(now));
            }
            // It answered, but refused: the watchdog is blind until that is fixed (RBAC?).
            Err(e @ kube::Error::Api(_)) => warn!(error = %e, "the apiserver refused the watchdog's lists; nothing judged"),
            Err(e) => tracing::debug!(error = %e, "the apiserver did not answer the watchdog's lists; nothing judged"),
        }
    }
}

/// Caches, watches and the controller, until `watches` is cancelled: by the term's end, or by
/// `restart_unready` when a cache has had no first list in time.
pub(super) async fn run_watches(
    client: &Client,
    settings: &Settings,
    (metrics, liveness): (Arc<Metrics>, Arc<watchdog::Liveness>),
    watches: CancellationToken,
    bound: Duration,
) {
    let ns = settings.namespace.as_deref();
    let (pdd_cache, pdd_events) =
        cached(scoped::<DeserializeGuard<PDDeployment>>(client, ns), watcher::Config::default().any_semantic(), |_| {});
    let pdd_store = pdd_cache.store;
    let controller = Controller::for_stream(pdd_events, pdd_store.clone()).trigger_backoff(NoSharedBackoff);
    let (stores, controller) = ChildStores::watch(client, ns, settings.render.workload_api, controller);
    let ctx = Arc::new(Context::new(client.clone(), settings, metrics.clone(), stores.clone()));
    info!(namespace = ns.unwrap_or("<all>"), "controller started");
    let restart = tokio::spawn(restart_unready(pdd_store.clone(), stores.clone(), watches.clone(), bound));
    let watchdog = tokio::spawn(watch_the_watches(client.clone(), settings.namespace.clone(), pdd_store.clone(), stores, liveness));
    let controller = controller
        // Pods of one PDDeployment change state in bursts; one reconcile per burst is enough.
        .with_config(ControllerConfig::default().debounce(RECONCILE_DEBOUNCE).concurrency(settings.max_concurrent_reconciles))
        .graceful_shutdown_on(watches.clone().cancelled_owned())
        .run(reconcile::reconcile, error::error_policy, ctx)
        .for_each(move |res| {
            metrics.managed.set(pdd_store.len() as i64);
            async move {
                if let Err(e) = res {
                    tracing::debug!(error = %e, "controller event");
                }
            }
        });
    // The end finishes within a bound, whatever is still in flight.
    let deadline = async move {
        watches.cancelled().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        _ = controller => {},
        _ = deadline => warn!(grace = ?SHUTDOWN_GRACE, "reconciles did not drain in time; stopping anyway"),
    }
    restart.abort();
    watchdog.abort();
}

/// Cancels `watches` when, `bound` after they started, a cache has had no first list.
async fn restart_unready(
    pdd_store: reflector::Store<DeserializeGuard<PDDeployment>>,
    stores: ChildStores,
    watches: CancellationToken,
    bound: Duration,
) {
    use futures::FutureExt;
    tokio::time::sleep(bound).await;
    let mut waiting = stores.not_ready();
    if pdd_store.wait_until_ready().now_or_never().is_none() {
        waiting.push("pddeployments");
    }
    if !waiting.is_empty() {
        warn!(kinds = waiting.join(", "), ?bound, "watches got no first list in time; starting them afresh");
        watches.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::super::{cache, children};
    use super::*;

    /// Caches whose watch never delivers a first list (the writer lives, nothing is applied).
    struct NeverListed;

    impl children::CacheSource for NeverListed {
        fn cache<K>(&self) -> cache::Cache<K>
        where
            K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
        {
            let (reader, writer) = reflector::store();
            std::mem::forget(writer);
            cache::Cache::new(reader, Default::default())
        }
    }

    #[tokio::test]
    async fn watches_whose_caches_get_no_first_list_are_started_afresh() {
        let stores = ChildStores::from_source(&NeverListed);
        let waiting = stores.not_ready();
        assert!(waiting.contains(&"pods") && waiting.contains(&"pdroles"), "{waiting:?}");
        let (pdds, writer) = reflector::store::<DeserializeGuard<PDDeployment>>();
        std::mem::forget(writer);
        let watches = CancellationToken::new();
        restart_unready(pdds, stores, watches.clone(), Duration::from_millis(5)).await;
        assert!(watches.is_cancelled(), "a term whose caches never fill starts its watches again");
    }

    #[test]
    fn a_pod_wakes_the_pddeployment_its_label_names_whoever_owns_it() {
        let pod = |labels: &[(&str, &str)]| Pod {
            metadata: kube::api::ObjectMeta {
                namespace: Some("ns".into()),
                labels: Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
                ..Default::default()
            },
            ..Default::default()
        };
        // A router pod: owned by a ReplicaSet, labelled with its PDDeployment.
        let router = pod(&[(LABEL_DEPLOYMENT, "pd"), ("pod-template-hash", "abc")]);
        assert_eq!(pod_deployment(router), Some(reflector::ObjectRef::new("pd").within("ns")));
        assert_eq!(pod_deployment(pod(&[("app", "other")])), None);
    }
}
