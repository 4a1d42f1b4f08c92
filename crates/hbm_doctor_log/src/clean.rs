//! Line cleaning: what real logs and pasted issues wrap around an XLA message.
//!
//! Removes, in order: invalid UTF-8 (replaced), carriage returns, ANSI colour codes, markdown
//! damage (`> ` quotes, `**`, backticks), log prefixes (glog `E1121 23:09:56.211174 2507
//! file.cc:3781]`, XRT-era `2020-01-01 ...: E tensorflow/...cc:76]`, vLLM `ERROR 05-12 10:11:12
//! [engine.py:123]`, Ray `(RayWorker pid=12)`, torchrun `[rank0]:`, docker compose `trainer_1  |`,
//! srun -l `0: `, ISO timestamps), repeat markers (`[9x]`) and
//! TensorFlow's `{{function_node ...}}` wrappers. Literal `\n` in one-line messages becomes real
//! line breaks, and numbers hard-wrapped by a terminal are joined again.

use regex::Regex;
use std::sync::OnceLock;

/// A cleaned line and the 1-based line of the input it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// 1-based input line.
    pub number: u64,
    /// Cleaned text, trimmed.
    pub text: String,
    /// Length of the raw line, before cleaning (terminals wrap raw lines).
    pub raw_len: usize,
}

struct Patterns {
    ansi: Regex,
    bare_ansi: Regex,
    prefixes: Vec<Regex>,
    repeat: Regex,
    function_node: Regex,
}

fn patterns() -> &'static Patterns {
    static P: OnceLock<Patterns> = OnceLock::new();
    P.get_or_init(|| {
        let re = |s: &str| Regex::new(&crate::parse::ascii_classes(s)).expect("valid built-in regex");
        Patterns {
            ansi: re(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07"),
            // (`[m` alone only before a non-word byte: `[malloc_or_wait]`, `[model]` are text.)
            bare_ansi: re(r"\[(?:\d{1,3}(?:;\d{1,3})*m|m\b)"),
            prefixes: vec![
                // glog: E1121 23:09:56.211174 2507 file.cc:3781]
                re(r"^[IWEF]\d{4} [\d:.]+\s+\d+\s+[^\]]+?:\d+\]\s?"),
                // xla_dist: 2020-10-22 02:48:58 10.128.0.33 [3]
                re(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} \d+\.\d+\.\d+\.\d+ \[\d+\]\s*"),
                // XRT-era: 2020-01-01 12:00:00.000000: E 1234 tensorflow/...cc:76]
                re(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d+:\s+[IWEF]\s+(?:\d+\s+)?\S+:\d+\]\s?"),
                // multi-process launchers: `[1] `
                re(r"^\[\d{1,4}\]\s+"),
                // torchrun's rank (`[rank0]: `, `[default3]:` with --tee)
                re(r"^\[(?:rank|default)\d+\]:\s?"),
                // docker compose's service (`trainer_1  | `, `tabby-1  | `)
                re(r"^[A-Za-z][\w.\-]*[-_]\d+\s+\|\s?"),
                // srun -l's task number (`0: `, `12: `)
                re(r"^\d{1,4}: "),
                // Ray workers: (RayWorkerWrapper pid=1234, ip=10.0.0.1)
                re(r"^\((?:[\w.\-]+\s+)?pid=\d+(?:,\s*ip=[\d.]+)?\)\s?"),
                // anything ending in a source location: vLLM `ERROR 05-12 10:11:12 [engine.py:123]`
                re(r"^[^\]\n]{0,160}?[\w.\-/]+\.(?:cc|cpp|c|h|py|rs|go):\d+\]\s?"),
                // Hydra's logging: `[2024-05-01 12:00:00,123][train][ERROR] - `
                re(r"^\[\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\](?:\[[^\]\n]{1,60}\]){1,3}\s*(?:-\s*)?"),
                // Python logging's `%(asctime)s - %(name)s - %(levelname)s - `
                re(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)? - [\w.\-]+ - (?:CRITICAL|ERROR|WARNING|WARN|INFO|DEBUG) - "),
                // bracketed or bare timestamps, kubectl --timestamps, python logging; a container
                // runtime's log file adds the stream and a partial-line flag (`stderr F `)
                re(r"^\[?\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]?\s*(?:(?:stdout|stderr)\s+[FP]\s+)?(?:[-|:]\s*)?(?:(?:CRITICAL|ERROR|WARNING|WARN|INFO|DEBUG)\s*[-|:]?\s*)?"),
                // Python logging without a date: `ERROR:absl:` / `WARNING:root:`
                re(r"^(?:CRITICAL|ERROR|WARNING|INFO|DEBUG):[\w.]+:\s?"),
            ],
            repeat: re(r"\s*\[\d+x\]\s*"),
            function_node: re(r"\{\{function_node [^}]*\}\}\s*"),
        }
    })
}

