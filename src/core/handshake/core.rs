//! SGLang 0.5.23's decode-side handshake, pure: parse a prefill's topology body the way the
//! decode does, run its checks in its order with its texts, and compute the rank mapping.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

use super::pyvalue;
use crate::release::{Release, rule_holds};

/// Keys a 0.5.23 topology body may carry, in the order the bootstrap server writes them.
pub const TOPOLOGY_KEYS: [&str; 19] = [
    "attn_tp_size",
    "attn_cp_size",
    "dp_size",
    "pp_size",
    "page_size",
    "kv_cache_dtype",
    "follow_bootstrap_room",
    "enable_dsa_cache_layer_split",
    "dsv41_spec_layout",
    "kv_layout",
    "decode_allocation_policy",
    "enable_kv_cache_sharding",
    "prefill_http_port",
    "target_tp_rank",
    "target_tp_ranks",
    "target_cp_ranks",
    "target_pp_ranks",
    "required_dst_info_num",
    "required_prefill_response_num",
];
/// Keys without a default in SGLang's record: a body missing one is rejected.
const REQUIRED_KEYS: usize = 7;
/// Where the decode-side scratch fields of the record start (`target_tp_rank` onwards): a
/// prefill always sends them as null.
const SCRATCH_KEYS_FROM: usize = 13;

/// The record's decode-side scratch fields, which a prefill's `/route` answer carries as null.
pub fn decode_scratch_keys() -> &'static [&'static str] {
    &TOPOLOGY_KEYS[SCRATCH_KEYS_FROM..]
}

/// The keys of a DSpark layout (`get_dsv41_spec_layout`), sorted.
pub const DSPARK_LAYOUT_KEYS: [&str; 6] =
    ["compression_ratios", "kv_item_lens", "kv_layer_ids", "num_draft_tokens", "state_item_lens", "state_types"];

/// A DSpark layout whose contents are not known offline (they describe the engine's pool
/// buffers): every key present, so a peer without DSpark differs in all of them, as in SGLang.
pub fn dspark_layout_stand_in() -> Value {
    Value::Object(DSPARK_LAYOUT_KEYS.iter().map(|k| ((*k).to_owned(), Value::from("unknown offline"))).collect())
}

pub const STATE_TYPES: &[&str] = &[
    "mamba",
    "qsa_pending",
    "qsa_compressed",
    "swa",
    "dsa",
    "dsa_tail",
    "minimax_index_k",
    "minimax_dense_kv",
    "swa_ring",
    "c128_state",
    "request_row",
    "block_scale",
    "block_scale_swa",
];

/// The KV pool kind SGLang's PD handshake looks at (`is_mla_backend`, `is_hybrid_mla_backend`):
/// `Mha` is everything else (MHA/GQA, SWA, MiniMax sparse, hybrid linear over MHA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    Mla,
    HybridMla,
    Mha,
}

impl PoolKind {
    /// `is_mla_backend or is_hybrid_mla_backend`: the pools decode DCP and the MLA mapping take.
    pub fn is_mla_or_hybrid(self) -> bool {
        matches!(self, Self::Mla | Self::HybridMla)
    }
}

fn one() -> i64 {
    1
}

/// The decode rank's own side of the handshake (issue #6's decode JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeTopology {
    pub attn_tp_size: i64,
    #[serde(default = "one")]
    pub attn_cp_size: i64,
    #[serde(default = "one")]
    pub pp_size: i64,
    #[serde(default = "one")]
    pub dcp_size: i64,
    pub page_size: i64,
    pub kv_cache_dtype: String,
    pub kv_pool: PoolKind,
    #[serde(default)]
    pub all_cp_ranks_transfer: bool,
    #[serde(default)]
    pub kv_layout: Option<String>,
    #[serde(default)]
    pub dsv41_spec_layout: Option<Map<String, Value>>,
    /// The decode runs DeepSeek-V4.1 DSpark, but its layout (which describes the engine's pool
    /// buffers) is not known offline: check #5 then only asks that the prefill report one (the
    /// engine compares the two itself), and check #6 runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dspark: bool,
    #[serde(default)]
    pub state_types: Vec<String>,
    /// `--disaggregation-decode-allocation-policy`; only the sidecar's receiver-time checks use it.
    #[serde(default = "early")]
    pub decode_allocation_policy: String,
    /// The SGLang release the decode runs: its record's keys and its checks. Unset: 0.5.23.
    #[serde(default = "reference_release", skip_serializing_if = "Release::is_reference")]
    pub release: Release,
}

fn reference_release() -> Release {
    Release::REFERENCE
}

fn early() -> String {
    "early".into()
}

#[derive(Debug, Error, PartialEq)]
pub enum InputError {
    #[error("decode topology: {0}")]
    Decode(String),
    #[error("prefill topology body: {0}")]
    Prefill(String),
}

