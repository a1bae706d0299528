//! Serving certificates for the webhook: a hot-swappable rustls resolver, certificates from
//! files (cert-manager) re-read when they change, or a self-managed CA and serving certificate
//! kept in a Secret with the CA patched into the ValidatingWebhookConfiguration.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("certificate PEM: {0}")]
    Pem(String),
    #[error("private key: {0}")]
    Key(String),
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("reading {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("Kubernetes API ({what}): {source}")]
    Kube { what: String, source: kube::Error },
    #[error("the webhook Secret {0} kept changing under this replica; will read it again")]
    Contended(String),
}

pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem).collect::<Result<_, _>>().map_err(|e| TlsError::Pem(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::Pem("no CERTIFICATE block".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Key(e.to_string()))?;
    let signer = any_supported_type(&key).map_err(|e| TlsError::Key(e.to_string()))?;
    Ok(CertifiedKey::new(certs, signer))
}

/// The certificate currently served; swapped in place on rotation, no restart.
#[derive(Debug)]
pub struct CertStore {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertStore {
    pub fn new(key: CertifiedKey) -> Arc<Self> {
        Arc::new(Self { current: RwLock::new(Arc::new(key)) })
    }
    pub fn swap(&self, key: CertifiedKey) {
        if let Ok(mut cur) = self.current.write() {
            *cur = Arc::new(key);
        }
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.clone())
    }
}

pub fn server_config(store: Arc<CertStore>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(store);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// A CA and a serving certificate signed by it.
#[derive(Clone, Debug)]
pub struct Generated {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// Unix seconds after which the serving certificate is invalid.
    pub not_after: i64,
}

const CA_DAYS: i64 = 3650;
const LEAF_DAYS: i64 = 365;
/// Renew the serving certificate this long before it expires.
const RENEW_BEFORE: i64 = 30 * 86400;

pub fn generate(dns_names: &[String], ips: &[IpAddr]) -> Result<Generated, TlsError> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};
    let now = time::OffsetDateTime::now_utc();
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, "pd-operator webhook CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    ca.not_before = now - time::Duration::hours(1);
    ca.not_after = now + time::Duration::days(CA_DAYS);
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let leaf_key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(dns_names.to_vec())?;
    leaf.subject_alt_names.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    leaf.distinguished_name.push(DnType::CommonName, dns_names.first().cloned().unwrap_or_else(|| "pd-operator-webhook".into()));
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = now - time::Duration::hours(1);
    let not_after = now + time::Duration::days(LEAF_DAYS);
    leaf.not_after = not_after;
    let cert = leaf.signed_by(&leaf_key, &issuer)?;
    Ok(Generated { ca_pem: ca_cert.pem(), cert_pem: cert.pem(), key_pem: leaf_key.serialize_pem(), not_after: not_after.unix_timestamp() })
}

/// Where the serving certificate comes from.
#[derive(Clone, Debug)]
pub enum CertSource {
    /// `tls.crt`/`tls.key` in a directory (e.g. a cert-manager Secret volume); re-read on change.
    Files { dir: PathBuf },
    /// Generated and rotated by the operator, stored in a Secret; the CA is patched into the
    /// named ValidatingWebhookConfiguration.
    SelfManaged { namespace: String, secret: String, webhook_config: String, dns_names: Vec<String>, ips: Vec<IpAddr> },
}

fn file_state(dir: &std::path::Path) -> Option<(SystemTime, SystemTime)> {
    let m = |f: &str| std::fs::metadata(dir.join(f)).and_then(|m| m.modified()).ok();
    Some((m("tls.crt")?, m("tls.key")?))
}

fn load_files(dir: &std::path::Path) -> Result<CertifiedKey, TlsError> {
    let read = |f: &str| std::fs::read(dir.join(f)).map_err(|source| TlsError::Io { path: dir.join(f), source });
    certified_key(&read("tls.crt")?, &read("tls.key")?)
}

