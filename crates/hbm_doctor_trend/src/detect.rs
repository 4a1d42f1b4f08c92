//! The detector: from one process's windows to a verdict (monitoring.md §7.3, tuned by the
//! simulation in `bench/trend_sim.sh`).
//!
//! 1. Drop the warm-up: the first max(200 steps | 10 min, 5% of the span).
//! 2. Estimate the period of the floors (autocorrelation) and group windows so each analysis
//!    window spans ≥ 2 periods, at most [`Params::k_max`] of them: the window floor strips the
//!    sawtooth.
//! 3. Mann–Kendall on the floors, Theil–Sen slope with Sen's interval.
//! 4. Step vs ramp: the best single split of the floors; two flat sides and a large jump make a
//!    step (an early upward one is the warm-up: it is cut and the analysis reruns).
//! 5. Leak = p < α, Sen's lower bound > 0, rise over the span ≥ G1 = max(3σ, 0.25% of the limit),
//!    not a step, and no drop between window floors larger than half the rise (a sawtooth seen
//!    through windows shorter than its period). The current slope comes from a hinge fit when the leak began mid-run.
//! 6. Spikes: excursions of a window's maximum ≥ 8% of the limit above the normal ceiling.
//! 7. Sawtooth: a swing ≥ 5% of the limit (10% of the usual ceiling without one) in ≥ 80% of
//!    windows, or periodic spikes.

use crate::stats::{self, mad_sigma, mann_kendall, median, quantile, theil_sen};
use crate::store::{Axis, Segment, Window};

/// Tunables; the defaults are what the simulation study reports on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Most analysis windows in the test.
    pub k_max: usize,
    /// Fewest analysis windows to judge at all.
    pub k_min: usize,
    /// Fewest samples to judge at all.
    pub min_samples: u64,
    /// One-sided significance of the Mann–Kendall test and of Sen's lower bound.
    pub alpha: f64,
    /// G1: the rise over the span must reach this many robust sigmas of the floor residuals...
    pub g1_sigmas: f64,
    /// ...and this fraction of the limit.
    pub g1_limit_fraction: f64,
    /// A spike rises at least this fraction of the limit above the normal ceiling.
    pub spike_fraction: f64,
    /// A sawtooth swings at least this fraction of the limit.
    pub sawtooth_fraction: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            k_max: 48,
            k_min: 10,
            min_samples: 64,
            alpha: 0.001,
            g1_sigmas: 3.0,
            g1_limit_fraction: 0.0025,
            spike_fraction: 0.08,
            sawtooth_fraction: 0.05,
        }
    }
}

/// The verdict vocabulary of contract.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Too short to judge.
    InsufficientData,
    /// The floor grows steadily.
    Leak,
    /// A lasting change of level.
    Step,
    /// Isolated excursions.
    Spikes,
    /// Periodic, bounded swing.
    Sawtooth,
    /// None of the above.
    Stable,
}

impl Verdict {
    /// The contract's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::InsufficientData => "insufficient_data",
            Verdict::Leak => "leak",
            Verdict::Step => "step",
            Verdict::Spikes => "spikes",
            Verdict::Sawtooth => "sawtooth",
            Verdict::Stable => "stable",
        }
    }
}

/// What happened in the log near a point of the series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MarkerKind {
    /// Evaluation / validation.
    Eval,
    /// Checkpoint save or load.
    Checkpoint,
    /// A compilation (JAX log_compiles, PT_XLA_DEBUG compilation analysis, UncachedCompile).
    Recompilation,
}

impl MarkerKind {
    /// The word used in `spikes[].near`.
    pub fn as_str(self) -> &'static str {
        match self {
            MarkerKind::Eval => "eval",
            MarkerKind::Checkpoint => "checkpoint",
            MarkerKind::Recompilation => "recompilation",
        }
    }
}

/// A log event with its position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Marker {
    /// What.
    pub kind: MarkerKind,
    /// The step the log was at.
    pub step: Option<u64>,
    /// The time of the line.
    pub ts: Option<f64>,
    /// Readings of the log's device series before the line (a series with neither steps nor
    /// times is placed by its readings); `None` where the log has several series.
    pub ordinal: Option<u64>,
}

/// One excursion above the normal ceiling.
#[derive(Debug, Clone, PartialEq)]
pub struct Spike {
    /// Step of its maximum.
    pub step: Option<u64>,
    /// Time of its maximum.
    pub ts: Option<f64>,
    /// Its maximum, bytes in use.
    pub bytes: u64,
    /// How far above the normal ceiling.
    pub above_bytes: u64,
    /// What the log says happened near it.
    pub near: Option<MarkerKind>,
}

/// A lasting level change.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepChange {
    /// Step where the new level begins.
    pub step: Option<u64>,
    /// Time where it begins.
    pub ts: Option<f64>,
    /// New level minus old level (floors).
    pub delta_bytes: f64,
    /// What the log says happened near it.
    pub near: Option<MarkerKind>,
}

