//! paddock's operating-system seam, below the daemon and the runner (ARCHITECTURE.md):
//! processes spawned in their own group with the parent-death signal and the containment tag
//! and ended as a tree ([`proc`], [`contain`]), Unix sockets bound privately ([`socket`]), the
//! gRPC transport over them ([`transport`]), the clocks and default paths ([`paths`]), files
//! read only inside a root, bounded ([`confined`]), and the daemon's and the runner's async
//! runtime ([`service_runtime`]).
//! Nothing here knows a session, a run or a protocol's rules.

mod born;
pub mod confined;
pub mod contain;
pub mod paths;
pub mod proc;
pub mod socket;
pub mod transport;
pub use paddock_support::text;

/// The tokio runtime of a long-lived service (the daemon, the runner): one worker thread per
/// core but one, at least one.
///
/// The daemon's decisions and commits run on its event loop's own thread, and a worker woken
/// for every socket event wakes its siblings to steal: with as many workers as cores, each
/// small call or event crossed threads several times and the workers preempted the loop. On 2
/// cores (P3 and P6 of `cargo bench -p paddock --bench targets`, two runs each, interleaved),
/// one worker each for the daemon and the runner instead of two: the daemon's CPU per event
/// 110–112 → 86–87 µs, P3's event latency p99 17–20 → 6–11 ms; the daemon's workers alone
/// made `session list` against a 10,000-session store 3.8–3.9 → 3.2–3.4 ms a call.
///
/// `TOKIO_WORKER_THREADS`, tokio's own setting, overrides the count.
pub fn service_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        runtime.worker_threads(cores.saturating_sub(1).max(1));
    }
    runtime.enable_all().build()
}
