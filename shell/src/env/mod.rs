//! Environments: what each driver makes for a session, how a process enters it, and what
//! deleting the session removes. The rules of an environment's life are the core's
//! ([`paddock_core::environment`]); this module is the I/O.
//!
//! Everything a session's environment owns lives under `<data dir>/environments/<session>/`:
//!
//! - `home/`, `tmp/` (bubblewrap): the sandbox's HOME and /tmp, the same for every process of
//!   the session (the agent, `session exec`, its Aria tasks), kept across restarts;
//! - `worktree/` (`--worktree`): a git worktree of the working directory's repository, on
//!   branch `paddock/<session name>`; the commit it started from is the ref
//!   `refs/paddock/<session>/base` of that repository (what `session diff` compares with);
//! - `made`: what starting a process there needs (the working directory, a sandboxed
//!   worktree's git directories), written once it is made, so a start runs no git;
//! - `environment.log`: what the driver did, for `session logs --environment`.
//!
//! How a process enters: [`enter`] turns a launch plan into one that runs in the environment
//! — for `local`, the same process in the (worktree's) working directory; for `bubblewrap`,
//! `bwrap` around it: the host read-only, the workspace writable, the session's own HOME and
//! /tmp, the daemon's data directory and sockets hidden, no network unless asked, the pid,
//! IPC and UTS namespaces its own, and `--die-with-parent`. The runner (or the daemon) that
//! starts it supervises `bwrap` like any agent: its process group, containment tag and
//! control group hold the whole sandbox, so a stop, a forced stop and the runner's end reach
//! everything in it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use paddock_core::{Driver, EnvSpec, Provider, SessionConfig, SessionId};

use crate::proc::LaunchPlan;

/// What an environment needs to know about the host it is made on.
#[derive(Debug, Clone)]
pub struct Host {
    /// The daemon's data directory: environments live under it.
    pub data_dir: PathBuf,
    /// Directories a sandboxed process must not see: the data dir (the store, the runner's
    /// socket, other sessions' environments) and the user's runtime directory (the sockets
    /// of the user's services: an agent could otherwise reach the host through them).
    pub hidden: Vec<PathBuf>,
    /// Sockets masked (with `/dev/null`) inside a sandbox: the daemon's own, wherever they
    /// are — a same-user client could otherwise ask the daemon to run anything on the host.
    pub masked: Vec<PathBuf>,
    /// The user's home, replaced inside a sandbox.
    pub home: PathBuf,
    /// paddock's own binary (the scripted agent and the bridges run it).
    pub exe: PathBuf,
}

impl Host {
    /// The host of a daemon with this data dir and these sockets.
    pub fn new(data_dir: &Path, sockets: &[&Path], exe: &Path) -> Host {
        let mut hidden = vec![data_dir.to_path_buf()];
        if let Some(rt) = dirs::runtime_dir() {
            hidden.push(rt);
        }
        hidden.sort();
        hidden.dedup();
        Host {
            data_dir: data_dir.to_path_buf(),
            hidden,
            masked: sockets.iter().map(|s| s.to_path_buf()).collect(),
            home: crate::paths::home(),
            exe: exe.to_path_buf(),
        }
    }

    /// Masks these sockets too.
    pub fn mask<'a>(&mut self, sockets: impl IntoIterator<Item = &'a PathBuf>) {
        self.masked.extend(sockets.into_iter().cloned());
    }

    fn root(&self, id: &SessionId) -> PathBuf {
        self.data_dir.join("environments").join(&id.0)
    }
}

/// The branch a session's worktree is on.
pub fn branch(agent_name: &str, id: &SessionId) -> String {
    let name: String = agent_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = name.trim_matches(|c| c == '.' || c == '-');
    if name.is_empty() {
        format!("paddock/{}", id.0)
    } else {
        format!("paddock/{name}")
    }
}

/// The ref that names the commit a session's worktree started from.
pub fn base_ref(id: &SessionId) -> String {
    format!("refs/paddock/{}/base", id.0)
}

