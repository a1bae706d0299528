//! The chart's observability (docs/observability.md): the Grafana dashboard, the PodMonitor and
//! the PrometheusRule render from the files promtool tests and Grafana loads, every alert has a
//! runbook and promtool cases that fire and that stay silent, and every metric the rules and the
//! dashboard read is one its exporter really has: the operator's and the stand-in's Rust, the
//! pinned SGLang wheel's collector, the pinned smg's binary, kube-apiserver's source; only
//! kube-state-metrics' names are a list here (nothing of it is built or installed).
//!
//! Needs no cluster: helm (hack/tools.sh, or PD_TOOLS_BIN), promtool (hack/prometheus.sh, or
//! PD_PROMETHEUS_BIN), the SGLang and smg venvs (hack/sglang-venv.sh, hack/smg-venv.sh, or
//! PD_SGLANG_PYTHON / PD_SMG_PYTHON), and the Go module cache hack/tools.sh filled. A missing one
//! fails the test with what to run; none is skipped. `promtool test rules` itself runs in
//! hack/test.sh.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value as Json;
use serde_norway::Value as Yaml;

const CHART: &str = "charts/pd-operator";
const RULES: &str = "charts/pd-operator/rules/pd-operator.rules.yaml";
const RULE_TESTS: &str = "charts/pd-operator/rules/tests";
const DASHBOARD: &str = "charts/pd-operator/dashboards/pd-serving.json";
const RUNBOOKS: &str = "docs/runbooks.md";
const ALL_ON: &str = "metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,metrics.prometheusRule.enabled=true,metrics.grafanaDashboard.enabled=true";
const RUNBOOK_BASE: &str = "https://git.example.com/pd/pd-operator/blob/v0.1.0/";

/// The repository root: the first ancestor of this crate that holds the chart (the tests may
/// move into a workspace member).
fn repo() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let start = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        start
            .ancestors()
            .find(|d| d.join(CHART).join("Chart.yaml").is_file())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| panic!("no ancestor of {} holds {CHART}/Chart.yaml", start.display()))
    })
}

fn read(rel: &str) -> String {
    let p = repo().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// The last stdout line of a hack/ script that prints a path (a bin directory or a python).
fn script_path(script: &str) -> PathBuf {
    let o = run(&mut Command::new(repo().join(script)));
    assert!(o.status.success(), "{script} failed; the observability tests need what it provides:\n{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    PathBuf::from(out.lines().last().unwrap_or_default().trim())
}

fn tool(env: &str, script: &str, name: &str) -> PathBuf {
    let dir = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| script_path(script));
    let p = dir.join(name);
    assert!(p.is_file(), "{} is not there (from {env} or {script})", p.display());
    p
}

fn helm() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| tool("PD_TOOLS_BIN", "hack/tools.sh", "helm"))
}

fn promtool() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| tool("PD_PROMETHEUS_BIN", "hack/prometheus.sh", "promtool"))
}

fn python(env: &str, script: &str) -> PathBuf {
    std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| script_path(script))
}

/// `helm template` of the chart with `--set` values; the objects it renders, by kind.
fn render(set: &str) -> Vec<Yaml> {
    let chart = repo().join(CHART);
    let mut cmd = Command::new(helm());
    cmd.args(["template", "rel", chart.to_str().unwrap(), "--namespace", "ops"]);
    if !set.is_empty() {
        cmd.args(["--set", set]);
    }
    let o = run(&mut cmd);
    assert!(o.status.success(), "helm template --set {set} failed:\n{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    out.split("\n---")
        .filter(|doc| doc.lines().any(|l| l.starts_with("kind:")))
        .map(|doc| serde_norway::from_str::<Yaml>(doc).unwrap_or_else(|e| panic!("helm rendered YAML that does not parse: {e}\n{doc}")))
        .collect()
}

fn kind_of(o: &Yaml) -> &str {
    o["kind"].as_str().unwrap_or_default()
}

fn one<'a>(objects: &'a [Yaml], kind: &str, name_suffix: &str) -> &'a Yaml {
    let found: Vec<_> =
        objects.iter().filter(|o| kind_of(o) == kind && o["metadata"]["name"].as_str().is_some_and(|n| n.ends_with(name_suffix))).collect();
    assert_eq!(found.len(), 1, "expected one {kind} named *{name_suffix}, found {}", found.len());
    found[0]
}

