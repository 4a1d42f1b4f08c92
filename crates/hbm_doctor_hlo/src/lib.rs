//! XLA's array shapes, layouts and TPU tile padding.
//!
//! This crate knows how XLA prints a shape (`bf16[8,128,1024]{2,1,0:T(8,128)(2,1)}`), how many bytes
//! that shape takes logically ([`Shape::unpadded_bytes`]) and physically on a tiled TPU layout
//! ([`Shape::padded_bytes`], XLA's `ShapeUtil::ArraySize`), and which nearby shape wastes nothing
//! ([`Shape::aligned_dims`]).
//!
//! It also parses the text artifacts of an XLA dump directory: HLO module text ([`hlo`]),
//! `*-buffer-assignment.txt` ([`buffer_assignment`]), live-range text ([`live_range`]) and
//! `*-memory-usage-report.txt` ([`usage_report`]). Every parser borrows from its input, skips what
//! it does not know with a [`Diagnostic`], and never fails wholesale.
//!
//! Architecture invariant: no I/O and no dependencies on terminal, HTTP or Python crates. Parsing
//! never panics; text it cannot read gives `None`.

pub mod buffer_assignment;
pub mod hash;
pub mod hlo;
pub mod live_range;
pub mod shape;
pub mod text;
pub mod usage_report;

pub use shape::{Layout, PrimitiveType, Shape, Tile};
pub use text::Diagnostic;
