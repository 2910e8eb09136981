//! Containment of a supervised process tree.
//!
//! Every process paddock supervises leads a process group of its own, and TERM / KILL go to
//! the whole group. That is not enough for agents: their tools may start processes in
//! sessions or groups of their own (Claude Code runs each Bash command with `setsid`), out of
//! reach of a signal to the agent's group. So every supervised process also carries a tag in
//! its environment ([`TAG_VAR`]), which whatever it starts inherits; when the process exits,
//! [`kill_tree`] kills its group and every process that still carries its tag. Nothing it
//! started is left running unsupervised.
//!
//! The tag dies with its supervisor's memory: when the runner (or, with `--no-runner`, the
//! daemon) is SIGKILLed, the agents die with it (PDEATHSIG) but what they started lives on with
//! no one to sweep it. So every supervised process also carries its owner ([`OWNER_VAR`]: the
//! canonical data dir), and a runner, or a `--no-runner` daemon, that starts where none is
//! running ends every process still marked with its data dir ([`reap_orphans`]): they are what
//! a previous incarnation left.
//!
//! A process that scrubs its own environment escapes the tag (a cgroup would not let it;
//! paddock runs without privileges, so it does not rely on one). `/proc/<pid>/environ` is the
//! environment a process was started with, readable for our own processes.

use std::path::Path;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// The environment variable that marks a supervised process tree.
pub const TAG_VAR: &str = "PADDOCK_RUN_TAG";

/// The environment variable that names the data dir whose daemon/runner started a process.
pub const OWNER_VAR: &str = "PADDOCK_OWNER";

static OWNER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Marks every process this program supervises from now on as owned by `data_dir` (once, at
/// start; a later call is ignored).
pub fn set_owner(data_dir: &Path) {
    let dir = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    let _ = OWNER.set(dir.to_string_lossy().into_owned());
}

/// The owner mark [`set_owner`] set, for [`crate::proc::spawn`] to pass on.
pub fn owner() -> Option<&'static str> {
    OWNER.get().map(String::as_str)
}

/// Ends every process marked with this program's owner ([`set_owner`]): call it at start, before
/// anything is spawned, where no other live supervisor of the same data dir can exist. Returns
/// how many were ended. Reads /proc.
pub fn reap_orphans() -> usize {
    let Some(owner) = owner() else { return 0 };
    let n = stop_and_kill(&format!("{OWNER_VAR}={owner}"));
    if n > 0 {
        tracing::warn!(
            count = n,
            "ended processes a previous paddock left running for this data dir"
        );
    }
    n
}

/// A tag no other tree carries.
pub fn new_tag() -> String {
    ulid::Ulid::new().to_string()
}

/// How many times [`kill_tree`] looks again for tagged processes forked while it looked.
const MAX_PASSES: usize = 8;

/// Kills process group `pgid` and every process tagged `tag`; how many tagged processes were
/// found. For a tree whose leader has exited (or is about to be killed anyway).
///
/// Tagged processes are first stopped (SIGSTOP), pass after pass until a pass finds none it
/// had not stopped yet, so that one forking while it is looked for (a shell loop, `make -j`, a
/// restarter) cannot leave a child behind; then all are killed. Reads /proc: call it off an
/// async runtime's threads.
pub fn kill_tree(pgid: u32, tag: &str) -> usize {
    if pgid != 0 {
        let _ = killpg(Pid::from_raw(pgid as i32), Signal::SIGKILL);
    }
    let n = stop_and_kill(&format!("{TAG_VAR}={tag}"));
    if n > 0 {
        tracing::info!(tag, count = n, "killed what was left of a process tree");
    }
    n
}

/// Stops (SIGSTOP) every process whose environment holds `var` (`NAME=value`), pass after pass
/// until a pass finds none it had not stopped yet, then kills them all; how many.
fn stop_and_kill(var: &str) -> usize {
    let mut stopped = std::collections::BTreeSet::new();
    for _ in 0..MAX_PASSES {
        let new: Vec<u32> = processes_with(Path::new("/proc"), var)
            .into_iter()
            .filter(|p| !stopped.contains(p))
            .collect();
        if new.is_empty() {
            break;
        }
        for pid in &new {
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGSTOP);
        }
        stopped.extend(new);
    }
    for pid in &stopped {
        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
    }
    stopped.len()
}

/// The processes under `proc_root` whose environment holds `TAG_VAR=tag` (never this one).
pub fn tagged_processes(proc_root: &Path, tag: &str) -> Vec<u32> {
    processes_with(proc_root, &format!("{TAG_VAR}={tag}"))
}

/// The processes under `proc_root` whose environment holds `needle` (never this one).
fn processes_with(proc_root: &Path, needle: &str) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(proc_root.join(pid.to_string()).join("environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::{Duration, Instant};

    /// A process that left its group (setsid) is still found by its tag, and killed.
    #[test]
    fn escaped_descendants_are_found_by_tag_and_killed() {
        let tag = new_tag();
        let mut sh = Command::new("sh")
            .args(["-c", "setsid sleep 600 & wait"])
            .env(TAG_VAR, &tag)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while tagged_processes(Path::new("/proc"), &tag).len() < 2 {
            assert!(Instant::now() < deadline, "the tree never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(kill_tree(0, &tag), 2);
        let _ = sh.wait();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !tagged_processes(Path::new("/proc"), &tag).is_empty() {
            assert!(Instant::now() < deadline, "tagged processes survived");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(tagged_processes(Path::new("/proc"), "no-such-tag").is_empty());
    }

    /// A tree that keeps forking is still ended whole.
    #[test]
    fn a_forking_tree_is_ended_whole() {
        let tag = new_tag();
        let mut sh = Command::new("sh")
            .args(["-c", "while :; do setsid sleep 600 & sleep 0.01; done"])
            .env(TAG_VAR, &tag)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Count only the long-lived members (the `sleep 600`s): a short `sleep 0.01` seen here
        // may be gone by the time kill_tree looks, so counting it made the test flaky under load.
        let sleepers = || {
            tagged_processes(Path::new("/proc"), &tag)
                .into_iter()
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == b"600"))
                })
                .count()
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while sleepers() < 5 {
            assert!(Instant::now() < deadline, "the tree never grew");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(kill_tree(0, &tag) >= 5);
        let _ = sh.wait();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !tagged_processes(Path::new("/proc"), &tag).is_empty() {
            assert!(Instant::now() < deadline, "tagged processes survived");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
