//! Runs a stand-in engine (prefill or decode) until shutdown.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use rand::Rng;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tracing::{info, warn};

use super::SimError;
use super::bootstrap::{self, Registry};
use super::flags::{self, EngineFlags, RankSlot, Topology};
use super::kv::KvGeometry;
use super::pd::DecodeSide;
use super::rooms::Rooms;
use super::serve::{self, Engine, Role};
use super::transfer::{RankServer, SenderFaults};
use pd_runtime::http_client;

/// SGLang's registration client: 5 attempts, 5 s each, backoff min(2^k s, 30 s) x [0.75, 1).
const REGISTER_ATTEMPTS: u32 = 5;
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// The stop signal shared by the servers of one process (`shutdown::token`).
pub type ShutdownSignal = tokio_util::sync::CancellationToken;

async fn bind(host: &str, port: u16) -> Result<TcpListener, SimError> {
    let addr = http_client::host_port(host, port);
    TcpListener::bind(&addr).await.map_err(|source| SimError::Listen { addr, source })
}

async fn stopped(signal: ShutdownSignal) {
    signal.cancelled_owned().await
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

fn sender_faults(f: &EngineFlags) -> SenderFaults {
    SenderFaults {
        die_at_transfer: f.sim_fault_die_mid_transfer,
        bytes_per_s: f.sim_transfer_gbps * 1e9,
        stall: f.sim_fault_stall_transfers,
    }
}

/// Opens one listener per rank (a real rank's ZMQ socket), each serving KV pulls for its row.
async fn rank_servers(engine: &Arc<Engine>, t: &Topology, slots: &[RankSlot], signal: &ShutdownSignal) -> Result<Vec<u16>, SimError> {
    let mut ports = Vec::with_capacity(slots.len());
    let started = Arc::new(AtomicU64::new(0));
    for slot in slots {
        let listener = bind("0.0.0.0", 0).await?;
        let port = listener.local_addr().map_err(|source| SimError::Listen { addr: "0.0.0.0:0".into(), source })?.port();
        let (row, sent_bytes) = (flags::row_of(t, *slot), Arc::new(AtomicU64::new(0)));
        engine.sent.lock().unwrap_or_else(|p| p.into_inner()).push((row, sent_bytes.clone()));
        let server = Arc::new(RankServer {
            row,
            rooms: engine.rooms.clone(),
            faults: sender_faults(&engine.flags),
            started: started.clone(),
            sent_bytes,
            wait: (engine.flags.node_rank == 0).then_some(engine.bootstrap_timeout),
        });
        let stop = stopped(signal.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop => {}
                _ = server.serve(listener) => {}
            }
        });
        info!(?row, port, "rank serves KV");
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

async fn run_prefill(engine: Arc<Engine>, t: Topology, signal: ShutdownSignal) -> Result<(), SimError> {
    let f = &engine.flags;
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
    let ports = rank_servers(&engine, &t, &slots, &signal).await?;
    let ip = rank_ip();
    let sent = slots.len().saturating_sub(f.sim_hold_registrations);
    let target = registration_target(f).await;
    info!(ranks = slots.len(), held_back = slots.len() - sent, %target, "registering prefill ranks");
    let bodies: Vec<_> = slots.iter().zip(&ports).take(sent).map(|(s, p)| flags::registration_body(f, &t, *s, &ip, *p)).collect();
    // SGLang's ranks register while the scheduler starts, before the HTTP server answers: a
    // prefill that reports healthy can be bootstrapped from.
    let ok = join_all(bodies.into_iter().map(|b| register(target.clone(), b))).await.into_iter().filter(|ok| *ok).count();
    info!(registered = ok, "prefill ranks registered");
    serve_api(engine.clone(), signal, tasks).await
}

async fn serve_api(
    engine: Arc<Engine>,
    signal: ShutdownSignal,
    mut tasks: Vec<tokio::task::JoinHandle<Result<(), SimError>>>,
) -> Result<(), SimError> {
    let f = &engine.flags;
    if f.node_rank == 0 {
        let listener = bind(&f.host, f.port).await?;
        let app = serve::router(engine.clone());
        let keeper = tokio::spawn(serve::housekeeping(engine.clone()));
        let stop_keeper = stopped(signal.clone());
        tokio::spawn(async move {
            stop_keeper.await;
            keeper.abort();
        });
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

/// What `/get_server_info` reports: SGLang's resolved flags plus the stand-in's model.
fn server_info(f: &EngineFlags, t: &Topology, g: &KvGeometry) -> Value {
    json!({
        "model_path": f.model_path, "served_model_name": flags::served_name(f), "disaggregation_mode": f.mode,
        "disaggregation_bootstrap_port": f.bootstrap_port, "tp_size": t.tp, "dp_size": t.dp, "attn_dp_size": t.attn_dp,
        "attn_cp_size": t.attn_cp, "pp_size": t.pp, "dcp_size": f.dcp, "page_size": flags::advertised_page_size(f),
        "kv_cache_dtype": flags::advertised_kv_dtype(f), "max_running_requests": f.max_running_requests,
        "load_balance_method": f.load_balance_method, "nnodes": f.nnodes, "node_rank": f.node_rank,
        "sim": {
            "prefill_tokens_per_s": f.sim_prefill_tokens_per_s, "itl_ms": f.sim_itl_ms,
            "kv_pool": format!("{:?}", g.pool), "num_layers": g.layers, "num_kv_heads": g.kv_heads, "head_dim": g.head_dim,
            "kv_latent_dim": g.latent_dim, "dtype_bits": g.dtype_bits, "kv_bytes_per_token": g.bytes_per_token(),
        },
    })
}

fn role_of(mode: &str) -> Result<Role, SimError> {
    match mode {
        "prefill" => Ok(Role::Prefill),
        "decode" => Ok(Role::Decode),
        "null" => Ok(Role::Unified),
        other => Err(SimError::Flags(format!("--disaggregation-mode must be null, prefill or decode, got {other:?}"))),
    }
}

/// Runs an engine stand-in with SGLang's argv until `signal` turns true.
pub async fn run_engine(args: &[String], signal: ShutdownSignal) -> Result<(), SimError> {
    let f = EngineFlags::parse(args)?;
    if !f.ignored.is_empty() {
        info!(flags = ?f.ignored, "flags the stand-in does not model are ignored");
    }
    let t = flags::resolve(&f)?;
    if let Some(model) = super::model_dir::read(&f.model_path)? {
        info!(path = %f.model_path, architecture = ?model.architecture, model_type = %model.model_type, files = ?model.files, "model directory read");
    }
    let role = role_of(&f.mode)?;
    let geometry = flags::kv_geometry(&f)?;
    let decode = match role {
        Role::Decode => {
            let waiting = serve::env_secs("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0);
            Some(DecodeSide::new(flags::decode_topology(&f, &t)?, geometry, f.bootstrap_port, waiting))
        }
        _ => None,
    };
    let info = server_info(&f, &t, &geometry);
    let engine = Arc::new(Engine::new(role, f, decode, Arc::new(Rooms::default()), info));
    match role {
        Role::Prefill => run_prefill(engine, t, signal).await,
        _ => serve_api(engine, signal, Vec::new()).await,
    }
}
