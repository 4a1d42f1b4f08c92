//! The hook a leak detector plugs into. Until one lands, [`NoTrend`] reports nothing and the
//! `trend` field of `top` stays `null`.

use crate::sample::DeviceKey;

/// What a trend detector says about one device, in the forms its consumers need.
#[derive(Debug, Clone, PartialEq)]
pub struct TrendView {
    /// The per-device object of contract.md "JSON of `trend`", for `top --format json`.
    pub json: serde_json::Value,
    /// Slope of the floor, bytes per second (exporter `..._trend_bytes_per_second`).
    pub bytes_per_second: Option<f64>,
    /// Seconds until the ceiling reaches the limit, when growth is significant.
    pub oom_eta_seconds: Option<f64>,
    /// One of `ok`, `warming_up`, `step_change`, `leak_suspected`, `leak` (exporter stateset).
    pub leak_state: Option<&'static str>,
    /// A line for the TUI when an OOM is predicted.
    pub warning: Option<String>,
}

/// Fed every sample; asked for a view when a snapshot is shown or exported.
pub trait TrendHook: Send {
    /// One observation of a device.
    fn observe(
        &mut self,
        key: &DeviceKey,
        ts: f64,
        used_bytes: u64,
        limit_bytes: Option<u64>,
        step: Option<u64>,
    );
    /// The current view of a device, if the detector has one.
    fn view(&self, key: &DeviceKey) -> Option<TrendView>;
}

/// No detector: every view is `None`.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoTrend;

impl TrendHook for NoTrend {
    fn observe(&mut self, _: &DeviceKey, _: f64, _: u64, _: Option<u64>, _: Option<u64>) {}
    fn view(&self, _: &DeviceKey) -> Option<TrendView> {
        None
    }
}