/// The detector's result for one process of one device.
#[derive(Debug, Clone, PartialEq)]
pub struct Analysis {
    /// The verdict.
    pub verdict: Verdict,
    /// Why the data are insufficient, when they are.
    pub reason: Option<String>,
    /// The x axis.
    pub axis: Axis,
    /// Samples in the process.
    pub samples: u64,
    /// First and last step.
    pub first_step: Option<u64>,
    /// Last step.
    pub last_step: Option<u64>,
    /// First time.
    pub first_ts: Option<f64>,
    /// Last time.
    pub last_ts: Option<f64>,
    /// The limit.
    pub limit: Option<u64>,
    /// Floor slope per x unit (Theil–Sen; the current slope after a hinge).
    pub slope: f64,
    /// Sen's 95% interval of the slope.
    pub slope_ci: (f64, f64),
    /// Mann–Kendall one-sided p.
    pub p_value: f64,
    /// Steps per second, when both are known.
    pub steps_per_second: Option<f64>,
    /// The floor now (fitted).
    pub floor_now: f64,
    /// The normal ceiling now (floor + typical swing).
    pub ceiling_now: f64,
    /// Typical swing (ceiling − floor) of an analysis window.
    pub swing: f64,
    /// The period of the floors, in x units, when one was found.
    pub period: Option<f64>,
    /// x where the warm-up ends.
    pub warmup_until: Option<f64>,
    /// x where the current growth began (hinge), when it began after the warm-up.
    pub growth_since: Option<f64>,
    /// Forecast: x at which the ceiling reaches the limit (central slope).
    pub oom_x: Option<f64>,
    /// Cautious forecast: Sen's upper slope and a 1%-of-limit margin.
    pub oom_x_early: Option<f64>,
    /// Spikes.
    pub spikes: Vec<Spike>,
    /// Whether the spikes recur at a regular interval.
    pub periodic_spikes: bool,
    /// The level change, when the verdict is `step`.
    pub step_change: Option<StepChange>,
    /// When the leak was found on the most recent part of the process only (multi-scale):
    /// the fraction tested (0.5 or 0.25 of the process after the warm-up).
    pub recent_scale: Option<f64>,
    /// Whether floors trend up at the display level (p < 0.01 and lower bound > 0) without
    /// passing every gate.
    pub suspected: bool,
}

struct Aw {
    x: f64,
    x0: f64,
    x1: f64,
    floor: f64,
    ceil: f64,
    s1: Option<u64>,
    t1: Option<f64>,
    s0: Option<u64>,
    t0: Option<f64>,
}

fn group(base: &[Window], per: usize) -> Vec<Aw> {
    let skip = base.len() % per;
    base[skip..]
        .chunks(per)
        .map(|c| {
            let maxes: Vec<f64> = c.iter().map(|w| w.max).collect();
            let mut m = c[0];
            for w in &c[1..] {
                m.merge(w);
            }
            Aw {
                x: m.mid(),
                x0: m.x0,
                x1: m.x1,
                floor: m.min,
                ceil: quantile(&maxes, 0.9),
                s0: m.s0,
                s1: m.s1,
                t0: m.t0,
                t1: m.t1,
            }
        })
        .collect()
}

/// Period of `v` in samples by autocorrelation, when a clear one exists.
fn period_of(v: &[f64]) -> Option<usize> {
    let n = v.len();
    if n < 24 {
        return None;
    }
    let x: Vec<f64> = (0..n).map(|i| i as f64).collect();
    let (b, a, _) = stats::ols(&x, v);
    let r: Vec<f64> = v
        .iter()
        .enumerate()
        .map(|(i, y)| y - a - b * i as f64)
        .collect();
    let e: f64 = r.iter().map(|y| y * y).sum();
    if e <= 0.0 {
        return None;
    }
    let max_lag = n / 3;
    let acf: Vec<f64> = (0..=max_lag)
        .map(|l| {
            r[..n - l]
                .iter()
                .zip(&r[l..])
                .map(|(p, q)| p * q)
                .sum::<f64>()
                / e
        })
        .collect();
    let mut best: Option<(usize, f64)> = None;
    for l in 2..max_lag {
        let dip = acf[1..l].iter().copied().fold(f64::INFINITY, f64::min);
        if acf[l] > 0.3 && acf[l] >= acf[l - 1] && acf[l] >= acf[l + 1] && dip < acf[l] - 0.3 {
            match best {
                Some((_, v)) if v >= acf[l] * 1.1 => {}
                Some((_, v)) if acf[l] <= v => {}
                _ => best = Some((l, acf[l])),
            }
            if acf[l] > 0.6 {
                break;
            }
        }
    }
    best.map(|(l, _)| l)
}

/// Autocorrelation of the detrended `v` at `lag`.
fn acf_at(v: &[f64], lag: usize) -> f64 {
    let n = v.len();
    if lag == 0 || lag >= n {
        return 0.0;
    }
    let x: Vec<f64> = (0..n).map(|i| i as f64).collect();
    let (b, a, _) = stats::ols(&x, v);
    let r: Vec<f64> = v
        .iter()
        .enumerate()
        .map(|(i, y)| y - a - b * i as f64)
        .collect();
    let e: f64 = r.iter().map(|y| y * y).sum();
    if e <= 0.0 {
        return 0.0;
    }
    r[..n - lag]
        .iter()
        .zip(&r[lag..])
        .map(|(p, q)| p * q)
        .sum::<f64>()
        / e
}

