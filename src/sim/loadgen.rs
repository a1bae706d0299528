//! `pd-sim bench`: a closed-loop load generator for the serving benchmark. `C` workers
//! each keep one connection and send chat completions back to back; streamed answers are timed
//! per event (TTFT, ITL). With `--prefill` and `--bootstrap` it plays the gateway itself: the same
//! stamped body goes to the prefill and the decode at once. Prints one JSON line. With `--rate`
//! it is the open loop of `openloop` instead.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::SimError;

#[derive(Clone, Debug)]
struct Config {
    target: String,
    model: String,
    prefill: Option<String>,
    bootstrap: Option<(String, u16)>,
    concurrency: u64,
    requests: u64,
    /// Stop sending after this long, even with requests left.
    seconds: Option<u64>,
    max_tokens: u64,
    prompt_bytes: usize,
    stream: bool,
}

fn parse(args: &[String]) -> Result<Config, SimError> {
    let mut c = Config {
        target: format!("127.0.0.1:{}", pd_api::DEFAULT_HTTP_PORT),
        model: "default".into(),
        prefill: None,
        bootstrap: None,
        concurrency: 8,
        requests: 1000,
        seconds: None,
        max_tokens: 16,
        prompt_bytes: 64,
        stream: false,
    };
    let mut it = args.iter();
    let bad = |f: &str, v: &str| SimError::Flags(format!("{f}: bad value {v:?}"));
    while let Some(a) = it.next() {
        if a == "--stream" {
            c.stream = true;
            continue;
        }
        let v = it.next().ok_or_else(|| SimError::Flags(format!("{a} expects a value")))?;
        match a.as_str() {
            "--target" => c.target = v.clone(),
            "--model" => c.model = v.clone(),
            "--prefill" => c.prefill = Some(v.clone()),
            "--bootstrap" => {
                let (h, p) = v.rsplit_once(':').ok_or_else(|| bad(a, v))?;
                c.bootstrap = Some((h.to_owned(), p.parse().map_err(|_| bad(a, v))?));
            }
            "--concurrency" => c.concurrency = v.parse().map_err(|_| bad(a, v))?,
            "--requests" => c.requests = v.parse().map_err(|_| bad(a, v))?,
            "--seconds" => c.seconds = Some(v.parse().map_err(|_| bad(a, v))?),
            "--max-tokens" => c.max_tokens = v.parse().map_err(|_| bad(a, v))?,
            "--prompt-bytes" => c.prompt_bytes = v.parse().map_err(|_| bad(a, v))?,
            _ => return Err(SimError::Flags(format!("unknown flag {a}"))),
        }
    }
    if c.prefill.is_some() != c.bootstrap.is_some() {
        return Err(SimError::Flags("--prefill and --bootstrap go together".into()));
    }
    Ok(c)
}

#[derive(Default)]
pub struct Sample {
    pub ok: bool,
    /// Why it failed: `connect`, `send`, `body` or `status <code> <cause>`, the cause read from
    /// the error body (the gateway's error code, e.g. smg's `no_available_workers`).
    pub error: Option<String>,
    /// When it ended.
    pub ended: Option<Instant>,
    /// Sent a second time: the server closed the connection under it without an answer.
    pub retried: bool,
    pub ttft: f64,
    pub itl: Vec<f64>,
    pub e2e: f64,
}

async fn connect(addr: &str) -> Option<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.ok()?;
    tokio::spawn(conn);
    Some(sender)
}

/// Sends one request on `conn` (connected). A request never written (the server closed the idle
/// keep-alive connection first) goes on a new connection; so does, once, a request the server
/// closed the connection on without answering: smg closes its idle keep-alive
/// connections when it shuts down, without a `Connection: close` first, so a request sent at that
/// instant is reset. OpenAI's SDKs send such a request again (`max_retries`, 2 by default); this
/// client does so once and says so (the `bool`: counted as `retried`, never as a success hidden).
async fn send(conn: &mut Option<SendRequest<Full<Bytes>>>, addr: &str, body: Bytes) -> (Option<hyper::Response<Incoming>>, bool) {
    let request = |body: Bytes| {
        hyper::Request::post("/v1/chat/completions")
            .header(hyper::header::HOST, addr)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .ok()
    };
    let (Some(sender), Some(req)) = (conn.as_mut(), request(body.clone())) else { return (None, false) };
    let (req, retried) = match sender.try_send_request(req).await {
        Ok(resp) => return (Some(resp), false),
        Err(mut e) => match e.take_message() {
            Some(unsent) => (Some(unsent), false),
            None => (request(body), true),
        },
    };
    *conn = connect(addr).await;
    let resp = match (conn.as_mut(), req) {
        (Some(fresh), Some(req)) => fresh.send_request(req).await.ok(),
        _ => None,
    };
    (resp, retried)
}

