//! Property tests: `validate` never panics, and whatever it accepts renders.

use pd_api::{
    AllocationPolicy, AttentionKind, CpStrategy, KvCacheDtype, PDDeployment, PDDeploymentSpec, Parallelism, Role, RoleSpec, TransferBackend,
};
use pd_core::model;
use pd_core::render::{RenderOptions, render};
use pd_core::validate::{is_valid, validate};
use proptest::prelude::*;
use proptest::strategy::ValueTree;

fn size() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), 1u32..=4, Just(8), Just(16), Just(3), Just(6), 0u32..=64]
}

/// Mostly 1, sometimes anything: keeps valid specs common while still probing odd sizes.
fn usually_one() -> impl Strategy<Value = u32> {
    prop_oneof![12 => Just(1u32), 2 => Just(2), 1 => size()]
}

fn parallelism() -> impl Strategy<Value = Parallelism> {
    (
        prop_oneof![2 => Just(4u32), 2 => Just(8), 1 => Just(2), 1 => Just(16), 1 => size()],
        usually_one(),
        usually_one(),
        usually_one(),
        usually_one(),
        usually_one(),
        prop::option::of(prop_oneof![Just(CpStrategy::Zigzag), Just(CpStrategy::Interleave)]),
    )
        .prop_map(|(tp, dp, attn_dp, pp, attn_cp, dcp, cp_strategy)| Parallelism { tp, dp, attn_dp, pp, attn_cp, dcp, cp_strategy })
}

fn role() -> impl Strategy<Value = RoleSpec> {
    (prop_oneof![1 => Just(-1i32), 8 => 0i32..5], parallelism(), prop_oneof![6 => Just(8u32), 1 => size()], prop::bool::weighted(0.1), prop::bool::weighted(0.1), prop_oneof![6 => Just(Vec::new()), 1 => prop::collection::vec(prop_oneof![Just("--page-size".to_owned()), Just("--foo".to_owned()), "[-a-z=0-9]{0,12}"], 0..2)])
        .prop_map(|(replicas, parallelism, gpus_per_node, shard, split, extra_args)| {
            let mut r = RoleSpec { replicas, parallelism, gpus_per_node, enable_kv_cache_sharding: shard, enable_dsa_cache_layer_split: split, ..Default::default() };
            r.template.extra_args = extra_args;
            r
        })
}

fn spec() -> impl Strategy<Value = PDDeploymentSpec> {
    let models = prop_oneof![3 => Just("deepseek-ai/DeepSeek-V3"), 3 => Just("Qwen/Qwen2.5-72B-Instruct"), 2 => Just("moonshotai/Kimi-Linear-48B-A3B-Instruct"), 1 => Just("x/unknown"), 1 => Just("")];
    let kinds = prop::option::of(prop_oneof![
        Just(AttentionKind::Mla),
        Just(AttentionKind::HybridMla),
        Just(AttentionKind::Gqa),
        Just(AttentionKind::Mha)
    ]);
    let dtypes = prop_oneof![4 => Just(KvCacheDtype::Auto), 1 => Just(KvCacheDtype::Mxfp8), 1 => Just(KvCacheDtype::Bf16)];
    let backends = prop_oneof![6 => Just(TransferBackend::Mooncake), 1 => Just(TransferBackend::Fake), 2 => Just(TransferBackend::Nixl)];
    let policies = prop_oneof![8 => Just(AllocationPolicy::Early), 1 => Just(AllocationPolicy::PrefillComplete)];
    (
        models,
        kinds,
        role(),
        role(),
        prop_oneof![1 => Just(None), 6 => Just(Some(64u32)), 1 => Just(Some(0u32)), 1 => (1u32..=256).prop_map(Some)],
        dtypes,
        backends,
        policies,
        any::<bool>(),
    )
        .prop_map(|(path, attention, prefill, decode, page_size, dtype, backend, policy, all_cp)| {
            let mut s: PDDeploymentSpec =
                serde_json::from_value(serde_json::json!({"model": {"path": path}, "prefill": {}, "decode": {}})).unwrap();
            s.model.attention = attention;
            s.prefill = prefill;
            s.decode = decode;
            s.kv_transfer.page_size = page_size;
            s.kv_transfer.kv_cache_dtype = dtype;
            s.kv_transfer.backend = backend;
            s.kv_transfer.decode_allocation_policy = policy;
            s.kv_transfer.all_cp_ranks_transfer = all_cp;
            s
        })
}

fn check_spec(spec: PDDeploymentSpec, name: String) -> Result<(), TestCaseError> {
    let findings = validate(&name, &spec, None);
    for f in &findings {
        prop_assert!(!f.field.is_empty() && !f.message.is_empty() && !f.fix.is_empty());
    }
    if is_valid(&findings) {
        let pdd = PDDeployment::new(&name, spec.clone());
        let facts = model::resolve(&spec.model, None);
        let rendered = render(&pdd, &facts, &RenderOptions::default());
        prop_assert!(rendered.is_ok(), "{:?}", rendered);
        let rendered = rendered.unwrap();
        prop_assert!(rendered.to_yaml().is_ok());
        // Host names fit a DNS label in every KV set a rollout names, the last one included.
        let opts = RenderOptions::default();
        let last = pd_core::names::NAMED_KV_SETS;
        let sets = pd_core::render::KvSets { target: last, routed: last };
        let intent = pd_core::render::Intent::new(&spec, &facts, &opts).unwrap();
        let surged = pd_core::render::render_sets(&pdd, &facts, &intent, &opts, sets);
        for pod in rendered.pods().chain(surged.as_ref().unwrap().pods()) {
            prop_assert!(pod.spec.as_ref().unwrap().hostname.as_ref().unwrap().len() <= 63);
        }
        // The KV contracts its pods carry read back, or the controller fails the reconcile. Only
        // for specs the apiserver stores: the CRD refuses `pageSize: 0` (minimum 1), which the
        // offline `validate` does not check.
        if spec.kv_transfer.page_size != Some(0) {
            let (prefill, decode) = (intent.contract(Role::Prefill), intent.contract(Role::Decode));
            let read = pd_core::sets::SpecContracts::read(prefill, decode);
            prop_assert!(read.is_ok(), "{:?}", read);
        }
    }
    Ok(())
}

#[test]
fn validate_never_panics_and_accepted_specs_render() {
    // Debug builds of proptest's nested strategies and k8s-openapi's large structs need more
    // than the 2 MiB test-thread stack.
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(|| {
            let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(2000));
            let result = runner.run(&(spec(), "[a-z][a-z0-9-]{0,70}"), |(s, n)| check_spec(s, n));
            if let Err(e) = result {
                panic!("{e}");
            }
        })
        .unwrap()
        .join()
        .unwrap();
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
