//! `paddock session attach ID`: a line-based conversation with a session, as latis has it.
//!
//! It prints `[Session <id> - <state>]`, the recent history (GetHistory), then what happens
//! live: the session's activity (WatchActivity from the history's last seq, so nothing is
//! missed or shown twice) and its state changes (WatchSession). A line typed is sent as a
//! message (SendMessage); while the agent is busy, lines wait in a bounded queue and go out,
//! in order, when its turn ends. EOF on stdin (Ctrl-D) or Ctrl-C detaches: the session goes
//! on (at EOF, once the line already on its way is sent: `see_through`).
//!
//! Lines are read by [`super::line_input`] (a line editor on a terminal, the output printed
//! above the line being typed), on a thread of its own. A SendMessage stream is drained by a task of its own: its
//! activities are printed from the WatchActivity stream, which every attached client shares.

use std::collections::VecDeque;

use paddock_core::{ActivityKind, ErrorCode, Status};
use paddock_proto::obey::local::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

use super::client::Client;
use super::line_input::{Screen, Typed, LINE_MAX_BYTES};
use super::view::{latis_state, one_line};
use super::Error;
use crate::transport::obey_code;

/// History entries shown on attach.
pub const HISTORY_MAX_ENTRIES: i32 = 20;
/// Lines that may wait for the agent's turn to end; past it a line is refused, loudly.
pub const QUEUE_MAX_LINES: usize = 16;
/// Tool calls, tool results and thinking are shown cut to this many characters.
const DETAIL_MAX_CHARS: usize = 160;
/// How often the live activity stream is reopened (after it fell behind) before giving up.
const REOPEN_MAX: u32 = 8;
/// How often a line refused as "busy" is retried at once when the session says it is idle
/// again (another client's turn ended in between) before waiting for the next turn's end.
const BUSY_RETRIES_MAX: u32 = 3;

/// One conversation entry as attach prints it: `You: …`, `Agent: …`, `Agent (thinking): …`,
/// `  [Bash] cargo test`, `  [Bash ok] …`, `Error: …`. `role` is a history role (user,
/// assistant, thinking, text, tool_call, tool_result, status, error). A `status` is a status
/// change, not the agent's words (paddock's note that the agent waits for a human, an API
/// retry), shown as `[…]`.
pub fn entry(role: &str, tool: &str, success: bool, content: &str) -> String {
    crate::text::for_terminal(&entry_raw(role, tool, success, content)).into_owned()
}

fn entry_raw(role: &str, tool: &str, success: bool, content: &str) -> String {
    let text = content.trim_end();
    match role {
        "user" => format!("You: {text}"),
        // A status change (paddock's note about a request, an API retry): not the agent's words.
        "status" => format!("[{}]", one_line(text, DETAIL_MAX_CHARS * 2)),
        "assistant" | "text" => format!("Agent: {text}"),
        "thinking" => format!("Agent (thinking): {}", one_line(text, DETAIL_MAX_CHARS)),
        "tool_call" => format!("  [{tool}] {}", one_line(text, DETAIL_MAX_CHARS)),
        "tool_result" => format!(
            "  [{tool} {}] {}",
            if success { "ok" } else { "FAILED" },
            one_line(text, DETAIL_MAX_CHARS)
        ),
        "error" => format!("Error: {text}"),
        other => format!("{other}: {text}"),
    }
}

/// The history role of an activity.
pub fn role_of(kind: ActivityKind) -> &'static str {
    match kind {
        ActivityKind::Thinking => "thinking",
        ActivityKind::ToolCall => "tool_call",
        ActivityKind::ToolResult => "tool_result",
        ActivityKind::Completion => "assistant",
        ActivityKind::Error => "error",
        ActivityKind::Text => "text",
        ActivityKind::Status => "status",
    }
}

/// Open requests attach keeps track of (the core allows 16 per session); past it a request
/// is left to `paddock approvals`.
pub const APPROVALS_MAX: usize = 64;

/// How long a request waits before attach shows it: what the agent did before it asked (its
/// tool call) comes on the activity stream, which may be a moment behind the approvals one,
/// and is shown first.
const ASK_SETTLE: std::time::Duration = std::time::Duration::from_millis(150);

/// How attach asks a human for one request (agent text made safe for the terminal).
pub fn approval_prompt(a: &pb::Approval) -> String {
    crate::text::for_terminal(&approval_prompt_raw(a)).into_owned()
}

