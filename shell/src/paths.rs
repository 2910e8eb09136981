//! Where the socket and the data live.
//!
//! Socket: `--socket`, else `$PADDOCK_SOCKET`, else `$XDG_RUNTIME_DIR/paddock/daemon.sock`, else
//! `daemon.sock` in the default data dir (never a shared `/tmp` path another user could create
//! first). Data: `--data-dir`, else `$PADDOCK_DATA_DIR`, else
//! `$XDG_DATA_HOME/paddock`, else `~/.local/share/paddock`. (clap reads the `PADDOCK_*`
//! variables; this module supplies the defaults.)

use std::path::PathBuf;

pub fn default_socket() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("paddock").join("daemon.sock"),
        None => default_data_dir().join("daemon.sock"),
    }
}

pub fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir).join("paddock");
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".local").join("share").join("paddock")
}

/// The Aria runtime socket: `~/.aria/runtime.sock` (`$ARIA_RUNTIME_SOCK` is read by clap).
pub fn default_aria_socket() -> PathBuf {
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".aria").join("runtime.sock")
}

/// The database file inside a data dir.
pub fn database(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("paddock.db")
}

/// Milliseconds since the Unix epoch: the only clock the shell reads for the core.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
