//! The model's `config.json` read in the cluster, its pure part: from a mounted source
//! (`spec.model.source.pvc`, `image` or `hostPath`) or a Hugging Face source's URL. Where it is
//! read from, the Job that reads it (the operator's image running `pd-operator
//! read-model-config` beside the engines, in the PDDeployment's namespace: a mounted source
//! mounted read-only where the engines mount it, a Hub source's token given to that pod alone
//! from the Secret `tokenSecretRef` names), the termination message that carries the file back,
//! and what the Job's state means. The controller keeps what it read in an owned ConfigMap
//! (`config_map`); neither it nor the admission webhook reads a Secret or the Hub itself,
//! so a PDDeployment makes the operator read nothing its own namespace could not.
//! docs/model-cache.md.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

use base64::Engine;
use flate2::{Compression, read::GzDecoder, write::GzEncoder};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, EnvVarSource, Pod, PodTemplateSpec, ResourceRequirements, SecretKeySelector,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::hub::{CONFIG_FILE, HubRequest};
use crate::model::HfConfig;
use crate::model_source;
use crate::names::{common_labels, owner_refs, short_hash};
use crate::pod::{beside_engines, restricted_security_context};
use pd_api::labels::MODEL_CONFIG_URL_ANNOTATION;
use pd_api::{ConfigMapKeyRef, ModelSpec, PDDeployment};
use thiserror::Error;

/// `pd.inference.dev/role` of the reading Job and its pod.
pub const ROLE: &str = "model-read";
/// The reading pod's container.
pub const CONTAINER: &str = "read";
/// The subcommand of the operator's image the Job runs.
pub const SUBCOMMAND: &str = "read-model-config";
/// The most a termination message carries: the kubelet cuts the rest.
pub const MESSAGE_LIMIT: usize = 4096;
/// A config.json too long for the message as it is goes gzipped, then base64, after this.
const GZIP_PREFIX: &str = "gz:";
/// A read that failed says why after this.
pub const ERROR_PREFIX: &str = "error: ";
/// Pod failures the Job retries (a read fails the same way again; an eviction does not).
pub const BACKOFF_LIMIT: i32 = 1;
/// A finished Job is deleted this long after; a failed read is then made again.
pub const TTL_SECONDS: i32 = 300;
/// `ModelConfigResolved`'s reasons while a source's config.json is not read.
pub const READING: &str = "Reading";
pub const NOT_READ: &str = "ConfigNotRead";
/// The variable the reading pod finds a Hub source's token in (huggingface_hub's name).
pub const TOKEN_ENV: &str = "HF_TOKEN";

/// Where a source's config.json is read from.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceRead {
    /// The spec field of the source, e.g. `spec.model.source.pvc`.
    pub field: &'static str,
    /// What is read, for people and for the kept ConfigMap's annotation: a Hub source's URL, or
    /// a mounted source and the file's path in the pod, e.g. `PersistentVolumeClaim weights:
    /// /models/qwen3-ft/config.json`.
    pub origin: String,
    pub from: ReadFrom,
}

/// What the reading pod reads.
#[derive(Clone, Debug, PartialEq)]
pub enum ReadFrom {
    /// The file's path in the reading pod (and in every engine pod).
    File(String),
    /// The Hub's URL, and the Secret holding the token sent to it.
    Hub(HubRequest),
}

impl SourceRead {
    /// The reader's arguments naming what it reads.
    fn args(&self) -> Vec<String> {
        match &self.from {
            ReadFrom::File(file) => vec!["--file".into(), file.clone()],
            ReadFrom::Hub(req) => {
                let mut args = vec!["--url".into(), req.url.clone(), "--repo".into(), req.repo.clone()];
                if let Some(t) = &req.token {
                    args.extend(["--token-secret".into(), t.name.clone(), "--token-key".into(), t.key.clone()]);
                }
                args
            }
        }
    }

    /// The token's variable, from the Secret in the pod's namespace. Optional: a missing Secret
    /// lets the reader start and say so (`HubError::Token`) rather than wait unstarted.
    fn env(&self) -> Option<Vec<EnvVar>> {
        let ReadFrom::Hub(HubRequest { token: Some(t), .. }) = &self.from else { return None };
        let selector = SecretKeySelector { name: t.name.clone(), key: t.key.clone(), optional: Some(true) };
        let from = EnvVarSource { secret_key_ref: Some(selector), ..Default::default() };
        Some(vec![EnvVar { name: TOKEN_ENV.into(), value_from: Some(from), ..Default::default() }])
    }
}

