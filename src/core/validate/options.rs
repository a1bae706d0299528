//! The options of SGLang's PD recipes (DeepSeek, Qwen, GLM, Kimi, GPT-OSS), judged at admission
//! with each release's start-up preconditions (`srt/arg_groups/*.py`): two-batch and
//! single-batch overlap, EAGLE-family speculative decoding's three numbers, the DP LM head, the
//! MoE all-to-all backends' attention-DP widths. A precondition SGLang fixes itself with a warning
//! (a2a backends setting `ep_size` to `tp_size`, `--speculative-num-draft-tokens` set to steps + 1
//! at top-k 1, `--enable-dp-lm-head` dropped without DP) is not refused. The rest of extraArgs is
//! left to the engine dry run, and `not_judged` names it.

use super::{Finding, texts};
use crate::model::ModelFacts;
use crate::release::Release;
use crate::sglang_args::{extra_value, read};
use pd_api::{EngineType, PDDeploymentSpec, Parallelism, Role, RoleSpec};

/// `--enable-two-batch-overlap` with no EP all-to-all backend and no attention DP.
pub const RULE_TBO_NEEDS_ATTN_DP: &str = "two-batch-overlap-needs-attn-dp";
/// Two-batch or single-batch overlap on an all-to-all backend that has no overlap hooks.
pub const RULE_OVERLAP_A2A: &str = "overlap-a2a-backend";
/// EAGLE, EAGLE3, NEXTN (MTP) or STANDALONE with an incomplete set of its three numbers.
pub const RULE_SPECULATIVE_PARAMS: &str = "speculative-params";
/// `--enable-dp-lm-head` with replica DP and no attention DP.
pub const RULE_DP_LM_HEAD: &str = "dp-lm-head-needs-attn-dp";
/// DSpark under attention DP without `--enable-dp-lm-head`.
pub const RULE_DSPARK_DP_LM_HEAD: &str = "dspark-dp-lm-head";
/// An MoE all-to-all backend whose attention-DP width SGLang asserts (pplx, flashinfer,
/// flashinfer_megamoe).
pub const RULE_A2A_ATTN_DP: &str = "a2a-attn-dp";
/// `--flashinfer-a2a-dispatch-type` without the flashinfer all-to-all backend.
pub const RULE_FLASHINFER_DISPATCH: &str = "flashinfer-a2a-dispatch-type";
/// Ours, a warning of the webhook: extraArgs options no admission rule reads.
pub const RULE_NOT_JUDGED: &str = "extra-args-not-judged";

/// The argparse destinations admission reads in extraArgs (besides `MANAGED_DESTS`, which it
/// refuses there): every other option is judged by the engine dry run only.
pub const JUDGED_DESTS: &[&str] = &[
    // validate's other rules and resolve's start-up resolution
    "attention_backend",
    "prefill_attention_backend",
    "decode_attention_backend",
    "dsv4_attn_backend",
    "dsa_prefill_backend",
    "dsa_decode_backend",
    "disable_radix_cache",
    "chunked_prefill_size",
    "log_level",
    "enable_multi_layer_eagle",
    // compared between the roles (PAIRED_FLAGS)
    "disaggregation_enable_kv_checksum",
    "disable_hybrid_swa_memory",
    // this module
    "enable_two_batch_overlap",
    "enable_single_batch_overlap",
    "moe_a2a_backend",
    "moe_runner_backend",
    "enable_waterfill",
    "ep_join_mode",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_draft_model_path",
    "speculative_adaptive",
    "enable_dp_lm_head",
    "flashinfer_a2a_dispatch_type",
];

/// One role's extraArgs as its release's argparse reads them.
struct Args<'a> {
    release: Release,
    args: &'a [String],
}

