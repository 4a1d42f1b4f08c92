//! The report models, serialized exactly as `docs/contract.md` specifies: `explain`'s
//! ([`ExplainReport`]) and `analyze`'s ([`AnalyzeReport`], with its input [`ModuleInput`] and
//! options). Every other module of the crate reads and writes these; none defines a report type.

use hbm_doctor_hlo::buffer_assignment::BufferAssignment;
use hbm_doctor_hlo::hlo::HloModule;
use hbm_doctor_hlo::live_range::LiveRange;
use hbm_doctor_hlo::usage_report::UsageReport;
use hbm_doctor_log::{Event, WarningSummary};
use serde::{Deserialize, Serialize};

/// The JSON schema version of every report.
pub const SCHEMA_VERSION: u32 = 1;

/// The guide's decision-tree category of the main event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// TensorCore + SparseCore usage split given (guide section 1).
    TcScImbalance,
    /// One or more allocations each over 50% of the limit (guide section 2).
    SingleLargeAllocation,
    /// The sum of many allocations exceeds the limit (guide section 3).
    Aggregate,
    /// Program inputs/outputs alone fill or exceed the memory.
    Arguments,
    /// On-chip scoped memory (vmem/smem) of a kernel.
    Vmem,
    /// A runtime allocation or program load failed on the device.
    RuntimeAllocation,
    /// Enough memory is free in total but no contiguous region is large enough.
    RuntimeFragmentation,
    /// Host (CPU) memory, not device memory.
    HostMemory,
    /// An OOM was found but the text does not say enough.
    Unknown,
}

impl Category {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::TcScImbalance => "tc_sc_imbalance",
            Category::SingleLargeAllocation => "single_large_allocation",
            Category::Aggregate => "aggregate",
            Category::Arguments => "arguments",
            Category::Vmem => "vmem",
            Category::RuntimeAllocation => "runtime_allocation",
            Category::RuntimeFragmentation => "runtime_fragmentation",
            Category::HostMemory => "host_memory",
            Category::Unknown => "unknown",
        }
    }
}

/// The closed vocabulary of causes (contract.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum CauseKind {
    BatchTooLarge,
    ReplicatedTensor,
    DebugPrint,
    Padding,
    NoDonation,
    NoRemat,
    LargeActivation,
    F32Precision,
    OptimizerStateUnsharded,
    ArgumentsExceed,
    SparsecoreStack,
    SparsecorePadding,
    KernelTiling,
    ShapeBug,
    Fragmentation,
    Preallocation,
    OtherProcess,
    MemoryLeak,
    MemorySpike,
    Recompilation,
    HostOom,
    DeviceTooSmall,
}

impl CauseKind {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CauseKind::BatchTooLarge => "batch_too_large",
            CauseKind::ReplicatedTensor => "replicated_tensor",
            CauseKind::DebugPrint => "debug_print",
            CauseKind::Padding => "padding",
            CauseKind::NoDonation => "no_donation",
            CauseKind::NoRemat => "no_remat",
            CauseKind::LargeActivation => "large_activation",
            CauseKind::F32Precision => "f32_precision",
            CauseKind::OptimizerStateUnsharded => "optimizer_state_unsharded",
            CauseKind::ArgumentsExceed => "arguments_exceed",
            CauseKind::SparsecoreStack => "sparsecore_stack",
            CauseKind::SparsecorePadding => "sparsecore_padding",
            CauseKind::KernelTiling => "kernel_tiling",
            CauseKind::ShapeBug => "shape_bug",
            CauseKind::Fragmentation => "fragmentation",
            CauseKind::Preallocation => "preallocation",
            CauseKind::OtherProcess => "other_process",
            CauseKind::MemoryLeak => "memory_leak",
            CauseKind::MemorySpike => "memory_spike",
            CauseKind::Recompilation => "recompilation",
            CauseKind::HostOom => "host_oom",
            CauseKind::DeviceTooSmall => "device_too_small",
        }
    }
}

/// Code for one framework (extension field `snippets`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snippet {
    /// `jax`, `pytorch_xla` or `shell`.
    pub framework: String,
    /// The code.
    pub code: String,
}

