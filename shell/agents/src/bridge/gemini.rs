//! The gemini bridge: one `gemini --prompt=… --output-format stream-json` process per turn.
//!
//! Gemini CLI (checked against 0.61.0, the version pinned in `tests/npm/package.json`) has no
//! long-lived stdio protocol in headless mode: each turn is one process, started in the
//! session's working directory as
//!
//! ```text
//! gemini --output-format stream-json --skip-trust [-m MODEL] [--resume SESSION_ID]
//!        --approval-mode … [--allowed-tools …] --prompt=<the user's message>
//! ```
//!
//! with stdin closed. It prints JSON lines (`Turn::line` reads them) and exits. The bridge
//! remembers the `session_id` of the `init` line and passes it back as `--resume` on the next
//! turn, so the turns of one paddock session are one gemini conversation. The CLI keeps that
//! conversation under `$HOME/.gemini/tmp/<project>/chats/session-<date>-<id prefix>.jsonl`
//! (`<project>` is a short name for the working directory, registered in
//! `$HOME/.gemini/projects.json`), and `--resume <uuid>` continues it under the same id: the
//! next request to the model carries the whole earlier conversation. A lost conversation makes
//! the CLI exit 42 before any output ("Error resuming session: No previous sessions found for
//! this project" / "Invalid session identifier …"): the bridge dies with it (a crash).
//! A new conversation whose first turn fails (an API error) is not kept at all (a `--resume`
//! of its id fails like a lost one), so the bridge
//! adopts a new id — and tells the daemon, [`Out::init`] — only when a turn ends in success;
//! until then each turn starts a new conversation.
//!
//! # Mapping
//!
//! | gemini prints | bridge prints ([`Out`]) | daemon sees |
//! |---|---|---|
//! | `init` (`session_id`, `model`) | [`Out::init`], for a new id once the turn succeeded (above) | `SessionRef` (kept for `--resume`) |
//! | `message`, `role: user` (the CLI echoing our prompt) | nothing | — |
//! | `message`, `role: assistant` (`delta: true` chunks) | collected; one [`Out::text`] when something else comes | `STATUS` |
//! | `tool_use` (`tool_name`, `tool_id`, `parameters`) | [`Out::tool_use`] | `TOOL_CALL` |
//! | `tool_result` (`tool_id`, `status`, `output` / `error.message`) | [`Out::tool_result`], an error unless `status: success` | `TOOL_RESULT` |
//! | `result`, `status: success`, `stats` | the pending assistant text with the turn's usage, then [`Out::result`]: the text since the last tool, the same totals | `STATUS` with the tokens, then `COMPLETION` |
//! | `result`, `status: error`, `error.message` | [`Out::result`] with `is_error` (and the API's HTTP status, if it was an API error) | `ERROR` |
//! | `error` (a non-fatal warning), anything else, non-JSON | [`Out::raw`], verbatim | stored and counted |
//! | the process killed by a signal, or exiting without a `result` | [`die_like`]: the bridge dies the same way | crash, OBEY-2031 |
//!
//! Gemini 0.61.0 does not print the model's thoughts in stream-json (a `thought: true` part
//! never reaches stdout), so this bridge emits no `THINKING`.
//!
//! # Tokens
//!
//! Usage arrives once, in the `result` line's `stats` (the sum over the turn's model calls):
//! `input_tokens` = the API's `promptTokenCount` (cache reads included), `cached` =
//! `cachedContentTokenCount`, `input` = the difference, `output_tokens` =
//! `candidatesTokenCount`, `total_tokens` = `totalTokenCount`, which also counts the
//! `thoughtsTokenCount` the stats have no field for. Thinking tokens are billed as output, so
//! output = `total_tokens - input_tokens` (never less than `output_tokens`). No usage is known
//! before the turn ends. The bridge prints the last assistant text (the answer) only when the
//! `result` comes, with the turn's usage on it, and the `result` with the same totals (the
//! reader counts only what the answer did not), as Claude Code's final message does. Where the
//! tokens land changes nothing about the budget: the core fails a session its turn took past
//! the budget (OBEY-2013) whether the answer or the `COMPLETION` carried them.
//!
//! # API errors
//!
//! A failed model call ends the turn with `result` / `status: error`, and the CLI exits with
//! the HTTP status as its exit code, modulo 256 (400 → 144, 429 → 173, 500 → 244), which the
//! bridge does not rely on; the `result` has no status field of its own. The message is
//! `[API Error: <the API's error JSON>]` (`{"error":{"code":500,"message":…,"status":…}}`),
//! from which the status is read; for a 429 the CLI rewrites it (`[API Error: <message>]\nPlease
//! wait…`), and the status is then read from the `status: 429` its stderr shows. By default the
//! CLI tries a failing call 10 times with back-off (minutes, for a 5xx); the `general.maxAttempts`
//! setting in `~/.gemini/settings.json` lowers that (the tests set 1).
//!
//! # Permissions
//!
//! Headless gemini cannot ask anyone: in its `default` approval mode it does not even offer
//! the model the tools that would need approval (`run_shell_command`, `write_file`,
//! `replace`, `web_fetch`): only read-only tools remain. The session's policy
//! (`provider_config["permissions"]`, see [`PermissionPolicy`]) becomes its flags:
//!
//! | policy | gemini flags |
//! |---|---|
//! | `allow-all` (in a sandbox, the daemon's default) | `--approval-mode yolo`: every tool runs |
//! | `deny` | `--approval-mode default`: only the read-only tools |
//! | `allow:run_shell_command,write_file` | `--approval-mode default --allowed-tools run_shell_command,write_file` (gemini's tool names; deprecated in 0.61 in favour of policy files, still honoured) |
//!
//! So the daemon is never asked (no `control_request`): the policy is applied by gemini itself,
//! with gemini's rules: a tool it would still want confirmed is refused (`Tool execution for
//! "Shell" requires user confirmation, which is not supported in non-interactive mode`), e.g.
//! an allowed `run_shell_command` whose command uses a redirection (`>`), and a tool it does not
//! offer fails as unknown (`Tool "write_file" not found`). Both are failed `TOOL_RESULT`s.
//!
//! # Process
//!
//! `GEMINI_CLI_NO_RELAUNCH=true` (unless the session's environment sets it): by default the
//! CLI re-executes itself as a child node process with a bigger heap and waits for it, and a
//! signal that kills that child shows as the parent's plain `exit 1`. With one process, a
//! crash is seen as what it was, and the turn starts faster. Shell commands run detached, in a
//! process group of their own, which the daemon's TERM to the bridge's group does not
//! reach and gemini does not end when it is told to stop: they carry the session's
//! containment tag, and the daemon ends them when the bridge exits (`paddock_sys::contain`).

