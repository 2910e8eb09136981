//! A session's workspace from the command line: `session diff` (what the agent changed in its
//! worktree), `session exec` (a command in the session's environment) and the branch
//! `session delete --delete-branch` removes.
//!
//! `diff` and the branch deletion run git here, on the same machine as the daemon (the socket
//! is a local one): the worktree is `<the daemon's data dir>/environments/<id>/worktree`, as
//! [`crate::env`] makes it.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use paddock_proto::obey::local::v1 as pb;

use super::client::Client;
use super::{Error, Result};

/// Where the daemon keeps session `id`'s environment.
async fn environment_dir(c: &mut Client, id: &str) -> Result<PathBuf> {
    let state = c.get_state(pb::StateRequest {}).await?.into_inner();
    Ok(Path::new(&state.data_dir).join("environments").join(id))
}

/// `session logs --environment`: the driver's own log of the session's environment.
pub async fn environment_log(c: &mut Client, id: &str) -> Result<()> {
    let file = environment_dir(c, id).await?.join("environment.log");
    match std::fs::read_to_string(&file) {
        Ok(text) => print!("{text}"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("session {id}'s driver made nothing (no environment log)")
        }
        Err(e) => return Err(Error::io(file.display())(e)),
    }
    Ok(())
}

/// The session's worktree, or why it has none.
async fn worktree_of(c: &mut Client, info: &pb::SessionInfo) -> Result<PathBuf> {
    if !info.environment_spec.as_ref().is_some_and(|e| e.worktree) {
        return Err(Error::Usage(format!(
            "session {} has no worktree of its own (create one with --worktree)",
            info.id
        )));
    }
    let state = c.get_state(pb::StateRequest {}).await?.into_inner();
    let path = Path::new(&state.data_dir)
        .join("environments")
        .join(&info.id)
        .join("worktree");
    if !path.join(".git").exists() {
        return Err(Error::Usage(format!(
            "session {}'s worktree {} is not there (its environment is {})",
            info.id,
            path.display(),
            if info.environment_state.is_empty() {
                "unknown"
            } else {
                &info.environment_state
            }
        )));
    }
    Ok(path)
}

fn git(dir: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new("git");
    cmd.arg("-C").arg(dir).stdin(Stdio::null());
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
/// started from. The worktree's own index is left as the agent left it (a scratch index is
/// used).
pub async fn diff(c: &mut Client, info: &pb::SessionInfo, stat: bool) -> Result<()> {
    let wt = worktree_of(c, info).await?;
    let id = paddock_core::SessionId(info.id.clone());
    let base = git_text(
        git(&wt).args(["rev-parse", "--verify", &crate::env::base_ref(&id)]),
        "rev-parse (the worktree's base)",
    )?;
    let index = git_text(
        git(&wt).args(["rev-parse", "--path-format=absolute", "--git-path", "index"]),
        "rev-parse (the worktree's index)",
    )?;
    let scratch = std::env::temp_dir().join(format!(
        "paddock-diff-{}-{}.index",
        info.id,
        std::process::id()
    ));
    // The agent's staged state as the start: `add -A` then adds the rest.
    if Path::new(&index).exists() {
        std::fs::copy(&index, &scratch).map_err(Error::io(scratch.display()))?;
    }
    let result = (|| {
        git_text(
            git(&wt).env("GIT_INDEX_FILE", &scratch).args(["add", "-A"]),
            "add (into a scratch index)",
        )?;
        let mut cmd = git(&wt);
        cmd.env("GIT_INDEX_FILE", &scratch)
            .args(["diff", "--cached"])
            .arg(if stat { "--stat" } else { "--patch" })
            .arg(&base)
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit());
        let status = cmd.status().map_err(Error::io("git diff"))?;
        if status.success() {
            Ok(())
        } else {
            Err(Error::Usage(format!("git diff failed ({status})")))
        }
    })();
    let _ = std::fs::remove_file(&scratch);
    result
}

/// `session delete --delete-branch`: the session's branch, once its worktree is gone.
pub fn delete_branch(info: &pb::SessionInfo) -> Result<String> {
    let branch = crate::env::branch(&info.agent_name, &paddock_core::SessionId(info.id.clone()));
    git_text(
        git(Path::new(&info.working_dir)).args(["branch", "-D", &branch]),
        &format!("branch -D {branch}"),
    )?;
    Ok(branch)
}
