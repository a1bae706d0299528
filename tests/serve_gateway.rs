//! Requests end to end on loopback, no cluster: SGLang's model gateway (PyPI `smg`, from the
//! venv hack/smg-venv.sh caches) in PD mode in front of a stand-in prefill and decode. The
//! gateway stamps bootstrap host, port and room; the decode resolves the prefill, each decode rank
//! pulls its KV share from the prefill ranks the rank map names, then streams tokens.

use pd_testing as common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Background, free_port, repo_path};
use pd_runtime::http_client;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(30);
const PROMPT: &str = "Explain prefill/decode disaggregation in one sentence.";

/// The gateway's python. A venv that cannot be built fails the test loudly: it never passes
/// without having run the gateway.
fn smg_python() -> PathBuf {
    if let Ok(p) = std::env::var("PD_SMG_PYTHON") {
        return PathBuf::from(p);
    }
    let o = Command::new(repo_path("hack/smg-venv.sh")).output().expect("run hack/smg-venv.sh");
    assert!(
        o.status.success(),
        "GATEWAY TEST NOT RUN: hack/smg-venv.sh could not install smg 1.13.0 from PyPI (set PD_SMG_PYTHON to a python with smg):\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    PathBuf::from(out.lines().last().unwrap_or_default().trim())
}

struct Pair {
    _prefill: Background,
    _decode: Background,
    prefill_http: u16,
    bootstrap: u16,
    decode_http: u16,
}

/// A GQA prefill at TP4 and a decode at TP2: decode rank e reads prefill ranks 2e and 2e+1.
fn start_pair(prefill_extra: &[&str], env: &[(&str, &str)]) -> Pair {
    start_pair_with(("4", "2"), &[], prefill_extra, env)
}

fn start_pair_with(tp: (&str, &str), both: &[&str], prefill_extra: &[&str], env: &[(&str, &str)]) -> Pair {
    let (prefill_http, bootstrap, decode_http) = (free_port(), free_port(), free_port());
    let (ph, b, dh) = (prefill_http.to_string(), bootstrap.to_string(), decode_http.to_string());
    let common = ["--model-path", "sim-model", "--host", "127.0.0.1", "--sim-itl-ms", "2", "--sim-prefill-tokens-per-s", "200000"];
    let mut pargs = vec!["prefill", "--tp-size", tp.0, "--port", &ph, "--disaggregation-bootstrap-port", &b];
    pargs.extend(common);
    pargs.extend(both);
    pargs.extend(prefill_extra);
    let mut dargs = vec!["decode", "--tp-size", tp.1, "--port", &dh];
    dargs.extend(common);
    dargs.extend(both);
    let spawn = |name: &str, args: &[&str]| {
        let mut cmd = Command::new(common::bin("pd-sim"));
        cmd.args(args).env("PD_LOG_LEVEL", "info,pd_sim=debug").envs(env.iter().copied());
        Background::spawn(name, &mut cmd)
    };
    let (prefill, decode) = (spawn("serve-prefill", &pargs), spawn("serve-decode", &dargs));
    prefill.wait_port(prefill_http);
    decode.wait_port(decode_http);
    Pair { _prefill: prefill, _decode: decode, prefill_http, bootstrap, decode_http }
}

fn addr(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

async fn post(port: u16, path: &str, body: &Value) -> (u16, String) {
    match http_client::send(hyper::Method::POST, &addr(port), path, Some(body.to_string().into_bytes()), TIMEOUT, 16 << 20).await {
        Ok(r) => (r.status, r.text()),
        Err(e) => (0, e.to_string()),
    }
}

async fn get_json(port: u16, path: &str) -> Value {
    let r = http_client::send(hyper::Method::GET, &addr(port), path, None, TIMEOUT, 16 << 20).await.expect("GET");
    serde_json::from_slice(&r.body).unwrap_or(Value::Null)
}

fn chat(max_tokens: u64, stream: bool) -> Value {
    json!({"model": "sim-model", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "stream": stream})
}

fn start_gateway(py: &PathBuf, pair: &Pair) -> (Background, u16) {
    let (port, metrics) = (free_port(), free_port());
    let gw = Background::spawn(
        "smg",
        Command::new(py).args(["-m", "smg.launch_router", "--pd-disaggregation"]).args([
            "--prefill",
            &format!("http://127.0.0.1:{}", pair.prefill_http),
            &pair.bootstrap.to_string(),
            "--decode",
            &format!("http://127.0.0.1:{}", pair.decode_http),
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--prometheus-port",
            &metrics.to_string(),
        ]),
    );
    gw.wait_port(port);
    (gw, port)
}

/// The gateway answers once it has activated both workers.
async fn first_completion(gw: &Background, port: u16) -> Value {
    let start = Instant::now();
    loop {
        let (status, body) = post(port, "/v1/chat/completions", &chat(4, false)).await;
        if status == 200 {
            return serde_json::from_str(&body).expect("a JSON completion");
        }
        assert!(start.elapsed() < Duration::from_secs(90), "gateway never served a completion: {status} {body}\n{}", gw.log_text());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn sse_events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateway_prefill_decode_answer_chat_streamed_and_not_with_transfers_along_the_rank_map() {
    let py = smg_python();
    let pair = start_pair(&[], &[]);
    let (gw, port) = start_gateway(&py, &pair);

    let whole = first_completion(&gw, port).await;
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["usage"]["completion_tokens"], 4, "{whole}");
    assert!(!whole["choices"][0]["message"]["content"].as_str().unwrap_or_default().is_empty());

    let (status, body) = post(port, "/v1/chat/completions", &chat(5, true)).await;
    assert_eq!(status, 200, "{body}");
    let events = sse_events(&body);
    let deltas = events.iter().filter(|e| e["choices"][0]["delta"]["content"].is_string()).count();
    assert_eq!(deltas, 5, "{body}");
    assert_eq!(events.last().unwrap()["choices"][0]["finish_reason"], "length");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");

    let n = 64;
    let bodies: Vec<Value> = (0..n).map(|i| chat(8, i % 2 == 0)).collect();
    let answers = futures::future::join_all(bodies.iter().map(|b| post(port, "/v1/chat/completions", b))).await;
    let failed: Vec<_> = answers.iter().filter(|(s, _)| *s != 200).collect();
    assert!(failed.is_empty(), "{} of {n} concurrent requests failed, e.g. {:?}", failed.len(), failed.first());

    // Every request the decode served moved KV from exactly the rows its rank map names.
    let metrics = get_json(pair.decode_http, "/get_server_info").await;
    let served = {
        let text = http_client::send(hyper::Method::GET, &addr(pair.decode_http), "/metrics", None, TIMEOUT, 1 << 20).await.unwrap().text();
        text.lines()
            .filter(|l| l.starts_with("sglang:num_requests_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>()
    };
    assert!(served >= n + 2, "decode served {served}");
    let prompt_tokens = whole["usage"]["prompt_tokens"].as_u64().unwrap();
    // One prefill rank holds 2 of the 8 KV heads: 32 layers x K,V x 2 heads x 128 x bf16.
    let per_pull = prompt_tokens * 32 * 2 * 2 * 128 * 2;
    let rows = metrics["kv_transfers"].as_array().expect("kv_transfers").clone();
    let pairs: Vec<(i64, i64)> =
        rows.iter().map(|r| (r["decode_engine_rank"].as_i64().unwrap(), r["prefill_tp_rank"].as_i64().unwrap())).collect();
    assert_eq!(pairs, [(0, 0), (0, 1), (1, 2), (1, 3)], "{rows:?}");
    for r in &rows {
        assert_eq!(r["pulls"].as_u64(), Some(served), "{r}");
        assert_eq!(r["bytes"].as_u64(), Some(served * per_pull), "{r}");
    }
}

/// The test plays the gateway: the same body, stamped, to both at once.
async fn paired(pair: &Pair, room: u64) -> ((u16, String), (u16, String)) {
    let mut body = chat(3, false);
    body["bootstrap_host"] = "127.0.0.1".into();
    body["bootstrap_port"] = pair.bootstrap.into();
    body["bootstrap_room"] = room.into();
    tokio::join!(post(pair.prefill_http, "/v1/chat/completions", &body), post(pair.decode_http, "/v1/chat/completions", &body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_that_dies_mid_transfer_fails_the_request_with_sglangs_text() {
    let pair = start_pair(&["--sim-fault-die-mid-transfer", "5"], &[]);
    let (p, d) = paired(&pair, 11).await;
    assert_eq!((p.0, d.0), (200, 200), "{p:?} {d:?}");
    let (_, d) = paired(&pair, 12).await;
    assert_eq!(d.0, 500, "{d:?}");
    let msg = serde_json::from_str::<Value>(&d.1).unwrap()["message"].as_str().unwrap_or_default().to_owned();
    assert!(msg.starts_with("Decode transfer failed for request rank="), "{msg}");
    assert!(msg.contains("decode_req.req.bootstrap_room=12 with exception connection to prefill rank"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_transfers_time_out_on_both_sides_with_sglangs_texts() {
    let env = [("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "1"), ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "2")];
    let pair = start_pair(&["--sim-fault-stall-transfers"], &env);
    let (p, d) = paired(&pair, 21).await;
    let message = |body: &str| serde_json::from_str::<Value>(body).unwrap()["message"].as_str().unwrap_or_default().to_owned();
    assert_eq!((p.0, d.0), (500, 500), "{p:?} {d:?}");
    assert!(message(&d.1).starts_with("Request 21 timed out after 1.0s in KVPoll.WaitingForInput"), "{d:?}");
    assert!(message(&p.1).starts_with("Request 21 timed out after 2.0s in KVPoll.Bootstrapping"), "{p:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mla_decode_reads_one_real_prefill_rank_and_registers_with_the_dummies() {
    // DeepSeek-V3 by its catalogue name: an MLA pool. Prefill TP8 -> decode TP2: decode rank e
    // looks up prefill ranks 4e..4e+3; only 4e sends KV (the latent is the same on every rank).
    let pair = start_pair_with(("8", "2"), &["--model-path", "deepseek-ai/DeepSeek-V3"], &[], &[]);
    let (p, d) = paired(&pair, 31).await;
    assert_eq!((p.0, d.0), (200, 200), "{p:?} {d:?}");
    let prompt_tokens = serde_json::from_str::<Value>(&d.1).unwrap()["usage"]["prompt_tokens"].as_u64().unwrap();
    let info = get_json(pair.decode_http, "/get_server_info").await;
    let rows: Vec<(i64, i64, u64)> = info["kv_transfers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["decode_engine_rank"].as_i64().unwrap(), r["prefill_tp_rank"].as_i64().unwrap(), r["bytes"].as_u64().unwrap()))
        .collect();
    // 61 layers x 576 latent x bf16 a token.
    let latent = prompt_tokens * 61 * 576 * 2;
    let want: Vec<(i64, i64, u64)> = (0..2).flat_map(|e| (0..4).map(move |k| (e, 4 * e + k, if k == 0 { latent } else { 0 }))).collect();
    assert_eq!(rows, want);
    // The prefill's own counters agree: ranks 0 and 4 sent the latent, the others nothing.
    let sent = get_json(pair.prefill_http, "/get_server_info").await;
    let by_rank: Vec<(i64, u64)> = sent["kv_sent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["prefill_tp_rank"].as_i64().unwrap(), r["bytes"].as_u64().unwrap()))
        .collect();
    let want: Vec<(i64, u64)> = (0..8).map(|t| (t, if t % 4 == 0 { latent } else { 0 })).collect();
    assert_eq!(by_rank, want);
}

/// The router argv the operator renders, read back by smg 1.13.0's own argument parser: every
/// flag exists, and discovery, namespace, port and both role selectors land where smg reads them.
#[test]
fn smg_parses_the_rendered_router_argv_as_pd_discovery() {
    let py = smg_python();
    let pdd: pd_api::PDDeployment = serde_norway::from_str(
        "apiVersion: pd.inference.dev/v1alpha1\nkind: PDDeployment\nmetadata: {name: dsv3, namespace: ml}\nspec:\n  model: {path: deepseek-ai/DeepSeek-V3}\n  kvTransfer: {pageSize: 64}\n  prefill: {parallelism: {tp: 8}}\n  decode: {parallelism: {tp: 8}}\n  router: {policy: round_robin}\n",
    )
    .expect("a PDDeployment");
    let args = pd_core::render::router_args(&pdd.spec, "dsv3", "ml", 2);
    let script = "import json, sys\nfrom smg.launch_router import parse_router_args\na = parse_router_args(sys.argv[1:])\nprint(json.dumps({k: getattr(a, k) for k in ['pd_disaggregation', 'service_discovery_namespace', 'service_discovery_port', 'prefill_selector', 'decode_selector', 'bootstrap_port_annotation', 'port', 'policy', 'prefill_urls', 'decode_urls', 'prometheus_host', 'prometheus_port']} | {'provider': a.selected_discovery_provider()}))";
    let o = Command::new(&py).arg("-c").arg(script).args(&args).output().expect("run smg's parser");
    assert!(o.status.success(), "smg refused {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    let got: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let selector = |role: &str| json!({"pd.inference.dev/deployment": "dsv3", "pd.inference.dev/role": role, "pd.inference.dev/node-rank": "0", "pd.inference.dev/serving": "true", "pd.inference.dev/kv-set": "2"});
    assert_eq!(
        got,
        json!({
            "pd_disaggregation": true, "provider": "kubernetes", "service_discovery_namespace": "ml",
            "service_discovery_port": pd_api::DEFAULT_HTTP_PORT, "prefill_selector": selector("prefill"),
            "decode_selector": selector("decode"), "bootstrap_port_annotation": pd_core::render::BOOTSTRAP_PORT_ANNOTATION,
            "port": pd_api::DEFAULT_ROUTER_PORT, "policy": "round_robin", "prefill_urls": [], "decode_urls": [],
            "prometheus_host": "0.0.0.0", "prometheus_port": pd_core::render::ROUTER_METRICS_PORT,
        })
    );
}

/// What a request sees while a role is scaled to zero (`spec.scaling.<role>.minReplicas: 0`,
/// docs/scaling.md): the gateway stays up and answers at once with 503 `no_available_workers`
/// naming the missing role; nothing is queued. Here decode has no worker, as when its pods are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_decode_worker_the_gateway_answers_503_naming_the_role() {
    let py = smg_python();
    let pair = start_pair(&[], &[]);
    let (port, metrics) = (free_port(), free_port());
    let gw = Background::spawn(
        "smg-no-decode",
        Command::new(&py).args(["-m", "smg.launch_router", "--pd-disaggregation"]).args([
            "--prefill",
            &format!("http://127.0.0.1:{}", pair.prefill_http),
            &pair.bootstrap.to_string(),
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--prometheus-port",
            &metrics.to_string(),
        ]),
    );
    gw.wait_port(port);
    let start = Instant::now();
    let (status, body) = loop {
        let (status, body) = post(port, "/v1/chat/completions", &chat(4, false)).await;
        // Until the prefill is activated the gateway names the prefill; then the decode.
        if status == 503 && body.contains("decode") {
            break (status, body);
        }
        assert!(start.elapsed() < Duration::from_secs(60), "never answered for the missing decode: {status} {body}\n{}", gw.log_text());
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let answer: Value = serde_json::from_str(&body).expect("a JSON error");
    assert_eq!((status, answer["error"]["code"].as_str()), (503, Some("no_available_workers")), "{body}");
    let asked = Instant::now();
    let (again, _) = post(port, "/v1/chat/completions", &chat(4, false)).await;
    assert_eq!(again, 503);
    assert!(asked.elapsed() < Duration::from_secs(2), "the answer is immediate, not queued: {:?}", asked.elapsed());
}
