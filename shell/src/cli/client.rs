//! Connecting to the daemon over its Unix socket, starting one if none answers.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use paddock_proto::obey::local::v1::local_daemon_service_client::LocalDaemonServiceClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::Ctx;
use crate::daemon::MAX_MESSAGE_BYTES;

pub type Client = LocalDaemonServiceClient<Channel>;

/// How long a CLI waits for an autostarted daemon to answer.
const AUTOSTART_WAIT: Duration = Duration::from_secs(15);

/// A channel over the socket at `path` (the URI is a placeholder; the connector decides).
pub async fn channel(path: &Path) -> Result<Channel, String> {
    let path = path.to_path_buf();
    let p = path.clone();
    Endpoint::try_from("http://localhost")
        .expect("static uri")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = p.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(p).await?)) }
        }))
        .await
        .map_err(|e| format!("no paddock daemon answers on {}: {e}", path.display()))
}

fn client_of(ch: Channel) -> Client {
    LocalDaemonServiceClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// Connects, autostarting a daemon in the background when allowed.
pub async fn connect(ctx: &Ctx) -> Result<Client, String> {
    match channel(&ctx.socket).await {
        Ok(ch) => Ok(client_of(ch)),
        Err(e) if !ctx.autostart => Err(format!("{e} (and --no-autostart is set)")),
        Err(_) => {
            start_daemon(&ctx.socket, &ctx.data_dir)?;
            let deadline = tokio::time::Instant::now() + AUTOSTART_WAIT;
            loop {
                match channel(&ctx.socket).await {
                    Ok(ch) => return Ok(client_of(ch)),
                    Err(e) if tokio::time::Instant::now() >= deadline => {
                        return Err(format!(
                            "started a daemon but it did not answer within {}s: {e} (see {})",
                            AUTOSTART_WAIT.as_secs(),
                            ctx.data_dir.join("daemon.log").display()
                        ))
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
    }
}

/// Starts `paddock daemon` detached (own process group, output to `daemon.log`).
pub fn start_daemon(socket: &Path, data_dir: &Path) -> Result<u32, String> {
    std::fs::create_dir_all(data_dir)
        .map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
    let log_path = data_dir.join("daemon.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let child = std::process::Command::new(exe)
        .arg("daemon")
        .arg("--socket")
        .arg(socket)
        .arg("--data-dir")
        .arg(data_dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    eprintln!(
        "paddock: started a daemon (pid {}) on {}",
        child.id(),
        socket.display()
    );
    Ok(child.id())
}
