//! The openai-api provider: paddock's own agent loop against an OpenAI-compatible chat
//! completions endpoint, with built-in tools confined to the working directory.
//!
//! Here the bridge process *is* the agent. Each user message is one turn:
//!
//! 1. the message joins the conversation (saved, see [`store`]);
//! 2. `POST {base_url}/chat/completions` with the conversation, `stream: true`,
//!    `stream_options.include_usage`, and the four [`tools`] (`shell`, `read_file`,
//!    `write_file`, `list_dir`); the streamed answer is folded into one [`sse::Completion`];
//! 3. if the model asked for tools: each is put to the daemon as a permission prompt
//!    ([`In::ask`](super::In::ask), answered by the session's policy), run in the campaign
//!    root (or refused), and its result goes back to the model as a `tool` message; then 2
//!    again, at most `max_tool_rounds` times;
//! 4. an answer without tool calls ends the turn.
//!
//! # What the daemon sees
//!
//! | agent loop | bridge prints ([`super::wire`]) | activity |
//! |---|---|---|
//! | first turn of a run | `system/init` with the conversation id | (`SessionRef`: a restart passes it back as `--resume`) |
//! | one model call's answer | one `assistant` line: a `thinking` block (the reasoning, if the endpoint streams any), a `text` block (if any), one `tool_use` per tool call, and the call's `usage` | `THINKING`, `STATUS`, `TOOL_CALL`s; the tokens on the first of them |
//! | a call that answered nothing (no text, no tools) | an `assistant` line with only `usage` | (tokens, attached to the next activity) |
//! | a tool ran, was refused by the policy, or its input was bad | `user` / `tool_result` (`is_error` unless it succeeded) | `TOOL_RESULT` |
//! | a 429 / 5xx / unreachable endpoint, retried | `system/api_retry` | `STATUS` (`API error 500 (…); retry 1 of 2 in 500 ms`) |
//! | a stream payload that is not JSON | the payload verbatim, on one line | stored raw, counted |
//! | the final answer | `result` with the text and the turn's total usage | `COMPLETION` |
//! | an HTTP error status (after retries) | `result`, `is_error`, `api_error_status`, the API's message | `ERROR` (`openai-api: API error status 400: …`); the session stays usable |
//! | no answer at all (transport), or `max_tool_rounds` reached | `result`, `is_error` | `ERROR` |
//!
//! Tokens are the API's own counts: `prompt_tokens` (of which `cached_tokens` are reported as
//! cache reads) and `completion_tokens` of each call, on that call's `assistant` line, so a
//! budget is checked as the turn goes; the `result` repeats the turn's sums (which the reader
//! then does not count twice).
//!
//! # Configuration (`provider_config`, all strings)
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `base_url` | `$OPENAI_BASE_URL`, else `https://api.openai.com/v1` | the endpoint, up to `/chat/completions` |
//! | `api_key` | `$OPENAI_API_KEY` (preferred: a config value shows in the process list) | sent as `Authorization: Bearer`; none, no header |
//! | `permissions` | on the host `ask:read_file,list_dir`, in a sandbox `allow-all` (the daemon's default) | the daemon's policy for every tool call (`deny`, `allow:shell,read_file`, `ask`, `ask:read_file`) |
//! | `max_tool_rounds` | 25 | model calls with tool use per turn, before the turn ends in an ERROR |
//! | `max_retries` | 2 | retries of a 429 / 5xx / failed connection, per call (at most 10; a timeout is not retried) |
//! | `retry_backoff_ms` | 500 | the first retry's delay, doubled for each next one (at most 60 s) |
//! | `request_timeout_secs` | 300 | one whole call, streaming included |
//! | `shell_timeout_secs` | 120 | one shell command |
//! | `max_tool_output_bytes` | 16384 | a tool's result for the model (the activity shows 8 KiB of it) |
//! | `max_conversation_bytes` | 2 MiB | the conversation sent and saved; the oldest exchanges go first |
//! | `max_response_bytes` | 8 MiB | one call's streamed answer |
//! | `system_prompt` | a short one naming the root and the tools | the system message |
//! | `client_tools` | none | tools a client runs, as a JSON list of `{name, description, schema_json}` (at most 64): offered to the model; a call becomes a `client_tool` request the daemon has the client answer |
//! | `state_dir` | see [`store`] | where conversations are saved |

