//! Every example with a DSA or DeepSeek-V4 model passes the decode's handshake sidecar against
//! the sim prefill (src/sim), the stand-in for what SGLang's prefill reports: the decode topology
//! `render` puts into `decode.json`, judged by the sidecar's own code (`probe::assess`, then the
//! rank lookup it dials) against the topology body the sim's bootstrap server serves once every
//! prefill rank has registered. The sim reads the model's config.json from `--model-path`, as
//! SGLang does, so the example's ConfigMap is laid out there.

use std::path::{Path, PathBuf};

use pd_api::{PDDeploymentSpec, Role};
use pd_core::handshake::core::DecodeTopology;
use pd_core::model::{self, HfConfig, ModelFacts};
use pd_core::{manifest, render, resolve};
use pd_runtime::probe;
use pd_sim::{bootstrap::Registry, flags};

struct Example {
    file: PathBuf,
    name: String,
    spec: PDDeploymentSpec,
    facts: ModelFacts,
    config: Option<String>,
}

fn examples() -> Vec<Example> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let mut out = Vec::new();
    for file in files.into_iter().filter(|f| f.extension().is_some_and(|e| e == "yaml")) {
        let loaded = manifest::load_files(std::slice::from_ref(&file)).unwrap();
        for d in loaded.deployments {
            let spec = d.object.spec;
            let config = spec.model.config_map_ref.as_ref().map(|r| {
                let cm = loaded.config_maps.iter().find(|c| c.metadata.name.as_deref() == Some(r.name.as_str())).unwrap();
                cm.data.as_ref().unwrap()[&r.key].clone()
            });
            let facts = model::resolve(&spec.model, config.as_deref().map(|t| HfConfig::parse(t).unwrap()).as_ref());
            out.push(Example { file: file.clone(), name: d.object.metadata.name.unwrap(), spec, facts, config });
        }
    }
    out
}

/// The prefill instance's argv as rendered, with `--model-path` pointing at a directory that
/// holds the example's config.json when it has one.
fn prefill_argv(e: &Example, spec: &PDDeploymentSpec, model_dir: &Path) -> Vec<String> {
    let mut argv = render::engine_args(spec, Role::Prefill, &e.name, "default", 0, 0, 0);
    if let Some(text) = &e.config {
        std::fs::write(model_dir.join("config.json"), text).unwrap();
        let at = argv.iter().position(|a| a == "--model-path").unwrap() + 1;
        argv[at] = model_dir.to_str().unwrap().to_owned();
    }
    argv
}

/// Every prefill rank of the sim registers; the bootstrap server's `GET /route` topology body.
fn served_topology(argv: &[String]) -> (u16, String, Registry) {
    let f = flags::EngineFlags::parse(argv).unwrap();
    let t = flags::resolve(&f).unwrap();
    let mut reg = Registry::default();
    for (i, slot) in flags::rank_slots(&t).into_iter().enumerate() {
        let body = flags::registration_body(&f, &t, slot, "10.0.0.7", 40000 + u16::try_from(i).unwrap());
        assert_eq!(reg.put_route(body.to_string().as_bytes()).status, 200);
    }
    let reply = reg.get_route([Some("-1"); 4]);
    (reply.status, reply.body, reg)
}

#[test]
fn every_dsa_and_v4_example_passes_the_sidecar_against_the_sim_prefill() {
    let dir = std::env::temp_dir().join(format!("pd-sidecar-examples-{}", std::process::id()));
    let mut judged = Vec::new();
    for e in examples().iter().filter(|e| e.facts.is_dsa() || e.facts.traits.deepseek_v4) {
        let model_dir = dir.join(&e.name);
        std::fs::create_dir_all(&model_dir).unwrap();
        // What render pins for both roles, and the decode.json it writes for the sidecar.
        let spec = resolve::with_page_size(&e.spec, &e.facts);
        let decode_json = serde_json::to_value(resolve::decode_topology(&spec, &e.facts)).unwrap();
        let decode = DecodeTopology::parse(&decode_json).unwrap();
        let (status, body, reg) = served_topology(&prefill_argv(e, &spec, &model_dir));
        let (served, info, handshake) = probe::assess(&decode, status, body.as_bytes())
            .unwrap_or_else(|v| panic!("{}: {}: the sidecar refuses the sim prefill: {v:?}", e.file.display(), e.name));
        // The stand-in reports what SGLang's prefill would (the parity tier checks these values
        // against SGLang's own resolution and pool code).
        let expected = resolve::prefill_info(&spec, &e.facts);
        assert_eq!((info.page_size, &info.kv_cache_dtype), (expected.page_size, &expected.kv_cache_dtype), "{}", e.name);
        assert_eq!(served.get("kv_layout").cloned().unwrap_or_default(), expected.kv_layout, "{}", e.name);
        // Every row a decode rank will look up is registered (the sidecar then dials it).
        let rows = probe::needed_rows(&info, &handshake.ranks);
        assert!(!rows.is_empty(), "{}", e.name);
        for (dp, cp, tp, pp) in rows {
            let q = [dp, cp, tp, pp].map(|v| v.to_string());
            let reply = reg.get_route([Some(q[0].as_str()), Some(q[1].as_str()), Some(q[2].as_str()), Some(q[3].as_str())]);
            assert_eq!(reply.status, 200, "{}: row {q:?}: {}", e.name, reply.body);
            assert!(probe::parse_row(reply.body.as_bytes()).is_ok(), "{}", e.name);
        }
        judged.push((e.name.clone(), decode.page_size, decode.kv_cache_dtype.clone(), decode.kv_layout.clone()));
    }
    std::fs::remove_dir_all(&dir).ok();
    let names: Vec<&str> = judged.iter().map(|j| j.0.as_str()).collect();
    assert!(names.contains(&"dsv32") && names.contains(&"dsv4"), "{judged:?}");
    assert!(judged.contains(&("dsv4".into(), 256, "fp8_e4m3".into(), Some("v4,c4:v4,c128:v4".into()))), "{judged:?}");
    assert!(judged.contains(&("dsv32".into(), 64, "bfloat16".into(), None)), "{judged:?}");
}

#[test]
fn a_prefill_reporting_another_layout_is_refused_with_sglangs_text() {
    let e = examples().into_iter().find(|e| e.name == "dsv4").unwrap();
    let spec = resolve::with_page_size(&e.spec, &e.facts);
    let decode = resolve::decode_topology(&spec, &e.facts);
    let model_dir = std::env::temp_dir().join(format!("pd-sidecar-layout-{}", std::process::id()));
    std::fs::create_dir_all(&model_dir).unwrap();
    // A decode whose pool runs another layout (e.g. SGLANG_DSV4_KV_LAYOUT=v41 on a B200 decode).
    let (status, body, _) = served_topology(&prefill_argv(&e, &spec, &model_dir));
    std::fs::remove_dir_all(&model_dir).ok();
    let mut other = decode.clone();
    other.kv_layout = Some("v41,c4:v41,c128:v41".into());
    let verdict = probe::assess(&other, status, body.as_bytes()).unwrap_err();
    let (_, message) = verdict.reason_and_message();
    assert!(
        message.contains(
            "KV layout mismatch: prefill server has kv_layout=v4,c4:v4,c128:v4, but decode server has kv_layout=v41,c4:v41,c128:v41."
        ),
        "{message}"
    );
}
