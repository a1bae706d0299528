//! How many instances each role runs: the count asked for (the PDDeployment's `/scale` units ×
//! the role's per-unit `replicas`, or the role's own `PDRole` `/scale` once another manager owns
//! it), kept within `spec.scaling` (each role's `minReplicas`/`maxReplicas`, the decode:prefill
//! ratio band). Pure: the controller reads the asks, this decides, the controller reports.
//!
//! The seam for a planner: it would produce `Asked` (e.g. from SGLang's metrics) and go through
//! the same bounds.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
use pd_api::conditions::HasStatus;
use pd_api::{PDDeploymentSpec, PDDeploymentStatus, PDRole, PDRoleStatus, Role, RoleLimits};

/// The PDDeployment condition telling whether a count asked for was clamped.
pub const SCALING_LIMITED: &str = "ScalingLimited";
/// The Event reason when a clamp first happens or changes.
pub const SCALING_LIMITED_EVENT: &str = "ScalingLimited";
/// `PDRoleStatus::replicas_owner` while the PDDeployment drives the role.
pub const OWNER_DEPLOYMENT: &str = "PDDeployment";
/// Rounding slack for the ratio band's products (0.5 × 3 is 1.5, never 1.4999…).
const EPSILON: f64 = 1e-9;

/// Who asks for a role's count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The PDDeployment: `spec.replicas` × `spec.<role>.replicas`.
    Deployment,
    /// The role's `PDRole`, whose `spec.replicas` this field manager wrote (`kubectl`, an HPA…).
    Role { manager: String },
}

impl Source {
    /// The owner as `PDRoleStatus::replicas_owner` shows it.
    pub fn owner(&self) -> &str {
        match self {
            Source::Deployment => OWNER_DEPLOYMENT,
            Source::Role { manager } => manager,
        }
    }
}

/// One role's ask.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    pub count: u32,
    pub source: Source,
}

/// What each role's scale target asks for: `Some` where another manager than the operator owns
/// the `PDRole`'s `spec.replicas` (with that value and manager), `None` where the PDDeployment
/// drives the role.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Asked {
    pub prefill: Option<Ask>,
    pub decode: Option<Ask>,
}

/// Which bound moved a count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    RoleMin,
    RoleMax,
    RatioMin,
    RatioMax,
}

impl Bound {
    /// The condition reason.
    pub fn reason(self) -> &'static str {
        match self {
            Bound::RoleMin => "BelowMinReplicas",
            Bound::RoleMax => "AboveMaxReplicas",
            Bound::RatioMin => "BelowRatioBand",
            Bound::RatioMax => "AboveRatioBand",
        }
    }
}

/// A count that was not run as asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limited {
    pub role: Role,
    pub asked: Ask,
    pub target: u32,
    pub bound: Bound,
    /// The other role's count, which a ratio bound was measured against.
    pub other: u32,
}

impl Limited {
    /// What happened, which field bounds it and how to change it.
    pub fn message(&self) -> String {
        let role = self.role.as_str();
        let who = match &self.asked.source {
            Source::Deployment => "by the PDDeployment (spec.replicas × per-unit replicas)".to_owned(),
            Source::Role { manager } => format!("through its PDRole by {manager}"),
        };
        let head = format!("{role}: {} instances asked {who}, running {}", self.asked.count, self.target);
        let other = if self.role == Role::Prefill { "decode" } else { "prefill" };
        let why = match self.bound {
            Bound::RoleMin => format!("below spec.scaling.{role}.minReplicas; lower it to allow fewer"),
            Bound::RoleMax => format!("above spec.scaling.{role}.maxReplicas; raise it to allow more"),
            Bound::RatioMin | Bound::RatioMax => {
                let edge = if self.bound == Bound::RatioMin { "min" } else { "max" };
                format!(
                    "outside the decode:prefill band spec.scaling.ratio.{edge} with {} {other} instances; widen the band or scale {other}",
                    self.other
                )
            }
        };
        format!("{head}: {why}")
    }
}

