//! `hbm-doctor top`'s terminal UI (ratatui): per device used / limit / peak / max seen, the
//! owning process, a sparkline of the last minutes, the trainer's RSS and recent events.
//!
//! A sampling thread owns the [`Monitor`] and sends each [`Snapshot`] over a channel; the UI
//! thread keeps its own history for the sparklines and redraws on every snapshot, key or resize.
//! The terminal is restored on exit, on Ctrl-C (a key in raw mode), on SIGINT/SIGTERM/SIGHUP
//! from outside, and on panic (ratatui's panic hook restores it before the message prints).

use crate::history::History;
use crate::host::rfc3339;
use crate::monitor::{Monitor, Snapshot};
use crate::sample::{DeviceKey, Event};
use ratatui::crossterm::event::{self, Event as TermEvent, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Sparkline, Table};
use ratatui::Frame;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// History spans the `+`/`-` keys cycle through, seconds.
const SPANS: [f64; 4] = [60.0, 300.0, 900.0, 1800.0];

/// What the UI shows, kept between snapshots.
pub struct TopState {
    last: Option<Snapshot>,
    history: BTreeMap<DeviceKey, History>,
    events: VecDeque<(f64, String)>,
    span: usize,
    interval: Duration,
    /// Notes about absent sources, shown while there are no devices.
    pub notes: Vec<String>,
}

/// Formats bytes as XLA prints them (`9.00G`, `4.0K`). Thin wrapper over
/// `hbm_doctor_units::format_size`, kept for existing callers.
pub fn fmt_bytes(b: u64) -> String {
    hbm_doctor_units::format_size(b)
}

fn opt_bytes(b: Option<u64>) -> String {
    b.map_or_else(|| "-".to_string(), fmt_bytes)
}

fn describe(e: &Event) -> String {
    match e {
        Event::SourceUp { source } => format!("{source} answering"),
        Event::SourceDown { source, reason } => format!("{source} stopped answering: {reason}"),
        Event::ProcessExit {
            pid,
            host_oom_killed: true,
            ..
        } => format!("process {pid} was killed by the kernel OOM killer: HOST RAM, not HBM"),
        Event::ProcessExit {
            pid,
            last_rss_bytes,
            ..
        } => format!(
            "process {pid} exited (last RSS {})",
            opt_bytes(*last_rss_bytes)
        ),
        Event::KernelOom { line, .. } => format!("kernel: {line}"),
        Event::RecordsLost { count, reason } => {
            format!("recording: {count} record(s) lost ({reason})")
        }
    }
}

impl TopState {
    /// An empty state for a given sampling interval.
    pub fn new(interval: Duration) -> Self {
        TopState {
            last: None,
            history: BTreeMap::new(),
            events: VecDeque::new(),
            span: 1,
            interval,
            notes: Vec::new(),
        }
    }

    /// Takes in a snapshot.
    pub fn update(&mut self, s: Snapshot) {
        for d in &s.new_samples {
            if let Some(u) = d.used_bytes {
                self.history
                    .entry(d.key())
                    .or_insert_with(|| History::new(SPANS[SPANS.len() - 1], 20_000))
                    .push(d.ts.unwrap_or(s.ts), u);
            }
        }
        for e in &s.events {
            self.events.push_back((s.ts, describe(e)));
            while self.events.len() > 50 {
                self.events.pop_front();
            }
        }
        self.last = Some(s);
    }

    /// Draws the whole screen.
    pub fn draw(&self, f: &mut Frame) {
        let area = f.area();
        let n = self.last.as_ref().map_or(0, |s| s.devices.len());
        let spark_rows = if n == 0 {
            0
        } else {
            ((area.height.saturating_sub(n as u16 + 10)) / n as u16).clamp(1, 4)
        };
        let [header, table, sparks, footer] = Layout::vertical([
            Constraint::Length(2),
            Constraint::Length(n as u16 + 3),
            Constraint::Length(spark_rows * n as u16 + 2),
            Constraint::Min(3),
        ])
        .areas(area);
        self.draw_header(f, header);
        match &self.last {
            Some(s) if !s.devices.is_empty() => {
                self.draw_table(f, table, s);
                self.draw_sparks(f, sparks, s, spark_rows);
            }
            _ => {
                let mut lines = vec![Line::from(if self.last.is_none() {
                    "sampling..."
                } else {
                    "no devices found"
                })
                .style(Style::new().add_modifier(Modifier::BOLD))];
                lines.extend(self.notes.iter().map(|n| Line::from(n.as_str())));
                f.render_widget(
                    Paragraph::new(lines)
                        .block(Block::default().borders(Borders::ALL).title(" devices ")),
                    table.union(sparks),
                );
            }
        }
        self.draw_footer(f, footer);
    }

