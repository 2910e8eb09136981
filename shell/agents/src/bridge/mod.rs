//! Bridges: agents that do not speak stream-json, behind one wire protocol.
//!
//! The daemon talks to every agent process the same way: Claude Code's `stream-json` on the
//! agent's stdio ([`wire`] has the table). Claude Code and the scripted agent speak it
//! natively. Every other agent runs behind a bridge — the paddock binary itself, started as
//! `paddock __bridge <kind> --model M [--resume ID]` in the session's working directory, its
//! provider_config in `$PADDOCK_BRIDGE_CONFIG` — which is the session's
//! agent process as far as the daemon can tell, and which speaks the agent's own protocol on
//! the other side:
//!
//! - [`codex`]: one `codex exec --json` process per turn (`codex exec resume` after the first),
//! - [`gemini`]: one `gemini -p … --output-format stream-json` process per turn,
//! - [`acp`]: a long-lived Agent Client Protocol agent (JSON-RPC on its stdio); OpenClaw,
//! - [`openai`]: paddock's own agent loop against an OpenAI-compatible chat completions API,
//!   with built-in tools confined to the working directory.
//!
//! Why a process and not a parser in the daemon: per-turn CLIs (codex, gemini) would otherwise
//! make the core model a session whose process comes and goes; a stateful JSON-RPC peer (ACP)
//! or an HTTP loop would put protocol state into the daemon's event loop. Behind a bridge, the
//! core's one model holds for every provider (one process per session run, messages on stdin,
//! TERM/KILL to its process group, crash = exit), the runner can own a bridged agent across a
//! daemon restart like any other, and a permission prompt is one `control_request` whoever
//! asked it. The bridge has no lifecycle logic: it never decides a session's state; it
//! translates, and when the agent process it drives dies by a signal it dies the same way
//! ([`die_like`]), so the daemon sees the crash the core then rules on.
//!
//! The agent process shares the bridge's process group (the daemon's TERM/KILL reach it) and
//! dies with the bridge (`proc::die_with_parent`: a bridge killed mid-turn leaves no agent
//! running). The agent's children share the group too,
//! and tool processes that leave the group (codex and gemini run each command in a session of
//! its own) still carry the session's containment tag: when the bridge exits, the daemon ends
//! them all (`paddock_sys::contain`). So a bridge keeps the default signal actions and never hunts
//! processes itself. The agent's stderr is passed through to the bridge's stderr, which the
//! daemon keeps.

pub mod acp;
pub mod codex;
pub mod gemini;
pub mod mcp_socket;
pub mod openai;
pub mod wire;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

pub use wire::{Decision, In, Out, TurnEnd, Usage};

use paddock_sys::proc;

