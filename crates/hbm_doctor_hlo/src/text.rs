//! Small lexical helpers shared by the dump parsers: balanced-bracket scanning that respects
//! strings and `/* */` comments, C-unescaping, human byte sizes, and parse diagnostics.

use std::borrow::Cow;

/// Something a parser skipped or could not read. Parsers never fail wholesale: they return what
/// they understood plus these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// 1-based line of the input where the problem starts (0 when unknown).
    pub line: usize,
    /// What was skipped and why.
    pub message: String,
}

impl Diagnostic {
    /// A diagnostic at byte `offset` of `text`.
    pub fn at(text: &str, offset: usize, message: impl Into<String>) -> Diagnostic {
        let offset = offset.min(text.len());
        let line = memchr::memchr_iter(b'\n', &text.as_bytes()[..offset]).count() + 1;
        Diagnostic {
            line,
            message: message.into(),
        }
    }
}

/// Given `b[i]` is `(`, `{`, `[` or `"`, returns the index just after its matching closer (or the
/// end of input when unbalanced). Strings and `/* */` comments inside are skipped.
pub fn skip_balanced(b: &[u8], i: usize) -> usize {
    if i >= b.len() {
        return b.len();
    }
    if b[i] == b'"' {
        return skip_string(b, i);
    }
    let mut depth = 0usize;
    let mut j = i;
    while j < b.len() {
        match b[j] {
            b'(' | b'{' | b'[' => depth += 1,
            b')' | b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return j + 1;
                }
            }
            b'"' => {
                j = skip_string(b, j);
                continue;
            }
            b'/' if b.get(j + 1) == Some(&b'*') => {
                j = match memchr::memmem::find(&b[j + 2..], b"*/") {
                    Some(k) => j + 2 + k + 2,
                    None => b.len(),
                };
                continue;
            }
            _ => {}
        }
        j += 1;
    }
    b.len()
}

/// Given `b[i] == b'"'`, returns the index after the closing quote (escapes honoured).
pub fn skip_string(b: &[u8], i: usize) -> usize {
    let mut j = i + 1;
    while j < b.len() {
        match memchr::memchr2(b'"', b'\\', &b[j..]) {
            Some(k) => {
                let at = j + k;
                if b[at] == b'\\' {
                    j = at + 2;
                } else {
                    return at + 1;
                }
            }
            None => return b.len(),
        }
    }
    b.len()
}

/// Splits `s` at commas that are not nested in brackets, strings or comments.
pub fn split_top_level(s: &str) -> Vec<&str> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'(' | b'{' | b'[' | b'"' => {
                i = skip_balanced(b, i);
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = memchr::memmem::find(&b[i + 2..], b"*/").map_or(b.len(), |k| i + 2 + k + 2);
                continue;
            }
            b',' => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    if start < s.len() || !out.is_empty() {
        out.push(&s[start..]);
    }
    out
}

/// Removes `/* ... */` comments (e.g. `/*index=5*/`), borrowing when there are none.
pub fn strip_comments(s: &str) -> Cow<'_, str> {
    if !s.contains("/*") {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(k) = rest.find("/*") {
        out.push_str(&rest[..k]);
        rest = match rest[k..].find("*/") {
            Some(e) => &rest[k + e + 2..],
            None => "",
        };
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Undoes `absl::CEscape` (`\"`, `\\`, `\n`, `\t`, octal and hex escapes); borrows when there is
/// nothing to undo.
pub fn unescape(s: &str) -> Cow<'_, str> {
    if !s.contains('\\') {
        return Cow::Borrowed(s);
    }
    let b = s.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 >= b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'x' => {
                let mut v = 0u32;
                let mut n = 0;
                while n < 2 && i < b.len() && b[i].is_ascii_hexdigit() {
                    v = v * 16 + (b[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                let mut n = 1;
                while n < 3 && i < b.len() && (b'0'..=b'7').contains(&b[i]) {
                    v = v * 8 + u32::from(b[i] - b'0');
                    i += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// Parses a byte count as XLA and TSL print it: `512B`, `9.00GiB`, `128.0KiB`, `18.38G`,
/// `1 234 567 bytes`, `19730009600`. Thin wrapper over `hbm_doctor_units::parse_size`, the one
/// size parser, over the text with its spaces removed (dumps group digits: `1 250 bytes`).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    hbm_doctor_units::parse_size(&compact)
}

/// Index of the first byte that cannot continue an identifier (`[a-zA-Z0-9_.-]`), from `i`.
pub fn ident_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'_' | b'.' | b'-' | b'$'))
    {
        i += 1;
    }
    i
}

/// Parses a ShapeIndex as printed (`{}`, `{1}`, `{1,2}`).
pub fn parse_shape_index(s: &str) -> Option<Vec<u64>> {
    let inner = s.trim().strip_prefix('{')?.strip_suffix('}')?.trim();
    if inner.is_empty() {
        return Some(Vec::new());
    }
    inner.split(',').map(|p| p.trim().parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_and_split() {
        let s = r#"a, {b, "c,}"}, (d, e) /*index=5*/, f"#;
        let parts: Vec<&str> = split_top_level(s).into_iter().map(str::trim).collect();
        assert_eq!(parts, vec!["a", r#"{b, "c,}"}"#, "(d, e) /*index=5*/", "f"]);
        assert_eq!(strip_comments("x /*index=5*/y"), "x y");
    }

    #[test]
    fn sizes_and_escapes() {
        assert_eq!(parse_bytes("9.00GiB"), Some(9 << 30));
        assert_eq!(parse_bytes("512B"), Some(512));
        assert_eq!(parse_bytes("1 234 567 bytes"), Some(1_234_567));
        assert_eq!(parse_bytes("128.0KiB"), Some(131_072));
        assert_eq!(parse_bytes("junk"), None);
        assert_eq!(unescape(r#"a\"b\n\101"#), "a\"b\nA");
        assert_eq!(parse_shape_index("{1,2}"), Some(vec![1, 2]));
    }
}
