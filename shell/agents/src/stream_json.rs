//! Claude Code's `stream-json` lines, typed: the one codec of paddock's agent line protocol.
//!
//! Every agent process speaks it: Claude Code itself, the scripted agent
//! ([`super::scripted`]) and the bridges ([`super::bridge`]). The daemon writes user messages
//! and `control_response`s to an agent's stdin and reads its stdout with
//! [`super::claude_stream`]; an agent (a bridge, the scripted agent) writes its lines and reads
//! its stdin here too, so both sides of the protocol are the same types.
//!
//! Written ([`encode`] of a [`Line`]: field order as Claude Code prints them; the bridges'
//! [`encode_sorted`]: keys sorted, as they always were):
//!
//! | line | shape |
//! |---|---|
//! | [`Line::System`] / [`System::Init`] | `{"type":"system","subtype":"init","session_id":…}` (Claude Code adds `cwd`, `tools`, `model`, …) |
//! | [`Line::System`] / [`System::ApiRetry`] | `{"type":"system","subtype":"api_retry","error_status":…,"attempt":…}` |
//! | [`Line::Assistant`] | `{"type":"assistant","message":{"id":…,"role":"assistant","content":[`[`Block`]`…],"usage":`[`Usage`]`}}` |
//! | [`Line::User`] | a user message (`text` blocks, the daemon's) or a `tool_result` (an agent's) |
//! | [`Line::Result`] | `{"type":"result","subtype":"success","is_error":…,"result":…,"usage":…}` |
//! | [`Line::ControlRequest`] | `{"type":"control_request","request_id":…,"request":{"subtype":"can_use_tool",…}}` |
//! | [`Line::ControlResponse`] | `{"type":"control_response","response":{"subtype":"success","request_id":…,"response":{"behavior":…}}}` |
//! | [`Line::PaddockRaw`] | a bridge's envelope for an agent line it did not understand |
//!
//! Read: [`Usage`] (from any line that carries one; counts are never trusted to be well
//! formed), [`ControlRequest`] and [`ReadResult`] (the daemon's reader) and [`AgentInput`]
//! (what an agent reads on its stdin: a user message's text, or the answer to one of its
//! control requests). The reader still walks `assistant` and `user` content blocks and
//! `system` lines as JSON values: their block types are open-ended and a block it does not
//! know is skipped, not an unreadable line.
//!
//! Optional fields that are `None` are left out, except `parent_tool_use_id` and
//! `stop_reason`, which Claude Code prints as `null`.

use std::borrow::Cow;

use serde::de::{Deserializer, IgnoredAny};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One line as text (without its newline), fields in Claude Code's order.
pub fn encode(line: &Line<'_>) -> String {
    serde_json::to_string(line).expect("strings, numbers and JSON values always serialise")
}

/// One line as text with every object's keys sorted: how the bridges have always printed
/// their lines (recordings of their output hold these bytes; the reader does not care).
pub fn encode_sorted(line: &Line<'_>) -> String {
    serde_json::to_value(line)
        .expect("strings, numbers and JSON values always serialise")
        .to_string()
}

// ---------------------------------------------------------------------------------------------
// Lines

