//! Series as real runs write them, with their truth, for the simulation study
//! (`bench/trend_sim.sh`) and the generated test set (`tests/corpus/trend/gen`, written by
//! `examples/trend_corpus.rs`). Pure: it returns text, it writes nothing.
//!
//! A device's memory is base + warm-up + gradient-accumulation sawtooth (period 2-64 steps, so a
//! series sampled every k steps sees it aliased) + eval plateaus + a leak (linear, or a staircase
//! that steps up after each eval) + spikes + Gaussian noise (sometimes none: JAX's
//! `bytes_in_use` is exact). The text is the contract's CSV, a JAX log (`memory_stats()` dicts) or
//! a PyTorch/XLA log (`get_memory_info()` dicts or `mem X GB` figures), sampled every 1..50 steps,
//! with what real files have: adjacent rows swapped (two writers, a merged CSV), duplicate rows,
//! bad values (NaN, inf, negative, 1e30, empty), shuffled or reversed rows, restarts with and
//! without a step reset, several hosts and devices in one file.
//!
//! [`score`] compares a report with the truth: verdict right, leak recall by size, false alarms,
//! spikes reported, the diverging device named, the OOM forecast error.

use crate::reader::format_time;
use crate::report::TrendReport;
use serde::{Deserialize, Serialize};

/// xorshift64.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [a, b).
    pub fn range(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * self.uniform()
    }
    /// Uniform integer in [a, b].
    pub fn int(&mut self, a: u64, b: u64) -> u64 {
        a + ((b - a + 1) as f64 * self.uniform()) as u64 % (b - a + 1)
    }
    /// One of.
    pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[(self.uniform() * v.len() as f64) as usize % v.len()]
    }
    /// Standard normal.
    pub fn gauss(&mut self) -> f64 {
        let u = self.uniform().max(1e-300);
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// Leak sizes of the study, in fractions of the limit per 1000 steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum LeakSize {
    /// 0.05-0.15% of the limit per 1k steps.
    Small,
    /// 0.2-0.6%.
    Medium,
    /// 0.8-3%.
    Large,
}

impl LeakSize {
    fn rate(self, r: &mut Rng) -> f64 {
        match self {
            LeakSize::Small => r.range(0.0005, 0.0015),
            LeakSize::Medium => r.range(0.002, 0.006),
            LeakSize::Large => r.range(0.008, 0.03),
        }
    }
}

/// A scenario of the table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scenario {
    /// Flat with noise and a small gradient-accumulation swing.
    Flat,
    /// A gradient-accumulation sawtooth of 8-14% of the limit.
    Sawtooth,
    /// Eval plateaus (+8-15% for 50-150 steps every 1000-3000 steps).
    EvalPlateaus,
    /// A warm-up (+5-15% of the limit, τ 200-2000 steps).
    Warmup,
    /// 1-3 isolated spikes (+12-25%).
    Spikes,
    /// A lasting step (+5-10%).
    Step,
    /// A process restart (from a checkpoint; the step counter goes back when `reset`).
    Restart {
        /// Whether the step counter goes back.
        reset: bool,
    },
    /// A linear leak.
    Leak(LeakSize),
    /// A leak that steps up after each eval.
    Staircase(LeakSize),
    /// A leak with a restart: the last process leaks again from its base.
    LeakRestart {
        /// Leak size.
        size: LeakSize,
        /// Whether the step counter goes back.
        reset: bool,
    },
    /// 0.1-1% of adjacent rows swapped (and some duplicated), leaking when `Some`.
    Swapped(Option<LeakSize>),
    /// Every 7th value bad (NaN, inf, negative, 1e30, empty), leaking when `Some`.
    BadValues(Option<LeakSize>),
    /// Rows shuffled or reversed (a time column gives the order), leaking when `Some`.
    Shuffled(Option<LeakSize>),
    /// 2-4 hosts of 1-4 devices in one file; one device leaks when `Some`.
    MultiHost(Option<LeakSize>),
    /// A JAX training log (`memory_stats()` per device).
    JaxLog(Option<LeakSize>),
    /// A PyTorch/XLA training log.
    TorchLog(Option<LeakSize>),
    /// A JAX log of a leaking run restarted from a checkpoint (glog's thread id changes).
    JaxLogRestart(LeakSize),
    /// 1-4 isolated spikes anywhere in the run (2-98%: in the warm-up, at the end), on a leak
    /// when `Some`.
    SpikesAnywhere(Option<LeakSize>),
    /// A short run (1.5k-4k steps) sampled every 20-50 steps: 30-200 samples; leaking when
    /// `Some`.
    ShortSparse(Option<LeakSize>),
}