impl DecodeTopology {
    pub fn parse(value: &Value) -> Result<Self, InputError> {
        let d: DecodeTopology =
            serde_path_to_error::deserialize(value).map_err(|e| InputError::Decode(format!("field `{}`: {}", e.path(), e.inner())))?;
        for (name, v) in [
            ("attn_tp_size", d.attn_tp_size),
            ("attn_cp_size", d.attn_cp_size),
            ("pp_size", d.pp_size),
            ("dcp_size", d.dcp_size),
            ("page_size", d.page_size),
        ] {
            if v < 1 {
                return Err(InputError::Decode(format!("`{name}` must be at least 1, got {v}")));
            }
        }
        if let Some(bad) = d.state_types.iter().find(|s| !STATE_TYPES.contains(&s.as_str())) {
            return Err(InputError::Decode(format!("unknown state type {bad:?}; SGLang's are {}", STATE_TYPES.join(", "))));
        }
        Ok(d)
    }
    fn mla(&self) -> bool {
        self.kv_pool == PoolKind::Mla
    }
    fn mla_or_hybrid(&self) -> bool {
        self.kv_pool.is_mla_or_hybrid()
    }
}

/// A topology body after SGLang's coercions (`PrefillServerInfo.__post_init__`).
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillInfo {
    pub attn_tp_size: i64,
    pub attn_cp_size: i64,
    pub dp_size: i64,
    pub pp_size: i64,
    pub page_size: Option<i64>,
    pub kv_cache_dtype: Option<String>,
    pub follow_bootstrap_room: bool,
    pub enable_dsa_cache_layer_split: bool,
    /// Used as sent (null when absent).
    pub dsv41_spec_layout: Value,
    pub kv_layout: Value,
    pub decode_allocation_policy: Value,
    pub enable_kv_cache_sharding: Value,
    pub prefill_http_port: Option<i64>,
}

fn plural_missing(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    let list = match quoted.len() {
        1 => quoted[0].clone(),
        2 => format!("{} and {}", quoted[0], quoted[1]),
        n => format!("{}, and {}", quoted[..n - 1].join(", "), quoted[n - 1]),
    };
    let noun = if names.len() == 1 { "argument" } else { "arguments" };
    format!("missing {} required positional {noun}: {list}", names.len())
}

impl PrefillInfo {
    /// Builds the record as SGLang 0.5.23's decode does; the error is the Python exception text.
    pub fn from_body(body: &Value) -> Result<Self, String> {
        Self::from_release_body(Release::REFERENCE, body)
    }

    /// Builds the record as `release`'s decode does: a key its record lacks is refused.
    pub fn from_release_body(release: Release, body: &Value) -> Result<Self, String> {
        let obj = body.as_object().ok_or_else(|| {
            format!("TypeError: PrefillServerInfo() argument after ** must be a mapping, not {}", pyvalue::type_name(body))
        })?;
        let known = |k: &str| TOPOLOGY_KEYS.contains(&k) && !release.unknown_topology_keys().contains(&k);
        if let Some(k) = obj.keys().find(|k| !known(k)) {
            return Err(format!("TypeError: PrefillServerInfo.__init__() got an unexpected keyword argument '{k}'"));
        }
        let missing: Vec<&str> = TOPOLOGY_KEYS[..REQUIRED_KEYS].iter().copied().filter(|k| !obj.contains_key(*k)).collect();
        if !missing.is_empty() {
            return Err(format!("TypeError: PrefillServerInfo.__init__() {}", plural_missing(&missing)));
        }
        let get = |k: &str| obj.get(k).cloned().unwrap_or(Value::Null);
        let int = |k: &str| pyvalue::int(&get(k));
        let opt_int = |k: &str| match get(k) {
            Value::Null => Ok(None),
            v => pyvalue::int(&v).map(Some),
        };
        Ok(Self {
            attn_tp_size: int("attn_tp_size")?,
            attn_cp_size: int("attn_cp_size")?,
            dp_size: int("dp_size")?,
            pp_size: int("pp_size")?,
            page_size: opt_int("page_size")?,
            kv_cache_dtype: match get("kv_cache_dtype") {
                Value::Null => None,
                v => Some(pyvalue::str(&v)),
            },
            follow_bootstrap_room: pyvalue::truthy(&get("follow_bootstrap_room")),
            enable_dsa_cache_layer_split: pyvalue::truthy(&get("enable_dsa_cache_layer_split")),
            dsv41_spec_layout: get("dsv41_spec_layout"),
            kv_layout: get("kv_layout"),
            decode_allocation_policy: obj.get("decode_allocation_policy").cloned().unwrap_or_else(|| Value::from("early")),
            enable_kv_cache_sharding: obj.get("enable_kv_cache_sharding").cloned().unwrap_or(Value::Bool(false)),
            prefill_http_port: opt_int("prefill_http_port")?,
        })
    }

    fn sharding(&self) -> bool {
        pyvalue::truthy(&self.enable_kv_cache_sharding)
    }