fn temp_file(name: &str, body: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("pd-observability-{}-{name}", std::process::id()));
    std::fs::write(&p, body).unwrap_or_else(|e| panic!("cannot write {}: {e}", p.display()));
    p
}

/// `promtool check rules` on a rule file's text.
fn promtool_check_rules(name: &str, body: &str) {
    let p = temp_file(name, body);
    let o = run(Command::new(promtool()).args(["check", "rules"]).arg(&p));
    let _ = std::fs::remove_file(&p);
    assert!(o.status.success(), "promtool check rules rejects {name}:\n{}\n{body}", text(&o));
}

fn rules_file() -> Yaml {
    serde_norway::from_str(&read(RULES)).unwrap_or_else(|e| panic!("{RULES}: {e}"))
}

fn all_rules(groups: &Yaml) -> Vec<&Yaml> {
    groups.as_sequence().expect("groups is a list").iter().flat_map(|g| g["rules"].as_sequence().expect("rules is a list").iter()).collect()
}

fn alert_names(groups: &Yaml) -> BTreeSet<String> {
    all_rules(groups).iter().filter_map(|r| r["alert"].as_str().map(str::to_owned)).collect()
}

fn dashboard() -> Json {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// Every (panel title, expr) of the dashboard.
fn dashboard_queries(d: &Json) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        if p["type"] == "row" {
            continue;
        }
        let title = p["title"].as_str().unwrap_or_default().to_owned();
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("panel {title:?} has no targets"));
        assert!(!targets.is_empty(), "panel {title:?} has no queries");
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("panel {title:?} has a target without expr"));
            out.push((title.clone(), expr.to_owned()));
        }
    }
    out
}

/// A dashboard query as Prometheus sees it once Grafana has filled in the variables.
fn as_promql(expr: &str) -> String {
    ["$__rate_interval", "$namespace", "$pdd", "$model"]
        .iter()
        .zip(["1m", ".*", ".*", ".*"])
        .fold(expr.to_owned(), |e, (var, value)| e.replace(var, value))
}

/// The metric names a PromQL expression reads. Not a parser: strings, label matchers, ranges and
/// label lists are cut out, and what is left that is neither a function, an aggregation, a
/// keyword nor part of a number is a metric name.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Strings (with their escapes), `{...}` and `[...]` become spaces.
    let mut s = String::new();
    let (mut in_str, mut escaped, mut depth) = (false, false, 0);
    for c in expr.chars() {
        if in_str {
            match (escaped, c) {
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => escaped = false,
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ if depth > 0 => {}
            _ => {
                s.push(c);
                continue;
            }
        }
        s.push(' ');
    }
    let label_lists = ["by", "without", "on", "ignoring", "group_left", "group_right"];
    // Binary operators, modifiers and aggregations (they take their parentheses after by/without).
    let not_names =
        "and or unless offset bool sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio";
    let chars: Vec<char> = s.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if !(c.is_ascii_alphabetic() || c == '_' || c == ':') {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let mut j = i;
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        let called = j < chars.len() && chars[j] == '(';
        if label_lists.contains(&word.as_str()) && called {
            while j < chars.len() && chars[j] != ')' {
                j += 1;
            }
            i = j + 1;
        } else if !called
            && !not_names.split(' ').any(|w| w == word)
            && !(start > 0 && (chars[start - 1].is_ascii_digit() || chars[start - 1] == '.'))
        {
            names.insert(word);
        }
    }
    names
}

#[test]
fn metric_name_extraction_finds_selectors_and_skips_the_rest() {
    let got = metric_names(
        r#"sum by (le, engine_type) (rate(sglang:ttft_bucket{engine_type="decode", x=~"a(b}\"[)"}[5m])) / on (pod) group_left (pdd) max(kube_pod_owner) offset 30m > bool 0.01 unless up == 1 or absent(pd_operator_leader) and label_replace(foo, "a", "$1", "b", "(.+)") * 2e-3
           + sum
             without (x) (bar)"#,
    );
    let want: BTreeSet<String> =
        ["sglang:ttft_bucket", "kube_pod_owner", "up", "pd_operator_leader", "foo", "bar"].iter().map(|s| s.to_string()).collect();
    assert_eq!(got, want);
}

