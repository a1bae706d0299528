//! Table-driven: for every rule, one spec it accepts and one it rejects, checking the message.

use k8s_openapi::api::core::v1::EnvVar;
use pd_api::{AllocationPolicy, AttentionKind, CpStrategy, KvCacheDtype, PDDeploymentSpec, TransferBackend};
use pd_core::findings::{Finding, Severity};
use pd_core::model::HfConfig;
use pd_core::validate::validate;

fn base(model: &str) -> PDDeploymentSpec {
    serde_json::from_value(serde_json::json!({
        "model": {"path": model},
        "kvTransfer": {"pageSize": 64},
        "prefill": {"parallelism": {"tp": 8}},
        "decode": {"parallelism": {"tp": 8}},
    }))
    .unwrap()
}

fn mla() -> PDDeploymentSpec {
    base("deepseek-ai/DeepSeek-V3")
}
fn gqa() -> PDDeploymentSpec {
    base("Qwen/Qwen2.5-72B-Instruct")
}

fn run(spec: &PDDeploymentSpec) -> Vec<Finding> {
    dump_for_parity(spec);
    validate("pd", spec, None)
}

/// With `PD_PARITY_DUMP=<dir>`, every spec a rule test validates is also written there as a
/// PDDeployment, so the engine-parity tier (hack/parity.sh) judges the same specs with SGLang.
/// A `sim` engine's spec is left out: its pods run pd-operator's stand-in, never SGLang, so
/// SGLang's start-up has no verdict on its extraArgs (the stand-in's `--sim-*` options).
fn dump_for_parity(spec: &PDDeploymentSpec) {
    use std::hash::{Hash, Hasher};
    let Some(dir) = std::env::var_os("PD_PARITY_DUMP") else { return };
    if spec.engine.engine_type == pd_api::EngineType::Sim {
        return;
    }
    let doc = serde_json::json!({
        "apiVersion": "pd.inference.dev/v1alpha1", "kind": "PDDeployment", "metadata": {"name": "pd"}, "spec": spec,
    });
    let text = doc.to_string();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    let path = std::path::Path::new(&dir).join(format!("rules-{:016x}.yaml", h.finish()));
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

fn has(findings: &[Finding], rule: &str, severity: Severity, field: &str, text: &str) -> bool {
    findings.iter().any(|f| f.rule == rule && f.severity == severity && f.field == field && f.message.contains(text))
}

/// Asserts that `good` has no finding of `rule` and `bad` has it as an error with `text`.
fn case(rule: &str, good: PDDeploymentSpec, bad: PDDeploymentSpec, field: &str, text: &str) {
    let g = run(&good);
    assert!(!g.iter().any(|f| f.rule == rule), "{rule}: accepted spec got {g:#?}");
    let b = run(&bad);
    assert!(has(&b, rule, Severity::Error, field, text), "{rule}: expected {field}: {text:?}, got {b:#?}");
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..Default::default() }
}

#[test]
fn decode_dcp_needs_mla_with_sglang_text() {
    let mut good = mla();
    good.decode.parallelism.dcp = 2;
    let mut bad = gqa();
    bad.decode.parallelism.dcp = 2;
    case("decode-dcp-needs-mla", good, bad.clone(), "spec.decode.parallelism.dcp", "PD decode DCP requires an MLA or hybrid-MLA KV pool.");
    let f = run(&bad);
    let msg = &f.iter().find(|f| f.rule == "decode-dcp-needs-mla").unwrap();
    assert!(msg.message.contains("Qwen/Qwen2.5-72B-Instruct") && msg.message.contains("GQA"), "{msg:?}");
    assert!(msg.fix.contains("dcp: 1"));
}

#[test]
fn decode_dcp_with_unknown_model_asks_for_attention() {
    let mut bad = base("my-org/private-model");
    bad.decode.parallelism.dcp = 2;
    let mut good = bad.clone();
    good.model.attention = Some(AttentionKind::Mla);
    case("attention-kind-unknown", good, bad, "spec.model.attention", "attention kind of my-org/private-model is unknown");
}

#[test]
fn decode_dcp_needs_prefill_cp_one() {
    let mut good = mla();
    good.decode.parallelism.dcp = 2;
    let mut bad = good.clone();
    bad.prefill.parallelism.attn_cp = 2;
    bad.prefill.parallelism.cp_strategy = Some(CpStrategy::Zigzag);
    case(
        "decode-dcp-prefill-cp",
        good,
        bad,
        "spec.prefill.parallelism.attnCp",
        // SGLang's MLA CP layout runs attention CP tp / attnDp = 8, and reports that.
        "PD decode DCP currently requires prefill attention CP=1, got 8.",
    );
}

#[test]
fn decode_dcp_refuses_prefill_sharding() {
    let mut good = mla();
    good.decode.parallelism.dcp = 2;
    let mut bad = good.clone();
    bad.prefill.enable_kv_cache_sharding = true;
    case(
        "decode-dcp-prefill-sharding",
        good,
        bad,
        "spec.prefill.enableKvCacheSharding",
        "PD decode DCP does not support a prefill with --enable-kv-cache-sharding.",
    );
}

#[test]
fn decode_attention_cp_must_be_one() {
    let mut bad = mla();
    bad.decode.parallelism.attn_cp = 2;
    // SGLang's MLA CP layout runs attention CP tp / attnDp = 8, and reports that.
    case("decode-cp-one", mla(), bad.clone(), "spec.decode.parallelism.attnCp", "Decode cp size (8) should be equal to 1");
    let mut bad = gqa();
    bad.decode.parallelism.attn_cp = 2;
    case("decode-cp-one", gqa(), bad, "spec.decode.parallelism.attnCp", "Decode cp size (2) should be equal to 1");
}

#[test]
fn decode_pp_one_or_prefill_pp() {
    let mut good = mla();
    good.prefill.parallelism.pp = 2;
    good.decode.parallelism.pp = 2;
    let mut bad = good.clone();
    bad.decode.parallelism.pp = 4;
    bad.decode.gpus_per_node = 16;
    case("decode-pp", good, bad, "spec.decode.parallelism.pp", "Decode pp size (4) should be equal to prefill pp size (2) or 1");
}

#[test]
fn attention_tp_sizes_must_divide() {
    let mut good = mla();
    good.decode.parallelism.tp = 4;
    let mut bad = mla();
    bad.decode.parallelism.tp = 6;
    case(
        "attn-tp-divide",
        good,
        bad,
        "spec.decode.parallelism.tp",
        "attention TP sizes 8 (prefill) and 6 (decode) do not divide each other",
    );
}

#[test]
fn tp_divisible_by_attention_groups() {
    let mut good = mla();
    good.decode.parallelism.attn_dp = 4;
    let mut bad = mla();
    bad.decode.parallelism.attn_dp = 3;
    case(
        "tp-divisible-by-attn-groups",
        good,
        bad,
        "spec.decode.parallelism.tp",
        "tp_size must be divisible by attn_dp_size * attn_cp_size",
    );
}

#[test]
fn tp_divisible_by_dcp_with_sglang_text() {
    let mut good = mla();
    good.decode.parallelism.dcp = 4;
    let mut bad = mla();
    bad.decode.parallelism.dcp = 3;
    case(
        "tp-divisible-by-dcp",
        good,
        bad,
        "spec.decode.parallelism.dcp",
        "tensor_model_parallel_size (8) must be divisible by decode_context_parallel_size (3)",
    );
}

#[test]
fn gpu_arithmetic() {
    let mut good = mla();
    good.prefill.parallelism.tp = 16;
    let mut bad = mla();
    bad.prefill.parallelism.tp = 12;
    bad.decode.parallelism.tp = 12;
    case("gpus-fill-nodes", good, bad, "spec.prefill.gpusPerNode", "tp×pp×dp = 12 GPUs, which does not split evenly over nodes of 8 GPUs");
}

