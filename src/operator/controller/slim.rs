//! What the controller's caches keep of each support kind, beyond `pd_core::child_kinds!`'s own
//! `slim`: only the fields a later pass reads. For most kinds that is the metadata
//! `sync_children` compares (name, owner, the applied hash, the deployment and KV set labels) and
//! what the watchdog compares (uid, resourceVersion); their specs, rules and subjects are never
//! read back, since a changed child is found by its hash, and at hundreds of PDDeployments they
//! are several MiB held for nothing.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use kube::api::ObjectMeta;

use pd_api::labels::{APPLIED_HASH_ANNOTATION, LABEL_DEPLOYMENT, LABEL_KV_SET};

/// What a cached object of a kind keeps; the default keeps it whole.
pub trait Slim {
    fn slim(&mut self) {}
}

/// Of the labels and annotations, those `sync_children` and the index read; `also` names one
/// more annotation a kind's reader needs.
fn slim_meta(m: &mut ObjectMeta, also: Option<&str>) {
    if let Some(labels) = m.labels.as_mut() {
        labels.retain(|k, _| k == LABEL_DEPLOYMENT || k == LABEL_KV_SET);
    }
    if let Some(annotations) = m.annotations.as_mut() {
        annotations.retain(|k, _| k == APPLIED_HASH_ANNOTATION || Some(k.as_str()) == also);
    }
}

impl Slim for Service {
    fn slim(&mut self) {
        (self.spec, self.status) = (None, None);
        slim_meta(&mut self.metadata, None);
    }
}

/// The model's kept config.json (`pd_core::model_read::kept`: its URL annotation and data) stays; the handshake
/// inputs and the dry run's shim are only compared by hash.
impl Slim for ConfigMap {
    fn slim(&mut self) {
        let kept_config = self.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(pd_api::labels::MODEL_CONFIG_URL_ANNOTATION));
        if !kept_config {
            (self.data, self.binary_data) = (None, None);
        }
        slim_meta(&mut self.metadata, Some(pd_api::labels::MODEL_CONFIG_URL_ANNOTATION));
    }
}

impl Slim for ServiceAccount {
    fn slim(&mut self) {
        (self.secrets, self.image_pull_secrets) = (None, None);
        slim_meta(&mut self.metadata, None);
    }
}

impl Slim for Role {
    fn slim(&mut self) {
        self.rules = None;
        slim_meta(&mut self.metadata, None);
    }
}

impl Slim for RoleBinding {
    fn slim(&mut self) {
        self.subjects = None;
        self.role_ref = Default::default();
        slim_meta(&mut self.metadata, None);
    }
}

impl Slim for NetworkPolicy {
    fn slim(&mut self) {
        self.spec = None;
        slim_meta(&mut self.metadata, None);
    }
}

impl Slim for PersistentVolumeClaim {
    fn slim(&mut self) {
        (self.spec, self.status) = (None, None);
        slim_meta(&mut self.metadata, None);
    }
}

impl Slim for PodGroup {
    fn slim(&mut self) {
        self.spec = Default::default();
        self.status = None;
        slim_meta(&mut self.metadata, None);
    }
}

/// `scaling::ask_of` reads the spec and the managed fields, `scale::write_status` the status.
impl Slim for pd_api::PDRole {
    fn slim(&mut self) {
        slim_meta(&mut self.metadata, None);
    }
}

/// The model fetch and the config read judge a Job by its status; there are few of them.
impl Slim for Job {}

/// `sets::Router::observe` reads the router's labels; `sets::slim_deployment` keeps the rest small.
impl Slim for Deployment {}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn meta(annotations: &[(&str, &str)]) -> ObjectMeta {
        let labels = [(LABEL_DEPLOYMENT, "a"), (LABEL_KV_SET, "0"), ("app.kubernetes.io/name", "x")];
        ObjectMeta {
            name: Some("a-engines".into()),
            uid: Some("u".into()),
            labels: Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
            annotations: Some(annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn a_support_object_keeps_what_sync_children_reads() {
        let mut svc = Service {
            metadata: meta(&[(APPLIED_HASH_ANNOTATION, "h"), ("note", "n")]),
            spec: Some(Default::default()),
            ..Default::default()
        };
        svc.slim();
        assert!(svc.spec.is_none());
        assert_eq!(svc.metadata.annotations, Some(BTreeMap::from([(APPLIED_HASH_ANNOTATION.to_owned(), "h".to_owned())])));
        let labels: Vec<&str> = svc.metadata.labels.iter().flatten().map(|(k, _)| k.as_str()).collect();
        assert_eq!(labels, [LABEL_DEPLOYMENT, LABEL_KV_SET]);
        assert_eq!((svc.metadata.name.as_deref(), svc.metadata.uid.as_deref()), (Some("a-engines"), Some("u")));
    }

    #[test]
    fn the_kept_model_config_keeps_its_data_and_url_and_other_config_maps_drop_theirs() {
        let data = Some(BTreeMap::from([(pd_core::hub::CONFIG_FILE.to_owned(), "{}".to_owned())]));
        let url = (pd_api::labels::MODEL_CONFIG_URL_ANNOTATION, "https://huggingface.co/x");
        let mut kept = ConfigMap { metadata: meta(&[(APPLIED_HASH_ANNOTATION, "h"), url]), data: data.clone(), ..Default::default() };
        kept.slim();
        assert_eq!(kept.data, data);
        assert_eq!(kept.metadata.annotations.as_ref().and_then(|a| a.get(url.0)).map(String::as_str), Some(url.1));
        let mut handshake = ConfigMap { metadata: meta(&[(APPLIED_HASH_ANNOTATION, "h")]), data, ..Default::default() };
        handshake.slim();
        assert!(handshake.data.is_none());
    }
}
