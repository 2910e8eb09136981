//! `codex exec --json` output → the seed's `ExecEvent`: one JSONL line in, one event out.
//! paddock's one codex decoder: the runner's `Exec` streams its events, and the codex bridge
//! (`paddock_agents::bridge::codex`) turns them into a session's activity.
//!
//! Pure: bytes in, a message out, no I/O. The mapping is lenient — missing fields are
//! defaults, `null` is "not set", numbers may come as integers, floats or numeric strings — and
//! it loses nothing: whenever a line holds anything the mapping does not carry into the event
//! (an unknown event or item type, an unknown field at any depth, a value of an unexpected
//! type, a number that does not fit in `int32`), the whole original line goes into
//! `ExecEvent.raw`, and the item's original JSON (its exact bytes in the line) into
//! `ItemEvent.raw`. A line that is not a JSON object becomes an `EVENT_TYPE_UNSPECIFIED`
//! event with the line as `message` and its bytes as `raw`.
//!
//! The codex shapes (codex-rs `exec_events.rs`): top-level `thread.started {thread_id}`,
//! `turn.started`, `turn.completed {usage}`, `turn.failed {error{message}}`,
//! `item.started|updated|completed {item}`, `error {message}`; items `agent_message {text}`,
//! `reasoning {text}`, `command_execution {command, aggregated_output, exit_code, status}`,
//! `file_change {changes[{path, kind}], status}`, `mcp_tool_call {server, tool, arguments,
//! result, error, status}` (only `status` has a seed field: the rest stays in `raw`),
//! `web_search {query}`, `todo_list {items[{text, completed}]}`, `error {message}` (its message
//! goes into `text`).
//!
//! A top-level `error` event sets both `message` and `error.message`: the seed's `ExecEvent`
//! has a field for each, and a client may look at either.

use paddock_proto::runner::v1::{
    ErrorEvent, EventType, ExecEvent, FileChange, ItemEvent, ItemType, TodoItem, TurnUsage,
};
use serde_json::{Map, Value};

/// Maps one stdout line of `codex exec --json` (without its newline) to an event.
pub fn map_line(line: &[u8]) -> ExecEvent {
    let trimmed = line.trim_ascii();
    let obj = match serde_json::from_slice::<Value>(trimmed) {
        Ok(Value::Object(obj)) => obj,
        _ => return not_json(line),
    };
    let mut m = Mapper::default();
    let mut ev = ExecEvent::default();
    let ty = obj.get("type").and_then(Value::as_str).unwrap_or_default();
    match ty {
        "thread.started" => {
            ev.r#type = EventType::EventThreadStarted as i32;
            ev.thread_id = m.string(&obj, "thread_id");
            m.only(&obj, &["type", "thread_id"]);
        }
        "turn.started" => {
            ev.r#type = EventType::EventTurnStarted as i32;
            m.only(&obj, &["type"]);
        }
        "turn.completed" => {
            ev.r#type = EventType::EventTurnCompleted as i32;
            ev.usage = m.usage(obj.get("usage"));
            m.only(&obj, &["type", "usage"]);
        }
        "turn.failed" => {
            ev.r#type = EventType::EventTurnFailed as i32;
            ev.error = m.error(obj.get("error"));
            m.only(&obj, &["type", "error"]);
        }
        "item.started" | "item.updated" | "item.completed" => {
            ev.r#type = match ty {
                "item.started" => EventType::EventItemStarted,
                "item.updated" => EventType::EventItemUpdated,
                _ => EventType::EventItemCompleted,
            } as i32;
            ev.item = m.item(obj.get("item"), trimmed);
            m.only(&obj, &["type", "item"]);
        }
        "error" => {
            ev.r#type = EventType::EventError as i32;
            ev.message = m.string(&obj, "message");
            ev.error = Some(ErrorEvent {
                message: ev.message.clone(),
            });
            m.only(&obj, &["type", "message"]);
        }
        _ => {
            // An event type this mapping does not know (or no type at all).
            ev.r#type = EventType::Unspecified as i32;
            m.unknown = true;
        }
    }
    if m.unknown {
        ev.raw = line.to_vec();
    }
    ev
}

