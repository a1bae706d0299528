//! The validating admission webhook: `POST /validate` over TLS, inside `pd-operator controller`
//! but independent of the reconcile loop (it serves on standby replicas too).

pub mod review;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use kube::Client;
use thiserror::Error;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use tracing::{Instrument, info, info_span, warn};

use crate::model_read::kept;
use pd_core::model_read::ConfigSource;
use tls::CertSource;

/// The most a ConfigMap lookup may take of an admission review.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);
/// The most a review may take, its body read included: under the registration's
/// `timeoutSeconds: 5`, so a slow client or lookup gets an answer before the apiserver gives up,
/// and holds its place among `MAX_IN_FLIGHT` no longer.
const REVIEW_DEADLINE: Duration = Duration::from_secs(4);
/// The most reviews judged at once: more are answered 503 at once rather than queued, so a
/// flood of posts to the webhook's port holds a bounded amount of memory and of lookups.
const MAX_IN_FLIGHT: usize = 32;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// After the drain, how long open connections get to finish their reviews once told to close.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// How long an HTTP/1 connection may wait for a request's headers, idle keep-alive time
/// included (hyper starts this timer whenever the connection waits for the next request). The
/// apiserver talks HTTP/1.1 to webhooks and keeps idle connections 90 s (Go's `IdleConnTimeout`):
/// a server that closes an idle one sooner races the apiserver writing a review to it, and that
/// review fails with `broken pipe` (`failurePolicy: Fail` refuses the object). Longer than the
/// client's, so the client always closes first.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Error)]
pub enum WebhookError {
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

#[derive(Clone, Debug)]
pub struct WebhookSettings {
    pub addr: SocketAddr,
    /// How long the webhook keeps answering after the stop signal: a terminating pod's endpoint
    /// leaves the Service within seconds, and reviews sent to it meanwhile must still be judged
    /// (with `failurePolicy: Fail` a refused connection refuses the object).
    pub drain: Duration,
    pub certs: CertSource,
    /// `--max-pods-per-deployment`: a spec asking for more engine pods is denied.
    pub max_pods: u32,
    /// The addresses specs may name (`pd_core::egress`), judged here as by the controller.
    pub egress: pd_core::egress::EgressPolicy,
}

#[derive(Clone)]
struct AppState {
    client: Client,
    metrics: Arc<crate::controller::metrics::Metrics>,
    /// Whether the cluster serves Kubernetes' gang scheduling API (the controller's finding), and
    /// the operator's limits.
    judge: review::Judge,
}

/// Bodies past this size are not even drained: the connection is dropped.
const DRAIN_LIMIT: usize = 4 * review::MAX_BODY;

/// Reads at most `MAX_BODY` bytes; an oversized body is drained (up to `DRAIN_LIMIT`) and
/// discarded, so the client finishes sending and reads our 400 instead of a reset.
async fn read_body(body: Body) -> Result<bytes::Bytes, String> {
    use futures::StreamExt;
    let mut stream = body.into_data_stream();
    let mut buf = bytes::BytesMut::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("cannot read the request body: {e}"))?;
        total += chunk.len();
        if total > DRAIN_LIMIT {
            break;
        }
        if total <= review::MAX_BODY {
            buf.extend_from_slice(&chunk);
        }
    }
    if total > review::MAX_BODY {
        return Err(format!("request body of {total}+ bytes exceeds the limit of {} bytes", review::MAX_BODY));
    }
    Ok(buf.freeze())
}

async fn validate(State(state): State<AppState>, request: Request) -> Response {
    let body = match read_body(request.into_body()).await {
        Ok(b) => b,
        Err(reason) => {
            state.metrics.admission("bad_request");
            return (StatusCode::BAD_REQUEST, reason).into_response();
        }
    };
    let admission = match review::Review::parse(&body) {
        Ok(r) => r,
        Err(reason) => {
            state.metrics.admission("bad_request");
            return (StatusCode::BAD_REQUEST, reason).into_response();
        }
    };
    let req = &admission.request;
    let span = info_span!("admission", uid = %req.uid, name = %req.name, namespace = req.namespace.as_deref().unwrap_or(""), operation = ?req.operation);
    async move {
        // Admission reads no Secret and makes no request a spec names: a source's config.json is
        // read by a Job in the namespace (`model_read`) and judged here once the controller kept it.
        let (config, unread) = match admission.config_source() {
            Some((ns, ConfigSource::ConfigMap(r))) => {
                (kept::config_map(&state.client, &ns, &r, LOOKUP_TIMEOUT).await.map(Some).map_err(|e| e.to_string()), None)
            }
            Some((ns, ConfigSource::Read(read))) => {
                match kept::kept(&state.client, &ns, &admission.name(), &read.origin, LOOKUP_TIMEOUT).await {
                    Some(config) => (Ok(Some(config)), None),
                    None => (Ok(None), Some(review::unread(&read))),
                }
            }
            Some((_, ConfigSource::Catalogue)) | None => (Ok(None), None),
        };
        let mut response = admission.decide(config, &state.judge);
        // The controller's gate holds what admission could not judge on the real config; a denied
        // object is never read, so it gets no such promise.
        if let Some(warning) = unread.filter(|_| response.allowed) {
            response.warnings.get_or_insert_with(Vec::new).push(warning);
        }
        state.metrics.admission(if response.allowed { "allowed" } else { "denied" });
        info!(allowed = response.allowed, "admission decided");
        axum::Json(response.into_review()).into_response()
    }
    .instrument(span)
    .await
}

