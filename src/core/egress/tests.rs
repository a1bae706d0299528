use super::*;

fn policy(hub: &[&str], prometheus: &[&str]) -> EgressPolicy {
    let own = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    EgressPolicy::new(&own(hub), &own(prometheus)).unwrap()
}

fn prometheus(p: &EgressPolicy, url: &str) -> Result<(), String> {
    p.allows(Target::Prometheus, url).map_err(|r| r.to_string())
}

#[test]
fn the_default_reaches_in_cluster_services_and_huggingface_only() {
    let p = EgressPolicy::default();
    for ok in ["http://prometheus-operated.monitoring.svc:9090", "http://prom.monitoring.svc.cluster.local/sub", "https://p.m.svc"] {
        assert_eq!(prometheus(&p, ok), Ok(()), "{ok}");
    }
    assert_eq!(p.allows(Target::Hub, "https://huggingface.co"), Ok(()));
    assert_eq!(p.allows(Target::Hub, "https://huggingface.co:443/"), Ok(()), "the default port is the same origin");
    assert!(p.allows(Target::Hub, "http://huggingface.co").is_err(), "the scheme is part of the entry");
    assert!(p.allows(Target::Hub, "https://huggingface.co.evil.example").is_err());
    assert!(prometheus(&p, "http://svc").is_err(), "`*.svc` needs a label before the suffix");
}

#[test]
fn a_host_not_listed_is_refused_with_the_field_the_list_and_the_fix() {
    let p = EgressPolicy::default();
    assert_eq!(
        prometheus(&p, "http://10.0.0.1:9090/api").unwrap_err(),
        "spec.autoscaling.prometheus.url: http://10.0.0.1:9090 is not among the Prometheus hosts this operator may reach (*.svc, *.svc.cluster.local) \
         (fix: ask the platform team to add it with the chart value egress.prometheusHosts (operator flag --allowed-prometheus-hosts), \
         or use an in-cluster Service name (SERVICE.NAMESPACE.svc))"
    );
    let e = prometheus(&p, "http://prometheus-operated.monitoring:9090").unwrap_err();
    assert!(
        e.contains("(fix: write the Service's name in full, http://prometheus-operated.monitoring.svc (a SERVICE.NAMESPACE name"),
        "{e}"
    );
    let e = p.allows(Target::Hub, "http://internal-wiki.corp:8080").unwrap_err().to_string();
    assert!(e.starts_with("spec.model.source.huggingFace.endpoint: http://internal-wiki.corp:8080 is not among the Hub endpoints"), "{e}");
    assert!(e.contains("egress.hubEndpoints"), "{e}");
}

#[test]
fn loopback_link_local_metadata_and_unspecified_are_refused_whatever_a_wildcard_says() {
    let p = policy(&["*.internal", "*.localhost"], &["*.svc", "*.internal", "*.localhost"]);
    for url in [
        "http://127.0.0.1:9090",
        "http://127.1.2.3/",
        "http://2130706433/",
        "http://0x7f.1/",
        "http://[::1]:9090",
        "http://[::ffff:127.0.0.1]/",
        "http://localhost:9090",
        "http://LOCALHOST./",
        "http://x.localhost/",
        "http://169.254.169.254/",
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://[fe80::1]/",
        "http://[fd00:ec2::254]/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://0.0.0.0:9090",
        "http://[::]/",
    ] {
        let e = prometheus(&p, url).expect_err(url);
        assert!(e.contains("which the operator never reaches unless the platform lists that exact host"), "{url}: {e}");
        assert!(p.allows(Target::Hub, url).is_err(), "{url}");
    }
    assert!(prometheus(&p, "http://169.254.169.254/").unwrap_err().contains("host 169.254.169.254 is a link-local address"));
}

#[test]
fn the_platform_may_name_a_reserved_host_exactly_and_only_so() {
    let p = policy(&["http://127.0.0.1"], &["http://127.0.0.1:9090", "[::1]"]);
    assert_eq!(prometheus(&p, "http://127.0.0.1:9090/"), Ok(()));
    assert!(prometheus(&p, "http://127.0.0.1:9091/").is_err(), "the listed port only");
    assert!(prometheus(&p, "https://127.0.0.1:9090/").is_err(), "the listed scheme only");
    assert_eq!(prometheus(&p, "http://[::1]:1234"), Ok(()));
    assert!(prometheus(&p, "http://127.0.0.2:9090/").is_err());
    assert_eq!(p.allows(Target::Hub, "http://127.0.0.1:41234"), Ok(()), "a listed host without a port: any port");
    assert!(p.allows(Target::Hub, "https://huggingface.co").is_err(), "the list replaces the default");
}

