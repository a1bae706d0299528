use super::*;
use pd_api::RatioBand;
use proptest::prelude::*;

fn spec() -> PDDeploymentSpec {
    serde_norway::from_str("model: {path: Qwen/Qwen3-8B}\nprefill: {replicas: 1}\ndecode: {replicas: 1}\n").unwrap()
}

fn auto() -> AutoscalingSpec {
    serde_norway::from_str(
        "mode: Recommend\nprometheus: {url: 'http://p:9090'}\nslo: {ttftP90Seconds: 1.0, itlP90Seconds: 0.05}\n\
         load: {queuePerInstance: 4}\ncooldownSeconds: 300\nstabilizationWindowSeconds: 120\n",
    )
    .unwrap()
}

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn input(current: u32, observed: Observed) -> RoleInput {
    RoleInput { current, observed, low_since: None, last_scale: None, ready: current }
}

fn prefill_at(ttft: f64, queued: f64) -> Observed {
    Observed { ttft_p90_seconds: Some(ttft), queued_requests: Some(queued), ..Observed::default() }
}

fn decode_at(itl: f64, kv: f64) -> Observed {
    Observed { itl_p90_seconds: Some(itl), kv_usage: Some(kv), ..Observed::default() }
}

#[test]
fn prefill_scales_up_in_proportion_to_ttft_over_its_objective_at_most_doubling() {
    let d = decide_role(Role::Prefill, &auto(), &input(2, prefill_at(1.5, 0.0)), t(0));
    assert_eq!((d.direction, d.wanted), (Direction::Up, 3), "{}", d.reason);
    assert!(d.reason.contains("TTFT p90 (s) 1.500"), "{}", d.reason);
    let d = decide_role(Role::Prefill, &auto(), &input(2, prefill_at(9.0, 0.0)), t(0));
    assert_eq!(d.wanted, 4, "at most doubling a pass");
}

#[test]
fn prefill_follows_its_queue_per_instance_and_decode_its_kv_usage() {
    // 3 instances, 30 queued: 10 per instance against 4 → 2.5 × 3 = 8, capped at 6.
    let d = decide_role(Role::Prefill, &auto(), &input(3, prefill_at(0.2, 30.0)), t(0));
    assert_eq!((d.direction, d.wanted), (Direction::Up, 6), "{}", d.reason);
    let d = decide_role(Role::Decode, &auto(), &input(2, decode_at(0.01, 0.95)), t(0));
    assert_eq!((d.direction, d.wanted), (Direction::Up, 3), "{}", d.reason);
    assert!(d.reason.contains("KV usage 0.950"), "{}", d.reason);
    // ITL within its objective and KV between the thresholds: hold.
    let d = decide_role(Role::Decode, &auto(), &input(2, decode_at(0.04, 0.5)), t(0));
    assert_eq!(d.direction, Direction::Hold);
    assert_eq!(d.low_since, None);
}

#[test]
fn decode_leads_on_running_requests_per_instance_when_asked_to() {
    let mut a = auto();
    let busy = Observed { running_requests: Some(40.0), ..decode_at(0.02, 0.1) };
    // Unset: running requests are no signal; ITL is within its objective.
    assert_eq!(decide_role(Role::Decode, &a, &input(2, busy.clone()), t(0)).direction, Direction::Hold);
    // 40 running on 2 instances against 16 per instance: 1.25 × 2 → 3, before ITL breaks.
    a.load.running_per_instance = Some(16.0);
    let d = decide_role(Role::Decode, &a, &input(2, busy), t(0));
    assert_eq!((d.direction, d.wanted), (Direction::Up, 3), "{}", d.reason);
    assert!(d.reason.contains("running requests per instance 20.000 (up above 16.000"), "{}", d.reason);
    // Few running: low load as far as this signal goes.
    let quiet = Observed { running_requests: Some(4.0), ..decode_at(0.01, 0.1) };
    assert_eq!(decide_role(Role::Decode, &a, &input(2, quiet), t(0)).low_since, Some(t(0)));
}

