//! The podman driver: a container per session, made when the session is created and removed
//! when it is deleted; every process of the session (the agent at each start, `session exec`,
//! the session's Aria tasks) runs in it with `podman exec`.
//!
//! The container (`paddock-<session>`, labelled with the session and a hash of the data dir so
//! that a restarted daemon finds its own) starts from the session's image — a reference podman
//! has, an image archive (`podman load`, or `podman import` for a plain root tarball) or a root
//! directory (`--rootfs DIR:O`: an overlay, the directory itself is never written) — and holds
//! only an idle init (podman's static `catatonit -P`, mounted in) until a process is started in
//! it. What it is given: the workspace (or worktree) at its host path, writable; the session's
//! HOME and /tmp (the same directories the bubblewrap driver uses); paddock's own binary,
//! read-only (the scripted agent and the bridges run it); no network unless asked (then
//! podman's own network, never the host's: the host's loopback stays out of reach); the
//! memory and process limits; and the seed's block (mounts, ports, flags, env).
//!
//! A process started with `podman exec` is not a child of the `podman exec` client that the
//! runner supervises: killing the client leaves it running. So every exec passes the client's
//! containment tag and owner mark into the container (`--env NAME`, values from the client's
//! own environment, never in its argv), and the supervisor's sweep, which looks for them in
//! every process the host can see, ends what an agent left when its run ends; the container's
//! removal ends everything else.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use paddock_core::{SessionConfig, SessionId};

use super::{Error, Host, Made, Result};
use paddock_sys::proc::LaunchPlan;

/// Where podman's static idle init is mounted inside a container.
const INIT_AT: &str = "/.paddock/init";
/// podman's static init (Debian's `catatonit`, which podman depends on).
const INIT_CANDIDATES: &[&str] = &[
    "/usr/libexec/podman/catatonit",
    "/usr/bin/catatonit",
    "/usr/libexec/catatonit/catatonit",
];

/// The label every container of a data dir carries.
const DATA_LABEL: &str = "paddock.data";
/// The label naming a container's session.
const SESSION_LABEL: &str = "paddock.session";

/// Session `id`'s container.
pub fn container(id: &SessionId) -> String {
    format!("paddock-{}", id.0)
}

fn podman() -> Result<PathBuf> {
    paddock_sys::paths::find_on_own_path("podman").ok_or(Error::NotInstalled {
        needed_by: "the podman driver",
        program: "podman",
        install: "the `podman` package (apt install podman; on hosts without systemd also runc)",
    })
}

fn init_program() -> Result<&'static str> {
    INIT_CANDIDATES
        .iter()
        .copied()
        .find(|p| Path::new(p).is_file())
        .ok_or_else(|| {
            Error::Refused(
                "the podman driver needs podman's init (catatonit), which is not installed: \
                 install the `catatonit` package"
                    .into(),
            )
        })
}

/// podman's global options for this host: on a host that is not pure cgroup2 (cgroup v1, or
/// the hybrid layout) crun refuses to start anything ("cgroups in hybrid mode not supported")
/// while runc works, and podman picks crun when both are installed: there runc is asked for
/// by name. Elsewhere podman's own choice stands.
fn global_args() -> &'static [String] {
    static ARGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    ARGS.get_or_init(|| {
        let pure_v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        match paddock_sys::paths::find_on_own_path("runc") {
            Some(runc) if !pure_v2 => vec!["--runtime".into(), runc.display().to_string()],
            _ => Vec::new(),
        }
    })
}

/// A podman command with this host's global options.
fn podman_command(podman: &Path) -> Command {
    let mut cmd = Command::new(podman);
    cmd.args(global_args());
    cmd
}

/// Runs podman with `args`; its stdout, or its stderr as the error.
fn run(podman: &Path, args: &[String]) -> Result<String> {
    let out = podman_command(podman)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::spawn(podman, e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let err = err.trim();
        Err(Error::Failed(format!(
            "podman {} failed ({}): {}",
            args.first().map(String::as_str).unwrap_or(""),
            out.status,
            if err.is_empty() { "no message" } else { err }
        )))
    }
}

