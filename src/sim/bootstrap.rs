//! A bootstrap server that answers like SGLang 0.5.23's `CommonKVBootstrapServer`: same routes,
//! statuses, texts, content types, first-writer-wins state and JSON bytes. The registry is pure;
//! `serve` puts it behind HTTP.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use pd_core::handshake::pyvalue;

pub const TEXT: &str = "text/plain; charset=utf-8";
pub const JSON: &str = "application/json; charset=utf-8";
const SERVER_ERROR: &str = "500 Internal Server Error\n\nServer got itself in trouble";
/// How long a room → DP rank entry lives (`SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL`).
pub const ROOM_TTL: Duration = Duration::from_secs(120);

/// One HTTP answer: status, content type and body bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    fn text(status: u16, body: impl Into<String>) -> Self {
        Self { status, content_type: TEXT, body: body.into() }
    }
    fn json(value: &Value) -> Self {
        Self { status: 200, content_type: JSON, body: pyvalue::dumps(value) }
    }
    /// aiohttp's answer to an exception in a handler.
    fn crash() -> Self {
        Self::text(500, SERVER_ERROR)
    }
}

/// A dict key as Python hashes it: `1`, `1.0` and `True` are the same key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Int(i64),
    Other(String),
}

impl Key {
    fn of(v: &Value) -> Self {
        match v {
            Value::Bool(b) => Key::Int(i64::from(*b)),
            Value::Number(n) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => Key::Int(i),
                (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.2e18 => Key::Int(f as i64),
                _ => Key::Other(n.to_string()),
            },
            other => Key::Other(other.to_string()),
        }
    }
}

/// Python's `a * b` for the sizes the readiness rule multiplies; `None` where Python would raise.
fn py_mul(values: &[&Value]) -> Option<i64> {
    values.iter().try_fold(1i64, |acc, v| {
        let n = match v {
            Value::Bool(b) => i64::from(*b),
            Value::Number(n) => n.as_i64()?,
            _ => return None,
        };
        acc.checked_mul(n)
    })
}

/// The server's state, as `CommonKVBootstrapServer` keeps it.
#[derive(Debug)]
pub struct Registry {
    attn_tp_size: Option<Value>,
    attn_cp_size: Option<Value>,
    dp_size: Option<Value>,
    pp_size: Option<Value>,
    page_size: Option<i64>,
    kv_cache_dtype: Option<Value>,
    kv_layout: Option<Value>,
    dsv41_spec_layout: Value,
    follow_bootstrap_room: Option<bool>,
    enable_dsa_cache_layer_split: Option<bool>,
    enable_kv_cache_sharding: Option<bool>,
    prefill_http_port: Option<i64>,
    decode_allocation_policy: Value,
    rows: HashMap<[Key; 4], (Value, i64)>,
    registered: u64,
    rooms: HashMap<i64, (i64, Instant)>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            attn_tp_size: None,
            attn_cp_size: None,
            dp_size: None,
            pp_size: None,
            page_size: None,
            kv_cache_dtype: None,
            kv_layout: None,
            dsv41_spec_layout: Value::Null,
            follow_bootstrap_room: None,
            enable_dsa_cache_layer_split: None,
            enable_kv_cache_sharding: None,
            prefill_http_port: None,
            decode_allocation_policy: Value::from("early"),
            rows: HashMap::new(),
            registered: 0,
            rooms: HashMap::new(),
        }
    }
}

fn set_once(slot: &mut Option<Value>, v: &Value) {
    if slot.is_none() {
        *slot = Some(v.clone());
    }
}

impl Registry {
    pub fn registered(&self) -> u64 {
        self.registered
    }

    /// `None` when Python would raise while checking readiness (non-integer sizes).
    fn ready(&self) -> Option<bool> {
        let (Some(tp), Some(cp), Some(pp), Some(dp)) = (&self.attn_tp_size, &self.attn_cp_size, &self.pp_size, &self.dp_size) else {
            return Some(false);
        };
        let expected = py_mul(&[dp, cp, tp, pp])?;
        Some(i128::from(self.registered) >= i128::from(expected))
    }

