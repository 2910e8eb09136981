//! Whether an agent CLI can sign in: the one rule `session create` (which refuses a session
//! that could never work, with what to do) and `paddock doctor` (which reports it) share.
//!
//! Each check looks where the CLI itself looks, as documented by its makers, and is generous:
//! a false "no credentials" would refuse a setup that works, so anything that may sign the CLI
//! in counts (a key variable, a login file, a key helper or a key in a settings file). What it
//! finds is described for the user (`$ANTHROPIC_API_KEY is set`, `logged in (~/.claude/…)`).
//!
//! `env` is the agent's environment as it will see it (a session's variables over the
//! daemon's; the CLI's own for doctor); `cwd` its working directory (project settings).

use std::io::Read;
use std::path::{Path, PathBuf};

/// A settings file is read up to this size (they are small; a larger one is not judged).
const SETTINGS_BYTES_MAX: u64 = 1024 * 1024;

/// Variables whose value signs Claude Code in (API key, bearer token, `claude setup-token`).
pub const CLAUDE_KEYS: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
];
/// Variables that send Claude Code to a cloud provider, which signs in its own way.
const CLAUDE_CLOUDS: &[&str] = &[
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
];
/// Variables whose value signs codex in.
pub const CODEX_KEYS: &[&str] = &["OPENAI_API_KEY", "CODEX_API_KEY"];
/// Variables whose value signs the Gemini CLI in.
pub const GEMINI_KEYS: &[&str] = &[
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GOOGLE_GENAI_USE_VERTEXAI",
];

/// A lookup of the agent's environment: a set, non-empty variable's value.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The first of `keys` set in `env`, described.
fn key_in(env: Env, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find(|k| env(k).is_some())
        .map(|k| format!("${k} is set"))
}

fn home(env: Env) -> Option<PathBuf> {
    env("HOME").map(PathBuf::from)
}

