//! The model's own `config.json` from a Hugging Face source (`spec.model.source.huggingFace`):
//! the URL huggingface_hub reads it from, what each answer means, the ConfigMap the operator
//! keeps it in, and the `ModelConfigResolved` condition. Pure: pd-runtime's `hub` does the GET.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use thiserror::Error;

use crate::model::HfConfig;
use crate::render;
use pd_api::{ConfigMapKeyRef, HuggingFaceSource, ModelSpec, PDDeployment, SecretKeyRef};

/// huggingface_hub's default `HF_ENDPOINT`.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The file read, and the key it is kept under.
pub const CONFIG_FILE: &str = "config.json";
/// The condition reporting whether the source's config.json was read.
pub const CONDITION: &str = "ModelConfigResolved";
/// The kept ConfigMap's annotation naming where its config.json came from (a Hub source's URL, a
/// mounted source's `model_read::VolumeRead::origin`): a spec naming another reads it again.
pub const URL_ANNOTATION: &str = "pd.inference.dev/model-config-url";
/// `pd.inference.dev/role` of the kept ConfigMap.
pub const ROLE: &str = "model-config";
/// The most of a config.json read (DeepSeek-V4's is a few KiB; a ConfigMap holds at most 1 MiB).
pub const MAX_BYTES: usize = 512 << 10;
/// Redirects followed (the Hub redirects renamed repositories).
pub const MAX_REDIRECTS: usize = 5;

/// One read of a source's config.json: where, and with which token.
#[derive(Clone, Debug, PartialEq)]
pub struct HubRequest {
    pub repo: String,
    pub url: String,
    pub token: Option<SecretKeyRef>,
}

/// Why a source's config.json is not known; each names the file, the URL and the HTTP status.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HubError {
    #[error(
        "GET {url}: HTTP 404: the Hub has no {CONFIG_FILE} for {repo} at that revision (fix: check spec.model.source.huggingFace.repo and revision)"
    )]
    NotFound { repo: String, url: String },
    #[error(
        "GET {url}: HTTP {status}: {repo} is gated, private or absent, and no token was sent (fix: set spec.model.source.huggingFace.tokenSecretRef to a Secret holding a Hub token with access)"
    )]
    NoToken { repo: String, url: String, status: u16 },
    #[error(
        "GET {url}: HTTP {status}: the Hub refused the token of Secret {secret} key {key} for {repo} (fix: give that token access to the repository)"
    )]
    TokenRefused { repo: String, url: String, status: u16, secret: String, key: String },
    #[error("GET {url}: HTTP {status} for {CONFIG_FILE} of {repo}")]
    Status { repo: String, url: String, status: u16 },
    #[error("GET {url}: {CONFIG_FILE} of {repo} is not a model config: {message}")]
    Invalid { repo: String, url: String, message: String },
    #[error("GET {url}: the Hub could not be reached: {message}")]
    Unreachable { url: String, message: String },
    #[error("the Hub token for {url}: {message} (fix: create the Secret spec.model.source.huggingFace.tokenSecretRef names, with the key)")]
    Token { url: String, message: String },
}

/// Every `HubError::reason`: the reasons a reader's message may give the condition.
pub const REASONS: [&str; 6] = ["ConfigNotFound", "Unauthorized", "HubError", "InvalidConfig", "HubUnreachable", "TokenUnavailable"];

impl HubError {
    /// The condition's reason (one of `REASONS`).
    pub fn reason(&self) -> &'static str {
        REASONS[match self {
            Self::NotFound { .. } => 0,
            Self::NoToken { .. } | Self::TokenRefused { .. } => 1,
            Self::Status { .. } => 2,
            Self::Invalid { .. } => 3,
            Self::Unreachable { .. } => 4,
            Self::Token { .. } => 5,
        }]
    }
}

/// `quote(s, safe="")` of Python: everything but unreserved characters percent-encoded.
pub fn quote(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The Hub a source reads from (the fetch Job too): its endpoint without the trailing slash.
pub fn endpoint(hf: &HuggingFaceSource) -> &str {
    hf.endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT).trim_end_matches('/')
}

