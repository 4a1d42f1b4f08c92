//! The model of one out-of-memory event, as found in a log.
//!
//! Field names and order follow `docs/contract.md` (the `events` array of `explain --format json`);
//! fields after `allocations` are extensions recorded in CHANGELOG.md. A figure the text does not
//! state is `None` (JSON `null`), never a guess.

use serde::{Deserialize, Serialize};

/// When the failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// While compiling (the program's static plan does not fit).
    #[default]
    Compile,
    /// While running or loading a program.
    Runtime,
}

/// What the program was doing when it failed, from the traceback's frames and the log around
/// the event (extension field `stage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Creating the model or its parameters, or placing them on devices (`__init__`, `init`,
    /// `device_put`, `.to(device)`).
    Init,
    /// Loading a checkpoint or pretrained weights.
    Restore,
    /// A training step (`train_step`, `backward`, `optimizer.step`).
    Train,
    /// Evaluation or validation.
    Eval,
    /// Saving a checkpoint.
    CheckpointSave,
    /// Inference: generation, decoding, sampling.
    Generation,
}

impl Stage {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Init => "init",
            Stage::Restore => "restore",
            Stage::Train => "train",
            Stage::Eval => "eval",
            Stage::CheckpointSave => "checkpoint_save",
            Stage::Generation => "generation",
        }
    }
}

/// Which XLA backend produced the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// Cloud TPU (libtpu).
    Tpu,
    /// An NVIDIA or AMD GPU.
    Gpu,
    /// The host CPU.
    Cpu,
}

/// Which framework ran the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Framework {
    /// JAX (and libraries on it: Flax, MaxText, T5X, Pax, EasyDeL...).
    Jax,
    /// PyTorch/XLA.
    PytorchXla,
    /// TensorFlow (and Keras on it).
    Tensorflow,
    /// PyTorch without XLA (its CUDA caching allocator, vLLM).
    Pytorch,
}

/// The memory that ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySpace {
    /// TPU high-bandwidth memory.
    Hbm,
    /// TPU vector memory (on-chip, per kernel scope).
    Vmem,
    /// TPU scalar memory.
    Smem,
    /// Host RAM (pinned or not).
    Host,
    /// A GPU's device memory.
    Device,
}

impl MemorySpace {
    /// Parses `hbm`, `vmem`, `smem`, `host`... as XLA names them.
    pub fn from_name(name: &str) -> Option<MemorySpace> {
        match name.to_ascii_lowercase().as_str() {
            "hbm" => Some(MemorySpace::Hbm),
            "vmem" => Some(MemorySpace::Vmem),
            "smem" | "sflag" | "cmem" => Some(MemorySpace::Smem),
            "host" | "pinned_host" => Some(MemorySpace::Host),
            _ => None,
        }
    }
}

