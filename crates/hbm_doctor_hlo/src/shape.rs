//! Shapes as XLA prints them, their logical size, and their padded size on TPU tiles.
//!
//! The padded size follows XLA's `ShapeUtil::ArraySize`: only the first tile of a layout pads, each
//! tiled physical dimension is rounded up to the tile, and later tiles such as `(2,1)` are assumed
//! to add nothing. This reproduces the byte counts printed in real TPU OOM reports (for instance
//! `s32[8388608,8,4]{2,1,0:T(8,128)}` is 32.00G padded for 1.00G of data).

use std::fmt;

/// An XLA primitive element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrimitiveType {
    /// `pred`, stored as one byte.
    Pred,
    /// Signed or unsigned integers and floats of the given width in bits.
    Int(u32),
    /// Floating point of the given width in bits (f8 variants, f16, bf16, f32, f64, f4).
    Float(u32),
    /// Complex numbers, width in bits of the whole element (64 or 128).
    Complex(u32),
    /// `token`: no storage.
    Token,
    /// An opaque handle (`opaque`), one pointer.
    Opaque,
}

impl PrimitiveType {
    /// Parses an XLA element type name (`f32`, `bf16`, `s4`, `f8e4m3fn`, `pred`, ...).
    pub fn parse(name: &str) -> Option<PrimitiveType> {
        let name = name.trim().to_ascii_lowercase();
        let bits = |s: &str| s.parse::<u32>().ok();
        match name.as_str() {
            "pred" | "bool" => return Some(PrimitiveType::Pred),
            "token" => return Some(PrimitiveType::Token),
            "opaque" => return Some(PrimitiveType::Opaque),
            "bf16" | "bfloat16" => return Some(PrimitiveType::Float(16)),
            "half" => return Some(PrimitiveType::Float(16)),
            "float" => return Some(PrimitiveType::Float(32)),
            "double" => return Some(PrimitiveType::Float(64)),
            "int8" | "qint8" | "uint8" | "quint8" => return Some(PrimitiveType::Int(8)),
            "int16" | "uint16" => return Some(PrimitiveType::Int(16)),
            "int32" | "uint32" | "qint32" => return Some(PrimitiveType::Int(32)),
            "int64" | "uint64" => return Some(PrimitiveType::Int(64)),
            "float16" => return Some(PrimitiveType::Float(16)),
            "float32" => return Some(PrimitiveType::Float(32)),
            "float64" => return Some(PrimitiveType::Float(64)),
            "complex64" => return Some(PrimitiveType::Complex(64)),
            "complex128" => return Some(PrimitiveType::Complex(128)),
            _ => {}
        }
        if name.starts_with("f8") {
            return Some(PrimitiveType::Float(8));
        }
        if name.starts_with("f4") {
            return Some(PrimitiveType::Float(4));
        }
        if name.starts_with("f6") {
            return Some(PrimitiveType::Float(6));
        }
        if let Some(rest) = name.strip_prefix('s').or_else(|| name.strip_prefix('u')) {
            return bits(rest)
                .filter(|b| [1, 2, 4, 8, 16, 32, 64].contains(b))
                .map(PrimitiveType::Int);
        }
        if let Some(rest) = name.strip_prefix('f') {
            return bits(rest)
                .filter(|b| [16, 32, 64].contains(b))
                .map(PrimitiveType::Float);
        }
        if let Some(rest) = name.strip_prefix('c') {
            return bits(rest)
                .filter(|b| [64, 128].contains(b))
                .map(PrimitiveType::Complex);
        }
        None
    }

    /// Width of one element in bits (pred is 8: XLA stores it in a byte).
    pub fn bits(self) -> u32 {
        match self {
            PrimitiveType::Pred => 8,
            PrimitiveType::Int(b) | PrimitiveType::Float(b) | PrimitiveType::Complex(b) => b,
            PrimitiveType::Token => 0,
            PrimitiveType::Opaque => 64,
        }
    }
}

/// One tile of a tiled layout, most-major dimension first as printed (`T(8,128)` is `[8, 128]`).
/// `None` stands for `*` (combine with the next more minor dimension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tile(pub Vec<Option<u64>>);

