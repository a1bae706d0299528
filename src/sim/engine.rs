//! Runs a stand-in engine (prefill or decode) or router until shutdown.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use futures::future::join_all;
use rand::Rng;
use serde_json::json;
use tokio::net::TcpListener;
use tracing::{info, warn};

use super::SimError;
use super::bootstrap::{self, Registry};
use super::flags::{self, EngineFlags, RankSlot, Topology};
use crate::http_client;

/// SGLang's registration client: 5 attempts, 5 s each, backoff min(2^k s, 30 s) x [0.75, 1).
const REGISTER_ATTEMPTS: u32 = 5;
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// A cloneable shutdown signal shared by the servers of one process: true once stopping.
pub type ShutdownSignal = tokio::sync::watch::Receiver<bool>;

async fn bind(host: &str, port: u16) -> Result<TcpListener, SimError> {
    let addr = http_client::host_port(host, port);
    TcpListener::bind(&addr).await.map_err(|source| SimError::Listen { addr, source })
}

async fn stopped(mut signal: ShutdownSignal) {
    while !*signal.borrow() {
        if signal.changed().await.is_err() {
            return;
        }
    }
}

/// The engine's HTTP API, reduced to what probes and the router ask.
fn api_router(flags: &EngineFlags) -> Router {
    let info = json!({"model_path": flags.model_path, "is_generation": true, "disaggregation_mode": flags.mode});
    Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/health_generate", get(|| async { StatusCode::OK }))
        .route("/get_model_info", get(move || async move { axum::Json(info) }))
        .fallback(|| async { (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, bootstrap::TEXT)], "404: Not Found").into_response() })
}

/// `rank_ip` as SGLang picks it: `SGLANG_HOST_IP`, else `HOST_IP`, else the address of the
/// interface that routes outwards (no packet is sent), else loopback.
fn rank_ip() -> String {
    let from_env = ["SGLANG_HOST_IP", "HOST_IP"].iter().find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
    from_env.unwrap_or_else(|| {
        std::net::UdpSocket::bind("0.0.0.0:0")
            .and_then(|s| {
                s.connect("10.255.255.255:1")?;
                s.local_addr()
            })
            .map(|a| a.ip().to_string())
            .unwrap_or_else(|_| "127.0.0.1".into())
    })
}

/// Opens one listener per rank (a real rank's ZMQ socket); connections are accepted and dropped.
async fn rank_listeners(count: usize, signal: &ShutdownSignal) -> Result<Vec<u16>, SimError> {
    let mut ports = Vec::with_capacity(count);
    for _ in 0..count {
        let listener = bind("0.0.0.0", 0).await?;
        let port = listener.local_addr().map_err(|source| SimError::Listen { addr: "0.0.0.0:0".into(), source })?.port();
        let stop = stopped(signal.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop => {}
                _ = async { loop { let _ = listener.accept().await; } } => {}
            }
        });
        ports.push(port);
    }
    Ok(ports)
}

/// One registration, with SGLang's retry schedule; failure after the last attempt is only logged.
async fn register(target: String, body: serde_json::Value) -> bool {
    let bytes = body.to_string().into_bytes();
    for attempt in 0..REGISTER_ATTEMPTS {
        match http_client::send(hyper::Method::PUT, &target, "/route", Some(bytes.clone()), REGISTER_TIMEOUT, 64 << 10).await {
            Ok(r) if r.status == 200 => return true,
            Ok(r) => warn!(status = r.status, body = %r.text(), "bootstrap registration refused"),
            Err(e) => warn!(error = %e, "bootstrap registration failed"),
        }
        if attempt + 1 < REGISTER_ATTEMPTS {
            let base = (1u64 << attempt).min(30) as f64;
            let factor = rand::rng().random_range(0.75..1.0);
            tokio::time::sleep(Duration::from_secs_f64(base * factor)).await;
        }
    }
    warn!("Prefill instance failed to register to bootstrap server after {REGISTER_ATTEMPTS} retries");
    false
}

async fn registration_target(f: &EngineFlags) -> String {
    let host = flags::registration_host(f);
    // SGLang resolves the dist-init host to an IP before it registers.
    let resolved = tokio::net::lookup_host((host.as_str(), f.bootstrap_port)).await.ok().and_then(|mut it| it.next());
    match resolved {
        Some(addr) => addr.to_string(),
        None => http_client::host_port(&host, f.bootstrap_port),
    }
}

