//! SGLang's serving API on the stand-in engine: generation endpoints (whole or streamed), model and
//! server info, health, and `/metrics`. A timing model shapes TTFT and ITL: a prefill computes
//! prompts one after another at `--sim-prefill-tokens-per-s`, a decode emits a token every
//! `--sim-itl-ms` plus `--sim-itl-ms-per-running` for each request running beside it (a batch's
//! step grows with the batch), and at most `--max-running-requests` run at once (the rest queue).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::SinkExt;
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{Instrument, info_span};

use super::flags::{self, EngineFlags};
use super::metrics::SimMetrics;
use super::openai::{self, Api, GenRequest, Meta};
use super::pd::DecodeSide;
use super::rooms::Rooms;
use super::transfer::Row;

/// SGLang's release whose API the stand-in answers with.
pub const SGLANG_VERSION: &str = "0.5.23";
const JSON_TYPE: &str = "application/json";
const SSE_TYPE: &str = "text/event-stream";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Prefill,
    Decode,
    Unified,
}

impl Role {
    pub fn engine_type(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Unified => "unified",
        }
    }
}

/// One engine's serving state.
pub struct Engine {
    pub role: Role,
    pub flags: EngineFlags,
    pub name: String,
    pub metrics: Arc<SimMetrics>,
    pub rooms: Arc<Rooms>,
    pub decode: Option<DecodeSide>,
    /// How long a prefill waits for the decode to pull (`SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`).
    pub bootstrap_timeout: Duration,
    pub server_info: Value,
    /// Bytes each of this node's prefill ranks has sent, by bootstrap row.
    pub sent: std::sync::Mutex<Vec<(Row, Arc<AtomicU64>)>>,
    slots: Arc<Semaphore>,
    prefill_lane: tokio::sync::Mutex<()>,
    kv_tokens: AtomicU64,
    next_id: AtomicU64,
}

impl Engine {
    pub fn new(role: Role, flags: EngineFlags, decode: Option<DecodeSide>, rooms: Arc<Rooms>, server_info: Value) -> Self {
        let name = flags::served_name(&flags);
        let slots = Arc::new(Semaphore::new(flags.max_running_requests.clamp(1, Semaphore::MAX_PERMITS as u64) as usize));
        let metrics = Arc::new(SimMetrics::new(&name, role.engine_type()));
        let bootstrap_timeout = env_secs("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300.0);
        Self {
            role,
            flags,
            name,
            metrics,
            rooms,
            decode,
            bootstrap_timeout,
            server_info,
            sent: std::sync::Mutex::default(),
            slots,
            prefill_lane: tokio::sync::Mutex::new(()),
            kv_tokens: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
        }
    }
}

/// A seconds value from SGLang's environment variable, else `default`.
pub fn env_secs(name: &str, default: f64) -> Duration {
    let v = std::env::var(name).ok().and_then(|v| v.parse::<f64>().ok()).filter(|v| v.is_finite() && *v >= 0.0);
    Duration::from_secs_f64(v.unwrap_or(default))
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default()
}

fn json_response(status: u16, v: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, JSON_TYPE)], v.to_string()).into_response()
}

/// A running slot: counted in `num_running_reqs` and `token_usage` until dropped.
struct Slot {
    engine: Arc<Engine>,
    tokens: u64,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.engine.metrics.running.dec();
        let left = self.engine.kv_tokens.fetch_sub(self.tokens, Ordering::Relaxed) - self.tokens;
        self.engine.metrics.token_usage.set(left as f64 / flags::defaults::KV_CAPACITY_TOKENS as f64);
    }
}

async fn admit(engine: &Arc<Engine>, tokens: u64) -> Slot {
    engine.metrics.queued.inc();
    let permit = engine.slots.clone().acquire_owned().await.expect("the slot semaphore is never closed");
    engine.metrics.queued.dec();
    engine.metrics.running.inc();
    let used = engine.kv_tokens.fetch_add(tokens, Ordering::Relaxed) + tokens;
    engine.metrics.token_usage.set(used as f64 / flags::defaults::KV_CAPACITY_TOKENS as f64);
    Slot { engine: engine.clone(), tokens, _permit: permit }
}

