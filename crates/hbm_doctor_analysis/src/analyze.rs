//! `analyze`: peak memory per memory space from an XLA dump, what is live at the peak, and where
//! it comes from in the user's source.
//!
//! With a buffer assignment the figures are exact: allocation sizes as assigned, and the temp
//! arena's occupancy over time from the live ranges, counting each arena slot (allocation, offset)
//! once however many values share it. With only a scheduled HLO module the peak is a heap
//! simulation over the schedule and is labelled an estimate.

use crate::model::{Category, SCHEMA_VERSION};
// analyze's report types live in model.rs (and its naming helpers in origin.rs); these keep the
// paths `hbm_doctor_analysis::analyze::*` working.
pub use crate::model::{
    AnalyzeDiagnosis, AnalyzeOptions, AnalyzeReport, BufferAtPeak, Group, KindTimeline,
    ModuleInput, ModuleReport, SpaceReport, XlaFigures, LARGEST_BUFFERS,
};
pub use crate::origin::op_name_parts;
pub(crate) use crate::origin::{origin, shape_without_layout};
use hbm_doctor_hlo::buffer_assignment::{Allocation, BufferAssignment};
use hbm_doctor_hlo::hlo::{shape_leaves, tuple_elements, HloModule, Instruction};
use hbm_doctor_hlo::live_range::LiveRange;
use hbm_doctor_hlo::Shape;
// FxHash: the name indexes hold 100k+ keys on large dumps (SipHash was a quarter of the time).
use hbm_doctor_hlo::hash::FxHashMap as HashMap;
use std::borrow::Cow;

/// The per-kind split of a timeline whose fixed part (allocations live throughout) is
/// `parameter + output + constant` and whose rest is the temp arena.
fn kind_timelines(temp: &[u64], parameter: u64, output: u64, constant: u64) -> Vec<KindTimeline> {
    if temp.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (kind, b) in [
        ("parameter", parameter),
        ("output", output),
        ("constant", constant),
    ] {
        if b > 0 {
            out.push(KindTimeline {
                kind: kind.into(),
                bytes: vec![b; temp.len()],
            });
        }
    }
    out.push(KindTimeline {
        kind: "temp".into(),
        bytes: temp.to_vec(),
    });
    out
}

/// The largest buffers over the whole program: the fixed ones as given plus the
/// [`LARGEST_BUFFERS`] largest temp slots, with their origin looked up only for those kept.
fn largest_buffers(
    hlo: Option<&HloModule<'_>>,
    insts: Option<&HashMap<&str, &Instruction<'_>>>,
    fixed: &[BufferAtPeak],
    slots: &[Slot<'_>],
) -> Vec<BufferAtPeak> {
    let mut order: Vec<usize> = (0..slots.len()).collect();
    order.sort_by(|&a, &b| {
        slots[b]
            .size
            .cmp(&slots[a].size)
            .then_with(|| slots[a].start.cmp(&slots[b].start))
            .then_with(|| slots[a].name.cmp(&slots[b].name))
    });
    order.truncate(LARGEST_BUFFERS);
    let mut out: Vec<BufferAtPeak> = fixed.to_vec();
    for k in order {
        let s = &slots[k];
        let base = s.name.split('{').next().unwrap_or(&s.name).to_string();
        out.push(make_buffer(
            hlo,
            insts,
            s.name.to_string(),
            &base,
            s.size,
            logical_bytes(s.shape),
            s.shape,
            "temp",
            Some((s.start, s.end)),
            Some(s.alloc),
        ));
    }
    out.sort_by(|a, b| {
        b.size_bytes
            .cmp(&a.size_bytes)
            .then_with(|| a.live.cmp(&b.live))
            .then_with(|| a.name.cmp(&b.name))
    });
    out.truncate(LARGEST_BUFFERS);
    out
}

/// The contract's name of a color.
pub fn space_name(color: u32) -> String {
    match color {
        0 => "hbm".into(),
        1 => "vmem".into(),
        5 => "host".into(),
        n => format!("space{n}"),
    }
}

/// Logical size as XLA's live range counts it: `ByteSizeOf(shape, 8)` without tiling; a tuple is
/// its pointer table.
pub fn logical_bytes(shape: &str) -> u64 {
    if let Some(elems) = tuple_elements(shape) {
        return 8 * elems.len() as u64;
    }
    Shape::parse(shape).map_or(0, |s| s.unpadded_bytes())
}

/// The most bytes a dump's sizes may add up to (64 PiB, far past any device's memory): below it
/// every figure the analysis derives, sums and ratios included, fits in 64 bits.
pub const MAX_DUMP_BYTES: u64 = 1 << 56;

/// Checks that the sizes a dump states add up to at most [`MAX_DUMP_BYTES`] each: the buffer
/// assignment's allocation sizes, its value sizes, its values' shapes, and the shapes of the HLO
/// module's instructions. Larger sizes are not from XLA (no device holds them) and would
/// overflow the figures; `Err` says which file kind (`"hlo"` or `"buffer_assignment"`) and why.
pub fn check_sizes(
    hlo: Option<&HloModule<'_>>,
    ba: Option<&BufferAssignment<'_>>,
) -> Result<(), (&'static str, String)> {
    // Shape sizes saturate at u64::MAX, which is past the bound, so a saturated shape is caught.
    let shape_bytes = |shape: &str| -> u128 {
        shape_leaves(shape)
            .into_iter()
            .map(|(_, leaf)| {
                Shape::parse(leaf)
                    .map_or(0, |s| u128::from(s.padded_bytes().max(s.unpadded_bytes())))
            })
            .sum()
    };
    let over = |total: u128| total > u128::from(MAX_DUMP_BYTES);
    if let Some(ba) = ba {
        let allocs: u128 = ba.allocations.iter().map(|a| u128::from(a.size)).sum();
        let values = ba.allocations.iter().flat_map(|a| &a.values);
        let value_sizes: u128 = values.clone().map(|v| u128::from(v.size)).sum();
        let value_shapes: u128 = values.map(|v| shape_bytes(v.shape)).sum();
        for (what, total) in [
            ("allocation sizes", allocs),
            ("value sizes", value_sizes),
            ("value shapes", value_shapes),
        ] {
            if over(total) {
                return Err(("buffer_assignment", too_large(what, total)));
            }
        }
    }
    if let Some(m) = hlo {
        let total: u128 = m
            .computations
            .iter()
            .flat_map(|c| &c.instructions)
            .map(|i| shape_bytes(i.shape))
            .sum();
        if over(total) {
            return Err(("hlo", too_large("instruction shapes", total)));
        }
    }
    Ok(())
}

fn too_large(what: &str, total: u128) -> String {
    let total = if total > u128::from(u64::MAX) {
        "2^64 bytes or more".to_string()
    } else {
        format!("{total} bytes")
    };
    format!("its {what} add up to {total}, more than 2^56 (64 PiB)")
}

/// Physical size: tiled layouts padded as XLA does; tuples are their pointer table.
pub fn physical_bytes(shape: &str) -> u64 {
    if let Some(elems) = tuple_elements(shape) {
        return 8 * elems.len() as u64;
    }
    Shape::parse(shape).map_or(0, |s| {
        if s.has_tiles() {
            s.padded_bytes()
        } else {
            s.unpadded_bytes()
        }
    })
}

/// Index of every instruction of a module by name.
pub(crate) fn index_instructions<'m, 'a>(
    m: &'m HloModule<'a>,
) -> HashMap<&'a str, &'m Instruction<'a>> {
    // Fusion bodies define no buffers (values, live ranges and schedules only name instructions
    // of sequential computations): leaving them out halves the index on large dumps.
    let fused: hbm_doctor_hlo::hash::FxHashSet<&str> = m
        .computations
        .iter()
        .flat_map(|c| &c.instructions)
        .filter(|i| i.opcode == "fusion")
        .flat_map(|i| i.called())
        .collect();
    let kept = || m.computations.iter().filter(|c| !fused.contains(c.name));
    let n = kept().map(|c| c.instructions.len()).sum();
    let mut map = hbm_doctor_hlo::hash::map_with_capacity(n);
    for c in kept() {
        for i in &c.instructions {
            map.insert(i.name, i);
        }
    }
    map
}