/// Each role's count to run, and the asks that were clamped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scaled {
    pub prefill: u32,
    pub decode: u32,
    /// Each role's ask and where it came from.
    pub asks: (Ask, Ask),
    /// Per-unit counts of the PDDeployment (the units its `/scale` status counts in).
    pub per_unit: (u32, u32),
    pub limited: Vec<Limited>,
}

impl Scaled {
    pub fn count(&self, role: Role) -> u32 {
        match role {
            Role::Prefill => self.prefill,
            Role::Decode => self.decode,
        }
    }

    pub fn ask(&self, role: Role) -> &Ask {
        match role {
            Role::Prefill => &self.asks.0,
            Role::Decode => &self.asks.1,
        }
    }

    /// The PDDeployment's per-unit count of `role` (`spec.<role>.replicas`).
    pub fn per_unit(&self, role: Role) -> u32 {
        match role {
            Role::Prefill => self.per_unit.0,
            Role::Decode => self.per_unit.1,
        }
    }

    /// Why `role` runs other than it asked, if it does.
    pub fn limited(&self, role: Role) -> Option<&Limited> {
        self.limited.iter().find(|l| l.role == role)
    }

    /// The `ScalingLimited` condition: (status, reason, message).
    pub fn condition(&self) -> (bool, &'static str, String) {
        match self.limited.first() {
            None => {
                let each = |role: Role| format!("{} {} (asked by {})", role.as_str(), self.count(role), self.ask(role).source.owner());
                (false, "AsAsked", format!("instances run as asked: {}, {}", each(Role::Prefill), each(Role::Decode)))
            }
            Some(first) => (true, first.bound.reason(), self.limited.iter().map(Limited::message).collect::<Vec<_>>().join("; ")),
        }
    }

    /// `spec` with each role's count as decided: one unit of `prefill` and `decode` instances.
    /// What the renderer, planner and status read as the instances to run.
    pub fn apply_to(&self, spec: &PDDeploymentSpec) -> PDDeploymentSpec {
        let mut out = spec.clone();
        out.replicas = 1;
        out.prefill.replicas = i32::try_from(self.prefill).unwrap_or(i32::MAX);
        out.decode.replicas = i32::try_from(self.decode).unwrap_or(i32::MAX);
        out
    }
}

/// Decides each role's count: the ask, within the role's bounds, then the ratio band. The band
/// moves the role a `PDRole` asked for when only one role is asked for that way (the request that
/// left the band); otherwise it moves decode against prefill. Role bounds win over the band when
/// both cannot hold (the band is then reported as not met). The band binds while both roles run.
pub fn scale(spec: &PDDeploymentSpec, asked: &Asked) -> Scaled {
    let ask = |role: Role, own: &Option<Ask>| own.clone().unwrap_or(Ask { count: spec.instances(role), source: Source::Deployment });
    let asks = (ask(Role::Prefill, &asked.prefill), ask(Role::Decode, &asked.decode));
    let mut limited = Vec::new();
    let mut prefill = within_role(Role::Prefill, &asks.0, &spec.scaling.prefill, &mut limited);
    let mut decode = within_role(Role::Decode, &asks.1, &spec.scaling.decode, &mut limited);
    if let Some(band) = spec.scaling.ratio.filter(|_| prefill > 0 && decode > 0) {
        let move_prefill = asked.prefill.is_some() && asked.decode.is_none();
        let (role, moved, anchor) = if move_prefill {
            // prefill within [decode / max, decode / min]
            let lo = (f64::from(decode) / band.max - EPSILON).ceil();
            let hi = (f64::from(decode) / band.min + EPSILON).floor();
            (Role::Prefill, &mut prefill, (lo, hi, decode))
        } else {
            let lo = (f64::from(prefill) * band.min - EPSILON).ceil();
            let hi = (f64::from(prefill) * band.max + EPSILON).floor();
            (Role::Decode, &mut decode, (lo, hi, prefill))
        };
        let (lo, hi, other) = anchor;
        let bounds = spec.scaling.role(role);
        // Too few decode, or too many prefill, is below the band's min (and the other way round).
        let (few, many) = if role == Role::Decode { (Bound::RatioMin, Bound::RatioMax) } else { (Bound::RatioMax, Bound::RatioMin) };
        let bound = if f64::from(*moved) < lo {
            Some((few, lo))
        } else if f64::from(*moved) > hi {
            Some((many, hi))
        } else {
            None
        };
        if let Some((bound, to)) = bound {
            // Rounded to a whole count, at least 1, and never outside the role's own bounds.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let to = (to.max(1.0).min(f64::from(u32::MAX)) as u32).clamp(min_of(bounds), max_of(bounds));
            let asked = if role == Role::Prefill { asks.0.clone() } else { asks.1.clone() };
            limited.retain(|l| l.role != role);
            // Reported also when the role's bounds keep it at its ask outside the band.
            if to != asked.count || f64::from(to) < lo || f64::from(to) > hi {
                limited.push(Limited { role, asked, target: to, bound, other });
            }
            *moved = to;
        }
    }
    let per_unit = |role: Role| u32::try_from(spec.role(role).replicas).unwrap_or(0);
    Scaled { prefill, decode, asks, per_unit: (per_unit(Role::Prefill), per_unit(Role::Decode)), limited }
}

