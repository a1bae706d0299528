//! Model catalogue: which KV pool kind SGLang 0.5.23 builds for a model, from its HF
//! architecture name, a well-known model id, or its `config.json`.

use serde_json::Value;
use thiserror::Error;

use pd_api::{AttentionKind, ModelSpec};

pub use crate::handshake::core::PoolKind;

impl From<AttentionKind> for PoolKind {
    fn from(kind: AttentionKind) -> Self {
        match kind {
            AttentionKind::Mla => Self::Mla,
            AttentionKind::HybridMla => Self::HybridMla,
            AttentionKind::Gqa | AttentionKind::Mha => Self::Mha,
        }
    }
}

/// Per-architecture facts the rules need beyond the attention kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArchTraits {
    /// DeepSeek-V4 family: its own pool counts as MLA and carries a `kv_layout`.
    pub deepseek_v4: bool,
    /// DeepSeek sparse attention when the config sets `index_topk` (dtype may be rewritten).
    pub dsa_capable: bool,
    /// MiniMax-M3 sparse: requires equal attention TP.
    pub minimax_sparse: bool,
    /// MLA architecture on a hybrid-SWA pool: non-MLA for the handshake.
    pub hybrid_swa: bool,
    /// Released checkpoints of this architecture set `index_topk` (assumed DSA without config.json).
    pub dsa_by_default: bool,
}

/// The recurrent state a hybrid model keeps beside its KV cache, which SGLang holds in a
/// hybrid linear pool (`HybridLinearKVPool`) and moves in PD as its `mamba` state type.
/// SGLang's `configs/hybrid_arch.py` derives it from the config class, that is from
/// `model_type`: `mamba2_config`, `hybrid_gdn_config`, `hybrid_kda_config`,
/// `hybrid_lightning_config` (the same in 0.5.21, 0.5.22 and 0.5.23).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StateKind {
    /// Mamba / Mamba2 SSM layers (Nemotron-H, Falcon-H1, Granite-4.0-H, Mamba2, LFM2).
    Mamba2,
    /// Gated DeltaNet layers (Qwen3-Next, Qwen3.5).
    Gdn,
    /// Kimi delta attention (Kimi Linear, GLM-5-Next, Ling with `use_kda`).
    Kda,
    /// Lightning attention (Ling hybrids without `use_kda`).
    Lightning,
}

impl std::fmt::Display for StateKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Mamba2 => "Mamba2",
            Self::Gdn => "gated DeltaNet",
            Self::Kda => "KDA",
            Self::Lightning => "lightning attention",
        })
    }
}

/// The `model_type`s whose config class SGLang's `hybrid_arch.py` takes as hybrid state, the
/// state they keep, and the architecture their checkpoints name (for a model known without its
/// config.json). `granitemoehybrid` and `bailing_hybrid` depend on config fields
/// (`HfConfig::state`); `minicpm_sala` (lightning when it has lightning layers) is not modelled.
const STATE_MODEL_TYPES: &[(&str, StateKind, Option<&str>)] = &[
    ("nemotron_h", StateKind::Mamba2, Some("NemotronHForCausalLM")),
    ("nemotron_h_puzzle", StateKind::Mamba2, Some("NemotronHPuzzleForCausalLM")),
    ("falcon_h1", StateKind::Mamba2, Some("FalconH1ForCausalLM")),
    ("mamba2", StateKind::Mamba2, Some("Mamba2ForCausalLM")),
    ("mamba", StateKind::Mamba2, Some("MambaForCausalLM")),
    ("falcon_mamba", StateKind::Mamba2, Some("FalconMambaForCausalLM")),
    ("lfm2", StateKind::Mamba2, Some("Lfm2ForCausalLM")),
    ("lfm2_moe", StateKind::Mamba2, Some("Lfm2MoeForCausalLM")),
    ("lfm2_vl", StateKind::Mamba2, None),
    ("zaya", StateKind::Mamba2, Some("ZayaForCausalLM")),
    ("qwen3_next", StateKind::Gdn, Some("Qwen3NextForCausalLM")),
    ("qwen3_5", StateKind::Gdn, Some("Qwen3_5ForConditionalGeneration")),
    ("qwen3_5_text", StateKind::Gdn, Some("Qwen3_5ForCausalLM")),
    ("qwen3_5_moe", StateKind::Gdn, Some("Qwen3_5MoeForConditionalGeneration")),
    ("qwen3_5_moe_text", StateKind::Gdn, Some("Qwen3_5MoeForCausalLM")),
    ("intern_s2_preview", StateKind::Gdn, Some("InternS2PreviewForConditionalGeneration")),
    ("jet_nemotron", StateKind::Gdn, Some("JetNemotronForCausalLM")),
    ("jet_vlm", StateKind::Gdn, Some("JetVLMForConditionalGeneration")),
    ("kimi_linear", StateKind::Kda, Some("KimiLinearForCausalLM")),
    ("glm5_next", StateKind::Kda, Some("Glm5NextForConditionalGeneration")),
];

/// The state of a model known by its architecture alone: that of its published checkpoints.
fn state_of_architecture(arch: &str) -> Option<StateKind> {
    STATE_MODEL_TYPES.iter().find(|(_, _, a)| *a == Some(arch)).map(|(_, state, _)| *state)
}

struct Arch {
    name: &'static str,
    kind: AttentionKind,
    traits: ArchTraits,
}

