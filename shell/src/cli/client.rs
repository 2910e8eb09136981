//! Connecting to the daemon over its Unix socket, starting one if none answers.

use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use paddock_proto::obey::local::v1::local_daemon_service_client::LocalDaemonServiceClient;
use tonic::transport::Channel;

use super::{Ctx, Error, Result};
use crate::transport::{channel, MESSAGE_MAX_BYTES};

pub type Client = LocalDaemonServiceClient<Channel>;

/// How long a CLI waits for an autostarted daemon to answer.
const AUTOSTART_WAIT: Duration = Duration::from_secs(15);

fn client_of(ch: Channel) -> Client {
    LocalDaemonServiceClient::new(ch)
        .max_decoding_message_size(MESSAGE_MAX_BYTES)
        .max_encoding_message_size(MESSAGE_MAX_BYTES)
}

/// Connects, autostarting a daemon in the background when allowed.
pub async fn connect(ctx: &Ctx) -> Result<Client> {
    connect_channel(ctx).await.map(client_of)
}

/// [`connect`]'s channel, for the other services on the same socket (Aria's tasks).
pub async fn connect_channel(ctx: &Ctx) -> Result<Channel> {
    // Said at once, not after an autostart that could not work either.
    crate::socket::check_owner(&ctx.socket).map_err(Error::Untrusted)?;
    match channel(&ctx.socket).await {
        Ok(ch) => Ok(ch),
        Err(e) if !ctx.autostart => Err(Error::NoAutostart(e)),
        Err(_) => {
            start_daemon(&ctx.socket, &ctx.data_dir)?;
            let deadline = tokio::time::Instant::now() + AUTOSTART_WAIT;
            loop {
                match channel(&ctx.socket).await {
                    Ok(ch) => return Ok(ch),
                    Err(source) if tokio::time::Instant::now() >= deadline => {
                        return Err(Error::Autostart {
                            wait_s: AUTOSTART_WAIT.as_secs(),
                            log: ctx.data_dir.join("daemon.log"),
                            source,
                        })
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
    }
}

/// Starts `paddock daemon` detached (own process group, output to `daemon.log`).
pub fn start_daemon(socket: &Path, data_dir: &Path) -> Result<u32> {
    std::fs::create_dir_all(data_dir)
        .map_err(Error::io(format!("cannot create {}", data_dir.display())))?;
    let log_path = data_dir.join("daemon.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .map_err(Error::io(format!("cannot open {}", log_path.display())))?;
    let exe = std::env::current_exe().map_err(Error::io("this program's path"))?;
    let child = std::process::Command::new(exe)
        .arg("daemon")
        .arg("--socket")
        .arg(socket)
        .arg("--data-dir")
        .arg(data_dir)
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
    Ok(child.id())
}
