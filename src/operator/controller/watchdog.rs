//! Stall detection for `/livez`: the controller's watch caches must follow the apiserver.
//!
//! Every `CHECK_EVERY` the leader lists the metadata of each watched kind and compares it with
//! its cache. An object the cache lacks, holds at another resourceVersion, or holds after the
//! API dropped it is a suspect; a live watch clears a suspect within moments. A suspect whose
//! cached resourceVersion has not moved for `STALL_AFTER` while the apiserver answers means a
//! watch no longer delivers: `/livez` fails and Kubernetes restarts the replica. While the
//! apiserver does not answer, nothing is judged (a restart would not help).
//!
//! The lists are read a page at a time and only uid and resourceVersion are kept: a metadata list
//! still carries every object's managed fields (several KiB per pod), and read whole and decoded
//! into `ObjectMeta` it made the controller's peak memory grow by about 70 KiB per pod.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams};
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use serde::Deserialize;
use serde::de::DeserializeOwned;

pub const CHECK_EVERY: Duration = Duration::from_secs(20);
pub const STALL_AFTER: Duration = Duration::from_secs(60);
/// Objects per page of a check's list: each page is reduced to uid → resourceVersion before the
/// next is read, so a check's memory does not grow with the number of objects.
const PAGE: u32 = 500;

/// uid → resourceVersion of the objects of one kind.
pub type Versions = BTreeMap<String, String>;

/// uid → the cache's resourceVersion (None: the cache lacks it), for objects where the cache
/// disagrees with the API.
pub type Divergence = BTreeMap<String, Option<String>>;

/// The objects where the cache disagrees with the API, each with the cache's resourceVersion
/// (None: the cache lacks it).
pub fn divergent(api: &Versions, cache: &Versions) -> Divergence {
    let mut out: BTreeMap<String, Option<String>> =
        api.iter().filter(|(uid, rv)| cache.get(*uid) != Some(rv)).map(|(uid, _)| (uid.clone(), cache.get(uid).cloned())).collect();
    out.extend(cache.iter().filter(|(uid, _)| !api.contains_key(*uid)).map(|(uid, rv)| (uid.clone(), Some(rv.clone()))));
    out
}

/// Suspects across checks: `kind/uid` → (the cache's resourceVersion when first seen, since when).
#[derive(Debug, Default)]
pub struct Tracker {
    suspects: HashMap<String, (Option<String>, Instant)>,
}

impl Tracker {
    /// Folds one check of `kind` in; a suspect whose cached version moved starts afresh, one
    /// that no longer diverges is dropped.
    pub fn observe(&mut self, kind: &str, divergent: Divergence, now: Instant) {
        let prefix = format!("{kind}/");
        let (mut previous, others): (HashMap<_, _>, HashMap<_, _>) =
            std::mem::take(&mut self.suspects).into_iter().partition(|(key, _)| key.starts_with(&prefix));
        self.suspects = others;
        for (uid, cached) in divergent {
            let key = format!("{prefix}{uid}");
            let since = previous.remove(&key).filter(|(was, _)| *was == cached).map_or(now, |(_, since)| since);
            self.suspects.insert(key, (cached, since));
        }
    }

    /// The oldest suspect older than `STALL_AFTER`, described for `/livez`.
    pub fn stalled(&self, now: Instant) -> Option<String> {
        let (key, (cached, since)) = self.suspects.iter().min_by_key(|(_, (_, since))| *since)?;
        let age = now.saturating_duration_since(*since);
        (age >= STALL_AFTER).then(|| {
            let held = cached.as_deref().map_or("does not hold it".to_owned(), |rv| format!("still holds resourceVersion {rv}"));
            format!("watch stalled: the cache of {key} {held} {}s after the apiserver moved on", age.as_secs())
        })
    }
}

/// Lists the metadata of the objects `api` and `selector` scope, and compares them with `store`.
pub async fn check<K>(api: Api<K>, selector: Option<&str>, store: &Store<K>) -> Result<Divergence, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let from_api = listed_versions(api, selector).await?;
    let cached: Versions = store.state().iter().filter_map(|o| Some((o.meta().uid.clone()?, o.resource_version()?))).collect();
    Ok(divergent(&from_api, &cached))
}

/// One page of a metadata list as the check reads it: serde skips every other field (managed
/// fields, labels, annotations) without building it.
#[derive(Deserialize)]
struct VersionPage {
    #[serde(default)]
    metadata: PageMeta,
    /// The apiserver sends `"items": null` for an empty metadata list.
    #[serde(default)]
    items: Option<Vec<Versioned>>,
}

#[derive(Default, Deserialize)]
struct PageMeta {
    #[serde(rename = "continue")]
    next: Option<String>,
}

