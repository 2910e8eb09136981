//! The `paddock` command line against a real daemon: campaign and session commands, table and
//! `--json` output, errors (the exit code by kind, the daemon's OBEY message, JSON with
//! `--json`), `--no-autostart`, and autostart.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::*;

pub(crate) struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

impl Out {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    pub fn json_lines(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[track_caller]
    pub fn ok(self) -> Out {
        assert_eq!(self.code, 0, "{self:?}");
        self
    }

    /// A failure exit and `error: <prefix>…` on stderr.
    #[track_caller]
    pub fn fails_with(self, prefix: &str) -> Out {
        assert!(self.code != 0, "{self:?}");
        assert!(
            self.stderr.starts_with(&format!("error: {prefix}")),
            "{self:?}"
        );
        self
    }
}

pub(crate) async fn run(mut cmd: Command, args: &[&str]) -> Out {
    cmd.args(args);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let o = within(cmd.output()).await.expect("run paddock");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// `paddock --no-autostart <args>` against the test's daemon.
pub(crate) async fn cli(d: &Daemon, args: &[&str]) -> Out {
    run(d.dirs.cli(false), args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_autostart_without_a_daemon_fails_clearly() {
    let dirs = Dirs::new();
    for args in [&["ping"][..], &["session", "list"], &["campaign", "list"]] {
        let o = run(dirs.cli(false), args).await;
        assert_eq!(o.code, 5, "daemon unreachable: {o:?}");
        assert!(
            o.stderr.contains(&format!(
                "no paddock daemon answers on {}",
                dirs.socket.display()
            )) && o.stderr.contains("--no-autostart"),
            "{o:?}"
        );
    }
    assert!(!dirs.socket.exists(), "no daemon was started");
    // `shutdown` never starts a daemon, even without --no-autostart (and does not blame that
    // flag when it was not given).
    let o = run(dirs.cli(true), &["shutdown"]).await;
    assert_eq!(o.code, 5, "{o:?}");
    assert!(
        o.stderr.contains("no paddock daemon answers") && !o.stderr.contains("--no-autostart"),
        "{o:?}"
    );
    // With --json the error is a JSON object on stderr.
    let o = run(dirs.cli(false), &["--json", "ping"]).await;
    assert_eq!(o.code, 5, "{o:?}");
    let e: Value = serde_json::from_str(o.stderr.trim()).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    assert_eq!(e["exit_code"], 5);
    assert!(e["error"]
        .as_str()
        .unwrap()
        .contains("no paddock daemon answers"));
    assert!(!dirs.socket.exists(), "no daemon was started");
}

/// A daemon the CLI started that exits at once (a mistyped key in the config file; another
/// daemon on the data dir) is said at once, with what it said: not after the 15 s wait for an
/// answer that cannot come. Exit 5, as for any daemon that does not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_autostarted_daemon_that_exits_at_once_is_said_at_once() {
    let d = Daemon::start().await;
    let config = d.dirs.base.join("config.toml");
    std::fs::write(&config, "[daemon]\nmax_sesions = 3\n").unwrap();
    let (configured, mut other) = (Dirs::new(), Dirs::new());
    other.data = d.dirs.data.clone();
    let misconfigured = || {
        let mut c = configured.cli(true);
        c.env("PADDOCK_CONFIG", &config);
        c
    };
    for (cmd, why) in [
        (misconfigured(), "unknown field `max_sesions`"),
        (
            other.cli(true),
            "another paddock daemon is already using the data dir",
        ),
    ] {
        let t = Instant::now();
        let o = run(cmd, &["session", "list"]).await;
        assert_eq!(o.code, 5, "{o:?}");
        assert!(
            o.stderr.contains("started a daemon but it exited at once")
                && o.stderr.contains(why)
                && o.stderr.contains("daemon.log"),
            "{o:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
    // The config file's error keeps the line at fault.
    let o = run(misconfigured(), &["ping"]).await;
    assert!(
        o.stderr.contains("line 2") && o.stderr.contains("max_sesions = 3"),
        "{o:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_with_no_daemon_autostarts_one_and_shutdown_stops_it() {
    let dirs = Dirs::new();
    let o = run(dirs.cli(true), &["ping"]).await.ok();
    assert!(o.stdout.starts_with("paddock "), "{o:?}");
    let pid: u32 = o
        .stderr
        .split("started a daemon (pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no daemon pid in {o:?}"));
    let _guard = PidGuard(pid);
    assert!(pid_running(pid));
    assert!(dirs.socket.exists());
    assert!(dirs.data.join("daemon.log").exists());

    // The next command uses that daemon instead of starting another.
    let o = run(dirs.cli(true), &["--json", "state"]).await.ok();
    assert!(!o.stderr.contains("started a daemon"), "{o:?}");
    assert_eq!(o.json()["socket_path"], dirs.socket.display().to_string());

    let o = run(dirs.cli(true), &["shutdown"]).await.ok();
    assert!(o.stdout.contains("daemon stopping (0 active"), "{o:?}");
    // It returns once the daemon has gone: nothing answers on the socket any more.
    assert!(o.stdout.contains("daemon stopped"), "{o:?}");
    let o = run(dirs.cli(false), &["ping"]).await;
    assert_eq!(o.code, 5, "{o:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while pid_running(pid) {
        assert!(Instant::now() < deadline, "the daemon {pid} did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!dirs.socket.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaign_add_list_remove_as_tables_and_json() {
    let d = Daemon::start().await;
    let root = d.dirs.root.display().to_string();
    let o = cli(&d, &["campaign", "add", "web", &root]).await.ok();
    assert!(o.stdout.starts_with("campaign web (camp_"), "{o:?}");
    assert!(o.stdout.trim_end().ends_with(&format!("→ {root}")), "{o:?}");
    let home = d.dirs.home.display().to_string();
    let o = cli(&d, &["--json", "campaign", "add", "docs", &home])
        .await
        .ok();
    let docs = o.json();
    assert_eq!(docs["name"], "docs");
    assert_eq!(docs["root_path"], home.as_str());
    assert!(docs["id"].as_str().unwrap().starts_with("camp_"));
    assert!(docs["created_at"].as_str().unwrap().ends_with('Z'));

    let o = cli(&d, &["campaign", "list"]).await.ok();
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{o:?}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["NAME", "ID", "ROOT"]);
    assert!(lines
        .iter()
        .any(|l| l.starts_with("web ") && l.ends_with(&root)));
    let o = cli(&d, &["--json", "campaign", "list"]).await.ok();
    let list = o.json();
    assert_eq!(list.as_array().unwrap().len(), 2);

    let o = cli(&d, &["campaign", "remove", "web"]).await.ok();
    assert_eq!(o.stdout.trim(), "campaign web removed");
    let id = docs["id"].as_str().unwrap();
    let o = cli(&d, &["--json", "campaign", "remove", id]).await.ok();
    assert_eq!(o.json(), serde_json::json!({"removed": true}));
    cli(&d, &["campaign", "remove", "web"])
        .await
        .fails_with("OBEY-2001: campaign \"web\" not found");
    cli(&d, &["campaign", "add", "x", "/nonexistent/e2e/dir"])
        .await
        .fails_with("root_path");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_commands_as_tables_and_json() {
    let d = Daemon::start().await;
    let root = d.dirs.root.display().to_string();
    cli(&d, &["campaign", "add", CAMPAIGN, &root]).await.ok();
    let script = d.dirs.script("fixed", &fixed_turn());
    let cfg = format!("script={script}");

    // create
    let o = cli(
        &d,
        &[
            "session",
            "create",
            "--campaign",
            CAMPAIGN,
            "--config",
            &cfg,
            "--name",
            "cli-agent",
        ],
    )
    .await
    .ok();
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert!(
        lines[0].starts_with("Session sess_") && lines[0].ends_with(" created."),
        "{o:?}"
    );
    assert_eq!(
        lines[1],
        format!("cli-agent (scripted, local driver) is ready in {root}"),
        "{o:?}"
    );
    let id = lines[0].split_whitespace().nth(1).unwrap().to_string();
    let o = cli(
        &d,
        &[
            "--json",
            "session",
            "create",
            "--campaign",
            CAMPAIGN,
            "--name",
            "json-agent",
            "--max-tokens",
            "1000",
            "--timeout",
            "10m",
            "--festival",
            "fest-7",
        ],
    )
    .await
    .ok();
    let j = o.json();
    assert_eq!(j["status"], "RUNNING");
    assert_eq!(j["agent_name"], "json-agent");
    assert_eq!(j["provider"], "scripted");
    assert_eq!(j["max_tokens"], 1000);
    let info = d.get(j["id"].as_str().unwrap()).await;
    assert_eq!(info.timeout.map(|t| t.seconds), Some(600), "--timeout 10m");
    assert_eq!(j["festival_id"], "fest-7");
    assert_eq!(j["working_dir"], root.as_str());
    let id2 = j["id"].as_str().unwrap().to_string();

    // list
    let o = cli(&d, &["session", "list"]).await.ok();
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["ID", "DRIVER", "STATUS", "TASK", "AGE", "NAME", "PROVIDER", "TOKENS"]
    );
    assert_eq!(lines.len(), 3, "{o:?}");
    let row = lines.iter().find(|l| l.starts_with(&id)).expect("row");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        [cells[0], cells[1], cells[2], cells[3]],
        [id.as_str(), "local", "ready", "-"]
    );
    assert_eq!(cells[5..], ["cli-agent", "scripted", "0"]);
    let o = cli(&d, &["--json", "session", "list", "--campaign", CAMPAIGN])
        .await
        .ok();
    assert_eq!(o.json().as_array().unwrap().len(), 2);

    // info (full id, and a unique suffix of it)
    let o = cli(&d, &["session", "info", &id]).await.ok();
    let rows: Vec<Vec<&str>> = o
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["FIELD", "VALUE"]);
    assert!(rows.contains(&vec!["agent_name", "cli-agent"]), "{o:?}");
    assert!(rows.contains(&vec!["status", "RUNNING"]), "{o:?}");
    assert!(rows.contains(&vec!["working_dir", root.as_str()]), "{o:?}");
    let o = cli(&d, &["--json", "session", "info", &id[id.len() - 8..]])
        .await
        .ok();
    assert_eq!(o.json()["id"], id.as_str());
    assert_eq!(o.json()["provider_config"]["script"], script.as_str());

    // send: a table of activities (pinned), then as JSON lines
    let o = cli(&d, &["session", "send", &id, "hello there"]).await.ok();
    insta::assert_snapshot!("cli_session_send", o.stdout);
    let o = cli(&d, &["--json", "session", "send", &id, "again"])
        .await
        .ok();
    let evs = o.json_lines();
    let types: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        ["THINKING", "TOOL_CALL", "TOOL_RESULT", "TEXT", "COMPLETION"]
    );
    assert_eq!(evs[0]["seq"], 6);
    assert_eq!(evs[4]["content"], "Done with turn 2: again");
    assert!(evs.iter().all(|e| e["session_id"] == id.as_str()));

    // logs
    let o = cli(&d, &["session", "logs", &id]).await.ok();
    let seqs: Vec<i64> = o
        .stdout
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(seqs, (1..=10).collect::<Vec<_>>());
    let o = cli(&d, &["--json", "session", "logs", &id, "--after", "7"])
        .await
        .ok();
    let seqs: Vec<i64> = o
        .json_lines()
        .iter()
        .map(|e| e["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, [8, 9, 10]);

    // history: both turns as one conversation (pinned), the answer once; newest entries only
    let o = cli(&d, &["session", "history", &id]).await.ok();
    insta::assert_snapshot!("cli_session_history", o.stdout);
    let o = cli(&d, &["--json", "session", "history", &id, "--limit", "2"])
        .await
        .ok();
    let items = o.json_lines();
    let roles: Vec<&str> = items.iter().map(|e| e["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["text", "assistant"], "{o:?}");
    assert_eq!(items[1]["content"], "Done with turn 2: again");
    assert_eq!(items[1]["turn"], 2);

    // restart, stop
    let o = cli(&d, &["session", "restart", &id]).await.ok();
    assert_eq!(
        o.stdout.trim(),
        format!("session {id} is RUNNING (restart #1)")
    );
    let o = cli(&d, &["--json", "session", "restart", &id2]).await.ok();
    assert_eq!(o.json()["restart_count"], 1);
    let pid = o.json()["pid"].as_i64().unwrap() as i32;
    let o = cli(&d, &["session", "stop", &id]).await.ok();
    assert_eq!(o.stdout.trim(), format!("session {id} is STOPPED"));
    let o = cli(&d, &["--json", "session", "stop", &id2, "--force"])
        .await
        .ok();
    assert_eq!(o.json()["status"], "STOPPED");
    assert_agent_gone(pid).await;

    let o = cli(&d, &["session", "list"]).await.ok();
    assert_eq!(o.stdout.lines().count(), 1, "only the header: {o:?}");
    let o = cli(&d, &["--json", "session", "list", "--all"]).await.ok();
    assert_eq!(o.json().as_array().unwrap().len(), 2);
    let o = cli(&d, &["--json", "session", "list", "--status", "stopped"])
        .await
        .ok();
    assert_eq!(o.json().as_array().unwrap().len(), 2);
    let o = cli(&d, &["--json", "session", "list", "--status", "running"])
        .await
        .ok();
    assert_eq!(o.json().as_array().unwrap().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_errors_exit_by_kind_with_the_obey_message() {
    let d = Daemon::start().await;
    let root = d.dirs.root.display().to_string();
    cli(&d, &["campaign", "add", CAMPAIGN, &root]).await.ok();

    let o = cli(&d, &["session", "info", "sess_nope"])
        .await
        .fails_with("OBEY-2010: session \"sess_nope\" not found");
    assert_eq!(o.code, 3, "not found");
    let o = cli(&d, &["--json", "session", "info", "sess_nope"]).await;
    assert_eq!(o.code, 3, "{o:?}");
    let e: Value = serde_json::from_str(o.stderr.trim()).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    assert_eq!(e["obey_code"], "OBEY-2010");
    assert_eq!(e["grpc_code"], "NotFound");
    assert_eq!(e["exit_code"], 3);
    let o = cli(
        &d,
        &[
            "session",
            "create",
            "--campaign",
            CAMPAIGN,
            "--env",
            "NOEQUALS",
        ],
    )
    .await;
    assert_eq!(o.code, 2, "usage: {o:?}");
    cli(&d, &["session", "create", "--campaign", "nope"])
        .await
        .fails_with("OBEY-2001: ");
    cli(
        &d,
        &[
            "session",
            "create",
            "--campaign",
            CAMPAIGN,
            "--provider",
            "acp",
        ],
    )
    .await
    .fails_with("OBEY-2004: ");
    cli(
        &d,
        &[
            "session",
            "create",
            "--campaign",
            CAMPAIGN,
            "--provider",
            "banana",
        ],
    )
    .await
    .fails_with("OBEY-2002: ");
    // Refused by the CLI before it asks, as the daemon would: the same JSON fields.
    let o = cli(
        &d,
        &[
            "--json",
            "session",
            "create",
            "--campaign",
            CAMPAIGN,
            "--provider",
            "banana",
        ],
    )
    .await;
    assert_eq!(o.code, 2, "{o:?}");
    let e: Value = serde_json::from_str(o.stderr.trim()).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    assert_eq!(
        (&e["obey_code"], &e["grpc_code"], &e["exit_code"]),
        (&json!("OBEY-2002"), &json!("InvalidArgument"), &json!(2)),
        "{e}"
    );
    // And what the argument parser refuses is a JSON object too with --json.
    let o = cli(&d, &["--json", "session", "bogus"]).await;
    assert_eq!(o.code, 2, "{o:?}");
    let e: Value = serde_json::from_str(o.stderr.trim()).unwrap_or_else(|e| panic!("{e}: {o:?}"));
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .starts_with("unrecognized subcommand 'bogus'"),
        "{e}"
    );
    assert_eq!(e["exit_code"], 2);
    cli(
        &d,
        &[
            "session",
            "create",
            "--campaign",
            CAMPAIGN,
            "--model",
            "gpt-9",
        ],
    )
    .await
    .fails_with("OBEY-2003: ");
    cli(
        &d,
        &[
            "session",
            "create",
            "--campaign",
            CAMPAIGN,
            "--provider",
            "claude-code",
            "--config",
            "command=paddock-e2e-no-claude",
        ],
    )
    .await
    .fails_with("OBEY-2004: ");

    // A turn that ends in ERROR: the activity is printed, the exit code is 6 (the agent failed).
    let crash = d.dirs.script(
        "crash",
        &turns(serde_json::json!([{"thinking": "hmm"}, {"stderr": "kaboom"}, {"crash": 9}])),
    );
    let o = cli(
        &d,
        &[
            "--json",
            "session",
            "create",
            "--campaign",
            CAMPAIGN,
            "--config",
            &format!("script={crash}"),
        ],
    )
    .await
    .ok();
    let id = o.json()["id"].as_str().unwrap().to_string();
    let o = cli(&d, &["session", "send", &id, "go"]).await;
    assert_eq!(o.code, 6, "{o:?}");
    let last = o.stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("ERROR") && last.contains("OBEY-2031") && last.contains("kaboom"),
        "{o:?}"
    );
    let o = cli(&d, &["--json", "session", "info", &id]).await.ok();
    assert_eq!(o.json()["status"], "FAILED");
    assert_eq!(o.json()["error_code"], "OBEY-2031");
    let o = cli(&d, &["session", "send", &id, "again"])
        .await
        .fails_with("OBEY-2011: ");
    assert_eq!(o.code, 4, "refused");
    cli(&d, &["session", "stop", &id])
        .await
        .fails_with("OBEY-2020: ");
    // The codes are documented.
    let o = cli(&d, &["--help"]).await.ok();
    assert!(o.stdout.contains("Exit codes: 0 success"), "{o:?}");
}

/// `session send <id> -` reads the message from standard input, whole (newlines kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_reads_the_message_from_stdin() {
    let mut d = Daemon::start().await;
    let id = d.session(None).await.id;
    let mut cmd = d.dirs.cli(false);
    cmd.args(["session", "send", &id, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        b"from stdin\nsecond line\n",
    )
    .unwrap();
    let piped = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(piped.status.success(), "{piped:?}");
    let history = d
        .client()
        .await
        .get_history(paddock_proto::obey::local::v1::GetHistoryRequest {
            session_id: id.clone(),
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    assert!(
        history
            .iter()
            .any(|h| h.role == "user" && h.content == "from stdin\nsecond line\n"),
        "{history:?}"
    );
}

/// `RUST_LOG` sets the daemon's log level when `PADDOCK_LOG` does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_log_sets_the_daemon_log_level() {
    let dirs = Dirs::new();
    let mut cmd = dirs.cli(true);
    cmd.env("RUST_LOG", "debug").env_remove("PADDOCK_LOG");
    run(cmd, &["ping"]).await.ok();
    run(dirs.cli(false), &["shutdown"]).await.ok();
    let log = std::fs::read_to_string(dirs.data.join("daemon.log")).unwrap();
    assert!(log.contains("DEBUG"), "{log}");
    assert!(
        !log.contains('\x1b'),
        "no ANSI codes in the log file: {log:?}"
    );
}

/// One status vocabulary: what `session list` shows is what `--status` takes (latis' states),
/// and paddock's statuses are accepted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_filters_by_the_states_it_shows() {
    let mut d = Daemon::start().await;
    let done = d.session(None).await.id;
    d.send(&done, "hi").await;
    let fresh = d.session(None).await.id;
    let ids = |o: Out| -> Vec<String> {
        o.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect()
    };
    let o = cli(&d, &["--json", "session", "list", "--status", "complete"])
        .await
        .ok();
    assert_eq!(ids(o), std::slice::from_ref(&done));
    let o = cli(&d, &["--json", "session", "list", "--status", "ready"])
        .await
        .ok();
    assert_eq!(ids(o), std::slice::from_ref(&fresh));
    let o = cli(&d, &["--json", "session", "list", "--status", "RUNNING"])
        .await
        .ok();
    let mut both = ids(o);
    both.sort();
    let mut want = vec![done.clone(), fresh.clone()];
    want.sort();
    assert_eq!(both, want);
    let o = cli(&d, &["session", "list", "--status", "bogus"]).await;
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("ready, complete"), "{o:?}");
}

/// UX review B2: a session whose turn failed (a provider not logged in, a refused key) is
/// `failed`, not `complete`, though it lives on; `--status failed` finds it with the sessions
/// that ended FAILED; a later turn that completes makes it `complete` again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_turn_is_never_shown_as_complete() {
    let mut d = Daemon::start().await;
    let s = d
        .session(Some((
            "login",
            json!({"turns": [
                {"steps": [{"result": "Not logged in · Please run /login", "is_error": true}]},
                {"steps": [{"result": "Done."}]}
            ], "repeat_last": false}),
        )))
        .await;
    let acts = d.send(&s.id, "hi").await;
    assert_eq!(kind(acts.last().unwrap()), "ERROR", "{acts:?}");
    let info = d.get(&s.id).await;
    assert_eq!(status_name(info.status), "RUNNING");
    assert!(info.last_turn_failed, "{info:?}");

    let list = cli(&d, &["session", "list"]).await.ok();
    let row = list
        .stdout
        .lines()
        .find(|l| l.contains(&s.id[s.id.len() - 6..]))
        .unwrap_or_else(|| panic!("{list:?}"));
    assert!(row.contains("failed") && !row.contains("complete"), "{row}");
    let status = cli(&d, &["session", "status", &s.id]).await.ok();
    assert!(
        status
            .stdout
            .contains("failed (status RUNNING, 1 turn(s) completed, the last one failed"),
        "{status:?}"
    );
    let o = cli(&d, &["--json", "session", "list", "--status", "failed"])
        .await
        .ok();
    assert!(o.stdout.contains(&s.id), "{o:?}");
    let o = cli(&d, &["--json", "session", "list", "--status", "complete"])
        .await
        .ok();
    assert!(!o.stdout.contains(&s.id), "{o:?}");

    // The next turn completes: the session is complete again.
    let acts = d.send(&s.id, "again").await;
    assert_eq!(kind(acts.last().unwrap()), "COMPLETION", "{acts:?}");
    assert!(!d.get(&s.id).await.last_turn_failed);
    let o = cli(&d, &["--json", "session", "list", "--status", "complete"])
        .await
        .ok();
    assert!(o.stdout.contains(&s.id), "{o:?}");
}

/// `paddock doctor` says, per agent, whether its CLI is there, its version and its credentials,
/// and what to do when not: a working CLI with a login file is ok; a missing one says how to
/// install it; one whose `--version` fails is reported with its error; a dead openai-api
/// endpoint is a warning. It needs no daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_says_which_agents_can_run_and_what_to_do() {
    use std::os::unix::fs::PermissionsExt;
    let dirs = Dirs::new();
    let bin = dirs.base.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fake = |name: &str, body: &str| {
        let p = bin.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    fake("claude", "echo '2.1.330 (Claude Code)'");
    fake("gemini", "echo 'node is too old' >&2; exit 1");
    std::fs::create_dir_all(dirs.home.join(".claude")).unwrap();
    std::fs::write(dirs.home.join(".claude/.credentials.json"), "{}").unwrap();
    let mut cmd = dirs.cli(false);
    cmd.env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1");
    let o = run(cmd, &["--json", "doctor"]).await.ok();
    let v = o.json();
    let check = |name: &str| -> Value {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"].as_str().unwrap().starts_with(name))
            .unwrap_or_else(|| panic!("no {name} check: {v}"))
            .clone()
    };
    let claude = check("claude-code");
    assert_eq!(claude["status"], "ok", "{claude}");
    assert!(
        claude["detail"].as_str().unwrap().contains("2.1.330"),
        "{claude}"
    );
    assert!(
        claude["detail"].as_str().unwrap().contains("logged in"),
        "{claude}"
    );
    let codex = check("codex");
    assert_eq!(codex["status"], "missing", "{codex}");
    assert!(
        codex["fix"]
            .as_str()
            .unwrap()
            .contains("npm install -g @openai/codex"),
        "{codex}"
    );
    let gemini = check("gemini");
    assert_eq!(gemini["status"], "missing", "{gemini}");
    assert!(
        gemini["detail"]
            .as_str()
            .unwrap()
            .contains("node is too old"),
        "{gemini}"
    );
    let openai = check("openai-api");
    assert_eq!(openai["status"], "warn", "{openai}");
    assert!(
        openai["detail"]
            .as_str()
            .unwrap()
            .contains("does not answer"),
        "{openai}"
    );
    assert_eq!(check("daemon")["status"], "warn", "no daemon runs here");
    // The drivers: what this machine has (CI installs them all), named one by one.
    for driver in ["local", "bubblewrap", "podman", "ssh", "qemu"] {
        let d = check(&format!("driver {driver}"));
        assert_eq!(d["status"], "ok", "{d}");
    }
    assert_eq!(v["ready_agents"], json!(["claude-code"]));
    // The table says the same, with the fixes under it.
    let mut cmd = dirs.cli(false);
    cmd.env("PATH", format!("{}:/usr/bin:/bin", bin.display()));
    let o = run(cmd, &["doctor"]).await.ok();
    assert!(o.stdout.starts_with("CHECK"), "{o:?}");
    assert!(
        o.stdout
            .contains("codex (codex): npm install -g @openai/codex"),
        "{o:?}"
    );
    assert!(o.stdout.contains("Ready: claude-code."), "{o:?}");
}

/// `session create` with no provider and no $PADDOCK_PROVIDER picks the first agent CLI on
/// the user's PATH and says so, even though the daemon's PATH does not have it (the agent runs
/// with the user's PATH); with none there it refuses (exit 2) and names the scripted agent,
/// never choosing it silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_without_a_provider_uses_the_first_agent_on_the_users_path() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start().await;
    let bin = d.dirs.base.join("user-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let claude = bin.join("claude");
    std::fs::write(
        &claude,
        format!(
            "#!/bin/sh\n{}exec sleep 600\n",
            crate::harness::ANSWER_READY
        ),
    )
    .unwrap();
    std::fs::set_permissions(&claude, std::fs::Permissions::from_mode(0o755)).unwrap();
    let project = d.dirs.base.join("project");
    let create = |path: String| {
        let mut c = d.dirs.cli(false);
        c.env_remove("PADDOCK_PROVIDER").env("PATH", path);
        c.args(["session", "create", "--mount"])
            .arg(format!("{}:/workspace", project.display()));
        c
    };
    // Only /usr/bin:/bin: no agent CLI anywhere.
    let o = run(create("/usr/bin:/bin".into()), &[]).await;
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("--provider scripted"), "{o:?}");
    // The fake claude on the user's PATH only.
    let o = run(create(format!("{}:/usr/bin:/bin", bin.display())), &[])
        .await
        .ok();
    assert!(
        o.stderr.contains("No --provider given: using claude-code"),
        "{o:?}"
    );
    let all = d.all_sessions().await;
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(
        all[0].provider,
        paddock_proto::obey::local::v1::SessionProvider::ClaudeCode as i32
    );
}

/// The configuration file gives `session create` its defaults (under the flags), and `config
/// show` says where every value came from; a key it does not know is an error naming the line
/// and column, for `session create` as for `config show`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_file_gives_defaults_and_says_where_each_came_from() {
    let d = Daemon::start().await;
    let config = d.dirs.base.join("config.toml");
    std::fs::write(
        &config,
        "[session]\nprovider = \"scripted\"\nmodel = \"scripted\"\npermissions = \"deny\"\n\
         max_tokens = 500\n\n[env]\nFOO = \"bar\"\nAPI_TOKEN = \"s3cret\"\n",
    )
    .unwrap();
    let project = d.dirs.base.join("project");
    let with_config = |args: &[&str]| {
        let mut c = d.dirs.cli(false);
        c.env_remove("PADDOCK_PROVIDER")
            .env("PADDOCK_CONFIG", &config);
        c.args(args);
        c
    };
    let mount = format!("{}:/workspace", project.display());
    // Flags win over the file.
    let flags = [
        "--json",
        "session",
        "create",
        "--mount",
        &mount,
        "--max-tokens",
        "900",
        "--config",
        "permissions=allow-all",
    ];
    let o = run(with_config(&flags), &[]).await.ok();
    let info = d.get(o.json()["id"].as_str().unwrap()).await;
    assert_eq!(info.max_tokens, 900);
    assert_eq!(info.provider_config["permissions"], "allow-all");
    // The file fills what the flags leave unset.
    let o = run(
        with_config(&["--json", "session", "create", "--mount", &mount]),
        &[],
    )
    .await
    .ok();
    let info = d.get(o.json()["id"].as_str().unwrap()).await;
    assert_eq!(
        info.provider,
        paddock_proto::obey::local::v1::SessionProvider::Scripted as i32
    );
    assert_eq!(info.model, "scripted");
    assert_eq!(info.max_tokens, 500);
    assert_eq!(info.provider_config["permissions"], "deny");

    let o = run(with_config(&["--json", "config", "show"]), &[])
        .await
        .ok();
    let v = o.json();
    let value = |key: &str| {
        v["values"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["key"] == key)
            .unwrap_or_else(|| panic!("no {key}: {v}"))
            .clone()
    };
    assert_eq!(value("session.max_tokens")["value"], "500");
    let source = value("session.max_tokens")["source"].clone();
    assert!(
        source.as_str().unwrap().ends_with("config.toml:5"),
        "{source}"
    );
    assert_eq!(value("env.FOO")["value"], "bar");
    assert_eq!(
        value("env.API_TOKEN")["value"],
        "•••",
        "a credential is never shown"
    );
    assert_eq!(value("daemon.max_sessions")["source"], "default");

    std::fs::write(&config, "[session]\nmodle = \"x\"\n").unwrap();
    for args in [
        &["config", "show"][..],
        &["session", "create", "--mount", &mount],
    ] {
        let o = run(with_config(args), &[]).await;
        assert_eq!(o.code, 2, "{o:?}");
        assert!(
            o.stderr.contains("line 2, column 1") && o.stderr.contains("modle"),
            "{o:?}"
        );
    }
}

/// Shell completions and the man page come from the same clap definition; the bash script
/// parses in bash, the man page is roff for section 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_the_man_page() {
    let dirs = Dirs::new();
    let bash = run(dirs.cli(false), &["completions", "bash"]).await.ok();
    assert!(
        bash.stdout.contains("_paddock()") && bash.stdout.contains("session"),
        "{bash:?}"
    );
    let script = dirs.base.join("paddock.bash");
    std::fs::write(&script, &bash.stdout).unwrap();
    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let fish = run(dirs.cli(false), &["completions", "fish"]).await.ok();
    assert!(fish.stdout.contains("complete -c paddock"), "{fish:?}");
    let zsh = run(dirs.cli(false), &["completions", "zsh"]).await.ok();
    assert!(zsh.stdout.starts_with("#compdef paddock"), "{zsh:?}");
    let man = run(dirs.cli(false), &["man"]).await.ok();
    assert!(man.stdout.contains(".TH paddock 1"), "{man:?}");
    assert!(
        man.stdout.contains("Exit codes"),
        "the exit codes are in the man page too"
    );
    // Every page the top page's SEE ALSO names is there too: paddock-session(1) is
    // `paddock man session`, and its own SEE ALSO's paddock-session-create(1) one deeper.
    assert!(man.stdout.contains("paddock\\-session(1)"), "{man:?}");
    let session = run(dirs.cli(false), &["man", "session"]).await.ok();
    assert!(
        session.stdout.contains(".TH paddock-session 1"),
        "{session:?}"
    );
    assert!(
        session.stdout.contains("paddock\\-session\\-create(1)"),
        "{session:?}"
    );
    let create = run(dirs.cli(false), &["man", "session", "create"])
        .await
        .ok();
    assert!(
        create.stdout.contains(".TH paddock-session-create 1")
            && create.stdout.contains("\\-\\-worktree"),
        "{create:?}"
    );
    let o = run(dirs.cli(false), &["man", "sessions"]).await;
    assert_eq!(o.code, 2, "{o:?}");
    assert!(
        o.stderr.contains("no command \"sessions\" has a page"),
        "{o:?}"
    );
}

/// obey's clients find the daemon where obey's was: a daemon on its default socket also serves
/// `$XDG_RUNTIME_DIR/obey/daemon.sock`, and the binary invoked as `obey` (a link) is obey's
/// CLI by name. Both sockets are the same daemon; both go when it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_also_answers_on_obeys_socket_and_to_the_name_obey() {
    let dirs = Dirs::new();
    let run = dirs.base.join("run");
    let obey_sock = run.join("obey/daemon.sock");
    let mut daemon = std::process::Command::new(BIN);
    daemon
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &dirs.home)
        .env("XDG_RUNTIME_DIR", &run)
        .env("PADDOCK_LOG", "warn")
        .args(["daemon", "--no-aria-socket", "--data-dir"])
        .arg(&dirs.data)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = tokio::process::Command::from(daemon)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The default socket is the one the harness's clients use.
    let deadline = std::time::Instant::now() + WAIT;
    while !(dirs.socket.exists() && obey_sock.exists()) {
        assert!(
            std::time::Instant::now() < deadline,
            "no sockets under {run:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let obey = dirs.base.join("obey");
    std::os::unix::fs::symlink(BIN, &obey).unwrap();
    let obey_cli = |args: &[&str]| {
        let mut c = std::process::Command::new(&obey);
        c.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &dirs.home)
            .env("PADDOCK_PROVIDER", "scripted")
            .arg("--socket")
            .arg(&obey_sock)
            .arg("--no-autostart")
            .args(args);
        c.output().unwrap()
    };
    let v = obey_cli(&["--version"]);
    assert!(
        String::from_utf8_lossy(&v.stdout).starts_with("obey "),
        "{v:?}"
    );
    let root = dirs.root.display().to_string();
    let made = obey_cli(&[
        "session",
        "create",
        "--mount",
        &format!("{root}:/workspace"),
        "--name",
        "via-obey",
    ]);
    assert!(made.status.success(), "{made:?}");
    // The same daemon behind both doors.
    let listed = dirs
        .cli(false)
        .args(["--json", "session", "list"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("via-obey"),
        "{listed:?}"
    );
    let bye = obey_cli(&["shutdown"]);
    assert!(bye.status.success(), "{bye:?}");
    let st = tokio::time::timeout(WAIT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(st.success(), "{st:?}");
    assert!(
        !obey_sock.exists() && !dirs.socket.exists(),
        "both sockets removed"
    );
}

/// `paddock … | head`: a reader that goes away ends the command quietly (exit 0, nothing on
/// stderr), where printing to the closed pipe used to panic with a backtrace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_the_command_quietly() {
    let mut d = Daemon::start().await;
    let id = d.session(None).await.id;
    d.send(&id, "hi").await;
    for args in [
        &["session", "list", "--all"][..],
        &["--json", "session", "list", "--all"],
        &["session", "history", &id],
        &["session", "info", &id],
        &["campaign", "list"],
    ] {
        // The reading end is closed before the command writes its first byte.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut cmd = d.dirs.cli(false);
        cmd.args(args).stdout(writer);
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true).stderr(std::process::Stdio::piped());
        // Not `output()`, which would put a pipe of its own on stdout.
        let child = cmd.spawn().expect("run paddock");
        let o = within(child.wait_with_output())
            .await
            .expect("paddock ends");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {stderr}");
        assert_eq!(stderr, "", "{args:?}");
    }
}

/// `paddock session attach` whose stdout closes while it follows the conversation (`… | head
/// -3`) ends, quietly, at the next line it cannot print, instead of following a conversation
/// nobody sees — its input still open, its session still working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_whose_stdout_closes_ends_quietly() {
    use std::io::Read;
    let mut d = Daemon::start().await;
    let id = d.session(None).await.id;
    d.send(&id, "hi").await;
    let (mut reader, writer) = std::io::pipe().unwrap();
    let mut cmd = d.dirs.cli(false);
    cmd.args(["session", "attach", &id]).stdout(writer);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("run paddock");
    // Held open: an attach whose input ends detaches by itself.
    let _typing = child.stdin.take();
    // Attached (it printed the conversation so far); then nobody reads any more.
    let reader = tokio::task::spawn_blocking(move || {
        let mut first = [0u8; 64];
        let n = reader.read(&mut first).expect("the attach prints");
        assert!(n > 0);
        reader
    });
    drop(within(reader).await.unwrap());
    d.send(&id, "and again").await;
    let o = within(child.wait_with_output())
        .await
        .expect("paddock ends");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert_eq!(stderr, "");
}

