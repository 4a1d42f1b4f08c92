//! Bounded per-series storage. Samples are folded into windows (min, max, sum, the step of the
//! maximum...); when a segment holds [`MAX_WINDOWS`] windows, neighbours merge pairwise and each
//! window covers twice as many samples. A series keeps its last two segments (processes), so the
//! retained state never grows with the input, however long the run.

/// Windows kept per segment before pairs merge.
pub const MAX_WINDOWS: usize = 2048;

/// One sample of device memory.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sample {
    /// Training step, when the source says.
    pub step: Option<u64>,
    /// Unix seconds, when the source says.
    pub ts: Option<f64>,
    /// Bytes in use.
    pub used: u64,
    /// The device's limit, when the source says.
    pub limit: Option<u64>,
    /// The process high-water mark, when the source says.
    pub peak: Option<u64>,
}

/// What the x axis of a segment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// Training steps.
    Step,
    /// Unix seconds.
    Time,
    /// Sample ordinal (neither steps nor times in the input).
    Ordinal,
}

/// Samples folded together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// Samples in the window.
    pub n: u32,
    /// x of the first sample.
    pub x0: f64,
    /// x of the last sample.
    pub x1: f64,
    /// Smallest value (the floor).
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// x of the largest value.
    pub argmax_x: f64,
    /// Step of the largest value.
    pub argmax_step: Option<u64>,
    /// Time of the largest value.
    pub argmax_ts: Option<f64>,
    /// Sum of values (mean = sum / n).
    pub sum: f64,
    /// First step and time in the window.
    pub s0: Option<u64>,
    /// Last step.
    pub s1: Option<u64>,
    /// First time.
    pub t0: Option<f64>,
    /// Last time.
    pub t1: Option<f64>,
}

impl Window {
    fn new(x: f64, s: &Sample) -> Self {
        let v = s.used as f64;
        Window {
            n: 1,
            x0: x,
            x1: x,
            min: v,
            max: v,
            argmax_x: x,
            argmax_step: s.step,
            argmax_ts: s.ts,
            sum: v,
            s0: s.step,
            s1: s.step,
            t0: s.ts,
            t1: s.ts,
        }
    }

    fn push(&mut self, x: f64, s: &Sample) {
        let v = s.used as f64;
        self.n += 1;
        self.x1 = x;
        self.min = self.min.min(v);
        if v > self.max {
            self.max = v;
            self.argmax_x = x;
            self.argmax_step = s.step;
            self.argmax_ts = s.ts;
        }
        self.sum += v;
        self.s0 = self.s0.or(s.step);
        self.s1 = s.step.or(self.s1);
        self.t0 = self.t0.or(s.ts);
        self.t1 = s.ts.or(self.t1);
    }

    /// Folds `o` (which follows `self`) into `self`.
    pub fn merge(&mut self, o: &Window) {
        self.n += o.n;
        self.x1 = o.x1;
        self.min = self.min.min(o.min);
        if o.max > self.max {
            self.max = o.max;
            self.argmax_x = o.argmax_x;
            self.argmax_step = o.argmax_step;
            self.argmax_ts = o.argmax_ts;
        }
        self.sum += o.sum;
        self.s0 = self.s0.or(o.s0);
        self.s1 = o.s1.or(self.s1);
        self.t0 = self.t0.or(o.t0);
        self.t1 = o.t1.or(self.t1);
    }

    /// Middle of the window on the x axis.
    pub fn mid(&self) -> f64 {
        0.5 * (self.x0 + self.x1)
    }
}

/// One process's samples of one device.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The x axis, fixed by the first sample.
    pub axis: Axis,
    /// Folded samples, oldest first.
    pub windows: Vec<Window>,
    /// Samples per full window.
    pub per_window: u32,
    /// Samples in the segment.
    pub samples: u64,
    /// The last limit seen.
    pub limit: Option<u64>,
    /// The largest process peak seen.
    pub peak: Option<u64>,
    /// The last value.
    pub last_used: u64,
    last_x: f64,
    last_step: Option<u64>,
    last_ts: Option<f64>,
}