    fn not_ready(&self) -> Reply {
        Reply::text(503, format!("Prefill server not fully registered yet ({} workers registered).", self.registered))
    }

    /// `PUT /route` with a raw body.
    pub fn put_route(&mut self, body: &[u8]) -> Reply {
        let Ok(Value::Object(data)) = serde_json::from_slice::<Value>(body) else {
            return Reply::crash();
        };
        self.register(&data).unwrap_or_else(Reply::crash)
    }

    fn register(&mut self, data: &Map<String, Value>) -> Option<Reply> {
        let get = |k: &str| data.get(k);
        let (attn_tp_size, attn_tp_rank, attn_cp_size, attn_cp_rank) =
            (get("attn_tp_size")?, get("attn_tp_rank")?, get("attn_cp_size")?, get("attn_cp_rank")?);
        let (attn_dp_size, attn_dp_rank, pp_size, pp_rank) = (get("attn_dp_size")?, get("attn_dp_rank")?, get("pp_size")?, get("pp_rank")?);
        let (system_dp_size, system_dp_rank, rank_ip) = (get("system_dp_size")?, get("system_dp_rank")?, get("rank_ip")?);
        let rank_port = pyvalue::int(get("rank_port")?).ok()?;
        let page_size = pyvalue::int(get("page_size")?).ok()?;
        let kv_cache_dtype = get("kv_cache_dtype")?;
        let null = Value::Null;
        let kv_layout = get("kv_layout").unwrap_or(&null);
        let prefill_http_port = get("prefill_http_port").unwrap_or(&null);
        let dsv41 = get("dsv41_spec_layout").unwrap_or(&null);
        if self.registered > 0 && !pyvalue::eq(&self.dsv41_spec_layout, dsv41) {
            return Some(Reply::text(400, "DeepSeek-V4.1 DSpark PD layout differs across prefill ranks"));
        }
        let early = Value::from("early");
        let policy = get("decode_allocation_policy").unwrap_or(&early);
        if self.registered > 0 && !pyvalue::eq(&self.decode_allocation_policy, policy) {
            return Some(Reply::text(400, "Inconsistent prefill allocation policies"));
        }
        self.dsv41_spec_layout = dsv41.clone();
        self.decode_allocation_policy = policy.clone();
        set_once(&mut self.attn_tp_size, attn_tp_size);
        set_once(&mut self.attn_cp_size, attn_cp_size);
        let replica_dp = pyvalue::eq(system_dp_size, &Value::from(1));
        set_once(&mut self.dp_size, if replica_dp { attn_dp_size } else { system_dp_size });
        set_once(&mut self.pp_size, pp_size);
        self.page_size.get_or_insert(page_size);
        if !kv_cache_dtype.is_null() {
            set_once(&mut self.kv_cache_dtype, kv_cache_dtype);
        }
        if !kv_layout.is_null() {
            set_once(&mut self.kv_layout, kv_layout);
        }
        if self.prefill_http_port.is_none() && !prefill_http_port.is_null() {
            self.prefill_http_port = Some(pyvalue::int(prefill_http_port).ok()?);
        }
        if self.follow_bootstrap_room.is_none() {
            let method = get("load_balance_method").cloned().unwrap_or_else(|| Value::from("follow_bootstrap_room"));
            self.follow_bootstrap_room = Some(pyvalue::eq(&method, &Value::from("follow_bootstrap_room")));
        }
        if self.enable_dsa_cache_layer_split.is_none() {
            self.enable_dsa_cache_layer_split = Some(get("enable_dsa_cache_layer_split").is_some_and(pyvalue::truthy));
        }
        if self.enable_kv_cache_sharding.is_none() {
            self.enable_kv_cache_sharding = Some(get("enable_kv_cache_sharding").is_some_and(pyvalue::truthy));
        }
        let dp_group = if replica_dp { attn_dp_rank } else { system_dp_rank };
        self.rows.insert([Key::of(dp_group), Key::of(attn_cp_rank), Key::of(attn_tp_rank), Key::of(pp_rank)], (rank_ip.clone(), rank_port));
        self.registered += 1;
        // SGLang computes the expected count for its log line after storing the row; it raises
        // on sizes that do not multiply, so the PUT then fails although the row is kept.
        let sizes: Vec<&Value> = [&self.dp_size, &self.attn_cp_size, &self.attn_tp_size, &self.pp_size].into_iter().flatten().collect();
        py_mul(&sizes)?;
        Some(Reply::text(200, "OK"))
    }

