//! Ends gemini's tool processes when the bridge is told to stop.
//!
//! The daemon stops an agent with TERM (then KILL) to its process group, which reaches the
//! bridge and the gemini process. But gemini-cli 0.61.0 runs every shell command detached, in
//! a process group (and a pty session) of its own, and does not end them when it is told to
//! stop: a `sleep 30` a tool started outlives the session by default. So the bridge:
//!
//! - is a *child subreaper* (`PR_SET_CHILD_SUBREAPER`): a tool process orphaned by gemini's
//!   exit becomes the bridge's child, not init's, so the bridge can still find it;
//! - on TERM, kills the process group of every descendant it has (gemini's own group is the
//!   bridge's, and the daemon's signal already reached it), then dies of TERM itself, as it
//!   would have without this.
//!
//! The signal handler only writes one byte to a pipe (what a handler may safely do); a thread
//! waiting on the pipe does the work. A KILL cannot be caught: after one, tool processes that
//! escaped to groups of their own are out of reach, as they are for any agent.

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::unistd::Pid;

/// The pipe's write end, for the signal handler (-1 until installed).
static WAKE: AtomicI32 = AtomicI32::new(-1);

/// Set by the handler: the bridge is being stopped, the reaper thread will end it.
static STOPPING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: nix::libc::c_int) {
    STOPPING.store(true, Ordering::SeqCst);
    let fd = WAKE.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; the byte is on the stack of this call.
        unsafe {
            nix::libc::write(fd, [1u8].as_ptr().cast(), 1);
        }
    }
}

/// Makes the bridge a subreaper and installs the TERM handling. Best effort: if any of it is
/// refused, TERM keeps its default action (the bridge dies, tool processes may stay).
pub fn install() {
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let Ok((read, write)) = nix::unistd::pipe() else {
        return;
    };
    WAKE.store(write.into_raw_fd(), Ordering::Relaxed);
    let mut read = std::fs::File::from(read);
    let spawned = std::thread::Builder::new()
        .name("gemini-reaper".into())
        .spawn(move || {
            let mut b = [0u8; 1];
            if read.read(&mut b).unwrap_or(0) == 1 {
                kill_descendants();
                die_of_term();
            }
        });
    if spawned.is_err() {
        return;
    }
    let action = SigAction::new(
        SigHandler::Handler(on_term),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler only calls write(2) on a descriptor that stays open.
    let _ = unsafe { signal::sigaction(Signal::SIGTERM, &action) };
}

/// Once a TERM came, the reaper thread ends the bridge when the tools are gone: the caller
/// (gemini has just exited, of that same TERM) waits for it instead of dying first, which
/// would leave the tools behind.
pub fn park_if_stopping() {
    while STOPPING.load(Ordering::SeqCst) {
        std::thread::park_timeout(std::time::Duration::from_secs(1));
    }
}

/// KILLs the process group of each of our descendants other than our own group, and each
/// descendant itself.
fn kill_descendants() {
    let me = std::process::id();
    let own_group = nix::unistd::getpgrp();
    for pid in descendants(me, &parents()) {
        let p = Pid::from_raw(pid as i32);
        if let Ok(group) = nix::unistd::getpgid(Some(p)) {
            if group != own_group && group.as_raw() > 1 {
                let _ = signal::killpg(group, Signal::SIGKILL);
            }
        }
        let _ = signal::kill(p, Signal::SIGKILL);
    }
}

/// Every process's parent, from `/proc/<pid>/stat`.
fn parents() -> HashMap<u32, u32> {
    let mut map = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return map;
    };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces and parentheses, so split at the last `)`.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok());
        if let Some(ppid) = ppid {
            map.insert(pid, ppid);
        }
    }
    map
}

/// The descendants of `root` in a parent map.
fn descendants(root: u32, parents: &HashMap<u32, u32>) -> BTreeSet<u32> {
    let mut found = BTreeSet::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (&child, &parent) in parents {
            if parent == p && child != root && found.insert(child) {
                frontier.push(child);
            }
        }
    }
    found
}

/// Collects the exit status of orphans the bridge adopted (as a subreaper) that have ended.
/// Called between turns, when no gemini process of ours is running.
pub fn reap_orphans() {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

fn die_of_term() -> ! {
    // SAFETY: restoring the default action is always sound.
    unsafe {
        let _ = signal::signal(Signal::SIGTERM, SigHandler::SigDfl);
    }
    let _ = signal::raise(Signal::SIGTERM);
    std::process::exit(128 + Signal::SIGTERM as i32);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descendants_follow_the_parent_links() {
        let parents: HashMap<u32, u32> = [(10, 1), (11, 10), (12, 11), (13, 10), (20, 1)]
            .into_iter()
            .collect();
        assert_eq!(
            descendants(10, &parents).into_iter().collect::<Vec<_>>(),
            [11, 12, 13]
        );
        assert!(descendants(20, &parents).is_empty());
    }
}
