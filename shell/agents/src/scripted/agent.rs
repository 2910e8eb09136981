//! The scripted agent's behaviour: a script's turn (or the built-in answer) → the actions that
//! answer one user message, step by step, every line written through [`stream_json`].
//!
//! A turn is planned lazily: [`Reply`] yields the actions of one step at a time, so a turn of
//! N steps costs O(N) time and holds only the current step's lines, whatever N is.

use std::collections::{HashMap, VecDeque};
use std::path::Path;

use serde_json::{json, Value};

use super::script::{Script, Step, StepKind};
use super::tools::{list_dir, listing_text, plural, run_tool};
use crate::ask::QUESTION_TOOL;
use crate::stream_json::{
    self, Assistant, AssistantMessage, Block, Context, ControlRequest, Init, Line, ReadAnswer,
    Request, System, TurnResult, Usage, User,
};

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
    /// then print the result of tool call `call` as the answer says ([`Reply::answered`]).
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

/// The agent's state across messages. What it answers is deterministic given the script, the
/// session id, the message, the controller's answers and the directory's contents.
#[derive(Debug, Clone)]
pub struct Agent {
    script: Script,
    session_id: String,
    /// What `--append-system-prompt` gave (empty: none), for `{system_prompt}`.
    system_prompt: String,
    answered: u64,
    init_sent: bool,
}

/// The turn of a message no script turn answers.
static BUILTIN_TURN: [Step; 1] = [Step {
    delay_ms: 0,
    kind: StepKind::Builtin,
}];

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
    /// `init` line, `LS` and `{cwd}`), one step at a time.
    pub fn reply<'a>(&'a mut self, message: &'a str, cwd: &'a Path) -> Reply<'a> {
        self.answered += 1;
        let k = self.answered;
        let first = !std::mem::replace(&mut self.init_sent, true);
        let this: &'a Agent = self;
        let turns = &this.script.turns;
        let steps: &'a [Step] = match turns.get(k as usize - 1) {
            Some(t) => &t.steps,
            None if this.script.repeat_last && !turns.is_empty() => &turns[turns.len() - 1].steps,
            None => &BUILTIN_TURN,
        };
        let mut reply = Reply {
            steps,
            next: 0,
            queue: VecDeque::new(),
            k,
            message,
            cwd,
            cwd_str: cwd.display().to_string(),
            session_id: &this.session_id,
            system_prompt: &this.system_prompt,
            model: this.script.model.as_deref().unwrap_or("scripted"),
            msg_seq: 0,
            tool_seq: 0,
            last_tool: None,
            usages: Vec::new(),
            usage_at: HashMap::new(),
            delay_total: 0,
            answer: None,
        };
        if first {
            let line = stream_json::encode(&Line::System(System::Init(Init {
                cwd: Some(&reply.cwd_str),
                session_id: reply.session_id,
                tools: Some(&["LS", "Read"]),
                mcp_servers: Some(&[]),
                model: Some(reply.model),
                permission_mode: Some("default"),
                api_key_source: Some("none"),
            })));
            reply.emit(line);
        }
        reply
    }

    /// All the actions that answer the next message, without a controller: an asking step's
    /// `{answer}` stays as written.
    #[cfg(test)]
    pub fn answer(&mut self, message: &str, cwd: &Path) -> Vec<Action> {
        self.reply(message, cwd).collect()
    }
}

/// One turn being answered: an iterator over its actions, planned a step at a time.
pub struct Reply<'a> {
    steps: &'a [Step],
    /// The next step to plan.
    next: usize,
    /// The planned step's actions not yet taken.
    queue: VecDeque<Action>,
    k: u64,
    message: &'a str,
    cwd: &'a Path,
    cwd_str: String,
    session_id: &'a str,
    system_prompt: &'a str,
    model: &'a str,
    msg_seq: u64,
    tool_seq: u64,
    last_tool: Option<String>,
    /// Per assistant message id (in order of appearance): its largest usage so far.
    usages: Vec<(String, Usage)>,
    /// Where each message id is in `usages` (each line finds its message in O(1)).
    usage_at: HashMap<String, usize>,
    delay_total: u64,
    /// The last answer the controller gave in this turn, for `{answer}`.
    answer: Option<String>,
}

