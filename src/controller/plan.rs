//! Pure planning: given the rendered pods and the pods that exist, decide which pods to create
//! and which to delete. Instances live and die as a group; spec changes roll one instance at a
//! time per role, prefill and decode in step.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::render::{LABEL_INSTANCE, LABEL_NODE_RANK, LABEL_REVISION, LABEL_ROLE};
use crate::validate::Role;

/// What the planner needs to know about an existing engine pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedPod {
    pub name: String,
    pub role: Role,
    pub instance: u32,
    pub node: u32,
    pub revision: String,
    pub phase: String,
    pub deleting: bool,
    /// The pod's own Ready condition: containers and readiness gates.
    pub ready: bool,
    /// The `pd.inference.dev/handshake` pod condition, when set.
    pub handshake: Option<GateCondition>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateCondition {
    pub passed: bool,
    pub reason: String,
    pub message: String,
    /// The rank map the sidecar published with a passed handshake.
    pub rank_map: Option<Vec<crate::api::RankTargets>>,
}

impl ObservedPod {
    pub fn from_pod(pod: &Pod) -> Option<Self> {
        let labels = pod.metadata.labels.as_ref()?;
        let role = match labels.get(LABEL_ROLE)?.as_str() {
            "prefill" => Role::Prefill,
            "decode" => Role::Decode,
            _ => return None,
        };
        let status = pod.status.as_ref();
        let conditions = status.and_then(|s| s.conditions.as_ref());
        let condition = |t: &str| conditions.and_then(|c| c.iter().find(|c| c.type_ == t));
        Some(Self {
            name: pod.metadata.name.clone()?,
            role,
            instance: labels.get(LABEL_INSTANCE)?.parse().ok()?,
            node: labels.get(LABEL_NODE_RANK)?.parse().ok()?,
            revision: labels.get(LABEL_REVISION).cloned().unwrap_or_default(),
            phase: status.and_then(|s| s.phase.clone()).unwrap_or_else(|| "Pending".into()),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            ready: condition("Ready").is_some_and(|c| c.status == "True"),
            handshake: condition(crate::render::HANDSHAKE_CONDITION).map(|c| GateCondition {
                passed: c.status == "True",
                reason: c.reason.clone().unwrap_or_default(),
                message: c.message.clone().unwrap_or_default(),
                rank_map: pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(crate::render::RANK_MAP_ANNOTATION))
                    .and_then(|text| serde_json::from_str(text).ok()),
            }),
        })
    }

    fn failed(&self) -> bool {
        matches!(self.phase.as_str(), "Failed" | "Succeeded")
    }

    /// Whether the pod can take traffic: its Ready condition, which holds the handshake gate on
    /// decode pods (no Service routes to a pod that is not Ready), and for a decode whose
    /// sidecar reported a failure, not even a Ready that lags behind that report.
    pub fn serving(&self) -> bool {
        self.ready && self.handshake.as_ref().is_none_or(|gate| gate.passed)
    }
}

/// Why the planner deletes an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    ScaleDown,
    /// A pod failed or disappeared; a multi-node engine cannot survive a lost rank.
    Recreate,
    Rollout,
}

#[derive(Clone, Debug, PartialEq)]
pub struct InstanceDelete {
    pub role: Role,
    pub instance: u32,
    pub pods: Vec<String>,
    pub reason: DeleteReason,
    pub why: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Pods to create, grouped by (role, instance).
    pub creates: Vec<(Role, u32, Vec<Pod>)>,
    pub deletes: Vec<InstanceDelete>,
}

#[derive(Clone, Debug, Default)]
struct RoleView {
    desired: BTreeMap<u32, Vec<Pod>>,
    observed: BTreeMap<u32, Vec<ObservedPod>>,
    revision: String,
}

impl RoleView {
    fn instance_ready(&self, i: u32) -> bool {
        let (want, have) = (self.desired.get(&i).map_or(0, Vec::len), self.observed.get(&i));
        have.is_some_and(|pods| pods.len() == want && pods.iter().all(|p| p.serving() && !p.deleting && !p.failed()))
    }
    fn instance_updated(&self, i: u32) -> bool {
        self.observed.get(&i).is_some_and(|pods| !pods.is_empty() && pods.iter().all(|p| p.revision == self.revision))
    }
    fn updated_fraction(&self) -> f64 {
        let n = self.desired.len();
        if n == 0 { 1.0 } else { self.desired.keys().filter(|i| self.instance_updated(**i)).count() as f64 / n as f64 }
    }
}