/// What bounds the reviews judged at once and the time each may take.
#[derive(Clone)]
struct Bounds {
    in_flight: Arc<tokio::sync::Semaphore>,
    deadline: Duration,
    metrics: Arc<crate::controller::metrics::Metrics>,
}

impl Bounds {
    fn new(max_in_flight: usize, deadline: Duration, metrics: Arc<crate::controller::metrics::Metrics>) -> Self {
        Self { in_flight: Arc::new(tokio::sync::Semaphore::new(max_in_flight)), deadline, metrics }
    }
}

/// Serves a review within the bounds: 503 at once when `MAX_IN_FLIGHT` are judged already, 503
/// when it takes over the deadline (the apiserver retries neither; `failurePolicy` decides).
async fn bounded(State(bounds): State<Bounds>, req: Request, next: axum::middleware::Next) -> Response {
    let Ok(_permit) = bounds.in_flight.clone().try_acquire_owned() else {
        bounds.metrics.admission("overloaded");
        return (StatusCode::SERVICE_UNAVAILABLE, "too many admission reviews in flight; retry").into_response();
    };
    match tokio::time::timeout(bounds.deadline, next.run(req)).await {
        Ok(response) => response,
        Err(_) => {
            bounds.metrics.admission("timed_out");
            (StatusCode::SERVICE_UNAVAILABLE, format!("the admission review took over {:?}", bounds.deadline)).into_response()
        }
    }
}

/// The webhook's routes; `judge.gang_api` is whether the cluster serves Kubernetes' gang
/// scheduling API, found once at start and shared with the reconciler.
pub fn router(client: Client, metrics: Arc<crate::controller::metrics::Metrics>, judge: review::Judge) -> Router {
    let bounds = Bounds::new(MAX_IN_FLIGHT, REVIEW_DEADLINE, metrics.clone());
    let state = AppState { client, metrics, judge };
    let validate = post(validate).route_layer(axum::middleware::from_fn_with_state(bounds, bounded));
    Router::new().route("/validate", validate).route("/healthz", get(|| async { "ok" })).with_state(state)
}

/// Whether this replica's webhook should receive admission reviews: it listens, and the
/// apiserver's registration trusts the certificate it serves.
#[derive(Debug, Default)]
pub struct Health {
    pub listening: Arc<AtomicBool>,
    pub trusted: Arc<AtomicBool>,
    /// Stopping: it still answers, but takes no new traffic.
    pub draining: Arc<AtomicBool>,
}

impl Health {
    pub fn ready(&self) -> Result<(), &'static str> {
        if self.draining.load(Ordering::Relaxed) {
            return Err("the webhook is draining before it stops");
        }
        if !self.listening.load(Ordering::Relaxed) {
            return Err("the webhook does not listen yet");
        }
        if !self.trusted.load(Ordering::Relaxed) {
            return Err("the webhook registration's caBundle does not trust the served certificate yet");
        }
        Ok(())
    }
}

