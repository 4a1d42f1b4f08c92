//! What-if: a dump's peak recomputed with a change applied to some of its buffers (shard these
//! parameters over N devices, drop the debug-print copies, halve these f32 buffers), without
//! recompiling.
//!
//! The space's `timeline` (bytes live at each schedule position) is lowered by the bytes each
//! changed buffer gives back over its live range (parameters, outputs and constants: the whole
//! program); the new peak is the highest point left. Slots shared by several values are counted
//! by the changed value's size, and buffers outside `largest_buffers` and `buffers_at_peak` are
//! not seen: an estimate that is exact when the large buffers have slots of their own, which is
//! where a change matters.

use crate::model::{BufferAtPeak, SpaceReport, WhatIf};

/// Applies `changes` (buffer name, thousandths of it that remain) to `s`.
pub fn apply(
    s: &SpaceReport,
    change: &str,
    changes: &[(String, u32)],
    budget: Option<u64>,
) -> WhatIf {
    let find = |name: &str| -> Option<&BufferAtPeak> {
        s.largest_buffers
            .iter()
            .chain(&s.buffers_at_peak)
            .find(|b| b.name == name)
    };
    let mut seen: Vec<&str> = Vec::new();
    let mut cuts: Vec<(&BufferAtPeak, u64)> = Vec::new();
    for (name, keep) in changes {
        if seen.contains(&name.as_str()) {
            continue;
        }
        seen.push(name);
        if let Some(b) = find(name) {
            let kept = (u128::from(b.size_bytes) * u128::from((*keep).min(1000)) / 1000) as u64;
            let cut = b.size_bytes - kept;
            if cut > 0 {
                cuts.push((b, cut));
            }
        }
    }
    let peak = if s.timeline.is_empty() {
        // No live ranges: every buffer at the peak stays there.
        let at_peak: u64 = cuts
            .iter()
            .filter(|(b, _)| s.buffers_at_peak.iter().any(|p| p.name == b.name))
            .map(|(_, c)| c)
            .sum();
        s.peak_bytes.saturating_sub(at_peak)
    } else {
        let len = s.timeline.len();
        let mut tl: Vec<i128> = s.timeline.iter().map(|&b| i128::from(b)).collect();
        let mut lower = |start: usize, end: usize, by: i128| {
            for v in tl.iter_mut().take(end.min(len - 1) + 1).skip(start) {
                *v -= by;
            }
        };
        // Temps are cut by slot: the values of one allocation and size (the slots a loop
        // carries, or one slot reused) give back, at each time, the changed bytes of as many
        // values as are live then, up to the number changed.
        let mut groups: Vec<((u64, u64), u64, usize)> = Vec::new(); // (key, cut, changed)
        let mut serial: Option<(u64, u64, u64)> = None;
        for (b, cut) in &cuts {
            match (b.kind.as_str(), b.live, b.allocation) {
                ("temp", Some(_), Some(a)) => {
                    let key = (a, b.size_bytes);
                    match groups.iter_mut().find(|g| g.0 == key) {
                        Some(g) => {
                            g.1 = g.1.max(*cut);
                            g.2 += 1;
                        }
                        None => groups.push((key, *cut, 1)),
                    }
                }
                ("temp", Some((st, en)), None) => lower(st as usize, en as usize, i128::from(*cut)),
                _ => {
                    lower(0, len - 1, i128::from(*cut));
                    // An output removed whole (aliased to a donated input) gives back its
                    // memory, but the scratch it held before its results were written still
                    // needs room then: all of it when a loop carries it, else one output's at a
                    // time (straight-line updates can run one after another).
                    if let (true, Some((st, en, z))) = (*cut == b.size_bytes, b.scratch) {
                        let z = z.min(*cut);
                        if b.scratch_carried {
                            lower(st as usize, en as usize, -i128::from(z));
                        } else if serial.is_none_or(|(_, _, w)| z > w) {
                            serial = Some((st, en, z));
                        }
                    }
                }
            }
        }
        if let Some((st, en, z)) = serial {
            lower(st as usize, en as usize, -i128::from(z));
        }
        for ((alloc, size), cut, changed) in groups {
            let mut names: Vec<&str> = Vec::new();
            let mut count = vec![0i64; len + 1];
            for o in s.largest_buffers.iter().chain(&s.buffers_at_peak) {
                if o.kind != "temp" || o.allocation != Some(alloc) || o.size_bytes != size {
                    continue;
                }
                if names.contains(&o.name.as_str()) {
                    continue;
                }
                names.push(&o.name);
                if let Some((st, en)) = o.live {
                    count[(st as usize).min(len)] += 1;
                    count[(en as usize).saturating_add(1).min(len)] -= 1;
                }
            }
            let mut live = 0i64;
            for (t, v) in tl.iter_mut().enumerate() {
                live += count[t];
                let n = (live.max(0) as usize).min(changed);
                *v -= i128::from(cut) * n as i128;
            }
        }
        tl.into_iter().max().unwrap_or(0).max(0) as u64
    };
    let total = peak + s.fragmentation_bytes;
    WhatIf {
        change: change.to_string(),
        buffers: cuts.len(),
        peak_before_bytes: s.peak_bytes,
        peak_bytes: peak,
        total_bytes: total,
        fits: budget.map(|b| total <= b),
    }
}

