//! Hostile and malformed bootstrap answers: the parsers are fuzzed (no panic, a clear verdict),
//! and the sidecar's client meets huge, slow and lying servers over real sockets.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use pd_core::handshake::core::DecodeTopology;
use pd_runtime::probe::{self, Verdict};
use pd_sim::SimError;
use pd_sim::bootstrap::Registry;
use pd_sim::flags::EngineFlags;
use proptest::prelude::*;
use serde_json::{Value, json};

fn decode() -> DecodeTopology {
    DecodeTopology::parse(&json!({"attn_tp_size": 2, "page_size": 64, "kv_cache_dtype": "auto", "kv_pool": "mla"})).unwrap()
}

/// JSON values of every shape, biased towards the keys a topology body carries.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        "[ -~]{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    3 => prop::sample::select(pd_core::handshake::core::TOPOLOGY_KEYS.to_vec()).prop_map(str::to_owned),
                    1 => "[a-z_]{1,10}",
                ],
                inner,
                0..20
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn any_topology_bytes_get_the_verdict_their_status_and_syntax_call_for(
        body in prop::collection::vec(any::<u8>(), 0..512),
        status in prop_oneof![Just(200u16), Just(503), 100u16..600],
    ) {
        let verdict = probe::assess(&decode(), status, &body);
        let parses = serde_json::from_slice::<Value>(&body).is_ok();
        match (status, verdict) {
            (200, Err(v)) if !parses => {
                let (reason, message) = v.reason_and_message();
                prop_assert_eq!(reason, "IncompatibleTopologyBody");
                prop_assert!(message.contains("not JSON"), "{}", message);
            }
            (200, _) => prop_assert!(parses, "a body that is not JSON passed"),
            (503, Err(v)) => prop_assert!(matches!(*v, Verdict::Pending { ref reason, .. } if reason == "Registering"), "{:?}", v),
            (s, Err(v)) => {
                let (reason, message) = v.reason_and_message();
                prop_assert!(matches!(*v, Verdict::Pending { .. }) && reason == "BootstrapError", "{:?}", v);
                prop_assert!(message.contains(&format!("answered {s}")), "{}", message);
            }
            (s, Ok(_)) => prop_assert!(false, "status {} passed", s),
        }
    }

    #[test]
    fn any_topology_json_passes_whole_or_is_refused_as_incompatible_when_not_an_object(v in json_value()) {
        match probe::assess(&decode(), 200, v.to_string().as_bytes()) {
            Ok((info, _, _)) => prop_assert_eq!(info, v, "the verdict carries the body it judged"),
            Err(verdict) if !v.is_object() => {
                prop_assert_eq!(verdict.reason_and_message().0, "IncompatibleTopologyBody", "{:?}", verdict);
            }
            Err(_) => {}
        }
    }

    #[test]
    fn huge_prefill_sizes_are_refused_not_allocated(size in prop_oneof![Just(i64::MAX), 1i64 << 17..i64::MAX], key in 0usize..4) {
        let mut body = json!({"attn_tp_size": 4, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1, "page_size": 64,
            "kv_cache_dtype": "auto", "follow_bootstrap_room": true});
        body[["attn_tp_size", "attn_cp_size", "dp_size", "pp_size"][key]] = json!(size);
        let verdict = probe::assess(&decode(), 200, body.to_string().as_bytes()).expect_err("must not pass");
        prop_assert!(verdict.reason_and_message().1.contains("beyond any real deployment"), "{:?}", verdict);
    }

    #[test]
    fn any_rank_body_parses_to_its_own_port_or_names_what_is_wrong(v in json_value()) {
        let keys: Vec<&str> = v.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
        match probe::parse_row(v.to_string().as_bytes()) {
            Ok((_, port)) => {
                prop_assert!(keys.len() == 2 && keys.contains(&"rank_ip") && keys.contains(&"rank_port"), "{}", v);
                prop_assert_eq!(v["rank_port"].as_i64().or_else(|| v["rank_port"].as_str()?.trim().parse().ok()), Some(i64::from(port)));
            }
            Err(why) if !v.is_object() => prop_assert!(why.starts_with("expected an object"), "{}", why),
            Err(why) => {
                let stray = keys.iter().find(|k| **k != "rank_ip" && **k != "rank_port");
                let named = match stray {
                    Some(k) => why.contains(&format!("unexpected keyword argument '{k}'")),
                    None if !keys.contains(&"rank_ip") => why.contains("'rank_ip'"),
                    None if !keys.contains(&"rank_port") => why.contains("'rank_port'"),
                    None => why.contains("rank_port") || why.contains("int()"),
                };
                prop_assert!(named, "{} for {}", why, v);
            }
        }
    }

    #[test]
    fn the_stand_in_registry_answers_any_request_without_panicking(
        puts in prop::collection::vec(json_value(), 0..6),
        query in prop::collection::vec(prop::option::of("-?[0-9]{0,3}|[ -~]{0,4}"), 4..=4),
    ) {
        let mut reg = Registry::default();
        for p in &puts {
            let r = reg.put_route(p.to_string().as_bytes());
            prop_assert!([200, 400, 500].contains(&r.status));
        }
        let q: [Option<&str>; 4] = [query[0].as_deref(), query[1].as_deref(), query[2].as_deref(), query[3].as_deref()];
        let r = reg.get_route(q);
        prop_assert!([200, 400, 404, 500, 503].contains(&r.status));
        if r.status == 200 {
            prop_assert!(serde_json::from_str::<Value>(&r.body).is_ok());
        }
    }

    #[test]
    fn any_engine_argv_parses_or_is_refused_naming_the_flag(args in prop::collection::vec("--[a-z-]{1,12}(=[ -~]{0,4})?|[ -~]{0,6}", 0..12)) {
        match EngineFlags::parse(&args) {
            Ok(_) => {}
            // Every refusal is about a flag, and says which one.
            Err(SimError::Flags(m)) => prop_assert!(m.contains("--"), "{}", m),
            Err(e) => prop_assert!(false, "not a flag error: {}", e),
        }
    }
}