/// Every line of the protocol, either way.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Line<'a> {
    System(System<'a>),
    Assistant(Assistant<'a>),
    User(User<'a>),
    Result(TurnResult<'a>),
    ControlRequest(ControlRequest<'a>),
    ControlResponse(ControlResponse<'a>),
    /// An agent's line a bridge did not understand: the daemon stores it and never acts on it.
    PaddockRaw {
        line: &'a str,
    },
}

/// `system` lines.
#[derive(Debug, Serialize)]
#[serde(tag = "subtype", rename_all = "snake_case")]
pub enum System<'a> {
    Init(Init<'a>),
    ApiRetry(ApiRetry<'a>),
    /// A bridge's status note about its agent (a warning it printed): a STATUS activity, not
    /// the agent's words.
    PaddockStatus {
        content: &'a str,
    },
    /// The ssh relay's word that the connection to the agent's machine dropped or is back.
    PaddockConnection {
        connected: bool,
        content: &'a str,
    },
}

/// `system` / `init`: who the agent is; `session_id` is what `--resume` takes back.
#[derive(Debug, Default, Serialize)]
pub struct Init<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<&'a str>,
    pub session_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<&'a [&'a str]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp_servers: Option<&'a [Value]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<&'a str>,
    #[serde(rename = "permissionMode", skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<&'a str>,
    #[serde(rename = "apiKeySource", skip_serializing_if = "Option::is_none")]
    pub api_key_source: Option<&'a str>,
}

/// `system` / `api_retry`: a failed model call that will be retried.
#[derive(Debug, Serialize)]
pub struct ApiRetry<'a> {
    /// The HTTP status (a number), or a word when there was none (`"unreachable"`).
    pub error_status: Value,
    pub error: &'a str,
    pub attempt: u32,
    pub max_retries: u32,
    pub retry_delay_ms: u64,
}

/// Where a line stands in Claude Code's conversation: printed on the lines the agent makes.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Context<'a> {
    pub parent_tool_use_id: Option<&'a str>,
    pub session_id: &'a str,
}

/// An `assistant` line: one API message's content block(s) and its usage so far.
#[derive(Debug, Serialize)]
pub struct Assistant<'a> {
    pub message: AssistantMessage<'a>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub context: Option<Context<'a>>,
}

#[derive(Debug, Serialize)]
pub struct AssistantMessage<'a> {
    /// Lines of one API message share it (and repeat its usage): the reader counts it once.
    pub id: &'a str,
    /// `"message"` as Claude Code prints it; agents that do not say leave it out.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub role: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<&'a str>,
    pub content: Vec<Block<'a>>,
    /// Claude Code prints `null` while the message streams; `None` leaves it out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Option<&'static str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl<'a> AssistantMessage<'a> {
    /// A message with only what the reader needs.
    pub fn new(id: &'a str, content: Vec<Block<'a>>, usage: Option<Usage>) -> Self {
        AssistantMessage {
            id,
            kind: None,
            role: "assistant",
            model: None,
            content,
            stop_reason: None,
            usage,
        }
    }
}

/// A content block of an assistant message.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block<'a> {
    Thinking {
        thinking: Cow<'a, str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        signature: Option<&'a str>,
    },
    Text {
        text: Cow<'a, str>,
    },
    ToolUse {
        id: Cow<'a, str>,
        name: Cow<'a, str>,
        input: Cow<'a, Value>,
    },
}

/// A `user` line: a user message (the daemon's) or a tool's result (an agent's).
#[derive(Debug, Serialize)]
pub struct User<'a> {
    pub message: UserMessage<'a>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub context: Option<Context<'a>>,
}

#[derive(Debug, Serialize)]
pub struct UserMessage<'a> {
    pub role: &'static str,
    pub content: [UserBlock<'a>; 1],
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum UserBlock<'a> {
    Text {
        text: &'a str,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
        is_error: bool,
    },
}

impl<'a> User<'a> {
    /// What the daemon writes to deliver one user message.
    pub fn text(text: &'a str) -> Self {
        User {
            message: UserMessage {
                role: "user",
                content: [UserBlock::Text { text }],
            },
            context: None,
        }
    }

    /// A tool's result, as an agent reports it.
    pub fn tool_result(tool_use_id: &'a str, content: &'a str, is_error: bool) -> Self {
        User {
            message: UserMessage {
                role: "user",
                content: [UserBlock::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                }],
            },
            context: None,
        }
    }
}

/// The `result` line that ends a turn; `usage` is the turn's totals.
#[derive(Debug, Serialize)]
pub struct TurnResult<'a> {
    /// `success`, or why not (`error_max_turns`, …).
    pub subtype: &'a str,
    pub is_error: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_api_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_turns: Option<u64>,
    pub result: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_cost_usd: Option<f64>,
    pub usage: Usage,
    /// The model API's status (a number, or a string) when that is why the turn failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_error_status: Option<&'a Value>,
    /// Which agent behind a bridge ended the turn (the reader names it in an ERROR).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paddock_agent: Option<&'a str>,
}

