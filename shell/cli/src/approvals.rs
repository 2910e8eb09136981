//! `paddock approvals`, `paddock approve ID`, `paddock deny ID [--reason]`,
//! `paddock answer ID TEXT`: requests for a human, from the command line.

use paddock_proto::obey::local::v1 as pb;
use serde_json::{json, Value};

use super::view::{age, table};
use super::{client, print_json, Ctx, Result};

/// What `paddock approvals` shows.
pub struct ListArgs {
    pub session: Option<String>,
    pub watch: bool,
    pub all: bool,
    pub limit: i32,
}

pub fn kind_name(n: i32) -> &'static str {
    match pb::ApprovalKind::try_from(n) {
        Ok(pb::ApprovalKind::Permission) => "permission",
        Ok(pb::ApprovalKind::Question) => "question",
        Ok(pb::ApprovalKind::ClientTool) => "client-tool",
        _ => "unknown",
    }
}

pub fn state_name(n: i32) -> &'static str {
    match pb::ApprovalState::try_from(n) {
        Ok(pb::ApprovalState::Pending) => "pending",
        Ok(pb::ApprovalState::Approved) => "approved",
        Ok(pb::ApprovalState::Denied) => "denied",
        Ok(pb::ApprovalState::Answered) => "answered",
        Ok(pb::ApprovalState::Expired) => "expired",
        Ok(pb::ApprovalState::Cancelled) => "cancelled",
        _ => "unknown",
    }
}

pub fn approval_json(a: &pb::Approval) -> Value {
    let ts = |t: &Option<prost_types::Timestamp>| {
        t.as_ref().map(|t| super::view::rfc3339(t.seconds, t.nanos))
    };
    json!({
        "id": a.id,
        "session_id": a.session_id,
        "kind": kind_name(a.kind),
        "tool_name": a.tool_name,
        "input": serde_json::from_str::<Value>(&a.input_json).unwrap_or(Value::String(a.input_json.clone())),
        "summary": a.summary,
        "state": state_name(a.state),
        "created_at": ts(&a.created_at),
        "expires_at": ts(&a.expires_at),
        "resolved_at": ts(&a.resolved_at),
        "answer": a.answer,
        "allowed": a.allowed,
        "resolved_by": a.resolved_by,
        "turn": a.turn,
    })
}

/// One line for a human: what is asked, and how to answer (agent text made safe for the
/// terminal).
pub fn approval_line(a: &pb::Approval) -> String {
    crate::text::for_terminal(&approval_line_raw(a)).into_owned()
}

fn approval_line_raw(a: &pb::Approval) -> String {
    match pb::ApprovalState::try_from(a.state) {
        Ok(pb::ApprovalState::Pending) => {
            let how = match pb::ApprovalKind::try_from(a.kind) {
                Ok(pb::ApprovalKind::Permission) => {
                    format!("paddock approve {0} | paddock deny {0}", a.id)
                }
                _ => format!("paddock answer {} \"…\"", a.id),
            };
            format!("[{}] {} — {}  ({how})", kind_name(a.kind), a.summary, a.id)
        }
        _ => format!(
            "[{}] {} — {} {} by {}{}",
            kind_name(a.kind),
            a.summary,
            a.id,
            state_name(a.state),
            a.resolved_by,
            if a.answer.is_empty() {
                String::new()
            } else {
                format!(": {}", a.answer)
            }
        ),
    }
}

/// A request's summary in the approvals table (the full one is in `--json`).
const SUMMARY_MAX_BYTES: usize = 60;

