//! The built-in scripted agent: `paddock __scripted-agent [--script FILE]
//! [--append-system-prompt TEXT]`.
//!
//! A real child process that speaks Claude Code's `stream-json` line protocol (see
//! [`super::claude_stream`]), so the daemon drives it exactly as it drives `claude`, and every
//! test exercises the real parser, pipes, signals and exit codes. It reads user-message lines
//! (as [`super::claude_stream::user_message_line`] makes them) on stdin and answers each one
//! on stdout, one JSON object per line, flushing after every line. Other stdin lines
//! (`control_response`, tool results, …) are ignored; a line that is not JSON gets a note on
//! stderr. On stdin EOF it exits 0.
//!
//! # Built-in behaviour (no script)
//!
//! Message *k* (1-based) with text *m* in working directory *cwd* is answered with:
//!
//! 1. on the first message only: `{"type":"system","subtype":"init","session_id":"scripted-<pid>-<hex>","cwd":…,"model":"scripted","tools":["LS","Read"],…}`;
//! 2. an assistant `thinking` block: `The user asked: '<first 80 chars of m>'. I'll look at the working directory first.`;
//! 3. an assistant `tool_use` block (same message id as 2): `LS` with input `{"path":"<cwd>"}`;
//! 4. a user `tool_result` with a real listing of *cwd*: names sorted, directories with a
//!    trailing `/`, one per line, at most 200 (then `… and N more`);
//! 5. an assistant `text` block: `The directory has N entries: a, b, c, d, e…`;
//! 6. a `result` (subtype `success`): `You said: "<m>". The working directory has N entries.`
//!
//! Tokens, with `q = ⌊len(m in UTF-8 bytes) / 4⌋`:
//!
//! | line | usage printed | parsed delta (in, out) |
//! |---|---|---|
//! | 2 thinking (`msg_scripted_k_1`) | input 10, cache_creation 40+q, output 8 | (50+q, 8) on THINKING |
//! | 3 tool_use (`msg_scripted_k_1`) | same, output 20 | (0, 12) on TOOL_CALL |
//! | 4 tool_result | — | (0, 0) |
//! | 5 text (`msg_scripted_k_2`) | input 10, cache_read 40+q, output 10 | (50+q, 10) on STATUS |
//! | 6 result | input 20, cache_creation 40+q, cache_read 40+q, output 30 | (0, 0) on COMPLETION |
//!
//! so a turn costs **input 100 + 2q, output 30** (total 130 + 2q).
//!
//! # Script format
//!
//! `--script FILE` names a JSON file that fixes the exact behaviour (unknown keys are errors;
//! a `"comment"` key is allowed anywhere):
//!
//! ```json
//! {
//!   "turns": [
//!     { "steps": [
//!         {"thinking": "Looking at {cwd}", "tokens_in": 10, "tokens_out": 5, "delay_ms": 100},
//!         {"tool": "LS", "input": {"path": "."}},
//!         {"tool": "Bash", "input": {"command": "make"}},
//!         {"tool_result": "make: ok", "is_error": false},
//!         {"text": "Done."},
//!         {"raw": "not json {"},
//!         {"result": "You said {message}", "tokens_in": 100, "tokens_out": 40}
//!     ] },
//!     { "steps": [ {"crash": 3} ] }
//!   ],
//!   "repeat_last": true,
//!   "startup_delay_ms": 0,
//!   "crash_on_start": null,
//!   "ignore_sigterm": false,
//!   "stderr": "printed on stderr at start",
//!   "session_id": "fixed-id",
//!   "model": "scripted"
//! }
//! ```
//!
//! Top level (all optional):
//! - `turns`: turn *i* answers user message *i*. After the last one, `repeat_last` (default
//!   `true`) reuses the last turn; with `repeat_last: false`, or no turns at all, the built-in
//!   behaviour answers. A turn with no steps answers nothing (the turn never ends).
//! - `startup_delay_ms`: sleep before reading stdin. `crash_on_start: N`: exit with code N
//!   right after start-up (after `stderr` and the delay), before reading anything.
//! - `ignore_sigterm: true`: SIGTERM is ignored (to test TERM→KILL escalation).
//! - `stderr`: text written to stderr at start. `session_id`: the id to report (default
//!   `scripted-<pid>-<hex of the clock>`). `model`: reported in `init` (default `scripted`).
//!
//! Steps, in order; each has exactly one *kind* key, plus `delay_ms` (sleep before the step)
//! and the options listed:
//! - `{"thinking": TEXT}` / `{"text": TEXT}`: an assistant line with a `thinking` / `text`
//!   block. Options `tokens_in`, `tokens_out` (the line's `usage`, default 0) and `message_id`
//!   (steps with the same `message_id` form one API message whose usage the line repeats, as
//!   Claude Code does: give cumulative numbers; default a fresh id per step).
//! - `{"tool": NAME, "input": {…}}`: an assistant `tool_use` line (options `id`, `tokens_in`,
//!   `tokens_out`, `message_id`). If the next step is a `tool_result`, that is its result;
//!   otherwise the tool runs for real and its result line follows at once: `LS` (`path`,
//!   default the cwd) lists a directory as above, `Read` (`file_path`) returns the file's text
//!   (up to 256 KiB); any other tool gets an error result.
//! - `{"tool_result": TEXT, "is_error": false}`: a user `tool_result` line for the latest
//!   tool call (or option `id`).
//! - `{"result": TEXT}`: the `result` line that ends the turn. Options: `tokens_in`,
//!   `tokens_out` (the turn's totals; default: the sum of the turn's assistant usages, per
//!   message id its largest), `is_error` (default false), `subtype` (default `success`, e.g.
//!   `error_max_turns`), `api_error_status` (number or string), `num_turns` (default: the
//!   number of assistant messages in the turn, at least 1).
//! - `{"raw": LINE}` (alias `garbage`): print LINE as is. `{"stderr": TEXT}`: a line on stderr.
//! - `{"crash": N}`: flush and exit with code N now. `{"signal": N}`: kill itself with signal
//!   N (e.g. 9, 11). `{"hang": true}`: stop producing output and sleep forever (stdin is no
//!   longer read; only a signal ends it).
//! - `{"builtin": true}`: the built-in answer (steps 2–6 above) at this point.
//! - Asking the controller (the daemon), as Claude Code does with `--permission-prompt-tool
//!   stdio`: the step prints the tool's `tool_use` line, then a `control_request`, and waits
//!   (reading stdin; user messages that arrive meanwhile are answered afterwards) for the
//!   `control_response` with its `request_id`; then it prints the tool's result:
//!   - `{"ask": TOOL, "input": {…}, "allowed_result": TEXT}`: a `can_use_tool` permission
//!     prompt. Allowed: `LS` / `Read` run for real, any other tool's result is `allowed_result` (default
//!     `approved`). Denied: an error result `denied: <message>`.
//!   - `{"question": TEXT, "options": [LABEL, …]}`: Claude Code's `AskUserQuestion` tool (a
//!     `can_use_tool` prompt for it); the result is `User answered: <answer>` (the answer is
//!     read from `updatedInput.answers`), or an error when refused.
//!   - `{"client_tool": NAME, "input": {…}}`: paddock's `client_tool` request (a tool the
//!     client runs); the result is the response's `result` (`is_error` as it says).
//!
//!   In every later step of the turn, `{answer}` is the last answer (the result text, the
//!   answer, or the deny message).
//! - `{"delay_ms": N}` alone: just wait.
//!
//! In TEXT, tool inputs and `raw`/`stderr` lines, `{message}`, `{turn}` (1-based message
//! number), `{cwd}`, `{session_id}` and `{system_prompt}` (what `--append-system-prompt TEXT`
//! gave the agent, as Claude Code takes it; empty without) are replaced.
//!
//! The `result` line's `duration_ms` is the sum of the turn's `delay_ms` so far.

use std::fs;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// At most this many directory entries are listed.
pub const LIST_MAX: usize = 200;
/// `Read` returns at most this many bytes of a file.
pub const READ_MAX: usize = 256 * 1024;

// ---------------------------------------------------------------------------------------------
// Script