/// What the host lacks for `spec`, said so that the user knows what to install or fix. Run
/// before a session is created: a refusal leaves nothing behind.
pub fn check_host(spec: &EnvSpec, working_dir: &Path) -> Result<(), String> {
    if spec.worktree {
        let git = crate::paths::find_on_own_path("git")
            .ok_or("--worktree needs git, which is not on PATH: install git")?;
        repo_root(&git, working_dir)?;
    }
    match spec.driver {
        Driver::Local => Ok(()),
        Driver::Bubblewrap => {
            let bwrap = crate::paths::find_on_own_path("bwrap").ok_or(
                "the bubblewrap driver needs bwrap, which is not on PATH: install the \
                 `bubblewrap` package (apt install bubblewrap, dnf install bubblewrap)",
            )?;
            // A kernel or container that forbids the namespaces bwrap needs says so here,
            // not at the agent's start.
            let out = std::process::Command::new(&bwrap)
                .args(["--ro-bind", "/", "/", "--unshare-pid", "--unshare-net"])
                .args(["--die-with-parent", "--", "true"])
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", bwrap.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "bwrap cannot make a sandbox on this machine ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(())
        }
    }
}

/// The top of the git repository `dir` is in.
fn repo_root(git: &Path, dir: &Path) -> Result<PathBuf, String> {
    let top = git_out(git, dir, &["rev-parse", "--show-toplevel"]).map_err(|e| {
        format!(
            "--worktree: {} is not in a git repository ({e})",
            dir.display()
        )
    })?;
    Ok(PathBuf::from(top))
}

/// Runs git in `dir`; its trimmed stdout, or its stderr as the error.
fn git_out(git: &Path, dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(git)
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Appends one line to the environment's log.
fn log(root: &Path, line: &str) {
    let stamp = crate::paths::wall_clock();
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("environment.log"))
    {
        let _ = writeln!(f, "{} {line}", stamp.millis());
    }
}

/// Makes session `id`'s environment, or what is missing of it: safe to call again (a restart
/// calls it before the agent starts). Returns the agent's working directory in it.
pub fn provision(host: &Host, id: &SessionId, config: &SessionConfig) -> Result<Made, String> {
    let spec = &config.env;
    let root = host.root(id);
    make_private_dir(&root)?;
    let mut workdir = PathBuf::from(&config.working_dir);
    if spec.worktree {
        workdir = worktree(id, config, &root)?;
    }
    if spec.driver == Driver::Bubblewrap {
        if !root.join("home").exists() {
            log(
                &root,
                &format!(
                    "bubblewrap sandbox: HOME {} and /tmp of its own, network {}",
                    host.home.display(),
                    if spec.network { "on" } else { "off" }
                ),
            );
        }
        for d in ["home", "tmp"] {
            make_private_dir(&root.join(d))?;
        }
        let copied = pass_agent_config(config.provider, &host.home, &root.join("home"));
        if !copied.is_empty() {
            log(
                &root,
                &format!("agent configuration passed in: {}", copied.join(", ")),
            );
        }
    }
    let git = if spec.worktree && spec.driver == Driver::Bubblewrap {
        Some(git_dirs(&root.join("worktree"))?)
    } else {
        None
    };
    let made = Made { workdir, git };
    made.write(&root)?;
    Ok(made)
}

/// What [`provision`] made that every later start needs, kept in the environment's `made`
/// file so that starting a process there runs no git and changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Made {
    /// Where the session's processes start.
    pub workdir: PathBuf,
    /// A sandboxed worktree's repository: its git directory (read-only inside) and what a
    /// commit writes (see [`git_dirs`]).
    pub git: Option<(PathBuf, Vec<PathBuf>)>,
}

impl Made {
    /// One path per line: the workdir, then (for a sandboxed worktree) the repository's git
    /// directory and the writable ones.
    fn write(&self, root: &Path) -> Result<(), String> {
        let mut lines = vec![self.workdir.clone()];
        if let Some((common, writable)) = &self.git {
            lines.push(common.clone());
            lines.extend(writable.iter().cloned());
        }
        let text: Vec<String> = lines
            .iter()
            .map(|p| p.to_string_lossy().to_string())
            .collect();
        let file = root.join("made");
        std::fs::write(&file, text.join("\n") + "\n")
            .map_err(|e| format!("cannot write {}: {e}", file.display()))
    }

