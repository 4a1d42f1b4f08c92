//! Folds parsed pieces into events: one event per failure, however many times it was printed.
//!
//! The same failure usually appears several times: libtpu's log line, the Python exception, a
//! re-raise ("During handling of the above exception"), `[9x]` repeats. Two consecutive events
//! are one when their stated figures agree (within the rounding of human-readable sizes) and they
//! are close in the log. Rematerialization warnings attach to the failure after them, allocator
//! `Stats:` to the failure before them.

use crate::event::{Event, Family};
use crate::parse::Piece;

/// Lines within which two prints of the same figures are one event.
const SAME_EVENT_LINES: u64 = 20_000;
/// Lines within which a figure-less `RESOURCE_EXHAUSTED` belongs to a neighbouring event.
const BARE_EVENT_LINES: u64 = 60;

/// Merges pieces (in input order) into events (in input order).
pub fn merge(pieces: Vec<Piece>) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::new();
    let mut last_line: Vec<u64> = Vec::new(); // last line of each event, parallel to `events`
    let mut pending_remat: Option<(u64, crate::event::Remat, String)> = None;
    let mut pending_context: Option<crate::parse::Piece> = None;
    for piece in pieces {
        match piece {
            Piece::Remat {
                line,
                remat,
                message,
            } => {
                if let Some((l, r, m)) = pending_remat.take() {
                    events.push(remat_event(l, r, m));
                    last_line.push(l);
                }
                pending_remat = Some((line, remat, message));
            }
            Piece::AllocatorStats {
                line,
                limit,
                in_use,
                largest_free,
            } => {
                if let Some(e) = events.last_mut() {
                    let close = line.saturating_sub(*last_line.last().unwrap_or(&0)) < 200_000;
                    if close
                        && matches!(
                            e.family,
                            Family::BfcAllocator
                                | Family::GpuOomAllocate
                                | Family::TfOomTensor
                                | Family::GpuFailedRequest
                                | Family::Unrecognized
                        )
                    {
                        e.limit_bytes = e.limit_bytes.or(limit);
                        e.used_bytes = e.used_bytes.or(in_use);
                        e.largest_free_bytes = e.largest_free_bytes.or(largest_free);
                        if let Some(l) = last_line.last_mut() {
                            *l = line;
                        }
                        continue;
                    }
                }
                if limit.is_none() && in_use.is_none() {
                    continue;
                }
                // An allocator dump printed without (or before) its error line: it is printed only
                // when an allocation failed.
                events.push(Event {
                    line,
                    family: Family::BfcAllocator,
                    phase: crate::event::Phase::Runtime,
                    memory_space: Some(crate::event::MemorySpace::Device),
                    backend: Some(crate::event::Backend::Gpu),
                    fatal: true,
                    partial: true,
                    repeats: 1,
                    used_bytes: in_use,
                    limit_bytes: limit,
                    largest_free_bytes: largest_free,
                    message: "allocator dump (Stats:)".into(),
                    ..Event::default()
                });
                last_line.push(line);
            }
            Piece::Skip => {}
            context @ Piece::Context { .. } => pending_context = Some(context),
            Piece::Event(mut event) => {
                let event_line = event.line;
                if let Some(Piece::Context {
                    line: l,
                    arguments,
                    aliased,
                    outputs,
                    temps,
                }) = pending_context.take()
                {
                    if event_line.saturating_sub(l) < SAME_EVENT_LINES {
                        event.arguments_bytes = event.arguments_bytes.or(arguments);
                        event.output_aliased_bytes = event.output_aliased_bytes.or(aliased);
                        event.output_bytes = event.output_bytes.or(outputs);
                        event.hlo_temp_bytes = event.hlo_temp_bytes.or(temps);
                    }
                }
                if let Some((l, r, m)) = pending_remat.take() {
                    if event.fatal && event_line.saturating_sub(l) < SAME_EVENT_LINES {
                        event.remat = Some(r);
                    } else {
                        events.push(remat_event(l, r, m));
                        last_line.push(l);
                    }
                }
                if let (Some(prev), Some(prev_last)) = (events.last_mut(), last_line.last_mut()) {
                    if same_event(prev, *prev_last, &event) {
                        absorb(prev, *event);
                        *prev_last = event_line;
                        continue;
                    }
                }
                events.push(*event);
                last_line.push(event_line);
            }
        }
    }
    if let Some((l, r, m)) = pending_remat.take() {
        events.push(remat_event(l, r, m));
    }
    for e in &mut events {
        e.derive();
    }
    // A requirement block with no listing and no figure over a limit is what a *successful*
    // compile logs (`Total hbm usage >= 1.88G`): not an event.
    events.retain(|e| {
        !(e.partial
            && e.allocations.is_empty()
            && e.family != Family::BfcAllocator
            && e.exceeded_bytes.is_none())
    });
    events
}