/// A parsed script (see the module docs). `Script::default()` is the built-in behaviour.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    pub turns: Vec<Turn>,
    pub repeat_last: bool,
    pub startup_delay_ms: u64,
    pub crash_on_start: Option<i32>,
    pub ignore_sigterm: bool,
    pub stderr: Option<String>,
    pub session_id: Option<String>,
    pub model: Option<String>,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            turns: Vec::new(),
            repeat_last: true,
            startup_delay_ms: 0,
            crash_on_start: None,
            ignore_sigterm: false,
            stderr: None,
            session_id: None,
            model: None,
        }
    }
}

/// The answer to one user message.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Turn {
    pub steps: Vec<Step>,
}

/// One step of a turn: wait `delay_ms`, then do `kind`.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub delay_ms: u64,
    pub kind: StepKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum StepKind {
    /// Only the delay.
    Wait,
    Thinking {
        text: String,
        usage: Usage,
        message_id: Option<String>,
    },
    Text {
        text: String,
        usage: Usage,
        message_id: Option<String>,
    },
    Tool {
        name: String,
        input: Value,
        id: Option<String>,
        usage: Usage,
        message_id: Option<String>,
    },
    ToolResult {
        content: String,
        is_error: bool,
        id: Option<String>,
    },
    Result {
        text: String,
        tokens_in: Option<u64>,
        tokens_out: Option<u64>,
        is_error: bool,
        subtype: String,
        api_error_status: Value,
        num_turns: Option<u64>,
    },
    Raw(String),
    Stderr(String),
    Crash(i32),
    Signal(i32),
    Hang,
    Builtin,
    /// Ask the controller and wait for its answer.
    Ask {
        ask: AskStep,
        input: Value,
        /// Permission prompts: the result when allowed (tools other than LS / Read).
        result: Option<String>,
    },
}

/// What an asking step asks.
#[derive(Debug, Clone, PartialEq)]
pub enum AskStep {
    Permission(String),
    Question { text: String, options: Vec<String> },
    ClientTool(String),
}

/// An assistant line's `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub output_tokens: u64,
}

impl Usage {
    fn plain(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            ..Usage::default()
        }
    }

    fn max(self, o: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.max(o.input_tokens),
            cache_creation_input_tokens: self
                .cache_creation_input_tokens
                .max(o.cache_creation_input_tokens),
            cache_read_input_tokens: self.cache_read_input_tokens.max(o.cache_read_input_tokens),
            output_tokens: self.output_tokens.max(o.output_tokens),
        }
    }

    fn add(self, o: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens + o.input_tokens,
            cache_creation_input_tokens: self.cache_creation_input_tokens
                + o.cache_creation_input_tokens,
            cache_read_input_tokens: self.cache_read_input_tokens + o.cache_read_input_tokens,
            output_tokens: self.output_tokens + o.output_tokens,
        }
    }
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScript {
    #[serde(default)]
    turns: Vec<RawTurn>,
    #[serde(default = "yes")]
    repeat_last: bool,
    #[serde(default)]
    startup_delay_ms: u64,
    #[serde(default)]
    crash_on_start: Option<i32>,
    #[serde(default)]
    ignore_sigterm: bool,
    #[serde(default)]
    stderr: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default, rename = "comment")]
    _comment: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTurn {
    #[serde(default)]
    steps: Vec<Map<String, Value>>,
    #[serde(default, rename = "comment")]
    _comment: Option<Value>,
}

const KINDS: &[&str] = &[
    "ask",
    "question",
    "client_tool",
    "thinking",
    "text",
    "tool",
    "tool_result",
    "result",
    "raw",
    "garbage",
    "stderr",
    "crash",
    "signal",
    "hang",
    "builtin",
];

/// The largest script read (the daemon checks it at CreateSession; the agent reads no more).
pub const SCRIPT_BYTES_MAX: u64 = 8 * 1024 * 1024;

impl Script {
    /// Reads and parses a script file (see the module docs).
    pub fn load(path: &Path) -> Result<Script, String> {
        let mut text = String::new();
        fs::File::open(path)
            .and_then(|f| {
                let mut bounded = io::Read::take(f, SCRIPT_BYTES_MAX + 1);
                io::Read::read_to_string(&mut bounded, &mut text)
            })
            .map_err(|e| e.to_string())?;
        if text.len() as u64 > SCRIPT_BYTES_MAX {
            return Err(format!("longer than {SCRIPT_BYTES_MAX} bytes"));
        }
        parse_script(&text)
    }
}

/// Parses a script file's text. Errors name the turn and step (1-based).
pub fn parse_script(text: &str) -> Result<Script, String> {
    let raw: RawScript = serde_json::from_str(text).map_err(|e| format!("invalid script: {e}"))?;
    let mut turns = Vec::with_capacity(raw.turns.len());
    for (ti, t) in raw.turns.iter().enumerate() {
        let mut steps = Vec::with_capacity(t.steps.len());
        for (si, s) in t.steps.iter().enumerate() {
            let step =
                parse_step(s).map_err(|e| format!("turn {} step {}: {e}", ti + 1, si + 1))?;
            steps.push(step);
        }
        turns.push(Turn { steps });
    }
    Ok(Script {
        turns,
        repeat_last: raw.repeat_last,
        startup_delay_ms: raw.startup_delay_ms,
        crash_on_start: raw.crash_on_start,
        ignore_sigterm: raw.ignore_sigterm,
        stderr: raw.stderr,
        session_id: raw.session_id,
        model: raw.model,
    })
}

fn parse_step(m: &Map<String, Value>) -> Result<Step, String> {
    let kinds: Vec<&str> = m
        .keys()
        .map(String::as_str)
        .filter(|k| KINDS.contains(k))
        .collect();
    let kind = match kinds.as_slice() {
        [] => None,
        [k] => Some(*k),
        _ => return Err(format!("a step has one kind, found {}", kinds.join(", "))),
    };
    let options: &[&str] = match kind {
        Some("thinking" | "text") => &["tokens_in", "tokens_out", "message_id"],
        Some("tool") => &["input", "id", "tokens_in", "tokens_out", "message_id"],
        Some("tool_result") => &["is_error", "id"],
        Some("ask") => &["input", "allowed_result"],
        Some("question") => &["options"],
        Some("client_tool") => &["input"],
        Some("result") => &[
            "tokens_in",
            "tokens_out",
            "is_error",
            "subtype",
            "api_error_status",
            "num_turns",
        ],
        _ => &[],
    };
    for k in m.keys() {
        let k = k.as_str();
        if k != "delay_ms" && k != "comment" && Some(k) != kind && !options.contains(&k) {
            return Err(match kind {
                Some(kind) => format!(
                    "unknown key {k:?} in a {kind:?} step (allowed: delay_ms{}{})",
                    if options.is_empty() { "" } else { ", " },
                    options.join(", ")
                ),
                None => format!(
                    "unknown key {k:?} (a step needs one of: {})",
                    KINDS.join(", ")
                ),
            });
        }
    }
    let delay_ms = opt_u64(m, "delay_ms")?.unwrap_or(0);
    let usage = || -> Result<Usage, String> {
        Ok(Usage::plain(
            opt_u64(m, "tokens_in")?.unwrap_or(0),
            opt_u64(m, "tokens_out")?.unwrap_or(0),
        ))
    };
    let kind = match kind {
        None if m.contains_key("delay_ms") => StepKind::Wait,
        None => return Err(format!("empty step (needs one of: {})", KINDS.join(", "))),
        Some("thinking") => StepKind::Thinking {
            text: req_str(m, "thinking")?,
            usage: usage()?,
            message_id: opt_str(m, "message_id")?,
        },
        Some("text") => StepKind::Text {
            text: req_str(m, "text")?,
            usage: usage()?,
            message_id: opt_str(m, "message_id")?,
        },
        Some("tool") => StepKind::Tool {
            name: req_str(m, "tool")?,
            input: match m.get("input") {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(v @ Value::Object(_)) => v.clone(),
                Some(_) => return Err("\"input\" must be an object".into()),
            },
            id: opt_str(m, "id")?,
            usage: usage()?,
            message_id: opt_str(m, "message_id")?,
        },
        Some("tool_result") => StepKind::ToolResult {
            content: req_str(m, "tool_result")?,
            is_error: opt_bool(m, "is_error")?.unwrap_or(false),
            id: opt_str(m, "id")?,
        },
        Some("result") => StepKind::Result {
            text: req_str(m, "result")?,
            tokens_in: opt_u64(m, "tokens_in")?,
            tokens_out: opt_u64(m, "tokens_out")?,
            is_error: opt_bool(m, "is_error")?.unwrap_or(false),
            subtype: opt_str(m, "subtype")?.unwrap_or_else(|| "success".into()),
            api_error_status: match m.get("api_error_status") {
                None | Some(Value::Null) => Value::Null,
                Some(v @ (Value::Number(_) | Value::String(_))) => v.clone(),
                Some(_) => return Err("\"api_error_status\" must be a number or a string".into()),
            },
            num_turns: opt_u64(m, "num_turns")?,
        },
        Some(k @ ("ask" | "client_tool")) => {
            let name = req_str(m, k)?;
            let input = match m.get("input") {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(v @ Value::Object(_)) => v.clone(),
                Some(_) => return Err("\"input\" must be an object".into()),
            };
            StepKind::Ask {
                ask: if k == "ask" {
                    AskStep::Permission(name)
                } else {
                    AskStep::ClientTool(name)
                },
                input,
                result: opt_str(m, "allowed_result")?,
            }
        }
        Some("question") => {
            let options = match m.get("options") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|o| {
                        o.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| "\"options\" must be strings".to_string())
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err("\"options\" must be a list of strings".into()),
            };
            StepKind::Ask {
                ask: AskStep::Question {
                    text: req_str(m, "question")?,
                    options,
                },
                input: Value::Null,
                result: None,
            }
        }
        Some("raw" | "garbage") => StepKind::Raw(req_str(m, kind.unwrap_or("raw"))?),
        Some("stderr") => StepKind::Stderr(req_str(m, "stderr")?),
        Some("crash") => StepKind::Crash(req_i32(m, "crash")?),
        Some("signal") => {
            let n = req_i32(m, "signal")?;
            if !(1..=64).contains(&n) {
                return Err(format!("\"signal\" must be a signal number, not {n}"));
            }
            StepKind::Signal(n)
        }
        Some(k @ ("hang" | "builtin")) => {
            if opt_bool(m, k)? != Some(true) {
                return Err(format!("{k:?} must be true"));
            }
            if k == "hang" {
                StepKind::Hang
            } else {
                StepKind::Builtin
            }
        }
        Some(other) => return Err(format!("unknown step kind {other:?}")),
    };
    Ok(Step { delay_ms, kind })
}

