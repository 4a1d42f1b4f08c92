//! From [`Collected`] inputs to the `trend` report of contract.md (schema_version 1): per-device
//! verdicts and figures, divergence across hosts and chips, PyTorch/XLA counter findings, the
//! end of the run (silent death vs host OOM), causes from the contract vocabulary, and the debug
//! switches to turn on next with their cost.

use crate::detect::{analyze, Analysis, Marker, MarkerKind, Params, Verdict};
use crate::reader::{format_time, Collected, CounterPoint, Ending, Framework};
use crate::stats::{mann_kendall, median, theil_sen};
use crate::store::Axis;
use hbm_doctor_analysis::model::{Cause, CauseKind};
use serde::Serialize;

/// The whole report.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TrendReport {
    /// Always 1.
    pub schema_version: u32,
    /// One per device.
    pub series: Vec<SeriesReport>,
    /// Devices whose growth differs from the others'.
    pub diverging: Vec<DeviceRef>,
    /// Extension: per-host findings (counters, host RSS, how the run ended).
    pub hosts: Vec<HostReport>,
    /// Extension: the debug switches to turn on next, cheapest first.
    pub next_switches: Vec<Switch>,
    /// Extension: `jax`, `pytorch_xla` or null.
    pub framework: Option<&'static str>,
}

impl TrendReport {
    /// Whether any series is a leak (exit code 1).
    pub fn any_leak(&self) -> bool {
        self.series.iter().any(|s| s.verdict == "leak")
    }
}

/// A device named in `diverging`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DeviceRef {
    /// Host.
    pub host: String,
    /// Device.
    pub device: String,
}

/// One spike.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SpikeReport {
    /// Step of its maximum (null without steps).
    pub step: Option<u64>,
    /// Bytes in use at its maximum.
    pub bytes: u64,
    /// `eval`, `checkpoint`, `recompilation`, or null.
    pub near: Option<&'static str>,
    /// Extension: bytes above the normal ceiling.
    pub above_bytes: u64,
    /// Extension: time of its maximum.
    pub time: Option<String>,
}

/// A level change.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StepReport {
    /// Where the new level begins.
    pub step: Option<u64>,
    /// Time it begins.
    pub time: Option<String>,
    /// New floor minus old floor.
    pub delta_bytes: i64,
    /// What the log says happened there.
    pub near: Option<&'static str>,
}

/// One device: the contract's fields, then extensions.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SeriesReport {
    /// Host ("" when the input names none).
    pub host: String,
    /// Device ("0" when the input names none).
    pub device: String,
    /// Samples of the last process.
    pub samples: u64,
    /// First step of the last process.
    pub first_step: Option<u64>,
    /// Last step.
    pub last_step: Option<u64>,
    /// `stable` | `leak` | `spikes` | `step` | `sawtooth` | `insufficient_data`.
    pub verdict: &'static str,
    /// Floor slope now, bytes per 1000 steps.
    pub growth_bytes_per_1k_steps: Option<i64>,
    /// Sen's 95% interval.
    pub growth_ci_bytes_per_1k_steps: Option<[i64; 2]>,
    /// Floor slope now, bytes per hour.
    pub growth_bytes_per_hour: Option<i64>,
    /// The device's limit.
    pub limit_bytes: Option<u64>,
    /// Step at which the ceiling reaches the limit at the current rate (leaks only).
    pub oom_step_forecast: Option<u64>,
    /// Wall time of the same.
    pub oom_time_forecast: Option<String>,
    /// Spikes.
    pub spikes: Vec<SpikeReport>,
    /// Causes, most likely first.
    pub causes: Vec<Cause>,
    /// Extension: where the figures come from.
    pub source: Option<String>,
    /// Extension: `step`, `time` or `sample` (neither in the input).
    pub axis: &'static str,
    /// Extension: Sen's 95% interval per hour.
    pub growth_ci_bytes_per_hour: Option<[i64; 2]>,
    /// Extension: growth per 1000 samples, when the input has neither steps nor times.
    pub growth_bytes_per_1k_samples: Option<i64>,
    /// Extension: Mann–Kendall one-sided p of the floors.
    pub trend_p_value: Option<f64>,
    /// Extension: p < 0.01 with a positive lower bound, but a gate failed (not alerted).
    pub leak_suspected: bool,
    /// Extension: the floor now.
    pub floor_bytes: Option<u64>,
    /// Extension: the normal ceiling now.
    pub ceiling_bytes: Option<u64>,
    /// Extension: typical swing within a window.
    pub swing_bytes: Option<u64>,
    /// Extension: period of the floors, in steps (or seconds on a time axis).
    pub period: Option<f64>,
    /// Extension: the level change when the verdict is `step`.
    pub step_change: Option<StepReport>,
    /// Extension: cautious forecast (Sen's upper slope, 1% margin).
    pub oom_step_forecast_early: Option<u64>,
    /// Extension: its wall time.
    pub oom_time_forecast_early: Option<String>,
    /// Extension: restarts seen (figures describe the last process).
    pub restarts: u32,
    /// Extension: the warm-up excluded, up to this step (or second).
    pub warmup_until: Option<f64>,
    /// Extension: the current growth began here (a leak that started mid-run).
    pub growth_since: Option<f64>,
    /// Extension: why the data are insufficient.
    pub reason: Option<String>,
    /// Extension: the process high-water mark the source reported.
    pub peak_bytes: Option<u64>,
    /// Extension: last value.
    pub last_bytes: u64,
    /// Extension: values skipped as invalid (NaN, infinite, negative, beyond any device).
    pub invalid_samples: u64,
    /// Extension: samples that came out of order and were put back in place (by step within
    /// a process, or by time).
    pub reordered_samples: u64,
    /// Extension: duplicate samples merged (same step and value).
    pub duplicate_samples: u64,
    /// Extension: every reading shows the same level, most of the device, from the first
    /// seconds: a pool the framework preallocated (JAX's 75%, TensorFlow's whole card), seen
    /// from outside the process. Growth inside it does not show in these readings.
    pub pool_plateau_bytes: Option<u64>,
}