const PLAIN: ArchTraits =
    ArchTraits { deepseek_v4: false, dsa_capable: false, minimax_sparse: false, hybrid_swa: false, dsa_by_default: false };
const DSA: ArchTraits = ArchTraits { dsa_capable: true, ..PLAIN };
const DSA_ON: ArchTraits = ArchTraits { dsa_capable: true, dsa_by_default: true, ..PLAIN };
const V4: ArchTraits = ArchTraits { deepseek_v4: true, ..PLAIN };
const SWA_DSA: ArchTraits = ArchTraits { hybrid_swa: true, dsa_capable: true, ..PLAIN };
const MINIMAX: ArchTraits = ArchTraits { minimax_sparse: true, ..PLAIN };

macro_rules! archs {
    ($($name:literal => $kind:ident $(, $traits:ident)?;)+) => {
        &[$(Arch { name: $name, kind: AttentionKind::$kind, traits: archs!(@t $($traits)?) },)+]
    };
    (@t) => { PLAIN };
    (@t $t:ident) => { $t };
}

/// Architectures SGLang 0.5.23 treats as MLA or hybrid-MLA, and the common non-MLA families.
/// GQA vs MHA of a non-MLA family only matters for display; `config.json` refines it.
static ARCHITECTURES: &[Arch] = archs! {
    "DeepseekV2ForCausalLM" => Mla;
    "DeepseekV3ForCausalLM" => Mla, DSA;
    "DeepseekV32ForCausalLM" => Mla, DSA_ON;
    "DeepseekV3ForCausalLMNextN" => Mla, DSA;
    "DeepseekV4ForCausalLM" => Mla, V4;
    "DeepseekV4ForCausalLMNextN" => Mla, V4;
    "DeepseekV4ForCausalLMDSpark" => Mla, V4;
    "DeepseekVL2ForCausalLM" => Mla;
    "Glm4MoeLiteForCausalLM" => Mla;
    "Glm4MoeLiteForCausalLMNextN" => Mla;
    "GlmMoeDsaForCausalLM" => Mla, DSA_ON;
    "GlmMoeDsaForCausalLMNextN" => Mla, DSA_ON;
    "Glm5NextForConditionalGeneration" => HybridMla, DSA;
    "Glm5NextForConditionalGenerationNextN" => Mla, DSA;
    "LongcatFlashForCausalLM" => Mla, DSA;
    "LongcatFlashForCausalLMNextN" => Mla, DSA;
    "HYV4ForCausalLM" => Mla, DSA;
    "HYV4ForCausalLMNextN" => Mla, DSA;
    "DotsVLMForCausalLM" => Mla;
    "Dots3NoteForCausalLM" => Mla, SWA_DSA;
    "Dots3NoteForCausalLMNextN" => Mla, SWA_DSA;
    "MistralLarge3ForCausalLM" => Mla, DSA;
    "MistralLarge3ForCausalLMEagle" => Mla;
    "KimiK25ForConditionalGeneration" => Mla;
    "Eagle3DeepseekV2ForCausalLM" => Mla;
    "MiniCPM3ForCausalLM" => Mla;
    "KimiVLForConditionalGeneration" => Mla;
    "SarvamMLAForCausalLM" => Mla;
    "KimiLinearForCausalLM" => HybridMla;
    "KimiK3LinearForCausalLM" => HybridMla;
    "KimiK3ForConditionalGeneration" => HybridMla;
    "GigaChat35ForCausalLM" => HybridMla;
    "GigaChat35ForCausalLMNextN" => HybridMla;
    "BailingMoeV2_5ForCausalLM" => HybridMla;
    "BailingMoeV3ForCausalLM" => HybridMla;
    "BailingMoeV3VLForConditionalGeneration" => HybridMla;
    "MiniMaxM3SparseForCausalLM" => Gqa, MINIMAX;
    "MiniMaxM3SparseForConditionalGeneration" => Gqa, MINIMAX;
    "LlamaForCausalLM" => Gqa;
    "Llama4ForConditionalGeneration" => Gqa;
    "MistralForCausalLM" => Gqa;
    "MixtralForCausalLM" => Gqa;
    "Qwen2ForCausalLM" => Gqa;
    "Qwen2MoeForCausalLM" => Gqa;
    "Qwen2VLForConditionalGeneration" => Gqa;
    "Qwen2_5_VLForConditionalGeneration" => Gqa;
    "Qwen3ForCausalLM" => Gqa;
    "Qwen3MoeForCausalLM" => Gqa;
    "Qwen3NextForCausalLM" => Gqa;
    "Qwen3_5ForConditionalGeneration" => Gqa;
    "Qwen3_5MoeForConditionalGeneration" => Gqa;
    "NemotronHForCausalLM" => Gqa;
    "FalconH1ForCausalLM" => Gqa;
    "GraniteMoeHybridForCausalLM" => Gqa;
    "Qwen3VLForConditionalGeneration" => Gqa;
    "Qwen3VLMoeForConditionalGeneration" => Gqa;
    "Gemma2ForCausalLM" => Gqa;
    "Gemma3ForCausalLM" => Gqa;
    "Gemma3ForConditionalGeneration" => Gqa;
    "Phi3ForCausalLM" => Gqa;
    "PhiMoEForCausalLM" => Gqa;
    "Glm4ForCausalLM" => Gqa;
    "Glm4MoeForCausalLM" => Gqa;
    "Glm4MoeForCausalLMNextN" => Gqa;
    "GptOssForCausalLM" => Gqa;
    "MiniMaxM2ForCausalLM" => Gqa;
    "GraniteForCausalLM" => Gqa;
    "OlmoeForCausalLM" => Mha;
    "Olmo2ForCausalLM" => Mha;
    "BaichuanForCausalLM" => Mha;
};