impl Segment {
    fn new(s: &Sample) -> Self {
        let axis = if s.step.is_some() {
            Axis::Step
        } else if s.ts.is_some() {
            Axis::Time
        } else {
            Axis::Ordinal
        };
        Segment {
            axis,
            windows: Vec::new(),
            per_window: 1,
            samples: 0,
            limit: None,
            peak: None,
            last_used: 0,
            last_x: 0.0,
            last_step: None,
            last_ts: None,
        }
    }

    fn x_of(&self, s: &Sample) -> f64 {
        match self.axis {
            Axis::Step => s.step.map_or(self.last_x, |v| v as f64),
            Axis::Time => s.ts.unwrap_or(self.last_x),
            Axis::Ordinal => self.samples as f64,
        }
    }

    fn push(&mut self, s: &Sample) {
        let x = self.x_of(s);
        match self.windows.last_mut() {
            Some(w) if w.n < self.per_window => w.push(x, s),
            _ => self.windows.push(Window::new(x, s)),
        }
        if self.windows.len() > MAX_WINDOWS {
            let old = std::mem::take(&mut self.windows);
            let mut it = old.chunks(2);
            for pair in &mut it {
                let mut w = pair[0];
                if let Some(o) = pair.get(1) {
                    w.merge(o);
                }
                self.windows.push(w);
            }
            self.per_window *= 2;
        }
        self.samples += 1;
        self.limit = s.limit.or(self.limit);
        self.peak = match (self.peak, s.peak) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.last_used = s.used;
        self.last_x = x;
        self.last_step = s.step.or(self.last_step);
        self.last_ts = s.ts.or(self.last_ts);
    }

    /// The first and last step of the segment.
    pub fn step_range(&self) -> (Option<u64>, Option<u64>) {
        (self.windows.first().and_then(|w| w.s0), self.last_step)
    }

    /// The first and last time of the segment.
    pub fn time_range(&self) -> (Option<f64>, Option<f64>) {
        (self.windows.first().and_then(|w| w.t0), self.last_ts)
    }
}

/// Why a new segment began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary {
    /// The step went back (restart from a checkpoint).
    StepBack,
    /// Memory fell to a small fraction of its floor and the series continued (restart dip).
    Dip,
    /// The input said the process ended (a recording's `process_exit`/`source_down`).
    Marked,
    /// A pause in the times, and memory back below its level before it (a fresh warm-up).
    TimeGap,
    /// Another process wrote the samples (a new pid).
    NewProcess,
}

/// Samples a file's series holds as read, to be put in order before they are folded into
/// windows; beyond, samples stream straight into the windows.
pub const RAW_CAP: usize = 1 << 16;

/// Samples held as read over all the series of an input (the per-series cap shrinks with the
/// number of devices, to [`MIN_RAW_CAP`] at least): about 150 MB.
pub const MAX_HELD: usize = 1 << 21;

/// The smallest per-series cap.
pub const MIN_RAW_CAP: usize = 4096;

/// One device's series: the last two processes.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// Older process (kept for context), then the current one.
    pub segments: Vec<Segment>,
    /// Restarts seen (segments begun after the first).
    pub restarts: u32,
    /// Samples seen in all processes.
    pub total_samples: u64,
    /// What began the current segment.
    pub last_boundary: Option<Boundary>,
    /// Whether samples are held as read (up to [`RAW_CAP`]) and put in order before they are
    /// folded (files, where rows may come out of order); a live feed streams (false).
    pub buffered: bool,
    /// Samples read and not yet folded (buffered series).
    pub raw: Vec<Sample>,
    /// Most samples held (0: [`RAW_CAP`]); set from the number of series sharing
    /// [`MAX_HELD`].
    pub raw_cap: usize,
    /// Values skipped as invalid (NaN, infinite, negative, beyond any device).
    pub invalid: u64,
    /// Samples that came out of order and were put back in place.
    pub reordered: u64,
    /// Duplicate samples merged (same step and value).
    pub duplicates: u64,
    /// Process of each held sample: an index into `pids` plus one (0: not said).
    raw_pid: Vec<u16>,
    /// Process ids seen (at most 1024).
    pids: Vec<u64>,
    /// Process of the last sample streamed.
    last_pid: u16,
    /// Median step between samples, once known (streaming tolerance for rows out of order).
    step_gap: Option<u64>,
    pending_break: bool,
}

