//! The planner's own scrape of the engines, for `spec.autoscaling` without a Prometheus: each
//! engine leader's `/metrics` (Prometheus' text format, as SGLang's prometheus_client writes it)
//! read into a sample a pass, and from the samples of the last `metricsWindowSeconds` the figures
//! `promql` asks Prometheus for: the p90 of the histogram buckets' increase summed over the role's
//! pods (Prometheus' `histogram_quantile` over `sum by (le)`, a counter reset counted as a restart
//! from zero), the queues' sum and the mean KV usage of the latest sample. Pure: the controller
//! fetches the texts and keeps the history.

use std::collections::{BTreeMap, VecDeque};

use jiff::{SignedDuration, Timestamp};
use pd_api::{Observed, Role};
use thiserror::Error;

use super::promql::{ITL, QUANTILE, QUEUED, RUNNING, TOKEN_USAGE, TTFT};

/// Where SGLang serves its metrics on the engine's HTTP port (with `--enable-metrics`).
pub const METRICS_PATH: &str = "/metrics";

#[derive(Debug, Error, PartialEq)]
pub enum ScrapeError {
    #[error("line {line} is not in Prometheus' text format: {text:?}")]
    Line { line: usize, text: String },
}

/// One histogram: the cumulative count of each bucket by its upper bound (`le`), sorted by bound.
/// Bounds are kept as numbers (a few bytes each: the operator keeps a window of these per engine).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Buckets(Vec<(f64, f64)>);

impl Buckets {
    fn add(&mut self, le: f64, count: f64) {
        match self.0.binary_search_by(|(b, _)| b.total_cmp(&le)) {
            Ok(i) => self.0[i].1 += count,
            Err(i) => self.0.insert(i, (le, count)),
        }
    }

    fn count(&self, le: f64) -> f64 {
        self.0.binary_search_by(|(b, _)| b.total_cmp(&le)).map_or(0.0, |i| self.0[i].1)
    }

    /// The observations (the `+Inf` bucket).
    fn total(&self) -> f64 {
        self.count(f64::INFINITY)
    }

    /// The increase since `base`: the difference, or the whole count after a counter reset (a
    /// restarted engine counts from zero), as Prometheus' `increase` reads a reset.
    fn since(&self, base: Option<&Buckets>) -> Buckets {
        match base {
            Some(b) if self.0.iter().all(|&(le, c)| c >= b.count(le)) => {
                Buckets(self.0.iter().map(|&(le, c)| (le, c - b.count(le))).collect())
            }
            _ => self.clone(),
        }
    }

    /// The `q` quantile as Prometheus' `histogram_quantile` computes it: linear interpolation
    /// within the bucket the rank falls in, the lowest bucket starting at 0, a rank in the `+Inf`
    /// bucket answered with the highest finite bound; `None` without observations or without a
    /// `+Inf` bucket.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let mut bounds = self.0.clone();
        // Counts made monotonic, as Prometheus does for series scraped at slightly different times.
        let mut highest = 0.0_f64;
        for b in &mut bounds {
            highest = highest.max(b.1);
            b.1 = highest;
        }
        let &(last_bound, observations) = bounds.last()?;
        if bounds.len() < 2 || last_bound != f64::INFINITY || observations <= 0.0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        let rank = q * observations;
        let b = bounds.iter().position(|&(_, c)| c >= rank)?;
        if b == bounds.len() - 1 {
            return Some(bounds[b - 1].0);
        }
        if b == 0 && bounds[0].0 <= 0.0 {
            return Some(bounds[0].0);
        }
        let (start, below) = if b == 0 { (0.0, 0.0) } else { bounds[b - 1] };
        let (end, count) = bounds[b];
        Some(start + (end - start) * (rank - below) / (count - below))
    }
}

/// A gauge over the series of one pod: its sum and how many series.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Gauge {
    pub sum: f64,
    pub series: u32,
}

impl Gauge {
    fn add(&mut self, other: Gauge) {
        self.sum += other.sum;
        self.series += other.series;
    }
}

/// What the planner reads of one engine's `/metrics`, summed over its series (ranks).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodMetrics {
    pub ttft: Buckets,
    pub itl: Buckets,
    pub queued: Gauge,
    pub running: Gauge,
    pub token_usage: Gauge,
}

