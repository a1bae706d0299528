//! KV geometry of the stand-in model and the bytes each decode rank pulls from each prefill rank
//! the rank map names. Pure arithmetic; the transfer itself is in `transfer`.
//!
//! Per token and layer, a non-MLA pool stores K and V for every KV head (`2 x heads x head_dim`
//! elements), sharded by attention TP (heads replicated when there are fewer heads than ranks); an
//! MLA pool stores one latent vector (`kv_lora_rank + rope dim`) replicated on every TP rank.
//! Pipeline stages split the layers; decode DCP splits the tokens (interleaved); several prefill
//! CP ranks, or MLA KV-cache sharding, split the tokens the decode reads among the senders.

use std::ops::Range;

use pd_core::handshake::core::{PoolKind, RankMapping};

/// What one token costs in the KV pool of the whole model (one copy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGeometry {
    pub pool: PoolKind,
    pub layers: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    /// MLA latent width per token and layer (`kv_lora_rank + qk_rope_head_dim`).
    pub latent_dim: u64,
    /// Bits per element of the resolved KV dtype.
    pub dtype_bits: u64,
}

/// Bits per element of a `--kv-cache-dtype` value; `auto` is the model's bf16.
pub fn dtype_bits(kv_cache_dtype: &str) -> Option<u64> {
    match kv_cache_dtype {
        "auto" | "bf16" | "bfloat16" | "fp16" | "float16" => Some(16),
        "fp8_e4m3" | "fp8_e5m2" | "mxfp8" => Some(8),
        "nvfp4" | "fp4_mx_block16" => Some(4),
        _ => None,
    }
}

/// The parallel shape of one side, as the mapping sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub attn_tp: i64,
    pub attn_cp: i64,
    pub pp: i64,
    /// Decode context parallelism (1 on a prefill).
    pub dcp: i64,
}

/// One pull a decode rank makes: the prefill row (cp, tp, pp) and the bytes it reads from it.
/// `bytes == 0` is a dummy registration (MLA) or a sender whose share is empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pull {
    pub cp: i64,
    pub tp: i64,
    pub pp: i64,
    pub bytes: u64,
}

impl KvGeometry {
    fn mla(&self) -> bool {
        self.pool != PoolKind::Mha
    }
    /// Elements per token and layer of one whole copy (all heads, or the latent).
    fn elems_per_layer(&self) -> u64 {
        if self.mla() { self.latent_dim } else { 2 * self.kv_heads * self.head_dim }
    }
    /// Bytes one token takes in the whole model's KV (one copy, every layer and head).
    pub fn bytes_per_token(&self) -> u64 {
        bytes(self.layers * self.elems_per_layer(), self.dtype_bits)
    }
    fn head_elems(&self, heads: u64) -> u64 {
        if self.mla() { self.latent_dim } else { 2 * heads * self.head_dim }
    }
}

fn bytes(elems: u64, bits: u64) -> u64 {
    (u128::from(elems) * u128::from(bits)).div_ceil(8) as u64
}

/// Even contiguous split of `n` items over `parts`: the range part `i` holds.
fn split(n: u64, parts: i64, i: i64) -> Range<u64> {
    let (parts, i) = (parts.max(1) as u64, i.max(0) as u64);
    (i * n / parts)..((i + 1) * n / parts)
}

/// Heads rank `i` of `parts` holds: an even split, or one replicated head when heads < ranks.
fn heads_of(heads: u64, parts: i64, i: i64) -> Range<u64> {
    let r = split(heads, parts, i);
    if r.is_empty() { r.start..r.start + 1 } else { r }
}

fn overlap(a: &Range<u64>, b: &Range<u64>) -> u64 {
    a.end.min(b.end).saturating_sub(a.start.max(b.start))
}

/// Tokens `j < tokens` with `j mod parts == i` (interleaved split).
fn interleaved(tokens: u64, parts: i64, i: i64) -> u64 {
    let (parts, i) = (parts.max(1) as u64, i.max(0) as u64);
    if i >= tokens { 0 } else { (tokens - i).div_ceil(parts) }
}

/// Tokens a decode rank keeps: all of them, or its DCP share.
fn decode_tokens(d: &Shape, engine_rank: i64, tokens: u64) -> u64 {
    if d.dcp > 1 { interleaved(tokens, d.dcp, engine_rank % d.dcp) } else { tokens }
}

