//! Interop with the real SGLang 0.5.23 bootstrap server, loaded from the pinned wheel (installed
//! without dependencies by hack/sglang-venv.sh; no SGLang code lives in this repository).

use pd_testing as common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{Background, free_port, operator, repo_path};
use pd_runtime::http_client;
use serde_json::{Value, json};

fn sglang_python() -> PathBuf {
    if let Ok(p) = std::env::var("PD_SGLANG_PYTHON") {
        return PathBuf::from(p);
    }
    let o = Command::new(repo_path("hack/sglang-venv.sh")).output().expect("run hack/sglang-venv.sh");
    assert!(o.status.success(), "hack/sglang-venv.sh failed:\n{}", String::from_utf8_lossy(&o.stderr));
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}

fn harness() -> PathBuf {
    repo_path("tests/interop/sglang_harness.py")
}

/// SGLang's own `CommonKVBootstrapServer` on a free port.
fn sglang_server() -> (Background, u16) {
    let port = free_port();
    let server = Background::spawn("sglang-bootstrap", Command::new(sglang_python()).arg(harness()).args(["serve", &port.to_string()]));
    server.wait_port(port);
    (server, port)
}

/// Our stand-in prefill; `extra` adds flags.
fn sim_prefill(extra: &[&str]) -> (Background, u16) {
    let (bootstrap, http) = (free_port(), free_port());
    let mut args = vec!["prefill", "--host", "127.0.0.1"];
    let (b, h) = (bootstrap.to_string(), http.to_string());
    args.extend(["--disaggregation-bootstrap-port", &b, "--port", &h]);
    args.extend(extra);
    let p = Background::sim("sim-prefill", &args);
    p.wait_port(bootstrap);
    (p, bootstrap)
}

/// A prefill node that only registers its ranks (no bootstrap server of its own) with the
/// bootstrap server on `port`, as the non-leader nodes of a multi-node prefill do.
fn registrar(port: u16, topology: &[&str]) -> Background {
    let (p, http) = (port.to_string(), free_port().to_string());
    let mut args = vec!["prefill", "--sim-bootstrap-server", "false", "--dist-init-addr", "127.0.0.1:5000"];
    args.extend(["--disaggregation-bootstrap-port", &p, "--port", &http]);
    args.extend(topology);
    Background::sim("sim-registrar", &args)
}

fn decode_file(json: Value) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), json.to_string()).unwrap();
    f
}

fn once(decode: &tempfile::NamedTempFile, addr: &str, timeout: &str) -> (i32, Value, String) {
    let (code, out, err) =
        operator(&["handshake", "run", "--once", "--timeout", timeout, "--decode", decode.path().to_str().unwrap(), "--prefill", addr]);
    let report = serde_json::from_str(&out).unwrap_or_else(|e| panic!("report is not JSON ({e}): {out}\n{err}"));
    (code, report, err)
}

