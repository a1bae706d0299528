use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::model_source;

fn model(hf: serde_json::Value) -> ModelSpec {
    serde_json::from_value(serde_json::json!({"path": "acme/ft", "source": {"huggingFace": hf}})).unwrap()
}

fn cached_model() -> ModelSpec {
    model(serde_json::json!({"repo": "acme/ft", "revision": "refs/pr/1", "endpoint": "http://hub:8080/",
        "tokenSecretRef": {"name": "hf"}, "cache": {"claimName": "weights"}}))
}

#[test]
fn a_cache_puts_the_revision_in_its_own_directory_and_names_the_job_after_it() {
    let m = cached_model();
    assert_eq!(cache_dir(&m).as_deref(), Some("acme/ft/refs--pr--1"));
    assert_eq!(claim_name("m", &m).as_deref(), Some("weights"));
    let job = job_name("m", &m).unwrap();
    assert!(job.starts_with("model-fetch-") && job.len() == "model-fetch-".len() + 10, "{job}");
    assert_eq!(job_name("other", &m).unwrap(), job, "PDDeployments of one revision in one claim share the Job");
    let mut other = m.clone();
    other.source.as_mut().unwrap().hugging_face.as_mut().unwrap().revision = Some("v2".into());
    assert_ne!(job_name("m", &other).unwrap(), job, "another revision, another Job");
    assert_eq!(job_name("m", &m).unwrap(), job, "stable");
    let uncached = model(serde_json::json!({"repo": "acme/ft"}));
    assert!(cached(&uncached).is_none() && cache_dir(&uncached).is_none() && job_name("m", &uncached).is_none());
    let claimed = model(serde_json::json!({"repo": "acme/ft", "cache": {"storageClassName": "nfs", "size": "20Gi"}}));
    let claim = claim_name("m", &claimed).unwrap();
    assert!(claim.starts_with("m-model-cache-"), "{claim}");
    assert_ne!(job_name("m", &claimed), job_name("other", &claimed), "claims of their own, Jobs of their own");
    assert_eq!(cache_dir(&claimed).as_deref(), Some("acme/ft/main"));
}

#[test]
fn the_job_runs_the_operator_image_with_the_token_and_may_patch_only_itself() {
    let m = cached_model();
    let o = objects("m", "ns", &m, &None, "pd-operator:test").unwrap();
    assert!(o.claim.is_none(), "the spec names its claim");
    let job = &o.job;
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(spec.backoff_limit, Some(BACKOFF_LIMIT));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    assert_eq!(pod.service_account_name.as_deref(), Some("m-model-fetch"));
    // The image's user may write to a new volume (its root belongs to root): the volume's group.
    assert_eq!(pod.security_context.as_ref().unwrap().fs_group, Some(crate::pod::OPERATOR_UID));
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some("pd-operator:test"));
    assert_eq!(c.security_context, Some(crate::pod::restricted_security_context()));
    let args = c.args.clone().unwrap().join(" ");
    assert_eq!(
        args,
        format!(
            "fetch-model --endpoint http://hub:8080 --repo acme/ft --revision refs/pr/1 --dest /cache/acme/ft/refs--pr--1 --progress-job {} --termination-log /dev/termination-log",
            job.metadata.name.as_deref().unwrap()
        )
    );
    let token = &c.env.as_ref().unwrap()[0];
    assert_eq!(
        (token.name.as_str(), token.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap().name.as_str()),
        ("HF_TOKEN", "hf")
    );
    assert_eq!(pod.volumes.as_ref().unwrap()[0].persistent_volume_claim.as_ref().unwrap().claim_name, "weights");
    let rule = &o.role.rules.as_ref().unwrap()[0];
    assert_eq!(rule.resource_names.as_deref(), Some(&[job.metadata.name.clone().unwrap()][..]));
    assert_eq!(
        (rule.resources.as_deref(), rule.verbs.as_slice()),
        (Some(&["jobs".to_owned()][..]), &["get".to_owned(), "patch".to_owned()][..])
    );
    let claimed = model(serde_json::json!({"repo": "acme/ft", "cache": {"storageClassName": "nfs", "size": "20Gi"}}));
    let pvc = objects("m", "ns", &claimed, &None, "i").unwrap().claim.unwrap();
    let pvc_spec = pvc.spec.unwrap();
    assert_eq!(pvc_spec.access_modes.as_deref(), Some(&["ReadWriteMany".to_owned()][..]));
    assert_eq!(pvc_spec.resources.unwrap().requests.unwrap()["storage"].0, "20Gi");
}

