//! Which addresses a spec may make the operator reach: the platform's choice, not the tenant's.
//! A PDDeployment names two kinds of remote address: a Hub endpoint
//! (`spec.model.source.huggingFace.endpoint`, read by the operator and the fetch Job) and a
//! Prometheus URL (`spec.autoscaling.prometheus.url`, queried by the operator's planner). The
//! operator reaches them from its own network position, so each is judged against the lists the
//! platform team configured (chart values `egress.hubEndpoints` and `egress.prometheusHosts`):
//! at admission, by the controller before any request, and by `pd-operator validate` with the
//! default lists. Pure: the parsing is the `url` crate's (WHATWG), the same as a browser's.
//!
//! An entry is `[http://|https://]HOST[:PORT]`, where HOST is a name, an IP address (IPv6 in
//! brackets) or `*.SUFFIX` for every name ending in `.SUFFIX`; without a scheme both http and
//! https match, without a port any port does. A URL matches by scheme, host and port; its path
//! is free.
//!
//! Some addresses are refused whatever a wildcard says: loopback (127.0.0.0/8, ::1,
//! `localhost`), link-local (169.254.0.0/16 with the cloud metadata address, fe80::/10),
//! unspecified addresses and the cloud metadata names. The platform may still list such a host
//! by its exact name or address (never through `*.`): that is an explicit choice of the admin
//! (a test cluster's stand-in on 127.0.0.1), never something a tenant can ask for. Credentials
//! in a URL (`user:pass@`) and schemes other than http and https are refused always.
//!
//! `<service>.<namespace>` names (`prometheus-operated.monitoring`) are not allowed by the
//! default Prometheus list: such a name cannot be told from a public domain (`example.com`), and
//! resolves through the pod's DNS search path to either. Written in full
//! (`prometheus-operated.monitoring.svc`) it is in-cluster by construction.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use thiserror::Error;
use url::{Host, Url};

use crate::findings::Finding;
use pd_api::PDDeploymentSpec;

/// The Hub endpoints allowed unless the platform says otherwise (huggingface_hub's default).
pub const DEFAULT_HUB_ENDPOINTS: &str = "https://huggingface.co";
/// The Prometheus hosts allowed unless the platform says otherwise: in-cluster Services.
pub const DEFAULT_PROMETHEUS_HOSTS: &str = "*.svc,*.svc.cluster.local";
/// Cloud metadata services' names: refused like the link-local address they stand for.
const METADATA_NAMES: &[&str] = &["metadata.google.internal", "metadata.goog", "metadata", "instance-data", "instance-data.ec2.internal"];
/// Cloud metadata addresses outside the link-local range (AWS' IPv6, Alibaba's).
const METADATA_ADDRESSES: &[IpAddr] =
    &[IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)), IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200))];

/// The two kinds of address a spec names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Hub,
    Prometheus,
}

impl Target {
    pub fn field(self) -> &'static str {
        match self {
            Self::Hub => "spec.model.source.huggingFace.endpoint",
            Self::Prometheus => "spec.autoscaling.prometheus.url",
        }
    }
    fn what(self) -> &'static str {
        match self {
            Self::Hub => "Hub endpoints",
            Self::Prometheus => "Prometheus hosts",
        }
    }
    /// The chart value and the operator flag that set the list.
    fn setting(self) -> &'static str {
        match self {
            Self::Hub => "the chart value egress.hubEndpoints (operator flag --allowed-hub-endpoints)",
            Self::Prometheus => "the chart value egress.prometheusHosts (operator flag --allowed-prometheus-hosts)",
        }
    }
    fn alternative(self) -> &'static str {
        match self {
            Self::Hub => "or leave endpoint unset for https://huggingface.co",
            Self::Prometheus => "or use an in-cluster Service name (SERVICE.NAMESPACE.svc)",
        }
    }
}

/// An entry of the platform's list that is not one.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{flag} entry {entry:?}: {why} (an entry is [http://|https://]HOST[:PORT] or *.SUFFIX[:PORT])")]
pub struct EntryError {
    pub flag: &'static str,
    pub entry: String,
    pub why: String,
}

/// Why a URL a spec names is refused: the field, what is wrong, how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub field: &'static str,
    pub message: String,
    pub fix: String,
}

/// `field: message (fix: …)`, as every finding reads.
impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} (fix: {})", self.field, self.message, self.fix)
    }
}

