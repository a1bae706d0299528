//! The NetworkPolicies of one PDDeployment: who may reach its engines and its router.
//!
//! Flows kept open (docs/releases-and-rules.md "Network policy" lists them for users):
//! - engine ↔ engine of the same PDDeployment, every port: the bootstrap server (`GET`/`PUT
//!   /route`, `/health`), the rank ports the KV moves over (dynamic), `--dist-init-addr` and the
//!   collective ports of multi-node instances; the decode's handshake sidecar shares its pod.
//! - router → engines' HTTP port (requests, health checks, discovery's probes).
//! - the operator → engines' HTTP port, when its planner scrapes their `/metrics` itself
//!   (`spec.autoscaling` without a Prometheus).
//! - `clientsFrom` (default: the namespace) → the router's port and its metrics port; with the
//!   router disabled, to the engines' HTTP port instead.
//!
//! Everything else that reaches an engine pod is refused once a policy selects it. Egress is not
//! restricted (DNS, model downloads, the apiserver for the sidecar and the router's discovery).
//!
//! The engine dry run's pod (`<name>-dry-run`) takes no connection and makes only DNS queries and,
//! when it resolves the model from the Hub itself (no config.json kept or named), HTTPS ones.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    LABEL_COMPONENT, LABEL_DEPLOYMENT, LABEL_ROLE, OPERATOR_COMPONENT, ROUTER_METRICS_PORT, ROUTER_ROLE, common_labels, engine_pods,
    engines_name, meta,
};
use pd_api::{DEFAULT_HTTP_PORT, DryRunPolicy, PDDeploymentSpec};

/// `<name>-engines` and, with the router on, `<name>-router`; none when the spec turns them off.
pub(super) fn policies(
    spec: &PDDeploymentSpec,
    (name, ns): (&str, &str),
    owners: &Option<Vec<OwnerReference>>,
    operator_namespace: &str,
) -> Vec<NetworkPolicy> {
    if !spec.network_policy.enabled {
        return Vec::new();
    }
    let clients = clients(spec);
    let engines = engine_pods(name);
    let mut ingress = vec![rule(vec![pods(engine_pods(name))], &[])];
    if spec.router.enabled {
        // smg also checks at registration that a prefill's bootstrap port accepts connections.
        ingress.push(rule(vec![pods(router_of(name))], &[DEFAULT_HTTP_PORT, spec.kv_transfer.bootstrap_port]));
    } else {
        ingress.push(rule(clients.clone(), &[DEFAULT_HTTP_PORT]));
    }
    if spec.autoscaling.as_ref().is_some_and(|a| a.prometheus.is_none()) {
        ingress.push(rule(vec![operator_pods(operator_namespace)], &[DEFAULT_HTTP_PORT]));
    }
    let mut out = vec![policy(engines_name(name), ns, name, owners, engines, ingress)];
    if spec.router.enabled {
        // Requests, and the router's Prometheus metrics, from the same clients.
        let ingress = vec![rule(clients, &[spec.router.port, ROUTER_METRICS_PORT])];
        out.push(policy(format!("{name}-router"), ns, name, owners, router_of(name), ingress));
    }
    if spec.engine.dry_run_policy() != DryRunPolicy::Off {
        let hub = crate::model_read::config_ref(name, &spec.model).is_none();
        out.push(dry_run_policy((name, ns), owners, hub));
    }
    out
}

/// DNS (UDP and TCP 53) and, with `hub`, HTTPS (TCP 443).
const DNS_PORT: u16 = 53;
const HTTPS_PORT: u16 = 443;

/// The dry-run pod's policy: nothing in; out, DNS and, when `hub` (the shim resolves the model's
/// config from the Hub), HTTPS to any address (a Hub's addresses cannot be selected portably).
fn dry_run_policy((name, ns): (&str, &str), owners: &Option<Vec<OwnerReference>>, hub: bool) -> NetworkPolicy {
    let port = |p: u16, protocol: &str| NetworkPolicyPort {
        port: Some(IntOrString::Int(i32::from(p))),
        protocol: Some(protocol.into()),
        ..Default::default()
    };
    let mut ports = vec![port(DNS_PORT, "UDP"), port(DNS_PORT, "TCP")];
    if hub {
        ports.push(port(HTTPS_PORT, "TCP"));
    }
    let selected = LabelSelector {
        match_labels: Some(BTreeMap::from([
            (LABEL_DEPLOYMENT.to_owned(), name.to_owned()),
            (LABEL_ROLE.to_owned(), crate::names::DRY_RUN_ROLE.to_owned()),
        ])),
        ..Default::default()
    };
    NetworkPolicy {
        metadata: meta(crate::names::policy_name(name), ns, common_labels(name, "network-policy"), owners),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selected),
            ingress: Some(Vec::new()),
            egress: Some(vec![NetworkPolicyEgressRule { to: None, ports: Some(ports) }]),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
        }),
    }
}

