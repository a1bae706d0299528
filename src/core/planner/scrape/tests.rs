use super::*;

/// An engine's exposition as SGLang's prometheus_client writes it: two TP ranks, and TTFT split by
/// `is_streaming` as 0.5.23's `metrics_collector.py` splits it (the planner sums every series).
fn exposition(ttft: [f64; 4], queued: [f64; 2], usage: [f64; 2]) -> String {
    let mut s = String::from(
        "# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.\n\
         # TYPE sglang:time_to_first_token_seconds histogram\n",
    );
    for (rank, streaming, share) in [(0, "true", 0.75), (0, "false", 0.25), (1, "true", 0.0)] {
        for (le, c) in ["0.1", "0.5", "1.0", "+Inf"].iter().zip(ttft) {
            s += &format!(
                "sglang:time_to_first_token_seconds_bucket{{engine_type=\"unified\",is_streaming=\"{streaming}\",le=\"{le}\",model_name=\"a \\\"b}} c\",tp_rank=\"{rank}\"}} {}\n",
                c * share
            );
        }
    }
    s += "sglang:time_to_first_token_seconds_count{engine_type=\"unified\",model_name=\"m\",tp_rank=\"0\"} 99.0\n";
    for rank in 0..2 {
        s += &format!("sglang:num_queue_reqs{{model_name=\"m\",tp_rank=\"{rank}\"}} {}\n", queued[rank]);
        s += &format!("sglang:token_usage{{model_name=\"m\",tp_rank=\"{rank}\"}} {} 1700000000000\n", usage[rank]);
    }
    s + "sglang:num_running_reqs 3\n# EOF\n"
}

fn buckets(pairs: &[(&str, f64)]) -> Buckets {
    let mut b = Buckets::default();
    for (le, c) in pairs {
        b.add(parse_number(le).unwrap(), *c);
    }
    b
}

#[test]
fn an_exposition_reads_as_the_planners_families_summed_over_ranks() {
    let m = parse(&exposition([2.0, 6.0, 9.0, 10.0], [1.0, 4.0], [0.2, 0.6])).unwrap();
    assert_eq!(m.ttft, buckets(&[("0.1", 2.0), ("0.5", 6.0), ("1.0", 9.0), ("+Inf", 10.0)]), "the _count line is not a bucket");
    assert_eq!(m.queued, Gauge { sum: 5.0, series: 2 });
    assert_eq!(m.running, Gauge { sum: 3.0, series: 1 });
    assert_eq!(m.token_usage.series, 2);
    assert!((m.token_usage.sum - 0.8).abs() < 1e-12);
    assert_eq!(m.itl, Buckets::default(), "no ITL family: no buckets");
}

#[test]
fn a_line_that_is_not_a_sample_is_named_by_its_number() {
    let e = parse("# ok\nsglang:num_queue_reqs 1\nsglang:num_queue_reqs{tp_rank=\"0\" 2\n").unwrap_err();
    assert_eq!(e, ScrapeError::Line { line: 3, text: "sglang:num_queue_reqs{tp_rank=\"0\" 2".into() });
    assert!(parse("sglang:token_usage abc\n").is_err());
    assert!(parse("sglang:time_to_first_token_seconds_bucket{tp_rank=\"0\"} 1\n").is_err(), "a bucket needs its le");
}

#[test]
fn quantiles_interpolate_as_prometheus_histogram_quantile_does() {
    let b = buckets(&[("0.1", 2.0), ("0.5", 6.0), ("1.0", 9.0), ("+Inf", 10.0)]);
    // rank 9 ends bucket (0.5, 1.0]: 0.5 + 0.5 × (9 − 6) / (9 − 6)
    assert_eq!(b.quantile(0.9), Some(1.0));
    // rank 5 in (0.1, 0.5]: 0.1 + 0.4 × (5 − 2) / (6 − 2)
    assert!((b.quantile(0.5).unwrap() - 0.4).abs() < 1e-12);
    // rank 0.5 in the lowest bucket, which starts at 0
    assert!((b.quantile(0.05).unwrap() - 0.025).abs() < 1e-12);
    // a rank in +Inf answers the highest finite bound
    assert_eq!(buckets(&[("0.1", 2.0), ("+Inf", 10.0)]).quantile(0.9), Some(0.1));
    assert_eq!(buckets(&[("0.1", 0.0), ("+Inf", 0.0)]).quantile(0.9), None, "no observations");
    assert_eq!(buckets(&[("0.1", 2.0), ("0.5", 6.0)]).quantile(0.9), None, "no +Inf bucket");
    // counts that dip (series scraped apart) are made monotonic first
    assert_eq!(buckets(&[("0.1", 5.0), ("0.5", 4.0), ("+Inf", 10.0)]).quantile(0.4), Some(0.08));
}

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + second).unwrap()
}