/// Bytes of KV that decode rank (`engine_rank`, `pp_rank`) holds for a prompt of `tokens`.
pub fn decode_rank_bytes(g: &KvGeometry, d: &Shape, engine_rank: i64, pp_rank: i64, tokens: u64) -> u64 {
    let layers = split(g.layers, d.pp, pp_rank).count() as u64;
    let heads = if g.mla() { 1 } else { heads_of(g.kv_heads, d.attn_tp, engine_rank).count() as u64 };
    bytes(decode_tokens(d, engine_rank, tokens) * layers * g.head_elems(heads), g.dtype_bits)
}

/// The pulls of one decode rank for one request: one per prefill row its mapping names, in
/// SGLang's lookup order (cp, then tp, then pp from the highest stage).
pub fn pulls(g: &KvGeometry, p: &Shape, d: &Shape, m: &RankMapping, tokens: u64) -> Vec<Pull> {
    let own_layers = split(g.layers, d.pp, m.pp_rank);
    let own_heads = heads_of(g.kv_heads, d.attn_tp, m.engine_rank);
    let kept = decode_tokens(d, m.engine_rank, tokens);
    let token_senders = if m.target_tp_rank.is_none() { m.target_tp_ranks.len() } else { m.target_cp_ranks.len() };
    let mut out = Vec::new();
    for (ci, &cp) in m.target_cp_ranks.iter().enumerate() {
        for (ti, &tp) in m.target_tp_ranks.iter().enumerate() {
            for &pp in m.target_pp_ranks.iter().rev() {
                let layers = overlap(&split(g.layers, p.pp, pp), &own_layers);
                let elems = if g.mla() {
                    // MLA: the one real sender (or, when sharded, every sender) carries the latent.
                    let real = m.target_tp_rank.is_none_or(|t| t == tp);
                    if real { g.latent_dim } else { 0 }
                } else {
                    // Each needed head comes from the first listed rank that holds it.
                    let earlier: Vec<Range<u64>> = m.target_tp_ranks[..ti].iter().map(|&t| heads_of(g.kv_heads, p.attn_tp, t)).collect();
                    let mine = heads_of(g.kv_heads, p.attn_tp, tp);
                    let heads = own_heads.clone().filter(|h| mine.contains(h) && !earlier.iter().any(|e| e.contains(h))).count() as u64;
                    g.head_elems(heads) * u64::from(heads > 0)
                };
                let sender_index = if m.target_tp_rank.is_none() { ti } else { ci };
                let tok = if token_senders > 1 { interleaved(kept, token_senders as i64, sender_index as i64) } else { kept };
                out.push(Pull { cp, tp, pp, bytes: bytes(tok * layers * elems, g.dtype_bits) });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pd_core::handshake::core::{DecodeTopology, PrefillInfo, handshake};
    use serde_json::json;

    const MHA: KvGeometry = KvGeometry { pool: PoolKind::Mha, layers: 32, kv_heads: 8, head_dim: 128, latent_dim: 0, dtype_bits: 16 };
    const MLA: KvGeometry = KvGeometry { pool: PoolKind::Mla, layers: 61, kv_heads: 1, head_dim: 0, latent_dim: 576, dtype_bits: 16 };

    fn shape(tp: i64, pp: i64) -> Shape {
        Shape { attn_tp: tp, attn_cp: 1, pp, dcp: 1 }
    }

    fn mapping(pool: &str, p: (i64, i64, i64), d: (i64, i64, i64)) -> Vec<RankMapping> {
        let decode = DecodeTopology::parse(
            &json!({"attn_tp_size": d.0, "pp_size": d.1, "dcp_size": d.2, "page_size": 1, "kv_cache_dtype": "auto", "kv_pool": pool}),
        )
        .unwrap();
        let info = PrefillInfo::from_body(&json!({"attn_tp_size": p.0, "attn_cp_size": 1, "dp_size": 1, "pp_size": p.1,
            "page_size": 1, "kv_cache_dtype": "auto", "follow_bootstrap_room": true, "enable_kv_cache_sharding": p.2 == 1}))
        .unwrap();
        handshake(&decode, &info).unwrap().ranks
    }

    #[test]
    fn per_token_sizes_follow_the_model() {
        // Llama-3-8B-like: 32 layers x 2 x 8 heads x 128 x 2 bytes = 128 KiB per token.
        assert_eq!(MHA.bytes_per_token(), 131_072);
        // DeepSeek-V3: 61 layers x 576 x 2 bytes.
        assert_eq!(MLA.bytes_per_token(), 70_272);
        assert_eq!(KvGeometry { dtype_bits: 8, ..MLA }.bytes_per_token(), 35_136);
        assert_eq!(KvGeometry { dtype_bits: 4, ..MHA }.bytes_per_token(), 32_768);
        assert_eq!(
            (dtype_bits("auto"), dtype_bits("fp8_e4m3"), dtype_bits("nvfp4"), dtype_bits("int3")),
            (Some(16), Some(8), Some(4), None)
        );
    }

    #[test]
    fn rank_shares_split_heads_layers_and_dcp_tokens() {
        // GQA TP4: 2 heads per rank; PP2: 16 layers per stage.
        assert_eq!(decode_rank_bytes(&MHA, &shape(4, 2), 1, 1, 10), 10 * 16 * 2 * 2 * 128 * 2);
        // 16 ranks over 8 heads: each rank holds one replicated head.
        assert_eq!(decode_rank_bytes(&MHA, &shape(16, 1), 15, 0, 1), 32 * 2 * 128 * 2);
        // MLA: the latent is replicated on every TP rank; DCP4 interleaves 10 tokens 3,3,2,2.
        let dcp = Shape { dcp: 4, ..shape(4, 1) };
        let kept: Vec<u64> = (0..4).map(|e| decode_rank_bytes(&MLA, &dcp, e, 0, 10) / MLA.bytes_per_token()).collect();
        assert_eq!(kept, [3, 3, 2, 2]);
    }

    /// Every decode rank receives exactly its own share, whatever the mapping.
    fn assert_conserved(g: &KvGeometry, pool: &str, p: (i64, i64, i64), d: (i64, i64, i64), tokens: u64) {
        let (ps, ds) = (shape(p.0, p.1), Shape { dcp: d.2, ..shape(d.0, d.1) });
        for m in mapping(pool, p, d) {
            let got: u64 = pulls(g, &ps, &ds, &m, tokens).iter().map(|x| x.bytes).sum();
            assert_eq!(got, decode_rank_bytes(g, &ds, m.engine_rank, m.pp_rank, tokens), "{pool} P{p:?} D{d:?} rank {m:?}");
        }
    }

    #[test]
    fn pulls_deliver_each_decode_rank_its_share() {
        for (p, d) in
            [((4, 1, 0), (4, 1, 1)), ((2, 1, 0), (8, 1, 1)), ((8, 1, 0), (2, 1, 1)), ((4, 2, 0), (4, 1, 1)), ((4, 2, 0), (4, 2, 1))]
        {
            assert_conserved(&MHA, "mha", p, d, 1000);
            assert_conserved(&MLA, "mla", p, d, 1000);
        }
        assert_conserved(&MHA, "mha", (16, 1, 0), (2, 1, 1), 7);
        assert_conserved(&MLA, "mla", (4, 1, 0), (4, 1, 2), 1001);
        assert_conserved(&MLA, "mla", (4, 2, 1), (4, 1, 1), 999);
    }

    #[test]
    fn mla_fan_in_reads_one_real_rank_and_registers_dummies() {
        let m = &mapping("mla", (8, 1, 0), (2, 1, 1))[1];
        let got = pulls(&MLA, &shape(8, 1), &shape(2, 1), m, 100);
        let real: Vec<i64> = got.iter().filter(|p| p.bytes > 0).map(|p| p.tp).collect();
        assert_eq!((got.len(), real), (4, vec![4]));
        // GQA fan-in: all four prefill ranks send a head slice each.
        let m = &mapping("mha", (8, 1, 0), (2, 1, 1))[0];
        let got = pulls(&MHA, &shape(8, 1), &shape(2, 1), m, 100);
        assert!(got.iter().all(|p| p.bytes == 100 * 32 * 2 * 128 * 2), "{got:?}");
        // MLA sharding: every prefill rank sends a quarter of the tokens.
        let m = &mapping("mla", (4, 2, 1), (4, 1, 1))[0];
        let got = pulls(&MLA, &shape(4, 2), &shape(4, 1), m, 8);
        assert_eq!(got.len(), 8);
        assert!(got.iter().all(|p| p.bytes == 2 * 30 * 576 * 2 || p.bytes == 2 * 31 * 576 * 2), "{got:?}");
    }
}