fn approval_prompt_raw(a: &pb::Approval) -> String {
    match pb::ApprovalKind::try_from(a.kind) {
        Ok(pb::ApprovalKind::Permission) => {
            format!("Allow {}? [y/n, or n and a reason]", a.summary)
        }
        Ok(pb::ApprovalKind::ClientTool) => format!(
            "Agent calls {} (a tool you run): {}\n(type its result)",
            a.tool_name, a.summary
        ),
        _ => format!("Agent asks: {}\n(type your answer)", a.summary),
    }
}

/// A typed line as the answer to `a`: the decision and its text, or a hint when the line is
/// not one (a permission takes y/yes, n/no, or `n <reason>`; anything else a text).
pub fn answer_of(
    a: &pb::Approval,
    line: &str,
) -> Result<(pb::ApprovalDecision, String), &'static str> {
    let t = line.trim();
    if pb::ApprovalKind::try_from(a.kind) != Ok(pb::ApprovalKind::Permission) {
        return if t.is_empty() {
            Err("(type the answer, then Enter)")
        } else {
            Ok((pb::ApprovalDecision::Answer, t.to_string()))
        };
    }
    let lower = t.to_ascii_lowercase();
    match lower.as_str() {
        "y" | "yes" => return Ok((pb::ApprovalDecision::Approve, String::new())),
        "n" | "no" => return Ok((pb::ApprovalDecision::Deny, String::new())),
        _ => {}
    }
    for prefix in ["no ", "no:", "n ", "n:"] {
        if lower.starts_with(prefix) {
            return Ok((
                pb::ApprovalDecision::Deny,
                t[prefix.len()..].trim().to_string(),
            ));
        }
    }
    Err("(answer y or n, or n and a reason)")
}

/// How a request ended, when the session's activity does not say it: the daemon notes every
/// answer (`[<id> approved (attach)]`) and expiry in the turn's activity, but a request
/// cancelled with its turn, its agent or its session only shows here.
pub fn resolution_line(a: &pb::Approval) -> Option<String> {
    (a.state == pb::ApprovalState::Cancelled as i32).then(|| {
        if a.answer.is_empty() {
            format!("[{} cancelled]", a.id)
        } else {
            format!(
                "[{} cancelled: {}]",
                a.id,
                one_line(&a.answer, DETAIL_MAX_CHARS)
            )
        }
    })
}

/// The requests of the session that wait for a human, the first one asked.
#[derive(Default)]
struct Asks {
    screen: Screen,
    open: VecDeque<pb::Approval>,
    /// The id of the request whose prompt was printed.
    prompted: Option<String>,
}

impl Asks {
    fn on_event(&mut self, a: pb::Approval) {
        if a.state == pb::ApprovalState::Pending as i32 {
            if !self.open.iter().any(|x| x.id == a.id) {
                if self.open.len() < APPROVALS_MAX {
                    self.open.push_back(a);
                } else {
                    self.screen.say(format!(
                        "(more than {APPROVALS_MAX} requests are open; `paddock approvals` lists them all)"
                    ));
                }
            }
        } else if let Some(i) = self.open.iter().position(|x| x.id == a.id) {
            self.open.remove(i);
            if let Some(line) = resolution_line(&a) {
                self.screen.say(line);
            }
            if self.prompted.as_deref() == Some(a.id.as_str()) {
                self.prompted = None;
            }
        }
        if self.prompted.is_none() {
            if let Some(first) = self.open.front() {
                self.screen.say(approval_prompt(first));
                self.prompted = Some(first.id.clone());
                self.screen.bell();
            }
        }
    }

    /// [`Asks::on_event`] for each of `events`, in order.
    fn on_events(&mut self, events: impl IntoIterator<Item = pb::Approval>) {
        events.into_iter().for_each(|a| self.on_event(a));
    }

    /// After a reopened stream: forget what was settled while no stream was read (`open`: the
    /// ids open now), so a line is never taken as the answer to a closed request.
    fn keep_only(&mut self, open: &[String]) {
        self.open.retain(|a| open.contains(&a.id));
        if self.prompted.as_ref().is_some_and(|id| !open.contains(id)) {
            self.prompted = None;
            if let Some(first) = self.open.front() {
                self.screen.say(approval_prompt(first));
                self.prompted = Some(first.id.clone());
            }
        }
    }

