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

/// For [`crate::proc::spawn`]: a new group for the tree `tag`, which the child is born in (or
/// writes itself into before exec, [`cgroup::enter`]); `None` without cgroups.
pub fn tree_cgroup(tag: &str) -> Option<cgroup::Group> {
    cgroup::create(OWNER.get()?.cgroups.as_ref()?, tag)
}

/// Removes the control group made for a tree that never started (its spawn failed). Never
/// waits: a group the failed child has not left yet (it is still exiting) is emptied and
/// removed on a thread of its own, not on the caller's (the daemon's event loop spawns).
pub fn forget_tree(tag: &str) {
    let Some(base) = OWNER.get().and_then(|o| o.cgroups.as_ref()) else {
        return;
    };
    let dir = base.join(tag);
    match std::fs::remove_dir(&dir) {
        Ok(()) => return,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(_) => {}
    }
    let (base, tag) = (base.clone(), tag.to_string());
    let spawned = std::thread::Builder::new()
        .name("paddock-cgroup".into())
        .spawn(move || cgroup::kill(&base, &tag));
    if let Err(e) = spawned {
        tracing::warn!(cgroup = %dir.display(), "cannot remove the control group: {e}");
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
    kill_trees(&[(pgid, tag)])[0]
}

/// [`kill_tree`] for several trees at once, with one look through /proc per pass for all of
/// them; how many processes of each.
fn kill_trees(trees: &[(u32, &str)]) -> Vec<usize> {
    let cgroups = OWNER.get().and_then(|o| o.cgroups.as_ref());
    // The groups first: one write ends a whole tree, forks in flight included.
    let in_cgroup: Vec<usize> = trees
        .iter()
        .map(|(pgid, tag)| {
            let n = cgroups.map_or(0, |base| cgroup::kill(base, tag));
            if *pgid != 0 {
                let _ = killpg(Pid::from_raw(*pgid as i32), Signal::SIGKILL);
            }
            n
        })
        .collect();
    // What the groups did not hold (no cgroups here) is found by its tag. A process a group
    // held is gone by now: a zombie's environment reads empty, so none is counted twice.
    let vars: Vec<String> = trees
        .iter()
        .map(|(_, tag)| format!("{TAG_VAR}={tag}"))
        .collect();
    let by_tag = stop_and_kill_any(&vars);
    trees
        .iter()
        .zip(in_cgroup.into_iter().zip(by_tag))
        .map(|((_, tag), (a, b))| {
            let n = a + b;
            if n > 0 {
                tracing::info!(tag, count = n, "killed what was left of a process tree");
            }
            n
        })
        .collect()
}

/// Trees waiting for the reaper thread, at most (a sender waits for room past it).
const REAP_QUEUE: usize = 4096;
/// Trees the reaper ends with one look through /proc, at most.
const REAP_BATCH_MAX: usize = 1024;

/// One tree to end, and who waits for its count.
struct Ending {
    pgid: u32,
    tag: String,
    done: tokio::sync::oneshot::Sender<usize>,
}

/// [`kill_tree`] for async code, on the reaper thread: the trees that end together (a
/// shutdown of a thousand agents) are ended with one look through /proc per pass, not one
/// each. (Before, each exit scanned every process's environment on a blocking thread of its
/// own: a thousand exits read a million environments on up to 512 threads, and the runner's
/// memory grew by ~50 MiB of thread stacks and caches while they did.)
///
/// If the reaper cannot take the tree (its thread could not be started, or it has died), the
/// tree is still ended: on a blocking thread, as before.
pub async fn end_tree(pgid: u32, tag: String) -> usize {
    if let Some(queue) = reaper() {
        let (done, count) = tokio::sync::oneshot::channel();
        let ending = Ending {
            pgid,
            tag: tag.clone(),
            done,
        };
        // The queue is bounded: a full one is waited for off the runtime's threads.
        let sent = match queue.try_send(ending) {
            Ok(()) => true,
            Err(std::sync::mpsc::TrySendError::Full(e)) => {
                let queue = queue.clone();
                tokio::task::spawn_blocking(move || queue.send(e).is_ok())
                    .await
                    .unwrap_or(false)
            }
            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => false,
        };
        // A reaper that died with the tree in hand drops `done` unanswered.
        if sent {
            if let Ok(n) = count.await {
                return n;
            }
        }
        tracing::warn!("the reaper is gone: ending process group {pgid} on a blocking thread");
    }
    tokio::task::spawn_blocking(move || kill_tree(pgid, &tag))
        .await
        .unwrap_or(0)
}

/// The reaper thread's queue, started on first use.
fn reaper() -> Option<&'static std::sync::mpsc::SyncSender<Ending>> {
    static REAPER: std::sync::OnceLock<Option<std::sync::mpsc::SyncSender<Ending>>> =
        std::sync::OnceLock::new();
    REAPER
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Ending>(REAP_QUEUE);
            let spawned = std::thread::Builder::new()
                .name("paddock-reaper".into())
                .spawn(move || {
                    while let Ok(first) = rx.recv() {
                        let mut batch = vec![first];
                        while batch.len() < REAP_BATCH_MAX {
                            match rx.try_recv() {
                                Ok(e) => batch.push(e),
                                Err(_) => break,
                            }
                        }
                        let trees: Vec<(u32, &str)> =
                            batch.iter().map(|e| (e.pgid, e.tag.as_str())).collect();
                        let counts = kill_trees(&trees);
                        for (e, n) in batch.into_iter().zip(counts) {
                            let _ = e.done.send(n);
                        }
                    }
                });
            match spawned {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::warn!("cannot start the reaper thread: {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// Stops (SIGSTOP) every process whose environment holds `var` (`NAME=value`), pass after pass
/// until a pass finds none it had not stopped yet, then kills them all; how many.
fn stop_and_kill(var: &str) -> usize {
    stop_and_kill_any(&[var.to_string()])[0]
}

/// [`stop_and_kill`] for each of `vars`, with one look through /proc per pass for all.
fn stop_and_kill_any(vars: &[String]) -> Vec<usize> {
    // Each process stopped, with the var it holds.
    let mut stopped = std::collections::BTreeMap::new();
    for _ in 0..MAX_PASSES {
        let new: Vec<(u32, usize)> = processes_with_any(Path::new("/proc"), vars)
            .into_iter()
            .filter(|(p, _)| !stopped.contains_key(p))
            .collect();
        if new.is_empty() {
            break;
        }
        for (pid, _) in &new {
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGSTOP);
        }
        stopped.extend(new);
    }
    let mut counts = vec![0; vars.len()];
    for (pid, var) in &stopped {
        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        counts[*var] += 1;
    }
    counts
}

/// The processes under `proc_root` whose environment holds `TAG_VAR=tag` (never this one).
pub fn tagged_processes(proc_root: &Path, tag: &str) -> Vec<u32> {
    processes_with(proc_root, &format!("{TAG_VAR}={tag}"))
}

/// The processes under `proc_root` whose environment holds `needle` (never this one).
fn processes_with(proc_root: &Path, needle: &str) -> Vec<u32> {
    processes_with_any(proc_root, &[needle.to_string()])
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

/// The processes under `proc_root` whose environment holds one of `needles` (never this
/// one), each with the index of the first it holds.
fn processes_with_any(proc_root: &Path, needles: &[String]) -> Vec<(u32, usize)> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter_map(|pid| {
            let env = std::fs::read(proc_root.join(pid.to_string()).join("environ")).ok()?;
            let held = env
                .split(|b| *b == 0)
                .find_map(|var| needles.iter().position(|n| var == n.as_bytes()))?;
            Some((pid, held))
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

    /// Trees ended together from async code are ended by one reaper, each counted as its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn trees_ended_together_are_each_ended_and_counted() {
        let trees: Vec<(String, std::process::Child)> = (0..12)
            .map(|_| {
                let tag = new_tag();
                let sh = Command::new("sh")
                    .args(["-c", "setsid sleep 600 & wait"])
                    .env(TAG_VAR, &tag)
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                (tag, sh)
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        for (tag, _) in &trees {
            while tagged_processes(Path::new("/proc"), tag).len() < 2 {
                assert!(Instant::now() < deadline, "a tree never started");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let ends: Vec<_> = trees
            .iter()
            .map(|(tag, _)| tokio::spawn(end_tree(0, tag.clone())))
            .collect();
        for end in ends {
            assert_eq!(end.await.unwrap(), 2, "the shell and its setsid sleep");
        }
        for (tag, mut sh) in trees {
            let _ = sh.wait();
            let deadline = Instant::now() + Duration::from_secs(5);
            while !tagged_processes(Path::new("/proc"), &tag).is_empty() {
                assert!(Instant::now() < deadline, "tagged processes survived");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
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
