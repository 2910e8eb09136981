//! A streamed chat completion, from bytes to one [`Completion`].
//!
//! The endpoint answers `POST /chat/completions` with `"stream": true` as server-sent events:
//! `data: {chunk}` lines, each event ended by a blank line, `data: [DONE]` at the end, with
//! `"stream_options": {"include_usage": true}` a last chunk whose `choices` is empty and whose
//! `usage` holds the call's token counts. [`SseReader`] cuts the byte stream into event payloads
//! (with a cap on a line's and on the whole body's size); [`Accumulator`] folds the chunks'
//! deltas into one answer:
//!
//! | chunk field | goes to |
//! |---|---|
//! | `choices[0].delta.content` | [`Completion::text`] (appended) |
//! | `choices[0].delta.reasoning_content` (DeepSeek, vLLM) or `.reasoning` (OpenRouter, Ollama) | [`Completion::reasoning`] |
//! | `choices[0].delta.tool_calls[k]` | the tool call at `index` (`id`, `function.name` set once, `function.arguments` appended) |
//! | `choices[0].finish_reason` | [`Completion::finish_reason`] |
//! | `usage` (`prompt_tokens`, `completion_tokens`, `prompt_tokens_details.cached_tokens`) | [`Completion::usage`] |
//! | `error` (an error sent inside a 200 stream, as some gateways do) | the call fails with its `message` |
//! | `choices[n]`, n > 0; anything else | ignored (parsed leniently) |
//!
//! An endpoint that ignores `stream` and answers one JSON object goes through
//! [`Accumulator::whole`] (`choices[0].message`), with the same result.

use std::collections::BTreeMap;
use std::io::{self, BufRead, Read};

use serde_json::Value;

use crate::bridge::{Error, Usage};

/// One tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them: a JSON object in a string (not checked here).
    pub arguments: String,
}

/// One model call's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Completion {
    pub text: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: Option<String>,
    /// `None` when the endpoint reported none (some ignore `include_usage`).
    pub usage: Option<Usage>,
}

/// What one SSE event carried.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Chunk(Value),
    /// `data: [DONE]`.
    Done,
    /// A payload that is not JSON: kept verbatim for the daemon's log.
    Garbage(String),
}

/// Server-sent events from a byte stream, one data payload at a time.
pub struct SseReader<R> {
    r: io::BufReader<io::Take<R>>,
    max_line: usize,
}

impl<R: Read> SseReader<R> {
    /// Reads at most `max_body` bytes in all, and lines of at most `max_line` bytes: a server
    /// that sends more is cut off with an error rather than eating the bridge's memory.
    pub fn new(r: R, max_body: u64, max_line: usize) -> Self {
        SseReader {
            r: io::BufReader::new(r.take(max_body)),
            max_line,
        }
    }

    /// The body limit was used up: the stream was cut there, not ended by the server.
    pub fn exhausted(&self) -> bool {
        self.r.get_ref().limit() == 0
    }

    /// The next event, `None` at the end of the stream.
    pub fn next_event(&mut self) -> io::Result<Option<Event>> {
        let mut data: Option<String> = None;
        loop {
            let Some(line) = self.line()? else {
                // The end: a last event without its blank line still counts.
                return Ok(data.map(|d| classify(&d)));
            };
            if line.is_empty() {
                if let Some(d) = data.take() {
                    return Ok(Some(classify(&d)));
                }
                continue;
            }
            // `event:`, `id:`, `retry:` and `:comment` lines say nothing a chunk does not.
            if let Some(rest) = line.strip_prefix("data:") {
                let rest = rest.strip_prefix(' ').unwrap_or(rest);
                match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(rest);
                    }
                    None => data = Some(rest.to_string()),
                }
            }
        }
    }

    /// One line without its end (`\n` or `\r\n`), `None` at the end of the stream.
    fn line(&mut self) -> io::Result<Option<String>> {
        let mut buf = Vec::new();
        let n = (&mut self.r)
            .take(self.max_line as u64 + 1)
            .read_until(b'\n', &mut buf)?;
        if n == 0 {
            return Ok(None);
        }
        if buf.last() != Some(&b'\n') && buf.len() > self.max_line {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a server-sent event line longer than {} bytes",
                    self.max_line
                ),
            ));
        }
        while matches!(buf.last(), Some(b'\n' | b'\r')) {
            buf.pop();
        }
        Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
    }
}

fn classify(data: &str) -> Event {
    let d = data.trim();
    if d == "[DONE]" {
        return Event::Done;
    }
    match serde_json::from_str::<Value>(d) {
        Ok(v) if v.is_object() => Event::Chunk(v),
        _ => Event::Garbage(data.to_string()),
    }
}

/// A tool call being streamed in pieces.
#[derive(Debug, Default)]
struct Partial {
    id: String,
    name: String,
    arguments: String,
}

/// Folds chunks into a [`Completion`].
#[derive(Debug, Default)]
pub struct Accumulator {
    text: String,
    reasoning: String,
    /// By the chunk's `index` (a `BTreeMap`: the calls come out in the model's order).
    calls: BTreeMap<u64, Partial>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
}

