//! The engine flags the stand-in reads: the subset of `sglang.launch_server`'s that shape the
//! bootstrap protocol, plus `--sim-*` knobs. Pure: argv in, resolved topology and the
//! registration bodies a real prefill of that topology sends out.

use serde_json::{Value, json};

use super::SimError;
use super::kv::{self, KvGeometry};
use pd_core::handshake::core::{DecodeTopology, PoolKind};
use pd_core::stand_in;

/// SGLang flags that take a value; the first name is canonical, the rest are SGLang's aliases.
/// The stand-in's own `--sim-*` options are `pd_core::stand_in`'s.
const VALUE_FLAGS: &[&[&str]] = &[
    &["--disaggregation-mode"],
    &["--disaggregation-bootstrap-port"],
    &["--disaggregation-decode-allocation-policy"],
    &["--tp-size", "--tensor-parallel-size"],
    &["--dp-size", "--data-parallel-size"],
    &["--attn-dp-size", "--attention-data-parallel-size"],
    &["--pp-size", "--pipeline-parallel-size"],
    &["--attn-cp-size", "--attention-context-parallel-size"],
    &["--dcp-size", "--decode-context-parallel-size"],
    &["--page-size"],
    &["--kv-cache-dtype"],
    &["--host"],
    &["--port"],
    &["--dist-init-addr", "--nccl-init-addr"],
    &["--nnodes"],
    &["--node-rank"],
    &["--load-balance-method"],
    &["--model-path", "--model"],
    &["--served-model-name"],
    &["--max-running-requests"],
];
const SWITCHES: &[&str] = &["--enable-dp-attention", "--enable-kv-cache-sharding", "--enable-dsa-cache-layer-split"];

/// Defaults of the timing model and the stand-in model's KV geometry (one place).
pub mod defaults {
    /// Prefill throughput of one instance, tokens per second (an H100-class prefill).
    pub const PREFILL_TOKENS_PER_S: f64 = 20_000.0;
    /// Decode inter-token latency, milliseconds.
    pub const ITL_MS: f64 = 20.0;
    /// SGLang derives `--max-running-requests` from memory; the stand-in takes a fixed window.
    pub const MAX_RUNNING_REQUESTS: u64 = 256;
    /// KV pool capacity in tokens, for `sglang:token_usage`.
    pub const KV_CAPACITY_TOKENS: u64 = 1 << 20;
    /// GQA geometry (Llama-3-8B-like) and MLA latent (DeepSeek-V3: 512 + 64).
    pub const LAYERS: u64 = 32;
    pub const KV_HEADS: u64 = 8;
    pub const HEAD_DIM: u64 = 128;
    pub const MLA_LAYERS: u64 = 61;
    pub const KV_LATENT_DIM: u64 = 576;
}

