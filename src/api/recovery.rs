//! Recovery of a broken instance: `spec.recovery` bounds how often the operator recreates one
//! instance, and `status.recoveries` is the controller's memory of the recreations it counted.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Role;
use crate::limits::{MAX_HANG_SECONDS, MAX_RECOVERY_WINDOW_SECONDS, MAX_RESTARTS, MAX_STARTUP_SECONDS};

/// How often one instance may be recreated (a pod Failed or gone, or an engine container of a
/// multi-node instance restarted) before the operator leaves it down. Recreations of one
/// instance wait 10 s, then twice as long each time (at most 5 min); past `maxRestarts` within
/// `windowSeconds` the instance is left down (condition `Degraded`, reason
/// `RecoveryBudgetExhausted`) until the window passes or the spec changes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverySpec {
    /// Recreations of one instance within `windowSeconds` (default 5). 0: a broken instance is
    /// never recreated by the operator.
    #[serde(default = "default_max_restarts")]
    #[schemars(range(min = 0, max = MAX_RESTARTS))]
    pub max_restarts: i32,
    /// The window the recreations are counted in, from the first one counted (default 600).
    #[serde(default = "default_window_seconds")]
    #[schemars(range(min = 1, max = MAX_RECOVERY_WINDOW_SECONDS))]
    pub window_seconds: i32,
    /// How long an engine that serves HTTP (the leader of each instance) may fail SGLang's own
    /// progress check, `GET /health_generate` (one token generated, or any output seen, within
    /// SGLang's 20 s), before its container is restarted (default 120; 0: no liveness check). A
    /// restart in a multi-node instance recreates the instance as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_HANG_SECONDS))]
    pub hang_seconds: Option<i32>,
    /// How long an engine may take to start (weights loaded, CUDA graphs captured) before the
    /// liveness check begins and a start that never ends restarts it (default 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = MAX_STARTUP_SECONDS))]
    pub startup_seconds: Option<i32>,
}

impl RecoverySpec {
    /// `hangSeconds`, its default filled in.
    pub fn hang_seconds(&self) -> i32 {
        self.hang_seconds.unwrap_or(120)
    }

    /// `startupSeconds`, its default filled in.
    pub fn startup_seconds(&self) -> i32 {
        self.startup_seconds.unwrap_or(3_600)
    }
}

impl Default for RecoverySpec {
    fn default() -> Self {
        Self { max_restarts: default_max_restarts(), window_seconds: default_window_seconds(), hang_seconds: None, startup_seconds: None }
    }
}

fn default_max_restarts() -> i32 {
    5
}

fn default_window_seconds() -> i32 {
    600
}

/// The recreations of one instance the controller counted in the current window.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRecovery {
    pub role: Role,
    pub instance: u32,
    /// Recreations since `windowStart`.
    pub count: u32,
    /// The first recreation counted: the budget starts afresh `spec.recovery.windowSeconds` later.
    pub window_start: Time,
    /// The last recreation.
    pub last_at: Time,
    /// Why the instance was last recreated (the pod and container, the restart count).
    pub last_cause: String,
    /// The PDDeployment's generation the recreations were counted under: a spec change starts
    /// the budget afresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl InstanceRecovery {
    /// Whether this entry is about `role`'s instance `instance`.
    pub fn is(&self, role: Role, instance: u32) -> bool {
        self.role == role && self.instance == instance
    }
}
