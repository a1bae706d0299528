use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    pd_operator::allocator::tune();
    let cli = pd_operator::cli::Cli::parse();
    pd_runtime::telemetry::init(&cli.logging);
    pd_operator::cli::run(cli)
}