/// One ranked cause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    /// The cause, from the closed vocabulary.
    pub cause: CauseKind,
    /// Estimated reduction of the peak if the actions are taken; null if unknown.
    pub savings_bytes: Option<u64>,
    /// The figures and buffers the cause rests on.
    pub evidence: String,
    /// Concrete steps, most useful first; compiler flags last, marked "last resort".
    pub actions: Vec<String>,
    /// Extension: code for the actions, per framework.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snippets: Vec<Snippet>,
    /// Extension: whether the savings alone would make the program fit.
    #[serde(default)]
    pub sufficient: Option<bool>,
    /// Extension: the peak recomputed over the dump's live ranges with this cause's change
    /// applied (absent without a dump).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub what_if: Option<WhatIf>,
    /// The buffers the change touches and the share of each that remains, in thousandths
    /// (0: removed, 500: halved); not serialized.
    #[serde(skip)]
    pub changes: Vec<(String, u32)>,
}

impl Cause {
    /// A cause with its savings, evidence and actions, the cause's generic advice appended
    /// (`causes::spec`); no snippets, what-if or changes yet.
    pub fn new(
        cause: CauseKind,
        savings_bytes: Option<u64>,
        evidence: String,
        mut actions: Vec<String>,
    ) -> Cause {
        // The rule's own lines first, then the cause's advice, written once (causes.rs).
        crate::causes::complete_actions(cause, &mut actions);
        Cause {
            cause,
            savings_bytes,
            evidence,
            actions,
            snippets: Vec::new(),
            sufficient: None,
            what_if: None,
            changes: Vec::new(),
        }
    }
}

/// A change applied to a dump's buffers without recompiling (extension field `what_if`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhatIf {
    /// What was changed.
    pub change: String,
    /// Buffers changed.
    pub buffers: usize,
    /// The peak before.
    pub peak_before_bytes: u64,
    /// The most live at one point once changed.
    pub peak_bytes: u64,
    /// What the compiler would reserve once changed (the peak plus today's packing loss).
    pub total_bytes: u64,
    /// Whether that fits the budget (null without one).
    pub fits: Option<bool>,
}

/// The diagnosis of the main event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// Index of the main event in `events`.
    pub event: usize,
    /// The guide's category.
    pub category: Category,
    /// Ranked causes.
    pub causes: Vec<Cause>,
    /// Extension: one-sentence verdict.
    pub summary: String,
    /// Extension: the device the figures point to, when they allow it.
    pub chip: Option<String>,
    /// Extension: physical memory of that device, in bytes.
    pub physical_bytes: Option<u64>,
    /// Extension: TPU generations on which the stated requirement fits (single device).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fits_on: Vec<String>,
    /// Extension: the dump module joined by `explain --dump` (absent without `--dump`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dump_module: Option<String>,
    /// Extension: what the requirement is made of, part by part.
    #[serde(default)]
    pub ledger: Vec<LedgerEntry>,
    /// Extension: evidence the diagnosis lacks, and the cheapest way to collect it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
    /// What the re-ranker saw (features and candidates): for the accuracy harness and the
    /// ranker's training, never serialized.
    #[serde(skip)]
    pub rank_input: Option<crate::rank::RankInput>,
}

/// One accounted part of what the program needs (extension field `ledger` of a diagnosis).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// `parameters`, `optimizer_state`, `arguments`, `outputs`, `temporaries`, `logits`,
    /// `attention_scores`, `debug_copies`, `padding`, `fragmentation`, `reserved`,
    /// `in_use`, `request`, `free`, `unaccounted`.
    pub part: String,
    /// Bytes of that part.
    pub bytes: u64,
    /// How the figure is known: `stated` (printed by the compiler or runtime), `listed` (the sum
    /// of listed buffers, a lower bound), `derived` (computed from stated figures), `measured`
    /// (from a dump).
    pub basis: String,
    /// What it rests on.
    pub note: String,
}

/// The whole `explain` report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExplainReport {
    /// Always [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Every OOM event, in input order.
    pub events: Vec<Event>,
    /// Present whenever `events` is not empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<Diagnosis>,
    /// Extension: non-fatal warnings (rematerialization shortfalls, allocator retries...)
    /// counted per kind, with the first and last line and the figures of the worst; absent when
    /// there were none. The last remat warning before a failure is also that event's `remat`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<WarningSummary>,
}

// ---- analyze (`hbm-doctor analyze --format json`) ----

