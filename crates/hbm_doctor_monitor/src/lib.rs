//! Live device memory for hbm-doctor: sources, history, recording, exporter and terminal UI.
//!
//! A [`Source`] reports device memory: libtpu's runtime metrics gRPC service
//! ([`libtpu::LibtpuSource`]), NVML ([`nvml::NvmlSource`]), the in-process Python hook's JSON
//! lines ([`inprocess::InProcessSource`]) and PyTorch/XLA's `XLA_METRICS_FILE`
//! ([`metrics_file::MetricsFileSource`]). A [`Monitor`] polls them once per round, watches the
//! trainer's RSS and the kernel's OOM killer ([`host`]), keeps [`history::History`] per device,
//! asks the [`trend::TrendHook`] for a forecast, and returns a [`Snapshot`]. Consumers:
//! [`json`] (`top --format json`), [`recording`] (`record`), [`exporter`] (`exporter`), and the
//! TUI ([`tui`], feature `tui`).
//!
//! Heavy dependencies sit behind features (`libtpu`: tokio/tonic/prost; `nvml`; `tui`:
//! ratatui/crossterm) so that a reader of recordings can depend on this crate without them.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod exporter;
#[cfg(feature = "libtpu")]
pub mod grpc;
pub mod history;
pub mod host;
pub mod inprocess;
pub mod json;
#[cfg(feature = "libtpu")]
pub mod libtpu;
pub mod metrics_file;
pub mod monitor;
#[cfg(feature = "nvml")]
pub mod nvml;
#[cfg(feature = "libtpu")]
pub mod proto;
pub mod recording;
pub mod sample;
pub mod source;
pub mod tail;
pub mod trend;
#[cfg(feature = "tui")]
pub mod tui;

pub use monitor::{DeviceView, Monitor, MonitorConfig, Snapshot};
pub use sample::{DeviceSample, Event, SourceKind};
pub use source::{Source, SourceError};
