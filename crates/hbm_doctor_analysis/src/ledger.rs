//! The requirement ledger: what the failing program needs, split into accounted parts (model
//! state, outputs, temporaries and the recognisable activations among them, padding, the
//! runtime's reserve), each with its bytes and how the figure is known.
//!
//! Only stated figures and listed buffers are used: a part the text does not show is absent, and
//! what the parts do not explain is `unaccounted`.

use crate::model::LedgerEntry;
use hbm_doctor_hlo::Shape;
use hbm_doctor_log::{format_size, Allocation, Event, Phase};

fn entry(part: &str, bytes: u64, basis: &str, note: String) -> LedgerEntry {
    LedgerEntry {
        part: part.into(),
        bytes,
        basis: basis.into(),
        note,
    }
}

/// Whether an allocation's name or op_name marks optimizer state (optax `mu`/`nu`, `opt_state`,
/// Adam moments).
pub fn is_optimizer_state(a: &Allocation) -> bool {
    let text = format!(
        "{} {}",
        a.op_name.as_deref().unwrap_or(""),
        a.label.as_deref().unwrap_or("")
    )
    .to_ascii_lowercase();
    [
        "opt_state",
        "adam",
        "/mu",
        "/nu",
        ".mu",
        ".nu",
        "exp_avg",
        "momentum",
    ]
    .iter()
    .any(|n| text.contains(n))
}

fn is_parameter(a: &Allocation) -> bool {
    matches!(
        a.allocation_type.as_deref(),
        Some("Entry Parameter" | "parameter")
    )
}

/// `logits` or `attention_scores` when the shape says so.
fn activation_part(a: &Allocation) -> Option<&'static str> {
    let s = Shape::parse(a.shape.as_deref()?)?;
    let d = &s.dims;
    let n = d.len();
    if n >= 3 && d[n - 1] == d[n - 2] && d[n - 1] >= 512 {
        return Some("attention_scores");
    }
    if n >= 3 && d[n - 1] >= 30_000 {
        return Some("logits");
    }
    None
}

/// The ledger of one event.
pub fn of_event(e: &Event) -> Vec<LedgerEntry> {
    let mut out = Vec::new();
    if e.phase == Phase::Runtime {
        if let Some(u) = e.used_bytes {
            out.push(entry(
                "in_use",
                u,
                "stated",
                "held by this allocator when the request failed".into(),
            ));
        }
        if let Some(r) = e.requested_bytes {
            out.push(entry(
                "request",
                r,
                "stated",
                "the allocation that failed".into(),
            ));
        }
        if let Some(f) = e.free_bytes {
            out.push(entry("free", f, "stated", "free when it failed".into()));
        }
        if let Some(f) = e.largest_free_bytes {
            out.push(entry(
                "largest_free_block",
                f,
                "stated",
                "the largest contiguous free region".into(),
            ));
        }
        if let (Some(l), Some(u)) = (e.limit_bytes, e.used_bytes) {
            let other = l
                .saturating_sub(u)
                .saturating_sub(e.free_bytes.unwrap_or(0));
            if e.free_bytes.is_some() && other > 0 {
                out.push(entry(
                    "unaccounted",
                    other,
                    "derived",
                    "limit - in use - free: held outside this allocator (another process, the runtime)".into(),
                ));
            }
        }
        return out;
    }
    let opt: u64 = e
        .allocations
        .iter()
        .filter(|a| is_optimizer_state(a))
        .map(|a| a.size_bytes)
        .sum();
    let listed_params: u64 = e
        .allocations
        .iter()
        .filter(|a| is_parameter(a) && !is_optimizer_state(a))
        .map(|a| a.size_bytes)
        .sum();
    let mut accounted = 0u64;
    match e.arguments_bytes {
        Some(args) if opt > 0 && opt <= args => {
            out.push(entry(
                "optimizer_state",
                opt,
                "listed",
                "listed buffers named as optimizer state (opt_state, mu/nu, Adam moments)".into(),
            ));
            out.push(entry(
                "parameters",
                args - opt,
                "derived",
                "arguments minus the optimizer state listed".into(),
            ));
            accounted += args;
        }
        Some(args) => {
            out.push(entry(
                "arguments",
                args,
                "stated",
                "parameters, optimizer state and inputs of the program".into(),
            ));
            accounted += args;
        }
        None if listed_params > 0 => {
            out.push(entry(
                "arguments",
                listed_params,
                "listed",
                "entry parameters among the listed buffers (a lower bound)".into(),
            ));
            accounted += listed_params;
        }
        None => {}
    }
    if let Some(o) = e.output_bytes {
        let own = o.saturating_sub(e.output_aliased_bytes.unwrap_or(0));
        if own > 0 {
            out.push(entry(
                "outputs",
                own,
                "derived",
                "outputs that do not reuse an argument's buffer".into(),
            ));
            accounted += own;
        }
    }
    let temps = e.hlo_temp_bytes.or_else(|| {
        let listed: u64 = e
            .allocations
            .iter()
            .filter(|a| !is_parameter(a))
            .map(|a| a.size_bytes)
            .sum();
        (listed > 0).then_some(listed)
    });
    // Listed slots can hold several values: never more than the requirement leaves.
    let room = e.used_bytes.map(|u| u.saturating_sub(accounted));
    let temps = match (temps, e.hlo_temp_bytes, room) {
        (Some(t), None, Some(r)) => Some(t.min(r)),
        (t, _, _) => t,
    };
    if let Some(t) = temps {
        let stated = e.hlo_temp_bytes.is_some();
        let mut special = 0u64;
        for part in ["logits", "attention_scores"] {
            let b: u64 = e
                .allocations
                .iter()
                .filter(|a| !is_parameter(a) && activation_part(a) == Some(part))
                .map(|a| a.size_bytes)
                .sum();
            if b > 0 {
                out.push(entry(
                    part,
                    b,
                    "listed",
                    format!("listed temporaries shaped like {}", part.replace('_', " ")),
                ));
                special += b;
            }
        }
        out.push(entry(
            "temporaries",
            t.saturating_sub(special),
            if stated { "stated" } else { "listed" },
            if stated {
                "HLO temporaries (activations saved for the backward pass, intermediates)".into()
            } else {
                "listed temporaries (a lower bound)".into()
            },
        ));
        accounted += t;
    }
    let padding = match (e.hlo_temp_padded_bytes, e.hlo_temp_unpadded_bytes) {
        (Some(p), Some(u)) if p > u => p - u,
        _ => e
            .allocations
            .iter()
            .filter_map(|a| a.unpadded_bytes.map(|u| a.size_bytes.saturating_sub(u)))
            .sum(),
    };
    if padding > 0 {
        out.push(entry(
            "padding",
            padding,
            "derived",
            "tiled-layout padding inside the temporaries above".into(),
        ));
    }
    if let Some(f) = e.fragmentation_bytes.filter(|&f| f > 0) {
        out.push(entry(
            "fragmentation",
            f,
            "stated",
            "unusable gaps in the temp heap".into(),
        ));
    }
    if let Some(r) = e.reserved_bytes {
        out.push(entry(
            "reserved",
            r,
            "stated",
            "held by the runtime, outside the program's limit".into(),
        ));
    }
    if let Some(u) = e.used_bytes {
        if accounted > 0 && u > accounted && (u - accounted) as f64 > u as f64 * 0.02 {
            out.push(entry(
                "unaccounted",
                u - accounted,
                "derived",
                format!(
                    "of the {} required, not explained by the parts above",
                    format_size(u)
                ),
            ));
        }
    }
    out
}

