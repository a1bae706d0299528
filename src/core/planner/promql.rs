//! What the planner asks Prometheus, and how it reads the answers: SGLang's metric names, under
//! the labels the chart's PodMonitor puts on each engine's series (`namespace`, `pdd`, `role`).
//! Pure: the controller sends the queries to `/api/v1/query`.

use pd_api::{Observed, Role};
use thiserror::Error;

use crate::remote;

/// SGLang's metrics the planner reads (one place for the names).
pub const TTFT: &str = "sglang:time_to_first_token_seconds";
pub const ITL: &str = "sglang:inter_token_latency_seconds";
pub const QUEUED: &str = "sglang:num_queue_reqs";
pub const RUNNING: &str = "sglang:num_running_reqs";
pub const TOKEN_USAGE: &str = "sglang:token_usage";
/// The labels the chart's PodMonitor (charts/pd-operator/templates/_helpers.tpl) puts on them.
pub const LABEL_DEPLOYMENT: &str = "pdd";
pub const LABEL_ROLE: &str = "role";
pub const LABEL_NAMESPACE: &str = "namespace";
/// The latency quantile of the objectives.
pub const QUANTILE: f64 = 0.9;
/// The most series an answer may hold: each query aggregates to one, so more is not Prometheus
/// answering this query (and reading them is work a tenant's URL should not buy).
pub const MAX_SERIES: usize = 16;

/// Each text of an answer is `remote::excerpt`'s: the answer is the server's, not ours.
#[derive(Debug, Error, PartialEq)]
pub enum PromqlError {
    #[error("Prometheus answered status {status:?}: {error}")]
    Refused { status: String, error: String },
    #[error("Prometheus' answer is not a query result: {0}")]
    Malformed(String),
}

/// One figure of `Observed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Figure {
    TtftP90,
    ItlP90,
    Queued,
    Running,
    KvUsage,
}

impl Figure {
    pub const ALL: [Figure; 5] = [Figure::TtftP90, Figure::ItlP90, Figure::Queued, Figure::Running, Figure::KvUsage];

    /// Sets this figure of `observed`.
    pub fn set(self, observed: &mut Observed, value: Option<f64>) {
        let slot = match self {
            Figure::TtftP90 => &mut observed.ttft_p90_seconds,
            Figure::ItlP90 => &mut observed.itl_p90_seconds,
            Figure::Queued => &mut observed.queued_requests,
            Figure::Running => &mut observed.running_requests,
            Figure::KvUsage => &mut observed.kv_usage,
        };
        *slot = value;
    }
}

/// The PromQL of `figure` for `role` of PDDeployment `ns/name`, rates over `window_seconds`.
/// Latencies are read on decode for both roles: the decode engine streams the tokens the client
/// sees, so its TTFT is the client's (prefill's own TTFT stops at its one token).
pub fn query(figure: Figure, role: Role, ns: &str, name: &str, window_seconds: u32) -> String {
    let select = |r: &str| format!("{LABEL_NAMESPACE}=\"{ns}\",{LABEL_DEPLOYMENT}=\"{name}\",{LABEL_ROLE}=\"{r}\"");
    let quantile = |metric: &str| {
        format!("histogram_quantile({QUANTILE}, sum by (le) (rate({metric}_bucket{{{}}}[{window_seconds}s])))", select("decode"))
    };
    match figure {
        Figure::TtftP90 => quantile(TTFT),
        Figure::ItlP90 => quantile(ITL),
        Figure::Queued => format!("sum({QUEUED}{{{}}})", select(role.as_str())),
        Figure::Running => format!("sum({RUNNING}{{{}}})", select(role.as_str())),
        Figure::KvUsage => format!("avg({TOKEN_USAGE}{{{}}})", select(role.as_str())),
    }
}

