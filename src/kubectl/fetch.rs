//! What `kubectl pd` reads from the cluster: one PDDeployment, its pods, the events about both,
//! and the ConfigMap its model's config.json is in (`model.configMapRef`, or the one the operator
//! keeps for a Hub source). Nothing is written.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;

use pd_api::PDDeployment;
use pd_api::labels::LABEL_DEPLOYMENT;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Input(String),
    #[error("pddeployment {name:?} not found in namespace {namespace:?} (kubectl get pdd -n {namespace} lists them)")]
    NotFound { name: String, namespace: String },
    #[error("cannot reach the Kubernetes API (KUBECONFIG or in-cluster config): {0}")]
    Connect(kube::Error),
    #[error("cannot read {what} from the Kubernetes API: {source}")]
    Api { what: String, source: kube::Error },
    #[error("{0}")]
    Output(String),
}

impl Error {
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Input(_) | Error::NotFound { .. } => 2,
            Error::Connect(_) | Error::Api { .. } | Error::Output(_) => 4,
        }
    }
}

/// One PDDeployment as `kubectl pd` draws it.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub pdd: PDDeployment,
    pub pods: Vec<Pod>,
    /// Events about the PDDeployment and its pods, oldest first.
    pub events: Vec<Event>,
    /// The ConfigMap `model.configMapRef` names, when it exists and may be read.
    pub model_config: Option<ConfigMap>,
    pub now: jiff::Timestamp,
}

pub async fn snapshot(name: &str, namespace: Option<&str>) -> Result<Snapshot, Error> {
    let client = pd_runtime::kube_client::connect().await.map_err(Error::Connect)?;
    let ns = namespace.map_or_else(|| client.default_namespace().to_owned(), str::to_owned);
    let api = |what: &str| {
        let what = what.to_owned();
        move |source| Error::Api { what, source }
    };
    let pdd = Api::<PDDeployment>::namespaced(client.clone(), &ns)
        .get_opt(name)
        .await
        .map_err(api("pddeployments"))?
        .ok_or_else(|| Error::NotFound { name: name.into(), namespace: ns.clone() })?;
    let selector = format!("{LABEL_DEPLOYMENT}={name}");
    let pods = Api::<Pod>::namespaced(client.clone(), &ns).list(&ListParams::default().labels(&selector)).await.map_err(api("pods"))?.items;
    let mut about: BTreeSet<String> = pods.iter().filter_map(|p| p.metadata.name.clone()).collect();
    about.insert(name.to_owned());
    let mut events: Vec<Event> = Api::<Event>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .map_err(api("events.events.k8s.io"))?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_ref()).is_some_and(|n| about.contains(n)))
        .collect();
    events.sort_by_key(crate::view::event_time);
    // The model config only sharpens `explain`: a ConfigMap the user may not read is left out.
    let name = pdd.metadata.name.clone().unwrap_or_default();
    let model_config = match &pd_core::model_read::config_ref(&name, &pdd.spec.model) {
        Some(r) => Api::<ConfigMap>::namespaced(client, &ns).get_opt(&r.name).await.ok().flatten(),
        None => None,
    };
    Ok(Snapshot { pdd, pods, events, model_config, now: jiff::Timestamp::now() })
}
