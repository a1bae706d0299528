//! Pure drawing of a `Snapshot`: what `kubectl pd status`, `rankmap` and `explain` print.

use std::collections::BTreeSet;
use std::fmt::Write;

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use pd_api::{DecodeRankMap, PDDeployment, Role};
use pd_core::plan::ObservedPod;
use pd_core::status::{DEGRADED, PROGRESSING, READY, VALIDATED};

use crate::fetch::Snapshot;
use pd_api::conditions::{HasStatus, Status};

/// Conditions that are bad when True; every other condition but `Progressing` is bad when False.
const TRUE_IS_BAD: [&str; 1] = [DEGRADED];
/// Longest message a table cell shows (`explain` shows them whole).
const CELL: usize = 100;
/// Warning events `explain` lists, newest last.
const RECENT_WARNINGS: usize = 8;

/// Aligned columns, two spaces apart, as kubectl prints tables.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> =
        (0..columns).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let last = row.len().saturating_sub(1);
        for (c, cell) in row.iter().enumerate() {
            let pad = if c == last { 0 } else { widths[c] + 2 - cell.chars().count() };
            out.push_str(cell);
            out.extend(std::iter::repeat_n(' ', pad));
        }
        out.push('\n');
    }
    out
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|s| (*s).to_owned()).collect()
}

fn cut(s: &str, max: usize) -> String {
    let one_line = s.replace('\n', " ");
    if one_line.chars().count() <= max { one_line } else { format!("{}...", one_line.chars().take(max - 3).collect::<String>()) }
}