/// Cleans one raw line (without its newline).
pub fn clean_line(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let p = patterns();
    let mut text: &str = text.trim_end_matches(['\r', '\n']);
    // A carriage return inside a line is a terminal's overwrite (tqdm's progress bar, then the
    // error printed over it): what the terminal shows is the text after the last one.
    if let Some(k) = text.rfind('\r') {
        if !text[k + 1..].trim().is_empty() {
            text = &text[k + 1..];
        }
    }
    let mut s: String = text.replace('\t', " ");
    if s.contains('\x1b') {
        s = p.ansi.replace_all(&s, "").into_owned();
    }
    if s.contains("m") && s.contains('[') {
        // Colour codes whose escape byte was lost on the way (`[31mRESOURCE_EXHAUSTED[0m`).
        s = p.bare_ansi.replace_all(&s, "").into_owned();
    }
    s.retain(|c| c != '`' && c != '\u{feff}' && (c >= ' ' || c == '\t'));
    if s.contains("**") {
        s = s.replace("**", "");
    }
    // HTML entities left by a scraper or an e-mail reply (`Total hbm usage &gt;= 10.2G`).
    if s.contains('&') && s.contains(';') {
        s = s
            .replace("&gt;", ">")
            .replace("&lt;", "<")
            .replace("&quot;", "\"")
            .replace("&#39;", "'")
            .replace("&#x27;", "'")
            .replace("&nbsp;", " ")
            .replace("&amp;", "&");
    }
    let mut t = s.trim_start();
    // Markdown quotes: `> `, `>> `.
    while let Some(rest) = t.strip_prefix('>') {
        t = rest.trim_start();
    }
    let mut t = t.to_string();
    for _ in 0..4 {
        let before = t.len();
        for prefix in &p.prefixes {
            if let Some(m) = prefix.find(&t) {
                if m.start() == 0 && m.end() > 0 {
                    t = t[m.end()..].to_string();
                }
            }
        }
        // A quote inside a launcher's prefix (`[rank0]: > ...`).
        if t.len() != before && t.trim_start().starts_with('>') {
            t = t.trim_start().trim_start_matches(['>', ' ']).to_string();
        }
        if t.len() == before {
            break;
        }
    }
    if t.contains("x]") {
        t = p.repeat.replace_all(&t, " ").into_owned();
    }
    if t.contains("{{function_node") {
        t = p.function_node.replace_all(&t, "").into_owned();
    }
    t.trim().to_string()
}

/// Splits `raw` on real newlines and on literal `\n` escapes (a one-line message from a Python
/// repr or JSON), cleans each piece, and joins numbers that a terminal hard-wrapped.
pub fn clean_block(raw: &[u8], first_line: u64) -> Vec<Line> {
    let mut out: Vec<Line> = Vec::new();
    for (number, raw_line) in (first_line..).zip(raw.split(|&b| b == b'\n')) {
        if let Some(text) = json_log_message(raw_line) {
            for piece in text.split('\n') {
                push_line(&mut out, number, clean_line(piece.as_bytes()), piece.len());
            }
            continue;
        }
        let literal_breaks = memchr::memmem::find_iter(raw_line, b"\\n").count();
        if literal_breaks >= 2 {
            let text = String::from_utf8_lossy(raw_line)
                .replace("\\t", " ")
                .replace("\\\"", "\"");
            for piece in text.split("\\n") {
                push_line(&mut out, number, clean_line(piece.as_bytes()), piece.len());
            }
        } else {
            push_line(&mut out, number, clean_line(raw_line), raw_line.len());
        }
    }
    out
}

