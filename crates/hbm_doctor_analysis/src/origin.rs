//! Where an HLO value comes from and how it is named: the user's source line and op_name of an
//! instruction, op_name paths, shapes without layout. Shared by `analyze` and the detectors.

use hbm_doctor_hlo::hlo::{tuple_elements, HloModule, Instruction};
use hbm_doctor_hlo::text::unescape;

/// A shape as printed without its layout (`f32[8,128]{1,0}` -> `f32[8,128]`), tuples element by
/// element.
pub(crate) fn shape_without_layout(shape: &str) -> String {
    if tuple_elements(shape).is_some() {
        let parts: Vec<String> = tuple_elements(shape)
            .unwrap_or_default()
            .iter()
            .map(|p| shape_without_layout(p))
            .collect();
        return format!("({})", parts.join(", "));
    }
    match shape.find(']') {
        Some(k) => shape[..=k].to_string(),
        None => shape.to_string(),
    }
}

/// Where an instruction comes from.
#[derive(Debug, Clone, Default)]
pub(crate) struct Origin {
    pub op_name: Option<String>,
    pub source: Option<String>,
    pub source_path: Option<String>,
    pub function: Option<String>,
    pub opcode: Option<String>,
}

pub(crate) fn origin(hlo: Option<&HloModule<'_>>, inst: Option<&Instruction<'_>>) -> Origin {
    let (Some(m), Some(i)) = (hlo, inst) else {
        return Origin::default();
    };
    let op_name =
        (!i.metadata.op_name.is_empty()).then(|| unescape(i.metadata.op_name).into_owned());
    let src = m.user_source(&i.metadata);
    let (source, source_path, function) = match src {
        Some(s) if !s.file.is_empty() => {
            let file = unescape(s.file).into_owned();
            let base = file.rsplit('/').next().unwrap_or(&file).to_string();
            (
                Some(format!("{base}:{}", s.line)),
                Some(file),
                (!s.function.is_empty()).then(|| unescape(s.function).into_owned()),
            )
        }
        _ => (None, None, None),
    };
    Origin {
        op_name,
        source,
        source_path,
        function,
        opcode: Some(i.opcode.to_string()),
    }
}

/// Splits an op_name at `/` outside parentheses and brackets.
pub fn op_name_parts(op: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (k, c) in op.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            '/' if depth <= 0 => {
                out.push(&op[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    out.push(&op[start..]);
    out
}
