//! Pure status computation. Condition timestamps change only on a real transition, so a
//! reconcile that observes nothing new produces an identical status (and writes nothing).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::plan::ObservedPod;
use pd_api::Role;
use pd_api::conditions::{HasStatus, Status};
use pd_api::{DecodeRankMap, Endpoints, InstanceEndpoint, PDDeployment, PDDeploymentStatus, RoleStatus};

pub const READY: &str = "Ready";
pub const VALIDATED: &str = "Validated";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
pub const PREFILL_AVAILABLE: &str = "PrefillAvailable";
pub const DECODE_AVAILABLE: &str = "DecodeAvailable";
pub const HANDSHAKE_READY: &str = "HandshakeReady";
/// The engine dry run's verdict on the spec's processes (`spec.engine.dryRun`).
pub const ENGINE_VERIFIED: &str = "EngineVerified";

/// Everything the status is computed from.
pub struct StatusInputs<'a> {
    pub pdd: &'a PDDeployment,
    /// The newest status known (the controller's own last write beats a lagging cache).
    pub previous: Option<&'a PDDeploymentStatus>,
    /// `Err(message)` when the spec failed validation.
    pub validation: Result<(), String>,
    pub observed: &'a [ObservedPod],
    /// Pods per instance of each role, from the rendered layout.
    pub nodes: (u32, u32),
    /// Revision each role should run.
    pub revisions: (&'a str, &'a str),
    /// Ready router replicas, or None when the router is disabled.
    pub router_ready: Option<i32>,
    /// Recreations under way, instances left down and the recreations that count (`recovery`).
    pub recovery: crate::recovery::Standing,
    /// The KV sets (`observed` holds the routed set's pods).
    pub kv_set: Option<pd_api::KvSetStatus>,
    /// The page size both roles run with (`Rendered::page_size`), once rendered.
    pub page_size: Option<u32>,
    /// Each role's count as decided from the asks (`scaling::scale`), once the spec is valid:
    /// `pdd` then runs those counts, and the `ScalingLimited` condition reports any clamp.
    pub scaling: Option<&'a crate::scaling::Scaled>,
    /// The engine dry run's verdict (or the one under way), `None` when none ran.
    pub engine_verification: Option<pd_api::EngineVerification>,
    /// Whether a Hub source's config.json was read (`None` for specs without one).
    pub model_config: Option<crate::model_read::Resolution>,
    /// The fetch of a cached Hub source (`None` for specs without one).
    pub model_fetch: Option<crate::model_fetch::Fetch>,
    pub now: Time,
}

struct RoleCount {
    replicas: i32,
    ready: i32,
    updated: i32,
    /// Instances the rollout leaves at their revision (`rollout.<role>.partition`).
    kept: i32,
    update_revision: String,
    current_revision: String,
}

fn count(inputs: &StatusInputs, role: Role) -> RoleCount {
    let (nodes, revision) = match role {
        Role::Prefill => (inputs.nodes.0, inputs.revisions.0),
        Role::Decode => (inputs.nodes.1, inputs.revisions.1),
    };
    let replicas = i32::try_from(inputs.pdd.spec.instances(role)).unwrap_or(i32::MAX);
    let (mut ready, mut updated) = (0, 0);
    // The observed pods by instance: the work follows the pods, not the count the spec asks for.
    for pods in live_pods_by_instance(inputs, role).values() {
        let complete = pods.len() == nodes as usize;
        if complete && pods.iter().all(|p| p.serving() && p.phase == crate::pod::Phase::Running) {
            ready += 1;
        }
        if complete && pods.iter().all(|p| p.revision == revision) {
            updated += 1;
        }
    }
    let kept = i32::try_from(inputs.pdd.spec.rollout.partition(role)).unwrap_or(i32::MAX).min(replicas);
    let current_revision = current_revision(inputs, role, revision);
    RoleCount { replicas, ready, updated, kept, update_revision: revision.to_owned(), current_revision }
}

/// The revision the role's instances run that is not the update revision (the most pods'), or the
/// update revision once every pod runs it.
fn current_revision(inputs: &StatusInputs, role: Role, update: &str) -> String {
    let mut pods_per_revision: BTreeMap<&str, usize> = BTreeMap::new();
    for p in inputs.observed.iter().filter(|p| p.role == role && !p.deleting && p.revision != update) {
        *pods_per_revision.entry(p.revision.as_str()).or_default() += 1;
    }
    pods_per_revision.into_iter().max_by_key(|(_, n)| *n).map_or_else(|| update.to_owned(), |(r, _)| r.to_owned())
}