/// The engine's flags after SGLang's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineFlags {
    pub mode: String,
    pub bootstrap_port: u16,
    pub decode_allocation_policy: String,
    pub tp: i64,
    pub dp: i64,
    pub attn_dp: i64,
    pub pp: i64,
    pub attn_cp: i64,
    pub dcp: i64,
    pub page_size: Option<i64>,
    pub kv_cache_dtype: String,
    pub host: String,
    pub port: u16,
    pub dist_init_addr: Option<String>,
    pub nnodes: i64,
    pub node_rank: i64,
    pub load_balance_method: String,
    pub model_path: String,
    pub enable_dp_attention: bool,
    pub enable_kv_cache_sharding: bool,
    pub enable_dsa_cache_layer_split: bool,
    /// `--sim-page-size`: advertise this page size instead of the resolved one (fault injection).
    pub sim_page_size: Option<i64>,
    pub sim_kv_cache_dtype: Option<String>,
    /// `--sim-hold-registrations N`: never send the last N registrations (the 503 state).
    pub sim_hold_registrations: usize,
    /// `--sim-bootstrap-server false`: register only, serve no bootstrap server.
    pub sim_bootstrap_server: bool,
    pub served_model_name: Option<String>,
    pub max_running_requests: u64,
    /// `--sim-prefill-tokens-per-s`: prefill throughput; 0 computes instantly.
    pub sim_prefill_tokens_per_s: f64,
    /// `--sim-itl-ms`: decode inter-token latency; 0 streams as fast as possible.
    pub sim_itl_ms: f64,
    /// `--sim-itl-ms-per-running`: a decode step takes this much longer per running request, so
    /// a decode's capacity runs out as a GPU's does (its ITL grows with its batch); 0: flat.
    pub sim_itl_ms_per_running: f64,
    /// `--sim-kv-pool mla|hybrid_mla|mha`: the KV pool kind (default: from the model catalogue).
    pub sim_kv_pool: Option<String>,
    pub sim_num_layers: Option<u64>,
    pub sim_num_kv_heads: u64,
    pub sim_head_dim: u64,
    pub sim_kv_latent_dim: u64,
    /// `--sim-transfer-gbps`: pace every KV transfer (slow-transfer fault); 0 is unpaced.
    pub sim_transfer_gbps: f64,
    /// `--sim-fault-die-mid-transfer N`: the prefill exits half-way through the N-th pull served
    /// by any of its ranks (a request moves one pull per decode rank and prefill row).
    pub sim_fault_die_mid_transfer: u64,
    /// `--sim-fault-stall-transfers`: the prefill ranks never answer a pull.
    pub sim_fault_stall_transfers: bool,
    /// Flags the stand-in does not model; they are logged and otherwise ignored.
    pub ignored: Vec<String>,
}

impl Default for EngineFlags {
    fn default() -> Self {
        Self {
            mode: "null".into(),
            bootstrap_port: pd_api::DEFAULT_BOOTSTRAP_PORT,
            decode_allocation_policy: "early".into(),
            tp: 1,
            dp: 1,
            attn_dp: 1,
            pp: 1,
            attn_cp: 1,
            dcp: 1,
            page_size: None,
            kv_cache_dtype: "auto".into(),
            host: "127.0.0.1".into(),
            port: pd_api::DEFAULT_HTTP_PORT,
            dist_init_addr: None,
            nnodes: 1,
            node_rank: 0,
            load_balance_method: "auto".into(),
            model_path: String::new(),
            enable_dp_attention: false,
            enable_kv_cache_sharding: false,
            enable_dsa_cache_layer_split: false,
            sim_page_size: None,
            sim_kv_cache_dtype: None,
            sim_hold_registrations: 0,
            sim_bootstrap_server: true,
            served_model_name: None,
            max_running_requests: defaults::MAX_RUNNING_REQUESTS,
            sim_prefill_tokens_per_s: defaults::PREFILL_TOKENS_PER_S,
            sim_itl_ms: defaults::ITL_MS,
            sim_itl_ms_per_running: 0.0,
            sim_kv_pool: None,
            sim_num_layers: None,
            sim_num_kv_heads: defaults::KV_HEADS,
            sim_head_dim: defaults::HEAD_DIM,
            sim_kv_latent_dim: defaults::KV_LATENT_DIM,
            sim_transfer_gbps: 0.0,
            sim_fault_die_mid_transfer: 0,
            sim_fault_stall_transfers: false,
            ignored: Vec::new(),
        }
    }
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, SimError> {
    v.parse().map_err(|_| SimError::Flags(format!("{flag} expects an integer, got {v:?}")))
}

fn non_negative(flag: &str, v: &str) -> Result<f64, SimError> {
    v.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .ok_or_else(|| SimError::Flags(format!("{flag} expects a non-negative number, got {v:?}")))
}

impl EngineFlags {
    /// Reads argv (without the program name) as SGLang's argparse would for these flags.
    pub fn parse(args: &[String]) -> Result<Self, SimError> {
        let mut f = EngineFlags::default();
        let mut i = 0;
        while i < args.len() {
            let arg = &args[i];
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
                _ => (arg.as_str(), None),
            };
            if SWITCHES.contains(&name) || stand_in::SWITCHES.contains(&name) {
                match name {
                    "--enable-dp-attention" => f.enable_dp_attention = true,
                    "--enable-kv-cache-sharding" => f.enable_kv_cache_sharding = true,
                    "--sim-fault-stall-transfers" => f.sim_fault_stall_transfers = true,
                    _ => f.enable_dsa_cache_layer_split = true,
                }
                i += 1;
                continue;
            }
            let known = VALUE_FLAGS.iter().find(|names| names.contains(&name)).map(|names| names[0]);
            let Some(canonical) = known.or_else(|| stand_in::VALUE_OPTIONS.iter().copied().find(|o| *o == name)) else {
                // Not modelled: skip it and its value, if it has one.
                f.ignored.push(arg.clone());
                if inline.is_none() && args.get(i + 1).is_some_and(|n| !n.starts_with("--")) {
                    f.ignored.push(args[i + 1].clone());
                    i += 1;
                }
                i += 1;
                continue;
            };
            let value = match inline {
                Some(v) => v,
                None => {
                    i += 1;
                    args.get(i).cloned().ok_or_else(|| SimError::Flags(format!("{canonical} expects a value")))?
                }
            };
            f.set(canonical, &value)?;
            i += 1;
        }
        Ok(f)
    }

