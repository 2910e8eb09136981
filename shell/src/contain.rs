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
//! A process that scrubs its own environment escapes the tag (a cgroup would not let it;
//! paddock runs without privileges, so it does not rely on one). `/proc/<pid>/environ` is the
//! environment a process was started with, readable for our own processes.

use std::path::Path;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// The environment variable that marks a supervised process tree.
pub const TAG_VAR: &str = "PADDOCK_RUN_TAG";

/// A tag no other tree carries.
pub fn new_tag() -> String {
    ulid::Ulid::new().to_string()
}

/// Kills process group `pgid` and every process tagged `tag`; how many tagged processes were
/// found. For a tree whose leader has exited (or is about to be killed anyway).
pub fn kill_tree(pgid: u32, tag: &str) -> usize {
    if pgid != 0 {
        let _ = killpg(Pid::from_raw(pgid as i32), Signal::SIGKILL);
    }
    let tagged = tagged_processes(Path::new("/proc"), tag);
    for pid in &tagged {
        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
    }
    if !tagged.is_empty() {
        tracing::info!(
            tag,
            count = tagged.len(),
            "killed what was left of a process tree"
        );
    }
    tagged.len()
}

/// The processes under `proc_root` whose environment holds `TAG_VAR=tag` (never this one).
pub fn tagged_processes(proc_root: &Path, tag: &str) -> Vec<u32> {
    let needle = format!("{TAG_VAR}={tag}");
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
}