/// Refuses a mount of the block that would undo the container: the host's root, a directory
/// holding the user's home (every secret in it), or paddock's own data or runtime directory
/// (the store, other sessions, the daemon's sockets). A named volume (no `/` in front) is
/// podman's own business.
fn check_mount(host: &Host, mount: &str) -> Result<()> {
    let src = mount.split(':').next().unwrap_or("");
    if !src.starts_with('/') {
        // podman takes `./x` and `../x` as host paths too: only a bare name is a volume.
        if src.contains('/') || src.starts_with('.') || src.starts_with('~') {
            return Err(Error::Refused(format!(
                "mount {mount:?}: give the source as an absolute path (or a named volume)"
            )));
        }
        return Ok(());
    }
    let canon = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let real = Path::new(src)
        .canonicalize()
        .map_err(|e| Error::Refused(format!("mount {mount:?}: {src}: {e}")))?;
    let refuse = |why: &str| {
        Err(Error::Refused(format!(
            "mount {mount:?}: {why}; mount a project directory"
        )))
    };
    if real == Path::new("/") {
        return refuse("the host's root would be the container's");
    }
    if canon(&host.home).starts_with(&real) {
        return refuse("it holds your home directory (~/.ssh, ~/.aws, other agents' logins)");
    }
    for h in &host.hidden {
        let h = canon(h);
        if h.starts_with(&real) || real.starts_with(&h) {
            return refuse(&format!(
                "{} is paddock's data or runtime directory",
                h.display()
            ));
        }
    }
    Ok(())
}

/// `podman run` flags the block may not give: what would mount more of the host, share its
/// namespaces or network, or lift the container's confinement and limits (paddock sets those
/// itself from the session's own fields).
const FORBIDDEN_FLAGS: &[&str] = &[
    "-v",
    "--volume",
    "--mount",
    "--volumes-from",
    "--rootfs",
    "--network",
    "--net",
    "--privileged",
    "--cap-add",
    "--device",
    "--pid",
    "--ipc",
    "--uts",
    "--cgroupns",
    "--cgroup-parent",
    "--userns=host",
    "--env-host",
    "--env-file",
    "--pids-limit",
    "--memory",
    "--memory-swap",
    "--entrypoint",
    "--security-opt=seccomp=unconfined",
    "--security-opt=apparmor=unconfined",
    "--security-opt=no-new-privileges=false",
];

/// Refuses a flag of the block that would undo the container (see [`FORBIDDEN_FLAGS`]).
fn check_flag(flag: &str) -> Result<()> {
    let f = flag.trim();
    let hit = FORBIDDEN_FLAGS.iter().any(|bad| {
        if bad.contains('=') {
            f == *bad
        } else {
            f == *bad || f.starts_with(&format!("{bad}="))
        }
    });
    // A short flag with its value joined (`-v/x:/y`) is a volume too.
    if hit || (f.starts_with("-v") && !f.starts_with("--")) || !f.starts_with('-') {
        return Err(Error::Refused(format!(
            "podman flag {flag:?} is not allowed: mounts, network, limits and the \
             container's confinement come from the session's own fields (a flag's value goes \
             in the same word: --flag=value)"
        )));
    }
    Ok(())
}

/// What an image string names.
#[derive(Debug, PartialEq, Eq)]
pub enum Image {
    /// A reference podman resolves (`localhost/x:1`, `docker.io/library/debian:12`).
    Reference(String),
    /// An image archive, or a root tarball, to load.
    Archive(PathBuf),
    /// A root directory.
    Rootfs(PathBuf),
}

impl Image {
    /// What `image` names: an absolute path is a file or a directory on this machine (the CLI
    /// makes relative ones absolute), anything else a reference.
    pub fn parse(image: &str) -> Result<Image> {
        let image = image.trim();
        if !image.starts_with('/') {
            return Ok(Image::Reference(image.to_string()));
        }
        let path = PathBuf::from(image);
        let meta = std::fs::metadata(&path)
            .map_err(|e| Error::Refused(format!("image {}: {e}", path.display())))?;
        if meta.is_dir() {
            let has = |p: &str| path.join(p).exists();
            if !(has("bin") || has("usr/bin")) {
                return Err(Error::Refused(format!(
                    "image {} is a directory but not a root directory (it has no bin/ or \
                     usr/bin/): give the root of a filesystem, an image archive or a reference",
                    path.display()
                )));
            }
            Ok(Image::Rootfs(path))
        } else {
            Ok(Image::Archive(path))
        }
    }
}

