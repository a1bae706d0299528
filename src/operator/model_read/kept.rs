//! The model's `config.json`, as the admission webhook and the controller both read it through
//! the API: the ConfigMap `configMapRef` names, or the copy the operator keeps of a source's own
//! (read by a Job in the PDDeployment's namespace, `pd_core::model_read`). Neither reads a
//! Secret nor a URL a spec names.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};

use pd_api::ConfigMapKeyRef;
use pd_core::model::HfConfig;
use pd_core::model_read::ConfigMapError;

/// Reads the config.json `r` names in namespace `ns`, within `timeout`.
pub async fn config_map(client: &Client, ns: &str, r: &ConfigMapKeyRef, timeout: Duration) -> Result<HfConfig, ConfigMapError> {
    let (n, name) = (ns.to_owned(), r.name.clone());
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = match tokio::time::timeout(timeout, api.get_opt(&r.name)).await {
        Err(_) => return Err(ConfigMapError::Timeout { ns: n, name, timeout }),
        Ok(Err(e)) => return Err(ConfigMapError::Api { ns: n, name, message: e.to_string() }),
        Ok(Ok(None)) => return Err(ConfigMapError::Missing { ns: n, name }),
        Ok(Ok(Some(cm))) => cm,
    };
    HfConfig::from_config_map(&cm, &r.key).map_err(ConfigMapError::Invalid)
}

/// The config.json the operator keeps for PDDeployment `name` when it was read from `origin`
/// (`pd_core::model_read::kept`); none when it is not there, not from `origin`, or not read in `timeout`.
pub async fn kept(client: &Client, ns: &str, name: &str, origin: &str, timeout: Duration) -> Option<HfConfig> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = tokio::time::timeout(timeout, api.get_opt(&pd_core::model_read::config_map_name(name))).await.ok()?.ok()??;
    pd_core::model_read::kept(&cm, origin).map(|(_, config)| config)
}