fn median_u64(mut v: Vec<u64>) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let m = v.len() / 2;
    Some(*v.select_nth_unstable(m).1)
}

fn median_f(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut w = v.to_vec();
    w.sort_by(f64::total_cmp);
    w[w.len() / 2]
}

/// Whether memory after `i` is back below its level before `i` (a new process warming up):
/// the median of the next 4 values under the median of the previous 8 by at least 1% of the
/// limit (2% of the level without a limit) and more than the noise of the previous values.
fn fell_to_base(v: &[Sample], i: usize, limit: Option<u64>) -> bool {
    if i < 4 || i + 2 > v.len() {
        return false;
    }
    let before: Vec<f64> = v[i.saturating_sub(8)..i]
        .iter()
        .map(|s| s.used as f64)
        .collect();
    let after: Vec<f64> = v[i..(i + 4).min(v.len())]
        .iter()
        .map(|s| s.used as f64)
        .collect();
    let mb = median_f(&before);
    let ma = median_f(&after);
    let spread = before.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        - before.iter().copied().fold(f64::INFINITY, f64::min);
    let floor = limit.map_or(0.02 * mb, |l| 0.01 * l as f64);
    ma < mb - floor.max(0.5 * spread)
}

impl Series {
    /// A series for a file: samples are held and put in order before folding.
    pub fn buffered() -> Self {
        Series {
            buffered: true,
            ..Series::default()
        }
    }

    /// Adds one sample, starting a new segment on a restart.
    pub fn push(&mut self, s: Sample) {
        self.push_from(s, None);
    }

    /// Adds one sample written by process `pid` (when the input says): a new pid is a new
    /// process.
    pub fn push_from(&mut self, s: Sample, pid: Option<u64>) {
        self.total_samples += 1;
        let proc = match pid {
            None => 0,
            Some(p) => match self.pids.iter().position(|q| *q == p) {
                Some(i) => i as u16 + 1,
                None if self.pids.len() < 1024 => {
                    self.pids.push(p);
                    self.pids.len() as u16
                }
                None => 0,
            },
        };
        let cap = if self.raw_cap == 0 {
            RAW_CAP
        } else {
            self.raw_cap
        };
        if self.buffered && self.step_gap.is_none() {
            if self.raw.len() < cap {
                self.raw.push(s);
                self.raw_pid.push(proc);
                if self.raw.len() >= cap {
                    self.flush();
                }
                return;
            }
            // The cap shrank below what is held (more series share the budget).
            self.flush();
        }
        if proc != 0 && self.last_pid != 0 && proc != self.last_pid && !self.segments.is_empty() {
            self.pending_break = true;
        }
        if proc != 0 {
            self.last_pid = proc;
        }
        self.stream(s);
    }

