//! `pd-sim bench --rate R`: the open-loop generator of the planner benchmark (`make
//! bench-planner`). Requests arrive as a Poisson process at R a second, each on a connection of
//! its own and streamed, whatever the server's pace: a closed loop slows down with the server and
//! hides the queue a population of clients builds. The mix shifts from kind A (long prompts, short
//! answers: prefill's load) to kind B (short prompts, long answers: decode's) between `--shift
//! FROM:TO` seconds. Each request counts in the window it started in: TTFT p90, ITL p90 and
//! failures as the client saw them. Prints one JSON line.

use std::io::Write;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};

use super::SimError;
use super::loadgen::{self, Sample};

/// One kind of request: prompt and answer lengths in the stand-in's tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Kind {
    pub prompt_tokens: u64,
    pub max_tokens: u64,
}

/// Long prompts, short answers.
pub const KIND_A: Kind = Kind { prompt_tokens: 2004, max_tokens: 8 };
/// Short prompts, long answers.
pub const KIND_B: Kind = Kind { prompt_tokens: 204, max_tokens: 256 };

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub target: String,
    pub model: String,
    /// Arrivals a second.
    pub rate: f64,
    /// How long requests are sent.
    pub seconds: f64,
    /// The reporting window.
    pub window: f64,
    /// Kind B's share is 0 before the first, 1 after the second, linear between.
    pub shift: (f64, f64),
    pub a: Kind,
    pub b: Kind,
}

fn kind(flag: &str, v: &str) -> Result<Kind, SimError> {
    let bad = || SimError::Flags(format!("{flag} expects PROMPT_TOKENS:MAX_TOKENS, got {v:?}"));
    let (p, m) = v.split_once(':').ok_or_else(bad)?;
    Ok(Kind { prompt_tokens: p.parse().map_err(|_| bad())?, max_tokens: m.parse().map_err(|_| bad())? })
}

fn positive(flag: &str, v: &str) -> Result<f64, SimError> {
    v.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x > 0.0)
        .ok_or_else(|| SimError::Flags(format!("{flag} expects a positive number, got {v:?}")))
}

pub fn parse(args: &[String]) -> Result<Config, SimError> {
    let mut c = Config {
        target: format!("127.0.0.1:{}", pd_api::DEFAULT_HTTP_PORT),
        model: "default".into(),
        rate: 1.0,
        seconds: 60.0,
        window: 15.0,
        shift: (0.0, 0.0),
        a: KIND_A,
        b: KIND_B,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().ok_or_else(|| SimError::Flags(format!("{a} expects a value")))?;
        match a.as_str() {
            "--target" => c.target.clone_from(v),
            "--model" => c.model.clone_from(v),
            "--rate" => c.rate = positive(a, v)?,
            "--seconds" => c.seconds = positive(a, v)?,
            "--window-seconds" => c.window = positive(a, v)?,
            "--shift" => {
                let bad = || SimError::Flags(format!("--shift expects FROM:TO seconds with FROM <= TO, got {v:?}"));
                let (f, t) = v.split_once(':').ok_or_else(bad)?;
                let (f, t): (f64, f64) = (f.parse().map_err(|_| bad())?, t.parse().map_err(|_| bad())?);
                c.shift = if f <= t && f >= 0.0 { (f, t) } else { return Err(bad()) };
            }
            "--kind-a" => c.a = kind(a, v)?,
            "--kind-b" => c.b = kind(a, v)?,
            _ => {
                return Err(SimError::Flags(format!(
                    "unknown flag {a} (open loop: --rate, --seconds, --window-seconds, --shift, --kind-a, --kind-b, --target, --model)"
                )));
            }
        }
    }
    Ok(c)
}

/// Kind B's share of the arrivals at `t` seconds.
pub fn share_b(shift: (f64, f64), t: f64) -> f64 {
    let (from, to) = shift;
    if t <= from {
        0.0
    } else if t >= to {
        1.0
    } else {
        (t - from) / (to - from)
    }
}

/// A chat body the stand-in counts as `k.prompt_tokens` prompt tokens (its count: a message's
/// content bytes plus 16 template bytes, over 4).
fn body(c: &Config, k: Kind) -> Bytes {
    let bytes = usize::try_from((k.prompt_tokens * 4).saturating_sub(16)).unwrap_or(usize::MAX);
    let prompt: String = "lorem ipsum ".chars().cycle().take(bytes).collect();
    let v = json!({"model": c.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": k.max_tokens, "stream": true});
    Bytes::from(v.to_string())
}

/// A finished request: when it started (seconds from the run's start), which kind, how it went.
pub struct Done {
    pub started: f64,
    pub b: bool,
    pub sample: Sample,
}

/// Sends the run's arrivals and waits for every answer.
async fn send_all(c: &Config) -> Vec<Done> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    let mut at = 0.0;
    loop {
        // Exponential gaps: a Poisson process at `rate`.
        at += -(1.0 - rand::random::<f64>()).ln() / c.rate;
        if at >= c.seconds {
            break;
        }
        tokio::time::sleep_until((start + Duration::from_secs_f64(at)).into()).await;
        let b = rand::random::<f64>() < share_b(c.shift, at);
        let (target, payload) = (c.target.clone(), body(c, if b { c.b } else { c.a }));
        tasks.push(tokio::spawn(async move {
            let sample = loadgen::one(&mut None, &target, payload, true).await;
            Done { started: at, b, sample }
        }));
    }
    let mut done = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Ok(d) = t.await {
            done.push(d);
        }
    }
    done
}

