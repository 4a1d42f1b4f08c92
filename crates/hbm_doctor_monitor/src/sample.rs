//! What a source reports: device samples, host samples, events, and the snapshot built from them.
//!
//! A [`DeviceSample`] serialises to the device object of contract.md "JSON of `top --once`"
//! (plus optional extra fields), and to the `sample` line of a recording (docs/recording.md).

// The recording's types are modelled once, in `hbm_doctor_trend::recording`; these re-exports
// keep `hbm_doctor_monitor::sample::*` working.
pub use hbm_doctor_trend::recording::{
    DeviceKey, DeviceSample, Event, ProcessSample, SourceKind, XlaCounters,
};

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
