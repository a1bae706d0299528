//! The static rules: everything SGLang 0.5.23 would reject (at start-up or at the PD handshake)
//! that the `PDDeployment` spec alone decides. Pure functions; every violation is returned, not
//! only the first, each with its field path, the engine's own words and a fix.

use crate::findings::{Finding, Severity};
use crate::handshake::core::{Check, HandshakeFailure, PERF_WARNING, PoolKind};
use crate::model::{HfConfig, ModelFacts};
use crate::release::{Release, release_of};
use pd_api::{Accelerator, AllocationPolicy, EngineType, KvCacheDtype, PDDeploymentSpec, Parallelism, RoleSpec, TransferBackend};

/// Exact SGLang 0.5.23 texts that users will also find in engine logs.
pub mod texts {
    pub const MXFP8_BLACKWELL: &str =
        "--kv-cache-dtype mxfp8 requires an SM100+ (Blackwell) GPU for the block-scaled operands used by the FA4 MXFP8 attention path.";
    pub const TRTLLM_MLA_BLACKWELL: &str =
        "TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x). Please use a different backend.";
    pub const TRTLLM_MLA_DTYPE: &str = "TensorRT-LLM MLA backend only supports kv-cache-dtype of fp8_e4m3, bf16, or auto.";
    pub const GPT_OSS_BACKENDS: &str = "GptOssForCausalLM requires one of ['triton', 'trtllm_mha', 'fa3', 'fa4', 'ascend', 'intel_amx', 'intel_xpu', 'aiter'] attention backend, but got the following backends";
    pub const MULTI_NODE_DP: &str = "multi-node data-parallel replicas are not supported; use attention DP (--attn-dp-size) across nodes";
    /// 0.5.21's wording of the same assert, which spares attention DP.
    pub const MULTI_NODE_DP_0_5_21: &str = "multi-node data parallel is not supported unless dp attention!";
    pub const DSA_DTYPE: &str = "DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype";
    pub const V4_ZIGZAG: &str = "DeepSeekV4 zigzag CP requires the NPU backend; CUDA/HIP backends reindex with interleave order.";
    pub const SHARDING_GQA_CP: &str = "--enable-kv-cache-sharding for GQA models shards across attention-CP ranks and requires --enable-prefill-cp with attn_cp_size > 1.";
    pub const SHARDING_MLA_ATTN_DP: &str = "--enable-kv-cache-sharding for MLA models without prefill CP shards across attention-TP and requires plain TP attention; set --attn-dp-size=1.";
    pub const SHARDING_WITH_DCP: &str = "--enable-kv-cache-sharding and decode context parallelism (--dcp-size) are mutually exclusive users of the widened allocator index space.";
    pub const SHARDING_MLA_TP: &str =
        "--enable-kv-cache-sharding for MLA models without prefill CP shards across attention-TP ranks and needs tp_size > 1.";
    pub const SHARDING_BACKEND: &str =
        "--enable-kv-cache-sharding currently requires the fa3 prefill attention backend, or trtllm_mla for plain-TP MLA; got";
    pub const V4_CP_ATTN_DP: &str = "For round-robin split mode, dp attention is not supported.";
    pub const CP_SINGLE_MACHINE: &str =
        "Context parallel only supports single machine (tp_size <= 8). Cross-machine CP has precision issues.";
    pub const SHARDING_PAGE_SIZE: &str = "--enable-kv-cache-sharding requires a real page size (--page-size 64 recommended): the physical page is the P/D transfer descriptor and gather-copy unit; page_size=1 degenerates both into per-token operations.";
    pub const DSA_DCP_PD: &str = "DSA DCP does not support PD disaggregation.";
    pub const DCP_NO_PREFILL_CP: &str = "--dcp-size > 1 does not support --enable-prefill-cp.";
    pub const CP_STRATEGY_REQUIRED: &str = "--cp-strategy must be set when --enable-prefill-cp is enabled.";
    pub const PREFILL_NO_FAKE: &str = "Prefill server does not support 'fake' as the transfer backend";
    pub const SHARDING_PREFILL_ONLY: &str = "--enable-kv-cache-sharding is only supported on PD prefill workers: a rank's pool holds only its stripe of every cached page, which is incompatible with local decode.";
    pub const STAGING_NOT_MLA: &str =
        "SGLANG_DISAGG_STAGING_BUFFER is designed for non-MLA models (e.g. GQA, MHA). MLA models should not set this flag.";
    pub const DSV4_MEGA: &str = "--dsv4-attn-backend flashmla_mega requires DeepSeek-V4.1 on SM100/SM103.";
    pub const DSV4_TRTLLM_SM100: &str = "--dsv4-attn-backend trtllm requires an SM100/SM103 (Blackwell) GPU.";
    pub const DSV4_TRTLLM_CP: &str =
        "--dsv4-attn-backend trtllm does not support context parallelism (prefill CP, attention CP, or decode CP).";
    pub const DSV4_TRTLLM_PD: &str = "--dsv4-attn-backend trtllm does not support PD disaggregation yet (untested; see https://github.com/sgl-project/sglang/issues/37838).";
    pub const PP_DSPARK_PREFILL: &str = "Pipeline parallel DSPARK requires disaggregation-mode=prefill";
    pub const PP_SPEC_DSPARK: &str = "SGLANG_ENABLE_PP_SPEC does not support DSPARK PD prefill";
    pub const PP_SPEC_EAGLE_ONLY: &str = "Pipeline parallelism currently only supports EAGLE (non-multi-layer) speculative decoding";
    pub const PP_SPEC_PD: &str = "SGLANG_ENABLE_PP_SPEC is not compatible with --disaggregation-mode";
    pub const PP_SPEC_PREFILL_ONLY: &str =
        "PP + speculative decoding (MTP) is only supported on prefill nodes (disaggregation-mode=prefill)";
    /// What start-up raises for `--tp-size 0` (`initialize_model_parallel`'s `world_size // tp`).
    pub const ZERO_TP: &str = " (SGLang fails with ZeroDivisionError: integer division or modulo by zero)";
    pub const V32_ZIGZAG: &str = "DeepSeek V3.2 prefill CP does not support --cp-strategy zigzag; use interleave.";
    pub const MIMO_V2_ZIGZAG: &str = "MiMo V2 prefill CP only supports --cp-strategy zigzag.";
    pub const TP_ATTN_GROUPS: &str = "tp_size must be divisible by attn_dp_size * attn_cp_size";
    pub const TP_ATTN_CP: &str = "tp_size must be divisible by attn_cp_size";
    pub const DSA_DECODE_CP: &str = "CP is only supported for prefill when PD disaggregation, please remove --enable-prefill-cp.";
    /// `validate_deepseek_v4_cp`, raised before the generic `--cp-strategy` check.
    pub const V4_CP_STRATEGY_NONE: &str = "DeepSeekV4 only supports interleave/zigzag CP strategy, got None";
    pub const SHARDING_STAGING: &str =
        "--enable-kv-cache-sharding is incompatible with SGLANG_DISAGG_STAGING_BUFFER (the staging path assumes contiguous send slices).";
    pub const SHARDING_SPECULATIVE: &str =
        "KV sharding supports speculative decoding only for GLM DSA single-layer NextN MTP with EAGLE and topk=1.";
    pub const SHARDING_TRANSFER: &str = "--enable-kv-cache-sharding currently only supports the mooncake and nixl transfer backends: both route sends through CommonKVSender._prepare_send_indices and pair destinations by fancy index. Got --disaggregation-transfer-backend";
    pub const SHARDING_TRTLLM_MLA_MODEL: &str = "KV sharding with trtllm_mla requires an MLA model.";
    pub const SHARDING_TRTLLM_MLA_CP: &str = "KV sharding with trtllm_mla only supports plain-TP MLA (attn_cp_size must be 1).";
    pub const DSA_SHARDING_BACKEND: &str = "DSA KV sharding requires the dsa attention backend.";
    pub const DSA_SHARDING_CP: &str = "DSA KV sharding requires CUDA interleave prefill CP > 1 and PP1.";
    pub const DSA_SHARDING_TRTLLM: &str = "DSA KV sharding requires TRTLLM prefill/decode with fp8_e4m3 KV and page size 64.";
    pub const DSA_SHARDING_MOONCAKE: &str =
        "DSA KV sharding requires Mooncake, uncompressed index_kpool=1 and no DSA cache layer splitting.";
    pub const CHUNKED_PREFILL_PAGE: &str = "chunked_prefill_size must be divisible by page_size";
    pub const PREFILL_DCP_WARNING: &str = "DCP on a PD prefill server is supported when prefill and decode use the same DCP layout, but it usually adds communication overhead without improving prefill performance.";
    // The options of SGLang's PD recipes (`validate::options`); each text as the release's
    // `srt/arg_groups/*.py` raises it, the older wording where a release words it otherwise.
    /// `validation_hook.check_two_batch_overlap` (0.5.22, 0.5.23).
    pub const TBO_NEEDS_ATTN_DP: &str = "When enabling two batch overlap without an EP a2a backend (moe_a2a_backend='none'), attention DP (--attn-dp-size) is required (DeepSeek-V4 non-EP DP TBO path).";
    pub const TBO_NEEDS_ATTN_DP_0_5_21: &str = "When enabling two batch overlap without an EP a2a backend (moe_a2a_backend='none'), --enable-dp-attention is required (DeepSeek-V4 non-EP DP TBO path).";
    /// `moe_hook.handle_a2a_moe` (0.5.21–0.5.23).
    pub const OVERLAP_DEEPEP_V2: &str = "DeepEP v2 MoE has not implemented the TBO/SBO overlap hooks yet. Disable --enable-two-batch-overlap and --enable-single-batch-overlap when using --moe-a2a-backend deepep_v2.";
    /// `mega_moe_hook.check_mega_moe_compat` (0.5.21–0.5.23).
    pub const OVERLAP_MEGAMOE: &str = "--moe-a2a-backend megamoe has no two-batch / single-batch overlap decomposition; disable --enable-two-batch-overlap and --enable-single-batch-overlap.";
    /// `speculative_hook._handle_eagle_family`: with `--speculative-num-steps` unset SGLang picks
    /// all three itself and asserts the other two unset, a bare `assert` (0.5.21–0.5.23).
    pub const EAGLE_STEPS_UNSET: &str = "AssertionError (bare): SGLang chooses --speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens itself only when all three are unset, and asserts `speculative_eagle_topk is None and speculative_num_draft_tokens is None` when --speculative-num-steps is";
    /// The same function compares `speculative_eagle_topk > 1` with the top-k left `None`.
    pub const EAGLE_TOPK_UNSET: &str = "TypeError: '>' not supported between instances of 'NoneType' and 'int'";
    /// `overrides._dp_lm_head_validation` (0.5.22, 0.5.23).
    pub const DP_LM_HEAD: &str = "--enable-dp-lm-head requires attention DP (--attn-dp-size).";
    /// 0.5.21's wording of the same assert (its trailing space included).
    pub const DP_LM_HEAD_0_5_21: &str = "Please enable dp attention when setting enable_dp_lm_head. ";
    /// `speculative_hook._handle_dspark` (0.5.21–0.5.23).
    pub const DSPARK_DP_LM_HEAD: &str = "DSpark with dp attention requires --enable-dp-lm-head.";
    /// `moe_hook.handle_a2a_moe`'s pplx assert (0.5.22, 0.5.23; 0.5.21's wording below).
    pub const PPLX_ATTN_DP: &str = "moe_a2a_backend='pplx' requires attention DP with at least 2 groups (--attn-dp-size >= 2).";
    pub const PPLX_ATTN_DP_0_5_21: &str =
        "moe_a2a_backend='pplx' requires --enable-dp-attention with at least 2 DP groups (--dp-size >= 2).";
    /// `moe_hook.handle_a2a_moe`'s FlashInfer A2A topology assert, per release.
    pub const FLASHINFER_A2A_ATTN_DP: &str = "Flashinfer MoE A2A requires --attn-dp-size equal to --tp-size, except for Muse Spark TP4/EP4 or TP8/EP8 prefill sequence parallelism.";
    pub const FLASHINFER_A2A_ATTN_DP_0_5_22: &str = "Flashinfer MoE A2A is only supported with --attn-dp-size equal to --tp-size";
    pub const FLASHINFER_A2A_ATTN_DP_0_5_21: &str =
        "Flashinfer MoE A2A is only supported with dp_size == tp_size and --enable-dp-attention";
    /// `moe_hook.handle_a2a_moe`'s FlashInfer MegaMOE assert (0.5.22, 0.5.23; 0.5.21's wording below).
    pub const FLASHINFER_MEGAMOE_ATTN_DP: &str = "FlashInfer MegaMOE is only supported with --attn-dp-size equal to --tp-size";
    pub const FLASHINFER_MEGAMOE_ATTN_DP_0_5_21: &str =
        "FlashInfer MegaMOE is only supported with dp_size == tp_size and --enable-dp-attention";
    /// `moe_hook.handle_a2a_moe` (0.5.21–0.5.23).
    pub const FLASHINFER_DISPATCH: &str = "--flashinfer-a2a-dispatch-type requires --moe-a2a-backend flashinfer.";
}

