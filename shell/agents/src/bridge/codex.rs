//! The codex bridge: one `codex exec --json` process per turn.
//!
//! Each user message runs `codex exec --json … -- <prompt>`; once the first turn reported its
//! thread (`thread.started`), later turns — and a restarted session, which gets the thread id
//! back as `--resume` — run `codex exec resume --json … -- <thread_id> <prompt>`. Codex keeps
//! the conversation itself (under `$CODEX_HOME/sessions`, default `~/.codex`), so a resumed
//! thread needs the same `CODEX_HOME`. The process's stdin is `/dev/null` (an open stdin makes
//! codex wait for more prompt forever); a prompt that cannot be one argument (over
//! [`MAX_ARG_PROMPT`] bytes, or exactly `-`, which codex reads as "the prompt is on stdin") is
//! given as `-` and written to a pipe that is then closed.
//!
//! The command line (checked against codex-cli 0.169.0, `tests/providers/codex.rs`):
//!
//! ```text
//! <command> exec [resume] --json --skip-git-repo-check [-m <model>]
//!     -c approval_policy="never" -c sandbox_mode="<from permissions>"
//!     -c check_for_update_on_startup=false -c analytics.enabled=false
//!     [-c mcp_servers.paddock.command="<paddock>" -c mcp_servers.paddock.args=["__mcp-relay", "<socket>"]
//!      -c mcp_servers.paddock.default_tools_approval_mode="approve"]
//!     [-c <each codex_config line>] -- [<thread_id>] <prompt>
//! ```
//!
//! The `mcp_servers.paddock` settings come when the session has client tools
//! (`provider_config["client_tools"]`, sunbeam's): the bridge serves paddock's MCP server on a
//! private socket ([`super::mcp_socket`]) and codex starts `paddock __mcp-relay` to reach it.
//! Codex 0.169 offers MCP tools to models that can search tools only behind its `tool_search`
//! (deferred), and routes a model's call by its `namespace` (`mcp__paddock`) and bare name
//! (`run_tests`); the call's `mcp_tool_call` item shows under the client's tool name.
//!
//! `<command>` is `provider_config["command"]` (default `codex`). `--skip-git-repo-check`:
//! a campaign root need not be a git repository (without it codex exits 1, "Not inside a
//! trusted directory"). Options go after `resume` (`codex exec resume` has no `--sandbox` flag,
//! so the sandbox is set with `-c` for both forms; a later `-c` of the same key wins).
//!
//! ## provider_config
//!
//! | key | meaning |
//! |---|---|
//! | `command` | the codex command line (split like a shell would) |
//! | `permissions` | the session's policy, mapped onto codex's sandbox (below) |
//! | `codex_config` | more codex settings: one `key=value` per line (blank lines and `#` lines skipped), each passed as `-c key=value` after paddock's own, so they win; the value is TOML (a bare word is taken as a string), e.g. `model_provider=fake` or `model_reasoning_effort="low"` |
//!
//! ## Permissions
//!
//! `codex exec` never asks a human: its approval policy is always `never` here, and what a
//! tool may do is decided by codex's sandbox alone.
//!
//! | `permissions` | codex | what the agent can do |
//! |---|---|---|
//! | `allow-all` (in a sandbox, the daemon's default) | `sandbox_mode="danger-full-access"` | run any command, edit any file, use the network |
//! | `deny` | `sandbox_mode="read-only"` | read files and run commands that only read; writes fail (`Read-only file system`), patches are rejected |
//! | `allow:…` naming a tool that writes (`command_execution`, `file_change`, or Claude's `Bash`, `Write`, `Edit`, `MultiEdit`, `NotebookEdit`; also `shell`, `exec_command`, `apply_patch`) | `sandbox_mode="workspace-write"` | edit files and run commands inside the working directory (and temp dirs), no network |
//! | `allow:…` naming none of those | `sandbox_mode="read-only"` | as `deny` |
//!
//! Codex's sandbox cannot tell one tool from another beyond this: shell commands and patches
//! are both writes. As root in paddock's container (Debian 12), codex 0.169's Linux sandbox
//! works (`read-only` really makes the file system read-only to tool commands, and
//! `workspace-write` confines writes to the workspace); `allow-all` needs no sandbox at all,
//! so it runs tools whether or not the sandbox is available on a machine. One quirk of codex
//! 0.169: a command its sandbox fails within a few milliseconds (`echo x > f` under
//! `read-only`) is reported to the model but printed as no `command_execution` item at all, so
//! the session shows no tool call for it; a command that runs a moment longer is printed as
//! usual (failed, `Read-only file system`). A rejected patch is never printed (codex logs
//! "patch rejected: writing is blocked by read-only sandbox" on stderr).
//!
//! ## What the bridge prints
//!
//! Each line is decoded by paddock's one codex decoder, [`paddock_runner::codex::map_line`]
//! (the seed's `ExecEvent`, as the runner's `Exec` streams it); an MCP call's server, tool,
//! arguments and result, which the seed's item has no fields for, are read from the item's
//! own JSON, which the decoder keeps in `ItemEvent.raw`.
//!
//! | `codex exec --json` | bridge |
//! |---|---|
//! | `thread.started {thread_id}` | [`Out::init`] (the daemon keeps the thread id for `--resume`) |
//! | `turn.started` | nothing |
//! | `item.completed` `agent_message {text}` | [`Out::text`]; the last one is the turn's result text |
//! | `item.completed` `reasoning {text}` | [`Out::thinking`] |
//! | `item.started` / `item.completed` `command_execution {command, aggregated_output, exit_code, status}` | tool `command_execution` `{command}` / its result: the output, failed when `status` is not `completed` or `exit_code` is not 0 |
//! | `file_change {changes[{path, kind}], status}` | tool `file_change` `{changes}` / `kind path` per line, failed when `status` is `failed` |
//! | `mcp_tool_call {server, tool, arguments, result, error, status}` | tool `mcp_tool_call` `{server, tool, arguments}` / the result's text blocks or the error |
//! | `web_search {query}` | tool `web_search` `{query}` / the query |
//! | `todo_list {items[{text, completed}]}` (started, updated, completed) | [`Out::text`] with a checklist, each time it changes |
//! | `item.completed` `error {message}` | [`Out::status`] `codex: <message>`: codex's *warnings* (e.g. "Model metadata for `x` not found. Defaulting to fallback metadata"); the turn goes on and may well complete |
//! | `error {message}` | kept as the turn's last error (codex prints it right before `turn.failed`, and for retried stream errors), and passed on raw |
//! | `turn.completed {usage}` | [`Out::result`]: success, the last agent message, the usage |
//! | `turn.failed {error{message}}` | [`Out::result`]: an error with that message |
//! | anything else (unknown events, items, non-JSON) | [`Out::raw`] |
//!
//! A tool item's id is prefixed with the turn's number (`t3:item_0`): codex numbers items from
//! `item_0` in every process.
//!
//! Usage: codex reports it at `turn.completed` only, and as the *thread's* running total, not
//! the turn's: `input_tokens` (all of them, cached ones included, as the Responses API counts),
//! `cached_input_tokens` (the cached part), `output_tokens` (reasoning included), and fields
//! beyond those (0.169 adds `cache_write_input_tokens` — part of `input_tokens` — and
//! `reasoning_output_tokens` — part of `output_tokens`), summed over every model call of the
//! thread since it began: a resumed thread's second turn of 100 tokens reports 200. Parsed
//! leniently (a missing or odd field is 0). The bridge takes the thread's total before the turn
//! — the last one it saw, or, for the first turn of a restarted bridge, the last `token_count`
//! event's `total_token_usage` in codex's own record of the thread
//! (`$CODEX_HOME/sessions/**/rollout-*-<thread_id>.jsonl`; none found: 0) — and reports the
//! difference. Should a total ever go down (a codex that reports per turn), it is taken as the
//! turn's own. The result carries input = `input_tokens − cached_input_tokens`, cache read =
//! `cached_input_tokens`, output = `output_tokens` (each the turn's part), so the daemon's input
//! total (input + cache reads) counts codex's `input_tokens` once. The model calls of a turn
//! that failed are in the thread's total, so they are counted with the next turn that
//! completes; a turn cut short by a stop ends its bridge, and the next bridge starts from the
//! total in codex's record, so what that turn spent is not counted.
//!
//! How a turn ends:
//! - `turn.completed` → COMPLETION; `turn.failed` → ERROR with its message (codex 0.169 says
//!   "We're currently experiencing high demand, …" for a 5xx, the API's error JSON for a 4xx,
//!   "stream disconnected before completion: …" for a `response.failed`);
//! - codex exits without either (a lost thread on resume: exit 1, "Error: thread/resume: … no
//!   rollout found for thread id …"; a bad `-c`; …) → ERROR with the last `error` event's
//!   message, if any, and the exit status with codex's stderr tail (its backtrace cut off);
//! - codex killed by a signal → the bridge dies by the same signal ([`super::die_like`]), so
//!   the daemon sees the crash (codex's npm launcher killed leaves the codex binary holding
//!   stdout: the bridge reads at most [`paddock_sys::proc::DRAIN_AFTER_EXIT`] past its child's exit);
//! - codex cannot be started → ERROR.
//!
//! The session goes on after an ERROR turn: the next message runs codex again (resuming the
//! thread if there is one).
//!
//! ## Stopping, and codex's tool processes
//!
//! Codex runs each tool command in a session of its own (`setsid`: pgid = sid = the tool's
//! shell), so the daemon's TERM/KILL to the bridge's process group does not reach it, and on
//! TERM codex ends the tool's shell but not what the shell started (`sleep 300; echo done`
//! leaves `sleep 300` running). Those processes carry the session's containment tag: when the
//! bridge exits (the stop's TERM ends it, by default action), the daemon kills every process
//! still tagged (`paddock_sys::contain`). A tool's background process (a server the model started)
//! thus lives as long as the session, and no longer.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

