//! The planner's own scrape, measured (not a test): parsing one engine's `/metrics` and computing
//! both roles' figures from a window of samples, on expositions shaped like SGLang 0.5.23's
//! (`srt/observability/metrics_collector.py`: 42 histograms, 66 gauges and 57 counters declared;
//! TTFT split by `is_streaming`; every series carrying the rank labels). Run with
//! `cargo bench -p pd-core --bench planner_scrape`; figures in docs/benchmarks.md.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use jiff::{SignedDuration, Timestamp};
use pd_api::Role;
use pd_core::planner::scrape::{self, History, Sample};

/// The system allocator, counting the bytes held: what a `History` keeps in memory.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One engine's exposition: `ranks` series of every family, histograms of 30 buckets.
fn exposition(ranks: u32, served: f64) -> String {
    let mut s = String::new();
    let labels = |rank: u32| format!("engine_type=\"decode\",model_name=\"deepseek-ai/DeepSeek-V3\",pp_rank=\"0\",tp_rank=\"{rank}\"");
    let bounds: Vec<String> = (1..30).map(|i| format!("{}", f64::from(i) * 0.05)).chain(["+Inf".to_owned()]).collect();
    for h in 0..42 {
        let name = match h {
            0 => "sglang:time_to_first_token_seconds".to_owned(),
            1 => "sglang:inter_token_latency_seconds".to_owned(),
            _ => format!("sglang:histogram_{h}_seconds"),
        };
        s += &format!("# HELP {name} A histogram.\n# TYPE {name} histogram\n");
        for rank in 0..ranks {
            for (i, le) in bounds.iter().enumerate() {
                let count = served * (i + 1) as f64 / bounds.len() as f64;
                s += &format!("{name}_bucket{{{},is_streaming=\"true\",le=\"{le}\"}} {count}\n", labels(rank));
            }
            s += &format!("{name}_sum{{{}}} {}\n{name}_count{{{}}} {served}\n", labels(rank), served * 0.7, labels(rank));
        }
    }
    for g in 0..66 {
        let name = match g {
            0 => "sglang:num_queue_reqs".to_owned(),
            1 => "sglang:num_running_reqs".to_owned(),
            2 => "sglang:token_usage".to_owned(),
            _ => format!("sglang:gauge_{g}"),
        };
        for rank in 0..ranks {
            s += &format!("{name}{{{}}} {}\n", labels(rank), f64::from(g) * 0.01);
        }
    }
    for c in 0..57 {
        for rank in 0..ranks {
            s += &format!("sglang:counter_{c}_total{{{}}} {served}\n", labels(rank));
        }
    }
    s
}

fn per_call(runs: u32, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..runs {
        f();
    }
    start.elapsed().as_secs_f64() / f64::from(runs)
}

fn main() {
    for ranks in [1, 8] {
        let text = exposition(ranks, 1000.0);
        let secs = per_call(50, || {
            black_box(scrape::parse(black_box(&text)).unwrap());
        });
        let lines = text.lines().count();
        println!(
            "parse: {ranks} rank(s), {lines} lines, {:.0} KiB: {:.2} ms ({:.0} MiB/s)",
            text.len() as f64 / 1024.0,
            secs * 1e3,
            text.len() as f64 / secs / (1 << 20) as f64
        );
    }
    let window = SignedDuration::from_secs(60);
    for pods in [8, 64] {
        let before = HELD.load(Ordering::Relaxed);
        let mut history = History::default();
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        for pass in 0..3_i64 {
            let metrics = scrape::parse(&exposition(1, 1000.0 * (pass + 1) as f64)).unwrap();
            let mut all = BTreeMap::new();
            for p in 0..pods {
                let role = if p % 2 == 0 { Role::Prefill } else { Role::Decode };
                all.insert((role, format!("pod-{p}")), metrics.clone());
            }
            history.push(Sample { at: t0 + SignedDuration::from_secs(30 * pass), pods: all }, window);
        }
        let held = HELD.load(Ordering::Relaxed) - before;
        let secs = per_call(200, || {
            black_box(history.observed(window));
        });
        println!(
            "figures: {pods} engine leaders, 3 samples in the window: {:.3} ms a pass; the history holds {:.1} KiB ({:.2} KiB a leader)",
            secs * 1e3,
            held as f64 / 1024.0,
            held as f64 / 1024.0 / f64::from(pods)
        );
    }
}
