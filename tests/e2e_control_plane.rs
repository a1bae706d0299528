//! The control plane itself and our CRD on it: storage, CEL, garbage collection, GPU scheduling.

use pd_testing as common;

use std::time::Duration;

use common::{TestNamespace, cluster, repo_path, text, wait_for};
use kube::Api;
use pd_api::PDDeployment;

#[test]
fn crd_applies_server_side_and_is_established() {
    let c = cluster();
    let o = c.kubectl(&["apply", "--server-side", "--force-conflicts", "-f", repo_path("crds").to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = c.kubectl(&[
        "get",
        "crd",
        "pddeployments.pd.inference.dev",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "True");
}

/// The operator's client multiplexes its requests over HTTP/2, as client-go does; kube's default
/// client speaks HTTP/1.1 and holds a TLS connection per request in flight.
#[tokio::test]
async fn the_operator_client_speaks_http2_with_many_requests_in_flight() {
    let client = pd_runtime::kube_client::from_config(cluster().config().await).expect("client");
    let version = http::Request::get("/version").body(kube::client::Body::empty()).unwrap();
    let answer = client.send(version).await.expect("GET /version");
    assert_eq!(answer.version(), http::Version::HTTP_2, "negotiated protocol");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client);
    let params = kube::api::ListParams::default();
    let lists = futures::future::join_all((0..200).map(|_| namespaces.list(&params))).await;
    let failed: Vec<_> = lists.iter().filter_map(|l| l.as_ref().err()).collect();
    assert!(failed.is_empty(), "{} of 200 concurrent lists failed, first: {:?}", failed.len(), failed.first());
}

#[tokio::test]
async fn a_valid_example_is_stored_and_read_back_with_defaults() {
    let ns = TestNamespace::new("store");
    let o = ns.apply_file(&repo_path("examples/qwen3-gqa.yaml"));
    assert!(o.status.success(), "{}", text(&o));
    let api: Api<PDDeployment> = Api::namespaced(cluster().client().await, &ns.name);
    let stored = api.get("qwen3").await.unwrap();
    assert_eq!(stored.spec.model.path, "Qwen/Qwen3-32B");
    assert_eq!(stored.spec.prefill.replicas, 2);
    assert_eq!(stored.spec.decode.parallelism.tp, 4);
    // Defaults come from the CRD schema, applied by the apiserver.
    assert_eq!(stored.spec.kv_transfer.bootstrap_port, 8998);
    assert_eq!(stored.spec.decode.parallelism.dcp, 1);
    assert_eq!(stored.spec.decode.gpus_per_node, 8);
    let raw = ns.get_json("pdd", "qwen3").unwrap();
    assert_eq!(raw["spec"]["engine"]["type"], "sglang");
    assert_eq!(raw["spec"]["kvTransfer"]["kvCacheDtype"], "auto");
}

#[test]
fn the_minimal_contract_spec_is_accepted_by_the_crd() {
    let ns = TestNamespace::new("minimal");
    let o = ns.apply_file(&repo_path("examples/qwen-dcp2-mistake.yaml"));
    // No webhook runs here: the CRD alone accepts it; the webhook issue rejects it.
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn cel_rules_reject_impossible_arithmetic_with_their_message() {
    let ns = TestNamespace::new("cel");
    let spec = |p: &str| {
        format!(
            "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: bad}}\nspec:\n  model: {{path: deepseek-ai/DeepSeek-V3}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{parallelism: {{tp: 8}}}}\n  decode: {{parallelism: {p}}}\n"
        )
    };
    let o = ns.apply(&spec("{tp: 8, dcp: 3}"));
    assert!(!o.status.success());
    let e = text(&o);
    assert!(
        e.contains("spec.decode.parallelism.dcp")
            && e.contains("tensor_model_parallel_size must be divisible by decode_context_parallel_size"),
        "{e}"
    );
    let o = ns.apply(&spec("{tp: 8, attnDp: 3}"));
    assert!(text(&o).contains("tp_size must be divisible by attn_dp_size * attn_cp_size"), "{}", text(&o));
    let o = ns.apply(&spec("{tp: 8, dp: 2, attnDp: 2}"));
    assert!(text(&o).contains("data-parallel replicas combined with attention data parallelism are not supported"), "{}", text(&o));
    let o = ns.apply(&spec("{tp: 0}"));
    assert!(text(&o).contains("spec.decode.parallelism.tp"), "{}", text(&o));
    let o = ns.apply(&spec("{tp: 8}").replace("pageSize: 64", "pageSize: 64, kvCacheDtype: fp9"));
    assert!(text(&o).contains("Unsupported value: \"fp9\""), "{}", text(&o));
    // Nothing half-applied: no object was stored.
    assert!(ns.get_json("pdd", "bad").is_err());
}

fn sourced(source: &str) -> String {
    format!(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: src}}\nspec:\n  model: {{path: Qwen/Qwen3-8B, source: {source}}}\n  kvTransfer: {{pageSize: 64}}\n  prefill: {{parallelism: {{tp: 2}}}}\n  decode: {{parallelism: {{tp: 2}}}}\n  router: {{enabled: false}}\n"
    )
}

#[test]
fn each_model_source_renders_pods_the_apiserver_accepts_and_cel_wants_exactly_one() {
    let ns = TestNamespace::new("source");
    let dir = tempfile::tempdir().unwrap();
    // A dry run stores nothing, so the decode pods' ServiceAccount must exist for their admission.
    let o = cluster().kubectl(&["create", "serviceaccount", "src-decode", "-n", &ns.name]);
    assert!(o.status.success(), "{}", text(&o));
    for source in [
        "{pvc: {claimName: weights, path: qwen3-8b}}",
        "{image: {reference: 'registry.example/models/qwen3-8b:1', pullPolicy: IfNotPresent}}",
        "{hostPath: {path: /mnt/models/qwen3-8b}}",
        "{huggingFace: {repo: Qwen/Qwen3-8B, revision: main, tokenSecretRef: {name: hf}}}",
    ] {
        let file = dir.path().join("src.yaml");
        std::fs::write(&file, sourced(source)).unwrap();
        let (code, yaml, err) = common::operator(&["render", "-f", file.to_str().unwrap(), "-n", &ns.name]);
        assert_eq!(code, 0, "{source}: {err}");
        assert!(yaml.contains("--served-model-name") || source.contains("huggingFace"), "{source}: {yaml}");
        // The rendered engine pods, volumes and all, pass the apiserver's own validation.
        let o = cluster().kubectl_stdin(&["apply", "--dry-run=server", "-n", &ns.name, "-f", "-"], &yaml);
        assert!(o.status.success(), "{source}: {}", text(&o));
    }
    for (source, expect) in
        [("{pvc: {claimName: a}, hostPath: {path: /m}}", "give exactly one model source"), ("{}", "give exactly one model source")]
    {
        let o = ns.apply(&sourced(source));
        assert!(!o.status.success() && text(&o).contains(expect), "{source}: {}", text(&o));
    }
    assert!(ns.get_json("pdd", "src").is_err(), "nothing stored");
}

#[test]
fn cel_rules_reject_a_ratio_band_or_role_bounds_that_cannot_hold() {
    let ns = TestNamespace::new("celscale");
    let spec = |scaling: &str| {
        format!(
            "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {{name: bad}}\nspec:\n  model: {{path: Qwen/Qwen3-8B}}\n  prefill: {{}}\n  decode: {{}}\n  scaling: {scaling}\n"
        )
    };
    let o = ns.apply(&spec("{ratio: {min: 3, max: 1}}"));
    assert!(!o.status.success());
    assert!(text(&o).contains("spec.scaling.ratio.min") && text(&o).contains("must not exceed spec.scaling.ratio.max"), "{}", text(&o));
    let o = ns.apply(&spec("{ratio: {min: 0, max: 1}}"));
    assert!(text(&o).contains("spec.scaling.ratio.min must be positive"), "{}", text(&o));
    let o = ns.apply(&spec("{decode: {minReplicas: 4, maxReplicas: 2}}"));
    assert!(
        text(&o).contains("spec.scaling.decode.minReplicas") && text(&o).contains("lower minReplicas or raise maxReplicas"),
        "{}",
        text(&o)
    );
    assert!(ns.get_json("pdd", "bad").is_err(), "nothing stored");
    let o = ns.apply(&spec("{ratio: {min: 0.5, max: 2}, decode: {minReplicas: 0, maxReplicas: 8}}"));
    assert!(o.status.success(), "a band that holds is accepted: {}", text(&o));
    let stored = ns.get_json("pdd", "bad").unwrap();
    assert_eq!(stored["spec"]["scaling"]["prefill"]["minReplicas"], 1, "a role's minimum defaults to 1");
}

#[test]
fn deleting_a_pddeployment_garbage_collects_owned_children() {
    let ns = TestNamespace::new("gc");
    let o = ns.apply_file(&repo_path("examples/deepseek-v3-dcp.yaml"));
    assert!(o.status.success(), "{}", text(&o));
    let uid = ns.get_json("pdd", "dsv3").unwrap()["metadata"]["uid"].as_str().unwrap().to_owned();
    let child = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: child\n  ownerReferences:\n  - {{apiVersion: pd.inference.dev/v1alpha1, kind: PDDeployment, name: dsv3, uid: {uid}, controller: true, blockOwnerDeletion: true}}\ndata: {{a: b}}\n"
    );
    let o = ns.apply(&child);
    assert!(o.status.success(), "{}", text(&o));
    let o = cluster().kubectl(&["delete", "pdd", "dsv3", "-n", &ns.name, "--wait=false"]);
    assert!(o.status.success(), "{}", text(&o));
    // The garbage collector learns new CRD types from discovery (about every 30 s).
    wait_for(Duration::from_secs(120), "the owned ConfigMap to be garbage-collected", || match ns.get_json("configmap", "child") {
        Ok(v) => Err(v.to_string()),
        Err(e) if e.contains("NotFound") => Ok(()),
        Err(e) => Err(e),
    });
}

