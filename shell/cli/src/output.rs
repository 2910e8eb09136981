//! The CLI's JSON and one-line renderings of sessions, activities, history and campaigns
//! (names, times and tables come from [`super::view`]).

use paddock_core::ActivityKind;
use paddock_proto::obey::local::v1 as pb;
use serde_json::{json, Value};

use super::view::{activity_name, driver_of, provider_name, rfc3339, state_of, status_name};

fn ts(t: &Option<prost_types::Timestamp>) -> Value {
    match t {
        Some(t) => Value::String(rfc3339(t.seconds, t.nanos)),
        None => Value::Null,
    }
}

/// Writes to standard output ([`outln!`] and [`out!`]): a closed pipe is
/// [`Error::StdoutClosed`](crate::Error::StdoutClosed), any other failure an I/O error.
pub(crate) fn write_out(text: std::fmt::Arguments) -> crate::Result<()> {
    use std::io::Write;
    std::io::stdout()
        .lock()
        .write_fmt(text)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::BrokenPipe => crate::Error::StdoutClosed,
            _ => crate::Error::Io {
                what: "cannot write to standard output".into(),
                source: e,
            },
        })
}

/// The terminal bell: for a person who should look (nothing when stdout is not a terminal).
pub fn bell() {
    use std::io::{IsTerminal, Write};
    let mut out = std::io::stdout();
    if out.is_terminal() {
        let _ = out.write_all(b"\x07").and_then(|()| out.flush());
    }
}

pub fn session_json(s: &pb::SessionInfo) -> Value {
    json!({
        "id": s.id,
        "campaign_id": s.campaign_id,
        "provider": provider_name(s.provider),
        "model": s.model,
        "agent_name": s.agent_name,
        "status": status_name(s.status),
        "festival_id": s.festival_id,
        "task_id": s.task_id,
        "tokens_input": s.tokens_input,
        "tokens_output": s.tokens_output,
        "max_tokens": s.max_tokens,
        "pid": s.pid,
        "restart_count": s.restart_count,
        "created_at": ts(&s.created_at),
        "started_at": ts(&s.started_at),
        "last_activity_at": ts(&s.last_activity_at),
        "ended_at": ts(&s.ended_at),
        "error_code": s.error_code,
        "error_message": s.error_message,
        "working_dir": s.working_dir,
        "provider_config": s.provider_config,
        "unrecognized_lines": s.unrecognized_lines,
        "pending_approvals": s.pending_approvals,
        "initial_message": s.initial_message,
        "turns_completed": s.turns_completed,
        "driver": driver_of(s),
        "worktree": s.environment_spec.as_ref().is_some_and(|e| e.worktree),
        "network": s.environment_spec.as_ref().is_some_and(|e| e.network),
        "environment_state": s.environment_state,
        "disconnected": s.disconnected,
        "state": state_of(s),
    })
}

pub fn activity_json(a: &pb::SessionActivityEvent) -> Value {
    json!({
        "session_id": a.session_id,
        "seq": a.seq,
        "type": activity_name(a.r#type),
        "content": a.content,
        "tool_name": a.tool_name,
        "tool_call_id": a.tool_call_id,
        "tool_success": a.tool_success,
        "tokens_input": a.tokens_input,
        "tokens_output": a.tokens_output,
        "timestamp": ts(&a.timestamp),
    })
}

pub fn status_event_json(e: &pb::SessionStatusEvent) -> Value {
    json!({
        "session_id": e.session_id,
        "seq": e.seq,
        "previous_status": status_name(e.previous_status),
        "new_status": status_name(e.new_status),
        "message": e.message,
        "timestamp": ts(&e.timestamp),
    })
}

pub fn campaign_json(c: &pb::Campaign) -> Value {
    json!({ "id": c.id, "name": c.name, "root_path": c.root_path, "created_at": ts(&c.created_at) })
}

/// One activity as a line for a terminal.
pub fn history_json(i: &pb::HistoryItem) -> Value {
    json!({
        "turn": i.turn,
        "role": i.role,
        "content": i.content,
        "tool_name": i.tool_name,
        "tool_call_id": i.tool_call_id,
        "tool_success": i.tool_success,
        "at": ts(&i.timestamp),
    })
}

/// `[3] user      Fix the tests` / `[3] tool_call Bash: cargo test` (multi-line content
/// indented under its entry).
pub fn history_line(i: &pb::HistoryItem) -> String {
    let head = match (i.role.as_str(), i.tool_name.is_empty()) {
        ("tool_call", false) => format!("tool_call {}:", i.tool_name),
        ("tool_result", false) => format!(
            "tool_result {} {}:",
            i.tool_name,
            if i.tool_success { "ok" } else { "FAILED" }
        ),
        (role, _) => format!("{role}:"),
    };
    let body = i.content.trim_end().replace('\n', "\n      ");
    crate::text::for_terminal(&format!("[{}] {head} {body}", i.turn)).into_owned()
}

/// The most columns an activity's text takes in `send` / `watch` output.
const ACTIVITY_WIDTH_MAX: usize = 160;

pub fn activity_line(a: &pb::SessionActivityEvent) -> String {
    let kind = activity_name(a.r#type);
    let body = a.content.replace('\n', " ⏎ ");
    let body = super::view::fit(&body, ACTIVITY_WIDTH_MAX);
    let tool = if a.tool_name.is_empty() {
        String::new()
    } else {
        format!("{} ", a.tool_name)
    };
    let ok = match ActivityKind::from_number(a.r#type) {
        Some(ActivityKind::ToolResult) if a.tool_success => "ok ",
        Some(ActivityKind::ToolResult) => "FAILED ",
        _ => "",
    };
    let tokens = if a.tokens_input > 0 || a.tokens_output > 0 {
        format!(
            "  (+{} in / +{} out tokens)",
            a.tokens_input, a.tokens_output
        )
    } else {
        String::new()
    };
    crate::text::for_terminal(&format!("{kind:<11} {tool}{ok}{body}{tokens}")).into_owned()
}

/// Awaits `fut`; on a terminal, once it has taken a second, says on stderr what is being
/// waited for and for how long (updated each second, erased at the end). Nothing otherwise.
pub async fn with_progress<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    use std::io::{IsTerminal, Write};
    if !std::io::stderr().is_terminal() {
        return fut.await;
    }
    tokio::pin!(fut);
    let start = tokio::time::Instant::now();
    let second = std::time::Duration::from_secs(1);
    let mut tick = tokio::time::interval_at(start + second, second);
    let mut shown = false;
    loop {
        tokio::select! {
            out = &mut fut => {
                if shown {
                    eprint!("\r\x1b[2K");
                    let _ = std::io::stderr().flush();
                }
                return out;
            }
            _ = tick.tick() => {
                shown = true;
                eprint!("\r{what}… {}s", start.elapsed().as_secs());
                let _ = std::io::stderr().flush();
            }
        }
    }
}
