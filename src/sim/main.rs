//! `pd-sim`: the stand-in's binary (its own image, never the operator's).

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use pd_runtime::telemetry::{self, LogArgs};
use pd_sim::{SimError, engine, loadgen};

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
    let (bench, args) = match cli.command {
        SimCommand::Engine(a) => (false, a.args),
        SimCommand::Prefill(a) => (false, mode("prefill", a.args)),
        SimCommand::Decode(a) => (false, mode("decode", a.args)),
        SimCommand::Bench(a) => (true, a.args),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(4, format!("cannot start the async runtime: {e}")),
    };
    let result = rt.block_on(async move {
        if bench { loadgen::run(&args).await } else { engine::run_engine(&args, pd_runtime::shutdown::token("the stand-in")).await }
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