    /// Folds one sample in arrival order.
    fn stream(&mut self, s: Sample) {
        let boundary = match self.segments.last() {
            None => None,
            Some(_) if self.pending_break => Some(Boundary::Marked),
            Some(seg) => {
                // A file's rows may be a little out of order: a step back by a few sampling
                // intervals is not a restart.
                let tol = self.step_gap.map_or(0, |g| 3 * g);
                let back = matches!((seg.last_step, s.step), (Some(a), Some(b)) if b + tol < a);
                let floor = seg.windows.last().map_or(0.0, |w| w.min);
                let dip = seg.samples >= 16 && (s.used as f64) < 0.25 * floor && floor > 0.0;
                if back {
                    Some(Boundary::StepBack)
                } else if dip {
                    Some(Boundary::Dip)
                } else {
                    None
                }
            }
        };
        self.pending_break = false;
        if self.segments.is_empty() || boundary.is_some() {
            if boundary.is_some() {
                self.restarts += 1;
                self.last_boundary = boundary;
            }
            if self.segments.len() == 2 {
                self.segments.remove(0);
            }
            self.segments.push(Segment::new(&s));
        }
        if let Some(seg) = self.segments.last_mut() {
            if self.step_gap.is_some() {
                if let (Some(a), Some(b)) = (seg.last_step, s.step) {
                    if b < a {
                        // Out of order within the tolerance: folded where it falls.
                        self.reordered += 1;
                        let keep = seg.last_step;
                        seg.push(&s);
                        seg.last_step = keep;
                        return;
                    }
                }
            }
            seg.push(&s);
        }
    }

    /// Puts the held samples in order and folds them: rows are ordered by time when every
    /// row has one and they are scrambled in time, else kept as read; a restart is a step going back by more than a few
    /// sampling intervals for good (the next rows stay back) when memory falls to its base
    /// level too or the step falls back far (50 intervals), a pause in the times with memory
    /// back below its level, or a dip below a quarter of the floor. Within a process rows are
    /// ordered by step and exact duplicates merged. Rows scrambled beyond that (more than 5%
    /// of steps going back, no time) are ordered by step as one process.
    pub fn flush(&mut self) {
        if self.raw.is_empty() {
            return;
        }
        let v = std::mem::take(&mut self.raw);
        let procs = std::mem::take(&mut self.raw_pid);
        let n = v.len();
        let mut distinct: Vec<u16> = procs.iter().copied().filter(|p| *p != 0).collect();
        distinct.sort_unstable();
        distinct.dedup();
        let gap = if distinct.len() >= 2 {
            // Several processes wrote the samples: each is a process of its own (rows without a
            // pid go with the process of the row before), in the order they began.
            let mut groups: Vec<(u16, Vec<Sample>)> = Vec::new();
            let mut cur = procs.iter().copied().find(|p| *p != 0).unwrap_or(0);
            for (s, p) in v.into_iter().zip(procs) {
                if p != 0 {
                    cur = p;
                }
                match groups.iter_mut().find(|g| g.0 == cur) {
                    Some(g) => g.1.push(s),
                    None => groups.push((cur, vec![s])),
                }
            }
            if groups.iter().all(|g| g.1.iter().all(|s| s.ts.is_some())) {
                let t0 = |g: &(u16, Vec<Sample>)| {
                    g.1.iter()
                        .filter_map(|s| s.ts)
                        .fold(f64::INFINITY, f64::min)
                };
                groups.sort_by(|a, b| t0(a).total_cmp(&t0(b)));
            }
            self.last_pid = groups.last().map_or(0, |g| g.0);
            let mut gap = 1;
            for (i, (_, g)) in groups.into_iter().enumerate() {
                gap = self.flush_part(g, (i > 0).then_some(Boundary::NewProcess));
            }
            gap
        } else {
            if let Some(&p) = distinct.first() {
                if self.last_pid != 0 && p != self.last_pid && !self.segments.is_empty() {
                    self.pending_break = true;
                }
                self.last_pid = p;
            }
            self.flush_part(v, None)
        };
        let cap = if self.raw_cap == 0 {
            RAW_CAP
        } else {
            self.raw_cap
        };
        if n >= cap {
            self.step_gap = Some(gap);
        }
    }