pub mod api;
pub mod sse;
pub mod store;
pub mod tools;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use super::{Bridge, Decision, Error, Out, TurnEnd, Usage};
use crate::stream_json::{ApiRetry, Line, System};
use api::{Api, CallError, Garbage};
use sse::{Completion, ToolCall};
use tools::{Outcome, Tools};

/// Retries are "bounded and small": at most this many per call, each waiting at most
/// [`RETRY_DELAY_MAX`].
const RETRIES_MAX: u32 = 10;
const RETRY_DELAY_MAX: Duration = Duration::from_secs(60);

/// Everything the loop needs from `provider_config` and the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    pub model: String,
    pub base_url: String,
    pub api_key: Option<String>,
    pub max_tool_rounds: u32,
    pub max_retries: u32,
    pub retry_backoff: Duration,
    pub request_timeout: Duration,
    pub shell_timeout: Duration,
    pub tool_output_max: usize,
    pub conversation_max: usize,
    pub response_max: u64,
    pub system_prompt: Option<String>,
    pub state_dir: PathBuf,
    /// Tools the client runs (parsed with the session's `provider_config`): offered to the
    /// model next to paddock's own; a call is put to the daemon, which has the client run it.
    pub client_tools: Vec<ClientTool>,
}

pub use crate::mcp::ClientTool;

impl Settings {
    pub fn from_bridge(b: &Bridge) -> Result<Settings, Error> {
        Settings::new(&b.model, &b.config, &b.cwd)
    }

    /// From the session's model and `provider_config`; the environment fills in `base_url` and
    /// the key.
    pub fn new(
        model: &str,
        config: &paddock_core::ProviderConfig,
        cwd: &Path,
    ) -> Result<Settings, Error> {
        if model.trim().is_empty() {
            return Err(Error::NoModel);
        }
        let get = |k: &str| config.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let base_url = get("base_url")
            .map(String::from)
            .or_else(|| env("OPENAI_BASE_URL"))
            .unwrap_or_else(|| "https://api.openai.com/v1".into());
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(Error::BaseUrl(base_url));
        }
        let number = |key: &str, default: u64, min: u64| -> Result<u64, Error> {
            let n = match get(key) {
                None => default,
                Some(s) => s.parse().map_err(|_| Error::NotANumber {
                    key: key.into(),
                    value: s.into(),
                })?,
            };
            if n < min {
                return Err(Error::TooSmall {
                    key: key.into(),
                    min,
                });
            }
            Ok(n)
        };
        let too_large = |key: &str| Error::TooLarge { key: key.into() };
        let small = |key: &str, default: u64| -> Result<u32, Error> {
            u32::try_from(number(key, default, 0)?).map_err(|_| too_large(key))
        };
        let size = |key: &str, default: u64| -> Result<usize, Error> {
            usize::try_from(number(key, default, 1024)?).map_err(|_| too_large(key))
        };
        Ok(Settings {
            model: model.to_string(),
            base_url,
            api_key: get("api_key")
                .map(String::from)
                .or_else(|| env("OPENAI_API_KEY")),
            max_tool_rounds: small("max_tool_rounds", 25)?,
            max_retries: match small("max_retries", 2)? {
                n if n > RETRIES_MAX => return Err(Error::TooManyRetries { max: RETRIES_MAX }),
                n => n,
            },
            retry_backoff: Duration::from_millis(number("retry_backoff_ms", 500, 0)?),
            request_timeout: Duration::from_secs(number("request_timeout_secs", 300, 1)?),
            shell_timeout: Duration::from_secs(number("shell_timeout_secs", 120, 1)?),
            tool_output_max: size("max_tool_output_bytes", 16 * 1024)?,
            conversation_max: size("max_conversation_bytes", 2 << 20)?,
            response_max: number("max_response_bytes", 8 << 20, 1024)?,
            system_prompt: get("system_prompt").map(String::from),
            state_dir: store::state_dir(get("state_dir"), cwd),
            client_tools: config.agent().client_tools.clone(),
        })
    }
}

