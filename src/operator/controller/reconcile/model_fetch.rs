//! Fetched once in a reconcile (`pd_core::model_fetch`): the fetch Job is applied with the other
//! children, unless another PDDeployment's Job already fetches the same revision into the same
//! claim (the Job is named after those): then that one is read, not applied. Its state becomes
//! `status.model` and `ModelReady`, and holds back the engine pods until the weights are in the
//! cache. A Job that ended without its final figures in its annotation (its pod could not patch
//! it) gets them from its pod's termination message, once.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tracing::info;

use pd_core::model_fetch::{self, Fetch};
use pd_core::plan::Plan;
use pd_core::render::Rendered;

use super::{Error, Pass, dryrun};

/// A pass blocked on the fetch looks again this often (the Job's changes wake one sooner).
pub(super) const POLL: Duration = Duration::from_secs(10);

impl Pass<'_> {
    /// The fetch Job of this PDDeployment's model revision and claim, whoever owns it.
    fn fetch_job(&self) -> Option<(String, Option<Job>)> {
        let name = model_fetch::job_name(&self.name, &self.pdd.spec.model)?;
        let job = self.ctx.stores.jobs.as_ref().and_then(|c| c.get(&ObjectRef::new(&name).within(&self.ns)));
        Some((name, job.map(|j| (*j).clone())))
    }

    /// Leaves out of `rendered` a fetch Job another PDDeployment owns: it is shared, not taken over.
    pub(super) fn share_fetch(&self, rendered: &mut Rendered) {
        if let Some((name, Some(job))) = self.fetch_job()
            && !super::super::cache::owned_by(&job.metadata, &self.uid)
        {
            rendered.jobs.retain(|j| j.metadata.name.as_deref() != Some(name.as_str()));
        }
    }

    /// The fetch of a cached Hub source, read from its Job; `None` without one.
    pub(super) async fn read_fetch(&self) -> Result<Option<Fetch>, Error> {
        let Some((job_name, mut job)) = self.fetch_job() else { return Ok(None) };
        if let Some(j) = job.as_mut().filter(|j| model_fetch::needs_final_progress(j)) {
            self.copy_final_progress(j).await?;
        }
        let fetch = model_fetch::read(&self.pdd.spec.model, &job_name, job.as_ref());
        self.announce_fetch(&fetch).await;
        Ok(Some(fetch))
    }

    /// Copies the final report of the Job's pod into the Job's annotation (and into `job`).
    async fn copy_final_progress(&self, job: &mut Job) -> Result<(), Error> {
        let name = job.metadata.name.clone().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let listed = pods.list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}"))).await?;
        let Some(progress) = model_fetch::final_progress(&listed.items) else { return Ok(()) };
        let text = progress.to_json();
        let patch = serde_json::json!({"metadata": {"annotations": {pd_api::labels::FETCH_PROGRESS_ANNOTATION: text}}});
        let api: Api<Job> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        self.ctx.metrics.write("patch", "jobs");
        let params = PatchParams { field_manager: Some(super::super::FIELD_MANAGER.into()), ..Default::default() };
        match api.patch(&name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        job.metadata.annotations.get_or_insert_with(Default::default).insert(pd_api::labels::FETCH_PROGRESS_ANNOTATION.into(), text);
        Ok(())
    }

    /// An Event when `ModelReady` changes.
    async fn announce_fetch(&self, fetch: &Fetch) {
        let was = self.known.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == model_fetch::CONDITION));
        if was.is_some_and(|c| c.reason == fetch.reason) {
            return;
        }
        let type_ = if fetch.reason == "FetchFailed" { EventType::Warning } else { EventType::Normal };
        info!(job = %fetch.status.job, reason = %fetch.reason, "model fetch");
        self.ctx.event(self.pdd, type_, &fetch.reason, "FetchModel", fetch.message.clone()).await;
    }
}

/// Whether the plan may run: always without a fetch, or once the weights are in place, or when
/// it starts no engine (a scale-down waits for no download).
pub(super) fn open(fetch: Option<&Fetch>, plan: &Plan) -> bool {
    fetch.is_none_or(|f| f.ready) || !dryrun::starts_engines(plan)
}
