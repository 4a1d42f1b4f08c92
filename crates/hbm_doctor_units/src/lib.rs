//! The one home of hbm-doctor's units: byte sizes ([`size`]: the parser and the human
//! formatter), times ([`time`]: RFC 3339 through the `time` crate) and the TPU chip table
//! ([`chips`]: every name a generation goes by, physical and usable HBM per device).
//!
//! Every other crate and the Python package (through `hbm-doctor chips --format json` and
//! `tests/vectors.json`) read these; none keeps its own copy (ARCHITECTURE.md, "Units").
//!
//! Architecture invariant: no I/O, no dependency on another crate of the workspace.

pub mod chips;
pub mod size;
pub mod time;

pub use size::{format_signed, format_size, parse_size};