    fn set(&mut self, flag: &str, v: &str) -> Result<(), SimError> {
        match flag {
            "--disaggregation-mode" => self.mode = v.to_owned(),
            "--disaggregation-bootstrap-port" => self.bootstrap_port = number(flag, v)?,
            "--disaggregation-decode-allocation-policy" => self.decode_allocation_policy = v.to_owned(),
            "--tp-size" => self.tp = number(flag, v)?,
            "--dp-size" => self.dp = number(flag, v)?,
            "--attn-dp-size" => self.attn_dp = number(flag, v)?,
            "--pp-size" => self.pp = number(flag, v)?,
            "--attn-cp-size" => self.attn_cp = number(flag, v)?,
            "--dcp-size" => self.dcp = number(flag, v)?,
            "--page-size" => self.page_size = Some(number(flag, v)?),
            "--kv-cache-dtype" => self.kv_cache_dtype = v.to_owned(),
            "--host" => self.host = v.to_owned(),
            "--port" => self.port = number(flag, v)?,
            "--dist-init-addr" => self.dist_init_addr = Some(v.to_owned()),
            "--nnodes" => self.nnodes = number(flag, v)?,
            "--node-rank" => self.node_rank = number(flag, v)?,
            "--load-balance-method" => self.load_balance_method = v.to_owned(),
            "--model-path" => self.model_path = v.to_owned(),
            "--served-model-name" => self.served_model_name = Some(v.to_owned()),
            "--max-running-requests" => self.max_running_requests = number(flag, v)?,
            "--sim-prefill-tokens-per-s" => self.sim_prefill_tokens_per_s = non_negative(flag, v)?,
            "--sim-itl-ms" => self.sim_itl_ms = non_negative(flag, v)?,
            "--sim-itl-ms-per-running" => self.sim_itl_ms_per_running = non_negative(flag, v)?,
            "--sim-kv-pool" => {
                if !["mla", "hybrid_mla", "mha"].contains(&v) {
                    return Err(SimError::Flags(format!("--sim-kv-pool expects mla, hybrid_mla or mha, got {v:?}")));
                }
                self.sim_kv_pool = Some(v.to_owned());
            }
            "--sim-num-layers" => self.sim_num_layers = Some(number(flag, v)?),
            "--sim-num-kv-heads" => self.sim_num_kv_heads = number(flag, v)?,
            "--sim-head-dim" => self.sim_head_dim = number(flag, v)?,
            "--sim-kv-latent-dim" => self.sim_kv_latent_dim = number(flag, v)?,
            "--sim-transfer-gbps" => self.sim_transfer_gbps = non_negative(flag, v)?,
            "--sim-fault-die-mid-transfer" => self.sim_fault_die_mid_transfer = number(flag, v)?,
            "--sim-page-size" => self.sim_page_size = Some(number(flag, v)?),
            "--sim-kv-cache-dtype" => self.sim_kv_cache_dtype = Some(v.to_owned()),
            "--sim-hold-registrations" => self.sim_hold_registrations = number(flag, v)?,
            "--sim-bootstrap-server" => {
                self.sim_bootstrap_server = match v {
                    "true" => true,
                    "false" => false,
                    _ => return Err(SimError::Flags(format!("--sim-bootstrap-server expects true or false, got {v:?}"))),
                }
            }
            _ => unreachable!("every VALUE_FLAGS and stand_in::VALUE_OPTIONS entry has an arm"),
        }
        Ok(())
    }
}