/// A temp value with its live range; names and shapes borrow from the dump text (100k+ slots,
/// so nothing here that can be derived: the logical size comes from `shape`, the kind is `temp`).
struct Slot<'s> {
    alloc: u64,
    offset: u64,
    size: u64,
    start: u64,
    end: u64,
    name: Cow<'s, str>,
    shape: &'s str,
}

/// Analyzes one module.
pub fn analyze_module(input: &ModuleInput<'_>) -> ModuleReport {
    let mut notes = input.notes.clone();
    let num_partitions = input.hlo.map_or(1, |m| m.num_partitions);
    let mut xla = XlaFigures::default();
    if let Some(r) = input.usage_report {
        xla.report_totals = r
            .spaces
            .iter()
            .map(|s| (s.color.unwrap_or(0), s.total_bytes))
            .collect();
    }
    let (memory_spaces, method, estimate) = match input.buffer_assignment {
        Some(ba) => {
            xla.total_bytes_used = ba.total_bytes_used;
            let lr = input.live_range.or(ba.live_range.as_ref());
            if lr.is_none() {
                notes.push("no live ranges: the peak is the sum of all allocations (an upper bound); newer XLA writes *-live-range.txt with --xla_dump_buffer_assignment_analysis".into());
            }
            if let Some(lr) = lr {
                let (t, b) = xla_live_range_peak(ba, lr, input.hlo);
                xla.recomputed_peak_time = t;
                xla.recomputed_peak_bytes = b;
                xla.live_range_peak_time = lr.peak_time;
                xla.live_range_peak_bytes = lr.stated_peak_bytes();
            }
            (
                from_buffer_assignment(ba, lr, input.hlo),
                "buffer_assignment",
                false,
            )
        }
        None => match input.hlo {
            Some(m) if m.is_scheduled => {
                notes.push("no buffer assignment: peak estimated by simulating the schedule; dump with --xla_dump_to=DIR --xla_dump_hlo_as_text for exact figures".into());
                (heap_simulation(m), "heap_simulation", true)
            }
            Some(_) => {
                notes.push("the HLO module is not scheduled and there is no buffer assignment: pass the *after_optimizations* files of --xla_dump_to".into());
                (Vec::new(), "none", true)
            }
            None => (Vec::new(), "none", true),
        },
    };
    // Built after the memory spaces, so it reuses their freed working memory.
    let schedule: Vec<String> = match (input.buffer_assignment, input.hlo) {
        (Some(ba), _) => input
            .live_range
            .or(ba.live_range.as_ref())
            .map(|l| l.sequence.iter().map(|s| s.to_string()).collect())
            .unwrap_or_default(),
        (None, Some(m)) if m.is_scheduled => m
            .entry()
            .map(|e| e.instructions.iter().map(|i| i.name.to_string()).collect())
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    ModuleReport {
        name: input.name.clone(),
        memory_spaces,
        method: method.into(),
        estimate,
        num_partitions,
        xla,
        notes,
        causes: Vec::new(),
        schedule,
    }
}

/// XLA's live-range peak recomputed: the time is the first maximum of the sweep in which the
/// allocations at a time are counted before the frees (`HloLiveRange::ComputePeakMemoryMoment`);
/// the bytes are the logical sizes of the values live at that time.
pub fn xla_live_range_peak(
    ba: &BufferAssignment<'_>,
    lr: &LiveRange<'_>,
    hlo: Option<&HloModule<'_>>,
) -> (Option<u64>, Option<u64>) {
    // Values by (name, index) through sorted key hashes (12 B each, no map of 50k+ keys), and the
    // instruction index only if some value is not in the buffer assignment: this function's
    // working set was one of the two RSS peaks on 100k-instruction dumps.
    let values: Vec<&hbm_doctor_hlo::buffer_assignment::Value<'_>> =
        ba.allocations.iter().flat_map(|a| &a.values).collect();
    let mut order: Vec<(u64, u32)> = values
        .iter()
        .enumerate()
        .map(|(k, v)| (RangeIndex::hash(v.name, v.index), k as u32))
        .collect();
    order.sort_unstable();
    let value_size = |name: &str, index: &str| -> Option<u64> {
        let h = RangeIndex::hash(name, index);
        let from = order.partition_point(|&(k, _)| k < h);
        order[from..]
            .iter()
            .take_while(|&&(k, _)| k == h)
            .map(|&(_, i)| values[i as usize])
            .filter(|v| v.name == name && value_index(v.index) == value_index(index))
            .last()
            .map(|v| logical_bytes(v.shape))
    };
    let insts_cell = std::cell::OnceCell::new();
    let inst = |name: &str| {
        insts_cell
            .get_or_init(|| hlo.map(index_instructions))
            .as_ref()
            .and_then(|m| m.get(name).copied())
    };
    let size_of = |name: &str, index: &str| -> u64 {
        if let Some(s) = value_size(name, index) {
            return s;
        }
        let Some(i) = inst(name) else {
            return 0;
        };
        let want = hbm_doctor_hlo::text::parse_shape_index(index).unwrap_or_default();
        if want.is_empty() {
            return logical_bytes(i.shape);
        }
        shape_leaves(i.shape)
            .into_iter()
            .find(|(idx, _)| *idx == want)
            .map_or(0, |(_, s)| logical_bytes(s))
    };
    // The sweep sizes every value by its *instruction's* whole shape (a tuple element counts as
    // the tuple's pointer table); the printed list uses the value's own subshape.
    let inst_size = |name: &str, index: &str| -> u64 {
        if let Some(s) = value_size(name, "{}") {
            return s;
        }
        match inst(name) {
            Some(i) => logical_bytes(i.shape),
            None => size_of(name, index),
        }
    };
    if lr.ranges.is_empty() {
        return (None, None);
    }
    // (time * 2 + is_end, size): at one time allocations sort before frees.
    let mut events: Vec<(u64, u64)> = Vec::with_capacity(lr.ranges.len() * 2);
    for r in &lr.ranges {
        let z = inst_size(r.name, r.index);
        events.push((r.start.saturating_mul(2), z));
        events.push((
            r.end.saturating_add(1).saturating_mul(2).saturating_add(1),
            z,
        ));
    }
    events.sort_unstable_by_key(|&(k, _)| k);
    let (mut usage, mut peak, mut peak_t) = (0i128, 0i128, None);
    for (k, z) in events {
        usage += if k & 1 == 1 { -(z as i128) } else { z as i128 };
        if usage > peak {
            peak = usage;
            peak_t = Some(k / 2);
        }
    }
    let t = peak_t.unwrap_or(0);
    let bytes = lr
        .ranges
        .iter()
        .filter(|r| r.start <= t && t <= r.end)
        .map(|r| size_of(r.name, r.index))
        .sum();
    (Some(t), Some(bytes))
}

fn from_buffer_assignment(
    ba: &BufferAssignment<'_>,
    lr: Option<&LiveRange<'_>>,
    hlo: Option<&HloModule<'_>>,
) -> Vec<SpaceReport> {
    // Built after the first sweep (lazily), so the index and the sweep's working set are never
    // both live: both are megabytes on 100k-instruction dumps.
    let insts_cell = std::cell::OnceCell::new();
    let ranges = RangeIndex::new(lr.map_or(&[][..], |l| &l.ranges[..]));
    // Positions are bounded by what the live ranges can describe: a header or an interval
    // claiming more (a corrupt file) is clamped, never allocated for.
    let bound = lr.map_or(0, |l| (l.sequence.len().max(l.ranges.len()) as u64 + 1) * 4);
    let max_t = lr.map_or(0, |l| l.max).min(bound);
    let mut colors: Vec<u32> = ba.allocations.iter().map(|a| a.color).collect();
    colors.sort_unstable();
    colors.dedup();
    let mut out = Vec::new();
    for color in colors {
        let allocs: Vec<&Allocation<'_>> =
            ba.allocations.iter().filter(|a| a.color == color).collect();
        let sum = |f: &dyn Fn(&Allocation<'_>) -> bool| {
            allocs.iter().filter(|a| f(a)).map(|a| a.size).sum::<u64>()
        };
        let total_bytes = sum(&|_| true);
        let arguments_bytes = sum(&|a| a.parameter.is_some());
        let aliased_bytes = sum(&|a| a.parameter.is_some() && a.maybe_live_out);
        let outputs_bytes =
            sum(&|a| a.parameter.is_none() && (a.maybe_live_out || a.output_shape.is_some()));
        let constants_bytes = sum(&|a| a.kind() == "constant");
        let thread_local_bytes = sum(&|a| a.kind() == "thread_local");
        let temp_bytes = sum(&|a| a.kind() == "temp");
        let indefinite: u64 = arguments_bytes + outputs_bytes + constants_bytes;

        // Temp slots with their live ranges.
        let mut slots: Vec<Slot<'_>> = Vec::with_capacity(
            allocs
                .iter()
                .filter(|a| a.kind() == "temp")
                .map(|a| a.values.len())
                .sum(),
        );
        let mut unranged = 0usize;
        for a in allocs.iter().filter(|a| a.kind() == "temp") {
            for v in &a.values {
                let Some((start, end)) = ranges.get(v.name, v.index) else {
                    unranged += 1;
                    continue;
                };
                let end = end.min(bound);
                let start = start.min(end);
                slots.push(Slot {
                    alloc: a.index,
                    offset: v.offset,
                    size: v.size,
                    start,
                    end,
                    name: slot_name(v.name, v.index),
                    shape: v.shape,
                });
            }
        }
        let (timeline, peak_t) = if lr.is_some() {
            let mut caps: Vec<(u64, u64)> = allocs
                .iter()
                .filter(|a| a.kind() == "temp")
                .map(|a| (a.index, a.size))
                .collect();
            caps.sort_unstable();
            sweep(&slots, max_t, &caps)
        } else {
            (Vec::new(), None)
        };
        let insts = insts_cell.get_or_init(|| hlo.map(index_instructions));
        let temp_peak = match peak_t {
            Some(t) => timeline.get(t as usize).copied().unwrap_or(0),
            None if lr.is_some() && unranged == 0 => 0,
            None => temp_bytes,
        };
        let peak_bytes = indefinite + temp_peak;
        let timeline_by_kind =
            kind_timelines(&timeline, arguments_bytes, outputs_bytes, constants_bytes);
        let timeline: Vec<u64> = timeline.into_iter().map(|b| b + indefinite).collect();

        // Buffers at the peak: every indefinite allocation once, plus the temp slots live then.
        let mut buffers = Vec::new();
        for a in allocs
            .iter()
            .filter(|a| matches!(a.kind(), "parameter" | "output" | "constant"))
        {
            let Some(v) = a
                .values
                .iter()
                .max_by_key(|v| (v.size, std::cmp::Reverse(v.id)))
            else {
                continue;
            };
            let range = ranges.get(v.name, v.index);
            let mut b = make_buffer(
                hlo,
                insts.as_ref(),
                display_name(v.name, v.index),
                v.name,
                a.size,
                logical_bytes(v.shape),
                v.shape,
                a.kind(),
                range,
                Some(a.index),
            );
            if a.kind() == "output" {
                // The values that end before the allocation's last one: scratch held in the
                // output's memory before the results are written there.
                // (A copy of a parameter updated in place, a KV cache or replay buffer, is not
                // scratch: donated, the copy goes.)
                let spans: Vec<(u64, u64, u64)> = a
                    .values
                    .iter()
                    .filter(|v| !v.name.starts_with("copy"))
                    .filter_map(|v| ranges.get(v.name, v.index).map(|(s, e)| (s, e, v.size)))
                    .collect();
                let last = spans.iter().map(|x| x.1).max();
                b.scratch_carried = a.values.iter().any(|v| v.name.starts_with("while"));
                b.scratch = spans.iter().filter(|x| Some(x.1) < last).fold(
                    None,
                    |acc: Option<(u64, u64, u64)>, &(s, e, z)| {
                        Some(match acc {
                            None => (s, e, z),
                            Some((s0, e0, z0)) => (s0.min(s), e0.max(e), z0.max(z)),
                        })
                    },
                );
            }
            buffers.push(b);
        }
        let largest = largest_buffers(hlo, insts.as_ref(), &buffers, &slots);
        let buffer_count = (buffers.len() + slots.len()) as u64;
        if let Some(t) = peak_t {
            let mut seen: HashMap<(u64, u64), usize> = HashMap::default();
            for s in slots.iter().filter(|s| s.start <= t && t <= s.end) {
                let base = s.name.split('{').next().unwrap_or(&s.name).to_string();
                let b = make_buffer(
                    hlo,
                    insts.as_ref(),
                    s.name.to_string(),
                    &base,
                    s.size,
                    logical_bytes(s.shape),
                    s.shape,
                    "temp",
                    Some((s.start, s.end)),
                    Some(s.alloc),
                );
                match seen.get(&(s.alloc, s.offset)) {
                    Some(&k) => {
                        if buffers[k].size_bytes < b.size_bytes {
                            buffers[k] = b;
                        }
                    }
                    None => {
                        seen.insert((s.alloc, s.offset), buffers.len());
                        buffers.push(b);
                    }
                }
            }
        }
        buffers.sort_by(|a, b| {
            b.size_bytes
                .cmp(&a.size_bytes)
                .then_with(|| a.name.cmp(&b.name))
        });
        let padding_bytes = buffers
            .iter()
            .map(|b| b.size_bytes.saturating_sub(b.unpadded_bytes))
            .sum();
        let peak_instruction = peak_t.and_then(|t| {
            lr.and_then(|l| l.sequence.get(t as usize))
                .map(|s| s.to_string())
        });
        out.push(SpaceReport {
            space: space_name(color),
            total_bytes,
            peak_bytes,
            arguments_bytes,
            outputs_bytes,
            aliased_bytes,
            temp_bytes,
            padding_bytes,
            by_source: group_by_source(&buffers),
            by_op_name: group_by_op_name(&buffers),
            buffers_at_peak: buffers,
            color,
            constants_bytes,
            thread_local_bytes,
            fragmentation_bytes: total_bytes
                .saturating_sub(thread_local_bytes)
                .saturating_sub(peak_bytes),
            peak_time: peak_t,
            peak_instruction,
            timeline,
            timeline_by_kind,
            largest_buffers: largest,
            buffer_count,
        });
    }
    out
}