/// A one-shot server that runs `answer` on the first connection, on its own thread.
fn hostile(answer: impl FnOnce(std::net::TcpStream) + Send + 'static) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            answer(s);
        }
    });
    addr
}

fn probe_once(addr: &str) -> Verdict {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(probe::probe(addr, &decode()))
}

#[test]
fn a_huge_body_is_refused_not_buffered() {
    let addr = hostile(|mut s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 104857600\r\n\r\n");
        let chunk = vec![b' '; 1 << 16];
        for _ in 0..1600 {
            if s.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let Verdict::Failed { reason, error, .. } = probe_once(&addr) else { panic!("a 100 MiB body must fail") };
    assert_eq!(reason, "IncompatibleTopologyBody");
    assert!(error.contains("exceeds"), "{error}");
}

#[test]
fn a_slow_drip_times_out_in_bounded_time() {
    let addr = hostile(|mut s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n");
        for _ in 0..100 {
            if s.write_all(b" ").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    let started = Instant::now();
    let v = probe_once(&addr);
    assert!(started.elapsed() < Duration::from_secs(7), "took {:?}", started.elapsed());
    let (reason, message) = v.reason_and_message();
    assert_eq!(reason, "PrefillUnreachable");
    assert!(message.contains("no answer"), "{message}");
}

#[test]
fn wrong_types_and_garbage_get_python_s_words() {
    let body = r#"{"attn_tp_size": "two", "attn_cp_size": 1, "dp_size": 1, "pp_size": 1, "page_size": 64, "kv_cache_dtype": "auto", "follow_bootstrap_room": true}"#;
    let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    let addr = hostile(move |mut s| {
        let _ = s.write_all(answer.as_bytes());
    });
    let Verdict::Failed { error, .. } = probe_once(&addr) else { panic!("a string size must fail") };
    assert!(error.contains("ValueError: invalid literal for int() with base 10: 'two'"), "{error}");

    let addr = hostile(|mut s| {
        let _ = s.write_all(b"this is not HTTP\r\n\r\n");
    });
    let (reason, message) = probe_once(&addr).reason_and_message();
    assert_eq!(reason, "PrefillUnreachable");
    assert!(message.contains("HTTP exchange"), "{message}");
}
