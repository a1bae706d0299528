//! Which SGLang release a PDDeployment's engines run, and what pd-operator knows of each
//! supported release. Every release-dependent fact (the option table, flags that exist only from
//! some release on, rules whose text a release raises) is keyed by [`Release`] here or at its
//! one use. Pure: spec in, release out.

use std::fmt;

use pd_api::{DEFAULT_SGLANG_IMAGE, DEFAULT_SGLANG_REPOSITORY, EngineSpec, EngineType, PDDeploymentSpec};

/// An SGLang release whose start-up rules, option table and bootstrap protocol pd-operator models.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Release {
    V0_5_21,
    V0_5_22,
    V0_5_23,
}

impl Release {
    /// Oldest first.
    pub const SUPPORTED: [Release; 3] = [Release::V0_5_21, Release::V0_5_22, Release::V0_5_23];
    /// The release the default image runs, and the one an unknown image is judged with.
    pub const REFERENCE: Release = Release::V0_5_23;

    pub fn as_str(self) -> &'static str {
        match self {
            Release::V0_5_21 => "0.5.21",
            Release::V0_5_22 => "0.5.22",
            Release::V0_5_23 => "0.5.23",
        }
    }

    /// `sglang serve`'s options in this release as its own argparse parser holds them: per
    /// action its option strings, destination, value count, conversion and choices (the file's
    /// header says how; tests/parity/dump_flags.py writes each file from the release's wheel,
    /// `sglang_args` reads it).
    pub fn option_table(self) -> &'static str {
        match self {
            Release::V0_5_21 => include_str!("sglang_flags/0.5.21.txt"),
            Release::V0_5_22 => include_str!("sglang_flags/0.5.22.txt"),
            Release::V0_5_23 => include_str!("sglang_flags/0.5.23.txt"),
        }
    }

    /// Attention data parallelism has its own width (`--attn-dp-size`) from 0.5.22 on; before,
    /// `--dp-size N --enable-dp-attention` made N attention-DP groups and no replicas.
    pub fn has_attn_dp_size(self) -> bool {
        self >= Release::V0_5_22
    }

    /// `--disaggregation-decode-allocation-policy` exists from 0.5.22 on; 0.5.21 always
    /// allocates the decode's KV when the request arrives (what 0.5.22 calls `early`).
    pub fn has_decode_allocation_policy(self) -> bool {
        self >= Release::V0_5_22
    }

    /// Whether this is the reference release (a rendered decode topology names only others).
    pub fn is_reference(&self) -> bool {
        *self == Release::REFERENCE
    }

    /// Keys of the prefill's topology body (`PrefillServerInfo`'s fields) this release's decode
    /// does not know: 0.5.22 added `decode_allocation_policy`, 0.5.23 `kv_layout` and
    /// `enable_kv_cache_sharding`. A body carrying one is refused by that decode.
    pub fn unknown_topology_keys(self) -> &'static [&'static str] {
        match self {
            Release::V0_5_21 => &["kv_layout", "decode_allocation_policy", "enable_kv_cache_sharding"],
            Release::V0_5_22 => &["kv_layout", "enable_kv_cache_sharding"],
            Release::V0_5_23 => &[],
        }
    }

    /// `--enable-kv-cache-sharding` exists from 0.5.22 on.
    pub fn has_kv_cache_sharding(self) -> bool {
        self >= Release::V0_5_22
    }

    fn nearest(v: Version) -> Release {
        let oldest = Release::SUPPORTED[0];
        if v < Version::of(oldest) { oldest } else { Release::REFERENCE }
    }
}

impl std::str::FromStr for Release {
    type Err = String;
    /// A supported release, exactly (`0.5.21`): what a rendered decode topology names.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Release::SUPPORTED
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("SGLang {s} is not a release pd-operator models ({})", supported_list()))
    }
}

