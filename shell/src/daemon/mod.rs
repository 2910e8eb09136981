//! `paddock daemon`: start-up, the socket, signals, and the event loop.
//!
//! Start-up order: take the data dir's lock (one daemon per data dir), open the store and run
//! its migrations, rebuild the engine from it (reconciling sessions a previous daemon left
//! active: FAILED, OBEY-2032), claim the socket (a live daemon on it makes this one refuse; a
//! stale file is replaced), then serve until SIGINT / SIGTERM / Shutdown, which stop every
//! session gracefully before the process exits 0.

pub mod event_loop;
pub mod port;
pub mod runner_link;
pub mod supervisor;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use event_loop::State;
use paddock_core::{Engine, Limits, Stored, Surviving};
pub use port::{Command, Handle, Hub};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};

use crate::paths::Clock;
use crate::store::Store;

/// How long open calls may take to finish after the event loop is done.
const SERVE_DRAIN: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct Options {
    pub socket: PathBuf,
    pub data_dir: PathBuf,
    /// The engine's bounds (sessions and tasks).
    pub limits: Limits,
    /// The Aria runtime socket (`~/.aria/runtime.sock` / `$ARIA_RUNTIME_SOCK`), if served.
    pub aria_socket: Option<PathBuf>,
    /// Where Aria sessions and unbound Aria tasks run.
    pub aria_workspace: PathBuf,
    /// The provider an Aria session runs (the scripted agent unless configured).
    pub aria_provider: paddock_core::Provider,
    pub aria_model: String,
    /// Run agents in the runner (`paddock runner`), so that they outlive the daemon.
    pub use_runner: bool,
}

