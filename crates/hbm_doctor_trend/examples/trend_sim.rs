//! Simulation study of the trend detector (bench/trend_sim.sh runs it; BENCHMARKS.md reports it).
//!
//! Synthetic per-step series of known truth on a 16 GiB device: base 50% of the limit, Gaussian
//! noise σ = 0.5% of the limit, and one of: flat; sawtooth of period 8, 100 or 1000 steps
//! (10% swing); eval plateaus every 2000 steps (+15% for 100 steps); one spike (+20%); a step
//! (+5% at step 30k); a restart (back to a checkpoint 10k steps earlier, a dip to 1%, a
//! warm-up); a warm-up (+10% over the first 3k steps). Leaks of 0.01%–1% of the limit per 1k steps
//! ride on the period-100 sawtooth. Each run is 100k steps, evaluated every 1000 steps
//! ("continuously"), with the detector of `hbm_doctor_trend::detect`.
//!
//! Then series as real runs write them (`hbm_doctor_trend::simulate`: sparse and aliased,
//! rows swapped, bad values, shuffled, restarts, several hosts, JAX and PyTorch/XLA logs),
//! FILES_PER_SCENARIO files of each scenario read and judged as `hbm-doctor trend` does.
//!
//! Usage: `cargo run --release -p hbm_doctor_trend --example trend_sim [RUNS_PER_SCENARIO]
//! [FILES_PER_SCENARIO]` (`TREND_SECTION=real`: the second part only; `TREND_DEBUG=1`: misses
//! on stderr).

use hbm_doctor_trend::detect::{analyze, Params, Verdict};
use hbm_doctor_trend::store::{Sample, Series};

const L: f64 = 16.0 * 1024.0 * 1024.0 * 1024.0;
const STEPS: u64 = 100_000;
const EVAL_EVERY: u64 = 1000;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    fn gauss(&mut self) -> f64 {
        let u = self.next().max(1e-300);
        let v = self.next();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Flat,
    Saw(u64),
    Eval,
    Spike,
    Step,
    Restart,
    Warmup,
    Leak(f64),
    LeakMid(f64),
    LeakRestart(f64),
}

impl Kind {
    fn truth(self) -> &'static str {
        match self {
            Kind::Flat | Kind::Warmup | Kind::Restart => "stable",
            Kind::Saw(_) | Kind::Eval => "sawtooth",
            Kind::Spike => "spikes",
            Kind::Step => "step",
            Kind::Leak(_) | Kind::LeakMid(_) | Kind::LeakRestart(_) => "leak",
        }
    }
}

/// Value at `step` (the process's own position `pos` for the restart cases).
fn value(k: Kind, pos: u64, rng: &mut Rng) -> f64 {
    let noise = 0.005 * L * rng.gauss();
    let base = 0.5 * L;
    let saw = |p: u64| 0.1 * L * (pos % p) as f64 / p as f64;
    let v = match k {
        Kind::Flat => base,
        Kind::Saw(p) => base + saw(p),
        Kind::Eval => base + if pos % 2000 >= 1900 { 0.15 * L } else { 0.0 },
        Kind::Spike => base + if pos == 61_234 { 0.2 * L } else { 0.0 },
        Kind::Step => base + if pos >= 30_000 { 0.05 * L } else { 0.0 },
        Kind::Restart | Kind::Warmup => {
            base + 0.1 * L * (1.0 - (-(pos as f64) / 1000.0).exp()) - 0.1 * L
        }
        Kind::Leak(r) | Kind::LeakRestart(r) => base + saw(100) + r * L * pos as f64 / 1000.0,
        Kind::LeakMid(r) => base + saw(100) + r * L * pos.saturating_sub(50_000) as f64 / 1000.0,
    };
    (v + noise).max(0.0)
}

struct Outcome {
    first_leak: Option<u64>,
    /// First step where the alarm is raised by the live confirmation rule.
    confirmed: Option<u64>,
    final_verdict: Verdict,
    forecast_at_detect: Option<(u64, f64)>,
    forecast_at_end: Option<f64>,
    slope_end: f64,
}

