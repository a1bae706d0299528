//! The planner of a PDDeployment (`spec.autoscaling`): SLO targets and load thresholds against
//! SGLang's own metrics read from Prometheus or the engines, and what it last recommended (`status.autoscaling`).
//! See docs/scaling.md.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the planner does with its recommendation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AutoscalingMode {
    /// Writes the recommendation, its reasons and the observations to `status.autoscaling` and
    /// an Event; changes no count.
    Recommend,
    /// Also moves each role's count through its `PDRole` (as `kubectl scale` would), for the roles
    /// no other manager (an HPA, `kubectl`) owns.
    Auto,
}

/// The planner: each role's instance count from SGLang's metrics. Prefill follows TTFT and the
/// queue, decode follows ITL and KV-cache usage; always within `spec.scaling`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.prometheus) || self.metricsWindowSeconds >= self.intervalSeconds").message("spec.autoscaling.metricsWindowSeconds must be at least intervalSeconds when the planner scrapes the engines itself (no prometheus): it compares the passes' samples; raise metricsWindowSeconds or name a Prometheus").field_path(".metricsWindowSeconds"))]
pub struct AutoscalingSpec {
    pub mode: AutoscalingMode,
    /// Where SGLang's metrics are read: a Prometheus scraping the engines with the labels the
    /// chart's PodMonitor puts on them (`namespace`, `pdd`, `role`). Unset: the operator reads
    /// each engine leader's `/metrics` itself every pass (the engines need `--enable-metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusSource>,
    /// Latency objectives (p90 over `metricsWindowSeconds`).
    #[serde(default)]
    pub slo: SloTargets,
    /// Load thresholds.
    #[serde(default)]
    pub load: LoadThresholds,
    /// Seconds after a role's last scale before it may scale down (scale-up does not wait).
    #[serde(default = "default_cooldown")]
    #[schemars(range(min = 0))]
    pub cooldown_seconds: u32,
    /// Seconds a role's load must stay low, without a break, before it scales down.
    #[serde(default = "default_stabilization")]
    #[schemars(range(min = 0))]
    pub stabilization_window_seconds: u32,
    /// Seconds between two planner passes.
    #[serde(default = "default_interval")]
    #[schemars(range(min = 1))]
    pub interval_seconds: u32,
    /// The window of the rates and quantiles read (PromQL `[Ns]`); at least 4 scrape intervals
    /// with a Prometheus, at least `intervalSeconds` without (the operator's passes are its scrapes).
    #[serde(default = "default_window")]
    #[schemars(range(min = 1))]
    pub metrics_window_seconds: u32,
}

/// A Prometheus server's HTTP API.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusSource {
    /// Base URL, e.g. `http://prometheus-operated.monitoring.svc:9090` (`/api/v1/query` is appended);
    /// plain HTTP only.
    #[schemars(regex(pattern = r"^http://"))]
    pub url: String,
}

/// Latency objectives; a role with no objective follows its load threshold only.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SloTargets {
    /// Time to first token, p90, in seconds: prefill scales up above it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub ttft_p90_seconds: Option<f64>,
    /// Inter-token latency, p90, in seconds: decode scales up above it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub itl_p90_seconds: Option<f64>,
}

/// Load thresholds.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.kvUsageLow) || !has(self.kvUsageHigh) || self.kvUsageLow < self.kvUsageHigh").message("spec.autoscaling.load.kvUsageLow must be below kvUsageHigh: lower kvUsageLow or raise kvUsageHigh").field_path(".kvUsageLow"))]
pub struct LoadThresholds {
    /// Requests waiting per prefill instance (`sglang:num_queue_reqs`) above which prefill scales
    /// up. Unset: the queue is not a signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub queue_per_instance: Option<f64>,
    /// Requests running per decode instance (`sglang:num_running_reqs`) above which decode scales
    /// up: a leading signal, as ITL p90 breaks only once a window's requests already ran at the
    /// old count. Set it to the running count at which your engine's ITL nears its objective
    /// (docs/scaling.md). Unset: not a signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub running_per_instance: Option<f64>,
    /// Mean KV-cache usage of decode (`sglang:token_usage`, 0..1) above which decode scales up.
    #[serde(default = "default_kv_high")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub kv_usage_high: f64,
    /// Mean KV-cache usage of decode below which decode may scale down.
    #[serde(default = "default_kv_low")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub kv_usage_low: f64,
}

impl Default for LoadThresholds {
    fn default() -> Self {
        Self { queue_per_instance: None, running_per_instance: None, kv_usage_high: default_kv_high(), kv_usage_low: default_kv_low() }
    }
}

fn default_cooldown() -> u32 {
    300
}
fn default_stabilization() -> u32 {
    300
}
fn default_interval() -> u32 {
    30
}
fn default_window() -> u32 {
    60
}
fn default_kv_high() -> f64 {
    0.85
}
fn default_kv_low() -> f64 {
    0.3
}

/// The planner's last pass, written only by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingStatus {
    /// When the planner last ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_evaluation_time: Option<Time>,
    /// `Recommended`, `Scaled`, `MetricsUnavailable` (no change made: the planner never scales
    /// on missing data) or `Held` (an owner other than the planner holds a role's count).
    #[serde(default)]
    pub reason: String,
    /// The pass in words, with its figures.
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub prefill: RoleRecommendation,
    #[serde(default)]
    pub decode: RoleRecommendation,
}

/// One role's recommendation and what it was made from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct RoleRecommendation {
    /// Instances when the planner ran.
    #[serde(default)]
    pub current: i32,
    /// Instances recommended, within `spec.scaling`.
    #[serde(default)]
    pub recommended: i32,
    /// Why, with the figures.
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub observed: Observed,
    /// Since when the role's load has been low without a break (the stabilisation window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_since: Option<Time>,
    /// When the planner last changed the role's count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
}

/// What the metrics showed for a role (absent: no series answered).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct Observed {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_p90_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_p90_seconds: Option<f64>,
    /// Requests waiting, summed over the role's instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_requests: Option<f64>,
    /// Requests running, summed over the role's instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_requests: Option<f64>,
    /// KV-cache usage, mean over the role's instances (0..1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_usage: Option<f64>,
}
