//! `paddock daemon`: start-up, the socket, signals, and the event loop.
//!
//! Start-up order: take the data dir's lock (one daemon per data dir), open the store and run
//! its migrations, rebuild the engine from it (reconciling sessions a previous daemon left
//! active: FAILED, OBEY-2032), claim the socket (a live daemon on it makes this one refuse; a
//! stale file is replaced), then serve until SIGINT / SIGTERM / Shutdown, which stop every
//! session gracefully before the process exits 0.

// The crates the daemon is made of, under the names the rest of the shell knows them by.
use paddock_agents as providers;
use paddock_config as config;
use paddock_env as env;
use paddock_runner as runner;
use paddock_store as store;
use paddock_sys::{contain, paths, proc, socket};

pub mod event_loop;
pub mod fanout;
pub mod notify;
pub mod port;
pub mod runner_link;
pub mod supervisor;

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use event_loop::State;
pub use fanout::{hear, Heard};
use paddock_core::{Engine, Limits, Stored, Surviving};
pub use port::{Command, Handle, Hub};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};

use crate::paths::Clock;
use crate::store::Store;

#[derive(Debug, Clone)]
pub struct Options {
    pub socket: PathBuf,
    pub data_dir: PathBuf,
    /// The engine's bounds (sessions and tasks).
    pub limits: Limits,
    /// The Aria runtime socket (`~/.aria/runtime.sock` / `$ARIA_RUNTIME_SOCK`), if served.
    pub aria_socket: Option<PathBuf>,
    /// obey's socket (`$XDG_RUNTIME_DIR/obey/daemon.sock`), if served: the same services as
    /// the daemon's own socket.
    pub obey_socket: Option<PathBuf>,
    /// Where Aria sessions and unbound Aria tasks run.
    pub aria_workspace: PathBuf,
    /// The provider an Aria session runs (the scripted agent unless configured).
    pub aria_provider: paddock_core::Provider,
    pub aria_model: String,
    /// Run agents in the runner (`paddock runner`), so that they outlive the daemon.
    pub use_runner: bool,
    /// The bounds a runner this daemon starts is given (one already running keeps its own).
    pub runner_limits: crate::runner::Limits,
    /// Who besides the daemon's own user may connect to its sockets.
    pub peers: crate::socket::Peers,
    /// Who is told when an agent needs a human (the configuration's `[notify]`).
    pub notify: notify::Notifier,
}

