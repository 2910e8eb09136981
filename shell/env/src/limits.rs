//! Memory and process limits for the bubblewrap driver, through control groups where the
//! machine lets paddock make them: a group per session in the cgroup v1 `pids` and `memory`
//! hierarchies (`<mount><this program's group>/paddock-<hash of the data dir>/<session>`; the
//! base goes with its last session's group), which every process of the session joins before it starts (`paddock __join-cgroups`, the
//! launch plan's first program), so that the sandbox and all it forks count against them.
//!
//! On a cgroup2-only machine the containment module already puts each supervised tree in a
//! group of its own, and a second group to join would take the tree out of it; there, and
//! wherever the groups cannot be made (not root, no such controller), limits under bubblewrap
//! are refused with the reason, before anything is made (podman's containers have their own).

use std::path::{Path, PathBuf};

use paddock_core::{EnvSpec, SessionId};

use crate::{Error, Result};

/// The mount point of the v1 hierarchy holding `controller`, and this process's group in it.
fn v1_group(controller: &str) -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (root, mount) = mountinfo.lines().find_map(|line| {
        let (fields, fs) = line.split_once(" - ")?;
        let mut fs = fs.split(' ');
        if fs.next()? != "cgroup" {
            return None;
        }
        let options = fs.nth(1)?;
        if !options.split(',').any(|o| o == controller) {
            return None;
        }
        let fields: Vec<&str> = fields.split(' ').collect();
        Some((fields.get(3)?.to_string(), fields.get(4)?.to_string()))
    })?;
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })?;
    let own = own.strip_prefix(root.trim_end_matches('/')).unwrap_or(&own);
    let path = Path::new(&mount).join(own.trim_start_matches('/'));
    path.is_dir().then_some(path)
}

/// The groups of session `id` (made by [`make`]): where its processes' pids go.
fn groups(data_dir: &Path, id: &SessionId, spec: &EnvSpec) -> Result<Vec<(&'static str, PathBuf)>> {
    let hash = super::podman::data_hash(data_dir);
    let mut out = Vec::new();
    for (controller, wanted) in [("pids", spec.pids > 0), ("memory", spec.memory_bytes > 0)] {
        if !wanted {
            continue;
        }
        let base = v1_group(controller).ok_or_else(|| {
            Error::Refused(format!(
                "{controller} limits under bubblewrap need a cgroup v1 `{controller}` hierarchy \
                 paddock can write (this machine has none: use --driver podman for limits)"
            ))
        })?;
        out.push((controller, base.join(format!("paddock-{hash}")).join(&id.0)));
    }
    Ok(out)
}

/// Makes session `id`'s groups with its limits; the files a process writes its pid to.
pub fn make(data_dir: &Path, id: &SessionId, spec: &EnvSpec) -> Result<Vec<PathBuf>> {
    let mut procs = Vec::new();
    let made = make_each(data_dir, id, spec, &mut procs);
    if made.is_err() {
        // Nothing half-made stays: the groups made before the failure go.
        remove(&procs);
    }
    made.map(|()| procs)
}

fn make_each(
    data_dir: &Path,
    id: &SessionId,
    spec: &EnvSpec,
    procs: &mut Vec<PathBuf>,
) -> Result<()> {
    for (controller, g) in groups(data_dir, id, spec)? {
        make_group(&g).map_err(|e| Error::file("make", &g, e))?;
        procs.push(g.join("cgroup.procs"));
        let set = |file: &str, value: String| {
            std::fs::write(g.join(file), &value)
                .map_err(|e| Error::file("write", g.join(file), e))
                .map_err(|e| e.during(format!("cannot limit {controller} to {value}")))
        };
        if controller == "pids" {
            set("pids.max", spec.pids.to_string())?;
        } else {
            set("memory.limit_in_bytes", spec.memory_bytes.to_string())?;
            // Memory and swap together, where the kernel accounts swap: no swapping past it.
            if g.join("memory.memsw.limit_in_bytes").exists() {
                set("memory.memsw.limit_in_bytes", spec.memory_bytes.to_string())?;
            }
        }
    }
    Ok(())
}

/// Makes group `g` and its base. The base goes when its last session's group does (see
/// [`remove`]): one removed between the two mkdirs is made again.
fn make_group(g: &Path) -> std::io::Result<()> {
    let mut tries = 3;
    loop {
        tries -= 1;
        match std::fs::create_dir_all(g) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries > 0 => {}
            done => return done,
        }
    }
}

/// Removes the groups whose `cgroup.procs` files are `procs`, ending what is still in them,
/// and their data dir's base group once no other session's group is in it (so nothing of
/// paddock's stays in the machine's cgroup tree).
pub fn remove(procs: &[PathBuf]) {
    for g in procs.iter().filter_map(|p| p.parent()) {
        for _ in 0..20 {
            let pids = std::fs::read_to_string(g.join("cgroup.procs")).unwrap_or_default();
            let pids: Vec<i32> = pids.lines().filter_map(|l| l.trim().parse().ok()).collect();
            if pids.is_empty() {
                break;
            }
            for p in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        if let Err(e) = std::fs::remove_dir(g) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(group = %g.display(), "cannot remove the session's cgroup: {e}");
            }
        }
        // Refused (busy) while another session's group is in it; that session's removal
        // takes it then.
        if let Some(base) = g.parent() {
            let _ = std::fs::remove_dir(base);
        }
    }
}

/// `paddock __join-cgroups FILE… -- PROGRAM ARGS…`: writes this process's pid to each
/// `cgroup.procs` file, then becomes the program. Everything it starts stays in the groups.
pub fn join_and_exec(procs: &[PathBuf], program: &str, args: &[String]) -> std::io::Error {
    let pid = std::process::id().to_string();
    for f in procs {
        if let Err(e) = std::fs::write(f, &pid) {
            return std::io::Error::new(e.kind(), format!("joining {}: {e}", f.display()));
        }
    }
    std::os::unix::process::CommandExt::exec(std::process::Command::new(program).args(args))
}
