//! The verbs that record something and then drive a run, from the
//! operator's side with the real binary, store and plugins: each checks
//! everything before it writes (a changed agent file is refused, naming
//! the flag that accepts it, and nothing is recorded), every driving verb
//! has that flag, and one status vocabulary is used everywhere (`runs
//! list`, `runs show`, `sessions`, `--status`, JSON).

mod common;

use std::path::Path;

use common::{command, demo, json_out, stderr, stdout, warden};

fn events(dir: &Path, run: &str) -> Vec<String> {
    let out = warden(&["runs", "events", run], dir);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).lines().map(str::to_owned).collect()
}

/// Runs the demo with one step allowed, so run `id` parks over budget.
fn over_budget(dir: &Path, id: &str) -> std::process::Output {
    let text = std::fs::read_to_string(dir.join("notes.toml"))
        .unwrap()
        .replace("max_steps = 10", "max_steps = 1");
    std::fs::write(dir.join("notes.toml"), text).unwrap();
    let out = warden(&["run", "notes.toml", "go", "--run-id", id], dir);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    out
}

fn change_agent(dir: &Path) {
    let text = std::fs::read_to_string(dir.join("notes.toml"))
        .unwrap()
        .replace("max_steps = 10", "max_steps = 12");
    std::fs::write(dir.join("notes.toml"), text).unwrap();
}