/// The read a spec needs: a Hub source and no `configMapRef` (which, given, wins).
pub fn request(model: &ModelSpec) -> Option<HubRequest> {
    let hf = model.source.as_ref()?.hugging_face.as_ref().filter(|_| model.config_map_ref.is_none())?;
    // `hf_hub_url`: HF_ENDPOINT without its trailing slash, the revision quoted, `main` by default.
    let endpoint = endpoint(hf);
    // The revision asked for, cached or not: a cached source's fetch Job fetches that one too.
    let revision = crate::model_fetch::revision(model);
    let url = format!("{endpoint}/{}/resolve/{}/{CONFIG_FILE}", hf.repo, quote(&revision));
    Some(HubRequest { repo: hf.repo.clone(), url, token: hf.token_secret_ref.clone() })
}

/// What an answer from the Hub means: the config.json's text, or why there is none.
pub fn read_answer(req: &HubRequest, status: u16, body: &[u8]) -> Result<(String, HfConfig), HubError> {
    let (repo, url) = (req.repo.clone(), req.url.clone());
    match status {
        200 => {
            let text = String::from_utf8(body.to_vec()).map_err(|e| HubError::Invalid {
                repo: repo.clone(),
                url: url.clone(),
                message: e.to_string(),
            })?;
            let config = HfConfig::parse(&text).map_err(|e| HubError::Invalid { repo, url, message: e.to_string() })?;
            Ok((text, config))
        }
        404 => Err(HubError::NotFound { repo, url }),
        401 | 403 => Err(match &req.token {
            None => HubError::NoToken { repo, url, status },
            Some(t) => HubError::TokenRefused { repo, url, status, secret: t.name.clone(), key: t.key.clone() },
        }),
        _ => Err(HubError::Status { repo, url, status }),
    }
}

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
    Read(crate::model_read::SourceRead),
    Catalogue,
}

pub fn config_source(model: &ModelSpec) -> ConfigSource {
    if let Some(r) = &model.config_map_ref {
        return ConfigSource::ConfigMap(r.clone());
    }
    crate::model_read::request(model).map_or(ConfigSource::Catalogue, ConfigSource::Read)
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
    cm.metadata.labels = Some(render::common_labels(&name, ROLE));
    cm.metadata.annotations = Some(BTreeMap::from([(URL_ANNOTATION.into(), url.into())]));
    cm.metadata.owner_references = render::owner_refs(pdd);
    cm
}

