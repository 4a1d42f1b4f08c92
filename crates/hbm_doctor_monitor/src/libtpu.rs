//! The TPU source: libtpu's runtime metrics service on a loopback port of the trainer.
//!
//! libtpu serves `tpu.monitoring.runtime.RuntimeMetricService` inside the process that opened the
//! TPU (port 8431, or one port per process from `TPU_RUNTIME_METRICS_PORTS`). When that process
//! dies the service disappears with it; [`LibtpuSource::poll`] then fails with an "absent" error,
//! drops the channel, and connects again on a later round, which is how a restarted trainer is
//! picked up. Every call is time-boxed (connect 500 ms, request 1 s), plaintext HTTP/2 as the
//! other Rust clients do (monitoring.md §1.2).

use crate::grpc::RuntimeMetricClient;
use crate::host::{port_owner, tpu_chip, TpuChip};
use crate::proto::{names, ListSupportedMetricsRequest, MetricRequest};
use crate::sample::{DeviceSample, Reading, SourceKind};
use crate::source::{Source, SourceError};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;

/// Per device id: used, total, duty cycle.
type PerDevice = BTreeMap<i64, (Option<f64>, Option<f64>, Option<f64>)>;

const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// The ports to try when neither the user nor the trainer's environment names any.
pub const DEFAULT_PORTS: std::ops::RangeInclusive<u16> = 8431..=8438;

/// A single-threaded tokio runtime shared by every libtpu endpoint of a monitor.
pub fn runtime() -> std::io::Result<Arc<Runtime>> {
    Ok(Arc::new(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
    ))
}

/// One libtpu endpoint (`127.0.0.1:PORT`).
pub struct LibtpuSource {
    rt: Arc<Runtime>,
    host: String,
    port: u16,
    client: Option<RuntimeMetricClient>,
    supported: Option<HashSet<String>>,
    owner: Option<u32>,
    chip: Option<TpuChip>,
    /// A pid to report when the port's owner cannot be found (the `--pid` the user gave).
    pub fallback_pid: Option<u32>,
}

impl LibtpuSource {
    /// An endpoint on loopback; nothing is connected until the first poll.
    pub fn new(rt: Arc<Runtime>, port: u16) -> Self {
        Self::with_host(rt, "127.0.0.1", port)
    }

    /// An endpoint on another address (tests, or a tunnel the user set up).
    pub fn with_host(rt: Arc<Runtime>, host: &str, port: u16) -> Self {
        LibtpuSource {
            rt,
            host: host.to_string(),
            port,
            client: None,
            supported: None,
            owner: None,
            chip: tpu_chip(),
            fallback_pid: None,
        }
    }

    fn endpoint(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    fn disconnect(&mut self) {
        self.client = None;
        self.supported = None;
        self.owner = None;
    }

    async fn fetch(
        client: &mut RuntimeMetricClient,
        supported: &mut Option<HashSet<String>>,
    ) -> Result<PerDevice, tonic::Status> {
        if supported.is_none() {
            let req = ListSupportedMetricsRequest {
                filter: String::new(),
            };
            *supported =
                match tokio::time::timeout(REQUEST_TIMEOUT, client.list_supported_metrics(req))
                    .await
                {
                    Ok(Ok(resp)) => Some(
                        resp.supported_metric
                            .into_iter()
                            .map(|m| m.metric_name)
                            .collect(),
                    ),
                    // Older libtpu without the call: ask for everything and accept NOT_FOUND.
                    Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => Some(HashSet::new()),
                    Ok(Err(s)) => return Err(s),
                    Err(_) => {
                        return Err(tonic::Status::deadline_exceeded(
                            "ListSupportedMetrics timed out",
                        ))
                    }
                };
        }
        let listed = supported.as_ref().filter(|s| !s.is_empty());
        let mut per_device: PerDevice = BTreeMap::new();
        for (slot, name) in [names::HBM_USAGE, names::HBM_TOTAL, names::DUTY_CYCLE]
            .into_iter()
            .enumerate()
        {
            if listed.is_some_and(|s| !s.contains(name)) {
                continue;
            }
            let req = MetricRequest {
                metric_name: name.to_string(),
                skip_node_aggregation: false,
            };
            let resp =
                match tokio::time::timeout(REQUEST_TIMEOUT, client.get_runtime_metric(req)).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(s)) if s.code() == tonic::Code::NotFound => continue,
                    Ok(Err(s)) => return Err(s),
                    Err(_) => {
                        return Err(tonic::Status::deadline_exceeded(format!(
                            "{name} timed out"
                        )))
                    }
                };
            let metrics = resp.metric.map(|m| m.metrics).unwrap_or_default();
            for (i, m) in metrics.iter().enumerate() {
                let id = m.device_id().unwrap_or(i as i64);
                let entry = per_device.entry(id).or_default();
                let v = m.gauge_f64();
                match slot {
                    0 => entry.0 = v,
                    1 => entry.1 = v,
                    _ => entry.2 = v,
                }
            }
        }
        Ok(per_device)
    }
}

impl Source for LibtpuSource {
    fn name(&self) -> String {
        format!("libtpu {}", self.endpoint())
    }

    fn poll(&mut self, out: &mut Reading) -> Result<(), SourceError> {
        let endpoint = self.endpoint();
        if self.client.is_none() {
            let uri = format!("http://{endpoint}");
            let ep = tonic::transport::Endpoint::from_shared(uri)
                .map_err(|e| SourceError::failed(format!("libtpu: bad address {endpoint}: {e}")))?
                .connect_timeout(CONNECT_TIMEOUT)
                .timeout(REQUEST_TIMEOUT);
            let channel = self
                .rt
                .block_on(async { tokio::time::timeout(CONNECT_TIMEOUT * 2, ep.connect()).await })
                .map_err(|_| {
                    SourceError::absent(format!("libtpu: connecting to {endpoint} timed out"))
                })?
                .map_err(|_| {
                    SourceError::absent(format!("libtpu: nothing listening on {endpoint}"))
                })?;
            self.client = Some(RuntimeMetricClient::new(channel));
            self.owner = port_owner(self.port);
        }
        let Some(client) = self.client.as_mut() else {
            return Err(SourceError::absent("libtpu: not connected"));
        };
        let result = self.rt.block_on(Self::fetch(client, &mut self.supported));
        let per_device = match result {
            Ok(d) => d,
            Err(status) => {
                self.disconnect();
                let absent = matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown
                );
                let msg = format!(
                    "libtpu {endpoint}: {}",
                    status.message().lines().next().unwrap_or("unavailable")
                );
                return Err(if absent {
                    SourceError::absent(msg)
                } else {
                    SourceError::failed(msg)
                });
            }
        };
        if per_device.is_empty() {
            return Err(SourceError::absent(format!(
                "libtpu {endpoint}: no HBM metrics yet (is a program running on the TPU?)"
            )));
        }
        for (id, (used, total, duty)) in per_device {
            let mut s = DeviceSample::new(id.to_string(), "tpu", SourceKind::Libtpu);
            s.used_bytes = used.map(|v| v.max(0.0) as u64);
            s.limit_bytes = total.map(|v| v.max(0.0) as u64);
            s.duty_cycle_percent = duty;
            s.pid = self.owner.or(self.fallback_pid);
            s.endpoint = Some(endpoint.clone());
            if let Some(chip) = &self.chip {
                s.kind = Some(chip.kind.to_string());
                s.chip_type = Some(chip.chip_type.to_string());
            }
            out.devices.push(s);
        }
        Ok(())
    }
}
