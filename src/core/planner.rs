//! The planner's decision (`spec.autoscaling`): each role's instance count from SGLang's metrics.
//! Prefill follows TTFT and its queue, decode follows ITL, its running requests and KV-cache usage. A role under
//! pressure scales up at once, in proportion (at most doubling a pass); a role whose load stayed
//! low for the stabilisation window, and was not scaled within the cooldown, gives back one
//! instance a pass. A role with no figure to judge holds (never scale on missing data). The
//! counts then go through `scaling::scale`, the one clamp of `spec.scaling` every ask goes through.
//! Pure: the controller reads the metrics and the clock, this decides.

use jiff::{SignedDuration, Timestamp};
use pd_api::{AutoscalingSpec, Observed, PDDeploymentSpec, Role};

use crate::scaling::{self, Ask, Asked, Source};

pub mod promql;
pub mod scrape;

/// The field manager the planner writes a `PDRole`'s `spec.replicas` with (in `Auto` mode): the
/// owner `PDRoleStatus::replicasOwner` shows for a role the planner drives.
pub const FIELD_MANAGER: &str = "pd-operator-planner";
/// A latency below this share of its objective counts as low load (scale-down may follow).
pub const LOW_LATENCY_SHARE: f64 = 0.5;
/// A queue below this share of `queuePerInstance` per instance counts as low load.
pub const LOW_QUEUE_SHARE: f64 = 0.5;
/// The most a role grows in one pass, as a multiple of its count.
pub const MAX_STEP_UP: u32 = 2;
/// How long a scale that has not landed (instances not Ready) holds the role's next scale-up: a
/// pod that cannot start (no GPU left) must not stop the planner for good.
pub const LANDING_GRACE: SignedDuration = SignedDuration::from_mins(10);

/// Which way a role's count goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Up,
    Down,
    Hold,
}

/// One role as the controller saw it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoleInput {
    /// Instances run now.
    pub current: u32,
    pub observed: Observed,
    /// Since when the load has been low without a break (the previous pass's `low_since`).
    pub low_since: Option<Timestamp>,
    /// When the role's count last changed by the planner.
    pub last_scale: Option<Timestamp>,
    /// Instances Ready now (leader pods Ready, not terminating).
    pub ready: u32,
}

/// One role's decision.
#[derive(Clone, Debug, PartialEq)]
pub struct RoleDecision {
    pub role: Role,
    pub current: u32,
    /// What the signals ask for, before `spec.scaling`.
    pub wanted: u32,
    /// What to run: `wanted` within `spec.scaling`.
    pub recommended: u32,
    pub direction: Direction,
    /// Why, with the figures.
    pub reason: String,
    /// Carried to the next pass: since when the load has been low.
    pub low_since: Option<Timestamp>,
}

/// Both roles' decisions.
#[derive(Clone, Debug, PartialEq)]
pub struct Recommendation {
    pub prefill: RoleDecision,
    pub decode: RoleDecision,
}

impl Recommendation {
    pub fn role(&self, role: Role) -> &RoleDecision {
        match role {
            Role::Prefill => &self.prefill,
            Role::Decode => &self.decode,
        }
    }

    /// Whether any role's count changes.
    pub fn changes(&self) -> bool {
        [&self.prefill, &self.decode].iter().any(|d| d.recommended != d.current)
    }

    /// The Event's action: the counts. An Event recorder folds Events of one action and reason
    /// into a series that keeps its first note, so a constant action lost every later decision's
    /// figures; each decision of other counts now makes its own Event.
    pub fn action(&self) -> String {
        let each = |d: &RoleDecision| format!("{} {}->{}", d.role.as_str(), d.current, d.recommended);
        format!("Plan {}, {}", each(&self.prefill), each(&self.decode))
    }

    /// Both roles in one line, for an Event or the status message.
    pub fn message(&self) -> String {
        let each = |d: &RoleDecision| format!("{} {} → {}: {}", d.role.as_str(), d.current, d.recommended, d.reason);
        format!("{}; {}", each(&self.prefill), each(&self.decode))
    }
}

/// A signal: its figure against its objective.
struct Signal {
    name: &'static str,
    value: f64,
    /// Above it: pressure.
    high: f64,
    /// Below it: low load.
    low: f64,
}

impl Signal {
    fn pressure(&self) -> f64 {
        if self.high > 0.0 { self.value / self.high } else { 0.0 }
    }
    fn text(&self) -> String {
        format!("{} {:.3} (up above {:.3}, down below {:.3})", self.name, self.value, self.high, self.low)
    }
}

/// The signals of `role` that have both a figure and an objective.
fn signals(role: Role, auto: &AutoscalingSpec, input: &RoleInput) -> Vec<Signal> {
    let o = &input.observed;
    let mut out = Vec::new();
    let mut push = |name, value: Option<f64>, high: Option<f64>, low_share: f64| {
        if let (Some(value), Some(high)) = (value.filter(|v| v.is_finite()), high) {
            out.push(Signal { name, value, high, low: high * low_share });
        }
    };
    match role {
        Role::Prefill => {
            push("TTFT p90 (s)", o.ttft_p90_seconds, auto.slo.ttft_p90_seconds, LOW_LATENCY_SHARE);
            let per_instance = o.queued_requests.map(|q| q / f64::from(input.current.max(1)));
            push("queued requests per instance", per_instance, auto.load.queue_per_instance, LOW_QUEUE_SHARE);
        }
        Role::Decode => {
            push("ITL p90 (s)", o.itl_p90_seconds, auto.slo.itl_p90_seconds, LOW_LATENCY_SHARE);
            let per_instance = o.running_requests.map(|r| r / f64::from(input.current.max(1)));
            push("running requests per instance", per_instance, auto.load.running_per_instance, LOW_QUEUE_SHARE);
            if let Some(kv) = o.kv_usage.filter(|v| v.is_finite()) {
                out.push(Signal { name: "KV usage", value: kv, high: auto.load.kv_usage_high, low: auto.load.kv_usage_low });
            }
        }
    }
    out
}