use paddock_core::Provider;
use paddock_proto::runner::v1::{EventType, ExecEvent, ItemEvent, ItemType, TurnUsage};
use serde_json::{json, Value};

use super::wire::{Out, TurnEnd, Usage};
use super::{die_like, run_turn, Bridge, Error, TurnExit};
use crate::{agent_command, mcp, PermissionPolicy};

/// Longest prompt given as an argument; a longer one goes through stdin (Linux refuses a single
/// argument over 128 KiB).
pub const MAX_ARG_PROMPT: usize = 100_000;

/// Tools whose permission lets a codex session write (an `allow:` list naming one of these runs
/// codex with `workspace-write`).
const WRITING_TOOLS: &[&str] = &[
    "command_execution",
    "file_change",
    "shell",
    "exec_command",
    "apply_patch",
    "Bash",
    "Write",
    "Edit",
    "MultiEdit",
    "NotebookEdit",
];

/// The codex sandbox for a session's permission policy (see the module doc).
pub fn sandbox_mode(policy: &PermissionPolicy) -> &'static str {
    match policy {
        PermissionPolicy::AllowAll => "danger-full-access",
        PermissionPolicy::Deny => "read-only",
        // `ask` is refused at create for codex (nobody can be asked); as a list it is safe.
        PermissionPolicy::Allow(tools) | PermissionPolicy::Ask(tools) => {
            if tools.iter().any(|t| WRITING_TOOLS.contains(&t.as_str())) {
                "workspace-write"
            } else {
                "read-only"
            }
        }
    }
}