impl Accumulator {
    /// The model said it finished (a `finish_reason` arrived).
    pub fn finished(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// Takes one chunk; `Err` with the endpoint's message when the chunk is an error.
    pub fn chunk(&mut self, v: &Value) -> Result<(), Error> {
        reported_error(v)?;
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage(u));
        }
        let Some(choice) = first_choice(v) else {
            return Ok(());
        };
        let delta = &choice["delta"];
        if let Some(t) = delta.get("content").and_then(Value::as_str) {
            self.text.push_str(t);
        }
        if let Some(t) = reasoning(delta) {
            self.reasoning.push_str(t);
        }
        for tc in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.tool_call_delta(tc);
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(f.to_string());
        }
        Ok(())
    }

    /// A tool call delta. Without an `index` (some OpenAI-compatible servers leave it out), a
    /// delta with a new `id` starts a new call and one without continues the last.
    fn tool_call_delta(&mut self, tc: &Value) {
        let id = tc
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let index = match tc.get("index").and_then(Value::as_u64) {
            Some(i) => i,
            None => {
                let last = self.calls.keys().next_back().copied();
                match (last, id) {
                    (Some(l), Some(id)) if self.calls[&l].id != id => l + 1,
                    (Some(l), _) => l,
                    (None, _) => 0,
                }
            }
        };
        let call = self.calls.entry(index).or_default();
        if let Some(id) = id {
            call.id = id.to_string();
        }
        let f = &tc["function"];
        if let Some(n) = f.get("name").and_then(Value::as_str) {
            // Sent once by OpenAI; some servers repeat it in later deltas: the first counts.
            if call.name.is_empty() {
                call.name = n.to_string();
            }
        }
        if let Some(a) = f.get("arguments").and_then(Value::as_str) {
            call.arguments.push_str(a);
        }
    }

    /// A whole (non-streamed) `chat.completion` object.
    pub fn whole(v: &Value) -> Result<Completion, Error> {
        reported_error(v)?;
        let mut acc = Accumulator::default();
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            acc.usage = Some(usage(u));
        }
        if let Some(choice) = first_choice(v) {
            let m = &choice["message"];
            acc.text = m
                .get("content")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into();
            acc.reasoning = reasoning(m).unwrap_or("").into();
            for (k, tc) in m
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let mut tc = tc.clone();
                tc["index"] = Value::from(k as u64);
                acc.tool_call_delta(&tc);
            }
            acc.finish_reason = choice
                .get("finish_reason")
                .and_then(Value::as_str)
                .map(String::from);
        }
        Ok(acc.finish())
    }

    /// The answer. A call the server sent without an id gets one (`call_<k>`): the tool
    /// message that answers it must name it.
    pub fn finish(self) -> Completion {
        let tool_calls = self
            .calls
            .into_iter()
            .filter(|(_, p)| !p.name.is_empty() || !p.arguments.is_empty())
            .map(|(k, p)| ToolCall {
                id: if p.id.is_empty() {
                    format!("call_{k}")
                } else {
                    p.id
                },
                name: p.name,
                arguments: p.arguments,
            })
            .collect();
        Completion {
            text: self.text,
            reasoning: self.reasoning,
            tool_calls,
            finish_reason: self.finish_reason,
            usage: self.usage,
        }
    }
}

/// An answer that is an error object (`{"error": …}`): the endpoint's message.
fn reported_error(v: &Value) -> Result<(), Error> {
    match v.get("error").filter(|e| !e.is_null()) {
        Some(e) => Err(Error::Endpoint(
            error_message(e).unwrap_or_else(|| e.to_string()),
        )),
        None => Ok(()),
    }
}

fn first_choice(v: &Value) -> Option<&Value> {
    v.get("choices")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
}

fn reasoning(m: &Value) -> Option<&str> {
    m.get("reasoning_content")
        .and_then(Value::as_str)
        .or_else(|| m.get("reasoning").and_then(Value::as_str))
}

/// OpenAI's usage: `prompt_tokens` includes the cached ones, which it also reports apart.
pub fn usage(u: &Value) -> Usage {
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    Usage::from_prompt_inclusive(
        n("/prompt_tokens"),
        n("/prompt_tokens_details/cached_tokens"),
        n("/completion_tokens"),
    )
}

