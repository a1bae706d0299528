//! What the controller's caches keep of each object, so that a cache of every pod and child stays
//! small: of an engine pod, what reconciles and the planner read (`slim_pod`); of each support
//! kind, beyond `pd_core::child_kinds!`'s own `slim`, only the fields a later pass reads. For most
//! kinds that is the metadata `sync_children` compares (name, owner, the applied hash, the
//! deployment and KV set labels) and what the watchdog compares (uid, resourceVersion); their
//! specs, rules and subjects are never read back, since a changed child is found by its hash, and
//! at hundreds of PDDeployments they are several MiB held for nothing.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerState, ContainerStateTerminated, ContainerStatus, PersistentVolumeClaim, Pod, PodSpec, Service,
    ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use kube::api::ObjectMeta;

use pd_api::labels::{APPLIED_HASH_ANNOTATION, LABEL_DEPLOYMENT, LABEL_KV_SET};
use pd_core::names::SIDECAR_CONTAINER;
use pd_core::plan;

/// What reconciles read of a pod (see `ObservedPod::from_pod`): identity and ownership, the
/// deployment label and the labels, annotations, phase and conditions the planner reads, the
/// engine container's restart count and last exit, and the address the autoscaling planner
/// scrapes. The spec, the other container statuses, other labels and the conditions' other
/// timestamps are most of a pod's memory, and the cache holds every pod.
pub(super) fn slim_pod(p: &mut Pod) {
    // Of the spec, only the sidecar's image and whether it has a startup probe
    // (`ObservedPod::sidecar_image`, `sidecar_probed`).
    p.spec = plan::sidecar(p).map(|c| PodSpec {
        init_containers: Some(vec![Container {
            name: SIDECAR_CONTAINER.into(),
            image: c.image.clone(),
            startup_probe: c.startup_probe.as_ref().map(|_| Default::default()),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let m = &mut p.metadata;
    if let Some(labels) = m.labels.as_mut() {
        labels.retain(|k, _| k == LABEL_DEPLOYMENT || plan::READ_LABELS.contains(&k.as_str()));
    }
    if let Some(annotations) = m.annotations.as_mut() {
        annotations.retain(|k, _| plan::READ_ANNOTATIONS.contains(&k.as_str()));
    }
    if let Some(s) = p.status.as_mut() {
        let mut conditions = s.conditions.take().unwrap_or_default();
        conditions.retain(|c| plan::READ_CONDITIONS.contains(&c.type_.as_str()));
        for c in &mut conditions {
            // lastTransitionTime stays: the planner's minReadySeconds counts from Ready's.
            (c.last_probe_time, c.observed_generation) = (None, None);
        }
        // The engine's restarts: a multi-node instance whose engine restarted is recreated whole.
        let engine = plan::engine_status(s).map(slim_container_status);
        // The pod's address: where the planner scrapes an engine without a Prometheus.
        let (phase, pod_ip) = (s.phase.take(), s.pod_ip.take());
        *s = k8s_openapi::api::core::v1::PodStatus {
            phase,
            pod_ip,
            conditions: Some(conditions),
            container_statuses: engine.map(|c| vec![c]),
            ..Default::default()
        };
    }
}

/// Of a container's status, what `ObservedPod` reads: its name, restart count and last exit.
fn slim_container_status(c: &ContainerStatus) -> ContainerStatus {
    let terminated = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()).map(|t| ContainerStateTerminated {
        exit_code: t.exit_code,
        reason: t.reason.clone(),
        ..Default::default()
    });
    ContainerStatus {
        name: c.name.clone(),
        restart_count: c.restart_count,
        last_state: terminated.map(|t| ContainerState { terminated: Some(t), ..Default::default() }),
        ..Default::default()
    }
}

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

    use pd_core::render::RenderOptions;

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

    #[test]
    fn a_slim_pod_tells_the_planner_what_the_whole_pod_does() {
        let mut pdd = pd_api::PDDeployment::new(
            "p",
            serde_json::from_value(serde_json::json!({
                "engine": {"type": "sim"}, "model": {"path": "deepseek-ai/DeepSeek-V3"}, "kvTransfer": {"pageSize": 64},
                "prefill": {"replicas": 1, "parallelism": {"tp": 1}}, "decode": {"replicas": 1, "parallelism": {"tp": 1}},
            }))
            .unwrap(),
        );
        pdd.metadata.namespace = Some("ns".into());
        let rendered = pd_core::render::render(&pdd, &pd_core::model::resolve(&pdd.spec.model, None), &RenderOptions::default()).unwrap();
        let mut pod =
            rendered.pods().find(|p| p.metadata.labels.as_ref().unwrap()[pd_api::labels::LABEL_ROLE] == "decode").unwrap().clone();
        let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(pd_api::labels::DRAINING_SINCE.into(), "2026-12-01T05:00:00Z".into());
        annotations.insert(pd_api::labels::RANK_MAP_ANNOTATION.into(), "[]".into());
        annotations.insert("other".into(), "x".repeat(4096));
        let condition = |type_: &str, status: &str, reason: &str| k8s_openapi::api::core::v1::PodCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(format!("{type_} says {reason}")),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now())),
            ..Default::default()
        };
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![
                condition("PodScheduled", "False", "Unschedulable"),
                condition("Initialized", "True", "Done"),
                condition("Ready", "True", "Ready"),
                condition(pd_api::labels::HANDSHAKE_CONDITION, "False", "PageSizeMismatch"),
            ]),
            container_statuses: Some(vec![ContainerStatus {
                name: pd_core::names::ENGINE_CONTAINER.into(),
                image: "lmsysorg/sglang:v0.5.23".into(),
                restart_count: 2,
                last_state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: 137,
                        reason: Some("OOMKilled".into()),
                        message: Some("x".repeat(4096)),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            init_container_statuses: Some(vec![ContainerStatus { name: SIDECAR_CONTAINER.into(), restart_count: 5, ..Default::default() }]),
            ..Default::default()
        });
        let mut slim = pod.clone();
        slim_pod(&mut slim);
        let observed = plan::ObservedPod::from_pod(&pod).expect("an engine pod");
        assert_eq!(plan::ObservedPod::from_pod(&slim), Some(observed.clone()));
        assert!(observed.ready && observed.unschedulable.is_some() && observed.draining_since.is_some(), "{observed:?}");
        assert!(observed.handshake.as_ref().is_some_and(|h| !h.passed && h.rank_map.is_some()), "{observed:?}");
        assert_eq!((observed.engine_restarts, observed.engine_last_exit.as_deref()), (2, Some("exit code 137 (OOMKilled)")));
        assert_eq!(slim.metadata.labels.as_ref().unwrap()[LABEL_DEPLOYMENT], "p", "children are found by it");
        assert_eq!((&slim.metadata.owner_references, &slim.metadata.uid), (&pod.metadata.owner_references, &pod.metadata.uid));
        let size = |p: &Pod| serde_json::to_vec(p).unwrap().len();
        assert!(size(&slim) * 4 < size(&pod), "slim {} of {} bytes", size(&slim), size(&pod));
    }
}
