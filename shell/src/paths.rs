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

/// Milliseconds since the Unix epoch: the wall clock, for records.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The wall clock as the core records it.
pub fn wall_clock() -> paddock_core::Timestamp {
    paddock_core::Timestamp::from_millis(now_ms())
}

/// The clocks the shell reads for the core: the monotonic one (for deadlines), counted from
/// the clock's start (the daemon's, the runner's), and the wall clock (for records).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    origin: std::time::Instant,
}

impl Clock {
    pub fn start() -> Clock {
        Clock {
            origin: std::time::Instant::now(),
        }
    }

    /// The core's instant now.
    pub fn instant(&self) -> paddock_core::Instant {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        paddock_core::Instant::from_millis(ms)
    }

    /// Both readings, for one input.
    pub fn now(&self) -> paddock_core::Now {
        paddock_core::Now::new(self.instant(), wall_clock())
    }

    /// When the core's instant `at` is, on the process's monotonic clock (`None`: never, as
    /// far as this process can tell).
    pub fn deadline(&self, at: paddock_core::Instant) -> Option<std::time::Instant> {
        self.origin
            .checked_add(std::time::Duration::from_millis(at.millis()))
    }
}

/// Logging for the daemon and the runner, on stderr: the level from `PADDOCK_LOG`, else
/// `RUST_LOG`, else `info`; colours only when stderr is a terminal (a log file never gets ANSI
/// codes).
pub fn init_tracing() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("PADDOCK_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}