/// Live ranges looked up by value through their key hashes, sorted: 12 bytes per range, integer
/// comparisons only (a hash map of string keys was the largest analysis structure on
/// 100k-instruction dumps).
struct RangeIndex<'r, 'a> {
    ranges: &'r [hbm_doctor_hlo::live_range::Range<'a>],
    order: Vec<(u64, u32)>,
}

impl<'r, 'a> RangeIndex<'r, 'a> {
    fn new(ranges: &'r [hbm_doctor_hlo::live_range::Range<'a>]) -> Self {
        let mut order: Vec<(u64, u32)> = ranges
            .iter()
            .enumerate()
            .map(|(k, r)| (Self::hash(r.name, r.index), k as u32))
            .collect();
        order.sort_unstable();
        RangeIndex { ranges, order }
    }
    fn hash(name: &str, index: &str) -> u64 {
        use std::hash::BuildHasher;
        hbm_doctor_hlo::hash::FxBuildHasher::default().hash_one((name, value_index(index)))
    }
    /// `(start, end)` of the value `name` at ShapeIndex `index` (empty = `{}`); among repeated
    /// keys the last printed, as a map built in order would keep.
    fn get(&self, name: &str, index: &str) -> Option<(u64, u64)> {
        let h = Self::hash(name, index);
        let from = self.order.partition_point(|&(k, _)| k < h);
        self.order[from..]
            .iter()
            .take_while(|&&(k, _)| k == h)
            .map(|&(_, i)| &self.ranges[i as usize])
            .filter(|r| r.name == name && value_index(r.index) == value_index(index))
            .last()
            .map(|r| (r.start, r.end))
    }
}

