//! A stand-in Hugging Face Hub for the tiers where the real one cannot be reached: it serves
//! `/{repo}/resolve/{revision}/{file}` as the Hub does (with `Range`), the tree listing
//! `/api/models/{repo}/tree/{revision}` (sizes, the git blob id of every file and the sha256 of
//! LFS files), the model info `/api/models/{repo}/revision/{revision}` (the commit, `sha`), 404
//! for what it does not hold, and 401 for a gated repository asked without its token
//! (`Authorization: Bearer`). Each stored revision has a commit id of its own, and a branch can be
//! moved to another stored revision while it serves. It counts the file bytes it sends, records
//! the token each request carried, and can be told to fail a file's next answer (a connection
//! dropped mid-body, a corrupted or longer body, a status, a redirect), to serve a file whose
//! bytes differ from the listed ones, or to name a next listing page elsewhere. Plain threads and `std::net`, so any test can
//! start one; `pd-sim hub` runs one in a pod (the kind tier's in-cluster Hub), its count at
//! `GET /-/served`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What the stand-in holds: files by `repo/revision/file`, the sha256 of those that are LFS
/// files (the listing gives it), the token each gated repo wants, the bytes served instead of
/// the listed ones (`tamper`), and where moved branches point (`repo/branch` → stored revision).
#[derive(Clone, Debug, Default)]
pub struct HubFiles {
    pub files: BTreeMap<String, Arc<Vec<u8>>>,
    pub lfs: BTreeMap<String, String>,
    pub gated: BTreeMap<String, String>,
    pub tampered: BTreeMap<String, Arc<Vec<u8>>>,
    refs: Arc<Mutex<BTreeMap<String, String>>>,
}

/// The commit id the stand-in gives a stored revision of `repo` (40 hex digits, stable).
pub fn commit_of(repo: &str, revision: &str) -> String {
    let mut h = pd_core::model_fetch::FileHash::default();
    h.update(format!("{repo}@{revision}").as_bytes());
    h.hex()[..40].to_owned()
}

impl HubFiles {
    /// Adds `file` of `repo` at `revision`.
    pub fn file(self, repo: &str, revision: &str, file: &str, body: &str) -> Self {
        self.blob(repo, revision, file, body.as_bytes().to_vec(), false)
    }

    /// Adds `file` with `bytes`; `lfs`: listed as an LFS file, with its sha256.
    pub fn blob(mut self, repo: &str, revision: &str, file: &str, bytes: Vec<u8>, lfs: bool) -> Self {
        let key = format!("{repo}/{revision}/{file}");
        if lfs {
            let mut h = pd_core::model_fetch::FileHash::default();
            h.update(&bytes);
            self.lfs.insert(key.clone(), h.hex());
        }
        self.files.insert(key, Arc::new(bytes));
        self
    }

    /// Serves `bytes` for `file` while the listing keeps the hashes of the stored bytes.
    pub fn tamper(mut self, repo: &str, revision: &str, file: &str, bytes: Vec<u8>) -> Self {
        self.tampered.insert(format!("{repo}/{revision}/{file}"), Arc::new(bytes));
        self
    }

    /// Points branch `reference` of `repo` at the stored revision `to` (a push to the branch).
    pub fn move_ref(&self, repo: &str, reference: &str, to: &str) {
        self.refs.lock().unwrap_or_else(|p| p.into_inner()).insert(format!("{repo}/{reference}"), to.to_owned());
    }

    /// The stored revision a request's revision names: a commit id, a moved branch, or itself.
    fn stored(&self, repo: &str, revision: &str) -> String {
        if pd_core::hub_id::is_commit(revision) {
            let prefix = format!("{repo}/");
            let names = self.files.keys().filter_map(|k| k.strip_prefix(&prefix)?.split('/').next());
            if let Some(name) = names.into_iter().find(|name| commit_of(repo, name) == revision) {
                return name.to_owned();
            }
        }
        let refs = self.refs.lock().unwrap_or_else(|p| p.into_inner());
        refs.get(&format!("{repo}/{revision}")).cloned().unwrap_or_else(|| revision.to_owned())
    }

    /// Answers `repo` only to requests carrying `token`.
    pub fn gate(mut self, repo: &str, token: &str) -> Self {
        self.gated.insert(repo.to_owned(), token.to_owned());
        self
    }