/// `provider_config["codex_config"]`: one `key=value` per line, blank and `#` lines skipped.
pub fn extra_config(text: Option<&str>) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    for (n, line) in text.unwrap_or("").lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.split_once('=') {
            Some((k, _)) if !k.trim().is_empty() => out.push(line.to_string()),
            _ => {
                return Err(Error::CodexConfigLine {
                    line: n + 1,
                    text: line.to_string(),
                })
            }
        }
    }
    Ok(out)
}

/// Checks a codex session's provider_config (at CreateSession).
pub fn validate_config(config: &std::collections::BTreeMap<String, String>) -> Result<(), Error> {
    extra_config(config.get("codex_config").map(String::as_str)).map(|_| ())
}

/// How to run codex for this session.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The command line (`codex`, or `provider_config["command"]` split).
    pub argv: Vec<String>,
    pub model: String,
    pub sandbox: &'static str,
    /// `-c` values from `codex_config`, after paddock's own.
    pub extra: Vec<String>,
    /// `-c` values naming paddock's MCP server (the client's tools), when it serves one.
    pub mcp: Vec<String>,
}

impl Settings {
    pub fn new(bridge: &Bridge) -> Result<Settings, Error> {
        let policy =
            PermissionPolicy::parse(bridge.config("permissions")).map_err(Error::Permissions)?;
        Ok(Settings {
            argv: agent_command(Provider::Codex, &bridge.config)?,
            model: bridge.model.clone(),
            sandbox: sandbox_mode(&policy),
            extra: extra_config(bridge.config("codex_config"))?,
            mcp: Vec::new(),
        })
    }

