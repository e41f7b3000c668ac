//! Budgets from the operator's side, with the real binary, the real SQLite
//! store and the real plugins: parked time is not active time, a budget
//! crossed by a model call starts none of its tool calls, a call whose input
//! alone would cross the cost budget is not made, an input over the cap is
//! refused before anything (even the store) exists, messages are in human
//! units, and `runs show` reports the limits the log records.

mod common;

use std::path::Path;
use std::sync::Arc;
use warden::engine::StartOptions;

use common::{demo, stderr, stdout, warden};
use serde_json::Value;

fn event_types(dir: &Path, run: &str) -> Vec<String> {
    let out = warden(&["runs", "events", run], dir);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["event"]["type"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// The quick start, approved 20 minutes after it parked: the run started
/// and parked under a clock 20 minutes behind (the library's injected
/// clock), the binary approves now. Its 5-minute wall-time budget counts
/// only the time the run was active.
#[test]
fn approving_long_after_the_park_succeeds_within_the_wall_time_budget() {
    use warden::engine::{Agent, FixedClock, FixedRandom, RunId, RunStatus, Runtime};
    let dir = demo();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let twenty_minutes_ago = now - 20 * 60_000;
    std::fs::create_dir(dir.path().join(".warden")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = Arc::new(
            warden::store::SqliteStore::open(dir.path().join(".warden/warden.db")).unwrap(),
        );
        let sandbox = warden::sandbox::Sandbox::new(warden::sandbox::SandboxConfig {
            cache_dir: Some(std::env::temp_dir().join("warden-cli-test-cache")),
            ..Default::default()
        })
        .unwrap();
        let runtime = Runtime::new(store, warden::plugins::PluginHost::new(sandbox)).with_hooks(
            Arc::new(FixedClock(twenty_minutes_ago)),
            Arc::new(FixedRandom(7)),
        );
        let agent = Agent::load(&dir.path().join("notes.toml"), None).unwrap();
        let run = RunId::new("late").unwrap();
        runtime
            .start(
                &agent,
                serde_json::json!("Summarise my notes"),
                StartOptions::new().id(run.clone()),
            )
            .await
            .unwrap();
        assert_eq!(
            runtime.drive(&run, &agent).await.unwrap(),
            RunStatus::AwaitingApproval
        );
    });
    let out = warden(
        &["runs", "approve", "late", "call-3-1", "--by", "tester"],
        dir.path(),
    );
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("run late: completed"),
        "{}",
        stdout(&out)
    );
    assert!(dir.path().join("notes/SUMMARY.md").exists());
    // What the run used is active time: seconds, not the 20 minutes.
    let out = warden(&["runs", "show", "late", "--json"], dir.path());
    let shown: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let used = shown["budget"]["wall_time"]["used"].as_u64().unwrap();
    assert!(used < 60_000, "{used} ms counted");
    assert_eq!(shown["budget"]["wall_time"]["limit"], 300_000);
}

/// The notes agent with a transcript whose first answer reports 200,000
/// input tokens and 10 output tokens ($0.60015 at $3 and $15 a million,
/// against $0.50) and calls a tool.
fn costly_demo() -> tempfile::TempDir {
    let dir = demo();
    std::fs::write(
        dir.path().join("notes.transcript.toml"),
        r#"
[[turns]]
text = "Let me see what is in the notes folder."
usage = { input_tokens = 200_000, output_tokens = 10 }
[[turns.tool_calls]]
name = "fs__list_dir"

[[turns]]
text = "The folder holds one todo list."
usage = { input_tokens = 10, output_tokens = 10 }
"#,
    )
    .unwrap();
    dir
}