const EXPIRY_ANNOTATION: &str = "pd.inference.dev/not-after";
/// Attempts at writing the Secret when other replicas keep writing it first.
const SECRET_WRITE_ATTEMPTS: usize = 5;
/// How often the keeper re-reads the Secret and the registration, and how soon it tries again
/// while the apiserver does not trust what this replica serves yet.
const RESYNC: Duration = Duration::from_secs(30);
const RETRY_UNTRUSTED: Duration = Duration::from_secs(2);

fn secret_bundle(s: &Secret) -> Option<Generated> {
    let d = s.data.as_ref()?;
    let text = |k: &str| d.get(k).map(|b| String::from_utf8_lossy(&b.0).into_owned());
    Some(Generated {
        ca_pem: text("ca.crt")?,
        cert_pem: text("tls.crt")?,
        key_pem: text("tls.key")?,
        not_after: s.annotations().get(EXPIRY_ANNOTATION)?.parse().ok()?,
    })
}

fn kube_err(what: &str) -> impl FnOnce(kube::Error) -> TlsError + '_ {
    move |source| TlsError::Kube { what: what.into(), source }
}

/// The certificates of a PEM bundle, in order (unparsable blocks are skipped).
fn pem_certs(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem).filter_map(Result::ok).collect()
}

/// The first PEM certificate block of `pem`, as text.
fn first_pem_block(pem: &str) -> Option<&str> {
    const END: &str = "-----END CERTIFICATE-----";
    let start = pem.find("-----BEGIN CERTIFICATE-----")?;
    let end = pem[start..].find(END)? + start + END.len();
    Some(&pem[start..end])
}

/// A freshly generated bundle whose `ca.crt` also carries the CA it replaces, so a replica still
/// serving the old certificate stays trusted until it loads the new one.
fn with_previous_ca(mut fresh: Generated, previous: Option<&Generated>) -> Generated {
    if let Some(old_ca) = previous.and_then(|p| first_pem_block(&p.ca_pem)) {
        if !fresh.ca_pem.ends_with('\n') {
            fresh.ca_pem.push('\n');
        }
        fresh.ca_pem.push_str(old_ca);
        fresh.ca_pem.push('\n');
    }
    fresh
}

fn secret_object(ns: &str, name: &str, bundle: &Generated, resource_version: Option<String>) -> Secret {
    let data = [("ca.crt", &bundle.ca_pem), ("tls.crt", &bundle.cert_pem), ("tls.key", &bundle.key_pem)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.clone().into_bytes())))
        .collect();
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            resource_version,
            annotations: Some([(EXPIRY_ANNOTATION.to_owned(), bundle.not_after.to_string())].into()),
            labels: Some([("app.kubernetes.io/managed-by".to_owned(), "pd-operator".to_owned())].into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    }
}

/// Returns the valid bundle in the Secret. When it is missing or close to expiry, a new one is
/// written with a precondition (create if absent; replace at the read resourceVersion), so of
/// replicas racing only one write lands: the others get 409 and load the winner's Secret.
async fn ensure_secret(client: &Client, ns: &str, name: &str, dns: &[String], ips: &[IpAddr]) -> Result<Generated, TlsError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    for _ in 0..SECRET_WRITE_ATTEMPTS {
        let existing = api.get_opt(name).await.map_err(kube_err("read webhook Secret"))?;
        let current = existing.as_ref().and_then(secret_bundle);
        let now = jiff::Timestamp::now().as_second();
        if let Some(bundle) = current.as_ref().filter(|b| b.not_after - now > RENEW_BEFORE) {
            return Ok(bundle.clone());
        }
        let fresh = with_previous_ca(generate(dns, ips)?, current.as_ref());
        let written = match existing {
            None => api.create(&PostParams::default(), &secret_object(ns, name, &fresh, None)).await,
            Some(old) => api.replace(name, &PostParams::default(), &secret_object(ns, name, &fresh, old.metadata.resource_version)).await,
        };
        match written {
            Ok(_) => {
                tracing::info!(secret = %format!("{ns}/{name}"), "generated a new webhook CA and serving certificate");
                return Ok(fresh);
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::info!(secret = %format!("{ns}/{name}"), "another replica wrote the webhook Secret first; loading it");
            }
            Err(e) => return Err(kube_err("write webhook Secret")(e)),
        }
    }
    Err(TlsError::Contended(format!("{ns}/{name}")))
}

