//! The `restricted` Pod Security Standard as a pure check (test support), and the test that every
//! pod pd-operator creates passes it when the user's templates allow: engine pods, the router,
//! the fetch and read Jobs and the engine dry run. The rules are Kubernetes' own
//! (https://kubernetes.io/docs/concepts/security/pod-security-standards/, `restricted`), minus the
//! ones no renderer here could break (sysctls, host ports, AppArmor and SELinux options).

use k8s_openapi::api::core::v1::{Container, PodSpec, SecurityContext};

/// The volume types `restricted` allows (pod-security-admission v0.37, `restrictedVolumes`: image
/// volumes joined the list with the `image` source).
const ALLOWED_VOLUMES: [&str; 9] =
    ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image", "persistentVolumeClaim", "projected", "secret"];

/// What keeps `pod` out of a namespace enforcing `restricted`; empty when it is admitted.
pub fn restricted_violations(pod: &PodSpec) -> Vec<String> {
    let mut out = Vec::new();
    let mut no = |what: String| out.push(what);
    if pod.host_network == Some(true) || pod.host_pid == Some(true) || pod.host_ipc == Some(true) {
        no("host namespaces (hostNetwork, hostPID or hostIPC)".into());
    }
    for v in pod.volumes.iter().flatten() {
        let value = serde_json::to_value(v).unwrap_or_default();
        let kinds: Vec<&String> = value.as_object().into_iter().flat_map(|m| m.keys()).filter(|k| *k != "name").collect();
        if let Some(kind) = kinds.iter().find(|k| !ALLOWED_VOLUMES.contains(&k.as_str())) {
            no(format!("volume {} of type {kind}", v.name));
        }
    }
    let psc = pod.security_context.clone().unwrap_or_default();
    let seccomp_ok = |t: &str| t == "RuntimeDefault" || t == "Localhost";
    let pod_seccomp = psc.seccomp_profile.as_ref().map(|p| p.type_.as_str());
    if pod_seccomp.is_some_and(|t| !seccomp_ok(t)) {
        no(format!("the pod's seccomp profile {pod_seccomp:?}"));
    }
    if psc.run_as_user == Some(0) {
        no("the pod runs as user 0".into());
    }
    let containers: Vec<&Container> = pod.containers.iter().chain(pod.init_containers.iter().flatten()).collect();
    for c in containers {
        let sc: SecurityContext = c.security_context.clone().unwrap_or_default();
        let name = &c.name;
        if sc.privileged == Some(true) {
            no(format!("container {name} is privileged"));
        }
        if sc.allow_privilege_escalation != Some(false) {
            no(format!("container {name} does not set allowPrivilegeEscalation: false"));
        }
        let caps = sc.capabilities.clone().unwrap_or_default();
        if !caps.drop.iter().flatten().any(|d| d == "ALL") {
            no(format!("container {name} does not drop ALL capabilities"));
        }
        if let Some(add) = caps.add.iter().flatten().find(|a| *a != "NET_BIND_SERVICE") {
            no(format!("container {name} adds capability {add}"));
        }
        if sc.run_as_non_root.or(psc.run_as_non_root) != Some(true) {
            no(format!("container {name} does not set runAsNonRoot: true (nor does the pod)"));
        }
        if sc.run_as_user == Some(0) {
            no(format!("container {name} runs as user 0"));
        }
        match sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()).or(pod_seccomp) {
            Some(t) if seccomp_ok(t) => {}
            other => no(format!("container {name} has seccomp profile {other:?}, not RuntimeDefault or Localhost")),
        }
        if sc.proc_mount.as_deref().is_some_and(|m| m != "Default") {
            no(format!("container {name} has procMount {:?}", sc.proc_mount));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::{self, RenderOptions};
    use k8s_openapi::api::core::v1::Pod;
    use pd_api::PDDeployment;

    /// Both roles' templates ask for what `restricted` wants of a container.
    const RESTRICTED: &str = "{runAsNonRoot: true, runAsUser: 1000, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}, seccompProfile: {type: RuntimeDefault}}";

    fn spec(source: &str, context: Option<&str>) -> PDDeployment {
        let sc = context.map(|c| format!("securityContext: {c}")).unwrap_or_default();
        let yaml = format!(
            "apiVersion: pd.inference.dev/v1alpha1
kind: PDDeployment
metadata: {{name: m, namespace: ns}}
spec:
  model: {{path: Qwen/Qwen3-8B, source: {source}}}
  engine: {{dryRun: Required}}
  prefill:
    template: {{{sc}}}
  decode:
    parallelism: {{tp: 16}}
    template: {{{sc}}}
"
        );
        serde_norway::from_str(&yaml).unwrap()
    }

    const HUB: &str = "{huggingFace: {repo: Qwen/Qwen3-8B, cache: {size: 100Gi}}}";
    const PVC: &str = "{pvc: {claimName: weights, path: qwen3}}";
    const IMAGE: &str = "{image: {reference: 'registry.example/qwen3:1', path: model}}";

    /// Every pod the operator creates for `pdd`, by what it is.
    fn child_pods(pdd: &PDDeployment) -> Vec<(String, PodSpec)> {
        let opts = RenderOptions::default();
        let r = render::render(pdd, &crate::model::resolve(&pdd.spec.model, None), &opts).unwrap();
        let mut out: Vec<(String, PodSpec)> = r.pods().map(|p| (p.metadata.name.clone().unwrap(), p.spec.clone().unwrap())).collect();
        out.extend(r.deployments.iter().map(|d| ("router".to_owned(), d.spec.template.spec.clone().unwrap())));
        out.extend(r.jobs.iter().map(|j| ("fetch Job".to_owned(), j.spec.clone().unwrap().template.spec.unwrap())));
        out.extend(
            crate::model_read::job(pdd, &opts.operator_image).map(|j| ("read Job".to_owned(), j.spec.unwrap().template.spec.unwrap())),
        );
        let dry: Option<Pod> = crate::dryrun::dry_run(pdd, &r.instances, &opts).unwrap().map(|d| d.pod);
        out.extend(dry.map(|p| ("dry run".to_owned(), p.spec.unwrap())));
        out
    }

    #[test]
    fn every_pod_the_operator_creates_is_admitted_by_restricted_when_the_templates_are() {
        for source in [HUB, PVC, IMAGE] {
            let pods = child_pods(&spec(source, Some(RESTRICTED)));
            let what: Vec<&str> = pods.iter().map(|(w, _)| w.as_str()).collect();
            for kind in ["router", "dry run", if source == HUB { "fetch Job" } else { "read Job" }] {
                assert!(what.contains(&kind), "no {kind} among {what:?}");
            }
            assert!(what.iter().any(|w| w.contains("-decode-")) && what.iter().any(|w| w.contains("-prefill-")), "{what:?}");
            for (what, pod) in &pods {
                assert_eq!(restricted_violations(pod), Vec::<String>::new(), "{what} ({source})");
            }
        }
    }

    /// Attack on today's main: a `dryRun: Required` PDDeployment in a `restricted` namespace
    /// never got an engine pod, since its dry-run pod (root, default capabilities) was refused.
    #[test]
    fn the_dry_run_pod_needs_of_the_template_only_the_user_it_runs_as() {
        let pods = child_pods(&spec(PVC, None));
        let (_, dry) = pods.iter().find(|(w, _)| w == "dry run").unwrap();
        let violations = restricted_violations(dry);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].contains("runAsNonRoot"), "SGLang's image runs as root unless told: {violations:?}");
        // A user given at the container's level makes it non-root; a root one does not.
        let c = crate::dryrun::security_context(Some(&SecurityContext { run_as_user: Some(1000), ..Default::default() }));
        assert_eq!((c.run_as_non_root, c.read_only_root_filesystem), (Some(true), Some(true)));
        assert_eq!(
            crate::dryrun::security_context(Some(&SecurityContext { run_as_user: Some(0), ..Default::default() })).run_as_non_root,
            None
        );
        // What engines need (privileged, IPC_LOCK for RDMA) the dry run does not get.
        let rdma = serde_json::from_value(serde_json::json!({"privileged": true, "capabilities": {"add": ["IPC_LOCK"]}})).unwrap();
        let c = crate::dryrun::security_context(Some(&rdma));
        assert_eq!((c.privileged, c.capabilities.unwrap().add), (None, None));
    }

    #[test]
    fn the_checker_refuses_what_restricted_refuses() {
        let pods = child_pods(&spec(PVC, None));
        let (_, engine) = pods.iter().find(|(w, _)| w.contains("-prefill-")).unwrap();
        let violations = restricted_violations(engine);
        for rule in ["allowPrivilegeEscalation", "drop ALL", "runAsNonRoot", "seccomp"] {
            assert!(violations.iter().any(|v| v.contains(rule)), "{rule} not reported: {violations:?}");
        }
        let host: PodSpec = serde_json::from_value(serde_json::json!({"containers": [], "hostNetwork": true,
            "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}))
        .unwrap();
        assert_eq!(restricted_violations(&host).len(), 2, "{:?}", restricted_violations(&host));
    }

    /// Attack on today's main: every engine pod carried its ServiceAccount's API token, which
    /// SGLang never uses, for anything that ran in it to call the apiserver with.
    #[test]
    fn engine_pods_carry_no_api_token_unless_the_template_asks() {
        let named = |yaml: &str| {
            let mut p = spec(PVC, Some(RESTRICTED));
            p.spec.prefill.template = serde_norway::from_str(yaml).unwrap();
            p.spec.decode.template = serde_norway::from_str(yaml).unwrap();
            p
        };
        for (name, pod) in child_pods(&named("{serviceAccountName: engines}")).iter().filter(|(w, _)| w.starts_with("m-")) {
            assert_eq!(pod.automount_service_account_token, Some(false), "{name}");
        }
        let asked = child_pods(&named("{serviceAccountName: engines, automountServiceAccountToken: true}"));
        for (name, pod) in asked.iter().filter(|(w, _)| w.starts_with("m-")) {
            assert_eq!(pod.automount_service_account_token, Some(true), "{name}");
        }
        // The decode's own ServiceAccount exists for its sidecar alone, which mounts its token itself.
        let own = child_pods(&spec(PVC, Some(RESTRICTED)));
        let (_, decode) = own.iter().find(|(w, _)| w.contains("-decode-")).unwrap();
        assert_eq!(decode.automount_service_account_token, Some(false));
        let sidecar = &decode.init_containers.as_ref().unwrap()[0];
        assert!(sidecar.volume_mounts.iter().flatten().any(|m| m.name == "handshake-token"));
        assert!(decode.containers[0].volume_mounts.iter().flatten().all(|m| m.name != "handshake-token"), "not the engine");
    }
}
