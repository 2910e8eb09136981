//! Human approvals: what an agent may do without asking, and the requests that wait for a
//! human (or a client) when it may not.
//!
//! An agent asks through its adapter (Claude Code's `can_use_tool`, ACP's
//! `session/request_permission`, paddock's own loop): the session's [`Policy`] settles it at
//! once, or a [`Approval`] is opened, the session goes `WAITING`, and it stays so until every
//! open request is resolved — exactly once, by [`Decision`] from any client, or by expiry
//! ([`ApprovalSettings`]). Everything here is pure; the session machine applies it.

use std::collections::BTreeMap;

use crate::model::{RunId, SessionId};
use crate::time::Timestamp;

/// Identifies one request for a human (a ULID made by the shell).
pub type ApprovalId = String;

/// Requests one session may have open at once; an agent that asks more is told no at once.
pub const MAX_OPEN_REQUESTS: usize = 16;

/// The longest deny reason, answer or client-tool result accepted (an answer is one line on
/// the agent's stdin, which the runner bounds too).
pub const ANSWER_MAX: usize = 256 * 1024;

/// What an agent asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AskKind {
    /// May it run this tool with this input? Approve or deny.
    Permission = 1,
    /// A question for the human; the answer is text.
    Question = 2,
    /// A tool the client executes (sunbeam's `is_local`); the answer is its result.
    ClientTool = 3,
}

impl AskKind {
    pub const ALL: [AskKind; 3] = [AskKind::Permission, AskKind::Question, AskKind::ClientTool];

    pub fn number(self) -> i32 {
        self as i32
    }

    pub fn from_number(n: i32) -> Option<AskKind> {
        AskKind::ALL.into_iter().find(|k| k.number() == n)
    }

    pub fn name(self) -> &'static str {
        match self {
            AskKind::Permission => "permission",
            AskKind::Question => "question",
            AskKind::ClientTool => "client_tool",
        }
    }
}

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ApprovalState {
    Pending = 1,
    Approved = 2,
    Denied = 3,
    /// A question answered, or a client tool's result delivered.
    Answered = 4,
    /// Nobody answered in time: the session's default was applied.
    Expired = 5,
    /// The turn, the process or the session ended first; the agent was told no.
    Cancelled = 6,
}

impl ApprovalState {
    pub const ALL: [ApprovalState; 6] = [
        ApprovalState::Pending,
        ApprovalState::Approved,
        ApprovalState::Denied,
        ApprovalState::Answered,
        ApprovalState::Expired,
        ApprovalState::Cancelled,
    ];

    pub fn number(self) -> i32 {
        self as i32
    }

    pub fn from_number(n: i32) -> Option<ApprovalState> {
        ApprovalState::ALL.into_iter().find(|k| k.number() == n)
    }

    pub fn name(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Denied => "denied",
            ApprovalState::Answered => "answered",
            ApprovalState::Expired => "expired",
            ApprovalState::Cancelled => "cancelled",
        }
    }
}

/// A human's (or a client's) answer to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Approve,
    Deny {
        reason: String,
    },
    /// The answer to a question, or a client tool's result.
    Answer {
        text: String,
        is_error: bool,
    },
}

/// One request for a human, as stored and as shown to clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    pub id: ApprovalId,
    pub session: SessionId,
    /// The process that asked: the answer goes to it and to no later one.
    pub run: RunId,
    /// The agent's own id for the request (the `control_request`'s `request_id`).
    pub key: String,
    pub kind: AskKind,
    /// The tool (for a question: the tool that carries it, if any).
    pub tool: String,
    /// The tool's input as JSON text.
    pub input: String,
    /// One human-readable line: what is asked.
    pub summary: String,
    /// The turn it was asked in.
    pub turn: Option<u64>,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
    pub state: ApprovalState,
    /// The deny reason, the answer text, the tool result, or why it expired / was cancelled.
    pub answer: String,
    /// For a client tool: the result is an error.
    pub is_error: bool,
    /// What the agent is (or was) told: go ahead (an approval, an answer, a result, an
    /// expiry whose default is allow) or no.
    pub allowed: bool,
    /// Who resolved it ("cli", "sunbeam", "obey", "policy", "expiry", …).
    pub resolved_by: String,
    pub resolved_at: Option<Timestamp>,
}

impl Approval {
    pub fn is_pending(&self) -> bool {
        self.state == ApprovalState::Pending
    }

    /// `": <answer>"`, or nothing when there is none: how notes and refusals end.
    pub fn answer_suffix(&self) -> String {
        if self.answer.is_empty() {
            String::new()
        } else {
            format!(": {}", self.answer)
        }
    }
}

/// What a session may let its agent do without asking (`provider_config["permissions"]`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Policy {
    /// `allow-all` (the default): every tool is allowed, questions are answered empty.
    #[default]
    AllowAll,
    /// `deny`: every tool is denied.
    Deny,
    /// `allow:T1,T2`: these tools are allowed, every other is denied.
    Allow(Vec<String>),
    /// `ask` / `ask:T1,T2`: these tools are allowed, every other tool and every question
    /// waits for a human.
    Ask(Vec<String>),
}

