//! The model directory a stand-in engine is given (`--model-path` naming a path, as a mounted
//! `spec.model.source` does): its `config.json` and its files, read as SGLang 0.5.23 reads them
//! (transformers 5.19's `AutoConfig`), and a missing or partial one refused with the same words,
//! so a wrong mount fails visibly in tests. A Hub id (`org/name`) is not read.

use std::path::Path;

use serde_json::Value;

use super::SimError;

/// What the directory holds: the config's `architectures[0]` and `model_type`, and its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelDir {
    pub architecture: Option<String>,
    pub model_type: String,
    pub files: Vec<String>,
}

/// Whether SGLang reads `path` as a local path rather than a Hub id: it exists as a directory,
/// or it could not be a repository id (absolute or relative to the working directory).
fn is_path(path: &str) -> bool {
    Path::new(path).is_dir() || path.starts_with('/') || path.starts_with("./") || path.starts_with("../")
}

/// Reads the model directory `path`; `None` for a Hub id. The errors are SGLang's.
pub fn read(path: &str) -> Result<Option<ModelDir>, SimError> {
    if path.is_empty() || !is_path(path) {
        return Ok(None);
    }
    let dir = Path::new(path);
    if !dir.is_dir() {
        // huggingface_hub's validation of what then can only be a repository id.
        return Err(SimError::Model(format!(
            "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{path}'. Use `repo_type` argument if needed."
        )));
    }
    let unrecognized =
        || SimError::Model(format!("ValueError: Unrecognized model in {path}. Should have a `model_type` key in its config.json."));
    let config_path = dir.join("config.json");
    let Ok(text) = std::fs::read_to_string(&config_path) else { return Err(unrecognized()) };
    let config: Value = serde_json::from_str(&text).map_err(|_| {
        SimError::Model(format!("OSError: It looks like the config file at '{}' is not a valid JSON file.", config_path.display()))
    })?;
    let model_type = config.get("model_type").and_then(Value::as_str).ok_or_else(unrecognized)?.to_owned();
    let architecture = config.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str).map(str::to_owned);
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| SimError::Model(format!("OSError: cannot list {path}: {e}")))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    files.sort();
    Ok(Some(ModelDir { architecture, model_type, files }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory removed when the test ends.
    struct Dir(std::path::PathBuf);

    impl Dir {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn message(path: &str) -> String {
        read(path).unwrap_err().to_string()
    }

    #[test]
    fn a_mounted_model_is_read_and_a_missing_or_partial_one_refused_with_sglangs_words() {
        let root = std::env::temp_dir().join(format!("pd-sim-model-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let dir = Dir(root);
        let path = dir.path().to_str().unwrap().to_owned();
        assert_eq!(message(&path), format!("ValueError: Unrecognized model in {path}. Should have a `model_type` key in its config.json."));
        std::fs::write(dir.path().join("config.json"), "{\"architectures\": [").unwrap();
        assert_eq!(message(&path), format!("OSError: It looks like the config file at '{path}/config.json' is not a valid JSON file."));
        std::fs::write(dir.path().join("config.json"), "{\"architectures\": [\"X\"]}").unwrap();
        assert!(message(&path).starts_with("ValueError: Unrecognized model in"), "no model_type");
        let qwen = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/parity/configs/Qwen3ForCausalLM.json");
        std::fs::copy(qwen, dir.path().join("config.json")).unwrap();
        std::fs::write(dir.path().join("model-00001-of-00001.safetensors"), b"").unwrap();
        let model = read(&path).unwrap().unwrap();
        assert_eq!((model.architecture.as_deref(), model.model_type.as_str()), (Some("Qwen3ForCausalLM"), "qwen3"));
        assert_eq!(model.files, ["config.json", "model-00001-of-00001.safetensors"]);
    }

    #[test]
    fn a_mount_that_is_not_there_is_a_repo_id_to_sglang_and_hub_ids_are_not_read() {
        assert_eq!(
            message("/models/absent"),
            "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/models/absent'. Use `repo_type` argument if needed."
        );
        assert_eq!(read("Qwen/Qwen3-8B").unwrap(), None);
        assert_eq!(read("").unwrap(), None);
    }
}
