//! Tables and JSON for the CLI.

use paddock_core::{ActivityKind, Provider, Status};
use paddock_proto::obey::local::v1 as pb;
use serde_json::{json, Value};

pub fn status_name(n: i32) -> &'static str {
    Status::from_number(n)
        .map(|s| s.name())
        .unwrap_or("UNSPECIFIED")
}

pub fn provider_name(n: i32) -> &'static str {
    Provider::from_number(n)
        .map(|p| p.name())
        .unwrap_or("unspecified")
}

pub fn activity_name(n: i32) -> &'static str {
    ActivityKind::from_number(n)
        .map(|k| k.name())
        .unwrap_or("UNSPECIFIED")
}

fn ts(t: &Option<prost_types::Timestamp>) -> Value {
    match t {
        Some(t) => Value::String(rfc3339(t.seconds, t.nanos)),
        None => Value::Null,
    }
}

/// RFC 3339 in UTC, millisecond precision, without a date crate.
pub fn rfc3339(seconds: i64, nanos: i32) -> String {
    let days = seconds.div_euclid(86_400);
    let secs = seconds.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60,
        nanos / 1_000_000
    )
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
        "driver": super::latis::DRIVERS[0],
        "state": super::latis::state_of(s),
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

/// Renders rows as an aligned table.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    for r in rows {
        out.push('\n');
        out.push_str(&line(r.clone()));
    }
    out
}

/// "3s", "5m", "2h", "4d": how long ago `t` was.
pub fn age(t: &Option<prost_types::Timestamp>, now_ms: u64) -> String {
    let Some(t) = t else { return "-".into() };
    let then = (t.seconds.max(0) as u64) * 1000;
    let s = now_ms.saturating_sub(then) / 1000;
    match s {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
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

pub fn activity_line(a: &pb::SessionActivityEvent) -> String {
    let kind = activity_name(a.r#type);
    let mut body = a.content.replace('\n', " ⏎ ");
    if body.chars().count() > 160 {
        body = body.chars().take(157).collect::<String>() + "...";
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_render() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(1_771_425_000, 5_000_000),
            "2026-02-18T14:30:00.005Z"
        );
    }

    #[test]
    fn tables_align() {
        let t = table(&["ID", "STATUS"], &[vec!["a".into(), "RUNNING".into()]]);
        assert_eq!(t, "ID  STATUS\na   RUNNING");
    }
}