/// A value's ShapeIndex as the live ranges print it (`{}` when the buffer assignment printed none).
fn value_index(index: &str) -> &str {
    if index.is_empty() {
        "{}"
    } else {
        index
    }
}

/// [`display_name`], borrowed when there is no index to append.
fn slot_name<'s>(name: &'s str, index: &str) -> Cow<'s, str> {
    if index.is_empty() || index == "{}" {
        Cow::Borrowed(name)
    } else {
        Cow::Owned(format!("{name}{index}"))
    }
}

fn display_name(name: &str, index: &str) -> String {
    if index.is_empty() || index == "{}" {
        name.to_string()
    } else {
        format!("{name}{index}")
    }
}

#[allow(clippy::too_many_arguments)]
fn make_buffer(
    hlo: Option<&HloModule<'_>>,
    insts: Option<&HashMap<&str, &Instruction<'_>>>,
    name: String,
    inst: &str,
    size: u64,
    unpadded: u64,
    shape: &str,
    kind: &str,
    live: Option<(u64, u64)>,
    allocation: Option<u64>,
) -> BufferAtPeak {
    let i = insts.and_then(|m| m.get(inst).copied());
    let o = origin(hlo, i);
    BufferAtPeak {
        name,
        size_bytes: size,
        unpadded_bytes: unpadded,
        shape: shape_without_layout(shape),
        kind: kind.to_string(),
        op_name: o.op_name,
        source: o.source,
        layout_shape: shape.to_string(),
        opcode: o.opcode,
        source_path: o.source_path,
        function: o.function,
        live,
        allocation,
        scratch: None,
        scratch_carried: false,
    }
}