impl Iterator for Reply<'_> {
    type Item = Action;

    fn next(&mut self) -> Option<Action> {
        loop {
            if let Some(a) = self.queue.pop_front() {
                return Some(a);
            }
            let i = self.next;
            let step = self.steps.get(i)?;
            self.next += 1;
            let next_is_result = matches!(
                self.steps.get(i + 1).map(|s| &s.kind),
                Some(StepKind::ToolResult { .. })
            );
            self.plan(step, next_is_result);
        }
    }
}

impl Reply<'_> {
    /// The controller answered the request of `call` (an [`Action::Ask`]): its result line, and
    /// `{answer}` is `content` in the turn's later steps.
    pub fn answered(&mut self, call: &str, content: String, is_error: bool) -> String {
        let line = stream_json::encode(&self.tool_result(call, &content, is_error));
        self.answer = Some(content);
        line
    }

    /// Queues one step's actions.
    fn plan(&mut self, step: &Step, next_is_result: bool) {
        if step.delay_ms > 0 {
            self.delay_total += step.delay_ms;
            self.queue.push_back(Action::Sleep(step.delay_ms));
        }
        match &step.kind {
            StepKind::Wait => {}
            StepKind::Thinking {
                text,
                tokens_in,
                tokens_out,
                message_id,
            }
            | StepKind::Text {
                text,
                tokens_in,
                tokens_out,
                message_id,
            } => {
                let text = self.expand(text).into();
                let mid = self.message_id(message_id.as_deref());
                let block = match step.kind {
                    StepKind::Thinking { .. } => Block::Thinking {
                        thinking: text,
                        signature: Some("scripted"),
                    },
                    _ => Block::Text { text },
                };
                self.assistant(&mid, block, Usage::plain(*tokens_in, *tokens_out));
            }
            StepKind::Tool {
                name,
                input,
                id,
                tokens_in,
                tokens_out,
                message_id,
            } => {
                let input = self.expand_value(input);
                let mid = self.message_id(message_id.as_deref());
                let usage = Usage::plain(*tokens_in, *tokens_out);
                let call = self.tool_call(name, &input, id.as_deref(), &mid, usage);
                if !next_is_result {
                    let (content, is_error) = run_tool(name, &input, self.cwd);
                    let line = stream_json::encode(&self.tool_result(&call, &content, is_error));
                    self.emit(line);
                }
            }
            StepKind::ToolResult {
                content,
                is_error,
                id,
            } => {
                let call = id
                    .clone()
                    .or_else(|| self.last_tool.clone())
                    .unwrap_or_else(|| "toolu_scripted_orphan".into());
                let content = self.expand(content);
                let line = stream_json::encode(&self.tool_result(&call, &content, *is_error));
                self.emit(line);
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
                let text = self.expand(text);
                let sum = self.usage_sum();
                // Given totals replace the sum; without them the cache counts are the sum's.
                let output = tokens_out.unwrap_or(sum.output_tokens);
                let usage = match tokens_in {
                    Some(input) => Usage::plain(*input, output),
                    None => Usage {
                        output_tokens: output,
                        ..sum
                    },
                };
                let n = num_turns.unwrap_or((self.usages.len() as u64).max(1));
                self.result(&text, subtype, *is_error, api_error_status, n, usage);
            }
            StepKind::Raw(line) => {
                // A raw line is usually JSON: the answer goes in as a JSON string's inside.
                let answer = self.answer.as_deref().map(json_inner);
                let line = expand(self, line, answer.as_deref());
                self.queue.push_back(Action::Line(line));
            }
            StepKind::Stderr(line) => {
                let line = expand(self, line, None);
                self.queue.push_back(Action::Stderr(line));
            }
            StepKind::Crash(code) => self.queue.push_back(Action::Exit(*code)),
            StepKind::Signal(n) => self.queue.push_back(Action::Signal(*n)),
            StepKind::Hang => self.queue.push_back(Action::Hang),
            StepKind::Builtin => self.builtin(),
            StepKind::Ask {
                tool,
                input,
                allowed_result,
            } => {
                let input = self.expand_value(input);
                let allowed = match allowed_result {
                    Some(r) => self.expand(r),
                    None => "approved".to_string(),
                };
                self.ask(tool, input, "can_use_tool", allowed);
            }
            StepKind::ClientTool { tool, input } => {
                let input = self.expand_value(input);
                self.ask(tool, input, "client_tool", "approved".to_string());
            }
            StepKind::Question { text, options } => {
                let options: Vec<Value> = options
                    .iter()
                    .map(|o| json!({"label": self.expand(o), "description": ""}))
                    .collect();
                // Claude Code's AskUserQuestion input (a tool input, not a protocol line).
                let input = json!({"questions": [{
                    "question": self.expand(text),
                    "header": "Question",
                    "options": options,
                    "multiSelect": false,
                }]});
                self.ask(QUESTION_TOOL, input, "can_use_tool", "approved".to_string());
            }
        }
    }

    /// The tool's `tool_use` line, then the `control_request` the controller answers.
    fn ask(&mut self, tool: &str, input: Value, subtype: &str, allowed_result: String) {
        let mid = self.message_id(None);
        let call = self.tool_call(tool, &input, None, &mid, Usage::default());
        let request_id = format!("req_scripted_{}_{}", self.k, self.tool_seq);
        let line = stream_json::encode(&Line::ControlRequest(ControlRequest {
            request_id: request_id.as_str().into(),
            request: Request {
                subtype: subtype.into(),
                tool_name: tool.into(),
                input: input.clone(),
                tool_use_id: Some(call.as_str().into()),
            },
        }));
        self.queue.push_back(Action::Ask {
            request_id,
            line,
            call,
            tool: tool.to_string(),
            input,
            allowed_result,
        });
    }

    fn emit(&mut self, line: String) {
        self.queue.push_back(Action::Line(line));
    }

    fn context(&self) -> Option<Context<'_>> {
        Some(Context {
            parent_tool_use_id: None,
            session_id: self.session_id,
        })
    }

    fn message_id(&mut self, given: Option<&str>) -> String {
        match given {
            Some(id) => id.to_string(),
            None => {
                self.msg_seq += 1;
                format!("msg_scripted_{}_{}", self.k, self.msg_seq)
            }
        }
    }

    /// `s` with its placeholders replaced, `{answer}` included once the controller answered.
    fn expand(&self, s: &str) -> String {
        expand(self, s, self.answer.as_deref())
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
        let line = stream_json::encode(&Line::Assistant(Assistant {
            message: AssistantMessage {
                kind: Some("message"),
                model: Some(self.model),
                stop_reason: Some(None),
                ..AssistantMessage::new(message_id, vec![block], Some(usage))
            },
            context: self.context(),
        }));
        self.emit(line);
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
        let block = Block::ToolUse {
            id: call.as_str().into(),
            name: name.into(),
            input: std::borrow::Cow::Borrowed(input),
        };
        self.assistant(message_id, block, usage);
        self.last_tool = Some(call.clone());
        call
    }

    fn tool_result<'b>(&'b self, call: &'b str, content: &'b str, is_error: bool) -> Line<'b> {
        Line::User(User {
            context: self.context(),
            ..User::tool_result(call, content, is_error)
        })
    }

    fn usage_sum(&self) -> Usage {
        let mut sum = Usage::default();
        for (_, u) in &self.usages {
            sum.add(*u);
        }
        sum
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
        let line = stream_json::encode(&Line::Result(TurnResult {
            subtype,
            duration_ms: Some(self.delay_total),
            duration_api_ms: Some(self.delay_total),
            num_turns: Some(num_turns),
            session_id: Some(self.session_id),
            total_cost_usd: Some(0.0),
            api_error_status: Some(api_error_status).filter(|s| !s.is_null()),
            ..TurnResult::new(is_error, text, usage)
        }));
        self.emit(line);
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
        let block = Block::Thinking {
            thinking: thinking.into(),
            signature: Some("scripted"),
        };
        self.assistant(&m1, block, u1);
        u1.output_tokens = 20;
        let input = json!({ "path": self.cwd_str });
        let call = self.tool_call("LS", &input, None, &m1, u1);
        let (summary, reply) = match list_dir(self.cwd) {
            Ok((total, names)) => {
                let listing = listing_text(total, &names);
                let line = stream_json::encode(&self.tool_result(&call, &listing, false));
                self.emit(line);
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
                let line = stream_json::encode(&self.tool_result(&call, &e.to_string(), true));
                self.emit(line);
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
        self.assistant(
            &m2,
            Block::Text {
                text: summary.into(),
            },
            u2,
        );
        let usage = self.usage_sum();
        let n = (self.usages.len() as u64).max(1);
        self.result(&reply, "success", false, &Value::Null, n, usage);
    }
}

/// The longest placeholder name (`system_prompt`).
const PLACEHOLDER_MAX: usize = "system_prompt".len();

/// `s` with `{message}`, `{turn}`, `{cwd}`, `{session_id}`, `{system_prompt}` and (when given)
/// `{answer}` replaced; any other `{…}` stays as written.
fn expand(r: &Reply<'_>, s: &str, answer: Option<&str>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open..];
        // Placeholder names are short: look no further than the longest one, so a text full
        // of `{` costs O(its length), not O(length²).
        let close = after.as_bytes()[..after.len().min(PLACEHOLDER_MAX + 2)]
            .iter()
            .position(|&b| b == b'}');
        let value = close.and_then(|c| match &after[1..c] {
            "message" => Some(r.message.to_string()),
            "turn" => Some(r.k.to_string()),
            "cwd" => Some(r.cwd_str.clone()),
            "session_id" => Some(r.session_id.to_string()),
            "system_prompt" => Some(r.system_prompt.to_string()),
            "answer" => answer.map(str::to_string),
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

/// `s` as the inside of a JSON string literal.
fn json_inner(s: &str) -> String {
    let quoted = serde_json::to_string(s).expect("a string serialises");
    quoted[1..quoted.len() - 1].to_string()
}

/// A tool's result after the controller's answer: (content, is_error).
pub fn ask_outcome(
    answer: &ReadAnswer,
    tool: &str,
    input: &Value,
    allowed_result: &str,
    cwd: &Path,
) -> (String, bool) {
    if answer.subtype == "error" {
        let why = answer.error.as_deref().unwrap_or("error");
        return (format!("denied: {why}"), true);
    }
    let d = &answer.response;
    let allowed = answer.allowed();
    if let Some(result) = &d.result {
        // A client tool's result.
        return (result.clone(), d.is_error.unwrap_or(!allowed));
    }
    if !allowed {
        return (
            format!("denied: {}", d.message.as_deref().unwrap_or("")),
            true,
        );
    }
    if tool == QUESTION_TOOL {
        let answers = d
            .updated_input
            .as_ref()
            .and_then(|i| i.get("answers"))
            .and_then(Value::as_object)
            .map(|m| {
                m.values()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default();
        return (format!("User answered: {answers}"), false);
    }
    let input = d.updated_input.as_ref().unwrap_or(input);
    match tool {
        "LS" | "Read" => run_tool(tool, input, cwd),
        _ => (allowed_result.to_string(), false),
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_script;
    use super::*;

    /// Each `{` looks a few bytes ahead at most: a million of them expand at once (scanning
    /// to the end from each is 5·10¹¹ byte comparisons).
    #[test]
    fn a_text_full_of_braces_expands_in_linear_time() {
        let text = "{".repeat(1_000_000) + "{turn}";
        let script = format!(r#"{{"turns":[{{"steps":[{{"raw":"{text}"}}]}}]}}"#);
        let mut agent = Agent::new(parse_script(&script).unwrap(), "s");
        let started = std::time::Instant::now();
        let actions = agent.answer("m", Path::new("/"));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let Some(Action::Line(line)) = actions.last() else {
            panic!("{actions:?}")
        };
        assert_eq!(line.len(), 1_000_001);
        assert!(line.ends_with("{1"));
    }
}