/// Parallel sizes after SGLang's resolution (spec §4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    pub tp: i64,
    pub dp: i64,
    pub attn_dp: i64,
    pub attn_cp: i64,
    pub attn_tp: i64,
    pub pp: i64,
}

pub fn resolve(f: &EngineFlags) -> Result<Topology, SimError> {
    let (mut dp, mut attn_dp) = (f.dp, f.attn_dp);
    if f.enable_dp_attention && attn_dp == 1 {
        attn_dp = dp;
        dp = 1;
    }
    for (name, v) in
        [("--tp-size", f.tp), ("--dp-size", dp), ("--attn-dp-size", attn_dp), ("--pp-size", f.pp), ("--attn-cp-size", f.attn_cp)]
    {
        if v < 1 {
            return Err(SimError::Flags(format!("{name} must be at least 1, got {v}")));
        }
    }
    if attn_dp > 1 && dp > 1 {
        return Err(SimError::Flags(format!(
            "--dp-size {dp} with --attn-dp-size {attn_dp}: data-parallel replicas combined with attention data parallelism are not supported."
        )));
    }
    if f.tp % (attn_dp * f.attn_cp) != 0 {
        return Err(SimError::Flags(format!(
            "--tp-size {} is not divisible by --attn-dp-size {attn_dp} x --attn-cp-size {}",
            f.tp, f.attn_cp
        )));
    }
    Ok(Topology { tp: f.tp, dp, attn_dp, attn_cp: f.attn_cp, attn_tp: f.tp / attn_dp / f.attn_cp, pp: f.pp })
}

/// One scheduler process of the prefill: its coordinates in the bootstrap table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankSlot {
    pub replica: i64,
    pub pp_rank: i64,
    pub tp_rank: i64,
}

/// Every scheduler process of the instance, replica-major, then pp, then tp.
pub fn rank_slots(t: &Topology) -> Vec<RankSlot> {
    let mut out = Vec::new();
    for replica in 0..t.dp {
        for pp_rank in 0..t.pp {
            for tp_rank in 0..t.tp {
                out.push(RankSlot { replica, pp_rank, tp_rank });
            }
        }
    }
    out
}

/// The slots node `node_rank` of `nnodes` runs: an even, contiguous share. Which node sends a row
/// does not change the bootstrap table.
pub fn node_share(slots: &[RankSlot], nnodes: i64, node_rank: i64) -> Vec<RankSlot> {
    let n = slots.len() as i64;
    let nnodes = nnodes.max(1);
    slots.iter().enumerate().filter(|(i, _)| *i as i64 * nnodes / n.max(1) == node_rank).map(|(_, s)| *s).collect()
}

/// The model as SGLang reads it: `<--model-path>/config.json` when that file exists, else the
/// model catalogue's entry for the path.
fn model_facts(f: &EngineFlags) -> pd_core::model::ModelFacts {
    let spec = pd_api::ModelSpec { path: f.model_path.clone(), ..Default::default() };
    let config = std::fs::read_to_string(std::path::Path::new(&f.model_path).join("config.json"))
        .ok()
        .and_then(|text| pd_core::model::HfConfig::parse(&text).ok());
    pd_core::model::resolve(&spec, config.as_ref())
}

/// Variables of the engine's own environment that SGLang's DeepSeek-V4 pool reads.
const DSV4_ENV: [&str; 2] = ["SGLANG_DSV4_KV_LAYOUT", "SGLANG_DSV4_COMPRESSED_KV_LAYOUT"];

