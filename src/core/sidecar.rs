//! Pure: which running decode pod gets the operator's new handshake sidecar next
//! (`rollout.sidecarUpdate: InPlace`).
//!
//! The sidecar belongs to the operator, not to the engine: an operator upgrade changes the
//! sidecar container's image on running decode pods, which is the one change Kubernetes allows on
//! a running pod's containers. The kubelet restarts that container alone; the engine keeps
//! running. One pod at a time: the next only once the last one changed has been Ready for
//! `SETTLE` since the change, so a broken sidecar image stops at the first pod.

use std::time::Duration;

use crate::plan::ObservedPod;
use pd_api::{Role, SidecarUpdate};

/// How long a pod whose sidecar was just changed must stay Ready before the next is changed:
/// longer than a kubelet's sync and a crash-looping sidecar's first restart.
pub const SETTLE: Duration = Duration::from_secs(10);

/// The next in-place sidecar change, or when to look again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// The decode pod whose sidecar image changes now.
    pub pod: Option<String>,
    /// The image it runs today.
    pub from: Option<String>,
    /// When a pass may change the next one (a recent change is settling).
    pub wake_in: Option<Duration>,
    /// Running decode pods whose sidecar differs and will not change in place (probed pods, or
    /// `OnRollout`): they get the new sidecar when their role next rolls.
    pub left: usize,
}

/// The next step towards every running decode pod running sidecar `image`.
pub fn next(observed: &[ObservedPod], image: &str, policy: SidecarUpdate, now: jiff::Timestamp) -> Step {
    let live = || observed.iter().filter(|p| p.role == Role::Decode && !p.deleting && p.phase == crate::pod::Phase::Running);
    let outdated = |p: &&ObservedPod| p.sidecar_image.as_deref().is_some_and(|i| i != image);
    let movable = |p: &&ObservedPod| policy == SidecarUpdate::InPlace && !p.sidecar_probed;
    let left = live().filter(outdated).filter(|p| !movable(p)).count();
    let mut step = Step { left, ..Step::default() };
    // A pod changed recently must have settled: Ready, for SETTLE since its change.
    for p in live().filter(|p| p.sidecar_image.as_deref() == Some(image)) {
        let Some(at) = p.sidecar_updated_at else { continue };
        if !p.ready {
            return step;
        }
        let since = now.duration_since(at).unsigned_abs();
        if since < SETTLE {
            step.wake_in = Some(SETTLE - since);
            return step;
        }
    }
    if let Some(p) = live().filter(outdated).find(movable) {
        step.pod = Some(p.name.clone());
        step.from.clone_from(&p.sidecar_image);
    }
    step
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW: &str = "pd-operator:0.2.0";

    fn decode(i: u32, image: &str) -> ObservedPod {
        ObservedPod { sidecar_image: Some(image.into()), ..ObservedPod::running(Role::Decode, i, 0, "r") }
    }

    fn now() -> jiff::Timestamp {
        "2026-12-03T10:00:00Z".parse().unwrap()
    }

    #[test]
    fn one_outdated_pod_at_a_time_and_the_next_only_after_the_last_settled() {
        let mut pods = vec![decode(0, "pd-operator:0.1.0"), decode(1, "pd-operator:0.1.0")];
        let step = next(&pods, NEW, SidecarUpdate::InPlace, now());
        assert_eq!((step.pod.as_deref(), step.from.as_deref(), step.left), (Some("decode-0-0"), Some("pd-operator:0.1.0"), 0));
        // Changed 4 s ago: the next waits the rest of SETTLE.
        pods[0].sidecar_image = Some(NEW.into());
        pods[0].sidecar_updated_at = Some(now() - jiff::SignedDuration::from_secs(4));
        let step = next(&pods, NEW, SidecarUpdate::InPlace, now());
        assert_eq!((step.pod, step.wake_in), (None, Some(Duration::from_secs(6))));
        // Not Ready after its change (a broken sidecar): nothing more moves, until it is.
        pods[0].ready = false;
        let later = now() + jiff::SignedDuration::from_secs(60);
        assert_eq!(next(&pods, NEW, SidecarUpdate::InPlace, later), Step::default());
        pods[0].ready = true;
        assert_eq!(next(&pods, NEW, SidecarUpdate::InPlace, later).pod.as_deref(), Some("decode-1-0"));
    }

    #[test]
    fn probed_pods_prefills_leaving_pods_and_on_rollout_are_left_to_the_next_rollout() {
        let mut probed = decode(0, "pd-operator:0.1.0");
        probed.sidecar_probed = true;
        let mut leaving = decode(1, "pd-operator:0.1.0");
        leaving.deleting = true;
        let prefill = ObservedPod { sidecar_image: None, ..ObservedPod::running(Role::Prefill, 0, 0, "r") };
        let pods = vec![probed, leaving, prefill, decode(2, NEW)];
        assert_eq!(next(&pods, NEW, SidecarUpdate::InPlace, now()), Step { left: 1, ..Step::default() });
        let pods = vec![decode(0, "pd-operator:0.1.0")];
        assert_eq!(next(&pods, NEW, SidecarUpdate::OnRollout, now()), Step { left: 1, ..Step::default() });
        assert_eq!(next(&pods, "pd-operator:0.1.0", SidecarUpdate::InPlace, now()), Step::default(), "nothing to do");
    }
}