#[test]
fn engines_mount_the_cache_read_only_and_download_nothing() {
    let m = cached_model();
    assert_eq!(model_source::model_path(&m), "/models/acme/ft/refs--pr--1");
    assert_eq!(model_source::revision(&m), None, "the directory is the revision");
    assert!(model_source::env(&m).is_empty(), "no HF_TOKEN or HF_ENDPOINT in the engines");
    let (volume, mount) = model_source::volume("m", &m).unwrap();
    let pvc = volume.persistent_volume_claim.unwrap();
    assert_eq!((pvc.claim_name.as_str(), pvc.read_only, mount.read_only), ("weights", Some(true), Some(true)));
}

fn job(conditions: &[(&str, &str)], progress: Option<&Progress>) -> Job {
    let mut job = Job::default();
    job.metadata.annotations = progress.map(|p| BTreeMap::from([(PROGRESS_ANNOTATION.to_owned(), p.to_json())]));
    job.status = Some(JobStatus {
        conditions: Some(
            conditions
                .iter()
                .map(|(t, m)| JobCondition { type_: (*t).into(), status: "True".into(), message: Some((*m).into()), ..Default::default() })
                .collect(),
        ),
        ..Default::default()
    });
    job
}

#[test]
fn the_status_follows_the_job_from_creation_to_fetched() {
    let m = cached_model();
    let none = read(&m, "j", None);
    assert_eq!((none.status.phase.as_str(), none.ready, none.reason.as_str()), (PENDING, false, "Fetching"));
    assert!(none.message.contains("creating the fetch Job j for acme/ft@refs/pr/1"), "{}", none.message);
    let started = read(&m, "j", Some(&job(&[], None)));
    assert_eq!((started.status.phase.as_str(), started.ready), (PENDING, false));
    let half = Progress { bytes: 50, total_bytes: 100, files: 1, total_files: 3, downloaded: 50, ..Default::default() };
    let going = read(&m, "j", Some(&job(&[], Some(&half))));
    assert_eq!((going.status.phase.as_str(), going.status.bytes, going.status.total_bytes, going.status.files), (FETCHING, 50, 100, 1));
    assert!(going.message.contains("50 of 100 bytes, 1/3 files"), "{}", going.message);
    let retried = Progress { error: Some("GET http://hub/x: connection reset".into()), ..half.clone() };
    assert!(read(&m, "j", Some(&job(&[], Some(&retried)))).message.contains("an attempt failed (GET http://hub/x: connection reset)"));
    let all = Progress { bytes: 100, total_bytes: 100, files: 3, total_files: 3, downloaded: 0, done: true, error: None, commit: None };
    let done = read(&m, "j", Some(&job(&[("Complete", "")], Some(&all))));
    assert_eq!((done.status.phase.as_str(), done.ready, done.reason.as_str(), done.status.total_files), (FETCHED, true, "Fetched", 3));
    assert_eq!(done.status.job, "j");
}

