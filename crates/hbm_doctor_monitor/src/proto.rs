//! Messages of libtpu's runtime metrics service (`tpu.monitoring.runtime`), written by hand.
//!
//! The field numbers and types restate the published `tpu_metric_service.proto` (tpu-info,
//! Apache-2.0; see monitoring.md §1.2.1). They are `prost` derive structs rather than generated
//! code so that building hbm-doctor needs no `protoc`. Unknown fields (e.g. the TPUz core states)
//! are skipped by prost when decoding.

#![allow(missing_docs)] // The fields are the proto's; their meaning is in monitoring.md §1.2.1.

use prost_types::Timestamp;

/// `MetricRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricRequest {
    #[prost(string, tag = "1")]
    pub metric_name: String,
    #[prost(bool, tag = "2")]
    pub skip_node_aggregation: bool,
}

/// `MetricResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricResponse {
    #[prost(message, optional, tag = "1")]
    pub metric: Option<TpuMetric>,
}

/// `ListSupportedMetricsRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListSupportedMetricsRequest {
    #[prost(string, tag = "1")]
    pub filter: String,
}

/// `ListSupportedMetricsResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListSupportedMetricsResponse {
    #[prost(message, repeated, tag = "1")]
    pub supported_metric: Vec<SupportedMetric>,
}

/// `SupportedMetric`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SupportedMetric {
    #[prost(string, tag = "1")]
    pub metric_name: String,
}

/// `GetTpuRuntimeStatusRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetTpuRuntimeStatusRequest {
    #[prost(bool, tag = "1")]
    pub include_hlo_info: bool,
}

/// `GetTpuRuntimeStatusResponse` (the `core_states` map is not decoded).
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetTpuRuntimeStatusResponse {
    #[prost(string, optional, tag = "1")]
    pub host_name: Option<String>,
}

/// `TPUMetric`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TpuMetric {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub description: String,
    #[prost(message, repeated, tag = "3")]
    pub metrics: Vec<Metric>,
}

/// `Metric`: one measurement with its attribute (the device id for per-device gauges).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metric {
    #[prost(message, optional, tag = "1")]
    pub attribute: Option<Attribute>,
    #[prost(message, optional, tag = "2")]
    pub timestamp: Option<Timestamp>,
    #[prost(message, optional, tag = "7")]
    pub start_timestamp: Option<Timestamp>,
    #[prost(oneof = "Measure", tags = "3, 4, 5, 6")]
    pub measure: Option<Measure>,
}

/// `Metric.measure`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Measure {
    #[prost(message, tag = "3")]
    Gauge(Gauge),
    #[prost(message, tag = "4")]
    Counter(Counter),
    #[prost(message, tag = "5")]
    Distribution(Distribution),
    #[prost(message, tag = "6")]
    Summary(Summary),
}

/// `Attribute`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Attribute {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AttrValue>,
}

/// `AttrValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttrValue {
    #[prost(oneof = "Attr", tags = "1, 2, 3, 4, 5, 6, 7")]
    pub attr: Option<Attr>,
}

/// `AttrValue.attr`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Attr {
    #[prost(string, tag = "1")]
    StringAttr(String),
    #[prost(bool, tag = "2")]
    BoolAttr(bool),
    #[prost(int64, tag = "3")]
    IntAttr(i64),
    #[prost(double, tag = "4")]
    DoubleAttr(f64),
    #[prost(message, tag = "5")]
    ArrayAttr(ArrayAttrValue),
    #[prost(message, tag = "6")]
    KvlistAttr(KeyValueList),
    #[prost(bytes, tag = "7")]
    BytesAttr(Vec<u8>),
}

/// `ArrayAttrValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ArrayAttrValue {
    #[prost(message, repeated, tag = "1")]
    pub attrs: Vec<AttrValue>,
}

/// `KeyValueList`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValueList {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<Attribute>,
}

/// `Gauge`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Gauge {
    #[prost(oneof = "GaugeValue", tags = "1, 2, 3, 4")]
    pub value: Option<GaugeValue>,
}