    /// The topology body a prefill with this record would send (`from_body`'s inverse), without
    /// the decode-side scratch keys.
    /// The body a prefill of `release` registers: its own record's keys only (0.5.21's has no
    /// `decode_allocation_policy`, `kv_layout` or `enable_kv_cache_sharding`).
    pub fn to_release_body(&self, release: Release) -> Value {
        let mut body = self.to_body();
        if let Some(obj) = body.as_object_mut() {
            for k in release.unknown_topology_keys() {
                obj.remove(*k);
            }
        }
        body
    }

    pub fn to_body(&self) -> Value {
        serde_json::json!({
            "attn_tp_size": self.attn_tp_size,
            "attn_cp_size": self.attn_cp_size,
            "dp_size": self.dp_size,
            "pp_size": self.pp_size,
            "page_size": self.page_size,
            "kv_cache_dtype": self.kv_cache_dtype,
            "follow_bootstrap_room": self.follow_bootstrap_room,
            "enable_dsa_cache_layer_split": self.enable_dsa_cache_layer_split,
            "dsv41_spec_layout": self.dsv41_spec_layout,
            "kv_layout": self.kv_layout,
            "decode_allocation_policy": self.decode_allocation_policy,
            "enable_kv_cache_sharding": self.enable_kv_cache_sharding,
            "prefill_http_port": self.prefill_http_port,
        })
    }
}

/// One of SGLang 0.5.23's decode-side checks (`try_ensure_parallel_info` #1..#13, the rank
/// mapping, the receiver's request checks). It decides what a failure means outside the engine:
/// the condition reason, the spec field that causes it, the admission rule and the fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    PageSize,
    KvCacheDtype,
    MiniMaxAttnTp,
    KvLayout,
    DSparkLayout,
    DSparkTp,
    Mxfp8AttnTp,
    DcpNeedsMla,
    DcpPrefillCp,
    DcpPrefillSharding,
    MlaShardingTp,
    DecodeCp,
    DecodePp,
    AllocationPolicy,
    PrefillCompletePeer,
    /// A body no real deployment sends (sizes beyond any cluster).
    Implausible,
    /// Python-level errors of the mapping arithmetic (ZeroDivisionError, IndexError, ...).
    Mapping,
}