#[test]
fn defaults_render_no_monitoring_object() {
    let objects = render("");
    for kind in ["ServiceMonitor", "PodMonitor", "PrometheusRule"] {
        assert!(!objects.iter().any(|o| kind_of(o) == kind), "the default render has a {kind}");
    }
    assert!(!objects.iter().any(|o| kind_of(o) == "ConfigMap"), "the default render has a ConfigMap (the dashboard is off by default)");
}

#[test]
fn chart_lints_with_every_monitoring_object_on() {
    let chart = repo().join(CHART);
    let o = run(Command::new(helm()).args(["lint", "--strict", chart.to_str().unwrap(), "--set", ALL_ON]));
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("[WARNING]") && !text(&o).contains("[ERROR]"), "{}", text(&o));
}

#[test]
fn the_prometheusrule_ships_the_tested_rule_file() {
    let objects =
        render(&format!("{ALL_ON},metrics.prometheusRule.runbookBaseURL={RUNBOOK_BASE},metrics.prometheusRule.labels.release=kps"));
    let pr = one(&objects, "PrometheusRule", "pd-operator");
    assert_eq!(pr["apiVersion"].as_str(), Some("monitoring.coreos.com/v1"));
    assert_eq!(pr["metadata"]["namespace"].as_str(), Some("ops"));
    assert_eq!(pr["metadata"]["labels"]["release"].as_str(), Some("kps"));
    // The file, with the base in front of each runbook_url, is what ships.
    let mut want = rules_file()["groups"].clone();
    let mut prefixed = 0;
    for g in want.as_sequence_mut().unwrap() {
        for r in g["rules"].as_sequence_mut().unwrap() {
            if let Some(url) = r.get("annotations").and_then(|a| a.get("runbook_url")).and_then(Yaml::as_str).map(str::to_owned) {
                r["annotations"]["runbook_url"] = Yaml::String(format!("{RUNBOOK_BASE}{url}"));
                prefixed += 1;
            }
        }
    }
    assert_eq!(prefixed, all_rules(&want).iter().filter(|r| r.get("alert").is_some()).count(), "an alert has no runbook_url");
    assert_eq!(pr["spec"]["groups"], want, "the rendered rule groups differ from {RULES}");
    // What ships is a valid Prometheus rule file.
    let body = serde_norway::to_string(&serde_norway::Mapping::from_iter([(Yaml::from("groups"), pr["spec"]["groups"].clone())])).unwrap();
    promtool_check_rules("rendered.rules.yaml", &body);

    // Without leader election no replica reports leadership: the chart leaves that alert out.
    let objects = render(&format!("{ALL_ON},leaderElection.enabled=false"));
    let alerts = alert_names(&one(&objects, "PrometheusRule", "pd-operator")["spec"]["groups"]);
    let mut expected = alert_names(&rules_file()["groups"]);
    assert!(expected.remove("PDOperatorNoLeader"));
    assert_eq!(alerts, expected);
}

#[test]
fn the_dashboard_configmap_carries_the_sidecar_label_and_the_file() {
    let objects = render(ALL_ON);
    let cm = one(&objects, "ConfigMap", "pd-operator-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"].as_str(), Some("1"));
    assert_eq!(cm["metadata"]["namespace"].as_str(), Some("ops"));
    let shipped: Json = serde_json::from_str(cm["data"]["pd-serving.json"].as_str().expect("data.pd-serving.json")).expect("JSON");
    assert_eq!(shipped, dashboard(), "the ConfigMap's dashboard differs from {DASHBOARD}");

    let objects = render(&format!(
        "{ALL_ON},metrics.grafanaDashboard.label=grafana.example/dashboard,metrics.grafanaDashboard.labelValue=pd,metrics.grafanaDashboard.namespace=monitoring,metrics.grafanaDashboard.annotations.grafana_folder=LLM"
    ));
    let cm = one(&objects, "ConfigMap", "pd-operator-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana.example/dashboard"].as_str(), Some("pd"));
    assert!(cm["metadata"]["labels"].get("grafana_dashboard").is_none());
    assert_eq!(cm["metadata"]["namespace"].as_str(), Some("monitoring"));
    assert_eq!(cm["metadata"]["annotations"]["grafana_folder"].as_str(), Some("LLM"));
}