/// The scenario table of BENCHMARKS.md: (name, scenario).
pub fn table() -> Vec<(&'static str, Scenario)> {
    use LeakSize::*;
    use Scenario::*;
    vec![
        ("flat", Flat),
        ("grad-accum sawtooth, aliased", Sawtooth),
        ("eval plateaus", EvalPlateaus),
        ("warm-up", Warmup),
        ("isolated spikes", Spikes),
        ("step", Step),
        ("restart, step reset", Restart { reset: true }),
        ("restart, no step reset", Restart { reset: false }),
        ("leak small", Leak(Small)),
        ("leak medium", Leak(Medium)),
        ("leak large", Leak(Large)),
        ("staircase leak after evals", Staircase(Medium)),
        ("staircase leak after evals, large", Staircase(Large)),
        (
            "leak + restart, step reset",
            LeakRestart {
                size: Medium,
                reset: true,
            },
        ),
        (
            "leak + restart, no step reset",
            LeakRestart {
                size: Large,
                reset: false,
            },
        ),
        ("rows swapped, flat", Swapped(None)),
        ("rows swapped, leak", Swapped(Some(Medium))),
        ("bad values, flat", BadValues(None)),
        ("bad values, leak", BadValues(Some(Medium))),
        ("shuffled/reversed, flat", Shuffled(None)),
        ("shuffled/reversed, leak", Shuffled(Some(Large))),
        ("multi-host, none leaks", MultiHost(None)),
        ("multi-host, one device leaks", MultiHost(Some(Medium))),
        (
            "multi-host, one device leaks (large)",
            MultiHost(Some(Large)),
        ),
        ("JAX log, flat", JaxLog(None)),
        ("JAX log, leak", JaxLog(Some(Medium))),
        ("PyTorch/XLA log, flat", TorchLog(None)),
        ("PyTorch/XLA log, leak", TorchLog(Some(Small))),
        ("JAX log, leak + restart", JaxLogRestart(Medium)),
        ("spikes anywhere", SpikesAnywhere(None)),
        ("spikes anywhere, on a leak", SpikesAnywhere(Some(Medium))),
        ("short sparse run, flat", ShortSparse(None)),
        ("short sparse run, warm-up", ShortSparse(None)),
        ("short sparse run, leak", ShortSparse(Some(Large))),
    ]
}

/// What one device truly does.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceTruth {
    /// Host as the report will name it.
    pub host: String,
    /// Device.
    pub device: String,
    /// The right verdict...
    pub verdict: String,
    /// ...or one of these (a swing near the sawtooth threshold, an eval plateau).
    pub accept: Vec<String>,
    /// The leak's size class.
    pub leak: Option<LeakSize>,
    /// Leak rate, bytes per step.
    pub rate: f64,
    /// True step where the normal ceiling of the last process reaches the limit.
    pub oom_step: Option<f64>,
    /// Last step of the series.
    pub last_step: u64,
    /// Steps of the isolated spikes (as sampled).
    pub spikes: Vec<u64>,
    /// Sampling interval, steps.
    pub every: u64,
}

/// One generated file and its truth.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Case {
    /// File name (its extension tells the format).
    pub file: String,
    /// Scenario name from [`table`].
    pub scenario: String,
    /// Format: `csv`, `jax_log`, `torch_log`.
    pub format: String,
    /// Devices.
    pub devices: Vec<DeviceTruth>,
    /// Devices a multi-device file should name as diverging.
    pub diverging: Vec<(String, String)>,
    /// Bad values written.
    pub bad_values: u64,
    /// The text (not in the manifest).
    #[serde(skip)]
    pub text: String,
}