    /// Orders and folds the samples of one process (or of processes told apart by evidence
    /// only); returns the median step between samples.
    fn flush_part(&mut self, mut v: Vec<Sample>, first: Option<Boundary>) -> u64 {
        let n = v.len();
        let all_ts = v.iter().all(|s| s.ts.is_some());
        let with_step = v.iter().filter(|s| s.step.is_some()).count() * 10 >= n * 9;
        let limit = v.iter().rev().find_map(|s| s.limit);
        // Rows scrambled in time (shuffled, reversed: more than 5% of times going back) are
        // ordered by time. Rows nearly in order are kept as read: a time that restarts with
        // the process (seconds since it began) must not interleave two processes, and the
        // few rows out of order are put back by step below.
        let mut by_time = false;
        if all_ts {
            let desc = v
                .windows(2)
                .filter(|w| w[1].ts.unwrap_or(0.0) < w[0].ts.unwrap_or(0.0))
                .count();
            if desc * 20 > n {
                by_time = true;
                self.reordered += desc as u64;
                v.sort_by(|a, b| a.ts.unwrap_or(0.0).total_cmp(&b.ts.unwrap_or(0.0)));
            }
        }
        let gaps: Vec<u64> = v
            .windows(2)
            .filter_map(|w| match (w[0].step, w[1].step) {
                (Some(a), Some(b)) if b > a => Some(b - a),
                _ => None,
            })
            .collect();
        let gap = median_u64(gaps).unwrap_or(1).max(1);
        let tgaps: Vec<f64> = v
            .windows(2)
            .filter_map(|w| match (w[0].ts, w[1].ts) {
                (Some(a), Some(b)) if b > a => Some(b - a),
                _ => None,
            })
            .collect();
        let tgap = median_f(&tgaps);
        let mut cuts: Vec<(usize, Boundary)> = Vec::new();
        let descents = v
            .windows(2)
            .filter(|w| matches!((w[0].step, w[1].step), (Some(a), Some(b)) if b < a))
            .count();
        let scrambled = with_step && !by_time && descents * 20 > n;
        if scrambled {
            self.reordered += descents as u64;
        } else {
            let mut max_step: Option<u64> = None;
            let mut start = 0usize;
            for i in 0..n {
                let s = v[i];
                let mut cut = None;
                if i > start {
                    if let (Some(m), Some(st)) = (max_step, s.step) {
                        let back = m.saturating_sub(st);
                        if back > 3 * gap {
                            let w = (back / gap).saturating_sub(1).min(8) as usize;
                            let stays = v[i + 1..(i + 1 + w).min(n)]
                                .iter()
                                .all(|x| x.step.is_none_or(|y| y < m));
                            if stays && (back >= 50 * gap || fell_to_base(&v, i, limit)) {
                                cut = Some(Boundary::StepBack);
                            }
                        }
                    }
                    if cut.is_none() {
                        if let (Some(a), Some(b)) = (v[i - 1].ts, s.ts) {
                            if tgap.is_finite()
                                && b - a > (20.0 * tgap).max(120.0)
                                && fell_to_base(&v, i, limit)
                            {
                                cut = Some(Boundary::TimeGap);
                            }
                        }
                    }
                    if cut.is_none() && i - start >= 16 {
                        let floor = v[i - 16..i].iter().map(|x| x.used).min().unwrap_or(0) as f64;
                        let next_low = v[i..(i + 3).min(n)]
                            .iter()
                            .all(|x| (x.used as f64) < 0.9 * floor);
                        if floor > 0.0 && (s.used as f64) < 0.25 * floor && next_low {
                            cut = Some(Boundary::Dip);
                        }
                    }
                }
                if let Some(b) = cut {
                    cuts.push((i, b));
                    start = i;
                    max_step = s.step;
                } else if let Some(st) = s.step {
                    max_step = Some(max_step.map_or(st, |m| m.max(st)));
                }
            }
        }
        let mut bounds: Vec<(usize, usize, Option<Boundary>)> = Vec::new();
        let mut a = 0;
        let mut why = first;
        for &(i, b) in &cuts {
            bounds.push((a, i, why));
            a = i;
            why = Some(b);
        }
        bounds.push((a, n, why));
        for (a, b, why) in bounds {
            let mut part = v[a..b].to_vec();
            if with_step {
                let before = part.clone();
                part.sort_by_key(|s| s.step.unwrap_or(0));
                if !scrambled && !by_time {
                    self.reordered +=
                        part.iter().zip(&before).filter(|(x, y)| x != y).count() as u64 / 2;
                }
                let len = part.len();
                part.dedup_by(|x, y| x.step == y.step && x.used == y.used);
                self.duplicates += (len - part.len()) as u64;
            }
            let Some(first) = part.first().copied() else {
                continue;
            };
            let new_segment = match why {
                Some(b) => {
                    self.restarts += 1;
                    self.last_boundary = Some(b);
                    true
                }
                None if self.pending_break && !self.segments.is_empty() => {
                    self.restarts += 1;
                    self.last_boundary = Some(Boundary::Marked);
                    true
                }
                None => self.segments.is_empty(),
            };
            self.pending_break = false;
            if new_segment {
                if self.segments.len() == 2 {
                    self.segments.remove(0);
                }
                self.segments.push(Segment::new(&first));
            }
            if let Some(seg) = self.segments.last_mut() {
                for s in &part {
                    seg.push(s);
                }
            }
        }
        gap
    }

