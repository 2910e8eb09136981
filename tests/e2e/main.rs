//! End-to-end tests of the real `paddock` binary: a real daemon per test on a real Unix
//! socket, a real SQLite data dir and real agent processes (the built-in scripted agent), all
//! inside one tempdir per test. See `harness.rs` for the layout.
//!
//! - `sessions`: turns, watches, lists, stops, restarts, budgets, timeouts, crashes (with
//!   insta snapshots of the wire events in `snapshots/`).
//! - `errors`: every OBEY-NNNN code reachable over the API, with its gRPC code.
//! - `rpcs`: the "existing" RPCs (events, activity push, Ping, GetState, Execute) and the
//!   campaign registry.
//! - `lifecycle`: Shutdown, SIGTERM, restart reconciliation (OBEY-2032), socket ownership.
//! - `cli`: the `paddock` command line against a daemon, autostart included.
//! - `latis`: latis' session commands (create --task, -c session.yaml, drivers, mounts, the
//!   latis list, status, delete, prune) and `session attach` in a real terminal (tmux).
//! - `runner_mode`: `daemon --runner`: agents survive a daemon SIGKILL and are taken back.
//! - `aria`: the Aria runtime API over `$HOME/.aria/runtime.sock`: tasks, notifications,
//!   sessions, containers, errors with details.
//! - `sunbeam`: the `CodeAgent.Session` stream: turns, detach / resume, two clients, the
//!   project context, EndSession, refusals (snapshot of one whole turn).

mod approvals;
mod aria;
mod badinput;
mod cli;
mod containers;
mod diskfull;
mod environments;
mod errors;
mod harness;
mod kube;
mod kube_fake;
mod latis;
mod lifecycle;
mod locked;
mod orphans;
mod paging;
mod podman;
mod qemu;
mod rpcs;
mod runner_mode;
mod security;
mod sessions;
mod ssh;
mod sunbeam;
mod systemd;
mod terminal;
mod top;
mod torture;