/// The parsed artifacts of one module (any of them may be missing).
#[derive(Debug, Default)]
pub struct ModuleInput<'a> {
    /// Module name.
    pub name: String,
    /// The after-optimizations HLO module.
    pub hlo: Option<&'a HloModule<'a>>,
    /// The buffer assignment.
    pub buffer_assignment: Option<&'a BufferAssignment<'a>>,
    /// Live ranges (from `-live-range.txt` or appended to the buffer assignment).
    pub live_range: Option<&'a LiveRange<'a>>,
    /// The memory-usage report.
    pub usage_report: Option<&'a UsageReport<'a>>,
    /// What is missing or was skipped, with the XLA flag that produces it.
    pub notes: Vec<String>,
}

/// Options of `analyze`.
#[derive(Debug, Clone, Default)]
pub struct AnalyzeOptions {
    /// Device memory the program must fit in (from `--budget` or `--target`).
    pub budget_bytes: Option<u64>,
    /// Name of the target, for messages.
    pub target: Option<String>,
}

/// One buffer live at the peak.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BufferAtPeak {
    /// Instruction name (with `{index}` for a tuple element).
    pub name: String,
    /// Bytes it occupies (padded on TPU).
    pub size_bytes: u64,
    /// Logical bytes.
    pub unpadded_bytes: u64,
    /// Shape without layout.
    pub shape: String,
    /// `parameter` | `output` | `temp` | `constant` | `thread_local`.
    pub kind: String,
    /// The framework op name.
    pub op_name: Option<String>,
    /// The user's `file:line` (file base name).
    pub source: Option<String>,
    /// Extension: shape with layout.
    pub layout_shape: String,
    /// Extension: the HLO opcode.
    pub opcode: Option<String>,
    /// Extension: full path of the source file.
    pub source_path: Option<String>,
    /// Extension: Python function of the source line.
    pub function: Option<String>,
    /// Extension: live range in schedule positions (inclusive).
    pub live: Option<(u64, u64)>,
    /// Extension: allocation index in the buffer assignment.
    pub allocation: Option<u64>,
    /// An output allocation's other values, the step's scratch before its results are written
    /// (a loop's accumulator, converted copies): their first and last schedule positions and
    /// their largest size. Were the output aliased to a donated input, they would still need
    /// that much memory then (what-if of `no_donation`). Not serialized.
    #[serde(skip)]
    pub scratch: Option<(u64, u64, u64)>,
    /// The scratch is carried through a loop (a `while` value or its phi): it is live with the
    /// other outputs' scratch by necessity, not by the schedule's choice.
    #[serde(skip)]
    pub scratch_carried: bool,
}

/// Bytes at the peak grouped by one key.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Group {
    /// The key (a `file:line`, or an op_name path prefix).
    pub key: String,
    /// Nesting depth for op_name paths (0 = first component).
    pub depth: usize,
    /// Bytes.
    pub bytes: u64,
    /// Number of buffers.
    pub buffers: usize,
}

/// One memory space of one module.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SpaceReport {
    /// `hbm`, `vmem`, `host` or `space<N>`.
    pub space: String,
    /// What the compiler reserves in this space: the sum of its allocations.
    pub total_bytes: u64,
    /// The most live at one point of the program.
    pub peak_bytes: u64,
    /// Entry parameters (including donated ones).
    pub arguments_bytes: u64,
    /// Outputs that are not donated parameters.
    pub outputs_bytes: u64,
    /// Parameters whose buffer is reused for an output.
    pub aliased_bytes: u64,
    /// The temp arena(s).
    pub temp_bytes: u64,
    /// Padding among the buffers live at the peak.
    pub padding_bytes: u64,
    /// Buffers live at the peak, largest first.
    pub buffers_at_peak: Vec<BufferAtPeak>,
    /// Extension: the color (memory space number).
    pub color: u32,
    /// Extension: constants.
    pub constants_bytes: u64,
    /// Extension: thread-local allocations (not in the device heap).
    pub thread_local_bytes: u64,
    /// Extension: total minus peak (temp arena packing loss).
    pub fragmentation_bytes: u64,
    /// Extension: schedule position of the peak.
    pub peak_time: Option<u64>,
    /// Extension: the instruction scheduled at the peak.
    pub peak_instruction: Option<String>,
    /// Extension: bytes live at the peak grouped by user source line.
    pub by_source: Vec<Group>,
    /// Extension: bytes live at the peak grouped by op_name path prefix.
    pub by_op_name: Vec<Group>,
    /// Extension: bytes live at each schedule position (program order).
    pub timeline: Vec<u64>,
    /// Extension: `timeline` split by kind (`parameter`, `output`, `constant`, `temp`): the
    /// series add up to `timeline` at every position. Empty when `timeline` is.
    pub timeline_by_kind: Vec<KindTimeline>,
    /// Extension: the largest buffers of this space over the whole program (not only those live
    /// at the peak), largest first, with their live ranges: at most [`LARGEST_BUFFERS`].
    pub largest_buffers: Vec<BufferAtPeak>,
    /// Extension: how many buffers (values with a live range, plus the parameter, output and
    /// constant allocations) this space holds over the whole program.
    pub buffer_count: u64,
}