impl Args<'_> {
    fn value(&self, dest: &str) -> Option<String> {
        extra_value(self.release, self.args, dest)
    }
    fn set(&self, dest: &str) -> bool {
        self.value(dest).is_some()
    }
    /// `spec.<role>.template.extraArgs[i]` of the last occurrence of `dest`.
    fn field(&self, role: Role, dest: &str) -> String {
        let reading = read(self.release, self.args.iter().map(String::as_str).enumerate());
        match reading.occurrences.iter().rev().find(|o| o.spec.dest == dest) {
            Some(o) => role.field(&format!("template.extraArgs[{}]", o.index)),
            None => role.field("template.extraArgs"),
        }
    }
    /// The MoE all-to-all backend as `_a2a_backend_overrides` and the megamoe runner alias leave
    /// it: Waterfill forces `deepep`, `--moe-runner-backend megamoe` means `megamoe`.
    fn a2a_backend(&self) -> String {
        let asked = self.value("moe_a2a_backend").unwrap_or_else(|| "none".into());
        if self.set("enable_waterfill") && !matches!(asked.as_str(), "deepep" | "megamoe") {
            return "deepep".into();
        }
        if self.value("moe_runner_backend").as_deref() == Some("megamoe") {
            return "megamoe".into();
        }
        asked
    }
}

/// Every rule of this module on one role (its sizes already checked positive).
pub(super) fn check(role: Role, rs: &RoleSpec, release: Release, facts: &ModelFacts, out: &mut Vec<Finding>) {
    let a = Args { release, args: &rs.template.extra_args };
    let p = &rs.parallelism;
    // SGLang's widths: its DeepSeek CP layouts fold replica DP into attention DP.
    let r = crate::resolve::parallelism(p, facts);
    // `attn_dp_enabled_of`: attention DP, or an Elastic EP joiner that joins one.
    let attn_dp = r.attn_dp > 1 || a.value("ep_join_mode").as_deref() == Some("scale");
    check_overlap(role, &a, attn_dp, out);
    check_speculative(role, &a, facts, out);
    check_dp_lm_head(role, &a, &r, attn_dp, out);
    check_a2a_widths(role, &a, &r, facts, attn_dp, out);
}

/// Two-batch and single-batch overlap (`check_two_batch_overlap`, `handle_a2a_moe`,
/// `check_mega_moe_compat`).
fn check_overlap(role: Role, a: &Args, attn_dp: bool, out: &mut Vec<Finding>) {
    let (tbo, sbo) = (a.set("enable_two_batch_overlap"), a.set("enable_single_batch_overlap"));
    if !tbo && !sbo {
        return;
    }
    let backend = a.a2a_backend();
    let overlap_field = a.field(role, if tbo { "enable_two_batch_overlap" } else { "enable_single_batch_overlap" });
    if tbo && backend == "none" && !attn_dp {
        let text = if a.release.has_attn_dp_size() { texts::TBO_NEEDS_ATTN_DP } else { texts::TBO_NEEDS_ATTN_DP_0_5_21 };
        out.push(Finding::error(
            RULE_TBO_NEEDS_ATTN_DP,
            overlap_field.clone(),
            text,
            format!(
                "give the {} an EP all-to-all backend (e.g. `--moe-a2a-backend deepep`, as SGLang's DeepSeek PD recipes do) or attention DP (parallelism.attnDp > 1), or drop --enable-two-batch-overlap",
                role.as_str()
            ),
        ));
    }
    let text = match backend.as_str() {
        "deepep_v2" => texts::OVERLAP_DEEPEP_V2,
        // `check_mega_moe_compat` reads the option as written; the runner alias is left to the dry run.
        "megamoe" if a.value("moe_a2a_backend").as_deref() == Some("megamoe") => texts::OVERLAP_MEGAMOE,
        _ => return,
    };
    out.push(Finding::error(
        RULE_OVERLAP_A2A,
        overlap_field,
        text,
        format!(
            "drop --enable-two-batch-overlap and --enable-single-batch-overlap, or use --moe-a2a-backend deepep with them (not {backend})"
        ),
    ));
}

