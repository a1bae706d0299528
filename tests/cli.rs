//! The `pd-operator` binary as users and CI pipelines call it.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pd-operator"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn validate_rejects_the_qwen_dcp_mistake_with_sglang_text_and_field() {
    let o = run(&["validate", "-f", "examples/qwen-dcp2-mistake.yaml"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("qwen-pd: spec.decode.parallelism.dcp: PD decode DCP requires an MLA or hybrid-MLA KV pool."), "{out}");
    assert!(out.contains("(fix: set spec.decode.parallelism.dcp: 1"), "{out}");
}

#[test]
fn validate_accepts_every_valid_example() {
    for f in [
        "deepseek-v3-dcp.yaml",
        "qwen3-gqa.yaml",
        "multi-node-prefill.yaml",
        "llama-different-tp.yaml",
        "sim-demo.yaml",
        "deepseek-v32-dsa.yaml",
        "deepseek-v4.yaml",
    ] {
        let o = run(&["validate", "-f", &format!("examples/{f}")]);
        assert_eq!(o.status.code(), Some(0), "{f}: {}", text(&o));
    }
    let o = run(&["validate", "-f", "examples/llama-different-tp.yaml"]);
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .starts_with("warning: llama-mixed-tp: spec.decode.parallelism.tp: Performance is NOT guaranteed")
    );
}

#[test]
fn validate_json_output_carries_every_finding() {
    let o = run(&["validate", "-f", "examples/qwen-dcp2-mistake.yaml", "-f", "examples/deepseek-v3-dcp.yaml", "--output", "json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(v[0]["valid"], false);
    assert_eq!(v[0]["findings"][0]["field"], "spec.decode.parallelism.dcp");
    assert_eq!(v[0]["model"]["attention"], "GQA");
    assert_eq!(v[1]["valid"], true);
}

#[test]
fn unreadable_input_exits_2_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {name: x\nspec: {}\n").unwrap();
    let o = run(&["validate", "-f", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("bad.yaml") && e.contains("line"), "{e}");
    let o = run(&["validate", "-f", "does-not-exist.yaml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("does-not-exist.yaml: cannot read"));
    std::fs::write(&bad, "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {name: x}\nspec: {model: {path: m}, prefill: {parallelism: {tp: -2}}, decode: {}}\n").unwrap();
    let o = run(&["validate", "-f", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("field `spec.prefill.parallelism.tp`"), "{}", text(&o));
}

#[test]
fn validate_reads_a_configmap_referenced_by_the_spec() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("custom.yaml");
    let doc = |arch: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cfg}}\ndata:\n  config.json: '{{\"architectures\": [\"{arch}\"], \"num_attention_heads\": 64, \"num_key_value_heads\": 8}}'\n---\napiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: custom}}\nspec:\n  model: {{path: /models/custom, configMapRef: {{name: cfg}}}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{parallelism: {{tp: 8}}}}\n  decode: {{parallelism: {{tp: 8, dcp: 2}}}}\n"
        )
    };
    std::fs::write(&f, doc("DeepseekV3ForCausalLM")).unwrap();
    assert_eq!(run(&["validate", "-f", f.to_str().unwrap()]).status.code(), Some(0));
    std::fs::write(&f, doc("LlamaForCausalLM")).unwrap();
    let o = run(&["validate", "-f", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("LlamaForCausalLM, GQA"));
}

/// A spec that never met the CRD's schema (a file, a direct webhook call) with counts past every
/// bound: an overflowing product and a divisor search over 4·10^9 once panicked or hung `validate`.
#[test]
fn validate_answers_counts_past_the_schema_with_findings_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("huge.yaml");
    for (decode, field) in [
        ("{attnDp: 65536, attnCp: 65536}", "spec.decode.parallelism.attnDp"),
        ("{tp: 4294967291, dcp: 4294967290}", "spec.decode.parallelism.tp"),
    ] {
        let doc = format!(
            "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: huge}}\nspec:\n  model: {{path: deepseek-ai/DeepSeek-V3}}\n  prefill: {{parallelism: {{tp: 8}}}}\n  decode: {{parallelism: {decode}}}\n"
        );
        std::fs::write(&f, doc).unwrap();
        let o = run(&["validate", "-f", f.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{decode}: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains(&format!("huge: {field}: ")) && out.contains("above the largest this operator accepts"), "{decode}: {out}");
        assert!(!text(&o).contains("panicked"), "{}", text(&o));
    }
}