impl From<Refusal> for Finding {
    fn from(r: Refusal) -> Self {
        Finding::error("egress-not-allowed", r.field, r.message, r.fix)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum HostPattern {
    Exact(Host<String>),
    /// `*.svc`: the suffix with its dot, `.svc`.
    Suffix(String),
}

/// One entry of a list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowed {
    text: String,
    scheme: Option<&'static str>,
    host: HostPattern,
    port: Option<u16>,
}

impl Allowed {
    /// Parses one entry; `flag` names the list in the error.
    pub fn parse(flag: &'static str, entry: &str) -> Result<Self, EntryError> {
        let bad = |why: &str| EntryError { flag, entry: entry.to_owned(), why: why.to_owned() };
        let text = entry.trim();
        let (scheme, rest) = match text.split_once("://") {
            Some(("http", rest)) => (Some("http"), rest),
            Some(("https", rest)) => (Some("https"), rest),
            Some(_) => return Err(bad("only http and https are allowed")),
            None => (None, text),
        };
        let rest = rest.trim_end_matches('/');
        if rest.contains(['/', '@', '?', '#']) {
            return Err(bad("an entry names a host and a port, no path, credentials or query"));
        }
        let (host, port) = split_port(rest).ok_or_else(|| bad("the port is not a number from 1 to 65535"))?;
        let host = match host.strip_prefix("*.") {
            Some(suffix) if !suffix.is_empty() && !suffix.contains('*') => {
                HostPattern::Suffix(format!(".{}", suffix.to_ascii_lowercase().trim_end_matches('.')))
            }
            Some(_) => return Err(bad("a wildcard is *.SUFFIX with a non-empty suffix")),
            None if host.contains('*') => return Err(bad("a wildcard is *.SUFFIX, at the start only")),
            None => HostPattern::Exact(Host::parse(host.trim_end_matches('.')).map_err(|e| bad(&e.to_string()))?),
        };
        Ok(Self { text: text.to_owned(), scheme, host, port })
    }

    fn matches(&self, scheme: &str, host: &Host<String>, port: Option<u16>) -> bool {
        let host_ok = match (&self.host, host) {
            (HostPattern::Exact(h), _) => h == host,
            (HostPattern::Suffix(s), Host::Domain(d)) => d.len() > s.len() && d.ends_with(s.as_str()),
            (HostPattern::Suffix(_), _) => false,
        };
        host_ok && self.scheme.is_none_or(|s| s == scheme) && self.port.is_none_or(|p| Some(p) == port)
    }

    /// Whether it names `host` by itself, not through a wildcard: what a reserved host needs.
    fn names(&self, host: &Host<String>) -> bool {
        matches!(&self.host, HostPattern::Exact(h) if h == host)
    }
}

/// `host[:port]` → host and port; `None` for a port that is not one.
fn split_port(s: &str) -> Option<(&str, Option<u16>)> {
    let colon = if s.starts_with('[') { s.find(']').map(|i| i + 1).filter(|&i| i < s.len()) } else { s.rfind(':') };
    match colon {
        Some(i) if s[i..].starts_with(':') => {
            let port: u16 = s[i + 1..].parse().ok().filter(|&p| p > 0)?;
            Some((&s[..i], Some(port)))
        }
        _ => Some((s, None)),
    }
}

/// The platform's lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressPolicy {
    pub hub: Vec<Allowed>,
    pub prometheus: Vec<Allowed>,
}

impl Default for EgressPolicy {
    fn default() -> Self {
        let split = |s: &str| s.split(',').map(str::to_owned).collect::<Vec<_>>();
        Self::new(&split(DEFAULT_HUB_ENDPOINTS), &split(DEFAULT_PROMETHEUS_HOSTS)).expect("the default lists parse")
    }
}

impl EgressPolicy {
    /// The policy of two lists of entries (empty entries skipped: an empty list allows nothing).
    pub fn new(hub: &[String], prometheus: &[String]) -> Result<Self, EntryError> {
        let parse = |flag, list: &[String]| {
            list.iter().filter(|e| !e.trim().is_empty()).map(|e| Allowed::parse(flag, e)).collect::<Result<Vec<_>, _>>()
        };
        Ok(Self { hub: parse("--allowed-hub-endpoints", hub)?, prometheus: parse("--allowed-prometheus-hosts", prometheus)? })
    }

    fn list(&self, target: Target) -> &[Allowed] {
        match target {
            Target::Hub => &self.hub,
            Target::Prometheus => &self.prometheus,
        }
    }

    /// Every address `spec` names that this policy refuses, as the rules' findings.
    pub fn check(&self, spec: &PDDeploymentSpec) -> Vec<Finding> {
        let mut out = Vec::new();
        if let Some(hf) = spec.model.source.as_ref().and_then(|s| s.hugging_face.as_ref()) {
            out.extend(self.allows(Target::Hub, crate::hub::endpoint(hf)).err().map(Finding::from));
        }
        if let Some(p) = spec.autoscaling.as_ref().and_then(|a| a.prometheus.as_ref()) {
            out.extend(self.allows(Target::Prometheus, &p.url).err().map(Finding::from));
        }
        out
    }