pub use crate::sglang_args::{OptionMatch, extra_value, match_option};

mod hybrid;
pub mod options;
use pd_api::Role;

/// Argparse destinations the operator derives from the spec; `extraArgs` must not set them,
/// under any of their option strings or abbreviations.
pub const MANAGED_DESTS: &[&str] = &[
    "model_path",
    "served_model_name",
    "revision",
    "disaggregation_mode",
    "disaggregation_bootstrap_port",
    "disaggregation_transfer_backend",
    "disaggregation_ib_device",
    "disaggregation_decode_allocation_policy",
    "tp_size",
    "dp_size",
    "attn_dp_size",
    "enable_dp_attention",
    "pp_size",
    "attn_cp_size",
    "enable_prefill_cp",
    "cp_strategy",
    "dcp_size",
    "page_size",
    "kv_cache_dtype",
    "enable_kv_cache_sharding",
    "enable_dsa_cache_layer_split",
    "host",
    "port",
    "dist_init_addr",
    "nnodes",
    "node_rank",
];

/// Environment variables the operator sets on engine containers.
pub const MANAGED_ENV: &[&str] = &["SGLANG_HOST_IP", "SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER"];

/// Flags and environment variables that must be equal on both roles although SGLang never
/// compares them (spec §6.1): a mismatch corrupts or stalls transfers instead of failing fast.
const PAIRED_FLAGS: &[(&str, &str)] = &[
    ("--disaggregation-enable-kv-checksum", "the KV checksum changes the metadata buffers both roles exchange"),
    ("--speculative-algorithm", "draft KV is transferred with the target KV"),
    ("--speculative-num-steps", "draft KV is transferred with the target KV"),
    ("--speculative-eagle-topk", "draft KV is transferred with the target KV"),
    ("--speculative-num-draft-tokens", "draft KV is transferred with the target KV"),
    ("--speculative-draft-model-path", "draft KV is transferred with the target KV"),
    ("--disable-hybrid-swa-memory", "it changes the KV pool kind of hybrid-SWA models"),
    ("--dsv4-attn-backend", "it decides DeepSeek-V4's kv_layout"),
];
const PAIRED_ENV: &[(&str, &str)] = &[
    (
        "SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK",
        "a decode-only setting asks /query_dp_ranks for rooms the prefill never registers",
    ),
    ("SGLANG_ENABLE_DISAGG_SAMPLING_MASK", "it changes the metadata buffers both roles exchange"),
    ("SGLANG_DISAGG_STAGING_BUFFER", "both roles must stage KV the same way"),
    ("SGLANG_DSV4_KV_LAYOUT", "it decides DeepSeek-V4's kv_layout"),
];

const DNS_LABEL_MAX: usize = 63;

/// The rule only the cluster decides: `placement.gang: workload` needs Kubernetes' gang
/// scheduling API, which the operator asks the cluster about once at start
/// (`controller::discovery::serves_pod_groups`). The webhook denies with it; the controller
/// reports it as `Validated=False` for objects stored before (or without) the webhook.
pub fn gang_api(spec: &PDDeploymentSpec, served: bool) -> Option<Finding> {
    (spec.placement.gang == pd_api::GangMode::Workload && !served).then(|| {
        Finding::error(
            "gang-api",
            "spec.placement.gang",
            "workload, but this cluster does not serve Kubernetes' gang scheduling API (PodGroup, scheduling.k8s.io/v1beta1)",
            "enable the GenericWorkload feature gate and that API version, or use gang: auto",
        )
    })
}

/// The ConfigMap `spec.model.configMapRef` names gave no config.json (`why`): the webhook's
/// refusal and the controller's finding.
pub fn model_config_unread(why: &str) -> Finding {
    Finding::error(
        "model-config-unread",
        "spec.model.configMapRef",
        why,
        "create the ConfigMap with the model's HF config.json, or remove configMapRef",
    )
}

/// What the webhook and the controller both judge of a PDDeployment in a cluster: every rule,
/// and whether the cluster serves the gang API its placement asks for (`gang_api_served`).
pub fn in_cluster(name: &str, spec: &PDDeploymentSpec, facts: &ModelFacts, gang_api_served: bool) -> Vec<Finding> {
    let mut out = validate_with_facts(name, spec, facts);
    out.extend(gang_api(spec, gang_api_served));
    out
}

/// Runs every rule over the spec. `config` is the model's `config.json`, when available.
pub fn validate(name: &str, spec: &PDDeploymentSpec, config: Option<&HfConfig>) -> Vec<Finding> {
    let facts = crate::model::resolve(&spec.model, config);
    validate_with_facts(name, spec, &facts)
}

pub fn validate_with_facts(name: &str, spec: &PDDeploymentSpec, facts: &ModelFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    check_name(name, spec, &mut out);
    check_release(spec, &mut out);
    check_rollout(spec, &mut out);
    check_scaling(spec, &mut out);
    if spec.model.path.trim().is_empty() {
        out.push(Finding::error(
            "model-path",
            "spec.model.path",
            "the model path is empty",
            "set spec.model.path to a Hugging Face id or a path inside the pod",
        ));
    }
    check_model_source(spec, &mut out);
    check_hub_ids(spec, &mut out);
    // Zero or oversized counts stop the rules that multiply and divide them.
    let sizes_ok = check_sizes(Role::Prefill, &spec.prefill, &mut out)
        & check_sizes(Role::Decode, &spec.decode, &mut out)
        & crate::bounds::check_counts(spec, &mut out);
    for role in [Role::Prefill, Role::Decode] {
        let rs = spec.role(role);
        if sizes_ok {
            check_startup(role, rs, spec, facts, &mut out);
            check_accelerator(role, rs, spec, facts, &mut out);
            check_gpus(role, rs, &mut out);
        }
        check_extra_args(role, rs, spec.engine.engine_type, release_of(spec), &mut out);
    }
    check_paired_settings(spec, &mut out);
    if sizes_ok {
        // What the engines report and map ranks with: the widths SGLang resolves.
        let resolved = crate::resolve::spec(spec, facts);
        check_handshake(&resolved, facts, &mut out);
        check_sender(&resolved, &mut out);
        // Start-up judges prefill_complete before the DeepSeek CP layouts recompute the widths.
        check_allocation_policy(spec, &mut out);
        check_operator_policy(&resolved, facts, &mut out);
    }
    // SGLang's rules that the release the pods run does not raise yet.
    let release = release_of(spec);
    out.retain(|f| crate::release::rule_holds(f.rule, release));
    out
}