fn remat_event(line: u64, remat: crate::event::Remat, message: String) -> Event {
    Event {
        line,
        family: Family::RematWarning,
        fatal: false,
        repeats: 1,
        used_bytes: Some(remat.reduced_to_bytes),
        limit_bytes: Some(remat.target_bytes),
        message,
        remat: Some(remat),
        ..Event::default()
    }
}

/// Two figures agree when both are stated and equal within the 0.5% rounding of `28.50G`.
pub fn agree(a: Option<u64>, b: Option<u64>) -> Option<bool> {
    match (a, b) {
        (Some(a), Some(b)) => {
            let (lo, hi) = (a.min(b) as f64, a.max(b) as f64);
            Some(hi - lo <= hi * 0.006 + 1024.0)
        }
        _ => None,
    }
}

fn same_event(prev: &Event, prev_last: u64, next: &Event) -> bool {
    let distance = next.line.saturating_sub(prev_last);
    if prev.memory_space.is_some()
        && next.memory_space.is_some()
        && prev.memory_space != next.memory_space
    {
        return false;
    }
    if let (Some(a), Some(b)) = (&prev.device, &next.device) {
        if a != b && prev.family == next.family {
            return false;
        }
    }
    if prev.family == Family::Unrecognized
        || next.family == Family::Unrecognized
        || prev.figure_count() == 0
        || next.figure_count() == 0
    {
        return distance <= BARE_EVENT_LINES;
    }
    if prev.partial || next.partial {
        let conflict = [
            agree(prev.used_bytes, next.used_bytes),
            agree(prev.limit_bytes, next.limit_bytes),
        ]
        .contains(&Some(false));
        return distance <= 400 && !conflict;
    }
    if distance > SAME_EVENT_LINES {
        return false;
    }
    let checks = [
        agree(prev.used_bytes, next.used_bytes),
        agree(prev.limit_bytes, next.limit_bytes),
        agree(prev.requested_bytes, next.requested_bytes),
        agree(prev.free_bytes, next.free_bytes),
        agree(prev.tensorcore_bytes, next.tensorcore_bytes),
        agree(prev.sparsecore_bytes, next.sparsecore_bytes),
    ];
    let stated: Vec<bool> = checks.iter().flatten().copied().collect();
    !stated.is_empty() && stated.iter().all(|&ok| ok)
}

fn absorb(into: &mut Event, from: Event) {
    let richer = (into.partial && !from.partial)
        || (from.partial == into.partial && from.family.richness() > into.family.richness())
        || (from.partial == into.partial
            && from.family.richness() == into.family.richness()
            && from.figure_count() > into.figure_count());
    if richer {
        into.family = from.family;
        into.message = from.message.clone();
        into.phase = from.phase;
    }
    macro_rules! fill {
        ($($f:ident),*) => { $( if into.$f.is_none() { into.$f = from.$f.clone(); } )* };
    }
    fill!(
        backend,
        framework,
        memory_space,
        used_bytes,
        limit_bytes,
        exceeded_bytes,
        requested_bytes,
        free_bytes,
        tensorcore_bytes,
        sparsecore_bytes,
        program,
        reserved_bytes,
        program_bytes,
        arguments_bytes,
        output_bytes,
        output_aliased_bytes,
        hlo_temp_bytes,
        hlo_temp_unpadded_bytes,
        hlo_temp_padded_bytes,
        fragmentation_bytes,
        largest_free_bytes,
        device,
        remat,
        step,
        near,
        stage,
        pool_setting,
        process_bytes,
        allocated_bytes
    );
    if from.allocations.len() > into.allocations.len() {
        into.allocations = from.allocations;
    }
    into.fatal |= from.fatal;
    into.partial &= from.partial;
    into.repeats += from.repeats;
}
