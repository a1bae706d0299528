//! The model's config.json in a reconcile: the ConfigMap `spec.model.configMapRef` names, or the
//! source's own, read once and kept in an owned ConfigMap (`<name>-model-config`, applied with
//! the other children), so the rules and the engine dry run judge the real config. The source's
//! own is read by a Job in the PDDeployment's namespace (`pd_core::model_read`): a Hugging Face
//! source's with the token its Secret gives that pod, a mounted source's (`pvc`, `image`,
//! `hostPath`) mounting it beside the engines; the operator reads neither a Secret nor the Hub.
//! While it cannot be read nothing is judged and no engine pod is created:
//! `ModelConfigResolved=False` names the URL and the HTTP status, or the volume's file and what
//! the Job found.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tracing::info;

use crate::model_read::kept;
use pd_api::{ConfigMapKeyRef, PDDeployment};
use pd_core::model::HfConfig;
use pd_core::model_read::{self, ReadState, SourceRead};
use pd_core::model_read::{ConfigSource, Resolution};

use super::super::cache::Owner;
use super::super::{Context, Error};
use super::Pass;
use pd_api::conditions::HasStatus;

/// The ConfigMap's GET in a reconcile: longer than admission's, a reconcile waits on nobody.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// What a reconcile knows of the model's config.json.
pub(super) struct ModelConfig {
    /// The config the rules read; `Err` when `configMapRef` is wrong (a finding for the user).
    pub config: Result<Option<HfConfig>, String>,
    /// A source's `ModelConfigResolved`; `None` without one.
    pub resolution: Option<Resolution>,
    /// A source's config not read: the problem, and when to read again.
    pub unresolved: Option<(String, Duration)>,
    /// The ConfigMap keeping a source's config.json, applied with the other children.
    pub keep: Option<ConfigMap>,
}

impl ModelConfig {
    /// A config that is not a source's own: nothing to resolve, keep or retry.
    pub(super) fn of(config: Result<Option<HfConfig>, String>) -> Self {
        ModelConfig { config, resolution: None, unresolved: None, keep: None }
    }
}

/// Reads the model's config: `configMapRef`, else the source's (kept, or read by its Job).
pub(super) async fn read(ctx: &Context, pdd: &PDDeployment, ns: &str) -> Result<ModelConfig, Error> {
    match pd_core::model_read::config_source(&pdd.spec.model) {
        ConfigSource::ConfigMap(r) => Ok(ModelConfig::of(config_map_ref(ctx, ns, &r).await?)),
        ConfigSource::Read(read) => source(ctx, pdd, ns, &read).await,
        ConfigSource::Catalogue => Ok(ModelConfig::of(Ok(None))),
    }
}

/// The config.json kept for `origin` (the cache's ConfigMap, read from the same URL or volume file).
fn kept(ctx: &Context, pdd: &PDDeployment, ns: &str, origin: &str) -> Option<(String, HfConfig)> {
    let (name, uid) = (pdd.metadata.name.as_deref()?, pdd.metadata.uid.as_deref()?);
    let cm_name = pd_core::model_read::config_map_name(name);
    let cms = ctx.stores.config_maps.as_ref()?.children(Owner { ns, name, uid });
    cms.iter().find(|cm| cm.metadata.name.as_deref() == Some(cm_name.as_str())).and_then(|cm| pd_core::model_read::kept(cm, origin))
}

