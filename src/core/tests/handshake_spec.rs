//! Every worked example of the spec (§3.5), run through the pure handshake core.

use pd_core::handshake::core::{DecodeTopology, PrefillInfo, handshake};
use serde_json::{Value, json};

/// A prefill topology body as a 0.5.23 bootstrap server writes it.
fn body(tp: i64, cp: i64, pp: i64, extra: Value) -> Value {
    let mut b = json!({
        "attn_tp_size": tp, "attn_cp_size": cp, "dp_size": 1, "pp_size": pp, "page_size": 64,
        "kv_cache_dtype": "auto", "follow_bootstrap_room": true, "enable_dsa_cache_layer_split": false,
        "decode_allocation_policy": "early", "enable_kv_cache_sharding": false, "prefill_http_port": 30000,
        "target_tp_rank": null, "target_tp_ranks": null, "target_cp_ranks": null, "target_pp_ranks": null,
        "required_dst_info_num": null, "required_prefill_response_num": null
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn decode(tp: i64, pool: &str, extra: Value) -> DecodeTopology {
    let mut d = json!({"attn_tp_size": tp, "page_size": 64, "kv_cache_dtype": "auto", "kv_pool": pool});
    for (k, v) in extra.as_object().unwrap() {
        d[k] = v.clone();
    }
    DecodeTopology::parse(&d).unwrap()
}

/// (tp_rank, tp_ranks, cp_ranks, pp_ranks, dst, resp) of every decode rank, engine-rank major.
type Row = (Option<i64>, Vec<i64>, Vec<i64>, Vec<i64>, i64, i64);

fn run(d: &DecodeTopology, b: &Value) -> Result<(Vec<Row>, bool), String> {
    let p = PrefillInfo::from_body(b).unwrap();
    handshake(d, &p)
        .map(|h| {
            let rows = h
                .ranks
                .iter()
                .map(|r| {
                    (
                        r.target_tp_rank,
                        r.target_tp_ranks.clone(),
                        r.target_cp_ranks.clone(),
                        r.target_pp_ranks.clone(),
                        r.required_dst_info_num,
                        r.required_prefill_response_num,
                    )
                })
                .collect();
            (rows, !h.warnings.is_empty())
        })
        .map_err(|f| format!("{}: {}", f.kind, f.error))
}

fn same_for_all(n: usize, row: Row) -> Vec<Row> {
    vec![row; n]
}

#[test]
fn ex01_equal_tp_gqa_and_mla() {
    for pool in ["mha", "mla"] {
        let (rows, warned) = run(&decode(4, pool, json!({})), &body(4, 1, 1, json!({}))).unwrap();
        assert_eq!(rows, (0..4).map(|e| (Some(e), vec![e], vec![0], vec![0], 1, 1)).collect::<Vec<_>>());
        assert!(!warned);
    }
}

#[test]
fn ex02_ex03_decode_wider() {
    let expect: Vec<Row> = (0..8).map(|e| (Some(e / 4), vec![e / 4], vec![0], vec![0], 4, 1)).collect();
    let (rows, warned) = run(&decode(8, "mla", json!({})), &body(2, 1, 1, json!({}))).unwrap();
    assert_eq!((rows, warned), (expect.clone(), false));
    let (rows, warned) = run(&decode(8, "mha", json!({})), &body(2, 1, 1, json!({}))).unwrap();
    assert_eq!((rows, warned), (expect, true));
}

#[test]
fn ex04_to_ex06_prefill_wider() {
    let rows_for =
        |resp| vec![(Some(0), vec![0, 1, 2, 3], vec![0], vec![0], 1, resp), (Some(4), vec![4, 5, 6, 7], vec![0], vec![0], 1, resp)];
    assert_eq!(run(&decode(2, "mla", json!({})), &body(8, 1, 1, json!({}))).unwrap(), (rows_for(1), false));
    assert_eq!(run(&decode(2, "mha", json!({})), &body(8, 1, 1, json!({}))).unwrap(), (rows_for(4), true));
    assert_eq!(run(&decode(2, "hybrid_mla", json!({})), &body(8, 1, 1, json!({}))).unwrap(), (rows_for(4), false));
}

#[test]
fn ex07_ex08_extreme_fan_in_and_out() {
    let (rows, _) = run(&decode(1, "mla", json!({})), &body(16, 1, 1, json!({}))).unwrap();
    assert_eq!(rows, vec![(Some(0), (0..16).collect(), vec![0], vec![0], 1, 1)]);
    let (rows, _) = run(&decode(16, "mla", json!({})), &body(1, 1, 1, json!({}))).unwrap();
    assert_eq!(rows, same_for_all(16, (Some(0), vec![0], vec![0], vec![0], 16, 1)));
}

#[test]
fn ex09_to_ex12_pipeline() {
    let (rows, _) = run(&decode(4, "mla", json!({})), &body(4, 1, 2, json!({}))).unwrap();
    assert_eq!(rows, (0..4).map(|e| (Some(e), vec![e], vec![0], vec![0, 1], 1, 2)).collect::<Vec<_>>());
    let (rows, _) = run(&decode(4, "mha", json!({"pp_size": 2})), &body(4, 1, 2, json!({}))).unwrap();
    let expect: Vec<Row> = (0..4).flat_map(|e| (0..2).map(move |p| (Some(e), vec![e], vec![0], vec![p], 1, 1))).collect();
    assert_eq!(rows, expect);
    let (rows, warned) = run(&decode(4, "mha", json!({})), &body(2, 1, 4, json!({}))).unwrap();
    assert_eq!(rows, (0..4).map(|e| (Some(e / 2), vec![e / 2], vec![0], vec![0, 1, 2, 3], 2, 4)).collect::<Vec<_>>());
    assert!(warned);
    let (rows, _) = run(&decode(4, "mha", json!({})), &body(8, 1, 2, json!({}))).unwrap();
    assert_eq!(rows, (0..4).map(|e| (Some(2 * e), vec![2 * e, 2 * e + 1], vec![0], vec![0, 1], 1, 4)).collect::<Vec<_>>());
}

#[test]
fn ex13_ex14_pp_assertions() {
    for pool in ["mha", "mla", "hybrid_mla"] {
        assert_eq!(
            run(&decode(4, pool, json!({"pp_size": 4})), &body(4, 1, 2, json!({}))).unwrap_err(),
            "AssertionError: Decode pp size (4) should be equal to prefill pp size (2) or 1"
        );
        assert_eq!(
            run(&decode(4, pool, json!({"pp_size": 2})), &body(4, 1, 1, json!({}))).unwrap_err(),
            "AssertionError: Decode pp size (2) should be equal to prefill pp size (1) or 1"
        );
    }
}

#[test]
fn ex15_to_ex19_prefill_cp() {
    let row = |e: i64, cp: Vec<i64>, resp| (Some(e), vec![e], cp, vec![0], 1, resp);
    let (rows, _) = run(&decode(2, "mla", json!({})), &body(2, 2, 1, json!({}))).unwrap();
    assert_eq!(rows, vec![row(0, vec![0], 1), row(1, vec![0], 1)]);
    let (rows, _) = run(&decode(2, "mla", json!({"all_cp_ranks_transfer": true})), &body(2, 2, 1, json!({}))).unwrap();
    assert_eq!(rows, vec![row(0, vec![0, 1], 2), row(1, vec![0, 1], 2)]);
    let (rows, _) = run(&decode(2, "hybrid_mla", json!({})), &body(2, 2, 1, json!({}))).unwrap();
    assert_eq!(rows, vec![row(0, vec![0, 1], 2), row(1, vec![0, 1], 2)]);
    let (rows, _) = run(&decode(2, "mha", json!({})), &body(2, 2, 1, json!({"enable_dsa_cache_layer_split": true}))).unwrap();
    assert_eq!(rows, vec![row(0, vec![0, 1], 2), row(1, vec![0, 1], 2)]);
    let (rows, _) = run(&decode(4, "mla", json!({})), &body(2, 2, 1, json!({}))).unwrap();
    assert_eq!(rows, (0..4).map(|e| (Some(e / 2), vec![e / 2], vec![0], vec![0], 2, 1)).collect::<Vec<_>>());
}

#[test]
fn ex20_to_ex24_decode_context_parallel() {
    let (rows, _) = run(&decode(4, "mla", json!({"dcp_size": 2})), &body(4, 1, 1, json!({}))).unwrap();
    assert_eq!(rows, (0..4).map(|e| (Some(e), vec![e], vec![0], vec![0], 1, 1)).collect::<Vec<_>>());
    let (rows, _) = run(&decode(16, "hybrid_mla", json!({"dcp_size": 16})), &body(1, 1, 16, json!({}))).unwrap();
    assert_eq!(rows, same_for_all(16, (Some(0), vec![0], vec![0], (0..16).collect(), 16, 16)));
    assert_eq!(
        run(&decode(4, "mha", json!({"dcp_size": 2})), &body(4, 1, 1, json!({}))).unwrap_err(),
        "RuntimeError: PD decode DCP requires an MLA or hybrid-MLA KV pool."
    );
    assert_eq!(
        run(&decode(4, "mla", json!({"dcp_size": 2})), &body(2, 2, 1, json!({}))).unwrap_err(),
        "RuntimeError: PD decode DCP currently requires prefill attention CP=1, got 2."
    );
    assert_eq!(
        run(&decode(4, "mla", json!({"dcp_size": 2})), &body(4, 1, 1, json!({"enable_kv_cache_sharding": true}))).unwrap_err(),
        "RuntimeError: PD decode DCP does not support a prefill with --enable-kv-cache-sharding."
    );
}

#[test]
fn ex25_to_ex28_kv_cache_sharding() {
    let shard = json!({"enable_kv_cache_sharding": true});
    let (rows, _) = run(&decode(4, "mla", json!({})), &body(4, 1, 1, shard.clone())).unwrap();
    assert_eq!(rows, same_for_all(4, (None, vec![0, 1, 2, 3], vec![0], vec![0], 4, 4)));
    let (rows, _) = run(&decode(4, "mla", json!({})), &body(4, 1, 2, shard.clone())).unwrap();
    assert_eq!(rows, same_for_all(4, (None, vec![0, 1, 2, 3], vec![0], vec![0, 1], 4, 8)));
    assert_eq!(
        run(&decode(4, "mla", json!({})), &body(8, 1, 1, shard.clone())).unwrap_err(),
        "AssertionError: MLA KV cache sharding requires equal prefill/decode attn TP sizes, got prefill=8 decode=4"
    );
    let (rows, _) = run(&decode(2, "mha", json!({})), &body(2, 2, 1, shard)).unwrap();
    assert_eq!(rows, (0..2).map(|e| (Some(e), vec![e], vec![0, 1], vec![0], 1, 2)).collect::<Vec<_>>());
}

#[test]
fn ex29_to_ex32_ordering_and_texts() {
    assert_eq!(
        run(&decode(4, "mha", json!({"page_size": 32})), &body(4, 1, 1, json!({}))).unwrap_err(),
        "RuntimeError: Page size mismatch: prefill server has page_size=64, but decode server has page_size=32. Both servers must use the same --page-size value."
    );
    assert_eq!(
        run(&decode(4, "mha", json!({"page_size": 32, "kv_cache_dtype": "bfloat16"})), &body(4, 1, 1, json!({"kv_cache_dtype": "bf16"})))
            .unwrap_err(),
        "RuntimeError: Page size mismatch: prefill server has page_size=64, but decode server has page_size=32. Both servers must use the same --page-size value."
    );
    assert_eq!(
        run(&decode(4, "mha", json!({"kv_cache_dtype": "bfloat16"})), &body(4, 1, 1, json!({"kv_cache_dtype": "bf16"}))).unwrap_err(),
        "RuntimeError: KV cache dtype mismatch: prefill server has kv_cache_dtype=bf16, but decode server has kv_cache_dtype=bfloat16. Both servers must use the same --kv-cache-dtype value."
    );
    assert_eq!(
        run(&decode(4, "mha", json!({"attn_cp_size": 2, "pp_size": 4})), &body(4, 1, 1, json!({}))).unwrap_err(),
        "AssertionError: Decode cp size (2) should be equal to 1"
    );
}

#[test]
fn ex33_to_ex35_attention_dp_cp_tp_sharing_non_divisible() {
    let (rows, _) = run(&decode(4, "mla", json!({})), &body(4, 1, 1, json!({"dp_size": 2}))).unwrap();
    assert_eq!(rows, (0..4).map(|e| (Some(e), vec![e], vec![0], vec![0], 1, 1)).collect::<Vec<_>>());
    let (rows, _) = run(&decode(8, "hybrid_mla", json!({})), &body(4, 1, 1, json!({}))).unwrap();
    assert_eq!(rows, (0..8).map(|e| (Some(e / 2), vec![e / 2], vec![0], vec![0], 2, 1)).collect::<Vec<_>>());
    let (rows, _) = run(&decode(6, "mla", json!({})), &body(4, 1, 1, json!({}))).unwrap();
    assert_eq!(rows, (0..6).map(|e| (Some(e), vec![e], vec![0], vec![0], 1, 1)).collect::<Vec<_>>());
}

#[test]
fn further_outcomes_minimax_mxfp8_dspark() {
    assert_eq!(
        run(&decode(4, "mha", json!({"state_types": ["minimax_index_k"]})), &body(8, 1, 1, json!({}))).unwrap_err(),
        "RuntimeError: MiniMax sparse PD requires matching attention TP sizes: prefill=8, decode=4."
    );
    assert_eq!(
        run(&decode(4, "mha", json!({"state_types": ["swa", "block_scale", "block_scale_swa"]})), &body(2, 1, 1, json!({}))).unwrap_err(),
        "RuntimeError: PD Disaggregation does NOT support different attention TP sizes with MXFP8 KV cache: prefill attn_tp_size=2, decode attn_tp_size=4, state types ['block_scale', 'block_scale_swa']."
    );
    let layout = json!({"num_draft_tokens": 4, "compression_ratios": [0, 2, 4, 128]});
    let (rows, _) =
        run(&decode(4, "mla", json!({"dsv41_spec_layout": layout.clone()})), &body(2, 2, 1, json!({"dsv41_spec_layout": layout.clone()})))
            .unwrap();
    assert_eq!(rows[0].4, 2);
    assert_eq!(rows[0].5, 1);
    assert_eq!(
        run(&decode(8, "mla", json!({"dsv41_spec_layout": layout.clone()})), &body(4, 1, 1, json!({"dsv41_spec_layout": layout.clone()})))
            .unwrap_err(),
        "RuntimeError: DeepSeek-V4.1 DSpark PD requires the same TP size on both servers (including prefill CP ranks for MLA)"
    );
    let other = json!({"num_draft_tokens": 8, "compression_ratios": [0, 2, 4, 128], "kv_layer_ids": [0]});
    assert_eq!(
        run(&decode(4, "mla", json!({"dsv41_spec_layout": layout})), &body(4, 1, 1, json!({"dsv41_spec_layout": other}))).unwrap_err(),
        "RuntimeError: DeepSeek-V4.1 DSpark PD layout mismatch (kv_layer_ids, num_draft_tokens): both servers must enable DSpark with the same block size and target/draft KV layout. Upgrade both servers together."
    );
    assert_eq!(
        run(&decode(4, "mla", json!({"kv_layout": "v4"})), &body(4, 1, 1, json!({"kv_layout": "v4,c4:v4,c128:v4"}))).unwrap_err(),
        "RuntimeError: KV layout mismatch: prefill server has kv_layout=v4,c4:v4,c128:v4, but decode server has kv_layout=v4. Both servers must use the same --dsv4-attn-backend and SGLANG_DSV4_KV_LAYOUT."
    );
}

#[test]
fn record_construction_follows_python() {
    let mut b = body(4, 1, 1, json!({}));
    b["extra"] = json!(1);
    assert_eq!(
        PrefillInfo::from_body(&b).unwrap_err(),
        "TypeError: PrefillServerInfo.__init__() got an unexpected keyword argument 'extra'"
    );
    let b = json!({"attn_tp_size": "2", "attn_cp_size": 1, "dp_size": 1, "pp_size": 1.0, "page_size": null, "kv_cache_dtype": 5, "follow_bootstrap_room": 0});
    let p = PrefillInfo::from_body(&b).unwrap();
    assert_eq!(
        (p.attn_tp_size, p.pp_size, p.page_size, p.kv_cache_dtype.as_deref(), p.follow_bootstrap_room),
        (2, 1, None, Some("5"), false)
    );
    assert_eq!(
        PrefillInfo::from_body(&json!({"attn_tp_size": 1, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1, "page_size": 1})).unwrap_err(),
        "TypeError: PrefillServerInfo.__init__() missing 2 required positional arguments: 'kv_cache_dtype' and 'follow_bootstrap_room'"
    );
    let mut b = body(4, 1, 1, json!({}));
    b["dp_size"] = Value::Null;
    assert!(PrefillInfo::from_body(&b).unwrap_err().starts_with("TypeError: int() argument"));
}