    /// The series with every held sample folded (a copy when some are held).
    pub fn settled(&self) -> std::borrow::Cow<'_, Series> {
        if self.raw.is_empty() {
            std::borrow::Cow::Borrowed(self)
        } else {
            let mut s = self.clone();
            s.flush();
            std::borrow::Cow::Owned(s)
        }
    }

    /// The next sample starts a new process.
    pub fn mark_break(&mut self) {
        self.flush();
        if !self.segments.is_empty() {
            self.pending_break = true;
        }
    }

    /// The series ends in a dip too short to be a process of its own (fewer than
    /// [`TEARDOWN_SAMPLES`] readings after a process of 64 or more): the process letting its
    /// memory go as it died (an out-of-memory error's teardown), not a restart.
    pub fn ended_in_teardown(&self) -> bool {
        self.last_boundary == Some(Boundary::Dip)
            && self.segments.len() == 2
            && self.segments[1].samples < TEARDOWN_SAMPLES
            && self.segments[0].samples >= 64
    }

    /// Restarts, not counting a teardown at the end ([`Series::ended_in_teardown`]).
    pub fn real_restarts(&self) -> u32 {
        self.restarts - u32::from(self.ended_in_teardown())
    }

    /// The current process (of the folded samples: see [`Series::settled`]); the one before a
    /// teardown at the end ([`Series::ended_in_teardown`]).
    pub fn current(&self) -> Option<&Segment> {
        if self.ended_in_teardown() {
            return self.segments.first();
        }
        self.segments.last()
    }

    /// Retained elements (windows and held samples), for tests of bounded memory.
    pub fn retained_windows(&self) -> usize {
        self.segments
            .iter()
            .map(|s| s.windows.capacity())
            .sum::<usize>()
            + self.raw.capacity()
    }
}

