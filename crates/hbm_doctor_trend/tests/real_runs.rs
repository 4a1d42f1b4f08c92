//! Series as real runs write them: sparse and aliased, rows out of order, bad values, restarts,
//! several hosts (the scenarios of `hbm_doctor_trend::simulate`, here as single cases with
//! their figures asserted).

use hbm_doctor_trend::detect::Params;
use hbm_doctor_trend::reader::Collected;
use hbm_doctor_trend::report::{report, TrendReport};

const L: f64 = 17_179_869_184.0;

fn noise(i: u64) -> f64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % 2001) as f64 / 1000.0 - 1.0
}

fn run(csv: &str) -> TrendReport {
    let mut c = Collected::default();
    hbm_doctor_trend::read_all(&mut c, "", "mem.csv", csv.as_bytes());
    report(&c, &Params::default())
}

/// `rate` of the limit per 1k steps, a gradient-accumulation sawtooth of `period` steps and
/// 8% of the limit, noise ±0.5%, sampled every `every` steps up to `steps`.
fn series(rate: f64, period: u64, every: u64, steps: u64) -> Vec<(u64, f64)> {
    (0..=steps)
        .step_by(every as usize)
        .map(|s| {
            let saw = 0.08 * L * (s % period) as f64 / period as f64;
            let v = 0.45 * L + saw + rate * L * s as f64 / 1000.0 + 0.005 * L * noise(s);
            (s, v)
        })
        .collect()
}

fn csv(rows: &[(u64, f64)]) -> String {
    let mut t = String::from("step,bytes_in_use,bytes_limit\n");
    for (s, v) in rows {
        t.push_str(&format!("{s},{},{}\n", *v as u64, L as u64));
    }
    t
}

#[test]
fn a_leak_of_1_percent_per_1k_steps_over_8k_steps_sampled_every_5_is_called() {
    // The plain case, on every gradient-accumulation period that aliases at 5 and 50.
    for every in [5u64, 20, 50] {
        for period in [2u64, 3, 4, 8, 16] {
            let rep = run(&csv(&series(0.01, period, every, 8000)));
            let s = &rep.series[0];
            assert_eq!(
                s.verdict, "leak",
                "every {every}, period {period}: {:?}",
                s.reason
            );
            let g = s.growth_bytes_per_1k_steps.unwrap_or(0) as f64 / L;
            assert!(
                (g - 0.01).abs() < 0.002,
                "every {every} period {period}: {g}"
            );
            assert_eq!(s.restarts, 0);
        }
    }
}

#[test]
fn flat_sparse_aliased_series_are_not_leaks() {
    for every in [5u64, 20, 50] {
        for period in [2u64, 3, 4, 8, 16] {
            let rep = run(&csv(&series(0.0, period, every, 20_000)));
            let s = &rep.series[0];
            assert!(
                s.verdict == "stable" || s.verdict == "sawtooth",
                "every {every}, period {period}: {} {:?}",
                s.verdict,
                s.reason
            );
        }
    }
}

#[test]
fn swapped_rows_and_bad_values_do_not_restart_the_series() {
    let mut rows = series(0.005, 4, 10, 16_000);
    for i in (5..rows.len() - 2).step_by(150) {
        rows.swap(i, i + 1);
    }
    let mut t = csv(&rows);
    // Every 7th value bad.
    let lines: Vec<String> = t
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i > 0 && i % 7 == 0 {
                let mut f: Vec<&str> = l.split(',').collect();
                f[1] = ["NaN", "inf", "-3", "1e30", ""][i / 7 % 5];
                f.join(",")
            } else {
                l.to_string()
            }
        })
        .collect();
    t = lines.join("\n");
    let rep = run(&t);
    let s = &rep.series[0];
    assert_eq!(s.verdict, "leak", "{:?}", s.reason);
    assert_eq!(s.restarts, 0);
    assert_eq!(s.invalid_samples, (rows.len() / 7) as u64);
    assert!(s.reordered_samples >= 5, "{}", s.reordered_samples);
}

#[test]
fn reversed_rows_follow_the_time_column() {
    let rows = series(0.01, 8, 10, 8000);
    let mut t = String::from("step,time,bytes_in_use,bytes_limit\n");
    for (s, v) in rows.iter().rev() {
        t.push_str(&format!(
            "{s},{},{},{}\n",
            1_795_255_200 + s / 2,
            *v as u64,
            L as u64
        ));
    }
    let s = &run(&t).series[0];
    assert_eq!(s.verdict, "leak", "{:?}", s.reason);
    assert_eq!(s.restarts, 0);
    assert_eq!(s.first_step, Some(0));
}

#[test]
fn isolated_spikes_in_a_sparse_series_are_each_reported() {
    let mut rows = series(0.0, 4, 25, 12_000);
    let at = [3000u64, 6500, 9750];
    for (s, v) in rows.iter_mut() {
        if at.contains(s) {
            *v += 0.15 * L;
        }
    }
    let s = &run(&csv(&rows)).series[0];
    assert_eq!(s.verdict, "spikes");
    let got: Vec<u64> = s.spikes.iter().filter_map(|x| x.step).collect();
    assert_eq!(got, at.to_vec());
    for x in &s.spikes {
        assert!(x.above_bytes as f64 > 0.05 * L, "{x:?}");
    }
}

#[test]
fn a_new_pid_is_a_new_process() {
    // A leak restarted from a checkpoint 500 steps back: the pid column (CSV) or glog's thread
    // id (JAX log) says a new process began; rows of the two writers interleave a little.
    let first = series(0.01, 4, 10, 6000);
    let second = series(0.01, 4, 10, 9000);
    let mut t = String::from("step,pid,bytes_in_use,bytes_limit\n");
    let mut log = String::new();
    for (s, v) in &first {
        t.push_str(&format!("{s},4242,{},{}\n", *v as u64, L as u64));
        log.push_str(&format!(
            "I1121 10:00:00.000000 4242 train.py:212] step {s}, memory: {{'bytes_in_use': {}, 'bytes_limit': {}}}\n",
            *v as u64, L as u64
        ));
    }
    for (s, v) in &second {
        let s = s + 5500;
        t.push_str(&format!("{s},5313,{},{}\n", *v as u64, L as u64));
        log.push_str(&format!(
            "I1121 12:00:00.000000 5313 train.py:212] step {s}, memory: {{'bytes_in_use': {}, 'bytes_limit': {}}}\n",
            *v as u64, L as u64
        ));
    }
    for (name, text) in [("mem.csv", t), ("train.log", log)] {
        let mut c = Collected::default();
        hbm_doctor_trend::read_all(&mut c, "", name, text.as_bytes());
        let rep = report(&c, &Params::default());
        let s = &rep.series[0];
        assert_eq!(s.restarts, 1, "{name}");
        assert_eq!(s.first_step, Some(5500), "{name}");
        assert_eq!(s.verdict, "leak", "{name}: {:?}", s.reason);
    }
}

#[test]
fn spikes_in_the_warm_up_are_reported() {
    // A spike at step 150 (inside the excluded warm-up) and one near the end, on a flat
    // series sampled every 10 steps.
    let mut rows = series(0.0, 4, 10, 12_000);
    for (s, v) in rows.iter_mut() {
        if *s == 150 || *s == 11_000 {
            *v += 0.2 * L;
        }
    }
    let s = &run(&csv(&rows)).series[0];
    assert_eq!(s.verdict, "spikes", "{:?}", s.reason);
    let got: Vec<u64> = s.spikes.iter().filter_map(|x| x.step).collect();
    assert_eq!(got, vec![150, 11_000]);
}