/// This engine's flags as a one-role spec, with the model's facts, for `pd_core::resolve`: what
/// SGLang's start-up would make of them (e.g. DSA's forced 64 and bfloat16, DeepSeek-V4's 256,
/// fp8_e4m3 and composite KV layout, a backend's page constraint). `None` for flags the spec
/// cannot express.
fn as_spec(f: &EngineFlags) -> Option<(pd_api::PDDeploymentSpec, pd_core::model::ModelFacts, pd_api::Role)> {
    let role = match f.mode.as_str() {
        "prefill" => pd_api::Role::Prefill,
        "decode" => pd_api::Role::Decode,
        _ => return None,
    };
    let env: Vec<Value> = DSV4_ENV.iter().filter_map(|n| std::env::var(n).ok().map(|v| json!({"name": n, "value": v}))).collect();
    let rs = json!({"parallelism": {"tp": 1}, "template": {"extraArgs": f.ignored, "env": env}});
    let spec: pd_api::PDDeploymentSpec = serde_json::from_value(json!({
        "model": {"path": f.model_path}, "kvTransfer": {"pageSize": f.page_size, "kvCacheDtype": f.kv_cache_dtype},
        "prefill": rs, "decode": rs,
    }))
    .ok()?;
    Some((spec, model_facts(f), role))
}

/// The page size the stand-in reports: `--sim-page-size` (a fault), else SGLang's resolution.
pub fn advertised_page_size(f: &EngineFlags) -> i64 {
    let resolved =
        || as_spec(f).map(|(s, facts, role)| i64::from(pd_core::resolve::role_page_size(&s, &facts, role, s.kv_transfer.page_size)));
    f.sim_page_size.or_else(resolved).or(f.page_size).unwrap_or(1)
}
/// The KV dtype the stand-in reports: `--sim-kv-cache-dtype` (a fault), else SGLang's resolution.
pub fn advertised_kv_dtype(f: &EngineFlags) -> String {
    let resolved = || as_spec(f).map(|(s, facts, role)| pd_core::resolve::kv_cache_dtype(&s, &facts, role));
    f.sim_kv_cache_dtype.clone().or_else(resolved).unwrap_or_else(|| f.kv_cache_dtype.clone())
}
/// The DeepSeek-V4 KV layout the stand-in reports (`pd_kv_layout`), none for other models.
pub fn advertised_kv_layout(f: &EngineFlags) -> Option<String> {
    as_spec(f).and_then(|(s, facts, role)| pd_core::resolve::dsv4_kv_layout(&s, &facts, role).ok().flatten())
}
/// Whether this engine runs DeepSeek-V4.1 DSpark (and so reports a DSpark layout).
fn runs_dspark(f: &EngineFlags) -> bool {
    as_spec(f).is_some_and(|(s, facts, role)| pd_core::resolve::dspark(&s, &facts, role))
}
fn resolved_load_balance(f: &EngineFlags) -> &str {
    if f.load_balance_method == "auto" { "follow_bootstrap_room" } else { &f.load_balance_method }
}

/// A scheduler process's attention ranks `(tp, cp, dp)`: inside a TP group the layout is
/// (dp, cp, tp), tp fastest (spec §4.1).
pub fn attention_ranks(t: &Topology, slot: RankSlot) -> (i64, i64, i64) {
    (slot.tp_rank % t.attn_tp, (slot.tp_rank / t.attn_tp) % t.attn_cp, slot.tp_rank / (t.attn_tp * t.attn_cp))
}

/// The bootstrap row `(dp group, cp, tp, pp)` a scheduler process registers under.
pub fn row_of(t: &Topology, slot: RankSlot) -> (i64, i64, i64, i64) {
    let (tp, cp, dp) = attention_ranks(t, slot);
    (if t.dp == 1 { dp } else { slot.replica }, cp, tp, slot.pp_rank)
}

