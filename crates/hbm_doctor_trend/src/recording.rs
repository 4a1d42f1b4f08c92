//! The recording format (docs/recording.md), modelled once: `hbm-doctor record` and the monitor
//! write these types, the monitor reads them back (`hbm_doctor_monitor::recording::read`, the
//! in-process hook's lines) and `trend` reads recordings through them. A [`DeviceSample`] is
//! also the device object of contract.md "JSON of `top --once`".
//!
//! Readers ignore unknown fields, and tolerate what other writers leave out where a default
//! means the same (a header's `time` and `version`, a sample's `accelerator`); a device `id` may
//! be a JSON number.

use serde::{Deserialize, Deserializer, Serialize};

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
    /// The device id as the source names it (libtpu's runtime id, NVML index, JAX `Device.id`);
    /// read from a JSON string or number.
    #[serde(deserialize_with = "id_string")]
    pub id: String,
    /// `tpu`, `gpu` or `cpu`.
    #[serde(default)]
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

/// A device id written as a string (`"0"`) or a number (`0`).
fn id_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Id {
        S(String),
        N(serde_json::Number),
    }
    Ok(match Id::deserialize(d)? {
        Id::S(s) => s,
        Id::N(n) => n.to_string(),
    })
}

/// The value of `format` in a header line.
pub const FORMAT: &str = "hbm-doctor-recording";
/// The schema version of the lines.
pub const SCHEMA_VERSION: u32 = 1;

/// One line of a recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// First line of every file (and of every restart of the recorder appending to it).
    Header {
        /// `hbm-doctor-recording`.
        format: String,
        /// Schema version of the lines.
        schema_version: u32,
        /// The host recorded.
        host: String,
        /// Unix time the file (or this run of the recorder) started.
        ts: f64,
        /// The same as RFC 3339 (absent from lines other writers made).
        #[serde(default)]
        time: String,
        /// hbm-doctor's version (likewise).
        #[serde(default)]
        version: String,
        /// Sampling interval, seconds.
        #[serde(default)]
        interval_seconds: Option<f64>,
        /// The process watched, if any.
        #[serde(default)]
        pid: Option<u32>,
        /// The sources configured.
        #[serde(default)]
        sources: Vec<String>,
    },
    /// One device's figures (`ts` is inside the device object).
    Sample {
        /// Host name.
        #[serde(default)]
        host: Option<String>,
        /// The figures.
        #[serde(flatten)]
        device: DeviceSample,
    },
    /// The trainer's RSS.
    Process {
        /// Unix time.
        ts: f64,
        /// Host name.
        #[serde(default)]
        host: Option<String>,
        /// The figures.
        #[serde(flatten)]
        process: ProcessSample,
    },
    /// PyTorch/XLA counters.
    Counters {
        /// Unix time.
        ts: f64,
        /// Host name.
        #[serde(default)]
        host: Option<String>,
        /// The counters.
        #[serde(flatten)]
        counters: XlaCounters,
    },
    /// Something that happened.
    Event {
        /// Unix time.
        ts: f64,
        /// Host name.
        #[serde(default)]
        host: Option<String>,
        /// What.
        #[serde(flatten)]
        event: Event,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_writers_write() {
        let r: Record = serde_json::from_str(
            r#"{"type":"sample","host":"h","id":3,"accelerator":"tpu","source":"jax","used_bytes":5,"limit_bytes":null,"peak_bytes":null,"pid":null,"ts":1.5}"#,
        )
        .expect("sample");
        let Record::Sample { device, .. } = r else {
            panic!("sample")
        };
        assert_eq!((device.id.as_str(), device.used_bytes), ("3", Some(5)));
        let h: Record = serde_json::from_str(
            r#"{"type": "header", "format": "hbm-doctor-recording", "schema_version": 1, "host": "cpu-0", "ts": 1795255200.0}"#,
        )
        .expect("header without time and version");
        assert!(matches!(h, Record::Header { .. }));
        let back = serde_json::to_string(&Record::Sample {
            host: None,
            device: DeviceSample::new("0", "tpu", SourceKind::Libtpu),
        })
        .expect("json");
        assert!(back.contains(r#""id":"0""#), "{back}");
    }
}