    /// The request a typed line answers, if one was asked.
    fn asked(&self) -> Option<&pb::Approval> {
        let id = self.prompted.as_deref()?;
        self.open.iter().find(|a| a.id == id)
    }
}

/// Answers the asked request with a typed line (the approvals stream then says how it ended).
async fn answer(c: &mut Client, screen: &Screen, a: &pb::Approval, line: &str) {
    match answer_of(a, line) {
        Err(hint) => screen.say(hint),
        Ok((decision, text)) => {
            let r = c
                .resolve_approval(pb::ResolveApprovalRequest {
                    approval_id: a.id.clone(),
                    decision: decision as i32,
                    text,
                    is_error: false,
                    resolved_by: "attach".into(),
                })
                .await;
            if let Err(e) = r {
                screen.say(format!("error: {}", e.message()));
            }
        }
    }
}

async fn watch_approvals(
    c: &mut Client,
    id: &str,
) -> Result<tonic::Streaming<pb::Approval>, tonic::Status> {
    c.watch_approvals(pb::WatchApprovalsRequest {
        session_id: id.to_string(),
    })
    .await
    .map(|r| r.into_inner())
}

/// How attach names a state in its header and its `[…]` lines.
pub fn state_label(status: Status, turns_completed: i64, last_turn_failed: bool) -> &'static str {
    match latis_state(status, turns_completed, last_turn_failed) {
        "waiting" => "waiting for input",
        other => other,
    }
}

/// Prints live activities, the answer repeated after the agent's last words once.
struct Printer {
    screen: Screen,
    last_status: Option<String>,
}

impl Printer {
    fn activity(&mut self, a: &pb::SessionActivityEvent) {
        let Some(kind) = ActivityKind::from_number(a.r#type) else {
            return;
        };
        let said = self.last_status.take();
        match kind {
            ActivityKind::Completion if said.as_deref() == Some(a.content.as_str()) => return,
            ActivityKind::Text => self.last_status = Some(a.content.clone()),
            _ => {}
        }
        self.screen.say(entry(
            role_of(kind),
            &a.tool_name,
            a.tool_success,
            &a.content,
        ));
    }
}

/// A line waiting to be sent; `noted` once the user was told it waits.
struct Queued {
    text: String,
    noted: bool,
}

/// The outcome of one SendMessage.
enum Sent {
    Accepted,
    Refused(Queued, tonic::Status),
}

/// What attach knows of the session.
struct Session {
    screen: Screen,
    id: String,
    status: Status,
    turns: i64,
    /// Whether the last turn that ended failed (the session is then `failed`, not `complete`).
    last_failed: bool,
    /// The state last printed.
    label: &'static str,
    error: String,
    queue: VecDeque<Queued>,
    /// A SendMessage is on its way.
    sending: bool,
    busy_retries: u32,
    /// A turn is open and its last activity (COMPLETION / ERROR) has not been shown yet.
    turn_unfinished: bool,
    /// The status said the turn ended before its last activity was shown: the `[state]`
    /// line waits for that activity (at most [`ANNOUNCE_WAIT`]), so it never comes before the
    /// agent's answer.
    deferred: Option<tokio::time::Instant>,
}

/// How long a turn's end waits for its last activity before it is announced anyway.
const ANNOUNCE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Session {
    /// Prints `[state]` when the latis state changed.
    fn announce(&mut self) {
        self.deferred = None;
        let label = state_label(self.status, self.turns, self.last_failed);
        if label != self.label {
            self.label = label;
            match self.status {
                Status::Failed if !self.error.is_empty() => {
                    self.screen.say(format!("[failed: {}]", self.error))
                }
                _ => self.screen.say(format!("[{label}]")),
            }
        }
    }

    /// A status change (from WatchSession); `info`, read after it, for the turn count.
    fn on_status(&mut self, new: Status, info: Option<&pb::SessionInfo>) {
        if let Some(i) = info {
            self.turns = i.turns_completed;
            self.last_failed = i.last_turn_failed;
            self.error = i.error_message.clone();
        }
        self.status = new;
        match new {
            Status::Working | Status::Waiting => {
                self.turn_unfinished = true;
                self.announce();
            }
            Status::Running | Status::Stopped | Status::Failed if self.turn_unfinished => {
                self.deferred = Some(tokio::time::Instant::now() + ANNOUNCE_WAIT);
            }
            _ => self.announce(),
        }
    }

    /// An activity was shown.
    fn on_activity(&mut self, kind: ActivityKind) {
        if kind.ends_turn() {
            self.turn_unfinished = false;
            if self.deferred.is_some() {
                self.announce();
            }
        }
    }
}

