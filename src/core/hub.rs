//! The Hugging Face Hub as huggingface_hub reads it (`spec.model.source.huggingFace`): the
//! revision a spec asks for, the URL of the model's `config.json`, and what each answer means.
//! Pure: the read Job does the GET (`model_read`), and keeps what it read.

use thiserror::Error;

use crate::model::HfConfig;
use pd_api::{HuggingFaceSource, ModelSpec, SecretKeyRef};

/// The revision the spec asks for: the Hub source's, else `model.revision`.
pub fn requested_revision(model: &ModelSpec) -> Option<String> {
    model.source.as_ref().and_then(|s| s.hugging_face.as_ref()).and_then(|h| h.revision.clone()).or_else(|| model.revision.clone())
}

/// The revision read and fetched: the source's, else `model.revision`, else `main`.
pub fn revision(model: &ModelSpec) -> String {
    requested_revision(model).unwrap_or_else(|| "main".into())
}

/// huggingface_hub's default `HF_ENDPOINT`.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The file read, and the key it is kept under.
pub const CONFIG_FILE: &str = "config.json";
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
    let revision = revision(model);
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
        let old: ModelSpec = serde_json::from_value(serde_json::json!({"path": "acme/ft", "revision": "v1",
            "source": {"huggingFace": {"repo": "acme/ft"}}}))
        .unwrap();
        assert!(request(&old).unwrap().url.ends_with("/resolve/v1/config.json"), "model.revision without the source's");
        let cached = model(serde_json::json!({"repo": "acme/ft", "revision": "v2", "cache": {"size": "10Gi"}}));
        assert!(request(&cached).unwrap().url.ends_with("/resolve/v2/config.json"), "a cached source's config.json is its revision's");
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
}