/// The release the engines are judged with: a version that is no release number is refused, an
/// image whose release is not told or not supported is judged with the nearest one and warned
/// about, and settings the release has no flag for are refused.
fn check_release(spec: &PDDeploymentSpec, out: &mut Vec<Finding>) {
    let (field, fix) = (
        "spec.engine.version",
        format!("set spec.engine.version to the SGLang release the image runs ({})", crate::release::supported_list()),
    );
    let release = match crate::release::of_engine(&spec.engine) {
        Err(e) => return out.push(Finding::error("engine-version", field, e.to_string(), fix)),
        Ok(r) => r,
    };
    if let crate::release::Source::Assumed { why } = &release.source {
        let message = format!("{why}; judged with SGLang {}'s rules and option table, which may differ from what it runs", release.release);
        out.push(Finding::warning("engine-release-assumed", field, message, fix));
    }
    for role in [Role::Prefill, Role::Decode] {
        if spec.role(role).enable_kv_cache_sharding && !release.release.has_kv_cache_sharding() {
            out.push(Finding::error(
                "release-flag",
                role.field("enableKvCacheSharding"),
                "unrecognized arguments: --enable-kv-cache-sharding",
                format!(
                    "SGLang {} has no KV-cache sharding (new in 0.5.22): turn enableKvCacheSharding off, or run 0.5.22 or later",
                    release.release
                ),
            ));
        }
    }
    let policy = spec.kv_transfer.decode_allocation_policy;
    if !release.release.has_decode_allocation_policy() && policy != AllocationPolicy::default() {
        out.push(Finding::error(
            "release-option",
            "spec.kvTransfer.decodeAllocationPolicy",
            format!(
                "SGLang {} has no --disaggregation-decode-allocation-policy (new in 0.5.22): its decode always allocates early, not {policy}",
                release.release
            ),
            "remove decodeAllocationPolicy, or run SGLang 0.5.22 or later",
        ));
    }
}

/// Zero sizes would make every later rule divide by zero; report them and stop there.
fn check_sizes(role: Role, rs: &RoleSpec, out: &mut Vec<Finding>) -> bool {
    let p = &rs.parallelism;
    let mut ok = true;
    for (field, value) in [("tp", p.tp), ("dp", p.dp), ("attnDp", p.attn_dp), ("pp", p.pp), ("attnCp", p.attn_cp), ("dcp", p.dcp)] {
        if value == 0 {
            ok = false;
            out.push(Finding::error(
                "size-positive",
                role.field(&format!("parallelism.{field}")),
                format!("{field} must be at least 1, got 0{}", if field == "tp" { texts::ZERO_TP } else { "" }),
                format!("set {field}: 1 or more"),
            ));
        }
    }
    if rs.gpus_per_node == 0 {
        ok = false;
        out.push(Finding::error(
            "size-positive",
            role.field("gpusPerNode"),
            "gpusPerNode must be at least 1, got 0",
            "set gpusPerNode to the GPUs of one node, e.g. 8",
        ));
    }
    if rs.replicas < 0 {
        out.push(Finding::error(
            "size-positive",
            role.field("replicas"),
            format!("replicas must not be negative, got {}", rs.replicas),
            "set replicas: 0 or more",
        ));
    }
    ok
}

/// What each engine checks at its own start-up (spec §7a item 1), one SGLang check group at a time.
fn check_startup(role: Role, rs: &RoleSpec, spec: &PDDeploymentSpec, facts: &ModelFacts, out: &mut Vec<Finding>) {
    check_widths(role, rs, facts, release_of(spec), out);
    check_model_overrides(role, rs, spec, facts, out);
    check_context_parallel(role, rs, spec, facts, out);
    check_pp_speculative(role, rs, release_of(spec), out);
    check_chunked_prefill(role, rs, spec, facts, out);
    options::check(role, rs, release_of(spec), facts, out);
    hybrid::check_mamba_no_buffer(role, spec, facts, out);
    if rs.enable_kv_cache_sharding {
        check_sharding_startup(role, rs, spec, facts, out);
    }
}

/// `validation_hook`'s chunked-prefill check (0.5.21–0.5.23): on any role but a PD decode, a
/// `--chunked-prefill-size` above 0 must be a multiple of the page size the role resolves.
fn check_chunked_prefill(role: Role, rs: &RoleSpec, spec: &PDDeploymentSpec, facts: &ModelFacts, out: &mut Vec<Finding>) {
    let reading = crate::sglang_args::read(release_of(spec), rs.template.extra_args.iter().map(String::as_str).enumerate());
    let Some(last) = reading.occurrences.iter().rev().find(|o| o.spec.dest == "chunked_prefill_size") else { return };
    let Some(&(index, value)) = last.values.first() else { return };
    let Ok(size) = value.trim().replace('_', "").parse::<i64>() else { return };
    if role == Role::Decode || size <= 0 {
        return;
    }
    let requested = spec.kv_transfer.page_size.or_else(|| crate::resolve::unset_page_size(spec, facts).ok());
    let page = crate::resolve::role_page_size(spec, facts, role, requested);
    if page == 0 || size % i64::from(page) == 0 {
        return;
    }
    out.push(Finding::error(
        "chunked-prefill-page",
        role.field(&format!("template.extraArgs[{index}]")),
        format!("{} (--chunked-prefill-size {size}, page size {page})", texts::CHUNKED_PREFILL_PAGE),
        format!("make `{}` a multiple of the page size {page} (or -1 to turn chunked prefill off)", last.option),
    ));
}

/// `--speculative-algorithm` as resolution leaves it for the start-up checks: NEXTN becomes EAGLE.
fn speculative_algorithm(release: Release, args: &[String]) -> Option<String> {
    extra_value(release, args, "speculative_algorithm").map(|a| a.to_uppercase().replace("NEXTN", "EAGLE"))
}

/// Pipeline parallelism with speculative decoding (`check_pipeline_parallel_compat`): only
/// non-multi-layer EAGLE, and under PD only on the prefill (DSpark: prefill only too).
fn check_pp_speculative(role: Role, rs: &RoleSpec, release: Release, out: &mut Vec<Finding>) {
    let args = &rs.template.extra_args;
    let Some(algo) = speculative_algorithm(release, args) else { return };
    if rs.parallelism.pp <= 1 {
        return;
    }
    let pp_spec = env_truthy(env_value(rs, "SGLANG_ENABLE_PP_SPEC").as_deref());
    let text = match algo.as_str() {
        "DSPARK" if role == Role::Decode => texts::PP_DSPARK_PREFILL,
        "DSPARK" if pp_spec => texts::PP_SPEC_DSPARK,
        "DSPARK" => return,
        _ if algo != "EAGLE" || extra_value(release, args, "enable_multi_layer_eagle").is_some() => texts::PP_SPEC_EAGLE_ONLY,
        _ if pp_spec => texts::PP_SPEC_PD,
        _ if role == Role::Decode => texts::PP_SPEC_PREFILL_ONLY,
        _ => return,
    };
    out.push(Finding::error("pp-speculative", role.field("parallelism.pp"), text, "keep pp: 1 on a role that runs speculative decoding"));
}

/// Parallel widths (`_validate_parallelism`, `initialize_model_parallel`) and the DeepSeek
/// override's DSA DCP refusal.
fn check_widths(role: Role, rs: &RoleSpec, facts: &ModelFacts, release: Release, out: &mut Vec<Finding>) {
    let p = &rs.parallelism;
    // Judged on the widths SGLang runs: its DeepSeek CP layouts recompute attention DP and CP.
    let r = crate::resolve::parallelism(p, facts);
    let groups = r.attn_dp.saturating_mul(r.attn_cp);
    if !p.tp.is_multiple_of(groups) {
        let resolved = if r == *p {
            String::new()
        } else {
            format!(" (SGLang's DeepSeek context-parallel layout runs attention DP {} × CP {})", r.attn_dp, r.attn_cp)
        };
        // `_handle_data_parallelism` asserts `tp_size % attn_dp_size == 0` without a message;
        // the context-parallel asserts check the CP width alone first.
        let bare = if p.tp.is_multiple_of(r.attn_dp) { "" } else { "; SGLang raises a bare AssertionError" };
        let message = if bare.is_empty() && !p.tp.is_multiple_of(r.attn_cp) {
            format!("{}: tp {} is not a multiple of attnCp {}{resolved}", texts::TP_ATTN_CP, p.tp, r.attn_cp)
        } else {
            format!(
                "{}: tp {} is not a multiple of attnDp {} × attnCp {}{resolved}{bare}",
                texts::TP_ATTN_GROUPS,
                p.tp,
                p.attn_dp,
                p.attn_cp
            )
        };
        out.push(Finding::error(
            "tp-divisible-by-attn-groups",
            role.field("parallelism.tp"),
            message,
            format!("make tp a multiple of {groups}, e.g. tp: {}", crate::bounds::next_multiple(p.tp, groups)),
        ));
    }
    check_deepseek_cp(role, p, facts, out);
    check_replica_dp(role, rs, facts, release, out);
    if !p.tp.is_multiple_of(p.dcp) {
        out.push(Finding::error(
            "tp-divisible-by-dcp",
            role.field("parallelism.dcp"),
            format!("tensor_model_parallel_size ({}) must be divisible by decode_context_parallel_size ({})", p.tp, p.dcp),
            format!("choose a dcp that divides tp {}, e.g. dcp: {}", p.tp, crate::bounds::largest_divisor_at_most(p.tp, p.dcp)),
        ));
    }
    if p.dcp > 1 && facts.is_dsa() {
        out.push(Finding::error(
            "dsa-dcp-pd",
            role.field("parallelism.dcp"),
            texts::DSA_DCP_PD,
            format!("set {} dcp: 1; SGLang runs DSA DCP only without PD disaggregation", role.field("parallelism")),
        ));
    }
}