/// The `PUT /route` body of one scheduler process: SGLang's 21 keys in SGLang's order.
pub fn registration_body(f: &EngineFlags, t: &Topology, slot: RankSlot, rank_ip: &str, rank_port: u16) -> Value {
    let (a_tp, a_cp, a_dp) = attention_ranks(t, slot);
    json!({
        "attn_tp_size": t.attn_tp,
        "attn_tp_rank": a_tp,
        "attn_cp_size": t.attn_cp,
        "attn_cp_rank": a_cp,
        "attn_dp_size": t.attn_dp,
        "attn_dp_rank": a_dp,
        "pp_size": t.pp,
        "pp_rank": slot.pp_rank,
        "system_dp_size": t.dp,
        "system_dp_rank": slot.replica,
        "rank_ip": rank_ip,
        "rank_port": rank_port,
        "page_size": advertised_page_size(f),
        "kv_cache_dtype": advertised_kv_dtype(f),
        "kv_layout": advertised_kv_layout(f),
        "dsv41_spec_layout": if runs_dspark(f) { pd_core::handshake::core::dspark_layout_stand_in() } else { Value::Null },
        "load_balance_method": resolved_load_balance(f),
        "enable_dsa_cache_layer_split": f.enable_dsa_cache_layer_split,
        "enable_kv_cache_sharding": f.enable_kv_cache_sharding,
        "prefill_http_port": f.port,
        "decode_allocation_policy": f.decode_allocation_policy,
    })
}

/// Host the ranks register with: the `--dist-init-addr` host, else `--host` with wildcards
/// rewritten to loopback (spec §1.2). DNS resolution happens at send time.
pub fn registration_host(f: &EngineFlags) -> String {
    if let Some(addr) = &f.dist_init_addr {
        let host = match addr.rsplit_once(':') {
            Some((h, _)) => h,
            None => addr.as_str(),
        };
        return host.trim_start_matches('[').trim_end_matches(']').to_owned();
    }
    match f.host.as_str() {
        "0.0.0.0" => "127.0.0.1".into(),
        "::" => "::1".into(),
        h => h.to_owned(),
    }
}

/// The KV pool kind: `--sim-kv-pool`, else what the model catalogue says of `--model-path`.
pub fn kv_pool(f: &EngineFlags) -> PoolKind {
    match f.sim_kv_pool.as_deref() {
        Some("mla") => PoolKind::Mla,
        Some("hybrid_mla") => PoolKind::HybridMla,
        Some(_) => PoolKind::Mha,
        None => model_facts(f).pool().unwrap_or(PoolKind::Mha),
    }
}

/// The stand-in model's KV geometry from the flags.
pub fn kv_geometry(f: &EngineFlags) -> Result<KvGeometry, SimError> {
    let pool = kv_pool(f);
    let dtype_bits = kv::dtype_bits(&f.kv_cache_dtype)
        .ok_or_else(|| SimError::Flags(format!("--kv-cache-dtype {:?} has no element size the stand-in knows", f.kv_cache_dtype)))?;
    let layers = f.sim_num_layers.unwrap_or(if pool == PoolKind::Mha { defaults::LAYERS } else { defaults::MLA_LAYERS });
    Ok(KvGeometry { pool, layers, kv_heads: f.sim_num_kv_heads, head_dim: f.sim_head_dim, latent_dim: f.sim_kv_latent_dim, dtype_bits })
}

/// The decode's own side of the handshake, as its scheduler processes would see it.
pub fn decode_topology(f: &EngineFlags, t: &Topology) -> Result<DecodeTopology, SimError> {
    let pool = kv_pool(f);
    let all_cp = std::env::var("SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER")
        .is_ok_and(|v| ["true", "1", "yes", "y"].contains(&v.to_ascii_lowercase().as_str()));
    DecodeTopology::parse(&json!({
        "attn_tp_size": t.attn_tp, "attn_cp_size": t.attn_cp, "pp_size": t.pp, "dcp_size": f.dcp,
        "page_size": advertised_page_size(f), "kv_cache_dtype": advertised_kv_dtype(f), "kv_pool": pool,
        "all_cp_ranks_transfer": all_cp, "decode_allocation_policy": f.decode_allocation_policy,
        "kv_layout": advertised_kv_layout(f), "dspark": runs_dspark(f),
    }))
    .map_err(|e| SimError::Flags(e.to_string()))
}

