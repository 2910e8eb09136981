//! An agent's questions to the controller (`control_request`s on its stdout) as core
//! [`ProviderEvent::Ask`]s, and the core's answers as `control_response` lines for its stdin.
//!
//! Who decides is the core (the session's policy, else a human); this module only translates.
//! Three requests are understood:
//!
//! | `control_request` | kind | answer |
//! |---|---|---|
//! | `can_use_tool` for any tool but `AskUserQuestion` | permission | `allow` (input unchanged) / `deny` + message |
//! | `can_use_tool` for `AskUserQuestion` (Claude Code's question tool) | question | `allow` with `updatedInput.answers` = { question → answer } / `deny` + message |
//! | `client_tool` (paddock's own: `{"subtype":"client_tool","tool_name":…,"input":…}`) | client tool | `{"behavior":"allow"\|"deny","result":…,"is_error":…,"message":…}` |

use paddock_core::{Approval, AskKind, ProviderEvent};
use serde_json::{Map, Value};

use super::claude_stream::{control_response_allow, control_response_deny};
use super::stream_json::{self, Answer, Behavior, ControlResponse};

/// Claude Code's tool for asking the user (its input lists `questions`).
pub const QUESTION_TOOL: &str = "AskUserQuestion";
/// A request's summary is cut to this many bytes.
pub const SUMMARY_MAX: usize = 300;

/// The event for a `control_request` of `subtype`, or `None` if it is not a question for the
/// controller. `approval` is the id it gets if a human must answer.
pub fn ask_event(
    approval: String,
    request_id: String,
    subtype: &str,
    tool_name: String,
    input: &Value,
) -> Option<ProviderEvent> {
    let kind = match subtype {
        "can_use_tool" if tool_name == QUESTION_TOOL => AskKind::Question,
        "can_use_tool" => AskKind::Permission,
        "client_tool" => AskKind::ClientTool,
        _ => return None,
    };
    let summary = summary(kind, &tool_name, input);
    Some(ProviderEvent::Ask(paddock_core::Ask {
        approval,
        key: request_id,
        kind,
        tool: tool_name,
        input: input.to_string(),
        summary,
    }))
}