fn start_send(c: &Client, id: &str, line: Queued, tx: mpsc::Sender<Sent>) {
    let mut c = c.clone();
    let req = pb::SendMessageRequest {
        session_id: id.to_string(),
        message: line.text.clone(),
    };
    tokio::spawn(async move {
        match c.send_message(req).await {
            Ok(resp) => {
                let _ = tx.send(Sent::Accepted).await;
                // Drained so the daemon's stream ends normally; the activities themselves
                // are printed from WatchActivity.
                let mut s = resp.into_inner();
                while s.next().await.is_some() {}
            }
            Err(e) => {
                let _ = tx.send(Sent::Refused(line, e)).await;
            }
        }
    });
}

fn is_busy_refusal(e: &tonic::Status) -> bool {
    obey_code(e) == Some(ErrorCode::WrongState)
}

async fn get(c: &mut Client, id: &str) -> Result<pb::SessionInfo, tonic::Status> {
    c.get_session(pb::GetSessionRequest {
        session_id: id.to_string(),
    })
    .await
    .map(|r| r.into_inner())
}

async fn watch_activity(
    c: &mut Client,
    id: &str,
    after_seq: i64,
) -> Result<tonic::Streaming<pb::SessionActivityEvent>, tonic::Status> {
    c.watch_activity(pb::WatchActivityRequest {
        session_id: id.to_string(),
        after_seq,
    })
    .await
    .map(|r| r.into_inner())
}

const BUSY_NOTE: &str = "(the agent is busy; your message is sent when this turn ends)";

/// Runs an attach until the user detaches or the session ends.
pub async fn run(c: &mut Client, id: String) -> super::Result<()> {
    // Subscribe to status changes first, then read: no change falls between the two.
    let statuses = c
        .watch_session(pb::WatchSessionRequest {
            session_id: id.clone(),
        })
        .await?
        .into_inner();
    let info = get(c, &id).await?;
    let history = c
        .get_history(pb::GetHistoryRequest {
            session_id: id.clone(),
            limit: HISTORY_MAX_ENTRIES,
        })
        .await?
        .into_inner();
    let status = Status::from_number(info.status).ok_or_else(|| {
        Error::Protocol(format!(
            "the daemon reports an unknown status {}",
            info.status
        ))
    })?;
    let mut s = Session {
        screen: Screen::default(),
        id: id.clone(),
        status,
        turns: info.turns_completed,
        last_failed: info.last_turn_failed,
        label: state_label(status, info.turns_completed, info.last_turn_failed),
        error: info.error_message.clone(),
        queue: VecDeque::new(),
        sending: false,
        busy_retries: 0,
        turn_unfinished: status.in_turn(),
        deferred: None,
    };
    outln!("[Session {} - {}]", s.id, s.label)?;
    if history.truncated {
        outln!("(earlier entries: paddock session history {})", s.id)?;
    }
    for item in &history.items {
        outln!(
            "{}",
            entry(
                &item.role,
                &item.tool_name,
                item.tool_success,
                &item.content
            )
        )?;
    }
    if s.status.is_terminal() {
        if !s.error.is_empty() {
            outln!("[{}: {}]", s.label, s.error)?;
        }
        outln!(
            "The session is {}; `paddock session restart {}` starts it again.",
            s.label,
            s.id
        )?;
        return Ok(());
    }
    outln!("(type a message and press Enter; Ctrl-D detaches, the agent keeps working)")?;
    let acts = watch_activity(c, &id, history.last_seq).await?;
    let approvals = watch_approvals(c, &id).await?;
    let (typed_tx, mut typed) = mpsc::channel::<Typed>(4);
    s.screen = Screen::start(typed_tx);
    let live = Live {
        statuses,
        last_seq: history.last_seq,
        acts,
        approvals,
    };
    let r = converse(c, &mut s, &mut typed, live).await;
    // Whatever ended the conversation, the terminal is left as it was found.
    // (It may wait for the editor a moment: not on the runtime's threads.)
    let screen = s.screen.clone();
    let _ = tokio::task::spawn_blocking(move || screen.close()).await;
    r
}

