//! The `ssh` driver: a session's processes run on another machine, in a `paddock runner`
//! there, reached over OpenSSH (the system `ssh` client: the user's keys, agent, ssh
//! configuration and known_hosts work as they do for them, and nothing of SSH is
//! re-implemented here).
//!
//! - Provisioning ([`provision`], when the session is created and again at a start whose
//!   `made` file is gone): one `ssh` that probes the host (its home, the working directory,
//!   whether this very paddock binary is there), one that copies the binary when it is not
//!   (to `<remote dir>/bin/paddock-<version>-<hash>`: a build of another version or content
//!   never stands in for this one) unless the session names an installed one, and one that
//!   makes sure a runner of that binary answers there (`paddock __ssh-runner`, which starts
//!   it detached, like the daemon starts its own). What it learnt goes to the `made` file.
//! - Entering, and everything after: [`super::relay`] (the relay the local runner supervises,
//!   which reaches the runner there through an ssh forward).
//!
//! Provisioning is shared with the kubernetes driver: [`prepare`] runs its probe, copy and
//! runner start through a [`RemoteShell`] (ssh here, an exec into a pod there).
//!
//! Limits, said plainly: the
//! runner there is started through a login shell (`sh -l`: the user's `~/.profile` PATH) and
//! keeps that environment for every agent it starts; nothing removes old paddock binaries or
//! runners of other builds there.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

use paddock_core::{SessionId, SshTarget};
use paddock_proto::runner::v1 as rpb;
use rpb::runner_client::RunnerClient;
use tonic::transport::Channel;

use super::{runtime, Error, Result};

/// TERM to KILL for a run stopped on the host (the remote runner escalates): the one grace.
pub(super) const STOP_GRACE_MS: u32 = {
    let ms = paddock_core::process::KILL_GRACE.millis();
    assert!(ms <= u32::MAX as u64);
    ms as u32
};
/// Where paddock keeps its binary and runners on a host unless the session says otherwise.
const REMOTE_DIR: &str = "~/.cache/paddock";

/// What provisioning learnt about the host, kept in the environment's `made` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// The paddock binary there.
    pub paddock: String,
    /// The socket its runner answers on there.
    pub socket: String,
}

/// The `ssh` client, or what to install.
pub(super) fn ssh_program() -> Result<PathBuf> {
    paddock_sys::paths::find_on_own_path("ssh").ok_or(Error::NotInstalled {
        needed_by: "the ssh driver",
        program: "the OpenSSH client `ssh`",
        install: "the `openssh-client` package",
    })
}

/// What the host lacks for an ssh session: the client (the remote machine is checked when the
/// environment is made).
pub fn check_host() -> Result<()> {
    ssh_program().map(|_| ())
}

/// ssh's options for `t`: never a prompt (batch mode: a key, an agent or nothing), the host key
/// checked (`yes`, or `accept-new` when asked: a changed key is refused either way), the port,
/// user and key asked for, and keepalives that notice a dead connection within ~15 s.
pub fn ssh_options(t: &SshTarget) -> Vec<String> {
    let mut o: Vec<String> = vec!["-o".into(), "BatchMode=yes".into()];
    let checking = if t.accept_new_host_key {
        "accept-new"
    } else {
        "yes"
    };
    o.extend(["-o".into(), format!("StrictHostKeyChecking={checking}")]);
    if !t.known_hosts.is_empty() {
        // Quoted: ssh splits an option's value at whitespace.
        o.extend([
            "-o".into(),
            format!("UserKnownHostsFile=\"{}\"", t.known_hosts),
        ]);
    }
    if !t.key_file.is_empty() {
        o.extend(["-i".into(), t.key_file.clone()]);
        o.extend(["-o".into(), "IdentitiesOnly=yes".into()]);
    }
    if t.port > 0 {
        o.extend(["-p".into(), t.port.to_string()]);
    }
    if !t.user.is_empty() {
        o.extend(["-l".into(), t.user.clone()]);
    }
    for opt in [
        "ConnectTimeout=10",
        "ServerAliveInterval=5",
        "ServerAliveCountMax=3",
        "LogLevel=ERROR",
    ] {
        o.extend(["-o".into(), opt.into()]);
    }
    o
}

