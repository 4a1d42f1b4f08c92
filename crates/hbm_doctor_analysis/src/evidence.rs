//! Evidence captured inside the failing process (docs/evidence.md): live arrays and who holds
//! them, the allocator's statistics, cached executables, the memory series. It fills figures the
//! message lacks, adds parts to the ledger and decides causes the text alone cannot.
//!
//! Every field is optional: a writer gives what it has, and an unknown field is ignored.

use crate::model::{Cause, CauseKind, Diagnosis, ExplainReport, LedgerEntry};
use hbm_doctor_log::{format_size, Event, Phase, Stage};
use serde::Deserialize;

/// The evidence file (`schema_version` 1).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Evidence {
    /// Format version.
    pub schema_version: Option<u32>,
    /// Must be `hbm_doctor_evidence` when present.
    pub kind: Option<String>,
    /// `jax` or `pytorch_xla`.
    pub framework: Option<String>,
    /// The training step at the failure.
    pub step: Option<u64>,
    /// The exception that was raised.
    pub exception: Option<ExceptionInfo>,
    /// Allocator statistics per local device.
    pub devices: Vec<DeviceStats>,
    /// Live arrays grouped by shape, dtype and sharding.
    pub live_arrays: Vec<ArrayGroup>,
    /// Python objects that reference live arrays.
    pub holders: Vec<Holder>,
    /// Compiled executables still cached.
    pub executables: Vec<Executable>,
    /// The memory series that led to the failure.
    pub series: Vec<SeriesPoint>,
}

/// The raised exception.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ExceptionInfo {
    /// Its type.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// `str(exc)`.
    pub message: Option<String>,
    /// The formatted traceback.
    pub traceback: Option<String>,
}

/// `Device.memory_stats()` of one device.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct DeviceStats {
    /// Device id.
    pub id: Option<serde_json::Value>,
    /// Device kind.
    pub kind: Option<String>,
    /// Bytes the allocator holds.
    pub bytes_in_use: Option<u64>,
    /// Its peak.
    pub peak_bytes_in_use: Option<u64>,
    /// The allocator's limit.
    pub bytes_limit: Option<u64>,
    /// The largest free block.
    pub largest_free_block_bytes: Option<u64>,
}

/// A group of live arrays.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ArrayGroup {
    /// `f32[1024,1024]`.
    pub shape: Option<String>,
    /// How many arrays.
    pub count: Option<u64>,
    /// Bytes over every device.
    pub total_bytes: Option<u64>,
    /// Devices each array spans.
    pub devices: Option<u64>,
}

/// A Python object holding live arrays.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Holder {
    /// The name it is reachable by (`losses`, `self.cache`).
    pub name: Option<String>,
    /// `list`, `dict`, `global`, `attribute`.
    pub kind: Option<String>,
    /// Module and function.
    #[serde(rename = "where")]
    pub location: Option<String>,
    /// Arrays it holds.
    pub arrays: Option<u64>,
    /// Their bytes.
    pub bytes: Option<u64>,
    /// One of their shapes.
    pub example: Option<String>,
}

/// A cached executable.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Executable {
    /// `jit_train_step`.
    pub name: Option<String>,
    /// Compiled versions cached.
    pub count: Option<u64>,
    /// Temporaries of the largest.
    pub temp_bytes: Option<u64>,
    /// Its code.
    pub generated_code_bytes: Option<u64>,
}

/// One sample of the series.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct SeriesPoint {
    /// Training step.
    pub step: Option<u64>,
    /// Bytes in use.
    pub bytes_in_use: Option<u64>,
}

impl Evidence {
    /// Parses the file's text; `Err` says what is wrong in one line.
    pub fn parse(text: &str) -> Result<Evidence, String> {
        let ev: Evidence =
            serde_json::from_str(text).map_err(|e| format!("not evidence JSON: {e}"))?;
        if let Some(k) = &ev.kind {
            if k != "hbm_doctor_evidence" {
                return Err(format!("`kind` is `{k}`, not `hbm_doctor_evidence`"));
            }
        }
        if ev.schema_version.is_some_and(|v| v > 1) {
            return Err(format!(
                "schema_version {} is newer than this hbm-doctor reads (1): upgrade hbm-doctor",
                ev.schema_version.unwrap_or(0)
            ));
        }
        Ok(ev)
    }