/// The sizes of the values live in one arena slot (a multiset; usually zero or one value).
#[derive(Clone)]
enum LiveSizes {
    Empty,
    One(u64),
    Many(Vec<u64>),
}

impl LiveSizes {
    fn max(&self) -> u64 {
        match self {
            LiveSizes::Empty => 0,
            LiveSizes::One(z) => *z,
            LiveSizes::Many(v) => v.iter().copied().max().unwrap_or(0),
        }
    }
    fn push(&mut self, z: u64) {
        *self = match std::mem::replace(self, LiveSizes::Empty) {
            LiveSizes::Empty => LiveSizes::One(z),
            LiveSizes::One(a) => LiveSizes::Many(vec![a, z]),
            LiveSizes::Many(mut v) => {
                v.push(z);
                LiveSizes::Many(v)
            }
        };
    }
    /// Removes one value of size `z` (nothing when none is live).
    fn remove(&mut self, z: u64) {
        match self {
            LiveSizes::One(a) if *a == z => *self = LiveSizes::Empty,
            LiveSizes::Many(v) => {
                if let Some(p) = v.iter().position(|&x| x == z) {
                    v.swap_remove(p);
                }
            }
            _ => {}
        }
    }
}

/// Occupancy of the temp arena at every time `0..=max`: a slot (allocation, offset) counts once,
/// at the largest size live in it. Returns the timeline and the first time of its maximum.
///
/// `caps` (allocation index, size), sorted, bound what one allocation can hold at a time: values
/// at overlapping offsets of one allocation (scoped vmem packs them so) never count past its size.
fn sweep(slots: &[Slot<'_>], max_t: u64, caps: &[(u64, u64)]) -> (Vec<u64>, Option<u64>) {
    let len = slots
        .iter()
        .map(|s| s.end + 1)
        .max()
        .unwrap_or(0)
        .max(max_t) as usize;
    if len == 0 {
        return (Vec::new(), None);
    }
    // Dense slot ids and the slots ordered by start and by end (no per-time vectors, no hashing
    // in the loop: dumps have 100k+ values over 40k+ positions). Most slots hold one value at a
    // time: sizes live in a slot are a heap allocation only when several overlap.
    let mut keys: Vec<(u64, u64)> = slots.iter().map(|s| (s.alloc, s.offset)).collect();
    keys.sort_unstable();
    keys.dedup();
    let slot_id: Vec<u32> = slots
        .iter()
        .map(|s| keys.binary_search(&(s.alloc, s.offset)).unwrap_or(0) as u32)
        .collect();
    let n_keys = keys.len();
    // Per slot key, its allocation's dense id; per allocation, its cap and what it holds now.
    let mut alloc_of: Vec<u32> = Vec::with_capacity(n_keys);
    let mut caps_dense: Vec<u64> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        if i == 0 || keys[i - 1].0 != k.0 {
            let cap = caps
                .binary_search_by_key(&k.0, |c| c.0)
                .map_or(u64::MAX, |j| caps[j].1);
            caps_dense.push(cap);
        }
        alloc_of.push((caps_dense.len() - 1) as u32);
    }
    let mut held: Vec<u64> = vec![0; caps_dense.len()];
    drop(keys);
    let mut by_start: Vec<u32> = (0..slots.len() as u32).collect();
    by_start.sort_by_key(|&k| slots[k as usize].start);
    let mut by_end: Vec<u32> = (0..slots.len() as u32).collect();
    by_end.sort_by_key(|&k| slots[k as usize].end);
    let (mut next_start, mut next_end) = (0, 0);
    let mut live: Vec<LiveSizes> = vec![LiveSizes::Empty; n_keys];
    let mut usage: u64 = 0;
    let mut timeline = Vec::with_capacity(len);
    let (mut best, mut best_t) = (0u64, None);
    for t in 0..len {
        // Values whose last time was t-1 leave before those starting at t arrive.
        while next_end < by_end.len() && (slots[by_end[next_end] as usize].end + 1) as usize <= t {
            let k = by_end[next_end] as usize;
            next_end += 1;
            let id = slot_id[k] as usize;
            let v = &mut live[id];
            let before = v.max();
            v.remove(slots[k].size);
            let after = v.max();
            let a = alloc_of[id] as usize;
            let old = held[a].min(caps_dense[a]);
            held[a] = held[a] + after - before;
            usage = usage + held[a].min(caps_dense[a]) - old;
        }
        while next_start < by_start.len()
            && slots[by_start[next_start] as usize].start as usize <= t
        {
            let k = by_start[next_start] as usize;
            next_start += 1;
            let id = slot_id[k] as usize;
            let v = &mut live[id];
            let before = v.max();
            v.push(slots[k].size);
            let after = v.max();
            let a = alloc_of[id] as usize;
            let old = held[a].min(caps_dense[a]);
            held[a] = held[a] + after - before;
            usage = usage + held[a].min(caps_dense[a]) - old;
        }
        timeline.push(usage);
        if best_t.is_none() || usage > best {
            best = usage;
            best_t = Some(t as u64);
        }
    }
    (timeline, best_t)
}