/// A started daemon: its data dir locked, its store loaded, its event loop running, its
/// sockets bound; nothing served yet (the composition root, `paddock::serve`, serves the
/// protocols on the listeners, then calls [`Started::finish`]).
pub struct Started {
    pub opts: Options,
    pub handle: Handle,
    /// Where sessions' environments are made (Aria containers are made there too).
    pub env: crate::env::Host,
    done: watch::Receiver<bool>,
    loop_task: tokio::sync::oneshot::Receiver<()>,
    runner: Option<runner_link::RunnerLink>,
    socket_activated: bool,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// The sockets a started daemon bound, to serve.
pub struct Listeners {
    /// The daemon's own socket.
    pub daemon: UnixListener,
    /// The Aria socket and obey's, when they could be bound.
    pub aria: Option<UnixListener>,
    pub obey: Option<UnixListener>,
}

/// Starts the daemon: everything but serving its sockets (see [`Started`]).
pub async fn start(opts: Options) -> Result<(Started, Listeners), StartError> {
    private_data_dir(&opts.data_dir)?;
    let _lock = lock_data_dir(&opts.data_dir)?;
    let db = crate::paths::database(&opts.data_dir);
    // SQLite gives its -wal and -shm files the database file's mode: make that 0600 first.
    private_files(&opts.data_dir, &db)?;
    let store = Store::open(&db).map_err(StartError::store("open the database"))?;
    // Only what start-up must decide on: ended sessions stay in the store until named.
    let records = store
        .load_unsettled_sessions()
        .map_err(StartError::store("load sessions"))?;
    // Every run a stored request names stays reserved; those of the sessions are the
    // engine's to reserve as it restores them (a session naming a run is never settled, so
    // every one is among the records loaded).
    let stored_runs = store
        .max_request_run()
        .map_err(StartError::store("read the stored run ids"))?;
    // Claim the socket before anything is started: a daemon that must refuse (another one
    // answers there) leaves nothing behind.
    // Socket activation (systemd's paddock.socket) hands the socket over; else it is bound here.
    let activated = crate::socket::activated()?;
    let socket_activated = activated.is_some();
    let listener = match activated {
        Some(l) => {
            tracing::info!("using the socket the service manager passed (socket activation)");
            l
        }
        None => crate::socket::bind(&opts.socket, "paddock daemon")?,
    };
    let exe = std::env::current_exe().map_err(|source| StartError::Io {
        what: "find this program's binary".into(),
        source,
    })?;
    // Every process started from here on carries this data dir as its owner. What a previous
    // daemon's tasks and agents left behind (their children died with it; their descendants
    // did not) is ended now: no other daemon of this data dir lives (we hold its lock). What
    // a previous runner's agents left is the next runner's to end, or ours without the runner
    // when none is alive (a live runner's agents are not orphans).
    let mut roles = vec![crate::contain::Role::Daemon];
    if !opts.use_runner {
        let runner_pid_file = crate::runner::pid_file(&opts.data_dir.join("runner.sock"));
        let runner_alive = std::fs::read_to_string(&runner_pid_file)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
            .is_some_and(|pid| {
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
            });
        if runner_alive {
            tracing::warn!("a runner of this data dir is alive: not sweeping for its orphans");
        } else {
            roles.push(crate::contain::Role::Runner);
        }
    }
    let data_dir = opts.data_dir.clone();
    let _ = tokio::task::spawn_blocking(move || {
        crate::contain::set_owner(&data_dir, crate::contain::Role::Daemon);
        crate::contain::reap_orphans(&roles)
    })
    .await;
    // With the runner, agents that outlived a previous daemon are adopted, not failed.
    let runner = if opts.use_runner {
        Some(
            runner_link::RunnerLink::connect_or_start(&opts.data_dir, &exe, &opts.runner_limits)
                .await?,
        )
    } else {
        None
    };
    // What outlived the previous daemon in the runner (with `--no-runner`, nothing: our
    // children died with it). The core decides what becomes of it.
    let (surviving, run_floor) = match &runner {
        Some(link) => link
            .surviving_runs()
            .await
            .map_err(StartError::RunnerList)?,
        None => (Surviving::default(), 0),
    };
    let stored = Stored {
        sessions: records,
        approvals: store
            .load_approvals()
            .map_err(StartError::store("load approvals"))?,
        tasks: store
            .load_unended_tasks()
            .map_err(StartError::store("load tasks"))?,
        campaigns: store
            .campaigns()
            .map_err(StartError::store("load campaigns"))?,
        containers: store
            .load_containers()
            .map_err(StartError::store("load containers"))?,
    };
    // The monotonic clock starts here: deadlines stored as wall-clock times are converted
    // against this first reading.
    let clock = Clock::start();
    let (mut engine, restore) =
        Engine::restore(opts.limits.clone(), clock.now(), stored, &surviving);
    engine.reserve_runs_through(run_floor.max(stored_runs));
    let unrecognized = store
        .unrecognized_counts()
        .map_err(StartError::store("load the unrecognized line counts"))?;
    let reconciled = restore
        .iter()
        .filter(|e| matches!(e, paddock_core::Effect::EmitStatus(_)))
        .count();
    if reconciled > 0 {
        tracing::warn!(
            "{reconciled} session(s) left active by a previous daemon marked FAILED (OBEY-2032)"
        );
    }

    // The Aria socket and obey's are more doors to the same services. Another daemon holding
    // one is not fatal: paddock's own socket still works.
    let extra = |path: &Option<PathBuf>, what: &str| -> Option<UnixListener> {
        match crate::socket::bind(path.as_ref()?, &format!("paddock daemon ({what})")) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!("not serving {what}: {e}");
                None
            }
        }
    };
    let aria_listener = extra(&opts.aria_socket, "the Aria socket");
    let obey_listener = extra(&opts.obey_socket, "obey's socket");
    let (tx, rx) = mpsc::channel(event_loop::COMMAND_QUEUE);
    let (done_tx, done_rx) = watch::channel(false);
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
    state.io.unrecognized = unrecognized.into_iter().collect();
    state.io.runner = runner.clone();
    // The daemon's other doors are hidden from sandboxes too.
    state
        .io
        .env
        .mask(opts.aria_socket.iter().chain(&opts.obey_socket));
    let gone = crate::env::reconcile(
        &state.io.env,
        |id| state.has_session(id) || state.has_container(&id.0),
        |id| state.has_session(id) || state.container_runs(&id.0),
    );
    let env_host = state.io.env.clone();
    if gone > 0 {
        tracing::warn!("{gone} environment(s) of deleted sessions removed");
    }
    state.reattach_adopted();
    // The loop runs on a thread of its own, driven by the runtime (its timers and the tasks it
    // spawns are the runtime's): its SQLite commits block, and a tokio worker held by one
    // would hold up every stream served on it (two workers on a 2-core laptop).
    let runtime = tokio::runtime::Handle::current();
    let (ended, loop_task) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("paddock-loop".into())
        .spawn(move || {
            if let Err(e) = runtime.block_on(event_loop::run(state, rx, restore)) {
                // Crash-only, decided here: nothing of the failed batch was acknowledged, and
                // the next start reconciles from what the store has.
                tracing::error!("store commit failed, exiting: {e}");
                std::process::exit(70);
            }
            let _ = ended.send(());
        })
        .map_err(|source| StartError::Io {
            what: "start the event loop's thread".into(),
            source,
        })?;
    let handle = Handle {
        tx: tx.clone(),
        hub,
        done: done_rx.clone(),
    };
    opts.notify.clone().start(&handle.hub);

    // SIGINT / SIGTERM: stop every session gracefully, then exit.
    let sig_handle = handle.clone();
    tokio::spawn(async move {
        paddock_sys::proc::stop_signal().await;
        tracing::info!("signal received: stopping");
        // Sent, never dropped: the command waits for room in the queue.
        let _ = sig_handle.shutdown(true).await;
    });
    let listeners = Listeners {
        daemon: listener,
        aria: aria_listener,
        obey: obey_listener,
    };
    let started = Started {
        opts,
        handle,
        env: env_host,
        done: done_rx,
        loop_task,
        runner,
        socket_activated,
        _lock,
    };
    Ok((started, listeners))
}

