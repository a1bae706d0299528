//! Fetched once (`spec.model.source.huggingFace.cache`), its pure part: where the weights go in
//! the cache volume, the fetch Job (the operator's image running `pd-operator fetch-model`) with
//! its identity and the claim the operator makes, what the Job reports (`Progress`), and what
//! that means for `status.model` and the `ModelReady` condition. docs/model-cache.md.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod,
    PodSecurityContext, PodSpec, PodTemplateSpec, ResourceRequirements, SecretKeySelector, ServiceAccount, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role as RbacRole, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::{Deserialize, Serialize};
use sha1::Sha1;
use sha2::{Digest as _, Sha256};

use crate::hub::{self, revision};
use crate::pod::{job_condition, termination_message};
use pd_api::{HuggingFaceSource, ModelCache, ModelFetchStatus, ModelSpec};

/// `pd.inference.dev/role` of the fetch Job, its pod and its RBAC.
pub const ROLE: &str = "model-fetch";
/// The condition: True once the weights are complete in the cache.
pub const CONDITION: &str = "ModelReady";
/// The Job's annotation the fetch patches with its `Progress` (JSON) as it goes.
pub const PROGRESS_ANNOTATION: &str = "pd.inference.dev/model-fetch-progress";
/// Where the fetch pod mounts the cache volume (read-write).
pub const CACHE_MOUNT: &str = "/cache";
/// The fetch pod's container.
pub const CONTAINER: &str = "fetch";
/// Pod failures the Job retries; each retry resumes from the files and `.part`s already there.
pub const BACKOFF_LIMIT: i32 = 4;
/// The subcommand of the operator's image the Job runs.
pub const SUBCOMMAND: &str = "fetch-model";
/// `phase` of `status.model`.
pub const PENDING: &str = "Pending";
pub const FETCHING: &str = "Fetching";
pub const FETCHED: &str = "Fetched";
pub const FAILED: &str = "Failed";

/// A Hugging Face source with a cache: what is fetched, and where to.
#[derive(Clone, Copy, Debug)]
pub struct Cached<'a> {
    pub hf: &'a HuggingFaceSource,
    pub cache: &'a ModelCache,
}

/// The cached Hub source of `model`, if it has one.
pub fn cached(model: &ModelSpec) -> Option<Cached<'_>> {
    let hf = model.source.as_ref()?.hugging_face.as_ref()?;
    Some(Cached { hf, cache: hf.cache.as_ref()? })
}

/// The model's directory inside the cache volume: `<repo>/<revision>` (a `/` of the revision,
/// as in `refs/pr/1`, becomes `--`), so one claim holds many models and revisions.
pub fn cache_dir(model: &ModelSpec) -> Option<String> {
    let c = cached(model)?;
    Some(format!("{}/{}", c.hf.repo.trim_matches('/'), revision(model).replace('/', "--")))
}

/// The cache's claim: the one `claimName` names, else the operator's for PDDeployment `name`,
/// named after its class and size (a new size is a new claim, fetched anew: a claim's size
/// cannot always grow).
pub fn claim_name(name: &str, model: &ModelSpec) -> Option<String> {
    let c = cached(model)?;
    if let Some(claim) = &c.cache.claim_name {
        return Some(claim.clone());
    }
    let hash = crate::names::short_hash(&serde_json::json!({"class": c.cache.storage_class_name, "size": c.cache.size}));
    Some(format!("{name}-model-cache-{hash}"))
}

/// The fetch Job of a model revision into a claim (of PDDeployment `name` when the operator
/// claims it): named after what it fetches and where to, not after the PDDeployment, so
/// PDDeployments of one revision naming one claim share it. The first to apply it owns it; the
/// others read it (a Job's pod template cannot change: a new revision is a new Job).
pub fn job_name(name: &str, model: &ModelSpec) -> Option<String> {
    let c = cached(model)?;
    let hash = crate::names::short_hash(&serde_json::json!({
        "endpoint": hub::endpoint(c.hf), "repo": c.hf.repo, "revision": revision(model),
        "claim": claim_name(name, model), "token": c.hf.token_secret_ref,
    }));
    Some(format!("{ROLE}-{hash}"))
}