fn cond(type_: &str, ok: Option<bool>, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.into(),
        status: ok.map_or(Status::Unknown, Status::from).as_str().into(),
        reason: reason.into(),
        message,
        last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

fn availability(role: Role, c: &RoleCount, max_unavailable: i32) -> (Option<bool>, &'static str, String) {
    let name = role.as_str();
    if c.replicas == 0 {
        return (Some(false), "ScaledToZero", format!("{name} has 0 replicas"));
    }
    let needed = (c.replicas - max_unavailable).max(1);
    if c.ready >= needed {
        (Some(true), "MinimumInstancesAvailable", format!("{} of {} {name} instances ready", c.ready, c.replicas))
    } else {
        (Some(false), "InstancesNotReady", format!("{} of {} {name} instances ready; {needed} needed", c.ready, c.replicas))
    }
}

fn handshake(observed: &[ObservedPod]) -> (Option<bool>, String, String) {
    let decode: Vec<&ObservedPod> = observed.iter().filter(|p| p.role == Role::Decode && !p.deleting).collect();
    if decode.is_empty() {
        return (None, "NoDecodePods".into(), "no decode pod runs yet".into());
    }
    if let Some(p) = decode.iter().find(|p| p.handshake.as_ref().is_some_and(|h| !h.passed)) {
        let h = p.handshake.as_ref().unwrap();
        let reason = if h.reason.is_empty() { "HandshakeFailed".to_owned() } else { h.reason.clone() };
        return (Some(false), reason, format!("{}: {}", p.name, h.message));
    }
    let pending: Vec<&str> = decode.iter().filter(|p| p.handshake.is_none()).map(|p| p.name.as_str()).collect();
    if !pending.is_empty() {
        return (None, "WaitingForHandshake".into(), format!("no handshake result yet from {}", pending.join(", ")));
    }
    (
        Some(true),
        "HandshakeSucceeded".into(),
        format!("all {} decode pods passed SGLang's bootstrap handshake against every prefill", decode.len()),
    )
}

fn lost_reason(role: Role) -> &'static str {
    match role {
        Role::Prefill => "NoPrefillReady",
        Role::Decode => "NoDecodeReady",
    }
}

/// A role that served and now has no ready instance (while it should have some): it stays lost
/// until one is ready again. A role that never served yet is coming up, not lost.
fn role_lost(previous: Option<&PDDeploymentStatus>, role: Role, c: &RoleCount) -> bool {
    let Some(previous) = previous else { return false };
    let served = match role {
        Role::Prefill => previous.prefill.ready_replicas > 0,
        Role::Decode => previous.decode.ready_replicas > 0,
    };
    let still = previous.conditions.iter().any(|x| x.type_ == DEGRADED && x.is_true() && x.reason == lost_reason(role));
    c.replicas > 0 && c.ready == 0 && (served || still)
}

/// The first pod the scheduler cannot place, as `<role> instance <i> cannot be scheduled: <why>`.
fn unschedulable(observed: &[ObservedPod]) -> Option<String> {
    let p = observed.iter().find(|p| p.unschedulable.is_some() && !p.deleting)?;
    let why = p.unschedulable.as_deref().unwrap_or_default();
    Some(format!("{} instance {} cannot be scheduled: {why}", p.role.as_str(), p.instance))
}

/// Units present (the `/scale` status replicas): per role with instances in a unit, the instances
/// that have pods not being deleted, divided by that role's instances per unit; the fewer.
fn units(inputs: &StatusInputs) -> i32 {
    let spec = &inputs.pdd.spec;
    // With the counts decided, `pdd` runs them as one unit: the units are the declared ones.
    let declared = |role: Role| inputs.scaling.map_or_else(|| u32::try_from(spec.role(role).replicas).unwrap_or(0), |s| s.per_unit(role));
    let per_role = [Role::Prefill, Role::Decode].into_iter().filter_map(|role| {
        let per_unit = Some(declared(role)).filter(|n| *n > 0)?;
        let present: std::collections::BTreeSet<u32> =
            inputs.observed.iter().filter(|p| p.role == role && !p.deleting).map(|p| p.instance).collect();
        Some(u32::try_from(present.len()).unwrap_or(u32::MAX) / per_unit)
    });
    per_role.min().map_or(spec.replicas, |u| i32::try_from(u).unwrap_or(i32::MAX))
}