fn req_str(m: &Map<String, Value>, k: &str) -> Result<String, String> {
    opt_str(m, k)?.ok_or_else(|| format!("{k:?} is required"))
}

fn opt_str(m: &Map<String, Value>, k: &str) -> Result<Option<String>, String> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{k:?} must be a string")),
    }
}

fn opt_u64(m: &Map<String, Value>, k: &str) -> Result<Option<u64>, String> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{k:?} must be a non-negative integer")),
    }
}

fn opt_bool(m: &Map<String, Value>, k: &str) -> Result<Option<bool>, String> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(format!("{k:?} must be true or false")),
    }
}

fn req_i32(m: &Map<String, Value>, k: &str) -> Result<i32, String> {
    m.get(k)
        .and_then(Value::as_i64)
        .and_then(|n| i32::try_from(n).ok())
        .ok_or_else(|| format!("{k:?} must be an integer"))
}

// ---------------------------------------------------------------------------------------------
// Output lines (field order as Claude Code prints them)

#[derive(Serialize)]
struct InitLine<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    subtype: &'static str,
    cwd: &'a str,
    session_id: &'a str,
    tools: [&'static str; 2],
    mcp_servers: [(); 0],
    model: &'a str,
    #[serde(rename = "permissionMode")]
    permission_mode: &'static str,
    #[serde(rename = "apiKeySource")]
    api_key_source: &'static str,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: &'a Value,
    },
}

#[derive(Serialize)]
struct AssistantMessage<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    ty: &'static str,
    role: &'static str,
    model: &'a str,
    content: [Block<'a>; 1],
    stop_reason: Option<&'static str>,
    usage: Usage,
}

#[derive(Serialize)]
struct AssistantLine<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    message: AssistantMessage<'a>,
    parent_tool_use_id: Option<&'static str>,
    session_id: &'a str,
}

#[derive(Serialize)]
struct ToolResultBlock<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    tool_use_id: &'a str,
    content: &'a str,
    is_error: bool,
}

#[derive(Serialize)]
struct UserMessage<'a> {
    role: &'static str,
    content: [ToolResultBlock<'a>; 1],
}

#[derive(Serialize)]
struct UserLine<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    message: UserMessage<'a>,
    parent_tool_use_id: Option<&'static str>,
    session_id: &'a str,
}

#[derive(Serialize)]
struct ResultLine<'a> {
    #[serde(rename = "type")]
    ty: &'static str,
    subtype: &'a str,
    is_error: bool,
    duration_ms: u64,
    duration_api_ms: u64,
    num_turns: u64,
    result: &'a str,
    session_id: &'a str,
    total_cost_usd: f64,
    usage: Usage,
    #[serde(skip_serializing_if = "Value::is_null")]
    api_error_status: &'a Value,
}

fn json_line<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("serialising plain data cannot fail")
}

// ---------------------------------------------------------------------------------------------
// The agent

/// What the process does, in order, to answer one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A line on stdout (without its newline); flushed at once.
    Line(String),
    /// A line on stderr.
    Stderr(String),
    /// `std::thread::sleep` this many milliseconds.
    Sleep(u64),
    /// Exit now with this code.
    Exit(i32),
    /// Kill itself with this signal.
    Signal(i32),
    /// Produce nothing more and never exit.
    Hang,
    /// Print the `control_request` line, wait for the `control_response` with `request_id`,
    /// then print the result of tool call `call` as the answer says.
    Ask {
        request_id: String,
        line: String,
        call: String,
        tool: String,
        input: Value,
        /// Permission prompts: the result when allowed (LS / Read run for real instead).
        allowed_result: String,
    },
}

/// The agent's state across messages. [`Agent::answer`] is deterministic given the script,
/// the session id, the message and the directory's contents.
#[derive(Debug, Clone)]
pub struct Agent {
    script: Script,
    session_id: String,
    /// What `--append-system-prompt` gave (empty: none), for `{system_prompt}`.
    system_prompt: String,
    answered: u64,
    init_sent: bool,
}

impl Agent {
    pub fn new(script: Script, session_id: impl Into<String>) -> Self {
        Agent {
            script,
            session_id: session_id.into(),
            system_prompt: String::new(),
            answered: 0,
            init_sent: false,
        }
    }

    /// The text `--append-system-prompt` gave, which `{system_prompt}` stands for.
    pub fn with_system_prompt(mut self, text: impl Into<String>) -> Self {
        self.system_prompt = text.into();
        self
    }