/// `analyze --what-if NAME` on the main module (the largest HBM total on the device): a detected cause's own
/// change when NAME is one (`debug_print`, `optimizer_state_unsharded`, `no_remat`...), else a
/// [`generic`] one. `Err` says which names exist.
pub fn named(report: &crate::analyze::AnalyzeReport, name: &str) -> Result<WhatIf, String> {
    let main = report
        .modules
        .iter()
        .filter_map(|m| {
            m.memory_spaces
                .iter()
                .find(|s| s.color == 0)
                .map(|s| (m, s))
        })
        .max_by_key(|(_, s)| s.device_bytes());
    let Some((m, s)) = main else {
        return Err("no module with HBM figures to change".into());
    };
    if let Some(w) = m
        .causes
        .iter()
        .find(|c| c.cause.as_str() == name)
        .and_then(|c| c.what_if.clone())
    {
        return Ok(w);
    }
    if let Some(changes) = generic(s, name) {
        return Ok(apply(s, name, &changes, report.diagnosis.budget_bytes));
    }
    let mut known: Vec<&str> = m
        .causes
        .iter()
        .filter(|c| c.what_if.is_some())
        .map(|c| c.cause.as_str())
        .collect();
    known.extend(["bf16", "shard-args:N"]);
    Err(format!(
        "no change `{name}` for module {}: use one of {}",
        m.name,
        known.join(", ")
    ))
}

/// The changes a user can name with `analyze --what-if` besides a detected cause's own:
/// `bf16` (every f32 buffer halved), `shard-args:N` (entry parameters over N devices).
pub fn generic(s: &SpaceReport, name: &str) -> Option<Vec<(String, u32)>> {
    let all = || s.largest_buffers.iter().chain(&s.buffers_at_peak);
    if name == "bf16" {
        return Some(
            all()
                .filter(|b| b.shape.starts_with("f32["))
                .map(|b| (b.name.clone(), 500))
                .collect(),
        );
    }
    if let Some(n) = name.strip_prefix("shard-args:") {
        let n: u32 = n.parse().ok().filter(|&n| n >= 1)?;
        return Some(
            all()
                .filter(|b| b.kind == "parameter")
                .map(|b| (b.name.clone(), 1000 / n))
                .collect(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use crate::analyze::{analyze, AnalyzeOptions, ModuleInput};
    use hbm_doctor_hlo::{buffer_assignment, live_range};

    /// A live-range header or interval claiming far more positions than the file describes is
    /// clamped by the analysis (the binary refuses such a file first; other callers stay safe).
    #[test]
    fn hostile_positions_are_clamped() {
        let ba = "BufferAssignment:\nallocation 0: size 64, maybe-live-out:\n value: <1 a @0> (size=64,offset=0): f32[16]{0}\n\nTotal bytes used: 64 (64B)\n";
        for lr in [
            "HloLiveRange (max 4294967296):\n  InstructionSequence:\n    0:a\n  BufferLiveRange:\n    a{}:0-1\n",
            "HloLiveRange (max 2):\n  InstructionSequence:\n    0:a\n  BufferLiveRange:\n    a{}:0-9223372036854775807\n",
        ] {
            let b = buffer_assignment::parse_buffer_assignment(ba).0;
            let l = live_range::parse_live_range(lr).0;
            let input = ModuleInput {
                name: "m".into(),
                hlo: None,
                buffer_assignment: Some(&b),
                live_range: Some(&l),
                usage_report: None,
                notes: Vec::new(),
            };
            let r = analyze(&[input], &AnalyzeOptions::default());
            for s in &r.modules[0].memory_spaces {
                assert!(s.timeline.len() < 1000, "{}", s.timeline.len());
            }
        }
    }
}