/// Makes every webhook of the configuration carry exactly `ca_pem`; returns the CA bundles the
/// registration holds afterwards (empty when the configuration does not exist yet).
async fn patch_ca_bundle(client: &Client, config: &str, ca_pem: &str) -> Result<Vec<Vec<u8>>, TlsError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let Some(vwc) = api.get_opt(config).await.map_err(kube_err("read ValidatingWebhookConfiguration"))? else {
        tracing::warn!(config, "ValidatingWebhookConfiguration not found; caBundle not patched yet");
        return Ok(Vec::new());
    };
    let ca = ByteString(ca_pem.as_bytes().to_vec());
    let mut webhooks = vwc.webhooks.clone().unwrap_or_default();
    let mut changed = false;
    for w in &mut webhooks {
        if w.client_config.ca_bundle.as_ref() != Some(&ca) {
            w.client_config.ca_bundle = Some(ca.clone());
            changed = true;
        }
    }
    if changed {
        let patch = serde_json::json!({"webhooks": webhooks});
        api.patch(config, &PatchParams::default(), &Patch::Strategic(&patch)).await.map_err(kube_err("patch caBundle"))?;
        tracing::info!(config, "patched the webhook CA bundle");
    }
    Ok(webhooks.iter().map(|w| w.client_config.ca_bundle.as_ref().map(|b| b.0.clone()).unwrap_or_default()).collect())
}

/// Whether every registered CA bundle holds the CA that signed `bundle`'s serving certificate
/// (the first certificate of its `ca.crt`), i.e. the apiserver will accept what this replica serves.
fn trusted_by(registered: &[Vec<u8>], bundle: &Generated) -> bool {
    let Some(signer) = pem_certs(bundle.ca_pem.as_bytes()).into_iter().next() else { return false };
    !registered.is_empty() && registered.iter().all(|ca| pem_certs(ca).contains(&signer))
}

/// Whether an API failure may pass by itself: no connection yet (a new node whose kube-proxy does
/// not route the API Service), a timeout, an overloaded or restarting apiserver. A refusal
/// (forbidden, invalid) will not, and is reported at once.
fn transient(e: &TlsError) -> bool {
    match e {
        TlsError::Kube { source: kube::Error::Api(status), .. } => status.code == 429 || status.code >= 500,
        TlsError::Kube { .. } | TlsError::Contended(_) => true,
        _ => false,
    }
}

/// Runs `step` until it succeeds or fails for good, backing off 1 s to 10 s between transient
/// failures.
async fn until_reachable<T, F, Fut>(step: F) -> Result<T, TlsError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, TlsError>>,
{
    use backon::Retryable;
    let backoff = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(10))
        .without_max_times();
    step.retry(backoff)
        .when(transient)
        .notify(|e, delay| tracing::warn!(error = %e, retry_in = ?delay, "webhook certificate: the API is not reachable yet; retrying"))
        .await
}

/// Where the operator keeps its own CA and serving certificate.
struct SelfManaged {
    client: Client,
    namespace: String,
    secret: String,
    webhook_config: String,
    dns_names: Vec<String>,
    ips: Vec<IpAddr>,
}

impl SelfManaged {
    async fn secret(&self) -> Result<Generated, TlsError> {
        ensure_secret(&self.client, &self.namespace, &self.secret, &self.dns_names, &self.ips).await
    }

    /// One pass: load the Secret (rotated by whichever replica got there first), serve its
    /// certificate, register its CA, and report whether the registration trusts what is served.
    async fn sync(&self, store: &CertStore, served: &mut Generated) -> Result<bool, TlsError> {
        let bundle = self.secret().await?;
        if bundle.cert_pem != served.cert_pem {
            store.swap(certified_key(bundle.cert_pem.as_bytes(), bundle.key_pem.as_bytes())?);
            tracing::info!(secret = %self.secret, "serving the webhook certificate from the Secret");
            *served = bundle;
        }
        let registered = patch_ca_bundle(&self.client, &self.webhook_config, &served.ca_pem).await?;
        Ok(trusted_by(&registered, served))
    }

