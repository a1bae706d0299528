//! `crds/` must equal `pd-operator crd`, and the schema must be structural.

use serde_json::Value;

#[test]
fn committed_crd_matches_generated() {
    let committed = std::fs::read_to_string("crds/pddeployment.yaml").expect("crds/pddeployment.yaml");
    assert!(committed == pd_api::crd_yaml().unwrap(), "crds/pddeployment.yaml is stale: run `cargo run -- crd > crds/pddeployment.yaml`");
}

#[test]
fn chart_crd_matches_top_level() {
    let chart = std::path::Path::new("charts/pd-operator/crds/pddeployment.yaml");
    if chart.exists() {
        assert_eq!(
            std::fs::read_to_string(chart).unwrap(),
            std::fs::read_to_string("crds/pddeployment.yaml").unwrap(),
            "charts/pd-operator/crds differs from crds/"
        );
    } else {
        panic!("{} is missing", chart.display());
    }
}

/// Every node of a structural schema has a type (or is explicitly free-form / int-or-string),
/// and no `$ref`, `anyOf` or `oneOf` carries types of its own.
fn check_structural(node: &Value, at: &str, problems: &mut Vec<String>) {
    let Some(o) = node.as_object() else { return };
    if o.contains_key("$ref") {
        problems.push(format!("{at}: $ref"));
    }
    let free = o.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        || o.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if !o.contains_key("type") && !free {
        problems.push(format!("{at}: no type"));
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for (i, alt) in o.get(key).and_then(Value::as_array).into_iter().flatten().enumerate() {
            if alt.get("type").is_some() || alt.get("properties").is_some() {
                problems.push(format!("{at}.{key}[{i}]: carries a type or properties"));
            }
        }
    }
    for (k, v) in o.get("properties").and_then(Value::as_object).into_iter().flatten() {
        check_structural(v, &format!("{at}.{k}"), problems);
    }
    if let Some(items) = o.get("items") {
        check_structural(items, &format!("{at}[]"), problems);
    }
    if let Some(ap) = o.get("additionalProperties").filter(|v| v.is_object()) {
        check_structural(ap, &format!("{at}{{}}"), problems);
    }
}

#[test]
fn schema_is_structural_and_small_enough_for_client_side_apply() {
    let crd = pd_api::crd().unwrap();
    let schema = serde_json::to_value(crd.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap()).unwrap();
    let mut problems = Vec::new();
    check_structural(&schema, "openAPIV3Schema", &mut problems);
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(!serde_json::to_string(&schema).unwrap().contains("\"uint"), "unsigned formats the apiserver does not know");
    // `kubectl apply` (client-side) stores the object in an annotation limited to 256 KiB.
    let json = serde_json::to_string(&crd).unwrap();
    assert!(json.len() < 200 * 1024, "CRD is {} bytes", json.len());
    assert_eq!(crd.spec.names.short_names.as_deref(), Some(&["pdd".to_owned()][..]));
    assert!(crd.spec.versions[0].subresources.as_ref().unwrap().status.is_some());
}

/// kubectl reads YAML 1.1, where a bare `Off` is `false`: `spec.engine.dryRun`'s enum must reach
/// the apiserver as the string (the kwok tier's dry-run test applies `dryRun: 'Off'` against it).
#[test]
fn enum_words_yaml_1_1_reads_as_booleans_are_quoted() {
    let yaml = pd_api::crd_yaml().unwrap();
    assert!(yaml.contains("- 'Off'"), "dryRun's Off is bare");
    let bare = yaml.lines().map(str::trim).filter(|l| ["- Off", "- On", "- Yes", "- No", "- off", "- on", "- yes", "- no"].contains(l));
    assert_eq!(bare.count(), 0);
}
