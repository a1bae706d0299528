//! Leader election on a `coordination.k8s.io` Lease, so two replicas can run safely: only the
//! holder reconciles; a holder that cannot renew steps down (the process exits and restarts).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum LeaderError {
    #[error("lease {0}: {1}")]
    Api(String, #[source] kube::Error),
    #[error("lost the lease {0} to {1}")]
    Lost(String, String),
}

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

impl LeaderElector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str, duration: Duration) -> Self {
        Self { api: Api::namespaced(client, namespace), name: name.into(), identity: identity.into(), duration }
    }

    fn expired(&self, spec: &LeaseSpec) -> bool {
        let (Some(renew), Some(secs)) = (spec.renew_time.as_ref(), spec.lease_duration_seconds) else { return true };
        let age = jiff::Timestamp::now().duration_since(renew.0);
        age.as_secs() > i64::from(secs)
    }

    /// One attempt to take or renew the lease; Ok(true) while this replica holds it.
    pub async fn try_acquire(&self) -> Result<bool, LeaderError> {
        let err = |e| LeaderError::Api(self.name.clone(), e);
        let spec = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs() as i32),
            renew_time: Some(now()),
            ..Default::default()
        };
        match self.api.get_opt(&self.name).await.map_err(err)? {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
                    spec: Some(LeaseSpec { acquire_time: Some(now()), lease_transitions: Some(0), ..spec }),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(err(e)),
                }
            }
            Some(mut lease) => {
                let current = lease.spec.clone().unwrap_or_default();
                let mine = current.holder_identity.as_deref() == Some(self.identity.as_str());
                if !mine && !self.expired(&current) {
                    return Ok(false);
                }
                let transitions = current.lease_transitions.unwrap_or(0) + i32::from(!mine);
                let acquire_time = if mine { current.acquire_time.clone() } else { Some(now()) };
                lease.spec = Some(LeaseSpec { acquire_time, lease_transitions: Some(transitions), ..spec });
                // resourceVersion in the body makes this a compare-and-swap.
                match self.api.replace(&lease.name_any(), &PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(err(e)),
                }
            }
        }
    }

    /// Waits until this replica holds the lease. Errors are retried: a replica that holds
    /// nothing has nothing to lose, and on a fresh node the API Service may not route yet (the
    /// kind tier saw both replicas exit on their first attempt before kube-proxy was ready).
    pub async fn acquire(&self) -> Result<(), LeaderError> {
        loop {
            match self.try_acquire().await {
                Ok(true) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "became leader");
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "taking the leader lease failed; retrying"),
            }
            tokio::time::sleep(self.duration / 3).await;
        }
    }

    /// Renews until it fails; returns why leadership ended.
    pub async fn hold(&self) -> LeaderError {
        let mut failures = 0;
        loop {
            tokio::time::sleep(self.duration / 3).await;
            match self.try_acquire().await {
                Ok(true) => failures = 0,
                Ok(false) => return LeaderError::Lost(self.name.clone(), "another replica".into()),
                Err(e) => {
                    failures += 1;
                    tracing::warn!(error = %e, "renewing the leader lease failed");
                    if failures >= 2 {
                        return e;
                    }
                }
            }
        }
    }
}
