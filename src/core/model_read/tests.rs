use k8s_openapi::api::batch::v1::JobCondition;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus};

use super::*;

fn pdd(source: serde_json::Value) -> PDDeployment {
    serde_json::from_value(serde_json::json!({"apiVersion": "pd.inference.dev/v1alpha1", "kind": "PDDeployment",
        "metadata": {"name": "m", "namespace": "ns", "uid": "u"},
        "spec": {"model": {"path": "acme/qwen3-ft", "source": source},
            "prefill": {"template": {"nodeSelector": {"pool": "h100"}, "annotations": {"a": "1"}}}, "decode": {}}}))
    .unwrap()
}

fn config(arch: &str) -> String {
    std::fs::read_to_string(format!("{}/../../tests/parity/configs/{arch}.json", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn each_mounted_source_is_read_where_the_engines_find_it() {
    let p = pdd(serde_json::json!({"pvc": {"claimName": "weights", "path": "qwen3-ft"}}));
    let read = request(&p.spec.model).unwrap();
    assert_eq!(read.field, "spec.model.source.pvc");
    assert_eq!(read.origin, "PersistentVolumeClaim weights: /models/qwen3-ft/config.json");
    let image = pdd(serde_json::json!({"image": {"reference": "registry.example/qwen3:1"}}));
    assert_eq!(request(&image.spec.model).unwrap().origin, "image registry.example/qwen3:1: /models/config.json");
    let host = pdd(serde_json::json!({"hostPath": {"path": "/mnt/qwen3"}}));
    assert_eq!(request(&host.spec.model).unwrap().field, "spec.model.source.hostPath");
    let hub = pdd(serde_json::json!({"huggingFace": {"repo": "acme/qwen3-ft", "endpoint": "http://mirror/"}}));
    let read = request(&hub.spec.model).unwrap();
    assert_eq!(
        (read.field, read.origin.as_str()),
        ("spec.model.source.huggingFace", "http://mirror/acme/qwen3-ft/resolve/main/config.json")
    );
    assert!(matches!(read.from, ReadFrom::Hub(ref r) if r.url == read.origin && r.repo == "acme/qwen3-ft"), "{read:?}");
    let mut given = p.clone();
    given.spec.model.config_map_ref = Some(pd_api::ConfigMapKeyRef { name: "mine".into(), key: "config.json".into() });
    assert_eq!(request(&given.spec.model), None, "a configMapRef wins");
    let other = pdd(serde_json::json!({"pvc": {"claimName": "weights", "path": "other"}}));
    assert_ne!(job_name("m", &p.spec.model), job_name("m", &other.spec.model), "another source, another Job");
}

#[test]
fn the_job_mounts_the_source_read_only_beside_the_engines_and_never_retries_much() {
    let p = pdd(serde_json::json!({"pvc": {"claimName": "weights", "path": "qwen3-ft"}}));
    let reader = job(&p, "pd-operator:dev").unwrap();
    assert_eq!(reader.metadata.name, job_name("m", &p.spec.model));
    assert_eq!(reader.metadata.owner_references.as_ref().unwrap()[0].uid, "u");
    let spec = reader.spec.unwrap();
    assert_eq!((spec.backoff_limit, spec.ttl_seconds_after_finished), (Some(BACKOFF_LIMIT), Some(TTL_SECONDS)));
    let template = spec.template;
    assert_eq!(template.metadata.unwrap().annotations.unwrap()["a"], "1", "the roles' template annotations");
    let pod = template.spec.unwrap();
    assert_eq!(pod.node_selector.unwrap()["pool"], "h100", "where the prefill pods go");
    assert_eq!((pod.restart_policy.as_deref(), pod.automount_service_account_token), (Some("Never"), Some(false)));
    let volume = &pod.volumes.unwrap()[0];
    assert_eq!(volume.persistent_volume_claim.as_ref().unwrap().read_only, Some(true));
    let c = &pod.containers[0];
    assert_eq!(
        c.args.as_deref().unwrap(),
        [SUBCOMMAND, "--file", "/models/qwen3-ft/config.json", "--termination-log", "/dev/termination-log"]
    );
    let resources = c.resources.as_ref().unwrap();
    assert!(resources.requests.as_ref().unwrap().keys().all(|k| ["cpu", "memory", "ephemeral-storage"].contains(&k.as_str())), "no GPU");
    let limits = resources.limits.as_ref().unwrap();
    assert!(["cpu", "memory", "ephemeral-storage"].iter().all(|k| limits.contains_key(*k)), "{limits:?}");
    assert_eq!(c.security_context, Some(crate::pod::restricted_security_context()));
    assert_eq!(c.env, None, "a mounted source's reader gets no token");
}

/// A Hub source's reader: no volume, the URL, and the token from the Secret by reference into
/// this pod alone (the operator never reads it).
#[test]
fn a_hub_sources_job_gets_the_url_and_the_token_by_reference_and_no_rights() {
    let p =
        pdd(serde_json::json!({"huggingFace": {"repo": "acme/x", "endpoint": "http://hub", "tokenSecretRef": {"name": "hf", "key": "t"}}}));
    let pod = job(&p, "pd-operator:dev").unwrap().spec.unwrap().template.spec.unwrap();
    assert_eq!((pod.volumes.as_ref(), pod.automount_service_account_token), (None, Some(false)));
    let c = &pod.containers[0];
    assert_eq!(
        c.args.as_deref().unwrap(),
        [
            SUBCOMMAND,
            "--url",
            "http://hub/acme/x/resolve/main/config.json",
            "--repo",
            "acme/x",
            "--token-secret",
            "hf",
            "--token-key",
            "t",
            "--termination-log",
            "/dev/termination-log"
        ]
    );
    let env = c.env.as_ref().unwrap();
    let secret = env[0].value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
    assert_eq!((env[0].name.as_str(), secret.name.as_str(), secret.key.as_str(), env[0].value.as_ref()), (TOKEN_ENV, "hf", "t", None));
    assert_eq!(c.volume_mounts, None);
    let other = pdd(serde_json::json!({"huggingFace": {"repo": "acme/y", "endpoint": "http://hub"}}));
    assert_ne!(job_name("m", &p.spec.model), job_name("m", &other.spec.model), "another repository, another Job");
}

#[test]
fn a_config_travels_in_the_message_compact_or_gzipped_and_an_error_says_why() {
    let dsv3 = config("DeepseekV3ForCausalLM");
    let message = encode(&dsv3).unwrap();
    assert!(message.starts_with('{') && message.len() < dsv3.len(), "compact JSON: {message}");
    let back: serde_json::Value = serde_json::from_str(&decode(&message).unwrap()).unwrap();
    assert_eq!(back, serde_json::from_str::<serde_json::Value>(&dsv3).unwrap());
    // A quantized model's config lists hundreds of modules: too long as it is, not gzipped.
    let modules: Vec<String> = (0..400).map(|i| format!("model.layers.{i}.mlp.gate")).collect();
    let big = serde_json::json!({"architectures": ["Qwen3ForCausalLM"], "quantization_config": {"modules_to_not_convert": modules}});
    let message = encode(&big.to_string()).unwrap();
    assert!(message.starts_with("gz:") && message.len() <= MESSAGE_LIMIT, "{} bytes", message.len());
    assert_eq!(serde_json::from_str::<serde_json::Value>(&decode(&message).unwrap()).unwrap(), big);
    // Hashes do not compress: 20,000 hex digits stay about 10,000 bytes gzipped.
    let noise: String = (0..313u32).map(|i| format!("{:x}", <sha2::Sha256 as sha2::Digest>::digest(i.to_le_bytes()))).collect();
    let e = encode(&serde_json::json!({"x": noise}).to_string()).unwrap_err();
    assert!(e.contains("over the 4096 bytes a termination message carries") && e.contains("spec.model.configMapRef"), "{e}");
    let e = decode("error: /models/config.json: no such file").unwrap_err();
    assert_eq!((e.reason, e.message.as_str()), (NOT_READ, "/models/config.json: no such file"));
    // A Hub answer's reason travels in brackets; one the operator does not know is not copied.
    let e = decode(&encode_error(Some("ConfigNotFound"), "GET u: HTTP 404")).unwrap_err();
    assert_eq!((e.reason, e.message.as_str()), ("ConfigNotFound", "GET u: HTTP 404"));
    let e = decode("error: [Pwned] GET u: HTTP 404").unwrap_err();
    assert_eq!((e.reason, e.message.as_str()), (NOT_READ, "[Pwned] GET u: HTTP 404"));
    assert!(encode("<html>").unwrap_err().starts_with("config.json is not valid JSON"));
}

fn ended(message: &str, created: &str) -> Pod {
    let terminated = ContainerStateTerminated { message: Some(message.into()), ..Default::default() };
    let status = ContainerStatus {
        name: CONTAINER.into(),
        state: Some(ContainerState { terminated: Some(terminated), ..Default::default() }),
        ..Default::default()
    };
    let mut pod = Pod { status: Some(PodStatus { container_statuses: Some(vec![status]), ..Default::default() }), ..Default::default() };
    pod.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(created.parse().unwrap()));
    pod
}

fn finished(type_: &str, message: &str) -> Job {
    let condition = JobCondition { type_: type_.into(), status: "True".into(), message: Some(message.into()), ..Default::default() };
    Job {
        status: Some(k8s_openapi::api::batch::v1::JobStatus { conditions: Some(vec![condition]), ..Default::default() }),
        ..Default::default()
    }
}

#[test]
fn the_jobs_state_is_the_newest_pods_message() {
    let read = request(&pdd(serde_json::json!({"pvc": {"claimName": "weights"}})).spec.model).unwrap();
    let waiting = state(&read, "j", None, &[]);
    assert!(matches!(&waiting, ReadState::Reading(m) if m.contains("creating Job j to read PersistentVolumeClaim weights")), "{waiting:?}");
    assert!(matches!(state(&read, "j", Some(&Job::default()), &[]), ReadState::Reading(m) if m.contains("with Job j")));
    let qwen = r#"{"architectures":["Qwen3ForCausalLM"]}"#;
    let pods = [ended("error: evicted", "2026-12-05T10:00:00Z"), ended(qwen, "2026-12-05T10:01:00Z")];
    assert_eq!(state(&read, "j", Some(&finished("Complete", "")), &pods), ReadState::Read(qwen.into()));
    let missing = [ended("error: /models/config.json: no such file (the directory holds: a.bin)", "2026-12-05T10:00:00Z")];
    let ReadState::Failed(ReadError { reason, message: why }) =
        state(&read, "j", Some(&finished("Failed", "BackoffLimitExceeded")), &missing)
    else {
        panic!()
    };
    assert_eq!(reason, NOT_READ);
    assert!(why.starts_with("reading PersistentVolumeClaim weights: /models/config.json: /models/config.json: no such file"), "{why}");
    assert!(why.contains("fix the source; Job j; it is read again when the Job is deleted, 300 s after it ended"), "{why}");
    let ReadState::Failed(ReadError { message: why, .. }) =
        state(&read, "j", Some(&finished("Failed", "Job has reached the specified backoff limit")), &[])
    else {
        panic!()
    };
    assert!(why.contains("Job has reached the specified backoff limit"), "{why}");
}

#[test]
fn a_config_map_ref_wins_and_every_source_is_kept_under_one_name() {
    let hub = |s: serde_json::Value| -> ModelSpec {
        serde_json::from_value(serde_json::json!({"path": "acme/ft", "source": {"huggingFace": s}})).unwrap()
    };
    let m = hub(serde_json::json!({"repo": "acme/ft", "endpoint": "http://mirror:8080/"}));
    let r = crate::hub::request(&m).unwrap();
    let mut old: ModelSpec = serde_json::from_value(serde_json::json!({"path": "acme/ft", "revision": "v1",
        "source": {"huggingFace": {"repo": "acme/ft"}}}))
    .unwrap();
    old.config_map_ref = Some(ConfigMapKeyRef { name: "mine".into(), key: "c".into() });
    assert_eq!(crate::hub::request(&old), None, "a configMapRef wins");
    assert_eq!(config_ref("x", &old).unwrap().name, "mine");
    assert_eq!(config_ref("x", &m).unwrap(), ConfigMapKeyRef { name: "x-model-config".into(), key: CONFIG_FILE.into() });
    let pvc: ModelSpec = serde_json::from_value(serde_json::json!({"path": "p", "source": {"pvc": {"claimName": "w"}}})).unwrap();
    assert_eq!(crate::hub::request(&pvc), None);
    assert_eq!(config_ref("x", &pvc).unwrap().name, "x-model-config", "a mounted source's is kept too");
    assert_eq!(config_source(&old), ConfigSource::ConfigMap(ConfigMapKeyRef { name: "mine".into(), key: "c".into() }));
    assert!(matches!(config_source(&m), ConfigSource::Read(h) if h.from == ReadFrom::Hub(r.clone()) && h.origin == r.url));
    assert!(matches!(config_source(&pvc), ConfigSource::Read(v) if v.origin == "PersistentVolumeClaim w: /models/config.json"));
    let none: ModelSpec = serde_json::from_value(serde_json::json!({"path": "Qwen/Qwen3-8B"})).unwrap();
    assert_eq!(config_source(&none), ConfigSource::Catalogue);
}

#[test]
fn the_kept_config_map_serves_only_the_url_it_was_read_from() {
    let pdd = pdd(serde_json::json!({"huggingFace": {"repo": "acme/ft"}}));
    let r = crate::hub::request(&pdd.spec.model).unwrap();
    let cm = config_map(&pdd, &r.url, r#"{"architectures": ["Qwen3ForCausalLM"]}"#);
    assert_eq!(cm.metadata.name.as_deref(), Some("m-model-config"));
    assert_eq!(cm.metadata.owner_references.as_ref().unwrap()[0].uid, "u");
    assert_eq!(kept(&cm, &r.url).unwrap().1.architectures, ["Qwen3ForCausalLM"]);
    assert!(kept(&cm, &format!("{}x", r.url)).is_none(), "another revision is read again");
}
