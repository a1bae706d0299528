//! Where an engine finds the weights (`spec.model.source`): the `--model-path` and
//! `--served-model-name` it gets, the read-only volume holding them, and the Hub's environment.

use k8s_openapi::api::core::v1::{
    EnvVar, EnvVarSource, HostPathVolumeSource, ImageVolumeSource, PersistentVolumeClaimVolumeSource, SecretKeySelector, Volume,
    VolumeMount,
};

use crate::hub::requested_revision;
use crate::names::{MODEL_MOUNT, MODEL_VOLUME};
use pd_api::{ModelSource, ModelSpec};

/// `--model-path`: the mounted directory, the Hub repository (its directory in the cache when
/// it has one), or `path` without a source.
pub fn model_path(model: &ModelSpec) -> String {
    let Some(source) = &model.source else { return model.path.clone() };
    if let Some(dir) = crate::model_fetch::cache_dir(model) {
        return format!("{MODEL_MOUNT}/{dir}");
    }
    if let Some(hf) = &source.hugging_face {
        return hf.repo.clone();
    }
    let sub = source.pvc.as_ref().and_then(|p| p.path.as_deref()).or(source.image.as_ref().and_then(|i| i.path.as_deref()));
    match sub.map(|s| s.trim_matches('/')).filter(|s| !s.is_empty()) {
        Some(sub) => format!("{MODEL_MOUNT}/{sub}"),
        None => MODEL_MOUNT.to_owned(),
    }
}

/// `--served-model-name`: `servedName`, else `path` where a source took `--model-path` over.
pub fn served_name(model: &ModelSpec) -> Option<String> {
    model.served_name.clone().or_else(|| model.source.as_ref().map(|_| model.path.clone()))
}

/// `--revision`: the requested one; none for a cached Hub source (its directory is that revision).
pub fn revision(model: &ModelSpec) -> Option<String> {
    if crate::model_fetch::cached(model).is_some() {
        return None;
    }
    requested_revision(model)
}

/// The read-only volume and its mount, for the sources that mount one (`name`: the
/// PDDeployment's, which names a cache claim the operator makes).
pub fn volume(name: &str, model: &ModelSpec) -> Option<(Volume, VolumeMount)> {
    let source: &ModelSource = model.source.as_ref()?;
    let mut volume = Volume { name: MODEL_VOLUME.into(), ..Default::default() };
    if let Some(claim_name) = crate::model_fetch::claim_name(name, model) {
        volume.persistent_volume_claim = Some(PersistentVolumeClaimVolumeSource { claim_name, read_only: Some(true) });
    } else if let Some(pvc) = &source.pvc {
        volume.persistent_volume_claim =
            Some(PersistentVolumeClaimVolumeSource { claim_name: pvc.claim_name.clone(), read_only: Some(true) });
    } else if let Some(image) = &source.image {
        volume.image = Some(ImageVolumeSource { reference: Some(image.reference.clone()), pull_policy: image.pull_policy.clone() });
    } else if let Some(host) = &source.host_path {
        volume.host_path = Some(HostPathVolumeSource { path: host.path.clone(), type_: Some("Directory".into()) });
    } else {
        return None;
    }
    let mount = VolumeMount { name: MODEL_VOLUME.into(), mount_path: MODEL_MOUNT.into(), read_only: Some(true), ..Default::default() };
    Some((volume, mount))
}

/// `HF_ENDPOINT` and `HF_TOKEN` for a Hub source each engine downloads (none for a cached one:
/// the fetch Job has them).
pub fn env(model: &ModelSpec) -> Vec<EnvVar> {
    let Some(hf) = model.source.as_ref().and_then(|s| s.hugging_face.as_ref()).filter(|h| h.cache.is_none()) else { return Vec::new() };
    let mut env = Vec::new();
    if let Some(endpoint) = &hf.endpoint {
        env.push(EnvVar { name: "HF_ENDPOINT".into(), value: Some(endpoint.clone()), value_from: None });
    }
    if let Some(secret) = &hf.token_secret_ref {
        let key = SecretKeySelector { name: secret.name.clone(), key: secret.key.clone(), optional: Some(false) };
        env.push(EnvVar {
            name: "HF_TOKEN".into(),
            value: None,
            value_from: Some(EnvVarSource { secret_key_ref: Some(key), ..Default::default() }),
        });
    }
    env
}

