//! Writing a PDDeployment's status, and when: a change that matters is written at once, progress
//! alone is paced so that hundreds of PDDeployments converging together do not take the
//! apiserver's capacity, and each write is remembered, since the cache shows it only later.

use std::time::{Duration, Instant};

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};

use pd_api::PDDeployment;
use pd_api::conditions::HasStatus;
use pd_core::status;

use super::{Context, Error, FIELD_MANAGER};

/// How long this process remembers its own status writes: by then the cache has caught up.
pub(super) const STATUS_MEMORY: Duration = Duration::from_secs(300);
/// Progress-only status changes (counts, messages) are written at most this often per
/// PDDeployment: pods of a new PDDeployment turn ready one by one, and each would be a write.
const STATUS_MIN_INTERVAL: Duration = Duration::from_secs(2);
const STATUS_MAX_INTERVAL: Duration = Duration::from_secs(10);
const STATUS_PER_BUSY_OBJECT: Duration = Duration::from_millis(20);

/// How long a progress-only status change should wait before it is written; `None`: write now.
pub(super) fn status_delay(
    ctx: &Context,
    key: &str,
    previous: Option<&pd_api::PDDeploymentStatus>,
    next: &pd_api::PDDeploymentStatus,
) -> Option<Duration> {
    let previous = previous?;
    if previous == next {
        return None;
    }
    if urgent(previous, next) {
        return None;
    }
    let written = ctx.status_written.lock().unwrap_or_else(|p| p.into_inner());
    let last = written.get(key)?.0;
    let busy = written.values().filter(|(at, _)| at.elapsed() < STATUS_MAX_INTERVAL).count();
    progress_interval(busy).checked_sub(last.elapsed()).filter(|d| !d.is_zero())
}

/// Whether a status change must be written at once rather than coalesced with the progress
/// writes: a new generation or KV set, the engine dry run's progress or verdict, a recreation
/// counted (or its window closed), a rank map entry changed or gone, anything turning bad,
/// Ready turning True, or a rollout completing. Good news on the way (one role available, the
/// other still starting, one more decode's rank map) waits: the last of it comes with Ready.
fn urgent(previous: &pd_api::PDDeploymentStatus, next: &pd_api::PDDeploymentStatus) -> bool {
    if previous.observed_generation != next.observed_generation || previous.kv_set != next.kv_set {
        return true;
    }
    // The dry run's verdict is the gate's memory: a pass that reads it deletes the dry-run pod, so
    // a verdict not written at once would send the next pass to run the dry run again.
    if previous.engine_verification != next.engine_verification {
        return true;
    }
    // The recreations counted are the recovery budget's memory: one not written would be
    // counted again by no one, and a restarted controller would find the budget unspent.
    if previous.recoveries != next.recoveries {
        return true;
    }
    if previous.rank_map.iter().any(|m| !next.rank_map.contains(m)) {
        return true;
    }
    next.conditions.iter().any(|c| {
        let before = previous.conditions.iter().find(|p| p.type_ == c.type_).map(|p| p.status.as_str());
        if before == Some(c.status.as_str()) {
            return false;
        }
        match c.type_.as_str() {
            status::DEGRADED => c.is_true(),
            status::PROGRESSING => c.is_false(),
            status::READY => true,
            // A clamp, or the end of one, is news to whoever scaled.
            pd_core::scaling::SCALING_LIMITED => true,
            _ => !c.is_true(),
        }
    })
}

/// The least time between two progress-only status writes of one PDDeployment, growing with the
/// number of PDDeployments whose status changed lately: when hundreds converge at once, their
/// "3 of 4 ready" messages would otherwise take the apiserver's capacity from the pods themselves.
fn progress_interval(busy: usize) -> Duration {
    (STATUS_PER_BUSY_OBJECT * u32::try_from(busy).unwrap_or(u32::MAX)).clamp(STATUS_MIN_INTERVAL, STATUS_MAX_INTERVAL)
}

