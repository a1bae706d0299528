//! Facts of pods and Jobs as the API reports them, and the pods pd-operator itself runs beside the
//! engines: a pod's phase, a Job's conditions, a container's termination message, and the
//! `restricted` security settings of the operator's own containers.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Capabilities, Pod, PodSpec, SeccompProfile, SecurityContext};
use pd_api::PDDeployment;
use pd_api::conditions::HasStatus;

/// A pod's `status.phase` (absent: `Pending`, as the API treats a pod not yet scheduled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl Phase {
    pub fn of(phase: Option<&str>) -> Self {
        match phase {
            None | Some("Pending") => Phase::Pending,
            Some("Running") => Phase::Running,
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            Some(_) => Phase::Unknown,
        }
    }

    /// Ended: its containers will not run again.
    pub fn ended(self) -> bool {
        matches!(self, Phase::Failed | Phase::Succeeded)
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// A Job condition of `type_` that is True: its message.
pub fn job_condition(job: &Job, type_: &str) -> Option<String> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == type_ && c.is_true()).map(|c| c.message.clone().unwrap_or_default())
}

/// The termination message of `container`, as `parse` reads it, in the newest of `pods` that ended
/// with one `parse` accepts.
pub fn termination_message<'a, T>(pods: &'a [Pod], container: &str, parse: impl Fn(&'a str) -> Option<T>) -> Option<T> {
    let mut ended: Vec<(&Pod, T)> = pods
        .iter()
        .filter_map(|p| {
            let statuses = p.status.as_ref()?.container_statuses.as_ref()?;
            let t = statuses.iter().find(|c| c.name == container)?.state.as_ref()?.terminated.as_ref()?;
            Some((p, parse(t.message.as_deref().filter(|m| !m.trim().is_empty())?)?))
        })
        .collect();
    ended.sort_by_key(|(p, _)| p.metadata.creation_timestamp.clone().map(|t| t.0));
    ended.pop().map(|(_, message)| message)
}

/// The user (and group) pd-operator's own containers run as: the images' `USER` (Dockerfile).
pub const OPERATOR_UID: i64 = 65532;

/// A short CPU-only pod of the operator's beside the engines (the engine dry run, the model's
/// config.json read from its volume): where the prefill pods go and the engine image or the
/// weights are cached (the prefill role's node selector, tolerations, priority class and
/// ServiceAccount, for image pull secrets), with both roles' template annotations; no API
/// token, no service links, never restarted.
pub fn beside_engines(pdd: &PDDeployment) -> (Option<BTreeMap<String, String>>, PodSpec) {
    let (t, d) = (&pdd.spec.prefill.template, &pdd.spec.decode.template);
    let annotations: BTreeMap<String, String> = t.annotations.iter().chain(&d.annotations).map(|(k, v)| (k.clone(), v.clone())).collect();
    let spec = PodSpec {
        restart_policy: Some("Never".into()),
        enable_service_links: Some(false),
        automount_service_account_token: Some(false),
        termination_grace_period_seconds: Some(5),
        node_selector: (!t.node_selector.is_empty()).then(|| t.node_selector.clone()),
        tolerations: (!t.tolerations.is_empty()).then(|| t.tolerations.clone()),
        service_account_name: t.service_account_name.clone(),
        priority_class_name: t.priority_class_name.clone(),
        ..Default::default()
    };
    ((!annotations.is_empty()).then_some(annotations), spec)
}

/// Security settings of containers pd-operator itself runs (`restricted` Pod Security Standard).
pub fn restricted_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(OPERATOR_UID),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
        seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
        ..Default::default()
    }
}
