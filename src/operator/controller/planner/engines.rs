//! The planner's own scrape, for `spec.autoscaling` without a Prometheus: the `/metrics` of every
//! Ready engine leader of the PDDeployment (from the pod cache, no LIST), fetched side by side over
//! plain HTTP on the engines' HTTP port, one sample a pass kept in memory per PDDeployment
//! (`Context::scrapes`); the figures are `pd_core::planner::scrape`'s. Every leader must answer:
//! a pass with a silent engine changes nothing (the planner never scales on missing data).

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use pd_api::{AutoscalingSpec, DEFAULT_HTTP_PORT, Observed, Role};
use pd_core::plan::ObservedPod;
use pd_core::planner::scrape::{self, METRICS_PATH, PodMetrics, Sample};
use pd_runtime::http_client::{self, HttpError};
use thiserror::Error;

use crate::controller::Context;

/// How long one engine's `/metrics` may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// The most of an exposition read (SGLang's is tens of KiB per rank).
const MAX_EXPOSITION: usize = 16 << 20;
/// A PDDeployment not scraped for this long (deleted, or its planner turned off) is forgotten.
const HISTORY_MEMORY: SignedDuration = SignedDuration::from_mins(30);

#[derive(Debug, Error)]
pub enum ScrapeError {
    #[error("engine pod {pod}: {source}")]
    Http { pod: String, source: HttpError },
    #[error(
        "engine pod {pod} answered HTTP {status} on {METRICS_PATH} (SGLang serves its metrics only with --enable-metrics: add it to both roles' template.extraArgs)"
    )]
    Status { pod: String, status: u16 },
    #[error("engine pod {pod}, {METRICS_PATH}: {source}")]
    Text { pod: String, source: scrape::ScrapeError },
}

/// One engine leader to scrape.
struct Target {
    role: Role,
    pod: String,
    addr: String,
}

/// Both roles' figures from this pass's scrape and the earlier ones within the window.
pub(super) async fn observe(
    ctx: &Context,
    auto: &AutoscalingSpec,
    (ns, name, uid): (&str, &str, &str),
) -> Result<(Observed, Observed), ScrapeError> {
    let targets: Vec<Target> = ctx.stores.pods.labelled(ns, name).iter().filter_map(|p| target(p)).collect();
    let at = Timestamp::now();
    let answers = futures::future::join_all(targets.iter().map(fetch)).await;
    let mut pods = BTreeMap::new();
    for (t, answer) in targets.into_iter().zip(answers) {
        pods.insert((t.role, t.pod), answer?);
    }
    let window = SignedDuration::from_secs(i64::from(auto.metrics_window_seconds));
    let mut histories = ctx.scrapes.lock().unwrap_or_else(|p| p.into_inner());
    histories.retain(|_, h| h.latest().is_some_and(|l| at.duration_since(l) < HISTORY_MEMORY));
    let history = histories.entry(format!("{ns}/{name}/{uid}")).or_default();
    history.push(Sample { at, pods }, window);
    Ok(history.observed(window))
}

/// Each role's Ready instances: its Ready, not terminating engine leaders in the pod cache.
pub(super) fn ready_instances(ctx: &Context, ns: &str, name: &str) -> (u32, u32) {
    let mut counts = (0, 0);
    for o in ctx.stores.pods.labelled(ns, name).iter().filter_map(|p| ready_leader(p)) {
        match o.role {
            Role::Prefill => counts.0 += 1,
            Role::Decode => counts.1 += 1,
        }
    }
    counts
}

/// A Ready, not terminating engine leader (node rank 0).
fn ready_leader(pod: &Pod) -> Option<ObservedPod> {
    ObservedPod::from_pod(pod).filter(|o| o.node == 0 && o.ready && !o.deleting)
}

/// A pod worth scraping: a ready engine leader with an address; its `http` port is the rendered
/// `DEFAULT_HTTP_PORT` (the cache keeps no pod spec).
fn target(pod: &Pod) -> Option<Target> {
    let o = ready_leader(pod)?;
    let ip = pod.status.as_ref()?.pod_ip.as_deref()?;
    Some(Target { role: o.role, pod: o.name, addr: http_client::host_port(ip, DEFAULT_HTTP_PORT) })
}

async fn fetch(t: &Target) -> Result<PodMetrics, ScrapeError> {
    let r = http_client::send(hyper::Method::GET, &t.addr, METRICS_PATH, None, SCRAPE_TIMEOUT, MAX_EXPOSITION)
        .await
        .map_err(|source| ScrapeError::Http { pod: t.pod.clone(), source })?;
    if r.status != 200 {
        return Err(ScrapeError::Status { pod: t.pod.clone(), status: r.status });
    }
    scrape::parse(&r.text()).map_err(|source| ScrapeError::Text { pod: t.pod.clone(), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pd_api::labels::{LABEL_INSTANCE, LABEL_NODE_RANK, LABEL_ROLE};

    fn pod(role: &str, rank: &str, ready: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("m-{role}-0-{rank}"), "namespace": "ns",
                "labels": {"pd.inference.dev/deployment": "m", LABEL_ROLE: role, LABEL_INSTANCE: "0", LABEL_NODE_RANK: rank}},
            "spec": {"containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 30000}]}]},
            "status": {"phase": "Running", "podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": ready}]},
        }))
        .unwrap()
    }

    #[test]
    fn the_ready_leaders_of_the_pod_cache_are_scraped_at_their_address() {
        let mut leader = pod("decode", "0", "True");
        crate::controller::slim::slim_pod(&mut leader);
        let t = target(&leader).expect("a Ready leader, as the cache keeps it, is a target");
        assert_eq!((t.role, t.pod.as_str(), t.addr.as_str()), (Role::Decode, "m-decode-0-0", "10.1.2.3:30000"));
        assert!(target(&pod("prefill", "1", "True")).is_none(), "a worker node of a multi-node instance serves no HTTP");
        assert!(target(&pod("prefill", "0", "False")).is_none(), "not Ready");
        let mut going = pod("prefill", "0", "True");
        going.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
        assert!(target(&going).is_none(), "terminating");
        let mut router = pod("router", "0", "True");
        router.metadata.labels.as_mut().unwrap().remove(LABEL_NODE_RANK);
        assert!(target(&router).is_none());
    }
}
