//! The conversation, kept on disk so that a new bridge process (`--resume ID`, after a session
//! or daemon restart) goes on with it.
//!
//! Where: `<state dir>/<id>.json`, the state dir being `provider_config["state_dir"]`, else
//! `$XDG_STATE_HOME/paddock/openai-api`, else `$HOME/.local/state/paddock/openai-api` (the
//! daemon's HOME: the bridge inherits it), else `<working dir>/.paddock/openai-api`. Not in the
//! campaign root by default, for two reasons: the agent's own file tools are confined to the
//! root, so they can neither read nor rewrite the conversation they are part of; and the
//! campaign's tree stays the user's. This is what Claude Code does with `~/.claude`.
//!
//! What: `{"version": 1, "id": …, "messages": [...]}`, the chat messages without the system
//! prompt (that comes from the configuration of the run that sends them). Written whole to a
//! temporary file and renamed, so a bridge killed mid-write leaves the previous version.
//! Bounded: [`trim`] drops the oldest whole exchanges until the messages fit
//! `max_conversation_bytes` (the exchange in progress is always kept whole). Private to its
//! owner: the directory is created 0700, the files 0600.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::bridge::Error;

/// The conversation file's format version.
const VERSION: u64 = 1;

/// Where conversations are kept, from the configuration and the environment.
pub fn state_dir(configured: Option<&str>, cwd: &Path) -> PathBuf {
    state_dir_in(configured, cwd, |k| std::env::var_os(k))
}

/// [`state_dir`] for an environment given as a lookup (the daemon computes a session's from
/// the session's environment over its own, as the bridge inherits them).
pub fn state_dir_in(
    configured: Option<&str>,
    cwd: &Path,
    lookup: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> PathBuf {
    if let Some(d) = configured {
        return PathBuf::from(d);
    }
    let env = |k: &str| lookup(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(x) = env("XDG_STATE_HOME") {
        return x.join("paddock/openai-api");
    }
    if let Some(h) = env("HOME") {
        return h.join(".local/state/paddock/openai-api");
    }
    cwd.join(".paddock/openai-api")
}

/// A conversation id names a file: only ULID-like ids are accepted (no `/`, no `..`).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

pub fn path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.json"))
}

/// Loads conversation `id`: its messages.
pub fn load(dir: &Path, id: &str) -> Result<Vec<Value>, Error> {
    if !valid_id(id) {
        return Err(Error::ConversationId(id.to_string()));
    }
    let p = path(dir, id);
    let text = fs::read_to_string(&p).map_err(|source| Error::NoConversation {
        id: id.to_string(),
        path: p.clone(),
        source,
    })?;
    let v: Value = serde_json::from_str(&text).map_err(|source| Error::ConversationNotJson {
        path: p.clone(),
        source,
    })?;
    match v["messages"].as_array() {
        Some(m) if v["version"] == VERSION => Ok(m.clone()),
        _ => Err(Error::ConversationVersion {
            path: p,
            version: VERSION,
        }),
    }
}

/// Saves conversation `id` (atomically).
pub fn save(dir: &Path, id: &str, messages: &[Value]) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let p = path(dir, id);
    // A temp name of this process's own: a restarted bridge overlapping its predecessor
    // never writes into the other's file. Conversations hold file contents and tool output:
    // private to their owner (0700 / 0600).
    let tmp = dir.join(format!(".{id}.{}.json.tmp", std::process::id()));
    let body = json!({"version": VERSION, "id": id, "messages": messages}).to_string();
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .and_then(|_| {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(body.as_bytes())
        })
        .and_then(|_| fs::rename(&tmp, &p))
        .map_err(|source| Error::SaveConversation { path: p, source })
}

/// Drops the oldest exchanges (each from a `user` message up to the next) until the messages'
/// JSON fits `max_bytes`; the last exchange is always kept, whatever its size (so a long turn
/// may go over: its tool results are each bounded by `max_tool_output_bytes`). Cutting at a
/// `user` message keeps the rest valid for the API: a `tool` message never loses the assistant
/// message that asked for it.
pub fn trim(messages: &mut Vec<Value>, max_bytes: usize) {
    let sizes: Vec<usize> = messages.iter().map(|m| m.to_string().len() + 1).collect();
    let mut total: usize = sizes.iter().sum();
    let mut cut = 0;
    while total > max_bytes {
        let next_user = (cut + 1..messages.len()).find(|&i| messages[i]["role"] == "user");
        let Some(next) = next_user else { break };
        total -= sizes[cut..next].iter().sum::<usize>();
        cut = next;
    }
    messages.drain(..cut);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(t: &str) -> Value {
        json!({"role": "user", "content": t})
    }

    #[test]
    fn save_load_and_ids() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let m = vec![user("hi"), json!({"role": "assistant", "content": "hello"})];
        save(&dir, "01JABC", &m).unwrap();
        assert_eq!(load(&dir, "01JABC").unwrap(), m);
        assert!(load(&dir, "01JXYZ")
            .unwrap_err()
            .to_string()
            .starts_with("no conversation 01JXYZ"));
        assert!(load(&dir, "../x").is_err());
        assert!(!valid_id("a/b") && !valid_id("") && valid_id("01J-x_9"));
        fs::write(path(&dir, "bad"), "{}").unwrap();
        assert!(load(&dir, "bad").is_err());
    }

    #[test]
    fn trimming_drops_whole_old_exchanges() {
        let big = "x".repeat(100);
        let mut m = vec![
            user(&big),
            json!({"role": "assistant", "tool_calls": [{"id": "c"}]}),
            json!({"role": "tool", "tool_call_id": "c", "content": big}),
            json!({"role": "assistant", "content": "ok"}),
            user("second"),
            json!({"role": "assistant", "content": "fine"}),
            user("third"),
        ];
        let all = m.clone();
        trim(&mut m, 10_000);
        assert_eq!(m, all);
        trim(&mut m, 150);
        assert_eq!(m, all[4..]);
        trim(&mut m, 1);
        assert_eq!(m, all[6..]);
    }
}
