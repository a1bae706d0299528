//! Specs past the schema (`pd-operator validate -f`, a direct webhook call) carry any count:
//! `validate` must answer every one of them with findings, never a panic or a loop as long as a
//! value, and the pod limit must count any spec without overflowing.

use super::*;
use crate::findings::Severity;
use crate::validate::validate;
use pd_api::{AttentionKind, CpStrategy, PDDeploymentSpec, Parallelism, RoleSpec};
use proptest::prelude::*;

fn spec(json: serde_json::Value) -> PDDeploymentSpec {
    let mut base =
        serde_json::json!({"model": {"path": "deepseek-ai/DeepSeek-V3"}, "kvTransfer": {"pageSize": 64}, "prefill": {}, "decode": {}});
    merge(&mut base, json);
    serde_json::from_value(base).expect("a PDDeploymentSpec")
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    match (into, from) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

fn errors_on<'a>(findings: &'a [Finding], field: &str) -> Vec<&'a Finding> {
    findings.iter().filter(|f| f.severity == Severity::Error && f.field == field).collect()
}

/// Today's main panics here: `attn_dp * attn_cp` overflows u32 in `check_widths`.
#[test]
fn attention_groups_past_u32_are_a_finding_not_a_panic() {
    let s = spec(serde_json::json!({"decode": {"parallelism": {"tp": 8, "attnDp": 65536, "attnCp": 65536}}}));
    let findings = validate("big", &s, None);
    for field in ["spec.decode.parallelism.attnDp", "spec.decode.parallelism.attnCp"] {
        let errors = errors_on(&findings, field);
        assert!(
            errors.iter().any(|f| f.rule == RULE_COUNT && f.message.contains("65536") && f.message.contains("1024")),
            "{field}: {findings:#?}"
        );
        assert!(errors.iter().any(|f| f.fix.contains("at most 1024")), "{field}: {errors:#?}");
    }
}

/// Today's main searches about 4e9 candidate divisors for the fix's example dcp.
#[test]
fn a_dcp_near_u32_max_is_a_finding_not_a_divisor_search() {
    let s = spec(serde_json::json!({"decode": {"parallelism": {"tp": 4_294_967_291u32, "dcp": 4_294_967_290u32}}}));
    let findings = validate("big", &s, None);
    assert!(errors_on(&findings, "spec.decode.parallelism.tp").iter().any(|f| f.rule == RULE_COUNT), "{findings:#?}");
    assert!(errors_on(&findings, "spec.decode.parallelism.dcp").iter().any(|f| f.rule == RULE_COUNT), "{findings:#?}");
}

#[test]
fn the_divisor_search_answers_for_the_largest_values() {
    // 4294967291 is prime: only 1 and itself divide it.
    assert_eq!(largest_divisor_at_most(4_294_967_291, 4_294_967_290), 1);
    assert_eq!(largest_divisor_at_most(u32::MAX, u32::MAX), u32::MAX);
    assert_eq!(largest_divisor_at_most(u32::MAX, u32::MAX - 1), u32::MAX / 3);
    assert_eq!(next_multiple(u32::MAX, u32::MAX - 1), 2 * u64::from(u32::MAX - 1));
}

#[test]
fn widths_within_bounds_may_still_ask_too_many_gpus_for_one_instance() {
    let s = spec(serde_json::json!({"prefill": {"parallelism": {"tp": 1024, "pp": 1024}, "gpusPerNode": 1}}));
    let findings = validate("wide", &s, None);
    let errors = errors_on(&findings, "spec.prefill.parallelism.tp");
    assert!(errors.iter().any(|f| f.rule == RULE_COUNT && f.message.contains("1048576")), "{findings:#?}");
}

#[test]
fn a_spec_within_every_bound_gets_no_count_finding() {
    let s = spec(
        serde_json::json!({"replicas": 2, "prefill": {"replicas": 4, "parallelism": {"tp": 16}}, "decode": {"parallelism": {"tp": 8}}}),
    );
    let mut out = Vec::new();
    assert!(check_counts(&s, &mut out), "{out:#?}");
    assert!(out.is_empty());
}

