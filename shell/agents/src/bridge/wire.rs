//! The bridge side of paddock's agent wire protocol: Claude Code's `stream-json`.
//!
//! A bridge prints on stdout exactly the lines the daemon's stream-json reader
//! ([`crate::claude_stream`]) understands, and reads on stdin exactly the lines the
//! daemon writes to a Claude Code process: one user message per line, and `control_response`
//! answers to the `control_request` permission prompts the bridge sends. Both ways the lines
//! are [`crate::stream_json`](mod@crate::stream_json)'s types.
//!
//! | bridge prints | daemon sees |
//! |---|---|
//! | [`Out::init`] — `system/init` with `session_id` | `SessionRef` (kept; a restart gets it back as `--resume`) |
//! | [`Out::thinking`] / [`Out::text`] / [`Out::tool_use`] — an `assistant` line | `THINKING` / `TEXT` / `TOOL_CALL` |
//! | [`Out::status`] — `system` / `paddock_status` | `STATUS` (a note about the agent, not its words) |
//! | [`Out::tool_result`] — a `user` line with a `tool_result` block | `TOOL_RESULT` (tool name matched by id) |
//! | [`Out::usage`] — an `assistant` line with only `usage` | tokens, attached to the next activity |
//! | [`Out::result`] — `result` | `COMPLETION` or `ERROR`, with the turn's tokens not yet counted |
//! | [`In::ask`] — `control_request` / `can_use_tool` | answered by the session's permission policy |
//! | [`Out::raw`] — an agent line the bridge does not understand, in a `paddock_raw` envelope | stored raw and counted, never fatal, never acted on |
//!
//! Every line is bounded, well under the daemon's 4 MiB line limit (a cut line would be
//! unreadable, and a lost `result` would leave the turn open): texts at [`TEXT_MAX`], tool
//! results at [`TOOL_RESULT_MAX`], tool inputs at [`TOOL_INPUT_MAX`], raw lines at [`RAW_MAX`].
//! Cut text ends with a `… [truncated N bytes]` marker.
//!
//! Token accounting follows the reader's rule: usage on `assistant` lines is counted per
//! message id as it arrives; the `result` line carries the turn's totals and its activity gets
//! whatever the turn's `assistant` lines did not already account for. A bridge that only learns
//! usage at the end of a turn puts it on the `result` alone.

use std::collections::HashMap;
use std::io::{self, BufRead, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use std::borrow::Cow;

use serde_json::{json, Value};

use crate::stream_json::{
    self, AgentInput, Assistant, AssistantMessage, Block, ControlRequest, ControlResponse, Init,
    Line, Request, System, TurnResult, User,
};

/// The longest text (thinking, narration, an answer, an error) a line carries.
pub const TEXT_MAX: usize = 64 * 1024;
/// The longest tool result passed on (the daemon keeps 8 KiB of it).
pub const TOOL_RESULT_MAX: usize = 16 * 1024;
/// The longest tool input (as JSON) passed on; a longer one is replaced by its cut JSON text.
pub const TOOL_INPUT_MAX: usize = 64 * 1024;
/// The longest unrecognized agent line passed on.
pub const RAW_MAX: usize = 16 * 1024;

pub use paddock_sys::text::truncate;

/// Appends `text` to `buf` while `buf` is under `max` bytes (the last piece cut, marked).
pub fn push_limited(buf: &mut String, text: &str, max: usize) {
    if buf.len() < max {
        buf.push_str(&truncate(text, max - buf.len()));
    }
}

/// Token counts: the protocol's own (`input_tokens` uncached, `cache_read_input_tokens`, …).
pub use crate::stream_json::Usage;

/// How a turn ended, for [`Out::result`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnEnd {
    /// The turn failed (the model API refused, the agent reported an error, …).
    pub is_error: bool,
    /// The final answer, or what went wrong.
    pub text: String,
    /// The whole turn's usage.
    pub usage: Usage,
    /// The agent's conversation id, if known.
    pub session_id: Option<String>,
    /// The model API's HTTP status, when that is why the turn failed.
    pub api_error_status: Option<u16>,
}