/// The message of a structured log line: a JSON object with a `message`, `msg`, `log`,
/// `textPayload` or `jsonPayload.message` string (Cloud Logging, Docker's json-file driver,
/// structlog, a Kubernetes log shipper), with its escapes decoded.
fn json_log_message(raw: &[u8]) -> Option<String> {
    let t = raw.trim_ascii();
    if t.len() < 8 || t[0] != b'{' || t[t.len() - 1] != b'}' {
        return None;
    }
    const KEYS: [&str; 4] = ["message", "msg", "log", "textPayload"];
    const QUOTED: [&[u8]; 4] = [b"\"message\"", b"\"msg\"", b"\"log\"", b"\"textPayload\""];
    if !QUOTED.iter().any(|k| memchr::memmem::find(t, k).is_some()) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(t).ok()?;
    let field = |o: &serde_json::Value| {
        KEYS.iter()
            .find_map(|k| o.get(*k).and_then(|m| m.as_str()).map(str::to_string))
    };
    field(&v).or_else(|| v.get("jsonPayload").and_then(field))
}

/// A text a terminal hard-wrapped, joined again: the text and, for each of its lines, the
/// 1-based line of the input it starts on. `None` when the text was not hard-wrapped.
pub fn unwrap_terminal(raw: &[u8]) -> Option<(Vec<u8>, Vec<u64>)> {
    let width = wrap_width(raw)?;
    let mut text = Vec::with_capacity(raw.len());
    let mut numbers = Vec::new();
    let mut lines = (1u64..).zip(raw.split(|&b| b == b'\n')).peekable();
    while let Some((number, line)) = lines.next() {
        numbers.push(number);
        text.extend_from_slice(strip_cr(line));
        let mut last = line;
        while columns(last) == width && lines.peek().is_some_and(|(_, n)| continues_wrap(last, n)) {
            let Some((_, next)) = lines.next() else {
                break;
            };
            text.extend_from_slice(strip_cr(next));
            last = next;
        }
        text.push(b'\n');
    }
    Some((text, numbers))
}

/// Terminal widths a hard-wrapped paste comes in.
const WRAP_WIDTHS: [usize; 9] = [80, 100, 120, 132, 140, 150, 160, 200, 240];

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// A line's width in columns (characters; a terminal wraps by columns, not bytes).
fn columns(line: &[u8]) -> usize {
    let line = strip_cr(line);
    if line.is_ascii() {
        line.len()
    } else {
        String::from_utf8_lossy(line).chars().count()
    }
}

