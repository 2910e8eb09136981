//! The daemon's composition root: [`crate::daemon::start`] makes the engine run (store, event
//! loop, runner, sockets bound), then this module serves the protocols of [`crate::api`] on
//! its sockets until the loop is done, and hands back for the clean-up. It is the one module
//! that knows both: `api` depends on `daemon` (its typed port), `daemon` on neither this nor
//! `api`.

use std::path::PathBuf;
use std::time::Duration;

use tokio::net::UnixListener;

use crate::daemon::{Options, StartError};

/// How long open calls may take to finish after the event loop is done.
const SERVE_DRAIN: Duration = Duration::from_secs(2);

pub use paddock_sys::service_runtime as runtime;

/// Runs the daemon in the foreground until it is told to stop (on [`runtime`]).
pub async fn run(opts: Options) -> Result<(), StartError> {
    let (started, listeners) = crate::daemon::start(opts).await?;
    let opts = started.opts.clone();
    let handle = started.handle.clone();
    let done_rx = started.done();
    let incoming = crate::socket::incoming(listeners.daemon, opts.peers.clone(), "paddock daemon");
    let shutdown = {
        let mut rx = done_rx.clone();
        async move {
            let _ = rx.wait_for(|d| *d).await;
        }
    };
    tracing::info!(socket = %opts.socket.display(), data = %opts.data_dir.display(), "paddock daemon listening");
    let aria = crate::api::aria::AriaConfig {
        handle: handle.clone(),
        workspace: opts.aria_workspace.clone(),
        provider: opts.aria_provider,
        model: opts.aria_model.clone(),
        env: started.env.clone(),
    };
    let serve_extra = |l: UnixListener,
                       path: PathBuf,
                       router: tonic::transport::server::Router<crate::transport::ServerLayer>,
                       what: &'static str| {
        let mut done = done_rx.clone();
        let peers = opts.peers.clone();
        tracing::info!(socket = %path.display(), "serving {what}");
        tokio::spawn(async move {
            let incoming = crate::socket::incoming(l, peers, what);
            let stop = async move {
                let _ = done.wait_for(|d| *d).await;
            };
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, stop).await {
                tracing::warn!("{what} server: {e}");
            }
            let _ = std::fs::remove_file(&path);
        });
    };
    let aria_bound = listeners.aria.is_some();
    if let (Some(l), Some(path)) = (listeners.aria, opts.aria_socket.clone()) {
        serve_extra(
            l,
            path,
            crate::api::router(aria.clone(), None).await,
            "the Aria runtime API",
        );
    }
    let obey_bound = listeners.obey.is_some();
    if let (Some(l), Some(path)) = (listeners.obey, opts.obey_socket.clone()) {
        let sunbeam = crate::api::sunbeam::CodeAgent::new(handle.clone());
        serve_extra(
            l,
            path,
            crate::api::router(aria.clone(), Some(sunbeam)).await,
            "obey's socket",
        );
    }
    let sunbeam = crate::api::sunbeam::CodeAgent::new(handle.clone());
    // Served from a worker, not from this thread (the one `block_on` runs): a connection is
    // then accepted by the worker that polls the socket, and its task starts on that same
    // worker, instead of the worker waking this thread to accept and this thread waking a
    // worker to serve (two thread hops at the start of every CLI command).
    let mut serve = tokio::spawn(
        crate::api::router(aria, Some(sunbeam))
            .await
            .serve_with_incoming_shutdown(incoming, shutdown),
    );
    // Once the loop is done, in-flight calls get a short while to finish; a client that keeps
    // a call open (a stream it never reads) does not keep the daemon alive.
    let mut done_late = done_rx.clone();
    let result = tokio::select! {
        r = &mut serve => match r {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        },
        _ = async move {
            let _ = done_late.wait_for(|d| *d).await;
            tokio::time::sleep(SERVE_DRAIN).await;
        } => {
            tracing::warn!("open calls did not finish within {SERVE_DRAIN:?} of shutdown; exiting");
            serve.abort();
            Ok(())
        }
    };
    started.finish(aria_bound, obey_bound).await;
    result.map_err(StartError::Serve)
}