#[test]
fn with_no_figure_a_role_holds_and_says_why() {
    let d = decide_role(Role::Decode, &auto(), &input(4, Observed::default()), t(0));
    assert_eq!((d.direction, d.wanted), (Direction::Hold, 4));
    assert!(d.reason.contains("missing data"), "{}", d.reason);
    // A figure with no objective is no signal either (prefill's ITL).
    let only_itl = Observed { itl_p90_seconds: Some(9.0), ..Observed::default() };
    assert_eq!(decide_role(Role::Prefill, &auto(), &input(4, only_itl), t(0)).direction, Direction::Hold);
}

#[test]
fn scale_down_waits_for_the_stabilisation_window_then_the_cooldown_one_at_a_time() {
    let a = auto();
    let low = || prefill_at(0.1, 0.0);
    let d = decide_role(Role::Prefill, &a, &input(3, low()), t(0));
    assert_eq!((d.direction, d.low_since), (Direction::Hold, Some(t(0))), "{}", d.reason);
    assert!(d.reason.contains("120s of the stabilisation window left"), "{}", d.reason);
    let next = RoleInput { low_since: d.low_since, ..input(3, low()) };
    assert_eq!(decide_role(Role::Prefill, &a, &next, t(119)).direction, Direction::Hold);
    let d = decide_role(Role::Prefill, &a, &next, t(120));
    assert_eq!((d.direction, d.wanted), (Direction::Down, 2), "{}", d.reason);
    // Scaled 100 s ago: the cooldown (300 s) holds it.
    let cooling = RoleInput { last_scale: Some(t(20)), ..next.clone() };
    let d = decide_role(Role::Prefill, &a, &cooling, t(120));
    assert_eq!(d.direction, Direction::Hold);
    assert!(d.reason.contains("cooling down"), "{}", d.reason);
    // One pass above the low mark breaks the window.
    let busy = RoleInput { low_since: Some(t(0)), ..input(3, prefill_at(0.7, 0.0)) };
    assert_eq!(decide_role(Role::Prefill, &a, &busy, t(500)).low_since, None);
    // Scale-up does not wait for the cooldown.
    let hot = RoleInput { last_scale: Some(t(400)), ..input(3, prefill_at(2.0, 0.0)) };
    assert_eq!(decide_role(Role::Prefill, &a, &hot, t(500)).direction, Direction::Up);
}

#[test]
fn a_second_scale_up_waits_until_the_last_landed_and_the_window_moved_past_it() {
    let a = auto(); // metricsWindowSeconds: 60 (the default)
    let hot = |ready, last| RoleInput { ready, last_scale: Some(t(last)), ..input(2, prefill_at(3.0, 0.0)) };
    // Scaled 1 → 2 ten seconds ago, the new instance not Ready yet: held.
    let d = decide_role(Role::Prefill, &a, &hot(1, -10), t(0));
    assert_eq!((d.direction, d.wanted), (Direction::Hold, 2), "{}", d.reason);
    assert!(d.reason.starts_with("up held: the last scale (10s ago) has not landed, 1 of 2 instances Ready"), "{}", d.reason);
    // Landed, but the window still holds the queue of one instance: held, and says for how long.
    let d = decide_role(Role::Prefill, &a, &hot(2, -40), t(0));
    assert_eq!(d.direction, Direction::Hold);
    assert!(d.reason.contains("reaches back before the last scale for 20s more"), "{}", d.reason);
    // Past the window: up again.
    assert_eq!(decide_role(Role::Prefill, &a, &hot(2, -60), t(0)).direction, Direction::Up);
    // A scale that never lands (no GPU left) stops holding after LANDING_GRACE.
    let stuck = hot(1, -LANDING_GRACE.as_secs());
    assert_eq!(decide_role(Role::Prefill, &a, &stuck, t(0)).direction, Direction::Up);
    // A role the planner never scaled is not held.
    assert_eq!(decide_role(Role::Prefill, &a, &input(2, prefill_at(3.0, 0.0)), t(0)).direction, Direction::Up);
}

#[test]
fn the_planner_never_scales_a_role_to_zero() {
    let d = decide_role(Role::Decode, &auto(), &RoleInput { low_since: Some(t(0)), ..input(1, decode_at(0.001, 0.0)) }, t(10_000));
    assert_eq!((d.direction, d.wanted), (Direction::Hold, 1), "{}", d.reason);
}