/// The streams a live conversation reads.
struct Live {
    statuses: tonic::Streaming<pb::SessionStatusEvent>,
    last_seq: i64,
    acts: tonic::Streaming<pb::SessionActivityEvent>,
    approvals: tonic::Streaming<pb::Approval>,
}

/// The live part of attach: typed lines, the agent's activity, requests and state changes,
/// until the session ends or the user detaches.
async fn converse(
    c: &mut Client,
    s: &mut Session,
    typed: &mut mpsc::Receiver<Typed>,
    live: Live,
) -> super::Result<()> {
    let Live {
        mut statuses,
        mut last_seq,
        mut acts,
        mut approvals,
    } = live;
    let id = s.id.clone();
    let mut asks = Asks {
        screen: s.screen.clone(),
        ..Asks::default()
    };
    // New requests as they came, shown once the activity before them is in ([`ASK_SETTLE`]).
    let mut held: VecDeque<pb::Approval> = VecDeque::new();
    let mut show_at: Option<tokio::time::Instant> = None;
    let mut reopened = 0u32;
    let (sent_tx, mut sent) = mpsc::channel::<Sent>(4);
    let mut printer = Printer {
        screen: s.screen.clone(),
        last_status: None,
    };
    let (mut s_open, mut a_open, mut t_open, mut q_open) = (true, true, true, true);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);

    while s_open || a_open {
        if s.screen.closed() {
            // Nobody reads the conversation any more (`… | head`): it ends, saying nothing.
            s.screen.close();
            return Err(Error::StdoutClosed);
        }
        let deferred = s.deferred;
        tokio::select! {
            biased;
            _ = &mut ctrl_c => {
                detach(s);
                return Ok(());
            }
            t = typed.recv(), if t_open => match t {
                Some(Typed::Line(line)) => match asks.asked().cloned() {
                    // A request waits for a human: the line is its answer.
                    Some(a) => answer(c, &s.screen, &a, &line).await,
                    None => on_line(c, s, line, &sent_tx),
                },
                Some(Typed::TooLong(n)) => s.screen.say(format!(
                    "(that line is {n} bytes, over the {LINE_MAX_BYTES}-byte limit; not sent)"
                )),
                Some(Typed::Failed(e)) => {
                    s.screen.say(format!("(cannot read the terminal any more: {e}; still watching, Ctrl-C detaches)"));
                    t_open = false;
                }
                Some(Typed::Eof) | None => {
                    see_through(s, &mut sent).await;
                    detach(s);
                    return Ok(());
                }
            },
            r = sent.recv() => match r {
                Some(Sent::Accepted) => {
                    s.sending = false;
                    s.busy_retries = 0;
                    send_next(c, s, &sent_tx);
                }
                Some(Sent::Refused(mut line, e)) if is_busy_refusal(&e) => {
                    // Another client's turn (or ours, not yet reported) holds the agent.
                    s.sending = false;
                    if !line.noted {
                        s.screen.say(BUSY_NOTE);
                        line.noted = true;
                    }
                    s.queue.push_front(line);
                    let now = get(c, &id).await?;
                    match Status::from_number(now.status) {
                        Some(Status::Running) if s.busy_retries < BUSY_RETRIES_MAX => {
                            s.busy_retries += 1;
                            s.status = Status::Running;
                            send_next(c, s, &sent_tx);
                        }
                        Some(st) if st.is_terminal() || st == Status::Stopping => {
                            s.on_status(st, Some(&now));
                            drop_queue(s);
                        }
                        _ => s.busy_retries = 0,
                    }
                }
                Some(Sent::Refused(line, e)) => {
                    s.sending = false;
                    s.screen.say(format!("error: {} (not sent: {})", e.message(), one_line(&line.text, DETAIL_MAX_CHARS)));
                    send_next(c, s, &sent_tx);
                }
                None => {}
            },
            ev = approvals.next(), if q_open => match ev {
                Some(Ok(a)) if a.state == pb::ApprovalState::Pending as i32 => {
                    held.push_back(a);
                    if held.len() >= APPROVALS_MAX {
                        asks.on_events(held.drain(..));
                        show_at = None;
                    } else {
                        show_at.get_or_insert_with(|| tokio::time::Instant::now() + ASK_SETTLE);
                    }
                }
                // An end counts at once (the next line typed is no answer to it); a request
                // ended before it was shown goes unshown.
                Some(Ok(a)) => match held.iter().position(|h| h.id == a.id) {
                    Some(i) => {
                        held.remove(i);
                        if held.is_empty() {
                            show_at = None;
                        }
                    }
                    None => asks.on_event(a),
                },
                Some(Err(e)) => {
                    asks.on_events(held.drain(..));
                    show_at = None;
                    // Fell behind: reopen; the open requests come again (known ones once).
                    reopened += 1;
                    if reopened > REOPEN_MAX {
                        return Err(Error::Step { step: "the approvals stream keeps failing".into(), source: e });
                    }
                    approvals = watch_approvals(c, &id).await?;
                    // What was settled in the gap is not in the new stream: forget it.
                    let open = c
                        .list_approvals(pb::ListApprovalsRequest {
                            session_id: id.clone(),
                            include_resolved: false,
                            limit: APPROVALS_MAX as i32,
                        })
                        .await?
                        .into_inner()
                        .approvals;
                    let ids: Vec<String> = open.into_iter().map(|a| a.id).collect();
                    asks.keep_only(&ids);
                }
                None => q_open = false,
            },
            ev = statuses.next(), if s_open => match ev {
                Some(Ok(e)) => {
                    let Some(new) = Status::from_number(e.new_status) else { continue };
                    // The event says the status; the record, how many turns have ended.
                    let now = get(c, &id).await.ok();
                    s.on_status(new, now.as_ref());
                    match new {
                        Status::Running => send_next(c, s, &sent_tx),
                        Status::Stopping | Status::Stopped | Status::Failed => drop_queue(s),
                        _ => {}
                    }
                }
                Some(Err(e)) => return Err(e.into()),
                None => s_open = false,
            },
            ev = acts.next(), if a_open => match ev {
                Some(Ok(a)) => {
                    last_seq = last_seq.max(a.seq);
                    printer.activity(&a);
                    if let Some(kind) = ActivityKind::from_number(a.r#type) {
                        s.on_activity(kind);
                    }
                }
                Some(Err(e)) => {
                    // Fell behind (or the stream broke): go on from the last one shown.
                    reopened += 1;
                    if reopened > REOPEN_MAX {
                        return Err(Error::Step { step: "the activity stream keeps failing".into(), source: e });
                    }
                    acts = watch_activity(c, &id, last_seq).await?;
                }
                None => a_open = false,
            },
            _ = tokio::time::sleep_until(deferred.unwrap_or_else(tokio::time::Instant::now)), if deferred.is_some() => {
                s.turn_unfinished = false;
                s.announce();
            },
            _ = tokio::time::sleep_until(show_at.unwrap_or_else(tokio::time::Instant::now)), if show_at.is_some() => {
                asks.on_events(held.drain(..));
                show_at = None;
            },
        }
    }
    asks.on_events(held.drain(..));
    // Both streams ended: the session is over, or the daemon went away.
    let end = get(c, &id).await.map_err(|source| Error::Step {
        step: "lost the daemon".into(),
        source,
    })?;
    let status = Status::from_number(end.status).unwrap_or(s.status);
    s.turns = end.turns_completed;
    s.last_failed = end.last_turn_failed;
    s.error = end.error_message.clone();
    s.status = status;
    s.announce();
    if !status.is_terminal() {
        return Err(Error::Protocol(format!(
            "the daemon ended the session's streams while it is {} (is it shutting down?)",
            s.label
        )));
    }
    drop_queue(s);
    match status {
        Status::Failed => s.screen.say(format!("Session {} failed.", s.id)),
        _ => s.screen.say(format!("Session {} is {}.", s.id, s.label)),
    }
    Ok(())
}

