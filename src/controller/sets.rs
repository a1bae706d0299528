//! Pure: which KV set a PDDeployment's new pods go to, and which set its router pairs.
//!
//! Every engine pod carries its KV contract (what it reports in the handshake, and its model).
//! A spec change is judged with the handshake core against the running pods: the new decode
//! against each running prefill, each running decode against the new prefill. Compatible, the
//! new revisions roll in place inside the running set. Incompatible, they come up as a new set
//! beside it; the router keeps pairing the running set until the new one is whole, then moves to
//! it, and the old set drains and goes. No request ever crosses sets.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use serde_json::Value;

use super::plan::ObservedPod;
use crate::api::{KvSetStatus, Role};
use crate::handshake::core::{DecodeTopology, PrefillInfo, all_failures};

pub const IN_PLACE: &str = "InPlace";
pub const SURGE: &str = "Surge";

/// The router Deployment as the cache shows it: the set its pods pair, and whether its rollout
/// is over (no pod of an older template left).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Router {
    pub set: u32,
    pub settled: bool,
}

impl Router {
    /// The router Deployment as the controller's cache holds it (`slim_deployment`): the set on
    /// its own label, and whether its rollout is over. `pod_sets` are the sets its pods carry,
    /// terminating pods included: a pod of another set may still pair that set's pods on the
    /// connections it keeps open, so the rollout is not over until it is gone.
    pub fn observe(d: &Deployment, pod_sets: &BTreeSet<String>) -> Option<Router> {
        let set: u32 = d.metadata.labels.as_ref()?.get(crate::render::LABEL_KV_SET).and_then(|s| s.parse().ok()).unwrap_or(0);
        let want = d.spec.replicas.unwrap_or(1);
        let rolled = d.status.as_ref().is_some_and(|s| {
            s.observed_generation >= d.metadata.generation
                && s.replicas.unwrap_or(0) == want
                && s.updated_replicas.unwrap_or(0) == want
                && s.available_replicas.unwrap_or(0) >= want
        });
        let stragglers = pod_sets.iter().any(|s| *s != set.to_string());
        Some(Router { set, settled: rolled && !stragglers })
    }
}

/// What the controller's Deployment cache keeps: the metadata (`sync_children` reads the applied
/// hash), `spec.replicas` and the status, which is all `Router::observe` reads. The pod template
/// is most of a Deployment's memory.
pub fn slim_deployment(d: &mut Deployment) {
    d.spec = DeploymentSpec { replicas: d.spec.replicas, ..Default::default() };
}

/// What the spec's pods would be: their (prefill, decode) KV contracts and revisions, and whether
/// every revision change comes up as a set of its own (`rollout.strategy: Surge`).
#[derive(Clone, Copy, Debug)]
pub struct Desired<'a> {
    pub contracts: (&'a str, &'a str),
    pub revisions: (&'a str, &'a str),
    pub always_surge: bool,
}

/// What the spec asks of each role: instances and pods per instance.
#[derive(Clone, Copy, Debug)]
pub struct Want {
    pub prefill: (u32, u32),
    pub decode: (u32, u32),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub target: u32,
    pub routed: u32,
    /// Sets whose pods are drained and deleted now.
    pub retire: Vec<u32>,
    pub status: KvSetStatus,
}

/// Why a running pod's contract cannot pair with the spec's (`None`: it can, or it carries none).
pub fn incompatibility(running: &str, new_prefill: &str, new_decode: &str) -> Option<String> {
    let (old, prefill, decode) = (parse(running)?, parse(new_prefill)?, parse(new_decode)?);
    if old["model"] != prefill["model"] {
        return Some(format!("the model changes from {} to {}: a decode cannot use another model's KV", old["model"], prefill["model"]));
    }
    let (pair, failures) = if let Some(body) = old.get("prefill") {
        let topology = DecodeTopology::parse(&decode["decode"]).ok()?;
        ("new decode with running prefill", all_failures(&topology, &PrefillInfo::from_body(body).ok()?).0)
    } else {
        let topology = DecodeTopology::parse(old.get("decode")?).ok()?;
        ("running decode with new prefill", all_failures(&topology, &PrefillInfo::from_body(&prefill["prefill"]).ok()?).0)
    };
    let first = failures.first()?;
    Some(format!("{pair}: {}: {}", first.kind, first.error))
}