/// A source's config.json: kept, else read by its Job.
async fn source(ctx: &Context, pdd: &PDDeployment, ns: &str, read: &SourceRead) -> Result<ModelConfig, Error> {
    let cm_name = pd_core::model_read::config_map_name(pdd.metadata.name.as_deref().unwrap_or_default());
    let state = match kept(ctx, pdd, ns, &read.origin) {
        Some((text, _)) => ReadState::Read(text),
        None => read_with_job(ctx, pdd, ns, read).await?,
    };
    let unread = |reason: &str, message: String, after: Duration| ModelConfig {
        config: Ok(None),
        resolution: Some(Resolution::unread(reason, message.clone())),
        unresolved: Some((format!("{}: {message}", read.field), after)),
        keep: None,
    };
    Ok(match state {
        ReadState::Reading(message) => unread(model_read::READING, message, super::model_fetch::POLL),
        ReadState::Failed(e) => unread(e.reason, e.message, READ_AGAIN),
        ReadState::Read(text) => match HfConfig::parse(&text) {
            Ok(config) => ModelConfig {
                config: Ok(Some(config)),
                resolution: Some(Resolution::read(read, &cm_name)),
                unresolved: None,
                keep: Some(pd_core::model_read::config_map(pdd, &read.origin, &text)),
            },
            Err(e) => unread(model_read::NOT_READ, format!("{}: {e}", read.origin), READ_AGAIN),
        },
    })
}

/// Applies the kept ConfigMap now, for a spec the rules refuse: its children are not applied,
/// and the next pass (and the webhook, when the user fixes the spec) judges on the copy instead of
/// reading the source again.
pub(super) async fn keep_refused(ctx: &Context, ns: &str, model: &ModelConfig) -> Result<(), Error> {
    let Some(cm) = &model.keep else { return Ok(()) };
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    ctx.apply(&api, cm.metadata.name.as_deref().unwrap_or_default(), cm).await?;
    Ok(())
}

/// A failed read is looked at again this often (its Job is deleted `model_read::TTL_SECONDS`
/// after it ended, which wakes a reconcile sooner).
const READ_AGAIN: Duration = Duration::from_secs(60);

/// The state of the Job reading `read`; the Job is applied when there is none (while the config
/// is unread no other child is applied), and its pods listed once it ended.
async fn read_with_job(ctx: &Context, pdd: &PDDeployment, ns: &str, read: &SourceRead) -> Result<ReadState, Error> {
    let name = pdd.metadata.name.as_deref().unwrap_or_default();
    let job_name = model_read::job_name(name, &pdd.spec.model).unwrap_or_default();
    let job = ctx.stores.jobs.as_ref().and_then(|c| c.get(&ObjectRef::new(&job_name).within(ns)));
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let mut pods = Vec::new();
    match job.as_deref() {
        None => {
            if let Some(want) = model_read::job(pdd, &ctx.render.operator_image) {
                info!(job = %job_name, origin = %read.origin, "reading the model's config.json with a Job");
                ctx.apply(&jobs, &job_name, &want).await?;
            }
        }
        Some(j) if pd_core::model_fetch::job_ended(j) => {
            let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
            pods = api.list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job_name}"))).await?.items;
        }
        Some(_) => {}
    }
    Ok(model_read::state(read, &job_name, job.as_deref(), &pods))
}

/// The config.json of `spec.model.configMapRef`: `Ok(Err(why))` when the reference is wrong (a
/// finding for the user), `Err` when the API did not answer (retried).
async fn config_map_ref(ctx: &Context, ns: &str, r: &ConfigMapKeyRef) -> Result<Result<Option<HfConfig>, String>, Error> {
    match kept::config_map(&ctx.client, ns, r, FETCH_TIMEOUT).await {
        Ok(config) => Ok(Ok(Some(config))),
        Err(e) if e.transient() => Err(Error::ModelConfig(e)),
        Err(e) => Ok(Err(e.to_string())),
    }
}

impl Pass<'_> {
    /// Takes the source's resolution into the status, and its retry into the requeue.
    pub(super) fn with_model_config(mut self, model: &ModelConfig) -> Self {
        self.model_config = model.resolution.clone();
        self.retry = model.unresolved.as_ref().map(|(_, after)| *after);
        self
    }

    /// An Event when `ModelConfigResolved` turns True.
    pub(super) async fn announce_model_config(&self) {
        let Some(r) = self.model_config.as_ref().filter(|r| r.resolved) else { return };
        let was = self
            .known
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == pd_core::model_read::CONDITION))
            .map(HasStatus::is_true);
        if was != Some(true) {
            self.ctx.event(self.pdd, EventType::Normal, "ModelConfigResolved", "ReadModelConfig", r.message.clone()).await;
        }
    }
}