    /// The text to scan for the OOM event when the log itself has none: the exception's
    /// traceback and message.
    pub fn exception_text(&self) -> Option<String> {
        let e = self.exception.as_ref()?;
        let mut t = e.traceback.clone().unwrap_or_default();
        if let Some(m) = &e.message {
            if !t.contains(m.as_str()) {
                t.push('\n');
                t.push_str(m);
            }
        }
        (!t.trim().is_empty()).then_some(t)
    }

    /// The device whose allocator holds the most.
    fn fullest(&self) -> Option<&DeviceStats> {
        self.devices
            .iter()
            .max_by_key(|d| d.bytes_in_use.unwrap_or(0))
    }

    fn live_per_device(&self) -> u64 {
        let devices = self.devices.len().max(1) as u64;
        self.live_arrays
            .iter()
            .map(|g| g.total_bytes.unwrap_or(0))
            .sum::<u64>()
            / devices
    }

    /// Whether the series grows: at least 6 points, the last a tenth above the first, and most
    /// steps up.
    fn growth(&self) -> Option<(u64, u64, u64)> {
        let pts: Vec<(u64, u64)> = self
            .series
            .iter()
            .filter_map(|p| Some((p.step.unwrap_or(0), p.bytes_in_use?)))
            .collect();
        if pts.len() < 6 {
            return None;
        }
        let (first, last) = (pts[0].1, pts[pts.len() - 1].1);
        let ups = pts.windows(2).filter(|w| w[1].1 > w[0].1).count();
        (last as f64 >= first as f64 * 1.1 && ups * 10 >= (pts.len() - 1) * 7).then_some((
            first,
            last,
            pts[pts.len() - 1].0.saturating_sub(pts[0].0),
        ))
    }
}

fn entry(part: &str, bytes: u64, note: String) -> LedgerEntry {
    LedgerEntry {
        part: part.into(),
        bytes,
        basis: "measured".into(),
        note,
    }
}

fn cause(kind: CauseKind, savings: Option<u64>, evidence: String, actions: Vec<String>) -> Cause {
    Cause::new(kind, savings, evidence, actions)
}

/// Fills the main event's missing figures from the device that failed.
fn fill_event(e: &mut Event, ev: &Evidence) {
    if let Some(d) = ev.fullest() {
        e.limit_bytes = e.limit_bytes.or(d.bytes_limit);
        if e.phase == Phase::Runtime {
            e.used_bytes = e.used_bytes.or(d.bytes_in_use);
        }
        e.largest_free_bytes = e.largest_free_bytes.or(d.largest_free_block_bytes);
    }
    e.step = e.step.or(ev.step);
}