impl SpaceReport {
    /// What the space needs on the device: its allocations less the thread-local ones, which
    /// are not in the device heap (a host-offloaded computation's values, for one). This is what
    /// a fit is judged by; `total_bytes` stays XLA's report "Total bytes".
    pub fn device_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.thread_local_bytes)
    }
}

/// Bytes of one kind live at each schedule position.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KindTimeline {
    /// `parameter` | `output` | `constant` | `temp`.
    pub kind: String,
    /// Bytes at each schedule position (same length as `timeline`).
    pub bytes: Vec<u64>,
}

/// How many buffers `largest_buffers` keeps per memory space.
pub const LARGEST_BUFFERS: usize = 500;

/// XLA's own figures for the module, and ours recomputed the same way.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct XlaFigures {
    /// `Live ranges at N (peak)` as stated.
    pub live_range_peak_time: Option<u64>,
    /// The stated live-range peak bytes (logical sizes, all memory spaces).
    pub live_range_peak_bytes: Option<u64>,
    /// Our recomputation of that peak time with XLA's rule.
    pub recomputed_peak_time: Option<u64>,
    /// Our recomputation of that peak's bytes.
    pub recomputed_peak_bytes: Option<u64>,
    /// The memory-usage report's totals per color.
    pub report_totals: Vec<(u32, u64)>,
    /// `Total bytes used` of the buffer assignment.
    pub total_bytes_used: Option<u64>,
}

/// One module's analysis.
#[derive(Debug, Clone, Serialize)]
pub struct ModuleReport {
    /// Module name.
    pub name: String,
    /// Per memory space.
    pub memory_spaces: Vec<SpaceReport>,
    /// Extension: `buffer_assignment` (exact) or `heap_simulation` (estimate from the schedule).
    pub method: String,
    /// Extension: true when the figures are estimates.
    pub estimate: bool,
    /// Extension: `num_partitions` of the module.
    pub num_partitions: u32,
    /// Extension: XLA's own figures.
    pub xla: XlaFigures,
    /// Extension: what was missing and how to get it.
    pub notes: Vec<String>,
    /// Extension: causes found in this module.
    pub causes: Vec<Cause>,
    /// Extension: the instruction at each schedule position (the x axis of `timeline`), from the
    /// live ranges' instruction sequence or, for an estimate, the entry computation's order.
    pub schedule: Vec<String>,
}

/// The diagnosis over all modules.
#[derive(Debug, Clone, Serialize)]
pub struct AnalyzeDiagnosis {
    /// Category.
    pub category: Category,
    /// Ranked causes.
    pub causes: Vec<Cause>,
    /// Extension: the budget checked against.
    pub budget_bytes: Option<u64>,
    /// Extension: whether every module's HBM total fits the budget (null without a budget).
    pub fits: Option<bool>,
    /// Extension: one sentence.
    pub summary: String,
    /// Extension: what the main module's HBM holds, part by part (see `ledger`).
    pub ledger: Vec<crate::model::LedgerEntry>,
    /// Extension: the changes asked for with `--what-if`, applied to the main module.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub what_if: Vec<crate::model::WhatIf>,
}

/// The whole `analyze` report.
#[derive(Debug, Clone, Serialize)]
pub struct AnalyzeReport {
    /// Always [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Modules.
    pub modules: Vec<ModuleReport>,
    /// Diagnosis.
    pub diagnosis: AnalyzeDiagnosis,
}
