//! The live detector behind `top`/`record`/`exporter`: fed one sample at a time, asked for a
//! view now and then. It keeps the same bounded [`Series`] per device and runs the same
//! [`analyze`](crate::detect::analyze()) at most once per [`Live::every`] new samples, and raises
//! `leak` only once the verdict is confirmed at 1.5× the position where it first appeared (the
//! rule the simulation study measures), so warm-ups do not alarm.

use crate::detect::{analyze, Analysis, Params, Verdict};
use crate::report::{build_series, SeriesReport};
use crate::store::{Axis, Sample, Series};
use std::collections::BTreeMap;

/// One device's live state.
#[derive(Debug, Clone, Default)]
struct Dev {
    series: Series,
    since: u64,
    last: Option<(SeriesReport, Analysis)>,
    confirm: Confirm,
    /// Restarts seen at the last analysis (a new process resets the confirmation).
    restarts: u32,
}

/// The confirmation rule of docs/trend.md and the simulation: a `leak` verdict first seen at
/// position s of the process (of the growth, when it began mid-run) raises the alarm only when a later evaluation at
/// ≥ 1.5 · max(s, [`min_first`]) says `leak` too, every evaluation between saying `leak`.
pub const CONFIRM_FACTOR: f64 = 1.5;

/// Position of the end of an analysis in its process: steps, seconds or samples since the
/// process began (at least 1).
pub fn position(a: &Analysis) -> f64 {
    let p = match (a.first_step, a.last_step, a.first_ts, a.last_ts) {
        (Some(f), Some(l), _, _) if a.axis == Axis::Step => l.saturating_sub(f) as f64,
        (_, _, Some(f), Some(l)) if a.axis == Axis::Time => l - f,
        _ => a.samples as f64,
    };
    p.max(1.0)
}

/// The smallest s the rule counts from: twice the shortest span the detector judges (2400
/// steps, 1 hour, 128 samples). A live feed is evaluated every few samples, so its first
/// verdict comes as early as 1200 steps, deep in a slow warm-up (τ = 1000 steps still rises
/// at 1.8k); the simulation's evaluations every 1000 steps first judge at 2000.
pub fn min_first(axis: Axis, p: &Params) -> f64 {
    match axis {
        Axis::Step => 2400.0,
        Axis::Time => 3600.0,
        Axis::Ordinal => 2.0 * p.min_samples as f64,
    }
}

/// The state of the confirmation rule for one device.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Confirm {
    /// Position of the first of the current run of `leak` verdicts.
    pub since: Option<f64>,
    /// Whether the alarm is raised.
    pub confirmed: bool,
}

impl Confirm {
    /// One evaluation; returns whether the alarm is raised. A verdict other than `leak`
    /// resets the rule.
    pub fn update(&mut self, a: &Analysis, p: &Params) -> bool {
        if a.verdict != Verdict::Leak {
            *self = Confirm::default();
            return false;
        }
        // A leak found to begin mid-run (`growth_since`, from the hinge fit or the recent-part
        // test) is counted from where it began: its age, not the process's.
        let start = match a.axis {
            Axis::Step => a.first_step.map(|v| v as f64),
            Axis::Time => a.first_ts,
            Axis::Ordinal => None,
        };
        let pos = match (a.growth_since, start) {
            (Some(g), Some(s0)) if g > s0 => (position(a) - (g - s0)).max(1.0),
            _ => position(a),
        };
        match self.since {
            None => self.since = Some(pos),
            Some(first) if pos >= CONFIRM_FACTOR * first.max(min_first(a.axis, p)) => {
                self.confirmed = true
            }
            Some(_) => {}
        }
        self.confirmed
    }
}

/// Live detectors keyed by any ordered key.
#[derive(Debug, Clone)]
pub struct Live<K: Ord + Clone> {
    devs: BTreeMap<K, Dev>,
    /// Re-analyse after this many new samples.
    pub every: u64,
    /// Detector parameters.
    pub params: Params,
}

impl<K: Ord + Clone> Default for Live<K> {
    fn default() -> Self {
        Live {
            devs: BTreeMap::new(),
            every: 10,
            params: Params::default(),
        }
    }
}

/// What the exporter and TUI need, derived from an analysis.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveView {
    /// The contract's per-device object.
    pub report: SeriesReport,
    /// Floor slope in bytes per second, when times are known.
    pub bytes_per_second: Option<f64>,
    /// Seconds until the ceiling reaches the limit.
    pub oom_eta_seconds: Option<f64>,
    /// `ok`, `warming_up`, `step_change`, `leak_suspected`, `leak`. `leak` only once the
    /// detector's `leak` verdict is confirmed ([`CONFIRM_FACTOR`]); before, `leak_suspected`.
    pub leak_state: &'static str,
}

impl<K: Ord + Clone> Live<K> {
    /// One observation.
    pub fn observe(&mut self, key: &K, ts: f64, used: u64, limit: Option<u64>, step: Option<u64>) {
        let d = self.devs.entry(key.clone()).or_default();
        d.series.push(Sample {
            step,
            ts: Some(ts),
            used,
            limit,
            peak: None,
        });
        d.since += 1;
    }

    /// The current view of a device (re-analysed when enough new samples arrived).
    pub fn view(&mut self, key: &K) -> Option<LiveView> {
        let every = self.every;
        let params = self.params;
        let d = self.devs.get_mut(key)?;
        if d.last.is_none() || d.since >= every {
            let seg = d.series.current()?;
            let a = analyze(seg, &[], &params);
            let r = build_series(
                "",
                "",
                None,
                d.series.restarts,
                seg.peak,
                seg.last_used,
                &a,
                None,
            );
            if d.series.restarts != d.restarts {
                d.restarts = d.series.restarts;
                d.confirm = Confirm::default();
            }
            d.confirm.update(&a, &params);
            d.last = Some((r, a));
            d.since = 0;
        }
        let confirmed = d.confirm.confirmed;
        let (r, a) = d.last.as_ref()?;
        let bps = match a.axis {
            Axis::Time => Some(a.slope),
            Axis::Step => a.steps_per_second.map(|s| a.slope * s),
            Axis::Ordinal => None,
        };
        let eta = match (r.oom_time_forecast.as_ref(), a.oom_x, a.last_ts, a.axis) {
            (_, Some(x), Some(t), Axis::Time) => Some((x - t).max(0.0)),
            (_, Some(x), Some(_), Axis::Step) => match (a.steps_per_second, a.last_step) {
                (Some(s), Some(ls)) => Some(((x - ls as f64) / s).max(0.0)),
                _ => None,
            },
            _ => None,
        };
        let state = match a.verdict {
            Verdict::InsufficientData => "warming_up",
            Verdict::Leak if confirmed => "leak",
            // Not yet confirmed: a long warm-up looks like a leak at first.
            Verdict::Leak => "leak_suspected",
            Verdict::Step => "step_change",
            _ if a.suspected => "leak_suspected",
            _ => "ok",
        };
        Some(LiveView {
            report: r.clone(),
            bytes_per_second: bps,
            oom_eta_seconds: eta,
            leak_state: state,
        })
    }
}