/// The PDDeployment's engine pods as a label selector string.
fn engine_selector(pdd: &PDDeployment) -> String {
    crate::names::engine_selector(pdd.metadata.name.as_deref().unwrap_or_default()).to_string()
}

/// The leaders of the KV set `set` (the one the router pairs).
fn endpoints(pdd: &PDDeployment, set: u32) -> Endpoints {
    let name = pdd.metadata.name.clone().unwrap_or_default();
    let ns = pdd.metadata.namespace.clone().unwrap_or_default();
    let port = pd_api::DEFAULT_HTTP_PORT;
    let instances = |role: Role, bootstrap: bool| -> Vec<InstanceEndpoint> {
        (0..pdd.spec.instances(role))
            .map(|i| InstanceEndpoint {
                instance: i,
                http: format!("http://{}:{port}", crate::names::leader_host(&name, &ns, role, i, set)),
                bootstrap: bootstrap.then(|| crate::names::bootstrap_address(&name, &ns, i, pdd.spec.kv_transfer.bootstrap_port, set)),
            })
            .collect()
    };
    Endpoints {
        router: pdd.spec.router.enabled.then(|| format!("http://{}.{ns}.svc:{}", crate::names::router_name(&name), pdd.spec.router.port)),
        prefill: instances(Role::Prefill, true),
        decode: instances(Role::Decode, false),
    }
}

/// Carries lastTransitionTime over from `previous` when a condition's status did not change.
fn merge(previous: &[Condition], mut next: Vec<Condition>, now: &Time, generation: Option<i64>) -> Vec<Condition> {
    for c in &mut next {
        c.observed_generation = generation;
        c.last_transition_time = match previous.iter().find(|p| p.type_ == c.type_) {
            Some(p) if p.status == c.status => p.last_transition_time.clone(),
            _ => now.clone(),
        };
    }
    next
}

pub fn compute(inputs: &StatusInputs) -> PDDeploymentStatus {
    let pdd = inputs.pdd;
    let generation = pdd.metadata.generation;
    let previous = inputs.previous.map(|s| s.conditions.clone()).unwrap_or_default();
    let (p, d) = (count(inputs, Role::Prefill), count(inputs, Role::Decode));
    let mut conditions = Vec::new();
    let waiting = unresolved(inputs);
    let valid = inputs.validation.is_ok() && !waiting;
    if let Some(m) = &inputs.model_config {
        let (resolved, reason, message) = m.condition();
        conditions.push(cond(crate::model_read::CONDITION, Some(resolved), reason, message));
    }
    if let Some(f) = &inputs.model_fetch {
        let (ready, reason, message) = f.condition();
        conditions.push(cond(crate::model_fetch::CONDITION, Some(ready), reason, message));
    }
    conditions.push(match &inputs.validation {
        // The rules are not run on a guess: the spec is neither valid nor invalid yet.
        _ if waiting => {
            cond(VALIDATED, None, "ModelConfigUnresolved", "waiting for the model's config.json (see ModelConfigResolved)".into())
        }
        Ok(()) => {
            let release = crate::release::release_of(&inputs.pdd.spec);
            cond(VALIDATED, Some(true), "Valid", format!("the spec passes every SGLang {release} rule pd-operator knows"))
        }
        Err(m) => cond(VALIDATED, Some(false), "InvalidSpec", m.clone()),
    });
    let unavailable = |role| i32::try_from(pdd.spec.rollout.max_unavailable(role)).unwrap_or(i32::MAX);
    let (pa, pr, pm) = availability(Role::Prefill, &p, unavailable(Role::Prefill));
    let (da, dr, dm) = availability(Role::Decode, &d, unavailable(Role::Decode));
    conditions.push(cond(PREFILL_AVAILABLE, pa, pr, pm));
    conditions.push(cond(DECODE_AVAILABLE, da, dr, dm));
    let (ha, hr, hm) = handshake(inputs.observed);
    conditions.push(cond(HANDSHAKE_READY, ha, &hr, hm));
    conditions.push(engine_verified(inputs));
    conditions.push(progressing(inputs, valid, &p, &d));
    if let Some(scaled) = inputs.scaling {
        let (limited, reason, message) = scaled.condition();
        conditions.push(cond(crate::scaling::SCALING_LIMITED, Some(limited), reason, message));
    }
    conditions.push(degraded(inputs, valid, &p, &d));
    let router_ok = inputs.router_ready.is_none_or(|r| r > 0);
    let fetching = inputs.model_fetch.as_ref().is_some_and(|f| !f.ready);
    conditions.push(ready((waiting, fetching), valid, [pa, da, ha], router_ok));
    let role_status = |c: &RoleCount| RoleStatus {
        replicas: c.replicas,
        ready_replicas: c.ready,
        updated_replicas: c.updated,
        ready: format!("{}/{}", c.ready, c.replicas),
        current_revision: c.current_revision.clone(),
        update_revision: c.update_revision.clone(),
    };
    PDDeploymentStatus {
        observed_generation: generation,
        replicas: units(inputs),
        selector: engine_selector(pdd),
        conditions: merge(&previous, conditions, &inputs.now, generation),
        prefill: role_status(&p),
        decode: role_status(&d),
        endpoints: valid.then(|| endpoints(pdd, inputs.kv_set.as_ref().map_or(0, |k| k.routed))),
        rank_map: rank_map(inputs),
        kv_set: inputs.kv_set.clone(),
        page_size: inputs.page_size.filter(|_| valid),
        engine_verification: inputs.engine_verification.clone(),
        // The planner writes status.autoscaling under its own field manager (pd_core::planner):
        // this apply never owns it, so leaves it alone.
        autoscaling: None,
        model: inputs.model_fetch.as_ref().map(|f| f.status.clone()),
        recoveries: inputs.recovery.counted.clone(),
    }
}