/// The file an openai-api session's conversation is saved in, if it has one: where its bridge
/// keeps it (its `state_dir`, or the state dir of its environment over the daemon's).
pub fn conversation_file(
    config: &paddock_core::SessionConfig,
    conversation: Option<&str>,
) -> Option<PathBuf> {
    let id = conversation.filter(|id| store::valid_id(id))?;
    if config.provider != paddock_core::Provider::OpenAiApi {
        return None;
    }
    let configured = config
        .provider_config
        .get("state_dir")
        .map(|v| v.trim())
        .filter(|v| !v.is_empty());
    let dir = store::state_dir_in(configured, Path::new(&config.working_dir), |k| {
        config
            .environment
            .get(k)
            .map(std::ffi::OsString::from)
            .or_else(|| std::env::var_os(k))
    });
    Some(store::path(&dir, id))
}

/// Checks a session's `provider_config` at CreateSession, so that a bad value is refused
/// there (OBEY-2004) rather than crashing the bridge at its start.
pub fn check_config(config: &paddock_core::ProviderConfig) -> Result<(), Error> {
    Settings::new("-", config, Path::new(".")).map(|_| ())
}

/// A chat completions endpoint: the real one ([`Api`]) or, in tests, a script.
pub trait Model {
    fn complete(&self, body: &Value) -> Result<(Completion, Garbage), CallError>;
}

impl Model for Api {
    fn complete(&self, body: &Value) -> Result<(Completion, Garbage), CallError> {
        Api::complete(self, body)
    }
}

/// Runs the bridge: one turn per user message until stdin closes.
pub fn run(bridge: &Bridge) -> Result<(), Error> {
    let s = Settings::from_bridge(bridge)?;
    let tools = Tools::new(&bridge.cwd, s.shell_timeout, s.tool_output_max).map_err(|source| {
        Error::WorkingDir {
            path: bridge.cwd.clone(),
            source,
        }
    })?;
    let api = Api::new(
        &s.base_url,
        s.api_key.clone(),
        s.request_timeout,
        s.response_max,
    );
    // A resumed conversation must exist: going on without it would answer as if nothing had
    // been said (Claude Code fails the same way: "No conversation found").
    let (id, messages) = match &bridge.resume {
        Some(id) => (id.clone(), store::load(&s.state_dir, id)?),
        None => (ulid::Ulid::new().to_string(), Vec::new()),
    };
    let ask = |tool: &str, input: &Value| bridge.input.ask(tool, input);
    let on_client = |tool: &str, input: &Value| bridge.input.run_on_client(tool, input);
    let mut agent = Agent {
        settings: s,
        out: &bridge.out,
        model: &api,
        ask: &ask,
        on_client: &on_client,
        tools,
        id,
        messages,
        announced: false,
    };
    while let Some(text) = bridge.input.next_user() {
        let end = agent.turn(&text);
        bridge.out.result(&end);
    }
    Ok(())
}

/// The agent loop of one bridge process.
pub struct Agent<'a> {
    settings: Settings,
    out: &'a Out,
    model: &'a dyn Model,
    /// Asks the daemon whether a tool may run.
    ask: &'a dyn Fn(&str, &Value) -> Decision,
    /// Has the client run one of its tools: (result, is_error).
    on_client: &'a dyn Fn(&str, &Value) -> (String, bool),
    tools: Tools,
    /// The conversation's id (a ULID), announced with `system/init`.
    id: String,
    /// The conversation without the system prompt.
    messages: Vec<Value>,
    announced: bool,
}

