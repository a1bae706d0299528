//! `pd-sim`: the stand-in's binary (its own image, never the operator's).

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use pd_runtime::telemetry::{self, LogArgs};
use pd_sim::{SimError, engine, hub, loadgen};

#[derive(Parser, Debug)]
#[command(name = "pd-sim", version, about = "GPU-free stand-ins for SGLang engines (demo, e2e tiers), and a load generator")]
#[command(after_help = "Exit codes:\n  0  success\n  2  unreadable flags\n  4  a runtime failure: a port taken, a server failed")]
struct Cli {
    #[command(flatten)]
    logging: LogArgs,
    #[command(subcommand)]
    command: SimCommand,
}

#[derive(Subcommand, Debug)]
enum SimCommand {
    /// An engine: `sglang.launch_server`'s argv; `--disaggregation-mode` picks prefill or decode.
    Engine(PassThroughArgs),
    /// A prefill: bootstrap server plus one registered, listening row per rank.
    Prefill(PassThroughArgs),
    /// A decode: the engine's health endpoint.
    Decode(PassThroughArgs),
    /// A closed-loop load generator for the serving benchmark (`--target`, `--concurrency`,
    /// `--requests`, `--model`, `--max-tokens`, `--prompt-bytes`, `--stream`; `--prefill` with `--bootstrap`
    /// plays the gateway), or with `--rate` an open loop for the planner benchmark (`--seconds`,
    /// `--window-seconds`, `--shift FROM:TO`, `--kind-a`/`--kind-b PROMPT:MAX_TOKENS`). Prints
    /// one JSON line.
    Bench(PassThroughArgs),
    /// A stand-in Hugging Face Hub serving small repositories (config.json, a tokenizer file,
    /// weight shards) with the Hub's tree API and `Range`; `GET /-/served` counts the bytes sent.
    Hub(HubArgs),
}

#[derive(Args, Debug)]
struct HubArgs {
    /// Where to listen.
    #[arg(long, default_value = "0.0.0.0:8080")]
    listen: String,
    /// A repository, as `org/name=CONFIG_JSON` (its config.json's text); repeatable.
    #[arg(long = "repo", required = true, value_parser = parse_repo)]
    repos: Vec<(String, String)>,
    /// The revision every repository is served at.
    #[arg(long, default_value = "main")]
    revision: String,
    /// Weight shards per repository.
    #[arg(long, default_value_t = 2)]
    shards: usize,
    /// Bytes of each shard.
    #[arg(long, default_value_t = 4 << 20)]
    shard_bytes: usize,
}

fn parse_repo(s: &str) -> Result<(String, String), String> {
    let (repo, config) = s.split_once('=').ok_or("expected org/name=CONFIG_JSON")?;
    serde_json::from_str::<serde_json::Value>(config).map_err(|e| format!("the config.json of {repo}: {e}"))?;
    Ok((repo.to_owned(), config.to_owned()))
}

impl HubArgs {
    fn repos(&self) -> Vec<hub::Repo> {
        let repo = |(repo, config): &(String, String)| hub::Repo {
            repo: repo.clone(),
            revision: self.revision.clone(),
            config: config.clone(),
            shards: self.shards,
            shard_bytes: self.shard_bytes,
        };
        self.repos.iter().map(repo).collect()
    }
}

#[derive(Args, Debug)]
struct PassThroughArgs {
    /// SGLang's flags, as a real engine would get them; `--sim-page-size N`,
    /// `--sim-kv-cache-dtype D`, `--sim-hold-registrations N` inject faults.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    args: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(&cli.logging);
    let mode = |m: &str, rest: Vec<String>| [vec!["--disaggregation-mode".to_owned(), m.to_owned()], rest].concat();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(4, format!("cannot start the async runtime: {e}")),
    };
    let result = rt.block_on(async move {
        let stop = || pd_runtime::shutdown::token("the stand-in");
        match cli.command {
            SimCommand::Engine(a) => engine::run_engine(&a.args, stop()).await,
            SimCommand::Prefill(a) => engine::run_engine(&mode("prefill", a.args), stop()).await,
            SimCommand::Decode(a) => engine::run_engine(&mode("decode", a.args), stop()).await,
            SimCommand::Bench(a) => loadgen::run(&a.args).await,
            SimCommand::Hub(a) => hub::run(&a.listen, &a.repos(), stop()).await,
        }
    });
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ SimError::Flags(_)) => fail(2, e),
        Err(e) => fail(4, e),
    }
}

fn fail(code: u8, message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(code)
}