/// The width a terminal hard-wrapped this text at: a common terminal width that no line exceeds,
/// filled exactly by at least a quarter of the long lines (a wrapped line is cut at the width,
/// its last piece shorter), by two different lines or by one whose cut splits a word or a
/// number. `None` for text that was not wrapped.
fn wrap_width(raw: &[u8]) -> Option<usize> {
    let lines: Vec<&[u8]> = raw.split(|&b| b == b'\n').map(strip_cr).collect();
    let widths: Vec<usize> = lines.iter().map(|l| columns(l)).collect();
    let max = widths.iter().copied().max()?;
    if !WRAP_WIDTHS.contains(&max) {
        return None;
    }
    let at: Vec<usize> = (0..lines.len())
        .filter(|&i| widths[i] == max && !lines[i].ends_with(b"  "))
        .collect();
    if at.is_empty() {
        return None;
    }
    // Cut lines fill the width; unwrapped text has few lines exactly as long as its longest
    // (at least a quarter of the long lines are at the width).
    let long = widths.iter().filter(|&&c| c > max / 2).count();
    if at.len() * 4 < long {
        return None;
    }
    // Two different lines at the width (one repeated message is not a wrap), or one whose cut
    // splits a word or a number (`...allocate 20.0` / `0 MiB`).
    let mut distinct: Vec<&[u8]> = at.iter().map(|&i| lines[i]).collect();
    distinct.sort_unstable();
    distinct.dedup();
    // (The two sides of the cut alike: `memo`/`ry`, `CUDA_E`/`RROR`, `20.0`/`0 MiB`.)
    let splits_a_token = at.iter().any(|&i| {
        let (Some(&a), Some(&b)) = (lines[i].last(), lines.get(i + 1).and_then(|n| n.first()))
        else {
            return false;
        };
        let number = |c: u8| c.is_ascii_digit() || c == b'.';
        let upper = |c: u8| c.is_ascii_uppercase() || c == b'_';
        (a.is_ascii_lowercase() && b.is_ascii_lowercase())
            || (upper(a) && upper(b))
            || (number(a) && (number(b) || matches!(b, b'K' | b'M' | b'G' | b'T' | b'B')))
    });
    (distinct.len() >= 2 || splits_a_token).then_some(max)
}

/// Does `next` continue the line a terminal cut at its width? Not after a table's border
/// (nvidia-smi's rows fill the width too) or padding, nor before an empty line or a new table
/// row.
fn continues_wrap(line: &[u8], next: &[u8]) -> bool {
    let line = strip_cr(line);
    let next = strip_cr(next);
    // A line padded to the width with spaces is a layout (Rich's log columns), not a cut.
    !next.is_empty()
        && !line.ends_with(b"  ")
        && !line.ends_with(b"|")
        && !line.ends_with(b"+")
        && !next.starts_with(b"|")
        && !next.starts_with(b"+")
}

fn push_line(out: &mut Vec<Line>, number: u64, text: String, raw_len: usize) {
    if let Some(prev) = out.last_mut() {
        if is_hard_wrap(&prev.text, prev.raw_len, &text) {
            prev.text.push_str(&text);
            prev.raw_len = raw_len;
            return;
        }
    }
    out.push(Line {
        number,
        text,
        raw_len,
    });
}

