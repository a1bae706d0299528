//! Golden files for the engine argv `render` produces; `BLESS=1 cargo test` rewrites them.

use std::path::{Path, PathBuf};

use pd_api::PDDeployment;
use pd_core::manifest;
use pd_core::model;
use pd_core::render::{self, RenderOptions, Rendered};

/// A path of the repository (this suite runs in `src/core`).
fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

fn rendered(example: &str) -> Rendered {
    let opts = RenderOptions {
        operator_image: "pd-operator:test".into(),
        sim_image: "pd-sim:test".into(),
        default_namespace: "ml".into(),
        workload_api: false,
        ..RenderOptions::default()
    };
    rendered_with(example, &opts)
}

fn rendered_with(example: &str, opts: &RenderOptions) -> Rendered {
    let loaded = manifest::load_files(&[repo(&format!("examples/{example}"))]).unwrap();
    let pdd: &PDDeployment = &loaded.deployments[0].object;
    render::render(pdd, &model::resolve(&pdd.spec.model, None), opts).unwrap()
}

fn argv_of(r: &Rendered, pod: &str) -> String {
    let pod = r.pods().find(|p| p.metadata.name.as_deref() == Some(pod)).unwrap_or_else(|| panic!("no pod {pod}"));
    let c = &pod.spec.as_ref().unwrap().containers[0];
    c.command.iter().flatten().chain(c.args.iter().flatten()).cloned().collect::<Vec<_>>().join("\n") + "\n"
}

fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| panic!("{} missing; run with BLESS=1", path.display()));
    assert_eq!(actual, expected, "{} differs from the rendered argv", path.display());
}

#[test]
fn prefill_leader_and_worker_argv() {
    let r = rendered("multi-node-prefill.yaml");
    golden("r1-prefill-leader.argv", &argv_of(&r, "r1-prefill-0-0"));
    golden("r1-prefill-worker.argv", &argv_of(&r, "r1-prefill-0-1"));
}

#[test]
fn decode_argv() {
    golden("dsv3-decode.argv", &argv_of(&rendered("deepseek-v3-dcp.yaml"), "dsv3-decode-1-0"));
}

#[test]
fn router_argv() {
    let r = rendered("deepseek-v3-dcp.yaml");
    let c = &r.deployments[0].spec.template.spec.as_ref().unwrap().containers[0];
    let argv = c.command.iter().flatten().chain(c.args.iter().flatten()).cloned().collect::<Vec<_>>().join("\n") + "\n";
    golden("dsv3-router.argv", &argv);
}

#[test]
fn object_inventory_matches_the_layout() {
    let r = rendered("multi-node-prefill.yaml");
    let names: Vec<_> = r.pods().filter_map(|p| p.metadata.name.clone()).collect();
    assert_eq!(names, ["r1-prefill-0-0", "r1-prefill-0-1", "r1-decode-0-0"]);
    let svcs: Vec<_> = r.services.iter().filter_map(|s| s.metadata.name.clone()).collect();
    assert_eq!(svcs, ["r1-engines", "r1-router"]);
    for p in r.pods() {
        let l = p.metadata.labels.as_ref().unwrap();
        assert_eq!(l["app.kubernetes.io/managed-by"], "pd-operator");
        assert_eq!(l["pd.inference.dev/deployment"], "r1");
        assert!(l.contains_key("pd.inference.dev/instance") && l.contains_key("pd.inference.dev/node-rank"));
        let spec = p.spec.as_ref().unwrap();
        let gpus = &spec.containers[0].resources.as_ref().unwrap().limits.as_ref().unwrap()["nvidia.com/gpu"];
        assert_eq!(gpus.0, "8");
        assert_eq!(spec.subdomain.as_deref(), Some("r1-engines"), "one Service names every engine pod");
        assert_eq!(l["pd.inference.dev/engine"], "true");
    }
    // Decode pods carry the handshake sidecar as a native sidecar and its readiness gate.
    let decode = r.pods().find(|p| p.metadata.name.as_deref() == Some("r1-decode-0-0")).unwrap().spec.clone().unwrap();
    let sidecar = &decode.init_containers.unwrap()[0];
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    assert_eq!(decode.readiness_gates.unwrap()[0].condition_type, "pd.inference.dev/handshake");
    let cm = &r.config_maps[0];
    assert_eq!(cm.data.as_ref().unwrap()["prefill-addresses"], "r1-prefill-0-0.r1-engines.ml.svc:8998\n");
}

