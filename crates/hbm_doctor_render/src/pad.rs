//! Views of `pad SHAPE`: padded vs unpadded bytes of a shape on TPU tiles, and the aligned shapes
//! that waste nothing. The figures come from `hbm_doctor_hlo::Shape`; this module formats them.

use crate::{json, Format, Style};
use hbm_doctor_log::format_size;
use serde::Serialize;
use std::fmt::Write as _;

/// What `pad` found for one shape (the JSON of `pad --format json`; fields in the order the
/// contract prints them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PadReport {
    /// The shape rounded down to whole tiles.
    pub aligned_down: String,
    /// The shape rounded up to whole tiles (same memory, nothing wasted).
    pub aligned_up: String,
    /// `padded_bytes / unpadded_bytes` (1 when the shape holds nothing).
    pub expansion: f64,
    /// Bytes on the device, tiles padded.
    pub padded_bytes: u64,
    /// `padded_bytes - unpadded_bytes`.
    pub padding_bytes: u64,
    /// Always 1.
    pub schema_version: u32,
    /// The shape as the user wrote it.
    pub shape: String,
    /// Whether the shape printed its tiles (else `T(8,128)` is assumed).
    pub tiles_printed: bool,
    /// Bytes of the elements alone.
    pub unpadded_bytes: u64,
}

/// Renders what `pad` found; markdown is the terminal text.
pub fn render_pad(report: &PadReport, format: Format, style: Style) -> String {
    if format == Format::Json {
        return json(report);
    }
    let st = if format == Format::Human {
        style
    } else {
        Style::new(false)
    };
    let r = report;
    let mut out = String::new();
    let waste = r.padded_bytes.saturating_sub(r.unpadded_bytes);
    let _ = writeln!(
        out,
        "{}: {} padded, {} unpadded ({:.2}x, {} wasted){}",
        st.bold(&r.shape),
        format_size(r.padded_bytes),
        format_size(r.unpadded_bytes),
        r.padded_bytes as f64 / r.unpadded_bytes.max(1) as f64,
        if waste > 0 {
            st.yellow(&format_size(waste))
        } else {
            format_size(waste)
        },
        if r.tiles_printed {
            String::new()
        } else {
            st.dim(" - estimated with T(8,128): no tile printed")
        }
    );
    if waste > 0 {
        let _ = writeln!(
            out,
            "aligned: {} (rounded down) or {} (rounded up, same memory, nothing wasted)",
            st.cyan(&r.aligned_down),
            st.cyan(&r.aligned_up)
        );
    } else {
        let _ = writeln!(
            out,
            "{}",
            st.green("no padding: the tiled dimensions are already multiples of the tile")
        );
    }
    out
}