/// What identifies the weights in the KV contract: pods serving other weights never pair.
pub fn identity(model: &ModelSpec) -> Option<serde_json::Value> {
    model.source.as_ref().map(|s| serde_json::to_value(s).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(source: serde_json::Value) -> ModelSpec {
        serde_json::from_value(serde_json::json!({"path": "acme/qwen3-ft", "source": source})).unwrap()
    }

    #[test]
    fn a_pvc_is_mounted_read_only_and_the_engine_serves_the_models_id() {
        let m = model(serde_json::json!({"pvc": {"claimName": "weights", "path": "/qwen3-ft/"}}));
        assert_eq!(model_path(&m), "/models/qwen3-ft");
        assert_eq!(served_name(&m).as_deref(), Some("acme/qwen3-ft"));
        let (v, mount) = volume("m", &m).unwrap();
        assert_eq!(v.persistent_volume_claim.unwrap().read_only, Some(true));
        assert_eq!((mount.mount_path.as_str(), mount.read_only), (MODEL_MOUNT, Some(true)));
        assert!(env(&m).is_empty());
    }

    #[test]
    fn an_image_and_a_host_path_mount_at_the_same_place() {
        let image = model(serde_json::json!({"image": {"reference": "registry.example/qwen3:1"}}));
        assert_eq!(model_path(&image), MODEL_MOUNT);
        assert_eq!(volume("m", &image).unwrap().0.image.unwrap().reference.as_deref(), Some("registry.example/qwen3:1"));
        let host = model(serde_json::json!({"hostPath": {"path": "/mnt/models/qwen3"}}));
        assert_eq!(volume("m", &host).unwrap().0.host_path.unwrap().type_.as_deref(), Some("Directory"));
    }

    #[test]
    fn a_hub_source_names_the_repository_revision_mirror_and_token() {
        let m = model(serde_json::json!({"huggingFace": {"repo": "Qwen/Qwen3-8B", "revision": "abc123",
            "endpoint": "http://hub-mirror:8080", "tokenSecretRef": {"name": "hf"}}}));
        assert_eq!((model_path(&m), revision(&m)), ("Qwen/Qwen3-8B".to_owned(), Some("abc123".to_owned())));
        assert!(volume("m", &m).is_none());
        let env = env(&m);
        assert_eq!(env[0].value.as_deref(), Some("http://hub-mirror:8080"));
        let key = env[1].value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!((env[1].name.as_str(), key.name.as_str(), key.key.as_str()), ("HF_TOKEN", "hf", "token"));
        assert_eq!(m.catalogue_id(), "Qwen/Qwen3-8B");
    }

    fn findings(source: serde_json::Value, template: serde_json::Value) -> Vec<String> {
        let spec: pd_api::PDDeploymentSpec = serde_json::from_value(serde_json::json!({
            "model": {"path": "Qwen/Qwen3-8B", "source": source}, "kvTransfer": {"pageSize": 64},
            "prefill": {"parallelism": {"tp": 2}, "template": template}, "decode": {"parallelism": {"tp": 2}}}))
        .unwrap();
        crate::validate::validate("m", &spec, None)
            .into_iter()
            .filter(|f| f.rule == "model-source")
            .map(|f| format!("{}: {}", f.field, f.message))
            .collect()
    }

    #[test]
    fn sources_the_pods_could_not_mount_are_refused_with_the_field() {
        let none = serde_json::json!({});
        assert_eq!(findings(serde_json::json!({"pvc": {"claimName": "w", "path": "qwen"}}), none.clone()), Vec::<String>::new());
        assert_eq!(
            findings(serde_json::json!({"pvc": {"claimName": "w", "path": "a/../../etc"}}), none.clone()),
            ["spec.model.source.pvc.path: \"a/../../etc\" is not a directory inside the volume"]
        );
        assert_eq!(
            findings(serde_json::json!({"hostPath": {"path": "models"}}), none.clone()),
            ["spec.model.source.hostPath.path: \"models\" is not an absolute directory on the node"]
        );
        assert_eq!(
            findings(serde_json::json!({"huggingFace": {"repo": "Qwen/Qwen3-8B", "endpoint": "hub:80"}}), none),
            ["spec.model.source.huggingFace.endpoint: \"hub:80\" is not an http(s) URL; it becomes HF_ENDPOINT"]
        );
        let clash =
            serde_json::json!({"volumes": [{"name": "model", "emptyDir": {}}], "volumeMounts": [{"name": "x", "mountPath": "/models/"}]});
        assert_eq!(
            findings(serde_json::json!({"image": {"reference": "r/m:1"}}), clash),
            [
                "spec.prefill.template.volumes: the volume name \"model\" holds spec.model.source in every engine pod",
                "spec.prefill.template.volumeMounts: /models is where spec.model.source is mounted"
            ]
        );
    }

    #[test]
    fn without_a_source_nothing_changes() {
        let m: ModelSpec = serde_json::from_value(serde_json::json!({"path": "Qwen/Qwen3-8B", "revision": "r1"})).unwrap();
        assert_eq!((model_path(&m), served_name(&m), revision(&m)), ("Qwen/Qwen3-8B".to_owned(), None, Some("r1".to_owned())));
        assert!(volume("m", &m).is_none() && env(&m).is_empty() && identity(&m).is_none());
    }
}
