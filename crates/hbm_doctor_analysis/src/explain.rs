//! The rules of `explain`: pick the main event, classify it, rank causes, write actions.

use crate::chips;
use crate::model::{Category, Cause, CauseKind, Diagnosis, ExplainReport, Snippet, SCHEMA_VERSION};
use crate::rank::{self, Candidate, RankInput};
use hbm_doctor_hlo::Shape;
use hbm_doctor_log::{
    format_size, Allocation, Backend, Event, Family, Framework, MemorySpace, Phase, Stage,
    WarningKind, WarningSummary,
};

/// Builds the report for the events of one log.
pub fn explain(events: Vec<Event>) -> ExplainReport {
    explain_with_warnings(events, Vec::new())
}

/// Builds the report for the events of one log and its warnings summarised per kind.
pub fn explain_with_warnings(events: Vec<Event>, warnings: Vec<WarningSummary>) -> ExplainReport {
    let diagnosis = main_event(&events).map(|i| {
        // The device itself refused allocations before this failure (an allocator retrying
        // smaller: JAX's or TensorFlow's pool could not take its share of the GPU).
        let refused = warnings
            .iter()
            .find(|w| w.kind == WarningKind::AllocatorRetry && w.first_line <= events[i].line);
        diagnose(i, &events[i], refused)
    });
    ExplainReport {
        schema_version: SCHEMA_VERSION,
        events,
        diagnosis,
        warnings,
    }
}

/// The most important event: the last fatal one, else the last one. A compile-time HBM report
/// followed closely by a lower-level failure it caused (an LLO `Allocation (size=...) would
/// exceed memory`, a bare `RESOURCE_EXHAUSTED`) stays the main event: it names the root cause.
fn main_event(events: &[Event]) -> Option<usize> {
    let last = events
        .iter()
        .rposition(|e| e.fatal)
        .or_else(|| events.len().checked_sub(1))?;
    let derivative = matches!(
        events[last].family,
        Family::TpuAllocationExceeds | Family::Unrecognized
    ) && events[last].memory_space != Some(MemorySpace::Vmem);
    if derivative {
        let root = events[..last].iter().rposition(|e| {
            e.fatal
                && matches!(
                    e.family,
                    Family::TpuCompileHbm
                        | Family::TpuHloTemporaries
                        | Family::TpuTcSc
                        | Family::TpuAbortEarly
                )
                && events[last].line.saturating_sub(e.line) < 2_000
        });
        if let Some(root) = root {
            return Some(root);
        }
    }
    Some(last)
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "?%".into();
    }
    format!("{:.0}%", part as f64 * 100.0 / whole as f64)
}

fn fmt(b: u64) -> String {
    format_size(b)
}

/// Classifies an event following the guide's decision tree.
pub fn categorize(e: &Event) -> Category {
    if matches!(e.memory_space, Some(MemorySpace::Vmem | MemorySpace::Smem)) {
        return Category::Vmem;
    }
    if e.memory_space == Some(MemorySpace::Host) || e.family == Family::HostOom {
        return Category::HostMemory;
    }
    if e.tensorcore_bytes.is_some() || e.sparsecore_bytes.is_some() {
        return Category::TcScImbalance;
    }
    let limit = e.limit_bytes;
    let over_half = |a: &Allocation| limit.is_some_and(|l| a.size_bytes.saturating_mul(2) > l);
    if e.phase == Phase::Runtime {
        if let (Some(req), Some(free)) = (e.requested_bytes, e.free_bytes) {
            // PyTorch's "free" is the whole device's, and its message shows no contiguous
            // region: labelling.md keeps `runtime_fragmentation` for figures that show one
            // smaller than the request (the labelled PyTorch posts with free well above the
            // request: runtime_allocation 10 times in 10). Its caching allocator's split blocks
            // stay a cause (`fragmentation`).
            let spare = e.family != Family::PytorchCudaOom && free >= req;
            // (PyTorch's `N allowed;`: a per-process fraction caps the allocator below what is
            // free on the device: the cap ran out, not a free region.)
            if spare && !fraction_capped(e) {
                return Category::RuntimeFragmentation;
            }
        }
        // PyTorch's split cache is a cause (`fragmentation`), not the category: labelling.md keeps
        // `runtime_fragmentation` for free memory at least the request with no region for it.
        if let (Some(req), Some(largest)) = (e.requested_bytes, e.largest_free_bytes) {
            let free_total = e.free_bytes.or(e
                .limit_bytes
                .zip(e.used_bytes)
                .map(|(l, u)| l.saturating_sub(u)));
            if largest < req && free_total.is_some_and(|f| f >= req) {
                return Category::RuntimeFragmentation;
            }
        }
        // (A serving engine's pool sized by `gpu_memory_utilization` is not one allocation.)
        let pool = engine_pool(e);
        if e.allocations.iter().any(over_half)
            || (!pool
                && e.requested_bytes
                    .zip(limit)
                    .is_some_and(|(r, l)| r.saturating_mul(2) > l))
            || e.requested_bytes.is_some_and(|r| r > 256 << 30)
        {
            return Category::SingleLargeAllocation;
        }
        if e.arguments_bytes.zip(limit).is_some_and(|(a, l)| a >= l) {
            return Category::Arguments;
        }
        // A failure with no message the readers know says nothing of which memory ran out,
        // unless the text names the device's (a GPU, CUDA, VRAM): labelling.md makes every
        // run-time device OOM `runtime_allocation`.
        if e.family == Family::Unrecognized
            && e.requested_bytes.is_none()
            && e.memory_space != Some(MemorySpace::Device)
        {
            return Category::Unknown;
        }
        return Category::RuntimeAllocation;
    }
    if let (Some(args), Some(l)) = (e.arguments_bytes, limit) {
        let outputs = e
            .output_bytes
            .unwrap_or(0)
            .saturating_sub(e.output_aliased_bytes.unwrap_or(0));
        // Outputs reaching the limit with the arguments are the arguments' story only when no
        // single buffer (an output gathered whole, stacked logits) is itself half the device.
        if args >= l || (args.saturating_add(outputs) >= l && !e.allocations.iter().any(over_half))
        {
            return Category::Arguments;
        }
    }
    if e.allocations.iter().any(over_half) {
        return Category::SingleLargeAllocation;
    }
    // Many allocations adding up is what a listing shows; a headline alone (or a Total block
    // without its list) does not say what makes up the requirement.
    if e.used_bytes.is_some() && limit.is_some() && !e.allocations.is_empty() {
        return Category::Aggregate;
    }
    if e.family == Family::RematWarning {
        return Category::Aggregate;
    }
    Category::Unknown
}

struct Ctx<'a> {
    e: &'a Event,
    /// Allocations the device itself refused before the failure (allocator retries).
    refused: Option<&'a WarningSummary>,
    category: Category,
    limit: Option<u64>,
    used: Option<u64>,
    exceeded: Option<u64>,
    jax: bool,
    ptxla: bool,
    tf: bool,
}

impl Ctx<'_> {
    fn cause(
        &self,
        cause: CauseKind,
        savings: Option<u64>,
        evidence: String,
        actions: Vec<String>,
        snippets: Vec<Snippet>,
    ) -> Cause {
        let sufficient = match (savings, self.exceeded) {
            (Some(s), Some(x)) if x > 0 => Some(s >= x),
            _ => None,
        };
        let mut c = Cause::new(cause, savings, evidence, actions);
        c.snippets = snippets;
        c.sufficient = sufficient;
        c
    }

    fn snippets(&self, jax: &str, ptxla: &str) -> Vec<Snippet> {
        let mut out = Vec::new();
        if self.e.framework == Some(Framework::Pytorch) {
            return out; // neither JAX's nor PyTorch/XLA's code applies to plain PyTorch
        }
        if !jax.is_empty() && (self.jax || !self.ptxla) {
            out.push(Snippet {
                framework: "jax".into(),
                code: jax.into(),
            });
        }
        if !ptxla.is_empty() && (self.ptxla || !self.jax) && !self.tf {
            out.push(Snippet {
                framework: "pytorch_xla".into(),
                code: ptxla.into(),
            });
        }
        out
    }
}

fn diagnose(index: usize, e: &Event, refused: Option<&WarningSummary>) -> Diagnosis {
    let mut category = categorize(e);
    // A pool whose own accounting shows room (the largest free block under the request, the
    // rest "free") is not fragmented when the device refused the pool its memory: that free
    // memory was never the pool's.
    let device_refused = refused.is_some() && e.phase == Phase::Runtime;
    if device_refused
        && category == Category::RuntimeFragmentation
        && e.family != Family::PytorchCudaOom
        && e.free_bytes.is_none()
    {
        category = Category::RuntimeAllocation;
    }
    let ctx = Ctx {
        e,
        category,
        // Unstated, a TPU's limit is what one device of the generation the text names offers
        // (`v2-8`: 7.48G usable per device).
        limit: e.limit_bytes.or_else(|| {
            (e.memory_space == Some(MemorySpace::Hbm))
                .then_some(e.accelerator.as_deref())
                .flatten()
                .and_then(chips::tpu_by_name)
                .map(|t| t.usable_bytes)
        }),
        // A report pasted without its headline still states the program's requirement, or at
        // least lists its buffers.
        used: e.used_bytes.or(e.program_bytes).or_else(|| {
            let listed: u64 = e.allocations.iter().map(|a| a.size_bytes).sum();
            (e.partial && listed > 0).then_some(listed)
        }),
        exceeded: e.exceeded_bytes.or_else(|| {
            e.used_bytes
                .zip(e.limit_bytes)
                .and_then(|(u, l)| u.checked_sub(l))
        }),
        jax: e.framework == Some(Framework::Jax),
        ptxla: e.framework == Some(Framework::PytorchXla),
        tf: e.framework == Some(Framework::Tensorflow),
        refused,
    };
    let tpu = e.backend == Some(Backend::Tpu)
        || matches!(
            e.memory_space,
            Some(MemorySpace::Hbm | MemorySpace::Vmem | MemorySpace::Smem)
        );
    let (chip, physical) = match (tpu, e.limit_bytes, e.memory_space) {
        (true, Some(l), Some(MemorySpace::Hbm)) if e.phase == Phase::Compile => {
            let reserved = if e.family == Family::TpuCompileHbmOld {
                None
            } else {
                e.reserved_bytes
            };
            chips::infer_tpu(l, reserved).map_or((None, None), |(c, p)| (Some(c), Some(p)))
        }
        _ => (None, None),
    };
    // (score, rule that proposed it, cause): the rule's name is the re-ranker's evidence.
    let mut causes: Vec<(f64, String, Cause)> = Vec::new();
    let mut add = |score: f64, rule: String, cause: Option<Cause>| {
        if let Some(c) = cause {
            causes.push((score, rule, c));
        }
    };
    let cover = |c: &Option<Cause>| -> f64 {
        match (c.as_ref().and_then(|c| c.savings_bytes), ctx.exceeded) {
            (Some(s), Some(x)) if x > 0 => (s as f64 / x as f64).min(1.5),
            (Some(_), _) => 0.5,
            _ => 0.0,
        }
    };
    macro_rules! rank {
        ($prior:expr, $cause:expr) => {{
            let c = $cause;
            let prior: f64 = $prior;
            let s = prior + cover(&c);
            let call = stringify!($cause);
            let rule = call.split('(').next().unwrap_or(call).trim();
            add(s, format!("{rule}@{prior}"), c);
        }};
    }
    rank!(10.0, shape_bug(&ctx));
    rank!(10.5, dense_pairwise(&ctx));
    rank!(3.5, implausible_dimension(&ctx));
    rank!(1.7, vocabulary_logits(&ctx));
    rank!(2.2, loss_over_vocabulary(&ctx));
    rank!(2.1, shaped_intermediate(&ctx));
    rank!(2.8, unsharded_init_random_bits(&ctx));
    match category {
        Category::Vmem => rank!(5.0, kernel_tiling(&ctx)),
        Category::HostMemory => {
            rank!(5.0, host_oom(&ctx));
            rank!(2.7, host_growth(&ctx));
            // A tensor of the computation itself, placed on the CPU (TensorFlow's `allocator
            // cpu`): the host is the device, and the step's batch is what fills it.
            if e.family == Family::TfOomTensor {
                rank!(5.5, runtime_step_batch(&ctx));
            }
            rank!(6.0, jit_code_memory(&ctx));
        }
        Category::TcScImbalance => {
            rank!(4.0, sparsecore(&ctx));
            rank!(1.0, sparsecore_padding(&ctx));
        }
        Category::RuntimeFragmentation => {
            rank!(5.0, fragmentation(&ctx));
            rank!(6.0, allocation_cap(&ctx));
        }
        Category::Arguments => {
            rank!(4.0, arguments_exceed(&ctx));
            rank!(1.5, arguments_left_whole(&ctx));
        }
        _ => {}
    }
    if !matches!(category, Category::Vmem | Category::HostMemory) {
        // Attention scores or logits recognised by their shape are the story.
        let shaped = e
            .allocations
            .iter()
            .take(3)
            .any(|a| shape_of(a).and_then(|s| activation_kind(&s)).is_some());
        rank!(2.0, gathered_whole(&ctx));
        rank!(1.4, gathered_from_held(&ctx));
        rank!(2.6, held_whole_beside_shard(&ctx));
        // Arguments most of a TPU's limit at compile time (60% or more): the large temporaries
        // beside them are that state's gradients and updates more often than activations
        // (shaped like attention scores or logits, they are still activations).
        let weight = match (shaped, tpu_state_heavy(&ctx)) {
            (true, _) => 1.8,
            (false, false) => 1.2,
            (false, true) => 0.6,
        };
        rank!(weight, large_activation(&ctx));
        let pad = padding(&ctx);
        let extreme = pad
            .as_ref()
            .and_then(|c| c.savings_bytes)
            .zip(ctx.used)
            .is_some_and(|(w, u)| w.saturating_mul(3) > u);
        rank!(if extreme { 1.8 } else { 0.9 }, pad);
        // Arguments that are most of the limit are the program's state: a smaller batch cannot
        // free what parameters and optimizer moments hold.
        let args_heavy = e
            .arguments_bytes
            .zip(ctx.limit)
            .is_some_and(|(a, l)| a.saturating_mul(2) >= l);
        rank!(1.0, batch_too_large(&ctx));
        for (prior, c) in headline_hypotheses(&ctx) {
            add(prior, format!("headline_hypothesis@{prior}"), Some(c));
        }
        rank!(1.1, no_donation(&ctx));
        // Arguments that fit the device, none of them aliased by the outputs, whose copies
        // alone would close the overshoot: donating them is the cheap fix, before more chips.
        let donation_closes = e
            .arguments_bytes
            .zip(ctx.limit)
            .zip(ctx.used)
            .is_some_and(|((a, l), u)| {
                a < l && e.output_aliased_bytes == Some(0) && a >= u.saturating_sub(l)
            })
            // Where the report prints its allocation tables (each entry parameter, each output
            // not aliased), an array held twice shows the output copy donation would remove.
            && (e.held.is_empty()
                || e.held.iter().enumerate().any(|(i, (b, s))| {
                    ctx.limit.is_some_and(|l| b.saturating_mul(10) >= l)
                        && e.held[i + 1..].iter().any(|(_, t)| t == s)
                }));
        rank!(
            if donation_closes && args_heavy {
                2.1
            } else {
                1.2
            },
            undonated_arguments(&ctx)
        );
        rank!(2.0, integer_state_copied(&ctx));
        rank!(0.5, f32_precision(&ctx));
        // (Below a gathered copy's 2.0 plus a cover it reaches: an argument converted whole that
        // cannot close the overshoot by itself is no lead over a copy whose removal does.)
        rank!(2.3, converted_copy(&ctx));
        // Forward activations that make up most of the listing are the story.
        let listed: u64 = e.allocations.iter().map(|a| a.size_bytes).sum();
        let forward: u64 = e
            .allocations
            .iter()
            .filter(|a| is_forward_activation(a))
            .map(|a| a.size_bytes)
            .sum();
        let mostly_forward = listed > 0 && forward.saturating_mul(2) >= listed;
        // A scan's stacked outputs filling most of the report are the same story.
        let stacked: u64 = e
            .allocations
            .iter()
            .filter(|a| loop_stacked(a))
            .map(|a| a.size_bytes)
            .sum();
        let mostly_stacked = ctx.used.is_some_and(|u| stacked.saturating_mul(2) >= u);
        rank!(
            if mostly_forward || mostly_stacked {
                1.7
            } else {
                0.6
            },
            no_remat(&ctx)
        );
        rank!(
            if category == Category::SingleLargeAllocation {
                1.5
            } else {
                0.3
            },
            replicated_tensor(&ctx)
        );
        rank!(1.6, debug_print(&ctx));
        rank!(if args_heavy { 2.4 } else { 1.0 }, optimizer_state(&ctx));
        // Most of the device held outside this process: nothing in its own step is the story.
        let outside = other_process(&ctx);
        let most = outside
            .as_ref()
            .and_then(|c| c.savings_bytes)
            .zip(e.limit_bytes)
            .is_some_and(|(h, l)| h.saturating_mul(2) >= l);
        // Freeing everything held outside cannot help a request larger than that plus what is
        // free: the request itself is the story then.
        let futile = outside
            .as_ref()
            .and_then(|c| c.savings_bytes)
            .zip(e.requested_bytes)
            .is_some_and(|(h, r)| r > h.saturating_add(e.free_bytes.unwrap_or(0)));
        rank!(
            if futile {
                0.8
            } else if most {
                3.0
            } else {
                // Under half the device: the process's own memory outside the allocator (the
                // CUDA context, cuDNN and cuBLAS workspaces, NCCL's buffers, a second library's
                // pool) reaches this much often enough that it is no sign of another holder on
                // its own; on the labelled posts such a share was another process in 2 of 24.
                0.3
            },
            outside
        );
        rank!(2.9, holder_in_text(&ctx));
        rank!(2.7, device_refused_pool(&ctx));
        rank!(1.3, preallocation(&ctx));
        rank!(2.4, tensorrt_workspace(&ctx));
        rank!(0.5, jax_gpu_pool(&ctx));
        // A limit no device has is decisive: nothing else is worth doing before lifting it.
        rank!(2.6, hbm_cap(&ctx));
        // PyTorch's `N allowed;` with the device's free memory covering the request: the
        // fraction, not the device, refused it.
        let fraction_refused = fraction_capped(e)
            && e.free_bytes
                .zip(e.requested_bytes)
                .is_some_and(|(f, r)| f >= r);
        rank!(
            if fraction_refused {
                3.0
            } else if e.phase == Phase::Runtime {
                2.3
            } else {
                1.2
            },
            pool_named(&ctx)
        );
        // Growth needs evidence: a failure after many good steps. Growth the user saw (memory
        // said to grow) is shown directly, a spike at evaluation only from the stage: growth
        // leads then (labelled posts at evaluation with growth said: a leak 3 of 3).
        rank!(
            if e.growth_said.is_some() { 2.7 } else { 2.5 },
            runtime_growth(&ctx)
        );
        // One request of half the device or more is its own story (an activation computed
        // whole), whatever else the evaluation or the checkpoint loaded beside it.
        rank!(
            if category == Category::SingleLargeAllocation {
                1.5
            } else {
                2.6
            },
            runtime_spike(&ctx)
        );
        rank!(3.0, model_state_at_load(&ctx));
        if let Some((c, over)) = model_weights(&ctx) {
            let prior = if over { 3.2 } else { 2.4 };
            add(prior, format!("model_weights@{prior}"), Some(c));
        }
        rank!(1.8, generation_memory(&ctx));
        rank!(1.5, runtime_step_batch(&ctx));
        rank!(2.2, one_sample_tensor(&ctx));
        rank!(3.0, numpy_input_tensor(&ctx));
        // The cache's own figures show it, yet the threads' answers rank it behind the batch, the
        // input size or the card (4 of 5 labelled posts with a split cache): a candidate, not
        // the lead.
        rank!(
            if e.stage == Some(Stage::Eval) {
                0.1
            } else {
                0.3
            },
            torch_cache_fragmentation(&ctx)
        );
        // Measured against a card the text only names, the share is less sure (a preallocated
        // pool is less than the card): a candidate behind what the message itself shows.
        let named_only = ctx.limit.is_none() && e.device_named_bytes.is_some();
        rank!(
            if named_only { 1.2 } else { 2.0 },
            intermediate_beyond_device(&ctx)
        );
        // A card of 2.5 GiB or less fits few current models at all; one of up to 4.5 GiB (a
        // laptop's) is a candidate next to the batch: in the labelled posts on such cards, the
        // threads' answers were the card 4 times, the batch 5 times.
        // On a card of up to 4.5 GiB, a request under 1% of it failing says the card was already
        // full of what the program holds before the step (the labelled posts of that kind: the
        // card 7 times, the batch 4).
        let tiny_card = e.limit_bytes.is_some_and(|l| {
            l <= 5 << 29
                || l <= 9 << 29 && e.requested_bytes.is_some_and(|r| r.saturating_mul(100) < l)
        });
        rank!(if tiny_card { 2.6 } else { 0.85 }, small_gpu(&ctx));
        rank!(2.8, sliver_pool(&ctx));
        if category != Category::RuntimeFragmentation {
            rank!(6.0, allocation_cap(&ctx));
        }
        for (prior, c) in held_beyond_card(&ctx) {
            add(prior, format!("held_beyond_card@{prior}"), Some(c));
        }
        for (prior, c) in apple_unified_memory(&ctx) {
            add(prior, format!("apple_unified_memory@{prior}"), Some(c));
        }
        if let Some((c, small)) = gpu_held_at_model_creation(&ctx) {
            let prior = if small { 3.3 } else { 3.1 };
            add(
                prior,
                format!("gpu_held_at_model_creation@{prior}"),
                Some(c),
            );
        }
        rank!(2.5, cuda_init_starved(&ctx));
        rank!(2.4, cuda_init_other_process(&ctx));
        rank!(2.1, other_allocator_in_process(&ctx));
        for (prior, c) in vllm_kv_cache(&ctx) {
            add(prior, format!("vllm_kv_cache@{prior}"), Some(c));
        }
        // The CUDA runtime's own `out of memory` (not a framework allocator's message with its
        // figures): a context, a library's workspace or a launch found the device already full
        // outside the framework's pool. With nothing else shown, what holds it comes before the
        // step's batch (the labelled posts of this family: another process 10, a preallocated
        // pool 9, growth 8, the card 4, the batch 2).
        // (A wrapper may print the request alone: `failed to cudaMalloc 47064032 bytes`; a small
        // one says the device was already full, a large one is its own story.)
        let runtime_own = e.figure_count() == usize::from(e.requested_bytes.is_some())
            && e.requested_bytes.is_none_or(|r| r < 1 << 30);
        let cuda_runtime_own =
            e.family == Family::CudaOom && e.phase == Phase::Runtime && runtime_own && !e.told;

        let cuda_runtime_error = || {
            cuda_runtime_own.then(|| ctx.cause(
                CauseKind::OtherProcess,
                None,
                "the CUDA runtime itself ran out (`out of memory` from a CUDA call, not the framework allocator's message with its figures): memory outside the framework's pool could not be had, which happens when the device was already full; another process, a second framework's preallocated pool, or memory kept from earlier steps".into(),
                vec![LIST_DEVICE_HOLDERS.into()],
                Vec::new(),
            ))
        };
        rank!(0.95, cuda_runtime_error());
        for c in full_device(&ctx) {
            // (After the CUDA runtime's own error the card comes before the input's size: the
            // labelled posts of that family name the card 4 times, the input once.)
            let prior = match c.cause {
                CauseKind::BatchTooLarge => 0.9,
                CauseKind::LargeActivation if e.family == Family::CudaOom && !e.told => 0.3,
                CauseKind::LargeActivation => 0.4,
                _ => 0.35,
            };
            add(prior, format!("full_device@{prior}"), Some(c));
        }
        rank!(1.2, state_heavy_program(&ctx));
        if category != Category::Arguments {
            // Arguments that fit one device do not "exceed the topology" (the contract's
            // words): under the limit, the state they hold is what to check first (left whole
            // on every chip, at compile time on TPU), more chips second.
            let args_over = e
                .arguments_bytes
                .zip(ctx.limit)
                .is_some_and(|(a, l)| a >= l);
            let weight = match (args_heavy, args_over) {
                (true, true) => 2.0,
                (true, false) => 0.9,
                _ => 0.2,
            };
            rank!(weight, arguments_exceed(&ctx));
            rank!(2.2, arguments_left_whole(&ctx));
        }
        // Far past the device (2.5x or more): a batch tweak rarely closes that; the program
        // needs more memory.
        let far_over = ctx
            .used
            .zip(ctx.limit)
            .is_some_and(|(u, l)| u.saturating_mul(2) >= l.saturating_mul(5));
        // Unless the listing shows the arguments a small share of the device (under a fifth):
        // then the overshoot is the program's temporaries, and the program, not the chip, is
        // what the fix changes (in the compiled cases: remat, a shape, an activation).
        // libtpu's one-line `the total memory required for HLO temporaries (X) exceeds
        // available HBM (Y)` is ranked the same way, though its X is the whole requirement
        // (the listing's `Used`, arguments included, in all 289 compiled pairs): a measured
        // prior (a program fails to compile far more often than it needs a bigger chip),
        // not a reading of the message.
        let temporaries_over = e
            .arguments_bytes
            .zip(ctx.limit)
            .is_some_and(|(a, l)| a.saturating_mul(5) < l)
            || e.family == Family::TpuHloTemporaries;
        // (Known by its headline alone, far over or not, the chip comes after the hypotheses
        // of what the program holds: `headline_hypotheses`.)
        let headline_only = states_total_only(e);
        let prior = match (far_over, temporaries_over) {
            (true, false) => 1.9,
            (true, true) if !headline_only => 0.6,
            _ => 0.05,
        };
        rank!(prior, device_too_small(&ctx));
    }
    // The user already made the batch smaller and it still failed: the batch is not the knob.
    if let Some(said) = e.batch_tried.as_deref() {
        if e.phase == Phase::Runtime || !e.allocations.is_empty() || e.used_bytes.is_some() {
            for (score, _, c) in causes.iter_mut() {
                if c.cause == CauseKind::BatchTooLarge {
                    *score -= 2.0;
                }
            }
            // The threads' answers where a smaller batch had been tried (16 labelled posts): the
            // card 6, the batch after all 4 (a still smaller one), the input's size 4, the model
            // state 2.
            const DEVICE: f64 = 2.0;
            const STATE: f64 = 1.9;
            const INPUT: f64 = 1.7;
            causes.push((STATE, "batch_tried".into(), ctx.cause(
                CauseKind::ArgumentsExceed,
                None,
                format!("a smaller batch was already tried and it still fails (\"{said}\"): what fills the device does not scale with the batch: the model's parameters, optimizer state or gradients, or something else holding the device"),
                vec![
                    "Measure the model state: parameter count x bytes per parameter (x3 to x4 with Adam in f32); if it is near the device's memory, shard it (FSDP / ZeRO), keep weights in bf16, or offload the optimizer state.".into(),
                    "Check that no other process or earlier run holds the device (nvidia-smi / tpu-info), and that nothing keeps per-step outputs alive.".into(),
                ],
                Vec::new(),
            )));
            // JAX on a GPU takes 75% of the device up front: a fixed-size limit too.
            // XLA's own GPU client (`Failed to allocate request for X on device ordinal N`) is
            // JAX's in practice, with JAX's pool.
            let xla_gpu_pool = ctx.jax || e.family == Family::GpuFailedRequest;
            if xla_gpu_pool && e.backend == Some(Backend::Gpu) && e.phase == Phase::Runtime {
                // With no model size in the text, the fixed pool is the likelier wall than a
                // model state nobody measured.
                let prior = if e.model_params.is_none() { 2.05 } else { 1.8 };
                causes.push((prior, format!("batch_tried_pool@{prior}"), ctx.cause(
                    CauseKind::Preallocation,
                    None,
                    "JAX preallocates a fixed share of the GPU (75% by default) whatever the batch: a program that needs more than that share fails at any batch size".into(),
                    vec![
                        "Raise the share (XLA_PYTHON_CLIENT_MEM_FRACTION=.9) or allocate on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false; XLA_PYTHON_CLIENT_ALLOCATOR=platform to debug), and check that no other process holds the rest.".into(),
                    ],
                    Vec::new(),
                )));
            }
            // Even a tiny allocation fails, whatever the batch: the device was full before the
            // step; with no model size stated, something else holding it comes first.
            let tiny = e.requested_bytes.is_some_and(|r| r < 1 << 20);
            if tiny && e.phase == Phase::Runtime && e.model_params.is_none() {
                causes.push((2.1, "batch_tried_tiny@2.1".into(), ctx.cause(
                    CauseKind::OtherProcess,
                    None,
                    format!("only {} failed, and a smaller batch did not help: the device was already full before this step, so check what else holds it first", fmt(e.requested_bytes.unwrap_or(0))),
                    vec![LIST_DEVICE_HOLDERS.into()],
                    Vec::new(),
                )));
            }
            causes.push((DEVICE, "batch_tried_card".into(), ctx.cause(
                CauseKind::DeviceTooSmall,
                None,
                "if the model state alone is close to the device's memory, no batch size fits: the program needs more devices or a device with more memory".into(),
                vec!["Spread parameters and optimizer state over more devices (FSDP / model parallelism), or use a generation with more memory per device.".into()],
                Vec::new(),
            )));
            // The other thing a smaller batch does not shrink: one input's own size (a long
            // audio clip or document, a full-resolution image) fills the device at any batch.
            causes.push((INPUT, "batch_tried_input".into(), ctx.cause(
                CauseKind::LargeActivation,
                None,
                "or one input's own size: a long sequence or a large image needs its activations whole at a batch of 1 too".into(),
                vec!["Cap the input's size (max_length / max_duration, crop or tile large images), or process long inputs in chunks.".into()],
                Vec::new(),
            )));
        }
    }
    // A program that works one input at a time has no batch to cut (the batch advice moves down
    // where the listing shows none). A protein structure predictor folds one complex: the card or
    // the input's length is the story (the labelled posts naming one: the card 11, the input's
    // length 4, a JAX pool 4, the batch 2, both where several samples were drawn per input). An
    // image upscaler or restorer works one image: its size is the story, tiling the fix (the
    // labelled posts naming one: the image's size 7, the card 2, the host 1).
    // A diffusion model's VAE decoding the latents: the whole image or video at full resolution
    // at once (the labelled posts showing it: the decoder's activations 4, a fragmented cache 1).
    let one_input =
        (e.structure_predictor.is_some() || e.image_upscaler.is_some() || e.vae_decode.is_some())
            && e.phase == Phase::Runtime
            && !matches!(category, Category::Vmem | Category::HostMemory)
            && common_batch(&e.allocations).is_none();
    if one_input {
        for (score, _, c) in causes.iter_mut() {
            if c.cause == CauseKind::BatchTooLarge {
                *score -= 1.5;
            }
        }
        let (rule, found) = if e.structure_predictor.is_some() {
            ("structure_prediction", structure_prediction(&ctx))
        } else if e.image_upscaler.is_none() {
            (
                "vae_decoding",
                vae_decoding(&ctx).map(|c| (2.2, c)).into_iter().collect(),
            )
        } else {
            (
                "image_upscaling",
                image_upscaling(&ctx)
                    .map(|c| (2.2, c))
                    .into_iter()
                    .collect(),
            )
        };
        for (prior, c) in found {
            let score = prior + cover(&Some(c.clone()));
            causes.push((score, format!("{rule}@{prior}"), c));
        }
    }
    // Where nothing but the CUDA runtime's own error is shown (no rule but that one and the
    // full device's), the card leads: in the 31 labelled posts of that kind the threads answered
    // the card 12 times, another holder 6, the batch 6.
    let cuda_runtime_rule = "cuda_runtime_error@0.95";
    if causes.iter().any(|(_, rule, _)| rule == cuda_runtime_rule)
        && causes
            .iter()
            .all(|(_, rule, _)| rule.starts_with("full_device@") || rule == cuda_runtime_rule)
    {
        for (score, _, c) in causes.iter_mut() {
            if c.cause == CauseKind::DeviceTooSmall {
                *score = score.max(1.0);
            }
        }
    }
    causes.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.2.cause.cmp(&b.2.cause)));
    // One entry per cause (its best-scored evidence), with every rule that proposed it.
    let mut input = RankInput {
        features: rank::features(e, category, ctx.limit),
        candidates: Vec::new(),
    };
    let mut kept: Vec<Cause> = Vec::new();
    for (score, rule, c) in causes {
        match input.candidates.iter_mut().find(|k| k.cause == c.cause) {
            Some(k) => k.rules.push(rule),
            None => {
                input.candidates.push(Candidate {
                    cause: c.cause,
                    hand: score,
                    rules: vec![rule],
                });
                kept.push(c);
            }
        }
    }
    let causes = rank::rerank(rank::shipped(), &input, kept);
    let fits_on = match (e.memory_space, e.used_bytes, e.phase) {
        (Some(MemorySpace::Hbm), Some(u), Phase::Compile) if tpu => chips::tpus_that_fit(u),
        _ => Vec::new(),
    };
    let missing = missing_evidence(&ctx, &causes);
    Diagnosis {
        event: index,
        category,
        summary: summary(&ctx, chip.as_deref()),
        causes,
        chip,
        physical_bytes: physical,
        fits_on,
        dump_module: None,
        ledger: crate::ledger::of_event(e),
        missing,
        rank_input: Some(input),
    }
}