/// Why a bridge cannot go on: the bridges' one error type. [`run`] prints it as the bridge's
/// last stderr line (`paddock bridge (<agent>): <text>`, which the daemon keeps) and exits 1;
/// the daemon's own checks at CreateSession ([`codex::validate_config`],
/// [`openai::check_config`]) turn it into the refusal's text. A turn that fails is not one of
/// these: it ends in an ERROR result, and the session goes on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // The session's settings (its model and provider_config).
    /// The agent's command line (`provider_config.command`, or the provider's default).
    #[error(transparent)]
    Command(#[from] crate::CommandError),
    /// `provider_config.permissions` is not a policy (the core's refusal).
    #[error(transparent)]
    Permissions(paddock_core::PolicyError),
    #[error("codex_config line {line} is not key=value: {text:?}")]
    CodexConfigLine { line: usize, text: String },
    #[error("no model: the openai-api provider needs the endpoint's model name")]
    NoModel,
    #[error("the openai-api base_url must be an http:// or https:// URL (got {0:?})")]
    BaseUrl(String),
    #[error("provider_config.{key} is not a number: {value:?}")]
    NotANumber { key: String, value: String },
    #[error("provider_config.{key} must be at least {min}")]
    TooSmall { key: String, min: u64 },
    #[error("provider_config.{key} is too large")]
    TooLarge { key: String },
    #[error("provider_config.max_retries must be at most {max}")]
    TooManyRetries { max: u32 },

    // The agent's process.
    #[error("cannot start {program}: {source}")]
    Start {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the ACP agent {program:?}: {source}")]
    StartAcp {
        program: String,
        #[source]
        source: std::io::Error,
    },

    // The agent's protocol (ACP's set-up requests).
    /// A set-up request failed: `call` says which (`initialize`, `session/set_mode "m"`, …).
    #[error("{call}: {source}")]
    Rpc {
        call: String,
        #[source]
        source: acp::RpcError,
    },
    #[error("cannot continue conversation {id}: {source}")]
    Resume {
        id: String,
        #[source]
        source: acp::RpcError,
    },
    #[error(
        "cannot continue conversation {id}: the agent offers neither session/resume nor session/load"
    )]
    NoResume { id: String },
    #[error("session/new answered without a sessionId: {0}")]
    NoSessionId(serde_json::Value),
    #[error("the ACP agent does not offer model {model:?} (it offers: {})", .offered.join(", "))]
    ModelNotOffered { model: String, offered: Vec<String> },

    // The model API (the openai-api loop).
    /// The endpoint answered with an error object: its own message.
    #[error("{0}")]
    Endpoint(String),
    /// A tool call's arguments are JSON but not an object.
    #[error("not an object")]
    ArgumentsNotObject,
    /// A tool call's arguments are not JSON.
    #[error("{0}")]
    Arguments(#[source] serde_json::Error),

    // Files and directories.
    #[error("the working directory {}: {source}", .path.display())]
    WorkingDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make {}: {source}", .path.display())]
    MakeDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make the MCP socket's directory: {0}")]
    McpDir(#[source] std::io::Error),
    #[error("cannot serve MCP on {}: {source}", .socket.display())]
    McpServe {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("paddock's own binary: {0}")]
    OwnExe(#[source] std::io::Error),
    // The openai-api loop's saved conversation ([`openai::store`]).
    #[error("not a conversation id: {0:?}")]
    ConversationId(String),
    #[error("no conversation {id} at {}: {source}", .path.display())]
    NoConversation {
        id: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("conversation {} is not JSON: {source}", .path.display())]
    ConversationNotJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("conversation {} is not a version {version} conversation", .path.display())]
    ConversationVersion { path: PathBuf, version: u64 },
    #[error("cannot save the conversation to {}: {source}", .path.display())]
    SaveConversation {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Which protocol the bridge speaks on the agent's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    Codex,
    Gemini,
    Acp,
    Openai,
}

impl Kind {
    /// The agent's name in ERROR texts.
    pub fn agent_name(self) -> &'static str {
        match self {
            Kind::Codex => "codex",
            Kind::Gemini => "gemini",
            Kind::Acp => "acp",
            Kind::Openai => "openai-api",
        }
    }
}

/// What the daemon tells a bridge (`paddock __bridge <kind> …`).
#[derive(Debug, Clone, clap::Args)]
pub struct BridgeArgs {
    #[arg(value_enum)]
    pub kind: Kind,
    /// The session's model ("" = the agent's default)
    #[arg(long, default_value = "")]
    pub model: String,
    /// The agent's conversation id to continue (from an earlier run's `system/init`)
    #[arg(long)]
    pub resume: Option<String>,
    /// The session's provider_config, as a JSON object of strings (the daemon passes it in
    /// $PADDOCK_BRIDGE_CONFIG instead, out of the process list)
    #[arg(long)]
    pub config: Option<String>,
}

/// The environment variable that carries a bridge's provider_config (JSON).
pub const CONFIG_ENV: &str = "PADDOCK_BRIDGE_CONFIG";

/// A running bridge: its arguments, the daemon on stdout and stdin.
pub struct Bridge {
    pub model: String,
    pub resume: Option<String>,
    /// The session's `provider_config`, parsed where it comes in (this process's
    /// environment).
    pub config: paddock_core::ProviderConfig,
    /// The working directory (the campaign root): the process's own.
    pub cwd: PathBuf,
    pub out: Arc<Out>,
    /// Shared: a bridge may wait for permission answers on threads of its own.
    pub input: Arc<In>,
}

impl Bridge {
    /// `provider_config[key]`, if set and not empty.
    pub fn config(&self, key: &str) -> Option<&str> {
        self.config
            .get(key)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }
}

/// Runs a bridge until its stdin closes (exit 0) or the agent fails for good; a stop ends it
/// by its signal (default action).
pub fn run(args: BridgeArgs) -> i32 {
    // The configuration may hold a secret (an API key): taken out of the environment before
    // anything starts (so no agent or tool inherits it), and the process made non-dumpable, so
    // that processes of the same user (the agent's tools) cannot read it from
    // /proc/<pid>/environ either.
    let from_env = std::env::var(CONFIG_ENV).ok();
    std::env::remove_var(CONFIG_ENV);
    let _ = nix::sys::prctl::set_dumpable(false);
    let text = args.config.or(from_env).unwrap_or_else(|| "{}".into());
    let config = match serde_json::from_str::<BTreeMap<String, String>>(&text)
        .map_err(|e| e.to_string())
        .and_then(|map| paddock_core::ProviderConfig::parse(map).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("paddock bridge: bad configuration: {e}");
            return 2;
        }
    };
    let out = Arc::new(Out::stdout(args.kind.agent_name()));
    let bridge = Bridge {
        model: args.model,
        resume: args.resume,
        config,
        cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
        input: Arc::new(In::spawn(out.clone())),
        out,
    };
    let result = match args.kind {
        Kind::Codex => codex::run(&bridge),
        Kind::Gemini => gemini::run(&bridge),
        Kind::Acp => acp::run(&bridge),
        Kind::Openai => openai::run(&bridge),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("paddock bridge ({}): {e}", args.kind.agent_name());
            1
        }
    }
}

