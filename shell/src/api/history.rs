//! A session's history: its stored user messages and activities as one conversation, in
//! order — each turn's user message, then what the agent thought, did and said in it.
//!
//! A view of the store, computed on read; nothing about it is kept twice. Claude Code repeats
//! its last words as the turn's answer (a `TEXT` then a `COMPLETION` with the same text):
//! the history shows them once.

use paddock_core::{ActivityEvent, ActivityKind, Timestamp, UserMessage};

/// Who or what an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    /// The turn's answer.
    Assistant,
    Thinking,
    ToolCall,
    ToolResult,
    /// The agent's own words between its tool calls.
    Text,
    /// A status change: paddock's note about a request, an API retry, lost output.
    Status,
    Error,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Thinking => "thinking",
            Role::ToolCall => "tool_call",
            Role::ToolResult => "tool_result",
            Role::Text => "text",
            Role::Status => "status",
            Role::Error => "error",
        }
    }

    fn of(kind: ActivityKind) -> Role {
        match kind {
            ActivityKind::Thinking => Role::Thinking,
            ActivityKind::ToolCall => Role::ToolCall,
            ActivityKind::ToolResult => Role::ToolResult,
            ActivityKind::Completion => Role::Assistant,
            ActivityKind::Error => Role::Error,
            ActivityKind::Text => Role::Text,
            ActivityKind::Status => Role::Status,
        }
    }
}

/// One entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// 0: between turns.
    pub turn: u64,
    pub role: Role,
    pub content: String,
    pub tool_name: String,
    pub tool_call_id: String,
    pub tool_success: bool,
    pub at: Timestamp,
}

/// Merges a session's user messages (in turn order) and a window of its activities (in seq
/// order). With `truncated` (older activities left out), messages of turns before the window
/// are left out too.
pub fn merge(messages: &[UserMessage], activities: &[ActivityEvent], truncated: bool) -> Vec<Item> {
    let first_turn = activities.iter().find_map(|a| a.turn);
    let mut pending = messages
        .iter()
        .filter(|m| !truncated || first_turn.is_none_or(|t| m.turn >= t))
        .peekable();
    let mut out: Vec<Item> = Vec::with_capacity(messages.len() + activities.len());
    for (i, a) in activities.iter().enumerate() {
        let turn = a.turn.unwrap_or(0);
        if a.turn.is_some() {
            while let Some(m) = pending.next_if(|m| m.turn <= turn) {
                out.push(user_item(m));
            }
        }
        let kind = a.activity.kind();
        // The answer repeated: keep only the answer.
        if kind == ActivityKind::Text {
            if let Some(next) = activities.get(i + 1) {
                if next.activity.kind() == ActivityKind::Completion
                    && next.activity.content == a.activity.content
                {
                    continue;
                }
            }
        }
        out.push(Item {
            turn,
            role: Role::of(kind),
            content: a.activity.content.clone(),
            tool_name: a.activity.tool_name.clone(),
            tool_call_id: a.activity.tool_call_id.clone(),
            tool_success: a.activity.tool_success,
            at: a.at,
        });
    }
    // Messages whose turn has no activity yet (a turn just begun).
    out.extend(pending.map(user_item));
    out
}

fn user_item(m: &UserMessage) -> Item {
    Item {
        turn: m.turn,
        role: Role::User,
        content: m.text.clone(),
        tool_name: String::new(),
        tool_call_id: String::new(),
        tool_success: false,
        at: m.at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_core::{Activity, SessionId};

    fn msg(turn: u64, text: &str) -> UserMessage {
        UserMessage {
            session: SessionId::from("s"),
            turn,
            text: text.into(),
            at: Timestamp::from_millis(turn * 10),
        }
    }

    fn act(seq: u64, turn: Option<u64>, kind: ActivityKind, text: &str) -> ActivityEvent {
        ActivityEvent {
            session: SessionId::from("s"),
            seq,
            turn,
            ends_turn: kind.ends_turn(),
            activity: Activity::new(kind, text),
            at: Timestamp::from_millis(seq),
        }
    }

    fn render(items: &[Item]) -> Vec<String> {
        items
            .iter()
            .map(|i| format!("{} {} {}", i.turn, i.role.name(), i.content))
            .collect()
    }

    #[test]
    fn turns_interleave_and_a_repeated_answer_shows_once() {
        use ActivityKind as K;
        let messages = [msg(1, "hi"), msg(2, "again"), msg(3, "pending")];
        let acts = [
            act(1, Some(1), K::Thinking, "hmm"),
            act(2, Some(1), K::ToolCall, "ls"),
            act(3, Some(1), K::ToolResult, "a b"),
            act(4, Some(1), K::Text, "Done."),
            act(5, Some(1), K::Completion, "Done."),
            act(6, None, K::Status, "between turns"),
            act(7, Some(2), K::Error, "boom"),
        ];
        assert_eq!(
            render(&merge(&messages, &acts, false)),
            [
                "1 user hi",
                "1 thinking hmm",
                "1 tool_call ls",
                "1 tool_result a b",
                "1 assistant Done.",
                "0 status between turns",
                "2 user again",
                "2 error boom",
                "3 user pending",
            ]
        );
        // A window that starts in turn 2 leaves turn 1's message out.
        assert_eq!(
            render(&merge(&messages, &acts[6..], true)),
            ["2 user again", "2 error boom", "3 user pending"]
        );
        assert!(merge(&[], &[], false).is_empty());
    }
}
