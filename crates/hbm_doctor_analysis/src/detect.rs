//! Detectors for known waste in one analyzed module. Each gives a contract cause with the buffers
//! it rests on as evidence and an estimate of the peak reduction (`savings_bytes`).

use crate::model::{
    AnalyzeOptions, BufferAtPeak, Cause, CauseKind, ModuleInput, ModuleReport, Snippet, SpaceReport,
};
use crate::origin::op_name_parts;
use hbm_doctor_hlo::hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use hbm_doctor_hlo::hlo::{
    shape_leaves, sharding_copies, sharding_splits_inner_only, HloModule, Instruction,
};
use hbm_doctor_hlo::text::unescape;
use hbm_doctor_hlo::Shape;
use hbm_doctor_log::format_size;

const MIB: u64 = 1 << 20;

fn pct(part: u64, whole: u64) -> String {
    format!("{:.0}%", part as f64 * 100.0 / whole.max(1) as f64)
}

fn cause(kind: CauseKind, savings: Option<u64>, evidence: String, actions: Vec<String>) -> Cause {
    Cause::new(kind, savings, evidence, actions)
}

fn snippet(framework: &str, code: &str) -> Snippet {
    Snippet {
        framework: framework.into(),
        code: code.into(),
    }
}

fn dims_of(b: &BufferAtPeak) -> Option<Shape> {
    Shape::parse(&b.layout_shape)
}

fn same_array(a: &str, b: &str) -> bool {
    match (Shape::parse(a), Shape::parse(b)) {
        (Some(x), Some(y)) => x.element_type == y.element_type && x.dims == y.dims,
        _ => false,
    }
}

/// Whether two shapes have the same dimensions, whatever their element types.
fn same_dims(a: &str, b: &str) -> bool {
    match (Shape::parse(a), Shape::parse(b)) {
        (Some(x), Some(y)) => x.dims == y.dims,
        _ => false,
    }
}

/// The same value in another shape: as many elements (of at least a million), whatever the
/// dimensions (a scatter into a flat `f32[4294967296]` reshaped to `f32[1,65536,65536]`, a
/// transposed or merged-heads copy).
fn same_value_reshaped(a: &str, b: &str) -> bool {
    let count = |s: &Shape| s.dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
    match (Shape::parse(a), Shape::parse(b)) {
        (Some(x), Some(y)) => count(&x).is_some_and(|n| n >= 1 << 20 && Some(n) == count(&y)),
        _ => false,
    }
}

/// A cause whose savings are below this share of the peak is not reported (immaterial).
pub const MATERIAL_SHARE: f64 = 0.05;

/// A program whose HBM total is at most this share of the memory it must fit in fits
/// comfortably: the detectors whose fixes cost something (recomputation, precision, batch size,
/// code restructuring) stay quiet for it.
pub const COMFORT_SHARE: f64 = 0.5;

/// The memory a program must fit in: the budget, or without one the smallest accelerator
/// memory in current use (a TPU v5e's 15.75 GiB as the compiler counts it; also a TPU v4 core's
/// and a 16 GB GPU's).
pub fn reference_bytes(opts: &AnalyzeOptions) -> u64 {
    opts.budget_bytes
        .unwrap_or_else(|| crate::chips::tpu_by_name("v5e").map_or(16 << 30, |c| c.usable_bytes))
}

/// Whether the HBM total is at most [`COMFORT_SHARE`] of [`reference_bytes`].
pub fn fits_comfortably(s: &SpaceReport, opts: &AnalyzeOptions) -> bool {
    (s.device_bytes() as f64) <= COMFORT_SHARE * reference_bytes(opts) as f64
}

/// Runs every detector on one module; causes ranked by savings (unknown savings last).
///
/// Waste that costs nothing to remove (replicated or unsharded state, debug transfers, missing
/// donation, padding) is reported whenever it is material; remedies that cost compute,
/// precision or batch size (no_remat, f32_precision, batch_too_large, large_activation) only
/// when the program does not fit comfortably ([`fits_comfortably`]). Causes saving less than
/// [`MATERIAL_SHARE`] of the peak are dropped.
pub fn detect(input: &ModuleInput<'_>, r: &ModuleReport, opts: &AnalyzeOptions) -> Vec<Cause> {
    let Some(s) = r.memory_spaces.iter().find(|s| s.color == 0) else {
        return Vec::new();
    };
    let tight = !fits_comfortably(s, opts);
    let hlo = input.hlo;
    let mut claimed: HashSet<String> = HashSet::default();
    let mut out = Vec::new();
    if let Some(m) = hlo {
        out.extend(debug_print(m, s, &mut claimed));
        out.extend(replicated(m, s, &mut claimed));
        out.extend(gathered_output(m, s, &mut claimed));
        out.extend(gathered_stack(m, s, &mut claimed));
        out.extend(gathered_input(m, s, &mut claimed));
        out.extend(no_donation(m, s));
        out.extend(donated_copied(m, s, &mut claimed));
    }
    if tight {
        out.extend(no_remat(input, s, &mut claimed));
        out.extend(large_activation(s, &claimed));
    }
    out.extend(padding(s));
    if tight {
        out.extend(f32_precision(s, &claimed));
        out.extend(batch_too_large(hlo, s, opts));
    }
    out.extend(arguments_exceed(s, opts));
    out.extend(shape_bug(s, opts));
    // Savings by what-if: the peak recomputed over the live ranges with the change applied.
    for c in &mut out {
        if c.changes.is_empty() {
            continue;
        }
        let w = crate::whatif::apply(s, c.cause.as_str(), &c.changes, opts.budget_bytes);
        c.savings_bytes = Some(w.peak_before_bytes.saturating_sub(w.peak_bytes));
        c.what_if = Some(w);
    }
    out.retain(|c| {
        c.savings_bytes
            .is_none_or(|b| b as f64 >= MATERIAL_SHARE * s.peak_bytes as f64)
    });
    for c in &mut out {
        if let (Some(b), Some(sv)) = (opts.budget_bytes, c.savings_bytes) {
            if s.device_bytes() > b {
                c.sufficient = Some(s.device_bytes().saturating_sub(sv) <= b);
            }
        }
    }
    out.sort_by(|a, b| {
        (b.cause == CauseKind::ShapeBug)
            .cmp(&(a.cause == CauseKind::ShapeBug))
            .then(
                b.savings_bytes
                    .unwrap_or(0)
                    .cmp(&a.savings_bytes.unwrap_or(0)),
            )
            .then(a.cause.cmp(&b.cause))
    });
    out
}

/// The entry computation's parameters that are arrays (not tuples), with their numbers.
fn array_params<'a, 'm>(
    entry: &'a hbm_doctor_hlo::hlo::Computation<'m>,
) -> impl Iterator<Item = (u32, &'a Instruction<'m>)> + 'a {
    entry
        .instructions
        .iter()
        .filter(|i| i.opcode == "parameter" && !i.shape.starts_with('('))
        .filter_map(|p| Some((p.parameter_number()?, p)))
}