/// The family of message an event was read from (extension field `family`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// `Ran out of memory in memory space hbm. Used X of Y hbm. Exceeded hbm capacity by Z.`
    TpuCompileHbm,
    /// The older TensorFlow-era `Compilation failure: Ran out of memory in memory space hbm. Used X of Y`
    /// where Y is the chip's physical capacity.
    TpuCompileHbmOld,
    /// `the total memory required for HLO temporaries (X) exceeds available HBM (Y)`.
    TpuHloTemporaries,
    /// `TPU TensorCore Hbm usage: X, SparseCore Hbm usage Y, exceeding available bytes: Z`.
    TpuTcSc,
    /// `Aborting compilation early because it's unlikely to have enough memory. Requires X, has Y`.
    TpuAbortEarly,
    /// vmem / smem compile-time OOMs (`Ran out of memory in memory space vmem`, scoped vmem limit).
    TpuCompileVmem,
    /// `Allocation (size=N) would exceed memory (size=M) :: #allocation [shape = ...]`.
    TpuAllocationExceeds,
    /// `Error allocating device buffer: Attempting to allocate X. That was not possible. There are Y free.`
    TpuRuntimeAlloc,
    /// `Error loading program '...': Attempting to reserve X at the bottom of memory.`
    TpuProgramLoad,
    /// `Out of memory while trying to allocate N bytes` (XLA:GPU and PJRT), with the optional
    /// `BufferAssignment OOM Debugging` report.
    GpuOomAllocate,
    /// `Failed to allocate request for X (NB) on device ordinal N`.
    GpuFailedRequest,
    /// `Allocator (GPU_0_bfc) ran out of memory trying to allocate X` and its dump.
    BfcAllocator,
    /// `Can't reduce memory use below X by rematerialization; only reduced to Y`.
    RematWarning,
    /// TensorFlow `OOM when allocating tensor with shape[...] and type T on DEVICE by allocator A`.
    TfOomTensor,
    /// Host RAM exhausted: the kernel's OOM killer, or `Out of host memory`.
    HostOom,
    /// PyTorch's CUDA caching allocator: `CUDA out of memory. Tried to allocate X ...` (both
    /// message generations).
    PytorchCudaOom,
    /// A CUDA driver or wrapper error: `CUDA error: out of memory`, `CUDA_ERROR_OUT_OF_MEMORY`,
    /// CuPy's `Out of memory allocating`.
    CudaOom,
    /// vLLM's KV cache cannot be sized (`No available memory for the cache blocks`, max seq len
    /// larger than the KV cache).
    VllmKvCache,
    /// A GPU kernel's per-block shared memory: Pallas/Triton `Shared memory size limit exceeded:
    /// requested N, available: M`, ptxas `uses too much shared data (X bytes, Y max)` (reported
    /// in memory space `vmem`, the on-chip scratch).
    GpuSharedMemory,
    /// An accelerator outside XLA (Gaudi, Tenstorrent), read best-effort.
    OtherAccelerator,
    /// `RESOURCE_EXHAUSTED` about memory with no figures this tool can read.
    #[default]
    Unrecognized,
}

impl Family {
    /// Every family, in declaration order.
    pub const ALL: [Family; 21] = [
        Family::TpuCompileHbm,
        Family::TpuCompileHbmOld,
        Family::TpuHloTemporaries,
        Family::TpuTcSc,
        Family::TpuAbortEarly,
        Family::TpuCompileVmem,
        Family::TpuAllocationExceeds,
        Family::TpuRuntimeAlloc,
        Family::TpuProgramLoad,
        Family::GpuOomAllocate,
        Family::GpuFailedRequest,
        Family::BfcAllocator,
        Family::RematWarning,
        Family::TfOomTensor,
        Family::HostOom,
        Family::PytorchCudaOom,
        Family::CudaOom,
        Family::VllmKvCache,
        Family::GpuSharedMemory,
        Family::OtherAccelerator,
        Family::Unrecognized,
    ];

    /// The JSON spelling (`tpu_compile_hbm`), which every output uses, the human view too.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::TpuCompileHbm => "tpu_compile_hbm",
            Family::TpuCompileHbmOld => "tpu_compile_hbm_old",
            Family::TpuHloTemporaries => "tpu_hlo_temporaries",
            Family::TpuTcSc => "tpu_tc_sc",
            Family::TpuAbortEarly => "tpu_abort_early",
            Family::TpuCompileVmem => "tpu_compile_vmem",
            Family::TpuAllocationExceeds => "tpu_allocation_exceeds",
            Family::TpuRuntimeAlloc => "tpu_runtime_alloc",
            Family::TpuProgramLoad => "tpu_program_load",
            Family::GpuOomAllocate => "gpu_oom_allocate",
            Family::GpuFailedRequest => "gpu_failed_request",
            Family::BfcAllocator => "bfc_allocator",
            Family::RematWarning => "remat_warning",
            Family::TfOomTensor => "tf_oom_tensor",
            Family::HostOom => "host_oom",
            Family::PytorchCudaOom => "pytorch_cuda_oom",
            Family::CudaOom => "cuda_oom",
            Family::VllmKvCache => "vllm_kv_cache",
            Family::GpuSharedMemory => "gpu_shared_memory",
            Family::OtherAccelerator => "other_accelerator",
            Family::Unrecognized => "unrecognized",
        }
    }

    /// Rough information content, used to pick the richer of two duplicates.
    pub fn richness(self) -> u8 {
        match self {
            Family::Unrecognized => 0,
            Family::RematWarning => 1,
            Family::TpuHloTemporaries => 2,
            _ => 3,
        }
    }
}