#[test]
fn approve_after_the_agent_changed_records_nothing_and_names_the_flag() {
    let dir = demo();
    let out = warden(&["run", "notes.toml", "go", "--run-id", "a"], dir.path());
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let before = events(dir.path(), "a");
    change_agent(dir.path());
    for verb in [
        vec!["runs", "approve", "a", "call-3-1"],
        vec!["runs", "deny", "a", "call-3-1", "--reason", "no"],
    ] {
        let out = warden(&verb, dir.path());
        assert_eq!(out.status.code(), Some(2), "{verb:?}: {}", stdout(&out));
        let err = stderr(&out);
        assert!(err.contains("changed since the run started"), "{err}");
        assert!(err.contains("nothing was recorded"), "{err}");
        assert!(err.contains("--accept-agent-change"), "{err}");
        assert_eq!(stdout(&out), "", "the history is not reprinted");
        assert_eq!(
            events(dir.path(), "a"),
            before,
            "{verb:?} recorded something"
        );
    }
    let out = warden(&["runs", "approve", "a", "call-3-1", "--json"], dir.path());
    let envelope = json_out(&out);
    assert_eq!(envelope["error"]["code"], "agent_changed");
    assert_eq!(
        envelope["error"]["details"]["flag"],
        "--accept-agent-change"
    );
    assert_eq!(events(dir.path(), "a"), before);
    // The run is still waiting, not "running" with nothing driving it.
    let shown = json_out(&warden(&["runs", "show", "a", "--json"], dir.path()));
    assert_eq!(shown["status"], "awaiting_approval");
    // Accepted, the approval is recorded and the run goes on under the
    // file as it is now (its recorded decisions still hold).
    let out = warden(
        &["runs", "approve", "a", "call-3-1", "--accept-agent-change"],
        dir.path(),
    );
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("run a: completed"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn resume_input_after_the_agent_changed_records_nothing() {
    let dir = demo();
    // An extension of a run over budget.
    let out = over_budget(dir.path(), "b");
    assert!(
        stdout(&out).contains("run b: budget_exceeded"),
        "{}",
        stdout(&out)
    );
    let before = events(dir.path(), "b");
    change_agent(dir.path());
    let text = std::fs::read_to_string(dir.path().join("notes.toml"))
        .unwrap()
        .replace("max_steps = 1\n", "max_steps = 2\n");
    std::fs::write(dir.path().join("notes.toml"), text).unwrap();
    let out = warden(
        &["runs", "resume", "b", "--input", r#"{"max_steps": 5}"#],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("--accept-agent-change"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        events(dir.path(), "b"),
        before,
        "budget_extended was recorded"
    );
    let shown = json_out(&warden(&["runs", "show", "b", "--json"], dir.path()));
    assert_eq!(shown["status"], "budget_exceeded");
    let out = warden(
        &[
            "runs",
            "resume",
            "b",
            "--input",
            r#"{"max_steps": 5}"#,
            "--accept-agent-change",
        ],
        dir.path(),
    );
    // Extended, it goes on to the approval of its write.
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("run b: awaiting_approval"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn every_driving_verb_takes_the_flag_that_accepts_a_changed_agent() {
    let dir = tempfile::tempdir().unwrap();
    for verb in ["approve", "deny", "resume", "complete", "recover"] {
        let out = warden(&["runs", verb, "--help"], dir.path());
        assert!(out.status.success(), "{verb}");
        assert!(
            stdout(&out).contains("--accept-agent-change"),
            "runs {verb} --help: {}",
            stdout(&out)
        );
    }
}

#[test]
fn one_status_vocabulary_in_list_show_and_filters() {
    let dir = demo();
    // Recorded for a driver, not driven: queued, in every view.
    let out = warden(
        &[
            "run",
            "notes.toml",
            "go",
            "--run-id",
            "later",
            "--detach",
            "--json",
        ],
        dir.path(),
    );
    assert_eq!(json_out(&out)["status"], "queued");
    let out = warden(
        &[
            "run",
            "notes.toml",
            "go",
            "--run-id",
            "later-too",
            "--detach",
        ],
        dir.path(),
    );
    assert_eq!(stdout(&out), "later-too\n");
    assert!(stderr(&out).contains("queued"), "{}", stderr(&out));
    let out = warden(
        &["submit", "notes.toml", "go", "--run-id", "submitted"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = warden(
        &["run", "notes.toml", "go", "--run-id", "parked"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));

    let listed = json_out(&warden(&["runs", "list", "--json"], dir.path()));
    for row in listed.as_array().unwrap() {
        let run = row["run_id"].as_str().unwrap();
        let shown = json_out(&warden(&["runs", "show", run, "--json"], dir.path()));
        assert_eq!(
            shown["status"], row["status"],
            "{run}: list and show disagree"
        );
    }
    let queued = json_out(&warden(
        &["runs", "list", "--status", "queued", "--json"],
        dir.path(),
    ));
    let ids: Vec<&str> = queued
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["later", "later-too", "submitted"]);
    // Every status is a filter; anything else is refused naming them all.
    for status in common::STATUSES {
        let out = warden(&["runs", "list", "--status", status, "--json"], dir.path());
        assert!(out.status.success(), "--status {status}: {}", stderr(&out));
    }
    let out = warden(&["runs", "list", "--status", "sleeping"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("use one of queued, running, awaiting_approval"),
        "{}",
        stderr(&out)
    );

    // `runs show` says honestly that nothing drives it, and what to do.
    let text = stdout(&warden(&["runs", "show", "later"], dir.path()));
    assert!(text.contains("status: queued"), "{text}");
    assert!(text.contains("nothing drives it yet"), "{text}");
    assert!(text.contains("warden runs resume later"), "{text}");
    let shown = json_out(&warden(&["runs", "show", "parked", "--json"], dir.path()));
    assert_eq!(
        shown["next"][0]["command"],
        "warden runs approve parked call-3-1"
    );
    // Driven, it goes on; over, show says there is nothing left to do.
    let out = warden(&["runs", "resume", "later"], dir.path());
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("run later: awaiting_approval"),
        "{}",
        stdout(&out)
    );
    let out = warden(&["runs", "cancel", "later-too"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&warden(&["runs", "show", "later-too"], dir.path()));
    assert!(text.contains("status: cancelled"), "{text}");
    assert!(text.contains("nothing: the run is over"), "{text}");

    // The help names the same words.
    let help = stdout(&warden(&["runs", "list", "--help"], dir.path()));
    let words = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains("queued, running, awaiting_approval, suspended, awaiting_external, awaiting_child, budget_exceeded, waiting, needs_reconciliation, completed, failed, cancelled, abandoned"),
        "{help}"
    );
}

#[test]
fn sessions_are_listed_and_an_unknown_one_is_an_error() {
    let dir = demo();
    let out = warden(
        &[
            "run",
            "notes.toml",
            "go",
            "--session",
            "chat",
            "--run-id",
            "held",
            "--detach",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = warden(
        &["run", "notes.toml", "go", "--run-id", "alone"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    // A session no run was started in is an error, naming the store.
    let out = warden(&["sessions", "show", "nosuch"], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("session `nosuch` has no runs in the store"),
        "{}",
        stderr(&out)
    );
    let out = warden(&["sessions", "show", "nosuch", "--json"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_out(&out)["error"]["code"], "unknown_session");

    let listed = json_out(&warden(&["sessions", "list", "--json"], dir.path()));
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["session"], "chat");
    assert_eq!(listed[0]["runs"], 1);
    assert_eq!(listed[0]["active_run"], "held");
    assert_eq!(listed[0]["active_status"], "queued");
    let text = stdout(&warden(&["sessions", "list"], dir.path()));
    assert!(text.contains("busy: run held is queued"), "{text}");
    let text = stdout(&warden(&["sessions", "show", "chat"], dir.path()));
    assert!(
        text.starts_with("session chat: 1 run(s); busy: run held is queued"),
        "{text}"
    );
    let shown = json_out(&warden(&["sessions", "show", "chat", "--json"], dir.path()));
    assert_eq!(shown["runs"][0]["status"], "queued");
}

/// The binary as user `who` (`$USER`), for the verbs that record an actor.
fn warden_as(who: &str, args: &[&str], dir: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(args)
        .current_dir(dir)
        .env(
            "WARDEN_CACHE_DIR",
            std::env::temp_dir().join("warden-cli-test-cache"),
        )
        .env_remove("RUST_LOG")
        .env_remove("WARDEN_STORE")
        .env("USER", who)
        .output()
        .unwrap()
}

#[test]
fn cancel_and_abandon_record_who_did_it_as_approve_does() {
    let dir = demo();
    for id in ["c", "d"] {
        let out = warden(&["run", "notes.toml", "go", "--run-id", id], dir.path());
        assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    }
    // `--by` names who; without it, `$USER`.
    let out = warden(
        &[
            "runs",
            "cancel",
            "c",
            "--reason",
            "not today",
            "--by",
            "alice",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = warden_as(
        "bob",
        &["runs", "abandon", "d", "--reason", "superseded"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    for (run, kind, who, line) in [
        (
            "c",
            "run_cancelled",
            "alice",
            "✗ cancelled by alice: not today",
        ),
        (
            "d",
            "run_abandoned",
            "bob",
            "✗ abandoned by bob: superseded",
        ),
    ] {
        let last: serde_json::Value =
            serde_json::from_str(events(dir.path(), run).last().unwrap()).unwrap();
        assert_eq!(last["event"]["type"], kind);
        assert_eq!(last["event"]["by"], who, "{last}");
        let text = stdout(&warden(&["runs", "show", run], dir.path()));
        assert!(text.contains(line), "{text}");
    }
}

#[test]
fn resume_prints_only_what_it_caused() {
    let dir = demo();
    over_budget(dir.path(), "r");
    let before = events(dir.path(), "r").len() as u64;
    let out = warden(
        &[
            "runs",
            "resume",
            "r",
            "--input",
            r#"{"max_steps": 5}"#,
            "--json",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let after = events(dir.path(), "r").len() as u64;
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seqs: Vec<u64> = lines.iter().filter_map(|l| l["seq"].as_u64()).collect();
    // Each event this command recorded, once, in order; nothing from before.
    assert_eq!(seqs, (before + 1..=after).collect::<Vec<_>>(), "{lines:?}");
    assert_eq!(lines.last().unwrap()["status"], "awaiting_approval");

    // A drive that records nothing (the run parks where it was) prints no
    // event at all, in JSON or as text: only how the run stands.
    for json in [true, false] {
        let mut args = vec!["runs", "recover", "r"];
        if json {
            args.push("--json");
        }
        let out = warden(&args, dir.path());
        assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
        assert_eq!(events(dir.path(), "r").len() as u64, after);
        let printed = stdout(&out);
        assert_eq!(
            printed.lines().count(),
            if json { 1 } else { 3 },
            "{printed}"
        );
        assert!(!printed.contains("\"seq\""), "{printed}");
        assert!(!printed.contains("started with input"), "{printed}");
    }
}

#[test]
fn a_slow_delivery_takes_its_real_time_in_the_timeline() {
    use std::io::{Read as _, Write as _};
    // A webhook receiver that takes 1.5 s to answer.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            std::thread::sleep(std::time::Duration::from_millis(1500));
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    let dir = demo();
    let mut text = std::fs::read_to_string(dir.path().join("notes.toml")).unwrap();
    text.push_str(&format!(
        "\n[plugins.hook]\nsource = \"builtin:webhook-channel\"\n[plugins.hook.grant]\nhosts = [\"127.0.0.1:{port}\"]\n[plugins.hook.grant.config]\nurl = \"http://127.0.0.1:{port}/hook\"\n\n[channels.slow]\nplugin = \"hook\"\nreceives = [\"output\"]\n"
    ));
    std::fs::write(dir.path().join("notes.toml"), text).unwrap();
    let out = warden(&["run", "notes.toml", "go", "--run-id", "t"], dir.path());
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let out = warden(&["runs", "approve", "t", "call-3-1"], dir.path());
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let shown = stdout(&warden(&["runs", "show", "t"], dir.path()));
    // `  12   +0.35s  ✓ completed: …`: the offset of the first line with `needle`.
    let offset = |needle: &str| -> f64 {
        let line = shown
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no `{needle}` in:\n{shown}"));
        let field = line.split_whitespace().nth(1).unwrap();
        field
            .trim_start_matches('+')
            .trim_end_matches('s')
            .parse()
            .unwrap()
    };
    let completed = offset("✓ completed");
    let slow = offset("✉ delivered t/slow/");
    assert!(
        slow - completed >= 1.4,
        "the 1.5 s delivery is shown {:.2}s after the completion:\n{shown}",
        slow - completed
    );
    // Its own line says how long it took, in seconds.
    let line = shown
        .lines()
        .find(|l| l.contains("✉ delivered t/slow/"))
        .unwrap();
    assert!(line.contains("1.5") && line.ends_with("s)"), "{line}");
}

/// `runs fork` through the real binary: a fork after the approval of the
/// demo's write asks for it again (the approval is withdrawn), reuses what
/// came before, and writes when approved in the fork; `runs show` shows the
/// lineage both ways; bad positions are refused with their code and record
/// nothing; budgets given to a fork are recorded as what changed.
#[test]
fn runs_fork_reuses_the_past_asks_again_for_the_write_and_shows_lineage() {
    let dir = demo();
    let out = warden(
        &["run", "notes.toml", "go", "--run-id", "demo-1"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let out = warden(&["runs", "approve", "demo-1", "call-3-1"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let summary = dir.path().join("notes/SUMMARY.md");
    assert!(summary.exists());
    std::fs::remove_file(&summary).unwrap();
    let lines = events(dir.path(), "demo-1");
    let granted = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["event"]["type"] == "approval_granted")
        .unwrap()["seq"]
        .as_u64()
        .unwrap();

    let out = warden(
        &[
            "--json",
            "runs",
            "fork",
            "demo-1",
            "--at",
            &granted.to_string(),
            "--run-id",
            "demo-2",
            "--by",
            "ops",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let forked = json_out(&out);
    assert_eq!(forked["run_id"], "demo-2");
    assert_eq!(forked["status"], "awaiting_approval");
    assert_eq!(
        forked["next"][0]["command"],
        "warden runs approve demo-2 call-3-1"
    );
    assert!(!summary.exists(), "the fork wrote nothing by itself");
    // The inherited events are the source's lines.
    let mine = events(dir.path(), "demo-2");
    assert_eq!(mine[..granted as usize], lines[..granted as usize]);
    assert!(mine[granted as usize].contains("\"type\":\"run_forked\""));

    let out = warden(&["runs", "show", "demo-2"], dir.path());
    let text = stdout(&out);
    assert!(
        text.contains("forked from run demo-1 at position"),
        "{text}"
    );
    assert!(text.contains("inherited events match the source"), "{text}");
    assert!(
        text.contains("approval of call-3-1 withdrawn (asked again)"),
        "{text}"
    );
    let out = warden(&["runs", "show", "demo-1"], dir.path());
    assert!(
        stdout(&out).contains(&format!("forks: demo-2 (at {granted})")),
        "{}",
        stdout(&out)
    );
    let shown = json_out(&warden(&["--json", "runs", "show", "demo-1"], dir.path()));
    assert_eq!(shown["forks"][0]["run_id"], "demo-2");
    assert_eq!(shown["forked_from"], serde_json::Value::Null);

    let out = warden(
        &["runs", "approve", "demo-2", "call-3-1", "--by", "bob"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("run demo-2: completed"),
        "{}",
        stdout(&out)
    );
    assert!(summary.exists(), "the fork's own approved write");
    let out = warden(&["runs", "verify"], dir.path());
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(stdout(&out).contains("demo-2: intact"), "{}", stdout(&out));

    // A fork with other budgets records the change; a bad position is
    // refused with its code and records nothing.
    let out = warden(
        &[
            "--json",
            "runs",
            "fork",
            "demo-1",
            "--at",
            "2",
            "--run-id",
            "demo-3",
            "--budgets",
            r#"{"max_steps": 9}"#,
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = json_out(&warden(&["--json", "runs", "show", "demo-3"], dir.path()));
    assert_eq!(shown["forked_from"]["run_id"], "demo-1");
    assert_eq!(shown["forked_from"]["position"], 2);
    assert_eq!(
        shown["forked_from"]["changed"],
        serde_json::json!(["budgets"])
    );
    assert_eq!(shown["budget"]["steps"]["limit"], 9);
    let total = lines.len().to_string();
    for (at, code) in [("0", "fork_refused"), (total.as_str(), "fork_refused")] {
        let out = warden(
            &[
                "--json", "runs", "fork", "demo-1", "--at", at, "--run-id", "demo-9",
            ],
            dir.path(),
        );
        assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
        assert_eq!(json_out(&out)["error"]["code"], code, "{}", stdout(&out));
    }
    let out = warden(&["runs", "show", "demo-9"], dir.path());
    assert!(!out.status.success());
}

/// The demo with the planner example's three agents beside it.
fn planner_demo() -> tempfile::TempDir {
    let dir = demo();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents");
    for name in ["planner", "reader", "writer"] {
        for file in [format!("{name}.toml"), format!("{name}.transcript.toml")] {
            std::fs::copy(examples.join(&file), dir.path().join(&file)).unwrap();
        }
    }
    dir
}

/// `runs show PARENT` of a parked parent says what each child needs from
/// the child's own status, not from the status the parent recorded when
/// it last looked: once the child was approved (and ended), the hint says
/// so and offers the parent's resume alone; while it waits, the show of
/// the child comes first and the resume follows it (`then`, never
/// `or then`).
#[test]
fn runs_show_parent_reads_each_childs_own_status_for_its_hint() {
    let dir = planner_demo();
    let writer = std::fs::read_to_string(dir.path().join("writer.toml"))
        .unwrap()
        .replace("approval = { write_file = \"never\" }\n", "");
    std::fs::write(dir.path().join("writer.toml"), writer).unwrap();
    let out = warden(
        &["run", "planner.toml", "Plan the week", "--run-id", "plan-3"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "parked: {}", stderr(&out));
    let text = stdout(&warden(&["runs", "show", "plan-3"], dir.path()));
    assert!(
        text.contains(
            "its child run plan-3.call-2-1 is awaiting_approval: see what it needs with: warden runs show plan-3.call-2-1\n   then once it was answered, continue both with: warden runs resume plan-3"
        ),
        "{text}"
    );
    assert!(!text.contains("or then"), "{text}");

    let out = warden(
        &["runs", "approve", "plan-3.call-2-1", "call-1-1"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&warden(&["runs", "show", "plan-3"], dir.path()));
    assert!(
        text.contains("↳ call-2-1 → run plan-3.call-2-1 (agent writer) completed"),
        "{text}"
    );
    // The timeline still shows what was recorded then; the hint is now's.
    let hint = &text[text.find("\nstatus: ").expect("a status line")..];
    assert_eq!(
        hint,
        "\nstatus: awaiting_child\n   its child run plan-3.call-2-1 is completed: continue with: warden runs resume plan-3\n",
        "{text}"
    );
    let shown = json_out(&warden(&["--json", "runs", "show", "plan-3"], dir.path()));
    assert_eq!(shown["status"], "awaiting_child", "{shown}");
    assert_eq!(
        shown["next"],
        serde_json::json!([{ "action": "resume", "command": "warden runs resume plan-3" }]),
        "{shown}"
    );
}

/// The planner example: offline, its two agents run as child runs; `runs
/// show` shows the tree both ways; without the writer's approval rule the
/// writer waits for approval, listed with every other run, its parent
/// `awaiting_child`, and approving it then resuming the planner finishes
/// both.
#[test]
fn the_planner_example_runs_its_agents_as_child_runs_and_a_waiting_child_parks_it() {
    let dir = planner_demo();
    let out = warden(
        &["run", "planner.toml", "Plan the week", "--run-id", "plan-1"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let plan = dir.path().join("out/plan.md");
    assert!(
        std::fs::read_to_string(&plan)
            .unwrap()
            .starts_with("# Plan")
    );
    let shown = json_out(&warden(&["--json", "runs", "show", "plan-1"], dir.path()));
    let children = shown["children"].as_array().unwrap();
    assert_eq!(children.len(), 2, "{shown}");
    assert_eq!(children[0]["run_id"], "plan-1.call-1-1");
    assert_eq!(children[0]["agent"], "reader");
    assert_eq!(children[0]["status"], "completed");
    assert_eq!(children[1]["run_id"], "plan-1.call-2-1");
    assert_eq!(children[1]["agent"], "writer");
    let text = stdout(&warden(&["runs", "show", "plan-1"], dir.path()));
    assert!(
        text.contains("↳ call-1-1 → run plan-1.call-1-1 (agent reader) completed"),
        "{text}"
    );
    assert!(text.contains("started child run plan-1.call-2-1"), "{text}");
    let child = json_out(&warden(
        &["--json", "runs", "show", "plan-1.call-2-1"],
        dir.path(),
    ));
    assert_eq!(child["parent"]["run_id"], "plan-1");
    assert_eq!(child["parent"]["call_id"], "call-2-1");
    let text = stdout(&warden(&["runs", "show", "plan-1.call-2-1"], dir.path()));
    assert!(
        text.contains("child of run plan-1 (its call call-2-1)"),
        "{text}"
    );

    // The writer's write now needs approval.
    std::fs::remove_file(&plan).unwrap();
    let writer = std::fs::read_to_string(dir.path().join("writer.toml"))
        .unwrap()
        .replace("approval = { write_file = \"never\" }\n", "");
    std::fs::write(dir.path().join("writer.toml"), writer).unwrap();
    let out = warden(
        &["run", "planner.toml", "Plan the week", "--run-id", "plan-2"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "parked: {}", stderr(&out));
    let listed = json_out(&warden(
        &["--json", "runs", "list", "--status", "awaiting_approval"],
        dir.path(),
    ));
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["plan-2.call-2-1"], "{listed}");
    let parent = json_out(&warden(&["--json", "runs", "show", "plan-2"], dir.path()));
    assert_eq!(parent["status"], "awaiting_child", "{parent}");
    assert_eq!(parent["children"][1]["status"], "awaiting_approval");
    assert!(!plan.exists(), "nothing written before approval");
    let out = warden(
        &["runs", "approve", "plan-2.call-2-1", "call-1-1"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(plan.exists());
    let out = warden(&["--json", "runs", "resume", "plan-2"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = json_out(&warden(&["--json", "runs", "show", "plan-2"], dir.path()));
    assert_eq!(shown["status"], "completed", "{shown}");
}

/// The plan example (examples/plans/review.toml), from `warden run` as the
/// README says: a planner, three workers as one step and a reviewer, each
/// a child run in `runs show`'s tree, the reviewer's typed result the
/// output; without the reviewer's approval rule the reviewer waits for
/// approval, the plan's run is `awaiting_child` and `run` exits 4, and
/// approving the reviewer then resuming the plan finishes both. A bad
/// plan exits 2 with `plan_invalid` naming the key, and creates no store.
#[test]
fn the_plan_example_runs_from_warden_run_and_a_waiting_role_parks_it() {
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let copy = |from: &str, to: &str| {
        std::fs::create_dir_all(dir.path().join(to)).unwrap();
        for entry in std::fs::read_dir(examples.join(from)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.path().join(to).join(entry.file_name())).unwrap();
        }
    };
    copy("agents/notes", "agents/notes");
    for name in ["review", "planner", "worker", "reviewer"] {
        std::fs::copy(
            examples.join(format!("plans/{name}.toml")),
            dir.path().join(format!("{name}.toml")),
        )
        .unwrap();
        if name != "review" {
            std::fs::copy(
                examples.join(format!("plans/{name}.transcript.toml")),
                dir.path().join(format!("{name}.transcript.toml")),
            )
            .unwrap();
        }
    }
    std::fs::create_dir(dir.path().join("out")).unwrap();
    // The planner's notes are `../agents/notes` from its file.
    let planner = std::fs::read_to_string(dir.path().join("planner.toml"))
        .unwrap()
        .replace("dir = \"../agents/notes\"", "dir = \"agents/notes\"");
    std::fs::write(dir.path().join("planner.toml"), planner).unwrap();

    let bad = std::fs::read_to_string(dir.path().join("review.toml"))
        .unwrap()
        .replace("roles = [\"reviewer\"]", "roles = [\"judge\"]");
    std::fs::write(dir.path().join("bad.toml"), bad).unwrap();
    let out = warden(&["--json", "run", "bad.toml", "go"], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let error = &json_out(&out)["error"];
    assert_eq!(error["code"], "plan_invalid", "{error}");
    assert_eq!(error["details"]["problem"], "unknown_role", "{error}");
    assert_eq!(error["details"]["key"], "phases[2].roles", "{error}");
    assert!(
        !dir.path().join(".warden").exists(),
        "a refusal records nothing"
    );

    let out = warden(
        &[
            "run",
            "review.toml",
            "Plan the week",
            "--run-id",
            "review-1",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(dir.path().join("out/review.md").exists());
    let shown = json_out(&warden(&["--json", "runs", "show", "review-1"], dir.path()));
    assert_eq!(shown["status"], "completed", "{shown}");
    assert_eq!(shown["output"]["approved"], true, "{shown}");
    let children = shown["children"].as_array().unwrap();
    let agents: Vec<&str> = children
        .iter()
        .map(|c| c["agent"].as_str().unwrap())
        .collect();
    assert_eq!(
        agents,
        ["planner", "worker", "worker", "worker", "reviewer"]
    );
    assert_eq!(children[3]["run_id"], "review-1.call-2-3");
    let text = stdout(&warden(&["runs", "show", "review-1"], dir.path()));
    assert!(
        text.contains("↳ call-2-2 → run review-1.call-2-2 (agent worker) completed"),
        "{text}"
    );

    std::fs::remove_file(dir.path().join("out/review.md")).unwrap();
    let reviewer = std::fs::read_to_string(dir.path().join("reviewer.toml"))
        .unwrap()
        .replace("approval = { write_file = \"never\" }\n", "");
    std::fs::write(dir.path().join("reviewer.toml"), reviewer).unwrap();
    let out = warden(
        &[
            "run",
            "review.toml",
            "Plan the week",
            "--run-id",
            "review-2",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "parked: {}", stderr(&out));
    let parent = json_out(&warden(&["--json", "runs", "show", "review-2"], dir.path()));
    assert_eq!(parent["status"], "awaiting_child", "{parent}");
    assert!(!dir.path().join("out/review.md").exists());
    let out = warden(
        &["runs", "approve", "review-2.call-3-1", "call-1-1"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = warden(&["runs", "resume", "review-2"], dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = json_out(&warden(&["--json", "runs", "show", "review-2"], dir.path()));
    assert_eq!(shown["status"], "completed", "{shown}");
    assert!(dir.path().join("out/review.md").exists());
}

/// `runs show --follow` follows a run live across processes: it prints the
/// history, then each event another process records (here an approval and
/// the drive it causes, from `runs approve`), and exits once the run ends.
#[test]
fn runs_show_follow_prints_what_another_process_records_until_the_run_ends() {
    use std::io::{BufRead as _, BufReader};
    let dir = demo();
    let out = warden(&["run", "notes.toml", "go", "--run-id", "f"], dir.path());
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let mut follower = command(&["runs", "show", "f", "--follow"], dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let following = line.starts_with("following run f until it ends");
        seen.push(line);
        if following {
            break;
        }
    }
    assert!(
        seen.iter().any(|l| l.contains("status: awaiting_approval")),
        "{seen:#?}"
    );
    let out = warden(
        &["runs", "approve", "f", "call-3-1", "--by", "tester"],
        dir.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let status = follower.wait().unwrap();
    assert!(status.success(), "{rest:#?}");
    let text = rest.join("\n");
    assert!(text.contains("✓ call-3-1 approved by tester"), "{text}");
    assert!(text.contains("✓ completed"), "{text}");
    assert!(text.ends_with("status: completed"), "{text}");
    let out = warden(&["--json", "runs", "show", "f", "--follow"], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
}