#[test]
fn a_failed_fetch_names_the_file_and_the_http_status() {
    let m = cached_model();
    let error = "GET http://hub:8080/acme/ft/resolve/refs%2Fpr%2F1/model-00002.safetensors: HTTP 404".to_owned();
    let p = Progress { total_files: 3, error: Some(error.clone()), ..Default::default() };
    let failed = read(&m, "j", Some(&job(&[("Failed", "Job has reached the specified backoff limit")], Some(&p))));
    assert_eq!((failed.status.phase.as_str(), failed.ready, failed.reason.as_str()), (FAILED, false, "FetchFailed"));
    assert!(failed.message.contains(&error) && failed.message.contains("delete the Job to retry"), "{}", failed.message);
    let silent = read(&m, "j", Some(&job(&[("Failed", "Job has reached the specified backoff limit")], None)));
    assert!(silent.message.contains("Job has reached the specified backoff limit"), "{}", silent.message);
}

fn ended_pod(at: i64, message: &str) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.creation_timestamp = Some(Time(jiff::Timestamp::from_second(at).unwrap()));
    let terminated = ContainerStateTerminated { message: Some(message.into()), ..Default::default() };
    pod.status = Some(PodStatus {
        container_statuses: Some(vec![ContainerStatus {
            name: CONTAINER.into(),
            state: Some(ContainerState { terminated: Some(terminated), ..Default::default() }),
            ..Default::default()
        }]),
        ..Default::default()
    });
    pod
}

#[test]
fn the_final_figures_come_from_the_newest_pods_termination_message_when_the_annotation_lacks_them() {
    let all = Progress { bytes: 9, total_bytes: 9, files: 2, total_files: 2, done: true, ..Default::default() };
    let failed = Progress { error: Some("x: HTTP 500".into()), ..Default::default() };
    assert!(needs_final_progress(&job(&[("Complete", "")], None)));
    assert!(!needs_final_progress(&job(&[("Complete", "")], Some(&all))));
    assert!(!needs_final_progress(&job(&[], None)), "a running Job reports by itself");
    let pods = [ended_pod(2, &all.to_json()), ended_pod(1, &failed.to_json()), ended_pod(3, "not json")];
    assert_eq!(final_progress(&pods), Some(all));
    assert_eq!(final_progress(&[]), None);
}