fn group_by_source(buffers: &[BufferAtPeak]) -> Vec<Group> {
    let mut map: Vec<Group> = Vec::new();
    for b in buffers {
        let key = b
            .source
            .clone()
            .unwrap_or_else(|| "(no source line)".into());
        match map.iter_mut().find(|g| g.key == key) {
            Some(g) => {
                g.bytes += b.size_bytes;
                g.buffers += 1;
            }
            None => map.push(Group {
                key,
                depth: 0,
                bytes: b.size_bytes,
                buffers: 1,
            }),
        }
    }
    map.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.key.cmp(&b.key)));
    map
}

fn group_by_op_name(buffers: &[BufferAtPeak]) -> Vec<Group> {
    // Every path prefix, then printed as a tree: children sorted by bytes under their parent.
    let mut totals: HashMap<Vec<String>, (u64, usize)> = HashMap::default();
    for b in buffers {
        let op = b.op_name.clone().unwrap_or_else(|| format!("({})", b.name));
        let parts: Vec<String> = op_name_parts(&op).into_iter().map(str::to_string).collect();
        for k in 1..=parts.len() {
            let e = totals.entry(parts[..k].to_vec()).or_default();
            e.0 += b.size_bytes;
            e.1 += 1;
        }
    }
    // Children of every prefix, so the walk is linear in the number of paths (100k+ buffers).
    type Node<'t> = (&'t Vec<String>, &'t (u64, usize));
    let mut children: HashMap<&[String], Vec<Node<'_>>> = HashMap::default();
    for (k, v) in &totals {
        children.entry(&k[..k.len() - 1]).or_default().push((k, v));
    }
    for kids in children.values_mut() {
        kids.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then_with(|| a.0.cmp(b.0)));
    }
    let mut out = Vec::new();
    // Depth-first, iteratively (paths can be deep).
    let mut stack: Vec<Node<'_>> = children
        .get(&[][..])
        .map(|k| k.iter().rev().copied().collect())
        .unwrap_or_default();
    while let Some((k, (bytes, n))) = stack.pop() {
        out.push(Group {
            key: k.join("/"),
            depth: k.len() - 1,
            bytes: *bytes,
            buffers: *n,
        });
        if let Some(kids) = children.get(&k[..]) {
            stack.extend(kids.iter().rev().copied());
        }
    }
    out
}

