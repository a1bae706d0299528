//! Where engine pods land: one gang per multi-node instance (Kubernetes' own PodGroup,
//! `scheduling.k8s.io/v1beta1`) and topology (every pod of an instance, and optionally every
//! prefill and decode pod, within one domain of a node label).

use k8s_openapi::api::core::v1::{Affinity, PodAffinity, PodAffinityTerm, PodSchedulingGroup, PodSpec, WeightedPodAffinityTerm};
use k8s_openapi::api::scheduling::v1beta1::{
    GangSchedulingPolicy, PodGroup, PodGroupSchedulingConstraints, PodGroupSchedulingPolicy, PodGroupSpec, TopologyConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};

use super::{LABEL_DEPLOYMENT, LABEL_INSTANCE, LABEL_ROLE, RenderOptions, common_labels, engine_pods, meta};
use crate::api::{Colocation, GangMode, PDDeploymentSpec, Role};

/// Whether multi-node instances are scheduled as gangs.
pub fn gangs(spec: &PDDeploymentSpec, opts: &RenderOptions) -> bool {
    match spec.placement.gang {
        GangMode::Auto => opts.workload_api,
        GangMode::Workload => true,
        GangMode::None => false,
    }
}

/// The PodGroup of instance `i` of `role`: `{name}-{role}-{i}`, like its pods' prefix.
pub fn pod_group_name(name: &str, role: Role, instance: u32) -> String {
    format!("{name}-{}-{instance}", role.as_str())
}

/// One PodGroup per multi-node instance: none of its pods binds until all of them can.
pub(super) fn pod_groups(
    spec: &PDDeploymentSpec,
    name: &str,
    ns: &str,
    owners: &Option<Vec<OwnerReference>>,
    opts: &RenderOptions,
) -> Vec<PodGroup> {
    if !gangs(spec, opts) {
        return Vec::new();
    }
    let topology = spec.placement.topology_key.clone().map(|key| vec![TopologyConstraint { key }]);
    let mut out = Vec::new();
    for role in [Role::Prefill, Role::Decode] {
        let nodes = spec.role(role).nodes_per_instance();
        if nodes < 2 {
            continue;
        }
        for i in 0..spec.instances(role) {
            out.push(PodGroup {
                metadata: meta(pod_group_name(name, role, i), ns, common_labels(name, role.as_str()), owners),
                spec: PodGroupSpec {
                    scheduling_policy: PodGroupSchedulingPolicy {
                        gang: Some(GangSchedulingPolicy { min_count: i32::try_from(nodes).unwrap_or(i32::MAX) }),
                        ..Default::default()
                    },
                    scheduling_constraints: topology.clone().map(|topology| PodGroupSchedulingConstraints { topology: Some(topology) }),
                    ..Default::default()
                },
                status: None,
            });
        }
    }
    out
}

/// Sets an engine pod's gang and topology constraints, on top of the template's own affinity.
pub(super) fn place(spec: &PDDeploymentSpec, name: &str, role: Role, instance: u32, opts: &RenderOptions, pod: &mut PodSpec) {
    let gang = gangs(spec, opts) && spec.role(role).nodes_per_instance() > 1;
    if gang {
        pod.scheduling_group = Some(PodSchedulingGroup { pod_group_name: Some(pod_group_name(name, role, instance)) });
    }
    let Some(key) = spec.placement.topology_key.as_deref() else { return };
    let mut terms = Vec::new();
    // A gang's PodGroup carries the instance's topology constraint; without one, pod affinity to
    // the instance's own pods does (the first pod of an instance may go anywhere).
    if !gang {
        terms.push(term(key, instance_pods(name, role, instance)));
    }
    let engines = engine_pods(name);
    let affinity = pod.affinity.get_or_insert_with(Affinity::default).pod_affinity.get_or_insert_with(PodAffinity::default);
    match spec.placement.colocate {
        Colocation::Required => terms.push(term(key, engines)),
        Colocation::Preferred => affinity
            .preferred_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(WeightedPodAffinityTerm { weight: 100, pod_affinity_term: term(key, engines) }),
        Colocation::None => {}
    }
    if !terms.is_empty() {
        affinity.required_during_scheduling_ignored_during_execution.get_or_insert_with(Vec::new).extend(terms);
    }
}

fn term(key: &str, selector: LabelSelector) -> PodAffinityTerm {
    PodAffinityTerm { label_selector: Some(selector), topology_key: key.to_owned(), ..Default::default() }
}

fn instance_pods(name: &str, role: Role, instance: u32) -> LabelSelector {
    let labels = [(LABEL_DEPLOYMENT, name.to_owned()), (LABEL_ROLE, role.as_str().to_owned()), (LABEL_INSTANCE, instance.to_string())];
    LabelSelector { match_labels: Some(labels.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()), ..Default::default() }
}
