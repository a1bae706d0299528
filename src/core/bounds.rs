//! Bounded by construction: how much one PDDeployment may ask of the operator. Each count of the
//! spec stays within the CRD's maxima (`pd_api::limits`), checked again here for a spec that
//! skipped the schema, before any rule does arithmetic on it; and the engine pods a spec renders
//! stay within the operator's pods-per-PDDeployment limit, which the webhook and the controller
//! apply (the controller renders every pod of a spec in memory before it creates any).

use pd_api::limits::{
    MAX_GPUS_PER_INSTANCE, MAX_GPUS_PER_NODE, MAX_HANG_SECONDS, MAX_INSTANCES, MAX_PAGE_SIZE, MAX_PARALLEL_SIZE,
    MAX_RECOVERY_WINDOW_SECONDS, MAX_RESTARTS, MAX_ROUTER_REPLICAS, MAX_STARTUP_SECONDS,
};
use pd_api::{PDDeploymentSpec, Role};

use crate::findings::Finding;

/// The operator's default `--max-pods-per-deployment`.
pub const DEFAULT_MAX_PODS_PER_DEPLOYMENT: u32 = 512;
/// The default of `--max-rendered-pods`: engine pods held rendered at once across reconciles.
/// A rendered pod takes about 30 KB (docs/benchmarks.md), so 2,048 keep them near 60 MB, within
/// the chart's 256 Mi with the caches beside them; four objects at the pod limit render at once.
pub const DEFAULT_MAX_RENDERED_PODS: u32 = 2048;

/// Where an operator's pods-per-PDDeployment limit is set, as messages name it.
pub const POD_LIMIT_SETTING: &str = "operator flag --max-pods-per-deployment, chart value limits.maxPodsPerDeployment";

/// The rule id of a count above its maximum.
pub const RULE_COUNT: &str = "count-bound";
/// The rule id of a spec asking for more engine pods than the operator allows.
pub const RULE_PODS: &str = "max-pods-per-deployment";

/// Reports every count above its maximum; true when all are within. The rules that multiply
/// or divide counts run only then.
pub fn check_counts(spec: &PDDeploymentSpec, out: &mut Vec<Finding>) -> bool {
    let before = out.len();
    let instances = i64::from(MAX_INSTANCES);
    let mut over = |field: String, value: i64, max: i64, what: &str| {
        if value > max {
            out.push(Finding::error(
                RULE_COUNT,
                field.clone(),
                format!("{what} {value} is above the largest this operator accepts ({max})"),
                format!("set {field} to at most {max}"),
            ));
        }
    };
    over("spec.replicas".into(), spec.replicas.into(), instances, "replicas");
    over("spec.router.replicas".into(), spec.router.replicas.into(), MAX_ROUTER_REPLICAS.into(), "router replicas");
    over("spec.rollout.maxUnavailable".into(), spec.rollout.max_unavailable.into(), instances, "maxUnavailable");
    over("spec.recovery.maxRestarts".into(), spec.recovery.max_restarts.into(), MAX_RESTARTS.into(), "maxRestarts");
    let window = spec.recovery.window_seconds.into();
    over("spec.recovery.windowSeconds".into(), window, MAX_RECOVERY_WINDOW_SECONDS.into(), "windowSeconds");
    over("spec.recovery.hangSeconds".into(), spec.recovery.hang_seconds().into(), MAX_HANG_SECONDS.into(), "hangSeconds");
    over("spec.recovery.startupSeconds".into(), spec.recovery.startup_seconds().into(), MAX_STARTUP_SECONDS.into(), "startupSeconds");
    if let Some(page) = spec.kv_transfer.page_size {
        over("spec.kvTransfer.pageSize".into(), page.into(), MAX_PAGE_SIZE.into(), "pageSize");
    }
    for role in [Role::Prefill, Role::Decode] {
        let rs = spec.role(role);
        let p = &rs.parallelism;
        over(role.field("replicas"), rs.replicas.into(), instances, "replicas");
        over(role.field("gpusPerNode"), rs.gpus_per_node.into(), MAX_GPUS_PER_NODE.into(), "gpusPerNode");
        for (name, value) in [("tp", p.tp), ("dp", p.dp), ("attnDp", p.attn_dp), ("pp", p.pp), ("attnCp", p.attn_cp), ("dcp", p.dcp)] {
            over(role.field(&format!("parallelism.{name}")), value.into(), MAX_PARALLEL_SIZE.into(), name);
        }
        // Widths each within their bound may still multiply past the instance's.
        if [p.tp, p.pp, p.dp].iter().all(|w| *w <= MAX_PARALLEL_SIZE) {
            let (gpus, max) = (i64::try_from(p.gpus()).unwrap_or(i64::MAX), i64::try_from(MAX_GPUS_PER_INSTANCE).unwrap_or(i64::MAX));
            over(role.field("parallelism.tp"), gpus, max, "an instance's GPUs (tp × pp × dp)");
        }
        let limits = spec.scaling.role(role);
        over(format!("spec.scaling.{}.minReplicas", role.as_str()), limits.min_replicas.into(), instances, "minReplicas");
        if let Some(max) = limits.max_replicas {
            over(format!("spec.scaling.{}.maxReplicas", role.as_str()), max.into(), instances, "maxReplicas");
        }
        let rollout = spec.rollout.role(role);
        over(format!("spec.rollout.{}.partition", role.as_str()), rollout.partition.into(), instances, "partition");
        if let Some(n) = rollout.max_unavailable {
            over(format!("spec.rollout.{}.maxUnavailable", role.as_str()), n.into(), instances, "maxUnavailable");
        }
    }
    out.len() == before
}

