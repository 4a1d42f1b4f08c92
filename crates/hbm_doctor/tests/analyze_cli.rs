//! `hbm-doctor analyze` as users run it: exit codes, the JSON contract, one-line errors.

mod support;

use support::{bin, tpu_dump};

use std::path::PathBuf;

#[test]
fn json_contract_and_exit_codes() {
    let out = bin()
        .args(["analyze", "--format", "json", "--target", "v5e"])
        .arg(tpu_dump("replicated_v5e"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1), "does not fit a v5e");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["schema_version"], 1);
    let m = &v["modules"][0];
    assert_eq!(m["name"], "jit_sgd_step");
    let s = &m["memory_spaces"][0];
    assert_eq!(s["space"], "hbm");
    assert_eq!(s["total_bytes"], 19_730_009_600u64);
    for k in [
        "peak_bytes",
        "arguments_bytes",
        "outputs_bytes",
        "aliased_bytes",
        "temp_bytes",
        "padding_bytes",
    ] {
        assert!(s[k].is_u64(), "{k}");
    }
    let b = &s["buffers_at_peak"][0];
    for k in [
        "name",
        "size_bytes",
        "unpadded_bytes",
        "shape",
        "kind",
        "op_name",
        "source",
    ] {
        assert!(b.get(k).is_some(), "{k}");
    }
    assert_eq!(v["diagnosis"]["causes"][0]["cause"], "replicated_tensor");
    assert!(v["diagnosis"]["category"].is_string());

    let ok = bin()
        .args(["analyze", "--budget", "1T"])
        .arg(tpu_dump("fits_v5e"))
        .output()
        .expect("run");
    assert_eq!(ok.status.code(), Some(0));
    let text = String::from_utf8_lossy(&ok.stdout);
    assert!(
        text.contains("memory over program order") && text.contains("generate.py:"),
        "{text}"
    );

    // One file of the dump reads its module's siblings.
    let file = std::fs::read_dir(tpu_dump("fits_v5e"))
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with("-buffer-assignment.txt"))
        .expect("file");
    assert_eq!(
        bin()
            .arg("analyze")
            .arg(file)
            .output()
            .expect("run")
            .status
            .code(),
        Some(0)
    );
}

