//! The recovery budget of an instance (`spec.recovery`): whether a recreation the plan asks for
//! goes now, waits out its backoff, or is held because the instance spent its budget. The
//! recreations counted are kept in `status.recoveries`, so a restarted controller reads them back.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use pd_api::{InstanceRecovery, RecoverySpec, Role};

/// The first recreation in a window goes at once; the next waits this long after the last, and
/// each one after twice as long as the one before, up to `BACKOFF_MAX`.
pub const BACKOFF_BASE: SignedDuration = SignedDuration::from_secs(10);
pub const BACKOFF_MAX: SignedDuration = SignedDuration::from_secs(300);
/// The `Degraded` reason (and the Event's) of an instance left down.
pub const EXHAUSTED: &str = "RecoveryBudgetExhausted";

/// What recovery has to report on a pass: the `Degraded` causes it owns and the recreations that
/// count (`status.recoveries`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Standing {
    /// Why an instance is being recreated right now (or waits out its backoff), if one is.
    pub recreating: Option<String>,
    /// Why an instance that spent its recovery budget is left down, if one is.
    pub held: Option<String>,
    /// The recreations that still count against each instance's budget, this pass's included.
    pub counted: Vec<InstanceRecovery>,
}

/// `spec.recovery` for one generation of the spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub max: u32,
    pub window: SignedDuration,
    /// The PDDeployment's generation: entries counted under another one no longer count.
    pub generation: Option<i64>,
}

/// What to do with a recreation the plan asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Recreate,
    /// Wait this long: the backoff since the last recreation.
    Backoff(SignedDuration),
    /// The budget is spent: the instance stays down until then (`None`: until the spec changes,
    /// for a budget of 0).
    Exhausted(Option<Timestamp>),
}

impl Budget {
    pub fn of(spec: &RecoverySpec, generation: Option<i64>) -> Self {
        let max = u32::try_from(spec.max_restarts).unwrap_or(0);
        Self { max, window: SignedDuration::from_secs(i64::from(spec.window_seconds.max(1))), generation }
    }

    /// When `e`'s window closes and its count starts afresh.
    fn window_end(&self, e: &InstanceRecovery) -> Timestamp {
        e.window_start.0.checked_add(self.window).unwrap_or(Timestamp::MAX)
    }

    /// Whether `e` still counts at `now`: counted under this generation, its window open.
    fn counts(&self, e: &InstanceRecovery, now: Timestamp) -> bool {
        e.observed_generation == self.generation && now < self.window_end(e)
    }

    /// The entries that still count at `now` (what `status.recoveries` keeps).
    pub fn current(&self, entries: &[InstanceRecovery], now: Timestamp) -> Vec<InstanceRecovery> {
        entries.iter().filter(|e| self.counts(e, now)).cloned().collect()
    }

    fn entry<'a>(&self, entries: &'a [InstanceRecovery], role: Role, instance: u32, now: Timestamp) -> Option<&'a InstanceRecovery> {
        entries.iter().find(|e| e.is(role, instance) && self.counts(e, now))
    }

    /// Whether `role`'s instance `instance` may be recreated at `now`.
    pub fn decide(&self, entries: &[InstanceRecovery], role: Role, instance: u32, now: Timestamp) -> Verdict {
        let entry = self.entry(entries, role, instance, now);
        let count = entry.map_or(0, |e| e.count);
        if count >= self.max {
            return Verdict::Exhausted(entry.map(|e| self.window_end(e)));
        }
        let Some(e) = entry else { return Verdict::Recreate };
        let left = backoff(count) - now.duration_since(e.last_at.0);
        if left.is_positive() { Verdict::Backoff(left) } else { Verdict::Recreate }
    }

    /// Counts a recreation of `role`'s instance `instance` at `now` for `cause`, in place of
    /// its entry in `entries` (dropping those that no longer count); returns its count.
    pub fn record(&self, entries: &mut Vec<InstanceRecovery>, role: Role, instance: u32, cause: &str, now: Timestamp) -> u32 {
        entries.retain(|e| self.counts(e, now));
        let at = Time(now);
        let count = match entries.iter_mut().find(|e| e.is(role, instance)) {
            Some(e) => {
                e.count = e.count.saturating_add(1);
                (e.last_at, e.last_cause) = (at, cause.to_owned());
                e.count
            }
            None => {
                entries.push(InstanceRecovery {
                    role,
                    instance,
                    count: 1,
                    window_start: at.clone(),
                    last_at: at,
                    last_cause: cause.to_owned(),
                    observed_generation: self.generation,
                });
                1
            }
        };
        entries.sort_by_key(|e| (e.role, e.instance));
        count
    }

    /// `Degraded`'s message for an instance left down: `why` it is broken, and until when.
    pub fn exhausted_message(&self, entries: &[InstanceRecovery], role: Role, instance: u32, why: &str, now: Timestamp) -> String {
        let what = left_down(role, instance);
        let Some(e) = self.entry(entries, role, instance, now) else {
            return format!("{why}; {what} until the spec changes: spec.recovery.maxRestarts is 0");
        };
        format!(
            "{why}; {what}: recreated {} since {} (spec.recovery allows {} in {}s), until {} or the spec changes",
            times(e.count),
            e.window_start.0,
            self.max,
            self.window.as_secs(),
            self.window_end(e)
        )
    }
}

/// `once`, `2 times`.
fn times(n: u32) -> String {
    if n == 1 { "once".to_owned() } else { format!("{n} times") }
}