/// Heap simulation over a scheduled entry computation (no buffer assignment): each instruction
/// that defines memory allocates its result leaves at its position and frees them after the last
/// user; `get-tuple-element`, `bitcast` and `tuple` alias their operands; entry parameters and
/// the root live throughout. An estimate: no sharing inside the temp arena, called computations
/// are not expanded, in-place reuse is not modelled.
pub fn heap_simulation(m: &HloModule<'_>) -> Vec<SpaceReport> {
    let Some(entry) = m.entry() else {
        return Vec::new();
    };
    let n = entry.instructions.len();
    let pos: HashMap<&str, usize> = entry
        .instructions
        .iter()
        .enumerate()
        .map(|(k, i)| (i.name, k))
        .collect();
    // Resolve aliases to the defining instruction.
    let mut owner: Vec<usize> = (0..n).collect();
    for (k, i) in entry.instructions.iter().enumerate() {
        let aliasing = matches!(
            i.opcode,
            "get-tuple-element"
                | "bitcast"
                | "while"
                | "optimization-barrier"
                | "send-done"
                | "recv-done"
        ) || i.opcode.ends_with("-done");
        if aliasing {
            if let Some(&p) = i.operands.first().and_then(|o| pos.get(o)) {
                owner[k] = owner[p];
            }
        }
    }
    let mut last_use: Vec<usize> = (0..n).collect();
    for (k, i) in entry.instructions.iter().enumerate() {
        for o in &i.operands {
            if let Some(&p) = pos.get(o) {
                let p = owner[p];
                last_use[p] = last_use[p].max(k);
                if entry.instructions[p].opcode == "tuple" {
                    for o2 in &entry.instructions[p].operands {
                        if let Some(&q) = pos.get(o2) {
                            let q = owner[q];
                            last_use[q] = last_use[q].max(k);
                        }
                    }
                }
            }
        }
    }
    let aliased: Vec<u32> = m.input_output_alias.iter().map(|a| a.param).collect();
    let aliased_outputs: Vec<Vec<u64>> = m
        .input_output_alias
        .iter()
        .map(|a| a.output_index.clone())
        .collect();
    // Instructions whose value is an element of a tuple ROOT, with their output index.
    let mut root_outputs: HashMap<usize, Vec<u64>> = HashMap::default();
    if let Some(root) = entry.instructions.iter().find(|i| i.is_root) {
        if root.opcode == "tuple" {
            for (k, o) in root.operands.iter().enumerate() {
                if let Some(&p) = pos.get(o) {
                    root_outputs.insert(owner[p], vec![k as u64]);
                }
            }
        }
    }
    let mut slots = Vec::new();
    let mut indefinite: HashMap<u32, (u64, u64, u64, u64)> = HashMap::default(); // color -> args, outs, aliased, consts
    let insts = index_instructions(m);
    let mut buffers_by_color: HashMap<u32, Vec<BufferAtPeak>> = HashMap::default();
    for (k, i) in entry.instructions.iter().enumerate() {
        if owner[k] != k || matches!(i.opcode, "tuple" | "get-tuple-element" | "bitcast") {
            continue;
        }
        // Outputs aliased to a donated parameter write into the parameter's buffer.
        if let Some(out_idx) = root_outputs.get(&k) {
            if aliased_outputs.contains(out_idx) {
                continue;
            }
        }
        let operand_shapes: Vec<&str> = i
            .operands
            .iter()
            .filter_map(|o| pos.get(o))
            .map(|&p| entry.instructions[p].shape)
            .collect();
        let async_like = i.opcode.ends_with("-start") || matches!(i.opcode, "send" | "recv");
        for (_, leaf) in shape_leaves(i.shape) {
            // Async starts and sends carry their operand in the tuple: no new buffer for it.
            if async_like && operand_shapes.contains(&leaf) {
                continue;
            }
            let Some(s) = Shape::parse(leaf) else {
                continue;
            };
            let size = if s.has_tiles() {
                s.padded_bytes()
            } else {
                s.unpadded_bytes()
            };
            let color = s.layout.as_ref().and_then(|l| l.memory_space).unwrap_or(0);
            let kind = if i.opcode == "parameter" {
                "parameter"
            } else if i.is_root || root_outputs.contains_key(&k) {
                "output"
            } else if i.opcode == "constant" {
                "constant"
            } else {
                "temp"
            };
            if kind != "temp" {
                let e = indefinite.entry(color).or_default();
                match kind {
                    "parameter" => {
                        e.0 += size;
                        if i.parameter_number().is_some_and(|p| aliased.contains(&p)) {
                            e.2 += size;
                        }
                    }
                    "output" => e.1 += size,
                    _ => e.3 += size,
                }
                buffers_by_color.entry(color).or_default().push(make_buffer(
                    Some(m),
                    Some(&insts),
                    i.name.to_string(),
                    i.name,
                    size,
                    s.unpadded_bytes(),
                    leaf,
                    kind,
                    None,
                    None,
                ));
                continue;
            }
            slots.push((
                color,
                Slot {
                    alloc: k as u64,
                    offset: slots.len() as u64,
                    size,
                    start: k as u64,
                    end: last_use[k] as u64,
                    name: Cow::Borrowed(i.name),
                    shape: leaf,
                },
            ));
        }
    }
    let mut colors: Vec<u32> = indefinite
        .keys()
        .copied()
        .chain(slots.iter().map(|(c, _)| *c))
        .collect();
    colors.sort_unstable();
    colors.dedup();
    let mut out = Vec::new();
    for color in colors {
        let mine: Vec<Slot> = slots
            .iter()
            .filter(|(c, _)| *c == color)
            .map(|(_, s)| Slot {
                alloc: s.alloc,
                offset: s.offset,
                size: s.size,
                start: s.start,
                end: s.end,
                name: s.name.clone(),
                shape: s.shape,
            })
            .collect();
        let (timeline, peak_t) = sweep(&mine, n as u64, &[]);
        let (args, outs, alias, consts) = indefinite.get(&color).copied().unwrap_or_default();
        let fixed = args + outs + consts;
        let temp_peak = peak_t
            .and_then(|t| timeline.get(t as usize).copied())
            .unwrap_or(0);
        let mut buffers = buffers_by_color.remove(&color).unwrap_or_default();
        let largest = largest_buffers(Some(m), Some(&insts), &buffers, &mine);
        let buffer_count = (buffers.len() + mine.len()) as u64;
        let timeline_by_kind = kind_timelines(&timeline, args, outs, consts);
        if let Some(t) = peak_t {
            for s in mine.iter().filter(|s| s.start <= t && t <= s.end) {
                buffers.push(make_buffer(
                    Some(m),
                    Some(&insts),
                    s.name.to_string(),
                    &s.name,
                    s.size,
                    logical_bytes(s.shape),
                    s.shape,
                    "temp",
                    Some((s.start, s.end)),
                    None,
                ));
            }
        }
        buffers.sort_by(|a, b| {
            b.size_bytes
                .cmp(&a.size_bytes)
                .then_with(|| a.name.cmp(&b.name))
        });
        let padding_bytes = buffers
            .iter()
            .map(|b| b.size_bytes.saturating_sub(b.unpadded_bytes))
            .sum();
        out.push(SpaceReport {
            space: space_name(color),
            total_bytes: fixed + temp_peak,
            peak_bytes: fixed + temp_peak,
            arguments_bytes: args,
            outputs_bytes: outs,
            aliased_bytes: alias,
            temp_bytes: temp_peak,
            padding_bytes,
            by_source: group_by_source(&buffers),
            by_op_name: group_by_op_name(&buffers),
            buffers_at_peak: buffers,
            color,
            constants_bytes: consts,
            thread_local_bytes: 0,
            fragmentation_bytes: 0,
            peak_time: peak_t,
            peak_instruction: peak_t
                .and_then(|t| entry.instructions.get(t as usize))
                .map(|i| i.name.to_string()),
            timeline: timeline.into_iter().map(|b| b + fixed).collect(),
            timeline_by_kind,
            largest_buffers: largest,
            buffer_count,
        });
    }
    out
}

