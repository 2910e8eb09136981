//! The OBEY-NNNN error registry as a typed enum.
//!
//! The registry is fixed by the obey seed; every refusal the core makes carries one of these
//! codes. The gRPC status a code maps to is decided here too ([`ErrorCode::kind`]) so that
//! every protocol reports the same failure the same way; the shell only translates
//! [`ErrorKind`] into `tonic::Code`.

use std::fmt;

/// One entry of the OBEY-NNNN registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorCode {
    /// OBEY-2000 Agent session error (generic).
    Generic,
    /// OBEY-2001 Campaign not found.
    CampaignNotFound,
    /// OBEY-2002 Provider not supported.
    ProviderNotSupported,
    /// OBEY-2003 Model not supported by provider.
    ModelNotSupported,
    /// OBEY-2004 Session creation failed.
    CreationFailed,
    /// OBEY-2005 Campaign sandbox initialization failed.
    SandboxInitFailed,
    /// OBEY-2010 Session not found.
    SessionNotFound,
    /// OBEY-2011 Session not in expected state.
    WrongState,
    /// OBEY-2012 Message delivery failed.
    DeliveryFailed,
    /// OBEY-2013 Token budget exceeded.
    BudgetExceeded,
    /// OBEY-2014 Session timeout reached.
    Timeout,
    /// OBEY-2020 Session already stopped.
    AlreadyStopped,
    /// OBEY-2021 Graceful stop timed out (session force-killed).
    GracefulStopTimedOut,
    /// OBEY-2030 Provider adapter not initialized.
    AdapterNotInitialized,
    /// OBEY-2031 Provider process crashed.
    ProviderCrashed,
    /// OBEY-2032 Provider connection lost.
    ConnectionLost,
    /// OBEY-2040 Approval not found (paddock extension).
    ApprovalNotFound,
    /// OBEY-2041 Approval already resolved (paddock extension).
    ApprovalResolved,
    /// OBEY-2050 The daemon cannot store anything now (disk full); nothing new is taken until
    /// space is back (paddock extension).
    StorageFull,
    /// OBEY-2051 The daemon is shutting down: nothing new is taken (paddock extension; the
    /// seed has no code for it, and 2030 "provider adapter not initialized" misled clients).
    ShuttingDown,
    /// OBEY-2052 The daemon cannot store anything now: another program holds its database's
    /// write lock (a `sqlite3` shell in a transaction, a backup); nothing new is taken until
    /// it lets go (paddock extension).
    StorageLocked,
    /// OBEY-2060 Container not found (paddock extension: Aria's ContainerService).
    ContainerNotFound,
}

/// The class of a failure; the shell maps it one-to-one onto a gRPC status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    NotFound,
    InvalidArgument,
    FailedPrecondition,
    ResourceExhausted,
    DeadlineExceeded,
    Unavailable,
    Internal,
}

impl ErrorCode {
    /// Every code, in registry order.
    pub const ALL: [ErrorCode; 22] = [
        ErrorCode::Generic,
        ErrorCode::CampaignNotFound,
        ErrorCode::ProviderNotSupported,
        ErrorCode::ModelNotSupported,
        ErrorCode::CreationFailed,
        ErrorCode::SandboxInitFailed,
        ErrorCode::SessionNotFound,
        ErrorCode::WrongState,
        ErrorCode::DeliveryFailed,
        ErrorCode::BudgetExceeded,
        ErrorCode::Timeout,
        ErrorCode::AlreadyStopped,
        ErrorCode::GracefulStopTimedOut,
        ErrorCode::AdapterNotInitialized,
        ErrorCode::ProviderCrashed,
        ErrorCode::ConnectionLost,
        ErrorCode::ApprovalNotFound,
        ErrorCode::ApprovalResolved,
        ErrorCode::StorageFull,
        ErrorCode::ShuttingDown,
        ErrorCode::StorageLocked,
        ErrorCode::ContainerNotFound,
    ];

    /// The registry number, e.g. `2013`.
    pub fn number(self) -> u16 {
        match self {
            ErrorCode::Generic => 2000,
            ErrorCode::CampaignNotFound => 2001,
            ErrorCode::ProviderNotSupported => 2002,
            ErrorCode::ModelNotSupported => 2003,
            ErrorCode::CreationFailed => 2004,
            ErrorCode::SandboxInitFailed => 2005,
            ErrorCode::SessionNotFound => 2010,
            ErrorCode::WrongState => 2011,
            ErrorCode::DeliveryFailed => 2012,
            ErrorCode::BudgetExceeded => 2013,
            ErrorCode::Timeout => 2014,
            ErrorCode::AlreadyStopped => 2020,
            ErrorCode::GracefulStopTimedOut => 2021,
            ErrorCode::AdapterNotInitialized => 2030,
            ErrorCode::ProviderCrashed => 2031,
            ErrorCode::ConnectionLost => 2032,
            ErrorCode::ApprovalNotFound => 2040,
            ErrorCode::ApprovalResolved => 2041,
            ErrorCode::StorageFull => 2050,
            ErrorCode::ShuttingDown => 2051,
            ErrorCode::StorageLocked => 2052,
            ErrorCode::ContainerNotFound => 2060,
        }
    }

