//! Which optional APIs the cluster serves, asked once at start: the answers change only with the
//! cluster, and the reconciler and the webhook must judge a spec by the same answer.

use kube::Client;
use tracing::{info, warn};

use super::watches::{WATCH_RETRY_MAX, WATCH_RETRY_MIN};

/// Whether the cluster serves Kubernetes' gang scheduling API (PodGroup in
/// `scheduling.k8s.io/v1beta1`). Asked once at start, since it changes only with the cluster, and
/// shared by the reconciler and the webhook, so both judge `placement.gang` by one answer. An
/// apiserver that does not answer is asked again until it does; one that refuses to say counts
/// as not serving it: `gang: workload` is then refused, not rendered against an absent API.
pub(super) async fn serves_pod_groups(client: &Client) -> bool {
    use backon::Retryable;
    let ask = || client.list_api_group_resources("scheduling.k8s.io/v1beta1");
    // An answer: the group version's resources, or a 4xx (404: not served) other than 429.
    let unanswered = |e: &kube::Error| !matches!(e, kube::Error::Api(s) if s.code < 500 && s.code != 429);
    let retry = backon::ExponentialBuilder::default().with_min_delay(WATCH_RETRY_MIN).with_max_delay(WATCH_RETRY_MAX).without_max_times();
    let asked = ask.retry(retry).when(unanswered).notify(|e, delay| {
        warn!(error = %e, retry_in = ?delay, "cannot ask the apiserver whether it serves gang scheduling (scheduling.k8s.io/v1beta1); retrying")
    });
    match asked.await {
        Ok(list) if list.resources.iter().any(|r| r.name == "podgroups") => true,
        answer => {
            let why = answer.map_or_else(|e| e.to_string(), |_| "the group version lists no podgroups".into());
            info!(
                why,
                "no Kubernetes gang scheduling API (scheduling.k8s.io/v1beta1 PodGroup): placement.gang auto means none, workload is refused"
            );
            false
        }
    }
}
