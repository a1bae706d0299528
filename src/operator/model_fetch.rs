//! `pd-operator fetch-model`: what the fetch Job of a cached Hugging Face source runs
//! (`pd_core::model_fetch` renders it). pd-runtime's `model_fetch` downloads; this reports the
//! progress where the operator reads it: the Job's annotation (patched every `--report-every`
//! seconds, with the Job's own ServiceAccount, which may patch only that Job), the termination
//! message at the end, and optionally a file. The progress carries the commit the revision was
//! resolved to, which the Job's next pod reads back and fetches.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::watch;
use tracing::{info, warn};

use pd_api::labels::FETCH_PROGRESS_ANNOTATION;
use pd_core::model_fetch::Progress;
use pd_runtime::model_fetch::{self as download, FetchSpec};

#[derive(Args, Debug)]
pub struct FetchModelArgs {
    /// The Hub, or a mirror of its API.
    #[arg(long, default_value = pd_core::hub::DEFAULT_ENDPOINT)]
    pub endpoint: String,
    /// `org/name` on the Hub.
    #[arg(long)]
    pub repo: String,
    /// A branch, tag or commit.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// The model's directory: every file of the repository goes under it.
    #[arg(long)]
    pub dest: PathBuf,
    /// The Hub token, sent to the endpoint's host only.
    #[arg(long, env = "HF_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The Job (in this pod's namespace) whose annotation gets the progress.
    #[arg(long)]
    pub progress_job: Option<String>,
    /// A file that gets the progress (JSON) as it goes.
    #[arg(long)]
    pub progress_file: Option<PathBuf>,
    /// Where the final report goes (a pod's `/dev/termination-log`).
    #[arg(long)]
    pub termination_log: Option<PathBuf>,
    /// Seconds between progress reports.
    #[arg(long, default_value_t = 5)]
    pub report_every: u64,
    /// Files downloaded at once.
    #[arg(long, default_value_t = download::DEFAULT_PARALLEL, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub parallel: u16,
}

/// Runs the fetch; exit 0 once every file is in place, 4 when it stopped (the report says why).
pub fn run(args: FetchModelArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return super::cli::runtime_error(format!("cannot start the async runtime: {e}")),
    };
    rt.block_on(fetch(args))
}

async fn fetch(args: FetchModelArgs) -> ExitCode {
    let mut spec = FetchSpec {
        endpoint: args.endpoint.clone(),
        repo: args.repo.clone(),
        revision: args.revision.clone(),
        dest: args.dest.clone(),
        token: args.token.clone().filter(|t| !t.trim().is_empty()),
        part_tag: args.progress_job.clone().unwrap_or_else(|| "pd".into()),
        parallel: usize::from(args.parallel),
    };
    let every = Duration::from_secs(args.report_every.max(1));
    let job = match &args.progress_job {
        Some(name) => job_api(name).await,
        None => None,
    };
    let (tx, rx) = watch::channel(Progress::default());
    let reporter = tokio::spawn(report_loop(rx, job.clone(), args.progress_file.clone(), every));
    let (mut latest, mut sent_at) = (Progress::default(), Instant::now());
    let mut on_progress = |p: &Progress| {
        let news = p.files != latest.files || p.error != latest.error || p.total_files != latest.total_files;
        latest = p.clone();
        if news || sent_at.elapsed() >= Duration::from_millis(500) {
            sent_at = Instant::now();
            tx.send_replace(p.clone());
        }
    };
    let result = async {
        spec.revision = pin(&spec, job.as_ref(), args.progress_file.as_ref()).await?;
        download::fetch(&spec, &mut on_progress).await
    }
    .await;
    reporter.abort();
    let (last, code) = match result {
        Ok(p) => {
            info!(bytes = p.bytes, downloaded = p.downloaded, files = p.files, "every file is in place");
            (p, ExitCode::SUCCESS)
        }
        Err(e) => {
            let p = Progress { error: Some(e.to_string()), done: false, ..latest };
            eprintln!("error: {e}");
            (p, ExitCode::from(4))
        }
    };
    publish(job.as_ref(), args.progress_file.as_ref(), &last).await;
    if let Some(path) = &args.termination_log
        && let Err(e) = std::fs::write(path, last.to_json())
    {
        warn!(path = %path.display(), error = %e, "the final report was not written");
    }
    code
}

/// The commit this Job fetches, its repository and revision checked first: the one an earlier pod
/// of the Job resolved (its progress annotation, or the progress file), else the revision resolved
/// now and published before any file is written, so a retry after the branch moved fetches the
/// same commit and never mixes the files of two.
async fn pin(spec: &FetchSpec, job: Option<&(Api<Job>, String)>, file: Option<&PathBuf>) -> Result<String, download::FetchError> {
    download::check_spec(spec)?;
    if let Some(commit) = earlier_commit(job, file).await {
        info!(revision = %spec.revision, commit, "fetching the commit an earlier attempt of this Job resolved");
        return Ok(commit);
    }
    let commit = download::resolve(spec).await?;
    info!(revision = %spec.revision, commit, "resolved the revision");
    publish(job, file, &Progress { commit: Some(commit.clone()), ..Default::default() }).await;
    Ok(commit)
}

/// The commit an earlier pod of this Job reported, if any.
async fn earlier_commit(job: Option<&(Api<Job>, String)>, file: Option<&PathBuf>) -> Option<String> {
    let from_job = match job {
        Some((api, name)) => api.get(name).await.ok().as_ref().and_then(pd_core::model_fetch::job_progress),
        None => None,
    };
    let from_file = || file.and_then(|f| std::fs::read_to_string(f).ok()).and_then(|t| Progress::parse(&t));
    from_job.or_else(from_file)?.commit.filter(|c| pd_core::hub_id::is_commit(c))
}

/// The Job to patch, in the namespace of this pod's ServiceAccount; none without a cluster.
async fn job_api(name: &str) -> Option<(Api<Job>, String)> {
    match pd_runtime::kube_client::connect().await {
        Ok(client) => {
            let ns = client.default_namespace().to_owned();
            Some((Api::namespaced(client, &ns), name.to_owned()))
        }
        Err(e) => {
            warn!(error = %e, "no Kubernetes API: the progress goes to the termination message only");
            None
        }
    }
}

/// Publishes each new progress, at most once per `every`.
async fn report_loop(mut rx: watch::Receiver<Progress>, job: Option<(Api<Job>, String)>, file: Option<PathBuf>, every: Duration) {
    while rx.changed().await.is_ok() {
        let progress = rx.borrow_and_update().clone();
        publish(job.as_ref(), file.as_ref(), &progress).await;
        tokio::time::sleep(every).await;
    }
}

async fn publish(job: Option<&(Api<Job>, String)>, file: Option<&PathBuf>, progress: &Progress) {
    let text = progress.to_json();
    if let Some(path) = file
        && let Err(e) = tokio::fs::write(path, &text).await
    {
        warn!(path = %path.display(), error = %e, "the progress file was not written");
    }
    let Some((api, name)) = job else { return };
    let patch = serde_json::json!({"metadata": {"annotations": {FETCH_PROGRESS_ANNOTATION: text}}});
    if let Err(e) = api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        // The report is progress, not the fetch: the operator reads the end from the termination message.
        warn!(job = %name, error = %e, "the Job's progress annotation was not patched");
    }
}
