//! Folds parsed pieces into events: one event per failure, however many times it was printed.
//!
//! The same failure usually appears several times: libtpu's log line, the Python exception, a
//! re-raise ("During handling of the above exception"), `[9x]` repeats. Two consecutive events
//! are one when their stated figures agree (within the rounding of human-readable sizes) and they
//! are close in the log. The last rematerialization warning before a failure attaches to it,
//! allocator `Stats:` to the failure before them. Non-fatal warnings are counted and summarised
//! per kind ([`WarningTally`]), never stored one by one; fatal events are never dropped.

use crate::event::{Event, Family, Remat, WarningKind, WarningSummary, WarningTally};
use crate::parse::Piece;

/// Lines within which two prints of the same figures are one event.
const SAME_EVENT_LINES: u64 = 20_000;
/// Lines within which a figure-less `RESOURCE_EXHAUSTED` belongs to a neighbouring event.
const BARE_EVENT_LINES: u64 = 60;
/// Non-fatal events kept one by one at most (suppressed OOMs); every one is counted in the
/// warnings summary. Fatal events are never dropped.
pub const MAX_NON_FATAL_EVENTS: usize = 1_000;

/// Merges pieces (in input order) into events (in input order).
pub fn merge(pieces: Vec<Piece>) -> Vec<Event> {
    let mut merger = Merger::default();
    for piece in pieces {
        merger.push(piece);
    }
    merger.finish().0
}

/// The headline of the pending remat warning: cleaned text, or the raw line it will be cleaned
/// from if it ever becomes an event (the fast path copies bytes, it does not clean them).
#[derive(Debug)]
enum PendingMessage {
    Text(String),
    Raw,
}

/// Folds pieces into events as they stream in, in memory that grows with the number of distinct
/// failures only: warnings are counted per kind ([`WarningTally`]), and the last remat warning
/// is held until the next piece tells whether it belongs to a failure.
#[derive(Debug, Default)]
pub struct Merger {
    events: Vec<Event>,
    /// Last line of each event, parallel to `events`.
    last_line: Vec<u64>,
    pending_remat: Option<(u64, Remat, PendingMessage)>,
    pending_raw: Vec<u8>,
    pending_context: Option<Piece>,
    /// A warning was summarised (not kept) since the last event: the next piece does not merge
    /// into that event across it.
    barrier: bool,
    warnings: WarningTally,
    non_fatal: usize,
    truncated: bool,
}

impl Merger {
    /// A merger at the start of a log.
    pub fn new() -> Merger {
        Merger::default()
    }

    /// Whether non-fatal events beyond [`MAX_NON_FATAL_EVENTS`] were summarised only.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// A remat warning read by the scanner's fast path. Its raw line is handed over with
    /// [`Merger::keep_pending_raw`] only before the scanner's buffer is dropped, and only if it
    /// is still pending then (at most once per buffer, not once per warning).
    pub(crate) fn push_remat_fast(&mut self, line: u64, remat: Remat) {
        self.warnings.add_remat(line, &remat);
        self.displace_pending_remat();
        self.pending_remat = Some((line, remat, PendingMessage::Raw));
    }

    /// Copies the raw line of the pending fast-path warning at `line`, if it is still pending.
    pub(crate) fn keep_pending_raw(&mut self, line: u64, raw: &[u8]) {
        if let Some((l, _, PendingMessage::Raw)) = &self.pending_remat {
            if *l == line {
                self.pending_raw.clear();
                self.pending_raw.extend_from_slice(raw);
            }
        }
    }

    /// A remat warning that no failure followed: summarised, not kept.
    fn displace_pending_remat(&mut self) {
        if self.pending_remat.take().is_some() {
            self.barrier = true;
        }
    }

    fn pending_message(&self, message: PendingMessage) -> String {
        match message {
            PendingMessage::Text(t) => t,
            PendingMessage::Raw => {
                crate::parse::headline_text(&crate::clean::clean_line(&self.pending_raw))
            }
        }
    }

    fn push_event(&mut self, event: Event, line: u64) {
        if !event.fatal {
            if self.non_fatal >= MAX_NON_FATAL_EVENTS {
                self.truncated = true;
                self.barrier = true;
                return;
            }
            self.non_fatal += 1;
        }
        self.events.push(event);
        self.last_line.push(line);
        self.barrier = false;
    }

