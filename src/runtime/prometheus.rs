//! Instant queries against a Prometheus server's HTTP API (`GET /api/v1/query`), over the plain
//! HTTP client of `http_client`. The queries and the reading of answers are `pd_core::planner::promql`'s.

use std::time::Duration;

use pd_core::planner::promql::{self, PromqlError};
use thiserror::Error;

use crate::http_client::{self, HttpError};

/// The most of an answer read: one aggregated series is a few hundred bytes.
const MAX_ANSWER: usize = 1 << 20;

#[derive(Debug, Error)]
pub enum PrometheusError {
    #[error("spec.autoscaling.prometheus.url {url:?} is not a plain http://host[:port][/path] URL: {why}")]
    Url { url: String, why: &'static str },
    #[error("Prometheus at {url}: {source}")]
    Http { url: String, source: HttpError },
    #[error("Prometheus at {url} answered HTTP {status}: {body}")]
    Status { url: String, status: u16, body: String },
    #[error("Prometheus at {url}: {source}")]
    Answer { url: String, source: PromqlError },
}

/// A Prometheus server, by its base URL.
#[derive(Clone, Debug)]
pub struct Prometheus {
    url: String,
    addr: String,
    prefix: String,
}

impl Prometheus {
    /// `http://host[:port][/prefix]` (port 80 by default).
    pub fn new(url: &str) -> Result<Self, PrometheusError> {
        let bad = |why| PrometheusError::Url { url: url.to_owned(), why };
        let rest = url.strip_prefix("http://").ok_or_else(|| bad("only http:// is supported"))?;
        let (authority, prefix) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        if authority.is_empty() || authority.contains('@') {
            return Err(bad("no host, or credentials in the URL"));
        }
        let has_port = authority.rsplit_once(':').is_some_and(|(_, p)| p.chars().all(|c| c.is_ascii_digit()) && !authority.ends_with(']'));
        let addr = if has_port { authority.to_owned() } else { format!("{authority}:80") };
        let prefix = prefix.trim_end_matches('/');
        let prefix = if prefix.is_empty() { String::new() } else { format!("/{prefix}") };
        Ok(Self { url: url.to_owned(), addr, prefix })
    }

    /// The one value `promql` answers with (`None`: no series, or not a number).
    pub async fn value(&self, promql: &str, timeout: Duration) -> Result<Option<f64>, PrometheusError> {
        let query: String = form_urlencoded::Serializer::new(String::new()).append_pair("query", promql).finish();
        let path = format!("{}/api/v1/query?{query}", self.prefix);
        let http = |source| PrometheusError::Http { url: self.url.clone(), source };
        let response = http_client::send(hyper::Method::GET, &self.addr, &path, None, timeout, MAX_ANSWER).await.map_err(http)?;
        let answer: serde_json::Value = match serde_json::from_slice(&response.body) {
            Ok(v) => v,
            Err(_) => return Err(PrometheusError::Status { url: self.url.clone(), status: response.status, body: response.text() }),
        };
        promql::value(&answer).map_err(|source| PrometheusError::Answer { url: self.url.clone(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_an_address_and_a_path_prefix_or_say_what_is_wrong() {
        let p = Prometheus::new("http://prometheus.monitoring:9090").unwrap();
        assert_eq!((p.addr.as_str(), p.prefix.as_str()), ("prometheus.monitoring:9090", ""));
        let p = Prometheus::new("http://prom/sub/").unwrap();
        assert_eq!((p.addr.as_str(), p.prefix.as_str()), ("prom:80", "/sub"));
        let e = Prometheus::new("https://prom:9090").unwrap_err().to_string();
        assert!(e.contains("only http://"), "{e}");
    }
}