/// A layout: `{minor_to_major:T(..)(..)E(n)L(n)S(n)}`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Layout {
    /// Dimension numbers from most minor to most major.
    pub minor_to_major: Vec<usize>,
    /// Tiles in the order printed; only the first one pads.
    pub tiles: Vec<Tile>,
    /// `E(n)`: element size in bits when it differs from the type's width.
    pub element_size_bits: Option<u32>,
    /// `L(n)`: tail padding alignment in elements.
    pub tail_padding_alignment: Option<u64>,
    /// `S(n)`: memory space (0 = device memory, 1 = vmem on TPU, 5 = host in newer XLA).
    pub memory_space: Option<u32>,
}

/// An array shape such as `f32[129,1024]{1,0:T(8,128)}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// Element type.
    pub element_type: PrimitiveType,
    /// The element type as XLA spells it (`u8`, `f16`, `f8e4m3fn`; TensorFlow's `float`, `half`,
    /// `uint8` in XLA's spelling): `element_type` keeps only the kind and width.
    pub type_name: &'static str,
    /// Dimension sizes, dynamic dimensions at their upper bound.
    pub dims: Vec<u64>,
    /// The printed layout, when there was one.
    pub layout: Option<Layout>,
}

impl Shape {
    /// Parses one array shape as XLA prints it. Accepts a missing layout, dynamic dims (`<=128`,
    /// `?`), spaces after commas, and TensorFlow-style `[32,128] float` is not accepted here.
    ///
    /// Returns `None` for tuples and text that is not a shape.
    pub fn parse(text: &str) -> Option<Shape> {
        let text = text.trim();
        let open = text.find('[')?;
        let element_type = PrimitiveType::parse(&text[..open])?;
        let type_name = xla_type_name(&text[..open]).unwrap_or_else(|| element_type.name());
        let close = open + text[open..].find(']')?;
        let mut dims = Vec::new();
        let inner = text[open + 1..close].trim();
        if !inner.is_empty() {
            for dim in inner.split(',') {
                let dim = dim.trim().trim_start_matches("<=").trim();
                if dim == "?" {
                    dims.push(1);
                    continue;
                }
                dims.push(dim.parse::<u64>().ok()?);
            }
        }
        let rest = text[close + 1..].trim_start();
        let layout = match rest.strip_prefix('{') {
            Some(body) => {
                let end = matching_brace(body)?;
                Some(Layout::parse(&body[..end], dims.len())?)
            }
            None => None,
        };
        Some(Shape {
            element_type,
            type_name,
            dims,
            layout,
        })
    }

    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    fn element_bits(&self) -> u64 {
        let from_layout = self.layout.as_ref().and_then(|l| l.element_size_bits);
        u64::from(from_layout.unwrap_or_else(|| self.element_type.bits()))
    }

    /// Logical size in bytes (`ByteSizeOf` with the default layout).
    pub fn unpadded_bytes(&self) -> u64 {
        let bits = u64::from(self.element_type.bits());
        self.elements().saturating_mul(bits).div_ceil(8)
    }

    /// Physical size on the printed layout: XLA's `ShapeUtil::ArraySize`. Without tiles this is the
    /// unpadded size.
    pub fn padded_bytes(&self) -> u64 {
        match &self.layout {
            Some(layout) if !layout.tiles.is_empty() => self.tiled_bytes(layout, &layout.tiles[0]),
            _ => self.unpadded_bytes(),
        }
    }

    /// Whether the padded size comes from a printed tile (`false`: no tile was printed).
    pub fn has_tiles(&self) -> bool {
        self.layout.as_ref().is_some_and(|l| !l.tiles.is_empty())
    }

    /// The padded size XLA's TPU compiler would most likely give this shape when no tile was printed:
    /// `T(8,128)` on the row-major (or printed) order for rank >= 2, 128 elements for rank 1. This is
    /// an estimate (formats.md §2.3); a printed tile always wins.
    pub fn estimated_tpu_padded_bytes(&self) -> u64 {
        if self.has_tiles() {
            return self.padded_bytes();
        }
        let layout = self.layout_or_default();
        let tile = match self.dims.len() {
            0 => return self.unpadded_bytes(),
            1 => Tile(vec![Some(128)]),
            _ => Tile(vec![Some(8), Some(128)]),
        };
        self.tiled_bytes(&layout, &tile)
    }