impl Check {
    /// Short CamelCase reason for Kubernetes conditions, e.g. `PageSizeMismatch`.
    pub fn reason(self) -> &'static str {
        match self {
            Self::PageSize => "PageSizeMismatch",
            Self::KvCacheDtype => "KVCacheDtypeMismatch",
            Self::KvLayout => "KVLayoutMismatch",
            Self::DSparkLayout => "DSparkLayoutMismatch",
            Self::MiniMaxAttnTp | Self::DSparkTp | Self::Mxfp8AttnTp | Self::MlaShardingTp => "AttentionTPMismatch",
            Self::DcpNeedsMla | Self::DcpPrefillCp | Self::DcpPrefillSharding | Self::DecodeCp => "DecodeContextParallelUnsupported",
            Self::DecodePp => "PipelineParallelMismatch",
            Self::AllocationPolicy | Self::PrefillCompletePeer => "AllocationPolicyMismatch",
            Self::Implausible => "IncompatibleTopologyBody",
            Self::Mapping => "HandshakeFailed",
        }
    }

    /// The admission rule id (`pd-operator validate`), e.g. `page-size-mismatch`.
    pub fn rule(self) -> &'static str {
        match self {
            Self::PageSize => "page-size-mismatch",
            Self::KvCacheDtype => "kv-dtype-mismatch",
            Self::MiniMaxAttnTp => "minimax-equal-attn-tp",
            Self::KvLayout => "kv-layout-mismatch",
            Self::DSparkLayout => "dspark-layout-mismatch",
            Self::DSparkTp => "dspark-equal-tp",
            Self::Mxfp8AttnTp => "mxfp8-equal-attn-tp",
            Self::DcpNeedsMla => "decode-dcp-needs-mla",
            Self::DcpPrefillCp => "decode-dcp-prefill-cp",
            Self::DcpPrefillSharding => "decode-dcp-prefill-sharding",
            Self::MlaShardingTp => "mla-sharding-equal-tp",
            Self::DecodeCp => "decode-cp-one",
            Self::DecodePp => "decode-pp",
            Self::AllocationPolicy => "allocation-policy-mismatch",
            Self::PrefillCompletePeer => "prefill-complete-peer",
            Self::Implausible | Self::Mapping => "handshake-mapping",
        }
    }

    /// The `PDDeployment` field whose value makes the check fail.
    pub fn field(self) -> &'static str {
        match self {
            Self::PageSize => "spec.kvTransfer.pageSize",
            Self::KvCacheDtype => "spec.kvTransfer.kvCacheDtype",
            Self::KvLayout | Self::DSparkLayout => "spec.decode.template.extraArgs",
            Self::MiniMaxAttnTp | Self::DSparkTp | Self::Mxfp8AttnTp | Self::MlaShardingTp | Self::Mapping | Self::Implausible => {
                "spec.decode.parallelism.tp"
            }
            Self::DcpNeedsMla => "spec.decode.parallelism.dcp",
            Self::DcpPrefillCp => "spec.prefill.parallelism.attnCp",
            Self::DcpPrefillSharding => "spec.prefill.enableKvCacheSharding",
            Self::DecodeCp => "spec.decode.parallelism.attnCp",
            Self::DecodePp => "spec.decode.parallelism.pp",
            Self::AllocationPolicy => "spec.kvTransfer.decodeAllocationPolicy",
            Self::PrefillCompletePeer => "spec.prefill.parallelism",
        }
    }

    /// How to change the spec so the check passes.
    pub fn fix(self) -> &'static str {
        match self {
            Self::PageSize => "set spec.kvTransfer.pageSize to a size both roles keep (DSA forces 64, DeepSeek-V4 256)",
            Self::KvCacheDtype => "set kvCacheDtype explicitly (fp8_e4m3 or bfloat16), or run both roles on the same GPU generation",
            Self::KvLayout => "give both roles the same --dsv4-attn-backend and SGLANG_DSV4_KV_LAYOUT",
            Self::DSparkLayout => "enable DSpark on both roles with the same block size and draft settings",
            Self::MiniMaxAttnTp | Self::DSparkTp => "give both roles the same attention TP (tp / attnDp / attnCp)",
            Self::Mxfp8AttnTp => "give both roles the same attention TP, or use another kvCacheDtype",
            Self::DcpNeedsMla => {
                "set spec.decode.parallelism.dcp: 1 (DCP only shards MLA latent caches), or serve an MLA / hybrid-MLA model such as DeepSeek-V3"
            }
            Self::DcpPrefillCp => "set spec.prefill.parallelism.attnCp: 1, or decode dcp: 1",
            Self::DcpPrefillSharding => "turn off prefill enableKvCacheSharding, or set decode dcp: 1",
            Self::MlaShardingTp => "give both roles the same attention TP, or turn off prefill enableKvCacheSharding",
            Self::DecodeCp => "set spec.decode.parallelism.attnCp: 1 (use dcp for decode context parallelism on MLA models)",
            Self::DecodePp => "set spec.decode.parallelism.pp to 1 or the prefill's pp",
            Self::AllocationPolicy => "set --disaggregation-decode-allocation-policy identically on both roles",
            Self::PrefillCompletePeer => "give the prefill attention TP 1, attnCp 1 and pp 1, or use decodeAllocationPolicy: early",
            Self::Implausible | Self::Mapping => "choose attention TP, CP and PP sizes where the larger is a multiple of the smaller",
        }
    }

    /// What the check depends on, for a finding that cannot decide it without the pool kind.
    pub fn topic(self) -> &'static str {
        match self {
            Self::Mxfp8AttnTp => "MXFP8 KV with different attention TP sizes",
            Self::DcpNeedsMla => "decode dcp > 1",
            Self::MlaShardingTp => "KV-cache sharding with different attention TP sizes",
            Self::DSparkTp => "DeepSeek-V4.1 DSpark with different attention TP sizes",
            _ => "the decode's handshake",
        }
    }
}

/// The exception a real decode would raise, as `kind` and `str(exception)` (for assertions
/// `error` is the message without Python's tuple wrapper), and the check that raised it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HandshakeFailure {
    pub kind: &'static str,
    pub error: String,
    #[serde(skip)]
    pub check: Check,
}

impl HandshakeFailure {
    fn runtime(check: Check, error: impl Into<String>) -> Self {
        Self { kind: "RuntimeError", error: error.into(), check }
    }
    fn assertion(check: Check, error: impl Into<String>) -> Self {
        Self { kind: "AssertionError", error: error.into(), check }
    }
    fn zero_division() -> Self {
        Self { kind: "ZeroDivisionError", error: "integer division or modulo by zero".into(), check: Check::Mapping }
    }
    /// Short CamelCase reason for Kubernetes conditions, e.g. `PageSizeMismatch`.
    pub fn reason(&self) -> &'static str {
        self.check.reason()
    }
}

/// What one decode rank reads from the prefill (`_resolve_rank_mapping`'s result).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankMapping {
    pub engine_rank: i64,
    pub pp_rank: i64,
    pub target_tp_rank: Option<i64>,
    pub target_tp_ranks: Vec<i64>,
    pub target_cp_ranks: Vec<i64>,
    pub target_pp_ranks: Vec<i64>,
    pub required_dst_info_num: i64,
    pub required_prefill_response_num: i64,
}

/// Result of a successful handshake: the mapping of every decode rank, and the warning SGLang
/// logs (once per process) when attention TP differs on a non-MLA pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handshake {
    pub ranks: Vec<RankMapping>,
    pub warnings: Vec<String>,
}