    /// Names paddock's MCP server on `socket` to codex: it starts `exe __mcp-relay socket`
    /// itself. Its tools need no approval from codex (whose policy here is `never`, which
    /// refuses every MCP call that would ask): the client that runs them is the one asked.
    pub fn serve_mcp(&mut self, exe: &Path, socket: &Path) {
        let quote = |s: &str| serde_json::to_string(s).expect("strings serialise");
        let server = format!("mcp_servers.{}", mcp::SERVER);
        self.mcp = vec![
            format!("{server}.command={}", quote(&exe.display().to_string())),
            format!(
                "{server}.args=[{}, {}]",
                quote("__mcp-relay"),
                quote(&socket.display().to_string())
            ),
            format!("{server}.default_tools_approval_mode=\"approve\""),
        ];
    }

    /// The arguments after the program for one turn: a new thread, or `thread` resumed.
    /// `prompt_arg` is the prompt itself, or `-` when it goes through stdin.
    pub fn args(&self, thread: Option<&str>, prompt_arg: &str) -> Vec<String> {
        let mut a: Vec<String> = self.argv[1..].to_vec();
        a.push("exec".into());
        if thread.is_some() {
            a.push("resume".into());
        }
        a.extend(["--json".into(), "--skip-git-repo-check".into()]);
        if !self.model.is_empty() {
            a.extend(["-m".into(), self.model.clone()]);
        }
        let ours = [
            "approval_policy=\"never\"".to_string(),
            format!("sandbox_mode=\"{}\"", self.sandbox),
            "check_for_update_on_startup=false".to_string(),
            "analytics.enabled=false".to_string(),
        ];
        for kv in ours
            .into_iter()
            .chain(self.mcp.iter().cloned())
            .chain(self.extra.iter().cloned())
        {
            a.push("-c".into());
            a.push(kv);
        }
        a.push("--".into());
        if let Some(t) = thread {
            a.push(t.into());
        }
        a.push(prompt_arg.into());
        a
    }
}

