//! Claude Code's `stream-json` line protocol: one stdout line in, core events out.
//!
//! Claude Code run as
//! `claude -p --input-format stream-json --output-format stream-json --verbose` prints one JSON
//! object per line on stdout. [`ClaudeStreamParser::parse_line`] turns each line into zero or
//! more [`Parsed`] items; [`user_message_line`] makes the stdin line that delivers one user
//! message; [`control_response_allow`] / [`control_response_deny`] /
//! [`control_response_error`] answer a `control_request` (a permission prompt).
//!
//! # Mapping
//!
//! | line | result |
//! |---|---|
//! | `system` / `init` | `SessionRef(session_id)` when the id is new (Claude Code 2.1 repeats `init` at the start of every turn), nothing else |
//! | `system` / `api_retry` | `STATUS` (`API error 500 (server_error); retry 1 of 10 in 597 ms`) |
//! | `system` / `model_fallback`, `model_refusal_fallback`, `model_refusal_no_fallback`, `model_consent_fallback`, `paddock_status` (a bridge's note) | `STATUS` (content = the line's `content`) |
//! | `system` / `paddock_connection` (the ssh relay's: `connected`, `content`) | `Connection` (the core marks the session disconnected or not, with a `STATUS` and a notice) |
//! | `system` / other known subtypes ([`SILENT_SYSTEM_SUBTYPES`]: `thinking_tokens`, `task_started`, `permission_denied`, `compact_boundary`, …) | nothing |
//! | `system` / unknown subtype | `Unrecognized` |
//! | `assistant` with `is_api_error_message: true` (the CLI's synthetic `API Error: …` message) | nothing: the `result` that follows is the `ERROR` |
//! | `assistant`, `thinking` block | `THINKING` (content = the thinking text) |
//! | `assistant`, `redacted_thinking` block | `THINKING` (content = `[redacted thinking]`) |
//! | `assistant`, `text` block | `TEXT` (content = the text; a seed client sees `THINKING`) — see below |
//! | `assistant`, `tool_use` / `server_tool_use` block | `TOOL_CALL` |
//! | `user`, `tool_result` block (and `*_tool_result` blocks carrying a `tool_use_id`) | `TOOL_RESULT` |
//! | `user`, plain text (a replayed user message) | nothing |
//! | `result` | `COMPLETION` (success) or `ERROR`, preceded by `SessionRef` if the id changed (below) |
//! | `stream_event`, `control_response`, `control_cancel_request`, `keep_alive`, `tool_progress`, `auth_status` | nothing |
//! | `control_request` | [`Parsed::ControlRequest`] |
//! | `paddock_raw` (a bridge's envelope for an agent line it did not understand) | `Unrecognized(the agent's line)` |
//! | blank line | nothing (not counted) |
//! | not JSON, not an object, no `type`, unknown `type`, or a known type of unknown shape | `Unrecognized(line)` |
//!
//! A `result` is an `ERROR` when `is_error` is true, `subtype` is not `success` (e.g.
//! `error_max_turns`, `error_during_execution`) or `api_error_status` is set — Claude Code 2.1
//! reports a failed API call as `subtype: "success"`, `is_error: true`, `api_error_status: 500`,
//! `api_error_type: "api_error"`. Its content: `claude: <subtype>, API error status <status>
//! (<type>): <result text>; <errors…>` — with the bridge's agent name (`paddock_agent`, e.g.
//! `codex`) in place of `claude` for lines from a [`super::bridge`].
//!
//! **Why assistant `text` is `TEXT`, not `COMPLETION` or `STATUS`.** In a tool-using turn
//! the model talks between tool calls ("Let me look at the tests first."); a line cannot tell
//! whether more tool calls follow, so a `text` block cannot end the turn. It is not a status
//! change either (what obey's `STATUS` means: paddock's notes about requests, API retries,
//! model fallbacks): it is the model narrating, paddock's extension type `TEXT`, which a
//! client that did not ask for it sees as `THINKING` — the type obey's own example gives such
//! words. The turn's answer arrives exactly once, in the `result` line, as the `COMPLETION`
//! (which repeats the last `text` block; clients that show both may want to de-duplicate).
//!
//! `TOOL_CALL` content is a short rendering of the input: the command for `Bash`, the
//! `file_path` for `Read`/`Write`/`Edit`/`MultiEdit`, `notebook_path` for `NotebookEdit`,
//! `path` for `LS`, `pattern` for `Glob`/`Grep`, `url` for `WebFetch`, `query` for
//! `WebSearch`; for other tools (those of agents behind a bridge) the first string among
//! `command`, `file_path`, `path`, `pattern`, `url`, `query`; otherwise compact JSON. Truncated to [`TOOL_INPUT_MAX`] bytes.
//! `TOOL_RESULT` content is the result's text (text blocks joined by newlines, `[image]` for
//! images), truncated to [`TOOL_RESULT_MAX`] bytes with a `… [truncated N bytes]` marker;
//! `tool_name` is the name remembered from the matching `tool_use` (empty if unseen);
//! `tool_success = !is_error`.
//!
//! # Tokens
//!
//! Activity tokens are deltas. Claude Code prints one `assistant` line per content block and
//! repeats the API message's `usage` on each (its `output_tokens` may grow from line to line).
//! Per message `id`, the parser attributes the usage once, when first seen, and later only the
//! increase. Input = `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`;
//! output = `output_tokens`. The delta goes on the first activity the line produces; a line
//! that produces none carries it to the next activity. The `result` line's `usage` holds the
//! turn's totals (same input formula): its `COMPLETION`/`ERROR` carries
//! `totals − attributed during this turn`, floored at 0 (a carried, never-attached delta is
//! thereby included). Then the per-turn accounting resets. An `assistant` line without an `id`
//! is attributed in full.
//!
//! # Reading
//!
//! A line is read in one pass into typed structs (`WireLine`, its `message`, its blocks),
//! not into a `serde_json::Value` tree: strings are borrowed from the line where they have no
//! escapes, a tool result's text is cut from the line's own bytes, and every field the parser
//! does not name (Claude Code's `uuid`, `tool_use_result` with its second copy of a file, …)
//! is skipped without being built. Every field is lenient (`lenient.rs`): one of another
//! type reads as absent, so what is unrecognized is what it was when the parser walked a
//! `Value`. Only what is shown as JSON (a tool input without a main argument, a result block
//! of an unknown type), an `api_retry`'s `error_status` and the rare `control_request` (whose
//! input is handed on as it is) become `Value`s. A field the parser skips is checked only for
//! being well-formed JSON, not built: a lone surrogate in it (JavaScript cutting a string
//! between the halves of a pair, in Claude Code's `tool_use_result` copy of a command's
//! output, say) no longer makes the whole line, and the tool result in it, unrecognized; a
//! tool input shown as JSON that cannot be built as a `Value` is shown as the agent wrote it.
//! A line that repeats a key the parser reads is unrecognized (before, the last value
//! counted).
//!
//! Measured with callgrind, instructions a line: the bench's assistant line 23.5k → 11.1k; a
//! recorded Claude Code stream with 4 KiB tool results 96.9k → 63.3k.

use std::borrow::Cow;
use std::collections::VecDeque;

use paddock_core::{Activity, ActivityKind, ProviderEvent};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::lenient::{self, Obj, StrOrSeq};
use super::stream_json::{self, ControlRequest, ControlResponse, Line, ReadResult, Usage, User};

/// `TOOL_CALL` content is cut to this many bytes.
pub const TOOL_INPUT_MAX: usize = 2000;
/// `TOOL_RESULT` content is cut to this many bytes (plus the marker).
pub const TOOL_RESULT_MAX: usize = 8 * 1024;

/// How many API messages' usage a turn remembers. Claude Code repeats a message's usage on
/// each of its lines (one a content block) and a message's lines follow each other; only a
/// sub-agent's may come between them, and a turn runs a handful at once. So the last few
/// messages are all a line can continue, and a turn of a million messages (P2's) keeps 64
/// ids, not a million. A message forgotten and seen again would have its usage counted twice
/// on its activities; the turn's `result` still carries its totals less what was attributed,
/// floored at 0.
pub const USAGE_IDS_KEPT: usize = 64;

/// How many tool calls waiting for their results a session remembers (to name the tool on a
/// result): more than any agent runs at once. Past it the oldest is forgotten, and its result,
/// should it come, names no tool.
pub const TOOL_CALLS_KEPT: usize = 256;