    fn read(root: &Path, sandboxed_worktree: bool) -> Option<Made> {
        let text = std::fs::read_to_string(root.join("made")).ok()?;
        let mut lines = text.lines().map(PathBuf::from);
        let workdir = lines.next()?;
        let git = if sandboxed_worktree {
            let common = lines.next()?;
            Some((common, lines.collect()))
        } else {
            None
        };
        Some(Made { workdir, git })
    }
}

fn make_private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot make {}: {e}", dir.display()))
}

/// The session's worktree (made if missing), and the working directory in it that matches
/// the session's own in the repository.
fn worktree(id: &SessionId, config: &SessionConfig, root: &Path) -> Result<PathBuf, String> {
    let git = crate::paths::find_on_own_path("git").ok_or("git is not on PATH: install git")?;
    let wd = Path::new(&config.working_dir);
    let top = repo_root(&git, wd)?;
    let inside = wd
        .canonicalize()
        .ok()
        .and_then(|w| {
            let top = top.canonicalize().ok()?;
            w.strip_prefix(&top).ok().map(Path::to_path_buf)
        })
        .unwrap_or_default();
    let path = root.join("worktree");
    if !path.join(".git").exists() {
        let branch = branch(&config.agent_name, id);
        let head = git_out(&git, &top, &["rev-parse", "HEAD"])
            .map_err(|e| format!("--worktree: the repository has no commit to start from ({e})"))?;
        let path_s = path.to_string_lossy().to_string();
        let exists = git_out(&git, &top, &["rev-parse", "--verify", "--quiet", &branch]).is_ok();
        let args: Vec<&str> = if exists {
            // A branch kept from an earlier session of that name (`delete` keeps branches):
            // the agent goes on from it.
            vec!["worktree", "add", &path_s, &branch]
        } else {
            vec!["worktree", "add", "-b", &branch, &path_s, &head]
        };
        git_out(&git, &top, &args).map_err(|e| format!("git worktree add failed: {e}"))?;
        let base = if exists {
            git_out(&git, &top, &["rev-parse", &branch]).unwrap_or(head)
        } else {
            head
        };
        git_out(&git, &top, &["update-ref", &base_ref(id), &base])
            .map_err(|e| format!("cannot record the worktree's base: {e}"))?;
        log(
            root,
            &format!(
                "worktree {} on branch {branch} from {base} of {}",
                path.display(),
                top.display()
            ),
        );
    }
    Ok(if inside.as_os_str().is_empty() {
        path
    } else {
        path.join(inside)
    })
}

/// Files under HOME through which each agent signs in and is configured: copied into a
/// sandbox's HOME, so the agent works there while the user's other secrets (`~/.ssh`,
/// `~/.aws`, other agents' logins) stay out of sight. Copies, not binds: nothing in the
/// sandbox can change the user's own.
fn agent_config_files(provider: Provider) -> &'static [&'static str] {
    match provider {
        Provider::ClaudeCode => &[
            ".claude.json",
            ".claude/.credentials.json",
            ".claude/settings.json",
        ],
        Provider::Codex => &[".codex/auth.json", ".codex/config.toml"],
        Provider::Gemini => &[
            ".gemini/settings.json",
            ".gemini/oauth_creds.json",
            ".gemini/google_accounts.json",
        ],
        _ => &[],
    }
}

fn pass_agent_config(provider: Provider, home: &Path, into: &Path) -> Vec<String> {
    let mut copied = Vec::new();
    for rel in agent_config_files(provider) {
        let from = home.join(rel);
        let to = into.join(rel);
        if !from.is_file() || to.exists() {
            continue;
        }
        if let Some(parent) = to.parent() {
            if make_private_dir(parent).is_err() {
                continue;
            }
        }
        if std::fs::copy(&from, &to).is_ok() {
            copied.push(format!("~/{rel}"));
        }
    }
    copied
}

/// `plan` as it runs in session `id`'s environment (made first if it is not: a restart after
/// a failed making, or files removed by hand).
pub fn enter(
    host: &Host,
    id: &SessionId,
    config: &SessionConfig,
    plan: LaunchPlan,
) -> Result<LaunchPlan, String> {
    let made = if !config.env.needs_provisioning() {
        Made {
            workdir: PathBuf::from(&config.working_dir),
            git: None,
        }
    } else {
        let sandboxed_worktree = config.env.worktree && config.env.driver == Driver::Bubblewrap;
        match Made::read(&host.root(id), sandboxed_worktree) {
            Some(made) if made.workdir.is_dir() => made,
            // Never made (a restart after a making that was given up), or removed by hand.
            _ => provision(host, id, config)?,
        }
    };
    match config.env.driver {
        Driver::Local => Ok(LaunchPlan {
            cwd: made.workdir,
            ..plan
        }),
        Driver::Bubblewrap => bubblewrap(host, id, config, &made, plan),
    }
}

