//! The embedding example (`examples/embed.rs`), run as two processes: the
//! first starts a run that parks for approval, the second approves it and
//! finishes it.

use std::path::Path;
use std::process::Command;

#[test]
fn the_embedding_example_parks_then_finishes_from_a_second_process() {
    let bin = Path::new(env!("CARGO_BIN_EXE_warden"))
        .parent()
        .unwrap()
        .join("examples/embed");
    assert!(
        bin.is_file(),
        "{} is not built: the workspace `cargo test` builds examples, or run `cargo build -p warden --example embed`",
        bin.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let start = Command::new(&bin)
        .arg("start")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&start.stdout);
    assert!(
        start.status.success(),
        "{}",
        String::from_utf8_lossy(&start.stderr)
    );
    assert!(text.contains("is awaiting_approval"), "{text}");
    let approve_line = text
        .lines()
        .find(|l| l.contains("-- approve "))
        .unwrap_or_else(|| panic!("no approve command in: {text}"));
    let words: Vec<&str> = approve_line.split_whitespace().collect();
    let (run, call) = (words[words.len() - 2], words[words.len() - 1]);
    assert!(
        !dir.path()
            .join(".warden/embed-demo/notes/SUMMARY.md")
            .exists()
    );

    let approve = Command::new(&bin)
        .args(["approve", run, call])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&approve.stdout);
    assert!(
        approve.status.success(),
        "{}",
        String::from_utf8_lossy(&approve.stderr)
    );
    assert!(text.contains("is completed"), "{text}");
    assert!(
        dir.path()
            .join(".warden/embed-demo/notes/SUMMARY.md")
            .exists()
    );
    // The second process also made the run's delivery: one JSON line.
    let delivered =
        std::fs::read_to_string(dir.path().join(".warden/embed-demo/out/deliveries.jsonl"))
            .unwrap();
    assert_eq!(delivered.lines().count(), 1, "{delivered}");
    assert!(delivered.contains("\"kind\":\"completed\""), "{delivered}");
}
