//! `pd-operator fetch-model`'s I/O: resolve the revision to a commit, list the repository at that
//! commit, download each file into `<file>.<tag>.part` (resuming with `Range` from what is
//! there), stop at the size the Hub lists, check the file's hash against the Hub's own (sha256 for
//! LFS files, the git blob id for the rest) and rename it into place. A file already in place is
//! done only when its hash matches. The token goes only to the endpoint's origin (scheme, host and
//! port). pd-core's `model_fetch` holds the URLs, the listing's reading and the report.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{AUTHORIZATION, CONTENT_RANGE, LINK, LOCATION, RANGE, USER_AGENT};
use hyper::{Request, Response, Uri};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{info, warn};

use pd_core::hub::MAX_REDIRECTS;
use pd_core::model_fetch::{self, ContentHash, Progress, RepoFile};

/// Attempts per file: a dropped connection resumes, a failed check starts the file again.
pub const ATTEMPTS: u32 = 5;
/// The longest wait for the next bytes of an answer.
const IDLE: Duration = Duration::from_secs(60);
/// The largest tree page read.
const MAX_LISTING: usize = 64 << 20;

/// What to fetch, and where.
#[derive(Clone, Debug)]
pub struct FetchSpec {
    pub endpoint: String,
    pub repo: String,
    pub revision: String,
    pub dest: PathBuf,
    pub token: Option<String>,
    /// Names this fetcher's `.part` files, so fetchers of two PDDeployments sharing a claim never
    /// write the same one (a Job's retries share its tag, and resume).
    pub part_tag: String,
    /// Files downloaded at once.
    pub parallel: usize,
}

/// Files downloaded at once unless told otherwise: a Hub or mirror serves each connection at a
/// bounded rate, so a repository of many shards fetches faster over several (huggingface_hub's
/// `snapshot_download` uses 8 workers).
pub const DEFAULT_PARALLEL: u16 = 4;

/// Why a fetch stopped; each names the URL or file.
#[derive(Debug, Error)]
pub enum FetchError {
    #[error("GET {url}: HTTP {status}{}", file.as_ref().map(|f| format!(" for {f}")).unwrap_or_default())]
    Status { url: String, status: u16, file: Option<String> },
    #[error("GET {url}: {message}")]
    Transfer { url: String, message: String },
    #[error("{file}: {message}")]
    Check { file: String, message: String },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("GET {url}: {message}")]
    Listing { url: String, message: String },
    #[error("--{field}: {message}; give {example}")]
    Invalid { field: &'static str, message: String, example: &'static str },
}