fn run(k: Kind, seed: u64, p: &Params) -> Outcome {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut s = Series::default();
    let mut first_leak = None;
    let mut any_leak: Option<u64> = None;
    let mut confirmed = None;
    let mut conf = hbm_doctor_trend::live::Confirm::default();
    let mut retracted = false;
    let mut fad = None;
    let mut last = None;
    let restart_at = 60_000u64;
    let mut step = 0u64;
    let mut pos = 0u64;
    while step < STEPS {
        let restarted = matches!(k, Kind::Restart | Kind::LeakRestart(_))
            && step == restart_at
            && s.restarts == 0;
        if restarted {
            // Back to the checkpoint of step 50k: a dip, then the process starts over.
            s.push(Sample {
                step: Some(step),
                ts: Some(step as f64 * 0.5),
                used: (0.01 * L) as u64,
                limit: Some(L as u64),
                peak: None,
            });
            step = 50_000;
            pos = 0;
        }
        let v = value(
            k,
            if matches!(k, Kind::Restart | Kind::LeakRestart(_))
                && step >= 50_000
                && first_restart_done(&s)
            {
                pos
            } else {
                step
            },
            &mut rng,
        );
        s.push(Sample {
            step: Some(step),
            ts: Some(step as f64 * 0.5),
            used: v as u64,
            limit: Some(L as u64),
            peak: None,
        });
        step += 1;
        pos += 1;
        if step % EVAL_EVERY == 0 {
            if let Some(seg) = s.current() {
                let a = analyze(seg, &[], p);
                if a.verdict == Verdict::Leak
                    && first_leak.is_none()
                    && std::env::var_os("TREND_DEBUG").is_some()
                {
                    eprintln!("{k:?} seed {seed} leak at {step}: slope/1k {:.3e} p {:.2e} warm {:?} since {:?} period {:?}", a.slope * 1000.0, a.p_value, a.warmup_until, a.growth_since, a.period);
                }
                // The live rule (hbm_doctor_trend::live::Confirm): leak at position s of the
                // process and again at >= 1.5 max(s, 2400 steps).
                if conf.update(&a, p) && confirmed.is_none() {
                    confirmed = Some(step);
                }
                if a.verdict != Verdict::Leak && confirmed.is_none() && first_leak.is_some() {
                    first_leak = None;
                    fad = None;
                    retracted = true;
                }
                if a.verdict == Verdict::Leak && first_leak.is_none() {
                    any_leak = any_leak.or(Some(step));
                    first_leak = Some(step);
                    fad = a.oom_x.map(|x| (step, x));
                }
                last = Some(a);
            }
        }
        if matches!(k, Kind::Restart | Kind::LeakRestart(_)) && step >= STEPS && s.restarts == 0 {
            break;
        }
        if restarted {
            continue;
        }
    }
    let a = last.expect("evaluated");
    let _ = retracted;
    Outcome {
        first_leak: any_leak,
        confirmed,
        final_verdict: a.verdict,
        forecast_at_detect: fad,
        forecast_at_end: a.oom_x,
        slope_end: a.slope,
    }
}

fn first_restart_done(s: &Series) -> bool {
    s.restarts > 0
}

