//! A stand-in Hugging Face Hub for the tiers where the real one cannot be reached: it serves
//! `/{repo}/resolve/{revision}/{file}` as the Hub does, 404 for what it does not hold, and 401
//! for a gated repository asked without its token (`Authorization: Bearer`). Plain threads and
//! `std::net`, so any test can start one.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// What the stand-in holds: files by `repo/revision/file`, and the token each gated repo wants.
#[derive(Clone, Debug, Default)]
pub struct HubFiles {
    pub files: BTreeMap<String, String>,
    pub gated: BTreeMap<String, String>,
}

impl HubFiles {
    /// Adds `file` of `repo` at `revision`.
    pub fn file(mut self, repo: &str, revision: &str, file: &str, body: &str) -> Self {
        self.files.insert(format!("{repo}/{revision}/{file}"), body.to_owned());
        self
    }

    /// Answers `repo` only to requests carrying `token`.
    pub fn gate(mut self, repo: &str, token: &str) -> Self {
        self.gated.insert(repo.to_owned(), token.to_owned());
        self
    }
}

/// A running stand-in; it serves until the test process exits.
pub struct HubStandIn {
    /// `http://127.0.0.1:<port>`: what `huggingFace.endpoint` (`HF_ENDPOINT`) names.
    pub endpoint: String,
    /// Every request line it answered, with the status: `GET /a/b/resolve/main/config.json 200`.
    pub log: Arc<Mutex<Vec<String>>>,
}

impl HubStandIn {
    pub fn start(files: HubFiles) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the stand-in Hub");
        let endpoint = format!("http://{}", listener.local_addr().expect("its address"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (files, shared) = (Arc::new(files), log.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (files, log) = (files.clone(), shared.clone());
                std::thread::spawn(move || serve(stream, &files, &log));
            }
        });
        Self { endpoint, log }
    }

    pub fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The status and body the Hub gives for `path` (`/{org}/{name}/resolve/{revision}/{file}`).
pub fn answer(files: &HubFiles, path: &str, bearer: Option<&str>) -> (u16, String) {
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    let [org, name, "resolve", revision, file] = parts[..] else { return (404, "Entry not found".into()) };
    let repo = format!("{org}/{name}");
    if let Some(token) = files.gated.get(&repo)
        && bearer != Some(token.as_str())
    {
        return (401, format!("Access to model {repo} is restricted. You must have access to it and be authenticated to access it."));
    }
    // The revision comes percent-encoded (`refs%2Fpr%2F1`).
    let revision = revision.replace("%2F", "/");
    match files.files.get(&format!("{repo}/{revision}/{file}")) {
        Some(body) => (200, body.clone()),
        None => (404, "Repository Not Found".into()),
    }
}

fn serve(stream: TcpStream, files: &HubFiles, log: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(&stream);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut bearer = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("authorization")
        {
            bearer = v.trim().strip_prefix("Bearer ").map(str::to_owned);
        }
    }
    let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let (status, body) = answer(files, &path, bearer.as_deref());
    log.lock().unwrap_or_else(|p| p.into_inner()).push(format!("GET {path} {status}"));
    let reason = if status == 200 { "OK" } else { "Error" };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let mut stream = &stream;
    let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes()));
}

/// The token the gated fixture repository wants.
pub const GATED_TOKEN: &str = "hf_stand_in_token";

/// Real config.json files the Hub serves (tests/parity/configs), under repository names the
/// model catalogue does not know, so only the file can decide: `acme/qwen3-ft` (GQA, Qwen3),
/// `acme/dsv3-ft` (MLA, DeepSeek-V3) and `acme/dsv3-gated` (the same, behind `GATED_TOKEN`).
pub fn fixtures() -> HubFiles {
    let config = |arch: &str| {
        let path = crate::repo_path(&format!("tests/parity/configs/{arch}.json"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let (gqa, mla) = (config("Qwen3ForCausalLM"), config("DeepseekV3ForCausalLM"));
    HubFiles::default()
        .file("acme/qwen3-ft", "main", "config.json", &gqa)
        .file("acme/dsv3-ft", "main", "config.json", &mla)
        .file("acme/dsv3-gated", "main", "config.json", &mla)
        .gate("acme/dsv3-gated", GATED_TOKEN)
}

/// A PDDeployment `name` whose model comes from `repo` on the Hub at `endpoint`; `more` adds to
/// the `huggingFace` source (e.g. `tokenSecretRef: {name: hf}`), `decode` is its parallelism.
pub fn spec(name: &str, endpoint: &str, repo: &str, more: &str, decode: &str) -> String {
    let more = if more.is_empty() { String::new() } else { format!(", {more}") };
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: {name}}}\nspec:\n  model:\n    path: {repo}\n    source: {{huggingFace: {{repo: {repo}, endpoint: '{endpoint}'{more}}}}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{parallelism: {{tp: 8}}}}\n  decode: {{parallelism: {decode}}}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stand_in_answers_as_the_hub_does() {
        let files = fixtures();
        assert_eq!(answer(&files, "/acme/dsv3-ft/resolve/main/config.json", None).0, 200);
        assert_eq!(answer(&files, "/acme/nope/resolve/main/config.json", None).0, 404);
        assert_eq!(answer(&files, "/acme/dsv3-gated/resolve/main/config.json", None).0, 401);
        assert_eq!(answer(&files, "/acme/dsv3-gated/resolve/main/config.json", Some("wrong")).0, 401);
        assert_eq!(answer(&files, "/acme/dsv3-gated/resolve/main/config.json", Some(GATED_TOKEN)).0, 200);
    }
}
