//! paddock's shell: the daemon and the CLI around the pure core.
//!
//! The core decides, the shell does: every effect the core returns becomes I/O here (a child
//! process, a SQLite row, a gRPC message, a timer), and every I/O result becomes a core input.
//!
//! - [`daemon`]: start-up, the socket, signals, the event loop and its effect executor, the
//!   child-process supervisor.
//! - [`api`]: one module per protocol, each a mapping onto the same engine.
//! - [`providers`]: one adapter per agent: how to start it, how to read its lines.
//! - [`store`]: SQLite: migrations, the batched writer, queries.
//! - [`cli`]: the commands and their tables / JSON.

pub mod api;
pub mod cli;
pub mod daemon;
pub mod paths;
pub mod providers;
pub mod store;