/// The kept config.json, when `cm` holds the one read from `origin` (a Hub source's URL, a
/// mounted source's origin).
pub fn kept(cm: &ConfigMap, origin: &str) -> Option<(String, HfConfig)> {
    let url = cm.metadata.annotations.as_ref()?.get(URL_ANNOTATION)?;
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
    /// A source's config.json, read by the Job and kept.
    pub fn read(read: &crate::model_read::SourceRead, config_map: &str) -> Self {
        Self { resolved: true, reason: "Resolved".into(), message: format!("{} read, kept in ConfigMap {config_map}", read.origin) }
    }

    /// A source's config.json not read (yet): `reason` `Reading`, `ConfigNotRead` or a
    /// `HubError::reason`.
    pub fn unread(reason: &str, message: String) -> Self {
        Self { resolved: false, reason: reason.into(), message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(source: serde_json::Value) -> ModelSpec {
        serde_json::from_value(serde_json::json!({"path": "acme/ft", "source": {"huggingFace": source}})).unwrap()
    }

    #[test]
    fn the_url_is_huggingface_hubs_with_the_endpoint_trimmed_and_the_revision_quoted() {
        let r = request(&model(serde_json::json!({"repo": "Qwen/Qwen3-8B"}))).unwrap();
        assert_eq!(r.url, "https://huggingface.co/Qwen/Qwen3-8B/resolve/main/config.json");
        let m = model(serde_json::json!({"repo": "acme/ft", "revision": "refs/pr/1", "endpoint": "http://mirror:8080/",
            "tokenSecretRef": {"name": "hf"}}));
        let r = request(&m).unwrap();
        assert_eq!(r.url, "http://mirror:8080/acme/ft/resolve/refs%2Fpr%2F1/config.json");
        assert_eq!(r.token.as_ref().map(|t| (t.name.as_str(), t.key.as_str())), Some(("hf", "token")));
        let mut old: ModelSpec = serde_json::from_value(serde_json::json!({"path": "acme/ft", "revision": "v1",
            "source": {"huggingFace": {"repo": "acme/ft"}}}))
        .unwrap();
        assert!(request(&old).unwrap().url.ends_with("/resolve/v1/config.json"), "model.revision without the source's");
        let cached = model(serde_json::json!({"repo": "acme/ft", "revision": "v2", "cache": {"size": "10Gi"}}));
        assert!(request(&cached).unwrap().url.ends_with("/resolve/v2/config.json"), "a cached source's config.json is its revision's");
        old.config_map_ref = Some(ConfigMapKeyRef { name: "mine".into(), key: "c".into() });
        assert_eq!(request(&old), None, "a configMapRef wins");
        assert_eq!(config_ref("x", &old).unwrap().name, "mine");
        assert_eq!(config_ref("x", &m).unwrap(), ConfigMapKeyRef { name: "x-model-config".into(), key: CONFIG_FILE.into() });
        let pvc: ModelSpec = serde_json::from_value(serde_json::json!({"path": "p", "source": {"pvc": {"claimName": "w"}}})).unwrap();
        assert_eq!(request(&pvc), None);
        assert_eq!(config_ref("x", &pvc).unwrap().name, "x-model-config", "a mounted source's is kept too");
        assert_eq!(config_source(&old), ConfigSource::ConfigMap(ConfigMapKeyRef { name: "mine".into(), key: "c".into() }));
        assert!(
            matches!(config_source(&m), ConfigSource::Read(h) if h.from == crate::model_read::ReadFrom::Hub(r.clone()) && h.origin == r.url)
        );
        assert!(matches!(config_source(&pvc), ConfigSource::Read(v) if v.origin == "PersistentVolumeClaim w: /models/config.json"));
        let none: ModelSpec = serde_json::from_value(serde_json::json!({"path": "Qwen/Qwen3-8B"})).unwrap();
        assert_eq!(config_source(&none), ConfigSource::Catalogue);
    }

    #[test]
    fn each_answer_names_the_url_and_status_and_says_how_to_fix_it() {
        let mut r = request(&model(serde_json::json!({"repo": "acme/ft", "endpoint": "http://hub"}))).unwrap();
        let qwen =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/parity/configs/Qwen3ForCausalLM.json")).unwrap();
        let (text, config) = read_answer(&r, 200, qwen.as_bytes()).unwrap();
        assert_eq!((text, config.architectures), (qwen, vec!["Qwen3ForCausalLM".to_owned()]));
        let e = read_answer(&r, 404, b"").unwrap_err();
        assert_eq!(
            e.to_string(),
            "GET http://hub/acme/ft/resolve/main/config.json: HTTP 404: the Hub has no config.json for acme/ft at that revision (fix: check spec.model.source.huggingFace.repo and revision)"
        );
        assert_eq!(e.reason(), "ConfigNotFound");
        assert!(read_answer(&r, 401, b"").unwrap_err().to_string().contains(
            "HTTP 401: acme/ft is gated, private or absent, and no token was sent (fix: set spec.model.source.huggingFace.tokenSecretRef"
        ));
        r.token = Some(SecretKeyRef { name: "hf".into(), key: "token".into() });
        let e = read_answer(&r, 403, b"").unwrap_err();
        assert!(e.to_string().contains("HTTP 403: the Hub refused the token of Secret hf key token"), "{e}");
        let e = read_answer(&r, 503, b"").unwrap_err();
        assert_eq!(e.reason(), "HubError");
        let e = read_answer(&r, 200, b"<html>").unwrap_err();
        assert!(e.to_string().contains("config.json of acme/ft is not a model config: config.json is not valid JSON"), "{e}");
    }

    #[test]
    fn the_kept_config_map_serves_only_the_url_it_was_read_from() {
        let pdd: PDDeployment =
            serde_json::from_value(serde_json::json!({"apiVersion": "pd.inference.dev/v1alpha1", "kind": "PDDeployment",
            "metadata": {"name": "m", "namespace": "ns", "uid": "u"},
            "spec": {"model": {"path": "acme/ft", "source": {"huggingFace": {"repo": "acme/ft"}}}, "prefill": {}, "decode": {}}}))
            .unwrap();
        let r = request(&pdd.spec.model).unwrap();
        let cm = config_map(&pdd, &r.url, r#"{"architectures": ["Qwen3ForCausalLM"]}"#);
        assert_eq!(cm.metadata.name.as_deref(), Some("m-model-config"));
        assert_eq!(cm.metadata.owner_references.as_ref().unwrap()[0].uid, "u");
        assert_eq!(kept(&cm, &r.url).unwrap().1.architectures, ["Qwen3ForCausalLM"]);
        assert!(kept(&cm, &format!("{}x", r.url)).is_none(), "another revision is read again");
    }
}
