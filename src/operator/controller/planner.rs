//! The planner pass of a PDDeployment with `spec.autoscaling`, at most once per `intervalSeconds`:
//! read SGLang's metrics from Prometheus or, without one, from the engines themselves
//! (`engines`), decide (`pd_core::planner`), write `status.autoscaling` and an Event, and in
//! `Auto` mode move each role's count through its `PDRole`, as `kubectl scale` would (so the
//! ownership rules of docs/scaling.md hold, and a scale-down drains through the reconcile's usual
//! path). A Prometheus or an engine that does not answer changes nothing.
//!
//! Both writes use the planner's own field manager (`pd_core::planner::FIELD_MANAGER`): the
//! status apply of the reconcile never owns `status.autoscaling`, so neither undoes the other.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use tracing::{Instrument, info, info_span, warn};

use pd_api::{AutoscalingSpec, AutoscalingStatus, Observed, PDDeployment, PDRole, Role, RoleRecommendation};
use pd_core::egress::Target;
use pd_core::planner::promql;
use pd_core::planner::{self, Direction, Recommendation, RoleInput};
use pd_core::scaling::{Scaled, Source};
use pd_runtime::prometheus::{Prometheus, PrometheusError};

use super::{Context, Error};

mod engines;

/// How long one query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// Planner passes reading metrics at once, across PDDeployments: a tenant's slow or silent
/// source holds one slot for at most its timeouts, and many of them cannot take the controller's
/// sockets and time (the other passes wait their turn).
const MAX_READS_IN_FLIGHT: usize = 4;
static READS: std::sync::LazyLock<tokio::sync::Semaphore> = std::sync::LazyLock::new(|| tokio::sync::Semaphore::new(MAX_READS_IN_FLIGHT));
/// The status reasons of a pass.
pub const RECOMMENDED: &str = "Recommended";
pub const SCALED: &str = "Scaled";
pub const METRICS_UNAVAILABLE: &str = "MetricsUnavailable";
pub const HELD: &str = "Held";

/// Runs the planner pass when one is due; returns when the next is due (`None`: no planner).
/// Its failures are reported in the status and an Event, never fail the reconcile.
pub(super) async fn pass(ctx: &Context, pdd: &PDDeployment, owner: (&str, &str), scaled: &Scaled) -> Option<Duration> {
    let auto = pdd.spec.autoscaling.as_ref()?;
    let interval = Duration::from_secs(u64::from(auto.interval_seconds));
    let previous = pdd.status.as_ref().and_then(|s| s.autoscaling.clone()).unwrap_or_default();
    let now = jiff::Timestamp::now();
    if let Some(last) = &previous.last_evaluation_time {
        let since = now.duration_since(last.0);
        let left = jiff::SignedDuration::try_from(interval).unwrap_or_default() - since;
        if left.is_positive() {
            return Some(Duration::try_from(left).unwrap_or(interval));
        }
    }
    let source = auto.prometheus.as_ref().map_or("engines", |p| p.url.as_str());
    let span = info_span!("planner", mode = ?auto.mode, source);
    if let Err(e) = run(ctx, pdd, owner, scaled, (auto, previous, now)).instrument(span).await {
        warn!(error = %e, "planner pass failed");
    }
    Some(interval)
}