    /// The tree listing of `repo` at `revision`, as the Hub's API gives it.
    fn tree(&self, repo: &str, revision: &str) -> Option<String> {
        let prefix = format!("{repo}/{revision}/");
        let entries: Vec<serde_json::Value> = self
            .files
            .iter()
            .filter_map(|(k, body)| Some((k, k.strip_prefix(&prefix)?, body)))
            .map(|(key, path, body)| {
                let oid = pd_core::model_fetch::git_blob_id(body);
                let mut entry = serde_json::json!({"type": "file", "oid": oid, "size": body.len(), "path": path});
                if let Some(sha256) = self.lfs.get(key) {
                    let pointer = format!("version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {}\n", body.len());
                    entry["oid"] = pd_core::model_fetch::git_blob_id(pointer.as_bytes()).into();
                    entry["size"] = pointer.len().into();
                    entry["lfs"] = serde_json::json!({"oid": sha256, "size": body.len(), "pointerSize": pointer.len()});
                }
                entry
            })
            .collect();
        (!entries.is_empty()).then(|| serde_json::Value::Array(entries).to_string())
    }
}

/// A failure of a file's next answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answers `302 Found` with `Location: <to>`.
    Redirect { to: String },
    /// Sends the whole body and `extra` bytes more than listed.
    Longer { extra: usize },
    /// Sends the headers for the whole body, then `after` bytes of it, then closes.
    Drop { after: usize },
    /// Sends the whole body with one byte changed.
    Corrupt,
    /// Answers with this status instead.
    Status(u16),
    /// Sends `after` bytes of the body, then waits for `HubStandIn::release` before the rest.
    Hold { after: usize },
}

/// Every request's path and the bearer token it carried.
type Bearers = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A running stand-in; it serves until the test process exits.
pub struct HubStandIn {
    /// `http://127.0.0.1:<port>`: what `huggingFace.endpoint` (`HF_ENDPOINT`) names.
    pub endpoint: String,
    /// Every request line it answered, with the status: `GET /a/b/resolve/main/config.json 200`.
    pub log: Arc<Mutex<Vec<String>>>,
    /// File body bytes sent (resolve answers only, faults included).
    pub served: Arc<AtomicU64>,
    faults: Arc<Mutex<Vec<(String, Fault)>>>,
    released: Arc<std::sync::atomic::AtomicBool>,
    /// Every request's path and the bearer token it carried.
    bearers: Bearers,
    link_next: Arc<Mutex<Option<String>>>,
    files: Arc<HubFiles>,
}

/// What a connection's thread shares with the stand-in.
#[derive(Clone)]
struct Shared {
    files: Arc<HubFiles>,
    log: Arc<Mutex<Vec<String>>>,
    served: Arc<AtomicU64>,
    faults: Arc<Mutex<Vec<(String, Fault)>>>,
    released: Arc<std::sync::atomic::AtomicBool>,
    bearers: Bearers,
    link_next: Arc<Mutex<Option<String>>>,
}

impl HubStandIn {
    /// A stand-in on a free local port (for tests).
    pub fn start(files: HubFiles) -> Self {
        Self::bind("127.0.0.1:0", files).expect("bind the stand-in Hub")
    }

    /// A stand-in listening on `addr`.
    pub fn bind(addr: &str, files: HubFiles) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let shared = Shared {
            files: Arc::new(files),
            log: Arc::default(),
            served: Arc::default(),
            faults: Arc::default(),
            released: Arc::default(),
            bearers: Arc::default(),
            link_next: Arc::default(),
        };
        let stand_in = Self {
            endpoint,
            log: shared.log.clone(),
            served: shared.served.clone(),
            faults: shared.faults.clone(),
            released: shared.released.clone(),
            bearers: shared.bearers.clone(),
            link_next: shared.link_next.clone(),
            files: shared.files.clone(),
        };
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let shared = shared.clone();
                std::thread::spawn(move || serve(stream, &shared));
            }
        });
        Ok(stand_in)
    }

    pub fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The file body bytes sent so far.
    pub fn bytes_served(&self) -> u64 {
        self.served.load(Ordering::SeqCst)
    }

    /// Fails the next answer for a file whose request path ends with `path_suffix`.
    pub fn inject(&self, path_suffix: &str, fault: Fault) {
        self.faults.lock().unwrap_or_else(|p| p.into_inner()).push((path_suffix.to_owned(), fault));
    }

    /// The bearer token each request whose path contains `fragment` carried, in order.
    pub fn bearers(&self, fragment: &str) -> Vec<Option<String>> {
        let all = self.bearers.lock().unwrap_or_else(|p| p.into_inner());
        all.iter().filter(|(path, _)| path.contains(fragment)).map(|(_, b)| b.clone()).collect()
    }

    /// Names `url` as the next page (`Link: <url>; rel="next"`) of the next tree listing.
    pub fn link_next(&self, url: &str) {
        *self.link_next.lock().unwrap_or_else(|p| p.into_inner()) = Some(url.to_owned());
    }

    /// Points branch `reference` of `repo` at the stored revision `to` from now on.
    pub fn move_ref(&self, repo: &str, reference: &str, to: &str) {
        self.files.move_ref(repo, reference, to);
    }

    /// Lets every held answer (`Fault::Hold`) send the rest of its body.
    pub fn release(&self) {
        self.released.store(true, Ordering::SeqCst);
    }
}

