//! One reconcile of a PDDeployment, as its steps: read → validate → render → plan → apply → status.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::{Instrument, info, info_span, warn};

use pd_core::plan::{self, DeleteReason, ObservedPod, Plan};
use pd_core::recovery::{self, Verdict};
use pd_core::scaling::{self, Scaled};
use pd_core::sets::{self, Decision};
use pd_core::sidecar;
use pd_core::status;

use super::cache::Owner;
use super::status_writer::{status_delay, write_status};
use super::{Context, Error, planner, scale};
use pd_api::conditions::HasStatus;
use pd_api::{PDDeployment, PDDeploymentStatus};
use pd_api::{Role, RolloutStrategy};
use pd_core::findings::Severity;
use pd_core::model::ModelFacts;
use pd_core::render::{self, KvSets, Rendered};
use pd_core::validate;

mod dryrun;
mod model_fetch;
mod model_read;

pub(super) async fn reconcile(guard: Arc<DeserializeGuard<PDDeployment>>, ctx: Arc<Context>) -> Result<Action, Error> {
    let pdd = match &guard.0 {
        Ok(p) => p,
        Err(invalid) => {
            warn!(object = ?invalid.metadata.name, error = %invalid.error, "skipping a PDDeployment that does not deserialize");
            return Ok(Action::await_change());
        }
    };
    let (Some(ns), Some(name), Some(uid)) = (pdd.namespace(), pdd.metadata.name.clone(), pdd.metadata.uid.clone()) else {
        return Err(Error::Unnamed("PDDeployment"));
    };
    let span = info_span!("reconcile", pdd = %format!("{ns}/{name}"), generation = pdd.metadata.generation);
    let started = Instant::now();
    ctx.metrics.reconciles.inc();
    let result = async {
        if pdd.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let (facts, mut problems, model) = read_and_validate(&ctx, pdd, &ns, &name).await?;
        // Each role's count: the PDDeployment's or its PDRole's ask, within spec.scaling. From
        // here on the PDDeployment is read with those counts (`effective`).
        ctx.stores.ready().await?;
        let scaled = scaling::scale(&pdd.spec, &scale::asked(&ctx, Owner { ns: &ns, name: &name, uid: &uid }));
        let effective = PDDeployment { spec: scaled.apply_to(&pdd.spec), ..pdd.clone() };
        // Judged on the counts it would run, whoever asked for them: every pod is rendered in
        // memory before the first is created.
        problems.extend(pd_core::bounds::pod_limit(&effective.spec, ctx.max_pods).map(|f| f.to_string()));
        if !problems.is_empty() {
            model_read::keep_refused(&ctx, &ns, &model).await?;
            return Pass::observe(&ctx, pdd, ns, name, uid).await?.with_model_config(&model).report_invalid(problems).await;
        }
        // Every pod is rendered in memory from here to the end of the pass: the object's share
        // of the render budget first, so all reconciles together hold at most that many.
        let _rendering = ctx.render_share(&effective.spec).await;
        // The planner (spec.autoscaling), when a pass is due: it moves counts through the PDRoles.
        let next_plan = planner::pass(&ctx, pdd, (&ns, &name), &scaled).await;
        let pdd = &effective;
        let pass = Pass::observe(&ctx, pdd, ns, name, uid).await?.with_model_config(&model);
        let intent = render::Intent::new(&pdd.spec, &facts, &ctx.render)?;
        let sets = pass.decide_sets(&intent)?;
        let mut rendered = render::render_sets(pdd, &facts, &intent, &ctx.render, KvSets { target: sets.target, routed: sets.routed })?;
        // The sidecars of an older set's decodes still patch their own gates.
        let older = pass.observed.iter().filter(|p| p.set != sets.target && p.role == Role::Decode).map(|p| p.name.clone());
        render::grant_decode_pods(&mut rendered, &pass.name, older);
        scaling::yield_replicas(&mut rendered.pd_roles, &scaled);
        rendered.config_maps.extend(model.keep);
        pass.share_fetch(&mut rendered);
        pass.announce_model_config().await;
        let router_ready = pass.apply_support(&rendered).await?;
        let pass = pass.with_fetch().await?;
        let plan = pass.plan(&rendered, &sets);
        // The gates before GPUs: no engine pod for processes SGLang has not accepted, nor before
        // its weights are in the cache.
        let gate = pass.engine_gate(&rendered, &plan).await?;
        let fetched = model_fetch::open(pass.model_fetch.as_ref(), &plan);
        let outcome = if gate.open && fetched {
            pass.apply_plan(&plan).await?
        } else {
            let requeue = if fetched { gate.requeue } else { Some(model_fetch::POLL) };
            pass.outcome(requeue.unwrap_or(ctx.resync))
        };
        let outcome = Outcome { requeue: next_plan.map_or(outcome.requeue, |next| outcome.requeue.min(next)), ..outcome };
        pass.report(router_ready, outcome, (sets, &intent, &scaled), rendered.page_size, gate.verification).await
    }
    .instrument(span)
    .await;
    ctx.metrics.duration.observe(started.elapsed().as_secs_f64());
    result
}

/// The nodes carrying `spec.placement.topologyKey` (none read without one).
async fn topology_nodes(ctx: &Context, pdd: &PDDeployment) -> Result<Vec<Node>, Error> {
    let Some(key) = pdd.spec.placement.topology_key.as_deref() else { return Ok(Vec::new()) };
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    Ok(nodes.list(&ListParams::default().labels(key)).await?.items)
}