fn near(markers: &[Marker], axis: Axis, x: f64, tol: f64) -> Option<MarkerKind> {
    markers
        .iter()
        .filter_map(|m| {
            let mx = match axis {
                Axis::Step => m.step.map(|s| s as f64),
                Axis::Time => m.ts,
                Axis::Ordinal => None,
            }?;
            let d = (mx - x).abs();
            (d <= tol).then_some((d, m.kind))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
        .map(|(_, k)| k)
}

fn empty(seg: &Segment, reason: &str) -> Analysis {
    let (first_step, last_step) = seg.step_range();
    let (first_ts, last_ts) = seg.time_range();
    Analysis {
        verdict: Verdict::InsufficientData,
        reason: Some(reason.to_string()),
        axis: seg.axis,
        samples: seg.samples,
        first_step,
        last_step,
        first_ts,
        last_ts,
        limit: seg.limit,
        slope: 0.0,
        slope_ci: (0.0, 0.0),
        p_value: 1.0,
        steps_per_second: None,
        floor_now: seg.windows.last().map_or(0.0, |w| w.min),
        ceiling_now: seg.windows.last().map_or(0.0, |w| w.max),
        swing: 0.0,
        period: None,
        warmup_until: None,
        growth_since: None,
        oom_x: None,
        oom_x_early: None,
        spikes: Vec::new(),
        periodic_spikes: false,
        step_change: None,
        recent_scale: None,
        suspected: false,
    }
}

/// A warm-up: the second half of the floors rises less than 40% as fast as the first
/// (Theil-Sen slopes). A steady leak does not slow down.
fn decelerating(x: &[f64], f: &[f64]) -> bool {
    decelerating_from(x, f, 5)
}

/// [`decelerating`] on halves of at least `min_half` floors.
fn decelerating_from(x: &[f64], f: &[f64], min_half: usize) -> bool {
    let h = f.len() / 2;
    if h < min_half {
        return false;
    }
    let m1 = mann_kendall(&f[..h]);
    let t1 = theil_sen(&x[..h], &f[..h], m1.var, 0.025);
    let m2 = mann_kendall(&f[h..]);
    let t2 = theil_sen(&x[h..], &f[h..], m2.var, 0.025);
    t1.slope > 0.0 && t2.slope < 0.4 * t1.slope
}

/// The reading after which an evaluation or checkpoint marker splits the series into two phases
/// of 3 readings or more, neither rising by itself (Mann-Kendall p > 0.05 each).
fn phase_split(
    seg: &Segment,
    markers: &[Marker],
    x: &[f64],
    y: &[f64],
) -> Option<(usize, MarkerKind)> {
    markers
        .iter()
        .filter(|m| matches!(m.kind, MarkerKind::Eval | MarkerKind::Checkpoint))
        .filter_map(|m| {
            let mx = match seg.axis {
                Axis::Step => m.step.map(|s| s as f64),
                Axis::Time => m.ts,
                Axis::Ordinal => m.ordinal.map(|o| o as f64),
            }?;
            Some((mx, m.kind))
        })
        .find_map(|(mx, kind)| {
            let k = x.iter().take_while(|&&v| v < mx).count();
            if k < 3 || y.len() - k < 3 {
                return None;
            }
            let flat = |part: &[f64]| mann_kendall(part).p_up > 0.05;
            (flat(&y[..k]) && flat(&y[k..])).then_some((k, kind))
        })
}

/// On a series too short to judge (posted logs: a few dozen readings), whether the samples
/// still rise clearly: Mann–Kendall p < 0.01 with Sen's 95% lower bound > 0 on at least 6
/// readings sets `suspected` (the verdict stays `insufficient_data`) and says so in `reason`.
/// Adds `what` to the analysis's reason, after what it says already.
fn add_reason(a: &mut Analysis, what: String) {
    let r = a.reason.take().unwrap_or_default();
    a.reason = Some(format!("{r}; {what}"));
}

fn short_trend(seg: &Segment, markers: &[Marker], a: &mut Analysis) {
    let fs = |v: f64| hbm_doctor_log::format_size(v.max(0.0) as u64);
    let w = &seg.windows;
    // Two to five readings are too few for a test, but not for a careful reader: each one
    // higher than the one before, and the last at least one and a half times the first, is
    // growth nobody posts by chance (a step or a warm-up levels off; a cache grows by less).
    // Two readings (a "before" and an "after" many steps apart) say the same with less: the
    // verdict stays `insufficient_data`, suspected.
    if (2..6).contains(&w.len()) {
        let y: Vec<f64> = w.iter().map(|w| w.min).collect();
        let first = y[0];
        let last = y[y.len() - 1];
        // (Not a rise that dies out: a batch's memory reached, then a little more, `379, 1670,
        // 1815 MB`, the last rise under a quarter of the first.)
        let dying = (y[y.len() - 1] - y[y.len() - 2]) < 0.25 * (y[1] - y[0]);
        // (A stepwise climb read before and after each step, `115, 1171, 1171, 2196 MB`, holds
        // level between its rises: never lower, and most of its steps rises.)
        let rises = y.windows(2).filter(|p| p[1] > p[0]).count();
        let climbing = y.windows(2).all(|p| p[1] >= p[0]) && rises * 2 > y.len() - 1;
        if climbing && first > 0.0 && last >= 1.5 * first && !dying {
            a.suspected = true;
            add_reason(
                a,
                if y.len() == 2 {
                    format!(
                        "yet the second reading is {:.1}x the first ({} to {}): a leak is suspected, but two readings cannot tell it from a warm-up or a step; record longer to judge it",
                        last / first,
                        fs(first),
                        fs(last)
                    )
                } else if rises < y.len() - 1 {
                    format!(
                        "yet the {} readings never fall and rise in {rises} steps, {} to {} ({:.1}x): a leak is suspected, record longer to judge it",
                        y.len(),
                        fs(first),
                        fs(last),
                        last / first
                    )
                } else {
                    format!(
                        "yet each of the {} readings is higher than the one before, {} to {} ({:.1}x): a leak is suspected, record longer to judge it",
                        y.len(),
                        fs(first),
                        fs(last),
                        last / first
                    )
                },
            );
        }
        return;
    }
    if w.len() < 6 {
        return;
    }
    let x: Vec<f64> = w.iter().map(|w| w.mid()).collect();
    let y: Vec<f64> = w.iter().map(|w| w.min).collect();
    let mk = mann_kendall(&y);
    let ts = theil_sen(&x, &y, mk.var, 0.025);
    // An evaluation (or a checkpoint) between two phases neither of which rises: the memory
    // stepped up with the phase (fairchem#199: training, `Evaluating on val.`, evaluation).
    if mk.p_up < 0.01 {
        if let Some((at, kind)) = phase_split(seg, markers, &x, &y) {
            add_reason(
                a,
                format!(
                    "the {} readings rise only across the {} after reading {at}: two phases, neither rising by itself, not a leak",
                w.len(),
                if kind == MarkerKind::Eval { "evaluation" } else { "checkpoint" }
            ));
            return;
        }
    }
    if mk.p_up < 0.01 && ts.lo > 0.0 && decelerating_from(&x, &y, 4) {
        add_reason(
            a,
            format!(
                "the {} readings rise but slow down (the second half less than 40% as fast as the first): a warm-up or a cache filling up, not a steady leak; record longer to see it level off",
            w.len()
        ));
        return;
    }
    // Under a dozen readings, a rise of a few hundredths of the level (`107.1, 107.3, ...
    // 107.8 MB`, an allocator's bookkeeping) is nothing to call a leak; over more readings the
    // steadiness itself is the evidence (Lasagne#860: +0.2% over 39, a leak).
    // Unless every one of eight or more readings is higher than the one before: a sign test's
    // p = 2^-(n-1) < 0.01, as no bookkeeping noise rises (pytorch#96937: 32 bytes leaked per
    // kernel launch, +0.5% over 10 readings, each one higher).
    let (first, last) = (y[0], y[y.len() - 1]);
    let every_higher = w.len() >= 8 && y.windows(2).all(|p| p[1] > p[0]);
    if mk.p_up < 0.01
        && ts.lo > 0.0
        && w.len() < 12
        && first > 0.0
        && last - first < 0.02 * first
        && !every_higher
    {
        add_reason(
            a,
            format!(
                "the {} readings rise, but by {} in all, {:.1}% of the first: too little to call from so few readings",
            w.len(),
            fs(last - first),
            100.0 * (last - first) / first
        ));
        return;
    }
    if mk.p_up < 0.01 && ts.lo > 0.0 {
        a.suspected = true;
        a.p_value = mk.p_up;
        a.slope = ts.slope;
        a.slope_ci = (ts.lo, ts.hi);
        let unit = match seg.axis {
            Axis::Step => "step",
            Axis::Time => "second",
            Axis::Ordinal => "reading",
        };
        add_reason(
            a,
            format!(
                "yet the {} readings rise (Mann-Kendall p {}, {} per {unit}, 95% [{} .. {}]): a leak is suspected, record longer to judge it",
            w.len(),
            if mk.p_up < 1e-9 {
                "< 1e-9".to_string()
            } else {
                format!("= {:.0e}", mk.p_up)
            },
            fs(ts.slope),
            fs(ts.lo),
            fs(ts.hi)
        ));
        // The rise reached the device's limit where the readings end: the growth itself is
        // what filled it, however short the recording.
        if let (Some(l), Some(r)) = (seg.limit, a.reason.as_mut()) {
            if seg.last_used as f64 >= 0.95 * l as f64 {
                r.push_str(&format!(
                    "; the readings end at {} of the {} limit: the growth filled the device",
                    fs(seg.last_used as f64),
                    fs(l as f64)
                ));
            }
        }
    }
}

/// Analyses one process of one device. `markers` are the log's events (eval, checkpoint,
/// compilation) for `spikes[].near`.
pub fn analyze(seg: &Segment, markers: &[Marker], p: &Params) -> Analysis {
    let (mut a, scanned_from) = analyze_inner(seg, markers, p);
    // Spikes where the windows' ceiling was not measured (the warm-up, the part before a
    // recent leak, a series too short to judge): a window whose maximum stands above both
    // neighbourhoods (the median maxima of the 3 windows on each side) by the spike threshold.
    let wins = &seg.windows;
    let end = match scanned_from {
        Some(x) => wins.iter().position(|w| w.x0 >= x).unwrap_or(wins.len()),
        None => wins.len(),
    };
    if end >= 3 {
        let limit = seg.limit.map(|l| l as f64);
        let maxes: Vec<f64> = wins.iter().map(|w| w.max).collect();
        let spike_abs = limit.map_or(p.spike_fraction * median(&maxes), |l| p.spike_fraction * l);
        let d: Vec<f64> = maxes.windows(2).map(|w| w[1] - w[0]).collect();
        // With a limit the contract's 8% of it; without, 6σ of the noise too (differences of
        // maxima: an aliased sawtooth inflates them, which only the limit-less case pays).
        let thr = if limit.is_some() {
            spike_abs
        } else {
            spike_abs.max(6.0 * mad_sigma(&d) / std::f64::consts::SQRT_2)
        };
        let span = wins[wins.len() - 1].x1 - wins[0].x0;
        let width = span / wins.len() as f64;
        let tol = (3.0 * width).max(0.002 * span).max(match seg.axis {
            Axis::Step => 20.0,
            Axis::Time => 60.0,
            Axis::Ordinal => 1.0,
        });
        let mut early: Vec<Spike> = Vec::new();
        let mut cur: Option<(Window, f64)> = None;
        // The last window is not isolated (it may begin a step).
        for i in 1..end.min(wins.len() - 1) {
            let left = median(&maxes[i.saturating_sub(3)..i]);
            let right = median(&maxes[i + 1..(i + 4).min(wins.len())]);
            let normal = left.max(right);
            if maxes[i] - normal > thr {
                cur = Some(match cur {
                    Some((mut m, n)) => {
                        m.merge(&wins[i]);
                        (m, n.min(normal))
                    }
                    None => (wins[i], normal),
                });
            } else if let Some((m, n)) = cur.take() {
                early.push(Spike {
                    step: m.argmax_step,
                    ts: m.argmax_ts,
                    bytes: m.max as u64,
                    above_bytes: (m.max - n).max(0.0) as u64,
                    near: near(markers, seg.axis, m.argmax_x, tol),
                });
            }
        }
        if let Some((m, n)) = cur.take() {
            if end < wins.len() - 1 {
                early.push(Spike {
                    step: m.argmax_step,
                    ts: m.argmax_ts,
                    bytes: m.max as u64,
                    above_bytes: (m.max - n).max(0.0) as u64,
                    near: near(markers, seg.axis, m.argmax_x, tol),
                });
            }
        }
        if !early.is_empty() {
            early.append(&mut a.spikes);
            a.spikes = early;
            if matches!(a.verdict, Verdict::Stable | Verdict::Sawtooth) && !a.periodic_spikes {
                a.verdict = Verdict::Spikes;
            }
        }
    }
    a
}

/// The analysis, and from where (x) its windows were searched for spikes (None: nowhere).
fn analyze_inner(seg: &Segment, markers: &[Marker], p: &Params) -> (Analysis, Option<f64>) {
    let mut a = empty(seg, "");
    a.reason = None;
    let wins = &seg.windows;
    let short = |reason: &str| {
        let mut e = empty(seg, reason);
        short_trend(seg, markers, &mut e);
        e
    };
    // The sample minimum follows the data: a series sampled every k steps over a long enough
    // span (1200 steps, 30 minutes) is judged from half the samples (each analysis window
    // still holds 3 or more).
    let (x_first, x_last) = wins
        .first()
        .zip(wins.last())
        .map_or((0.0, 0.0), |(a, b)| (a.x0, b.x1));
    let long = match seg.axis {
        Axis::Step => x_last - x_first >= 1200.0,
        Axis::Time => x_last - x_first >= 1800.0,
        Axis::Ordinal => false,
    };
    let min_samples = if long {
        (p.min_samples / 2).max(3 * p.k_min as u64)
    } else {
        p.min_samples
    };
    if seg.samples < min_samples || wins.len() < p.k_min {
        return (
            short(&format!(
                "{} samples: at least {} are needed",
                seg.samples, min_samples
            )),
            None,
        );
    }
    let span = x_last - x_first;
    if span <= 0.0 {
        return (short("all samples at the same step or time"), None);
    }
    if seg.axis == Axis::Step && span < 1200.0 {
        return (
            short(&format!("{span:.0} steps: at least 1200 are needed")),
            None,
        );
    }
    if seg.axis == Axis::Time && span < 1800.0 {
        return (
            short(&format!(
                "{span:.0} seconds: at least 30 minutes are needed"
            )),
            None,
        );
    }
    // Steps per second over the process.
    let (s0, s1) = seg.step_range();
    let (t0, t1) = seg.time_range();
    if let (Some(s0), Some(s1), Some(t0), Some(t1)) = (s0, s1, t0, t1) {
        if s1 > s0 && t1 > t0 {
            a.steps_per_second = Some((s1 - s0) as f64 / (t1 - t0));
        }
    }
    let min_warm = match seg.axis {
        Axis::Step => 200.0,
        Axis::Time => 600.0,
        Axis::Ordinal => 0.0,
    };
    let warm = (0.05 * span).max(min_warm).min(0.3 * span);
    let start = wins
        .iter()
        .position(|w| w.x0 >= x_first + warm)
        .unwrap_or(0);
    a.warmup_until = Some(x_first + warm);
    let template = a.clone();
    let full = analyze_from(seg, &wins[start..], markers, p, a, 2, true);
    let full_from = (full.verdict != Verdict::InsufficientData)
        .then_some(full.warmup_until)
        .flatten();
    if matches!(full.verdict, Verdict::Leak | Verdict::InsufficientData) {
        return (full, full_from);
    }
    // Multi-scale: a leak that began mid-run is diluted by the flat part before it. Test the
    // most recent half and quarter of the process too, each judged as a whole by the same
    // gates (and long enough to be judged at all), when the floors before it do not rise.
    let post = &wins[start..];
    let min_span = match seg.axis {
        Axis::Step => 1200.0,
        Axis::Time => 1800.0,
        Axis::Ordinal => 0.0,
    };
    for frac in [2usize, 4] {
        let n = post.len() / frac;
        if n < p.k_min {
            break;
        }
        let sub = &post[post.len() - n..];
        if sub[n - 1].x1 - sub[0].x0 < min_span || seg.samples / (frac as u64) < p.min_samples {
            break;
        }
        // A mid-run leak is a hinge: flat before the recent part. A warm-up's tail rises in
        // the recent part too, but the part before it rises clearly (Mann-Kendall p < alpha on
        // its window floors): not a hinge, not judged here.
        let before = &post[..post.len() - n];
        let per = before.len().div_ceil(p.k_max).max(1);
        let floors: Vec<f64> = before
            .chunks(per)
            .map(|c| c.iter().map(|w| w.min).fold(f64::INFINITY, f64::min))
            .collect();
        if floors.len() < p.k_min || mann_kendall(&floors).p_up < p.alpha {
            continue;
        }
        let mut b = analyze_from(seg, sub, markers, p, template.clone(), 0, false);
        if b.verdict == Verdict::Leak {
            b.growth_since = Some(b.growth_since.unwrap_or(sub[0].x0));
            b.recent_scale = Some(1.0 / frac as f64);
            return (b, Some(sub[0].x0));
        }
    }
    (full, full_from)
}

fn analyze_from(
    seg: &Segment,
    base: &[Window],
    markers: &[Marker],
    p: &Params,
    mut a: Analysis,
    warmup_cuts: u8,
    whole_periods: bool,
) -> Analysis {
    let limit = seg.limit.map(|l| l as f64);
    if base.len() < p.k_min {
        a.verdict = Verdict::InsufficientData;
        a.reason = Some("too few samples after the warm-up".into());
        return a;
    }
    // Period of the floors, on at most 512 points.
    let dec = base.len().div_ceil(512);
    let floors_dec: Vec<f64> = base
        .chunks(dec)
        .map(|c| c.iter().map(|w| w.min).fold(f64::INFINITY, f64::min))
        .collect();
    let period_base = period_of(&floors_dec).map(|l| l * dec);
    let per0 = base.len().div_ceil(p.k_max).max(1);
    let mut per = per0;
    let mut k_need = p.k_min;
    if let Some(pb) = period_base {
        per = per.max(2 * pb);
        let w = &base[0];
        let width = (base[base.len() - 1].x1 - w.x0) / base.len() as f64;
        a.period = Some(pb as f64 * width);
        // On the whole process only: the recent half or quarter (multi-scale) is tested more
        // than once and keeps windows of 2 periods.
        if whole_periods && base.len() / per < p.k_min && pb >= per0 {
            // A long period (evals every few thousand steps) in a short run. Windows shorter
            // than the period do when their floors no longer show it (the high part of the
            // cycle, an eval plateau, is shorter than a window): the shortest such.
            // Otherwise one floor per period still strips it (each window holds a whole
            // cycle, its low part included), and 7 such floors are enough for the test
            // (Mann-Kendall can reach p = 1/7! = 2e-4 there).
            per = pb;
            k_need = p.k_min.min(7);
            let mut q = per0;
            while 2 * q <= pb {
                let g = group(base, q);
                let lag = (pb as f64 / q as f64).round() as usize;
                let fl: Vec<f64> = g.iter().map(|w| w.floor).collect();
                if g.len() >= p.k_min && fl.len() >= 2 * lag + 4 {
                    let r = (lag.saturating_sub(1).max(1)..=lag + 1)
                        .map(|l| acf_at(&fl, l))
                        .fold(f64::NEG_INFINITY, f64::max);
                    if r < 0.3 {
                        per = q;
                        k_need = p.k_min;
                        break;
                    }
                }
                q *= 2;
            }
        }
    }
    let aw = group(base, per);
    if aw.len() < k_need {
        a.verdict = Verdict::InsufficientData;
        a.reason = Some(format!(
            "{} windows of a whole period after the warm-up: {} are needed",
            aw.len(),
            k_need
        ));
        return a;
    }
    let k = aw.len();
    let x: Vec<f64> = aw.iter().map(|w| w.x).collect();
    let f: Vec<f64> = aw.iter().map(|w| w.floor).collect();
    let swings: Vec<f64> = aw.iter().map(|w| (w.ceil - w.floor).max(0.0)).collect();
    let mut mk = mann_kendall(&f);
    let mut exact = false;
    if k < p.k_min {
        // Few whole-period floors: the exact distribution of S (no ties), not the normal
        // approximation, which cannot reach alpha below 8 values.
        let mut sorted = f.clone();
        sorted.sort_by(f64::total_cmp);
        if sorted.windows(2).all(|w| w[0] != w[1]) {
            if let Some(pe) = stats::mann_kendall_exact_p(k, mk.s) {
                mk.p_up = pe;
                exact = true;
            }
        }
    }
    let ts = theil_sen(&x, &f, mk.var, p.alpha);
    let ts95 = theil_sen(&x, &f, mk.var, 0.025);
    let res: Vec<f64> = x
        .iter()
        .zip(&f)
        .map(|(xi, fi)| fi - ts.intercept - ts.slope * xi)
        .collect();
    let sigma = mad_sigma(&res);
    let diffs: Vec<f64> = f.windows(2).map(|d| d[1] - d[0]).collect();
    let sigma_d = mad_sigma(&diffs) / std::f64::consts::SQRT_2;
    let level = median(&f);
    let g1_floor = limit
        .map_or(0.01 * level, |l| p.g1_limit_fraction * l)
        .max(1.0);
    let g1 = (p.g1_sigmas * sigma).max(g1_floor);
    let tspan = x[k - 1] - x[0];
    let rise = ts.slope * tspan;

    // Step vs ramp: the best single split.
    let mut step: Option<(usize, f64)> = None;
    {
        let mut pre = vec![0.0; k + 1];
        let mut pre2 = vec![0.0; k + 1];
        for i in 0..k {
            pre[i + 1] = pre[i] + f[i];
            pre2[i + 1] = pre2[i] + f[i] * f[i];
        }
        let sse = |i: usize, j: usize| {
            let n = (j - i) as f64;
            let s = pre[j] - pre[i];
            (pre2[j] - pre2[i]) - s * s / n
        };
        let mut best = (0usize, f64::INFINITY);
        for c in 2..=k - 2 {
            let v = sse(0, c) + sse(c, k);
            if v < best.1 {
                best = (c, v);
            }
        }
        let c = best.0;
        if c >= 2 {
            let (_, _, sse_lin) = stats::ols(&x, &f);
            let d = (pre[k] - pre[c]) / (k - c) as f64 - pre[c] / c as f64;
            let flat = |xs: &[f64], ys: &[f64]| {
                if ys.len() < 5 {
                    return true;
                }
                let m = mann_kendall(ys);
                let t = theil_sen(xs, ys, m.var, 0.025);
                let r = (t.slope * (xs[xs.len() - 1] - xs[0])).abs();
                r < (3.0 * sigma_d).max(0.3 * d.abs())
            };
            let jump = d.abs() >= g1_floor.max(5.0 * sigma_d);
            if jump && best.1 < 0.5 * sse_lin && flat(&x[..c], &f[..c]) && flat(&x[c..], &f[c..]) {
                step = Some((c, d));
            }
        }
    }
    if let Some((c, d)) = step {
        if d > 0.0 && c * 8 <= k && warmup_cuts > 0 {
            // An early rise that then stays flat: the warm-up. Cut it and judge the rest (twice
            // at most: a slow warm-up's tail, cut once, can show as a second early rise).
            let cut_x = aw[c].x0;
            let start = base.iter().position(|w| w.x0 >= cut_x).unwrap_or(0);
            a.warmup_until = Some(cut_x);
            return analyze_from(
                seg,
                &base[start..],
                markers,
                p,
                a,
                warmup_cuts - 1,
                whole_periods,
            );
        }
    }

    a.p_value = mk.p_up;
    a.slope = ts.slope;
    a.slope_ci = (ts95.lo, ts95.hi);
    // A sawtooth seen through windows shorter than its period drops sharply once a period;
    // a leak's floors do not.
    let max_drop = diffs.iter().copied().fold(0.0f64, |m, d| m.max(-d));
    // Sen's 99.9% bound needs 8 values or more to be finite; below, the exact test stands for
    // it, with the 95% bound above zero.
    let lo_ok = ts.lo > 0.0 || (exact && ts95.lo > 0.0);
    let leak = mk.p_up < p.alpha
        && lo_ok
        && rise >= g1
        && step.is_none()
        && (max_drop < 0.5 * rise || max_drop < 6.0 * sigma_d)
        && !decelerating(&x, &f);
    a.suspected = !leak && mk.p_up < 0.01 && ts95.lo > 0.0 && step.is_none();
    let recent = k.min(8);
    a.swing = median(&swings[k - recent..]);
    a.floor_now = ts.intercept + ts.slope * x[k - 1];
    if leak {
        // Current slope: a hinge (flat, then linear) that fits clearly better than a line.
        let (_, _, sse_lin) = stats::ols(&x, &f);
        let mut best = (0usize, f64::INFINITY);
        for h in 1..k.saturating_sub(8) {
            let hx: Vec<f64> = x.iter().map(|xi| (xi - x[h]).max(0.0)).collect();
            let (_, _, s) = stats::ols(&hx, &f);
            if s < best.1 {
                best = (h, s);
            }
        }
        if best.0 > 0 && best.1 < 0.7 * sse_lin {
            let h = best.0;
            let m2 = mann_kendall(&f[h..]);
            let t2 = theil_sen(&x[h..], &f[h..], m2.var, 0.025);
            a.slope = t2.slope;
            a.slope_ci = (t2.lo, t2.hi);
            a.floor_now = t2.intercept + t2.slope * x[k - 1];
            a.growth_since = Some(aw[h].x0);
        }
    } else {
        a.floor_now = median(&f[k - recent..]);
    }
    a.ceiling_now = a.floor_now + a.swing;
    // The normal peak recurs once a period: an eval plateau or a gradient-accumulation peak
    // shorter than a window is not in the windows' swing (their ceiling is the 90th
    // percentile of sub-window maxima), yet it is what reaches the limit first. The peaks of
    // the last (up to 4) whole periods, carried to the end at the floor's slope, count too
    // (their median).
    if let Some(pb) = period_base {
        let m = (base.len() / pb.max(1)).min(4);
        if pb >= 2 && m >= 2 {
            let x_end = base[base.len() - 1].x1;
            let slope = if leak { a.slope } else { 0.0 };
            let peaks: Vec<f64> = (0..m)
                .map(|i| {
                    let c = &base[base.len() - (i + 1) * pb..base.len() - i * pb];
                    let top = c
                        .iter()
                        .max_by(|p, q| p.max.total_cmp(&q.max))
                        .map_or((0.0, x_end), |w| (w.max, w.argmax_x));
                    top.0 + slope * (x_end - top.1)
                })
                .collect();
            a.ceiling_now = a.ceiling_now.max(median(&peaks));
        }
    }
    let x_end = aw[k - 1].x1;

    // Spikes over the base windows, against each analysis window's normal ceiling.
    let ceils: Vec<f64> = aw.iter().map(|w| w.ceil).collect();
    let cx: Vec<f64> = x.clone();
    let cmk = mann_kendall(&ceils);
    let cts = theil_sen(&cx, &ceils, cmk.var, 0.025);
    let cres: Vec<f64> = cx
        .iter()
        .zip(&ceils)
        .map(|(xi, c)| c - cts.intercept - cts.slope * xi)
        .collect();
    let csig = mad_sigma(&cres);
    let spike_abs = limit.map_or(p.spike_fraction * median(&ceils), |l| p.spike_fraction * l);
    // The normal ceiling of window i: the median of the ceilings of windows i-2..=i+2, so an
    // excursion that fills most of a window (sparse samples: a window of a few samples, one of
    // them the spike) does not raise the ceiling it is measured against.
    let normal_ceil: Vec<f64> = (0..k)
        .map(|i| median(&ceils[i.saturating_sub(2)..(i + 3).min(k)]).min(ceils[i]))
        .collect();
    let thr = |i: usize| normal_ceil[i] + spike_abs.max(6.0 * csig);
    let mut spikes: Vec<Spike> = Vec::new();
    let mut spike_x: Vec<f64> = Vec::new();
    let mut j = 0usize;
    let mut cur: Option<(Window, f64)> = None;
    let width = (x_end - aw[0].x0) / base.len().max(1) as f64;
    let tol = (3.0 * width)
        .max(0.002 * (x_end - aw[0].x0))
        .max(match seg.axis {
            Axis::Step => 20.0,
            Axis::Time => 60.0,
            Axis::Ordinal => 1.0,
        });
    for w in base {
        while j + 1 < k && w.x0 > aw[j].x1 {
            j += 1;
        }
        let normal = normal_ceil[j];
        // Hysteresis: an excursion begins above the threshold and lasts while it stays above
        // half of it (a plateau whose noise crosses the threshold is one excursion, not two).
        let above = if cur.is_some() {
            w.max > normal + 0.5 * (thr(j) - normal)
        } else {
            w.max > thr(j)
        };
        if above {
            cur = Some(match cur {
                Some((mut m, n)) => {
                    m.merge(w);
                    (m, n)
                }
                None => (*w, normal),
            });
        } else if let Some((m, n)) = cur.take() {
            spikes.push(Spike {
                step: m.argmax_step,
                ts: m.argmax_ts,
                bytes: m.max as u64,
                above_bytes: (m.max - n).max(0.0) as u64,
                near: near(markers, seg.axis, m.argmax_x, tol),
            });
            spike_x.push(m.argmax_x);
        }
    }
    // An excursion still open at the end is not (yet) isolated: it may be a step.
    if spike_x.len() >= 4 {
        let gaps: Vec<f64> = spike_x.windows(2).map(|g| g[1] - g[0]).collect();
        let mg = median(&gaps);
        let devs: Vec<f64> = gaps.iter().map(|g| (g - mg).abs()).collect();
        let dev = median(&devs);
        // Regular: most gaps within 10% of their median, and at least 3 in 4 gaps a whole
        // number of them within 15% (an excursion missed doubles a gap; 4 random spikes can
        // have two gaps alike, not three).
        let whole = gaps
            .iter()
            .filter(|g| {
                let r = *g / mg;
                r >= 0.85 && (r - r.round()).abs() <= 0.15
            })
            .count();
        a.periodic_spikes = mg > 0.0 && dev <= 0.1 * mg && 4 * whole >= 3 * gaps.len();
    }
    a.spikes = spikes;

    // Forecast.
    if leak {
        if let Some(l) = limit {
            let head = l - a.ceiling_now;
            a.oom_x = Some(if head <= 0.0 {
                x_end
            } else {
                x_end + head / a.slope
            });
            let early = head - 0.01 * l;
            if a.slope_ci.1.is_finite() && a.slope_ci.1 > 0.0 {
                a.oom_x_early = Some(if early <= 0.0 {
                    x_end
                } else {
                    x_end + early / a.slope_ci.1
                });
            }
        }
    }

    // Against the limit, or without one against twice the windows' usual ceiling (a swing of a
    // tenth of what the program holds: the ceiling is below any limit, so its fraction is raised).
    let saw_ref = limit.or_else(|| (!ceils.is_empty()).then(|| 2.0 * median(&ceils)));
    let swing_frac = saw_ref.map(|l| {
        swings
            .iter()
            .filter(|s| **s >= p.sawtooth_fraction * l)
            .count() as f64
            / k as f64
    });
    let sawtooth = swing_frac.is_some_and(|fr| fr >= 0.8)
        || (a.periodic_spikes
            && saw_ref.is_some_and(|l| {
                a.spikes
                    .iter()
                    .all(|s| s.above_bytes as f64 >= p.sawtooth_fraction * l)
            }));
    a.verdict = if leak {
        Verdict::Leak
    } else if let Some((c, d)) = step {
        let bx = aw[c].x0;
        a.step_change = Some(StepChange {
            step: aw[c].s0.or(aw[c - 1].s1),
            ts: aw[c].t0.or(aw[c - 1].t1),
            delta_bytes: d,
            near: near(markers, seg.axis, bx, tol.max(aw[c].x1 - aw[c].x0)),
        });
        Verdict::Step
    } else if !a.spikes.is_empty() && !a.periodic_spikes {
        Verdict::Spikes
    } else if sawtooth {
        Verdict::Sawtooth
    } else {
        Verdict::Stable
    };
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Sample, Series};

    /// Flat (10% sawtooth of period 100, ±0.5% noise) for 50k steps, then a leak of 0.1% of the
    /// limit per 1k steps; judged at `end`.
    fn mid_run(end: u64) -> Analysis {
        let l = 17_179_869_184.0f64;
        let mut s = Series::default();
        let mut z = 0x2545_F491_4F6C_DD1Du64;
        for step in 0..end {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            let noise = ((z >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 0.01 * l;
            let leak = 0.001 * l * step.saturating_sub(50_000) as f64 / 1000.0;
            let v = 0.5 * l + 0.1 * l * (step % 100) as f64 / 100.0 + leak + noise;
            s.push(Sample {
                step: Some(step),
                ts: None,
                used: v as u64,
                limit: Some(l as u64),
                peak: None,
            });
        }
        analyze(s.current().expect("segment"), &[], &Params::default())
    }

    #[test]
    fn mid_run_leak_is_found_on_the_recent_part() {
        // 12k steps after the leak began: the whole process (flat for 50k) does not show it
        // yet; its last quarter does.
        let a = mid_run(62_000);
        assert_eq!(a.verdict, Verdict::Leak, "{a:?}");
        assert!(a.recent_scale.is_some());
        let since = a.growth_since.expect("growth_since");
        assert!((45_000.0..=56_000.0).contains(&since), "{since}");
        let per_1k = a.slope * 1000.0 / 17_179_869_184.0;
        assert!((per_1k - 0.001).abs() < 0.0003, "{per_1k}");
    }

    #[test]
    fn flat_run_stays_stable_at_every_scale() {
        let l = 17_179_869_184.0f64;
        let mut s = Series::default();
        for step in 0..60_000u64 {
            let v = 0.5 * l + 0.1 * l * (step % 100) as f64 / 100.0;
            s.push(Sample {
                step: Some(step),
                ts: None,
                used: v as u64,
                limit: Some(l as u64),
                peak: None,
            });
        }
        let a = analyze(s.current().expect("segment"), &[], &Params::default());
        assert_ne!(a.verdict, Verdict::Leak);
        assert_eq!(a.recent_scale, None);
    }
}