impl Agent<'_> {
    /// One turn: the user's `text` to the final answer, or to an error. Never panics.
    pub fn turn(&mut self, text: &str) -> TurnEnd {
        self.messages.push(json!({"role": "user", "content": text}));
        self.save();
        // Announced once saved: the daemon never holds an id that `--resume` cannot load.
        if !self.announced {
            self.out.init(&self.id);
            self.announced = true;
        }
        let mut total = Usage::default();
        let mut rounds = 0;
        let end = loop {
            let c = match self.call() {
                Ok(c) => c,
                Err(e) => break self.failed(e, total),
            };
            if let Some(u) = c.usage {
                total.add(u);
            }
            self.emit(&c);
            self.messages.push(assistant_message(&c));
            if c.tool_calls.is_empty() {
                break TurnEnd {
                    text: c.text,
                    usage: total,
                    session_id: Some(self.id.clone()),
                    ..TurnEnd::default()
                };
            }
            if rounds == self.settings.max_tool_rounds {
                // The model still wants tools: each call gets an answer (the conversation
                // stays valid for the next turn), none runs.
                let why = format!(
                    "not run: the turn reached its limit of {rounds} tool rounds (max_tool_rounds)"
                );
                for tc in &c.tool_calls {
                    self.answer(tc, &Outcome::error(why.clone()));
                }
                break TurnEnd {
                    is_error: true,
                    text: format!("reached the limit of {rounds} tool rounds (max_tool_rounds)"),
                    usage: total,
                    session_id: Some(self.id.clone()),
                    api_error_status: None,
                };
            }
            rounds += 1;
            for tc in &c.tool_calls {
                let o = self.use_tool(tc);
                self.answer(tc, &o);
            }
            self.save();
        };
        self.save();
        end
    }

    /// One model call, retried while the failure is worth it and tries are left.
    fn call(&mut self) -> Result<Completion, CallError> {
        store::trim(&mut self.messages, self.settings.conversation_max);
        let body = self.request_body();
        let mut attempt = 0;
        loop {
            match self.model.complete(&body) {
                Ok((c, garbage)) => {
                    for g in garbage {
                        self.out.raw(&g.replace(['\n', '\r'], " "));
                    }
                    return Ok(c);
                }
                Err(e) if e.retryable() && attempt < self.settings.max_retries => {
                    attempt += 1;
                    let delay = self
                        .settings
                        .retry_backoff
                        .checked_mul(2u32.saturating_pow(attempt - 1))
                        .unwrap_or(RETRY_DELAY_MAX)
                        .min(RETRY_DELAY_MAX);
                    let retry = retry_line(&e, attempt, self.settings.max_retries, delay);
                    self.out.line(&Line::System(System::ApiRetry(retry)));
                    std::thread::sleep(delay);
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn request_body(&self) -> Value {
        let system = self.settings.system_prompt.clone().unwrap_or_else(|| {
            format!(
                "You are a coding agent working in the directory {}. Use the tools to look at \
                 and change files there (paths relative to it) and to run commands in it. \
                 When you are done, answer briefly.",
                self.tools.root().display()
            )
        });
        let mut messages = vec![json!({"role": "system", "content": system})];
        messages.extend(self.messages.iter().cloned());
        json!({
            "model": self.settings.model,
            "messages": messages,
            "stream": true,
            "stream_options": {"include_usage": true},
            "tools": self.tool_definitions(),
        })
    }

    /// paddock's own tools, then the client's.
    fn tool_definitions(&self) -> Value {
        let mut defs = tools::definitions();
        if let Value::Array(list) = &mut defs {
            for t in &self.settings.client_tools {
                list.push(json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters,
                }}));
            }
        }
        defs
    }

    /// One `assistant` line for one model call: what it said and asked, and its usage.
    fn emit(&self, c: &Completion) {
        // The blocks borrow the inputs, so those are parsed first.
        let inputs: Vec<Value> = c
            .tool_calls
            .iter()
            .map(|tc| {
                parse_arguments(&tc.arguments)
                    .unwrap_or_else(|_| Value::String(tc.arguments.clone()))
            })
            .collect();
        let mut blocks = Vec::new();
        if !c.reasoning.trim().is_empty() {
            blocks.push(super::wire::thinking_block(&c.reasoning));
        }
        if !c.text.trim().is_empty() {
            blocks.push(super::wire::text_block(&c.text));
        }
        for (tc, input) in c.tool_calls.iter().zip(&inputs) {
            blocks.push(super::wire::tool_use_block(&tc.id, &tc.name, input));
        }
        match (blocks.is_empty(), c.usage) {
            (false, u) => self.out.assistant(blocks, u),
            (true, Some(u)) => self.out.usage(u),
            (true, None) => {}
        }
    }

    /// Asks, then runs, one tool call.
    fn use_tool(&self, tc: &ToolCall) -> Outcome {
        if self.settings.client_tools.iter().any(|t| t.name == tc.name) {
            let input = match parse_arguments(&tc.arguments) {
                Ok(v) => v,
                Err(e) => {
                    return Outcome::error(format!("the arguments are not a JSON object: {e}"))
                }
            };
            let (text, is_error) = (self.on_client)(&tc.name, &input);
            let text =
                paddock_sys::text::truncate(&text, self.settings.tool_output_max).into_owned();
            return if is_error {
                Outcome::error(text)
            } else {
                Outcome {
                    text,
                    is_error: false,
                }
            };
        }
        if !paddock_core::OWN_TOOLS.contains(&tc.name.as_str()) {
            return self.tools.run(&tc.name, &Value::Null);
        }
        let input = match parse_arguments(&tc.arguments) {
            Ok(v) => v,
            Err(e) => return Outcome::error(format!("the arguments are not a JSON object: {e}")),
        };
        match (self.ask)(&tc.name, &input) {
            // The daemon may hand back an edited input (a human reviewer, later).
            Decision::Allow(edited) if edited.is_object() => self.tools.run(&tc.name, &edited),
            Decision::Allow(_) => self.tools.run(&tc.name, &input),
            Decision::Deny(why) => Outcome::error(why),
            // Only a client tool's request is answered with a result.
            Decision::Result { .. } => {
                Outcome::error("paddock answered a permission prompt with a tool result")
            }
        }
    }

    /// A tool's outcome: to the daemon as a `TOOL_RESULT`, to the model as a `tool` message.
    fn answer(&mut self, tc: &ToolCall, o: &Outcome) {
        self.out.tool_result(&tc.id, &o.text, o.is_error);
        self.messages
            .push(json!({"role": "tool", "tool_call_id": tc.id, "content": o.text}));
    }

    fn failed(&self, e: CallError, usage: Usage) -> TurnEnd {
        let (text, status) = match e {
            CallError::Status { status, message } => (message, Some(status)),
            CallError::Transport(m) | CallError::TimedOut(m) => (m, None),
        };
        TurnEnd {
            is_error: true,
            text,
            usage,
            session_id: Some(self.id.clone()),
            api_error_status: status,
        }
    }

    /// Saves the conversation; a failure is reported on stderr (the daemon keeps it) and does
    /// not stop the turn: only a later `--resume` would miss it.
    fn save(&self) {
        if let Err(e) = store::save(&self.settings.state_dir, &self.id, &self.messages) {
            eprintln!("paddock bridge (openai-api): {e}");
        }
    }
}

