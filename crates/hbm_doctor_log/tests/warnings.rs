//! Non-fatal warnings are counted and summarised, never stored one by one, and never hide the
//! failure that follows them (the issue "a log that hides its OOM among a million warnings").

use hbm_doctor_log::{
    scan_all_with_warnings, Event, Family, HitFinder, Scanner, WarningKind, WarningSummary,
};

const GIB: u64 = 1 << 30;
/// The real TPU compile OOM shipped in examples/ (its own remat warning included).
const OOM: &str = include_str!("../../../examples/jax-tpu-v5e-oom.log");

/// A remat warning as XLA prints it, with figures that vary from line to line.
fn remat_line(out: &mut String, i: u64) {
    use std::fmt::Write;
    let target = 8 * GIB + (i * 7_919) % (4 * GIB);
    let reached = target + 1 + (i * 104_729) % GIB;
    let original = reached + (i * 15_485_863) % (8 * GIB);
    let _ = writeln!(
        out,
        "W1121 12:{:02}:{:02}.{:06} {} hlo_rematerialization.cc:3231] Can't reduce memory use below {:.2}GiB ({target} bytes) by rematerialization; only reduced to {:.2}GiB ({reached} bytes), down from {:.2}GiB ({original} bytes) originally",
        i / 60 % 60,
        i % 60,
        i % 1_000_000,
        1000 + i % 9000,
        target as f64 / GIB as f64,
        reached as f64 / GIB as f64,
        original as f64 / GIB as f64,
    );
}

/// `n` warnings, then the worst one, then the OOM at the very end. Every 1000th warning is
/// followed by a training line, and some by lines with other anchors that take the slow path
/// (the rematerialization limit line, an allocator retry with an unusual prefix).
fn log(n: u64) -> (String, u64) {
    let mut s = String::with_capacity(n as usize * 220 + OOM.len());
    let mut lines = 0;
    for i in 0..n {
        remat_line(&mut s, i);
        lines += 1;
        if i % 1000 == 999 {
            s.push_str("I1121 12:00:00.000000 1 train.py:10] step 7 loss=1.25\n");
            lines += 1;
        }
        if i % 50_000 == 25_000 {
            s.push_str("I1121 12:00:00.000000 1 deepsea_compiler_hlo_passes.cc:5714] XLA::TPU post optimization rematerialization limit 12.45G = 95% hbm (14.96G) - (arguments (2.50G) - aliased_output(0B)) - overlays (7.02M)\n");
            s.push_str("[3] failed to allocate 2.12G (2282521344 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory\n");
            lines += 2;
        }
    }
    // The worst shortfall: 40 GiB short of a 10 GiB target.
    s.push_str("W1121 12:00:00.000000 1 hlo_rematerialization.cc:3231] Can't reduce memory use below 10.00GiB (10737418240 bytes) by rematerialization; only reduced to 50.00GiB (53687091200 bytes)\n");
    lines += 1;
    let worst_line = lines;
    s.push_str(OOM);
    (s, worst_line)
}

fn check(events: &[Event], warnings: &[WarningSummary], n: u64, worst_line: u64) {
    let fatal: Vec<&Event> = events.iter().filter(|e| e.fatal).collect();
    assert_eq!(fatal.len(), 1, "{fatal:?}");
    let oom = fatal[0];
    assert_eq!(oom.family, Family::TpuCompileHbm);
    assert_eq!(oom.used_bytes, Some(19_059_158_528)); // 17.75G
    assert_eq!(oom.limit_bytes, Some(16_911_433_728)); // 15.75G
    assert_eq!(oom.exceeded_bytes, Some(2_147_483_648)); // 2.00G as stated
    assert_eq!(oom.allocations.len(), 20);
    // The warning printed just before the failure is its evidence.
    let remat = oom.remat.as_ref().expect("remat attached");
    assert_eq!(remat.target_bytes, 13_372_150_681);
    assert_eq!(remat.reduced_to_bytes, 16_374_564_352);
    // Warnings are not events: only the failure is listed.
    assert_eq!(
        events.len(),
        1,
        "{:?}",
        events
            .iter()
            .map(|e| (e.line, e.family))
            .collect::<Vec<_>>()
    );

    let remat = warnings
        .iter()
        .find(|w| w.kind == WarningKind::RematWarning)
        .expect("remat summary");
    // n generated + the worst + the one in the OOM's own compiler output.
    assert_eq!(remat.count, n + 2);
    assert_eq!(remat.first_line, 1);
    assert!(remat.last_line > worst_line);
    assert_eq!(remat.worst.line, worst_line);
    assert_eq!(remat.worst.limit_bytes, Some(10 * GIB));
    assert_eq!(remat.worst.used_bytes, Some(50 * GIB));
    assert_eq!(remat.worst.exceeded_bytes, Some(40 * GIB));
    let retries = warnings
        .iter()
        .find(|w| w.kind == WarningKind::AllocatorRetry)
        .expect("retry summary");
    assert_eq!(retries.count, (n + 25_000) / 50_000);
    assert_eq!(retries.worst.requested_bytes, Some(2_282_521_344));
}