#[test]
fn dp_with_attention_dp_is_refused() {
    let mut good = mla();
    good.decode.parallelism.attn_dp = 2;
    let mut bad = good.clone();
    bad.decode.parallelism.dp = 2;
    bad.decode.gpus_per_node = 16;
    case(
        "dp-with-attn-dp",
        good,
        bad,
        "spec.decode.parallelism.dp",
        "--dp-size 2 with --attn-dp-size 2: data-parallel replicas combined with attention data parallelism are not supported.",
    );
}

#[test]
fn prefill_replica_dp_is_refused() {
    let mut bad = mla();
    bad.prefill.parallelism.dp = 2;
    bad.prefill.gpus_per_node = 16;
    case("prefill-replica-dp", mla(), bad, "spec.prefill.parallelism.dp", "prefill dp 2");
}

#[test]
fn mxfp8_on_non_mla_needs_equal_attention_tp() {
    let mut good = gqa();
    good.kv_transfer.kv_cache_dtype = KvCacheDtype::Mxfp8;
    let mut bad = good.clone();
    bad.decode.parallelism.tp = 4;
    case(
        "mxfp8-equal-attn-tp",
        good,
        bad,
        "spec.decode.parallelism.tp",
        "PD Disaggregation does NOT support different attention TP sizes with MXFP8 KV cache: prefill attn_tp_size=8, decode attn_tp_size=4, state types ['block_scale'].",
    );
}

#[test]
fn minimax_sparse_needs_equal_attention_tp() {
    let mut good = base("x");
    good.model.architecture = Some("MiniMaxM3SparseForCausalLM".into());
    let mut bad = good.clone();
    bad.decode.parallelism.tp = 4;
    case(
        "minimax-equal-attn-tp",
        good,
        bad,
        "spec.decode.parallelism.tp",
        "MiniMax sparse PD requires matching attention TP sizes: prefill=8, decode=4.",
    );
}

#[test]
fn dspark_needs_equal_tp_unless_cp_fan_in() {
    let mut good = base("x");
    good.model.architecture = Some("DeepseekV4ForCausalLMDSpark".into());
    // The layout (and check #6) comes with the algorithm, on both roles (paired flags).
    for role in [&mut good.prefill, &mut good.decode] {
        role.template.extra_args = ["--speculative-algorithm", "DSPARK"].map(String::from).to_vec();
    }
    good.prefill.parallelism.tp = 4;
    good.prefill.parallelism.attn_cp = 2;
    good.prefill.parallelism.cp_strategy = Some(CpStrategy::Interleave);
    good.decode.parallelism.tp = 4;
    let mut bad = good.clone();
    bad.prefill.parallelism.attn_cp = 1;
    bad.prefill.parallelism.cp_strategy = None;
    bad.decode.parallelism.tp = 8;
    case("dspark-equal-tp", good, bad, "spec.decode.parallelism.tp", "DeepSeek-V4.1 DSpark PD requires the same TP size on both servers");
}

#[test]
fn mla_sharding_needs_equal_attention_tp() {
    let mut good = mla();
    good.prefill.enable_kv_cache_sharding = true;
    let mut bad = good.clone();
    bad.decode.parallelism.tp = 4;
    case(
        "mla-sharding-equal-tp",
        good,
        bad,
        "spec.decode.parallelism.tp",
        "MLA KV cache sharding requires equal prefill/decode attn TP sizes, got prefill=8 decode=4",
    );
}

#[test]
fn sharding_is_prefill_only() {
    let mut good = mla();
    good.prefill.enable_kv_cache_sharding = true;
    let mut bad = mla();
    bad.decode.enable_kv_cache_sharding = true;
    case(
        "sharding-prefill-only",
        good,
        bad,
        "spec.decode.enableKvCacheSharding",
        "--enable-kv-cache-sharding is only supported on PD prefill workers",
    );
}

#[test]
fn prefill_cp_needs_a_strategy_and_excludes_dcp() {
    let mut good = mla();
    good.prefill.parallelism.attn_cp = 2;
    good.prefill.parallelism.cp_strategy = Some(CpStrategy::Zigzag);
    let mut bad = good.clone();
    bad.prefill.parallelism.cp_strategy = None;
    case(
        "cp-strategy-required",
        good.clone(),
        bad,
        "spec.prefill.parallelism.cpStrategy",
        "--cp-strategy must be set when --enable-prefill-cp is enabled.",
    );
    // Start-up asks the decode too (it renders --enable-prefill-cp with attnCp > 1).
    let mut bad = mla();
    bad.decode.parallelism.attn_cp = 2;
    let f = run(&bad);
    assert!(has(&f, "cp-strategy-required", Severity::Error, "spec.decode.parallelism.cpStrategy", "--cp-strategy must be set"), "{f:#?}");
    let mut bad = good;
    bad.prefill.parallelism.dcp = 2;
    case("dcp-with-prefill-cp", mla(), bad, "spec.prefill.parallelism.dcp", "--dcp-size > 1 does not support --enable-prefill-cp.");
}

#[test]
fn fake_backend_is_refused_on_prefill() {
    let mut bad = mla();
    bad.kv_transfer.backend = TransferBackend::Fake;
    case(
        "prefill-no-fake-backend",
        mla(),
        bad,
        "spec.kvTransfer.backend",
        "Prefill server does not support 'fake' as the transfer backend",
    );
}

#[test]
fn an_unset_page_size_is_refused_only_when_no_single_value_works() {
    use pd_api::Accelerator;
    // Unset on DeepSeek-V3: trtllm_mla on B200 resolves 64, fa3 on Hopper 1; 64 is kept by
    // both on every profile, so the operator passes it.
    let mut good = mla();
    good.kv_transfer.page_size = None;
    // A B200 prefill forced to 128 by FA4 and a decode forced to 64 by FlashMLA: no value works.
    let mut bad = gqa();
    bad.kv_transfer.page_size = None;
    bad.prefill.accelerator = Some(Accelerator::B200);
    bad.prefill.template.extra_args = vec!["--attention-backend".into(), "fa4".into()];
    bad.decode.template.extra_args = vec!["--attention-backend".into(), "flashmla".into()];
    case(
        "page-size-required",
        good,
        bad.clone(),
        "spec.kvTransfer.pageSize",
        "Page size mismatch: prefill server has page_size=128, but decode server has page_size=64.",
    );
    // Set, the same pair fails the handshake core's check #1 with SGLang's text.
    bad.kv_transfer.page_size = Some(128);
    let f = run(&bad);
    assert!(
        has(
            &f,
            "page-size-mismatch",
            Severity::Error,
            "spec.kvTransfer.pageSize",
            "Page size mismatch: prefill server has page_size=128, but decode server has page_size=64."
        ),
        "{f:#?}"
    );
}

#[test]
fn prefill_complete_needs_attention_tp_one() {
    let mut good = mla();
    good.kv_transfer.decode_allocation_policy = AllocationPolicy::PrefillComplete;
    good.prefill.parallelism.tp = 1;
    good.decode.parallelism.tp = 1;
    let mut bad = mla();
    bad.kv_transfer.decode_allocation_policy = AllocationPolicy::PrefillComplete;
    case("prefill-complete-peer", good.clone(), bad, "spec.prefill.parallelism", "prefill_complete requires peer attention TP1/CP1/PP1");
    // SGLang reads attention TP as tp here (resolution leaves enable_dp_attention false), so
    // tp 8 with attnDp 8 is refused at start-up although its attention TP is 1.
    let mut dp_attention = good.clone();
    dp_attention.prefill.parallelism = serde_json::from_value(serde_json::json!({"tp": 8, "attnDp": 8})).unwrap();
    case(
        "prefill-complete-startup",
        good,
        dp_attention,
        "spec.prefill.parallelism",
        "--disaggregation-decode-allocation-policy prefill_complete does not yet support attention tensor parallelism greater than one",
    );
}