/// Architectures whose MLA-ness depends on their config (SGLang checks these conditionally).
const MLA_IF_KV_LORA_RANK: &[&str] = &["PixtralForConditionalGeneration", "BailingMoeForCausalLMNextN"];

/// Popular Hugging Face ids → architecture, so the common case needs no extra field.
static KNOWN_MODELS: &[(&str, &str)] = &[
    ("deepseek-ai/DeepSeek-V2", "DeepseekV2ForCausalLM"),
    ("deepseek-ai/DeepSeek-V2-Lite", "DeepseekV2ForCausalLM"),
    ("deepseek-ai/DeepSeek-V2-Lite-Chat", "DeepseekV2ForCausalLM"),
    ("deepseek-ai/DeepSeek-V2.5", "DeepseekV2ForCausalLM"),
    ("deepseek-ai/DeepSeek-V3", "DeepseekV3ForCausalLM"),
    ("deepseek-ai/DeepSeek-V3-0324", "DeepseekV3ForCausalLM"),
    ("deepseek-ai/DeepSeek-V3.1", "DeepseekV3ForCausalLM"),
    ("deepseek-ai/DeepSeek-V3.1-Terminus", "DeepseekV3ForCausalLM"),
    ("deepseek-ai/DeepSeek-V3.2-Exp", "DeepseekV32ForCausalLM"),
    ("deepseek-ai/DeepSeek-R1", "DeepseekV3ForCausalLM"),
    ("deepseek-ai/DeepSeek-R1-0528", "DeepseekV3ForCausalLM"),
    ("moonshotai/Kimi-K2-Instruct", "DeepseekV3ForCausalLM"),
    ("moonshotai/Kimi-K2-Instruct-0905", "DeepseekV3ForCausalLM"),
    ("moonshotai/Kimi-K2-Thinking", "DeepseekV3ForCausalLM"),
    ("moonshotai/Kimi-Linear-48B-A3B-Instruct", "KimiLinearForCausalLM"),
    ("openbmb/MiniCPM3-4B", "MiniCPM3ForCausalLM"),
    ("meta-llama/Llama-3.1-8B-Instruct", "LlamaForCausalLM"),
    ("meta-llama/Llama-3.1-70B-Instruct", "LlamaForCausalLM"),
    ("meta-llama/Llama-3.1-405B-Instruct", "LlamaForCausalLM"),
    ("meta-llama/Llama-3.3-70B-Instruct", "LlamaForCausalLM"),
    ("meta-llama/Meta-Llama-3-8B-Instruct", "LlamaForCausalLM"),
    ("meta-llama/Meta-Llama-3-70B-Instruct", "LlamaForCausalLM"),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "Llama4ForConditionalGeneration"),
    ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", "Llama4ForConditionalGeneration"),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen2ForCausalLM"),
    ("Qwen/Qwen2.5-14B-Instruct", "Qwen2ForCausalLM"),
    ("Qwen/Qwen2.5-32B-Instruct", "Qwen2ForCausalLM"),
    ("Qwen/Qwen2.5-72B-Instruct", "Qwen2ForCausalLM"),
    ("Qwen/Qwen2.5-Coder-32B-Instruct", "Qwen2ForCausalLM"),
    ("Qwen/QwQ-32B", "Qwen2ForCausalLM"),
    ("Qwen/Qwen3-8B", "Qwen3ForCausalLM"),
    ("Qwen/Qwen3-14B", "Qwen3ForCausalLM"),
    ("Qwen/Qwen3-32B", "Qwen3ForCausalLM"),
    ("Qwen/Qwen3-30B-A3B", "Qwen3MoeForCausalLM"),
    ("Qwen/Qwen3-235B-A22B", "Qwen3MoeForCausalLM"),
    ("Qwen/Qwen3-235B-A22B-Instruct-2507", "Qwen3MoeForCausalLM"),
    ("Qwen/Qwen3-Coder-480B-A35B-Instruct", "Qwen3MoeForCausalLM"),
    ("Qwen/Qwen3-Next-80B-A3B-Instruct", "Qwen3NextForCausalLM"),
    ("nvidia/Nemotron-H-8B-Base-8K", "NemotronHForCausalLM"),
    ("nvidia/Nemotron-H-47B-Base-8K", "NemotronHForCausalLM"),
    ("tiiuae/Falcon-H1-7B-Instruct", "FalconH1ForCausalLM"),
    ("tiiuae/Falcon-H1-34B-Instruct", "FalconH1ForCausalLM"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "MistralForCausalLM"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "MixtralForCausalLM"),
    ("mistralai/Mixtral-8x22B-Instruct-v0.1", "MixtralForCausalLM"),
    ("google/gemma-2-9b-it", "Gemma2ForCausalLM"),
    ("google/gemma-2-27b-it", "Gemma2ForCausalLM"),
    ("google/gemma-3-27b-it", "Gemma3ForConditionalGeneration"),
    ("microsoft/Phi-3-mini-4k-instruct", "Phi3ForCausalLM"),
    ("microsoft/Phi-3-medium-4k-instruct", "Phi3ForCausalLM"),
    ("microsoft/phi-4", "Phi3ForCausalLM"),
    ("zai-org/GLM-4.5", "Glm4MoeForCausalLM"),
    ("zai-org/GLM-4.5-Air", "Glm4MoeForCausalLM"),
    ("zai-org/GLM-4.6", "Glm4MoeForCausalLM"),
    ("openai/gpt-oss-20b", "GptOssForCausalLM"),
    ("openai/gpt-oss-120b", "GptOssForCausalLM"),
    ("MiniMaxAI/MiniMax-M2", "MiniMaxM2ForCausalLM"),
];