/// Largest parallel size taken at face value from a topology body.
pub const MAX_PLAUSIBLE_SIZE: i64 = 1 << 16;

pub const PERF_WARNING: &str = "Performance is NOT guaranteed when using different TP sizes for non-MLA models. ";

fn floor_div(a: i64, b: i64) -> Result<i64, HandshakeFailure> {
    if b == 0 {
        return Err(HandshakeFailure::zero_division());
    }
    let q = a / b;
    Ok(if a % b != 0 && ((a < 0) != (b < 0)) { q - 1 } else { q })
}

fn py_range(start: i64, end: i64) -> Vec<i64> {
    if end <= start { Vec::new() } else { (start..end).collect() }
}

/// `x or {}`: Python's fallback for a falsy layout.
fn or_empty(v: &Value) -> Value {
    if pyvalue::truthy(v) { v.clone() } else { Value::Object(Map::new()) }
}

fn layout_diff(local: &Value, remote: &Value) -> Result<Vec<String>, HandshakeFailure> {
    let (l, r) = (or_empty(local), or_empty(remote));
    let keys_of = |v: &Value| -> Result<Vec<String>, HandshakeFailure> {
        v.as_object().map(|o| o.keys().cloned().collect()).ok_or_else(|| HandshakeFailure {
            kind: "AttributeError",
            error: format!("'{}' object has no attribute 'keys'", pyvalue::type_name(v)),
            check: Check::Mapping,
        })
    };
    let mut keys = keys_of(&l)?;
    keys.extend(keys_of(&r)?);
    keys.sort();
    keys.dedup();
    let get = |v: &Value, k: &str| v.get(k).cloned().unwrap_or(Value::Null);
    Ok(keys.into_iter().filter(|k| !pyvalue::eq(&get(&l, k), &get(&r, k))).collect())
}

type CheckFn = fn(&DecodeTopology, &PrefillInfo) -> Result<(), HandshakeFailure>;

/// Checks #1..#10 of `try_ensure_parallel_info`, in SGLang's order.
const SANITY_CHECKS: [CheckFn; 9] =
    [page_size, kv_cache_dtype, minimax_attn_tp, kv_layout, dspark, mxfp8_attn_tp, dcp_needs_mla, dcp_prefill_cp, dcp_prefill_sharding];
/// The asserts of `_resolve_rank_mapping` (#11..#13), which hold for every rank alike.
const MAPPING_CHECKS: [CheckFn; 3] = [mla_sharding_tp, decode_cp, decode_pp];
/// The receiver's request-level checks.
const RECEIVER_CHECKS: [CheckFn; 2] = [allocation_policy, prefill_complete_peer];

fn page_size(d: &DecodeTopology, p: &PrefillInfo) -> Result<(), HandshakeFailure> {
    match p.page_size.filter(|ps| *ps != d.page_size) {
        Some(ps) => Err(HandshakeFailure::runtime(
            Check::PageSize,
            format!(
                "Page size mismatch: prefill server has page_size={ps}, but decode server has page_size={}. Both servers must use the same --page-size value.",
                d.page_size
            ),
        )),
        None => Ok(()),
    }
}

fn kv_cache_dtype(d: &DecodeTopology, p: &PrefillInfo) -> Result<(), HandshakeFailure> {
    match p.kv_cache_dtype.as_ref().filter(|dt| **dt != d.kv_cache_dtype) {
        Some(dt) => Err(HandshakeFailure::runtime(
            Check::KvCacheDtype,
            format!(
                "KV cache dtype mismatch: prefill server has kv_cache_dtype={dt}, but decode server has kv_cache_dtype={}. Both servers must use the same --kv-cache-dtype value.",
                d.kv_cache_dtype
            ),
        )),
        None => Ok(()),
    }
}

fn minimax_attn_tp(d: &DecodeTopology, p: &PrefillInfo) -> Result<(), HandshakeFailure> {
    if d.state_types.iter().any(|s| s == "minimax_index_k") && p.attn_tp_size != d.attn_tp_size {
        return Err(HandshakeFailure::runtime(
            Check::MiniMaxAttnTp,
            format!("MiniMax sparse PD requires matching attention TP sizes: prefill={}, decode={}.", p.attn_tp_size, d.attn_tp_size),
        ));
    }
    Ok(())
}

fn kv_layout(d: &DecodeTopology, p: &PrefillInfo) -> Result<(), HandshakeFailure> {
    if let Some(dl) = &d.kv_layout {
        let local = Value::from(dl.as_str());
        if !p.kv_layout.is_null() && !pyvalue::eq(&p.kv_layout, &local) {
            return Err(HandshakeFailure::runtime(
                Check::KvLayout,
                format!(
                    "KV layout mismatch: prefill server has kv_layout={}, but decode server has kv_layout={dl}. Both servers must use the same --dsv4-attn-backend and SGLANG_DSV4_KV_LAYOUT.",
                    pyvalue::str(&p.kv_layout)
                ),
            ));
        }
    }
    Ok(())
}