#[test]
fn gpu_dependent_refusals_follow_the_accelerator() {
    use pd_api::Accelerator;
    // MXFP8 KV needs SM100+: an error on Hopper, a warning when the GPU is not named.
    let mut bad = gqa();
    bad.kv_transfer.kv_cache_dtype = KvCacheDtype::Mxfp8;
    let mut good = bad.clone();
    good.prefill.accelerator = Some(Accelerator::B200);
    good.decode.accelerator = Some(Accelerator::B200);
    let mut hopper = bad.clone();
    hopper.prefill.accelerator = Some(Accelerator::H200);
    hopper.decode.accelerator = Some(Accelerator::H200);
    case("accelerator-startup", good, hopper, "spec.kvTransfer.kvCacheDtype", "--kv-cache-dtype mxfp8 requires an SM100+ (Blackwell) GPU");
    let unnamed = run(&bad);
    assert!(has(&unnamed, "accelerator-startup", Severity::Warning, "spec.kvTransfer.kvCacheDtype", "on H100 and H200"), "{unnamed:#?}");
    // DeepSeek-V3 resolves trtllm_mla on B200, which takes only fp8_e4m3, bf16 or auto.
    let mut b200 = mla();
    b200.kv_transfer.kv_cache_dtype = KvCacheDtype::Bfloat16;
    b200.prefill.accelerator = Some(Accelerator::B200);
    b200.decode.accelerator = Some(Accelerator::B200);
    let mut h200 = b200.clone();
    h200.prefill.accelerator = Some(Accelerator::H200);
    h200.decode.accelerator = Some(Accelerator::H200);
    case(
        "accelerator-startup",
        h200,
        b200,
        "spec.kvTransfer.kvCacheDtype",
        "TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto.",
    );
    // An explicit trtllm_mla needs Blackwell.
    let mut hopper = mla();
    hopper.prefill.accelerator = Some(Accelerator::H100);
    hopper.decode.accelerator = Some(Accelerator::H100);
    hopper.decode.template.extra_args = vec!["--attention-backend".into(), "trtllm_mla".into()];
    let mut blackwell = hopper.clone();
    blackwell.prefill.accelerator = Some(Accelerator::B200);
    blackwell.decode.accelerator = Some(Accelerator::B200);
    case(
        "accelerator-startup",
        blackwell,
        hopper,
        "spec.decode.template.extraArgs",
        "TRTLLM MLA backend is only supported on Blackwell GPUs",
    );
}

#[test]
fn gpt_oss_takes_only_its_attention_backends() {
    let mut good = base("openai/gpt-oss-120b");
    good.decode.template.extra_args = vec!["--attention-backend".into(), "triton".into()];
    let mut bad = good.clone();
    bad.decode.template.extra_args = vec!["--attention-backend".into(), "flashinfer".into()];
    case(
        "gpt-oss-attention-backend",
        good.clone(),
        bad,
        "spec.decode.template.extraArgs",
        "GptOssForCausalLM requires one of ['triton', 'trtllm_mha'",
    );
    // A prefill backend alone: SGLang's check runs before the generic default, so the decode
    // phase is `None` and refused (the parity tier's g15-1944, g15-3695).
    let mut bad = good.clone();
    bad.prefill.template.extra_args = vec!["--prefill-attention-backend".into(), "fa4".into()];
    let f = run(&bad);
    assert!(
        has(&f, "gpt-oss-attention-backend", Severity::Error, "spec.prefill.template.extraArgs", "(prefill: fa4, decode: None)"),
        "{f:#?}"
    );
    let mut both = good.clone();
    both.prefill.template.extra_args =
        vec!["--prefill-attention-backend".into(), "fa4".into(), "--decode-attention-backend".into(), "fa3".into()];
    assert!(!run(&both).iter().any(|f| f.rule == "gpt-oss-attention-backend"));
}

#[test]
fn deepseek_cp_layouts_are_judged_on_the_widths_sglang_resolves() {
    // MLA prefill CP: SGLang sets attention CP to tp / attnDp (`context_parallel_attn_dp_size`),
    // so tp 4, attnDp 4, attnCp 2 runs (g15-1659), and so does tp 1, attnCp 2 (g15-4668).
    for (tp, attn_dp) in [(4, 4), (1, 1)] {
        let mut good = mla();
        good.prefill.parallelism.tp = tp;
        good.prefill.parallelism.attn_dp = attn_dp;
        good.prefill.parallelism.attn_cp = 2;
        good.prefill.parallelism.cp_strategy = Some(CpStrategy::Interleave);
        let f = run(&good);
        assert!(!f.iter().any(|f| f.rule == "tp-divisible-by-attn-groups"), "{f:#?}");
    }
    // Without the DeepSeek override (GQA) the spec's widths are SGLang's.
    let mut bad = gqa();
    bad.prefill.parallelism.tp = 4;
    bad.prefill.parallelism.attn_dp = 4;
    bad.prefill.parallelism.attn_cp = 2;
    bad.prefill.parallelism.cp_strategy = Some(CpStrategy::Zigzag);
    let f = run(&bad);
    assert!(has(&f, "tp-divisible-by-attn-groups", Severity::Error, "spec.prefill.parallelism.tp", "tp_size must be divisible"), "{f:#?}");
    // DeepSeek-V4 CP: attention CP over all of TP, no attention DP, one machine.
    let mut v4 = base("x");
    v4.model.architecture = Some("DeepseekV4ForCausalLM".into());
    v4.prefill.parallelism.tp = 1;
    v4.prefill.parallelism.attn_cp = 2;
    v4.prefill.parallelism.cp_strategy = Some(CpStrategy::Interleave);
    let mut bad = v4.clone();
    bad.prefill.parallelism.tp = 8;
    bad.prefill.parallelism.attn_dp = 2;
    case("v4-cp-attn-dp", v4.clone(), bad, "spec.prefill.parallelism.attnDp", "For round-robin split mode, dp attention is not supported.");
    let mut bad = v4.clone();
    bad.prefill.parallelism.tp = 16;
    bad.prefill.gpus_per_node = 8;
    case("cp-single-machine", v4, bad, "spec.prefill.parallelism.tp", "Context parallel only supports single machine (tp_size <= 8).");
}

