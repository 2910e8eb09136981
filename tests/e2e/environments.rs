//! Environments for real: the bubblewrap driver (an agent, and a command run with `session
//! exec`, kept in their workspace: the host read-only, HOME replaced, no network, the daemon's
//! sockets and store out of sight, every process gone after a stop), worktrees (`--worktree`,
//! `session diff`, `delete` removing the worktree and keeping the branch unless asked) and the
//! refusals that leave nothing behind.
//!
//! These need `bwrap` (Debian's `bubblewrap`) and `git`; `.ci/run` installs both. Without
//! bwrap the bubblewrap tests fail, they do not skip.

use std::path::Path;
use std::time::Duration;

use paddock_proto::obey::local::v1 as pb;

use crate::cli::Out;
use crate::harness::*;
use crate::latis::{cli_in, created_id};

/// Processes whose command line contains `needle` (a marker only the test's processes carry).
pub(crate) fn processes_with(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let cmd: Vec<u8> = cmd
                .iter()
                .map(|b| if *b == 0 { b' ' } else { *b })
                .collect();
            if String::from_utf8_lossy(&cmd).contains(needle) {
                found.push(pid);
            }
        }
    }
    found
}

pub(crate) async fn wait_until_gone(needle: &str) {
    for _ in 0..100 {
        if processes_with(needle).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("processes left behind: {:?}", processes_with(needle));
}

/// An agent that first tries to get out of its sandbox — each attempt's outcome written to
/// `escape-report` in its workspace — leaves a marked process behind it (`sleep <marker>`, in
/// a new session, as an agent's background job would), then is the scripted agent.
pub(crate) fn escaping_agent(d: &Daemon, port: u16, marker: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let base = d.dirs.base.display();
    let home = d.dirs.home.display();
    let data = d.dirs.data.display();
    let socket = d.dirs.socket.display();
    let script = format!(
        r#"#!/bin/sh
try() {{ if eval "$2" >/dev/null 2>&1; then echo "$1: yes"; else echo "$1: no"; fi; }}
{{
  try write-outside-workspace "echo x > {base}/outside.txt"
  try write-host-root "echo x > /usr/paddock-escape-test"
  try read-home-secret "cat {home}/.ssh/id_rsa"
  try read-store "test -r {data}/paddock.db"
  try reach-loopback "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 2)'"
  try reach-daemon "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"{socket}\")'"
  try write-workspace "echo x > ./agent-was-here"
  echo "home=$HOME"
}} > ./escape-report
setsid sleep {marker} </dev/null >/dev/null 2>&1 &
exec '{BIN}' __scripted-agent
"#
    );
    let path = d.dirs.root.join("scripts").join("escaping-agent");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// Waits until session `id` finished its first turn (the agent got to the scripted agent, so
/// its report is written and its job started).
pub(crate) async fn first_turn_done(d: &Daemon, id: &str) -> pb::SessionInfo {
    for _ in 0..200 {
        let info = d.get(id).await;
        if info.turns_completed >= 1 {
            return info;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "session {id} did not finish its first turn: {:?}",
        d.get(id).await
    );
}

/// Creates a bubblewrap session (with `more` flags) whose agent is [`escaping_agent`]; its id
/// once the agent finished its first turn.
async fn create_escaping(d: &Daemon, port: u16, marker: &str, more: &[&str]) -> String {
    let command = format!("command={}", escaping_agent(d, port, marker));
    let mut args = vec![
        "session",
        "create",
        "--driver",
        "bubblewrap",
        "--provider",
        "claude-code",
        "--config",
        &command,
        "--task",
        "hello",
    ];
    args.extend(more);
    let o = cli_in(d, &d.dirs.root, &args).await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("bubblewrap driver"), "{o:?}");
    let id = created_id(&o);
    first_turn_done(d, &id).await;
    id
}

/// `session create <args>` in the campaign root; the new session's id once its first turn is
/// done.
async fn create_ready(d: &Daemon, args: &[&str]) -> String {
    let mut all = vec!["session", "create"];
    all.extend(args);
    let o = cli_in(d, &d.dirs.root, &all).await;
    assert_eq!(o.code, 0, "{o:?}");
    let id = created_id(&o);
    first_turn_done(d, &id).await;
    id
}

/// `session exec <id> -- sh -c <script>` in the campaign root.
pub(crate) async fn exec_sh(d: &Daemon, id: &str, script: &str) -> Out {
    cli_in(
        d,
        &d.dirs.root,
        &["session", "exec", id, "--", "sh", "-c", script],
    )
    .await
}

/// What [`escaping_agent`] reports from an isolated environment without network: it wrote
/// only its workspace, saw no HOME secret, no store, no loopback, no daemon socket; its HOME is
/// the session's own; its job runs.
pub(crate) fn assert_kept_in(d: &Daemon, marker: &str) {
    let r = report(d);
    for line in [
        "write-host-root: no",
        "read-home-secret: no",
        "read-store: no",
        "reach-loopback: no",
        "reach-daemon: no",
        "write-workspace: yes",
    ] {
        assert!(r.contains(line), "{line:?} not in the agent's report:\n{r}");
    }
    assert!(
        r.contains(&format!("home={}", d.dirs.home.display())),
        "{r}"
    );
    assert!(!d.dirs.base.join("outside.txt").exists());
    assert!(!Path::new("/usr/paddock-escape-test").exists());
    assert!(d.dirs.root.join("agent-was-here").exists());
    assert!(
        !processes_with(&format!("sleep {marker}")).is_empty(),
        "the agent's job runs"
    );
}

/// A command in session `id` that starts background processes until it cannot fails with
/// "fork", having started fewer than `limit` (counted in the session's own /tmp).
pub(crate) async fn assert_cannot_fork_past(d: &Daemon, id: &str, limit: u32) {
    let o = exec_sh(
        d,
        id,
        "i=0; while [ $i -lt 64 ]; do sleep 30 & i=$((i+1)); echo $i > /tmp/forked; done",
    )
    .await;
    assert_ne!(o.code, 0, "{o:?}");
    assert!(o.stderr.contains("fork"), "{o:?}");
    let forked: u32 =
        std::fs::read_to_string(d.dirs.data.join("environments").join(id).join("tmp/forked"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
    assert!(
        forked < limit,
        "{forked} processes started under a limit of {limit}"
    );
}

pub(crate) fn report(d: &Daemon) -> String {
    std::fs::read_to_string(d.dirs.root.join("escape-report")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubblewrap_keeps_the_agent_in_its_workspace_and_ends_all_it_started() {
    let d = Daemon::start().await;
    std::fs::create_dir_all(d.dirs.home.join(".ssh")).unwrap();
    std::fs::write(d.dirs.home.join(".ssh/id_rsa"), "PRIVATE KEY").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let marker = format!("{}", 900_000 + std::process::id() % 90_000);
    let id = create_escaping(&d, port, &marker, &["--name", "boxed"]).await;
    let info = d.get(&id).await;
    assert_eq!(info.environment_spec.as_ref().unwrap().driver, "bubblewrap");
    assert_eq!(info.environment_state, "ready");

    // A write outside the workspace under /tmp lands in the sandbox's private /tmp; one
    // anywhere else fails (the host is read-only).
    assert_kept_in(&d, &marker);

    // The list shows the driver.
    let o = cli_in(&d, &d.dirs.root, &["session", "list"]).await;
    assert!(
        o.stdout
            .lines()
            .any(|l| l.contains(&id) && l.contains("bubblewrap")),
        "{o:?}"
    );

    // A command run in the session is in the same sandbox.
    let o = exec_sh(&d, &id, "cat ~/.ssh/id_rsa; echo in=$(pwd)").await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        !o.stdout.contains("PRIVATE KEY") && o.stderr.contains("No such file"),
        "{o:?}"
    );
    assert!(
        o.stdout.contains(&format!("in={}", d.dirs.root.display())),
        "{o:?}"
    );
    let o = exec_sh(&d, &id, "exit 7").await;
    assert_eq!(o.code, 7, "exec exits with the command's code: {o:?}");

    // A forced stop ends everything the agent started, its setsid'ed job included.
    let o = cli_in(&d, &d.dirs.root, &["session", "stop", "--force", &id]).await;
    assert_eq!(o.code, 0, "{o:?}");
    wait_until_gone(&format!("sleep {marker}")).await;

    // Delete removes the environment's directories.
    let env_dir = d.dirs.data.join("environments").join(&id);
    assert!(env_dir.join("home").is_dir());
    let o = cli_in(&d, &d.dirs.root, &["session", "delete", "-y", &id]).await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        !env_dir.exists(),
        "the environment is gone with its session"
    );
    drop(listener);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_agent_outlives_a_killed_daemon_and_goes_with_its_delete() {
    let mut d = Daemon::start().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let marker = format!("{}", 800_000 + std::process::id() % 90_000);
    let id = create_escaping(&d, port, &marker, &["--network"]).await;
    // Asked for, the network is there (the daemon's socket still is not).
    let r = report(&d);
    assert!(
        r.contains("reach-loopback: yes") && r.contains("reach-daemon: no"),
        "{r}"
    );

    d.kill9();
    // What a crash can leave: the environment of a session deleted just before, one half
    // removed. The next start removes both, and only those.
    let envs = d.dirs.data.join("environments");
    std::fs::create_dir_all(envs.join("sess_01GONE0000000000000000000/home")).unwrap();
    std::fs::create_dir_all(envs.join(".removing-sess_01GONE1111111111111111111/tmp")).unwrap();
    d.launch().await;
    let left: Vec<String> = std::fs::read_dir(&envs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(
        left,
        vec![id.clone()],
        "only the live session's environment stays"
    );
    let info = d.get(&id).await;
    assert_eq!(
        info.status,
        pb::SessionStatus::Running as i32,
        "adopted after the restart"
    );
    assert!(!processes_with(&format!("sleep {marker}")).is_empty());
    let o = cli_in(&d, &d.dirs.root, &["session", "delete", "-y", &id]).await;
    assert_eq!(o.code, 0, "{o:?}");
    wait_until_gone(&format!("sleep {marker}")).await;
    assert!(!d.dirs.data.join("environments").join(&id).exists());
    drop(listener);
}

pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

pub(crate) fn make_repo(root: &Path) {
    git(root, &["init", "-q", "-b", "main"]);
    git(root, &["config", "user.email", "test@example.com"]);
    git(root, &["config", "user.name", "Test"]);
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "initial"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worktrees_keep_agents_apart_and_diff_shows_what_each_changed() {
    let d = Daemon::start().await;
    make_repo(&d.dirs.root);
    let mut ids = Vec::new();
    for (name, driver) in [("alpha", "local"), ("beta", "bubblewrap")] {
        let o = cli_in(
            &d,
            &d.dirs.root,
            &[
                "session",
                "create",
                "--worktree",
                "--driver",
                driver,
                "--name",
                name,
                "--task",
                "hi",
            ],
        )
        .await;
        assert_eq!(o.code, 0, "{o:?}");
        assert!(
            o.stdout.contains(&format!(
                " in its own worktree of {} on branch paddock/{name}",
                d.dirs.root.display()
            )),
            "{o:?}"
        );
        ids.push(created_id(&o));
    }
    for id in &ids {
        d.wait_status(id, pb::SessionStatus::Running).await;
    }
    let branches = git(&d.dirs.root, &["branch", "--list", "paddock/*"]);
    assert!(
        branches.contains("paddock/alpha") && branches.contains("paddock/beta"),
        "{branches}"
    );
    // Where it works is said as what it is: its own worktree of the directory, not the
    // directory itself.
    let o = cli_in(&d, &d.dirs.root, &["session", "status", &ids[1]]).await;
    assert!(
        o.stdout.contains(&format!(
            "bubblewrap (sandbox: host read-only, own HOME and /tmp, no network; own worktree \
             of {} on branch paddock/beta)",
            d.dirs.root.display()
        )),
        "{o:?}"
    );
    let o = cli_in(
        &d,
        &d.dirs.root,
        &["session", "logs", "--environment", &ids[1]],
    )
    .await;
    assert!(
        o.stdout.contains("on branch paddock/beta") && o.stdout.contains("bubblewrap environment"),
        "{o:?}"
    );

    // Each works in its own worktree: an edit, a new file, a commit (in the sandbox too).
    let work = "echo changed >> README.md && echo new > added.txt && git add README.md && \
                git commit -qm 'agent commit' && echo more >> notes.txt && pwd";
    for id in &ids {
        let o = exec_sh(&d, id, work).await;
        assert_eq!(o.code, 0, "{o:?}");
        let wt = d.dirs.data.join("environments").join(id).join("worktree");
        assert_eq!(
            o.stdout.trim(),
            wt.display().to_string(),
            "runs in its worktree"
        );
    }
    // `session info` says where the worktree is (to look at it, or cd there).
    let wt = d
        .dirs
        .data
        .join("environments")
        .join(&ids[1])
        .join("worktree");
    let o = cli_in(&d, &d.dirs.root, &["session", "info", &ids[1]]).await;
    assert!(
        o.stdout
            .lines()
            .any(|l| l.starts_with("worktree_path") && l.ends_with(&*wt.display().to_string())),
        "{o:?}"
    );
    let o = cli_in(&d, &d.dirs.root, &["--json", "session", "info", &ids[1]]).await;
    let info: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(info["worktree_path"], wt.display().to_string(), "{o:?}");
    // The user's checkout is untouched.
    assert_eq!(git(&d.dirs.root, &["status", "--porcelain"]), "");
    assert_eq!(git(&d.dirs.root, &["log", "--oneline"]).lines().count(), 1);

    let o = cli_in(&d, &d.dirs.root, &["session", "diff", &ids[1]]).await;
    assert_eq!(o.code, 0, "{o:?}");
    for part in [
        "+++ b/README.md",
        "+changed",
        "+++ b/added.txt",
        "+new",
        "+++ b/notes.txt",
        "+more",
    ] {
        assert!(
            o.stdout.contains(part),
            "{part:?} not in the diff:\n{}",
            o.stdout
        );
    }
    let o = cli_in(&d, &d.dirs.root, &["session", "diff", "--stat", &ids[0]]).await;
    assert!(o.stdout.contains("3 files changed"), "{o:?}");
    // A session without a worktree has nothing to diff.
    let o = cli_in(&d, &d.dirs.root, &["session", "create", "--task", "x"]).await;
    let plain = created_id(&o);
    let o = cli_in(&d, &d.dirs.root, &["session", "diff", &plain]).await;
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("has no worktree"), "{o:?}");
    let o = cli_in(&d, &d.dirs.root, &["session", "info", &plain]).await;
    assert!(!o.stdout.contains("worktree_path"), "{o:?}");

    // Delete removes the worktree and keeps the branch, unless asked.
    let o = cli_in(&d, &d.dirs.root, &["session", "delete", "-y", &ids[0]]).await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.stdout.contains("Its branch paddock/alpha is kept"),
        "{o:?}"
    );
    let o = cli_in(
        &d,
        &d.dirs.root,
        &["session", "delete", "-y", "--delete-branch", &ids[1]],
    )
    .await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("Branch paddock/beta deleted."), "{o:?}");
    let branches = git(&d.dirs.root, &["branch", "--list", "paddock/*"]);
    assert!(
        branches.contains("paddock/alpha") && !branches.contains("paddock/beta"),
        "{branches}"
    );
    let worktrees = git(&d.dirs.root, &["worktree", "list"]);
    assert_eq!(
        worktrees.lines().count(),
        1,
        "only the main checkout: {worktrees}"
    );
    assert!(git(&d.dirs.root, &["for-each-ref", "refs/paddock"]).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environments_the_host_cannot_give_are_refused_and_leave_nothing() {
    let d = Daemon::start().await;
    // Not a git repository.
    let o = cli_in(
        &d,
        &d.dirs.root,
        &["session", "create", "--worktree", "--task", "x"],
    )
    .await;
    assert_ne!(o.code, 0, "{o:?}");
    assert!(
        o.stderr.contains("OBEY-2005") && o.stderr.contains("not in a git repository"),
        "{o:?}"
    );
    // The directory's campaign, registered for the create, is not left behind (nor said).
    assert!(!o.stderr.contains("registered"), "{o:?}");
    let campaigns = d
        .client()
        .await
        .list_campaigns(pb::ListCampaignsRequest {})
        .await
        .unwrap()
        .into_inner()
        .campaigns;
    assert!(campaigns.is_empty(), "{campaigns:?}");
    // An unknown driver, and the network flag where it means nothing.
    let o = cli_in(
        &d,
        &d.dirs.root,
        &["session", "create", "--driver", "banana", "--task", "x"],
    )
    .await;
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("unknown driver \"banana\""), "{o:?}");
    let o = cli_in(
        &d,
        &d.dirs.root,
        &["session", "create", "--network", "--task", "x"],
    )
    .await;
    assert_ne!(o.code, 0, "{o:?}");
    assert!(
        o.stderr.contains("network applies to isolating drivers"),
        "{o:?}"
    );
    assert!(d.all_sessions().await.is_empty(), "nothing was created");
    drop(d);

    // bwrap missing on the host: said, with what to install.
    let dirs = Dirs::new();
    let d = Daemon::start_with_env(dirs, &[], &[("PATH", "/nonexistent")]).await;
    let o = cli_in(
        &d,
        &d.dirs.root,
        &["session", "create", "--driver", "bubblewrap", "--task", "x"],
    )
    .await;
    assert_ne!(o.code, 0, "{o:?}");
    assert!(
        o.stderr.contains("OBEY-2005") && o.stderr.contains("install the `bubblewrap` package"),
        "{o:?}"
    );
    assert!(d.all_sessions().await.is_empty());
    assert!(
        !d.dirs.data.join("environments").exists()
            || std::fs::read_dir(d.dirs.data.join("environments"))
                .unwrap()
                .next()
                .is_none()
    );
}

/// What a sandboxed process could use to reach the host through what it is shown: the
/// daemon's own variables (a credential), a service's Unix socket under /run, the
/// repository's hooks and config (they run on the host at the user's next git command), and
/// a workspace that is HOME itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_keeps_the_hosts_secrets_sockets_and_hooks_out_of_reach() {
    let d = Daemon::start_with_env(Dirs::new(), &[], &[("AWS_SECRET_ACCESS_KEY", "leaked")]).await;
    make_repo(&d.dirs.root);
    // A service's socket under /run (as root, which CI is; elsewhere the check is skipped).
    let run_socket =
        std::path::PathBuf::from(format!("/run/paddock-e2e-{}.sock", std::process::id()));
    let service = std::os::unix::net::UnixListener::bind(&run_socket).ok();
    let id = create_ready(&d, &["--driver", "bubblewrap", "--task", "hi"]).await;
    let probe = format!(
        "env; echo '#!/bin/sh' > .git/hooks/pre-commit && echo hook-written; \
         git config core.fsmonitor 'touch /x' && echo config-written; \
         python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"{}\")' \
         2>/dev/null && echo socket-reached; exit 0",
        run_socket.display()
    );
    let o = exec_sh(&d, &id, &probe).await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.stdout.contains("PATH="),
        "the variables a program needs are kept: {o:?}"
    );
    for leak in ["leaked", "hook-written", "config-written", "socket-reached"] {
        assert!(!o.stdout.contains(leak), "{leak}: {o:?}");
    }
    assert!(!d.dirs.root.join(".git/hooks/pre-commit").exists());
    if service.is_some() {
        let _ = std::fs::remove_file(&run_socket);
    }

    // A workspace that holds HOME would give the sandbox all of it: refused, nothing made.
    let home = d.dirs.home.display().to_string();
    let o = cli_in(
        &d,
        &d.dirs.root,
        &[
            "session",
            "create",
            "--driver",
            "bubblewrap",
            "--mount",
            &format!("{home}:/workspace"),
            "--task",
            "x",
        ],
    )
    .await;
    assert_ne!(o.code, 0, "{o:?}");
    assert!(
        o.stderr.contains("OBEY-2005") && o.stderr.contains("holds your home directory"),
        "{o:?}"
    );
    assert_eq!(
        d.all_sessions().await.len(),
        1,
        "only the first session exists"
    );
}

/// A sandboxed worktree's agent commits on its own branch, and nothing else of the
/// repository: not another branch, not what points its worktree at the repository (so host
/// git, `session diff` included, is never sent elsewhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_worktree_writes_only_its_own_branch() {
    let d = Daemon::start().await;
    make_repo(&d.dirs.root);
    let main_before = git(&d.dirs.root, &["rev-parse", "main"]);
    let id = create_ready(
        &d,
        &[
            "--worktree",
            "--driver",
            "bubblewrap",
            "--name",
            "gamma",
            "--task",
            "hi",
        ],
    )
    .await;
    let probe = "echo x > x.txt && git add x.txt && git commit -qm mine && echo committed; \
                 git branch -f main HEAD 2>/dev/null && echo main-moved; \
                 echo 'gitdir: /tmp' > .git 2>/dev/null && echo gitfile-written; exit 0";
    let o = exec_sh(&d, &id, probe).await;
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("committed"), "{o:?}");
    assert!(
        !o.stdout.contains("main-moved") && !o.stdout.contains("gitfile-written"),
        "{o:?}"
    );
    assert_eq!(git(&d.dirs.root, &["rev-parse", "main"]), main_before);
    assert_eq!(
        git(&d.dirs.root, &["log", "--format=%s", "-1", "paddock/gamma"]),
        "mine"
    );
    let o = cli_in(&d, &d.dirs.root, &["session", "diff", "--stat", &id]).await;
    assert!(o.stdout.contains("x.txt"), "{o:?}");
}

/// The cgroup v1 groups named after session `id` (the limits of a bubblewrap session).
fn session_groups(id: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for controller in ["pids", "memory"] {
        let mut stack = vec![Path::new("/sys/fs/cgroup").join(controller)];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    if e.file_name() == id {
                        found.push(e.path());
                    }
                    stack.push(e.path());
                }
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_cannot_exceed_its_process_and_memory_limits() {
    let d = Daemon::start().await;
    let id = create_ready(
        &d,
        &[
            "--driver",
            "bubblewrap",
            "--provider",
            "scripted",
            "--task",
            "hi",
            "--pids",
            "24",
            "--memory",
            "256m",
        ],
    )
    .await;
    let info = d.get(&id).await;
    let env = info.environment_spec.as_ref().unwrap();
    assert_eq!((env.pids_limit, env.memory_bytes), (24, 256 << 20));
    let groups = session_groups(&id);
    assert_eq!(groups.len(), 2, "a pids and a memory group");
    // Under one base group per data dir (`paddock-<hash>`), which holds only this session's.
    let bases: Vec<_> = groups
        .iter()
        .map(|g| g.parent().unwrap().to_owned())
        .collect();
    // The 25th process of the session cannot start.
    assert_cannot_fork_past(&d, &id, 24).await;
    // 512 MiB in a 256 MiB sandbox: killed.
    let o = exec_sh(
        &d,
        &id,
        "python3 -c 'x = bytearray(512 * 1024 * 1024); x[::4096] = b\"y\" * len(x[::4096]); print(\"allocated\")'",
    )
    .await;
    assert_ne!(o.code, 0, "{o:?}");
    assert!(!o.stdout.contains("allocated"), "{o:?}");
    // Delete takes the groups with it.
    let o = cli_in(&d, &d.dirs.root, &["session", "delete", "-y", &id]).await;
    assert_eq!(o.code, 0, "{o:?}");
    for _ in 0..50 {
        if session_groups(&id).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(session_groups(&id).is_empty(), "{:?}", session_groups(&id));
    // The data dir's base groups went with their last session.
    for base in bases {
        assert!(!base.exists(), "{} is left", base.display());
    }
}

/// `session exec` runs with the session's variables (`--env`), as its agent does, on the host
/// and in a sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_run_in_a_session_has_its_variables() {
    let d = Daemon::start().await;
    for driver in ["local", "bubblewrap"] {
        let id = create_ready(
            &d,
            &[
                "--driver",
                driver,
                "--provider",
                "scripted",
                "--env",
                "PADDOCK_E2E_VAR=from-session",
                "--task",
                "hi",
            ],
        )
        .await;
        let o = exec_sh(&d, &id, "echo var=$PADDOCK_E2E_VAR").await;
        assert_eq!(o.code, 0, "{driver}: {o:?}");
        assert!(o.stdout.contains("var=from-session"), "{driver}: {o:?}");
    }
}

/// What is run in a session (`session exec`, a task bound to it) ends with the session's stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_run_in_a_session_end_with_its_stop() {
    let d = Daemon::start().await;
    let id = create_ready(&d, &["--provider", "scripted", "--task", "hi"]).await;
    let marker = format!("{}", 500_000 + std::process::id() % 90_000);
    let o = cli_in(
        &d,
        &d.dirs.root,
        &["task", "launch", "--session", &id, "--", "sleep", &marker],
    )
    .await;
    assert_eq!(o.code, 0, "{o:?}");
    let task = o.stdout.trim().to_string();
    for _ in 0..100 {
        if !processes_with(&format!("sleep {marker}")).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!processes_with(&format!("sleep {marker}")).is_empty());
    let o = cli_in(&d, &d.dirs.root, &["session", "stop", &id]).await;
    assert_eq!(o.code, 0, "{o:?}");
    wait_until_gone(&format!("sleep {marker}")).await;
    // Its end is reported once the runner saw the process go.
    let mut o = cli_in(&d, &d.dirs.root, &["--json", "task", "get", &task]).await;
    for _ in 0..100 {
        if o.stdout.contains("CANCELLED") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        o = cli_in(&d, &d.dirs.root, &["--json", "task", "get", &task]).await;
    }
    assert!(o.stdout.contains("CANCELLED"), "{o:?}");
}