#[test]
fn render_refuses_invalid_specs_and_prints_valid_ones() {
    let o = run(&["render", "-f", "examples/qwen-dcp2-mistake.yaml"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    let o = run(&["render", "-f", "examples/deepseek-v3-dcp.yaml", "-n", "ml"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let y = String::from_utf8_lossy(&o.stdout);
    assert_eq!(y.matches("\nkind: Pod\n").count(), 3);
    assert!(y.contains("- --dcp-size\n    - '2'"));
}

#[test]
fn crd_subcommand_prints_the_committed_crd() {
    let o = run(&["crd"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), std::fs::read_to_string("crds/pddeployment.yaml").unwrap());
}

#[test]
fn handshake_check_files_and_jsonl() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d.json");
    let p = dir.path().join("p.json");
    std::fs::write(&d, r#"{"attn_tp_size": 2, "page_size": 32, "kv_cache_dtype": "auto", "kv_pool": "mla"}"#).unwrap();
    std::fs::write(&p, r#"{"attn_tp_size": 8, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1, "page_size": 64, "kv_cache_dtype": "auto", "follow_bootstrap_room": true, "enable_dsa_cache_layer_split": false, "decode_allocation_policy": "early", "enable_kv_cache_sharding": false, "prefill_http_port": 30000, "target_tp_rank": null, "target_tp_ranks": null, "target_cp_ranks": null, "target_pp_ranks": null, "required_dst_info_num": null, "required_prefill_response_num": null}"#).unwrap();
    let o = run(&["handshake", "check", "--decode", d.to_str().unwrap(), "--prefill-info", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"ok": false, "kind": "RuntimeError", "error": "Page size mismatch: prefill server has page_size=64, but decode server has page_size=32. Both servers must use the same --page-size value."})
    );
    std::fs::write(&d, r#"{"attn_tp_size": 2, "page_size": 64, "kv_cache_dtype": "auto", "kv_pool": "mla"}"#).unwrap();
    let o = run(&["handshake", "check", "--decode", d.to_str().unwrap(), "--prefill-info", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["ranks"][1],
        serde_json::json!({"engine_rank": 1, "pp_rank": 0, "target_tp_rank": 4, "target_tp_ranks": [4, 5, 6, 7], "target_cp_ranks": [0], "target_pp_ranks": [0], "required_dst_info_num": 1, "required_prefill_response_num": 1})
    );

    let body = std::fs::read_to_string(&p).unwrap();
    let input = format!(
        "{{\"decode\": {{\"attn_tp_size\": 4, \"attn_cp_size\": 2, \"page_size\": 64, \"kv_cache_dtype\": \"auto\", \"kv_pool\": \"mha\"}}, \"prefill_info\": {body}}}\nnot json\n{{\"decode\": {{\"attn_tp_size\": 8, \"page_size\": 64, \"kv_cache_dtype\": \"auto\", \"kv_pool\": \"mha\"}}, \"prefill_info\": {body}}}\n"
    );
    let mut child = bin().args(["handshake", "check", "--jsonl"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0], serde_json::json!({"ok": false, "kind": "AssertionError", "error": "Decode cp size (2) should be equal to 1"}));
    assert_eq!(lines[1]["kind"], "InputError");
    assert_eq!(lines[2]["ok"], true);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn a_runtime_failure_exits_4_not_2_which_means_unreadable_input() {
    // No cluster to reach: the flags are fine, running is what fails.
    let o = bin()
        .args(["controller", "--webhook=false"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot reach the Kubernetes API"), "{}", text(&o));
    // An unreadable topology file is still input: exit 2.
    let o = run(&["handshake", "run", "--decode", "/nonexistent/decode.json", "--prefill", "a:8998", "--once"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// Output that cannot be written (here `/dev/full`: every write fails with ENOSPC) is a runtime
/// failure, exit 4: not success, and not 2, which means the input was unreadable.
#[test]
fn output_that_cannot_be_written_exits_4() {
    let full = || std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let cases: [&[&str]; 4] = [
        &["crd"],
        &["validate", "-f", "examples/deepseek-v3-dcp.yaml"],
        &["validate", "-f", "examples/qwen-dcp2-mistake.yaml", "-o", "json"],
        &["render", "-f", "examples/deepseek-v3-dcp.yaml"],
    ];
    for args in cases {
        let o = bin().args(args).stdout(full()).output().unwrap();
        assert_eq!(o.status.code(), Some(4), "{args:?}: {}", text(&o));
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains("error: cannot write to stdout: No space left on device"), "{args:?}: {e}");
    }
    // The same commands with a stdout that takes the output still succeed (or fail the check).
    assert_eq!(run(&["crd"]).status.code(), Some(0));
    assert_eq!(run(&["validate", "-f", "examples/qwen-dcp2-mistake.yaml", "-o", "json"]).status.code(), Some(1));
}

#[test]
fn help_documents_every_exit_code() {
    let o = run(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.contains(pd_operator::cli::EXIT_CODES), "{help}");
    for code in 0..=4 {
        assert!(help.contains(&format!("\n  {code}  ")), "exit code {code} undocumented: {help}");
    }
}
