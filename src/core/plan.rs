//! Pure planning: given the rendered pods and the pods that exist, decide which pods to create
//! and which to delete. Instances live and die as a group; spec changes roll one instance at a
//! time per role, prefill and decode in step.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodStatus};

use crate::names::{ENGINE_CONTAINER, SIDECAR_CONTAINER};
use crate::pod::Phase;
use crate::render::InstancePods;
use pd_api::conditions::HasStatus;
use pd_api::labels::{
    DRAINING_SINCE, KV_CONTRACT, LABEL_INSTANCE, LABEL_KV_SET, LABEL_NODE_RANK, LABEL_REVISION, LABEL_ROLE, SIDECAR_UPDATED_AT,
};
use pd_api::labels::{HANDSHAKE_CONDITION, RANK_MAP_ANNOTATION};
use pd_api::{Role, RolloutSpec};

const POD_READY: &str = "Ready";
const POD_SCHEDULED: &str = "PodScheduled";
/// The pod labels, annotations and conditions `ObservedPod::from_pod` reads: the controller's pod
/// cache keeps only these (and the deployment label it finds a PDDeployment's pods by).
pub const READ_LABELS: [&str; 5] = [LABEL_ROLE, LABEL_INSTANCE, LABEL_NODE_RANK, LABEL_REVISION, LABEL_KV_SET];
pub const READ_ANNOTATIONS: [&str; 4] = [DRAINING_SINCE, RANK_MAP_ANNOTATION, KV_CONTRACT, SIDECAR_UPDATED_AT];
pub const READ_CONDITIONS: [&str; 3] = [POD_READY, POD_SCHEDULED, HANDSHAKE_CONDITION];

/// What the planner needs to know about an existing engine pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedPod {
    pub name: String,
    pub role: Role,
    pub instance: u32,
    pub node: u32,
    pub revision: String,
    /// Its KV set (`pd.inference.dev/kv-set`; pods from before sets are in set 0).
    pub set: u32,
    /// Its KV contract (`pd.inference.dev/kv-contract`), when it carries one.
    pub contract: Option<String>,
    pub phase: Phase,
    pub deleting: bool,
    /// The pod's own Ready condition: containers and readiness gates.
    pub ready: bool,
    /// Since when it has been Ready (the condition's last transition).
    pub ready_since: Option<jiff::Timestamp>,
    /// The `pd.inference.dev/handshake` pod condition, when set.
    pub handshake: Option<GateCondition>,
    /// The scheduler's reason, while the pod cannot be scheduled.
    pub unschedulable: Option<String>,
    /// Since when the pod has been out of the router's pool, on its way out.
    pub draining_since: Option<jiff::Timestamp>,
    /// The image its handshake sidecar runs (decode pods): the operator release that made it.
    pub sidecar_image: Option<String>,
    /// Whether that sidecar has a startup probe (made before in-place updates; never updated).
    pub sidecar_probed: bool,
    /// When the operator last changed its sidecar's image in place.
    pub sidecar_updated_at: Option<jiff::Timestamp>,
    /// How often the kubelet restarted the engine container in place (its `restartCount`; the
    /// handshake sidecar's restarts are not counted: they leave the engine alone).
    pub engine_restarts: u32,
    /// How the engine container last ended (`exit code 137 (OOMKilled)`), once it restarted.
    pub engine_last_exit: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateCondition {
    pub passed: bool,
    pub reason: String,
    pub message: String,
    /// The rank map the sidecar published with a passed handshake.
    pub rank_map: Option<Vec<pd_api::RankTargets>>,
}

/// The status of a pod's engine container, once the kubelet reported one.
pub fn engine_status(status: &PodStatus) -> Option<&ContainerStatus> {
    status.container_statuses.as_ref()?.iter().find(|c| c.name == ENGINE_CONTAINER)
}

/// How a container last ended, as `exit code N (Reason)`.
fn last_exit(status: &ContainerStatus) -> Option<String> {
    let t = status.last_state.as_ref()?.terminated.as_ref()?;
    Some(match t.reason.as_deref() {
        Some(reason) => format!("exit code {} ({reason})", t.exit_code),
        None => format!("exit code {}", t.exit_code),
    })
}

/// `pod`'s handshake sidecar container, if it has one.
pub fn sidecar(pod: &Pod) -> Option<&Container> {
    pod.spec.as_ref()?.init_containers.as_ref()?.iter().find(|c| c.name == SIDECAR_CONTAINER)
}

/// The image of `pod`'s handshake sidecar, if it has one.
pub fn sidecar_image(pod: &Pod) -> Option<String> {
    sidecar(pod)?.image.clone()
}