/// Checks #5 and #6: DeepSeek-V4.1 DSpark's layout, then its TP (prefill-CP fan-in excepted).
fn dspark(d: &DecodeTopology, p: &PrefillInfo) -> Result<(), HandshakeFailure> {
    let local_layout = match &d.dsv41_spec_layout {
        Some(layout) => Value::Object(layout.clone()),
        // The engine's own layout, unknown here: taken as the prefill's when it reports one.
        None if d.dspark && p.dsv41_spec_layout.is_object() => p.dsv41_spec_layout.clone(),
        None if d.dspark => dspark_layout_stand_in(),
        None => Value::Null,
    };
    if local_layout.is_null() && p.dsv41_spec_layout.is_null() {
        return Ok(());
    }
    if !pyvalue::eq(&local_layout, &p.dsv41_spec_layout) {
        let fields = layout_diff(&local_layout, &p.dsv41_spec_layout)?;
        return Err(HandshakeFailure::runtime(
            Check::DSparkLayout,
            format!(
                "DeepSeek-V4.1 DSpark PD layout mismatch ({}): both servers must enable DSpark with the same block size and target/draft KV layout. Upgrade both servers together.",
                fields.join(", ")
            ),
        ));
    }
    let cp_fan_in = p.attn_cp_size > 1
        && d.mla_or_hybrid()
        && d.attn_cp_size == 1
        && p.attn_tp_size.checked_mul(p.attn_cp_size) == Some(d.attn_tp_size);
    if p.attn_tp_size != d.attn_tp_size && !cp_fan_in {
        return Err(HandshakeFailure::runtime(
            Check::DSparkTp,
            "DeepSeek-V4.1 DSpark PD requires the same TP size on both servers (including prefill CP ranks for MLA)",
        ));
    }
    Ok(())
}

fn mxfp8_attn_tp(d: &DecodeTopology, p: &PrefillInfo) -> Result<(), HandshakeFailure> {
    if p.attn_tp_size == d.attn_tp_size || d.mla_or_hybrid() {
        return Ok(());
    }
    let scales: Vec<Value> =
        d.state_types.iter().filter(|s| *s == "block_scale" || *s == "block_scale_swa").map(|s| Value::from(s.as_str())).collect();
    if scales.is_empty() {
        return Ok(());
    }
    Err(HandshakeFailure::runtime(
        Check::Mxfp8AttnTp,
        format!(
            "PD Disaggregation does NOT support different attention TP sizes with MXFP8 KV cache: prefill attn_tp_size={}, decode attn_tp_size={}, state types {}.",
            p.attn_tp_size,
            d.attn_tp_size,
            pyvalue::repr(&Value::Array(scales))
        ),
    ))
}

fn dcp_needs_mla(d: &DecodeTopology, _: &PrefillInfo) -> Result<(), HandshakeFailure> {
    if d.dcp_size > 1 && !d.mla_or_hybrid() {
        return Err(HandshakeFailure::runtime(Check::DcpNeedsMla, "PD decode DCP requires an MLA or hybrid-MLA KV pool."));
    }
    Ok(())
}

fn dcp_prefill_cp(d: &DecodeTopology, p: &PrefillInfo) -> Result<(), HandshakeFailure> {
    if d.dcp_size > 1 && p.attn_cp_size != 1 {
        return Err(HandshakeFailure::runtime(
            Check::DcpPrefillCp,
            format!("PD decode DCP currently requires prefill attention CP=1, got {}.", p.attn_cp_size),
        ));
    }
    Ok(())
}

fn dcp_prefill_sharding(d: &DecodeTopology, p: &PrefillInfo) -> Result<(), HandshakeFailure> {
    if d.dcp_size > 1 && p.sharding() {
        return Err(HandshakeFailure::runtime(
            Check::DcpPrefillSharding,
            "PD decode DCP does not support a prefill with --enable-kv-cache-sharding.",
        ));
    }
    Ok(())
}

/// MLA sharding reads every prefill TP rank: the TP part of the mapping needs equal sizes (#11).
fn mla_sharding(d: &DecodeTopology, p: &PrefillInfo) -> bool {
    d.mla() && p.sharding() && p.attn_cp_size == 1
}

fn mla_sharding_tp(d: &DecodeTopology, p: &PrefillInfo) -> Result<(), HandshakeFailure> {
    let (dtp, ptp) = (d.attn_tp_size, p.attn_tp_size);
    if mla_sharding(d, p) && dtp != ptp {
        return Err(HandshakeFailure::assertion(
            Check::MlaShardingTp,
            format!("MLA KV cache sharding requires equal prefill/decode attn TP sizes, got prefill={ptp} decode={dtp}"),
        ));
    }
    Ok(())
}

