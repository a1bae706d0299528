//! The model's `config.json`, as the admission webhook and the controller both read it from the
//! source `pd_core::hub::config_source` names: the ConfigMap `configMapRef` names, or a Hugging
//! Face source's own (the token from the Secret `tokenSecretRef` names, then pd-runtime's GET of
//! the URL pd-core's `hub` builds).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};
use tracing::{Instrument, info_span};

use pd_api::{ConfigMapKeyRef, SecretKeyRef};
use pd_core::hub::{ConfigMapError, HubError, HubRequest};
use pd_core::model::HfConfig;

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
/// (`pd_core::hub::kept`); none when it is not there, not from `origin`, or not read in `timeout`.
pub async fn kept(client: &Client, ns: &str, name: &str, origin: &str, timeout: Duration) -> Option<HfConfig> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = tokio::time::timeout(timeout, api.get_opt(&pd_core::hub::config_map_name(name))).await.ok()?.ok()??;
    pd_core::hub::kept(&cm, origin).map(|(_, config)| config)
}

/// Reads `req`'s config.json, the Secret (in namespace `ns`) and the GET within `timeout`.
pub async fn hub(client: &Client, ns: &str, req: &HubRequest, timeout: Duration) -> Result<(String, HfConfig), HubError> {
    let span = info_span!("hub_config", url = %req.url);
    async {
        let started = Instant::now();
        let token = match &req.token {
            None => None,
            Some(r) => match tokio::time::timeout(timeout, token(client, ns, r, &req.url)).await {
                Ok(t) => Some(t?),
                Err(_) => return Err(token_error(&req.url, format!("reading Secret {ns}/{} took over {timeout:?}", r.name))),
            },
        };
        pd_runtime::hub::fetch_config(req, token.as_deref(), timeout.saturating_sub(started.elapsed())).await
    }
    .instrument(span)
    .await
}

fn token_error(url: &str, message: String) -> HubError {
    HubError::Token { url: url.to_owned(), message }
}

async fn token(client: &Client, ns: &str, r: &SecretKeyRef, url: &str) -> Result<String, HubError> {
    let fail = |message: String| token_error(url, message);
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = api
        .get_opt(&r.name)
        .await
        .map_err(|e| fail(format!("reading Secret {ns}/{}: {e}", r.name)))?
        .ok_or_else(|| fail(format!("Secret {ns}/{} does not exist", r.name)))?;
    let value =
        secret.data.and_then(|mut d| d.remove(&r.key)).ok_or_else(|| fail(format!("Secret {ns}/{} has no key {:?}", r.name, r.key)))?;
    let text = String::from_utf8(value.0).map_err(|_| fail(format!("Secret {ns}/{} key {} is not text", r.name, r.key)))?;
    Ok(text.trim().to_owned())
}