use std::process::Command;

use serde_json::Value;

use super::wire::{push_limited, truncate, TEXT_MAX};
use super::{die_like, run_turn, Bridge, Error, Out, TurnEnd, TurnExit, Usage};
use crate::{agent_command, PermissionPolicy};
use paddock_core::Provider;

/// How gemini names paddock's MCP server's tools: `mcp_<server>_<tool>`.
const GEMINI_CLIENT_TOOL_PREFIX: &str = "mcp_paddock_";

/// Longest user message passed on the command line (Linux refuses an argument over 128 KiB).
const PROMPT_MAX: usize = 120 * 1024;

/// Runs one gemini process per user message until stdin closes. Err only when
/// gemini cannot be started at all (the daemon sees the bridge exit: a crash).
pub fn run(bridge: &Bridge) -> Result<(), Error> {
    let argv = agent_command(Provider::Gemini, &bridge.config)?;
    let policy =
        PermissionPolicy::parse(bridge.config("permissions")).map_err(Error::Permissions)?;
    let mut session = bridge.resume.clone();
    // The client's tools, from paddock's MCP server: a socket this bridge serves, named to
    // gemini in a settings file of its own (gemini's system settings: they add to the user's).
    let served = super::mcp_socket::serve_client_tools(bridge)?;
    let settings = match &served {
        Some(s) => {
            let file = s.dir.path().join("settings.json");
            let text = serde_json::json!({"mcpServers": super::mcp_socket::server_entry(s)});
            std::fs::write(&file, text.to_string()).map_err(|source| Error::Write {
                path: file.clone(),
                source,
            })?;
            Some(file)
        }
        None => None,
    };
    while let Some(message) = bridge.input.next_user() {
        if message.len() > PROMPT_MAX {
            bridge.out.result(&TurnEnd {
                is_error: true,
                text: format!(
                    "the message is {} bytes; gemini takes at most {PROMPT_MAX} on its command line",
                    message.len()
                ),
                session_id: session.clone(),
                ..Default::default()
            });
            continue;
        }
        let mut cmd = command(&argv, &bridge.model, &policy, session.as_deref(), &message);
        cmd.current_dir(&bridge.cwd);
        if let Some(file) = &settings {
            cmd.env("GEMINI_CLI_SYSTEM_SETTINGS_PATH", file);
        }
        let mut turn = Turn::new(session.clone());
        let exit = run_turn(&mut cmd, None, super::EXIT_AFTER_TURN, |line| {
            turn.line(line, &bridge.out);
            turn.end.is_some()
        })
        .map_err(|source| Error::Start {
            program: argv[0].clone(),
            source,
        })?;
        session = turn.session_id.clone();
        let end = turn.finish(&exit);
        match end {
            Some(end) => bridge.out.result(&end),
            None => die_like(&exit, "gemini"),
        }
    }
    Ok(())
}