fn parse(text: &str) -> Option<Value> {
    serde_json::from_str(text).ok()
}

/// The first reason the pods of `set` cannot pair with the spec's contracts.
fn set_incompatibility(observed: &[ObservedPod], set: u32, new: (&str, &str)) -> Option<String> {
    let contracts: BTreeSet<&str> = observed.iter().filter(|p| p.set == set && !p.deleting).filter_map(|p| p.contract.as_deref()).collect();
    contracts.into_iter().find_map(|c| incompatibility(c, new.0, new.1))
}

/// Why the spec's pods cannot join `set`: an incompatible contract, or, under `Surge`, a pod of
/// another revision.
fn why_apart(observed: &[ObservedPod], set: u32, desired: &Desired) -> Option<String> {
    set_incompatibility(observed, set, desired.contracts).or_else(|| {
        let outdated = |p: &&ObservedPod| {
            let want = if p.role == Role::Prefill { desired.revisions.0 } else { desired.revisions.1 };
            p.set == set && !p.deleting && p.revision != want
        };
        (desired.always_surge && observed.iter().any(|p| outdated(&p)))
            .then(|| "rollout.strategy is Surge: every new revision comes up as a KV set of its own".to_owned())
    })
}

/// Whether every instance of `set` the spec asks for is there and serving.
pub fn whole(observed: &[ObservedPod], set: u32, want: Want) -> bool {
    [(Role::Prefill, want.prefill), (Role::Decode, want.decode)].into_iter().all(|(role, (instances, nodes))| {
        (0..instances).all(|i| {
            let pods: Vec<&ObservedPod> =
                observed.iter().filter(|p| p.set == set && p.role == role && p.instance == i && !p.deleting).collect();
            pods.len() == nodes as usize && pods.iter().all(|p| p.serving())
        })
    })
}

