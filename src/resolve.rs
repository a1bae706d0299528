//! What SGLang 0.5.23's start-up resolution makes of a role's flags, where it differs from what
//! the spec says: the widths the DeepSeek overrides recompute under prefill CP, the page size and
//! KV dtype DSA and DeepSeek-V4 force. Pure; validate judges, and render reports, these values.

use serde_json::Value;

use crate::api::{Accelerator, AttentionKind, CpStrategy, DEFAULT_HTTP_PORT, KvCacheDtype, PDDeploymentSpec, Parallelism, Role};
use crate::handshake::core::{DecodeTopology, PoolKind, PrefillInfo};
use crate::model::ModelFacts;
use crate::sglang_args::extra_value;

/// Architectures SGLang's DeepSeek override runs for (`model_overrides/deepseek_v2.py`).
pub const DEEPSEEK_OVERRIDE_ARCHS: &[&str] = &[
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "KimiK25ForConditionalGeneration",
    "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration",
    "GlmMoeDsaForCausalLM",
    "Glm5NextForConditionalGeneration",
    "HYV4ForCausalLM",
    "HYV4ForCausalLMNextN",
    "LongcatFlashForCausalLM",
    "LongcatFlashForCausalLMNextN",
    "Dots3NoteForCausalLM",
];

/// Which DeepSeek context-parallel layout a role's `--enable-prefill-cp` (rendered when
/// `attnCp > 1`) runs, if SGLang recomputes its widths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpLayout {
    /// `validate_deepseek_v4_cp`: attention CP over all of TP, attention DP 1.
    DeepSeekV4,
    /// The DeepSeek override's DSA block: an explicit interleave CP width is kept.
    Dsa,
    /// The DeepSeek override's MLA block: attention CP over TP / attention DP.
    Mla,
}

/// The layout SGLang's overrides apply to this role, if any.
pub fn cp_layout(p: &Parallelism, facts: &ModelFacts) -> Option<CpLayout> {
    if p.attn_cp <= 1 {
        return None;
    }
    let deepseek = facts.architecture.as_deref().is_some_and(|a| DEEPSEEK_OVERRIDE_ARCHS.contains(&a));
    let mla = matches!(facts.attention, Some(AttentionKind::Mla | AttentionKind::HybridMla));
    match () {
        _ if facts.traits.deepseek_v4 => Some(CpLayout::DeepSeekV4),
        _ if deepseek && facts.is_dsa() => Some(CpLayout::Dsa),
        _ if deepseek && mla => Some(CpLayout::Mla),
        _ => None,
    }
}

/// The parallel widths a role runs with. Under a DeepSeek CP layout SGLang folds `dp` into
/// attention DP (`context_parallel_attn_dp_size`) and sets attention CP to TP / attention DP
/// (DSA keeps an explicit interleave width), so attention TP becomes 1 there. Elsewhere the
/// spec's widths. The width is at least 1 (SGLang's 0 there fails later, as `tp % attnDp`).
pub fn parallelism(p: &Parallelism, facts: &ModelFacts) -> Parallelism {
    let Some(layout) = cp_layout(p, facts) else { return p.clone() };
    let attn_dp = p.attn_dp.saturating_mul(p.dp);
    let keep = layout == CpLayout::Dsa && p.cp_strategy == Some(CpStrategy::Interleave);
    let attn_cp = if keep { p.attn_cp } else { p.tp.checked_div(attn_dp).unwrap_or(0).max(1) };
    Parallelism { attn_dp, dp: 1, attn_cp, ..p.clone() }
}

/// The spec with each role's parallelism as SGLang resolves it and the page size the operator
/// passes (`with_page_size`): what the engines report in the handshake and map ranks with.
pub fn spec(spec: &PDDeploymentSpec, facts: &ModelFacts) -> PDDeploymentSpec {
    let mut out = with_page_size(spec, facts);
    out.prefill.parallelism = parallelism(&spec.prefill.parallelism, facts);
    out.decode.parallelism = parallelism(&spec.decode.parallelism, facts);
    out
}

/// Page sizes tried, in order, when the roles' own resolutions of an unset page size differ.
const PAGE_CANDIDATES: [u32; 6] = [64, 128, 32, 16, 256, 1];