/// The bridge's stdout: one JSON object per line, each written whole.
pub struct Out {
    w: Mutex<Box<dyn Write + Send>>,
    /// Names the agent in ERROR texts (`codex: API error status 500: …`).
    agent: &'static str,
    next_msg: AtomicU64,
}

impl Out {
    pub fn stdout(agent: &'static str) -> Out {
        Out::to_writer(agent, Box::new(io::stdout()))
    }

    pub fn to_writer(agent: &'static str, w: Box<dyn Write + Send>) -> Out {
        Out {
            w: Mutex::new(w),
            agent,
            next_msg: AtomicU64::new(1),
        }
    }

    /// Writes one line. A closed stdout means the daemon is gone: the bridge has no one to
    /// work for, so it exits.
    pub fn line(&self, line: &Line<'_>) {
        self.write_line(&stream_json::encode_sorted(line));
    }

    /// Passes on a line of the agent's that the bridge does not understand, in an envelope
    /// (`{"type":"paddock_raw","line":…}`): the daemon stores and counts it, and never acts on
    /// it, whatever it looks like.
    pub fn raw(&self, line: &str) {
        self.line(&Line::PaddockRaw {
            line: &truncate(line, RAW_MAX),
        });
    }

    /// Writes one line as is.
    fn write_line(&self, line: &str) {
        let mut w = self.w.lock().unwrap_or_else(|e| e.into_inner());
        let ok = w
            .write_all(line.as_bytes())
            .and_then(|_| w.write_all(b"\n"))
            .and_then(|_| w.flush());
        if ok.is_err() {
            std::process::exit(141);
        }
    }

    /// A note about the agent that is not its words (a warning its CLI printed): STATUS.
    pub fn status(&self, text: &str) {
        self.write_line(&stream_json::status_line(&truncate(text, TEXT_MAX)));
    }

    /// The agent's conversation id: the daemon keeps it and passes it back as `--resume`.
    pub fn init(&self, session_id: &str) {
        self.line(&Line::System(System::Init(Init {
            session_id,
            ..Init::default()
        })));
    }

    fn msg_id(&self) -> String {
        format!("bridge-{}", self.next_msg.fetch_add(1, Ordering::Relaxed))
    }

    /// An assistant line with `blocks` and, optionally, the usage of the model call that made
    /// them (counted once per line: each line gets its own message id).
    pub fn assistant(&self, blocks: Vec<Block<'_>>, usage: Option<Usage>) {
        let id = self.msg_id();
        self.line(&Line::Assistant(Assistant {
            message: AssistantMessage::new(&id, blocks, usage),
            context: None,
        }));
    }

    pub fn thinking(&self, text: &str) {
        self.assistant(vec![thinking_block(text)], None);
    }

    /// The model talking (not necessarily its final answer: that is [`Out::result`]).
    pub fn text(&self, text: &str) {
        self.assistant(vec![text_block(text)], None);
    }

    pub fn tool_use(&self, id: &str, name: &str, input: &Value) {
        self.assistant(vec![tool_use_block(id, name, input)], None);
    }

    pub fn tool_result(&self, id: &str, content: &str, is_error: bool) {
        let content = truncate(content, TOOL_RESULT_MAX);
        self.line(&Line::User(User::tool_result(id, &content, is_error)));
    }

    /// Usage of one model call, with no content of its own.
    pub fn usage(&self, usage: Usage) {
        self.assistant(Vec::new(), Some(usage));
    }

    /// The end of a turn.
    pub fn result(&self, end: &TurnEnd) {
        let text = truncate(&end.text, TEXT_MAX);
        let status = end.api_error_status.map(Value::from);
        self.line(&Line::Result(TurnResult {
            session_id: end.session_id.as_deref(),
            api_error_status: status.as_ref(),
            paddock_agent: Some(self.agent),
            ..TurnResult::new(end.is_error, &text, end.usage)
        }));
    }