/// Runs the daemon in the foreground until it is told to stop.
pub async fn run(opts: Options) -> Result<(), String> {
    std::fs::create_dir_all(&opts.data_dir)
        .map_err(|e| format!("cannot create data dir {}: {e}", opts.data_dir.display()))?;
    let _lock = lock_data_dir(&opts.data_dir)?;
    let db = crate::paths::database(&opts.data_dir);
    let store = Store::open(&db).map_err(|e| format!("cannot open {}: {e}", db.display()))?;
    let records = store
        .load_sessions()
        .map_err(|e| format!("cannot load sessions: {e}"))?;
    // Claim the socket before anything is started: a daemon that must refuse (another one
    // answers there) leaves nothing behind.
    let listener = bind_socket(&opts.socket)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
    // With the runner, agents that outlived a previous daemon are adopted, not failed.
    let runner = if opts.use_runner {
        Some(runner_link::RunnerLink::connect_or_start(&opts.data_dir, &exe).await?)
    } else {
        None
    };
    // What outlived the previous daemon in the runner (with `--no-runner`, nothing: our
    // children died with it). The core decides what becomes of it.
    let (surviving, run_floor) = match &runner {
        Some(link) => link.surviving_runs().await?,
        None => (Surviving::default(), 0),
    };
    let stored = Stored {
        sessions: records,
        approvals: store
            .load_approvals()
            .map_err(|e| format!("cannot load approvals: {e}"))?,
        tasks: store
            .load_tasks()
            .map_err(|e| format!("cannot load tasks: {e}"))?,
        campaigns: store
            .campaigns()
            .map_err(|e| format!("cannot load campaigns: {e}"))?,
    };
    // The monotonic clock starts here: deadlines stored as wall-clock times are converted
    // against this first reading.
    let clock = Clock::start();
    let (mut engine, restore) =
        Engine::restore(opts.limits.clone(), clock.now(), stored, &surviving);
    engine.reserve_runs_through(run_floor);
    let unrecognized = store
        .unrecognized_counts()
        .map_err(|e| format!("cannot load the unrecognized line counts: {e}"))?;
    let reconciled = restore
        .iter()
        .filter(|e| matches!(e, paddock_core::Effect::EmitStatus(_)))
        .count();
    if reconciled > 0 {
        tracing::warn!(
            "{reconciled} session(s) left active by a previous daemon marked FAILED (OBEY-2032)"
        );
    }

    // The Aria socket is a second door to the same services. Another daemon holding it is not
    // fatal: paddock's own socket still works.
    let aria_listener: Option<UnixListener> = match &opts.aria_socket {
        Some(path) => match bind_socket(path) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!("not serving the Aria socket: {e}");
                None
            }
        },
        None => None,
    };
    let (tx, rx) = mpsc::channel(event_loop::COMMAND_QUEUE);
    let (done_tx, mut done_rx) = watch::channel(false);
    let hub = Hub::new();
    let mut state = State::new(
        engine,
        store,
        hub.clone(),
        opts.socket.clone(),
        opts.data_dir.clone(),
        exe,
        tx.clone(),
        done_tx,
        clock,
    );
    state.unrecognized = unrecognized.into_iter().collect();
    state.runner = runner.clone();
    state.reattach_adopted();
    let loop_task = tokio::spawn(async move {
        if let Err(e) = event_loop::run(state, rx, restore).await {
            // Crash-only, decided here: nothing of the failed batch was acknowledged, and the
            // next start reconciles from what the store has.
            tracing::error!("store commit failed, exiting: {e}");
            std::process::exit(70);
        }
    });
    let handle = Handle {
        tx: tx.clone(),
        hub,
        done: done_rx.clone(),
    };

    // SIGINT / SIGTERM: stop every session gracefully, then exit.
    let sig_handle = handle.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        tokio::select! {
            _ = int.recv() => {},
            _ = term.recv() => {},
        }
        tracing::info!("signal received: stopping");
        // Sent, never dropped: the command waits for room in the queue.
        let _ = sig_handle.shutdown(true).await;
    });

    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let shutdown = {
        let mut rx = done_rx.clone();
        async move {
            let _ = rx.wait_for(|d| *d).await;
        }
    };
    tracing::info!(socket = %opts.socket.display(), data = %opts.data_dir.display(), "paddock daemon listening");
    let aria_bound = aria_listener.is_some();
    let aria = crate::api::aria::AriaConfig {
        handle: handle.clone(),
        workspace: opts.aria_workspace.clone(),
        provider: opts.aria_provider,
        model: opts.aria_model.clone(),
    };
    if let (Some(l), Some(path)) = (aria_listener, opts.aria_socket.clone()) {
        let mut done = done_rx.clone();
        let router = crate::api::router(aria.clone(), None);
        tracing::info!(socket = %path.display(), "serving the Aria runtime API");
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(l);
            let stop = async move {
                let _ = done.wait_for(|d| *d).await;
            };
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, stop).await {
                tracing::warn!("Aria socket server: {e}");
            }
            let _ = std::fs::remove_file(&path);
        });
    }
    let sunbeam = crate::api::sunbeam::CodeAgent::new(handle.clone());
    let serve =
        crate::api::router(aria, Some(sunbeam)).serve_with_incoming_shutdown(incoming, shutdown);
    // Once the loop is done, in-flight calls get a short while to finish; a client that keeps
    // a call open (a stream it never reads) does not keep the daemon alive.
    let mut done_late = done_rx.clone();
    let result = tokio::select! {
        r = serve => r,
        _ = async move {
            let _ = done_late.wait_for(|d| *d).await;
            tokio::time::sleep(SERVE_DRAIN).await;
        } => {
            tracing::warn!("open calls did not finish within {SERVE_DRAIN:?} of shutdown; exiting");
            Ok(())
        }
    };
    if let Some(path) = &opts.aria_socket {
        // Only our own socket: a live Aria socket of another daemon was never bound here.
        if aria_bound {
            let _ = std::fs::remove_file(path);
        }
    }
    let _ = done_rx.wait_for(|d| *d).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), loop_task).await;
    let _ = std::fs::remove_file(&opts.socket);
    if let Some(link) = &runner {
        // A clean shutdown stopped every session: the runner has nothing left to keep.
        link.stop_runner();
    }
    result.map_err(|e| format!("server error: {e}"))
}

/// One daemon per data dir: an exclusive `flock` held for the daemon's life.
fn lock_data_dir(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    let path = dir.join("daemon.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|_| {
        format!(
            "another paddock daemon is already using the data dir {}",
            dir.display()
        )
    })
}

/// Creates the socket's directory (0700) and binds the socket (0600). A socket a live daemon
/// answers on is refused; a stale one is replaced. (The one way every paddock server claims
/// its socket: [`crate::socket::bind`].)
fn bind_socket(path: &Path) -> Result<UnixListener, String> {
    crate::socket::bind(path, "paddock daemon")
}
