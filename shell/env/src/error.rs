//! What went wrong making, entering or removing an environment: the crate's one error type.
//!
//! Every variant reads as a sentence a user can act on (what to install, what to change, what
//! the host or the cluster said); the daemon turns it into a refusal's text (OBEY-2005) or a
//! session's failure reason only where it hands it to the core. The variants that matter to a
//! caller's decision are kept apart: [`Error::is_transient`] says whether the place the
//! environment is could not be reached *now* (a relay's heal tries again later), which no
//! caller has to read out of the words.

use std::io;
use std::path::PathBuf;

/// See the module's documentation (`error.rs`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request, or this host, cannot have the environment: the words say what to change.
    /// Found before anything is made.
    #[error("{0}")]
    Refused(String),
    /// The spec itself is inconsistent: what no driver could honour (the core's check).
    #[error(transparent)]
    Spec(#[from] paddock_core::EnvSpecError),
    /// A program the environment needs is not on PATH.
    #[error("{needed_by} needs {program}, which is not on PATH: install {install}")]
    NotInstalled {
        /// What needs it (`--worktree`, `the podman driver`).
        needed_by: &'static str,
        program: &'static str,
        /// What to install (a package, with its name in the common distributions).
        install: &'static str,
    },
    /// A program could not be started at all.
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    /// A file or directory of the environment could not be made, read or written.
    #[error("cannot {op} {}: {source}", path.display())]
    File {
        /// `make`, `read`, `write`, …
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Something that ran (git, podman, qemu, a command on the host or in the pod) failed, or
    /// found the environment other than it must be: what it said.
    #[error("{0}")]
    Failed(String),
    /// ssh did not get to the host (a dropped network, a host still booting, a refused login
    /// or host key): ssh's own words, and what to do for the common ones.
    #[error("cannot reach {destination} over ssh: {said}{hint}")]
    Unreachable {
        destination: String,
        said: String,
        hint: String,
    },
    /// The Kubernetes API server refused a call, or did not answer.
    #[error("{doing}: {}", kube_words(source))]
    Kube {
        /// What was asked (`cannot create pod ns/name`).
        doing: String,
        #[source]
        source: kube::Error,
    },
    /// The runner there could not be started.
    #[error(transparent)]
    Runner(#[from] paddock_runner::client::StartError),
    /// A runtime for the async clients (kube-rs, the runner's) could not be made.
    #[error("cannot start a runtime: {0}")]
    Runtime(#[source] io::Error),
    /// What was being done when `source` failed.
    #[error("{doing}: {source}")]
    During {
        doing: String,
        #[source]
        source: Box<Error>,
    },
}

/// The result of the crate's work.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A file operation's error.
    pub(crate) fn file(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::File {
            op,
            path: path.into(),
            source,
        }
    }

    /// A program's failure to start.
    pub(crate) fn spawn(program: impl AsRef<std::path::Path>, source: io::Error) -> Error {
        Error::Spawn {
            program: program.as_ref().display().to_string(),
            source,
        }
    }

    /// This error, said to have happened while `doing`.
    pub(crate) fn during(self, doing: impl Into<String>) -> Error {
        Error::During {
            doing: doing.into(),
            source: Box::new(self),
        }
    }

    /// Whether the place the environment is could not be reached now (ssh did not connect, the
    /// cluster's API server did not answer): another try later may work.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unreachable { .. } => true,
            Error::Kube { source, .. } => !matches!(source, kube::Error::Api(_)),
            Error::During { source, .. } => source.is_transient(),
            _ => false,
        }
    }
}

/// An API server's answer in words, with what to do for the common refusals.
fn kube_words(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            let hint = match (s.code, s.reason.as_str()) {
                (401, _) => " (the kubeconfig's credentials were refused: log in again)",
                (403, _) if s.message.contains("error looking up service account") => {
                    " (create the service account in that namespace, or name another)"
                }
                (403, _) => " (the kubeconfig's user may not do this there: ask for the RBAC role)",
                (404, _) if s.message.starts_with("namespaces ") => {
                    " (create it — `kubectl create namespace` — or name another)"
                }
                _ => "",
            };
            format!("{}{hint}", s.message)
        }
        e => format!("cannot reach the cluster's API server: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(code: u16, message: &str) -> kube::Error {
        let status: kube::core::Status =
            serde_json::from_value(serde_json::json!({ "code": code, "message": message }))
                .expect("a Status");
        kube::Error::Api(Box::new(status))
    }

    fn kube(source: kube::Error) -> Error {
        Error::Kube {
            doing: "cannot create pod ns/p".into(),
            source,
        }
    }

    #[test]
    fn only_a_place_that_did_not_answer_is_worth_another_try() {
        let unreachable = Error::Unreachable {
            destination: "me@host".into(),
            said: "Connection refused".into(),
            hint: String::new(),
        };
        assert!(unreachable.is_transient());
        assert!(kube(kube::Error::LinesCodecMaxLineLengthExceeded).is_transient());
        assert!(!kube(refusal(403, "forbidden")).is_transient());
        assert!(
            unreachable.during("healing").is_transient(),
            "whatever wraps it"
        );
        assert!(!Error::Failed("no".into()).is_transient());
        assert!(!Error::Refused("no".into()).is_transient());
    }

    #[test]
    fn the_words_say_what_failed_and_what_to_do() {
        assert_eq!(
            kube(refusal(401, "Unauthorized")).to_string(),
            "cannot create pod ns/p: Unauthorized (the kubeconfig's credentials were refused: \
             log in again)"
        );
        assert_eq!(
            kube(refusal(404, "namespaces \"x\" not found")).to_string(),
            "cannot create pod ns/p: namespaces \"x\" not found (create it — `kubectl create \
             namespace` — or name another)"
        );
        assert!(kube(kube::Error::LinesCodecMaxLineLengthExceeded)
            .to_string()
            .starts_with("cannot create pod ns/p: cannot reach the cluster's API server: "));
        let missing = Error::NotInstalled {
            needed_by: "--worktree",
            program: "git",
            install: "git",
        };
        assert_eq!(
            missing.to_string(),
            "--worktree needs git, which is not on PATH: install git"
        );
        let io = Error::file(
            "write",
            "/x/made",
            io::Error::from(io::ErrorKind::PermissionDenied),
        );
        assert_eq!(io.to_string(), "cannot write /x/made: permission denied");
        assert!(
            std::error::Error::source(&io).is_some(),
            "the io error is kept"
        );
        let during = Error::Failed("fatal: bad".into()).during("git worktree add failed");
        assert_eq!(during.to_string(), "git worktree add failed: fatal: bad");
    }
}