#[test]
fn start_up_refusals_the_parity_tier_found() {
    // Replica DP inside an instance that spans nodes.
    let mut bad = gqa();
    bad.decode.parallelism.dp = 2;
    bad.decode.gpus_per_node = 8;
    case("multi-node-dp", gqa(), bad, "spec.decode.parallelism.dp", "multi-node data-parallel replicas are not supported");
    // DSA and DeepSeek-V4 take only some KV dtypes.
    let dsa = base("deepseek-ai/DeepSeek-V3.2-Exp");
    let mut bad = dsa.clone();
    bad.kv_transfer.kv_cache_dtype = KvCacheDtype::Fp8E5m2;
    case("dsa-kv-dtype", dsa, bad, "spec.kvTransfer.kvCacheDtype", "DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype");
    let mut v4 = base("x");
    v4.model.architecture = Some("DeepseekV4ForCausalLM".into());
    let mut bad = v4.clone();
    bad.kv_transfer.kv_cache_dtype = KvCacheDtype::Fp8E5m2;
    case("v4-kv-dtype", v4.clone(), bad, "spec.kvTransfer.kvCacheDtype", "fp8_e5m2 is not supported for DeepseekV4ForCausalLM");
    // DeepSeek-V4 prefill CP on CUDA: interleave only.
    let mut good = v4.clone();
    good.prefill.parallelism.attn_cp = 2;
    good.prefill.parallelism.cp_strategy = Some(CpStrategy::Interleave);
    let mut bad = good.clone();
    bad.prefill.parallelism.cp_strategy = Some(CpStrategy::Zigzag);
    case("v4-zigzag-cp", good, bad, "spec.prefill.parallelism.cpStrategy", "DeepSeekV4 zigzag CP requires the NPU backend");
    // KV-cache sharding: GQA shards over prefill CP, MLA over plain TP.
    let mut good = gqa();
    good.prefill.enable_kv_cache_sharding = true;
    good.prefill.parallelism.attn_cp = 2;
    good.prefill.parallelism.cp_strategy = Some(CpStrategy::Zigzag);
    let mut bad = gqa();
    bad.prefill.enable_kv_cache_sharding = true;
    case(
        "sharding-layout",
        good,
        bad,
        "spec.prefill.enableKvCacheSharding",
        "--enable-kv-cache-sharding for GQA models shards across attention-CP ranks",
    );
    // GQA sharding needs the fa3 prefill backend, which Blackwell does not resolve by itself.
    let mut hopper = gqa();
    hopper.prefill.enable_kv_cache_sharding = true;
    hopper.prefill.parallelism.attn_cp = 2;
    hopper.prefill.parallelism.cp_strategy = Some(CpStrategy::Zigzag);
    hopper.prefill.accelerator = Some(pd_api::Accelerator::H200);
    let mut blackwell = hopper.clone();
    blackwell.prefill.accelerator = Some(pd_api::Accelerator::B200);
    case(
        "accelerator-startup",
        hopper,
        blackwell.clone(),
        "spec.prefill.enableKvCacheSharding",
        "--enable-kv-cache-sharding currently requires the fa3 prefill attention backend, or trtllm_mla for plain-TP MLA; got 'trtllm_mha'.",
    );
    blackwell.prefill.template.extra_args = vec!["--attention-backend".into(), "fa3".into()];
    assert!(!run(&blackwell).iter().any(|f| f.rule == "accelerator-startup"));
    let mut good = mla();
    good.prefill.enable_kv_cache_sharding = true;
    let mut bad = good.clone();
    bad.prefill.parallelism.attn_dp = 8;
    case("sharding-layout", good, bad, "spec.prefill.enableKvCacheSharding", "shards across attention-TP and requires plain TP attention");
}

#[test]
fn dsa_refuses_dcp_under_pd_with_sglang_text() {
    let mut good = base("deepseek-ai/DeepSeek-V3.2-Exp");
    good.decode.parallelism.dcp = 1;
    let mut bad = good.clone();
    bad.decode.parallelism.dcp = 2;
    case("dsa-dcp-pd", good, bad, "spec.decode.parallelism.dcp", "DSA DCP does not support PD disaggregation.");
}

#[test]
fn extra_args_are_read_as_sglang_argparse_reads_them() {
    for (args, rule, text) in [
        (vec!["--tp", "4"], "extra-args-managed-flag", "(SGLang's parser reads `--tp` as `--tp-size`)"),
        (vec!["--page-si=32"], "extra-args-managed-flag", "`--page-size` is managed"),
        (vec!["--attn-dp", "2"], "extra-args-managed-flag", "`--attn-dp-size` is managed"),
        (vec!["--nccl-init-addr", "a:1"], "extra-args-managed-flag", "`--nccl-init-addr` is managed"),
        (vec!["--no-such-flag", "1"], "extra-args-argparse", "unrecognized arguments: --no-such-flag 1"),
        (vec!["--page", "8"], "extra-args-argparse", "ambiguous option: --page could match --page-size, --paged-experts-num-resident"),
    ] {
        let mut bad = mla();
        bad.decode.template.extra_args = args.iter().map(|a| a.to_string()).collect();
        case(rule, mla(), bad, "spec.decode.template.extraArgs[0]", text);
    }
}

#[test]
fn the_stand_in_s_own_options_pass_only_for_the_sim_engine() {
    // `engine: sim` runs pd-operator's stand-in, whose fault-injection options SGLang does not have.
    let mut good = mla();
    good.engine.engine_type = pd_api::EngineType::Sim;
    good.prefill.template.extra_args = vec!["--sim-page-size".into(), "32".into()];
    let mut bad = mla();
    bad.prefill.template.extra_args = good.prefill.template.extra_args.clone();
    case("extra-args-argparse", good, bad, "spec.prefill.template.extraArgs[0]", "unrecognized arguments: --sim-page-size 32");
}

#[test]
fn extra_args_may_not_override_managed_flags() {
    let mut good = mla();
    good.decode.template.extra_args = vec!["--mem-fraction-static".into(), "0.85".into()];
    let mut bad = mla();
    bad.decode.template.extra_args = vec!["--page-size=32".into()];
    case("extra-args-managed-flag", good, bad, "spec.decode.template.extraArgs[0]", "`--page-size` is managed by pd-operator");
}

#[test]
fn paired_settings_must_match() {
    let mut good = mla();
    good.prefill.template.extra_args = vec!["--disaggregation-enable-kv-checksum".into()];
    good.decode.template.extra_args = vec!["--disaggregation-enable-kv-checksum".into()];
    let mut bad = mla();
    bad.prefill.template.extra_args = vec!["--disaggregation-enable-kv-checksum".into()];
    case(
        "paired-flag",
        good,
        bad,
        "spec.decode.template.extraArgs",
        "`--disaggregation-enable-kv-checksum` differs between roles (prefill: set, decode: unset)",
    );
    let mut good = gqa();
    good.prefill.template.env = vec![env("SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK", "1")];
    good.decode.template.env = good.prefill.template.env.clone();
    let mut bad = gqa();
    bad.decode.template.env = vec![env("SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK", "1")];
    case("paired-env", good, bad, "spec.decode.template.env", "SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK differs between roles");
}

#[test]
fn decode_only_speculative_decoding_is_allowed_outside_dcp() {
    let eagle: Vec<String> = [
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    ]
    .map(String::from)
    .into();
    let mut good = mla();
    good.decode.template.extra_args = eagle.clone();
    // With decode DCP the relayout needs one KV entry per prefill entry.
    let mut bad = good.clone();
    bad.decode.parallelism.dcp = 2;
    case("paired-flag", good, bad, "spec.decode.template.extraArgs", "`--speculative-algorithm` differs between roles");
    // Prefill-only, or different values, stay refused.
    let mut prefill_only = mla();
    prefill_only.prefill.template.extra_args = eagle;
    assert!(run(&prefill_only).iter().any(|f| f.rule == "paired-flag"));
}

#[test]
fn staging_buffer_is_refused_with_mla() {
    let mut good = gqa();
    good.prefill.template.env = vec![env("SGLANG_DISAGG_STAGING_BUFFER", "true")];
    good.decode.template.env = good.prefill.template.env.clone();
    let mut bad = mla();
    bad.prefill.template.env = good.prefill.template.env.clone();
    bad.decode.template.env = good.prefill.template.env.clone();
    case(
        "staging-buffer-mla",
        good,
        bad,
        "spec.prefill.template.env",
        "SGLANG_DISAGG_STAGING_BUFFER is designed for non-MLA models (e.g. GQA, MHA). MLA models should not set this flag.",
    );
    // Only the mooncake (also as mooncake_tcp) and nixl backends stage; start-up refuses others.
    let mut mori = gqa_staging();
    mori.kv_transfer.backend = TransferBackend::Mori;
    let text = "SGLANG_DISAGG_STAGING_BUFFER requires disaggregation_transfer_backend='mooncake' or 'nixl', got 'mori'.";
    case("staging-buffer-backend", gqa_staging(), mori, "spec.prefill.template.env", text);
}