/// `s` as one word of a POSIX shell command line (the remote side's shell reads what ssh sends).
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs `command` on the host (through its login shell, as ssh does), with `stdin` fed from a
/// file; its stdout, or the reason it failed (ssh's own words for a connection that could not
/// be made: "Connection refused", "Permission denied (publickey)", "Host key verification
/// failed").
pub(super) fn run(t: &SshTarget, command: &str, stdin: Option<&Path>) -> Result<String> {
    let mut cmd = std::process::Command::new(ssh_program()?);
    cmd.args(ssh_options(t))
        .arg("--")
        .arg(&t.host)
        .arg(command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match stdin {
        Some(file) => {
            let f = std::fs::File::open(file).map_err(|e| Error::file("read", file, e))?;
            cmd.stdin(f);
        }
        None => {
            cmd.stdin(Stdio::null());
        }
    }
    let out = cmd.output().map_err(|e| Error::spawn("ssh", e))?;
    let stderr = String::from_utf8_lossy(&out.stderr)
        .replace("\r\n", "\n")
        .trim()
        .to_string();
    match out.status.code() {
        Some(0) => Ok(String::from_utf8_lossy(&out.stdout).to_string()),
        Some(255) => Err(Error::Unreachable {
            destination: t.destination(),
            hint: hint(t, &stderr),
            said: if stderr.is_empty() {
                "ssh failed".to_string()
            } else {
                stderr
            },
        }),
        _ => Err(Error::Failed(format!(
            "on {}: {}",
            t.destination(),
            if stderr.is_empty() {
                format!("the command failed ({})", out.status)
            } else {
                stderr
            }
        ))),
    }
}

/// What to do about ssh's most common refusals, after its own words.
fn hint(t: &SshTarget, stderr: &str) -> String {
    let port = if t.port > 0 { t.port } else { 22 };
    if stderr.contains("Host key verification failed") {
        format!(
            " (the host's key is not in {file}: check its fingerprint, then add it — \
             `ssh-keyscan -p {port} {} >> {file}` — or set acceptNewHostKey to take a key seen \
             for the first time)",
            t.host,
            file = if t.known_hosts.is_empty() {
                "~/.ssh/known_hosts"
            } else {
                &t.known_hosts
            },
        )
    } else if stderr.contains("Permission denied") {
        " (the host takes none of the keys offered: name one with --ssh-key or keyFile, and make \
         sure its public half is in the user's authorized_keys there)"
            .to_string()
    } else if stderr.contains("Connection refused") || stderr.contains("timed out") {
        format!(" (is an sshd listening on {}:{port}?)", t.host)
    } else {
        String::new()
    }
}

/// This binary's name on a host: its version and a hash of its contents, so that another
/// build is never taken for it.
pub fn binary_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        use std::hash::Hasher;
        let mut h = std::hash::DefaultHasher::new();
        // /proc/self/exe: this very binary, even if its file was replaced since it started.
        let bytes = std::fs::read("/proc/self/exe")
            .or_else(|_| std::env::current_exe().and_then(std::fs::read))
            .unwrap_or_else(|e| panic!("cannot read this program's own binary to name it: {e}"));
        h.write(&bytes);
        format!(
            "{}-{:012x}",
            env!("CARGO_PKG_VERSION"),
            h.finish() & 0xffff_ffff_ffff
        )
    })
}