/// Per-host findings.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HostReport {
    /// Host.
    pub host: String,
    /// `unknown`, `silent`, `oom_message`, `host_oom`, `error`, `completed`.
    pub ending: &'static str,
    /// Devices at ≥ 95% of their limit at the end.
    pub hbm_at_limit: Vec<String>,
    /// Trainer RSS, last value.
    pub host_rss_bytes: Option<u64>,
    /// Trainer RSS verdict.
    pub host_rss_verdict: Option<&'static str>,
    /// Trainer RSS growth per hour (or per 1k steps when no times).
    pub host_rss_growth_bytes_per_hour: Option<i64>,
    /// PyTorch/XLA: compilations after the warm-up.
    pub compiles_after_warmup: Option<u64>,
    /// PyTorch/XLA: live device data handles growth per 1000 steps.
    pub live_data_handles_per_1k_steps: Option<f64>,
    /// PyTorch/XLA: live XLA tensors growth per 1000 steps.
    pub live_xla_tensors_per_1k_steps: Option<f64>,
    /// PyTorch/XLA: host-to-device transfers per step, early vs late.
    pub transfers_per_step: Option<[f64; 2]>,
    /// PyTorch/XLA: seconds per compilation, early vs late (graph growth).
    pub seconds_per_compile: Option<[f64; 2]>,
    /// Causes.
    pub causes: Vec<Cause>,
}

/// A debug switch to turn on next.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Switch {
    /// How to turn it on.
    pub switch: String,
    /// What it will show.
    pub why: String,
    /// What it costs.
    pub cost: String,
}

fn cause(kind: CauseKind, evidence: String, actions: Vec<String>) -> Cause {
    Cause::new(kind, None, evidence, actions)
}

/// A signed size in the human spelling of `hbm_doctor_units::size` (`1.50G`, `-4.0K`).
fn gib(b: f64) -> String {
    hbm_doctor_units::size::format_signed_f64(b)
}

struct Rates {
    per_1k: Option<f64>,
    ci_1k: Option<(f64, f64)>,
    per_hour: Option<f64>,
    ci_hour: Option<(f64, f64)>,
    per_1k_samples: Option<f64>,
}

fn rates(a: &Analysis) -> Rates {
    let (lo, hi) = a.slope_ci;
    let fin = |v: f64| v.is_finite().then_some(v);
    let ci = |m: f64| match (fin(lo * m), fin(hi * m)) {
        (Some(l), Some(h)) => Some((l, h)),
        _ => None,
    };
    match a.axis {
        Axis::Step => {
            let sph = a.steps_per_second.map(|s| s * 3600.0);
            Rates {
                per_1k: Some(a.slope * 1000.0),
                ci_1k: ci(1000.0),
                per_hour: sph.map(|s| a.slope * s),
                ci_hour: sph.and_then(ci),
                per_1k_samples: None,
            }
        }
        Axis::Time => {
            let k = a.steps_per_second.map(|s| 1000.0 / s);
            Rates {
                per_1k: k.map(|k| a.slope * k),
                ci_1k: k.and_then(ci),
                per_hour: Some(a.slope * 3600.0),
                ci_hour: ci(3600.0),
                per_1k_samples: None,
            }
        }
        Axis::Ordinal => Rates {
            per_1k: None,
            ci_1k: None,
            per_hour: None,
            ci_hour: None,
            per_1k_samples: Some(a.slope * 1000.0),
        },
    }
}

fn x_to_step_time(a: &Analysis, x: f64) -> (Option<u64>, Option<String>) {
    match a.axis {
        Axis::Step => {
            let t = match (a.steps_per_second, a.last_ts, a.last_step) {
                (Some(s), Some(t), Some(ls)) => Some(format_time(t + (x - ls as f64) / s)),
                _ => None,
            };
            (Some(x.round() as u64), t)
        }
        Axis::Time => {
            let s = match (a.steps_per_second, a.last_ts, a.last_step) {
                (Some(s), Some(t), Some(ls)) => Some((ls as f64 + (x - t) * s).round() as u64),
                _ => None,
            };
            (s, Some(format_time(x)))
        }
        Axis::Ordinal => (None, None),
    }
}