/// Gives the current revision to pods pd-operator 0.1.0 labelled with the revision it derived
/// from the same spec and its own image (`render::legacy_role_revision`): the engine they run
/// is the current one. The images tried are the ones this PDDeployment's sidecars run, so
/// prefill pods (which have no sidecar) are recognised by their decode peers' image.
pub fn adopt_legacy(observed: &mut [ObservedPod], current: impl Fn(Role) -> String, legacy: impl Fn(Role, &str) -> Option<String>) {
    let images: BTreeSet<String> = observed.iter().filter_map(|p| p.sidecar_image.clone()).collect();
    for role in [Role::Prefill, Role::Decode] {
        let old: BTreeSet<String> = images.iter().filter_map(|image| legacy(role, image)).collect();
        let now = current(role);
        for p in observed.iter_mut().filter(|p| p.role == role && p.revision != now && old.contains(&p.revision)) {
            p.revision.clone_from(&now);
        }
    }
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
            set: labels.get(LABEL_KV_SET).and_then(|s| s.parse().ok()).unwrap_or(0),
            contract: pod.metadata.annotations.as_ref().and_then(|a| a.get(KV_CONTRACT)).cloned(),
            phase: Phase::of(status.and_then(|s| s.phase.as_deref())),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            ready: condition(POD_READY).is_some_and(HasStatus::is_true),
            ready_since: condition(POD_READY).filter(|c| c.is_true()).and_then(|c| c.last_transition_time.as_ref()).map(|t| t.0),
            draining_since: pod.metadata.annotations.as_ref().and_then(|a| a.get(DRAINING_SINCE)).and_then(|t| t.parse().ok()),
            sidecar_image: sidecar_image(pod),
            sidecar_probed: sidecar(pod).is_some_and(|c| c.startup_probe.is_some()),
            sidecar_updated_at: pod.metadata.annotations.as_ref().and_then(|a| a.get(SIDECAR_UPDATED_AT)).and_then(|t| t.parse().ok()),
            engine_restarts: status.and_then(engine_status).map_or(0, |c| u32::try_from(c.restart_count).unwrap_or(0)),
            engine_last_exit: status.and_then(engine_status).and_then(last_exit),
            unschedulable: condition(POD_SCHEDULED)
                .filter(|c| c.is_false() && c.reason.as_deref() == Some("Unschedulable"))
                .map(|c| c.message.clone().unwrap_or_default()),
            handshake: condition(HANDSHAKE_CONDITION).map(|c| GateCondition {
                passed: c.is_true(),
                reason: c.reason.clone().unwrap_or_default(),
                message: c.message.clone().unwrap_or_default(),
                rank_map: pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(RANK_MAP_ANNOTATION))
                    .and_then(|text| serde_json::from_str(text).ok()),
            }),
        })
    }

    /// A pod as a test sees it: Running and Ready, in set 0, without gate or contract.
    #[cfg(test)]
    pub fn running(role: Role, instance: u32, node: u32, revision: &str) -> Self {
        Self {
            name: format!("{}-{instance}-{node}", role.as_str()),
            role,
            instance,
            node,
            revision: revision.into(),
            set: 0,
            contract: None,
            phase: Phase::Running,
            deleting: false,
            ready: true,
            ready_since: None,
            handshake: None,
            unschedulable: None,
            draining_since: None,
            sidecar_image: None,
            sidecar_probed: false,
            sidecar_updated_at: None,
            engine_restarts: 0,
            engine_last_exit: None,
        }
    }

    fn failed(&self) -> bool {
        self.phase.ended()
    }

    /// Whether the pod can take traffic: its Ready condition, which holds the handshake gate on
    /// decode pods (no Service routes to a pod that is not Ready), and for a decode whose
    /// sidecar reported a failure, not even a Ready that lags behind that report.
    pub fn serving(&self) -> bool {
        self.ready && self.handshake.as_ref().is_none_or(|gate| gate.passed) && self.draining_since.is_none()
    }
}

/// Why the planner deletes an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    ScaleDown,
    /// A pod failed or disappeared, or the engine of a multi-node instance restarted: a
    /// multi-node engine cannot survive a lost or restarted rank.
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

/// An instance to take out of the router's pool before it is deleted.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceDrain {
    pub role: Role,
    pub instance: u32,
    /// Its pods not draining yet.
    pub pods: Vec<String>,
    pub why: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Pods to create, grouped by (role, instance).
    pub creates: Vec<(Role, u32, Vec<Pod>)>,
    pub deletes: Vec<InstanceDelete>,
    pub drains: Vec<InstanceDrain>,
    /// When a later pass has something to do although nothing changes: a draining instance may
    /// be deleted, or a new one has served for `minReadySeconds`.
    pub requeue_in: Option<std::time::Duration>,
}

#[derive(Clone, Debug, Default)]
struct RoleView {
    desired: BTreeMap<u32, Vec<Pod>>,
    /// The surge instances a rollout may add (`rollout.maxSurge`), numbered after `desired`.
    surge: BTreeMap<u32, Vec<Pod>>,
    observed: BTreeMap<u32, Vec<ObservedPod>>,
    revision: String,
    /// Instances below this index keep their revision.
    partition: u32,
    /// How long an instance must have served before the rollout counts it available.
    min_ready: jiff::SignedDuration,
    now: jiff::Timestamp,
}

impl RoleView {
    fn instance_serving(&self, i: u32) -> bool {
        let want = self.desired.get(&i).or_else(|| self.surge.get(&i)).map_or(0, Vec::len);
        let have = self.observed.get(&i);
        have.is_some_and(|pods| pods.len() == want && pods.iter().all(|p| p.serving() && !p.deleting && !p.failed()))
    }
    /// How long instance `i`, serving, still has to before it counts as available (zero: it does).
    fn available_in(&self, i: u32) -> Option<jiff::SignedDuration> {
        let pods = self.observed.get(&i).filter(|_| self.instance_serving(i))?;
        let since = pods.iter().filter_map(|p| p.ready_since).max();
        Some(since.map_or(jiff::SignedDuration::ZERO, |t| (self.min_ready - self.now.duration_since(t)).max(jiff::SignedDuration::ZERO)))
    }
    /// Serving, and for `min_ready`: the rollout may count on it.
    fn instance_ready(&self, i: u32) -> bool {
        self.available_in(i).is_some_and(|left| left.is_zero())
    }
    fn instance_updated(&self, i: u32) -> bool {
        self.observed.get(&i).is_some_and(|pods| !pods.is_empty() && pods.iter().all(|p| p.revision == self.revision))
    }
    /// Instances the rollout updates: those at or above the partition.
    fn eligible(&self) -> impl Iterator<Item = u32> + '_ {
        self.desired.keys().copied().filter(|i| *i >= self.partition)
    }
    /// The share of the instances to update that are updated (1 when there are none).
    fn updated_fraction(&self) -> f64 {
        let n = self.eligible().count();
        if n == 0 { 1.0 } else { self.eligible().filter(|i| self.instance_updated(*i)).count() as f64 / n as f64 }
    }
    /// Whether some instance still has to be updated.
    fn rolling(&self) -> bool {
        self.eligible().any(|i| !self.instance_updated(i))
    }
}

