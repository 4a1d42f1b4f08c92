//! The [`Monitor`]: polls every configured [`Source`] once per round, keeps per-device history,
//! watches the trainer process and the kernel log, and produces a [`Snapshot`].

use crate::history::History;
use crate::host::{self, KernelLog};
use crate::sample::{DeviceKey, DeviceSample, Event, ProcessSample, Reading, XlaCounters};
use crate::source::{Source, SourceError};
use crate::trend::{NoTrend, TrendHook, TrendView};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// How history and aggregates are kept.
const HISTORY_SECONDS: f64 = 30.0 * 60.0;
const HISTORY_POINTS: usize = 20_000;
/// The window of `floor`/`ceiling`.
pub const FLOOR_WINDOW_SECONDS: f64 = 300.0;

/// Which sources a monitor uses.
#[derive(Debug, Clone, Default)]
pub struct MonitorConfig {
    /// The trainer: its RSS is recorded, and its environment names ports and files.
    pub pid: Option<u32>,
    /// libtpu ports; `None` means from the trainer's or our `TPU_RUNTIME_METRICS_PORTS`, else
    /// 8431–8438.
    pub ports: Option<Vec<u16>>,
    /// Address of the libtpu service (default 127.0.0.1).
    pub libtpu_host: Option<String>,
    /// Do not poll libtpu.
    pub no_libtpu: bool,
    /// Do not load NVML.
    pub no_nvml: bool,
    /// The in-process hook's file (else the trainer's `HBM_DOCTOR_SAMPLES`).
    pub samples: Option<PathBuf>,
    /// PyTorch/XLA's metrics file (else the trainer's `XLA_METRICS_FILE`).
    pub metrics_file: Option<PathBuf>,
    /// Read OOM-killer lines from `/dev/kmsg`.
    pub kernel_log: bool,
}

/// The state of one source as the monitor sees it.
#[derive(Debug, Clone)]
pub struct SourceStatus {
    /// Its name.
    pub name: String,
    /// Answered on the last round.
    pub up: bool,
    /// What it said when it did not.
    pub message: Option<String>,
    /// Device samples it produced.
    pub samples_total: u64,
    /// Rounds on which it failed (absence is not a failure).
    pub errors_total: u64,
    /// The label value for the exporter (`libtpu`, `nvml`, `jax`...): the last sample's source.
    pub kind: Option<&'static str>,
}

struct Slot {
    source: Box<dyn Source>,
    status: SourceStatus,
    ever_up: bool,
}

/// One device as shown: its last sample and what history adds.
#[derive(Debug, Clone)]
pub struct DeviceView {
    /// The last sample.
    pub sample: DeviceSample,
    /// The largest used figure seen since the monitor started.
    pub max_seen_bytes: Option<u64>,
    /// Min of used over the last [`FLOOR_WINDOW_SECONDS`].
    pub floor_bytes: Option<u64>,
    /// Max of used over the last [`FLOOR_WINDOW_SECONDS`].
    pub ceiling_bytes: Option<u64>,
    /// Unix time of the last sample.
    pub last_ts: f64,
    /// The leak detector's view.
    pub trend: Option<TrendView>,
}

/// One round's result.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Unix time of the round.
    pub ts: f64,
    /// Host name.
    pub host: String,
    /// Every device currently known, sorted by source, endpoint, id.
    pub devices: Vec<DeviceView>,
    /// Samples taken this round (for recording; a file source may add several per device).
    pub new_samples: Vec<DeviceSample>,
    /// The trainer process, when one is watched.
    pub process: Option<ProcessSample>,
    /// PyTorch/XLA counters read this round.
    pub counters: Vec<XlaCounters>,
    /// Events of this round.
    pub events: Vec<Event>,
    /// Every source's state.
    pub sources: Vec<SourceStatus>,
}

/// Polls sources and keeps history.
pub struct Monitor {
    slots: Vec<Slot>,
    host: String,
    pid: Option<u32>,
    exit_reported: bool,
    kernel: Option<KernelLog>,
    kernel_ooms: Vec<Option<u32>>,
    latest: BTreeMap<DeviceKey, (usize, DeviceSample, f64)>,
    history: BTreeMap<DeviceKey, History>,
    trend: Box<dyn TrendHook>,
    /// Notes for the user about sources that are not there (said once, at start).
    pub notes: Vec<String>,
    last_rss: Option<u64>,
}

impl Monitor {
    /// Tells every source what a previous run of the recorder already wrote (see
    /// [`Source::resume_after`]).
    pub fn resume_after(&mut self, last: &std::collections::HashMap<String, f64>) {
        for s in &mut self.slots {
            s.source.resume_after(last);
        }
    }

