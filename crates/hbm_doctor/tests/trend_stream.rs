//! A 10 GB-equivalent flat-memory log read in streaming: the parser's retained state stays
//! bounded. The stream is generated on the fly (nothing is written to disk); the default size
//! keeps the test quick, `TREND_STREAM_BYTES=10737418240` runs the full 10 GB.

use hbm_doctor_trend::detect::Params;
use hbm_doctor_trend::reader::{Collected, Reader};
use hbm_doctor_trend::report::report;

#[test]
fn flat_stream_has_bounded_state() {
    let total: u64 = std::env::var("TREND_STREAM_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48 << 20);
    let mut c = Collected::default();
    let mut r = Reader::new("", "rec.jsonl");
    let mut chunk = String::with_capacity(1 << 20);
    let mut step = 0u64;
    let mut fed = 0u64;
    let mut retained_at_tenth = None;
    let mut max_pending = 0;
    while fed < total {
        chunk.clear();
        while chunk.len() < (1 << 20) - 512 {
            let used = 8_000_000_000u64 + (step * 7919 % 1000) * 100_000;
            chunk.push_str(&format!(
                "{{\"type\":\"sample\",\"host\":\"vm-0\",\"id\":\"{}\",\"source\":\"libtpu\",\"used_bytes\":{used},\"limit_bytes\":16909336576,\"step\":{step},\"ts\":{}}}\n",
                step % 4,
                1_795_255_200.0 + step as f64 * 0.25
            ));
            step += 1;
        }
        // Cut the chunk at an odd place so lines straddle chunks.
        let (a, b) = chunk.as_bytes().split_at(chunk.len() / 3);
        r.feed(&mut c, a);
        r.feed(&mut c, b);
        fed += chunk.len() as u64;
        max_pending = max_pending.max(r.pending_bytes());
        if retained_at_tenth.is_none() && fed >= total / 10 {
            retained_at_tenth = Some(c.retained());
        }
    }
    r.finish(&mut c);
    let end = c.retained();
    let tenth = retained_at_tenth.expect("measured");
    assert!(
        end <= 4 * 2 * 2 * hbm_doctor_trend::store::MAX_WINDOWS + 64,
        "{end}"
    );
    assert!(
        end <= tenth * 2 + 64,
        "state grew with the input: {tenth} -> {end}"
    );
    assert!(max_pending <= hbm_doctor_trend::reader::MAX_LINE * 2);
    let rep = report(&c, &Params::default());
    assert_eq!(rep.series.len(), 4);
    for s in &rep.series {
        assert_eq!(s.verdict, "stable", "{s:?}");
        assert_eq!(s.samples, step / 4);
    }
}