/// What one role's signals ask for, before the bounds.
pub fn decide_role(role: Role, auto: &AutoscalingSpec, input: &RoleInput, now: Timestamp) -> RoleDecision {
    let current = input.current;
    let hold = |reason: String, low_since| RoleDecision {
        role,
        current,
        wanted: current,
        recommended: current,
        direction: Direction::Hold,
        reason,
        low_since,
    };
    let signals = signals(role, auto, input);
    if signals.is_empty() {
        return hold("no metric answered for its signals: holding (the planner never scales on missing data)".into(), None);
    }
    let figures = signals.iter().map(Signal::text).collect::<Vec<_>>().join(", ");
    let pressure = signals.iter().map(Signal::pressure).fold(0.0, f64::max);
    if pressure > 1.0
        && current > 0
        && let Some(why) = last_scale_pending(auto, input, now)
    {
        return hold(format!("up held: {why}: {figures}; pressure {pressure:.2}"), None);
    }
    if pressure > 1.0 || current == 0 {
        let want = (f64::from(current.max(1)) * pressure).ceil().min(f64::from(u32::MAX));
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let want = (want as u32).max(current + 1).min(current.max(1).saturating_mul(MAX_STEP_UP));
        let decision = RoleDecision { wanted: want, recommended: want, direction: Direction::Up, ..hold(String::new(), None) };
        return RoleDecision { reason: format!("up: {figures}; pressure {pressure:.2}"), ..decision };
    }
    if !signals.iter().all(|s| s.value < s.low) {
        return hold(format!("within objectives: {figures}"), None);
    }
    let since = input.low_since.unwrap_or(now);
    let low_for = now.duration_since(since);
    let window = SignedDuration::from_secs(i64::from(auto.stabilization_window_seconds));
    let cooldown = SignedDuration::from_secs(i64::from(auto.cooldown_seconds));
    let cooled = input.last_scale.is_none_or(|t| now.duration_since(t) >= cooldown);
    if current <= 1 {
        return hold(format!("low load at 1 instance: {figures} (the planner never scales a role to zero)"), Some(since));
    }
    if low_for < window {
        let left = (window - low_for).as_secs();
        return hold(format!("low load for {}s, {left}s of the stabilisation window left: {figures}", low_for.as_secs()), Some(since));
    }
    if !cooled {
        return hold(format!("low load, cooling down after the last scale ({}s): {figures}", auto.cooldown_seconds), Some(since));
    }
    let want = current - 1;
    let reason = format!("down: low load for {}s: {figures}", low_for.as_secs());
    RoleDecision { wanted: want, recommended: want, direction: Direction::Down, reason, ..hold(String::new(), Some(since)) }
}

/// Why the role's last scale still holds the next scale-up, if it does: its instances are not all
/// Ready yet (within `LANDING_GRACE`), or the metrics window still reaches back before it, so the
/// figures still hold the load the last step is draining. (Without this hold a queue built at one
/// instance took prefill 1 → 2 → 4 within fifteen seconds for a load that needed 3.)
fn last_scale_pending(auto: &AutoscalingSpec, input: &RoleInput, now: Timestamp) -> Option<String> {
    let at = input.last_scale?;
    let since = now.duration_since(at);
    if input.ready < input.current && since < LANDING_GRACE {
        return Some(format!(
            "the last scale ({}s ago) has not landed, {} of {} instances Ready",
            since.as_secs(),
            input.ready,
            input.current
        ));
    }
    let window = SignedDuration::from_secs(i64::from(auto.metrics_window_seconds));
    (since < window).then(|| {
        let left = (window - since).as_secs();
        format!("the metrics window ({}s) reaches back before the last scale for {left}s more", auto.metrics_window_seconds)
    })
}

/// Both roles' decisions, kept within `spec.scaling` (each role's bounds, then the ratio band)
/// by `scaling::scale`.
pub fn plan(spec: &PDDeploymentSpec, auto: &AutoscalingSpec, inputs: (&RoleInput, &RoleInput), now: Timestamp) -> Recommendation {
    let mut prefill = decide_role(Role::Prefill, auto, inputs.0, now);
    let mut decode = decide_role(Role::Decode, auto, inputs.1, now);
    let ask = |d: &RoleDecision| Some(Ask { count: d.wanted, source: Source::Role { manager: FIELD_MANAGER.into() } });
    let scaled = scaling::scale(spec, &Asked { prefill: ask(&prefill), decode: ask(&decode) });
    for d in [&mut prefill, &mut decode] {
        d.recommended = scaled.count(d.role);
        if let Some(limited) = scaled.limited(d.role) {
            d.reason = format!("{}; bounded: {}", d.reason, limited.message());
        }
        d.direction = match d.recommended.cmp(&d.current) {
            std::cmp::Ordering::Greater => Direction::Up,
            std::cmp::Ordering::Less => Direction::Down,
            std::cmp::Ordering::Equal => Direction::Hold,
        };
    }
    Recommendation { prefill, decode }
}

#[cfg(test)]
mod tests;