    /// The actions that answer the next user message (`cwd`: the working directory, for the
    /// `init` line, `LS` and `{cwd}`).
    pub fn answer(&mut self, message: &str, cwd: &Path) -> Vec<Action> {
        self.answered += 1;
        let k = self.answered;
        let turns = &self.script.turns;
        let steps = match turns.get(k as usize - 1) {
            Some(t) => t.steps.clone(),
            None if self.script.repeat_last && !turns.is_empty() => {
                turns[turns.len() - 1].steps.clone()
            }
            None => vec![Step {
                delay_ms: 0,
                kind: StepKind::Builtin,
            }],
        };
        let model = self
            .script
            .model
            .clone()
            .unwrap_or_else(|| "scripted".into());
        let mut t = TurnCx {
            k,
            message,
            cwd,
            cwd_str: cwd.display().to_string(),
            session_id: &self.session_id,
            system_prompt: &self.system_prompt,
            model: &model,
            out: Vec::new(),
            msg_seq: 0,
            tool_seq: 0,
            last_tool: None,
            usages: Vec::new(),
            usage_at: std::collections::HashMap::new(),
            delay_total: 0,
        };
        if !self.init_sent {
            self.init_sent = true;
            t.out.push(Action::Line(json_line(&InitLine {
                ty: "system",
                subtype: "init",
                cwd: &t.cwd_str,
                session_id: &self.session_id,
                tools: ["LS", "Read"],
                mcp_servers: [],
                model: &model,
                permission_mode: "default",
                api_key_source: "none",
            })));
        }
        for (i, step) in steps.iter().enumerate() {
            if step.delay_ms > 0 {
                t.delay_total += step.delay_ms;
                t.out.push(Action::Sleep(step.delay_ms));
            }
            let next_is_result = matches!(
                steps.get(i + 1).map(|s| &s.kind),
                Some(StepKind::ToolResult { .. })
            );
            match &step.kind {
                StepKind::Wait => {}
                StepKind::Thinking {
                    text,
                    usage,
                    message_id,
                } => {
                    let text = t.expand(text);
                    let mid = t.message_id(message_id.as_deref());
                    t.assistant(
                        &mid,
                        Block::Thinking {
                            thinking: &text,
                            signature: "scripted",
                        },
                        *usage,
                    );
                }
                StepKind::Text {
                    text,
                    usage,
                    message_id,
                } => {
                    let text = t.expand(text);
                    let mid = t.message_id(message_id.as_deref());
                    t.assistant(&mid, Block::Text { text: &text }, *usage);
                }
                StepKind::Tool {
                    name,
                    input,
                    id,
                    usage,
                    message_id,
                } => {
                    let input = t.expand_value(input);
                    let mid = t.message_id(message_id.as_deref());
                    let call = t.tool_call(name, &input, id.as_deref(), &mid, *usage);
                    if !next_is_result {
                        let (content, is_error) = run_tool(name, &input, cwd);
                        t.tool_result(&call, &content, is_error);
                    }
                }
                StepKind::ToolResult {
                    content,
                    is_error,
                    id,
                } => {
                    let call = id
                        .clone()
                        .or_else(|| t.last_tool.clone())
                        .unwrap_or_else(|| "toolu_scripted_orphan".into());
                    let content = t.expand(content);
                    t.tool_result(&call, &content, *is_error);
                }
                StepKind::Result {
                    text,
                    tokens_in,
                    tokens_out,
                    is_error,
                    subtype,
                    api_error_status,
                    num_turns,
                } => {
                    let text = t.expand(text);
                    let sum = t.usage_sum();
                    let usage = Usage {
                        input_tokens: tokens_in.unwrap_or(sum.input_tokens),
                        cache_creation_input_tokens: if tokens_in.is_some() {
                            0
                        } else {
                            sum.cache_creation_input_tokens
                        },
                        cache_read_input_tokens: if tokens_in.is_some() {
                            0
                        } else {
                            sum.cache_read_input_tokens
                        },
                        output_tokens: tokens_out.unwrap_or(sum.output_tokens),
                    };
                    let n = num_turns.unwrap_or((t.usages.len() as u64).max(1));
                    t.result(&text, subtype, *is_error, api_error_status, n, usage);
                }
                StepKind::Raw(line) => {
                    let line = t.expand(line);
                    t.out.push(Action::Line(line));
                }
                StepKind::Stderr(line) => {
                    let line = t.expand(line);
                    t.out.push(Action::Stderr(line));
                }
                StepKind::Crash(code) => t.out.push(Action::Exit(*code)),
                StepKind::Signal(n) => t.out.push(Action::Signal(*n)),
                StepKind::Hang => t.out.push(Action::Hang),
                StepKind::Builtin => t.builtin(),
                StepKind::Ask { ask, input, result } => {
                    let (tool, input, subtype) = match ask {
                        AskStep::Permission(name) => {
                            (name.clone(), t.expand_value(input), "can_use_tool")
                        }
                        AskStep::ClientTool(name) => {
                            (name.clone(), t.expand_value(input), "client_tool")
                        }
                        AskStep::Question { text, options } => {
                            let options: Vec<Value> = options
                                .iter()
                                .map(|o| serde_json::json!({"label": t.expand(o), "description": ""}))
                                .collect();
                            let q = serde_json::json!({"questions": [{
                                "question": t.expand(text),
                                "header": "Question",
                                "options": options,
                                "multiSelect": false,
                            }]});
                            (super::ask::QUESTION_TOOL.to_string(), q, "can_use_tool")
                        }
                    };
                    let mid = t.message_id(None);
                    let call = t.tool_call(&tool, &input, None, &mid, Usage::default());
                    let request_id = format!("req_scripted_{}_{}", t.k, t.tool_seq);
                    let line = serde_json::json!({
                        "type": "control_request",
                        "request_id": request_id,
                        "request": {
                            "subtype": subtype,
                            "tool_name": tool,
                            "input": input,
                            "tool_use_id": call,
                        }
                    })
                    .to_string();
                    t.out.push(Action::Ask {
                        request_id,
                        line,
                        call,
                        tool,
                        input,
                        allowed_result: result
                            .as_deref()
                            .map(|r| t.expand(r))
                            .unwrap_or_else(|| "approved".to_string()),
                    });
                }
            }
        }
        t.out
    }
}

/// One turn being planned.
struct TurnCx<'a> {
    k: u64,
    message: &'a str,
    cwd: &'a Path,
    cwd_str: String,
    session_id: &'a str,
    system_prompt: &'a str,
    model: &'a str,
    out: Vec<Action>,
    msg_seq: u64,
    tool_seq: u64,
    last_tool: Option<String>,
    /// Per assistant message id (in order of appearance): its largest usage so far.
    usages: Vec<(String, Usage)>,
    /// Where each message id is in `usages` (a turn of N lines is O(N), not O(N²)).
    usage_at: std::collections::HashMap<String, usize>,
    delay_total: u64,
}

impl TurnCx<'_> {
    fn message_id(&mut self, given: Option<&str>) -> String {
        match given {
            Some(id) => id.to_string(),
            None => {
                self.msg_seq += 1;
                format!("msg_scripted_{}_{}", self.k, self.msg_seq)
            }
        }
    }

    fn expand(&self, s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let after = &rest[open..];
            let close = after.find('}');
            let value = close.and_then(|c| match &after[1..c] {
                "message" => Some(self.message.to_string()),
                "turn" => Some(self.k.to_string()),
                "cwd" => Some(self.cwd_str.clone()),
                "session_id" => Some(self.session_id.to_string()),
                "system_prompt" => Some(self.system_prompt.to_string()),
                _ => None,
            });
            match (value, close) {
                (Some(v), Some(c)) => {
                    out.push_str(&v);
                    rest = &after[c + 1..];
                }
                _ => {
                    out.push('{');
                    rest = &after[1..];
                }
            }
        }
        out.push_str(rest);
        out
    }

    fn expand_value(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.expand(s)),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.expand_value(x)).collect()),
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, x)| (k.clone(), self.expand_value(x)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    fn assistant(&mut self, message_id: &str, block: Block<'_>, usage: Usage) {
        match self.usage_at.get(message_id) {
            Some(&i) => {
                let u = &mut self.usages[i].1;
                *u = u.max(usage);
            }
            None => {
                self.usage_at
                    .insert(message_id.to_string(), self.usages.len());
                self.usages.push((message_id.to_string(), usage));
            }
        }
        let line = json_line(&AssistantLine {
            ty: "assistant",
            message: AssistantMessage {
                id: message_id,
                ty: "message",
                role: "assistant",
                model: self.model,
                content: [block],
                stop_reason: None,
                usage,
            },
            parent_tool_use_id: None,
            session_id: self.session_id,
        });
        self.out.push(Action::Line(line));
    }

    /// Emits a tool_use line; returns its call id.
    fn tool_call(
        &mut self,
        name: &str,
        input: &Value,
        id: Option<&str>,
        message_id: &str,
        usage: Usage,
    ) -> String {
        let call = match id {
            Some(id) => id.to_string(),
            None => {
                self.tool_seq += 1;
                format!("toolu_scripted_{}_{}", self.k, self.tool_seq)
            }
        };
        self.assistant(
            message_id,
            Block::ToolUse {
                id: &call,
                name,
                input,
            },
            usage,
        );
        self.last_tool = Some(call.clone());
        call
    }

    fn tool_result(&mut self, call: &str, content: &str, is_error: bool) {
        let line = tool_result_line(call, content, is_error, self.session_id);
        self.out.push(Action::Line(line));
    }

    fn usage_sum(&self) -> Usage {
        self.usages
            .iter()
            .fold(Usage::default(), |acc, (_, u)| acc.add(*u))
    }

    fn result(
        &mut self,
        text: &str,
        subtype: &str,
        is_error: bool,
        api_error_status: &Value,
        num_turns: u64,
        usage: Usage,
    ) {
        let line = json_line(&ResultLine {
            ty: "result",
            subtype,
            is_error,
            duration_ms: self.delay_total,
            duration_api_ms: self.delay_total,
            num_turns,
            result: text,
            session_id: self.session_id,
            total_cost_usd: 0.0,
            usage,
            api_error_status,
        });
        self.out.push(Action::Line(line));
        // A later result in the same turn counts from here.
        self.usages.clear();
        self.usage_at.clear();
    }

    /// The built-in answer (module docs).
    fn builtin(&mut self) {
        let q = self.message.len() as u64 / 4;
        let short: String = self.message.chars().take(80).collect();
        let ellipsis = if self.message.chars().nth(80).is_some() {
            "…"
        } else {
            ""
        };
        let thinking = format!(
            "The user asked: '{short}{ellipsis}'. I'll look at the working directory first."
        );
        let m1 = self.message_id(None);
        let mut u1 = Usage {
            input_tokens: 10,
            cache_creation_input_tokens: 40 + q,
            cache_read_input_tokens: 0,
            output_tokens: 8,
        };
        self.assistant(
            &m1,
            Block::Thinking {
                thinking: &thinking,
                signature: "scripted",
            },
            u1,
        );
        u1.output_tokens = 20;
        let input = serde_json::json!({ "path": self.cwd_str });
        let call = self.tool_call("LS", &input, None, &m1, u1);
        let cwd = self.cwd.to_path_buf();
        let (summary, reply) = match list_dir(&cwd) {
            Ok((total, names)) => {
                self.tool_result(&call, &listing_text(total, &names), false);
                let preview: Vec<&str> = names.iter().take(5).map(String::as_str).collect();
                let summary = match total {
                    0 => "The directory is empty.".to_string(),
                    _ => format!(
                        "The directory has {} {}: {}{}",
                        total,
                        plural(total),
                        preview.join(", "),
                        if total > 5 { "…" } else { "" }
                    ),
                };
                let reply = format!(
                    "You said: \"{}\". The working directory has {} {}.",
                    self.message,
                    total,
                    plural(total)
                );
                (summary, reply)
            }
            Err(e) => {
                self.tool_result(&call, &e.to_string(), true);
                (
                    format!("I could not list the directory: {e}"),
                    format!(
                        "You said: \"{}\". I could not list the working directory: {e}.",
                        self.message
                    ),
                )
            }
        };
        let m2 = self.message_id(None);
        let u2 = Usage {
            input_tokens: 10,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 40 + q,
            output_tokens: 10,
        };
        self.assistant(&m2, Block::Text { text: &summary }, u2);
        let usage = self.usage_sum();
        let n = (self.usages.len() as u64).max(1);
        self.result(&reply, "success", false, &Value::Null, n, usage);
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        "entry"
    } else {
        "entries"
    }
}