fn decode(ttft: [f64; 4], queued: f64) -> PodMetrics {
    PodMetrics {
        ttft: buckets(&[("0.1", ttft[0]), ("0.5", ttft[1]), ("1.0", ttft[2]), ("+Inf", ttft[3])]),
        queued: Gauge { sum: queued, series: 1 },
        token_usage: Gauge { sum: 0.5, series: 1 },
        ..PodMetrics::default()
    }
}

fn sample(second: i64, pods: Vec<(Role, &str, PodMetrics)>) -> Sample {
    Sample { at: at(second), pods: pods.into_iter().map(|(r, p, m)| ((r, p.to_owned()), m)).collect() }
}

#[test]
fn one_sample_gives_gauges_and_no_latency() {
    let mut h = History::default();
    let window = SignedDuration::from_secs(60);
    h.push(sample(0, vec![(Role::Decode, "d0", decode([1.0, 1.0, 1.0, 1.0], 2.0)), (Role::Prefill, "p0", decode([0.0; 4], 7.0))]), window);
    let (p, d) = h.observed(window);
    assert_eq!((p.ttft_p90_seconds, d.itl_p90_seconds), (None, None), "a latency needs an increase");
    assert_eq!((p.queued_requests, d.queued_requests, d.kv_usage, p.kv_usage), (Some(7.0), Some(2.0), Some(0.5), None));
    let kept = &h.0[0].pods[&(Role::Prefill, "p0".to_owned())];
    assert_eq!((&kept.ttft, kept.queued.sum), (&Buckets::default(), 7.0), "of a prefill pod only the gauges are kept");
}

#[test]
fn latencies_come_from_the_increase_over_the_window_across_pods_resets_and_new_pods() {
    let window = SignedDuration::from_secs(60);
    let mut h = History::default();
    // d0 served 100 fast requests long ago; d1 will restart (its counters reset).
    let before = || vec![(Role::Decode, "d0", decode([100.0; 4], 0.0)), (Role::Decode, "d1", decode([50.0; 4], 0.0))];
    // 60 s on: d0 served 10 slow requests, d1 restarted and served 5 in (0.1, 0.5], d2 is new with 5 in (0.5, 1].
    let after = || {
        vec![
            (Role::Decode, "d0", decode([100.0, 100.0, 100.0, 110.0], 0.0)),
            (Role::Decode, "d1", decode([0.0, 5.0, 5.0, 5.0], 0.0)),
            (Role::Decode, "d2", decode([0.0, 0.0, 5.0, 5.0], 0.0)),
        ]
    };
    h.push(sample(0, before()), window);
    h.push(sample(30, before()), window);
    h.push(sample(60, after()), window);
    // Increase: (0.1: 0, 0.5: 5, 1.0: 10, +Inf: 20); rank 18 falls in +Inf: the highest bound.
    assert_eq!(h.observed(window).0.ttft_p90_seconds, Some(1.0));
    // The first sample is now 60 s old, the base; a shorter window starts at the second, which
    // gives the same increase here.
    assert_eq!(h.observed(SignedDuration::from_secs(45)).0.ttft_p90_seconds, Some(1.0));
    // A quiet window (no new observation) has no latency: Prometheus answers NaN.
    h.push(sample(90, after()), window);
    assert_eq!(h.observed(SignedDuration::from_secs(30)).0.ttft_p90_seconds, None);
    assert_eq!(h.0.len(), 3, "the sample 90 s old is forgotten");
    assert_eq!(h.latest(), Some(at(90)));
}
