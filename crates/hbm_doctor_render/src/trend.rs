//! Views of a `trend` report: per device the verdict, growth, OOM forecast, level changes,
//! spikes and causes; hosts' endings; the next debug switches. Markdown is the terminal text
//! without colour; JSON is the contract.

use crate::{json, Format, Style};
use hbm_doctor_log::format_size;
use hbm_doctor_trend::report::TrendReport;
use std::fmt::Write as _;

/// `writeln!` into a `String`, which cannot fail.
macro_rules! w {
    ($($t:tt)*) => {{ let _ = writeln!($($t)*); }};
}

/// A verdict in capitals: a leak in red, stable in green, a step, spikes or a sawtooth in yellow.
fn verdict(v: &str, st: Style) -> String {
    let text = v.to_uppercase();
    match v {
        "leak" => st.red(&text),
        "stable" => st.green(&text),
        "insufficient_data" => text,
        _ => st.yellow(&text),
    }
}

/// Renders a trend report.
pub fn render_trend(report: &TrendReport, format: Format, style: Style) -> String {
    match format {
        Format::Json => json(report),
        Format::Human => human(report, style),
        Format::Markdown => human(report, Style::new(false)),
    }
}

fn sz(v: i64) -> String {
    if v < 0 {
        format!("-{}", format_size(v.unsigned_abs()))
    } else {
        format_size(v as u64)
    }
}