/// The probe run on the host: where things are there, and whether the binary is.
const PROBE: &str = r#"
d=$1; p=$2; w=$3; id=$4
case $d in "~") d=$HOME;; "~/"*) d=$HOME/${d#"~/"};; /*) ;; *) d=$HOME/$d;; esac
case $w in "") w=$HOME;; ".") w=$(pwd);; "~") w=$HOME;; "~/"*) w=$HOME/${w#"~/"};; /*) ;; *) w=$HOME/$w;; esac
case $p in "") p=$d/bin/paddock-$id;; "~/"*) p=$HOME/${p#"~/"};; /*) ;; *) p=$HOME/$p;; esac
echo "arch=$(uname -m)"
echo "dir=$d"
echo "paddock=$p"
echo "workdir=$w"
if [ -d "$w" ]; then echo "workdir_ok=yes"; fi
if [ -x "$p" ]; then echo "installed=yes"; fi
"#;

/// The copy: the binary's `$2` bytes arrive on stdin (counted: an exec stream may not be able
/// to close its stdin) and replace the file only once whole.
const COPY: &str = r#"
p=$1; n=$2; t="$p.part.$$"
mkdir -p "$(dirname "$p")" && head -c "$n" > "$t" && s=$(wc -c < "$t") && [ $s -eq "$n" ] &&
chmod 700 "$t" && mv -f "$t" "$p"
"#;

/// Somewhere paddock runs shell commands to make ready: an ssh host, a pod (exec streams).
pub trait RemoteShell {
    /// Runs `command` (a POSIX shell command line) there, with `stdin` fed from a file; its
    /// stdout, or why it failed, in words a user can act on.
    fn run(&self, command: &str, stdin: Option<&Path>) -> Result<String>;
    /// Where, for messages (`user@host`, `pod ns/name`).
    fn destination(&self) -> String;
    /// Whether the runner starts through a login shell (`sh -l`: an ssh command's environment
    /// is bare, a login's has the user's PATH). A container's exec already has the image's
    /// environment, which a distribution's /etc/profile would overwrite.
    fn login_shell(&self) -> bool {
        true
    }
}

impl RemoteShell for SshTarget {
    fn run(&self, command: &str, stdin: Option<&Path>) -> Result<String> {
        run(self, command, stdin)
    }

    fn destination(&self) -> String {
        SshTarget::destination(self)
    }
}

/// Makes `t` ready for a session: the working directory checked, this paddock there (copied
/// when missing), its runner answering. Returns what a start needs and the working directory
/// on the host. `log` hears what was done.
pub fn provision(exe: &Path, t: &SshTarget, log: &dyn Fn(&str)) -> Result<(Remote, PathBuf)> {
    prepare(t, exe, &t.paddock, &t.remote_dir, &t.workdir, log)
}

/// Makes the place `sh` reaches ready (see [`provision`]): `paddock` an installed one there
/// (empty: this binary, copied when missing), `remote_dir` where paddock keeps its files there
/// (empty: `~/.cache/paddock`), `workdir` the agent's working directory (empty: the home).
pub fn prepare(
    sh: &dyn RemoteShell,
    exe: &Path,
    paddock: &str,
    remote_dir: &str,
    workdir: &str,
    log: &dyn Fn(&str),
) -> Result<(Remote, PathBuf)> {
    let remote_dir = if remote_dir.is_empty() {
        REMOTE_DIR
    } else {
        remote_dir
    };
    let installed = paddock;
    let probe = format!(
        "sh -c {} paddock-probe {} {} {} {}",
        quote(PROBE),
        quote(remote_dir),
        quote(installed),
        quote(workdir),
        quote(binary_id())
    );
    let out = sh.run(&probe, None)?;
    let facts: std::collections::BTreeMap<&str, &str> =
        out.lines().filter_map(|l| l.split_once('=')).collect();
    let fact = |k: &str| facts.get(k).map(|v| v.to_string()).unwrap_or_default();
    let (dir, paddock, workdir) = (fact("dir"), fact("paddock"), fact("workdir"));
    if dir.is_empty() || paddock.is_empty() {
        return Err(Error::Failed(format!(
            "{}: the host answered the probe with {out:?} (is its login shell a POSIX one?)",
            sh.destination()
        )));
    }
    if fact("workdir_ok") != "yes" {
        return Err(Error::Refused(format!(
            "there is no directory {workdir} on {} (the session's working directory there)",
            sh.destination()
        )));
    }
    log(&format!(
        "environment on {}: working directory {workdir}",
        sh.destination()
    ));
    let arch = fact("arch");
    if installed.is_empty() && !arch.is_empty() && arch != std::env::consts::ARCH {
        return Err(Error::Refused(format!(
            "{} is {arch}, and this paddock is built for {}: it cannot run there (name a \
             paddock built for {arch} that is installed there)",
            sh.destination(),
            std::env::consts::ARCH
        )));
    }
    if fact("installed") != "yes" {
        if !installed.is_empty() {
            return Err(Error::Refused(format!(
                "there is no paddock at {paddock} on {} (the session's ssh `paddock`); leave it \
                 out and paddock copies its own",
                sh.destination()
            )));
        }
        let size = std::fs::metadata(exe)
            .map(|m| m.len())
            .map_err(|e| Error::file("read", exe, e))?;
        sh.run(
            &format!(
                "sh -c {} paddock-copy {} {size}",
                quote(COPY),
                quote(&paddock)
            ),
            Some(exe),
        )?;
        log(&format!(
            "copied paddock {} ({:.1} MiB) to {paddock}",
            binary_id(),
            size as f64 / (1024.0 * 1024.0)
        ));
    }
    let runner_dir = format!("{dir}/runner-{}", binary_id());
    // Through a login shell: the runner (and every agent it starts) gets the user's own PATH
    // (~/.profile's: ~/.local/bin, a node version manager's), not a bare ssh command's. What
    // the profile prints is skipped: the path is the last line.
    let out = sh
        .run(
            &format!(
                "sh {} {} {} {}",
                if sh.login_shell() { "-lc" } else { "-c" },
                quote(r#"exec "$0" __ssh-runner "$1""#),
                quote(&paddock),
                quote(&runner_dir)
            ),
            None,
        )
        .map_err(|e| match e {
            // A binary that does not run there: another C library (musl), an older glibc (the
            // words of the shell and the dynamic loader there).
            Error::Failed(said)
                if said.contains("not found")
                    || said.contains("GLIBC")
                    || said.contains("Exec format") =>
            {
                Error::Refused(format!(
                    "{said} (paddock's binary does not run on {}: it needs a glibc at least as \
                     new as this machine's; or name a paddock installed there)",
                    sh.destination()
                ))
            }
            e => e,
        })?;
    let socket = out
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or_default()
        .to_string();
    if !socket.starts_with('/') {
        return Err(Error::Failed(format!(
            "the runner on {} did not say where it answers (it said {socket:?})",
            sh.destination()
        )));
    }
    log(&format!("runner on {} at {socket}", sh.destination()));
    Ok((Remote { paddock, socket }, PathBuf::from(workdir)))
}

/// The remote side of provisioning (`paddock __ssh-runner DIR`, run over ssh): makes sure a
/// runner of this binary answers on `DIR/runner.sock`, starting one detached if none does (it
/// outlives the ssh connection that started it), and prints the socket's path.
pub fn ensure_runner(dir: &Path) -> Result<PathBuf> {
    super::make_private_dir(dir)?;
    let exe = std::env::current_exe().map_err(|e| Error::file("find", "this binary", e))?;
    let rt = runtime()?;
    let socket = runner_socket(dir);
    rt.block_on(async {
        match paddock_runner::client::connect(&socket).await {
            Some(_) => Ok(()),
            None => paddock_runner::client::start(
                dir,
                &exe,
                &socket,
                &paddock_runner::Limits::default(),
            )
            .await
            .map(|_| ()),
        }
    })?;
    Ok(socket)
}

/// The socket of the runner whose directory is `dir`: `DIR/runner.sock`, or, when that path is
/// too long for a Unix socket (a deep home there), `runner.sock` in a directory of its own
/// named after `dir`, in a private directory of the user's under the temporary directory. Its
/// own: a runner takes its socket's directory as its data dir, whose orphans it ends when it
/// starts.
fn runner_socket(dir: &Path) -> PathBuf {
    let socket = dir.join("runner.sock");
    if socket.as_os_str().len() <= SOCKET_PATH_MAX {
        return socket;
    }
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    dir.hash(&mut h);
    let own = socket_path(dir, &format!("r-{:016x}", h.finish()));
    let _ = super::make_private_dir(&own);
    own.join("runner.sock")
}

/// The remote side of a delete (`paddock __ssh-runner DIR --stop PREFIX`, run over ssh): stops
/// every live run whose id starts with `PREFIX` (the session's), if a runner answers there.
/// Prints how many it stopped.
pub fn stop_runs(dir: &Path, prefix: &str) -> Result<usize> {
    runtime()?.block_on(async {
        let Some(mut client) = paddock_runner::client::connect(&runner_socket(dir)).await else {
            return Ok(0);
        };
        Ok(stop_leftovers(&mut client, prefix).await)
    })
}

/// A deleted session's runs on its host, stopped (best effort, off the event loop: a host
/// that does not answer is logged, never waited for beyond ssh's own timeouts). Its agent
/// may have outlived its relay there (a forced stop while the connection was down).
pub fn stop_session_runs(t: &SshTarget, remote: &Remote, id: &SessionId) {
    let Some(dir) = Path::new(&remote.socket).parent() else {
        return;
    };
    let prefix = format!("ssh:{}:", id.0);
    let command = format!(
        "{} __ssh-runner {} --stop {}",
        quote(&remote.paddock),
        quote(&dir.display().to_string()),
        quote(&prefix)
    );
    match run(t, &command, None) {
        Ok(n) => {
            tracing::info!(session = %id, host = %t.destination(), "stopped {} run(s) there", n.trim())
        }
        Err(e) => tracing::warn!(session = %id, "cannot stop the session's runs on its host: {e}"),
    }
}

/// The prefix of the run ids of the session whose environment directory is `dir`, for its
/// agent or its commands: the agent runs there that a relay of the session left (killed
/// before its agent ended) are found by it.
pub(super) fn run_prefix(dir: &Path, agent: bool) -> String {
    let session = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    format!("ssh:{session}:{}:", if agent { "agent" } else { "command" })
}

/// Stops the live runs with `prefix` (a previous relay's agent of this session, which nothing
/// else would ever stop: one agent of a session at a time; or a deleted session's). How many.
pub(super) async fn stop_leftovers(client: &mut RunnerClient<Channel>, prefix: &str) -> usize {
    let Ok(runs) = client.list_runs(rpb::ListRunsRequest {}).await else {
        return 0;
    };
    let mut stopped = 0;
    for r in runs.into_inner().runs {
        if r.run_id.starts_with(prefix) && r.state == rpb::RunState::Started as i32 {
            eprintln!("paddock: stopping {} there, left behind", r.run_id);
            let sent = client
                .stop_run(rpb::StopRunRequest {
                    run_id: r.run_id,
                    grace_ms: STOP_GRACE_MS,
                })
                .await;
            stopped += usize::from(sent.is_ok());
        }
    }
    stopped
}

/// Longest socket path used: a Unix socket's path holds at most 107 bytes.
pub(super) const SOCKET_PATH_MAX: usize = 100;

/// Where the forwarded socket `name` goes: the session's environment directory, or, when that
/// path is too long for a socket (a long home), a private directory of the user's under the
/// temporary directory — refused if someone else owns it or may write it.
pub(super) fn socket_path(dir: &Path, name: &str) -> PathBuf {
    let local = dir.join(name);
    if local.as_os_str().len() <= SOCKET_PATH_MAX {
        return local;
    }
    use std::os::unix::fs::MetadataExt;
    let uid = nix::unistd::getuid().as_raw();
    let short = std::env::temp_dir().join(format!("paddock-{uid}"));
    let _ = super::make_private_dir(&short);
    match std::fs::symlink_metadata(&short) {
        Ok(m) if m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0 => short.join(name),
        _ => {
            eprintln!(
                "paddock: {} is not a private directory of yours; the socket stays at {} (too \
                 long a path for some systems)",
                short.display(),
                local.display()
            );
            local
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_check_the_host_key_and_never_prompt() {
        let t = SshTarget {
            host: "build".into(),
            port: 2222,
            user: "ci".into(),
            key_file: "/k".into(),
            known_hosts: "/kh".into(),
            ..SshTarget::default()
        };
        let o = ssh_options(&t).join(" ");
        for want in [
            "BatchMode=yes",
            "StrictHostKeyChecking=yes",
            "UserKnownHostsFile=\"/kh\"",
            "-i /k",
            "IdentitiesOnly=yes",
            "-p 2222",
            "-l ci",
            "ServerAliveInterval=5",
        ] {
            assert!(o.contains(want), "{want} missing in {o}");
        }
        let new = SshTarget {
            accept_new_host_key: true,
            ..t
        };
        assert!(ssh_options(&new)
            .join(" ")
            .contains("StrictHostKeyChecking=accept-new"));
    }

    #[test]
    fn quoting_survives_the_remote_shell() {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s {}", quote("it's a $HOME `x`")))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "it's a $HOME `x`");
    }

    #[test]
    fn a_socket_path_too_long_for_a_socket_goes_to_a_private_temporary_directory() {
        let short = Path::new("/x/environments/sess_1");
        assert_eq!(socket_path(short, "ssh-a.sock"), short.join("ssh-a.sock"));
        let long = PathBuf::from(format!("/home/{}/environments/sess_1", "u".repeat(90)));
        let p = socket_path(&long, "ssh-a.sock");
        assert!(p.as_os_str().len() <= SOCKET_PATH_MAX, "{}", p.display());
        assert!(p.ends_with("ssh-a.sock"));
        let dir = std::fs::metadata(p.parent().unwrap()).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(dir.mode() & 0o077, 0);
    }

    #[test]
    fn a_runner_whose_socket_would_be_too_long_gets_a_short_directory_of_its_own() {
        let short = Path::new("/x/.cache/paddock/runner-1");
        assert_eq!(runner_socket(short), short.join("runner.sock"));
        let deep = |n: &str| {
            PathBuf::from(format!(
                "/home/{}/{n}/.cache/paddock/runner-1",
                "u".repeat(80)
            ))
        };
        let (a, b) = (runner_socket(&deep("a")), runner_socket(&deep("b")));
        assert!(a.as_os_str().len() <= SOCKET_PATH_MAX, "{}", a.display());
        // Each its own directory: a runner's data dir is its socket's, whose orphans it ends.
        assert_ne!(a.parent(), b.parent());
        assert_eq!(a, runner_socket(&deep("a")));
        assert!(a.parent().unwrap().is_dir());
    }

    #[test]
    fn the_binary_id_names_version_and_content() {
        let id = binary_id();
        assert!(id.starts_with(env!("CARGO_PKG_VERSION")));
        assert_eq!(id, binary_id());
        assert_eq!(id.rsplit('-').next().unwrap().len(), 12);
    }
}