/// The directory the session's processes may write: the worktree, or the working directory.
fn workspace(host: &Host, id: &SessionId, config: &SessionConfig) -> PathBuf {
    if config.env.worktree {
        host.root(id).join("worktree")
    } else {
        PathBuf::from(&config.working_dir)
    }
}

fn bubblewrap(
    host: &Host,
    id: &SessionId,
    config: &SessionConfig,
    made: &Made,
    plan: LaunchPlan,
) -> Result<LaunchPlan, String> {
    let workdir = &made.workdir;
    let bwrap = crate::paths::find_on_own_path("bwrap")
        .ok_or("bwrap is not on PATH: install the `bubblewrap` package")?;
    let root = host.root(id);
    let s = |p: &Path| p.to_string_lossy().to_string();
    let mut args: Vec<String> = vec![
        "--die-with-parent".into(),
        "--unshare-pid".into(),
        "--unshare-ipc".into(),
        "--unshare-uts".into(),
        "--unshare-cgroup-try".into(),
    ];
    if !config.env.network {
        args.push("--unshare-net".into());
    }
    args.extend(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"].map(String::from));
    args.extend(["--bind".into(), s(&root.join("tmp")), "/tmp".into()]);
    args.extend(["--bind".into(), s(&root.join("home")), s(&host.home)]);
    // The agent's program, and paddock's own (the scripted agent, the bridges), must still be
    // found where they are: an agent installed under HOME (~/.local, ~/.npm-global, ~/.nvm)
    // gets the top directory under HOME that holds it, read-only; a program the sandbox would
    // otherwise hide (in /tmp, in a hidden directory) is shown itself, read-only.
    if let Some(top) = install_dir_under(&plan.program, &host.home) {
        args.extend(["--ro-bind".into(), s(&top), s(&top)]);
    }
    for program in [&plan.program, &host.exe] {
        let hidden =
            program.starts_with("/tmp") || host.hidden.iter().any(|h| program.starts_with(h));
        if let (true, Ok(real)) = (hidden, program.canonicalize()) {
            args.extend(["--ro-bind".into(), s(&real), s(program)]);
        }
    }
    // Mounts stack in order: what is hidden is covered by an empty tmpfs, then the
    // workspace is shown on top (a worktree lives in the hidden data dir), then what is hidden
    // inside the workspace is covered again.
    let ws = workspace(host, id, config);
    let (inside, outside): (Vec<&PathBuf>, Vec<&PathBuf>) = host
        .hidden
        .iter()
        .filter(|h| h.exists())
        .partition(|h| h.starts_with(&ws) && **h != ws);
    for h in outside {
        args.extend(["--tmpfs".into(), s(h)]);
    }
    for m in host.masked.iter().filter(|m| m.exists()) {
        args.extend(["--ro-bind".into(), "/dev/null".into(), s(m)]);
    }
    args.extend(["--bind".into(), s(&ws), s(&ws)]);
    for h in inside {
        args.extend(["--tmpfs".into(), s(h)]);
    }
    // A worktree's commits go to its repository's object store and refs: those are writable,
    // the repository's hooks and config stay read-only (a hook written from inside would run
    // on the host at the user's next git command).
    if let Some((common, writable)) = &made.git {
        args.extend(["--ro-bind".into(), s(common), s(common)]);
        for dir in writable {
            args.extend(["--bind".into(), s(dir), s(dir)]);
        }
    }
    args.extend(["--chdir".into(), s(workdir)]);
    args.extend(["--setenv".into(), "HOME".into(), s(&host.home)]);
    args.extend(["--setenv".into(), "TMPDIR".into(), "/tmp".into()]);
    args.push("--".into());
    args.push(s(&plan.program));
    args.extend(plan.args);
    Ok(LaunchPlan {
        program: bwrap,
        args,
        env: plan.env,
        // bwrap itself starts where the workspace is: a directory it can always see.
        cwd: ws,
    })
}

/// The repository a worktree at `ws` belongs to (its git directory, which the worktree reads:
/// config, HEAD, …), and what a commit there writes: the repository's objects, refs and
/// reflogs, and the worktree's own administrative directory.
fn git_dirs(ws: &Path) -> Result<(PathBuf, Vec<PathBuf>), String> {
    let git = crate::paths::find_on_own_path("git").ok_or("git is not on PATH: install git")?;
    let abs = |p: String| {
        let p = PathBuf::from(p);
        if p.is_absolute() {
            p
        } else {
            ws.join(p)
        }
    };
    let common = abs(git_out(&git, ws, &["rev-parse", "--git-common-dir"])?);
    let own = abs(git_out(&git, ws, &["rev-parse", "--git-dir"])?);
    let mut dirs = Vec::new();
    for d in ["objects", "refs", "logs"] {
        let dir = common.join(d);
        make_private_dir(&dir)?;
        dirs.push(dir);
    }
    dirs.push(own);
    Ok((common, dirs))
}

/// The directory right under `home` that holds `program` (after symlinks), if it is there.
fn install_dir_under(program: &Path, home: &Path) -> Option<PathBuf> {
    let real = program.canonicalize().ok()?;
    let home = home.canonicalize().ok()?;
    let rest = real.strip_prefix(&home).ok()?;
    let first = rest.components().next()?;
    Some(home.join(first))
}

/// Removes what session `id`'s environment made: its worktree (the branch stays: it is the
/// agent's work), the base ref, the sandbox's HOME and /tmp. In two steps, so that the caller
/// (the event loop, right after the delete committed) waits only for the quick one: the
/// environment's directory is renamed out of the way and git is told its worktree is gone
/// (`git worktree prune`: its branch can be deleted at once); the files are removed by the
/// returned closure, to run on a blocking thread. What a crash leaves is removed by
/// [`reconcile`] at the next start. Failures are logged: the row is already gone.
pub fn destroy(host: &Host, id: &SessionId, config: &SessionConfig) -> impl FnOnce() + Send {
    let root = host.root(id);
    let trash = root.with_file_name(format!("{TRASH}{}", id.0));
    let moved = root.exists() && std::fs::rename(&root, &trash).is_ok();
    if !moved && root.exists() {
        tracing::warn!(session = %id, dir = %root.display(), "cannot move the environment away");
    }
    if config.env.worktree {
        if let Some(git) = crate::paths::find_on_own_path("git") {
            if let Ok(top) = repo_root(&git, Path::new(&config.working_dir)) {
                let _ = git_out(&git, &top, &["worktree", "prune"]);
                let _ = git_out(&git, &top, &["update-ref", "-d", &base_ref(id)]);
            }
        }
    }
    let id = id.clone();
    move || {
        if !moved {
            return;
        }
        match std::fs::remove_dir_all(&trash) {
            Ok(()) => tracing::info!(session = %id, "removed the session's environment"),
            Err(e) => {
                tracing::warn!(session = %id, dir = %trash.display(), "cannot remove the environment: {e}")
            }
        }
    }
}

/// The prefix of an environment being removed (see [`destroy`]).
const TRASH: &str = ".removing-";

/// Daemon start-up: removes the environments of sessions the store no longer has (a crash
/// between a delete's commit and its [`destroy`], or during its removal). Their worktrees are
/// pruned by git itself once their directories are gone (`git worktree prune`, which any
/// later worktree command runs).
pub fn reconcile(host: &Host, exists: impl Fn(&SessionId) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(host.data_dir.join("environments")) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let id = SessionId(e.file_name().to_string_lossy().to_string());
        if exists(&id) {
            continue;
        }
        if std::fs::remove_dir_all(e.path()).is_ok() {
            tracing::info!(session = %id, "removed the environment of a session that is gone");
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branches_are_named_after_the_session() {
        let id = SessionId("sess_01".into());
        assert_eq!(branch("fix-tests", &id), "paddock/fix-tests");
        assert_eq!(branch("a b/c", &id), "paddock/a-b-c");
        assert_eq!(branch("...", &id), "paddock/sess_01");
    }
}