/// Whether a managed-fields entry owns `spec.replicas`.
fn owns_replicas(entry: &ManagedFieldsEntry) -> bool {
    entry.fields_v1.as_ref().is_some_and(|f| f.0.get("f:spec").and_then(|s| s.get("f:replicas")).is_some())
}

/// Keeps of an object's managed fields only who owns `spec.replicas`, and only that field: what
/// the controller's caches keep (the rest is most of an object's bytes and never read).
pub fn keep_replicas_owners(meta: &mut ObjectMeta) {
    let kept: Vec<ManagedFieldsEntry> = meta
        .managed_fields
        .take()
        .into_iter()
        .flatten()
        .filter(owns_replicas)
        .map(|e| ManagedFieldsEntry {
            fields_v1: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(serde_json::json!({"f:spec": {"f:replicas": {}}}))),
            ..e
        })
        .collect();
    meta.managed_fields = Some(kept).filter(|k| !k.is_empty());
}

/// The ask of a role's `PDRole`: its `spec.replicas` where a field manager other than `ours` owns
/// that field (`kubectl scale`, an HPA, KEDA, an apply of the PDRole). `None` where the operator
/// owns it or nobody sets it: the PDDeployment drives the role.
pub fn ask_of(target: &PDRole, ours: &str) -> Option<Ask> {
    let count = u32::try_from(target.spec.replicas?).ok()?;
    let owner = target.metadata.managed_fields.iter().flatten().filter(|e| owns_replicas(e)).find_map(|e| {
        let manager = e.manager.clone().unwrap_or_default();
        (manager != ours).then_some(manager)
    })?;
    Some(Ask { count, source: Source::Role { manager: owner } })
}

/// Sets each rendered `PDRole`'s `spec.replicas` to what the operator may assert: the
/// PDDeployment's ask where it drives the role, nothing where another manager owns the count
/// (server-side apply then leaves that manager's value alone).
pub fn yield_replicas(targets: &mut [PDRole], scaled: &Scaled) {
    for target in targets {
        let ask = scaled.ask(target.spec.role);
        target.spec.replicas = match ask.source {
            Source::Deployment => Some(i32::try_from(ask.count).unwrap_or(i32::MAX)),
            Source::Role { .. } => None,
        };
    }
}

/// A `PDRole`'s status: `present` instances of the role have pods; `selector` finds their leaders.
pub fn role_status(scaled: &Scaled, role: Role, present: u32, selector: String) -> PDRoleStatus {
    PDRoleStatus {
        replicas: i32::try_from(present).unwrap_or(i32::MAX),
        selector,
        target_replicas: i32::try_from(scaled.count(role)).unwrap_or(i32::MAX),
        replicas_owner: scaled.ask(role).source.owner().to_owned(),
        limited: scaled.limited(role).map(Limited::message),
    }
}