    /// `GET /route` with the four query values as received (`None` when absent).
    pub fn get_route(&self, query: [Option<&str>; 4]) -> Reply {
        let [Some(dp), Some(cp), Some(tp), Some(pp)] = query else {
            return Reply::text(400, "Missing inputs for bootstrap server.");
        };
        if [dp, cp, tp, pp].iter().any(|v| v.is_empty()) {
            return Reply::text(400, "Missing inputs for bootstrap server.");
        }
        let mut ints = [0i64; 4];
        for (slot, raw) in ints.iter_mut().zip([dp, cp, tp, pp]) {
            match pyvalue::int(&Value::from(raw)) {
                Ok(i) => *slot = i,
                Err(_) => return Reply::crash(),
            }
        }
        let Some(ready) = self.ready() else { return Reply::crash() };
        if !ready {
            return self.not_ready();
        }
        if ints == [-1; 4] {
            return Reply::json(&self.topology());
        }
        match self.rows.get(&ints.map(Key::Int)) {
            Some((ip, port)) => Reply::json(&json!({"rank_ip": pyvalue::str(ip), "rank_port": port})),
            None => Reply::text(404, format!("Bootstrap info not found for dp_rank={dp} cp_rank={cp} tp_rank={tp} pp_rank={pp}")),
        }
    }

    /// The topology body, with `PrefillServerInfo`'s coercions applied and its field order.
    fn topology(&self) -> Value {
        let opt = |v: &Option<Value>| v.clone().unwrap_or(Value::Null);
        let int_field = |v: &Option<Value>| {
            let v = opt(v);
            pyvalue::int(&v).map(Value::from).unwrap_or(v)
        };
        let mut m = Map::new();
        m.insert("attn_tp_size".into(), int_field(&self.attn_tp_size));
        m.insert("attn_cp_size".into(), int_field(&self.attn_cp_size));
        m.insert("dp_size".into(), int_field(&self.dp_size));
        m.insert("pp_size".into(), int_field(&self.pp_size));
        m.insert("page_size".into(), self.page_size.map(Value::from).unwrap_or(Value::Null));
        m.insert("kv_cache_dtype".into(), self.kv_cache_dtype.as_ref().map(|v| Value::from(pyvalue::str(v))).unwrap_or(Value::Null));
        m.insert("follow_bootstrap_room".into(), Value::Bool(self.follow_bootstrap_room.unwrap_or(true)));
        m.insert("enable_dsa_cache_layer_split".into(), Value::Bool(self.enable_dsa_cache_layer_split.unwrap_or(false)));
        if !self.dsv41_spec_layout.is_null() {
            m.insert("dsv41_spec_layout".into(), self.dsv41_spec_layout.clone());
        }
        if let Some(layout) = &self.kv_layout {
            m.insert("kv_layout".into(), layout.clone());
        }
        m.insert("decode_allocation_policy".into(), self.decode_allocation_policy.clone());
        m.insert("enable_kv_cache_sharding".into(), Value::Bool(self.enable_kv_cache_sharding.unwrap_or(false)));
        m.insert("prefill_http_port".into(), self.prefill_http_port.map(Value::from).unwrap_or(Value::Null));
        // The decode-side scratch fields of the record, always null.
        for k in pd_core::handshake::core::decode_scratch_keys() {
            m.insert((*k).to_owned(), Value::Null);
        }
        Value::Object(m)
    }

