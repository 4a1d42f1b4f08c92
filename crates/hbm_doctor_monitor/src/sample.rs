//! What a source reports: device samples, host samples, events, and the snapshot built from them.
//!
//! A [`DeviceSample`] serialises to the device object of contract.md "JSON of `top --once`"
//! (plus optional extra fields), and to the `sample` line of a recording (docs/recording.md).

use serde::{Deserialize, Serialize};

/// Where a device figure comes from (contract.md: `libtpu | nvml | jax | torch_xla | metrics_file`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// libtpu's runtime metrics gRPC service.
    Libtpu,
    /// NVIDIA's management library.
    Nvml,
    /// `jax.Device.memory_stats()` through the in-process hook.
    Jax,
    /// `torch_xla` `xm.get_memory_info()` through the in-process hook.
    TorchXla,
    /// PyTorch/XLA `XLA_METRICS_FILE` reports.
    MetricsFile,
}

impl SourceKind {
    /// The contract's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Libtpu => "libtpu",
            SourceKind::Nvml => "nvml",
            SourceKind::Jax => "jax",
            SourceKind::TorchXla => "torch_xla",
            SourceKind::MetricsFile => "metrics_file",
        }
    }
}

/// One device's memory at one time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceSample {
    /// The device id as the source names it (libtpu's runtime id, NVML index, JAX `Device.id`).
    pub id: String,
    /// `tpu`, `gpu` or `cpu`.
    pub accelerator: String,
    /// The device kind as JAX names it (`TPU v5 lite`) or the GPU's product name.
    pub kind: Option<String>,
    /// Where the figures come from.
    pub source: SourceKind,
    /// Bytes in use.
    pub used_bytes: Option<u64>,
    /// Capacity or allocator limit.
    pub limit_bytes: Option<u64>,
    /// The process's high-water mark, when the source reports one (never a guess).
    pub peak_bytes: Option<u64>,
    /// The owning process, when known.
    pub pid: Option<u32>,
    /// Short chip name for labels (`v5e`, `h100`); not in the contract's JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chip_type: Option<String>,
    /// Largest free block (fragmentation), from JAX `memory_stats()`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_free_block_bytes: Option<u64>,
    /// TensorCore duty cycle in percent (libtpu) or GPU utilisation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duty_cycle_percent: Option<f64>,
    /// Training step of the sample (in-process hook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Where the source was reached (`127.0.0.1:8431`, a file path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Unix time of the measurement in seconds, when it differs from the snapshot's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts: Option<f64>,
}

impl DeviceSample {
    /// A sample with only the identity set.
    pub fn new(id: impl Into<String>, accelerator: &str, source: SourceKind) -> Self {
        DeviceSample {
            id: id.into(),
            accelerator: accelerator.to_string(),
            kind: None,
            source,
            used_bytes: None,
            limit_bytes: None,
            peak_bytes: None,
            pid: None,
            chip_type: None,
            largest_free_block_bytes: None,
            duty_cycle_percent: None,
            step: None,
            endpoint: None,
            ts: None,
        }
    }

    /// The key that tells series apart: source, endpoint and device id.
    pub fn key(&self) -> DeviceKey {
        DeviceKey {
            source: self.source,
            endpoint: self.endpoint.clone().unwrap_or_default(),
            id: self.id.clone(),
        }
    }
}

/// Identity of one series in a monitor.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceKey {
    /// The source.
    pub source: SourceKind,
    /// Port or file the source was read from ("" when there is one).
    pub endpoint: String,
    /// Device id.
    pub id: String,
}

/// The trainer process as the host sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessSample {
    /// Process id.
    pub pid: u32,
    /// Command name (`/proc/PID/comm`).
    pub comm: Option<String>,
    /// Resident set size (`VmRSS`), bytes.
    pub rss_bytes: Option<u64>,
    /// Peak resident set size (`VmHWM`), bytes.
    pub rss_peak_bytes: Option<u64>,
    /// Whether the process was still running.
    pub alive: bool,
}

/// PyTorch/XLA counters from `XLA_METRICS_FILE`: cumulative since the process started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct XlaCounters {
    /// The step of the last report (`[MetricsData; step=N]`).
    pub step: Option<u64>,
    /// `UncachedCompile`: graphs compiled; rising after warm-up means recompilation.
    pub uncached_compiles: Option<u64>,
    /// `CachedCompile`.
    pub cached_compiles: Option<u64>,
    /// `CreateDataHandles - DestroyDataHandles`: device buffers alive.
    pub live_data_handles: Option<i64>,
    /// `CreateXlaTensor - DestroyXlaTensor`: XLA tensors alive on the Python side.
    pub live_xla_tensors: Option<i64>,
    /// The file read.
    pub path: String,
}

/// Something that happened, recorded beside the samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A source started answering (first time, or after the trainer restarted).
    SourceUp {
        /// `libtpu 127.0.0.1:8431`, `nvml`, a file path.
        source: String,
    },
    /// A source stopped answering (the trainer died or restarted).
    SourceDown {
        /// As in `SourceUp`.
        source: String,
        /// What the error said.
        reason: String,
    },
    /// The watched process is gone.
    ProcessExit {
        /// Its pid.
        pid: u32,
        /// True when the kernel log names it as killed by the OOM killer (host RAM, not HBM).
        host_oom_killed: bool,
        /// Its last resident set size, bytes.
        last_rss_bytes: Option<u64>,
    },
    /// A kernel OOM-killer line.
    KernelOom {
        /// The pid the kernel killed, when the line names one.
        pid: Option<u32>,
        /// The line as the kernel wrote it.
        line: String,
    },
    /// The recorder could not write for a while (a full disk): records beyond what it could hold
    /// in memory were lost.
    RecordsLost {
        /// How many records (lines) were lost.
        count: u64,
        /// The write error.
        reason: String,
    },
}

/// Everything one sampling round produced.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    /// Device samples (a file source may return several per device).
    pub devices: Vec<DeviceSample>,
    /// PyTorch/XLA counters.
    pub counters: Vec<XlaCounters>,
    /// Events.
    pub events: Vec<Event>,
}