/// The PodMonitor keeps the engines' instance leaders and the routers, and gives their series
/// the labels the rules and the dashboard group by.
#[test]
fn the_podmonitor_labels_series_the_way_the_rules_read_them() {
    let objects = render(&format!("{ALL_ON},metrics.podMonitor.labels.release=kps,metrics.serviceMonitor.labels.release=kps"));
    let pm = one(&objects, "PodMonitor", "pd-operator-serving");
    assert_eq!(pm["metadata"]["labels"]["release"].as_str(), Some("kps"));
    assert_eq!(one(&objects, "ServiceMonitor", "pd-operator")["metadata"]["labels"]["release"].as_str(), Some("kps"));
    assert_eq!(pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/managed-by"].as_str(), Some("pd-operator"));
    assert_eq!(pm["spec"]["namespaceSelector"]["any"].as_bool(), Some(true));
    let endpoints = pm["spec"]["podMetricsEndpoints"].as_sequence().expect("podMetricsEndpoints");
    let ports: Vec<_> = endpoints.iter().map(|e| e["port"].as_str().unwrap_or_default()).collect();
    assert_eq!(ports, ["http", "metrics"], "the engines' HTTP port and the router's metrics port");
    for e in endpoints {
        let relabel = e["relabelings"].as_sequence().expect("relabelings");
        let keep = &relabel[0];
        assert_eq!(keep["action"].as_str(), Some("keep"), "{e:?}");
        let targets: BTreeSet<_> = relabel.iter().filter_map(|r| r["targetLabel"].as_str()).collect();
        assert_eq!(targets, BTreeSet::from(["pdd", "role", "pd_instance", "kv_set"]));
        for r in relabel.iter().filter(|r| r.get("targetLabel").is_some()) {
            let src = r["sourceLabels"][0].as_str().unwrap();
            assert!(src.starts_with("__meta_kubernetes_pod_label_pd_inference_dev_"), "{src}");
        }
    }
    // The rules and the dashboard group engine and router series by these; the rest comes with
    // every target (namespace, pod) or from the exporters (engine_type, model_name, worker_type...).
    let rules = read(RULES);
    assert!(rules.contains("by (namespace, pdd") && rules.contains("role=\"router\""));
}

#[test]
fn the_values_schema_refuses_bad_monitoring_values() {
    let chart = repo().join(CHART);
    for (set, expect) in [
        ("metrics.podMonitor.interval=soon", "interval"),
        ("metrics.prometheusRule.runbookBaseURL=docs", "runbookBaseURL"),
        ("metrics.grafanaDashboard.label=not a label", "label"),
        ("metrics.grafanaDashboard.labelValue=-1-", "labelValue"),
        ("metrics.prometheusRule.severity=page", "severity"),
    ] {
        let o = run(Command::new(helm()).args(["template", "rel", chart.to_str().unwrap(), "--set", set]));
        assert!(!o.status.success(), "{set} was accepted");
        assert!(text(&o).contains(expect), "{set}: {}", text(&o));
    }
}

/// GitHub's anchor of a markdown heading.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_alert_has_its_labels_annotations_and_a_runbook_section() {
    let runbooks = read(RUNBOOKS);
    // Section text by anchor.
    let mut sections: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in runbooks.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            current = Some(slug(h));
            sections.insert(slug(h), String::new());
        } else if let Some(c) = &current {
            sections.get_mut(c).unwrap().push_str(line);
            sections.get_mut(c).unwrap().push('\n');
        }
    }
    let rules = rules_file();
    let alerts = all_rules(&rules["groups"]).into_iter().filter(|r| r.get("alert").is_some()).collect::<Vec<_>>();
    assert!(alerts.len() >= 12, "only {} alert rules", alerts.len());
    for r in alerts {
        let name = r["alert"].as_str().unwrap();
        let severity = r["labels"]["severity"].as_str().unwrap_or_default();
        assert!(["critical", "warning"].contains(&severity), "{name}: severity {severity:?}");
        for a in ["summary", "description", "runbook_url"] {
            assert!(r["annotations"][a].as_str().is_some_and(|s| !s.is_empty()), "{name}: no {a}");
        }
        let url = r["annotations"]["runbook_url"].as_str().unwrap();
        let anchor =
            url.strip_prefix("docs/runbooks.md#").unwrap_or_else(|| panic!("{name}: runbook_url {url} is not docs/runbooks.md#..."));
        assert_eq!(anchor, slug(name), "{name}: the runbook anchor is the alert's name");
        let section = sections.get(anchor).unwrap_or_else(|| panic!("{name}: {RUNBOOKS} has no '## {name}' section"));
        for part in ["**What it means.**", "**Confirm.**", "**Fix.**"] {
            assert!(section.contains(part), "{name}: its runbook section lacks {part}");
        }
        assert!(section.contains("```"), "{name}: its runbook section has no command to run");
    }
}