/// The command line of one turn.
fn command(
    argv: &[String],
    model: &str,
    policy: &PermissionPolicy,
    resume: Option<&str>,
    message: &str,
) -> Command {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd.args(["--output-format", "stream-json", "--skip-trust"]);
    if !model.is_empty() {
        cmd.args(["-m", model]);
    }
    if let Some(id) = resume {
        cmd.args(["--resume", id]);
    }
    cmd.args(permission_args(policy));
    // `--prompt=…` in one argument: a message starting with `-` stays a message. (A NUL
    // cannot be in an argument: it is dropped.)
    cmd.arg(format!("--prompt={}", message.replace('\0', "")));
    if std::env::var_os("GEMINI_CLI_NO_RELAUNCH").is_none() {
        cmd.env("GEMINI_CLI_NO_RELAUNCH", "true");
    }
    cmd
}

/// Gemini's flags for the session's permission policy (the table in the module doc).
fn permission_args(policy: &PermissionPolicy) -> Vec<String> {
    match policy {
        PermissionPolicy::AllowAll => vec!["--approval-mode".into(), "yolo".into()],
        PermissionPolicy::Deny => vec!["--approval-mode".into(), "default".into()],
        // `ask` is refused at create for gemini (nobody can be asked); as a list it is safe.
        PermissionPolicy::Allow(tools) | PermissionPolicy::Ask(tools) if tools.is_empty() => {
            vec!["--approval-mode".into(), "default".into()]
        }
        PermissionPolicy::Allow(tools) | PermissionPolicy::Ask(tools) => vec![
            "--approval-mode".into(),
            "default".into(),
            "--allowed-tools".into(),
            tools.join(","),
        ],
    }
}

/// One turn's reading of gemini's stdout.
#[derive(Debug, Default)]
pub struct Turn {
    /// The conversation id: the one resumed, or a new one once the turn succeeded.
    session_id: Option<String>,
    /// The id `init` reported, if it is not `session_id`.
    new_id: Option<String>,
    /// Assistant text not yet printed (gemini streams it in chunks).
    pending_text: String,
    /// The assistant's text since the turn's last tool call: its answer.
    answer: String,
    /// The `result` line, once seen.
    end: Option<TurnEnd>,
}

impl Turn {
    pub fn new(session_id: Option<String>) -> Turn {
        Turn {
            session_id,
            ..Turn::default()
        }
    }

