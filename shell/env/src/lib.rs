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

use paddock_sys::proc::LaunchPlan;

pub mod container;
mod error;
pub mod kube;
pub mod limits;
pub mod podman;
pub mod qemu;
pub mod relay;
pub mod request;
pub mod ssh;

pub use error::{Error, Result};

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
            home: paddock_sys::paths::home(),
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
pub fn check_host(spec: &EnvSpec, working_dir: &Path) -> Result<()> {
    if spec.worktree {
        repo_root(&git()?, working_dir)?;
    }
    match spec.driver {
        Driver::Local => Ok(()),
        Driver::Bubblewrap => {
            let bwrap = bwrap()?;
            // A kernel or container that forbids the namespaces bwrap needs says so here,
            // not at the agent's start.
            let out = std::process::Command::new(&bwrap)
                .args(namespace_args(false))
                .args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"])
                .args(["--tmpfs", "/run", "--", "true"])
                .stdin(Stdio::null())
                .output()
                .map_err(|e| Error::spawn(&bwrap, e))?;
            if !out.status.success() {
                return Err(Error::Refused(format!(
                    "bwrap cannot make a sandbox on this machine ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            Ok(())
        }
        Driver::Podman => podman::check_host(&spec.image),
        Driver::Ssh => ssh::check_host(),
        Driver::Qemu => qemu::check_host(&spec.image),
        Driver::Kubernetes => kube::check_host(spec),
    }
}

/// git, or what to install.
fn git() -> Result<PathBuf> {
    paddock_sys::paths::find_on_own_path("git").ok_or(Error::NotInstalled {
        needed_by: "--worktree",
        program: "git",
        install: "git",
    })
}

/// bwrap, or what to install.
fn bwrap() -> Result<PathBuf> {
    paddock_sys::paths::find_on_own_path("bwrap").ok_or(Error::NotInstalled {
        needed_by: "the bubblewrap driver",
        program: "bwrap",
        install: "the `bubblewrap` package (apt install bubblewrap, dnf install bubblewrap)",
    })
}

/// The top of the git repository `dir` is in.
fn repo_root(git: &Path, dir: &Path) -> Result<PathBuf> {
    let top = git_out(git, dir, &["rev-parse", "--show-toplevel"]).map_err(|e| {
        Error::Refused(format!(
            "--worktree: {} is not in a git repository ({e})",
            dir.display()
        ))
    })?;
    Ok(PathBuf::from(top))
}

/// Runs git in `dir`; its trimmed stdout, or its stderr as the error.
pub fn git_out(git: &Path, dir: &Path, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(git)
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::spawn("git", e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(Error::Failed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

/// A runtime of its own for an async client, on the calling thread.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)
}

/// Appends one line to the environment's log.
fn log(root: &Path, line: &str) {
    let stamp = paddock_sys::paths::wall_clock();
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("environment.log"))
    {
        let _ = writeln!(f, "{} {line}", stamp.millis());
    }
}

/// Makes session `id`'s environment, or what is missing of it: safe to call again (a restart
/// calls it before the agent starts). Returns what a start there needs.
pub fn provision(host: &Host, id: &SessionId, config: &SessionConfig) -> Result<Made> {
    let spec = &config.env;
    let root = host.root(id);
    // A workspace of its own (an Aria container's) is safe where it is.
    if spec.driver.sandboxes_here()
        && !spec.worktree
        && !Path::new(&config.working_dir).starts_with(&root)
    {
        safe_workspace(host, Path::new(&config.working_dir))?;
    }
    make_private_dir(&root)?;
    let mut made = Made::nothing_in(&config.working_dir);
    if spec.driver == Driver::Kubernetes {
        let say = |line: &str| log(&root, line);
        let pod = kube::make_pod(spec, id, &kube::owner(&host.data_dir)?, &root, &say)?;
        // Recorded once the pod exists: a destroy then finds it, whatever fails after.
        made.pod = Some(pod.clone());
        made.write(&root)?;
        let (remote, workdir) = kube::ready(&host.exe, spec, &pod, &say)?;
        made.workdir = workdir;
        made.remote = Some(remote);
    }
    if spec.driver == Driver::Ssh {
        let (remote, workdir) = ssh::provision(&host.exe, spec.ssh(), &|line| log(&root, line))?;
        made.workdir = workdir;
        made.remote = Some(remote);
    }
    if spec.driver == Driver::Qemu {
        // Recorded once the VM runs: a destroy then finds it, whatever fails after.
        made.vm_port = Some(qemu::start(spec, &root, &|line| log(&root, line))?);
        made.write(&root)?;
        qemu::wait_ready(spec, &root, &made, &|line| log(&root, line))?;
        let target = qemu::target(spec, &root, &made);
        let (remote, workdir) = ssh::provision(&host.exe, &target, &|line| log(&root, line))?;
        made.workdir = workdir;
        made.remote = Some(remote);
    }
    if spec.worktree {
        let (workdir, repo) = worktree(id, config, &root)?;
        made.workdir = workdir;
        made.repo = Some(repo);
    }
    if spec.driver == Driver::Bubblewrap && (spec.pids > 0 || spec.memory_bytes > 0) {
        // Recorded before anything else can fail, so that a destroy finds them.
        made.cgroups = limits::make(&host.data_dir, id, spec)?;
        made.write(&root)?;
    }
    if spec.driver.sandboxes_here() && !root.join("home").exists() {
        log(
            &root,
            &format!(
                "{} environment: HOME {} and /tmp of its own, network {}",
                spec.driver,
                host.home.display(),
                if spec.network { "on" } else { "off" }
            ),
        );
        make_private_dir(&root.join("tmp"))?;
        make_private_dir(&root.join("home"))?;
        // Only into a HOME just made: later, the agent owns it (and could plant symlinks).
        let copied = pass_agent_config(config.provider, &host.home, &root.join("home"));
        if !copied.is_empty() {
            log(
                &root,
                &format!("agent configuration passed in: {}", copied.join(", ")),
            );
        }
    }
    if spec.driver == Driver::Podman {
        podman::provision(host, id, config, &root, &made)?;
        made.container = Some(podman::container(id));
    }
    made.write(&root)?;
    Ok(made)
}

/// Refuses a workspace that would undo a sandbox: the workspace is shown writable over
/// everything else, so it must not be `/`, HOME or a directory holding it, or one of the
/// directories a sandbox hides (or inside one).
fn safe_workspace(host: &Host, ws: &Path) -> Result<()> {
    let canon = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let ws = canon(ws);
    let home = canon(&host.home);
    if ws == Path::new("/") || home.starts_with(&ws) {
        return Err(Error::Refused(format!(
            "the workspace {} holds your home directory: a sandbox would give the agent all of \
             it; give a project directory (--mount DIR:/workspace, or run from it)",
            ws.display()
        )));
    }
    if let Some(h) = host
        .hidden
        .iter()
        .map(|h| canon(h))
        .find(|h| ws.starts_with(h))
    {
        return Err(Error::Refused(format!(
            "the workspace {} is inside {}, which a sandbox hides (paddock's data or runtime \
             directory)",
            ws.display(),
            h.display()
        )));
    }
    Ok(())
}

/// A worktree's repository, as the host knows it (never as the worktree says: the agent can
/// rewrite its `.git` file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repo {
    /// The repository's top directory (the user's checkout).
    pub top: PathBuf,
    /// Its git directory (config, hooks, refs, objects).
    pub common: PathBuf,
    /// The worktree's administrative directory (`<common>/worktrees/<name>`: HEAD, index).
    pub admin: PathBuf,
    /// The commit the worktree started from (what `session diff` compares with).
    pub base: String,
}

/// What [`provision`] made that every later start needs, kept in the environment's `made`
/// file (one `key=value` per line) so that a start runs no git and trusts nothing the agent
/// can write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Made {
    /// Where the session's processes start.
    pub workdir: PathBuf,
    /// The worktree's repository, for a session with one.
    pub repo: Option<Repo>,
    /// The session's container (podman).
    pub container: Option<String>,
    /// The `cgroup.procs` files of the session's limits (bubblewrap): each process joins them.
    pub cgroups: Vec<PathBuf>,
    /// The ssh host's paddock and runner (`workdir` is then the host's).
    pub remote: Option<ssh::Remote>,
    /// The port on 127.0.0.1 that reaches a qemu VM's ssh.
    pub vm_port: Option<u16>,
    /// A kubernetes session's pod.
    pub pod: Option<kube::PodRef>,
}

impl Made {
    /// Nothing made (yet): processes start in `workdir`, on the host.
    fn nothing_in(workdir: &str) -> Made {
        Made {
            workdir: PathBuf::from(workdir),
            repo: None,
            container: None,
            cgroups: Vec::new(),
            remote: None,
            vm_port: None,
            pod: None,
        }
    }

    fn write(&self, root: &Path) -> Result<()> {
        let mut text = format!("workdir={}\n", self.workdir.display());
        if let Some(r) = &self.repo {
            text += &format!(
                "top={}\ncommon={}\nadmin={}\nbase={}\n",
                r.top.display(),
                r.common.display(),
                r.admin.display(),
                r.base
            );
        }
        if let Some(c) = &self.container {
            text += &format!("container={c}\n");
        }
        for g in &self.cgroups {
            text += &format!("cgroup={}\n", g.display());
        }
        if let Some(r) = &self.remote {
            text += &format!("remote_paddock={}\nremote_socket={}\n", r.paddock, r.socket);
        }
        if let Some(p) = self.vm_port {
            text += &format!("vm_port={p}\n");
        }
        if let Some(p) = &self.pod {
            text += &format!(
                "pod_namespace={}\npod_name={}\npod_container={}\nkubeconfig={}\nkube_context={}\n",
                p.namespace, p.name, p.container, p.kubeconfig, p.context
            );
        }
        let file = root.join("made");
        std::fs::write(&file, text).map_err(|e| Error::file("write", file, e))
    }

    /// What the environment at `root` recorded (`None`: never made, or unreadable).
    pub fn read(root: &Path) -> Option<Made> {
        let text = std::fs::read_to_string(root.join("made")).ok()?;
        let mut kv = std::collections::BTreeMap::new();
        let mut cgroups = Vec::new();
        for line in text.lines() {
            let (k, v) = line.split_once('=')?;
            if k == "cgroup" {
                cgroups.push(PathBuf::from(v));
            } else {
                kv.insert(k, v);
            }
        }
        let repo = match (
            kv.get("top"),
            kv.get("common"),
            kv.get("admin"),
            kv.get("base"),
        ) {
            (Some(t), Some(c), Some(a), Some(b)) => Some(Repo {
                top: PathBuf::from(t),
                common: PathBuf::from(c),
                admin: PathBuf::from(a),
                base: b.to_string(),
            }),
            _ => None,
        };
        Some(Made {
            workdir: PathBuf::from(kv.get("workdir")?),
            repo,
            container: kv.get("container").map(|c| c.to_string()),
            cgroups,
            remote: match (kv.get("remote_paddock"), kv.get("remote_socket")) {
                (Some(p), Some(s)) => Some(ssh::Remote {
                    paddock: p.to_string(),
                    socket: s.to_string(),
                }),
                _ => None,
            },
            vm_port: kv.get("vm_port").and_then(|p| p.parse().ok()),
            pod: match (
                kv.get("pod_namespace"),
                kv.get("pod_name"),
                kv.get("pod_container"),
            ) {
                (Some(ns), Some(name), Some(c)) => Some(kube::PodRef {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                    container: c.to_string(),
                    kubeconfig: kv.get("kubeconfig").unwrap_or(&"").to_string(),
                    context: kv.get("kube_context").unwrap_or(&"").to_string(),
                }),
                _ => None,
            },
        })
    }
}

/// Where session `id`'s environment lives (for the CLI, which reads its `made` file).
pub fn root_in(data_dir: &Path, id: &SessionId) -> PathBuf {
    data_dir.join("environments").join(&id.0)
}

fn make_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::file("make", dir, e))
}

/// The session's worktree (made if missing) and its repository, and the working directory in
/// it that matches the session's own in the repository.
fn worktree(id: &SessionId, config: &SessionConfig, root: &Path) -> Result<(PathBuf, Repo)> {
    let git = git()?;
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
    let common = PathBuf::from(git_out(
        &git,
        &top,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )?);
    let path = root.join("worktree");
    let base = match Made::read(root).and_then(|m| m.repo) {
        Some(r) if path.exists() => r.base,
        _ => {
            let branch = branch(&config.agent_name, id);
            git_out(&git, &top, &["check-ref-format", "--branch", &branch]).map_err(|e| {
                Error::Refused(format!(
                    "--worktree: {branch:?} is not a valid branch name ({e})"
                ))
            })?;
            let head = git_out(&git, &top, &["rev-parse", "HEAD"]).map_err(|e| {
                Error::Refused(format!(
                    "--worktree: the repository has no commit to start from ({e})"
                ))
            })?;
            let path_s = path.to_string_lossy().to_string();
            let full = format!("refs/heads/{branch}");
            let exists = git_out(&git, &top, &["rev-parse", "--verify", "--quiet", &full]).is_ok();
            let args: Vec<&str> = if exists {
                // A branch kept from an earlier session of that name (`delete` keeps
                // branches): the agent goes on from it.
                vec!["worktree", "add", &path_s, &branch]
            } else {
                vec!["worktree", "add", "-b", &branch, &path_s, &head]
            };
            git_out(&git, &top, &args).map_err(|e| {
                e.during(format!(
                    "git worktree add of branch {branch} failed (is a session of that name still \
                     live? give another --name)"
                ))
            })?;
            let base = if exists {
                git_out(&git, &top, &["rev-parse", &full]).unwrap_or(head)
            } else {
                head
            };
            // Keeps the base commit reachable (gc); what diff compares with is the copy in
            // `made`, out of the agent's reach.
            git_out(&git, &top, &["update-ref", &base_ref(id), &base])
                .map_err(|e| e.during("cannot record the worktree's base"))?;
            log(
                root,
                &format!(
                    "worktree {} on branch {branch} from {base} of {}",
                    path.display(),
                    top.display()
                ),
            );
            base
        }
    };
    let admin = admin_dir(&common, &path)?;
    let workdir = if inside.as_os_str().is_empty() {
        path
    } else {
        path.join(inside)
    };
    Ok((
        workdir,
        Repo {
            top,
            common,
            admin,
            base,
        },
    ))
}

/// The administrative directory git keeps for the worktree at `path`: the entry of
/// `<common>/worktrees/` whose `gitdir` names `path/.git` (found from the repository's side,
/// never from the worktree's `.git` file, which the agent can rewrite).
fn admin_dir(common: &Path, path: &Path) -> Result<PathBuf> {
    let want = path.join(".git");
    let entries = std::fs::read_dir(common.join("worktrees"))
        .map_err(|e| Error::file("read", common.join("worktrees"), e))?;
    for e in entries.flatten() {
        let gitdir = std::fs::read_to_string(e.path().join("gitdir")).unwrap_or_default();
        if Path::new(gitdir.trim()) == want {
            return Ok(e.path());
        }
    }
    Err(Error::Failed(format!(
        "git has no worktree entry for {} in {}",
        path.display(),
        common.display()
    )))
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
    use std::os::unix::fs::OpenOptionsExt;
    let mut copied = Vec::new();
    for rel in agent_config_files(provider) {
        let from = home.join(rel);
        if !std::fs::symlink_metadata(&from).is_ok_and(|m| m.is_file()) {
            continue;
        }
        let to = into.join(rel);
        if let Some(parent) = to.parent() {
            if make_private_dir(parent).is_err() {
                continue;
            }
        }
        // A new file, never through a link: the HOME was just made, but be exact anyway.
        let made = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&to)
            .and_then(|mut f| std::io::copy(&mut std::fs::File::open(&from)?, &mut f));
        if made.is_ok() {
            copied.push(format!("~/{rel}"));
        }
    }
    copied
}