/// The attack of the finding: 100000 decode instances of two nodes each.
#[test]
fn the_pod_limit_refuses_100000_replicas_with_the_number() {
    let s = spec(serde_json::json!({"decode": {"replicas": 100_000, "parallelism": {"tp": 16}, "gpusPerNode": 8}}));
    let f = pod_limit(&s, DEFAULT_MAX_PODS_PER_DEPLOYMENT).expect("refused");
    assert_eq!(f.severity, Severity::Error);
    assert_eq!(f.field, "spec.decode.replicas");
    assert!(
        f.message.starts_with("spec asks for 200001 engine pods (prefill 1 instance x 1 node, decode 100000 instances x 2 nodes)"),
        "{f}"
    );
    assert!(f.message.contains("at most 512 per PDDeployment"), "{f}");
    assert!(f.message.contains("--max-pods-per-deployment") && f.message.contains("limits.maxPodsPerDeployment"), "{f}");
}

#[test]
fn a_reconcile_takes_its_pod_count_from_the_render_budget_within_the_budget() {
    let s = spec(
        serde_json::json!({"prefill": {"replicas": 3, "parallelism": {"tp": 16}}, "decode": {"replicas": 2, "parallelism": {"tp": 8}}}),
    );
    // Prefill 3 instances x 2 nodes, decode 2 x 1, and each role's surge instance.
    let pods = engine_pods(&s).iter().map(RolePods::total).sum::<u64>() as u32;
    assert_eq!(render_permits(&s, 2048), pods);
    assert_eq!(render_permits(&s, 4), 4, "an object larger than the budget takes all of it and renders alone");
    assert_eq!(render_permits(&s, 0), 1, "a budget of 0 cannot stop every reconcile");
    let huge = spec(serde_json::json!({"replicas": 100000}));
    assert_eq!(render_permits(&huge, DEFAULT_MAX_RENDERED_PODS), DEFAULT_MAX_RENDERED_PODS);
}

#[test]
fn the_pod_limit_counts_units_surge_and_nodes() {
    let s = spec(serde_json::json!({
        "replicas": 3, "rollout": {"maxSurge": 1},
        "prefill": {"replicas": 2, "parallelism": {"tp": 16}, "gpusPerNode": 8},
        "decode": {"replicas": 1},
    }));
    let [prefill, decode] = engine_pods(&s);
    assert_eq!((prefill.instances, prefill.surge, prefill.nodes, prefill.total()), (6, 1, 2, 14));
    assert_eq!((decode.instances, decode.surge, decode.nodes, decode.total()), (3, 1, 1, 4));
    assert_eq!(pod_limit(&s, 18), None, "exactly at the limit");
    let f = pod_limit(&s, 17).expect("one above");
    assert_eq!(f.field, "spec.replicas");
    assert!(f.message.contains("18 engine pods (prefill 6 instances + 1 surge x 2 nodes, decode 3 instances + 1 surge x 1 node)"), "{f}");
}

/// Any u32: 0, small, the bounds and just past them, and anything up to `u32::MAX`.
fn count() -> impl Strategy<Value = u32> + Clone {
    prop_oneof![Just(0u32), 1u32..=8, Just(1024), Just(1025), Just(65536), Just(4_294_967_291), Just(u32::MAX), any::<u32>()]
}

/// A width within the bounds: the rules past the gate see these.
fn width() -> impl Strategy<Value = u32> + Clone {
    prop_oneof![4 => 1u32..=8, 1 => Just(1024), 1 => 1u32..=1024]
}

fn replicas() -> impl Strategy<Value = i32> {
    prop_oneof![6 => 0i32..=4, 1 => Just(-1i32), 1 => Just(4096), 1 => Just(100_000), 1 => Just(i32::MAX), 1 => Just(i32::MIN), 1 => any::<i32>()]
}

fn parallelism(size: impl Strategy<Value = u32> + Clone) -> impl Strategy<Value = Parallelism> {
    let strategy = prop::option::of(prop_oneof![Just(CpStrategy::Zigzag), Just(CpStrategy::Interleave)]);
    (size.clone(), size.clone(), size.clone(), size.clone(), size.clone(), size, strategy)
        .prop_map(|(tp, dp, attn_dp, pp, attn_cp, dcp, cp_strategy)| Parallelism { tp, dp, attn_dp, pp, attn_cp, dcp, cp_strategy })
}