/// One request on `conn` (reconnecting when needed); event times are recorded for streams.
pub async fn one(conn: &mut Option<SendRequest<Full<Bytes>>>, addr: &str, body: Bytes, timed: bool) -> Sample {
    let start = Instant::now();
    let failed =
        |why: &str, retried: bool| Sample { error: Some(why.to_owned()), ended: Some(Instant::now()), retried, ..Sample::default() };
    if conn.as_ref().is_none_or(|c| c.is_closed()) {
        *conn = connect(addr).await;
        if conn.is_none() {
            return failed("connect", false);
        }
    }
    let (resp, retried) = send(conn, addr, body).await;
    let Some(resp) = resp else {
        *conn = None;
        return failed("send", retried);
    };
    let (ok, code) = (resp.status().is_success(), resp.status().as_u16());
    let (mut body, mut events, mut refusal) = (resp.into_body(), Vec::new(), Vec::new());
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { return failed("body", retried) };
        match frame.into_data() {
            Ok(data) if !ok && refusal.len() < 4096 => refusal.extend_from_slice(&data),
            Ok(data) if timed => {
                let at = start.elapsed().as_secs_f64();
                let n = data.windows(11).filter(|w| *w == b"\"content\":\"").count();
                events.extend(std::iter::repeat_n(at, n));
            }
            _ => {}
        }
    }
    let error = (!ok).then(|| format!("status {code} {}", cause(&refusal)));
    let itl = events.windows(2).map(|w| w[1] - w[0]).collect();
    let ttft = events.first().copied().unwrap_or_default();
    Sample { ok, error, ttft, itl, e2e: start.elapsed().as_secs_f64(), ended: Some(Instant::now()), retried }
}

/// What an error body says went wrong: its error code or type (OpenAI's and smg's shape), else
/// its first words.
fn cause(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or_default();
    let named = [&v["error"]["code"], &v["error"]["type"], &v["code"], &v["error"], &v["reason"]].into_iter().find_map(Value::as_str);
    let text = named.map_or_else(|| String::from_utf8_lossy(body).into_owned(), str::to_owned);
    text.chars().take(60).collect()
}

fn request_body(c: &Config, room: Option<u64>) -> Bytes {
    let prompt: String = "lorem ipsum ".chars().cycle().take(c.prompt_bytes).collect();
    let mut v =
        json!({"model": c.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": c.max_tokens, "stream": c.stream});
    if let (Some(room), Some((h, p))) = (room, &c.bootstrap) {
        v["bootstrap_host"] = h.as_str().into();
        v["bootstrap_port"] = (*p).into();
        v["bootstrap_room"] = room.into();
    }
    Bytes::from(v.to_string())
}

async fn worker(c: Arc<Config>, next: Arc<AtomicU64>, out: Arc<Mutex<Vec<Sample>>>) {
    let (mut main, mut pre) = (None, None);
    let until = c.seconds.map(|s| Instant::now() + Duration::from_secs(s));
    while until.is_none_or(|t| Instant::now() < t) && next.fetch_add(1, Ordering::Relaxed) < c.requests {
        let sample = match &c.prefill {
            None => one(&mut main, &c.target, request_body(&c, None), c.stream).await,
            Some(p) => {
                let body = request_body(&c, Some(rand::random::<u64>() >> 1));
                let (d, pf) = tokio::join!(one(&mut main, &c.target, body.clone(), c.stream), one(&mut pre, p, body, false));
                let (mut d, pf) = (d, pf);
                let error = d.error.take().or(pf.error);
                Sample { ok: d.ok && pf.ok, error, ..d }
            }
        };
        out.lock().unwrap_or_else(|p| p.into_inner()).push(sample);
    }
}

pub fn pct(v: &mut [f64], p: usize) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[(v.len() * p / 100).min(v.len() - 1)]
}

/// How many failed requests each error names, as the report's `errors` object.
pub fn error_counts<'a>(samples: impl Iterator<Item = &'a Sample>) -> serde_json::Map<String, Value> {
    let mut errors = serde_json::Map::new();
    for why in samples.filter_map(|s| s.error.as_deref()) {
        let n = errors.get(why).and_then(Value::as_u64).unwrap_or(0);
        errors.insert(why.to_owned(), (n + 1).into());
    }
    errors
}