/// A line piped into `paddock session attach` is sent before the input's end detaches it:
/// the SendMessage in flight is seen through (leaving at once cancelled it, and the line was
/// neither sent nor said not to be).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_sends_its_piped_line_before_it_detaches() {
    use tokio::io::AsyncWriteExt;
    let mut d = Daemon::start().await;
    let id = d.session(None).await.id;
    for i in 0..6 {
        let line = format!("piped line {i}");
        let mut cmd = tokio::process::Command::from(d.dirs.cli(false));
        cmd.args(["session", "attach", &id])
            .kill_on_drop(true)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("run paddock");
        let mut typing = child.stdin.take().unwrap();
        typing
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        drop(typing);
        let o = within(child.wait_with_output())
            .await
            .expect("paddock ends");
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{out}");
        assert!(!out.contains("not sent"), "{line}: {out}");
        // The agent took it: its turn ends, and the next line finds it idle again.
        within(async {
            loop {
                if d.get(&id).await.turns_completed > i {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        let told = d.stored_activities(&id).await;
        assert!(
            told.iter().any(|a| a.content.contains(&line)),
            "{line} never reached the session: {out}"
        );
    }
}

/// `paddock session watch` shows a turn's end (the status change back to RUNNING) after the
/// turn's last activity, though the two come on separate streams, either one ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_watch_shows_a_turns_end_after_its_last_activity() {
    use tokio::io::AsyncBufReadExt;
    let mut d = Daemon::start().await;
    let id = d.session(None).await.id;
    let mut cmd = tokio::process::Command::from(d.dirs.cli(false));
    cmd.args(["session", "watch", &id])
        .kill_on_drop(true)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("run paddock");
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = within(out.next_line()).await.unwrap().unwrap_or_default();
    assert!(first.starts_with("watching "), "{first}");
    // Its streams are open once it printed that; give them a moment to be subscribed.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..5 {
        d.send(&id, &format!("turn {i}")).await;
    }
    d.stop(&id, true).await.expect("stop");
    let mut lines = Vec::new();
    while let Some(l) = within(out.next_line()).await.unwrap() {
        lines.push(l);
    }
    assert!(within(child.wait()).await.unwrap().success(), "{lines:#?}");
    let ends: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with("STATUS") && l.contains("WORKING → RUNNING"))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(ends.len(), 5, "{lines:#?}");
    for i in ends {
        let before = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.starts_with("STATUS"))
            .unwrap();
        assert!(before.starts_with("COMPLETION"), "line {i}: {lines:#?}");
    }
}

