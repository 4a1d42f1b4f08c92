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
}

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
    pending_break: bool,
}

impl Series {
    /// Adds one sample, starting a new segment on a restart.
    pub fn push(&mut self, s: Sample) {
        self.total_samples += 1;
        let boundary = match self.segments.last() {
            None => None,
            Some(_) if self.pending_break => Some(Boundary::Marked),
            Some(seg) => {
                let back = matches!((seg.last_step, s.step), (Some(a), Some(b)) if b < a);
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
            seg.push(&s);
        }
    }

    /// The next sample starts a new process.
    pub fn mark_break(&mut self) {
        if !self.segments.is_empty() {
            self.pending_break = true;
        }
    }

    /// The current process.
    pub fn current(&self) -> Option<&Segment> {
        self.segments.last()
    }

    /// Bytes retained (windows), for tests of bounded memory.
    pub fn retained_windows(&self) -> usize {
        self.segments.iter().map(|s| s.windows.capacity()).sum()
    }
}

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
}
