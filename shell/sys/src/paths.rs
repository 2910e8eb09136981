//! Where the socket and the data live.
//!
//! Socket: `--socket`, else `$PADDOCK_SOCKET`, else `$XDG_RUNTIME_DIR/paddock/daemon.sock`, else
//! `daemon.sock` in the default data dir (never a shared `/tmp` path another user could create
//! first). Data: `--data-dir`, else `$PADDOCK_DATA_DIR`, else
//! `$XDG_DATA_HOME/paddock`, else `~/.local/share/paddock`. (clap reads the `PADDOCK_*`
//! variables; this module supplies the defaults, with the XDG rules of the `dirs` crate: an
//! `$XDG_*` value counts only when absolute, and HOME comes from the user database when
//! `$HOME` is unset.)

use std::path::{Path, PathBuf};

pub fn default_socket() -> PathBuf {
    match dirs::runtime_dir() {
        Some(dir) => dir.join("paddock").join("daemon.sock"),
        None => default_data_dir().join("daemon.sock"),
    }
}

/// obey's own socket, `$XDG_RUNTIME_DIR/obey/daemon.sock` (the seed's path), when there is a
/// runtime directory.
pub fn default_obey_socket() -> Option<PathBuf> {
    dirs::runtime_dir().map(|dir| dir.join("obey").join("daemon.sock"))
}

pub fn default_data_dir() -> PathBuf {
    dirs::data_dir()
        .map(|d| d.join("paddock"))
        .unwrap_or_else(|| no_home().join("data"))
}

/// Where paddock keeps what would be under HOME when there is no home at all (no `$HOME`, no
/// entry in the user database): a directory of this user's under the system's temporary
/// directory. The daemon refuses to use it if another user made it first.
pub fn no_home() -> PathBuf {
    std::env::temp_dir().join(format!("paddock-{}", nix::unistd::geteuid()))
}

/// The user's home directory: `$HOME`, else the user database's (never a shared directory).
pub fn home() -> PathBuf {
    dirs::home_dir().unwrap_or_else(no_home)
}

/// `program` found the way a shell finds it on the search path `path` (a `PATH` value; a name
/// with a slash is taken as a path). The one lookup the daemon, the CLI and doctor share.
pub fn find_program(program: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        return p.is_file().then_some(p);
    }
    std::env::split_paths(path?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// [`find_program`] on this process's own `PATH`.
pub fn find_on_own_path(program: &str) -> Option<PathBuf> {
    find_program(program, std::env::var_os("PATH").as_deref())
}

/// The Aria runtime socket: `~/.aria/runtime.sock` (`$ARIA_RUNTIME_SOCK` is read by clap).
pub fn default_aria_socket() -> PathBuf {
    home().join(".aria").join("runtime.sock")
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

/// A log file's size past which it is rotated ([`init_tracing_to`]).
pub const LOG_MAX_BYTES: usize = 10 * 1024 * 1024;
/// Rotated log files kept (`daemon.log.1` … `.3`); older ones are deleted.
pub const LOG_FILES_KEPT: usize = 3;

/// Where the daemon or the runner logs (`paddock daemon` / `paddock runner`).
// The fields' doc comments are `--help` text, for a terminal (`<data dir>` is not HTML).
#[allow(rustdoc::invalid_html_tags)]
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Write the log to this file instead of stderr, rotated by size (FILE.1 is the newest old
    /// one; 3 are kept). An autostarted daemon logs to <data dir>/daemon.log, its runner to
    /// runner.log
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// The size at which the log file is rotated
    #[arg(long, default_value_t = LOG_MAX_BYTES, value_name = "BYTES")]
    pub log_max_bytes: usize,
}

impl LogArgs {
    /// Starts logging as these arguments say.
    pub fn init(&self) {
        init_tracing_to(self.log_file.as_deref(), self.log_max_bytes);
    }
}

/// Logging for the daemon and the runner into `file`, rotated once it passes `max_bytes`
/// (`file.1` the newest old one, [`LOG_FILES_KEPT`] kept), never with ANSI codes; the level as
/// for [`init_tracing`]. Without a file, [`init_tracing`].
pub fn init_tracing_to(file: Option<&Path>, max_bytes: usize) {
    use file_rotate::{compression::Compression, suffix::AppendCount, ContentLimit, FileRotate};
    use std::os::unix::fs::OpenOptionsExt;
    let Some(path) = file else {
        return init_tracing();
    };
    let mut open = std::fs::OpenOptions::new();
    open.create(true).append(true).mode(0o600);
    let writer = FileRotate::new(
        path,
        AppendCount::new(LOG_FILES_KEPT),
        ContentLimit::BytesSurpassed(max_bytes.max(1)),
        Compression::None,
        Some(open),
    );
    let _ = tracing_subscriber::fmt()
        .with_env_filter(log_filter())
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(writer))
        .try_init();
}

fn log_filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_env("PADDOCK_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
}

/// Logging for the daemon and the runner, on stderr: the level from `PADDOCK_LOG`, else
/// `RUST_LOG`, else `info`; colours only when stderr is a terminal (a log file never gets ANSI
/// codes).
pub fn init_tracing() {
    use std::io::IsTerminal;
    let filter = log_filter();
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}
