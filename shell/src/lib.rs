//! paddock's shell: the daemon and the CLI around the pure core.
//!
//! The core decides, the shell does: every effect the core returns becomes I/O here (a child
//! process, a SQLite row, a gRPC message, a timer), and every I/O result becomes a core input.
//!
//! - [`daemon`]: start-up, signals, the event loop and its effect executor, the child-process
//!   supervisor; its typed port ([`daemon::Handle`]).
//! - [`serve`]: the composition root: starts the daemon and serves [`api`] on its sockets.
//! - [`api`]: one module per protocol, each a mapping onto the same engine.
//! - [`providers`]: one adapter per agent: how to start it, how to read its lines.
//! - [`store`]: SQLite: migrations, the batched writer, queries.
//! - [`cli`]: the commands and their tables / JSON.
//! - [`runner`]: `paddock runner`, the centaurx `runner.v1.Runner` service in its own process.
//! - [`transport`]: what servers and clients share about the wire (OBEY codes in statuses).
//! - [`socket`]: claiming a Unix socket (0700 dir, 0600 socket, stale ones replaced).

pub mod api;
pub use paddock_cli as cli;
pub use paddock_config as config;
pub use paddock_daemon as daemon;
pub use paddock_env as env;
pub use paddock_sys::confined;
pub use paddock_sys::contain;
#[cfg(test)]
mod layout;
pub use paddock_agents as providers;
pub use paddock_runner as runner;
pub use paddock_support::secret;
pub use paddock_sys::paths;
pub use paddock_sys::proc;
pub mod serve;
pub use paddock_store as store;
pub use paddock_support::text;
pub use paddock_sys::socket;
pub use paddock_sys::transport;

#[cfg(test)]
mod fuzz;
