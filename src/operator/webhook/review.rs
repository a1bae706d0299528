//! The admission decision, pure: an `AdmissionReview` body, the referenced model config and
//! whether the cluster serves gang scheduling in, an `AdmissionResponse` out. Same rules and
//! texts as `pd-operator validate`, plus the one the cluster decides (`validate::in_cluster`), as
//! the controller applies them.

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde_json::Value;

use pd_api::PDDeployment;
use pd_core::egress::EgressPolicy;
use pd_core::findings::Severity;
use pd_core::hub::CONFIG_FILE;
use pd_core::model::{self, HfConfig};
use pd_core::model_read::ConfigSource;
use pd_core::model_read::SourceRead;
use pd_core::validate;

/// Largest AdmissionReview accepted: an UPDATE carries the object twice, and a PDDeployment is
/// a few KiB (its templates included), far below this.
pub const MAX_BODY: usize = 1 << 20;

/// A model config lookup result for the request's `spec.model.configMapRef`.
pub type ConfigLookup = Result<Option<HfConfig>, String>;

/// What the operator brings to every decision besides the request: whether the cluster serves
/// Kubernetes' gang scheduling API (found at start), its pods-per-PDDeployment limit and its egress lists.
#[derive(Clone, Debug)]
pub struct Judge {
    pub gang_api: bool,
    /// `--max-pods-per-deployment`.
    pub max_pods: u32,
    /// The addresses the platform lets specs name.
    pub egress: std::sync::Arc<EgressPolicy>,
}

impl Judge {
    /// A judge with the default pods-per-PDDeployment limit.
    pub fn new(gang_api: bool) -> Self {
        Self { gang_api, max_pods: pd_core::bounds::DEFAULT_MAX_PODS_PER_DEPLOYMENT, egress: Default::default() }
    }
}

/// One admission request, its object read as a PDDeployment once.
#[derive(Debug)]
pub struct Review {
    pub request: AdmissionRequest<DynamicObject>,
    /// The object under review, or why it is none; `None` for operations not judged (DELETE).
    subject: Option<Result<PDDeployment, String>>,
}

impl Review {
    /// Parses a request body; the error is the reason for a 400.
    pub fn parse(body: &[u8]) -> Result<Self, String> {
        if body.len() > MAX_BODY {
            return Err(format!("AdmissionReview of {} bytes exceeds the {MAX_BODY}-byte limit", body.len()));
        }
        let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
        let request: AdmissionRequest<DynamicObject> = review
            .try_into()
            .map_err(|e: kube::core::admission::ConvertAdmissionReviewError| format!("AdmissionReview has no request: {e}"))?;
        let subject = matches!(request.operation, Operation::Create | Operation::Update).then(|| match request.object.as_ref() {
            None => Err("the AdmissionReview carries no object".to_string()),
            Some(obj) => as_pdd(obj).map_err(|e| format!("not a valid PDDeployment: {e}")),
        });
        Ok(Self { request, subject })
    }

    /// (namespace, where its config.json comes from) of the object under review, if one is
    /// judged: the request's namespace, the one the apiserver authorised the caller in; none for
    /// an object naming another (`decide` denies it).
    pub fn config_source(&self) -> Option<(String, ConfigSource)> {
        let pdd = self.subject.as_ref()?.as_ref().ok()?;
        if self.namespace_mismatch().is_some() {
            return None;
        }
        Some((self.request.namespace.clone().unwrap_or_default(), pd_core::model_read::config_source(&pdd.spec.model)))
    }

    /// Why the object's `metadata.namespace` is not the request's, if it is not: the apiserver
    /// never sends such a review, so it was posted to the webhook by someone else.
    fn namespace_mismatch(&self) -> Option<String> {
        let pdd = self.subject.as_ref()?.as_ref().ok()?;
        let (object, request) = (pdd.metadata.namespace.as_deref()?, self.request.namespace.as_deref().unwrap_or(""));
        (object != request).then(|| {
            format!(
                "metadata.namespace: {object:?} is not the request's namespace {request:?}; a review is judged in the namespace the request was authorised in (fix: send the PDDeployment through the API server in its own namespace)"
            )
        })
    }

    /// The name of the object under review.
    pub fn name(&self) -> String {
        let from_object = self.subject.as_ref().and_then(|s| s.as_ref().ok()).and_then(|p| p.metadata.name.clone());
        from_object.or_else(|| (!self.request.name.is_empty()).then(|| self.request.name.clone())).unwrap_or_default()
    }