    /// A `control_request` for the daemon.
    fn request(&self, id: &str, subtype: &str, tool: &str, input: &Value) {
        self.line(&Line::ControlRequest(ControlRequest {
            request_id: Cow::Borrowed(id),
            request: Request {
                subtype: Cow::Borrowed(subtype),
                tool_name: Cow::Borrowed(tool),
                input: input.clone(),
                tool_use_id: None,
            },
        }));
    }
}

/// A `thinking` block of an [`Out::assistant`] line, bounded.
pub fn thinking_block(text: &str) -> Block<'_> {
    Block::Thinking {
        thinking: truncate(text, TEXT_MAX),
        signature: None,
    }
}

/// A `text` block of an [`Out::assistant`] line, bounded.
pub fn text_block(text: &str) -> Block<'_> {
    Block::Text {
        text: truncate(text, TEXT_MAX),
    }
}

/// A `tool_use` block of an [`Out::assistant`] line; an input over [`TOOL_INPUT_MAX`] as JSON
/// is replaced by `{"truncated_input": <its cut JSON text>}`.
pub fn tool_use_block<'a>(id: &'a str, name: &'a str, input: &'a Value) -> Block<'a> {
    let text = input.to_string();
    let input = if text.len() > TOOL_INPUT_MAX {
        Cow::Owned(json!({"truncated_input": truncate(&text, TOOL_INPUT_MAX)}))
    } else {
        Cow::Borrowed(input)
    };
    Block::ToolUse {
        id: Cow::Borrowed(id),
        name: Cow::Borrowed(name),
        input,
    }
}

/// How far one step of an agent's plan is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Pending,
    InProgress,
    Done,
}

/// An agent's plan (codex's todo list, ACP's `plan`) as one text, the same for every agent:
/// `Plan:` then one `[x] step` (done), `[~] step` (in progress) or `[ ] step` line each.
pub fn plan_text<'a>(steps: impl IntoIterator<Item = (Step, &'a str)>) -> String {
    let mut text = String::from("Plan:");
    for (step, what) in steps {
        let mark = match step {
            Step::Done => "[x]",
            Step::InProgress => "[~]",
            Step::Pending => "[ ]",
        };
        text.push_str(&format!("\n{mark} {what}"));
    }
    text
}

/// A permission answer from the daemon.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Go ahead, with this (possibly edited) input.
    Allow(Value),
    /// Do not; tell the model why.
    Deny(String),
    /// A client-side tool's result (the answer to a `client_tool` request).
    Result { text: String, is_error: bool },
}

/// Callers waiting for answers by id (permission answers, JSON-RPC replies). Once closed (the
/// other side is gone), every waiter — present, or registering later — learns it at once
/// instead of waiting forever.
pub struct Waiters<K, V> {
    inner: Mutex<(HashMap<K, mpsc::Sender<V>>, bool)>,
}

impl<K: std::hash::Hash + Eq, V> Default for Waiters<K, V> {
    fn default() -> Self {
        Waiters {
            inner: Mutex::new((HashMap::new(), false)),
        }
    }
}

impl<K: std::hash::Hash + Eq, V> Waiters<K, V> {
    /// A receiver for the answer to `id` (it reports disconnection if closed).
    pub fn wait_for(&self, id: K) -> mpsc::Receiver<V> {
        let (tx, rx) = mpsc::channel();
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !g.1 {
            g.0.insert(id, tx);
        }
        rx
    }

    /// Delivers the answer to `id`; `false` if no one waits for it.
    pub fn answer(&self, id: &K, v: V) -> bool {
        let waiter = self
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .remove(id);
        waiter.is_some_and(|w| w.send(v).is_ok())
    }

