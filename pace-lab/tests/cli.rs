//! The `pace-lab` binary: its JSON rows, its table, its picture and its
//! errors.

use std::path::PathBuf;
use std::process::{Command, Output};

fn lab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pace-lab"))
        .args(args)
        .output()
        .expect("pace-lab runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pace-lab-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn json_rows_carry_exactly_the_six_fields() {
    let o = lab(&[
        "--limit",
        "100",
        "--window",
        "60s",
        "--shape",
        "documents",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4 * 8);
    let keys: Vec<&str> = rows[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        vec![
            "admitted",
            "bytes_per_key",
            "limiter",
            "refused_with_right",
            "shape",
            "worst_window"
        ]
    );
    let find = |shape: &str, limiter: &str| {
        rows.iter()
            .find(|r| r["shape"] == shape && r["limiter"] == limiter)
            .unwrap_or_else(|| panic!("{shape} {limiter}"))
    };
    assert_eq!(
        find("steady-2x", "token-bucket(cap=100)"),
        &serde_json::json!({
            "limiter": "token-bucket(cap=100)", "shape": "steady-2x", "admitted": 1099,
            "worst_window": 199, "refused_with_right": 0, "bytes_per_key": 16
        })
    );
    assert_eq!(find("boundary", "fixed-window")["worst_window"], 200);
    assert_eq!(find("quiet-burst", "token-bucket(cap=10)")["admitted"], 10);
    assert_eq!(
        find("quiet-burst", "token-bucket(cap=10)")["refused_with_right"],
        90
    );
}

#[test]
fn the_default_output_is_an_aligned_table() {
    let o = lab(&["--shape", "quiet-burst"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1 + 8);
    assert!(lines[0].starts_with("shape"), "{out}");
    // Right-aligned numbers end in the same column.
    let ends: Vec<usize> = lines.iter().map(|l| l.len()).collect();
    assert!(ends.iter().all(|&e| e == ends[0]), "{out}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("sliding-log") && l.ends_with("800")),
        "{out}"
    );
}

#[test]
fn svg_draws_every_limiter_and_the_limit() {
    let path = temp("documents.svg");
    let o = lab(&["--shape", "documents", "--svg", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"));
    for label in [
        "fixed-window",
        "token-bucket(cap=100)",
        "token-bucket(cap=10)",
        "sliding-log",
        "sliding-window",
        "sub-window(k=6)",
        "pace(cap=100)",
        "limit 100",
        "boundary",
        "quiet-burst",
    ] {
        assert!(svg.contains(label), "{label}");
    }
}

#[test]
fn arrivals_from_a_file() {
    let path = temp("arrivals.txt");
    // 150 requests in the last second of the first minute and 150 in the
    // first second of the next.
    let text: String = (0..150)
        .map(|i| format!("59.{:03}\n", i * 6))
        .chain((0..150).map(|i| format!("60.{:03}\n", i * 6)))
        .collect();
    std::fs::write(&path, text).unwrap();
    let o = lab(&["--arrivals", path.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 8, "only the file's shape: {out}");
    let fixed: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(fixed["shape"], "file:arrivals.txt");
    assert_eq!(fixed["limiter"], "fixed-window");
    assert_eq!(fixed["admitted"], 200);
    assert_eq!(fixed["worst_window"], 200);
}

#[test]
fn nodes_add_three_deployments_per_limiter() {
    let o = lab(&[
        "--shape",
        "quiet-burst",
        "--nodes",
        "3",
        "--balancer",
        "sticky",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 8 * 3);
    assert!(out.contains(
        r#"{"limiter":"fixed-window per node, limit/3","shape":"quiet-burst (3 nodes, sticky)","admitted":33,"worst_window":33,"refused_with_right":67,"bytes_per_key":16}"#
    ), "{out}");
}

#[test]
fn bad_input_is_a_clear_error_not_a_panic() {
    let bad_file = temp("bad.txt");
    std::fs::write(&bad_file, "1.0\n2.0\nthree\n").unwrap();
    let missing = temp("missing.txt");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--limit", "0"], "limit must be at least 1"),
        (vec!["--window", "0s"], "window must be longer than zero"),
        (vec!["--window", "sixty"], "60s"),
        (vec!["--shape", "sawtooth"], "unknown shape \"sawtooth\""),
        (
            vec!["--arrivals", bad_file.to_str().unwrap()],
            "arrivals file, line 3",
        ),
        (vec!["--arrivals", missing.to_str().unwrap()], "cannot read"),
        (vec!["--slots", "0"], "between 1 and 1000 slots"),
        (vec!["--small-capacity", "0"], "capacity of at least 1"),
        (vec!["--nodes", "0"], "nodes"),
    ];
    for (args, message) in cases {
        let o = lab(&args);
        assert!(!o.status.success(), "{args:?}");
        let err = stderr(&o);
        assert!(err.contains(message), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn the_json_rows_in_docs_lab_md_are_what_the_lab_prints() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let block = doc
        .split("```json\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("pace-lab/README.md has a json block");
    let o = lab(&[
        "--limit",
        "100",
        "--window",
        "60s",
        "--shape",
        "documents",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(block, stdout(&o));
}

/// The `| \`limiter\` | a / b / c | ... |` rows of the markdown table that
/// follows `heading` in pace-lab/README.md.
fn doc_table(heading: &str) -> Vec<(String, Vec<String>)> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let after = doc
        .split(heading)
        .nth(1)
        .expect("heading in pace-lab/README.md");
    after
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<String> = l
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().replace("**", "").replace('`', ""))
                .collect();
            (cells[0].clone(), cells[1..].to_vec())
        })
        .collect()
}

#[test]
fn the_tables_in_docs_lab_md_are_what_the_lab_prints() {
    let rows = |shapes: &str| -> Vec<serde_json::Value> {
        let o = lab(&["--shape", shapes, "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let cell = |rows: &[serde_json::Value], limiter: &str, shape: &str, key: &str| {
        rows.iter()
            .find(|r| r["limiter"] == limiter && r["shape"] == shape)
            .unwrap_or_else(|| panic!("{limiter} {shape}"))[key]
            .to_string()
    };

    let docs = rows("documents");
    let table = doc_table("### The documents' table");
    assert_eq!(table.len(), 8);
    for (limiter, cells) in &table {
        let shapes = ["boundary", "steady-2x", "steady-1.1x", "quiet-burst"];
        for (shape, got) in shapes.iter().zip(cells) {
            assert_eq!(
                got,
                &cell(&docs, limiter, shape, "worst_window"),
                "{limiter} {shape}"
            );
        }
        let quiet = format!(
            "{} / {}",
            cell(&docs, limiter, "quiet-burst", "admitted"),
            cell(&docs, limiter, "quiet-burst", "refused_with_right")
        );
        assert_eq!(cells[4], quiet, "{limiter}");
        assert_eq!(cells[5], cell(&docs, limiter, "boundary", "bytes_per_key"));
    }

    let random = rows("poisson-1.5x,on-off");
    let table = doc_table("Random shapes");
    assert_eq!(table.len(), 6);
    for (limiter, cells) in &table {
        for (shape, got) in ["poisson-1.5x", "on-off"].iter().zip(cells) {
            let want = format!(
                "{} / {} / {}",
                cell(&random, limiter, shape, "worst_window"),
                cell(&random, limiter, shape, "admitted"),
                cell(&random, limiter, shape, "refused_with_right")
            );
            assert_eq!(got, &want, "{limiter} {shape}");
        }
    }
}

#[test]
fn the_reference_shows_the_documents_table_of_the_lab_readme() {
    let read =
        |p: &str| std::fs::read_to_string(format!("{}/{p}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let (doc, reference) = (read("README.md"), read("../docs/reference.md"));
    let start = doc
        .find("| limiter | boundary |")
        .expect("table in pace-lab/README.md");
    let end = doc[start..].find("\n\n").map_or(doc.len(), |e| start + e);
    assert!(
        reference.contains(&doc[start..end]),
        "docs/reference.md's lab table differs from pace-lab/README.md"
    );
}