    /// Translates one stdout line.
    pub fn line(&mut self, line: &str, out: &Out) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            out.raw(line);
            return;
        };
        let field = |k: &str| v.get(k).and_then(Value::as_str);
        match field("type") {
            Some("init") => match field("session_id") {
                Some(id) if !id.is_empty() => {
                    if self.session_id.as_deref() == Some(id) {
                        out.init(id);
                    } else {
                        self.new_id = Some(id.to_string());
                    }
                }
                _ => out.raw(line),
            },
            Some("message") => match (field("role"), field("content")) {
                (Some("user"), _) => {}
                (Some("assistant"), Some(text)) => {
                    if v.get("delta").and_then(Value::as_bool) == Some(false) {
                        self.flush(out);
                    }
                    push_limited(&mut self.pending_text, text, TEXT_MAX);
                    push_limited(&mut self.answer, text, TEXT_MAX);
                }
                _ => out.raw(line),
            },
            Some("tool_use") => match (field("tool_id"), field("tool_name")) {
                (Some(id), Some(name)) => {
                    self.flush(out);
                    self.answer.clear();
                    let input = v.get("parameters").cloned().unwrap_or(Value::Null);
                    // A client tool (paddock's MCP server) is named as the client named it.
                    let name = name.strip_prefix(GEMINI_CLIENT_TOOL_PREFIX).unwrap_or(name);
                    out.tool_use(id, name, &input);
                }
                _ => out.raw(line),
            },
            Some("tool_result") => match field("tool_id") {
                Some(id) => {
                    self.flush(out);
                    let ok = field("status") == Some("success");
                    let text = field("output")
                        .filter(|t| !t.is_empty() || ok)
                        .or_else(|| v.pointer("/error/message").and_then(Value::as_str))
                        .unwrap_or("");
                    out.tool_result(id, text, !ok);
                }
                None => out.raw(line),
            },
            Some("result") => {
                let success = v.get("status").and_then(Value::as_str) == Some("success");
                if success {
                    if let Some(id) = self.new_id.take() {
                        out.init(&id);
                        self.session_id = Some(id);
                    }
                }
                let end = self.result(&v);
                if success && !self.pending_text.trim().is_empty() {
                    // The answer carries the turn's usage, as Claude Code's last message does.
                    let text = std::mem::take(&mut self.pending_text);
                    out.assistant(vec![super::wire::text_block(&text)], Some(end.usage));
                }
                self.flush(out);
                self.end = Some(end);
            }
            _ => out.raw(line),
        }
    }

    /// Prints the assistant text collected so far, as one `STATUS`.
    fn flush(&mut self, out: &Out) {
        if !self.pending_text.trim().is_empty() {
            out.text(&self.pending_text);
        }
        self.pending_text.clear();
    }

    /// The turn's end, from its `result` line.
    fn result(&self, v: &Value) -> TurnEnd {
        let usage = v.get("stats").map(usage).unwrap_or_default();
        if v.get("status").and_then(Value::as_str) == Some("success") {
            return TurnEnd {
                text: self.answer.trim().to_string(),
                usage,
                session_id: self.session_id.clone(),
                ..Default::default()
            };
        }
        let message = v
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("gemini reported an error");
        let (api_error_status, text) = match api_error(message) {
            Some((status, text)) => (Some(status), text),
            None => (None, message.to_string()),
        };
        TurnEnd {
            is_error: true,
            text: truncate(text.trim(), TEXT_MAX).into_owned(),
            usage,
            session_id: self.session_id.clone(),
            api_error_status,
        }
    }

    /// How the turn ends once the process has exited: its `result`, or `None` when gemini
    /// died (a signal) or gave no `result` with a failing exit code — a crash for the daemon.
    fn finish(mut self, exit: &TurnExit) -> Option<TurnEnd> {
        if exit.signal.is_some() && self.end.is_none() {
            return None;
        }
        match self.end.take() {
            Some(mut end) => {
                // The 429 message carries no JSON: the status is on the CLI's stderr.
                if end.is_error && end.api_error_status.is_none() && end.text.contains("API Error")
                {
                    end.api_error_status = stderr_status(&exit.stderr_tail);
                }
                Some(end)
            }
            None if exit.success() => Some(TurnEnd {
                is_error: true,
                text: "gemini ended the turn without a result".into(),
                session_id: self.session_id,
                ..Default::default()
            }),
            None => None,
        }
    }
}

/// The turn's usage from `result.stats` (see "Tokens" in the module doc).
fn usage(stats: &Value) -> Usage {
    let n = |k: &str| stats.get(k).and_then(Value::as_u64).unwrap_or(0);
    let prompt = n("input_tokens");
    let output = n("output_tokens").max(n("total_tokens").saturating_sub(prompt));
    Usage::from_prompt_inclusive(prompt, n("cached"), output)
}

/// `[API Error: {"error":{"code":500,"message":"…","status":"INTERNAL"}}]` → (500, `… (INTERNAL)`).
fn api_error(message: &str) -> Option<(u16, String)> {
    let inner = message.strip_prefix("[API Error: ")?;
    let start = inner.find('{')?;
    let end = inner.rfind('}')?;
    let v: Value = serde_json::from_str(inner.get(start..=end)?).ok()?;
    let e = v.get("error")?;
    let code = u16::try_from(e.get("code")?.as_u64()?).ok()?;
    let text = e.get("message").and_then(Value::as_str).unwrap_or("");
    Some(match e.get("status").and_then(Value::as_str) {
        Some(s) if !s.is_empty() => (code, format!("{text} ({s})")),
        _ => (code, text.to_string()),
    })
}