/// An answer: status, body, and for a file its `Content-Range` (a 206).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Arc<Vec<u8>>,
    pub range: Option<String>,
    pub file: bool,
}

fn text(status: u16, body: &str) -> Answer {
    Answer { status, body: Arc::new(body.as_bytes().to_vec()), range: None, file: false }
}

/// What the Hub gives for `path` (`/{org}/{name}/resolve/{revision}/{file}` or
/// `/api/models/{org}/{name}/tree/{revision}`), from byte `from` of a file.
pub fn answer(files: &HubFiles, path: &str, bearer: Option<&str>, from: Option<u64>) -> Answer {
    let path = path.split('?').next().unwrap_or_default();
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(6, '/').collect();
    let (repo, revision, file) = match parts[..] {
        ["api", "models", org, name, "tree", revision] => (format!("{org}/{name}"), revision, None),
        ["api", "models", org, name, "revision", revision] => (format!("{org}/{name}"), revision, Some("")),
        [org, name, "resolve", revision, ..] => {
            let file = path.trim_start_matches('/').splitn(5, '/').nth(4).unwrap_or_default();
            (format!("{org}/{name}"), revision, Some(file))
        }
        _ => return text(404, "Entry not found"),
    };
    if let Some(token) = files.gated.get(&repo)
        && bearer != Some(token.as_str())
    {
        return text(401, &format!("Access to model {repo} is restricted. You must have access to it and be authenticated to access it."));
    }
    // The revision (and a file's name) come percent-encoded (`refs%2Fpr%2F1`).
    let revision = files.stored(&repo, &revision.replace("%2F", "/"));
    let Some(file) = file else {
        return files.tree(&repo, &revision).map_or_else(|| text(404, "Repository Not Found"), |t| text(200, &t));
    };
    if file.is_empty() {
        let info = serde_json::json!({"id": repo, "sha": commit_of(&repo, &revision)}).to_string();
        return files.tree(&repo, &revision).map_or_else(|| text(404, "Revision Not Found"), |_| text(200, &info));
    }
    let key = format!("{repo}/{revision}/{}", file.replace("%20", " "));
    let Some(body) = files.tampered.get(&key).or_else(|| files.files.get(&key)) else {
        return text(404, "Repository Not Found");
    };
    match from.filter(|f| *f > 0) {
        None => Answer { status: 200, body: body.clone(), range: None, file: true },
        Some(f) if f >= body.len() as u64 => text(416, "Requested Range Not Satisfiable"),
        Some(f) => {
            let start = usize::try_from(f).unwrap_or(usize::MAX);
            let range = format!("bytes {f}-{}/{}", body.len() - 1, body.len());
            Answer { status: 206, body: Arc::new(body[start..].to_vec()), range: Some(range), file: true }
        }
    }
}

/// The request's path and the headers the stand-in reads (`Authorization`, `Range`).
fn read_request(stream: &TcpStream) -> Option<(String, Option<String>, Option<u64>)> {
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).ok()?;
    let (mut bearer, mut from) = (None, None);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
            break;
        }
        let Some((k, v)) = line.split_once(':') else { continue };
        if k.eq_ignore_ascii_case("authorization") {
            bearer = v.trim().strip_prefix("Bearer ").map(str::to_owned);
        } else if k.eq_ignore_ascii_case("range") {
            from = v.trim().strip_prefix("bytes=").and_then(|r| r.trim_end_matches('-').parse().ok());
        }
    }
    Some((request_line.split_whitespace().nth(1).unwrap_or("/").to_owned(), bearer, from))
}

/// The stand-in's own path: the file bytes it sent, as `{"bytes": N}`.
pub const SERVED_PATH: &str = "/-/served";

