//! The Hub read the webhook and the controller share (pd-runtime's `hub`), against the stand-in
//! Hub: the URL huggingface_hub builds, the token as `Authorization: Bearer`, and each failure
//! named with the URL and the HTTP status.

use std::time::Duration;

use pd_api::ModelSpec;
use pd_core::hub;
use pd_runtime::hub::fetch_config;
use pd_testing::hub::{GATED_TOKEN, HubStandIn, fixtures};

fn request(endpoint: &str, repo: &str, token: bool) -> hub::HubRequest {
    let token = if token { serde_json::json!({"name": "hf"}) } else { serde_json::Value::Null };
    let model: ModelSpec = serde_json::from_value(serde_json::json!({"path": repo,
        "source": {"huggingFace": {"repo": repo, "endpoint": format!("{endpoint}/"), "tokenSecretRef": token}}}))
    .unwrap();
    hub::request(&model).unwrap()
}

const T: Duration = Duration::from_secs(5);

#[tokio::test]
async fn configs_are_read_and_failures_name_the_url_and_status() {
    let hub = HubStandIn::start(fixtures());
    let (text, config) = fetch_config(&request(&hub.endpoint, "acme/dsv3-ft", false), None, T).await.unwrap();
    assert_eq!(config.architectures, ["DeepseekV3ForCausalLM"]);
    assert!(text.contains("\"kv_lora_rank\": 512"));
    let missing = request(&hub.endpoint, "acme/no-such-model", false);
    let e = fetch_config(&missing, None, T).await.unwrap_err();
    assert_eq!(e.reason(), "ConfigNotFound");
    assert!(e.to_string().starts_with(&format!("GET {}/acme/no-such-model/resolve/main/config.json: HTTP 404", hub.endpoint)), "{e}");
    let gated = request(&hub.endpoint, "acme/dsv3-gated", false);
    let e = fetch_config(&gated, None, T).await.unwrap_err();
    assert!(e.to_string().contains("HTTP 401: acme/dsv3-gated is gated, private or absent, and no token was sent"), "{e}");
    let with_token = request(&hub.endpoint, "acme/dsv3-gated", true);
    let e = fetch_config(&with_token, Some("wrong"), T).await.unwrap_err();
    assert!(e.to_string().contains("HTTP 401: the Hub refused the token of Secret hf key token"), "{e}");
    assert!(fetch_config(&with_token, Some(GATED_TOKEN), T).await.is_ok(), "the token is sent as a Bearer");
    assert_eq!(
        hub.requests(),
        [
            "GET /acme/dsv3-ft/resolve/main/config.json 200",
            "GET /acme/no-such-model/resolve/main/config.json 404",
            "GET /acme/dsv3-gated/resolve/main/config.json 401",
            "GET /acme/dsv3-gated/resolve/main/config.json 401",
            "GET /acme/dsv3-gated/resolve/main/config.json 200",
        ],
        "one GET each, the endpoint's trailing slash trimmed"
    );
}
