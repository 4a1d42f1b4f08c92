//! A bounded time window of one device's used bytes: the sparkline, the max seen, and the
//! floor/ceiling (min/max over the last window) the exporter publishes.

use std::collections::VecDeque;

/// Recent samples of one device.
#[derive(Debug, Clone)]
pub struct History {
    points: VecDeque<(f64, u64)>,
    span_seconds: f64,
    max_points: usize,
    /// The largest value seen since the monitor started.
    pub max_seen: u64,
}

impl History {
    /// Keeps `span_seconds` of samples, at most `max_points`.
    pub fn new(span_seconds: f64, max_points: usize) -> Self {
        History {
            points: VecDeque::new(),
            span_seconds,
            max_points: max_points.max(2),
            max_seen: 0,
        }
    }

    /// Adds a sample (out-of-order samples are placed at the end all the same).
    pub fn push(&mut self, ts: f64, used: u64) {
        self.max_seen = self.max_seen.max(used);
        self.points.push_back((ts, used));
        while self.points.len() > self.max_points {
            self.points.pop_front();
        }
        while self
            .points
            .front()
            .is_some_and(|&(t, _)| t < ts - self.span_seconds)
        {
            self.points.pop_front();
        }
    }

    /// The samples kept, oldest first.
    pub fn points(&self) -> impl Iterator<Item = &(f64, u64)> {
        self.points.iter()
    }

    /// Min and max over the last `window` seconds before `now`.
    pub fn floor_ceiling(&self, now: f64, window: f64) -> Option<(u64, u64)> {
        let mut it = self
            .points
            .iter()
            .rev()
            .take_while(|(t, _)| *t >= now - window)
            .map(|&(_, v)| v);
        let first = it.next()?;
        Some(it.fold((first, first), |(lo, hi), v| (lo.min(v), hi.max(v))))
    }

    /// `width` values for a sparkline: the max of each of `width` equal time buckets over the
    /// last `span` seconds (empty buckets repeat the previous value).
    pub fn buckets(&self, now: f64, span: f64, width: usize) -> Vec<u64> {
        let mut out = vec![None; width];
        if width == 0 {
            return Vec::new();
        }
        let start = now - span;
        for &(t, v) in self.points.iter().filter(|(t, _)| *t >= start) {
            let i = (((t - start) / span) * width as f64) as usize;
            let i = i.min(width - 1);
            out[i] = Some(out[i].map_or(v, |o: u64| o.max(v)));
        }
        let mut last = 0;
        out.into_iter()
            .map(|v| {
                if let Some(v) = v {
                    last = v;
                }
                last
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_window_and_extremes() {
        let mut h = History::new(10.0, 100);
        for i in 0..30 {
            h.push(f64::from(i), (i % 7) as u64);
        }
        assert_eq!(h.points().count(), 11);
        assert_eq!(h.max_seen, 6);
        assert_eq!(h.floor_ceiling(29.0, 3.0), Some((0, 6)));
        assert_eq!(h.buckets(29.0, 10.0, 5).len(), 5);
    }
}