/// What the diagnosis could not see, and the cheapest way to get it.
fn missing_evidence(ctx: &Ctx<'_>, causes: &[Cause]) -> Vec<String> {
    let e = ctx.e;
    let mut out = Vec::new();
    // A failure told in words: the message itself is the cheapest and strongest evidence.
    if e.told && e.figure_count() == 0 {
        out.push("the error itself: the failure is only told in words; paste the exception with the lines printed around it (PyTorch's `Tried to allocate X (GPU 0; Y total capacity; ...)`, XLA's `Used X of Y hbm` and its allocation listing, TensorFlow's `OOM when allocating tensor with shape[...]`): its figures decide between the batch, the model and another process".into());
    }
    if e.phase == Phase::Runtime && e.stage.is_none() && e.step.is_none() && e.near.is_none() {
        out.push("what the program was doing: paste the whole traceback (init, checkpoint restore, a training step, eval or generation decide the cause), and the step it failed at".into());
    }
    if e.phase == Phase::Runtime
        && e.step.is_none()
        && !causes.iter().any(|c| {
            matches!(
                c.cause,
                CauseKind::MemoryLeak | CauseKind::MemorySpike | CauseKind::Recompilation
            )
        })
    {
        let torch_cuda = e.family == Family::PytorchCudaOom
            || (e.framework == Some(Framework::Pytorch) && e.backend == Some(Backend::Gpu));
        out.push(if torch_cuda {
            "whether memory grows over steps: log torch.cuda.memory_allocated() and torch.cuda.max_memory_allocated() each step (torch.cuda.memory._record_memory_history() for what holds it), or run hbm-doctor record, then hbm-doctor trend".into()
        } else {
            "whether memory grows over steps: log jax.devices()[0].memory_stats()['bytes_in_use'] (PyTorch/XLA: xm.get_memory_info()) each step, or run hbm-doctor record, then hbm-doctor trend".into()
        });
    }
    if e.phase == Phase::Compile
        && e.allocations.is_empty()
        && e.memory_space == Some(MemorySpace::Hbm)
    {
        out.push("which buffers make up the requirement: rerun with XLA_FLAGS=--xla_dump_to=DIR and pass --dump DIR (or paste the whole log, with its 'Largest program allocations' listing)".into());
    }
    if causes.is_empty() {
        out.push("no cause is shown by the text: a dump (XLA_FLAGS=--xla_dump_to=DIR, then hbm-doctor analyze DIR) shows what is live at the peak".into());
    }
    out
}

