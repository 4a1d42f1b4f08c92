//! Command-line definition (clap derive). Global options are flattened into every subcommand.

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use hbm_doctor_analysis::analyze::AnalyzeOptions;
use hbm_doctor_monitor::{Monitor, MonitorConfig};
use hbm_doctor_render::{Format, Style};
use std::io::IsTerminal;
use std::path::PathBuf;

/// Why did your XLA program run out of accelerator memory, and what should you change?
#[derive(Debug, Parser)]
#[command(name = "hbm-doctor", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
    /// Options every command takes.
    #[command(flatten)]
    pub global: GlobalArgs,
}

/// Options every command takes.
#[derive(Debug, Args, Clone)]
pub struct GlobalArgs {
    /// When to use colour: auto honours NO_COLOR, TERM=dumb and a non-terminal stdout.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto, global = true)]
    pub color: ColorChoice,
}

impl GlobalArgs {
    /// The style of a command's view on stdout: colour only for the human format, as `--color`
    /// says.
    pub fn style(&self, format: OutputFormat) -> Style {
        Style::new(format == OutputFormat::Human && self.color.resolve_stdout())
    }
}

/// `--color`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ColorChoice {
    /// Colour when writing to a terminal and NO_COLOR is unset.
    Auto,
    /// Always colour.
    Always,
    /// Never colour.
    Never,
}

impl ColorChoice {
    fn resolve(self, is_tty: bool) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                let forced = ["FORCE_COLOR", "CLICOLOR_FORCE"]
                    .iter()
                    .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty() && x != "0"));
                if forced {
                    return true;
                }
                let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
                let dumb = std::env::var("TERM").is_ok_and(|t| t == "dumb");
                is_tty && !no_color && !dumb
            }
        }
    }
    /// Colour for stdout.
    pub fn resolve_stdout(self) -> bool {
        self.resolve(std::io::stdout().is_terminal())
    }
    /// Colour for stderr.
    pub fn resolve_stderr(self) -> bool {
        self.resolve(std::io::stderr().is_terminal())
    }
}

/// Output format.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum OutputFormat {
    /// For people, in a terminal.
    Human,
    /// The JSON contract (docs/json-schema.md).
    Json,
    /// Markdown, to paste in an issue.
    Markdown,
}

impl OutputFormat {
    /// The renderer's format.
    pub fn render(self) -> Format {
        match self {
            OutputFormat::Human => Format::Human,
            OutputFormat::Json => Format::Json,
            OutputFormat::Markdown => Format::Markdown,
        }
    }
}

/// Where device memory is read from (shared by `top`, `record`, `exporter`).
#[derive(Debug, Args, Clone)]
pub struct SourceArgs {
    /// The training process: its RSS is recorded and its exit is checked against the kernel's
    /// OOM killer; its environment names the libtpu ports (TPU_RUNTIME_METRICS_PORTS), the hook
    /// file (HBM_DOCTOR_SAMPLES) and XLA_METRICS_FILE.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// libtpu runtime-metrics ports on loopback, comma-separated [default: the trainer's
    /// TPU_RUNTIME_METRICS_PORTS, else 8431-8438].
    #[arg(long, value_delimiter = ',', value_name = "PORTS")]
    pub ports: Option<Vec<u16>>,
    /// Address of the libtpu metrics service.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1",
        hide_default_value = true
    )]
    pub libtpu_host: String,
    /// Do not query libtpu.
    #[arg(long)]
    pub no_libtpu: bool,
    /// Do not load NVML (NVIDIA GPUs).
    #[arg(long)]
    pub no_nvml: bool,
    /// JSON-lines file written by the in-process hook (`hbm_doctor.sampler`).
    #[arg(long, value_name = "FILE")]
    pub samples: Option<PathBuf>,
    /// PyTorch/XLA XLA_METRICS_FILE to follow (compile and live-buffer counters).
    #[arg(long, value_name = "FILE")]
    pub metrics_file: Option<PathBuf>,
}

impl SourceArgs {
    /// The monitor these options describe.
    pub fn monitor(&self) -> Result<Monitor> {
        let cfg = MonitorConfig {
            pid: self.pid,
            ports: self.ports.clone(),
            libtpu_host: Some(self.libtpu_host.clone()),
            no_libtpu: self.no_libtpu,
            no_nvml: self.no_nvml,
            samples: self.samples.clone(),
            metrics_file: self.metrics_file.clone(),
            kernel_log: self.pid.is_some(),
        };
        let mut monitor = Monitor::from_config(&cfg)?;
        // The leak detector of `hbm-doctor trend`, live: top's warning line, the exporter's trend
        // families and the JSON `trend` object come from it.
        monitor.set_trend_hook(Box::new(crate::commands::trend::LiveTrend::default()));
        Ok(monitor)
    }
}

/// The memory a program must fit in (`analyze`, `view`).
#[derive(Debug, Args, Clone, Default)]
pub struct BudgetArgs {
    /// Memory the program must fit in, per device (e.g. 16G, 15.75GiB, 17179869184): `analyze`
    /// exits 1 if it does not fit, `view` draws it as the limit.
    #[arg(long, value_name = "BYTES", conflicts_with = "target")]
    pub budget: Option<String>,
    /// A device's usable HBM as the budget: v4, v5e, v5p, v6e, v7...
    #[arg(long, value_name = "GEN")]
    pub target: Option<String>,
}

