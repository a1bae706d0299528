//! One reconcile of a PDDeployment, as its steps: read → validate → render → plan → apply → status.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::{Instrument, info_span, warn};

use super::plan::{self, DeleteReason, ObservedPod, Plan};
use super::{Context, Error, children_in, model_config, status, status_delay, write_status};
use crate::api::{PDDeployment, PDDeploymentStatus};
use crate::model::ModelFacts;
use crate::render::{self, Rendered};
use crate::validate::{self, Role, Severity};

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
        let (facts, problems) = read_and_validate(&ctx, pdd, &ns, &name).await?;
        let pass = Pass::observe(&ctx, pdd, ns, name, uid).await?;
        if !problems.is_empty() {
            return pass.report_invalid(problems).await;
        }
        let rendered = render::render(pdd, &facts, &ctx.render)?;
        let router_ready = pass.apply_support(&rendered).await?;
        let plan = plan::plan(&rendered.pods, &pass.observed, pdd.spec.rollout.max_unavailable.max(1) as u32);
        let outcome = pass.apply_plan(&plan).await?;
        pass.report(router_ready, outcome).await
    }
    .instrument(span)
    .await;
    ctx.metrics.duration.observe(started.elapsed().as_secs_f64());
    result
}

/// Read the model's config (if referenced) and run the same rules as `validate` and the webhook;
/// the errors found, as `field: text (fix: …)`.
async fn read_and_validate(ctx: &Context, pdd: &PDDeployment, ns: &str, name: &str) -> Result<(ModelFacts, Vec<String>), Error> {
    let config = model_config(&ctx.client, pdd, ns).await?;
    let facts = crate::model::resolve(&pdd.spec.model, config.as_ref().ok().and_then(Option::as_ref));
    let mut problems: Vec<String> = validate::validate_with_facts(name, &pdd.spec, &facts)
        .into_iter()
        .filter(|f| f.severity == Severity::Error)
        .map(|f| format!("{}: {} (fix: {})", f.field, f.message, f.fix))
        .collect();
    if let Err(e) = &config {
        problems.push(format!("spec.model.configMapRef: {e}"));
    }
    Ok((facts, problems))
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
    now: Time,
}

/// What applying the plan left to report.
struct Outcome {
    requeue: Duration,
    degraded: Option<String>,
}

impl<'a> Pass<'a> {
    async fn observe(ctx: &'a Context, pdd: &'a PDDeployment, ns: String, name: String, uid: String) -> Result<Self, Error> {
        ctx.stores.ready().await?;
        let mut observed: Vec<ObservedPod> =
            children_in(&ctx.stores.pods, &ns, &name, &uid).iter().filter_map(|p| ObservedPod::from_pod(p)).collect();
        // The cache hands pods out in no fixed order; messages that list them must not churn.
        observed.sort_by(|a, b| a.name.cmp(&b.name));
        let status_key = format!("{ns}/{name}/{uid}");
        let known = ctx.known_status(&status_key, pdd);
        // Seen in the cache: from now on, a missing pod is really gone.
        ctx.forget_pods(&ns, observed.iter().map(|o| o.name.as_str()));
        Ok(Self { ctx, pdd, ns, name, uid, status_key, known, observed, now: Time(jiff::Timestamp::now()) })
    }