fn gqa_staging() -> PDDeploymentSpec {
    let mut s = gqa();
    s.prefill.template.env = vec![env("SGLANG_DISAGG_STAGING_BUFFER", "true")];
    s.decode.template.env = s.prefill.template.env.clone();
    s
}

#[test]
fn managed_env_is_refused() {
    let mut bad = mla();
    bad.prefill.template.env = vec![env("SGLANG_HOST_IP", "1.2.3.4")];
    case("env-managed", mla(), bad, "spec.prefill.template.env[0]", "`SGLANG_HOST_IP` is set by pd-operator");
}

#[test]
fn names_must_fit_dns_labels() {
    let spec = mla();
    assert!(!validate("dsv3", &spec, None).iter().any(|f| f.rule.starts_with("name-")));
    let long = "a".repeat(55);
    let f = validate(&long, &spec, None);
    assert!(has(&f, "name-too-long", Severity::Error, "metadata.name", "is 72 characters; a DNS label allows 63"), "{f:#?}");
    // A name whose set-0 pods fit but whose surged set's pods would not (`-s999`) is refused.
    let f = validate(&"a".repeat(50), &spec, None);
    assert!(has(&f, "name-too-long", Severity::Error, "metadata.name", "-s999\" (its KV set suffix included"), "{f:#?}");
    assert!(!validate(&"a".repeat(45), &spec, None).iter().any(|f| f.rule.starts_with("name-")));
    let f = validate("my.deployment", &spec, None);
    assert!(has(&f, "name-dns-label", Severity::Error, "metadata.name", "not a DNS-1035 label"), "{f:#?}");
}

#[test]
fn zero_sizes_are_reported_not_divided_by() {
    let mut bad = mla();
    bad.decode.parallelism.tp = 0;
    bad.prefill.gpus_per_node = 0;
    let f = run(&bad);
    let text = "tp must be at least 1, got 0 (SGLang fails with ZeroDivisionError: integer division or modulo by zero)";
    assert!(has(&f, "size-positive", Severity::Error, "spec.decode.parallelism.tp", text), "{f:#?}");
    assert!(has(&f, "size-positive", Severity::Error, "spec.prefill.gpusPerNode", "gpusPerNode must be at least 1"));
}

#[test]
fn different_tp_on_non_mla_is_only_a_warning() {
    let mut spec = gqa();
    spec.decode.parallelism.tp = 4;
    let f = run(&spec);
    assert!(has(
        &f,
        "non-mla-different-tp",
        Severity::Warning,
        "spec.decode.parallelism.tp",
        "Performance is NOT guaranteed when using different TP sizes for non-MLA models. "
    ));
    assert!(f.iter().all(|f| f.severity == Severity::Warning), "{f:#?}");
    let mut spec = mla();
    spec.decode.parallelism.tp = 4;
    assert!(run(&spec).is_empty());
}

#[test]
fn every_violation_is_reported_not_only_the_first() {
    let mut bad = gqa();
    bad.decode.parallelism.dcp = 2;
    bad.decode.parallelism.attn_cp = 2;
    bad.kv_transfer.decode_allocation_policy = AllocationPolicy::PrefillComplete;
    let rules: Vec<&str> = run(&bad).iter().map(|f| f.rule).collect();
    for r in ["decode-dcp-needs-mla", "decode-cp-one", "prefill-complete-peer", "dcp-with-prefill-cp"] {
        assert!(rules.contains(&r), "{r} missing from {rules:?}");
    }
}