#[test]
fn kwok_gpu_nodes_run_a_pod_that_requests_eight_gpus() {
    let c = cluster();
    let o = c.kubectl(&[
        "get",
        "nodes",
        "-l",
        "type=kwok",
        "-o",
        "jsonpath={range .items[*]}{.status.allocatable.nvidia\\.com/gpu}{\"\\n\"}{end}",
    ]);
    let gpus: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().map(str::to_owned).collect();
    assert!(!gpus.is_empty() && gpus.iter().all(|g| g == "8"), "{gpus:?}");
    let ns = TestNamespace::new("gpu");
    let o = ns.apply("apiVersion: v1\nkind: Pod\nmetadata: {name: gpu}\nspec:\n  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 8}}}]\n");
    assert!(o.status.success(), "{}", text(&o));
    wait_for(Duration::from_secs(60), "the GPU pod to run on a kwok node", || {
        let p = ns.get_json("pod", "gpu")?;
        let node = p["spec"]["nodeName"].as_str().unwrap_or_default();
        (p["status"]["phase"] == "Running" && node.starts_with("kwok-gpu-")).then_some(()).ok_or_else(|| p["status"].to_string())
    });
    // A ninth GPU cannot fit on any node: the scheduler really accounts for them.
    let o = ns.apply("apiVersion: v1\nkind: Pod\nmetadata: {name: too-big}\nspec:\n  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 9}}}]\n");
    assert!(o.status.success(), "{}", text(&o));
    wait_for(Duration::from_secs(60), "the 9-GPU pod to be reported unschedulable", || {
        let p = ns.get_json("pod", "too-big")?;
        let cond = p["status"]["conditions"].to_string();
        cond.contains("Insufficient nvidia.com/gpu").then_some(()).ok_or(cond)
    });
}