#[derive(Debug, Clone, Copy)]
struct Dev {
    base: f64,
    noise: f64,
    saw_amp: f64,
    saw_period: u64,
    warm_amp: f64,
    warm_tau: f64,
    rate: f64,
    staircase: bool,
}

#[derive(Debug, Clone)]
struct Plan {
    l: f64,
    steps: u64,
    every: u64,
    sec_per_step: f64,
    t0: f64,
    eval_every: u64,
    eval_len: u64,
    eval_amp: f64,
    spikes: Vec<(u64, u64, f64)>,
    step_at: Option<(u64, f64)>,
    /// (step where the process died, step it resumes from, seconds down).
    restart: Option<(u64, u64, f64)>,
}

impl Plan {
    /// Memory of `d` at `step`, `pos` steps into its process.
    fn value(&self, d: &Dev, step: u64, pos: u64, r: &mut Rng) -> f64 {
        let l = self.l;
        let mut v = d.base * l;
        v -= d.warm_amp * l * (-(pos as f64) / d.warm_tau).exp();
        v += d.saw_amp * l * ((step % d.saw_period) as f64 + 0.5) / d.saw_period as f64;
        if self.eval_every > 0 && step % self.eval_every >= self.eval_every - self.eval_len {
            v += self.eval_amp * l;
        }
        if d.rate > 0.0 {
            if d.staircase && self.eval_every > 0 {
                let evals = pos / self.eval_every;
                v += d.rate * (evals * self.eval_every) as f64;
            } else {
                v += d.rate * pos as f64;
            }
        }
        for &(at, len, amp) in &self.spikes {
            if step >= at && step < at + len {
                v += amp * l;
            }
        }
        if let Some((at, dv)) = self.step_at {
            if step >= at {
                v += dv * l;
            }
        }
        v + d.noise * l * r.gauss()
    }
}

fn dev(r: &mut Rng, l: f64) -> Dev {
    let _ = l;
    Dev {
        base: r.range(0.3, 0.55),
        noise: r.pick(&[0.0, 0.001, 0.003, 0.005, 0.008]),
        saw_amp: r.range(0.005, 0.025),
        saw_period: r.pick(&[2, 3, 4, 8, 16]),
        warm_amp: r.range(0.0, 0.05),
        warm_tau: r.range(20.0, 300.0),
        rate: 0.0,
        staircase: false,
    }
}

/// Steps the run may last before the normal ceiling of `d` reaches `frac` of the limit.
fn steps_to(d: &Dev, frac: f64, extra: f64, l: f64) -> u64 {
    if d.rate <= 0.0 {
        return u64::MAX;
    }
    let head = frac * l - (d.base + d.saw_amp + extra) * l;
    (head / d.rate).max(0.0) as u64
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a.max(1)
    } else {
        gcd(b, a % b)
    }
}

fn host_name(i: usize) -> String {
    format!("vm-{i}")
}