impl serde::Serialize for Release {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Release {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// SGLang's rules that not every supported release raises, by rule id (`validate` and the
/// handshake core), with the first and the last release that does. A rule not listed holds for
/// every supported release.
/// (From SGLang's sources: the start-up hooks under `srt/arg_groups` and the decode's checks in
/// `srt/disaggregation/common/conn.py` of each release.)
const RULE_RELEASES: &[(&str, Release, Release)] = &[
    // Start-up: 0.5.22 added the DCP/prefill-CP and DSA DCP refusals and KV-cache sharding
    // (0.5.21 has no `--enable-kv-cache-sharding`; `release-flag` refuses it there).
    ("dcp-with-prefill-cp", Release::V0_5_22, Release::V0_5_23),
    ("dsa-dcp-pd", Release::V0_5_22, Release::V0_5_23),
    ("sharding-prefill-only", Release::V0_5_22, Release::V0_5_23),
    ("sharding-layout", Release::V0_5_22, Release::V0_5_23),
    ("sharding-with-dcp", Release::V0_5_22, Release::V0_5_23),
    ("sharding-backend", Release::V0_5_22, Release::V0_5_23),
    ("sharding-staging", Release::V0_5_22, Release::V0_5_23),
    ("sharding-speculative", Release::V0_5_22, Release::V0_5_23),
    ("sharding-page-size", Release::V0_5_22, Release::V0_5_23),
    // 0.5.22 shards only with the Python radix tree core; 0.5.23 dropped the requirement.
    ("sharding-tree-core", Release::V0_5_22, Release::V0_5_22),
    // The decode's handshake: MXFP8 attention TP and the allocation policy came with 0.5.22,
    // MiniMax attention TP, the KV layout and the sharding checks with 0.5.23.
    ("mxfp8-equal-attn-tp", Release::V0_5_22, Release::V0_5_23),
    ("allocation-policy-mismatch", Release::V0_5_22, Release::V0_5_23),
    ("prefill-complete-peer", Release::V0_5_22, Release::V0_5_23),
    ("prefill-complete-startup", Release::V0_5_22, Release::V0_5_23),
    ("minimax-equal-attn-tp", Release::V0_5_23, Release::V0_5_23),
    ("kv-layout-mismatch", Release::V0_5_23, Release::V0_5_23),
    ("decode-dcp-prefill-sharding", Release::V0_5_23, Release::V0_5_23),
    ("mla-sharding-equal-tp", Release::V0_5_23, Release::V0_5_23),
];

/// Whether SGLang `release` raises the rule `rule` (an id of `validate`'s findings).
pub fn rule_holds(rule: &str, release: Release) -> bool {
    RULE_RELEASES.iter().find(|(r, ..)| *r == rule).is_none_or(|(_, first, last)| (*first..=*last).contains(&release))
}

/// `major.minor.patch` of a release string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Version(u32, u32, u32);

impl Version {
    fn of(r: Release) -> Version {
        Version::parse(r.as_str()).expect("supported releases are well-formed")
    }