#[test]
fn a_million_warnings_do_not_hide_the_oom_after_them() {
    // A million in an optimized build; 200k in a debug one (a few seconds). BENCHMARKS.md has the
    // million in the CLI too.
    let n = if cfg!(debug_assertions) {
        200_000
    } else {
        1_000_000
    };
    let (text, worst_line) = log(n);
    let (events, warnings) = scan_all_with_warnings(text.as_bytes());
    check(&events, &warnings, n, worst_line);

    // Streamed in chunks as the binary reads files: the same result.
    let mut scanner = Scanner::new();
    let mut buf: Vec<u8> = Vec::new();
    let bytes = text.as_bytes();
    let chunk = 3 * 1024 * 1024 + 17;
    let mut at = 0;
    loop {
        let end = (at + chunk).min(bytes.len());
        buf.extend_from_slice(&bytes[at..end]);
        at = end;
        let eof = at == bytes.len();
        let consumed = scanner.scan(&buf, eof);
        buf.drain(..consumed);
        if eof {
            break;
        }
    }
    let (streamed, streamed_warnings) = scanner.finish_with_warnings();
    assert_eq!(streamed, events);
    assert_eq!(streamed_warnings, warnings);

    // The anchors found ahead by a HitFinder in every other window (as the binary does on a
    // mapped file), the scanner searching the others itself: the same result again.
    let (found, found_warnings) = scan_with_finder(bytes, 2 * 1024 * 1024 + 5);
    assert_eq!(found, events);
    assert_eq!(found_warnings, warnings);
}

/// Scans `bytes` in windows of `window` bytes, the anchors of every other window found by a
/// [`HitFinder`] and handed to the scanner (the binary's path for a memory-mapped file).
fn scan_with_finder(bytes: &[u8], window: usize) -> (Vec<Event>, Vec<WarningSummary>) {
    let mut finder = HitFinder::new();
    let mut scanner = Scanner::new();
    let (mut at, mut end, mut from) = (0usize, 0usize, 0usize);
    let mut index = 0;
    loop {
        end = (end + window).min(bytes.len());
        let eof = end == bytes.len();
        let mut hits = Vec::new();
        let to = if index % 2 == 0 || eof {
            let to = finder.feed(&bytes[..end], eof, &mut hits);
            scanner.push_hits(&hits, (from as u64, to as u64));
            to
        } else {
            finder.skip_to(end);
            end
        };
        from = to;
        index += 1;
        at += scanner.scan(&bytes[at..end], eof);
        if eof {
            break;
        }
    }
    scanner.finish_with_warnings()
}

#[test]
fn anchors_found_ahead_change_nothing() {
    // Every corpus post, and the posts joined into one log: the same events whether the scanner
    // searches its anchors itself or takes them from a HitFinder, whatever the windows cut.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/issues");
    let mut joined = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .expect("corpus")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    names.sort();
    for p in names.iter().take(400) {
        joined.extend(std::fs::read(p).expect("read"));
        joined.push(b'\n');
    }
    let mut scanner = Scanner::new();
    scanner.scan(&joined, true);
    let want = scanner.finish_with_warnings();
    for window in [4096usize, 65_537, 1 << 20] {
        assert_eq!(scan_with_finder(&joined, window), want, "window {window}");
    }
}

#[test]
fn warnings_alone_are_summarised_and_the_last_one_is_kept() {
    let mut text = String::new();
    for i in 0..5 {
        remat_line(&mut text, i);
    }
    let (events, warnings) = scan_all_with_warnings(text.as_bytes());
    assert_eq!(events.len(), 1);
    assert!(!events[0].fatal);
    assert_eq!(events[0].family, Family::RematWarning);
    assert_eq!(events[0].line, 5);
    assert!(events[0]
        .message
        .starts_with("Can't reduce memory use below"));
    assert_eq!(warnings.len(), 1);
    assert_eq!(
        (
            warnings[0].count,
            warnings[0].first_line,
            warnings[0].last_line
        ),
        (5, 1, 5)
    );
}

