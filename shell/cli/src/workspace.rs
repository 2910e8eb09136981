//! A session's workspace from the command line: `session diff` (what the agent changed in its
//! worktree), where that worktree is (`session info`), `session exec` (a command in the
//! session's environment) and the branch `session delete --delete-branch` removes.
//!
//! `diff` and the branch deletion run git here, on the same machine as the daemon (the socket
//! is a local one): the worktree is `<the daemon's data dir>/environments/<id>/worktree`, as
//! [`crate::env`] makes it.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use paddock_proto::obey::local::v1 as pb;

use super::client::Client;
use super::{Error, Result};
use crate::env::Repo;

/// Where the daemon keeps session `id`'s environment.
async fn environment_dir(c: &mut Client, id: &str) -> Result<PathBuf> {
    let state = c.get_state(pb::StateRequest {}).await?.into_inner();
    Ok(Path::new(&state.data_dir).join("environments").join(id))
}

/// `session logs --environment`: the driver's own log of the session's environment, for a
/// container what podman says of it (its state and `podman logs`), for a VM its console.
pub async fn environment_log(c: &mut Client, id: &str) -> Result<()> {
    let root = environment_dir(c, id).await?;
    let file = root.join("environment.log");
    match std::fs::read_to_string(&file) {
        Ok(text) => out!("{text}")?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("session {id}'s driver made nothing (no environment log)")
        }
        Err(e) => return Err(Error::io(file.display())(e)),
    }
    if root.join("console.log").exists() {
        outln!("VM console (its last 40 lines):")?;
        for line in crate::env::qemu::console_tail(&root, 40).lines() {
            outln!("  {line}")?;
        }
    }
    if let Some(pod) = crate::env::Made::read(&root).and_then(|m| m.pod) {
        match crate::env::kube::describe(&pod, 40) {
            Ok((state, logs)) => {
                outln!("{}: {state}", pod.destination())?;
                outln!("its log (the last 40 lines):")?;
                for line in logs.lines() {
                    outln!("  {line}")?;
                }
            }
            Err(e) => eprintln!("{}: {e}", pod.destination()),
        }
    }
    if let Some(name) = crate::env::Made::read(&root).and_then(|m| m.container) {
        match crate::env::podman::describe(&name) {
            Ok((state, logs)) => {
                outln!("container {name}: {state}")?;
                outln!("podman logs {name}:")?;
                if logs.is_empty() {
                    outln!("  (nothing: its init writes nothing; the agent's output is the session's activity)")?;
                }
                for line in logs.lines() {
                    outln!("  {line}")?;
                }
            }
            Err(e) => eprintln!("container {name}: {e}"),
        }
    }
    Ok(())
}

/// Where the session's worktree is, when it has one that is there (`session info` shows it).
pub async fn worktree_path(c: &mut Client, info: &pb::SessionInfo) -> Option<PathBuf> {
    worktree_of(c, info).await.ok().map(|(path, _)| path)
}

/// The session's worktree and its repository as paddock recorded them when it made them, or
/// why it has none.
async fn worktree_of(c: &mut Client, info: &pb::SessionInfo) -> Result<(PathBuf, Repo)> {
    if !info.environment_spec.as_ref().is_some_and(|e| e.worktree) {
        return Err(Error::Usage(format!(
            "session {} has no worktree of its own (create one with --worktree)",
            info.id
        )));
    }
    let root = environment_dir(c, &info.id).await?;
    let path = root.join("worktree");
    match crate::env::Made::read(&root).and_then(|m| m.repo) {
        Some(repo) if path.is_dir() => Ok((path, repo)),
        _ => Err(Error::Usage(format!(
            "session {}'s worktree {} is not there (its environment is {})",
            info.id,
            path.display(),
            if info.environment_state.is_empty() {
                "unknown"
            } else {
                &info.environment_state
            }
        ))),
    }
}

/// Git for the worktree at `wt` of `repo`, as paddock knows them: the repository and the
/// worktree's administrative directory are named outright (never found through the
/// worktree's `.git` file, which the agent can rewrite), and nothing of the agent's can make
/// host git run a program (hooks, fsmonitor, pager, external diff and textconv are off).
fn git_in(wt: &Path, repo: &Repo) -> std::process::Command {
    let mut cmd = std::process::Command::new("git");
    cmd.env("GIT_DIR", &repo.admin)
        .env("GIT_COMMON_DIR", &repo.common)
        .env("GIT_WORK_TREE", wt)
        .env_remove("GIT_INDEX_FILE")
        .current_dir(wt)
        .args([
            "--no-pager",
            "-c",
            "core.fsmonitor=",
            "-c",
            "core.hooksPath=/dev/null",
        ])
        .stdin(Stdio::null());
    cmd
}

fn git_text(cmd: &mut std::process::Command, what: &str) -> Result<String> {
    let out = cmd.output().map_err(Error::io(format!("git ({what})")))?;
    if !out.status.success() {
        return Err(Error::Usage(format!(
            "git {what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `session diff`: everything the agent changed since its worktree was made — its commits,
/// its uncommitted edits and the files it added — as one diff against the commit the worktree
/// started from (recorded by paddock, out of the agent's reach). The worktree's own index is
/// left as the agent left it: a scratch index, in a private temporary directory, is used.
pub async fn diff(c: &mut Client, info: &pb::SessionInfo, stat: bool) -> Result<()> {
    let (wt, repo) = worktree_of(c, info).await?;
    let scratch = tempfile::Builder::new()
        .prefix("paddock-diff-")
        .tempdir()
        .map_err(Error::io("a temporary directory"))?;
    let index = scratch.path().join("index");
    // The agent's staged state as the start (read, never followed: a plain copy of a regular
    // file); `add -A` then adds the rest.
    let own = repo.admin.join("index");
    if std::fs::symlink_metadata(&own).is_ok_and(|m| m.is_file()) {
        std::fs::copy(&own, &index).map_err(Error::io(own.display()))?;
    }
    git_text(
        git_in(&wt, &repo)
            .env("GIT_INDEX_FILE", &index)
            .args(["add", "-A"]),
        "add (into a scratch index)",
    )?;
    let status = git_in(&wt, &repo)
        .env("GIT_INDEX_FILE", &index)
        .args(["diff", "--cached", "--no-ext-diff", "--no-textconv"])
        .arg(if stat { "--stat" } else { "--patch" })
        .arg(&repo.base)
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(Error::io("git diff"))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::Usage(format!("git diff failed ({status})")))
    }
}

/// `session delete --delete-branch`: the session's branch, once its worktree is gone.
pub fn delete_branch(info: &pb::SessionInfo) -> Result<String> {
    let branch = crate::env::branch(&info.agent_name, &paddock_core::SessionId(info.id.clone()));
    crate::env::git_out(
        Path::new("git"),
        Path::new(&info.working_dir),
        &["branch", "-D", &branch],
    )
    .map_err(|e| Error::Usage(format!("git branch -D {branch} failed: {e}")))?;
    Ok(branch)
}
