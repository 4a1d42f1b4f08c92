//! Streaming readers. [`Reader::feed`] takes chunks of any size; lines are cut at `\n` and each is
//! classified on its own (plus the small state of CSV headers and PyTorch/XLA metrics blocks), so
//! formats may even be mixed in one file. Everything read goes into a [`Collected`], whose state
//! is bounded (see `store.rs`): a 10 GB log takes the same memory as a 10 MB one.
//!
//! Formats (docs/trend.md has the full pattern set):
//! - hbm-doctor recordings (`{"type":"sample"...}` JSON lines, docs/recording.md), including the
//!   in-process sampler's file;
//! - CSV per contract.md (`step`/`time`, `bytes_in_use`/`used_bytes`, `device`, `host`,
//!   `bytes_limit`/`limit_bytes`, `peak_bytes_in_use`) and TensorBoard scalar CSV
//!   (`Wall time,Step,Value`) and JSON (`[[wall, step, value], ...]`) exports;
//! - PyTorch/XLA `XLA_METRICS_FILE` (`[MetricsData; step=N]` + report) and metrics reports
//!   printed in logs; logged `get_memory_info()` dicts (all three shapes);
//! - JAX `memory_stats()` dicts (one device, or `{id: stats}` for several);
//! - training-log lines with a memory figure (`hbm`, `memory`, `mem_used`, `bytes_in_use`...), a
//!   step, a leading timestamp, host RSS, and markers (eval, checkpoint, compilation, OOM
//!   messages, the kernel OOM killer).

use crate::detect::{Marker, MarkerKind};
use crate::recording::{Event, Record, SourceKind};
use crate::store::{Sample, Series};
use regex::Regex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::OnceLock;

/// Longest line kept; the rest of a longer line is skipped.
pub const MAX_LINE: usize = 1 << 20;
/// Markers kept (the most recent).
pub const MAX_MARKERS: usize = 4096;
/// Counter points kept per host (decimated beyond).
pub const MAX_COUNTERS: usize = 2048;

/// Which framework the input comes from, when it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Framework {
    /// JAX.
    Jax,
    /// PyTorch/XLA.
    PytorchXla,
}

/// How the run ended, as far as the input says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Ending {
    /// Not known (a recording still being written, a CSV).
    #[default]
    Unknown,
    /// The log stops with no message.
    Silent,
    /// An out-of-memory message from the framework.
    OomMessage,
    /// The kernel's OOM killer (host RAM).
    HostOom,
    /// Another error or traceback.
    Error,
    /// A normal end.
    Completed,
}

impl Ending {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Ending::Unknown => "unknown",
            Ending::Silent => "silent",
            Ending::OomMessage => "oom_message",
            Ending::HostOom => "host_oom",
            Ending::Error => "error",
            Ending::Completed => "completed",
        }
    }
}

/// PyTorch/XLA counters at one step (cumulative, as the report prints them).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CounterPoint {
    /// Step.
    pub step: Option<u64>,
    /// Ordinal of the report in the input.
    pub ordinal: u64,
    /// `UncachedCompile`.
    pub uncached_compiles: Option<u64>,
    /// `CompileTime` accumulator, seconds.
    pub compile_seconds: Option<f64>,
    /// `CreateDataHandles − DestroyDataHandles` (or the recording's `live_data_handles`).
    pub live_data_handles: Option<i64>,
    /// `CreateXlaTensor − DestroyXlaTensor`.
    pub live_xla_tensors: Option<i64>,
    /// `TransferToDeviceTime` samples.
    pub transfers_to_device: Option<u64>,
    /// `InboundData` accumulator, bytes.
    pub inbound_bytes: Option<f64>,
}

/// One device series and what is known about it.
#[derive(Debug, Clone, Default)]
pub struct DeviceSeries {
    /// The samples.
    pub series: Series,
    /// `libtpu`, `jax`, `torch_xla`, `csv`, `log`...
    pub source: Option<String>,
}

/// Per-host facts.
#[derive(Debug, Clone, Default)]
pub struct HostInfo {
    /// Host RSS of the trainer (recording `process` lines, log `rss` figures).
    pub rss: Series,
    /// PyTorch/XLA counters.
    pub counters: Vec<CounterPoint>,
    counters_stride: u64,
    counters_seen: u64,
    /// How the run ended.
    pub ending: Ending,
    /// The line that says the kernel killed the trainer.
    pub host_oom_evidence: Option<String>,
    /// Compilations seen in the log after the first 50 steps.
    pub late_compiles: u64,
    /// `Number of Graph Inputs` of successive compilations (first and last kept).
    pub graph_inputs: Option<(u64, u64, u64)>,
    /// `pt-xla-profiler: CompileTime too frequent` lines.
    pub compile_too_frequent: u64,
}

impl HostInfo {
    fn push_counter(&mut self, c: CounterPoint) {
        self.counters_seen += 1;
        let stride = self.counters_stride.max(1);
        if self.counters_seen % stride != 0 && !self.counters.is_empty() {
            // Keep the newest in the last slot so the end of the run is exact.
            if self.counters.len() > 1 {
                if let Some(last) = self.counters.last_mut() {
                    *last = c;
                    return;
                }
            }
        }
        self.counters.push(c);
        if self.counters.len() > MAX_COUNTERS {
            let kept: Vec<CounterPoint> = self.counters.iter().step_by(2).copied().collect();
            self.counters = kept;
            self.counters_stride = stride * 2;
        }
    }
}

/// Everything read from the inputs.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    /// Device series by (host, device).
    pub devices: BTreeMap<(String, String), DeviceSeries>,
    /// Per host.
    pub hosts: BTreeMap<String, HostInfo>,
    /// Eval/checkpoint/compilation markers (most recent [`MAX_MARKERS`]).
    pub markers: VecDeque<Marker>,
    /// The framework, when the input says.
    pub framework: Option<Framework>,
    /// Lines read.
    pub lines: u64,
    /// Lines skipped as too long or unreadable JSON.
    pub skipped_lines: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Inputs that cannot be judged (a memory column with no valid value): exit 2.
    pub errors: Vec<String>,
}

/// No device holds this much memory (1 PiB): a larger value is a bad value.
pub const MAX_DEVICE_BYTES: f64 = (1u64 << 50) as f64;

/// Whether `v` bytes is a value a device can hold: finite, not negative, at most
/// [`MAX_DEVICE_BYTES`] and, when the limit is known, at most 4 times the limit.
pub fn valid_bytes(v: f64, limit: Option<f64>) -> bool {
    v.is_finite()
        && (0.0..=MAX_DEVICE_BYTES).contains(&v)
        && limit.is_none_or(|l| !(l.is_finite() && l > 0.0) || v <= 4.0 * l)
}

impl Collected {
    fn device(&mut self, host: &str, dev: &str, source: &str) -> &mut DeviceSeries {
        let n = self.devices.len().max(1);
        let d = self
            .devices
            .entry((host.to_string(), dev.to_string()))
            .or_insert_with(|| DeviceSeries {
                series: Series::buffered(),
                source: None,
            });
        d.series.raw_cap =
            (crate::store::MAX_HELD / n).clamp(crate::store::MIN_RAW_CAP, crate::store::RAW_CAP);
        if d.source.is_none() {
            d.source = Some(source.to_string());
        }
        d
    }

    fn host(&mut self, host: &str) -> &mut HostInfo {
        self.hosts.entry(host.to_string()).or_default()
    }

    /// Device samples read so far, all series together.
    fn device_samples(&self) -> u64 {
        self.devices.values().map(|d| d.series.total_samples).sum()
    }

    fn marker(&mut self, m: Marker) {
        if self.markers.len() == MAX_MARKERS {
            self.markers.pop_front();
        }
        self.markers.push_back(m);
    }

    /// Retained elements (windows, markers, counters), for tests of bounded memory.
    pub fn retained(&self) -> usize {
        self.devices
            .values()
            .map(|d| d.series.retained_windows())
            .sum::<usize>()
            + self
                .hosts
                .values()
                .map(|h| h.rss.retained_windows() + h.counters.capacity())
                .sum::<usize>()
            + self.markers.len()
    }
}

#[derive(Debug, Clone)]
struct Csv {
    step: Option<usize>,
    time: Option<usize>,
    used: usize,
    device: Option<usize>,
    host: Option<usize>,
    limit: Option<usize>,
    peak: Option<usize>,
    pid: Option<usize>,
    /// TensorBoard: values in a unit from the file name; nvidia-smi: the header's unit.
    scale: f64,
    /// The limit's unit (nvidia-smi's `memory.total [MiB]`), else bytes.
    limit_scale: f64,
    /// `tensorboard` for a scalar export, else `csv`.
    source: &'static str,
    cols: usize,
}

#[derive(Debug, Clone, Default)]
struct Block {
    name: String,
    counter: bool,
}

/// A streaming reader of one input.
#[derive(Debug)]
pub struct Reader {
    host: String,
    name_hint: String,
    pending: Vec<u8>,
    overlong: bool,
    csv: Option<Csv>,
    step: Option<u64>,
    ts: Option<f64>,
    ordinal: u64,
    metrics: Option<CounterPoint>,
    metrics_raw: BTreeMap<String, f64>,
    block: Option<Block>,
    tb_json: Option<TbJson>,
    first_byte_seen: bool,
    tail: VecDeque<Ending>,
    any_log_line: bool,
    recording: bool,
    csv_valid: u64,
    csv_invalid: u64,
    pid: Option<u64>,
    /// nvidia-smi's table: the GPU of the row above (`|   0  NVIDIA H100 ... | 00000000:18:00.0 |`).
    smi_gpu: Option<String>,
    /// Lines that are only numbers (`4194`, `12 4194`, `7.07 GB`): read as a series only when the
    /// input gives no other reading ([`Reader::finish`]).
    bare: Bare,
    /// The second and later value columns of lines of bare numbers (`2491.67 21.20`).
    bare_cols: Vec<Bare>,
    /// Lines of several bare numbers read by [`Reader::bare_columns`], and the numbers of the
    /// last one, its first cell included: one such line alone is a run of readings posted in a
    /// row (`0.34 0.57 0.79 1.02 ...`), not as many series of one reading.
    bare_lines: u64,
    bare_run: Vec<f64>,
    /// A markdown table's header: each column's unit, when the header names one (`| step | max
    /// current (GB) | % cap |`), and whether its first column counts steps.
    md_units: Vec<Option<f64>>,
    md_keys: Vec<String>,
    md_step: bool,
    /// Device samples in the collection before this input (to tell whether it gave any).
    samples_before: Option<u64>,
    /// The key of each device's first memory reading in a log (`memory_allocated`, `hbm`...).
    mem_keys: Vec<((String, String), String)>,
    /// Readings printed without a unit, by (host, device): their unit is decided at the end.
    unitless: BTreeMap<(String, String), Bare>,
    /// A step key (`step`, `iter`...) was seen: `epoch N` no longer counts as the step.
    step_key_seen: bool,
    /// Sizes under a key no pattern knows (`mbiu: 255 MB, bui: 1 MB`, `14 MB currently in use`),
    /// by key in the order first seen: read as series only when the input gives no other
    /// reading ([`Reader::finish`]).
    keyed: Vec<(String, Bare)>,
    /// Sizes told in sentences about memory (`the used memory is about 4.8GB ... up to 9.2GB`,
    /// `~6.0 → 6.57 GiB over a 12h run`), in the order told: one series, read only when nothing
    /// else is ([`Reader::hold_prose`]).
    prose: Bare,
    /// `ps` / `top` output: the columns of the PID and of the resident memory (`RSS` in KiB,
    /// `RES` in KiB unless suffixed), from the last header line.
    ps_cols: Option<(usize, usize)>,
}

/// One line of bare numbers: (first column, value, unit printed on the line, time).
type BareRow = (Option<u64>, f64, Option<f64>, Option<f64>);

/// Readings from lines that hold nothing but numbers.
#[derive(Debug, Default)]
struct Bare {
    rows: Vec<BareRow>,
    /// Every `stride`-th row kept (the list halves past [`BARE_CAP`]).
    stride: u64,
    seen: u64,
}

/// Keys held by [`Reader::hold_keyed`] at most.
const MAX_KEYED: usize = 64;

/// Rows of bare numbers held before they are thinned (a log of only numbers is rarely this long).
const BARE_CAP: usize = 1 << 20;