/// The message of an API error object (`{"message": …}`), or of a body holding one
/// (`{"error": {"message": …}}`, `{"error": "…"}`, `{"message": …}`, `{"detail": …}`).
pub fn error_message(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Object(o) => o
            .get("error")
            .and_then(error_message)
            .or_else(|| o.get("message").and_then(error_message))
            .or_else(|| o.get("detail").and_then(error_message)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What the fake server of tests/providers sends (the shape of api.openai.com's stream):
    /// a role chunk, content and tool call deltas split mid-token, the finish reason, the usage
    /// chunk, `[DONE]`.
    const RECORDED: &str = concat!(
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"Think\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        ": keep-alive comment\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Let me \"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"write.\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\",\"function\":{\"name\":\"write_file\",\"arguments\":\"\"}}]},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"path\\\": \\\"a.t\"}}]},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"xt\\\"}\"}}]},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_b\",\"type\":\"function\",\"function\":{\"name\":\"shell\",\"arguments\":\"{\\\"command\\\":\\\"ls\\\"}\"}}]},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":1200,\"completion_tokens\":40,\"total_tokens\":1240,\"prompt_tokens_details\":{\"cached_tokens\":1000}}}\n\n",
        "data: [DONE]\n\n",
    );

    fn fold(stream: &str) -> (Completion, Vec<Event>) {
        let mut r = SseReader::new(stream.as_bytes(), 1 << 20, 4096);
        let mut acc = Accumulator::default();
        let mut other = Vec::new();
        while let Some(e) = r.next_event().unwrap() {
            match e {
                Event::Chunk(v) => acc.chunk(&v).unwrap(),
                e => other.push(e),
            }
        }
        (acc.finish(), other)
    }

    #[test]
    fn a_recorded_stream_folds_into_one_answer() {
        let (c, other) = fold(RECORDED);
        assert_eq!(other, [Event::Done]);
        assert_eq!(c.text, "Let me write.");
        assert_eq!(c.reasoning, "Think");
        assert_eq!(c.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            c.tool_calls,
            [
                ToolCall {
                    id: "call_a".into(),
                    name: "write_file".into(),
                    arguments: r#"{"path": "a.txt"}"#.into()
                },
                ToolCall {
                    id: "call_b".into(),
                    name: "shell".into(),
                    arguments: r#"{"command":"ls"}"#.into()
                },
            ]
        );
        assert_eq!(
            c.usage,
            Some(Usage {
                input_tokens: 200,
                cache_read_input_tokens: 1000,
                output_tokens: 40,
                ..Usage::default()
            })
        );
    }

    #[test]
    fn crlf_multi_line_data_garbage_and_a_missing_last_blank_line() {
        let s = "event: x\r\ndata: {\"choices\":[{\"delta\":\r\ndata: {\"content\":\"hi\"}}]}\r\n\r\ndata: not json\n\ndata: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"other choice\"}}]}";
        let (c, other) = fold(s);
        assert_eq!(c.text, "hi");
        assert_eq!(other, [Event::Garbage("not json".into())]);
        assert_eq!(c.usage, None);
    }

    #[test]
    fn tool_calls_without_index_or_id() {
        let mut acc = Accumulator::default();
        for v in [
            json!({"choices":[{"delta":{"tool_calls":[{"id":"x","function":{"name":"read_file","arguments":"{\"pa"}}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"th\":\"a\"}"}}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"id":"y","function":{"name":"list_dir","arguments":"{}"}}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":5,"function":{"name":"shell","arguments":""}}]}}]}),
        ] {
            acc.chunk(&v).unwrap();
        }
        let c = acc.finish();
        let got: Vec<_> = c
            .tool_calls
            .iter()
            .map(|t| (t.id.as_str(), t.name.as_str(), t.arguments.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("x", "read_file", r#"{"path":"a"}"#),
                ("y", "list_dir", "{}"),
                ("call_5", "shell", "")
            ]
        );
    }

    #[test]
    fn errors_inside_a_stream_and_limits() {
        let mut acc = Accumulator::default();
        let e = acc
            .chunk(&json!({"error": {"message": "overloaded", "type": "server_error"}}))
            .unwrap_err();
        assert_eq!(e.to_string(), "overloaded");
        // A line over the cap is an error, not a buffer that grows without end.
        let long = format!("data: {}\n\n", "x".repeat(100));
        let mut r = SseReader::new(long.as_bytes(), 1 << 20, 50);
        assert!(r.next_event().is_err());
        // The body cap ends the stream early, and says so.
        let mut r = SseReader::new(RECORDED.as_bytes(), 300, 4096);
        let mut n = 0;
        while let Ok(Some(_)) = r.next_event() {
            n += 1;
        }
        assert!(n < 3, "{n}");
        assert!(r.exhausted());
        let mut r = SseReader::new(RECORDED.as_bytes(), 1 << 20, 4096);
        while let Ok(Some(_)) = r.next_event() {}
        assert!(!r.exhausted());
    }

    #[test]
    fn a_whole_completion_reads_the_same() {
        let v = json!({"choices":[{"index":0,"message":{"role":"assistant","content":"Done.","reasoning":"r",
            "tool_calls":[{"id":"c1","type":"function","function":{"name":"shell","arguments":"{\"command\":\"ls\"}"}}]},
            "finish_reason":"tool_calls"}],"usage":{"prompt_tokens":10,"completion_tokens":3}});
        let c = Accumulator::whole(&v).unwrap();
        assert_eq!((c.text.as_str(), c.reasoning.as_str()), ("Done.", "r"));
        assert_eq!(c.tool_calls[0].name, "shell");
        assert_eq!(c.usage.unwrap().input_tokens, 10);
        assert_eq!(
            error_message(&json!({"error": {"message": "bad key"}})).as_deref(),
            Some("bad key")
        );
        assert_eq!(
            error_message(&json!({"detail": "nope"})).as_deref(),
            Some("nope")
        );
    }
}