/// `system` lines that carry nothing a session's activity needs (progress, UI and bookkeeping
/// notices; the tool results and the `result` that matter arrive as their own lines). Taken from
/// what Claude Code 2.1.330 prints (and its binary can print) in `stream-json` mode; a subtype
/// not listed here, nor mapped in [`ClaudeStreamParser::parse_line`], is `Unrecognized`.
pub const SILENT_SYSTEM_SUBTYPES: &[&str] = &[
    "background_tasks_changed",
    "checkpoint_done",
    "commands_changed",
    "compact_boundary",
    "control_request_progress",
    "file_snapshot",
    "files_persisted",
    "hook_progress",
    "hook_response",
    "hook_started",
    "informational",
    "local_command",
    "memory_recall",
    "memory_saved",
    "notification",
    "per_turn_effort_changed",
    "permission_denied",
    "post_turn_summary",
    "session_state_changed",
    "session_title_changed",
    "status",
    "stop_hook_summary",
    "task_notification",
    "task_progress",
    "task_started",
    "task_summary",
    "task_updated",
    "thinking_tokens",
    "turn_duration",
    "turn_starting",
];

/// What one stdout line means.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// An event for the core.
    Event(ProviderEvent),
    /// The line is not JSON or its shape is unknown: the caller stores it raw and counts it.
    Unrecognized(String),
    /// Claude Code asks the controller something (a `can_use_tool` permission prompt, a
    /// `hook_callback`, …) and waits for a `control_response` on stdin with this `request_id`.
    /// `tool_name` is empty and `input` is `Null` when the request has none.
    ControlRequest {
        request_id: String,
        subtype: String,
        tool_name: String,
        input: Value,
    },
}

/// What a turn remembers by id (API messages, tool calls): the `KEEP` ids seen last, oldest
/// first. A line refers to what came just before it, so an id is looked up newest first;
/// past `KEEP` the oldest is forgotten and its id's buffer reused for the new one.
#[derive(Debug)]
struct Recent<V, const KEEP: usize>(VecDeque<(String, V)>);

impl<V, const KEEP: usize> Default for Recent<V, KEEP> {
    fn default() -> Self {
        Recent(VecDeque::new())
    }
}

/// Read like the list it is (its length, its newest entry).
impl<V, const KEEP: usize> std::ops::Deref for Recent<V, KEEP> {
    type Target = VecDeque<(String, V)>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<V, const KEEP: usize> Recent<V, KEEP> {
    fn position(&self, id: &str) -> Option<usize> {
        self.0.iter().rposition(|(seen, _)| seen == id)
    }

    /// `id`'s value, remembered from now on (as `V::default()`) if it is new.
    fn entry(&mut self, id: &str) -> &mut V
    where
        V: Default,
    {
        match self.position(id) {
            Some(i) => &mut self.0[i].1,
            None => self.push(id, V::default()),
        }
    }

    /// Remembers `value` for `id` as the newest (replacing what `id` had).
    fn insert(&mut self, id: &str, value: V) {
        if let Some(i) = self.position(id) {
            self.0.remove(i);
        }
        self.push(id, value);
    }

    /// Forgets `id`, giving back its value.
    fn take(&mut self, id: &str) -> Option<V> {
        let i = self.position(id)?;
        self.0.remove(i).map(|(_, value)| value)
    }

    /// Gives back the room of forgotten entries.
    fn shrink_to_fit(&mut self) {
        self.0.shrink_to_fit();
    }

    fn push(&mut self, id: &str, value: V) -> &mut V {
        let mut key = match self.0.len() {
            n if n >= KEEP => self.0.pop_front().map(|(k, _)| k).unwrap_or_default(),
            _ => String::new(),
        };
        key.clear();
        key.push_str(id);
        self.0.push_back((key, value));
        &mut self.0.back_mut().expect("just pushed").1
    }
}

/// Per-session parser state.
#[derive(Debug, Default)]
pub struct ClaudeStreamParser {
    /// The last `session_id` reported (from `init` or `result`).
    session_id: Option<String>,
    /// Tool name by tool_use id, of the calls waiting for their results.
    tool_names: Recent<String, TOOL_CALLS_KEPT>,
    /// The (input, output) usage attributed so far, by API message id, of this turn's
    /// messages seen last.
    seen_usage: Recent<(u64, u64), USAGE_IDS_KEPT>,
    /// Delta not yet attached to an activity.
    pending: (u64, u64),
    /// Attached to activities during this turn.
    attributed: (u64, u64),
    unrecognized: u64,
}

impl ClaudeStreamParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// How many lines yielded [`Parsed::Unrecognized`].
    #[allow(dead_code)] // adapter API; the daemon may count on its own
    /// Continues a turn another parser began (a daemon restarted and reattached to the agent):
    /// `tokens` were already attributed to the turn's activities, so the `result` line's totals
    /// are not counted twice.
    pub fn resume_turn(&mut self, tokens: (u64, u64)) {
        self.attributed = tokens;
    }

    pub fn unrecognized_count(&self) -> u64 {
        self.unrecognized
    }