#[test]
fn sidecar_passes_against_sglangs_server_with_ranks_registered_by_real_puts() {
    let (_server, port) = sglang_server();
    // A prefill node that only registers (its node 0 would serve the bootstrap server): our
    // stand-in's PUT /route bodies go to SGLang's server, which must accept all 8.
    let _ranks = registrar(port, &["--tp-size", "8", "--page-size", "64", "--kv-cache-dtype", "fp8_e4m3"]);
    let addr = format!("127.0.0.1:{port}");
    let mla = decode_file(json!({"attn_tp_size": 4, "page_size": 64, "kv_cache_dtype": "fp8_e4m3", "kv_pool": "mla"}));
    let (code, report, err) = once(&mla, &addr, "60s");
    assert_eq!(code, 0, "{report}\n{err}");
    let prefill = &report["prefill"][0];
    assert_eq!(prefill["info"]["attn_tp_size"], 8);
    assert_eq!(prefill["ranks"].as_array().unwrap().len(), 4);
    // MLA, decode TP4 vs prefill TP8: decode rank 1 reads prefill ranks 2 and 3.
    assert_eq!(prefill["ranks"][1]["target_tp_ranks"], json!([2, 3]));
    assert_eq!(prefill["ranks"][1]["required_prefill_response_num"], 1);
    assert_eq!(prefill["unreachable_ranks"], json!([]));

    let wrong_page = decode_file(json!({"attn_tp_size": 4, "page_size": 32, "kv_cache_dtype": "fp8_e4m3", "kv_pool": "mla"}));
    let (code, report, _) = once(&wrong_page, &addr, "30s");
    assert_eq!(code, 1, "{report}");
    assert_eq!(
        report["prefill"][0]["error"],
        "Page size mismatch: prefill server has page_size=64, but decode server has page_size=32. Both servers must use the same --page-size value."
    );
    let gqa_dcp = decode_file(json!({"attn_tp_size": 4, "dcp_size": 2, "page_size": 64, "kv_cache_dtype": "fp8_e4m3", "kv_pool": "mha"}));
    let (code, report, _) = once(&gqa_dcp, &addr, "30s");
    assert_eq!((code, report["prefill"][0]["error"].as_str()), (1, Some("PD decode DCP requires an MLA or hybrid-MLA KV pool.")));
}