#[derive(Deserialize)]
struct Versioned {
    metadata: UidVersion,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UidVersion {
    uid: Option<String>,
    resource_version: Option<String>,
}

/// uid → resourceVersion of what `api` and `selector` scope, read `PAGE` objects at a time.
async fn listed_versions<K: Resource>(api: Api<K>, selector: Option<&str>) -> Result<Versions, kube::Error> {
    let request = kube::core::Request::new(api.resource_url());
    let client = Client::from(api);
    let mut versions = Versions::new();
    let mut next: Option<String> = None;
    loop {
        let mut params = selector.map_or_else(ListParams::default, |s| ListParams::default().labels(s)).limit(PAGE);
        params.continue_token = next.take();
        let page: VersionPage = client.request(request.list_metadata(&params).map_err(kube::Error::BuildRequest)?).await?;
        versions.extend(page.items.into_iter().flatten().filter_map(|o| Some((o.metadata.uid?, o.metadata.resource_version?))));
        next = page.metadata.next.filter(|token| !token.is_empty());
        if next.is_none() {
            return Ok(versions);
        }
    }
}

/// What `/livez` reports: None while the caches follow the apiserver.
#[derive(Debug, Default)]
pub struct Liveness {
    stalled: Mutex<Option<String>>,
}

impl Liveness {
    pub fn stalled(&self) -> Option<String> {
        self.stalled.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set(&self, stalled: Option<String>) {
        let mut current = self.stalled.lock().unwrap_or_else(|p| p.into_inner());
        if stalled.is_some() && *current != stalled {
            tracing::error!(reason = stalled.as_deref().unwrap_or_default(), "reconciling has stalled; /livez fails");
        }
        *current = stalled;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn versions_of(pairs: &[(&str, &str)]) -> Versions {
        pairs.iter().map(|(u, v)| ((*u).into(), (*v).into())).collect()
    }

    #[test]
    fn the_cache_diverges_where_it_lacks_lags_or_keeps_an_object() {
        let api = versions_of(&[("a", "1"), ("b", "5"), ("c", "7")]);
        let cache = versions_of(&[("a", "1"), ("b", "4"), ("d", "2")]);
        let d = divergent(&api, &cache);
        assert_eq!(d.len(), 3, "{d:?}");
        assert_eq!(d["b"], Some("4".into()), "an update not seen");
        assert_eq!(d["c"], None, "a creation not seen");
        assert_eq!(d["d"], Some("2".into()), "a deletion not seen");
        assert!(divergent(&api, &api).is_empty());
    }

    /// A metadata list as the apiserver sends it, in two pages, with managed fields.
    fn paged_apiserver() -> (Client, std::sync::Arc<Mutex<Vec<String>>>) {
        let queries: std::sync::Arc<Mutex<Vec<String>>> = std::sync::Arc::default();
        let seen = queries.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let query = req.uri().query().unwrap_or_default().to_owned();
            seen.lock().unwrap().push(query.clone());
            let item = |uid: &str, rv: &str| {
                let managed =
                    serde_json::json!([{"manager": "pd-operator", "operation": "Apply", "fieldsV1": {"f:spec": {"f:containers": {}}}}]);
                serde_json::json!({"metadata": {"name": uid, "uid": uid, "resourceVersion": rv, "managedFields": managed, "labels": {"a": "b"}}})
            };
            let page = if query.contains("continue=") {
                serde_json::json!({"kind": "PartialObjectMetadataList", "metadata": {"resourceVersion": "9", "continue": ""}, "items": [item("c", "3")]})
            } else {
                serde_json::json!({"kind": "PartialObjectMetadataList", "metadata": {"resourceVersion": "9", "continue": "page-2"}, "items": [item("a", "1"), item("b", "2")]})
            };
            let body = http_body_util::Full::new(bytes::Bytes::from(serde_json::to_vec(&page).unwrap()));
            async move { Ok::<_, kube::Error>(http::Response::builder().header("content-type", "application/json").body(body).unwrap()) }
        });
        (Client::new(service, "default"), queries)
    }

    #[test]
    fn an_empty_metadata_list_reads_as_no_objects() {
        // What kube-apiserver 1.37 answered for a kind with no objects in scope.
        let empty =
            r#"{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"1561"},"items":null}"#;
        let page: VersionPage = serde_json::from_str(empty).unwrap();
        assert!(page.items.is_none_or(|i| i.is_empty()) && page.metadata.next.is_none());
    }

    #[tokio::test]
    async fn a_check_reads_the_list_a_page_at_a_time_and_keeps_every_page() {
        let (client, queries) = paged_apiserver();
        let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, "ns");
        let versions = listed_versions(api, Some("app=x")).await.unwrap();
        assert_eq!(versions, versions_of(&[("a", "1"), ("b", "2"), ("c", "3")]));
        let queries = queries.lock().unwrap().clone();
        assert_eq!(queries.len(), 2, "{queries:?}");
        assert!(queries.iter().all(|q| q.contains(&format!("limit={PAGE}")) && q.contains("labelSelector=app%3Dx")), "{queries:?}");
        assert!(queries[1].contains("continue=page-2"), "{queries:?}");
    }

    #[test]
    fn only_a_suspect_whose_cached_version_never_moves_becomes_a_stall() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        let lagging = |rv: &str| BTreeMap::from([("u1".to_owned(), Some(rv.to_owned()))]);
        t.observe("pods", lagging("4"), t0);
        assert_eq!(t.stalled(t0 + STALL_AFTER / 2), None);
        // The cache moved on (a live watch on a busy object): the clock starts again.
        t.observe("pods", lagging("6"), t0 + STALL_AFTER / 2);
        assert_eq!(t.stalled(t0 + STALL_AFTER), None);
        // Stuck at the same version for the whole bound: stalled.
        t.observe("pods", lagging("6"), t0 + STALL_AFTER);
        let why = t.stalled(t0 + STALL_AFTER * 3 / 2).expect("stalled");
        assert!(why.contains("pods/u1") && why.contains("resourceVersion 6"), "{why}");
        // Another kind's check leaves this kind's suspects alone; a clean check of this kind clears them.
        t.observe("services", BTreeMap::new(), t0 + STALL_AFTER * 2);
        assert!(t.stalled(t0 + STALL_AFTER * 2).is_some());
        t.observe("pods", BTreeMap::new(), t0 + STALL_AFTER * 2);
        assert_eq!(t.stalled(t0 + STALL_AFTER * 3), None);
    }
}