    /// One stdout line (with or without its trailing newline) → zero or more items.
    /// Never panics.
    pub fn parse_line(&mut self, line: &str) -> Vec<Parsed> {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            return Vec::new();
        }
        let out = match serde_json::from_str::<Obj<WireLine>>(trimmed) {
            Ok(Obj(Some(l))) => self.parse_wire(&l, trimmed),
            Ok(Obj(None)) | Err(_) => None,
        };
        match out {
            Some(items) => items,
            None => {
                self.unrecognized += 1;
                vec![Parsed::Unrecognized(
                    line.trim_end_matches(['\r', '\n']).to_string(),
                )]
            }
        }
    }

    /// `None` = unrecognized. `text` is the line `l` was read from (a `result` and a
    /// `control_request` read their own fields from it).
    fn parse_wire(&mut self, l: &WireLine<'_>, text: &str) -> Option<Vec<Parsed>> {
        match l.ty.as_deref()? {
            "system" => self.on_system(l),
            "assistant" => self.on_assistant(l),
            "user" => self.on_user(l),
            "result" => self.on_result(text),
            // A bridge's envelope for an agent line it did not understand: stored raw.
            "paddock_raw" => {
                let line = l.line.as_deref()?.to_string();
                self.unrecognized += 1;
                Some(vec![Parsed::Unrecognized(line)])
            }
            "control_request" => on_control_request(text),
            // The answer to paddock's ready request (success or error alike: the agent reads
            // its input and answers) says the agent is ready for messages.
            "control_response"
                if l.response.0.as_ref().and_then(|r| r.request_id.as_deref())
                    == Some(stream_json::READY_REQUEST_ID) =>
            {
                Some(vec![Parsed::Event(ProviderEvent::Ready)])
            }
            "stream_event"
            | "control_response"
            | "control_cancel_request"
            | "keep_alive"
            | "tool_progress"
            | "auth_status" => Some(Vec::new()),
            _ => None,
        }
    }

    fn on_system(&mut self, l: &WireLine<'_>) -> Option<Vec<Parsed>> {
        let subtype = l.subtype.as_deref()?;
        match subtype {
            "init" => {
                let sid = l.session_id.as_deref()?;
                if self.session_id.as_deref() == Some(sid) {
                    return Some(Vec::new());
                }
                self.session_id = Some(sid.to_string());
                Some(vec![Parsed::Event(ProviderEvent::SessionRef(
                    sid.to_string(),
                ))])
            }
            "api_retry" => {
                let mut text = String::from("API error");
                // A number as JSON writes it, or a non-empty string.
                match &l.error_status {
                    Some(Value::Number(n)) => text.push_str(&format!(" {n}")),
                    Some(Value::String(s)) if !s.is_empty() => text.push_str(&format!(" {s}")),
                    _ => {}
                }
                if let Some(e) = l.error.as_deref() {
                    text.push_str(&format!(" ({e})"));
                }
                text.push_str("; retry");
                if let Some(a) = l.attempt {
                    text.push_str(&format!(" {a}"));
                    if let Some(m) = l.max_retries {
                        text.push_str(&format!(" of {m}"));
                    }
                }
                if let Some(d) = l.retry_delay_ms {
                    text.push_str(&format!(" in {d} ms"));
                }
                Some(self.attach(vec![Activity::new(ActivityKind::Status, text)]))
            }
            "paddock_connection" => {
                let connected = l.connected.unwrap_or(true);
                let note = match l.content.as_deref() {
                    Some(c) if !c.is_empty() => c.to_string(),
                    _ if connected => "reconnected".to_string(),
                    _ => "the connection to the agent's machine was lost".to_string(),
                };
                Some(vec![Parsed::Event(ProviderEvent::Connection {
                    connected,
                    note,
                })])
            }
            "model_fallback"
            | "paddock_status"
            | "model_refusal_fallback"
            | "model_refusal_no_fallback"
            | "model_consent_fallback" => {
                let content = match l.content.as_deref() {
                    Some(c) if !c.is_empty() => c.to_string(),
                    _ => subtype.replace('_', " "),
                };
                Some(self.attach(vec![Activity::new(ActivityKind::Status, content)]))
            }
            s if SILENT_SYSTEM_SUBTYPES.contains(&s) => Some(Vec::new()),
            _ => None,
        }
    }

    fn on_assistant(&mut self, l: &WireLine<'_>) -> Option<Vec<Parsed>> {
        let msg = l.message.0.as_ref()?;
        // The CLI's own stand-in for a failed API call ("API Error: 500 …"): the `result` line
        // that follows says the same as an ERROR, so this one adds nothing.
        if l.is_api_error_message == Some(true)
            && matches!(msg.content, StrOrSeq::Str(_) | StrOrSeq::Seq(_))
        {
            return Some(Vec::new());
        }
        // Validate the shape before touching any state. A string is one text block.
        let blocks = match &msg.content {
            StrOrSeq::Seq(blocks) => blocks.as_slice(),
            StrOrSeq::Str(_) => &[],
            StrOrSeq::Other(_) => return None,
        };
        if let Some(usage) = &msg.usage.0 {
            let (inp, out) = (usage.input(), usage.output_tokens);
            match msg.id.as_deref() {
                Some(id) => {
                    // The message's usage so far: only its increase is new. Numbers an agent
                    // reports are never trusted to stay in range.
                    let seen = self.seen_usage.entry(id);
                    let new = (inp.saturating_sub(seen.0), out.saturating_sub(seen.1));
                    *seen = (seen.0.max(inp), seen.1.max(out));
                    self.pending.0 = self.pending.0.saturating_add(new.0);
                    self.pending.1 = self.pending.1.saturating_add(new.1);
                }
                None => {
                    self.pending.0 = self.pending.0.saturating_add(inp);
                    self.pending.1 = self.pending.1.saturating_add(out);
                }
            }
        }
        let mut acts = Vec::with_capacity(blocks.len().max(1));
        if let StrOrSeq::Str(t) = &msg.content {
            if !t.is_empty() {
                acts.push(Activity::new(ActivityKind::Text, t.as_ref()));
            }
        }
        for b in blocks.iter().filter_map(|b| b.0.as_ref()) {
            match b.ty.as_deref().unwrap_or("") {
                "thinking" => {
                    let t = b.thinking.as_deref().unwrap_or("");
                    acts.push(Activity::new(ActivityKind::Thinking, t));
                }
                "redacted_thinking" => {
                    acts.push(Activity::new(ActivityKind::Thinking, "[redacted thinking]"));
                }
                "text" => {
                    let t = b.text.as_deref().unwrap_or("");
                    if !t.is_empty() {
                        acts.push(Activity::new(ActivityKind::Text, t));
                    }
                }
                "tool_use" | "server_tool_use" | "mcp_tool_use" => {
                    let id = b.id.as_deref().unwrap_or("");
                    let name = b.name.as_deref().unwrap_or("");
                    // A client tool (paddock's MCP server) is named as the client named it.
                    let name = name.strip_prefix(super::mcp::TOOL_PREFIX).unwrap_or(name);
                    if !id.is_empty() {
                        // An id used again names its latest call (the one its result answers).
                        self.tool_names.insert(id, name.to_string());
                    }
                    let content = render_tool_input(name, b.input);
                    acts.push(Activity::new(ActivityKind::ToolCall, content).with_tool(name, id));
                }
                // Results of server-side tools (web search, …) come inside assistant messages.
                t if t.ends_with("tool_result") && b.tool_use_id.is_some() => {
                    acts.push(self.tool_result_activity(b));
                }
                _ => {} // unknown block types are skipped
            }
        }
        Some(self.attach(acts))
    }

    fn on_user(&mut self, l: &WireLine<'_>) -> Option<Vec<Parsed>> {
        let msg = l.message.0.as_ref()?;
        let blocks = match &msg.content {
            StrOrSeq::Seq(blocks) => blocks,
            StrOrSeq::Str(_) => return Some(Vec::new()), // a replayed user message
            StrOrSeq::Other(_) => return None,
        };
        let mut acts = Vec::new();
        for b in blocks.iter().filter_map(|b| b.0.as_ref()) {
            let bt = b.ty.as_deref().unwrap_or("");
            if bt.ends_with("tool_result") && b.tool_use_id.is_some() {
                acts.push(self.tool_result_activity(b));
            }
            // text / image blocks: the user's own message replayed; nothing to report.
        }
        Some(self.attach(acts))
    }

    fn tool_result_activity(&mut self, b: &Block<'_>) -> Activity {
        let id = b.tool_use_id.as_deref().unwrap_or("");
        let name = self.tool_names.take(id).unwrap_or_default();
        let text = b.content.as_ref().map(result_text).unwrap_or_default();
        let mut a = Activity::new(
            ActivityKind::ToolResult,
            paddock_sys::text::truncate(&text, TOOL_RESULT_MAX).into_owned(),
        )
        .with_tool(name, id);
        a.tool_success = !b.is_error.unwrap_or(false);
        a
    }

    /// A `result` line (`text`): its fields are read on their own, each malformed one as
    /// missing ([`ReadResult`]), so a turn's end is never lost to an odd field. `None` (the
    /// line is unrecognized) only when the line itself cannot be read as one: a duplicate key,
    /// a lone surrogate or an out-of-range number in one of those fields; an empty successful
    /// completion would misreport it.
    fn on_result(&mut self, text: &str) -> Option<Vec<Parsed>> {
        let r = serde_json::from_str::<ReadResult>(text).ok()?;
        let mut out = Vec::new();
        if let Some(sid) = &r.session_id {
            if self.session_id.as_ref() != Some(sid) {
                self.session_id = Some(sid.clone());
                out.push(Parsed::Event(ProviderEvent::SessionRef(sid.clone())));
            }
        }
        let subtype = r.subtype.as_deref().unwrap_or("success");
        let is_error = r.is_error.unwrap_or(false);
        let api_status = r.api_error_status.as_ref();
        let text = r.result.as_deref().unwrap_or("");

        let (tin, tout) = r.usage.map_or((0, 0), |u| (u.input(), u.output_tokens));
        let din = tin.saturating_sub(self.attributed.0);
        let dout = tout.saturating_sub(self.attributed.1);

        let activity = if is_error || subtype != "success" || api_status.is_some() {
            let mut head = Vec::new();
            if subtype != "success" {
                head.push(subtype.to_string());
            }
            if let Some(s) = api_status {
                let s = s
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| s.to_string());
                match r.api_error_type.as_deref() {
                    Some(t) if !t.is_empty() => head.push(format!("API error status {s} ({t})")),
                    _ => head.push(format!("API error status {s}")),
                }
            }
            if head.is_empty() {
                head.push("error".to_string());
            }
            let mut detail: Vec<String> = Vec::new();
            if !text.is_empty() {
                detail.push(text.to_string());
            }
            if let Some(errs) = &r.errors {
                detail.extend(errs.iter().map(|e| match e.as_str() {
                    Some(s) => s.to_string(),
                    None => e.to_string(),
                }));
            }
            // Claude Code 2.1 says why in `errors` ("Reached maximum number of turns (1)").
            if subtype == "error_max_turns" && detail.is_empty() {
                if let Some(n) = r.num_turns {
                    detail.push(format!("after {n} turns"));
                }
            }
            // A bridge names its agent (`paddock_agent`); Claude Code itself does not.
            let agent = r.paddock_agent.as_deref().unwrap_or("claude");
            let mut content = if detail.is_empty() {
                format!("{agent}: {}", head.join(", "))
            } else {
                format!("{agent}: {}: {}", head.join(", "), detail.join("; "))
            };
            // Claude Code's own advice is a slash command of its TUI, which nobody can type
            // here: say what a paddock user can do.
            if agent == "claude" && text.contains("Not logged in") {
                content.push_str(
                    " — Claude Code is not logged in on this machine: run `claude` once and \
                     /login, or give the session a key (--env ANTHROPIC_API_KEY=…); \
                     `paddock doctor` checks",
                );
            }
            Activity::new(ActivityKind::Error, content)
        } else {
            Activity::new(ActivityKind::Completion, text)
        };
        out.push(Parsed::Event(ProviderEvent::Activity(
            activity.with_tokens(din, dout),
        )));

        // The turn is over: reset its accounting.
        self.pending = (0, 0);
        self.attributed = (0, 0);
        // Anew, not cleared: a long turn's capacity is not kept (review B6). The tool names of
        // calls still waiting for their results stay (an agent may answer one after the
        // turn's end), cut to their number.
        self.seen_usage = Recent::default();
        self.tool_names.shrink_to_fit();
        Some(out)
    }

    /// Puts the pending token delta on the first activity and wraps them.
    fn attach(&mut self, acts: Vec<Activity>) -> Vec<Parsed> {
        acts.into_iter()
            .enumerate()
            .map(|(i, mut a)| {
                if i == 0 {
                    a.tokens_input = self.pending.0;
                    a.tokens_output = self.pending.1;
                    self.attributed.0 = self.attributed.0.saturating_add(self.pending.0);
                    self.attributed.1 = self.attributed.1.saturating_add(self.pending.1);
                    self.pending = (0, 0);
                }
                Parsed::Event(ProviderEvent::Activity(a))
            })
            .collect()
    }
}

