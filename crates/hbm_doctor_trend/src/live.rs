//! The live detector behind `top`/`record`/`exporter`: fed one sample at a time, asked for a
//! view now and then. It keeps the same bounded [`Series`] per device and runs the same
//! [`analyze`](crate::detect::analyze) at most once per [`Live::every`] new samples.

use crate::detect::{analyze, Analysis, Params, Verdict};
use crate::report::{build_series, SeriesReport};
use crate::store::{Sample, Series};
use std::collections::BTreeMap;

/// One device's live state.
#[derive(Debug, Clone, Default)]
struct Dev {
    series: Series,
    since: u64,
    last: Option<(SeriesReport, Analysis)>,
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
    /// `ok`, `warming_up`, `step_change`, `leak_suspected`, `leak`.
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
            d.last = Some((r, a));
            d.since = 0;
        }
        let (r, a) = d.last.as_ref()?;
        let bps = match a.axis {
            crate::store::Axis::Time => Some(a.slope),
            crate::store::Axis::Step => a.steps_per_second.map(|s| a.slope * s),
            crate::store::Axis::Ordinal => None,
        };
        let eta = match (r.oom_time_forecast.as_ref(), a.oom_x, a.last_ts, a.axis) {
            (_, Some(x), Some(t), crate::store::Axis::Time) => Some((x - t).max(0.0)),
            (_, Some(x), Some(_), crate::store::Axis::Step) => {
                match (a.steps_per_second, a.last_step) {
                    (Some(s), Some(ls)) => Some(((x - ls as f64) / s).max(0.0)),
                    _ => None,
                }
            }
            _ => None,
        };
        let state = match a.verdict {
            Verdict::InsufficientData => "warming_up",
            Verdict::Leak => "leak",
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