fn on_line(c: &Client, s: &mut Session, text: String, tx: &mpsc::Sender<Sent>) {
    if text.trim().is_empty() {
        return;
    }
    if matches!(
        s.status,
        Status::Stopping | Status::Stopped | Status::Failed
    ) {
        s.screen
            .say(format!("(the session is {}; not sent)", s.label));
        return;
    }
    if s.queue.len() >= QUEUE_MAX_LINES {
        s.screen.say(format!(
            "({QUEUE_MAX_LINES} messages are already waiting for the agent; this one was not sent)"
        ));
        return;
    }
    let idle = s.status == Status::Running && !s.sending && s.queue.is_empty();
    if !idle {
        match s.status {
            Status::Created | Status::Starting => s
                .screen
                .say("(the agent is starting; your message is sent once it is up)"),
            _ => s.screen.say(BUSY_NOTE),
        }
    }
    s.queue.push_back(Queued { text, noted: !idle });
    send_next(c, s, tx);
}

fn send_next(c: &Client, s: &mut Session, tx: &mpsc::Sender<Sent>) {
    if s.sending || s.status != Status::Running {
        return;
    }
    if let Some(line) = s.queue.pop_front() {
        s.sending = true;
        start_send(c, &s.id, line, tx.clone());
    }
}

fn drop_queue(s: &mut Session) {
    for line in s.queue.drain(..) {
        s.screen.say(format!(
            "(not sent, the session is {}: {})",
            state_label(s.status, s.turns, s.last_failed),
            one_line(&line.text, DETAIL_MAX_CHARS)
        ));
    }
}