    /// A monitor over explicit sources.
    pub fn new(sources: Vec<Box<dyn Source>>, pid: Option<u32>) -> Self {
        let slots = sources
            .into_iter()
            .map(|source| {
                let name = source.name();
                Slot {
                    source,
                    status: SourceStatus {
                        name,
                        up: false,
                        message: None,
                        samples_total: 0,
                        errors_total: 0,
                        kind: None,
                    },
                    ever_up: false,
                }
            })
            .collect();
        Monitor {
            slots,
            host: host::hostname(),
            pid,
            exit_reported: false,
            kernel: None,
            kernel_ooms: Vec::new(),
            latest: BTreeMap::new(),
            history: BTreeMap::new(),
            trend: Box::new(NoTrend),
            notes: Vec::new(),
            last_rss: None,
        }
    }

    /// Builds the sources a configuration asks for; sources that cannot exist here (no NVML
    /// library) become notes.
    pub fn from_config(cfg: &MonitorConfig) -> anyhow::Result<Self> {
        let env = cfg.pid.map(host::process_env).unwrap_or_default();
        let mut sources: Vec<Box<dyn Source>> = Vec::new();
        let mut notes = Vec::new();
        if let Some(pid) = cfg.pid {
            if !host::alive(pid) {
                anyhow::bail!("no process with pid {pid} (check `--pid`)");
            }
            if env.is_empty() {
                notes.push(format!("cannot read /proc/{pid}/environ (run as the trainer's user or root): using default ports and files"));
            }
        }
        #[cfg(feature = "libtpu")]
        if !cfg.no_libtpu {
            let ports = cfg
                .ports
                .clone()
                .or_else(|| {
                    env.get("TPU_RUNTIME_METRICS_PORTS")
                        .map(|p| host::parse_ports(p))
                })
                .or_else(|| {
                    std::env::var("TPU_RUNTIME_METRICS_PORTS")
                        .ok()
                        .map(|p| host::parse_ports(&p))
                })
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| crate::libtpu::DEFAULT_PORTS.collect());
            let rt = crate::libtpu::runtime()?;
            let addr = cfg
                .libtpu_host
                .clone()
                .unwrap_or_else(|| "127.0.0.1".to_string());
            for port in ports {
                let mut s = crate::libtpu::LibtpuSource::with_host(rt.clone(), &addr, port);
                s.fallback_pid = cfg.pid;
                sources.push(Box::new(s));
            }
        }
        #[cfg(feature = "nvml")]
        if !cfg.no_nvml {
            match crate::nvml::NvmlSource::open() {
                Ok(mut s) => {
                    s.pid = cfg.pid;
                    sources.push(Box::new(s));
                }
                Err(e) => notes.push(e.message),
            }
        }
        let samples = cfg
            .samples
            .clone()
            .or_else(|| env.get(crate::inprocess::SAMPLES_ENV).map(PathBuf::from));
        if let Some(path) = samples {
            sources.push(Box::new(crate::inprocess::InProcessSource::new(path)));
        }
        let metrics = cfg.metrics_file.clone().or_else(|| {
            env.get("XLA_METRICS_FILE")
                .filter(|v| !matches!(v.as_str(), "STDERR" | "STDOUT"))
                .map(PathBuf::from)
        });
        if let Some(path) = metrics {
            sources.push(Box::new(crate::metrics_file::MetricsFileSource::new(path)));
        }
        let mut m = Monitor::new(sources, cfg.pid);
        if cfg.kernel_log {
            let k = KernelLog::open();
            if let Some(why) = &k.unreadable {
                notes.push(format!("kernel log not readable ({why}): host-RAM OOM kills are checked with dmesg when the process exits"));
            }
            m.kernel = Some(k);
        }
        m.notes = notes;
        Ok(m)
    }

    /// Replaces the leak detector.
    pub fn set_trend_hook(&mut self, hook: Box<dyn TrendHook>) {
        self.trend = hook;
    }

    /// The host name used in snapshots.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The configured sources' names.
    pub fn source_names(&self) -> Vec<String> {
        self.slots.iter().map(|s| s.status.name.clone()).collect()
    }

    /// The history of a device.
    pub fn history(&self, key: &DeviceKey) -> Option<&History> {
        self.history.get(key)
    }

    /// Polls every source once.
    pub fn sample(&mut self) -> Snapshot {
        let ts = host::now();
        let mut events = Vec::new();
        let mut new_samples = Vec::new();
        let mut counters = Vec::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let mut reading = Reading::default();
            match slot.source.poll(&mut reading) {
                Ok(()) => {
                    if !slot.status.up {
                        events.push(Event::SourceUp {
                            source: slot.status.name.clone(),
                        });
                    }
                    slot.status.up = true;
                    slot.ever_up = true;
                    slot.status.message = None;
                    slot.status.samples_total += reading.devices.len() as u64;
                    if let Some(d) = reading.devices.last() {
                        slot.status.kind = Some(d.source.as_str());
                    }
                    for mut d in reading.devices {
                        let t = d.ts.unwrap_or(ts);
                        d.ts = Some(t);
                        let key = d.key();
                        if let Some(used) = d.used_bytes {
                            self.history
                                .entry(key.clone())
                                .or_insert_with(|| History::new(HISTORY_SECONDS, HISTORY_POINTS))
                                .push(t, used);
                            self.trend.observe(&key, t, used, d.limit_bytes, d.step);
                        }
                        self.latest.insert(key, (i, d.clone(), t));
                        new_samples.push(d);
                    }
                    counters.extend(reading.counters);
                    events.extend(reading.events);
                }
                Err(SourceError { message, absent }) => {
                    if slot.status.up {
                        events.push(Event::SourceDown {
                            source: slot.status.name.clone(),
                            reason: message.clone(),
                        });
                    }
                    if !absent {
                        slot.status.errors_total += 1;
                    }
                    slot.status.up = false;
                    slot.status.message = Some(message);
                    // A source that went away takes its devices with it (a file source keeps
                    // its last figures: the hook writes only every N steps).
                    self.latest.retain(|_, (s, d, _)| {
                        *s != i
                            || d.source == crate::sample::SourceKind::Jax
                            || d.source == crate::sample::SourceKind::TorchXla
                    });
                }
            }
        }
        if let Some(k) = self.kernel.as_mut() {
            for e in k.poll() {
                if let Event::KernelOom { pid, .. } = &e {
                    self.kernel_ooms.push(*pid);
                }
                events.push(e);
            }
        }
        let process = self.pid.map(|pid| {
            let p = host::process_sample(pid);
            if p.alive {
                self.last_rss = p.rss_bytes.or(self.last_rss);
            } else if !self.exit_reported {
                self.exit_reported = true;
                let killed = self.kernel_ooms.contains(&Some(pid))
                    || host::dmesg_killed(pid).unwrap_or(false);
                events.push(Event::ProcessExit {
                    pid,
                    host_oom_killed: killed,
                    last_rss_bytes: self.last_rss,
                });
            }
            p
        });
        let devices = self
            .latest
            .iter()
            .map(|(key, (_, d, t))| {
                let h = self.history.get(key);
                let fc = h.and_then(|h| h.floor_ceiling(ts.max(*t), FLOOR_WINDOW_SECONDS));
                DeviceView {
                    sample: d.clone(),
                    max_seen_bytes: h.map(|h| h.max_seen),
                    floor_bytes: fc.map(|f| f.0),
                    ceiling_bytes: fc.map(|f| f.1),
                    last_ts: *t,
                    trend: self.trend.view(key),
                }
            })
            .collect();
        Snapshot {
            ts,
            host: self.host.clone(),
            devices,
            new_samples,
            process,
            counters,
            events,
            sources: self.slots.iter().map(|s| s.status.clone()).collect(),
        }
    }

    /// Whether the watched process has exited.
    pub fn process_exited(&self) -> bool {
        self.exit_reported
    }

    /// One line per source that has never answered, for "no devices" messages.
    pub fn absent_summary(&self) -> Vec<String> {
        let mut lines: Vec<String> = Vec::new();
        let mut libtpu_ports = Vec::new();
        for s in self.slots.iter().filter(|s| !s.ever_up) {
            if s.status.name.starts_with("libtpu ") {
                libtpu_ports.push(s.status.name.trim_start_matches("libtpu ").to_string());
            } else if let Some(m) = &s.status.message {
                lines.push(m.clone());
            }
        }
        if libtpu_ports.len() > 2 {
            // 127.0.0.1:8431 … 127.0.0.1:8438 -> 127.0.0.1:8431-8438 when contiguous.
            let ports: Vec<(String, u16)> = libtpu_ports
                .iter()
                .filter_map(|e| {
                    e.rsplit_once(':')
                        .and_then(|(h, p)| Some((h.to_string(), p.parse().ok()?)))
                })
                .collect();
            let contiguous = ports.len() == libtpu_ports.len()
                && ports
                    .windows(2)
                    .all(|w| w[0].0 == w[1].0 && w[1].1 == w[0].1 + 1);
            if let (true, Some(first), Some(last)) = (contiguous, ports.first(), ports.last()) {
                libtpu_ports = vec![format!("{}:{}-{}", first.0, first.1, last.1)];
            }
        }
        if !libtpu_ports.is_empty() {
            lines.insert(
                0,
                format!(
                    "libtpu: nothing answering on {} (is a JAX/PyTorch-XLA program using the TPU? set TPU_RUNTIME_METRICS_PORTS or pass --ports/--pid)",
                    libtpu_ports.join(", ")
                ),
            );
        }
        lines.extend(self.notes.iter().cloned());
        lines
    }
}