/// One buffer named by the message: an entry of "Largest program allocations", a GPU "Peak
/// buffers" entry, or the tensor that could not be allocated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Allocation {
    /// Size as allocated (padded on TPU).
    pub size_bytes: u64,
    /// Logical size without tile padding, when stated.
    pub unpadded_bytes: Option<u64>,
    /// The shape as printed, with its layout when printed.
    pub shape: Option<String>,
    /// The framework op path (`jit(train_step)/.../dot_general`).
    pub op_name: Option<String>,
    /// The user's Python source as `file:line`, when the metadata names it.
    pub source: Option<String>,
    /// The XLA label: an instruction name (TPU) or an opcode (GPU).
    pub label: Option<String>,
    /// `HLO temp`, `scoped`, `Entry Parameter`... as printed.
    pub allocation_type: Option<String>,
    /// Extension: `op_type` from the metadata (TensorFlow ops).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_type: Option<String>,
}

/// Rematerialization figures (`Can't reduce memory use below X ... only reduced to Y, down from Z`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Remat {
    /// The memory limit the pass aimed at.
    pub target_bytes: u64,
    /// The peak it reached.
    pub reduced_to_bytes: u64,
    /// The peak before rematerialization, when stated.
    pub original_bytes: Option<u64>,
}

/// One out-of-memory event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Event {
    /// 1-based line where the event's message starts.
    pub line: u64,
    /// Compile or runtime.
    pub phase: Phase,
    /// Backend, when the text tells.
    pub backend: Option<Backend>,
    /// Framework, when the text tells.
    pub framework: Option<Framework>,
    /// Which memory ran out.
    pub memory_space: Option<MemorySpace>,
    /// What the program needs (compile) or holds (runtime).
    pub used_bytes: Option<u64>,
    /// What was available.
    pub limit_bytes: Option<u64>,
    /// `used - limit`.
    pub exceeded_bytes: Option<u64>,
    /// The single allocation that failed.
    pub requested_bytes: Option<u64>,
    /// Free memory at the failure.
    pub free_bytes: Option<u64>,
    /// TensorCore HBM usage (TC/SC messages).
    pub tensorcore_bytes: Option<u64>,
    /// SparseCore HBM usage (TC/SC messages).
    pub sparsecore_bytes: Option<u64>,
    /// Buffers the message lists, largest first as printed.
    pub allocations: Vec<Allocation>,

    /// Extension: the message family.
    pub family: Family,
    /// Extension: the headline of the message, cleaned of log prefixes.
    pub message: String,
    /// Extension: whether it failed the program (false for warnings such as remat).
    pub fatal: bool,
    /// Extension: how many times the same event was printed (log line, exception, re-raise...).
    pub repeats: u32,
    /// Extension: the compiled program's name (`jit_train_step`), when stated.
    pub program: Option<String>,
    /// Extension: memory the runtime reserves (`reserved` of `Total hbm usage >=`).
    pub reserved_bytes: Option<u64>,
    /// Extension: the program's requirement (`program` / `Program hbm requirement`).
    pub program_bytes: Option<u64>,
    /// Extension: parameters of the program (`arguments`, GPU `parameter allocation`).
    pub arguments_bytes: Option<u64>,
    /// Extension: outputs of the program (`Output size`, GPU `maybe_live_out allocation`).
    pub output_bytes: Option<u64>,
    /// Extension: output bytes that share (alias) argument buffers.
    pub output_aliased_bytes: Option<u64>,
    /// Extension: the HLO temporaries heap.
    pub hlo_temp_bytes: Option<u64>,
    /// Extension: HLO temporaries without padding.
    pub hlo_temp_unpadded_bytes: Option<u64>,
    /// Extension: HLO temporaries with padding.
    pub hlo_temp_padded_bytes: Option<u64>,
    /// Extension: fragmentation of the temp heap (or a GPU assignment's total fragmentation).
    pub fragmentation_bytes: Option<u64>,
    /// Extension: the largest contiguous free block, when stated.
    pub largest_free_bytes: Option<u64>,
    /// Extension: the allocator or device named (`GPU_0_bfc`, `0x0x1_HBM0`, `/device:GPU:0`).
    pub device: Option<String>,
    /// Extension: rematerialization figures that preceded the failure.
    pub remat: Option<Remat>,
    /// Extension: only a report was found (a pasted `Largest program allocations`, `Peak buffers`
    /// or allocator dump), not the error line itself.
    pub partial: bool,
    /// Extension: the last training step printed before a runtime failure.
    pub step: Option<u64>,
    /// Extension: what was happening just before a runtime failure (`eval`, `checkpoint`,
    /// `saving`, `recompil`, `compiling`), when the log says.
    pub near: Option<String>,
    /// Extension: memory the failing process holds on the device (PyTorch's "this process has X
    /// memory in use", or what it reserved), when the message states it.
    #[serde(default)]
    pub process_bytes: Option<u64>,
    /// Extension: what the framework's own allocator has handed out (PyTorch's "X is allocated
    /// by PyTorch", "already allocated"), when the message says.
    #[serde(default)]
    pub allocated_bytes: Option<u64>,
    /// Extension: an allocator pool setting the text around the event names
    /// (`gpu_memory_utilization`, `XLA_PYTHON_CLIENT_MEM_FRACTION`, `allow_growth`,
    /// `--xla_tpu_max_hbm_size_mib`...), with the value when it is written next to it.
    #[serde(default)]
    pub pool_setting: Option<String>,
    /// Extension: what the program was doing (init, restore, train, eval, checkpoint_save,
    /// generation), from the traceback's frames around the event.
    #[serde(default)]
    pub stage: Option<Stage>,
    /// Extension: the model's parameter count named in the text around the event (`Mistral-7B`,
    /// `gpt-neo-2.7B`, `a 13B model`, `7 billion parameters`).
    #[serde(default)]
    pub model_params: Option<u64>,
    /// Extension: bits per parameter the text sets for the weights (`--dtype half` 16,
    /// `load_in_8bit` 8, `awq`/`4bit` 4, `float32` 32), when it says.
    #[serde(default)]
    pub param_bits: Option<u32>,
    /// Extension: the TPU the text names (`v3-8`, `v5litepod-16`, `v6e`), as written.
    #[serde(default)]
    pub accelerator: Option<String>,
    /// Extension: the sentence in which the user says a smaller batch was already tried and
    /// still failed (`even with batch size 1`, `I tried reducing the batch size`).
    #[serde(default)]
    pub batch_tried: Option<String>,
    /// Extension: the user's sentence saying something else holds the device (`in use by
    /// another process`, `another notebook is running`).
    #[serde(default)]
    pub holder_named: Option<String>,
    /// Extension: the GPU's memory as the text names it (`Tesla P100-PCIE-16GB`, `A40, 48 GB
    /// VRAM`, `a GPU with 24GB`, `T4`), in bytes, when no message states the device's size.
    #[serde(default)]
    pub device_named_bytes: Option<u64>,
    /// Extension: how many devices the text says the run uses, when more than one (`A100/40G ×
    /// 4`, `2x RTX 3090`, `8 GPUs`, `tp=4`, `两张12G显卡`).
    #[serde(default)]
    pub devices_named: Option<u32>,
    /// Extension: the user's sentence saying memory grew before the failure (`a slow and steady
    /// increase`, `there appears to be a memory leak`, `runs out of memory on epoch 4`).
    #[serde(default)]
    pub growth_said: Option<String>,
    /// Extension: a protein structure predictor the text names (`AlphaFold`, `ColabFold`,
    /// `RoseTTAFold`, `ESMFold`, `Boltz`...): the program folds one complex at a time, its
    /// memory grows with the square of the sequence length, and there is no batch to cut.
    #[serde(default)]
    pub structure_predictor: Option<String>,
    /// Extension: an image upscaler or restorer the text names (`Real-ESRGAN`, `SwinIR`,
    /// `GFPGAN`, `waifu2x`, a super-resolution model): it processes one image at a time, whose
    /// size sets the activations; tiling, not a batch, is the knob.
    #[serde(default)]
    pub image_upscaler: Option<String>,
    /// Extension: the words that show a diffusion model's VAE decoding the latents to pixels when
    /// it failed (`vae.decode(`, `decode_first_stage`, `VAEDecode`, `decoding latents`, `VAE
    /// decode`): the whole image or video decoded at once at full resolution; tiling is the knob.
    #[serde(default)]
    pub vae_decode: Option<String>,
    /// Extension: the operation the failure happened in, where the text shows it: TensorFlow's
    /// node (`[[Node: transformer/softmax_cross_entropy_with_logits = ...`) or the code line of
    /// the traceback's last frame (`return torch._C._nn.cross_entropy_loss(input, target, ...)`).
    #[serde(default)]
    pub failing_op: Option<String>,
    /// Not serialized: a report pasted without its headline showed TPU's `Largest program
    /// allocations in <space>:` header, which the compiler prints only in an out-of-memory error
    /// (a successful compile may log `Total hbm usage >=`, never the listing header), or a
    /// listing followed by TensorFlow's `report_tensor_allocations_upon_oom` hint (also printed
    /// under an out-of-memory status only).
    #[serde(skip)]
    pub listing_header: bool,
    /// Not serialized: the failure is told in a sentence (`I receive a OOM error`), no message
    /// pasted; any printed failure in the same text is the better event and replaces it.
    #[serde(skip)]
    pub told: bool,
    /// Not serialized: the rows of the TPU memory usage report's tables after its first. The
    /// compiler prints one such table per buffer allocation that is not the temporaries' (the
    /// entry parameters, the outputs they do not alias): what the program holds whole, each as
    /// (size, the largest shape the allocation holds).
    #[serde(skip)]
    pub held: Vec<(u64, String)>,
}

