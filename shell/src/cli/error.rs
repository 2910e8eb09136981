//! The CLI's one error type: why a command failed. [`super::exit_code`] prints it as
//! `error: …` and exits with [`Error::EXIT_CODE`].

use std::path::PathBuf;

use crate::transport::ConnectError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The daemon refused or failed the request. Its message is shown as it is (it starts with
    /// the OBEY code); programs read the code from the status ([`crate::transport::obey_code`]).
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
    #[error("{0}")]
    Untrusted(String),
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
    /// The command ran and has already said what failed (a turn that ended in an error, a prune
    /// whose deletes failed); nothing more to print.
    #[error("the command failed")]
    Reported,
}

impl Error {
    /// Every failure exits 1 (scripts and the e2e suite rely on it; clap's own usage errors
    /// exit 2 before a command runs).
    pub const EXIT_CODE: i32 = 1;

    /// An I/O failure on `what` (a path, "the current directory", …).
    pub fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.to_string();
        move |source| Error::Io { what, source }
    }

    /// A provider name no provider has, refused as the daemon would (OBEY-2002), with the names
    /// there are.
    pub fn unknown_provider(name: &str) -> Error {
        let names: Vec<&str> = paddock_core::Provider::ALL
            .iter()
            .map(|p| p.name())
            .collect();
        Error::Usage(format!(
            "OBEY-2002: unknown provider \"{name}\" ({})",
            names.join(", ")
        ))
    }
}

pub type Result<T> = std::result::Result<T, Error>;
