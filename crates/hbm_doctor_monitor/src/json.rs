//! Snapshots as JSON (contract.md "JSON of `top --once`", schema_version 1) and as recording
//! lines.
//!
//! The contract fixes `schema_version`, `host`, `time` and, per device, `id`, `accelerator`,
//! `kind`, `source`, `used_bytes`, `limit_bytes`, `peak_bytes`, `pid`, `trend`. Extra fields:
//! per device `max_seen_bytes` (largest used figure this monitor saw), `chip_type`,
//! `duty_cycle_percent`, `endpoint`, `step` when known; at the top `process` (the `--pid`
//! trainer's RSS) and `sources` (each source's state, so a script can tell "no TPU" from "libtpu
//! not answering").

use crate::host::rfc3339;
use crate::monitor::Snapshot;
use crate::recording::Record;
use serde_json::{json, Map, Value};

/// The contract object of a snapshot.
pub fn snapshot_json(s: &Snapshot) -> Value {
    let devices: Vec<Value> = s
        .devices
        .iter()
        .map(|d| {
            let mut sample = d.sample.clone();
            sample.ts = None;
            let mut obj = match serde_json::to_value(&sample) {
                Ok(Value::Object(m)) => m,
                _ => Map::new(),
            };
            obj.insert("max_seen_bytes".into(), json!(d.max_seen_bytes));
            obj.insert(
                "trend".into(),
                d.trend.as_ref().map_or(Value::Null, |t| t.json.clone()),
            );
            Value::Object(obj)
        })
        .collect();
    let sources: Vec<Value> = s
        .sources
        .iter()
        .map(|st| json!({"name": st.name, "up": st.up, "message": st.message}))
        .collect();
    json!({
        "schema_version": 1,
        "host": s.host,
        "time": rfc3339(s.ts),
        "devices": devices,
        "process": s.process,
        "sources": sources,
    })
}

/// The recording lines of a snapshot: its new samples, the process, counters, events.
pub fn records(s: &Snapshot) -> Vec<Record> {
    let host = Some(s.host.clone());
    let mut out: Vec<Record> = s
        .new_samples
        .iter()
        .map(|d| Record::Sample {
            host: host.clone(),
            device: d.clone(),
        })
        .collect();
    if let Some(p) = &s.process {
        out.push(Record::Process {
            ts: s.ts,
            host: host.clone(),
            process: p.clone(),
        });
    }
    out.extend(s.counters.iter().map(|c| Record::Counters {
        ts: s.ts,
        host: host.clone(),
        counters: c.clone(),
    }));
    out.extend(s.events.iter().map(|e| Record::Event {
        ts: s.ts,
        host: host.clone(),
        event: e.clone(),
    }));
    out
}