impl Event {
    /// Fills `exceeded_bytes` from used and limit when the message did not state it.
    pub fn derive(&mut self) {
        if self.exceeded_bytes.is_none() {
            if let (Some(u), Some(l)) = (self.used_bytes, self.limit_bytes) {
                if u > l {
                    self.exceeded_bytes = Some(u - l);
                }
            }
        }
        if self.used_bytes.is_none() {
            if let (Some(tc), Some(sc)) = (self.tensorcore_bytes, self.sparsecore_bytes) {
                self.used_bytes = Some(tc.saturating_add(sc));
            }
        }
    }

    /// How many figures are known: used to keep the richer of two duplicates.
    pub fn figure_count(&self) -> usize {
        [
            self.used_bytes,
            self.limit_bytes,
            self.exceeded_bytes,
            self.requested_bytes,
            self.free_bytes,
            self.tensorcore_bytes,
            self.sparsecore_bytes,
            self.reserved_bytes,
            self.program_bytes,
            self.arguments_bytes,
            self.output_bytes,
            self.hlo_temp_bytes,
        ]
        .iter()
        .filter(|f| f.is_some())
        .count()
            + self.allocations.len()
    }
}

/// A kind of non-fatal memory message: counted and summarised, never stored one by one
/// (extension field `warnings[].kind` of `explain --format json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum WarningKind {
    /// `Can't reduce memory use below X by rematerialization; only reduced to Y`: the compiler
    /// carries on; the last one before a failure is also attached to it (`remat`).
    RematWarning,
    /// TensorFlow's BFC allocator: `ran out of memory trying to allocate X ... The caller indicates
    /// that this is not a failure`.
    BfcNotAFailure,
    /// `cuda_driver`'s `failed to allocate X (N bytes) from device: CUDA_ERROR_OUT_OF_MEMORY`: the
    /// allocator retries with less.
    AllocatorRetry,
    /// An out-of-memory error logged and survived (`--xla_tpu_no_crash_on_oom`: `Suppressing`).
    SuppressedOom,
}