/// The causes the evidence shows, most decisive first.
fn causes(e: &Event, ev: &Evidence) -> Vec<Cause> {
    let mut out = Vec::new();
    let in_use = ev.fullest().and_then(|d| d.bytes_in_use).unwrap_or(0);
    let limit = ev
        .fullest()
        .and_then(|d| d.bytes_limit)
        .or(e.limit_bytes)
        .unwrap_or(0);
    // Many arrays, or a large share of the memory, held by one Python object: a leak with a name.
    let holder = ev
        .holders
        .iter()
        .filter(|h| {
            h.arrays.unwrap_or(0) >= 1000
                || (in_use > 0 && h.bytes.unwrap_or(0) as f64 >= in_use as f64 * 0.1)
        })
        .max_by_key(|h| (h.bytes.unwrap_or(0), h.arrays.unwrap_or(0)));
    if let Some(h) = holder {
        let name = h.name.as_deref().unwrap_or("an object");
        out.push(cause(
            CauseKind::MemoryLeak,
            h.bytes,
            format!(
                "{} {} array(s) ({}) are held by the {} `{name}`{}: they stay on the device as long as it references them",
                h.arrays.unwrap_or(0),
                h.example.as_deref().unwrap_or(""),
                format_size(h.bytes.unwrap_or(0)),
                h.kind.as_deref().unwrap_or("object"),
                h.location
                    .as_deref()
                    .map(|w| format!(" in {w}"))
                    .unwrap_or_default()
            ),
            vec![
                format!("Keep host values in `{name}`, not device arrays: append float(x) / x.item() (or jax.device_get once per N steps), or clear it regularly."),
                "Check that nothing else keeps per-step outputs alive (metrics dicts, closures, caches keyed by step).".into(),
            ],
        ));
    } else if let Some((first, last, steps)) = ev.growth() {
        out.push(cause(
            CauseKind::MemoryLeak,
            Some(last - first),
            format!(
                "bytes in use grew from {} to {} over the last {steps} steps before the failure",
                format_size(first),
                format_size(last)
            ),
            vec!["Find what grows: compare jax.live_arrays() grouped by shape at two steps (hbm_doctor.watch() records it), and keep per-step results on the host.".into()],
        ));
    }
    if let Some(x) = ev
        .executables
        .iter()
        .filter(|x| x.count.unwrap_or(0) >= 5)
        .max_by_key(|x| x.count.unwrap_or(0))
    {
        out.push(cause(
            CauseKind::Recompilation,
            None,
            format!(
                "`{}` has {} compiled versions cached: new shapes or static arguments compile it again and again",
                x.name.as_deref().unwrap_or("a function"),
                x.count.unwrap_or(0)
            ),
            vec!["Keep shapes static (pad the last batch, bucket sequence lengths), mark only true constants static, and log compiles: jax.config.update('jax_log_compiles', True).".into()],
        ));
    }
    if let (Some(r), Some(d)) = (e.requested_bytes, ev.fullest()) {
        if let (Some(lf), Some(l), Some(u)) =
            (d.largest_free_block_bytes, d.bytes_limit, d.bytes_in_use)
        {
            if lf < r && l.saturating_sub(u) >= r {
                out.push(cause(
                    CauseKind::Fragmentation,
                    Some(r),
                    format!(
                        "{} requested, {} free in total, but the largest free block is {}",
                        format_size(r),
                        format_size(l - u),
                        format_size(lf)
                    ),
                    vec!["Allocate long-lived buffers first and keep them; free or fetch to the host the many small arrays kept across steps.".into()],
                ));
            }
        }
    }
    let live = ev.live_per_device();
    let at_load =
        matches!(e.stage, Some(Stage::Init | Stage::Restore)) || ev.step.is_some_and(|s| s == 0);
    if at_load && limit > 0 && live as f64 >= limit as f64 * 0.8 {
        out.push(cause(
            CauseKind::ArgumentsExceed,
            None,
            format!(
                "before training started, live arrays (the model state) already take {} of the {} device",
                format_size(live),
                format_size(limit)
            ),
            vec!["Create or load the state sharded over the devices (FSDP), in bf16, or on the host; or use more devices.".into()],
        ));
    }
    let executables: u64 = ev
        .executables
        .iter()
        .map(|x| x.temp_bytes.unwrap_or(0) + x.generated_code_bytes.unwrap_or(0))
        .sum();
    let unexplained = in_use.saturating_sub(live + executables);
    if !ev.live_arrays.is_empty() && limit > 0 && unexplained as f64 >= limit as f64 * 0.25 {
        out.push(cause(
            CauseKind::OtherProcess,
            Some(unexplained),
            format!(
                "the allocator holds {} but this process's live arrays ({}) and cached executables ({}) account for {}: {} is held by something else (deleted arrays still referenced by a runtime, another client, donated buffers not yet freed)",
                format_size(in_use),
                format_size(live),
                format_size(executables),
                format_size(live + executables),
                format_size(unexplained)
            ),
            vec!["Check for a second process on the device (tpu-info / nvidia-smi) and for arrays kept by a previous run in the same notebook; jax.clear_caches() drops cached executables.".into()],
        ));
    }
    out
}

/// Joins the evidence into a report: figures, ledger, causes.
pub fn apply(report: &mut ExplainReport, ev: &Evidence) {
    let Some(d) = report.diagnosis.as_mut() else {
        return;
    };
    let Some(e) = report.events.get_mut(d.event) else {
        return;
    };
    fill_event(e, ev);
    add_ledger(d, ev);
    let found = causes(e, ev);
    if found.is_empty() {
        return;
    }
    // What the process itself shows outranks what the text suggested.
    let kinds: Vec<CauseKind> = found.iter().map(|c| c.cause).collect();
    d.causes.retain(|c| !kinds.contains(&c.cause));
    let mut merged = found;
    merged.append(&mut d.causes);
    d.causes = merged;
    d.missing
        .retain(|m| !(m.starts_with("whether memory grows") || m.starts_with("no cause")));
}