/// A terminal wrapped a long line in the middle of a number: `... Used 49.3` / `4G of 32.00G`.
fn is_hard_wrap(prev: &str, prev_raw_len: usize, next: &str) -> bool {
    if prev_raw_len < 60 {
        return false;
    }
    let Some(last) = prev.chars().last() else {
        return false;
    };
    if !(last.is_ascii_digit() || last == '.') {
        return false;
    }
    let mut chars = next.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    if first.is_ascii_digit() || first == '.' {
        // `Limit:  1600` / `0000` is a wrap; a new field (`2. Size:`) is not.
        return !next.contains(". Size:") && !next.contains(':');
    }
    if matches!(first, 'K' | 'M' | 'G' | 'T' | 'P' | 'E' | 'B') {
        let rest: String = chars.take(3).collect();
        let unit_end = rest.trim_start_matches("iB").trim_start_matches('B');
        return unit_end
            .chars()
            .next()
            .is_none_or(|c| !c.is_ascii_alphabetic());
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hard_wrapped_paste_is_joined_and_a_table_is_not() {
        let msg = "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.93 GiB total capacity; 11.07 GiB already allocated; 19.75 MiB free; 11.36 GiB reserved in total by PyTorch)";
        let mut wrapped = String::from("Traceback (most recent call last):\n");
        for piece in msg.as_bytes().chunks(80) {
            wrapped.push_str(std::str::from_utf8(piece).unwrap_or_default());
            wrapped.push('\n');
        }
        let (text, numbers) = unwrap_terminal(wrapped.as_bytes()).expect("wrapped at 80");
        let text = String::from_utf8_lossy(&text);
        assert!(text.lines().any(|l| l == msg), "{text}");
        assert_eq!(numbers, vec![1, 2, 5]);
        // nvidia-smi's rows fill the width too; a padded log layout is not a cut; nor is an
        // unwrapped text whose longest line happens to be 80 columns.
        let table = "+-----------------------------------------------------------------------------+\n| NVIDIA-SMI 470.57.02    Driver Version: 470.57.02    CUDA Version: 11.4     |\n|-------------------------------+----------------------+----------------------+\n";
        assert!(unwrap_terminal(table.as_bytes()).is_none());
        let padded = "ERROR    2024-11-28 infinity_emb ERROR: CUDA              batch_handler.py:574\n         out of memory. Tried to allocate 3.88 GiB. GPU 0                       \n";
        assert!(unwrap_terminal(padded.as_bytes()).is_none());
        let plain =
            "x".repeat(80) + "\nTraceback (most recent call last):\n" + &"y".repeat(60) + "\n";
        assert!(unwrap_terminal(plain.as_bytes()).is_none());
    }

    #[test]
    fn strips_prefixes_and_noise() {
        let cases = [
            ("E1121 23:09:56.211174    2507 tpu_compiler.cc:3781] RESOURCE_EXHAUSTED: x", "RESOURCE_EXHAUSTED: x"),
            ("2020-01-20 12:04:12.343431: E    3960 tensorflow/compiler/xla/xla_client/xla_util.cc:76] Largest", "Largest"),
            ("> **RESOURCE_EXHAUSTED**: `Out of memory`", "RESOURCE_EXHAUSTED: Out of memory"),
            ("\x1b[31mRESOURCE_EXHAUSTED\x1b[0m: a\r", "RESOURCE_EXHAUSTED: a"),
            ("ERROR 05-12 10:11:12 [engine.py:123] RuntimeError: x", "RuntimeError: x"),
            ("(RayWorkerWrapper pid=1234, ip=10.0.0.1) E1121 23:09:56.211174 2507 a.cc:1] y", "y"),
            ("2024-05-01T10:00:00.123Z ERROR x", "x"),
            ("[9x] RESOURCE_EXHAUSTED: y", "RESOURCE_EXHAUSTED: y"),
            (" 45%|####5     | 450/1000 [00:12<00:15, 36.1it/s]\rRuntimeError: x\r", "RuntimeError: x"),
            ("2024-05-01T12:00:00.123456789Z stderr F RuntimeError: x", "RuntimeError: x"),
            ("[2024-05-01 12:00:00,123][__main__][ERROR] - RuntimeError: x", "RuntimeError: x"),
            ("2024-05-01 12:00:00,123 - trainer - ERROR - RuntimeError: x", "RuntimeError: x"),
            ("{{function_node __wrapped__Foo}} OOM when", "OOM when"),
        ];
        for (raw, want) in cases {
            assert_eq!(clean_line(raw.as_bytes()), want, "{raw:?}");
        }
    }

    #[test]
    fn reads_the_message_of_structured_log_lines() {
        let raw = br#"{"severity":"ERROR","message":"RuntimeError: CUDA out of memory.\nTried to allocate 2.00 GiB"}
{"jsonPayload":{"message":"Total hbm usage >= 1G"},"severity":"ERROR"}
{"not":"a log"}"#;
        let lines = clean_block(raw, 1);
        let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "RuntimeError: CUDA out of memory.",
                "Tried to allocate 2.00 GiB",
                "Total hbm usage >= 1G",
                "{\"not\":\"a log\"}"
            ]
        );
        assert_eq!(lines[1].number, 1);
        assert_eq!(lines[2].number, 2);
    }

    #[test]
    fn splits_literal_newlines_and_joins_wraps() {
        let raw =
            b"XlaRuntimeError('RESOURCE_EXHAUSTED: a\\nTotal hbm usage >= 1G:\\n    reserved 1M')";
        let lines = clean_block(raw, 7);
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|l| l.number == 7));
        let raw = b"RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 49.3\n4G of 32.00G hbm.";
        let lines = clean_block(raw, 1);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].text.contains("Used 49.34G of 32.00G"));
    }
}