/// kubectl's short ages: 42s, 7m, 3h, 5d.
pub fn age(now: jiff::Timestamp, then: jiff::Timestamp) -> String {
    let s = now.duration_since(then).as_secs().max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// When an event happened: its event time, else its series' last time, else its creation.
pub fn event_time(e: &Event) -> jiff::Timestamp {
    let micro = e.event_time.as_ref().map(|t| t.0);
    let series = e.series.as_ref().map(|s| s.last_observed_time.0);
    let old = e.deprecated_last_timestamp.as_ref().map(|t| t.0);
    series.or(micro).or(old).or(e.metadata.creation_timestamp.as_ref().map(|t| t.0)).unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

fn id(pdd: &PDDeployment) -> String {
    format!("{}/{}", pdd.metadata.namespace.as_deref().unwrap_or_default(), pdd.metadata.name.as_deref().unwrap_or_default())
}

fn conditions(pdd: &PDDeployment) -> &[Condition] {
    pdd.status.as_ref().map_or(&[], |s| s.conditions.as_slice())
}

fn is_bad(c: &Condition) -> bool {
    match c.type_.as_str() {
        PROGRESSING => false,
        t if TRUE_IS_BAD.contains(&t) => c.is_true(),
        _ => !c.is_true(),
    }
}

fn observed(s: &Snapshot) -> Vec<ObservedPod> {
    let mut pods: Vec<ObservedPod> = s.pods.iter().filter_map(ObservedPod::from_pod).collect();
    pods.sort_by(|a, b| (a.role.as_str(), a.set, a.instance, a.node).cmp(&(b.role.as_str(), b.set, b.instance, b.node)));
    pods
}

fn handshake_cell(p: &ObservedPod) -> String {
    match (&p.handshake, p.role) {
        (Some(g), _) if g.passed => "passed".into(),
        (Some(g), _) => format!("failed: {}", g.reason),
        (None, Role::Decode) => "pending".into(),
        (None, Role::Prefill) => "-".into(),
    }
}

fn pod_state(p: &ObservedPod) -> String {
    if p.deleting {
        "Terminating".into()
    } else if p.draining_since.is_some() {
        format!("{} (draining)", p.phase)
    } else if p.unschedulable.is_some() {
        "Pending (Unschedulable)".into()
    } else {
        p.phase.to_string()
    }
}

/// `kubectl pd status NAME`.
pub fn status(s: &Snapshot) -> String {
    let pdd = &s.pdd;
    let st = pdd.status.clone().unwrap_or_default();
    let mut out = String::new();
    let generation = pdd.metadata.generation.unwrap_or(0);
    let observed_gen = st.observed_generation.map_or("never".into(), |g| g.to_string());
    let _ = writeln!(out, "PDDeployment {}  generation {generation} (observed {observed_gen})", id(pdd));
    let engine =
        pdd.spec.engine.image.clone().unwrap_or_else(|| format!("{:?} (default image)", pdd.spec.engine.engine_type).to_lowercase());
    let _ = writeln!(out, "model {}  engine {engine}  units {}", pdd.spec.model.path, pdd.spec.replicas);
    let page = st.page_size.map_or("-".into(), |p| p.to_string());
    let sets = st.kv_set.as_ref().map_or("-".into(), |k| format!("target {}, routed {} ({})", k.target, k.routed, k.strategy));
    let _ = writeln!(out, "page size {page}  KV sets {sets}");
    if let Some(router) = st.endpoints.as_ref().and_then(|e| e.router.as_ref()) {
        let _ = writeln!(out, "router {router}");
    }
    out.push('\n');
    let mut roles = vec![row(["ROLE", "READY", "UPDATED", "DESIRED", "CURRENT REVISION", "UPDATE REVISION"])];
    for (name, r) in [("prefill", &st.prefill), ("decode", &st.decode)] {
        let current = if r.current_revision.is_empty() { "-" } else { &r.current_revision };
        let update = if r.update_revision.is_empty() { "-" } else { &r.update_revision };
        let (ready, updated, desired) =
            (format!("{}/{}", r.ready_replicas, r.replicas), r.updated_replicas.to_string(), r.replicas.to_string());
        roles.push(row([name, &ready, &updated, &desired, current, update]));
    }
    out.push_str(&table(&roles));
    out.push('\n');
    out.push_str(&conditions_table(s));
    out.push('\n');
    out.push_str(&pods_table(s));
    out
}

fn conditions_table(s: &Snapshot) -> String {
    let cs = conditions(&s.pdd);
    if cs.is_empty() {
        return "no conditions yet: the operator has not reconciled it (is it running?)\n".into();
    }
    let mut rows = vec![row(["CONDITION", "STATUS", "REASON", "AGE", "MESSAGE"])];
    for c in cs {
        let since = age(s.now, c.last_transition_time.0);
        rows.push(row([&c.type_, &c.status, &c.reason, &since, &cut(&c.message, CELL)]));
    }
    table(&rows)
}

fn pods_table(s: &Snapshot) -> String {
    let pods = observed(s);
    if pods.is_empty() {
        return "no engine pods\n".into();
    }
    let mut rows = vec![row(["POD", "ROLE", "INSTANCE", "NODE", "KV SET", "REVISION", "PHASE", "READY", "HANDSHAKE"])];
    for p in &pods {
        let (instance, node, set) = (p.instance.to_string(), p.node.to_string(), p.set.to_string());
        let ready = Status::from(p.ready).as_str();
        rows.push(row([&p.name, p.role.as_str(), &instance, &node, &set, &p.revision, &pod_state(p), ready, &handshake_cell(p)]));
    }
    table(&rows)
}

fn ranks(v: &[u32]) -> String {
    if v.is_empty() { "-".into() } else { v.iter().map(u32::to_string).collect::<Vec<_>>().join(",") }
}

/// `kubectl pd rankmap NAME`.
pub fn rankmap(s: &Snapshot) -> String {
    let pdd = &s.pdd;
    let (p, d) = (&pdd.spec.prefill.parallelism, &pdd.spec.decode.parallelism);
    let mut out = format!(
        "Rank map of {}: decode (attention TP {}, PP {}, DCP {}) reads from prefill (attention TP {}, PP {}, CP {})\n",
        id(pdd),
        d.attn_tp(),
        d.pp,
        d.dcp,
        p.attn_tp(),
        p.pp,
        p.attn_cp
    );
    let maps = pdd.status.as_ref().map_or(&[][..], |s| s.rank_map.as_slice());
    if maps.is_empty() {
        out.push_str("no rank map yet: no decode pod has passed the handshake (kubectl pd explain says why)\n");
        return out;
    }
    out.push_str("The ranks are the same for every prefill instance the router pairs a decode with.\n");
    for map in maps {
        out.push_str(&draw_instance(map, p.attn_tp()));
    }
    out
}

fn draw_instance(map: &DecodeRankMap, prefill_tp: u32) -> String {
    let mut out = format!("\ndecode instance {}\n", map.decode_instance);
    let mut rows = vec![row([
        "DECODE RANK",
        "PP",
        "PREFILL TP RANKS",
        "CP RANKS",
        "PP RANKS",
        "REQUIRED_DST_INFO_NUM",
        "REQUIRED_PREFILL_RESPONSE_NUM",
    ])];
    for r in &map.ranks {
        let (rank, pp) = (r.engine_rank.to_string(), r.pp_rank.to_string());
        let (dst, resp) = (r.required_dst_info_num.to_string(), r.required_prefill_response_num.to_string());
        rows.push(row([&rank, &pp, &ranks(&r.tp_ranks), &ranks(&r.cp_ranks), &ranks(&r.pp_ranks), &dst, &resp]));
    }
    out.push_str(&indent(&table(&rows)));
    // The matrix: a row per decode rank, a column per prefill TP rank, `#` where it reads.
    let columns: BTreeSet<u32> = (0..prefill_tp).chain(map.ranks.iter().flat_map(|r| r.tp_ranks.iter().copied())).collect();
    let mut m = vec![std::iter::once("decode \\ prefill tp".to_owned()).chain(columns.iter().map(u32::to_string)).collect()];
    for r in &map.ranks {
        let label = format!("rank {} pp {}", r.engine_rank, r.pp_rank);
        m.push(std::iter::once(label).chain(columns.iter().map(|c| if r.tp_ranks.contains(c) { "#" } else { "." }.to_owned())).collect());
    }
    out.push('\n');
    out.push_str(&indent(&table(&m)));
    out
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// `kubectl pd explain NAME`.
pub fn explain(s: &Snapshot) -> String {
    let pdd = &s.pdd;
    let bad: Vec<&Condition> = conditions(pdd).iter().filter(|c| is_bad(c)).collect();
    let mut out = String::new();
    if conditions(pdd).is_empty() {
        let _ = writeln!(
            out,
            "{} has no status: the operator has not reconciled it yet (is the operator running and watching {}?)",
            id(pdd),
            pdd.metadata.namespace.as_deref().unwrap_or_default()
        );
        return out;
    }
    if bad.is_empty() {
        let _ = writeln!(out, "{} is Ready: every condition holds.", id(pdd));
        return out;
    }
    let ready = conditions(pdd).iter().any(|c| c.type_ == READY && c.is_true());
    let _ = writeln!(out, "{} is {}.\n\nWhy:", id(pdd), if ready { "Ready, with problems" } else { "not Ready" });
    for c in &bad {
        let _ = writeln!(out, "  {}={} ({}): {}", c.type_, c.status, c.reason, c.message);
    }
    out.push_str(&refusal(s, &bad));
    out.push_str(&unserving_pods(s));
    out.push_str(&warnings(s));
    out
}

/// With `Validated=False`, the spec judged again here: each finding with its field and fix.
fn refusal(s: &Snapshot, bad: &[&Condition]) -> String {
    if !bad.iter().any(|c| c.type_ == VALIDATED) {
        return String::new();
    }
    let pdd = &s.pdd;
    let name = pdd.metadata.name.as_deref().unwrap_or_default();
    let key = pd_core::model_read::config_ref(name, &pdd.spec.model).map(|r| r.key).unwrap_or_default();
    let config = s.model_config.as_ref().and_then(|cm| pd_core::model::HfConfig::from_config_map(cm, &key).ok());
    let facts = pd_core::model::resolve(&pdd.spec.model, config.as_ref());
    let findings = pd_core::validate::validate_with_facts(pdd.metadata.name.as_deref().unwrap_or_default(), &pdd.spec, &facts);
    let mut out = String::from("\nThe spec, judged again here:\n");
    for f in findings.iter().filter(|f| f.severity == pd_core::findings::Severity::Error) {
        let _ = writeln!(out, "  {}: {}\n    fix: {}", f.field, f.message, f.fix);
    }
    out
}

fn unserving_pods(s: &Snapshot) -> String {
    let mut out = String::new();
    for p in observed(s).iter().filter(|p| !p.serving()) {
        let why = if let Some(g) = p.handshake.as_ref().filter(|g| !g.passed) {
            format!("handshake failed ({}): {}", g.reason, g.message)
        } else if let Some(u) = &p.unschedulable {
            format!("unschedulable: {u}")
        } else if p.draining_since.is_some() || p.deleting {
            "leaving: draining or terminating".into()
        } else if p.role == Role::Decode && p.handshake.is_none() {
            format!("{}, waiting for the handshake sidecar", p.phase)
        } else {
            format!("{}, not Ready", p.phase)
        };
        let _ = writeln!(out, "  {}  {why}", p.name);
    }
    if out.is_empty() { out } else { format!("\nPods out of service:\n{out}") }
}

fn warnings(s: &Snapshot) -> String {
    let warnings: Vec<&Event> = s.events.iter().filter(|e| e.type_.as_deref() == Some("Warning")).collect();
    let mut out = String::new();
    for e in warnings.iter().skip(warnings.len().saturating_sub(RECENT_WARNINGS)) {
        let about = e.regarding.as_ref().and_then(|r| r.name.clone()).unwrap_or_default();
        let count = e.series.as_ref().map_or(String::new(), |s| format!(" (x{})", s.count));
        let _ = writeln!(
            out,
            "  {} ago  {}  {about}{count}: {}",
            age(s.now, event_time(e)),
            e.reason.as_deref().unwrap_or_default(),
            e.note.as_deref().unwrap_or_default()
        );
    }
    if out.is_empty() { out } else { format!("\nRecent warnings:\n{out}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(status: serde_json::Value, pods: Vec<serde_json::Value>) -> Snapshot {
        let pdd = serde_json::json!({
            "apiVersion": "pd.inference.dev/v1alpha1", "kind": "PDDeployment",
            "metadata": {"name": "dsv3", "namespace": "ml", "generation": 2},
            "spec": {"model": {"path": "deepseek-ai/DeepSeek-V3"}, "prefill": {"parallelism": {"tp": 4}}, "decode": {"parallelism": {"tp": 2}}},
            "status": status,
        });
        Snapshot {
            pdd: serde_json::from_value(pdd).unwrap(),
            pods: pods.into_iter().map(|p| serde_json::from_value(p).unwrap()).collect(),
            events: vec![],
            model_config: None,
            now: "2026-12-03T06:00:00Z".parse().unwrap(),
        }
    }

    fn pod(role: &str, ready: bool, gate: Option<(&str, &str, &str)>) -> serde_json::Value {
        let mut conditions = vec![serde_json::json!({"type": "Ready", "status": if ready { "True" } else { "False" }})];
        if let Some((status, reason, message)) = gate {
            conditions
                .push(serde_json::json!({"type": "pd.inference.dev/handshake", "status": status, "reason": reason, "message": message}));
        }
        serde_json::json!({
            "metadata": {"name": format!("dsv3-{role}-0-0"), "labels": {
                "pd.inference.dev/role": role, "pd.inference.dev/instance": "0", "pd.inference.dev/node-rank": "0", "pd.inference.dev/revision": "abc"}},
            "status": {"phase": "Running", "conditions": conditions},
        })
    }

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
        serde_json::json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": "2026-12-03T05:57:00Z"})
    }

    #[test]
    fn tables_align_their_columns_and_ages_read_like_kubectl() {
        assert_eq!(table(&[row(["A", "BB"]), row(["CCC", "D"])]), "A    BB\nCCC  D\n");
        let now: jiff::Timestamp = "2026-12-03T06:00:00Z".parse().unwrap();
        let ages: Vec<String> = [59, 60, 3599, 3600, 86400].iter().map(|s| age(now, now - jiff::SignedDuration::from_secs(*s))).collect();
        assert_eq!(ages, ["59s", "1m", "59m", "1h", "1d"]);
    }

    #[test]
    fn the_rank_map_is_drawn_as_a_table_and_a_matrix() {
        let status = serde_json::json!({"rankMap": [{"decodeInstance": 0, "ranks": [
            {"engineRank": 0, "ppRank": 0, "tpRanks": [0, 1], "cpRanks": [0], "ppRanks": [0], "requiredDstInfoNum": 1, "requiredPrefillResponseNum": 1},
            {"engineRank": 1, "ppRank": 0, "tpRanks": [2, 3], "cpRanks": [0], "ppRanks": [0], "requiredDstInfoNum": 1, "requiredPrefillResponseNum": 1}]}]});
        let out = rankmap(&snapshot(status, vec![]));
        assert!(
            out.starts_with("Rank map of ml/dsv3: decode (attention TP 2, PP 1, DCP 1) reads from prefill (attention TP 4, PP 1, CP 1)\n"),
            "{out}"
        );
        assert!(
            out.contains("\n  decode \\ prefill tp  0  1  2  3\n  rank 0 pp 0          #  #  .  .\n  rank 1 pp 0          .  .  #  #\n"),
            "{out}"
        );
        assert!(out.contains("\n  1            0   2,3               0         0 "), "{out}");
        assert!(rankmap(&snapshot(serde_json::json!({}), vec![])).contains("no rank map yet"));
    }

    #[test]
    fn explain_gives_the_failing_condition_and_the_pod_with_sglangs_text() {
        let text = "prefill 10.0.0.7:8998: RuntimeError: page size mismatch";
        let status = serde_json::json!({"conditions": [
            condition("Ready", "False", "DecodeUnavailable", "no decode instance serves"),
            condition("Progressing", "True", "Rolling", "rolling"),
            condition("Degraded", "False", "AsExpected", ""),
            condition("HandshakeReady", "False", "PageSizeMismatch", text)]});
        let pods = vec![pod("prefill", true, None), pod("decode", false, Some(("False", "PageSizeMismatch", text)))];
        let out = explain(&snapshot(status, pods));
        assert!(out.starts_with("ml/dsv3 is not Ready.\n\nWhy:\n  Ready=False (DecodeUnavailable): no decode instance serves\n"), "{out}");
        assert!(out.contains(&format!("  HandshakeReady=False (PageSizeMismatch): {text}\n")), "{out}");
        assert!(!out.contains("Progressing") && !out.contains("Degraded"), "healthy conditions are left out: {out}");
        assert!(out.contains(&format!("Pods out of service:\n  dsv3-decode-0-0  handshake failed (PageSizeMismatch): {text}\n")), "{out}");
        assert!(!out.contains("dsv3-prefill-0-0"), "{out}");
    }

    #[test]
    fn explain_judges_a_refused_spec_again_with_the_field_and_the_fix() {
        let status = serde_json::json!({"conditions": [condition("Validated", "False", "Invalid", "spec.decode.parallelism.dcp: ...")]});
        let mut s = snapshot(status, vec![]);
        s.pdd.spec.model.path = "Qwen/Qwen2.5-72B-Instruct".into();
        s.pdd.spec.decode.parallelism.dcp = 2;
        let out = explain(&s);
        assert!(
            out.contains(
                "The spec, judged again here:\n  spec.decode.parallelism.dcp: PD decode DCP requires an MLA or hybrid-MLA KV pool."
            ),
            "{out}"
        );
        assert!(out.contains("    fix: "), "{out}");
    }

    #[test]
    fn status_lists_roles_conditions_and_pods_with_their_handshake() {
        let status = serde_json::json!({"observedGeneration": 2, "pageSize": 64,
            "prefill": {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "ready": "1/1", "currentRevision": "abc", "updateRevision": "abc"},
            "decode": {"replicas": 1, "readyReplicas": 0, "updatedReplicas": 1, "ready": "0/1", "currentRevision": "abc", "updateRevision": "abc"},
            "conditions": [condition("Ready", "False", "DecodeUnavailable", "no decode instance serves")]});
        let pods = vec![pod("decode", false, None), pod("prefill", true, None)];
        let out = super::status(&snapshot(status, pods));
        assert!(out.starts_with("PDDeployment ml/dsv3  generation 2 (observed 2)\n"), "{out}");
        assert!(out.contains("decode   0/1    1        1        abc               abc\n"), "{out}");
        assert!(out.contains("Ready      False   DecodeUnavailable  3m   no decode instance serves\n"), "{out}");
        let pod_lines: Vec<&str> = out.lines().filter(|l| l.starts_with("dsv3-")).collect();
        assert_eq!(pod_lines.len(), 2, "{out}");
        assert!(pod_lines[0].starts_with("dsv3-decode-0-0") && pod_lines[0].ends_with("False  pending"), "{out}");
        assert!(pod_lines[1].starts_with("dsv3-prefill-0-0") && pod_lines[1].ends_with("True   -"), "{out}");
    }
}