/// The start of a small file, if it is a regular one. Never blocks: a FIFO (or anything else)
/// put in a settings file's place is not opened for reading, and the open itself does not wait
/// (`O_NONBLOCK`), should one be swapped in between.
fn small_file(path: &Path) -> Option<String> {
    use std::os::unix::fs::OpenOptionsExt;
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    f.take(SETTINGS_BYTES_MAX).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Where Claude Code's credentials are: a key variable, a cloud provider, the login file
/// `/login` writes (`$CLAUDE_CONFIG_DIR` or `~/.claude`, `.credentials.json`), an API key stored
/// by the login flow (`~/.claude.json`'s `primaryApiKey`), or an `apiKeyHelper` / key in the
/// user's, the project's or the managed settings.
pub fn claude(env: Env, cwd: &Path) -> Option<String> {
    if let Some(k) = key_in(env, CLAUDE_KEYS) {
        return Some(k);
    }
    if let Some(k) = CLAUDE_CLOUDS
        .iter()
        .find(|k| env(k).is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false")))
    {
        return Some(format!("${k} is set (the cloud provider signs in)"));
    }
    let config = env("CLAUDE_CONFIG_DIR")
        .map(PathBuf::from)
        .or_else(|| home(env).map(|h| h.join(".claude")));
    if let Some(dir) = &config {
        let login = dir.join(".credentials.json");
        if login.is_file() {
            return Some(format!("logged in ({})", login.display()));
        }
    }
    let state = [
        config.as_ref().map(|d| d.join(".claude.json")),
        home(env).map(|h| h.join(".claude.json")),
    ];
    for path in state.into_iter().flatten() {
        if small_file(&path).is_some_and(|t| t.contains("\"primaryApiKey\"")) {
            return Some(format!("an API key from /login ({})", path.display()));
        }
    }
    let settings = [
        config.as_ref().map(|d| d.join("settings.json")),
        Some(cwd.join(".claude/settings.json")),
        Some(cwd.join(".claude/settings.local.json")),
        Some(PathBuf::from("/etc/claude-code/managed-settings.json")),
    ];
    for path in settings.into_iter().flatten() {
        let Some(text) = small_file(&path) else {
            continue;
        };
        if let Some(what) = std::iter::once("apiKeyHelper")
            .chain(CLAUDE_KEYS.iter().copied())
            .find(|k| text.contains(&format!("\"{k}\"")))
        {
            return Some(format!("{what} in {}", path.display()));
        }
    }
    None
}

/// Where codex's credentials are: a key variable, `codex login`'s `auth.json` under
/// `$CODEX_HOME` (default `~/.codex`), or a custom `model_provider` in the session's
/// configuration (whose key codex reads from a variable that configuration names).
pub fn codex(
    env: Env,
    provider_config: &std::collections::BTreeMap<String, String>,
) -> Option<String> {
    if let Some(k) = key_in(env, CODEX_KEYS) {
        return Some(k);
    }
    if provider_config
        .values()
        .any(|v| v.contains("model_provider"))
    {
        return Some("a custom model_provider (its own key)".into());
    }
    let dir = env("CODEX_HOME")
        .map(PathBuf::from)
        .or_else(|| home(env).map(|h| h.join(".codex")))?;
    let login = dir.join("auth.json");
    login
        .is_file()
        .then(|| format!("logged in ({})", login.display()))
}

/// Where the Gemini CLI's credentials are: a key variable or its sign-in file.
pub fn gemini(env: Env) -> Option<String> {
    if let Some(k) = key_in(env, GEMINI_KEYS) {
        return Some(k);
    }
    let login = home(env)?.join(".gemini/oauth_creds.json");
    login
        .is_file()
        .then(|| format!("logged in ({})", login.display()))
}

/// This process's own environment, as an [`Env`].
pub fn own_env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn env_of<'a>(vars: &'a [(&'a str, String)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn claude_is_signed_in_by_a_key_a_cloud_a_login_or_a_settings_file() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        let cwd = tmp.path().join("project");
        std::fs::create_dir_all(home.join(".claude")).unwrap();
        std::fs::create_dir_all(cwd.join(".claude")).unwrap();
        let h = home.display().to_string();
        let bare = [("HOME", h.clone())];
        assert_eq!(claude(&env_of(&bare), &cwd), None);

        for (k, v) in [
            ("ANTHROPIC_API_KEY", "sk-ant-x"),
            ("ANTHROPIC_AUTH_TOKEN", "t"),
            ("CLAUDE_CODE_OAUTH_TOKEN", "t"),
            ("CLAUDE_CODE_USE_BEDROCK", "1"),
        ] {
            let vars = [("HOME", h.clone()), (k, v.to_string())];
            assert!(claude(&env_of(&vars), &cwd).unwrap().contains(k), "{k}");
        }
        let off = [("HOME", h.clone()), ("CLAUDE_CODE_USE_VERTEX", "0".into())];
        assert_eq!(claude(&env_of(&off), &cwd), None);

        // A key helper in the project's settings; a key in the user's settings' env block.
        std::fs::write(
            cwd.join(".claude/settings.json"),
            r#"{"apiKeyHelper": "pass show x"}"#,
        )
        .unwrap();
        assert!(claude(&env_of(&bare), &cwd)
            .unwrap()
            .contains("apiKeyHelper"));
        std::fs::remove_file(cwd.join(".claude/settings.json")).unwrap();
        std::fs::write(
            home.join(".claude/settings.json"),
            r#"{"env": {"ANTHROPIC_API_KEY": "sk-ant-x"}}"#,
        )
        .unwrap();
        assert!(claude(&env_of(&bare), &cwd)
            .unwrap()
            .contains("settings.json"));
        std::fs::remove_file(home.join(".claude/settings.json")).unwrap();

        // A FIFO where a settings file would be is not waited on.
        nix::unistd::mkfifo(
            &cwd.join(".claude/settings.local.json"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert_eq!(claude(&env_of(&bare), &cwd), None);

        // The login flow's API key, then its OAuth login file; CLAUDE_CONFIG_DIR moves both.
        std::fs::write(
            home.join(".claude.json"),
            r#"{"primaryApiKey": "sk-ant-x"}"#,
        )
        .unwrap();
        assert!(claude(&env_of(&bare), &cwd).unwrap().contains("/login"));
        std::fs::remove_file(home.join(".claude.json")).unwrap();
        std::fs::write(home.join(".claude/.credentials.json"), "{}").unwrap();
        assert!(claude(&env_of(&bare), &cwd)
            .unwrap()
            .starts_with("logged in"));
        let elsewhere = [
            ("HOME", h.clone()),
            (
                "CLAUDE_CONFIG_DIR",
                tmp.path().join("cfg").display().to_string(),
            ),
        ];
        assert_eq!(claude(&env_of(&elsewhere), &cwd), None);
    }

    #[test]
    fn codex_and_gemini_are_signed_in_by_a_key_or_their_login() {
        let tmp = tempfile::tempdir().unwrap();
        let h = tmp.path().display().to_string();
        let bare = [("HOME", h.clone())];
        let none = BTreeMap::new();
        assert_eq!(codex(&env_of(&bare), &none), None);
        assert_eq!(gemini(&env_of(&bare)), None);
        let keyed = [("HOME", h.clone()), ("CODEX_API_KEY", "k".into())];
        assert!(codex(&env_of(&keyed), &none).is_some());
        let custom =
            BTreeMap::from([("config".to_string(), "model_provider=\"local\"".to_string())]);
        assert!(codex(&env_of(&bare), &custom).is_some());
        std::fs::create_dir_all(tmp.path().join(".codex")).unwrap();
        std::fs::write(tmp.path().join(".codex/auth.json"), "{}").unwrap();
        assert!(codex(&env_of(&bare), &none)
            .unwrap()
            .starts_with("logged in"));
        std::fs::create_dir_all(tmp.path().join(".gemini")).unwrap();
        std::fs::write(tmp.path().join(".gemini/oauth_creds.json"), "{}").unwrap();
        assert!(gemini(&env_of(&bare)).unwrap().starts_with("logged in"));
    }
}