/// `spec.networkPolicy.clientsFrom`, or every pod of the namespace.
fn clients(spec: &PDDeploymentSpec) -> Vec<NetworkPolicyPeer> {
    if spec.network_policy.clients_from.is_empty() {
        vec![pods(LabelSelector::default())]
    } else {
        spec.network_policy.clients_from.clone()
    }
}

fn policy(
    policy_name: String,
    ns: &str,
    name: &str,
    owners: &Option<Vec<OwnerReference>>,
    selected: LabelSelector,
    ingress: Vec<NetworkPolicyIngressRule>,
) -> NetworkPolicy {
    NetworkPolicy {
        metadata: meta(policy_name, ns, common_labels(name, "network-policy"), owners),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selected),
            ingress: Some(ingress),
            policy_types: Some(vec!["Ingress".into()]),
            ..Default::default()
        }),
    }
}

/// From `from` (an empty list would mean everyone: callers never pass one), to `ports` (none:
/// every port).
fn rule(from: Vec<NetworkPolicyPeer>, ports: &[u16]) -> NetworkPolicyIngressRule {
    let port =
        |p: &u16| NetworkPolicyPort { port: Some(IntOrString::Int(i32::from(*p))), protocol: Some("TCP".into()), ..Default::default() };
    NetworkPolicyIngressRule { from: Some(from), ports: (!ports.is_empty()).then(|| ports.iter().map(port).collect()) }
}

fn pods(selector: LabelSelector) -> NetworkPolicyPeer {
    NetworkPolicyPeer { pod_selector: Some(selector), ..Default::default() }
}

/// The operator's pods, in its namespace (`kubernetes.io/metadata.name`, set by the apiserver).
fn operator_pods(namespace: &str) -> NetworkPolicyPeer {
    let select =
        |k: &str, v: &str| LabelSelector { match_labels: Some(BTreeMap::from([(k.to_owned(), v.to_owned())])), ..Default::default() };
    NetworkPolicyPeer {
        namespace_selector: Some(select("kubernetes.io/metadata.name", namespace)),
        pod_selector: Some(select(LABEL_COMPONENT, OPERATOR_COMPONENT)),
        ..Default::default()
    }
}