/// Replica data parallelism (`dp`) beside attention DP, and across nodes.
fn check_replica_dp(role: Role, rs: &RoleSpec, facts: &ModelFacts, release: Release, out: &mut Vec<Finding>) {
    let p = &rs.parallelism;
    if p.dp > 1 && p.attn_dp > 1 {
        // Before 0.5.22 `--dp-size` is the attention-DP width under `--enable-dp-attention`:
        // the replicas cannot be said at all (ours), where later releases refuse them.
        let (rule, message) = if release.has_attn_dp_size() {
            (
                "dp-with-attn-dp",
                format!(
                    "--dp-size {} with --attn-dp-size {}: data-parallel replicas combined with attention data parallelism are not supported.",
                    p.dp, p.attn_dp
                ),
            )
        } else {
            (
                "release-option",
                format!(
                    "SGLang {release} has no --attn-dp-size: under --enable-dp-attention its --dp-size is the attention-DP width, so dp {} beside attnDp {} cannot be expressed",
                    p.dp, p.attn_dp
                ),
            )
        };
        out.push(Finding::error(
            rule,
            role.field("parallelism.dp"),
            message,
            "use attnDp for attention data parallelism and scale instances with replicas; keep dp: 1",
        ));
    }
    // Before 0.5.22 the assert spared attention DP, which DeepSeek's CP layouts turn on.
    let (text, spared) = if release.has_attn_dp_size() {
        (texts::MULTI_NODE_DP, false)
    } else {
        (texts::MULTI_NODE_DP_0_5_21, crate::resolve::cp_layout(p, facts).is_some())
    };
    if p.dp > 1 && rs.nodes_per_instance() > 1 && !spared {
        out.push(Finding::error(
            "multi-node-dp",
            role.field("parallelism.dp"),
            text,
            "keep dp: 1 for an instance spanning nodes; use attnDp, or scale with replicas",
        ));
    }
}

/// The asserts of SGLang's DeepSeek context-parallel layouts (`validate_deepseek_v4_cp`, the
/// DeepSeek override's DSA block): one machine, and no attention DP under DeepSeek-V4 CP.
fn check_deepseek_cp(role: Role, p: &Parallelism, facts: &ModelFacts, out: &mut Vec<Finding>) {
    use crate::resolve::CpLayout;
    let layout = crate::resolve::cp_layout(p, facts);
    if layout == Some(CpLayout::DeepSeekV4) && p.attn_dp.saturating_mul(p.dp) != 1 {
        out.push(Finding::error(
            "v4-cp-attn-dp",
            role.field("parallelism.attnDp"),
            texts::V4_CP_ATTN_DP,
            "keep attnDp: 1 and dp: 1 with DeepSeek-V4 attnCp > 1",
        ));
    }
    if matches!(layout, Some(CpLayout::DeepSeekV4 | CpLayout::Dsa)) && p.tp > 8 {
        out.push(Finding::error(
            "cp-single-machine",
            role.field("parallelism.tp"),
            texts::CP_SINGLE_MACHINE,
            "keep tp at most 8 with attnCp > 1, or set attnCp: 1",
        ));
    }
}

/// The model overrides' KV dtype and backend checks (`model_overrides/`).
fn check_model_overrides(role: Role, rs: &RoleSpec, spec: &PDDeploymentSpec, facts: &ModelFacts, out: &mut Vec<Finding>) {
    let release = release_of(spec);
    let p = &rs.parallelism;
    let dtype = spec.kv_transfer.kv_cache_dtype;
    if facts.is_dsa() && !matches!(dtype, KvCacheDtype::Auto | KvCacheDtype::Bf16 | KvCacheDtype::Bfloat16 | KvCacheDtype::Fp8E4m3) {
        out.push(Finding::error(
            "dsa-kv-dtype",
            "spec.kvTransfer.kvCacheDtype",
            texts::DSA_DTYPE,
            "use kvCacheDtype auto, bfloat16 or fp8_e4m3",
        ));
    }
    if facts.traits.deepseek_v4 && !matches!(dtype, KvCacheDtype::Auto | KvCacheDtype::Bfloat16 | KvCacheDtype::Fp8E4m3) {
        out.push(Finding::error(
            "v4-kv-dtype",
            "spec.kvTransfer.kvCacheDtype",
            format!("{dtype} is not supported for DeepseekV4ForCausalLM"),
            "use kvCacheDtype auto, bfloat16 or fp8_e4m3",
        ));
    }
    if facts.traits.deepseek_v4 && p.attn_cp > 1 && p.cp_strategy == Some(pd_api::CpStrategy::Zigzag) {
        out.push(Finding::error("v4-zigzag-cp", role.field("parallelism.cpStrategy"), texts::V4_ZIGZAG, "use cpStrategy: interleave"));
    }
    let arch = facts.architecture.as_deref();
    let strategy = p.cp_strategy;
    if p.attn_cp > 1 && arch == Some("DeepseekV32ForCausalLM") && strategy == Some(pd_api::CpStrategy::Zigzag) {
        out.push(Finding::error("v32-zigzag-cp", role.field("parallelism.cpStrategy"), texts::V32_ZIGZAG, "use cpStrategy: interleave"));
    }
    if p.attn_cp > 1 && matches!(arch, Some("MiMoV2ForCausalLM" | "MiMoV2FlashForCausalLM")) && strategy != Some(pd_api::CpStrategy::Zigzag)
    {
        out.push(Finding::error(
            "mimo-v2-cp-strategy",
            role.field("parallelism.cpStrategy"),
            texts::MIMO_V2_ZIGZAG,
            "use cpStrategy: zigzag",
        ));
    }
    if arch == Some("GptOssForCausalLM") {
        let args = &rs.template.extra_args;
        let attention = extra_value(release, args, "attention_backend");
        let chosen = [
            extra_value(release, args, "prefill_attention_backend").or(attention.clone()),
            extra_value(release, args, "decode_attention_backend").or(attention),
        ];
        // SGLang picks a supported backend only when none of the three is set; the check runs
        // before the generic default, so a side left unset is `None` and refused.
        let unsupported = |b: &Option<String>| b.as_deref().is_none_or(|b| !GPT_OSS_BACKENDS.contains(&b));
        if chosen.iter().any(Option::is_some) && chosen.iter().any(unsupported) {
            let shown = |b: &Option<String>| b.clone().unwrap_or_else(|| "None".into());
            out.push(Finding::error(
                "gpt-oss-attention-backend",
                role.field("template.extraArgs"),
                format!("{} (prefill: {}, decode: {})", texts::GPT_OSS_BACKENDS, shown(&chosen[0]), shown(&chosen[1])),
                format!(
                    "use one of {} as --attention-backend (a --prefill- or --decode-attention-backend alone leaves the other phase unset), or leave all three to SGLang",
                    GPT_OSS_BACKENDS.join(", ")
                ),
            ));
        }
    }
}

/// Context parallelism and the prefill-only checks of the disaggregation group.
fn check_context_parallel(role: Role, rs: &RoleSpec, spec: &PDDeploymentSpec, facts: &ModelFacts, out: &mut Vec<Finding>) {
    let p = &rs.parallelism;
    if p.attn_cp > 1 {
        // The DeepSeek override's DSA block asserts prefill-only CP under PD.
        if role == Role::Decode && facts.is_dsa() {
            out.push(Finding::error(
                "dsa-decode-cp",
                role.field("parallelism.attnCp"),
                texts::DSA_DECODE_CP,
                "set spec.decode.parallelism.attnCp: 1; DSA runs context parallelism on the prefill only",
            ));
        }
        if p.dcp > 1 {
            out.push(Finding::error(
                "dcp-with-prefill-cp",
                role.field("parallelism.dcp"),
                texts::DCP_NO_PREFILL_CP,
                "use either attnCp or dcp on one role, not both",
            ));
        }
        // `--enable-prefill-cp` is rendered on either role with attnCp > 1; start-up asks both.
        if p.cp_strategy.is_none() {
            out.push(Finding::error(
                "cp-strategy-required",
                role.field("parallelism.cpStrategy"),
                if facts.traits.deepseek_v4 { texts::V4_CP_STRATEGY_NONE } else { texts::CP_STRATEGY_REQUIRED },
                "set cpStrategy: zigzag or interleave",
            ));
        }
    }
    if role == Role::Prefill && spec.kv_transfer.backend == TransferBackend::Fake {
        out.push(Finding::error(
            "prefill-no-fake-backend",
            "spec.kvTransfer.backend",
            texts::PREFILL_NO_FAKE,
            "use mooncake, nixl, mori or ascend; `fake` only serves synthetic decode benchmarks",
        ));
    }
    if role == Role::Prefill && p.dcp > 1 {
        out.push(Finding::warning(
            "prefill-dcp",
            role.field("parallelism.dcp"),
            texts::PREFILL_DCP_WARNING,
            "keep prefill dcp: 1 unless you have measured a gain",
        ));
    }
}