/// One pass: observe, decide, act, report.
async fn run(
    ctx: &Context,
    pdd: &PDDeployment,
    owner: (&str, &str),
    scaled: &Scaled,
    (auto, previous, now): (&AutoscalingSpec, AutoscalingStatus, jiff::Timestamp),
) -> Result<(), Error> {
    let (ns, name) = owner;
    let uid = pdd.metadata.uid.as_deref().unwrap_or_default();
    let observed = observe(ctx, auto, (ns, name, uid)).await;
    let observed = match observed {
        Ok(o) => o,
        Err(e) => return unavailable(ctx, pdd, owner, previous, &e, now).await,
    };
    let ready = engines::ready_instances(ctx, ns, name);
    let input = |role: Role, o: Observed, p: &RoleRecommendation, ready: u32| RoleInput {
        current: scaled.count(role),
        observed: o,
        low_since: p.low_since.as_ref().map(|t| t.0),
        last_scale: p.last_scale_time.as_ref().map(|t| t.0),
        ready,
    };
    let inputs = (input(Role::Prefill, observed.0, &previous.prefill, ready.0), input(Role::Decode, observed.1, &previous.decode, ready.1));
    let plan = planner::plan(&pdd.spec, auto, (&inputs.0, &inputs.1), now);
    let mut held = Vec::new();
    let mut moved = Vec::new();
    if auto.mode == pd_api::AutoscalingMode::Auto {
        for role in [Role::Prefill, Role::Decode] {
            let d = plan.role(role);
            if d.direction == Direction::Hold {
                continue;
            }
            match &scaled.ask(role).source {
                Source::Role { manager } if manager != planner::FIELD_MANAGER => {
                    held.push(format!("{}: its count is owned by {manager} (PDRole spec.replicas), not changed", role.as_str()));
                }
                source => {
                    scale_role(ctx, ns, name, role, d.recommended, *source == Source::Deployment).await?;
                    moved.push(role);
                }
            }
        }
    }
    let status = status_of(&plan, (&inputs.0, &inputs.1), &previous, &moved, now);
    let status = report(ctx, pdd, auto, status, &plan, &held).await;
    write(ctx, ns, name, &status).await
}

/// Both roles' figures from the spec's Prometheus, if the platform allows its URL (checked
/// before any request), else from the engines; one of `MAX_READS_IN_FLIGHT` slots meanwhile.
async fn observe(ctx: &Context, auto: &AutoscalingSpec, (ns, name, uid): (&str, &str, &str)) -> Result<(Observed, Observed), String> {
    // The semaphore is never closed.
    let _slot = READS.acquire().await.map_err(|e| e.to_string())?;
    match &auto.prometheus {
        Some(p) => {
            ctx.egress.allows(Target::Prometheus, &p.url).map_err(|refused| refused.to_string())?;
            query(&p.url, auto, ns, name).await.map_err(|e| e.to_string())
        }
        None => engines::observe(ctx, auto, (ns, name, uid)).await.map_err(|e| e.to_string()),
    }
}

/// Each role's figures from Prometheus at `url`; `Err` when it does not answer (or refuses a query).
async fn query(url: &str, auto: &AutoscalingSpec, ns: &str, name: &str) -> Result<(Observed, Observed), PrometheusError> {
    let prometheus = Prometheus::new(url)?;
    let mut out = (Observed::default(), Observed::default());
    for (role, observed) in [(Role::Prefill, &mut out.0), (Role::Decode, &mut out.1)] {
        for figure in promql::figures(role) {
            let query = promql::query(*figure, role, ns, name, auto.metrics_window_seconds);
            figure.set(observed, prometheus.value(&query, QUERY_TIMEOUT).await?);
        }
    }
    Ok(out)
}

/// Moves `role`'s count: applies its `PDRole`'s `spec.replicas` under the planner's field manager.
/// Taking the field from the operator (the PDDeployment drove the role) is forced; from anyone
/// else it is not, so an HPA or `kubectl` that took it meanwhile keeps it (409).
async fn scale_role(ctx: &Context, ns: &str, name: &str, role: Role, count: u32, take: bool) -> Result<(), Error> {
    let api: Api<PDRole> = Api::namespaced(ctx.client.clone(), ns);
    let target = pd_api::role_object_name(name, role);
    let body = serde_json::json!({
        "apiVersion": PDRole::api_version(&()), "kind": PDRole::kind(&()),
        "metadata": {"name": target}, "spec": {"replicas": count},
    });
    let mut params = PatchParams::apply(planner::FIELD_MANAGER);
    params.force = take;
    ctx.metrics.write("apply", "pdroles");
    api.patch(&target, &params, &Patch::Apply(&body)).await?;
    info!(role = role.as_str(), count, "planner scaled the role");
    Ok(())
}