/// The read a spec needs: a Hub or a mounted source, and no `configMapRef` (which, given, wins).
pub fn request(model: &ModelSpec) -> Option<SourceRead> {
    if let Some(req) = crate::hub::request(model) {
        return Some(SourceRead { field: "spec.model.source.huggingFace", origin: req.url.clone(), from: ReadFrom::Hub(req) });
    }
    let source = model.source.as_ref().filter(|_| model.config_map_ref.is_none())?;
    let (field, what) = if let Some(pvc) = &source.pvc {
        ("spec.model.source.pvc", format!("PersistentVolumeClaim {}", pvc.claim_name))
    } else if let Some(image) = &source.image {
        ("spec.model.source.image", format!("image {}", image.reference))
    } else if let Some(host) = &source.host_path {
        ("spec.model.source.hostPath", format!("hostPath {}", host.path))
    } else {
        return None;
    };
    let file = format!("{}/{CONFIG_FILE}", model_source::model_path(model));
    Some(SourceRead { field, origin: format!("{what}: {file}"), from: ReadFrom::File(file) })
}

/// The reading Job of PDDeployment `name`: named after the source, so another source is read
/// by another Job (a Job's pod template cannot change).
pub fn job_name(name: &str, model: &ModelSpec) -> Option<String> {
    let read = request(model)?;
    let target = match &read.from {
        ReadFrom::File(file) => file,
        ReadFrom::Hub(req) => &req.url,
    };
    let hash = short_hash(&serde_json::json!({"source": model.source, "file": target}));
    Some(format!("{name}-{ROLE}-{hash}"))
}

/// The reading container's resources: a few MiB of JSON, bounded so a read costs the namespace
/// little and fills no node.
fn resources() -> ResourceRequirements {
    let q = |s: &str| Quantity(s.into());
    ResourceRequirements {
        requests: Some([("cpu".into(), q("10m")), ("memory".into(), q("16Mi")), ("ephemeral-storage".into(), q("1Mi"))].into()),
        limits: Some([("cpu".into(), q("200m")), ("memory".into(), q("64Mi")), ("ephemeral-storage".into(), q("16Mi"))].into()),
        ..Default::default()
    }
}

/// The Job reading `model`'s config.json: one short CPU pod beside the engines
/// (`crate::pod::beside_engines`: no service account token), under the `restricted` security
/// context, mounting a mounted source as the engines do or given a Hub source's token, reporting
/// the file in its termination message.
pub fn job(pdd: &PDDeployment, image: &str) -> Option<Job> {
    let name = pdd.metadata.name.as_deref()?;
    let model = &pdd.spec.model;
    let (read, job_name) = (request(model)?, job_name(name, model)?);
    let mounted = match read.from {
        ReadFrom::File(_) => Some(model_source::volume(name, model)?),
        ReadFrom::Hub(_) => None,
    };
    let mut args = vec![SUBCOMMAND.to_owned()];
    args.extend(read.args());
    args.extend(["--termination-log".into(), "/dev/termination-log".into()]);
    let container = Container {
        name: CONTAINER.into(),
        image: Some(image.to_owned()),
        command: Some(vec!["pd-operator".into()]),
        args: Some(args),
        env: read.env(),
        resources: Some(resources()),
        volume_mounts: mounted.as_ref().map(|(_, mount)| vec![mount.clone()]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(restricted_security_context()),
        ..Default::default()
    };
    let (annotations, mut spec) = beside_engines(pdd);
    spec.automount_service_account_token = Some(false);
    spec.containers = vec![container];
    spec.volumes = mounted.map(|(volume, _)| vec![volume]);
    let labels = common_labels(name, ROLE);
    let meta = |name: String| ObjectMeta {
        name: Some(name),
        namespace: pdd.metadata.namespace.clone(),
        labels: Some(labels.clone()),
        owner_references: owner_refs(pdd),
        ..Default::default()
    };
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta { labels: Some(labels.clone()), annotations, ..Default::default() }),
        spec: Some(spec),
    };
    let job_spec =
        JobSpec { backoff_limit: Some(BACKOFF_LIMIT), ttl_seconds_after_finished: Some(TTL_SECONDS), template, ..Default::default() };
    Some(Job { metadata: meta(job_name), spec: Some(job_spec), status: None })
}