impl Started {
    /// Turns true once the event loop is done (a shutdown): serving stops then.
    pub fn done(&self) -> watch::Receiver<bool> {
        self.done.clone()
    }

    /// After serving ended: waits for the event loop, removes what this daemon bound (its
    /// socket unless the service manager passed it; the Aria and obey sockets it served) and
    /// stops the runner a clean shutdown left with nothing to keep.
    pub async fn finish(mut self, served_aria: bool, served_obey: bool) {
        // Only our own sockets: a live socket of another daemon was never bound here.
        for (path, bound) in [
            (&self.opts.aria_socket, served_aria),
            (&self.opts.obey_socket, served_obey),
        ] {
            if let (Some(path), true) = (path, bound) {
                let _ = std::fs::remove_file(path);
            }
        }
        let _ = self.done.wait_for(|d| *d).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.loop_task).await;
        // An activated socket belongs to the service manager, which starts us again on it.
        if !self.socket_activated {
            let _ = std::fs::remove_file(&self.opts.socket);
        }
        crate::contain::release();
        if let Some(link) = &self.runner {
            // A clean shutdown stopped every session: the runner has nothing left to keep.
            link.stop_runner();
        }
    }
}

/// Why the daemon could not start (or stopped serving): `main` prints it and exits 1.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("another paddock daemon is already using the data dir {}", .0.display())]
    Locked(PathBuf),
    #[error("cannot {what}: {source}{}", if source.is_out_of_space() {
        " (is the disk full? free space in the data dir and start again)"
    } else if source.is_locked() {
        " (another program holds the database's write lock for more than 5 s: a sqlite3 shell \
         in a transaction, a backup; let it go and start again)"
    } else {
        ""
    })]
    Store {
        what: &'static str,
        #[source]
        source: crate::store::StoreError,
    },
    #[error(transparent)]
    Socket(#[from] crate::socket::BindError),
    #[error("the runner: {0}")]
    Runner(#[from] crate::runner::client::StartError),
    #[error("the runner: ListRuns: {}", .0.message())]
    RunnerList(#[source] tonic::Status),
    #[error("server error: {0}")]
    Serve(#[source] tonic::transport::Error),
}

impl StartError {
    fn store(what: &'static str) -> impl FnOnce(crate::store::StoreError) -> StartError {
        move |source| StartError::Store { what, source }
    }
}

/// The data dir holds the database, with every session's environment: it is the user's alone
/// (0700), created so or fixed at start when an older install left it open.
fn private_data_dir(dir: &Path) -> Result<(), StartError> {
    let io = |source| StartError::Io {
        what: format!("create the data dir {}", dir.display()),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)
}

/// The database and its journal files, and the logs, are 0600 (older installs made them 0644).
/// A new database file is created empty with mode 0600 (an empty file is an empty database).
fn private_files(dir: &Path, db: &Path) -> Result<(), StartError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(db)
        .map_err(|source| StartError::Io {
            what: format!("create {}", db.display()),
            source,
        })?;
    let entries = std::fs::read_dir(dir).map_err(|source| StartError::Io {
        what: format!("read the data dir {}", dir.display()),
        source,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let private = name.starts_with("paddock.db") || name.ends_with(".log");
        if private && entry.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(
                |source| StartError::Io {
                    what: format!("make {} private", path.display()),
                    source,
                },
            )?;
        }
    }
    Ok(())
}

/// One daemon per data dir: an exclusive `flock` held for the daemon's life.
fn lock_data_dir(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, StartError> {
    let path = dir.join("daemon.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| StartError::Io {
            what: format!("open {}", path.display()),
            source,
        })?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|_| StartError::Locked(dir.to_path_buf()))
}