/// What a process entering a session's environment is to the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Its agent: one at a time (on another machine, an agent an earlier start left there is
    /// stopped first).
    Agent,
    /// A command run in the session (`session exec`, an Aria task): any number at once.
    Command,
}

/// `plan` as it runs in session `id`'s environment (made first if it is not: a restart after
/// a failed making, or files removed by hand).
pub fn enter(
    host: &Host,
    id: &SessionId,
    config: &SessionConfig,
    plan: LaunchPlan,
    role: Role,
) -> Result<LaunchPlan> {
    let made = if !config.env.needs_provisioning() {
        Made::nothing_in(&config.working_dir)
    } else {
        match Made::read(&host.root(id)) {
            Some(made)
                if (made.remote.is_some() || made.workdir.is_dir())
                    && made.repo.is_some() == config.env.worktree
                    && made.container.is_some() == (config.env.driver == Driver::Podman)
                    // A VM found stopped is started again by the relay, off the loop.
                    && made.remote.is_some() == config.env.driver.is_remote()
                    && made.pod.is_some() == (config.env.driver == Driver::Kubernetes) =>
            {
                if !made.cgroups.iter().all(|g| g.exists()) {
                    // A host reboot takes control groups away: made again (a few files).
                    limits::make(&host.data_dir, id, &config.env)?;
                }
                made
            }
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
        Driver::Podman => podman::enter(id, config, &made, plan),
        Driver::Ssh => {
            let place = relay::Place::Ssh(config.env.ssh().clone());
            relay::enter(host, id, &place, &made, plan, role)
        }
        Driver::Qemu => {
            let place = relay::Place::Ssh(qemu::target(&config.env, &host.root(id), &made));
            relay::enter(host, id, &place, &made, plan, role)
        }
        Driver::Kubernetes => match &made.pod {
            Some(pod) => relay::enter(host, id, &relay::Place::Pod(pod.clone()), &made, plan, role),
            None => Err(Error::Failed(
                "the environment was not made (no pod recorded)".into(),
            )),
        },
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

/// Variables of the daemon's environment a sandboxed process keeps (besides its session's own
/// and those of its agent, [`agent_variables`]): what a program needs to run, never a
/// credential of the user's (`AWS_*`, `GITHUB_TOKEN`, `SSH_AUTH_SOCK`, a D-Bus address, …).
const KEPT_VARIABLES: &[&str] = &[
    "PATH",
    "LANG",
    "LANGUAGE",
    "TERM",
    "COLORTERM",
    "NO_COLOR",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
];

/// paddock's own variables that are the daemon's business, never an agent's: where its socket
/// and data are, the key that seals stored credentials, who may connect.
const DAEMON_ONLY: &[&str] = &[
    "PADDOCK_SOCKET",
    "PADDOCK_DATA_DIR",
    "PADDOCK_SECRET_KEYS",
    "PADDOCK_CONFIG",
    "PADDOCK_ALLOW_USERS",
    "PADDOCK_ALLOW_GROUPS",
];

/// Prefixes of the variables an agent itself reads (its keys, endpoints and settings), and
/// paddock's own (its containment tag and owner mark among them).
fn agent_variables(provider: Provider) -> &'static [&'static str] {
    match provider {
        Provider::ClaudeCode => &["ANTHROPIC_", "CLAUDE_", "PADDOCK_", "LC_"],
        Provider::Codex | Provider::OpenAiApi => &["OPENAI_", "CODEX_", "PADDOCK_", "LC_"],
        Provider::Gemini => &["GEMINI_", "GOOGLE_", "PADDOCK_", "LC_"],
        Provider::Acp | Provider::OpenClaw | Provider::Scripted => &["PADDOCK_", "LC_"],
    }
}

fn bubblewrap(
    host: &Host,
    id: &SessionId,
    config: &SessionConfig,
    made: &Made,
    plan: LaunchPlan,
) -> Result<LaunchPlan> {
    let bwrap = bwrap()?;
    let root = host.root(id);
    let s = |p: &Path| p.to_string_lossy().to_string();
    let mut args = namespace_args(config.env.network);
    // Mounts stack in order, a later one over an earlier one. First the view: the host
    // read-only, /run (the host's sockets: D-Bus, docker, the user's services) empty, the
    // session's own /tmp and HOME.
    args.extend(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"].map(String::from));
    args.extend(["--tmpfs", "/run"].map(String::from));
    if config.env.network && Path::new("/run/systemd/resolve").is_dir() {
        // Name resolution through systemd-resolved's stub (what /etc/resolv.conf may name).
        args.extend(
            ["--ro-bind", "/run/systemd/resolve", "/run/systemd/resolve"].map(String::from),
        );
    }
    args.extend(["--bind".into(), s(&root.join("tmp")), "/tmp".into()]);
    args.extend(["--bind".into(), s(&root.join("home")), s(&host.home)]);
    // Then what is hidden: paddock's data and the user's runtime directory.
    for h in host.hidden.iter().filter(|h| h.exists()) {
        args.extend(["--tmpfs".into(), s(h)]);
    }
    // Then what is shown over it: the workspace (a worktree lives in the hidden data dir),
    // the programs to run (read-only), a worktree's repository.
    let ws = workspace(host, id, config);
    args.extend(["--bind".into(), s(&ws), s(&ws)]);
    for (real, at) in program_binds(&plan.program, &host.exe, &host.home) {
        args.extend(["--ro-bind".into(), s(&real), s(&at)]);
    }
    let mut covered: Vec<PathBuf> = Vec::new();
    if let Some(r) = &made.repo {
        // A commit writes objects, its own branch (refs/heads/paddock/…) and the worktree's
        // administrative files; the repository's config, hooks, HEAD and every other ref stay
        // read-only (a hook written from inside would run on the host; another branch moved
        // would be built by the user). What points the worktree at its repository (its `.git`
        // file, the admin dir's `gitdir` and `commondir`) is read-only too: host git must
        // never be sent elsewhere by the agent.
        args.extend(["--ro-bind".into(), s(&r.common), s(&r.common)]);
        for dir in [
            r.common.join("objects"),
            r.common.join("refs/heads/paddock"),
            r.common.join("logs/refs/heads/paddock"),
            r.admin.clone(),
        ] {
            make_private_dir(&dir)?;
            args.extend(["--bind".into(), s(&dir), s(&dir)]);
        }
        covered.extend([
            ws.join(".git"),
            r.admin.join("gitdir"),
            r.admin.join("commondir"),
        ]);
    } else {
        // The workspace's own repository: its hooks and config would run on the host.
        covered.push(ws.join(".git"));
    }
    // Last, what must stay covered even inside what was shown.
    for c in covered.iter().filter(|c| c.exists()) {
        args.extend(["--ro-bind".into(), s(c), s(c)]);
    }
    for h in host
        .hidden
        .iter()
        .filter(|h| h.starts_with(&ws) && h.exists())
    {
        args.extend(["--tmpfs".into(), s(h)]);
    }
    for m in host.masked.iter().filter(|m| m.exists()) {
        args.extend(["--ro-bind".into(), "/dev/null".into(), s(m)]);
    }
    // The daemon's variables, but for what a program needs and the agent's own.
    let keep = agent_variables(config.provider);
    let session_vars: Vec<&str> = plan.env.iter().map(|(k, _)| k.as_str()).collect();
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().to_string();
        let kept = (KEPT_VARIABLES.contains(&k.as_str())
            || keep.iter().any(|p| k.starts_with(p))
            || session_vars.contains(&k.as_str()))
            && !DAEMON_ONLY.contains(&k.as_str());
        if !kept {
            args.extend(["--unsetenv".into(), k]);
        }
    }
    args.extend(["--chdir".into(), s(&made.workdir)]);
    args.extend(["--setenv".into(), "HOME".into(), s(&host.home)]);
    args.extend(["--setenv".into(), "TMPDIR".into(), "/tmp".into()]);
    args.push("--".into());
    args.push(s(&plan.program));
    args.extend(plan.args);
    // Under the session's limits: paddock joins its control groups, then becomes bwrap.
    let (program, args) = if made.cgroups.is_empty() {
        (bwrap, args)
    } else {
        let mut join = vec!["__join-cgroups".to_string()];
        join.extend(made.cgroups.iter().map(|g| s(g)));
        join.push("--".into());
        join.push(s(&bwrap));
        join.extend(args);
        (host.exe.clone(), join)
    };
    Ok(LaunchPlan {
        program,
        args,
        env: plan.env,
        // bwrap itself starts where the workspace is: a directory it can always see.
        cwd: ws,
    })
}

/// bubblewrap's namespaces (the same for the host check and every sandbox).
fn namespace_args(network: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    .map(String::from)
    .to_vec();
    if !network {
        args.push("--unshare-net".into());
    }
    args
}

/// What must be shown read-only for `program` (and paddock's own binary, which the scripted
/// agent and the bridges run) to be found where it is: each as the file itself, and a
/// program under HOME (~/.local/bin/claude, an npm install) with its package (the nearest
/// directory above it with a `package.json`, up to HOME's own children), never more of HOME.
/// Pairs of (real path, path inside).
fn program_binds(program: &Path, exe: &Path, home: &Path) -> Vec<(PathBuf, PathBuf)> {
    let home = home.canonicalize().unwrap_or_else(|_| home.to_path_buf());
    let mut binds = Vec::new();
    for p in [program, exe] {
        let Ok(real) = p.canonicalize() else { continue };
        binds.push((real.clone(), p.to_path_buf()));
        if real != p {
            binds.push((real.clone(), real.clone()));
        }
        if real.starts_with(&home) {
            let package = real
                .ancestors()
                .skip(1)
                .take_while(|d| d.starts_with(&home) && *d != home)
                .find(|d| d.join("package.json").is_file());
            if let Some(dir) = package {
                binds.push((dir.to_path_buf(), dir.to_path_buf()));
            }
        }
    }
    binds
}

/// Removes what session `id`'s environment made: its worktree (the branch stays: it is the
/// agent's work), the base ref, the sandbox's HOME and /tmp. In two steps, so that the caller
/// (the event loop, right after the delete committed) waits only for the quick one: the
/// environment's directory is renamed out of the way and git is told its worktree is gone
/// (`git worktree prune`: its branch can be deleted at once); the files are removed by the
/// returned closure, to run on a blocking thread. What a crash leaves is removed by
/// [`reconcile`] at the next start. Failures are logged: the row is already gone.
pub fn destroy(host: &Host, id: &SessionId, spec: Option<&EnvSpec>) -> impl FnOnce() + Send {
    let root = host.root(id);
    let trash = root.with_file_name(format!("{TRASH}{}", id.0));
    let made = Made::read(&root);
    let repo = made.as_ref().and_then(|m| m.repo.clone());
    let cgroups = made.as_ref().map(|m| m.cgroups.clone()).unwrap_or_default();
    let container = made.as_ref().is_some_and(|m| m.container.is_some());
    // Found before the move (it names the directory); stopped off the loop.
    let vm = made
        .as_ref()
        .and_then(|m| m.vm_port)
        .and_then(|_| qemu::vm_pid(&root));
    // A kubernetes session's pod: deleted with it (everything in it goes); found by its spec
    // when the delete came before its making recorded it.
    let pod = made.as_ref().and_then(|m| m.pod.clone()).or_else(|| {
        spec.filter(|s| s.driver == Driver::Kubernetes)
            .map(|s| kube::expected(s, id))
    });
    // An ssh host's runs of the session: an agent may have outlived its relay there.
    let host_runs = match (spec, made.and_then(|m| m.remote)) {
        (Some(spec), Some(remote)) if spec.driver == Driver::Ssh => {
            Some((spec.ssh().clone(), remote))
        }
        _ => None,
    };
    let moved = root.exists() && std::fs::rename(&root, &trash).is_ok();
    if !moved && root.exists() {
        tracing::warn!(session = %id, dir = %root.display(), "cannot move the environment away");
    }
    if let Some(r) = &repo {
        forget_worktree(r, id);
    }
    let id = id.clone();
    move || {
        if container {
            podman::remove(&id);
        }
        if let Some(pid) = vm {
            qemu::kill(pid);
        }
        if let Some(pod) = &pod {
            kube::remove(pod, &id);
        }
        if let Some((target, remote)) = &host_runs {
            ssh::stop_session_runs(target, remote, &id);
        }
        limits::remove(&cgroups);
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

/// Tells the repository a session's worktree is gone (its directory was moved or removed):
/// its entry is pruned, so its branch is free again, and its base ref removed.
fn forget_worktree(r: &Repo, id: &SessionId) {
    let Some(git) = paddock_sys::paths::find_on_own_path("git") else {
        return;
    };
    if let Err(e) = git_out(&git, &r.top, &["worktree", "prune"]) {
        tracing::warn!(session = %id, "git worktree prune failed: {e}");
    }
    let _ = git_out(&git, &r.top, &["update-ref", "-d", &base_ref(id)]);
}

/// The prefix of an environment being removed (see [`destroy`]).
const TRASH: &str = ".removing-";

/// Daemon start-up: removes the environments of sessions the store no longer has (a crash
/// between a delete's commit and its [`destroy`], or during its removal), and their
/// worktrees' entries and base refs in their repositories.
pub fn reconcile(
    host: &Host,
    exists: impl Fn(&SessionId) -> bool,
    should_run: impl Fn(&SessionId) -> bool,
) -> usize {
    let Ok(entries) = std::fs::read_dir(host.data_dir.join("environments")) else {
        return 0;
    };
    let entries: Vec<_> = entries.flatten().collect();
    // Containers: only where some environment was ever made (no podman run at every start).
    let mut removed = if entries.is_empty() {
        0
    } else {
        podman::reconcile(host, &exists, &should_run)
    };
    // The namespaces of the sessions' pods, searched for pods of this paddock's whose session
    // is gone once the environments of gone sessions are removed below. Each `made` file is
    // read once, and a live session's only when it has a pod.
    let mut places: Vec<kube::PodRef> = Vec::new();
    for e in entries {
        let id = SessionId(e.file_name().to_string_lossy().to_string());
        if exists(&id) {
            if e.path().join(kube::POD_FILE).exists() {
                places.extend(Made::read(&e.path()).and_then(|m| m.pod));
            }
            continue;
        }
        let made = Made::read(&e.path());
        places.extend(made.as_ref().and_then(|m| m.pod.clone()));
        if let Some(m) = &made {
            limits::remove(&m.cgroups);
            if let Some(pid) = qemu::vm_pid(&e.path()) {
                qemu::kill(pid);
            }
            // Its pod, if any, goes with the sweep below.
        }
        let repo = made.and_then(|m| m.repo);
        if std::fs::remove_dir_all(e.path()).is_ok() {
            tracing::info!(session = %id, "removed the environment of a session that is gone");
            removed += 1;
            if let Some(r) = repo {
                let id = id.0.strip_prefix(TRASH).unwrap_or(&id.0);
                forget_worktree(&r, &SessionId(id.to_string()));
            }
        }
    }
    // Off the start-up path: a cluster may be slow to answer.
    if !places.is_empty() {
        match kube::owner(&host.data_dir) {
            Ok(owner) => {
                let environments = host.data_dir.join("environments");
                std::thread::spawn(move || kube::sweep(&places, &environments, &owner));
            }
            Err(e) => tracing::warn!("cannot look for paddock's pods: {e}"),
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