/// The figures each role's decision reads (the rest are reported only where cheap: none).
pub fn figures(role: Role) -> &'static [Figure] {
    match role {
        Role::Prefill => &[Figure::TtftP90, Figure::Queued, Figure::Running],
        Role::Decode => &[Figure::ItlP90, Figure::Queued, Figure::Running, Figure::KvUsage],
    }
}

/// The one value of an instant-vector answer of `/api/v1/query`: `None` when no series answered
/// or the value is not a number (a quantile over no requests is `NaN`).
pub fn value(answer: &serde_json::Value) -> Result<Option<f64>, PromqlError> {
    let status = answer.get("status").and_then(serde_json::Value::as_str).unwrap_or_default();
    if status != "success" {
        let error = answer.get("error").and_then(serde_json::Value::as_str).unwrap_or("no error text");
        return Err(PromqlError::Refused { status: remote::excerpt(status), error: remote::excerpt(error) });
    }
    let result = answer
        .pointer("/data/result")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| PromqlError::Malformed("no data.result array".into()))?;
    if result.len() > MAX_SERIES {
        return Err(PromqlError::Malformed(format!("{} series, more than the {MAX_SERIES} an aggregated query answers", result.len())));
    }
    let Some(first) = result.first() else { return Ok(None) };
    let text = first
        .pointer("/value/1")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| PromqlError::Malformed(format!("series {}", remote::excerpt(&first.to_string()))))?;
    let number: f64 = text.parse().map_err(|_| PromqlError::Malformed(format!("value {:?}", remote::excerpt(text))))?;
    Ok(Some(number).filter(|v| v.is_finite()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn queries_name_sglangs_metrics_under_the_podmonitors_labels() {
        let q = query(Figure::TtftP90, Role::Prefill, "ns", "x", 60);
        assert_eq!(
            q,
            "histogram_quantile(0.9, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket{namespace=\"ns\",pdd=\"x\",role=\"decode\"}[60s])))"
        );
        assert_eq!(
            query(Figure::KvUsage, Role::Decode, "ns", "x", 60),
            "avg(sglang:token_usage{namespace=\"ns\",pdd=\"x\",role=\"decode\"})"
        );
        assert_eq!(
            query(Figure::Queued, Role::Prefill, "ns", "x", 60),
            "sum(sglang:num_queue_reqs{namespace=\"ns\",pdd=\"x\",role=\"prefill\"})"
        );
    }

    #[test]
    fn answers_read_as_a_value_none_or_an_error_with_prometheus_text() {
        let ok = json!({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1.0, "0.25"]}]}});
        assert_eq!(value(&ok), Ok(Some(0.25)));
        let nan = json!({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1.0, "NaN"]}]}});
        assert_eq!(value(&nan), Ok(None));
        let empty = json!({"status": "success", "data": {"resultType": "vector", "result": []}});
        assert_eq!(value(&empty), Ok(None));
        let bad = json!({"status": "error", "errorType": "bad_data", "error": "parse error"});
        assert_eq!(value(&bad).unwrap_err().to_string(), "Prometheus answered status \"error\": parse error");
        assert!(value(&json!({"status": "success"})).is_err());
    }

    #[test]
    fn an_answer_that_is_not_prometheus_shows_no_more_than_an_excerpt() {
        let secret = format!("<html><body>db password: hunter2 {}</body></html>", "x".repeat(500));
        let e = value(&json!({"status": "error", "error": secret})).unwrap_err().to_string();
        assert_eq!(e, "Prometheus answered status \"error\": an HTML page");
        let long = json!({"status": "nope", "error": "k=".repeat(300)});
        assert!(value(&long).unwrap_err().to_string().len() < 200);
        let series: Vec<_> = (0..=MAX_SERIES).map(|i| json!({"metric": {"i": i}, "value": [1.0, "1"]})).collect();
        let many = json!({"status": "success", "data": {"result": series}});
        assert!(value(&many).unwrap_err().to_string().contains(&format!("more than the {MAX_SERIES}")));
    }
}