#[test]
fn bad_input_says_what_to_do() {
    let empty = std::env::temp_dir().join(format!("hbm-doctor-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("mkdir");
    let out = bin().arg("analyze").arg(&empty).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--xla_dump_to") && err.lines().count() == 1,
        "{err}"
    );
    let _ = std::fs::remove_dir(&empty);
    let out = bin()
        .args(["analyze", "--target", "v99"])
        .arg(tpu_dump("fits_v5e"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let out = bin()
        .args(["analyze", "--budget", "lots"])
        .arg(tpu_dump("fits_v5e"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn markdown_is_tables() {
    let out = bin()
        .args([
            "analyze", "--format", "markdown", "--top", "3", "--target", "v5e",
        ])
        .arg(tpu_dump("replicated_v5e"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1), "does not fit a v5e");
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(
        md.starts_with("### hbm-doctor analyze: jit_sgd_step: does not fit v5e"),
        "{md}"
    );
    // The figures table: header, alignment row, one row with the exact total.
    let lines: Vec<&str> = md.lines().collect();
    let k = lines
        .iter()
        .position(|l| l.starts_with("| module | space | total | peak |"))
        .expect("figures table");
    assert!(lines[k + 1].starts_with("|---|---|---:|"));
    assert!(lines[k + 2].starts_with("| `jit_sgd_step` | hbm | 18.38G | 18.38G | 9.19G |"));
    // Causes as a table, ranked, then the actions.
    assert!(md.contains("| 1 | `replicated_tensor` | ~13.78G |"), "{md}");
    assert!(md.contains("1. **`replicated_tensor`**\n   - shard"));
    // Buffers at the peak: --top rows plus one summary row; every table row has the header's
    // number of cells (pipes inside op_names would break that).
    let b = lines
        .iter()
        .position(|l| l.starts_with("| # | size | unpadded |"))
        .expect("buffers table");
    let cells = |l: &str| l.matches('|').count() - l.matches("\\|").count();
    let rows: Vec<&&str> = lines[b + 2..]
        .iter()
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert!(rows.iter().all(|r| cells(r) == cells(lines[b])), "{rows:?}");
    assert!(rows[3].contains("more buffers"));
    assert!(
        md.contains("| `generate.py:220` | 9.19G | 50.0% | 4 |"),
        "{md}"
    );
    assert!(md.contains("peak by op_name path") && md.contains("&nbsp;&nbsp;`transpose(jvp())`"));
    // No human-format leftovers.
    assert!(!md.contains('┤') && !md.contains("note:"), "{md}");
}

#[test]
fn what_if_names_a_change_and_says_whether_it_fits() {
    let out = bin()
        .args(["analyze", "--target", "v5e", "--what-if", "debug_print"])
        .arg(tpu_dump("debug_print_v5e"))
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(1),
        "the program as it is does not fit"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("what if debug_print: peak 24.00G -> 4.00G")
            && text.contains("fits the budget"),
        "{text}"
    );
    let out = bin()
        .args(["analyze", "--format", "json", "--what-if", "bf16"])
        .arg(tpu_dump("debug_print_v5e"))
        .output()
        .expect("run");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["diagnosis"]["what_if"][0]["change"], "bf16");
    assert!(v["diagnosis"]["what_if"][0]["peak_bytes"].is_u64());
    assert!(v["diagnosis"]["ledger"].is_array());
    let out = bin()
        .args(["analyze", "--what-if", "nonsense"])
        .arg(tpu_dump("debug_print_v5e"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("use one of"), "{err}");
}

/// A live-range file whose header or intervals claim more positions than it can hold is refused
/// in one line, at once and in flat memory (it used to allocate 34 GB and abort).
#[test]
fn hostile_live_range_sizes_are_refused() {
    let dir = std::env::temp_dir().join(format!("hbm-doctor-hostile-lr-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let src = tpu_dump("remat_v6e");
    let mut lr_file = None;
    for e in std::fs::read_dir(&src).expect("dump").flatten() {
        let to = dir.join(e.file_name());
        std::fs::copy(e.path(), &to).expect("copy");
        if to.to_string_lossy().ends_with("live-range.txt") {
            lr_file = Some(to);
        }
    }
    let lr_file = lr_file.expect("a live-range file");
    let original = std::fs::read_to_string(&lr_file).expect("read");
    let header_end = original.find("):").expect("header");
    let header_start = original.find("HloLiveRange (max ").expect("header");
    let with_max = |m: &str| {
        format!(
            "{}HloLiveRange (max {m}{}",
            &original[..header_start],
            &original[header_end..]
        )
    };
    let first_range = original
        .lines()
        .skip_while(|l| !l.contains("BufferLiveRange:"))
        .nth(1)
        .expect("a range")
        .to_string();
    let (key, _) = first_range.rsplit_once(':').expect("range");
    let beyond = original.replacen(&first_range, &format!("{key}:0-18446744073709551615"), 1);
    for text in [
        with_max("4294967296"),
        with_max("300000000"),
        with_max("9223372036854775808"),
        beyond,
    ] {
        std::fs::write(&lr_file, &text).expect("write");
        let out = bin().arg("analyze").arg(&dir).output().expect("run");
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("live-range file is corrupt"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn copy_dump(case: &str, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hbm-doctor-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    for e in std::fs::read_dir(tpu_dump(case)).expect("dump").flatten() {
        std::fs::copy(e.path(), dir.join(e.file_name())).expect("copy");
    }
    dir
}

fn file_ending(dir: &std::path::Path, suffix: &str) -> PathBuf {
    std::fs::read_dir(dir)
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(suffix))
        .expect("file")
}

/// Files of different compiles, a truncated buffer assignment, a file that is not a dump and a
/// FIFO named like a dump file: each is said, never read silently as figures.
#[test]
fn dump_files_are_checked_against_each_other() {
    // The buffer assignment of another compile beside this HLO: an error naming both files.
    let dir = copy_dump("replicated_v5e", "mixed");
    let other = file_ending(&tpu_dump("remat_v6e"), "-buffer-assignment.txt");
    std::fs::copy(other, file_ending(&dir, "-buffer-assignment.txt")).expect("copy");
    let out = bin().arg("analyze").arg(&dir).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not from the same compile"), "{err}");
    assert_eq!(err.lines().count(), 1);
    let _ = std::fs::remove_dir_all(&dir);

    // A buffer assignment cut in half: named in the notes.
    let dir = copy_dump("aggregate_v5e", "cut");
    let ba = file_ending(&dir, "-buffer-assignment.txt");
    let text = std::fs::read_to_string(&ba).expect("read");
    std::fs::write(&ba, &text[..text.len() / 2]).expect("write");
    let out = bin()
        .args(["analyze", "--format", "json"])
        .arg(&dir)
        .output()
        .expect("run");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let notes = v["modules"][0]["notes"].to_string();
    assert!(notes.contains("truncated"), "{notes}");
    let _ = std::fs::remove_dir_all(&dir);

    // Not a dump, though named like one: refused.
    let dir = std::env::temp_dir().join(format!("hbm-doctor-notdump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join("module_0000.jit_f.after_optimizations.txt"),
        "these are my holiday notes\n".repeat(100),
    )
    .expect("write");
    let out = bin().arg("analyze").arg(&dir).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an XLA dump"));
    // A FIFO named like a dump file is skipped, not waited on.
    let fifo = dir.join("module_0000.jit_f.after_optimizations-buffer-assignment.txt");
    if std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        let out = bin().arg("analyze").arg(&dir).output().expect("run");
        assert_eq!(out.status.code(), Some(2));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
