//! The built-in scripted agent: `paddock __scripted-agent [--script FILE]
//! [--append-system-prompt TEXT]`.
//!
//! A real child process that speaks Claude Code's `stream-json` line protocol (see
//! [`super::claude_stream`]), so the daemon drives it exactly as it drives `claude`, and every
//! test exercises the real parser, pipes, signals and exit codes. It reads user-message lines
//! (as [`super::claude_stream::user_message_line`] makes them; read with
//! [`super::stream_json::AgentInput`]) on stdin and answers each one
//! on stdout, one JSON object per line, flushing after every line. paddock's ready request (a
//! `control_request` `initialize`) is answered at once with a `control_response` success;
//! another control request with an error response. Other stdin lines (`control_response`s it
//! did not wait for, tool results, …) are ignored; a line that is not JSON gets a note on
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
//!   answer, or the deny message); in a `raw` line it is escaped as inside a JSON string, and
//!   `stderr` lines leave it as written.
//! - `{"delay_ms": N}` alone: just wait.
//!
//! In TEXT, tool inputs and `raw`/`stderr` lines, `{message}`, `{turn}` (1-based message
//! number), `{cwd}`, `{session_id}` and `{system_prompt}` (what `--append-system-prompt TEXT`
//! gave the agent, as Claude Code takes it; empty without) are replaced.
//!
//! The `result` line's `duration_ms` is the sum of the turn's `delay_ms` so far.
//!
//! # Layout
//!
//! `script.rs` reads this format (serde-derived), `agent.rs` turns a turn into actions one
//! step at a time (a turn of N steps costs O(N) time and holds one step's lines; every line is
//! a [`super::stream_json`](mod@super::stream_json) type), `tools.rs` runs `LS` and `Read`, and this file is the
//! process: stdin, stdout, sleeps, signals and exit codes.

mod agent;
mod script;
mod tools;

use std::io::{self, BufRead, Write};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use agent::{Action, Agent, Reply};
pub use script::{
    parse_script, Script, ScriptError, Step, StepError, StepKind, Turn, SCRIPT_BYTES_MAX,
};
pub use tools::{list_dir, LIST_MAX, READ_MAX};

