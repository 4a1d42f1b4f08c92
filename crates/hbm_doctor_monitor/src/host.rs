//! The host side: time, host name, the trainer's RSS and environment, who owns a port or a TPU
//! chip, and kernel OOM-killer lines (so a silent death can be told apart: HBM vs host RAM).

use crate::sample::{Event, ProcessSample};
use hbm_doctor_units::chips::{self, TpuGeneration};
use std::collections::HashMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Unix time now, in seconds.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Formats Unix seconds as RFC 3339 UTC with whole seconds (`2026-11-21T23:09:56Z`). Thin
/// wrapper over `hbm_doctor_units::time::rfc3339`, kept for existing callers.
pub fn rfc3339(ts: f64) -> String {
    hbm_doctor_units::time::rfc3339(ts)
}

/// This machine's name.
pub fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The environment of a process (`/proc/PID/environ`); empty when unreadable.
pub fn process_env(pid: u32) -> HashMap<String, String> {
    let Ok(raw) = fs::read(format!("/proc/{pid}/environ")) else {
        return HashMap::new();
    };
    raw.split(|&b| b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

/// Parses `TPU_RUNTIME_METRICS_PORTS` (`8431,8432`).
pub fn parse_ports(s: &str) -> Vec<u16> {
    s.split([',', ' '])
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            !matches!(state, Some("Z" | "X"))
        }
        Err(_) => false,
    }
}

/// RSS and name of a process from `/proc/PID/status`.
pub fn process_sample(pid: u32) -> ProcessSample {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|k| k * 1024)
    };
    let comm = fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_string());
    ProcessSample {
        pid,
        comm,
        rss_bytes: kib("VmRSS:"),
        rss_peak_bytes: kib("VmHWM:"),
        alive: alive(pid),
    }
}

/// The process listening on a loopback TCP port, found through `/proc/net/tcp{,6}` and the
/// socket inodes in `/proc/*/fd` (needs permission to read the owner's fds).
pub fn port_owner(port: u16) -> Option<u32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                continue; // not LISTEN
            }
            let Some((_, p)) = f[1].rsplit_once(':') else {
                continue;
            };
            if u16::from_str_radix(p, 16).ok() == Some(port) {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = fs::read_link(fd.path()) {
                if inodes.iter().any(|i| Path::new(i) == target) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// A TPU chip found on the PCI bus (Google vendor id 0x1ae0), as tpu-info finds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpuChip {
    /// Short generation name (`v5e`).
    pub chip_type: &'static str,
    /// The device kind as JAX prints it (`TPU v5 lite`).
    pub kind: &'static str,
}

impl TpuChip {
    fn of(t: &'static TpuGeneration) -> TpuChip {
        TpuChip {
            chip_type: t.label,
            kind: t.device_kind,
        }
    }
}

/// The TPU generation of this host from the PCI bus, or `TPU_ACCELERATOR_TYPE`; names and ids
/// come from the chip table (`hbm_doctor_units::chips`).
pub fn tpu_chip() -> Option<TpuChip> {
    let from_pci = || -> Option<TpuChip> {
        for dev in fs::read_dir("/sys/bus/pci/devices").ok()?.flatten() {
            let read = |f: &str| {
                fs::read_to_string(dev.path().join(f))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default()
            };
            if read("vendor") != "0x1ae0" {
                continue;
            }
            if let Some(t) = chips::tpu_by_pci(&read("device"), &read("subsystem_device")) {
                return Some(TpuChip::of(t));
            }
        }
        None
    };
    from_pci().or_else(|| {
        let t = std::env::var("TPU_ACCELERATOR_TYPE").ok()?;
        chips::tpu_by_name(&t)
            .filter(|t| !t.label.is_empty())
            .map(TpuChip::of)
    })
}

/// The short chip name for a device kind as JAX prints it (`TPU v5 lite` -> `v5e`, `TPU7x` ->
/// `7x`): the chip table's `label`.
pub fn chip_type_of_kind(kind: &str) -> Option<&'static str> {
    if let Some(t) = chips::tpu_by_device_kind(kind) {
        return Some(t.label);
    }
    // The inference chip, which the table (training generations, per-device HBM) leaves out.
    (kind.trim() == "TPU v4 lite").then_some("v4i")
}

