//! The CLI's one error type: why a command failed. [`super::exit_code`] prints it as
//! `error: …` (a JSON object with `--json`) and exits with its [`Exit`] code.

use std::path::PathBuf;

use crate::transport::ConnectError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The daemon refused or failed the request (or the CLI refused it first, as the daemon
    /// would: [`Error::refused`]). Its message is shown as it is (it starts with the OBEY code);
    /// programs read the code from the status ([`crate::transport::obey_code`]).
    #[error("{}", .0.message())]
    Daemon(#[from] tonic::Status),
    /// The daemon refused or failed one step of a command that takes several (`delete` stops
    /// the session first; `attach` reconnects its streams).
    #[error("{step}: {}", .source.message())]
    Step {
        step: String,
        #[source]
        source: tonic::Status,
    },
    /// No daemon answers on the socket.
    #[error("no paddock daemon answers on {}: {}", .0.path.display(), .0.source)]
    NoDaemon(ConnectError),
    /// No daemon answers on the socket, and `--no-autostart` forbids starting one.
    #[error("no paddock daemon answers on {}: {} (and --no-autostart is set)", .0.path.display(), .0.source)]
    NoAutostart(ConnectError),
    /// The socket belongs to another user: nothing is sent to it.
    #[error(transparent)]
    Untrusted(#[from] crate::socket::Untrusted),
    /// A daemon was started but did not answer in time.
    #[error(
        "started a daemon but it did not answer within {wait_s}s: no paddock daemon answers on {}: {} (see {})",
        source.path.display(), source.source, log.display()
    )]
    Autostart {
        wait_s: u64,
        log: PathBuf,
        #[source]
        source: ConnectError,
    },
    /// A daemon was started and exited before it answered (a bad config file, another daemon
    /// on the data dir): what it said last, from its log.
    #[error("started a daemon but it exited at once ({status}; its log: {}): {said}", log.display())]
    AutostartExited {
        status: std::process::ExitStatus,
        said: String,
        log: PathBuf,
    },
    /// A daemon took the connection but did not answer in time.
    #[error("the daemon on {} did not answer within {wait_s}s", socket.display())]
    Silent { socket: PathBuf, wait_s: u64 },
    /// A local file, directory or process could not be used.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The command's arguments or its input file are wrong; said before asking the daemon.
    #[error("{0}")]
    Usage(String),
    /// The daemon answered something this CLI cannot show (a stream that failed repeatedly, an
    /// unknown status number).
    #[error("{0}")]
    Protocol(String),
    /// The command ran and has already said what failed (a prune whose deletes failed);
    /// nothing more to print.
    #[error("the command failed")]
    Reported,
    /// The agent's turn ended in an error, already shown with the turn's activity.
    #[error("the agent's turn ended in an error")]
    AgentFailed,
    /// Ctrl-C; what became of the turn is already said.
    #[error("interrupted")]
    Interrupted,
    /// Standard output was closed by its reader (`paddock session list | head`): the command
    /// stops there and exits 0, saying nothing.
    #[error("standard output was closed")]
    StdoutClosed,
}

/// What a failed command exits with, by kind of failure (`paddock --help` lists them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Anything else (a local file, a protocol surprise, a failure already reported).
    Failed = 1,
    /// The command line or its input is wrong (clap's own errors exit 2 as well).
    Usage = 2,
    /// What the command names does not exist (a session, campaign, approval, task).
    NotFound = 3,
    /// The daemon refused: wrong state, a limit, already exists, not allowed.
    Refused = 4,
    /// No daemon answers (or it went away, or a call timed out).
    Unreachable = 5,
    /// The agent failed: its turn ended in an error, it crashed, ran out of budget or time.
    AgentFailed = 6,
    /// Ctrl-C (128 + SIGINT, as shells report it).
    Interrupted = 130,
}

/// The exit codes, for `--help`.
pub const EXIT_CODES_HELP: &str = "Exit codes: 0 success · 1 other failure · 2 usage (bad \
arguments or input) · 3 not found · 4 refused by the daemon (wrong state, a limit, not allowed) · \
5 daemon unreachable · 6 the agent failed (its turn ended in an error, it crashed, ran out of \
budget or time) · 130 interrupted (Ctrl-C)";

impl Error {
    /// The kind of failure, for the exit code.
    pub fn exit(&self) -> Exit {
        use paddock_core::ErrorCode as C;
        use tonic::Code;
        let status = match self {
            Error::Daemon(s) | Error::Step { source: s, .. } => s,
            Error::NoDaemon(_)
            | Error::NoAutostart(_)
            | Error::Autostart { .. }
            | Error::AutostartExited { .. }
            | Error::Silent { .. } => return Exit::Unreachable,
            Error::Untrusted(_) => return Exit::Refused,
            Error::Usage(_) => return Exit::Usage,
            Error::AgentFailed => return Exit::AgentFailed,
            Error::Interrupted => return Exit::Interrupted,
            Error::Io { .. } | Error::Protocol(_) | Error::Reported | Error::StdoutClosed => {
                return Exit::Failed
            }
        };
        match crate::transport::obey_code(status) {
            Some(
                C::ProviderCrashed
                | C::ConnectionLost
                | C::BudgetExceeded
                | C::Timeout
                | C::GracefulStopTimedOut,
            ) => return Exit::AgentFailed,
            Some(C::StorageFull | C::StorageLocked) => return Exit::Refused,
            _ => {}
        }
        match status.code() {
            Code::NotFound => Exit::NotFound,
            Code::InvalidArgument => Exit::Usage,
            Code::FailedPrecondition
            | Code::AlreadyExists
            | Code::ResourceExhausted
            | Code::PermissionDenied
            | Code::OutOfRange
            | Code::Aborted
            | Code::Unimplemented => Exit::Refused,
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => Exit::Unreachable,
            _ => Exit::Failed,
        }
    }

    /// The error as JSON (`--json`): its text, the exit code, and the daemon's code and
    /// status when it came from the daemon.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "error": self.to_string(),
            "exit_code": self.exit() as i32,
        });
        if let Error::Daemon(s) | Error::Step { source: s, .. } = self {
            v["grpc_code"] = format!("{:?}", s.code()).into();
            if let Some(c) = crate::transport::obey_code(s) {
                v["obey_code"] = c.to_string().into();
            }
        }
        v
    }

    /// An I/O failure on `what` (a path, "the current directory", …).
    pub fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.to_string();
        move |source| Error::Io { what, source }
    }

    /// A path the command line (or its input file) names that cannot be read: bad input,
    /// exit 2, like any wrong argument.
    pub fn input(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.to_string();
        move |source| Error::Usage(format!("{what}: {source}"))
    }

    /// A refusal the CLI makes before asking, as the daemon would make it: the same status
    /// (its OBEY code in the message and the details), so the same exit code and `--json`
    /// fields.
    pub fn refused(code: paddock_core::ErrorCode, message: impl Into<String>) -> Error {
        Error::Daemon(crate::transport::core_status(&paddock_core::Error::new(
            code, message,
        )))
    }

    /// A provider name no provider has, refused as the daemon would (OBEY-2002), with the names
    /// there are.
    pub fn unknown_provider(name: &str) -> Error {
        let names: Vec<&str> = paddock_core::Provider::ALL
            .iter()
            .map(|p| p.name())
            .collect();
        Error::refused(
            paddock_core::ErrorCode::ProviderNotSupported,
            format!("unknown provider \"{name}\" ({})", names.join(", ")),
        )
    }
}

pub type Result<T> = std::result::Result<T, Error>;
