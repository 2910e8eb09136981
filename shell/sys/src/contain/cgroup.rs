//! A control group (cgroup v2) per supervised tree, where the machine lets paddock make one.
//!
//! A process cannot leave its cgroup by `setsid`, by scrubbing its environment (`env -i`) or by
//! double-forking: only by a write to another group's `cgroup.procs`. So a tree's cgroup holds
//! what it started, and `cgroup.kill` (Linux 5.14) ends all of it at once, forks in flight
//! included, where the tag ([`super::TAG_VAR`]) only finds what kept its environment. It is not
//! the whole list, though: some tools do make that write — podman moves its container monitor
//! (`conmon`) into a group of its own (as root, or through systemd when rootless) — so a tree's
//! end looks for its tag too, even where its group ended it (the e2e test
//! `podman_keeps_the_agent_in_its_container_and_ends_all_it_started` fails without it).
//!
//! Layout: `<cgroup2 mount><this program's cgroup>/paddock-<role>-<hash of the data dir>/<tag>`.
//! The base sits under this program's own cgroup because that is the part of the tree a user
//! may be delegated (systemd's `user@.service`); root may write anywhere. The base is also
//! written to `<data dir>/cgroup-<role>`, so a later incarnation started from another cgroup
//! still finds what an earlier one left. A group holds no controllers: paddock uses it only to
//! find and kill, so the "no internal processes" rule never stands in the way.
//!
//! Where no cgroup can be made (cgroup v1 only, or a cgroup2 tree we may not write, as for an
//! unprivileged user outside a delegated subtree) this module does nothing and says so once;
//! the tag and the owner mark remain.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long [`kill`] waits for a killed group to empty before it leaves the directory for the
/// next start's [`reap`] to remove.
const EMPTY_WAIT: Duration = Duration::from_secs(2);

/// The cgroup2 mount point and this process's cgroup in it, from `/proc/self/mountinfo` and
/// `/proc/self/cgroup`; `None` where there is no cgroup2 hierarchy.
pub(crate) fn own_cgroup() -> Option<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (root, mount) = mountinfo.lines().find_map(|line| {
        let (fields, fs) = line.split_once(" - ")?;
        if fs.split(' ').next()? != "cgroup2" {
            return None;
        }
        let fields: Vec<&str> = fields.split(' ').collect();
        Some((fields.get(3)?.to_string(), fields.get(4)?.to_string()))
    })?;
    let cgroups = fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    // The mount may show only a part of the hierarchy (a container's namespace): our path is
    // then relative to that part.
    let own = own.strip_prefix(root.trim_end_matches('/')).unwrap_or(own);
    let path = Path::new(&mount).join(own.trim_start_matches('/'));
    path.is_dir().then_some(path)
}

/// FNV-1a: a short name for a data dir that stays the same across builds and versions (std's
/// hasher promises neither).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The file in the data dir that records where `role`'s groups were made.
fn record(data_dir: &Path, role: &str) -> PathBuf {
    data_dir.join(format!("cgroup-{role}"))
}

/// Makes (or finds) the base group for `role` of `data_dir` and records it there; `None` with
/// one line in the log where that cannot be done.
pub(super) fn prepare(data_dir: &Path, owner: &str, role: &str) -> Option<PathBuf> {
    let Some(own) = own_cgroup() else {
        tracing::info!("no cgroup2 hierarchy: supervised trees are found by their tag only");
        return None;
    };
    let base = own.join(format!("paddock-{role}-{:016x}", fnv1a(owner.as_bytes())));
    let made = match fs::create_dir(&base) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    };
    // A group is usable only if processes can be moved into it: try with a probe group.
    let usable = made.and_then(|()| {
        let probe = base.join("probe");
        let _ = fs::create_dir(&probe);
        let ok = OpenOptions::new()
            .write(true)
            .open(probe.join("cgroup.procs"))
            .map(drop);
        let _ = fs::remove_dir(&probe);
        ok
    });
    if let Err(e) = usable {
        tracing::info!(
            cgroup = %base.display(),
            "cannot make a control group ({e}): supervised trees are found by their tag only"
        );
        let _ = fs::remove_dir(&base);
        return None;
    }
    let _ = fs::write(record(data_dir, role), base.as_os_str().as_encoded_bytes());
    tracing::debug!(cgroup = %base.display(), "a control group per supervised tree");
    Some(base)
}

