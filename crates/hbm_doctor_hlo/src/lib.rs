//! XLA's array shapes, layouts and TPU tile padding.
//!
//! This crate knows how XLA prints a shape (`bf16[8,128,1024]{2,1,0:T(8,128)(2,1)}`), how many bytes
//! that shape takes logically ([`Shape::unpadded_bytes`]) and physically on a tiled TPU layout
//! ([`Shape::padded_bytes`], XLA's `ShapeUtil::ArraySize`), and which nearby shape wastes nothing
//! ([`Shape::aligned_dims`]).
//!
//! Architecture invariant: no I/O and no dependencies on terminal, HTTP or Python crates. Parsing
//! never panics; text it cannot read gives `None`.

pub mod shape;

pub use shape::{Layout, PrimitiveType, Shape, Tile};
