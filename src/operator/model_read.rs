//! `pd-operator read-model-config`: what the Job reading a source's config.json runs
//! (`pd_core::model_read` renders it). It reads a mounted source's file where the engines will,
//! or a Hub source's URL with the token the pod was given (`HF_TOKEN`, from the Secret
//! `tokenSecretRef` names), checks it is a model config, and writes it (or why it could not) as
//! the pod's termination message, where the controller reads it.

pub mod kept;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use std::time::Duration;

use clap::Args;

use pd_api::SecretKeyRef;
use pd_core::hub::{HubError, HubRequest, MAX_BYTES};
use pd_core::model::HfConfig;
use pd_core::model_read::{self, TOKEN_ENV};

/// The most the Hub's GET may take, redirects included.
const HUB_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("source").required(true).args(["file", "url"]))]
pub struct ReadModelConfigArgs {
    /// The model's config.json, where the engines read it.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// A Hub source's config.json URL; the token, if any, is read from the environment (HF_TOKEN).
    #[arg(long, requires = "repo")]
    pub url: Option<String>,
    /// The Hub repository the URL is of (named in errors).
    #[arg(long)]
    pub repo: Option<String>,
    /// The Secret the token comes from (named in errors; its value is in HF_TOKEN).
    #[arg(long, requires_all = ["url", "token_key"])]
    pub token_secret: Option<String>,
    /// The Secret's key the token comes from.
    #[arg(long, requires = "token_secret")]
    pub token_key: Option<String>,
    /// Where the result goes (a pod's `/dev/termination-log`); stdout without it.
    #[arg(long)]
    pub termination_log: Option<PathBuf>,
}

/// Exit 0 with the config in the message; 2 with the reason there instead.
pub fn run(args: &ReadModelConfigArgs) -> ExitCode {
    let read = match (&args.file, &args.url) {
        (Some(file), _) => read(file).map_err(|e| (None, e)),
        (None, Some(url)) => read_hub(hub_request(args, url), std::env::var(TOKEN_ENV).ok()).map_err(|e| (Some(e.reason()), e.to_string())),
        (None, None) => Err((None, "give --file or --url".to_owned())),
    };
    let (message, code) = match read {
        Ok(message) => (message, ExitCode::SUCCESS),
        Err((reason, e)) => {
            eprintln!("error: {e}");
            (model_read::encode_error(reason, &e), ExitCode::from(2))
        }
    };
    match &args.termination_log {
        Some(path) => {
            if let Err(e) = std::fs::write(path, &message) {
                eprintln!("error: writing {}: {e}", path.display());
                return ExitCode::from(1);
            }
        }
        None => println!("{message}"),
    }
    code
}

/// The termination message carrying the file, or why there is none.
fn read(file: &Path) -> Result<String, String> {
    let shown = file.display();
    let meta = std::fs::metadata(file).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{shown}: no such file ({})", what_is_there(file)),
        _ => format!("{shown}: {e}"),
    })?;
    if meta.len() > MAX_BYTES as u64 {
        return Err(format!("{shown} is {} bytes, over the {MAX_BYTES} a model config may have", meta.len()));
    }
    let text = std::fs::read_to_string(file).map_err(|e| format!("{shown}: {e}"))?;
    HfConfig::parse(&text).map_err(|e| format!("{shown}: {e}"))?;
    model_read::encode(&text).map_err(|e| format!("{shown}: {e}"))
}

fn hub_request(args: &ReadModelConfigArgs, url: &str) -> HubRequest {
    let token = args.token_secret.clone().map(|name| SecretKeyRef { name, key: args.token_key.clone().unwrap_or_default() });
    HubRequest { repo: args.repo.clone().unwrap_or_default(), url: url.to_owned(), token }
}

/// The termination message carrying `req`'s config.json from the Hub, sending `token` (the
/// Secret's value, when the spec names one).
fn read_hub(req: HubRequest, token: Option<String>) -> Result<String, HubError> {
    let token = match (&req.token, token.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty())) {
        (Some(r), None) => {
            let message = format!("Secret {} has no key {:?}, or does not exist in this namespace", r.name, r.key);
            return Err(HubError::Token { url: req.url.clone(), message });
        }
        (_, token) => token,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| HubError::Unreachable { url: req.url.clone(), message: format!("starting the runtime: {e}") })?;
    let (text, _) = runtime.block_on(pd_runtime::hub::fetch_config(&req, token.as_deref(), HUB_TIMEOUT))?;
    model_read::encode(&text).map_err(|message| HubError::Invalid { repo: req.repo.clone(), url: req.url.clone(), message })
}

/// What the directory holds instead, so a wrong `path` shows where the model is.
fn what_is_there(file: &Path) -> String {
    let mut dir = file.parent();
    while let Some(d) = dir {
        if let Ok(entries) = std::fs::read_dir(d) {
            let mut names: Vec<String> = entries.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
            names.sort();
            let more = names.len().saturating_sub(20);
            names.truncate(20);
            let listed = if names.is_empty() { "nothing".to_owned() } else { names.join(", ") };
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            return format!("{} holds {listed}{more}; check the source's path", d.display());
        }
        dir = d.parent();
    }
    "no directory of it exists".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_names_what_the_volume_holds_instead() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("qwen3-ft")).unwrap();
        std::fs::write(dir.path().join("qwen3-ft/model.safetensors"), b"x").unwrap();
        let e = read(&dir.path().join("qwen3-ft/config.json")).unwrap_err();
        assert!(
            e.contains("config.json: no such file (") && e.contains("qwen3-ft holds model.safetensors; check the source's path"),
            "{e}"
        );
        let e = read(&dir.path().join("other/config.json")).unwrap_err();
        assert!(e.contains(&format!("{} holds qwen3-ft; check", dir.path().display())), "{e}");
        std::fs::write(dir.path().join("qwen3-ft/config.json"), b"<html>").unwrap();
        assert!(read(&dir.path().join("qwen3-ft/config.json")).unwrap_err().contains("not valid JSON"));
        std::fs::write(dir.path().join("qwen3-ft/config.json"), br#"{"architectures": ["Qwen3ForCausalLM"], "num_attention_heads": 32}"#)
            .unwrap();
        let message = read(&dir.path().join("qwen3-ft/config.json")).unwrap();
        assert_eq!(model_read::decode(&message).unwrap(), r#"{"architectures":["Qwen3ForCausalLM"],"num_attention_heads":32}"#);
    }

    /// A token the spec names but the pod was not given (the Secret or its key is missing) is
    /// said so before any request, with the reason the condition shows.
    #[test]
    fn a_named_token_missing_from_the_pod_is_reported_without_a_request() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/a/b/resolve/main/config.json", listener.local_addr().unwrap());
        let req = HubRequest { repo: "a/b".into(), url, token: Some(SecretKeyRef { name: "hf".into(), key: "token".into() }) };
        let e = read_hub(req, Some("  ".into())).unwrap_err();
        assert_eq!(e.reason(), "TokenUnavailable");
        assert!(e.to_string().contains("Secret hf has no key \"token\", or does not exist"), "{e}");
        listener.set_nonblocking(true).unwrap();
        assert!(listener.accept().is_err(), "no connection was made");
    }
}
