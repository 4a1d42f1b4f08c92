//! The report model of `explain`, serialized exactly as `docs/contract.md` specifies.

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