    /// Adds one piece (pieces come in input order).
    pub fn push(&mut self, piece: Piece) {
        match piece {
            Piece::Remat {
                line,
                remat,
                message,
            } => {
                self.warnings.add_remat(line, &remat);
                self.displace_pending_remat();
                self.pending_remat = Some((line, remat, PendingMessage::Text(message)));
            }
            Piece::Warning { kind, figures } => self.warnings.add(kind, figures),
            Piece::AllocatorStats {
                line,
                limit,
                in_use,
                largest_free,
            } => {
                if let (Some(e), false) = (self.events.last_mut(), self.barrier) {
                    let close = line.saturating_sub(*self.last_line.last().unwrap_or(&0)) < 200_000;
                    // A failure told in words owns no allocator dump: it is the printed one's.
                    if close
                        && !e.told
                        && matches!(
                            e.family,
                            Family::BfcAllocator
                                | Family::GpuOomAllocate
                                | Family::TfOomTensor
                                | Family::GpuFailedRequest
                                | Family::Unrecognized
                        )
                    {
                        // A bare `ResourceExhaustedError` whose allocator statistics follow:
                        // the BFC allocator is what failed.
                        if e.family == Family::Unrecognized && (limit.is_some() || in_use.is_some())
                        {
                            e.family = Family::BfcAllocator;
                            e.memory_space =
                                e.memory_space.or(Some(crate::event::MemorySpace::Device));
                        }
                        e.limit_bytes = e.limit_bytes.or(limit);
                        e.used_bytes = e.used_bytes.or(in_use);
                        e.largest_free_bytes = e.largest_free_bytes.or(largest_free);
                        if let Some(l) = self.last_line.last_mut() {
                            *l = line;
                        }
                        return;
                    }
                }
                if limit.is_none() && in_use.is_none() {
                    return;
                }
                // An allocator dump printed without (or before) its error line: it is printed only
                // when an allocation failed.
                self.push_event(
                    Event {
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
                    },
                    line,
                );
            }
            Piece::Skip => {}
            context @ Piece::Context { .. } => self.pending_context = Some(context),
            Piece::Event(mut event) => {
                let event_line = event.line;
                if let Some(Piece::Context {
                    line: l,
                    arguments,
                    aliased,
                    outputs,
                    temps,
                }) = self.pending_context.take()
                {
                    if event_line.saturating_sub(l) < SAME_EVENT_LINES {
                        event.arguments_bytes = event.arguments_bytes.or(arguments);
                        event.output_aliased_bytes = event.output_aliased_bytes.or(aliased);
                        event.output_bytes = event.output_bytes.or(outputs);
                        event.hlo_temp_bytes = event.hlo_temp_bytes.or(temps);
                    }
                }
                if let Some((l, r, _)) = &self.pending_remat {
                    // The last warning before a failure is evidence for it.
                    if event.fatal && event_line.saturating_sub(*l) < SAME_EVENT_LINES {
                        event.remat = Some(r.clone());
                        self.pending_remat = None;
                    } else {
                        self.displace_pending_remat();
                    }
                }
                if !event.fatal {
                    let figures = crate::event::WarningFigures {
                        line: event_line,
                        used_bytes: event.used_bytes,
                        limit_bytes: event.limit_bytes,
                        exceeded_bytes: event.exceeded_bytes.or(event
                            .used_bytes
                            .zip(event.limit_bytes)
                            .and_then(|(u, l)| u.checked_sub(l))),
                        requested_bytes: event.requested_bytes,
                        remat: None,
                    };
                    self.warnings.add(WarningKind::SuppressedOom, figures);
                }
                if !self.barrier {
                    if let (Some(prev), Some(prev_last)) =
                        (self.events.last_mut(), self.last_line.last_mut())
                    {
                        if same_event(prev, *prev_last, &event) {
                            absorb(prev, *event);
                            *prev_last = event_line;
                            return;
                        }
                    }
                }
                self.push_event(*event, event_line);
            }
        }
    }