/// A `control_request` line (`text`). Its `input` is handed on as it is (an answer allows the
/// tool with it unchanged), so this rare line is read as a `Value`.
fn on_control_request(text: &str) -> Option<Vec<Parsed>> {
    let v = serde_json::from_str::<Value>(text).ok()?;
    let r = ControlRequest::deserialize(&v).ok()?;
    let subtype = r.request.subtype.into_owned();
    // An MCP message for a server paddock runs inside the control channel: its server in
    // `tool_name`, its JSON-RPC message in `input`.
    let (tool_name, input) = if subtype == "mcp_message" {
        let req = v.get("request");
        (
            req.and_then(|q| q.get("server_name"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            req.and_then(|q| q.get("message"))
                .cloned()
                .unwrap_or(Value::Null),
        )
    } else {
        (r.request.tool_name.into_owned(), r.request.input)
    };
    Some(vec![Parsed::ControlRequest {
        request_id: r.request_id.into_owned(),
        subtype,
        tool_name,
        input,
    }])
}

/// A value as compact JSON, its object keys sorted (how `Value` writes it): what is shown of
/// a tool input or a result block paddock has no rendering for.
fn json_text(raw: &RawValue) -> String {
    serde_json::from_str::<Value>(raw.get())
        .map(|v| v.to_string())
        .unwrap_or_else(|_| raw.get().to_string())
}

/// A tool result's `content` as text: a string as it is (borrowed from the line where it has
/// no escapes: a file's contents are not copied before they are cut), blocks as their text
/// joined by newlines, any other value as JSON.
fn result_text<'c>(content: &'c StrOrSeq<'_, Value>) -> Cow<'c, str> {
    match content {
        StrOrSeq::Str(text) => Cow::Borrowed(text),
        StrOrSeq::Seq(blocks) => Cow::Owned(
            blocks
                .iter()
                .map(result_block_text)
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        StrOrSeq::Other(v) => Cow::Owned(v.to_string()),
    }
}

/// One block of a tool result's content (blocks are few and small: the text of a result is
/// one block): a text block's text, `[image]` for an image, a string as it is, anything else
/// as JSON.
fn result_block_text(block: &Value) -> String {
    match block {
        Value::String(s) => s.clone(),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("text") => o
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            Some("image") => "[image]".to_string(),
            _ => block.to_string(),
        },
        other => other.to_string(),
    }
}

/// The members of a tool's input that [`render_tool_input`] may show, each only when it is a
/// string.
#[derive(Deserialize, Default)]
struct ToolInput<'a> {
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    command: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    file_path: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    notebook_path: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    path: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    pattern: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    url: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    query: Option<Cow<'a, str>>,
}

/// A `TOOL_CALL`'s content: the tool's main argument, or its whole input as JSON (`input` is
/// `None` for `null` or none).
fn render_tool_input(name: &str, input: Option<&RawValue>) -> String {
    let Some(raw) = input else {
        return String::new();
    };
    let fields = match serde_json::from_str::<Obj<ToolInput>>(raw.get()) {
        Ok(Obj(Some(fields))) => fields,
        _ => ToolInput::default(),
    };
    let shown = match name {
        "Bash" => fields.command,
        "Read" | "Write" | "Edit" | "MultiEdit" => fields.file_path,
        "NotebookEdit" => fields.notebook_path,
        "LS" => fields.path,
        "Glob" | "Grep" => fields.pattern,
        "WebFetch" => fields.url,
        "WebSearch" => fields.query,
        // Other agents' tools (behind a bridge: codex's commands, gemini's `run_shell_command`
        // and `write_file`, the openai-api loop's `shell` / `read_file`, …) name their main
        // argument the same few ways: show it rather than the whole JSON.
        _ => fields
            .command
            .or(fields.file_path)
            .or(fields.path)
            .or(fields.pattern)
            .or(fields.url)
            .or(fields.query),
    };
    match shown {
        Some(s) => paddock_sys::text::prefix(&s, TOOL_INPUT_MAX).to_string(),
        None => paddock_sys::text::prefix(&json_text(raw), TOOL_INPUT_MAX).to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// The lines as read

/// One stdout line, read in one pass: the fields of every line type the parser maps, each
/// [lenient] (of another type, it reads as absent), every other field skipped unread. A
/// `result` and a `control_request` read their own fields from the line's text.
#[derive(Deserialize)]
struct WireLine<'a> {
    #[serde(rename = "type", default, borrow, deserialize_with = "lenient::string")]
    ty: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    subtype: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    session_id: Option<Cow<'a, str>>,
    /// `assistant`, `user`.
    #[serde(default, borrow)]
    message: Obj<Message<'a>>,
    /// `assistant`: the CLI's own stand-in for a failed API call.
    #[serde(default, deserialize_with = "lenient::boolean")]
    is_api_error_message: Option<bool>,
    /// `paddock_raw`: the agent's line.
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    line: Option<Cow<'a, str>>,
    /// `control_response`.
    #[serde(default, borrow)]
    response: Obj<ResponseId<'a>>,
    /// `system` / `api_retry`: a number or a string (only those lines carry it).
    #[serde(default)]
    error_status: Option<Value>,
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    error: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "lenient::uint")]
    attempt: Option<u64>,
    #[serde(default, deserialize_with = "lenient::uint")]
    max_retries: Option<u64>,
    #[serde(default, deserialize_with = "lenient::uint")]
    retry_delay_ms: Option<u64>,
    /// `system` / `paddock_connection`.
    #[serde(default, deserialize_with = "lenient::boolean")]
    connected: Option<bool>,
    /// `system`: a note's text.
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    content: Option<Cow<'a, str>>,
}

/// A `control_response`'s `response`: which request it answers.
#[derive(Deserialize)]
struct ResponseId<'a> {
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    request_id: Option<Cow<'a, str>>,
}

/// An `assistant` or `user` line's `message`.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    content: Content<'a>,
    /// Only an object; each malformed count reads as 0 ([`Usage`]).
    #[serde(default)]
    usage: Obj<Usage>,
}

/// A message's `content`: a string, or blocks (an element that is not an object has no
/// `type`: nothing to map). Anything else, or none, makes the line unrecognized.
type Content<'a> = StrOrSeq<'a, Obj<Block<'a>>>;

/// One content block of any type; each type reads the fields it has.
#[derive(Deserialize)]
struct Block<'a> {
    #[serde(rename = "type", default, borrow, deserialize_with = "lenient::string")]
    ty: Option<Cow<'a, str>>,
    /// `text`.
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    text: Option<Cow<'a, str>>,
    /// `thinking`.
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    thinking: Option<Cow<'a, str>>,
    /// `tool_use`: its id, tool and input (`None` for `null`).
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "lenient::string")]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    input: Option<&'a RawValue>,
    /// `*tool_result`: present (whatever its value) on a result.
    #[serde(default, borrow, deserialize_with = "lenient::present_string")]
    tool_use_id: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "lenient::boolean")]
    is_error: Option<bool>,
    /// A result's content (`None` for `null`), read by [`result_text`].
    #[serde(default, borrow)]
    content: Option<StrOrSeq<'a, Value>>,
}

/// The stdin line that delivers one user message (no trailing newline; the caller adds it):
/// `{"type":"user","message":{"role":"user","content":[{"type":"text","text":…}]}}`.
pub fn user_message_line(text: &str) -> String {
    stream_json::encode(&Line::User(User::text(text)))
}

/// Allows a `can_use_tool` request (no trailing newline):
/// `{"type":"control_response","response":{"subtype":"success","request_id":…,"response":{"behavior":"allow","updatedInput":…}}}`.
/// Pass the request's own `input` to run the tool unchanged.
pub fn control_response_allow(request_id: &str, input: &Value) -> String {
    stream_json::encode(&ControlResponse::allow(request_id, input))
}

/// Denies a `can_use_tool` request (no trailing newline):
/// `{"type":"control_response","response":{"subtype":"success","request_id":…,"response":{"behavior":"deny","message":…}}}`.
pub fn control_response_deny(request_id: &str, message: &str) -> String {
    stream_json::encode(&ControlResponse::deny(request_id, message))
}

/// Answers a control request the controller cannot handle (e.g. an unknown subtype), so
/// Claude Code does not wait forever (no trailing newline):
/// `{"type":"control_response","response":{"subtype":"error","request_id":…,"error":…}}`.
pub fn control_response_error(request_id: &str, error: &str) -> String {
    stream_json::encode(&ControlResponse::error(request_id, error))
}