    fn draw_header(&self, f: &mut Frame, area: Rect) {
        let (host, time) = self
            .last
            .as_ref()
            .map_or(("", String::new()), |s| (s.host.as_str(), rfc3339(s.ts)));
        let up: Vec<String> = self.last.as_ref().map_or(Vec::new(), |s| {
            s.sources
                .iter()
                .filter(|x| x.up)
                .map(|x| x.name.clone())
                .collect()
        });
        let l1 = Line::from(vec![
            Span::styled("hbm-doctor top", Style::new().add_modifier(Modifier::BOLD)),
            Span::raw(format!(
                "  {host}  {time}  every {:.1}s  history {}m",
                self.interval.as_secs_f64(),
                SPANS[self.span] as u64 / 60
            )),
        ]);
        let l2 = Line::from(format!(
            "sources: {}",
            if up.is_empty() {
                "none answering".to_string()
            } else {
                up.join(", ")
            }
        ))
        .style(Style::new().fg(Color::DarkGray));
        f.render_widget(Paragraph::new(vec![l1, l2]), area);
    }

    fn draw_table(&self, f: &mut Frame, area: Rect, s: &Snapshot) {
        let header = Row::new([
            "dev", "source", "kind", "used", "limit", "use", "peak", "max seen", "pid",
        ])
        .style(Style::new().add_modifier(Modifier::BOLD));
        let comm = s
            .process
            .as_ref()
            .and_then(|p| p.comm.clone().map(|c| (p.pid, c)));
        let rows = s.devices.iter().map(|d| {
            let x = &d.sample;
            let frac = match (x.used_bytes, x.limit_bytes) {
                (Some(u), Some(l)) if l > 0 => Some(u as f64 / l as f64),
                _ => None,
            };
            let bar = frac.map_or_else(String::new, |fr| {
                let w = 10usize;
                let full = ((fr.clamp(0.0, 1.0)) * w as f64).round() as usize;
                format!(
                    "{}{} {:>3.0}%",
                    "█".repeat(full),
                    "░".repeat(w - full),
                    fr * 100.0
                )
            });
            let color = match frac {
                Some(fr) if fr >= 0.95 => Color::Red,
                Some(fr) if fr >= 0.80 => Color::Yellow,
                _ => Color::Green,
            };
            let pid = match (x.pid, &comm) {
                (Some(p), Some((cp, c))) if p == *cp => format!("{p} {c}"),
                (Some(p), _) => p.to_string(),
                _ => "-".to_string(),
            };
            Row::new(vec![
                Cell::from(x.id.clone()),
                Cell::from(x.source.as_str()),
                Cell::from(x.kind.clone().unwrap_or_default()),
                Cell::from(opt_bytes(x.used_bytes)),
                Cell::from(opt_bytes(x.limit_bytes)),
                Cell::from(bar).style(Style::new().fg(color)),
                Cell::from(opt_bytes(x.peak_bytes)),
                Cell::from(opt_bytes(d.max_seen_bytes)),
                Cell::from(pid),
            ])
        });
        let widths = [
            Constraint::Length(6),
            Constraint::Length(9),
            Constraint::Length(14),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(16),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Min(6),
        ];
        f.render_widget(
            Table::new(rows, widths)
                .header(header)
                .block(Block::default().borders(Borders::ALL).title(" devices ")),
            area,
        );
    }