/// Writes `status` to PDDeployment `ns/name` unless it is the one this process knows already
/// (`known`), and remembers it under `key` (`ns/name/uid`) for `STATUS_MEMORY`.
pub(super) async fn write_status(
    ctx: &Context,
    key: &str,
    known: Option<&pd_api::PDDeploymentStatus>,
    ns: &str,
    name: &str,
    status: pd_api::PDDeploymentStatus,
) -> Result<(), Error> {
    if known == Some(&status) {
        return Ok(());
    }
    let api: Api<PDDeployment> = Api::namespaced(ctx.client.clone(), ns);
    let body = serde_json::json!({"apiVersion": PDDeployment::api_version(&()), "kind": PDDeployment::kind(&()), "status": status});
    ctx.metrics.write("apply", "pddeployments/status");
    api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await?;
    let mut written = ctx.status_written.lock().unwrap_or_else(|p| p.into_inner());
    // Entries of deleted or long-idle PDDeployments go; by then the cache has caught up.
    written.retain(|_, (at, _)| at.elapsed() < STATUS_MEMORY);
    written.insert(key.to_owned(), (Instant::now(), status));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_conditions(generation: i64, conditions: &[(&str, &str)]) -> pd_api::PDDeploymentStatus {
        let conditions = conditions
            .iter()
            .map(|(type_, status)| k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: (*type_).into(),
                status: (*status).into(),
                reason: "R".into(),
                message: String::new(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
                observed_generation: Some(generation),
            })
            .collect();
        pd_api::PDDeploymentStatus { observed_generation: Some(generation), conditions, ..Default::default() }
    }

    #[test]
    fn good_news_on_the_way_waits_but_bad_news_and_completion_do_not() {
        use status::{DECODE_AVAILABLE, DEGRADED, PREFILL_AVAILABLE, PROGRESSING, READY};
        let starting = with_conditions(
            1,
            &[(PREFILL_AVAILABLE, "False"), (DECODE_AVAILABLE, "False"), (PROGRESSING, "True"), (DEGRADED, "False"), (READY, "False")],
        );
        let prefill_up = with_conditions(
            1,
            &[(PREFILL_AVAILABLE, "True"), (DECODE_AVAILABLE, "False"), (PROGRESSING, "True"), (DEGRADED, "False"), (READY, "False")],
        );
        let complete = with_conditions(
            1,
            &[(PREFILL_AVAILABLE, "True"), (DECODE_AVAILABLE, "True"), (PROGRESSING, "False"), (DEGRADED, "False"), (READY, "False")],
        );
        let ready = with_conditions(
            1,
            &[(PREFILL_AVAILABLE, "True"), (DECODE_AVAILABLE, "True"), (PROGRESSING, "False"), (DEGRADED, "False"), (READY, "True")],
        );
        let degraded = with_conditions(
            1,
            &[(PREFILL_AVAILABLE, "True"), (DECODE_AVAILABLE, "True"), (PROGRESSING, "True"), (DEGRADED, "True"), (READY, "True")],
        );
        assert!(!urgent(&starting, &prefill_up), "one role available mid-rollout can wait");
        assert!(!urgent(&starting, &starting), "nothing changed");
        assert!(urgent(&prefill_up, &complete), "a finished rollout is written at once");
        assert!(urgent(&complete, &ready), "Ready turning True is written at once");
        assert!(urgent(&ready, &degraded), "Degraded turning True is written at once");
        assert!(urgent(&prefill_up, &starting), "a role becoming unavailable is written at once");
        assert!(urgent(&ready, &with_conditions(2, &[])), "a new generation is written at once");
        let mut mapped = ready.clone();
        mapped.rank_map = vec![Default::default()];
        assert!(!urgent(&ready, &mapped), "one more decode's rank map can wait");
        let mut remapped = mapped.clone();
        remapped.rank_map[0].decode_instance = 1;
        assert!(urgent(&mapped, &remapped), "a changed rank map is written at once");
        assert!(urgent(&mapped, &ready), "a rank map that lost an entry is written at once");
    }

    #[test]
    fn progress_writes_space_out_as_more_objects_converge_at_once() {
        assert_eq!(progress_interval(0), STATUS_MIN_INTERVAL);
        assert_eq!(progress_interval(100), STATUS_MIN_INTERVAL);
        assert_eq!(progress_interval(250), Duration::from_secs(5));
        assert_eq!(progress_interval(500), STATUS_MAX_INTERVAL);
        assert_eq!(progress_interval(usize::MAX), STATUS_MAX_INTERVAL);
    }
}