/// The message of a `ScalingLimited` condition that turned True or changed its message: what
/// the Event says once per new clamp.
pub fn limited_transition(previous: Option<&PDDeploymentStatus>, next: &PDDeploymentStatus) -> Option<String> {
    let find = |s: &PDDeploymentStatus| s.conditions.iter().find(|c| c.type_ == SCALING_LIMITED).cloned();
    let now = find(next).filter(HasStatus::is_true)?;
    let before = previous.and_then(find);
    (before.is_none_or(|b| !b.is_true() || b.message != now.message)).then_some(now.message)
}

fn min_of(bounds: &RoleLimits) -> u32 {
    u32::try_from(bounds.min_replicas).unwrap_or(0)
}

fn max_of(bounds: &RoleLimits) -> u32 {
    bounds.max_replicas.and_then(|m| u32::try_from(m).ok()).unwrap_or(u32::MAX).max(min_of(bounds))
}

/// The ask within `minReplicas..=maxReplicas`, noting a clamp.
fn within_role(role: Role, ask: &Ask, bounds: &RoleLimits, limited: &mut Vec<Limited>) -> u32 {
    let target = ask.count.clamp(min_of(bounds), max_of(bounds));
    if target != ask.count {
        let bound = if target > ask.count { Bound::RoleMin } else { Bound::RoleMax };
        limited.push(Limited { role, asked: ask.clone(), target, bound, other: 0 });
    }
    target
}

#[cfg(test)]
mod tests {
    use super::*;
    use pd_api::RatioBand;

    fn spec(units: i32, per_unit: (i32, i32)) -> PDDeploymentSpec {
        let text = format!(
            "replicas: {units}\nmodel: {{path: Qwen/Qwen3-8B}}\nprefill: {{replicas: {}}}\ndecode: {{replicas: {}}}\n",
            per_unit.0, per_unit.1
        );
        serde_norway::from_str(&text).unwrap()
    }

    fn by(manager: &str, count: u32) -> Option<Ask> {
        Some(Ask { count, source: Source::Role { manager: manager.into() } })
    }

    #[test]
    fn without_bounds_each_role_runs_what_it_asked() {
        let s = spec(2, (1, 2));
        let scaled = scale(&s, &Asked::default());
        assert_eq!((scaled.prefill, scaled.decode), (2, 4));
        assert!(scaled.limited.is_empty());
        assert!(!scaled.condition().0);
        assert_eq!(scaled.condition().2, "instances run as asked: prefill 2 (asked by PDDeployment), decode 4 (asked by PDDeployment)");
        let scaled = scale(&s, &Asked { decode: by("kubectl", 7), ..Asked::default() });
        assert_eq!((scaled.prefill, scaled.decode), (2, 7), "a role's own ask moves that role only");
        assert_eq!(scaled.ask(Role::Decode).source.owner(), "kubectl");
        assert_eq!(scaled.ask(Role::Prefill).source.owner(), OWNER_DEPLOYMENT);
    }

    #[test]
    fn zero_is_clamped_to_one_unless_min_replicas_allows_it() {
        let mut s = spec(0, (1, 1));
        let scaled = scale(&s, &Asked::default());
        assert_eq!((scaled.prefill, scaled.decode), (1, 1));
        let (limited, reason, message) = scaled.condition();
        assert!(limited);
        assert_eq!(reason, "BelowMinReplicas");
        assert!(message.contains("spec.scaling.prefill.minReplicas"), "{message}");
        s.scaling.decode.min_replicas = 0;
        let scaled = scale(&s, &Asked { prefill: by("hpa", 2), ..Asked::default() });
        assert_eq!((scaled.prefill, scaled.decode), (2, 0), "decode may reach zero once allowed");
    }

    #[test]
    fn role_max_clamps_the_ask_and_says_which_field() {
        let mut s = spec(1, (1, 1));
        s.scaling.decode.max_replicas = Some(3);
        let scaled = scale(&s, &Asked { decode: by("horizontal-pod-autoscaler", 10), ..Asked::default() });
        assert_eq!(scaled.decode, 3);
        let l = scaled.limited(Role::Decode).unwrap();
        assert_eq!((l.bound, l.asked.count, l.target), (Bound::RoleMax, 10, 3));
        assert!(l.message().contains("spec.scaling.decode.maxReplicas"), "{}", l.message());
        assert!(l.message().contains("horizontal-pod-autoscaler"), "{}", l.message());
    }