/// The prefill forward pass: prompts are computed one after another at the configured rate.
async fn compute_prompt(engine: &Engine, tokens: u64) {
    let rate = engine.flags.sim_prefill_tokens_per_s;
    if rate > 0.0 {
        let _lane = engine.prefill_lane.lock().await;
        tokio::time::sleep(Duration::from_secs_f64(tokens as f64 / rate)).await;
    }
}

/// Why a request did not produce tokens: HTTP status and message.
struct Abort(u16, String);

/// Everything before the first token: admission, prefill compute, KV hand-over.
async fn prepare(engine: &Arc<Engine>, req: &GenRequest, rid: &str) -> Result<Slot, Abort> {
    match engine.role {
        Role::Unified => {
            let slot = admit(engine, req.prompt_tokens).await;
            compute_prompt(engine, req.prompt_tokens).await;
            Ok(slot)
        }
        Role::Prefill => {
            let b = req.bootstrap.as_ref().ok_or_else(|| Abort(400, "A prefill server needs bootstrap_room in the request.".into()))?;
            let slot = admit(engine, req.prompt_tokens).await;
            compute_prompt(engine, req.prompt_tokens).await;
            engine.rooms.set_ready(b.room, req.prompt_tokens);
            // Answer once the KV is sent; a multi-node prefill's other nodes serve their own ranks.
            if engine.flags.nnodes <= 1 {
                engine.rooms.wait_pulled(b.room, engine.bootstrap_timeout).await.map_err(|e| Abort(500, e))?;
            }
            Ok(slot)
        }
        Role::Decode => {
            let b = req.bootstrap.as_ref().ok_or_else(|| Abort(400, "A decode server needs bootstrap_room in the request.".into()))?;
            let side = engine.decode.as_ref().ok_or_else(|| Abort(500, "decode side not configured".into()))?;
            side.receive(&engine.metrics, b, req.prompt_tokens, rid).await.map_err(|e| Abort(500, e))?;
            Ok(admit(engine, req.prompt_tokens).await)
        }
    }
}

/// Output tokens this role produces: a prefill returns the first token only.
fn output_tokens(role: Role, req: &GenRequest) -> u64 {
    if role == Role::Prefill { req.max_tokens.min(1) } else { req.max_tokens }
}

type SseSender = futures::channel::mpsc::Sender<Result<Bytes, Infallible>>;

/// Where tokens go: collected for a whole answer, or sent as events.
enum Out<'a> {
    Whole,
    Events { tx: &'a mut SseSender, api: Api, meta: &'a Meta, n: u64 },
}

impl Out<'_> {
    /// Sends token `i`; false when the client is gone.
    async fn emit(&mut self, text: &str, i: u64, token: &str) -> bool {
        match self {
            Out::Whole => true,
            Out::Events { tx, api, meta, n } => {
                let v = openai::chunk(*api, meta, token, text, i + 1, *api == Api::Generate && i + 1 == *n);
                tx.send(Ok(Bytes::from(openai::sse(&v)))).await.is_ok()
            }
        }
    }
}

/// Produces `n` tokens into `text` at the model's pace, passing each to `out`; stops early when
/// the client is gone. Returns the tokens produced.
async fn decode_tokens(engine: &Engine, seed: u64, n: u64, start: Instant, text: &mut String, mut out: Out<'_>) -> u64 {
    let stream = !matches!(out, Out::Whole);
    let m = &engine.metrics;
    let (mut last, mut due) = (Instant::now(), Instant::now());
    for i in 0..n {
        let step = step_time(&engine.flags, m.running.get());
        if i > 0 && !step.is_zero() {
            // Each token is due one step after the last one's due time: timer slack does not add
            // up over a stream.
            due += step;
            tokio::time::sleep_until(due.into()).await;
        }
        let now = Instant::now();
        if i == 0 {
            m.ttft.get_or_create(&SimMetrics::streaming(stream)).observe(now.duration_since(start).as_secs_f64());
        } else {
            m.itl.observe(now.duration_since(last).as_secs_f64());
        }
        last = now;
        m.generated.fetch_add(1, Ordering::Relaxed);
        let token = openai::token_text(seed, i);
        text.push_str(&token);
        if !out.emit(text, i, &token).await {
            m.aborted.inc();
            return i + 1;
        }
    }
    n
}

