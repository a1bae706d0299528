//! Logging setup: text or JSON, filter from `--log-level` / `PD_LOG_LEVEL` / `RUST_LOG`.

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;

pub fn init(args: &LogArgs) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&args.log_level));
    // Colour only on a terminal: container logs and files get plain `key=value` fields.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = match args.log_format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// `--log-format` and `--log-level`, global options of every binary here.
#[derive(Args, Debug, Clone)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value = "text", env = "PD_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Log filter, e.g. `info` or `pd_operator=debug,kube=info`.
    #[arg(long, global = true, default_value = "info", env = "PD_LOG_LEVEL")]
    pub log_level: String,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}