    /// `0.5.21`, `v0.5.21`, and forms with a suffix such as `0.5.21.post1` or `v0.5.21-cu129`.
    fn parse(s: &str) -> Option<Version> {
        let s = s.strip_prefix('v').unwrap_or(s);
        let mut parts = s.splitn(3, '.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let rest = parts.next()?;
        let digits = rest.find(|c: char| !c.is_ascii_digit()).map_or(rest, |end| &rest[..end]);
        let patch = digits.parse().ok()?;
        let suffix = &rest[digits.len()..];
        (suffix.is_empty() || suffix.starts_with(['.', '-', '+', '_'])).then_some(Version(major, minor, patch))
    }
}

/// How the release was told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `spec.engine.version`.
    Version,
    /// The tag of `spec.engine.image` (or of the default image).
    ImageTag,
    /// The stand-in speaks the reference release unless `spec.engine.version` says otherwise.
    StandIn,
    /// Not told, or not supported: judged with `release`, and `why` says so.
    Assumed { why: String },
}

/// The release a PDDeployment's engines are judged, rendered and handshaken with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineRelease {
    pub release: Release,
    pub source: Source,
}

/// `spec.engine.version` that is not a release number.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("spec.engine.version `{0}` is not an SGLang release number such as 0.5.23")]
pub struct BadVersion(pub String);

/// The release `spec.engine` runs: `version` if set, else the image tag's; an image whose tag
/// names no release (a digest, `latest`, a custom build) or an unsupported release is judged
/// with the nearest supported one, and `source` says so.
pub fn of_engine(engine: &EngineSpec) -> Result<EngineRelease, BadVersion> {
    if let Some(v) = &engine.version {
        let parsed = Version::parse(v.trim()).ok_or_else(|| BadVersion(v.clone()))?;
        return Ok(supported_or_nearest(parsed, Source::Version, || format!("spec.engine.version {v}")));
    }
    if engine.engine_type == EngineType::Sim {
        return Ok(EngineRelease { release: Release::REFERENCE, source: Source::StandIn });
    }
    let image = engine.image.as_deref().unwrap_or(DEFAULT_SGLANG_IMAGE);
    Ok(match image_tag(image).and_then(Version::parse) {
        Some(v) => supported_or_nearest(v, Source::ImageTag, || format!("image {image}")),
        None => EngineRelease {
            release: Release::REFERENCE,
            source: Source::Assumed { why: format!("the SGLang release of image `{image}` cannot be told from its tag") },
        },
    })
}

/// The release a spec is rendered and judged with: [`of_engine`]'s, and the reference release
/// for a version that does not parse (validate reports that as an error of its own).
pub fn release_of(spec: &PDDeploymentSpec) -> Release {
    of_engine(&spec.engine).map_or(Release::REFERENCE, |r| r.release)
}

fn supported_or_nearest(v: Version, source: Source, what: impl Fn() -> String) -> EngineRelease {
    match Release::SUPPORTED.into_iter().find(|r| Version::of(*r) == v) {
        Some(release) => EngineRelease { release, source },
        None => EngineRelease {
            release: Release::nearest(v),
            source: Source::Assumed {
                why: format!("{} names SGLang {}.{}.{}, which pd-operator's rules do not cover", what(), v.0, v.1, v.2),
            },
        },
    }
}

/// The image an `sglang` engine runs when `spec.engine.image` is unset: SGLang's own image of
/// `spec.engine.version`, else of the reference release.
pub fn default_image(engine: &EngineSpec) -> String {
    match engine.version.as_deref().map(str::trim) {
        Some(v) => format!("{DEFAULT_SGLANG_REPOSITORY}:v{}", v.strip_prefix('v').unwrap_or(v)),
        None => DEFAULT_SGLANG_IMAGE.to_owned(),
    }
}

/// The tag of an image reference (`repo:tag`, `host:port/repo:tag`), not of a digest.
fn image_tag(image: &str) -> Option<&str> {
    let name = image.split_once('@').map_or(image, |(n, _)| n);
    let last = name.rsplit('/').next()?;
    last.split_once(':').map(|(_, tag)| tag)
}

/// `0.5.21, 0.5.22, 0.5.23`.
pub fn supported_list() -> String {
    Release::SUPPORTED.map(Release::as_str).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(image: Option<&str>, version: Option<&str>) -> EngineSpec {
        EngineSpec { image: image.map(Into::into), version: version.map(Into::into), ..EngineSpec::default() }
    }

    #[test]
    fn the_release_comes_from_the_version_then_the_image_tag() {
        let of = |image, version| of_engine(&engine(image, version)).unwrap();
        assert_eq!(of(None, None), EngineRelease { release: Release::V0_5_23, source: Source::ImageTag });
        assert_eq!(of(Some("lmsysorg/sglang:v0.5.21"), None).release, Release::V0_5_21);
        assert_eq!(of(Some("registry:5000/team/sglang:v0.5.22-cu129"), None).release, Release::V0_5_22);
        assert_eq!(of(Some("lmsysorg/sglang:v0.5.22.post1"), None).release, Release::V0_5_22);
        assert_eq!(
            of(Some("lmsysorg/sglang:v0.5.21"), Some("0.5.22")),
            EngineRelease { release: Release::V0_5_22, source: Source::Version }
        );
    }

    #[test]
    fn the_default_image_follows_the_version() {
        assert_eq!(default_image(&engine(None, None)), DEFAULT_SGLANG_IMAGE);
        assert_eq!(default_image(&engine(None, Some("0.5.21"))), "lmsysorg/sglang:v0.5.21");
        assert_eq!(default_image(&engine(None, Some("v0.5.22"))), "lmsysorg/sglang:v0.5.22");
        let told = of_engine(&engine(Some(&default_image(&engine(None, Some("0.5.21")))), None)).unwrap();
        assert_eq!(told.release, Release::V0_5_21);
    }

    #[test]
    fn an_image_that_names_no_supported_release_is_judged_with_the_nearest_and_says_so() {
        let of = |image, version| of_engine(&engine(image, version)).unwrap();
        for (image, judged) in [
            ("lmsysorg/sglang:latest", Release::V0_5_23),
            ("lmsysorg/sglang@sha256:0123", Release::V0_5_23),
            ("localhost:5000/sglang", Release::V0_5_23),
            ("lmsysorg/sglang:v0.5.19", Release::V0_5_21),
            ("lmsysorg/sglang:v0.6.0", Release::V0_5_23),
            ("lmsysorg/sglang:v0.5.210", Release::V0_5_23),
        ] {
            let r = of(Some(image), None);
            assert_eq!(r.release, judged, "{image}");
            assert!(matches!(&r.source, Source::Assumed { why } if why.contains(image)), "{image}: {:?}", r.source);
        }
        assert!(matches!(of(None, Some("0.5.15")).source, Source::Assumed { .. }));
    }

    #[test]
    fn a_version_that_is_no_release_number_is_refused() {
        for bad in ["banana", "0.5", "0.5.x", "0.5.21rc"] {
            assert_eq!(of_engine(&engine(None, Some(bad))), Err(BadVersion(bad.into())), "{bad}");
        }
    }

    #[test]
    fn the_stand_in_speaks_the_reference_release_unless_told() {
        let sim = EngineSpec { engine_type: EngineType::Sim, ..EngineSpec::default() };
        assert_eq!(of_engine(&sim).unwrap().release, Release::REFERENCE);
        let older = EngineSpec { version: Some("0.5.21".into()), ..sim };
        assert_eq!(of_engine(&older).unwrap().release, Release::V0_5_21);
    }

    #[test]
    fn rules_hold_from_their_first_to_their_last_release() {
        assert!(!rule_holds("dcp-with-prefill-cp", Release::V0_5_21));
        assert!(rule_holds("dcp-with-prefill-cp", Release::V0_5_22));
        assert!(!rule_holds("kv-layout-mismatch", Release::V0_5_22));
        assert!(rule_holds("page-size-mismatch", Release::V0_5_21), "an unlisted rule holds everywhere");
        assert!(rule_holds("sharding-tree-core", Release::V0_5_22));
        assert!(!rule_holds("sharding-tree-core", Release::V0_5_23), "0.5.23 dropped it");
    }

    #[test]
    fn every_option_table_is_its_own_release_s() {
        for r in Release::SUPPORTED {
            let header = r.option_table().lines().next().unwrap();
            assert!(header.contains(&format!("sglang {r} ")), "{r}: {header}");
        }
    }
}