fn decode_cp(d: &DecodeTopology, _: &PrefillInfo) -> Result<(), HandshakeFailure> {
    if d.attn_cp_size != 1 {
        return Err(HandshakeFailure::assertion(Check::DecodeCp, format!("Decode cp size ({}) should be equal to 1", d.attn_cp_size)));
    }
    Ok(())
}

fn decode_pp(d: &DecodeTopology, p: &PrefillInfo) -> Result<(), HandshakeFailure> {
    if d.pp_size != p.pp_size && d.pp_size != 1 {
        return Err(HandshakeFailure::assertion(
            Check::DecodePp,
            format!("Decode pp size ({}) should be equal to prefill pp size ({}) or 1", d.pp_size, p.pp_size),
        ));
    }
    Ok(())
}

/// The TP part of `_resolve_rank_mapping`: (target tp rank, tp ranks, dst info num, responses).
fn map_tp(
    d: &DecodeTopology,
    p: &PrefillInfo,
    e: i64,
    warnings: &mut Vec<String>,
) -> Result<(Option<i64>, Vec<i64>, i64, i64), HandshakeFailure> {
    let (dtp, ptp) = (d.attn_tp_size, p.attn_tp_size);
    let mut warn = || {
        if !d.mla_or_hybrid() && warnings.is_empty() {
            warnings.push(PERF_WARNING.to_owned());
        }
    };
    Ok(if mla_sharding(d, p) {
        mla_sharding_tp(d, p)?;
        (None, py_range(0, ptp), dtp, ptp)
    } else if dtp == ptp {
        (Some(e), vec![e], 1, 1)
    } else if dtp > ptp {
        warn();
        let k = floor_div(dtp, ptp)?;
        let r = floor_div(e, k)?;
        (Some(r), vec![r], k, 1)
    } else {
        warn();
        let r = floor_div(ptp, dtp)?;
        let ranks = py_range(e * r, (e + 1) * r);
        let first = *ranks.first().ok_or(HandshakeFailure {
            kind: "IndexError",
            error: "list index out of range".into(),
            check: Check::Mapping,
        })?;
        (Some(first), ranks, 1, if d.mla() { 1 } else { r })
    })
}

/// `_resolve_rank_mapping` for one decode rank.
fn map_rank(
    d: &DecodeTopology,
    p: &PrefillInfo,
    engine_rank: i64,
    pp_rank: i64,
    warnings: &mut Vec<String>,
) -> Result<RankMapping, HandshakeFailure> {
    let (tp_rank, tp_ranks, dst, mut resp) = map_tp(d, p, engine_rank.rem_euclid(d.attn_tp_size), warnings)?;
    decode_cp(d, p)?;
    let cp_ranks = if p.attn_cp_size == d.attn_cp_size {
        vec![0]
    } else {
        let all_cp = d.all_cp_ranks_transfer || d.kv_pool == PoolKind::HybridMla;
        if all_cp || p.enable_dsa_cache_layer_split || p.sharding() {
            resp *= floor_div(p.attn_cp_size, d.attn_cp_size)?;
            py_range(0, p.attn_cp_size)
        } else {
            py_range(0, p.attn_cp_size).into_iter().take(1).collect()
        }
    };
    decode_pp(d, p)?;
    let pp_ranks = if p.pp_size == d.pp_size {
        vec![pp_rank]
    } else {
        resp *= floor_div(p.pp_size, d.pp_size)?;
        py_range(0, p.pp_size)
    };
    Ok(RankMapping {
        engine_rank,
        pp_rank,
        target_tp_rank: tp_rank,
        target_tp_ranks: tp_ranks,
        target_cp_ranks: cp_ranks,
        target_pp_ranks: pp_ranks,
        required_dst_info_num: dst,
        required_prefill_response_num: resp,
    })
}

/// Runs the decode's checks and computes the mapping of every (engine rank, pp rank), engine
/// rank major, exactly as SGLang 0.5.23 would on each decode scheduler process.
pub fn handshake(d: &DecodeTopology, p: &PrefillInfo) -> Result<Handshake, HandshakeFailure> {
    SANITY_CHECKS.iter().try_for_each(|check| in_release(d, check(d, p)))?;
    // The mapping allocates per prefill rank; a hostile body must not make it allocate terabytes.
    for (name, v) in [("attn_tp_size", p.attn_tp_size), ("attn_cp_size", p.attn_cp_size), ("dp_size", p.dp_size), ("pp_size", p.pp_size)] {
        if v > MAX_PLAUSIBLE_SIZE {
            return Err(HandshakeFailure {
                kind: "InputError",
                error: format!(
                    "the prefill reports {name}={v}, beyond any real deployment (at most {MAX_PLAUSIBLE_SIZE}); no mapping computed"
                ),
                check: Check::Implausible,
            });
        }
    }
    let mut warnings = Vec::new();
    let mut ranks = Vec::with_capacity(usize::try_from(d.attn_tp_size.saturating_mul(d.pp_size)).unwrap_or(0).min(1 << 16));
    for engine_rank in 0..d.attn_tp_size {
        for pp_rank in 0..d.pp_size {
            ranks.push(map_rank(d, p, engine_rank, pp_rank, &mut warnings)?);
        }
    }
    Ok(Handshake { ranks, warnings })
}

