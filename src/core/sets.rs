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
use thiserror::Error;

use crate::handshake::core::{DecodeTopology, InputError, PrefillInfo, all_failures};
use crate::plan::ObservedPod;
use crate::release::Release;
use pd_api::labels::KV_CONTRACT;
use pd_api::{KvSetStatus, KvSetStrategy, Role};

/// Why a pod whose contract cannot be read makes its set one the spec's pods do not join.
const UNJUDGED: &str = "a set that cannot be judged is not joined";

/// Why a KV contract cannot be read as the handshake core reads it.
#[derive(Debug, Error)]
pub enum ContractError {
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("it names no model")]
    NoModel,
    #[error("it has no {0} side")]
    NoSide(&'static str),
    #[error(transparent)]
    Decode(#[from] InputError),
    #[error("prefill topology body: {0}")]
    Prefill(String),
    #[error("it names no SGLang release this operator knows: {0}")]
    Release(String),
}

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
        let set: u32 = d.metadata.labels.as_ref()?.get(pd_api::labels::LABEL_KV_SET).and_then(|s| s.parse().ok()).unwrap_or(0);
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
    pub contracts: &'a SpecContracts,
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

/// One pod's KV contract, read: the model it serves and its side of the handshake.
#[derive(Debug)]
pub struct Contract {
    model: Value,
    side: Side,
}

#[derive(Debug)]
enum Side {
    Prefill(PrefillBody),
    Decode(DecodeTopology),
}

/// A prefill's topology body as it registers it, and whether its release is recorded.
#[derive(Debug)]
struct PrefillBody {
    body: Value,
    /// Contracts written before the release was recorded carry every key whatever the release;
    /// those are read as the reference release reads them, as they always were.
    release: Option<Release>,
}

impl PrefillBody {
    fn read(contract: &Value, body: &Value) -> Result<Self, ContractError> {
        PrefillInfo::from_body(body).map_err(ContractError::Prefill)?;
        let release = match contract.get("release") {
            None => None,
            Some(r) => Some(r.as_str().and_then(|r| r.parse::<Release>().ok()).ok_or_else(|| ContractError::Release(r.to_string()))?),
        };
        Ok(Self { body: body.clone(), release })
    }

    /// The record a decode of `release` builds from this body, or SGLang's refusal.
    fn record_for(&self, release: Release) -> Result<PrefillInfo, String> {
        let as_release = if self.release.is_some() { release } else { Release::REFERENCE };
        PrefillInfo::from_release_body(as_release, &self.body).map_err(|e| {
            let prefill = self.release.map_or_else(String::new, |r| format!(" (SGLang {r})"));
            format!("SGLang {release}'s decode cannot build its record from the prefill's{prefill} topology body ({e})")
        })
    }
}

impl Contract {
    pub fn read(text: &str) -> Result<Self, ContractError> {
        let v: Value = serde_json::from_str(text)?;
        let model = v.get("model").cloned().ok_or(ContractError::NoModel)?;
        let side = match (v.get(Role::Prefill.as_str()), v.get(Role::Decode.as_str())) {
            (Some(body), _) => Side::Prefill(PrefillBody::read(&v, body)?),
            (None, Some(topology)) => Side::Decode(DecodeTopology::parse(topology)?),
            (None, None) => return Err(ContractError::NoSide("prefill or decode")),
        };
        Ok(Self { model, side })
    }
}

/// The contracts the spec's new pods would carry, read once per decision.
#[derive(Debug)]
pub struct SpecContracts {
    model: Value,
    prefill: PrefillBody,
    decode: DecodeTopology,
}

impl SpecContracts {
    /// Reads the (prefill, decode) contracts `render::Intent` made; they read back unless the
    /// operator has a bug, and then the reconcile fails rather than judging nothing.
    pub fn read(prefill: &str, decode: &str) -> Result<Self, ContractError> {
        let (p, d) = (Contract::read(prefill)?, Contract::read(decode)?);
        match (p.side, d.side) {
            (Side::Prefill(prefill), Side::Decode(decode)) => Ok(Self { model: p.model, prefill, decode }),
            (Side::Prefill(_), Side::Prefill(_)) => Err(ContractError::NoSide("decode")),
            (Side::Decode(_), _) => Err(ContractError::NoSide("prefill")),
        }
    }
}

/// Why a running pod's contract cannot pair with the spec's (`None`: it can). Each decode builds
/// the prefill's record as its own release does, so an engine upgrade across releases is judged
/// both ways: the new decode against each running prefill, each running decode against the new
/// prefill.
pub fn incompatibility(running: &Contract, new: &SpecContracts) -> Option<String> {
    if running.model != new.model {
        return Some(format!("the model changes from {} to {}: a decode cannot use another model's KV", running.model, new.model));
    }
    let (pair, decode, prefill) = match &running.side {
        Side::Prefill(body) => ("new decode with running prefill", &new.decode, body),
        Side::Decode(topology) => ("running decode with new prefill", topology, &new.prefill),
    };
    let info = match prefill.record_for(decode.release) {
        Ok(info) => info,
        Err(e) => return Some(format!("{pair}: {e}")),
    };
    let failures = all_failures(decode, &info).0;
    let first = failures.first()?;
    Some(format!("{pair}: {}: {}", first.kind, first.error))
}

/// The first reason the pods of `set` cannot pair with the spec's contracts, pod by pod in the
/// order observed. A pod without a readable contract cannot be judged, so it counts as one that
/// cannot pair: the change comes up as a set of its own rather than rolling in place blind.
fn set_incompatibility(observed: &[ObservedPod], set: u32, new: &SpecContracts) -> Option<String> {
    let mut judged = BTreeSet::new();
    observed.iter().filter(|p| p.set == set && !p.deleting).find_map(|p| {
        let Some(text) = p.contract.as_deref() else {
            return Some(format!("pod {} carries no KV contract ({KV_CONTRACT}); {UNJUDGED}", p.name));
        };
        if !judged.insert(text) {
            return None;
        }
        match Contract::read(text) {
            Ok(running) => incompatibility(&running, new),
            Err(e) => Some(format!("pod {} carries no readable KV contract ({KV_CONTRACT}): {e}; {UNJUDGED}", p.name)),
        }
    })
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
    let strategy = if routed == target { KvSetStrategy::InPlace } else { KvSetStrategy::Surge };
    Decision { target, routed, retire, status: KvSetStatus { target, routed, strategy, message } }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelFacts;
    use crate::render::kv_contract;
    use pd_api::PDDeploymentSpec;

    /// A spec's (prefill, decode) KV contracts: as text, what its pods carry, and read.
    struct Fixture {
        text: (String, String),
        read: SpecContracts,
    }

    /// A DeepSeek-style MLA pair at `page` (both roles), and its contracts.
    fn contracts(page: u32, model: &str) -> Fixture {
        contracts_tp(page, model, 8)
    }

    fn contracts_tp(page: u32, model: &str, decode_tp: u32) -> Fixture {
        let spec: PDDeploymentSpec = serde_json::from_value(serde_json::json!({
            "model": {"path": model}, "prefill": {"parallelism": {"tp": 8}}, "decode": {"parallelism": {"tp": decode_tp}},
            "kvTransfer": {"pageSize": page}
        }))
        .unwrap();
        let facts: ModelFacts = crate::model::resolve(&spec.model, None);
        let text = (kv_contract(&spec, &facts, Role::Prefill).unwrap(), kv_contract(&spec, &facts, Role::Decode).unwrap());
        let read = SpecContracts::read(&text.0, &text.1).expect("rendered contracts read back");
        Fixture { text, read }
    }

    fn pod(role: Role, instance: u32, set: u32, contract: &Fixture) -> ObservedPod {
        let side = if role == Role::Prefill { &contract.text.0 } else { &contract.text.1 };
        ObservedPod { set, contract: Some(side.clone()), ..ObservedPod::running(role, instance, 0, "r") }
    }

    fn pair(set: u32, contract: &Fixture) -> Vec<ObservedPod> {
        vec![pod(Role::Prefill, 0, set, contract), pod(Role::Decode, 0, set, contract)]
    }

    #[test]
    fn the_router_is_read_the_same_from_the_slim_cache_and_waits_for_pods_of_another_set() {
        let spec: PDDeploymentSpec = serde_json::from_value(serde_json::json!({
            "model": {"path": "m"}, "prefill": {"parallelism": {"tp": 8}}, "decode": {"parallelism": {"tp": 8}}
        }))
        .unwrap();
        let pdd = pd_api::PDDeployment::new("m", spec.clone());
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

    fn new(c: &Fixture) -> Desired<'_> {
        Desired { contracts: &c.read, revisions: ("r", "r"), always_surge: false }
    }

    /// `incompatibility` of a running pod's contract text with the spec's contracts `c`.
    fn judged(running: &str, c: &Fixture) -> Option<String> {
        incompatibility(&Contract::read(running).expect("a readable contract"), &c.read)
    }

    #[test]
    fn a_page_size_change_is_incompatible_with_sglangs_text_and_a_tp_change_is_not() {
        let (p64, p32) = (contracts(64, "deepseek-ai/DeepSeek-V3"), contracts(32, "deepseek-ai/DeepSeek-V3"));
        let (prefill, decode) = (&p64.text.0, &p64.text.1);
        let why = judged(prefill, &p32).expect("page 64 prefill cannot serve a page 32 decode");
        assert!(why.starts_with("new decode with running prefill: RuntimeError: Page size mismatch"), "{why}");
        let why = judged(decode, &p32).expect("page 64 decode cannot read a page 32 prefill");
        assert!(why.starts_with("running decode with new prefill:"), "{why}");
        assert_eq!(judged(prefill, &p64), None);
        let tp4 = contracts_tp(64, "deepseek-ai/DeepSeek-V3", 4);
        assert_eq!(judged(prefill, &tp4), None, "an MLA decode maps any attention TP");
        assert_eq!(judged(decode, &tp4), None);
        let other = contracts(64, "Qwen/Qwen3-8B");
        assert!(judged(prefill, &other).unwrap().contains("the model changes"));
    }

    /// A DeepSeek-V3 pair whose engines run SGLang `version`.
    fn contracts_of(version: &str) -> Fixture {
        let spec: PDDeploymentSpec = serde_json::from_value(serde_json::json!({
            "model": {"path": "deepseek-ai/DeepSeek-V3"}, "engine": {"version": version},
            "prefill": {"parallelism": {"tp": 8}}, "decode": {"parallelism": {"tp": 8}}, "kvTransfer": {"pageSize": 64}
        }))
        .unwrap();
        let facts: ModelFacts = crate::model::resolve(&spec.model, None);
        let text = (kv_contract(&spec, &facts, Role::Prefill).unwrap(), kv_contract(&spec, &facts, Role::Decode).unwrap());
        let read = SpecContracts::read(&text.0, &text.1).expect("rendered contracts read back");
        Fixture { text, read }
    }

    #[test]
    fn an_engine_upgrade_across_releases_is_judged_by_each_decodes_own_record() {
        let (old, new) = (contracts_of("0.5.21"), contracts_of("0.5.23"));
        // A running 0.5.21 decode would refuse a 0.5.23 prefill's body, as its dataclass does.
        let why = judged(&old.text.1, &new).expect("a 0.5.21 decode cannot read a 0.5.23 prefill");
        assert!(why.starts_with("running decode with new prefill: SGLang 0.5.21's decode cannot build its record from the prefill's (SGLang 0.5.23) topology body (TypeError: PrefillServerInfo.__init__() got an unexpected keyword argument"), "{why}");
        // A new 0.5.23 decode reads a running 0.5.21 prefill's shorter body.
        assert_eq!(judged(&old.text.0, &new), None);
        // Downgrading the engine is the mirror image.
        let why = judged(&new.text.0, &old).expect("a new 0.5.21 decode cannot read a running 0.5.23 prefill");
        assert!(why.starts_with("new decode with running prefill: SGLang 0.5.21's decode"), "{why}");
        assert_eq!(judged(&new.text.1, &old), None);
        // Within one release nothing changes.
        assert_eq!(judged(&old.text.0, &old), None);
        assert_eq!(judged(&old.text.1, &old), None);
        // A prefill contract written before the release was recorded (every key, whatever the
        // release) is read as it always was.
        let mut legacy: Value = serde_json::from_str(&contracts_of("0.5.23").text.0).unwrap();
        legacy.as_object_mut().unwrap().remove("release");
        assert_eq!(judged(&legacy.to_string(), &old), None);
        let bad = new.text.0.replace("\"release\":\"0.5.23\"", "\"release\":\"9.9\"");
        assert!(Contract::read(&bad).unwrap_err().to_string().starts_with("it names no SGLang release this operator knows"));
    }

    #[test]
    fn a_contract_that_does_not_read_says_why() {
        let p64 = contracts(64, "deepseek-ai/DeepSeek-V3");
        let why = |text: &str| Contract::read(text).expect_err(text).to_string();
        assert!(why("not json").starts_with("not JSON: "), "{}", why("not json"));
        assert_eq!(why(r#"{"decode": {}}"#), "it names no model");
        assert_eq!(why(r#"{"model": {"path": "m"}}"#), "it has no prefill or decode side");
        assert!(why(r#"{"model": {"path": "m"}, "decode": {"page_size": 64}}"#).starts_with("decode topology: field `"));
        assert!(why(r#"{"model": {"path": "m"}, "prefill": []}"#).starts_with("prefill topology body: TypeError: "));
        // The spec's own pair must be a prefill and a decode, in that order.
        let (prefill, decode) = (&p64.text.0, &p64.text.1);
        assert_eq!(SpecContracts::read(decode, prefill).expect_err("swapped").to_string(), "it has no prefill side");
        assert_eq!(SpecContracts::read(prefill, prefill).expect_err("two prefills").to_string(), "it has no decode side");
    }

    #[test]
    fn a_pod_without_a_readable_contract_makes_the_change_a_new_set_and_says_which_pod() {
        let p64 = contracts(64, "deepseek-ai/DeepSeek-V3");
        let router = Some(Router { set: 0, settled: true });
        // The same spec, but one running decode's contract is garbled: the set cannot be judged.
        let mut running = pair(0, &p64);
        running[1].contract = Some("{\"model\": ".into());
        let d = decide(&running, &new(&p64), router, ONE);
        assert_eq!((d.target, d.routed, d.status.strategy), (1, 0, KvSetStrategy::Surge));
        let m = &d.status.message;
        assert!(m.starts_with("pod decode-0-0 carries no readable KV contract (pd.inference.dev/kv-contract): not JSON: "), "{m}");
        assert!(m.ends_with("; a set that cannot be judged is not joined"), "{m}");
        // A running pod that carries no contract at all (made before contracts existed).
        running[1].contract = None;
        let d = decide(&running, &new(&p64), router, ONE);
        assert_eq!((d.target, d.routed, d.status.strategy), (1, 0, KvSetStrategy::Surge));
        assert_eq!(
            d.status.message,
            "pod decode-0-0 carries no KV contract (pd.inference.dev/kv-contract); a set that cannot be judged is not joined"
        );
        // That reason is status.kvSet.message, and the RolloutSurge Event says it.
        let next = pd_api::PDDeploymentStatus { kv_set: Some(d.status.clone()), ..Default::default() };
        let (reason, note) = super::super::status::rollout_transition(None, &next).expect("an Event for the surge");
        assert_eq!(reason, "RolloutSurge");
        assert!(note.starts_with(&format!("the new revisions cannot pair with KV set 0 ({}): set 1 comes up", d.status.message)), "{note}");
        // A pod on its way out is not judged, and neither is any pod of another set.
        running[1].deleting = true;
        assert_eq!(decide(&running, &new(&p64), router, ONE).target, 0);
        running[1] = ObservedPod { set: 1, deleting: false, ..running[1].clone() };
        let d = decide(&running, &new(&p64), Some(Router { set: 0, settled: true }), ONE);
        assert_eq!(d.target, 2, "set 1, the newest, holds the pod that cannot be judged: {d:?}");
        // Once the new set's own pods carry the spec's contracts, it is joined in place.
        let mut surged = pair(0, &p64);
        surged[1].contract = None;
        surged.extend(pair(1, &p64));
        let d = decide(&surged, &new(&p64), Some(Router { set: 1, settled: true }), ONE);
        assert_eq!((d.target, d.routed, d.retire), (1, 1, vec![0]));
    }

    #[test]
    fn a_compatible_spec_rolls_in_place_and_an_incompatible_one_surges_into_a_new_set() {
        let (p64, p32) = (contracts(64, "deepseek-ai/DeepSeek-V3"), contracts(32, "deepseek-ai/DeepSeek-V3"));
        let running = pair(0, &p64);
        let router = Some(Router { set: 0, settled: true });
        let d = decide(&running, &new(&p64), router, ONE);
        assert_eq!((d.target, d.routed, d.retire.clone(), d.status.strategy), (0, 0, vec![], KvSetStrategy::InPlace));
        let d = decide(&running, &new(&p32), router, ONE);
        assert_eq!((d.target, d.routed, d.retire.clone(), d.status.strategy), (1, 0, vec![], KvSetStrategy::Surge));
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
        assert_eq!((d.routed, d.retire, d.status.strategy), (1, vec![0], KvSetStrategy::InPlace));
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
        assert_eq!((d.target, d.routed, d.status.strategy), (1, 0, KvSetStrategy::Surge));
        assert!(d.status.message.contains("rollout.strategy is Surge"), "{}", d.status.message);
        let auto = Desired { always_surge: false, ..changed };
        assert_eq!(decide(&running, &auto, None, ONE).target, 0, "Auto rolls a compatible change in place");
    }
}