fn summary(ctx: &Ctx<'_>, chip: Option<&str>) -> String {
    let e = ctx.e;
    let space = match e.memory_space {
        Some(MemorySpace::Hbm) => "HBM",
        Some(MemorySpace::Vmem) if e.family == Family::GpuSharedMemory => "GPU shared memory",
        Some(MemorySpace::Vmem) => "VMEM",
        Some(MemorySpace::Smem) => "SMEM",
        Some(MemorySpace::Host) => "host memory",
        Some(MemorySpace::Device) => "device memory",
        None => "memory",
    };
    let when = match e.phase {
        Phase::Compile => "at compile time",
        Phase::Runtime => "at run time",
    };
    let on = chip.map(|c| format!(" on {c}")).unwrap_or_default();
    let figures = match (ctx.used, ctx.limit, e.requested_bytes, e.free_bytes) {
        _ if e.tensorcore_bytes.is_some() => format!(
            "TensorCore {} + SparseCore {} against {} available",
            fmt(e.tensorcore_bytes.unwrap_or(0)),
            fmt(e.sparsecore_bytes.unwrap_or(0)),
            ctx.limit.map_or("?".into(), fmt)
        ),
        (Some(u), Some(l), _, _) if u > l => format!(
            "needs {} but {} is available ({} over, {} of the limit)",
            fmt(u),
            fmt(l),
            fmt(u - l),
            pct(u, l)
        ),
        (_, _, Some(r), Some(f)) => format!("asked for {} with {} free", fmt(r), fmt(f)),
        (_, Some(l), Some(r), _) => format!("asked for {} with a limit of {}", fmt(r), fmt(l)),
        (_, _, Some(r), _) => format!("failed to allocate {}", fmt(r)),
        (Some(u), Some(l), _, _) => format!("used {} of {}", fmt(u), fmt(l)),
        _ => "the message states no figures".into(),
    };
    let what = match ctx.category {
        Category::TcScImbalance => "TensorCore/SparseCore HBM split over the limit",
        Category::SingleLargeAllocation => "one abnormally large allocation",
        Category::Aggregate => "many allocations add up past the limit",
        Category::Arguments => "the program's inputs/outputs alone do not fit",
        Category::Vmem => "a kernel's on-chip scoped memory is too small for its blocks",
        Category::RuntimeAllocation => "a runtime allocation failed",
        Category::RuntimeFragmentation => "enough memory is free but not in one piece",
        Category::HostMemory => "host RAM, not the accelerator, ran out",
        Category::Unknown => "the message does not say enough to classify it",
    };
    format!(
        "Out of {space} {when}{on}: {figures}. {}.",
        capitalize(what)
    )
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

fn describe(a: &Allocation) -> String {
    let mut s = fmt(a.size_bytes);
    if let Some(shape) = &a.shape {
        s.push(' ');
        s.push_str(&Shape::parse(shape).map_or_else(|| shape.clone(), |sh| sh.without_layout()));
    }
    let mut from = Vec::new();
    if let Some(l) = &a.label {
        if l.len() < 60 {
            from.push(l.clone());
        }
    }
    if let Some(src) = &a.source {
        from.push(short_source(src));
    } else if let Some(op) = &a.op_name {
        from.push(short_op(op));
    }
    if !from.is_empty() {
        s.push_str(&format!(" ({})", from.join(", ")));
    }
    s
}

/// `/home/u/proj/train.py:123` -> `train.py:123`.
pub fn short_source(src: &str) -> String {
    src.rsplit('/').next().unwrap_or(src).to_string()
}

/// The last two components of an op path.
pub fn short_op(op: &str) -> String {
    let parts: Vec<&str> = op.split('/').collect();
    let n = parts.len();
    if n <= 2 {
        return op.to_string();
    }
    format!(".../{}/{}", parts[n - 2], parts[n - 1])
}

fn shape_of(a: &Allocation) -> Option<Shape> {
    let text = a.shape.as_deref()?;
    // An old TensorFlow tensor's shape printed without its type (`[1664,279617]`): float32,
    // as its listed size assumes.
    if text.starts_with('[') {
        return Shape::parse(&format!("f32{text}"));
    }
    Shape::parse(text)
}

/// The most memory one accelerator has (NVIDIA B300: 288 GB; AMD MI325X: 256 GiB).
const LARGEST_DEVICE: u64 = 288_000_000_000;

/// One run-time request of a sixth of the device or more (but not so far beyond it that a
/// shape must be wrong): an intermediate such as an N x N distance matrix, a [B, S, V] logits tensor
/// or an attention score tensor, computed whole where it has to be computed in blocks. No batch
/// tweak of a few percent closes it, and the rest of the program is not what fills the device.
/// A serving engine's pool sized by `gpu_memory_utilization` (vLLM's, either spelling) is named
/// around the failure.
fn engine_pool(e: &Event) -> bool {
    e.pool_setting
        .as_deref()
        .is_some_and(|p| p.contains("memory_utilization") || p.contains("memory-utilization"))
}

/// PyTorch's own message stated a per-process fraction's cap (`N allowed;`, read as
/// `set_per_process_memory_fraction (N allowed)`).
fn fraction_capped(e: &Event) -> bool {
    e.pool_setting.as_deref().is_some_and(|s| {
        s.starts_with("set_per_process_memory_fraction (") && s.ends_with("allowed)")
    })
}

fn intermediate_beyond_device(ctx: &Ctx<'_>) -> Option<Cause> {
    const FLOOR: u64 = 512 << 20;
    let e = ctx.e;
    // A serving engine's KV cache (vLLM's, by its `gpu_memory_utilization`), or what a model's
    // init or restore allocates, is state sized by its config, not an intermediate.
    if e.phase != Phase::Runtime
        || e.memory_space == Some(MemorySpace::Host)
        || e.family == Family::VllmKvCache
        || matches!(e.stage, Some(Stage::Init | Stage::Restore))
        || engine_pool(e)
    {
        return None;
    }
    let r = e.requested_bytes?;
    // The card the text names (`my 4GB GPU`) when the message states no limit.
    let known = ctx.limit.or(e.device_named_bytes);
    let device = known.unwrap_or(LARGEST_DEVICE);
    // A sixth of the device or more in one request (512 MiB at least, up to 10x the device): a
    // step's working set is made of many buffers, and one this large is a single intermediate
    // (the labelled posts with such a request were answered "a smaller input / crop", "compute
    // it in pieces", 4 of 5; the fifth, an evaluation spike).
    // Without a limit, only a request beyond the largest accelerator tells.
    let share = if known.is_some() {
        r.saturating_mul(6) >= device
    } else {
        r > device
    };
    if r < FLOOR || !share || r >= device.saturating_mul(10) {
        return None;
    }
    if known.is_none() && r > LARGEST_DEVICE.saturating_mul(2) {
        return None;
    }
    let whose = if known.is_some() {
        if r > device {
            format!("more than the device's {}", fmt(device))
        } else {
            format!("{} of the device's {}", pct(r, device), fmt(device))
        }
    } else {
        "more than the memory of any accelerator".to_string()
    };
    Some(ctx.cause(
        CauseKind::LargeActivation,
        Some(r - r / 4),
        format!("one request of {} is {whose}: a single intermediate (a pairwise or N x N matrix, logits over a vocabulary, attention scores, a high-resolution image's activations) computed whole", fmt(r)),
        vec![
            "Find the operation at the failing line and compute it in blocks: loop over row chunks (or lax.map / jax.lax.scan over chunks; torch.split) and reduce each chunk before the next, so only one block is alive.".into(),
            "If the size is not what the model should need, check that operation's shapes: a broadcast (x[:, None] - x[None, :]) or a missing reshape multiplies a dimension.".into(),
        ],
        Vec::new(),
    ))
}

/// A square array over a whole collection (`Unable to allocate 214. GiB for an array with shape
/// (169343, 169343)`): a dense pairwise matrix (adjacency, distances, similarities) of every item
/// against every other, built by design rather than by a wrong shape; it must be kept sparse or
/// computed in blocks.
fn dense_pairwise(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let m = &e.message;
    let at = m.find("array with shape (")? + "array with shape (".len();
    let dims: Vec<u64> = m[at..]
        .split(')')
        .next()?
        .split(',')
        .map(|d| d.trim().parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    let [a, b] = dims[..] else {
        return None;
    };
    if a != b || a < 10_000 {
        return None;
    }
    Some(ctx.cause(
        CauseKind::LargeActivation,
        None,
        format!("a dense {a} x {b} array{}: every item against every other (an adjacency, distance or similarity matrix), quadratic in the collection's size", e.requested_bytes.map(|r| format!(" of {}", fmt(r))).unwrap_or_default()),
        vec![
            "Keep the matrix sparse (scipy.sparse / torch.sparse / an edge list) or compute it in blocks of rows, keeping only what each block needs (top-k neighbours, a reduction).".into(),
            "Or sample a subgraph / a subset of the items.".into(),
        ],
        Vec::new(),
    ))
}

/// A protein structure predictor named in the text (AlphaFold, ColabFold, RoseTTAFold, ESMFold,
/// Boltz...): one complex per run, whose pair representation and attention grow with the square
/// of its length. The card first (what the threads answer most), then the input's length.
fn structure_prediction(ctx: &Ctx<'_>) -> Vec<(f64, Cause)> {
    let e = ctx.e;
    let Some(name) = e.structure_predictor.as_deref() else {
        return Vec::new();
    };
    let card = match (ctx.limit, e.device_named_bytes) {
        (Some(l), _) | (None, Some(l)) => format!(" on a device of {}", fmt(l)),
        _ => String::new(),
    };
    let request = e
        .requested_bytes
        .map(|r| format!(" ({} requested at once)", fmt(r)))
        .unwrap_or_default();
    let generic = name == hbm_doctor_log::parse::GENERIC_STRUCTURE_PREDICTOR;
    let what = if generic {
        "the text folds a protein (its length in residues or amino acids, a structure to predict)"
            .to_string()
    } else {
        format!("the text names {name}, a protein structure predictor")
    };
    let name = if generic {
        "a structure predictor"
    } else {
        name
    };
    let jax = ctx.jax || matches!(name, "AlphaFold" | "ColabFold" | "AlphaPulldown");
    let mut device_actions = vec![format!(
        "Fold this complex on a device with more memory (an 80 GB card for complexes of a few thousand residues): the memory of {name} is set by the input, not by a batch."
    )];
    if jax {
        device_actions.push("Or let JAX spill to host memory, slower but it runs: TF_FORCE_UNIFIED_MEMORY=1 XLA_PYTHON_CLIENT_MEM_FRACTION=4.0 (and no other process on the GPU).".into());
    }
    device_actions.push(
        "Check the predictor's documented length limit for this card before cutting anything."
            .into(),
    );
    vec![
        (
            2.2,
            ctx.cause(
                CauseKind::DeviceTooSmall,
                None,
                format!("{what}: it folds one complex at a time, and the pair representation and attention of each layer grow with the square of the sequence length{request}{card}; there is no batch to cut"),
                device_actions,
                Vec::new(),
            ),
        ),
        (
            2.0,
            ctx.cause(
                CauseKind::LargeActivation,
                None,
                format!("the input's length: the activations of {name} are quadratic in the number of residues, so a longer complex (or a multimer of all chains together) needs far more memory"),
                vec![
                    "Fold a shorter input: crop to the interacting domains, or split a large multimer into sub-complexes.".into(),
                    "Or chunk the attention where the predictor offers it (ESMFold: model.set_chunk_size(64); OpenFold/FastFold: a chunk size in the config), trading speed for memory.".into(),
                ],
                Vec::new(),
            ),
        ),
    ]
}

/// One input's activations computed whole, where tiling it is the knob: the evidence sentence
/// (given what was requested at once, or nothing), the actions, and savings of three quarters of
/// the request (tiles of a quarter of the input cut each activation about fourfold).
fn tiled_activation(
    ctx: &Ctx<'_>,
    evidence: impl FnOnce(&str) -> String,
    actions: Vec<String>,
) -> Cause {
    let request = ctx
        .e
        .requested_bytes
        .map(|r| format!(" ({} requested at once)", fmt(r)))
        .unwrap_or_default();
    ctx.cause(
        CauseKind::LargeActivation,
        ctx.e.requested_bytes.map(|r| r / 4 * 3),
        evidence(&request),
        actions,
        Vec::new(),
    )
}

/// An image upscaler or restorer named in the text (Real-ESRGAN, SwinIR, GFPGAN, waifu2x...): one
/// image per call, whose activations grow with its pixels times the upscaling factor squared.
fn image_upscaling(ctx: &Ctx<'_>) -> Option<Cause> {
    let name = ctx.e.image_upscaler.as_deref()?;
    Some(tiled_activation(
        ctx,
        |request| format!("the text names {name}, which upscales or restores one image at a time: its activations grow with the image's pixels (and the output's, at the upscaling factor squared){request}; there is no batch to cut"),
        vec![
            "Process the image in tiles (Real-ESRGAN/GFPGAN: --tile 256 or 400 with --tile_pad 10; webui upscalers: a tile size), or downscale it first.".into(),
            "Run the model in half precision (--fp16 / --half where offered), and free other models from the GPU before upscaling.".into(),
        ],
    ))
}

/// A diffusion model's VAE decoding the latents when it failed (`vae.decode(`, `VAEDecode`,
/// `decoding latents`): the whole image or video at full resolution at once.
fn vae_decoding(ctx: &Ctx<'_>) -> Option<Cause> {
    let said = ctx.e.vae_decode.as_deref()?;
    Some(tiled_activation(
        ctx,
        |request| format!("the failure came while the VAE decoded the latents to pixels (`{said}`): the decoder's activations hold the whole image or video at full resolution at once{request}"),
        vec![
            "Decode in tiles or slices: diffusers pipe.enable_vae_tiling() / pipe.vae.enable_tiling() and enable_vae_slicing(); ComfyUI's VAE Decode (Tiled); a smaller tile or frame chunk if it still fails.".into(),
            "Or lower the resolution or the number of frames, and offload the denoiser before decoding (enable_model_cpu_offload).".into(),
        ],
    ))
}

fn shape_bug(ctx: &Ctx<'_>) -> Option<Cause> {
    if ctx.category == Category::Vmem {
        return None;
    }
    // Without a limit, only a request far beyond the largest accelerator (twice its memory) is a
    // shape bug; one just beyond it is an intermediate to compute in pieces
    // (`intermediate_beyond_device`).
    let l = match ctx.limit {
        Some(l) => l,
        None if ctx
            .e
            .requested_bytes
            .is_some_and(|r| r > LARGEST_DEVICE.saturating_mul(2)) =>
        {
            LARGEST_DEVICE / 10
        }
        None => return None,
    };
    let need = ctx.used.max(ctx.e.requested_bytes)?;
    if need < l.saturating_mul(10) {
        return None;
    }
    let biggest = ctx.e.allocations.first().map(describe);
    let evidence = format!(
        "{} is {:.0}x the {} available{}: no batch or precision tweak closes a gap that size",
        fmt(need),
        need as f64 / l as f64,
        fmt(l),
        biggest
            .map(|b| format!("; largest buffer: {b}"))
            .unwrap_or_default()
    );
    Some(ctx.cause(
        CauseKind::ShapeBug,
        Some(need.saturating_sub(l)),
        evidence,
        Vec::new(),
        Vec::new(),
    ))
}

/// A buffer with an inner dimension of 2^24 (16,777,216) or more: no feature, vocabulary or
/// sequence axis of a real model is that wide, while a count (samples, tokens, rows of the
/// dataset) put where a size belongs is. Leading dimensions are left alone (recommender tables
/// have tens of millions of rows). Counts of a few million are real inner axes: the scores of
/// queries against a retrieval corpus or an item catalogue (`f32[1024,6291456]`), a point cloud's
/// points, a 5.5M-word softmax; the bound was 2^21 until session 15, when five such compiler
/// kinds (2^21 to 2^23 wide, all fixed by computing in chunks or sharding) took it first. A
/// dimension that leads another listed array (a table with that many rows) is the model's own.
fn implausible_dimension(ctx: &Ctx<'_>) -> Option<Cause> {
    const WIDEST: u64 = 1 << 24;
    // Every shape the listing prints (a slot's label lists the values sharing it): a wide
    // dimension that is the product of two or more consecutive dimensions of one of them is that
    // value flattened (an outer product, an image's H*W*C), wide on purpose. Read only for a
    // dimension that wide.
    let flattened = |d: u64| {
        ctx.e
            .allocations
            .iter()
            .flat_map(|a| [a.shape.as_deref(), a.label.as_deref()])
            .flatten()
            .flat_map(|t| t.split('[').skip(1))
            .filter_map(|t| t.split_once(']').map(|(dims, _)| dims))
            .any(|dims| {
                let dims: Vec<u64> = dims
                    .split(',')
                    .filter_map(|x| x.trim().parse::<u64>().ok())
                    .collect();
                (0..dims.len()).any(|i| {
                    let mut prod = 1u64;
                    dims[i..]
                        .iter()
                        .take_while(|&&x| x > 1)
                        .enumerate()
                        .any(|(k, &x)| {
                            prod = prod.saturating_mul(x);
                            k >= 1 && prod == d
                        })
                })
            })
    };
    // A dimension that leads a table the program lists (`f32[16777216,128]`: an embedding of
    // 4^12 k-mers, a hashed feature space) is the model's own vocabulary, however wide: a
    // `[B, V]` over it is a dense activation, not a count used as a size.
    let tables: Vec<u64> = listed_shapes(&ctx.e.allocations)
        .filter(|s| s.dims.len() >= 2)
        .map(|s| s.dims[0])
        .collect();
    let (a, dim) = ctx.e.allocations.iter().find_map(|a| {
        // The random bits of threefry are drawn flat (`u32[2,N]` for N elements): not a bug.
        let op = a.op_name.as_deref().unwrap_or("");
        if op.contains("threefry") || op.contains("rng_bit_generator") {
            return None;
        }
        let dims = shape_of(a)?.dims;
        dims.into_iter()
            .skip(1)
            .find(|&d| d >= WIDEST && !flattened(d) && !tables.contains(&d))
            .map(|d| (a, d))
    })?;
    Some(ctx.cause(
        CauseKind::ShapeBug,
        None,
        format!(
            "{} has an inner dimension of {dim}: no feature, vocabulary or sequence axis is that wide, a count (samples, tokens, rows of the dataset) used as a size is",
            a.shape.as_deref().unwrap_or("a buffer")
        ),
        vec![format!("Find where the dimension {dim} comes from (print the shapes of the layer's inputs and weights) and fix it; no batch or precision change makes this fit.")],
        Vec::new(),
    ))
}

/// The random bits of a parameter initializer (`threefry2x32`, `rng_bit_generator` under
/// `_normal` / `_truncated_normal` / `_uniform`, or in an init function) are a large part of the
/// listing: the random number generator was not partitioned, so every device draws the whole
/// array's bits before the parameters are sharded. Dropout masks in a training step are not this.
fn unsharded_init_random_bits(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let is_init_rng = |a: &Allocation| {
        let op = a.op_name.as_deref().unwrap_or("").to_ascii_lowercase();
        let rng = op.contains("threefry") || op.contains("rng_bit_generator");
        let initializer = ["_normal", "_truncated_normal", "init", "_uniform"]
            .iter()
            .any(|k| op.contains(k));
        let training = ["jvp(", "transpose(", "dropout", "bernoulli", "train_step"]
            .iter()
            .any(|k| op.contains(k));
        rng && (initializer || e.stage == Some(Stage::Init)) && !training
    };
    let rng: Vec<&Allocation> = e.allocations.iter().filter(|a| is_init_rng(a)).collect();
    let bytes: u64 = rng.iter().map(|a| a.size_bytes).sum();
    let listed: u64 = e.allocations.iter().map(|a| a.size_bytes).sum();
    if rng.is_empty() || bytes < 1 << 30 || bytes.saturating_mul(4) < listed {
        return None;
    }
    Some(ctx.cause(
        CauseKind::ReplicatedTensor,
        None,
        format!(
            "{} buffer(s) of {} hold the random bits of parameter initialization ({}): the random number generator was not partitioned, so every device draws the bits of the whole array before it is sharded",
            rng.len(),
            fmt(bytes),
            rng[0].shape.as_deref().unwrap_or("?")
        ),
        vec![
            "Make the generator partitionable: jax.config.update('jax_threefry_partitionable', True) (the default from JAX 0.5), so each device draws only its shard's bits.".into(),
            "Create the parameters inside jit with out_shardings (or a sharding constraint on each initializer's output), so the random bits are born sharded; or initialize layer by layer.".into(),
        ],
        Vec::new(),
    ))
}

/// One buffer of a GiB or more whose last dimension is vocabulary-sized (32k to 2^21): the
/// logits (or their gradient) of every token over the whole vocabulary, the largest activation
/// of a language model and one that neither the batch alone nor remat addresses well.
///
/// Only the tensor a runtime failure names: a compiler's listing is read by the detectors that
/// know what each buffer is.
fn vocabulary_logits(ctx: &Ctx<'_>) -> Option<Cause> {
    if ctx.e.phase != Phase::Runtime {
        return None;
    }
    let (a, dims) = ctx.e.allocations.iter().find_map(|a| {
        if a.size_bytes < 1 << 30 {
            return None;
        }
        let dims = shape_of(a)?.dims;
        let last = *dims.last()?;
        (dims.len() >= 2 && (32_000..1 << 21).contains(&last)).then_some((a, dims))
    })?;
    let vocab = *dims.last()?;
    let positions: u64 = dims[..dims.len() - 1]
        .iter()
        .fold(1u64, |p, &d| p.saturating_mul(d));
    Some(ctx.cause(
        CauseKind::LargeActivation,
        Some(a.size_bytes.saturating_sub(a.size_bytes / 8)),
        format!(
            "{} ({}) holds the logits of {positions} token positions over a vocabulary of {vocab} at once",
            a.shape.as_deref().unwrap_or("a buffer"),
            fmt(a.size_bytes),
        ),
        logits_actions(),
        Vec::new(),
    ))
}

/// What shrinks logits over a vocabulary, however they were found.
fn logits_actions() -> Vec<String> {
    vec![
        "Compute the loss over the vocabulary in chunks of tokens (a chunked or fused cross-entropy that never holds all logits: e.g. Liger's fused linear cross-entropy, or a loop over sequence chunks), or a sampled softmax.".into(),
        "Keep logits in bf16 and fewer token positions per step (shorter sequences, a smaller micro-batch with gradient accumulation); a smaller vocabulary if it is yours to choose.".into(),
    ]
}

/// The failure happened in the loss over the vocabulary (`cross_entropy_loss`, TF's
/// `softmax_cross_entropy_with_logits` node, `log_softmax`): the logits of every token and their
/// softmax are the largest tensors of a language model's step, and the one allocation that did not
/// fit was one of them.
fn loss_over_vocabulary(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let op = e.failing_op.as_deref()?;
    if e.phase != Phase::Runtime {
        return None;
    }
    let lower = op.to_ascii_lowercase();
    let loss = ["cross_entropy", "crossentropy", "log_softmax", "nll_loss"]
        .iter()
        .any(|k| lower.contains(k));
    if !loss {
        return None;
    }
    let request = e
        .requested_bytes
        .map(|r| format!(" ({} requested there)", fmt(r)))
        .unwrap_or_default();
    Some(ctx.cause(
        CauseKind::LargeActivation,
        e.requested_bytes.map(|r| r - r / 4),
        format!("the failure came in the loss over the vocabulary (`{op}`){request}: the logits and their softmax, one value per token and vocabulary entry, are the step's largest tensors"),
        logits_actions(),
        Vec::new(),
    ))
}

/// The tensor a run-time failure names is an intermediate by its shape: attention scores
/// (`[8,16,1024,1024]`: the last two dimensions one long sequence), logits over a vocabulary, or a
/// leading dimension of 65,536 or more (points, pairs, tokens of a whole input: no batch is that
/// large). Computing it in pieces is the fix; a smaller batch only shrinks it where its first
/// dimension is the batch.
fn shaped_intermediate(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.phase != Phase::Runtime || matches!(e.stage, Some(Stage::Init | Stage::Restore)) {
        return None;
    }
    let a = e.allocations.first()?;
    if a.size_bytes < 256 << 20 {
        return None;
    }
    let shape = shape_of(a)?;
    let kind = activation_kind(&shape).or_else(|| {
        (shape.dims.len() >= 2 && shape.dims[0] >= 65_536)
            .then_some("a tensor over a whole input's elements (points, pairs or tokens) [N, ..]")
    })?;
    Some(ctx.cause(
        CauseKind::LargeActivation,
        Some(a.size_bytes - a.size_bytes / 4),
        format!(
            "the failing tensor {} ({}) looks like {kind}: one intermediate computed whole",
            a.shape.as_deref().unwrap_or("?"),
            fmt(a.size_bytes)
        ),
        vec![
            "Compute it in chunks (loop over slices of its first or sequence dimension and reduce each before the next), or use a kernel that never materializes it (flash / memory-efficient attention, a chunked cross-entropy).".into(),
            "Smaller inputs shrink it directly: shorter sequences, fewer points per sample, a lower resolution.".into(),
        ],
        Vec::new(),
    ))
}

fn kernel_tiling(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let space = if e.memory_space == Some(MemorySpace::Smem) {
        "SMEM"
    } else {
        "VMEM"
    };
    let need = e.requested_bytes.or(e.used_bytes);
    let factor = need
        .zip(e.limit_bytes)
        .map(|(n, l)| (n as f64 / l.max(1) as f64).ceil() as u64);
    let evidence = match (need, e.limit_bytes) {
        (Some(n), Some(l)) => format!(
            "the kernel needs {} of scoped {space} against a limit of {} ({}x)",
            fmt(n),
            fmt(l),
            factor.unwrap_or(1)
        ),
        _ => format!("a kernel ran out of scoped {space}"),
    };
    let shrink = factor.filter(|&f| f > 1).map_or("smaller".into(), |f| {
        format!("at least {}x smaller", f.next_power_of_two())
    });
    let mut actions = vec![
        format!("Make the kernel's blocks {shrink}: reduce block sizes in the BlockSpecs (e.g. block_q/block_k/block_kv of a Pallas attention kernel, tm/tn/tk of a matmul); keep the last two block dims multiples of (8, 128)."),
        "Batch size rarely matters here: the block, not the array, must fit on chip.".into(),
        format!("If the blocks are right and the chip's physical {space} is larger than the scoped limit, raise the limit for that kernel: pltpu.CompilerParams(vmem_limit_bytes=...) in pallas_call."),
        "Last resort: raise the scoped limit for every kernel with LIBTPU_INIT_ARGS=--xla_tpu_scoped_vmem_limit_kib=N (TPU flags go in LIBTPU_INIT_ARGS, not XLA_FLAGS).".into(),
    ];
    if e.family == Family::GpuSharedMemory {
        return Some(gpu_shared_memory(ctx, need, factor));
    }
    if let Some(a) = e.allocations.first() {
        actions.insert(0, format!("The allocation that failed: {}.", describe(a)));
    }
    Some(ctx.cause(
        CauseKind::KernelTiling,
        need.zip(e.limit_bytes).map(|(n, l)| n.saturating_sub(l)),
        evidence,
        actions,
        vec![Snippet {
            framework: "jax".into(),
            code: "pl.pallas_call(\n    kernel,\n    grid=grid,\n    in_specs=[pl.BlockSpec((256, 512), lambda i, j: (i, j))],  # smaller blocks\n    compiler_params=pltpu.CompilerParams(vmem_limit_bytes=64 * 1024 * 1024),\n)".into(),
        }],
    ))
}

/// A GPU kernel over its per-block shared memory: a Pallas/Triton kernel's blocks (run time),
/// or a fusion XLA generated (ptxas at compile time, which names it).
fn gpu_shared_memory(ctx: &Ctx<'_>, need: Option<u64>, factor: Option<u64>) -> Cause {
    let e = ctx.e;
    let limit = e.limit_bytes;
    let evidence = match (need, limit) {
        (Some(n), Some(l)) => format!(
            "the kernel asks {} of shared memory per block; the GPU gives a block {} ({}x)",
            fmt(n),
            fmt(l),
            factor.unwrap_or(1)
        ),
        _ => "a GPU kernel asks more shared memory per block than the GPU gives".into(),
    };
    let actions = if let (Phase::Compile, Some(fusion)) = (e.phase, e.program.as_deref()) {
        vec![
            format!("The kernel is XLA's own fusion `{fusion}`, not your code: upgrade jaxlib / the CUDA plugin (fixed in later XLA releases), or keep XLA from generating it: XLA_FLAGS=--xla_gpu_enable_triton_gemm=false (matmul fusions) or a smaller problem size."),
            "Report the HLO to XLA (XLA_FLAGS=--xla_dump_to=DIR): a fusion over the shared-memory limit is a compiler bug.".into(),
        ]
    } else {
        let shrink = factor.filter(|&f| f > 1).map_or("smaller".into(), |f| {
            format!("at least {}x smaller", f.next_power_of_two())
        });
        vec![
            format!("Make the kernel's blocks {shrink}: block_m/block_n/block_k in a Pallas GPU or Triton kernel (the blocks of every operand live in shared memory at once), and fewer pipeline stages (num_stages)."),
            "Batch size does not matter here: the block, not the array, must fit in shared memory.".into(),
            "The limit is per block and per GPU generation (48K by default; up to 99K on A100 and 227K on H100 when the kernel opts in): a block tuned for a newer GPU may not fit an older one.".into(),
        ]
    };
    // The table's generic kernel advice is TPU's (scoped VMEM flags): none of it applies here.
    let mut c = ctx.cause(
        CauseKind::KernelTiling,
        need.zip(limit).map(|(n, l)| n.saturating_sub(l)),
        evidence,
        actions.clone(),
        vec![Snippet {
            framework: "jax".into(),
            code: "pl.pallas_call(\n    kernel,\n    grid=grid,\n    in_specs=[pl.BlockSpec((64, 64), lambda i, j: (i, j))],  # smaller blocks\n    compiler_params=plgpu.CompilerParams(num_stages=2),\n)".into(),
        }],
    );
    c.actions = actions;
    if e.phase == Phase::Compile && e.program.is_some() {
        c.snippets.clear(); // XLA's fusion: no kernel of the user's to change
    }
    c
}

/// LLVM's JIT could not map newly compiled code: the host holds the compiled executables, and
/// a program compiled again for every new shape fills it.
fn jit_code_memory(ctx: &Ctx<'_>) -> Option<Cause> {
    if !ctx.e.message.contains("JIT session error") {
        return None;
    }
    Some(ctx.cause(
        CauseKind::Recompilation,
        None,
        "LLVM's JIT could not map newly compiled code into host memory: compiled executables accumulate there, one per new input shape or static argument, and are kept in JAX's caches".into(),
        vec![
            "Keep shapes stable across steps (pad or bucket variable sizes; pass changing Python values as traced arguments, not static ones); jax.config.update('jax_log_compiles', True) lists each compile.".into(),
            "Free what was compiled: jax.clear_caches() every N steps or episodes, when shapes cannot be made stable.".into(),
        ],
        Vec::new(),
    ))
}

fn host_oom(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let evidence = match e.requested_bytes {
        Some(r) => format!("host memory could not supply {}", fmt(r)),
        None => format!(
            "the operating system killed the process for lack of RAM ({})",
            e.message.chars().take(120).collect::<String>()
        ),
    };
    Some(ctx.cause(
        CauseKind::HostOom,
        None,
        evidence,
        vec![
            "Watch the trainer's RSS (hbm-doctor record --pid PID) to see what grows: input pipeline buffers, host-offloaded arrays, checkpoints being assembled on the host, or Python objects kept across steps.".into(),
            "Reduce host-side prefetch/shuffle buffers and the number of data-loader workers; save checkpoints asynchronously or shard them per host.".into(),
            "For XLA:GPU host allocations: XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB raises the pinned host pool (default 64 GB).".into(),
        ],
        Vec::new(),
    ))
}

fn sparsecore(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let (tc, sc) = (e.tensorcore_bytes?, e.sparsecore_bytes?);
    let l = ctx.limit?;
    if sc >= tc {
        let savings = (tc + sc).saturating_sub(l).min(sc);
        Some(ctx.cause(
            CauseKind::SparsecoreStack,
            Some(savings),
            format!("SparseCore uses {} ({} of the {} available) against {} on the TensorCore: the SparseCore side is the bottleneck", fmt(sc), pct(sc, l), fmt(l), fmt(tc)),
            vec![
                "Lower the SparseCore HBM stack: it grows with feature_width, max_unique_nz_per_row and logical_replica_count; cap max_unique_nz_per_row / max_ids_per_partition at what your data really needs.".into(),
                "Lower the heap: a smaller maximum_parallel_iterations prefetches less input into HBM.".into(),
                "Check that embedding tables are mod-sharded across all chips.".into(),
                "Last resort: serialize table processing to trade parallelism for memory: LIBTPU_INIT_ARGS=--xla_sc_num_serialized_tables_to_optimize_hbm=N.".into(),
            ],
            Vec::new(),
        ))
    } else {
        None
    }
}

fn sparsecore_padding(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let sc = e.sparsecore_bytes?;
    if sc == 0 {
        return None;
    }
    Some(ctx.cause(
        CauseKind::SparsecorePadding,
        None,
        format!("SparseCore holds {}; tables narrower than 8 floats are padded to 32 bytes per row", fmt(sc)),
        vec!["Make embedding widths multiples of 8 floats, or pack narrow tables together so rows are not padded to 32 bytes.".into()],
        Vec::new(),
    ))
}

fn fragmentation(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let evidence = match (e.requested_bytes, e.free_bytes, e.largest_free_bytes) {
        (Some(r), Some(f), Some(lf)) => format!(
            "{} requested, {} free in total but the largest free block is {}",
            fmt(r),
            fmt(f),
            fmt(lf)
        ),
        (Some(r), Some(f), None) => format!(
            "{} requested while {} is free: the free memory is split into pieces",
            fmt(r),
            fmt(f)
        ),
        (Some(r), None, Some(lf)) => {
            format!("{} requested; largest free block {}", fmt(r), fmt(lf))
        }
        _ => "free memory exists but not in one contiguous block".into(),
    };
    let mut actions = vec![
        "Allocate the largest long-lived buffers (parameters, optimizer state, caches) first and keep them alive, so short-lived arrays do not cut the heap into pieces.".into(),
        "Avoid keeping many small arrays alive across steps (metrics, per-step results): fetch them to the host or delete them.".into(),
    ];
    if e.backend == Some(Backend::Gpu) || e.family == Family::BfcAllocator {
        actions.push("On GPU: TF_GPU_ALLOCATOR=cuda_malloc_async (TensorFlow) or XLA_PYTHON_CLIENT_ALLOCATOR=platform (JAX, slower) avoid the BFC pool's fragmentation.".into());
    } else {
        actions.push("On TPU the runtime defragments and evicts programs before failing; if this recurs after many steps, restart from a checkpoint periodically.".into());
    }
    Some(ctx.cause(
        CauseKind::Fragmentation,
        e.requested_bytes,
        evidence,
        actions,
        Vec::new(),
    ))
}

fn arguments_exceed(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let args = e.arguments_bytes?;
    let l = ctx.limit?;
    if (args as f64) < l as f64 * 0.6 {
        return None;
    }
    let chips = (args as f64 / (l as f64 * 0.7)).ceil() as u64;
    let mut actions = vec![if chips >= 2 {
        format!("Shard parameters and optimizer state over more chips (FSDP / ZeRO-3 style): {} of arguments need about {chips} or more chips' worth of HBM with room left for activations.", fmt(args))
    } else {
        format!("Shard parameters and optimizer state over the chips (FSDP / ZeRO-3 style): {} of arguments leave {} of the {} limit for everything else.", fmt(args), fmt(l.saturating_sub(args)), fmt(l))
    }];
    // A chip where the whole program fits, not only its arguments, and larger than this one.
    let need = ctx.used.unwrap_or(0).max(args + args / 4);
    let fits = chips::tpus_that_fit(need.max(l + 1));
    if let Some(first) = fits.first() {
        actions.push(format!("Or a chip with more HBM: {first}."));
    }
    Some(ctx.cause(
        CauseKind::ArgumentsExceed,
        ctx.exceeded.map(|x| x.min(args)),
        format!("the program's arguments alone take {} ({} of the {} limit)", fmt(args), pct(args, l), fmt(l)),
        actions,
        ctx.snippets(
            "mesh = jax.make_mesh((jax.device_count(),), (\"fsdp\",))\nparams = jax.device_put(params, NamedSharding(mesh, P(\"fsdp\")))  # shard, not replicate\n# optimizer state on the host:\nopt_state = jax.device_put(opt_state, NamedSharding(mesh, P(\"fsdp\"), memory_kind=\"pinned_host\"))",
            "import torch_xla.distributed.spmd as xs\nfrom torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2\nmodel = FSDPv2(model)  # shards parameters and optimizer state over the mesh",
        ),
    ))
}

/// A TPU compile whose arguments take 60% of the limit or more: the program's state is most of
/// the device.
fn tpu_state_heavy(ctx: &Ctx<'_>) -> bool {
    let e = ctx.e;
    e.phase == Phase::Compile
        && e.backend == Some(Backend::Tpu)
        && e.arguments_bytes
            .zip(ctx.limit)
            .is_some_and(|(a, l)| a.saturating_mul(5) >= l.saturating_mul(3))
}

/// Arguments most of a TPU's limit, or over it, at compile time: in an SPMD program, state left
/// whole on every device is the usual reason (`in_shardings` of `P()`, a partition rule or an
/// axis mapping that falls through to `P()`, a `device_put` with no sharding), and the listing
/// cannot tell; a candidate after [`arguments_exceed`] when the arguments are over the limit,
/// before it when they fit, with the one check that decides it.
fn arguments_left_whole(ctx: &Ctx<'_>) -> Option<Cause> {
    if !tpu_state_heavy(ctx) {
        return None;
    }
    let (args, l) = (ctx.e.arguments_bytes?, ctx.limit?);
    let told = if args >= l {
        format!("the arguments alone ({}) exceed one device", fmt(args))
    } else {
        format!(
            "the arguments alone ({}) take {} of one device, leaving {} for everything the step computes",
            fmt(args),
            pct(args, l),
            fmt(l - args)
        )
    };
    Some(ctx.cause(
        CauseKind::ReplicatedTensor,
        None,
        format!("{told}: in a program over several chips that is usually state copied whole on every one of them, which the message cannot show"),
        vec![
            "Print where the parameters and optimizer state live (jax.debug.visualize_array_sharding(x), or x.sharding for each leaf of params and opt_state): a leaf on PartitionSpec() is whole on every device.".into(),
            "Shard what is whole over the mesh (in_shardings / a partition rule or logical-axis mapping that names the missing axis; the optimizer state with the same specs as its parameters).".into(),
        ],
        Vec::new(),
    ))
}

/// A recognizable large intermediate: attention scores or logits.
fn activation_kind(shape: &Shape) -> Option<&'static str> {
    let d = &shape.dims;
    let n = d.len();
    if n >= 3 && d[n - 1] == d[n - 2] && d[n - 1] >= 512 {
        return Some("attention scores [.., S, S]");
    }
    if n >= 3 && d[n - 1] >= 30_000 {
        return Some("logits over a vocabulary [.., V]");
    }
    None
}

fn large_activation(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if ctx.category == Category::Arguments {
        return None;
    }
    let l = ctx.limit.or(ctx.used)?;
    // A temporary shaped like the array the program holds whole beside its shards is that
    // state's update or gradient, not an activation.
    let whole = held_whole(ctx).map(|(_, w, _)| w);
    let big: Vec<&Allocation> = e
        .allocations
        .iter()
        .filter(|a| {
            !matches!(
                a.allocation_type.as_deref(),
                Some("Entry Parameter" | "parameter")
            ) && a.size_bytes as f64 >= l as f64 * 0.25
                && !whole.as_ref().is_some_and(|w| {
                    shape_of(a).is_some_and(|s| s.type_name == w.type_name && s.dims == w.dims)
                })
        })
        .collect();
    let first = big.first()?;
    let kind = shape_of(first).and_then(|s| activation_kind(&s));
    let total: u64 = big.iter().map(|a| a.size_bytes).sum();
    let mut actions = Vec::new();
    match kind {
        Some(k) if k.starts_with("attention") => {
            actions.push("Use a memory-efficient attention kernel that never materializes [B,H,S,S]: jax.nn.dot_product_attention(..., implementation='cudnn') on GPU, the Pallas splash/flash attention kernels on TPU, or chunk the queries.".into());
        }
        Some(_) => {
            actions.push("Compute the loss in chunks over the sequence (chunked cross-entropy) so [B,S,V] logits are never whole, or shard the vocabulary dimension over the model axis.".into());
        }
        None => {}
    }
    actions.push(format!(
        "Find where {} is made{}: shard it across devices with a sharding constraint, split the computation into chunks (jax.lax.map / scan over slices), or recompute it in the backward pass (jax.checkpoint).",
        describe(first),
        first.source.as_deref().map(|s| format!(" ({s})")).unwrap_or_default()
    ));
    // Chunked eight ways (as the dump's what-if does), an eighth of each stays live.
    Some(ctx.cause(
        CauseKind::LargeActivation,
        Some(total - total / 8),
        format!(
            "{} buffer(s) of at least a quarter of the limit: {}{}",
            big.len(),
            big.iter().take(3).map(|a| describe(a)).collect::<Vec<_>>().join("; "),
            kind.map(|k| format!(" - looks like {k}")).unwrap_or_default()
        ),
        actions,
        ctx.snippets(
            "x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(\"data\", None, \"model\")))",
            "xs.mark_sharding(x, mesh, (\"data\", None, \"model\"))",
        ),
    ))
}

fn padding(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let mut offenders: Vec<(u64, &Allocation)> = e
        .allocations
        .iter()
        .filter_map(|a| {
            a.unpadded_bytes
                .map(|u| (a.size_bytes.saturating_sub(u), a))
        })
        .filter(|(w, _)| *w > 0)
        .collect();
    offenders.sort_by_key(|o| std::cmp::Reverse(o.0));
    let listed: u64 = offenders.iter().map(|o| o.0).sum();
    let heap = match (e.hlo_temp_padded_bytes, e.hlo_temp_unpadded_bytes) {
        (Some(p), Some(u)) if p > u => p - u,
        _ => 0,
    };
    let waste = listed.max(heap);
    let base = ctx.used.or(ctx.limit)?;
    if waste == 0 || (waste as f64) < base as f64 * 0.01 {
        return None;
    }
    let mut actions = Vec::new();
    let mut shown: Vec<String> = Vec::new();
    for (w, a) in &offenders {
        let Some(shape) = shape_of(a) else { continue };
        let name = shape.without_layout();
        if shown.contains(&name) || shown.len() >= 3 {
            continue;
        }
        shown.push(name.clone());
        let down = shape.aligned_dims(false);
        let up = shape.aligned_dims(true);
        let fix = if down != shape.dims
            && down.iter().zip(&shape.dims).all(|(d, s)| d <= s)
            && down.iter().all(|&d| d > 0)
        {
            format!(
                "use {} (no padding) or {} (same memory, none wasted)",
                hbm_doctor_hlo::shape::format_dims(name.split('[').next().unwrap_or("f32"), &down),
                hbm_doctor_hlo::shape::format_dims(name.split('[').next().unwrap_or("f32"), &up)
            )
        } else {
            permuted_fix(&shape, a.size_bytes)
        };
        let ratio = a
            .unpadded_bytes
            .map_or(0.0, |u| a.size_bytes as f64 / u.max(1) as f64);
        actions.push(format!(
            "{name} takes {} for {} of data ({ratio:.1}x, {} wasted): {fix}.",
            fmt(a.size_bytes),
            fmt(a.unpadded_bytes.unwrap_or(0)),
            fmt(*w)
        ));
    }
    let evidence = if listed >= heap {
        format!(
            "tile padding wastes {} in the listed allocations ({} of the requirement)",
            fmt(listed),
            pct(listed, base)
        )
    } else {
        format!(
            "HLO temporaries are {} padded for {} of data: {} lost to tile padding",
            fmt(e.hlo_temp_padded_bytes.unwrap_or(0)),
            fmt(e.hlo_temp_unpadded_bytes.unwrap_or(0)),
            fmt(heap)
        )
    };
    Some(ctx.cause(
        CauseKind::Padding,
        Some(waste),
        evidence,
        actions,
        Vec::new(),
    ))
}

/// Small dimensions in the two tiled (minor) positions: propose the layout that puts the largest
/// dimension last, with what it would take (estimated on `T(8,128)`).
fn permuted_fix(shape: &Shape, current: u64) -> String {
    let dims = &shape.dims;
    let generic = "move the small dimensions out of the two minor (tiled) positions, or fold them into a larger dimension".to_string();
    if dims.len() < 2 {
        return generic;
    }
    let Some((big, _)) = dims.iter().enumerate().max_by_key(|(_, d)| **d) else {
        return generic;
    };
    if big >= dims.len() - 1 {
        return generic;
    }
    let mut order: Vec<u64> = dims
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != big)
        .map(|(_, d)| *d)
        .collect();
    order.push(dims[big]);
    let name = shape.without_layout();
    let ty = name.split('[').next().unwrap_or("f32");
    let text = hbm_doctor_hlo::shape::format_dims(ty, &order);
    match Shape::parse(&text).filter(|p| p.estimated_tpu_padded_bytes() * 2 < current) {
        Some(p) => format!(
            "keep the large dimension minor, e.g. lay it out as {text} (transpose, or einsum with that output order): about {} instead",
            fmt(p.estimated_tpu_padded_bytes())
        ),
        None => generic,
    }
}