/// Runs turns until stdin closes (a stop ends the bridge by its signal).
pub fn run(bridge: &Bridge) -> Result<(), Error> {
    let mut settings = Settings::new(bridge)?;
    // The client's tools, from paddock's MCP server: a socket this bridge serves, named to
    // each turn's codex with `-c mcp_servers.paddock…` (codex starts the relay).
    let served = super::mcp_socket::serve_client_tools(bridge)?;
    if let Some(s) = &served {
        settings.serve_mcp(&s.exe, &s.socket);
    }
    let mut thread = bridge.resume.clone();
    // The thread's token totals as of the last turn this bridge saw end.
    let mut totals: Option<(String, Totals)> = None;
    let mut turn_no = 0u64;
    while let Some(prompt) = bridge.input.next_user() {
        turn_no += 1;
        let via_stdin = prompt.len() > MAX_ARG_PROMPT || prompt == "-";
        let args = settings.args(thread.as_deref(), if via_stdin { "-" } else { &prompt });
        let mut cmd = Command::new(&settings.argv[0]);
        cmd.args(&args).current_dir(&bridge.cwd);
        let before = match (&thread, &totals) {
            (None, _) => Totals::default(),
            (Some(t), Some((known, n))) if known == t => *n,
            (Some(t), _) => codex_home()
                .and_then(|h| recorded_totals(&h, t))
                .unwrap_or_default(),
        };
        // Until a turn completes, the thread's last known total is this one: a turn that
        // fails is then counted with the next turn that completes.
        if let Some(t) = &thread {
            if totals.as_ref().is_none_or(|(known, _)| known != t) {
                totals = Some((t.clone(), before));
            }
        }
        let mut mapper = Mapper::new(&bridge.out, turn_no, thread.clone(), before);
        let exit = run_turn(
            &mut cmd,
            via_stdin.then_some(prompt.as_bytes()),
            super::EXIT_AFTER_TURN,
            |l| {
                mapper.line(l);
                mapper.finished()
            },
        );
        if let Some(t) = &mapper.thread {
            thread = Some(t.clone());
            match mapper.after {
                Some(after) => totals = Some((t.clone(), after)),
                // A failed first turn of a new thread: its calls count with the next turn.
                None if totals.as_ref().is_none_or(|(known, _)| known != t) => {
                    totals = Some((t.clone(), before));
                }
                None => {}
            }
        }
        match exit {
            Err(e) => mapper.fail(format!("could not start {}: {e}", settings.argv[0])),
            Ok(exit) => {
                if !mapper.finished() {
                    if exit.signal.is_some() {
                        die_like(&exit, "codex");
                    }
                    mapper.fail(unfinished_text(mapper.last_error.as_deref(), &exit));
                }
            }
        }
    }
    Ok(())
}

/// The ERROR text of a turn codex left without `turn.completed` / `turn.failed`.
pub fn unfinished_text(last_error: Option<&str>, exit: &TurnExit) -> String {
    let exit = TurnExit {
        stderr_tail: clean_stderr(&exit.stderr_tail),
        ..exit.clone()
    };
    match last_error {
        Some(e) => format!("{e} (codex {})", exit.describe()),
        None => format!("codex ended before the turn did: {}", exit.describe()),
    }
}

/// Codex's stderr without its noise: the backtrace of an `Error:` (from "Stack backtrace:" on)
/// and the "Reading additional input from stdin..." it prints on every run.
pub fn clean_stderr(tail: &str) -> String {
    let tail = match tail.find("Stack backtrace:") {
        Some(i) => &tail[..i],
        None => tail,
    };
    tail.lines()
        .filter(|l| l.trim() != "Reading additional input from stdin...")
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_string()
}

/// Lenient token count: an integer, a float or a numeric string; anything else is 0.
fn count(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::Number(n)) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|f| *f > 0.0).map(|f| f as u64))
            .unwrap_or(0),
        Some(Value::String(s)) => s.trim().parse().unwrap_or(0),
        _ => 0,
    }
}

/// A thread's running token totals, as codex reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// All input tokens, cached ones included.
    pub input: u64,
    pub cached: u64,
    pub output: u64,
}

impl Totals {
    /// From a rollout's `total_token_usage`, leniently.
    pub fn parse(u: &Value) -> Totals {
        Totals {
            input: count(u.get("input_tokens")),
            cached: count(u.get("cached_input_tokens")),
            output: count(u.get("output_tokens")),
        }
    }

