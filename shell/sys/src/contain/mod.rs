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
//! no one to sweep it. So every supervised process also carries its owner ([`OWNER_VAR`]: its role
//! and the canonical data dir), and a runner, or a `--no-runner` daemon, that starts where none is
//! running ends every process still marked with its data dir ([`reap_orphans`]): they are what
//! a previous incarnation left.
//!
//! The tag and the owner mark live in the environment, which a process may scrub (`env -i`).
//! Where the machine lets paddock make control groups, every tree is also put in a cgroup of
//! its own ([`cgroup`]), which no process leaves by `setsid`, double-forking or scrubbing its
//! environment: a tree's end kills its group, and a start kills the groups an earlier
//! incarnation left. The tag and the owner mark stay as the fallback where no cgroup can be made
//! (an unprivileged user outside a delegated cgroup2 subtree).
//!
//! The daemon and the runner of one data dir own their trees separately ([`Role`]): a runner
//! that starts ends only what an earlier runner left, never the daemon's live tasks.
//! `/proc/<pid>/environ` is the environment a process was started with, readable for our own
//! processes.

use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

pub mod cgroup;

/// The environment variable that marks a supervised process tree.
pub const TAG_VAR: &str = "PADDOCK_RUN_TAG";

/// The environment variable that names who started a process: `<role>@<canonical data dir>`.
pub const OWNER_VAR: &str = "PADDOCK_OWNER";

/// Which program of a data dir supervises a tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The daemon: its tasks, and its agents with `--no-runner`.
    Daemon,
    /// The runner: the agents that outlive the daemon.
    Runner,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Daemon => "daemon",
            Role::Runner => "runner",
        }
    }
}

struct Owner {
    data_dir: PathBuf,
    /// The canonical data dir, as text.
    dir: String,
    role: Role,
    /// `<role>@<dir>`: the value of [`OWNER_VAR`] this program gives.
    mark: String,
    /// Where this program's trees get their cgroups, if it can make them.
    cgroups: Option<PathBuf>,
}

static OWNER: std::sync::OnceLock<Owner> = std::sync::OnceLock::new();

/// Marks every process this program supervises from now on as owned by `role` of `data_dir`,
/// and prepares its control groups where it can (once, at start; a later call is ignored).
/// Blocking (a few small file operations).
pub fn set_owner(data_dir: &Path, role: Role) {
    let dir = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    let dir = dir.to_string_lossy().into_owned();
    let cgroups = cgroup::prepare(data_dir, &dir, role.name());
    let _ = OWNER.set(Owner {
        data_dir: data_dir.to_path_buf(),
        role,
        mark: format!("{}@{dir}", role.name()),
        dir,
        cgroups,
    });
}

/// The owner mark [`set_owner`] set, for [`crate::proc::spawn`] to pass on.
pub fn owner() -> Option<&'static str> {
    OWNER.get().map(|o| o.mark.as_str())
}

/// Whether this program puts each tree in a control group of its own.
pub fn has_cgroups() -> bool {
    OWNER.get().is_some_and(|o| o.cgroups.is_some())
}

/// For [`crate::proc::spawn`]: the `cgroup.procs` of a new group for the tree `tag`, which the
/// child writes itself into before exec ([`cgroup::enter`]); `None` without cgroups.
pub fn tree_cgroup(tag: &str) -> Option<std::fs::File> {
    cgroup::create(OWNER.get()?.cgroups.as_ref()?, tag)
}

/// Removes the control group made for a tree that never started (its spawn failed).
pub fn forget_tree(tag: &str) {
    if let Some(base) = OWNER.get().and_then(|o| o.cgroups.as_ref()) {
        cgroup::kill(base, tag);
    }
}

/// Ends every process `roles` of this program's data dir left ([`set_owner`]): the trees in
/// their control groups, and every process marked with their owner mark. Call it at start,
/// before anything is spawned, where no other live supervisor of those roles of the same data
/// dir can exist. Returns how many were ended. Reads /proc.
pub fn reap_orphans(roles: &[Role]) -> usize {
    let Some(owner) = OWNER.get() else { return 0 };
    let mut n = 0;
    for role in roles {
        let mut bases: Vec<PathBuf> = cgroup::recorded(&owner.data_dir, role.name())
            .into_iter()
            .collect();
        if let Some(own) = &owner.cgroups {
            // Only this program's role has prepared its base; the other role's is recorded.
            if owner.role == *role && !bases.contains(own) {
                bases.push(own.clone());
            }
        }
        n += bases.iter().map(|b| cgroup::reap(b)).sum::<usize>();
        n += stop_and_kill(&format!("{OWNER_VAR}={}@{}", role.name(), owner.dir));
    }
    if n > 0 {
        tracing::warn!(
            count = n,
            "ended processes a previous paddock left running for this data dir"
        );
    }
    n
}

/// Ends every tree in the control groups any paddock of `data_dir` recorded, and removes the
/// groups: for a test that SIGKILLed its daemon or runner and will not start another, so that
/// nothing is left in the machine's cgroup tree. How many processes were ended.
pub fn remove_groups(data_dir: &Path) -> usize {
    [Role::Daemon, Role::Runner]
        .iter()
        .filter_map(|role| cgroup::recorded(data_dir, role.name()))
        .map(|base| {
            let n = cgroup::reap(&base);
            cgroup::release(&base);
            n
        })
        .sum()
}

/// At a clean exit, when every tree this program supervised was stopped: ends what is left in
/// its control groups (a group whose removal was still under way, a straggler) and removes
/// them and the base, so nothing stays in the machine's cgroup tree.
pub fn release() {
    if let Some(base) = OWNER.get().and_then(|o| o.cgroups.as_ref()) {
        cgroup::reap(base);
        cgroup::release(base);
    }
}

/// A tag no other tree carries.
pub fn new_tag() -> String {
    ulid::Ulid::new().to_string()
}

/// How many times [`kill_tree`] looks again for tagged processes forked while it looked.
const MAX_PASSES: usize = 8;

/// Kills the tree `tag`: its control group, process group `pgid` and every process tagged
/// `tag`; how many processes of the tree were found (its leader, already reaped, not
/// counted). For a tree whose leader has exited (or is about to be killed anyway).
///
/// Tagged processes are first stopped (SIGSTOP), pass after pass until a pass finds none it
/// had not stopped yet, so that one forking while it is looked for (a shell loop, `make -j`, a
/// restarter) cannot leave a child behind; then all are killed. Reads /proc: call it off an
/// async runtime's threads.
pub fn kill_tree(pgid: u32, tag: &str) -> usize {
    // The group first: one write ends the whole tree, forks in flight included.
    let in_cgroup = OWNER
        .get()
        .and_then(|o| o.cgroups.as_ref())
        .map_or(0, |base| cgroup::kill(base, tag));
    if pgid != 0 {
        let _ = killpg(Pid::from_raw(pgid as i32), Signal::SIGKILL);
    }
    // What the group did not hold (no cgroups here) is found by its tag. A process the group
    // held is gone by now: a zombie's environment reads empty, so none is counted twice.
    let n = in_cgroup + stop_and_kill(&format!("{TAG_VAR}={tag}"));
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
