//! A client's way to a runner: connect to one that answers on a socket, or start one there
//! (the daemon for its own runner, `paddock __ssh-runner` for one on an ssh host).

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use paddock_proto::runner::v1 as rpb;
use rpb::runner_client::RunnerClient;
use tonic::transport::Channel;

/// How long a client waits for a runner it started to answer.
const RUNNER_START_WAIT: Duration = Duration::from_secs(10);

/// Why a runner could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open {}: {source}", .path.display())]
    Log {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the runner: {0}")]
    Spawn(#[source] std::io::Error),
    #[error(
        "the runner did not answer on {} within {}s (see {})",
        .socket.display(),
        RUNNER_START_WAIT.as_secs(),
        .log.display()
    )]
    NoAnswer {
        socket: std::path::PathBuf,
        log: std::path::PathBuf,
    },
}

/// Starts a runner on `socket` (detached: its own process group, no parent-death signal, so
/// that it outlives its client) and waits until it answers.
pub async fn start(
    data_dir: &Path,
    exe: &Path,
    socket: &Path,
    limits: &crate::Limits,
) -> Result<RunnerClient<Channel>, StartError> {
    let log_path = data_dir.join("runner.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .map_err(|source| StartError::Log {
            path: log_path.clone(),
            source,
        })?;
    let mut child = std::process::Command::new(exe);
    child
        .arg("runner")
        .arg("--socket")
        .arg(socket)
        .arg(format!("--max-runs={}", limits.live_runs))
        .arg(format!("--buffer-events={}", limits.events_per_run))
        .arg(format!("--buffer-bytes={}", limits.bytes_per_run))
        .arg("--log-file")
        .arg(&log_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    // Its own process group: a Ctrl-C meant for the daemon's terminal does not reach it.
    std::os::unix::process::CommandExt::process_group(&mut child, 0);
    let mut child = child.spawn().map_err(StartError::Spawn)?;
    tracing::info!(pid = child.id(), socket = %socket.display(), "started a runner");
    // Reap it if it exits while we live (it normally outlives us).
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    let deadline = tokio::time::Instant::now() + RUNNER_START_WAIT;
    loop {
        if let Some(client) = connect(socket).await {
            return Ok(client);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(StartError::NoAnswer {
                socket: socket.to_path_buf(),
                log: log_path,
            });
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub async fn connect(socket: &Path) -> Option<RunnerClient<Channel>> {
    let ch = paddock_sys::transport::bulk_channel(socket).await.ok()?;
    let mut client = RunnerClient::new(ch);
    client.list_runs(rpb::ListRunsRequest {}).await.ok()?;
    Some(client)
}
