//! Diagnosis: from out-of-memory events to a category, ranked causes and concrete actions.
//!
//! [`explain()`] turns the events that `hbm_doctor_log` found into an [`ExplainReport`], the one
//! model behind every output format of `hbm-doctor explain`. The rules follow XLA's TPU HBM OOM
//! debugging guide (TensorCore/SparseCore split, one abnormally large allocation, aggregate over
//! the limit, then padding, batch, donation, precision, sharding, offload, remat; compiler flags
//! last) and extend it to vmem, runtime, fragmentation, GPU and host failures.
//!
//! Architecture invariant: pure and deterministic. The same events give the same report, byte for
//! byte; no I/O, no clocks, no hash-map iteration order.

pub mod analyze;
pub mod causes;
/// The chip table: re-exported from its one home, `hbm_doctor_units::chips`, so that
/// `hbm_doctor_analysis::chips::*` keeps working.
pub use hbm_doctor_units::chips;
pub mod detect;
pub mod dump;
pub mod evidence;
pub mod explain;
pub mod join;
pub mod ledger;
pub mod model;
pub mod origin;
pub mod rank;
pub mod whatif;

pub use explain::{explain, explain_with_warnings};
pub use model::{
    Category, Cause, CauseKind, Diagnosis, ExplainReport, LedgerEntry, Snippet, WhatIf,
    SCHEMA_VERSION,
};
