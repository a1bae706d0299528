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