/// The fetch's ServiceAccount, Role and RoleBinding.
pub fn rbac_name(name: &str) -> String {
    format!("{name}-{ROLE}")
}

/// What the fetch reports: in the Job's annotation as it goes, and as its termination message
/// at the end (`done`, or `error` naming the file and the HTTP status).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    pub bytes: u64,
    pub total_bytes: u64,
    pub files: u32,
    pub total_files: u32,
    /// Bytes downloaded by this run (the rest were in the cache already).
    #[serde(default)]
    pub downloaded: u64,
    #[serde(default)]
    pub done: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The commit the revision was resolved to, once per Job: its retries fetch that commit even
    /// after the branch moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

impl Progress {
    /// The JSON the annotation and the termination message hold.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn parse(text: &str) -> Option<Self> {
        serde_json::from_str(text.trim()).ok()
    }
}

/// Everything a cached Hub source adds to a PDDeployment's children.
#[derive(Clone, Debug, PartialEq)]
pub struct Objects {
    pub job: Job,
    /// The claim the operator makes (none when the spec names one).
    pub claim: Option<PersistentVolumeClaim>,
    pub account: ServiceAccount,
    pub role: RbacRole,
    pub binding: RoleBinding,
}

fn meta(name: String, ns: &str, pdd: &str, owners: &Option<Vec<OwnerReference>>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(ns.to_owned()),
        labels: Some(crate::names::common_labels(pdd, ROLE)),
        owner_references: owners.clone(),
        ..Default::default()
    }
}

/// The fetch Job, its identity (which may patch only that Job: its progress) and the claim.
pub fn objects(name: &str, ns: &str, model: &ModelSpec, owners: &Option<Vec<OwnerReference>>, image: &str) -> Option<Objects> {
    let c = cached(model)?;
    let (job_name, claim) = (job_name(name, model)?, claim_name(name, model)?);
    let rbac = rbac_name(name);
    let account = ServiceAccount {
        metadata: meta(rbac.clone(), ns, name, owners),
        automount_service_account_token: Some(false),
        ..Default::default()
    };
    let role = RbacRole {
        metadata: meta(rbac.clone(), ns, name, owners),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["batch".into()]),
            resources: Some(vec!["jobs".into()]),
            verbs: vec!["get".into(), "patch".into()],
            resource_names: Some(vec![job_name.clone()]),
            ..Default::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: meta(rbac.clone(), ns, name, owners),
        role_ref: RoleRef { api_group: Some("rbac.authorization.k8s.io".into()), kind: "Role".into(), name: rbac.clone() },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: rbac.clone(),
            namespace: Some(ns.to_owned()),
            ..Default::default()
        }]),
    };
    // `claimName` and `size` exclude each other (CEL); a spec naming both claims nothing.
    let claim_object = c.cache.size.as_ref().filter(|_| c.cache.claim_name.is_none()).map(|size| PersistentVolumeClaim {
        metadata: meta(claim.clone(), ns, name, owners),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteMany".into()]),
            storage_class_name: c.cache.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), size.clone())])),
                limits: None,
            }),
            ..Default::default()
        }),
        status: None,
    });
    let pod = fetch_pod(c, model, Names { deployment: name, job: &job_name, claim: &claim }, image);
    let job = Job {
        metadata: meta(job_name, ns, name, owners),
        spec: Some(JobSpec { backoff_limit: Some(BACKOFF_LIMIT), template: pod, ..Default::default() }),
        status: None,
    };
    Some(Objects { job, claim: claim_object, account, role, binding })
}

/// The names a fetch pod refers to: its PDDeployment, its Job and the cache's claim.
struct Names<'a> {
    deployment: &'a str,
    job: &'a str,
    claim: &'a str,
}