fn router_of(name: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([
            (LABEL_DEPLOYMENT.to_owned(), name.to_owned()),
            (LABEL_ROLE.to_owned(), ROUTER_ROLE.to_owned()),
        ])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: serde_json::Value) -> PDDeploymentSpec {
        let mut v = serde_json::json!({"model": {"path": "Qwen/Qwen3-8B"}, "prefill": {}, "decode": {}});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(v).unwrap()
    }

    fn ingress(p: &NetworkPolicy) -> Vec<NetworkPolicyIngressRule> {
        p.spec.as_ref().unwrap().ingress.clone().unwrap()
    }

    /// The rule's ports; empty: every port.
    fn ports_of(rule: &NetworkPolicyIngressRule) -> Vec<i32> {
        let port = |p: &NetworkPolicyPort| match p.port {
            Some(IntOrString::Int(n)) => n,
            _ => panic!("a numbered port expected: {p:?}"),
        };
        rule.ports.iter().flatten().map(port).collect()
    }

    #[test]
    fn engines_take_any_port_from_their_own_engines_and_http_from_their_router_only() {
        let ps = policies(&spec(serde_json::json!({})), ("m", "ns"), &None, "pd-system");
        let names: Vec<_> = ps.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, ["m-engines", "m-router", "m-dry-run"]);
        let engines = &ps[0];
        assert_eq!(engines.spec.as_ref().unwrap().pod_selector, Some(engine_pods("m")));
        assert_eq!(engines.spec.as_ref().unwrap().policy_types, Some(vec!["Ingress".to_owned()]), "egress stays open");
        let rules = ingress(engines);
        assert_eq!(rules.len(), 2, "{rules:?}");
        assert_eq!(rules[0].from, Some(vec![pods(engine_pods("m"))]));
        assert_eq!(ports_of(&rules[0]), Vec::<i32>::new(), "bootstrap, rank and dist-init ports between the engines");
        assert_eq!(rules[1].from, Some(vec![pods(router_of("m"))]));
        assert_eq!(ports_of(&rules[1]), [i32::from(DEFAULT_HTTP_PORT), 8998], "requests, and smg's bootstrap probe");
        // Another PDDeployment's engines are not peers.
        assert_ne!(engine_pods("m"), engine_pods("other"));
    }

    #[test]
    fn the_router_takes_its_port_from_the_namespace_unless_clients_are_named() {
        let ps = policies(&spec(serde_json::json!({})), ("m", "ns"), &None, "pd-system");
        let router = ingress(&ps[1]);
        assert_eq!(router[0].from, Some(vec![pods(LabelSelector::default())]), "every pod of the namespace");
        assert_eq!(ports_of(&router[0]), [8000, i32::from(ROUTER_METRICS_PORT)]);
        let only = serde_json::json!({"namespaceSelector": {"matchLabels": {"team": "web"}}});
        let named = spec(serde_json::json!({"networkPolicy": {"clientsFrom": [only]}, "router": {"port": 9000}}));
        let router = ingress(&policies(&named, ("m", "ns"), &None, "pd-system")[1]);
        assert_eq!(serde_json::to_value(&router[0].from).unwrap(), serde_json::json!([only]));
        assert_eq!(ports_of(&router[0]), [9000, i32::from(ROUTER_METRICS_PORT)]);
    }

    #[test]
    fn without_a_router_the_clients_reach_the_engines_http_port() {
        let ps = policies(&spec(serde_json::json!({"router": {"enabled": false}})), ("m", "ns"), &None, "pd-system");
        assert_eq!(ps.len(), 2, "the engines' and the dry run's");
        let rules = ingress(&ps[0]);
        assert_eq!(rules[1].from, Some(vec![pods(LabelSelector::default())]));
        assert_eq!(ports_of(&rules[1]), [i32::from(DEFAULT_HTTP_PORT)]);
    }

    #[test]
    fn a_planner_without_prometheus_lets_the_operators_pods_reach_the_engines_http_port() {
        let scrape = serde_json::json!({"autoscaling": {"mode": "Recommend"}});
        let rules = ingress(&policies(&spec(scrape), ("m", "ns"), &None, "ops")[0]);
        assert_eq!(rules.len(), 3, "{rules:?}");
        let from = serde_json::to_value(&rules[2].from).unwrap();
        let want = serde_json::json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
            "podSelector": {"matchLabels": {"pd.inference.dev/component": "operator"}}}]);
        assert_eq!(from, want);
        assert_eq!(ports_of(&rules[2]), [i32::from(DEFAULT_HTTP_PORT)]);
        let prometheus = serde_json::json!({"autoscaling": {"mode": "Recommend", "prometheus": {"url": "http://p:9090"}}});
        assert_eq!(ingress(&policies(&spec(prometheus), ("m", "ns"), &None, "ops")[0]).len(), 2, "Prometheus scrapes as a client");
    }

    /// Attack on today's main: the dry-run pod runs the tenant's image with the tenant's argv
    /// and took connections from anywhere and made them to anywhere.
    #[test]
    fn the_dry_run_pod_takes_nothing_in_and_reaches_only_dns_and_the_hub_when_it_resolves_there() {
        let egress_ports = |extra: serde_json::Value| {
            let ps = policies(&spec(extra), ("m", "ns"), &None, "pd-system");
            let p = ps.into_iter().find(|p| p.metadata.name.as_deref() == Some("m-dry-run")).expect("the dry run's policy");
            let s = p.spec.unwrap();
            assert_eq!(s.policy_types, Some(vec!["Ingress".to_owned(), "Egress".to_owned()]));
            assert_eq!(s.ingress, Some(Vec::new()), "nothing may connect to it");
            let labels = s.pod_selector.unwrap().match_labels.unwrap();
            assert_eq!(labels[LABEL_ROLE], crate::names::DRY_RUN_ROLE);
            let rules = s.egress.unwrap();
            assert_eq!(rules.len(), 1);
            assert!(rules[0].to.is_none(), "DNS servers and the Hub cannot be selected portably");
            let ports = rules[0].ports.clone().unwrap();
            ports.iter().map(|p| format!("{}/{}", serde_json::to_value(&p.port).unwrap(), p.protocol.clone().unwrap())).collect::<Vec<_>>()
        };
        // Without a config.json kept or named, SGLang in the pod resolves the model from the Hub.
        assert_eq!(egress_ports(serde_json::json!({})), ["53/UDP", "53/TCP", "443/TCP"]);
        let kept = serde_json::json!({"model": {"path": "Qwen/Qwen3-8B", "source": {"huggingFace": {"repo": "Qwen/Qwen3-8B"}}}});
        assert_eq!(egress_ports(kept), ["53/UDP", "53/TCP"], "the kept config.json is handed over: nothing is fetched");
        let named = serde_json::json!({"model": {"path": "Qwen/Qwen3-8B", "configMapRef": {"name": "c"}}});
        assert_eq!(egress_ports(named), ["53/UDP", "53/TCP"]);
        let off = policies(&spec(serde_json::json!({"engine": {"dryRun": "Off"}})), ("m", "ns"), &None, "pd-system");
        assert!(off.iter().all(|p| p.metadata.name.as_deref() != Some("m-dry-run")));
    }

    #[test]
    fn switched_off_renders_none() {
        assert!(policies(&spec(serde_json::json!({"networkPolicy": {"enabled": false}})), ("m", "ns"), &None, "pd-system").is_empty());
    }
}