/// What each role resolves from `requested`, on every accelerator it may run on (its own, or
/// every profile when it names none): the set of (prefill, decode) pairs.
fn resolutions(spec: &PDDeploymentSpec, facts: &ModelFacts, requested: Option<u32>) -> Vec<(u32, u32)> {
    let profiles = |role: Role| spec.role(role).accelerator.map_or(Accelerator::ALL.to_vec(), |a| vec![a]);
    let on = |role: Role, acc: Accelerator| {
        let mut s = spec.clone();
        match role {
            Role::Prefill => s.prefill.accelerator = Some(acc),
            Role::Decode => s.decode.accelerator = Some(acc),
        }
        role_page_size(&s, facts, role, requested)
    };
    let mut out = Vec::new();
    for p in profiles(Role::Prefill) {
        for d in profiles(Role::Decode) {
            out.push((on(Role::Prefill, p), on(Role::Decode, d)));
        }
    }
    out
}

/// The one page size both roles keep when `kvTransfer.pageSize` is unset (issue 15 item 5): the
/// size they both resolve by themselves, else the first of 64, 128, 32, 16, 256, 1 that both
/// keep on every accelerator they may run on. `Err` with what each role resolves by itself when
/// no single value works. A set page size is passed as it is (the handshake judges it).
pub fn unset_page_size(spec: &PDDeploymentSpec, facts: &ModelFacts) -> Result<u32, (u32, u32)> {
    let agreed = |requested: Option<u32>| {
        let pairs = resolutions(spec, facts, requested);
        let (p, d) = pairs[0];
        (p == d && pairs.iter().all(|pair| *pair == (p, d))).then_some(p)
    };
    // KV-cache sharding transfers whole pages: SGLang refuses page size 1 there.
    let usable = |v: &u32| *v > 1 || !spec.prefill.enable_kv_cache_sharding;
    agreed(None)
        .filter(usable)
        .or_else(|| PAGE_CANDIDATES.into_iter().filter(usable).find(|&v| agreed(Some(v)) == Some(v)))
        .ok_or_else(|| resolutions(spec, facts, None)[0])
}

/// The spec with the page size the operator passes to both roles: the spec's, or the one
/// `unset_page_size` finds (left unset when there is none; validate refuses that spec).
pub fn with_page_size(spec: &PDDeploymentSpec, facts: &ModelFacts) -> PDDeploymentSpec {
    let mut out = spec.clone();
    if out.kv_transfer.page_size.is_none() {
        out.kv_transfer.page_size = unset_page_size(spec, facts).ok();
    }
    out
}

/// The page size DeepSeek-V4 (256) and DSA models (64) force whatever `--page-size` says.
fn forced_page_size(facts: &ModelFacts) -> Option<u32> {
    if facts.traits.deepseek_v4 {
        Some(256)
    } else if facts.is_dsa() {
        Some(64)
    } else {
        None
    }
}

/// The attention backends a role resolves: (`attention_backend`, prefill phase, decode phase),
/// as the model overrides and `_attention_backend_default` set them. An unnamed accelerator is
/// taken as Hopper (as for the KV dtype).
pub fn attention_backends(spec: &PDDeploymentSpec, facts: &ModelFacts, role: Role) -> [Option<String>; 3] {
    let rs = spec.role(role);
    let blackwell = rs.accelerator.is_some_and(Accelerator::is_blackwell);
    let args = &rs.template.extra_args;
    let [mut attention, prefill, decode] =
        ["attention_backend", "prefill_attention_backend", "decode_attention_backend"].map(|d| extra_value(args, d));
    let arch = facts.architecture.as_deref();
    let none_set = attention.is_none() && prefill.is_none() && decode.is_none();
    if facts.traits.deepseek_v4 {
        // DeepSeek-V4 runs its own backend whatever is asked; the phases stay as given.
        attention = Some("dsv4".into());
    } else if facts.is_dsa() && none_set {
        attention = Some("dsa".into());
    } else if none_set {
        // The model overrides' own defaults.
        if blackwell && arch.is_some_and(|a| DEEPSEEK_OVERRIDE_ARCHS.contains(&a)) {
            attention = Some("trtllm_mla".into());
        } else if arch == Some("GptOssForCausalLM") {
            attention = Some(if blackwell { "trtllm_mha" } else { "fa3" }.into());
        }
    }
    if prefill.is_some() && prefill == decode {
        attention.clone_from(&prefill);
    } else if attention.is_none() {
        attention = Some(default_backend(spec, facts, role).into());
    }
    [attention, prefill, decode]
}

