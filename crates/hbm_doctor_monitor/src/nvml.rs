//! The GPU source: NVML through `nvml-wrapper`, which loads `libnvidia-ml.so.1` at run time, so
//! hbm-doctor builds and runs on machines without NVIDIA libraries.
//!
//! NVML's "used" is what the driver handed out: under JAX's default preallocation (75% of the
//! GPU) or PyTorch's caching allocator it is flat and says nothing about leaks. The in-process
//! hook is the truthful source there (monitoring.md §2, §5).

use crate::sample::{DeviceSample, Reading, SourceKind};
use crate::source::{Source, SourceError};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

/// NVIDIA GPUs on this host.
pub struct NvmlSource {
    nvml: Nvml,
    /// Restrict to this process's GPUs (and report its pid as owner).
    pub pid: Option<u32>,
}

/// What to tell the user when NVML cannot be loaded.
pub const NOT_FOUND: &str =
    "nvml: no NVIDIA driver library (libnvidia-ml.so.1) found; GPUs are not monitored";

impl NvmlSource {
    /// Loads NVML; the error says clearly that no NVIDIA library was found.
    pub fn open() -> Result<NvmlSource, SourceError> {
        match Nvml::init() {
            Ok(nvml) => Ok(NvmlSource { nvml, pid: None }),
            Err(nvml_wrapper::error::NvmlError::LibloadingError(_)) => {
                Err(SourceError::absent(NOT_FOUND))
            }
            Err(e) => Err(SourceError::absent(format!(
                "nvml: NVIDIA library found but not usable: {e}"
            ))),
        }
    }
}

fn chip_type(name: &str) -> String {
    // "NVIDIA H100 80GB HBM3" -> "h100"; "Tesla T4" -> "t4".
    let lower = name.to_ascii_lowercase();
    lower
        .split_whitespace()
        .find(|w| {
            w.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && w.chars().any(|c| c.is_ascii_digit())
        })
        .unwrap_or(&lower)
        .to_string()
}

impl Source for NvmlSource {
    fn name(&self) -> String {
        "nvml".to_string()
    }

    fn poll(&mut self, out: &mut Reading) -> Result<(), SourceError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| SourceError::failed(format!("nvml: device count: {e}")))?;
        for i in 0..count {
            let dev = self
                .nvml
                .device_by_index(i)
                .map_err(|e| SourceError::failed(format!("nvml: device {i}: {e}")))?;
            let mem = dev.memory_info().map_err(|e| SourceError::failed(format!("nvml: memory of device {i}: {e} (driver too old for nvmlDeviceGetMemoryInfo_v2?)")))?;
            let procs = dev.running_compute_processes().unwrap_or_default();
            let mut s = DeviceSample::new(i.to_string(), "gpu", SourceKind::Nvml);
            if let Some(pid) = self.pid {
                let Some(p) = procs.iter().find(|p| p.pid == pid) else {
                    continue;
                };
                s.pid = Some(pid);
                s.peak_bytes = None;
                if let UsedGpuMemory::Used(b) = p.used_gpu_memory {
                    s.used_bytes = Some(b);
                }
            } else {
                s.pid = procs
                    .iter()
                    .max_by_key(|p| match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => b,
                        UsedGpuMemory::Unavailable => 0,
                    })
                    .map(|p| p.pid);
            }
            s.used_bytes = s.used_bytes.or(Some(mem.used));
            s.limit_bytes = Some(mem.total);
            if let Ok(name) = dev.name() {
                s.chip_type = Some(chip_type(&name));
                s.kind = Some(name);
            }
            s.duty_cycle_percent = dev.utilization_rates().ok().map(|u| f64::from(u.gpu));
            out.devices.push(s);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn chip_type_from_name() {
        assert_eq!(super::chip_type("NVIDIA H100 80GB HBM3"), "h100");
        assert_eq!(super::chip_type("Tesla T4"), "t4");
    }

    #[test]
    fn absent_library_is_said_clearly() {
        // This machine has no NVIDIA driver; where it has one the source must open.
        match super::NvmlSource::open() {
            Ok(_) => {}
            Err(e) => assert!(e.absent && e.message.starts_with("nvml:"), "{e}"),
        }
    }
}