fn pod_label(pod: &Pod, key: &str) -> Option<String> {
    pod.metadata.labels.as_ref()?.get(key).cloned()
}

fn view(role: Role, desired: &[Pod], observed: &[ObservedPod]) -> RoleView {
    let mut v = RoleView::default();
    for pod in desired.iter().filter(|p| pod_label(p, LABEL_ROLE).as_deref() == Some(role.as_str())) {
        let i: u32 = pod_label(pod, LABEL_INSTANCE).and_then(|s| s.parse().ok()).unwrap_or(0);
        v.revision = pod_label(pod, LABEL_REVISION).unwrap_or_default();
        v.desired.entry(i).or_default().push(pod.clone());
    }
    for p in observed.iter().filter(|p| p.role == role) {
        v.observed.entry(p.instance).or_default().push(p.clone());
    }
    v
}

/// Plans one reconcile. `max_unavailable` bounds instances per role down at once during a rollout.
pub fn plan(desired: &[Pod], observed: &[ObservedPod], max_unavailable: u32) -> Plan {
    let views = [view(Role::Prefill, desired, observed), view(Role::Decode, desired, observed)];
    let mut out = Plan::default();
    for (idx, v) in views.iter().enumerate() {
        let role = if idx == 0 { Role::Prefill } else { Role::Decode };
        let other = &views[1 - idx];
        let mut unavailable = 0u32;
        let mut ready = v.desired.keys().filter(|i| v.instance_ready(**i)).count();
        for (i, pods) in &v.observed {
            if !v.desired.contains_key(i) {
                out.deletes.push(InstanceDelete {
                    role,
                    instance: *i,
                    pods: pods.iter().filter(|p| !p.deleting).map(|p| p.name.clone()).collect(),
                    reason: DeleteReason::ScaleDown,
                    why: format!("{} instance {i} is beyond replicas", role.as_str()),
                });
            }
        }
        let mut outdated = Vec::new();
        for (i, want) in &v.desired {
            let have = v.observed.get(i).map(Vec::as_slice).unwrap_or_default();
            if have.is_empty() {
                out.creates.push((role, *i, want.clone()));
                unavailable += 1;
                continue;
            }
            if have.iter().any(|p| p.deleting) {
                unavailable += 1;
                continue;
            }
            let wanted: Vec<String> = want.iter().filter_map(|p| p.metadata.name.clone()).collect();
            let broken = have
                .iter()
                .find(|p| p.failed())
                .map(|p| format!("pod {} is {}", p.name, p.phase))
                .or_else(|| wanted.iter().find(|n| !have.iter().any(|p| &&p.name == n)).map(|n| format!("pod {n} disappeared")));
            if let Some(why) = broken {
                out.deletes.push(InstanceDelete {
                    role,
                    instance: *i,
                    pods: have.iter().map(|p| p.name.clone()).collect(),
                    reason: DeleteReason::Recreate,
                    why,
                });
                unavailable += 1;
                continue;
            }
            if !v.instance_ready(*i) {
                unavailable += 1;
            }
            if !v.instance_updated(*i) {
                outdated.push(*i);
            }
        }
        // Roll in step: a role that is ahead of the other waits for it.
        if !outdated.is_empty()
            && v.updated_fraction() > other.updated_fraction()
            && other.desired.keys().any(|i| !other.instance_updated(*i))
        {
            continue;
        }
        let mut budget = max_unavailable.max(1).saturating_sub(unavailable);
        for i in outdated {
            if budget == 0 {
                break;
            }
            let is_ready = v.instance_ready(i);
            // Never take a role to zero ready instances while it has some (unless it has one).
            if is_ready && ready <= 1 && v.desired.len() > 1 {
                break;
            }
            out.deletes.push(InstanceDelete {
                role,
                instance: i,
                pods: v.observed[&i].iter().map(|p| p.name.clone()).collect(),
                reason: DeleteReason::Rollout,
                why: format!("{} instance {i} runs an old revision (want {})", role.as_str(), v.revision),
            });
            budget -= 1;
            if is_ready {
                ready -= 1;
            }
        }
    }
    out
}
