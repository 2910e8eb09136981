//! Connecting to the daemon over its Unix socket, starting one if none answers.

use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use paddock_proto::obey::local::v1::local_daemon_service_client::LocalDaemonServiceClient;

use super::{Ctx, Error, Result};
use crate::transport::MESSAGE_MAX_BYTES;

/// A connection whose calls never wait longer than [`call_timeout`].
async fn conn(socket: &Path) -> std::result::Result<Conn, crate::transport::ConnectError> {
    crate::transport::conn_within(socket, call_timeout()).await
}

/// The CLI's connection to the daemon ([`crate::transport::Conn`]).
pub use crate::transport::Conn;

/// paddock's own client: it understands everything paddock adds to the seeds (WAITING, …; see
/// the daemon's `api::extensions`).
pub type Client = LocalDaemonServiceClient<
    tonic::service::interceptor::InterceptedService<Conn, crate::transport::UnderstandAll>,
>;

/// How long a CLI waits for an autostarted daemon to answer.
const AUTOSTART_WAIT: Duration = Duration::from_secs(15);

/// How long the CLI waits for a connection, and for each call's answer (a stream's start),
/// before it gives up: a daemon that does not answer never hangs a command.
/// `$PADDOCK_TIMEOUT_SECS` overrides it; a graceful stop may take its grace and more.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// [`CALL_TIMEOUT`], or `$PADDOCK_TIMEOUT_SECS`.
pub fn call_timeout() -> Duration {
    std::env::var("PADDOCK_TIMEOUT_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(CALL_TIMEOUT, Duration::from_secs)
}

pub fn client_of(ch: Conn) -> Client {
    LocalDaemonServiceClient::with_interceptor(ch, crate::transport::UnderstandAll)
        .max_decoding_message_size(MESSAGE_MAX_BYTES)
        .max_encoding_message_size(MESSAGE_MAX_BYTES)
}

/// Connects, autostarting a daemon in the background when allowed.
pub async fn connect(ctx: &Ctx) -> Result<Client> {
    connect_channel(ctx).await.map(client_of)
}

/// [`connect`]'s channel, for the other services on the same socket (Aria's tasks).
pub async fn connect_channel(ctx: &Ctx) -> Result<Conn> {
    // Said at once, not after an autostart that could not work either.
    crate::socket::check_owner(&ctx.socket).map_err(Error::Untrusted)?;
    match conn(&ctx.socket).await {
        Ok(ch) => Ok(ch),
        Err(e) if !ctx.autostart => Err(Error::NoAutostart(e)),
        Err(_) => {
            let mut started = start_daemon(&ctx.socket, &ctx.data_dir)?;
            let deadline = tokio::time::Instant::now() + AUTOSTART_WAIT;
            loop {
                match conn(&ctx.socket).await {
                    Ok(ch) => return Ok(ch),
                    Err(source) if tokio::time::Instant::now() >= deadline => {
                        return Err(Error::Autostart {
                            wait_s: AUTOSTART_WAIT.as_secs(),
                            log: started.log,
                            source,
                        })
                    }
                    Err(_) => {
                        // A daemon that exited will never answer: said now, not after the wait.
                        if let Ok(Some(status)) = started.child.try_wait() {
                            return Err(Error::AutostartExited {
                                status,
                                said: started.last_words(),
                                log: started.log,
                            });
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                }
            }
        }
    }
}

/// A daemon [`start_daemon`] started: its process (never waited for while it runs: it outlives
/// the CLI) and where its log begins.
pub struct Started {
    pub child: std::process::Child,
    pub log: std::path::PathBuf,
    /// The log's length before the daemon wrote to it.
    log_start: u64,
}

/// How `paddock daemon` begins the message it prints (to its log, when started by the CLI)
/// when it cannot start or stops serving.
pub const DAEMON_ERROR: &str = "paddock daemon: ";

/// How much of an exited daemon's log is read back for what it said last.
const LAST_WORDS_MAX_BYTES: u64 = 16 * 1024;

impl Started {
    /// Why the daemon said it could not start: what it wrote to its log since it started,
    /// from its last [`DAEMON_ERROR`] message on (which may span lines: a config file's error
    /// shows the line at fault), else its last line.
    pub fn last_words(&self) -> String {
        use std::io::{Read, Seek, SeekFrom};
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let end = f.metadata().map(|m| m.len()).unwrap_or(0);
            // Shorter than it was: the daemon rotated it at its start, and wrote it afresh.
            let start = if self.log_start <= end {
                self.log_start
            } else {
                0
            };
            let from = start.max(end.saturating_sub(LAST_WORDS_MAX_BYTES));
            if f.seek(SeekFrom::Start(from)).is_ok() {
                let _ = f.take(LAST_WORDS_MAX_BYTES).read_to_string(&mut text);
            }
        }
        let said = match text.rfind(DAEMON_ERROR) {
            Some(at) => &text[at + DAEMON_ERROR.len()..],
            None => text.trim_end().lines().last().unwrap_or_default(),
        };
        match said.trim() {
            "" => "it wrote nothing to its log".to_string(),
            said => said.to_string(),
        }
    }
}

/// Starts `paddock daemon` detached (own process group), logging to `daemon.log` (rotated by
/// the daemon; what it prints outside its log, such as a panic, is appended there too).
pub fn start_daemon(socket: &Path, data_dir: &Path) -> Result<Started> {
    std::fs::create_dir_all(data_dir)
        .map_err(Error::io(format!("cannot create {}", data_dir.display())))?;
    let log_path = data_dir.join("daemon.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .map_err(Error::io(format!("cannot open {}", log_path.display())))?;
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let exe = std::env::current_exe().map_err(Error::io("this program's path"))?;
    let child = std::process::Command::new(exe)
        .arg("daemon")
        .arg("--socket")
        .arg(socket)
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--log-file")
        .arg(&log_path)
        .stdin(Stdio::null())
        .stdout(
            log.try_clone()
                .map_err(Error::io(format!("cannot open {}", log_path.display())))?,
        )
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(Error::io("cannot start the daemon"))?;
    eprintln!(
        "paddock: started a daemon (pid {}) on {}",
        child.id(),
        socket.display()
    );
    Ok(Started {
        child,
        log: log_path,
        log_start,
    })
}
