//! docs/explain.md's cause table is the engine's own (`hbm_doctor_analysis::causes::CAUSES`):
//! what each cause means, the evidence it needs, how its savings are computed and its generic
//! advice. `UPDATE_DOCS=1 cargo test --test docs_causes` rewrites the table.

use hbm_doctor_analysis::causes::CAUSES;

fn table() -> String {
    let mut t = String::from(
        "| cause | what it means | the evidence it needs | savings | advice (after the rule's own lines) |\n|---|---|---|---|---|\n",
    );
    for s in CAUSES {
        let esc = |x: &str| x.replace('|', "\\|");
        t.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            s.kind.as_str(),
            esc(s.meaning),
            esc(s.needs),
            esc(s.savings),
            s.advice
                .iter()
                .map(|a| esc(a))
                .collect::<Vec<_>>()
                .join("<br>")
        ));
    }
    t
}

#[test]
fn the_docs_cause_table_is_the_engines() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/explain.md");
    let doc = std::fs::read_to_string(&path).expect("docs/explain.md");
    let (open, close) = ("<!-- causes -->\n", "<!-- /causes -->");
    let a = doc
        .find(open)
        .expect("a <!-- causes --> block in docs/explain.md")
        + open.len();
    let b = doc[a..].find(close).expect("<!-- /causes -->") + a;
    let want = table();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, format!("{}{}{}", &doc[..a], want, &doc[b..])).expect("write");
        return;
    }
    assert!(
        doc[a..b] == want,
        "docs/explain.md's cause table differs from causes.rs: run UPDATE_DOCS=1 cargo test -p hbm_doctor --test docs_causes"
    );
}