fn leak_actions(fw: Option<Framework>, oom_step: Option<u64>) -> Vec<String> {
    let mut v = Vec::new();
    let pt = [
        "do not keep device tensors across steps: log `loss.item()` (or `loss.detach().cpu()`) every N steps instead of appending `loss` to a list",
        "create no persistent small tensors inside the loop (`torch.tensor(x, device=dev)` each step): build them once before it",
        "call `torch_xla.sync()` (`xm.mark_step()`) once per step, and between gradient-accumulation micro-steps, so graphs and their buffers are released",
        "find the holder: `torch_xla._XLAC._xla_tensors_report(100, \"\")` every N steps, and `CreateDataHandles - DestroyDataHandles` in `met.metrics_report()`",
    ];
    let jax = [
        "do not keep `jax.Array`s across steps (lists of losses or metrics): `float(loss)` or `jax.device_get(...)` every N steps",
        "find the holder: group `jax.live_arrays()` by (shape, dtype) at two steps; the group that grows by one per step is the leak",
        "`jax.profiler.save_device_memory_profile()` at two steps and `pprof --diff_base first.prof later.prof` names the allocation site",
        "if executables grow (re-jit with new static arguments or shapes): `JAX_LOG_COMPILES=1`, `JAX_EXPLAIN_CACHE_MISSES=1`; `jax.clear_caches()` as a stopgap",
    ];
    match fw {
        Some(Framework::PytorchXla) => v.extend(pt.iter().map(|s| s.to_string())),
        Some(Framework::Jax) => v.extend(jax.iter().map(|s| s.to_string())),
        None => {
            v.push(pt[0].to_string());
            v.push(jax[0].to_string());
            v.push(pt[1].to_string());
            v.push(jax[1].to_string());
        }
    }
    v.push(match oom_step {
        Some(s) => format!("stopgap: checkpoint periodically and restart the job before step {s}"),
        None => "stopgap: checkpoint periodically and restart the job before the forecast".into(),
    });
    v
}

fn series_report(
    host: &str,
    device: &str,
    d: &crate::reader::DeviceSeries,
    c: &Collected,
    p: &Params,
) -> Option<(SeriesReport, Analysis)> {
    let series = d.series.settled();
    let seg = series.current()?;
    // A marker's place among the readings holds only where the log has one series.
    let one = c.devices.len() == 1;
    let markers: Vec<_> = c
        .markers
        .iter()
        .map(|m| Marker {
            ordinal: m.ordinal.filter(|_| one),
            ..*m
        })
        .collect();
    let a = analyze(seg, &markers, p);
    let mut r = build_series(
        host,
        device,
        d.source.clone(),
        series.real_restarts(),
        seg.peak,
        seg.last_used,
        &a,
        c.framework,
    );
    r.invalid_samples = series.invalid;
    r.reordered_samples = series.reordered;
    r.duplicate_samples = series.duplicates;
    r.pool_plateau_bytes = pool_plateau(seg);
    Some((r, a))
}

/// The level of a preallocated pool, when every reading after the first tenth of the process
/// lies within 1% of it and it is 60% or more of the device (and 1 GiB or more): readings from
/// outside the process (NVML, the runtime's per-device usage) see the pool, not what fills it.
fn pool_plateau(seg: &crate::store::Segment) -> Option<u64> {
    let limit = seg.limit? as f64;
    let w = &seg.windows;
    if seg.samples < 32 || w.len() < 8 {
        return None;
    }
    let rest = &w[w.len() / 10..];
    let mut maxes: Vec<f64> = rest.iter().map(|w| w.max).collect();
    maxes.sort_by(f64::total_cmp);
    let level = maxes[maxes.len() / 2];
    let flat = rest
        .iter()
        .all(|w| (w.min - level).abs() <= 0.01 * level && (w.max - level).abs() <= 0.01 * level);
    (flat && level >= 0.6 * limit && level >= (1u64 << 30) as f64).then_some(level as u64)
}