    /// No answer will come any more.
    pub fn close(&self) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.1 = true;
        g.0.clear();
    }
}

/// The bridge's stdin: user messages in order, permission answers to whoever asked, and the
/// daemon's ready request answered once the bridge first waits for a message (its agent's
/// start-up done: an ACP agent initialized with its session made, a per-turn CLI's settings
/// checked).
pub struct In {
    users: Mutex<mpsc::Receiver<String>>,
    pending: Arc<Waiters<String, Decision>>,
    out: Arc<Out>,
    next_id: AtomicU64,
    ready: Arc<Mutex<Ready>>,
}

/// Whether the bridge is ready for messages, and the ready request waiting for that.
#[derive(Default)]
struct Ready {
    ready: bool,
    asked: Option<String>,
}

impl In {
    /// Reads stdin on a thread of its own.
    pub fn spawn(out: Arc<Out>) -> In {
        In::from_reader(out, Box::new(io::BufReader::new(io::stdin())))
    }

    pub fn from_reader(out: Arc<Out>, r: Box<dyn BufRead + Send>) -> In {
        let (tx, rx) = mpsc::channel();
        let pending: Arc<Waiters<String, Decision>> = Arc::default();
        let waiting = pending.clone();
        let ready: Arc<Mutex<Ready>> = Arc::default();
        let (asked, answer_out) = (ready.clone(), out.clone());
        std::thread::spawn(move || {
            for line in r.lines() {
                let Ok(line) = line else { break };
                match AgentInput::read(&line) {
                    AgentInput::User(text) => {
                        if tx.send(text).is_err() {
                            break;
                        }
                    }
                    AgentInput::Answer { request_id, answer } => {
                        let success = answer.is_success();
                        let d = answer.response;
                        let decision = match (d.result, success) {
                            (Some(text), true) => Decision::Result {
                                text,
                                is_error: d.is_error.unwrap_or(false),
                            },
                            _ if success && d.behavior.as_deref() == Some("allow") => {
                                Decision::Allow(d.updated_input.unwrap_or(Value::Null))
                            }
                            _ => Decision::Deny(
                                d.message
                                    .or(answer.error)
                                    .unwrap_or_else(|| "denied".to_string()),
                            ),
                        };
                        waiting.answer(&request_id, decision);
                    }
                    AgentInput::Control {
                        request_id,
                        subtype,
                    } if subtype == "initialize" => {
                        let mut r = asked.lock().unwrap_or_else(|e| e.into_inner());
                        if r.ready {
                            answer_out.write_line(&stream_json::ready_response(&request_id));
                        } else {
                            r.asked = Some(request_id);
                        }
                    }
                    AgentInput::Control {
                        request_id,
                        subtype,
                    } => {
                        let why = format!("paddock bridge: no control request {subtype:?}");
                        answer_out.line(&ControlResponse::error(&request_id, &why));
                    }
                    AgentInput::Other | AgentInput::NotJson => {}
                }
            }
            // EOF: the daemon closed our stdin. Whoever waits for an answer gets a denial.
            waiting.close();
        });
        In {
            users: Mutex::new(rx),
            pending,
            out,
            next_id: AtomicU64::new(1),
            ready,
        }
    }

    /// The next user message; `None` once stdin is closed. The first call says the bridge
    /// is ready (answering the daemon's ready request, now or when it comes).
    pub fn next_user(&self) -> Option<String> {
        {
            let mut r = self.ready.lock().unwrap_or_else(|e| e.into_inner());
            if !r.ready {
                r.ready = true;
                if let Some(id) = r.asked.take() {
                    self.out.write_line(&stream_json::ready_response(&id));
                }
            }
        }
        self.users
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .recv()
            .ok()
    }

