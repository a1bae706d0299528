//! `parity-cases`: one JSON line per PDDeployment, the operator's verdict next to each engine
//! process's argv and environment, for the engine-parity tier (tests/parity/parity.py,
//! docs/parity.md). A test tool: it never ships in an image.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use pd_api::Accelerator;
use pd_core::offline::{self, Assumed};

#[derive(Parser, Debug)]
#[command(name = "parity-cases", about = "The operator's verdict and engine argv per PDDeployment, one JSON line each")]
struct Args {
    /// YAML files; multi-document files and ConfigMaps for `model.configMapRef` are accepted.
    #[arg(short = 'f', long = "filename", required = true)]
    files: Vec<PathBuf>,
    /// The model's HF config.json, used for every PDDeployment read.
    #[arg(long)]
    model_config: Option<PathBuf>,
    /// Judge for pods on this GPU where a role's `accelerator` is unset.
    #[arg(long, value_parser = Accelerator::parse)]
    accelerator: Option<Accelerator>,
    /// Judge with this SGLang release where a spec sets no `engine.version`.
    #[arg(long)]
    engine_version: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let (loaded, config) = offline::load(&args.files, &args.model_config)?;
    let assumed = Assumed { accelerator: args.accelerator, engine_version: args.engine_version.as_deref() };
    let mut out = std::io::stdout().lock();
    for d in &loaded.deployments {
        let name = d.object.metadata.name.clone().unwrap_or_default();
        let (findings, facts) = offline::check_one(d, &loaded, config.as_ref(), assumed);
        let case = pd_testing::parity::case(&name, &offline::with_assumed(&d.object.spec, assumed), &facts, findings);
        let line = serde_json::json!({"file": d.path.display().to_string(), "document": d.doc, "case": case});
        writeln!(out, "{line}").map_err(|e| format!("cannot write to stdout: {e}"))?;
    }
    out.flush().map_err(|e| format!("cannot write to stdout: {e}"))
}