/// Each alert has a promtool case where it fires and one where it stays silent.
#[test]
fn promtool_tests_cover_every_alert_firing_and_silent() {
    let mut firing: BTreeMap<String, usize> = BTreeMap::new();
    let mut silent: BTreeMap<String, usize> = BTreeMap::new();
    let dir = repo().join(RULE_TESTS);
    let mut files: Vec<_> =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(!files.is_empty(), "no promtool tests in {}", dir.display());
    for f in files {
        let t: Yaml = serde_norway::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let files: Vec<_> = t["rule_files"].as_sequence().expect("rule_files").iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(files, ["../pd-operator.rules.yaml"], "{}: tests another rule file than the chart's", f.display());
        for case in t["tests"].as_sequence().expect("tests") {
            for a in case.get("alert_rule_test").and_then(Yaml::as_sequence).into_iter().flatten() {
                let name = a["alertname"].as_str().unwrap().to_owned();
                let fired = a.get("exp_alerts").and_then(Yaml::as_sequence).is_some_and(|v| !v.is_empty());
                *if fired { &mut firing } else { &mut silent }.entry(name).or_default() += 1;
            }
        }
    }
    for name in alert_names(&rules_file()["groups"]) {
        assert!(firing.get(&name).is_some_and(|n| *n > 0), "no promtool case where {name} fires");
        assert!(silent.get(&name).is_some_and(|n| *n > 0), "no promtool case where {name} stays silent");
    }
    let unknown: Vec<_> = firing.keys().chain(silent.keys()).filter(|n| !alert_names(&rules_file()["groups"]).contains(*n)).collect();
    assert!(unknown.is_empty(), "promtool cases for alerts the rules do not have: {unknown:?}");
}

#[test]
fn every_dashboard_panel_queries_valid_promql_with_known_variables() {
    let d = dashboard();
    assert_eq!(d["uid"].as_str(), Some("pd-operator-serving"));
    let vars: BTreeSet<String> =
        d["templating"]["list"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap().to_owned()).collect();
    assert_eq!(vars, BTreeSet::from(["datasource", "namespace", "pdd", "model"].map(String::from)));
    let mut ids = BTreeSet::new();
    for p in d["panels"].as_array().unwrap() {
        assert!(ids.insert(p["id"].as_i64().expect("panel id")), "panel id {} twice", p["id"]);
        let g = &p["gridPos"];
        assert!(g["x"].as_i64().unwrap() + g["w"].as_i64().unwrap() <= 24, "panel {} runs off the grid", p["title"]);
        if p["type"] != "row" {
            assert_eq!(p["datasource"]["uid"].as_str(), Some("${datasource}"), "panel {} has a fixed data source", p["title"]);
        }
    }
    let queries = dashboard_queries(&d);
    let mut rules = String::from("groups:\n- name: dashboard\n  rules:\n");
    for (i, (title, expr)) in queries.iter().enumerate() {
        let promql = as_promql(expr);
        assert!(!promql.contains('$'), "panel {title:?}: a variable the dashboard does not define in {expr}");
        rules.push_str(&format!("  - record: dashboard:query_{i}\n    expr: {}\n", serde_json::to_string(&promql).unwrap()));
    }
    promtool_check_rules("dashboard.rules.yaml", &rules);
    // The issue's panels: latency per role, load, KV transfer, handshake, router, operator.
    let all: String = queries.iter().map(|(_, e)| e.as_str()).collect::<Vec<_>>().join("\n");
    for m in [
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:inter_token_latency_seconds_bucket",
        "sglang:num_queue_reqs",
        "sglang:num_running_reqs",
        "sglang:token_usage",
        "sglang:kv_transfer_speed_gb_s",
        "sglang:kv_transfer_latency_ms_bucket",
        "sglang:num_transfer_failed_reqs_total",
        "sglang:num_bootstrap_failed_reqs_total",
        "kube_pod_init_container_info{namespace=~\"$namespace\", container=\"handshake\"}",
        "smg_http_responses_total",
        "smg_router_request_errors_total",
        "pd_operator_reconcile_errors_total",
        "apiserver_admission_webhook_admission_duration_seconds_bucket",
    ] {
        assert!(all.contains(m), "no panel reads {m}");
    }
}