fn time(t: jiff::Timestamp) -> Time {
    Time(t)
}

/// `status.autoscaling` of a pass that decided.
fn status_of(
    plan: &Recommendation,
    inputs: (&RoleInput, &RoleInput),
    previous: &AutoscalingStatus,
    moved: &[Role],
    now: jiff::Timestamp,
) -> AutoscalingStatus {
    let role = |role: Role, input: &RoleInput, before: &RoleRecommendation| {
        let d = plan.role(role);
        RoleRecommendation {
            current: i32::try_from(d.current).unwrap_or(i32::MAX),
            recommended: i32::try_from(d.recommended).unwrap_or(i32::MAX),
            reason: d.reason.clone(),
            observed: input.observed.clone(),
            low_since: d.low_since.map(time),
            last_scale_time: if moved.contains(&role) { Some(time(now)) } else { before.last_scale_time.clone() },
        }
    };
    AutoscalingStatus {
        last_evaluation_time: Some(time(now)),
        reason: if moved.is_empty() { RECOMMENDED } else { SCALED }.into(),
        message: plan.message(),
        prefill: role(Role::Prefill, inputs.0, &previous.prefill),
        decode: role(Role::Decode, inputs.1, &previous.decode),
    }
}

/// The Event of a decision (one per pass that recommends a change, with the figures), and the
/// status' reason when an owner held a role.
async fn report(
    ctx: &Context,
    pdd: &PDDeployment,
    auto: &AutoscalingSpec,
    mut status: AutoscalingStatus,
    plan: &Recommendation,
    held: &[String],
) -> AutoscalingStatus {
    if !held.is_empty() {
        status.reason = HELD.into();
        status.message = format!("{}; {}", held.join("; "), status.message);
    }
    if plan.changes() {
        let verb = if auto.mode == pd_api::AutoscalingMode::Auto { SCALED } else { RECOMMENDED };
        let reason = if held.is_empty() { verb } else { HELD };
        ctx.event(pdd, EventType::Normal, reason, &plan.action(), status.message.clone()).await;
    }
    status
}

/// A pass whose metrics did not answer: no change, the status says why (Event on the first).
async fn unavailable(
    ctx: &Context,
    pdd: &PDDeployment,
    (ns, name): (&str, &str),
    previous: AutoscalingStatus,
    why: &str,
    now: jiff::Timestamp,
) -> Result<(), Error> {
    let message = unavailable_message(why);
    if previous.reason != METRICS_UNAVAILABLE {
        ctx.event(pdd, EventType::Warning, METRICS_UNAVAILABLE, "Plan", message.clone()).await;
    }
    let status = AutoscalingStatus {
        last_evaluation_time: Some(time(now)),
        reason: METRICS_UNAVAILABLE.into(),
        message,
        // Nothing observed: a low-load window does not carry over a gap.
        prefill: RoleRecommendation { low_since: None, ..previous.prefill },
        decode: RoleRecommendation { low_since: None, ..previous.decode },
    };
    write(ctx, ns, name, &status).await
}

/// The status message and Event of a pass without figures. `why` is the client's error, whose
/// remote parts are `pd_core::remote` excerpts already (`PrometheusError`, `ScrapeError`).
fn unavailable_message(why: &str) -> String {
    format!("no change: the metrics source did not answer ({why}); the planner never scales on missing data")
}