fn serve(stream: TcpStream, shared: &Shared) {
    let Some((path, bearer, from)) = read_request(&stream) else { return };
    shared.bearers.lock().unwrap_or_else(|p| p.into_inner()).push((path.clone(), bearer.clone()));
    let mut a = if path == SERVED_PATH {
        text(200, &serde_json::json!({"bytes": shared.served.load(Ordering::SeqCst)}).to_string())
    } else {
        answer(&shared.files, &path, bearer.as_deref(), from)
    };
    let fault = if a.file {
        let mut faults = shared.faults.lock().unwrap_or_else(|p| p.into_inner());
        let at = faults.iter().position(|(suffix, _)| path.split('?').next().unwrap_or_default().ends_with(suffix.as_str()));
        at.map(|i| faults.remove(i).1)
    } else {
        None
    };
    let mut send = a.body.len();
    let mut hold = None;
    let mut extra_headers = String::new();
    if a.status == 200
        && path.contains("/tree/")
        && let Some(next) = shared.link_next.lock().unwrap_or_else(|p| p.into_inner()).take()
    {
        extra_headers = format!("link: <{next}>; rel=\"next\"\r\n");
    }
    match fault {
        Some(Fault::Status(status)) => a = text(status, "injected"),
        Some(Fault::Redirect { to }) => {
            a = text(302, "Found");
            extra_headers = format!("location: {to}\r\n");
        }
        Some(Fault::Longer { extra }) => {
            let mut longer = a.body.to_vec();
            longer.extend(noise(extra, 7));
            (a.body, send) = (Arc::new(longer), send + extra);
        }
        Some(Fault::Drop { after }) => send = after.min(send),
        Some(Fault::Hold { after }) => hold = Some(after),
        Some(Fault::Corrupt) => {
            let mut bad = a.body.to_vec();
            if let Some(b) = bad.get_mut(send / 2) {
                *b ^= 0xff;
            }
            a.body = Arc::new(bad);
        }
        None => {}
    }
    shared.log.lock().unwrap_or_else(|p| p.into_inner()).push(format!("GET {path} {}", a.status));
    let reason = if a.status < 300 { "OK" } else { "Error" };
    let range = a.range.as_ref().map(|r| format!("content-range: {r}\r\n")).unwrap_or_default();
    let head = format!(
        "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{range}{extra_headers}connection: close\r\n\r\n",
        a.status,
        a.body.len()
    );
    let mut stream = &stream;
    if stream.write_all(head.as_bytes()).is_err() {
        return;
    }
    let body = if a.file && a.status < 300 { &a.body[..send] } else { &a.body[..] };
    for (i, chunk) in body.chunks(64 << 10).enumerate() {
        if hold.is_some_and(|after| i * (64 << 10) >= after) {
            while !shared.released.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            hold = None;
        }
        if stream.write_all(chunk).is_err() {
            return;
        }
        if a.file && a.status < 300 {
            shared.served.fetch_add(chunk.len() as u64, Ordering::SeqCst);
        }
    }
    let _ = stream.flush();
}

/// Bytes that differ everywhere (a corrupted or misplaced range shows), the same for a `seed`.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let step = |x: u64| x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut x = step(seed);
    (0..len)
        .map(|_| {
            x = step(x);
            (x >> 33) as u8
        })
        .collect()
}

/// What `pd-sim hub` serves of one repository.
#[derive(Clone, Debug)]
pub struct Repo {
    pub repo: String,
    pub revision: String,
    /// Its `config.json`, verbatim.
    pub config: String,
    /// LFS weight shards (`model-0000i-of-0000n.safetensors`) and the bytes of each.
    pub shards: usize,
    pub shard_bytes: usize,
}

impl HubFiles {
    /// Adds `r`: its config.json, a tokenizer file (kept in git) and its weight shards (LFS).
    pub fn repo(self, r: &Repo) -> Self {
        let hub =
            self.file(&r.repo, &r.revision, "config.json", &r.config).blob(&r.repo, &r.revision, "tokenizer.json", noise(4096, 0), false);
        (1..=r.shards).fold(hub, |h, i| {
            let name = format!("model-{i:05}-of-{:05}.safetensors", r.shards);
            h.blob(&r.repo, &r.revision, &name, noise(r.shard_bytes, i as u64), true)
        })
    }
}

