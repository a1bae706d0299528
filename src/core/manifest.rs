//! Reading `PDDeployment`s (and the ConfigMaps they reference) from YAML files, with errors
//! that name the file, the document and the line or field.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

use pd_api::PDDeployment;

#[derive(Debug, Error)]
pub enum LoadError {
    #[error("{path}: cannot read: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: invalid YAML: {message}")]
    Yaml { path: PathBuf, message: String },
    #[error("{path}: document {doc}: {message}")]
    Document { path: PathBuf, doc: usize, message: String },
}

/// One `PDDeployment` read from a file, with fields the schema does not know.
#[derive(Debug, Clone)]
pub struct LoadedDeployment {
    pub path: PathBuf,
    pub doc: usize,
    pub object: PDDeployment,
    /// JSON paths present in the input that `PDDeployment` does not have (typos, wrong nesting).
    pub unknown_fields: Vec<String>,
}

#[derive(Debug, Default)]
pub struct Loaded {
    pub deployments: Vec<LoadedDeployment>,
    pub config_maps: Vec<ConfigMap>,
}

pub fn load_files(paths: &[PathBuf]) -> Result<Loaded, LoadError> {
    let mut loaded = Loaded::default();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io { path: path.clone(), source })?;
        load_str(path, &text, &mut loaded)?;
    }
    Ok(loaded)
}

pub fn load_str(path: &Path, text: &str, into: &mut Loaded) -> Result<(), LoadError> {
    for (index, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
        let doc_no = index + 1;
        let value = Value::deserialize(doc).map_err(|e| LoadError::Yaml { path: path.into(), message: e.to_string() })?;
        let err = |message: String| LoadError::Document { path: path.into(), doc: doc_no, message };
        match value {
            Value::Null => continue,
            Value::Object(ref o) => {
                let kind = o.get("kind").and_then(Value::as_str).unwrap_or_default();
                let api_version = o.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
                match (api_version, kind) {
                    (v, k) if v == PDDeployment::api_version(&()) && k == PDDeployment::kind(&()) => {
                        let object: PDDeployment =
                            serde_path_to_error::deserialize(&value).map_err(|e| err(format!("field `{}`: {}", e.path(), e.inner())))?;
                        let round_trip = serde_json::to_value(&object).map_err(|e| err(e.to_string()))?;
                        let mut unknown_fields = Vec::new();
                        unknown_keys(&value, &round_trip, "", &mut unknown_fields);
                        into.deployments.push(LoadedDeployment { path: path.into(), doc: doc_no, object, unknown_fields });
                    }
                    ("v1", "ConfigMap") => {
                        let cm: ConfigMap = serde_path_to_error::deserialize(&value)
                            .map_err(|e| err(format!("ConfigMap field `{}`: {}", e.path(), e.inner())))?;
                        into.config_maps.push(cm);
                    }
                    (_, "PDDeployment") => {
                        return Err(err(format!("apiVersion {api_version:?} is not served; use pd.inference.dev/v1alpha1")));
                    }
                    _ => continue,
                }
            }
            _ => return Err(err("expected a Kubernetes object (a YAML mapping)".into())),
        }
    }
    Ok(())
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// Keys of `input` that did not survive deserialization into our types.
fn unknown_keys(input: &Value, kept: &Value, at: &str, out: &mut Vec<String>) {
    match (input, kept) {
        (Value::Object(i), Value::Object(k)) => {
            for (key, v) in i {
                let here = if at.is_empty() { key.clone() } else { format!("{at}.{key}") };
                match k.get(key) {
                    Some(kv) => unknown_keys(v, kv, &here, out),
                    None if at.is_empty() && matches!(key.as_str(), "status") => {}
                    None if !is_empty(v) => out.push(here),
                    None => {}
                }
            }
        }
        (Value::Array(i), Value::Array(k)) if i.len() == k.len() => {
            for (n, (iv, kv)) in i.iter().zip(k).enumerate() {
                unknown_keys(iv, kv, &format!("{at}[{n}]"), out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {name: a}\nspec:\n  model: {path: m}\n  prefill: {parallelism: {tp: 4}}\n  decode: {parallelism: {tp: 4, dpc: 2}}\n";

    #[test]
    fn multi_document_and_unknown_fields() {
        let mut l = Loaded::default();
        let text = format!("{GOOD}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\ndata: {{config.json: '{{}}'}}\n---\n");
        load_str(Path::new("x.yaml"), &text, &mut l).unwrap();
        assert_eq!(l.deployments.len(), 1);
        assert_eq!(l.config_maps.len(), 1);
        assert_eq!(l.deployments[0].unknown_fields, vec!["spec.decode.parallelism.dpc".to_owned()]);
        assert_eq!(l.deployments[0].object.spec.decode.parallelism.tp, 4);
    }

    #[test]
    fn errors_name_file_document_and_field() {
        let mut l = Loaded::default();
        let bad = GOOD.replace("tp: 4}}\n  decode", "tp: four}}\n  decode");
        let e = load_str(Path::new("x.yaml"), &format!("---\n{bad}"), &mut l).unwrap_err().to_string();
        assert!(e.contains("x.yaml: document 1: field `spec.prefill.parallelism.tp`"), "{e}");
        let e = load_str(Path::new("y.yaml"), "a: [1,\n", &mut l).unwrap_err().to_string();
        assert!(e.starts_with("y.yaml: invalid YAML:") && e.contains("line"), "{e}");
    }
}
