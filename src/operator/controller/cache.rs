//! The controller's caches of its children: a reflector store per kind, and beside it an index
//! of each object's name by the PDDeployment its `pd.inference.dev/deployment` label names, kept
//! from the same watch events. A reconcile reads its own children through the index; a scan of
//! the whole store per reconcile grows with the square of the PDDeployments (at 500 of them,
//! string compares over every pod and every support object were most of the controller's CPU).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use futures::{Stream, TryStreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;

use pd_api::labels::LABEL_DEPLOYMENT;

/// (namespace, name)
type Key = (String, String);

/// Names by `(namespace, deployment label)`, with a re-list replacing the index when it
/// completes, as it replaces the store (`reflector::store::Writer`'s own rule).
#[derive(Clone, Default)]
pub struct DeploymentIndex(Arc<Mutex<IndexState>>);

#[derive(Default)]
struct IndexState {
    label_of: HashMap<Key, String>,
    by_deployment: HashMap<Key, BTreeSet<String>>,
    relist: Option<HashMap<Key, String>>,
}

fn key_and_label<K: Resource>(o: &K) -> (Key, Option<String>) {
    let m = o.meta();
    let key = (m.namespace.clone().unwrap_or_default(), m.name.clone().unwrap_or_default());
    (key, m.labels.as_ref().and_then(|l| l.get(LABEL_DEPLOYMENT)).cloned())
}

impl IndexState {
    fn remove(&mut self, key: &Key) {
        let Some(label) = self.label_of.remove(key) else { return };
        let group = (key.0.clone(), label);
        if let Some(names) = self.by_deployment.get_mut(&group) {
            names.remove(&key.1);
            if names.is_empty() {
                self.by_deployment.remove(&group);
            }
        }
    }

    fn put(&mut self, key: Key, label: Option<String>) {
        self.remove(&key);
        if let Some(label) = label {
            self.by_deployment.entry((key.0.clone(), label.clone())).or_default().insert(key.1.clone());
            self.label_of.insert(key, label);
        }
    }

    fn replace(&mut self, objects: HashMap<Key, String>) {
        self.label_of.clear();
        self.by_deployment.clear();
        for (key, label) in objects {
            self.put(key, Some(label));
        }
    }
}

impl DeploymentIndex {
    pub fn observe<K: Resource>(&self, event: &Event<K>) {
        let mut s = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match event {
            Event::Apply(o) => {
                let (key, label) = key_and_label(o);
                s.put(key, label);
            }
            Event::Delete(o) => s.remove(&key_and_label(o).0),
            Event::Init => s.relist = Some(HashMap::new()),
            Event::InitApply(o) => {
                if let (Some(relist), (key, Some(label))) = (s.relist.as_mut(), key_and_label(o)) {
                    relist.insert(key, label);
                }
            }
            Event::InitDone => {
                if let Some(objects) = s.relist.take() {
                    s.replace(objects);
                }
            }
        }
    }

    fn names(&self, ns: &str, deployment: &str) -> Vec<String> {
        let s = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        s.by_deployment.get(&(ns.to_owned(), deployment.to_owned())).map(|n| n.iter().cloned().collect()).unwrap_or_default()
    }
}