// ---------------------------------------------------------------------------------------------
// Every metric name is real.

/// Rust files of the repository (not target/, not .git/).
fn rust_sources() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() && !name.starts_with('.') && name != "target" && name != "tests" {
                walk(&p, out);
            } else if name.ends_with(".rs") {
                out.push((p.clone(), std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(repo(), &mut out);
    out
}

/// `register("name", ...)` calls of the Rust file holding `marker`, and the names they expose
/// (prometheus-client appends `_total` to counters, `_bucket`/`_count`/`_sum` to histograms).
fn rust_registered(marker: &str, prefix: &str) -> BTreeSet<String> {
    let sources = rust_sources();
    let (path, src) = sources.iter().find(|(_, s)| s.contains(marker)).unwrap_or_else(|| panic!("no Rust file contains {marker}"));
    let mut names = BTreeSet::new();
    for part in src.split("register(\"").skip(1) {
        let name = &part[..part.find('"').unwrap()];
        names.insert(format!("{prefix}{name}"));
    }
    assert!(names.len() >= 5, "{}: only {names:?} registered", path.display());
    names
}

fn exposed(base: &BTreeSet<String>) -> BTreeSet<String> {
    base.iter().flat_map(|n| ["", "_total", "_bucket", "_count", "_sum"].map(|s| format!("{n}{s}"))).collect()
}

fn strip_series_suffix(name: &str) -> &str {
    for s in ["_bucket", "_count", "_sum"] {
        if let Some(b) = name.strip_suffix(s) {
            return b;
        }
    }
    name
}

/// `name="sglang:..."` in the pinned SGLang wheel's metrics collector.
fn sglang_wheel_names() -> BTreeSet<String> {
    let py = python("PD_SGLANG_PYTHON", "hack/sglang-venv.sh");
    let o = run(Command::new(&py).args(["-c", "import importlib.util as u; print(u.find_spec('sglang').submodule_search_locations[0])"]));
    assert!(o.status.success(), "{} cannot find the sglang package: {}", py.display(), text(&o));
    let pkg = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    let collector = pkg.join("srt/observability/metrics_collector.py");
    let src = std::fs::read_to_string(&collector).unwrap_or_else(|e| panic!("{}: {e}", collector.display()));
    let names: BTreeSet<String> = src.split("name=\"sglang:").skip(1).map(|p| format!("sglang:{}", &p[..p.find('"').unwrap()])).collect();
    assert!(names.len() > 30, "{}: only {} sglang metrics", collector.display(), names.len());
    names
}

/// The pinned smg's compiled gateway (its metric names are string constants in it).
fn smg_binary() -> Vec<u8> {
    let py = python("PD_SMG_PYTHON", "hack/smg-venv.sh");
    let o = run(Command::new(&py).args(["-c", "import importlib.util as u; print(u.find_spec('smg').submodule_search_locations[0])"]));
    assert!(o.status.success(), "{} cannot find the smg package: {}", py.display(), text(&o));
    let pkg = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    let so = std::fs::read_dir(&pkg)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("smg_rs") && n.to_string_lossy().ends_with(".so")))
        .unwrap_or_else(|| panic!("no smg_rs*.so in {}", pkg.display()));
    std::fs::read(&so).unwrap()
}