    /// From `turn.completed`'s decoded usage (a negative count is 0).
    pub fn of(u: &TurnUsage) -> Totals {
        let count = |n: i32| u64::try_from(n).unwrap_or(0);
        Totals {
            input: count(u.input_tokens),
            cached: count(u.cached_input_tokens),
            output: count(u.output_tokens),
        }
    }

    /// The usage of the turn that took the thread from `before` to `self`, as the wire counts
    /// it (input without the cached part).
    pub fn since(self, before: Totals) -> Usage {
        let grew = self.input >= before.input
            && self.cached >= before.cached
            && self.output >= before.output;
        let turn = if grew {
            Totals {
                input: self.input - before.input,
                cached: self.cached - before.cached,
                output: self.output - before.output,
            }
        } else {
            self
        };
        Usage::from_prompt_inclusive(turn.input, turn.cached, turn.output)
    }
}

/// Where codex keeps its threads: `$CODEX_HOME`, else `~/.codex`.
pub fn codex_home() -> Option<std::path::PathBuf> {
    match std::env::var_os("CODEX_HOME") {
        Some(h) if !h.is_empty() => Some(h.into()),
        _ => std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".codex")),
    }
}

/// The thread's running totals as codex last recorded them: the last `token_count` event of
/// its rollout file under `<home>/sessions`. `None` if there is no such file or event.
/// How much of the end of codex's record of a thread [`recorded_totals`] reads.
const ROLLOUT_TAIL: u64 = 4 * 1024 * 1024;

/// The last `max` bytes of a file, from the first whole line in them.
fn read_tail(path: &std::path::Path, max: u64) -> std::io::Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let start = len.saturating_sub(max);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    f.take(max).read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    Ok(if start > 0 {
        // The first line is probably cut: skip it.
        text.split_once('\n')
            .map(|(_, rest)| rest.to_string())
            .unwrap_or_default()
    } else {
        text
    })
}

pub fn recorded_totals(home: &std::path::Path, thread: &str) -> Option<Totals> {
    let suffix = format!("-{thread}.jsonl");
    let mut dirs = vec![home.join("sessions")];
    let mut file = None;
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() {
                dirs.push(p);
            } else if name.starts_with("rollout-") && name.ends_with(&suffix) {
                file = Some(p);
            }
        }
    }
    // The last token count is near the end: read at most the file's last ROLLOUT_TAIL bytes
    // (a long thread's record can be hundreds of megabytes).
    let text = read_tail(&file?, ROLLOUT_TAIL).ok()?;
    text.lines()
        .rev()
        .filter(|l| l.contains("\"token_count\""))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| {
            v.pointer("/payload/info/total_token_usage")
                .filter(|u| u.is_object())
                .map(Totals::parse)
        })
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// One turn's `codex exec --json` lines → the bridge's lines.
pub struct Mapper<'o> {
    out: &'o Out,
    turn: u64,
    /// The thread: known before the turn (resume) or from `thread.started`.
    pub thread: Option<String>,
    /// The last agent message: the turn's result text.
    last_text: String,
    /// The last top-level `error` event's message.
    pub last_error: Option<String>,
    /// Tool ids whose call was printed and whose result was not.
    open: HashSet<String>,
    /// The last checklist printed.
    todo: String,
    finished: bool,
    /// The thread's totals before this turn.
    before: Totals,
    /// The thread's totals `turn.completed` reported.
    pub after: Option<Totals>,
}

impl<'o> Mapper<'o> {
    /// Turn `turn` (numbered from 1 in this bridge) of `thread` (if it goes on one), whose
    /// token totals were `before`.
    pub fn new(out: &'o Out, turn: u64, thread: Option<String>, before: Totals) -> Self {
        Mapper {
            out,
            turn,
            thread,
            last_text: String::new(),
            last_error: None,
            open: HashSet::new(),
            todo: String::new(),
            finished: false,
            before,
            after: None,
        }
    }

