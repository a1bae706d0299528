//! The model's `config.json` read from a mounted source (`spec.model.source.pvc`, `image` or
//! `hostPath`), its pure part: where it is read from, the Job that reads it (the operator's
//! image running `pd-operator read-model-config` beside the engines, the source mounted
//! read-only where the engines mount it), the termination message that carries the file back,
//! and what the Job's state means. The controller keeps what it read in the ConfigMap it keeps a
//! Hub source's in (`hub::config_map`), so the rules and the engine dry run judge the real config
//! of any model on a volume. docs/model-cache.md.

use std::io::{Read, Write};

use base64::Engine;
use flate2::{Compression, read::GzDecoder, write::GzEncoder};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, Pod, PodTemplateSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::hub::CONFIG_FILE;
use crate::render::{self, model_source};
use pd_api::{ModelSpec, PDDeployment};

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
/// `ModelConfigResolved`'s reasons while a mounted source's config.json is not read.
pub const READING: &str = "Reading";
pub const NOT_READ: &str = "ConfigNotRead";

/// Where a mounted source's config.json is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeRead {
    /// The spec field of the source, e.g. `spec.model.source.pvc`.
    pub field: &'static str,
    /// What is read, for people and for the kept ConfigMap's annotation: the source and the
    /// file's path in the pod, e.g. `PersistentVolumeClaim weights: /models/qwen3-ft/config.json`.
    pub origin: String,
    /// The file's path in the reading pod (and in every engine pod).
    pub file: String,
}

/// The read a spec needs: a mounted source and no `configMapRef` (which, given, wins).
pub fn request(model: &ModelSpec) -> Option<VolumeRead> {
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
    Some(VolumeRead { field, origin: format!("{what}: {file}"), file })
}

/// The reading Job of PDDeployment `name`: named after the source, so another source is read
/// by another Job (a Job's pod template cannot change).
pub fn job_name(name: &str, model: &ModelSpec) -> Option<String> {
    let read = request(model)?;
    let hash = render::short_hash(&serde_json::json!({"source": model.source, "file": read.file}));
    Some(format!("{name}-{ROLE}-{hash}"))
}

/// The Job reading `model`'s config.json: one short CPU pod beside the engines
/// (`render::beside_engines`) mounting the source as they do, reporting the file in its
/// termination message.
pub fn job(pdd: &PDDeployment, image: &str) -> Option<Job> {
    let name = pdd.metadata.name.as_deref()?;
    let model = &pdd.spec.model;
    let (read, job_name) = (request(model)?, job_name(name, model)?);
    let (volume, mount) = model_source::volume(name, model)?;
    let q = |s: &str| Quantity(s.into());
    let container = Container {
        name: CONTAINER.into(),
        image: Some(image.to_owned()),
        command: Some(vec!["pd-operator".into()]),
        args: Some([SUBCOMMAND, "--file", &read.file, "--termination-log", "/dev/termination-log"].map(String::from).to_vec()),
        resources: Some(ResourceRequirements {
            requests: Some([("cpu".into(), q("10m")), ("memory".into(), q("16Mi"))].into()),
            limits: Some([("memory".into(), q("64Mi"))].into()),
            ..Default::default()
        }),
        volume_mounts: Some(vec![mount]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(render::restricted_security_context()),
        ..Default::default()
    };
    let (annotations, mut spec) = render::beside_engines(pdd);
    spec.containers = vec![container];
    spec.volumes = Some(vec![volume]);
    let labels = render::common_labels(name, ROLE);
    let meta = |name: String| ObjectMeta {
        name: Some(name),
        namespace: pdd.metadata.namespace.clone(),
        labels: Some(labels.clone()),
        owner_references: render::owner_refs(pdd),
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

/// The config.json a termination message carries, or the reader's error.
pub fn decode(message: &str) -> Result<String, String> {
    let message = message.trim();
    if let Some(error) = message.strip_prefix(ERROR_PREFIX) {
        return Err(error.to_owned());
    }
    let Some(packed) = message.strip_prefix(GZIP_PREFIX) else { return Ok(message.to_owned()) };
    let bytes = base64::engine::general_purpose::STANDARD.decode(packed).map_err(|e| format!("the reader's message is not base64: {e}"))?;
    let mut text = String::new();
    GzDecoder::new(bytes.as_slice()).read_to_string(&mut text).map_err(|e| format!("the reader's message is not gzipped text: {e}"))?;
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
    Failed(String),
}

/// The state of Job `job_name` reading `read` (`job` as the cache shows it, `pods` its pods,
/// listed once it finished).
pub fn state(read: &VolumeRead, job_name: &str, job: Option<&Job>, pods: &[Pod]) -> ReadState {
    let origin = &read.origin;
    let Some(job) = job else {
        return ReadState::Reading(format!("creating Job {job_name} to read {origin}; no engine pod until it is read"));
    };
    let message = crate::model_fetch::termination_message(pods, CONTAINER, Some);
    let retry = format!("Job {job_name}; it is read again when the Job is deleted, {TTL_SECONDS} s after it ended, or at once by you");
    if crate::model_fetch::job_condition(job, "Complete").is_some() {
        return match message.map(decode) {
            Some(Ok(text)) => ReadState::Read(text),
            Some(Err(e)) => ReadState::Failed(format!("reading {origin}: {e} ({retry})")),
            None => ReadState::Failed(format!("reading {origin}: the reading pod ended without a message ({retry})")),
        };
    }
    if let Some(why) = crate::model_fetch::job_condition(job, "Failed") {
        let error = message.and_then(|m| decode(m).err()).unwrap_or(why);
        return ReadState::Failed(format!("reading {origin}: {error} (fix the source; {retry})"));
    }
    ReadState::Reading(format!("reading {origin} with Job {job_name}; no engine pod until it is read"))
}

#[cfg(test)]
mod tests;