    /// `POST /register_dp_rank`.
    pub fn register_dp_rank(&mut self, body: &[u8], now: Instant) -> Reply {
        let parsed = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
            let room = pyvalue::int(v.get("bootstrap_room")?).ok()?;
            let dp = pyvalue::int(v.get("dp_rank")?).ok()?;
            Some((room, dp))
        });
        match parsed {
            Some((room, dp)) => {
                self.rooms.insert(room, (dp, now));
                Reply::text(200, "OK")
            }
            None => Reply::crash(),
        }
    }

    /// `POST /query_dp_ranks`: known rooms only, keys as decimal strings.
    pub fn query_dp_ranks(&self, body: &[u8]) -> Reply {
        let Ok(v) = serde_json::from_slice::<Value>(body) else { return Reply::crash() };
        let Some(rooms) = v.get("bootstrap_rooms") else { return Reply::crash() };
        let items: Vec<Value> = match rooms {
            Value::Array(a) => a.clone(),
            Value::String(s) => s.chars().map(|c| Value::from(c.to_string())).collect(),
            Value::Object(o) => o.keys().map(|k| Value::from(k.as_str())).collect(),
            _ => return Reply::crash(),
        };
        let mut out = Map::new();
        for room in &items {
            let Ok(room) = pyvalue::int(room) else { return Reply::crash() };
            if let Some((dp, _)) = self.rooms.get(&room) {
                out.insert(room.to_string(), Value::from(*dp));
            }
        }
        Reply::json(&Value::Object(out))
    }

    /// Drops room entries older than `ttl`, as SGLang's periodic sweep does.
    pub fn expire_rooms(&mut self, now: Instant, ttl: Duration) {
        self.rooms.retain(|_, (_, at)| now.duration_since(*at) <= ttl);
    }
}

pub type SharedRegistry = Arc<Mutex<Registry>>;

fn lock(reg: &SharedRegistry) -> std::sync::MutexGuard<'_, Registry> {
    reg.lock().unwrap_or_else(|p| p.into_inner())
}

fn respond(r: Reply) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, r.content_type)], r.body).into_response()
}

/// Largest request body the stand-in reads; aiohttp's default `client_max_size` is 1 MiB.
const MAX_BODY: usize = 1 << 20;

async fn body_bytes(req: Request) -> Option<Bytes> {
    axum::body::to_bytes(req.into_body(), MAX_BODY).await.ok()
}

/// Routes of the bootstrap server. Handlers lock the registry only around pure calls.
async fn dispatch(State(reg): State<SharedRegistry>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let reply = match (path.as_str(), &method) {
        ("/route", &Method::PUT) => match body_bytes(req).await {
            Some(b) => lock(&reg).put_route(&b),
            None => Reply::text(413, "413: Request Entity Too Large"),
        },
        ("/route", &Method::GET) => {
            let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
            let first = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
            lock(&reg).get_route([first("prefill_dp_rank"), first("prefill_cp_rank"), first("target_tp_rank"), first("target_pp_rank")])
        }
        ("/route", _) => Reply { status: 405, content_type: JSON, body: "Method not allowed".into() },
        ("/health", &Method::GET | &Method::HEAD) => Reply::text(200, "OK"),
        ("/register_dp_rank", &Method::POST) => match body_bytes(req).await {
            Some(b) => lock(&reg).register_dp_rank(&b, Instant::now()),
            None => Reply::text(413, "413: Request Entity Too Large"),
        },
        ("/query_dp_ranks", &Method::POST) => match body_bytes(req).await {
            Some(b) => lock(&reg).query_dp_ranks(&b),
            None => Reply::text(413, "413: Request Entity Too Large"),
        },
        ("/health" | "/register_dp_rank" | "/query_dp_ranks", _) => Reply::text(405, "405: Method Not Allowed"),
        _ => Reply::text(404, "404: Not Found"),
    };
    respond(reply)
}

pub fn router(reg: SharedRegistry) -> Router {
    Router::new().fallback(dispatch).with_state(reg)
}

/// Serves the bootstrap server on `listener` until `shutdown` resolves; sweeps rooms meanwhile.
pub async fn serve(
    listener: tokio::net::TcpListener,
    reg: SharedRegistry,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let sweeper = {
        let reg = reg.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(ROOM_TTL);
            loop {
                tick.tick().await;
                lock(&reg).expire_rooms(Instant::now(), ROOM_TTL);
            }
        })
    };
    let result = axum::serve(listener, router(reg)).with_graceful_shutdown(shutdown).await;
    sweeper.abort();
    result
}