fn view(
    role: Role,
    desired: (&[InstancePods], &[InstancePods]),
    observed: &[ObservedPod],
    rollout: &RolloutSpec,
    now: jiff::Timestamp,
) -> RoleView {
    let min_ready = jiff::SignedDuration::from_secs(i64::from(rollout.min_ready_seconds.max(0)));
    let mut v = RoleView { partition: rollout.partition(role), min_ready, now, ..RoleView::default() };
    for instance in desired.0.iter().filter(|i| i.role == role) {
        v.revision.clone_from(&instance.revision);
        v.desired.insert(instance.index, instance.pods.clone());
    }
    for instance in desired.1.iter().filter(|i| i.role == role) {
        v.surge.insert(instance.index, instance.pods.clone());
    }
    for p in observed.iter().filter(|p| p.role == role) {
        v.observed.entry(p.instance).or_default().push(p.clone());
    }
    v
}

/// Plans one reconcile at `now`; `rollout` bounds how a spec change rolls through each role and
/// how long a leaving instance drains. `surge` are the extra instances a rollout may add.
pub fn plan(
    desired: &[InstancePods],
    surge: &[InstancePods],
    observed: &[ObservedPod],
    rollout: &RolloutSpec,
    now: jiff::Timestamp,
) -> Plan {
    let prefill = view(Role::Prefill, (desired, surge), observed, rollout, now);
    let decode = view(Role::Decode, (desired, surge), observed, rollout, now);
    let max_skew = f64::from(rollout.max_skew.clamp(0, 100)) / 100.0;
    let drain = Drain { period: jiff::SignedDuration::from_secs(i64::from(rollout.drain_seconds.max(0))), now };
    let mut out = Plan::default();
    for (role, v, other) in [(Role::Prefill, &prefill, &decode), (Role::Decode, &decode, &prefill)] {
        RolePlan { role, v, other, max_skew, drain, out: &mut out }.plan(rollout.max_unavailable(role));
    }
    out
}

/// Drains, then deletes, every instance of `observed` (the pods of a KV set the router left);
/// `why` is said of each.
pub fn retire(observed: &[ObservedPod], rollout: &RolloutSpec, now: jiff::Timestamp, why: &str) -> Plan {
    let drain = Drain { period: jiff::SignedDuration::from_secs(i64::from(rollout.drain_seconds.max(0))), now };
    let mut out = Plan::default();
    for role in [Role::Prefill, Role::Decode] {
        let v = view(role, (&[], &[]), observed, rollout, now);
        let mut step = RolePlan { role, v: &v, other: &v, max_skew: 0.0, drain, out: &mut out };
        for (i, pods) in &v.observed {
            step.retire(*i, pods, DeleteReason::Rollout, format!("{} instance {i} {why}", role.as_str()));
        }
    }
    out
}

impl Plan {
    /// Adds `other`'s steps to this plan.
    pub fn merge(&mut self, other: Plan) {
        self.creates.extend(other.creates);
        self.deletes.extend(other.deletes);
        self.drains.extend(other.drains);
        self.requeue_in = match (self.requeue_in, other.requeue_in) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// Plans one role, with the other role's view for rolling in step.
struct RolePlan<'a> {
    role: Role,
    v: &'a RoleView,
    other: &'a RoleView,
    /// How far (a fraction of instances) this role may run ahead of the other.
    max_skew: f64,
    drain: Drain,
    out: &'a mut Plan,
}

/// How long a leaving instance stays out of the router's pool before its pods are deleted.
#[derive(Clone, Copy)]
struct Drain {
    period: jiff::SignedDuration,
    now: jiff::Timestamp,
}

impl RolePlan<'_> {
    fn plan(mut self, max_unavailable: u32) {
        let (unavailable, outdated) = self.repair();
        let (kept, surge_ready) = self.surge(&outdated, unavailable);
        self.scale_down(kept);
        if !self.waits_for_other(&outdated) {
            self.roll(outdated, (max_unavailable + surge_ready).saturating_sub(unavailable), surge_ready);
        }
    }

    /// The surge instances: while outdated instances remain, up to one per outdated instance is
    /// created at the new revision; they stay until every instance serves again, then go.
    /// Returns the surge indices kept and how many of them are available.
    fn surge(&mut self, outdated: &[u32], unavailable: u32) -> (Vec<u32>, u32) {
        let v = self.v;
        let rolling = !outdated.is_empty();
        let (mut kept, mut ready) = (Vec::new(), 0);
        for (i, want) in v.surge.iter().take(if rolling { outdated.len() } else { v.surge.len() }) {
            let have = v.observed.get(i).map(Vec::as_slice).unwrap_or_default();
            // Rolled: a surge instance stays while an instance is still down, and none is added.
            if !rolling && (unavailable == 0 || have.is_empty()) {
                continue;
            }
            kept.push(*i);
            if !self.replace_if_down(*i, want, have) && v.instance_ready(*i) {
                ready += 1;
            }
        }
        (kept, ready)
    }