impl WarningKind {
    /// Every kind, in the order summaries are listed.
    pub const ALL: [WarningKind; 4] = [
        WarningKind::RematWarning,
        WarningKind::BfcNotAFailure,
        WarningKind::AllocatorRetry,
        WarningKind::SuppressedOom,
    ];

    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            WarningKind::RematWarning => "remat_warning",
            WarningKind::BfcNotAFailure => "bfc_not_a_failure",
            WarningKind::AllocatorRetry => "allocator_retry",
            WarningKind::SuppressedOom => "suppressed_oom",
        }
    }
}

/// The figures of one warning. Remat warnings state `used_bytes` (only reduced to),
/// `limit_bytes` (the target), `exceeded_bytes` (the shortfall) and `remat`; allocator warnings
/// state `requested_bytes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct WarningFigures {
    /// 1-based line of the warning.
    pub line: u64,
    /// What the program needs (remat: the peak reached).
    pub used_bytes: Option<u64>,
    /// What was available (remat: the target).
    pub limit_bytes: Option<u64>,
    /// `used - limit` (remat: how far the pass fell short).
    pub exceeded_bytes: Option<u64>,
    /// The allocation that was refused.
    pub requested_bytes: Option<u64>,
    /// Rematerialization figures, for remat warnings.
    pub remat: Option<Remat>,
}

