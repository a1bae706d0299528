//! What the controller is given and what every reconcile shares: the settings of
//! `pd-operator controller`, and the `Context` built from them each time a term starts its
//! watches, with the writes every step makes through it (events, applies, child sync) and its
//! memory of them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use tracing::warn;

use pd_api::PDDeployment;
use pd_api::labels::{APPLIED_HASH_ANNOTATION, OPERATOR};
use pd_core::render::RenderOptions;

use super::cache::{self, Cache};
use super::children::ChildStores;
use super::metrics::Metrics;
use super::status_writer::STATUS_MEMORY;
use super::{Error, FIELD_MANAGER};

/// How long a pod this process created is presumed to exist while the cache does not show it.
const EXPECTATION_TTL: Duration = Duration::from_secs(30);

/// Settings of `pd-operator controller`.
#[derive(Clone, Debug)]
pub struct Settings {
    pub admin_addr: SocketAddr,
    pub render: RenderOptions,
    /// Watch one namespace, or all when None.
    pub namespace: Option<String>,
    /// Reconciles running at once (0: no limit).
    pub max_concurrent_reconciles: u16,
    /// Engine pods held rendered at once across reconciles (`--max-rendered-pods`).
    pub max_rendered_pods: u32,
    /// Reconcile an unchanged PDDeployment this often.
    pub resync: Duration,
    pub leader_election: Option<LeaderSettings>,
    pub webhook: Option<crate::webhook::WebhookSettings>,
    /// Ask the cluster at start whether it serves Kubernetes' gang scheduling API (false: take it
    /// as not served, whatever the cluster says). The answer is `render.workload_api`.
    pub discover_workload_api: bool,
    /// The addresses specs may make the operator reach (`pd_core::egress`).
    pub egress: pd_core::egress::EgressPolicy,
    /// `--max-pods-per-deployment`: a PDDeployment asking for more engine pods is reported
    /// invalid and gets no child.
    pub max_pods: u32,
}

/// The lease a replica must hold to reconcile (`--leader-elect`).
#[derive(Clone, Debug)]
pub struct LeaderSettings {
    pub namespace: String,
    pub lease: String,
    pub identity: String,
}

/// What every reconcile shares: the client and the caches, the render budget, and this process's
/// memory of its own writes, which is newer than the caches.
pub(super) struct Context {
    pub(super) client: Client,
    recorder: Recorder,
    pub(super) render: RenderOptions,
    pub(super) metrics: Arc<Metrics>,
    pub(super) resync: Duration,
    /// `--max-pods-per-deployment`.
    pub(super) max_pods: u32,
    /// `--max-rendered-pods` as permits: a reconcile holds its object's pod count
    /// (`bounds::render_permits`) from before its render until it ends.
    render_budget: tokio::sync::Semaphore,
    /// The budget's size, to take a share of it.
    max_rendered_pods: u32,
    /// The operator's children as the watches see them: reconciles read these, never LIST.
    pub(super) stores: ChildStores,
    /// What this process last wrote to each PDDeployment's status, and when (`ns/name/uid`). It is
    /// the only status writer, so this is newer than a lagging cache: transitions and "nothing
    /// changed" are judged against it, or stale views would rewrite old timestamps back and forth.
    pub(super) status_written: Mutex<HashMap<String, (Instant, pd_api::PDDeploymentStatus)>>,
    /// What this process last wrote to each `PDRole`'s status (`ns/name/uid`), for the same
    /// reason: a pass that reads a cache still without its own last write would write it again.
    role_status_written: Mutex<HashMap<String, (Instant, pd_api::PDRoleStatus)>>,
    /// Pods this process created that the pod cache may not show yet (`ns/name` → when).
    expected_pods: Mutex<HashMap<String, Instant>>,
    /// The planner's own scrapes of each PDDeployment's engines (`ns/name/uid`), when it reads
    /// no Prometheus.
    pub(super) scrapes: Mutex<HashMap<String, pd_core::planner::scrape::History>>,
    /// The addresses specs may make the operator reach: judged before any request to one.
    pub(super) egress: pd_core::egress::EgressPolicy,
}

/// The content hash a child carries (`APPLIED_HASH_ANNOTATION`). An object that does not
/// serialize is an error, not the hash of nothing: every such object would share that hash, and a
/// changed child would look unchanged.
fn digest<T: Serialize>(obj: &T) -> Result<String, serde_json::Error> {
    let bytes = serde_json::to_vec(obj)?;
    Ok(Sha256::digest(&bytes).iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// Whether a refused apply names `spec.replicas` among its conflicts (another manager's count).
fn conflicts_on_replicas(status: &kube::core::Status) -> bool {
    status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.field.contains("spec.replicas")))
}

