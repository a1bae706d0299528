//! What SGLang 0.5.23's start-up resolution makes of a role's flags, where it differs from what
//! the spec says: the widths the DeepSeek overrides recompute under prefill CP, the page size and
//! KV dtype DSA and DeepSeek-V4 force. Pure; validate judges, and render reports, these values.

use serde_json::Value;

use crate::api::{Accelerator, AttentionKind, CpStrategy, DEFAULT_HTTP_PORT, KvCacheDtype, PDDeploymentSpec, Parallelism, Role};
use crate::handshake::core::{DecodeTopology, PoolKind, PrefillInfo};
use crate::model::ModelFacts;

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

/// The spec with each role's parallelism as SGLang resolves it: what the engines report in the
/// handshake and what the rank mapping runs on.
pub fn spec(spec: &PDDeploymentSpec, facts: &ModelFacts) -> PDDeploymentSpec {
    let mut out = spec.clone();
    out.prefill.parallelism = parallelism(&spec.prefill.parallelism, facts);
    out.decode.parallelism = parallelism(&spec.decode.parallelism, facts);
    out
}

/// The page size both roles resolve (spec §6.4): DeepSeek-V4 forces 256 and DSA models 64
/// whatever `--page-size` says; otherwise the one the operator passes, if any.
pub fn page_size(spec: &PDDeploymentSpec, facts: &ModelFacts) -> Option<u32> {
    if facts.traits.deepseek_v4 {
        Some(256)
    } else if facts.is_dsa() {
        Some(64)
    } else {
        spec.kv_transfer.page_size
    }
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
        page_size: page_size(spec, facts).unwrap_or(1).into(),
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
/// prefill would report it for this spec (an unset page size is left out of the comparison).
pub fn prefill_info(spec: &PDDeploymentSpec, facts: &ModelFacts) -> PrefillInfo {
    let p = parallelism(&spec.prefill.parallelism, facts);
    let rs = &spec.prefill;
    PrefillInfo {
        attn_tp_size: p.attn_tp().into(),
        attn_cp_size: p.attn_cp.into(),
        // The bootstrap server records attention DP groups, or replica DP when there is some.
        dp_size: if p.dp == 1 { p.attn_dp } else { p.dp }.into(),
        pp_size: p.pp.into(),
        page_size: page_size(spec, facts).map(i64::from),
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
}