/// Large entry parameters left whole on every device of an SPMD module, and the buffers of the
/// same shape (updated weights, gradients) that follow them.
fn replicated(m: &HloModule<'_>, s: &SpaceReport, claimed: &mut HashSet<String>) -> Vec<Cause> {
    let n = u64::from(m.num_partitions);
    if n <= 1 {
        return Vec::new();
    }
    let Some(entry) = m.entry() else {
        return Vec::new();
    };
    // Each array from 1% of the peak; the arrays of one kind together from 10%: a model is
    // many medium arrays (layers), not one big one.
    let threshold = (s.peak_bytes / 100).max(16 * MIB);
    let mut weights = Vec::new();
    let mut opt_state = Vec::new();
    for i in entry
        .instructions
        .iter()
        .filter(|i| i.opcode == "parameter")
    {
        let Some(sh) = i.sharding() else { continue };
        // Copied on every device, or on most of them: a 2 x 8 mesh whose weights are split over
        // the 2-way axis and copied over the 8-way one (the mesh's axes swapped) holds 8 copies.
        let copies = sharding_copies(sh, n);
        if copies < n && (copies < 4 || copies * 2 < n) {
            continue;
        }
        let Some(b) = s
            .buffers_at_peak
            .iter()
            .find(|b| b.name == i.name && b.kind == "parameter")
        else {
            continue;
        };
        if b.size_bytes < threshold {
            continue;
        }
        let op = unescape(i.metadata.op_name).to_lowercase();
        if ["opt_state", "mu", "nu", "momentum", "adam", "optimizer"]
            .iter()
            .any(|k| op_name_parts(&op).iter().any(|p| p.contains(k)))
        {
            opt_state.push((b, copies));
        } else {
            weights.push((b, copies));
        }
    }
    let mut causes = Vec::new();
    // Optimizer state first: Adam's two moments (and their updates) are twice the weights, and
    // sharding them (ZeRO-1) is the first thing to do under data parallelism. Each state array
    // takes itself and one same-shaped buffer (its update); each weight itself and the rest
    // (gradient, updated weight). Parameters are never taken by another parameter.
    for (list, kind, followers) in [
        (opt_state, CauseKind::OptimizerStateUnsharded, 1),
        (weights, CauseKind::ReplicatedTensor, usize::MAX),
    ] {
        let together: u64 = list.iter().map(|(b, _)| b.size_bytes).sum();
        if list.is_empty() || together * 10 < s.peak_bytes {
            continue;
        }
        let mut savings = 0;
        let mut names = Vec::new();
        let mut changes: Vec<(String, u32)> = Vec::new();
        for &(p, copies) in &list {
            let mut taken = 0;
            // A state array's follower is its updated value (an output); gradients (temps) stay
            // whole under ZeRO-1. A weight's followers are its gradient and updated value.
            let state = kind == CauseKind::OptimizerStateUnsharded;
            for b in s.buffers_at_peak.iter().filter(|b| {
                same_array(&b.layout_shape, &p.layout_shape)
                    && (b.name == p.name
                        || (b.kind != "parameter" && (!state || b.kind == "output")))
            }) {
                if b.name != p.name {
                    if taken >= followers || claimed.contains(&b.name) {
                        continue;
                    }
                    taken += 1;
                }
                if claimed.insert(b.name.clone()) {
                    savings += b.size_bytes - b.size_bytes / copies;
                    changes.push((b.name.clone(), (1000 / copies) as u32));
                    if b.name != p.name {
                        names.push(format!(
                            "{} ({}, {})",
                            b.name,
                            b.kind,
                            format_size(b.size_bytes)
                        ));
                    }
                }
            }
        }
        let first = list[0].0;
        let partial = list.iter().map(|&(_, c)| c).filter(|&c| c < n).max();
        let what = list
            .iter()
            .map(|(b, _)| {
                format!(
                    "{} {} ({}{})",
                    b.name,
                    b.shape,
                    format_size(b.size_bytes),
                    b.op_name
                        .as_deref()
                        .map(|o| format!(", `{o}`"))
                        .unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let held = match partial {
            None => format!(
                "{} sharding={{replicated}} in a module with num_partitions={n}: each of the {n} devices holds the whole array",
                if list.len() == 1 { "has" } else { "have" }
            ),
            Some(c) => format!(
                "{} split into only {} pieces, each copied on {c} of the {n} devices (last_tile_dim_replicate): each device holds {} of it where the mesh could hold 1/{n}",
                if list.len() == 1 { "is" } else { "are" },
                n / c,
                if n / c == 1 { "all".to_string() } else { format!("1/{}", n / c) }
            ),
        };
        let evidence = format!(
            "{what} {held}{}",
            if names.is_empty() {
                String::new()
            } else {
                format!(
                    "; same-shape buffers live at the peak: {}",
                    names.join(", ")
                )
            }
        );
        let mut c = cause(
            kind,
            Some(savings),
            evidence,
            vec![
                format!("shard {} over the mesh instead of replicating it (JAX: NamedSharding(mesh, P('d', None)) on the argument, or jax.lax.with_sharding_constraint inside the step; PyTorch/XLA: xs.mark_sharding(t, mesh, ('d', None)))", first.op_name.as_deref().unwrap_or(&first.name)),
            ],
        );
        c.changes = changes;
        c.snippets.push(snippet("jax", "from jax.sharding import NamedSharding, PartitionSpec as P\nw = jax.device_put(w, NamedSharding(mesh, P('d', None)))"));
        c.snippets.push(snippet(
            "pytorch_xla",
            "import torch_xla.distributed.spmd as xs\nxs.mark_sharding(w, mesh, ('d', None))",
        ));
        causes.push(c);
    }
    causes
}

fn is_host_transfer(i: &Instruction<'_>) -> bool {
    let op = i.metadata.op_name;
    let cc = i
        .attr("custom_call_target")
        .unwrap_or("")
        .to_ascii_lowercase();
    (matches!(i.opcode, "send" | "recv" | "send-done" | "recv-done")
        && i.attr("is_host_transfer") == Some("true"))
        || matches!(i.opcode, "outfeed" | "infeed")
        || (i.opcode == "custom-call" && (cc.contains("callback") || cc.contains("host")))
        || [
            "debug_print",
            "debug_callback",
            "io_callback",
            "pure_callback",
        ]
        .iter()
        .any(|k| op.contains(k))
}

/// Host callbacks / transfers that force tensors to materialize (and often be gathered first).
fn debug_print(m: &HloModule<'_>, s: &SpaceReport, claimed: &mut HashSet<String>) -> Vec<Cause> {
    // Every computation, not only the entry: a print inside a scan lives in the loop's body.
    let mut transfers: Vec<&Instruction<'_>> = Vec::new();
    // Data fed to the host, and what exists only to feed it (a gather to one device, a copy).
    let mut feeding: HashSet<&str> = HashSet::default();
    for comp in &m.computations {
        let here: Vec<&Instruction<'_>> = comp
            .instructions
            .iter()
            .filter(|i| is_host_transfer(i))
            .collect();
        if here.is_empty() {
            continue;
        }
        // Only now (most programs have no transfer): an index of the computation, 40k+ names on
        // big dumps.
        let by_name: HashMap<&str, &Instruction<'_>> =
            comp.instructions.iter().map(|i| (i.name, i)).collect();
        for t in &here {
            for o in &t.operands {
                let mut cur = *o;
                for _ in 0..8 {
                    let Some(i) = by_name.get(cur) else { break };
                    if i.opcode == "after-all"
                        || i.shape.starts_with("token")
                        || is_host_transfer(i) && !std::ptr::eq(*i, *t)
                    {
                        break;
                    }
                    feeding.insert(cur);
                    if !matches!(
                        i.opcode,
                        "all-gather"
                            | "all-gather-done"
                            | "copy"
                            | "bitcast"
                            | "get-tuple-element"
                            | "reshape"
                            | "transpose"
                    ) {
                        break;
                    }
                    match i.operands.first() {
                        Some(next) => cur = next,
                        None => break,
                    }
                }
            }
        }
        transfers.extend(here);
    }
    if transfers.is_empty() {
        return Vec::new();
    }
    let mut held: Vec<&BufferAtPeak> = s
        .buffers_at_peak
        .iter()
        .filter(|b| {
            b.kind == "temp"
                && (feeding.contains(b.name.split('{').next().unwrap_or(""))
                    || b.op_name
                        .as_deref()
                        .is_some_and(|o| o.contains("debug_print") || o.contains("callback")))
        })
        .collect();
    held.sort_by_key(|b| std::cmp::Reverse(b.size_bytes));
    // Everything held for the transfer goes away with it: the gathered copy and the tensor
    // materialized only to be printed.
    let savings: u64 = held.iter().map(|b| b.size_bytes).sum();
    for b in &held {
        claimed.insert(b.name.clone());
    }
    let ops: Vec<String> = transfers
        .iter()
        .filter(|t| matches!(t.opcode, "send" | "outfeed" | "custom-call"))
        .map(|t| {
            format!(
                "{} ({})",
                t.name,
                if t.opcode == "custom-call" {
                    t.attr("custom_call_target")
                        .unwrap_or("custom-call")
                        .trim_matches('"')
                        .to_string()
                } else {
                    t.opcode.to_string()
                }
            )
        })
        .collect();
    let src = transfers
        .iter()
        .find_map(|t| crate::origin::origin(Some(m), Some(t)).source)
        .map(|s| format!(" at {s}"))
        .unwrap_or_default();
    let heldtxt = if held.is_empty() {
        "no large buffer is live at the peak because of it".to_string()
    } else {
        format!(
            "live at the peak for it: {}",
            held.iter()
                .take(4)
                .map(|b| format!(
                    "{} {} ({}, {})",
                    b.name,
                    b.shape,
                    format_size(b.size_bytes),
                    b.opcode.as_deref().unwrap_or("?")
                ))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    if held.is_empty() && ops.is_empty() {
        return Vec::new();
    }
    let mut c = cause(
        CauseKind::DebugPrint,
        Some(savings),
        format!(
            "{} host transfer(s){src} ({}); {heldtxt}",
            transfers.len(),
            if ops.is_empty() {
                "recv/infeed".into()
            } else {
                ops.join(", ")
            }
        ),
        Vec::new(),
    );
    c.changes = held.iter().map(|b| (b.name.clone(), 0)).collect();
    c.snippets.push(snippet(
        "jax",
        "jax.debug.print(\"x sum {}\", x.sum())  # not the whole x",
    ));
    vec![c]
}

/// An output gathered whole on every device of an SPMD module: the entry's result comes (through
/// copies and bitcasts) from an all-gather, so the array and its gathered copy are full size on
/// each device: `out_shardings` replicating a sharded result, or returning a full array.
fn gathered_output(
    m: &HloModule<'_>,
    s: &SpaceReport,
    claimed: &mut HashSet<String>,
) -> Vec<Cause> {
    let n = u64::from(m.num_partitions);
    let Some(entry) = m.entry().filter(|_| n > 1) else {
        return Vec::new();
    };
    let by_name: HashMap<&str, &Instruction<'_>> =
        entry.instructions.iter().map(|i| (i.name, i)).collect();
    let Some(root) = entry.instructions.iter().find(|i| i.is_root) else {
        return Vec::new();
    };
    // The result's elements, followed back through copies, bitcasts and reshapes to what made them.
    let mut heads: Vec<&str> = if root.opcode == "tuple" {
        root.operands.clone()
    } else {
        vec![root.name]
    };
    heads.truncate(64);
    let mut found = Vec::new();
    for head in heads {
        let mut chain = vec![head];
        let mut cur = head;
        for _ in 0..4 {
            let Some(i) = by_name.get(cur) else { break };
            if i.opcode == "all-gather" {
                found.push(chain.clone());
                break;
            }
            if !matches!(i.opcode, "copy" | "bitcast" | "reshape" | "transpose") {
                break;
            }
            let Some(next) = i.operands.first() else {
                break;
            };
            cur = next;
            chain.push(cur);
        }
    }
    let mut causes = Vec::new();
    for chain in found {
        let live: Vec<&crate::analyze::BufferAtPeak> = s
            .buffers_at_peak
            .iter()
            .filter(|b| {
                chain
                    .iter()
                    .any(|c| b.name == *c || b.name.starts_with(&format!("{c}{{")))
            })
            .filter(|b| !claimed.contains(&b.name))
            .collect();
        let together: u64 = live.iter().map(|b| b.size_bytes).sum();
        if live.is_empty() || together * 10 < s.peak_bytes {
            continue;
        }
        let gather = chain.last().copied().unwrap_or_default();
        let mut savings = 0;
        let mut changes = Vec::new();
        for b in &live {
            claimed.insert(b.name.clone());
            savings += b.size_bytes - b.size_bytes / n;
            changes.push((b.name.clone(), (1000 / n) as u32));
        }
        let shape = live
            .first()
            .map(|b| b.layout_shape.clone())
            .unwrap_or_default();
        let mut c = cause(
            CauseKind::ReplicatedTensor,
            Some(savings),
            format!(
                "the result {shape} is gathered whole on each of the {n} devices (`{gather}` feeds the output): {} at the peak, {} of it",
                format_size(together),
                pct(together, s.peak_bytes)
            ),
            vec![format!(
                "keep the result sharded: out_shardings=NamedSharding(mesh, P('data', ...)) (not P()), and gather it on the host only if you need it whole (jax.device_get per shard); each device then holds 1/{n} of it"
            )],
        );
        c.changes = changes;
        causes.push(c);
    }
    causes
}

/// An input gathered whole on every device, and the work done on it whole: an all-gather of an
/// entry parameter (through copies and bitcasts), whose result and what is computed from it at
/// full size (filters, FFTs, pads of the whole array) are live at the peak, a tenth of it or more.
/// `shard_map(..., in_specs=P())` over a sharded input, or an `all_gather` at the top of a
/// per-shard function: every device holds and processes the whole array instead of its block.
fn gathered_input<'a>(
    m: &'a HloModule<'a>,
    s: &SpaceReport,
    claimed: &mut HashSet<String>,
) -> Vec<Cause> {
    let Some(entry) = m.entry().filter(|_| m.num_partitions > 1) else {
        return Vec::new();
    };
    let by_name: HashMap<&'a str, &'a Instruction<'a>> =
        entry.instructions.iter().map(|i| (i.name, i)).collect();
    let elements = |i: &Instruction<'_>| Shape::parse(i.shape).map(|x| x.elements());
    // The entry parameter a value is a copy of (through copies, bitcasts, async starts).
    let param_of = |mut cur: &'a str| -> Option<&'a Instruction<'a>> {
        for _ in 0..6 {
            let i = by_name.get(cur)?;
            match i.opcode {
                "parameter" => return Some(*i),
                "copy" | "copy-start" | "copy-done" | "bitcast" | "reshape" | "convert"
                | "all-gather-start" => cur = i.operands.first()?,
                _ => return None,
            }
        }
        None
    };
    let gathers: Vec<(&Instruction<'_>, &Instruction<'_>)> = entry
        .instructions
        .iter()
        .filter(|i| matches!(i.opcode, "all-gather" | "all-gather-done"))
        .filter_map(|g| Some((g, param_of(g.operands.first()?)?)))
        .collect();
    if gathers.is_empty() {
        return Vec::new();
    }
    let mut users: HashMap<&'a str, Vec<&'a str>> = HashMap::default();
    for i in &entry.instructions {
        for o in &i.operands {
            users.entry(*o).or_default().push(i.name);
        }
    }
    let mut causes = Vec::new();
    for (g, param) in gathers {
        let (Some(whole), Some(shard)) = (elements(g), elements(param)) else {
            continue;
        };
        let ways = whole / shard.max(1);
        if ways < 2 {
            continue;
        }
        // What is computed from the gathered array at its full size.
        let mut seen: HashSet<&str> = HashSet::default();
        let mut frontier = vec![g.name];
        seen.insert(g.name);
        for _ in 0..10 {
            let mut next = Vec::new();
            for n in frontier {
                for u in users.get(n).into_iter().flatten() {
                    let Some(i) = by_name.get(u) else { continue };
                    if matches!(i.opcode, "tuple" | "while" | "conditional" | "call")
                        // (A tuple's members are weighed at their get-tuple-elements.)
                        || !elements(i).map_or(i.shape.starts_with('('), |e| e * 2 >= whole)
                        || seen.len() >= 256
                    {
                        continue;
                    }
                    if seen.insert(u) {
                        next.push(*u);
                    }
                }
            }
            frontier = next;
        }
        let live: Vec<&BufferAtPeak> = s
            .buffers_at_peak
            .iter()
            .filter(|b| seen.contains(b.name.split('{').next().unwrap_or("")))
            .filter(|b| !claimed.contains(&b.name))
            .collect();
        let together: u64 = live.iter().map(|b| b.size_bytes).sum();
        if live.is_empty() || together * 10 < s.peak_bytes {
            continue;
        }
        let name = match param.metadata.op_name {
            "" => param.name,
            n => n,
        };
        let mut c = cause(
            CauseKind::ReplicatedTensor,
            None,
            format!(
                "the input `{name}` ({}) is all-gathered whole on every device (`{}`, {ways}x its shard), and what is computed from it is whole too: {} at the peak, {} of it",
                param.shape.split('{').next().unwrap_or(param.shape),
                g.name,
                format_size(together),
                pct(together, s.peak_bytes)
            ),
            vec![
                "keep it sharded and work on each device's block: shard_map in_specs matching the array's sharding (not P()), or no all_gather at the top of the per-shard function".into(),
                "where a device needs its neighbours' data, exchange only that (a halo with jax.lax.ppermute, all_to_all, psum_scatter) instead of the whole array".into(),
            ],
        );
        for b in &live {
            claimed.insert(b.name.clone());
            c.changes
                .push((b.name.clone(), (1000 / ways).max(1) as u32));
        }
        causes.push(c);
    }
    causes
}

/// A stack of layer parameters gathered whole: an all-gather of a stacked array (rank 3 or more,
/// 4 layers or more in its leading dimension, along the layer axis or a weight axis) that the
/// program holds (a parameter or the loop's state, not an
/// activation it computed), as large as a tenth of the peak. FSDP sharded along the stacked
/// layer axis (`P('fsdp', None, None)` on `[layers, d, f]`) makes every step of the scan gather
/// every layer's slice at once; sharded along a weight axis (`P(None, 'fsdp', None)`), each step
/// gathers one layer.
fn gathered_stack<'a>(
    m: &'a HloModule<'a>,
    s: &SpaceReport,
    claimed: &mut HashSet<String>,
) -> Vec<Cause> {
    if m.num_partitions <= 1 {
        return Vec::new();
    }
    let gathers: Vec<&BufferAtPeak> = s
        .buffers_at_peak
        .iter()
        .filter(|b| matches!(b.opcode.as_deref(), Some("all-gather" | "all-gather-done")))
        .filter(|b| b.size_bytes * 10 >= s.peak_bytes && !claimed.contains(&b.name))
        .collect();
    if gathers.is_empty() {
        return Vec::new();
    }
    let by_name: HashMap<&'a str, &'a Instruction<'a>> = m
        .computations
        .iter()
        .flat_map(|c| c.instructions.iter())
        .map(|i| (i.name, i))
        .collect();
    let held = |mut cur: &'a str| {
        for _ in 0..6 {
            let Some(i) = by_name.get(cur) else {
                return false;
            };
            match i.opcode {
                "parameter" | "get-tuple-element" => return true,
                "all-gather" | "all-gather-start" | "all-gather-done" | "copy" | "copy-done"
                | "convert" | "copy-start" | "bitcast" | "reshape" => match i.operands.first() {
                    Some(next) => cur = next,
                    None => return false,
                },
                _ => return false,
            }
        }
        false
    };
    let mut causes = Vec::new();
    for b in gathers {
        let Some(i) = by_name.get(b.name.split('{').next().unwrap_or("")) else {
            continue;
        };
        let dims: Vec<u64> = b
            .shape
            .split_once('[')
            .and_then(|(_, r)| r.split(']').next())
            .map(|d| d.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_default();
        let along: Option<usize> = i
            .attr("dimensions")
            .and_then(|d| d.trim_matches(|c| c == '{' || c == '}').trim().parse().ok());
        let layers = dims.first().copied().unwrap_or(0);
        if dims.len() < 3
            || along.is_none()
            || layers < 4
            || !i.operands.first().is_some_and(|o| held(o))
        {
            continue;
        }
        claimed.insert(b.name.clone());
        // Along the layer axis: FSDP sharded the stack by layers. Along a weight axis, the whole
        // stack still keeps its layer dimension: every layer's weights are gathered before the
        // loop (ZeRO-3 written as one gather up front) instead of one layer per step inside it.
        let (why, advice) = if along == Some(0) {
            (
                format!("a stack of {layers} layers' parameters sharded along its layer axis, so each step gathers every layer's slice at once"),
                "shard stacked layer parameters along a weight axis, not the layer axis: P(None, 'fsdp', None) on [layers, d, f] (not P('fsdp', None, None)); the scan then gathers one layer per step",
            )
        } else {
            (
                format!("all {layers} layers of a stacked parameter gathered at once, before the loop that uses them one layer at a time"),
                "gather one layer's weights per step inside the scan (slice the sharded stack in the scan body and constrain only that layer to be replicated), not the whole stack before it",
            )
        };
        let mut c = cause(
            CauseKind::ReplicatedTensor,
            None,
            format!(
                "`{}` gathers {} whole on every device ({}, {} of the peak): {why}",
                b.name,
                b.shape,
                format_size(b.size_bytes),
                pct(b.size_bytes, s.peak_bytes)
            ),
            vec![advice.into()],
        );
        c.changes = vec![(b.name.clone(), (1000 / layers).max(1) as u32)];
        causes.push(c);
    }
    // One stack gathered is one fix: the other stacks gathered up front with it, and the
    // full-size values of their shape that come with them (the gradient of the gathered stack,
    // before its reduce-scatter), are gathered one layer at a time too.
    let mut stacks = causes.into_iter();
    let Some(mut first) = stacks.next() else {
        return Vec::new();
    };
    let keep = first.changes.first().map_or(1, |c| c.1);
    let more = stacks.len();
    for c in stacks {
        first.changes.extend(c.changes);
    }
    let gathered: Vec<String> = first.changes.iter().map(|x| x.0.clone()).collect();
    let shapes: Vec<&str> = s
        .buffers_at_peak
        .iter()
        .filter(|b| gathered.contains(&b.name))
        .map(|b| b.layout_shape.as_str())
        .collect();
    for x in s.buffers_at_peak.iter().filter(|x| {
        x.kind == "temp"
            && !gathered.contains(&x.name)
            && !claimed.contains(&x.name)
            && shapes.iter().any(|sh| same_dims(sh, &x.layout_shape))
    }) {
        first.changes.push((x.name.clone(), keep));
    }
    if more > 0 {
        first.evidence = format!(
            "{}; {more} more stack(s) gathered the same way",
            first.evidence
        );
    }
    for (n, _) in &first.changes {
        claimed.insert(n.clone());
    }
    vec![first]
}

/// Entry parameters with a same-shaped output and no input_output_alias: both live at once.
fn no_donation(m: &HloModule<'_>, s: &SpaceReport) -> Vec<Cause> {
    let Some(entry) = m.entry() else {
        return Vec::new();
    };
    let Some(root) = entry.instructions.iter().find(|i| i.is_root) else {
        return Vec::new();
    };
    let aliased: HashSet<u32> = m.input_output_alias.iter().map(|a| a.param).collect();
    let aliased_outputs: HashSet<Vec<u64>> = m
        .input_output_alias
        .iter()
        .map(|a| a.output_index.clone())
        .collect();
    let mut outputs: Vec<(Vec<u64>, &str, bool)> = shape_leaves(root.shape)
        .into_iter()
        .filter(|(idx, _)| !aliased_outputs.contains(idx))
        .map(|(i, s)| (i, s, false))
        .collect();
    let threshold = (s.peak_bytes / 50).max(MIB);
    let mut found = Vec::new();
    for (num, p) in array_params(entry) {
        if aliased.contains(&num) {
            continue;
        }
        let size = s
            .buffers_at_peak
            .iter()
            .find(|b| b.name == p.name)
            .map_or(0, |b| b.size_bytes);
        if size < threshold {
            continue;
        }
        if let Some(o) = outputs
            .iter_mut()
            .find(|(_, sh, used)| !*used && same_array(sh, p.shape))
        {
            o.2 = true;
            found.push((p, size));
        }
    }
    if found.is_empty() {
        return Vec::new();
    }
    // With donation the outputs reuse the inputs, but an in-place update computed from the old
    // value (an optimizer step) still needs one temporary of the largest updated array at a
    // time. A parameter the program copies whole (`copy(param)`, then updated in place by a
    // dynamic-update-slice: a KV cache, a replay buffer) needs none: donated, the copy goes.
    // A plain copy: the same shape and layout (a layout-changing copy is a transpose).
    let copied: HashSet<(&str, &str)> = entry
        .instructions
        .iter()
        .filter(|i| i.opcode == "copy" && i.operands.len() == 1)
        .map(|i| (i.operands[0].trim_start_matches('%'), i.shape))
        .collect();
    let is_copied =
        |p: &Instruction<'_>| copied.contains(&(p.name.trim_start_matches('%'), p.shape));
    let total: u64 = found.iter().map(|(_, z)| z).sum();
    let in_place: Vec<u64> = found
        .iter()
        .filter(|(p, _)| !is_copied(p))
        .map(|(_, z)| *z)
        .collect();
    let largest = in_place.iter().copied().max().unwrap_or(0);
    let savings = if in_place.len() > 1 {
        total - largest
    } else {
        total
    };
    let nums: Vec<String> = found
        .iter()
        .filter_map(|(p, _)| p.parameter_number())
        .map(|n| n.to_string())
        .collect();
    let names: Vec<String> = found
        .iter()
        .map(|(p, z)| {
            let op = unescape(p.metadata.op_name);
            format!(
                "parameter {} {} ({}{})",
                p.parameter_number().unwrap_or(0),
                crate::origin::shape_without_layout(p.shape),
                format_size(*z),
                if op.is_empty() {
                    String::new()
                } else {
                    format!(", `{op}`")
                }
            )
        })
        .collect();
    let mut c = cause(
        CauseKind::NoDonation,
        Some(savings),
        format!("{} not donated although the outputs have the same shape: input and output copies exist at once ({}, {} of the peak)", names.join(", "), format_size(savings), pct(savings, s.peak_bytes)),
        vec![
            format!("donate the updated inputs: jax.jit(step, donate_argnums=({},)) (the module has no input_output_alias for them)", nums.join(", ")),
        ],
    );
    // The output copies go: one same-shaped output buffer per donated parameter, but for the
    // largest, whose in-place update still needs one temporary of its size.
    let mut taken: Vec<&str> = Vec::new();
    let mut by_size: Vec<&(&Instruction<'_>, u64)> = found.iter().collect();
    by_size.sort_by_key(|(p, z)| (is_copied(p), std::cmp::Reverse(*z)));
    for (k, (p, _)) in by_size.into_iter().enumerate() {
        if let Some(o) = s.buffers_at_peak.iter().find(|b| {
            b.kind == "output"
                && !taken.contains(&b.name.as_str())
                && same_array(&b.layout_shape, p.shape)
        }) {
            taken.push(&o.name);
            // Where the live ranges show the scratch each output held before its result was
            // written (the what-if keeps it), that scratch is the update's temporaries: every
            // output goes. Without them, the largest stays, as its in-place update's temporary.
            if k == 0 && in_place.len() > 1 && o.scratch.is_none() {
                continue;
            }
            c.changes.push((o.name.clone(), 0));
        }
    }
    c.snippets.push(snippet(
        "jax",
        &format!(
            "step = jax.jit(step, donate_argnums=({},))",
            nums.join(", ")
        ),
    ));
    vec![c]
}

/// A donated parameter copied whole and the copy live at the peak (a tenth of it or more): the
/// output aliases the parameter, yet the program reads the old value while it writes the new one
/// (a buffer shifted with `jnp.concatenate([new, buf])[:cap]`, a read after the update), so XLA
/// keeps a whole copy: the state exists twice. A ring buffer written in place
/// (`dynamic_update_slice` at a write index) needs no copy.
fn donated_copied(m: &HloModule<'_>, s: &SpaceReport, claimed: &mut HashSet<String>) -> Vec<Cause> {
    let Some(entry) = m.entry() else {
        return Vec::new();
    };
    let aliased: HashSet<u32> = m.input_output_alias.iter().map(|a| a.param).collect();
    let mut out = Vec::new();
    for (num, p) in array_params(entry) {
        if !aliased.contains(&num) {
            continue;
        }
        let pname = p.name.trim_start_matches('%');
        let Some(copy) = entry.instructions.iter().find(|i| {
            i.opcode == "copy"
                && i.operands.len() == 1
                && i.operands[0].trim_start_matches('%') == pname
                && i.shape == p.shape
        }) else {
            continue;
        };
        let cname = copy.name.trim_start_matches('%');
        // The copy feeds a shift of the array's own elements (a concatenate, a pad, a roll, a
        // slice): an update that cannot run in place. (A copy feeding matmuls and an
        // elementwise update is the compiler's own scheduling, `copy(params)` on CPU.)
        let shifted = entry.instructions.iter().any(|u| {
            u.operands
                .iter()
                .any(|o| o.trim_start_matches('%') == cname)
                && ["concatenate", "/pad", "roll", "slice"]
                    .iter()
                    .any(|k| u.metadata.op_name.contains(k))
        });
        if !shifted {
            continue;
        }
        let Some(b) = s
            .buffers_at_peak
            .iter()
            .find(|b| b.kind == "temp" && b.name == cname && !claimed.contains(&b.name))
        else {
            continue;
        };
        if b.size_bytes.saturating_mul(10) < s.peak_bytes {
            continue;
        }
        claimed.insert(b.name.clone());
        let op = unescape(p.metadata.op_name);
        let what = format!(
            "parameter {num} {}{}",
            crate::origin::shape_without_layout(p.shape),
            if op.is_empty() {
                String::new()
            } else {
                format!(" (`{op}`)")
            }
        );
        let mut c = cause(
            CauseKind::NoDonation,
            Some(b.size_bytes),
            format!(
                "{what} is donated (its output aliases it), yet `{cname}` copies it whole and the copy is live at the peak ({}, {} of it): the update reads the old value while writing the new one, so the state exists twice",
                format_size(b.size_bytes),
                pct(b.size_bytes, s.peak_bytes)
            ),
            vec![
                format!("update {what} in place: write the new rows with jax.lax.dynamic_update_slice (or .at[idx].set) at a write index (a ring buffer), not jnp.concatenate / a shift that reads the whole old array while the aliased output is written"),
            ],
        );
        c.changes.push((b.name.clone(), 0));
        c.snippets.push(snippet(
            "jax",
            "buf = jax.lax.dynamic_update_slice_in_dim(buf, new, idx, axis=1)  # in place\nidx = (idx + new.shape[1]) % buf.shape[1]",
        ));
        out.push(c);
    }
    out
}

/// Forward activations held until the backward pass, when the peak is in the backward pass.
fn no_remat(input: &ModuleInput<'_>, s: &SpaceReport, claimed: &mut HashSet<String>) -> Vec<Cause> {
    let Some(t) = s.peak_time else {
        return Vec::new();
    };
    let is_fwd = |o: &str| {
        o.contains("jvp(")
            && !o.contains("transpose(")
            && !o.contains("checkpoint")
            && !o.contains("remat")
    };
    let Some(m) = input.hlo else {
        return Vec::new();
    };
    // Instructions of the backward pass (a set of names, not an index of the whole module).
    let backward: HashSet<&str> = m
        .computations
        .iter()
        .flat_map(|c| &c.instructions)
        .filter(|i| i.metadata.op_name.contains("transpose("))
        .map(|i| i.name)
        .collect();
    // First backward instruction in the flattened schedule.
    let lr = input
        .live_range
        .or(input.buffer_assignment.and_then(|b| b.live_range.as_ref()));
    let seq: Vec<&str> = match lr {
        Some(l) => l.sequence.clone(),
        None => m
            .entry()
            .map(|e| e.instructions.iter().map(|i| i.name).collect())
            .unwrap_or_default(),
    };
    let first_bwd = seq.iter().position(|n| backward.contains(n));
    let Some(first_bwd) = first_bwd.map(|p| p as u64) else {
        return Vec::new();
    };
    if t < first_bwd {
        return Vec::new();
    }
    let mut held: Vec<&BufferAtPeak> = s
        .buffers_at_peak
        .iter()
        .filter(|b| {
            // (Not a buffer another cause explains: a parameter stack gathered whole is held
            // state, not an activation of the forward pass.)
            // (Nor one the compiler already rematerialized, `broadcast_in_dim.3.remat2`: it is
            // recomputed for the backward pass, and remat cannot make it smaller.)
            b.kind == "temp"
                && !claimed.contains(&b.name)
                && !b.name.contains(".remat")
                && b.op_name.as_deref().is_some_and(is_fwd)
                && b.live.is_some_and(|(st, en)| st < first_bwd && en >= t)
        })
        .collect();
    held.sort_by_key(|b| std::cmp::Reverse(b.size_bytes));
    let total: u64 = held.iter().map(|b| b.size_bytes).sum();
    if held.len() < 2 || total * 4 < s.peak_bytes {
        return Vec::new();
    }
    for b in &held {
        claimed.insert(b.name.clone());
    }
    let savings = total - held[0].size_bytes;
    let mut c = cause(
        CauseKind::NoRemat,
        Some(savings),
        format!(
            "{} forward activations ({}, {} of the peak) are produced before the backward pass starts (schedule position {first_bwd}) and are still live at the peak (position {t}): {}",
            held.len(),
            format_size(total),
            pct(total, s.peak_bytes),
            held.iter().take(4).map(|b| format!("{} {} ({}{})", b.name, b.shape, format_size(b.size_bytes), b.source.as_deref().map(|x| format!(", {x}")).unwrap_or_default())).collect::<Vec<_>>().join(", ")
        ),
        Vec::new(),
    );
    c.changes = held.iter().skip(1).map(|b| (b.name.clone(), 0)).collect();
    c.snippets.push(snippet(
        "jax",
        "block = jax.checkpoint(block)  # or nn.remat(Block) in Flax",
    ));
    vec![c]
}

/// One intermediate dominating the peak.
fn large_activation(s: &SpaceReport, claimed: &HashSet<String>) -> Vec<Cause> {
    let Some(b) = s
        .buffers_at_peak
        .iter()
        .filter(|b| b.kind == "temp" && !claimed.contains(&b.name))
        .max_by_key(|b| b.size_bytes)
    else {
        return Vec::new();
    };
    // A buffer that is mostly tile padding is the padding's story (`padding` below).
    if (b.size_bytes as u128) * 10 < (s.peak_bytes as u128) * 3
        || b.unpadded_bytes > 0 && b.size_bytes >= 2 * b.unpadded_bytes
    {
        return Vec::new();
    }
    let attention = dims_of(b).is_some_and(|sh| {
        sh.dims.len() >= 3
            && sh.dims[sh.dims.len() - 1] == sh.dims[sh.dims.len() - 2]
            && sh.dims[sh.dims.len() - 1] >= 512
    });
    let mut actions = Vec::new();
    if attention {
        actions.push("this looks like attention scores [.., S, S]: use a fused attention kernel (jax.nn.dot_product_attention(implementation='cudnn'), Pallas flash attention / splash attention on TPU) so the S x S matrix is never materialized".into());
    }
    actions.push(format!("compute {} in chunks (jax.lax.map / lax.scan over the batch or sequence) so only one chunk is live", b.op_name.as_deref().unwrap_or(&b.name)));
    let mut c = cause(
        CauseKind::LargeActivation,
        Some(b.size_bytes / 2),
        format!(
            "{} {} ({}{}) alone is {} of the peak{}",
            b.name,
            b.shape,
            format_size(b.size_bytes),
            b.op_name
                .as_deref()
                .map(|o| format!(", `{o}`"))
                .unwrap_or_default(),
            pct(b.size_bytes, s.peak_bytes),
            b.source
                .as_deref()
                .map(|x| format!(", from {x}"))
                .unwrap_or_default()
        ),
        actions,
    );
    // Computed in chunks (8 here), the activation and the values of its shape that come with it
    // (its softmax, its gradient, its copy in another precision, the same values reshaped) are
    // live one chunk at a time.
    c.changes = s
        .largest_buffers
        .iter()
        .chain(&s.buffers_at_peak)
        .filter(|x| {
            x.kind == "temp"
                && (same_dims(&x.layout_shape, &b.layout_shape)
                    || same_value_reshaped(&x.layout_shape, &b.layout_shape))
        })
        .map(|x| (x.name.clone(), 125))
        .collect();
    vec![c]
}

/// Tiled-layout padding among the buffers at the peak.
fn padding(s: &SpaceReport) -> Vec<Cause> {
    if s.padding_bytes < MIB || s.padding_bytes.saturating_mul(10) < s.peak_bytes {
        return Vec::new();
    }
    let mut worst: Vec<&BufferAtPeak> = s
        .buffers_at_peak
        .iter()
        .filter(|b| b.size_bytes > b.unpadded_bytes)
        .collect();
    worst.sort_by_key(|b| std::cmp::Reverse(b.size_bytes - b.unpadded_bytes));
    let list = worst
        .iter()
        .take(3)
        .map(|b| {
            format!(
                "{} {} {} for {} of data ({:.1}x)",
                b.name,
                b.layout_shape,
                format_size(b.size_bytes),
                format_size(b.unpadded_bytes),
                b.size_bytes as f64 / b.unpadded_bytes.max(1) as f64
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let hint = worst.first().and_then(|b| dims_of(b)).map(|sh| {
        let tiled: Vec<String> = sh.tiled_dims().iter().map(|(d, t)| format!("dim {d} ({}) to a multiple of {t}", sh.dims.get(*d).copied().unwrap_or(0))).collect();
        format!("the tiled dims are {}: make them multiples of the tile, or transpose so the small dims are not the two most minor", tiled.join(" and "))
    });
    let mut actions = Vec::new();
    if let Some(h) = hint {
        actions.insert(0, h);
    }
    let mut c = cause(
        CauseKind::Padding,
        Some(s.padding_bytes),
        format!(
            "padding is {} of the {} peak ({}); worst: {list}",
            format_size(s.padding_bytes),
            format_size(s.peak_bytes),
            pct(s.padding_bytes, s.peak_bytes)
        ),
        actions,
    );
    c.changes = worst
        .iter()
        .map(|b| {
            let keep = u128::from(b.unpadded_bytes) * 1000 / u128::from(b.size_bytes.max(1));
            (b.name.clone(), keep as u32)
        })
        .collect();
    vec![c]
}

/// Large f32 activations and outputs where bf16 would serve: temporaries, and outputs that are
/// not the new value of an f32 parameter (master weights stay f32). Buffers another detector
/// already explains (a gathered debug print, a replicated weight, held activations) are left to
/// it.
fn f32_precision(s: &SpaceReport, claimed: &HashSet<String>) -> Vec<Cause> {
    let params: Vec<&BufferAtPeak> = s
        .buffers_at_peak
        .iter()
        .filter(|b| b.kind == "parameter")
        .collect();
    let f32s: Vec<&BufferAtPeak> = s
        .buffers_at_peak
        .iter()
        .filter(|b| {
            b.shape.starts_with("f32[")
                && !claimed.contains(&b.name)
                && (b.kind == "temp"
                    || (b.kind == "output" && !params.iter().any(|p| p.shape == b.shape)))
        })
        .collect();
    let bytes: u64 = f32s.iter().map(|b| b.size_bytes).sum();
    if bytes < 256 * MIB || bytes * 2 < s.peak_bytes {
        return Vec::new();
    }
    let mut c = cause(
        CauseKind::F32Precision,
        Some(bytes / 2),
        format!("{} f32 intermediates and outputs are live at the peak ({}, {} of it); in bf16 they would take half", f32s.len(), format_size(bytes), pct(bytes, s.peak_bytes)),
        Vec::new(),
    );
    c.changes = f32s.iter().map(|b| (b.name.clone(), 500)).collect();
    vec![c]
}

/// Temporaries scaling with a leading batch dimension.
fn batch_too_large(
    hlo: Option<&HloModule<'_>>,
    s: &SpaceReport,
    opts: &AnalyzeOptions,
) -> Vec<Cause> {
    let Some(m) = hlo else { return Vec::new() };
    let Some(entry) = m.entry() else {
        return Vec::new();
    };
    // Candidate batch sizes: leading dims of non-tuple entry parameters that carry data, not
    // model state. Parameters named as weights or optimizer state, and dims that lead several
    // weight-shaped parameters (`scan` over stacked layers: [L, d, d], [L, d, f]), are the layer
    // count, not the batch.
    let params: Vec<(&Instruction<'_>, Shape)> = entry
        .instructions
        .iter()
        .filter(|i| i.opcode == "parameter")
        .filter_map(|i| Shape::parse(i.shape).map(|sh| (i, sh)))
        .filter(|(_, sh)| sh.dims.len() >= 2)
        .collect();
    let weight_like = |sh: &Shape| {
        let n = sh.dims.len();
        n >= 3 && sh.dims[n - 1] >= 128 && sh.dims[n - 2] >= 128
    };
    let stacked = |d: u64| {
        let mut trailing: Vec<&[u64]> = params
            .iter()
            .filter(|(_, sh)| sh.dims[0] == d && weight_like(sh))
            .map(|(_, sh)| &sh.dims[1..])
            .collect();
        trailing.sort_unstable();
        trailing.dedup();
        trailing.len() >= 2
    };
    let is_state = |i: &Instruction<'_>| {
        let op = unescape(i.metadata.op_name).to_lowercase();
        [
            "param",
            "weight",
            "kernel",
            "opt_state",
            "['mu']",
            "['nu']",
            ".mu",
            ".nu",
            "embedding",
        ]
        .iter()
        .any(|k| op.contains(k))
    };
    // Split along its weight axes but not its leading one: model state, whatever its name.
    let split_as_state = |i: &Instruction<'_>| i.sharding().is_some_and(sharding_splits_inner_only);
    let mut candidates: Vec<u64> = params
        .iter()
        .filter(|(i, sh)| !is_state(i) && !split_as_state(i) && !stacked(sh.dims[0]))
        .map(|(_, sh)| sh.dims[0])
        .filter(|&d| d >= 8)
        .collect();
    candidates.sort_unstable();
    candidates.dedup();
    let temps: Vec<&BufferAtPeak> = s
        .buffers_at_peak
        .iter()
        .filter(|b| b.kind == "temp")
        .collect();
    let best = candidates
        .iter()
        .map(|&bsz| {
            (
                bsz,
                temps
                    .iter()
                    .filter(|b| {
                        dims_of(b).is_some_and(|sh| sh.dims.len() >= 2 && sh.dims[0] == bsz)
                    })
                    .map(|b| b.size_bytes)
                    .sum::<u64>(),
            )
        })
        .max_by_key(|&(_, z)| z);
    let Some((bsz, bytes)) = best else {
        return Vec::new();
    };
    let over = opts
        .budget_bytes
        .map(|b| s.device_bytes().saturating_sub(b));
    if (bytes as u128) * 10 < (s.peak_bytes as u128) * 3 || over == Some(0) {
        return Vec::new();
    }
    let batch_buffers: Vec<&BufferAtPeak> = s
        .largest_buffers
        .iter()
        .chain(&s.buffers_at_peak)
        .filter(|b| {
            b.kind == "temp" && dims_of(b).is_some_and(|sh| sh.dims.len() >= 2 && sh.dims[0] == bsz)
        })
        .collect();
    let scaled = |nb: u64| -> Vec<(String, u32)> {
        let keep = (nb.min(bsz) * 1000 / bsz.max(1)) as u32;
        batch_buffers
            .iter()
            .map(|b| (b.name.clone(), keep))
            .collect()
    };
    // The largest batch whose recomputed peak fits, by bisection over the what-if.
    let fitting = opts.budget_bytes.and_then(|budget| {
        let fits = |nb: u64| {
            crate::whatif::apply(s, "batch", &scaled(nb), Some(budget)).total_bytes <= budget
        };
        if !fits(1) {
            return None;
        }
        let (mut lo, mut hi) = (1, bsz);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Some(lo)
    });
    let (savings, action, new_batch) = match over {
        Some(need) if need < bytes => {
            let keep = 1.0 - need as f64 / bytes as f64;
            let mut nb = fitting.unwrap_or_else(|| ((bsz as f64 * keep).floor() as u64).max(1));
            if nb >= 8 {
                nb -= nb % 8;
            }
            (Some(bytes - (u128::from(bytes) * u128::from(nb) / u128::from(bsz.max(1))) as u64), format!("reduce the batch from {bsz} to at most {nb} (or split it into {} micro-batches with gradient accumulation)", bsz.div_ceil(nb.max(1))), nb)
        }
        Some(_) => (Some(bytes / 2), format!("the batch-sized temporaries ({}) are smaller than the overflow: shrinking the batch alone will not fit; halve it ({bsz} -> {}) and combine with the other causes", format_size(bytes), bsz / 2), bsz / 2),
        None => (Some(bytes / 2), format!("halve the batch ({bsz} -> {}) or use 2 micro-batches with gradient accumulation", bsz / 2), bsz / 2),
    };
    let mut c = cause(
        CauseKind::BatchTooLarge,
        savings,
        format!("temporaries with leading dimension {bsz} (the batch of the inputs) take {} at the peak ({} of it)", format_size(bytes), pct(bytes, s.peak_bytes)),
        vec![action],
    );
    c.changes = scaled(new_batch);
    vec![c]
}

/// A total ten times the budget or more: no batch or precision change closes that; a shape or a
/// configuration is wrong.
fn shape_bug(s: &SpaceReport, opts: &AnalyzeOptions) -> Vec<Cause> {
    let Some(b) = opts.budget_bytes else {
        return Vec::new();
    };
    if s.device_bytes() < b.saturating_mul(10) {
        return Vec::new();
    }
    let biggest = s
        .buffers_at_peak
        .iter()
        .max_by_key(|b| b.size_bytes)
        .map(|x| {
            format!(
                "; largest: {} {} ({}{})",
                x.name,
                x.shape,
                format_size(x.size_bytes),
                x.source
                    .as_deref()
                    .map(|src| format!(", {src}"))
                    .unwrap_or_default()
            )
        })
        .unwrap_or_default();
    vec![cause(
        CauseKind::ShapeBug,
        Some(s.device_bytes().saturating_sub(b)),
        format!(
            "the program needs {}, {:.0}x the {} budget{biggest}: a swapped axis, a broadcast outer product or a size typo, not a tuning problem",
            format_size(s.device_bytes()),
            s.device_bytes() as f64 / b.max(1) as f64,
            format_size(b)
        ),
        Vec::new(),
    )]
}

/// Inputs alone do not fit the budget.
fn arguments_exceed(s: &SpaceReport, opts: &AnalyzeOptions) -> Vec<Cause> {
    let Some(b) = opts.budget_bytes else {
        return Vec::new();
    };
    let args = s.arguments_bytes + s.outputs_bytes;
    if args <= b {
        return Vec::new();
    }
    vec![cause(
        CauseKind::ArgumentsExceed,
        None,
        format!(
            "arguments ({}) and outputs ({}) alone exceed the budget {}",
            format_size(s.arguments_bytes),
            format_size(s.outputs_bytes),
            format_size(b)
        ),
        vec![
            "donate inputs that are updated (donate_argnums) so outputs reuse their buffers".into(),
        ],
    )]
}

#[cfg(test)]
mod tests {
    //! The detectors on compiled broken/fixed pairs of tests/corpus/tpu: the cause is found in
    //! the broken program and not in its fix.
    use crate::analyze::AnalyzeOptions;
    use crate::dump::{analyze_texts, testdata::dump};
    use crate::CauseKind;

    fn causes(rel: &str) -> Vec<CauseKind> {
        let r = analyze_texts(&dump(rel), &AnalyzeOptions::default()).expect("analyze");
        r.diagnosis.causes.iter().map(|c| c.cause).collect()
    }

    #[test]
    fn debug_print_found_and_gone_once_fixed() {
        assert!(causes("tpu/debug_print_v5e/dump").contains(&CauseKind::DebugPrint));
        assert!(!causes("tpu/debug_print_fixed_v5e/dump").contains(&CauseKind::DebugPrint));
    }

    #[test]
    fn undonated_inputs_found_and_gone_once_fixed() {
        assert!(causes("tpu/no_donation_v5e/dump").contains(&CauseKind::NoDonation));
        assert!(!causes("tpu/no_donation_fixed_v5e/dump").contains(&CauseKind::NoDonation));
    }
}