    fn layout_or_default(&self) -> Layout {
        match &self.layout {
            Some(l) if l.minor_to_major.len() == self.dims.len() => l.clone(),
            _ => Layout {
                minor_to_major: (0..self.dims.len()).rev().collect(),
                ..Layout::default()
            },
        }
    }

    fn tiled_bytes(&self, layout: &Layout, tile: &Tile) -> u64 {
        let m2m = if layout.minor_to_major.len() == self.dims.len() {
            layout.minor_to_major.clone()
        } else {
            (0..self.dims.len()).rev().collect()
        };
        let t = &tile.0;
        let mut n: u64 = 1;
        for d in 0..t.len() {
            let size = if d < m2m.len() { self.dims[m2m[d]] } else { 1 };
            let tile_dim = t[t.len() - 1 - d].unwrap_or(1).max(1);
            n = n.saturating_mul(size.div_ceil(tile_dim).saturating_mul(tile_dim));
        }
        for &dim in m2m.iter().skip(t.len()) {
            n = n.saturating_mul(self.dims[dim]);
        }
        if let Some(l) = layout.tail_padding_alignment.filter(|&l| l > 1) {
            n = n.div_ceil(l).saturating_mul(l);
        }
        n.saturating_mul(self.element_bits()).div_ceil(8)
    }

    /// The tiled dimensions (logical dimension number, tile size) of the first tile, most minor
    /// first. Empty without tiles.
    pub fn tiled_dims(&self) -> Vec<(usize, u64)> {
        let Some(layout) = &self.layout else {
            return Vec::new();
        };
        let Some(tile) = layout.tiles.first() else {
            return Vec::new();
        };
        let m2m = &layout.minor_to_major;
        let t = &tile.0;
        (0..t.len().min(m2m.len()))
            .filter_map(|d| {
                t[t.len() - 1 - d]
                    .filter(|&s| s > 0)
                    .map(|size| (m2m[d], size))
            })
            .collect()
    }

    /// Dimensions rounded so that no tile pads: each tiled dimension goes down (`round_up =
    /// false`; never below one tile) or up to a multiple of its tile. Uses the printed tile, or the
    /// `T(8,128)` estimate when none was printed.
    pub fn aligned_dims(&self, round_up: bool) -> Vec<u64> {
        let mut dims = self.dims.clone();
        let tiled = if self.has_tiles() {
            self.tiled_dims()
        } else {
            let m2m = self.layout_or_default().minor_to_major;
            let sizes = [128u64, 8];
            m2m.iter()
                .take(2)
                .zip(sizes)
                .map(|(&d, s)| (d, s))
                .collect()
        };
        for (dim, tile) in tiled {
            let Some(&d) = dims.get(dim) else { continue };
            if d % tile == 0 {
                continue;
            }
            dims[dim] = if round_up || d < tile {
                d.div_ceil(tile) * tile
            } else {
                d / tile * tile
            };
        }
        dims
    }

    /// The shape without its layout, e.g. `f32[129,1024]`.
    pub fn without_layout(&self) -> String {
        format_dims(self.type_name, &self.dims)
    }
}

/// XLA's spelling of an element type name (TensorFlow's names mapped to it), when it is one.
fn xla_type_name(name: &str) -> Option<&'static str> {
    const XLA: &[&str] = &[
        "pred",
        "s1",
        "s2",
        "s4",
        "s8",
        "s16",
        "s32",
        "s64",
        "u1",
        "u2",
        "u4",
        "u8",
        "u16",
        "u32",
        "u64",
        "f16",
        "bf16",
        "f32",
        "f64",
        "c64",
        "c128",
        "f8e5m2",
        "f8e4m3fn",
        "f8e4m3b11fnuz",
        "f8e5m2fnuz",
        "f8e4m3fnuz",
        "f8e4m3",
        "f8e3m4",
        "f8e8m0fnu",
        "f4e2m1fn",
        "f6e2m3fn",
        "f6e3m2fn",
        "token",
        "opaque",
    ];
    let lower = name.trim().to_ascii_lowercase();
    if let Some(n) = XLA.iter().find(|n| **n == lower) {
        return Some(n);
    }
    Some(match lower.as_str() {
        "bool" => "pred",
        "bfloat16" => "bf16",
        "half" | "float16" => "f16",
        "float" | "float32" => "f32",
        "double" | "float64" => "f64",
        "int8" | "qint8" => "s8",
        "uint8" | "quint8" => "u8",
        "int16" => "s16",
        "uint16" => "u16",
        "int32" | "qint32" => "s32",
        "uint32" => "u32",
        "int64" => "s64",
        "uint64" => "u64",
        "complex64" => "c64",
        "complex128" => "c128",
        _ => return None,
    })
}