/// Why [`Policy::parse`] refuses a `permissions` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// None of the policies (the value, trimmed).
    #[error(
        "permissions must be allow-all, deny, allow:Tool1,Tool2, ask or ask:Tool1,Tool2 \
         (got {0:?})"
    )]
    Unknown(String),
}

/// What the policy says about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyAnswer {
    Allow,
    Deny(String),
    AskHuman,
}

impl Policy {
    /// `provider_config["permissions"]` (none or empty: [`Policy::AllowAll`]).
    pub fn parse(s: Option<&str>) -> Result<Policy, PolicyError> {
        let list = |rest: &str| -> Vec<String> {
            rest.split(',')
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .collect()
        };
        match s.map(str::trim) {
            None | Some("") | Some("allow-all") => Ok(Policy::AllowAll),
            Some("deny") | Some("deny-all") => Ok(Policy::Deny),
            Some("ask") => Ok(Policy::Ask(Vec::new())),
            Some(l) if l.starts_with("allow:") => Ok(Policy::Allow(list(&l["allow:".len()..]))),
            Some(l) if l.starts_with("ask:") => Ok(Policy::Ask(list(&l["ask:".len()..]))),
            Some(other) => Err(PolicyError::Unknown(other.to_string())),
        }
    }

    /// True when a tool runs without asking anyone.
    pub fn allows(&self, tool: &str) -> bool {
        match self {
            Policy::AllowAll => true,
            Policy::Deny => false,
            Policy::Allow(list) | Policy::Ask(list) => list.iter().any(|t| t == tool),
        }
    }

    /// True when requests this policy does not settle wait for a human.
    pub fn asks(&self) -> bool {
        matches!(self, Policy::Ask(_))
    }

    /// Settles a request if it can. Client tools are never the policy's business: the client
    /// runs them.
    pub fn decide(&self, kind: AskKind, tool: &str) -> PolicyAnswer {
        match kind {
            AskKind::ClientTool => PolicyAnswer::AskHuman,
            AskKind::Question if self.asks() => PolicyAnswer::AskHuman,
            AskKind::Question => PolicyAnswer::Deny(
                "paddock: nobody is asked in this session (its permissions are not `ask`); \
                 decide for yourself"
                    .to_string(),
            ),
            AskKind::Permission if self.allows(tool) => PolicyAnswer::Allow,
            AskKind::Permission if self.asks() => PolicyAnswer::AskHuman,
            AskKind::Permission => PolicyAnswer::Deny(format!(
                "paddock: the session's permission policy denies {tool}"
            )),
        }
    }
}

/// The `permissions` a session gets when it names none — the safe default:
///
/// - inside an isolating driver (bubblewrap) the sandbox is the guard: `allow-all`;
/// - on the host, reads run and writes and commands wait for a human: `ask` for the agents
///   that ask before a write or a command themselves and let reads run (Claude Code, the
///   scripted agent, ACP agents, OpenClaw); `ask:read_file,list_dir` for paddock's own
///   openai-api loop (which asks for every tool); `deny` for `codex exec` and headless gemini,
///   which cannot wait for an answer — their read-only modes (codex's read-only sandbox,
///   gemini's read-only tools), so they read and change nothing.
pub fn default_permissions(
    provider: crate::Provider,
    env: &crate::environment::EnvSpec,
) -> &'static str {
    use crate::Provider as P;
    if env.driver.isolates() {
        return "allow-all";
    }
    match provider {
        P::ClaudeCode | P::Scripted | P::Acp | P::OpenClaw => "ask",
        P::OpenAiApi => "ask:read_file,list_dir",
        P::Codex | P::Gemini => "deny",
    }
}

/// How long a request waits for a human and what happens then
/// (`provider_config["approval_timeout"]`, `provider_config["approval_default"]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApprovalSettings {
    pub timeout_ms: u64,
    /// On expiry a permission is granted (`allow`) instead of refused (the default). Never a
    /// question or a client tool: nobody can make up their answers.
    pub default_allow: bool,
}

/// 15 minutes, then deny.
impl Default for ApprovalSettings {
    fn default() -> Self {
        ApprovalSettings {
            timeout_ms: Self::DEFAULT_TIMEOUT_MS,
            default_allow: false,
        }
    }
}

impl ApprovalSettings {
    /// 15 minutes, then deny.
    pub const DEFAULT_TIMEOUT_MS: u64 = 15 * 60 * 1000;
    /// The longest wait a session may ask for: a week.
    pub const MAX_TIMEOUT_MS: u64 = 7 * 24 * 3600 * 1000;