fn arch_entry(name: &str) -> Option<&'static Arch> {
    ARCHITECTURES.iter().find(|a| a.name == name)
}

/// Architecture of a well-known model id; also matches a local path ending in the model's name.
pub fn architecture_for_path(path: &str) -> Option<&'static str> {
    let path = path.trim().trim_end_matches('/');
    if let Some((_, arch)) = KNOWN_MODELS.iter().find(|(id, _)| id.eq_ignore_ascii_case(path)) {
        return Some(arch);
    }
    let base = path.rsplit('/').next().unwrap_or(path);
    KNOWN_MODELS.iter().find(|(id, _)| id.rsplit('/').next().is_some_and(|b| b.eq_ignore_ascii_case(base))).map(|(_, arch)| *arch)
}

/// Where a resolved attention kind came from; shown in messages so users know what to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KindSource {
    Explicit,
    ConfigJson,
    Architecture(String),
    ModelId(String),
}

impl std::fmt::Display for KindSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Explicit => f.write_str("spec.model.attention"),
            Self::ConfigJson => f.write_str("the model's config.json"),
            Self::Architecture(a) => write!(f, "architecture {a}"),
            Self::ModelId(_) => f.write_str("the model catalogue"),
        }
    }
}

/// What the rules know about the model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelFacts {
    pub architecture: Option<String>,
    pub attention: Option<AttentionKind>,
    pub source: Option<KindSource>,
    pub traits: ArchTraits,
    /// `index_topk` is set (DeepSeek sparse attention), when known from config.json.
    pub dsa: Option<bool>,
    /// The checkpoint quantizes its KV cache to FP8 (`kv_cache_quant_algo: FP8`).
    pub kv_fp8_checkpoint: bool,
    /// config.json's `model_type` (DeepSeek-V4.1 is `deepseek_v41`), when known.
    pub model_type: Option<String>,
    /// DeepSeek-V4's distinct non-zero `compress_ratios`, ascending, when known from config.json.
    pub compress_ratios: Option<Vec<u32>>,
    /// config.json's `num_nextn_predict_layers`; `Some(None)` when config.json lacks it.
    pub nextn_layers: Option<Option<u64>>,
    /// DSA's indexer pools or compresses its keys, per config.json (else false).
    pub dsa_index_pooled: bool,
    /// The recurrent state a hybrid model keeps beside its KV pool, when it has one.
    pub state: Option<StateKind>,
}

impl ModelFacts {
    /// The KV pool kind, when the attention kind is known.
    pub fn pool(&self) -> Option<PoolKind> {
        let kind = self.attention?;
        if self.traits.hybrid_swa && self.source != Some(KindSource::Explicit) {
            return Some(PoolKind::Mha);
        }
        Some(kind.into())
    }

    /// DeepSeek sparse attention: known from config.json, else assumed from the architecture.
    pub fn is_dsa(&self) -> bool {
        self.dsa.unwrap_or(self.traits.dsa_by_default)
    }

    /// "Qwen/Qwen2.5-72B-Instruct (Qwen2ForCausalLM, GQA)"-style description; a hybrid-state
    /// model adds its state: "(NemotronHForCausalLM, GQA, hybrid state: Mamba2)".
    pub fn describe(&self, path: &str) -> String {
        let described = self.describe_attention(path);
        match self.state {
            Some(state) => format!("{}, hybrid state: {state})", described.trim_end_matches(')')),
            None => described,
        }
    }

