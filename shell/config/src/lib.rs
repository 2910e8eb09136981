//! The user's configuration file: `$PADDOCK_CONFIG`, else `$XDG_CONFIG_HOME/paddock/config.toml`,
//! else `~/.config/paddock/config.toml`. Read by the CLI (defaults for `session create`) and by
//! the daemon, an autostarted one included (its limits, notifications). A command-line flag wins
//! over the file, the file over the built-in default. Unknown keys and wrong types are errors
//! that name the file, line and column (toml's own messages); no file is no configuration.
//!
//! ```toml
//! [session]                 # defaults for `paddock session create`
//! provider = "claude-code"
//! model = "sonnet"
//! driver = "local"
//! permissions = "ask"       # provider_config permissions
//! max_tokens = 200000
//! timeout_secs = 3600
//!
//! [agents]                  # how each agent is started (provider_config command)
//! claude-code = "/opt/claude/bin/claude"
//!
//! [env]                     # environment every agent gets (under --env)
//! HTTPS_PROXY = "http://proxy:3128"
//!
//! [daemon]
//! max_sessions = 64
//! stop_grace_secs = 30
//! kill_grace_secs = 10
//! end_grace_secs = 3
//! startup_timeout_secs = 60
//!
//! [notify]                  # when an agent needs you (see shell/daemon/src/notify.rs)
//! on = ["approval", "question", "failure", "budget", "turn_done"]
//! command = "notify-send paddock"
//! webhook = "http://127.0.0.1:9000/paddock"
//! desktop = true
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

/// The file's largest accepted size.
const CONFIG_BYTES_MAX: u64 = 1024 * 1024;

/// Defaults for `session create`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionDefaults {
    pub provider: Option<Spanned<String>>,
    pub model: Option<Spanned<String>>,
    pub driver: Option<Spanned<String>>,
    pub permissions: Option<Spanned<String>>,
    pub max_tokens: Option<Spanned<u64>>,
    pub timeout_secs: Option<Spanned<u64>>,
}

/// Defaults for `paddock daemon` (its flags win).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonDefaults {
    pub max_sessions: Option<Spanned<usize>>,
    pub stop_grace_secs: Option<Spanned<u64>>,
    pub kill_grace_secs: Option<Spanned<u64>>,
    pub end_grace_secs: Option<Spanned<u64>>,
    pub startup_timeout_secs: Option<Spanned<u64>>,
}

/// What the daemon tells a human about, and how.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// Which events ([`NOTIFY_EVENTS`]); default: approval, question, failure, budget.
    pub on: Option<Spanned<Vec<String>>>,
    /// A shell command run for each (`sh -c`), with `PADDOCK_EVENT`, `PADDOCK_SESSION`,
    /// `PADDOCK_MESSAGE` and `PADDOCK_APPROVAL` in its environment.
    pub command: Option<Spanned<String>>,
    /// An http(s) URL that gets each as a JSON POST.
    pub webhook: Option<Spanned<String>>,
    /// A desktop notification (`notify-send`) where a session bus exists; default true.
    pub desktop: Option<Spanned<bool>>,
}

/// The events `[notify] on` may name.
pub const NOTIFY_EVENTS: &[&str] = &["approval", "question", "failure", "budget", "turn_done"];
/// The events notified when `on` is not set.
pub const NOTIFY_DEFAULT: &[&str] = &["approval", "question", "failure", "budget"];

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub session: SessionDefaults,
    #[serde(default)]
    pub agents: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    pub env: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    pub daemon: DaemonDefaults,
    #[serde(default)]
    pub notify: NotifyConfig,
}

/// A configuration as read from its file, for values and where each came from.
#[derive(Debug)]
pub struct Loaded {
    pub path: PathBuf,
    text: String,
    pub config: Config,
}

impl Loaded {
    /// `config.toml:LINE` for a value read at `span`.
    pub fn source(&self, span: std::ops::Range<usize>) -> String {
        format!("{}:{}", self.path.display(), self.line(span))
    }

    /// The line (from 1) a value read at `span` is on.
    fn line(&self, span: std::ops::Range<usize>) -> usize {
        self.text[..span.start.min(self.text.len())]
            .bytes()
            .filter(|b| *b == b'\n')
            .count()
            + 1
    }
}

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is larger than {CONFIG_BYTES_MAX} bytes", .0.display())]
    TooLarge(PathBuf),
    /// toml's message names the line and column.
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
}

/// Where the configuration file is looked for.
pub fn path() -> PathBuf {
    if let Some(p) = std::env::var_os("PADDOCK_CONFIG").filter(|v| !v.is_empty()) {
        return PathBuf::from(p);
    }
    dirs::config_dir()
        .unwrap_or_else(|| paddock_sys::paths::home().join(".config"))
        .join("paddock")
        .join("config.toml")
}

/// Reads the configuration at [`path`]; `None` when there is no file.
pub fn load() -> Result<Option<Loaded>, ConfigError> {
    load_from(&path())
}

/// Reads the configuration at `path`; `None` when there is no file.
pub fn load_from(path: &Path) -> Result<Option<Loaded>, ConfigError> {
    let read = |source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read(e)),
    };
    if meta.len() > CONFIG_BYTES_MAX {
        return Err(ConfigError::TooLarge(path.to_path_buf()));
    }
    let text = std::fs::read_to_string(path).map_err(read)?;
    parse(path, text).map(Some)
}