/// Whether `a` looks like layer-stacked parameters (`scan` over layers): an entry parameter, or
/// a buffer made in a scan / while loop shaped like weights `[L, d_in, d_out]`. Its leading
/// dimension is the layer count, not the batch.
fn stacked_layers(a: &Allocation, s: &Shape) -> bool {
    if loop_stacked(a) {
        return true;
    }
    if matches!(
        a.allocation_type.as_deref(),
        Some("Entry Parameter" | "parameter")
    ) {
        return true;
    }
    let names = format!(
        "{} {}",
        a.op_name.as_deref().unwrap_or(""),
        a.label.as_deref().unwrap_or("")
    )
    .to_ascii_lowercase();
    let n = s.dims.len();
    (names.contains("scan") || names.contains("while"))
        && n >= 3
        && s.dims[0] <= 512
        && s.dims[n - 1] >= 128
        && s.dims[n - 2] >= 128
        && !names.contains("jvp(")
}

/// A slot of the compiler's memory usage report holding one stacked value that several values
/// share in turn (`5×bf16[16,32768,8192]`: a while loop's init, parameter, element, update and
/// result): the per-iteration outputs of a `scan`, stacked along its trip count (the layers).
fn loop_stacked(a: &Allocation) -> bool {
    if a.allocation_type.as_deref() != Some("memory usage report") {
        return false;
    }
    let (Some(label), Some(shape)) = (a.label.as_deref(), a.shape.as_deref()) else {
        return false;
    };
    let rank = shape.matches(',').count() + 1;
    rank >= 3
        && label.split(": ").nth(1).unwrap_or("").split(", ").any(|v| {
            v.split_once('×')
                .is_some_and(|(k, sh)| sh == shape && k.parse::<u32>().is_ok_and(|k| k >= 3))
        })
}

/// A buffer shaped exactly like an array the program holds (an entry parameter in the memory
/// usage report's later tables): a stack `[layers, d, f]` of that shape is the parameters'
/// gradient or update, which rematerialization cannot remove, not activations.
fn held_shaped(e: &Event, a: &Allocation) -> bool {
    let Some(s) = shape_of(a) else { return false };
    e.held
        .iter()
        .filter_map(|(_, h)| Shape::parse(h))
        .any(|h| h.type_name == s.type_name && h.dims == s.dims)
}

/// [`loop_stacked`], and a stack along a scan's iterations. Not when its leading dimension leads
/// more allocations that are no such slot than slots that are (one step's temporaries, led by
/// the batch: `f32[112,16,1024,1024]` reused again and again beside `bf16[112,1024,8192]`,
/// `bf16[112,16,128,1024]`...), unless the value of one iteration (the shape without its
/// leading dimension) is listed too (`bf16[8,112,1024,2048]` beside `bf16[112,1024,2048]`).
fn scan_stacked(a: &Allocation, allocs: &[Allocation], listed: &[Shape]) -> bool {
    if !loop_stacked(a) {
        return false;
    }
    let Some(s) = shape_of(a) else { return false };
    if listed
        .iter()
        .any(|l| l.type_name == s.type_name && l.dims[..] == s.dims[1..])
    {
        return true;
    }
    let (mut stacks, mut others) = (0, 0);
    for o in allocs {
        if shape_of(o).is_some_and(|o| o.dims.len() >= 2 && o.dims[0] == s.dims[0]) {
            if loop_stacked(o) {
                stacks += 1;
            } else {
                others += 1;
            }
        }
    }
    others <= stacks
}

/// The leading dimension most listed allocations share: probably the batch. Dimensions that are
/// the layer count of stacked parameters are not.
fn common_batch(allocs: &[Allocation]) -> Option<(u64, u64)> {
    let layers: Vec<u64> = allocs
        .iter()
        .filter_map(|a| shape_of(a).filter(|s| stacked_layers(a, s)))
        .filter_map(|s| s.dims.first().copied())
        .collect();
    let mut counts: Vec<(u64, u64, u64)> = Vec::new(); // (dim, count, bytes)
    for a in allocs {
        let Some(s) = shape_of(a) else { continue };
        if s.dims.len() < 2 {
            continue;
        }
        let d = s.dims[0];
        if d < 2 || layers.contains(&d) {
            continue;
        }
        match counts.iter_mut().find(|c| c.0 == d) {
            Some(c) => {
                c.1 += 1;
                c.2 += a.size_bytes;
            }
            None => counts.push((d, 1, a.size_bytes)),
        }
    }
    counts.sort_by(|a, b| b.2.cmp(&a.2).then(b.1.cmp(&a.1)).then(a.0.cmp(&b.0)));
    counts.first().filter(|c| c.1 >= 2).map(|c| (c.0, c.2))
}

/// The event states its total and no part of it: no listing, no arguments, no temporaries.
fn states_total_only(e: &Event) -> bool {
    e.allocations.is_empty() && e.arguments_bytes.is_none() && e.hlo_temp_bytes.is_none()
}

/// A TPU compile failure known by its headline alone (libtpu's one-line `the total memory
/// required for HLO temporaries (X) exceeds available HBM (Y)`, or `Used X of Y hbm` with no
/// listing and no arguments figure): nothing says what makes up the requirement. Behind the
/// batch, the two other stories that most often do (in the 347 compiled failures: an
/// intermediate computed whole in 165, something replicated or gathered that should be sharded
/// in 119, the batch in 157), each said to be a hypothesis; the listing or a dump decides. They
/// come before a bigger chip even far past the device (in the 33 compiled failures 2.5 times
/// the device or more known by their headline, the fix was never a bigger chip).
fn headline_hypotheses(ctx: &Ctx<'_>) -> Vec<(f64, Cause)> {
    let e = ctx.e;
    let headline_only = e.phase == Phase::Compile
        && e.backend == Some(hbm_doctor_log::Backend::Tpu)
        && states_total_only(e)
        && matches!(ctx.category, Category::Unknown | Category::Aggregate);
    if !headline_only || ctx.used.zip(ctx.limit).is_none_or(|(u, l)| u <= l) {
        return Vec::new();
    }
    let not_shown = "not shown by the message, which states only the total: a hypothesis to check in the listing (the whole log) or a dump";
    vec![
        (
            1.1,
            ctx.cause(
                CauseKind::LargeActivation,
                None,
                format!("or one intermediate computed whole (attention scores, logits over the vocabulary, a pairwise matrix) makes most of the requirement; {not_shown}"),
                vec!["Find the largest temporary in the listing (`Largest program allocations` in the log, or hbm-doctor analyze on an XLA dump): compute it in chunks (jax.lax.map / scan over slices), with a fused kernel (jax.nn.dot_product_attention, a chunked loss), or sharded.".into()],
                Vec::new(),
            ),
        ),
        (
            1.08,
            ctx.cause(
                CauseKind::ReplicatedTensor,
                None,
                format!("or an array is replicated (or gathered whole) on every device where it should be sharded: parameters, optimizer state, the batch or an activation; {not_shown}"),
                vec!["Check the shardings of the jitted function's inputs and outputs (jax.debug.visualize_array_sharding, or the `sharding` of each parameter in the HLO dump): shard parameters and optimizer state over the mesh (FSDP) and the batch over the data axis.".into()],
                Vec::new(),
            ),
        ),
    ]
}

fn batch_too_large(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if !matches!(
        ctx.category,
        Category::Aggregate
            | Category::SingleLargeAllocation
            | Category::RuntimeAllocation
            | Category::TcScImbalance
            | Category::Unknown
    ) {
        return None;
    }
    let (u, l) = (ctx.used?, ctx.limit?);
    if u <= l || u >= l.saturating_mul(10) {
        return None;
    }
    let x = u - l;
    let fixed = e.arguments_bytes.unwrap_or(0)
        + e.output_bytes
            .unwrap_or(0)
            .saturating_sub(e.output_aliased_bytes.unwrap_or(0));
    let temps = e
        .hlo_temp_bytes
        .filter(|&t| t > 0)
        .unwrap_or_else(|| u.saturating_sub(fixed));
    if temps <= x {
        return None;
    }
    let keep = 1.0 - x as f64 / temps as f64; // fraction of the batch that fits
    let micro = (1.0 / keep).ceil().max(2.0) as u64;
    let mut actions = Vec::new();
    let evidence;
    match common_batch(&e.allocations) {
        Some((b, bytes)) => {
            let mut nb = (b as f64 * keep).floor() as u64;
            if nb >= 8 {
                nb = nb / 8 * 8;
            }
            evidence = format!(
                "temporaries of {} must shrink by {} to fit; {} of the listed buffers have leading dimension {b} (likely the per-device batch)",
                fmt(temps),
                fmt(x),
                fmt(bytes)
            );
            if nb >= 1 {
                actions.push(format!("Reduce the per-device batch from {b} to at most {nb} (temporaries scale with it; {} fit)", pct((keep * 100.0) as u64, 100)));
            }
            actions.push(format!("Or keep the global batch: split it into {micro} micro-batches of {} with gradient accumulation.", b.div_ceil(micro)));
        }
        None => {
            evidence = format!(
                "temporaries of {} must shrink by {} ({}) to fit",
                fmt(temps),
                fmt(x),
                pct(x, temps)
            );
            actions.push(format!(
                "Reduce the batch to at most {} of its current size (temporaries scale with it).",
                pct((keep * 100.0).floor() as u64, 100)
            ));
            actions.push(format!(
                "Or keep the global batch: split each batch into {micro} micro-batches with gradient accumulation."
            ));
        }
    }
    Some(ctx.cause(
        CauseKind::BatchTooLarge,
        Some(x),
        evidence,
        actions,
        ctx.snippets(
            &format!("optimizer = optax.MultiSteps(optax.adamw(lr), every_k_schedule={micro})  # {micro} micro-batches per update"),
            &format!("for i, (x, y) in enumerate(loader):  # loader yields micro-batches\n    loss = loss_fn(model(x), y) / {micro}\n    loss.backward()\n    if (i + 1) % {micro} == 0:\n        optimizer.step(); optimizer.zero_grad()\n    xm.mark_step()"),
        ),
    ))
}

fn no_donation(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let out = e.output_bytes?;
    let aliased = e.output_aliased_bytes.unwrap_or(0);
    let args = e.arguments_bytes?;
    let base = ctx.used.or(e.requested_bytes).or(ctx.limit)?;
    let could = out.min(args).saturating_sub(aliased);
    if could == 0 || (could as f64) < base as f64 * 0.05 {
        return None;
    }
    Some(ctx.cause(
        CauseKind::NoDonation,
        Some(could),
        format!("outputs take {} and share only {} with the {} of arguments: updated parameters/state exist twice", fmt(out), fmt(aliased), fmt(args)),
        Vec::new(),
        ctx.snippets(
            "train_step = jax.jit(train_step, donate_argnums=(0, 1))  # params, opt_state\n# or: jax.jit(train_step, donate_argnames=(\"state\",))",
            "# parameters updated in place are aliased; check 'Aliased Input size' with PT_XLA_DEBUG_LEVEL=1\noptimizer.step()  # in place",
        ),
    ))
}

/// An integer array the program holds, copied whole at the peak: a listed temporary of a quarter
/// of the limit or more, of an integer (or boolean) type, shaped exactly like an array in the
/// report's later tables (an entry parameter). An integer array has no gradient, so the copy is
/// the state itself built again: an out-of-place update (`jnp.concatenate([new, buf])[:cap]`, a
/// shifted FIFO) or an argument not donated, where `dynamic_update_slice` on a donated buffer
/// would write in place.
fn integer_state_copied(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let limit = ctx.limit?;
    let integer = |t: &str| {
        matches!(
            t,
            "s4" | "s8" | "s16" | "s32" | "s64" | "u4" | "u8" | "u16" | "u32" | "u64" | "pred"
        )
    };
    let a = e.allocations.iter().find(|a| {
        a.size_bytes.saturating_mul(4) >= limit
            && held_shaped(e, a)
            && shape_of(a).is_some_and(|s| integer(s.type_name))
    })?;
    let name = shape_of(a).map_or_else(String::new, |s| {
        hbm_doctor_hlo::shape::format_dims(s.type_name, &s.dims)
    });
    Some(ctx.cause(
        CauseKind::NoDonation,
        Some(a.size_bytes),
        format!(
            "{} is a whole second copy of {name}, an integer array the program holds (no gradient is integer): the state exists twice, built anew by an out-of-place update or kept because the argument is not donated",
            describe(a)
        ),
        vec![format!("Update {name} in place: donate it (donate_argnums) and write with jax.lax.dynamic_update_slice / .at[idx].set(...) (a ring buffer with a write index), not jnp.concatenate or a shift that builds a new array.")],
        ctx.snippets(
            "buf = jax.lax.dynamic_update_slice_in_dim(buf, new, idx, axis=1)  # ring buffer, in place\nstep = jax.jit(step, donate_argnums=(0,))",
            "buf[:, idx:idx + n] = new  # in place; keep the write index on the host",
        ),
    ))
}

/// The TPU compiler's rematerialization-limit line states the arguments and how much output aliases
/// them: nothing aliased with large arguments means nothing was donated.
fn undonated_arguments(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.output_bytes.is_some() || ctx.category == Category::Arguments {
        return None; // no_donation() judges with the output size, arguments_exceed() covers the rest.
    }
    let args = e.arguments_bytes?;
    let used = ctx.used?;
    let aliased = e.output_aliased_bytes?;
    let undonated = args.saturating_sub(aliased);
    if (undonated as f64) < used as f64 * 0.25 {
        return None;
    }
    let said = if aliased == 0 {
        "none of the outputs alias them (aliased_output 0B)".to_string()
    } else {
        format!(
            "outputs alias only {} of them: {} of arguments are not donated",
            fmt(aliased),
            fmt(undonated)
        )
    };
    Some(ctx.cause(
        CauseKind::NoDonation,
        Some(undonated),
        format!("the arguments take {} ({} of the requirement) and {said}: if the step returns updated parameters or optimizer state, both copies are live (savings: up to the arguments' size)", fmt(args), pct(args, used)),
        Vec::new(),
        ctx.snippets(
            "train_step = jax.jit(train_step, donate_argnums=(0, 1))  # params, opt_state",
            "# in-place optimizer updates are aliased automatically (XLA_ENABLE_PARAM_ALIASING=1)
optimizer.step()",
        ),
    ))
}

fn f32_precision(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    // (`0 bytes already allocated` is no requirement to take a share of.)
    let base = ctx.used.or(ctx.limit).filter(|&b| b > 0)?;
    let f32: Vec<&Allocation> = e
        .allocations
        .iter()
        .filter(|a| {
            a.shape
                .as_deref()
                .is_some_and(|s| s.trim_start().starts_with("f32["))
        })
        .collect();
    let total: u64 = f32.iter().map(|a| a.size_bytes).sum();
    if f32.is_empty() || (total as f64) < base as f64 * 0.2 {
        return None;
    }
    Some(ctx.cause(
        CauseKind::F32Precision,
        Some(total / 2),
        format!("{} listed buffers are f32 and total {} ({} of the requirement)", f32.len(), fmt(total), pct(total, base)),
        Vec::new(),
        ctx.snippets(
            "params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)  # or flax: dtype=jnp.bfloat16, param_dtype=jnp.float32",
            "model = model.to(torch.bfloat16)  # or torch.autocast('xla', dtype=torch.bfloat16)",
        ),
    ))
}

/// An f32 argument held next to a bf16 copy of the same dimensions: the program converts the
/// whole array before using it (a dataset, a table or weights stored in f32 and computed on in
/// bf16). Stored in bf16 (or uint8 for pixels) from the start, the copy goes and the original
/// halves: the savings are the f32 array's size. Only arrays that are arguments count (no more
/// than the stated arguments, a quarter of the limit or more): an f32 activation with its bf16
/// copy is mixed precision's ordinary working set.
fn converted_copy(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let args = e.arguments_bytes?;
    let limit = ctx.limit?;
    let (f32_alloc, f32_shape) = e
        .allocations
        .iter()
        .filter_map(|a| Some((a, shape_of(a)?)))
        .filter(|(a, s)| {
            s.type_name == "f32" && a.size_bytes <= args && a.size_bytes.saturating_mul(4) >= limit
        })
        .max_by_key(|(a, _)| a.size_bytes)?;
    let copy = e
        .allocations
        .iter()
        .find(|a| shape_of(a).is_some_and(|s| s.type_name == "bf16" && s.dims == f32_shape.dims))?;
    Some(ctx.cause(
        CauseKind::F32Precision,
        Some(f32_alloc.size_bytes),
        format!(
            "{} {} (an argument: the arguments take {}) is held next to {} {}, a bf16 copy of the same dimensions: the program converts the whole array before using it; stored in bf16 (uint8 for pixels) the copy goes and the original halves",
            fmt(f32_alloc.size_bytes),
            f32_alloc.shape.as_deref().unwrap_or("f32"),
            fmt(args),
            fmt(copy.size_bytes),
            copy.shape.as_deref().unwrap_or("bf16"),
        ),
        Vec::new(),
        ctx.snippets(
            "data = jax.device_put(np.asarray(images, dtype=np.uint8), sharding)  # or .astype(jnp.bfloat16): convert per batch inside the step",
            "tensor = tensor.to(torch.bfloat16)  # or keep images as uint8 and convert each batch",
        ),
    ))
}

fn is_forward_activation(a: &Allocation) -> bool {
    a.op_name.as_deref().is_some_and(|op| {
        (op.contains("jvp(") || op.contains("/forward")) && !op.contains("transpose(")
    })
}