/// One decode step with `running` requests in the batch.
fn step_time(f: &EngineFlags, running: i64) -> Duration {
    let running = u32::try_from(running.max(0)).unwrap_or(u32::MAX);
    Duration::from_secs_f64((f.sim_itl_ms + f.sim_itl_ms_per_running * f64::from(running)) / 1e3)
}

fn count(engine: &Engine, req: &GenRequest, produced: u64, start: Instant) {
    let labels = SimMetrics::streaming(req.stream);
    let m = &engine.metrics;
    m.requests.get_or_create(&labels).inc();
    m.prompt_tokens.get_or_create(&labels).inc_by(req.prompt_tokens);
    m.generation_tokens.get_or_create(&labels).inc_by(produced);
    m.e2e.get_or_create(&labels).observe(start.elapsed().as_secs_f64());
}

async fn whole(engine: Arc<Engine>, req: GenRequest, meta: Meta, seed: u64, start: Instant, slot: Slot) -> Response {
    let n = output_tokens(engine.role, &req);
    let mut text = String::new();
    let produced = decode_tokens(&engine, seed, n, start, &mut text, Out::Whole).await;
    drop(slot);
    count(&engine, &req, produced, start);
    json_response(200, &openai::full(req.api, &meta, &text, produced, start.elapsed().as_secs_f64()))
}

fn streamed(engine: Arc<Engine>, req: GenRequest, meta: Meta, seed: u64, start: Instant, slot: Slot) -> Response {
    let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, Infallible>>(16);
    let span = tracing::Span::current();
    tokio::spawn(
        async move {
            let n = output_tokens(engine.role, &req);
            let mut text = String::new();
            let out = Out::Events { tx: &mut tx, api: req.api, meta: &meta, n };
            let produced = decode_tokens(&engine, seed, n, start, &mut text, out).await;
            drop(slot);
            if req.api != Api::Generate {
                let _ = tx.send(Ok(Bytes::from(openai::sse(&openai::chunk(req.api, &meta, "", &text, produced, true))))).await;
            }
            if let Some(u) = openai::usage_chunk(req.api, &meta, produced).filter(|_| req.include_usage) {
                let _ = tx.send(Ok(Bytes::from(openai::sse(&u)))).await;
            }
            let _ = tx.send(Ok(Bytes::from_static(openai::SSE_DONE.as_bytes()))).await;
            count(&engine, &req, produced, start);
        }
        .instrument(span),
    );
    (StatusCode::OK, [(header::CONTENT_TYPE, SSE_TYPE), (header::CACHE_CONTROL, "no-cache")], Body::from_stream(rx)).into_response()
}

async fn generate(engine: Arc<Engine>, api: Api, body: Bytes) -> Response {
    let start = Instant::now();
    let parsed = serde_json::from_slice::<Value>(&body).map_err(|e| e.to_string()).and_then(|v| openai::parse(api, &v));
    let req = match parsed {
        Ok(r) => r,
        Err(e) => return json_response(400, &openai::error(api, 400, &e)),
    };
    let n = engine.next_id.fetch_add(1, Ordering::Relaxed);
    let rid = format!("{:032x}", (u128::from(now_secs()) << 64) | u128::from(n));
    let room = req.bootstrap.as_ref().map(|b| b.room);
    let span = info_span!("request", %rid, ?room, role = engine.role.engine_type(), stream = req.stream);
    async move {
        let slot = match prepare(&engine, &req, &rid).await {
            Ok(s) => s,
            Err(Abort(status, msg)) => {
                tracing::warn!(%msg, "request aborted");
                engine.metrics.aborted.inc();
                return json_response(status, &openai::error(api, status, &msg));
            }
        };
        let prefix = if api == Api::Chat { "chatcmpl-" } else { "cmpl-" };
        let model = req.model.clone().unwrap_or_else(|| engine.name.clone());
        let meta = Meta { id: format!("{prefix}{rid}"), created: now_secs(), model, prompt_tokens: req.prompt_tokens };
        let seed = room.unwrap_or(n);
        if req.stream {
            streamed(engine.clone(), req, meta, seed, start, slot)
        } else {
            whole(engine.clone(), req, meta, seed, start, slot).await
        }
    }
    .instrument(span)
    .await
}