/// `Ready`: valid, the weights in place, both roles available, every decode past the handshake
/// and the router up; otherwise the first of those that is not.
fn ready((waiting, fetching): (bool, bool), valid: bool, [prefill, decode, handshake]: [Option<bool>; 3], router_ok: bool) -> Condition {
    let not_ready_because = if waiting {
        "ModelConfigUnresolved"
    } else if !valid {
        "InvalidSpec"
    } else if fetching && prefill != Some(true) {
        "ModelNotReady"
    } else if prefill != Some(true) {
        "PrefillUnavailable"
    } else if decode != Some(true) {
        "DecodeUnavailable"
    } else if handshake != Some(true) {
        "HandshakePending"
    } else if !router_ok {
        "RouterUnavailable"
    } else {
        return cond(READY, Some(true), "Ready", "prefill and decode serve, every decode passed the handshake, the router is up".into());
    };
    cond(READY, Some(false), not_ready_because, "see the other conditions".into())
}

/// A Hub source whose config.json is not read: nothing is judged or rolled out on a guess.
fn unresolved(inputs: &StatusInputs) -> bool {
    inputs.model_config.as_ref().is_some_and(|m| !m.resolved)
}

/// `EngineVerified`: the dry run's verdict. True: SGLang accepts every process; False: it
/// refused one, or (under `Required`) gave no verdict; Unknown: under way, skipped or not run.
fn engine_verified(inputs: &StatusInputs) -> Condition {
    use crate::dryrun::{PENDING, REFUSED, VERIFIED};
    let policy = inputs.pdd.spec.engine.dry_run_policy();
    if policy == pd_api::DryRunPolicy::Off {
        return cond(ENGINE_VERIFIED, None, "Skipped", "spec.engine.dryRun is Off (the default for the sim engine)".into());
    }
    let Some(v) = &inputs.engine_verification else {
        return cond(ENGINE_VERIFIED, None, "NotRun", "no engine pod has had to be created since the dry run was enabled".into());
    };
    let status = match v.result.as_str() {
        VERIFIED => Some(true),
        REFUSED => Some(false),
        PENDING => None,
        _ if policy == pd_api::DryRunPolicy::BestEffort => None,
        _ => Some(false),
    };
    cond(ENGINE_VERIFIED, status, &v.result, v.message.clone())
}