    /// Parses `"OBEY-2013"` (or a message starting with it) back into a code.
    pub fn parse(text: &str) -> Option<ErrorCode> {
        let digits = text.strip_prefix("OBEY-")?.get(..4)?;
        let n: u16 = digits.parse().ok()?;
        ErrorCode::ALL.into_iter().find(|c| c.number() == n)
    }

    /// The registry's one-line description.
    pub fn description(self) -> &'static str {
        match self {
            ErrorCode::Generic => "agent session error",
            ErrorCode::CampaignNotFound => "campaign not found",
            ErrorCode::ProviderNotSupported => "provider not supported",
            ErrorCode::ModelNotSupported => "model not supported by provider",
            ErrorCode::CreationFailed => "session creation failed",
            ErrorCode::SandboxInitFailed => "campaign sandbox initialization failed",
            ErrorCode::SessionNotFound => "session not found",
            ErrorCode::WrongState => "session not in expected state",
            ErrorCode::DeliveryFailed => "message delivery failed",
            ErrorCode::BudgetExceeded => "token budget exceeded",
            ErrorCode::Timeout => "session timeout reached",
            ErrorCode::AlreadyStopped => "session already stopped",
            ErrorCode::GracefulStopTimedOut => "graceful stop timed out (session force-killed)",
            ErrorCode::AdapterNotInitialized => "provider adapter not initialized",
            ErrorCode::ProviderCrashed => "provider process crashed",
            ErrorCode::ConnectionLost => "provider connection lost",
            ErrorCode::ApprovalNotFound => "approval not found",
            ErrorCode::ApprovalResolved => "approval already resolved",
            ErrorCode::StorageFull => "daemon storage full",
            ErrorCode::ShuttingDown => "daemon shutting down",
            ErrorCode::StorageLocked => "daemon storage locked by another program",
            ErrorCode::ContainerNotFound => "container not found",
        }
    }

    /// The gRPC class of this failure.
    pub fn kind(self) -> ErrorKind {
        match self {
            ErrorCode::CampaignNotFound
            | ErrorCode::SessionNotFound
            | ErrorCode::ApprovalNotFound
            | ErrorCode::ContainerNotFound => ErrorKind::NotFound,
            ErrorCode::ProviderNotSupported | ErrorCode::ModelNotSupported => {
                ErrorKind::InvalidArgument
            }
            ErrorCode::CreationFailed
            | ErrorCode::WrongState
            | ErrorCode::AlreadyStopped
            | ErrorCode::ApprovalResolved => ErrorKind::FailedPrecondition,
            ErrorCode::BudgetExceeded | ErrorCode::StorageFull => ErrorKind::ResourceExhausted,
            ErrorCode::Timeout | ErrorCode::GracefulStopTimedOut => ErrorKind::DeadlineExceeded,
            ErrorCode::DeliveryFailed
            | ErrorCode::AdapterNotInitialized
            | ErrorCode::ProviderCrashed
            | ErrorCode::ConnectionLost
            | ErrorCode::ShuttingDown
            | ErrorCode::StorageLocked => ErrorKind::Unavailable,
            ErrorCode::Generic | ErrorCode::SandboxInitFailed => ErrorKind::Internal,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OBEY-{}", self.number())
    }
}

/// A refusal or failure: a registry code and a human-readable message.
///
/// `Display` renders `OBEY-2001: campaign "x" not found`: the form every status message and
/// every stored `error_message` takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: ErrorCode,
    pub message: String,
}

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_unique_and_parse_back() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(&code.to_string()), Some(code));
            let msg = Error::new(code, "x").to_string();
            assert!(msg.starts_with(&format!("OBEY-{}: ", code.number())));
            assert_eq!(ErrorCode::parse(&msg), Some(code));
        }
        let mut n: Vec<u16> = ErrorCode::ALL.iter().map(|c| c.number()).collect();
        n.dedup();
        assert_eq!(n.len(), ErrorCode::ALL.len());
        assert_eq!(ErrorCode::parse("OBEY-9999"), None);
        assert_eq!(ErrorCode::parse("nope"), None);
    }

    #[test]
    fn kinds_follow_the_registry() {
        assert_eq!(ErrorCode::SessionNotFound.kind(), ErrorKind::NotFound);
        assert_eq!(
            ErrorCode::BudgetExceeded.kind(),
            ErrorKind::ResourceExhausted
        );
        assert_eq!(ErrorCode::Timeout.kind(), ErrorKind::DeadlineExceeded);
        assert_eq!(ErrorCode::WrongState.kind(), ErrorKind::FailedPrecondition);
        assert_eq!(ErrorCode::ProviderCrashed.kind(), ErrorKind::Unavailable);
        assert_eq!(
            ErrorCode::ModelNotSupported.kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(ErrorCode::Generic.kind(), ErrorKind::Internal);
    }
}