/// A line that is not a JSON object.
fn not_json(line: &[u8]) -> ExecEvent {
    ExecEvent {
        r#type: EventType::Unspecified as i32,
        message: String::from_utf8_lossy(line).into_owned(),
        raw: line.to_vec(),
        ..Default::default()
    }
}

/// Collects values and notes whether anything was left behind.
#[derive(Default)]
struct Mapper {
    unknown: bool,
}

impl Mapper {
    /// Notes a field of `obj` not in `known`.
    fn only(&mut self, obj: &Map<String, Value>, known: &[&str]) {
        if obj.keys().any(|k| !known.contains(&k.as_str())) {
            self.unknown = true;
        }
    }

    /// A string field; `null` or absent is empty; another type is kept in `raw` only.
    fn string(&mut self, obj: &Map<String, Value>, key: &str) -> String {
        match obj.get(key) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => {
                self.unknown = true;
                String::new()
            }
        }
    }

    /// An `int32` field: integers, integral floats and numeric strings are accepted; `null` or
    /// absent is 0; anything else (or out of range, which is clamped) also goes to `raw`.
    fn int32(&mut self, obj: &Map<String, Value>, key: &str) -> i32 {
        let v = match obj.get(key) {
            None | Some(Value::Null) => return 0,
            Some(v) => v,
        };
        let wide: Option<i64> = match v {
            Value::Number(n) => n.as_i64().or_else(|| {
                n.as_u64()
                    .map(|u| i64::try_from(u).unwrap_or(i64::MAX))
                    .or_else(|| {
                        n.as_f64()
                            .filter(|f| f.fract() == 0.0)
                            .map(|f| f.clamp(i64::MIN as f64, i64::MAX as f64) as i64)
                    })
            }),
            Value::String(s) => s.trim().parse::<i64>().ok(),
            _ => None,
        };
        match wide {
            Some(w) => match i32::try_from(w) {
                Ok(x) => {
                    if !v.is_number() {
                        self.unknown = true; // the original spelling is worth keeping
                    }
                    x
                }
                Err(_) => {
                    self.unknown = true;
                    if w < 0 {
                        i32::MIN
                    } else {
                        i32::MAX
                    }
                }
            },
            None => {
                self.unknown = true;
                0
            }
        }
    }

    fn bool(&mut self, obj: &Map<String, Value>, key: &str) -> bool {
        match obj.get(key) {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                self.unknown = true;
                false
            }
        }
    }

    fn object<'v>(&mut self, v: Option<&'v Value>) -> Option<&'v Map<String, Value>> {
        match v {
            None | Some(Value::Null) => None,
            Some(Value::Object(o)) => Some(o),
            Some(_) => {
                self.unknown = true;
                None
            }
        }
    }

    fn array<'v>(&mut self, obj: &'v Map<String, Value>, key: &str) -> &'v [Value] {
        match obj.get(key) {
            None | Some(Value::Null) => &[],
            Some(Value::Array(a)) => a,
            Some(_) => {
                self.unknown = true;
                &[]
            }
        }
    }

    fn usage(&mut self, v: Option<&Value>) -> Option<TurnUsage> {
        let o = self.object(v)?;
        let usage = TurnUsage {
            input_tokens: self.int32(o, "input_tokens"),
            cached_input_tokens: self.int32(o, "cached_input_tokens"),
            output_tokens: self.int32(o, "output_tokens"),
        };
        self.only(o, &["input_tokens", "cached_input_tokens", "output_tokens"]);
        Some(usage)
    }

    fn error(&mut self, v: Option<&Value>) -> Option<ErrorEvent> {
        let o = self.object(v)?;
        let e = ErrorEvent {
            message: self.string(o, "message"),
        };
        self.only(o, &["message"]);
        Some(e)
    }

    /// The item of an `item.*` event; `line` is the whole (trimmed) line, to cut the item's
    /// original bytes from.
    fn item(&mut self, v: Option<&Value>, line: &[u8]) -> Option<ItemEvent> {
        let o = self.object(v)?;
        // The item's own bookkeeping: whether *it* holds anything unmapped.
        let mut im = Mapper::default();
        let mut item = ItemEvent {
            id: im.string(o, "id"),
            ..Default::default()
        };
        let ty = o.get("type").and_then(Value::as_str).unwrap_or_default();
        let known: &[&str] = match ty {
            "agent_message" | "reasoning" => {
                item.r#type = if ty == "agent_message" {
                    ItemType::ItemAgentMessage
                } else {
                    ItemType::ItemReasoning
                } as i32;
                item.text = im.string(o, "text");
                &["id", "type", "text"]
            }
            "command_execution" => {
                item.r#type = ItemType::ItemCommandExecution as i32;
                item.command = im.string(o, "command");
                item.aggregated_output = im.string(o, "aggregated_output");
                item.exit_code = im.int32(o, "exit_code");
                item.status = im.string(o, "status");
                &[
                    "id",
                    "type",
                    "command",
                    "aggregated_output",
                    "exit_code",
                    "status",
                ]
            }
            "file_change" => {
                item.r#type = ItemType::ItemFileChange as i32;
                for c in im.array(o, "changes") {
                    match c {
                        Value::Object(c) => {
                            item.changes.push(FileChange {
                                path: im.string(c, "path"),
                                kind: im.string(c, "kind"),
                            });
                            im.only(c, &["path", "kind"]);
                        }
                        _ => im.unknown = true,
                    }
                }
                item.status = im.string(o, "status");
                &["id", "type", "changes", "status"]
            }
            "mcp_tool_call" => {
                item.r#type = ItemType::ItemMcpToolCall as i32;
                item.status = im.string(o, "status");
                // server, tool, arguments, result, error have no seed field.
                &["id", "type", "status"]
            }
            "web_search" => {
                item.r#type = ItemType::ItemWebSearch as i32;
                item.query = im.string(o, "query");
                &["id", "type", "query"]
            }
            "todo_list" => {
                item.r#type = ItemType::ItemTodoList as i32;
                for t in im.array(o, "items") {
                    match t {
                        Value::Object(t) => {
                            item.items.push(TodoItem {
                                text: im.string(t, "text"),
                                completed: im.bool(t, "completed"),
                            });
                            im.only(t, &["text", "completed"]);
                        }
                        _ => im.unknown = true,
                    }
                }
                &["id", "type", "items"]
            }
            "error" => {
                item.r#type = ItemType::ItemError as i32;
                item.text = im.string(o, "message");
                &["id", "type", "message"]
            }
            _ => {
                item.r#type = ItemType::Unspecified as i32;
                im.unknown = true;
                &["id", "type"]
            }
        };
        im.only(o, known);
        if im.unknown {
            self.unknown = true;
            item.raw = match top_level_value_span(line, "item") {
                Some(span) => line[span].to_vec(),
                // A key spelled with escapes: the re-encoded item (same JSON, keys sorted).
                None => serde_json::to_vec(o).unwrap_or_default(),
            };
        }
        Some(item)
    }
}