fn model_info(e: &Engine) -> Value {
    json!({"model_path": e.flags.model_path, "served_model_name": e.name, "tokenizer_path": e.flags.model_path,
        "is_generation": true, "preferred_sampling_params": null, "weight_version": "default", "load_format": "auto",
        "reasoning_parser": null, "tool_call_parser": null, "disaggregation_mode": e.flags.mode,
        "has_image_understanding": false, "has_audio_understanding": false, "model_type": null, "architectures": null})
}

fn server_info(e: &Engine) -> Value {
    let mut v = e.server_info.clone();
    if let Some(o) = v.as_object_mut() {
        o.insert("version".into(), SGLANG_VERSION.into());
        o.insert(
            "internal_states".into(),
            json!([{"num_running_reqs": e.metrics.running.get(), "num_queue_reqs": e.metrics.queued.get()}]),
        );
        o.insert("kv_transfers".into(), e.metrics.pairs_json());
        o.insert("kv_sources".into(), e.metrics.sources_json());
        let sent = e.sent.lock().unwrap_or_else(|p| p.into_inner());
        let rows = sent.iter().map(|((dp, cp, tp, pp), b)| {
            json!({"prefill_dp_rank": dp, "prefill_cp_rank": cp, "prefill_tp_rank": tp, "prefill_pp_rank": pp, "bytes": b.load(Ordering::Relaxed)})
        });
        o.insert("kv_sent".into(), Value::Array(rows.collect()));
    }
    v
}

fn models(e: &Engine) -> Value {
    json!({"object": "list", "data": [{"id": e.name, "object": "model", "created": now_secs(), "owned_by": "sglang",
        "root": e.flags.model_path, "parent": null, "max_model_len": null}]})
}

/// The serving routes, for every role.
pub fn router(engine: Arc<Engine>) -> Router {
    let gen_route = |api: Api| post(move |State(e): State<Arc<Engine>>, body: Bytes| generate(e, api, body));
    Router::new()
        .route("/generate", gen_route(Api::Generate))
        .route("/v1/completions", gen_route(Api::Completions))
        .route("/v1/chat/completions", gen_route(Api::Chat))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/health_generate", get(|| async { StatusCode::OK }))
        .route("/ready", get(|| async { StatusCode::OK }))
        .route("/v1/models", get(|State(e): State<Arc<Engine>>| async move { axum::Json(models(&e)) }))
        .route("/get_model_info", get(|State(e): State<Arc<Engine>>| async move { axum::Json(model_info(&e)) }))
        .route("/model_info", get(|State(e): State<Arc<Engine>>| async move { axum::Json(model_info(&e)) }))
        .route("/get_server_info", get(|State(e): State<Arc<Engine>>| async move { axum::Json(server_info(&e)) }))
        .route("/server_info", get(|State(e): State<Arc<Engine>>| async move { axum::Json(server_info(&e)) }))
        .route(
            "/metrics",
            get(|State(e): State<Arc<Engine>>| async move {
                ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], e.metrics.encode())
            }),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, JSON_TYPE)], r#"{"detail":"Not Found"}"#).into_response() })
        .with_state(engine)
}

/// Keeps `gen_throughput` current and old prefill rooms swept, until the process stops.
pub async fn housekeeping(engine: Arc<Engine>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last = 0;
    loop {
        tick.tick().await;
        engine.metrics.tick(&mut last, 1.0);
        engine.rooms.sweep(super::rooms::ROOM_KEEP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decode_step_grows_with_the_requests_running_beside_it() {
        let args: Vec<String> = ["--model-path", "m", "--sim-itl-ms", "10", "--sim-itl-ms-per-running", "1"].map(String::from).to_vec();
        let f = EngineFlags::parse(&args).unwrap();
        assert_eq!(step_time(&f, 0), Duration::from_millis(10));
        assert_eq!(step_time(&f, 30), Duration::from_millis(40));
        assert_eq!(step_time(&f, -1), Duration::from_millis(10), "a gauge below zero counts as none");
        let flat = EngineFlags::parse(&args[..4]).unwrap();
        assert_eq!(step_time(&flat, 30), Duration::from_millis(10), "without the flag the step is flat");
    }
}