    fn draw_sparks(&self, f: &mut Frame, area: Rect, s: &Snapshot, rows: u16) {
        let span = SPANS[self.span];
        let block = Block::default().borders(Borders::ALL).title(format!(
            " used, last {} min (scale: limit) ",
            span as u64 / 60
        ));
        let inner = block.inner(area);
        f.render_widget(block, area);
        let parts = Layout::vertical(vec![Constraint::Length(rows); s.devices.len()]).split(inner);
        for (d, r) in s.devices.iter().zip(parts.iter()) {
            let [label, graph] =
                Layout::horizontal([Constraint::Length(8), Constraint::Min(1)]).areas(*r);
            f.render_widget(Paragraph::new(format!("{:>6} ", d.sample.id)), label);
            let Some(h) = self.history.get(&d.sample.key()) else {
                continue;
            };
            let data = h.buckets(s.ts, span, graph.width as usize);
            let max = d.sample.limit_bytes.unwrap_or_else(|| h.max_seen.max(1));
            f.render_widget(
                Sparkline::default()
                    .data(data)
                    .max(max)
                    .style(Style::new().fg(Color::Cyan)),
                graph,
            );
        }
    }

    fn draw_footer(&self, f: &mut Frame, area: Rect) {
        let mut lines = Vec::new();
        if let Some(s) = &self.last {
            if let Some(p) = &s.process {
                lines.push(Line::from(format!(
                    "process {} {}: RSS {} (peak {}){}",
                    p.pid,
                    p.comm.clone().unwrap_or_default(),
                    opt_bytes(p.rss_bytes),
                    opt_bytes(p.rss_peak_bytes),
                    if p.alive { "" } else { "  EXITED" }
                )));
            }
            for d in &s.devices {
                if let Some(w) = d.trend.as_ref().and_then(|t| t.warning.as_ref()) {
                    lines.push(
                        Line::from(format!("device {}: {w}", d.sample.id))
                            .style(Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)),
                    );
                }
            }
            for c in &s.counters {
                lines.push(Line::from(format!(
                    "torch_xla step {}: uncached compiles {}, live data handles {}",
                    c.step.map_or("-".into(), |v| v.to_string()),
                    c.uncached_compiles.map_or("-".into(), |v| v.to_string()),
                    c.live_data_handles.map_or("-".into(), |v| v.to_string())
                )));
            }
        }
        let room = (area.height as usize).saturating_sub(lines.len() + 2);
        for (ts, e) in self
            .events
            .iter()
            .rev()
            .take(room)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            lines.push(
                Line::from(format!("{} {e}", &rfc3339(*ts)[11..19]))
                    .style(Style::new().fg(Color::DarkGray)),
            );
        }
        let title = " q quit  +/- history span ";
        f.render_widget(
            Paragraph::new(lines).block(Block::default().borders(Borders::TOP).title(title)),
            area,
        );
    }
}

/// Registers SIGINT, SIGTERM and SIGHUP to set the returned flag instead of killing the process.
pub fn stop_flag() -> std::io::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, Arc::clone(&flag))?;
    }
    Ok(flag)
}

/// Runs the UI until `q`, Ctrl-C or a signal.
pub fn run(mut monitor: Monitor, interval: Duration) -> anyhow::Result<()> {
    let stop = stop_flag()?;
    let mut state = TopState::new(interval);
    state.notes = monitor.notes.clone();
    let (tx, rx) = mpsc::channel::<(Snapshot, Vec<String>)>();
    let sampler_stop = Arc::clone(&stop);
    let sampler = std::thread::spawn(move || {
        while !sampler_stop.load(Ordering::Relaxed) {
            let start = std::time::Instant::now();
            let s = monitor.sample();
            let notes = if s.devices.is_empty() {
                monitor.absent_summary()
            } else {
                Vec::new()
            };
            if tx.send((s, notes)).is_err() {
                break;
            }
            let mut left = interval.saturating_sub(start.elapsed());
            while !left.is_zero() && !sampler_stop.load(Ordering::Relaxed) {
                let step = left.min(Duration::from_millis(50));
                std::thread::sleep(step);
                left -= step;
            }
        }
    });
    let mut terminal = ratatui::try_init()?;
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = spawn_watchdog(Arc::clone(&stop), Arc::clone(&done));
    let result = (|| -> anyhow::Result<()> {
        loop {
            while let Ok((s, notes)) = rx.try_recv() {
                if !notes.is_empty() {
                    state.notes = notes;
                }
                state.update(s);
            }
            terminal.draw(|f| state.draw(f))?;
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            if event::poll(Duration::from_millis(100))? {
                if let TermEvent::Key(k) = event::read()? {
                    if k.kind != KeyEventKind::Press {
                        continue;
                    }
                    match k.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                            return Ok(())
                        }
                        KeyCode::Char('+') | KeyCode::Right => {
                            state.span = (state.span + 1).min(SPANS.len() - 1)
                        }
                        KeyCode::Char('-') | KeyCode::Left => {
                            state.span = state.span.saturating_sub(1)
                        }
                        _ => {}
                    }
                }
            }
        }
    })();
    if !terminal_gone() {
        ratatui::restore();
    }
    stop.store(true, Ordering::Relaxed);
    done.store(true, Ordering::Relaxed);
    drop(rx);
    let _ = sampler.join();
    let _ = watchdog.join();
    result
}