    /// Decides the request with what the operator found at start and its limits (`judge`).
    pub fn decide(&self, config: ConfigLookup, judge: &Judge) -> AdmissionResponse {
        let resp = AdmissionResponse::from(&self.request);
        let pdd = match &self.subject {
            None => return resp,
            Some(Err(e)) => return resp.deny(e),
            Some(Ok(p)) => p,
        };
        let req = &self.request;
        let name = self.name();
        if let Some(why) = self.namespace_mismatch() {
            return resp.deny(format!("{name}: {why}"));
        }
        let config = match config {
            Ok(c) => c,
            Err(e) => return resp.deny(format!("{name}: {}", validate::model_config_unread(&e))),
        };
        let facts = model::resolve(&pdd.spec.model, config.as_ref());
        let mut findings = judge.egress.check(&pdd.spec);
        findings.extend(validate::in_cluster(&name, &pdd.spec, &facts, judge.gang_api));
        findings.extend(pd_core::bounds::pod_limit(&pdd.spec, judge.max_pods));
        // What admission leaves to the engine dry run, said once.
        findings.extend(validate::options::not_judged_warning(&pdd.spec));
        // A source's config.json not read yet tells the attention kind once the operator's Job has
        // read it; the controller judges the spec on it before any engine pod, so admission does
        // not refuse for not knowing it (it would never be read).
        if config.is_none() && matches!(self.config_source(), Some((_, ConfigSource::Read(_)))) {
            for f in findings.iter_mut().filter(|f| f.rule == validate::RULE_ATTENTION_KIND_UNKNOWN) {
                f.severity = Severity::Warning;
            }
        }
        let line = pd_core::findings::Finding::to_string;
        let errors: Vec<String> = findings.iter().filter(|f| f.severity == Severity::Error).map(line).collect();
        let mut warnings: Vec<String> = findings.iter().filter(|f| f.severity == Severity::Warning).map(line).collect();
        if req.operation == Operation::Update
            && let Some(old) = req.old_object.as_ref().and_then(|o| as_pdd(o).ok())
            && let Some(field) = rolls_everything(&old, pdd)
        {
            warnings.push(format!("{field} changed: every prefill and decode instance will be replaced, one at a time per role"));
        }
        let mut resp = if errors.is_empty() {
            resp
        } else {
            let count = errors.len();
            let plural = if count == 1 { "" } else { "s" };
            let release = pd_core::release::release_of(&pdd.spec);
            // Some refusals are the platform's (egress, the pod limit), not SGLang's: the header
            // names the release the rules were judged for, and each line says whose rule it is.
            resp.deny(format!(
                "PDDeployment {name} is refused, judged for SGLang {release} ({count} violation{plural}):\n{}",
                errors.join("\n")
            ))
        };
        if !warnings.is_empty() {
            resp.warnings = Some(warnings);
        }
        resp
    }

    /// The AdmissionReview response body.
    pub fn respond(&self, config: ConfigLookup, judge: &Judge) -> Value {
        serde_json::to_value(self.decide(config, judge).into_review()).unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}))
    }
}

/// The warning of a source whose config.json the operator has not read yet (admission reads no
/// Secret and makes no request: a Job in the namespace reads it, `model_read`).
pub fn unread(read: &SourceRead) -> String {
    format!(
        "{}: the {CONFIG_FILE} has not been read yet: {} is read in the cluster by a Job of the operator once this is admitted; the model-aware rules ran without it, and the controller judges the spec on it before any engine pod",
        read.field, read.origin
    )
}

fn as_pdd(obj: &DynamicObject) -> Result<PDDeployment, String> {
    let value = serde_json::to_value(obj).map_err(|e| e.to_string())?;
    serde_path_to_error::deserialize(&value).map_err(|e| format!("field `{}`: {}", e.path(), e.inner()))
}