impl<'a> TurnResult<'a> {
    /// A `success` result with only what the reader needs.
    pub fn new(is_error: bool, result: &'a str, usage: Usage) -> Self {
        TurnResult {
            subtype: "success",
            is_error,
            duration_ms: None,
            duration_api_ms: None,
            num_turns: None,
            result,
            session_id: None,
            total_cost_usd: None,
            usage,
            api_error_status: None,
            paddock_agent: None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Usage

/// Token counts as Claude Code (the Messages API) reports them; input is the sum of the
/// three input counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens neither written to nor read from the prompt cache.
    #[serde(default, deserialize_with = "count")]
    pub input_tokens: u64,
    /// Left out when 0: only Claude Code's own API writes to a cache this way, and the
    /// bridges' lines never carried it.
    #[serde(default, deserialize_with = "count", skip_serializing_if = "is_zero")]
    pub cache_creation_input_tokens: u64,
    #[serde(default, deserialize_with = "count")]
    pub cache_read_input_tokens: u64,
    #[serde(default, deserialize_with = "count")]
    pub output_tokens: u64,
}

impl Usage {
    pub fn plain(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            ..Usage::default()
        }
    }

    /// From counts where the prompt includes its cached part (OpenAI, codex, Gemini): the
    /// uncached rest is `input_tokens`, the cached part `cache_read_input_tokens` (a cached
    /// count above the prompt's is taken as the whole prompt).
    pub fn from_prompt_inclusive(prompt: u64, cached: u64, output: u64) -> Usage {
        let cached = cached.min(prompt);
        Usage {
            input_tokens: prompt - cached,
            cache_read_input_tokens: cached,
            output_tokens: output,
            ..Usage::default()
        }
    }

    /// All input (uncached, cache writes and cache reads): what the daemon counts as input.
    /// Saturating: an agent's numbers are never trusted to stay in range.
    pub fn input(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.cache_read_input_tokens)
            .saturating_add(self.cache_creation_input_tokens)
    }

    /// Field by field, the larger (the usage of one API message as its lines repeat it).
    pub fn max(self, o: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.max(o.input_tokens),
            cache_creation_input_tokens: self
                .cache_creation_input_tokens
                .max(o.cache_creation_input_tokens),
            cache_read_input_tokens: self.cache_read_input_tokens.max(o.cache_read_input_tokens),
            output_tokens: self.output_tokens.max(o.output_tokens),
        }
    }

    /// Field by field, the sum (saturating).
    pub fn add(&mut self, o: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(o.input_tokens);
        self.cache_creation_input_tokens = self
            .cache_creation_input_tokens
            .saturating_add(o.cache_creation_input_tokens);
        self.cache_read_input_tokens = self
            .cache_read_input_tokens
            .saturating_add(o.cache_read_input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(o.output_tokens);
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A token count as an agent printed it: a non-negative integer, a positive float (cut), and
/// anything else 0 — a malformed count must not make a line unreadable.
fn count<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Number(n) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|f| *f > 0.0).map(|f| f as u64))
            .unwrap_or(0),
        _ => 0,
    })
}

// ---------------------------------------------------------------------------------------------
// Control requests and responses

/// An agent asks its controller (the daemon) something and waits for the answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlRequest<'a> {
    pub request_id: Cow<'a, str>,
    pub request: Request<'a>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request<'a> {
    /// `can_use_tool` (a permission prompt), `client_tool` (paddock's: a tool the client
    /// runs), `hook_callback`, …
    pub subtype: Cow<'a, str>,
    /// Empty when the request has none.
    #[serde(default, deserialize_with = "lenient_str")]
    pub tool_name: Cow<'a, str>,
    /// `Null` when the request has none.
    #[serde(default)]
    pub input: Value,
    /// Written (Claude Code's requests carry it); the reader has no use for it.
    #[serde(skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<Cow<'a, str>>,
}

/// A string field that is absent or not a string reads as empty.
fn lenient_str<'de, 'a, D: Deserializer<'de>>(d: D) -> Result<Cow<'a, str>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => Cow::Owned(s),
        _ => Cow::Borrowed(""),
    })
}

/// The controller's answer to a [`ControlRequest`].
#[derive(Debug, Serialize)]
pub struct ControlResponse<'a> {
    pub response: Response<'a>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "subtype", rename_all = "snake_case")]
pub enum Response<'a> {
    Success {
        request_id: &'a str,
        response: Payload<'a>,
    },
    /// The controller cannot handle the request (so the agent does not wait forever).
    Error { request_id: &'a str, error: &'a str },
}

/// What a successful response carries.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Payload<'a> {
    Answer(Answer<'a>),
    /// The answer to an `mcp_message` request: the JSON-RPC message of paddock's MCP server.
    Mcp {
        mcp_response: Value,
    },
}

/// A successful response's decision: allowed (with the input to use), denied (with why), or a
/// client tool's result.
#[derive(Debug, Serialize)]
pub struct Answer<'a> {
    pub behavior: Behavior,
    #[serde(rename = "updatedInput", skip_serializing_if = "Option::is_none")]
    pub updated_input: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<&'a str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Behavior {
    Allow,
    Deny,
}