async fn run_prefill(f: &EngineFlags, t: Topology, signal: ShutdownSignal) -> Result<(), SimError> {
    let mut tasks = Vec::new();
    if f.node_rank == 0 && f.sim_bootstrap_server {
        let listener = bind(&f.host, f.bootstrap_port).await?;
        let addr = http_client::host_port(&f.host, f.bootstrap_port);
        info!(%addr, "bootstrap server listening");
        let registry = Arc::new(Mutex::new(Registry::default()));
        let stop = stopped(signal.clone());
        tasks.push(tokio::spawn(async move {
            bootstrap::serve(listener, registry, stop).await.map_err(|source| SimError::Serve { addr, source })
        }));
    }
    let slots: Vec<RankSlot> = flags::node_share(&flags::rank_slots(&t), f.nnodes, f.node_rank);
    let ports = rank_listeners(slots.len(), &signal).await?;
    let ip = rank_ip();
    let sent = slots.len().saturating_sub(f.sim_hold_registrations);
    let target = registration_target(f).await;
    info!(ranks = slots.len(), held_back = slots.len() - sent, %target, "registering prefill ranks");
    let bodies: Vec<_> = slots.iter().zip(&ports).take(sent).map(|(s, p)| flags::registration_body(f, &t, *s, &ip, *p)).collect();
    let registrations = join_all(bodies.into_iter().map(|b| register(target.clone(), b)));
    tokio::spawn(async move {
        let ok = registrations.await.into_iter().filter(|ok| *ok).count();
        info!(registered = ok, "prefill ranks registered");
    });
    serve_api(f, signal, tasks).await
}

async fn serve_api(
    f: &EngineFlags,
    signal: ShutdownSignal,
    mut tasks: Vec<tokio::task::JoinHandle<Result<(), SimError>>>,
) -> Result<(), SimError> {
    if f.node_rank == 0 {
        let listener = bind(&f.host, f.port).await?;
        let app = api_router(f);
        let stop = stopped(signal.clone());
        let addr = http_client::host_port(&f.host, f.port);
        tasks.push(tokio::spawn(async move {
            axum::serve(listener, app).with_graceful_shutdown(stop).await.map_err(|source| SimError::Serve { addr, source })
        }));
    }
    stopped(signal).await;
    for task in tasks {
        if let Ok(Err(e)) = task.await {
            return Err(e);
        }
    }
    Ok(())
}

/// Runs an engine stand-in with SGLang's argv until `signal` turns true.
pub async fn run_engine(args: &[String], signal: ShutdownSignal) -> Result<(), SimError> {
    let f = EngineFlags::parse(args)?;
    if !f.ignored.is_empty() {
        info!(flags = ?f.ignored, "flags the stand-in does not model are ignored");
    }
    let t = flags::resolve(&f)?;
    match f.mode.as_str() {
        "prefill" => run_prefill(&f, t, signal).await,
        "decode" => serve_api(&f, signal, Vec::new()).await,
        other => Err(SimError::Flags(format!("--disaggregation-mode must be prefill or decode for the stand-in, got {other:?}"))),
    }
}

/// The router stand-in: `sglang_router.launch_router`'s argv, serving `/health` on `--port`.
pub async fn run_router(args: &[String], signal: ShutdownSignal) -> Result<(), SimError> {
    let mut host = "127.0.0.1".to_owned();
    let mut port: u16 = 30000;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--host" => host = it.next().cloned().ok_or_else(|| SimError::Flags("--host expects a value".into()))?,
            "--port" => {
                let v = it.next().ok_or_else(|| SimError::Flags("--port expects a value".into()))?;
                port = v.parse().map_err(|_| SimError::Flags(format!("--port expects a port number, got {v:?}")))?;
            }
            _ => {}
        }
    }
    let listener = bind(&host, port).await?;
    let app = Router::new().route("/health", get(|| async { "OK" })).route("/readiness", get(|| async { "OK" }));
    axum::serve(listener, app)
        .with_graceful_shutdown(stopped(signal))
        .await
        .map_err(|source| SimError::Serve { addr: http_client::host_port(&host, port), source })
}