fn report(c: &Config, samples: &[Sample], start: Instant) -> Value {
    let secs = start.elapsed().as_secs_f64();
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
    let mut ttft: Vec<f64> = ok.iter().map(|s| s.ttft).collect();
    let mut itl: Vec<f64> = ok.iter().flat_map(|s| s.itl.iter().copied()).collect();
    let mut e2e: Vec<f64> = ok.iter().map(|s| s.e2e).collect();
    let ms = |x: f64| (x * 1e5).round() / 1e2;
    let errors = error_counts(samples.iter());
    // When, in seconds from the start, the first and the last failed request ended.
    let failed_at: Vec<f64> = samples
        .iter()
        .filter(|s| !s.ok)
        .filter_map(|s| s.ended)
        .map(|t| (t.duration_since(start).as_secs_f64() * 10.0).round() / 10.0)
        .collect();
    let window = failed_at.iter().copied().reduce(f64::min).zip(failed_at.iter().copied().reduce(f64::max));
    json!({
        "errors": errors, "failed_between_s": window.map(|(a, b)| vec![a, b]),
        "concurrency": c.concurrency, "requests": samples.len(), "failed": samples.len() - ok.len(),
        "retried": samples.iter().filter(|s| s.retried).count(), "stream": c.stream,
        "max_tokens": c.max_tokens, "prompt_bytes": c.prompt_bytes, "seconds": (secs * 1e3).round() / 1e3,
        "requests_per_s": (ok.len() as f64 / secs * 10.0).round() / 10.0,
        "ttft_ms_p50": ms(pct(&mut ttft, 50)), "ttft_ms_p99": ms(pct(&mut ttft, 99)),
        "itl_ms_p50": ms(pct(&mut itl, 50)), "itl_ms_p99": ms(pct(&mut itl, 99)),
        "e2e_ms_p50": ms(pct(&mut e2e, 50)), "e2e_ms_p99": ms(pct(&mut e2e, 99)),
    })
}

/// Runs the load and prints the summary line.
/// How long the generator waits for the target to accept a connection before it starts: a pod
/// just started may not be reachable yet (a NetworkPolicy plugin admits a new pod's address only
/// once it has seen the pod). The run itself counts every failure.
const REACHABLE_WITHIN: Duration = Duration::from_secs(30);

/// Waits until `target` accepts a TCP connection (at most `REACHABLE_WITHIN`; then the run goes on
/// and its failures show why).
pub async fn reachable(target: &str) {
    let deadline = Instant::now() + REACHABLE_WITHIN;
    while Instant::now() < deadline {
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(target)).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tracing::warn!(%target, "the target does not accept connections; measuring anyway");
}

pub async fn run(args: &[String]) -> Result<(), SimError> {
    if args.iter().any(|a| a == "--rate") {
        return super::openloop::run(args).await;
    }
    let c = Arc::new(parse(args)?);
    reachable(&c.target).await;
    let (next, out) = (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(Vec::new())));
    let start = Instant::now();
    let workers: Vec<_> = (0..c.concurrency.max(1)).map(|_| tokio::spawn(worker(c.clone(), next.clone(), out.clone()))).collect();
    futures::future::join_all(workers).await;
    let samples = std::mem::take(&mut *out.lock().unwrap_or_else(|p| p.into_inner()));
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", report(&c, &samples, start)).and_then(|()| stdout.flush()).map_err(SimError::Output)
}

#[cfg(test)]
mod tests {
    use super::{Bytes, cause, connect, one};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";

    /// Reads one request (small, in one read) and answers it unless `answer` is false, in which
    /// case the connection is closed under the request, as smg does to its idle connections when
    /// it shuts down.
    async fn serve_one(s: &mut tokio::net::TcpStream, answer: bool) {
        let mut buf = [0u8; 4096];
        assert!(s.read(&mut buf).await.unwrap() > 0);
        if answer {
            s.write_all(ANSWER).await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_request_cut_off_by_a_closing_keep_alive_connection_is_sent_again_once_and_counted() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut first, _) = listener.accept().await.unwrap();
            serve_one(&mut first, true).await;
            serve_one(&mut first, false).await;
            drop(first);
            let (mut second, _) = listener.accept().await.unwrap();
            serve_one(&mut second, true).await;
            serve_one(&mut second, false).await;
            drop(second);
            // No third connection is answered: a request cut off twice fails.
            let (mut third, _) = listener.accept().await.unwrap();
            serve_one(&mut third, false).await;
        });
        let mut conn = connect(&addr).await;
        let body = || Bytes::from_static(b"{}");
        let plain = one(&mut conn, &addr, body(), false).await;
        assert!(plain.ok && !plain.retried, "{:?}", plain.error);
        let cut = one(&mut conn, &addr, body(), false).await;
        assert!(cut.ok && cut.retried, "the cut-off request: {:?}", cut.error);
        let twice = one(&mut conn, &addr, body(), false).await;
        assert_eq!((twice.ok, twice.retried, twice.error.as_deref()), (false, true, Some("send")));
        server.await.unwrap();
    }

    #[test]
    fn a_refusal_is_named_by_its_error_code_or_its_first_words() {
        let openai_style = br#"{"error":{"type":"service_unavailable","code":"no_available_workers","message":"No available workers"}}"#;
        assert_eq!(cause(openai_style), "no_available_workers");
        assert_eq!(cause(br#"{"reason":"insufficient healthy workers"}"#), "insufficient healthy workers");
        assert_eq!(cause(b"upstream connect error"), "upstream connect error");
        assert_eq!(cause(&[b'x'; 100]).len(), 60);
    }
}