/// Read the model's config (if referenced) and run the same rules as `validate` and the webhook;
/// the errors found, as `field: text (fix: …)`. None is run on a Hub source's config not read.
/// An address the platform does not allow (`pd_core::egress`) is refused before any request: a
/// spec admitted before the policy changed reaches nothing either.
async fn read_and_validate(
    ctx: &Context,
    pdd: &PDDeployment,
    ns: &str,
    name: &str,
) -> Result<(ModelFacts, Vec<String>, model_read::ModelConfig), Error> {
    let refused: Vec<String> = ctx.egress.check(&pdd.spec).iter().map(ToString::to_string).collect();
    if !refused.is_empty() {
        return Ok((pd_core::model::resolve(&pdd.spec.model, None), refused, model_read::ModelConfig::of(Ok(None))));
    }
    let model = model_read::read(ctx, pdd, ns).await?;
    let config = &model.config;
    let facts = pd_core::model::resolve(&pdd.spec.model, config.as_ref().ok().and_then(Option::as_ref));
    if let Some((problem, _)) = &model.unresolved {
        return Ok((facts, vec![problem.clone()], model));
    }
    let mut problems: Vec<String> = validate::in_cluster(name, &pdd.spec, &facts, ctx.render.workload_api)
        .into_iter()
        .filter(|f| f.severity == Severity::Error)
        .map(|f| f.to_string())
        .collect();
    if let Err(e) = &config {
        problems.push(validate::model_config_unread(e).to_string());
    }
    for finding in render::placement::judge(&pdd.spec, &topology_nodes(ctx, pdd).await?) {
        match finding.severity {
            Severity::Error => problems.push(finding.to_string()),
            Severity::Warning => ctx.event(pdd, EventType::Warning, "PlacementWarning", "Validate", finding.to_string()).await,
        }
    }
    Ok((facts, problems, model))
}

/// What one reconcile pass knows: the object, its pods as the cache shows them, and the newest
/// status this process knows.
struct Pass<'a> {
    ctx: &'a Context,
    pdd: &'a PDDeployment,
    ns: String,
    name: String,
    uid: String,
    status_key: String,
    known: Option<PDDeploymentStatus>,
    observed: Vec<ObservedPod>,
    /// The KV sets the PDDeployment's router pods pair, terminating pods included.
    router_pod_sets: BTreeSet<String>,
    now: Time,
    /// A Hub source's `ModelConfigResolved` (`model_config`), and when to read it again.
    model_config: Option<pd_core::model_read::Resolution>,
    retry: Option<Duration>,
    /// A cached Hub source's fetch (`model_fetch`).
    model_fetch: Option<pd_core::model_fetch::Fetch>,
}

/// What applying the plan left to report.
struct Outcome {
    requeue: Duration,
    /// Recreations under way, instances left down, the recreations that count.
    recovery: recovery::Standing,
}