/// Where an earlier incarnation of `role` made its groups, if it recorded that.
pub(super) fn recorded(data_dir: &Path, role: &str) -> Option<PathBuf> {
    let raw = fs::read(record(data_dir, role)).ok()?;
    let path = PathBuf::from(String::from_utf8(raw).ok()?);
    path.is_dir().then_some(path)
}

/// The group of one tree, opened: its directory (a child is cloned into it, see
/// `born.rs`) and its `cgroup.procs` (where a child forked the other way writes itself
/// between fork and exec, [`enter`]).
#[derive(Debug)]
pub struct Group {
    pub dir: File,
    pub procs: File,
}

/// Makes the group of one tree and opens it; `None` if it cannot (the tree then has its tag
/// only).
pub(super) fn create(base: &Path, tag: &str) -> Option<Group> {
    let dir = base.join(tag);
    if let Err(e) = fs::create_dir(&dir) {
        tracing::warn!(cgroup = %dir.display(), "cannot make the tree's control group: {e}");
        return None;
    }
    let opened = File::open(&dir).and_then(|d| {
        let procs = OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))?;
        Ok(Group { dir: d, procs })
    });
    match opened {
        Ok(g) => Some(g),
        Err(e) => {
            tracing::warn!(cgroup = %dir.display(), "cannot open the tree's control group: {e}");
            let _ = fs::remove_dir(&dir);
            None
        }
    }
}

/// In the forked child, before exec: moves the calling process into the group whose
/// `cgroup.procs` is `procs` ("0" names the writer). Only `write(2)`: async-signal-safe.
pub fn enter(procs: &File) -> std::io::Result<()> {
    nix::unistd::write(procs, b"0")
        .map(drop)
        .map_err(std::io::Error::from)
}

/// The pids in the group at `dir` (and its descendants, which paddock never makes).
fn members(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Kills every process in the group at `dir` and removes it once empty; how many it held.
fn kill_dir(dir: &Path) -> usize {
    let n = members(dir).len();
    if n > 0 {
        match OpenOptions::new().write(true).open(dir.join("cgroup.kill")) {
            Ok(mut f) => {
                if let Err(e) = f.write_all(b"1") {
                    tracing::warn!(cgroup = %dir.display(), "cgroup.kill: {e}");
                }
            }
            // Before Linux 5.14: what the tag finds is killed by the caller.
            Err(e) => tracing::warn!(cgroup = %dir.display(), "cgroup.kill: {e}"),
        }
    }
    // SIGKILL is delivered at once, but exiting takes a moment: the group cannot be removed
    // while it is populated.
    let deadline = Instant::now() + EMPTY_WAIT;
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) if Instant::now() >= deadline => {
                tracing::warn!(cgroup = %dir.display(), "cannot remove the control group: {e}");
                break;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    n
}

/// Kills the tree `tag` and removes its group; how many processes it held. Blocking.
pub(super) fn kill(base: &Path, tag: &str) -> usize {
    let dir = base.join(tag);
    if !dir.is_dir() {
        return 0;
    }
    kill_dir(&dir)
}

/// Kills every tree in `base`: what an earlier incarnation left. How many processes that was.
pub(super) fn reap(base: &Path) -> usize {
    let Ok(entries) = fs::read_dir(base) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| kill_dir(&e.path()))
        .sum()
}

/// Removes `base` if it holds no group (at a clean exit); a base in use stays.
pub(super) fn release(base: &Path) {
    let _ = fs::remove_dir(base);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_dir_hash_is_stable() {
        // FNV-1a test vectors: a change here would orphan every recorded group name.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