/// (number of entries, the first [`LIST_MAX`] names sorted, directories with a trailing `/`).
pub fn list_dir(path: &Path) -> io::Result<(usize, Vec<String>)> {
    let mut names = Vec::new();
    for entry in fs::read_dir(path)? {
        let entry = entry?;
        let mut name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = match entry.file_type() {
            Ok(t) if t.is_symlink() => fs::metadata(entry.path())
                .map(|m| m.is_dir())
                .unwrap_or(false),
            Ok(t) => t.is_dir(),
            Err(_) => false,
        };
        if is_dir {
            name.push('/');
        }
        names.push(name);
    }
    names.sort();
    let total = names.len();
    names.truncate(LIST_MAX);
    Ok((total, names))
}

fn listing_text(total: usize, names: &[String]) -> String {
    let mut s = names.join("\n");
    if total > names.len() {
        s.push_str(&format!("\n… and {} more", total - names.len()));
    }
    s
}

/// Runs a tool for real: (result text, is_error).
fn run_tool(name: &str, input: &Value, cwd: &Path) -> (String, bool) {
    let resolve = |p: &str| -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            cwd.join(p)
        }
    };
    match name {
        "LS" => {
            let path = input
                .get("path")
                .and_then(Value::as_str)
                .map(resolve)
                .unwrap_or_else(|| cwd.to_path_buf());
            match list_dir(&path) {
                Ok((total, names)) => (listing_text(total, &names), false),
                Err(e) => (format!("{}: {e}", path.display()), true),
            }
        }
        "Read" => {
            let Some(p) = input.get("file_path").and_then(Value::as_str) else {
                return ("Read needs \"file_path\"".into(), true);
            };
            let path = resolve(p);
            match fs::read(&path) {
                Ok(bytes) => {
                    let cut = bytes.len().min(READ_MAX);
                    let mut s = String::from_utf8_lossy(&bytes[..cut]).into_owned();
                    if bytes.len() > cut {
                        s.push_str(&format!("\n… [{} more bytes]", bytes.len() - cut));
                    }
                    (s, false)
                }
                Err(e) => (format!("{}: {e}", path.display()), true),
            }
        }
        other => (
            format!("the scripted agent cannot run tool {other:?}"),
            true,
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// The process

/// The text of a user-message stdin line (`{"type":"user","message":{"content":…}}`, content a
/// string or text blocks). `None` for anything else: other types, tool results, non-JSON.
pub fn user_text(line: &str) -> Option<String> {
    let v: Value = serde_json::from_str(line.trim()).ok()?;
    if v.get("type")?.as_str()? != "user" {
        return None;
    }
    match v.get("message")?.get("content")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(blocks) => {
            let texts: Vec<&str> = blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect();
            if texts.is_empty() {
                None
            } else {
                Some(texts.join("\n"))
            }
        }
        _ => None,
    }
}

/// `scripted-<pid>-<hex of the clock's nanoseconds>`.
pub fn default_session_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!("scripted-{}-{:x}", std::process::id(), nanos)
}

/// The `__scripted-agent` subcommand: runs until stdin closes (0), a `crash` step (its code),
/// or forever (`hang`). Returns the exit code; the caller must exit with it at once, printing
/// nothing on stdout. A script that cannot be read or parsed is reported on stderr and gives
/// exit code 2.
pub fn run(script: Option<&Path>, system_prompt: Option<&str>) -> io::Result<i32> {
    let script = match script {
        None => Script::default(),
        Some(p) => match Script::load(p) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("paddock scripted agent: {}: {e}", p.display());
                return Ok(2);
            }
        },
    };
    if script.ignore_sigterm {
        use nix::sys::signal::{signal, SigHandler, Signal};
        // SAFETY: installing SIG_IGN runs no handler code.
        unsafe { signal(Signal::SIGTERM, SigHandler::SigIgn) }.map_err(io::Error::from)?;
    }
    if let Some(text) = &script.stderr {
        let mut err = io::stderr().lock();
        writeln!(err, "{text}")?;
        err.flush()?;
    }
    if script.startup_delay_ms > 0 {
        std::thread::sleep(Duration::from_millis(script.startup_delay_ms));
    }
    if let Some(code) = script.crash_on_start {
        return Ok(code);
    }
    let cwd = std::env::current_dir()?;
    let session_id = script.session_id.clone().unwrap_or_else(default_session_id);
    let mut agent =
        Agent::new(script, session_id).with_system_prompt(system_prompt.unwrap_or_default());
    serve(
        &mut agent,
        io::stdin().lock(),
        &mut io::stdout().lock(),
        &mut io::stderr(),
        &cwd,
    )
}