/// The last `status: NNN` line of the CLI's stderr (its dump of the API error object).
fn stderr_status(stderr: &str) -> Option<u16> {
    stderr.lines().rev().find_map(|l| {
        l.trim()
            .strip_prefix("status: ")
            .and_then(|s| s.trim_end_matches(',').parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::wire::Buf;

    /// Feeds `lines` through one turn; what the bridge printed, as JSON values, and the turn.
    fn translate(lines: &str, exit: &TurnExit) -> (Vec<Value>, Option<TurnEnd>) {
        let buf = Buf::default();
        let out = Out::to_writer("gemini", Box::new(buf.clone()));
        let mut turn = Turn::new(None);
        for l in lines.lines().filter(|l| !l.trim().is_empty()) {
            turn.line(l, &out);
        }
        let end = turn.finish(exit);
        if let Some(e) = &end {
            out.result(e);
        }
        let text = buf.text();
        let printed = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or(Value::String(l.into())))
            .collect();
        (printed, end)
    }

    fn ok() -> TurnExit {
        TurnExit {
            code: Some(0),
            ..Default::default()
        }
    }

    /// Recorded from gemini-cli 0.61.0 against the tests' fake server (a shell tool, then an
    /// answer in two chunks, with cached input and thinking tokens).
    const TOOL_TURN: &str = r#"
{"type":"init","timestamp":"2026-11-22T02:47:10.281Z","session_id":"2c51fa12-efa2-4df8-8170-dba6d54d2854","model":"gemini-fake"}
{"type":"message","timestamp":"2026-11-22T02:47:10.282Z","role":"user","content":"make a file"}
{"type":"tool_use","timestamp":"2026-11-22T02:47:10.400Z","tool_name":"run_shell_command","tool_id":"run_shell_command__run_shell_command_1795315630360_0","parameters":{"command":"echo hi > made.txt","description":"make"}}
{"type":"tool_result","timestamp":"2026-11-22T02:47:10.494Z","tool_id":"run_shell_command__run_shell_command_1795315630360_0","status":"success","output":""}
{"type":"message","timestamp":"2026-11-22T02:52:35.496Z","role":"assistant","content":"Part one. ","delta":true}
{"type":"message","timestamp":"2026-11-22T02:52:35.497Z","role":"assistant","content":"Part two.","delta":true}
{"type":"result","timestamp":"2026-11-22T02:52:35.499Z","status":"success","stats":{"total_tokens":1047,"input_tokens":1000,"output_tokens":40,"cached":300,"input":700,"duration_ms":61,"tool_calls":0,"models":{"gemini-fake":{"total_tokens":1047,"input_tokens":1000,"output_tokens":40,"cached":300,"input":700}}}}
"#;

    #[test]
    fn a_tool_turn_translates_to_stream_json() {
        let (printed, end) = translate(TOOL_TURN, &ok());
        let types: Vec<_> = printed
            .iter()
            .map(|v| v["type"].as_str().unwrap_or("?"))
            .collect();
        // The new conversation's id comes once the turn has succeeded, before the answer.
        assert_eq!(
            types,
            ["assistant", "user", "system", "assistant", "result"]
        );
        assert_eq!(
            printed[2]["session_id"],
            "2c51fa12-efa2-4df8-8170-dba6d54d2854"
        );
        let call = &printed[0]["message"]["content"][0];
        assert_eq!(call["name"], "run_shell_command");
        assert_eq!(call["input"]["command"], "echo hi > made.txt");
        let result = &printed[1]["message"]["content"][0];
        assert_eq!(result["tool_use_id"], call["id"]);
        assert_eq!(result["is_error"], false);
        // The answer, its chunks joined, carries the turn's usage.
        let answer = &printed[3]["message"];
        assert_eq!(answer["content"][0]["text"], "Part one. Part two.");
        assert_eq!(answer["usage"]["input_tokens"], 700);
        assert_eq!(answer["usage"]["cache_read_input_tokens"], 300);
        assert_eq!(answer["usage"]["output_tokens"], 47);
        let end = end.unwrap();
        assert!(!end.is_error);
        assert_eq!(end.text, "Part one. Part two.");
        // 1000 prompt tokens of which 300 cached; 40 candidates + 7 thinking = 47 out.
        assert_eq!(
            end.usage,
            Usage {
                input_tokens: 700,
                cache_read_input_tokens: 300,
                output_tokens: 47,
                ..Usage::default()
            }
        );
    }

    #[test]
    fn a_refused_tool_is_an_error_result() {
        let lines = r#"{"type":"tool_use","tool_name":"run_shell_command","tool_id":"t1","parameters":{"command":"ls"}}
{"type":"tool_result","timestamp":"2026-11-22T02:51:49.077Z","tool_id":"t1","status":"error","output":"Tool \"run_shell_command\" not found.","error":{"type":"tool_not_registered","message":"Tool \"run_shell_command\" not found."}}
{"type":"tool_result","tool_id":"t1","status":"error","error":{"type":"x","message":"only the error says why"}}"#;
        let (printed, end) = translate(lines, &ok());
        assert!(end.is_some_and(|e| e.is_error));
        assert_eq!(printed[1]["message"]["content"][0]["is_error"], true);
        assert_eq!(
            printed[1]["message"]["content"][0]["content"],
            "Tool \"run_shell_command\" not found."
        );
        assert_eq!(
            printed[2]["message"]["content"][0]["content"],
            "only the error says why"
        );
    }

    /// Recorded: a 500 from the model API, with `general.maxAttempts: 1` (exit code 244).
    #[test]
    fn an_api_error_ends_the_turn_with_its_status() {
        let lines = r#"{"type":"init","timestamp":"2026-11-22T02:51:33.468Z","session_id":"555c9439-803a-4df3-9abc-3a068d7e77a7","model":"gemini-fake"}
{"type":"message","timestamp":"2026-11-22T02:51:33.470Z","role":"user","content":"err"}
{"type":"result","timestamp":"2026-11-22T02:51:33.578Z","status":"error","error":{"type":"unknown","message":"[API Error: {\"error\":{\"code\":500,\"message\":\"fake 500\",\"status\":\"INTERNAL\"}}]"},"stats":{"total_tokens":0,"input_tokens":0,"output_tokens":0,"cached":0,"input":0,"duration_ms":0,"tool_calls":0,"models":{"gemini-fake":{"total_tokens":0,"input_tokens":0,"output_tokens":0,"cached":0,"input":0}}}}"#;
        let exit = TurnExit {
            code: Some(244),
            ..Default::default()
        };
        let (printed, end) = translate(lines, &exit);
        let end = end.unwrap();
        assert_eq!(end.api_error_status, Some(500));
        assert_eq!(end.text, "fake 500 (INTERNAL)");
        assert_eq!(printed.last().unwrap()["api_error_status"], 500);
    }

    /// Recorded: a 429, whose message the CLI rewrites without the API's JSON.
    #[test]
    fn a_429_takes_its_status_from_stderr() {
        let lines = r#"{"type":"result","timestamp":"2026-11-22T02:51:40.799Z","status":"error","error":{"type":"unknown","message":"[API Error: fake 429]\nPlease wait and try again later. To increase your limits, request a quota increase through AI Studio, or switch to another /auth method"},"stats":{"total_tokens":0,"input_tokens":0,"output_tokens":0,"cached":0,"input":0,"duration_ms":0,"tool_calls":0,"models":{}}}"#;
        let exit = TurnExit {
            code: Some(0),
            signal: None,
            stderr_tail: "RetryableQuotaError: fake 429\n  cause: { code: 429, message: 'fake 429', details: [] },\n  retryDelayMs: undefined,\n  status: 429\n}\n".into(),
        };
        let (_, end) = translate(lines, &exit);
        let end = end.unwrap();
        assert!(end.is_error);
        assert_eq!(end.api_error_status, Some(429));
        assert!(
            end.text.starts_with("[API Error: fake 429]"),
            "{}",
            end.text
        );
    }

    #[test]
    fn a_new_conversation_is_adopted_only_when_its_turn_succeeds() {
        let failed = r#"{"type":"init","session_id":"new-1","model":"m"}
{"type":"result","status":"error","error":{"type":"unknown","message":"[API Error: {\"error\":{\"code\":400,\"message\":\"bad\",\"status\":\"INVALID_ARGUMENT\"}}]"},"stats":{}}"#;
        let (printed, end) = translate(failed, &ok());
        assert!(printed.iter().all(|v| v["type"] != "system"), "{printed:?}");
        assert_eq!(end.unwrap().session_id, None);
        let good = r#"{"type":"init","session_id":"new-2","model":"m"}
{"type":"result","status":"success","stats":{}}"#;
        let (printed, end) = translate(good, &ok());
        assert_eq!(printed[0]["session_id"], "new-2");
        assert_eq!(end.unwrap().session_id.as_deref(), Some("new-2"));
    }

    #[test]
    fn a_death_without_result_is_a_crash() {
        let lines = r#"{"type":"init","session_id":"s1","model":"m"}"#;
        let killed = TurnExit {
            signal: Some(9),
            ..Default::default()
        };
        assert_eq!(translate(lines, &killed).1, None);
        let failed = TurnExit {
            code: Some(1),
            stderr_tail: "Error resuming session: Invalid session identifier \"x\".".into(),
            ..Default::default()
        };
        assert_eq!(translate("", &failed).1, None);
        // Exit 0 without a result: an ERROR turn, the session goes on.
        let (_, end) = translate(lines, &ok());
        assert!(end.unwrap().is_error);
    }

    #[test]
    fn unknown_lines_pass_through_verbatim() {
        let lines = "not json\n{\"type\":\"error\",\"severity\":\"warning\",\"message\":\"loop\"}\n{\"type\":\"tool_use\"}";
        let (printed, _) = translate(lines, &ok());
        let raw = |v: &Value| {
            assert_eq!(v["type"], "paddock_raw", "{v}");
            v["line"].as_str().unwrap().to_string()
        };
        assert_eq!(raw(&printed[0]), "not json");
        assert!(raw(&printed[1]).contains("\"severity\":\"warning\""));
        assert_eq!(raw(&printed[2]), "{\"type\":\"tool_use\"}");
    }

    #[test]
    fn the_command_line_follows_model_resume_and_policy() {
        let argv = vec!["gemini".to_string(), "--debug".to_string()];
        let cmd = command(
            &argv,
            "gemini-x",
            &PermissionPolicy::Allow(vec!["run_shell_command".into(), "read_file".into()]),
            Some("abc"),
            "-rf everything",
        );
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy()).collect();
        assert_eq!(
            args,
            [
                "--debug",
                "--output-format",
                "stream-json",
                "--skip-trust",
                "-m",
                "gemini-x",
                "--resume",
                "abc",
                "--approval-mode",
                "default",
                "--allowed-tools",
                "run_shell_command,read_file",
                "--prompt=-rf everything"
            ]
        );
        assert_eq!(
            permission_args(&PermissionPolicy::AllowAll),
            ["--approval-mode", "yolo"]
        );
        assert_eq!(
            permission_args(&PermissionPolicy::Deny),
            ["--approval-mode", "default"]
        );
    }

    /// The recording of a real gemini-cli 0.61.0 turn (a shell command, a text, a file
    /// written, an answer; `tests/providers/gemini.rs` checks it is current and can record it
    /// anew) through the bridge and the daemon's reader: the activities a client sees.
    #[test]
    fn recorded_real_output_as_activities() {
        use crate::claude_stream::{self, ClaudeStreamParser};
        use paddock_core::ProviderEvent;

        let recorded = include_str!("../../../../tests/providers/recordings/gemini_stream.jsonl");
        let (printed, end) = translate(recorded, &ok());
        assert!(end.is_some());
        let mut parser = ClaudeStreamParser::new();
        let mut acts = Vec::new();
        for line in &printed {
            for p in parser.parse_line(&line.to_string()) {
                acts.push(match p {
                    claude_stream::Parsed::Event(ProviderEvent::SessionRef(_)) => {
                        serde_json::json!({"session_ref": "<gemini session id>"})
                    }
                    claude_stream::Parsed::Event(ProviderEvent::Activity(a)) => {
                        let mut o =
                            serde_json::json!({"type": a.kind().name(), "content": a.content});
                        if !a.tool_name.is_empty() {
                            o["tool"] = serde_json::json!(a.tool_name);
                        }
                        if a.kind() == paddock_core::ActivityKind::ToolResult {
                            o["success"] = serde_json::json!(a.tool_success);
                        }
                        if a.tokens_input != 0 || a.tokens_output != 0 {
                            o["tokens"] = serde_json::json!([a.tokens_input, a.tokens_output]);
                        }
                        o
                    }
                    other => serde_json::json!(format!("{other:?}")),
                });
            }
        }
        insta::assert_yaml_snapshot!("gemini_recorded_stream", acts);
    }
}
