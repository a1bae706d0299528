//! `pd-operator read-model-config`: what the Job reading a mounted source's config.json runs
//! (`pd_core::model_read` renders it). It reads the file where the engines will, checks it is a
//! model config, and writes it (or why it could not) as the pod's termination message, where the
//! controller reads it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use pd_core::hub::MAX_BYTES;
use pd_core::model::HfConfig;
use pd_core::model_read::{self, ERROR_PREFIX};

#[derive(Args, Debug)]
pub struct ReadModelConfigArgs {
    /// The model's config.json, where the engines read it.
    #[arg(long)]
    pub file: PathBuf,
    /// Where the result goes (a pod's `/dev/termination-log`); stdout without it.
    #[arg(long)]
    pub termination_log: Option<PathBuf>,
}

/// Exit 0 with the config in the message; 2 with the reason there instead.
pub fn run(args: &ReadModelConfigArgs) -> ExitCode {
    let (message, code) = match read(&args.file) {
        Ok(message) => (message, ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: {e}");
            (format!("{ERROR_PREFIX}{e}"), ExitCode::from(2))
        }
    };
    match &args.termination_log {
        Some(path) => {
            if let Err(e) = std::fs::write(path, &message) {
                eprintln!("error: writing {}: {e}", path.display());
                return ExitCode::from(1);
            }
        }
        None => println!("{message}"),
    }
    code
}

/// The termination message carrying the file, or why there is none.
fn read(file: &Path) -> Result<String, String> {
    let shown = file.display();
    let meta = std::fs::metadata(file).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{shown}: no such file ({})", what_is_there(file)),
        _ => format!("{shown}: {e}"),
    })?;
    if meta.len() > MAX_BYTES as u64 {
        return Err(format!("{shown} is {} bytes, over the {MAX_BYTES} a model config may have", meta.len()));
    }
    let text = std::fs::read_to_string(file).map_err(|e| format!("{shown}: {e}"))?;
    HfConfig::parse(&text).map_err(|e| format!("{shown}: {e}"))?;
    model_read::encode(&text).map_err(|e| format!("{shown}: {e}"))
}

/// What the directory holds instead, so a wrong `path` shows where the model is.
fn what_is_there(file: &Path) -> String {
    let mut dir = file.parent();
    while let Some(d) = dir {
        if let Ok(entries) = std::fs::read_dir(d) {
            let mut names: Vec<String> = entries.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
            names.sort();
            let more = names.len().saturating_sub(20);
            names.truncate(20);
            let listed = if names.is_empty() { "nothing".to_owned() } else { names.join(", ") };
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            return format!("{} holds {listed}{more}; check the source's path", d.display());
        }
        dir = d.parent();
    }
    "no directory of it exists".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_names_what_the_volume_holds_instead() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("qwen3-ft")).unwrap();
        std::fs::write(dir.path().join("qwen3-ft/model.safetensors"), b"x").unwrap();
        let e = read(&dir.path().join("qwen3-ft/config.json")).unwrap_err();
        assert!(
            e.contains("config.json: no such file (") && e.contains("qwen3-ft holds model.safetensors; check the source's path"),
            "{e}"
        );
        let e = read(&dir.path().join("other/config.json")).unwrap_err();
        assert!(e.contains(&format!("{} holds qwen3-ft; check", dir.path().display())), "{e}");
        std::fs::write(dir.path().join("qwen3-ft/config.json"), b"<html>").unwrap();
        assert!(read(&dir.path().join("qwen3-ft/config.json")).unwrap_err().contains("not valid JSON"));
        std::fs::write(dir.path().join("qwen3-ft/config.json"), br#"{"architectures": ["Qwen3ForCausalLM"], "num_attention_heads": 32}"#)
            .unwrap();
        let message = read(&dir.path().join("qwen3-ft/config.json")).unwrap();
        assert_eq!(model_read::decode(&message).unwrap(), r#"{"architectures":["Qwen3ForCausalLM"],"num_attention_heads":32}"#);
    }
}