/// `pd-sim hub`: serves `repos` on `listen` until `stop`.
pub async fn run(listen: &str, repos: &[Repo], stop: tokio_util::sync::CancellationToken) -> Result<(), super::SimError> {
    let files = repos.iter().fold(HubFiles::default(), HubFiles::repo);
    let size: usize = files.files.values().map(|b| b.len()).sum();
    let hub = HubStandIn::bind(listen, files).map_err(|source| super::SimError::Listen { addr: listen.to_owned(), source })?;
    tracing::info!(endpoint = %hub.endpoint, repos = repos.len(), bytes = size, "the stand-in Hub serves");
    stop.cancelled().await;
    tracing::info!(served = hub.bytes_served(), "the stand-in Hub stops");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use pd_core::model_fetch::Digest;

    #[test]
    fn a_branch_resolves_to_its_commit_and_moves_while_commits_stay() {
        let files = HubFiles::default().file("a/b", "main", "x.txt", "one").file("a/b", "v2", "x.txt", "two").tamper(
            "a/b",
            "v2",
            "x.txt",
            "owt".into(),
        );
        let info =
            |rev: &str| pd_core::model_fetch::parse_revision(&answer(&files, &format!("/api/models/a/b/revision/{rev}"), None, None).body);
        let first = info("main").unwrap();
        assert_eq!(first, commit_of("a/b", "main"));
        files.move_ref("a/b", "main", "v2");
        assert_eq!(info("main").unwrap(), commit_of("a/b", "v2"));
        assert_eq!(answer(&files, &format!("/a/b/resolve/{first}/x.txt"), None, None).body.as_slice(), b"one", "a commit stays");
        assert_eq!(answer(&files, "/a/b/resolve/main/x.txt", None, None).body.as_slice(), b"owt", "tampered bytes are served");
        let listed = pd_core::model_fetch::parse_tree(&answer(&files, "/api/models/a/b/tree/main", None, None).body).unwrap();
        assert_eq!(listed[0].digest, Digest::GitBlob(pd_core::model_fetch::git_blob_id(b"two")), "the listing keeps the stored bytes' id");
        assert_eq!(answer(&files, "/api/models/a/b/revision/none", None, None).status, 404);
    }

    #[test]
    fn the_tree_lists_sizes_and_lfs_hashes_and_files_answer_ranges() {
        let files = HubFiles::default().file("a/b", "main", "config.json", "{}").blob("a/b", "main", "w/x.bin", b"abc".to_vec(), true);
        let tree = answer(&files, "/api/models/a/b/tree/main?recursive=true", None, None);
        let listed = pd_core::model_fetch::parse_tree(&tree.body).unwrap();
        assert_eq!(listed[1].path, "w/x.bin");
        assert_eq!(
            (listed[1].size, &listed[1].digest),
            (3, &Digest::Sha256("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".into()))
        );
        // `git hash-object` of `{}`.
        assert_eq!(listed[0].digest, Digest::GitBlob("9e26dfeeb6e641a33dae4961196235bdb965b21b".into()));
        let part = answer(&files, "/a/b/resolve/main/w/x.bin", None, Some(1));
        assert_eq!((part.status, part.body.as_slice(), part.range.as_deref()), (206, &b"bc"[..], Some("bytes 1-2/3")));
        assert_eq!(answer(&files, "/a/b/resolve/main/w/x.bin", None, Some(3)).status, 416);
        assert_eq!(answer(&files, "/api/models/a/c/tree/main", None, None).status, 404);
    }

    fn get(endpoint: &str, path: &str) -> Vec<u8> {
        let mut stream = TcpStream::connect(endpoint.trim_start_matches("http://")).unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nhost: hub\r\n\r\n").unwrap();
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut stream, &mut out).unwrap();
        let head = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        out.split_off(head + 4)
    }

    #[test]
    fn a_served_repository_lists_its_shards_and_counts_the_bytes_sent() {
        let r = Repo { repo: "a/b".into(), revision: "main".into(), config: "{}".into(), shards: 2, shard_bytes: 1000 };
        let hub = HubStandIn::start(HubFiles::default().repo(&r));
        let listed = pd_core::model_fetch::parse_tree(&get(&hub.endpoint, "/api/models/a/b/tree/main")).unwrap();
        let names: Vec<(&str, u64, bool)> =
            listed.iter().map(|f| (f.path.as_str(), f.size, matches!(f.digest, Digest::Sha256(_)))).collect();
        assert_eq!(
            names,
            [
                ("config.json", 2, false),
                ("model-00001-of-00002.safetensors", 1000, true),
                ("model-00002-of-00002.safetensors", 1000, true),
                ("tokenizer.json", 4096, false)
            ]
        );
        assert_eq!(get(&hub.endpoint, "/a/b/resolve/main/model-00002-of-00002.safetensors").len(), 1000);
        assert_eq!(get(&hub.endpoint, SERVED_PATH), br#"{"bytes":1000}"#);
    }
}
