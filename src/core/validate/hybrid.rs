//! SGLang's start-up rules for the radix cache of hybrid-state models: which Mamba cache
//! strategy a role resolves (`_mamba_radix_cache_resolution` in `srt/arg_groups/overrides.py`)
//! and what the `no_buffer` strategy refuses (`validate_mamba_no_buffer` in
//! `srt/arg_groups/mamba_hook.py`). The same in 0.5.21, 0.5.22 and 0.5.23.

use super::Finding;
use crate::model::{ModelFacts, StateKind};
use crate::release::release_of;
use crate::sglang_args::extra_value;
use pd_api::{PDDeploymentSpec, Role};

/// SGLang's texts.
pub mod texts {
    pub const NO_BUFFER_PAGE: &str = "no_buffer only supports page_size=1.";
    pub const NO_BUFFER_OVERLAP: &str = "no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True.";
}

/// Architectures whose prefix cache is the hybrid-Mamba radix cache (`_MAMBA_RADIX_CACHE_ARCHS`);
/// Granite-4.0 hybrids join when they have Mamba layers.
const MAMBA_RADIX_ARCHS: &[&str] = &[
    "BailingMoeV2_5ForCausalLM",
    "BailingMoeV3ForCausalLM",
    "BailingMoeV3VLForConditionalGeneration",
    "FalconH1ForCausalLM",
    "Glm5NextForConditionalGeneration",
    "InternS2MobiusForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration",
    "JetNemotronForCausalLM",
    "JetVLMForConditionalGeneration",
    "KimiK3ForConditionalGeneration",
    "KimiLinearForCausalLM",
    "Lfm2ForCausalLM",
    "Lfm2MoeForCausalLM",
    "MiniCPMV4_6ForConditionalGeneration",
    "NemotronHForCausalLM",
    "NemotronHPuzzleForCausalLM",
    "NemotronH_Omni_Reasoning_V3",
    "Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen4ExpForConditionalGeneration",
    "ZayaForCausalLM",
];

/// The radix-cache architectures that do not support the extra-buffer strategy
/// (`_MAMBA_EXTRA_BUFFER_ARCHS` lacks them): `auto` resolves `no_buffer` for them.
const NO_EXTRA_BUFFER_ARCHS: &[&str] = &[
    "InternS2MobiusForConditionalGeneration",
    "JetNemotronForCausalLM",
    "JetVLMForConditionalGeneration",
    "Lfm2ForCausalLM",
    "Lfm2MoeForCausalLM",
    "ZayaForCausalLM",
];

/// Whether `role` runs the `no_buffer` Mamba cache strategy, and whether that was asked for
/// explicitly: only on a role that keeps a radix cache (a PD decode does not, unless
/// `--disaggregation-decode-enable-radix-cache`), for a hybrid-Mamba radix architecture.
fn no_buffer(spec: &PDDeploymentSpec, facts: &ModelFacts, role: Role) -> Option<bool> {
    let value = |dest: &str| extra_value(release_of(spec), &spec.role(role).template.extra_args, dest);
    let arch = facts.architecture.as_deref()?;
    let granite = arch == "GraniteMoeHybridForCausalLM" && facts.state == Some(StateKind::Mamba2);
    let radix =
        value("disable_radix_cache").is_none() && (role == Role::Prefill || value("disaggregation_decode_enable_radix_cache").is_some());
    if !radix || !(granite || MAMBA_RADIX_ARCHS.contains(&arch)) {
        return None;
    }
    match value("mamba_radix_cache_strategy").as_deref() {
        Some("no_buffer") => Some(true),
        None | Some("auto") => {
            // `auto` takes the extra buffer where the architecture and the triton linear-attention
            // backend support it (overlap or paging want it), else `no_buffer`.
            let triton = value("linear_attn_backend").is_none_or(|b| b == "triton");
            (NO_EXTRA_BUFFER_ARCHS.contains(&arch) || !triton).then_some(false)
        }
        Some(_) => None,
    }
}

