//! `explain LOG --dump DIR`: the error's figures plus the dump's analysis give one diagnosis.
//!
//! The log says how far over the limit the program is; the dump says which buffers are live at
//! the peak, where they come from in the user's source, and what the detectors measured. The
//! join picks the dump module of the failing program, fills the main event's allocation list
//! from the buffers at the peak when the message listed none (or listed them without source
//! lines), and merges the dump's causes into the ranking: causes that close the gap first, then
//! causes the dump measured, then by savings.

use crate::model::{AnalyzeReport, Cause, ExplainReport, ModuleReport};
use hbm_doctor_log::Allocation;

/// The module of `dump` that the event's program names, else the one with the most HBM.
pub fn pick_module<'a>(dump: &'a AnalyzeReport, program: Option<&str>) -> Option<&'a ModuleReport> {
    let hbm = |m: &ModuleReport| {
        m.memory_spaces
            .iter()
            .find(|s| s.space == "hbm")
            .map_or(0, |s| s.device_bytes())
    };
    if let Some(p) = program {
        if let Some(m) = dump.modules.iter().find(|m| {
            m.name == p || m.name.trim_start_matches("jit_") == p.trim_start_matches("jit_")
        }) {
            return Some(m);
        }
    }
    dump.modules.iter().max_by_key(|m| hbm(m))
}

/// Joins a dump's analysis into an explain report. Returns the module used.
pub fn join_dump(report: &mut ExplainReport, dump: &AnalyzeReport) -> Option<String> {
    let d = report.diagnosis.as_mut()?;
    let event = report.events.get_mut(d.event)?;
    let module = pick_module(dump, event.program.as_deref())?;
    let space = module.memory_spaces.iter().find(|s| s.space == "hbm")?;
    let sourced = event.allocations.iter().any(|a| a.source.is_some());
    if event.allocations.is_empty() || !sourced {
        event.allocations = allocations_of(space);
    }
    if event.arguments_bytes.is_none() {
        event.arguments_bytes = Some(space.arguments_bytes);
    }
    // With the dump's buffers in hand, the guide's decision tree can go past "unknown".
    if d.category == crate::model::Category::Unknown {
        d.category = crate::explain::categorize(event);
    }
    // The dump measures what the message could only state or list.
    d.ledger = crate::ledger::of_space(space);
    if let Some(input) = &d.rank_input {
        crate::rank::hand_order(input, &mut d.causes);
    }
    // Merge causes: the dump's evidence is measured, so it replaces the log's guess.
    let exceeded = event.exceeded_bytes;
    for dc in &module.causes {
        match d.causes.iter_mut().find(|c| c.cause == dc.cause) {
            Some(c) => {
                c.evidence = format!("{} (measured in the dump: {})", c.evidence, dc.evidence);
                if dc.savings_bytes.is_some() {
                    c.savings_bytes = dc.savings_bytes;
                }
                // The dump's actions name its buffers: they come first, the rule's after.
                let mut actions = dc.actions.clone();
                for a in &c.actions {
                    if !actions.contains(a) {
                        actions.push(a.clone());
                    }
                }
                c.actions = actions;
            }
            None => d.causes.push(dc.clone()),
        }
    }
    for c in &mut d.causes {
        c.sufficient = match (c.savings_bytes, exceeded) {
            (Some(s), Some(x)) if x > 0 => Some(s >= x),
            _ => c.sufficient,
        };
    }
    // Measured causes that close the gap first, then the other measured ones by savings; the
    // log's order is kept for the rest. (A cause the dump did not measure "closes the gap" by
    // construction: the device's or the batch's savings are the overshoot itself.)
    let measured: Vec<crate::model::CauseKind> = module.causes.iter().map(|c| c.cause).collect();
    let key = |c: &Cause| {
        let m = measured.contains(&c.cause);
        (
            !(m && c.sufficient == Some(true)),
            !m,
            std::cmp::Reverse(if m { c.savings_bytes.unwrap_or(0) } else { 0 }),
        )
    };
    // Causes about the situation rather than the program's buffers (a shape bug, a capped
    // limit, growth over steps, another holder) stay first when the log put them first: the
    // dump cannot refute them.
    use crate::model::CauseKind as K;
    let situational = d.causes.first().is_some_and(|c| {
        matches!(
            c.cause,
            K::ShapeBug
                | K::Preallocation
                | K::MemoryLeak
                | K::MemorySpike
                | K::Recompilation
                | K::OtherProcess
                | K::Fragmentation
                | K::KernelTiling
                | K::HostOom
        )
    });
    let start = usize::from(situational);
    d.causes[start..].sort_by_key(key);
    d.dump_module = Some(module.name.clone());
    Some(module.name.clone())
}

/// The buffers live at the peak (the 20 largest) as a message's allocation list.
fn allocations_of(space: &crate::model::SpaceReport) -> Vec<Allocation> {
    space
        .buffers_at_peak
        .iter()
        .take(20)
        .map(|b| Allocation {
            size_bytes: b.size_bytes,
            unpadded_bytes: Some(b.unpadded_bytes),
            shape: Some(b.layout_shape.clone())
                .filter(|s| !s.is_empty())
                .or_else(|| Some(b.shape.clone())),
            op_name: b.op_name.clone(),
            source: b.source_path.clone().or_else(|| b.source.clone()).map(|p| {
                match (&b.source, p.contains(':')) {
                    (Some(s), false) => format!("{p}:{}", s.rsplit(':').next().unwrap_or("")),
                    _ => p,
                }
            }),
            label: Some(b.name.clone()),
            allocation_type: Some(b.kind.clone()),
            op_type: None,
        })
        .collect()
}

/// One engine for `analyze` too: a program that does not fit its budget is diagnosed as the
/// compiler's OOM message would be (its total as `used`, the budget as `limit`, its arguments,
/// outputs and temporaries), then the dump joins in as with `explain --dump`. `None` when there
/// is no budget, or the program fits (then the waste detectors alone speak).
pub fn diagnose_dump(dump: &AnalyzeReport) -> Option<crate::model::Diagnosis> {
    use hbm_doctor_log::{Backend, Event, Family, MemorySpace, Phase};
    let budget = dump.diagnosis.budget_bytes?;
    let module = pick_module(dump, None)?;
    let space = module.memory_spaces.iter().find(|s| s.space == "hbm")?;
    if space.device_bytes() <= budget {
        return None;
    }
    let tpu = space
        .buffers_at_peak
        .iter()
        .any(|b| b.layout_shape.contains(":T("));
    let event = Event {
        line: 1,
        phase: Phase::Compile,
        backend: tpu.then_some(Backend::Tpu),
        memory_space: Some(MemorySpace::Hbm),
        used_bytes: Some(space.device_bytes()),
        limit_bytes: Some(budget),
        exceeded_bytes: Some(space.device_bytes() - budget),
        arguments_bytes: Some(space.arguments_bytes),
        output_bytes: Some(space.outputs_bytes + space.aliased_bytes),
        output_aliased_bytes: Some(space.aliased_bytes),
        hlo_temp_bytes: Some(space.temp_bytes),
        family: if tpu {
            Family::TpuCompileHbm
        } else {
            Family::Unrecognized
        },
        message: format!(
            "{} needs {} of {}",
            module.name,
            space.device_bytes(),
            budget
        ),
        fatal: true,
        repeats: 1,
        program: Some(module.name.clone()),
        allocations: allocations_of(space),
        ..Event::default()
    };
    let mut report = crate::explain::explain(vec![event]);
    join_dump(&mut report, dump)?;
    report.diagnosis
}