/// What the host lacks to run `image` in a container, said before anything is made.
pub fn check_host(image: &str) -> Result<()> {
    let podman = podman()?;
    init_program()?;
    if let Image::Reference(r) = Image::parse(image)? {
        let there = podman_command(&podman)
            .args(["image", "exists", &r])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| Error::spawn(&podman, e))?;
        if !there.success() {
            return Err(Error::Refused(format!(
                "image {r:?} is not on this machine: pull it first (podman pull {r}), or give \
                 an image archive or a root directory"
            )));
        }
    }
    Ok(())
}

/// A short stable name for a data dir (container labels).
pub(super) fn data_hash(data_dir: &Path) -> String {
    let dir = data_dir
        .canonicalize()
        .unwrap_or_else(|_| data_dir.to_path_buf());
    let h = dir
        .to_string_lossy()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("{h:016x}")
}

/// The image to start from, as `podman run` arguments (an archive is loaded first).
fn image_args(podman: &Path, image: &str, root: &Path) -> Result<Vec<String>> {
    match Image::parse(image)? {
        Image::Reference(r) => Ok(vec![r]),
        Image::Rootfs(dir) => Ok(vec!["--rootfs".into(), format!("{}:O", dir.display())]),
        Image::Archive(file) => {
            let path = file.to_string_lossy().to_string();
            match run(
                podman,
                &["load".into(), "-q".into(), "-i".into(), path.clone()],
            ) {
                Ok(out) => {
                    // "Loaded image: localhost/x:1" or "Loaded image(s): sha256:…".
                    let name = out
                        .lines()
                        .rev()
                        .find_map(|l| l.split_once(": ").map(|(_, n)| n.trim().to_string()))
                        .and_then(|n| n.split(',').next().map(str::to_string))
                        .ok_or_else(|| {
                            Error::Failed(format!("podman load {path}: no image named in {out:?}"))
                        })?;
                    super::log(root, &format!("loaded image {name} from {path}"));
                    Ok(vec![name])
                }
                Err(load) => {
                    // Not an image archive: a root filesystem as a tarball.
                    let tag = format!("localhost/paddock-import:{}", data_hash(&file));
                    run(
                        podman,
                        &["import".into(), "-q".into(), path.clone(), tag.clone()],
                    )
                    .map_err(|import| {
                        Error::Failed(format!(
                            "image {path} is neither an image archive nor a root tarball \
                                 ({load}; {import})"
                        ))
                    })?;
                    super::log(root, &format!("imported root tarball {path} as {tag}"));
                    Ok(vec![tag])
                }
            }
        }
    }
}

/// The limits of the user who runs paddock, as `--ulimit`s: podman would otherwise ask for
/// more open files and processes than a nested or locked-down host grants (runc then refuses
/// to start the container), and an agent needs no more than its user has.
fn ulimits() -> Vec<String> {
    use nix::sys::resource::{getrlimit, Resource};
    let mut out = Vec::new();
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        out.push(format!("--ulimit=nofile={soft}:{hard}"));
    }
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NPROC) {
        // No more than the kernel's pid space either.
        let max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(u64::MAX);
        out.push(format!(
            "--ulimit=nproc={}:{}",
            soft.min(max).min(hard.min(max)),
            hard.min(max)
        ));
    }
    out
}