/// The run's summary: totals and one entry per window.
pub fn report(c: &Config, done: &[Done]) -> Value {
    let windows = (c.seconds / c.window).ceil().max(1.0);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = windows as usize;
    let mut per: Vec<Vec<&Done>> = vec![Vec::new(); n];
    for d in done {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let i = ((d.started / c.window) as usize).min(n - 1);
        per[i].push(d);
    }
    let round = |x: f64| (x * 1e4).round() / 1e4;
    let entries: Vec<Value> = per.iter().enumerate().map(|(i, w)| window(c, i, w, round)).collect();
    let failed = done.iter().filter(|d| !d.sample.ok).count();
    let errors = loadgen::error_counts(done.iter().map(|d| &d.sample));
    json!({
        "rate": c.rate, "seconds": c.seconds, "window_seconds": c.window, "shift": [c.shift.0, c.shift.1],
        "requests": done.len(), "failed": failed, "errors": errors, "windows": entries,
    })
}

fn window(c: &Config, i: usize, w: &[&Done], round: impl Fn(f64) -> f64) -> Value {
    let ok: Vec<&&Done> = w.iter().filter(|d| d.sample.ok).collect();
    let mut ttft: Vec<f64> = ok.iter().map(|d| d.sample.ttft).collect();
    let mut itl: Vec<f64> = ok.iter().flat_map(|d| d.sample.itl.iter().copied()).collect();
    #[allow(clippy::cast_precision_loss)]
    let start = i as f64 * c.window;
    let p90 = |v: &mut Vec<f64>| (!v.is_empty()).then(|| round(loadgen::pct(v, 90)));
    json!({
        "start_s": start, "share_b": round(share_b(c.shift, start + c.window / 2.0)),
        "requests": w.len(), "kind_b": w.iter().filter(|d| d.b).count(), "failed": w.len() - ok.len(),
        "ttft_p90_s": p90(&mut ttft), "itl_p90_s": p90(&mut itl),
    })
}

/// Runs the open loop and prints the summary line.
pub async fn run(args: &[String]) -> Result<(), SimError> {
    let c = parse(args)?;
    loadgen::reachable(&c.target).await;
    let done = send_all(&c).await;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", report(&c, &done)).and_then(|()| stdout.flush()).map_err(SimError::Output)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_mix_shifts_linearly_between_its_two_times() {
        assert_eq!(share_b((60.0, 180.0), 0.0), 0.0);
        assert_eq!(share_b((60.0, 180.0), 120.0), 0.5);
        assert_eq!(share_b((60.0, 180.0), 400.0), 1.0);
        assert_eq!(share_b((0.0, 0.0), 0.0), 0.0, "a step at 0: all kind A until then");
        assert_eq!(share_b((0.0, 0.0), 0.1), 1.0);
    }

    #[test]
    fn flags_are_read_and_bad_ones_named() {
        let c = parse(&args(&["--rate", "6", "--seconds", "360", "--shift", "60:180", "--kind-b", "100:300"])).unwrap();
        assert_eq!((c.rate, c.seconds, c.shift, c.b), (6.0, 360.0, (60.0, 180.0), Kind { prompt_tokens: 100, max_tokens: 300 }));
        for (bad, says) in [
            (&["--rate", "0"][..], "--rate expects a positive number"),
            (&["--shift", "9:3"][..], "--shift expects FROM:TO"),
            (&["--kind-a", "12"][..], "--kind-a expects PROMPT_TOKENS:MAX_TOKENS"),
            (&["--concurrency", "8"][..], "unknown flag --concurrency"),
        ] {
            let e = parse(&args(bad)).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn a_body_is_counted_as_its_kinds_prompt_tokens_by_the_stand_in() {
        let c = parse(&[]).unwrap();
        for k in [KIND_A, KIND_B] {
            let v: Value = serde_json::from_slice(&body(&c, k)).unwrap();
            let r = super::super::openai::parse(super::super::openai::Api::Chat, &v).unwrap();
            assert_eq!((r.prompt_tokens, r.max_tokens, r.stream), (k.prompt_tokens, k.max_tokens, true));
        }
    }

    #[test]
    fn each_request_counts_in_the_window_it_started_in() {
        let c = parse(&args(&["--seconds", "30", "--window-seconds", "15", "--shift", "15:15"])).unwrap();
        let ok = |ttft: f64, itl: &[f64]| Sample { ok: true, ttft, itl: itl.to_vec(), ..Sample::default() };
        let done = vec![
            Done { started: 1.0, b: false, sample: ok(0.5, &[0.01]) },
            Done { started: 14.9, b: false, sample: ok(0.7, &[0.02]) },
            Done { started: 20.0, b: true, sample: Sample { error: Some("status 503 x".into()), ..Sample::default() } },
        ];
        let r = report(&c, &done);
        assert_eq!((r["requests"].as_u64(), r["failed"].as_u64()), (Some(3), Some(1)));
        assert_eq!(r["errors"]["status 503 x"], 1);
        let w = r["windows"].as_array().unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!((w[0]["requests"].as_u64(), w[0]["ttft_p90_s"].as_f64(), w[0]["itl_p90_s"].as_f64()), (Some(2), Some(0.7), Some(0.02)));
        assert_eq!((w[1]["failed"].as_u64(), w[1]["kind_b"].as_u64(), w[1]["share_b"].as_f64()), (Some(1), Some(1), Some(1.0)));
        assert!(w[1]["ttft_p90_s"].is_null(), "no answer in the window: no figure");
    }
}