/// `get_default_attn_backend`: fa3 on Hopper and trtllm_mha on SM100 for non-MLA models unless
/// speculative decoding asks for top-k > 1 or a page size above 1 (`is_no_spec_infer_or_topk_one`),
/// else flashinfer; MLA models fa3 on Hopper, flashinfer on SM100.
fn default_backend(spec: &PDDeploymentSpec, facts: &ModelFacts, role: Role) -> &'static str {
    let rs = spec.role(role);
    let topk = extra_value(&rs.template.extra_args, "speculative_eagle_topk");
    let plain = match topk.as_deref() {
        None => true,
        Some(k) => k == "1" && matches!(spec.kv_transfer.page_size, None | Some(1)),
    };
    match (mla_backend(facts), rs.accelerator.is_some_and(Accelerator::is_blackwell)) {
        (true, true) => "flashinfer",
        (true, false) => "fa3",
        (false, true) if plain => "trtllm_mha",
        (false, false) if plain => "fa3",
        (false, _) => "flashinfer",
    }
}

/// `use_mla_backend`: SGLang's MLA attention architecture (DeepSeek-V4's own pool is not).
fn mla_backend(facts: &ModelFacts) -> bool {
    matches!(facts.attention, Some(AttentionKind::Mla | AttentionKind::HybridMla)) && !facts.traits.deepseek_v4
}

/// The page size one role resolves from `requested` (`--page-size`, or none): the forced sizes,
/// then the backends' page constraints in SGLang's order (`_mla_backend_page_constraints`,
/// `_fa4_page_constraint`), then `_page_size_default` (1).
pub fn role_page_size(spec: &PDDeploymentSpec, facts: &ModelFacts, role: Role, requested: Option<u32>) -> u32 {
    let [attention, prefill, decode] = attention_backends(spec, facts, role);
    let uses = |backend: &str, phases: &[&Option<String>]| phases.iter().any(|b| b.as_deref() == Some(backend));
    let all = [&attention, &prefill, &decode];
    // The model overrides force their size first; the backends' constraints still apply after.
    let mut page = forced_page_size(facts).or(requested);
    if uses("flashmla", &[&attention, &decode]) {
        page = Some(64);
    }
    if uses("trtllm_mla", &[&attention, &decode]) && !matches!(page, Some(32 | 64)) {
        page = Some(64);
    }
    if uses("cutedsl_mla", &all) && !matches!(page, Some(32 | 64)) {
        page = Some(64);
    }
    if uses("trtllm_mha", &all) && !matches!(page, Some(16 | 32 | 64 | 128)) {
        page = Some(64);
    }
    let blackwell = spec.role(role).accelerator.is_some_and(Accelerator::is_blackwell);
    if uses("fa4", &all) && !mla_backend(facts) && blackwell {
        page = Some(128);
    }
    page.unwrap_or(1)
}

/// The KV dtype string a role reports and the decode compares (spec §6.3): DSA models resolve
/// `auto` per GPU generation (bfloat16 below SM100, assumed when the accelerator is unknown;
/// fp8_e4m3 from SM100) and `bf16` to `bfloat16`; DeepSeek-V4 and FP8-KV checkpoints turn
/// `auto` into fp8_e4m3.
pub fn kv_cache_dtype(spec: &PDDeploymentSpec, facts: &ModelFacts, role: Role) -> String {
    let blackwell = spec.role(role).accelerator.is_some_and(Accelerator::is_blackwell);
    match spec.kv_transfer.kv_cache_dtype {
        KvCacheDtype::Auto if facts.traits.deepseek_v4 || facts.kv_fp8_checkpoint => "fp8_e4m3".to_owned(),
        KvCacheDtype::Auto if facts.is_dsa() => if blackwell { "fp8_e4m3" } else { "bfloat16" }.to_owned(),
        KvCacheDtype::Bf16 if facts.is_dsa() => "bfloat16".to_owned(),
        other => other.to_string(),
    }
}