/// EAGLE-family speculative decoding (`_handle_eagle_family`): SGLang picks steps, top-k and
/// draft tokens itself only when all three are unset; at top-k 1 it sets draft tokens to
/// steps + 1 itself (a warning). Left to the dry run: `--speculative-adaptive` (it fills them
/// from its config) and EAGLE / NEXTN with a draft model of unknown architecture for a target
/// that may be Gemma 4 (a Gemma 4 assistant draft makes it FROZEN_KV_MTP, which checks none).
fn check_speculative(role: Role, a: &Args, facts: &ModelFacts, out: &mut Vec<Finding>) {
    let Some(algo) = a.value("speculative_algorithm").map(|s| s.to_uppercase()) else { return };
    if !matches!(algo.as_str(), "EAGLE" | "EAGLE3" | "NEXTN" | "STANDALONE") || a.set("speculative_adaptive") {
        return;
    }
    let may_be_gemma4 = facts.architecture.as_deref().is_none_or(|arch| arch.starts_with("Gemma4"));
    if matches!(algo.as_str(), "EAGLE" | "NEXTN") && a.set("speculative_draft_model_path") && may_be_gemma4 {
        return;
    }
    let (steps, topk, draft) =
        (a.value("speculative_num_steps"), a.value("speculative_eagle_topk"), a.value("speculative_num_draft_tokens"));
    let fix = "set all three (`--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4`, SGLang's DeepSeek MTP recipe) or none of them (SGLang then picks them)";
    let (message, dest) = match (&steps, &topk, &draft) {
        (None, Some(_), _) | (None, _, Some(_)) => (
            format!("{} unset (--speculative-algorithm {algo})", texts::EAGLE_STEPS_UNSET),
            if topk.is_some() { "speculative_eagle_topk" } else { "speculative_num_draft_tokens" },
        ),
        (Some(_), None, _) => (
            format!(
                "{} (--speculative-algorithm {algo} with --speculative-num-steps and no --speculative-eagle-topk: SGLang fills none of the three then, and compares the top-k)",
                texts::EAGLE_TOPK_UNSET
            ),
            "speculative_num_steps",
        ),
        _ => return,
    };
    out.push(Finding::error(RULE_SPECULATIVE_PARAMS, a.field(role, dest), message, fix));
}

/// The DP LM head (`_data_parallelism_defaults`, `_dp_lm_head_validation`, `_handle_dspark`):
/// without any DP SGLang drops `--enable-dp-lm-head` itself; with replica DP it asserts
/// attention DP. DSpark under attention DP needs it.
fn check_dp_lm_head(role: Role, a: &Args, r: &Parallelism, attn_dp: bool, out: &mut Vec<Finding>) {
    let lm_head = a.set("enable_dp_lm_head");
    // `num_dp_ranks_of` is dp × attnDp; a joiner keeps it (`ep_join_mode != "scale"`).
    if lm_head && r.dp.saturating_mul(r.attn_dp) > 1 && !attn_dp {
        let text = if a.release.has_attn_dp_size() { texts::DP_LM_HEAD } else { texts::DP_LM_HEAD_0_5_21 };
        out.push(Finding::error(
            RULE_DP_LM_HEAD,
            a.field(role, "enable_dp_lm_head"),
            text,
            format!("drop --enable-dp-lm-head from the {}, or use attention DP (attnDp) instead of dp replicas", role.as_str()),
        ));
    }
    let dspark = a.value("speculative_algorithm").is_some_and(|s| s.eq_ignore_ascii_case("DSPARK"));
    if dspark && r.attn_dp > 1 && !lm_head {
        out.push(Finding::error(
            RULE_DSPARK_DP_LM_HEAD,
            a.field(role, "speculative_algorithm"),
            texts::DSPARK_DP_LM_HEAD,
            format!("add --enable-dp-lm-head to the {}'s extraArgs", role.as_str()),
        ));
    }
}