impl<'a> ControlResponse<'a> {
    /// Allows a request; pass the request's own `input` to run the tool unchanged.
    pub fn allow(request_id: &'a str, input: &'a Value) -> Line<'a> {
        Self::success(
            request_id,
            Answer {
                behavior: Behavior::Allow,
                updated_input: Some(input),
                result: None,
                is_error: None,
                message: None,
            },
        )
    }

    /// Denies a request, telling the model why.
    pub fn deny(request_id: &'a str, message: &'a str) -> Line<'a> {
        Self::success(
            request_id,
            Answer {
                behavior: Behavior::Deny,
                updated_input: None,
                result: None,
                is_error: None,
                message: Some(message),
            },
        )
    }

    pub fn success(request_id: &'a str, response: Answer<'a>) -> Line<'a> {
        Line::ControlResponse(ControlResponse {
            response: Response::Success {
                request_id,
                response: Payload::Answer(response),
            },
        })
    }

    /// Answers an `mcp_message` request with a JSON-RPC message.
    pub fn mcp(request_id: &'a str, mcp_response: Value) -> Line<'a> {
        Line::ControlResponse(ControlResponse {
            response: Response::Success {
                request_id,
                response: Payload::Mcp { mcp_response },
            },
        })
    }

    pub fn error(request_id: &'a str, error: &'a str) -> Line<'a> {
        Line::ControlResponse(ControlResponse {
            response: Response::Error { request_id, error },
        })
    }
}

/// The id of paddock's `initialize` request: the agent's answer to it (any `control_response`
/// with this id) says it is ready for messages.
pub const READY_REQUEST_ID: &str = "paddock-ready";

/// A `system` / `paddock_status` line (without its newline): a note about the agent that
/// the session records as STATUS (a bridge's warning, the ssh relay's notes).
pub fn status_line(content: &str) -> String {
    encode_sorted(&Line::System(System::PaddockStatus { content }))
}

/// A `system` / `paddock_connection` line (without its newline): the connection to the
/// agent's machine dropped (`connected: false`) or is back; the session is marked so.
pub fn connection_line(connected: bool, content: &str) -> String {
    encode_sorted(&Line::System(System::PaddockConnection {
        connected,
        content,
    }))
}

/// `{"type":"control_request","request_id":"paddock-ready","request":{"subtype":"initialize"}}`:
/// the first line the daemon writes to a started agent of paddock's own (the scripted agent,
/// every bridge), as Claude's Agent SDK opens its control channel: each answers once it can
/// take a message.
pub const READY_REQUEST: &str =
    r#"{"type":"control_request","request_id":"paddock-ready","request":{"subtype":"initialize"}}"#;

/// `{"type":"control_request","request_id":"paddock-ready","request":{"subtype":"mcp_status"}}`:
/// the first line the daemon writes to Claude Code. Any answer says its control channel reads
/// its input. Claude Code answers `initialize` too, but builds its whole command, skill and
/// model list for it first — ≈ 10 ms of its CPU on every start, measured on 2.1.330 (a
/// 0.40 s turn against the fake model server: 0.410 s after `initialize`, 0.400 s after
/// `mcp_status`, 0.396 s with no request at all; medians of 25 interleaved runs each) —
/// and paddock reads none of it. `mcp_status` answers at the same moment (≈ 0.28 s after
/// the start) with only the MCP servers' states.
pub const STATUS_REQUEST: &str =
    r#"{"type":"control_request","request_id":"paddock-ready","request":{"subtype":"mcp_status"}}"#;

/// What an agent answers to [`READY_REQUEST`] (`request_id` is the request's own).
pub fn ready_response(request_id: &str) -> String {
    serde_json::json!({
        "type": "control_response",
        "response": {"subtype": "success", "request_id": request_id, "response": {}},
    })
    .to_string()
}

// ---------------------------------------------------------------------------------------------
// What the daemon reads

