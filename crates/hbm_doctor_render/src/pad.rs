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

#[cfg(test)]
mod tests {
    use super::*;
    use hbm_doctor_hlo::shape::format_dims;
    use hbm_doctor_hlo::Shape;

    /// The report `hbm-doctor pad` builds for a shape written as XLA prints it.
    fn report(text: &str) -> PadReport {
        let shape = Shape::parse(text).expect("shape");
        let tiled = shape.has_tiles();
        let padded = if tiled {
            shape.padded_bytes()
        } else {
            shape.estimated_tpu_padded_bytes()
        };
        let unpadded = shape.unpadded_bytes();
        let ty = text.split('[').next().unwrap_or("f32");
        PadReport {
            aligned_down: format_dims(ty, &shape.aligned_dims(false)),
            aligned_up: format_dims(ty, &shape.aligned_dims(true)),
            expansion: padded as f64 / unpadded.max(1) as f64,
            padded_bytes: padded,
            padding_bytes: padded - unpadded.min(padded),
            schema_version: 1,
            shape: text.to_string(),
            tiles_printed: tiled,
            unpadded_bytes: unpadded,
        }
    }

    fn all_formats(text: &str) -> String {
        let r = report(text);
        let human = render_pad(&r, Format::Human, Style::new(false));
        assert_eq!(render_pad(&r, Format::Markdown, Style::new(true)), human);
        format!("{human}{}", render_pad(&r, Format::Json, Style::new(false)))
    }

    #[test]
    fn untiled_shape_estimated_with_8_by_128() {
        insta::assert_snapshot!(all_formats("f32[129,1024]"));
    }

    #[test]
    fn tiled_bf16_shape() {
        insta::assert_snapshot!(all_formats("bf16[3,1000]{1,0:T(8,128)(2,1)}"));
    }

    #[test]
    fn aligned_shape_wastes_nothing() {
        insta::assert_snapshot!(all_formats("f32[128,128]"));
    }

    #[test]
    fn colour_marks_the_waste() {
        let r = report("f32[129,1024]");
        let coloured = render_pad(&r, Format::Human, Style::new(true));
        assert!(coloured.contains("\x1b[33m28.0K\x1b[0m"), "{coloured}");
    }
}