fn allocation_policy(d: &DecodeTopology, p: &PrefillInfo) -> Result<(), HandshakeFailure> {
    if !pyvalue::eq(&p.decode_allocation_policy, &Value::from(d.decode_allocation_policy.as_str())) {
        return Err(HandshakeFailure::runtime(
            Check::AllocationPolicy,
            format!(
                "Disaggregation decode allocation policy mismatch: prefill={}, decode={}. Set --disaggregation-decode-allocation-policy identically on both roles.",
                pyvalue::str(&p.decode_allocation_policy),
                d.decode_allocation_policy
            ),
        ));
    }
    Ok(())
}

fn prefill_complete_peer(d: &DecodeTopology, p: &PrefillInfo) -> Result<(), HandshakeFailure> {
    if d.decode_allocation_policy == "prefill_complete" && (p.attn_tp_size != 1 || p.attn_cp_size != 1 || p.pp_size != 1) {
        return Err(HandshakeFailure::runtime(Check::PrefillCompletePeer, "prefill_complete requires peer attention TP1/CP1/PP1"));
    }
    Ok(())
}

/// Request-level checks the decode's receiver applies (they fail requests, not the server).
pub fn receiver_checks(d: &DecodeTopology, p: &PrefillInfo) -> Result<(), HandshakeFailure> {
    RECEIVER_CHECKS.iter().try_for_each(|check| in_release(d, check(d, p)))
}

/// A check's verdict where the decode's release raises it; a pass where that release does not
/// have the check yet.
fn in_release(d: &DecodeTopology, verdict: Result<(), HandshakeFailure>) -> Result<(), HandshakeFailure> {
    verdict.or_else(|f| if rule_holds(f.check.rule(), d.release) { Err(f) } else { Ok(()) })
}

/// Admission's view of a pair the operator renders: every check that fails (not only the first,
/// which is all a running decode reports), then the mapping's own failure or warnings.
pub fn all_failures(d: &DecodeTopology, p: &PrefillInfo) -> (Vec<HandshakeFailure>, Vec<String>) {
    let checks = SANITY_CHECKS.iter().chain(&MAPPING_CHECKS).chain(&RECEIVER_CHECKS);
    let mut failures: Vec<HandshakeFailure> = checks.filter_map(|check| in_release(d, check(d, p)).err()).collect();
    if !failures.is_empty() {
        return (failures, Vec::new());
    }
    match handshake(d, p) {
        Ok(h) => (failures, h.warnings),
        Err(f) => {
            failures.push(f);
            (failures, Vec::new())
        }
    }
}

/// One result line of `handshake check`.
pub fn check_json(decode: &Value, prefill_info: &Value) -> (Value, bool) {
    let failure = |kind: &str, error: String| (serde_json::json!({"ok": false, "kind": kind, "error": error}), false);
    let d = match DecodeTopology::parse(decode) {
        Ok(d) => d,
        Err(e) => return failure("InputError", e.to_string()),
    };
    let p = match PrefillInfo::from_release_body(d.release, prefill_info) {
        Ok(p) => p,
        Err(e) => {
            return failure(
                "InputError",
                format!(
                    "SGLang {}'s decode cannot build its record from this topology body ({e}); it logs `Error fetching prefill server info from bootstrap` and retries",
                    d.release
                ),
            );
        }
    };
    match handshake(&d, &p) {
        Ok(h) => (serde_json::json!({"ok": true, "ranks": h.ranks}), true),
        Err(f) => failure(f.kind, f.error),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_decode_scratch_keys_are_the_target_and_required_fields() {
        let keys = super::decode_scratch_keys();
        assert_eq!(keys.first(), Some(&"target_tp_rank"));
        assert_eq!(keys.last(), Some(&"required_prefill_response_num"));
        assert_eq!(keys.len(), 6);
    }

    #[test]
    fn a_record_survives_its_own_body() {
        let body = serde_json::json!({
            "attn_tp_size": 4, "attn_cp_size": 2, "dp_size": 1, "pp_size": 1, "page_size": 64,
            "kv_cache_dtype": "fp8_e4m3", "follow_bootstrap_room": true, "enable_dsa_cache_layer_split": false,
            "dsv41_spec_layout": null, "kv_layout": "v4", "decode_allocation_policy": "early",
            "enable_kv_cache_sharding": false, "prefill_http_port": 30000,
        });
        let info = super::PrefillInfo::from_body(&body).unwrap();
        assert_eq!(info.to_body(), body);
        assert_eq!(super::PrefillInfo::from_body(&info.to_body()).unwrap(), info);
    }
}