/// A `result` line as the daemon's reader takes it: every field may be missing, and a
/// malformed one reads as missing (a turn's end must never be lost to an odd field).
#[derive(Debug, Default, Deserialize)]
pub struct ReadResult {
    #[serde(default, deserialize_with = "or_default")]
    pub subtype: Option<String>,
    #[serde(default, deserialize_with = "or_default")]
    pub is_error: Option<bool>,
    #[serde(default, deserialize_with = "or_default")]
    pub result: Option<String>,
    #[serde(default, deserialize_with = "or_default")]
    pub session_id: Option<String>,
    /// Only an object: the turn's totals.
    #[serde(default, deserialize_with = "usage_object")]
    pub usage: Option<Usage>,
    /// Any value but `null`: the model API's status.
    #[serde(default)]
    pub api_error_status: Option<Value>,
    #[serde(default, deserialize_with = "or_default")]
    pub api_error_type: Option<String>,
    #[serde(default, deserialize_with = "or_default")]
    pub errors: Option<Vec<Value>>,
    #[serde(default, deserialize_with = "or_default")]
    pub num_turns: Option<u64>,
    /// The agent behind a bridge.
    #[serde(default, deserialize_with = "or_default")]
    pub paddock_agent: Option<String>,
}

/// A `usage` field: an object's counts (each malformed one 0); anything else none.
fn usage_object<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Usage>, D::Error> {
    Ok(match Value::deserialize(d)? {
        v @ Value::Object(_) => Some(Usage::deserialize(v).unwrap_or_default()),
        _ => None,
    })
}

// ---------------------------------------------------------------------------------------------
// What an agent reads

/// One stdin line of an agent, read.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentInput {
    /// A user message: its text (text blocks joined by newlines).
    User(String),
    /// The controller answered the request `request_id`.
    Answer {
        request_id: String,
        answer: ReadAnswer,
    },
    /// The controller's own request `request_id` (`initialize`: answer once ready for
    /// messages).
    Control { request_id: String, subtype: String },
    /// A JSON line of another kind (or of a shape not understood): nothing to do.
    Other,
    /// Not JSON.
    NotJson,
}

/// A field of an answer that is malformed reads as absent: an agent that asked must get an
/// answer (a wrong one is a refusal), never wait on for one it could not read.
fn or_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(
    d: D,
) -> Result<T, D::Error> {
    Ok(T::deserialize(Value::deserialize(d)?).unwrap_or_default())
}

/// A control response as an agent reads it; what it means is the agent's to decide.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct ReadAnswer {
    /// `success` or `error`.
    #[serde(default, deserialize_with = "or_default")]
    pub subtype: String,
    /// An `error` response's text.
    #[serde(default, deserialize_with = "or_default")]
    pub error: Option<String>,
    #[serde(default, deserialize_with = "or_default")]
    pub response: Decision,
}

/// The `response` of a successful control response.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct Decision {
    /// `allow`, `deny` (kept as text: anything but `allow` is not an allowance).
    #[serde(default, deserialize_with = "or_default")]
    pub behavior: Option<String>,
    #[serde(default, rename = "updatedInput", deserialize_with = "or_default")]
    pub updated_input: Option<Value>,
    #[serde(default, deserialize_with = "or_default")]
    pub message: Option<String>,
    #[serde(default, deserialize_with = "or_default")]
    pub result: Option<String>,
    #[serde(default, deserialize_with = "or_default")]
    pub is_error: Option<bool>,
}

impl ReadAnswer {
    pub fn is_success(&self) -> bool {
        self.subtype == "success"
    }