/// One line saying what is asked: the command a shell tool runs, the file an edit touches,
/// the questions asked, else the input in short.
pub fn summary(kind: AskKind, tool: &str, input: &Value) -> String {
    let field = |k: &str| input.get(k).and_then(Value::as_str).map(str::to_string);
    let text = match kind {
        AskKind::Question => questions(input)
            .iter()
            .map(|(q, options)| {
                if options.is_empty() {
                    q.clone()
                } else {
                    format!("{q} [{}]", options.join(" / "))
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
        _ => {
            let detail = field("command")
                .or_else(|| field("file_path"))
                .or_else(|| field("path"))
                .or_else(|| field("url"))
                .or_else(|| field("pattern"))
                .unwrap_or_else(|| match input {
                    Value::Null => String::new(),
                    Value::Object(m) if m.is_empty() => String::new(),
                    v => v.to_string(),
                });
            if detail.is_empty() {
                tool.to_string()
            } else {
                format!("{tool}: {detail}")
            }
        }
    };
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    // The summary is what a human approves: nothing in it may act on their terminal.
    let one_line = paddock_sys::text::for_terminal(&one_line).into_owned();
    if one_line.len() <= SUMMARY_MAX {
        return one_line;
    }
    format!(
        "{}…",
        paddock_sys::text::prefix(&one_line, SUMMARY_MAX - '…'.len_utf8())
    )
}

/// The questions of an `AskUserQuestion` input (or a bare `{"question": …}`), with their
/// option labels.
pub fn questions(input: &Value) -> Vec<(String, Vec<String>)> {
    let one = |q: &Value| -> Option<(String, Vec<String>)> {
        let text = q.get("question")?.as_str()?.to_string();
        let options = q
            .get("options")
            .and_then(Value::as_array)
            .map(|o| {
                o.iter()
                    .filter_map(|o| {
                        o.get("label")
                            .and_then(Value::as_str)
                            .or_else(|| o.as_str())
                            .map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some((text, options))
    };
    match input.get("questions").and_then(Value::as_array) {
        Some(list) => list.iter().filter_map(one).collect(),
        None => one(input).into_iter().collect(),
    }
}

/// The `control_response` line (no trailing newline) that tells the agent a request's outcome.
pub fn answer_line(a: &Approval) -> String {
    let input: Value = serde_json::from_str(&a.input).unwrap_or(Value::Null);
    match a.kind {
        AskKind::Permission if a.allowed => control_response_allow(&a.key, &input),
        AskKind::Question if a.allowed => {
            // Every question gets the human's answer (Claude Code reads `answers`, keyed by
            // question text).
            let mut updated = match input {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            let answers: Map<String, Value> = questions(&Value::Object(updated.clone()))
                .into_iter()
                .map(|(q, _)| (q, Value::String(a.answer.clone())))
                .collect();
            updated.insert("answers".into(), Value::Object(answers));
            control_response_allow(&a.key, &Value::Object(updated))
        }
        AskKind::Permission | AskKind::Question => {
            let message = if a.answer.is_empty() {
                format!("the user said no ({})", a.state.name())
            } else {
                a.answer.clone()
            };
            control_response_deny(&a.key, &message)
        }
        // A call through paddock's MCP server (Claude Code) is answered in MCP's terms.
        AskKind::ClientTool if a.key.starts_with("mcp:") => {
            super::mcp::answer_line(&a.key, &a.answer, a.is_error || !a.allowed)
                .unwrap_or_else(|| super::claude_stream::control_response_error(&a.key, "bad key"))
        }
        AskKind::ClientTool => stream_json::encode(&ControlResponse::success(
            &a.key,
            Answer {
                behavior: if a.allowed {
                    Behavior::Allow
                } else {
                    Behavior::Deny
                },
                updated_input: None,
                result: Some(&a.answer),
                is_error: Some(a.is_error || !a.allowed),
                // (A refusal's reason, for agents that read only `message`.)
                message: Some(if a.allowed { "" } else { &a.answer }),
            },
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_core::{ApprovalState, SessionId};
    use serde_json::json;

    fn approval(kind: AskKind, input: Value, allowed: bool, answer: &str) -> Approval {
        Approval {
            id: "a".into(),
            session: SessionId::from("s"),
            run: 1,
            key: "req_1".into(),
            kind,
            tool: "Bash".into(),
            input: input.to_string(),
            summary: String::new(),
            turn: Some(1),
            created_at: paddock_core::Timestamp::from_millis(0),
            expires_at: paddock_core::Timestamp::from_millis(1),
            state: if allowed {
                ApprovalState::Approved
            } else {
                ApprovalState::Denied
            },
            answer: answer.into(),
            is_error: false,
            allowed,
            resolved_by: "cli".into(),
            resolved_at: Some(paddock_core::Timestamp::from_millis(1)),
        }
    }

    #[test]
    fn requests_become_asks_with_a_summary() {
        let e = ask_event(
            "ap".into(),
            "req_1".into(),
            "can_use_tool",
            "Bash".into(),
            &json!({"command": "rm -rf\nbuild", "description": "clean"}),
        );
        let Some(ProviderEvent::Ask(paddock_core::Ask {
            kind, summary, key, ..
        })) = e
        else {
            panic!("{e:?}")
        };
        assert_eq!((kind, key.as_str()), (AskKind::Permission, "req_1"));
        assert_eq!(summary, "Bash: rm -rf build");
        let q = json!({"questions":[{"question":"Which DB?","header":"DB","options":[{"label":"PG 14"},{"label":"PG 15"}],"multiSelect":false}]});
        let Some(ProviderEvent::Ask(paddock_core::Ask { kind, summary, .. })) = ask_event(
            "q".into(),
            "r".into(),
            "can_use_tool",
            QUESTION_TOOL.into(),
            &q,
        ) else {
            panic!()
        };
        assert_eq!(kind, AskKind::Question);
        assert_eq!(summary, "Which DB? [PG 14 / PG 15]");
        assert!(ask_event("x".into(), "r".into(), "hook_callback", String::new(), &q).is_none());
        let long = json!({"command": "x".repeat(1000)});
        assert!(super::summary(AskKind::Permission, "Bash", &long).len() <= SUMMARY_MAX);
    }

    #[test]
    fn answers_are_control_responses() {
        let input = json!({"command": "ls"});
        let line = answer_line(&approval(AskKind::Permission, input.clone(), true, ""));
        assert_eq!(line, control_response_allow("req_1", &input));
        let line = answer_line(&approval(AskKind::Permission, input, false, "not now"));
        assert_eq!(line, control_response_deny("req_1", "not now"));
        let q = json!({"questions":[{"question":"Which DB?","options":[]}]});
        let line: Value =
            serde_json::from_str(&answer_line(&approval(AskKind::Question, q, true, "PG 15")))
                .unwrap();
        assert_eq!(
            line["response"]["response"]["updatedInput"]["answers"],
            json!({"Which DB?": "PG 15"})
        );
        let line: Value = serde_json::from_str(&answer_line(&approval(
            AskKind::ClientTool,
            json!({}),
            true,
            "42 files",
        )))
        .unwrap();
        assert_eq!(line["response"]["response"]["result"], "42 files");
        assert_eq!(line["response"]["response"]["is_error"], false);
    }
}
