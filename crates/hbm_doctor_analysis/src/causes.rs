//! Causes as data: one entry per cause of the contract's vocabulary, with what it means, the
//! evidence the engine needs before it names it, how its savings are computed, and the advice
//! every command gives for it, written once.
//!
//! A rule (explain's, analyze's detectors, the evidence's, trend's) decides *whether* a cause
//! applies and writes what only its figures can say (the buffer to shard, the batch to use); the
//! generic advice comes from here, appended by [`Cause::new`](crate::model::Cause::new) after the
//! rule's own lines. docs/explain.md's cause table is checked against this one.

use crate::model::CauseKind;

/// One cause: what it is, what shows it, how much it saves, what to do.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The cause.
    pub kind: CauseKind,
    /// What it means (the contract's definition).
    pub meaning: &'static str,
    /// The evidence the engine needs before it names the cause.
    pub needs: &'static str,
    /// How the savings are computed (or why they are unknown).
    pub savings: &'static str,
    /// What to do, best first, for any framework; a rule's own lines come before these.
    pub advice: &'static [&'static str],
}

/// Actions a cause carries at most once its generic advice is appended.
pub const MAX_ACTIONS: usize = 4;

/// Every cause, in the contract's order.
pub const CAUSES: &[Spec] = &[
    Spec {
        kind: CauseKind::BatchTooLarge,
        meaning: "activations/temporaries scale with the batch and exceed the memory",
        needs: "a leading dimension the data inputs carry, shared by the large temporaries (not the layer count of stacked parameters); at run time, a failure inside a training step with no growth before it",
        savings: "the batch-sized temporaries at the peak times the fraction removed; with a dump, the peak recomputed with them halved",
        advice: &[
            "Keep the global batch with gradient accumulation over micro-batches (optax.MultiSteps; PyTorch: accumulate .backward() over micro-batches).",
            "Then rematerialize activations (jax.checkpoint; torch_xla / torch.utils.checkpoint) and compute in bf16 if the batch must stay.",
        ],
    },
    Spec {
        kind: CauseKind::ReplicatedTensor,
        meaning: "a large array is copied on every device: missing or ineffective sharding",
        needs: "large buffers whose sharding is replicated (or absent) on a mesh of more than one device, judged together",
        savings: "each replicated buffer minus its share over the mesh axis; with a dump, the peak recomputed with them sharded",
        advice: &[
            "Check in_shardings / out_shardings of the jit: an empty PartitionSpec P() means replicated; shard large arrays over the mesh (NamedSharding(mesh, P('data', None)); PyTorch/XLA: xs.mark_sharding).",
            "Add sharding constraints on large intermediates (jax.lax.with_sharding_constraint) so propagation does not fall back to replication; check the mesh with jax.debug.visualize_array_sharding.",
        ],
    },
    Spec {
        kind: CauseKind::DebugPrint,
        meaning: "jax.debug.print / jax.debug.callback / host transfers force a large tensor to materialize",
        needs: "host transfers (send/recv, outfeed, callbacks) or op_names naming debug_print / debug_callback whose operands are large; in a TPU memory usage report, a large slot shared with several tokens (`5×token[]`: one per print or callback; since session 20 a single token, an ordering value, is not enough)",
        savings: "the buffers kept live only for the transfer; with a dump, the peak recomputed without them",
        advice: &[
            "Remove jax.debug.print / jax.debug.callback / host_callback on large arrays from the jitted step, or print a reduction (x.sum(), x[:4]) instead of the whole array.",
            "A printed sharded array is gathered to one device first: print per shard (jax.debug.print under shard_map) or outside jit.",
        ],
    },
    Spec {
        kind: CauseKind::Padding,
        meaning: "tiled-layout padding wastes a large share (small minor dims, unaligned shapes)",
        needs: "buffers whose padded size (the printed tile, or the TPU default T(8,128)) is well above their data",
        savings: "padded minus unpadded bytes of those buffers",
        advice: &[
            "Keep minor dims multiples of 128 and second-minor multiples of 8 (bf16: 16); reshape or transpose small trailing dims away from the two most minor positions (e.g. [N,3,3] -> [3,3,N]).",
            "Check a shape with `hbm-doctor pad SHAPE`.",
        ],
    },
    Spec {
        kind: CauseKind::NoDonation,
        meaning: "inputs are not donated, so parameters/state exist twice (donate_argnums / input_output_alias)",
        needs: "entry parameters with an output of the same shape and no input_output_alias, live together at the peak",
        savings: "the undonated inputs' bytes; with a dump, the peak recomputed with them aliased",
        advice: &[
            "Donate the arguments the step overwrites (parameters, optimizer state, a KV cache): jax.jit(step, donate_argnums=...), so the outputs reuse their buffers.",
            "PyTorch/XLA: update the tensors in place (optimizer.step() on XLA tensors) so the compiler aliases them.",
        ],
    },
    Spec {
        kind: CauseKind::NoRemat,
        meaning: "activations are kept for the backward pass that rematerialization would drop",
        needs: "forward activations (op_names under the forward pass, stacked per layer in a scan) making up most of what is live at the peak",
        savings: "the saved activations minus one layer's; with a dump, the peak recomputed with them rematerialized",
        advice: &[
            "Rematerialize per layer: wrap each block (or the scanned body) in jax.checkpoint with a policy such as jax.checkpoint_policies.dots_with_no_batch_dims_saveable.",
            "PyTorch/XLA: torch_xla.utils.checkpoint.checkpoint around each block.",
        ],
    },
    Spec {
        kind: CauseKind::LargeActivation,
        meaning: "one intermediate (e.g. attention scores [B,H,S,S], logits [B,S,V]) dominates",
        needs: "one temporary (or one shape) that is a large share of the peak, or shaped like attention scores or logits, or one run-time request of two fifths of the device or more (under 10x it)",
        savings: "that intermediate minus one of 8 chunks of it (as the dump's what-if)",
        advice: &[
            "Never materialize it whole: a fused attention kernel (jax.nn.dot_product_attention, Pallas flash / splash attention) for [B,H,S,S] scores, a chunked loss for [B,S,V] logits, jax.lax.map / scan over chunks otherwise.",
            "Or shard it across devices with a sharding constraint on the dimension that is largest.",
        ],
    },
    Spec {
        kind: CauseKind::F32Precision,
        meaning: "large f32 arrays where bf16 (or int8) would serve",
        needs: "f32 buffers (activations, parameters, logits) that are a large share of the peak",
        savings: "half of those f32 buffers",
        advice: &[
            "Compute activations and matmuls in bfloat16 (params and inputs as jnp.bfloat16, f32 master weights and loss only in the optimizer).",
            "PyTorch/XLA: torch.autocast('xla', dtype=torch.bfloat16).",
        ],
    },
    Spec {
        kind: CauseKind::OptimizerStateUnsharded,
        meaning: "optimizer state replicated instead of sharded over the data-parallel axis",
        needs: "optimizer moments (opt_state, mu/nu, m/v by name, or arguments that follow the parameters) replicated over the data axis",
        savings: "the state minus its share over the data axis",
        advice: &[
            "Shard the optimizer state like the parameters (ZeRO-1 / FSDP): give opt_state the same out_shardings as the sharded params, or shard both over the data axis.",
            "Or keep the moments in bf16, use a lighter optimizer (Adafactor, 8-bit Adam), or offload the state to host memory.",
        ],
    },
    Spec {
        kind: CauseKind::ArgumentsExceed,
        meaning: "the inputs alone do not fit the topology: shard over more chips, offload to host, bigger chip",
        needs: "arguments most of the limit; a failure while creating or loading the model; a model named in the text whose weights fill the device",
        savings: "the arguments beyond the limit (when stated)",
        advice: &[
            "Shard parameters and optimizer state over more devices (FSDP / ZeRO-3), created already sharded (jax.jit(init, out_shardings=...); PyTorch/XLA: FSDPv2 before the weights reach the device).",
            "Keep weights in bf16 (int8/4-bit for inference), and offload optimizer state to host memory.",
            "Or use more chips, or a generation with more memory per device.",
        ],
    },
    Spec {
        kind: CauseKind::SparsecoreStack,
        meaning: "SparseCore stack/heap use (feature width, max_unique_nz_per_row, replicas, prefetch)",
        needs: "a TensorCore/SparseCore split where SparseCore's share is what exceeds",
        savings: "unknown without the embedding configuration",
        advice: &[
            "Lower max_ids_per_partition / max_unique_ids_per_partition, the feature width or the prefetch depth of the SparseCore embedding tables.",
        ],
    },
    Spec {
        kind: CauseKind::SparsecorePadding,
        meaning: "embedding tables narrower than 8 floats padded to 32 bytes on SparseCore",
        needs: "SparseCore usage with narrow embedding tables",
        savings: "unknown without the table widths",
        advice: &["Widen narrow embedding tables to 8 floats, or combine them (stacked tables)."],
    },
    Spec {
        kind: CauseKind::KernelTiling,
        meaning: "a kernel's block sizes or the compiler's scoped vmem limit (vmem/smem category)",
        needs: "a vmem/smem (scoped) failure: the block, not the array, must fit on chip",
        savings: "the scoped allocation beyond the limit",
        advice: &[
            "Make the kernel's blocks smaller (the BlockSpecs of a Pallas kernel, or the block sizes of a library kernel).",
            "Or raise the scoped limit where the chip has room: LIBTPU_INIT_ARGS='--xla_tpu_scoped_vmem_limit_kib=...' (or compiler_params vmem_limit_bytes for a Pallas kernel).",
        ],
    },
    Spec {
        kind: CauseKind::ShapeBug,
        meaning: "a size so far beyond the device (e.g. > 10x) that a shape or config is wrong",
        needs: "a requirement or single buffer ten times (or more) the device, or beyond any device",
        savings: "unknown: the intended shape decides",
        advice: &[
            "Print the shapes of the largest arrays (jax.eval_shape / torch.Size) and compare them with what you meant: an outer product or a broadcast by mistake, a vocab or sequence length off by a factor.",
            "Check the config that sizes the model (seq_len, vocab, hidden, num_layers, per-device batch) and the mesh (a 1-device axis splits nothing).",
        ],
    },
    Spec {
        kind: CauseKind::Fragmentation,
        meaning: "free memory exists but not contiguously",
        needs: "free memory at least the request while the largest free block is smaller, or PyTorch's reserved-but-unallocated blocks plus the free memory covering the request",
        savings: "the request (it fits once the free memory is contiguous)",
        advice: &[
            "Reduce fragmentation: allocate the large long-lived buffers first, avoid many shape-varying allocations; PyTorch: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb).",
            "Leave headroom (a smaller batch) so the largest block fits.",
        ],
    },
    Spec {
        kind: CauseKind::Preallocation,
        meaning: "the allocator's pool setting (e.g. XLA_PYTHON_CLIENT_MEM_FRACTION) caps usable memory",
        needs: "a pool setting named in the log, a limit no device has, or a library handle starved at start",
        savings: "what the cap withholds",
        advice: &[
            "Let the allocator use the device: XLA_PYTHON_CLIENT_MEM_FRACTION=.9 or XLA_PYTHON_CLIENT_PREALLOCATE=false (JAX), tf.config.experimental.set_memory_growth (TensorFlow), a higher gpu_memory_utilization (vLLM); remove --xla_tpu_max_hbm_size_mib caps.",
            "Check that two frameworks in one process are not each preallocating.",
        ],
    },
    Spec {
        kind: CauseKind::OtherProcess,
        meaning: "memory held by another process or by earlier arrays still alive",
        needs: "memory in use that this process's allocator (or its live arrays) does not account for",
        savings: "the memory held outside the program",
        advice: &[
            "Find what holds the device: nvidia-smi / tpu-info for other processes, a notebook kernel still holding arrays of a previous run (restart it), jax.clear_caches().",
        ],
    },
    Spec {
        kind: CauseKind::MemoryLeak,
        meaning: "usage grows steadily over steps",
        needs: "growth: a failure after many good steps, a growing series, a holder of many arrays in the process, or the user's sentence saying memory grew (a leak, a steady increase, an OOM only after epochs ran)",
        savings: "what accumulated (the holder's bytes, or the growth over the run)",
        advice: &[
            "Find what keeps per-step outputs alive (lists of losses or metrics, caches keyed by step, closures); keep host values (float(x), jax.device_get) instead of device arrays.",
            "Record device memory per step (hbm-doctor record / hbm_doctor.sampler) and check the trend (hbm-doctor trend).",
        ],
    },
    Spec {
        kind: CauseKind::MemorySpike,
        meaning: "usage jumps at a specific step (eval, checkpoint, recompilation)",
        needs: "a failure at eval, checkpoint save or a new shape, or a spike in the series",
        savings: "the spike above the normal ceiling",
        advice: &[
            "Free training temporaries before eval or checkpointing (smaller eval batch, save from host copies), and keep eval shapes fixed so no new program is compiled.",
        ],
    },
    Spec {
        kind: CauseKind::Recompilation,
        meaning: "new graphs compiled again and again (PyTorch/XLA dynamic shapes, missing mark_step)",
        needs: "many cached executables of one function, a step change in the series, or compile counters rising",
        savings: "the executables and their buffers cached for shapes no longer used",
        advice: &[
            "Keep shapes static: pad batches and sequences to a few bucket sizes, mark static arguments (static_argnums), and call xm.mark_step() once per step in PyTorch/XLA.",
            "Clear executables that are no longer used (jax.clear_caches()) if shapes must vary.",
        ],
    },
    Spec {
        kind: CauseKind::HostOom,
        meaning: "host RAM exhausted; the process was killed by the operating system",
        needs: "the kernel's OOM killer, a SIGKILL, or an out-of-host-memory message",
        savings: "unknown without the host's figures",
        advice: &[
            "Lower host memory use: fewer data-loader workers or a smaller prefetch buffer, load checkpoints shard by shard (or straight to the device), and avoid host copies of the whole model.",
        ],
    },
    Spec {
        kind: CauseKind::DeviceTooSmall,
        meaning: "nothing wasteful found: the program needs a bigger or more chips",
        needs: "a requirement well over the limit (2.5x or more) with no waste that closes the gap",
        savings: "the overshoot (what more memory must hold)",
        advice: &[
            "Spread the program over more devices with model / FSDP sharding, so each holds its share.",
            "Or run on a chip with more memory per device.",
            "Or offload parameters, optimizer state or saved activations to host memory (memory_kind='pinned_host').",
        ],
    },
];