#[test]
fn the_tree_listing_gives_sizes_and_the_hubs_hashes_and_refuses_paths_outside() {
    let (blob, sha) = ("A1".repeat(20), "ab".repeat(32));
    let body = format!(
        r#"[{{"type":"directory","oid":"d","size":0,"path":"sub"}},
        {{"type":"file","oid":"{blob}","size":12,"path":"config.json"}},
        {{"type":"file","oid":"{blob}","size":135,"path":"sub/model.safetensors","lfs":{{"oid":"{sha}","size":4096,"pointerSize":135}}}}]"#
    );
    let files = parse_tree(body.as_bytes()).unwrap();
    assert_eq!(
        files,
        [
            RepoFile { path: "config.json".into(), size: 12, digest: Digest::GitBlob("a1".repeat(20)) },
            RepoFile { path: "sub/model.safetensors".into(), size: 4096, digest: Digest::Sha256(sha.clone()) }
        ]
    );
    let entry = |path: &str| serde_json::json!([{"type": "file", "oid": blob, "size": 1, "path": path}]).to_string();
    for outside in ["../etc/x", "/etc/passwd", "a/../../b", "a//b", "./a", "a\\..\\b", "a\u{0}b"] {
        let e = parse_tree(entry(outside).as_bytes()).unwrap_err();
        assert!(e.contains("not a path inside"), "{outside}: {e}");
    }
    // A file the Hub gives no hash for cannot be proven: refused, not checked by size.
    let e = parse_tree(br#"[{"type":"file","size":1,"path":"x.py"}]"#).unwrap_err();
    assert!(e.contains("\"x.py\" no sha256 (LFS) or git blob id"), "{e}");
    assert!(parse_tree(br#"[{"type":"file","oid":"zz","size":1,"path":"x.py"}]"#).is_err(), "not hex");
    assert!(parse_tree(b"<html>").unwrap_err().starts_with("not the Hub's tree listing"));
    assert_eq!(tree_url("http://h/", "a/b", "refs/pr/1"), "http://h/api/models/a/b/tree/refs%2Fpr%2F1?recursive=true");
    assert_eq!(file_url("http://h", "a/b", "main", "sub/m 1.bin"), "http://h/a/b/resolve/main/sub/m%201.bin");
    assert_eq!(
        next_page(Some(r#"<https://h/api/models/a/b/tree/main?cursor=x>; rel="next""#)).as_deref(),
        Some("https://h/api/models/a/b/tree/main?cursor=x")
    );
    assert_eq!(next_page(None), None);
    let mut h = FileHash::default();
    h.update(b"ab");
    h.update(b"c");
    assert_eq!(h.hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

#[test]
fn a_files_hash_is_the_hubs_kind_sha256_for_lfs_and_the_git_blob_id_otherwise() {
    // The ids `git hash-object` gives for these bytes.
    assert_eq!(git_blob_id(b"hello\n"), "ce013625030ba8dba906f756967f9e9ca394464a");
    assert_eq!(git_blob_id(b""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
    let blob = Digest::GitBlob("ce013625030ba8dba906f756967f9e9ca394464a".into());
    let mut h = blob.hasher(6);
    h.update(b"hel");
    h.update(b"lo\n");
    assert_eq!((h.hex(), blob.name()), (blob.hex().to_owned(), "git blob id"));
    let lfs = Digest::Sha256("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".into());
    let mut h = lfs.hasher(3);
    h.update(b"abc");
    assert_eq!((h.hex(), lfs.name()), (lfs.hex().to_owned(), "sha256"));
}

#[test]
fn the_model_info_gives_the_commit_a_revision_names() {
    assert_eq!(revision_url("https://h/", "a/b", "refs/pr/1"), "https://h/api/models/a/b/revision/refs%2Fpr%2F1");
    let sha = "0123456789ABCDEF0123456789abcdef01234567";
    assert_eq!(parse_revision(format!(r#"{{"id":"a/b","sha":"{sha}"}}"#).as_bytes()), Ok(sha.to_ascii_lowercase()));
    assert!(parse_revision(br#"{"id":"a/b","sha":"../../x"}"#).unwrap_err().contains("not 40 hex digits"));
    assert!(parse_revision(b"<html>").unwrap_err().starts_with("not the Hub's model info"));
    let pinned = Progress { commit: Some(sha.into()), ..Default::default() };
    assert_eq!(Progress::parse(&pinned.to_json()).and_then(|p| p.commit).as_deref(), Some(sha));
}

#[test]
fn a_repository_or_revision_leaving_its_directory_is_refused_with_the_field() {
    let findings = |hf: serde_json::Value, revision: Option<&str>| -> Vec<String> {
        let spec: pd_api::PDDeploymentSpec = serde_json::from_value(serde_json::json!({
            "model": {"path": "acme/ft", "revision": revision, "source": {"huggingFace": hf}}, "kvTransfer": {"pageSize": 64},
            "prefill": {"parallelism": {"tp": 2}}, "decode": {"parallelism": {"tp": 2}}}))
        .unwrap();
        crate::validate::validate("m", &spec, None)
            .into_iter()
            .filter(|f| f.rule == "hub-id")
            .map(|f| format!("{}: {}", f.field, f.fix))
            .collect()
    };
    let cache = serde_json::json!({"claimName": "shared"});
    assert_eq!(findings(serde_json::json!({"repo": "acme/ft", "revision": "refs/pr/1", "cache": cache}), Some("v1")), Vec::<String>::new());
    let bad = findings(serde_json::json!({"repo": "x/../other", "revision": "../../other/main", "cache": cache}), Some("/abs"));
    assert_eq!(
        bad,
        [
            "spec.model.source.huggingFace.repo: give the Hub's repository id, e.g. Qwen/Qwen3-8B",
            "spec.model.source.huggingFace.revision: give a branch, tag or commit: main, v1.0, refs/pr/1 or a 40-hex commit",
            "spec.model.revision: give a branch, tag or commit: main, v1.0, refs/pr/1 or a 40-hex commit"
        ]
    );
}