/// Whether the terminal has hung up (the SSH session dropped, the tmux pane was killed): the
/// kernel then fails every terminal ioctl on it, so it no longer reads as a terminal.
fn terminal_gone() -> bool {
    use std::io::IsTerminal;
    !std::io::stdin().is_terminal() || !std::io::stdout().is_terminal()
}

/// Watches for a hung-up terminal and for a stop request the UI thread does not honour in time
/// (a terminal library spinning on a dead tty): it then restores what it can and exits, so `top`
/// never outlives its terminal or ignores SIGTERM.
fn spawn_watchdog(stop: Arc<AtomicBool>, done: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut since: Option<std::time::Instant> = None;
        while !done.load(Ordering::Relaxed) {
            if terminal_gone() {
                stop.store(true, Ordering::Relaxed);
            }
            if stop.load(Ordering::Relaxed) {
                let t = *since.get_or_insert_with(std::time::Instant::now);
                let grace = if terminal_gone() { 300 } else { 1500 };
                if t.elapsed() > Duration::from_millis(grace) {
                    // A dead terminal has nothing to restore (and writing to it fails).
                    if !terminal_gone() {
                        ratatui::restore();
                    }
                    std::process::exit(0);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::{DeviceView, SourceStatus};
    use crate::sample::{DeviceSample, SourceKind};
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    #[test]
    fn draws_devices_and_sparklines() {
        let mut state = TopState::new(Duration::from_secs(1));
        for i in 0..30u64 {
            let mut d = DeviceSample::new("0", "tpu", SourceKind::Libtpu);
            d.used_bytes = Some((8 + i % 4) << 30);
            d.limit_bytes = Some(16 << 30);
            d.kind = Some("TPU v5 lite".into());
            d.pid = Some(4242);
            d.ts = Some(1000.0 + i as f64);
            state.update(Snapshot {
                ts: 1000.0 + i as f64,
                host: "vm-0".into(),
                devices: vec![DeviceView {
                    sample: d.clone(),
                    max_seen_bytes: Some(11 << 30),
                    floor_bytes: None,
                    ceiling_bytes: None,
                    last_ts: 0.0,
                    trend: None,
                }],
                new_samples: vec![d],
                process: None,
                counters: vec![],
                events: if i == 0 {
                    vec![Event::SourceUp {
                        source: "libtpu 127.0.0.1:8431".into(),
                    }]
                } else {
                    vec![]
                },
                sources: vec![SourceStatus {
                    name: "libtpu 127.0.0.1:8431".into(),
                    up: true,
                    message: None,
                    samples_total: i,
                    errors_total: 0,
                    kind: Some("libtpu"),
                }],
            });
        }
        let mut t = Terminal::new(TestBackend::new(100, 24)).unwrap();
        t.draw(|f| state.draw(f)).unwrap();
        let text: String = t
            .backend()
            .buffer()
            .content()
            .iter()
            .map(|c| c.symbol())
            .collect();
        assert!(text.contains("TPU v5 lite"), "{text}");
        assert!(text.contains("9.00G") || text.contains("11.00G"), "{text}");
        assert!(text.contains("16.00G"));
        assert!(text.contains("libtpu 127.0.0.1:8431 answering"));
        assert!(text.contains('█'));
    }
}