/// The all-to-all backends' attention-DP widths (`handle_a2a_moe`) and the FlashInfer dispatch
/// type. DeepEP, Mooncake EP, MoRI and the other EP-spanning backends set `ep_size` to `tp_size`
/// themselves (logged); their other checks (DeepEP v2's architectures and runners, MegaMOE's
/// GPU, dispatch-token budgets) are the dry run's.
fn check_a2a_widths(role: Role, a: &Args, r: &Parallelism, facts: &ModelFacts, attn_dp: bool, out: &mut Vec<Finding>) {
    let backend = a.a2a_backend();
    let release = a.release;
    let dispatch = a.value("flashinfer_a2a_dispatch_type");
    if backend != "flashinfer" && dispatch.as_deref().is_some_and(|d| d != "auto") {
        out.push(Finding::error(
            RULE_FLASHINFER_DISPATCH,
            a.field(role, "flashinfer_a2a_dispatch_type"),
            texts::FLASHINFER_DISPATCH,
            "add `--moe-a2a-backend flashinfer`, or drop --flashinfer-a2a-dispatch-type",
        ));
    }
    // The widths SGLang compares (0.5.21 renders attention DP as `--dp-size attnDp
    // --enable-dp-attention`; replica DP there has no `--enable-dp-attention`).
    let (tp, width) = (r.tp, r.attn_dp);
    let equal_to_tp = attn_dp && width == tp;
    let (text, fix) = match backend.as_str() {
        "pplx" if !(attn_dp && width >= 2) => (
            if release.has_attn_dp_size() { texts::PPLX_ATTN_DP } else { texts::PPLX_ATTN_DP_0_5_21 },
            "give the role attention DP of at least 2 (parallelism.attnDp)".to_owned(),
        ),
        // 0.5.23 spares Muse Spark's sequence-parallel prefill; left to the dry run.
        "flashinfer" if !equal_to_tp && facts.architecture.as_deref() != Some("MuseSparkForConditionalGeneration") => (
            match release {
                Release::V0_5_21 => texts::FLASHINFER_A2A_ATTN_DP_0_5_21,
                Release::V0_5_22 => texts::FLASHINFER_A2A_ATTN_DP_0_5_22,
                Release::V0_5_23 => texts::FLASHINFER_A2A_ATTN_DP,
            },
            format!("set parallelism.attnDp to tp ({tp}) with --moe-a2a-backend flashinfer"),
        ),
        "flashinfer_megamoe" if !equal_to_tp => (
            if release.has_attn_dp_size() { texts::FLASHINFER_MEGAMOE_ATTN_DP } else { texts::FLASHINFER_MEGAMOE_ATTN_DP_0_5_21 },
            format!("set parallelism.attnDp to tp ({tp}) with --moe-a2a-backend flashinfer_megamoe"),
        ),
        _ => return,
    };
    out.push(Finding::error(RULE_A2A_ATTN_DP, a.field(role, "moe_a2a_backend"), text, fix));
}

/// The extraArgs options (SGLang's name for each, in order, once) that no admission rule
/// reads, on both roles of a spec whose engines run SGLang.
pub fn not_judged(spec: &PDDeploymentSpec) -> Vec<&'static str> {
    if spec.engine.engine_type == EngineType::Sim {
        return Vec::new();
    }
    let release = crate::release::release_of(spec);
    let mut names = Vec::new();
    for role in [Role::Prefill, Role::Decode] {
        let args = &spec.role(role).template.extra_args;
        for o in read(release, args.iter().map(String::as_str).enumerate()).occurrences {
            let dest = o.spec.dest;
            if !JUDGED_DESTS.contains(&dest) && !super::MANAGED_DESTS.contains(&dest) && !names.contains(&o.option) {
                names.push(o.option);
            }
        }
    }
    names
}

/// The longest admission warning the apiserver passes on whole: past 4 KiB of warnings in all it
/// cuts each to 256 characters (`truncateItemRunes`, k8s.io/apiserver's `filters/warning.go`;
/// `AdmissionResponse.warnings`: "Warnings over 256 characters ... may be truncated").
pub const MAX_WARNING_CHARS: usize = 256;