/// `--enable-kv-cache-sharding`: prefill only, and the layouts and backends it supports.
fn check_sharding_startup(role: Role, rs: &RoleSpec, spec: &PDDeploymentSpec, facts: &ModelFacts, out: &mut Vec<Finding>) {
    let p = &rs.parallelism;
    match role {
        Role::Decode => out.push(Finding::error(
            "sharding-prefill-only",
            role.field("enableKvCacheSharding"),
            texts::SHARDING_PREFILL_ONLY,
            "remove enableKvCacheSharding from spec.decode",
        )),
        Role::Prefill => {
            check_sharding_tree_core(rs, out);
            let mla = facts.pool().is_some_and(PoolKind::is_mla_or_hybrid);
            let sharding_layout = match (facts.pool(), p.attn_cp > 1) {
                (Some(_), _) if mla && p.attn_cp <= 1 && p.attn_dp > 1 => Some(texts::SHARDING_MLA_ATTN_DP),
                (Some(_), _) if mla && p.attn_cp <= 1 && p.tp <= 1 => Some(texts::SHARDING_MLA_TP),
                (Some(PoolKind::Mha), false) => Some(texts::SHARDING_GQA_CP),
                _ => None,
            };
            if let Some(text) = sharding_layout {
                out.push(Finding::error(
                    "sharding-layout",
                    role.field("enableKvCacheSharding"),
                    text,
                    "shard GQA caches with prefill attnCp > 1, MLA caches over plain TP > 1 (attnDp 1), or turn sharding off",
                ));
            }
            if p.dcp > 1 {
                out.push(Finding::error(
                    "sharding-with-dcp",
                    role.field("enableKvCacheSharding"),
                    texts::SHARDING_WITH_DCP,
                    "turn off enableKvCacheSharding or set prefill dcp: 1",
                ));
            }
            if !matches!(spec.kv_transfer.backend, TransferBackend::Mooncake | TransferBackend::MooncakeTcp | TransferBackend::Nixl) {
                out.push(Finding::error(
                    "sharding-backend",
                    "spec.kvTransfer.backend",
                    format!("{} '{}'.", texts::SHARDING_TRANSFER, spec.kv_transfer.backend),
                    "use backend: mooncake or nixl, or turn off enableKvCacheSharding",
                ));
            }
            if env_truthy(env_value(rs, "SGLANG_DISAGG_STAGING_BUFFER").as_deref()) {
                out.push(Finding::error(
                    "sharding-staging",
                    role.field("template.env"),
                    texts::SHARDING_STAGING,
                    "remove SGLANG_DISAGG_STAGING_BUFFER from both roles, or turn off enableKvCacheSharding",
                ));
            }
            if !sharding_speculation_supported(rs, facts, release_of(spec)) {
                out.push(Finding::error(
                    "sharding-speculative",
                    role.field("template.extraArgs"),
                    texts::SHARDING_SPECULATIVE,
                    "drop the --speculative-* flags from the prefill, or turn off enableKvCacheSharding",
                ));
            }
            if spec.kv_transfer.page_size == Some(1) {
                out.push(Finding::error(
                    "sharding-page-size",
                    "spec.kvTransfer.pageSize",
                    texts::SHARDING_PAGE_SIZE,
                    "set pageSize: 64 (or another size > 1)",
                ));
            }
        }
    }
}

/// 0.5.22's sharding needs the Python radix tree core unless the radix cache is off
/// (`SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND` defaults to `rust`).
fn check_sharding_tree_core(rs: &RoleSpec, out: &mut Vec<Finding>) {
    let core = env_value(rs, "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND").unwrap_or_else(|| "rust".into());
    if core != "python" && extra_value(Release::V0_5_22, &rs.template.extra_args, "disable_radix_cache").is_none() {
        out.push(Finding::error(
            "sharding-tree-core",
            Role::Prefill.field("enableKvCacheSharding"),
            format!(
                "--enable-kv-cache-sharding requires the Python UnifiedTreeCore: SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND='{core}' is not supported for sharded KV."
            ),
            "set env SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python on the prefill (or --disable-radix-cache), or run SGLang 0.5.23",
        ));
    }
}

/// `handle_kv_cache_sharding`'s speculative-decoding gate: none, or single-layer NextN MTP
/// (EAGLE, top-k 1, after resolution turns NEXTN into EAGLE) on GLM's DSA model. An unknown
/// config.json is given the benefit of the doubt on the NextN layer count.
fn sharding_speculation_supported(rs: &RoleSpec, facts: &ModelFacts, release: Release) -> bool {
    let args = &rs.template.extra_args;
    let Some(algo) = speculative_algorithm(release, args) else { return true };
    algo == "EAGLE"
        && facts.architecture.as_deref() == Some("GlmMoeDsaForCausalLM")
        && facts.nextn_layers.is_none_or(|n| n == Some(1))
        && extra_value(release, args, "speculative_eagle_topk").is_none_or(|k| k == "1")
        && extra_value(release, args, "enable_multi_layer_eagle").is_none()
}

const GPT_OSS_BACKENDS: &[&str] = &["triton", "trtllm_mha", "fa3", "fa4", "ascend", "intel_amx", "intel_xpu", "aiter"];

/// The first start-up refusal that depends on the GPU, for one accelerator.
/// DeepSeek-V4's start-up hook on an explicit `--dsv4-attn-backend` (`apply_deepseek_v4_defaults`):
/// FlashMLA-Mega needs DeepSeek-V4.1 on SM100; trtllm needs SM100, an fp8_e4m3 KV cache, no
/// context parallelism, and does not run under PD at all.
fn dsv4_backend_refusal(
    rs: &RoleSpec,
    spec: &PDDeploymentSpec,
    facts: &ModelFacts,
    acc: Accelerator,
) -> Option<(String, &'static str, &'static str)> {
    let release = release_of(spec);
    if !facts.traits.deepseek_v4 {
        return None;
    }
    let field = "template.extraArgs";
    let fix = "leave --dsv4-attn-backend unset (auto) or flashmla";
    let v41 = facts.model_type.as_deref().is_some_and(|t| t.starts_with("deepseek_v41"));
    let p = &rs.parallelism;
    match extra_value(release, &rs.template.extra_args, "dsv4_attn_backend").as_deref() {
        Some("flashmla_mega") if !(v41 && acc.is_blackwell()) => Some((texts::DSV4_MEGA.into(), field, fix)),
        Some("trtllm") if !acc.is_blackwell() => Some((texts::DSV4_TRTLLM_SM100.into(), field, fix)),
        Some("trtllm") if !matches!(spec.kv_transfer.kv_cache_dtype, KvCacheDtype::Auto | KvCacheDtype::Fp8E4m3) => Some((
            format!("--dsv4-attn-backend trtllm requires kv_cache_dtype=fp8_e4m3, got {}.", spec.kv_transfer.kv_cache_dtype),
            "spec.kvTransfer.kvCacheDtype",
            fix,
        )),
        Some("trtllm") if p.attn_cp > 1 || p.dcp > 1 => Some((texts::DSV4_TRTLLM_CP.into(), field, fix)),
        Some("trtllm") => Some((texts::DSV4_TRTLLM_PD.into(), field, fix)),
        _ => None,
    }
}

fn accelerator_refusal(
    role: Role,
    rs: &RoleSpec,
    spec: &PDDeploymentSpec,
    facts: &ModelFacts,
    acc: Accelerator,
) -> Option<(String, &'static str, &'static str)> {
    let release = release_of(spec);
    let args = &rs.template.extra_args;
    let dtype = extra_value(release, args, "kv_cache_dtype").unwrap_or_else(|| spec.kv_transfer.kv_cache_dtype.to_string());
    let (attention, prefill, decode) = (
        extra_value(release, args, "attention_backend"),
        extra_value(release, args, "prefill_attention_backend"),
        extra_value(release, args, "decode_attention_backend"),
    );
    let default_trtllm_mla = attention.is_none()
        && prefill.is_none()
        && decode.is_none()
        && acc.is_blackwell()
        && !facts.is_dsa()
        && facts.architecture.as_deref().is_some_and(|a| crate::resolve::DEEPSEEK_OVERRIDE_ARCHS.contains(&a));
    // DeepSeek-V4 resolves its own `dsv4` backend whatever extraArgs ask for.
    let trtllm_mla = !facts.traits.deepseek_v4
        && (default_trtllm_mla || attention.as_deref() == Some("trtllm_mla") || decode.as_deref() == Some("trtllm_mla"));
    if trtllm_mla && !acc.is_blackwell() {
        return Some((
            texts::TRTLLM_MLA_BLACKWELL.into(),
            "template.extraArgs",
            "choose another --attention-backend (fa3, flashmla) on Hopper",
        ));
    }
    // The attention hook's TRTLLM MLA check runs before the KV cache hook's mxfp8 one.
    if dtype == "mxfp8" && !acc.is_blackwell() {
        return Some((
            texts::MXFP8_BLACKWELL.into(),
            "spec.kvTransfer.kvCacheDtype",
            "use fp8_e4m3 or auto on Hopper; mxfp8 needs B200-class GPUs",
        ));
    }
    if let Some(refusal) = dsv4_backend_refusal(rs, spec, facts, acc) {
        return Some(refusal);
    }
    // A decode with sharding is refused earlier, as prefill-only.
    if role == Role::Prefill
        && rs.enable_kv_cache_sharding
        && let Some((text, fix)) = sharding_backend_refusal(rs, spec, facts, acc)
    {
        return Some((text, "enableKvCacheSharding", fix));
    }
    if trtllm_mla && !matches!(dtype.as_str(), "fp8_e4m3" | "bf16" | "auto") {
        return Some((
            texts::TRTLLM_MLA_DTYPE.into(),
            "spec.kvTransfer.kvCacheDtype",
            "use kvCacheDtype fp8_e4m3 or auto, or pick another --attention-backend in extraArgs",
        ));
    }
    None
}

/// `validate_kv_shard_attention_backend` on the prefill phase's resolved backend: fa3, plain-TP
/// trtllm_mla on an MLA model, or DSA's own backend under its narrow layout.
fn sharding_backend_refusal(
    rs: &RoleSpec,
    spec: &PDDeploymentSpec,
    facts: &ModelFacts,
    acc: Accelerator,
) -> Option<(String, &'static str)> {
    let mut on_acc = spec.clone();
    on_acc.prefill.accelerator = Some(acc);
    let [attention, prefill_phase, _] = crate::resolve::attention_backends(&on_acc, facts, Role::Prefill);
    let backend = prefill_phase.or(attention).unwrap_or_default();
    let p = &rs.parallelism;
    let fix = "give the prefill --attention-backend fa3 (or trtllm_mla for plain-TP MLA), or turn sharding off";
    let text = match backend.as_str() {
        "dsa" => return dsa_sharding_refusal(&on_acc, facts, acc).map(|(text, fix)| (text.to_owned(), fix)),
        _ if facts.is_dsa() => {
            return Some((
                texts::DSA_SHARDING_BACKEND.into(),
                "leave the DSA prefill's attention backends unset (dsa), or turn sharding off",
            ));
        }
        "fa3" => return None,
        "trtllm_mla" if !facts.pool().is_some_and(PoolKind::is_mla_or_hybrid) => texts::SHARDING_TRTLLM_MLA_MODEL,
        "trtllm_mla" if p.attn_cp > 1 => texts::SHARDING_TRTLLM_MLA_CP,
        "trtllm_mla" => return None,
        other => return Some((format!("{} '{other}'.", texts::SHARDING_BACKEND), fix)),
    };
    Some((text.to_owned(), fix))
}

