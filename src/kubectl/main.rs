use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    kubectl_pd::run(kubectl_pd::Cli::parse())
}
