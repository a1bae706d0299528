//! Instant queries against a Prometheus server's HTTP API (`GET /api/v1/query`), over the plain
//! HTTP client of `http_client`. The queries and the reading of answers are `pd_core::planner::promql`'s.
//! What it tells of an answer that is not a query result is `pd_core::remote`'s excerpt, never
//! the answer: the URL is the tenant's, the page it names may not be. A redirect is not followed:
//! the policy allowed this URL's host, not the one it points to.

use std::time::Duration;

use pd_core::planner::promql::{self, PromqlError};
use pd_core::remote;
use thiserror::Error;

use crate::http_client::{self, HttpError};

/// The most of an answer read: one aggregated series is a few hundred bytes.
pub const MAX_ANSWER: usize = 1 << 20;

#[derive(Debug, Error)]
pub enum PrometheusError {
    #[error("spec.autoscaling.prometheus.url {url:?} is not a plain http://host[:port][/path] URL: {why}")]
    Url { url: String, why: &'static str },
    #[error("Prometheus at {url}: {source}")]
    Http { url: String, source: HttpError },
    /// Not a query result; `answer` is `remote::answer`'s status and excerpt.
    #[error("Prometheus at {url} answered {answer}, not a query result")]
    Status { url: String, answer: String },
    #[error(
        "Prometheus at {url} answered HTTP {status}, a redirect, which the operator does not follow (fix: set spec.autoscaling.prometheus.url to the address that answers the query)"
    )]
    Redirect { url: String, status: u16 },
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
        if (300..400).contains(&response.status) {
            return Err(PrometheusError::Redirect { url: self.url.clone(), status: response.status });
        }
        let answer: serde_json::Value = match serde_json::from_slice(&response.body) {
            Ok(v) => v,
            Err(_) => {
                return Err(PrometheusError::Status { url: self.url.clone(), answer: remote::answer(response.status, &response.body) });
            }
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

    fn response(status: &str, headers: &str, body: &[u8]) -> Vec<u8> {
        let mut r = format!("HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n", body.len()).into_bytes();
        r.extend_from_slice(body);
        r
    }

    async fn ask(answer: Vec<u8>) -> String {
        let addr = http_client::serve_raw(answer).await;
        let prometheus = Prometheus::new(&format!("http://{addr}")).unwrap();
        prometheus.value("up", Duration::from_secs(5)).await.unwrap_err().to_string()
    }

    #[tokio::test]
    async fn an_internal_page_in_place_of_prometheus_is_named_not_copied() {
        let page = b"<!DOCTYPE html><html><head><title>Admin</title></head><body>AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG</body></html>";
        let e = ask(response("200 OK", "Content-Type: text/html\r\n", page)).await;
        assert!(e.ends_with("answered HTTP 200: an HTML page, not a query result"), "{e}");
        assert!(!e.contains("SECRET") && !e.contains("Admin"), "{e}");
        let text = format!("root:x:0:0:root:/root:/bin/bash\n{}", "daemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n".repeat(50));
        let e = ask(response("200 OK", "", text.as_bytes())).await;
        assert!(e.len() < 200 && e.contains("HTTP 200: root:x:0:0:root:/root:/bin/bash daemon"), "{e}");
    }

    #[tokio::test]
    async fn a_redirect_is_not_followed_and_an_oversized_answer_is_cut() {
        let e = ask(response("302 Found", "Location: http://169.254.169.254/latest/meta-data/\r\n", b"")).await;
        assert!(e.contains("answered HTTP 302, a redirect, which the operator does not follow"), "{e}");
        assert!(!e.contains("169.254"), "{e}");
        let e = ask(response("200 OK", "", &vec![b'{'; MAX_ANSWER + 1])).await;
        assert!(e.contains(&format!("exceeds {MAX_ANSWER} bytes")), "{e}");
    }
}
