//! House rules that can be checked: every source file opens with a module doc; the pure crates
//! (parsers, diagnosis, trend, rendering) touch no file, no stdout or stderr, outside their tests;
//! crates depend on each other in one direction only (ARCHITECTURE.md).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_source_file_has_a_module_doc() {
    let mut files = Vec::new();
    for c in std::fs::read_dir(root().join("crates"))
        .expect("crates")
        .flatten()
    {
        let src = c.path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    assert!(files.len() > 40);
    let missing: Vec<String> = files
        .iter()
        .filter(|f| {
            !std::fs::read_to_string(f)
                .expect("read")
                .trim_start()
                .starts_with("//!")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "files without a //! module doc:\n{}",
        missing.join("\n")
    );
}

#[test]
fn pure_crates_do_no_io() {
    let forbidden = [
        "std::fs",
        "File::",
        "println!",
        "eprintln!",
        "print!(",
        "stdout()",
        "stderr()",
        "std::net",
    ];
    let mut bad = Vec::new();
    for c in [
        "hbm_doctor_units",
        "hbm_doctor_hlo",
        "hbm_doctor_log",
        "hbm_doctor_analysis",
        "hbm_doctor_trend",
        "hbm_doctor_render",
    ] {
        let mut files = Vec::new();
        rust_files(&root().join("crates").join(c).join("src"), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).expect("read");
            // Unit tests may read fixtures.
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for (n, line) in code.lines().enumerate() {
                let l = line.trim_start();
                if l.starts_with("//") {
                    continue;
                }
                if let Some(w) = forbidden.iter().find(|w| l.contains(*w)) {
                    bad.push(format!("{}:{}: `{w}`", f.display(), n + 1));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "I/O in a pure crate (the binary does I/O):\n{}",
        bad.join("\n")
    );
}

#[test]
fn crates_depend_in_one_direction() {
    // Each crate may depend only on crates earlier in this list.
    let order = [
        "hbm_doctor_units",
        "hbm_doctor_hlo",
        "hbm_doctor_log",
        "hbm_doctor_analysis",
        "hbm_doctor_trend",
        "hbm_doctor_render",
        "hbm_doctor_monitor",
        "hbm_doctor",
    ];
    let mut bad = Vec::new();
    for (i, c) in order.iter().enumerate() {
        let toml = std::fs::read_to_string(root().join("crates").join(c).join("Cargo.toml"))
            .expect("Cargo.toml");
        let deps = toml.split("[dev-dependencies]").next().unwrap_or("");
        for (j, other) in order.iter().enumerate() {
            let named = deps.lines().any(|l| {
                let l = l.trim_start();
                l.starts_with(&format!("{other} ")) || l.starts_with(&format!("{other}."))
            });
            if named && j >= i {
                bad.push(format!("{c} depends on {other}"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "dependencies against the pipeline's direction: {bad:?}"
    );
}

#[test]
fn units_have_one_home() {
    // Sizes, dates and chips live in hbm_doctor_units (ARCHITECTURE.md, "Units"): no other crate
    // computes calendars, prints `GiB`, or knows a chip's usable HBM.
    let forbidden = [
        "719_468",
        "719468",
        "146_097",
        "146097",
        " GiB\"",
        "GiB\", ",
        "16_909_336_576",
        "33_550_237_696",
        "33_017_561_088",
        "101_732_843_520",
        "102_803_439_616",
    ];
    let mut files = Vec::new();
    for c in std::fs::read_dir(root().join("crates"))
        .expect("crates")
        .flatten()
    {
        let src = c.path().join("src");
        if src.is_dir() && !c.path().ends_with("hbm_doctor_units") {
            rust_files(&src, &mut files);
        }
    }
    let mut bad = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for (n, line) in code.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            if let Some(w) = forbidden.iter().find(|w| line.contains(*w)) {
                bad.push(format!("{}:{}: `{w}`", f.display(), n + 1));
            }
        }
    }
    let js = root().join("crates/hbm_doctor_render/assets/view.js");
    let text = std::fs::read_to_string(&js).expect("view.js");
    for (n, line) in text.lines().enumerate() {
        if line.contains("'KiB'") || line.contains("' GiB'") || line.contains("' MiB'") {
            bad.push(format!("{}:{}: IEC spelling", js.display(), n + 1));
        }
    }
    assert!(
        bad.is_empty(),
        "a second home for units (use hbm_doctor_units):\n{}",
        bad.join("\n")
    );
}