/// Parses and checks a configuration's text.
pub fn parse(path: &Path, text: String) -> Result<Loaded, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    let config: Config =
        toml::from_str(&text).map_err(|e| invalid(e.to_string().trim_end().to_string()))?;
    let loaded = Loaded {
        path: path.to_path_buf(),
        text,
        config,
    };
    let c = &loaded.config;
    if let Some(p) = &c.session.provider {
        if paddock_core::Provider::from_name(p.get_ref()).is_none() {
            return Err(invalid(format!(
                "line {}: unknown provider {:?} in [session] (scripted, claude-code, codex, \
                 gemini, openclaw, openai-api, acp)",
                loaded.line(p.span()),
                p.get_ref()
            )));
        }
    }
    if let Some(p) = &c.session.permissions {
        // Read as a session's provider_config reads it (the one place such a map is parsed).
        let map = BTreeMap::from([(
            paddock_core::provider_config::PERMISSIONS.to_string(),
            p.get_ref().clone(),
        )]);
        if let Err(e) = paddock_core::ProviderConfig::parse(map) {
            return Err(invalid(format!(
                "line {}: [session] {e}",
                loaded.line(p.span())
            )));
        }
    }
    if let Some(d) = &c.session.driver {
        if paddock_core::Driver::parse(d.get_ref()).is_none() {
            let names: Vec<&str> = paddock_core::Driver::ALL.iter().map(|d| d.name()).collect();
            return Err(invalid(format!(
                "line {}: unknown driver {:?} in [session] ({})",
                loaded.line(d.span()),
                d.get_ref(),
                names.join(", ")
            )));
        }
    }
    for name in c.agents.keys() {
        if paddock_core::Provider::from_name(name).is_none() {
            return Err(invalid(format!(
                "unknown agent {name:?} in [agents] (claude-code, codex, gemini, openclaw, acp)"
            )));
        }
    }
    if let Some(on) = &c.notify.on {
        if let Some(bad) = on
            .get_ref()
            .iter()
            .find(|e| !NOTIFY_EVENTS.contains(&e.as_str()))
        {
            return Err(invalid(format!(
                "line {}: unknown event {bad:?} in [notify] on (one of: {})",
                loaded.line(on.span()),
                NOTIFY_EVENTS.join(", ")
            )));
        }
    }
    if let Some(url) = &c.notify.webhook {
        let u = url.get_ref();
        if !(u.starts_with("http://") || u.starts_with("https://")) {
            return Err(invalid(format!(
                "line {}: [notify] webhook must be an http(s) URL, not {u:?}",
                loaded.line(url.span())
            )));
        }
    }
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> Result<Loaded, ConfigError> {
        parse(
            Path::new("/home/me/.config/paddock/config.toml"),
            text.into(),
        )
    }

    #[test]
    fn a_full_file_reads_with_where_each_value_is() {
        let l = parse_str(
            "[session]\nprovider = \"codex\"\nmax_tokens = 5000\n\n[agents]\nclaude-code = \
             \"/opt/claude\"\n\n[daemon]\nmax_sessions = 8\n\n[notify]\non = [\"approval\", \
             \"turn_done\"]\ncommand = \"true\"\n",
        )
        .unwrap();
        let p = l.config.session.provider.as_ref().unwrap();
        assert_eq!(p.get_ref(), "codex");
        assert_eq!(l.source(p.span()), "/home/me/.config/paddock/config.toml:2");
        assert_eq!(*l.config.daemon.max_sessions.as_ref().unwrap().get_ref(), 8);
        assert_eq!(l.config.agents["claude-code"].get_ref(), "/opt/claude");
    }

    #[test]
    fn unknown_keys_and_bad_values_say_where() {
        let e = parse_str("[session]\nprovider = \"codex\"\nmodle = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3, column 1") && e.contains("modle"), "{e}");
        let e = parse_str("[daemon]\nmax_sessions = \"many\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2"), "{e}");
        let e = parse_str("[session]\n\nprovider = \"banana\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3") && e.contains("banana"), "{e}");
        let e = parse_str("[notify]\non = [\"lunch\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lunch") && e.contains("turn_done"), "{e}");
        let e = parse_str("[notify]\nwebhook = \"ftp://x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("http(s)"), "{e}");
        let e = parse_str("[agents]\nclaud = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("claud"), "{e}");
        // What a session create would refuse is refused here, where the file can be named.
        let e = parse_str("[session]\npermissions = \"sometimes\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("config.toml: line 2") && e.contains("\"sometimes\"") && e.contains("ask"),
            "{e}"
        );
        parse_str("[session]\npermissions = \"ask:Read,Grep\"\n").unwrap();
        let e = parse_str("[session]\ndriver = \"docker\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 2") && e.contains("docker") && e.contains("podman"),
            "{e}"
        );
    }

    #[test]
    fn no_file_is_no_configuration() {
        assert!(load_from(Path::new("/nonexistent/paddock/config.toml"))
            .unwrap()
            .is_none());
    }
}