fn role(size: impl Strategy<Value = u32> + Clone) -> impl Strategy<Value = RoleSpec> {
    let gpus_per_node = prop_oneof![3 => 1u32..=16, 1 => count()];
    (replicas(), parallelism(size), gpus_per_node, any::<bool>()).prop_map(|(replicas, parallelism, gpus_per_node, shard)| RoleSpec {
        replicas,
        parallelism,
        gpus_per_node,
        enable_kv_cache_sharding: shard,
        ..Default::default()
    })
}

fn any_spec(size: impl Strategy<Value = u32> + Clone) -> impl Strategy<Value = PDDeploymentSpec> {
    let models = prop_oneof![
        Just("deepseek-ai/DeepSeek-V3"),
        Just("deepseek-ai/DeepSeek-V3.2-Exp"),
        Just("deepseek-ai/DeepSeek-V4"),
        Just("Qwen/Qwen3-32B"),
        Just("moonshotai/Kimi-Linear-48B-A3B-Instruct"),
        Just("x/unknown"),
    ];
    let kinds = prop::option::of(prop_oneof![Just(AttentionKind::Mla), Just(AttentionKind::HybridMla), Just(AttentionKind::Gqa)]);
    let counts = (replicas(), replicas(), replicas(), replicas(), -1i32..=20);
    (models, kinds, role(size.clone()), role(size), prop::option::of(count()), counts).prop_map(
        |(path, attention, prefill, decode, page_size, (units, router, unavailable, partition, surge))| {
            let mut s = spec(serde_json::json!({"model": {"path": path}}));
            s.model.attention = attention;
            (s.prefill, s.decode, s.kv_transfer.page_size) = (prefill, decode, page_size);
            (s.replicas, s.router.replicas) = (units, router);
            (s.rollout.max_unavailable, s.rollout.max_surge, s.rollout.decode.partition) = (unavailable, surge, partition);
            s
        },
    )
}

fn judged(s: &PDDeploymentSpec) -> Result<(), TestCaseError> {
    let findings = validate("p", s, None);
    let pods = pod_limit(s, DEFAULT_MAX_PODS_PER_DEPLOYMENT);
    let [prefill, decode] = engine_pods(s);
    prop_assert!(pods.is_none() || prefill.total().saturating_add(decode.total()) > u64::from(DEFAULT_MAX_PODS_PER_DEPLOYMENT));
    // A count past its bound is always reported, whatever else the spec says.
    let mut counts = Vec::new();
    if !check_counts(s, &mut counts) {
        prop_assert!(counts.iter().all(|c| findings.contains(c)), "{counts:#?}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any u32 in every count: findings, never a panic, and an answer.
    #[test]
    fn validate_answers_any_count(s in any_spec(count())) {
        judged(&s)?;
    }

    /// Widths within the bounds reach every rule that multiplies or divides them.
    #[test]
    fn validate_answers_any_width_within_the_bounds(s in any_spec(width())) {
        judged(&s)?;
    }

    #[test]
    fn the_divisor_search_finds_the_largest_divisor(n in 1u32..5000, limit in 1u32..6000) {
        let brute = (1..=limit.min(n)).rev().find(|d| n.is_multiple_of(*d)).unwrap_or(1);
        prop_assert_eq!(largest_divisor_at_most(n, limit), brute);
    }
}

/// `pd-operator validate -f` and `kubectl pd validate` have no operator to ask: the default limit.
#[test]
fn the_offline_verdict_applies_the_default_pod_limit() {
    let text = "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {name: many}\nspec:\n  model: {path: Qwen/Qwen3-32B}\n  kvTransfer: {pageSize: 64}\n  prefill: {replicas: 300}\n  decode: {replicas: 300}\n";
    let mut loaded = crate::manifest::Loaded::default();
    crate::manifest::load_str(std::path::Path::new("many.yaml"), text, &mut loaded).expect("loads");
    let (report, valid) = crate::offline::report(&loaded, None, crate::offline::Assumed::default(), false).expect("a report");
    assert!(!valid, "{report}");
    assert!(report.contains("many: spec.decode.replicas: spec asks for 600 engine pods (prefill 300 instances x 1 node, decode 300 instances x 1 node); this operator allows at most 512"), "{report}");
}