/// kube-apiserver's admission metrics, from k8s.io/apiserver in the Go module cache
/// (hack/tools.sh builds kube-apiserver 1.37.2 from it).
fn apiserver_admission_source() -> String {
    let cache = std::env::var_os("PD_TOOLS_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache"));
        base.join("pd-operator")
    });
    let tools = read("hack/tools.sh");
    let k8s = tools.split("K8S_VERSION=${K8S_VERSION:-").nth(1).and_then(|s| s.split('}').next()).expect("K8S_VERSION in hack/tools.sh");
    let staging = format!("v0.{}", k8s.split_once('.').unwrap().1);
    let p = cache.join(format!("go/mod/k8s.io/apiserver@{staging}/pkg/admission/metrics/metrics.go"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e} (hack/tools.sh fills the module cache)", p.display()))
}

/// kube-state-metrics v2 pod metrics (docs/metrics/workload/pod-metrics.md, all STABLE), with
/// the labels the rules and the dashboard use: checked by hand, since nothing here builds it.
const KUBE_STATE_METRICS: [&str; 5] = [
    "kube_pod_status_ready",                    // namespace, pod, uid, condition
    "kube_pod_container_status_ready",          // namespace, pod, uid, container
    "kube_pod_init_container_info",             // namespace, pod, uid, container, restart_policy, image...
    "kube_pod_owner",                           // namespace, pod, uid, owner_kind, owner_name, owner_is_controller
    "kube_pod_container_status_restarts_total", // namespace, pod, uid, container
];

#[test]
fn every_metric_the_rules_and_the_dashboard_read_is_exported() {
    let operator = exposed(&rust_registered("Registry::with_prefix(\"pd_operator\")", "pd_operator_"));
    let sim = exposed(&rust_registered("\"sglang:num_running_reqs\"", ""));
    let wheel = sglang_wheel_names();
    let smg = smg_binary();
    let apiserver = apiserver_admission_source();
    let rules = rules_file();
    let recorded: BTreeSet<String> = all_rules(&rules["groups"]).iter().filter_map(|r| r["record"].as_str().map(str::to_owned)).collect();

    let mut exprs: Vec<(String, String)> = all_rules(&rules["groups"])
        .iter()
        .map(|r| (format!("rule {}", r["alert"].as_str().or(r["record"].as_str()).unwrap()), r["expr"].as_str().unwrap().to_owned()))
        .collect();
    exprs.extend(dashboard_queries(&dashboard()).into_iter().map(|(t, e)| (format!("panel {t:?}"), as_promql(&e))));

    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for (whose, expr) in &exprs {
        for name in metric_names(expr) {
            seen.insert(name.clone());
            let base = strip_series_suffix(&name);
            let ok = if name.starts_with("pd:") {
                recorded.contains(&name)
            } else if name.starts_with("pd_operator_") {
                operator.contains(&name)
            } else if name.starts_with("sglang:") {
                // Real SGLang 0.5.23 has it, and so does the stand-in the demo and the kind tier run.
                let in_wheel = wheel.contains(base) || wheel.contains(&name);
                if !sim.contains(&name) {
                    problems.push(format!("{whose}: {name} is not exported by the sim stand-in"));
                }
                in_wheel
            } else if name.starts_with("smg_") {
                smg.windows(name.len()).any(|w| w == name.as_bytes()) || smg.windows(base.len()).any(|w| w == base.as_bytes())
            } else if let Some(short) = name.strip_prefix("apiserver_admission_") {
                apiserver.contains(&format!("\"{short}\"")) || apiserver.contains(&format!("\"{}\"", strip_series_suffix(short)))
            } else if name.starts_with("kube_") {
                KUBE_STATE_METRICS.contains(&name.as_str())
            } else {
                name == "up"
            };
            if !ok {
                problems.push(format!("{whose}: {name} is exported by none of its sources"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The extraction saw the families it should (an empty extraction would pass the loop above).
    for prefix in ["sglang:", "smg_", "pd_operator_", "apiserver_admission_", "kube_pod_", "pd:"] {
        assert!(seen.iter().any(|n| n.starts_with(prefix)), "no {prefix} metric seen in {seen:?}");
    }
    assert!(seen.len() >= 30, "only {} metric names seen: {seen:?}", seen.len());
}
