//! The in-process source: JSON lines appended by the Python hook (`hbm_doctor.sampler`), which
//! samples `jax.Device.memory_stats()` or `torch_xla` `xm.get_memory_info()` inside the trainer.
//!
//! These are the only truthful figures when a framework preallocates (JAX on GPU) or caches
//! (PyTorch), and the only ones at all where libtpu serves no metrics (Kaggle, Colab). The lines
//! are `sample` lines of the recording format (docs/recording.md), so a hook file is itself a
//! recording.

use crate::recording::Record;
use crate::sample::Reading;
use crate::source::{Source, SourceError};
use crate::tail::Tail;
use std::path::PathBuf;

/// The environment variable the hook reads for its output file (and `--pid` looks for).
pub const SAMPLES_ENV: &str = "HBM_DOCTOR_SAMPLES";

/// Follows a hook file.
pub struct InProcessSource {
    tail: Tail,
    seen_any: bool,
    /// Per device id, the last sample time already recorded (a restarted recorder).
    resume: std::collections::HashMap<String, f64>,
}

impl InProcessSource {
    /// Follows `path` (it may not exist yet).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        InProcessSource {
            tail: Tail::new(path),
            seen_any: false,
            resume: Default::default(),
        }
    }
}

impl Source for InProcessSource {
    fn name(&self) -> String {
        format!("hook {}", self.tail.path().display())
    }

    fn resume_after(&mut self, last: &std::collections::HashMap<String, f64>) {
        self.resume = last.clone();
    }

    fn poll(&mut self, out: &mut Reading) -> Result<(), SourceError> {
        let path = self.tail.path().display().to_string();
        let lines = match self.tail.poll() {
            Ok(Some(lines)) => lines,
            Ok(None) => {
                return Err(SourceError::absent(format!(
                "hook: {path} does not exist yet (call hbm_doctor.sampler.start() in the trainer)"
            )))
            }
            Err(e) => {
                return Err(SourceError::failed(format!(
                    "hook: cannot read {path}: {e}"
                )))
            }
        };
        for line in lines {
            match serde_json::from_str::<Record>(&line) {
                Ok(Record::Sample { mut device, .. }) => {
                    self.seen_any = true;
                    let recorded = device
                        .ts
                        .zip(self.resume.get(&device.id))
                        .is_some_and(|(t, last)| t <= *last);
                    if recorded {
                        continue;
                    }
                    device.endpoint = None;
                    if device.chip_type.is_none() {
                        device.chip_type = device
                            .kind
                            .as_deref()
                            .and_then(crate::host::chip_type_of_kind)
                            .map(str::to_string);
                    }
                    out.devices.push(device);
                    self.seen_any = true;
                }
                Ok(Record::Process { process, .. }) => {
                    let _ = process; // The host probe measures RSS itself.
                }
                Ok(_) | Err(_) => {} // Headers, events, and foreign lines are not figures.
            }
        }
        if !self.seen_any {
            return Err(SourceError::absent(format!(
                "hook: no samples in {path} yet"
            )));
        }
        Ok(())
    }
}