/// Reads new kernel log records from `/dev/kmsg` (non-blocking) and picks OOM-killer lines.
#[derive(Debug)]
pub struct KernelLog {
    file: Option<fs::File>,
    /// Why the kernel log cannot be read, when it cannot.
    pub unreadable: Option<String>,
}

impl KernelLog {
    /// Opens `/dev/kmsg` at its end; records written from now on are seen by [`KernelLog::poll`].
    pub fn open() -> KernelLog {
        use std::os::unix::fs::OpenOptionsExt;
        match fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
        {
            Ok(mut f) => {
                let _ = f.seek(SeekFrom::End(0));
                KernelLog {
                    file: Some(f),
                    unreadable: None,
                }
            }
            Err(e) => KernelLog {
                file: None,
                unreadable: Some(format!("/dev/kmsg: {e}")),
            },
        }
    }

    /// New OOM-killer events since the last call.
    pub fn poll(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        let Some(f) = self.file.as_mut() else {
            return events;
        };
        let mut buf = vec![0u8; 8192];
        // Each read returns one record; EAGAIN ends the batch. Bounded so a flood cannot stall us.
        for _ in 0..10_000 {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let rec = String::from_utf8_lossy(&buf[..n]);
                    let msg = rec.split_once(';').map(|(_, m)| m).unwrap_or(&rec);
                    let msg = msg.lines().next().unwrap_or("").to_string();
                    if let Some(ev) = oom_event(&msg) {
                        events.push(ev);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue, // records overwritten
                Err(_) => break,
            }
        }
        events
    }
}

/// The OOM-killer event in one kernel log line, if it is one.
pub fn oom_event(line: &str) -> Option<Event> {
    let pid = |after: &str| -> Option<u32> {
        let i = line.find(after)? + after.len();
        line[i..]
            .trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    if line.contains("Out of memory: Killed process")
        || line.contains("Killed process") && line.contains("oom")
    {
        return Some(Event::KernelOom {
            pid: pid("Killed process"),
            line: line.trim().to_string(),
        });
    }
    if line.contains("oom-kill:") {
        return Some(Event::KernelOom {
            pid: pid(",pid="),
            line: line.trim().to_string(),
        });
    }
    None
}

/// Looks for an OOM-killer line about `pid` in `dmesg` (used when `/dev/kmsg` cannot be read
/// continuously); `None` when dmesg is not readable either.
pub fn dmesg_killed(pid: u32) -> Option<bool> {
    let out = std::process::Command::new("dmesg")
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Some(
        text.lines()
            .filter_map(oom_event)
            .any(|e| matches!(e, Event::KernelOom { pid: Some(p), .. } if p == pid)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_oom_killer_lines() {
        let l = "Out of memory: Killed process 4242 (python3) total-vm:123kB, anon-rss:99kB";
        assert_eq!(
            oom_event(l),
            Some(Event::KernelOom {
                pid: Some(4242),
                line: l.to_string()
            })
        );
        let l = "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/,task=python3,pid=77,uid=0";
        assert!(matches!(
            oom_event(l),
            Some(Event::KernelOom { pid: Some(77), .. })
        ));
        assert_eq!(oom_event("eth0: link up"), None);
    }

    #[test]
    fn reads_own_process() {
        let p = process_sample(std::process::id());
        assert!(p.alive);
        assert!(p.rss_bytes.unwrap_or(0) > 0);
        assert_eq!(parse_ports("8431,8432, 8433"), vec![8431, 8432, 8433]);
    }
}