    pub fn parse(
        provider_config: &BTreeMap<String, String>,
    ) -> Result<Self, crate::provider_config::ConfigError> {
        use crate::provider_config::ConfigError;
        let timeout_ms = match provider_config.get("approval_timeout") {
            None => Self::DEFAULT_TIMEOUT_MS,
            Some(s) => parse_duration_ms(s)
                .filter(|ms| (1..=Self::MAX_TIMEOUT_MS).contains(ms))
                .ok_or_else(|| ConfigError {
                    key: "approval_timeout",
                    reason: format!(
                        "approval_timeout must be a duration like 90s, 15m or 2h, at most 7 days \
                         (got {s:?})"
                    ),
                })?,
        };
        let default_allow = match provider_config.get("approval_default").map(|s| s.trim()) {
            None | Some("deny") => false,
            Some("allow") => true,
            Some(other) => {
                return Err(ConfigError {
                    key: "approval_default",
                    reason: format!("approval_default must be deny or allow (got {other:?})"),
                })
            }
        };
        Ok(ApprovalSettings {
            timeout_ms,
            default_allow,
        })
    }
}

/// `250ms`, `90s`, `15m`, `2h`, `1d`, or a bare number of seconds.
pub fn parse_duration_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let factor = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_asks_on_the_host_and_trusts_the_sandbox() {
        use crate::environment::{Driver, EnvSpec};
        let host = EnvSpec::default();
        let sandbox = EnvSpec {
            driver: Driver::Bubblewrap,
            ..EnvSpec::default()
        };
        for p in crate::Provider::ALL {
            assert_eq!(default_permissions(p, &sandbox), "allow-all");
            let d = default_permissions(p, &host);
            let policy = Policy::parse(Some(d)).expect("a valid policy");
            assert!(
                !matches!(policy, Policy::AllowAll),
                "{p:?} on the host: {d}"
            );
            // Whatever cannot ask is never told to.
            if matches!(p, crate::Provider::Codex | crate::Provider::Gemini) {
                assert!(!policy.asks(), "{p:?}");
            }
        }
    }

    #[test]
    fn policies_parse_and_decide() {
        assert_eq!(Policy::parse(None), Ok(Policy::AllowAll));
        assert_eq!(Policy::parse(Some("deny")), Ok(Policy::Deny));
        assert_eq!(Policy::parse(Some("ask")), Ok(Policy::Ask(vec![])));
        let ask = Policy::parse(Some("ask: Read, LS")).unwrap();
        assert_eq!(ask, Policy::Ask(vec!["Read".into(), "LS".into()]));
        let refused = Policy::parse(Some(" maybe ")).unwrap_err();
        assert_eq!(refused, PolicyError::Unknown("maybe".into()));
        assert_eq!(
            refused.to_string(),
            "permissions must be allow-all, deny, allow:Tool1,Tool2, ask or ask:Tool1,Tool2 \
             (got \"maybe\")"
        );
        let config = crate::ProviderConfig::parse([("permissions".into(), "maybe".into())].into());
        assert_eq!(config.unwrap_err().reason, refused.to_string());

        assert_eq!(ask.decide(AskKind::Permission, "Read"), PolicyAnswer::Allow);
        assert_eq!(
            ask.decide(AskKind::Permission, "Bash"),
            PolicyAnswer::AskHuman
        );
        assert_eq!(ask.decide(AskKind::Question, ""), PolicyAnswer::AskHuman);
        let allow = Policy::parse(Some("allow:Read")).unwrap();
        assert!(matches!(
            allow.decide(AskKind::Permission, "Bash"),
            PolicyAnswer::Deny(m) if m.contains("denies Bash")
        ));
        assert!(matches!(
            Policy::AllowAll.decide(AskKind::Question, ""),
            PolicyAnswer::Deny(_)
        ));
        for p in [Policy::AllowAll, Policy::Deny, ask] {
            assert_eq!(p.decide(AskKind::ClientTool, "x"), PolicyAnswer::AskHuman);
        }
    }

    #[test]
    fn settings_parse_durations_and_defaults() {
        let mut c = BTreeMap::new();
        assert_eq!(
            ApprovalSettings::parse(&c).unwrap().timeout_ms,
            ApprovalSettings::DEFAULT_TIMEOUT_MS
        );
        c.insert("approval_timeout".to_string(), "90s".to_string());
        c.insert("approval_default".to_string(), "allow".to_string());
        let s = ApprovalSettings::parse(&c).unwrap();
        assert_eq!((s.timeout_ms, s.default_allow), (90_000, true));
        for bad in ["0", "soon", "8d", "5 weeks"] {
            c.insert("approval_timeout".to_string(), bad.to_string());
            assert!(ApprovalSettings::parse(&c).is_err(), "{bad}");
        }
        assert_eq!(parse_duration_ms("250ms"), Some(250));
        assert_eq!(parse_duration_ms("2h"), Some(7_200_000));
        assert_eq!(parse_duration_ms("12"), Some(12_000));
    }
}