/// The read–answer loop of [`run`], over any streams (for tests). Returns the exit code.
pub fn serve(
    agent: &mut Agent,
    input: impl BufRead,
    out: &mut impl Write,
    err: &mut impl Write,
    cwd: &Path,
) -> io::Result<i32> {
    let mut stdin = Stdin {
        lines: input.lines(),
        queued: std::collections::VecDeque::new(),
    };
    while let Some(text) = stdin.next_message(err)? {
        let mut answer: Option<String> = None;
        for action in agent.answer(&text, cwd) {
            match action {
                Action::Line(l) => {
                    let l = match &answer {
                        Some(a) => l.replace("{answer}", json_inner(a).as_str()),
                        None => l,
                    };
                    if !print(out, &l)? {
                        return Ok(0);
                    }
                }
                Action::Ask {
                    request_id,
                    line,
                    call,
                    tool,
                    input,
                    allowed_result,
                } => {
                    if !print(out, &line)? {
                        return Ok(0);
                    }
                    let Some(response) = stdin.wait_response(&request_id, err)? else {
                        return Ok(0); // stdin closed while waiting: nobody will answer
                    };
                    let (content, is_error) =
                        ask_outcome(&response, &tool, &input, &allowed_result, cwd);
                    answer = Some(content.clone());
                    let l = tool_result_line(&call, &content, is_error, &agent.session_id);
                    if !print(out, &l)? {
                        return Ok(0);
                    }
                }
                Action::Stderr(l) => {
                    let _ = writeln!(err, "{l}");
                    let _ = err.flush();
                }
                Action::Sleep(ms) => std::thread::sleep(Duration::from_millis(ms)),
                Action::Exit(code) => {
                    let _ = out.flush();
                    return Ok(code);
                }
                Action::Signal(n) => {
                    let _ = out.flush();
                    let _ = err.flush();
                    if let Ok(sig) = nix::sys::signal::Signal::try_from(n) {
                        // The Rust runtime handles SIGSEGV / SIGBUS itself (stack overflow
                        // detection): restore the default action so the signal really kills.
                        // SAFETY: setting SIG_DFL installs no handler code.
                        unsafe {
                            let _ =
                                nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl);
                        }
                        let _ = nix::sys::signal::raise(sig);
                    }
                    // Still alive (the signal is ignored or caught): exit as if killed.
                    return Ok(128 + n);
                }
                Action::Hang => loop {
                    std::thread::sleep(Duration::from_secs(3600));
                },
            }
        }
    }
    Ok(0)
}

/// Writes one line and flushes; `false` when nobody reads our output any more.
fn print(out: &mut impl Write, line: &str) -> io::Result<bool> {
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e),
    }
}

/// `s` as the inside of a JSON string literal (to put into a line already serialised).
fn json_inner(s: &str) -> String {
    let quoted = serde_json::to_string(s).expect("a string serialises");
    quoted[1..quoted.len() - 1].to_string()
}

/// The agent's stdin: user messages (some queued while the agent waited for an answer) and
/// control responses.
struct Stdin<L> {
    lines: L,
    queued: std::collections::VecDeque<String>,
}