/// `Progressing`: False once every instance runs the update revision (above each partition) and is
/// ready, and no extra instance is left; True with the counts, or the scheduler's reason, before.
fn progressing(inputs: &StatusInputs, valid: bool, p: &RoleCount, d: &RoleCount) -> Condition {
    let converged = [p, d].iter().all(|c| c.updated >= c.replicas - c.kept && c.ready == c.replicas);
    let extra = inputs.observed.iter().any(|o| {
        let replicas = if o.role == Role::Prefill { p.replicas } else { d.replicas };
        o.instance as i32 >= replicas
    });
    if unresolved(inputs) {
        return cond(
            PROGRESSING,
            Some(false),
            "ModelConfigUnresolved",
            "no engine pod is created until the model's config.json is read".into(),
        );
    }
    if !valid {
        return cond(PROGRESSING, Some(false), "InvalidSpec", "nothing is rolled out while the spec is invalid".into());
    }
    if let Some(v) = inputs.engine_verification.as_ref().filter(|v| v.result == crate::dryrun::PENDING) {
        return cond(PROGRESSING, Some(true), "EngineDryRun", v.message.clone());
    }
    if let Some(v) = inputs.engine_verification.as_ref().filter(|v| v.result == crate::dryrun::REFUSED) {
        return cond(PROGRESSING, Some(false), "EngineRefused", format!("no engine pod is created: {}", v.message));
    }
    if let Some(k) = inputs.kv_set.as_ref().filter(|k| k.target != k.routed) {
        let note = format!(
            "KV set {} comes up beside set {}, which the router pairs until set {} is whole ({}): {}",
            k.target, k.routed, k.target, k.strategy, k.message
        );
        return cond(PROGRESSING, Some(true), "KvSetSurge", note);
    }
    if converged && !extra {
        return cond(PROGRESSING, Some(false), "Complete", "every instance runs the current revision and is ready".into());
    }
    let counts = format!(
        "prefill {}/{} updated, {} ready; decode {}/{} updated, {} ready",
        p.updated, p.replicas, p.ready, d.updated, d.replicas, d.ready
    );
    match unschedulable(inputs.observed) {
        Some(why) => cond(PROGRESSING, Some(true), "InstancesUnschedulable", format!("{why}; {counts}")),
        None => cond(PROGRESSING, Some(true), "InstancesUpdating", counts),
    }
}

/// `Degraded`: an instance spent its recovery budget and is left down, a role that served has no
/// ready instance, an instance is being recreated, or the spec is invalid.
fn degraded(inputs: &StatusInputs, valid: bool, p: &RoleCount, d: &RoleCount) -> Condition {
    if let Some(why) = &inputs.recovery.held {
        return cond(DEGRADED, Some(true), crate::recovery::EXHAUSTED, why.clone());
    }
    let lost = [(Role::Prefill, p), (Role::Decode, d)].into_iter().find(|(role, c)| role_lost(inputs.previous, *role, c));
    match (&inputs.recovery.recreating, lost) {
        (_, Some((role, _))) => cond(
            DEGRADED,
            Some(true),
            lost_reason(role),
            format!("no {} instance is ready: its partners have nobody to pair with until one is", role.as_str()),
        ),
        (Some(why), None) => cond(DEGRADED, Some(true), "InstanceRecreated", why.clone()),
        (None, None) if unresolved(inputs) => {
            cond(DEGRADED, Some(true), "ModelConfigUnresolved", "the model's config.json is not read; see ModelConfigResolved".into())
        }
        (None, None) if !valid => cond(DEGRADED, Some(true), "InvalidSpec", "the spec is invalid; see the Validated condition".into()),
        (None, None) => cond(DEGRADED, Some(false), "AsExpected", "no instance is failing".into()),
    }
}

/// An Event's type (Kubernetes' `Normal` or `Warning`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Normal,
    Warning,
}

/// The Event to publish when `HandshakeReady` changes status or reason: (type, reason, note).
pub fn handshake_transition(previous: Option<&PDDeploymentStatus>, next: &PDDeploymentStatus) -> Option<(EventKind, String, String)> {
    let find = |s: &PDDeploymentStatus| s.conditions.iter().find(|c| c.type_ == HANDSHAKE_READY).cloned();
    let now = find(next)?;
    let before = previous.and_then(find);
    if before.as_ref().is_some_and(|b| b.status == now.status && b.reason == now.reason) || now.status == "Unknown" {
        return None;
    }
    let type_ = if now.is_true() { EventKind::Normal } else { EventKind::Warning };
    Some((type_, now.reason.clone(), now.message.clone()))
}