impl PrimitiveType {
    /// A name for the kind and width alone (signedness and float format are not kept).
    pub fn name(&self) -> &'static str {
        match self {
            PrimitiveType::Pred => "pred",
            PrimitiveType::Int(8) => "s8",
            PrimitiveType::Int(16) => "s16",
            PrimitiveType::Int(32) => "s32",
            PrimitiveType::Int(64) => "s64",
            PrimitiveType::Int(4) => "s4",
            PrimitiveType::Int(2) => "s2",
            PrimitiveType::Int(_) => "s1",
            PrimitiveType::Float(16) => "bf16",
            PrimitiveType::Float(32) => "f32",
            PrimitiveType::Float(64) => "f64",
            PrimitiveType::Float(8) => "f8",
            PrimitiveType::Float(_) => "f4",
            PrimitiveType::Complex(64) => "c64",
            PrimitiveType::Complex(_) => "c128",
            PrimitiveType::Token => "token",
            PrimitiveType::Opaque => "opaque",
        }
    }
}

/// Formats `type[d0,d1,...]`.
pub fn format_dims(element_type: &str, dims: &[u64]) -> String {
    let inner: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("{element_type}[{}]", inner.join(","))
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.without_layout())
    }
}

fn matching_brace(body: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return Some(i),
            '}' => depth -= 1,
            _ => {}
        }
    }
    None
}

impl Layout {
    /// Parses the inside of a layout's braces, e.g. `1,0:T(8,128)(2,1)S(1)`.
    pub fn parse(body: &str, rank: usize) -> Option<Layout> {
        let (order, attrs) = match body.find(':') {
            Some(i) => (&body[..i], &body[i + 1..]),
            None => (body, ""),
        };
        let mut layout = Layout::default();
        for part in order.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let dim = part.parse::<usize>().ok()?;
            if dim >= rank.max(1) && rank > 0 {
                return None;
            }
            layout.minor_to_major.push(dim);
        }
        let bytes = attrs.as_bytes();
        let mut i = 0;
        let mut in_tiles = false;
        while i < bytes.len() {
            let c = bytes[i];
            let group_end = |start: usize| attrs[start..].find(')').map(|e| start + e);
            if c == b'T' || (c == b'(' && in_tiles) {
                let open = if c == b'T' { i + 1 } else { i };
                if bytes.get(open) != Some(&b'(') {
                    i += 1;
                    continue;
                }
                let end = group_end(open)?;
                let mut tile = Vec::new();
                for part in attrs[open + 1..end].split(',').map(str::trim) {
                    tile.push(if part == "*" {
                        None
                    } else {
                        Some(part.parse::<u64>().ok()?)
                    });
                }
                layout.tiles.push(Tile(tile));
                in_tiles = true;
                i = end + 1;
                continue;
            }
            in_tiles = false;
            if matches!(c, b'E' | b'L' | b'S' | b'M') && bytes.get(i + 1) == Some(&b'(') {
                let end = group_end(i + 1)?;
                let value = attrs[i + 2..end].trim().parse::<u64>().ok();
                match c {
                    b'E' => layout.element_size_bits = value.and_then(|v| u32::try_from(v).ok()),
                    b'L' => layout.tail_padding_alignment = value,
                    b'S' => layout.memory_space = value.and_then(|v| u32::try_from(v).ok()),
                    _ => {}
                }
                i = end + 1;
                continue;
            }
            i += 1;
        }
        Some(layout)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn element_types_keep_their_spelling() {
        for (text, printed) in [
            ("u8[4,8]{1,0}", "u8[4,8]"),
            ("f16[8,128]", "f16[8,128]"),
            ("bf16[8,128]", "bf16[8,128]"),
            ("f8e4m3fn[16]", "f8e4m3fn[16]"),
            ("u32[]", "u32[]"),
            ("float[32,23997509]", "f32[32,23997509]"),
            ("half[2]", "f16[2]"),
            ("uint8[3]", "u8[3]"),
        ] {
            assert_eq!(Shape::parse(text).expect(text).without_layout(), printed);
        }
    }