#[test]
fn allocator_warnings_are_counted_not_reported() {
    let text = "\
2019-01-01 12:00:00.000000: W tensorflow/core/common_runtime/bfc_allocator.cc:211] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.21GiB with freed_by_count=0. The caller indicates that this is not a failure, but may mean that there could be performance gains if more memory were available.
2019-01-01 12:00:00.000000: W tensorflow/core/common_runtime/bfc_allocator.cc:211] Allocator (GPU_0_bfc) ran out of memory trying to allocate 3.00GiB with freed_by_count=0. The caller indicates that this is not a failure, but may mean that there could be performance gains if more memory were available.
2019-01-01 12:00:00.000000: I external/xla/xla/stream_executor/cuda/cuda_driver.cc:739] failed to allocate 2.12G (2282521344 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory
";
    let (events, warnings) = scan_all_with_warnings(text.as_bytes());
    assert!(events.is_empty(), "{events:?}");
    let kinds: Vec<(WarningKind, u64, Option<u64>)> = warnings
        .iter()
        .map(|w| (w.kind, w.count, w.worst.requested_bytes))
        .collect();
    assert_eq!(
        kinds,
        [
            (WarningKind::BfcNotAFailure, 2, Some(3 * GIB)),
            (WarningKind::AllocatorRetry, 1, Some(2_282_521_344)),
        ]
    );
}

/// Warning lines of every kind, some damaged (a digit more, a character changed, a wrap), among
/// noise and two real failures: streamed in chunks of any size, the result is that of one scan.
#[test]
fn damaged_warnings_stream_like_one_scan() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let kinds = [
        "W1121 12:00:00.000000 1 hlo_rematerialization.cc:3231] Can't reduce memory use below 12.45GiB (13372150681 bytes) by rematerialization; only reduced to 15.25GiB (16374564352 bytes), down from 25.81GiB (27715962368 bytes) originally",
        "Can't reduce memory use below 1.00GiB (1073741824 bytes) by rematerialization; only reduced to 2.00GiB (2147483648 bytes)",
        "2019-01-01 12:00:00.000000: W tensorflow/core/common_runtime/bfc_allocator.cc:211] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.21GiB with freed_by_count=0. The caller indicates that this is not a failure, but may mean that there could be performance gains if more memory were available.",
        "I0000 00:00:1.0 7 cuda_driver.cc:739] failed to allocate 2.12G (2282521344 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
        "I1121 12:00:00.000000 1 train.py:10] step 7 loss=1.25 tokens/s=12345",
        "XLA::TPU rematerialization hbm reduction:  25.81G => 15.25G",
    ];
    let mut text = String::new();
    for i in 0..2500 {
        let mut line: Vec<u8> = kinds[next(kinds.len() as u64) as usize].bytes().collect();
        match next(10) {
            0 => {
                let at = next(line.len() as u64) as usize;
                line.insert(at, b'0' + next(10) as u8);
            }
            1 => {
                let at = next(line.len() as u64) as usize;
                line[at] = b" ;.(x]\\9"[next(8) as usize];
            }
            2 => {
                let at = next(line.len() as u64) as usize;
                line.insert(at, b'\n');
            }
            _ => {
                for b in line.iter_mut() {
                    if b.is_ascii_digit() && next(4) == 0 {
                        *b = b'0' + next(10) as u8;
                    }
                }
            }
        }
        text.push_str(&String::from_utf8_lossy(&line));
        text.push('\n');
        if i == 1200 || i == 2490 {
            text.push_str(OOM);
        }
    }
    let (events, warnings) = scan_all_with_warnings(text.as_bytes());
    assert!(events.iter().filter(|e| e.fatal).count() >= 2, "{events:?}");
    assert!(warnings.iter().map(|w| w.count).sum::<u64>() > 1000);
    let bytes = text.as_bytes();
    for round in 0..3 {
        let mut scanner = Scanner::new();
        let mut buf: Vec<u8> = Vec::new();
        let mut at = 0;
        loop {
            let chunk = 1 + next(if round == 0 { 4096 } else { 700_000 }) as usize;
            let end = (at + chunk).min(bytes.len());
            buf.extend_from_slice(&bytes[at..end]);
            at = end;
            let eof = at == bytes.len();
            let consumed = scanner.scan(&buf, eof);
            buf.drain(..consumed);
            if eof {
                break;
            }
        }
        let (e, w) = scanner.finish_with_warnings();
        assert_eq!(e, events, "round {round}");
        assert_eq!(w, warnings, "round {round}");
    }
}