/// `validate_mamba_no_buffer` on a role that runs `no_buffer`: page size 1 only (the page the
/// model override forces, else the one the operator passes), and an explicit `no_buffer` needs
/// `--disable-overlap-schedule` (`auto` turns overlap off itself).
pub(super) fn check_mamba_no_buffer(role: Role, spec: &PDDeploymentSpec, facts: &ModelFacts, out: &mut Vec<Finding>) {
    let Some(explicit) = no_buffer(spec, facts, role) else { return };
    let args = &spec.role(role).template.extra_args;
    if explicit && extra_value(release_of(spec), args, "disable_overlap_schedule").is_none() {
        out.push(Finding::error(
            "mamba-no-buffer-overlap",
            role.field("template.extraArgs"),
            texts::NO_BUFFER_OVERLAP,
            "add --disable-overlap-schedule, or leave --mamba-radix-cache-strategy at auto",
        ));
    }
    let requested = spec.kv_transfer.page_size.or_else(|| crate::resolve::unset_page_size(spec, facts).ok());
    let page = crate::resolve::overridden_page_size(spec, facts, role).or(requested);
    if let Some(page) = page.filter(|p| *p > 1) {
        out.push(Finding::error(
            "mamba-no-buffer-page",
            "spec.kvTransfer.pageSize",
            format!("{} (page size {page})", texts::NO_BUFFER_PAGE),
            format!("set spec.kvTransfer.pageSize: 1, or turn the {} radix cache off (--disable-radix-cache)", role.as_str()),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pd_api::Accelerator;

    fn judged(config: &str, page: Option<u32>, prefill: &[&str]) -> Vec<Finding> {
        let role = |extra: &[&str]| serde_json::json!({"parallelism": {"tp": 4}, "accelerator": Accelerator::H100.as_str(), "template": {"extraArgs": extra}});
        let spec: PDDeploymentSpec = serde_json::from_value(serde_json::json!({
            "model": {"path": "/models/m"}, "kvTransfer": {"pageSize": page}, "prefill": role(prefill), "decode": role(&[]),
        }))
        .unwrap();
        let facts = crate::model::resolve(&spec.model, Some(&crate::model::HfConfig::parse(config).unwrap()));
        let mut out = Vec::new();
        for role in [Role::Prefill, Role::Decode] {
            check_mamba_no_buffer(role, &spec, &facts, &mut out);
        }
        out
    }

    use crate::model::tests::LFM2;

    #[test]
    fn an_architecture_without_extra_buffer_pages_its_prefill_at_1() {
        let rules = |f: Vec<Finding>| f.iter().map(|f| f.rule).collect::<Vec<_>>();
        // LFM2 resolves no_buffer on the prefill: page 64 fails its start-up, page 1 starts.
        let findings = judged(LFM2, Some(64), &[]);
        assert_eq!(rules(findings.clone()), ["mamba-no-buffer-page"]);
        assert!(findings[0].message.starts_with(texts::NO_BUFFER_PAGE), "{findings:?}");
        assert!(judged(LFM2, Some(1), &[]).is_empty());
        // Without the prefill's radix cache there is no Mamba cache strategy to resolve.
        assert!(judged(LFM2, Some(64), &["--disable-radix-cache"]).is_empty());
        // Nemotron-H takes the extra buffer: page 64 starts.
        let nemotron = crate::model::tests::NEMOTRON_H;
        assert!(judged(nemotron, Some(64), &[]).is_empty());
        // Asked for explicitly, no_buffer also wants overlap scheduling off.
        let explicit = judged(nemotron, Some(1), &["--mamba-radix-cache-strategy", "no_buffer"]);
        assert_eq!(rules(explicit), ["mamba-no-buffer-overlap"]);
        let off = ["--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"];
        assert!(judged(nemotron, Some(1), &off).is_empty());
        assert_eq!(rules(judged(nemotron, Some(64), &off)), ["mamba-no-buffer-page"]);
        // A model without hybrid state has no Mamba cache.
        let llama = r#"{"architectures":["LlamaForCausalLM"],"num_attention_heads":32,"num_key_value_heads":8}"#;
        assert!(judged(llama, Some(64), &["--mamba-radix-cache-strategy", "no_buffer"]).is_empty());
    }
}
