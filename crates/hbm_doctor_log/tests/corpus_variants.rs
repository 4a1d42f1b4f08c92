//! Every real message of `tests/corpus/issues` read the same way when pasted the other ways users
//! paste it: CRLF line endings, quoted in a Markdown reply (`> `), indented as a code block, HTML
//! entities left by a scraper or an e-mail reply. The figures and the family of the main event
//! must not change (a metamorphic test: the untransformed read is checked against the manifest by
//! `corpus_issues`). A failure only told in the user's words is not a printed message: quoted,
//! indented or behind a launcher's prefix, those words are someone else's, code or a program's
//! output, and are not read as a report (docs/explain.md).

use hbm_doctor_log::{scan_all, Event};
use std::path::PathBuf;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/issues")
}

fn main_event(events: &[Event]) -> Option<&Event> {
    events.iter().rev().find(|e| e.fatal)
}

fn key(events: &[Event]) -> Option<String> {
    let e = main_event(events)?;
    Some(format!(
        "{:?} used={:?} limit={:?} req={:?} free={:?} exc={:?} allocs={}",
        e.family,
        e.used_bytes,
        e.limit_bytes,
        e.requested_bytes,
        e.free_bytes,
        e.exceeded_bytes,
        e.allocations.len()
    ))
}

/// `text` as a terminal `width` columns wide prints it: every longer line cut into pieces.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let chars: Vec<char> = line.chars().collect();
        if chars.is_empty() {
            out.push('\n');
        }
        for piece in chars.chunks(width) {
            out.extend(piece);
            out.push('\n');
        }
    }
    out
}

/// A way of pasting: its name, whether a failure told in words survives it, the rewrite.
type Transform = (&'static str, bool, fn(&str) -> String);

/// Each way of pasting.
fn transforms() -> Vec<Transform> {
    vec![
        ("crlf", true, |t| t.replace('\n', "\r\n")),
        ("quoted", false, |t| {
            t.lines().map(|l| format!("> {l}\n")).collect::<String>()
        }),
        ("indented", false, |t| {
            t.lines().map(|l| format!("    {l}\n")).collect::<String>()
        }),
        // Launchers and log collectors that prefix every line: torchrun's rank, Ray's worker,
        // docker compose's service, srun -l's task number.
        ("rank", false, |t| {
            t.lines()
                .map(|l| format!("[rank0]: {l}\n"))
                .collect::<String>()
        }),
        ("ray", true, |t| {
            t.lines()
                .map(|l| format!("(RayTrainWorker pid=4242, ip=10.0.0.7) {l}\n"))
                .collect::<String>()
        }),
        ("compose", false, |t| {
            t.lines()
                .map(|l| format!("trainer_1  | {l}\n"))
                .collect::<String>()
        }),
        ("srun", true, |t| {
            t.lines().map(|l| format!("0: {l}\n")).collect::<String>()
        }),
        // A terminal's hard wrap (Windows' console, an e-mail): every line cut at the width.
        ("wrap80", true, |t| wrap(t, 80)),
        ("wrap120", true, |t| wrap(t, 120)),
        ("html", true, |t| {
            t.replace('&', "&amp;")
                .replace('"', "&quot;")
                .replace('\'', "&#39;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
        }),
    ]
}

fn texts() -> &'static [(String, String)] {
    static TEXTS: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    TEXTS.get_or_init(|| {
        let mut files: Vec<PathBuf> = std::fs::read_dir(corpus())
            .expect("corpus")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "txt"))
            .collect();
        files.sort();
        files
            .iter()
            .map(|p| {
                let name = p
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                let text =
                    String::from_utf8_lossy(&std::fs::read(p).expect("fixture")).into_owned();
                (name, text)
            })
            .collect()
    })
}

/// Every fixture read as printed and as pasted the way `name` says: the same main event, but for
/// at most `tolerance` of them (a hard wrap is recognised by its shape, a heuristic:
/// `clean::unwrap_terminal`).
fn reads_the_same(name: &str) {
    reads_nearly_the_same(name, 0.0);
}

fn reads_nearly_the_same(name: &str, tolerance: f64) {
    let (_, told_survives, f) = transforms()
        .into_iter()
        .find(|t| t.0 == name)
        .expect("a transform of this file");
    let mut changed = Vec::new();
    let mut read = 0usize;
    for (file, text) in texts() {
        let events = scan_all(text.as_bytes());
        let Some(want) = key(&events) else {
            continue;
        };
        if !told_survives && main_event(&events).is_some_and(|e| e.told) {
            continue;
        }
        read += 1;
        let got = key(&scan_all(f(text).as_bytes()));
        if got.as_deref() != Some(want.as_str()) {
            changed.push(format!(
                "    {file}: {want} -> {}",
                got.unwrap_or_else(|| "no event".into())
            ));
        }
    }
    if !changed.is_empty() {
        println!(
            "pasted {name}, {} of {read} read otherwise:\n{}",
            changed.len(),
            changed.join("\n")
        );
    }
    assert!(
        changed.len() as f64 <= tolerance * read as f64,
        "pasted {name}, {} of {read} read otherwise (at most {:.0}% may):\n{}",
        changed.len(),
        tolerance * 100.0,
        changed.join("\n")
    );
}

#[test]
fn crlf() {
    reads_the_same("crlf");
}

#[test]
fn quoted() {
    reads_the_same("quoted");
}

#[test]
fn indented() {
    reads_the_same("indented");
}

#[test]
fn torchrun_rank() {
    reads_the_same("rank");
}

#[test]
fn ray_worker() {
    reads_the_same("ray");
}

#[test]
fn docker_compose() {
    reads_the_same("compose");
}

#[test]
fn srun_task() {
    reads_the_same("srun");
}

#[test]
fn html_entities() {
    reads_the_same("html");
}

#[test]
fn hard_wrapped_at_80_columns() {
    reads_nearly_the_same("wrap80", 0.015);
}

#[test]
fn hard_wrapped_at_120_columns() {
    reads_nearly_the_same("wrap120", 0.015);
}