/// Builds the whole report: analyses every module, runs the detectors and ranks the causes.
pub fn analyze(inputs: &[ModuleInput<'_>], opts: &AnalyzeOptions) -> AnalyzeReport {
    let mut modules: Vec<ModuleReport> = Vec::new();
    for input in inputs {
        // Sizes no device holds would overflow the figures: such files are left out, said in a
        // note (the binary refuses them before they get here).
        let checked;
        let input = match check_sizes(input.hlo, input.buffer_assignment) {
            Ok(()) => input,
            Err((_, e)) => {
                let mut notes = input.notes.clone();
                notes.push(format!("HLO text and buffer assignment left out: {e}"));
                checked = ModuleInput {
                    name: input.name.clone(),
                    hlo: None,
                    buffer_assignment: None,
                    live_range: input.live_range,
                    usage_report: input.usage_report,
                    notes,
                };
                &checked
            }
        };
        let mut r = analyze_module(input);
        r.causes = crate::detect::detect(input, &r, opts);
        modules.push(r);
    }
    fn hbm(m: &ModuleReport) -> Option<&SpaceReport> {
        m.memory_spaces.iter().find(|s| s.color == 0)
    }
    // The module that matters most: the largest HBM total.
    let main = modules
        .iter()
        .filter_map(|m| hbm(m).map(|s| (m, s)))
        .max_by_key(|(_, s)| s.device_bytes());
    let fits = opts.budget_bytes.map(|b| {
        modules
            .iter()
            .filter_map(hbm)
            .all(|s| s.device_bytes() <= b)
    });
    let (category, causes, summary, ledger) = match main {
        Some((m, s)) => {
            let reference = opts.budget_bytes.unwrap_or(s.peak_bytes).max(1);
            let largest = s
                .buffers_at_peak
                .iter()
                .filter(|b| b.kind != "parameter")
                .map(|b| b.size_bytes)
                .max()
                .unwrap_or(0);
            let category = if s.arguments_bytes + s.outputs_bytes >= reference
                && opts.budget_bytes.is_some()
            {
                Category::Arguments
            } else if largest * 2 > reference {
                Category::SingleLargeAllocation
            } else {
                Category::Aggregate
            };
            let fmt = hbm_doctor_log::format_size;
            let verdict = match opts.budget_bytes {
                Some(b) if s.device_bytes() > b => format!(
                    "does not fit {}: needs {} of HBM, {} over",
                    opts.target
                        .as_deref()
                        .map_or_else(|| fmt(b), |t| format!("{t} ({})", fmt(b))),
                    fmt(s.device_bytes()),
                    fmt(s.device_bytes() - b)
                ),
                Some(b) => format!(
                    "fits {} with {} to spare",
                    opts.target
                        .as_deref()
                        .map_or_else(|| fmt(b), |t| format!("{t} ({})", fmt(b))),
                    fmt(b - s.device_bytes())
                ),
                None => format!(
                    "needs {} of HBM (peak {} live)",
                    fmt(s.device_bytes()),
                    fmt(s.peak_bytes)
                ),
            };
            (
                category,
                m.causes.clone(),
                format!("{}: {verdict}", m.name),
                crate::ledger::of_space(s),
            )
        }
        None => (
            Category::Unknown,
            Vec::new(),
            "no module with a buffer assignment or a scheduled HLO module was found".into(),
            Vec::new(),
        ),
    };
    let mut report = AnalyzeReport {
        schema_version: SCHEMA_VERSION,
        modules,
        diagnosis: AnalyzeDiagnosis {
            category,
            causes,
            budget_bytes: opts.budget_bytes,
            fits,
            summary,
            ledger,
            what_if: Vec::new(),
        },
    };
    // A program that does not fit gets the same diagnosis `explain --dump` gives its OOM.
    if let Some(d) = crate::join::diagnose_dump(&report) {
        report.diagnosis.category = d.category;
        report.diagnosis.causes = d.causes;
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::{analyze_texts, testdata::dump};

    #[test]
    fn sizes_of_shapes() {
        assert_eq!(space_name(0), "hbm");
        assert_eq!(space_name(1), "vmem");
        assert_eq!(space_name(5), "host");
        assert_eq!(space_name(2), "space2");
        assert_eq!(logical_bytes("f32[129,1024]"), 129 * 1024 * 4);
        assert_eq!(
            logical_bytes("(f32[2], s32[], token[])"),
            24,
            "a tuple is its pointers"
        );
        // Tiles pad the physical size only.
        assert_eq!(logical_bytes("bf16[3,1000]{1,0:T(8,128)(2,1)}"), 6000);
        assert_eq!(physical_bytes("bf16[3,1000]{1,0:T(8,128)(2,1)}"), 16384);
        assert_eq!(physical_bytes("f32[129,1024]"), 129 * 1024 * 4);
    }

    #[test]
    fn op_names_split_outside_brackets() {
        assert_eq!(
            op_name_parts(
                "jit(step)/jvp(f)/dot_general[dimension_numbers=(((1,), (0,)), ((), ()))]"
            ),
            [
                "jit(step)",
                "jvp(f)",
                "dot_general[dimension_numbers=(((1,), (0,)), ((), ()))]"
            ]
        );
    }

    #[test]
    fn sizes_past_2_pow_56_are_refused() {
        let (m, _) = hbm_doctor_hlo::hlo::parse_module(
            "HloModule m\n\nENTRY e {\n  ROOT p = f32[1099511627776,1099511627776]{1,0} parameter(0)\n}\n",
        );
        let (which, why) = check_sizes(Some(&m), None).expect_err("refused");
        assert_eq!(which, "hlo");
        assert!(why.contains("more than 2^56"), "{why}");
    }

    /// The peak recomputed from the buffer assignment and live ranges is XLA's own, on the CPU
    /// programs and on a TPU one.
    #[test]
    fn xla_live_range_peak_reproduced() {
        for rel in [
            "cpu/mlp_train/dump",
            "cpu/sharded_mlp/dump",
            "tpu/debug_print_v5e/dump",
        ] {
            let r = analyze_texts(&dump(rel), &AnalyzeOptions::default()).expect("analyze");
            for m in &r.modules {
                if let (Some(x), Some(o)) =
                    (m.xla.live_range_peak_bytes, m.xla.recomputed_peak_bytes)
                {
                    assert_eq!(x, o, "{rel} {}", m.name);
                }
            }
            assert!(
                r.modules
                    .iter()
                    .any(|m| m.xla.live_range_peak_bytes.is_some()),
                "{rel}: no live-range peak"
            );
        }
    }
}