#[test]
fn config_json_turns_an_unknown_model_valid_or_invalid() {
    let mut spec = base("/models/custom");
    spec.decode.parallelism.dcp = 2;
    let dsv3 = HfConfig::parse(r#"{"architectures":["DeepseekV3ForCausalLM"],"kv_lora_rank":512}"#).unwrap();
    assert!(validate("pd", &spec, Some(&dsv3)).is_empty());
    let llama = HfConfig::parse(r#"{"architectures":["LlamaForCausalLM"],"num_attention_heads":64,"num_key_value_heads":8}"#).unwrap();
    let f = validate("pd", &spec, Some(&llama));
    assert!(has(&f, "decode-dcp-needs-mla", Severity::Error, "spec.decode.parallelism.dcp", "LlamaForCausalLM, GQA"), "{f:#?}");
}

#[test]
fn dsa_models_warn_about_auto_dtype() {
    let spec = base("deepseek-ai/DeepSeek-V3.2-Exp");
    assert!(has(&run(&spec), "dsa-dtype-auto", Severity::Warning, "spec.kvTransfer.kvCacheDtype", "fp8_e4m3 on SM100+"));
    let mut spec = spec;
    spec.kv_transfer.kv_cache_dtype = KvCacheDtype::Fp8E4m3;
    assert!(run(&spec).is_empty());
}

#[test]
fn pipeline_parallel_speculative_decoding_runs_only_on_the_prefill() {
    let eagle: Vec<String> =
        ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"].map(String::from).to_vec();
    let mut good = mla();
    good.prefill.parallelism.pp = 2;
    good.prefill.gpus_per_node = 8;
    good.prefill.template.extra_args.clone_from(&eagle);
    good.decode.template.extra_args.clone_from(&eagle);
    let mut bad = good.clone();
    bad.decode.parallelism.pp = 2;
    bad.decode.gpus_per_node = 8;
    let only_prefill = "PP + speculative decoding (MTP) is only supported on prefill nodes (disaggregation-mode=prefill)";
    case("pp-speculative", good, bad, "spec.decode.parallelism.pp", only_prefill);
    let mut eagle3 = mla();
    eagle3.prefill.parallelism.pp = 2;
    eagle3.prefill.template.extra_args = ["--speculative-algorithm", "EAGLE3"].map(String::from).to_vec();
    let f = run(&eagle3);
    let text = "Pipeline parallelism currently only supports EAGLE (non-multi-layer) speculative decoding";
    assert!(has(&f, "pp-speculative", Severity::Error, "spec.prefill.parallelism.pp", text), "{f:#?}");
}

#[test]
fn joint_refusals_carry_the_check_sglang_runs_first() {
    use pd_api::Accelerator::{B200, H100};
    // TRTLLM MLA on Hopper is refused before an mxfp8 KV cache is.
    let mut good = mla();
    good.prefill.template.extra_args = vec!["--attention-backend".into(), "trtllm_mla".into()];
    good.prefill.accelerator = Some(B200);
    let mut bad = good.clone();
    bad.prefill.accelerator = Some(H100);
    bad.kv_transfer.kv_cache_dtype = KvCacheDtype::Mxfp8;
    case("accelerator-startup", good, bad, "spec.prefill.template.extraArgs", "TRTLLM MLA backend is only supported on Blackwell GPUs");
    // A GQA cache shards over prefill CP (the fa3 backend, Hopper); what else sharding refuses.
    let mut good = gqa();
    good.prefill.enable_kv_cache_sharding = true;
    good.prefill.parallelism.attn_cp = 2;
    good.prefill.parallelism.cp_strategy = Some(CpStrategy::Zigzag);
    good.prefill.accelerator = Some(H100);
    let mut bad = good.clone();
    for role in [&mut bad.prefill, &mut bad.decode] {
        role.template.env = vec![env("SGLANG_DISAGG_STAGING_BUFFER", "1")];
    }
    case("sharding-staging", good.clone(), bad, "spec.prefill.template.env", "incompatible with SGLANG_DISAGG_STAGING_BUFFER");
    let mut bad = good.clone();
    for role in [&mut bad.prefill, &mut bad.decode] {
        role.template.extra_args = ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1"].map(String::from).to_vec();
    }
    case("sharding-speculative", good.clone(), bad, "spec.prefill.template.extraArgs", "only for GLM DSA single-layer NextN MTP");
    let mut bad = good.clone();
    bad.kv_transfer.backend = TransferBackend::Mori;
    case(
        "sharding-backend",
        good.clone(),
        bad,
        "spec.kvTransfer.backend",
        "transfer backends: both route sends through CommonKVSender._prepare_send_indices and pair destinations by fancy index. Got --disaggregation-transfer-backend 'mori'.",
    );
    let mut bad = good.clone();
    bad.prefill.template.extra_args = vec!["--attention-backend".into(), "trtllm_mla".into()];
    bad.prefill.accelerator = Some(B200);
    case(
        "accelerator-startup",
        good.clone(),
        bad,
        "spec.prefill.enableKvCacheSharding",
        "KV sharding with trtllm_mla requires an MLA model.",
    );
    // DeepSeek-V4 prefills on its own `dsv4` backend, which sharding does not take.
    let mut v4 = base("x");
    v4.model.architecture = Some("DeepseekV4ForCausalLM".into());
    let mut bad = v4.clone();
    bad.prefill.enable_kv_cache_sharding = true;
    case("accelerator-startup", v4.clone(), bad, "spec.prefill.enableKvCacheSharding", "or trtllm_mla for plain-TP MLA; got 'dsv4'.");
    // DeepSeek-V4 CP names its strategies before the generic `--cp-strategy` check.
    let mut bad = v4;
    bad.prefill.parallelism.attn_cp = 2;
    case(
        "cp-strategy-required",
        gqa(),
        bad,
        "spec.prefill.parallelism.cpStrategy",
        "DeepSeekV4 only supports interleave/zigzag CP strategy, got None",
    );
    // A CP width that does not divide tp is named alone.
    let mut bad = gqa();
    bad.prefill.parallelism.tp = 2;
    bad.prefill.parallelism.attn_cp = 4;
    bad.prefill.parallelism.cp_strategy = Some(CpStrategy::Zigzag);
    case("tp-divisible-by-attn-groups", gqa(), bad, "spec.prefill.parallelism.tp", "tp_size must be divisible by attn_cp_size: tp 2");
}

#[test]
fn dsa_shards_and_splits_context_only_as_sglang_allows() {
    use pd_api::Accelerator::{B200, H100};
    let dsa = base("deepseek-ai/DeepSeek-V3.2-Exp");
    // DSA runs context parallelism on the prefill only.
    let mut good = dsa.clone();
    good.prefill.parallelism.attn_cp = 2;
    good.prefill.parallelism.cp_strategy = Some(CpStrategy::Interleave);
    let mut bad = dsa.clone();
    bad.decode.parallelism.attn_cp = 2;
    bad.decode.parallelism.cp_strategy = Some(CpStrategy::Interleave);
    case("dsa-decode-cp", good.clone(), bad, "spec.decode.parallelism.attnCp", "CP is only supported for prefill when PD disaggregation");
    let mut bad = good.clone();
    bad.prefill.parallelism.cp_strategy = Some(CpStrategy::Zigzag);
    case(
        "v32-zigzag-cp",
        good.clone(),
        bad,
        "spec.prefill.parallelism.cpStrategy",
        "DeepSeek V3.2 prefill CP does not support --cp-strategy zigzag",
    );
    // MiMo V2 takes the other strategy only.
    let mut mimo = gqa();
    mimo.model.architecture = Some("MiMoV2FlashForCausalLM".into());
    mimo.prefill.parallelism.attn_cp = 2;
    mimo.prefill.parallelism.cp_strategy = Some(CpStrategy::Zigzag);
    let mut bad = mimo.clone();
    bad.prefill.parallelism.cp_strategy = Some(CpStrategy::Interleave);
    case("mimo-v2-cp-strategy", mimo, bad, "spec.prefill.parallelism.cpStrategy", "MiMo V2 prefill CP only supports --cp-strategy zigzag.");
    // DSA sharding: its own backend, interleave CP, TRTLLM on an fp8_e4m3 cache (auto on B200).
    let mut good = good;
    good.prefill.enable_kv_cache_sharding = true;
    good.prefill.accelerator = Some(B200);
    let at = "spec.prefill.enableKvCacheSharding";
    let mut bad = dsa.clone();
    bad.prefill.enable_kv_cache_sharding = true;
    bad.prefill.accelerator = Some(B200);
    case("accelerator-startup", good.clone(), bad.clone(), at, "DSA KV sharding requires CUDA interleave prefill CP > 1 and PP1.");
    bad.prefill.template.extra_args = vec!["--attention-backend".into(), "fa3".into()];
    case("accelerator-startup", good.clone(), bad, at, "DSA KV sharding requires the dsa attention backend.");
    let mut bad = good.clone();
    bad.prefill.accelerator = Some(H100);
    case("accelerator-startup", good.clone(), bad, at, "DSA KV sharding requires TRTLLM prefill/decode with fp8_e4m3 KV and page size 64.");
    let mut bad = good.clone();
    bad.kv_transfer.backend = TransferBackend::Nixl;
    case("accelerator-startup", good, bad, at, "DSA KV sharding requires Mooncake, uncompressed index_kpool=1");
}

fn on(release: &str, mut spec: PDDeploymentSpec) -> PDDeploymentSpec {
    spec.engine.version = Some(release.into());
    spec
}

#[test]
fn settings_a_release_has_no_flag_for_are_refused_there() {
    let mut bad = on("0.5.21", mla());
    bad.kv_transfer.decode_allocation_policy = AllocationPolicy::PrefillComplete;
    case(
        "release-option",
        on("0.5.21", mla()),
        bad.clone(),
        "spec.kvTransfer.decodeAllocationPolicy",
        "SGLang 0.5.21 has no --disaggregation-decode-allocation-policy",
    );
    assert!(!run(&on("0.5.22", bad.clone())).iter().any(|f| f.rule == "release-option"), "0.5.22 has the flag");
    let mut sharded = on("0.5.21", mla());
    sharded.prefill.enable_kv_cache_sharding = true;
    case(
        "release-flag",
        on("0.5.21", mla()),
        sharded,
        "spec.prefill.enableKvCacheSharding",
        "unrecognized arguments: --enable-kv-cache-sharding",
    );
}

#[test]
fn a_rule_holds_only_from_the_release_that_raises_it() {
    let mut cp = mla();
    cp.prefill.parallelism.attn_cp = 2;
    cp.prefill.parallelism.cp_strategy = Some(CpStrategy::Interleave);
    cp.prefill.parallelism.dcp = 2;
    let rules = |r: &str| run(&on(r, cp.clone())).iter().map(|f| f.rule).collect::<Vec<_>>();
    assert!(rules("0.5.22").contains(&"dcp-with-prefill-cp"), "{:?}", rules("0.5.22"));
    assert!(!rules("0.5.21").contains(&"dcp-with-prefill-cp"), "0.5.21 starts it: {:?}", rules("0.5.21"));
}

#[test]
fn the_engine_release_is_named_or_warned_about() {
    case("engine-version", on("0.5.23", mla()), on("banana", mla()), "spec.engine.version", "is not an SGLang release number");
    let mut latest = mla();
    latest.engine.image = Some("lmsysorg/sglang:latest".into());
    let f = run(&latest);
    assert!(has(&f, "engine-release-assumed", Severity::Warning, "spec.engine.version", "judged with SGLang 0.5.23's rules"), "{f:#?}");
    assert!(pd_core::validate::is_valid(&f), "a warning only: {f:#?}");
}

#[test]
fn extra_args_are_matched_against_the_release_s_option_table() {
    // `--cuda-graph-tc-compiler` is an option of 0.5.21's parser and not of 0.5.23's.
    let mut spec = mla();
    spec.decode.template.extra_args = vec!["--cuda-graph-tc-compiler".into(), "eager".into()];
    let f = run(&on("0.5.23", spec.clone()));
    assert!(has(&f, "extra-args-argparse", Severity::Error, "spec.decode.template.extraArgs[0]", "unrecognized arguments"), "{f:#?}");
    assert!(f.iter().any(|x| x.fix.contains("SGLang 0.5.23's")), "{f:#?}");
    assert!(!run(&on("0.5.21", spec)).iter().any(|x| x.rule == "extra-args-argparse"));
}

/// The rule only the cluster decides, applied by the webhook and the controller alike.
#[test]
fn gang_workload_needs_a_cluster_that_serves_gang_scheduling() {
    use pd_api::GangMode;
    use pd_core::validate::gang_api;
    let mut spec = mla();
    assert_eq!(gang_api(&spec, false), None, "gang: auto falls back to no gang");
    spec.placement.gang = GangMode::Workload;
    assert_eq!(gang_api(&spec, true), None);
    let f = gang_api(&spec, false).expect("refused where the API is not served");
    assert_eq!((f.rule, f.severity, f.field.as_str()), ("gang-api", Severity::Error, "spec.placement.gang"));
    assert_eq!(
        f.to_string(),
        "spec.placement.gang: workload, but this cluster does not serve Kubernetes' gang scheduling API (PodGroup, scheduling.k8s.io/v1beta1) (fix: enable the GenericWorkload feature gate and that API version, or use gang: auto)"
    );
    spec.placement.gang = GangMode::None;
    assert_eq!(gang_api(&spec, false), None);
    assert!(run(&spec).iter().all(|f| f.rule != "gang-api"), "not a rule of the offline validate");
}

#[test]
fn the_prefill_sender_refuses_a_dcp_it_cannot_relay_out() {
    let mut good = mla();
    good.decode.parallelism.dcp = 4;
    let mut bad = good.clone();
    bad.prefill.parallelism.dcp = 2;
    case("prefill-dcp-relayout", good.clone(), bad, "spec.prefill.parallelism.dcp", "Unsupported PD DCP topology: 2 -> 4");
    let mut same = good;
    same.prefill.parallelism.dcp = 4;
    assert!(!run(&same).iter().any(|f| f.rule == "prefill-dcp-relayout"), "equal DCP sizes connect matching ranks");
}

/// Each case: extraArgs SGLang 0.5.23's parser takes, extraArgs it refuses, the field and its text.
#[test]
fn extra_args_values_are_judged_as_sglang_argparse_judges_them() {
    for (good, bad, index, text) in [
        (
            &["--chunked-prefill-size", "8192"][..],
            &["--chunked-prefill-size", "8k"][..],
            1,
            "argument --chunked-prefill-size: invalid int value: '8k'",
        ),
        (&["--chunked-prefill-size=-1"], &["--chunked-prefill-size="], 0, "argument --chunked-prefill-size: invalid int value: ''"),
        (
            &["--mem-fraction-static", " 0.85 "],
            &["--mem-fraction-static", "0,85"],
            1,
            "argument --mem-fraction-static: invalid float value: '0,85'",
        ),
        (
            &["--context-length", "32k"],
            &["--context-length", "32K"],
            1,
            "argument --context-length: Invalid integer value: '32K'. Use a plain integer",
        ),
        (
            &["--sampling-backend", "pytorch"],
            &["--sampling-backend", "torch"],
            1,
            "argument --sampling-backend: invalid choice: 'torch' (choose from",
        ),
        (&["--fuseep-mode", "02"], &["--fuseep-mode", "3"], 1, "argument --fuseep-mode: invalid choice: '3' (choose from 1, 2)"),
        (
            &["--moe-data-parallel-size=1"][..],
            &["--moe-dp=two"][..],
            0,
            "argument --moe-dp-size/--moe-data-parallel-size: invalid int value: 'two'",
        ),
        (
            &["--cuda-graph-bs-decode", "1", "2"],
            &["--cuda-graph-bs-decode", "1", "x"],
            2,
            "argument --cuda-graph-bs-decode: invalid int value: 'x'",
        ),
        (
            &["--preferred-sampling-params", "{\"temperature\": 0}"],
            &["--preferred-sampling-params", "{temperature: 0}"],
            1,
            "argument --preferred-sampling-params: invalid loads value: '{temperature: 0}'",
        ),
        (
            &["--cuda-graph-backend-decode", "full"],
            &["--cuda-graph-backend-decode", "tc_piecewise"],
            1,
            "argument --cuda-graph-backend-decode: tc_piecewise was removed",
        ),
        (
            &["--cuda-graph-config", "{\"decode\": {\"max_bs\": 8}}"],
            &["--cuda-graph-config", "[]"],
            1,
            "--cuda-graph-config must be a JSON object, got list",
        ),
        (
            &["--lora-paths", "{\"lora_name\": \"a\", \"lora_path\": \"/a\"}"],
            &["--lora-paths", "{\"name\": \"a\"}"],
            1,
            "does not contain 'lora_name' and 'lora_path' keys.",
        ),
        (&["--enable-metrics"][..], &["--help"][..], 0, "`--help` prints the usage and exits"),
        (
            &["--log-level", "Warning"][..],
            &["--log-level", "verbose"][..],
            1,
            "AttributeError: module 'logging' has no attribute 'VERBOSE'",
        ),
    ] {
        let mut ok = mla();
        ok.decode.template.extra_args = good.iter().map(|a| a.to_string()).collect();
        let mut refused = mla();
        refused.decode.template.extra_args = bad.iter().map(|a| a.to_string()).collect();
        case("extra-args-argparse", ok, refused, &format!("spec.decode.template.extraArgs[{index}]"), text);
    }
}

#[test]
fn extra_args_value_counts_are_argparse_s() {
    for (good, bad, index, text) in [
        // a switch given a value, with `=` or as the next argument
        (
            &["--disable-radix-cache"][..],
            &["--disable-radix-cache=true"][..],
            0,
            "argument --disable-radix-cache: ignored explicit argument 'true'",
        ),
        (&["--disable-radix-cache", "--enable-metrics"], &["--disable-radix-cache", "true"], 1, "unrecognized arguments: true"),
        (
            &["--no-dcp-replicate-q-proj"],
            &["--dcp-replicate-q-proj=1"],
            0,
            "argument --dcp-replicate-q-proj/--no-dcp-replicate-q-proj: ignored explicit argument '1'",
        ),
        // a value missing: at the end, or followed by another option (`-1` is a value, `-x` is not)
        (&["--max-running-requests", "-1"], &["--max-running-requests"], 0, "argument --max-running-requests: expected one argument"),
        (
            &["--max-running-requests", "8", "--enable-metrics"],
            &["--max-running-requests", "--enable-metrics"],
            0,
            "argument --max-running-requests: expected one argument",
        ),
        (
            &["--cuda-graph-bs-prefill", "8"],
            &["--cuda-graph-bs-prefill"],
            0,
            "argument --cuda-graph-bs-prefill: expected at least one argument",
        ),
        // one value too many, or a flag and its value in one entry
        (&["--max-running-requests", "8"], &["--max-running-requests", "8", "16"], 2, "unrecognized arguments: 16"),
        (&["--max-running-requests=8"], &["--max-running-requests 8"], 0, "unrecognized arguments: --max-running-requests 8"),
    ] {
        let mut ok = gqa();
        ok.prefill.template.extra_args = good.iter().map(|a| a.to_string()).collect();
        let mut refused = gqa();
        refused.prefill.template.extra_args = bad.iter().map(|a| a.to_string()).collect();
        case("extra-args-argparse", ok, refused, &format!("spec.prefill.template.extraArgs[{index}]"), text);
    }
    // `--model-checksum` takes a value or none (nargs='?').
    let mut optional = gqa();
    optional.prefill.template.extra_args = vec!["--model-checksum".into(), "--enable-metrics".into()];
    assert!(!run(&optional).iter().any(|f| f.rule == "extra-args-argparse"), "{:#?}", run(&optional));
}

#[test]
fn extra_args_values_are_judged_by_the_release_s_parser() {
    // 0.5.21 lists `tc_piecewise` among the CUDA-graph backends; 0.5.22 on refuse it in a converter.
    let mut spec = mla();
    spec.decode.template.extra_args = vec!["--cuda-graph-backend-decode".into(), "tc_piecewise".into()];
    case(
        "extra-args-argparse",
        on("0.5.21", spec.clone()),
        on("0.5.23", spec),
        "spec.decode.template.extraArgs[1]",
        "tc_piecewise was removed; select breakable, full, or disabled",
    );
    // `--lora-backend triton_v2` is a choice from 0.5.23 on.
    let mut lora = mla();
    lora.decode.template.extra_args = vec!["--lora-backend=triton_v2".into()];
    case(
        "extra-args-argparse",
        on("0.5.23", lora.clone()),
        on("0.5.21", lora),
        "spec.decode.template.extraArgs[0]",
        "argument --lora-backend: invalid choice: 'triton_v2' (choose from triton, csgmv, ascend, torch_native)",
    );
}

#[test]
fn an_extra_arg_refusal_says_what_to_write() {
    let mut bad = mla();
    bad.decode.template.extra_args =
        vec!["--kv-cache-dtype-x".into(), "--schedule-policy".into(), "fifo".into(), "--disable-radix-cache=1".into()];
    let f = run(&bad);
    let fix = |i: usize| f.iter().find(|x| x.field == format!("spec.decode.template.extraArgs[{i}]")).map(|x| x.fix.clone());
    assert!(fix(0).is_some_and(|x| x.contains("is not an option of SGLang 0.5.23")), "{f:#?}");
    assert!(fix(2).is_some_and(|x| x.contains("give `--schedule-policy` one of lpm, random, fcfs")), "{f:#?}");
    assert!(fix(3).is_some_and(|x| x.contains("write `--disable-radix-cache` alone")), "{f:#?}");
}

#[test]
fn a_prefill_s_chunked_prefill_size_is_a_multiple_of_its_page_size() {
    let mut good = gqa();
    good.prefill.template.extra_args = vec!["--chunked-prefill-size".into(), "8192".into()];
    // A PD decode does not chunk prefills: SGLang skips the check there.
    good.decode.template.extra_args = vec!["--chunked-prefill-size".into(), "1000".into()];
    let mut bad = gqa();
    bad.prefill.template.extra_args = vec!["--chunked-prefill-size=1000".into()];
    case(
        "chunked-prefill-page",
        good,
        bad.clone(),
        "spec.prefill.template.extraArgs[0]",
        "chunked_prefill_size must be divisible by page_size (--chunked-prefill-size 1000, page size 64)",
    );
    bad.kv_transfer.page_size = Some(8);
    assert!(!run(&bad).iter().any(|f| f.rule == "chunked-prefill-page"), "1000 is a multiple of 8");
}

fn with_args(mut spec: PDDeploymentSpec, prefill: &[&str], decode: &[&str]) -> PDDeploymentSpec {
    spec.prefill.template.extra_args = prefill.iter().map(|a| a.to_string()).collect();
    spec.decode.template.extra_args = decode.iter().map(|a| a.to_string()).collect();
    spec
}

/// Issue #55: the options of SGLang's PD recipes, judged with each release's start-up text.
#[test]
fn two_batch_overlap_needs_an_ep_a2a_backend_or_attention_dp() {
    let tbo = ["--enable-two-batch-overlap"];
    let at = "spec.prefill.template.extraArgs[0]";
    for (release, text) in [
        ("0.5.21", "--enable-dp-attention is required (DeepSeek-V4 non-EP DP TBO path)."),
        ("0.5.22", "attention DP (--attn-dp-size) is required (DeepSeek-V4 non-EP DP TBO path)."),
        ("0.5.23", "attention DP (--attn-dp-size) is required (DeepSeek-V4 non-EP DP TBO path)."),
    ] {
        case("two-batch-overlap-needs-attn-dp", on(release, mla()), on(release, with_args(mla(), &tbo, &[])), at, text);
    }
}

#[test]
fn eagle_family_needs_its_three_numbers_together() {
    let full = [
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    ];
    let steps_only = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"];
    case(
        "speculative-params",
        with_args(mla(), &full, &full),
        with_args(mla(), &steps_only, &steps_only),
        "spec.decode.template.extraArgs[2]",
        "TypeError: '>' not supported between instances of 'NoneType' and 'int'",
    );
    let topk_only = ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1"];
    case(
        "speculative-params",
        mla(),
        with_args(mla(), &topk_only, &topk_only),
        "spec.prefill.template.extraArgs[2]",
        "AssertionError (bare)",
    );
}

#[test]
fn dp_lm_head_needs_attention_dp_beside_replica_dp() {
    let mut replicas = gqa();
    replicas.prefill.parallelism.tp = 4;
    replicas.decode.parallelism.tp = 4;
    replicas.decode.parallelism.dp = 2;
    let at = "spec.decode.template.extraArgs[0]";
    for (release, text) in [
        ("0.5.21", "Please enable dp attention when setting enable_dp_lm_head."),
        ("0.5.23", "--enable-dp-lm-head requires attention DP (--attn-dp-size)."),
    ] {
        let bad = on(release, with_args(replicas.clone(), &[], &["--enable-dp-lm-head"]));
        case("dp-lm-head-needs-attn-dp", on(release, replicas.clone()), bad, at, text);
    }
}

#[test]
fn moe_a2a_backends_need_their_attention_dp() {
    let at = "spec.prefill.template.extraArgs[0]";
    let flashinfer = ["--moe-a2a-backend", "flashinfer"];
    case("a2a-attn-dp", mla(), with_args(mla(), &flashinfer, &[]), at, "Flashinfer MoE A2A requires --attn-dp-size equal to --tp-size");
    let bad = on("0.5.21", with_args(mla(), &flashinfer, &[]));
    case(
        "a2a-attn-dp",
        on("0.5.21", mla()),
        bad,
        at,
        "Flashinfer MoE A2A is only supported with dp_size == tp_size and --enable-dp-attention",
    );
    let pplx = ["--moe-a2a-backend", "pplx"];
    case("a2a-attn-dp", mla(), with_args(mla(), &pplx, &[]), at, "moe_a2a_backend='pplx' requires attention DP with at least 2 groups");
    let dispatch = ["--flashinfer-a2a-dispatch-type", "bf16"];
    case(
        "flashinfer-a2a-dispatch-type",
        mla(),
        with_args(mla(), &dispatch, &[]),
        at,
        "--flashinfer-a2a-dispatch-type requires --moe-a2a-backend flashinfer.",
    );
}