/// DeepSeek-V4's pool reports its KV byte layout (`pd_kv_layout`); other pools report none.
fn kv_layout(facts: &ModelFacts) -> Option<String> {
    facts.traits.deepseek_v4.then(|| "v4".to_owned())
}

/// What the decode's handshake compares (issue #6's decode JSON, `decode.json` of the sidecar),
/// as SGLang's decode would report it for this spec, on a `pool` KV pool.
pub fn decode_topology_for(spec: &PDDeploymentSpec, facts: &ModelFacts, pool: PoolKind) -> DecodeTopology {
    let p = parallelism(&spec.decode.parallelism, facts);
    let kv = &spec.kv_transfer;
    let mut state_types = Vec::new();
    if kv.kv_cache_dtype == KvCacheDtype::Mxfp8 && pool == PoolKind::Mha {
        state_types.push("block_scale".to_owned());
        if facts.traits.hybrid_swa {
            state_types.push("block_scale_swa".to_owned());
        }
    }
    if facts.traits.minimax_sparse {
        state_types.push("minimax_index_k".to_owned());
    }
    DecodeTopology {
        attn_tp_size: p.attn_tp().into(),
        attn_cp_size: p.attn_cp.into(),
        pp_size: p.pp.into(),
        dcp_size: p.dcp.into(),
        page_size: role_page_size(spec, facts, Role::Decode, spec.kv_transfer.page_size).into(),
        kv_cache_dtype: kv_cache_dtype(spec, facts, Role::Decode),
        kv_pool: pool,
        all_cp_ranks_transfer: kv.all_cp_ranks_transfer,
        kv_layout: kv_layout(facts),
        dsv41_spec_layout: None,
        state_types,
        decode_allocation_policy: kv.decode_allocation_policy.to_string(),
    }
}

/// The decode topology on the model's pool kind (MHA when it is unknown).
pub fn decode_topology(spec: &PDDeploymentSpec, facts: &ModelFacts) -> DecodeTopology {
    decode_topology_for(spec, facts, facts.pool().unwrap_or(PoolKind::Mha))
}