/// A tool call's arguments: a JSON object ("" counts as `{}`).
fn parse_arguments(a: &str) -> Result<Value, Error> {
    if a.trim().is_empty() {
        return Ok(json!({}));
    }
    match serde_json::from_str::<Value>(a) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err(Error::ArgumentsNotObject),
        Err(e) => Err(Error::Arguments(e)),
    }
}

/// The model's answer as a message of the conversation (its reasoning is not sent back:
/// endpoints that stream it do not want it in the request).
fn assistant_message(c: &Completion) -> Value {
    let mut m = json!({"role": "assistant", "content": c.text});
    if !c.tool_calls.is_empty() {
        if c.text.is_empty() {
            m["content"] = Value::Null;
        }
        m["tool_calls"] = c
            .tool_calls
            .iter()
            .map(|tc| {
                json!({"id": tc.id, "type": "function",
                       "function": {"name": tc.name, "arguments": tc.arguments}})
            })
            .collect();
    }
    m
}

/// The `system/api_retry` line the daemon's reader shows as a `STATUS`.
fn retry_line(e: &CallError, attempt: u32, max: u32, delay: Duration) -> ApiRetry<'_> {
    let (error_status, error) = match e {
        CallError::Status { status, message } => (Value::from(*status), message.as_str()),
        CallError::Transport(m) | CallError::TimedOut(m) => {
            (Value::from("unreachable"), m.as_str())
        }
    };
    ApiRetry {
        error_status,
        error,
        attempt,
        max_retries: max,
        retry_delay_ms: delay.as_millis() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::wire::Buf;
    use crate::claude_stream::{self, ClaudeStreamParser};
    use paddock_core::ProviderEvent;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    /// A scripted endpoint that records what it was sent.
    struct Script {
        answers: Mutex<Vec<Result<Completion, CallError>>>,
        sent: Mutex<Vec<Value>>,
    }

    impl Model for Script {
        fn complete(&self, body: &Value) -> Result<(Completion, Garbage), CallError> {
            self.sent.lock().unwrap().push(body.clone());
            let mut a = self.answers.lock().unwrap();
            assert!(!a.is_empty(), "script used up");
            a.remove(0)
                .map(|c| (c, vec!["not json\nat all".to_string()]))
        }
    }

    fn call(id: &str, name: &str, args: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: args.into(),
        }
    }

    fn answer(text: &str, calls: Vec<ToolCall>, input: u64, output: u64) -> Completion {
        Completion {
            text: text.into(),
            tool_calls: calls,
            usage: Some(Usage {
                input_tokens: input,
                cache_read_input_tokens: 0,
                output_tokens: output,
                ..Usage::default()
            }),
            ..Completion::default()
        }
    }

    struct Run {
        lines: Vec<String>,
        activities: Vec<String>,
        sent: Vec<Value>,
        ends: Vec<TurnEnd>,
    }

    /// Runs `turns` against `answers` with a policy that allows all but `denied`, and reads the
    /// printed lines back through the daemon's own parser.
    fn run_turns(
        root: &std::path::Path,
        answers: Vec<Result<Completion, CallError>>,
        turns: &[&str],
        settings: impl FnOnce(&mut Settings),
        denied: &str,
    ) -> Run {
        let buf = Buf::default();
        let out = Out::to_writer("openai-api", Box::new(buf.clone()));
        let script = Script {
            answers: Mutex::new(answers),
            sent: Mutex::default(),
        };
        let ask = |tool: &str, input: &Value| {
            if tool == denied {
                Decision::Deny(format!(
                    "paddock: the session's permission policy denies {tool}"
                ))
            } else {
                Decision::Allow(input.clone())
            }
        };
        let mut s = Settings {
            model: "m".into(),
            base_url: String::new(),
            api_key: None,
            max_tool_rounds: 5,
            max_retries: 0,
            retry_backoff: Duration::from_millis(1),
            request_timeout: Duration::from_secs(1),
            shell_timeout: Duration::from_secs(5),
            tool_output_max: 4096,
            conversation_max: 1 << 20,
            response_max: 1 << 20,
            system_prompt: Some("sys".into()),
            state_dir: root.join("../state"),
            client_tools: Vec::new(),
        };
        settings(&mut s);
        let on_client =
            |tool: &str, input: &Value| (format!("client ran {tool} with {input}"), false);
        let mut agent = Agent {
            tools: Tools::new(root, s.shell_timeout, s.tool_output_max).unwrap(),
            settings: s,
            out: &out,
            model: &script,
            ask: &ask,
            on_client: &on_client,
            id: "01TEST".into(),
            messages: Vec::new(),
            announced: false,
        };
        let mut ends = Vec::new();
        for t in turns {
            let end = agent.turn(t);
            out.result(&end);
            ends.push(end);
        }
        let text = buf.text();
        let mut p = ClaudeStreamParser::new();
        let mut activities = Vec::new();
        for l in text.lines() {
            for parsed in p.parse_line(l) {
                activities.push(match parsed {
                    claude_stream::Parsed::Event(ProviderEvent::Activity(a)) => format!(
                        "{:?} {:?} {} ({},{})",
                        a.kind(),
                        a.content,
                        a.tool_name,
                        a.tokens_input,
                        a.tokens_output
                    ),
                    claude_stream::Parsed::Event(ProviderEvent::SessionRef(s)) => {
                        format!("session {s}")
                    }
                    other => format!("{other:?}"),
                });
            }
        }
        Run {
            lines: text.lines().map(String::from).collect(),
            activities,
            sent: script.sent.into_inner().unwrap(),
            ends,
        }
    }

    fn root() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap().join("root");
        std::fs::create_dir_all(&root).unwrap();
        (tmp, root)
    }

    #[test]
    fn client_tools_are_offered_and_run_by_the_client() {
        let (_tmp, root) = root();
        let r = run_turns(
            &root,
            vec![
                Ok(answer(
                    "",
                    vec![call("c1", "run_tests", r#"{"filter":"db"}"#)],
                    100,
                    10,
                )),
                Ok(answer("Tests pass.", vec![], 200, 20)),
            ],
            &["Run the tests."],
            |s| {
                s.client_tools = paddock_core::ProviderConfig::parse(BTreeMap::from([(
                    paddock_core::CLIENT_TOOLS_KEY.into(),
                    r#"[{"name":"run_tests","description":"Run the suite","schema_json":"{\"type\":\"object\",\"properties\":{\"filter\":{\"type\":\"string\"}}}"}]"#.into(),
                )]))
                .unwrap()
                .agent()
                .client_tools
                .clone()
            },
            "",
        );
        let offered: Vec<&str> = r.sent[0]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(offered.last(), Some(&"run_tests"));
        let tool_msg = &r.sent[1]["messages"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone();
        assert_eq!(tool_msg["role"], "tool");
        assert_eq!(
            tool_msg["content"],
            r#"client ran run_tests with {"filter":"db"}"#
        );
    }

    #[test]
    fn a_tool_turn_reads_back_as_activities() {
        let (_tmp, root) = root();
        let r = run_turns(
            &root,
            vec![
                Ok(Completion {
                    reasoning: "Write it.".into(),
                    ..answer(
                        "",
                        vec![call(
                            "c1",
                            "write_file",
                            r#"{"path":"a.txt","content":"hi\n"}"#,
                        )],
                        100,
                        10,
                    )
                }),
                Ok(answer(
                    "Now look.",
                    vec![call("c2", "shell", r#"{"command":"cat a.txt"}"#)],
                    200,
                    20,
                )),
                Ok(answer("Done.", vec![], 300, 30)),
            ],
            &["Make a.txt."],
            |_| {},
            "",
        );
        assert_eq!(std::fs::read_to_string(root.join("a.txt")).unwrap(), "hi\n");
        let unrecognized = r
            .activities
            .iter()
            .filter(|a| a.starts_with("Unrecognized"));
        assert_eq!(unrecognized.count(), 3);
        let shown: Vec<_> = r
            .activities
            .iter()
            .filter(|a| !a.starts_with("Unrecognized"))
            .cloned()
            .collect();
        assert_eq!(
            shown,
            [
                "session 01TEST",
                "Thinking \"Write it.\"  (100,10)",
                "ToolCall \"a.txt\" write_file (0,0)",
                "ToolResult \"wrote 3 bytes to a.txt\" write_file (0,0)",
                "Text \"Now look.\"  (200,20)",
                "ToolCall \"cat a.txt\" shell (0,0)",
                "ToolResult \"hi\\n\" shell (0,0)",
                "Text \"Done.\"  (300,30)",
                "Completion \"Done.\"  (0,0)",
            ],
            "{:#?}",
            r.lines
        );
        assert_eq!(
            r.ends[0].usage,
            Usage {
                input_tokens: 600,
                cache_read_input_tokens: 0,
                output_tokens: 60,
                ..Usage::default()
            }
        );
        // The third call saw the whole exchange, tool results included.
        let m = &r.sent[2]["messages"];
        assert_eq!(m[0], json!({"role": "system", "content": "sys"}));
        assert_eq!(m[1], json!({"role": "user", "content": "Make a.txt."}));
        assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "write_file");
        assert_eq!(m[2]["content"], Value::Null);
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "wrote 3 bytes to a.txt"})
        );
        assert_eq!(
            m[5],
            json!({"role": "tool", "tool_call_id": "c2", "content": "hi\n"})
        );
        assert_eq!(r.sent[0]["stream"], true);
        assert_eq!(r.sent[0]["stream_options"]["include_usage"], true);
        assert_eq!(r.sent[0]["tools"].as_array().unwrap().len(), 4);
        // And it was saved.
        let saved = store::load(&root.join("../state"), "01TEST").unwrap();
        assert_eq!(saved.len(), 6);
    }

    #[test]
    fn denials_bad_arguments_unknown_tools_and_the_round_limit() {
        let (_tmp, root) = root();
        let r = run_turns(
            &root,
            vec![
                Ok(answer(
                    "",
                    vec![
                        call("c1", "write_file", r#"{"path":"a.txt","content":"x"}"#),
                        call("c2", "shell", "{not json"),
                        call("c3", "browse", "{}"),
                    ],
                    10,
                    1,
                )),
                Ok(answer("", vec![call("c4", "list_dir", "")], 10, 1)),
            ],
            &["Try."],
            |s| s.max_tool_rounds = 1,
            "write_file",
        );
        assert!(!root.join("a.txt").exists());
        let results: Vec<_> = r
            .activities
            .iter()
            .filter(|a| a.starts_with("ToolResult") || a.starts_with("Error"))
            .collect();
        assert_eq!(results.len(), 5, "{:#?}", r.activities);
        assert!(results[0].contains("policy denies write_file"));
        assert!(results[1].contains("not a JSON object"));
        assert!(results[2].contains("no tool named \\\"browse\\\""));
        assert!(results[3].contains("not run: the turn reached its limit of 1 tool rounds"));
        assert!(
            results[4].contains("openai-api: error: reached the limit of 1 tool rounds"),
            "{}",
            results[4]
        );
        // The model was told why.
        let m = &r.sent[1]["messages"];
        assert_eq!(
            m[3]["content"],
            "paddock: the session's permission policy denies write_file"
        );
    }

    #[test]
    fn api_errors_end_the_turn_and_retries_are_shown() {
        let (_tmp, root) = root();
        let err = |s: u16| {
            Err(CallError::Status {
                status: s,
                message: format!("fake {s}"),
            })
        };
        let r = run_turns(
            &root,
            vec![
                err(500),
                err(503),
                Ok(answer("Back.", vec![], 5, 1)),
                err(400),
            ],
            &["one", "two"],
            |s| s.max_retries = 2,
            "",
        );
        let shown: Vec<_> = r
            .activities
            .iter()
            .filter(|a| !a.starts_with("session") && !a.starts_with("Unrecognized"))
            .cloned()
            .collect();
        assert_eq!(
            shown,
            [
                "Status \"API error 500 (fake 500); retry 1 of 2 in 1 ms\"  (0,0)",
                "Status \"API error 503 (fake 503); retry 2 of 2 in 2 ms\"  (0,0)",
                "Text \"Back.\"  (5,1)",
                "Completion \"Back.\"  (0,0)",
                "Error \"openai-api: API error status 400: fake 400\"  (0,0)",
            ]
        );
        assert_eq!(r.ends[1].api_error_status, Some(400));
        // The second turn's request carried the first turn.
        let texts: Vec<_> = r.sent[3]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(texts, ["sys", "one", "Back.", "two"]);
    }

    #[test]
    fn settings_from_provider_config() {
        let c = |pairs: &[(&str, &str)]| {
            paddock_core::ProviderConfig::parse(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
            .unwrap()
        };
        let s = Settings::new(
            "m",
            &c(&[("base_url", "http://127.0.0.1:9/v1"), ("max_retries", "0")]),
            Path::new("/w"),
        )
        .unwrap();
        assert_eq!((s.max_retries, s.max_tool_rounds), (0, 25));
        assert_eq!(s.base_url, "http://127.0.0.1:9/v1");
        assert!(Settings::new("", &c(&[]), Path::new("/w")).is_err());
        for bad in [
            ("max_retries", "two"),
            ("max_retries", "11"),
            ("shell_timeout_secs", "0"),
            ("max_tool_output_bytes", "10"),
            ("base_url", "ftp://x"),
        ] {
            let e = check_config(&c(&[bad])).unwrap_err().to_string();
            assert!(e.contains(bad.0), "{e}");
        }
        assert!(check_config(&c(&[("state_dir", "/tmp/x")])).is_ok());
    }

    #[test]
    fn arguments_parse_leniently() {
        assert_eq!(parse_arguments("").unwrap(), json!({}));
        assert_eq!(parse_arguments(r#"{"a":1}"#).unwrap(), json!({"a": 1}));
        assert!(parse_arguments("[1]").is_err());
        assert!(parse_arguments("{").is_err());
    }
}
