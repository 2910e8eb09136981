//! No orphans, ever (reliability review D6): what an agent started outlives a SIGKILL of the
//! runner, or of a `--no-runner` daemon, only until the next runner or daemon of that data dir
//! starts, which ends it. Where the machine lets paddock make control groups (CI: root), that
//! holds even for a process that scrubbed its environment (`env -i`), which the tag cannot find.

use std::time::{Duration, Instant};

use paddock_proto::obey::local::v1 as pb;

use crate::harness::*;

/// An agent (a shell in place of Claude Code) that leaves a `setsid` grandchild, marked by the
/// sleep's unusual length, then waits.
async fn leaving_agent(d: &mut Daemon, mark: u32) -> pb::SessionInfo {
    agent(
        d,
        &format!("setsid sleep {mark} </dev/null >/dev/null 2>&1 & exec sleep {mark}"),
    )
    .await
}

/// Like [`leaving_agent`], but the grandchild also scrubs its environment: no tag, no owner.
async fn scrubbing_agent(d: &mut Daemon, mark: u32) -> pb::SessionInfo {
    agent(
        d,
        &format!("setsid env -i sleep {mark} </dev/null >/dev/null 2>&1 & exec sleep {mark}"),
    )
    .await
}

async fn agent(d: &mut Daemon, script: &str) -> pb::SessionInfo {
    let mut req = d.request(None).await;
    req.provider = pb::SessionProvider::ClaudeCode as i32;
    req.provider_config.insert(
        "command".into(),
        format!("{} sh -c '{script}'", d.dirs.ready_then()),
    );
    d.create(req).await
}

/// Whether the daemon (or its runner) put its trees in control groups: it records where in the
/// data dir. Where it cannot (an unprivileged user outside a delegated cgroup2 tree) the test
/// says so and is skipped, unless `PADDOCK_REQUIRE_CGROUP` is set (CI runs as root, where a skip
/// would hide a failure).
fn cgroups_in_use(d: &Daemon, role: &str) -> bool {
    if d.dirs.data.join(format!("cgroup-{role}")).exists() {
        return true;
    }
    assert!(
        std::env::var_os("PADDOCK_REQUIRE_CGROUP").is_none(),
        "PADDOCK_REQUIRE_CGROUP is set but the {role} made no control group: {}",
        d.stderr()
    );
    eprintln!("SKIPPED: no control group could be made here (needs a writable cgroup2 tree)");
    false
}

/// The processes whose command line is `sleep <mark>`.
fn sleepers(mark: u32) -> Vec<u32> {
    let want = format!("sleep\0{mark}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want.as_bytes())
        })
        .collect()
}

