//! `hbm-doctor pad SHAPE`: padded vs unpadded bytes on TPU tiles, and the aligned shape.

use crate::cli::{GlobalArgs, PadArgs};
use crate::exit;
use anyhow::{bail, Result};
use hbm_doctor_hlo::shape::format_dims;
use hbm_doctor_hlo::Shape;
use hbm_doctor_render::{render_pad, PadReport};
use std::io::Write;

/// Runs `pad`.
pub fn run(args: &PadArgs, global: &GlobalArgs) -> Result<u8> {
    let Some(shape) = Shape::parse(&args.shape) else {
        bail!("cannot read shape `{}`: write it as XLA prints it, e.g. f32[129,1024] or bf16[3,1000]{{1,0:T(8,128)(2,1)}}", args.shape);
    };
    // Sizes past what 64 bits can count are an error, not a wrapped figure.
    let bits = u64::from(shape.element_type.bits().max(1));
    let fits = shape
        .dims
        .iter()
        .try_fold(bits, |acc, &d| acc.checked_mul(d.max(1)))
        .and_then(|b| b.checked_mul(4)) // room for tile padding
        .is_some();
    if !fits {
        bail!(
            "shape `{}` is larger than 2^64 bytes: check its dimensions",
            args.shape
        );
    }
    let tiled = shape.has_tiles();
    let padded = if tiled {
        shape.padded_bytes()
    } else {
        shape.estimated_tpu_padded_bytes()
    };
    let unpadded = shape.unpadded_bytes();
    // The element type as the user wrote it (`u64` stays `u64`, `f16` stays `f16`).
    let ty = args
        .shape
        .trim()
        .split('[')
        .next()
        .filter(|t| !t.is_empty())
        .unwrap_or("f32")
        .to_string();
    let down = shape.aligned_dims(false);
    let up = shape.aligned_dims(true);
    let report = PadReport {
        aligned_down: format_dims(&ty, &down),
        aligned_up: format_dims(&ty, &up),
        expansion: if unpadded > 0 {
            padded as f64 / unpadded as f64
        } else {
            1.0
        },
        padded_bytes: padded,
        padding_bytes: padded - unpadded.min(padded),
        schema_version: 1,
        shape: args.shape.clone(),
        tiles_printed: tiled,
        unpadded_bytes: unpadded,
    };
    let text = render_pad(&report, args.format.render(), global.style(args.format));
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(exit::OK)
}
