//! latis' session commands against a real daemon: `session create --task` in a directory (the
//! ad-hoc campaign), `-c session.yaml`, drivers and mounts, the latis list and `session status`,
//! `delete` and `prune`; and `session attach` used the way a person uses it: in a terminal
//! (tmux), typing, reading the screen, Ctrl-D.

use std::path::Path;

use paddock_proto::obey::local::v1 as pb;
use serde_json::json;

use crate::cli::{cli, run, Out};
use crate::harness::*;
use crate::terminal::{above_prompt, Tmux};

/// `paddock --no-autostart <args>` run in `dir` (the CLI's current directory).
pub(crate) async fn cli_in(d: &Daemon, dir: &Path, args: &[&str]) -> Out {
    let mut cmd = d.dirs.cli(false);
    cmd.current_dir(dir);
    run(cmd, args).await
}

/// The id in "Session <id> created.".
pub(crate) fn created_id(o: &Out) -> String {
    let first = o.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("Session sess_") && first.ends_with(" created."),
        "{o:?}"
    );
    first.split_whitespace().nth(1).unwrap().to_string()
}

/// A table's rows as cells (columns are two or more spaces apart; no cell holds two spaces in
/// a row).
fn cells(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_with_a_task_runs_in_the_current_directory_and_lists_like_latis() {
    let d = Daemon::start().await;
    let root = d.dirs.root.display().to_string();
    let script = d.dirs.script("fixed", &fixed_turn());
    let cfg = format!("script={script}");

    // The first create in a directory registers it as a campaign; the next one reuses it.
    let o = cli_in(
        &d,
        &d.dirs.root,
        &[
            "session",
            "create",
            "--task",
            "Fix the failing tests",
            "--config",
            &cfg,
        ],
    )
    .await
    .ok();
    let first = created_id(&o);
    assert_eq!(
        o.stderr.trim(),
        format!("paddock: registered {root} as campaign \"project\"")
    );
    assert!(
        o.stdout
            .lines()
            .nth(1)
            .unwrap()
            .ends_with(&format!("in {root}")),
        "{o:?}"
    );
    let o = cli_in(
        &d,
        &d.dirs.root.join("src"),
        &[
            "session",
            "create",
            "--task",
            "Refactor the authentication module and keep every public function's signature",
            "--mount",
            "..:/workspace",
            "--name",
            "refactorer",
            "--config",
            &cfg,
        ],
    )
    .await
    .ok();
    let second = created_id(&o);
    assert_eq!(o.stderr, "", "the campaign is reused: {o:?}");
    let o = cli(&d, &["--json", "campaign", "list"]).await.ok();
    let camps = o.json();
    assert_eq!(camps.as_array().unwrap().len(), 1, "{camps}");
    assert_eq!(camps[0]["root_path"], root.as_str());

    // A session without a task is "ready"; one whose turn ended is "complete".
    let o = cli(
        &d,
        &[
            "session",
            "create",
            "--campaign",
            "project",
            "--name",
            "idle",
            "--config",
            &cfg,
        ],
    )
    .await
    .ok();
    let idle = created_id(&o);
    for id in [&first, &second] {
        d.wait_status(id, pb::SessionStatus::Running).await;
    }
    let o = cli(
        &d,
        &[
            "session",
            "create",
            "--task",
            "Stop me",
            "--campaign",
            "project",
            "--config",
            &cfg,
        ],
    )
    .await
    .ok();
    let stopped = created_id(&o);
    d.wait_status(&stopped, pb::SessionStatus::Running).await;
    cli(&d, &["session", "stop", &stopped]).await.ok();

    let o = cli(&d, &["session", "list", "--all"]).await.ok();
    let mut rows = cells(&o.stdout);
    // Ids and ages vary: named by creation order, ages checked for their shape.
    for row in rows.iter_mut().skip(1) {
        let age = &row[4];
        assert!(
            age.ends_with('s') && age[..age.len() - 1].parse::<u32>().is_ok(),
            "{age}"
        );
        row[4] = "<age>".into();
        row[0] = match row[0].as_str() {
            id if id == first => "<first>",
            id if id == second => "<second>",
            id if id == idle => "<idle>",
            id if id == stopped => "<stopped>",
            other => panic!("unknown id {other}"),
        }
        .into();
        // Generated names end in the id's last characters.
        if row[5].starts_with("scripted-") {
            row[5] = "scripted-<id>".into();
        }
    }
    rows[1..].sort();
    let text: Vec<String> = rows.iter().map(|r| r.join(" | ")).collect();
    insta::assert_snapshot!("latis_session_list", text.join("\n"));

    // Live only by default; --json carries the latis fields too.
    let o = cli(&d, &["session", "list"]).await.ok();
    assert_eq!(o.stdout.lines().count(), 4, "{o:?}");
    let o = cli(&d, &["--json", "session", "list"]).await.ok();
    let j = o.json();
    let mine = j
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == first.as_str())
        .unwrap();
    assert_eq!(mine["state"], "complete");
    assert_eq!(mine["status"], "RUNNING");
    assert_eq!(mine["driver"], "local");
    assert_eq!(mine["initial_message"], "Fix the failing tests");
    assert_eq!(mine["turns_completed"], 1);
    assert_eq!(mine["working_dir"], root.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_latis_state_the_task_and_the_error() {
    let d = Daemon::start().await;
    let fixed = format!("script={}", d.dirs.script("fixed", &fixed_turn()));
    let crash = format!(
        "script={}",
        d.dirs.script(
            "crash",
            &turns(json!([{"thinking": "hmm"}, {"stderr": "kaboom"}, {"crash": 9}]))
        )
    );
    let root = &d.dirs.root;

    let ok = create_task(&d, "Add unit tests", &fixed).await;
    d.wait_status(&ok, pb::SessionStatus::Running).await;
    let o = cli(&d, &["session", "status", &ok]).await.ok();
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines[0], format!("Session {ok} - complete"), "{o:?}");
    let field = |name: &str| -> String {
        let prefix = format!("{name}:");
        lines
            .iter()
            .map(|l| l.trim_start())
            .find(|l| l.starts_with(&prefix))
            .map(|l| l[prefix.len()..].trim().to_string())
            .unwrap_or_else(|| panic!("no {name} in {o:?}"))
    };
    assert_eq!(
        field("state"),
        "complete (status RUNNING, 1 turn(s) completed)"
    );
    assert_eq!(field("task"), "Add unit tests");
    assert_eq!(
        field("driver"),
        format!("local (no isolation; working directory {})", root.display())
    );
    assert_eq!(field("provider"), "scripted");
    assert!(field("tokens").ends_with(" out"), "{o:?}");
    assert!(!o.stdout.contains("error:"), "{o:?}");
    // A unique suffix of the id works too; --json is the session's fields with the state.
    let o = cli(&d, &["--json", "session", "status", &ok[ok.len() - 6..]])
        .await
        .ok();
    assert_eq!(o.json()["state"], "complete");
    assert_eq!(o.json()["id"], ok.as_str());

    let o = cli_in(
        &d,
        root,
        &["session", "create", "--task", "Crash", "--config", &crash],
    )
    .await;
    // The task's turn crashes the agent: the session may fail before or after the answer.
    let failed = if o.code == 0 {
        created_id(&o)
    } else {
        panic!("{o:?}")
    };
    d.wait_status(&failed, pb::SessionStatus::Failed).await;
    let o = cli(&d, &["session", "status", &failed]).await.ok();
    assert!(
        o.stdout
            .starts_with(&format!("Session {failed} - failed\n")),
        "{o:?}"
    );
    let error = o
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line: {o:?}"));
    assert!(
        error.contains("OBEY-2031") && error.contains("kaboom"),
        "{error}"
    );

    cli(&d, &["session", "status", "sess_nope"])
        .await
        .fails_with("OBEY-2010: session \"sess_nope\" not found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_yaml_flags_override_it_and_unknown_keys_are_errors() {
    let d = Daemon::start().await;
    let script = d.dirs.script("fixed", &fixed_turn());
    // The file lives beside the project; its mount is relative to the file.
    let conf = d.dirs.base.join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    let yaml = conf.join("session.yaml");
    std::fs::write(
        &yaml,
        format!(
            "task: Fix the failing tests in this repo\n\
             driver: local\n\
             mounts:\n  - ../project:/workspace\n\
             provider: scripted\n\
             name: from-file\n\
             max_tokens: 100000\n\
             timeout: 600\n\
             config:\n  script: {script}\n\
             env:\n  GREETING: hello\n"
        ),
    )
    .unwrap();
    let y = yaml.display().to_string();
    let o = cli_in(
        &d,
        &d.dirs.home,
        &[
            "--json",
            "session",
            "create",
            "-c",
            &y,
            "--name",
            "from-flag",
        ],
    )
    .await
    .ok();
    let j = o.json();
    assert_eq!(j["agent_name"], "from-flag");
    assert_eq!(j["initial_message"], "Fix the failing tests in this repo");
    assert_eq!(j["working_dir"], d.dirs.root.display().to_string());
    assert_eq!(j["max_tokens"], 100000);
    assert_eq!(j["provider_config"]["script"], script.as_str());
    assert_eq!(j["driver"], "local");
    let id = j["id"].as_str().unwrap().to_string();
    let s = d.wait_status(&id, pb::SessionStatus::Running).await;
    assert_eq!(s.timeout.map(|t| t.seconds), Some(600));
    assert_eq!(s.turns_completed, 1);

    // Unknown keys, bad values, bad drivers: exit 1, the file and the key named, nothing made.
    let bad = conf.join("bad.yaml");
    std::fs::write(
        &bad,
        "task: x\nimage: ghcr.io/shanemcd/latis-workspace:latest\n",
    )
    .unwrap();
    let b = bad.display().to_string();
    let o = cli(&d, &["session", "create", "-c", &b])
        .await
        .fails_with(&format!("{b}: unknown field `image`, expected one of"));
    assert!(
        o.stderr.contains("`task`") && o.stderr.contains("`mounts`"),
        "{o:?}"
    );
    std::fs::write(&bad, "task: x\ntimeout: soon\n").unwrap();
    cli(&d, &["session", "create", "-c", &b])
        .await
        .fails_with(&format!("{b}: timeout: invalid type"));
    std::fs::write(&bad, "task: x\ndriver: kubernetes\n").unwrap();
    cli(&d, &["session", "create", "-c", &b])
        .await
        .fails_with("the kubernetes driver needs an image (--image) or a podSpec");
    cli(
        &d,
        &["session", "create", "-c", "/nonexistent/session.yaml"],
    )
    .await
    .fails_with("/nonexistent/session.yaml: No such file");
    let o = cli(&d, &["--json", "session", "list", "--all"]).await.ok();
    assert_eq!(
        o.json().as_array().unwrap().len(),
        1,
        "nothing else was created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drivers_and_mounts_under_the_local_driver() {
    let d = Daemon::start().await;
    let root = d.dirs.root.display().to_string();
    let base = &d.dirs.base;
    for driver in ["docker"] {
        let o = cli_in(
            &d,
            base,
            &["session", "create", "--task", "t", "--driver", driver],
        )
        .await
        .fails_with(&format!("driver \"{driver}\" is not available"));
        assert!(o.stderr.contains("the drivers are: local"), "{o:?}");
    }
    // A kubernetes session needs its pod's image (the cluster is only reached after).
    cli_in(
        &d,
        base,
        &["session", "create", "--task", "t", "--driver", "kubernetes"],
    )
    .await
    .fails_with("the kubernetes driver needs an image");
    cli_in(
        &d,
        base,
        &["session", "create", "--task", "t", "--driver", "lokal"],
    )
    .await
    .fails_with("unknown driver \"lokal\"; the drivers are: local");

    // SRC:/workspace (or .) is the working directory.
    let o = cli_in(
        &d,
        base,
        &[
            "--json",
            "session",
            "create",
            "--driver",
            "local",
            "--mount",
            "project:/workspace",
        ],
    )
    .await
    .ok();
    assert_eq!(o.json()["working_dir"], root.as_str());
    assert_eq!(o.json()["state"], "ready");
    let o = cli_in(
        &d,
        &d.dirs.home,
        &[
            "--json",
            "session",
            "create",
            "--mount",
            &format!("{root}:."),
        ],
    )
    .await
    .ok();
    assert_eq!(o.json()["working_dir"], root.as_str());

    // Anything that would need isolation is refused, saying why.
    let o = cli_in(&d, base, &["session", "create", "--mount", "project:/src"])
        .await
        .fails_with("mount \"project:/src\": destination \"/src\" is not /workspace");
    assert!(
        o.stderr.contains("does not isolate the filesystem"),
        "{o:?}"
    );
    cli_in(
        &d,
        base,
        &["session", "create", "--mount", "project:/workspace:Z"],
    )
    .await
    .fails_with("mount \"project:/workspace:Z\": mount options are not supported");
    cli_in(
        &d,
        base,
        &[
            "session",
            "create",
            "--mount",
            "project:/workspace",
            "--mount",
            "home:/workspace",
        ],
    )
    .await
    .fails_with("2 mounts given: a session has one workspace (SRC:/workspace)");
    // A path that is not there is a wrong argument: exit 2, as for a session file.
    let o = cli_in(
        &d,
        base,
        &["session", "create", "--mount", "missing:/workspace"],
    )
    .await
    .fails_with("mount \"missing:/workspace\": ");
    assert_eq!(o.code, 2, "{o:?}");
    let o = cli_in(&d, base, &["session", "create", "-c", "missing.yaml"])
        .await
        .fails_with("missing.yaml: ");
    assert_eq!(o.code, 2, "{o:?}");
    // A campaign and a mount must agree: a campaign has one root.
    cli(&d, &["campaign", "add", "proj", &root]).await.ok();
    cli_in(
        &d,
        base,
        &[
            "session",
            "create",
            "--campaign",
            "proj",
            "--mount",
            "home:/workspace",
        ],
    )
    .await
    .fails_with("the mount's SRC");
    cli_in(
        &d,
        base,
        &[
            "--json",
            "session",
            "create",
            "--campaign",
            "proj",
            "--mount",
            "project:/workspace",
        ],
    )
    .await
    .ok();
    // Without a task, a mount or a file, the campaign is still required.
    cli_in(&d, base, &["session", "create"])
        .await
        .fails_with("--campaign is required, unless --task, --mount or -c is given");
}

// ── attach, in a terminal ──────────────────────────────────────────────────────────────────

/// The lines of a pane from its `[Session` header on (the shell around it left out).
fn from_header(screen: &str) -> String {
    let start = screen.find("[Session ").unwrap_or(0);
    screen[start..].trim_end().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_in_a_terminal_talks_to_the_agent_and_detaches() {
    let d = Daemon::start().await;
    let Some(tmux) = Tmux::start(&d) else {
        return;
    };
    let script = d.dirs.script(
        "answer",
        &turns(json!([
            {"thinking": "Reading: {message}"},
            {"tool": "Bash", "input": {"command": "make test"}},
            {"tool_result": "3 passed", "is_error": false},
            {"result": "You said: {message}"}
        ])),
    );
    let id = create_task(&d, "Fix the failing tests", &format!("script={script}")).await;
    d.wait_status(&id, pb::SessionStatus::Running).await;

    tmux.spawn(&d, "a", &["session", "attach", &id]);
    // The hint, then the prompt drawn under it (a moment later, by the line editor).
    let s = tmux
        .wait_for("a", "the hint and the prompt", |s| {
            s.contains("Ctrl-D detaches") && s.lines().any(|l| l.trim_end() == ">")
        })
        .await;
    // The header and the history so far: the task and the agent's answer to it.
    let shown = from_header(&s).replace(&id, "<id>");
    insta::assert_snapshot!("latis_attach_history", shown);

    // A line typed is a message; the agent's activity shows as it happens.
    tmux.type_line("a", "please run the tests");
    let s = tmux
        .wait_for("a", "the answer and the turn's end", |s| {
            s.contains("Agent: You said: please run the tests")
                && above_prompt(s).ends_with("[complete]")
        })
        .await;
    let after: Vec<&str> = s
        .split("Ctrl-D detaches, the agent keeps working)")
        .nth(1)
        .unwrap()
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && *l != ">")
        .collect();
    // The turn's activity in order, the state line last (it waits for the answer); `[working]`
    // comes from another stream than the activity, so only its presence is certain.
    let activity: Vec<&str> = after
        .iter()
        .copied()
        .filter(|l| *l != "[working]")
        .collect();
    assert_eq!(
        activity,
        [
            "> please run the tests",
            "Agent (thinking): Reading: please run the tests",
            "  [Bash] make test",
            "  [Bash ok] 3 passed",
            "Agent: You said: please run the tests",
            "[complete]",
        ],
        "{s}"
    );
    assert_eq!(
        after.iter().filter(|l| **l == "[working]").count(),
        1,
        "{s}"
    );

    // Ctrl-D detaches; the session goes on.
    tmux.keys("a", &["C-d"]);
    let s = tmux
        .wait_for("a", "the exit", |s| s.contains("[exit "))
        .await;
    assert!(
        s.contains("Detached; the agent keeps working.\n[exit 0]"),
        "{s}"
    );
    let info = d.get(&id).await;
    assert_eq!(status_name(info.status), "RUNNING");
    assert_eq!(info.turns_completed, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_edits_lines_keeps_history_and_prints_above_the_line_being_typed() {
    let d = Daemon::start().await;
    let Some(tmux) = Tmux::start(&d) else {
        return;
    };
    let script = d
        .dirs
        .script("echo", &turns(json!([{"result": "You said: {message}"}])));
    let id = create_task(&d, "hello", &format!("script={script}")).await;
    d.wait_status(&id, pb::SessionStatus::Running).await;
    tmux.spawn(&d, "a", &["session", "attach", &id]);
    tmux.wait_for("a", "the hint", |s| s.contains("Ctrl-D detaches"))
        .await;

    // Editing: a typo mended with the arrow keys before Enter.
    tmux.run(&["send-keys", "-t", "a", "-l", "fist line"]);
    tmux.keys("a", &["Home", "Right", "Right"]);
    tmux.run(&["send-keys", "-t", "a", "-l", "r"]);
    tmux.keys("a", &["Enter"]);
    tmux.wait_for("a", "the answer", |s| {
        s.contains("Agent: You said: first line") && above_prompt(s).ends_with("[complete]")
    })
    .await;

    // Output from elsewhere (another client's turn) lands above a half-typed line, which
    // stays on the last row as it was.
    tmux.run(&["send-keys", "-t", "a", "-l", "half typed"]);
    tmux.wait_for("a", "the draft", |s| s.trim_end().ends_with("> half typed"))
        .await;
    d.send(&id, "from elsewhere").await;
    let s = tmux
        .wait_for("a", "the other turn", |s| {
            s.contains("Agent: You said: from elsewhere")
                && s.trim_end().ends_with("[complete]\n> half typed")
        })
        .await;
    assert!(
        s.contains("You: from elsewhere") || s.contains("Agent: You said: from elsewhere"),
        "{s}"
    );

    // History: Ctrl-U clears the draft, Up brings back the last line sent, which is edited
    // and sent again.
    tmux.keys("a", &["C-u", "Up"]);
    tmux.wait_for("a", "the recalled line", |s| {
        s.trim_end().ends_with("> first line")
    })
    .await;
    tmux.type_line("a", " again");
    tmux.wait_for("a", "the answer", |s| {
        s.contains("Agent: You said: first line again")
    })
    .await;
    tmux.keys("a", &["C-d"]);
    tmux.wait_for("a", "the exit", |s| {
        s.contains("Detached; the agent keeps working.\n[exit 0]")
    })
    .await;
    assert_eq!(d.get(&id).await.turns_completed, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_attaches_see_the_same_turn_and_a_busy_agent_queues_the_line() {
    let d = Daemon::start().await;
    let Some(tmux) = Tmux::start(&d) else {
        return;
    };
    let script = d.dirs.script(
        "slow",
        &turns(json!([
            {"thinking": "On it: {message}"},
            {"text": "Still working", "delay_ms": 1500},
            {"result": "Answer {turn}: {message}"}
        ])),
    );
    let o = cli_in(
        &d,
        &d.dirs.root,
        &[
            "session",
            "create",
            "--name",
            "shared",
            "--mount",
            ".:/workspace",
            "--config",
            &format!("script={script}"),
        ],
    )
    .await
    .ok();
    let id = created_id(&o);

    tmux.spawn(&d, "one", &["session", "attach", &id]);
    tmux.spawn(&d, "two", &["session", "attach", &id[id.len() - 8..]]);
    for pane in ["one", "two"] {
        let s = tmux
            .wait_for(pane, "the hint", |s| s.contains("Ctrl-D detaches"))
            .await;
        assert!(s.contains(&format!("[Session {id} - ready]")), "{s}");
    }

    // Two lines in a row: the second waits for the first turn to end, then goes.
    tmux.type_line("one", "first question");
    tmux.wait_for("one", "the turn starting", |s| {
        s.contains("Agent (thinking): On it: first question")
    })
    .await;
    tmux.type_line("one", "second question");
    let s = tmux
        .wait_for("one", "both answers", |s| {
            s.contains("Agent: Answer 2: second question")
        })
        .await;
    let busy = s
        .find("(the agent is busy; your message is sent when this turn ends)")
        .unwrap_or_else(|| panic!("no busy note: {s}"));
    let first = s
        .find("Agent: Answer 1: first question")
        .expect("first answer");
    let second = s.find("Agent: Answer 2: second question").unwrap();
    assert!(busy < first && first < second, "{s}");

    // The other attach saw both turns, live, and sent nothing.
    let s = tmux
        .wait_for("two", "both answers", |s| {
            s.contains("Agent: Answer 2: second question")
        })
        .await;
    assert!(s.contains("Agent: Still working"), "{s}");
    assert!(!s.contains("busy"), "{s}");

    // Ctrl-C detaches too; the other stays attached until its Ctrl-D.
    tmux.keys("two", &["C-c"]);
    tmux.wait_for("two", "the exit", |s| {
        s.contains("Detached; the agent keeps working.\n[exit 0]")
    })
    .await;
    tmux.keys("one", &["C-d"]);
    tmux.wait_for("one", "the exit", |s| {
        s.contains("Detached; the agent keeps working.\n[exit 0]")
    })
    .await;
    let info = d.get(&id).await;
    assert_eq!(status_name(info.status), "RUNNING");
    assert_eq!(info.turns_completed, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_follows_a_session_to_its_end() {
    let d = Daemon::start().await;
    let Some(tmux) = Tmux::start(&d) else {
        return;
    };
    let script = d.dirs.script("fixed", &fixed_turn());
    let id = create_task(&d, "Quick one", &format!("script={script}")).await;
    d.wait_status(&id, pb::SessionStatus::Running).await;
    tmux.spawn(&d, "a", &["session", "attach", &id]);
    tmux.wait_for("a", "the hint", |s| s.contains("Ctrl-D detaches"))
        .await;
    // Stopped from elsewhere: the attach says so and ends by itself.
    cli(&d, &["session", "stop", &id]).await.ok();
    let s = tmux
        .wait_for("a", "the exit", |s| s.contains("[exit "))
        .await;
    assert!(
        s.contains(&format!("[stopped]\nSession {id} is stopped.\n[exit 0]")),
        "{s}"
    );
    // The line editor was still reading: the terminal is back in its usual mode.
    let modes = tmux.modes("a");
    for m in ["icanon", "echo", "isig"] {
        assert!(modes.iter().any(|x| x == m), "{m} not restored: {modes:?}");
    }
    // Attaching to a stopped session shows its history and says how to go on.
    tmux.spawn(&d, "b", &["session", "attach", &id]);
    let s = tmux
        .wait_for("b", "the exit", |s| s.contains("[exit "))
        .await;
    let shown = from_header(&s).replace(&id, "<id>");
    insta::assert_snapshot!("latis_attach_stopped", shown);
}

/// Rows stored about `session` in each of the store's per-session tables.
fn stored_rows(d: &Daemon, session: &str) -> Vec<(&'static str, i64)> {
    let db = rusqlite::Connection::open(d.dirs.data.join("paddock.db")).expect("open the store");
    let mut out = Vec::new();
    // An activity is keyed by its session's key (`session_keys`) and its seq.
    let rows_of = [
        ("agent_sessions", "id = ?1"),
        ("session_keys", "session_id = ?1"),
        (
            "agent_activities",
            "key >> 32 = (SELECT key FROM session_keys WHERE session_id = ?1)",
        ),
        ("session_status_events", "session_id = ?1"),
        ("session_messages", "session_id = ?1"),
        ("provider_unrecognized", "session_id = ?1"),
        ("approvals", "session_id = ?1"),
    ];
    for (table, of_session) in rows_of {
        let n: i64 = db
            .query_row(
                &format!("SELECT COUNT(*) FROM {table} WHERE {of_session}"),
                [session],
                |r| r.get(0),
            )
            .unwrap_or_else(|e| panic!("{table}: {e}"));
        out.push((table, n));
    }
    out
}

/// `session create --task TASK --config CFG` in the project; the new id.
async fn create_task(d: &Daemon, task: &str, cfg: &str) -> String {
    let o = cli_in(
        d,
        &d.dirs.root,
        &["session", "create", "--task", task, "--config", cfg],
    )
    .await
    .ok();
    created_id(&o)
}

fn nothing_stored(rows: &[(&'static str, i64)]) -> bool {
    rows.iter().all(|(_, n)| *n == 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_stops_a_live_session_and_forgets_it_and_prune_removes_the_ended_ones() {
    let d = Daemon::start().await;
    let fixed = format!("script={}", d.dirs.script("fixed", &fixed_turn()));
    let crash = format!(
        "script={}",
        d.dirs.script(
            "crash",
            &turns(json!([{"raw": "not json {"}, {"stderr": "kaboom"}, {"crash": 9}]))
        )
    );
    // A live session with a turn behind it: stopped (its agent gone), then forgotten.
    let live = create_task(&d, "Live one", &fixed).await;
    let info = d.wait_status(&live, pb::SessionStatus::Running).await;
    assert!(info.pid > 0);
    assert!(!nothing_stored(&stored_rows(&d, &live)));
    let o = cli(&d, &["session", "delete", &live]).await.ok();
    assert_eq!(
        o.stdout,
        format!("Session {live} stopped.\nSession {live} deleted.\n")
    );
    assert_agent_gone(info.pid).await;
    let rows = stored_rows(&d, &live);
    assert!(nothing_stored(&rows), "{rows:?}");
    cli(&d, &["session", "status", &live])
        .await
        .fails_with(&format!("OBEY-2010: session \"{live}\" not found"));

    // A stopped one: deleted at once, by a unique suffix, as JSON.
    let stopped = create_task(&d, "Stopped one", &fixed).await;
    d.wait_status(&stopped, pb::SessionStatus::Running).await;
    cli(&d, &["session", "stop", &stopped]).await.ok();
    let o = cli(
        &d,
        &["--json", "session", "delete", &stopped[stopped.len() - 8..]],
    )
    .await
    .ok();
    assert_eq!(
        o.json(),
        json!({"id": stopped, "deleted": true, "stopped": false})
    );
    assert!(nothing_stored(&stored_rows(&d, &stopped)));
    cli(&d, &["session", "delete", "sess_nope"])
        .await
        .fails_with("OBEY-2010: ");

    // prune: every finished session — stopped, failed (unrecognized lines and all), and
    // complete (its task done; its agent stopped first) — not one that has nothing done yet.
    let done = create_task(&d, "Done and stopped", &fixed).await;
    d.wait_status(&done, pb::SessionStatus::Running).await;
    cli(&d, &["session", "stop", &done]).await.ok();
    let failed = create_task(&d, "Crashes", &crash).await;
    d.wait_status(&failed, pb::SessionStatus::Failed).await;
    assert!(
        stored_rows(&d, &failed).contains(&("provider_unrecognized", 1)),
        "{:?}",
        stored_rows(&d, &failed)
    );
    let complete = create_task(&d, "Done, still up", &fixed).await;
    let agent = d
        .wait_status(&complete, pb::SessionStatus::Running)
        .await
        .pid;
    let keep = {
        let o = cli(
            &d,
            &[
                "session",
                "create",
                "--mount",
                &format!("{}:/workspace", d.dirs.root.display()),
            ],
        )
        .await
        .ok();
        created_id(&o)
    };
    d.wait_status(&keep, pb::SessionStatus::Running).await;
    let o = cli(&d, &["session", "prune"]).await.ok();
    let mut lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.pop(), Some("Pruned 3 session(s)."), "{o:?}");
    lines.sort();
    let mut want = vec![
        format!("Deleted {done} (stopped, Done and stopped)"),
        format!("Deleted {failed} (failed, Crashes)"),
        format!("Deleted {complete} (complete, Done, still up)"),
    ];
    want.sort();
    assert_eq!(lines, want, "{o:?}");
    for id in [&done, &failed, &complete] {
        assert!(nothing_stored(&stored_rows(&d, id)), "{id}");
    }
    assert_agent_gone(agent).await;
    assert!(
        !nothing_stored(&stored_rows(&d, &keep)),
        "a ready session is kept"
    );
    let o = cli(&d, &["session", "prune"]).await.ok();
    assert_eq!(o.stdout, "No finished sessions to prune.\n");
    let o = cli(&d, &["--json", "session", "list", "--all"]).await.ok();
    let ids: Vec<&str> = o
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect::<Vec<_>>()
        .into_iter()
        .map(|s| if s == keep { "keep" } else { "other" })
        .collect();
    assert_eq!(ids, ["keep"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_asks_the_human_and_answers_on_the_same_line() {
    let d = Daemon::start().await;
    let Some(tmux) = Tmux::start(&d) else {
        return;
    };
    let script = d.dirs.script(
        "asking",
        &json!({"turns": [
            {"steps": [
                {"ask": "Bash", "input": {"command": "rm -rf build"}, "allowed_result": "removed build/"},
                {"result": "Cleaned: {answer}"}
            ]},
            {"steps": [
                {"question": "The test assumes PostgreSQL 14 but CI uses 15. Update the test or the CI config?",
                 "options": ["Update the test", "Update the CI config"]},
                {"result": "On it: {answer}"}
            ]},
            {"steps": [
                {"ask": "Bash", "input": {"command": "git push --force"}},
                {"result": "Not pushed: {answer}"}
            ]}
        ]}),
    );
    let o = cli_in(
        &d,
        &d.dirs.root,
        &[
            "session",
            "create",
            "--mount",
            ".:/workspace",
            "--config",
            &format!("script={script}"),
            "--config",
            "permissions=ask",
        ],
    )
    .await
    .ok();
    let id = created_id(&o);
    tmux.spawn(&d, "a", &["session", "attach", &id]);
    tmux.wait_for("a", "the hint", |s| s.contains("Ctrl-D detaches"))
        .await;

    // A permission: the line that follows the prompt is y/n; anything else is asked again.
    tmux.type_line("a", "clean the build");
    tmux.wait_for("a", "the prompt", |s| {
        s.contains("Allow Bash: rm -rf build? [y/n, or n and a reason]")
    })
    .await;
    let s = d.get(&id).await;
    assert_eq!(status_name(s.status), "WAITING");
    assert_eq!(s.pending_approvals, 1);
    let o = cli(&d, &["session", "status", &id]).await.ok();
    assert!(
        o.stdout.starts_with(&format!("Session {id} - waiting\n")),
        "{o:?}"
    );
    assert!(
        o.stdout.contains("pending approvals: 1 (answer in"),
        "{o:?}"
    );
    tmux.type_line("a", "sure");
    tmux.wait_for("a", "the hint", |s| {
        s.contains("(answer y or n, or n and a reason)")
    })
    .await;
    tmux.type_line("a", "y");
    let s = tmux
        .wait_for("a", "the answer", |s| {
            s.contains("Agent: Cleaned: removed build/")
        })
        .await;
    let turn: Vec<&str> = s
        .split("clean the build\n")
        .nth(1)
        .unwrap()
        .lines()
        .map(str::trim_end)
        .collect();
    let at = |line: &str| {
        turn.iter()
            .position(|l| *l == line || (line.starts_with(' ') && l.ends_with(line)))
            .unwrap_or_else(|| panic!("no {line:?} in:\n{s}"))
    };
    // What the agent did before it asked shows before the question (the activity comes on
    // another stream than the request).
    assert!(
        at("[waiting for input]") < at("Allow Bash: rm -rf build? [y/n, or n and a reason]"),
        "{s}"
    );
    assert!(at("[waiting for input]") < at(" approved (attach)]"), "{s}");
    assert!(
        at("Allow Bash: rm -rf build? [y/n, or n and a reason]") < at("> sure"),
        "{s}"
    );
    assert!(
        at(" approved (attach)]") < at("Agent: Cleaned: removed build/"),
        "{s}"
    );
    tmux.wait_for("a", "the turn's end", |s| {
        above_prompt(s).ends_with("[complete]")
    })
    .await;

    // A question: the line is the answer.
    tmux.type_line("a", "fix the tests");
    tmux
        .wait_for("a", "the question", |s| {
            s.contains("Agent asks: The test assumes PostgreSQL 14 but CI uses 15. Update the test or the CI config? [Update the test / Update the CI config]\n(type your answer)")
        })
        .await;
    tmux.type_line("a", "Update the CI config");
    tmux.wait_for("a", "the answer", |s| {
        s.contains(" answered (attach): Update the CI config]")
            && s.contains("Agent: On it: User answered: Update the CI config")
    })
    .await;
    tmux.wait_for("a", "the turn's end", |s| {
        above_prompt(s).ends_with("[complete]")
    })
    .await;

    // A refusal with its reason, which the agent is told.
    tmux.type_line("a", "push it");
    tmux.wait_for("a", "the prompt", |s| {
        s.contains("Allow Bash: git push --force?")
    })
    .await;
    tmux.type_line("a", "n not on a Friday");
    tmux.wait_for("a", "the refusal", |s| {
        s.contains(" denied (attach): not on a Friday]")
            && s.contains("Agent: Not pushed: denied: not on a Friday")
    })
    .await;
    tmux.keys("a", &["C-d"]);
    tmux.wait_for("a", "the exit", |s| {
        s.contains("Detached; the agent keeps working.\n[exit 0]")
    })
    .await;
    let o = cli(&d, &["--json", "approvals", "--session", &id, "--all"])
        .await
        .ok();
    let by: Vec<(String, String)> = o
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["state"].as_str().unwrap().to_string(),
                a["resolved_by"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(by.len(), 3, "{o:?}");
    assert!(by.iter().all(|(_, who)| who == "attach"), "{by:?}");
}

/// On a terminal, `session delete` and `prune` ask first; "n" keeps everything, "y" deletes,
/// `--yes` does not ask (and without a terminal nothing asks, as the other tests show).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_and_prune_ask_on_a_terminal() {
    let mut d = Daemon::start().await;
    let Some(t) = Tmux::start(&d) else { return };
    let a = d.session(None).await.id;
    let b = d.session(None).await.id;
    d.stop(&b, false).await.unwrap();
    t.spawn(&d, "del-no", &["session", "delete", &a]);
    t.wait_for("del-no", "the question", |s| s.contains("[y/N]"))
        .await;
    t.type_line("del-no", "n");
    t.wait_for("del-no", "the refusal", |s| {
        s.contains("Nothing deleted.") && s.contains("[exit 0]")
    })
    .await;
    assert_eq!(status_name(d.get(&a).await.status), "RUNNING", "kept");
    t.spawn(&d, "prune-yes", &["session", "prune"]);
    t.wait_for("prune-yes", "the question", |s| {
        s.contains("Delete 1 finished session(s)")
    })
    .await;
    t.type_line("prune-yes", "y");
    t.wait_for("prune-yes", "the prune", |s| {
        s.contains("Pruned 1 session(s).") && s.contains("[exit 0]")
    })
    .await;
    t.spawn(&d, "del-yes", &["session", "delete", "--yes", &a]);
    let s = t
        .wait_for("del-yes", "the delete", |s| s.contains("[exit 0]"))
        .await;
    assert!(!s.contains("[y/N]"), "--yes does not ask: {s}");
    let left = d.all_sessions().await;
    assert!(left.is_empty(), "{left:?}");
}

/// Ctrl-C during `send` in a terminal asks whether to interrupt the turn: `y` restarts the
/// agent (the turn ends, the session goes on); the command exits 130.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_send_asks_and_y_interrupts_the_turn() {
    let mut d = Daemon::start().await;
    let Some(tmux) = Tmux::start(&d) else {
        return;
    };
    let s = d.session(Some(("hang", hanging_turn()))).await;
    tmux.spawn(&d, "send", &["session", "send", &s.id, "go"]);
    tmux.wait_for("send", "the turn", |s| s.contains("This will take a while"))
        .await;
    tmux.keys("send", &["C-c"]);
    tmux.wait_for("send", "the question", |s| {
        s.contains("Interrupt the turn?")
    })
    .await;
    tmux.type_line("send", "y");
    let screen = tmux
        .wait_for("send", "the exit", |s| s.contains("[exit "))
        .await;
    assert!(screen.contains("[exit 130]"), "{screen}");
    assert!(screen.contains("Turn interrupted"), "{screen}");
    let info = d.wait_status(&s.id, pb::SessionStatus::Running).await;
    assert_eq!(info.restart_count, 1, "the agent was restarted");
    assert!(
        info.last_turn_failed,
        "the turn ended interrupted: {info:?}"
    );
}

/// Without a terminal, Ctrl-C (SIGINT) during `send` leaves the turn running and says how to
/// follow it; the command exits 130.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_send_without_a_terminal_leaves_the_turn_running() {
    use std::io::BufRead;
    let mut d = Daemon::start().await;
    let s = d.session(Some(("slow", slow_turn(1500)))).await;
    let mut send = d
        .dirs
        .cli(false)
        .args(["session", "send", &s.id, "go"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _guard = PidGuard(send.id());
    let mut out = std::io::BufReader::new(send.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert!(first.contains("Working slowly"), "{first}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(send.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let o = send.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("The turn goes on without you"), "{err}");
    // Nothing was interrupted: the turn completes on its own.
    let info = d.wait_status(&s.id, pb::SessionStatus::Running).await;
    assert_eq!(info.restart_count, 0);
    assert!(!info.last_turn_failed, "{info:?}");
    assert_eq!(info.turns_completed, 1);
}

/// A graceful stop that waits for a turn says, on a terminal, what it waits for and how long;
/// the line is gone once the stop is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_stop_shows_what_it_waits_for() {
    let mut d = Daemon::start_with(Dirs::new(), &["--stop-grace-secs", "20"]).await;
    let Some(tmux) = Tmux::start(&d) else {
        return;
    };
    let s = d.session(Some(("slow", slow_turn(3000)))).await;
    let turn = d.start_turn(&s.id, "go").await;
    tmux.spawn(&d, "stop", &["session", "stop", &s.id]);
    tmux.wait_for("stop", "the progress line", |s| {
        s.contains("waiting for the current turn to end, then stopping")
    })
    .await;
    let screen = tmux
        .wait_for("stop", "the exit", |s| s.contains("[exit "))
        .await;
    assert!(screen.contains("[exit 0]"), "{screen}");
    assert!(screen.contains("is STOPPED"), "{screen}");
    assert!(
        !screen.contains("waiting for the current turn"),
        "erased: {screen}"
    );
    let acts = collect_ok(turn).await;
    assert_eq!(
        kind(acts.last().unwrap()),
        "COMPLETION",
        "the turn was let finish"
    );
}