/// Generates one case of `sc` (named `name`) from `seed`. `max_rows` bounds the rows per device
/// (the sampling interval grows to meet it).
pub fn case(name: &str, sc: Scenario, seed: u64, max_rows: u64) -> Case {
    use Scenario::*;
    let mut r = Rng::new(seed ^ 0x5EED_0F7E_11D5);
    let l = r.pick(&[16.0, 32.0, 95.0]) * 1024f64.powi(3);
    let mut plan = Plan {
        l,
        steps: r.int(6_000, 40_000),
        every: r.pick(&[1, 2, 5, 10, 20, 25, 50]),
        sec_per_step: r.range(0.2, 2.0),
        t0: 1_795_255_200.0 + r.range(0.0, 1e6).floor(),
        eval_every: 0,
        eval_len: 0,
        eval_amp: 0.0,
        spikes: Vec::new(),
        step_at: None,
        restart: None,
    };
    let (hosts, devs_per_host) = match sc {
        MultiHost(_) => (r.int(2, 4) as usize, r.int(1, 4) as usize),
        JaxLog(_) => (1, r.int(1, 4) as usize),
        _ => (1, 1),
    };
    let n = hosts * devs_per_host;
    let mut devs: Vec<Dev> = (0..n).map(|_| dev(&mut r, l)).collect();
    if matches!(sc, MultiHost(_)) {
        // Devices of one job look alike.
        let d0 = devs[0];
        for d in devs.iter_mut() {
            d.base = d0.base + r.range(-0.01, 0.01);
            d.saw_amp = d0.saw_amp;
            d.saw_period = d0.saw_period;
            d.noise = d0.noise;
        }
    }
    let mut leaking: Vec<usize> = Vec::new();
    let mut size: Option<LeakSize> = None;
    let mut accept_nonleak: Vec<&str> = vec!["stable"];
    let mut truth_nonleak = "stable";
    match sc {
        Flat | Warmup | Restart { .. } => {}
        Sawtooth => {
            for d in devs.iter_mut() {
                d.saw_amp = r.range(0.08, 0.14);
                d.saw_period = r.pick(&[2, 3, 4, 6, 8, 16, 32, 48, 64]);
            }
            truth_nonleak = "sawtooth";
            accept_nonleak = vec!["sawtooth"];
        }
        EvalPlateaus => {
            plan.eval_every = r.int(1000, 3000);
            plan.eval_len = r.int(50, 150);
            plan.eval_amp = r.range(0.08, 0.15);
            plan.steps = plan.steps.max(8 * plan.eval_every);
            plan.every = plan.every.min(plan.eval_len / 3).max(1);
            truth_nonleak = "sawtooth";
            accept_nonleak = vec!["sawtooth", "stable"];
        }
        Spikes | SpikesAnywhere(None) => {
            truth_nonleak = "spikes";
            accept_nonleak = vec!["spikes"];
        }
        SpikesAnywhere(Some(s)) => {
            size = Some(s);
            leaking.push(0);
        }
        Step => {
            let at = (plan.steps as f64 * r.range(0.35, 0.7)) as u64;
            plan.step_at = Some((at, r.range(0.05, 0.1)));
            truth_nonleak = "step";
            accept_nonleak = vec!["step"];
        }
        Leak(s) | Staircase(s) | LeakRestart { size: s, .. } | JaxLogRestart(s) => {
            size = Some(s);
            leaking.push(0);
        }
        Swapped(s) | BadValues(s) | Shuffled(s) | JaxLog(s) | TorchLog(s) | ShortSparse(s) => {
            if let Some(s) = s {
                size = Some(s);
                leaking.push(r.int(0, n as u64 - 1) as usize);
            }
        }
        MultiHost(s) => {
            if let Some(s) = s {
                size = Some(s);
                leaking.push(r.int(0, n as u64 - 1) as usize);
            }
        }
    }
    if matches!(sc, ShortSparse(_)) {
        plan.steps = r.int(1500, 4000);
        plan.every = r.pick(&[20, 25, 50]);
        if name.contains("warm-up") {
            for d in devs.iter_mut() {
                d.warm_amp = r.range(0.05, 0.12);
                d.warm_tau = r.range(50.0, 250.0);
            }
        }
    }
    if matches!(sc, Warmup) {
        for d in devs.iter_mut() {
            d.warm_amp = r.range(0.05, 0.15);
            d.warm_tau = r.range(200.0, 2000.0);
        }
        plan.steps = plan.steps.max(12 * devs[0].warm_tau as u64);
    }
    if matches!(sc, Staircase(_)) {
        plan.eval_every = r.int(500, 2000);
        plan.eval_len = r.int(20, 100);
        plan.eval_amp = r.range(0.03, 0.1);
        plan.every = plan.every.min((plan.eval_len / 2).max(1));
    }
    if let Some(s) = size {
        for &i in &leaking {
            devs[i].rate = s.rate(&mut r) * l / 1000.0;
            devs[i].staircase = matches!(sc, Staircase(_));
        }
        // The run ends before the OOM: at 60-92% of the way to the limit, and long enough
        // for the leak to rise 4% of the limit or more.
        let d = devs[leaking[0]];
        let extra = plan.eval_amp;
        let to_oom = steps_to(&d, 1.0, extra, l);
        let end = (to_oom as f64 * r.range(0.6, 0.92)) as u64;
        let min_rise = (0.04 * l / d.rate) as u64;
        plan.steps = end.max(min_rise.min(to_oom * 9 / 10)).max(3000);
        if matches!(sc, ShortSparse(_)) {
            plan.steps = plan.steps.min(r.int(1500, 4000)).max(1500);
        }
        if matches!(sc, LeakRestart { .. } | JaxLogRestart(_)) {
            // The last process must live long enough to be judged on its own.
            plan.steps = plan.steps.max(3 * min_rise / 2);
        }
    }
    if matches!(sc, Restart { .. } | LeakRestart { .. } | JaxLogRestart(_)) {
        let reset = matches!(
            sc,
            Restart { reset: true } | LeakRestart { reset: true, .. } | JaxLogRestart(_)
        );
        let died = (plan.steps as f64 * r.range(0.25, 0.45)) as u64;
        let back = if reset { r.int(200, 2000).min(died) } else { 0 };
        for d in devs.iter_mut() {
            d.warm_amp = d.warm_amp.max(r.range(0.03, 0.1));
        }
        plan.restart = Some((died, died - back, r.range(120.0, 1800.0)));
        if let Some(&i) = leaking.first() {
            // The last process runs as long as a whole leak run would.
            let d = devs[i];
            let to_oom = steps_to(&d, 1.0, 0.0, l);
            let last = (to_oom as f64 * r.range(0.6, 0.92)) as u64;
            let min_rise = (0.04 * l / d.rate) as u64;
            plan.steps = died - back + last.max(min_rise.min(to_oom * 9 / 10)).max(3000);
        }
    }
    if matches!(sc, Spikes) {
        let k = r.int(1, 3);
        for i in 0..k {
            let lo = plan.steps as f64 * (0.2 + 0.7 * i as f64 / k as f64);
            let hi = plan.steps as f64 * (0.2 + 0.7 * (i + 1) as f64 / k as f64) - 1.0;
            let at = r.range(lo, hi) as u64;
            plan.spikes.push((at, 0, r.range(0.12, 0.25)));
        }
    }
    if matches!(sc, SpikesAnywhere(_)) {
        let k = r.int(1, 4);
        let mut at: Vec<u64> = (0..k)
            .map(|_| (plan.steps as f64 * r.range(0.02, 0.98)) as u64)
            .collect();
        at.sort_unstable();
        at.dedup_by(|a, b| a.abs_diff(*b) < plan.steps / 20);
        for a in at {
            plan.spikes.push((a, 0, r.range(0.12, 0.25)));
        }
    }
    // Rows per device bounded.
    while plan.steps / plan.every > max_rows {
        plan.every = match plan.every {
            1 => 2,
            2 => 5,
            e => e * 2,
        };
    }
    // Spikes last 1-2 samples, aligned on the sampling grid so one sample sees each.
    let every = plan.every;
    for s in plan.spikes.iter_mut() {
        s.0 = s.0 / every * every;
        s.1 = every * r.int(1, 2);
    }
    let format = match sc {
        JaxLog(_) | JaxLogRestart(_) => "jax_log",
        TorchLog(_) => "torch_log",
        _ => "csv",
    };
    // Samples: (order key, host, device, step, ts, value).
    struct Row {
        pid: u64,
        h: usize,
        d: usize,
        step: u64,
        ts: f64,
        v: f64,
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut step = 0u64;
    let mut pos = 0u64;
    let mut ts = plan.t0;
    let mut restarted = false;
    let mut last_process_start = 0u64;
    while step <= plan.steps {
        if step % every == 0 {
            for (i, d) in devs.iter().enumerate() {
                let v = plan.value(d, step, pos, &mut r);
                rows.push(Row {
                    pid: if restarted { 5313 } else { 4242 },
                    h: i / devs_per_host,
                    d: i % devs_per_host,
                    step,
                    ts: ts + r.range(0.0, 0.05),
                    v,
                });
            }
        }
        step += 1;
        pos += 1;
        ts += plan.sec_per_step;
        if let Some((died, resume, down)) = plan.restart {
            if !restarted && step > died {
                restarted = true;
                step = resume / every * every;
                pos = 0;
                ts += down;
                last_process_start = step;
            }
        }
    }
    // Truth per device.
    let last_step = plan.steps / every * every;
    let mut truths = Vec::new();
    for (i, d) in devs.iter().enumerate() {
        let leak = leaking.contains(&i);
        let (verdict, mut accept) = if leak {
            ("leak", vec!["leak"])
        } else {
            (truth_nonleak, accept_nonleak.clone())
        };
        // The truth as sampled: every k steps sees the sawtooth at multiples of gcd(k, period)
        // only (k a multiple of the period: one phase, no swing at all), and noise widens the
        // swing a window shows (±2σ).
        let g = gcd(every, d.saw_period) as f64;
        let seen = d.saw_amp * (1.0 - g / d.saw_period as f64) + 4.0 * d.noise;
        if !leak && verdict == "sawtooth" && seen < 0.06 && !accept.contains(&"stable") {
            accept.push("stable");
        }
        if !leak && verdict == "stable" && seen >= 0.04 && !accept.contains(&"sawtooth") {
            accept.push("sawtooth");
        }
        let oom_step = leak.then(|| {
            let head = l * (1.0 - d.base - d.saw_amp - plan.eval_amp);
            last_process_start as f64 + head / d.rate
        });
        truths.push(DeviceTruth {
            host: if hosts > 1 {
                host_name(i / devs_per_host)
            } else {
                String::new()
            },
            device: (i % devs_per_host).to_string(),
            verdict: verdict.to_string(),
            accept: accept.iter().map(|s| s.to_string()).collect(),
            leak: if leak { size } else { None },
            rate: d.rate,
            oom_step,
            last_step,
            spikes: plan.spikes.iter().map(|s| s.0).collect(),
            every,
        });
    }
    let diverging = if n >= 2 && !leaking.is_empty() && leaking.len() * 2 <= n {
        leaking
            .iter()
            .map(|&i| (truths[i].host.clone(), truths[i].device.clone()))
            .collect()
    } else {
        Vec::new()
    };
    // Text.
    let with_time = match sc {
        Shuffled(_) | MultiHost(_) => true,
        Restart { reset: false } | LeakRestart { reset: false, .. } => true,
        _ => r.uniform() < 0.6,
    };
    let epoch_time = r.uniform() < 0.3;
    let with_pid = matches!(sc, Restart { .. } | LeakRestart { .. }) && r.uniform() < 0.5;
    let mut bad = 0u64;
    let mut lines: Vec<String> = Vec::new();
    let header;
    let fmt_t = |t: f64| {
        if epoch_time {
            format!("{t:.2}")
        } else {
            format_time(t)
        }
    };
    match format {
        "csv" => {
            let mut cols = vec!["step"];
            if with_time {
                cols.push("time");
            }
            if hosts > 1 {
                cols.push("host");
            }
            if n > 1 {
                cols.push("device");
            }
            if with_pid {
                cols.push("pid");
            }
            cols.push("bytes_in_use");
            cols.push("bytes_limit");
            header = cols.join(",");
            for (j, row) in rows.iter().enumerate() {
                let mut f = vec![row.step.to_string()];
                if with_time {
                    f.push(fmt_t(row.ts));
                }
                if hosts > 1 {
                    f.push(host_name(row.h));
                }
                if n > 1 {
                    f.push(row.d.to_string());
                }
                if with_pid {
                    f.push(row.pid.to_string());
                }
                let mut val = format!("{}", row.v.max(0.0) as u64);
                if matches!(sc, BadValues(_)) && j % 7 == 3 {
                    val = r
                        .pick(&["NaN", "nan", "inf", "-inf", "-1", "-4096", "1e30", ""])
                        .to_string();
                    bad += 1;
                }
                f.push(val);
                f.push(format!("{}", l as u64));
                lines.push(f.join(","));
            }
        }
        "jax_log" => {
            header = String::new();
            let mut j = 0;
            while j < rows.len() {
                let s = rows[j].step;
                let mut parts = Vec::new();
                while j < rows.len() && rows[j].step == s {
                    let row = &rows[j];
                    parts.push(format!(
                        "TpuDevice(id={}, process_index=0, coords=({},0,0), core_on_chip=0): {{'num_allocs': 1234, 'bytes_in_use': {}, 'peak_bytes_in_use': {}, 'largest_alloc_size': 268435456, 'bytes_limit': {}}}",
                        row.d,
                        row.d,
                        row.v.max(0.0) as u64,
                        (row.v.max(0.0) * 1.1) as u64,
                        l as u64
                    ));
                    j += 1;
                }
                let t = format_time(rows[j - 1].ts);
                let (hh, mm, ss) = (&t[11..13], &t[14..16], &t[17..19]);
                let tid = rows[j - 1].pid;
                lines.push(format!(
                    "I{}{} {hh}:{mm}:{ss}.{:06} {tid} train.py:212] step {s}, loss={:.4}, memory: {{{}}}",
                    &t[5..7],
                    &t[8..10],
                    s % 1_000_000,
                    2.5 / (1.0 + s as f64 / 5000.0),
                    parts.join(", ")
                ));
                if plan.eval_every > 0 && s % plan.eval_every < every {
                    lines.push(format!(
                        "I{}{} {hh}:{mm}:{ss}.000000 {tid} train.py:240] running eval at step {s}",
                        &t[5..7],
                        &t[8..10]
                    ));
                }
            }
        }
        _ => {
            header = String::new();
            let dict = r.uniform() < 0.5;
            for row in &rows {
                let t = format_time(row.ts);
                let when = format!(
                    "{} {},{:03}",
                    &t[..10],
                    &t[11..19],
                    (row.ts.fract() * 1000.0) as u64
                );
                let mem = if dict {
                    format!(
                        "mem {{'bytes_used': {}, 'bytes_limit': {}, 'peak_bytes_used': {}}}",
                        row.v.max(0.0) as u64,
                        l as u64,
                        (row.v.max(0.0) * 1.05) as u64
                    )
                } else {
                    format!(
                        "mem {:.3} GB / {:.2} GB",
                        row.v.max(0.0) / 1024f64.powi(3),
                        l / 1024f64.powi(3)
                    )
                };
                lines.push(format!(
                    "{when} - INFO - device xla:{} | step {} | loss {:.4} | {mem}",
                    row.d,
                    row.step,
                    2.5 / (1.0 + row.step as f64 / 5000.0)
                ));
            }
            lines.push("Training complete.".into());
        }
    }
    // Disorder.
    match sc {
        Swapped(_) => {
            let frac = r.range(0.001, 0.01);
            let k = ((lines.len() as f64 * frac).ceil() as usize).max(2);
            for _ in 0..k {
                let i = r.int(0, lines.len() as u64 - 3) as usize;
                if r.uniform() < 0.7 {
                    lines.swap(i, i + 1);
                } else {
                    // A row written late by a second writer, or twice.
                    let row = lines[i].clone();
                    if r.uniform() < 0.5 {
                        lines.insert(i + 2, row);
                    } else {
                        let j = (i + r.int(2, 5) as usize).min(lines.len() - 1);
                        let moved = lines.remove(i);
                        lines.insert(j, moved);
                    }
                }
            }
        }
        Shuffled(_) => {
            if r.uniform() < 0.5 {
                lines.reverse();
            } else {
                for i in (1..lines.len()).rev() {
                    let j = r.int(0, i as u64) as usize;
                    lines.swap(i, j);
                }
            }
        }
        MultiHost(_) => {
            // Hosts' writers interleave: now and then a row lands a few rows late.
            let k = lines.len() / 200;
            for _ in 0..k {
                let i = r.int(0, lines.len() as u64 - 6) as usize;
                let moved = lines.remove(i);
                lines.insert(i + r.int(1, 5) as usize, moved);
            }
        }
        _ => {}
    }
    let mut text = String::new();
    if !header.is_empty() {
        text.push_str(&header);
        text.push('\n');
    }
    for line in &lines {
        text.push_str(line);
        text.push('\n');
    }
    let slug: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect::<String>()
        .split('_')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("_");
    let ext = if format == "csv" { "csv" } else { "log" };
    Case {
        file: format!("{slug}_{seed}.{ext}"),
        scenario: name.to_string(),
        format: format.to_string(),
        devices: truths,
        diverging,
        bad_values: bad,
        text,
    }
}

/// How a report fared against a case's truth.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Score {
    /// Devices judged / judged right.
    pub devices: u64,
    /// Verdict in the accepted set.
    pub right: u64,
    /// Leaking devices by size (small, medium, large): (leaks, found).
    pub leaks: [(u64, u64); 3],
    /// Non-leaking devices, and those called `leak`.
    pub nonleak: (u64, u64),
    /// Spikes planted, and reported (a spike within the tolerance of its step).
    pub spikes: (u64, u64),
    /// Multi-device files, and those where `diverging` names exactly the devices to name
    /// (none when no device, or most, leak).
    pub diverging: (u64, u64),
    /// Forecast errors, |forecast − truth| / steps left, of the leaks found.
    pub forecast_errors: Vec<f64>,
    /// Verdicts that were wrong: (host, device, truth, got, reason).
    pub misses: Vec<String>,
}