/// `Gauge.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum GaugeValue {
    #[prost(double, tag = "1")]
    AsDouble(f64),
    #[prost(int64, tag = "2")]
    AsInt(i64),
    #[prost(string, tag = "3")]
    AsString(String),
    #[prost(bool, tag = "4")]
    AsBool(bool),
}

/// `Counter`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Counter {
    #[prost(oneof = "CounterValue", tags = "1, 2")]
    pub value: Option<CounterValue>,
    #[prost(message, optional, tag = "3")]
    pub exemplar: Option<Exemplar>,
}

/// `Counter.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum CounterValue {
    #[prost(double, tag = "1")]
    AsDouble(f64),
    #[prost(uint64, tag = "2")]
    AsInt(u64),
}

/// `Exemplar`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Exemplar {
    #[prost(double, tag = "1")]
    pub value: f64,
    #[prost(message, optional, tag = "2")]
    pub timestamp: Option<Timestamp>,
    #[prost(message, repeated, tag = "3")]
    pub attributes: Vec<Attribute>,
}

/// `Quantile`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Quantile {
    #[prost(double, tag = "1")]
    pub quantile: f64,
    #[prost(double, tag = "2")]
    pub value: f64,
}

/// `Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    #[prost(uint64, tag = "1")]
    pub sample_count: u64,
    #[prost(double, tag = "2")]
    pub sample_sum: f64,
    #[prost(message, repeated, tag = "3")]
    pub quantile: Vec<Quantile>,
}

/// `Distribution` (bucket options are kept only as the explicit bounds and counts).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Distribution {
    #[prost(int64, tag = "1")]
    pub count: i64,
    #[prost(double, tag = "2")]
    pub mean: f64,
    #[prost(double, tag = "3")]
    pub min: f64,
    #[prost(double, tag = "4")]
    pub max: f64,
    #[prost(double, tag = "5")]
    pub sum_of_squared_deviation: f64,
    #[prost(int64, repeated, tag = "7")]
    pub bucket_counts: Vec<i64>,
    #[prost(message, repeated, tag = "8")]
    pub exemplars: Vec<Exemplar>,
}

/// libtpu's metric names used by the monitor (monitoring.md §1.3).
pub mod names {
    /// HBM bytes in use, per device (gauge `as_int`).
    pub const HBM_USAGE: &str = "tpu.runtime.hbm.memory.usage.bytes";
    /// HBM capacity, per device (gauge `as_int`).
    pub const HBM_TOTAL: &str = "tpu.runtime.hbm.memory.total.bytes";
    /// TensorCore duty cycle percent, per chip (per device on 7x) (gauge `as_double`).
    pub const DUTY_CYCLE: &str = "tpu.runtime.tensorcore.dutycycle.percent";
}

impl Metric {
    /// The device id this measurement belongs to: the `int_attr` of the attribute (tpu-info's
    /// rule), a numeric `string_attr`, or a `device_ordinal`/`device-id` entry of a kvlist.
    pub fn device_id(&self) -> Option<i64> {
        let value = self.attribute.as_ref()?.value.as_ref()?;
        attr_int(value)
    }

    /// The gauge as a number (`as_int` or `as_double`), if this is a numeric gauge.
    pub fn gauge_f64(&self) -> Option<f64> {
        match &self.measure {
            Some(Measure::Gauge(Gauge {
                value: Some(GaugeValue::AsInt(v)),
            })) => Some(*v as f64),
            Some(Measure::Gauge(Gauge {
                value: Some(GaugeValue::AsDouble(v)),
            })) => Some(*v),
            _ => None,
        }
    }
}

fn attr_int(value: &AttrValue) -> Option<i64> {
    match value.attr.as_ref()? {
        Attr::IntAttr(i) => Some(*i),
        Attr::StringAttr(s) => s.trim().parse().ok(),
        Attr::KvlistAttr(kv) => kv
            .attributes
            .iter()
            .find(|a| matches!(a.key.as_str(), "device_ordinal" | "device-id" | "device_id"))
            .and_then(|a| a.value.as_ref())
            .and_then(attr_int),
        _ => None,
    }
}