/// Whether a parameter's op_name (JAX writes the argument's tree path there) marks optimizer
/// state.
fn names_optimizer_state(op_name: &str) -> bool {
    let op = op_name.to_ascii_lowercase();
    [
        "opt_state",
        "['mu']",
        "['nu']",
        ".mu",
        ".nu",
        "/mu",
        "/nu",
        "adam",
        "momentum",
        "exp_avg",
    ]
    .iter()
    .any(|k| op.contains(k))
}

/// The ledger of one memory space of a dump: measured, not estimated.
pub fn of_space(s: &crate::model::SpaceReport) -> Vec<LedgerEntry> {
    let mut out = Vec::new();
    let params: Vec<&crate::model::BufferAtPeak> = s
        .buffers_at_peak
        .iter()
        .filter(|b| b.kind == "parameter")
        .collect();
    let opt: u64 = params
        .iter()
        .filter(|b| b.op_name.as_deref().is_some_and(names_optimizer_state))
        .map(|b| b.size_bytes)
        .sum();
    if opt > 0 && opt <= s.arguments_bytes {
        out.push(entry(
            "optimizer_state",
            opt,
            "measured",
            "entry parameters whose argument path names optimizer state (opt_state, mu, nu)".into(),
        ));
        out.push(entry(
            "parameters",
            s.arguments_bytes - opt,
            "measured",
            "the other entry parameters (weights, inputs)".into(),
        ));
    } else if s.arguments_bytes > 0 {
        out.push(entry(
            "arguments",
            s.arguments_bytes,
            "measured",
            "entry parameters (weights, optimizer state, inputs)".into(),
        ));
    }
    if s.outputs_bytes > 0 {
        out.push(entry(
            "outputs",
            s.outputs_bytes,
            "measured",
            "outputs that do not reuse a donated parameter".into(),
        ));
    }
    let mut special = 0u64;
    for part in ["logits", "attention_scores"] {
        let b: u64 = s
            .buffers_at_peak
            .iter()
            .filter(|b| b.kind == "temp")
            .filter(|b| {
                let a = Allocation {
                    size_bytes: b.size_bytes,
                    shape: Some(b.shape.clone()),
                    ..Allocation::default()
                };
                activation_part(&a) == Some(part)
            })
            .map(|b| b.size_bytes)
            .sum();
        if b > 0 && special + b <= s.temp_bytes {
            out.push(entry(
                part,
                b,
                "measured",
                format!(
                    "temporaries at the peak shaped like {}",
                    part.replace('_', " ")
                ),
            ));
            special += b;
        }
    }
    if s.temp_bytes > 0 {
        out.push(entry(
            "temporaries",
            s.temp_bytes.saturating_sub(special),
            "measured",
            "the temp arena: activations kept for the backward pass and intermediates".into(),
        ));
    }
    if s.padding_bytes > 0 {
        out.push(entry(
            "padding",
            s.padding_bytes,
            "measured",
            "tiled-layout padding among the buffers live at the peak".into(),
        ));
    }
    if s.fragmentation_bytes > 0 {
        out.push(entry(
            "fragmentation",
            s.fragmentation_bytes,
            "measured",
            "total minus peak: what the temp arena's packing loses".into(),
        ));
    }
    if s.constants_bytes > 0 {
        out.push(entry(
            "constants",
            s.constants_bytes,
            "measured",
            "constants".into(),
        ));
    }
    out
}