    fn describe_attention(&self, path: &str) -> String {
        match (&self.architecture, self.attention) {
            (Some(a), Some(k)) => format!("{path} ({a}, {k})"),
            (None, Some(k)) => format!("{path} ({k})"),
            (Some(a), None) => format!("{path} ({a}, attention kind unknown)"),
            (None, None) => format!("{path} (attention kind unknown)"),
        }
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    #[error("config.json is not valid JSON: {0}")]
    Json(String),
    #[error("config.json must be a JSON object")]
    NotObject,
    #[error("config.json has no `architectures` list of strings")]
    NoArchitectures,
}

/// The constants Python's `json` writes for non-finite floats and reads back (`json.loads`), which
/// strict JSON lacks: published Mamba2 checkpoints (Nemotron-H, Falcon-H1, Granite-4.0-H) carry
/// `"time_step_limit": [0.0, Infinity]`.
const PYTHON_CONSTANTS: [&str; 3] = ["-Infinity", "Infinity", "NaN"];

/// `text` with each of `PYTHON_CONSTANTS` outside a string replaced by `null`, so the file SGLang
/// reads is read here too. No field the rules read holds a float; the kept copy stays as written.
fn python_constants_as_null(text: &str) -> std::borrow::Cow<'_, str> {
    if !PYTHON_CONSTANTS.iter().any(|c| text.contains(c)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let (mut out, mut rest, mut in_string, mut escaped) = (String::with_capacity(text.len()), text, false, false);
    while let Some(c) = rest.chars().next() {
        let constant = (!in_string).then(|| PYTHON_CONSTANTS.iter().find(|k| rest.starts_with(*k))).flatten();
        if let Some(k) = constant {
            out.push_str("null");
            rest = &rest[k.len()..];
            continue;
        }
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            _ => {}
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    std::borrow::Cow::Owned(out)
}

/// The parts of a Hugging Face `config.json` that decide the KV pool kind.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct HfConfig {
    pub architectures: Vec<String>,
    pub model_type: Option<String>,
    pub num_attention_heads: Option<u64>,
    pub num_key_value_heads: Option<u64>,
    pub kv_lora_rank: Option<u64>,
    pub use_mla: Option<bool>,
    pub index_topk: bool,
    pub is_hybrid_swa: bool,
    pub short_conv_kernel_size: bool,
    pub kv_fp8: bool,
    /// DeepSeek-V4's per-layer `compress_ratios` (0 for an uncompressed layer).
    pub compress_ratios: Option<Vec<u64>>,
    pub num_nextn_predict_layers: Option<u64>,
    /// DSA's indexer pools or compresses its keys (`index_kpool` ≠ 1 or `index_kpool_compress`).
    pub dsa_index_pooled: bool,
    /// The hybrid state SGLang derives from this config (`state_of_config`).
    pub state: Option<StateKind>,
}

/// The hybrid state of a config as `hybrid_arch.py` decides it: by `model_type` (the config
/// class), Granite-4.0 hybrids only with a `mamba` entry in `layer_types`, Ling hybrids KDA with
/// `use_kda` and lightning attention without.
fn state_of_config(model_type: Option<&str>, text: &serde_json::Map<String, Value>) -> Option<StateKind> {
    let model_type = model_type?;
    match model_type {
        "granitemoehybrid" => {
            let layers = text.get("layer_types").and_then(Value::as_array);
            layers.is_some_and(|l| l.iter().any(|t| t.as_str() == Some("mamba"))).then_some(StateKind::Mamba2)
        }
        "bailing_hybrid" => {
            Some(if text.get("use_kda").and_then(Value::as_bool).unwrap_or(false) { StateKind::Kda } else { StateKind::Lightning })
        }
        _ => STATE_MODEL_TYPES.iter().find(|(t, _, _)| *t == model_type).map(|(_, state, _)| *state),
    }
}

impl HfConfig {
    /// The config.json under `key` of a ConfigMap (`spec.model.configMapRef`), or what is wrong
    /// with it, naming the ConfigMap and the key: the one reader for the CLI, the webhook and
    /// the controller.
    pub fn from_config_map(cm: &k8s_openapi::api::core::v1::ConfigMap, key: &str) -> Result<Self, String> {
        let name = format!("{}/{}", cm.metadata.namespace.as_deref().unwrap_or_default(), cm.metadata.name.as_deref().unwrap_or_default());
        let name = name.trim_start_matches('/');
        let text = cm.data.as_ref().and_then(|d| d.get(key)).ok_or_else(|| format!("ConfigMap {name} has no key {key:?}"))?;
        Self::parse(text).map_err(|e| format!("ConfigMap {name} key {key}: {e}"))
    }

    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let value: Value = serde_json::from_str(&python_constants_as_null(text)).map_err(|e| ConfigError::Json(e.to_string()))?;
        let top = value.as_object().ok_or(ConfigError::NotObject)?;
        let architectures: Vec<String> = top
            .get("architectures")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        if architectures.is_empty() {
            return Err(ConfigError::NoArchitectures);
        }
        // Multimodal checkpoints keep the language model's fields under `text_config`.
        let text = top.get("text_config").and_then(Value::as_object).unwrap_or(top);
        let num = |k: &str| text.get(k).and_then(Value::as_u64);
        let kv_fp8 = top
            .get("quantization_config")
            .and_then(|q| q.get("kv_cache_quant_algo"))
            .and_then(Value::as_str)
            .is_some_and(|s| s.eq_ignore_ascii_case("fp8"));
        let model_type = text.get("model_type").and_then(Value::as_str).map(str::to_owned);
        Ok(Self {
            architectures,
            state: state_of_config(model_type.as_deref(), text),
            model_type,
            num_attention_heads: num("num_attention_heads"),
            num_key_value_heads: num("num_key_value_heads"),
            kv_lora_rank: num("kv_lora_rank"),
            use_mla: text.get("use_mla").and_then(Value::as_bool),
            index_topk: text.get("index_topk").is_some_and(|v| !v.is_null()),
            is_hybrid_swa: text.get("is_hybrid_swa").and_then(Value::as_bool).unwrap_or(false),
            short_conv_kernel_size: text.get("short_conv_kernel_size").is_some_and(|v| !v.is_null()),
            kv_fp8,
            compress_ratios: text.get("compress_ratios").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_u64).collect()),
            num_nextn_predict_layers: num("num_nextn_predict_layers"),
            dsa_index_pooled: num("index_kpool").is_some_and(|k| k != 1)
                || text.get("index_kpool_compress").and_then(Value::as_bool).unwrap_or(false),
        })
    }

    fn heads_kind(&self) -> AttentionKind {
        match (self.num_attention_heads, self.num_key_value_heads) {
            (Some(q), Some(kv)) if kv < q => AttentionKind::Gqa,
            _ => AttentionKind::Mha,
        }
    }

    /// Attention kind and traits as SGLang would decide them for this config.
    fn classify(&self) -> (String, AttentionKind, ArchTraits) {
        let name = self.architectures[0].as_str();
        let arch = name.to_owned();
        if MLA_IF_KV_LORA_RANK.contains(&name) {
            let kind = if self.kv_lora_rank.is_some() { AttentionKind::Mla } else { self.heads_kind() };
            let dsa_capable = name.starts_with("Pixtral");
            return (arch, kind, ArchTraits { dsa_capable, ..PLAIN });
        }
        if name == "DeepseekVL2ForCausalLM" {
            let kind = if self.use_mla.unwrap_or(true) { AttentionKind::Mla } else { self.heads_kind() };
            return (arch, kind, PLAIN);
        }
        if matches!(name, "BailingMoeV2_5ForCausalLM" | "BailingMoeV3ForCausalLM" | "BailingMoeV3VLForConditionalGeneration") {
            let hybrid = self.model_type.as_deref() == Some("bailing_hybrid")
                && (name == "BailingMoeV2_5ForCausalLM" || self.short_conv_kernel_size);
            let kind = if hybrid { AttentionKind::HybridMla } else { AttentionKind::Mla };
            return (arch, kind, PLAIN);
        }
        match arch_entry(name) {
            Some(entry) => {
                let mut traits = entry.traits;
                traits.hybrid_swa |= self.is_hybrid_swa && entry.kind == AttentionKind::Mla;
                let kind = match entry.kind {
                    AttentionKind::Gqa | AttentionKind::Mha => self.heads_kind(),
                    k => k,
                };
                (arch, kind, traits)
            }
            None => {
                // SGLang decides MLA from its list of architectures, not from config fields: an
                // architecture it does not list builds an MHA pool even with `kv_lora_rank`.
                (arch, self.heads_kind(), PLAIN)
            }
        }
    }
}