/// A child kind's store and its index by deployment.
#[derive(Clone)]
pub struct Cache<K: Resource<DynamicType = ()> + Clone + 'static> {
    pub store: Store<K>,
    index: DeploymentIndex,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> std::ops::Deref for Cache<K> {
    type Target = Store<K>;
    fn deref(&self) -> &Store<K> {
        &self.store
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Cache<K> {
    pub fn new(store: Store<K>, index: DeploymentIndex) -> Self {
        Self { store, index }
    }

    /// Every cached object whose deployment label names `ns/deployment`, whoever owns it.
    pub fn labelled(&self, ns: &str, deployment: &str) -> Vec<Arc<K>> {
        let names = self.index.names(ns, deployment);
        names.iter().filter_map(|n| self.store.get(&ObjectRef::new(n).within(ns))).collect()
    }

    /// The children of `owner`.
    pub fn children(&self, owner: Owner<'_>) -> Vec<Arc<K>> {
        self.labelled(owner.ns, owner.name).into_iter().filter(|o| owned_by(o.meta(), owner.uid)).collect()
    }
}

/// Whether `meta` names `uid` among its owners.
pub(super) fn owned_by(meta: &kube::api::ObjectMeta, uid: &str) -> bool {
    meta.owner_references.iter().flatten().any(|o| o.uid == uid)
}

/// A PDDeployment as the owner of children: what finds them in a cache and applies them.
#[derive(Clone, Copy, Debug)]
pub struct Owner<'a> {
    pub ns: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

/// A watch of `api` that keeps a cache of what it sees, and the stream that triggers reconciles.
/// Managed fields are dropped (most of an object's bytes) but for who owns `spec.replicas` (which
/// tells a `PDRole` scaled by someone else from one the operator drives), and `slim` drops
/// whatever else of `K` reconciles do not read.
pub fn cached<K>(
    api: Api<K>,
    config: watcher::Config,
    slim: fn(&mut K),
) -> (Cache<K>, impl Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let index = DeploymentIndex::default();
    let indexed = index.clone();
    let events = watcher::watcher(api, config)
        .backoff(super::watches::watch_backoff())
        .modify(move |o: &mut K| {
            pd_core::scaling::keep_replicas_owners(o.meta_mut());
            slim(o);
        })
        // Before the store sees the event: a name the index gives is in the store, or about to be.
        .inspect_ok(move |e| indexed.observe(e));
    (Cache::new(reader, index), reflector::reflector(writer, events).touched_objects())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    fn pod(name: &str, deployment: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.labels = deployment.map(|d| [(LABEL_DEPLOYMENT.to_owned(), d.to_owned())].into());
        p
    }

    #[test]
    fn the_index_follows_applies_deletes_and_relabels() {
        let index = DeploymentIndex::default();
        index.observe(&Event::Apply(pod("a-0", Some("a"))));
        index.observe(&Event::Apply(pod("a-1", Some("a"))));
        index.observe(&Event::Apply(pod("b-0", Some("b"))));
        index.observe(&Event::Apply(pod("x", None)));
        assert_eq!(index.names("ns", "a"), ["a-0", "a-1"]);
        index.observe(&Event::Delete(pod("a-0", Some("a"))));
        index.observe(&Event::Apply(pod("b-0", Some("a"))));
        assert_eq!(index.names("ns", "a"), ["a-1", "b-0"]);
        assert!(index.names("ns", "b").is_empty(), "a relabelled object leaves its old deployment");
        assert!(index.names("other", "a").is_empty(), "deployments are per namespace");
    }

    #[test]
    fn a_relist_replaces_the_index_only_when_it_completes() {
        let index = DeploymentIndex::default();
        index.observe(&Event::Apply(pod("a-0", Some("a"))));
        index.observe(&Event::Apply(pod("gone", Some("a"))));
        index.observe(&Event::<Pod>::Init);
        index.observe(&Event::InitApply(pod("a-0", Some("a"))));
        assert_eq!(index.names("ns", "a"), ["a-0", "gone"], "the old view serves until the relist is done");
        index.observe(&Event::InitApply(pod("a-2", Some("a"))));
        index.observe(&Event::<Pod>::InitDone);
        assert_eq!(index.names("ns", "a"), ["a-0", "a-2"], "what the relist did not see is gone");
    }

    #[test]
    fn children_come_from_the_store_by_the_index_and_by_owner() {
        let (reader, mut writer) = reflector::store::<Pod>();
        let index = DeploymentIndex::default();
        let mut owned = pod("a-0", Some("a"));
        owned.metadata.owner_references =
            Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference { uid: "u".into(), ..Default::default() }]);
        for e in [Event::Init, Event::InitApply(owned), Event::InitApply(pod("a-router", Some("a"))), Event::InitDone] {
            writer.apply_watcher_event(&e);
            index.observe(&e);
        }
        let cache = Cache::new(reader, index);
        assert_eq!(cache.labelled("ns", "a").len(), 2);
        let children: Vec<_> =
            cache.children(Owner { ns: "ns", name: "a", uid: "u" }).iter().map(|p| p.metadata.name.clone().unwrap()).collect();
        assert_eq!(children, ["a-0"]);
    }
}