impl Score {
    /// Adds another score.
    pub fn add(&mut self, o: &Score) {
        self.devices += o.devices;
        self.right += o.right;
        for i in 0..3 {
            self.leaks[i].0 += o.leaks[i].0;
            self.leaks[i].1 += o.leaks[i].1;
        }
        self.nonleak.0 += o.nonleak.0;
        self.nonleak.1 += o.nonleak.1;
        self.spikes.0 += o.spikes.0;
        self.spikes.1 += o.spikes.1;
        self.diverging.0 += o.diverging.0;
        self.diverging.1 += o.diverging.1;
        self.forecast_errors.extend_from_slice(&o.forecast_errors);
        self.misses.extend(o.misses.iter().cloned());
    }
}

/// Scores `rep` against `case`.
pub fn score(case: &Case, rep: &TrendReport) -> Score {
    let mut s = Score::default();
    for t in &case.devices {
        s.devices += 1;
        let got = rep
            .series
            .iter()
            .find(|x| x.host == t.host && x.device == t.device);
        let verdict = got.map_or("missing", |g| g.verdict);
        if t.accept.iter().any(|a| a == verdict) {
            s.right += 1;
        } else {
            s.misses.push(format!(
                "{} {}:{} truth {} got {} ({})",
                case.file,
                t.host,
                t.device,
                t.verdict,
                verdict,
                got.and_then(|g| g.reason.clone()).unwrap_or_default()
            ));
        }
        match t.leak {
            Some(size) => {
                let i = size as usize;
                s.leaks[i].0 += 1;
                if verdict == "leak" {
                    s.leaks[i].1 += 1;
                    if let (Some(truth), Some(f)) =
                        (t.oom_step, got.and_then(|g| g.oom_step_forecast))
                    {
                        let left = truth - t.last_step as f64;
                        if left > 0.0 {
                            s.forecast_errors.push((f as f64 - truth).abs() / left);
                        }
                    }
                }
            }
            None => {
                s.nonleak.0 += 1;
                s.nonleak.1 += u64::from(verdict == "leak");
            }
        }
        for &at in &t.spikes {
            s.spikes.0 += 1;
            let tol = (3 * t.every).max(t.last_step / 200);
            let found = got.is_some_and(|g| {
                g.spikes
                    .iter()
                    .any(|x| x.step.is_some_and(|st| st.abs_diff(at) <= tol))
            });
            s.spikes.1 += u64::from(found);
            if !found {
                s.misses.push(format!(
                    "{} {}:{} spike at {at} not reported",
                    case.file, t.host, t.device
                ));
            }
        }
    }
    if case.devices.len() >= 2 {
        s.diverging.0 += 1;
        let mut want: Vec<(String, String)> = case.diverging.clone();
        want.sort();
        let mut got: Vec<(String, String)> = rep
            .diverging
            .iter()
            .map(|d| (d.host.clone(), d.device.clone()))
            .collect();
        got.sort();
        if want == got {
            s.diverging.1 += 1;
        } else {
            s.misses
                .push(format!("{} diverging {want:?} got {got:?}", case.file));
        }
    }
    s
}

/// Reads a case's text and scores it.
pub fn run_case(case: &Case) -> (TrendReport, Score) {
    let mut c = crate::reader::Collected::default();
    crate::read_all(&mut c, "", &case.file, case.text.as_bytes());
    let rep = crate::report::report(&c, &crate::detect::Params::default());
    let s = score(case, &rep);
    (rep, s)
}