    use super::*;

    fn check(text: &str, padded: u64, unpadded: u64) {
        let shape = Shape::parse(text).unwrap_or_else(|| panic!("cannot parse {text}"));
        assert_eq!(shape.padded_bytes(), padded, "padded {text}");
        assert_eq!(shape.unpadded_bytes(), unpadded, "unpadded {text}");
    }

    #[test]
    fn worked_examples_from_formats_md() {
        check("f32[129,1024]{1,0:T(8,128)}", 557_056, 528_384);
        check("bf16[3,1000]{1,0:T(8,128)(2,1)}", 16_384, 6_000);
        check("f32[7]{0:T(128)}", 512, 28);
        check("f32[7]{0:T(1024)}", 4_096, 28);
        check("f32[7]{0:T(1,128)}", 512, 28);
        check("f32[7]{0:T(8,128)}", 4_096, 28);
        check("s8[3,1000]{1,0:T(32,128)(4,1)}", 32_768, 3_000);
        check("s8[3,1000]{1,0:T(8,128)(4,1)}", 8_192, 3_000);
        check("f32[]{:T(256)}", 1_024, 4);
        check("bf16[128]{0:T(256)(128)(2,1)}", 512, 256);
    }

    #[test]
    fn real_compiler_messages() {
        check(
            "s32[8388608,8,4]{2,1,0:T(8,128)}",
            34_359_738_368,
            1_073_741_824,
        );
        check(
            "bf16[2048,1,2048,128]{0,1,3,2:T(4,128)(2,1)}",
            4_294_967_296,
            1_073_741_824,
        );
        check("f32[1024,245,64]{1,2,0:T(8,128)}", 67_108_864, 64_225_280);
        check(
            "u8[327680,327680]{1,0:T(8,128)(4,1)}",
            107_374_182_400,
            107_374_182_400,
        );
        check(
            "bf16[16,1280,40]{2,1,0:T(8,128)(2,1)}",
            5_242_880,
            1_638_400,
        );
        check(
            "bf16[16,1280,40]{1,2,0:T(8,128)(2,1)}",
            1_638_400,
            1_638_400,
        );
    }

    #[test]
    fn untiled_and_estimates() {
        let s = Shape::parse("f32[256,512,128,2]{3,2,1,0}").expect("shape");
        assert_eq!(s.padded_bytes(), 128 * 1024 * 1024);
        assert_eq!(s.estimated_tpu_padded_bytes(), 8 * 1024 * 1024 * 1024);
        let s = Shape::parse("f32[128,3]").expect("shape");
        assert_eq!(s.estimated_tpu_padded_bytes(), 65_536);
    }

    #[test]
    fn aligned_shapes() {
        let s = Shape::parse("f32[129,1024]{1,0:T(8,128)}").expect("shape");
        assert_eq!(s.aligned_dims(false), vec![128, 1024]);
        assert_eq!(s.aligned_dims(true), vec![136, 1024]);
        let s = Shape::parse("s32[8388608,8,4]{2,1,0:T(8,128)}").expect("shape");
        assert_eq!(s.aligned_dims(false), vec![8388608, 8, 128]);
    }

    #[test]
    fn odd_inputs_do_not_panic() {
        for text in [
            "",
            "[",
            "f32[",
            "f32[a]",
            "(f32[1], s32[2])",
            "f32[1]{9,9:T(",
            "f32[3]{0:T(0)}",
        ] {
            let _ = Shape::parse(text).map(|s| (s.padded_bytes(), s.aligned_dims(true)));
        }
        assert!(Shape::parse("f32[<=128,?]").is_some());
        assert_eq!(
            PrimitiveType::parse("f8e4m3fn"),
            Some(PrimitiveType::Float(8))
        );
        assert_eq!(PrimitiveType::parse("s4"), Some(PrimitiveType::Int(4)));
    }
}