impl<'a> Pass<'a> {
    /// The PDDeployment as the owner of its children.
    fn owner(&self) -> Owner<'_> {
        Owner { ns: &self.ns, name: &self.name, uid: &self.uid }
    }

    async fn observe(ctx: &'a Context, pdd: &'a PDDeployment, ns: String, name: String, uid: String) -> Result<Self, Error> {
        ctx.stores.ready().await?;
        // One scan of the pod cache: the engine pods (owned by the PDDeployment) and its router's
        // pods (owned by a ReplicaSet).
        let (mut observed, mut router_pod_sets) = (Vec::new(), BTreeSet::new());
        let label = |p: &Pod, key: &str| p.metadata.labels.as_ref().and_then(|l| l.get(key)).cloned();
        let mine = ctx.stores.pods.labelled(&ns, &name);
        for pod in &mine {
            if super::cache::owned_by(&pod.metadata, &uid) {
                observed.extend(ObservedPod::from_pod(pod));
            } else if label(pod, pd_api::labels::LABEL_ROLE).as_deref() == Some(pd_api::labels::ROUTER_ROLE) {
                router_pod_sets.insert(label(pod, pd_api::labels::LABEL_KV_SET).unwrap_or_default());
            }
        }
        // The cache hands pods out in no fixed order; messages that list them must not churn.
        observed.sort_by(|a, b| a.name.cmp(&b.name));
        let spec = &pdd.spec;
        plan::adopt_legacy(
            &mut observed,
            |role| render::role_revision(spec, role, &ctx.render),
            |role, image| render::legacy_role_revision(spec, role, image),
        );
        let status_key = format!("{ns}/{name}/{uid}");
        let known = ctx.known_status(&status_key, pdd);
        // Seen in the cache: from now on, a missing pod is really gone.
        ctx.forget_pods(&ns, observed.iter().map(|o| o.name.as_str()));
        let now = Time(jiff::Timestamp::now());
        Ok(Self {
            ctx,
            pdd,
            ns,
            name,
            uid,
            status_key,
            known,
            observed,
            router_pod_sets,
            now,
            model_config: None,
            retry: None,
            model_fetch: None,
        })
    }

    /// `spec.recovery` for this generation of the spec.
    fn budget(&self) -> recovery::Budget {
        recovery::Budget::of(&self.pdd.spec.recovery, self.pdd.metadata.generation)
    }

    /// The recreations of the known status that still count.
    fn recoveries(&self) -> Vec<pd_api::InstanceRecovery> {
        self.known.as_ref().map(|s| self.budget().current(&s.recoveries, self.now.0)).unwrap_or_default()
    }

    /// An outcome with nothing applied: requeue after `requeue`, the recoveries as they were.
    fn outcome(&self, requeue: Duration) -> Outcome {
        Outcome { requeue, recovery: recovery::Standing { counted: self.recoveries(), ..Default::default() } }
    }

    fn status_inputs<'s>(&'s self, validation: Result<(), String>, revisions: (&'s str, &'s str)) -> status::StatusInputs<'s> {
        status::StatusInputs {
            pdd: self.pdd,
            previous: self.known.as_ref(),
            validation,
            observed: &self.observed,
            nodes: (self.pdd.spec.prefill.nodes_per_instance(), self.pdd.spec.decode.nodes_per_instance()),
            revisions,
            router_ready: None,
            recovery: recovery::Standing { counted: self.recoveries(), ..Default::default() },
            kv_set: None,
            page_size: None,
            scaling: None,
            engine_verification: self.known.as_ref().and_then(|s| s.engine_verification.clone()),
            model_config: self.model_config.clone(),
            model_fetch: self.model_fetch.clone(),
            now: self.now.clone(),
        }
    }

    /// An invalid spec: `Validated=False` with the texts, one Event per new message, no children.
    async fn report_invalid(self, problems: Vec<String>) -> Result<Action, Error> {
        let message = problems.join("; ");
        let was_invalid = self
            .known
            .as_ref()
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == status::VALIDATED && c.is_false() && c.message == message));
        // An unread config.json is told once per change of `ModelConfigResolved` (a read under way
        // as Normal), not as an invalid spec: the rules have not run.
        let unread = self.model_config.as_ref().filter(|m| !m.resolved);
        let said = |type_: &str, text: &str| {
            self.known.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == type_ && c.message == text))
        };
        match unread {
            Some(m) if !said(pd_core::model_read::CONDITION, &m.message) => {
                let type_ = if m.reason == pd_core::model_read::READING { EventType::Normal } else { EventType::Warning };
                self.ctx.event(self.pdd, type_, &m.reason, "ReadModelConfig", m.message.clone()).await;
            }
            None if !was_invalid => self.ctx.event(self.pdd, EventType::Warning, "InvalidSpec", "Validate", message.clone()).await,
            _ => {}
        }
        let next = status::compute(&self.status_inputs(Err(message), ("", "")));
        write_status(self.ctx, &self.status_key, self.known.as_ref(), &self.ns, &self.name, next).await?;
        Ok(self.retry.map_or_else(Action::await_change, Action::requeue))
    }

    /// Reads the fetch of a cached Hub source into the pass.
    async fn with_fetch(mut self) -> Result<Self, Error> {
        self.model_fetch = self.read_fetch().await?;
        Ok(self)
    }

    /// Which KV set new pods go to and which the router pairs (`sets::decide`).
    fn decide_sets(&self, intent: &render::Intent) -> Result<Decision, Error> {
        let spec = &self.pdd.spec;
        let contracts = sets::SpecContracts::read(intent.contract(Role::Prefill), intent.contract(Role::Decode))?;
        let desired = sets::Desired {
            contracts: &contracts,
            revisions: (intent.revision(Role::Prefill), intent.revision(Role::Decode)),
            always_surge: spec.rollout.strategy == RolloutStrategy::Surge,
        };
        let want = |role: Role| (spec.instances(role), spec.role(role).nodes_per_instance());
        let want = sets::Want { prefill: want(Role::Prefill), decode: want(Role::Decode) };
        let router = self.router();
        let decision = sets::decide(&self.observed, &desired, router, want);
        if decision.target != decision.routed || !decision.retire.is_empty() {
            info!(target = decision.target, routed = decision.routed, retire = ?decision.retire, ?router, "KV sets");
        }
        Ok(decision)
    }

    /// The router Deployment in the cache: the KV set its pods pair, and whether its rollout is over.
    fn router(&self) -> Option<sets::Router> {
        sets::Router::observe(self.router_deployment()?.as_ref(), &self.router_pod_sets)
    }

    /// The router Deployment, as the cache shows it.
    fn router_deployment(&self) -> Option<Arc<Deployment>> {
        let wanted = pd_core::names::router_name(&self.name);
        let deployments = self.ctx.stores.deployments.as_ref()?.children(self.owner());
        deployments.into_iter().find(|d| d.metadata.name.as_deref() == Some(wanted.as_str()))
    }

    /// The target set's rollout, and the retirement of the sets the router left.
    fn plan(&self, rendered: &Rendered, sets: &Decision) -> Plan {
        let (rollout, now) = (&self.pdd.spec.rollout, jiff::Timestamp::now());
        let of = |set: u32| -> Vec<ObservedPod> { self.observed.iter().filter(|p| p.set == set).cloned().collect() };
        let mut plan = plan::plan(&rendered.instances, &rendered.surge, &of(sets.target), rollout, now);
        for old in &sets.retire {
            let why = format!("of KV set {old} goes: the router pairs set {}", sets.routed);
            plan.merge(plan::retire(&of(*old), rollout, now, &why));
        }
        plan
    }

    /// Every support object (the kinds of `pd_core::child_kinds!`), each applied when its content
    /// changed, in the list's stages; returns the router's ready replicas when the router is enabled.
    async fn apply_support(&self, rendered: &Rendered) -> Result<Option<i32>, Error> {
        let owner = self.owner();
        // An older KV set keeps its handshake ConfigMap and gangs while it has pods.
        let live: BTreeSet<String> = self.observed.iter().filter(|p| !p.deleting).map(|p| p.set.to_string()).collect();
        self.ctx.stores.sync(self.ctx, owner, rendered, &live).await?;
        Ok(self.pdd.spec.router.enabled.then(|| self.router_deployment().and_then(|d| d.status.as_ref()?.ready_replicas).unwrap_or(0)))
    }

    /// Deletes what the plan retires (recreations within their budget and past their backoff),
    /// then creates every missing pod.
    async fn apply_plan(&self, plan: &Plan) -> Result<Outcome, Error> {
        let mut outcome = self.outcome(self.ctx.resync);
        for d in &plan.drains {
            self.drain(d).await?;
        }
        if let Some(left) = plan.requeue_in {
            outcome.requeue = outcome.requeue.min(left + Duration::from_millis(200));
        }
        for d in &plan.deletes {
            if self.announce_delete(d, &mut outcome).await {
                self.delete_pods(&d.pods).await?;
            }
        }
        self.create_pods(plan).await?;
        if !plan.creates.is_empty() || !plan.deletes.is_empty() || !plan.drains.is_empty() {
            outcome.requeue = outcome.requeue.min(Duration::from_secs(2));
        }
        self.update_sidecar(&mut outcome).await?;
        Ok(outcome)
    }

    /// Moves one running decode pod to this operator's sidecar image, in place
    /// (`rollout.sidecarUpdate`, `pd_core::sidecar`).
    async fn update_sidecar(&self, outcome: &mut Outcome) -> Result<(), Error> {
        let image = &self.ctx.render.operator_image;
        let step = sidecar::next(&self.observed, image, self.pdd.spec.rollout.sidecar_update, jiff::Timestamp::now());
        if let Some(wait) = step.wake_in {
            outcome.requeue = outcome.requeue.min(wait + Duration::from_millis(200));
        }
        let Some(pod) = step.pod else { return Ok(()) };
        let patch = serde_json::json!({
            "metadata": {"annotations": {pd_api::labels::SIDECAR_UPDATED_AT: jiff::Timestamp::now().to_string()}},
            "spec": {"initContainers": [{"name": pd_core::names::SIDECAR_CONTAINER, "image": image}]},
        });
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        self.ctx.metrics.write("patch", "pods");
        let params = PatchParams { field_manager: Some(super::FIELD_MANAGER.into()), ..Default::default() };
        match api.patch(&pod, &params, &Patch::Strategic(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let from = step.from.unwrap_or_default();
        let note = format!("decode pod {pod}: handshake sidecar {from} -> {image} in place; the engine keeps running");
        self.ctx.event(self.pdd, EventType::Normal, "SidecarUpdated", "UpdateSidecar", note).await;
        outcome.requeue = outcome.requeue.min(sidecar::SETTLE + Duration::from_millis(200));
        Ok(())
    }

    /// Publishes the Event of one planned delete; false when a recreation waits out its backoff
    /// or the instance spent its recovery budget (`pd_core::recovery`).
    async fn announce_delete(&self, d: &plan::InstanceDelete, outcome: &mut Outcome) -> bool {
        let (ctx, pdd) = (self.ctx, self.pdd);
        if d.reason != DeleteReason::Recreate {
            let (reason, action) = match d.reason {
                DeleteReason::ScaleDown => ("InstanceDeleted", "ScaleDown"),
                _ => ("RolloutStep", "Rollout"),
            };
            ctx.event(pdd, EventType::Normal, reason, action, d.why.clone()).await;
            return true;
        }
        let (budget, now) = (self.budget(), self.now.0);
        match budget.decide(&outcome.recovery.counted, d.role, d.instance, now) {
            Verdict::Backoff(wait) => {
                outcome.recovery.recreating = Some(format!("{}; recreating in {}s (backoff)", d.why, wait.as_secs()));
                outcome.requeue = outcome.requeue.min(Duration::try_from(wait).unwrap_or_default() + Duration::from_millis(100));
                false
            }
            Verdict::Exhausted(until) => {
                self.hold(d, until, outcome).await;
                false
            }
            Verdict::Recreate => {
                let count = budget.record(&mut outcome.recovery.counted, d.role, d.instance, &d.why, now);
                outcome.recovery.recreating = Some(d.why.clone());
                let (role, i, window) = (d.role.as_str(), d.instance, budget.window.as_secs());
                let note = format!("{}: recreating {role} instance {i} whole (recreation {count} of {} in {window}s)", d.why, budget.max);
                ctx.event(pdd, EventType::Warning, "InstanceRecreated", "Recreate", note).await;
                true
            }
        }
    }

    /// Leaves an instance that spent its recovery budget down: `Degraded` names it, one Event
    /// says so, and a pass comes back when its window closes.
    async fn hold(&self, d: &plan::InstanceDelete, until: Option<jiff::Timestamp>, outcome: &mut Outcome) {
        let now = self.now.0;
        let message = self.budget().exhausted_message(&outcome.recovery.counted, d.role, d.instance, &d.why, now);
        if let Some(until) = until {
            let left = Duration::try_from(until.duration_since(now)).unwrap_or_default();
            outcome.requeue = outcome.requeue.min(left + Duration::from_millis(100));
        }
        let named = recovery::left_down(d.role, d.instance);
        let conditions = self.known.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        let told = conditions.iter().any(|c| c.type_ == status::DEGRADED && c.reason == recovery::EXHAUSTED && c.message.contains(&named));
        if !told {
            self.ctx.event(self.pdd, EventType::Warning, recovery::EXHAUSTED, "Recreate", message.clone()).await;
        }
        outcome.recovery.held = Some(match outcome.recovery.held.take() {
            Some(before) => format!("{before}; {message}"),
            None => message,
        });
    }

    /// Takes an instance out of the router's pool (`serving=false`) and notes when, so it is
    /// deleted once the drain period has passed.
    async fn drain(&self, d: &plan::InstanceDrain) -> Result<(), Error> {
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let now = jiff::Timestamp::now().to_string();
        let patch = serde_json::json!({"metadata": {
            "labels": {pd_api::labels::LABEL_SERVING: "false"},
            "annotations": {pd_api::labels::DRAINING_SINCE: now},
        }});
        for pod in &d.pods {
            self.ctx.metrics.write("patch", "pods");
            match api
                .patch(pod, &PatchParams { field_manager: Some(super::FIELD_MANAGER.into()), ..Default::default() }, &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        let note = format!("{}: out of the router's pool, deleted in {}s", d.why, self.pdd.spec.rollout.drain_seconds);
        self.ctx.event(self.pdd, EventType::Normal, "InstanceDraining", "Drain", note).await;
        Ok(())
    }

    async fn delete_pods(&self, pods: &[String]) -> Result<(), Error> {
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        for pod in pods {
            self.ctx.forget_pods(&self.ns, [pod.as_str()]);
            self.ctx.metrics.write("delete", "pods");
            match api.delete(pod, &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Every missing pod at once (the instances of a new PDDeployment are independent), then one
    /// Event naming the instances that were created.
    async fn create_pods(&self, plan: &Plan) -> Result<(), Error> {
        let (ctx, ns) = (self.ctx, self.ns.as_str());
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        let pods = plan.creates.iter().enumerate().flat_map(|(group, (_, _, pods))| pods.iter().map(move |pod| (group, pod)));
        // Created moments ago and not in the cache yet: the watch is behind, not the pod gone.
        let applies = pods.filter(|(_, pod)| !ctx.expecting(ns, &pod_name(pod))).map(|(group, pod)| {
            let api = &api;
            async move {
                let pname = pod_name(pod);
                let applied = ctx.apply(api, &pname, pod).await?;
                if applied.metadata.deletion_timestamp.is_some() {
                    // The name still belongs to a pod on its way out (the cache had not shown it):
                    // the apply only touched that pod. Once it is gone, a later pass creates anew.
                    return Ok::<_, Error>(None);
                }
                ctx.expect_pod(ns, &pname);
                Ok(Some(group))
            }
        });
        let new_in_group: Vec<usize> = futures::future::try_join_all(applies).await?.into_iter().flatten().collect();
        let created: Vec<String> = plan
            .creates
            .iter()
            .enumerate()
            .filter(|(i, _)| new_in_group.contains(i))
            .map(|(_, (role, instance, group))| format!("{} instance {instance} ({} pods)", role.as_str(), group.len()))
            .collect();
        if !created.is_empty() {
            ctx.event(self.pdd, EventType::Normal, "InstancesCreated", "Create", format!("created {}", created.join(", "))).await;
        }
        Ok(())
    }

    /// Computes the status; writes it now, or later when it is only progress (coalesced).
    /// The status counts the pods of the set the router pairs; the KV sets are reported beside.
    async fn report(
        self,
        router_ready: Option<i32>,
        outcome: Outcome,
        decided: (Decision, &render::Intent, &Scaled),
        page_size: u32,
        engine_verification: Option<pd_api::EngineVerification>,
    ) -> Result<Action, Error> {
        let (ctx, (sets, intent, scaled)) = (self.ctx, decided);
        let routed: Vec<ObservedPod> = self.observed.iter().filter(|p| p.set == sets.routed).cloned().collect();
        let inputs = status::StatusInputs {
            router_ready,
            recovery: outcome.recovery,
            observed: &routed,
            kv_set: Some(sets.status),
            page_size: Some(page_size),
            scaling: Some(scaled),
            engine_verification,
            ..self.status_inputs(Ok(()), (intent.revision(Role::Prefill), intent.revision(Role::Decode)))
        };
        let next = status::compute(&inputs);
        // Progress held back is held for the PDRoles too: their counts follow the PDDeployment's
        // own within its pacing (at most `STATUS_MAX_INTERVAL`), one write each per step.
        if let Some(wait) = status_delay(ctx, &self.status_key, self.known.as_ref(), &next) {
            return Ok(Action::requeue(outcome.requeue.min(wait + Duration::from_millis(50))));
        }
        scale::write_status(ctx, self.owner(), scaled, &routed).await?;
        if let Some((kind, reason, note)) = status::handshake_transition(self.known.as_ref(), &next) {
            let type_ = if kind == status::EventKind::Normal { EventType::Normal } else { EventType::Warning };
            ctx.event(self.pdd, type_, &reason, "Handshake", note).await;
        }
        if let Some(note) = scaling::limited_transition(self.known.as_ref(), &next) {
            ctx.event(self.pdd, EventType::Warning, scaling::SCALING_LIMITED_EVENT, "Scale", note).await;
        }
        if let Some((reason, note)) = status::rollout_transition(self.known.as_ref(), &next) {
            ctx.event(self.pdd, EventType::Normal, reason, "Rollout", note).await;
        }
        write_status(ctx, &self.status_key, self.known.as_ref(), &self.ns, &self.name, next).await?;
        Ok(Action::requeue(outcome.requeue))
    }
}

fn pod_name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    use kube::Resource;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use serde_json::Value;

    use super::*;
    use crate::controller::cache::{Cache, DeploymentIndex};
    use crate::controller::children::{CacheSource, ChildStores};
    use crate::controller::metrics::Metrics;

    /// One request the scripted API received: method, path, body.
    type Recorded = (String, String, Value);

    /// A scripted API server: records every request and answers each write by echoing its body
    /// (what server-side apply returns for an object no other manager touches).
    fn scripted_api() -> (kube::Client, Arc<Mutex<Vec<Recorded>>>) {
        let log: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let recorder = log.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let log = recorder.clone();
            async move {
                let (parts, body) = req.into_parts();
                let body: Value = serde_json::from_slice(&body.collect_bytes().await?).unwrap_or(Value::Null);
                let path = parts.uri.path().to_owned();
                log.lock().unwrap().push((parts.method.to_string(), path.clone(), body.clone()));
                let mut answer = body.clone();
                if parts.method == http::Method::GET {
                    // Nothing exists but what the caches hold.
                    let missing =
                        serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404});
                    let missing = http_body_util::Full::new(bytes::Bytes::from(serde_json::to_vec(&missing).unwrap()));
                    return Ok(http::Response::builder().status(404).header("content-type", "application/json").body(missing).unwrap());
                }
                if path.ends_with("/status") {
                    // A status apply carries only the status; the server answers with the whole object.
                    answer = if path.contains("/pdroles/") {
                        serde_json::json!({"apiVersion": "pd.inference.dev/v1alpha1", "kind": "PDRole", "metadata": {}, "spec": {"role": "decode"}})
                    } else {
                        serde_json::to_value(qwen().0.as_ref().unwrap()).unwrap()
                    };
                    answer["status"] = body["status"].clone();
                }
                let answer = http_body_util::Full::new(bytes::Bytes::from(serde_json::to_vec(&answer).unwrap()));
                Ok::<_, kube::Error>(http::Response::builder().header("content-type", "application/json").body(answer).unwrap())
            }
        });
        (kube::Client::new(service, "default"), log)
    }

    /// A cache already listed (ready), holding `objects`.
    fn store<K>(objects: Vec<K>) -> Cache<K>
    where
        K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    {
        let mut writer = Writer::default();
        let reader = writer.as_reader();
        let index = DeploymentIndex::default();
        let events = std::iter::once(Event::Init).chain(objects.into_iter().map(Event::InitApply)).chain([Event::InitDone]);
        for e in events {
            writer.apply_watcher_event(&e);
            index.observe(&e);
        }
        Cache::new(reader, index)
    }

    /// The objects of kind `plural` the scripted API was asked to apply.
    fn applied<K: serde::de::DeserializeOwned>(log: &[Recorded], plural: &str) -> Vec<K> {
        let marker = format!("/{plural}/");
        let bodies = log.iter().filter(|(m, p, _)| m == "PATCH" && p.contains(&marker) && !p.ends_with("/status"));
        bodies.map(|(_, _, body)| serde_json::from_value(body.clone()).unwrap()).collect()
    }

    /// Caches holding what the scripted API was asked to apply.
    struct AppliedBy<'a>(&'a [Recorded]);

    impl CacheSource for AppliedBy<'_> {
        fn cache<K>(&self) -> Cache<K>
        where
            K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
        {
            store(applied(self.0, &K::plural(&())))
        }
    }

    fn stores_from(log: &[Recorded]) -> ChildStores {
        ChildStores { pod_groups: None, ..ChildStores::from_source(&AppliedBy(log)) }
    }

    fn qwen() -> Arc<DeserializeGuard<PDDeployment>> {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/qwen3-gqa.yaml")).unwrap();
        let mut pdd: PDDeployment = serde_norway::from_str(&text).unwrap();
        pdd.metadata.namespace = Some("ns".into());
        pdd.metadata.uid = Some("uid-1".into());
        pdd.metadata.generation = Some(1);
        // These tests are about the children and pods; the dry run's gate has tests of its own.
        pdd.spec.engine.dry_run = Some(pd_api::DryRunPolicy::Off);
        Arc::new(DeserializeGuard(Ok(pdd)))
    }

    fn context(client: kube::Client, stores: ChildStores) -> Arc<Context> {
        context_budget(client, stores, pd_core::bounds::DEFAULT_MAX_RENDERED_PODS)
    }

    fn context_budget(client: kube::Client, stores: ChildStores, max_rendered_pods: u32) -> Arc<Context> {
        let settings = crate::controller::Settings {
            admin_addr: "127.0.0.1:0".parse().unwrap(),
            render: pd_core::render::RenderOptions {
                operator_image: "pd-operator:test".into(),
                default_namespace: "ns".into(),
                ..Default::default()
            },
            namespace: None,
            max_concurrent_reconciles: 1,
            max_rendered_pods,
            resync: Duration::from_secs(300),
            leader_election: None,
            webhook: None,
            discover_workload_api: false,
            egress: Default::default(),
            max_pods: pd_core::bounds::DEFAULT_MAX_PODS_PER_DEPLOYMENT,
        };
        Arc::new(Context::new(client, &settings, Arc::new(Metrics::default()), stores))
    }

    /// Attack on the old main: 32 reconciles of objects at the pod limit rendered 16,384 pods at
    /// once (about 490 MB), past the chart's 256 Mi. Now a pass holds its pod count of the budget
    /// until it ends: a second large object waits for the first, a small one fits beside it.
    #[tokio::test]
    async fn passes_together_hold_at_most_the_render_budget() {
        let ctx = context_budget(scripted_api().0, stores_from(&[]), 600);
        let mut big = qwen().0.clone().unwrap().spec;
        (big.prefill.replicas, big.decode.replicas) = (250, 250);
        let pods = pd_core::bounds::render_permits(&big, u32::MAX);
        assert!((500..=512).contains(&pods), "{pods} pods");
        let first = ctx.render_share(&big).await.expect("a share");
        let second = tokio::time::timeout(Duration::from_millis(50), ctx.render_share(&big)).await;
        assert!(second.is_err(), "a second object of {pods} pods rendered beside the first within a budget of 600");
        let small = qwen().0.clone().unwrap().spec;
        let beside = tokio::time::timeout(Duration::from_millis(50), ctx.render_share(&small)).await;
        assert!(beside.is_ok_and(|p| p.is_some()), "a small object waits for nothing");
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), ctx.render_share(&big)).await;
        assert!(second.is_ok_and(|p| p.is_some()), "the share comes back when the first pass ends");
    }

    /// What a pass wrote: (method, path) of every request but reads and Events.
    fn writes(log: &[Recorded]) -> Vec<(String, String)> {
        log.iter().filter(|(m, p, _)| m != "GET" && !p.contains("/events")).map(|(m, p, _)| (m.clone(), p.clone())).collect()
    }

    #[tokio::test]
    async fn a_new_pddeployment_gets_every_rendered_child_in_order_and_a_second_pass_writes_no_child() {
        let (client, log) = scripted_api();
        let ctx = context(client, stores_from(&[]));
        reconcile(qwen(), ctx).await.unwrap();
        let first = log.lock().unwrap().clone();
        let written = writes(&first);
        // Exactly the objects `render` prints, each applied once, plus the status.
        let pdd = qwen().0.clone().unwrap();
        let rendered =
            render::render(&pdd, &pd_core::model::resolve(&pdd.spec.model, None), &context(scripted_api().0, stores_from(&[])).render)
                .unwrap();
        let pods = rendered.pods().map(|p| ("pods".to_owned(), p.metadata.name.clone().unwrap()));
        let want: BTreeSet<(String, String)> =
            rendered.child_names().into_iter().map(|(plural, name)| (plural.to_owned(), name)).chain(pods).collect();
        let kind_and_name = |path: &str| {
            let mut parts = path.rsplit('/');
            let name = parts.next().unwrap().to_owned();
            (parts.next().unwrap().to_owned(), name)
        };
        let children: Vec<(String, String)> =
            written.iter().filter(|(_, p)| !p.ends_with("/status")).map(|(_, p)| kind_and_name(p)).collect();
        assert_eq!(children.len(), want.len(), "each child applied once: {children:?}");
        assert_eq!(children.into_iter().collect::<BTreeSet<_>>(), want);
        assert_eq!(written.iter().filter(|(m, _)| m != "PATCH").count(), 0, "no creates or deletes but by apply: {written:?}");
        assert!(written.iter().any(|(_, p)| p.ends_with("/pddeployments/qwen3/status")), "{written:?}");
        let at = |kind: &str| written.iter().position(|(_, p)| p.contains(&format!("/{kind}/"))).unwrap();
        assert!(at("roles") < at("rolebindings"), "the RoleBinding goes after its Role: {written:?}");
        assert!(at("serviceaccounts") < at("pods"), "pods go after their ServiceAccount: {written:?}");

        // The caches now show what was applied: nothing is applied again.
        let (client, log) = scripted_api();
        reconcile(qwen(), context(client, stores_from(&first))).await.unwrap();
        let second = writes(&log.lock().unwrap());
        assert!(second.iter().all(|(_, p)| p.ends_with("/status")), "children written again: {second:?}");
    }

    /// A cache that does not show this process's own PDRole status write yet (the watch lags):
    /// a second pass with the same numbers writes no PDRole status again.
    #[tokio::test]
    async fn a_pdrole_status_is_written_once_while_the_cache_lags_behind_it() {
        let (client, log) = scripted_api();
        reconcile(qwen(), context(client, stores_from(&[]))).await.unwrap();
        let first = log.lock().unwrap().clone();
        let (client, log) = scripted_api();
        let ctx = context(client, stores_from(&first));
        let role_status_writes = |log: &Mutex<Vec<Recorded>>| {
            writes(&log.lock().unwrap()).iter().filter(|(_, p)| p.contains("/pdroles/") && p.ends_with("/status")).count()
        };
        reconcile(qwen(), ctx.clone()).await.unwrap();
        assert_eq!(role_status_writes(&log), 2, "each role's status, once: {:?}", writes(&log.lock().unwrap()));
        reconcile(qwen(), ctx).await.unwrap();
        assert_eq!(role_status_writes(&log), 2, "written again: {:?}", writes(&log.lock().unwrap()));
    }

    #[tokio::test]
    async fn engine_pods_of_the_previous_release_are_adopted_not_restarted() {
        let (client, log) = scripted_api();
        reconcile(qwen(), context(client, stores_from(&[]))).await.unwrap();
        // The same pods as pd-operator 0.1.0 made them: its revision label and its sidecar image.
        let spec = qwen().0.clone().unwrap().spec;
        let mut first = log.lock().unwrap().clone();
        for (_, path, body) in first.iter_mut().filter(|(m, p, _)| m == "PATCH" && p.contains("/pods/")) {
            let role = if body["metadata"]["labels"][pd_api::labels::LABEL_ROLE] == "prefill" { Role::Prefill } else { Role::Decode };
            body["metadata"]["labels"][pd_api::labels::LABEL_REVISION] =
                render::legacy_role_revision(&spec, role, "pd-operator:0.1.0").unwrap().into();
            for c in body["spec"]["initContainers"].as_array_mut().into_iter().flatten() {
                c["image"] = "pd-operator:0.1.0".into();
            }
            assert!(!path.is_empty());
        }
        let (client, log) = scripted_api();
        reconcile(qwen(), context(client, stores_from(&first))).await.unwrap();
        let second = writes(&log.lock().unwrap());
        assert!(second.iter().all(|(_, p)| p.ends_with("/status")), "an operator upgrade wrote engine pods: {second:?}");
        let updated = |log: &[Recorded]| {
            let status = &log.iter().rev().find(|(_, p, _)| p.ends_with("/status")).expect("a status write").2["status"];
            (status["prefill"]["updatedReplicas"].as_i64(), status["decode"]["updatedReplicas"].as_i64())
        };
        assert_eq!(updated(&log.lock().unwrap()), (Some(2), Some(2)), "the adopted pods count as updated");
        // A revision no release gave is not adopted: that pod is outdated.
        let mut odd = first.clone();
        let pod = odd
            .iter_mut()
            .find(|(m, p, b)| m == "PATCH" && p.contains("/pods/") && b["metadata"]["labels"][pd_api::labels::LABEL_ROLE] == "prefill");
        pod.unwrap().2["metadata"]["labels"][pd_api::labels::LABEL_REVISION] = "0000000000".into();
        let (client, log) = scripted_api();
        reconcile(qwen(), context(client, stores_from(&odd))).await.unwrap();
        assert_eq!(updated(&log.lock().unwrap()), (Some(1), Some(2)), "an unknown revision is not the current one");
    }

    #[tokio::test]
    async fn a_new_sglang_pddeployment_gets_its_dry_run_pod_and_no_engine_pod_until_a_verdict() {
        let (client, log) = scripted_api();
        let mut pdd = qwen().0.clone().unwrap();
        pdd.spec.engine.dry_run = None;
        reconcile(Arc::new(DeserializeGuard(Ok(pdd))), context(client, stores_from(&[]))).await.unwrap();
        let written = writes(&log.lock().unwrap());
        let pods: Vec<&String> = written.iter().filter(|(_, p)| p.contains("/pods/")).map(|(_, p)| p).collect();
        assert_eq!(pods.len(), 1, "only the dry-run pod: {pods:?}");
        assert!(pods[0].contains("/pods/qwen3-dry-run-"), "{pods:?}");
        assert!(written.iter().any(|(_, p)| p.ends_with("/configmaps/qwen3-dry-run-shim")), "the shim's ConfigMap: {written:?}");
        let log = log.lock().unwrap();
        let status = &log.iter().rev().find(|(_, p, _)| p.ends_with("/status")).expect("a status write").2["status"];
        assert_eq!(status["engineVerification"]["result"], "Pending", "{status}");
        let cond = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == status::ENGINE_VERIFIED).unwrap();
        assert_eq!((cond["status"].as_str(), cond["reason"].as_str()), (Some("Unknown"), Some("Pending")));
        assert!(cond["message"].as_str().unwrap().starts_with("waiting for the dry-run pod qwen3-dry-run-"), "{cond}");
    }

    /// Today's main renders every pod of such a spec in memory before its first API call.
    #[tokio::test]
    async fn a_pddeployment_past_the_pod_limit_is_reported_invalid_and_gets_no_child() {
        let (client, log) = scripted_api();
        let mut pdd = qwen().0.clone().unwrap();
        pdd.spec.decode.replicas = 1000;
        reconcile(Arc::new(DeserializeGuard(Ok(pdd))), context(client, stores_from(&[]))).await.unwrap();
        let log = log.lock().unwrap().clone();
        let written = writes(&log);
        assert!(written.iter().all(|(_, p)| p.ends_with("/status")), "children written: {written:?}");
        let status = &log.iter().rev().find(|(_, p, _)| p.ends_with("/status")).expect("a status write").2["status"];
        let cond = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == status::VALIDATED).unwrap();
        assert_eq!(cond["status"], "False", "{cond}");
        let message = cond["message"].as_str().unwrap();
        assert!(message.contains("spec.decode.replicas: spec asks for 1002 engine pods (prefill 2 instances x 1 node, decode 1000 instances x 1 node); this operator allows at most 512 per PDDeployment"), "{message}");
    }
}