    #[test]
    fn the_ratio_band_moves_the_role_whose_own_target_left_it() {
        let mut s = spec(1, (2, 2));
        s.scaling.ratio = Some(RatioBand { min: 0.5, max: 2.0 });
        // decode asked 9 with 2 prefill: at most 4.
        let scaled = scale(&s, &Asked { decode: by("kubectl", 9), ..Asked::default() });
        assert_eq!((scaled.prefill, scaled.decode), (2, 4));
        assert_eq!(scaled.condition().1, "AboveRatioBand");
        // decode asked 0 is below the role minimum (1), then 1 with 2 prefill is in the band.
        let scaled = scale(&s, &Asked { decode: by("kubectl", 0), ..Asked::default() });
        assert_eq!(scaled.decode, 1);
        assert_eq!(scaled.condition().1, "BelowMinReplicas");
        // prefill asked 9 with 2 decode: at most 4 prefill (2 / 0.5).
        let scaled = scale(&s, &Asked { prefill: by("kubectl", 9), ..Asked::default() });
        assert_eq!((scaled.prefill, scaled.decode), (4, 2));
        let l = scaled.limited(Role::Prefill).unwrap();
        assert_eq!((l.bound, l.other), (Bound::RatioMin, 2));
        assert!(l.message().contains("spec.scaling.ratio.min"), "{}", l.message());
        // prefill asked 1 with 3 decode and max 2: 2 prefill (3 / 2 rounded up).
        let mut s = s.clone();
        s.decode.replicas = 3;
        let scaled = scale(&s, &Asked { prefill: by("kubectl", 1), decode: None });
        assert_eq!((scaled.prefill, scaled.decode), (2, 3));
    }

    #[test]
    fn with_both_or_neither_role_asked_on_its_own_decode_follows_prefill() {
        let mut s = spec(3, (1, 1));
        s.scaling.ratio = Some(RatioBand { min: 1.5, max: 3.0 });
        let scaled = scale(&s, &Asked::default());
        // 3 prefill: decode within [4.5, 9] → 5.
        assert_eq!((scaled.prefill, scaled.decode), (3, 5));
        let scaled = scale(&s, &Asked { prefill: by("a", 2), decode: by("b", 20) });
        assert_eq!((scaled.prefill, scaled.decode), (2, 6));
        assert_eq!(scaled.limited.len(), 1);
    }

    #[test]
    fn role_bounds_win_over_the_band_when_both_cannot_hold() {
        let mut s = spec(1, (4, 1));
        s.scaling.ratio = Some(RatioBand { min: 1.0, max: 1.0 });
        s.scaling.decode.max_replicas = Some(2);
        let scaled = scale(&s, &Asked::default());
        assert_eq!((scaled.prefill, scaled.decode), (4, 2));
        assert_eq!(scaled.limited(Role::Decode).unwrap().bound, Bound::RatioMin);
    }

    #[test]
    fn a_band_the_role_bounds_keep_a_count_out_of_is_reported_even_at_the_ask() {
        // 10 prefill need 5 decode under a 0.45 band; decode may run at most 4 and was asked 4.
        let mut s = spec(10, (1, 1));
        s.scaling.ratio = Some(RatioBand { min: 0.45, max: 0.45 });
        s.scaling.decode.max_replicas = Some(4);
        let scaled = scale(&s, &Asked { decode: by("kubectl", 4), prefill: by("hpa", 10) });
        assert_eq!((scaled.prefill, scaled.decode), (10, 4));
        assert_eq!(scaled.limited(Role::Decode).map(|l| l.bound), Some(Bound::RatioMin));
    }