/// The Event to publish when a rollout takes a path or the router moves: (reason, note).
pub fn rollout_transition(previous: Option<&PDDeploymentStatus>, next: &PDDeploymentStatus) -> Option<(&'static str, String)> {
    let (before, now) = (previous.and_then(|p| p.kv_set.as_ref()), next.kv_set.as_ref()?);
    if now.target != now.routed && before.is_none_or(|b| b.target != now.target) {
        let note = format!(
            "the new revisions cannot pair with KV set {} ({}): set {} comes up beside it, and the router moves to it once it is whole",
            now.routed, now.message, now.target
        );
        return Some(("RolloutSurge", note));
    }
    if let Some(b) = before.filter(|b| b.routed != now.routed) {
        return Some(("RouterMoved", format!("the router pairs KV set {} now; set {} drains and goes", now.routed, b.routed)));
    }
    let revisions = |s: &PDDeploymentStatus| (s.prefill.update_revision.clone(), s.decode.update_revision.clone());
    let changed = previous.is_some_and(|p| !p.prefill.update_revision.is_empty() && revisions(p) != revisions(next));
    (changed && now.target == now.routed).then(|| {
        let note = format!(
            "the new revisions pass the handshake with KV set {}'s running pods both ways (new decode with running prefill, running decode with new prefill): they roll in place",
            now.target
        );
        ("RolloutInPlace", note)
    })
}

/// The pods of `role` not being deleted, by instance, for the instances the spec runs.
fn live_pods_by_instance<'a>(inputs: &StatusInputs<'a>, role: Role) -> BTreeMap<u32, Vec<&'a ObservedPod>> {
    let instances = inputs.pdd.spec.instances(role);
    let mut out: BTreeMap<u32, Vec<&ObservedPod>> = BTreeMap::new();
    for p in inputs.observed.iter().filter(|p| p.role == role && p.instance < instances && !p.deleting) {
        out.entry(p.instance).or_default().push(p);
    }
    out
}

