//! `kubectl pd`: a kubectl plugin for PDDeployments. `status` (roles, instances, KV sets,
//! revisions, conditions, pods), `rankmap` (which prefill ranks each decode rank reads), `explain`
//! (why one is not ready or was refused, with SGLang's text and the fix) and `validate` (the
//! offline verdict `pd-operator validate` gives). Reading is in `fetch`, drawing in `view`.

pub mod fetch;
pub mod view;

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use pd_core::offline;
use pd_runtime::verdict_args::VerdictArgs;

/// What the exit status means (`kubectl pd --help` prints it).
pub const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  validate found violations
  2  unreadable input, or no such PDDeployment
  4  the Kubernetes API unreachable or refusing, the output not written";

#[derive(Parser, Debug)]
#[command(name = "kubectl pd", bin_name = "kubectl pd", version, about = "PDDeployments at a glance: status, rank map, why not ready")]
#[command(after_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Roles, instances, KV sets, revisions, conditions and pods of one PDDeployment.
    Status(Target),
    /// Which prefill ranks each decode rank reads KV from, as a table and a matrix.
    Rankmap(Target),
    /// Why a PDDeployment is not ready or was refused: SGLang's text, the pods out of service,
    /// recent warnings and the fix.
    Explain(Target),
    /// The offline verdict on manifests, as `pd-operator validate` gives it.
    Validate(ValidateArgs),
}

#[derive(Args, Debug)]
pub struct Target {
    /// The PDDeployment's name.
    pub name: String,
    /// Its namespace (default: the kubeconfig context's).
    #[arg(short, long)]
    pub namespace: Option<String>,
}

#[derive(Args, Debug)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub verdict: VerdictArgs,
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Validate(args) => validate(&args),
        Command::Status(t) => live(t, view::status),
        Command::Rankmap(t) => live(t, view::rankmap),
        Command::Explain(t) => live(t, view::explain),
    };
    match result.and_then(|(text, code)| write_stdout(&text).map(|()| code)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn validate(args: &ValidateArgs) -> Result<(String, ExitCode), fetch::Error> {
    let v = &args.verdict;
    let (loaded, config) = offline::load(&v.files, &v.model_config).map_err(fetch::Error::Input)?;
    let (text, valid) =
        offline::report(&loaded, config.as_ref(), v.assumed(), args.json).map_err(|e| fetch::Error::Output(e.to_string()))?;
    Ok((text, if valid { ExitCode::SUCCESS } else { ExitCode::from(1) }))
}

/// Reads one PDDeployment with its pods and events, and draws it with `draw`.
fn live(target: Target, draw: fn(&fetch::Snapshot) -> String) -> Result<(String, ExitCode), fetch::Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fetch::Error::Output(format!("cannot start the async runtime: {e}")))?;
    let snapshot = rt.block_on(fetch::snapshot(&target.name, target.namespace.as_deref()))?;
    Ok((draw(&snapshot), ExitCode::SUCCESS))
}

fn write_stdout(text: &str) -> Result<(), fetch::Error> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(|e| fetch::Error::Output(format!("cannot write to stdout: {e}")))
}
