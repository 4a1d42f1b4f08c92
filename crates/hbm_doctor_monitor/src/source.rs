//! The [`Source`] trait every backend implements, and its error.

use crate::sample::Reading;

/// A place device memory figures come from: libtpu's gRPC service, NVML, a file the in-process
/// hook appends to, PyTorch/XLA's metrics file.
///
/// `poll` is called once per sampling round from one thread and must return within about a
/// second: every network call inside is time-boxed. A source that is not there right now (the
/// trainer has not started, or died and will be restarted) returns [`SourceError`] and is polled
/// again next round; that is how reconnection works.
pub trait Source: Send {
    /// A short name for messages and events (`libtpu 127.0.0.1:8431`).
    fn name(&self) -> String;
    /// Adds what the source has now to `out`.
    fn poll(&mut self, out: &mut Reading) -> Result<(), SourceError>;
    /// A restarted recorder resumes: samples of a device at or before `last[device id]` (Unix
    /// time) were recorded already. Sources that replay history (a followed file) skip them.
    fn resume_after(&mut self, last: &std::collections::HashMap<String, f64>) {
        let _ = last;
    }
}

/// Why a source gave nothing this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceError {
    /// One line saying what is wrong and, where useful, what to do.
    pub message: String,
    /// True when the source is simply not there yet (nothing listening, no file yet): expected,
    /// not counted as an error.
    pub absent: bool,
}

impl SourceError {
    /// The source is not there (yet).
    pub fn absent(message: impl Into<String>) -> Self {
        SourceError {
            message: message.into(),
            absent: true,
        }
    }
    /// The source is there but failed.
    pub fn failed(message: impl Into<String>) -> Self {
        SourceError {
            message: message.into(),
            absent: false,
        }
    }
}

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SourceError {}