/// How a per-turn agent process ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnExit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The last [`STDERR_TAIL`] bytes of its stderr.
    pub stderr_tail: String,
}

/// How much of an agent process's stderr a bridge keeps for its error texts.
pub const STDERR_TAIL: usize = 4096;

impl TurnExit {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// `exit code 1: <stderr tail>` / `killed by signal 9`.
    pub fn describe(&self) -> String {
        let how = match (self.code, self.signal) {
            (_, Some(s)) => format!("killed by signal {s}"),
            (Some(c), None) => format!("exit code {c}"),
            (None, None) => "exit status unknown".into(),
        };
        let tail = self.stderr_tail.trim();
        if tail.is_empty() {
            how
        } else {
            format!("{how}: {tail}")
        }
    }
}

/// How long an agent process may live on after its output said the turn is over, before it
/// is killed (a CLI that hangs on its way out must not hold the next message).
pub const EXIT_AFTER_TURN: Duration = Duration::from_secs(10);

/// Runs one agent process to its end: `stdin` written then closed (or `/dev/null`: an open
/// stdin makes `codex exec` wait for a prompt forever), each stdout line to `on_line` (in
/// order, on this thread; it answers whether the turn is over), stderr passed through to the
/// bridge's own and its tail kept. Once the process has exited, its output is read for at most
/// [`proc::DRAIN_AFTER_EXIT`] more; once the turn is over, the process gets `exit_after_turn` to
/// exit, then is killed.
///
/// What the process leaves running is not the bridge's business: it carries the session's
/// containment tag, and the daemon ends it with the session (see `paddock_sys::contain`).
pub fn run_turn(
    cmd: &mut Command,
    stdin: Option<&[u8]>,
    exit_after_turn: Duration,
    mut on_line: impl FnMut(&str) -> bool,
) -> std::io::Result<TurnExit> {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    // In the bridge's group and with the session's tag (the daemon's TERM reaches it), and
    // gone with the bridge.
    proc::die_with_parent(cmd);
    let mut child = cmd.spawn()?;
    if let (Some(mut w), Some(bytes)) = (child.stdin.take(), stdin) {
        let bytes = bytes.to_vec();
        // On a thread: a large prompt must not block reading the agent's output.
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = w.write_all(&bytes);
        });
    }
    let stderr = child.stderr.take().expect("piped");
    let tail = Arc::new(Mutex::new(String::new()));
    let keep = tail.clone();
    let err_thread = std::thread::spawn(move || pass_stderr(stderr, &keep));
    let stdout = child.stdout.take().expect("piped");
    // Bounded: the reader waits while this thread is busy handing lines on.
    let (tx, rx) = mpsc::sync_channel::<String>(256);
    std::thread::spawn(move || {
        // Lines over the daemon's own limit could not be read whole there either: cut here
        // (and then not understood: passed on as unrecognized).
        for line in proc::BlockingLines::new(stdout, proc::LINE_BYTES_MAX) {
            if tx.send(line.text()).is_err() {
                break;
            }
        }
    });
    let mut status = None;
    let mut exited_at: Option<Instant> = None;
    let mut turn_over_at: Option<Instant> = None;
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => {
                let line = line.trim_end_matches('\r');
                if !line.trim().is_empty() && on_line(line) && turn_over_at.is_none() {
                    turn_over_at = Some(Instant::now());
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        // Checked whatever arrived: a leftover that keeps writing does not hold the turn.
        match exited_at {
            Some(t) if t.elapsed() >= proc::DRAIN_AFTER_EXIT => break,
            Some(_) => {}
            None => {
                if let Some(st) = child.try_wait()? {
                    status = Some(st);
                    exited_at = Some(Instant::now());
                } else if turn_over_at.is_some_and(|t| t.elapsed() >= exit_after_turn) {
                    tracing::warn!("the agent did not exit after its turn; killing it");
                    let _ = child.kill();
                    turn_over_at = None;
                }
            }
        }
    }
    let status = match status {
        Some(s) => s,
        None => child.wait()?,
    };
    // Stderr too may be held open by what the agent left behind: wait for it a little.
    let deadline = Instant::now() + Duration::from_millis(500);
    while !err_thread.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    use std::os::unix::process::ExitStatusExt;
    let stderr_tail = tail.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(TurnExit {
        code: status.code(),
        signal: status.signal(),
        stderr_tail,
    })
}