/// Ends the `sleep <mark>`s a skipped test leaves (no control group could end them).
fn kill_sleepers(mark: u32) {
    for pid in sleepers(mark) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

async fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An agent leaves a grandchild (`scrub`: one that also scrubbed its environment), then its
/// runner is SIGKILLed: the agent dies with it, the grandchild does not, and the next runner
/// (started here by the daemon's next start) ends it.
async fn killed_runner_leaves(mark: u32, scrub: bool) {
    let mut d = Daemon::start().await;
    if scrub {
        scrubbing_agent(&mut d, mark).await;
    } else {
        leaving_agent(&mut d, mark).await;
    }
    wait_for("the agent and its grandchild run", || {
        sleepers(mark).len() == 2
    })
    .await;
    let cgroups = !scrub || cgroups_in_use(&d, "runner");
    let runner = d.runner_pid().expect("a runner");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for("the agent died with the runner", || {
        sleepers(mark).len() == 1
    })
    .await;
    if !cgroups {
        kill_sleepers(mark);
        return;
    }
    d.kill9();
    d.launch().await;
    assert!(d.runner_pid().is_some_and(|p| p != runner), "a new runner");
    wait_for("the orphan was ended", || sleepers(mark).is_empty()).await;
}

/// The same with a `--no-runner` daemon, which ends at its next start what it left.
async fn killed_no_runner_daemon_leaves(mark: u32, scrub: bool) {
    let mut d = Daemon::start_with(Dirs::new(), &["--no-runner"]).await;
    if scrub {
        scrubbing_agent(&mut d, mark).await;
    } else {
        leaving_agent(&mut d, mark).await;
    }
    wait_for("the agent and its grandchild run", || {
        sleepers(mark).len() == 2
    })
    .await;
    let cgroups = !scrub || cgroups_in_use(&d, "daemon");
    d.kill9();
    wait_for("the agent died with the daemon", || {
        sleepers(mark).len() == 1
    })
    .await;
    if !cgroups {
        kill_sleepers(mark);
        return;
    }
    d.launch().await;
    wait_for("the orphan was ended", || sleepers(mark).is_empty()).await;
    assert!(
        d.stderr()
            .contains("ended processes a previous paddock left running"),
        "{}",
        d.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_agents_left_when_the_runner_was_killed_is_ended_by_the_next_runner() {
    killed_runner_leaves(3_600 + std::process::id() % 1000 * 7 + 1, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_agents_left_when_a_no_runner_daemon_was_killed_is_ended_at_its_next_start() {
    killed_no_runner_daemon_leaves(3_600 + std::process::id() % 1000 * 7 + 2, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrubbed_descendant_left_by_a_killed_runner_is_ended_by_the_next_runner() {
    killed_runner_leaves(3_600 + std::process::id() % 1000 * 7 + 5, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrubbed_descendant_left_by_a_killed_no_runner_daemon_is_ended_at_its_next_start() {
    killed_no_runner_daemon_leaves(3_600 + std::process::id() % 1000 * 7 + 6, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_data_dirs_processes_are_left_alone() {
    let mark = 3_600 + std::process::id() % 1000 * 7 + 3;
    let mut busy = Daemon::start_with(Dirs::new(), &["--no-runner"]).await;
    leaving_agent(&mut busy, mark).await;
    wait_for("the agent and its grandchild run", || {
        sleepers(mark).len() == 2
    })
    .await;
    // A second daemon on its own data dir starts and sweeps: nothing of the first is touched.
    let other = Daemon::start_with(Dirs::new(), &["--no-runner"]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sleepers(mark).len(), 2);
    drop(other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descendant_that_scrubbed_its_environment_ends_with_its_session() {
    let mark = 3_600 + std::process::id() % 1000 * 7 + 4;
    let mut d = Daemon::start().await;
    let s = scrubbing_agent(&mut d, mark).await;
    wait_for("the agent and its grandchild run", || {
        sleepers(mark).len() == 2
    })
    .await;
    if !cgroups_in_use(&d, "runner") {
        d.stop(&s.id, false).await.unwrap();
        kill_sleepers(mark);
        return;
    }
    // Neither tag nor owner mark: only its control group says whose it is.
    let escaped = sleepers(mark)
        .into_iter()
        .find(|pid| std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.is_empty()))
        .expect("the grandchild scrubbed its environment");
    assert!(pid_running(escaped));
    d.stop(&s.id, false).await.unwrap();
    wait_for("the scrubbed grandchild ended with its session", || {
        sleepers(mark).is_empty()
    })
    .await;
}

/// Groups are removed as their trees end, and the base group at a clean exit: nothing is left
/// in the machine's cgroup tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_exit_leaves_no_control_group_behind() {
    let mut d = Daemon::start().await;
    let s = d.session(None).await;
    d.send(&s.id, "hello").await;
    if !cgroups_in_use(&d, "runner") {
        return;
    }
    let base = std::fs::read_to_string(d.dirs.data.join("cgroup-runner")).unwrap();
    assert!(std::path::Path::new(&base).is_dir(), "{base}");
    d.stop(&s.id, false).await.unwrap();
    // The scripted agent's turn is over and its session stopped: its tree's group is gone.
    wait_for("the session's group was removed", || {
        std::fs::read_dir(&base)
            .unwrap()
            .flatten()
            .all(|e| !e.file_type().unwrap().is_dir())
    })
    .await;
    d.shut_down(WAIT).await;
    wait_for(
        "the runner's base group was removed at its clean exit",
        || !std::path::Path::new(&base).exists(),
    )
    .await;
}