/// Serves until `shutdown` resolves, and for `settings.drain` after (not ready meanwhile); then
/// tells open connections to close (HTTP/2 GOAWAY, HTTP/1 after the review in flight) and waits up
/// to `CLOSE_GRACE` for them.
pub async fn serve(
    client: Client,
    settings: WebhookSettings,
    gang_api: bool,
    metrics: Arc<crate::controller::metrics::Metrics>,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), WebhookError> {
    let store = tls::start(settings.certs.clone(), client.clone(), health.trusted.clone()).await?;
    let acceptor = TlsAcceptor::from(tls::server_config(store)?);
    let listener =
        tokio::net::TcpListener::bind(settings.addr).await.map_err(|source| WebhookError::Bind { addr: settings.addr, source })?;
    info!(addr = %settings.addr, "webhook listening (POST /validate)");
    health.listening.store(true, Ordering::Relaxed);
    let app = router(client, metrics, review::Judge { gang_api, max_pods: settings.max_pods, egress: Arc::new(settings.egress.clone()) });
    let draining = health.draining.clone();
    let drained = drain(shutdown, draining.clone(), settings.drain);
    tokio::pin!(drained);
    let close = tokio_util::sync::CancellationToken::new();
    // Each connection holds a sender: `recv` ends once every connection has.
    let (open, mut all_closed) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut drained => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => { warn!(error = %e, "accept failed"); continue; }
            },
        };
        let conn = Connection { app: app.clone(), draining: draining.clone(), close: close.clone(), _open: open.clone() };
        tokio::spawn(conn.accept(tcp, peer, acceptor.clone()));
    }
    drop((listener, open));
    close.cancel();
    if tokio::time::timeout(CLOSE_GRACE, all_closed.recv()).await.is_err() {
        warn!(grace = ?CLOSE_GRACE, "webhook connections still open; stopping anyway");
    }
    info!("webhook stopped");
    Ok(())
}

/// Resolves `drain` after `shutdown`, with the webhook marked draining (not ready) meanwhile.
async fn drain(shutdown: impl std::future::Future<Output = ()>, draining: Arc<AtomicBool>, drain: Duration) {
    shutdown.await;
    draining.store(true, Ordering::Relaxed);
    info!(?drain, "webhook draining: answering reviews still sent here, then stopping");
    tokio::time::sleep(drain).await;
}

/// While the webhook drains, an HTTP/1 response says `Connection: close` (HTTP/2 has GOAWAY).
async fn close_when_draining(State(draining): State<Arc<AtomicBool>>, req: Request, next: axum::middleware::Next) -> Response {
    let http1 = req.version() < axum::http::Version::HTTP_2;
    let mut response = next.run(req).await;
    if http1 && draining.load(Ordering::Relaxed) {
        response.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    }
    response
}

/// What every connection of the webhook shares.
struct Connection {
    app: Router,
    /// While set, responses carry `Connection: close`: the apiserver leaves a stopping replica's
    /// connections after the review it gets there, rather than reusing one about to be closed.
    draining: Arc<AtomicBool>,
    /// Asks the connection to end gracefully (HTTP/2 GOAWAY, HTTP/1 after the review in flight).
    close: tokio_util::sync::CancellationToken,
    _open: tokio::sync::mpsc::Sender<()>,
}