impl<L: Iterator<Item = io::Result<String>>> Stdin<L> {
    /// The next non-empty line; `None` at EOF.
    fn next_line(&mut self, err: &mut impl Write) -> io::Result<Option<String>> {
        for line in self.lines.by_ref() {
            match line {
                Ok(l) if l.trim().is_empty() => {}
                Ok(l) => return Ok(Some(l)),
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    let _ = writeln!(
                        err,
                        "paddock scripted agent: ignoring a non-UTF-8 stdin line"
                    );
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// The next user message's text; `None` at EOF.
    fn next_message(&mut self, err: &mut impl Write) -> io::Result<Option<String>> {
        if let Some(t) = self.queued.pop_front() {
            return Ok(Some(t));
        }
        while let Some(line) = self.next_line(err)? {
            match user_text(&line) {
                Some(text) => return Ok(Some(text)),
                None if serde_json::from_str::<Value>(&line).is_err() => {
                    let _ = writeln!(
                        err,
                        "paddock scripted agent: ignoring a non-JSON stdin line"
                    );
                }
                None => {}
            }
        }
        Ok(None)
    }

    /// Waits for the `control_response` to `request_id` (its `response.response`); user
    /// messages meanwhile are queued. `None` at EOF.
    fn wait_response(
        &mut self,
        request_id: &str,
        err: &mut impl Write,
    ) -> io::Result<Option<Value>> {
        while let Some(line) = self.next_line(err)? {
            if let Some(text) = user_text(&line) {
                self.queued.push_back(text);
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let r = &v["response"];
            if v["type"] == "control_response" && r["request_id"] == request_id {
                if r["subtype"] == "error" {
                    return Ok(Some(serde_json::json!({
                        "behavior": "deny",
                        "message": r["error"].as_str().unwrap_or("error"),
                    })));
                }
                return Ok(Some(r["response"].clone()));
            }
        }
        Ok(None)
    }
}

/// A tool's result after the controller's answer: (content, is_error).
fn ask_outcome(
    response: &Value,
    tool: &str,
    input: &Value,
    allowed_result: &str,
    cwd: &Path,
) -> (String, bool) {
    let allowed = response["behavior"] == "allow";
    let message = response["message"].as_str().unwrap_or("").to_string();
    if let Some(result) = response.get("result").and_then(Value::as_str) {
        // A client tool's result.
        let is_error = response["is_error"].as_bool().unwrap_or(!allowed);
        return (result.to_string(), is_error);
    }
    if !allowed {
        return (format!("denied: {message}"), true);
    }
    if tool == super::ask::QUESTION_TOOL {
        let answers = response["updatedInput"]["answers"]
            .as_object()
            .map(|m| {
                m.values()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default();
        return (format!("User answered: {answers}"), false);
    }
    let input = response.get("updatedInput").unwrap_or(input);
    match tool {
        "LS" | "Read" => run_tool(tool, input, cwd),
        _ => (allowed_result.to_string(), false),
    }
}

/// A user `tool_result` line.
fn tool_result_line(call: &str, content: &str, is_error: bool, session_id: &str) -> String {
    json_line(&UserLine {
        ty: "user",
        message: UserMessage {
            role: "user",
            content: [ToolResultBlock {
                ty: "tool_result",
                tool_use_id: call,
                content,
                is_error,
            }],
        },
        parent_tool_use_id: None,
        session_id,
    })
}

#[cfg(test)]
mod tests {
    use super::super::claude_stream::{user_message_line, ClaudeStreamParser, Parsed};
    use super::*;
    use paddock_core::{Activity, ActivityKind, ProviderEvent};

    /// The stdout lines of `actions`, up to the first `Exit`, `Signal` or `Hang`.
    fn stdout_lines(actions: &[Action]) -> Vec<String> {
        let mut out = Vec::new();
        for a in actions {
            match a {
                Action::Line(l) | Action::Ask { line: l, .. } => out.push(l.clone()),
                Action::Exit(_) | Action::Signal(_) | Action::Hang => break,
                Action::Stderr(_) | Action::Sleep(_) => {}
            }
        }
        out
    }

    /// A fresh empty directory under the system temp dir.
    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "paddock-scripted-{tag}-{}-{:x}",
            std::process::id(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn parse_all(p: &mut ClaudeStreamParser, lines: &[String]) -> Vec<Parsed> {
        lines.iter().flat_map(|l| p.parse_line(l)).collect()
    }

    fn activities(items: &[Parsed]) -> Vec<Activity> {
        items
            .iter()
            .filter_map(|p| match p {
                Parsed::Event(ProviderEvent::Activity(a)) => Some(a.clone()),
                _ => None,
            })
            .collect()
    }

    fn tokens(a: &[Activity]) -> Vec<(u64, u64)> {
        a.iter()
            .map(|a| (a.tokens_input, a.tokens_output))
            .collect()
    }

    fn sum(a: &[Activity]) -> (u64, u64) {
        a.iter().fold((0, 0), |(i, o), a| {
            (i + a.tokens_input, o + a.tokens_output)
        })
    }

    fn result_usage(line: &str) -> (u64, u64) {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["type"], "result");
        let u = &v["usage"];
        let n = |k: &str| u[k].as_u64().unwrap_or(0);
        (
            n("input_tokens") + n("cache_read_input_tokens") + n("cache_creation_input_tokens"),
            n("output_tokens"),
        )
    }

    #[test]
    fn builtin_turn_through_the_parser() {
        let dir = temp_dir("builtin");
        fs::write(dir.join("b.txt"), "x").unwrap();
        fs::write(dir.join("a.txt"), "x").unwrap();
        fs::create_dir(dir.join("src")).unwrap();
        let mut agent = Agent::new(Script::default(), "sid-1");
        let msg = "hello there, what is in here?"; // 29 bytes: q = 7
        let lines = stdout_lines(&agent.answer(msg, &dir));
        assert_eq!(lines.len(), 6, "{lines:#?}");

        let mut p = ClaudeStreamParser::new();
        let out = parse_all(&mut p, &lines);
        assert_eq!(p.unrecognized_count(), 0, "{out:#?}");
        assert_eq!(
            out[0],
            Parsed::Event(ProviderEvent::SessionRef("sid-1".into()))
        );
        let a = activities(&out);
        use ActivityKind::*;
        let kinds: Vec<_> = a.iter().map(|a| a.kind()).collect();
        assert_eq!(kinds, [Thinking, ToolCall, ToolResult, Status, Completion]);
        assert_eq!(
            a[0].content,
            "The user asked: 'hello there, what is in here?'. I'll look at the working directory first."
        );
        assert_eq!(a[1].tool_name, "LS");
        assert_eq!(a[1].content, dir.display().to_string());
        assert_eq!(a[2].tool_name, "LS");
        assert_eq!(a[2].tool_call_id, a[1].tool_call_id);
        assert!(a[2].tool_success);
        assert_eq!(a[2].content, "a.txt\nb.txt\nsrc/");
        assert_eq!(
            a[3].content,
            "The directory has 3 entries: a.txt, b.txt, src/"
        );
        assert_eq!(
            a[4].content,
            "You said: \"hello there, what is in here?\". The working directory has 3 entries."
        );
        // The documented formula: q = 7.
        assert_eq!(tokens(&a), [(57, 8), (0, 12), (0, 0), (57, 10), (0, 0)]);
        assert_eq!(sum(&a), (100 + 2 * 7, 30));
        assert_eq!(sum(&a), result_usage(&lines[5]));

        // The second message: no init, no SessionRef; same totals for the same length.
        let lines = stdout_lines(&agent.answer("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmnopq", &dir));
        assert_eq!(lines.len(), 5);
        let out = parse_all(&mut p, &lines);
        assert!(out
            .iter()
            .all(|o| matches!(o, Parsed::Event(ProviderEvent::Activity(_)))));
        let a = activities(&out);
        assert!(a[0].content.ends_with("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefgh…'. I'll look at the working directory first."), "{}", a[0].content);
        assert_eq!(sum(&a), (100 + 2 * 22, 30));
        assert_eq!(a[4].kind(), Completion);
        assert_eq!((a[4].tokens_input, a[4].tokens_output), (0, 0));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn builtin_listing_is_capped_and_errors_are_reported() {
        let dir = temp_dir("cap");
        for i in 0..205 {
            fs::write(dir.join(format!("f{i:03}")), "").unwrap();
        }
        let (total, names) = list_dir(&dir).unwrap();
        assert_eq!(total, 205);
        assert_eq!(names.len(), 200);
        let text = listing_text(total, &names);
        assert!(text.starts_with("f000\nf001\n"));
        assert!(text.ends_with("f199\n… and 5 more"));
        let mut agent = Agent::new(Script::default(), "s");
        let a = activities(&parse_all(
            &mut ClaudeStreamParser::new(),
            &stdout_lines(&agent.answer("hi", &dir)),
        ));
        assert_eq!(
            a[3].content,
            "The directory has 205 entries: f000, f001, f002, f003, f004…"
        );
        assert!(a[4].content.contains("205 entries"));

        let gone = dir.join("missing");
        let a = activities(&parse_all(
            &mut ClaudeStreamParser::new(),
            &stdout_lines(&Agent::new(Script::default(), "s").answer("hi", &gone)),
        ));
        assert!(!a[2].tool_success);
        assert_eq!(a[4].kind(), ActivityKind::Completion);
        assert!(a[4].content.contains("could not list"), "{}", a[4].content);
        let _ = fs::remove_dir_all(&dir);
    }

    const EXAMPLE: &str = include_str!("testdata/scripted_example.json");

    #[test]
    fn script_turn_through_the_parser() {
        let dir = temp_dir("script");
        fs::write(dir.join("only.txt"), "contents of only").unwrap();
        let script = parse_script(EXAMPLE).unwrap();
        assert_eq!(script.session_id.as_deref(), Some("fixed-session"));
        let mut agent = Agent::new(script.clone(), script.session_id.clone().unwrap());
        let actions = agent.answer("build it", &dir);
        assert_eq!(actions[1], Action::Sleep(20));
        let lines = stdout_lines(&actions);
        let mut p = ClaudeStreamParser::new();
        let out = parse_all(&mut p, &lines);
        assert_eq!(p.unrecognized_count(), 1);
        assert!(out.contains(&Parsed::Unrecognized("this is not json {".into())));
        let a = activities(&out);
        use ActivityKind::*;
        let kinds: Vec<_> = a.iter().map(|a| a.kind()).collect();
        assert_eq!(
            kinds,
            [
                Thinking, ToolCall, ToolResult, ToolCall, ToolResult, ToolCall, ToolResult, Status,
                Completion
            ]
        );
        assert_eq!(
            a[0].content,
            "Turn 1: looking at ".to_string() + &dir.display().to_string()
        );
        assert_eq!(a[2].content, "only.txt");
        assert_eq!(
            (a[3].tool_name.as_str(), a[3].content.as_str()),
            ("Read", "only.txt")
        );
        assert_eq!(a[4].content, "contents of only");
        assert_eq!(
            (a[5].tool_name.as_str(), a[5].content.as_str()),
            ("Bash", "make")
        );
        assert_eq!(a[6].content, "make: nothing to do");
        assert!(!a[6].tool_success);
        assert_eq!(a[6].tool_name, "Bash");
        assert_eq!(a[8].content, "Built: build it");
        // Steps: (10,5) + (3,1)->(3,4) on one message id + (2,2) + (1,1); result 100/40.
        assert_eq!(
            tokens(&a),
            [
                (10, 5),
                (3, 1),
                (0, 0),
                (0, 3),
                (0, 0),
                (2, 2),
                (0, 0),
                (1, 1),
                (84, 28)
            ]
        );
        assert_eq!(sum(&a), (100, 40));
        let v: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
        assert_eq!(v["duration_ms"], 20);
        assert_eq!(v["num_turns"], 4);

        // Message 2: an error result with api_error_status, then a crash mid-turn.
        let actions = agent.answer("again", &dir);
        assert_eq!(actions.last(), Some(&Action::Exit(3)));
        let a = activities(&parse_all(&mut p, &stdout_lines(&actions)));
        assert_eq!(a.len(), 2);
        assert_eq!(a[1].kind(), Error);
        assert_eq!(a[1].content, "claude: API error status 529: overloaded");
        assert_eq!((a[0].tokens_input, a[0].tokens_output), (7, 0));
        assert_eq!((a[1].tokens_input, a[1].tokens_output), (5, 0));
        assert!(actions.contains(&Action::Stderr("about to crash in turn 2".into())));

        // Message 3 and later: repeat_last → the same crash.
        let actions = agent.answer("third", &dir);
        assert_eq!(actions.last(), Some(&Action::Exit(3)));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn repeat_last_false_falls_back_to_builtin_and_hang() {
        let s = parse_script(
            r#"{"turns":[{"steps":[{"delay_ms":5},{"hang":true}]}],"repeat_last":false}"#,
        )
        .unwrap();
        let mut agent = Agent::new(s, "s");
        let dir = temp_dir("hang");
        let first = agent.answer("x", &dir);
        assert!(matches!(first[0], Action::Line(_))); // init
        assert_eq!(&first[1..], [Action::Sleep(5), Action::Hang]);
        let second = stdout_lines(&agent.answer("y", &dir));
        assert_eq!(second.len(), 5); // builtin, no init
                                     // Empty steps: nothing at all after init.
        let mut silent = Agent::new(parse_script(r#"{"turns":[{"steps":[]}]}"#).unwrap(), "s");
        assert_eq!(silent.answer("x", &dir).len(), 1);
        assert!(silent.answer("x", &dir).is_empty());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn script_parser_defaults_and_errors() {
        let s = parse_script("{}").unwrap();
        assert_eq!(s, Script::default());
        let s = parse_script(
            r#"{"comment":"c","turns":[{"comment":"t","steps":[{"garbage":"x","delay_ms":3,"comment":"s"},{"builtin":true},{"signal":9},{"crash":0},{"delay_ms":1}]}],
               "startup_delay_ms":7,"crash_on_start":4,"ignore_sigterm":true,"stderr":"e","model":"m"}"#,
        )
        .unwrap();
        assert_eq!(s.startup_delay_ms, 7);
        assert_eq!(s.crash_on_start, Some(4));
        assert!(s.ignore_sigterm && s.repeat_last);
        assert_eq!(s.stderr.as_deref(), Some("e"));
        assert_eq!(s.model.as_deref(), Some("m"));
        let kinds: Vec<_> = s.turns[0].steps.iter().map(|s| s.kind.clone()).collect();
        assert_eq!(
            kinds,
            [
                StepKind::Raw("x".into()),
                StepKind::Builtin,
                StepKind::Signal(9),
                StepKind::Crash(0),
                StepKind::Wait
            ]
        );
        assert_eq!(s.turns[0].steps[0].delay_ms, 3);

        let err = |t: &str| parse_script(t).unwrap_err();
        assert!(err("not json").starts_with("invalid script"));
        assert!(err(r#"{"turnz":[]}"#).contains("unknown field"));
        assert!(err(r#"{"turns":[{"stepz":[]}]}"#).contains("unknown field"));
        assert_eq!(
            err(r#"{"turns":[{"steps":[{"text":"a"}]},{"steps":[{"text":"a","thinking":"b"}]}]}"#),
            "turn 2 step 1: a step has one kind, found text, thinking"
        );
        assert_eq!(
            err(r#"{"turns":[{"steps":[{"tool":"LS","inptu":{}}]}]}"#),
            "turn 1 step 1: unknown key \"inptu\" in a \"tool\" step (allowed: delay_ms, input, id, tokens_in, tokens_out, message_id)"
        );
        assert!(
            err(r#"{"turns":[{"steps":[{"crash":3,"is_error":true}]}]}"#)
                .contains("allowed: delay_ms)")
        );
        assert!(err(r#"{"turns":[{"steps":[{}]}]}"#).starts_with("turn 1 step 1: empty step"));
        assert!(
            err(r#"{"turns":[{"steps":[{"tokens_in":3}]}]}"#).contains("unknown key \"tokens_in\"")
        );
        assert!(err(r#"{"turns":[{"steps":[{"text":5}]}]}"#).contains("\"text\" must be a string"));
        assert!(
            err(r#"{"turns":[{"steps":[{"thinking":"a","tokens_in":-1}]}]}"#)
                .contains("non-negative")
        );
        assert!(err(r#"{"turns":[{"steps":[{"hang":false}]}]}"#).contains("must be true"));
        assert!(err(r#"{"turns":[{"steps":[{"crash":"x"}]}]}"#).contains("integer"));
        assert!(err(r#"{"turns":[{"steps":[{"signal":0}]}]}"#).contains("signal number"));
        assert!(err(r#"{"turns":[{"steps":[{"tool":"X","input":[1]}]}]}"#).contains("object"));
        assert!(
            err(r#"{"turns":[{"steps":[{"result":"r","api_error_status":{}}]}]}"#)
                .contains("api_error_status")
        );
    }

    #[test]
    fn placeholders() {
        let mut agent = Agent::new(
            parse_script(
                r#"{"turns":[{"steps":[{"raw":"{turn}|{message}|{session_id}|{nope}|{|}"}]}]}"#,
            )
            .unwrap(),
            "S",
        );
        let dir = temp_dir("ph");
        let lines = stdout_lines(&agent.answer("{cwd} stays", &dir));
        assert_eq!(lines[1], "1|{cwd} stays|S|{nope}|{|}");
        // `{system_prompt}`: what --append-system-prompt gave, empty without.
        let script =
            parse_script(r#"{"turns":[{"steps":[{"raw":"[{system_prompt}]"}]}]}"#).unwrap();
        let mut plain = Agent::new(script.clone(), "S");
        assert_eq!(stdout_lines(&plain.answer("x", &dir))[1], "[]");
        let mut told = Agent::new(script, "S").with_system_prompt("be brief, please");
        assert_eq!(
            stdout_lines(&told.answer("x", &dir))[1],
            "[be brief, please]"
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn user_text_accepts_what_user_message_line_makes() {
        assert_eq!(
            user_text(&user_message_line("hi\nthere")).as_deref(),
            Some("hi\nthere")
        );
        assert_eq!(
            user_text(r#"{"type":"user","message":{"role":"user","content":"plain"}}"#).as_deref(),
            Some("plain")
        );
        assert_eq!(
            user_text(
                r#"{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]}}"#
            ),
            None
        );
        assert_eq!(
            user_text(r#"{"type":"control_response","response":{}}"#),
            None
        );
        assert_eq!(user_text("garbage"), None);
    }

    #[test]
    fn serve_answers_each_message_and_stops_at_eof_or_crash() {
        let dir = temp_dir("serve");
        let input = format!(
            "{}\n\n{{\"type\":\"control_response\"}}\nnot json\n{}\n",
            user_message_line("one"),
            user_message_line("two")
        );
        let mut agent = Agent::new(Script::default(), "sid");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = serve(&mut agent, input.as_bytes(), &mut out, &mut err, &dir).unwrap();
        assert_eq!(code, 0);
        let out = String::from_utf8(out).unwrap();
        assert_eq!(out.lines().count(), 6 + 5);
        assert!(String::from_utf8(err).unwrap().contains("non-JSON"));
        let mut p = ClaudeStreamParser::new();
        let completions: Vec<_> = activities(
            &out.lines()
                .flat_map(|l| p.parse_line(l))
                .collect::<Vec<_>>(),
        )
        .into_iter()
        .filter(|a| a.kind() == ActivityKind::Completion)
        .map(|a| a.content)
        .collect();
        assert_eq!(
            completions,
            [
                "You said: \"one\". The working directory has 0 entries.",
                "You said: \"two\". The working directory has 0 entries.",
            ]
        );

        let script =
            parse_script(r#"{"turns":[{"steps":[{"text":"bye"},{"crash":7},{"text":"never"}]}]}"#)
                .unwrap();
        let mut agent = Agent::new(script, "sid");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let input = format!("{}\n{}\n", user_message_line("a"), user_message_line("b"));
        let code = serve(&mut agent, input.as_bytes(), &mut out, &mut err, &dir).unwrap();
        assert_eq!(code, 7);
        let out = String::from_utf8(out).unwrap();
        assert_eq!(out.lines().count(), 2); // init + "bye"
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn asking_steps_wait_for_the_answer_and_queue_messages_meanwhile() {
        let script = parse_script(
            r#"{"turns":[{"steps":[
                {"ask":"Bash","input":{"command":"make"},"allowed_result":"built"},
                {"question":"Which DB?","options":["PG 14","PG 15"]},
                {"client_tool":"run_tests","input":{}},
                {"result":"done: {answer}"}
            ]}, {"steps":[{"result":"second"}]}]}"#,
        )
        .unwrap();
        let mut agent = Agent::new(script, "s");
        let stdin = [
            user_message_line("go"),
            // A message while the agent waits is answered after this turn.
            user_message_line("next"),
            crate::providers::claude_stream::control_response_deny("req_scripted_1_1", "not now"),
            crate::providers::claude_stream::control_response_allow(
                "req_scripted_1_2",
                &serde_json::json!({"questions":[{"question":"Which DB?"}],"answers":{"Which DB?":"PG 15"}}),
            ),
            r#"{"type":"control_response","response":{"subtype":"success","request_id":"req_scripted_1_3","response":{"behavior":"allow","result":"7 passed \"ok\"","is_error":false}}}"#.to_string(),
        ]
        .join("\n");
        let mut out = Vec::new();
        let code = serve(
            &mut agent,
            stdin.as_bytes(),
            &mut out,
            &mut Vec::new(),
            Path::new("/"),
        )
        .unwrap();
        assert_eq!(code, 0);
        let out = String::from_utf8(out).unwrap();
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let results: Vec<(String, bool)> = lines
            .iter()
            .filter(|l| l["type"] == "user")
            .map(|l| {
                let b = &l["message"]["content"][0];
                (
                    b["content"].as_str().unwrap().to_string(),
                    b["is_error"].as_bool().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            results,
            [
                ("denied: not now".to_string(), true),
                ("User answered: PG 15".to_string(), false),
                ("7 passed \"ok\"".to_string(), false),
            ]
        );
        let requests: Vec<&Value> = lines
            .iter()
            .filter(|l| l["type"] == "control_request")
            .collect();
        assert_eq!(requests.len(), 3);
        assert_eq!(requests[2]["request"]["subtype"], "client_tool");
        let finals: Vec<&str> = lines
            .iter()
            .filter(|l| l["type"] == "result")
            .map(|l| l["result"].as_str().unwrap())
            .collect();
        assert_eq!(finals, ["done: 7 passed \"ok\"", "second"]);
    }
}