    fn delete(&mut self, instance: u32, pods: Vec<String>, reason: DeleteReason, why: String) {
        self.out.deletes.push(InstanceDelete { role: self.role, instance, pods, reason, why });
    }

    /// Instances beyond `replicas` go (but the surge instances `kept`), less their pods already
    /// terminating.
    fn scale_down(&mut self, kept: Vec<u32>) {
        let v = self.v;
        for (i, pods) in v.observed.iter().filter(|(i, _)| !v.desired.contains_key(i) && !kept.contains(i)) {
            self.retire(*i, pods, DeleteReason::ScaleDown, format!("{} instance {i} is beyond replicas", self.role.as_str()));
        }
    }

    /// Takes a healthy instance out: first out of the router's pool, then, once it has drained
    /// for the drain period, its pods (less those already terminating).
    fn retire(&mut self, i: u32, pods: &[ObservedPod], reason: DeleteReason, why: String) {
        let live: Vec<&ObservedPod> = pods.iter().filter(|p| !p.deleting).collect();
        let undrained: Vec<String> = live.iter().filter(|p| p.draining_since.is_none()).map(|p| p.name.clone()).collect();
        if live.is_empty() || self.drain.period.is_zero() {
            return self.delete(i, live.iter().map(|p| p.name.clone()).collect(), reason, why);
        }
        if !undrained.is_empty() {
            self.out.drains.push(InstanceDrain { role: self.role, instance: i, pods: undrained, why });
            return;
        }
        let since = live.iter().filter_map(|p| p.draining_since).max().unwrap_or(self.drain.now);
        let left = self.drain.period - self.drain.now.duration_since(since);
        if left.is_positive() {
            self.wake_in(left);
        } else {
            self.delete(i, live.iter().map(|p| p.name.clone()).collect(), reason, why);
        }
    }

    /// Asks for a pass in `left` at the latest.
    fn wake_in(&mut self, left: jiff::SignedDuration) {
        let left = std::time::Duration::try_from(left).unwrap_or_default();
        self.out.requeue_in = Some(self.out.requeue_in.map_or(left, |d| d.min(left)));
    }

    /// Creates missing instances and recreates broken ones; returns how many instances are down
    /// and which run an old revision.
    fn repair(&mut self) -> (u32, Vec<u32>) {
        let v = self.v;
        let (mut unavailable, mut outdated) = (0u32, Vec::new());
        for (i, want) in &v.desired {
            let have = v.observed.get(i).map(Vec::as_slice).unwrap_or_default();
            if self.replace_if_down(*i, want, have) {
                unavailable += 1;
                continue;
            }
            match v.available_in(*i) {
                Some(left) if left.is_zero() => {}
                Some(left) => {
                    self.wake_in(left);
                    unavailable += 1;
                }
                None => unavailable += 1,
            }
            if *i >= v.partition && !v.instance_updated(*i) {
                outdated.push(*i);
            }
        }
        (unavailable, outdated)
    }

    /// Whether instance `i` is down: missing (created now), still terminating, or broken
    /// (deleted now, to be created whole on a later pass).
    fn replace_if_down(&mut self, i: u32, want: &[Pod], have: &[ObservedPod]) -> bool {
        if have.is_empty() {
            self.out.creates.push((self.role, i, want.to_vec()));
            return true;
        }
        if have.iter().any(|p| p.deleting) {
            return true;
        }
        let Some(why) = broken(want, have) else { return false };
        self.delete(i, have.iter().map(|p| p.name.clone()).collect(), DeleteReason::Recreate, why);
        true
    }

    /// Roll in step: a role more than `max_skew` ahead of the other waits for it.
    fn waits_for_other(&self, outdated: &[u32]) -> bool {
        !outdated.is_empty() && self.other.rolling() && self.v.updated_fraction() - self.other.updated_fraction() > self.max_skew
    }

    /// Replaces up to `budget` outdated instances, never the last ready one of a role with several.
    /// An instance already draining goes on (its absence is already counted).
    fn roll(&mut self, outdated: Vec<u32>, mut budget: u32, surge_ready: u32) {
        let v = self.v;
        let mut ready = v.desired.keys().filter(|i| v.instance_ready(**i)).count() + surge_ready as usize;
        for i in outdated {
            let pods = &v.observed[&i];
            let why = format!("{} instance {i} runs an old revision (want {})", self.role.as_str(), v.revision);
            if pods.iter().any(|p| p.draining_since.is_some()) {
                self.retire(i, pods, DeleteReason::Rollout, why);
                continue;
            }
            let is_ready = v.instance_ready(i);
            if budget == 0 || (is_ready && ready <= 1 && v.desired.len() > 1) {
                continue;
            }
            self.retire(i, pods, DeleteReason::Rollout, why);
            budget -= 1;
            ready -= usize::from(is_ready);
        }
    }
}

/// Why an instance must be recreated: a pod failed, a rendered pod no longer exists, or the
/// engine container of a multi-node instance restarted in place. A restarted rank would try to
/// join a torch.distributed group its peers, still waiting in the old one, never re-form: the
/// instance hangs, so it is recreated whole. A single-node engine restarts in place.
fn broken(want: &[Pod], have: &[ObservedPod]) -> Option<String> {
    let failed = || have.iter().find(|p| p.failed()).map(|p| format!("pod {} is {}", p.name, p.phase));
    let missing = || {
        want.iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .find(|n| !have.iter().any(|p| p.name == *n))
            .map(|n| format!("pod {n} disappeared"))
    };
    let multi_node = want.len().max(have.len()) > 1;
    let engine = || have.iter().find(|p| multi_node && p.engine_restarts > 0).map(restarted);
    failed().or_else(missing).or_else(engine)
}

