//! The GET of a Hugging Face source's `config.json`, the one place the admission webhook and
//! the controller read it from: pd-core's `hub` builds the URL and reads the answer.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{AUTHORIZATION, LOCATION, USER_AGENT};
use hyper::{Request, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tracing::debug;

use pd_core::egress;
use pd_core::hub::{self, HubError, HubRequest};
use pd_core::model::HfConfig;

type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// A client for `https` (the system's CA certificates) and plain `http` (a mirror in the cluster).
pub(crate) fn client(url: &str) -> Result<Client<Https, Empty<Bytes>>, HubError> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = match hyper_rustls::HttpsConnectorBuilder::new().with_provider_and_native_roots(provider.clone()) {
        Ok(builder) => builder,
        // No CA certificates here: `https` fails on the certificate, `http` still works.
        Err(e) => {
            debug!(error = %e, "no system CA certificates for the Hub's TLS");
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| HubError::Unreachable { url: url.to_owned(), message: format!("TLS set-up: {e}") })?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
        }
    };
    Ok(Client::builder(TokioExecutor::new()).build(tls.https_or_http().enable_http1().build()))
}

/// Reads `req`'s config.json within `timeout`, sending `token` as `Authorization: Bearer`. A
/// redirect is followed on the endpoint's origin only (the Hub's renamed repositories): the
/// platform allowed that origin (`pd_core::egress`), not whatever it points to.
pub async fn fetch_config(req: &HubRequest, token: Option<&str>, timeout: Duration) -> Result<(String, HfConfig), HubError> {
    match tokio::time::timeout(timeout, get(req, token)).await {
        Ok(answer) => answer,
        Err(_) => Err(HubError::Unreachable { url: req.url.clone(), message: format!("no answer within {timeout:?}") }),
    }
}

async fn get(req: &HubRequest, token: Option<&str>) -> Result<(String, HfConfig), HubError> {
    let unreachable = |e: &dyn std::fmt::Display| HubError::Unreachable { url: req.url.clone(), message: e.to_string() };
    let mut uri: Uri = req.url.parse().map_err(|e| unreachable(&e))?;
    let origin = uri.authority().cloned();
    let client = client(&req.url)?;
    for _ in 0..=hub::MAX_REDIRECTS {
        let mut builder = Request::get(uri.clone()).header(USER_AGENT, concat!("pd-operator/", env!("CARGO_PKG_VERSION")));
        if let Some(t) = token.filter(|_| uri.authority() == origin.as_ref()) {
            builder = builder.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        let request = builder.body(Empty::new()).map_err(|e| unreachable(&e))?;
        let response = client
            .request(request)
            .await
            .map_err(|e| unreachable(&std::error::Error::source(&e).map_or(e.to_string(), |s| format!("{e}: {s}"))))?;
        let status = response.status();
        if status.is_redirection()
            && let Some(next) = response.headers().get(LOCATION).and_then(|l| l.to_str().ok()).and_then(|l| follow(&uri, l))
        {
            if !egress::same_origin(&req.url, &next.to_string()) {
                return Err(unreachable(&cross_origin(status.as_u16(), &next)));
            }
            debug!(from = %uri, to = %next, "the Hub redirects");
            uri = next;
            continue;
        }
        let body = Limited::new(response.into_body(), hub::MAX_BYTES).collect().await.map_err(|e| unreachable(&e))?.to_bytes();
        return hub::read_answer(req, status.as_u16(), &body);
    }
    Err(unreachable(&format!("more than {} redirects", hub::MAX_REDIRECTS)))
}

/// Why a redirect to `next` is not followed; the origin shown is an excerpt (the server chose it).
fn cross_origin(status: u16, next: &Uri) -> String {
    let origin = format!("{}://{}", next.scheme_str().unwrap_or_default(), next.authority().map(|a| a.as_str()).unwrap_or_default());
    format!(
        "HTTP {status} redirects to another origin ({}), which the operator does not follow (fix: set spec.model.source.huggingFace.endpoint to the origin that serves the files)",
        pd_core::remote::excerpt(&origin)
    )
}

/// The URI a `Location` names, relative to `from`.
pub(crate) fn follow(from: &Uri, location: &str) -> Option<Uri> {
    if location.starts_with('/') {
        let base = format!("{}://{}", from.scheme_str()?, from.authority()?);
        return format!("{base}{location}").parse().ok();
    }
    location.parse().ok().filter(|u: &Uri| u.scheme().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_resolve_against_the_url_they_came_from() {
        let from: Uri = "https://huggingface.co/old/name/resolve/main/config.json".parse().unwrap();
        assert_eq!(
            follow(&from, "/new/name/resolve/main/config.json").unwrap().to_string(),
            "https://huggingface.co/new/name/resolve/main/config.json"
        );
        assert_eq!(follow(&from, "https://cdn.example/x").unwrap().to_string(), "https://cdn.example/x");
        assert!(follow(&from, "relative").is_none());
    }

    #[tokio::test]
    async fn a_redirect_off_the_endpoints_origin_is_not_followed() {
        // The place it points to: a listener that must see no connection.
        let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        elsewhere.set_nonblocking(true).unwrap();
        let target = format!("http://{}/latest/meta-data/", elsewhere.local_addr().unwrap());
        let answer = format!("HTTP/1.1 302 Found\r\nLocation: {target}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        let hub = crate::http_client::serve_raw(answer.into_bytes()).await;
        let req = HubRequest { repo: "a/b".into(), url: format!("http://{hub}/a/b/resolve/main/config.json"), token: None };
        let e = fetch_config(&req, None, Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(e.reason(), "HubUnreachable");
        assert!(e.to_string().contains("HTTP 302 redirects to another origin (http://127.0.0.1:"), "{e}");
        assert!(e.to_string().contains("which the operator does not follow"), "{e}");
        assert_eq!(elsewhere.accept().map_err(|e| e.kind()).err(), Some(std::io::ErrorKind::WouldBlock), "no request went there");
    }

    #[tokio::test]
    async fn an_endpoint_nobody_listens_on_is_unreachable_and_named() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let req = HubRequest { repo: "a/b".into(), url: format!("http://127.0.0.1:{port}/a/b/resolve/main/config.json"), token: None };
        let e = fetch_config(&req, None, Duration::from_secs(3)).await.unwrap_err();
        assert_eq!(e.reason(), "HubUnreachable");
        assert!(e.to_string().starts_with(&format!("GET {}: the Hub could not be reached", req.url)), "{e}");
    }
}
