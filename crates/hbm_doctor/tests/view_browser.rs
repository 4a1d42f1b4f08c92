//! `hbm-doctor view` in a real browser: Debian's Chromium, headless, driven over the DevTools
//! protocol by `view_browser_driver.mjs` (Node 20+, no npm package). Pages from real TPU dumps
//! must render the right numbers, select a buffer everywhere on a click, and make no request but
//! the page itself; screenshots are kept under `target/view-browser/`.
//!
//! Skipped with a message when `chromium` or a suitable `node` is missing, unless
//! `VIEW_BROWSER_REQUIRED=1` (as `scripts/view-browser-test.sh` sets), which makes it fail instead.
//! `HBM_DOCTOR_CHROMIUM` names another browser binary (a path that does not exist: no browser).

mod support;

use support::{bin, tpu_dump};

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const DRIVER: &str = include_str!("view_browser_driver.mjs");

fn out_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .join("view-browser");
    std::fs::create_dir_all(&d).expect("create target/view-browser");
    d
}

fn find_chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HBM_DOCTOR_CHROMIUM") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    for name in ["chromium", "chromium-browser", "google-chrome", "chrome"] {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// `node` that has a global WebSocket with `--experimental-websocket` (Node 20.10+) or without.
fn node_ok() -> bool {
    Command::new("node")
        .args([
            "--experimental-websocket",
            "-e",
            "process.exit(typeof WebSocket === 'function' ? 0 : 3)",
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn required() -> bool {
    std::env::var_os("VIEW_BROWSER_REQUIRED").is_some_and(|v| v == "1")
}

/// Skips (or, when required, fails) without a browser.
fn browser() -> Option<PathBuf> {
    let chromium = find_chromium();
    let node = node_ok();
    match (chromium, node) {
        (Some(c), true) => Some(c),
        (c, n) => {
            let what = match (c.is_some(), n) {
                (false, false) => "chromium and node (20+)",
                (false, true) => "chromium",
                _ => "node 20+ (with WebSocket)",
            };
            let msg = format!(
                "view_browser: skipped: {what} not found. Install Debian's chromium (`apt-get install -y chromium`) and Node.js, or run scripts/view-browser-test.sh"
            );
            if required() {
                panic!("{msg} (VIEW_BROWSER_REQUIRED=1)");
            }
            // Straight to the process's stderr, past the test harness's capture, once.
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                use std::io::Write as _;
                let _ = writeln!(std::io::stderr(), "{msg}");
            });
            None
        }
    }
}

fn write_page(name: &str, args: &[&Path], extra: &[&str]) -> PathBuf {
    let page = out_dir().join(format!("{name}.html"));
    let out = bin()
        .arg("view")
        .args(args)
        .args(extra)
        .arg("-o")
        .arg(&page)
        .arg("--force")
        .output()
        .expect("run view");
    assert!(
        out.status.success(),
        "view {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    page
}

fn drive(chromium: &Path, page: &Path, scenario: &str) -> Value {
    let dir = out_dir();
    let driver = dir.join(format!("driver-{scenario}.mjs"));
    std::fs::write(&driver, DRIVER).expect("write driver");
    let shot = dir.join(format!("{scenario}.png"));
    let out = Command::new("node")
        .arg("--experimental-websocket")
        .arg(&driver)
        .arg(chromium)
        .arg(page)
        .arg(&shot)
        .arg(scenario)
        .output()
        .expect("run node");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "driver output is not JSON ({e}): {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(v.get("fatal").is_none(), "{scenario}: driver failed: {v}");
    println!(
        "view_browser: {scenario}: loaded in {} ms, screenshot {}",
        v["load_ms"],
        shot.display()
    );
    v
}

fn analyze(path: &Path, extra: &[&str]) -> Value {
    let out = bin()
        .arg("analyze")
        .arg(path)
        .args(extra)
        .args(["--format", "json"])
        .output()
        .expect("analyze");
    serde_json::from_slice(&out.stdout).expect("analyze JSON")
}

/// The page loaded, raised no error and requested nothing but itself.
fn assert_clean(v: &Value, page: &Path) {
    assert_eq!(v["ready"], "1", "page did not finish rendering: {v}");
    assert_eq!(v["exceptions"], Value::Array(vec![]), "exceptions: {v}");
    assert_eq!(v["console_errors"], Value::Array(vec![]));
    assert_eq!(v["initial"]["errors"], Value::Array(vec![]));
    let reqs: Vec<&str> = v["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let me = format!("file://{}", page.display());
    assert!(
        reqs.iter().all(|u| *u == me),
        "the page made requests other than itself: {reqs:?}"
    );
    assert_eq!(reqs.len(), 1, "exactly the page itself: {reqs:?}");
    assert_eq!(v["initial"]["resources"], 0, "no resource entries");
    let shot = v["screenshot"].as_str().expect("screenshot");
    assert!(
        std::fs::metadata(shot).is_ok_and(|m| m.len() > 10_000),
        "screenshot written"
    );
}

/// The viewer prints sizes as every human output does (`hbm_doctor_units::format_size`).
fn gib2(b: u64) -> String {
    hbm_doctor_log::format_size(b)
}

#[test]
fn page_from_a_compile_time_oom_dump() {
    let Some(chromium) = browser() else { return };
    // aggregate_v5e: a real TPU compile that ran out of HBM (XProf has nothing to show here).
    let dump = tpu_dump("aggregate_v5e");
    let page = write_page("aggregate_v5e", &[&dump], &["--target", "v5e"]);
    let v = drive(&chromium, &page, "aggregate_v5e");
    assert_clean(&v, &page);
    let want = analyze(&dump, &["--target", "v5e"]);
    let hbm = &want["modules"][0]["memory_spaces"][0];
    let init = &v["initial"];

    // Diagnosis at the top.
    assert_eq!(init["verdict"], want["diagnosis"]["summary"]);
    assert_eq!(init["category"], want["diagnosis"]["category"]);
    let causes: Vec<&Value> = want["diagnosis"]["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .map(|c| &c["cause"])
        .collect();
    assert!(!causes.is_empty());
    assert_eq!(
        init["causes"]
            .as_array()
            .map(|a| a.iter().collect::<Vec<_>>()),
        Some(causes)
    );

    // Figures, with the numbers of analyze.
    for (fig, field) in [
        ("total", "total_bytes"),
        ("peak", "peak_bytes"),
        ("arguments", "arguments_bytes"),
        ("temp", "temp_bytes"),
        ("padding", "padding_bytes"),
    ] {
        assert_eq!(init["figures"][fig]["bytes"], hbm[field], "{fig}");
    }
    let peak = hbm["peak_bytes"].as_u64().expect("peak");
    assert_eq!(init["figures"]["peak"]["text"], gib2(peak));
    assert_eq!(init["figures"]["peak"]["text"], "17.75G");

    // The chart: peak, limit of the chip, every schedule position, drawn.
    let chart = &init["chart"];
    assert_eq!(chart["peak_bytes"], peak.to_string());
    assert_eq!(chart["peak_time"], hbm["peak_time"].to_string());
    assert_eq!(chart["limit_bytes"], "16909336576");
    assert_eq!(
        chart["positions"].as_u64(),
        hbm["timeline"].as_array().map(|a| a.len() as u64)
    );
    let px = chart["below_peak_pixel"].as_array().expect("pixel");
    assert_eq!(
        px[3], 255,
        "the stack is drawn under the peak marker: {px:?}"
    );
    let legend = init["legend"].as_str().unwrap_or("");
    for k in ["arguments", "outputs", "temporaries", "limit"] {
        assert!(legend.contains(k), "legend lacks {k}: {legend}");
    }

    // Table and Gantt.
    let at_peak = hbm["buffers_at_peak"].as_array().expect("buffers");
    assert_eq!(init["table_rows"], at_peak.len());
    assert_eq!(init["table_bytes"], peak);
    assert_eq!(init["first_rows"][0]["bytes"], at_peak[0]["size_bytes"]);
    assert_eq!(
        init["gantt_rows"].as_u64(),
        hbm["largest_buffers"].as_array().map(|a| a.len() as u64)
    );

    // Clicking a table row selects the buffer everywhere.
    let row = v["clicked_row"].as_str().expect("clicked a row");
    let after = &v["after_row_click"];
    assert_eq!(after["state"]["selected"], row);
    assert_eq!(after["selected_row"], row, "row highlighted");
    assert_eq!(after["gantt_selected"], row, "Gantt highlighted");
    assert_eq!(after["chart_selected"], row, "chart highlighted");
    assert_eq!(after["selected_panel"], row, "details shown");
    assert_eq!(after["selected_hidden"], false);
    assert_eq!(after["hash"], row, "selection kept in the URL");
    let size = at_peak
        .iter()
        .find(|b| b["name"] == row)
        .map(|b| b["size_bytes"].clone());
    assert_eq!(Some(after["selected_size"].clone()), size);

    // Clicking a Gantt bar selects that buffer (one not live at the peak: not in the table).
    let bar = v["clicked_bar"].as_str().expect("clicked a bar");
    let after = &v["after_bar_click"];
    assert_eq!(after["state"]["selected"], bar);
    assert_eq!(after["selected_panel"], bar);
    assert_eq!(after["gantt_selected"], bar);

    // The filter box filters the table.
    let n = at_peak
        .iter()
        .filter(|b| {
            [
                &b["name"],
                &b["shape"],
                &b["op_name"],
                &b["source"],
                &b["layout_shape"],
            ]
            .iter()
            .any(|f| {
                f.as_str()
                    .is_some_and(|s| s.to_lowercase().contains("fusion"))
            })
        })
        .count();
    assert_eq!(v["filter"]["rows"], n);
}

#[test]
fn diff_page_shows_what_the_fix_changed() {
    let Some(chromium) = browser() else { return };
    let before = tpu_dump("no_donation_v5e");
    let after = tpu_dump("no_donation_fixed_v5e");
    let page = write_page("no_donation_diff", &[&before, &after], &["--target", "v5e"]);
    let v = drive(&chromium, &page, "no_donation_diff");
    assert_clean(&v, &page);
    let b = analyze(&before, &["--target", "v5e"]);
    let a = analyze(&after, &["--target", "v5e"]);
    let hb = &b["modules"][0]["memory_spaces"][0];
    let ha = &a["modules"][0]["memory_spaces"][0];
    let init = &v["initial"];
    assert_eq!(init["state"]["mode"], "diff");
    assert_eq!(
        init["verdict"], a["diagnosis"]["summary"],
        "after's diagnosis"
    );
    assert_eq!(init["figures"]["total"]["bytes"], ha["total_bytes"]);
    let tb = hb["total_bytes"].as_u64().expect("before");
    let ta = ha["total_bytes"].as_u64().expect("after");
    let verdict = init["diff_verdict"].as_str().expect("diff verdict");
    assert!(
        verdict.starts_with(&format!("total {} → {}", gib2(tb), gib2(ta))),
        "{verdict}"
    );
    assert!(
        init["diff_changed_rows"].as_u64().unwrap_or(0) > 0,
        "changed buffers listed"
    );
    assert_eq!(v["after_row_click"]["state"]["selected"], v["clicked_row"]);
}

/// A dump with `n` temporaries in one arena, all live in the middle of a 2000-step program.
fn synthetic_dump(dir: &Path, n: usize) {
    use std::fmt::Write as _;
    let size = |k: usize| 1024 * (1 + (k % 97) as u64);
    let total: u64 = (0..n).map(size).sum();
    let mut ba = format!("BufferAssignment:\nallocation 0: size {total}, preallocated-temp:\n");
    let mut offset = 0u64;
    for k in 0..n {
        let z = size(k);
        let _ = writeln!(
            ba,
            " value: <{} fusion.{k} @0> (size={z},offset={offset}): f32[{}]{{0}}",
            k + 1,
            z / 4
        );
        offset += z;
    }
    let mut lr = String::from("HloLiveRange (max 2000):\n  InstructionSequence:\n");
    for t in 0..2000 {
        let _ = writeln!(lr, "    {t}:fusion.{t}");
    }
    lr.push_str("  BufferLiveRange:\n");
    for k in 0..n {
        let _ = writeln!(lr, "    fusion.{k}{{}}:{}-{}", k % 900, k % 900 + 1000);
    }
    let key = "module_0000.jit_big.cl_1.after_optimizations";
    std::fs::write(dir.join(format!("{key}-buffer-assignment.txt")), ba).expect("ba");
    std::fs::write(dir.join(format!("{key}-live-range.txt")), lr).expect("lr");
}

#[test]
fn page_with_100k_buffers() {
    let Some(chromium) = browser() else { return };
    let dump = out_dir().join("big-dump");
    let _ = std::fs::remove_dir_all(&dump);
    std::fs::create_dir_all(&dump).expect("dump dir");
    synthetic_dump(&dump, 100_000);
    let page = write_page("big", &[&dump], &[]);
    let v = drive(&chromium, &page, "big");
    assert_clean(&v, &page);
    let init = &v["initial"];
    let rows = init["table_rows"].as_u64().expect("rows");
    assert!(rows > 99_000, "{rows} rows");
    assert_eq!(init["gantt_rows"], 500);
    // Virtualized: a screenful of rows in the DOM, and scrolling reaches the last one.
    let in_dom = v["scrolled"]["rows_in_dom"].as_u64().expect("rows in dom");
    assert!(in_dom < 100, "{in_dom} rows in the DOM");
    assert_eq!(v["scrolled"]["last"], (rows - 1).to_string());
    assert_eq!(
        v["filter"]["rows"], 11,
        "fusion.9999 and fusion.99990..99999"
    );
    assert_eq!(v["after_row_click"]["state"]["selected"], v["clicked_row"]);
    println!(
        "view_browser: 100k buffers: load {} ms, filter+scroll {} ms",
        v["load_ms"], v["scroll_ms"]
    );
}