/// Reads the families the planner uses from a text exposition; the rest is skipped.
pub fn parse(text: &str) -> Result<PodMetrics, ScrapeError> {
    let mut out = PodMetrics::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || ScrapeError::Line { line: i + 1, text: crate::remote::excerpt(raw) };
        let (name, labels, value) = split_sample(line).ok_or_else(bad)?;
        let gauge = Gauge { sum: value, series: 1 };
        match (name.strip_suffix("_bucket"), name) {
            (Some(TTFT), _) => out.ttft.add(label(labels, "le").and_then(parse_number).ok_or_else(bad)?, value),
            (Some(ITL), _) => out.itl.add(label(labels, "le").and_then(parse_number).ok_or_else(bad)?, value),
            (_, QUEUED) => out.queued.add(gauge),
            (_, RUNNING) => out.running.add(gauge),
            (_, TOKEN_USAGE) => out.token_usage.add(gauge),
            _ => {}
        }
    }
    Ok(out)
}

/// `name{labels} value [timestamp]` → name, the text between the braces, the value.
fn split_sample(line: &str) -> Option<(&str, &str, f64)> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let (name, rest) = line.split_at(name_end);
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inner) => {
            let close = closing_brace(inner)?;
            (&inner[..close], &inner[close + 1..])
        }
        None => ("", rest),
    };
    let value = parse_number(rest.split_whitespace().next()?)?;
    (!name.is_empty()).then_some((name, labels, value))
}

/// The index of the `}` closing a label set, skipping quoted values (with `\"` escapes).
fn closing_brace(inner: &str) -> Option<usize> {
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in inner.char_indices() {
        match (quoted, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => quoted = !quoted,
            (false, _, '}') => return Some(i),
            _ => {}
        }
    }
    None
}

/// The value of label `key` in a label set (`le="0.5",model_name="x"`); values the planner reads
/// carry no escapes.
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let start = labels.match_indices(&format!("{key}=\"")).find(|(i, _)| *i == 0 || labels[..*i].ends_with(','))?.0;
    let value = &labels[start + key.len() + 2..];
    Some(&value[..value.find('"')?])
}

/// A sample value: a float, `+Inf`, `-Inf` or `NaN` as Prometheus writes them.
fn parse_number(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

/// One pass's scrape: each engine leader's metrics, by role and pod name.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub at: Timestamp,
    pub pods: BTreeMap<(Role, String), PodMetrics>,
}

/// The samples of one PDDeployment, oldest first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History(VecDeque<Sample>);

impl History {
    /// Adds a pass's sample and forgets those older than `window`: no later pass reads them. Of
    /// prefill pods only the gauges are kept: latencies are read on decode (see `observed`).
    pub fn push(&mut self, mut sample: Sample, window: SignedDuration) {
        for ((_, _), m) in sample.pods.iter_mut().filter(|((r, _), _)| *r == Role::Prefill) {
            (m.ttft, m.itl) = (Buckets::default(), Buckets::default());
        }
        let cutoff = sample.at - window;
        self.0.push_back(sample);
        while self.0.front().is_some_and(|s| s.at < cutoff) {
            self.0.pop_front();
        }
    }

    /// When the newest sample was taken.
    pub fn latest(&self) -> Option<Timestamp> {
        self.0.back().map(|s| s.at)
    }

    /// Both roles' figures: latencies over the increase from the oldest sample within `window`
    /// (none with a single sample), gauges from the newest. Latencies are read on decode for both
    /// roles, as `promql::query` reads them.
    pub fn observed(&self, window: SignedDuration) -> (Observed, Observed) {
        let Some(now) = self.0.back() else { return Default::default() };
        let base = self.0.iter().find(|s| s.at >= now.at - window && s.at < now.at);
        let quantile = |pick: fn(&PodMetrics) -> &Buckets| {
            let base = base?;
            let mut sum = Buckets::default();
            for ((_, pod), m) in now.pods.iter().filter(|((r, _), _)| *r == Role::Decode) {
                let before = base.pods.get(&(Role::Decode, pod.clone())).map(pick);
                for (le, c) in pick(m).since(before).0 {
                    sum.add(le, c);
                }
            }
            (sum.total() > 0.0).then(|| sum.quantile(QUANTILE)).flatten()
        };
        let (ttft, itl) = (quantile(|m| &m.ttft), quantile(|m| &m.itl));
        let role = |role: Role| {
            let mut g = [Gauge::default(); 3];
            for m in now.pods.iter().filter(|((r, _), _)| *r == role).map(|(_, m)| m) {
                g[0].add(m.queued);
                g[1].add(m.running);
                g[2].add(m.token_usage);
            }
            let sum = |g: Gauge| (g.series > 0).then_some(g.sum);
            Observed {
                ttft_p90_seconds: ttft.filter(|_| role == Role::Prefill),
                itl_p90_seconds: itl.filter(|_| role == Role::Decode),
                queued_requests: sum(g[0]),
                running_requests: sum(g[1]),
                kv_usage: (role == Role::Decode && g[2].series > 0).then(|| g[2].sum / f64::from(g[2].series)),
            }
        };
        (role(Role::Prefill), role(Role::Decode))
    }
}

#[cfg(test)]
mod tests;