fn human(rep: &TrendReport, st: Style) -> String {
    let mut out = String::new();
    let out = &mut out;
    for s in &rep.series {
        let name = if s.host.is_empty() {
            format!("device {}", s.device)
        } else {
            format!("{} device {}", s.host, s.device)
        };
        let steps = match (s.first_step, s.last_step) {
            (Some(a), Some(b)) => format!(", steps {a}-{b}"),
            _ => String::new(),
        };
        w!(
            out,
            "{}: {} ({} samples{steps})",
            st.bold(&name),
            verdict(s.verdict, st),
            s.samples
        );
        if let Some(r) = &s.reason {
            w!(out, "  {r}");
        }
        if s.verdict != "insufficient_data" {
            let mut g = Vec::new();
            if let Some(v) = s.growth_bytes_per_1k_steps {
                let ci = s
                    .growth_ci_bytes_per_1k_steps
                    .map_or(String::new(), |[l, h]| format!(" [{} .. {}]", sz(l), sz(h)));
                g.push(format!("{}/1k steps{ci}", sz(v)));
            }
            if let Some(v) = s.growth_bytes_per_hour {
                g.push(format!("{}/hour", sz(v)));
            }
            if let Some(v) = s.growth_bytes_per_1k_samples {
                g.push(format!("{}/1k samples", sz(v)));
            }
            w!(
                out,
                "  floor {}  ceiling {}{}  growth {}",
                format_size(s.floor_bytes.unwrap_or(0)),
                format_size(s.ceiling_bytes.unwrap_or(0)),
                s.limit_bytes
                    .map_or(String::new(), |l| format!(" of {}", format_size(l))),
                if g.is_empty() {
                    "-".into()
                } else {
                    g.join(", ")
                }
            );
        }
        if s.verdict == "leak" {
            match (s.oom_step_forecast, &s.oom_time_forecast) {
                (Some(st), Some(t)) => w!(
                    out,
                    "  OOM forecast: step {st} ({t}); cautious: step {}",
                    s.oom_step_forecast_early
                        .map_or("-".into(), |v| v.to_string())
                ),
                (Some(st), None) => w!(out, "  OOM forecast: step {st}"),
                (None, Some(t)) => w!(out, "  OOM forecast: {t}"),
                _ if s.limit_bytes.is_none() => {
                    w!(out, "  no limit in the input: no OOM forecast")
                }
                _ => {}
            }
        }
        if let Some(sc) = &s.step_change {
            w!(
                out,
                "  level change {} at step {}{}",
                sz(sc.delta_bytes),
                sc.step.map_or("?".into(), |v| v.to_string()),
                sc.near.map_or(String::new(), |n| format!(" near {n}"))
            );
        }
        for sp in s.spikes.iter().take(10) {
            w!(
                out,
                "  spike at step {}: {} (+{}){}",
                sp.step.map_or("?".into(), |v| v.to_string()),
                format_size(sp.bytes),
                format_size(sp.above_bytes),
                sp.near.map_or(String::new(), |n| format!(" near {n}"))
            );
        }
        if s.restarts > 0 {
            w!(
                out,
                "  {} restart(s): figures describe the last process",
                s.restarts
            );
        }
        if let Some(p) = s.pool_plateau_bytes {
            let share = s
                .limit_bytes
                .filter(|&l| l > 0)
                .map(|l| format!(" ({:.0}% of the device)", 100.0 * p as f64 / l as f64))
                .unwrap_or_default();
            w!(
                out,
                "  every reading shows {}{share} from the start: a pool the framework preallocated (JAX takes 75% by default, TensorFlow the whole card); growth inside it does not show from outside: record from inside the process (hbm_doctor.sampler: memory_stats()['bytes_in_use']) or run with XLA_PYTHON_CLIENT_PREALLOCATE=false (TensorFlow: allow_growth) to see it",
                format_size(p)
            );
        }
        let mut fixed = Vec::new();
        if s.invalid_samples > 0 {
            fixed.push(format!(
                "{} bad value(s) skipped (NaN, infinite, negative or beyond any device)",
                s.invalid_samples
            ));
        }
        if s.reordered_samples > 0 {
            fixed.push(format!(
                "{} row(s) out of order put back in place",
                s.reordered_samples
            ));
        }
        if s.duplicate_samples > 0 {
            fixed.push(format!("{} duplicate row(s) merged", s.duplicate_samples));
        }
        if !fixed.is_empty() {
            w!(out, "  {}", fixed.join("; "));
        }
        for c in &s.causes {
            w!(out, "  cause {}: {}", st.cyan(c.cause.as_str()), c.evidence);
            for a in &c.actions {
                w!(out, "    - {a}");
            }
        }
    }
    if !rep.diverging.is_empty() {
        let d: Vec<String> = rep
            .diverging
            .iter()
            .map(|d| format!("{}:{}", d.host, d.device))
            .collect();
        w!(
            out,
            "diverging: {} grow(s) differently from the others",
            d.join(", ")
        );
    }
    for h in &rep.hosts {
        if h.causes.is_empty() && h.ending == "unknown" {
            continue;
        }
        let name = if h.host.is_empty() {
            "run".to_string()
        } else {
            format!("host {}", h.host)
        };
        w!(
            out,
            "{name}: ending {}{}",
            h.ending,
            if h.hbm_at_limit.is_empty() {
                String::new()
            } else {
                format!(", HBM at the limit on {}", h.hbm_at_limit.join(", "))
            }
        );
        for c in &h.causes {
            w!(out, "  cause {}: {}", st.cyan(c.cause.as_str()), c.evidence);
            for a in &c.actions {
                w!(out, "    - {a}");
            }
        }
    }
    w!(out, "next debug switches (cheapest first):");
    for s in &rep.next_switches {
        w!(out, "  - {}: {} (cost: {})", s.switch, s.why, s.cost);
    }
    std::mem::take(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata;

    #[test]
    fn human_leak_recorded_from_jax() {
        let r = testdata::trend("trend/jax_cpu_leak.jsonl");
        insta::assert_snapshot!(render_trend(&r, Format::Human, Style::new(false)));
    }

    #[test]
    fn human_clean_run_recorded_from_jax() {
        let r = testdata::trend("trend/jax_cpu_clean.jsonl");
        insta::assert_snapshot!(render_trend(&r, Format::Human, Style::new(false)));
    }

    #[test]
    fn human_series_posted_in_an_issue() {
        let r = testdata::trend("trend/jax_5927_memory_used_gb.log");
        insta::assert_snapshot!(render_trend(&r, Format::Human, Style::new(false)));
    }

    #[test]
    fn markdown_is_the_plain_text_and_json_the_contract() {
        let r = testdata::trend("trend/jax_cpu_leak.jsonl");
        let plain = render_trend(&r, Format::Human, Style::new(false));
        let coloured = render_trend(&r, Format::Human, Style::new(true));
        assert!(coloured.contains("\x1b[1;31mLEAK\x1b[0m"), "{coloured}");
        assert_eq!(render_trend(&r, Format::Markdown, Style::new(true)), plain);
        assert_eq!(
            render_trend(&r, Format::Json, Style::new(true)),
            serde_json::to_string_pretty(&r).expect("json") + "\n"
        );
    }
}
