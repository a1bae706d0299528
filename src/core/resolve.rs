//! What SGLang 0.5.23's start-up resolution makes of a role's flags, where it differs from what
//! the spec says: the widths the DeepSeek overrides recompute under prefill CP, the page size and
//! KV dtype DSA and DeepSeek-V4 force. Pure; validate judges, and render reports, these values.

use serde_json::Value;

use crate::handshake::core::{DecodeTopology, PoolKind, PrefillInfo, dspark_layout_stand_in};
use crate::model::ModelFacts;
use crate::release::release_of;
use crate::sglang_args::extra_value;
use pd_api::{Accelerator, AttentionKind, CpStrategy, DEFAULT_HTTP_PORT, KvCacheDtype, PDDeploymentSpec, Parallelism, Role};

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
        ["attention_backend", "prefill_attention_backend", "decode_attention_backend"].map(|d| extra_value(release_of(spec), args, d));
    let arch = facts.architecture.as_deref();
    let none_set = attention.is_none() && prefill.is_none() && decode.is_none();
    if let Some((backend, _)) = hybrid_override(spec, facts, role) {
        attention = Some(backend.into());
    } else if facts.traits.deepseek_v4 {
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

/// Architectures whose model override makes their GDN hybrid pick triton (page 1) or
/// trtllm_mha (page 64) on SM100 (`_qwen3_5_hybrid_overrides`).
const GDN_SM100_ARCHS: &[&str] = &[
    "Qwen3NextForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
];

/// Hybrid-state architectures whose model override picks a backend on SM100 when
/// `--attention-backend` is unset (`_falcon_h1_jet_overrides`, `_granite_moe_hybrid_overrides`
/// with Mamba layers, `_lfm2_overrides`): no page constraint follows, so a page of 1 stays 1.
const HYBRID_SM100_BACKENDS: &[(&str, &str)] = &[
    ("FalconH1ForCausalLM", "triton"),
    ("JetNemotronForCausalLM", "triton"),
    ("JetVLMForConditionalGeneration", "triton"),
    ("GraniteMoeHybridForCausalLM", "flashinfer"),
    ("Lfm2ForCausalLM", "flashinfer"),
    ("Lfm2MoeForCausalLM", "flashinfer"),
];

/// The attention backend, and the page size it forces, that a hybrid-state model's override
/// sets on SM100 (B200) when `--attention-backend` is unset; the same in 0.5.21–0.5.23.
/// Nemotron-H picks trtllm_mha as the default does, or triton under speculative decoding with
/// top-k above 1 (`_nemotron_h_overrides`). The GDN hybrids force their page: trtllm_mha and 64,
/// unless the role keeps a radix cache without the extra-buffer strategy or speculative
/// decoding, where triton and 1 (so a PD prefill runs page 1 while its decode runs 64).
fn hybrid_override(spec: &PDDeploymentSpec, facts: &ModelFacts, role: Role) -> Option<(&'static str, Option<u32>)> {
    let rs = spec.role(role);
    let value = |dest: &str| extra_value(release_of(spec), &rs.template.extra_args, dest);
    let arch = facts.architecture.as_deref()?;
    if facts.state.is_none() || !rs.accelerator.is_some_and(Accelerator::is_blackwell) || value("attention_backend").is_some() {
        return None;
    }
    let speculative = value("speculative_algorithm").is_some();
    if arch == "NemotronHForCausalLM" {
        // `is_attention_backend_not_set`: the phase backends must be unset too.
        let phases_unset = value("prefill_attention_backend").is_none() && value("decode_attention_backend").is_none();
        let topk_one = value("speculative_eagle_topk").is_none_or(|k| k == "1");
        return (phases_unset && speculative && !topk_one).then_some(("triton", None));
    }
    if GDN_SM100_ARCHS.contains(&arch) {
        let radix = value("disable_radix_cache").is_none()
            && (role == Role::Prefill || value("disaggregation_decode_enable_radix_cache").is_some());
        let extra_buffer = value("mamba_radix_cache_strategy").is_some_and(|s| s.starts_with("extra_buffer"));
        let no_buffer_radix = radix && !extra_buffer && !speculative;
        let trtllm = default_backend(spec, facts, role) == "trtllm_mha" && !no_buffer_radix;
        return Some(if trtllm { ("trtllm_mha", Some(64)) } else { ("triton", Some(1)) });
    }
    HYBRID_SM100_BACKENDS.iter().find(|(a, _)| *a == arch).map(|(_, backend)| (*backend, None))
}

/// The page size a hybrid-state model's override forces on `role` (`hybrid_override`), if any:
/// what SGLang's start-up checks of the role see before the backends' page constraints.
pub fn overridden_page_size(spec: &PDDeploymentSpec, facts: &ModelFacts, role: Role) -> Option<u32> {
    hybrid_override(spec, facts, role).and_then(|(_, page)| page)
}

/// `get_default_attn_backend`: fa3 on Hopper and trtllm_mha on SM100 for non-MLA models unless
/// speculative decoding asks for top-k > 1 or a page size above 1 (`is_no_spec_infer_or_topk_one`),
/// else flashinfer; MLA models fa3 on Hopper, flashinfer on SM100.
fn default_backend(spec: &PDDeploymentSpec, facts: &ModelFacts, role: Role) -> &'static str {
    let rs = spec.role(role);
    let topk = extra_value(release_of(spec), &rs.template.extra_args, "speculative_eagle_topk");
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
    let mut page = forced_page_size(facts).or(overridden_page_size(spec, facts, role)).or(requested);
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

/// The compression ratios assumed for a DeepSeek-V4 model without config.json: those of the
/// released checkpoints (c4 and c128 layers). A model with others needs `model.configMapRef`.
pub const V4_ASSUMED_RATIOS: [u32; 2] = [4, 128];

/// The literal value of `name` in a role's engine environment.
fn role_env(spec: &PDDeploymentSpec, role: Role, name: &str) -> Option<String> {
    spec.role(role).template.env.iter().rev().find(|e| e.name == name).and_then(|e| e.value.clone())
}

/// `--dsv4-attn-backend` as DeepSeek-V4's start-up hook resolves `auto` under PD
/// (`_default_dsv4_attention_backend`): FlashMLA-Mega for DeepSeek-V4.1 (`model_type`
/// `deepseek_v41`) on SM100 with an fp8_e4m3 KV cache, unless `SGLANG_DSV4_KV_LAYOUT` is set to
/// something other than auto / v41 / v41_new; FlashMLA otherwise.
pub fn dsv4_attn_backend(spec: &PDDeploymentSpec, facts: &ModelFacts, role: Role) -> String {
    let asked = extra_value(release_of(spec), &spec.role(role).template.extra_args, "dsv4_attn_backend");
    if let Some(b) = asked.filter(|b| b != "auto") {
        return b;
    }
    let v41 = facts.model_type.as_deref().is_some_and(|t| t.starts_with("deepseek_v41"));
    let blackwell = spec.role(role).accelerator.is_some_and(Accelerator::is_blackwell);
    let layout_ok =
        role_env(spec, role, "SGLANG_DSV4_KV_LAYOUT").is_none_or(|l| matches!(l.to_lowercase().as_str(), "auto" | "v41" | "v41_new"));
    let mega = v41 && blackwell && kv_cache_dtype(spec, facts, role) == "fp8_e4m3" && layout_ok;
    if mega { "flashmla_mega" } else { "flashmla" }.to_owned()
}

/// The main-cache layout and the compressed-cache option a DeepSeek-V4 pool is built with
/// (`select_dsv4_kv_layout`), or SGLang's assertion text when the pool cannot be built.
fn dsv4_main_layout(spec: &PDDeploymentSpec, facts: &ModelFacts, role: Role) -> Result<(&'static str, Option<String>), String> {
    let env = |name: &str, default: &str| role_env(spec, role, name).unwrap_or_else(|| default.to_owned()).to_lowercase();
    let (mut mode, option) = (env("SGLANG_DSV4_KV_LAYOUT", "v4"), env("SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "auto"));
    let backend = dsv4_attn_backend(spec, facts, role);
    if backend == "flashmla_mega" && mode != "v41_new" {
        mode = "v41".into();
    }
    if backend == "trtllm" {
        if !matches!(mode.as_str(), "auto" | "v4") || !matches!(option.as_str(), "auto" | "fp8") {
            return Err("trtllm uses uniform FP8 pools, not the packed V4.1 KV layouts".into());
        }
        return Ok(("uniform_fp8", None));
    }
    let option = (option != "auto").then_some(option);
    let sm100 = spec.role(role).accelerator.is_some_and(Accelerator::is_blackwell);
    match mode.as_str() {
        "v4" => Ok(("v4", option)),
        "auto" if !sm100 => Ok(("v4", None)),
        "v41" | "v41_new" | "auto" if !sm100 => Err("the V4.1 KV cache layouts need an SM100 / SM103 GPU".into()),
        "v41_new" => Ok(("v41_new", option)),
        "v41" | "auto" => Ok(("v41", option)),
        other => Err(format!("unknown SGLANG_DSV4_KV_LAYOUT='{other}'")),
    }
}

/// One compression ratio's cache layout next to the main one (`resolve_compressed_kv_layout`):
/// V4 pairs only with V4; V4.1 keeps ratios 1 and 2 in fp4 (or all with the `fp4` option).
fn dsv4_compressed_layout(main: &str, ratio: u32, option: Option<&str>) -> Result<&'static str, String> {
    if let Some(o) = option.filter(|o| !matches!(*o, "fp8" | "fp4")) {
        return Err(format!("unknown compressed KV layout '{o}'"));
    }
    if main == "v4" {
        return if option == Some("fp4") { Err("the V4 main cache only pairs with V4 caches".into()) } else { Ok("v4") };
    }
    let fp4 = option == Some("fp4") || (option.is_none() && matches!(ratio, 1 | 2));
    Ok(match (fp4, main == "v41_new") {
        (true, true) => "v41_fp4_new",
        (true, false) => "v41_fp4",
        (false, true) => "v41_new",
        (false, false) => "v41",
    })
}

/// The KV layout a role's DeepSeek-V4 pool reports in the handshake (`pd_kv_layout`): the
/// main layout, then `c<ratio>:<layout>` per distinct non-zero compression ratio, ascending;
/// `uniform_fp8` alone for the trtllm backend. `Ok(None)` for every other model; `Err` with
/// SGLang's assertion text when the pool cannot be built (after the weights load).
pub fn dsv4_kv_layout(spec: &PDDeploymentSpec, facts: &ModelFacts, role: Role) -> Result<Option<String>, String> {
    if !facts.traits.deepseek_v4 {
        return Ok(None);
    }
    let (main, option) = dsv4_main_layout(spec, facts, role)?;
    if main == "uniform_fp8" {
        return Ok(Some(main.to_owned()));
    }
    let ratios = facts.compress_ratios.clone().unwrap_or_else(|| V4_ASSUMED_RATIOS.to_vec());
    let mut parts = vec![main.to_owned()];
    for r in ratios {
        parts.push(format!("c{r}:{}", dsv4_compressed_layout(main, r, option.as_deref())?));
    }
    Ok(Some(parts.join(",")))
}

/// What a role reports as `kv_layout`; a pool that cannot be built reports none (admission
/// refuses that spec with `dsv4_kv_layout`'s error).
fn kv_layout(spec: &PDDeploymentSpec, facts: &ModelFacts, role: Role) -> Option<String> {
    dsv4_kv_layout(spec, facts, role).ok().flatten()
}

/// The DeepSeek-V4.1 DSpark speculative layout is reported (`get_dsv41_spec_layout`) when the
/// role runs `--speculative-algorithm DSPARK` and the model has ratio-2 layers (assumed for a
/// DeepSeek-V4-family model when config.json is not known).
pub fn dspark(spec: &PDDeploymentSpec, facts: &ModelFacts, role: Role) -> bool {
    let algo = extra_value(release_of(spec), &spec.role(role).template.extra_args, "speculative_algorithm");
    let ratio_two = match &facts.compress_ratios {
        Some(r) => r.contains(&2),
        None => facts.traits.deepseek_v4,
    };
    ratio_two && algo.is_some_and(|a| a.eq_ignore_ascii_case("DSPARK"))
}

/// What the decode's handshake compares (issue #6's decode JSON, `decode.json` of the sidecar),
/// as SGLang's decode would report it for this spec, on a `pool` KV pool.
pub fn decode_topology_for(spec: &PDDeploymentSpec, facts: &ModelFacts, pool: PoolKind) -> DecodeTopology {
    let p = parallelism(&spec.decode.parallelism, facts);
    let kv = &spec.kv_transfer;
    // A hybrid-state pool moves its recurrent state as SGLang's `mamba` state type.
    let mut state_types: Vec<String> = facts.state.map(|_| "mamba".to_owned()).into_iter().collect();
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
        kv_layout: kv_layout(spec, facts, Role::Decode),
        dsv41_spec_layout: None,
        dspark: dspark(spec, facts, Role::Decode),
        state_types,
        decode_allocation_policy: kv.decode_allocation_policy.to_string(),
        release: release_of(spec),
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
        dsv41_spec_layout: if dspark(spec, facts, Role::Prefill) { dspark_layout_stand_in() } else { Value::Null },
        kv_layout: kv_layout(spec, facts, Role::Prefill).map_or(Value::Null, Value::from),
        decode_allocation_policy: Value::from(spec.kv_transfer.decode_allocation_policy.to_string()),
        enable_kv_cache_sharding: Value::Bool(rs.enable_kv_cache_sharding),
        prefill_http_port: Some(DEFAULT_HTTP_PORT.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(arch: &str) -> ModelFacts {
        let m = pd_api::ModelSpec { path: "m".into(), architecture: Some(arch.into()), ..Default::default() };
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

    fn v4_spec(model_type: &str, ratios: &str, acc: Accelerator, env: &[(&str, &str)], extra: &[&str]) -> (PDDeploymentSpec, ModelFacts) {
        let cfg = format!(r#"{{"architectures":["DeepseekV4ForCausalLM"],"model_type":"{model_type}","compress_ratios":{ratios}}}"#);
        let env: Vec<_> = env.iter().map(|(n, v)| serde_json::json!({"name": n, "value": v})).collect();
        let role = serde_json::json!({"parallelism": {"tp": 8}, "accelerator": acc.as_str(), "template": {"env": env, "extraArgs": extra}});
        let spec: PDDeploymentSpec = serde_json::from_value(serde_json::json!({
            "model": {"path": "/m"}, "kvTransfer": {"pageSize": 256}, "prefill": role, "decode": role,
        }))
        .unwrap();
        let facts = crate::model::resolve(&spec.model, Some(&crate::model::HfConfig::parse(&cfg).unwrap()));
        (spec, facts)
    }

    #[test]
    fn deepseek_v4_reports_its_main_and_compressed_layouts() {
        let layout = |mt: &str, acc, env: &[(&str, &str)], extra: &[&str]| {
            let (s, f) = v4_spec(mt, "[0, 4, 128, 0, 2, 4]", acc, env, extra);
            dsv4_kv_layout(&s, &f, Role::Decode)
        };
        let ok = |v: &str| Ok(Some(v.to_owned()));
        // The defaults: the V4 layout everywhere, one entry per distinct non-zero ratio, ascending.
        assert_eq!(layout("deepseek_v4", Accelerator::B200, &[], &[]), ok("v4,c2:v4,c4:v4,c128:v4"));
        // DeepSeek-V4.1 on SM100 resolves FlashMLA-Mega, whose V4.1 layout keeps ratios 1 and 2 in fp4.
        assert_eq!(layout("deepseek_v41", Accelerator::B200, &[], &[]), ok("v41,c2:v41_fp4,c4:v41,c128:v41"));
        assert_eq!(layout("deepseek_v41", Accelerator::H200, &[], &[]), ok("v4,c2:v4,c4:v4,c128:v4"));
        let new_fp4 = [("SGLANG_DSV4_KV_LAYOUT", "v41_new"), ("SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "fp4")];
        assert_eq!(layout("deepseek_v4", Accelerator::B200, &new_fp4, &[]), ok("v41_new,c2:v41_fp4_new,c4:v41_fp4_new,c128:v41_fp4_new"));
        // A set SGLANG_DSV4_KV_LAYOUT=v4 keeps V4.1 on FlashMLA and the V4 layout.
        assert_eq!(layout("deepseek_v41", Accelerator::B200, &[("SGLANG_DSV4_KV_LAYOUT", "v4")], &[]), ok("v4,c2:v4,c4:v4,c128:v4"));
        // SGLang's pool refuses these after the weights load.
        let need_sm100 = Err("the V4.1 KV cache layouts need an SM100 / SM103 GPU".to_owned());
        assert_eq!(layout("deepseek_v4", Accelerator::H100, &[("SGLANG_DSV4_KV_LAYOUT", "v41")], &[]), need_sm100);
        let fp4_on_v4 = layout("deepseek_v4", Accelerator::H100, &[("SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "fp4")], &[]);
        assert_eq!(fp4_on_v4, Err("the V4 main cache only pairs with V4 caches".to_owned()));
        assert_eq!(layout("deepseek_v4", Accelerator::B200, &[], &["--dsv4-attn-backend", "trtllm"]), ok("uniform_fp8"));
        // Other models report none.
        assert_eq!(
            dsv4_kv_layout(&v4_spec("x", "[]", Accelerator::H200, &[], &[]).0, &facts("DeepseekV3ForCausalLM"), Role::Decode),
            Ok(None)
        );
    }

    #[test]
    fn the_rendered_v4_pair_agrees_and_differs_where_sglang_would() {
        let (spec, f) = v4_spec("deepseek_v41", "[0, 4, 128]", Accelerator::B200, &[], &[]);
        assert!(crate::handshake::core::handshake(&decode_topology(&spec, &f), &prefill_info(&spec, &f)).is_ok());
        // A Hopper prefill keeps V4 while the B200 decode resolves V4.1: check #4.
        let mut mixed = spec.clone();
        mixed.prefill.accelerator = Some(Accelerator::H200);
        let err = crate::handshake::core::handshake(&decode_topology(&mixed, &f), &prefill_info(&mixed, &f)).unwrap_err();
        assert!(
            err.error.starts_with(
                "KV layout mismatch: prefill server has kv_layout=v4,c4:v4,c128:v4, but decode server has kv_layout=v41,c4:v41,c128:v41."
            ),
            "{err:?}"
        );
    }

    #[test]
    fn a_dspark_decode_takes_the_prefills_layout_and_still_checks_tp() {
        let dspark = ["--speculative-algorithm", "DSPARK"];
        let (mut spec, f) = v4_spec("deepseek_v41", "[0, 2, 4, 128]", Accelerator::B200, &[], &dspark);
        let hs = |s: &PDDeploymentSpec| crate::handshake::core::handshake(&decode_topology(s, &f), &prefill_info(s, &f));
        assert!(decode_topology(&spec, &f).dspark);
        assert!(hs(&spec).is_ok());
        // The engine's own layout, whatever it is, is compared by the engine: any prefill layout passes #5.
        let mut d = decode_topology(&spec, &f);
        d.dsv41_spec_layout = None;
        let mut p = prefill_info(&spec, &f);
        p.dsv41_spec_layout = serde_json::json!({"num_draft_tokens": 4, "kv_layer_ids": [0, 1]});
        assert!(crate::handshake::core::handshake(&d, &p).is_ok());
        // A prefill without DSpark: every key of the decode's layout differs, as in SGLang.
        spec.prefill.template.extra_args.clear();
        let err = hs(&spec).unwrap_err();
        assert!(err.error.starts_with("DeepSeek-V4.1 DSpark PD layout mismatch (compression_ratios, kv_item_lens, kv_layer_ids, num_draft_tokens, state_item_lens, state_types)"), "{err:?}");
        // Without ratio-2 layers the algorithm reports no layout (`get_dsv41_spec_layout`).
        let (s, f) = v4_spec("deepseek_v41", "[0, 4, 128]", Accelerator::B200, &[], &dspark);
        assert!(!decode_topology(&s, &f).dspark);
    }

    /// A tp 4 / tp 4 pair of `config` on `acc` with `page` and each role's extra arguments.
    fn hybrid_pair(config: &str, acc: Accelerator, page: Option<u32>, prefill: &[&str], decode: &[&str]) -> (PDDeploymentSpec, ModelFacts) {
        let role =
            |extra: &[&str]| serde_json::json!({"parallelism": {"tp": 4}, "accelerator": acc.as_str(), "template": {"extraArgs": extra}});
        let spec: PDDeploymentSpec = serde_json::from_value(serde_json::json!({
            "model": {"path": "/models/m"}, "kvTransfer": {"pageSize": page}, "prefill": role(prefill), "decode": role(decode),
        }))
        .unwrap();
        let facts = crate::model::resolve(&spec.model, Some(&crate::model::HfConfig::parse(config).unwrap()));
        (spec, facts)
    }

    fn pages(spec: &PDDeploymentSpec, facts: &ModelFacts) -> (i64, Option<i64>) {
        (decode_topology(spec, facts).page_size, prefill_info(spec, facts).page_size)
    }

    #[test]
    fn mamba_hybrids_on_b200_run_the_page_their_override_keeps() {
        use crate::model::tests::{FALCON_H1, GRANITE_4_H, NEMOTRON_H};
        // Falcon-H1 (triton) and Granite-4.0-H (flashinfer) keep page 1 on B200: no trtllm_mha.
        for cfg in [FALCON_H1, GRANITE_4_H] {
            let (s, f) = hybrid_pair(cfg, Accelerator::B200, Some(1), &[], &[]);
            assert_eq!(pages(&s, &f), (1, Some(1)));
            assert!(crate::handshake::core::handshake(&decode_topology(&s, &f), &prefill_info(&s, &f)).is_ok());
            // Unset, both resolve 1 by themselves.
            let (s, f) = hybrid_pair(cfg, Accelerator::B200, None, &[], &[]);
            assert_eq!(unset_page_size(&s, &f), Ok(1));
        }
        // Nemotron-H keeps trtllm_mha on B200, which turns page 1 into 64 on both roles.
        let (s, f) = hybrid_pair(NEMOTRON_H, Accelerator::B200, Some(1), &[], &[]);
        assert_eq!(pages(&s, &f), (64, Some(64)));
        // Under speculative decoding with top-k 4 its override picks triton: page 1 stays.
        let spec_topk = ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4"];
        let (s, f) = hybrid_pair(NEMOTRON_H, Accelerator::B200, Some(1), &spec_topk, &spec_topk);
        assert_eq!(pages(&s, &f), (1, Some(1)));
        assert_eq!(attention_backends(&s, &f, Role::Decode)[0].as_deref(), Some("triton"));
        // Not when a phase backend is set (`is_attention_backend_not_set`): SGLang's default then.
        let phase = [&spec_topk[..], &["--decode-attention-backend", "flashinfer"]].concat();
        let (s, f) = hybrid_pair(NEMOTRON_H, Accelerator::B200, Some(1), &phase, &phase);
        assert_eq!(attention_backends(&s, &f, Role::Decode)[0].as_deref(), Some("flashinfer"));
        // An explicit attention backend is left alone: Falcon-H1 on trtllm_mha pages at 64.
        let trtllm = ["--attention-backend", "trtllm_mha"];
        let (s, f) = hybrid_pair(FALCON_H1, Accelerator::B200, Some(1), &trtllm, &trtllm);
        assert_eq!(pages(&s, &f), (64, Some(64)));
        // Hopper: the requested page, as for any GQA model.
        let (s, f) = hybrid_pair(FALCON_H1, Accelerator::H200, Some(1), &[], &[]);
        assert_eq!(pages(&s, &f), (1, Some(1)));
    }

    #[test]
    fn gdn_hybrids_on_b200_page_the_prefill_at_1() {
        let qwen3_next = crate::model::tests::QWEN3_NEXT;
        // The prefill keeps its radix cache without extra buffer: triton and page 1; the PD
        // decode has no radix cache: trtllm_mha and page 64, whatever was asked.
        let (s, f) = hybrid_pair(qwen3_next, Accelerator::B200, Some(16), &[], &[]);
        assert_eq!(pages(&s, &f), (64, Some(1)));
        let err = crate::handshake::core::handshake(&decode_topology(&s, &f), &prefill_info(&s, &f)).unwrap_err();
        assert_eq!(err.check.field(), "spec.kvTransfer.pageSize", "{err:?}");
        // The extra-buffer strategy on the prefill keeps trtllm_mha there too: 64 on both.
        let extra = ["--mamba-radix-cache-strategy", "extra_buffer"];
        let (s, f) = hybrid_pair(qwen3_next, Accelerator::B200, Some(16), &extra, &[]);
        assert_eq!(pages(&s, &f), (64, Some(64)));
        // So does a prefill without radix cache.
        let (s, f) = hybrid_pair(qwen3_next, Accelerator::B200, None, &["--disable-radix-cache"], &[]);
        assert_eq!(pages(&s, &f), (64, Some(64)));
        // Hopper: no override.
        let (s, f) = hybrid_pair(qwen3_next, Accelerator::H100, Some(16), &[], &[]);
        assert_eq!(pages(&s, &f), (16, Some(16)));
    }

    #[test]
    fn a_hybrid_state_pool_reports_mamba_state_and_refuses_decode_dcp() {
        let (mut s, f) = hybrid_pair(crate::model::tests::NEMOTRON_H, Accelerator::H200, Some(64), &[], &[]);
        assert_eq!(decode_topology(&s, &f).state_types, vec!["mamba".to_owned()]);
        assert!(decode_topology(&s, &facts("Qwen2ForCausalLM")).state_types.is_empty());
        // DCP shards MLA latent caches only: a hybrid Mamba GQA pool is neither MLA nor hybrid MLA.
        s.decode.parallelism.dcp = 2;
        let err = crate::handshake::core::handshake(&decode_topology(&s, &f), &prefill_info(&s, &f)).unwrap_err();
        assert_eq!(err.check, crate::handshake::core::Check::DcpNeedsMla, "{err:?}");
    }

    #[test]
    fn published_mamba_hybrids_are_admitted_at_tp_4_and_named() {
        use crate::model::tests::{FALCON_H1, GRANITE_4_H, NEMOTRON_H};
        for cfg in [NEMOTRON_H, FALCON_H1, GRANITE_4_H] {
            for (acc, page) in [(Accelerator::B200, Some(1)), (Accelerator::B200, None), (Accelerator::H100, Some(64))] {
                let (s, f) = hybrid_pair(cfg, acc, page, &[], &[]);
                let findings = crate::validate::validate_with_facts("m", &s, &f);
                assert!(crate::validate::is_valid(&findings), "{acc:?} {page:?}: {findings:?}");
                assert!(f.describe("/models/m").ends_with("hybrid state: Mamba2)"));
            }
        }
    }
}