/// Decides the target and routed sets.
pub fn decide(observed: &[ObservedPod], desired: &Desired, router: Option<Router>, want: Want) -> Decision {
    let live: BTreeSet<u32> = observed.iter().filter(|p| !p.deleting).map(|p| p.set).collect();
    let newest = live.last().copied().unwrap_or(0);
    let target = if why_apart(observed, newest, desired).is_some() { newest + 1 } else { newest };
    let whole = whole(observed, target, want);
    let older = live.iter().rev().copied().find(|s| *s != target);
    let routed = match router {
        Some(r) if r.set == target => target,
        Some(r) if live.contains(&r.set) && !whole => r.set,
        _ if whole => target,
        _ => older.unwrap_or(target),
    };
    // While the router's pods change, an old router pod may still pair the set it had.
    let settled = router.is_none_or(|r| r.settled && r.set == routed);
    let retire = live.iter().copied().filter(|s| *s != target && *s != routed && settled).collect();
    let message = if routed == target { String::new() } else { why_apart(observed, routed, desired).unwrap_or_default() };
    let strategy = if routed == target { IN_PLACE } else { SURGE };
    Decision { target, routed, retire, status: KvSetStatus { target, routed, strategy: strategy.into(), message } }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PDDeploymentSpec;
    use crate::model::ModelFacts;
    use crate::render::kv_contract;

    /// A DeepSeek-style MLA pair at `page` (both roles), and its (prefill, decode) contracts.
    fn contracts(page: u32, model: &str) -> (String, String) {
        contracts_tp(page, model, 8)
    }

    fn contracts_tp(page: u32, model: &str, decode_tp: u32) -> (String, String) {
        let spec: PDDeploymentSpec = serde_json::from_value(serde_json::json!({
            "model": {"path": model}, "prefill": {"parallelism": {"tp": 8}}, "decode": {"parallelism": {"tp": decode_tp}},
            "kvTransfer": {"pageSize": page}
        }))
        .unwrap();
        let facts: ModelFacts = crate::model::resolve(&spec.model, None);
        (kv_contract(&spec, &facts, Role::Prefill).unwrap(), kv_contract(&spec, &facts, Role::Decode).unwrap())
    }

    fn pod(role: Role, instance: u32, set: u32, contract: &(String, String)) -> ObservedPod {
        let side = if role == Role::Prefill { &contract.0 } else { &contract.1 };
        ObservedPod { set, contract: Some(side.clone()), ..ObservedPod::running(role, instance, 0, "r") }
    }

    fn pair(set: u32, contract: &(String, String)) -> Vec<ObservedPod> {
        vec![pod(Role::Prefill, 0, set, contract), pod(Role::Decode, 0, set, contract)]
    }

    #[test]
    fn the_router_is_read_the_same_from_the_slim_cache_and_waits_for_pods_of_another_set() {
        let spec: PDDeploymentSpec = serde_json::from_value(serde_json::json!({
            "model": {"path": "m"}, "prefill": {"parallelism": {"tp": 8}}, "decode": {"parallelism": {"tp": 8}}
        }))
        .unwrap();
        let pdd = crate::api::PDDeployment::new("m", spec.clone());
        let intent = crate::render::Intent::new(&spec, &crate::model::resolve(&spec.model, None), &Default::default()).unwrap();
        let sets = crate::render::KvSets { target: 2, routed: 2 };
        let rendered = crate::render::render_sets(&pdd, &crate::model::resolve(&spec.model, None), &intent, &Default::default(), sets);
        let mut d = rendered.unwrap().deployments.remove(0);
        d.metadata.generation = Some(3);
        d.status = Some(k8s_openapi::api::apps::v1::DeploymentStatus {
            observed_generation: Some(3),
            replicas: Some(1),
            updated_replicas: Some(1),
            available_replicas: Some(1),
            ..Default::default()
        });
        let mut slim = d.clone();
        slim_deployment(&mut slim);
        let only = |s: &str| BTreeSet::from([s.to_owned()]);
        assert_eq!(Router::observe(&d, &only("2")), Some(Router { set: 2, settled: true }));
        assert_eq!(Router::observe(&slim, &only("2")), Router::observe(&d, &only("2")));
        let both = BTreeSet::from(["1".to_owned(), "2".to_owned()]);
        assert_eq!(Router::observe(&slim, &both), Some(Router { set: 2, settled: false }), "a pod of set 1 is left");
        let size = |d: &Deployment| serde_json::to_vec(d).unwrap().len();
        assert!(size(&slim) * 3 < size(&d), "slim {} of {} bytes", size(&slim), size(&d));
    }

    const ONE: Want = Want { prefill: (1, 1), decode: (1, 1) };

    fn new(c: &(String, String)) -> Desired<'_> {
        Desired { contracts: (&c.0, &c.1), revisions: ("r", "r"), always_surge: false }
    }

    #[test]
    fn a_page_size_change_is_incompatible_with_sglangs_text_and_a_tp_change_is_not() {
        let (p64, p32) = (contracts(64, "deepseek-ai/DeepSeek-V3"), contracts(32, "deepseek-ai/DeepSeek-V3"));
        let why = incompatibility(&p64.0, &p32.0, &p32.1).expect("page 64 prefill cannot serve a page 32 decode");
        assert!(why.starts_with("new decode with running prefill: RuntimeError: Page size mismatch"), "{why}");
        let why = incompatibility(&p64.1, &p32.0, &p32.1).expect("page 64 decode cannot read a page 32 prefill");
        assert!(why.starts_with("running decode with new prefill:"), "{why}");
        assert_eq!(incompatibility(&p64.0, &p64.0, &p64.1), None);
        let tp4 = contracts_tp(64, "deepseek-ai/DeepSeek-V3", 4);
        assert_eq!(incompatibility(&p64.0, &tp4.0, &tp4.1), None, "an MLA decode maps any attention TP");
        assert_eq!(incompatibility(&p64.1, &tp4.0, &tp4.1), None);
        let other = contracts(64, "Qwen/Qwen3-8B");
        assert!(incompatibility(&p64.0, &other.0, &other.1).unwrap().contains("the model changes"));
        assert_eq!(incompatibility("not json", &p64.0, &p64.1), None, "a pod without a readable contract is not judged");
    }

    #[test]
    fn a_compatible_spec_rolls_in_place_and_an_incompatible_one_surges_into_a_new_set() {
        let (p64, p32) = (contracts(64, "deepseek-ai/DeepSeek-V3"), contracts(32, "deepseek-ai/DeepSeek-V3"));
        let running = pair(0, &p64);
        let router = Some(Router { set: 0, settled: true });
        let d = decide(&running, &new(&p64), router, ONE);
        assert_eq!((d.target, d.routed, d.retire.clone(), d.status.strategy.as_str()), (0, 0, vec![], IN_PLACE));
        let d = decide(&running, &new(&p32), router, ONE);
        assert_eq!((d.target, d.routed, d.retire.clone(), d.status.strategy.as_str()), (1, 0, vec![], SURGE));
        assert!(d.status.message.contains("Page size mismatch"), "{}", d.status.message);
    }

    #[test]
    fn the_router_moves_only_to_a_whole_set_and_the_old_set_goes_once_the_router_settled() {
        let (p64, p32) = (contracts(64, "deepseek-ai/DeepSeek-V3"), contracts(32, "deepseek-ai/DeepSeek-V3"));
        let mut pods = pair(0, &p64);
        let mut half = pair(1, &p32);
        half[1].ready = false;
        pods.extend(half.clone());
        let d = decide(&pods, &new(&p32), Some(Router { set: 0, settled: true }), ONE);
        assert_eq!((d.target, d.routed, d.retire), (1, 0, vec![]), "set 1 is not whole yet");
        let mut whole_pods = pair(0, &p64);
        whole_pods.extend(pair(1, &p32));
        let d = decide(&whole_pods, &new(&p32), Some(Router { set: 0, settled: true }), ONE);
        assert_eq!((d.target, d.routed, d.retire), (1, 1, vec![]), "the router moves; set 0 waits for it");
        let d = decide(&whole_pods, &new(&p32), Some(Router { set: 1, settled: false }), ONE);
        assert_eq!((d.routed, d.retire), (1, vec![]), "an old router pod may still pair set 0");
        let d = decide(&whole_pods, &new(&p32), Some(Router { set: 1, settled: true }), ONE);
        assert_eq!((d.routed, d.retire, d.status.strategy.as_str()), (1, vec![0], IN_PLACE));
        // Once on set 1, the router stays there while an instance of it is replaced.
        let d = decide(&pods, &new(&p32), Some(Router { set: 1, settled: true }), ONE);
        assert_eq!((d.routed, d.retire), (1, vec![0]));
    }

    #[test]
    fn without_a_router_the_old_set_goes_once_the_new_one_is_whole() {
        let (p64, p32) = (contracts(64, "deepseek-ai/DeepSeek-V3"), contracts(32, "deepseek-ai/DeepSeek-V3"));
        let mut pods = pair(0, &p64);
        pods.extend(pair(1, &p32));
        assert_eq!(decide(&pods, &new(&p32), None, ONE).retire, vec![0]);
        pods[3].ready = false;
        let d = decide(&pods, &new(&p32), None, ONE);
        assert_eq!((d.target, d.routed, d.retire), (1, 0, vec![]));
        assert_eq!(decide(&[], &new(&p32), None, ONE).target, 0, "a new PDDeployment starts at set 0");
    }

    #[test]
    fn a_surge_abandoned_for_another_spec_is_retired_at_once() {
        let (p64, p32, p16) =
            (contracts(64, "deepseek-ai/DeepSeek-V3"), contracts(32, "deepseek-ai/DeepSeek-V3"), contracts(16, "deepseek-ai/DeepSeek-V3"));
        let mut pods = pair(0, &p64);
        pods.extend(pair(1, &p32).into_iter().map(|mut p| {
            p.ready = false;
            p
        }));
        let d = decide(&pods, &new(&p16), Some(Router { set: 0, settled: true }), ONE);
        assert_eq!((d.target, d.routed, d.retire), (2, 0, vec![1]));
    }

    #[test]
    fn under_surge_any_new_revision_comes_up_as_a_set_of_its_own() {
        let p64 = contracts(64, "deepseek-ai/DeepSeek-V3");
        let running = pair(0, &p64);
        let same = Desired { always_surge: true, ..new(&p64) };
        assert_eq!(decide(&running, &same, None, ONE).target, 0, "the same revisions stay");
        let changed = Desired { revisions: ("r", "r2"), ..same };
        let d = decide(&running, &changed, Some(Router { set: 0, settled: true }), ONE);
        assert_eq!((d.target, d.routed, d.status.strategy.as_str()), (1, 0, SURGE));
        assert!(d.status.message.contains("rollout.strategy is Surge"), "{}", d.status.message);
        let auto = Desired { always_surge: false, ..changed };
        assert_eq!(decide(&running, &auto, None, ONE).target, 0, "Auto rolls a compatible change in place");
    }
}