#[test]
fn one_headless_service_selects_every_engine_pod_and_not_the_router() {
    let r = rendered("multi-node-prefill.yaml");
    let engines = r.services.iter().find(|s| s.metadata.name.as_deref() == Some("r1-engines")).expect("the engines' Service");
    let spec = engines.spec.as_ref().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(spec.publish_not_ready_addresses, Some(true), "ranks resolve their leader before anything is Ready");
    let selector = spec.selector.as_ref().unwrap();
    let selects = |labels: &std::collections::BTreeMap<String, String>| selector.iter().all(|(k, v)| labels.get(k) == Some(v));
    for p in r.pods() {
        assert!(selects(p.metadata.labels.as_ref().unwrap()), "{:?} not selected", p.metadata.name);
    }
    let router = r.deployments[0].spec.template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
    assert!(!selects(router), "the router's pods are not engines: {router:?}");
}

#[test]
fn sim_engine_runs_the_same_flags_under_another_program() {
    let r = rendered("sim-demo.yaml");
    let c = &r.pods().next().unwrap().spec.as_ref().unwrap().containers[0];
    assert_eq!(c.command.as_deref().unwrap(), ["pd-sim", "engine"]);
    assert_eq!(c.image.as_deref(), Some("pd-sim:test"));
    assert!(c.args.as_ref().unwrap().windows(2).any(|w| w == ["--disaggregation-mode", "prefill"]));
}

#[test]
fn a_spec_change_changes_only_that_roles_revision() {
    let loaded = manifest::load_files(&[repo("examples/deepseek-v3-dcp.yaml")]).unwrap();
    let mut spec = loaded.deployments[0].object.spec.clone();
    let opts = RenderOptions::default();
    let before = (render::role_revision(&spec, pd_api::Role::Prefill, &opts), render::role_revision(&spec, pd_api::Role::Decode, &opts));
    spec.decode.replicas = 7;
    spec.prefill.replicas = 3;
    let scaled = (render::role_revision(&spec, pd_api::Role::Prefill, &opts), render::role_revision(&spec, pd_api::Role::Decode, &opts));
    assert_eq!(before, scaled, "scaling must not roll pods");
    spec.decode.template.extra_args = vec!["--mem-fraction-static".into(), "0.8".into()];
    let changed = (render::role_revision(&spec, pd_api::Role::Prefill, &opts), render::role_revision(&spec, pd_api::Role::Decode, &opts));
    assert_eq!(changed.0, before.0);
    assert_ne!(changed.1, before.1);
}

fn router_pod(r: &Rendered) -> k8s_openapi::api::core::v1::PodSpec {
    r.deployments[0].spec.template.spec.clone().unwrap()
}

#[test]
fn the_router_is_smg_for_both_engines_with_its_own_read_only_pod_access() {
    for (example, name) in [("deepseek-v3-dcp.yaml", "dsv3"), ("sim-demo.yaml", "sim-dsv3")] {
        let r = rendered(example);
        let pod = router_pod(&r);
        let c = &pod.containers[0];
        assert_eq!(c.command.as_deref().unwrap(), ["python3", "-m", "smg.launch_router"], "{example}");
        assert_eq!(c.image.as_deref(), Some(pd_api::DEFAULT_ROUTER_IMAGE), "{example}");
        let account = format!("{name}-router");
        assert_eq!(pod.service_account_name.as_deref(), Some(account.as_str()));
        assert!(r.service_accounts.iter().any(|a| a.metadata.name.as_deref() == Some(account.as_str())));
        let role = r.roles.iter().find(|x| x.metadata.name.as_deref() == Some(account.as_str())).expect("router Role");
        let rules = role.rules.clone().unwrap();
        assert_eq!(rules.len(), 1, "{rules:?}");
        assert_eq!(rules[0].resources.as_deref().unwrap(), ["pods"]);
        assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
        let binding = r.role_bindings.iter().find(|b| b.metadata.name.as_deref() == Some(account.as_str())).expect("RoleBinding");
        assert_eq!(binding.role_ref.name, account);
        assert_eq!(binding.subjects.as_ref().unwrap()[0].name, account);
    }
}

#[test]
fn prefill_leaders_carry_the_bootstrap_port_smg_discovery_reads() {
    let r = rendered("multi-node-prefill.yaml");
    let annotation = |pod: &str| {
        let p = r.pods().find(|p| p.metadata.name.as_deref() == Some(pod)).unwrap();
        p.metadata.annotations.as_ref().and_then(|a| a.get(render::BOOTSTRAP_PORT_ANNOTATION).cloned())
    };
    assert_eq!(annotation("r1-prefill-0-0").as_deref(), Some("8998"));
    assert_eq!(annotation("r1-prefill-0-1"), None, "a worker node serves no HTTP and no bootstrap server");
    assert_eq!(annotation("r1-decode-0-0"), None);
}