impl FetchError {
    /// Worth another attempt: the network, the Hub's overload, a body that failed its check.
    fn transient(&self) -> bool {
        match self {
            Self::Status { status, .. } => *status == 429 || *status >= 500,
            Self::Transfer { .. } | Self::Check { .. } => true,
            Self::Io { .. } | Self::Listing { .. } | Self::Invalid { .. } => false,
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FetchError + '_ {
    move |source| FetchError::Io { path: path.display().to_string(), source }
}

/// The repository id and revision against the Hub's rules, before anything is asked or written:
/// they name the directory the files go to.
pub fn check_spec(spec: &FetchSpec) -> Result<(), FetchError> {
    use pd_core::hub_id;
    hub_id::repo_id(&spec.repo).map_err(|message| FetchError::Invalid { field: "repo", message, example: hub_id::REPO_ID_EXAMPLE })?;
    hub_id::revision(&spec.revision).map_err(|message| FetchError::Invalid {
        field: "revision",
        message,
        example: hub_id::REVISION_EXAMPLE,
    })
}

/// The commit `spec.revision` names now (itself when it is one), from the Hub's model info.
pub async fn resolve(spec: &FetchSpec) -> Result<String, FetchError> {
    check_spec(spec)?;
    if pd_core::hub_id::is_commit(&spec.revision) {
        return Ok(spec.revision.to_ascii_lowercase());
    }
    let url = model_fetch::revision_url(&spec.endpoint, &spec.repo, &spec.revision);
    let response = get(spec, &url, None).await?;
    let status = response.status().as_u16();
    if status != 200 {
        return Err(FetchError::Status { url, status, file: Some(format!("the revision {} of {}", spec.revision, spec.repo)) });
    }
    let body = Limited::new(response.into_body(), MAX_LISTING).collect().await;
    let body = body.map_err(|e| FetchError::Listing { url: url.clone(), message: e.to_string() })?.to_bytes();
    model_fetch::parse_revision(&body).map_err(|message| FetchError::Listing { url, message })
}

/// The fetch: every file of the repository in `spec.dest`, `spec.parallel` at a time; `report`
/// sees the progress as it goes. The first file that fails for good stops the rest (their parts
/// stay, for the next run to resume).
/// `spec.revision` is the commit `resolve` gave, so every file comes from one commit.
pub async fn fetch(spec: &FetchSpec, report: &mut dyn FnMut(&Progress)) -> Result<Progress, FetchError> {
    check_spec(spec)?;
    let files = list(spec).await?;
    let mut tally = Tally::new(&files);
    tally.progress.commit = pd_core::hub_id::is_commit(&spec.revision).then(|| spec.revision.clone());
    info!(repo = %spec.repo, revision = %spec.revision, files = files.len(), bytes = tally.progress.total_bytes, parallel = spec.parallel, "fetching");
    report(&tally.progress);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let work = futures::stream::iter(files.iter().enumerate())
        .map(|(index, file)| fetch_file(spec, file, FileReport { index, tx: tx.clone() }))
        .buffer_unordered(spec.parallel.max(1))
        .try_collect::<()>();
    tokio::pin!(work);
    let result = loop {
        tokio::select! {
            biased;
            Some(update) = rx.recv() => {
                tally.apply(update);
                report(&tally.progress);
            }
            result = &mut work => break result,
        }
    };
    while let Ok(update) = rx.try_recv() {
        tally.apply(update);
    }
    report(&tally.progress);
    result?;
    tally.progress.done = true;
    Ok(tally.progress)
}

/// What one file's fetch tells the whole.
#[derive(Debug)]
enum Update {
    /// `have` bytes of the file are on disk, `new` of them just downloaded.
    Bytes {
        index: usize,
        have: u64,
        new: u64,
    },
    /// An attempt failed; another follows.
    Retrying {
        index: usize,
        error: String,
    },
    Done {
        index: usize,
    },
}

/// One file's side of the channel.
struct FileReport {
    index: usize,
    tx: tokio::sync::mpsc::UnboundedSender<Update>,
}

impl FileReport {
    fn send(&self, update: Update) {
        // The receiver outlives every file's fetch; a send can only fail after the fetch ended.
        let _ = self.tx.send(update);
    }
}

/// The whole fetch's progress, from the files' updates.
struct Tally {
    progress: Progress,
    sizes: Vec<u64>,
    have: Vec<u64>,
    /// Files whose last attempt failed, with why; the first is the progress's error.
    retrying: std::collections::BTreeMap<usize, String>,
}

impl Tally {
    fn new(files: &[RepoFile]) -> Self {
        let progress = Progress {
            total_bytes: files.iter().map(|f| f.size).sum(),
            total_files: u32::try_from(files.len()).unwrap_or(u32::MAX),
            ..Default::default()
        };
        Self { progress, sizes: files.iter().map(|f| f.size).collect(), have: vec![0; files.len()], retrying: Default::default() }
    }

    fn apply(&mut self, update: Update) {
        match update {
            Update::Bytes { index, have, new } => {
                self.have[index] = have;
                self.progress.downloaded += new;
            }
            Update::Retrying { index, error } => {
                self.retrying.insert(index, error);
            }
            Update::Done { index } => {
                self.have[index] = self.sizes[index];
                self.retrying.remove(&index);
                self.progress.files += 1;
            }
        }
        self.progress.bytes = self.have.iter().sum();
        self.progress.error = self.retrying.values().next().cloned();
    }
}

/// Every file of the listing, page by page.
pub async fn list(spec: &FetchSpec) -> Result<Vec<RepoFile>, FetchError> {
    let mut url = model_fetch::tree_url(&spec.endpoint, &spec.repo, &spec.revision);
    let mut files = Vec::new();
    loop {
        let response = get(spec, &url, None).await?;
        let status = response.status().as_u16();
        if status != 200 {
            return Err(FetchError::Status { url, status, file: Some(format!("the file list of {}@{}", spec.repo, spec.revision)) });
        }
        let next = model_fetch::next_page(response.headers().get(LINK).and_then(|l| l.to_str().ok()));
        let body = Limited::new(response.into_body(), MAX_LISTING).collect().await;
        let body = body.map_err(|e| FetchError::Listing { url: url.clone(), message: e.to_string() })?.to_bytes();
        files.extend(model_fetch::parse_tree(&body).map_err(|message| FetchError::Listing { url: url.clone(), message })?);
        match next {
            Some(n) => url = n,
            None => return Ok(files),
        }
    }
}

/// One file, in place and checked; attempts again after a transient failure.
async fn fetch_file(spec: &FetchSpec, file: &RepoFile, report: FileReport) -> Result<(), FetchError> {
    let target = spec.dest.join(&file.path);
    if tokio::fs::metadata(&target).await.is_ok_and(|m| m.is_file() && m.len() == file.size) {
        let mut hash = file.digest.hasher(file.size);
        hash_into(&target, &mut hash).await?;
        let got = hash.hex();
        if got == file.digest.hex() {
            report.send(Update::Done { index: report.index });
            return Ok(());
        }
        warn!(file = %file.path, got, want = file.digest.hex(), "the file in place differs from the Hub's; fetching it again");
    }
    if let Some(parent) = target.parent() {
        tokio::fs::create_dir_all(parent).await.map_err(io(parent))?;
    }
    let part = PathBuf::from(format!("{}.{}.part", target.display(), spec.part_tag));
    let mut attempt = 1;
    loop {
        match download(spec, file, &part, &report).await {
            Ok(()) => break,
            Err(e) if e.transient() && attempt < ATTEMPTS => {
                warn!(file = %file.path, attempt, error = %e, "attempt failed; trying again");
                report.send(Update::Retrying { index: report.index, error: e.to_string() });
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
    tokio::fs::rename(&part, &target).await.map_err(io(&target))?;
    report.send(Update::Done { index: report.index });
    Ok(())
}

/// One attempt: resume `part` from its length, then check it whole.
async fn download(spec: &FetchSpec, file: &RepoFile, part: &Path, report: &FileReport) -> Result<(), FetchError> {
    let url = model_fetch::file_url(&spec.endpoint, &spec.repo, &spec.revision, &file.path);
    let mut have = tokio::fs::metadata(part).await.map(|m| m.len()).unwrap_or(0);
    if have > file.size {
        tokio::fs::remove_file(part).await.map_err(io(part))?;
        have = 0;
    }
    let mut hash = file.digest.hasher(file.size);
    if have > 0 {
        hash_into(part, &mut hash).await?;
    }
    // An empty file is fetched too: its GET creates the part.
    if have < file.size || file.size == 0 {
        let response = get(spec, &url, (have > 0).then_some(have)).await?;
        let status = response.status().as_u16();
        let resumed = match status {
            206 if content_range_start(&response) == Some(have) => true,
            200 => false,
            _ => return Err(FetchError::Status { url, status, file: Some(file.path.clone()) }),
        };
        if !resumed {
            (have, hash) = (0, file.digest.hasher(file.size));
        }
        let mut out =
            tokio::fs::OpenOptions::new().create(true).write(true).append(resumed).truncate(!resumed).open(part).await.map_err(io(part))?;
        let mut body = response.into_body();
        loop {
            let frame = match tokio::time::timeout(IDLE, body.frame()).await {
                Err(_) => {
                    return Err(FetchError::Transfer { url, message: format!("no bytes for {IDLE:?} after {have} of {}", file.size) });
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(FetchError::Transfer { url, message: format!("{e} after {have} of {} bytes", file.size) }),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else { continue };
            if have + data.len() as u64 > file.size {
                drop(out);
                tokio::fs::remove_file(part).await.map_err(io(part))?;
                let message = format!("the answer is longer than the {} bytes the Hub lists; nothing past them is written", file.size);
                return Err(FetchError::Check { file: file.path.clone(), message });
            }
            out.write_all(&data).await.map_err(io(part))?;
            hash.update(&data);
            have += data.len() as u64;
            report.send(Update::Bytes { index: report.index, have, new: data.len() as u64 });
        }
        out.flush().await.map_err(io(part))?;
    }
    check(file, part, have, hash).await
}

/// The size and the hash the Hub lists; a file that fails starts again.
async fn check(file: &RepoFile, part: &Path, have: u64, hash: ContentHash) -> Result<(), FetchError> {
    let fail = |message: String| FetchError::Check { file: file.path.clone(), message };
    if have < file.size {
        return Err(fail(format!("the answer ended after {have} of {} bytes", file.size)));
    }
    if have > file.size {
        tokio::fs::remove_file(part).await.map_err(io(part))?;
        return Err(fail(format!("{have} bytes, the Hub lists {}", file.size)));
    }
    let (got, want) = (hash.hex(), file.digest.hex());
    if got != want {
        tokio::fs::remove_file(part).await.map_err(io(part))?;
        return Err(fail(format!("{} {got}, the Hub lists {want}: the bytes are not the Hub's", file.digest.name())));
    }
    Ok(())
}

async fn hash_into(path: &Path, hash: &mut ContentHash) -> Result<(), FetchError> {
    let mut f = tokio::fs::File::open(path).await.map_err(io(path))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).await.map_err(io(path))?;
        if n == 0 {
            return Ok(());
        }
        hash.update(&buf[..n]);
    }
}

/// The first byte of a `206`'s `Content-Range: bytes <start>-<end>/<size>`.
fn content_range_start<B>(response: &Response<B>) -> Option<u64> {
    let value = response.headers().get(CONTENT_RANGE)?.to_str().ok()?;
    value.strip_prefix("bytes ")?.split_once('-')?.0.trim().parse().ok()
}

/// Whether a request to `to` may carry the token of `endpoint`: only to the endpoint's own origin
/// (scheme, host and port). huggingface_hub's requests drops `Authorization` on a redirect to
/// another host or scheme (`rebuild_auth`); this also keeps it from a `Link` page elsewhere and
/// from `http` when the endpoint is `https` (a downgrade on the same host).
pub fn sends_token(endpoint: &Uri, to: &Uri) -> bool {
    let port = |u: &Uri| {
        u.port_u16().or_else(|| match u.scheme_str() {
            Some("https") => Some(443),
            Some("http") => Some(80),
            _ => None,
        })
    };
    let host = |u: &Uri| u.host().map(str::to_ascii_lowercase);
    endpoint.scheme().is_some() && endpoint.scheme() == to.scheme() && host(endpoint) == host(to) && port(endpoint) == port(to)
}

/// A GET of `url` (from byte `from`), following the redirects `egress::fetch_redirect_allowed`
/// allows; the token goes only to the endpoint's origin (`sends_token`).
async fn get(spec: &FetchSpec, url: &str, from: Option<u64>) -> Result<Response<hyper::body::Incoming>, FetchError> {
    let transfer = |message: String| FetchError::Transfer { url: url.to_owned(), message };
    let mut uri: Uri = url.parse().map_err(|e: hyper::http::uri::InvalidUri| transfer(e.to_string()))?;
    let endpoint: Option<Uri> = spec.endpoint.parse().ok();
    let client = crate::hub::client(url).map_err(|e| transfer(e.to_string()))?;
    for _ in 0..=MAX_REDIRECTS {
        let mut builder = Request::get(uri.clone()).header(USER_AGENT, concat!("pd-operator/", env!("CARGO_PKG_VERSION")));
        if let Some(t) = spec.token.as_deref().filter(|_| endpoint.as_ref().is_some_and(|e| sends_token(e, &uri))) {
            builder = builder.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        if let Some(from) = from {
            builder = builder.header(RANGE, format!("bytes={from}-"));
        }
        let request = builder.body(Empty::<Bytes>::new()).map_err(|e| transfer(e.to_string()))?;
        let answer =
            tokio::time::timeout(IDLE, client.request(request)).await.map_err(|_| transfer(format!("no answer within {IDLE:?}")))?;
        let response = answer.map_err(|e| transfer(std::error::Error::source(&e).map_or(e.to_string(), |s| format!("{e}: {s}"))))?;
        if response.status().is_redirection()
            && let Some(next) = response.headers().get(LOCATION).and_then(|l| l.to_str().ok()).and_then(|l| crate::hub::follow(&uri, l))
        {
            if !pd_core::egress::fetch_redirect_allowed(url, &next.to_string()) {
                return Err(transfer(format!(
                    "HTTP {} redirects to {}, which the fetch does not follow (only https, to no loopback, link-local or metadata host)",
                    response.status().as_u16(),
                    pd_core::remote::excerpt(&format!(
                        "{}://{}",
                        next.scheme_str().unwrap_or_default(),
                        next.authority().map_or("", |a| a.as_str())
                    ))
                )));
            }
            uri = next;
            continue;
        }
        return Ok(response);
    }
    Err(transfer(format!("more than {MAX_REDIRECTS} redirects")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_goes_only_to_the_endpoints_scheme_host_and_port() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        let hub = uri("https://huggingface.co");
        assert!(sends_token(&hub, &uri("https://huggingface.co/api/models/a/b/tree/main")));
        assert!(sends_token(&hub, &uri("https://HuggingFace.co:443/a/b/resolve/x/c.json")));
        for elsewhere in [
            "http://huggingface.co/a",
            "http://huggingface.co:443/a",
            "https://huggingface.co:8443/a",
            "https://cdn-lfs.hf.co/x",
            "https://evil.example/huggingface.co",
        ] {
            assert!(!sends_token(&hub, &uri(elsewhere)), "{elsewhere}");
        }
        let mirror = uri("http://127.0.0.1:8080");
        assert!(sends_token(&mirror, &uri("http://127.0.0.1:8080/x")));
        assert!(!sends_token(&mirror, &uri("http://127.0.0.1:8081/x")) && !sends_token(&mirror, &uri("https://127.0.0.1:8080/x")));
    }
}
