//! The offline verdict over loaded manifests (`pd-operator validate`, `render`, the parity
//! tier's `parity-cases`): a PDDeployment's findings with its model config taken from the input
//! files or `--model-config`, and what the verdict assumes where a spec is silent.

use std::borrow::Cow;
use std::path::PathBuf;

use pd_api::{Accelerator, PDDeployment, PDDeploymentSpec};

use crate::findings::{Finding, Severity};
use crate::manifest::{self, Loaded, LoadedDeployment};
use crate::model::{self, HfConfig};
use crate::validate;

/// The PDDeployments (and ConfigMaps) of `files`, and the config.json `model_config` names: the
/// input of every offline verdict. No PDDeployment in the files is an error.
pub fn load(files: &[PathBuf], model_config: &Option<PathBuf>) -> Result<(Loaded, Option<HfConfig>), String> {
    let loaded = manifest::load_files(files).map_err(|e| e.to_string())?;
    if loaded.deployments.is_empty() {
        let names = files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ");
        return Err(format!("no PDDeployment (pd.inference.dev/v1alpha1) found in {names}"));
    }
    Ok((loaded, read_model_config(model_config)?))
}

pub fn read_model_config(path: &Option<PathBuf>) -> Result<Option<HfConfig>, String> {
    let Some(path) = path else { return Ok(None) };
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    HfConfig::parse(&text).map(Some).map_err(|e| format!("{}: {e}", path.display()))
}

/// The config.json a PDDeployment's `configMapRef` names, when the input files include it.
pub fn referenced_config(d: &PDDeployment, loaded: &Loaded) -> Option<Result<HfConfig, String>> {
    let r = d.spec.model.config_map_ref.as_ref()?;
    let ns = d.metadata.namespace.as_deref();
    let cm =
        loaded.config_maps.iter().find(|c| c.metadata.name.as_deref() == Some(r.name.as_str()) && c.metadata.namespace.as_deref() == ns)?;
    Some(HfConfig::from_config_map(cm, &r.key))
}

/// What the offline verdict assumes where a spec says nothing: the GPU of roles that name none,
/// and the SGLang release of a spec that sets no `engine.version`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Assumed<'a> {
    pub accelerator: Option<Accelerator>,
    pub engine_version: Option<&'a str>,
}

/// The spec with what `assumed` names filled in where the spec is silent.
pub fn with_assumed<'s>(spec: &'s PDDeploymentSpec, assumed: Assumed<'_>) -> Cow<'s, PDDeploymentSpec> {
    let mut spec = Cow::Borrowed(spec);
    if let Some(acc) = assumed.accelerator {
        let s = spec.to_mut();
        s.prefill.accelerator.get_or_insert(acc);
        s.decode.accelerator.get_or_insert(acc);
    }
    if let Some(v) = assumed.engine_version.filter(|_| spec.engine.version.is_none()) {
        spec.to_mut().engine.version = Some(v.to_owned());
    }
    spec
}

/// Findings for one loaded PDDeployment, including unknown fields and config problems.
pub fn check_one(
    d: &LoadedDeployment,
    loaded: &Loaded,
    global_config: Option<&HfConfig>,
    assumed: Assumed<'_>,
) -> (Vec<Finding>, model::ModelFacts) {
    let name = d.object.metadata.name.clone().unwrap_or_default();
    let mut findings: Vec<Finding> = d
        .unknown_fields
        .iter()
        .map(|f| Finding {
            severity: Severity::Error,
            rule: "unknown-field",
            field: f.clone(),
            message: format!("unknown field `{f}`; the apiserver would drop it"),
            fix: "check the spelling and nesting against `kubectl explain pddeployment.spec`".into(),
        })
        .collect();
    let mut config = global_config.cloned();
    match referenced_config(&d.object, loaded) {
        Some(Ok(c)) => config = Some(c),
        Some(Err(e)) => findings.push(Finding {
            severity: Severity::Error,
            rule: "model-config",
            field: "spec.model.configMapRef".into(),
            message: e,
            fix: "give the ConfigMap a valid HF config.json under the referenced key".into(),
        }),
        None if d.object.spec.model.config_map_ref.is_some() && config.is_none() => findings.push(Finding {
            severity: Severity::Warning,
            rule: "model-config-offline",
            field: "spec.model.configMapRef".into(),
            message: "the referenced ConfigMap is not among the input files; the admission webhook reads it in the cluster".into(),
            fix: "pass the ConfigMap with another -f, or the config.json with --model-config".into(),
        }),
        None => {}
    }
    // Offline the platform's lists are unknown: the defaults judge (a refusal's fix names the
    // chart value that allows more).
    findings.extend(crate::egress::EgressPolicy::default().check(&d.object.spec));
    let facts = model::resolve(&d.object.spec.model, config.as_ref());
    findings.extend(validate::validate_with_facts(&name, &with_assumed(&d.object.spec, assumed), &facts));
    // Offline there is no operator to ask: its default limit, which `render` also keeps to.
    findings.extend(crate::bounds::pod_limit(&d.object.spec, crate::bounds::DEFAULT_MAX_PODS_PER_DEPLOYMENT));
    (findings, facts)
}

/// `validate`'s report over loaded manifests (`pd-operator validate`, `kubectl pd validate`):
/// every finding as `<name>: <field>: <message> (fix: <hint>)`, warnings prefixed `warning:`, and
/// `<name>: valid (<model>)` for a valid spec; or, with `json`, one object per PDDeployment.
/// The bool says whether every PDDeployment is valid.
pub fn report(loaded: &Loaded, config: Option<&HfConfig>, assumed: Assumed<'_>, json: bool) -> Result<(String, bool), serde_json::Error> {
    let mut all_valid = true;
    let (mut text, mut objects) = (String::new(), Vec::new());
    for d in &loaded.deployments {
        let name = d.object.metadata.name.clone().unwrap_or_default();
        let (findings, facts) = check_one(d, loaded, config, assumed);
        let valid = validate::is_valid(&findings);
        all_valid &= valid;
        if json {
            objects.push(serde_json::json!({
                "file": d.path.display().to_string(), "document": d.doc, "name": name, "valid": valid,
                "model": {"architecture": facts.architecture, "attention": facts.attention, "pool": facts.pool(), "state": facts.state},
                "findings": findings,
            }));
            continue;
        }
        for f in &findings {
            let prefix = if f.severity == Severity::Warning { "warning: " } else { "" };
            text.push_str(&format!("{prefix}{name}: {f}\n"));
        }
        if valid {
            text.push_str(&format!("{name}: valid ({})\n", facts.describe(&d.object.spec.model.path)));
        }
    }
    if json {
        text = serde_json::to_string_pretty(&objects)? + "\n";
    }
    Ok((text, all_valid))
}