impl Bare {
    fn push(&mut self, row: BareRow) {
        self.seen += 1;
        let stride = self.stride.max(1);
        if self.seen % stride != 0 {
            return;
        }
        self.rows.push(row);
        if self.rows.len() >= BARE_CAP {
            let kept = self.rows.iter().step_by(2).copied().collect();
            self.rows = kept;
            self.stride = stride * 2;
        }
    }
}

#[derive(Debug, Default)]
struct TbJson {
    depth: u32,
    num: String,
    vals: Vec<f64>,
}

struct Patterns {
    /// Training frameworks' own memory lines: (pattern whose group 1 is the number, group 2 the
    /// unit when printed, the unit when not).
    framework_mem: Vec<(Regex, &'static str)>,
    mm_epoch: Regex,
    smi_gpu: Regex,
    smi_mem: Regex,
    ctime: Regex,
    step: Regex,
    time: Regex,
    dict: Regex,
    kv: Regex,
    dev_in_prefix: Regex,
    dev_in_line: Regex,
    host_in_line: Regex,
    mem: Regex,
    rss: Regex,
    eval: Regex,
    ckpt: Regex,
    compile: Regex,
    oom: Regex,
    host_oom: Regex,
    error: Regex,
    done: Regex,
    graph_inputs: Regex,
    metrics_step: Regex,
    glog: Regex,
    /// `Epoch 3`, `Epoch [3 / 100]`, `Epoch 3 of 500`, `Epoch 3/10`: the step of logs that count
    /// only epochs.
    epoch: Regex,
    /// `3149MiB / 16384MiB`: used and total, nvidia-smi's memory cell.
    used_of_total: Regex,
    /// A line of one number, optionally with a unit (`4194`, `3,070.36`, `7.07 GB`).
    bare_one: Regex,
    /// A line of a counter then a number (`12 4194`, `12,4194`, `12: 7.07 GB`), the counter
    /// perhaps named (`i=100: 99.27`, `iter 5: 1234`).
    bare_two: Regex,
    /// Readings posted in a row on one line: `351 → 410 → 357 MB`, `293.2, 293.3, 293.3 MB`.
    inline_run: Regex,
    /// A size under any key (`mbiu: 255 MB`, `warmup_baseline=27308.0 MiB`).
    any_key: Regex,
    /// A line of one key and one size (`mbiu 461.85 MB`).
    line_key: Regex,
    /// A size before the words that say it is held (`14 MB currently in use`, `3.2 GiB used`).
    in_use_after: Regex,
    /// Sizes in a list, each with its unit, perhaps quoted (`['27310.0 MiB', '27310.0 MiB']`).
    sized_list: Regex,
    /// A size in a sentence: a number, an optional `+` or `~`, a unit (`4.8GB`, `7000+MiB`,
    /// `120 MB`), and what follows it (a rate's `per` / `/` is not a reading).
    prose_size: Regex,
    /// Two readings joined by an arrow or `from ... to`, the unit after the second (`~6.0 →
    /// 6.57 GiB`, `from 120 to 300 MB`, `20.9 -> 32.7 GB`).
    prose_pair: Regex,
    /// A reading's step said after its key: `Memory usage after 3 prediction(s): 349 MiB`,
    /// `Total RSS after R5: 18.08 GB`, `GPU memory at epoch 4: 5.1 GB`.
    after_step: Regex,
}

fn pats() -> &'static Patterns {
    static P: OnceLock<Patterns> = OnceLock::new();
    P.get_or_init(|| {
        let r = |s: &str| Regex::new(s).expect("valid pattern");
        let size = r"(\d[\d_,]*(?:\.\d+)?)\s*([kmgtp]i?b?|bytes|b)?\b";
        // (`memory_gb`, `memory (MiB)`, `Memory usage (in MiB)`, `memory [MB]`.)
        let unit_in_key = r"(?:[_ ]?[(\[]?(?:in\s+)?(gib|gb|mib|mb|kib|kb|bytes)[)\]]?)?";
        Patterns {
            step: r(r#"(?i)\b(?:global_step|step|iteration|iter|it)\b['"]?\s*[:=#]?\s*\[?(\d+)"#),
            time: r(r"^\s*\[?(\d{4})[-/](\d{2})[-/](\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?\s*(Z|[+-]\d{2}:?\d{2})?"),
            dict: r(r"\{[^{}]*\}"),
            kv: r#"['"]?([A-Za-z_]\w*)['"]?\s*:\s*(-?\d+)"#.parse::<String>().map(|s| r(&s)).expect("pattern"),
            dev_in_prefix: r(r#"(?i)(?:\bid=|TPU_|\b(?:xla|cuda|gpu|tpu):|\bdevice[ _=:]*)(\d+)|(\d+)['"]?\s*:\s*$"#),
            dev_in_line: r(r"(?i)(?:\bTPU_|\b(?:xla|cuda|gpu|tpu):|\b(?:device|dev|chip|core)\b\s*[ _=:#]?\s*)(\d+)\b"),
            host_in_line: r(r"(?i)\b(rank|worker|host|vm)[ :=_-]?(\d+)\b"),
            framework_mem: vec![
                // OpenMMLab (mmcv's TextLoggerHook, mmengine): `eta: 1:23:45, time: 0.345,
                // data_time: 0.012, memory: 3456, loss: ...`, max_memory_allocated in MB.
                (r(r"\beta: [\d:]+.*\bmemory: (\d+)()(?:,|\s|$)"), "MiB"),
                // detectron2 (CommonMetricPrinter): `max_mem: 2345M`.
                (r(r"\bmax_mem: (\d+)(M)\b"), "MiB"),
                // DeepSpeed's see_memory_usage: `MA 12.34 GB   Max_MA 13.45 GB   CA ...`.
                (r(r"\bMA ([\d.]+) (GB|MB|KB|B)\s+Max_MA\b"), "GiB"),
                // Megatron-LM's report_memory: `memory (MB) | allocated: 1234.5 | max allocated: ...`.
                (r(r"memory \(MB\) \| allocated: ([\d.]+)()"), "MiB"),
            ],
            mm_epoch: r(r"\bEpoch\s*\[(\d+)\]\s*\[(\d+)/(\d+)\]"),
            smi_gpu: r(r"^\|\s+(\d{1,2})\s+\S.*\|\s*[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d"),
            smi_mem: r(r"^\|[^|]*\|\s*(\d+)\s*MiB\s*/\s*(\d+)\s*MiB\s*\|"),
            ctime: r(r"^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(\d{1,2}) (\d{2}:\d{2}:\d{2}) (\d{4})\s*$"),
            mem: r(&format!(r"(?i)\b(hbm(?:[_ ](?:used|usage|in[_ ]use))?|(?:tpu|gpu|device|accelerator)[_ ]?mem(?:ory)?(?:[_ ](?:used|usage|in[_ ]use|allocated))?|mem(?:ory)?(?:[_ ](?:used|usage|use|in[_ ]use|allocated|growth|increase|consumption|footprint))?|(?:max[_ ])?(?:allocated|reserved|cached)|used[_ ]mem(?:ory)?|usage|bytes_in_use|bytes_used|memory_allocated|max_memory_allocated|memory_reserved){unit_in_key}\s*[:=]?\s*{size}(?:\s*(?:/|of)\s*{size})?")),
            rss: r(&format!(r"(?i)\b(rss|vmrss|maxrss|host[_ ]?mem(?:ory)?(?:[_ ]used)?|cpu(?:[_ ]?mem(?:ory)?(?:[_ ]used)?)?|ram(?:[_ ]used)?){unit_in_key}\s*[:=]?\s*{size}")),
            eval: r(r"(?i)\b(eval(?:uat\w*)?|validat\w*|val_loss)\b"),
            ckpt: r(r"(?i)\b(checkpoint\w*|saving model|saved model|save_pretrained|ckpt)\b"),
            compile: r(r"(?i)(Compilation Cause|Compiling \w+ (?:for|with)|Finished XLA compilation|Finished tracing \+ transforming|TRACING CACHE MISS|recompil\w*|CompileTime too frequent)"),
            oom: r(r"(?i)(RESOURCE_EXHAUSTED|Resource exhausted|out of memory|OOM when allocating|Ran out of memory|CUDA error: out of memory)"),
            host_oom: r(r"(?i)(Out of memory: Killed process|oom-kill|invoked oom-killer|Killed process \d+|exit(?:ed)? (?:with )?(?:code|status) (?:-9|137)|signal 9\b|SIGKILL|^\s*Killed\s*$)"),
            error: r(r"(Traceback \(most recent call last\)|\b\w*Error\b|\bException\b|FATAL|Segmentation fault|core dumped|Aborted)"),
            done: r(r"(?i)\b(training (?:complete|completed|finished|done)|finished training|all done)\b"),
            graph_inputs: r(r"Number of Graph Inputs:\s*(\d+)"),
            metrics_step: r(r"^\[MetricsData; step=(\d+)\]"),
            glog: r(r"^[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+\s+(\d+) "),
            epoch: r(r"(?i)\bepoch\b\s*[:=#]?\s*\[?\s*(\d+)"),
            used_of_total: r(r"(?i)\b(\d+(?:\.\d+)?)\s*([kmgt]i?b)\s*/\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b)\b"),
            bare_one: r(r"(?i)^\s*(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)\s*([kmgt]i?b|bytes)?\s*$"),
            inline_run: r(r"(?i)(\d+(?:\.\d+)?(?:(?:\s*(?:→|->|=>)\s*|,\s+|;\s*)\d+(?:\.\d+)?){2,})\s*([kmgt]i?b|bytes)?(?:\b|$)"),
            any_key: r(r"(?:^|[\s,;(\[{|*`])([A-Za-z][\w.-]{0,30}(?: [A-Za-z][\w.-]{0,20}){0,3})\s*[:=]\s*'?(\d+(?:\.\d+)?)\s*([KMGT]i?B|[kmg]b|bytes)\b'?(?:\s*[,;)}|]|\s*$|\s+\()"),
            line_key: r(r"^\s*([A-Za-z][\w.-]{0,30})\s+(\d+(?:\.\d+)?)\s*([KMGT]i?B|[kmg]b|bytes)\s*$"),
            in_use_after: r(r"(?i)\b(\d+(?:\.\d+)?)\s*([kmgt]i?b)\s+(?:currently\s+|now\s+)?(in[ _]use|used)\b"),
            prose_size: r(r"(?i)(?:^|[^\w.])(\d+(?:\.\d+)?)\s*\+?\s*([kmgt]i?b|bytes)\b(\s*(?:/|per\b))?"),
            prose_pair: r(r"(?i)(?:\bfrom\s+~?\s*(\d+(?:\.\d+)?)\s*(?:[kmgt]i?b)?\s+to\s+~?\s*(\d+(?:\.\d+)?)|(?:^|[^\w.])~?(\d+(?:\.\d+)?)\s*(?:[kmgt]i?b)?\s*(?:→|->|=>)\s*~?\s*(\d+(?:\.\d+)?))\s*([kmgt]i?b)\b"),
            sized_list: r(r"(?i)\[\s*'?\d+(?:\.\d+)?\s*[kmgt]i?b'?(?:\s*,\s*'?\d+(?:\.\d+)?\s*[kmgt]i?b'?){2,}\s*,?\s*\]?"),
            after_step: r(r"(?i)\b(mem(?:ory)?(?:[_ ]\w+)?|rss|ram|vram|usage|allocated|reserved)\s+(?:after|at)\s+(?:(?:step|epoch|iter(?:ation)?|batch|round|request|call|prediction|inference|run|cycle)s?\s*#?\s*)?[a-z]?(\d+)(?:\s*(?:step|epoch|iter(?:ation)?|batch|round|request|call|prediction|inference|run|cycle|time)(?:s|\(s\))?)?(\s*[(\[](?:in\s+)?(?:gib|gb|mib|mb|kib|kb|bytes)[)\]])?\s*([:=])"),
            bare_two: r(r"(?i)^\s*(?:[a-z_]\w{0,15}\s*[=:#]?\s*)?(\d+)(?:\s+|\s*[,;|:]\s*)(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)\s*([kmgt]i?b|bytes)?\s*$"),
        }
    })
}

/// Unix seconds of an RFC 3339 / ISO 8601 time (`2026-11-21T10:00:00Z`,
/// `2026-11-21 10:00:00,123`), or plain seconds.
pub fn parse_time(s: &str) -> Option<f64> {
    let s = s.trim();
    if let Ok(v) = s.parse::<f64>() {
        return Some(v);
    }
    let c = pats().time.captures(s)?;
    time_of(&c)
}

fn time_of(c: &regex::Captures<'_>) -> Option<f64> {
    let n = |i: usize| c.get(i).and_then(|m| m.as_str().parse::<i64>().ok());
    let (y, mo, d, h, mi, se) = (n(1)?, n(2)?, n(3)?, n(4)?, n(5)?, n(6)?);
    let frac = c
        .get(7)
        .and_then(|m| format!("0.{}", m.as_str()).parse::<f64>().ok())
        .unwrap_or(0.0);
    let mut off = 0i64;
    if let Some(z) = c.get(8) {
        let z = z.as_str();
        if z != "Z" {
            let sign = if z.starts_with('-') { -1 } else { 1 };
            let digits: String = z.chars().filter(char::is_ascii_digit).collect();
            let hh: i64 = digits.get(..2)?.parse().ok()?;
            let mm: i64 = digits.get(2..4).and_then(|v| v.parse().ok()).unwrap_or(0);
            off = sign * (hh * 3600 + mm * 60);
        }
    }
    Some(hbm_doctor_units::time::unix_seconds(y, mo, d, h, mi, se, off)? as f64 + frac)
}

/// RFC 3339 UTC (`2026-11-23T04:00:00Z`) of Unix seconds. Thin wrapper over
/// `hbm_doctor_units::time::rfc3339`, kept for existing callers.
pub fn format_time(t: f64) -> String {
    hbm_doctor_units::time::rfc3339(t)
}

/// Bytes per unit (`gb`, `MiB`, `k`, `bytes`): `hbm_doctor_units::size::unit_bytes`.
fn unit_scale(u: &str) -> Option<f64> {
    hbm_doctor_units::size::unit_bytes(u).map(|m| m as f64)
}

/// A row of a table aligned with spaces, every cell a number (`  10    22.0G    +1.5G`: a
/// request count, the resident size, its change): each unsigned cell with a size's unit is a
/// reading of its column's series. Signed cells are changes, bare numbers counts or steps.
fn spaced_row(line: &str) -> Vec<(String, f64, Option<f64>)> {
    // (Cheap refusals first: most lines start with a word, and a row is a dozen cells at most.)
    if !line
        .trim_start()
        .starts_with(|c: char| c.is_ascii_digit() || c == '+' || c == '-')
    {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut cells = 0;
    for (k, cell) in line.split_whitespace().enumerate() {
        cells += 1;
        if cells > 12 {
            return Vec::new();
        }
        let at = cell
            .find(|c: char| c.is_ascii_alphabetic())
            .unwrap_or(cell.len());
        let (num, unit) = cell.split_at(at);
        let Some(v) = number(num.trim_start_matches(['+', '-'])) else {
            return Vec::new();
        };
        if unit.is_empty() || num.starts_with(['+', '-']) {
            continue;
        }
        let Some(u) = unit_scale(unit) else {
            return Vec::new();
        };
        out.push((format!("column {}", k + 1), v, Some(u)));
    }
    if cells < 2 {
        return Vec::new();
    }
    out
}

/// The device a log line names (`device 1`, `chip 3`, `xla:0`...), else `0`.
fn line_device(line: &str) -> String {
    pats()
        .dev_in_line
        .captures(line)
        .map_or_else(|| "0".to_string(), |d| d[1].to_string())
}

/// A CSV cell's size: a number in the column's unit (`scale` bytes), or a number with its own
/// unit (nvidia-smi's `1234 MiB`).
fn sized(s: &str, scale: f64) -> Option<f64> {
    match s.trim().split_once(' ') {
        Some((n, u)) => Some(number(n)? * unit_scale(u.trim())?),
        None => Some(number(s)? * scale),
    }
}

fn number(s: &str) -> Option<f64> {
    let t: String = s.chars().filter(|c| *c != ',' && *c != '_').collect();
    t.parse().ok()
}

/// A size from a number and its unit (or a unit named in the key); `bytes_key` when the key
/// itself names bytes. `None` when the unit is unknown (a bare number next to `mem`).
fn size_of(num: &str, unit: Option<&str>, key_unit: Option<&str>, bytes_key: bool) -> Option<u64> {
    let v = number(num)?;
    let scale = match (unit, key_unit) {
        (Some(u), _) => unit_scale(u)?,
        (None, Some(k)) => unit_scale(k)?,
        (None, None) if bytes_key => 1.0,
        (None, None) => return None,
    };
    let b = v * scale;
    valid_bytes(b, None).then_some(b as u64)
}

impl Reader {
    /// A reader for one input. `host` names series whose input names no host ("" for one
    /// input); `name_hint` (the file name) gives TensorBoard exports their unit.
    pub fn new(host: &str, name_hint: &str) -> Self {
        Reader {
            host: host.to_string(),
            name_hint: name_hint.to_ascii_lowercase(),
            pending: Vec::new(),
            overlong: false,
            csv: None,
            step: None,
            ts: None,
            ordinal: 0,
            metrics: None,
            metrics_raw: BTreeMap::new(),
            block: None,
            tb_json: None,
            first_byte_seen: false,
            tail: VecDeque::new(),
            any_log_line: false,
            recording: false,
            csv_valid: 0,
            csv_invalid: 0,
            pid: None,
            smi_gpu: None,
            bare: Bare::default(),
            bare_cols: Vec::new(),
            bare_lines: 0,
            bare_run: Vec::new(),
            md_units: Vec::new(),
            md_keys: Vec::new(),
            md_step: false,
            samples_before: None,
            mem_keys: Vec::new(),
            unitless: BTreeMap::new(),
            step_key_seen: false,
            keyed: Vec::new(),
            prose: Bare::default(),
            ps_cols: None,
        }
    }

    /// Bytes held between chunks (at most [`MAX_LINE`]).
    pub fn pending_bytes(&self) -> usize {
        self.pending.capacity()
    }

    /// Reads one chunk.
    pub fn feed(&mut self, c: &mut Collected, chunk: &[u8]) {
        c.bytes += chunk.len() as u64;
        if self.samples_before.is_none() {
            self.samples_before = Some(c.device_samples());
        }
        if !self.first_byte_seen {
            if let Some(k) = chunk.iter().position(|b| !b.is_ascii_whitespace()) {
                self.first_byte_seen = true;
                // TensorBoard's JSON export is an array of arrays (`[[wall, step, value], ...]`);
                // a log whose first line starts with `[` (`[2024-05-01 12:00:00,000] [INFO]`,
                // `[Rank 0]`) is a log.
                let next = chunk[k + 1..].iter().find(|b| !b.is_ascii_whitespace());
                if chunk[k] == b'[' && next == Some(&b'[') {
                    self.tb_json = Some(TbJson::default());
                }
            }
        }
        if self.tb_json.is_some() {
            self.feed_tb_json(c, chunk);
            return;
        }
        let mut rest = chunk;
        while let Some(i) = memchr_nl(rest) {
            let (line, after) = rest.split_at(i);
            rest = &after[1..];
            if self.overlong {
                self.overlong = false;
                self.pending.clear();
                c.skipped_lines += 1;
                continue;
            }
            if self.pending.is_empty() {
                self.line_bytes(c, line);
            } else {
                let mut buf = std::mem::take(&mut self.pending);
                buf.extend_from_slice(line);
                self.line_bytes(c, &buf);
                buf.clear();
                self.pending = buf;
            }
        }
        if !self.overlong {
            if self.pending.len() + rest.len() > MAX_LINE {
                self.overlong = true;
                self.pending = Vec::new();
            } else {
                self.pending.extend_from_slice(rest);
            }
        }
        if self.pending.capacity() > MAX_LINE * 2 {
            self.pending.shrink_to(MAX_LINE);
        }
    }

    /// The input ended.
    pub fn finish(mut self, c: &mut Collected) {
        if !self.pending.is_empty() && !self.overlong {
            let buf = std::mem::take(&mut self.pending);
            // A torn last JSON line is skipped (docs/recording.md); other text is read.
            if !(buf.first() == Some(&b'{')
                && serde_json::from_slice::<serde_json::Value>(&buf).is_err())
            {
                self.line_bytes(c, &buf);
            }
        }
        self.flush_metrics(c);
        self.flush_unitless(c);
        if c.device_samples() == self.samples_before.unwrap_or(0) {
            self.flush_bare(c);
        }
        if c.device_samples() == self.samples_before.unwrap_or(0) {
            self.flush_keyed(c);
        }
        if c.device_samples() == self.samples_before.unwrap_or(0) {
            self.flush_prose(c);
        }
        if self.csv_invalid > 0 && self.csv_valid == 0 {
            c.errors.push(format!(
                "`{}`: the memory column has no valid value ({} rows of NaN, infinite, negative or impossible sizes)",
                self.name_hint, self.csv_invalid
            ));
        }
        if let Some(tb) = self.tb_json.take() {
            drop(tb);
        }
        if self.any_log_line && !self.recording {
            let ending = self
                .tail
                .iter()
                .copied()
                .max_by_key(|e| match e {
                    Ending::HostOom => 5,
                    Ending::OomMessage => 4,
                    Ending::Error => 3,
                    Ending::Completed => 2,
                    _ => 0,
                })
                .filter(|e| *e != Ending::Unknown)
                .unwrap_or(Ending::Silent);
            let h = c.host(&self.host.clone());
            if h.ending == Ending::Unknown || ending != Ending::Silent {
                h.ending = ending;
            }
        }
    }

    fn feed_tb_json(&mut self, c: &mut Collected, chunk: &[u8]) {
        let host = self.host.clone();
        let scale = self.tb_scale();
        let Some(tb) = self.tb_json.as_mut() else {
            return;
        };
        let mut out: Vec<(f64, f64, f64)> = Vec::new();
        for &b in chunk {
            match b {
                b'[' => tb.depth += 1,
                b']' | b',' => {
                    if !tb.num.is_empty() {
                        if let Ok(v) = tb.num.parse::<f64>() {
                            tb.vals.push(v);
                        }
                        tb.num.clear();
                    }
                    if b == b']' {
                        if tb.depth == 2 && tb.vals.len() == 3 {
                            out.push((tb.vals[0], tb.vals[1], tb.vals[2]));
                        }
                        if tb.depth == 2 {
                            tb.vals.clear();
                        }
                        tb.depth = tb.depth.saturating_sub(1);
                    }
                }
                b'0'..=b'9' | b'.' | b'-' | b'e' | b'E' | b'+' if tb.num.len() < 64 => {
                    tb.num.push(b as char)
                }
                _ => {}
            }
        }
        for (wall, step, v) in out {
            let d = c.device(&host, "0", "tensorboard");
            if !valid_bytes(v * scale, None) || !step.is_finite() || step < 0.0 {
                d.series.invalid += 1;
                continue;
            }
            d.series.push(Sample {
                step: Some(step as u64),
                ts: Some(wall),
                used: (v * scale) as u64,
                ..Sample::default()
            });
        }
    }

    fn tb_scale(&self) -> f64 {
        let n = &self.name_hint;
        let k = 1024f64;
        if n.contains("gib") || n.contains("gb") {
            k * k * k
        } else if n.contains("mib") || n.contains("mb") {
            k * k
        } else if n.contains("kib") || n.contains("kb") {
            k
        } else {
            1.0
        }
    }

    /// Bytes per unit named by the file name as a whole word (`memory_gb.log`, `rss-mib.txt`):
    /// the unit of bare numbers after a memory key in a log.
    fn name_unit(&self) -> Option<f64> {
        self.name_hint
            .split(|ch: char| !ch.is_ascii_alphanumeric())
            .find_map(|t| match t {
                "gb" | "gib" | "mb" | "mib" | "kb" | "kib" => unit_scale(t),
                _ => None,
            })
    }

    fn line_bytes(&mut self, c: &mut Collected, line: &[u8]) {
        c.lines += 1;
        let line = match std::str::from_utf8(line) {
            Ok(s) => std::borrow::Cow::Borrowed(s),
            Err(_) => String::from_utf8_lossy(line),
        };
        let line = line.trim_end_matches('\r');
        self.line(c, line);
    }

    fn line(&mut self, c: &mut Collected, line: &str) {
        let t = line.trim_start();
        if t.is_empty() {
            return;
        }
        if t.starts_with('{') && t.contains("\"type\"") {
            match serde_json::from_str::<Record>(t) {
                Ok(r) => {
                    self.recording = true;
                    self.record_line(c, r);
                    return;
                }
                Err(_) => match serde_json::from_str::<serde_json::Value>(t) {
                    // A line type the format does not define: ignored, as docs/recording.md
                    // asks of readers.
                    Ok(v)
                        if v.get("type").and_then(|t| t.as_str()).is_some_and(|t| {
                            !matches!(t, "header" | "sample" | "process" | "counters" | "event")
                        }) =>
                    {
                        self.recording = true;
                        return;
                    }
                    // No `type`: another reader's JSON (a memory dict, TensorBoard).
                    Ok(v) if v.get("type").is_none_or(serde_json::Value::is_null) => {}
                    _ => {
                        c.skipped_lines += 1;
                        return;
                    }
                },
            }
        }
        // PyTorch/XLA metrics blocks.
        if self.metrics_line(c, line) {
            return;
        }
        // CSV.
        if let Some(csv) = self.csv.clone() {
            if self.csv_row(c, &csv, t) {
                return;
            }
            self.csv = None;
        }
        if t.contains(',') && !t.contains('{') {
            if let Some(h) = self.csv_header(t) {
                self.csv = Some(h);
                return;
            }
        }
        self.log_line(c, line);
    }

    fn record_line(&mut self, c: &mut Collected, r: Record) {
        let host = |h: &Option<String>| h.clone().unwrap_or_else(|| self.host.clone());
        match r {
            Record::Header { .. } => {}
            Record::Sample { host: h, device: d } => {
                let host = host(&h);
                let Some(used) = d.used_bytes else {
                    return;
                };
                let source = d.source.as_str();
                match d.source {
                    SourceKind::Jax => c.framework = c.framework.or(Some(Framework::Jax)),
                    SourceKind::TorchXla | SourceKind::MetricsFile => {
                        c.framework = Some(Framework::PytorchXla);
                    }
                    _ => {}
                }
                c.device(&host, &d.id, source).series.push_from(
                    Sample {
                        step: d.step,
                        ts: d.ts,
                        used,
                        limit: d.limit_bytes,
                        peak: d.peak_bytes,
                    },
                    d.pid.map(u64::from),
                );
            }
            Record::Process {
                ts,
                host: h,
                process,
            } => {
                if let Some(rss) = process.rss_bytes {
                    c.host(&host(&h)).rss.push(Sample {
                        step: None,
                        ts: Some(ts),
                        used: rss,
                        ..Sample::default()
                    });
                }
            }
            Record::Counters {
                host: h, counters, ..
            } => {
                c.framework = Some(Framework::PytorchXla);
                self.ordinal += 1;
                let p = CounterPoint {
                    step: counters.step,
                    ordinal: self.ordinal,
                    uncached_compiles: counters.uncached_compiles,
                    live_data_handles: counters.live_data_handles,
                    live_xla_tensors: counters.live_xla_tensors,
                    ..CounterPoint::default()
                };
                c.host(&host(&h)).push_counter(p);
            }
            Record::Event { host: h, event, .. } => {
                let host = host(&h);
                match event {
                    Event::ProcessExit {
                        host_oom_killed: oom,
                        ..
                    } => {
                        let h = c.host(&host);
                        h.ending = if oom {
                            Ending::HostOom
                        } else {
                            h.ending.max(Ending::Silent)
                        };
                        if oom {
                            h.host_oom_evidence =
                                Some("recording: process_exit with host_oom_killed".into());
                        }
                        for ((hh, _), d) in c.devices.iter_mut() {
                            if *hh == host {
                                d.series.mark_break();
                            }
                        }
                    }
                    Event::KernelOom { .. } => {
                        let h = c.host(&host);
                        h.ending = Ending::HostOom;
                        h.host_oom_evidence = Some("recording: kernel_oom event".into());
                    }
                    Event::SourceDown { .. } => {
                        for ((hh, _), d) in c.devices.iter_mut() {
                            if *hh == host {
                                d.series.mark_break();
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn csv_header(&self, t: &str) -> Option<Csv> {
        let cols: Vec<String> = t
            .split(',')
            .map(|s| s.trim().trim_matches('"').to_ascii_lowercase())
            .collect();
        let find = |names: &[&str]| cols.iter().position(|c| names.contains(&c.as_str()));
        // nvidia-smi --query-gpu=...,memory.used,memory.total --format=csv: `memory.used [MiB]`
        // (the unit in brackets; MiB without one).
        let smi = |name: &str| {
            cols.iter().position(|c| c.starts_with(name)).map(|i| {
                let unit = cols[i]
                    .split_once('[')
                    .and_then(|(_, u)| u.strip_suffix(']'))
                    .and_then(unit_scale);
                (i, unit.unwrap_or((1u64 << 20) as f64))
            })
        };
        let mut scale = 1.0;
        let mut source = "csv";
        let mut limit = find(&["bytes_limit", "limit_bytes"]);
        let mut limit_scale = 1.0;
        let used = match find(&["bytes_in_use", "used_bytes"]) {
            Some(u) => u,
            None => {
                if let Some((u, sc)) = smi("memory.used") {
                    scale = sc;
                    if let Some((l, lsc)) = smi("memory.total") {
                        limit = Some(l);
                        limit_scale = lsc;
                    }
                    u
                } else if let Some(u) = cols.iter().position(|c| {
                    // A Weights & Biases export: `run - system/gpu.0.memoryAllocatedBytes`.
                    c.ends_with("memoryallocatedbytes") && c.contains("gpu.")
                }) {
                    u
                } else {
                    // TensorBoard scalar export: Wall time,Step,Value.
                    let v = find(&["value"])?;
                    find(&["step"])?;
                    scale = self.tb_scale();
                    source = "tensorboard";
                    v
                }
            }
        };
        Some(Csv {
            step: find(&["step", "_step"]),
            time: find(&["time", "wall time", "wall_time", "timestamp", "_timestamp"]),
            used,
            device: find(&["device", "device_id", "id", "index"]),
            host: find(&["host", "hostname"]),
            limit,
            peak: find(&["peak_bytes_in_use", "peak_bytes"]),
            pid: find(&["pid", "process_id"]),
            scale,
            limit_scale,
            source,
            cols: cols.len(),
        })
    }

    fn csv_row(&mut self, c: &mut Collected, h: &Csv, t: &str) -> bool {
        let f: Vec<&str> = t.split(',').map(|s| s.trim().trim_matches('"')).collect();
        if f.len() != h.cols {
            return false;
        }
        let g = |i: Option<usize>| i.and_then(|i| f.get(i).copied()).filter(|v| !v.is_empty());
        let step = g(h.step)
            .and_then(number)
            .filter(|v| v.is_finite() && *v >= 0.0)
            .map(|v| v as u64);
        let ts = g(h.time).and_then(parse_time).filter(|t| t.is_finite());
        let host = g(h.host).map_or_else(|| self.host.clone(), str::to_string);
        let dev = g(h.device).unwrap_or("0").to_string();
        let limit = g(h.limit)
            .and_then(|v| sized(v, h.limit_scale))
            .filter(|v| valid_bytes(*v, None) && *v > 0.0);
        let peak = g(h.peak)
            .and_then(number)
            .filter(|v| valid_bytes(*v, limit))
            .map(|v| v as u64);
        let limit = limit.map(|v| v as u64);
        let source = h.source;
        // A value that is no size a device can hold (NaN, inf, negative, 1e30, empty) is
        // skipped and counted; the row is still a row of this CSV.
        let used = f.get(h.used).and_then(|v| sized(v, h.scale));
        let d = c.device(&host, &dev, source);
        let Some(used) = used.filter(|u| valid_bytes(*u, limit.map(|l| l as f64))) else {
            d.series.invalid += 1;
            self.csv_invalid += 1;
            return true;
        };
        if step.is_none() && ts.is_none() && (h.step.is_some() || h.time.is_some()) {
            d.series.invalid += 1;
            self.csv_invalid += 1;
            return true;
        }
        self.csv_valid += 1;
        let pid = g(h.pid).and_then(|v| v.parse::<u64>().ok());
        d.series.push_from(
            Sample {
                step,
                ts,
                used: used as u64,
                limit,
                peak,
            },
            pid,
        );
        true
    }

    /// Handles `[MetricsData; step=N]`, `Metric:`/`Counter:` blocks and their attributes.
    fn metrics_line(&mut self, c: &mut Collected, line: &str) -> bool {
        let p = pats();
        if let Some(m) = p.metrics_step.captures(line) {
            self.flush_metrics(c);
            self.step = m.get(1).and_then(|v| v.as_str().parse().ok());
            self.metrics = Some(CounterPoint {
                step: self.step,
                ..CounterPoint::default()
            });
            c.framework = Some(Framework::PytorchXla);
            return true;
        }
        for (prefix, counter) in [("Metric: ", false), ("Counter: ", true)] {
            if let Some(name) = line.strip_prefix(prefix) {
                if self.metrics.is_none() {
                    self.metrics = Some(CounterPoint {
                        step: self.step,
                        ..CounterPoint::default()
                    });
                }
                c.framework = Some(Framework::PytorchXla);
                self.block = Some(Block {
                    name: name.trim().to_string(),
                    counter,
                });
                return true;
            }
        }
        if let Some(b) = &self.block {
            if line.starts_with("  ") {
                let a = line.trim();
                if let Some((k, v)) = a.split_once(':') {
                    let v = v.trim();
                    let key = match (b.counter, k) {
                        (true, "Value") => Some(b.name.clone()),
                        (false, "TotalSamples") => Some(format!("{}.samples", b.name)),
                        (false, "Accumulator") => Some(format!("{}.acc", b.name)),
                        _ => None,
                    };
                    if let Some(key) = key {
                        let val = if key.ends_with(".acc") {
                            parse_metric_value(v)
                        } else {
                            number(v)
                        };
                        if let Some(val) = val {
                            self.metrics_raw.insert(key, val);
                        }
                    }
                }
                return true;
            }
            self.block = None;
            if self.metrics.is_some() && !line.starts_with('[') {
                self.flush_metrics(c);
            }
        }
        false
    }

    fn flush_metrics(&mut self, c: &mut Collected) {
        let Some(mut p) = self.metrics.take() else {
            return;
        };
        self.block = None;
        let raw = std::mem::take(&mut self.metrics_raw);
        if raw.is_empty() {
            return;
        }
        let g = |k: &str| raw.get(k).copied();
        self.ordinal += 1;
        p.ordinal = self.ordinal;
        // Reports older than the UncachedCompile counter count compilations in CompileTime.
        p.uncached_compiles = Some(
            g("UncachedCompile")
                .or(g("CompileTime.samples"))
                .unwrap_or(0.0) as u64,
        );
        p.compile_seconds = g("CompileTime.acc");
        p.live_data_handles = match (g("CreateDataHandles"), g("DestroyDataHandles")) {
            (Some(a), d) => Some(a as i64 - d.unwrap_or(0.0) as i64),
            _ => None,
        };
        p.live_xla_tensors = match (g("CreateXlaTensor"), g("DestroyXlaTensor")) {
            (Some(a), d) => Some(a as i64 - d.unwrap_or(0.0) as i64),
            _ => None,
        };
        p.transfers_to_device = g("TransferToDeviceTime.samples").map(|v| v as u64);
        p.inbound_bytes = g("InboundData.acc");
        let host = self.host.clone();
        c.host(&host).push_counter(p);
    }

    /// One reading a log line gave, at the step, time and process seen so far.
    fn push_log(&self, c: &mut Collected, host: &str, dev: &str, used: u64, limit: Option<u64>) {
        let sample = Sample {
            step: self.step,
            ts: self.ts,
            used,
            limit,
            peak: None,
        };
        c.device(host, dev, "log")
            .series
            .push_from(sample, self.pid);
    }

    fn log_line(&mut self, c: &mut Collected, line: &str) {
        let p = pats();
        self.any_log_line = true;
        if let Some(tc) = p.time.captures(line) {
            self.ts = time_of(&tc).or(self.ts);
        }
        let line_step = p
            .step
            .captures(line)
            .and_then(|m| m.get(1))
            .and_then(|m| m.as_str().parse::<u64>().ok());
        if line_step.is_some() {
            self.step = line_step;
            self.step_key_seen = true;
        } else if !self.step_key_seen {
            if let Some(e) = p
                .epoch
                .captures(line)
                .and_then(|m| m[1].parse::<u64>().ok())
            {
                self.step = Some(e);
            }
        }
        // glog's prefix names the thread, the process's main thread for a training loop: a
        // new one is a new process.
        self.pid = p.glog.captures(line).and_then(|m| m[1].parse::<u64>().ok());
        let host = p
            .host_in_line
            .captures(line)
            .map(|m| format!("{}{}", m[1].to_ascii_lowercase(), &m[2]))
            .unwrap_or_else(|| self.host.clone());
        // Markers and endings.
        let mut ending = Ending::Unknown;
        if p.host_oom.is_match(line) {
            ending = Ending::HostOom;
            let h = c.host(&host);
            h.host_oom_evidence = Some(line.chars().take(200).collect());
            h.ending = Ending::HostOom;
        } else if p.oom.is_match(line) {
            ending = Ending::OomMessage;
        } else if p.error.is_match(line) {
            ending = Ending::Error;
        } else if p.done.is_match(line) {
            ending = Ending::Completed;
        }
        if self.tail.len() == 20 {
            self.tail.pop_front();
        }
        self.tail.push_back(ending);
        let (compile, eval, ckpt) = (
            p.compile.is_match(line),
            p.eval.is_match(line),
            p.ckpt.is_match(line),
        );
        // Readings so far, held ones included (a log of one series places its markers by them);
        // counted only on a marker's line.
        let ordinal = (compile || eval || ckpt).then(|| {
            c.device_samples()
                + self
                    .unitless
                    .values()
                    .chain(std::iter::once(&self.bare))
                    .chain(self.keyed.iter().map(|(_, b)| b))
                    .map(|b| b.seen)
                    .sum::<u64>()
        });
        let mk = |kind| Marker {
            kind,
            step: self.step,
            ts: self.ts,
            ordinal,
        };
        if compile {
            c.marker(mk(MarkerKind::Recompilation));
            let late = self.step.is_some_and(|s| s > 50);
            let h = c.host(&host);
            if late {
                h.late_compiles += 1;
            }
            if line.contains("CompileTime too frequent") {
                h.compile_too_frequent += 1;
            }
            c.framework = c.framework.or_else(|| {
                (line.contains("Compilation") || line.contains("pt-xla"))
                    .then_some(Framework::PytorchXla)
            });
        }
        if let Some(g) = p.graph_inputs.captures(line) {
            if let Ok(n) = g[1].parse::<u64>() {
                let h = c.host(&host);
                h.graph_inputs = Some(match h.graph_inputs {
                    None => (n, n, 1),
                    Some((f, _, k)) => (f, n, k + 1),
                });
            }
        }
        if eval {
            c.marker(mk(MarkerKind::Eval));
        }
        if ckpt {
            c.marker(mk(MarkerKind::Checkpoint));
        }
        // Dicts: JAX memory_stats(), torch_xla get_memory_info().
        if (line.contains("bytes_in_use")
            || line.contains("bytes_used")
            || line.contains("kb_free"))
            && self.dicts(c, line, &host)
        {
            return;
        }
        if self.ps_line(c, line, &host) {
            return;
        }
        // nvidia-smi's table, printed again and again (`nvidia-smi -l`, `watch nvidia-smi`): the
        // date line above it, the GPU's row, then its memory cell `12345MiB / 81559MiB`.
        if let Some(m) = p.ctime.captures(line) {
            const MONTHS: [&str; 12] = [
                "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
            ];
            let mo = MONTHS.iter().position(|x| *x == &m[1]).unwrap_or(0) + 1;
            let day: u32 = m[2].parse().unwrap_or(1);
            self.ts = parse_time(&format!("{}-{mo:02}-{day:02}T{}Z", &m[4], &m[3])).or(self.ts);
            return;
        }
        let row = line.trim_start();
        if row.starts_with('|') {
            if let Some(m) = p.smi_gpu.captures(row) {
                self.smi_gpu = Some(m[1].to_string());
                return;
            }
            if let (Some(m), Some(dev)) = (p.smi_mem.captures(row), self.smi_gpu.take()) {
                let mib = |i: usize| m[i].parse::<u64>().ok().map(|v| v << 20);
                if let Some(used) = mib(1) {
                    self.push_log(c, &host, &dev, used, mib(2).filter(|&l| l > 0));
                }
                return;
            }
        }
        // A training framework's own memory line (OpenMMLab, detectron2, DeepSpeed, Megatron-LM).
        for (re, default_unit) in &p.framework_mem {
            let Some(m) = re.captures(line) else { continue };
            let unit = m.get(2).map(|u| u.as_str()).filter(|u| !u.is_empty());
            let unit = match unit {
                Some("M") | None => *default_unit,
                Some(u) => u,
            };
            let Some(used) = size_of(&m[1], Some(unit), None, false) else {
                continue;
            };
            // OpenMMLab counts iterations within each epoch: `Epoch [3][50/1000]`.
            let step = p
                .mm_epoch
                .captures(line)
                .and_then(|e| {
                    let n = |i: usize| e[i].parse::<u64>().ok();
                    Some(
                        n(1)?
                            .saturating_sub(1)
                            .saturating_mul(n(3)?)
                            .saturating_add(n(2)?),
                    )
                })
                .or(self.step);
            self.step = step;
            self.push_log(c, &host, &line_device(line), used, None);
            return;
        }
        // A line of nothing but numbers: kept aside, a series only if nothing else is read.
        if let Some(m) = p.bare_one.captures(line) {
            let unit = m.get(2).and_then(|u| unit_scale(u.as_str()));
            if let Some(v) = number(&m[1]) {
                self.bare.push((None, v, unit, self.ts));
            }
            return;
        }
        if let Some(m) = p.bare_two.captures(line) {
            let unit = m.get(3).and_then(|u| unit_scale(u.as_str()));
            if let Some(v) = number(&m[2]) {
                self.bare.push((m[1].parse().ok(), v, unit, self.ts));
            }
            return;
        }
        if self.bare_columns(line) || self.inline_run(line) {
            return;
        }
        // `Memory usage after 3 prediction(s): 349 MiB`: the step said after the key, read as
        // the step and the line read without it.
        let rewritten;
        let maybe = line.contains("fter") || line.contains(" at ") || line.contains(" At ");
        let line = match maybe.then(|| p.after_step.captures(line)).flatten() {
            Some(m) => {
                self.step = m[2].parse().ok().or(self.step);
                self.step_key_seen = true;
                // (The unit said between the step and the colon stays: `(in MiB)`.)
                let (key, unit, end) = (
                    m.get(1).map_or(0..0, |g| g.range()),
                    m.get(3).map_or("", |g| g.as_str()),
                    m.get(4).map_or(0, |g| g.start()),
                );
                rewritten = format!("{}{unit}{}", &line[..key.end], &line[end..]);
                rewritten.as_str()
            }
            None => line,
        };
        // Host RSS, then device memory.
        let mut rss_spans = Vec::new();
        for m in p.rss.captures_iter(line) {
            let whole = m.get(0).map_or(0..0, |g| g.range());
            let key = m[1].to_ascii_lowercase();
            let bytes_key = key.contains("bytes");
            // `CPU` alone is host memory only with a size's unit (`CPU: 955.15 MB` beside the
            // device's `Allocated:`), never a load (`CPU: 45`).
            if key == "cpu" && m.get(4).is_none() {
                continue;
            }
            if let Some(b) = size_of(
                &m[3],
                m.get(4).map(|u| u.as_str()),
                m.get(2).map(|u| u.as_str()),
                bytes_key,
            )
            .or_else(|| self.bare_in_named_unit(&m[3], m.get(4), m.get(2)))
            {
                c.host(&host).rss.push(Sample {
                    step: self.step,
                    ts: self.ts,
                    used: b,
                    ..Sample::default()
                });
                rss_spans.push(whole);
            }
        }
        for m in p.mem.captures_iter(line) {
            let whole = m.get(0).map_or(0..0, |g| g.range());
            if rss_spans.iter().any(|r| r.contains(&whole.start)) {
                continue;
            }
            let key = m[1].to_ascii_lowercase();
            let bytes_key = key.contains("bytes")
                || key.contains("memory_allocated")
                || key.contains("memory_reserved");
            let key_unit = m.get(2).map(|u| u.as_str());
            // A percentage (`RAM: 8.6%`) is not a size.
            if line[whole.end..].trim_start().starts_with('%') {
                continue;
            }
            // A reading under another key than the device's first (`memory_reserved` lines
            // between `memory_allocated` ones, a summary line) is its own series, not a jump.
            let norm = format!(
                "{}{}",
                key.replace('_', " "),
                key_unit.unwrap_or("").to_ascii_lowercase()
            );
            let dev = line_device(line);
            let first = match self
                .mem_keys
                .iter()
                .find(|((h, d), _)| *h == host && *d == dev)
            {
                Some((_, k)) => *k == norm,
                None => {
                    self.mem_keys.push(((host.clone(), dev.clone()), norm));
                    true
                }
            };
            let dev = if first {
                dev
            } else {
                format!("{dev} ({})", m[1].trim())
            };
            // No unit on the number nor in its key nor in the file name, or a fraction where
            // the key names bytes (`memory_allocated: 0.2649`: the user divided by 2^30): the
            // series' unit is decided from all its numbers at the end ([`Reader::finish`]).
            let unitless = m.get(4).is_none() && key_unit.is_none() && self.name_unit().is_none();
            let fraction = number(&m[3]).is_some_and(|v| v.fract() != 0.0);
            if unitless && (!bytes_key || fraction) {
                if let Some(v) = number(&m[3]) {
                    self.unitless
                        .entry((host.clone(), dev))
                        .or_default()
                        .push((self.step, v, None, self.ts));
                }
                return;
            }
            let Some(used) = size_of(&m[3], m.get(4).map(|u| u.as_str()), key_unit, bytes_key)
                .or_else(|| self.bare_in_named_unit(&m[3], m.get(4), m.get(2)))
            else {
                continue;
            };
            let limit = m.get(5).and_then(|n| {
                size_of(
                    n.as_str(),
                    m.get(6).or(m.get(4)).map(|u| u.as_str()),
                    key_unit,
                    bytes_key,
                )
            });
            self.push_log(c, &host, &dev, used, limit);
            return;
        }
        // No key: a used / total pair as nvidia-smi's memory cell prints it (`3149MiB /
        // 16384MiB`, in a table row or after `Epoch 3/10:`).
        if let Some(m) = p.used_of_total.captures(line) {
            let size = |n: usize, u: usize| size_of(&m[n], Some(&m[u]), None, false);
            if let (Some(used), Some(total)) = (size(1, 2), size(3, 4)) {
                if used <= total && total > 0 {
                    self.push_log(c, &host, &line_device(line), used, Some(total));
                }
            }
            return;
        }
        // (Held sizes are read only when nothing else is: none once a reading was.)
        if rss_spans.is_empty() && c.device_samples() == self.samples_before.unwrap_or(0) {
            self.hold_keyed(line);
        }
    }

    /// `ps aux` / `ps -o pid,rss,cmd` / `top` output: a header naming `PID` and `RSS` (or
    /// `RES`), then rows whose resident memory is read in KiB (`top`'s `1.2g` / `512m` as
    /// suffixed), one series per process (`pid 1166`). `true` when the line was one of these.
    fn ps_line(&mut self, c: &mut Collected, line: &str, host: &str) -> bool {
        if self.ps_cols.is_none() && !line.contains("PID") {
            return false;
        }
        let cells: Vec<&str> = line.split_whitespace().collect();
        if line.contains("PID") && (line.contains("RSS") || line.contains("RES")) {
            let pid = cells.iter().position(|x| *x == "PID");
            let mem = cells.iter().position(|x| *x == "RSS" || *x == "RES");
            if let (Some(p), Some(m)) = (pid, mem) {
                self.ps_cols = Some((p, m));
                return true;
            }
        }
        let Some((p, m)) = self.ps_cols else {
            return false;
        };
        // The table ends at the first line that is not one of its rows.
        let row = match (cells.get(p), cells.get(m)) {
            (Some(pid), Some(mem)) if pid.bytes().all(|b| b.is_ascii_digit()) => Some((*pid, *mem)),
            _ => None,
        };
        let Some((pid, mem)) = row else {
            self.ps_cols = None;
            return false;
        };
        let (num, scale) = match mem.char_indices().last() {
            Some((i, u)) if u.is_ascii_alphabetic() => {
                let s = match u.to_ascii_lowercase() {
                    'k' => 1024.0,
                    'm' => 1024.0 * 1024.0,
                    'g' => 1024.0 * 1024.0 * 1024.0,
                    't' => 1024.0 * 1024.0 * 1024.0 * 1024.0,
                    _ => return false,
                };
                (&mem[..i], s)
            }
            _ => (mem, 1024.0),
        };
        let Some(v) = number(num) else {
            self.ps_cols = None;
            return false;
        };
        let b = v * scale;
        if !valid_bytes(b, None) {
            return false;
        }
        let dev = format!("pid {pid}");
        let sample = Sample {
            step: self.step,
            ts: self.ts,
            used: b as u64,
            limit: None,
            peak: None,
        };
        c.device(host, &dev, "ps: resident memory (RSS, KiB)")
            .series
            .push_from(sample, None);
        true
    }

    /// Sizes no pattern knows, held under their key ([`Reader::keyed`]): a list of sized values
    /// (`post_warmup_samples=['27310.0 MiB', '27310.0 MiB', ...]`, successive readings), a size
    /// before `in use` / `used` (`14 MB currently in use`; `1024 MB allocated cumulatively` is a
    /// counter and is not read), else every `KEY: SIZE` of the line (`mbiu: 255 MB, bui: 1 MB`).
    fn hold_keyed(&mut self, line: &str) {
        if self.markdown_by_header(line) {
            return;
        }
        let p = pats();
        // Cheap filter first: a digit then a size unit (`255 MB`, `1.5GiB`, `16 kb`, `bytes`).
        let b = line.as_bytes();
        let sized = b.windows(3).enumerate().any(|(i, w)| {
            let unit = |c: u8| matches!(c | 0x20, b'k' | b'm' | b'g' | b't');
            let byte = |c: u8| c | 0x20 == b'b';
            w[0].is_ascii_digit()
                && (unit(w[1]) && (byte(w[2]) || w[2] == b'i')
                    || w[1] == b' '
                        && unit(w[2])
                        && b.get(i + 3).is_some_and(|&c| byte(c) || c == b'i'))
        }) || line.contains("bytes");
        let spaced = spaced_row(line);
        if !sized && spaced.is_empty() {
            return;
        }
        let mut held: Vec<(String, f64, Option<f64>)> = Vec::new();
        let row = line.trim();
        if !spaced.is_empty() {
            held = spaced;
        } else if row.starts_with('|') && row.ends_with('|') {
            // A markdown table's row: each cell that is a size (`16 MB`, `**1,670 MB**`) is a
            // reading of its column's series (`| t+60 | 144.0 MB | +93.1 |`).
            for (k, cell) in row.trim_matches('|').split('|').enumerate() {
                let cell = cell
                    .trim()
                    .trim_matches(|c| c == '*' || c == '`' || c == '~')
                    .trim();
                let at = cell
                    .find(|c: char| c.is_ascii_alphabetic())
                    .unwrap_or(cell.len());
                if at == 0 || at == cell.len() {
                    continue;
                }
                // (A note after the unit is not part of it: `25.8 GB (swapping)`.)
                let unit = cell[at..].split_whitespace().next().unwrap_or("");
                let num = cell[..at].trim();
                if let (Some(v), Some(u)) = (number(num), unit_scale(unit)) {
                    if !num.starts_with(['+', '-']) {
                        held.push((format!("column {}", k + 1), v, Some(u)));
                    }
                }
            }
        } else if let Some(m) = p.sized_list.find(line) {
            let key = line[..m.start()]
                .trim_end_matches(|c: char| c == '=' || c == ':' || c.is_whitespace())
                .rsplit(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .filter(|k| !k.is_empty())
                .unwrap_or("list")
                .to_ascii_lowercase();
            let unit_at = |x: &str| x.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(x.len());
            for item in m.as_str().trim_matches(|c| c == '[' || c == ']').split(',') {
                let item = item.trim().trim_matches('\'');
                if item.is_empty() {
                    continue;
                }
                let at = unit_at(item);
                if let Some(v) = number(item[..at].trim()) {
                    held.push((key.clone(), v, unit_scale(item[at..].trim())));
                }
            }
        } else if let Some(m) = p.in_use_after.captures(line) {
            if let Some(v) = number(&m[1]) {
                held.push((
                    m[3].replace('_', " ").to_ascii_lowercase(),
                    v,
                    unit_scale(&m[2]),
                ));
            }
        } else if let Some(m) = p.line_key.captures(line) {
            if let Some(v) = number(&m[2]) {
                held.push((m[1].to_ascii_lowercase(), v, unit_scale(&m[3])));
            }
        } else {
            for m in p.any_key.captures_iter(line) {
                let key = m[1].trim().to_ascii_lowercase();
                // A step's or a time's name is not memory (`step: 100 MB` is no such line, but
                // `eta: 5 kb/s` and `lr=3e-4` are): the unit decides, and a rate is not a size.
                if line[m.get(3).map_or(0, |u| u.end())..].starts_with('/') {
                    continue;
                }
                if let Some(v) = number(&m[2]) {
                    held.push((key, v, unit_scale(&m[3])));
                }
            }
        }
        if held.iter().all(|h| h.2.is_none()) {
            self.hold_prose(line);
            return;
        }
        for (key, v, unit) in held {
            if unit.is_none() {
                continue;
            }
            self.push_keyed(key, (self.step, v, unit, self.ts));
        }
    }

    /// One reading held under `key` ([`Reader::keyed`]). A bounded number of keys: past it, a
    /// key not seen before is not held.
    fn push_keyed(&mut self, key: String, row: BareRow) {
        let full = self.keyed.len() >= MAX_KEYED;
        match self.keyed.iter_mut().find(|(k, _)| *k == key) {
            Some((_, bare)) => bare.push(row),
            None if full => {}
            None => {
                let mut bare = Bare::default();
                bare.push(row);
                self.keyed.push((key, bare));
            }
        }
    }

    /// A markdown table whose header names the unit of its columns (`| step | max current (GB)
    /// | max peak (GB) | % cap |`): the header is kept, and each row's bare numbers under a
    /// sized column are readings of that column (keyed by its name), at the step of the first
    /// column when the header names steps (`| 2735 (resume) | 41.5 | 44.9 | 11% |`). True when
    /// the line was such a table's line.
    fn markdown_by_header(&mut self, line: &str) -> bool {
        let row = line.trim();
        if !(row.len() > 2 && row.starts_with('|') && row.ends_with('|')) {
            return false;
        }
        let cells: Vec<&str> = row[1..row.len() - 1]
            .split('|')
            .map(|x| x.trim().trim_matches(|c| c == '*' || c == '`').trim())
            .collect();
        // The rule under the header (`|---:|:---|`).
        if cells
            .iter()
            .all(|x| !x.is_empty() && x.bytes().all(|b| matches!(b, b'-' | b':' | b' ')))
        {
            return !self.md_units.is_empty();
        }
        let starts_num = |x: &str| x.starts_with(|c: char| c.is_ascii_digit());
        if !cells.iter().any(|x| starts_num(x)) {
            // A header: the unit in brackets or as the last word of each cell.
            let units: Vec<Option<f64>> = cells
                .iter()
                .map(|x| {
                    let l = x.to_ascii_lowercase();
                    let word = l
                        .rsplit(|c: char| c.is_whitespace() || c == '(' || c == '[' || c == '_')
                        .map(|w| w.trim_matches(|c| c == ')' || c == ']' || c == ','))
                        .find(|w| !w.is_empty())
                        .unwrap_or("");
                    let word = word.strip_prefix("in ").unwrap_or(word);
                    matches!(word, "gb" | "gib" | "mb" | "mib" | "kb" | "kib" | "bytes")
                        .then(|| unit_scale(word))
                        .flatten()
                })
                .collect();
            if units.iter().any(Option::is_some) {
                let first = cells[0].to_ascii_lowercase();
                self.md_step = [
                    "step", "epoch", "iter", "round", "request", "batch", "cycle",
                ]
                .iter()
                .any(|k| first.contains(k));
                self.md_units = units;
                self.md_keys = cells.iter().map(|x| x.to_ascii_lowercase()).collect();
                return true;
            }
            self.md_units.clear();
            return false;
        }
        if self.md_units.is_empty() || cells.len() != self.md_units.len() {
            return false;
        }
        if self.md_step {
            let n: String = cells[0].chars().take_while(char::is_ascii_digit).collect();
            if let Ok(n) = n.parse::<u64>() {
                self.step = Some(n);
            }
        }
        for (k, cell) in cells.iter().enumerate() {
            let Some(u) = self.md_units[k] else { continue };
            // A bare number, perhaps with a note after it (`41.5 (resume)`); a sign is a change.
            let num = cell.split_whitespace().next().unwrap_or("");
            let Some(v) = number(num).filter(|_| !num.starts_with(['+', '-'])) else {
                continue;
            };
            let key = self.md_keys[k].clone();
            self.push_keyed(key, (self.step, v, Some(u), self.ts));
        }
        true
    }

    /// Sizes told in a sentence about memory, kept in the order told ([`Reader::prose`]): the
    /// two of an arrow or a `from ... to` (`~6.0 → 6.57 GiB`), else every size of the sentence
    /// that is not a rate (`about 4.8GB ... added up to 9.2GB`; `~5 GB per request` is not
    /// read). A sentence names memory (`memory`, `RSS`, `VRAM`, `显存`...); code is not prose.
    fn hold_prose(&mut self, line: &str) {
        let lower = line.to_ascii_lowercase();
        let memory = [
            "memory",
            "memery",
            "rss",
            "vram",
            "ram ",
            "ram:",
            "footprint",
            "heap",
            "显存",
            "内存",
        ]
        .iter()
        .any(|w| lower.contains(w));
        // (An assignment is code; `==` quoted in a sentence is not.)
        let assigns = line.match_indices('=').any(|(i, _)| {
            !matches!(line.as_bytes().get(i + 1), Some(b'=' | b'>'))
                && !matches!(
                    line.as_bytes().get(i.wrapping_sub(1)),
                    Some(b'=' | b'!' | b'<' | b'>')
                )
        });
        let code = (line.contains('(') && assigns) || line.contains("File \"");
        let words = line
            .split_whitespace()
            .filter(|w| w.len() > 2 && w.bytes().all(|b| b.is_ascii_alphabetic()))
            .count();
        if !memory || code || words < 3 {
            return;
        }
        let p = pats();
        if let Some(m) = p.prose_pair.captures(line) {
            let unit = unit_scale(&m[5]);
            let (a, b) = match (m.get(1), m.get(2)) {
                (Some(a), Some(b)) => (a.as_str(), b.as_str()),
                _ => (
                    m.get(3).map_or("", |g| g.as_str()),
                    m.get(4).map_or("", |g| g.as_str()),
                ),
            };
            if let (Some(a), Some(b)) = (number(a), number(b)) {
                self.prose.push((None, a, unit, self.ts));
                self.prose.push((None, b, unit, self.ts));
            }
            return;
        }
        for m in p.prose_size.captures_iter(line) {
            if m.get(3).is_some() {
                continue;
            }
            if let (Some(v), Some(u)) = (number(&m[1]), unit_scale(&m[2])) {
                self.prose.push((None, v, Some(u), self.ts));
            }
        }
    }

    /// The sizes told in sentences, as the input's one series, when nothing else was read.
    fn flush_prose(&mut self, c: &mut Collected) {
        let rows = std::mem::take(&mut self.prose.rows);
        if rows.len() < 2 {
            return;
        }
        let host = self.host.clone();
        self.push_held(c, &host, "0", rows, false, "sizes told in sentences");
    }

    /// The sizes held under keys no pattern knows, one series per key (the first key's is
    /// device 0, the others `0 (KEY)`), when the input gave no other reading.
    fn flush_keyed(&mut self, c: &mut Collected) {
        let keyed = std::mem::take(&mut self.keyed);
        let host = self.host.clone();
        let mut first = true;
        for (key, bare) in keyed {
            if bare.rows.len() < 2 {
                continue;
            }
            let dev = if first {
                "0".to_string()
            } else {
                format!("0 ({key})")
            };
            first = false;
            let stepped = bare.rows.iter().all(|r| r.0.is_some())
                && bare.rows.windows(2).all(|w| w[1].0 > w[0].0);
            self.push_held(
                c,
                &host,
                &dev,
                bare.rows,
                stepped,
                &format!("sizes under `{key}`"),
            );
        }
    }

    /// The unit of numbers printed without one: printed on some lines, else the file name's,
    /// else guessed from their size (at least 10^8: bytes; 10^5: KiB, as `ps` prints RSS; below
    /// 1000 with decimals: GiB, as readings divided by 2^30 or 10^9 are posted; else MiB, as
    /// nvidia-smi prints), and the words that say which.
    fn guess_unit(&self, rows: &[BareRow]) -> (f64, &'static str) {
        let max = rows.iter().map(|r| r.1).fold(0.0_f64, f64::max);
        let decimals = rows.iter().any(|r| r.1.fract() != 0.0);
        let printed = rows.iter().find_map(|r| r.2);
        match (printed, self.name_unit()) {
            (Some(u), _) => (u, "the unit printed"),
            (None, Some(u)) => (u, "the unit the file name gives"),
            (None, None) if max >= 1e8 => (1.0, "bytes, by their size (no unit printed)"),
            (None, None) if max >= 1e5 => (1024.0, "KiB, by their size (no unit printed)"),
            (None, None) if decimals && max < 1e3 => (
                1024.0 * 1024.0 * 1024.0,
                "GiB, by their size (no unit printed)",
            ),
            (None, None) => (1024.0 * 1024.0, "MiB, by their size (no unit printed)"),
        }
    }

    /// Memory readings printed without a unit (`memory_allocated: 0.2649`, `ALLOCATED: 1.005`),
    /// each series in the unit [`Reader::guess_unit`] gives all its numbers.
    fn flush_unitless(&mut self, c: &mut Collected) {
        for ((host, dev), bare) in std::mem::take(&mut self.unitless) {
            self.push_held(c, &host, &dev, bare.rows, true, "numbers without a unit");
        }
    }

    /// A line of several numbers and nothing else (`2491.66 21.19`, `3, 4194, 5120`), or a list
    /// of them printed whole (`[1767284, 2520072, 3146460]`): kept aside like a bare number. A
    /// list's numbers are successive readings; a line's columns are series side by side, the
    /// first of them the step when it is a whole number and more columns follow.
    fn bare_columns(&mut self, line: &str) -> bool {
        // (A list pasted in backticks or quotes: `` `[0.49, 0.82, 1.15]` ``.)
        let t = line
            .trim()
            .trim_matches(|c| c == '`' || c == '\'' || c == '"')
            .trim();
        let (list, body) = match t.strip_prefix('[').and_then(|b| b.strip_suffix(']')) {
            Some(b) => (true, b),
            None => (false, t),
        };
        if body.is_empty()
            || !body
                .bytes()
                .all(|b| b.is_ascii_digit() || b".,;| \t-+eE".contains(&b))
        {
            return false;
        }
        let cells: Vec<&str> = body
            .split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '|'))
            .filter(|x| !x.is_empty())
            .collect();
        let Some(vals) = cells
            .iter()
            .map(|x| x.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0))
            .collect::<Option<Vec<f64>>>()
        else {
            return false;
        };
        if list {
            if vals.len() < 3 {
                return false;
            }
            for v in vals {
                self.bare.push((None, v, None, self.ts));
            }
            return true;
        }
        if vals.len() < 2 {
            return false;
        }
        self.bare_lines += 1;
        self.bare_run.clone_from(&vals);
        let counted = vals.len() > 2 && !cells[0].contains(['.', 'e', 'E']);
        let (step, vals) = if counted {
            (cells[0].parse::<u64>().ok(), &vals[1..])
        } else {
            (None, &vals[..])
        };
        self.bare.push((step, vals[0], None, self.ts));
        for (k, &v) in vals.iter().enumerate().skip(1) {
            if self.bare_cols.len() < k {
                self.bare_cols.resize_with(k, Bare::default);
            }
            self.bare_cols[k - 1].push((step, v, None, self.ts));
        }
        true
    }

    /// Readings posted in a row on one line (`gean_0 (jemalloc)  351 → 410 → 357 MB`, `RSS
    /// across 6 cycles: 293.2, 293.3, 293.3 MB`): three or more numbers joined by arrows, or by
    /// `, ` / `;` with a unit after the last (`1,234,567` is one number). Kept aside like bare
    /// numbers, each read in the unit printed after the last.
    fn inline_run(&mut self, line: &str) -> bool {
        if !(line.contains('→')
            || line.contains("->")
            || line.contains("=>")
            || line.contains(',')
            || line.contains(';'))
        {
            return false;
        }
        let Some(m) = pats().inline_run.captures(line) else {
            return false;
        };
        let run = &m[1];
        let arrows = run.contains('→') || run.contains("->") || run.contains("=>");
        let unit = m.get(2).and_then(|u| unit_scale(u.as_str()));
        if !arrows && unit.is_none() {
            return false;
        }
        let vals: Vec<f64> = run
            .split(['→', ',', ';', '>', '='])
            .map(|x| x.trim().trim_end_matches('-').trim())
            .filter(|x| !x.is_empty())
            .filter_map(number)
            .collect();
        if vals.len() < 3 {
            return false;
        }
        for v in vals {
            self.bare.push((None, v, unit, self.ts));
        }
        true
    }

    /// The lines of bare numbers, as the input's one series (device 0), when it gave no other
    /// reading. The unit: printed on the lines, else the file name's, else guessed from the
    /// numbers' size and said in `source` (at least 10^8: bytes; 10^5: KiB, as `ps` prints RSS;
    /// below 1000 with decimals: GiB, as `psutil` readings divided by 10^9 are posted; else MiB,
    /// as nvidia-smi prints). The first column is the step when it rises at every line.
    fn flush_bare(&mut self, c: &mut Collected) {
        // One line of three or more numbers and no other bare line: readings posted in a row.
        if self.bare_lines == 1 && self.bare.rows.len() == 1 && self.bare_run.len() >= 3 {
            let ts = self.bare.rows[0].3;
            let run: Vec<BareRow> = self.bare_run.iter().map(|&v| (None, v, None, ts)).collect();
            self.bare.rows.clear();
            self.bare_cols.clear();
            self.flush_bare_column(c, "0", run);
            return;
        }
        let first = std::mem::take(&mut self.bare.rows);
        let more: Vec<Vec<BareRow>> = std::mem::take(&mut self.bare_cols)
            .into_iter()
            .map(|b| b.rows)
            .collect();
        for (k, rows) in std::iter::once(first).chain(more).enumerate() {
            let dev = if k == 0 {
                "0".to_string()
            } else {
                format!("0 (column {})", k + 1)
            };
            self.flush_bare_column(c, &dev, rows);
        }
    }

    fn flush_bare_column(&mut self, c: &mut Collected, dev: &str, rows: Vec<BareRow>) {
        if rows.len() < 3 {
            return;
        }
        let stepped =
            rows.iter().all(|r| r.0.is_some()) && rows.windows(2).all(|w| w[1].0 > w[0].0);
        let host = self.host.clone();
        self.push_held(c, &host, dev, rows, stepped, "lines of bare numbers");
    }

    /// Held readings into a device's series, in the unit [`Reader::guess_unit`] gives them all
    /// (a unit printed on a row wins for that row), named in the series' `source`; their first
    /// column is the step when `stepped`.
    fn push_held(
        &self,
        c: &mut Collected,
        host: &str,
        dev: &str,
        rows: Vec<BareRow>,
        stepped: bool,
        what: &str,
    ) {
        let (scale, said) = self.guess_unit(&rows);
        let source = format!("log: {what}, read as {said}");
        for (step, v, unit, ts) in rows {
            let b = v * unit.unwrap_or(scale);
            if !valid_bytes(b, None) {
                continue;
            }
            let sample = Sample {
                step: if stepped { step } else { None },
                ts,
                used: b as u64,
                limit: None,
                peak: None,
            };
            c.device(host, dev, &source).series.push_from(sample, None);
        }
    }

    /// A bare number (no unit after it or in its key) in the unit the file name gives.
    fn bare_in_named_unit(
        &self,
        num: &str,
        unit: Option<regex::Match<'_>>,
        key_unit: Option<regex::Match<'_>>,
    ) -> Option<u64> {
        if unit.is_some() || key_unit.is_some() {
            return None;
        }
        let b = number(num)? * self.name_unit()?;
        (b.is_finite() && b >= 0.0).then_some(b as u64)
    }

    fn dicts(&mut self, c: &mut Collected, line: &str, host: &str) -> bool {
        let p = pats();
        let mut any = false;
        let mut prev_end = 0;
        for m in p.dict.find_iter(line) {
            let body = m.as_str();
            let mut kv = BTreeMap::new();
            for k in p.kv.captures_iter(body) {
                if let Ok(v) = k[2].parse::<i64>() {
                    kv.insert(k[1].to_string(), v);
                }
            }
            let g = |k: &str| kv.get(k).copied().filter(|v| *v >= 0).map(|v| v as u64);
            let (used, limit, peak, fw) = if let Some(u) = g("bytes_in_use") {
                (u, g("bytes_limit"), g("peak_bytes_in_use"), Framework::Jax)
            } else if let Some(u) = g("bytes_used") {
                (
                    u,
                    g("bytes_limit"),
                    g("peak_bytes_used"),
                    Framework::PytorchXla,
                )
            } else if let (Some(t), Some(f)) = (g("kb_total"), g("kb_free")) {
                (
                    t.saturating_sub(f) * 1024,
                    Some(t * 1024),
                    None,
                    Framework::PytorchXla,
                )
            } else {
                prev_end = m.end();
                continue;
            };
            let prefix = &line[prev_end..m.start()];
            prev_end = m.end();
            let dev = p
                .dev_in_prefix
                .captures(prefix)
                .and_then(|d| d.get(1).or(d.get(2)).map(|x| x.as_str().to_string()))
                .or_else(|| p.dev_in_line.captures(line).map(|d| d[1].to_string()))
                .unwrap_or_else(|| "0".into());
            c.framework = c.framework.or(Some(fw));
            let source = if fw == Framework::Jax {
                "jax"
            } else {
                "torch_xla"
            };
            c.device(host, &dev, source).series.push_from(
                Sample {
                    step: self.step,
                    ts: self.ts,
                    used,
                    limit,
                    peak,
                },
                self.pid,
            );
            any = true;
        }
        any
    }
}

/// A metrics accumulator: `01m12s004ms551.902us` (seconds) or `37.50GB` (bytes) or a number.
pub fn parse_metric_value(v: &str) -> Option<f64> {
    let v = v.trim();
    let k = 1024f64;
    for (suf, mul) in [
        ("PB", k.powi(5)),
        ("TB", k.powi(4)),
        ("GB", k.powi(3)),
        ("MB", k * k),
        ("KB", k),
        ("B", 1.0),
    ] {
        if let Some(n) = v.strip_suffix(suf) {
            if let Ok(x) = n.trim().parse::<f64>() {
                return Some(x * mul);
            }
        }
    }
    if let Ok(x) = v.parse::<f64>() {
        return Some(x);
    }
    // Time: d, h, m, s, ms, us tokens.
    let mut total = 0.0;
    let mut rest = v;
    let mut any = false;
    while !rest.is_empty() {
        let n_end = rest.find(|ch: char| !(ch.is_ascii_digit() || ch == '.'))?;
        let num: f64 = rest[..n_end].parse().ok()?;
        let r = &rest[n_end..];
        let (mul, len) = if r.starts_with("ms") {
            (1e-3, 2)
        } else if r.starts_with("us") {
            (1e-6, 2)
        } else if r.starts_with("ns") {
            (1e-9, 2)
        } else if r.starts_with('d') {
            (86400.0, 1)
        } else if r.starts_with('h') {
            (3600.0, 1)
        } else if r.starts_with('m') {
            (60.0, 1)
        } else if r.starts_with('s') {
            (1.0, 1)
        } else {
            return None;
        };
        total += num * mul;
        any = true;
        rest = &r[len..];
    }
    any.then_some(total)
}

fn memchr_nl(b: &[u8]) -> Option<usize> {
    b.iter().position(|c| *c == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(parse_time("2026-11-21T10:00:00Z"), Some(1_795_255_200.0));
        assert_eq!(format_time(1_795_255_200.0), "2026-11-21T10:00:00Z");
        assert_eq!(
            parse_time("2026-11-21 12:00:00+02:00"),
            Some(1_795_255_200.0)
        );
    }

    #[test]
    fn metric_values() {
        assert!(
            (parse_metric_value("01m12s004ms551.902us").unwrap_or(0.0) - 72.004_551_902).abs()
                < 1e-6
        );
        assert_eq!(parse_metric_value("1.00KB"), Some(1024.0));
    }

    #[test]
    fn cpu_is_host_memory_only_with_a_unit() {
        let mut c = Collected::default();
        let mut r = Reader::new("", "train.log");
        r.feed(&mut c, b"epoch 1 CPU: 45 load\nepoch 2 CPU: 955.15 MB\n");
        r.finish(&mut c);
        assert_eq!(c.hosts[""].rss.total_samples, 1);
        // A row of numbers is a table's only when its cells are all numbers.
        assert_eq!(spaced_row("  10    22.0G    +1.5G").len(), 1);
        assert!(spaced_row("v4 8G").is_empty());
        assert!(spaced_row("2024 10 5").is_empty());
    }

    #[test]
    fn log_and_dicts() {
        let mut c = Collected::default();
        let mut r = Reader::new("", "train.log");
        let text = "2026-01-01 00:00:00 step 10 loss 1.0 hbm 12.5GiB / 16GiB\n\
                    step 20 {0: {'bytes_in_use': 100, 'bytes_limit': 1000}, 1: {'bytes_in_use': 200, 'bytes_limit': 1000}}\n\
                    {'bytes_used': 290816, 'bytes_limit': 34088157184, 'peak_bytes_used': 500816}\n\
                    rss: 3.5G\n";
        r.feed(&mut c, text.as_bytes());
        r.finish(&mut c);
        let d0 = &c.devices[&(String::new(), "0".to_string())];
        assert_eq!(d0.series.total_samples, 3);
        let d1 = &c.devices[&(String::new(), "1".to_string())];
        assert_eq!(
            d1.series.settled().current().map(|s| s.last_used),
            Some(200)
        );
        assert_eq!(c.hosts[""].rss.total_samples, 1);
    }

    #[test]
    fn nvidia_smi_and_wandb_exports() {
        let mut c = Collected::default();
        let mut r = Reader::new("", "gpu.csv");
        let text = "timestamp, index, name, memory.used [MiB], memory.total [MiB]\n\
                    2024/05/01 12:00:00.000, 0, NVIDIA H100 80GB HBM3, 1000 MiB, 81559 MiB\n\
                    2024/05/01 12:00:01.000, 1, NVIDIA H100 80GB HBM3, 2000 MiB, 81559 MiB\n";
        r.feed(&mut c, text.as_bytes());
        r.finish(&mut c);
        let d1 = &c.devices[&(String::new(), "1".to_string())];
        assert_eq!(
            d1.series.settled().current().map(|s| s.last_used),
            Some(2000 << 20)
        );
        assert_eq!(
            parse_time("2024/05/01 12:00:01.000"),
            parse_time("2024-05-01T12:00:01Z")
        );
        let mut c = Collected::default();
        let mut r = Reader::new("", "export.csv");
        let text = "\"Step\",\"run-1 - system/gpu.0.memoryAllocatedBytes\"\n\"10\",\"1000000\"\n\"20\",\"2000000\"\n";
        r.feed(&mut c, text.as_bytes());
        r.finish(&mut c);
        let d0 = &c.devices[&(String::new(), "0".to_string())];
        assert_eq!(d0.series.total_samples, 2);
    }

    #[test]
    fn nvidia_smi_tables() {
        let mut c = Collected::default();
        let mut r = Reader::new("", "watch.log");
        let table = |t: &str, used: u32| {
            format!(
                "{t}\n\
+-----------------------------------------------------------------------------------------+\n\
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n\
|=========================================+========================+======================|\n\
|   1  NVIDIA H100 80GB HBM3          On  |   00000000:19:00.0 Off |                    0 |\n\
| N/A   34C    P0             70W /  700W |   {used}MiB /  81559MiB |      0%      Default |\n\
|    1   N/A  N/A     4242      C   python                                    {used}MiB |\n"
            )
        };
        let text =
            table("Wed Nov 27 09:00:00 2024", 1000) + &table("Wed Nov 27 09:00:05 2024", 3000);
        r.feed(&mut c, text.as_bytes());
        r.finish(&mut c);
        let d = &c.devices[&(String::new(), "1".to_string())];
        assert_eq!(d.series.total_samples, 2);
        assert_eq!(
            d.series.settled().current().map(|s| s.last_used),
            Some(3000 << 20)
        );
    }

    #[test]
    fn bare_numbers_and_keys() {
        let read = |text: &str, name: &str| {
            let mut c = Collected::default();
            let mut r = Reader::new("", name);
            r.feed(&mut c, text.as_bytes());
            r.finish(&mut c);
            c.devices
                .iter()
                .map(|((_, d), s)| {
                    let seg = s.series.settled();
                    let cur = seg.current().expect("a segment");
                    (
                        d.clone(),
                        s.series.total_samples,
                        cur.last_used,
                        s.source.clone().unwrap_or_default(),
                    )
                })
                .collect::<Vec<_>>()
        };
        // Readings in a row on one line: arrows, or `, ` with a unit after the last.
        let got = read("gean_0 (jemalloc)  351 → 410 → 357 → 455 MB\n", "x.log");
        assert_eq!((got[0].1, got[0].2), (4, 455 << 20));
        let got = read("   - **main**: `293.2, 293.3, 293.5 MB`\n", "x.log");
        assert_eq!(got[0].1, 3);
        assert!(read("sizes 1,234,567 and 2, 3, 4 items\n", "x.log").is_empty());
        // Sizes under keys no pattern knows, when nothing else is read: one series per key.
        let got = read(
            "mbiu: 255 MB, bui: 1 MB\nmbiu: 3766 MB, bui: 1 MB\n",
            "x.log",
        );
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].0.as_str(), got[0].2), ("0", 3766 << 20));
        assert_eq!(got[1].0, "0 (bui)");
        // A size before `in use`; a cumulative counter beside it is not read.
        let got = read(
            "(1024 MB allocated cumulatively, 14 MB currently in use)\n(2048 MB allocated cumulatively, 15 MB currently in use)\n",
            "x.log",
        );
        assert_eq!((got.len(), got[0].2), (1, 15 << 20));
        // `ps aux`: one series per process, RSS in KiB.
        let got = read(
            "USER  PID %CPU %MEM    VSZ   RSS TTY STAT START TIME COMMAND\nroot 1166 6.2 0.5 68235476 5179612 ? RNl 17:36 0:36 ray::Worker\n\nUSER  PID %CPU %MEM    VSZ   RSS TTY STAT START TIME COMMAND\nroot 1166 3.4 0.6 69346516 6284616 ? SNl 17:36 4:57 ray::Worker\n",
            "x.log",
        );
        assert_eq!(
            (got[0].0.as_str(), got[0].1, got[0].2),
            ("pid 1166", 2, 6284616 << 10)
        );
        // A list of sized values; a markdown table's sized cells, by column.
        let got = read(
            "samples=['27310.0 MiB', '27310.0 MiB', '27312.0 MiB']\n",
            "x.log",
        );
        assert_eq!((got[0].1, got[0].2), (3, 27312 << 20));
        let got = read(
            "| | RSS | Δ |\n|---|---|---|\n| pre-load | 16 MB | |\n| t+60 | 144.0 MB | +93.1 |\n| t+120 | **1,197 MB** | +53.3 |\n",
            "x.log",
        );
        assert_eq!((got.len(), got[0].1, got[0].2), (1, 3, 1197 << 20));
        // The step said after the key: `Memory usage after 3 prediction(s): 349 MiB`.
        let got = read(
            "Memory usage after 0 prediction(s): 306.6 MiB\nMemory usage after 1 prediction(s): 328.2 MiB\n",
            "x.log",
        );
        assert_eq!(got[0].1, 2);
        // `<epoch> <memory>` with no unit: MiB by their size, the first column the step.
        let got = read("0 4194\n1 4280\n2 4376\n3 4439\n", "posted.log");
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].1, got[0].2), (4, 4439 << 20));
        assert!(got[0].3.contains("MiB, by their size"), "{}", got[0].3);
        // One number per line with decimals below 1000: GiB; a unit in the file name wins.
        let got = read("7.07\n9.06\n10.37\n", "x.log");
        assert_eq!(got[0].2, (10.37 * (1u64 << 30) as f64) as u64);
        let got = read("7.07\n9.06\n10.37\n", "x_mb.log");
        assert_eq!(got[0].2, (10.37 * (1u64 << 20) as f64) as u64);
        // Bare numbers are not read beside real readings.
        let got = read("memory: 3 GiB\n12\n13\n14\nmemory: 4 GiB\n", "x.log");
        assert_eq!((got[0].1, got[0].2), (2, 4 << 30));
        // A named counter before the number: the step.
        let got = read("i=0: 99.24\ni=100: 99.27\ni=200: 99.28\n", "x.log");
        assert_eq!(
            (got[0].1, got[0].2),
            (3, (99.28 * (1u64 << 30) as f64) as u64)
        );
        // Several numbers a line: series side by side; a list printed whole: readings in turn.
        let got = read("450.2 1528.8\n457.8 1527.9\n709.8 1776.9\n", "x.log");
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[1].0, "0 (column 2)");
        assert_eq!(got[1].2, (1776.9 * (1u64 << 20) as f64) as u64);
        let got = read("[1767284, 2520072, 3146460, 3772900]\n", "x.log");
        assert_eq!((got[0].1, got[0].2), (4, 3_772_900 * 1024));
        // A percentage is not a size; nvidia-smi's `used / total` cell is, with its limit.
        let got = read("RAM: 8.6%\nRAM: 9.0%\nRAM: 9.2%\n", "x.log");
        assert!(got.is_empty(), "{got:?}");
        let got = read(
            "| 1 | 9713MiB/12196MiB |\n| 2 | 10845MiB/12196MiB |\n",
            "x.log",
        );
        assert_eq!((got[0].1, got[0].2), (2, 10845 << 20));
        // A fraction after a key that names bytes was divided by the user: GiB by its size.
        let got = read("memory_allocated: 0.25\nmemory_allocated: 0.5\n", "x.log");
        assert_eq!(got[0].2, 1 << 29);
        assert!(got[0].3.contains("GiB, by their size"), "{}", got[0].3);
        // `memory growth (kb)` is a reading; a summary under another key is its own series.
        let got = read(
            "n=100 memory growth (kb): 2,336,028\nn=200 memory growth (kb): 4,057,764\nmemory (kb): 240,096 initial\n",
            "x.log",
        );
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!((got[0].1, got[0].2), (2, 4_057_764 * 1024));
        assert_eq!(got[1].0, "0 (memory)");
    }

    #[test]
    fn training_frameworks_memory_lines() {
        let cases: [(&str, u64, Option<u64>); 4] = [
            (
                "2024-05-01 12:00:00,123 - mmdet - INFO - Epoch [2][50/1000]\tlr: 1.000e-02, eta: 1:23:45, time: 0.345, data_time: 0.012, memory: 3456, loss: 1.2345\n",
                3456 << 20,
                Some(1050),
            ),
            (
                "[05/01 12:00:00 d2.utils.events]:  eta: 1:23:45  iter: 19  total_loss: 1.234  lr: 0.02  max_mem: 2345M\n",
                2345 << 20,
                Some(19),
            ),
            (
                "[2024-05-01 12:00:00,000] [INFO] [utils.py:803:see_memory_usage] MA 12.5 GB         Max_MA 13.45 GB         CA 14.0 GB         Max_CA 15 GB \n",
                (12.5 * (1u64 << 30) as f64) as u64,
                None,
            ),
            (
                "[Rank 0] (after 10 iterations) memory (MB) | allocated: 1024.0 | max allocated: 2048.0 | reserved: 3000.0 | max reserved: 3000.0\n",
                1 << 30,
                None,
            ),
        ];
        for (line, used, step) in cases {
            let mut c = Collected::default();
            let mut r = Reader::new("", "train.log");
            r.feed(&mut c, line.as_bytes());
            let seen_step = r.step;
            r.finish(&mut c);
            let s = c
                .devices
                .values()
                .next()
                .and_then(|d| d.series.settled().current().map(|s| s.last_used));
            assert_eq!(s, Some(used), "{line}");
            if step.is_some() {
                assert_eq!(seen_step, step, "{line}");
            }
        }
    }
}