#[test]
fn the_plan_keeps_each_role_and_the_band_and_says_which_bound_held() {
    let mut s = spec();
    s.scaling.ratio = Some(RatioBand { min: 1.0, max: 2.0 });
    s.scaling.prefill.max_replicas = Some(3);
    // Prefill wants 4 (TTFT twice its objective at 2): capped at 3; decode holds at 2, then the
    // band (decode ≥ prefill) lifts it to 3.
    let r = plan(&s, &auto(), (&input(2, prefill_at(2.0, 0.0)), &input(2, decode_at(0.04, 0.5))), t(0));
    assert_eq!((r.prefill.wanted, r.prefill.recommended, r.decode.recommended), (4, 3, 3), "{}", r.message());
    assert!(r.prefill.reason.contains("spec.scaling.prefill.maxReplicas"), "{}", r.prefill.reason);
    assert_eq!(r.decode.direction, Direction::Up);
    assert!(r.changes());
    assert!(r.message().starts_with("prefill 2 → 3: up: TTFT p90"), "{}", r.message());
    assert_eq!(r.action(), "Plan prefill 2->3, decode 2->3");
}

fn observed() -> impl Strategy<Value = Observed> {
    let figure = || proptest::option::of(0.0f64..20.0);
    (figure(), figure(), figure(), proptest::option::of(0.0f64..1.0)).prop_map(|(ttft, itl, queued, kv)| Observed {
        ttft_p90_seconds: ttft,
        itl_p90_seconds: itl,
        queued_requests: queued,
        running_requests: None,
        kv_usage: kv,
    })
}

proptest! {
    #[test]
    fn recommendations_always_respect_the_role_bounds_and_where_they_allow_the_band(
        current in (0u32..40, 0u32..40),
        obs in (observed(), observed()),
        mins in (0i32..5, 0i32..5),
        spans in (proptest::option::of(0i32..30), proptest::option::of(0i32..30)),
        band in proptest::option::of((0.1f64..4.0, 0.0f64..4.0)),
        low_for in (0i64..1000, 0i64..1000),
    ) {
        let mut s = spec();
        s.scaling.prefill = pd_api::RoleLimits { min_replicas: mins.0, max_replicas: spans.0.map(|x| mins.0 + x) };
        s.scaling.decode = pd_api::RoleLimits { min_replicas: mins.1, max_replicas: spans.1.map(|x| mins.1 + x) };
        s.scaling.ratio = band.map(|(min, extra)| RatioBand { min, max: min + extra });
        let role_input = |c: u32, o: Observed, low: i64| RoleInput { current: c, observed: o, low_since: Some(t(-low)), last_scale: None, ready: c };
        let r = plan(&s, &auto(), (&role_input(current.0, obs.0, low_for.0), &role_input(current.1, obs.1, low_for.1)), t(0));
        for (d, limits) in [(&r.prefill, &s.scaling.prefill), (&r.decode, &s.scaling.decode)] {
            let min = u32::try_from(limits.min_replicas).unwrap();
            prop_assert!(d.recommended >= min, "{} below min {}", d.recommended, min);
            if let Some(max) = limits.max_replicas {
                prop_assert!(d.recommended <= u32::try_from(max).unwrap(), "{} above max {}", d.recommended, max);
            }
            // Never down by more than one a pass, never up by more than doubling (or the bounds).
            prop_assert!(d.wanted + 1 >= d.current);
            prop_assert!(d.wanted <= d.current.max(1) * MAX_STEP_UP);
        }
        // The band holds unless a role's own bounds forbid every count in it (reported then).
        if let Some(b) = s.scaling.ratio {
            let (p, dc) = (f64::from(r.prefill.recommended), f64::from(r.decode.recommended));
            let in_band = p == 0.0 || dc == 0.0 || (dc >= p * b.min - 1e-9 && dc <= p * b.max + 1e-9);
            prop_assert!(in_band || r.decode.reason.contains("bounded") || r.prefill.reason.contains("bounded"),
                "{} : {} outside {:?}: {}", p, dc, b, r.message());
        }
    }
}
