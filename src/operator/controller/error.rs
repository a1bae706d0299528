//! The controller's error: what can fail a reconcile, the label each failure is counted under,
//! and what the controller does next (`error_policy`). One type, so every step of a reconcile
//! reports the same way.

use std::sync::Arc;
use std::time::Duration;

use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use thiserror::Error;
use tracing::{info, warn};

use pd_api::PDDeployment;
use pd_core::render::RenderError;
use pd_core::sets;

use super::{Context, metrics};

#[derive(Debug, Error)]
pub(super) enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("render: {0}")]
    Render(#[from] RenderError),
    #[error("{0} has no namespace or name")]
    Unnamed(&'static str),
    #[error("a child cache stopped")]
    CacheClosed,
    #[error("no first list yet from the watches of: {0}")]
    CacheNotReady(String),
    #[error("the spec's own KV contract does not read back: {0}")]
    KvContract(#[from] sets::ContractError),
    #[error("could not serialize {what}: {source}")]
    Serialize { what: String, source: serde_json::Error },
    #[error("engine dry run: {0}")]
    DryRun(#[from] pd_core::dryrun::DryRunError),
    #[error("the model's config.json: {0}")]
    ModelConfig(pd_core::model_read::ConfigMapError),
}

impl Error {
    /// The `kind` label of the errors metric: one word per family of failure.
    pub(super) fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "client",
            Error::Render(_) => "render",
            Error::Unnamed(_) => "unnamed",
            Error::CacheClosed | Error::CacheNotReady(_) => "cache",
            Error::KvContract(_) => "kv_contract",
            Error::Serialize { .. } => "serialize",
            Error::DryRun(_) => "dry_run",
            Error::ModelConfig(_) => "model_config",
        }
    }

    /// The apiserver refused a new object because its namespace is being deleted; the
    /// PDDeployment goes with the namespace, so retrying only repeats the refusal.
    fn namespace_terminating(&self) -> bool {
        let Error::Kube(kube::Error::Api(status)) = self else { return false };
        status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
    }
}

/// What a failed reconcile leads to: in a namespace being deleted, no retry until the object
/// changes; otherwise a count under its metric label and another try in 5 s.
pub(super) fn error_policy(_obj: Arc<DeserializeGuard<PDDeployment>>, err: &Error, ctx: Arc<Context>) -> Action {
    if err.namespace_terminating() {
        info!(error = %err, "the namespace is being deleted; waiting for the PDDeployment to go with it");
        return Action::await_change();
    }
    warn!(error = %err, "reconcile failed");
    ctx.metrics.errors.get_or_create(&metrics::ErrorLabels { kind: err.metric_label().into() }).inc();
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_in_a_terminating_namespace_is_told_from_other_refusals() {
        // The body kube-apiserver 1.37 sends (kind tier, a test namespace being deleted).
        let refusal = |cause: &str| {
            let body = serde_json::json!({"status": "Failure", "code": 403, "reason": "Forbidden",
                "message": "pods \"a\" is forbidden: unable to create new content in namespace x because it is being terminated",
                "details": {"name": "a", "kind": "pods", "causes": [{"reason": cause, "message": "namespace x is being terminated", "field": "metadata.namespace"}]}});
            Error::Kube(kube::Error::Api(Box::new(serde_json::from_value(body).unwrap())))
        };
        assert!(refusal("NamespaceTerminating").namespace_terminating());
        assert!(!refusal("FieldValueForbidden").namespace_terminating());
        assert!(!Error::CacheClosed.namespace_terminating());
    }
}