fn true_oom(k: Kind) -> Option<f64> {
    // Ceiling = base + 10% swing + rate·pos (+ noise, ignored).
    let r = match k {
        Kind::Leak(r) => return Some(0.4 / r * 1000.0),
        Kind::LeakMid(r) => return Some(50_000.0 + 0.4 / r * 1000.0),
        Kind::LeakRestart(r) => r,
        _ => return None,
    };
    // After the restart at step 60k the process resumes at 50k with pos 0.
    Some(50_000.0 + 0.4 / r * 1000.0)
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let runs: u64 = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let real_runs: u64 = std::env::args()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    if std::env::var("TREND_SECTION").is_ok_and(|s| s == "real") {
        realistic(real_runs);
        return;
    }
    let p = Params::default();
    println!("# trend detector simulation: {runs} runs per scenario, {STEPS} steps, evaluated every {EVAL_EVERY} steps, noise 0.5% of the limit\n");
    println!(
        "## Leak-free runs (false alarm = a `leak` verdict at any of the {} evaluations)\n",
        STEPS / EVAL_EVERY
    );
    println!("| scenario | runs | runs with a `leak` verdict at any evaluation | runs with a confirmed alarm (live::Confirm: leak at position s and again at ≥ 1.5 max(s, 2400 steps)) | final verdict = truth |");
    println!("|---|---:|---:|---:|---:|");
    let nulls = [
        ("flat + noise", Kind::Flat),
        ("sawtooth period 8", Kind::Saw(8)),
        ("sawtooth period 100", Kind::Saw(100)),
        ("sawtooth period 1000", Kind::Saw(1000)),
        ("eval plateau every 2000 steps", Kind::Eval),
        ("single spike at 61234", Kind::Spike),
        ("step +5% at 30k", Kind::Step),
        ("restart at 60k (back to 50k)", Kind::Restart),
        ("warm-up +10% over 3k steps", Kind::Warmup),
    ];
    let mut total = 0;
    let mut total_fa = 0;
    let mut total_cfa = 0;
    for (name, k) in nulls {
        if std::env::var("TREND_ONLY").is_ok_and(|o| !name.starts_with(&o)) {
            continue;
        }
        let mut fa = 0;
        let mut cfa = 0;
        let mut right = 0;
        for seed in 0..runs {
            let o = run(k, seed + 1, &p);
            fa += u64::from(o.first_leak.is_some());
            cfa += u64::from(o.confirmed.is_some());
            right += u64::from(o.final_verdict.as_str() == k.truth());
        }
        total += runs;
        total_fa += fa;
        total_cfa += cfa;
        println!(
            "| {name} | {runs} | {fa} ({:.1}%) | {cfa} ({:.1}%) | {:.0}% |",
            100.0 * fa as f64 / runs as f64,
            100.0 * cfa as f64 / runs as f64,
            100.0 * right as f64 / runs as f64
        );
    }
    println!(
        "| **all leak-free** | {total} | {total_fa} ({:.2}%) | {total_cfa} ({:.2}%) | |\n",
        100.0 * total_fa as f64 / total as f64,
        100.0 * total_cfa as f64 / total as f64
    );
    println!("## Leaks (on a period-100 sawtooth with a 10% swing)\n");
    println!("| leak (% of limit per 1k steps) | starts | detected within 100k | delay median / p90 (steps) | confirmed alarm: detected / delay median | slope error at end (median) | OOM-step error at detection, median / p90 (% of remaining) | at the end of the run |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for (start, mk) in [("step 0", 0u8), ("step 50k", 1), ("restart at 60k", 2)] {
        for r in [0.0001, 0.0003, 0.001, 0.003, 0.01] {
            let k = match mk {
                0 => Kind::Leak(r),
                1 => Kind::LeakMid(r),
                _ => Kind::LeakRestart(r),
            };
            if mk > 0 && r < 0.0003 {
                continue;
            }
            let t0 = match mk {
                0 => 0.0,
                1 => 50_000.0,
                _ => 0.0,
            };
            let oom = true_oom(k).unwrap_or(f64::NAN);
            let mut det = 0;
            let mut cdel = Vec::new();
            let mut delays = Vec::new();
            let mut errs = Vec::new();
            let mut errs_end = Vec::new();
            let mut slope_err = Vec::new();
            for seed in 0..runs {
                let o = run(k, seed + 1000, &p);
                if let Some(c) = o.confirmed {
                    cdel.push(c as f64 - t0);
                }
                if let Some(d) = o.first_leak {
                    det += 1;
                    delays.push(d as f64 - t0);
                    if let Some((at, x)) = o.forecast_at_detect {
                        // The process position differs from the step after a restart.
                        let _ = at;
                        let now = match mk {
                            2 if d > 60_000 => d as f64 - 10_000.0,
                            _ => d as f64,
                        };
                        let _ = now;
                        errs.push(((x - oom) / (oom - now_step(mk, d))).abs() * 100.0);
                    }
                }
                if let Some(x) = o.forecast_at_end {
                    errs_end.push(((x - oom) / (oom - now_step(mk, STEPS))).abs() * 100.0);
                }
                if o.final_verdict == Verdict::Leak {
                    slope_err.push(((o.slope_end * 1000.0 - r * L) / (r * L)).abs() * 100.0);
                }
            }
            println!(
                "| {:.2}% | {start} | {det}/{runs} | {:.0} / {:.0} | {}/{runs} / {:.0} | {:.1}% | {:.0}% / {:.0}% | {:.0}% / {:.0}% |",
                r * 100.0,
                pct(&mut delays.clone(), 0.5),
                pct(&mut delays, 0.9),
                cdel.len(),
                pct(&mut cdel, 0.5),
                pct(&mut slope_err, 0.5),
                pct(&mut errs.clone(), 0.5),
                pct(&mut errs, 0.9),
                pct(&mut errs_end.clone(), 0.5),
                pct(&mut errs_end, 0.9),
            );
        }
    }
    if real_runs > 0 {
        println!();
        realistic(real_runs);
    }
}

