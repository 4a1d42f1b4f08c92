//! PyTorch/XLA's `XLA_METRICS_FILE`: the full metrics report appended at every `mark_step`,
//! followed as it grows (monitoring.md §4.2, §4.3).
//!
//! The reports carry no byte figures, but their counters are leak signals of their own:
//! `CreateDataHandles - DestroyDataHandles` rising means device buffers accumulate,
//! `UncachedCompile` rising after warm-up means recompilation.

use crate::sample::{Reading, XlaCounters};
use crate::source::{Source, SourceError};
use crate::tail::Tail;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Parses the report lines incrementally; values are cumulative, so a block read in two parts
/// is fine.
#[derive(Debug, Default, Clone)]
pub struct MetricsParser {
    step: Option<u64>,
    counter: Option<String>,
    counters: HashMap<String, i64>,
}

impl MetricsParser {
    /// Feeds one line.
    pub fn line(&mut self, line: &str) {
        if let Some(rest) = line.strip_prefix("[MetricsData; step=") {
            self.step = rest.trim_end_matches(']').trim().parse().ok();
            self.counter = None;
        } else if let Some(name) = line.strip_prefix("Counter: ") {
            self.counter = Some(name.trim().to_string());
        } else if line.starts_with("Metric: ") {
            self.counter = None;
        } else if let (Some(name), Some(v)) = (
            self.counter.as_ref(),
            line.trim_start().strip_prefix("Value: "),
        ) {
            if let Ok(v) = v.trim().parse::<i64>() {
                self.counters.insert(name.clone(), v);
            }
        }
    }

    /// The counters as of the lines fed so far.
    pub fn counters(&self, path: &str) -> XlaCounters {
        let get = |k: &str| self.counters.get(k).copied();
        let diff = |a: &str, b: &str| Some(get(a)? - get(b).unwrap_or(0));
        XlaCounters {
            step: self.step,
            uncached_compiles: get("UncachedCompile").map(|v| v.max(0) as u64),
            cached_compiles: get("CachedCompile").map(|v| v.max(0) as u64),
            live_data_handles: diff("CreateDataHandles", "DestroyDataHandles"),
            live_xla_tensors: diff("CreateXlaTensor", "DestroyXlaTensor"),
            path: path.to_string(),
        }
    }
}

/// Follows an `XLA_METRICS_FILE` (or its `.0` when the world size is above one).
pub struct MetricsFileSource {
    path: PathBuf,
    tail: Option<Tail>,
    parser: MetricsParser,
}

impl MetricsFileSource {
    /// Follows `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        MetricsFileSource {
            path: path.into(),
            tail: None,
            parser: MetricsParser::default(),
        }
    }

    fn resolve(path: &Path) -> Option<PathBuf> {
        if path.exists() {
            return Some(path.to_path_buf());
        }
        let ordinal0 = PathBuf::from(format!("{}.0", path.display()));
        ordinal0.exists().then_some(ordinal0)
    }
}

impl Source for MetricsFileSource {
    fn name(&self) -> String {
        format!("metrics_file {}", self.path.display())
    }

    fn poll(&mut self, out: &mut Reading) -> Result<(), SourceError> {
        if self.tail.is_none() {
            let Some(p) = Self::resolve(&self.path) else {
                return Err(SourceError::absent(format!(
                    "metrics_file: {} does not exist yet",
                    self.path.display()
                )));
            };
            self.tail = Some(Tail::new(p));
        }
        let Some(tail) = self.tail.as_mut() else {
            return Ok(());
        };
        let path = tail.path().display().to_string();
        match tail.poll() {
            Ok(Some(lines)) => {
                for l in &lines {
                    self.parser.line(l);
                }
                if !lines.is_empty()
                    && (self.parser.step.is_some() || !self.parser.counters.is_empty())
                {
                    out.counters.push(self.parser.counters(&path));
                }
                Ok(())
            }
            Ok(None) => {
                self.tail = None;
                Err(SourceError::absent(format!(
                    "metrics_file: {path} disappeared"
                )))
            }
            Err(e) => Err(SourceError::failed(format!(
                "metrics_file: cannot read {path}: {e}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_report_blocks() {
        let text = "[MetricsData; step=7]\nMetric: CompileTime\n  TotalSamples: 3\n  Accumulator: 01m12s004ms551.902us\nCounter: CachedCompile\n  Value: 1197\nCounter: UncachedCompile\n  Value: 3\nCounter: CreateDataHandles\n  Value: 52811\nCounter: DestroyDataHandles\n  Value: 52211\n";
        let mut p = MetricsParser::default();
        text.lines().for_each(|l| p.line(l));
        let c = p.counters("f");
        assert_eq!(c.step, Some(7));
        assert_eq!(c.uncached_compiles, Some(3));
        assert_eq!(c.cached_compiles, Some(1197));
        assert_eq!(c.live_data_handles, Some(600));
        assert_eq!(c.live_xla_tensors, None);
    }
}