/// jemalloc's options as each kind of process gets them (`choose_malloc_conf` in main.rs): a
/// user's command backs its heap with huge pages where the system allows; the daemon, the
/// runner and the hidden per-agent helpers keep jemalloc's defaults, whatever else their
/// arguments say. jemalloc prints its options at exit when told to (`stats_print`, through its
/// variable, which adds to the options and changes none of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_commands_ask_for_huge_pages_and_the_long_lived_processes_do_not() {
    let dirs = Dirs::new();
    let thp = |args: &'static [&'static str]| {
        let mut cmd = dirs.cli(false);
        cmd.env("_RJEM_MALLOC_CONF", "stats_print:true");
        async move {
            let o = run(cmd, args).await;
            let line = o
                .stderr
                .lines()
                .find_map(|l| l.trim().strip_prefix("opt.thp: "))
                .unwrap_or_else(|| panic!("jemalloc printed no options for {args:?}: {o:?}"))
                .trim_matches('"')
                .to_string();
            (o.code, line)
        }
    };
    for user in [&["--version"][..], &["session", "list", "--help"]] {
        let (code, thp) = thp(user).await;
        assert_eq!(code, 0, "{user:?}");
        // "always"; "not supported" where the system says nothing of huge pages.
        assert_ne!(thp, "default", "{user:?} kept jemalloc's default");
    }
    for long_lived in [
        &["daemon", "--help"][..],
        &["runner", "--help"],
        &["__scripted-agent", "--help"],
        &["__bridge", "--help"],
    ] {
        let (code, thp) = thp(long_lived).await;
        assert_eq!(code, 0, "{long_lived:?}");
        assert_eq!(thp, "default", "{long_lived:?}");
    }
}