/// Per decode instance, the rank map its sidecar published with a passed handshake.
fn rank_map(inputs: &StatusInputs) -> Vec<DecodeRankMap> {
    live_pods_by_instance(inputs, Role::Decode)
        .into_iter()
        .filter_map(|(i, pods)| {
            let published = pods.iter().find_map(|p| {
                let h = p.handshake.as_ref().filter(|h| h.passed)?;
                h.rank_map.clone()
            })?;
            Some(DecodeRankMap { decode_instance: i, ranks: published })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::GateCondition;
    use pd_api::RankTargets;

    fn pdd() -> PDDeployment {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "pd.inference.dev/v1alpha1", "kind": "PDDeployment",
            "metadata": {"name": "x", "namespace": "ns"},
            "spec": {"model": {"path": "deepseek-ai/DeepSeek-V3"}, "prefill": {"replicas": 1, "parallelism": {"tp": 4}},
                     "decode": {"replicas": 2, "parallelism": {"tp": 2}}}
        }))
        .unwrap()
    }

    fn decode_pod(instance: u32, passed: Option<bool>, map: Option<Vec<RankTargets>>) -> ObservedPod {
        ObservedPod {
            name: format!("x-decode-{instance}-0"),
            ready: passed == Some(true),
            handshake: passed.map(|passed| GateCondition { passed, reason: String::new(), message: String::new(), rank_map: map }),
            ..ObservedPod::running(Role::Decode, instance, 0, "")
        }
    }

    fn with_handshake(status: &str, reason: &str) -> PDDeploymentStatus {
        PDDeploymentStatus {
            conditions: vec![cond(HANDSHAKE_READY, None, reason, "m".into())]
                .into_iter()
                .map(|mut c| {
                    c.status = status.into();
                    c
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn an_event_only_when_the_handshake_condition_changes() {
        let failing = with_handshake("False", "PageSizeMismatch");
        let passing = with_handshake("True", "HandshakeSucceeded");
        assert!(handshake_transition(Some(&failing), &failing).is_none());
        assert!(handshake_transition(None, &with_handshake("Unknown", "WaitingForHandshake")).is_none());
        let (type_, reason, _) = handshake_transition(Some(&failing), &passing).unwrap();
        assert_eq!((type_, reason.as_str()), (EventKind::Normal, "HandshakeSucceeded"));
        let (type_, reason, _) = handshake_transition(None, &failing).unwrap();
        assert_eq!((type_, reason.as_str()), (EventKind::Warning, "PageSizeMismatch"));
    }

    /// Inputs for single-pod instances at the current revision.
    fn one_pod_instances<'a>(pdd: &'a PDDeployment, observed: &'a [ObservedPod]) -> StatusInputs<'a> {
        StatusInputs {
            pdd,
            previous: None,
            validation: Ok(()),
            observed,
            nodes: (1, 1),
            engine_verification: None,
            revisions: ("", ""),
            router_ready: None,
            recovery: Default::default(),
            kv_set: None,
            page_size: None,
            scaling: None,
            model_config: None,
            model_fetch: None,
            now: Time(jiff::Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn an_unread_model_config_leaves_the_spec_unjudged_and_nothing_rolled_out() {
        let pdd = pdd();
        let failed = crate::model_read::Resolution { resolved: false, reason: "ConfigNotFound".into(), message: "GET u: HTTP 404".into() };
        let status = compute(&StatusInputs {
            validation: Err("GET u: HTTP 404".into()),
            model_config: Some(failed),
            ..one_pod_instances(&pdd, &[])
        });
        let c = |t: &str| status.conditions.iter().find(|c| c.type_ == t).map(|c| (c.status.clone(), c.reason.clone())).unwrap();
        assert_eq!(c(crate::model_read::CONDITION), ("False".into(), "ConfigNotFound".into()));
        assert_eq!(c(VALIDATED), ("Unknown".into(), "ModelConfigUnresolved".into()));
        assert_eq!(c(PROGRESSING), ("False".into(), "ModelConfigUnresolved".into()));
        assert_eq!(c(READY), ("False".into(), "ModelConfigUnresolved".into()));
        assert!(status.endpoints.is_none());
        let read = crate::model_read::Resolution { resolved: true, reason: "Resolved".into(), message: "read".into() };
        let status = compute(&StatusInputs { model_config: Some(read), ..one_pod_instances(&pdd, &[]) });
        let c = |t: &str| status.conditions.iter().find(|c| c.type_ == t).map(|c| c.status.clone()).unwrap();
        assert_eq!((c(crate::model_read::CONDITION), c(VALIDATED)), ("True".into(), "True".into()));
    }

    #[test]
    fn a_fetch_under_way_shows_its_figures_and_holds_ready_with_its_own_reason() {
        let pdd = pdd();
        let fetching = crate::model_fetch::Fetch {
            status: pd_api::ModelFetchStatus {
                phase: "Fetching".into(),
                bytes: 5,
                total_bytes: 10,
                files: 1,
                total_files: 2,
                job: "j".into(),
            },
            ready: false,
            reason: "Fetching".into(),
            message: "5 of 10 bytes".into(),
        };
        let status = compute(&StatusInputs { model_fetch: Some(fetching.clone()), ..one_pod_instances(&pdd, &[]) });
        let c = |s: &PDDeploymentStatus, t: &str| {
            s.conditions.iter().find(|c| c.type_ == t).map(|c| (c.status.clone(), c.reason.clone())).unwrap()
        };
        assert_eq!(c(&status, crate::model_fetch::CONDITION), ("False".into(), "Fetching".into()));
        assert_eq!(c(&status, READY), ("False".into(), "ModelNotReady".into()));
        assert_eq!(status.model.as_ref().map(|m| (m.bytes, m.total_bytes)), Some((5, 10)));
        let fetched = crate::model_fetch::Fetch { ready: true, reason: "Fetched".into(), ..fetching };
        let status = compute(&StatusInputs { model_fetch: Some(fetched), ..one_pod_instances(&pdd, &[]) });
        assert_eq!(c(&status, crate::model_fetch::CONDITION), ("True".into(), "Fetched".into()));
        assert_eq!(c(&status, READY), ("False".into(), "PrefillUnavailable".into()), "fetched, then the engines' own readiness");
        let none = compute(&one_pod_instances(&pdd, &[]));
        assert!(none.model.is_none() && none.conditions.iter().all(|c| c.type_ != crate::model_fetch::CONDITION));
    }

    #[test]
    fn the_rank_map_lists_only_instances_with_a_passed_published_handshake() {
        let pdd = pdd();
        let ranks = vec![RankTargets {
            engine_rank: 0,
            pp_rank: 0,
            tp_ranks: vec![0, 1],
            cp_ranks: vec![0],
            pp_ranks: vec![0],
            required_dst_info_num: 1,
            required_prefill_response_num: 1,
        }];
        let observed = [decode_pod(0, Some(true), Some(ranks.clone())), decode_pod(1, Some(false), Some(ranks.clone()))];
        let inputs = one_pod_instances(&pdd, &observed);
        let map = rank_map(&inputs);
        assert_eq!(map, vec![DecodeRankMap { decode_instance: 0, ranks }]);
    }

    #[test]
    fn a_decode_counts_ready_only_when_its_pod_is_ready() {
        let pdd = pdd();
        // Instance 0 passed and instance 1 failed: only instance 0 serves.
        let observed = [decode_pod(0, Some(true), None), decode_pod(1, Some(false), None)];
        let inputs = one_pod_instances(&pdd, &observed);
        assert_eq!(count(&inputs, Role::Decode).ready, 1);
        // No sidecar report yet: the gate is unset, the pod not Ready, no Service routes to it.
        let unreported = [decode_pod(0, None, None), decode_pod(1, None, None)];
        assert_eq!(count(&StatusInputs { observed: &unreported, ..inputs }, Role::Decode).ready, 0);
    }

    #[test]
    fn a_role_that_served_and_has_no_ready_instance_degrades_until_one_is_ready() {
        let pdd = pdd();
        let decodes = [decode_pod(0, Some(true), None), decode_pod(1, Some(true), None)];
        let reason = |s: &PDDeploymentStatus| s.conditions.iter().find(|c| c.type_ == DEGRADED).map(|c| c.reason.clone()).unwrap();
        // Coming up: no prefill ready yet, and never was: not degraded.
        let first = compute(&one_pod_instances(&pdd, &decodes));
        assert_eq!(reason(&first), "AsExpected");
        // It served: the prefill was ready, now it is gone.
        let served = PDDeploymentStatus { prefill: RoleStatus { ready_replicas: 1, ..Default::default() }, ..first };
        let lost = compute(&StatusInputs { previous: Some(&served), ..one_pod_instances(&pdd, &decodes) });
        assert_eq!(reason(&lost), "NoPrefillReady");
        // Still none on the next pass (the previous status shows 0 ready): it stays degraded.
        let again = compute(&StatusInputs { previous: Some(&lost), ..one_pod_instances(&pdd, &decodes) });
        assert_eq!(reason(&again), "NoPrefillReady");
        // A prefill is ready again: recovered.
        let mut prefill = decode_pod(0, None, None);
        (prefill.role, prefill.ready, prefill.name) = (Role::Prefill, true, "x-prefill-0-0".into());
        let all = [decodes[0].clone(), decodes[1].clone(), prefill];
        assert_eq!(reason(&compute(&StatusInputs { previous: Some(&again), ..one_pod_instances(&pdd, &all) })), "AsExpected");
    }

    #[test]
    fn an_instance_left_down_is_named_by_degraded_before_a_lost_role() {
        let pdd = pdd();
        let reason =
            |s: &PDDeploymentStatus| s.conditions.iter().find(|c| c.type_ == DEGRADED).map(|c| (c.reason.clone(), c.message.clone()));
        let held = "pod x-prefill-0-1 is Failed; prefill instance 0 is left down: recreated 5 times".to_owned();
        let served = PDDeploymentStatus { prefill: RoleStatus { ready_replicas: 1, ..Default::default() }, ..Default::default() };
        let entry = pd_api::InstanceRecovery {
            role: pd_api::Role::Prefill,
            instance: 0,
            count: 5,
            window_start: Time(jiff::Timestamp::UNIX_EPOCH),
            last_at: Time(jiff::Timestamp::UNIX_EPOCH),
            last_cause: "pod x-prefill-0-1 is Failed".into(),
            observed_generation: None,
        };
        let inputs = StatusInputs {
            recovery: crate::recovery::Standing { held: Some(held.clone()), counted: vec![entry.clone()], ..Default::default() },
            previous: Some(&served),
            ..one_pod_instances(&pdd, &[])
        };
        let status = compute(&inputs);
        assert_eq!(reason(&status), Some((crate::recovery::EXHAUSTED.to_owned(), held)));
        assert_eq!(status.recoveries, vec![entry]);
        assert_eq!(serde_json::to_value(&status).unwrap()["recoveries"][0]["lastCause"], "pod x-prefill-0-1 is Failed");
    }

    #[test]
    fn the_page_size_both_roles_run_with_is_shown_once_the_spec_is_valid() {
        let pdd = pdd();
        let status = compute(&StatusInputs { page_size: Some(64), ..one_pod_instances(&pdd, &[]) });
        assert_eq!(status.page_size, Some(64));
        assert_eq!(serde_json::to_value(&status).unwrap()["pageSize"], 64);
        let invalid = compute(&StatusInputs { page_size: Some(64), validation: Err("bad".into()), ..one_pod_instances(&pdd, &[]) });
        assert_eq!(invalid.page_size, None);
        assert!(serde_json::to_value(&invalid).unwrap().get("pageSize").is_none());
    }
}