    /// Whether `url`, named by `target`'s field, may be reached.
    pub fn allows(&self, target: Target, url: &str) -> Result<(), Refusal> {
        let refuse = |message: String, fix: String| Refusal { field: target.field(), message, fix };
        let parsed = Url::parse(url).map_err(|e| refuse(format!("{url:?} is not a URL: {e}"), "write http://HOST[:PORT][/PATH]".into()))?;
        let scheme = parsed.scheme();
        if scheme != "http" && scheme != "https" {
            return Err(refuse(format!("scheme {scheme}: is neither http nor https"), "use an http:// or https:// URL".into()));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            let fix = match target {
                Target::Hub => "remove USER:PASSWORD@ from the URL; a Hub token goes in spec.model.source.huggingFace.tokenSecretRef",
                Target::Prometheus => "remove USER:PASSWORD@ from the URL; the operator sends no credentials to Prometheus",
            };
            return Err(refuse("the URL carries credentials (USER:PASSWORD@), which the operator never sends".into(), fix.into()));
        }
        let Some(host) = parsed.host().map(|h| h.to_owned()).map(trim_dot) else {
            return Err(refuse(format!("{url:?} names no host"), "write http://HOST[:PORT][/PATH]".into()));
        };
        let port = parsed.port_or_known_default();
        let list = self.list(target);
        if let Some(kind) = reserved(&host) {
            if list.iter().any(|a| a.names(&host) && a.matches(scheme, &host, port)) {
                return Ok(());
            }
            let message = format!("host {host} is {kind}, which the operator never reaches unless the platform lists that exact host");
            return Err(refuse(message, format!("name a host the platform allows ({}), {}", self.shown(target), target.alternative())));
        }
        if list.iter().any(|a| a.matches(scheme, &host, port)) {
            return Ok(());
        }
        Err(self.not_listed(target, scheme, &host, port))
    }

    fn not_listed(&self, target: Target, scheme: &str, host: &Host<String>, port: Option<u16>) -> Refusal {
        let default = if scheme == "https" { 443 } else { 80 };
        let shown = port.filter(|&p| p != default).map_or_else(|| host.to_string(), |p| format!("{host}:{p}"));
        let message = format!("{scheme}://{shown} is not among the {} this operator may reach ({})", target.what(), self.shown(target));
        let two_labels = matches!(host, Host::Domain(d) if d.split('.').count() == 2);
        let fix = if target == Target::Prometheus && two_labels {
            format!(
                "write the Service's name in full, {scheme}://{host}.svc (a SERVICE.NAMESPACE name cannot be told from a public domain), or ask the platform team to add it with {}",
                target.setting()
            )
        } else {
            format!("ask the platform team to add it with {}, {}", target.setting(), target.alternative())
        };
        Refusal { field: target.field(), message, fix }
    }

    /// The list as configured, for a refusal's text.
    fn shown(&self, target: Target) -> String {
        let list = self.list(target);
        if list.is_empty() { "none".into() } else { list.iter().map(|a| a.text.as_str()).collect::<Vec<_>>().join(", ") }
    }
}

fn trim_dot(host: Host<String>) -> Host<String> {
    match host {
        Host::Domain(d) => Host::Domain(d.trim_end_matches('.').to_owned()),
        other => other,
    }
}

/// What kind of address the operator never reaches by a wildcard, if `host` is one.
fn reserved(host: &Host<String>) -> Option<&'static str> {
    let ip = match host {
        Host::Domain(d) if d == "localhost" || d.ends_with(".localhost") => return Some("a loopback name"),
        Host::Domain(d) if METADATA_NAMES.contains(&d.as_str()) => return Some("a cloud metadata service's name"),
        Host::Domain(_) => return None,
        Host::Ipv4(v4) => IpAddr::V4(*v4),
        Host::Ipv6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(*v6), IpAddr::V4),
    };
    if METADATA_ADDRESSES.contains(&ip) {
        return Some("a cloud metadata address");
    }
    match ip {
        IpAddr::V4(v4) if v4.is_loopback() => Some("a loopback address"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("a link-local address (where cloud metadata services answer)"),
        IpAddr::V4(v4) if v4.octets()[0] == 0 || v4.is_broadcast() => Some("an unspecified or broadcast address"),
        IpAddr::V6(v6) if v6.is_loopback() => Some("a loopback address"),
        IpAddr::V6(v6) if v6.is_unspecified() => Some("an unspecified address"),
        IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => Some("a link-local address"),
        _ => None,
    }
}

/// Whether `to` is on the same origin (scheme, host, port) as `from`: the only redirects the
/// operator's clients follow to a remote the policy allowed.
pub fn same_origin(from: &str, to: &str) -> bool {
    match (Url::parse(from), Url::parse(to)) {
        (Ok(a), Ok(b)) => a.origin() == b.origin() && a.origin().is_tuple(),
        _ => false,
    }
}

/// Whether the fetch Job follows a redirect from `from` to `to`: on the same origin, or to an
/// https host that is no reserved address (the Hub serves large files from its CDN, on other
/// hosts). Never to plain http off the origin, never to loopback, link-local or metadata hosts.
/// The Job runs in the tenant's namespace with a pod's reach, and its report shows no answer's
/// content; the operator's own reads follow no redirect off the origin (`same_origin`).
pub fn fetch_redirect_allowed(from: &str, to: &str) -> bool {
    if same_origin(from, to) {
        return true;
    }
    let Ok(to) = Url::parse(to) else { return false };
    let host = to.host().map(|h| trim_dot(h.to_owned()));
    to.scheme() == "https" && to.username().is_empty() && to.password().is_none() && host.is_some_and(|h| reserved(&h).is_none())
}

#[cfg(test)]
mod tests;
