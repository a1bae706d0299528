//! Stall detection for `/livez`: the controller's watch caches must follow the apiserver.
//!
//! Every `CHECK_EVERY` the leader lists the metadata of each watched kind and compares it with
//! its cache. An object the cache lacks, holds at another resourceVersion, or holds after the
//! API dropped it is a suspect; a live watch clears a suspect within moments. A suspect whose
//! cached resourceVersion has not moved for `STALL_AFTER` while the apiserver answers means a
//! watch no longer delivers: `/livez` fails and Kubernetes restarts the replica. While the
//! apiserver does not answer, nothing is judged (a restart would not help).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

pub const CHECK_EVERY: Duration = Duration::from_secs(20);
pub const STALL_AFTER: Duration = Duration::from_secs(60);

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
    let params = selector.map_or_else(ListParams::default, |s| ListParams::default().labels(s));
    let listed = api.list_metadata(&params).await?;
    let from_api: Versions = listed.items.iter().filter_map(|o| Some((o.metadata.uid.clone()?, o.resource_version()?))).collect();
    let cached: Versions = store.state().iter().filter_map(|o| Some((o.meta().uid.clone()?, o.resource_version()?))).collect();
    Ok(divergent(&from_api, &cached))
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

    fn versions(pairs: &[(&str, &str)]) -> Versions {
        pairs.iter().map(|(u, v)| ((*u).into(), (*v).into())).collect()
    }

    #[test]
    fn the_cache_diverges_where_it_lacks_lags_or_keeps_an_object() {
        let api = versions(&[("a", "1"), ("b", "5"), ("c", "7")]);
        let cache = versions(&[("a", "1"), ("b", "4"), ("d", "2")]);
        let d = divergent(&api, &cache);
        assert_eq!(d.len(), 3, "{d:?}");
        assert_eq!(d["b"], Some("4".into()), "an update not seen");
        assert_eq!(d["c"], None, "a creation not seen");
        assert_eq!(d["d"], Some("2".into()), "a deletion not seen");
        assert!(divergent(&api, &api).is_empty());
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