    /// The turn's result was printed.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Ends the turn with an ERROR (once).
    pub fn fail(&mut self, text: String) {
        self.end(TurnEnd {
            is_error: true,
            text,
            ..Default::default()
        });
    }

    fn end(&mut self, mut end: TurnEnd) {
        if self.finished {
            return;
        }
        self.finished = true;
        end.session_id = self.thread.clone();
        self.out.result(&end);
    }

    /// One line of `codex exec --json`, decoded by the one codex decoder
    /// ([`paddock_runner::codex::map_line`], which the runner's `Exec` streams too).
    pub fn line(&mut self, line: &str) {
        let ev = paddock_runner::codex::map_line(line.as_bytes());
        if !self.event(&ev) {
            self.out.raw(line);
        }
    }

    /// One event; false if the bridge prints nothing for it (its line then goes out raw).
    fn event(&mut self, ev: &ExecEvent) -> bool {
        match ev.r#type() {
            EventType::EventThreadStarted => {
                if ev.thread_id.is_empty() {
                    return false;
                }
                self.thread = Some(ev.thread_id.clone());
                self.out.init(&ev.thread_id);
            }
            EventType::EventTurnStarted => {}
            EventType::EventTurnCompleted => {
                let after = ev.usage.as_ref().map(Totals::of).unwrap_or_default();
                self.after = Some(after);
                let usage = after.since(self.before);
                let text = std::mem::take(&mut self.last_text);
                self.end(TurnEnd {
                    text,
                    usage,
                    ..Default::default()
                });
            }
            EventType::EventTurnFailed => {
                let msg = ev
                    .error
                    .as_ref()
                    .map(|e| e.message.clone())
                    .filter(|m| !m.is_empty())
                    .or_else(|| self.last_error.clone())
                    .unwrap_or_else(|| "codex: the turn failed".into());
                self.fail(msg);
            }
            // Kept as the turn's last error, and passed on raw (stored, not shown twice).
            EventType::EventError => {
                self.last_error = Some(ev.message.clone());
                return false;
            }
            phase @ (EventType::EventItemStarted
            | EventType::EventItemUpdated
            | EventType::EventItemCompleted) => {
                return ev.item.as_ref().is_some_and(|item| self.item(phase, item));
            }
            EventType::Unspecified => return false,
        }
        true
    }

    /// One item event; false if the bridge does not know the item.
    fn item(&mut self, phase: EventType, item: &ItemEvent) -> bool {
        let id = format!("t{}:{}", self.turn, item.id);
        let done = phase == EventType::EventItemCompleted;
        match item.r#type() {
            ItemType::ItemAgentMessage => {
                if done {
                    self.out.text(&item.text);
                    self.last_text = item.text.clone();
                }
            }
            ItemType::ItemReasoning => {
                if done && !item.text.is_empty() {
                    self.out.thinking(&item.text);
                }
            }
            ItemType::ItemError => {
                if done {
                    self.out.status(&format!("codex: {}", item.text));
                }
            }
            ItemType::ItemTodoList => {
                let text = super::wire::plan_text(item.items.iter().map(|t| {
                    let step = if t.completed {
                        super::wire::Step::Done
                    } else {
                        super::wire::Step::Pending
                    };
                    (step, t.text.as_str())
                }));
                if text != self.todo {
                    self.out.text(&text);
                    self.todo = text;
                }
            }
            ItemType::ItemCommandExecution
            | ItemType::ItemFileChange
            | ItemType::ItemMcpToolCall
            | ItemType::ItemWebSearch => {
                if phase == EventType::EventItemUpdated {
                    return true;
                }
                let tool = Tool::of(item);
                if !self.open.contains(&id) {
                    let (name, input) = tool.call();
                    self.out.tool_use(&id, &name, &input);
                    self.open.insert(id.clone());
                }
                if done {
                    self.open.remove(&id);
                    let (content, is_error) = tool.result();
                    self.out.tool_result(&id, &content, is_error);
                }
            }
            ItemType::Unspecified => return false,
        }
        true
    }
}