/// How the `Degraded` message names an instance left down.
pub fn left_down(role: Role, instance: u32) -> String {
    format!("{} instance {instance} is left down", role.as_str())
}

/// The wait after the `count`th recreation: 10 s, doubling, at most 5 min.
pub fn backoff(count: u32) -> SignedDuration {
    let doublings = count.saturating_sub(1).min(16);
    BACKOFF_BASE.checked_mul(1 << doublings).map_or(BACKOFF_MAX, |d| d.min(BACKOFF_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2026-12-01T00:00:00Z".parse().unwrap()
    }

    fn secs(n: i64) -> SignedDuration {
        SignedDuration::from_secs(n)
    }

    fn budget(max: i32, window: i32) -> Budget {
        Budget::of(&RecoverySpec { max_restarts: max, window_seconds: window, ..RecoverySpec::default() }, Some(3))
    }

    #[test]
    fn the_default_budget_is_five_in_ten_minutes() {
        let b = Budget::of(&RecoverySpec::default(), Some(1));
        assert_eq!((b.max, b.window), (5, secs(600)));
    }

    #[test]
    fn recreations_back_off_from_ten_seconds_doubling_up_to_five_minutes() {
        assert_eq!([1, 2, 3, 4, 5, 6, 40].map(backoff), [10, 20, 40, 80, 160, 300, 300].map(secs));
        let b = budget(100, 3600);
        let mut entries = Vec::new();
        assert_eq!(b.decide(&entries, Role::Prefill, 0, now()), Verdict::Recreate, "the first goes at once");
        assert_eq!(b.record(&mut entries, Role::Prefill, 0, "pod p-0-1: container engine restarted", now()), 1);
        assert_eq!(b.decide(&entries, Role::Prefill, 0, now() + secs(4)), Verdict::Backoff(secs(6)));
        assert_eq!(b.decide(&entries, Role::Prefill, 0, now() + secs(10)), Verdict::Recreate);
        assert_eq!(b.decide(&entries, Role::Prefill, 1, now()), Verdict::Recreate, "each instance has its own");
        assert_eq!(b.decide(&entries, Role::Decode, 0, now()), Verdict::Recreate, "each role too");
        assert_eq!(b.record(&mut entries, Role::Prefill, 0, "again", now() + secs(10)), 2);
        assert_eq!(b.decide(&entries, Role::Prefill, 0, now() + secs(25)), Verdict::Backoff(secs(5)), "20 s after the second");
        let e = &entries[0];
        assert_eq!((e.count, e.window_start.0, e.last_at.0, e.last_cause.as_str()), (2, now(), now() + secs(10), "again"));
    }

    #[test]
    fn a_spent_budget_leaves_the_instance_down_until_the_window_passes_or_the_spec_changes() {
        let b = budget(2, 600);
        let mut entries = Vec::new();
        b.record(&mut entries, Role::Decode, 1, "first", now());
        b.record(&mut entries, Role::Decode, 1, "second", now() + secs(60));
        let until = now() + secs(600);
        assert_eq!(b.decide(&entries, Role::Decode, 1, now() + secs(400)), Verdict::Exhausted(Some(until)));
        let message = b.exhausted_message(&entries, Role::Decode, 1, "pod d-1-0 is Failed", now() + secs(400));
        assert_eq!(
            message,
            format!(
                "pod d-1-0 is Failed; decode instance 1 is left down: recreated 2 times since {} (spec.recovery allows 2 in 600s), until {until} or the spec changes",
                now()
            )
        );
        let mut once = Vec::new();
        let one = budget(1, 600);
        one.record(&mut once, Role::Decode, 1, "first", now());
        let message = one.exhausted_message(&once, Role::Decode, 1, "why", now());
        assert!(message.starts_with(&format!("why; decode instance 1 is left down: recreated once since {}", now())), "{message}");
        // The window passed: a fresh budget, and the entry no longer counts.
        assert_eq!(b.decide(&entries, Role::Decode, 1, until), Verdict::Recreate);
        assert!(b.current(&entries, until).is_empty());
        assert_eq!(b.record(&mut entries, Role::Decode, 1, "third", until), 1, "counted afresh");
        // A new generation of the spec: a fresh budget at once.
        let changed = Budget { generation: Some(4), ..b };
        assert_eq!(changed.decide(&entries, Role::Decode, 1, until + secs(1)), Verdict::Recreate);
        assert!(changed.current(&entries, until).is_empty());
    }

    #[test]
    fn a_budget_of_zero_never_recreates() {
        let b = budget(0, 600);
        assert_eq!(b.decide(&[], Role::Prefill, 0, now()), Verdict::Exhausted(None));
        let message = b.exhausted_message(&[], Role::Prefill, 0, "pod p-0-0 disappeared", now());
        assert!(message.ends_with("prefill instance 0 is left down until the spec changes: spec.recovery.maxRestarts is 0"), "{message}");
    }

    #[test]
    fn entries_stay_sorted_so_the_status_does_not_churn() {
        let b = budget(5, 600);
        let mut entries = Vec::new();
        for (role, i) in [(Role::Decode, 0), (Role::Prefill, 2), (Role::Prefill, 1)] {
            b.record(&mut entries, role, i, "x", now());
        }
        let order: Vec<(Role, u32)> = entries.iter().map(|e| (e.role, e.instance)).collect();
        assert_eq!(order, [(Role::Prefill, 1), (Role::Prefill, 2), (Role::Decode, 0)]);
    }
}