    /// Keeps the served certificate and the registration in step with the Secret, and `trusted`
    /// true only while the apiserver trusts what this replica serves.
    async fn keep(self, store: Arc<CertStore>, mut served: Generated, trusted: Arc<AtomicBool>) {
        loop {
            let ok = match self.sync(&store, &mut served).await {
                Ok(ok) => ok,
                Err(e) => {
                    tracing::warn!(error = %e, "could not check the webhook certificate");
                    trusted.load(Ordering::Relaxed)
                }
            };
            if ok != trusted.swap(ok, Ordering::Relaxed) {
                tracing::info!(trusted = ok, "the registration's CA bundle and the served certificate agree: {ok}");
            }
            tokio::time::sleep(if ok { RESYNC } else { RETRY_UNTRUSTED }).await;
        }
    }
}

fn watch_files(dir: PathBuf, store: Arc<CertStore>) {
    tokio::spawn(async move {
        let mut seen = file_state(&dir);
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let now = file_state(&dir);
            if now != seen {
                match load_files(&dir) {
                    Ok(k) => {
                        store.swap(k);
                        seen = now;
                        tracing::info!(dir = %dir.display(), "reloaded the webhook certificate");
                    }
                    Err(e) => tracing::warn!(error = %e, "webhook certificate files changed but do not load; keeping the old one"),
                }
            }
        }
    });
}