/// The termination message carrying `text` (a config.json): compact JSON, or gzipped and base64
/// after `gz:` where that is too long; `Err` when even that is.
pub fn encode(text: &str) -> Result<String, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("{CONFIG_FILE} is not valid JSON: {e}"))?;
    let compact = value.to_string();
    if compact.len() <= MESSAGE_LIMIT {
        return Ok(compact);
    }
    let mut gz = GzEncoder::new(Vec::new(), Compression::best());
    gz.write_all(compact.as_bytes()).and_then(|()| gz.finish()).map_or_else(
        |e| Err(e.to_string()),
        |bytes| {
            let message = format!("{GZIP_PREFIX}{}", base64::engine::general_purpose::STANDARD.encode(bytes));
            (message.len() <= MESSAGE_LIMIT).then_some(message).ok_or_else(|| {
                format!("{CONFIG_FILE} is {} bytes of JSON, over the {MESSAGE_LIMIT} bytes a termination message carries even gzipped (fix: give it in a ConfigMap, spec.model.configMapRef)", compact.len())
            })
        },
    )
}

/// The termination message of a read that failed: `error: `, then a Hub answer's
/// `ModelConfigResolved` reason in brackets (`HubError::reason`), then why.
pub fn encode_error(reason: Option<&str>, message: &str) -> String {
    match reason {
        Some(reason) => format!("{ERROR_PREFIX}[{reason}] {message}"),
        None => format!("{ERROR_PREFIX}{message}"),
    }
}

/// Why a read failed, as the reader said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadError {
    /// `ModelConfigResolved`'s reason: one of `hub::REASONS` the reader named, else `NOT_READ`
    /// (a message is the reader's, but only a known reason reaches the status).
    pub reason: &'static str,
    pub message: String,
}

impl ReadError {
    fn not_read(message: String) -> Self {
        ReadError { reason: NOT_READ, message }
    }
}

/// The config.json a termination message carries, or the reader's error.
pub fn decode(message: &str) -> Result<String, ReadError> {
    let message = message.trim();
    if let Some(error) = message.strip_prefix(ERROR_PREFIX) {
        let named = error.strip_prefix('[').and_then(|rest| rest.split_once("] "));
        return Err(match named.and_then(|(reason, text)| crate::hub::REASONS.iter().find(|r| **r == reason).map(|r| (*r, text))) {
            Some((reason, text)) => ReadError { reason, message: text.to_owned() },
            None => ReadError::not_read(error.to_owned()),
        });
    }
    let Some(packed) = message.strip_prefix(GZIP_PREFIX) else { return Ok(message.to_owned()) };
    let fail = |what: String| ReadError::not_read(what);
    let bytes =
        base64::engine::general_purpose::STANDARD.decode(packed).map_err(|e| fail(format!("the reader's message is not base64: {e}")))?;
    let mut text = String::new();
    GzDecoder::new(bytes.as_slice())
        .read_to_string(&mut text)
        .map_err(|e| fail(format!("the reader's message is not gzipped text: {e}")))?;
    Ok(text)
}

/// What the reading Job says so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadState {
    /// Not finished: what it waits for.
    Reading(String),
    /// The config.json's text.
    Read(String),
    /// Why it was not read.
    Failed(ReadError),
}

/// The state of Job `job_name` reading `read` (`job` as the cache shows it, `pods` its pods,
/// listed once it finished).
pub fn state(read: &SourceRead, job_name: &str, job: Option<&Job>, pods: &[Pod]) -> ReadState {
    let origin = &read.origin;
    let Some(job) = job else {
        return ReadState::Reading(format!("creating Job {job_name} to read {origin}; no engine pod until it is read"));
    };
    let message = crate::pod::termination_message(pods, CONTAINER, Some);
    let retry = format!("Job {job_name}; it is read again when the Job is deleted, {TTL_SECONDS} s after it ended, or at once by you");
    let failed =
        |e: ReadError, fix: &str| ReadState::Failed(ReadError { message: format!("reading {origin}: {} ({fix}{retry})", e.message), ..e });
    if crate::pod::job_condition(job, "Complete").is_some() {
        return match message.map(decode) {
            Some(Ok(text)) => ReadState::Read(text),
            Some(Err(e)) => failed(e, ""),
            None => failed(ReadError::not_read("the reading pod ended without a message".into()), ""),
        };
    }
    if let Some(why) = crate::pod::job_condition(job, "Failed") {
        let error = message.and_then(|m| decode(m).err()).unwrap_or_else(|| ReadError::not_read(why));
        return failed(error, "fix the source; ");
    }
    ReadState::Reading(format!("reading {origin} with Job {job_name}; no engine pod until it is read"))
}

/// The condition reporting whether the source's config.json was read.
pub const CONDITION: &str = "ModelConfigResolved";
/// `pd.inference.dev/role` of the kept ConfigMap.
pub const KEPT_ROLE: &str = "model-config";