/// Makes (or starts again) session `id`'s container. `made` is what the generic part made (the
/// workspace, a worktree, HOME and /tmp under `root`).
pub fn provision(
    host: &Host,
    id: &SessionId,
    config: &SessionConfig,
    root: &Path,
    made: &Made,
) -> Result<()> {
    let podman = podman()?;
    let name = container(id);
    let state = run(
        &podman,
        &[
            "container".into(),
            "inspect".into(),
            "--format".into(),
            "{{.State.Status}}".into(),
            name.clone(),
        ],
    );
    match state.as_deref() {
        Ok("running") => return Ok(()),
        Ok(_) => {
            run(&podman, &["start".into(), name.clone()])?;
            super::log(root, &format!("started container {name} again"));
            return Ok(());
        }
        Err(_) => {}
    }
    let spec = &config.env;
    let init = init_program()?;
    let s = |p: &Path| p.to_string_lossy().to_string();
    let mut args: Vec<String> = vec![
        "run".into(),
        "--detach".into(),
        "--name".into(),
        name.clone(),
        format!("--label={SESSION_LABEL}={}", id.0),
        format!("--label={DATA_LABEL}={}", data_hash(&host.data_dir)),
        // The container's own cgroup namespace (podman's default on cgroup v2; on v1 the
        // host's view cannot be mounted in a nested host).
        "--cgroupns=private".into(),
        format!("--network={}", if spec.network { "bridge" } else { "none" }),
        format!("--env=HOME={}", host.home.display()),
        "--env=TMPDIR=/tmp".into(),
    ];
    args.extend(ulimits());
    if spec.memory_bytes > 0 {
        // No swap beyond the memory limit: the limit is what the agent may use.
        args.push(format!("--memory={}", spec.memory_bytes));
        args.push(format!("--memory-swap={}", spec.memory_bytes));
    }
    if spec.pids > 0 {
        args.push(format!("--pids-limit={}", spec.pids));
    }
    let ws = super::workspace(host, id, config);
    let mut volume = |from: &Path, to: &Path, opts: &str| {
        args.push(format!("--volume={}:{}{opts}", s(from), s(to)));
    };
    volume(&ws, &ws, "");
    volume(&root.join("home"), &host.home, "");
    volume(&root.join("tmp"), Path::new("/tmp"), "");
    volume(Path::new(init), Path::new(INIT_AT), ":ro");
    for (real, at) in super::program_binds(&host.exe, &host.exe, &host.home) {
        volume(&real, &at, ":ro");
    }
    if let Some(r) = &made.repo {
        // As under bubblewrap: objects, the session's own branches and the worktree's admin
        // files writable; the rest of the repository, and what points the worktree at it,
        // read-only.
        volume(&r.common, &r.common, ":ro");
        for dir in [
            r.common.join("objects"),
            r.common.join("refs/heads/paddock"),
            r.common.join("logs/refs/heads/paddock"),
            r.admin.clone(),
        ] {
            super::make_private_dir(&dir)?;
            volume(&dir, &dir, "");
        }
        for c in [
            ws.join(".git"),
            r.admin.join("gitdir"),
            r.admin.join("commondir"),
        ] {
            if c.exists() {
                volume(&c, &c, ":ro");
            }
        }
    } else if ws.join(".git").exists() {
        volume(&ws.join(".git"), &ws.join(".git"), ":ro");
    }
    // What must stay hidden even inside the workspace: paddock's data and runtime directories,
    // the daemon's sockets (a same-user process could ask the daemon for a host session).
    for h in host
        .hidden
        .iter()
        .filter(|h| h.starts_with(&ws) && h.exists())
    {
        args.push(format!("--tmpfs={}", s(h)));
    }
    for m in host
        .masked
        .iter()
        .filter(|m| m.starts_with(&ws) && m.exists())
    {
        args.push(format!("--volume=/dev/null:{}:ro", s(m)));
    }
    for m in &spec.podman.mounts {
        check_mount(host, m)?;
        args.push(format!("--volume={m}"));
    }
    for p in &spec.podman.ports {
        args.push(format!("--publish={p}"));
    }
    for f in &spec.podman.flags {
        check_flag(f)?;
        args.push(f.clone());
    }
    let mut cmd_env = Vec::new();
    for (k, v) in &spec.podman.env {
        // The name only: the value reaches podman through its environment, not its argv.
        args.push(format!("--env={k}"));
        cmd_env.push((k.clone(), v.clone()));
    }
    args.push(format!("--entrypoint={INIT_AT}"));
    args.extend(image_args(&podman, &spec.image, root)?);
    args.push("-P".into());
    let out = podman_command(&podman)
        .args(&args)
        .envs(cmd_env)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::spawn(&podman, e))?;
    if !out.status.success() {
        // A container podman made but could not start is removed: nothing half-made stays.
        let _ = run(&podman, &["rm".into(), "--force".into(), name.clone()]);
        return Err(Error::Failed(format!(
            "podman could not start the container ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    // podman may drop limits it cannot apply (rootless on cgroup v1) with only a warning: a
    // session that asked for them does not run without them.
    if spec.pids > 0 || spec.memory_bytes > 0 {
        let applied = run(
            &podman,
            &[
                "container".into(),
                "inspect".into(),
                "--format".into(),
                "{{.HostConfig.PidsLimit}} {{.HostConfig.Memory}}".into(),
                name.clone(),
            ],
        )
        .unwrap_or_default();
        let mut it = applied
            .split_whitespace()
            .map(|n| n.parse::<i64>().unwrap_or(0));
        let (pids, memory) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        let pids_ok = spec.pids == 0 || pids == i64::from(spec.pids);
        let memory_ok = spec.memory_bytes == 0 || memory == spec.memory_bytes as i64;
        if !(pids_ok && memory_ok) {
            let _ = run(&podman, &["rm".into(), "--force".into(), name.clone()]);
            return Err(Error::Refused(format!(
                "podman did not apply the memory and process limits (pids {pids}, memory \
                 {memory}; rootless podman cannot on a cgroup v1 host): run the daemon as \
                 root, or without limits"
            )));
        }
    }
    super::log(
        root,
        &format!(
            "podman container {name} from {}: network {}, memory {}, pids {}",
            spec.image,
            if spec.network { "on" } else { "off" },
            if spec.memory_bytes > 0 {
                spec.memory_bytes.to_string()
            } else {
                "unlimited".into()
            },
            if spec.pids > 0 {
                spec.pids.to_string()
            } else {
                "unlimited".into()
            },
        ),
    );
    Ok(())
}

/// `plan` as a `podman exec` in session `id`'s container. The agent's program is the image's
/// own (the providers leave its name unresolved for a container, and the image's PATH finds
/// it), an absolute path the user gave, or paddock's binary (mounted at its host path).
pub fn enter(
    id: &SessionId,
    config: &SessionConfig,
    made: &Made,
    plan: LaunchPlan,
) -> Result<LaunchPlan> {
    let podman = podman()?;
    let mut args: Vec<String> = global_args().to_vec();
    args.extend([
        "exec".to_string(),
        "--interactive".to_string(),
        format!("--workdir={}", made.workdir.display()),
    ]);
    // Names only: values come from the client's environment (the session's variables, the
    // agent's own, and the containment tag and owner mark the supervisor sets on the client).
    let mut names: Vec<String> = plan.env.iter().map(|(k, _)| k.clone()).collect();
    names.push(paddock_sys::contain::TAG_VAR.into());
    names.push(paddock_sys::contain::OWNER_VAR.into());
    let keep = super::agent_variables(config.provider);
    names.extend(
        std::env::vars_os()
            .map(|(k, _)| k.to_string_lossy().to_string())
            .filter(|k| {
                (keep.iter().any(|p| k.starts_with(p))
                    || matches!(k.as_str(), "LANG" | "TERM" | "TZ"))
                    && !super::DAEMON_ONLY.contains(&k.as_str())
            }),
    );
    names.sort();
    names.dedup();
    for n in names {
        args.push(format!("--env={n}"));
    }
    args.push(container(id));
    args.push(plan.program.to_string_lossy().to_string());
    args.extend(plan.args);
    Ok(LaunchPlan {
        program: podman,
        args,
        env: plan.env,
        cwd: made.workdir.clone(),
    })
}

/// What podman says of container `name`: its state and its own log (`podman logs`: what its
/// main process wrote; paddock's idle init writes nothing, the agents' output is the
/// session's activity).
pub fn describe(name: &str) -> Result<(String, String)> {
    let podman = podman()?;
    let state = run(
        &podman,
        &[
            "container".into(),
            "inspect".into(),
            "--format".into(),
            "{{.State.Status}} (started {{.State.StartedAt}})".into(),
            name.to_string(),
        ],
    )?;
    let logs = run(
        &podman,
        &["logs".into(), "--timestamps".into(), name.to_string()],
    )?;
    Ok((state, logs))
}

/// Stops session (or Aria container) `id`'s container: TERM to everything in it, KILL after
/// podman's grace.
pub fn stop(id: &SessionId) {
    let Ok(podman) = podman() else { return };
    if let Err(e) = run(&podman, &["stop".into(), "--time=10".into(), container(id)]) {
        tracing::warn!(container = %container(id), "cannot stop the container: {e}");
    }
}

/// Removes session `id`'s container and everything still running in it.
pub fn remove(id: &SessionId) {
    let Ok(podman) = podman() else { return };
    let name = container(id);
    match run(
        &podman,
        &[
            "rm".into(),
            "--force".into(),
            "--time=0".into(),
            "--ignore".into(),
            name.clone(),
        ],
    ) {
        Ok(_) => tracing::info!(session = %id, container = %name, "removed the container"),
        Err(e) => tracing::warn!(session = %id, "cannot remove the container: {e}"),
    }
}

/// Daemon start-up: removes the containers of this data dir whose session (or Aria container)
/// is gone, and starts again those that should run (a session's, a running Aria container's:
/// a host reboot stops them). Returns how many were removed.
pub fn reconcile(
    host: &Host,
    exists: &dyn Fn(&SessionId) -> bool,
    should_run: &dyn Fn(&SessionId) -> bool,
) -> usize {
    let Ok(podman) = podman() else { return 0 };
    let Ok(list) = run(
        &podman,
        &[
            "ps".into(),
            "--all".into(),
            format!("--filter=label={DATA_LABEL}={}", data_hash(&host.data_dir)),
            format!("--format={{{{.Label \"{SESSION_LABEL}\"}}}} {{{{.State}}}}"),
        ],
    ) else {
        return 0;
    };
    let mut removed = 0;
    for line in list.lines() {
        let Some((id, state)) = line.split_once(' ') else {
            continue;
        };
        let id = SessionId(id.to_string());
        if !exists(&id) {
            remove(&id);
            removed += 1;
        } else if !state.eq_ignore_ascii_case("running") && should_run(&id) {
            match run(&podman, &["start".into(), container(&id)]) {
                Ok(_) => tracing::info!(session = %id, "started its container again"),
                Err(e) => tracing::warn!(session = %id, "cannot start its container: {e}"),
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_that_would_undo_the_container_are_refused() {
        for ok in [
            "--userns=keep-id",
            "--security-opt=label=disable",
            "--hostname=agent",
        ] {
            assert!(check_flag(ok).is_ok(), "{ok}");
        }
        for bad in [
            "-v",
            "-v/:/host",
            "--volume=/:/host",
            "--network=host",
            "--net=host",
            "--privileged",
            "--cap-add=ALL",
            "--pid=host",
            "--security-opt=seccomp=unconfined",
            "/:/host",
        ] {
            assert!(check_flag(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mounts_that_would_undo_the_container_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let home = dir.path().join("home");
        let project = dir.path().join("project");
        for d in [&data.join("sub"), &home, &project] {
            std::fs::create_dir_all(d).unwrap();
        }
        let host = Host {
            data_dir: data.clone(),
            hidden: vec![data.clone()],
            masked: Vec::new(),
            home: home.clone(),
            exe: PathBuf::from("/bin/true"),
        };
        let m = |src: &Path, rest: &str| format!("{}{rest}", src.display());
        assert!(check_mount(&host, &m(&project, ":/src:ro")).is_ok());
        assert!(check_mount(&host, "cache:/cache").is_ok(), "a named volume");
        for bad in [
            "/:/host".to_string(),
            m(dir.path(), ":/all"),
            m(&home, ":/h:ro"),
            m(&data, ":/d"),
            m(&data.join("sub"), ":/inside"),
        ] {
            assert!(check_mount(&host, &bad).is_err(), "{bad}");
        }
        let e = check_mount(&host, "/no/such/dir:/x").unwrap_err();
        assert!(
            matches!(&e, Error::Refused(m) if m.contains("/no/such/dir")),
            "{e}"
        );
    }

    #[test]
    fn images_are_references_archives_or_root_directories() {
        assert_eq!(
            Image::parse("localhost/x:1").unwrap(),
            Image::Reference("localhost/x:1".into())
        );
        let dir = tempfile::tempdir().unwrap();
        let err = Image::parse(&dir.path().display().to_string()).unwrap_err();
        assert!(
            matches!(&err, Error::Refused(m) if m.contains("not a root directory")),
            "{err}"
        );
        std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        assert_eq!(
            Image::parse(&dir.path().display().to_string()).unwrap(),
            Image::Rootfs(dir.path().to_path_buf())
        );
        let file = dir.path().join("image.tar");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(
            Image::parse(&file.display().to_string()).unwrap(),
            Image::Archive(file)
        );
        let missing = Image::parse("/no/such/image.tar").unwrap_err();
        assert!(
            matches!(&missing, Error::Refused(m) if m.contains("/no/such/image.tar")),
            "{missing}"
        );
    }
}