pub async fn list(ctx: &Ctx, args: ListArgs) -> Result<()> {
    let mut c = client::connect(ctx).await?;
    let session_id = match args.session {
        Some(s) => super::resolve(&mut c, &s).await?,
        None => String::new(),
    };
    if args.watch {
        return watch(ctx, &mut c, session_id).await;
    }
    let list = c
        .list_approvals(pb::ListApprovalsRequest {
            session_id,
            include_resolved: args.all,
            limit: args.limit,
        })
        .await?
        .into_inner()
        .approvals;
    if ctx.json {
        print_json(&json!(list.iter().map(approval_json).collect::<Vec<_>>()))?;
        return Ok(());
    }
    if list.is_empty() {
        outln!(
            "{}",
            if args.all {
                "no approvals"
            } else {
                "nothing is waiting for you"
            }
        )?;
        return Ok(());
    }
    let now = crate::paths::now_ms();
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|a| {
            vec![
                a.id.clone(),
                a.session_id.clone(),
                kind_name(a.kind).to_string(),
                state_name(a.state).to_string(),
                crate::text::for_terminal(&crate::text::truncate(&a.summary, SUMMARY_MAX_BYTES))
                    .into_owned(),
                age(&a.created_at, now),
            ]
        })
        .collect();
    outln!(
        "{}",
        table(&["ID", "SESSION", "KIND", "STATE", "WHAT", "AGE"], &rows)
    )?;
    Ok(())
}

/// `approvals --watch`: the open requests, then each request as it is opened or resolved, a
/// line each (JSON lines with `--json`), until Ctrl-C or the daemon goes. On a terminal the
/// bell rings once for each new request.
async fn watch(ctx: &Ctx, c: &mut super::Client, session_id: String) -> Result<()> {
    use std::io::IsTerminal;
    let mut stream = c
        .watch_approvals(pb::WatchApprovalsRequest { session_id })
        .await?
        .into_inner();
    let bell = std::io::stdout().is_terminal();
    let mut seen = std::collections::BTreeSet::new();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    if !ctx.json {
        outln!("waiting for requests (Ctrl-C ends)…")?;
    }
    loop {
        let a = tokio::select! {
            a = stream.message() => match a? {
                Some(a) => a,
                None => return Err(super::Error::Protocol("the daemon ended the stream (is it shutting down?)".into())),
            },
            _ = &mut ctrl_c => return Ok(()),
        };
        let new = a.state == pb::ApprovalState::Pending as i32 && seen.insert(a.id.clone());
        if ctx.json {
            outln!("{}", approval_json(&a))?;
        } else {
            outln!("{}", approval_line(&a))?;
        }
        if new && bell && !ctx.json {
            super::output::bell();
        }
    }
}

/// `approve`, `deny`, `answer`.
pub async fn resolve(
    ctx: &Ctx,
    id: String,
    decision: pb::ApprovalDecision,
    text: String,
) -> Result<()> {
    let mut c = client::connect(ctx).await?;
    // The id, or a unique prefix of an open request's id (what the table shows can be cut).
    let open = c
        .list_approvals(pb::ListApprovalsRequest {
            session_id: String::new(),
            include_resolved: false,
            limit: 1000,
        })
        .await?
        .into_inner()
        .approvals;
    let target = match open.iter().find(|a| a.id == id) {
        Some(a) => Some(a),
        None => {
            let matching: Vec<&pb::Approval> =
                open.iter().filter(|a| a.id.starts_with(&id)).collect();
            if matching.len() > 1 {
                let ids: Vec<&str> = matching.iter().map(|a| a.id.as_str()).collect();
                return Err(super::Error::Usage(format!(
                    "\"{id}\" matches {} open requests: {}; give more of the id",
                    matching.len(),
                    ids.join(", ")
                )));
            }
            matching.first().copied()
        }
    };
    if decision == pb::ApprovalDecision::Approve
        && target.is_some_and(|a| a.kind == pb::ApprovalKind::Question as i32)
    {
        let qid = target.map_or(id.as_str(), |a| a.id.as_str());
        return Err(super::Error::Usage(format!(
            "{qid} is a question, not a permission: answer it with `paddock answer {qid} <text>`"
        )));
    }
    // Unknown (or already resolved): the daemon says which (OBEY-2040 / 2041).
    let id = target.map_or(id.clone(), |a| a.id.clone());
    let a = c
        .resolve_approval(pb::ResolveApprovalRequest {
            approval_id: id,
            decision: decision as i32,
            text,
            is_error: false,
            resolved_by: "cli".into(),
        })
        .await?
        .into_inner();
    if ctx.json {
        print_json(&approval_json(&a))?;
    } else {
        outln!("{}", approval_line(&a))?;
    }
    Ok(())
}