/// The contract's per-device object for one analysis (also what `top` shows as `trend`).
#[allow(clippy::too_many_arguments)]
pub fn build_series(
    host: &str,
    device: &str,
    source: Option<String>,
    restarts: u32,
    peak: Option<u64>,
    last: u64,
    a: &Analysis,
    fw: Option<Framework>,
) -> SeriesReport {
    let r = rates(a);
    let insufficient = a.verdict == Verdict::InsufficientData;
    let round = |v: f64| v.round() as i64;
    let (oom_step, oom_time) = a.oom_x.map_or((None, None), |x| x_to_step_time(a, x));
    let (oom_step_e, oom_time_e) = a.oom_x_early.map_or((None, None), |x| x_to_step_time(a, x));
    let spikes: Vec<SpikeReport> = a
        .spikes
        .iter()
        .map(|s| SpikeReport {
            step: s.step,
            bytes: s.bytes,
            near: s.near.map(MarkerKind::as_str),
            above_bytes: s.above_bytes,
            time: s.ts.map(format_time),
        })
        .collect();
    let step_change = a.step_change.map(|s| StepReport {
        step: s.step,
        time: s.ts.map(format_time),
        delta_bytes: round(s.delta_bytes),
        near: s.near.map(MarkerKind::as_str),
    });
    let mut causes = Vec::new();
    let per = |v: Option<f64>, unit: &str| v.map(|v| format!("{}/{unit}", gib(v)));
    match a.verdict {
        Verdict::Leak => {
            let mut ev = format!(
                "the floor grows {}",
                [
                    per(r.per_1k, "1k steps"),
                    per(r.per_hour, "hour"),
                    per(r.per_1k_samples, "1k samples")
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(", ")
            );
            if let Some((lo, hi)) = r.ci_1k.or(r.ci_hour) {
                ev.push_str(&format!(" (95% CI {}..{})", gib(lo), gib(hi)));
            }
            ev.push_str(&format!(", Mann-Kendall p={:.1e} over the run", a.p_value));
            if let Some(l) = a.limit {
                ev.push_str(&format!(
                    "; ceiling {} of {} limit",
                    gib(a.ceiling_now),
                    gib(l as f64)
                ));
                if let Some(s) = oom_step {
                    ev.push_str(&format!(", reaches it at step {s}"));
                }
                if let Some(t) = &oom_time {
                    ev.push_str(&format!(" ({t})"));
                }
            }
            causes.push(cause(CauseKind::MemoryLeak, ev, leak_actions(fw, oom_step)));
        }
        Verdict::Step => {
            if let Some(s) = &step_change {
                let kind = if s.near == Some("recompilation") {
                    CauseKind::Recompilation
                } else {
                    CauseKind::MemorySpike
                };
                let at = s.step.map_or_else(
                    || s.time.clone().unwrap_or_default(),
                    |v| format!("step {v}"),
                );
                causes.push(cause(
                    kind,
                    format!(
                        "the floor changed by {} at {at}{} and stayed there",
                        gib(s.delta_bytes as f64),
                        s.near.map_or(String::new(), |n| format!(" (near {n})"))
                    ),
                    vec![
                        "a new program or new buffers from that step on: a new input shape (pad to fixed buckets), an eval or checkpoint path that keeps its buffers, an optimizer state created late".into(),
                        "compare `jax.live_arrays()` (or torch_xla `_xla_tensors_report`) before and after that step".into(),
                    ],
                ));
            }
        }
        _ => {}
    }
    if !spikes.is_empty() && matches!(a.verdict, Verdict::Spikes | Verdict::Leak | Verdict::Step) {
        let top = spikes.iter().max_by_key(|s| s.bytes).cloned();
        if let Some(top) = top {
            let at: Vec<String> = spikes
                .iter()
                .take(5)
                .map(|s| {
                    let w = s.step.map_or_else(
                        || s.time.clone().unwrap_or_default(),
                        |v| format!("step {v}"),
                    );
                    match s.near {
                        Some(n) => format!("{w} ({n})"),
                        None => w,
                    }
                })
                .collect();
            let head = a.limit.map_or(String::new(), |l| {
                format!(
                    "; headroom at the highest: {}",
                    gib(l as f64 - top.bytes as f64)
                )
            });
            let kind = if spikes.iter().all(|s| s.near == Some("recompilation")) {
                CauseKind::Recompilation
            } else {
                CauseKind::MemorySpike
            };
            causes.push(cause(
                kind,
                format!(
                    "{} excursion(s) up to {} (+{} above the normal ceiling) at {}{head}",
                    spikes.len(),
                    gib(top.bytes as f64),
                    gib(top.above_bytes as f64),
                    at.join(", ")
                ),
                vec![
                    "eval: run it under `torch.no_grad()` / a separate jitted eval step with a smaller eval batch, and free its outputs".into(),
                    "checkpoint: save from host copies (`xm.save`, Orbax async checkpointing) rather than materializing extra device copies".into(),
                    "recompilation for a new shape: pad inputs to a few fixed shapes".into(),
                ],
            ));
        }
    }
    SeriesReport {
        host: host.to_string(),
        device: device.to_string(),
        samples: a.samples,
        first_step: a.first_step,
        last_step: a.last_step,
        verdict: a.verdict.as_str(),
        growth_bytes_per_1k_steps: (!insufficient).then_some(r.per_1k.map(round)).flatten(),
        growth_ci_bytes_per_1k_steps: (!insufficient)
            .then_some(r.ci_1k.map(|(l, h)| [round(l), round(h)]))
            .flatten(),
        growth_bytes_per_hour: (!insufficient).then_some(r.per_hour.map(round)).flatten(),
        limit_bytes: a.limit,
        oom_step_forecast: oom_step,
        oom_time_forecast: oom_time,
        spikes,
        causes,
        source,
        axis: match a.axis {
            Axis::Step => "step",
            Axis::Time => "time",
            Axis::Ordinal => "sample",
        },
        growth_ci_bytes_per_hour: (!insufficient)
            .then_some(r.ci_hour.map(|(l, h)| [round(l), round(h)]))
            .flatten(),
        growth_bytes_per_1k_samples: (!insufficient)
            .then_some(r.per_1k_samples.map(round))
            .flatten(),
        trend_p_value: (!insufficient).then_some(a.p_value),
        leak_suspected: a.suspected,
        floor_bytes: (!insufficient).then_some(a.floor_now.max(0.0) as u64),
        ceiling_bytes: (!insufficient).then_some(a.ceiling_now.max(0.0) as u64),
        swing_bytes: (!insufficient).then_some(a.swing.max(0.0) as u64),
        period: a.period,
        step_change,
        oom_step_forecast_early: oom_step_e,
        oom_time_forecast_early: oom_time_e,
        restarts,
        warmup_until: a.warmup_until,
        growth_since: a.growth_since,
        reason: a.reason.clone(),
        peak_bytes: peak,
        last_bytes: last,
        invalid_samples: 0,
        reordered_samples: 0,
        duplicate_samples: 0,
        pool_plateau_bytes: None,
    }
}

/// Compilations counted by a report at step `step`, when they clearly outnumber the steps
/// (a single report of a run that recompiles nearly every step): at step ≥ 5, more than
/// 2 × (step + 1) + 4.
fn compiles_outnumber_steps(cps: &[CounterPoint]) -> Option<(u64, u64)> {
    let last = cps.iter().rev().find(|c| c.step.is_some())?;
    let (step, n) = (last.step?, last.uncached_compiles?);
    (step >= 5 && n > 2 * (step + 1) + 4).then_some((n, step))
}

fn recompilation_cause(ev: String) -> Cause {
    cause(
        CauseKind::Recompilation,
        ev,
        vec![
            "call `torch_xla.sync()` (`xm.mark_step()`) at the end of every step so a graph covers one step".into(),
            "keep shapes fixed: pad variable-length batches to a few buckets; do not turn Python scalars that change (per-group learning rates, step counters) into graph constants: pass them as device tensors".into(),
            "`PT_XLA_DEBUG_LEVEL=1` prints the `Compilation Cause` and the Python frame of each recompilation".into(),
            "a larger compilation cache (`XLA_COMPILATION_CACHE_SIZE`... or the persistent cache) only hides the cost; each cached executable also takes HBM for its code".into(),
        ],
    )
}

fn counter_findings(h: &mut HostReport, cps: &[CounterPoint], fw_pt: bool) {
    if cps.len() < 4 {
        if let Some((n, step)) = compiles_outnumber_steps(cps) {
            h.causes.push(recompilation_cause(format!(
                "{n} compilations by step {step} (CompileTime/UncachedCompile): more than the steps themselves, a new graph nearly every step"
            )));
        }
        return;
    }
    let xs: Vec<f64> = cps
        .iter()
        .map(|c| c.step.map_or(c.ordinal as f64, |s| s as f64))
        .collect();
    let span = xs[xs.len() - 1] - xs[0];
    let warm_x = xs[0] + (0.1 * span).max(50.0).min(0.5 * span);
    let w = xs.iter().position(|x| *x >= warm_x).unwrap_or(0);
    let after = &cps[w..];
    let ax = &xs[w..];
    if after.len() < 3 {
        return;
    }
    let first = after[0];
    let last = after[after.len() - 1];
    if let (Some(a), Some(b)) = (first.uncached_compiles, last.uncached_compiles) {
        h.compiles_after_warmup = Some(b.saturating_sub(a));
    }
    let growth = |f: &dyn Fn(&CounterPoint) -> Option<i64>| -> Option<f64> {
        let pts: Vec<(f64, f64)> = after
            .iter()
            .zip(ax)
            .filter_map(|(c, x)| f(c).map(|v| (*x, v as f64)))
            .collect();
        if pts.len() < 6 {
            return None;
        }
        let x: Vec<f64> = pts.iter().map(|p| p.0).collect();
        let y: Vec<f64> = pts.iter().map(|p| p.1).collect();
        let mk = mann_kendall(&y);
        let ts = theil_sen(&x, &y, mk.var, 0.001);
        let rise = y[y.len() - 1] - y[0];
        (mk.p_up < 0.001 && ts.lo > 0.0 && rise >= 20.0).then_some(ts.slope * 1000.0)
    };
    h.live_data_handles_per_1k_steps = growth(&|c| c.live_data_handles);
    h.live_xla_tensors_per_1k_steps = growth(&|c| c.live_xla_tensors);
    let half = after.len() / 2;
    let rate = |a: &CounterPoint, b: &CounterPoint, xa: f64, xb: f64| -> Option<f64> {
        let (ta, tb) = (a.transfers_to_device?, b.transfers_to_device?);
        (xb > xa).then(|| tb.saturating_sub(ta) as f64 / (xb - xa))
    };
    if half >= 2 {
        if let (Some(r1), Some(r2)) = (
            rate(&after[0], &after[half], ax[0], ax[half]),
            rate(&after[half], &last, ax[half], ax[ax.len() - 1]),
        ) {
            h.transfers_per_step = Some([r1, r2]);
        }
        let spc = |a: &CounterPoint, b: &CounterPoint| -> Option<f64> {
            let n = b.uncached_compiles?.checked_sub(a.uncached_compiles?)?;
            let s = b.compile_seconds? - a.compile_seconds?;
            (n > 0).then_some(s / n as f64)
        };
        if let (Some(a), Some(b)) = (spc(&cps[0], &after[half]), spc(&after[half], &last)) {
            h.seconds_per_compile = Some([a, b]);
        }
    }
    let storm = h.compiles_after_warmup.is_some_and(|n| n >= 3);
    if storm || h.seconds_per_compile.is_some_and(|[a, b]| b > 1.5 * a) {
        let n = h.compiles_after_warmup.unwrap_or(0);
        let mut ev = format!("UncachedCompile rose by {n} after the warm-up");
        if let Some([a, b]) = h.seconds_per_compile {
            ev.push_str(&format!("; seconds per compilation {a:.1} then {b:.1}"));
            if b > 1.5 * a {
                ev.push_str(" (graphs growing: a step that is never cut by mark_step)");
            }
        }
        h.causes.push(recompilation_cause(ev));
    }
    if let Some(g) = h
        .live_data_handles_per_1k_steps
        .or(h.live_xla_tensors_per_1k_steps)
    {
        h.causes.push(cause(
            CauseKind::MemoryLeak,
            format!("live device data handles grow {g:.0} per 1k steps (CreateDataHandles - DestroyDataHandles): buffers accumulate across steps"),
            leak_actions(Some(Framework::PytorchXla), None),
        ));
    }
    if let Some([a, b]) = h.transfers_per_step {
        if b > 1.5 * a + 0.5 {
            h.causes.push(cause(
                CauseKind::MemoryLeak,
                format!("host-to-device transfers grow from {a:.1} to {b:.1} per step: new small tensors are sent to the device every step"),
                vec![
                    "no persistent small tensors in the loop: create constants (masks, scalars, position ids) once, outside the loop".into(),
                    "avoid `.item()`/`print(tensor)` in the step; they force transfers and extra graphs".into(),
                ],
            ));
        }
    }
    let _ = fw_pt;
}

fn switches(
    fw: Option<Framework>,
    any_leak: bool,
    any_counters: bool,
    any_recompile: bool,
) -> Vec<Switch> {
    let s = |a: &str, b: &str, c: &str| Switch {
        switch: a.into(),
        why: b.into(),
        cost: c.into(),
    };
    let mut v = Vec::new();
    v.push(s(
        "hbm_doctor.sampler.Sampler(path, every_steps=50) (or `hbm-doctor record --pid PID`)",
        "per-step device memory with steps, the input this detector is best at",
        "negligible: one memory_stats()/get_memory_info() call every 50 steps",
    ));
    if fw != Some(Framework::Jax) {
        if !any_counters {
            v.push(s(
                "`met.short_metrics_report()` every 100 steps (or XLA_METRICS_FILE for a short run)",
                "UncachedCompile, CreateDataHandles/DestroyDataHandles, TransferToDevice over time: recompilation storms and buffer accumulation",
                "short report: small. XLA_METRICS_FILE writes the full report at every mark_step: several KB per step, GBs over 80k steps; do not leave it on for days",
            ));
        }
        v.push(s(
            "PT_XLA_DEBUG_LEVEL=1 (PT_XLA_DEBUG_FILE=path)",
            "the cause and Python frame of every compilation; `CompileTime too frequent` warnings",
            "low: output per compilation only (level 2 adds per-execution analysis and slows every step)",
        ));
        if any_leak {
            v.push(s(
                "`torch_xla._XLAC._xla_tensors_report(100, \"\")` every few thousand steps",
                "which live tensors hold large pending graphs, with their Python frames",
                "walks every live tensor: seconds per call; call rarely",
            ));
        }
        if any_leak || any_recompile {
            v.push(s(
                "XLA_IR_DEBUG=1 XLA_HLO_DEBUG=1 (with XLA_FLAGS=--xla_dump_to=DIR)",
                "Python source lines in IR/HLO metadata, so `hbm-doctor analyze DIR` names the line that allocates",
                "high: a Python stack captured for every IR node, tracing much slower; use on a short reproduction, not the 80k-step run",
            ));
        }
    }
    if fw != Some(Framework::PytorchXla) {
        if any_leak {
            v.push(s(
                "`jax.live_arrays()` grouped by (shape, dtype) every N steps",
                "the group of arrays that grows by one per step",
                "proportional to the number of live arrays: milliseconds to a second; every few thousand steps",
            ));
            v.push(s(
                "jax.profiler.save_device_memory_profile() at two steps, then `pprof --diff_base`",
                "the allocation sites that grew, with Python tracebacks",
                "a few hundred ms per profile; two calls",
            ));
        }
        v.push(s(
            "JAX_LOG_COMPILES=1 (and JAX_EXPLAIN_CACHE_MISSES=1)",
            "every (re)compilation and why the cache missed",
            "low: one log line per compilation",
        ));
    }
    v.push(s(
        "a profiler capture (xprof / `xp.trace` / `jax.profiler.trace`) of a few steps, memory viewer",
        "the allocations of one step at full resolution",
        "high while capturing (seconds of slow steps, large files): capture a few steps, never the whole run",
    ));
    v
}

/// Builds the report from everything read.
pub fn report(c: &Collected, p: &Params) -> TrendReport {
    // The host's RSS is the series when the input has no device's (a posted `rss 576 MB` log,
    // a CPU program's readings): it is judged like one, named `host RSS` (the host's own
    // `host_rss_*` fields keep their figures).
    // A device that never held a byte (`Allocated: 0.00 MB` at every epoch of a program that
    // runs on the CPU) is no device's series.
    let nothing_held = |d: &crate::reader::DeviceSeries| {
        d.series.total_samples > 0
            && d.series
                .segments
                .iter()
                .all(|s| s.last_used == 0 && s.windows.iter().all(|w| w.max <= 0.0))
            && d.series.raw.iter().all(|s| s.used == 0)
    };
    if c.devices.values().all(nothing_held) && c.hosts.values().any(|h| h.rss.total_samples > 0) {
        let mut own = c.clone();
        own.devices.clear();
        for (name, h) in &c.hosts {
            if h.rss.total_samples > 0 {
                let rss = h.rss.clone();
                own.devices.insert(
                    (name.clone(), "host RSS".to_string()),
                    crate::reader::DeviceSeries {
                        series: rss,
                        source: Some("host RSS".to_string()),
                    },
                );
            }
        }
        return report(&own, p);
    }
    let mut series = Vec::new();
    let mut analyses = Vec::new();
    for ((host, dev), d) in &c.devices {
        if let Some((s, a)) = series_report(host, dev, d, c, p) {
            series.push(s);
            analyses.push(a);
        }
    }
    // Divergence.
    let mut diverging = Vec::new();
    let judged: Vec<(usize, f64, f64, f64)> = analyses
        .iter()
        .enumerate()
        .filter(|(_, a)| a.verdict != Verdict::InsufficientData)
        .map(|(i, a)| (i, a.slope, a.slope_ci.0, a.slope_ci.1))
        .collect();
    let leaks: Vec<usize> = judged
        .iter()
        .filter(|j| analyses[j.0].verdict == Verdict::Leak)
        .map(|j| j.0)
        .collect();
    if judged.len() >= 2 && !leaks.is_empty() && leaks.len() * 2 <= judged.len() {
        // Leaks among devices that do not leak: the leaking devices diverge when they grow
        // faster than the others do (their Sen interval above the others' median slope).
        let others: Vec<f64> = judged
            .iter()
            .filter(|j| analyses[j.0].verdict != Verdict::Leak)
            .map(|j| j.1)
            .collect();
        let m = median(&others);
        for &(i, _, lo, _) in &judged {
            if leaks.contains(&i) && lo > m {
                diverging.push(DeviceRef {
                    host: series[i].host.clone(),
                    device: series[i].device.clone(),
                });
            }
        }
    } else if judged.len() >= 2 && !leaks.is_empty() {
        let m = median(&judged.iter().map(|j| j.1).collect::<Vec<_>>());
        for &(i, b, lo, hi) in &judged {
            let l = analyses[i].limit.map_or(0.0, |l| l as f64);
            let unit = match analyses[i].axis {
                Axis::Step => 1e-3,
                Axis::Time => 1.0 / 3600.0,
                Axis::Ordinal => 1e-3,
            };
            let floor = (0.0001 * l * unit).max(1e-9);
            let leak_mismatch = (analyses[i].verdict == Verdict::Leak)
                != (judged
                    .iter()
                    .filter(|j| analyses[j.0].verdict == Verdict::Leak)
                    .count()
                    * 2
                    > judged.len());
            if (m < lo || m > hi)
                && (b - m).abs() >= (0.25 * m.abs()).max(floor)
                && (leak_mismatch || (b - m).abs() >= 0.5 * m.abs().max(floor))
            {
                diverging.push(DeviceRef {
                    host: series[i].host.clone(),
                    device: series[i].device.clone(),
                });
            }
        }
        if diverging.len() * 2 > judged.len() {
            diverging.clear();
        }
    }
    // Hosts.
    let mut hosts = Vec::new();
    let mut host_names: Vec<String> = c.hosts.keys().cloned().collect();
    for (h, _) in c.devices.keys() {
        if !host_names.contains(h) {
            host_names.push(h.clone());
        }
    }
    host_names.sort();
    let mut any_counters = false;
    let mut any_recompile = false;
    for name in host_names {
        let info = c.hosts.get(&name).cloned().unwrap_or_default();
        let mut hr = HostReport {
            host: name.clone(),
            ending: info.ending.as_str(),
            hbm_at_limit: Vec::new(),
            host_rss_bytes: None,
            host_rss_verdict: None,
            host_rss_growth_bytes_per_hour: None,
            compiles_after_warmup: None,
            live_data_handles_per_1k_steps: None,
            live_xla_tensors_per_1k_steps: None,
            transfers_per_step: None,
            seconds_per_compile: None,
            causes: Vec::new(),
        };
        for (s, a) in series.iter().zip(&analyses) {
            if s.host != name {
                continue;
            }
            if let Some(l) = s.limit_bytes {
                let top = a.ceiling_now.max(s.last_bytes as f64);
                if top >= 0.95 * l as f64 {
                    hr.hbm_at_limit.push(s.device.clone());
                }
            }
        }
        let mut rss_leak = false;
        if let Some(seg) = info.rss.current() {
            hr.host_rss_bytes = Some(seg.last_used);
            let a = analyze(seg, &[], p);
            hr.host_rss_verdict = Some(a.verdict.as_str());
            if a.verdict != Verdict::InsufficientData {
                let r = rates(&a);
                hr.host_rss_growth_bytes_per_hour =
                    r.per_hour.or(r.per_1k).map(|v| v.round() as i64);
            }
            rss_leak = a.verdict == Verdict::Leak;
        }
        if !info.counters.is_empty() {
            any_counters = true;
        }
        counter_findings(
            &mut hr,
            &info.counters,
            c.framework == Some(Framework::PytorchXla),
        );
        if info.late_compiles >= 3 || info.compile_too_frequent > 0 {
            any_recompile = true;
            if !hr
                .causes
                .iter()
                .any(|x| x.cause == CauseKind::Recompilation)
            {
                hr.causes.push(cause(
                    CauseKind::Recompilation,
                    format!(
                        "{} compilations logged after step 50{}{}",
                        info.late_compiles,
                        if info.compile_too_frequent > 0 { "; pt-xla-profiler: CompileTime too frequent" } else { "" },
                        info.graph_inputs.map_or(String::new(), |(f, l, k)| format!("; graph inputs {f} -> {l} over {k} compilations"))
                    ),
                    vec![
                        "keep shapes fixed (pad to buckets) and call `torch_xla.sync()` once per step".into(),
                        "read the `Compilation Cause` lines (PT_XLA_DEBUG_LEVEL=1) or JAX_EXPLAIN_CACHE_MISSES=1 for the line that retraces".into(),
                    ],
                ));
            }
        }
        if hr
            .causes
            .iter()
            .any(|x| x.cause == CauseKind::Recompilation)
        {
            any_recompile = true;
        }
        // How the run ended.
        let silent = matches!(info.ending, Ending::Silent);
        if info.ending == Ending::HostOom || (silent && rss_leak) {
            let mut ev = match (&info.host_oom_evidence, info.ending) {
                (Some(e), Ending::HostOom) => {
                    format!("the kernel OOM killer ended the trainer: `{e}`")
                }
                _ => "the log ends with no message while the trainer's host RSS grew".to_string(),
            };
            if let (Some(g), Some(b)) = (hr.host_rss_growth_bytes_per_hour, hr.host_rss_bytes) {
                ev.push_str(&format!(
                    "; RSS {} growing {}/hour",
                    gib(b as f64),
                    gib(g as f64)
                ));
            }
            if hr.hbm_at_limit.is_empty() {
                ev.push_str("; device memory was not at its limit");
            }
            hr.causes.push(cause(
                CauseKind::HostOom,
                ev,
                vec![
                    "host RAM, not HBM: check `dmesg -T | grep -i 'killed process'` on the host".into(),
                    "look for host-side growth: Python lists of tensors moved to CPU, data-loader workers and prefetch depth, metric/XLA_SAVE_TENSORS files kept in memory".into(),
                    "record the trainer's RSS: `hbm-doctor record --pid PID`".into(),
                ],
            ));
        } else if silent && !hr.hbm_at_limit.is_empty() {
            {
                hr.causes.push(cause(
                    CauseKind::MemoryLeak,
                    format!(
                        "the log ends with no message while device(s) {} were at >= 95% of the limit: an HBM OOM whose message was lost (another rank may have printed it)",
                        hr.hbm_at_limit.join(", ")
                    ),
                    vec!["read every rank's log for RESOURCE_EXHAUSTED; run `hbm-doctor explain` on it".into()],
                ));
            }
        }
        hosts.push(hr);
    }
    let any_leak = series.iter().any(|s| s.verdict == "leak");
    let next_switches = switches(c.framework, any_leak, any_counters, any_recompile);
    TrendReport {
        schema_version: 1,
        series,
        diverging,
        hosts,
        next_switches,
        framework: c.framework.map(|f| match f {
            Framework::Jax => "jax",
            Framework::PytorchXla => "pytorch_xla",
        }),
    }
}
