//! No orphans, ever (reliability review D6): what an agent started outlives a SIGKILL of the
//! runner, or of a `--no-runner` daemon, only until the next runner or daemon of that data dir
//! starts, which ends it.

use std::time::{Duration, Instant};

use paddock_proto::obey::local::v1 as pb;

use crate::harness::*;

/// An agent (a shell in place of Claude Code) that leaves a `setsid` grandchild, marked by the
/// sleep's unusual length, then waits.
async fn leaving_agent(d: &mut Daemon, mark: u32) -> pb::SessionInfo {
    let mut req = d.request(None).await;
    req.provider = pb::SessionProvider::ClaudeCode as i32;
    req.provider_config.insert(
        "command".into(),
        format!("sh -c 'setsid sleep {mark} </dev/null >/dev/null 2>&1 & exec sleep {mark}'"),
    );
    d.create(req).await
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

async fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_agents_left_when_the_runner_was_killed_is_ended_by_the_next_runner() {
    let mark = 3_600 + std::process::id() % 1000 * 7 + 1;
    let mut d = Daemon::start().await;
    leaving_agent(&mut d, mark).await;
    wait_for("the agent and its grandchild run", || {
        sleepers(mark).len() == 2
    })
    .await;
    let runner = d.runner_pid().expect("a runner");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The agent dies with the runner; its setsid grandchild does not.
    wait_for("the agent died with the runner", || {
        sleepers(mark).len() == 1
    })
    .await;
    // The next runner (started here by the daemon's next start) ends it.
    d.kill9();
    d.launch().await;
    assert!(d.runner_pid().is_some_and(|p| p != runner), "a new runner");
    wait_for("the orphan was ended", || sleepers(mark).is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_agents_left_when_a_no_runner_daemon_was_killed_is_ended_at_its_next_start() {
    let mark = 3_600 + std::process::id() % 1000 * 7 + 2;
    let mut d = Daemon::start_with(Dirs::new(), &["--no-runner"]).await;
    leaving_agent(&mut d, mark).await;
    wait_for("the agent and its grandchild run", || {
        sleepers(mark).len() == 2
    })
    .await;
    d.kill9();
    wait_for("the agent died with the daemon", || {
        sleepers(mark).len() == 1
    })
    .await;
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