impl WarningFigures {
    /// The figures of a remat warning.
    pub fn of_remat(line: u64, remat: &Remat) -> WarningFigures {
        WarningFigures {
            line,
            used_bytes: Some(remat.reduced_to_bytes),
            limit_bytes: Some(remat.target_bytes),
            exceeded_bytes: Some(remat.reduced_to_bytes.saturating_sub(remat.target_bytes)),
            requested_bytes: None,
            remat: Some(remat.clone()),
        }
    }

    /// How bad it is: the shortfall, else the request. The worst of a kind is the largest.
    pub fn severity(&self) -> u64 {
        self.exceeded_bytes.or(self.requested_bytes).unwrap_or(0)
    }
}

/// Every warning of one kind in a log, summarised (extension: top-level `warnings` of
/// `explain --format json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarningSummary {
    /// Which warning.
    pub kind: WarningKind,
    /// How many were printed.
    pub count: u64,
    /// 1-based line of the first.
    pub first_line: u64,
    /// 1-based line of the last.
    pub last_line: u64,
    /// The figures of the worst (largest shortfall or request; the first of equals).
    pub worst: WarningFigures,
}

/// Counts warnings per kind as they stream by, in constant memory.
#[derive(Debug, Clone, Default)]
pub struct WarningTally {
    kinds: [Option<WarningSummary>; 4],
}

impl WarningTally {
    /// Counts one warning.
    pub fn add(&mut self, kind: WarningKind, figures: WarningFigures) {
        let slot = &mut self.kinds[kind as usize];
        match slot {
            None => {
                *slot = Some(WarningSummary {
                    kind,
                    count: 1,
                    first_line: figures.line,
                    last_line: figures.line,
                    worst: figures,
                })
            }
            Some(s) => {
                s.count += 1;
                s.first_line = s.first_line.min(figures.line);
                s.last_line = s.last_line.max(figures.line);
                if figures.severity() > s.worst.severity() {
                    s.worst = figures;
                }
            }
        }
    }

    /// Counts one remat warning without building its figures unless it is the worst so far.
    pub fn add_remat(&mut self, line: u64, remat: &Remat) {
        if let Some(s) = &mut self.kinds[WarningKind::RematWarning as usize] {
            s.count += 1;
            s.first_line = s.first_line.min(line);
            s.last_line = s.last_line.max(line);
            if remat.reduced_to_bytes.saturating_sub(remat.target_bytes) > s.worst.severity() {
                s.worst = WarningFigures::of_remat(line, remat);
            }
            return;
        }
        self.add(
            WarningKind::RematWarning,
            WarningFigures::of_remat(line, remat),
        );
    }

    /// The summaries, one per kind seen, in [`WarningKind::ALL`] order.
    pub fn summaries(&self) -> Vec<WarningSummary> {
        self.kinds.iter().flatten().cloned().collect()
    }
}