/// Loads the first certificate and starts the task that keeps it current. `trusted` turns true
/// once the apiserver's registration trusts the served certificate (at once for certificates
/// from files: cert-manager's CA injector owns the registration then).
pub async fn start(source: CertSource, client: Client, trusted: Arc<AtomicBool>) -> Result<Arc<CertStore>, TlsError> {
    match source {
        CertSource::Files { dir } => {
            let store = CertStore::new(load_files(&dir)?);
            watch_files(dir, store.clone());
            trusted.store(true, Ordering::Relaxed);
            Ok(store)
        }
        CertSource::SelfManaged { namespace, secret, webhook_config, dns_names, ips } => {
            let keeper = SelfManaged { client, namespace, secret, webhook_config, dns_names, ips };
            let bundle = until_reachable(|| keeper.secret()).await?;
            let store = CertStore::new(certified_key(bundle.cert_pem.as_bytes(), bundle.key_pem.as_bytes())?);
            tokio::spawn(keeper.keep(store.clone(), bundle, trusted));
            Ok(store)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_and_overload_are_retried_but_refusals_are_not() {
        let api = |code: u16| TlsError::Kube {
            what: "read webhook Secret".into(),
            source: kube::Error::Api(Box::new(serde_json::from_value(serde_json::json!({"code": code})).unwrap())),
        };
        assert!(transient(&api(503)) && transient(&api(500)) && transient(&api(429)));
        assert!(!transient(&api(403)) && !transient(&api(404)) && !transient(&api(422)));
        assert!(!transient(&TlsError::Pem("no certificate".into())));
    }

    #[tokio::test]
    async fn setup_retries_an_unreachable_api_and_gives_up_at_once_on_a_refusal() {
        let api = |code: u16| TlsError::Kube {
            what: "read webhook Secret".into(),
            source: kube::Error::Api(Box::new(serde_json::from_value(serde_json::json!({"code": code})).unwrap())),
        };
        let calls = std::sync::atomic::AtomicU32::new(0);
        let flaky = || async {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            if n == 0 { Err(api(503)) } else { Ok(n) }
        };
        assert_eq!(until_reachable(flaky).await.unwrap(), 1, "one retry after the 503");
        let refusals = std::sync::atomic::AtomicU32::new(0);
        let refused = || async {
            refusals.fetch_add(1, Ordering::Relaxed);
            Err::<(), _>(api(403))
        };
        assert!(until_reachable(refused).await.is_err());
        assert_eq!(refusals.load(Ordering::Relaxed), 1, "a refusal is not retried");
    }

    #[test]
    fn generated_certificates_load_and_carry_the_sans() {
        let g = generate(&["pd-operator-webhook.pd-system.svc".into()], &["127.0.0.1".parse().unwrap()]).unwrap();
        assert!(g.ca_pem.contains("BEGIN CERTIFICATE") && g.key_pem.contains("PRIVATE KEY"));
        let key = certified_key(g.cert_pem.as_bytes(), g.key_pem.as_bytes()).unwrap();
        assert_eq!(key.cert.len(), 1);
        assert!(g.not_after > jiff::Timestamp::now().as_second() + 300 * 86400);
        assert!(matches!(certified_key(b"nope", g.key_pem.as_bytes()), Err(TlsError::Pem(_))));
        // A client trusting only the CA accepts exactly the names and addresses in the SANs.
        for name in ["pd-operator-webhook.pd-system.svc", "127.0.0.1"] {
            handshake(&g, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        for name in ["pd-operator-webhook.other.svc", "127.0.0.2"] {
            assert!(handshake(&g, name).is_err_and(|e| e.contains("NotValidForName")), "{name} was accepted");
        }
    }

    /// A TLS handshake in memory between our server config serving `g` and a client that trusts
    /// only `g`'s CA and asks for `name`.
    fn handshake(g: &Generated, name: &str) -> Result<(), String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(pem_certs(g.ca_pem.as_bytes()));
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server_name = rustls::pki_types::ServerName::try_from(name.to_owned()).map_err(|e| e.to_string())?;
        let mut client = rustls::ClientConnection::new(Arc::new(client), server_name).map_err(|e| e.to_string())?;
        let store = CertStore::new(certified_key(g.cert_pem.as_bytes(), g.key_pem.as_bytes()).map_err(|e| e.to_string())?);
        let mut server = rustls::ServerConnection::new(server_config(store).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        while client.is_handshaking() || server.is_handshaking() {
            let mut wire = Vec::new();
            client.write_tls(&mut wire).map_err(|e| e.to_string())?;
            server.read_tls(&mut wire.as_slice()).map_err(|e| e.to_string())?;
            server.process_new_packets().map_err(|e| e.to_string())?;
            let mut wire = Vec::new();
            server.write_tls(&mut wire).map_err(|e| e.to_string())?;
            client.read_tls(&mut wire.as_slice()).map_err(|e| e.to_string())?;
            client.process_new_packets().map_err(|e| format!("{e:?}"))?;
        }
        Ok(())
    }

    #[test]
    fn a_rotated_bundle_keeps_the_previous_ca_so_both_certificates_are_trusted() {
        let old = generate(&["w.ns.svc".into()], &[]).unwrap();
        let new = with_previous_ca(generate(&["w.ns.svc".into()], &[]).unwrap(), Some(&old));
        assert_eq!(pem_certs(new.ca_pem.as_bytes()).len(), 2, "{}", new.ca_pem);
        let registered = vec![new.ca_pem.clone().into_bytes()];
        assert!(trusted_by(&registered, &new), "the new certificate chains to the first CA");
        assert!(trusted_by(&registered, &old), "a replica still serving the old certificate stays trusted");
        // Rotating again carries only the newest previous CA: the bundle does not grow.
        let newer = with_previous_ca(generate(&["w.ns.svc".into()], &[]).unwrap(), Some(&new));
        assert_eq!(pem_certs(newer.ca_pem.as_bytes()).len(), 2);
        assert!(!trusted_by(&[newer.ca_pem.clone().into_bytes()], &old));
    }

    #[test]
    fn a_registration_without_the_signing_ca_or_without_webhooks_is_not_trusted() {
        let mine = generate(&["w.ns.svc".into()], &[]).unwrap();
        let theirs = generate(&["w.ns.svc".into()], &[]).unwrap();
        assert!(!trusted_by(&[theirs.ca_pem.clone().into_bytes()], &mine), "another replica's CA");
        assert!(!trusted_by(&[], &mine), "no registration (yet)");
        assert!(!trusted_by(&[mine.ca_pem.clone().into_bytes(), theirs.ca_pem.into_bytes()], &mine), "one webhook of two lacks it");
        assert!(trusted_by(&[mine.ca_pem.clone().into_bytes()], &mine));
    }
}