use super::stream_json::{self, AgentInput, ReadAnswer};

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
/// Each turn's actions are taken as they are planned, one step at a time.
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
    while let Some(text) = stdin.next_message(out, err)? {
        let mut reply = agent.reply(&text, cwd);
        while let Some(action) = reply.next() {
            match action {
                Action::Line(l) => {
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
                    let Some(response) = stdin.wait_response(&request_id, out, err)? else {
                        return Ok(0); // stdin closed while waiting: nobody will answer
                    };
                    let (content, is_error) =
                        agent::ask_outcome(&response, &tool, &input, &allowed_result, cwd);
                    let l = reply.answered(&call, content, is_error);
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

/// Answers a request of the controller: `initialize` (paddock's ready request) at once — the
/// scripted agent takes messages from its start; anything else with an error.
fn answer_control(out: &mut impl Write, request_id: &str, subtype: &str) -> io::Result<()> {
    let line = if subtype == "initialize" {
        stream_json::ready_response(request_id)
    } else {
        let why = format!("the scripted agent has no control request {subtype:?}");
        stream_json::encode(&stream_json::ControlResponse::error(request_id, &why))
    };
    print(out, &line).map(|_| ())
}

/// The agent's stdin: user messages (some queued while the agent waited for an answer) and
/// control responses.
struct Stdin<L> {
    lines: L,
    queued: std::collections::VecDeque<String>,
}

impl<L: Iterator<Item = io::Result<String>>> Stdin<L> {
    /// The next non-empty line, read; `None` at EOF.
    fn next_input(&mut self, err: &mut impl Write) -> io::Result<Option<AgentInput>> {
        for line in self.lines.by_ref() {
            match line {
                Ok(l) if l.trim().is_empty() => {}
                Ok(l) => return Ok(Some(AgentInput::read(&l))),
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

    /// The next user message's text; `None` at EOF. The controller's own requests are
    /// answered meanwhile (`initialize`: ready).
    fn next_message(
        &mut self,
        out: &mut impl Write,
        err: &mut impl Write,
    ) -> io::Result<Option<String>> {
        if let Some(t) = self.queued.pop_front() {
            return Ok(Some(t));
        }
        while let Some(input) = self.next_input(err)? {
            match input {
                AgentInput::User(text) => return Ok(Some(text)),
                AgentInput::NotJson => {
                    let _ = writeln!(
                        err,
                        "paddock scripted agent: ignoring a non-JSON stdin line"
                    );
                }
                AgentInput::Control {
                    request_id,
                    subtype,
                } => answer_control(out, &request_id, &subtype)?,
                AgentInput::Answer { .. } | AgentInput::Other => {}
            }
        }
        Ok(None)
    }

    /// Waits for the `control_response` to `request_id`; user messages meanwhile are queued.
    /// `None` at EOF.
    fn wait_response(
        &mut self,
        request_id: &str,
        out: &mut impl Write,
        err: &mut impl Write,
    ) -> io::Result<Option<ReadAnswer>> {
        while let Some(input) = self.next_input(err)? {
            match input {
                AgentInput::User(text) => self.queued.push_back(text),
                AgentInput::Control {
                    request_id,
                    subtype,
                } => answer_control(out, &request_id, &subtype)?,
                AgentInput::Answer {
                    request_id: id,
                    answer,
                } if id == request_id => return Ok(Some(answer)),
                AgentInput::Answer { .. } | AgentInput::Other | AgentInput::NotJson => {}
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::super::claude_stream::{user_message_line, ClaudeStreamParser, Parsed};
    use super::tools::listing_text;
    use super::*;
    use paddock_core::{Activity, ActivityKind, ProviderEvent};
    use serde_json::Value;
    use std::fs;
    use std::path::PathBuf;

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

    use crate::claude_stream::activities_of as activities;

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
        assert_eq!(kinds, [Thinking, ToolCall, ToolResult, Text, Completion]);
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

    const EXAMPLE: &str = include_str!("../testdata/scripted_example.json");

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
                Thinking, ToolCall, ToolResult, ToolCall, ToolResult, ToolCall, ToolResult, Text,
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

        let err = |t: &str| parse_script(t).unwrap_err().to_string();
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
        // The agent reads user messages through the protocol's codec.
        let user_text = |l: &str| match AgentInput::read(l) {
            AgentInput::User(t) => Some(t),
            _ => None,
        };
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

    /// paddock's ready request is answered at once, before any message, and the answer reads
    /// as the core's `Ready`; another control request is refused, never left waiting.
    #[test]
    fn serve_answers_the_ready_request_first() {
        let dir = temp_dir("ready");
        let input = format!(
            "{}\n{}\n{}\n",
            stream_json::READY_REQUEST,
            r#"{"type":"control_request","request_id":"x","request":{"subtype":"interrupt"}}"#,
            user_message_line("one")
        );
        let mut agent = Agent::new(Script::default(), "sid");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        serve(&mut agent, input.as_bytes(), &mut out, &mut err, &dir).unwrap();
        let out = String::from_utf8(out).unwrap();
        let mut lines = out.lines();
        let mut p = ClaudeStreamParser::new();
        let first = p.parse_line(lines.next().unwrap());
        assert!(
            matches!(&first[..], [Parsed::Event(ProviderEvent::Ready)]),
            "{first:?}"
        );
        let second: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
        assert_eq!(second["response"]["subtype"], "error");
        assert_eq!(second["response"]["request_id"], "x");
        assert_eq!(lines.count(), 6, "then the turn: {out}");
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
            crate::claude_stream::control_response_deny("req_scripted_1_1", "not now"),
            crate::claude_stream::control_response_allow(
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