#[test]
fn a_budget_crossed_mid_turn_runs_no_further_tool() {
    let dir = costly_demo();
    let out = warden(
        &["run", "notes.toml", "go", "--run-id", "costly"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("! budget exceeded: cost: $0.60015 used of $0.50"),
        "{text}"
    );
    assert!(!text.contains("→ call-1-1"), "the tool call ran: {text}");
    assert!(text.contains("run costly: budget_exceeded"), "{text}");
    assert!(
        text.contains(r#"warden runs resume costly --input '{"max_cost": <new limit>}'"#),
        "{text}"
    );
    let types = event_types(dir.path(), "costly");
    assert!(!types.iter().any(|t| t == "tool_call_intent"), "{types:?}");
    assert_eq!(types.last().map(String::as_str), Some("budget_exceeded"));

    // The summary is in human units, and an extension too small says what
    // is needed without recording anything.
    let out = warden(&["runs", "show", "costly"], dir.path());
    assert!(
        stdout(&out).contains("cost $0.60015 of $0.50"),
        "{}",
        stdout(&out)
    );
    let out = warden(
        &[
            "runs",
            "resume",
            "costly",
            "--input",
            r#"{"max_cost": 0.55}"#,
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out)
            .contains("must raise `max_cost` to more than 0.60015 (what was used), got 0.55"),
        "{}",
        stderr(&out)
    );
    assert_eq!(event_types(dir.path(), "costly"), types);
    let out = warden(
        &[
            "runs",
            "resume",
            "costly",
            "--input",
            r#"{"max_cost": 1}"#,
            "--by",
            "tester",
        ],
        dir.path(),
    );
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("… budget extended by tester: max_cost $1.00"),
        "{text}"
    );
    assert!(text.contains("→ call-1-1 fs__list_dir"), "{text}");
    assert!(text.contains("run costly: completed"), "{text}");
}

#[test]
fn a_model_call_whose_input_alone_would_cross_the_cost_budget_is_not_made() {
    let dir = demo();
    // 900 KB of input (under the 1 MiB cap): some 225,000 tokens, $0.68 at
    // $3 a million, against the demo's $0.50.
    std::fs::write(
        dir.path().join("big.json"),
        serde_json::to_string(&"note ".repeat(180_000)).unwrap(),
    )
    .unwrap();
    let out = warden(
        &["run", "notes.toml", "@big.json", "--run-id", "big"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(
            "! budget exceeded: cost: $0.00 used of $0.50; the next model call needs $0.6"
        ),
        "{text}"
    );
    let types = event_types(dir.path(), "big");
    assert!(!types.iter().any(|t| t == "model_call_intent"), "{types:?}");
}

#[test]
fn an_input_over_the_cap_is_refused_before_anything_is_recorded() {
    let dir = demo();
    std::fs::write(
        dir.path().join("huge.json"),
        serde_json::to_string(&"x".repeat(2 * 1024 * 1024)).unwrap(),
    )
    .unwrap();
    let out = warden(&["run", "notes.toml", "@huge.json"], dir.path());
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("the input is 2.0 MiB of JSON, over the limit of 1 MiB (the agent's budgets.max_input_size)"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.path().join(".warden").exists(), "a store was created");
    let out = warden(&["run", "notes.toml", "@huge.json", "--json"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    let error: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(error["error"]["code"], "input_too_large");
    assert_eq!(error["error"]["details"]["limit"], 1_048_576);
    let out = warden(&["submit", "notes.toml", "@huge.json"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(!dir.path().join(".warden").exists(), "a store was created");
    // The cap is the agent's to raise.
    let agent = std::fs::read_to_string(dir.path().join("notes.toml"))
        .unwrap()
        .replace(
            "max_cost = 0.50",
            "max_cost = 0.50\nmax_input_size = \"4MiB\"",
        );
    std::fs::write(dir.path().join("notes.toml"), agent).unwrap();
    let out = warden(
        &["run", "notes.toml", "@huge.json", "--run-id", "raised"],
        dir.path(),
    );
    // Accepted now; the cost budget stops its first model call instead.
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("the next model call needs"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn runs_show_reports_the_limits_the_log_records() {
    let dir = costly_demo();
    let out = warden(
        &["run", "notes.toml", "go", "--run-id", "limits"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    // The agent file changes after the run started: the run's limits do not.
    let agent = std::fs::read_to_string(dir.path().join("notes.toml"))
        .unwrap()
        .replace("max_cost = 0.50", "max_cost = 9.00")
        .replace("max_wall_time = \"5m\"", "max_wall_time = \"1h\"");
    std::fs::write(dir.path().join("notes.toml"), agent).unwrap();
    let out = warden(&["runs", "show", "limits"], dir.path());
    let text = stdout(&out);
    assert!(text.contains("cost $0.60015 of $0.50"), "{text}");
    assert!(text.contains("of 5m"), "{text}");
    assert!(!text.contains("limits from the agent file"), "{text}");
    let out = warden(&["runs", "show", "limits", "--json"], dir.path());
    let shown: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(shown["limits_from"], "log");
    assert_eq!(shown["budget"]["cost"]["limit"], 500_000_000);
    assert_eq!(shown["max_input_bytes"], 1_048_576);
}

/// A parked run's cost says every digit of what the next model call needs
/// (never rounded to cents): a limit rounded down to cents is refused
/// naming the exact need rather than "at least 0.01 … got 0.01", and the
/// amount as shown, given back as the new limit, is accepted.
#[test]
fn a_parked_runs_cost_has_the_digits_to_act_on() {
    let dir = demo();
    let agent = std::fs::read_to_string(dir.path().join("notes.toml"))
        .unwrap()
        .replace("max_cost = 0.50", "max_cost = 0.01");
    std::fs::write(dir.path().join("notes.toml"), agent).unwrap();
    // Some 3,500 tokens of input: a little over a cent at $3 a million.
    std::fs::write(
        dir.path().join("input.json"),
        serde_json::to_string(&"note ".repeat(2_800)).unwrap(),
    )
    .unwrap();
    let out = warden(
        &["run", "notes.toml", "@input.json", "--run-id", "cent"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let out = warden(&["runs", "events", "cent"], dir.path());
    let needed = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find_map(|v| v["event"]["needed"].as_u64())
        .expect("the refused call's need is recorded");
    assert!(
        needed > 10_000_000 && !needed.is_multiple_of(10_000_000),
        "the need is more than a cent, and not in whole cents: {needed}"
    );
    let fraction = format!("{:09}", needed % 1_000_000_000);
    let shown = format!("0.{}", fraction.trim_end_matches('0'));
    let text = stdout(&warden(&["runs", "show", "cent"], dir.path()));
    assert!(
        text.contains(&format!("the next model call needs ${shown} in all")),
        "{text}"
    );

    let out = warden(
        &["runs", "resume", "cent", "--input", r#"{"max_cost": 0.01}"#],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains(&format!(
            "must raise `max_cost` to at least {shown} (what the refused model call needs), got 0.01"
        )),
        "{}",
        stderr(&out)
    );
    let out = warden(
        &[
            "runs",
            "resume",
            "cent",
            "--input",
            &format!(r#"{{"max_cost": {shown}}}"#),
        ],
        dir.path(),
    );
    assert_ne!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("max_cost ${shown}")),
        "{}",
        stdout(&out)
    );
}

/// A planner whose one response calls a worker agent `calls` times (the
/// worker answers at once), with `config` as the operator's `warden.toml`.
fn planner_dir(calls: usize, config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    write(
        "worker.toml",
        "name = \"worker\"\ninstructions = \"Do the task.\"\n\n[model]\nprovider = \"scripted\"\nname = \"script\"\ntranscript = \"worker.transcript.toml\"\n",
    );
    write("worker.transcript.toml", "[[turns]]\ntext = \"Done.\"\n");
    write(
        "planner.toml",
        "name = \"planner\"\ninstructions = \"Hand out the parts.\"\n\n[model]\nprovider = \"scripted\"\nname = \"script\"\ntranscript = \"planner.transcript.toml\"\n\n[agents.worker]\nagent = \"worker.toml\"\ndescription = \"Does one part\"\n",
    );
    let mut turns = String::from("[[turns]]\ntext = \"Fanning out.\"\n");
    for n in 0..calls {
        turns.push_str(&format!(
            "[[turns.tool_calls]]\nname = \"worker\"\narguments = {{ task = \"part {n}\" }}\n"
        ));
    }
    turns.push_str("\n[[turns]]\ntext = \"All done.\"\n");
    write("planner.transcript.toml", &turns);
    write("warden.toml", config);
    dir
}

/// Runs the planner in `dir` to the end; returns how many child runs it
/// started and the errors of the calls refused.
fn fan_out(dir: &Path, run: &str) -> (usize, Vec<Value>) {
    let out = warden(&["run", "planner.toml", "go", "--run-id", run], dir);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let out = warden(&["runs", "events", run], dir);
    assert!(out.status.success(), "{}", stderr(&out));
    let events: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["event"].clone())
        .collect();
    let started = events
        .iter()
        .filter(|e| e["type"] == "child_started")
        .count();
    let refused = events
        .iter()
        .filter(|e| e["type"] == "tool_call_rejected")
        .map(|e| e["error"].clone())
        .collect();
    (started, refused)
}

/// Issue 37, item 9: with no budgets set, one response asking for more
/// child runs or tool calls than the host's default ceilings starts only
/// as many as they allow; each call past them is refused with an error
/// naming the ceiling, its value and how to raise it. `[ceilings]` raises
/// (or lowers) each, and `config show` lists them.
#[test]
fn one_response_starts_no_more_than_the_ceilings_allow() {
    let refusal = |ceiling: &str, limit: u64| serde_json::json!({"kind": "ceiling_reached", "ceiling": ceiling, "limit": limit});
    // Nine children at once: the default allows eight.
    let dir = planner_dir(9, "");
    let (started, refused) = fan_out(dir.path(), "wide");
    assert_eq!(started, 8);
    assert_eq!(refused, [refusal("children_per_response", 8)]);
    let out = warden(&["runs", "show", "wide"], dir.path());
    let text = stdout(&out);
    assert!(
        text.contains("`children_per_response` = 8")
            && text.contains("raises `[ceilings] children_per_response` in warden.toml"),
        "{text}"
    );
    // The operator raises it: all nine start.
    std::fs::write(
        dir.path().join("warden.toml"),
        "[ceilings]\nchildren_per_response = 9\n",
    )
    .unwrap();
    let (started, refused) = fan_out(dir.path(), "wider");
    assert_eq!((started, refused), (9, vec![]));
    let out = warden(&["config", "show", "--json"], dir.path());
    let shown: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(shown["ceilings"]["children_per_response"], 9);
    assert_eq!(shown["ceilings"]["tool_calls_per_response"], 64);
    assert_eq!(shown["ceilings"]["children_per_run"], 32);
    assert_eq!(shown["ceilings"]["fuel_per_run"], 1_000_000_000_000u64);
    let out = warden(&["config", "show"], dir.path());
    assert!(
        stdout(&out).contains("children_per_response = 9\n"),
        "{}",
        stdout(&out)
    );

    // Sixty-six calls with the child ceilings raised: the default of 64
    // calls per response holds.
    let dir = planner_dir(
        66,
        "[ceilings]\nchildren_per_response = 100\nchildren_per_run = 100\n",
    );
    let (started, refused) = fan_out(dir.path(), "many");
    assert_eq!(started, 64);
    assert_eq!(
        refused,
        [
            refusal("tool_calls_per_response", 64),
            refusal("tool_calls_per_response", 64)
        ]
    );

    // Children per run, lowered by the operator.
    let dir = planner_dir(3, "[ceilings]\nchildren_per_run = 2\n");
    let (started, refused) = fan_out(dir.path(), "few");
    assert_eq!(started, 2);
    assert_eq!(refused, [refusal("children_per_run", 2)]);

    // A ceiling of nothing is refused, naming the key.
    let dir = planner_dir(1, "[ceilings]\ntool_calls_per_response = 0\n");
    let out = warden(&["config", "show"], dir.path());
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("ceilings.tool_calls_per_response"),
        "{}",
        stderr(&out)
    );
    let dir = planner_dir(1, "[ceilings]\nchildren_per_respons = 3\n");
    let out = warden(&["config", "show"], dir.path());
    assert!(!out.status.success(), "an unknown key is refused");
    assert!(
        stderr(&out).contains("children_per_respons"),
        "{}",
        stderr(&out)
    );
}