impl Connection {
    /// One TLS connection, served until the peer ends it or `close` asks it to end.
    async fn accept(self, tcp: tokio::net::TcpStream, peer: SocketAddr, acceptor: TlsAcceptor) {
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
            Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
        };
        if let Err(e) = self.serve(tls).await {
            tracing::debug!(%peer, error = %e, "connection ended with an error");
        }
    }

    /// Serves HTTP/1.1 or HTTP/2 on `io` until the peer ends it or `close` asks it to end.
    async fn serve<I>(self, io: I) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let app = self.app.layer(axum::middleware::from_fn_with_state(self.draining, close_when_draining));
        let app = app.map_request(|r: Request<hyper::body::Incoming>| r.map(Body::new));
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().header_read_timeout(HEADER_READ_TIMEOUT).timer(hyper_util::rt::TokioTimer::new());
        let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
        tokio::pin!(conn);
        tokio::select! {
            ended = conn.as_mut() => ended,
            _ = self.close.cancelled() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A webhook connection over an in-memory stream, with an HTTP/1.1 client on the other end
    /// (the apiserver's protocol to webhooks).
    async fn connected(draining: Arc<AtomicBool>) -> (hyper::client::conn::http1::SendRequest<Body>, tokio::task::JoinHandle<()>) {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (open, _) = tokio::sync::mpsc::channel(1);
        let app = Router::new().route("/validate", post(|| async { "judged" }));
        let conn = Connection { app, draining, close: tokio_util::sync::CancellationToken::new(), _open: open };
        let served = tokio::spawn(async move { conn.serve(server).await.expect("served") });
        let (sender, client_conn) = hyper::client::conn::http1::handshake(TokioIo::new(client)).await.expect("handshake");
        tokio::spawn(client_conn);
        (sender, served)
    }

    async fn review(sender: &mut hyper::client::conn::http1::SendRequest<Body>) -> Result<Response<bytes::Bytes>, hyper::Error> {
        sender.ready().await?;
        let r = sender.send_request(Request::post("/validate").body(Body::empty()).expect("a request")).await?;
        let (parts, body) = r.into_parts();
        Ok(Response::from_parts(parts, body.collect().await?.to_bytes()))
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_keep_alive_connection_outlives_the_apiservers_idle_timeout() {
        let (mut sender, _served) = connected(Arc::default()).await;
        assert_eq!(review(&mut sender).await.expect("first review").body(), "judged");
        // Go's IdleConnTimeout: the apiserver may reuse the connection up to here.
        tokio::time::advance(Duration::from_secs(90)).await;
        let second = review(&mut sender).await.expect("a review on the connection idle for 90 s");
        assert_eq!(second.body(), "judged");
        assert_eq!(second.headers().get("connection"), None);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_and_one_at_it_is_read() {
        const { assert!(review::MAX_BODY <= 1 << 20 && DRAIN_LIMIT <= 4 << 20, "small limits") };
        let at = read_body(Body::from(vec![b' '; review::MAX_BODY])).await.expect("a body at the limit");
        assert_eq!(at.len(), review::MAX_BODY);
        let e = read_body(Body::from(vec![b' '; review::MAX_BODY + 1])).await.expect_err("a body over the limit");
        assert!(e.contains("exceeds the limit of 1048576 bytes"), "{e}");
        // Past the drain limit the rest of the body is not even read.
        let chunks = (0..).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b' '; 64 << 10])));
        let endless = Body::from_stream(futures::stream::iter(chunks));
        let e = tokio::time::timeout(Duration::from_secs(10), read_body(endless)).await.expect("it stops reading").expect_err("refused");
        assert!(e.contains(&format!("{}+ bytes", DRAIN_LIMIT + (64 << 10))), "{e}");
    }

    /// `/validate` behind `bounded`, whose handler says it started and waits for `release`.
    fn bounded_app(max: usize, deadline: Duration) -> (Router, tokio::sync::mpsc::UnboundedReceiver<()>, Arc<tokio::sync::Semaphore>) {
        let (started, entered) = tokio::sync::mpsc::unbounded_channel();
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let gate = release.clone();
        let handler = post(move || async move {
            let _ = started.send(());
            let _held = gate.acquire().await;
            "judged"
        });
        let bounds = Bounds::new(max, deadline, Arc::default());
        (Router::new().route("/validate", handler.route_layer(axum::middleware::from_fn_with_state(bounds, bounded))), entered, release)
    }

    fn post_review() -> Request {
        Request::post("/validate").body(Body::empty()).expect("a request")
    }

    #[tokio::test]
    async fn reviews_over_the_concurrency_bound_are_answered_503_at_once() {
        let (app, mut entered, release) = bounded_app(2, Duration::from_secs(60));
        let held: Vec<_> = (0..2).map(|_| tokio::spawn(app.clone().oneshot(post_review()))).collect();
        for _ in 0..2 {
            entered.recv().await.expect("a review in flight");
        }
        let over = tokio::time::timeout(Duration::from_secs(5), app.clone().oneshot(post_review())).await.expect("answered at once");
        assert_eq!(over.expect("a response").status(), StatusCode::SERVICE_UNAVAILABLE);
        release.add_permits(2);
        for h in held {
            assert_eq!(h.await.expect("joined").expect("a response").status(), StatusCode::OK);
        }
        release.add_permits(1);
        assert_eq!(app.oneshot(post_review()).await.expect("a response").status(), StatusCode::OK, "room again once they ended");
    }

    #[tokio::test(start_paused = true)]
    async fn a_review_past_its_deadline_is_answered_503_and_frees_its_place() {
        let (app, _entered, release) = bounded_app(1, REVIEW_DEADLINE);
        let started = tokio::time::Instant::now();
        let r = app.clone().oneshot(post_review()).await.expect("a response");
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(started.elapsed(), REVIEW_DEADLINE);
        assert!(REVIEW_DEADLINE < Duration::from_secs(5), "under the registration's timeoutSeconds");
        release.add_permits(1);
        assert_eq!(app.oneshot(post_review()).await.expect("a response").status(), StatusCode::OK, "the late review's place was freed");
    }

    #[tokio::test]
    async fn while_draining_an_http1_response_closes_its_connection() {
        let (mut sender, served) = connected(Arc::new(AtomicBool::new(true))).await;
        let r = review(&mut sender).await.expect("a review while draining");
        assert_eq!((r.body().as_ref(), r.headers().get("connection").map(|v| v.as_bytes())), (&b"judged"[..], Some(&b"close"[..])));
        tokio::time::timeout(Duration::from_secs(5), served).await.expect("the connection ended after the review").expect("served");
    }
}