/// The activities among parsed items (for the tests of the parsers that read stream-json).
#[cfg(test)]
pub(crate) fn activities_of(items: &[Parsed]) -> Vec<Activity> {
    items
        .iter()
        .filter_map(|p| match p {
            Parsed::Event(ProviderEvent::Activity(a)) => Some(a.clone()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use super::activities_of as acts;

    fn run(p: &mut ClaudeStreamParser, transcript: &str) -> Vec<Parsed> {
        transcript.lines().flat_map(|l| p.parse_line(l)).collect()
    }

    fn sum_tokens(a: &[Activity]) -> (u64, u64) {
        a.iter().fold((0, 0), |(i, o), a| {
            (i + a.tokens_input, o + a.tokens_output)
        })
    }

    const SID: &str = "5b1c0d6e-2f0a-4c1e-9a57-0e8f3d2b7c11";

    /// A full tool-using turn as Claude Code 2.x prints it: thinking and tool_use share one API
    /// message (so its usage repeats, output growing), the tool result, then a text answer.
    const TOOL_TURN: &str = include_str!("testdata/claude_tool_turn.jsonl");

    #[test]
    fn full_tool_turn() {
        let mut p = ClaudeStreamParser::new();
        let out = run(&mut p, TOOL_TURN);
        assert_eq!(p.unrecognized_count(), 0, "{out:#?}");
        assert_eq!(out[0], Parsed::Event(ProviderEvent::SessionRef(SID.into())));
        let a = acts(&out);
        let kinds: Vec<_> = a.iter().map(|a| a.kind()).collect();
        use ActivityKind::*;
        assert_eq!(
            kinds,
            [Thinking, ToolCall, ToolResult, Text, Completion],
            "{a:#?}"
        );
        // SessionRef only once: the result's session_id is unchanged.
        let refs = out
            .iter()
            .filter(|p| matches!(p, Parsed::Event(ProviderEvent::SessionRef(_))))
            .count();
        assert_eq!(refs, 1);

        assert_eq!(a[0].content, "The user wants the file list. I'll run ls.");
        // msg 1 first line: 3 + 0 + 14000 in, 2 out.
        assert_eq!((a[0].tokens_input, a[0].tokens_output), (14003, 2));
        assert_eq!(a[1].tool_name, "Bash");
        assert_eq!(a[1].tool_call_id, "toolu_01A");
        assert_eq!(a[1].content, "ls -la");
        // Same message id, output grew 2 -> 41: only the increase.
        assert_eq!((a[1].tokens_input, a[1].tokens_output), (0, 39));
        assert_eq!(a[2].tool_name, "Bash");
        assert_eq!(a[2].tool_call_id, "toolu_01A");
        assert!(a[2].tool_success);
        assert_eq!(a[2].content, "total 8\nREADME.md\nsrc");
        assert_eq!((a[2].tokens_input, a[2].tokens_output), (0, 0));
        assert_eq!(a[3].content, "Two entries: README.md and src.");
        // msg 2: 5 + 14003 + 120 in, 12 out.
        assert_eq!((a[3].tokens_input, a[3].tokens_output), (14128, 12));
        assert_eq!(a[4].content, "Two entries: README.md and src.");
        // result totals: in 8 + 14003 + 14120 = 28131, out 53; attributed 28131 / 53.
        assert_eq!((a[4].tokens_input, a[4].tokens_output), (0, 0));
        assert_eq!(sum_tokens(&a), (28131, 53));
    }

    #[test]
    fn the_ssh_relays_connection_lines_mark_the_session() {
        use crate::stream_json::connection_line;
        let mut p = ClaudeStreamParser::new();
        let lost = p.parse_line(&connection_line(false, "the connection to h was lost"));
        assert_eq!(
            lost,
            [Parsed::Event(ProviderEvent::Connection {
                connected: false,
                note: "the connection to h was lost".into()
            })]
        );
        let back =
            p.parse_line(r#"{"type":"system","subtype":"paddock_connection","connected":true}"#);
        assert_eq!(
            back,
            [Parsed::Event(ProviderEvent::Connection {
                connected: true,
                note: "reconnected".into()
            })]
        );
        assert_eq!(p.unrecognized_count(), 0);
    }

    /// Three turns as the real Claude Code 2.1.330 printed them against the fake model server
    /// of `tests/providers` (recorded by its `real_stream_json_through_the_adapter` test with
    /// `PADDOCK_RECORD_FIXTURES=1`; paths normalised): a thinking + Bash + Write turn (with a
    /// `can_use_tool` control request), an API error 500, a plain answer.
    const RECORDED: &str = include_str!("testdata/claude_recorded.jsonl");

    #[test]
    fn recorded_stream_of_the_real_cli() {
        let mut p = ClaudeStreamParser::new();
        let mut turns: Vec<Vec<Parsed>> = vec![Vec::new()];
        for line in RECORDED.lines() {
            let out = p.parse_line(line);
            turns.last_mut().unwrap().extend(out);
            if line.contains(r#""type":"result""#) {
                turns.push(Vec::new());
            }
        }
        assert!(turns.pop().unwrap().is_empty());
        assert_eq!(turns.len(), 3);
        // Every line of this CLI version is understood.
        assert_eq!(p.unrecognized_count(), 0);
        // `init` opens every turn; the id is reported once.
        let refs: Vec<_> = turns
            .iter()
            .flatten()
            .filter(|x| matches!(x, Parsed::Event(ProviderEvent::SessionRef(_))))
            .collect();
        assert_eq!(refs.len(), 1, "{refs:?}");
        // The permission prompt for Write (Bash `ls` needs none).
        let prompts: Vec<_> = turns[0]
            .iter()
            .filter_map(|x| match x {
                Parsed::ControlRequest {
                    subtype,
                    tool_name,
                    input,
                    ..
                } => Some((
                    subtype.as_str(),
                    tool_name.as_str(),
                    input["content"].clone(),
                )),
                _ => None,
            })
            .collect();
        assert_eq!(prompts, [("can_use_tool", "Write", json!("hi\n"))]);

        use ActivityKind::*;
        let a = acts(&turns[0]);
        let kinds: Vec<_> = a.iter().map(|a| a.kind()).collect();
        assert_eq!(
            kinds,
            [Thinking, ToolCall, ToolResult, ToolCall, ToolResult, Text, Completion],
            "{a:#?}"
        );
        assert_eq!(a[1].content, "ls");
        assert_eq!(a[2].content, "README.md\nsrc");
        assert_eq!(a[1].tool_call_id, a[2].tool_call_id);
        assert_eq!(a[3].content, "/home/dev/proj/hello.txt");
        assert_eq!(a[4].tool_name, "Write");
        assert!(a[4].tool_success);
        // The assistant lines carry message_start's usage (output 1); the `result` brings the
        // turn's real totals: 900 + (50 + 900 cached) + (60 + 950 cached) in, 25 + 15 + 12 out.
        assert_eq!((a[0].tokens_input, a[0].tokens_output), (900, 1));
        assert_eq!((a[3].tokens_input, a[3].tokens_output), (950, 1));
        assert_eq!((a[5].tokens_input, a[5].tokens_output), (1010, 1));
        assert_eq!((a[6].tokens_input, a[6].tokens_output), (0, 49));
        assert_eq!(sum_tokens(&a), (2860, 52));

        // A 500: the CLI's synthetic "API Error" message adds nothing; the result is the ERROR.
        let a = acts(&turns[1]);
        assert_eq!(a.len(), 1, "{a:#?}");
        assert_eq!(a[0].kind(), Error);
        assert!(
            a[0].content
                .starts_with("claude: API error status 500 (api_error): API Error: 500 "),
            "{}",
            a[0].content
        );
        assert_eq!(sum_tokens(&a), (0, 0));

        let a = acts(&turns[2]);
        assert_eq!(
            a.iter().map(|a| a.kind()).collect::<Vec<_>>(),
            [Text, Completion]
        );
        assert_eq!(a[1].content, "Second turn.");
        assert_eq!(sum_tokens(&a), (100, 10));
    }

    #[test]
    fn system_lines_of_the_2_1_cli() {
        let mut p = ClaudeStreamParser::new();
        let t = r#"{"type":"system","subtype":"init","session_id":"s","cwd":"/w"}
{"type":"system","subtype":"thinking_tokens","estimated_tokens":6,"estimated_tokens_delta":6,"session_id":"s","uuid":"u"}
{"type":"system","subtype":"task_started","task_id":"b","tool_use_id":"t","description":"nap","task_type":"local_bash","session_id":"s"}
{"type":"system","subtype":"permission_denied","tool_name":"Write","tool_use_id":"t","message":"no","session_id":"s"}
{"type":"system","subtype":"init","session_id":"s","cwd":"/w"}
{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"retry_delay_ms":597,"error_status":500,"error":"server_error","session_id":"s","uuid":"u"}
{"type":"system","subtype":"api_retry","attempt":2,"max_retries":10,"retry_delay_ms":1000,"error_status":null,"error":"connection_error"}
{"type":"system","subtype":"model_fallback","content":"Opus is overloaded; using Sonnet","level":"warning","originalModel":"a","fallbackModel":"b"}
{"type":"system","subtype":"model_refusal_no_fallback"}"#;
        let out = run(&mut p, t);
        assert_eq!(p.unrecognized_count(), 0);
        assert_eq!(out[0], Parsed::Event(ProviderEvent::SessionRef("s".into())));
        let a = acts(&out);
        assert_eq!(out.len(), 1 + a.len());
        let texts: Vec<_> = a.iter().map(|a| (a.kind(), a.content.as_str())).collect();
        assert_eq!(
            texts,
            [
                (
                    ActivityKind::Status,
                    "API error 500 (server_error); retry 1 of 10 in 597 ms"
                ),
                (
                    ActivityKind::Status,
                    "API error (connection_error); retry 2 of 10 in 1000 ms"
                ),
                (ActivityKind::Status, "Opus is overloaded; using Sonnet"),
                (ActivityKind::Status, "model refusal no fallback"),
            ]
        );
        // A new id (another conversation) is reported again.
        let out = p.parse_line(r#"{"type":"system","subtype":"init","session_id":"t"}"#);
        assert_eq!(out, [Parsed::Event(ProviderEvent::SessionRef("t".into()))]);
    }

    #[test]
    fn synthetic_api_error_message_is_left_to_the_result() {
        let mut p = ClaudeStreamParser::new();
        let t = r#"{"type":"assistant","message":{"id":"0b1","model":"<synthetic>","role":"assistant","stop_reason":"stop_sequence","type":"message","usage":{"input_tokens":0,"output_tokens":0},"content":[{"type":"text","text":"API Error: 400 bad"}]},"session_id":"s","error":"unknown","is_api_error_message":true,"api_error_status":400,"api_error_type":"invalid_request_error"}
{"type":"result","subtype":"success","is_error":true,"api_error_status":400,"api_error_type":"invalid_request_error","result":"API Error: 400 bad","session_id":"s","usage":{"input_tokens":0,"output_tokens":0}}"#;
        let out = run(&mut p, t);
        assert_eq!(p.unrecognized_count(), 0);
        let a = acts(&out);
        assert_eq!(a.len(), 1);
        assert_eq!(
            a[0].content,
            "claude: API error status 400 (invalid_request_error): API Error: 400 bad"
        );
    }

    #[test]
    fn result_carries_the_remainder_and_turn_accounting_resets() {
        let mut p = ClaudeStreamParser::new();
        let t = r#"{"type":"assistant","message":{"id":"m1","role":"assistant","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":10,"output_tokens":5}}}
{"type":"result","subtype":"success","is_error":false,"result":"hi","session_id":"s","usage":{"input_tokens":25,"cache_read_input_tokens":5,"output_tokens":9}}
{"type":"assistant","message":{"id":"m2","role":"assistant","content":[{"type":"text","text":"again"}],"usage":{"input_tokens":7,"output_tokens":3}}}
{"type":"result","subtype":"success","is_error":false,"result":"again","session_id":"s","usage":{"input_tokens":5,"output_tokens":1}}"#;
        let out = run(&mut p, t);
        let a = acts(&out);
        assert_eq!((a[0].tokens_input, a[0].tokens_output), (10, 5));
        assert_eq!(a[1].kind(), ActivityKind::Completion);
        assert_eq!((a[1].tokens_input, a[1].tokens_output), (20, 4));
        assert_eq!((a[2].tokens_input, a[2].tokens_output), (7, 3));
        // Totals below what was attributed: floored at 0.
        assert_eq!((a[3].tokens_input, a[3].tokens_output), (0, 0));
        // A result with a new session_id is preceded by SessionRef (the first one here).
        assert_eq!(out[1], Parsed::Event(ProviderEvent::SessionRef("s".into())));
        assert_eq!(out.len(), 5);
    }

    #[test]
    fn repeated_usage_same_message_id_is_counted_once() {
        let mut p = ClaudeStreamParser::new();
        let line = |block: &str, out: u64| {
            format!(
                r#"{{"type":"assistant","message":{{"id":"msg_X","role":"assistant","content":[{block}],"usage":{{"input_tokens":100,"cache_creation_input_tokens":50,"cache_read_input_tokens":0,"output_tokens":{out}}}}},"session_id":"s"}}"#
            )
        };
        let mut all = Vec::new();
        all.extend(p.parse_line(&line(
            r#"{"type":"thinking","thinking":"a","signature":"sig"}"#,
            1,
        )));
        all.extend(p.parse_line(&line(r#"{"type":"text","text":"b"}"#, 1)));
        all.extend(p.parse_line(&line(r#"{"type":"text","text":"c"}"#, 30)));
        // A stale (smaller) repeat attributes nothing and does not lower the high-water mark.
        all.extend(p.parse_line(&line(r#"{"type":"text","text":"d"}"#, 10)));
        all.extend(p.parse_line(&line(r#"{"type":"text","text":"e"}"#, 30)));
        let a = acts(&all);
        let toks: Vec<_> = a
            .iter()
            .map(|a| (a.tokens_input, a.tokens_output))
            .collect();
        assert_eq!(toks, [(150, 1), (0, 0), (0, 29), (0, 0), (0, 0)]);

        // Another message's lines between two of msg_X's (a sub-agent's, say): msg_X is still
        // remembered, and its next line attributes only what grew.
        for i in 0..USAGE_IDS_KEPT - 1 {
            p.parse_line(
                &line(r#"{"type":"text","text":"x"}"#, 1).replace("msg_X", &format!("sub_{i}")),
            );
        }
        let a = acts(&p.parse_line(&line(r#"{"type":"text","text":"f"}"#, 31)));
        assert_eq!((a[0].tokens_input, a[0].tokens_output), (0, 1));
    }

    #[test]
    fn delta_of_a_line_without_activity_is_carried() {
        let mut p = ClaudeStreamParser::new();
        // Empty text and an unknown block type: no activity, but usage.
        let t = r#"{"type":"assistant","message":{"id":"m1","content":[{"type":"text","text":""},{"type":"future_block","x":1}],"usage":{"input_tokens":40,"output_tokens":4}}}
{"type":"assistant","message":{"id":"m2","content":[{"type":"tool_use","id":"t1","name":"Read","input":{"file_path":"/a/b.rs"}},{"type":"tool_use","id":"t2","name":"Grep","input":{"pattern":"fn main"}}],"usage":{"input_tokens":2,"output_tokens":6}}}"#;
        let out = run(&mut p, t);
        assert_eq!(p.unrecognized_count(), 0);
        let a = acts(&out);
        assert_eq!(a.len(), 2);
        assert_eq!((a[0].tokens_input, a[0].tokens_output), (42, 10));
        assert_eq!((a[1].tokens_input, a[1].tokens_output), (0, 0));
        assert_eq!(a[0].content, "/a/b.rs");
        assert_eq!(a[1].content, "fn main");
        // The carried delta never attached before a result is covered by the result's totals.
        let mut p = ClaudeStreamParser::new();
        let t = r#"{"type":"assistant","message":{"id":"m1","content":[],"usage":{"input_tokens":40,"output_tokens":4}}}
{"type":"result","subtype":"success","is_error":false,"result":"ok","session_id":"s","usage":{"input_tokens":40,"output_tokens":4}}"#;
        let a = acts(&run(&mut p, t));
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].tokens_input, a[0].tokens_output), (40, 4));
    }

    #[test]
    fn error_result_with_api_error_status() {
        let mut p = ClaudeStreamParser::new();
        let t = r#"{"type":"system","subtype":"init","cwd":"/w","session_id":"s1","tools":["Bash"],"model":"claude-sonnet-4-5","permissionMode":"default","apiKeySource":"none"}
{"type":"assistant","message":{"id":"e1","model":"<synthetic>","role":"assistant","content":[{"type":"text","text":"API Error: 529 {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}"}],"usage":{"input_tokens":0,"output_tokens":0}},"session_id":"s1"}
{"type":"result","subtype":"success","is_error":true,"duration_ms":31012,"duration_api_ms":0,"num_turns":1,"result":"API Error: 529 Overloaded","session_id":"s1","total_cost_usd":0,"usage":{"input_tokens":0,"output_tokens":0},"api_error_status":529}"#;
        let out = run(&mut p, t);
        let a = acts(&out);
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].kind(), ActivityKind::Text);
        assert_eq!(a[1].kind(), ActivityKind::Error);
        assert_eq!(
            a[1].content,
            "claude: API error status 529: API Error: 529 Overloaded"
        );
        // api_error_status alone (is_error false) is still an error; null is not.
        let mut p = ClaudeStreamParser::new();
        let e = r#"{"type":"result","subtype":"success","is_error":false,"result":"x","session_id":"s","api_error_status":"rate_limited"}"#;
        assert_eq!(acts(&p.parse_line(e))[0].kind(), ActivityKind::Error);
        let ok = r#"{"type":"result","subtype":"success","is_error":false,"result":"x","session_id":"s","api_error_status":null}"#;
        assert_eq!(acts(&p.parse_line(ok))[0].kind(), ActivityKind::Completion);
        // is_error with nothing else.
        let bare = r#"{"type":"result","subtype":"success","is_error":true,"session_id":"s"}"#;
        assert_eq!(acts(&p.parse_line(bare))[0].content, "claude: error");
    }

    #[test]
    fn error_max_turns_and_during_execution() {
        let mut p = ClaudeStreamParser::new();
        let t = r#"{"type":"assistant","message":{"id":"a","content":[{"type":"tool_use","id":"t","name":"Bash","input":{"command":"make"}}],"usage":{"input_tokens":100,"output_tokens":10}},"session_id":"s"}
{"type":"result","subtype":"error_max_turns","is_error":false,"duration_ms":5000,"num_turns":3,"session_id":"s","total_cost_usd":0.01,"usage":{"input_tokens":300,"output_tokens":25}}"#;
        let a = acts(&run(&mut p, t));
        assert_eq!(a[1].kind(), ActivityKind::Error);
        assert_eq!(a[1].content, "claude: error_max_turns: after 3 turns");
        assert_eq!((a[1].tokens_input, a[1].tokens_output), (200, 15));
        let e = r#"{"type":"result","subtype":"error_during_execution","is_error":true,"session_id":"s","errors":["Tool crashed","second"],"usage":{"input_tokens":1,"output_tokens":1}}"#;
        let a = acts(&p.parse_line(e));
        assert_eq!(a[0].kind(), ActivityKind::Error);
        assert_eq!(
            a[0].content,
            "claude: error_during_execution: Tool crashed; second"
        );
        assert_eq!((a[0].tokens_input, a[0].tokens_output), (1, 1));
        // As 2.1.330 prints it: the reason in `errors`, no `result` text.
        let e = r#"{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":2,"stop_reason":"tool_use","session_id":"s","usage":{"input_tokens":100,"output_tokens":10},"terminal_reason":"max_turns","errors":["Reached maximum number of turns (1)"]}"#;
        let a = acts(&p.parse_line(e));
        assert_eq!(
            a[0].content,
            "claude: error_max_turns: Reached maximum number of turns (1)"
        );
    }

    #[test]
    fn garbage_truncated_and_unknown_lines() {
        let mut p = ClaudeStreamParser::new();
        let lines = [
            "Warning: something on stdout",
            r#"{"type":"assistant","message":{"id":"m","content":[{"type":"text","te"#,
            r#"{"type":"future_thing","x":1}"#,
            r#"["an","array"]"#,
            r#""a string""#,
            r#"{"no_type":true}"#,
            r#"{"type":"system","subtype":"brand_new"}"#,
            r#"{"type":"system","subtype":"init"}"#,
            r#"{"type":"assistant"}"#,
            r#"{"type":"assistant","message":{"content":42}}"#,
            r#"{"type":"user","message":{"content":{"x":1}}}"#,
            r#"{"type":"control_request","request_id":"r"}"#,
            "{\"type\":\"assistant\",\"message\":{\"content\":\"\u{0}\"}} trailing",
            // A result that cannot be read as one is not an empty successful completion.
            r#"{"type":"result","is_error":true,"result":"boom \ud83d"}"#,
            r#"{"type":"result","is_error":true,"is_error":true,"result":"x"}"#,
        ];
        for l in lines {
            let out = p.parse_line(l);
            assert_eq!(out, vec![Parsed::Unrecognized(l.to_string())], "{l}");
        }
        assert_eq!(p.unrecognized_count(), lines.len() as u64);
        // Trailing newline is stripped from the raw line; blank lines are nothing.
        assert_eq!(
            p.parse_line("oops\n"),
            vec![Parsed::Unrecognized("oops".into())]
        );
        assert!(p.parse_line("").is_empty());
        assert!(p.parse_line("  \r\n").is_empty());
        assert_eq!(p.unrecognized_count(), lines.len() as u64 + 1);
        // Broken lines did not disturb the token state.
        let a = acts(&p.parse_line(
            r#"{"type":"result","subtype":"success","is_error":false,"result":"r","session_id":"s","usage":{"input_tokens":3,"output_tokens":4}}"#,
        ));
        assert_eq!((a[0].tokens_input, a[0].tokens_output), (3, 4));
    }

    /// A field of a type the reader does not expect reads as absent, as walking a `Value`
    /// did: one odd field never makes a line unreadable, nor the blocks beside it.
    #[test]
    fn odd_fields_read_as_absent_and_the_rest_of_the_line_still_counts() {
        let mut p = ClaudeStreamParser::new();
        let l = r#"{"type":"assistant","is_api_error_message":"no","message":{"id":5,"content":[1,"x",null,{"type":"text","text":7},{"type":"text","text":"ok \u00e9"},{"type":"thinking","thinking":{"a":1}},{"type":"tool_use","id":"t","name":"Bash","input":{"command":["ls"],"b":1}},{"type":"tool_use","id":"u","name":"Other","input":"ls"}],"usage":{"input_tokens":"x","output_tokens":3}}}"#;
        let out = p.parse_line(l);
        assert_eq!(p.unrecognized_count(), 0, "{out:#?}");
        let a = acts(&out);
        let got: Vec<_> = a.iter().map(|a| (a.kind(), a.content.as_str())).collect();
        use ActivityKind::*;
        assert_eq!(
            got,
            [
                (Text, "ok é"),
                (Thinking, ""),
                (ToolCall, r#"{"b":1,"command":["ls"]}"#),
                (ToolCall, r#""ls""#),
            ]
        );
        // A message id that is not a string: the usage counts in full, on the first activity.
        assert_eq!((a[0].tokens_input, a[0].tokens_output), (0, 3));
        // A result whose tool_use_id is not a string is still a result (of no known call), and
        // content of another shape reads as its JSON.
        let r = r#"{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":null,"is_error":"yes","content":{"b":[2],"a":1}},{"type":"tool_result","tool_use_id":"t","content":["plain",{"type":"text","text":"t"},{"type":"video","z":1,"a":2},3]}]}}"#;
        let a = acts(&p.parse_line(r));
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].content, r#"{"a":1,"b":[2]}"#);
        assert!(
            a[0].tool_success,
            "is_error that is not a boolean is not an error"
        );
        assert_eq!(
            (a[1].tool_name.as_str(), a[1].tool_call_id.as_str()),
            ("Bash", "t")
        );
        assert_eq!(
            a[1].content,
            "plain\nt\n{\"a\":2,\"type\":\"video\",\"z\":1}\n3"
        );
        // A tool-call id used again names its latest call.
        p.parse_line(r#"{"type":"assistant","message":{"content":[{"type":"tool_use","id":"r","name":"Bash","input":{}}]}}"#);
        p.parse_line(r#"{"type":"assistant","message":{"content":[{"type":"tool_use","id":"r","name":"Read","input":{}}]}}"#);
        let res = r#"{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"r","content":"x"}]}}"#;
        assert_eq!(acts(&p.parse_line(res))[0].tool_name, "Read");
        assert_eq!(acts(&p.parse_line(res))[0].tool_name, "");
        // A lone surrogate in a field the parser skips (Claude Code's copy of a command's
        // output, cut between the halves of a pair) leaves the line's tool result readable.
        let cut = r#"{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"q","content":"ok"}]},"tool_use_result":{"stdout":"x\ud83d"}}"#;
        assert_eq!(acts(&p.parse_line(cut))[0].content, "ok");
        // An array where the line's object should be is not a line.
        assert_eq!(
            p.parse_line(r#"["assistant",{"content":"x"}]"#),
            vec![Parsed::Unrecognized(
                r#"["assistant",{"content":"x"}]"#.into()
            )]
        );
    }

    /// A turn's memory of messages and calls is bounded, and does not keep a long turn's size
    /// after it (issue 16: the parser's per-turn maps shrink after a turn); a call still
    /// waiting for its result keeps its name.
    #[test]
    fn a_turns_memory_is_bounded_and_shrinks_at_its_end() {
        let call = |i: usize| {
            format!(
                r#"{{"type":"assistant","message":{{"id":"m{i}","content":[{{"type":"tool_use","id":"t{i}","name":"Bash","input":{{"command":"true"}}}}],"usage":{{"input_tokens":1,"output_tokens":1}}}}}}"#
            )
        };
        let result = |i: usize, text: &str| {
            format!(
                r#"{{"type":"user","message":{{"content":[{{"type":"tool_result","tool_use_id":"t{i}","content":"{text}"}}]}}}}"#
            )
        };
        let mut p = ClaudeStreamParser::new();
        // 200 calls made at once (as parallel tool calls are), then all but the first answered.
        for i in 0..200 {
            p.parse_line(&call(i));
        }
        for i in 1..200 {
            assert_eq!(acts(&p.parse_line(&result(i, "ok")))[0].tool_name, "Bash");
        }
        assert!(p.tool_names.capacity() >= 200);
        // The turn's 200 messages: only the last USAGE_IDS_KEPT are remembered.
        assert_eq!(p.seen_usage.len(), USAGE_IDS_KEPT);
        assert_eq!(p.seen_usage.back().unwrap().0, "m199");
        p.parse_line(r#"{"type":"result","subtype":"success","result":"done"}"#);
        assert_eq!(p.seen_usage.capacity(), 0);
        assert!(p.tool_names.capacity() < 16, "{}", p.tool_names.capacity());
        let a = acts(&p.parse_line(&result(0, "late")));
        assert_eq!(
            (a[0].tool_name.as_str(), a[0].content.as_str()),
            ("Bash", "late")
        );

        // Calls never answered: the oldest are forgotten past TOOL_CALLS_KEPT.
        for i in 1000..1000 + TOOL_CALLS_KEPT + 10 {
            p.parse_line(&call(i));
        }
        assert_eq!(p.tool_names.len(), TOOL_CALLS_KEPT);
        assert_eq!(acts(&p.parse_line(&result(1000, "x")))[0].tool_name, "");
        assert_eq!(acts(&p.parse_line(&result(1010, "x")))[0].tool_name, "Bash");
    }

    #[test]
    fn known_but_uninteresting_lines_are_ignored() {
        let mut p = ClaudeStreamParser::new();
        let t = r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"He"}},"session_id":"s","parent_tool_use_id":null,"uuid":"u"}
{"type":"system","subtype":"compact_boundary","session_id":"s","compact_metadata":{"trigger":"auto","pre_tokens":150000}}
{"type":"system","subtype":"hook_response","hook_name":"x","stdout":"","stderr":"","exit_code":0}
{"type":"system","subtype":"status","status":"compacting"}
{"type":"control_response","response":{"subtype":"success","request_id":"req_1"}}
{"type":"control_cancel_request","request_id":"req_2"}
{"type":"keep_alive"}
{"type":"user","message":{"role":"user","content":"hello"},"session_id":"s"}
{"type":"user","message":{"role":"user","content":[{"type":"text","text":"hello"}]},"session_id":"s"}"#;
        assert!(run(&mut p, t).is_empty());
        assert_eq!(p.unrecognized_count(), 0);
    }

    #[test]
    fn tool_results_blocks_errors_and_truncation() {
        let mut p = ClaudeStreamParser::new();
        p.parse_line(r#"{"type":"assistant","message":{"id":"m","content":[{"type":"tool_use","id":"t1","name":"Read","input":{"file_path":"/x"}},{"type":"tool_use","id":"t2","name":"mcp__srv__thing","input":{"a":[1,2],"b":"c"}}]}}"#);
        let big = "é".repeat(5000); // 10000 bytes
        let line = json!({"type":"user","message":{"role":"user","content":[
            {"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"line1"},{"type":"image","source":{}},{"type":"text","text":"line2"}]},
            {"type":"tool_result","tool_use_id":"t2","content":big,"is_error":true},
            {"type":"tool_result","tool_use_id":"unknown","content":"<tool_use_error>File does not exist.</tool_use_error>","is_error":true}
        ]}, "tool_use_result": "whatever"})
        .to_string();
        let a = acts(&p.parse_line(&line));
        assert_eq!(a.len(), 3);
        assert_eq!(a[0].content, "line1\n[image]\nline2");
        assert_eq!(a[0].tool_name, "Read");
        assert!(a[0].tool_success);
        assert_eq!(a[1].tool_name, "mcp__srv__thing");
        assert!(!a[1].tool_success);
        assert!(a[1].content.starts_with("éé"));
        assert!(
            a[1].content.ends_with("… [truncated 1808 bytes]"),
            "{}",
            &a[1].content[8000..]
        );
        assert_eq!(a[1].content.len(), 8192 + "… [truncated 1808 bytes]".len());
        assert_eq!(a[2].tool_name, "");
        assert_eq!(a[2].tool_call_id, "unknown");
        assert!(!a[2].tool_success);
    }

    /// [`render_tool_input`] of `input` as an agent prints it.
    fn render(name: &str, input: &Value) -> String {
        let text = input.to_string();
        render_tool_input(
            name,
            serde_json::from_str::<Option<&RawValue>>(&text).unwrap(),
        )
    }

    #[test]
    fn tool_input_rendering() {
        assert_eq!(
            render("Bash", &json!({"command":"cargo test","timeout":5})),
            "cargo test"
        );
        assert_eq!(
            render("Edit", &json!({"file_path":"/a","old_string":"x"})),
            "/a"
        );
        assert_eq!(
            render("Write", &json!({"file_path":"/w","content":"x"})),
            "/w"
        );
        assert_eq!(render("Bash", &json!({"cmd":"x"})), r#"{"cmd":"x"}"#);
        assert_eq!(render("TodoWrite", &json!({"todos":[]})), r#"{"todos":[]}"#);
        assert_eq!(render("X", &Value::Null), "");
        let long = render("Task", &json!({"prompt": "ü".repeat(3000)}));
        assert_eq!(long.len(), 1999); // cut on a char boundary at or below 2000 bytes
        assert!(long.starts_with(r#"{"prompt":"ü"#));
    }

    #[test]
    fn thinking_variants_and_string_content() {
        let mut p = ClaudeStreamParser::new();
        let t = r#"{"type":"assistant","message":{"id":"m","content":[{"type":"redacted_thinking","data":"xx"},{"type":"thinking","thinking":"hmm","signature":"s"}]}}
{"type":"assistant","message":{"id":"n","content":"plain string content"}}"#;
        let a = acts(&run(&mut p, t));
        assert_eq!(a[0].kind(), ActivityKind::Thinking);
        assert_eq!(a[0].content, "[redacted thinking]");
        assert_eq!(a[1].content, "hmm");
        assert_eq!(a[2].kind(), ActivityKind::Text);
        assert_eq!(a[2].content, "plain string content");
    }

    #[test]
    fn control_requests_and_responses() {
        let mut p = ClaudeStreamParser::new();
        let l = r#"{"type":"control_request","request_id":"req_7","request":{"subtype":"can_use_tool","tool_name":"Bash","input":{"command":"rm -rf build"},"permission_suggestions":[],"tool_use_id":"toolu_9"}}"#;
        assert_eq!(
            p.parse_line(l),
            vec![Parsed::ControlRequest {
                request_id: "req_7".into(),
                subtype: "can_use_tool".into(),
                tool_name: "Bash".into(),
                input: json!({"command":"rm -rf build"}),
            }]
        );
        let h = r#"{"type":"control_request","request_id":"req_8","request":{"subtype":"hook_callback","callback_id":"c"}}"#;
        assert_eq!(
            p.parse_line(h),
            vec![Parsed::ControlRequest {
                request_id: "req_8".into(),
                subtype: "hook_callback".into(),
                tool_name: String::new(),
                input: Value::Null,
            }]
        );
        assert_eq!(
            control_response_allow("req_7", &json!({"command":"rm -rf build"})),
            r#"{"type":"control_response","response":{"subtype":"success","request_id":"req_7","response":{"behavior":"allow","updatedInput":{"command":"rm -rf build"}}}}"#
        );
        assert_eq!(
            control_response_deny("req_7", "not \"here\""),
            r#"{"type":"control_response","response":{"subtype":"success","request_id":"req_7","response":{"behavior":"deny","message":"not \"here\""}}}"#
        );
        assert_eq!(
            control_response_error("req_8", "unsupported"),
            r#"{"type":"control_response","response":{"subtype":"error","request_id":"req_8","error":"unsupported"}}"#
        );
    }

    #[test]
    fn user_message_line_format() {
        let l = user_message_line("hi \"there\"\nline2");
        assert_eq!(
            l,
            r#"{"type":"user","message":{"role":"user","content":[{"type":"text","text":"hi \"there\"\nline2"}]}}"#
        );
        assert!(!l.contains('\n'));
        // The parser (replay) ignores it.
        assert!(ClaudeStreamParser::new().parse_line(&l).is_empty());
    }

    #[test]
    fn not_logged_in_says_what_a_paddock_user_can_do() {
        let mut p = ClaudeStreamParser::new();
        let line = r#"{"type":"result","subtype":"success","is_error":true,"result":"Not logged in · Please run /login","session_id":"s","usage":{"input_tokens":0,"output_tokens":0}}"#;
        let events = p.parse_line(line);
        let text = format!("{events:?}");
        assert!(text.contains("Not logged in · Please run /login"), "{text}");
        assert!(text.contains("--env ANTHROPIC_API_KEY"), "{text}");
    }

    #[test]
    fn session_ref_on_changed_result_id() {
        let mut p = ClaudeStreamParser::new();
        let out = run(
            &mut p,
            r#"{"type":"system","subtype":"init","session_id":"a"}
{"type":"result","subtype":"success","is_error":false,"result":"x","session_id":"b"}"#,
        );
        assert_eq!(out[0], Parsed::Event(ProviderEvent::SessionRef("a".into())));
        assert_eq!(out[1], Parsed::Event(ProviderEvent::SessionRef("b".into())));
        assert!(
            matches!(&out[2], Parsed::Event(ProviderEvent::Activity(a)) if a.kind() == ActivityKind::Completion)
        );
        assert_eq!(out.len(), 3);
    }
}