/// One role's share of the engine pods: its instances, the extra instances an in-place rollout
/// may add (`maxSurge`), and the pods one instance spans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RolePods {
    pub role: Role,
    pub instances: u32,
    pub surge: u32,
    pub nodes: u32,
}

impl RolePods {
    /// The role's pods: every instance slot times its pods (saturating: any count past the
    /// limit is refused the same).
    pub fn total(&self) -> u64 {
        (u64::from(self.instances) + u64::from(self.surge)).saturating_mul(u64::from(self.nodes))
    }
}

impl std::fmt::Display for RolePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plural = |n: u64, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
        write!(f, "{} {}", self.role.as_str(), plural(self.instances.into(), "instance"))?;
        if self.surge > 0 {
            write!(f, " + {} surge", self.surge)?;
        }
        write!(f, " x {}", plural(self.nodes.into(), "node"))
    }
}

/// The engine pods a spec renders at most: both roles, every instance slot (surge included)
/// times the pods of one instance. The KV-set surge of an incompatible change runs a second set
/// beside the first for a while; each set is rendered and judged on its own.
pub fn engine_pods(spec: &PDDeploymentSpec) -> [RolePods; 2] {
    [Role::Prefill, Role::Decode].map(|role| RolePods {
        role,
        instances: spec.instances(role),
        surge: spec.rollout.max_surge(role),
        nodes: spec.role(role).nodes_per_instance(),
    })
}

/// The share of the render budget (`--max-rendered-pods`, `budget`) one reconcile of `spec`
/// takes: its engine pods, at least 1 and at most the whole budget (an object larger than the
/// budget renders alone).
pub fn render_permits(spec: &PDDeploymentSpec, budget: u32) -> u32 {
    let total = engine_pods(spec).iter().map(RolePods::total).fold(0u64, u64::saturating_add);
    u32::try_from(total).unwrap_or(u32::MAX).clamp(1, budget.max(1))
}

/// An error when the spec asks for more engine pods than `max` (the operator's
/// `--max-pods-per-deployment`), with the count and where it comes from.
pub fn pod_limit(spec: &PDDeploymentSpec, max: u32) -> Option<Finding> {
    let roles = engine_pods(spec);
    let total = roles.iter().map(RolePods::total).fold(0u64, u64::saturating_add);
    if total <= u64::from(max) {
        return None;
    }
    let parts = roles.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    let largest = roles.iter().max_by_key(|r| r.total()).map_or(Role::Decode, |r| r.role);
    let field = if spec.replicas > 1 { "spec.replicas".to_owned() } else { largest.field("replicas") };
    Some(Finding::error(
        RULE_PODS,
        field,
        format!("spec asks for {total} engine pods ({parts}); this operator allows at most {max} per PDDeployment ({POD_LIMIT_SETTING})"),
        format!(
            "lower spec.replicas or the roles' replicas (or use fewer, larger nodes per instance with gpusPerNode), or ask the operator's admin to raise --max-pods-per-deployment above {total}"
        ),
    ))
}

/// The largest divisor of `n` that is at most `limit` (1 when `n` is 0): found among the divisor
/// pairs `(d, n / d)` with `d <= sqrt(n)`, so at most 65,536 steps for any `u32`.
pub fn largest_divisor_at_most(n: u32, limit: u32) -> u32 {
    let mut best = 1;
    let mut d: u32 = 1;
    while d.checked_mul(d).is_some_and(|sq| sq <= n) {
        if n.is_multiple_of(d) {
            for candidate in [d, n / d] {
                if candidate <= limit && candidate > best {
                    best = candidate;
                }
            }
        }
        d += 1;
    }
    best
}

/// The smallest multiple of `of` that is at least `value` (and at least `of`); u64, so it cannot
/// overflow for any two `u32`.
pub fn next_multiple(value: u32, of: u32) -> u64 {
    let of = u64::from(of.max(1));
    u64::from(value).div_ceil(of).max(1) * of
}

#[cfg(test)]
mod tests;