/// The entry of `kind`.
pub fn spec(kind: CauseKind) -> &'static Spec {
    CAUSES
        .iter()
        .find(|s| s.kind == kind)
        .expect("every cause has an entry (tested)")
}

/// Appends `kind`'s generic advice after a rule's own lines, skipping what the rule already
/// says, up to [`MAX_ACTIONS`]; a rule's "Last resort" lines stay last.
pub fn complete_actions(kind: CauseKind, actions: &mut Vec<String>) {
    let last_resort = |a: &String| a.starts_with("Last resort");
    let (mut out, last): (Vec<String>, Vec<String>) = std::mem::take(actions)
        .into_iter()
        .partition(|a| !last_resort(a));
    // The same advice in other words starts the same way ("Spread the program over at least 2x
    // as many chips" / "Spread the program over more devices"): the first four words decide.
    let head = |s: &str| {
        s.trim_start_matches("Or ")
            .split_whitespace()
            .take(4)
            .map(|w| {
                w.trim_matches(|c: char| !c.is_alphanumeric())
                    .to_ascii_lowercase()
            })
            .collect::<Vec<_>>()
    };
    for a in spec(kind).advice {
        if out.len() + last.len() >= MAX_ACTIONS {
            break;
        }
        if !out.iter().any(|x| head(x) == head(a)) {
            out.push((*a).to_string());
        }
    }
    out.extend(last);
    *actions = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_has_one_entry() {
        let all = [
            CauseKind::BatchTooLarge,
            CauseKind::ReplicatedTensor,
            CauseKind::DebugPrint,
            CauseKind::Padding,
            CauseKind::NoDonation,
            CauseKind::NoRemat,
            CauseKind::LargeActivation,
            CauseKind::F32Precision,
            CauseKind::OptimizerStateUnsharded,
            CauseKind::ArgumentsExceed,
            CauseKind::SparsecoreStack,
            CauseKind::SparsecorePadding,
            CauseKind::KernelTiling,
            CauseKind::ShapeBug,
            CauseKind::Fragmentation,
            CauseKind::Preallocation,
            CauseKind::OtherProcess,
            CauseKind::MemoryLeak,
            CauseKind::MemorySpike,
            CauseKind::Recompilation,
            CauseKind::HostOom,
            CauseKind::DeviceTooSmall,
        ];
        assert_eq!(CAUSES.len(), all.len());
        for k in all {
            assert_eq!(CAUSES.iter().filter(|s| s.kind == k).count(), 1, "{k:?}");
            assert!(!spec(k).advice.is_empty(), "{k:?}");
        }
    }

    #[test]
    fn a_rule_line_is_not_repeated() {
        let mut a = vec!["Keep the global batch with gradient accumulation now".to_string()];
        complete_actions(CauseKind::BatchTooLarge, &mut a);
        assert_eq!(a.len(), 2, "{a:?}");
    }
}