#[test]
fn scaling_leaves_the_router_untouched() {
    let loaded = manifest::load_files(&[repo("examples/deepseek-v3-dcp.yaml")]).unwrap();
    let mut pdd: PDDeployment = loaded.deployments[0].object.clone();
    let facts = model::resolve(&pdd.spec.model, None);
    let opts = RenderOptions::default();
    let before = render::render(&pdd, &facts, &opts).unwrap();
    pdd.spec.prefill.replicas += 2;
    pdd.spec.decode.replicas += 3;
    let after = render::render(&pdd, &facts, &opts).unwrap();
    assert_eq!(before.deployments, after.deployments, "the router finds workers by discovery: no restart on scale");
    assert_eq!(after.pods().count(), before.pods().count() + 5);
}

/// Every example, rendered for each supported release, gives engine argv whose every option that
/// release's own argparse table knows (0.5.21 has neither `--attn-dp-size` nor
/// `--disaggregation-decode-allocation-policy`).
#[test]
fn every_example_renders_argv_each_release_parses() {
    use pd_core::release::Release;
    use pd_core::sglang_args::{OptionMatch, match_option};
    let mut checked = 0;
    for entry in std::fs::read_dir(repo("examples")).unwrap() {
        let path = entry.unwrap().path();
        let loaded = manifest::load_files(std::slice::from_ref(&path)).unwrap();
        for d in &loaded.deployments {
            for release in Release::SUPPORTED {
                let mut pdd = d.object.clone();
                pdd.spec.engine.version = Some(release.as_str().into());
                let opts = RenderOptions {
                    operator_image: "pd-operator:test".into(),
                    sim_image: "pd-sim:test".into(),
                    default_namespace: "ml".into(),
                    workload_api: false,
                    ..RenderOptions::default()
                };
                let Ok(r) = render::render(&pdd, &model::resolve(&pdd.spec.model, None), &opts) else { continue };
                for pod in r.pods() {
                    for arg in pod.spec.as_ref().unwrap().containers[0].args.iter().flatten() {
                        let m = match_option(release, arg);
                        assert!(
                            matches!(m, None | Some(OptionMatch::Option { .. })),
                            "{}: SGLang {release} reads {arg} as {m:?}",
                            path.display()
                        );
                        checked += usize::from(m.is_some());
                    }
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} options checked");
}

#[test]
fn attention_dp_is_spelled_as_each_release_reads_it() {
    let argv = |version: &str| {
        let loaded = manifest::load_files(&[repo("examples/deepseek-v3-dcp.yaml")]).unwrap();
        let mut pdd = loaded.deployments[0].object.clone();
        pdd.spec.engine.version = Some(version.into());
        pdd.spec.decode.parallelism.attn_dp = 2;
        render::engine_args(&pdd.spec, pd_api::Role::Decode, "dsv3", "ml", 0, 0, 0).join(" ")
    };
    let (old, new) = (argv("0.5.21"), argv("0.5.22"));
    assert!(old.contains("--dp-size 2 --enable-dp-attention") && !old.contains("--attn-dp-size"), "{old}");
    assert!(!old.contains("--disaggregation-decode-allocation-policy"), "{old}");
    assert!(new.contains("--dp-size 1 --attn-dp-size 2") && new.contains("--disaggregation-decode-allocation-policy early"), "{new}");
}

fn rendered_with_operator_image(example: &str, operator_image: &str) -> Rendered {
    rendered_with(example, &RenderOptions { operator_image: operator_image.into(), ..RenderOptions::default() })
}

#[test]
fn the_operators_image_shapes_no_engine_pod_but_the_sidecar() {
    for example in ["qwen3-gqa.yaml", "deepseek-v3-dcp.yaml", "multi-node-prefill.yaml"] {
        let (a, b) = (rendered_with_operator_image(example, "pd-operator:a"), rendered_with_operator_image(example, "pd-operator:b"));
        let (a_pods, b_pods): (Vec<_>, Vec<_>) = (a.pods().collect(), b.pods().collect());
        assert_eq!(a_pods.len(), b_pods.len());
        for (pa, pb) in a_pods.iter().zip(&b_pods) {
            assert_eq!(pa.metadata, pb.metadata, "{example}: labels (revision) and annotations are the same");
            let (sa, sb) = (pa.spec.as_ref().unwrap(), pb.spec.as_ref().unwrap());
            assert_eq!(sa.containers, sb.containers, "{example}: the engine container is the same");
            let sidecar_images = |s: &k8s_openapi::api::core::v1::PodSpec| -> Vec<Option<String>> {
                s.init_containers.iter().flatten().map(|c| c.image.clone()).collect()
            };
            let strip = |s: &k8s_openapi::api::core::v1::PodSpec| {
                let mut s = s.clone();
                s.init_containers.iter_mut().flatten().for_each(|c| c.image = None);
                s
            };
            assert_eq!(strip(sa), strip(sb), "{example}: the pods differ at most in the sidecar's image");
            if !sidecar_images(sa).is_empty() {
                assert_eq!(sidecar_images(sa), [Some("pd-operator:a".to_owned())]);
            }
        }
    }
}

#[test]
fn the_revisions_pd_operator_0_1_0_gave_are_reproduced_for_adoption() {
    // `pd-operator render -f examples/qwen3-gqa.yaml` of 0.1.0 (commit ad768bb) labelled the
    // prefill pods 6573fb4acf and the decode pods 7f0ace4ab4, with its default image.
    let loaded = manifest::load_files(&[repo("examples/qwen3-gqa.yaml")]).unwrap();
    let spec = &loaded.deployments[0].object.spec;
    let legacy = |role| render::legacy_role_revision(spec, role, "pd-operator:0.1.0");
    assert_eq!(legacy(pd_api::Role::Prefill).as_deref(), Some("6573fb4acf"));
    assert_eq!(legacy(pd_api::Role::Decode).as_deref(), Some("7f0ace4ab4"));
    assert_ne!(legacy(pd_api::Role::Prefill), Some(render::role_revision(spec, pd_api::Role::Prefill, &RenderOptions::default())));
    let sim = &manifest::load_files(&[repo("examples/sim-demo.yaml")]).unwrap().deployments[0].object.spec;
    assert_eq!(render::legacy_role_revision(sim, pd_api::Role::Decode, "pd-operator:0.1.0"), None, "a sim engine's image changed");
}

#[test]
fn the_leader_engine_is_restarted_when_sglangs_progress_check_fails_for_hang_seconds() {
    let probes = |pdd: &PDDeployment| {
        let r = render::render(pdd, &model::resolve(&pdd.spec.model, None), &RenderOptions::default()).unwrap();
        r.pods()
            .map(|p| {
                let engine = p.spec.as_ref().unwrap().containers.iter().find(|c| c.name == pd_core::names::ENGINE_CONTAINER).unwrap();
                (p.metadata.name.clone().unwrap(), engine.liveness_probe.clone(), engine.startup_probe.clone())
            })
            .collect::<Vec<_>>()
    };
    let loaded = manifest::load_files(&[repo("examples/multi-node-prefill.yaml")]).unwrap();
    let mut pdd = loaded.deployments[0].object.clone();
    let before = render::role_revision(&pdd.spec, pd_api::Role::Prefill, &RenderOptions::default());
    for (name, liveness, startup) in probes(&pdd) {
        let leader = name.split('-').nth_back(0) == Some("0");
        assert_eq!(liveness.is_some(), leader, "{name}: only the leader serves HTTP");
        if let Some(l) = liveness {
            let get = l.http_get.unwrap();
            assert_eq!(get.path.as_deref(), Some("/health_generate"), "SGLang's check that generates");
            assert_eq!((l.period_seconds, l.timeout_seconds, l.failure_threshold), (Some(30), Some(25), Some(4)), "120 s by default");
            assert_eq!(startup.unwrap().failure_threshold, Some(360), "an hour to start by default");
        }
    }
    pdd.spec.recovery.hang_seconds = Some(0);
    assert!(probes(&pdd).iter().all(|(_, l, _)| l.is_none()), "0 turns the check off");
    pdd.spec.recovery.hang_seconds = Some(61);
    pdd.spec.recovery.startup_seconds = Some(600);
    let leader = probes(&pdd).into_iter().find_map(|(_, l, s)| l.map(|l| (l, s.unwrap()))).unwrap();
    assert_eq!((leader.0.failure_threshold, leader.1.failure_threshold), (Some(3), Some(60)));
    let after = render::role_revision(&pdd.spec, pd_api::Role::Prefill, &RenderOptions::default());
    assert_ne!(before, after, "a pod's probes are fixed: a changed setting rolls the role");
}