/// A tool item: the decoded item, and for an MCP call the fields the seed's `ItemEvent` has
/// none for (server, tool, arguments, result, error), read from the item's own JSON.
struct Tool<'i> {
    item: &'i ItemEvent,
    mcp: Value,
}

impl<'i> Tool<'i> {
    fn of(item: &'i ItemEvent) -> Self {
        let mcp = if item.r#type() == ItemType::ItemMcpToolCall {
            serde_json::from_slice(&item.raw).unwrap_or(Value::Null)
        } else {
            Value::Null
        };
        Tool { item, mcp }
    }

    /// The call: the tool's name and its input. A client tool (paddock's MCP server) is named
    /// as the client named it, with its arguments as its input.
    fn call(&self) -> (String, Value) {
        let item = self.item;
        let arguments = || self.mcp.get("arguments").cloned().unwrap_or(Value::Null);
        match item.r#type() {
            ItemType::ItemCommandExecution => {
                ("command_execution".into(), json!({"command": item.command}))
            }
            ItemType::ItemFileChange => (
                "file_change".into(),
                json!({"changes": item.changes.iter()
                    .map(|c| json!({"path": c.path, "kind": c.kind}))
                    .collect::<Vec<_>>()}),
            ),
            ItemType::ItemMcpToolCall if str_of(&self.mcp, "server") == mcp::SERVER => {
                (str_of(&self.mcp, "tool").to_string(), arguments())
            }
            ItemType::ItemMcpToolCall => (
                "mcp_tool_call".into(),
                json!({
                    "server": str_of(&self.mcp, "server"),
                    "tool": str_of(&self.mcp, "tool"),
                    "arguments": arguments(),
                }),
            ),
            _ => ("web_search".into(), json!({"query": item.query})),
        }
    }

    /// A completed tool item's result: its text, and whether it failed.
    fn result(&self) -> (String, bool) {
        let item = self.item;
        let status = item.status.as_str();
        match item.r#type() {
            ItemType::ItemCommandExecution => {
                let mut out = item.aggregated_output.clone();
                // The seed's exit_code is 0 when codex gave none (a declined command).
                let code = item.exit_code;
                let failed = status != "completed" || code != 0;
                if failed {
                    if !out.is_empty() && !out.ends_with('\n') {
                        out.push('\n');
                    }
                    if code != 0 {
                        out.push_str(&format!("(exit code {code})"));
                    } else {
                        out.push_str(&format!(
                            "({})",
                            if status.is_empty() { "failed" } else { status }
                        ));
                    }
                }
                (out, failed)
            }
            ItemType::ItemFileChange => {
                let lines: Vec<String> = item
                    .changes
                    .iter()
                    .map(|c| format!("{} {}", c.kind, c.path))
                    .collect();
                (lines.join("\n"), status == "failed")
            }
            ItemType::ItemMcpToolCall => {
                let err = self.mcp.pointer("/error/message").and_then(Value::as_str);
                let text = match err {
                    Some(e) => e.to_string(),
                    None => match self
                        .mcp
                        .pointer("/result/content")
                        .and_then(Value::as_array)
                    {
                        Some(b) => b
                            .iter()
                            .filter_map(|x| x.get("text").and_then(Value::as_str))
                            .collect::<Vec<_>>()
                            .join("\n"),
                        None => self
                            .mcp
                            .get("result")
                            .filter(|r| !r.is_null())
                            .map(|r| r.to_string())
                            .unwrap_or_default(),
                    },
                };
                (text, err.is_some() || status == "failed")
            }
            _ => (item.query.clone(), status == "failed"),
        }
    }
}

#[cfg(test)]
mod tests;
