//! Property tests: `validate` never panics, and whatever it accepts renders.

use pd_operator::api::{AllocationPolicy, AttentionKind, CpStrategy, KvCacheDtype, PDDeployment, PDDeploymentSpec, Parallelism, RoleSpec, TransferBackend};
use pd_operator::model;
use pd_operator::render::{RenderOptions, render};
use pd_operator::validate::{is_valid, validate};
use proptest::prelude::*;
use proptest::strategy::ValueTree;

fn size() -> impl Strategy<Value = u32> {
    prop_oneof![6 => Just(1u32), 2 => Just(2), 2 => Just(4), 2 => Just(8), 1 => Just(16), 1 => Just(0), 1 => Just(3), 1 => 0u32..=64]
}

fn parallelism() -> impl Strategy<Value = Parallelism> {
    (size(), size(), size(), size(), size(), size(), prop::option::of(prop_oneof![Just(CpStrategy::Zigzag), Just(CpStrategy::Interleave)]))
        .prop_map(|(tp, dp, attn_dp, pp, attn_cp, dcp, cp_strategy)| Parallelism { tp, dp, attn_dp, pp, attn_cp, dcp, cp_strategy })
}

fn role() -> impl Strategy<Value = RoleSpec> {
    (-1i32..5, parallelism(), size(), any::<bool>(), any::<bool>(), prop::collection::vec(prop_oneof![Just("--page-size".to_owned()), Just("--foo".to_owned()), "[-a-z=0-9]{0,12}"], 0..3))
        .prop_map(|(replicas, parallelism, gpus_per_node, shard, split, extra_args)| {
            let mut r = RoleSpec { replicas, parallelism, gpus_per_node, enable_kv_cache_sharding: shard, enable_dsa_cache_layer_split: split, ..Default::default() };
            r.template.extra_args = extra_args;
            r
        })
}

fn spec() -> impl Strategy<Value = PDDeploymentSpec> {
    let models = prop_oneof![Just("deepseek-ai/DeepSeek-V3"), Just("Qwen/Qwen2.5-72B-Instruct"), Just("moonshotai/Kimi-Linear-48B-A3B-Instruct"), Just("x/unknown"), Just("")];
    let kinds = prop::option::of(prop_oneof![Just(AttentionKind::Mla), Just(AttentionKind::HybridMla), Just(AttentionKind::Gqa), Just(AttentionKind::Mha)]);
    let dtypes = prop_oneof![Just(KvCacheDtype::Auto), Just(KvCacheDtype::Mxfp8), Just(KvCacheDtype::Bf16)];
    let backends = prop_oneof![Just(TransferBackend::Mooncake), Just(TransferBackend::Fake), Just(TransferBackend::Nixl)];
    let policies = prop_oneof![Just(AllocationPolicy::Early), Just(AllocationPolicy::PrefillComplete)];
    (models, kinds, role(), role(), prop::option::of(0u32..=128), dtypes, backends, policies, any::<bool>()).prop_map(
        |(path, attention, prefill, decode, page_size, dtype, backend, policy, all_cp)| {
            let mut s: PDDeploymentSpec = serde_json::from_value(serde_json::json!({"model": {"path": path}, "prefill": {}, "decode": {}})).unwrap();
            s.model.attention = attention;
            s.prefill = prefill;
            s.decode = decode;
            s.kv_transfer.page_size = page_size;
            s.kv_transfer.kv_cache_dtype = dtype;
            s.kv_transfer.backend = backend;
            s.kv_transfer.decode_allocation_policy = policy;
            s.kv_transfer.all_cp_ranks_transfer = all_cp;
            s
        },
    )
}

static ACCEPTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn validate_never_panics_and_accepted_specs_render(spec in spec(), name in "[a-z][a-z0-9-]{0,70}") {
        let findings = validate(&name, &spec, None);
        for f in &findings {
            prop_assert!(!f.field.is_empty() && !f.message.is_empty() && !f.fix.is_empty());
        }
        if is_valid(&findings) {
            ACCEPTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let pdd = PDDeployment::new(&name, spec.clone());
            let facts = model::resolve(&spec.model, None);
            let rendered = render(&pdd, &facts, &RenderOptions::default());
            prop_assert!(rendered.is_ok(), "{:?}", rendered);
            let rendered = rendered.unwrap();
            prop_assert!(rendered.to_yaml().is_ok());
            for pod in &rendered.pods {
                prop_assert!(pod.metadata.name.as_ref().unwrap().len() <= 63);
            }
        }
    }
}

#[test]
fn the_generator_produces_accepted_specs() {
    // Guards the property above against holding vacuously.
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut accepted = 0;
    for _ in 0..2000 {
        let s = spec().new_tree(&mut runner).unwrap().current();
        accepted += usize::from(is_valid(&validate("pd", &s, None)));
    }
    assert!(accepted >= 20, "only {accepted} of 2000 generated specs were valid");
}
