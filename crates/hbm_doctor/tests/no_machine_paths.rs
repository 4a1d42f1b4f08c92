//! Fixtures name no machine: the generated compiler outputs and examples carry repository-relative
//! paths, never the absolute path of the checkout (or home) that produced them. Messages users
//! posted (tests/corpus/issues, tests/corpus/trend) are verbatim and keep their own paths.

use std::path::{Path, PathBuf};

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

#[test]
fn generated_fixtures_carry_no_absolute_checkout_path() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let checkout = root.canonicalize().expect("root");
    let checkout = checkout.to_string_lossy().to_string();
    let mut files = Vec::new();
    for d in [
        "tests/corpus/tpu",
        "tests/corpus/cpu",
        "tests/corpus/gpu",
        "examples",
    ] {
        walk(&root.join(d), &mut files);
    }
    assert!(files.len() > 100, "fixtures found: {}", files.len());
    let mut bad = Vec::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for needle in [checkout.as_str(), "/home/", "/root/", "/work/", "/Users/"] {
            if let Some(i) = text.find(needle) {
                let line = text[..i].matches('\n').count() + 1;
                bad.push(format!("{}:{line}: `{needle}`", f.display()));
                break;
            }
        }
    }
    assert!(
        bad.is_empty(),
        "absolute paths in generated fixtures (the generators strip them; rewrite to repository-relative):\n{}",
        bad.join("\n")
    );
}