/// Fields whose change rolls every instance of both roles.
fn rolls_everything(old: &PDDeployment, new: &PDDeployment) -> Option<&'static str> {
    if old.spec.model != new.spec.model {
        Some("spec.model")
    } else if old.spec.kv_transfer != new.spec.kv_transfer {
        Some("spec.kvTransfer")
    } else if old.spec.engine != new.spec.engine {
        Some("spec.engine")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn review(op: &str, object: Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-1", "kind": {"group": "pd.inference.dev", "version": "v1alpha1", "kind": "PDDeployment"},
                "resource": {"group": "pd.inference.dev", "version": "v1alpha1", "resource": "pddeployments"},
                "name": "x", "namespace": "ns", "operation": op, "userInfo": {}, "object": object, "dryRun": false
            }
        }))
        .unwrap()
    }

    fn pdd(decode: Value) -> Value {
        serde_json::json!({"apiVersion": "pd.inference.dev/v1alpha1", "kind": "PDDeployment", "metadata": {"name": "qwen-pd", "namespace": "ns"},
            "spec": {"model": {"path": "Qwen/Qwen2.5-72B-Instruct"}, "kvTransfer": {"pageSize": 64}, "prefill": {"parallelism": {"tp": 4}}, "decode": {"parallelism": decode}}})
    }

    #[test]
    fn denies_the_qwen_dcp_mistake_with_sglang_text_and_field() {
        let req = Review::parse(&review("CREATE", pdd(serde_json::json!({"tp": 4, "dcp": 2})))).unwrap();
        let r = req.decide(Ok(None), &Judge::new(false));
        assert!(!r.allowed);
        assert!(
            r.result.message.contains("spec.decode.parallelism.dcp: PD decode DCP requires an MLA or hybrid-MLA KV pool."),
            "{}",
            r.result.message
        );
        assert_eq!(r.uid, "u-1");
    }

    #[test]
    fn warns_without_denying() {
        let req = Review::parse(&review("CREATE", pdd(serde_json::json!({"tp": 2})))).unwrap();
        let r = req.decide(Ok(None), &Judge::new(false));
        assert!(r.allowed);
        assert!(r.warnings.unwrap()[0].contains("Performance is NOT guaranteed"));
    }

    /// Issue #55: two-batch overlap without an EP all-to-all backend or attention DP is denied
    /// at admission, and options admission does not judge are named in one warning.
    #[test]
    fn denies_recipe_options_and_names_what_it_leaves_to_the_dry_run() {
        let mut obj = pdd(serde_json::json!({"tp": 4}));
        obj["spec"]["decode"]["template"] =
            serde_json::json!({"extraArgs": ["--enable-two-batch-overlap", "--cuda-graph-max-bs-decode", "64"]});
        let r = Review::parse(&review("CREATE", obj)).unwrap().decide(Ok(None), &Judge::new(false));
        assert!(!r.allowed);
        assert!(
            r.result.message.contains(&format!("spec.decode.template.extraArgs[0]: {}", validate::texts::TBO_NEEDS_ATTN_DP)),
            "{}",
            r.result.message
        );
        let warnings = r.warnings.unwrap_or_default();
        let named: Vec<_> = warnings.iter().filter(|w| w.contains("admission does not judge")).collect();
        assert_eq!(named.len(), 1, "{warnings:?}");
        assert!(named[0].contains("--cuda-graph-max-bs-decode") && !named[0].contains("two-batch"), "{named:?}");
    }

    #[test]
    fn config_lookup_errors_deny_with_the_reason() {
        let req = Review::parse(&review("CREATE", pdd(serde_json::json!({"tp": 4})))).unwrap();
        let r = req.decide(Err("ConfigMap ns/cfg does not exist".into()), &Judge::new(false));
        assert!(!r.allowed && r.result.message.contains("ConfigMap ns/cfg does not exist"));
    }

    #[test]
    fn gang_workload_is_denied_where_the_cluster_serves_no_gang_api_with_the_controllers_text() {
        let mut object = pdd(serde_json::json!({"tp": 4}));
        object["spec"]["placement"] = serde_json::json!({"gang": "workload"});
        let req = Review::parse(&review("CREATE", object)).unwrap();
        let r = req.decide(Ok(None), &Judge::new(false));
        assert!(!r.allowed);
        let spec: pd_api::PDDeploymentSpec = serde_json::from_value(req.request.object.as_ref().unwrap().data["spec"].clone()).unwrap();
        let rule = validate::gang_api(&spec, false).expect("the controller refuses it too").to_string();
        assert!(rule.starts_with("spec.placement.gang: workload, but this cluster does not serve"), "{rule}");
        assert!(rule.ends_with("(fix: enable the GenericWorkload feature gate and that API version, or use gang: auto)"), "{rule}");
        assert!(r.result.message.ends_with(&format!("(1 violation):\n{rule}")), "{}", r.result.message);
        assert!(req.decide(Ok(None), &Judge::new(true)).allowed, "admitted where the cluster serves it");
        // `auto` falls back to no gang: admitted either way.
        let mut object = pdd(serde_json::json!({"tp": 4}));
        object["spec"]["placement"] = serde_json::json!({"gang": "auto"});
        assert!(Review::parse(&review("CREATE", object)).unwrap().decide(Ok(None), &Judge::new(false)).allowed);
    }

    #[test]
    fn a_hub_source_is_judged_on_its_own_config_json() {
        let mut object = pdd(serde_json::json!({"tp": 4, "dcp": 2}));
        object["spec"]["model"] =
            serde_json::json!({"path": "acme/ft", "source": {"huggingFace": {"repo": "acme/ft", "endpoint": "http://hub"}}});
        let req = Review::parse(&review("CREATE", object)).unwrap();
        let hub_allowed = EgressPolicy::new(&["http://hub".into()], &[]).unwrap();
        let judge = Judge { egress: std::sync::Arc::new(hub_allowed), ..Judge::new(false) };
        let Some((ns, ConfigSource::Read(read))) = req.config_source() else { panic!("a Hub source: {:?}", req.config_source()) };
        assert_eq!((ns.as_str(), read.origin.as_str()), ("ns", "http://hub/acme/ft/resolve/main/config.json"));
        let config = |arch: &str| {
            let path = format!("{}/tests/parity/configs/{arch}.json", env!("CARGO_MANIFEST_DIR"));
            HfConfig::parse(&std::fs::read_to_string(path).unwrap()).unwrap()
        };
        let gqa = req.decide(Ok(Some(config("Qwen3ForCausalLM"))), &judge);
        assert!(
            !gqa.allowed && gqa.result.message.contains("PD decode DCP requires an MLA or hybrid-MLA KV pool."),
            "{}",
            gqa.result.message
        );
        assert!(req.decide(Ok(Some(config("DeepseekV3ForCausalLM"))), &judge).allowed);
        assert!(
            unread(&read).starts_with(
                "spec.model.source.huggingFace: the config.json has not been read yet: http://hub/acme/ft/resolve/main/config.json is read in the cluster"
            ),
            "{}",
            unread(&read)
        );
    }

    /// An unknown model from a source not read yet (a GQA fine-tune with decode DCP): admitted with
    /// a warning, since only its config.json tells the kind and the controller judges on it.
    #[test]
    fn an_unread_sources_unknown_attention_kind_is_a_warning_not_a_refusal() {
        let mut object = pdd(serde_json::json!({"tp": 4, "dcp": 2}));
        object["spec"]["model"] = serde_json::json!({"path": "acme/ft", "source": {"huggingFace": {"repo": "acme/ft"}}});
        let r = Review::parse(&review("CREATE", object.clone())).unwrap().decide(Ok(None), &Judge::new(false));
        assert!(r.allowed, "{}", r.result.message);
        assert!(r.warnings.unwrap_or_default().iter().any(|w| w.contains("the attention kind of acme/ft is unknown")));
        // Without a source to read, nothing will tell it: still refused.
        object["spec"]["model"] = serde_json::json!({"path": "acme/ft"});
        let r = Review::parse(&review("CREATE", object)).unwrap().decide(Ok(None), &Judge::new(false));
        assert!(!r.allowed && r.result.message.contains("the attention kind of acme/ft is unknown"), "{}", r.result.message);
    }

    /// A review posted straight to the webhook whose object names another namespace than the
    /// request's: no lookup is made for it (no config source), and it is denied saying why.
    #[test]
    fn an_object_naming_another_namespace_is_denied_and_looks_nothing_up() {
        let mut object = pdd(serde_json::json!({"tp": 4}));
        object["metadata"]["namespace"] = "victim".into();
        object["spec"]["model"] = serde_json::json!({"path": "a/b", "configMapRef": {"name": "cfg"},
            "source": {"huggingFace": {"repo": "a/b", "endpoint": "http://attacker", "tokenSecretRef": {"name": "db", "key": "password"}}}});
        let req = Review::parse(&review("CREATE", object.clone())).unwrap();
        assert_eq!(req.config_source(), None, "nothing is read for it");
        let r = req.decide(Ok(None), &Judge::new(false));
        assert!(!r.allowed);
        assert!(r.result.message.contains(r#"metadata.namespace: "victim" is not the request's namespace "ns""#), "{}", r.result.message);
        // In the request's own namespace (or with none given), its namespace is the request's.
        object["metadata"]["namespace"] = "ns".into();
        let req = Review::parse(&review("CREATE", object.clone())).unwrap();
        assert!(matches!(req.config_source(), Some((ns, ConfigSource::ConfigMap(_))) if ns == "ns"));
        object["metadata"].as_object_mut().unwrap().remove("namespace");
        assert!(matches!(Review::parse(&review("CREATE", object)).unwrap().config_source(), Some((ns, _)) if ns == "ns"));
    }

    #[test]
    fn addresses_the_platform_did_not_allow_are_denied() {
        let mut object = pdd(serde_json::json!({"tp": 4}));
        object["spec"]["autoscaling"] =
            serde_json::json!({"mode": "Recommend", "prometheus": {"url": "http://169.254.169.254/latest/meta-data/"}});
        let r = Review::parse(&review("CREATE", object.clone())).unwrap().decide(Ok(None), &Judge::new(false));
        assert!(!r.allowed);
        assert!(
            r.result.message.contains("spec.autoscaling.prometheus.url: host 169.254.169.254 is a link-local address"),
            "{}",
            r.result.message
        );
        object["spec"]["autoscaling"]["prometheus"]["url"] = "http://prometheus.monitoring.svc:9090".into();
        object["spec"]["model"] =
            serde_json::json!({"path": "acme/ft", "source": {"huggingFace": {"repo": "acme/ft", "endpoint": "http://wiki.internal"}}});
        let req = Review::parse(&review("CREATE", object)).unwrap();
        let r = req.decide(Ok(None), &Judge::new(false));
        assert!(!r.allowed);
        assert!(
            r.result.message.contains("spec.model.source.huggingFace.endpoint: http://wiki.internal is not among the Hub endpoints"),
            "{}",
            r.result.message
        );
        assert!(!r.result.message.contains("prometheus.url"), "the in-cluster Prometheus is allowed: {}", r.result.message);
    }

    #[test]
    fn malformed_bodies_are_rejected_with_a_reason() {
        assert!(Review::parse(b"").unwrap_err().contains("not an AdmissionReview"));
        assert!(
            Review::parse(b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}").unwrap_err().contains("no request")
        );
        assert!(Review::parse(&vec![b' '; MAX_BODY + 1]).unwrap_err().contains("exceeds"));
    }

    /// Today's main admits this and the controller renders 100000 pods in memory.
    #[test]
    fn a_spec_past_the_pod_limit_is_denied_with_the_number() {
        let mut object = pdd(serde_json::json!({"tp": 4}));
        object["spec"]["decode"]["replicas"] = 100_000.into();
        let req = Review::parse(&review("CREATE", object)).unwrap();
        let r = req.decide(Ok(None), &Judge::new(false));
        assert!(!r.allowed);
        let m = &r.result.message;
        assert!(
            m.contains(
                "spec.decode.replicas: spec asks for 100001 engine pods (prefill 1 instance x 1 node, decode 100000 instances x 1 node)"
            ),
            "{m}"
        );
        assert!(m.contains("this operator allows at most 512 per PDDeployment (operator flag --max-pods-per-deployment, chart value limits.maxPodsPerDeployment)"), "{m}");
    }

    #[test]
    fn the_pod_limit_is_the_operators() {
        let mut object = pdd(serde_json::json!({"tp": 4}));
        object["spec"]["decode"]["replicas"] = 600.into();
        let req = Review::parse(&review("CREATE", object)).unwrap();
        let r = req.decide(Ok(None), &Judge::new(false));
        assert!(!r.allowed && r.result.message.contains("spec asks for 601 engine pods"), "{}", r.result.message);
        assert!(req.decide(Ok(None), &Judge { max_pods: 601, ..Judge::new(false) }).allowed, "within a raised limit");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Review::parse(&body);
        }

        #[test]
        fn arbitrary_objects_get_a_well_formed_response(
            op in prop_oneof![Just("CREATE"), Just("UPDATE"), Just("DELETE"), Just("CONNECT")],
            tp in any::<i64>(), dcp in any::<i64>(), path in ".{0,20}", extra in ".{0,10}",
        ) {
            let object = serde_json::json!({"apiVersion": "pd.inference.dev/v1alpha1", "kind": "PDDeployment", "metadata": {"name": extra},
                "spec": {"model": {"path": path}, "prefill": {"parallelism": {"tp": tp}}, "decode": {"parallelism": {"tp": tp, "dcp": dcp}}}});
            let req = Review::parse(&review(op, object)).unwrap();
            let v = req.respond(Ok(None), &Judge::new(false));
            prop_assert_eq!(&v["response"]["uid"], "u-1");
            prop_assert!(v["response"]["allowed"].is_boolean());
        }
    }
}
