//! The JSON of `explain` and `analyze` on every corpus input validates against the schemas in
//! docs/schema (the contract's fields, types and closed vocabularies, machine-readable). The
//! validator covers the subset of JSON Schema those files use: type, const, enum, required,
//! properties, items, minimum and $ref (within a file or to a sibling file).

use hbm_doctor::commands::analyze::{analyze_files, discover};
use hbm_doctor_log::scan_all;
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Schemas(HashMap<String, Value>);

impl Schemas {
    fn load() -> Schemas {
        let mut m = HashMap::new();
        for name in ["explain.schema.json", "analyze.schema.json"] {
            let text =
                std::fs::read_to_string(root().join("docs/schema").join(name)).expect("schema");
            m.insert(
                name.to_string(),
                serde_json::from_str(&text).expect("schema is JSON"),
            );
        }
        Schemas(m)
    }

    fn resolve(&self, file: &str, r: &str) -> (String, Value) {
        let (f, pointer) = match r.split_once('#') {
            Some(("", p)) => (file.to_string(), p.to_string()),
            Some((f, p)) => (f.to_string(), p.to_string()),
            None => (r.to_string(), String::new()),
        };
        let doc = self.0.get(&f).unwrap_or_else(|| panic!("no schema {f}"));
        let v = doc
            .pointer(&pointer)
            .unwrap_or_else(|| panic!("no {pointer} in {f}"));
        (f, v.clone())
    }

    fn check(&self, file: &str, schema: &Value, v: &Value, path: &str, errors: &mut Vec<String>) {
        if errors.len() > 20 {
            return;
        }
        if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
            let (f, s) = self.resolve(file, r);
            return self.check(&f, &s, v, path, errors);
        }
        if let Some(c) = schema.get("const") {
            if c != v {
                errors.push(format!("{path}: {v} is not {c}"));
            }
        }
        if let Some(e) = schema.get("enum").and_then(Value::as_array) {
            if !e.contains(v) {
                errors.push(format!("{path}: {v} not in {e:?}"));
            }
        }
        if let Some(t) = schema.get("type") {
            let types: Vec<&str> = match t {
                Value::String(s) => vec![s.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => vec![],
            };
            let ok = types.iter().any(|t| match *t {
                "object" => v.is_object(),
                "array" => v.is_array(),
                "string" => v.is_string(),
                "integer" => v.is_u64() || v.is_i64(),
                "number" => v.is_number(),
                "boolean" => v.is_boolean(),
                "null" => v.is_null(),
                _ => false,
            });
            if !ok {
                errors.push(format!("{path}: {v} is not {types:?}"));
                return;
            }
        }
        if let (Some(min), Some(n)) = (schema.get("minimum").and_then(Value::as_f64), v.as_f64()) {
            if n < min {
                errors.push(format!("{path}: {n} < {min}"));
            }
        }
        if let Some(obj) = v.as_object() {
            for k in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                if !obj.contains_key(k) {
                    errors.push(format!("{path}: missing `{k}`"));
                }
            }
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, s) in props {
                    if let Some(x) = obj.get(k) {
                        self.check(file, s, x, &format!("{path}.{k}"), errors);
                    }
                }
            }
        }
        if let (Some(items), Some(arr)) = (schema.get("items"), v.as_array()) {
            for (i, x) in arr.iter().enumerate().take(200) {
                self.check(file, items, x, &format!("{path}[{i}]"), errors);
            }
        }
    }

    fn validate(&self, file: &str, v: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        let schema = self.0[file].clone();
        self.check(file, &schema, v, "$", &mut errors);
        errors
    }
}

#[test]
fn explain_json_follows_its_schema() {
    let schemas = Schemas::load();
    let mut inputs: Vec<PathBuf> = Vec::new();
    for dir in ["tests/corpus/issues", "tests/corpus/tpu"] {
        for e in walk(&root().join(dir)) {
            let name = e.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(".txt") && dir.ends_with("issues") || name == "stderr.log" {
                inputs.push(e);
            }
        }
    }
    assert!(inputs.len() > 100, "{}", inputs.len());
    let mut failures = Vec::new();
    for p in inputs {
        let text = std::fs::read(&p).expect("read");
        let report = hbm_doctor_analysis::explain(scan_all(&text));
        let v = serde_json::to_value(&report).expect("json");
        for e in schemas.validate("explain.schema.json", &v) {
            failures.push(format!("{}: {e}", p.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn analyze_json_follows_its_schema() {
    let schemas = Schemas::load();
    let mut failures = Vec::new();
    let mut n = 0;
    for d in walk(&root().join("tests/corpus")) {
        if !d.ends_with("dump") || !d.is_dir() {
            continue;
        }
        let files = discover(&d).expect("discover");
        let opts = hbm_doctor::commands::analyze::budget_options(None, Some("v5e")).expect("v5e");
        let mut report = analyze_files(&files, &opts).expect("analyze");
        if let Ok(w) = hbm_doctor_analysis::whatif::named(&report, "bf16") {
            report.diagnosis.what_if.push(w);
        }
        let v = serde_json::to_value(&report).expect("json");
        n += 1;
        for e in schemas.validate("analyze.schema.json", &v) {
            failures.push(format!("{}: {e}", d.display()));
        }
    }
    assert!(n > 50, "{n} dumps");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n == "dump") {
                    out.push(p.clone());
                } else {
                    stack.push(p.clone());
                }
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_validator_rejects_what_the_contract_forbids() {
    let schemas = Schemas::load();
    let bad: Value = serde_json::from_str(
        r#"{"schema_version": 1, "events": [{"line": 0, "phase": "later"}],
            "diagnosis": {"event": 0, "category": "aggregate",
                          "causes": [{"cause": "cosmic_rays", "savings_bytes": -1, "evidence": "", "actions": []}]}}"#,
    )
    .expect("json");
    let errors = schemas.validate("explain.schema.json", &bad);
    for want in [
        "line",
        "phase",
        "missing `backend`",
        "cosmic_rays",
        "savings_bytes",
    ] {
        assert!(
            errors.iter().any(|e| e.contains(want)),
            "{want}: {errors:?}"
        );
    }
}