    #[test]
    fn validate_refuses_an_empty_band_and_crossed_bounds_naming_the_field() {
        let mut s = spec(1, (1, 1));
        s.scaling.ratio = Some(RatioBand { min: 3.0, max: 1.0 });
        s.scaling.prefill.max_replicas = Some(0);
        let errors: Vec<_> = crate::validate::validate("x", &s, None)
            .into_iter()
            .filter(|f| f.severity == crate::findings::Severity::Error && f.rule.starts_with("scaling-"))
            .map(|f| f.field)
            .collect();
        assert_eq!(errors, ["spec.scaling.ratio.max", "spec.scaling.prefill.maxReplicas"]);
        s.scaling.ratio = Some(RatioBand { min: 0.0, max: 1.0 });
        s.scaling.prefill.max_replicas = None;
        let errors: Vec<_> = crate::validate::validate("x", &s, None).into_iter().filter(|f| f.rule == "scaling-ratio").collect();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].fix.contains("above 0"), "{}", errors[0]);
    }

    #[test]
    fn a_role_target_owned_by_another_manager_asks_and_the_operator_yields_its_replicas() {
        let mut target: PDRole = serde_json::from_value(serde_json::json!({
            "apiVersion": "pd.inference.dev/v1alpha1", "kind": "PDRole",
            "metadata": {"name": "x-decode", "managedFields": [
                {"manager": "pd-operator", "operation": "Apply", "fieldsV1": {"f:spec": {"f:role": {}}}},
                {"manager": "kubectl", "operation": "Update", "subresource": "scale", "fieldsV1": {"f:spec": {"f:replicas": {}}}},
                {"manager": "other", "operation": "Update", "fieldsV1": {"f:metadata": {"f:labels": {}}}}]},
            "spec": {"role": "decode", "replicas": 5}}))
        .unwrap();
        keep_replicas_owners(&mut target.metadata);
        assert_eq!(target.metadata.managed_fields.as_ref().map(Vec::len), Some(1), "only who owns spec.replicas stays");
        let ask = ask_of(&target, "pd-operator").unwrap();
        assert_eq!(ask, Ask { count: 5, source: Source::Role { manager: "kubectl".into() } });
        let s = spec(2, (1, 1));
        let scaled = scale(&s, &Asked { decode: Some(ask), prefill: None });
        let mut targets =
            vec![target.clone(), PDRole { spec: pd_api::PDRoleSpec { role: Role::Prefill, replicas: None }, ..target.clone() }];
        yield_replicas(&mut targets, &scaled);
        assert_eq!(targets[0].spec.replicas, None, "the operator does not assert a count another manager owns");
        assert_eq!(targets[1].spec.replicas, Some(2), "it asserts the PDDeployment's ask where it drives the role");
        // Owned by the operator itself: no ask.
        target.metadata.managed_fields.as_mut().unwrap()[0].manager = Some("pd-operator".into());
        assert_eq!(ask_of(&target, "pd-operator"), None);
        let status = role_status(&scaled, Role::Decode, 4, "sel".into());
        assert_eq!((status.replicas, status.target_replicas, status.replicas_owner.as_str()), (4, 5, "kubectl"));
    }

    #[test]
    fn the_event_fires_when_a_clamp_starts_or_changes_not_again() {
        let with = |status: &str, message: &str| PDDeploymentStatus {
            conditions: vec![
                serde_json::from_value(serde_json::json!({"type": SCALING_LIMITED, "status": status, "message": message,
                    "reason": "R", "lastTransitionTime": "2026-01-01T00:00:00Z"}))
                .unwrap(),
            ],
            ..Default::default()
        };
        assert_eq!(limited_transition(None, &with("True", "a")).as_deref(), Some("a"));
        assert_eq!(limited_transition(Some(&with("True", "a")), &with("True", "a")), None);
        assert_eq!(limited_transition(Some(&with("True", "a")), &with("True", "b")).as_deref(), Some("b"));
        assert_eq!(limited_transition(Some(&with("True", "a")), &with("False", "ok")), None);
        assert_eq!(limited_transition(Some(&with("False", "ok")), &with("True", "a")).as_deref(), Some("a"));
    }

    #[test]
    fn the_effective_spec_runs_each_decided_count_in_one_unit() {
        let s = spec(2, (1, 3));
        let scaled = scale(&s, &Asked { decode: by("kubectl", 5), ..Asked::default() });
        let e = scaled.apply_to(&s);
        assert_eq!((e.instances(Role::Prefill), e.instances(Role::Decode)), (2, 5));
        assert_eq!(scaled.per_unit, (1, 3));
    }
}