    /// Ends the merge: the events in input order (a remat warning that no failure followed is
    /// kept as the last event, so a log of warnings alone still has one), and the warnings
    /// summarised per kind.
    pub fn finish(mut self) -> (Vec<Event>, Vec<WarningSummary>) {
        if let Some((l, r, m)) = self.pending_remat.take() {
            let message = self.pending_message(m);
            self.events.push(remat_event(l, r, message));
        }
        let mut events = self.events;
        for e in &mut events {
            e.derive();
        }
        // A requirement block with no listing and no figure over a limit is what a *successful*
        // compile logs (`Total hbm usage >= 1.88G`): not an event.
        // Unless the compiler's out-of-memory listing header was pasted with it, or it needs
        // more than the TPU the text names can hold.
        // A failure told in words gives way to any failure printed in the same text, and one
        // failure told twice (a title, then the text) is one event.
        if events.iter().any(|e| e.fatal && !e.told) {
            events.retain(|e| !e.told);
        } else if events.len() > 1 {
            events.truncate(1);
        }
        events.retain(|e| {
            !(e.partial
                && e.allocations.is_empty()
                && e.family != Family::BfcAllocator
                && e.exceeded_bytes.is_none()
                && !e.listing_header
                && !over_named_tpu(e))
        });
        (events, self.warnings.summaries())
    }
}

/// A requirement that exceeds what one device of the TPU the text names (`v2-8`, `v5e`) offers.
fn over_named_tpu(e: &Event) -> bool {
    let (Some(used), Some(acc)) = (e.used_bytes, e.accelerator.as_deref()) else {
        return false;
    };
    hbm_doctor_units::chips::tpu_by_name(acc).is_some_and(|t| used > t.usable_bytes)
}

fn remat_event(line: u64, remat: Remat, message: String) -> Event {
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

/// `next` repeats `prev` on another device: printed within a few lines of it, with the same
/// family, message shape and every stated figure equal.
fn echoed_by_devices(prev: &Event, prev_last: u64, next: &Event) -> bool {
    let near = next.line.saturating_sub(prev_last) <= 3;
    let figures = [
        (prev.used_bytes, next.used_bytes),
        (prev.limit_bytes, next.limit_bytes),
        (prev.requested_bytes, next.requested_bytes),
        (prev.free_bytes, next.free_bytes),
    ];
    near && prev.figure_count() > 0
        && prev.figure_count() == next.figure_count()
        && figures.iter().all(|(a, b)| a == b)
}

fn same_event(prev: &Event, prev_last: u64, next: &Event) -> bool {
    if prev.told || next.told {
        return false;
    }
    let distance = next.line.saturating_sub(prev_last);
    if prev.memory_space.is_some()
        && next.memory_space.is_some()
        && prev.memory_space != next.memory_space
    {
        return false;
    }
    if let (Some(a), Some(b)) = (&prev.device, &next.device) {
        // The same failure printed by every device of one program at once (SPMD replicas:
        // `... on device ordinal 7`, `... ordinal 1`, on the next lines, every figure equal) is
        // one failure; other device pairs are separate failures.
        if a != b && prev.family == next.family && !echoed_by_devices(prev, prev_last, next) {
            return false;
        }
    }
    // An old TensorFlow tensor listed with its shape alone (no byte figure stated): the line
    // that names the op whose allocation the allocator's message above just refused.
    let shape_only = |e: &Event| {
        e.figure_count() == 1 && e.requested_bytes.is_none() && e.allocations.len() == 1
    };
    if prev.family == Family::Unrecognized
        || next.family == Family::Unrecognized
        || prev.figure_count() == 0
        || next.figure_count() == 0
        || shape_only(prev)
        || shape_only(next)
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
        allocated_bytes,
        model_params,
        param_bits,
        accelerator,
        batch_tried,
        holder_named,
        growth_said,
        structure_predictor,
        image_upscaler,
        vae_decode,
        failing_op,
        device_named_bytes,
        devices_named
    );
    if let (Some(a), Some(b)) = (&mut into.device, &from.device) {
        // Devices that echoed the same failure, listed once each (a few, then a count).
        if !a.split(", ").any(|d| d == b) {
            let listed = a.split(", ").count();
            if listed < 8 {
                a.push_str(", ");
                a.push_str(b);
            } else if !a.ends_with("more") {
                a.push_str(", and more");
            }
        }
    }
    if from.allocations.len() > into.allocations.len() {
        into.allocations = from.allocations;
    }
    into.fatal |= from.fatal;
    into.partial &= from.partial;
    into.repeats += from.repeats;
}