/// DSA's sharding layout: interleave prefill CP, TRTLLM sparse backends on an fp8_e4m3 cache
/// with page 64, Mooncake, and an indexer that neither pools nor compresses.
fn dsa_sharding_refusal(spec: &PDDeploymentSpec, facts: &ModelFacts, acc: Accelerator) -> Option<(&'static str, &'static str)> {
    let release = release_of(spec);
    let rs = &spec.prefill;
    let p = &rs.parallelism;
    if p.attn_cp <= 1 || p.cp_strategy != Some(pd_api::CpStrategy::Interleave) || p.pp != 1 {
        return Some((
            texts::DSA_SHARDING_CP,
            "run the DSA prefill with attnCp > 1, cpStrategy: interleave and pp: 1, or turn sharding off",
        ));
    }
    let fp8 = crate::resolve::kv_cache_dtype(spec, facts, Role::Prefill) == "fp8_e4m3";
    // `_dsa_split_backend_resolution`'s defaults where extraArgs name none.
    let default = if fp8 && acc.is_blackwell() { "trtllm" } else { "other" };
    let backend = |dest: &str| extra_value(release, &rs.template.extra_args, dest).unwrap_or_else(|| default.into());
    let page = crate::resolve::role_page_size(spec, facts, Role::Prefill, spec.kv_transfer.page_size);
    if !fp8 || backend("dsa_prefill_backend") != "trtllm" || backend("dsa_decode_backend") != "trtllm" || page != 64 {
        return Some((
            texts::DSA_SHARDING_TRTLLM,
            "use kvCacheDtype fp8_e4m3 (auto resolves it on B200) with the trtllm DSA backends and page size 64, or turn sharding off",
        ));
    }
    // `mooncake_tcp` is rewritten to mooncake (with TCP forced) before this check.
    let mooncake = matches!(spec.kv_transfer.backend, TransferBackend::Mooncake | TransferBackend::MooncakeTcp);
    if !mooncake || rs.enable_dsa_cache_layer_split || facts.dsa_index_pooled {
        return Some((texts::DSA_SHARDING_MOONCAKE, "use backend: mooncake without enableDsaCacheLayerSplit, or turn sharding off"));
    }
    None
}

/// Start-up refusals that depend on the GPU: an error on the role's accelerator, or, when the
/// role names none, an error if every profile refuses and a warning naming those that do.
fn check_accelerator(role: Role, rs: &RoleSpec, spec: &PDDeploymentSpec, facts: &ModelFacts, out: &mut Vec<Finding>) {
    let field = |f: &str| if f.starts_with("spec.") { f.to_owned() } else { role.field(f) };
    let fix_unknown = format!("set {} to the GPU its pods run on (H100, H200 or B200)", role.field("accelerator"));
    match rs.accelerator {
        Some(acc) => {
            if let Some((text, f, fix)) = accelerator_refusal(role, rs, spec, facts, acc) {
                out.push(Finding::error("accelerator-startup", field(f), format!("{text} ({} on {acc})", role.as_str()), fix));
            }
        }
        None => {
            let refusing: Vec<_> =
                Accelerator::ALL.iter().filter_map(|&a| accelerator_refusal(role, rs, spec, facts, a).map(|r| (a, r))).collect();
            let Some((_, (text, f, fix))) = refusing.first().cloned() else { return };
            let names: Vec<&str> = refusing.iter().map(|(a, _)| a.as_str()).collect();
            if refusing.len() == Accelerator::ALL.len() {
                out.push(Finding::error(
                    "accelerator-startup",
                    field(f),
                    format!("{text} ({} on any of {})", role.as_str(), names.join(", ")),
                    fix,
                ));
            } else {
                out.push(Finding::warning(
                    "accelerator-startup",
                    field(f),
                    format!("on {}, the {} refuses to start: {text}", names.join(" and "), role.as_str()),
                    format!("{fix_unknown}; {fix}"),
                ));
            }
        }
    }
}

/// An instance's GPUs must fill whole nodes when they span several.
fn check_gpus(role: Role, rs: &RoleSpec, out: &mut Vec<Finding>) {
    let gpus = rs.parallelism.gpus();
    let per_node = u64::from(rs.gpus_per_node);
    if gpus > per_node && !gpus.is_multiple_of(per_node) {
        out.push(Finding::error(
            "gpus-fill-nodes",
            role.field("gpusPerNode"),
            format!("an instance needs tp×pp×dp = {gpus} GPUs, which does not split evenly over nodes of {per_node} GPUs"),
            format!("make tp×pp×dp a multiple of gpusPerNode ({per_node}), or set gpusPerNode to a divisor of {gpus}"),
        ));
        return;
    }
    let nnodes = gpus.div_ceil(per_node).max(1);
    let tp_pp = u64::from(rs.parallelism.tp) * u64::from(rs.parallelism.pp);
    if nnodes > 1 && tp_pp % nnodes != 0 {
        out.push(Finding::error(
            "tp-divisible-by-nodes",
            role.field("parallelism.tp"),
            format!("tp_size must be divisible by number of nodes: tp×pp = {tp_pp} over {nnodes} nodes"),
            "choose tp and pp so that tp×pp is a multiple of the node count",
        ));
    }
}

fn check_extra_args(role: Role, rs: &RoleSpec, engine: EngineType, release: Release, out: &mut Vec<Finding>) {
    let reading = crate::sglang_args::read(release, sglang_extra_args(&rs.template.extra_args, engine));
    let managed = |dest: Option<&str>| dest.is_some_and(|d| MANAGED_DESTS.contains(&d));
    for o in reading.occurrences.iter().filter(|o| managed(Some(o.spec.dest))) {
        let flag = o.written.split_once('=').map_or(o.written, |(f, _)| f);
        let read_as = if o.option == flag { String::new() } else { format!(" (SGLang's parser reads `{flag}` as `{}`)", o.option) };
        out.push(Finding::error(
            "extra-args-managed-flag",
            role.field(&format!("template.extraArgs[{}]", o.index)),
            format!("`{}` is managed by pd-operator and derived from the spec; extraArgs may not override it{read_as}", o.option),
            format!("remove `{flag}` from extraArgs and set the matching spec field instead"),
        ));
    }
    // A managed flag's own value errors are moot: the flag has to go.
    for e in reading.errors.into_iter().filter(|e| !managed(e.dest)) {
        out.push(Finding::error("extra-args-argparse", role.field(&format!("template.extraArgs[{}]", e.index)), e.message, e.fix));
    }
    for (i, env) in rs.template.env.iter().enumerate() {
        if MANAGED_ENV.contains(&env.name.as_str()) {
            out.push(Finding::error(
                "env-managed",
                role.field(&format!("template.env[{i}]")),
                format!("`{}` is set by pd-operator", env.name),
                if env.name == "SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER" {
                    "use spec.kvTransfer.allCpRanksTransfer, which sets it on both roles"
                } else {
                    "remove it from env"
                },
            ));
        }
    }
}

/// The extraArgs SGLang's parser reads, with their index: on the stand-in, without its own
/// `--sim-*` options (and their values), which are not SGLang's.
fn sglang_extra_args(args: &[String], engine: EngineType) -> Vec<(usize, &str)> {
    let mut out = Vec::with_capacity(args.len());
    let mut skip_value = false;
    for (i, arg) in args.iter().enumerate() {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        if engine == EngineType::Sim && crate::stand_in::is_stand_in_option(arg) {
            skip_value = crate::stand_in::VALUE_OPTIONS.contains(&arg.as_str());
            continue;
        }
        out.push((i, arg.as_str()));
    }
    out
}

/// The value an engine flag has in extraArgs (`Some("")` for a bare switch).
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == flag {
            let next = it.clone().next();
            return Some(match next {
                Some(v) if !v.starts_with("--") => v.clone(),
                _ => String::new(),
            });
        }
        if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            return Some(v.to_owned());
        }
    }
    None
}

fn env_value(rs: &RoleSpec, name: &str) -> Option<String> {
    rs.template.env.iter().find(|e| e.name == name).map(|e| e.value.clone().unwrap_or_default())
}

fn env_truthy(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes" | "y"))
}

fn shown(v: &Option<String>) -> String {
    match v {
        None => "unset".into(),
        Some(s) if s.is_empty() => "set".into(),
        Some(s) => format!("{s:?}"),
    }
}

fn check_paired_settings(spec: &PDDeploymentSpec, out: &mut Vec<Finding>) {
    let (p, d) = (&spec.prefill.template, &spec.decode.template);
    for (flag, why) in PAIRED_FLAGS {
        let (pv, dv) = (flag_value(&p.extra_args, flag), flag_value(&d.extra_args, flag));
        // SGLang's transfer handles a decode that keeps draft KV for a prefill without
        // speculative decoding (extra destination layers); only the DCP relayout needs one KV
        // entry per prefill entry.
        let decode_only_speculative = flag.starts_with("--speculative-") && pv.is_none() && spec.decode.parallelism.dcp == 1;
        if pv != dv && !decode_only_speculative {
            out.push(Finding::error(
                "paired-flag",
                "spec.decode.template.extraArgs",
                format!("`{flag}` differs between roles (prefill: {}, decode: {}); SGLang never compares it, but {why}", shown(&pv), shown(&dv)),
                format!("give `{flag}` the same value in spec.prefill.template.extraArgs and spec.decode.template.extraArgs, or remove it from both"),
            ));
        }
    }
    for (name, why) in PAIRED_ENV {
        let (pv, dv) = (env_value(&spec.prefill, name), env_value(&spec.decode, name));
        if pv != dv {
            out.push(Finding::error(
                "paired-env",
                "spec.decode.template.env",
                format!("environment variable {name} differs between roles (prefill: {}, decode: {}); {why}", shown(&pv), shown(&dv)),
                format!("set {name} identically in spec.prefill.template.env and spec.decode.template.env"),
            ));
        }
    }
}