async fn write(ctx: &Context, ns: &str, name: &str, status: &AutoscalingStatus) -> Result<(), Error> {
    let api: Api<PDDeployment> = Api::namespaced(ctx.client.clone(), ns);
    let body = serde_json::json!({
        "apiVersion": PDDeployment::api_version(&()), "kind": PDDeployment::kind(&()),
        "status": {"autoscaling": status},
    });
    ctx.metrics.write("apply", "pddeployments/status");
    api.patch_status(name, &PatchParams::apply(planner::FIELD_MANAGER).force(), &Patch::Apply(&body)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves `body` as a `200` of `content_type` to every connection, on 127.0.0.1.
    async fn serve(content_type: &'static str, body: &'static str) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut seen = Vec::new();
                let mut buf = [0u8; 1024];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(format!("{head}{body}").as_bytes()).await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn an_internal_page_named_as_prometheus_reaches_the_status_as_a_status_and_a_name_only() {
        let page = "<!doctype html><html><head><title>Jenkins</title></head><body>API_TOKEN=11d2c0ffee0ddba11</body></html>";
        let addr = serve("text/html", page).await;
        let url = format!("http://{addr}");
        let auto: AutoscalingSpec = serde_norway::from_str(&format!("mode: Recommend\nprometheus: {{url: '{url}'}}\n")).unwrap();
        let e = query(&url, &auto, "ns", "x").await.unwrap_err();
        let message = unavailable_message(&e.to_string());
        assert!(message.contains(&format!("Prometheus at {url} answered HTTP 200: an HTML page, not a query result")), "{message}");
        assert!(!message.contains("API_TOKEN") && !message.contains("Jenkins") && !message.contains('<'), "{message}");
        let text = "PGPASSWORD=s3cr3t\u{1b}[2J and then a great deal more configuration that goes on and on and on";
        let addr = serve("text/plain", text).await;
        let e = query(&format!("http://{addr}"), &auto, "ns", "x").await.unwrap_err().to_string();
        let excerpt = e.split("answered HTTP 200: ").nth(1).unwrap().trim_end_matches(", not a query result");
        assert!(excerpt.chars().count() <= pd_core::remote::EXCERPT_CHARS + 1 && !excerpt.contains('\u{1b}'), "{excerpt}");
    }

    #[test]
    fn a_pass_keeps_each_roles_last_scale_unless_it_moved_it_and_carries_the_window() {
        let auto: AutoscalingSpec =
            serde_norway::from_str("mode: Auto\nprometheus: {url: 'http://p'}\nslo: {ttftP90Seconds: 1}\n").unwrap();
        let spec: pd_api::PDDeploymentSpec =
            serde_norway::from_str("model: {path: Qwen/Qwen3-8B}\nprefill: {replicas: 1}\ndecode: {replicas: 2}\n").unwrap();
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let hot =
            RoleInput { current: 1, observed: Observed { ttft_p90_seconds: Some(3.0), ..Observed::default() }, ..RoleInput::default() };
        let idle = RoleInput { current: 2, observed: Observed { kv_usage: Some(0.0), ..Observed::default() }, ..RoleInput::default() };
        let plan = planner::plan(&spec, &auto, (&hot, &idle), now);
        let before = jiff::Timestamp::from_second(1_700_000_000).unwrap();
        let previous = AutoscalingStatus {
            decode: RoleRecommendation { last_scale_time: Some(time(before)), ..RoleRecommendation::default() },
            ..AutoscalingStatus::default()
        };
        let s = status_of(&plan, (&hot, &idle), &previous, &[Role::Prefill], now);
        assert_eq!((s.prefill.current, s.prefill.recommended, s.reason.as_str()), (1, 2, SCALED));
        assert_eq!(s.prefill.last_scale_time, Some(time(now)));
        assert_eq!(s.decode.last_scale_time, Some(time(before)), "decode was not moved");
        assert_eq!(s.decode.low_since, Some(time(now)), "decode's low load starts its window");
        assert_eq!(s.prefill.observed.ttft_p90_seconds, Some(3.0));
        assert!(s.message.starts_with("prefill 1 → 2: up"), "{}", s.message);
    }
}