#[test]
fn sidecar_waits_for_registration_and_flags_ranks_nobody_listens_on() {
    let (_server, port) = sglang_server();
    let addr = format!("127.0.0.1:{port}");
    // 2 of 4 ranks hold back: SGLang answers 503 and the sidecar keeps waiting, then times out.
    let _ranks = registrar(port, &["--tp-size", "4", "--page-size", "16", "--sim-hold-registrations", "2"]);
    let d = decode_file(json!({"attn_tp_size": 4, "page_size": 16, "kv_cache_dtype": "auto", "kv_pool": "mha"}));
    let (code, report, _) = once(&d, &addr, "4s");
    assert_eq!(code, 3, "{report}");
    assert_eq!(report["prefill"][0]["reason"], "Registering");
    assert_eq!(report["prefill"][0]["error"], "Prefill server not fully registered yet (2 workers registered).");

    // Register the two missing rows by hand, pointing at a port where nothing listens.
    let dead = free_port();
    for tp in [2, 3] {
        let body = json!({"attn_tp_size": 4, "attn_tp_rank": tp, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1, "attn_dp_rank": 0,
            "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0, "rank_ip": "127.0.0.1", "rank_port": dead,
            "page_size": 16, "kv_cache_dtype": "auto", "kv_layout": null, "dsv41_spec_layout": null, "load_balance_method": "follow_bootstrap_room",
            "enable_dsa_cache_layer_split": false, "enable_kv_cache_sharding": false, "prefill_http_port": 30000, "decode_allocation_policy": "early"});
        let r = block_on(http_client::send(
            hyper::Method::PUT,
            &addr,
            "/route",
            Some(body.to_string().into_bytes()),
            Duration::from_secs(5),
            4096,
        ))
        .unwrap();
        assert_eq!(r.status, 200);
    }
    let (code, report, _) = once(&d, &addr, "30s");
    assert_eq!(code, 1, "{report}");
    let entry = &report["prefill"][0];
    assert_eq!(entry["reason"], "PrefillRankUnreachable");
    assert_eq!(entry["unreachable_ranks"].as_array().unwrap().len(), 2, "{entry}");
    assert!(entry["unreachable_ranks"][0].as_str().unwrap().starts_with("dp0/cp0/tp2/pp0 127.0.0.1:"), "{entry}");
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

fn row(tp: i64, extra: Value) -> Value {
    let mut body = json!({"attn_tp_size": 2, "attn_tp_rank": tp, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1, "attn_dp_rank": 0,
        "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0, "rank_ip": "10.1.2.3", "rank_port": 40000 + tp,
        "page_size": 64, "kv_cache_dtype": "bf16"});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

/// The same request sequence against SGLang's server and our stand-in; every answer must match
/// in status, content type and body bytes.
#[test]
fn stand_in_answers_byte_for_byte_like_sglangs_bootstrap_server() {
    let (_sglang, sglang_port) = sglang_server();
    // The stand-in registers nothing itself here: every row comes from the sequence below.
    let (_sim, sim_port) = sim_prefill(&["--sim-hold-registrations", "1000000"]);
    let put = |b: Value| (hyper::Method::PUT, "/route".to_owned(), Some(b.to_string().into_bytes()));
    let get = |q: &str| (hyper::Method::GET, format!("/route?{q}"), None);
    let topo = "prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1";
    let steps: Vec<(hyper::Method, String, Option<Vec<u8>>)> = vec![
        (hyper::Method::GET, "/health".into(), None),
        get(topo),
        get("prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1"),
        get("prefill_dp_rank=&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"),
        get("prefill_dp_rank=x&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"),
        (hyper::Method::PUT, "/route".into(), Some(b"{not json".to_vec())),
        put(json!({"attn_tp_size": 2})),
        put(row(
            0,
            json!({"kv_layout": "v4", "load_balance_method": "round_robin", "enable_kv_cache_sharding": 1, "prefill_http_port": "30000"}),
        )),
        get(topo),
        put(row(0, json!({"decode_allocation_policy": "prefill_complete"}))),
        put(row(1, json!({"page_size": 32, "kv_cache_dtype": "fp8_e4m3", "dsv41_spec_layout": {"a": 1}}))),
        put(row(1, json!({"page_size": 32, "rank_ip": "10.9.9.9"}))),
        get(topo),
        get("prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0"),
        get("prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=%2B1&target_pp_rank=00"),
        get("prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=7&target_pp_rank=0"),
        get("prefill_dp_rank=-1&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=-1"),
        (hyper::Method::DELETE, "/route".into(), None),
        (hyper::Method::POST, "/health".into(), None),
        (hyper::Method::GET, "/nope".into(), None),
        (hyper::Method::POST, "/register_dp_rank".into(), Some(br#"{"bootstrap_room": 12, "dp_rank": 1}"#.to_vec())),
        (hyper::Method::POST, "/register_dp_rank".into(), Some(br#"{"bootstrap_room": "x", "dp_rank": 1}"#.to_vec())),
        (hyper::Method::POST, "/query_dp_ranks".into(), Some(br#"{"bootstrap_rooms": [12, "13", 12]}"#.to_vec())),
        (hyper::Method::GET, "/query_dp_ranks".into(), None),
    ];
    let statuses = block_on(async {
        let mut statuses = Vec::new();
        for (i, (method, path, body)) in steps.into_iter().enumerate() {
            let (theirs_addr, ours_addr) = (format!("127.0.0.1:{sglang_port}"), format!("127.0.0.1:{sim_port}"));
            let limit = Duration::from_secs(5);
            let theirs = http_client::send(method.clone(), &theirs_addr, &path, body.clone(), limit, 1 << 20).await.unwrap();
            let ours = http_client::send(method.clone(), &ours_addr, &path, body.clone(), limit, 1 << 20).await.unwrap();
            let what = format!("step {i}: {method} {path}");
            assert_eq!(ours.status, theirs.status, "{what}: status; SGLang said {}", theirs.text());
            assert_eq!(ours.content_type.to_ascii_lowercase(), theirs.content_type.to_ascii_lowercase(), "{what}: content type");
            assert_eq!(ours.text(), theirs.text(), "{what}: body");
            statuses.push(theirs.status);
        }
        statuses
    });
    // The sequence walks every branch the spec lists (guards against a sequence that only ever
    // compares two identical 404s).
    assert_eq!(
        statuses,
        [200, 503, 400, 400, 500, 500, 500, 200, 503, 400, 400, 200, 200, 200, 200, 404, 404, 405, 405, 404, 200, 500, 200, 405]
    );
}

/// SGLang's decode-side fetch (`GET /route` with four -1, then `PrefillServerInfo(**data)`)
/// builds the same record from our self-registering stand-in as from its own server.
#[test]
fn sglang_decode_fetch_reads_the_stand_in_like_its_own_server() {
    let (_sglang, sglang_port) = sglang_server();
    let flags = ["--tp-size", "8", "--attn-dp-size", "2", "--pp-size", "2", "--page-size", "64", "--kv-cache-dtype", "fp8_e4m3"];
    let (_sim, sim_port) = sim_prefill(&flags);
    let _registrar = registrar(sglang_port, &flags);
    let fetch = |port: u16| -> Value {
        common::wait_for(Duration::from_secs(30), "a 200 topology", || {
            let o = Command::new(sglang_python()).arg(harness()).args(["decode-fetch", &format!("127.0.0.1:{port}")]).output().unwrap();
            let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&o.stderr)))?;
            if v["status"] == 200 { Ok(v) } else { Err(v.to_string()) }
        })
    };
    let (theirs, ours) = (fetch(sglang_port), fetch(sim_port));
    assert!(ours.get("error").is_none(), "SGLang's decode rejects the stand-in's body: {ours}");
    assert_eq!(ours["record"]["dp_size"], 2);
    assert_eq!(ours["record"]["pp_size"], 2);
    assert_eq!(ours["record"]["attn_tp_size"], 4);
    // Same bytes except the HTTP port each prefill advertises.
    let strip =
        |v: &Value| v["body"].as_str().unwrap().replace(&format!("\"prefill_http_port\": {}", v["record"]["prefill_http_port"]), "");
    assert_eq!(strip(&ours), strip(&theirs));
}

fn readyz(port: u16) -> (u16, String) {
    block_on(async {
        match http_client::send(hyper::Method::GET, &format!("127.0.0.1:{port}"), "/readyz", None, Duration::from_secs(2), 4096).await {
            Ok(r) => (r.status, r.text()),
            Err(e) => (0, e.to_string()),
        }
    })
}

/// The long-running sidecar: /readyz follows the handshake, the heartbeat notices a lost prefill,
/// and SIGTERM stops it cleanly.
#[test]
fn running_sidecar_follows_registration_and_prefill_loss() {
    let (mut server, port) = sglang_server();
    let addr = format!("127.0.0.1:{port}");
    let d = decode_file(json!({"attn_tp_size": 2, "page_size": 16, "kv_cache_dtype": "auto", "kv_pool": "mha"}));
    let listen = free_port();
    let mut sidecar = Background::operator(
        "sidecar",
        &["handshake", "run", "--decode", d.path().to_str().unwrap(), "--prefill", &addr, "--listen", &format!("127.0.0.1:{listen}")],
    );
    sidecar.wait_port(listen);
    common::wait_for(Duration::from_secs(20), "/readyz 503 while nothing registered", || {
        let (status, body) = readyz(listen);
        (status == 503 && body.contains("Registering")).then_some(()).ok_or(format!("{status} {body}"))
    });
    let _ranks = registrar(port, &["--tp-size", "2", "--page-size", "16"]);
    common::wait_for(Duration::from_secs(30), "/readyz 200 after registration", || {
        let (status, body) = readyz(listen);
        (status == 200).then_some(()).ok_or(format!("{status} {body}"))
    });
    server.stop();
    common::wait_for(Duration::from_secs(30), "/readyz 503 after two missed heartbeats", || {
        let (status, body) = readyz(listen);
        (status == 503).then_some(body.clone()).ok_or(format!("{status} {body}"))
    });
    let (_, body) = readyz(listen);
    assert!(
        body.contains(&format!("Lost connection with prefill instance (bootstrap_addr: {addr})")) || body.contains("PrefillUnreachable"),
        "{body}"
    );
    sidecar.terminate_and_wait_success();
}