fn no_remat(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if !matches!(
        ctx.category,
        Category::Aggregate
            | Category::SingleLargeAllocation
            | Category::RuntimeAllocation
            | Category::Unknown
    ) {
        return None;
    }
    let fwd: Vec<&Allocation> = e
        .allocations
        .iter()
        .filter(|a| is_forward_activation(a))
        .collect();
    let saved: u64 = fwd.iter().map(|a| a.size_bytes).sum();
    // Or a scan's stacked outputs filling the report (`5×bf16[16,32768,8192]` in slot after
    // slot): every layer's activations kept for the backward pass.
    let listed: Vec<Shape> = listed_shapes(&e.allocations).collect();
    let mut stacked: Vec<&Allocation> = e
        .allocations
        .iter()
        .filter(|a| scan_stacked(a, &e.allocations, &listed))
        .collect();
    let all_stacked = stacked.len();
    // (Stacks shaped like a held parameter are its gradient or update: not activations.)
    stacked.retain(|a| !held_shaped(e, a));
    let stacked_bytes: u64 = stacked.iter().map(|a| a.size_bytes).sum();
    if fwd.is_empty() && all_stacked >= 3 && stacked.len() >= 2 {
        let layers = stacked
            .first()
            .and_then(|a| shape_of(a))
            .and_then(|s| s.dims.first().copied())
            .unwrap_or(0);
        return Some(ctx.cause(
            CauseKind::NoRemat,
            Some(stacked_bytes * 3 / 4),
            format!("{} slots of the memory usage report ({}) each hold one stacked value that several values share in turn ({}: {}): a scan's per-iteration outputs, stacked along its {layers} iterations (the layers), i.e. every layer's activations kept for the backward pass", stacked.len(), fmt(stacked_bytes), stacked[0].shape.as_deref().unwrap_or("?"), fmt(stacked[0].size_bytes)),
            vec![
                "Rematerialize each scanned layer (jax.checkpoint / nn.remat with a policy that saves only what the backward pass needs, e.g. nothing_saveable or dots_with_no_batch_dims_saveable), or offload the saved activations to host memory.".into(),
                "Last resort: LIBTPU_INIT_ARGS='--xla_tpu_rematerialization_algo=PEAK_PRIORITY --xla_tpu_pre_fusion_remat=true' (TPU flags go in LIBTPU_INIT_ARGS, not XLA_FLAGS).".into(),
            ],
            ctx.snippets(
                "block = jax.checkpoint(block, policy=jax.checkpoint_policies.nothing_saveable)\nmodel = nn.scan(nn.remat(Block), variable_axes={'params': 0}, split_rngs={'params': True}, length=num_layers)",
                "from torch_xla.utils.checkpoint import checkpoint\nh = checkpoint(layer, h)  # per transformer layer",
            ),
        ));
    }
    let training = !fwd.is_empty()
        || e.allocations.iter().any(|a| {
            a.op_name
                .as_deref()
                .is_some_and(|o| o.contains("transpose(") || o.contains("backward"))
        });
    // Evidence: forward values in the listing, or (without a listing) the compiler's own
    // rematerialization falling short of the limit.
    if !training && !e.allocations.is_empty() {
        return None;
    }
    if e.allocations.is_empty() && e.remat.is_none() {
        return None;
    }
    let evidence = if saved > 0 {
        format!("{} of the listed buffers ({}) are forward-pass values (jvp) kept alive for the backward pass", fwd.len(), fmt(saved))
    } else {
        "activations saved for the backward pass usually dominate a training step's temporaries"
            .into()
    };
    Some(ctx.cause(
        CauseKind::NoRemat,
        (saved > 0).then_some(saved * 3 / 4),
        evidence,
        vec![
            "Last resort: let the compiler trade compile time for memory: LIBTPU_INIT_ARGS='--xla_tpu_rematerialization_algo=PEAK_PRIORITY --xla_tpu_pre_fusion_remat=true' (TPU flags go in LIBTPU_INIT_ARGS, not XLA_FLAGS).".into(),
        ],
        ctx.snippets(
            "block = jax.checkpoint(block, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)\n# flax: nn.remat(Block, policy=...); host offload:\n# policy=jax.checkpoint_policies.offload_dot_with_no_batch_dims('device', 'pinned_host')",
            "from torch_xla.utils.checkpoint import checkpoint\nh = checkpoint(layer, h)  # per transformer layer",
        ),
    ))
}

/// An array the program holds whole beside one it holds split: two of the buffer allocations
/// that the TPU memory usage report lists after its first table (one table per entry parameter
/// or output the parameters do not alias) of the same type and rank, equal but for one
/// dimension that is k times the other's (k >= 2). The program's state is split k ways and this
/// array was left out: it is replicated on every device (a `PartitionSpec()` left on one table,
/// parameters restored without their shardings, weights kept whole while their moments are
/// sharded). Its allocations of that shape take a tenth of the limit or more.
fn held_whole_beside_shard(ctx: &Ctx<'_>) -> Option<Cause> {
    let (total, w, k) = held_whole(ctx)?;
    let name = hbm_doctor_hlo::shape::format_dims(w.type_name, &w.dims);
    Some(ctx.cause(
        CauseKind::ReplicatedTensor,
        Some(total - total / k),
        format!(
            "the program holds {name} whole ({} in all) beside arrays of the same type split {k} ways along one of its dimensions: its state is sharded {k} ways and this array was left out, so every device holds all of it",
            fmt(total)
        ),
        vec![format!("Give {name} the sharding of the arrays beside it (its PartitionSpec, or the shardings a checkpoint is restored with): split {k} ways, it takes {} per device.", fmt(total / k))],
        ctx.snippets(
            "params = jax.device_put(params, NamedSharding(mesh, P(None, 'fsdp')))  # the spec its siblings use\n# restoring: ocp.args.StandardRestore(abstract_state_with_shardings)",
            "xs.mark_sharding(t, mesh, (None, 'fsdp'))",
        ),
    ))
}

/// How many ways `s` splits `w`: the same type and rank, equal but for one dimension that is
/// k times as wide in `w`, k a mesh axis (2, 4, 8 or 16); not a square weight beside a long
/// activation (`[16384, 16384]` beside `[524288, 16384]`: the narrow side is another axis).
fn split_ways(w: &Shape, s: &Shape) -> Option<u64> {
    if s.type_name != w.type_name || s.dims.len() != w.dims.len() {
        return None;
    }
    let mut diff = (0..w.dims.len()).filter(|&i| w.dims[i] != s.dims[i]);
    let i = diff.next()?;
    if diff.next().is_some() {
        return None;
    }
    let (a, b) = (w.dims[i], s.dims[i]);
    let square = s.dims.iter().enumerate().any(|(j, &d)| j != i && d == b);
    (b >= 1 && a > b && a % b == 0 && matches!(a / b, 2 | 4 | 8 | 16) && !square).then_some(a / b)
}

/// [`split_ways`], or the split of `w`'s transpose: an MLP's down projection `[L, ff, d]` held
/// whole beside its up projection's shard `[L, d, ff/k]` (the same dimensions, the split one k
/// times narrower, in another order: one rule left the other out).
fn split_ways_any_order(w: &Shape, s: &Shape) -> Option<u64> {
    if let Some(k) = split_ways(w, s) {
        return Some(k);
    }
    if s.type_name != w.type_name || s.dims.len() != w.dims.len() || s.dims.len() < 2 {
        return None;
    }
    let mut want: Vec<u64> = s.dims.clone();
    want.sort_unstable();
    for (i, &a) in w.dims.iter().enumerate() {
        for k in [2u64, 4, 8, 16] {
            if a % k != 0 || a / k < 2 {
                continue;
            }
            let mut got = w.dims.clone();
            got[i] = a / k;
            // (Not a square weight beside a long activation: the narrow side is another axis.)
            if w.dims
                .iter()
                .enumerate()
                .any(|(j, &d)| j != i && d == a / k)
            {
                continue;
            }
            got.sort_unstable();
            if got == want {
                return Some(k);
            }
        }
    }
    None
}

/// The array [`held_whole_beside_shard`] finds: (its bytes in all, its shape, the ways its
/// siblings are split).
fn held_whole(ctx: &Ctx<'_>) -> Option<(u64, Shape, u64)> {
    let e = ctx.e;
    if e.backend == Some(Backend::Gpu) {
        return None;
    }
    let limit = ctx.limit?;
    let held: Vec<(u64, Shape)> = e
        .held
        .iter()
        .filter_map(|(b, s)| Some((*b, Shape::parse(s)?)))
        .collect();
    let split = split_ways_any_order;
    let mut best: Option<(u64, &Shape, u64)> = None;
    for (_, w) in &held {
        if w.dims.len() < 2 {
            continue;
        }
        let of = |sh: &Shape| -> u64 {
            held.iter()
                .filter(|(_, x)| x.type_name == sh.type_name && x.dims == sh.dims)
                .map(|(b, _)| *b)
                .sum()
        };
        let total = of(w);
        // The split siblings are a real part of the state: whole, they would hold at least half
        // as much as the whole arrays (not one small input beside the weights).
        let Some(k) = held
            .iter()
            .find_map(|(_, s)| split(w, s).filter(|k| of(s).saturating_mul(k * 2) >= total))
        else {
            continue;
        };
        if best.is_none_or(|(t, _, _)| total > t) {
            best = Some((total, w, k));
        }
    }
    let (total, w, k) = best?;
    if total.saturating_mul(10) < limit {
        return None;
    }
    Some((total, w.clone(), k))
}

/// A sharded array gathered whole: a large listed buffer `[k*L, rest...]` beside buffers of the
/// same type `[L, rest...]` (one device's shard of it, k >= 2). A stack of layers sharded along
/// its layer axis is gathered like that at every step of the scan (FSDP along the wrong axis);
/// an array gathered for one op is the same story.
fn gathered_whole(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.backend == Some(Backend::Gpu) || e.memory_space == Some(MemorySpace::Host) {
        return None;
    }
    let used = ctx.used.or(ctx.limit)?;
    let shapes: Vec<(Shape, &Allocation)> = e
        .allocations
        .iter()
        .filter_map(|a| shape_of(a).map(|s| (s, a)))
        .collect();
    let (whole, a, parts) = shapes.iter().find_map(|(big, a)| {
        if big.dims.len() < 3 || a.size_bytes.saturating_mul(10) < used {
            return None;
        }
        shapes.iter().find_map(|(small, _)| {
            let (k, l) = (big.dims[0], *small.dims.first()?);
            (small.type_name == big.type_name
                && small.dims.len() == big.dims.len()
                && small.dims[1..] == big.dims[1..]
                // (A one-layer slice `[1, ...]` is what a scan reads of its stack, not a shard.)
                && l >= 2
                && k > l
                && k % l == 0
                // (A mesh axis: a count of 16 or less, or a power of two splitting a stack of
                // layers (1024 or fewer); 768 times a volume's 256 is no axis, it is 196608
                // orientations beside a [256, ...] volume, and 64 times 2048 rows is 131072
                // positions beside one chunk's 2048, not a 64-way mesh axis.)
                && (k / l <= 16 || ((k / l).is_power_of_two() && k <= 1024)))
                .then_some((big, *a, k / l))
        })
    })?;
    Some(ctx.cause(
        CauseKind::ReplicatedTensor,
        Some(a.size_bytes - a.size_bytes / parts),
        format!(
            "{} is {parts} times the {}[{}, ...] arrays listed beside it along its first dimension: a sharded array gathered whole on every device (a stack of {} layers sharded along its layer axis is gathered like this at every step of its scan)",
            describe(a),
            whole.type_name,
            whole.dims[0] / parts,
            whole.dims[0]
        ),
        vec!["shard stacked layer parameters along a weight axis, not the layer axis: P(None, 'fsdp', None) on [layers, d, f] (not P('fsdp', None, None)), so each step of the scan gathers one layer; an array gathered for one op: keep the op sharded (with_sharding_constraint) instead".into()],
        Vec::new(),
    ))
}

/// A temporary that is an argument gathered whole: a large listed buffer (a tenth of the
/// requirement or more) of the type and rank of an array the program holds (the memory usage
/// report's tables after its first), equal to it but for one dimension k times as wide (k = 2,
/// 4, 8 or 16, a mesh axis): the program holds that array sharded k ways and materialises it
/// whole on every device (an optimizer's step on momentum copied whole, an all-gather before
/// an op that could stay sharded).
fn gathered_from_held(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.backend == Some(Backend::Gpu) || e.memory_space == Some(MemorySpace::Host) {
        return None;
    }
    let used = ctx.used.or(ctx.limit)?;
    let held: Vec<Shape> = e.held.iter().filter_map(|(_, s)| Shape::parse(s)).collect();
    // Each listed buffer that is a held array gathered k ways: (the buffer, its shape, k).
    let gathered =
        |a: &'_ Allocation, split: fn(&Shape, &Shape) -> Option<u64>| -> Option<(Shape, u64)> {
            let w = shape_of(a)?;
            // (An array the program holds whole is no gathered copy of itself.)
            if held_shaped(e, a) {
                return None;
            }
            let k = held
                .iter()
                .find_map(|s| split(&w, s).filter(|_| w.dims.len() >= 2))?;
            Some((w, k))
        };
    let (a, w, k) = e.allocations.iter().find_map(|a| {
        if a.size_bytes.saturating_mul(10) < used {
            return None;
        }
        gathered(a, split_ways).map(|(w, k)| (a, w, k))
    })?;
    // Every gathered copy the listing shows counts (a step gathering each of its stacked
    // weights holds several, some transposed), down to a hundredth of the requirement.
    let (count, saved) = e
        .allocations
        .iter()
        .filter(|b| b.size_bytes.saturating_mul(100) >= used)
        .filter_map(|b| {
            gathered(b, split_ways_any_order).map(|(_, k)| b.size_bytes - b.size_bytes / k)
        })
        .fold((0usize, 0u64), |(n, s), x| (n + 1, s + x));
    let name = hbm_doctor_hlo::shape::format_dims(w.type_name, &w.dims);
    let more = if count > 1 {
        format!(
            " ({count} listed buffers are such gathered copies; sharded, they would free {})",
            fmt(saved)
        )
    } else {
        String::new()
    };
    Some(ctx.cause(
        CauseKind::ReplicatedTensor,
        Some(saved.max(a.size_bytes - a.size_bytes / k)),
        format!(
            "{} is {name}, {k} times an array the program holds split along one of its dimensions: the sharded array is gathered whole on every device for its use{more}",
            describe(a)
        ),
        vec![format!("Keep the computation on {name} sharded like its argument (jax.lax.with_sharding_constraint on the result, or shard_map over the sharded axis), so each device works on its 1/{k}; an operation that needs the whole matrix (an orthogonalization, a factorization) can gather one block at a time.")],
        Vec::new(),
    ))
}

fn replicated_tensor(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if !matches!(
        ctx.category,
        Category::SingleLargeAllocation | Category::Aggregate
    ) || e.backend == Some(Backend::Gpu)
    {
        return None;
    }
    let l = ctx.limit?;
    // A buffer led by the batch the listing shares is one device's activations, split by the
    // batch already: not an array copied on every device.
    let batch = common_batch(&e.allocations).map(|(b, _)| b);
    // The trip count of a scan whose stacked outputs the report shows: a buffer led by it is
    // one more per-iteration stack (dropout masks or activations for every layer).
    let trips: Vec<u64> = e
        .allocations
        .iter()
        .filter(|a| loop_stacked(a))
        .filter_map(|a| shape_of(a).and_then(|s| s.dims.first().copied()))
        .collect();
    let listed: Vec<Shape> = listed_shapes(&e.allocations).collect();
    let big = e.allocations.iter().find(|a| {
        let lead = shape_of(a).and_then(|s| s.dims.first().copied());
        let rank = shape_of(a).map_or(0, |s| s.dims.len());
        let batch_led = batch.is_some() && lead == batch;
        // (A scan's stacked outputs are its own activations, not an array copied.)
        let per_iteration =
            loop_stacked(a) || (rank >= 3 && lead.is_some_and(|d| trips.contains(&d)));
        // (The same elements listed in another rank, `f32[3309568,768]` beside
        // `f32[32,1024,101,768]`, `bf16[1,3072,3072,32,32]` sharing a slot with
        // `bf16[3072,3072,1024]`: one activation reshaped for a gather or a matmul.)
        let reshaped = shape_of(a).is_some_and(|s| {
            let n: u64 = s.dims.iter().product();
            listed.iter().any(|o| {
                o.type_name == s.type_name
                    && o.dims.len() != s.dims.len()
                    && o.dims.iter().product::<u64>() == n
            })
        });
        a.size_bytes.saturating_mul(2) > l && !batch_led && !per_iteration && !reshaped
    });
    let evidence = match big {
        Some(a) => format!("{} is over half the device: an array that big is usually meant to be sharded, and a missing or lost sharding annotation replicates it on every chip", describe(a)),
        None if ctx.category == Category::SingleLargeAllocation => "an allocation over half the device usually means an array is replicated instead of sharded".into(),
        None => return None,
    };
    let savings = big.map(|a| a.size_bytes / 2);
    Some(ctx.cause(
        CauseKind::ReplicatedTensor,
        savings,
        format!("{evidence}{}", if savings.is_some() { " (savings assume sharding over just 2 devices)" } else { "" }),
        Vec::new(),
        ctx.snippets(
            "jax.debug.visualize_array_sharding(x)\nx = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(\"data\", \"model\")))",
            "xs.mark_sharding(t, mesh, (\"data\", \"model\"))",
        ),
    ))
}

/// The allocations whose op_name or XLA label mentions one of `needles` (lowercase).
/// Every shape a listing names: each allocation's, and the values a TPU report's slot is shared
/// by (`slot shared by 4 values: bf16[512,3072,32], 2×bf16[1,3072,3072,32,32]`).
fn listed_shapes(allocs: &[Allocation]) -> impl Iterator<Item = Shape> + '_ {
    allocs.iter().flat_map(|a| {
        let slot = a
            .label
            .as_deref()
            .and_then(|l| l.strip_prefix("slot shared by "))
            .and_then(|l| l.split_once(": "))
            .map(|(_, list)| list)
            .unwrap_or("");
        let values = slot
            .split(", ")
            .map(|v| v.rsplit('×').next().unwrap_or(v))
            .filter_map(Shape::parse);
        shape_of(a).into_iter().chain(values)
    })
}

fn allocations_mentioning<'a>(allocs: &'a [Allocation], needles: &[&str]) -> Vec<&'a Allocation> {
    allocs
        .iter()
        .filter(|a| {
            let text = format!(
                "{} {}",
                a.op_name.as_deref().unwrap_or(""),
                a.label.as_deref().unwrap_or("")
            )
            .to_ascii_lowercase();
            needles.iter().any(|n| text.contains(n))
        })
        .collect()
}

