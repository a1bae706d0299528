//! The API's vocabulary on other objects: every `pd.inference.dev/*` label, annotation and pod
//! condition type pd-operator writes or selects on, and the standard labels it sets. One place, so
//! the controller, the webhook, the sidecar, `kubectl pd` and the charts' tests agree.

/// `app.kubernetes.io/managed-by`, set to `OPERATOR` on every child object.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const OPERATOR: &str = "pd-operator";
pub const LABEL_DEPLOYMENT: &str = "pd.inference.dev/deployment";
pub const LABEL_ROLE: &str = "pd.inference.dev/role";
pub const LABEL_INSTANCE: &str = "pd.inference.dev/instance";
pub const LABEL_NODE_RANK: &str = "pd.inference.dev/node-rank";
pub const LABEL_REVISION: &str = "pd.inference.dev/revision";
/// `true` while an engine pod is in the router's pool; the controller sets it to `false` to drain
/// an instance before its pods go (routers select on it).
pub const LABEL_SERVING: &str = "pd.inference.dev/serving";
/// When the controller started draining a pod (RFC 3339).
pub const DRAINING_SINCE: &str = "pd.inference.dev/draining-since";
/// When the operator last changed a running decode pod's sidecar image in place.
pub const SIDECAR_UPDATED_AT: &str = "pd.inference.dev/sidecar-updated-at";
/// The KV set an engine pod belongs to. Pods of one set may pair; a spec change whose KV contract
/// is incompatible with the running set starts a new set beside it, and the router is moved to the
/// new set as a whole.
pub const LABEL_KV_SET: &str = "pd.inference.dev/kv-set";
/// What an engine pod reports in the handshake (the prefill's `/route` body, or the decode's
/// topology) and the model it serves: what a later revision is judged against.
pub const KV_CONTRACT: &str = "pd.inference.dev/kv-contract";
/// The `LABEL_ROLE` value of router pods.
pub const ROUTER_ROLE: &str = "router";
/// `true` on every engine pod (prefill and decode, not the router): what the engines' headless
/// Service selects.
pub const LABEL_ENGINE: &str = "pd.inference.dev/engine";
/// On the operator's own pods (the chart's pod template): what the engines' NetworkPolicy lets
/// in to their HTTP port when the planner scrapes the engines itself.
pub const LABEL_COMPONENT: &str = "pd.inference.dev/component";
pub const OPERATOR_COMPONENT: &str = "operator";
/// The pod condition the handshake sidecar sets on its decode pod (the pod's readiness gate): True
/// once every prefill passed, False with SGLang's text otherwise.
pub const HANDSHAKE_CONDITION: &str = "pd.inference.dev/handshake";
/// Pod annotation where the sidecar publishes the rank map (JSON list of rank targets).
pub const RANK_MAP_ANNOTATION: &str = "pd.inference.dev/rank-map";
/// On the kept model-config ConfigMap: the URL (or a mounted source's origin) its config.json was
/// read from.
pub const MODEL_CONFIG_URL_ANNOTATION: &str = "pd.inference.dev/model-config-url";
/// On a weights fetch Job: the fetch's progress, as the fetcher last reported it.
pub const FETCH_PROGRESS_ANNOTATION: &str = "pd.inference.dev/model-fetch-progress";
/// On an object the controller applies only when its content changed: the hash it applied.
pub const APPLIED_HASH_ANNOTATION: &str = "pd.inference.dev/applied-hash";
/// On the webhook's serving Secret: when its certificate expires.
pub const CERT_NOT_AFTER_ANNOTATION: &str = "pd.inference.dev/not-after";