impl BudgetArgs {
    /// The analysis options these flags set.
    pub fn options(&self) -> Result<AnalyzeOptions> {
        budget_options(self.budget.as_deref(), self.target.as_deref())
    }
}

/// The budget of `--budget BYTES` or `--target GEN`.
pub fn budget_options(budget: Option<&str>, target: Option<&str>) -> Result<AnalyzeOptions> {
    let mut opts = AnalyzeOptions::default();
    if let Some(b) = budget {
        let Some(bytes) = hbm_doctor_log::parse_size(b).filter(|&x| x > 0) else {
            bail!("cannot read --budget `{b}`: give bytes or a size such as 16G, 15.75GiB or 17179869184");
        };
        opts.budget_bytes = Some(bytes);
    }
    if let Some(t) = target {
        let Some(chip) = hbm_doctor_analysis::chips::tpu_by_name(t) else {
            bail!("unknown --target `{t}`: use v4, v5e, v5p, v6e or v7, or give --budget BYTES");
        };
        opts.budget_bytes = Some(chip.usable_bytes);
        opts.target = Some(chip.name.to_string());
    }
    Ok(opts)
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Find every out-of-memory event in an error message or a whole log, classify it, and say
    /// what to change.
    Explain(ExplainArgs),
    /// Padded vs unpadded bytes of a shape on TPU tiles, and the aligned shape that wastes nothing.
    Pad(PadArgs),
    /// Peak memory per memory space of an XLA dump, what is live at the peak, where it comes
    /// from in your source, and known waste (replication, debug prints, donation, padding...).
    Analyze(AnalyzeArgs),
    /// Live device memory per chip (libtpu, NVML, the in-process hook) with history: a terminal
    /// UI, or one snapshot (`--once`, `--format json`), or a stream (`--format json-lines`).
    Top(crate::commands::top::TopArgs),
    /// Record device memory, the trainer's RSS and OOM-killer events to a crash-safe JSON-lines
    /// file (docs/recording.md), rotated for runs of days.
    Record(crate::commands::record::RecordArgs),
    /// Serve device memory as Prometheus/OpenMetrics on `/metrics` (loopback by default).
    Exporter(crate::commands::exporter::ExporterArgs),
    /// Does a JAX program fit a TPU topology? Compiles it deviceless with the real TPU compiler
    /// (the `jax[tpu]` of your Python), measures the peak per chip, and with --try-fixes which fixes fit.
    Fit(crate::commands::fit::FitArgs),
    /// Tell a leak from a spike, a step or a sawtooth in recorded memory series (recordings,
    /// CSV, XLA_METRICS_FILE, logs), and forecast the step that will run out of memory.
    Trend(crate::commands::trend::TrendArgs),
    /// Write a self-contained offline HTML memory viewer of an XLA dump (chart, buffers at the
    /// peak, lifetimes, breakdown, diagnosis); `view BEFORE AFTER` shows what a change did.
    View(crate::commands::view::ViewArgs),
    /// The TPU chip table (usable HBM per device as the compiler counts it); for the Python
    /// package's `fit`, so Rust and Python read one table.
    #[command(hide = true)]
    Chips(ChipsArgs),
}

/// `hbm-doctor chips` (hidden).
#[derive(Debug, Args)]
pub struct ChipsArgs {
    /// Output format.
    #[arg(long, short = 'f', value_enum, default_value_t = OutputFormat::Human)]
    pub format: OutputFormat,
}

/// `hbm-doctor explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The log, traceback or message; `-` or nothing reads standard input. `.gz` is decompressed.
    pub file: Option<PathBuf>,
    /// Output format.
    #[arg(long, short = 'f', value_enum, default_value_t = OutputFormat::Human)]
    pub format: OutputFormat,
    /// The failing program's XLA dump directory (--xla_dump_to), to join its analysis.
    #[arg(long, value_name = "DIR")]
    pub dump: Option<PathBuf>,
    /// Evidence captured in the failing process (hbm_doctor.watch(), the excepthook; format in
    /// docs/evidence.md): live arrays and who holds them, allocator statistics, executables.
    #[arg(long, value_name = "FILE.json")]
    pub evidence: Option<PathBuf>,
}

/// `hbm-doctor pad`.
#[derive(Debug, Args)]
pub struct PadArgs {
    /// A shape as XLA prints it: `f32[129,1024]` or `bf16[3,1000]{1,0:T(8,128)(2,1)}`.
    pub shape: String,
    /// Output format.
    #[arg(long, short = 'f', value_enum, default_value_t = OutputFormat::Human)]
    pub format: OutputFormat,
}

/// `hbm-doctor analyze`.
#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// An XLA dump directory (--xla_dump_to) or one file of it.
    pub path: PathBuf,
    /// Only modules whose name contains this.
    #[arg(long, value_name = "NAME")]
    pub module: Option<String>,
    /// The budget.
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Buffers to list per memory space.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Recompute the peak with one change applied, without recompiling: a detected cause
    /// (debug_print, optimizer_state_unsharded, replicated_tensor, no_remat, no_donation,
    /// f32_precision, batch_too_large, padding, large_activation), `bf16` or `shard-args:N`.
    /// Repeatable.
    #[arg(long = "what-if", value_name = "CHANGE")]
    pub what_if: Vec<String>,
    /// Output format.
    #[arg(long, short = 'f', value_enum, default_value_t = OutputFormat::Human)]
    pub format: OutputFormat,
}