/// The byte range of the value of `key` in the top-level object of `json` (which must be
/// valid JSON; a duplicated key gives its last value, as serde_json does). `None` if the key
/// is not there spelled plainly.
fn top_level_value_span(json: &[u8], key: &str) -> Option<std::ops::Range<usize>> {
    let mut i = skip_ws(json, 0);
    if json.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    let mut found = None;
    loop {
        i = skip_ws(json, i);
        match json.get(i)? {
            b'}' => return found,
            b',' => {
                i += 1;
                continue;
            }
            b'"' => {}
            _ => return None,
        }
        let key_end = skip_string(json, i)?;
        let this_key = &json[i + 1..key_end - 1];
        i = skip_ws(json, key_end);
        if json.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(json, i + 1);
        let start = i;
        i = skip_value(json, i)?;
        if this_key == key.as_bytes() {
            found = Some(start..i);
        }
    }
}

fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while s.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// `s[i]` is `"`: the index just past the closing quote.
fn skip_string(s: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        match s.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// The index just past the value starting at `s[i]`.
fn skip_value(s: &[u8], mut i: usize) -> Option<usize> {
    match s.get(i)? {
        b'"' => skip_string(s, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            loop {
                match s.get(i)? {
                    b'"' => {
                        i = skip_string(s, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            while s
                .get(i)
                .is_some_and(|&b| b != b',' && b != b'}' && b != b']' && !b.is_ascii_whitespace())
            {
                i += 1;
            }
            Some(i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real `codex exec --json` transcript (codex 0.5x), one turn that lists files, edits one,
    /// keeps a plan and answers.
    const TRANSCRIPT: &str = r#"{"type":"thread.started","thread_id":"0199a213-81c0-7800-8aa1-bbab2a035a53"}
{"type":"turn.started"}
{"type":"item.completed","item":{"id":"item_0","type":"reasoning","text":"**Listing the repository**"}}
{"type":"item.started","item":{"id":"item_1","type":"todo_list","items":[{"text":"Inspect the repo","completed":false},{"text":"Fix the typo","completed":false}]}}
{"type":"item.started","item":{"id":"item_2","type":"command_execution","command":"bash -lc ls","aggregated_output":"","exit_code":null,"status":"in_progress"}}
{"type":"item.completed","item":{"id":"item_2","type":"command_execution","command":"bash -lc ls","aggregated_output":"Cargo.toml\nREADME.md\nsrc\n","exit_code":0,"status":"completed"}}
{"type":"item.updated","item":{"id":"item_1","type":"todo_list","items":[{"text":"Inspect the repo","completed":true},{"text":"Fix the typo","completed":false}]}}
{"type":"item.completed","item":{"id":"item_3","type":"file_change","changes":[{"path":"/repo/README.md","kind":"update"},{"path":"/repo/NOTES.md","kind":"add"}],"status":"completed"}}
{"type":"item.completed","item":{"id":"item_4","type":"web_search","query":"rust trim_ascii"}}
{"type":"item.completed","item":{"id":"item_5","type":"agent_message","text":"Fixed the typo in README.md."}}
{"type":"turn.completed","usage":{"input_tokens":24763,"cached_input_tokens":24448,"output_tokens":122}}"#;

    fn events(transcript: &str) -> Vec<ExecEvent> {
        transcript.lines().map(|l| map_line(l.as_bytes())).collect()
    }

    #[test]
    fn a_known_transcript_maps_field_by_field_without_raw() {
        let ev = events(TRANSCRIPT);
        assert_eq!(ev.len(), 11);
        for e in &ev {
            assert!(e.raw.is_empty(), "no unknown fields: {e:?}");
            if let Some(i) = &e.item {
                assert!(i.raw.is_empty(), "{i:?}");
            }
        }
        assert_eq!(ev[0].r#type(), EventType::EventThreadStarted);
        assert_eq!(ev[0].thread_id, "0199a213-81c0-7800-8aa1-bbab2a035a53");
        assert_eq!(ev[1].r#type(), EventType::EventTurnStarted);
        let reasoning = ev[2].item.as_ref().unwrap();
        assert_eq!(ev[2].r#type(), EventType::EventItemCompleted);
        assert_eq!(reasoning.r#type(), ItemType::ItemReasoning);
        assert_eq!(reasoning.text, "**Listing the repository**");
        let todo = ev[3].item.as_ref().unwrap();
        assert_eq!(ev[3].r#type(), EventType::EventItemStarted);
        assert_eq!(todo.r#type(), ItemType::ItemTodoList);
        assert_eq!(todo.items.len(), 2);
        assert!(!todo.items[0].completed);
        let started = ev[4].item.as_ref().unwrap();
        assert_eq!(started.status, "in_progress");
        assert_eq!(started.exit_code, 0, "null exit code is unset");
        let cmd = ev[5].item.as_ref().unwrap();
        assert_eq!(cmd.r#type(), ItemType::ItemCommandExecution);
        assert_eq!(cmd.id, "item_2");
        assert_eq!(cmd.command, "bash -lc ls");
        assert_eq!(cmd.aggregated_output, "Cargo.toml\nREADME.md\nsrc\n");
        assert_eq!(cmd.status, "completed");
        assert_eq!(ev[6].r#type(), EventType::EventItemUpdated);
        assert!(ev[6].item.as_ref().unwrap().items[0].completed);
        let fc = ev[7].item.as_ref().unwrap();
        assert_eq!(fc.r#type(), ItemType::ItemFileChange);
        assert_eq!(
            fc.changes,
            vec![
                FileChange {
                    path: "/repo/README.md".into(),
                    kind: "update".into()
                },
                FileChange {
                    path: "/repo/NOTES.md".into(),
                    kind: "add".into()
                }
            ]
        );
        assert_eq!(ev[8].item.as_ref().unwrap().query, "rust trim_ascii");
        assert_eq!(
            ev[9].item.as_ref().unwrap().r#type(),
            ItemType::ItemAgentMessage
        );
        let usage = ev[10].usage.as_ref().unwrap();
        assert_eq!(
            (
                usage.input_tokens,
                usage.cached_input_tokens,
                usage.output_tokens
            ),
            (24763, 24448, 122)
        );
    }

    #[test]
    fn unknown_fields_keep_the_whole_line_and_the_item_bytes() {
        let line = br#"{"type":"item.completed","item":{"id":"item_9","type":"command_execution","command":"ls","aggregated_output":"x","exit_code":2,"status":"failed","duration_ms":31,"cwd":"/r"},"ts":"2025-10-01T00:00:00Z"}"#;
        let e = map_line(line);
        assert_eq!(e.raw, line.to_vec());
        let item = e.item.unwrap();
        assert_eq!(item.exit_code, 2);
        assert_eq!(item.status, "failed");
        assert_eq!(
            item.raw,
            br#"{"id":"item_9","type":"command_execution","command":"ls","aggregated_output":"x","exit_code":2,"status":"failed","duration_ms":31,"cwd":"/r"}"#.to_vec()
        );
    }

    #[test]
    fn an_unknown_field_only_at_the_top_leaves_the_item_raw_empty() {
        let line = br#"{"type":"item.completed","seq":4,"item":{"id":"i","type":"agent_message","text":"hi"}}"#;
        let e = map_line(line);
        assert_eq!(e.raw, line.to_vec());
        assert!(e.item.unwrap().raw.is_empty());
    }

    #[test]
    fn usage_is_parsed_leniently_and_extra_counters_are_kept() {
        let line = br#"{"type":"turn.completed","usage":{"input_tokens":10,"cached_input_tokens":null,"output_tokens":3.0,"reasoning_output_tokens":64}}"#;
        let e = map_line(line);
        let u = e.usage.unwrap();
        assert_eq!(
            (u.input_tokens, u.cached_input_tokens, u.output_tokens),
            (10, 0, 3)
        );
        assert_eq!(e.raw, line.to_vec(), "reasoning_output_tokens has no field");

        let e = map_line(br#"{"type":"turn.completed","usage":{"input_tokens":"12","output_tokens":99999999999}}"#);
        let u = e.usage.unwrap();
        assert_eq!(u.input_tokens, 12);
        assert_eq!(u.output_tokens, i32::MAX, "clamped, original in raw");
        assert!(!e.raw.is_empty());

        let e = map_line(br#"{"type":"turn.completed"}"#);
        assert!(e.usage.is_none() && e.raw.is_empty());
    }

    #[test]
    fn failures_and_errors() {
        let e = map_line(br#"{"type":"turn.failed","error":{"message":"stream disconnected before completion"}}"#);
        assert_eq!(e.r#type(), EventType::EventTurnFailed);
        assert_eq!(
            e.error.unwrap().message,
            "stream disconnected before completion"
        );
        assert!(e.raw.is_empty());

        let e = map_line(br#"{"type":"error","message":"Reconnecting... 1/5"}"#);
        assert_eq!(e.r#type(), EventType::EventError);
        assert_eq!(e.message, "Reconnecting... 1/5");
        assert_eq!(e.error.unwrap().message, "Reconnecting... 1/5");

        let e = map_line(
            br#"{"type":"item.completed","item":{"id":"item_7","type":"error","message":"command timed out"}}"#,
        );
        let item = e.item.unwrap();
        assert_eq!(item.r#type(), ItemType::ItemError);
        assert_eq!(item.text, "command timed out");
        assert!(e.raw.is_empty());
    }

    #[test]
    fn mcp_tool_calls_keep_what_has_no_field() {
        let line = br#"{"type":"item.started","item":{"id":"item_2","type":"mcp_tool_call","server":"docs","tool":"search","arguments":{"q":"x"},"result":null,"error":null,"status":"in_progress"}}"#;
        let e = map_line(line);
        let item = e.item.unwrap();
        assert_eq!(item.r#type(), ItemType::ItemMcpToolCall);
        assert_eq!(item.status, "in_progress");
        assert_eq!(e.raw, line.to_vec());
        let v: Value = serde_json::from_slice(&item.raw).unwrap();
        assert_eq!(v["server"], "docs");
        assert_eq!(v["arguments"]["q"], "x");
    }

    #[test]
    fn unknown_event_and_item_types_are_unspecified_with_raw() {
        let line = br#"{"type":"turn.diff","diff":"--- a\n+++ b"}"#;
        let e = map_line(line);
        assert_eq!(e.r#type(), EventType::Unspecified);
        assert_eq!(e.raw, line.to_vec());

        let line = br#"{"type":"item.completed","item":{"id":"item_1","type":"image_view","path":"a.png"}}"#;
        let e = map_line(line);
        assert_eq!(e.r#type(), EventType::EventItemCompleted);
        let item = e.item.unwrap();
        assert_eq!(item.r#type(), ItemType::Unspecified);
        assert_eq!(item.id, "item_1");
        assert_eq!(
            item.raw,
            br#"{"id":"item_1","type":"image_view","path":"a.png"}"#.to_vec()
        );
        assert_eq!(e.raw, line.to_vec());

        let e = map_line(br#"{"no_type":true}"#);
        assert_eq!(e.r#type(), EventType::Unspecified);
        assert!(!e.raw.is_empty());
    }

    #[test]
    fn non_json_lines_become_messages() {
        for line in [
            &b"Reading prompt from stdin..."[..],
            b"[1, 2]",
            b"{\"type\":",
            b"\xff\xfe not utf8",
        ] {
            let e = map_line(line);
            assert_eq!(e.r#type(), EventType::Unspecified);
            assert_eq!(e.raw, line.to_vec());
            assert_eq!(e.message, String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn wrong_types_are_defaults_plus_raw() {
        let line = br#"{"type":"item.completed","item":{"id":"i","type":"todo_list","items":[{"text":"a","completed":"yes"},7]}}"#;
        let e = map_line(line);
        let item = e.item.unwrap();
        assert_eq!(item.items.len(), 1);
        assert!(!item.items[0].completed);
        assert!(!item.raw.is_empty() && !e.raw.is_empty());

        let e = map_line(br#"{"type":"thread.started","thread_id":42}"#);
        assert_eq!(e.thread_id, "");
        assert!(!e.raw.is_empty());
    }

    #[test]
    fn the_item_span_survives_escapes_nesting_and_whitespace() {
        let json =
            br#" { "a" : "x\"}{" , "item" : { "t" : [1, {"u": "]\\"}], "n": null } , "z": 1 } "#;
        let span = top_level_value_span(json, "item").unwrap();
        assert_eq!(&json[span], br#"{ "t" : [1, {"u": "]\\"}], "n": null }"#);
        assert_eq!(
            top_level_value_span(br#"{"item":1,"item":[2]}"#, "item").map(|r| r.start),
            Some(17)
        );
        assert_eq!(top_level_value_span(br#"{"x":1}"#, "item"), None);
        // Escaped key: falls back to re-encoding, still valid JSON.
        let e = map_line(br#"{"type":"item.completed","\u0069tem":{"id":"i","type":"x"}}"#);
        let raw = e.item.unwrap().raw;
        assert!(serde_json::from_slice::<Value>(&raw).is_ok());
    }
}