    pub fn allowed(&self) -> bool {
        self.response.behavior.as_deref() == Some("allow")
    }
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InLine {
    User {
        message: InUserMessage,
    },
    ControlResponse {
        response: InResponse,
    },
    ControlRequest {
        request_id: String,
        request: InRequest,
    },
}

#[derive(Deserialize)]
struct InRequest {
    #[serde(default, deserialize_with = "or_default")]
    subtype: String,
}

#[derive(Deserialize)]
struct InUserMessage {
    content: InContent,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum InContent {
    Text(String),
    Blocks(Vec<InBlock>),
}

/// A user message's block: only text blocks carry the message (tool results and images do
/// not); anything else is skipped, whatever its shape.
#[derive(Deserialize)]
#[serde(untagged)]
enum InBlock {
    Text(InTextBlock),
    Other(IgnoredAny),
}

#[derive(Deserialize)]
struct InTextBlock {
    #[serde(rename = "type")]
    _kind: TextTag,
    text: String,
}

#[derive(Deserialize)]
enum TextTag {
    #[serde(rename = "text")]
    Text,
}

#[derive(Deserialize)]
struct InResponse {
    request_id: String,
    #[serde(flatten)]
    answer: ReadAnswer,
}

impl AgentInput {
    /// Reads one stdin line of an agent.
    pub fn read(line: &str) -> AgentInput {
        let line = line.trim();
        match serde_json::from_str::<InLine>(line) {
            Ok(InLine::User { message }) => match message.content {
                InContent::Text(s) => AgentInput::User(s),
                InContent::Blocks(blocks) => {
                    let texts: Vec<String> = blocks
                        .into_iter()
                        .filter_map(|b| match b {
                            InBlock::Text(t) => Some(t.text),
                            InBlock::Other(_) => None,
                        })
                        .collect();
                    if texts.is_empty() {
                        AgentInput::Other
                    } else {
                        AgentInput::User(texts.join("\n"))
                    }
                }
            },
            Ok(InLine::ControlResponse { response }) => AgentInput::Answer {
                request_id: response.request_id,
                answer: response.answer,
            },
            Ok(InLine::ControlRequest {
                request_id,
                request,
            }) => AgentInput::Control {
                request_id,
                subtype: request.subtype,
            },
            Err(_) if serde_json::from_str::<IgnoredAny>(line).is_ok() => AgentInput::Other,
            Err(_) => AgentInput::NotJson,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nested_tags_and_flattened_context() {
        let l = encode(&Line::System(System::Init(Init {
            session_id: "s",
            ..Init::default()
        })));
        assert_eq!(l, r#"{"type":"system","subtype":"init","session_id":"s"}"#);
        let u = User {
            context: Some(Context {
                parent_tool_use_id: None,
                session_id: "s",
            }),
            ..User::tool_result("t1", "ok", false)
        };
        assert_eq!(
            encode(&Line::User(u)),
            r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok","is_error":false}]},"parent_tool_use_id":null,"session_id":"s"}"#
        );
    }

    #[test]
    fn the_ready_requests_are_control_requests_under_one_id() {
        for (line, want) in [
            (READY_REQUEST, "initialize"),
            (STATUS_REQUEST, "mcp_status"),
        ] {
            assert_eq!(
                AgentInput::read(line),
                AgentInput::Control {
                    request_id: READY_REQUEST_ID.into(),
                    subtype: want.into()
                }
            );
        }
    }

    #[test]
    fn agents_read_what_the_daemon_writes() {
        assert_eq!(
            AgentInput::read(&encode(&Line::User(User::text("hi\nthere")))),
            AgentInput::User("hi\nthere".into())
        );
        let input = json!({"path": "."});
        match AgentInput::read(&encode(&ControlResponse::allow("r1", &input))) {
            AgentInput::Answer { request_id, answer } => {
                assert_eq!(request_id, "r1");
                assert!(answer.is_success() && answer.allowed());
                assert_eq!(answer.response.updated_input, Some(input));
            }
            other => panic!("{other:?}"),
        }
        match AgentInput::read(&encode(&ControlResponse::error("r2", "no"))) {
            AgentInput::Answer { answer, .. } => {
                assert!(!answer.is_success());
                assert_eq!(answer.error.as_deref(), Some("no"));
            }
            other => panic!("{other:?}"),
        }
        // A malformed answer is still an answer (not an allowance).
        match AgentInput::read(
            r#"{"type":"control_response","response":{"subtype":"success","request_id":"r3","response":{"behavior":7,"is_error":"yes"}}}"#,
        ) {
            AgentInput::Answer { request_id, answer } => {
                assert_eq!(request_id, "r3");
                assert!(answer.is_success() && !answer.allowed());
                assert_eq!(answer.response.is_error, None);
            }
            other => panic!("{other:?}"),
        }
        // Odd blocks are skipped, not fatal.
        assert_eq!(
            AgentInput::read(
                r#"{"type":"user","message":{"content":[1,{"type":"image"},{"type":"text","text":"a"}]}}"#
            ),
            AgentInput::User("a".into())
        );
        assert_eq!(
            AgentInput::read(r#"{"type":"keep_alive"}"#),
            AgentInput::Other
        );
        assert_eq!(AgentInput::read("{nope"), AgentInput::NotJson);
    }

    #[test]
    fn malformed_counts_read_as_zero() {
        let u: Usage = serde_json::from_str(
            r#"{"input_tokens":"x","output_tokens":2.7,"cache_read_input_tokens":-1,"other":1}"#,
        )
        .unwrap();
        assert_eq!(u, Usage::plain(0, 2));
        let big = Usage::plain(u64::MAX, 0);
        let mut sum = big;
        sum.add(big);
        assert_eq!(sum.input(), u64::MAX);
    }
}