/// The fetch pod: `pd-operator fetch-model` into `<cache>/<repo>/<revision>`, the Hub token as
/// `HF_TOKEN`, the ServiceAccount's token mounted (it patches the Job's progress).
fn fetch_pod(c: Cached<'_>, model: &ModelSpec, names: Names<'_>, image: &str) -> PodTemplateSpec {
    let Names { deployment: name, job, claim } = names;
    let dest = format!("{CACHE_MOUNT}/{}", cache_dir(model).unwrap_or_default());
    let mut args: Vec<String> = vec![SUBCOMMAND.into()];
    for (flag, value) in [("--endpoint", hub::endpoint(c.hf)), ("--repo", &c.hf.repo), ("--revision", &revision(model)), ("--dest", &dest)]
    {
        args.extend([flag.to_owned(), value.to_owned()]);
    }
    args.extend(["--progress-job".into(), job.to_owned(), "--termination-log".into(), "/dev/termination-log".into()]);
    let token = c.hf.token_secret_ref.as_ref().map(|s| EnvVar {
        name: "HF_TOKEN".into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector { name: s.name.clone(), key: s.key.clone(), optional: Some(false) }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let q = |s: &str| Quantity(s.into());
    let container = Container {
        name: CONTAINER.into(),
        image: Some(image.to_owned()),
        command: Some(vec!["pd-operator".into()]),
        args: Some(args),
        env: token.map(|t| vec![t]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".into(), q("100m")), ("memory".into(), q("64Mi"))])),
            limits: Some(BTreeMap::from([("memory".into(), q("256Mi"))])),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount { name: "cache".into(), mount_path: CACHE_MOUNT.into(), ..Default::default() }]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(crate::pod::restricted_security_context()),
        ..Default::default()
    };
    let volume = Volume {
        name: "cache".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource { claim_name: claim.to_owned(), read_only: Some(false) }),
        ..Default::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta { labels: Some(crate::names::common_labels(name, ROLE)), ..Default::default() }),
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            service_account_name: Some(rbac_name(name)),
            automount_service_account_token: Some(true),
            enable_service_links: Some(false),
            containers: vec![container],
            volumes: Some(vec![volume]),
            // The fetch runs as the image's user: a new volume's root directory belongs to root,
            // so the volume is given its group (where its type supports ownership).
            security_context: Some(PodSecurityContext {
                fs_group: Some(crate::pod::OPERATOR_UID),
                fs_group_change_policy: Some("OnRootMismatch".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// What `status.model` and `ModelReady` say, read from the fetch Job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetch {
    pub status: ModelFetchStatus,
    /// The weights are complete in the cache: engine pods may be created.
    pub ready: bool,
    pub reason: String,
    pub message: String,
}

impl Fetch {
    /// `ModelReady`'s status, reason and message.
    pub fn condition(&self) -> (bool, &str, String) {
        (self.ready, &self.reason, self.message.clone())
    }
}

/// The Job's progress annotation.
pub fn job_progress(job: &Job) -> Option<Progress> {
    job.metadata.annotations.as_ref()?.get(PROGRESS_ANNOTATION).and_then(|t| Progress::parse(t))
}

/// Whether a Job ended (Complete or Failed): its pods' messages are final.
pub fn job_ended(job: &Job) -> bool {
    job_condition(job, "Complete").is_some() || job_condition(job, "Failed").is_some()
}

/// Whether the Job ended (Complete or Failed) without its final figures in the annotation: the
/// controller then copies them from its pod's termination message (`final_progress`).
pub fn needs_final_progress(job: &Job) -> bool {
    job_ended(job) && job_progress(job).is_none_or(|p| !p.done && p.error.is_none())
}

/// The final report of the newest of the Job's pods that ended with one.
pub fn final_progress(pods: &[Pod]) -> Option<Progress> {
    termination_message(pods, CONTAINER, Progress::parse)
}

/// `status.model` and `ModelReady` of Job `job_name` of `model`, `job` as the cache shows it.
pub fn read(model: &ModelSpec, job_name: &str, job: Option<&Job>) -> Fetch {
    let what = format!("{}@{}", model.catalogue_id(), revision(model));
    let progress = job.and_then(job_progress).unwrap_or_default();
    let status = |phase: &str| ModelFetchStatus {
        phase: phase.into(),
        bytes: i64::try_from(progress.bytes).unwrap_or(i64::MAX),
        total_bytes: i64::try_from(progress.total_bytes).unwrap_or(i64::MAX),
        files: i32::try_from(progress.files).unwrap_or(i32::MAX),
        total_files: i32::try_from(progress.total_files).unwrap_or(i32::MAX),
        job: job_name.into(),
    };
    let fetch =
        |phase: &str, ready: bool, reason: &str, message: String| Fetch { status: status(phase), ready, reason: reason.into(), message };
    let Some(job) = job else {
        return fetch(
            PENDING,
            false,
            "Fetching",
            format!("creating the fetch Job {job_name} for {what}; no engine pod until it completes"),
        );
    };
    let figures = format!("{} of {} bytes, {}/{} files", progress.bytes, progress.total_bytes, progress.files, progress.total_files);
    if job_condition(job, "Complete").is_some() {
        let fetched = format!("{what} is in the cache ({figures}; {} bytes downloaded by Job {job_name})", progress.downloaded);
        return fetch(FETCHED, true, "Fetched", fetched);
    }
    if let Some(why) = job_condition(job, "Failed") {
        let error = progress.error.clone().unwrap_or(why);
        let message = format!(
            "fetching {what} failed after {} attempts: {error} (Job {job_name}; fix the cause, then delete the Job to retry)",
            BACKOFF_LIMIT + 1
        );
        return fetch(FAILED, false, "FetchFailed", message);
    }
    let phase = if progress.total_files == 0 { PENDING } else { FETCHING };
    let retry =
        progress.error.as_ref().map(|e| format!("; an attempt failed ({e}), the Job retries from where it stopped")).unwrap_or_default();
    fetch(phase, false, "Fetching", format!("fetching {what} with Job {job_name}: {figures}{retry}; no engine pod until it completes"))
}

/// One file of the repository at the revision, as the Hub's tree lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoFile {
    /// Relative to the repository's root, `/`-separated.
    pub path: String,
    pub size: u64,
    /// The hash the Hub lists for the file's bytes.
    pub digest: Digest,
}

/// The Hub's own hash of a file: the sha256 of a file stored with LFS (the weights, `lfs.oid`),
/// else the git blob id of a file kept in git (config, tokenizer, remote code: `oid`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Digest {
    Sha256(String),
    GitBlob(String),
}

impl Digest {
    /// What the hash is called in a report.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sha256(_) => "sha256",
            Self::GitBlob(_) => "git blob id",
        }
    }

    /// The hex the Hub lists.
    pub fn hex(&self) -> &str {
        match self {
            Self::Sha256(h) | Self::GitBlob(h) => h,
        }
    }

    /// A hasher for a file of `size` bytes checked against this digest.
    pub fn hasher(&self, size: u64) -> ContentHash {
        match self {
            Self::Sha256(_) => ContentHash::Sha256(FileHash::default()),
            Self::GitBlob(_) => ContentHash::GitBlob(git_blob_hasher(size)),
        }
    }
}

