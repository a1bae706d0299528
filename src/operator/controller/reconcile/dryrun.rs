//! The engine dry run's gate in a reconcile (docs/dry-run.md): before the plan creates engine
//! pods for processes no verdict covers, the dry-run pod runs; the plan waits for its verdict.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kube::runtime::events::EventType;
use tracing::info;

use pd_api::{DryRunPolicy, EngineVerification};
use pd_core::dryrun::{self, Gate, Reading};
use pd_core::plan::{DeleteReason, Plan};
use pd_core::render::Rendered;
use pd_core::status;

use super::{Error, Pass};

/// How often a pass looks at a dry run under way (its pod's changes wake one too).
const POLL: Duration = Duration::from_secs(5);
/// A closed gate looks again when a dry run without a verdict may run again.
const RETRY: Duration = Duration::from_secs(dryrun::RETRY_SECONDS.unsigned_abs());

/// What the gate decided for this pass.
pub(super) struct Decision {
    /// The verification to report (`status.engineVerification`).
    pub verification: Option<EngineVerification>,
    /// Whether the plan may run.
    pub open: bool,
    /// When to look again, while a dry run is under way.
    pub requeue: Option<Duration>,
}

/// Whether the plan starts engine processes: creates pods, or takes pods of an older revision
/// down for them. Scaling down and nothing-to-do need no verdict.
pub(super) fn starts_engines(plan: &Plan) -> bool {
    !plan.creates.is_empty() || !plan.drains.is_empty() || plan.deletes.iter().any(|d| d.reason == DeleteReason::Rollout)
}

impl Pass<'_> {
    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.ctx.client.clone(), &self.ns)
    }

    /// The gate: a verdict for the processes `rendered` runs, or a dry run under way.
    pub(super) async fn engine_gate(&self, rendered: &Rendered, plan: &Plan) -> Result<Decision, Error> {
        let known = self.known.as_ref().and_then(|s| s.engine_verification.clone());
        let policy = self.pdd.spec.engine.dry_run_policy();
        let run = dryrun::dry_run(self.pdd, &rendered.instances, &self.ctx.render)?;
        let current = run.as_ref().and_then(|r| known.clone().filter(|v| v.key == r.key));
        self.clean_up(current.as_ref().filter(|v| v.result == dryrun::PENDING).and_then(|v| v.pod.as_deref())).await?;
        let Some(run) = run else { return Ok(Decision { verification: None, open: true, requeue: None }) };
        if current.is_none() && !starts_engines(plan) {
            return Ok(Decision { verification: known, open: true, requeue: None });
        }
        let since = self.seconds_since_verdict();
        match dryrun::gate(policy, current.as_ref(), &run.key, since) {
            Gate::Open => Ok(Decision { verification: current, open: true, requeue: None }),
            Gate::Closed => Ok(Decision { verification: current, open: false, requeue: Some(RETRY) }),
            Gate::Run | Gate::Wait => self.run_or_read(run, policy).await,
        }
    }

    /// Seconds since `EngineVerified` last changed.
    fn seconds_since_verdict(&self) -> i64 {
        let conditions = self.known.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        let at = conditions.iter().find(|c| c.type_ == status::ENGINE_VERIFIED).map(|c| c.last_transition_time.0.as_second());
        at.map_or(i64::MAX, |t| self.now.0.as_second() - t)
    }

    /// Creates the dry-run pod, or reads the one that exists; a verdict deletes it.
    async fn run_or_read(&self, run: dryrun::DryRun, policy: DryRunPolicy) -> Result<Decision, Error> {
        let (api, name) = (self.pods_api(), run.pod.metadata.name.clone().unwrap_or_default());
        let pending = |message: String| EngineVerification {
            key: run.key.clone(),
            result: dryrun::PENDING.into(),
            message,
            pod: Some(name.clone()),
            ..Default::default()
        };
        let waiting = |message| Ok(Decision { verification: Some(pending(message)), open: false, requeue: Some(POLL) });
        let Some(pod) = api.get_opt(&name).await? else {
            self.ctx.apply(&api, &name, &run.pod).await?;
            info!(pod = %name, key = %run.key, "engine dry run started");
            let note = format!("running the engine image's own start-up resolution on every process in pod {name} before any GPU pod");
            self.ctx.event(self.pdd, EventType::Normal, "EngineDryRun", "DryRun", note).await;
            return waiting(format!("waiting for the dry-run pod {name} to start"));
        };
        if pod.metadata.deletion_timestamp.is_some() {
            return waiting(format!("waiting for the earlier dry-run pod {name} to go"));
        }
        let verdict = match dryrun::read(&pod, &run.key, self.now.0.as_second()) {
            Reading::Waiting(message) => return waiting(message),
            Reading::Done(verdict) => verdict,
        };
        self.delete_pod(&name).await?;
        let open = match verdict.result.as_str() {
            dryrun::VERIFIED => true,
            dryrun::REFUSED => false,
            _ => policy == DryRunPolicy::BestEffort,
        };
        let (type_, note) = if verdict.result == dryrun::VERIFIED {
            (EventType::Normal, verdict.message.clone())
        } else {
            (EventType::Warning, format!("{}; no engine pod {}", verdict.message, if open { "waits (BestEffort)" } else { "is created" }))
        };
        info!(pod = %name, result = %verdict.result, "engine dry run ended");
        let reason = match verdict.result.as_str() {
            dryrun::VERIFIED => "EngineVerified",
            dryrun::REFUSED => "EngineRefused",
            dryrun::TIMED_OUT => "EngineDryRunTimedOut",
            _ => "EngineDryRunNoVerdict",
        };
        self.ctx.event(self.pdd, type_, reason, "DryRun", note).await;
        Ok(Decision { verification: Some(verdict), open, requeue: None })
    }

    /// Deletes the PDDeployment's dry-run pods but `keep` (the one under way).
    async fn clean_up(&self, keep: Option<&str>) -> Result<(), Error> {
        let pods = self.ctx.stores.pods.children(self.owner());
        let role = |p: &Pod| p.metadata.labels.as_ref().and_then(|l| l.get(pd_api::labels::LABEL_ROLE)).cloned();
        for pod in
            pods.iter().filter(|p| role(p).as_deref() == Some(pd_core::names::DRY_RUN_ROLE) && p.metadata.deletion_timestamp.is_none())
        {
            let name = pod.metadata.name.clone().unwrap_or_default();
            if keep != Some(name.as_str()) {
                self.delete_pod(&name).await?;
            }
        }
        Ok(())
    }

    async fn delete_pod(&self, name: &str) -> Result<(), Error> {
        self.ctx.metrics.write("delete", "pods");
        match self.pods_api().delete(name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