/// The name the engine answers under (`--served-model-name`, else `--model-path`).
pub fn served_name(f: &EngineFlags) -> String {
    f.served_model_name.clone().unwrap_or_else(|| if f.model_path.is_empty() { "default".into() } else { f.model_path.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn parses_rendered_flags_aliases_and_skips_unknown_ones() {
        let f = EngineFlags::parse(&argv(
            "--model-path m --disaggregation-mode prefill --tensor-parallel-size 8 --attn-dp-size=2 --page-size 64 \
             --trust-remote-code --mem-fraction-static 0.8 --enable-kv-cache-sharding --sim-page-size 32",
        ))
        .unwrap();
        assert_eq!((f.mode.as_str(), f.tp, f.attn_dp, f.page_size, f.sim_page_size), ("prefill", 8, 2, Some(64), Some(32)));
        assert!(f.enable_kv_cache_sharding);
        assert_eq!(f.ignored, argv("--trust-remote-code --mem-fraction-static 0.8"));
        assert_eq!(advertised_page_size(&f), 32);
        // Without a fault it reports what SGLang resolves: DSA forces page 64 and bfloat16.
        let dsa = EngineFlags::parse(&argv(
            "--model-path deepseek-ai/DeepSeek-V3.2-Exp --disaggregation-mode decode --page-size 32 --kv-cache-dtype auto",
        ))
        .unwrap();
        assert_eq!((advertised_page_size(&dsa), advertised_kv_dtype(&dsa).as_str()), (64, "bfloat16"));
        let plain = EngineFlags::parse(&argv("--model-path Qwen/Qwen3-8B --disaggregation-mode prefill --page-size 32")).unwrap();
        assert_eq!((advertised_page_size(&plain), advertised_kv_dtype(&plain).as_str()), (32, "auto"));
        assert!(matches!(EngineFlags::parse(&argv("--tp-size two")), Err(SimError::Flags(m)) if m.contains("--tp-size")));
        assert!(EngineFlags::parse(&argv("--tp-size")).is_err());
    }

    #[test]
    fn resolves_like_sglang_and_registers_every_rank() {
        let f = EngineFlags::parse(&argv("--tp-size 8 --attn-dp-size 2")).unwrap();
        let t = resolve(&f).unwrap();
        assert_eq!((t.attn_tp, t.attn_dp, t.dp), (4, 2, 1));
        let slots = rank_slots(&t);
        assert_eq!(slots.len(), 8);
        let body = registration_body(&f, &t, slots[5], "10.0.0.1", 4000);
        assert_eq!((body["attn_tp_rank"].as_i64(), body["attn_dp_rank"].as_i64()), (Some(1), Some(1)));
        let keys: Vec<&str> = body.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 21);
        assert_eq!(keys[..3], ["attn_tp_size", "attn_tp_rank", "attn_cp_size"]);
        assert_eq!(body["load_balance_method"], "follow_bootstrap_room");

        let old = EngineFlags::parse(&argv("--tp-size 8 --dp-size 2 --enable-dp-attention")).unwrap();
        assert_eq!(resolve(&old).unwrap().attn_dp, 2);
        let both = EngineFlags::parse(&argv("--tp-size 8 --dp-size 2 --attn-dp-size 2")).unwrap();
        assert!(resolve(&both).is_err());
    }

    #[test]
    fn nodes_split_the_ranks_and_register_with_the_dist_init_host() {
        let f = EngineFlags::parse(&argv("--tp-size 16 --nnodes 2 --dist-init-addr p-0.svc:5000 --host 0.0.0.0")).unwrap();
        let slots = rank_slots(&resolve(&f).unwrap());
        let (a, b) = (node_share(&slots, 2, 0), node_share(&slots, 2, 1));
        assert_eq!((a.len(), b.len()), (8, 8));
        assert_eq!((a[7].tp_rank, b[0].tp_rank), (7, 8));
        assert_eq!(registration_host(&f), "p-0.svc");
        assert_eq!(registration_host(&EngineFlags { host: "0.0.0.0".into(), ..Default::default() }), "127.0.0.1");
    }
}