/// `pod {name}: container engine restarted (restartCount N, last exit code 137 (OOMKilled))`.
fn restarted(p: &ObservedPod) -> String {
    let exit = p.engine_last_exit.as_ref().map(|e| format!(", last {e}")).unwrap_or_default();
    format!("pod {}: container {ENGINE_CONTAINER} restarted (restartCount {}{exit})", p.name, p.engine_restarts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_of_the_previous_release_are_adopted_by_their_decode_peers_sidecar_image() {
        let mut observed = vec![have(Role::Prefill, 0, 0, "old-p"), have(Role::Decode, 0, 0, "old-d"), have(Role::Decode, 1, 0, "other")];
        observed[1].sidecar_image = Some("op:1".into());
        let current = |role: Role| format!("new-{}", role.as_str());
        let legacy = |role: Role, image: &str| (image == "op:1").then(|| if role == Role::Prefill { "old-p" } else { "old-d" }.to_owned());
        adopt_legacy(&mut observed, current, legacy);
        let revisions: Vec<&str> = observed.iter().map(|p| p.revision.as_str()).collect();
        assert_eq!(revisions, ["new-prefill", "new-decode", "other"], "a revision no release gave still rolls");
        let mut no_sidecar = vec![have(Role::Prefill, 0, 0, "old-p")];
        adopt_legacy(&mut no_sidecar, current, legacy);
        assert_eq!(no_sidecar[0].revision, "old-p", "without a sidecar image there is nothing to recognise it by");
    }

    /// A rendered instance of `nodes` pods named `{role}-{instance}-{node}`, at `revision`.
    fn want(role: Role, index: u32, nodes: u32, revision: &str) -> InstancePods {
        let pod = |node| {
            let mut pod = Pod::default();
            pod.metadata.name = Some(format!("{}-{index}-{node}", role.as_str()));
            pod
        };
        InstancePods { role, index, revision: revision.into(), pods: (0..nodes).map(pod).collect() }
    }

    /// An existing pod, Running and Ready unless changed.
    fn have(role: Role, instance: u32, node: u32, revision: &str) -> ObservedPod {
        ObservedPod::running(role, instance, node, revision)
    }

    /// `n` one-pod instances per role at `revision`, rendered and running.
    fn steady(prefill: u32, decode: u32, revision: &str) -> (Vec<InstancePods>, Vec<ObservedPod>) {
        let roles = [(Role::Prefill, prefill), (Role::Decode, decode)];
        let desired = roles.iter().flat_map(|(r, n)| (0..*n).map(move |i| want(*r, i, 1, revision))).collect();
        let observed = roles.iter().flat_map(|(r, n)| (0..*n).map(move |i| have(*r, i, 0, revision))).collect();
        (desired, observed)
    }

    /// No drain period: leaving instances are deleted at once.
    fn unavailable(n: i32) -> RolloutSpec {
        RolloutSpec { max_unavailable: n, drain_seconds: 0, ..RolloutSpec::default() }
    }

    fn now() -> jiff::Timestamp {
        "2026-12-01T00:00:00Z".parse().unwrap()
    }

    fn deletes(plan: &Plan) -> Vec<(Role, u32, DeleteReason)> {
        plan.deletes.iter().map(|d| (d.role, d.instance, d.reason)).collect()
    }

    /// Moves `role`'s rendered pods to `revision`.
    fn roll(desired: &mut [InstancePods], role: Role, revision: &str) {
        for instance in desired.iter_mut().filter(|i| i.role == role) {
            instance.revision = revision.into();
        }
    }

    #[test]
    fn a_steady_state_plans_nothing() {
        let (desired, observed) = steady(2, 2, "r1");
        assert_eq!(plan(&desired, &[], &observed, &unavailable(1), now()), Plan::default());
    }

    #[test]
    fn missing_instances_are_created_whole() {
        let desired = vec![want(Role::Prefill, 0, 2, "r1"), want(Role::Decode, 0, 1, "r1")];
        let p = plan(&desired, &[], &[], &unavailable(1), now());
        let created: Vec<(Role, u32, usize)> = p.creates.iter().map(|(r, i, pods)| (*r, *i, pods.len())).collect();
        assert_eq!(created, vec![(Role::Prefill, 0, 2), (Role::Decode, 0, 1)]);
        assert!(p.deletes.is_empty());
    }

    #[test]
    fn instances_beyond_replicas_are_scaled_down_without_their_terminating_pods() {
        let (desired, mut observed) = steady(1, 2, "r1");
        observed.push(have(Role::Decode, 2, 0, "r1"));
        let mut leaving = have(Role::Decode, 3, 0, "r1");
        leaving.deleting = true;
        observed.push(leaving);
        let p = plan(&desired, &[], &observed, &unavailable(1), now());
        assert_eq!(deletes(&p), vec![(Role::Decode, 2, DeleteReason::ScaleDown), (Role::Decode, 3, DeleteReason::ScaleDown)]);
        assert_eq!(p.deletes[0].pods, vec!["decode-2-0".to_owned()]);
        assert!(p.deletes[1].pods.is_empty(), "a pod already terminating is not deleted again");
    }

    #[test]
    fn a_failed_or_vanished_pod_recreates_its_whole_instance() {
        let desired = vec![want(Role::Prefill, 0, 2, "r1"), want(Role::Decode, 0, 1, "r1")];
        let mut failed = have(Role::Prefill, 0, 1, "r1");
        failed.phase = Phase::Failed;
        let p = plan(&desired, &[], &[have(Role::Prefill, 0, 0, "r1"), failed, have(Role::Decode, 0, 0, "r1")], &unavailable(1), now());
        assert_eq!(deletes(&p), vec![(Role::Prefill, 0, DeleteReason::Recreate)]);
        assert_eq!(p.deletes[0].pods.len(), 2, "both ranks go: a multi-node engine cannot survive a lost rank");
        assert!(p.deletes[0].why.contains("prefill-0-1 is Failed"), "{}", p.deletes[0].why);
        // Node 1 vanished: same.
        let p = plan(&desired, &[], &[have(Role::Prefill, 0, 0, "r1"), have(Role::Decode, 0, 0, "r1")], &unavailable(1), now());
        assert_eq!(deletes(&p), vec![(Role::Prefill, 0, DeleteReason::Recreate)]);
        assert!(p.deletes[0].why.contains("prefill-0-1 disappeared"), "{}", p.deletes[0].why);
    }

    /// A two-node prefill and a one-node decode, both running; node `node` of prefill 0 and the
    /// decode's engine restarted `n` times in place.
    fn restarted_in_place(node: u32, n: u32) -> (Vec<InstancePods>, Vec<ObservedPod>) {
        let desired = vec![want(Role::Prefill, 0, 2, "r1"), want(Role::Decode, 0, 1, "r1")];
        let mut observed = vec![have(Role::Prefill, 0, 0, "r1"), have(Role::Prefill, 0, 1, "r1"), have(Role::Decode, 0, 0, "r1")];
        observed[node as usize].engine_restarts = n;
        observed[node as usize].engine_last_exit = Some("exit code 137 (OOMKilled)".into());
        observed[2].engine_restarts = n;
        (desired, observed)
    }

    #[test]
    fn an_engine_restart_in_a_multi_node_instance_recreates_it_whole() {
        let (desired, observed) = restarted_in_place(1, 2);
        let p = plan(&desired, &[], &observed, &unavailable(1), now());
        assert_eq!(deletes(&p), vec![(Role::Prefill, 0, DeleteReason::Recreate)], "the one-node decode restarts in place");
        assert_eq!(p.deletes[0].pods, vec!["prefill-0-0".to_owned(), "prefill-0-1".to_owned()], "every rank goes together");
        assert_eq!(p.deletes[0].why, "pod prefill-0-1: container engine restarted (restartCount 2, last exit code 137 (OOMKilled))");
        assert!(p.creates.is_empty(), "created whole on a later pass, once every rank is gone");
        // The leader's restart counts the same.
        let (desired, observed) = restarted_in_place(0, 1);
        assert_eq!(deletes(&plan(&desired, &[], &observed, &unavailable(1), now())), vec![(Role::Prefill, 0, DeleteReason::Recreate)]);
        // Recreated pods start at restartCount 0: nothing more to do.
        let (desired, observed) = restarted_in_place(1, 0);
        assert_eq!(plan(&desired, &[], &observed, &unavailable(1), now()), Plan::default());
    }

    #[test]
    fn a_restart_of_the_handshake_sidecar_is_no_engine_restart() {
        use k8s_openapi::api::core::v1::PodSpec;
        let status = |name: &str, restarts: i32| ContainerStatus { name: name.into(), restart_count: restarts, ..Default::default() };
        let mut pod = Pod::default();
        pod.metadata.name = Some("decode-0-1".into());
        pod.metadata.labels = Some(
            [(LABEL_ROLE, "decode"), (LABEL_INSTANCE, "0"), (LABEL_NODE_RANK, "1"), (LABEL_REVISION, "r1")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into(),
        );
        pod.spec = Some(PodSpec::default());
        pod.status = Some(PodStatus {
            phase: Some("Running".into()),
            container_statuses: Some(vec![status(ENGINE_CONTAINER, 0)]),
            init_container_statuses: Some(vec![status(SIDECAR_CONTAINER, 3)]),
            ..Default::default()
        });
        let sidecar_restarted = ObservedPod::from_pod(&pod).unwrap();
        assert_eq!(sidecar_restarted.engine_restarts, 0, "the sidecar restarts harmlessly: the engine keeps its group");
        let desired = vec![want(Role::Decode, 0, 2, "r1")];
        let observed = vec![ObservedPod { name: "decode-0-0".into(), node: 0, ..sidecar_restarted.clone() }, sidecar_restarted];
        assert!(plan(&desired, &[], &observed, &unavailable(1), now()).deletes.is_empty());
        pod.status.as_mut().unwrap().container_statuses = Some(vec![status(ENGINE_CONTAINER, 1)]);
        assert_eq!(ObservedPod::from_pod(&pod).unwrap().engine_restarts, 1);
    }

    #[test]
    fn an_instance_still_terminating_is_left_alone() {
        let (desired, mut observed) = steady(1, 1, "r1");
        observed[0].deleting = true;
        assert_eq!(plan(&desired, &[], &observed, &unavailable(1), now()), Plan::default());
    }

    #[test]
    fn a_rollout_replaces_max_unavailable_instances_per_role_at_a_time() {
        let (mut desired, observed) = steady(3, 3, "r1");
        roll(&mut desired, Role::Prefill, "r2");
        roll(&mut desired, Role::Decode, "r2");
        let p = plan(&desired, &[], &observed, &unavailable(1), now());
        assert_eq!(deletes(&p), vec![(Role::Prefill, 0, DeleteReason::Rollout), (Role::Decode, 0, DeleteReason::Rollout)]);
        let p = plan(&desired, &[], &observed, &unavailable(2), now());
        assert_eq!(p.deletes.len(), 4, "two per role: {:?}", deletes(&p));
        // An instance that is down already uses the budget: nothing more goes.
        let mut starting = observed.clone();
        starting[0].ready = false;
        assert!(
            !plan(&desired, &[], &starting, &unavailable(1), now()).deletes.iter().any(|d| d.role == Role::Prefill),
            "{:?}",
            deletes(&plan(&desired, &[], &starting, &unavailable(1), now()))
        );
    }

    #[test]
    fn a_rollout_never_takes_the_last_ready_instance_of_a_role_with_several() {
        let (mut desired, mut observed) = steady(1, 2, "r1");
        roll(&mut desired, Role::Decode, "r2");
        roll(&mut desired, Role::Prefill, "r2");
        observed[1].ready = false; // decode 0 not ready: decode 1 is the last ready one
        // The budget (3, less the one down) would allow both: the guard stops at the last ready one.
        let p = plan(&desired, &[], &observed, &unavailable(3), now());
        let decode: Vec<u32> = p.deletes.iter().filter(|d| d.role == Role::Decode).map(|d| d.instance).collect();
        assert_eq!(decode, vec![0], "only the unready outdated instance goes");
        // A role with a single instance may roll it.
        assert!(p.deletes.iter().any(|d| d.role == Role::Prefill && d.instance == 0));
    }

    #[test]
    fn a_role_ahead_in_the_rollout_waits_for_the_other() {
        let (mut desired, mut observed) = steady(2, 2, "r1");
        roll(&mut desired, Role::Prefill, "r2");
        roll(&mut desired, Role::Decode, "r2");
        // Prefill 0 is on r2 already; decode has not started: prefill waits, decode goes.
        observed[0].revision = "r2".into();
        let p = plan(&desired, &[], &observed, &unavailable(1), now());
        assert_eq!(deletes(&p), vec![(Role::Decode, 0, DeleteReason::Rollout)]);
    }

    #[test]
    fn a_partition_keeps_the_instances_below_it_and_the_other_role_does_not_wait_for_them() {
        let (mut desired, observed) = steady(3, 3, "r1");
        roll(&mut desired, Role::Prefill, "r2");
        roll(&mut desired, Role::Decode, "r2");
        let mut rollout = unavailable(3);
        rollout.prefill.partition = 2;
        let p = plan(&desired, &[], &observed, &rollout, now());
        let prefill: Vec<u32> = p.deletes.iter().filter(|d| d.role == Role::Prefill).map(|d| d.instance).collect();
        assert_eq!(prefill, vec![2], "only prefill 2 is at or above the partition");
        // Prefill 2 done: its rollout is complete, and the decode rolls on without waiting for 0 and 1.
        let mut done = observed.clone();
        done[2].revision = "r2".into();
        let p = plan(&desired, &[], &done, &rollout, now());
        assert!(p.deletes.iter().all(|d| d.role == Role::Decode), "{:?}", deletes(&p));
        assert!(!p.deletes.is_empty());
    }

    #[test]
    fn max_skew_lets_one_role_run_ahead_by_that_share() {
        let (mut desired, mut observed) = steady(4, 4, "r1");
        roll(&mut desired, Role::Prefill, "r2");
        roll(&mut desired, Role::Decode, "r2");
        observed[0].revision = "r2".into(); // prefill 1/4 ahead of decode 0/4
        let prefill_goes = |skew: i32| {
            let rollout = RolloutSpec { max_skew: skew, ..unavailable(1) };
            plan(&desired, &[], &observed, &rollout, now()).deletes.iter().any(|d| d.role == Role::Prefill)
        };
        assert!(!prefill_goes(0), "in step: prefill waits for decode");
        assert!(!prefill_goes(20), "25% ahead is more than 20%");
        assert!(prefill_goes(25), "25% ahead is allowed");
    }

    #[test]
    fn each_role_may_have_its_own_max_unavailable() {
        let (mut desired, observed) = steady(3, 3, "r1");
        roll(&mut desired, Role::Prefill, "r2");
        roll(&mut desired, Role::Decode, "r2");
        let mut rollout = unavailable(1);
        rollout.decode.max_unavailable = Some(3);
        let p = plan(&desired, &[], &observed, &rollout, now());
        let count = |role| p.deletes.iter().filter(|d| d.role == role).count();
        assert_eq!((count(Role::Prefill), count(Role::Decode)), (1, 2), "decode takes 3 but keeps its last ready instance");
    }

    #[test]
    fn a_leaving_instance_drains_for_the_period_before_its_pods_go() {
        let (desired, mut observed) = steady(1, 1, "r1");
        observed.push(have(Role::Decode, 1, 0, "r1"));
        let rollout = RolloutSpec { drain_seconds: 30, ..unavailable(1) };
        // First: out of the pool, nothing deleted yet.
        let p = plan(&desired, &[], &observed, &rollout, now());
        assert!(p.deletes.is_empty(), "{:?}", deletes(&p));
        assert_eq!(
            p.drains.iter().map(|d| (d.role, d.instance, d.pods.clone())).collect::<Vec<_>>(),
            [(Role::Decode, 1, vec!["decode-1-0".to_owned()])]
        );
        // Draining for 10 s: wait 20 s more.
        observed[2].draining_since = Some(now() - jiff::SignedDuration::from_secs(10));
        let p = plan(&desired, &[], &observed, &rollout, now());
        assert!(p.deletes.is_empty() && p.drains.is_empty());
        assert_eq!(p.requeue_in, Some(std::time::Duration::from_secs(20)));
        // 30 s: deleted.
        observed[2].draining_since = Some(now() - jiff::SignedDuration::from_secs(30));
        let p = plan(&desired, &[], &observed, &rollout, now());
        assert_eq!(deletes(&p), vec![(Role::Decode, 1, DeleteReason::ScaleDown)]);
    }

    #[test]
    fn a_draining_instance_is_not_serving_and_uses_the_rollout_budget() {
        let (mut desired, mut observed) = steady(2, 1, "r1");
        roll(&mut desired, Role::Prefill, "r2");
        roll(&mut desired, Role::Decode, "r2");
        observed[2].revision = "r2".into(); // decode done: prefill may go
        let rollout = RolloutSpec { drain_seconds: 30, ..unavailable(1) };
        let p = plan(&desired, &[], &observed, &rollout, now());
        assert_eq!(p.drains.len(), 1, "one prefill drains first: {:?}", p.drains);
        observed[0].draining_since = Some(now());
        assert!(!observed[0].serving(), "a draining pod is out of the pool");
        let p = plan(&desired, &[], &observed, &rollout, now());
        assert!(p.drains.is_empty(), "the budget of 1 is taken by the draining instance: {:?}", p.drains);
    }

    #[test]
    fn a_new_instance_counts_as_available_only_after_min_ready_seconds() {
        let (mut desired, mut observed) = steady(2, 0, "r1");
        roll(&mut desired, Role::Prefill, "r2");
        observed[0] =
            ObservedPod { revision: "r2".into(), ready_since: Some(now() - jiff::SignedDuration::from_secs(4)), ..observed[0].clone() };
        let rollout = RolloutSpec { min_ready_seconds: 10, ..unavailable(1) };
        let p = plan(&desired, &[], &observed, &rollout, now());
        assert!(p.deletes.is_empty() && p.drains.is_empty(), "instance 0 has served 4 s of 10: {p:?}");
        assert_eq!(p.requeue_in, Some(std::time::Duration::from_secs(6)));
        let later = plan(&desired, &[], &observed, &rollout, now() + jiff::SignedDuration::from_secs(6));
        assert_eq!(deletes(&later), vec![(Role::Prefill, 1, DeleteReason::Rollout)]);
    }

    #[test]
    fn a_surge_instance_comes_up_first_and_goes_once_every_instance_serves_again() {
        // One prefill, maxSurge 1, maxUnavailable 0: the role never runs below one instance.
        let (mut desired, mut observed) = steady(1, 1, "r1");
        roll(&mut desired, Role::Prefill, "r2");
        let surge = vec![want(Role::Prefill, 1, 1, "r2")];
        let rollout = RolloutSpec { max_surge: 1, max_unavailable: 0, drain_seconds: 0, ..RolloutSpec::default() };
        let p = plan(&desired, &surge, &observed, &rollout, now());
        let created: Vec<(Role, u32)> = p.creates.iter().map(|(r, i, _)| (*r, *i)).collect();
        assert_eq!((created, deletes(&p)), (vec![(Role::Prefill, 1)], vec![]), "the surge instance first, nothing down");
        // Up but not yet served minReadySeconds: instance 0 stays.
        let fresh = Some(now() - jiff::SignedDuration::from_secs(3));
        observed.push(ObservedPod { ready_since: fresh, ..have(Role::Prefill, 1, 0, "r2") });
        let p = plan(&desired, &surge, &observed, &rollout, now());
        assert!(p.creates.is_empty() && p.deletes.is_empty(), "{p:?}");
        // Available: now instance 0 rolls.
        observed[2].ready_since = Some(now() - jiff::SignedDuration::from_secs(60));
        let p = plan(&desired, &surge, &observed, &rollout, now());
        assert_eq!(deletes(&p), vec![(Role::Prefill, 0, DeleteReason::Rollout)]);
        // Instance 0 back at r2 but still within minReadySeconds: the surge instance stays.
        observed[0] = ObservedPod { ready_since: fresh, ..have(Role::Prefill, 0, 0, "r2") };
        let p = plan(&desired, &surge, &observed, &rollout, now());
        assert!(p.deletes.is_empty(), "{p:?}");
        // Every instance serves: the surge instance goes.
        observed[0].ready_since = None;
        let p = plan(&desired, &surge, &observed, &rollout, now());
        assert_eq!(deletes(&p), vec![(Role::Prefill, 1, DeleteReason::ScaleDown)]);
        assert!(p.creates.is_empty());
    }

    #[test]
    fn with_no_rollout_no_surge_instance_is_made() {
        let (desired, mut observed) = steady(1, 1, "r1");
        let surge = vec![want(Role::Prefill, 1, 1, "r1")];
        let rollout = RolloutSpec { max_surge: 1, max_unavailable: 0, drain_seconds: 0, ..RolloutSpec::default() };
        assert_eq!(plan(&desired, &surge, &observed, &rollout, now()), Plan::default());
        // A crashed instance is recreated; no surge instance is added for it.
        observed[0].phase = Phase::Failed;
        let p = plan(&desired, &surge, &observed, &rollout, now());
        assert!(p.creates.iter().all(|(_, i, _)| *i == 0), "{p:?}");
    }
}