/// Series as real runs write them (`hbm_doctor_trend::simulate`): per-scenario figures.
fn realistic(runs: u64) {
    use hbm_doctor_trend::simulate::{case, run_case, table, Score};
    println!("## Series as real runs write them ({runs} files per scenario, `hbm_doctor_trend::simulate`)\n");
    println!("| scenario | files | devices | verdict right | leaks found (small / medium / large) | false alarms | spikes reported | diverging named | forecast error median / p90 (% of steps left) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut all = Score::default();
    let verbose = std::env::var_os("TREND_DEBUG").is_some();
    for (name, sc) in table() {
        if std::env::var("TREND_ONLY").is_ok_and(|o| !name.starts_with(&o)) {
            continue;
        }
        let mut s = Score::default();
        for seed in 0..runs {
            let c = case(name, sc, seed + 1, 40_000);
            let (_, sc) = run_case(&c);
            s.add(&sc);
        }
        if verbose {
            for m in &s.misses {
                eprintln!("  {m}");
            }
        }
        print_row(name, runs, &s);
        all.add(&s);
    }
    print_row("**all**", runs * table().len() as u64, &all);
}

fn frac(a: (u64, u64)) -> String {
    if a.0 == 0 {
        "-".into()
    } else {
        format!("{}/{}", a.1, a.0)
    }
}

fn print_row(name: &str, files: u64, s: &hbm_doctor_trend::simulate::Score) {
    let mut e = s.forecast_errors.clone();
    let fe = if e.is_empty() {
        "-".to_string()
    } else {
        format!(
            "{:.1}% / {:.1}%",
            100.0 * pct(&mut e.clone(), 0.5),
            100.0 * pct(&mut e, 0.9)
        )
    };
    println!(
        "| {name} | {files} | {} | {:.1}% | {} / {} / {} | {} | {} | {} | {fe} |",
        s.devices,
        100.0 * s.right as f64 / s.devices.max(1) as f64,
        frac((s.leaks[0].0, s.leaks[0].1)),
        frac((s.leaks[1].0, s.leaks[1].1)),
        frac((s.leaks[2].0, s.leaks[2].1)),
        frac((s.nonleak.0, s.nonleak.1)),
        frac(s.spikes),
        frac(s.diverging),
    );
}

/// The step axis value "now" for a detection at loop step `d` (after the restart the loop's
/// steps are the resumed ones, which is what the forecast is on).
fn now_step(_mk: u8, d: u64) -> f64 {
    d as f64
}