/// The distinct compression ratios of a per-layer list, without 0 (an uncompressed layer),
/// ascending: the ratios a DeepSeek-V4 pool keeps a compressed cache for.
fn distinct_ratios(per_layer: &[u64]) -> Vec<u32> {
    let mut out: Vec<u32> = per_layer.iter().filter(|r| **r != 0).filter_map(|r| u32::try_from(*r).ok()).collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Resolves the model's facts: explicit `attention` wins, then config.json, then the
/// architecture name, then the model id catalogue.
pub fn resolve(model: &ModelSpec, config: Option<&HfConfig>) -> ModelFacts {
    let mut facts = ModelFacts {
        architecture: model.architecture.clone(),
        attention: None,
        source: None,
        traits: PLAIN,
        dsa: None,
        kv_fp8_checkpoint: false,
        model_type: None,
        compress_ratios: None,
        nextn_layers: None,
        dsa_index_pooled: false,
        state: None,
    };
    if let Some(cfg) = config {
        let (arch, kind, traits) = cfg.classify();
        facts.architecture = Some(arch);
        facts.attention = Some(kind);
        facts.source = Some(KindSource::ConfigJson);
        facts.traits = traits;
        facts.dsa = Some(traits.dsa_capable && cfg.index_topk);
        facts.kv_fp8_checkpoint = cfg.kv_fp8;
        facts.model_type.clone_from(&cfg.model_type);
        facts.compress_ratios = cfg.compress_ratios.as_ref().map(|r| distinct_ratios(r));
        facts.nextn_layers = Some(cfg.num_nextn_predict_layers);
        facts.dsa_index_pooled = cfg.dsa_index_pooled;
        facts.state = cfg.state;
    } else {
        let (arch, source) = match model.architecture.as_deref() {
            Some(a) => (Some(a.to_owned()), Some(KindSource::Architecture(a.to_owned()))),
            None => match architecture_for_path(model.catalogue_id()) {
                Some(a) => (Some(a.to_owned()), Some(KindSource::ModelId(a.to_owned()))),
                None => (None, None),
            },
        };
        facts.architecture = arch.clone();
        facts.state = arch.as_deref().and_then(state_of_architecture);
        let entry = arch.as_deref().and_then(arch_entry);
        if let Some(entry) = entry {
            facts.attention = Some(entry.kind);
            facts.traits = entry.traits;
            facts.source = source;
        } else if let Some(a) = arch.as_deref().filter(|a| MLA_IF_KV_LORA_RANK.contains(a) || *a == "DeepseekVL2ForCausalLM") {
            // Decided by config fields we do not have; leave the kind unknown.
            facts.architecture = Some(a.to_owned());
        }
    }
    if let Some(kind) = model.attention {
        facts.attention = Some(kind);
        facts.source = Some(KindSource::Explicit);
    }
    facts
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn spec(path: &str) -> ModelSpec {
        ModelSpec { path: path.into(), ..Default::default() }
    }

    #[test]
    fn known_ids_resolve_case_insensitively_and_by_basename() {
        assert_eq!(architecture_for_path("qwen/qwen2.5-72b-instruct"), Some("Qwen2ForCausalLM"));
        assert_eq!(architecture_for_path("/models/DeepSeek-V3/"), Some("DeepseekV3ForCausalLM"));
        assert_eq!(architecture_for_path("someone/unknown-model"), None);
    }

    #[test]
    fn catalogue_kinds() {
        let f = resolve(&spec("deepseek-ai/DeepSeek-V3"), None);
        assert_eq!(f.pool(), Some(PoolKind::Mla));
        let f = resolve(&spec("Qwen/Qwen2.5-72B-Instruct"), None);
        assert_eq!(f.attention, Some(AttentionKind::Gqa));
        assert_eq!(f.pool(), Some(PoolKind::Mha));
        let f = resolve(&spec("moonshotai/Kimi-Linear-48B-A3B-Instruct"), None);
        assert_eq!(f.pool(), Some(PoolKind::HybridMla));
        let f = resolve(&spec("my/model"), None);
        assert_eq!(f.pool(), None);
    }

    #[test]
    fn explicit_attention_wins() {
        let mut m = spec("Qwen/Qwen2.5-72B-Instruct");
        m.attention = Some(AttentionKind::Mla);
        assert_eq!(resolve(&m, None).pool(), Some(PoolKind::Mla));
    }

    #[test]
    fn every_mla_architecture_of_the_spec_is_mla_or_hybrid() {
        for a in [
            "DeepseekV2ForCausalLM",
            "DeepseekV32ForCausalLM",
            "DeepseekV3ForCausalLM",
            "DeepseekV3ForCausalLMNextN",
            "Glm4MoeLiteForCausalLM",
            "Glm4MoeLiteForCausalLMNextN",
            "GlmMoeDsaForCausalLM",
            "GlmMoeDsaForCausalLMNextN",
            "Glm5NextForConditionalGeneration",
            "Glm5NextForConditionalGenerationNextN",
            "LongcatFlashForCausalLM",
            "LongcatFlashForCausalLMNextN",
            "HYV4ForCausalLM",
            "HYV4ForCausalLMNextN",
            "DotsVLMForCausalLM",
            "MistralLarge3ForCausalLM",
            "MistralLarge3ForCausalLMEagle",
            "KimiK25ForConditionalGeneration",
            "Eagle3DeepseekV2ForCausalLM",
            "GigaChat35ForCausalLM",
            "GigaChat35ForCausalLMNextN",
            "MiniCPM3ForCausalLM",
            "KimiVLForConditionalGeneration",
            "KimiLinearForCausalLM",
            "KimiK3LinearForCausalLM",
            "KimiK3ForConditionalGeneration",
            "BailingMoeV2_5ForCausalLM",
            "BailingMoeV3ForCausalLM",
            "BailingMoeV3VLForConditionalGeneration",
            "SarvamMLAForCausalLM",
            "DeepseekV4ForCausalLM",
            "DeepseekV4ForCausalLMNextN",
            "DeepseekV4ForCausalLMDSpark",
        ] {
            let m = ModelSpec { path: "x".into(), architecture: Some(a.into()), ..Default::default() };
            assert!(resolve(&m, None).pool().is_some_and(PoolKind::is_mla_or_hybrid), "{a}");
        }
        // GLM-4.5/4.6 are not MLA; Dots3-Note is MLA on a hybrid-SWA pool.
        for a in ["Glm4MoeForCausalLM", "Dots3NoteForCausalLM", "GptOssForCausalLM"] {
            let m = ModelSpec { path: "x".into(), architecture: Some(a.into()), ..Default::default() };
            assert_eq!(resolve(&m, None).pool(), Some(PoolKind::Mha), "{a}");
        }
    }

    #[test]
    fn config_json_decides() {
        let llama = r#"{"architectures":["LlamaForCausalLM"],"num_attention_heads":64,"num_key_value_heads":8}"#;
        let f = resolve(&spec("/models/x"), Some(&HfConfig::parse(llama).unwrap()));
        assert_eq!((f.attention, f.source), (Some(AttentionKind::Gqa), Some(KindSource::ConfigJson)));
        let mha = r#"{"architectures":["LlamaForCausalLM"],"num_attention_heads":32}"#;
        assert_eq!(resolve(&spec("x"), Some(&HfConfig::parse(mha).unwrap())).attention, Some(AttentionKind::Mha));
        let dsv3 = r#"{"architectures":["DeepseekV3ForCausalLM"],"kv_lora_rank":512,"num_attention_heads":128,
                      "quantization_config":{"kv_cache_quant_algo":"FP8"}}"#;
        let f = resolve(&spec("x"), Some(&HfConfig::parse(dsv3).unwrap()));
        assert_eq!(f.pool(), Some(PoolKind::Mla));
        assert!(f.kv_fp8_checkpoint);
        assert_eq!(f.dsa, Some(false));
        let pixtral = r#"{"architectures":["PixtralForConditionalGeneration"],"text_config":{"kv_lora_rank":512}}"#;
        assert_eq!(resolve(&spec("x"), Some(&HfConfig::parse(pixtral).unwrap())).pool(), Some(PoolKind::Mla));
        let swa = r#"{"architectures":["DeepseekV3ForCausalLM"],"is_hybrid_swa":true}"#;
        assert_eq!(resolve(&spec("x"), Some(&HfConfig::parse(swa).unwrap())).pool(), Some(PoolKind::Mha));
        let bailing = r#"{"architectures":["BailingMoeV3ForCausalLM"],"model_type":"bailing_moe_v3"}"#;
        assert_eq!(resolve(&spec("x"), Some(&HfConfig::parse(bailing).unwrap())).pool(), Some(PoolKind::Mla));
    }

    #[test]
    fn an_unlisted_architecture_is_not_mla_for_its_kv_lora_rank() {
        let cfg = r#"{"architectures":["SomeNewForCausalLM"],"kv_lora_rank":512,"num_attention_heads":64,"num_key_value_heads":64}"#;
        assert_eq!(resolve(&spec("x"), Some(&HfConfig::parse(cfg).unwrap())).pool(), Some(PoolKind::Mha));
    }

    #[test]
    fn config_errors_are_explicit() {
        assert!(matches!(HfConfig::parse("{"), Err(ConfigError::Json(_))));
        assert_eq!(HfConfig::parse("[]"), Err(ConfigError::NotObject));
        assert_eq!(HfConfig::parse("{\"architectures\": []}"), Err(ConfigError::NoArchitectures));
    }

    #[test]
    fn python_json_constants_are_read_as_pythons_json_reads_them() {
        // Nemotron-H's published config.json, the part that stopped the reader.
        let cfg = r#"{"architectures": ["NemotronHForCausalLM"], "time_step_limit": [0.0, Infinity], "x": -Infinity, "y": NaN,
                      "note": "NaN and Infinity in a \"string\" stay", "num_attention_heads": 40, "num_key_value_heads": 8}"#;
        let parsed = HfConfig::parse(cfg).expect("Python's json reads this file");
        assert_eq!((parsed.architectures[0].as_str(), parsed.num_key_value_heads), ("NemotronHForCausalLM", Some(8)));
        assert_eq!(python_constants_as_null(r#"{"a": "Infinity \" NaN", "b": [Infinity]}"#), r#"{"a": "Infinity \" NaN", "b": [null]}"#);
        // A bare word Python's json refuses stays refused.
        assert!(matches!(HfConfig::parse(r#"{"architectures": ["X"], "a": inf}"#), Err(ConfigError::Json(_))));
    }

    /// The published checkpoints' config.json files (tests/parity/configs), Infinity included.
    pub(crate) const NEMOTRON_H: &str = include_str!("../../tests/parity/configs/NemotronHForCausalLM.json");
    pub(crate) const FALCON_H1: &str = include_str!("../../tests/parity/configs/FalconH1ForCausalLM.json");
    pub(crate) const GRANITE_4_H: &str = include_str!("../../tests/parity/configs/GraniteMoeHybridForCausalLM.json");
    pub(crate) const QWEN3_NEXT: &str = include_str!("../../tests/parity/configs/Qwen3NextForCausalLM.json");
    pub(crate) const LFM2: &str = include_str!("../../tests/parity/configs/Lfm2ForCausalLM.json");

    #[test]
    fn published_mamba_hybrids_are_gqa_with_hybrid_state() {
        for (cfg, arch) in
            [(NEMOTRON_H, "NemotronHForCausalLM"), (FALCON_H1, "FalconH1ForCausalLM"), (GRANITE_4_H, "GraniteMoeHybridForCausalLM")]
        {
            let f = resolve(&spec("/models/m"), Some(&HfConfig::parse(cfg).expect(arch)));
            assert_eq!(
                (f.architecture.as_deref(), f.attention, f.state),
                (Some(arch), Some(AttentionKind::Gqa), Some(StateKind::Mamba2)),
                "{arch}"
            );
            // The handshake's pool: neither MLA nor hybrid MLA (`is_mla_backend`, `is_hybrid_mla_backend`).
            assert_eq!(f.pool(), Some(PoolKind::Mha), "{arch}");
            assert_eq!(f.describe("/models/m"), format!("/models/m ({arch}, GQA, hybrid state: Mamba2)"));
        }
    }

    #[test]
    fn the_state_follows_the_config_class_and_its_fields() {
        let state = |cfg: &str| resolve(&spec("x"), Some(&HfConfig::parse(cfg).unwrap())).state;
        // Granite-4.0 without Mamba layers (granite-4.0-micro) is a plain GQA model.
        let dense =
            r#"{"architectures":["GraniteMoeHybridForCausalLM"],"model_type":"granitemoehybrid","layer_types":["attention","attention"]}"#;
        assert_eq!(state(dense), None);
        assert_eq!(state(QWEN3_NEXT), Some(StateKind::Gdn));
        assert_eq!(state(LFM2), Some(StateKind::Mamba2));
        // Qwen3.5's wrapper keeps the language model under `text_config`.
        let qwen35 = r#"{"architectures":["Qwen3_5MoeForConditionalGeneration"],"model_type":"qwen3_5_moe","text_config":{"model_type":"qwen3_5_moe_text"}}"#;
        assert_eq!(state(qwen35), Some(StateKind::Gdn));
        let kda = r#"{"architectures":["BailingMoeV2_5ForCausalLM"],"model_type":"bailing_hybrid","use_kda":true}"#;
        assert_eq!(state(kda), Some(StateKind::Kda));
        let lightning = r#"{"architectures":["BailingMoeV2_5ForCausalLM"],"model_type":"bailing_hybrid"}"#;
        assert_eq!(state(lightning), Some(StateKind::Lightning));
        assert_eq!(state(r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama"}"#), None);
        // Kimi Linear: a hybrid-MLA pool that also keeps KDA state.
        let kimi = resolve(&spec("moonshotai/Kimi-Linear-48B-A3B-Instruct"), None);
        assert_eq!((kimi.pool(), kimi.state), (Some(PoolKind::HybridMla), Some(StateKind::Kda)));
        // Known without config.json: the state of the published checkpoints.
        assert_eq!(resolve(&spec("nvidia/Nemotron-H-8B-Base-8K"), None).state, Some(StateKind::Mamba2));
        assert_eq!(resolve(&spec("Qwen/Qwen2.5-72B-Instruct"), None).state, None);
    }
}