/// Readings after a dip at the very end that still count as the dying process's teardown.
pub const TEARDOWN_SAMPLES: u64 = 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_restarts() {
        let mut s = Series::default();
        for i in 0..100_000u64 {
            s.push(Sample {
                step: Some(i),
                used: 1000 + i % 7,
                ..Sample::default()
            });
        }
        let seg = s.current().expect("segment");
        assert!(seg.windows.len() <= MAX_WINDOWS);
        assert_eq!(seg.samples, 100_000);
        assert_eq!(
            seg.windows.iter().map(|w| u64::from(w.n)).sum::<u64>(),
            100_000
        );
        s.push(Sample {
            step: Some(50),
            used: 1000,
            ..Sample::default()
        });
        assert_eq!(s.restarts, 1);
        assert_eq!(s.current().map(|c| c.samples), Some(1));
        assert_eq!(s.last_boundary, Some(Boundary::StepBack));
    }

    fn leak_rows(n: u64, every: u64) -> Vec<Sample> {
        (0..n)
            .map(|i| Sample {
                step: Some(i * every),
                ts: Some(1000.0 + i as f64 * every as f64),
                used: 8_000_000_000 + i * every * 100_000 + (i * 7919 % 13) * 1_000_000,
                limit: Some(16_000_000_000),
                peak: None,
            })
            .collect()
    }

    #[test]
    fn swapped_rows_are_put_back_not_restarts() {
        let mut rows = leak_rows(2000, 5);
        for i in (10..1990).step_by(97) {
            rows.swap(i, i + 1);
        }
        // A row written twice and one written 4 rows late.
        rows.insert(500, rows[499]);
        let late = rows.remove(700);
        rows.insert(704, late);
        let mut s = Series::buffered();
        for r in &rows {
            s.push(Sample { ts: None, ..*r });
        }
        let s = s.settled();
        assert_eq!(s.restarts, 0);
        assert_eq!(s.duplicates, 1);
        assert!(s.reordered >= 20, "{}", s.reordered);
        let seg = s.current().expect("segment");
        assert_eq!(seg.samples, 2000);
        assert!(seg.windows.windows(2).all(|w| w[0].x1 <= w[1].x0));
    }

    #[test]
    fn shuffled_and_reversed_rows_follow_time() {
        let rows = leak_rows(1500, 10);
        for reverse in [true, false] {
            let mut v = rows.clone();
            if reverse {
                v.reverse();
            } else {
                let mut z = 88172645463325252u64;
                for i in (1..v.len()).rev() {
                    z ^= z << 13;
                    z ^= z >> 7;
                    z ^= z << 17;
                    v.swap(i, (z % (i as u64 + 1)) as usize);
                }
            }
            let mut s = Series::buffered();
            for r in v {
                s.push(r);
            }
            let s = s.settled();
            assert_eq!(s.restarts, 0);
            assert_eq!(s.current().map(|c| c.samples), Some(1500));
        }
    }

    #[test]
    fn restart_with_a_step_reset_is_told_by_evidence() {
        // 3000 rows every 5 steps; the process dies at step 9000 and resumes from 8000 with
        // its memory back at its base level.
        let mut s = Series::buffered();
        for r in leak_rows(1800, 5) {
            s.push(Sample { ts: None, ..r });
        }
        for (i, r) in leak_rows(1200, 5).into_iter().enumerate() {
            s.push(Sample {
                step: Some(8000 + i as u64 * 5),
                ts: None,
                ..r
            });
        }
        let s = s.settled();
        assert_eq!(s.restarts, 1);
        assert_eq!(s.last_boundary, Some(Boundary::StepBack));
        assert_eq!(s.current().map(|c| c.samples), Some(1200));
    }

    #[test]
    fn a_time_that_restarts_with_the_process_does_not_interleave_processes() {
        // `time` is seconds since the process began: at the restart (back 1000 steps, memory
        // at its base) both step and time go back.
        let mut s = Series::buffered();
        for r in leak_rows(1800, 5) {
            s.push(r);
        }
        for (i, r) in leak_rows(1200, 5).into_iter().enumerate() {
            s.push(Sample {
                step: Some(8000 + i as u64 * 5),
                ..r
            });
        }
        let s = s.settled();
        assert_eq!(s.restarts, 1);
        let seg = s.current().expect("segment");
        assert_eq!(seg.samples, 1200);
        assert_eq!(seg.step_range(), (Some(8000), Some(8000 + 1199 * 5)));
    }

    #[test]
    fn beyond_the_held_samples_rows_stream_and_a_swap_is_no_restart() {
        let mut s = Series::buffered();
        s.raw_cap = MIN_RAW_CAP;
        let mut rows = leak_rows(3 * MIN_RAW_CAP as u64, 5);
        for i in (100..rows.len() - 1).step_by(333) {
            rows.swap(i, i + 1);
        }
        for r in rows {
            s.push(r);
        }
        let s = s.settled();
        assert_eq!(s.restarts, 0);
        assert_eq!(s.current().map(|c| c.samples), Some(3 * MIN_RAW_CAP as u64));
        assert!(s.raw.is_empty());
    }
}