#[test]
fn credentials_and_other_schemes_are_refused_always() {
    let p = policy(&["http://127.0.0.1"], &["*.svc", "prom.svc"]);
    let e = prometheus(&p, "http://user:secret@prom.svc:9090").unwrap_err();
    assert!(e.contains("carries credentials") && !e.contains("secret"), "{e}");
    assert!(prometheus(&p, "http://user@prom.svc").unwrap_err().contains("carries credentials"));
    for url in ["ftp://prom.svc/", "file:///etc/passwd", "gopher://prom.svc:70/"] {
        assert!(prometheus(&p, url).unwrap_err().contains("is neither http nor https"), "{url}");
    }
    assert!(prometheus(&p, "not a url").unwrap_err().contains("is not a URL"));
}

#[test]
fn entries_are_checked_when_the_operator_starts() {
    let e = |entry: &str| Allowed::parse("--allowed-prometheus-hosts", entry).unwrap_err().to_string();
    assert!(e("ftp://x").contains("only http and https"));
    assert!(e("a.*.svc").contains("at the start only"));
    assert!(e("*.").contains("non-empty suffix"));
    assert!(e("http://u@x").contains("no path, credentials"));
    assert!(e("x:99999").contains("port"));
    let ok = Allowed::parse("f", "https://[::1]:8443/").unwrap();
    assert!(ok.matches("https", &Host::Ipv6(std::net::Ipv6Addr::LOCALHOST), Some(8443)));
    let empty = EgressPolicy::new(&[String::new()], &[]).unwrap();
    assert!(empty.allows(Target::Hub, "https://huggingface.co").unwrap_err().message.ends_with("(none)"));
}

#[test]
fn a_spec_is_checked_on_both_fields() {
    let spec: PDDeploymentSpec = serde_norway::from_str(
        "model: {path: a/b, source: {huggingFace: {repo: a/b, endpoint: 'http://169.254.169.254'}}}\n\
         prefill: {}\ndecode: {}\nautoscaling: {mode: Recommend, prometheus: {url: 'http://10.0.0.1:9090'}}\n",
    )
    .unwrap();
    let findings = EgressPolicy::default().check(&spec);
    let fields: Vec<_> = findings.iter().map(|f| f.field.as_str()).collect();
    assert_eq!(fields, [Target::Hub.field(), Target::Prometheus.field()]);
    let plain: PDDeploymentSpec =
        serde_norway::from_str("model: {path: a/b, source: {huggingFace: {repo: a/b}}}\nprefill: {}\ndecode: {}\n").unwrap();
    assert!(EgressPolicy::default().check(&plain).is_empty(), "the default endpoint is allowed by default");
}

#[test]
fn a_redirect_leaves_the_origin_when_scheme_host_or_port_change() {
    let from = "https://huggingface.co/a/b/resolve/main/config.json";
    assert!(same_origin(from, "https://huggingface.co/c/d/resolve/main/config.json"));
    assert!(same_origin(from, "https://huggingface.co:443/x"));
    assert!(!same_origin(from, "https://169.254.169.254/latest/meta-data/"));
    assert!(!same_origin(from, "http://huggingface.co/x"));
    assert!(!same_origin(from, "https://huggingface.co:8443/x"));
    assert!(!same_origin(from, "file:///etc/passwd"));
}

#[test]
fn the_fetch_job_follows_the_hubs_cdn_but_never_to_reserved_hosts_or_plain_http() {
    let from = "https://huggingface.co/a/b/resolve/main/model.safetensors";
    assert!(fetch_redirect_allowed(from, "https://cas-bridge.xethub.hf.co/xet/abc?sig=1"));
    assert!(fetch_redirect_allowed(from, "https://huggingface.co/c/d/resolve/main/model.safetensors"));
    assert!(!fetch_redirect_allowed(from, "http://cdn.example/x"), "no downgrade off the origin");
    assert!(!fetch_redirect_allowed(from, "https://169.254.169.254/latest/meta-data/"));
    assert!(!fetch_redirect_allowed(from, "https://localhost/x"));
    assert!(!fetch_redirect_allowed(from, "https://u:p@cdn.example/x"));
}