    fn status_inputs<'s>(&'s self, validation: Result<(), String>, revisions: (&'s str, &'s str)) -> status::StatusInputs<'s> {
        status::StatusInputs {
            pdd: self.pdd,
            previous: self.known.as_ref(),
            validation,
            observed: &self.observed,
            nodes: (render::nodes_per_instance(&self.pdd.spec.prefill), render::nodes_per_instance(&self.pdd.spec.decode)),
            revisions,
            router_ready: None,
            degraded: None,
            now: self.now.clone(),
        }
    }

    /// An invalid spec: `Validated=False` with the texts, one Event per new message, no children.
    async fn report_invalid(self, problems: Vec<String>) -> Result<Action, Error> {
        let message = problems.join("; ");
        let was_invalid = self
            .known
            .as_ref()
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == status::VALIDATED && c.status == "False" && c.message == message));
        if !was_invalid {
            self.ctx.event(self.pdd, EventType::Warning, "InvalidSpec", "Validate", message.clone()).await;
        }
        let next = status::compute(&self.status_inputs(Err(message), ("", "")));
        write_status(self.ctx, &self.status_key, self.known.as_ref(), &self.ns, &self.name, next).await?;
        Ok(Action::await_change())
    }

    /// Services, the handshake ConfigMap, the sidecar's RBAC and the router, each applied when its
    /// content changed; returns the router's ready replicas when the router is enabled.
    async fn apply_support(&self, rendered: &Rendered) -> Result<Option<i32>, Error> {
        let (ctx, ns, name, uid) = (self.ctx, self.ns.as_str(), self.name.as_str(), self.uid.as_str());
        let stores = &ctx.stores;
        // Sent together, except the RoleBinding after its Role: RBAC's escalation check reads the
        // Role (NotFound if it is not there yet) unless the caller may bind any role. Pods come
        // after all of them, since admission refuses a pod whose ServiceAccount does not exist.
        let rbac = async {
            ctx.sync_children(&stores.roles, ns, name, uid, &rendered.roles).await?;
            ctx.sync_children(&stores.role_bindings, ns, name, uid, &rendered.role_bindings).await
        };
        let (_, _, _, _, routers) = futures::try_join!(
            ctx.sync_children(&stores.services, ns, name, uid, &rendered.services),
            ctx.sync_children(&stores.config_maps, ns, name, uid, &rendered.config_maps),
            ctx.sync_children(&stores.service_accounts, ns, name, uid, &rendered.service_accounts),
            rbac,
            ctx.sync_children(&stores.deployments, ns, name, uid, &rendered.deployments),
        )?;
        Ok(self
            .pdd
            .spec
            .router
            .enabled
            .then(|| routers.first().and_then(|d| d.status.as_ref()).and_then(|s| s.ready_replicas).unwrap_or(0)))
    }

    /// Deletes what the plan retires (recreations under backoff), then creates every missing pod.
    async fn apply_plan(&self, plan: &Plan) -> Result<Outcome, Error> {
        let mut outcome = Outcome { requeue: self.ctx.resync, degraded: None };
        for d in &plan.deletes {
            if self.announce_delete(d, &mut outcome).await {
                self.delete_pods(&d.pods).await?;
            }
        }
        self.create_pods(plan).await?;
        if !plan.creates.is_empty() || !plan.deletes.is_empty() {
            outcome.requeue = outcome.requeue.min(Duration::from_secs(2));
        }
        Ok(outcome)
    }

    /// Publishes the Event of one planned delete; false when a recreation must wait out its backoff.
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
        let key = format!("{}/{}/{}/{}", self.ns, self.name, d.role.as_str(), d.instance);
        if let Some(wait) = ctx.backoff_remaining(&key) {
            outcome.degraded = Some(format!("{}; recreating in {}s (backoff)", d.why, wait.as_secs()));
            outcome.requeue = outcome.requeue.min(wait + Duration::from_millis(100));
            return false;
        }
        let attempt = ctx.note_recreate(key);
        outcome.degraded = Some(d.why.clone());
        let note = format!("{}: recreating {} instance {} (attempt {attempt})", d.why, d.role.as_str(), d.instance);
        ctx.event(pdd, EventType::Warning, "InstanceRecreated", "Recreate", note).await;
        true
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
    async fn report(self, router_ready: Option<i32>, outcome: Outcome) -> Result<Action, Error> {
        let (ctx, spec) = (self.ctx, &self.pdd.spec);
        let revisions = (render::role_revision(spec, Role::Prefill, &ctx.render), render::role_revision(spec, Role::Decode, &ctx.render));
        let inputs =
            status::StatusInputs { router_ready, degraded: outcome.degraded, ..self.status_inputs(Ok(()), (&revisions.0, &revisions.1)) };
        let next = status::compute(&inputs);
        if let Some(wait) = status_delay(ctx, &self.status_key, self.known.as_ref(), &next) {
            return Ok(Action::requeue(outcome.requeue.min(wait + Duration::from_millis(50))));
        }
        if let Some((type_, reason, note)) = status::handshake_transition(self.known.as_ref(), &next) {
            ctx.event(self.pdd, type_, &reason, "Handshake", note).await;
        }
        write_status(ctx, &self.status_key, self.known.as_ref(), &self.ns, &self.name, next).await?;
        Ok(Action::requeue(outcome.requeue))
    }
}

fn pod_name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}