fn debug_print(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    // (A TPU report's slot shared with several tokens, `f32[131072,32768], f32[], 5×token[]`,
    // is a host transfer's buffer: each print or callback threads one. A single token in a
    // slot, an ordering value beside a top-k's matrix, is not.)
    let hits = allocations_mentioning(
        &e.allocations,
        &[
            "×token[]",
            "debug_callback",
            "debug_print",
            "outfeed",
            "host_callback",
            "pure_callback",
            "io_callback",
        ],
    );
    if hits.is_empty() {
        return None;
    }
    let total: u64 = hits.iter().map(|a| a.size_bytes).sum();
    Some(ctx.cause(
        CauseKind::DebugPrint,
        Some(total),
        format!(
                "{} buffer(s) feed a host callback or print: {}",
                hits.len(),
                hits.iter()
                    .take(3)
                    .map(|a| describe(a))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        Vec::new(),
        Vec::new(),
    ))
}

fn optimizer_state(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let hits = allocations_mentioning(&e.allocations, &["opt_state", "adam", "/mu", "/nu"]);
    if hits.is_empty() {
        return None;
    }
    let total: u64 = hits.iter().map(|a| a.size_bytes).sum();
    Some(ctx.cause(
        CauseKind::OptimizerStateUnsharded,
        Some(total / 2),
        format!(
            "{} of optimizer-state buffers are listed among the largest",
            fmt(total)
        ),
        Vec::new(),
        Vec::new(),
    ))
}

/// The user says something else holds the device: nothing this program does about its own
/// batch frees what another process holds.
fn holder_in_text(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let said = e.holder_named.as_deref()?;
    if e.phase != Phase::Runtime {
        return None;
    }
    // What PyTorch's own cache holds is no other holder for PyTorch's allocator message.
    if said.starts_with("torch") && e.family == Family::PytorchCudaOom {
        return None;
    }
    // With the device's figures, what is held outside this process is what stopping it frees.
    let held = e.limit_bytes.zip(e.free_bytes).and_then(|(l, f)| {
        // The process's whole reservation: its own figure, or PyTorch's allocated and idle
        // blocks.
        let used = e.process_bytes.or_else(|| {
            e.allocated_bytes
                .zip(e.fragmentation_bytes)
                .map(|(a, f)| a.saturating_add(f))
                .or(e.used_bytes)
        })?;
        Some(l.saturating_sub(used).saturating_sub(f)).filter(|&h| h > 0)
    });
    let outside = held
        .map(|h| format!(" ({} of the device is held outside this process)", fmt(h)))
        .unwrap_or_default();
    Some(ctx.cause(
        CauseKind::OtherProcess,
        held,
        format!("the text says something else holds the device: \"{said}\"{outside}"),
        vec![LIST_DEVICE_HOLDERS.into()],
        Vec::new(),
    ))
}

/// The device refused the allocator's own requests before the failure (`Failed to allocate
/// device memory of 59.38GiB ... CUDA_ERROR_OUT_OF_MEMORY`, `failed to allocate 2.12G from
/// device`): JAX or TensorFlow could not even take their pool's share of the GPU, so something
/// outside this program already held it.
fn device_refused_pool(ctx: &Ctx<'_>) -> Option<Cause> {
    let w = ctx.refused?;
    if ctx.e.phase != Phase::Runtime {
        return None;
    }
    let asked = w
        .worst
        .requested_bytes
        .map(|b| format!(" (up to {})", fmt(b)))
        .unwrap_or_default();
    Some(ctx.cause(
        CauseKind::OtherProcess,
        None,
        format!("the device refused the allocator's own requests {} time(s) before the failure{asked}, first at line {}: the GPU's memory was already held when the pool asked for it", w.count, w.first_line),
        vec![
            LIST_DEVICE_HOLDERS.into(),
            "Two programs can share a GPU only if neither preallocates: XLA_PYTHON_CLIENT_PREALLOCATE=false (JAX) or tf.config.experimental.set_memory_growth (TensorFlow) in each, or a fraction per process that sums under 1 (XLA_PYTHON_CLIENT_MEM_FRACTION).".into(),
        ],
        Vec::new(),
    ))
}

fn other_process(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.phase != Phase::Runtime {
        return None;
    }
    // Evidence that memory is held outside this program: the allocator's own in-use figure
    // plus what is free falls well short of its limit, or the text says another process holds
    // the device. Little free memory alone is just a full device.
    // What this process holds: PyTorch states it (reserved by its caching allocator, or "this
    // process has X in use"); otherwise the allocator's in-use figure.
    let (l, free) = (e.limit_bytes?, e.free_bytes?);
    let used = e.process_bytes.or(e.used_bytes)?;
    let held = l.saturating_sub(used).saturating_sub(free);
    // A CUDA context takes a few hundred MiB outside the allocator, and a desktop on the same
    // GPU up to a GiB or more: less than 2 GiB outside is no evidence of another process.
    if (held as f64) < l as f64 * 0.1 || held < 2 << 30 {
        return None;
    }
    Some(ctx.cause(
        CauseKind::OtherProcess,
        Some(held),
        format!("the limit is {} but this allocator holds {} and {} is free: {} is held outside it (another process, arrays of an earlier run, a second allocator)", fmt(l), fmt(used), fmt(free), fmt(held)),
        vec![
            if ctx.ptxla {
                "Find what holds the memory: device tensors from earlier steps still referenced (loss history, metrics; move them to the CPU with .item()/.cpu() and del them), a second process on the same chips (tpu-info, lsof /dev/accel* or /dev/vfio), or another compiled graph (an eval step) loaded beside the training step.".into()
            } else {
                "Find what holds the memory: arrays from earlier steps or programs still referenced (jax.live_arrays(), del them, jax.clear_caches()), a second process on the same chips (tpu-info / nvidia-smi, lsof /dev/accel* or /dev/vfio), or an eval/compile of another program loaded beside the training step.".into()
            },
            "If it grows over steps, record it (hbm-doctor record) and check for a leak with hbm-doctor trend.".into(),
        ],
        Vec::new(),
    ))
}

/// A runtime failure on a device that is simply full (little free, not split into pieces, no
/// sign of growth or of another holder): the per-step working set or the model state does not
/// fit. The figures cannot tell which; the stage or a dump can.
fn full_device(ctx: &Ctx<'_>) -> Vec<Cause> {
    let e = ctx.e;
    if e.phase != Phase::Runtime
        || !matches!(
            ctx.category,
            Category::RuntimeAllocation | Category::Unknown | Category::SingleLargeAllocation
        )
        || e.memory_space == Some(MemorySpace::Host)
    {
        return Vec::new();
    }
    // While the model is created or loaded no step has run: the model state is the story
    // (`model_state_at_load`); behind it, a card too small for that state, or one already held.
    if matches!(e.stage, Some(Stage::Init | Stage::Restore)) {
        return vec![
            ctx.cause(
                CauseKind::DeviceTooSmall,
                None,
                "or the card is too small for the model at this precision: its weights (and, to train, gradients and optimizer state) need more memory than one device has".into(),
                vec!["Load in bf16, int8 or 4-bit, spread the model over several devices (device_map=\"auto\", tensor parallelism, FSDP), or use a device with more memory.".into()],
                Vec::new(),
            ),
            ctx.cause(
                CauseKind::OtherProcess,
                None,
                "or the device was already held when the model was placed: another process, or arrays of an earlier run in the same notebook".into(),
                vec![LIST_DEVICE_HOLDERS.into()],
                Vec::new(),
            ),
        ];
    }
    // In generation the KV cache is the batch's story (`generation_memory`); a long input and
    // a model too large for the card remain.
    let generation = e.stage == Some(Stage::Generation);
    let request = e
        .requested_bytes
        .map(|r| format!(" for {}", fmt(r)))
        .unwrap_or_default();
    let free = e
        .free_bytes
        .map(|f| format!(" with {} free", fmt(f)))
        .unwrap_or_default();
    let mut out = Vec::new();
    if !generation {
        out.push(ctx.cause(
        CauseKind::BatchTooLarge,
        None,
        format!("the device ran out at run time{request}{free}: what a step holds (activations of the batch, gradients, temporaries) on top of the model state filled it; the batch is the knob that scales it"),
        vec!["Halve the per-device batch (or the sequence length).".into()],
        ctx.snippets(
            "optimizer = optax.MultiSteps(optax.adamw(lr), every_k_schedule=2)  # 2 micro-batches per update",
            "for i, (x, y) in enumerate(loader):  # loader yields half batches\n    (loss_fn(model(x), y) / 2).backward()\n    if (i + 1) % 2 == 0:\n        optimizer.step(); optimizer.zero_grad()\n    xm.mark_step()",
        ),
    ));
    }
    // The input's own size scales a step's activations as the batch does: in the labelled
    // posts without decisive evidence, the thread's answer was the input (a crop, a resolution,
    // a sequence) about half as often as the batch.
    out.push(ctx.cause(
        CauseKind::LargeActivation,
        None,
        "or the input's own size: a step's activations grow with the image resolution, the sequence length or the number of points as they do with the batch; one large input (a full-size image at evaluation, a long document) can fill the device alone".into(),
        vec!["Crop or resize the inputs (a smaller crop_size / max_length), evaluate large images with a sliding window, or split long inputs into chunks.".into()],
        Vec::new(),
    ));
    out.push(ctx.cause(
        CauseKind::DeviceTooSmall,
        None,
        "if a batch of 1 still fails, the model's parameters and optimizer state alone do not fit this device".into(),
        Vec::new(),
        Vec::new(),
    ));
    out
}

fn preallocation(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    // The 75% cap is a GPU pool's (JAX's preallocation); other accelerators' allocators
    // (Tenstorrent banks, Gaudi) have limits of their own that may also fall near 75%.
    // PyTorch's "total capacity" is the GPU itself, never a pool's share of it.
    if matches!(e.family, Family::OtherAccelerator | Family::PytorchCudaOom)
        || (e.backend != Some(Backend::Gpu) && e.memory_space != Some(MemorySpace::Device))
    {
        return None;
    }
    let l = e.limit_bytes?;
    let gb = l as f64 / (1u64 << 30) as f64;
    let capped = chips::GPU_SIZES_GB.iter().find(|&&p| {
        let r = gb / p as f64;
        (0.70..0.80).contains(&r)
    });
    let physical = *capped?;
    Some(ctx.cause(
        CauseKind::Preallocation,
        Some((physical << 30).saturating_sub(l) / 2),
        format!("the allocator's limit is {} - about 75% of a {physical} GB GPU, JAX's default preallocation fraction", fmt(l)),
        vec!["Give the pool more of the GPU: XLA_PYTHON_CLIENT_MEM_FRACTION=.95 (JAX) or allow_growth (TensorFlow); XLA_PYTHON_CLIENT_PREALLOCATE=false lets two processes share a GPU.".into()],
        Vec::new(),
    ))
}

/// A JAX program on a GPU failed at run time and the message gives no pool figures: JAX's
/// allocator is a preallocated BFC pool (75% of the GPU by default), which caps what the program
/// gets and can fragment; both are worth ruling out, after what the program itself holds.
fn jax_gpu_pool(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.phase != Phase::Runtime
        || e.backend != Some(Backend::Gpu)
        || !ctx.jax
        || ctx.ptxla
        || e.limit_bytes.is_some()
        || !matches!(
            e.family,
            Family::GpuOomAllocate | Family::GpuFailedRequest | Family::BfcAllocator
        )
    {
        return None;
    }
    Some(ctx.cause(
        CauseKind::Preallocation,
        None,
        "JAX on a GPU allocates from a preallocated pool (75% of the GPU unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise), and the message states neither the pool's size nor what is free in it".into(),
        vec![
            "Print the pool: jax.devices()[0].memory_stats() (bytes_limit, bytes_in_use, largest_free_block_bytes) at the failure; a limit well under the GPU's memory is the fraction, a largest free block under the request is fragmentation.".into(),
            "Then XLA_PYTHON_CLIENT_MEM_FRACTION=.90 gives the pool more of the GPU; XLA_PYTHON_CLIENT_ALLOCATOR=platform allocates on demand (no pool, no fragmentation, slower).".into(),
        ],
        Vec::new(),
    ))
}

fn runtime_growth(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.phase != Phase::Runtime
        || matches!(
            ctx.category,
            Category::RuntimeFragmentation | Category::HostMemory
        )
    {
        return None;
    }
    // Growth needs evidence: the failure came after many steps that ran, or the user says
    // memory grew (a leak, a steady increase, an OOM only after epochs of training).
    let step = e.step.filter(|&s| s >= 100);
    let said = e.growth_said.as_deref();
    if step.is_none() && said.is_none() {
        return None;
    }
    let blocked = if said.is_some() {
        matches!(e.stage, Some(Stage::Init | Stage::Restore))
    } else {
        matches!(
            e.stage,
            Some(Stage::Init | Stage::Restore | Stage::Eval | Stage::CheckpointSave)
        )
    };
    if blocked {
        return None;
    }
    let mut actions = vec![
        "Record device memory over steps (hbm-doctor record, or the hbm_doctor sampler in the training loop) and run hbm-doctor trend on it: steady growth is a leak, a jump at one step is a spike (eval, checkpoint, recompilation).".into(),
    ];
    if ctx.ptxla || !ctx.jax {
        actions.push("PyTorch/XLA: call xm.mark_step() (torch_xla.sync()) every step, do not keep small device tensors across steps (loss.item() history, metrics), and check the metrics report for UncachedCompile growing (recompilation).".into());
    }
    if ctx.jax || !ctx.ptxla {
        actions.push("JAX: do not keep device arrays in Python lists across steps; check len(jax.live_arrays()) over time.".into());
    }
    let evidence = match step {
        Some(step) => format!("the failure came at step {step}, after training had run normally: memory that grows step by step (small tensors kept across steps, a growing cache or graph) is the usual cause"),
        None => format!("the text says memory grew before the failure (\"{}\"): something kept across steps or epochs (tensors with their graph, metrics or outputs on the device, a growing cache) is the usual cause", said.unwrap_or_default()),
    };
    Some(ctx.cause(CauseKind::MemoryLeak, None, evidence, actions, Vec::new()))
}

/// Host memory that ran out after it grew: the user says RAM grew before the failure, or it
/// came after many steps that ran. Behind the host's own story (what was loaded at once).
fn host_growth(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.phase != Phase::Runtime || matches!(e.stage, Some(Stage::Init | Stage::Restore)) {
        return None;
    }
    let evidence = match (e.growth_said.as_deref(), e.step.filter(|&s| s >= 100)) {
        (Some(said), _) => format!("the text says memory grew before the failure (\"{said}\"): host memory kept across steps or epochs (a growing list of outputs or metrics, a cache, data-loader workers copying the dataset) is the usual cause"),
        (None, Some(step)) => format!("the host ran out at step {step}, after training had run: host memory that grows step by step is the usual cause"),
        _ => return None,
    };
    Some(ctx.cause(
        CauseKind::MemoryLeak,
        None,
        evidence,
        vec![
            "Record the process's resident memory over steps (hbm-doctor record --pid PID -o run.jsonl records the trainer's RSS; or log psutil.Process().memory_info().rss in the loop) and run hbm-doctor trend on it: steady growth is a leak.".into(),
            "Keep nothing per step on the host that is never freed (outputs, losses as tensors, a growing cache); with many data-loader workers, keep the dataset in shared or memory-mapped storage, not in Python lists each worker copies.".into(),
        ],
        Vec::new(),
    ))
}

fn runtime_spike(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let near = match (e.near.as_deref(), e.stage) {
        (Some(n), _) => n,
        (None, Some(Stage::Eval)) => "eval",
        (None, Some(Stage::CheckpointSave)) => "checkpoint",
        _ => return None,
    };
    if e.phase != Phase::Runtime {
        return None;
    }
    let (cause, what) = match near {
        "recompil" | "compiling" => (CauseKind::Recompilation, "a new program was being compiled (new shapes or a missing mark_step): its executable and buffers joined the training step's"),
        "eval" => (CauseKind::MemorySpike, "an evaluation was running: its program and batch were loaded beside the training state"),
        _ => (CauseKind::MemorySpike, "a checkpoint was being saved: its gathered or copied arrays were live beside the training state"),
    };
    let at = e.step.map(|s| format!(" at step {s}")).unwrap_or_default();
    let mut actions = match cause {
        CauseKind::Recompilation => vec![
            "Keep shapes static: pad the last batch (drop_remainder), bucket sequence lengths, and check the compile count (PyTorch/XLA: metrics report CompileTime / UncachedCompile; JAX: jax.config.update('jax_log_compiles', True)).".into(),
            "PyTorch/XLA: call xm.mark_step() (torch_xla.sync()) once per step so graphs do not grow.".into(),
        ],
        _ => vec![
            "Free or donate what training holds during the spike: run evaluation with a smaller batch, under the same mesh, and without keeping optimizer state copies; save checkpoints asynchronously (orbax) or shard-by-shard instead of gathering whole arrays.".into(),
        ],
    };
    // PyTorch's evaluation without `no_grad` builds the autograd graph of every forward pass
    // and keeps its activations, as training does: the commonest spike at evaluation there.
    if near == "eval" && !ctx.jax && !ctx.tf && !ctx.ptxla {
        actions.insert(0, "PyTorch: run evaluation under torch.no_grad() (or torch.inference_mode()) with model.eval(), and accumulate metrics with loss.item() / .detach().cpu(), never the tensors themselves.".into());
    }
    actions
        .push("Record memory over steps (hbm-doctor record) to see the jump and its size.".into());
    Some(ctx.cause(
        cause,
        None,
        format!("the log shows the failure{at} while {what}"),
        actions,
        Vec::new(),
    ))
}

/// A runtime failure while the model's parameters were created, placed or loaded: nothing but
/// the model state is allocated yet, so the state itself does not fit.
fn model_state_at_load(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    // A serving engine's KV-cache check at start-up comes after the weights are placed: the
    // cache, not the model state, is what its message sizes (`vllm_kv_cache`). Nor is a TPU
    // program's load (`Error loading program ...: Attempting to reserve N`): the arrays are
    // placed, and the program's own reservation finds no room beside them.
    if e.phase != Phase::Runtime || matches!(e.family, Family::VllmKvCache | Family::TpuProgramLoad)
    {
        return None;
    }
    let what = match e.stage? {
        Stage::Init => "creating or placing the model's parameters",
        Stage::Restore => "loading a checkpoint or pretrained weights",
        _ => return None,
    };
    let figures = match (e.requested_bytes, e.limit_bytes) {
        (Some(r), Some(l)) => format!(" ({} requested of {})", fmt(r), fmt(l)),
        (Some(r), None) => format!(" ({} requested)", fmt(r)),
        _ => String::new(),
    };
    Some(ctx.cause(
        CauseKind::ArgumentsExceed,
        None,
        format!("the failure came while {what}{figures}, before any training step: the model state alone does not fit the device as it is placed"),
        vec![
            "Create or load the parameters already sharded over the devices (FSDP), instead of whole on one device and then split: jax.jit(init_fn, out_shardings=...) / orbax restore with the target shardings; PyTorch/XLA: FSDPv2 or xs.mark_sharding before moving weights.".into(),
            "Load weights in bf16 (or int8 for inference), and keep optimizer state sharded or on the host.".into(),
            "Check that nothing else holds the device (a second process, arrays of a previous run in the same notebook).".into(),
            "If the state is simply larger than the devices: more chips, or a generation with more HBM per device.".into(),
        ],
        ctx.snippets(
            "params = jax.jit(model.init, out_shardings=param_shardings)(rng, x)  # born sharded\nstate = ckptr.restore(path, args=ocp.args.StandardRestore(abstract_state_with_shardings))",
            "model = FSDPv2(model)  # shard before the weights reach the device\nmodel = AutoModel.from_pretrained(name, torch_dtype=torch.bfloat16)",
        ),
    ))
}

/// The model named in the text (`Mistral-7B`, `gpt-neo-2.7B`) holds, at the stated weight
/// precision (16-bit when unstated: a lower bound), most of the device: its weights alone are the
/// story, whatever the batch. `true` when they exceed the device.
fn model_weights(ctx: &Ctx<'_>) -> Option<(Cause, bool)> {
    let e = ctx.e;
    let params = e.model_params?;
    let bits = e.param_bits.unwrap_or(16);
    let weights = params.saturating_mul(u64::from(bits)) / 8;
    let tpu = e
        .accelerator
        .as_deref()
        .and_then(chips::tpu_by_name)
        .map(|t| (t.usable_bytes, t.long_name));
    // The device's limit as printed, else a TPU the text names, else a GPU the text names or
    // sizes (`12GB of vram`, `RTX 3070`): the weights are measured against the card either way.
    let gpu_named = e
        .device_named_bytes
        .filter(|_| e.memory_space != Some(MemorySpace::Host) && tpu.is_none());
    let (capacity, of) = match (ctx.limit, tpu, gpu_named) {
        (Some(l), _, _) if e.memory_space != Some(MemorySpace::Host) => {
            (l, "the device".to_string())
        }
        (_, Some((u, name)), _) => (u, format!("one {name} device")),
        // Several cards the text says the run uses hold the weights between them.
        (_, _, Some(d)) => match e.devices_named {
            Some(n) => (
                d.saturating_mul(u64::from(n)),
                format!("the {n} GPUs the text names"),
            ),
            None => (d, "the GPU the text names".to_string()),
        },
        _ => return None,
    };
    if weights.saturating_mul(10) < capacity.saturating_mul(8) {
        return None;
    }
    let over = weights >= capacity;
    let precision = match e.param_bits {
        Some(b) => format!("at {b} bits per weight"),
        None => "at 16 bits per weight (at least; the text states no dtype)".into(),
    };
    let billions = params as f64 / 1e9;
    Some((
        ctx.cause(
            CauseKind::ArgumentsExceed,
            over.then(|| weights - capacity),
            format!(
                "the text names a {billions}B-parameter model: {precision} its weights alone are {}, {} of the {} of {of}{}",
                fmt(weights),
                pct(weights, capacity),
                fmt(capacity),
                if over { ": the model does not fit before any activation" } else { ": little is left for activations, gradients or a KV cache" }
            ),
            vec![
                format!("Fit the weights first: {}-bit weights need {}; 8-bit {}, 4-bit {} (quantization: load_in_8bit / AWQ / GPTQ for inference).", bits.min(16), fmt(params.saturating_mul(u64::from(bits.min(16))) / 8), fmt(params), fmt(params / 2)),
                "Or shard the weights over more devices (tensor parallelism / FSDP: tensor_parallel_size in vLLM, jax.sharding over a mesh), or use a device with more memory.".into(),
                "Training needs 3-4x the weights on top (gradients, Adam moments): shard or offload the optimizer state.".into(),
            ],
            Vec::new(),
        ),
        over,
    ))
}

/// Inference: the KV cache and logits grow with batch x sequence length.
fn generation_memory(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.stage != Some(Stage::Generation) || e.phase != Phase::Runtime {
        return None;
    }
    Some(ctx.cause(
        CauseKind::BatchTooLarge,
        None,
        "the traceback shows the failure during generation: the KV cache and the logits grow with batch size x sequence length".into(),
        vec![
            "Lower the generation batch or the maximum sequence length (max_new_tokens, max_model_len), or keep the KV cache in bf16/int8.".into(),
            "vLLM: lower gpu_memory_utilization only if another process shares the device; otherwise lower max_num_seqs / max_model_len.".into(),
        ],
        Vec::new(),
    ))
}

/// A runtime failure inside a training step with no sign of growth before it: the step's
/// activations at this batch do not fit.
fn runtime_step_batch(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.phase != Phase::Runtime
        || !(matches!(
            ctx.category,
            Category::RuntimeAllocation | Category::SingleLargeAllocation | Category::Unknown
        ) || (ctx.category == Category::HostMemory && e.family == Family::TfOomTensor))
        || e.step.is_some_and(|s| s >= 100)
    {
        return None;
    }
    // The tensor that failed (TensorFlow prints its shape): its leading dimension is the batch.
    let tensor = e
        .allocations
        .iter()
        .filter(|a| a.allocation_type.as_deref() == Some("tensor"))
        .find_map(|a| shape_of(a).filter(|s| s.dims.len() >= 2).map(|s| (a, s)));
    // One sample's tensor (`[1, ...]`): the batch is already 1 (`one_sample_tensor`).
    if tensor
        .as_ref()
        .is_some_and(|(_, s)| s.dims[0] == 1 && s.dims.len() >= 3)
    {
        return None;
    }
    let evidence = match (&tensor, e.stage) {
        (Some((a, s)), _) => format!(
            "the allocation that failed is {} ({}), whose leading dimension {} is the batch in a framework's activation layout",
            a.shape.as_deref().unwrap_or(""),
            fmt(a.size_bytes),
            s.dims[0]
        ),
        (None, Some(Stage::Train)) => "the traceback shows the failure inside a training step, with no sign of growth before it: the step's activations at this batch size do not fit".into(),
        _ => return None,
    };
    let mut actions = Vec::new();
    if let Some((_, s)) = &tensor {
        let b = s.dims[0];
        if b >= 2 {
            actions.push(format!(
                "Halve the batch ({b} -> {}), or keep it and accumulate gradients over 2 micro-batches.",
                b / 2
            ));
        }
    } else {
        actions.push("Halve the per-device batch (or the sequence length).".into());
    }
    Some(ctx.cause(
        CauseKind::BatchTooLarge,
        None,
        evidence,
        actions,
        Vec::new(),
    ))
}

/// The tensor that failed (TensorFlow's `OOM when allocating tensor with shape[...]`) and its
/// parsed shape.
fn failed_tensor(e: &Event) -> Option<(&Allocation, Shape)> {
    e.allocations
        .iter()
        .filter(|a| a.allocation_type.as_deref() == Some("tensor"))
        .find_map(|a| shape_of(a).map(|s| (a, s)))
}

/// The tensor that failed is float64 (`type double`): NumPy's default type, not a model's (float32
/// or lower), so it is input data converted whole from a NumPy array (Keras copies NumPy inputs
/// to the device and slices `validation_split` there), not an activation.
fn numpy_input_tensor(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.phase != Phase::Runtime || e.framework == Some(Framework::Jax) {
        return None;
    }
    let (a, s) = failed_tensor(e)?;
    if s.type_name != "f64" || s.dims.len() < 2 {
        return None;
    }
    Some(ctx.cause(
        CauseKind::ArgumentsExceed,
        None,
        format!(
            "the tensor that failed, {} ({}), is float64, NumPy's default type and no model's: input data converted whole from a NumPy array onto the device",
            a.shape.as_deref().unwrap_or(""),
            fmt(a.size_bytes)
        ),
        vec!["Feed the data in batches instead of whole arrays: tf.data.Dataset.from_tensor_slices((x, y)).batch(n) (or a generator), split validation data yourself instead of validation_split, and convert it to float32 (x.astype('float32')).".into()],
        Vec::new(),
    ))
}

/// The tensor that failed holds one sample (`[1, H, W, C]`, `[1, D, H, W, C]`): the batch is
/// already 1, so one input's own activation does not fit (its resolution, volume or length).
/// In the labelled posts with such a tensor the threads answered the input's size 4 times, the
/// card once, the batch once.
fn one_sample_tensor(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.phase != Phase::Runtime {
        return None;
    }
    let (a, s) = failed_tensor(e)?;
    if s.dims.len() < 3 || s.dims[0] != 1 {
        return None;
    }
    Some(ctx.cause(
        CauseKind::LargeActivation,
        None,
        format!(
            "the tensor that failed, {} ({}), holds one sample: the batch is already 1, so a single input's activation is what does not fit",
            a.shape.as_deref().unwrap_or(""),
            fmt(a.size_bytes)
        ),
        vec!["Make one input smaller: process it in tiles or patches (overlapping, stitched after), lower its resolution or crop it, and run in float16/bfloat16; a card with more memory is the alternative.".into()],
        Vec::new(),
    ))
}

/// A program whose stated parameters and outputs are most of its total allocation (XLA:GPU's
/// BufferAssignment stats): its state, not its temporaries, is what does not fit.
fn state_heavy_program(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let total = ctx.used?;
    let state = e.arguments_bytes?.saturating_add(
        e.output_bytes
            .unwrap_or(0)
            .saturating_sub(e.output_aliased_bytes.unwrap_or(0)),
    );
    if (state as f64) < total as f64 * 0.5 || ctx.category == Category::Arguments {
        return None;
    }
    let fits = chips::tpus_that_fit(total);
    Some(ctx.cause(
        CauseKind::DeviceTooSmall,
        None,
        format!("parameters and outputs take {} of the program's {} ({}): what it must hold, not what it computes, fills the device", fmt(state), fmt(total), pct(state, total)),
        vec![
            "Run on a device with more memory, or shard the inputs/outputs over several devices.".into(),
            "If the outputs are large results (predictions, structures), produce them in chunks and move each to the host.".into(),
        ]
        .into_iter()
        .chain(fits.first().map(|f| format!("On TPU, one device of {f} holds it.")))
        .collect(),
        Vec::new(),
    ))
}

/// PyTorch's caching allocator holds, reserved but unallocated, what the request lacks: free
/// device memory plus those idle blocks would serve it, and the idle blocks are a real share of
/// the device and of what PyTorch holds. PyTorch frees its wholly idle segments and retries
/// before it raises, so what is still idle then sits in segments split by live blocks (what
/// `expandable_segments` fixes).
fn torch_cache_fragmentation(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.family != Family::PytorchCudaOom {
        return None;
    }
    let (r, idle, l) = (e.requested_bytes?, e.fragmentation_bytes?, e.limit_bytes?);
    let free = e.free_bytes.unwrap_or(0);
    // "If reserved memory is >> allocated memory": idle blocks a real share of what PyTorch holds.
    let reserved = e.process_bytes.unwrap_or(l);
    // A request of a quarter of the card or more is the story itself, split blocks or not.
    let split = r.saturating_mul(4) < l
        && idle.saturating_add(free) >= r
        && idle as f64 >= l as f64 * 0.05
        && idle as f64 >= reserved as f64 * 0.1;
    if !split {
        return None;
    }
    Some(ctx.cause(
        CauseKind::Fragmentation,
        Some(r),
        format!("PyTorch holds {} reserved but unallocated{}, enough for the {} requested: its cached blocks are split into pieces too small for the request", fmt(idle), e.free_bytes.filter(|&f| f > 0).map(|f| format!(" beside {} free on the device", fmt(f))).unwrap_or_default(), fmt(r)),
        vec![
            "Let the allocator grow segments instead of splitting them: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb:128 on older PyTorch).".into(),
            "Avoid many differently sized allocations per step (variable sequence lengths: pad or bucket them); call torch.cuda.empty_cache() only between phases (train/eval), not every step.".into(),
        ],
        Vec::new(),
    ))
}

/// CUDA could not even create a library handle (cuDNN, cuBLAS) or initialise: the device was
/// already full before the program allocated anything, usually because a framework
/// preallocated it (JAX takes 75% by default) or another process holds it.
/// What to run to see who holds a device: the action every `other_process` rule names.
const LIST_DEVICE_HOLDERS: &str = "List what holds the device (nvidia-smi --query-compute-apps=pid,used_memory --format=csv; tpu-info or lsof /dev/accel* on TPU): another process, a notebook kernel still alive, a second framework preallocating; stop it, or run on a free device (CUDA_VISIBLE_DEVICES set before the framework is imported).";

/// A CUDA library could not create its handle or load its code: the device was full before the
/// program allocated anything.
fn starved_library_handle(e: &Event) -> bool {
    let m = e.message.to_ascii_lowercase();
    // cuBLAS/cuDNN `STATUS_ALLOC_FAILED`: the library's own handle or workspace, allocated
    // outside the framework's pool, found no room.
    // `Failed to load in-memory CUBIN: CUDA_ERROR_OUT_OF_MEMORY`: not even a kernel's code fit.
    let init = m.contains("handle")
        || m.contains("cubin")
        || m.contains("cuinit")
        || m.contains("initializ")
        || m.contains("status_alloc_failed")
        // An autotuner that could not get workspace for a single algorithm (`Failed to determine
        // best cudnn convolution algorithm`, cuBLAS's `GetBlasGemmAlgorithms` RET_CHECK).
        || m.contains("convolution algorithm")
        || m.contains("getblasgemmalgorithms");
    let cuda = m.contains("cuda")
        || m.contains("cudnn")
        || m.contains("cublas")
        || m.contains("cusolver")
        || m.contains("blasgemm");
    // A CUDA library's own call inside a custom call (`CustomCall failed:
    // jaxlib/cuda/cusolver_kernels.cc:79: operation cudaMemcpyAsync(...) failed: out of memory`):
    // its workspace lives outside the framework's pool, in what the pool left.
    let library_call = m.contains("customcall failed")
        && ["cusolver", "cublas", "cudnn", "cufft", "cusparse"]
            .iter()
            .any(|l| m.contains(l));
    (init && cuda || library_call) && e.phase == Phase::Runtime
}

fn cuda_init_starved(ctx: &Ctx<'_>) -> Option<Cause> {
    if !starved_library_handle(ctx.e) {
        return None;
    }
    Some(ctx.cause(
        CauseKind::Preallocation,
        None,
        "CUDA could not create a library handle: the device was full before the program allocated anything; a framework's preallocated pool (JAX takes 75% by default, TensorFlow all of it) or another process holds the memory".into(),
        vec![
            "Let frameworks allocate on demand: XLA_PYTHON_CLIENT_PREALLOCATE=false (JAX), tf.config.experimental.set_memory_growth (TensorFlow); or lower XLA_PYTHON_CLIENT_MEM_FRACTION so the libraries keep room.".into(),
            "Check for another process on the GPU (nvidia-smi) and for two frameworks in one process each preallocating.".into(),
        ],
        Vec::new(),
    ))
}

/// The same starved library handle, from the other side: when no framework of this process is
/// shown preallocating, the memory may be held by another process (a second trainer, a notebook
/// kernel still alive, a colleague's job on a shared GPU).
fn cuda_init_other_process(ctx: &Ctx<'_>) -> Option<Cause> {
    if !starved_library_handle(ctx.e) {
        return None;
    }
    Some(ctx.cause(
        CauseKind::OtherProcess,
        None,
        "CUDA could not create a library handle before the program allocated anything: if no framework of this process preallocated the device, another process holds it".into(),
        vec![LIST_DEVICE_HOLDERS.into()],
        Vec::new(),
    ))
}

/// PyTorch says the process holds much more than PyTorch itself accounts for: another allocator
/// in the same process (XLA's client, JAX, TensorFlow) preallocated its pool.
fn other_allocator_in_process(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.family != Family::PytorchCudaOom {
        return None;
    }
    let (process, l) = (e.process_bytes?, e.limit_bytes?);
    let torch_mem = e.allocated_bytes.filter(|&u| u < process)?;
    let torch_mem = torch_mem + e.fragmentation_bytes.unwrap_or(0);
    let other = process.saturating_sub(torch_mem);
    if (other as f64) < l as f64 * 0.25 {
        return None;
    }
    Some(ctx.cause(
        CauseKind::Preallocation,
        Some(other),
        format!("the process holds {} but PyTorch accounts for {}: {} belongs to another allocator in the same process (an XLA/JAX client preallocating its pool, TensorFlow)", fmt(process), fmt(torch_mem), fmt(other)),
        vec!["Stop the other runtime from preallocating: XLA_PYTHON_CLIENT_PREALLOCATE=false or XLA_PYTHON_CLIENT_MEM_FRACTION=.3 (PJRT/JAX), set_memory_growth (TensorFlow); or keep one framework per process.".into()],
        Vec::new(),
    ))
}

/// vLLM cannot size its KV cache: the pool `gpu_memory_utilization` gives it is too small for
/// the weights, the activation profile and the cache `max_model_len` asks for.
fn vllm_kv_cache(ctx: &Ctx<'_>) -> Vec<(f64, Cause)> {
    let e = ctx.e;
    if e.family != Family::VllmKvCache {
        return Vec::new();
    }
    // The cache cannot hold one request of the model's maximum length (both message forms: in
    // tokens, or `X GiB KV cache is needed` against what is available).
    let length = e.message.starts_with("max model length") || e.requested_bytes.is_some();
    let pool = ctx.cause(
        CauseKind::Preallocation,
        None,
        "vLLM sizes the KV cache from what is left of gpu_memory_utilization x the GPU after the weights and a profiling run: too little is left".into(),
        vec![
            "Raise gpu_memory_utilization (e.g. 0.90 -> 0.95) if nothing else shares the GPU; lower it if another process does.".into(),
        ],
        Vec::new(),
    );
    // What a serving engine holds per request (max_model_len x max_num_seqs) is its batch.
    let cache = ctx.cause(
        CauseKind::BatchTooLarge,
        None,
        format!("the KV cache grows with max_model_len x max_num_seqs{}", if length { &e.message[..] } else { "" }.replace("max model length", ": max model length")),
        vec!["Lower max_model_len (the longest context you serve) or max_num_seqs; use a KV-cache dtype of fp8.".into()],
        Vec::new(),
    );
    let weights = ctx.cause(
        CauseKind::ArgumentsExceed,
        None,
        "the model's weights leave too little of the GPU for the cache".into(),
        vec!["Shard the model over more GPUs (tensor_parallel_size) or serve a quantized checkpoint.".into()],
        Vec::new(),
    );
    if length {
        vec![(2.4, cache), (2.2, pool), (1.0, weights)]
    } else {
        vec![(2.4, pool), (2.0, cache), (1.5, weights)]
    }
}

/// The text around the failure names a setting that caps the allocator's pool: it decides how
/// much the program may use before anything else does.
fn pool_named(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let setting = e.pool_setting.as_deref()?;
    if e.family == Family::VllmKvCache {
        return None; // vllm_kv_cache() says it with the cache's figures
    }
    // Preallocation already turned off: the pool is not what ran out.
    if setting.ends_with("PREALLOCATE=false") {
        return None;
    }
    let knob = setting.split(['=', ' ']).next().unwrap_or(setting);
    let advice = match knob {
        "set_per_process_memory_fraction" if fraction_capped(e) => "PyTorch's caching allocator is capped by torch.cuda.set_per_process_memory_fraction (the message's `allowed` figure), far below what the device has free: raise the fraction, or remove the call (a test harness or launcher may set it for you).",
        "gpu_memory_utilization" | "gpu-memory-utilization" => "vLLM reserves gpu_memory_utilization x the device for weights and the KV cache up front: lower it to leave room for programs loaded later (or raise it when the KV cache is what does not fit); keep max_model_len no larger than you serve.",
        "XLA_PYTHON_CLIENT_MEM_FRACTION" | "XLA_PYTHON_CLIENT_PREALLOCATE" | "set_per_process_memory_fraction" | "per_process_gpu_memory_fraction" => "The pool fraction caps what the process may use: give it more of the device (XLA_PYTHON_CLIENT_MEM_FRACTION=.95) when nothing else shares it, or XLA_PYTHON_CLIENT_PREALLOCATE=false to allocate on demand.",
        "TF_FORCE_UNIFIED_MEMORY" => "With unified memory the pool may grow past the GPU into host RAM, but only up to XLA_PYTHON_CLIENT_MEM_FRACTION x the GPU's memory (AlphaFold sets 4.0): a request larger than that needs a larger fraction, and runs at host-memory speed.",
        "XLA_PYTHON_CLIENT_ALLOCATOR" => "The allocator setting decides how the pool grows: XLA_PYTHON_CLIENT_ALLOCATOR=platform allocates on demand (no BFC pool, no fragmentation, slower); remove it to get the preallocated pool back.",
        _ => "Remove or raise the cap unless another program must share the device.",
    };
    Some(ctx.cause(
        CauseKind::Preallocation,
        None,
        format!("the text around the failure sets `{setting}`, which caps the allocator's pool: what is left outside it (or inside it) decides this failure"),
        vec![advice.into()],
        Vec::new(),
    ))
}

/// TensorRT building or running an engine: it allocates from a workspace pool whose size the
/// user sets (the builder's memory pool limit, ONNX Runtime's `trt_max_workspace_size`), and an
/// engine's tactics or execution context that do not fit what is free fail at that allocation.
/// The labelled TensorRT failures were settled by the workspace setting 4 times in 5 (the batch
/// of the optimization profile once).
fn tensorrt_workspace(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let m = e.message.as_str();
    let trt = [
        "[TRT]",
        "TensorRT",
        "tensorrt",
        "safeRuntime.cpp",
        "nvinfer1",
        "defaultAllocator.cpp",
        "executionContext.cpp",
    ]
    .iter()
    .any(|k| m.contains(k));
    // TensorRT-LLM's runtime sizes its buffers and KV cache by its own settings (the batch, the
    // KV cache fraction), not by a builder's workspace.
    let llm = ["TensorRT-LLM", "tensorrt_llm", "trtllm"]
        .iter()
        .any(|k| m.contains(k));
    if !trt || llm || e.backend == Some(Backend::Tpu) || e.memory_space == Some(MemorySpace::Host) {
        return None;
    }
    Some(ctx.cause(
        CauseKind::Preallocation,
        None,
        "TensorRT allocates an engine's tactics and its execution context from a workspace pool whose size is set by the user: the allocation that failed is TensorRT's, sized by that setting against what the GPU had free".into(),
        vec![
            "Set TensorRT's workspace to what the GPU has free: IBuilderConfig.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, N) (max_workspace_size before TensorRT 8.4), trtexec --memPoolSize=workspace:N, ONNX Runtime's trt_max_workspace_size; close other programs on the GPU while the engine builds.".into(),
            "If the engine still does not fit, lower the optimization profile's maximum batch / shapes (profile.set_shape) or build in FP16.".into(),
        ],
        Vec::new(),
    ))
}

/// A TPU limit that is no generation's usable HBM: a flag or runtime setting caps it.
fn hbm_cap(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.phase != Phase::Compile
        || e.memory_space != Some(MemorySpace::Hbm)
        || e.backend != Some(Backend::Tpu)
        || e.family == Family::TpuCompileHbmOld
    {
        return None;
    }
    let l = ctx.limit?;
    // Older compilers printed the physical size (8G on a v2 core, 16G on a v3 core).
    let physical = [8u64, 16, 32, 95, 96, 192].iter().any(|&g| l == g << 30);
    if chips::usable_match(l).is_some() || physical {
        return None;
    }
    const MIB256: u64 = 256 << 20;
    let gib = 1u64 << 30;
    if !(l % MIB256 == 0 || l < 7 * gib) {
        return None;
    }
    let physical = chips::tpus_that_fit(0);
    Some(ctx.cause(
        CauseKind::Preallocation,
        ctx.exceeded,
        format!(
            "the limit {} is not the usable HBM of any TPU generation ({}): a flag such as --xla_tpu_max_hbm_size_mib (in LIBTPU_INIT_ARGS) or a memory fraction caps what the program may use",
            fmt(l),
            physical.join(", ")
        ),
        vec!["Remove the cap (unset --xla_tpu_max_hbm_size_mib in LIBTPU_INIT_ARGS, or raise it) unless another program must share the chip.".into()],
        Vec::new(),
    ))
}

/// A GPU program that fails while its model is being created (a constructor, `.cuda()`, a
/// variable's initializer) with nothing in the text that shows a large model: no model size, no
/// request that is itself a large share of the device, and no figure that shows this process
/// already filling it. Models that do not fit announce themselves (a size in the text, a request
/// of hundreds of MiB, the process's own allocation near the limit); a small model that cannot
/// even be created finds the card already taken: the threads answer "another process" (a second
/// job, a notebook kernel, the other GPU) about twice as often as "the model is too big".
///
/// `true` with it when the one request is tiny beside the card the text names (5% of it), or
/// under a MiB: the card was surely held.
fn gpu_held_at_model_creation(ctx: &Ctx<'_>) -> Option<(Cause, bool)> {
    let e = ctx.e;
    // A GPU, or a device the text does not name (a TPU or the host says so).
    let gpu = e.backend == Some(Backend::Gpu)
        || (e.backend.is_none()
            && matches!(e.memory_space, None | Some(MemorySpace::Device))
            && e.accelerator.is_none());
    // (A serving engine's KV-cache check at start-up is not the model's creation.)
    if e.phase != Phase::Runtime
        || e.stage != Some(Stage::Init)
        || !gpu
        || e.model_params.is_some()
        || e.family == Family::VllmKvCache
    {
        return None;
    }
    let device = ctx.limit.or(e.device_named_bytes);
    // The largest single request the text shows (a TF tensor's shape, when no byte count).
    let request = e
        .requested_bytes
        .into_iter()
        .chain(e.allocations.iter().map(|a| a.size_bytes))
        .max();
    let large_request = match (request, device) {
        (Some(r), Some(d)) => r.saturating_mul(20) > d,
        (Some(r), None) => r >= 64 << 20,
        (None, _) => false,
    };
    // The process's own allocations (PyTorch's `already allocated`, BFC's `InUse`) near the
    // device: this program filled it.
    let own = e.allocated_bytes.or(e.used_bytes);
    let own_fills = own
        .zip(device)
        .is_some_and(|(u, d)| u.saturating_mul(2) >= d);
    if large_request || own_fills {
        return None;
    }
    let small = e.limit_bytes.is_none()
        && e.requested_bytes
            .is_some_and(|r| match e.device_named_bytes {
                Some(d) => r.saturating_mul(20) <= d,
                None => r < 1 << 20,
            });
    let on = e
        .device_named_bytes
        .map(|d| format!(", on a GPU the text names as {}", fmt(d)))
        .unwrap_or_default();
    let what = match request {
        Some(r) => format!("only {} was requested{on}", fmt(r)),
        None => format!("no large request or model size is shown{on}"),
    };
    Some((
        ctx.cause(
            CauseKind::OtherProcess,
            None,
            format!("the failure came while the model was being created and {what}: a model that cannot even be created on an idle card is large and says so; check first whether the card was already held"),
            vec![
                LIST_DEVICE_HOLDERS.into(),
                "On a machine with several GPUs, pick an idle one (CUDA_VISIBLE_DEVICES=1, `-gpu 1`, torch.device(\"cuda:1\")).".into(),
            ],
            Vec::new(),
        ),
        small,
    ))
}

/// What the process already holds on a GPU exceeds the card itself (`20.58 GiB already
/// allocated` on a `6.00 GiB total capacity` card: the Windows driver spills into shared system
/// memory): the model's own state does not fit the card, before any step's activations, and a
/// smaller batch cannot change that.
fn held_beyond_card(ctx: &Ctx<'_>) -> Vec<(f64, Cause)> {
    let e = ctx.e;
    let (Some(used), Some(l)) = (e.allocated_bytes.or(e.used_bytes), e.limit_bytes) else {
        return Vec::new();
    };
    if e.phase != Phase::Runtime
        || e.backend != Some(Backend::Gpu)
        || used.saturating_mul(10) <= l.saturating_mul(11)
    {
        return Vec::new();
    }
    let said = format!(
        "the process already holds {} on a {} card: what it keeps resident (the model's weights and state) does not fit the card, and the driver spills it into system memory",
        fmt(used),
        fmt(l)
    );
    vec![
        (
            3.0,
            ctx.cause(
                CauseKind::DeviceTooSmall,
                Some(used - l),
                said.clone(),
                vec![
                    "Use a GPU with more memory than the model needs resident, or a smaller or quantized model (8-bit / 4-bit weights, fp16 instead of fp32).".into(),
                ],
                Vec::new(),
            ),
        ),
        (
            2.9,
            ctx.cause(
                CauseKind::ArgumentsExceed,
                Some(used - l),
                said,
                vec![
                    "Keep less of the model state on the card: CPU offload of weights or optimizer state (accelerate device_map='auto', DeepSpeed ZeRO offload, enable_sequential_cpu_offload in diffusers).".into(),
                ],
                Vec::new(),
            ),
        ),
    ]
}

/// PyTorch on Apple silicon (`MPS backend out of memory (MPS allocated: X, other allocations: Y,
/// max allowed: Z)`): the limit is a high watermark over the Mac's unified memory, shared with the
/// system and every other application. The threads answered the machine's memory (a smaller
/// model, a Mac with more memory) in all three labelled posts, first in two; the watermark
/// (`PYTORCH_MPS_HIGH_WATERMARK_RATIO`) in one.
fn apple_unified_memory(ctx: &Ctx<'_>) -> Vec<(f64, Cause)> {
    let e = ctx.e;
    if e.device.as_deref() != Some("mps") || e.phase != Phase::Runtime {
        return Vec::new();
    }
    let allowed = e
        .limit_bytes
        .map(|l| format!(" (max allowed {})", fmt(l)))
        .unwrap_or_default();
    vec![
        (
            1.5,
            ctx.cause(
                CauseKind::DeviceTooSmall,
                None,
                format!("an Apple GPU (MPS) ran out of the Mac's unified memory{allowed}, which the system and other applications share: the model and its activations need more than this machine has"),
                vec![
                    "Use a smaller or quantized model, fp16 weights (model.half()), a smaller image or sequence, or a Mac (or a GPU) with more memory; close other applications.".into(),
                ],
                Vec::new(),
            ),
        ),
        (
            1.0,
            ctx.cause(
                CauseKind::Preallocation,
                None,
                format!("the limit{allowed} is PyTorch's high watermark on MPS, a share of the unified memory"),
                vec![
                    "Raise it (PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 disables the cap; the system may then swap or freeze), or lower what the program holds.".into(),
                ],
                Vec::new(),
            ),
        ),
    ]
}

/// A GPU of 2 GiB or so (a laptop's or an old card: PyTorch's "1.96 GiB total capacity"): the
/// CUDA context and the libraries' workspaces take a large share of it, and models of the last
/// years do not fit at any batch; maintainers answer "the card is too small". A card of up to
/// 4.5 GiB (stated by the message or named by the text) is a candidate too, not the lead.
fn small_gpu(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let l = e.limit_bytes.or(e.device_named_bytes)?;
    if e.phase != Phase::Runtime
        || e.backend != Some(Backend::Gpu)
        || l > 9 << 29
        || sliver_pool(ctx).is_some()
    {
        return None;
    }
    Some(ctx.cause(
        CauseKind::DeviceTooSmall,
        None,
        if l <= 5 << 29 {
            format!("the GPU has {} in all: the CUDA context and cuDNN/cuBLAS workspaces take a large share of that, and most current models do not fit it at any batch", fmt(l))
        } else {
            format!("the GPU has {} in all (a laptop's or an entry card's): after the CUDA context, a model and one input at full size may not fit it even at batch 1", fmt(l))
        },
        vec![
            "Run on a GPU with 8 GiB or more (a cloud or Colab GPU), or on the CPU for small experiments.".into(),
            "If the card must do: a smaller model variant, half precision (model.half() / bf16), batch 1 with gradient accumulation, smaller inputs (image size, sequence length).".into(),
        ],
        Vec::new(),
    ))
}

/// One allocation larger than the platform lets a single buffer be: the message states the cap
/// (Intel XPU's `can NOT allocate memory block with size larger than 4GB`, Metal's `must not
/// exceed 2048 MB`, MLX's `maximum allowed buffer size`), or the device is empty (next to nothing
/// allocated) with more free than the request and it still fails: nothing was allocated to
/// fragment it, so a per-allocation cap (or a runtime's smaller view of the device) refused it.
fn allocation_cap(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    if e.phase != Phase::Runtime {
        return None;
    }
    let m = &e.message;
    let stated = m.contains("one block may not exceed")
        || m.contains("must not exceed")
        || m.contains("maximum allowed buffer size")
        // Intel's XPU runtime: `Current platform can NOT allocate memory block with size larger
        // than 4GB!`
        || m.contains("allocate memory block with size larger than");
    let r = e.requested_bytes?;
    let empty = e
        .free_bytes
        .zip(e.used_bytes.or(e.allocated_bytes))
        .zip(ctx.limit)
        .is_some_and(|((f, u), l)| f >= r && u.saturating_mul(100) < l);
    // (A memory fraction PyTorch names, `8.27 GiB allowed;`, is the cap: `pool_named`'s.)
    let fraction = e
        .pool_setting
        .as_deref()
        .is_some_and(|p| p.contains("allowed"));
    if !stated && (!empty || fraction) {
        return None;
    }
    let evidence = if stated {
        format!("the runtime refuses one buffer of {}: the platform caps a single allocation below that", fmt(r))
    } else {
        format!(
            "{} requested with {} free and next to nothing allocated: nothing fragments an empty device, so the runtime caps one allocation below the request (or sees less of the device than it has)",
            fmt(r),
            e.free_bytes.map(fmt).unwrap_or_default()
        )
    };
    Some(ctx.cause(
        CauseKind::DeviceTooSmall,
        None,
        evidence,
        vec![
            "Split the tensor so that no single buffer reaches the cap (compute it in chunks, shard it, or keep it on the host).".into(),
            "Or use a runtime or device without this per-allocation cap (Intel XPU: check the driver's large-allocation support; ROCm APUs: the GTT / VRAM carve-out set in the BIOS; Apple: Metal's maximum buffer length).".into(),
        ],
        Vec::new(),
    ))
}

/// A TensorFlow or XLA GPU allocator whose whole pool (its `Limit`) is under 1 GiB: no GPU that
/// runs these frameworks is that small, so the process got only the sliver left free when it
/// started (another process, a notebook kernel, a second framework in the same process) or a
/// memory fraction set that low.
fn sliver_pool(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let l = e.limit_bytes?;
    let pool = matches!(
        e.family,
        Family::BfcAllocator
            | Family::GpuOomAllocate
            | Family::GpuFailedRequest
            | Family::TfOomTensor
    );
    if e.phase != Phase::Runtime || e.backend != Some(Backend::Gpu) || !pool || l >= 1 << 30 {
        return None;
    }
    Some(ctx.cause(
        CauseKind::OtherProcess,
        None,
        format!("the allocator's whole pool is {}: no GPU is that small, so this process got only what was left free when it started, or a memory fraction set that low", fmt(l)),
        vec![
            "Check what holds the GPU before the run (nvidia-smi): another training or notebook kernel, a second framework in the same process (TensorFlow next to JAX or PyTorch); stop it or give each its share.".into(),
            "TensorFlow: look for per_process_gpu_memory_fraction / set_memory_growth / a logical device memory_limit set small; JAX: XLA_PYTHON_CLIENT_MEM_FRACTION.".into(),
        ],
        Vec::new(),
    ))
}

fn device_too_small(ctx: &Ctx<'_>) -> Option<Cause> {
    let e = ctx.e;
    let (u, l) = (ctx.used?, ctx.limit?);
    if u <= l || e.memory_space != Some(MemorySpace::Hbm) {
        return None;
    }
    let fits = chips::tpus_that_fit(u);
    let chips_needed = (u as f64 / (l as f64 * 0.9)).ceil() as u64;
    let mut actions = vec![format!("Spread the program over at least {chips_needed}x as many chips with model/FSDP sharding, so each holds its share.")];
    if !fits.is_empty() {
        actions.push(format!(
            "Or run on a chip with more HBM per device: {}.",
            fits.join(", ")
        ));
    }
    if u as f64 <= l as f64 * 1.2 {
        // The guide's section E: when the program is close to fitting, the compiler's
        // rematerialization can be pushed harder, at the cost of compile time and speed.
        actions.push(format!(
            "Last resort ({} over, within 20%): LIBTPU_INIT_ARGS='--xla_tpu_rematerialization_algo=PEAK_PRIORITY --xla_tpu_rematerialization_block_effort_factor=10.0' (or --xla_tpu_pre_fusion_remat=true); TPU flags go in LIBTPU_INIT_ARGS or jit(..., compiler_options=...), never XLA_FLAGS, which aborts on them.",
            fmt(u - l)
        ));
    }
    Some(ctx.cause(
        CauseKind::DeviceTooSmall,
        Some(u - l),
        format!("the program needs {} and the device has {}", fmt(u), fmt(l)),
        actions,
        Vec::new(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hbm_doctor_log::scan_all;

    fn causes(text: &str) -> (Category, Vec<CauseKind>) {
        let r = explain(scan_all(text.as_bytes()));
        let d = r.diagnosis.expect("diagnosis");
        (d.category, d.causes.iter().map(|c| c.cause).collect())
    }

    const ALLOC: &str = "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4294967296 bytes.";

    fn traceback(frames: &[(&str, &str)]) -> String {
        let mut t = String::from("Traceback (most recent call last):\n");
        for (func, code) in frames {
            t.push_str(&format!(
                "  File \"/home/u/train.py\", line 10, in {func}\n    {code}\n"
            ));
        }
        t.push_str(ALLOC);
        t.push('\n');
        t
    }

    #[test]
    fn a_scans_stacked_outputs_are_saved_activations_not_a_batch() {
        let head = "E1127 00:38:26.766193    3866 deepsea_compiler_base.cc:3781] XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 52.94G of 31.25G hbm. Exceeded hbm capacity by 21.69G. Memory usage report: \n\nMemory Space: default (color=0)\nTotal bytes: 56843419648 (52.94GiB)\n  cumulative_size;       size;       offset; used_by_n_values; shapes_list\n  ------------------------------------------------------------\n";
        let mut text = head.to_string();
        for k in 1..=6u64 {
            text.push_str(&format!(
                "   {}.00GiB( 15%);    8.00GiB;   {};                5; 5×bf16[16,32768,8192]\n",
                8 * k,
                8589934592 * (k - 1)
            ));
        }
        text.push_str(
            "   48.12GiB( 91%);  128.00MiB;  51539607552;                1; bf16[16,8192,512]\n",
        );
        let (_, c) = causes(&text);
        assert_eq!(c.first(), Some(&CauseKind::NoRemat), "{c:?}");
        // The layer count is not the batch.
        let r = explain(scan_all(text.as_bytes()));
        let d = r.diagnosis.expect("diagnosis");
        assert!(
            d.causes
                .iter()
                .all(|c| !c.evidence.contains("leading dimension 16")),
            "{:?}",
            d.causes
        );
    }

    #[test]
    fn a_structure_predictor_has_no_batch_to_cut() {
        // Named by the program (a JAX one: unified memory is offered).
        let named = "Running colabfold_batch on my 912 AA sequence.\nCould not predict test_cdf7a. Not Enough GPU memory? RESOURCE_EXHAUSTED: Out of memory while trying to allocate 7866899248 bytes.\n";
        let r = explain(scan_all(named.as_bytes()));
        let d = r.diagnosis.expect("diagnosis");
        assert_eq!(
            d.causes[0].cause,
            CauseKind::DeviceTooSmall,
            "{:?}",
            d.causes
        );
        assert_eq!(d.causes[1].cause, CauseKind::LargeActivation);
        assert!(d.causes[0].evidence.contains("ColabFold"));
        assert!(d.causes[0]
            .actions
            .iter()
            .any(|a| a.contains("TF_FORCE_UNIFIED_MEMORY")));
        // Told by its input alone: a protein's length and a structure to predict.
        let told = "I am trying to predict the structure of a ~1,100 amino acid long monomer.\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity; 12.10 GiB already allocated; 1.20 GiB free; 12.50 GiB reserved in total by PyTorch)\n";
        let (_, c) = causes(told);
        assert_eq!(c.first(), Some(&CauseKind::DeviceTooSmall), "{c:?}");
        // Amino acids without a structure (a language model embedding many sequences): the batch.
        let embed = "Embedding ~1000 sequences with 250-2000 amino acids each\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity; 12.10 GiB already allocated; 1.20 GiB free; 12.50 GiB reserved in total by PyTorch)\n";
        let (_, c) = causes(embed);
        assert_ne!(c.first(), Some(&CauseKind::DeviceTooSmall), "{c:?}");
    }

    #[test]
    fn an_upscaler_works_one_image_at_a_time() {
        let text = "python inference_realesrgan.py -n RealESRGAN_x4plus -i big.png\nError CUDA out of memory. Tried to allocate 3.80 GiB (GPU 0; 8.00 GiB total capacity; 2.10 GiB already allocated; 3.20 GiB free; 2.50 GiB reserved in total by PyTorch)\n";
        let r = explain(scan_all(text.as_bytes()));
        let d = r.diagnosis.expect("diagnosis");
        assert_eq!(
            d.causes[0].cause,
            CauseKind::LargeActivation,
            "{:?}",
            d.causes
        );
        assert!(d.causes[0].evidence.contains("Real-ESRGAN"));
        assert!(d.causes[0].actions[0].contains("--tile"));
        let batch = d
            .causes
            .iter()
            .position(|c| c.cause == CauseKind::BatchTooLarge);
        assert!(batch.is_none_or(|i| i > 0));
    }

    #[test]
    fn a_runtime_oom_while_creating_parameters_is_the_model_state() {
        let text = traceback(&[
            ("main", "state = create_train_state(rng, cfg)"),
            ("create_train_state", "params = model.init(rng, x)"),
        ]);
        let (_, c) = causes(&text);
        assert_eq!(c.first(), Some(&CauseKind::ArgumentsExceed), "{c:?}");
        assert!(!c.contains(&CauseKind::MemoryLeak), "{c:?}");
    }

    #[test]
    fn evidence_read_from_the_text_around_a_runtime_failure() {
        use CauseKind::*;
        let first = |t: &str| causes(t).1.first().copied();
        // A model that cannot even be created, no large request or model size shown.
        assert_eq!(
            first("  File \"train.py\", line 79, in load_model\n    model = Tacotron2(hparams).cuda()\nRuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCTensorRandom.cu:25\n"),
            Some(OtherProcess)
        );
        // The loss over the vocabulary is where it failed.
        assert_eq!(
            first(" return torch._C._nn.cross_entropy_loss(input, target, weight)      torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 250.00 MiB (GPU 1; 31.75 GiB total capacity; 30.10 GiB already allocated; 120.00 MiB free; 30.50 GiB reserved in total by PyTorch)\n"),
            Some(LargeActivation)
        );
        // Attention scores by their shape.
        assert_eq!(
            first("Resource exhausted: OOM when allocating tensor with shape[8,16,1024,1024] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n"),
            Some(LargeActivation)
        );
        // Most of the card held outside this process.
        assert_eq!(
            first("RuntimeError: CUDA out of memory. Tried to allocate 16.00 MiB (GPU 0; 47.54 GiB total capacity; 537.07 MiB already allocated; 12.06 MiB free; 580.00 MiB reserved in total by PyTorch)\n"),
            Some(OtherProcess)
        );
        // Under half the card outside PyTorch's pool (a context, workspaces, another library):
        // no sign of another holder on its own; the step's size comes first.
        let (_, c) = causes("RuntimeError: CUDA out of memory. Tried to allocate 488.00 MiB (GPU 0; 9.77 GiB total capacity; 6.90 GiB already allocated; 304.38 MiB free; 6.96 GiB reserved in total by PyTorch)\n");
        assert_eq!(c[0], BatchTooLarge);
        assert!(c.iter().take(3).any(|c| *c == OtherProcess));
        // TensorFlow got 1491 MB of an 11 GB card when it started.
        assert_eq!(
            first("I0000 gpu_device.cc:2022] Created device /job:localhost/replica:0/task:0/device:GPU:0 with 1491 MB memory:  -> device: 0, name: NVIDIA GeForce RTX 2080 Ti, pci bus id: 0000:89:00.0\nE0000 pjrt_stream_executor_client.cc:3067] Execution of replica 0 failed: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 16508718128 bytes.\n"),
            Some(OtherProcess)
        );
        // The CUDA runtime's own error, nothing else shown: the card first, then what holds it
        // (since session 21: in the 31 labelled posts of that kind, the card 12, a holder 6).
        let (_, c) = causes("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call\n");
        assert_eq!(&c[..2], &[DeviceTooSmall, OtherProcess]);
        // ... but a print of what PyTorch's cache holds, before a Numba allocation fails, names
        // the holder.
        assert_eq!(
            first("torch reserved after preprocessing: 55.43 GiB\nnumba.cuda.cudadrv.driver.CudaAPIError: [<CUresult.CUDA_ERROR_OUT_OF_MEMORY: 2>] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY\n"),
            Some(OtherProcess)
        );
        // One request of a sixth of the card is an intermediate.
        assert_eq!(
            first("RuntimeError: CUDA out of memory. Tried to allocate 2.99 GiB (GPU 0; 14.73 GiB total capacity; 10.14 GiB already allocated; 1.89 GiB free; 1.97 GiB cached)\n"),
            Some(LargeActivation)
        );
    }

    #[test]
    fn a_runtime_oom_without_growth_is_no_leak() {
        let (_, c) = causes(ALLOC);
        assert!(!c.contains(&CauseKind::MemoryLeak), "{c:?}");
        let r = explain(scan_all(ALLOC.as_bytes()));
        assert!(!r.diagnosis.expect("d").missing.is_empty());
    }

    #[test]
    fn a_tpu_headline_alone_lists_the_stories_it_cannot_tell_apart() {
        let one = "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (16.47G) exceeds available HBM (15.75G).\n";
        let (_, c) = causes(one);
        assert_eq!(
            &c[..3],
            &[
                CauseKind::BatchTooLarge,
                CauseKind::LargeActivation,
                CauseKind::ReplicatedTensor
            ],
            "{c:?}"
        );
        // With the arguments stated, the figures decide: no hypotheses.
        let (_, c) = causes("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 16.47G of 15.75G hbm. Exceeded hbm capacity by 737.28M.\n\nTotal hbm usage >= 16.47G:\n    reserved        530.00M \n    program          15.94G \n    arguments            0B \n");
        assert!(!c.contains(&CauseKind::ReplicatedTensor), "{c:?}");
    }

    #[test]
    fn host_memory_said_to_grow_is_a_leak_behind_the_host() {
        let text = "The RAM usage keeps increasing every epoch until the process is killed.\nnumpy.core._exceptions.MemoryError: Unable to allocate 3.00 GiB for an array with shape (1024, 786432) and data type float32\n";
        let (cat, c) = causes(text);
        assert_eq!(cat, Category::HostMemory);
        assert_eq!(
            &c[..2],
            &[CauseKind::HostOom, CauseKind::MemoryLeak],
            "{c:?}"
        );
        // No growth said: the host's story alone.
        let (_, c) = causes("numpy.core._exceptions.MemoryError: Unable to allocate 3.00 GiB for an array with shape (1024, 786432) and data type float32\n");
        assert!(!c.contains(&CauseKind::MemoryLeak), "{c:?}");
    }

    #[test]
    fn a_failure_after_many_steps_is_growth() {
        let mut text = String::new();
        for s in (100..=5000).step_by(100) {
            text.push_str(&format!("step {s} loss 0.5\n"));
        }
        text.push_str(&traceback(&[("main", "state = train_step(state, batch)")]));
        let (_, c) = causes(&text);
        assert_eq!(c.first(), Some(&CauseKind::MemoryLeak), "{c:?}");
    }

    #[test]
    fn the_first_training_step_is_the_batch() {
        let text = traceback(&[("main", "state, loss = train_step(state, batch)")]);
        let (_, c) = causes(&text);
        assert_eq!(c.first(), Some(&CauseKind::BatchTooLarge), "{c:?}");
    }

    #[test]
    fn the_layer_count_of_stacked_parameters_is_not_the_batch() {
        let allocs = vec![
            Allocation {
                size_bytes: 3 << 30,
                shape: Some("f32[48,4096,4096]".into()),
                allocation_type: Some("Entry Parameter".into()),
                ..Allocation::default()
            },
            Allocation {
                size_bytes: 3 << 30,
                shape: Some("f32[48,4096,4096]".into()),
                allocation_type: Some("HLO temp".into()),
                op_name: Some("jit(step)/while/body/dot_general".into()),
                ..Allocation::default()
            },
            Allocation {
                size_bytes: 1 << 30,
                shape: Some("bf16[64,2048,4096]".into()),
                allocation_type: Some("HLO temp".into()),
                ..Allocation::default()
            },
            Allocation {
                size_bytes: 1 << 30,
                shape: Some("bf16[64,2048,4096]".into()),
                allocation_type: Some("HLO temp".into()),
                ..Allocation::default()
            },
        ];
        assert_eq!(common_batch(&allocs).map(|b| b.0), Some(64));
    }

    #[test]
    fn a_shard_in_another_order_is_a_split_sibling() {
        let sh = |t: &str| Shape::parse(t).expect("shape");
        // An MLP's down projection whole beside its up projection's shard, transposed.
        assert_eq!(
            split_ways_any_order(&sh("f32[12,14336,4096]"), &sh("f32[12,4096,1792]")),
            Some(8)
        );
        assert_eq!(
            split_ways_any_order(&sh("f32[12,14336,4096]"), &sh("f32[12,1792,4096]")),
            Some(8)
        );
        // Another type, or two dimensions changed, is no sibling.
        assert_eq!(
            split_ways_any_order(&sh("f32[12,14336,4096]"), &sh("bf16[12,4096,1792]")),
            None
        );
        assert_eq!(
            split_ways_any_order(&sh("f32[12,14336,4096]"), &sh("f32[12,2048,1792]")),
            None
        );
        // Not a square weight beside the narrow side of another axis.
        assert_eq!(
            split_ways_any_order(&sh("bf16[16384,4096]"), &sh("bf16[4096,4096]")),
            None
        );
    }

    #[test]
    fn a_limit_no_tpu_has_is_a_cap() {
        let text = "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 1.62G of 1.00G hbm. Exceeded hbm capacity by 640.06M.\n";
        let (_, c) = causes(text);
        assert_eq!(c.first(), Some(&CauseKind::Preallocation), "{c:?}");
    }

    const TORCH: &str = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB (GPU 0; 10.73 GiB total capacity; 9.85 GiB already allocated; 46.44 MiB free; 9.86 GiB reserved in total by PyTorch)";

    #[test]
    fn a_model_whose_weights_exceed_the_device_is_the_model() {
        // 7B parameters at 16 bits are 13.0G, past the 10.73G device.
        let text = format!("vllm serve --model mistralai/Mistral-7B-v0.1 --dtype half\n{TORCH}\n");
        assert_eq!(causes(&text).1.first(), Some(&CauseKind::ArgumentsExceed));
        // Quantized to 4 bits (3.3G) the weights are not the story.
        let text = format!("--model TheBloke/Mistral-7B-AWQ --quantization awq\n{TORCH}\n");
        assert_ne!(causes(&text).1.first(), Some(&CauseKind::ArgumentsExceed));
    }

    #[test]
    fn a_batch_already_reduced_is_not_the_answer() {
        let (_, before) = causes(&format!("{TORCH}\n"));
        assert_eq!(
            before.first(),
            Some(&CauseKind::BatchTooLarge),
            "{before:?}"
        );
        let text =
            format!("{TORCH}\nI tried reducing the batch size to 1 but nothing is working.\n");
        let (_, after) = causes(&text);
        assert_ne!(after.first(), Some(&CauseKind::BatchTooLarge), "{after:?}");
        assert!(after.contains(&CauseKind::ArgumentsExceed), "{after:?}");
    }

    /// Intel XPU's messages (intel-extension-for-pytorch#629, torch-xpu-ops#2392): a refusal the
    /// runtime states for one block, and a memory fraction PyTorch names (`8.27 GiB allowed;`)
    /// with the device's free memory covering the request, lead with those caps; `0 bytes
    /// already allocated` is no requirement for f32 buffers to take a share of.
    #[test]
    fn caps_a_message_states_lead() {
        let (_, capped) = causes("RuntimeError: Current platform can NOT allocate memory block with size larger than 4GB! Tried to allocate 6.85 GiB (GPU  0; 15.56 GiB total capacity; 0 bytes already allocated; 0 bytes reserved in total by PyTorch)\n");
        assert_eq!(
            capped.first(),
            Some(&CauseKind::DeviceTooSmall),
            "{capped:?}"
        );
        assert!(!capped.contains(&CauseKind::F32Precision), "{capped:?}");
        let (_, fraction) = causes("torch.OutOfMemoryError: XPU out of memory. Tried to allocate 8.11 GiB. GPU 0 has a total capacity of 16.54 GiB of which 16.54 GiB is free. 8.27 GiB allowed; Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. Please use `empty_cache` to release all unoccupied cached memory.\n");
        assert_eq!(
            fraction.first(),
            Some(&CauseKind::Preallocation),
            "{fraction:?}"
        );
    }
}

#[cfg(test)]
mod corpus_tests {
    //! `explain` on real logs of tests/corpus: the category and first cause a person reads there,
    //! and the same report twice.
    use super::*;
    use crate::dump::testdata::read;

    fn report(rel: &str) -> ExplainReport {
        let (events, warnings) = hbm_doctor_log::scan_all_with_warnings(read(rel).as_bytes());
        explain_with_warnings(events, warnings)
    }

    #[test]
    fn a_debug_print_of_a_gathered_array_on_v5e() {
        let r = report("tpu/debug_print_v5e/stderr.log");
        let d = r.diagnosis.as_ref().expect("diagnosis");
        assert_eq!(d.category, Category::SingleLargeAllocation);
        assert_eq!(d.causes[0].cause, CauseKind::DebugPrint);
        let e = &r.events[d.event];
        // "Used 24.00G of 15.75G hbm. Exceeded hbm capacity by 8.25G."
        let size = |b: Option<u64>| b.map(hbm_doctor_log::format_size);
        assert_eq!(size(e.used_bytes).as_deref(), Some("24.00G"));
        assert_eq!(size(e.limit_bytes).as_deref(), Some("15.75G"));
        assert_eq!(size(e.exceeded_bytes).as_deref(), Some("8.25G"));
        assert_eq!(r.warnings.len(), 1, "the remat warning is counted");
    }

    fn first_causes(rel: &str) -> Vec<CauseKind> {
        let r = report(rel);
        let d = r.diagnosis.as_ref().expect("diagnosis");
        d.causes.iter().take(3).map(|c| c.cause).collect()
    }

    #[test]
    fn shapes_that_tell_the_cause_of_a_runtime_failure() {
        for (post, first) in [
            // A 24M-wide inner dimension: a count used as a size.
            (
                "seyedsaeidmasoumzadeh-Predict-next-word-5",
                CauseKind::ShapeBug,
            ),
            // [5776, 500002]: tokens x vocabulary logits.
            ("tensorflow-nmt-348", CauseKind::LargeActivation),
            // Random bits of parameter initialization drawn whole on every device...
            ("marin-community-levanter-475", CauseKind::ReplicatedTensor),
            // ... but dropout masks of a training step are not that.
            ("jax-ml-jax-17982", CauseKind::NoRemat),
        ] {
            assert_eq!(
                first_causes(&format!("issues/{post}.txt"))[0],
                first,
                "{post}"
            );
        }
        // PyTorch's 6 GiB total capacity is the GPU, not a 75% pool of an 8 GB one.
        assert!(
            !first_causes("issues/eps696-aphantasia-22.txt").contains(&CauseKind::Preallocation)
        );
        // cuBLAS could not create its handle: the pool, then another process.
        assert_eq!(
            first_causes("issues/mfinzi-equivariant-MLP-7.txt")[..2],
            [CauseKind::Preallocation, CauseKind::OtherProcess]
        );
    }

    #[test]
    fn compiler_listings_whose_shapes_tell_the_story() {
        // wav2vec 2.0's gathered distractors, also listed flattened (`f32[3309568,768]` beside
        // `f32[32,1024,101,768]`): one activation, not an array left replicated.
        assert_eq!(
            first_causes("tpu/w2v_negatives_gathered_v5e/stderr.log")[0],
            CauseKind::LargeActivation
        );
        // An MLP's down projection held whole beside its up projection's shard, transposed.
        assert_eq!(
            first_causes("tpu/partition_rules_stale_name_v4/stderr.log")[0],
            CauseKind::ReplicatedTensor
        );
        // 131072 positions' states beside one chunk's 2048: 64 times, over no stack of layers,
        // is no mesh axis either (causal linear attention's cumulative sum).
        assert_eq!(
            first_causes("tpu/causal_linear_attention_cumsum_outer_products_v5p/stderr.log")[0],
            CauseKind::LargeActivation
        );
        // 196608 orientations' projections beside a [256, 256, 129] volume: 768 times its first
        // dimension is no mesh axis, so no shard gathered whole.
        assert_eq!(
            first_causes("tpu/cryoem_all_orientation_projections_v5p/stderr.log")[0],
            CauseKind::LargeActivation
        );
        // Arguments over the limit: the arguments first, and state left whole on every device
        // among the next, with the check that tells.
        let c = first_causes("tpu/plenoxel_grid_replicated_v6e/stderr.log");
        assert_eq!(c[0], CauseKind::ArgumentsExceed);
        assert!(c[..3].contains(&CauseKind::ReplicatedTensor), "{c:?}");
        // Arguments most of the device but under it (Shampoo's statistics replicated, 12.75G of
        // 15.25G): they do not exceed the topology; the state left whole comes first.
        let c = first_causes("tpu/shampoo_stats_replicated_v4/stderr.log");
        assert_eq!(c[0], CauseKind::ReplicatedTensor, "{c:?}");
        // A reward model run on all 56 pair sequences: slots led by the batch (112) reused by
        // one step's temporaries are no scan's stack (one step's `[112, ...]` temporaries of
        // other shapes beside them outnumber them); no rematerialization is missing.
        let c = first_causes("tpu/reward_model_pairs_reencoded_v5e/stderr.log");
        assert_ne!(c[0], CauseKind::NoRemat, "{c:?}");
        // A dense count matrix over 4^12 k-mers, `f32[2048,16777216]`, beside the embedding
        // table `f32[16777216,128]`: the model's own vocabulary, an activation, no shape bug.
        let c = first_causes("tpu/kmer_bag_dense_multihot_matmul_v5p/stderr.log");
        assert_eq!(c[0], CauseKind::LargeActivation, "{c:?}");
        // Arguments 80% of the limit (a user table and its Adagrad accumulator left `P()`):
        // the table-shaped temporaries are its gradient and update, not activations.
        let c = first_causes("tpu/two_tower_spec_list_declaration_order_v6e/stderr.log");
        assert_eq!(c[0], CauseKind::ReplicatedTensor, "{c:?}");
        // Stacked along 32 layers (gathered FSDP weights saved by a scan): a stack.
        let c = first_causes("tpu/fsdp_shard_map_gathered_weights_saved_v4/stderr.log");
        assert_eq!(c[0], CauseKind::NoRemat, "{c:?}");
        // Each of 48 stacked weights gathered 4 ways (ZeRO-3 gathering everything up front),
        // some transposed: all the gathered copies together are what sharding frees.
        let c = first_causes("tpu/zero3_gather_upfront_v5e/stderr.log");
        assert_eq!(c[0], CauseKind::ReplicatedTensor, "{c:?}");
        // Stacks shaped like the replicated parameters (`bf16[20,16384,8192]`) are their
        // gradients: the few activation stacks beside them do not make the story no_remat.
        let c = first_causes("tpu/mesh_axes_swapped_v5e/stderr.log");
        assert_eq!(c[0], CauseKind::ReplicatedTensor, "{c:?}");
        // A donated u8 replay buffer shifted with `jnp.concatenate`: a whole second copy of an
        // integer array the program holds (no gradient is integer), the state twice.
        let c = first_causes("tpu/dqn_replay_fifo_concatenate_v5e/stderr.log");
        assert_eq!(c[0], CauseKind::NoDonation, "{c:?}");
        // One token sharing the slot of a k-means distance matrix is no host callback; five
        // tokens beside a printed array are.
        let c = first_causes("tpu/ivf_kmeans_all_point_centroid_distances_v6e/stderr.log");
        assert_eq!(c[0], CauseKind::LargeActivation, "{c:?}");
        let c = first_causes("tpu/debug_print_v5e/stderr.log");
        assert_eq!(c[0], CauseKind::DebugPrint, "{c:?}");
    }

    #[test]
    fn many_allocations_past_a_v4_limit_in_an_issue_post() {
        let r = report("issues/erfanzar-EasyDeL-166.txt");
        let d = r.diagnosis.as_ref().expect("diagnosis");
        assert_eq!(d.category, Category::Aggregate);
        assert_eq!(
            d.chip.as_deref(),
            Some("TPU v4 (megacore) (32.00G HBM per device)")
        );
    }

    #[test]
    fn the_same_log_gives_byte_identical_json() {
        for rel in [
            "tpu/debug_print_v5e/stderr.log",
            "issues/erfanzar-EasyDeL-166.txt",
        ] {
            let a = serde_json::to_string(&report(rel)).expect("json");
            let b = serde_json::to_string(&report(rel)).expect("json");
            assert_eq!(a, b, "{rel}");
        }
    }
}
