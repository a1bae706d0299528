//! The stand-in Hub's fixtures for the suites: real config.json files under repository names the
//! model catalogue does not know, and a PDDeployment naming one. The stand-in itself is
//! `pd_sim::hub` (the kind tier runs it in a pod: `pd-sim hub`).

pub use pd_sim::hub::*;

/// The token the gated fixture repository wants.
pub const GATED_TOKEN: &str = "hf_stand_in_token";

/// The real config.json of architecture `arch` (tests/parity/configs).
pub fn config(arch: &str) -> String {
    let path = crate::repo_path(&format!("tests/parity/configs/{arch}.json"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Real config.json files the Hub serves (tests/parity/configs), under repository names the
/// model catalogue does not know, so only the file can decide: `acme/qwen3-ft` (GQA, Qwen3),
/// `acme/dsv3-ft` (MLA, DeepSeek-V3) and `acme/dsv3-gated` (the same, behind `GATED_TOKEN`).
pub fn fixtures() -> HubFiles {
    let (gqa, mla) = (config("Qwen3ForCausalLM"), config("DeepseekV3ForCausalLM"));
    HubFiles::default()
        .file("acme/qwen3-ft", "main", "config.json", &gqa)
        .file("acme/dsv3-ft", "main", "config.json", &mla)
        .file("acme/dsv3-gated", "main", "config.json", &mla)
        .gate("acme/dsv3-gated", GATED_TOKEN)
}

/// A PDDeployment `name` whose model comes from `repo` on the Hub at `endpoint`; `more` adds to
/// the `huggingFace` source (e.g. `tokenSecretRef: {name: hf}`), `decode` is its parallelism.
pub fn spec(name: &str, endpoint: &str, repo: &str, more: &str, decode: &str) -> String {
    let more = if more.is_empty() { String::new() } else { format!(", {more}") };
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: {name}}}\nspec:\n  model:\n    path: {repo}\n    source: {{huggingFace: {{repo: {repo}, endpoint: '{endpoint}'{more}}}}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{parallelism: {{tp: 8}}}}\n  decode: {{parallelism: {decode}}}\n"
    )
}

/// The kwok tier's pod annotations the stage `pd-model-read-modelled` ends a reading pod with
/// (hack/kwok/pod-stages.yaml): the config it read, or the reader's error.
pub const SEEDED_CONFIG: &str = "kwok.pd.inference.dev/model-config";
pub const SEEDED_ERROR: &str = "kwok.pd.inference.dev/model-config-error";

/// `spec` (a PDDeployment of `spec()`) with what its reading pod says seeded for the kwok tier:
/// the real `pd-operator read-model-config`, run here with the arguments of the Job the operator
/// renders for it (`pd_core::model_read::job`) against the stand-in Hub on this host, given
/// `token` as `HF_TOKEN` as the pod is from the Secret `tokenSecretRef` names. kwok runs no
/// container: its stage ends the reading pod with this message, as the kubelet would.
pub fn seeded(spec: &str, token: Option<&str>) -> String {
    let pdd: pd_api::PDDeployment = serde_norway::from_str(spec).expect("a PDDeployment");
    let job = pd_core::model_read::job(&pdd, "pd-operator").expect("a source the operator reads with a Job");
    let container = job.spec.and_then(|s| s.template.spec).map(|p| p.containers[0].clone()).expect("the reading container");
    let args: Vec<String> = container.args.unwrap_or_default().into_iter().take_while(|a| a != "--termination-log").collect();
    let mut reader = std::process::Command::new(crate::bin("pd-operator"));
    reader.args(&args).env_remove(pd_core::model_read::TOKEN_ENV);
    if let Some(t) = token {
        reader.env(pd_core::model_read::TOKEN_ENV, t);
    }
    let o = reader.output().expect("run pd-operator read-model-config");
    let message = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let key = if o.status.success() { SEEDED_CONFIG } else { SEEDED_ERROR };
    let annotation = serde_json::to_string(&message).expect("a JSON string is a YAML scalar");
    let at = "prefill: {parallelism: {tp: 8}}";
    assert!(spec.contains(at), "spec() has a plain prefill: {spec}");
    spec.replace(at, &format!("prefill: {{parallelism: {{tp: 8}}, template: {{annotations: {{{key}: {annotation}}}}}}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stand_in_answers_as_the_hub_does() {
        let files = fixtures();
        let status = |path: &str, bearer: Option<&str>| answer(&files, path, bearer, None).status;
        assert_eq!(status("/acme/dsv3-ft/resolve/main/config.json", None), 200);
        assert_eq!(status("/acme/nope/resolve/main/config.json", None), 404);
        assert_eq!(status("/acme/dsv3-gated/resolve/main/config.json", None), 401);
        assert_eq!(status("/acme/dsv3-gated/resolve/main/config.json", Some("wrong")), 401);
        assert_eq!(status("/acme/dsv3-gated/resolve/main/config.json", Some(GATED_TOKEN)), 200);
        assert_eq!(status("/api/models/acme/dsv3-gated/tree/main?recursive=true", None), 401);
    }
}