/// The webhook's one warning naming what admission leaves to the engine dry run: as many names
/// as fit in `MAX_WARNING_CHARS` as printed, then how many more.
pub fn not_judged_warning(spec: &PDDeploymentSpec) -> Option<Finding> {
    let names = not_judged(spec);
    let release = crate::release::release_of(spec);
    let warning = |list: &str| {
        Finding::warning(
            RULE_NOT_JUDGED,
            "spec.*.template.extraArgs",
            format!("admission does not judge {list}: SGLang {release}'s start-up does (the engine dry run)"),
            "see EngineVerified, docs/dry-run.md",
        )
    };
    let fits = |list: &str| warning(list).to_string().chars().count() <= MAX_WARNING_CHARS;
    let mut shown = names.first()?.to_string();
    for (i, name) in names.iter().enumerate().skip(1) {
        let more = names.len() - i;
        let longer = format!("{shown}, {name}");
        // The last name needs no "and N more" after it.
        if !fits(&if more == 1 { longer.clone() } else { format!("{longer} and {} more", more - 1) }) {
            shown = format!("{shown} and {more} more");
            break;
        }
        shown = longer;
    }
    Some(warning(&shown))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::Severity;
    use crate::validate::validate;

    fn spec(version: &str, model: &str, prefill: serde_json::Value, decode_args: &[&str]) -> PDDeploymentSpec {
        serde_json::from_value(serde_json::json!({
            "engine": {"version": version},
            "model": {"path": model},
            "kvTransfer": {"pageSize": 64},
            "prefill": prefill,
            "decode": {"parallelism": {"tp": 8}, "template": {"extraArgs": decode_args}},
        }))
        .unwrap()
    }

    fn prefill(tp: u32, attn_dp: u32, args: &[&str]) -> serde_json::Value {
        serde_json::json!({"parallelism": {"tp": tp, "attnDp": attn_dp}, "template": {"extraArgs": args}})
    }

    fn errors(s: &PDDeploymentSpec, rule: &str) -> Vec<Finding> {
        validate("pd", s, None).into_iter().filter(|f| f.rule == rule && f.severity == Severity::Error).collect()
    }

    const V3: &str = "deepseek-ai/DeepSeek-V3";

    #[test]
    fn two_batch_overlap_needs_an_a2a_backend_or_attention_dp_per_release() {
        for (version, text) in
            [("0.5.21", texts::TBO_NEEDS_ATTN_DP_0_5_21), ("0.5.22", texts::TBO_NEEDS_ATTN_DP), ("0.5.23", texts::TBO_NEEDS_ATTN_DP)]
        {
            let bad = spec(version, V3, prefill(8, 1, &["--enable-two-batch-overlap"]), &[]);
            let f = errors(&bad, RULE_TBO_NEEDS_ATTN_DP);
            assert_eq!(f.len(), 1, "{version}: {f:#?}");
            assert_eq!(f[0].message, text);
            assert_eq!(f[0].field, "spec.prefill.template.extraArgs[0]");
            for good in [
                prefill(8, 8, &["--enable-two-batch-overlap"]),
                prefill(8, 1, &["--enable-two-batch-overlap", "--moe-a2a-backend", "deepep"]),
                // Waterfill forces deepep (`_a2a_backend_overrides`), with a warning.
                prefill(8, 1, &["--enable-two-batch-overlap", "--enable-waterfill"]),
            ] {
                assert!(errors(&spec(version, V3, good.clone(), &[]), RULE_TBO_NEEDS_ATTN_DP).is_empty(), "{version} {good}");
            }
        }
    }

    #[test]
    fn overlap_is_refused_on_backends_without_its_hooks() {
        let s = spec("0.5.23", V3, prefill(8, 8, &["--enable-single-batch-overlap", "--moe-a2a-backend", "deepep_v2"]), &[]);
        let f = errors(&s, RULE_OVERLAP_A2A);
        assert_eq!(f[0].message, texts::OVERLAP_DEEPEP_V2);
        let s = spec("0.5.21", V3, prefill(8, 8, &["--moe-a2a-backend=megamoe", "--enable-two-batch-overlap"]), &[]);
        assert_eq!(errors(&s, RULE_OVERLAP_A2A)[0].message, texts::OVERLAP_MEGAMOE);
        // Single-batch overlap has no precondition of its own in server_args.
        let s = spec("0.5.23", V3, prefill(8, 1, &["--enable-single-batch-overlap"]), &[]);
        assert!(errors(&s, RULE_OVERLAP_A2A).is_empty() && errors(&s, RULE_TBO_NEEDS_ATTN_DP).is_empty());
    }

    #[test]
    fn eagle_family_needs_all_three_numbers_or_none() {
        let args = |extra: &[&str]| {
            let mut v = vec!["--speculative-algorithm", "NEXTN"];
            v.extend_from_slice(extra);
            v.into_iter().map(String::from).collect::<Vec<_>>()
        };
        let on = |extra: &[&str]| {
            let a = args(extra);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            spec("0.5.23", V3, prefill(8, 1, &a), &a)
        };
        // The TypeError of issue #55: steps without a top-k.
        let f = errors(&on(&["--speculative-num-steps", "3"]), RULE_SPECULATIVE_PARAMS);
        assert_eq!(f.len(), 2, "{f:#?}");
        assert!(f[0].message.starts_with("TypeError: '>' not supported between instances of 'NoneType' and 'int'"));
        assert_eq!(f[0].field, "spec.prefill.template.extraArgs[2]");
        // A top-k without steps: the bare assert.
        let f = errors(&on(&["--speculative-eagle-topk", "1"]), RULE_SPECULATIVE_PARAMS);
        assert!(f[0].message.starts_with(texts::EAGLE_STEPS_UNSET), "{f:#?}");
        // None, all three, or steps and top-k 1 (draft tokens set to steps + 1 with a warning).
        let goods: [&[&str]; 4] = [
            &[],
            &["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],
            &["--speculative-num-steps", "3", "--speculative-eagle-topk", "1"],
            &["--speculative-eagle-topk", "1", "--speculative-adaptive"],
        ];
        for good in goods {
            assert!(errors(&on(good), RULE_SPECULATIVE_PARAMS).is_empty(), "{good:?}");
        }
        // Not an EAGLE-family algorithm: DSpark and NGRAM pick their own.
        let s = spec("0.5.23", V3, prefill(8, 1, &["--speculative-algorithm", "NGRAM", "--speculative-num-steps", "3"]), &[]);
        assert!(errors(&s, RULE_SPECULATIVE_PARAMS).is_empty());
    }

    #[test]
    fn dp_lm_head_needs_attention_dp_only_beside_replica_dp() {
        let with_dp = |version: &str, dp: u32, attn_dp: u32, args: &[&str]| -> PDDeploymentSpec {
            serde_json::from_value(serde_json::json!({
                "engine": {"version": version},
                "model": {"path": V3},
                "kvTransfer": {"pageSize": 64},
                "prefill": {"parallelism": {"tp": 8}},
                "decode": {"parallelism": {"tp": 8, "dp": dp, "attnDp": attn_dp}, "template": {"extraArgs": args}},
            }))
            .unwrap()
        };
        let lm = ["--enable-dp-lm-head"];
        for (version, text) in [("0.5.21", texts::DP_LM_HEAD_0_5_21), ("0.5.23", texts::DP_LM_HEAD)] {
            let f = errors(&with_dp(version, 2, 1, &lm), RULE_DP_LM_HEAD);
            assert_eq!(f[0].message, text, "{version}");
            assert_eq!(f[0].field, "spec.decode.template.extraArgs[0]");
            // No DP at all: SGLang drops the flag itself.
            assert!(errors(&with_dp(version, 1, 1, &lm), RULE_DP_LM_HEAD).is_empty());
            assert!(errors(&with_dp(version, 1, 8, &lm), RULE_DP_LM_HEAD).is_empty());
        }
        let dspark = ["--speculative-algorithm", "DSPARK"];
        let f = errors(&with_dp("0.5.22", 1, 8, &dspark), RULE_DSPARK_DP_LM_HEAD);
        assert_eq!(f[0].message, texts::DSPARK_DP_LM_HEAD);
        let with_head = ["--speculative-algorithm", "DSPARK", "--enable-dp-lm-head"];
        assert!(errors(&with_dp("0.5.22", 1, 8, &with_head), RULE_DSPARK_DP_LM_HEAD).is_empty());
    }

    #[test]
    fn a2a_backends_attention_dp_widths_per_release() {
        let cases = [
            ("0.5.21", "pplx", texts::PPLX_ATTN_DP_0_5_21),
            ("0.5.23", "pplx", texts::PPLX_ATTN_DP),
            ("0.5.21", "flashinfer", texts::FLASHINFER_A2A_ATTN_DP_0_5_21),
            ("0.5.22", "flashinfer", texts::FLASHINFER_A2A_ATTN_DP_0_5_22),
            ("0.5.23", "flashinfer", texts::FLASHINFER_A2A_ATTN_DP),
            ("0.5.21", "flashinfer_megamoe", texts::FLASHINFER_MEGAMOE_ATTN_DP_0_5_21),
            ("0.5.23", "flashinfer_megamoe", texts::FLASHINFER_MEGAMOE_ATTN_DP),
        ];
        for (version, backend, text) in cases {
            // pplx needs 2 attention-DP groups, the FlashInfer backends as many as tp.
            let short = if backend == "pplx" { 1 } else { 4 };
            let bad = spec(version, V3, prefill(8, short, &["--moe-a2a-backend", backend]), &[]);
            let f = errors(&bad, RULE_A2A_ATTN_DP);
            assert_eq!(f.len(), 1, "{version} {backend}: {f:#?}");
            assert_eq!((f[0].message.as_str(), f[0].field.as_str()), (text, "spec.prefill.template.extraArgs[0]"));
            let good = spec(version, V3, prefill(8, 8, &["--moe-a2a-backend", backend]), &[]);
            assert!(errors(&good, RULE_A2A_ATTN_DP).is_empty(), "{version} {backend}");
        }
        // DeepEP sets ep_size to tp_size itself.
        assert!(errors(&spec("0.5.23", V3, prefill(8, 1, &["--moe-a2a-backend", "deepep"]), &[]), RULE_A2A_ATTN_DP).is_empty());
        let s = spec("0.5.23", V3, prefill(8, 8, &["--flashinfer-a2a-dispatch-type", "bf16"]), &[]);
        assert_eq!(errors(&s, RULE_FLASHINFER_DISPATCH)[0].message, texts::FLASHINFER_DISPATCH);
        let s = spec("0.5.23", V3, prefill(8, 8, &["--flashinfer-a2a-dispatch-type", "auto"]), &[]);
        assert!(errors(&s, RULE_FLASHINFER_DISPATCH).is_empty());
    }

    #[test]
    fn options_admission_does_not_judge_are_named_once() {
        let s = spec(
            "0.5.23",
            V3,
            prefill(8, 8, &["--mem-fraction-static", "0.8", "--enable-two-batch-overlap", "--moe-a2a-backend", "deepep"]),
            &["--mem-fraction", "0.8", "--cuda-graph-max-bs-decode", "64"],
        );
        assert_eq!(not_judged(&s), ["--mem-fraction-static", "--cuda-graph-max-bs-decode"]);
        let w = not_judged_warning(&s).unwrap();
        assert_eq!(w.severity, Severity::Warning);
        assert!(w.message.starts_with("admission does not judge --mem-fraction-static, --cuda-graph-max-bs-decode: SGLang 0.5.23"), "{w}");
        let judged = spec("0.5.23", V3, prefill(8, 8, &["--enable-dp-lm-head"]), &["--speculative-algorithm", "EAGLE"]);
        assert_eq!(not_judged_warning(&judged), None);
    }

    /// The apiserver cuts a warning past `MAX_WARNING_CHARS`: many options are named up to it,
    /// then counted.
    #[test]
    fn the_not_judged_warning_stays_within_what_the_apiserver_passes_whole() {
        let flags = [
            "--disable-cuda-graph",
            "--enable-torch-compile",
            "--disable-custom-all-reduce",
            "--enable-mixed-chunk",
            "--disable-overlap-schedule",
            "--skip-tokenizer-init",
            "--enable-cache-report",
            "--disable-outlines-disk-cache",
            "--enable-p2p-check",
            "--enable-memory-saver",
            "--enable-deterministic-inference",
        ];
        let s = spec("0.5.23", V3, prefill(8, 8, &flags), &[]);
        let total = not_judged(&s).len();
        assert_eq!(total, flags.len(), "{:?}", not_judged(&s));
        let line = not_judged_warning(&s).unwrap().to_string();
        assert!(line.chars().count() <= MAX_WARNING_CHARS, "{} chars: {line}", line.chars().count());
        let list = line.split("admission does not judge ").nth(1).unwrap().split(':').next().unwrap();
        let (shown, more) = list.rsplit_once(" and ").expect("not all of them fit");
        let more: usize = more.trim_end_matches(" more").parse().unwrap();
        let shown: Vec<&str> = shown.split(", ").collect();
        assert_eq!(shown, flags[..shown.len()], "{line}");
        assert_eq!(shown.len() + more, total, "{line}");
        // A few fit whole, without a count.
        let s = spec("0.5.23", V3, prefill(8, 8, &flags[..3]), &[]);
        let w = not_judged_warning(&s).unwrap();
        assert!(w.message.starts_with(&format!("admission does not judge {}: ", flags[..3].join(", "))), "{w}");
    }
}