impl Context {
    /// Waits for `spec`'s share of the render budget (`bounds::render_permits`); the share goes
    /// back when the permit drops. The budget is never closed, so there is always a permit.
    pub(super) async fn render_share(&self, spec: &pd_api::PDDeploymentSpec) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.render_budget.acquire_many(pd_core::bounds::render_permits(spec, self.max_rendered_pods)).await.ok()
    }

    pub(super) fn new(client: Client, settings: &Settings, metrics: Arc<Metrics>, stores: ChildStores) -> Self {
        let reporter = Reporter { controller: OPERATOR.into(), instance: std::env::var("POD_NAME").ok() };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            render: settings.render.clone(),
            metrics,
            resync: settings.resync,
            max_pods: settings.max_pods,
            render_budget: tokio::sync::Semaphore::new(settings.max_rendered_pods as usize),
            max_rendered_pods: settings.max_rendered_pods,
            stores,
            status_written: Mutex::default(),
            role_status_written: Mutex::default(),
            expected_pods: Mutex::default(),
            scrapes: Mutex::default(),
            egress: settings.egress.clone(),
        }
    }

    /// Publishes an Event on `pdd` (its note cut to 1,000 characters); a failure is logged, never
    /// fails the reconcile.
    pub(super) async fn event(&self, pdd: &PDDeployment, type_: EventType, reason: &str, action: &str, note: String) {
        let ev =
            Event { type_, reason: reason.into(), note: Some(note.chars().take(1000).collect()), action: action.into(), secondary: None };
        if let Err(e) = self.recorder.publish(&ev, &pdd.object_ref(&())).await {
            warn!(error = %e, reason, "could not publish event");
        }
    }

    /// Server-side apply of `obj` under the operator's one field manager, counted as a write.
    /// Forced (the operator's fields are its own), but for a `PDRole` asserting `spec.replicas`:
    /// if another manager took that field since the cache last showed the object, the apply is
    /// refused (409) and retried on a newer cache, instead of taking the count back. A conflict
    /// on any other field of it is the operator's to win, as for every child.
    pub(super) async fn apply<K>(&self, api: &Api<K>, name: &str, obj: &K) -> Result<K, kube::Error>
    where
        K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    {
        self.metrics.write("apply", K::plural(&()).as_ref());
        let forced = PatchParams::apply(FIELD_MANAGER).force();
        let scale_target = K::kind(&()) == <pd_api::PDRole as Resource>::kind(&())
            && serde_json::to_value(obj).is_ok_and(|v| !v["spec"]["replicas"].is_null());
        if !scale_target {
            return api.patch(name, &forced, &Patch::Apply(obj)).await;
        }
        match api.patch(name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(obj)).await {
            Err(kube::Error::Api(s)) if s.code == 409 && !conflicts_on_replicas(&s) => {
                self.metrics.write("apply", K::plural(&()).as_ref());
                api.patch(name, &forced, &Patch::Apply(obj)).await
            }
            other => other,
        }
    }

    /// Applies each child of one kind whose desired content changed, then deletes leftovers, but
    /// for children of a KV set in `keep` (`pd.inference.dev/kv-set`).
    pub(super) async fn sync_children<K>(
        &self,
        store: &Cache<K>,
        owner: cache::Owner<'_>,
        desired: &[K],
        keep: &BTreeSet<String>,
    ) -> Result<(), Error>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    {
        let ns = owner.ns;
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        let existing = store.children(owner);
        // Unchanged children are left alone; the changed ones are applied at once.
        let mut changed = Vec::new();
        for want in desired {
            let mut want = want.clone();
            let wname = want.meta().name.clone().unwrap_or_default();
            let hash = digest(&want).map_err(|source| Error::Serialize { what: format!("{} {ns}/{wname}", K::kind(&())), source })?;
            want.meta_mut().annotations.get_or_insert_with(BTreeMap::new).insert(APPLIED_HASH_ANNOTATION.into(), hash.clone());
            let have = existing.iter().find(|e| e.meta().name.as_deref() == Some(wname.as_str()));
            if have.is_none_or(|h| h.meta().annotations.as_ref().and_then(|a| a.get(APPLIED_HASH_ANNOTATION)) != Some(&hash)) {
                changed.push((wname, want));
            }
        }
        futures::future::try_join_all(changed.iter().map(|(wname, want)| self.apply(&api, wname, want))).await?;
        for leftover in &existing {
            let lname = leftover.meta().name.clone().unwrap_or_default();
            let kept =
                leftover.meta().labels.as_ref().and_then(|l| l.get(pd_api::labels::LABEL_KV_SET)).is_some_and(|set| keep.contains(set));
            if !kept && !desired.iter().any(|d| d.meta().name.as_deref() == Some(lname.as_str())) {
                self.metrics.write("delete", K::plural(&()).as_ref());
                match api.delete(&lname, &DeleteParams::background()).await {
                    // The cache may lag behind a delete this process already made.
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                    Ok(_) => {}
                }
            }
        }
        Ok(())
    }

    fn expected_pods(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.expected_pods.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The newest status this process knows for a PDDeployment: its own last write, else the cache's.
    pub(super) fn known_status(&self, key: &str, pdd: &PDDeployment) -> Option<pd_api::PDDeploymentStatus> {
        let written = self.status_written.lock().unwrap_or_else(|p| p.into_inner());
        // status.autoscaling is the planner's (its own field manager), never in what this writes.
        let cached = pdd.status.clone().map(|s| pd_api::PDDeploymentStatus { autoscaling: None, ..s });
        written.get(key).map(|(_, s)| s.clone()).or(cached)
    }

    /// The newest status this process knows for a `PDRole` (`ns/name/uid`): its own last write,
    /// else the cache's.
    pub(super) fn role_status_known(&self, key: &str, cached: Option<&pd_api::PDRoleStatus>) -> Option<pd_api::PDRoleStatus> {
        let written = self.role_status_written.lock().unwrap_or_else(|p| p.into_inner());
        written.get(key).map(|(_, s)| s.clone()).or_else(|| cached.cloned())
    }

    /// Records a `PDRole` status this process just wrote; entries older than `STATUS_MEMORY` go
    /// (by then the cache shows them, or the object is gone).
    pub(super) fn role_status_wrote(&self, key: String, status: pd_api::PDRoleStatus) {
        let mut written = self.role_status_written.lock().unwrap_or_else(|p| p.into_inner());
        written.retain(|_, (at, _)| at.elapsed() < STATUS_MEMORY);
        written.insert(key, (Instant::now(), status));
    }

    /// Whether pod `ns/name` was created by this process within the expectation TTL (and is
    /// therefore only missing from a lagging cache). Expired entries are dropped.
    pub(super) fn expecting(&self, ns: &str, pod: &str) -> bool {
        let mut map = self.expected_pods();
        map.retain(|_, at| at.elapsed() < EXPECTATION_TTL);
        map.contains_key(&format!("{ns}/{pod}"))
    }

    /// Records a pod this process just created.
    pub(super) fn expect_pod(&self, ns: &str, pod: &str) {
        self.expected_pods().insert(format!("{ns}/{pod}"), Instant::now());
    }

    /// Stops presuming pod `ns/name` exists: the cache shows it, or this process deletes it.
    pub(super) fn forget_pods<'a>(&self, ns: &str, pods: impl IntoIterator<Item = &'a str>) {
        let mut map = self.expected_pods();
        for pod in pods {
            map.remove(&format!("{ns}/{pod}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    #[test]
    fn a_conflict_on_a_roles_replicas_is_told_from_conflicts_on_other_fields() {
        let conflict = |field: &str| -> kube::core::Status {
            serde_json::from_value(serde_json::json!({"status": "Failure", "code": 409, "reason": "Conflict",
                "message": "Apply failed with 1 conflict", "details": {"causes": [
                    {"reason": "FieldManagerConflict", "message": "conflict with \"kubectl\"", "field": field}]}}))
            .unwrap()
        };
        assert!(conflicts_on_replicas(&conflict(".spec.replicas")));
        assert!(!conflicts_on_replicas(&conflict(".metadata.labels.app.kubernetes.io/name")));
    }

    #[test]
    fn an_object_that_does_not_serialize_has_no_hash_rather_than_the_hash_of_nothing() {
        let pod = Pod { metadata: kube::api::ObjectMeta { name: Some("p".into()), ..Default::default() }, ..Default::default() };
        assert_eq!(digest(&pod).unwrap().len(), 16);
        assert_ne!(digest(&pod).unwrap(), digest(&()).unwrap());
        // JSON object keys must be strings: this map cannot be serialized.
        let unserializable = BTreeMap::from([((1u8, 2u8), 3u8)]);
        let source = digest(&unserializable).expect_err("a map with tuple keys is no JSON");
        let error = Error::Serialize { what: "Pod ns/p".into(), source };
        assert!(error.to_string().starts_with("could not serialize Pod ns/p: key must be a string"), "{error}");
        assert_eq!(error.metric_label(), "serialize");
    }
}
