//! A minimal HTTP/1.1 client for the bootstrap protocol: one connection per request, a deadline
//! over the whole exchange (a slow drip cannot hold it) and a cap on the body it will read.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::Request;
use hyper_util::rt::TokioIo;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum HttpError {
    #[error("connect to {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    #[error("no answer from {addr} within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("HTTP exchange with {addr} failed: {message}")]
    Protocol { addr: String, message: String },
    #[error("answer from {addr} exceeds {limit} bytes")]
    TooLarge { addr: String, limit: usize },
}

/// `host:port` as sockets and URLs want it: an IPv6 host goes in brackets.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// A response: status, content type and the body bytes.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub content_type: String,
    pub body: Bytes,
}

impl HttpResponse {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request to `addr` (`host:port`, brackets around IPv6 hosts).
pub async fn send(
    method: hyper::Method,
    addr: &str,
    path_and_query: &str,
    body: Option<Vec<u8>>,
    timeout: Duration,
    max_body: usize,
) -> Result<HttpResponse, HttpError> {
    match tokio::time::timeout(timeout, exchange(method, addr, path_and_query, body, max_body)).await {
        Ok(result) => result,
        Err(_) => Err(HttpError::Timeout { addr: addr.to_owned(), timeout }),
    }
}

async fn exchange(
    method: hyper::Method,
    addr: &str,
    path_and_query: &str,
    body: Option<Vec<u8>>,
    max_body: usize,
) -> Result<HttpResponse, HttpError> {
    let protocol = |e: &dyn std::fmt::Display| HttpError::Protocol { addr: addr.to_owned(), message: e.to_string() };
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|source| HttpError::Connect { addr: addr.to_owned(), source })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| protocol(&e))?;
    let driver = tokio::spawn(conn);
    let mut builder = Request::builder().method(method).uri(path_and_query).header(hyper::header::HOST, addr);
    if body.is_some() {
        builder = builder.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    let request = builder.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|e| protocol(&e))?;
    let response = sender.send_request(request).await.map_err(|e| protocol(&e));
    let result = match response {
        Ok(response) => {
            let status = response.status().as_u16();
            let content_type =
                response.headers().get(hyper::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            match Limited::new(response.into_body(), max_body).collect().await {
                Ok(collected) => Ok(HttpResponse { status, content_type, body: collected.to_bytes() }),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(HttpError::TooLarge { addr: addr.to_owned(), limit: max_body }),
                Err(e) => Err(protocol(&e)),
            }
        }
        Err(e) => Err(e),
    };
    driver.abort();
    result
}

/// A server on 127.0.0.1 answering each connection with `response` (raw HTTP/1.1), for tests
/// that call the clients directly (no egress policy between them and it).
#[cfg(test)]
pub(crate) async fn serve_raw(response: Vec<u8>) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let response = response.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 1024];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream.write_all(&response).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}
