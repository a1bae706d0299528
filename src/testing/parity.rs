//! Cases for the engine-parity tier (`make parity`, docs/parity.md): for one PDDeployment, the
//! operator's own verdict next to exactly what each engine process would be started with, so
//! SGLang's start-up resolution (tests/parity/oracle.py) can judge the same pods. Pure functions.

use serde::Serialize;

use pd_api::PDDeploymentSpec;
use pd_api::Role;
use pd_core::findings::Finding;
use pd_core::model::ModelFacts;
use pd_core::render;
use pd_core::validate;

/// One engine process: its argv after the program name and its literal environment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EngineProcess {
    /// `prefill` or `decode`.
    pub role: &'static str,
    pub node: u32,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// The operator's verdict on one PDDeployment and the engine processes of its first instances.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Case {
    pub name: String,
    pub valid: bool,
    pub architecture: Option<String>,
    pub findings: Vec<Finding>,
    pub processes: Vec<EngineProcess>,
    /// What `render` hands the decode's handshake sidecar (`decode.json`).
    pub decode_topology: pd_core::handshake::core::DecodeTopology,
    /// The page size and KV dtype the operator expects the prefill to report.
    pub prefill_page_size: Option<i64>,
    pub prefill_kv_cache_dtype: Option<String>,
    /// The DeepSeek-V4 KV layout the operator expects the prefill to report.
    pub prefill_kv_layout: Option<String>,
    /// The prefill's and the decode's accelerator, where named.
    pub accelerators: [Option<pd_api::Accelerator>; 2],
    /// The SGLang release the spec is judged and rendered for.
    pub release: pd_core::release::Release,
}

/// The environment the operator gives a role's engine, where it is a literal value
/// (`SGLANG_HOST_IP` comes from the pod's IP and does not take part in resolution).
pub fn engine_env(spec: &PDDeploymentSpec, role: Role) -> Vec<(String, String)> {
    let mut env = Vec::new();
    if spec.kv_transfer.all_cp_ranks_transfer {
        env.push(("SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER".to_owned(), "true".to_owned()));
    }
    env.extend(spec.role(role).template.env.iter().filter_map(|e| Some((e.name.clone(), e.value.clone()?))));
    env
}

/// Builds the case from the findings `validate` already computed for this spec.
pub fn case(name: &str, spec: &PDDeploymentSpec, facts: &ModelFacts, findings: Vec<Finding>) -> Case {
    let valid = validate::is_valid(&findings);
    // What `render` runs: the page size the operator passes to both roles.
    let spec = &pd_core::resolve::with_page_size(spec, facts);
    let mut processes = Vec::new();
    for role in [Role::Prefill, Role::Decode] {
        let env = engine_env(spec, role);
        for node in 0..spec.role(role).nodes_per_instance() {
            let argv = render::engine_args(spec, role, name, "default", 0, node, 0);
            processes.push(EngineProcess { role: role.as_str(), node, argv, env: env.clone() });
        }
    }
    let decode_topology = pd_core::resolve::decode_topology(spec, facts);
    let prefill = pd_core::resolve::prefill_info(spec, facts);
    Case {
        name: name.to_owned(),
        valid,
        architecture: facts.architecture.clone(),
        findings,
        processes,
        decode_topology,
        prefill_page_size: prefill.page_size,
        prefill_kv_cache_dtype: prefill.kv_cache_dtype,
        prefill_kv_layout: prefill.kv_layout.as_str().map(str::to_owned),
        accelerators: [spec.prefill.accelerator, spec.decode.accelerator],
        release: pd_core::release::release_of(spec),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_process_per_node_of_each_role_with_the_literal_env() {
        let spec: PDDeploymentSpec = serde_json::from_value(serde_json::json!({
            "model": {"path": "deepseek-ai/DeepSeek-V3"},
            "kvTransfer": {"pageSize": 64, "allCpRanksTransfer": true},
            "prefill": {"parallelism": {"tp": 16}, "gpusPerNode": 8,
                        "template": {"env": [{"name": "SGLANG_X", "value": "1"}]}},
            "decode": {"parallelism": {"tp": 8}},
        }))
        .unwrap();
        let facts = pd_core::model::resolve(&spec.model, None);
        let c = case("pd", &spec, &facts, validate::validate_with_facts("pd", &spec, &facts));
        let roles: Vec<_> = c.processes.iter().map(|p| (p.role, p.node)).collect();
        assert_eq!(roles, [("prefill", 0), ("prefill", 1), ("decode", 0)]);
        assert!(c.processes[1].argv.windows(2).any(|w| w == ["--node-rank", "1"]));
        assert_eq!(c.processes[0].env.len(), 2);
        assert_eq!(c.processes[2].env, [("SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER".to_owned(), "true".to_owned())]);
        assert!(c.valid);
    }

    #[test]
    fn the_sidecar_gets_what_sglang_resolves_for_dsa_and_v4() {
        use pd_api::{Accelerator, PDDeploymentSpec};
        let spec = |model: &str, dtype: &str, acc: Option<Accelerator>| {
            let mut s: PDDeploymentSpec = serde_json::from_value(serde_json::json!({
                "model": {"path": model}, "kvTransfer": {"pageSize": 32, "kvCacheDtype": dtype},
                "prefill": {"parallelism": {"tp": 8}}, "decode": {"parallelism": {"tp": 8}},
            }))
            .unwrap();
            s.decode.accelerator = acc;
            s
        };
        let topo = |s: &PDDeploymentSpec| {
            serde_json::to_value(pd_core::resolve::decode_topology(s, &pd_core::model::resolve(&s.model, None))).unwrap()
        };
        let dsa = "deepseek-ai/DeepSeek-V3.2-Exp";
        let t = topo(&spec(dsa, "auto", Some(Accelerator::H200)));
        assert_eq!((t["page_size"].as_u64(), t["kv_cache_dtype"].as_str()), (Some(64), Some("bfloat16")));
        let t = topo(&spec(dsa, "auto", Some(Accelerator::B200)));
        assert_eq!(t["kv_cache_dtype"], "fp8_e4m3");
        assert_eq!(topo(&spec(dsa, "bf16", None))["kv_cache_dtype"], "bfloat16");
        let mut v4 = spec("x", "auto", None);
        v4.model.architecture = Some("DeepseekV4ForCausalLM".into());
        let t = topo(&v4);
        assert_eq!((t["page_size"].as_u64(), t["kv_cache_dtype"].as_str()), (Some(256), Some("fp8_e4m3")));
        // Everything else reports what the operator passes.
        let t = topo(&spec("deepseek-ai/DeepSeek-V3", "bf16", Some(Accelerator::B200)));
        assert_eq!((t["page_size"].as_u64(), t["kv_cache_dtype"].as_str()), (Some(32), Some("bf16")));
    }
}