/// The kept ConfigMap's name.
pub fn config_map_name(name: &str) -> String {
    format!("{name}-model-config")
}

/// Where a PDDeployment's config.json comes from, decided here once for the webhook, the
/// controller, the engine dry run and `kubectl pd`: the spec's `configMapRef`, else the source's
/// own, else nowhere (the rules fall back on the catalogue; offline, `--model-config`).
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigSource {
    ConfigMap(ConfigMapKeyRef),
    /// A Hub or a mounted source's, read by a Job in the cluster (`model_read`).
    Read(SourceRead),
    Catalogue,
}

pub fn config_source(model: &ModelSpec) -> ConfigSource {
    if let Some(r) = &model.config_map_ref {
        return ConfigSource::ConfigMap(r.clone());
    }
    request(model).map_or(ConfigSource::Catalogue, ConfigSource::Read)
}

/// Why the ConfigMap `spec.model.configMapRef` names gave no config.json.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigMapError {
    #[error("ConfigMap {ns}/{name} does not exist")]
    Missing { ns: String, name: String },
    #[error("reading ConfigMap {ns}/{name} took over {timeout:?}")]
    Timeout { ns: String, name: String, timeout: Duration },
    #[error("reading ConfigMap {ns}/{name}: {message}")]
    Api { ns: String, name: String, message: String },
    /// No such key, or not a config.json (`HfConfig::from_config_map`'s text).
    #[error("{0}")]
    Invalid(String),
}

impl ConfigMapError {
    /// Whether reading again may succeed without the user changing anything.
    pub fn transient(&self) -> bool {
        matches!(self, ConfigMapError::Timeout { .. } | ConfigMapError::Api { .. })
    }
}

/// The ConfigMap the rules and the engine dry run read the model's config.json from: the
/// spec's `configMapRef`, else the one the operator keeps for a Hub or a mounted source.
pub fn config_ref(name: &str, model: &ModelSpec) -> Option<ConfigMapKeyRef> {
    match config_source(model) {
        ConfigSource::ConfigMap(r) => Some(r),
        ConfigSource::Read(_) => Some(ConfigMapKeyRef { name: config_map_name(name), key: CONFIG_FILE.into() }),
        ConfigSource::Catalogue => None,
    }
}

/// The ConfigMap keeping `text`, read from `url` (or a mounted source's origin), owned by the PDDeployment.
pub fn config_map(pdd: &PDDeployment, url: &str, text: &str) -> ConfigMap {
    let name = pdd.metadata.name.clone().unwrap_or_default();
    let mut cm = ConfigMap { data: Some(BTreeMap::from([(CONFIG_FILE.into(), text.into())])), ..Default::default() };
    cm.metadata.name = Some(config_map_name(&name));
    cm.metadata.namespace.clone_from(&pdd.metadata.namespace);
    cm.metadata.labels = Some(common_labels(&name, KEPT_ROLE));
    cm.metadata.annotations = Some(BTreeMap::from([(MODEL_CONFIG_URL_ANNOTATION.into(), url.into())]));
    cm.metadata.owner_references = owner_refs(pdd);
    cm
}

/// The kept config.json, when `cm` holds the one read from `origin` (a Hub source's URL, a
/// mounted source's origin).
pub fn kept(cm: &ConfigMap, origin: &str) -> Option<(String, HfConfig)> {
    let url = cm.metadata.annotations.as_ref()?.get(MODEL_CONFIG_URL_ANNOTATION)?;
    let text = cm.data.as_ref()?.get(CONFIG_FILE)?;
    if url != origin {
        return None;
    }
    HfConfig::parse(text).ok().map(|c| (text.clone(), c))
}

/// The `ModelConfigResolved` condition's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    pub resolved: bool,
    pub reason: String,
    pub message: String,
}

impl Resolution {
    /// `ModelConfigResolved`'s status, reason and message.
    pub fn condition(&self) -> (bool, &str, String) {
        (self.resolved, &self.reason, self.message.clone())
    }

    /// A source's config.json, read by the Job and kept.
    pub fn read(read: &SourceRead, config_map: &str) -> Self {
        Self { resolved: true, reason: "Resolved".into(), message: format!("{} read, kept in ConfigMap {config_map}", read.origin) }
    }

    /// A source's config.json not read (yet): `reason` `Reading`, `ConfigNotRead` or a
    /// `HubError::reason`.
    pub fn unread(reason: &str, message: String) -> Self {
        Self { resolved: false, reason: reason.into(), message }
    }
}

#[cfg(test)]
mod tests;