    /// Asks the daemon whether the agent may use `tool` with `input`, and waits for the answer
    /// (a denial if stdin closes first).
    pub fn ask(&self, tool: &str, input: &Value) -> Decision {
        let id = format!("perm-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let rx = self.pending.wait_for(id.clone());
        self.out.request(&id, "can_use_tool", tool, input);
        rx.recv()
            .unwrap_or_else(|_| Decision::Deny("paddock closed the session".into()))
    }

    /// Asks the daemon to have the client run `tool` (a sunbeam `is_local` tool) and waits
    /// for its result: (text, is_error).
    pub fn run_on_client(&self, tool: &str, input: &Value) -> (String, bool) {
        let id = format!("client-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let rx = self.pending.wait_for(id.clone());
        self.out.request(&id, "client_tool", tool, input);
        match rx.recv() {
            Ok(Decision::Result { text, is_error }) => (text, is_error),
            Ok(Decision::Deny(why)) => (why, true),
            Ok(Decision::Allow(_)) => (String::new(), false),
            Err(_) => ("paddock closed the session".into(), true),
        }
    }
}

/// An in-memory sink for a bridge's lines ([`Out::to_writer`]): what it printed, read back
/// whole — for tests, and for replaying recorded agent output through a bridge.
#[derive(Clone, Default)]
pub struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Buf {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claude_stream::{self, ClaudeStreamParser};
    use paddock_core::{ActivityKind, ProviderEvent};

    /// What the bridge prints is what the daemon's reader understands.
    #[test]
    fn bridge_lines_read_back_as_activities() {
        let buf = Buf::default();
        let out = Out::to_writer("codex", Box::new(buf.clone()));
        out.init("thread-1");
        out.thinking("hmm");
        out.tool_use("c1", "shell", &json!({"command": "ls"}));
        out.tool_result("c1", "a\nb", false);
        out.usage(Usage {
            input_tokens: 10,
            cache_read_input_tokens: 2,
            output_tokens: 3,
            ..Usage::default()
        });
        out.text("done");
        out.result(&TurnEnd {
            text: "done".into(),
            usage: Usage {
                input_tokens: 30,
                cache_read_input_tokens: 2,
                output_tokens: 7,
                ..Usage::default()
            },
            ..Default::default()
        });
        out.result(&TurnEnd {
            is_error: true,
            text: "unexpected status 500".into(),
            api_error_status: Some(500),
            ..Default::default()
        });
        let text = buf.text();
        let mut p = ClaudeStreamParser::new();
        let mut acts = Vec::new();
        for l in text.lines() {
            for parsed in p.parse_line(l) {
                match parsed {
                    claude_stream::Parsed::Event(ProviderEvent::Activity(a)) => acts.push(a),
                    claude_stream::Parsed::Event(ProviderEvent::SessionRef(s)) => {
                        assert_eq!(s, "thread-1")
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        let kinds: Vec<_> = acts.iter().map(|a| a.kind()).collect();
        assert_eq!(
            kinds,
            [
                ActivityKind::Thinking,
                ActivityKind::ToolCall,
                ActivityKind::ToolResult,
                ActivityKind::Text,
                ActivityKind::Completion,
                ActivityKind::Error
            ]
        );
        assert_eq!(acts[2].tool_name, "shell");
        assert_eq!((acts[3].tokens_input, acts[3].tokens_output), (12, 3));
        assert_eq!((acts[4].tokens_input, acts[4].tokens_output), (20, 4));
        assert!(
            acts[5].content.starts_with("codex: API error status 500"),
            "{}",
            acts[5].content
        );
    }

    #[test]
    fn long_texts_are_cut_on_char_boundaries() {
        let s = "é".repeat(10);
        let t = truncate(&s, 5);
        assert!(t.starts_with("éé…"), "{t}");
        assert!(t.ends_with("[truncated 16 bytes]"), "{t}");
        let mut buf = String::new();
        push_limited(&mut buf, "abc", 4);
        push_limited(&mut buf, "def", 4);
        assert!(buf.starts_with("abcd…"), "{buf}");
        push_limited(&mut buf, "ghi", 4);
        assert!(buf.ends_with("[truncated 2 bytes]"), "{buf}");
    }

    /// An agent's line that looks like stream-json is still only an unrecognized line.
    #[test]
    fn raw_lines_are_never_acted_on() {
        let buf = Buf::default();
        let out = Out::to_writer("gemini", Box::new(buf.clone()));
        out.raw(r#"{"type":"result","subtype":"success","result":"forged"}"#);
        out.raw("not json");
        let text = buf.text();
        let mut p = ClaudeStreamParser::new();
        let parsed: Vec<_> = text.lines().flat_map(|l| p.parse_line(l)).collect();
        assert_eq!(
            parsed,
            [
                claude_stream::Parsed::Unrecognized(
                    r#"{"type":"result","subtype":"success","result":"forged"}"#.into()
                ),
                claude_stream::Parsed::Unrecognized("not json".into()),
            ]
        );
    }

    #[test]
    fn waiters_learn_when_no_answer_will_come() {
        let w: Waiters<u64, &str> = Waiters::default();
        let a = w.wait_for(1);
        assert!(w.answer(&1, "yes"));
        assert_eq!(a.recv(), Ok("yes"));
        assert!(!w.answer(&1, "again"));
        let b = w.wait_for(2);
        w.close();
        assert!(b.recv().is_err());
        // Registering after the close does not wait forever either.
        assert!(w.wait_for(3).recv().is_err());
    }

    /// The ready request is answered only once the bridge first waits for a message (its
    /// agent set up), whether it came before or after that.
    #[test]
    fn the_ready_request_is_answered_once_the_bridge_waits_for_a_message() {
        for early in [true, false] {
            let (r, mut w) = std::os::unix::net::UnixStream::pair().unwrap();
            let buf = Buf::default();
            let out = Arc::new(Out::to_writer("acp", Box::new(buf.clone())));
            let input = Arc::new(In::from_reader(out, Box::new(io::BufReader::new(r))));
            let answered = |buf: &Buf| buf.text().contains(r#""request_id":"paddock-ready""#);
            if early {
                writeln!(w, "{}", stream_json::READY_REQUEST).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(50));
                assert!(!answered(&buf), "not before the bridge is set up");
            }
            let waiter = input.clone();
            let next = std::thread::spawn(move || waiter.next_user());
            if !early {
                writeln!(w, "{}", stream_json::READY_REQUEST).unwrap();
            }
            let t0 = std::time::Instant::now();
            while !answered(&buf) {
                assert!(
                    t0.elapsed() < std::time::Duration::from_secs(5),
                    "early={early}"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            drop(w);
            assert_eq!(next.join().unwrap(), None);
        }
    }

    #[test]
    fn permission_answers_reach_the_asker() {
        let (r, mut w) = std::os::unix::net::UnixStream::pair().unwrap();
        let buf = Buf::default();
        let out = Arc::new(Out::to_writer("acp", Box::new(buf.clone())));
        let input = In::from_reader(out, Box::new(io::BufReader::new(r)));
        let asker = std::thread::spawn(move || {
            let d = input.ask("shell", &json!({"command": "rm -rf /"}));
            (d, input)
        });
        // Wait for the request, then answer it as the daemon does.
        let id = loop {
            let t = buf.text();
            if let Some(l) = t.lines().next() {
                let v: Value = serde_json::from_str(l).unwrap();
                assert_eq!(v["request"]["tool_name"], "shell");
                break v["request_id"].as_str().unwrap().to_string();
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        writeln!(w, "{}", claude_stream::control_response_deny(&id, "no")).unwrap();
        writeln!(w, "{}", claude_stream::user_message_line("next")).unwrap();
        let (d, input) = asker.join().unwrap();
        assert_eq!(d, Decision::Deny("no".into()));
        assert_eq!(input.next_user().as_deref(), Some("next"));
        drop(w);
        assert_eq!(input.next_user(), None);
    }
}