/// Copies an agent's stderr to ours, keeping its last [`STDERR_TAIL`] bytes in `tail`.
pub fn pass_stderr(r: impl Read, tail: &Mutex<String>) {
    use std::io::Write;
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        // One line at a time, each cut at STDERR_TAIL bytes: an agent cannot make the bridge
        // hold more.
        buf.clear();
        match (&mut r)
            .take(STDERR_TAIL as u64)
            .read_until(b'\n', &mut buf)
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim_end_matches(['\n', '\r']);
        let _ = writeln!(std::io::stderr(), "{line}");
        let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
        t.push_str(line);
        t.push('\n');
        if t.len() > STDERR_TAIL {
            let cut = t.ceil_char_boundary(t.len() - STDERR_TAIL);
            t.drain(..cut);
        }
    }
}

/// The agent process was killed by a signal: the bridge dies by the same signal, so the daemon
/// sees what happened to the agent (a crash, OBEY-2031, with this stderr). Without a signal
/// (a crash with an exit code), exits with that code.
pub fn die_like(exit: &TurnExit, agent: &str) -> ! {
    eprintln!("paddock bridge: {agent} {}", exit.describe());
    if let Some(sig) = exit.signal {
        if let Ok(s) = nix::sys::signal::Signal::try_from(sig) {
            // Default action for the signal, then raise it on ourselves.
            unsafe {
                let _ = nix::sys::signal::signal(s, nix::sys::signal::SigHandler::SigDfl);
            }
            let _ = nix::sys::signal::raise(s);
        }
        std::process::exit(128 + sig);
    }
    std::process::exit(exit.code.filter(|c| *c != 0).unwrap_or(1));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_turn_reads_lines_and_keeps_stderr() {
        let mut lines = Vec::new();
        let exit = run_turn(
            Command::new("sh").args(["-c", "echo one; echo; echo two; echo oops >&2; exit 3"]),
            None,
            EXIT_AFTER_TURN,
            |l| {
                lines.push(l.to_string());
                false
            },
        )
        .unwrap();
        assert_eq!(lines, ["one", "two"]);
        assert_eq!(exit.code, Some(3));
        assert!(!exit.success());
        assert_eq!(exit.describe(), "exit code 3: oops");
    }

    #[test]
    fn a_killed_turn_reports_its_signal() {
        let exit = run_turn(
            Command::new("sh").args(["-c", "kill -9 $$"]),
            None,
            EXIT_AFTER_TURN,
            |_| false,
        )
        .unwrap();
        assert_eq!(exit.signal, Some(9));
        assert_eq!(exit.describe(), "killed by signal 9");
    }

    /// A prompt on stdin arrives whole; an exited agent whose leftover holds its stdout does
    /// not hold the turn for longer than the drain period.
    #[test]
    fn stdin_prompts_and_held_pipes() {
        let mut lines = Vec::new();
        let exit = run_turn(
            Command::new("sh").args(["-c", "wc -c"]),
            Some(&[b'x'; 300_000]),
            EXIT_AFTER_TURN,
            |l| {
                lines.push(l.trim().to_string());
                false
            },
        )
        .unwrap();
        assert!(exit.success());
        assert_eq!(lines, ["300000"]);
        let t0 = Instant::now();
        let exit = run_turn(
            Command::new("sh").args(["-c", "sleep 29.4817 & echo started"]),
            None,
            EXIT_AFTER_TURN,
            |_| false,
        )
        .unwrap();
        assert!(exit.success());
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        // (the sleep is a leftover of this test's own; end it)
        let _ = Command::new("pkill")
            .args(["-f", "^sleep 29.4817$"])
            .status();
    }

    /// The bridges' errors say what the strings they replaced said.
    #[test]
    fn error_texts() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let rpc = acp::RpcError {
            code: -32601,
            message: "nope".into(),
        };
        let cases = [
            (
                Error::from(crate::CommandError::AcpNeedsCommand),
                "the acp provider needs provider_config.command: the agent's command line (e.g. \"gemini --acp\")".to_string(),
            ),
            (
                Error::StartAcp {
                    program: "openclaw".into(),
                    source: io(),
                },
                format!("cannot start the ACP agent \"openclaw\": {}", io()),
            ),
            (
                Error::Rpc {
                    call: "session/set_mode \"plan\"".into(),
                    source: rpc.clone(),
                },
                "session/set_mode \"plan\": nope (JSON-RPC error -32601)".into(),
            ),
            (
                Error::ModelNotOffered {
                    model: "m".into(),
                    offered: vec!["a".into(), "b".into()],
                },
                "the ACP agent does not offer model \"m\" (it offers: a, b)".into(),
            ),
            (
                Error::CodexConfigLine {
                    line: 2,
                    text: "just words".into(),
                },
                "codex_config line 2 is not key=value: \"just words\"".into(),
            ),
            (
                Error::Write {
                    path: "/x/settings.json".into(),
                    source: io(),
                },
                format!("cannot write /x/settings.json: {}", io()),
            ),
            (
                Error::ConversationVersion {
                    path: "/s/c.json".into(),
                    version: 1,
                },
                "conversation /s/c.json is not a version 1 conversation".into(),
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text);
        }
    }

    /// An agent that said its turn is over but does not exit is killed after the grace.
    #[test]
    fn an_agent_that_hangs_after_its_turn_is_killed() {
        let t0 = Instant::now();
        let exit = run_turn(
            Command::new("sh").args(["-c", "echo result; exec sleep 28.3917"]),
            None,
            Duration::from_millis(300),
            |l| l == "result",
        )
        .unwrap();
        assert_eq!(exit.signal, Some(9));
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    }
}