/// The rule of a model whose attention kind neither the catalogue nor a config.json tells.
pub const RULE_ATTENTION_KIND_UNKNOWN: &str = "attention-kind-unknown";

fn unknown_kind(spec: &PDDeploymentSpec, needed_for: &str) -> Finding {
    Finding::error(
        RULE_ATTENTION_KIND_UNKNOWN,
        "spec.model.attention",
        format!("the attention kind of {} is unknown, and {needed_for} depends on it", spec.model.path),
        "set spec.model.attention (MLA, HybridMLA, GQA or MHA), spec.model.architecture, or spec.model.configMapRef",
    )
}

/// The decode's handshake (checks #1..#13, the rank mapping, the receiver's checks), run by the
/// sidecar's own core on the pair the operator renders: SGLang's text, reported per check.
fn check_handshake(spec: &PDDeploymentSpec, facts: &ModelFacts, out: &mut Vec<Finding>) {
    check_page_and_dtype(spec, facts, out);
    // An unknown pool kind: the verdict on every kind SGLang has; a check that only some fail
    // cannot be decided offline.
    let pools = match facts.pool() {
        Some(pool) => vec![pool],
        None => vec![PoolKind::Mla, PoolKind::HybridMla, PoolKind::Mha],
    };
    let verdicts: Vec<_> = pools.iter().map(|&pool| rendered_handshake(spec, facts, pool)).collect();
    let mut seen = Vec::new();
    for failure in verdicts.iter().flat_map(|(failures, _)| failures) {
        if seen.contains(&failure.check) {
            continue;
        }
        seen.push(failure.check);
        if verdicts.iter().all(|(failures, _)| failures.iter().any(|f| f.check == failure.check)) {
            out.push(handshake_finding(spec, facts, failure));
        } else {
            out.push(unknown_kind(spec, failure.check.topic()));
        }
    }
    let (p, d) = (spec.prefill.parallelism.attn_tp(), spec.decode.parallelism.attn_tp());
    if facts.pool().is_some() && verdicts[0].1.iter().any(|w| w == PERF_WARNING) {
        out.push(Finding::warning(
            "non-mla-different-tp",
            "spec.decode.parallelism.tp",
            PERF_WARNING,
            format!("attention TP is {p} on prefill and {d} on decode; equal sizes avoid re-slicing KV heads in transfer"),
        ));
    }
}

/// The prefill sender's check at its first transfer (`requires_dcp_relayout`): the two DCP sizes
/// must match, or the prefill runs none and the decode's MLA pool is relaid out (a GQA decode
/// with DCP is the decode's own check #8). Raised in the prefill's transfer thread.
fn check_sender(spec: &PDDeploymentSpec, out: &mut Vec<Finding>) {
    let (p, d) = (spec.prefill.parallelism.dcp, spec.decode.parallelism.dcp);
    if p != d && p != 1 {
        out.push(Finding::error(
            "prefill-dcp-relayout",
            "spec.prefill.parallelism.dcp",
            format!("Unsupported PD DCP topology: {p} -> {d}"),
            format!("set the prefill's dcp to the decode's ({d}), or to 1 for an MLA model"),
        ));
    }
}

/// A DeepSeek-V4 KV layout the pool cannot be built with (`select_dsv4_kv_layout`,
/// `resolve_compressed_kv_layout`): SGLang's assertion fails after the weights load.
fn check_dsv4_pool(spec: &PDDeploymentSpec, facts: &ModelFacts, out: &mut Vec<Finding>) {
    for role in [Role::Prefill, Role::Decode] {
        if let Err(text) = crate::resolve::dsv4_kv_layout(spec, facts, role) {
            out.push(Finding::error(
                "v4-kv-layout",
                role.field("template.env"),
                text,
                "leave SGLANG_DSV4_KV_LAYOUT and SGLANG_DSV4_COMPRESSED_KV_LAYOUT unset (v4), or run the V4.1 layouts on a B200",
            ));
        }
    }
}

/// The handshake core's verdict on the rendered decode topology and prefill info (a DSpark
/// layout, which only the engines know, stands in on each role that runs DSpark).
fn rendered_handshake(spec: &PDDeploymentSpec, facts: &ModelFacts, pool: PoolKind) -> (Vec<HandshakeFailure>, Vec<String>) {
    let decode = crate::resolve::decode_topology_for(spec, facts, pool);
    let prefill = crate::resolve::prefill_info(spec, facts);
    crate::handshake::core::all_failures(&decode, &prefill)
}

/// A handshake failure as a finding: SGLang's text, the check's rule, field and fix.
fn handshake_finding(spec: &PDDeploymentSpec, facts: &ModelFacts, f: &HandshakeFailure) -> Finding {
    let mut message = f.error.clone();
    if f.check == Check::DcpNeedsMla {
        let source = facts.source.as_ref().map(ToString::to_string).unwrap_or_default();
        message = format!("{message} {} has a non-MLA KV pool (attention kind from {source})", facts.describe(&spec.model.path));
    }
    Finding::error(f.check.rule(), f.check.field(), message, f.check.fix())
}

/// What the spec decides of checks #1 and #2 before any pair is rendered: a page size both
/// roles keep, and a DSA dtype that GPU generations resolve differently.
fn check_page_and_dtype(spec: &PDDeploymentSpec, facts: &ModelFacts, out: &mut Vec<Finding>) {
    let model = facts.describe(&spec.model.path);
    let kv = &spec.kv_transfer;
    // #1: one page size for both roles. Unset, the operator passes the one both resolve, or
    // one both keep; only when there is none is the spec refused.
    if kv.page_size.is_none()
        && let Err((p, d)) = crate::resolve::unset_page_size(spec, facts)
    {
        out.push(Finding::error(
            "page-size-required",
            "spec.kvTransfer.pageSize",
            format!("page size is not set, the roles resolve different ones (prefill {p}, decode {d}) and no single --page-size is kept by both, so SGLang's handshake would fail with `Page size mismatch: prefill server has page_size={p}, but decode server has page_size={d}. Both servers must use the same --page-size value.`"),
            "set spec.kvTransfer.pageSize, or give the roles attention backends that keep the same page size",
        ));
    }
    // #2: the compared dtype is the resolved string; DSA models resolve `auto` per GPU generation.
    if kv.kv_cache_dtype == KvCacheDtype::Auto && facts.is_dsa() {
        out.push(Finding::warning(
            "dsa-dtype-auto",
            "spec.kvTransfer.kvCacheDtype",
            format!("{model} uses DeepSeek sparse attention, where kv-cache-dtype `auto` resolves to fp8_e4m3 on SM100+ GPUs and to bfloat16 below; a prefill and a decode on different GPU generations then fail with `KV cache dtype mismatch`"),
            "set kvCacheDtype explicitly (fp8_e4m3 or bfloat16) when the roles may run on different GPU generations",
        ));
    }
}

/// `prefill_complete` narrows what both roles may use at start-up.
fn check_allocation_policy(spec: &PDDeploymentSpec, out: &mut Vec<Finding>) {
    if spec.kv_transfer.decode_allocation_policy != AllocationPolicy::PrefillComplete {
        return;
    }
    for role in [Role::Prefill, Role::Decode] {
        let p: &Parallelism = &spec.role(role).parallelism;
        let mut unsupported = Vec::new();
        if !matches!(spec.kv_transfer.backend, TransferBackend::Mooncake | TransferBackend::MooncakeTcp) {
            unsupported.push("transfer backends other than Mooncake");
        }
        if p.pp != 1 || p.attn_cp != 1 || p.dcp != 1 {
            unsupported.push("pipeline or attention context parallelism");
        }
        // SGLang compares tp with dp only under enable_dp_attention, which resolution leaves
        // false: attention TP is tp here, whatever attnDp says.
        if p.tp != 1 {
            unsupported.push("attention tensor parallelism greater than one");
        }
        if env_truthy(env_value(spec.role(role), "SGLANG_DISAGG_STAGING_BUFFER").as_deref()) {
            unsupported.push("staging buffers");
        }
        if !unsupported.is_empty() {
            out.push(Finding::error(
                "prefill-complete-startup",
                role.field("parallelism"),
                format!("--disaggregation-decode-allocation-policy prefill_complete does not yet support {}", unsupported.join(", ")),
                "use decodeAllocationPolicy: early, or tp 1, pp 1, attnCp 1, dcp 1 with mooncake",
            ));
        }
    }
    // The receiver's `prefill_complete requires peer attention TP1/CP1/PP1` is the handshake
    // core's (check_handshake).
}