/// The Hub's model info of `repo` at `revision`: its `sha` is the commit the revision names now
/// (huggingface_hub's `model_info`).
pub fn revision_url(endpoint: &str, repo: &str, revision: &str) -> String {
    format!("{}/api/models/{repo}/revision/{}", endpoint.trim_end_matches('/'), crate::hub::quote(revision))
}

#[derive(Deserialize)]
struct RevisionInfo {
    sha: String,
}

/// The commit of a model info answer, checked to be one (40 hex digits, lower case).
pub fn parse_revision(body: &[u8]) -> Result<String, String> {
    let info: RevisionInfo = serde_json::from_slice(body).map_err(|e| format!("not the Hub's model info: {e}"))?;
    if !crate::hub_id::is_commit(&info.sha) {
        return Err(format!("the model info names the commit {:?}, which is not 40 hex digits", info.sha));
    }
    Ok(info.sha.to_ascii_lowercase())
}

/// The Hub's listing of `repo` at `revision`, every file at any depth (one page of it: the Hub
/// names the next in a `Link` header).
pub fn tree_url(endpoint: &str, repo: &str, revision: &str) -> String {
    format!("{}/api/models/{repo}/tree/{}?recursive=true", endpoint.trim_end_matches('/'), crate::hub::quote(revision))
}

