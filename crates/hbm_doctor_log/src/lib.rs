//! Finds out-of-memory events in XLA, JAX, PyTorch/XLA and TensorFlow logs and reads their figures.
//!
//! The entry points are [`scan_all`] for text already in memory and [`Scanner`] for streams of any
//! size. Both return [`Event`]s: one per failure, with every figure the message states (used,
//! limit, exceeded, requested, free, TensorCore/SparseCore split, the TPU `Total hbm usage` and
//! `Program hbm requirement` breakdown, the `Largest program allocations` listing, GPU `Peak
//! buffers`, BFC `Stats:`), in bytes.
//!
//! Pipeline: [`scan`] finds anchor strings and cuts blocks; [`clean`] strips log prefixes, ANSI
//! codes and markdown damage; [`parse`] reads each message family; [`merge`] folds duplicate
//! prints of one failure into one event, and counts non-fatal warnings per kind
//! ([`WarningSummary`]) instead of keeping them one by one; `fast` reads the usual shapes of
//! those warnings without cutting a block around each.
//!
//! Architecture invariant: this crate does no I/O; it takes bytes. It never fails: text it does not
//! understand is not an event, and an OOM it cannot read is an [`Family::Unrecognized`] event.

pub mod clean;
pub mod event;
pub mod families;
mod fast;
pub mod merge;
pub mod parse;
pub mod scan;
/// Byte sizes: re-exported from their one home, `hbm_doctor_units::size`, so that
/// `hbm_doctor_log::size::*` and `hbm_doctor_log::{format_size, parse_size}` keep working.
pub use hbm_doctor_units::size;

pub use event::{
    Allocation, Backend, Event, Family, Framework, MemorySpace, Phase, Remat, Stage,
    WarningFigures, WarningKind, WarningSummary, WarningTally,
};
pub use merge::Merger;
pub use scan::{scan_all, scan_all_with_warnings, Hit, HitFinder, Scanner};
pub use size::{format_size, parse_size};