/// The record the decode builds from the prefill's `GET /route` topology body, as SGLang's
/// prefill would report it for this spec.
pub fn prefill_info(spec: &PDDeploymentSpec, facts: &ModelFacts) -> PrefillInfo {
    let p = parallelism(&spec.prefill.parallelism, facts);
    let rs = &spec.prefill;
    PrefillInfo {
        attn_tp_size: p.attn_tp().into(),
        attn_cp_size: p.attn_cp.into(),
        // The bootstrap server records attention DP groups, or replica DP when there is some.
        dp_size: if p.dp == 1 { p.attn_dp } else { p.dp }.into(),
        pp_size: p.pp.into(),
        page_size: Some(role_page_size(spec, facts, Role::Prefill, spec.kv_transfer.page_size).into()),
        kv_cache_dtype: Some(kv_cache_dtype(spec, facts, Role::Prefill)),
        follow_bootstrap_room: true,
        enable_dsa_cache_layer_split: rs.enable_dsa_cache_layer_split,
        dsv41_spec_layout: Value::Null,
        kv_layout: kv_layout(facts).map_or(Value::Null, Value::from),
        decode_allocation_policy: Value::from(spec.kv_transfer.decode_allocation_policy.to_string()),
        enable_kv_cache_sharding: Value::Bool(rs.enable_kv_cache_sharding),
        prefill_http_port: Some(DEFAULT_HTTP_PORT.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(arch: &str) -> ModelFacts {
        let m = crate::api::ModelSpec { path: "m".into(), architecture: Some(arch.into()), ..Default::default() };
        crate::model::resolve(&m, None)
    }

    fn par(tp: u32, attn_dp: u32, attn_cp: u32, strategy: Option<CpStrategy>) -> Parallelism {
        Parallelism { tp, attn_dp, attn_cp, cp_strategy: strategy, ..Default::default() }
    }

    #[test]
    fn deepseek_cp_layouts_recompute_the_attention_widths() {
        let mla = facts("DeepseekV3ForCausalLM");
        // tp 4, attnDp 4, attnCp 2: SGLang runs attention CP 4 / 4 = 1.
        let r = parallelism(&par(4, 4, 2, Some(CpStrategy::Zigzag)), &mla);
        assert_eq!((r.attn_dp, r.attn_cp, r.attn_tp()), (4, 1, 1));
        let r = parallelism(&par(8, 1, 2, Some(CpStrategy::Interleave)), &mla);
        assert_eq!((r.attn_cp, r.attn_tp()), (8, 1));
        let v4 = facts("DeepseekV4ForCausalLM");
        assert_eq!(parallelism(&par(1, 1, 2, Some(CpStrategy::Interleave)), &v4).attn_cp, 1);
        let dsa = facts("DeepseekV32ForCausalLM");
        assert_eq!(parallelism(&par(8, 1, 2, Some(CpStrategy::Interleave)), &dsa).attn_cp, 2);
        assert_eq!(parallelism(&par(8, 1, 2, Some(CpStrategy::Zigzag)), &dsa).attn_cp, 8);
        // No DeepSeek override: the spec's widths.
        let gqa = facts("Qwen2ForCausalLM");
        assert_eq!(parallelism(&par(4, 4, 2, None), &gqa), par(4, 4, 2, None));
        assert_eq!(parallelism(&par(8, 2, 1, None), &mla), par(8, 2, 1, None));
    }

    #[test]
    fn the_rendered_pair_is_what_the_sidecar_reads_and_checks() {
        let mut spec: PDDeploymentSpec = serde_json::from_value(serde_json::json!({
            "model": {"path": "deepseek-ai/DeepSeek-V3.2-Exp"}, "kvTransfer": {"pageSize": 64},
            "prefill": {"parallelism": {"tp": 8}, "accelerator": "H200"},
            "decode": {"parallelism": {"tp": 8}, "accelerator": "H200"},
        }))
        .unwrap();
        let f = crate::model::resolve(&spec.model, None);
        // decode.json is the typed topology on the wire: the sidecar parses back the same value.
        let d = decode_topology(&spec, &f);
        assert_eq!(DecodeTopology::parse(&serde_json::to_value(&d).unwrap()).unwrap(), d);
        assert!(crate::handshake::core::handshake(&d, &prefill_info(&spec, &f)).is_ok());
        // DSA `auto` resolves per GPU generation: a Hopper prefill and a Blackwell decode differ.
        spec.decode.accelerator = Some(Accelerator::B200);
        let err = crate::handshake::core::handshake(&decode_topology(&spec, &f), &prefill_info(&spec, &f)).unwrap_err();
        assert!(err.error.starts_with("KV cache dtype mismatch: prefill server has kv_cache_dtype=bfloat16"), "{err:?}");
        assert_eq!(err.check.field(), "spec.kvTransfer.kvCacheDtype");
    }

    #[test]
    fn an_unset_page_size_is_what_both_roles_keep() {
        let spec = |model: &str, acc: Option<Accelerator>| {
            let mut s: PDDeploymentSpec = serde_json::from_value(serde_json::json!({
                "model": {"path": model}, "prefill": {"parallelism": {"tp": 8}}, "decode": {"parallelism": {"tp": 8}},
            }))
            .unwrap();
            s.prefill.accelerator = acc;
            s.decode.accelerator = acc;
            s
        };
        let resolved = |s: &PDDeploymentSpec| unset_page_size(s, &crate::model::resolve(&s.model, None));
        // Hopper GQA resolves fa3 and page 1 on both roles by itself.
        assert_eq!(resolved(&spec("Qwen/Qwen2.5-72B-Instruct", Some(Accelerator::H200))), Ok(1));
        // B200 GQA resolves trtllm_mha, which turns an unset page size into 64.
        assert_eq!(resolved(&spec("Qwen/Qwen2.5-72B-Instruct", Some(Accelerator::B200))), Ok(64));
        // Unknown accelerators: 1 on Hopper and 64 on B200 by themselves; 64 is kept on all.
        assert_eq!(resolved(&spec("deepseek-ai/DeepSeek-V3", None)), Ok(64));
        // DSA forces 64, DeepSeek-V4 256.
        assert_eq!(resolved(&spec("deepseek-ai/DeepSeek-V3.2-Exp", None)), Ok(64));
        let mut v4 = spec("x", None);
        v4.model.architecture = Some("DeepseekV4ForCausalLM".into());
        assert_eq!(resolved(&v4), Ok(256));
    }
}