/// Rules SGLang does not enforce but whose violation breaks serving (spec §7a item 12).
fn check_operator_policy(spec: &PDDeploymentSpec, facts: &ModelFacts, out: &mut Vec<Finding>) {
    check_dsv4_pool(spec, facts, out);
    let (p, d) = (spec.prefill.parallelism.attn_tp(), spec.decode.parallelism.attn_tp());
    if p > 0 && d > 0 && p.max(d) % p.min(d) != 0 {
        out.push(Finding::error(
            "attn-tp-divide",
            "spec.decode.parallelism.tp",
            format!("attention TP sizes {p} (prefill) and {d} (decode) do not divide each other: SGLang maps ranks by integer division, so some decode ranks look up prefill ranks that do not exist (every request fails at lookup) or some prefill ranks never send"),
            "choose attention TP sizes where the larger is a multiple of the smaller, e.g. equal sizes",
        ));
    }
    if spec.prefill.parallelism.dp > 1 {
        out.push(Finding::error(
            "prefill-replica-dp",
            "spec.prefill.parallelism.dp",
            format!("prefill dp {} runs replica data parallelism behind one bootstrap server; SGLang 0.5.23 routes rooms of replicas ≥ 1 by attention-DP rank and misroutes or fails them", spec.prefill.parallelism.dp),
            "scale the prefill with spec.prefill.replicas, or use attnDp; keep dp: 1",
        ));
    }
    for role in [Role::Prefill, Role::Decode] {
        let staging = env_value(spec.role(role), "SGLANG_DISAGG_STAGING_BUFFER");
        if env_truthy(staging.as_deref()) {
            if facts.pool() == Some(PoolKind::Mla) {
                out.push(Finding::error(
                    "staging-buffer-mla",
                    role.field("template.env"),
                    texts::STAGING_NOT_MLA,
                    "remove SGLANG_DISAGG_STAGING_BUFFER from both roles",
                ));
            }
            if !matches!(spec.kv_transfer.backend, TransferBackend::Mooncake | TransferBackend::MooncakeTcp | TransferBackend::Nixl) {
                // `handle_pd_disaggregation` refuses it at start-up (mooncake_tcp is mooncake by then).
                out.push(Finding::error(
                    "staging-buffer-backend",
                    role.field("template.env"),
                    format!(
                        "SGLANG_DISAGG_STAGING_BUFFER requires disaggregation_transfer_backend='mooncake' or 'nixl', got '{}'.",
                        spec.kv_transfer.backend
                    ),
                    "use backend mooncake or nixl, or drop SGLANG_DISAGG_STAGING_BUFFER",
                ));
            }
        }
    }
    if spec.router.enabled && (spec.prefill.replicas == 0 || spec.decode.replicas == 0) {
        out.push(Finding::warning(
            "router-without-pool",
            "spec.router.enabled",
            "the router is enabled while one role has 0 replicas; every request will fail",
            "scale both roles to at least 1, or disable the router",
        ));
    }
}

/// `spec.scaling`: a ratio band that can hold and role bounds that do not cross (the CRD's CEL
/// rules say the same at the apiserver, without the values).
fn check_scaling(spec: &PDDeploymentSpec, out: &mut Vec<Finding>) {
    if let Some(band) = spec.scaling.ratio {
        if !(band.min > 0.0 && band.min.is_finite()) {
            out.push(Finding::error(
                "scaling-ratio",
                "spec.scaling.ratio.min",
                format!("the ratio band's min must be a positive number of decode instances per prefill instance, got {}", band.min),
                "set spec.scaling.ratio.min above 0 (e.g. 0.5), or drop spec.scaling.ratio",
            ));
        }
        if band.min > band.max || !band.max.is_finite() {
            out.push(Finding::error(
                "scaling-ratio",
                "spec.scaling.ratio.max",
                format!("the ratio band is empty: min {} exceeds max {}", band.min, band.max),
                "set spec.scaling.ratio.max at or above spec.scaling.ratio.min",
            ));
        }
    }
    for role in [Role::Prefill, Role::Decode] {
        let limits = spec.scaling.role(role);
        let field = |f: &str| format!("spec.scaling.{}.{f}", role.as_str());
        if limits.min_replicas < 0 {
            out.push(Finding::error(
                "scaling-bounds",
                field("minReplicas"),
                format!("minReplicas must not be negative, got {}", limits.min_replicas),
                "set minReplicas to 0 (scale to zero allowed) or more",
            ));
        }
        if let Some(max) = limits.max_replicas.filter(|m| *m < limits.min_replicas) {
            out.push(Finding::error(
                "scaling-bounds",
                field("maxReplicas"),
                format!("maxReplicas {max} is below minReplicas {}", limits.min_replicas),
                "raise maxReplicas to at least minReplicas, or lower minReplicas",
            ));
        }
    }
}

/// A role that may neither take an instance down nor add one could never roll.
fn check_rollout(spec: &PDDeploymentSpec, out: &mut Vec<Finding>) {
    let r = &spec.rollout;
    for role in [Role::Prefill, Role::Decode] {
        let unavailable = r.role(role).max_unavailable.unwrap_or(r.max_unavailable);
        if unavailable == 0 && r.max_surge(role) == 0 {
            let field = match r.role(role).max_unavailable {
                Some(_) => format!("spec.rollout.{}.maxUnavailable", role.as_str()),
                None => "spec.rollout.maxUnavailable".to_owned(),
            };
            out.push(Finding::error(
                "rollout-no-step",
                field,
                format!("{} may take no instance down and add none (maxSurge 0): a rollout could never start", role.as_str()),
                "set maxUnavailable to at least 1, or maxSurge to at least 1 for a rollout that never runs below the instance count",
            ));
        }
    }
}

fn check_name(name: &str, spec: &PDDeploymentSpec, out: &mut Vec<Finding>) {
    let valid_label = !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid_label {
        out.push(Finding::error(
            "name-dns-label",
            "metadata.name",
            format!("name {name:?} is not a DNS-1035 label; it names the Services and pod host names"),
            "use lower-case letters, digits and '-', starting with a letter and ending with a letter or digit",
        ));
        return;
    }
    for role in [Role::Prefill, Role::Decode] {
        let rs = spec.role(role);
        let nodes = rs.nodes_per_instance();
        // Surge instances of an in-place rollout come after the role's instances.
        let last_instance = spec.instance_slots(role).max(1) - 1;
        // The longest host name: last instance and node, in the last KV set a rollout names.
        let host = crate::names::pod_name(name, role, last_instance, nodes.saturating_sub(1), crate::names::NAMED_KV_SETS);
        if host.len() > DNS_LABEL_MAX {
            out.push(Finding::error(
                "name-too-long",
                "metadata.name",
                format!(
                    "pod host name {host:?} (its KV set suffix included, see rollout) is {} characters; a DNS label allows {DNS_LABEL_MAX}",
                    host.len()
                ),
                format!("shorten the name to at most {} characters", name.len() - (host.len() - DNS_LABEL_MAX)),
            ));
            return;
        }
    }
}

/// True when no finding is an error.
pub fn is_valid(findings: &[Finding]) -> bool {
    findings.iter().all(|f| f.severity != Severity::Error)
}

/// A Hugging Face source's repository and revision against the Hub's rules (`hub_id`): they name
/// the cache directory `<repo>/<revision>` the fetch Job writes, and a URL path.
fn check_hub_ids(spec: &PDDeploymentSpec, out: &mut Vec<Finding>) {
    use crate::hub_id;
    let Some(hf) = spec.model.source.as_ref().and_then(|s| s.hugging_face.as_ref()) else { return };
    if let Err(message) = hub_id::repo_id(&hf.repo) {
        let fix = format!("give the Hub's repository id, e.g. {}", hub_id::REPO_ID_EXAMPLE);
        out.push(Finding::error("hub-id", "spec.model.source.huggingFace.repo", message, fix));
    }
    let revisions =
        [("spec.model.source.huggingFace.revision", hf.revision.as_deref()), ("spec.model.revision", spec.model.revision.as_deref())];
    for (field, revision) in revisions {
        if let Some(Err(message)) = revision.map(hub_id::revision) {
            out.push(Finding::error("hub-id", field, message, format!("give a branch, tag or commit: {}", hub_id::REVISION_EXAMPLE)));
        }
    }
}

/// Ours, not SGLang's: a model source the pods could not mount as written (a path leaving the
/// volume, a relative host path, a mirror that is no URL), or a template volume or mount where
/// the source goes (the apiserver would refuse the pod, or the engine read other files).
fn check_model_source(spec: &PDDeploymentSpec, out: &mut Vec<Finding>) {
    use crate::names::{MODEL_MOUNT, MODEL_VOLUME};
    let Some(source) = &spec.model.source else { return };
    let sub_paths =
        [("pvc", source.pvc.as_ref().and_then(|p| p.path.as_deref())), ("image", source.image.as_ref().and_then(|i| i.path.as_deref()))];
    for (kind, path) in sub_paths {
        if let Some(path) = path.filter(|p| p.starts_with('/') || p.split('/').any(|c| c == "..")) {
            let (field, message) = (format!("spec.model.source.{kind}.path"), format!("{path:?} is not a directory inside the volume"));
            out.push(Finding::error("model-source", field, message, "give a relative path without `..`, e.g. `qwen3-8b`"));
        }
    }
    if let Some(host) = source.host_path.as_ref().filter(|h| !h.path.starts_with('/')) {
        let message = format!("{:?} is not an absolute directory on the node", host.path);
        out.push(Finding::error(
            "model-source",
            "spec.model.source.hostPath.path",
            message,
            "give an absolute path, e.g. /mnt/models/qwen3-8b",
        ));
    }
    if let Some(endpoint) =
        source.hugging_face.as_ref().and_then(|h| h.endpoint.as_ref()).filter(|e| !e.starts_with("http://") && !e.starts_with("https://"))
    {
        let message = format!("{endpoint:?} is not an http(s) URL; it becomes HF_ENDPOINT");
        out.push(Finding::error(
            "model-source",
            "spec.model.source.huggingFace.endpoint",
            message,
            "give the mirror's URL, e.g. https://hf-mirror.example",
        ));
    }
    // A Hub source each engine downloads mounts nothing; a cached one mounts the cache.
    if source.hugging_face.as_ref().is_some_and(|h| h.cache.is_none()) {
        return;
    }
    for role in [Role::Prefill, Role::Decode] {
        let t = &spec.role(role).template;
        if t.volumes.iter().any(|v| v.name == MODEL_VOLUME) {
            let message = format!("the volume name {MODEL_VOLUME:?} holds spec.model.source in every engine pod");
            out.push(Finding::error("model-source", role.field("template.volumes"), message, "rename the template's volume"));
        }
        if t.volume_mounts.iter().any(|m| m.mount_path.trim_end_matches('/') == MODEL_MOUNT) {
            let message = format!("{MODEL_MOUNT} is where spec.model.source is mounted");
            out.push(Finding::error("model-source", role.field("template.volumeMounts"), message, "mount the template's volume elsewhere"));
        }
    }
}