/// The line already on its way is seen through before a detach (the input's end: a piped
/// line, Ctrl-D): its SendMessage is a task of this process, and leaving at once would cancel
/// it, the line neither sent nor said not to be. Lines still queued behind a busy agent are
/// said not sent by [`detach`].
async fn see_through(s: &mut Session, sent: &mut mpsc::Receiver<Sent>) {
    if !s.sending {
        return;
    }
    s.sending = false;
    match tokio::time::timeout(super::client::call_timeout(), sent.recv()).await {
        Ok(Some(Sent::Accepted)) => {}
        Ok(Some(Sent::Refused(line, e))) => s.screen.say(format!(
            "(not sent: {}: {})",
            e.message(),
            one_line(&line.text, DETAIL_MAX_CHARS)
        )),
        Ok(None) | Err(_) => s
            .screen
            .say("(the last line may not have been sent: the daemon did not answer)"),
    }
}

fn detach(s: &Session) {
    for line in &s.queue {
        s.screen.say(format!(
            "(not sent, the agent was still busy: {})",
            one_line(&line.text, DETAIL_MAX_CHARS)
        ));
    }
    s.screen.say("Detached; the agent keeps working.");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_like_a_conversation() {
        assert_eq!(entry("user", "", false, "Fix it\n"), "You: Fix it");
        assert_eq!(
            entry("assistant", "", false, "Done.\nAll green."),
            "Agent: Done.\nAll green."
        );
        assert_eq!(entry("text", "", false, "Looking."), "Agent: Looking.");
        assert_eq!(
            entry("status", "", false, "API error 503; retry 1 of 3"),
            "[API error 503; retry 1 of 3]"
        );
        assert_eq!(
            entry(
                "status",
                "Bash",
                true,
                "waiting for approval (ap_1): Bash: ls"
            ),
            "[waiting for approval (ap_1): Bash: ls]"
        );
        assert_eq!(
            entry("thinking", "", false, "a\nb"),
            "Agent (thinking): a b"
        );
        assert_eq!(
            entry("tool_call", "Bash", false, "cargo test"),
            "  [Bash] cargo test"
        );
        assert_eq!(entry("tool_result", "Bash", true, "ok\n"), "  [Bash ok] ok");
        assert_eq!(
            entry("tool_result", "Bash", false, "boom"),
            "  [Bash FAILED] boom"
        );
        assert_eq!(
            entry("error", "", false, "OBEY-2031: crashed"),
            "Error: OBEY-2031: crashed"
        );
        let long = "x".repeat(500);
        assert_eq!(
            entry("tool_call", "Read", false, &long).chars().count(),
            "  [Read] ".len() + DETAIL_MAX_CHARS
        );
        for k in ActivityKind::ALL {
            assert!(!entry(role_of(k), "T", true, "c").starts_with(role_of(k)));
        }
    }

    fn ask(kind: pb::ApprovalKind, summary: &str) -> pb::Approval {
        pb::Approval {
            id: "ap_1".into(),
            kind: kind as i32,
            tool_name: "run_tests".into(),
            summary: summary.into(),
            state: pb::ApprovalState::Pending as i32,
            ..Default::default()
        }
    }

    #[test]
    fn requests_are_asked_and_answered_on_one_line() {
        use pb::ApprovalDecision as D;
        let p = ask(pb::ApprovalKind::Permission, "Bash: rm -rf build");
        assert_eq!(
            approval_prompt(&p),
            "Allow Bash: rm -rf build? [y/n, or n and a reason]"
        );
        for yes in ["y", "Y", " yes ", "YES"] {
            assert_eq!(answer_of(&p, yes), Ok((D::Approve, String::new())), "{yes}");
        }
        for no in ["n", "No"] {
            assert_eq!(answer_of(&p, no), Ok((D::Deny, String::new())), "{no}");
        }
        assert_eq!(
            answer_of(&p, "no not on a Friday"),
            Ok((D::Deny, "not on a Friday".into()))
        );
        assert_eq!(
            answer_of(&p, "N: Use make clean"),
            Ok((D::Deny, "Use make clean".into()))
        );
        assert!(answer_of(&p, "sure").is_err());
        assert!(answer_of(&p, "").is_err());

        let q = ask(
            pb::ApprovalKind::Question,
            "Update the test or the CI? [test / CI]",
        );
        assert_eq!(
            approval_prompt(&q),
            "Agent asks: Update the test or the CI? [test / CI]\n(type your answer)"
        );
        assert_eq!(answer_of(&q, " CI \n"), Ok((D::Answer, "CI".into())));
        assert_eq!(answer_of(&q, "y"), Ok((D::Answer, "y".into())));
        assert!(answer_of(&q, "  ").is_err());
        let t = ask(
            pb::ApprovalKind::ClientTool,
            "run_tests {\"filter\":\"db\"}",
        );
        assert!(approval_prompt(&t).starts_with("Agent calls run_tests (a tool you run): "));
        assert_eq!(
            answer_of(&t, "3 passed"),
            Ok((D::Answer, "3 passed".into()))
        );

        let done = |state: pb::ApprovalState, answer: &str| {
            resolution_line(&pb::Approval {
                state: state as i32,
                answer: answer.into(),
                ..p.clone()
            })
        };
        for noted in [
            pb::ApprovalState::Approved,
            pb::ApprovalState::Denied,
            pb::ApprovalState::Answered,
            pb::ApprovalState::Expired,
        ] {
            assert_eq!(done(noted, "x"), None, "{noted:?}");
        }
        assert_eq!(
            done(pb::ApprovalState::Cancelled, "the session was stopped"),
            Some("[ap_1 cancelled: the session was stopped]".into())
        );
        assert_eq!(
            done(pb::ApprovalState::Cancelled, ""),
            Some("[ap_1 cancelled]".into())
        );
    }

    #[test]
    fn the_first_open_request_is_the_one_asked() {
        let mut asks = Asks::default();
        let mut first = ask(pb::ApprovalKind::Permission, "Bash: ls");
        let mut second = ask(pb::ApprovalKind::Question, "Why?");
        second.id = "ap_2".into();
        asks.on_event(first.clone());
        asks.on_event(second.clone());
        asks.on_event(first.clone()); // sent again after a reopen: kept once
        assert_eq!(asks.open.len(), 2);
        assert_eq!(asks.asked().map(|a| a.id.as_str()), Some("ap_1"));
        first.state = pb::ApprovalState::Approved as i32;
        asks.on_event(first);
        assert_eq!(asks.asked().map(|a| a.id.as_str()), Some("ap_2"));
        second.state = pb::ApprovalState::Cancelled as i32;
        asks.on_event(second);
        assert!(asks.asked().is_none() && asks.open.is_empty());

        // A request settled while the stream was being reopened is forgotten, and the next
        // open one is asked.
        let mut asks = Asks::default();
        let first = ask(pb::ApprovalKind::Permission, "Bash: ls");
        let mut third = ask(pb::ApprovalKind::Question, "Which?");
        third.id = "ap_3".into();
        asks.on_event(first);
        asks.on_event(third);
        asks.keep_only(&["ap_3".to_string()]);
        assert_eq!(asks.asked().map(|a| a.id.as_str()), Some("ap_3"));
    }

    #[test]
    fn waiting_reads_as_waiting_for_input() {
        assert_eq!(state_label(Status::Waiting, 0, false), "waiting for input");
        assert_eq!(state_label(Status::Running, 1, false), "complete");
        assert_eq!(state_label(Status::Running, 1, true), "failed");
        assert_eq!(state_label(Status::Running, 0, false), "ready");
    }
}