fn add_ledger(d: &mut Diagnosis, ev: &Evidence) {
    if let Some(dev) = ev.fullest() {
        if let Some(u) = dev.bytes_in_use {
            d.ledger.retain(|l| l.part != "in_use");
            d.ledger.push(entry(
                "in_use",
                u,
                format!(
                    "held by the allocator of device {} at the failure (memory_stats)",
                    dev.id.as_ref().map(|v| v.to_string()).unwrap_or_default()
                ),
            ));
        }
        if let Some(f) = dev.largest_free_block_bytes {
            d.ledger.retain(|l| l.part != "largest_free_block");
            d.ledger.push(entry(
                "largest_free_block",
                f,
                "the largest contiguous free block".into(),
            ));
        }
    }
    let live = ev.live_per_device();
    if !ev.live_arrays.is_empty() {
        let n: u64 = ev.live_arrays.iter().map(|g| g.count.unwrap_or(0)).sum();
        d.ledger.push(entry(
            "live_arrays",
            live,
            format!("{n} live arrays of this process, per device"),
        ));
    }
    let held: u64 = ev.holders.iter().map(|h| h.bytes.unwrap_or(0)).sum();
    if held > 0 {
        d.ledger.push(entry(
            "held_by_python",
            held,
            format!(
                "arrays referenced by {}",
                ev.holders
                    .iter()
                    .take(3)
                    .filter_map(|h| h.name.as_deref())
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let executables: u64 = ev
        .executables
        .iter()
        .map(|x| x.temp_bytes.unwrap_or(0) + x.generated_code_bytes.unwrap_or(0))
        .sum();
    if executables > 0 {
        d.ledger.push(entry(
            "cached_executables",
            executables,
            format!(
                "temporaries and code of {} cached program(s)",
                ev.executables.len()
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hbm_doctor_log::scan_all;

    fn report(text: &str) -> ExplainReport {
        crate::explain(scan_all(text.as_bytes()))
    }

    #[test]
    fn a_list_of_small_arrays_is_a_named_leak() {
        let mut r = report("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1048576 bytes.\n");
        let ev = Evidence::parse(r#"{"schema_version":1,"kind":"hbm_doctor_evidence","step":5000,
            "devices":[{"id":0,"bytes_in_use":16000000000,"bytes_limit":16909336576}],
            "live_arrays":[{"shape":"f32[]","count":12000,"total_bytes":48000,"devices":1}],
            "holders":[{"name":"losses","kind":"list","where":"train.py","arrays":12000,"bytes":48000,"example":"f32[]"}]}"#).expect("parse");
        apply(&mut r, &ev);
        let d = r.diagnosis.expect("d");
        assert_eq!(d.causes[0].cause, CauseKind::MemoryLeak);
        assert!(
            d.causes[0].evidence.contains("`losses`"),
            "{}",
            d.causes[0].evidence
        );
        assert!(d.ledger.iter().any(|l| l.part == "held_by_python"));
        assert_eq!(r.events[0].step, Some(5000));
    }

    #[test]
    fn many_compiled_versions_are_recompilation() {
        let mut r =
            report("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1048576 bytes.\n");
        let ev =
            Evidence::parse(r#"{"executables":[{"name":"jit_step","count":40}]}"#).expect("parse");
        apply(&mut r, &ev);
        assert_eq!(
            r.diagnosis.expect("d").causes[0].cause,
            CauseKind::Recompilation
        );
    }

    #[test]
    fn bad_evidence_is_one_line() {
        assert!(Evidence::parse("[1,2]").is_err());
        let e = Evidence::parse(r#"{"kind":"something_else"}"#).expect_err("kind");
        assert!(!e.contains('\n'));
        assert!(Evidence::parse(r#"{"schema_version": 9}"#).is_err());
    }
}