/// Where huggingface_hub downloads one file from (`hf_hub_url`).
pub fn file_url(endpoint: &str, repo: &str, revision: &str, path: &str) -> String {
    let path: Vec<String> = path.split('/').map(crate::hub::quote).collect();
    format!("{}/{repo}/resolve/{}/{}", endpoint.trim_end_matches('/'), crate::hub::quote(revision), path.join("/"))
}

#[derive(Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    oid: Option<String>,
    #[serde(default)]
    lfs: Option<LfsInfo>,
}

#[derive(Deserialize)]
struct LfsInfo {
    /// `sha256` in the Hub's newer answers; `oid` in the older ones.
    #[serde(alias = "sha256")]
    oid: String,
    size: u64,
}

/// Whether a listed path stays inside the model's directory: relative, no `..`, `.` or empty
/// part, no `\` and no control character.
pub fn path_inside(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && !path.chars().any(char::is_control)
        && !path.split('/').any(|c| c == ".." || c == "." || c.is_empty())
}

/// The files of one page of the tree listing; a path that would leave the model's directory
/// (absolute, `..`) or a file without the Hub's hash is refused.
pub fn parse_tree(body: &[u8]) -> Result<Vec<RepoFile>, String> {
    let entries: Vec<TreeEntry> = serde_json::from_slice(body).map_err(|e| format!("not the Hub's tree listing: {e}"))?;
    let mut files = Vec::new();
    for e in entries.into_iter().filter(|e| e.kind == "file") {
        if !path_inside(&e.path) {
            return Err(format!("the listing names {:?}, which is not a path inside the repository", e.path));
        }
        let hex_of = |h: &str, len: usize| (h.len() == len && h.bytes().all(|b| b.is_ascii_hexdigit())).then(|| h.to_ascii_lowercase());
        let (size, digest) = match (e.lfs, e.oid) {
            (Some(lfs), _) => (lfs.size, hex_of(&lfs.oid, 64).map(Digest::Sha256)),
            (None, Some(oid)) => (e.size, hex_of(&oid, 40).map(Digest::GitBlob)),
            (None, None) => (e.size, None),
        };
        let digest = digest.ok_or_else(|| format!("the listing gives {:?} no sha256 (LFS) or git blob id (40 hex digits)", e.path))?;
        files.push(RepoFile { path: e.path, size, digest });
    }
    Ok(files)
}

/// The next page of a listing, from the answer's `Link` header (`<url>; rel="next"`).
pub fn next_page(link: Option<&str>) -> Option<String> {
    link?.split(',').find(|l| l.contains("rel=\"next\"")).and_then(|l| Some(l.split_once('<')?.1.split_once('>')?.0.to_owned()))
}

/// sha256 of a stream of bytes, hex (as the Hub's `lfs.oid`).
#[derive(Clone, Default)]
pub struct FileHash(Sha256);

impl FileHash {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn hex(self) -> String {
        hex(&self.0.finalize())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// git's blob hasher for `size` bytes: sha1 of `blob <size>\0` and then the bytes.
fn git_blob_hasher(size: u64) -> Sha1 {
    let mut h = Sha1::new();
    h.update(format!("blob {size}\0").as_bytes());
    h
}

/// The git blob id of `bytes` (what the Hub's tree lists as `oid` for a file kept in git).
pub fn git_blob_id(bytes: &[u8]) -> String {
    let mut h = git_blob_hasher(bytes.len() as u64);
    h.update(bytes);
    hex(&h.finalize())
}

/// The hash of a file's bytes as they arrive, of the kind its `Digest` names.
#[derive(Clone)]
pub enum ContentHash {
    Sha256(FileHash),
    GitBlob(Sha1),
}

impl ContentHash {
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            Self::Sha256(h) => h.update(bytes),
            Self::GitBlob(h) => h.update(bytes),
        }
    }

    pub fn hex(self) -> String {
        match self {
            Self::Sha256(h) => h.hex(),
            Self::GitBlob(h) => hex(&h.finalize()),
        }
    }
}

#[cfg(test)]
mod tests;
