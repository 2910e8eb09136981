//! `paddock top`: a live dashboard of every session, those waiting for a human first.
//!
//! Three parts, one direction. `feed` turns the daemon's watch streams (`WatchAllSessions`,
//! `WatchApprovals`, and `WatchActivity` from the newest event of each live session) into
//! [`Update`]s; a thread turns key presses into updates too. [`Dashboard`] is the screen's
//! state: it applies updates and keys and answers with an [`Action`] (no I/O, unit-tested),
//! and renders itself with ratatui. [`run`] carries actions out (approve, deny, answer, stop,
//! restart, delete as RPCs; attach by leaving the screen for `session attach` and coming back).

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use paddock_core::Status;
use paddock_proto::obey::local::v1 as pb;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table, TableState, Wrap};
use ratatui::Frame;
use tokio::sync::mpsc;

use super::approvals::{kind_name, state_name};
use super::view::{age, one_line, provider_name, state_of};
use super::{client, Client, Ctx, Error, Result};
use crate::text::for_terminal;

/// Live sessions whose activity is followed at once (one stream each); past it a row shows
/// its status only.
const ACTIVITY_WATCHES_MAX: usize = 64;
/// Characters kept of a typed answer or reason (the daemon takes up to 256 KiB; a dashboard
/// line is for short ones: `paddock answer` takes long ones).
const INPUT_CHARS_MAX: usize = 4096;

/// Something that changed, from the daemon or the keyboard.
#[derive(Debug)]
pub enum Update {
    Key(KeyEvent),
    /// A second passed (ages move on).
    Tick(u64),
    Session(Box<pb::SessionInfo>),
    /// The session was deleted.
    Gone(String),
    Approval(Box<pb::Approval>),
    /// What a session did last, on one line.
    Activity {
        session: String,
        text: String,
    },
    /// The outcome of an action, for the status line.
    Said(String),
    /// The daemon's streams ended.
    Lost(String),
}

/// What the dashboard asks [`run`] to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    Approve(String),
    Deny { approval: String, reason: String },
    Answer { approval: String, text: String },
    Attach(String),
    Stop(String),
    Restart(String),
    Delete(String),
}

/// What the bottom line is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    Normal,
    /// Typing the answer to a question (or a client tool's result).
    Answer {
        approval: String,
        text: String,
    },
    /// Typing why a permission is refused.
    Deny {
        approval: String,
        text: String,
    },
    /// `y` deletes this session.
    ConfirmDelete(String),
}

#[derive(Debug, Clone)]
struct SessionRow {
    info: pb::SessionInfo,
    activity: String,
}

/// The dashboard's state.
#[derive(Debug)]
pub struct Dashboard {
    sessions: BTreeMap<String, SessionRow>,
    /// Open requests for a human, by id.
    open: BTreeMap<String, pb::Approval>,
    /// Requests seen open, so that each rings the bell once.
    rung: BTreeSet<String>,
    selected: Option<String>,
    mode: Mode,
    said: String,
    now_ms: u64,
    bell: bool,
}

impl Dashboard {
    pub fn new(now_ms: u64) -> Dashboard {
        Dashboard {
            sessions: BTreeMap::new(),
            open: BTreeMap::new(),
            rung: BTreeSet::new(),
            selected: None,
            mode: Mode::Normal,
            said: "connecting…".into(),
            now_ms,
            bell: false,
        }
    }

    /// Whether the terminal bell should ring (a new request for a human), once.
    pub fn take_bell(&mut self) -> bool {
        std::mem::take(&mut self.bell)
    }

    /// Open requests of session `id`, oldest first.
    fn asks(&self, id: &str) -> Vec<&pb::Approval> {
        let mut asks: Vec<&pb::Approval> =
            self.open.values().filter(|a| a.session_id == id).collect();
        asks.sort_by(|a, b| a.id.cmp(&b.id));
        asks
    }

    fn waiting(&self, r: &SessionRow) -> bool {
        r.info.status == Status::Waiting.number()
            || r.info.pending_approvals > 0
            || self.open.values().any(|a| a.session_id == r.info.id)
    }

    /// The rows in screen order: waiting for a human, then working, then idle, then ended;
    /// newest first within each.
    fn order(&self) -> Vec<&SessionRow> {
        let rank = |r: &SessionRow| match Status::from_number(r.info.status) {
            _ if self.waiting(r) => 0,
            Some(Status::Working | Status::Starting | Status::Created | Status::Stopping) => 1,
            Some(Status::Running) => 2,
            _ => 3,
        };
        let mut rows: Vec<&SessionRow> = self.sessions.values().collect();
        rows.sort_by(|a, b| {
            rank(a)
                .cmp(&rank(b))
                .then_with(|| b.info.id.cmp(&a.info.id))
        });
        rows
    }

    fn selected_row(&self) -> Option<&SessionRow> {
        let order = self.order();
        match &self.selected {
            Some(id) => order.iter().find(|r| &r.info.id == id).copied(),
            None => order.first().copied(),
        }
        .or_else(|| order.first().copied())
    }

    /// Applies an update; what to do about it.
    pub fn apply(&mut self, update: Update) -> Action {
        match update {
            Update::Key(key) => return self.key(key),
            Update::Tick(now) => self.now_ms = now,
            Update::Session(info) => {
                if self.said == "connecting…" {
                    self.said.clear();
                }
                let activity = self
                    .sessions
                    .remove(&info.id)
                    .map(|r| r.activity)
                    .unwrap_or_default();
                self.sessions.insert(
                    info.id.clone(),
                    SessionRow {
                        info: *info,
                        activity,
                    },
                );
            }
            Update::Gone(id) => {
                self.sessions.remove(&id);
                self.open.retain(|_, a| a.session_id != id);
            }
            Update::Approval(a) => {
                if a.state == pb::ApprovalState::Pending as i32 {
                    if self.rung.insert(a.id.clone()) {
                        self.bell = true;
                    }
                    self.open.insert(a.id.clone(), *a);
                } else {
                    self.open.remove(&a.id);
                }
            }
            Update::Activity { session, text } => {
                if let Some(r) = self.sessions.get_mut(&session) {
                    r.activity = text;
                }
            }
            Update::Said(text) => self.said = text,
            Update::Lost(why) => self.said = format!("lost the daemon: {why} (q quits)"),
        }
        Action::None
    }

    fn key(&mut self, key: KeyEvent) -> Action {
        if key.kind == KeyEventKind::Release {
            return Action::None;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        match std::mem::replace(&mut self.mode, Mode::Normal) {
            Mode::Normal => self.normal_key(key),
            Mode::ConfirmDelete(id) => match key.code {
                KeyCode::Char('y') | KeyCode::Char('Y') => Action::Delete(id),
                _ => {
                    self.said = "not deleted".into();
                    Action::None
                }
            },
            Mode::Answer { approval, text } => self.typing(key, approval, text, true),
            Mode::Deny { approval, text } => self.typing(key, approval, text, false),
        }
    }

    /// A key while a line is typed: Enter sends it, Esc drops it.
    fn typing(
        &mut self,
        key: KeyEvent,
        approval: String,
        mut text: String,
        answer: bool,
    ) -> Action {
        match key.code {
            KeyCode::Enter if answer => return Action::Answer { approval, text },
            KeyCode::Enter => {
                return Action::Deny {
                    approval,
                    reason: text,
                }
            }
            KeyCode::Esc => {
                self.said = "cancelled".into();
                return Action::None;
            }
            KeyCode::Backspace => {
                text.pop();
            }
            KeyCode::Char(c) if text.chars().count() < INPUT_CHARS_MAX => text.push(c),
            _ => {}
        }
        self.mode = if answer {
            Mode::Answer { approval, text }
        } else {
            Mode::Deny { approval, text }
        };
        Action::None
    }

    fn normal_key(&mut self, key: KeyEvent) -> Action {
        let order: Vec<String> = self.order().iter().map(|r| r.info.id.clone()).collect();
        let at = self
            .selected_row()
            .and_then(|r| order.iter().position(|id| *id == r.info.id));
        let Some(row) = self.selected_row().cloned() else {
            return match key.code {
                KeyCode::Char('q') | KeyCode::Esc => Action::Quit,
                _ => Action::None,
            };
        };
        let id = row.info.id.clone();
        // The row a key acted on stays selected when the rows reorder.
        self.selected = Some(id.clone());
        let first_ask = self.asks(&id).first().map(|a| (*a).clone());
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => return Action::Quit,
            KeyCode::Down | KeyCode::Char('j') => {
                let next = at.map_or(0, |i| (i + 1).min(order.len() - 1));
                self.selected = order.get(next).cloned();
            }
            KeyCode::Up | KeyCode::Char('k') => {
                let prev = at.map_or(0, |i| i.saturating_sub(1));
                self.selected = order.get(prev).cloned();
            }
            KeyCode::Char('a') => match first_ask {
                Some(a) if a.kind == pb::ApprovalKind::Permission as i32 => {
                    return Action::Approve(a.id)
                }
                Some(a) => self.said = format!("{} is a question: t answers it", a.id),
                None => self.said = "nothing is asked of you there".into(),
            },
            KeyCode::Char('d') => match first_ask {
                Some(a) if a.kind == pb::ApprovalKind::Permission as i32 => {
                    self.mode = Mode::Deny {
                        approval: a.id,
                        text: String::new(),
                    }
                }
                Some(a) => self.said = format!("{} is a question: t answers it", a.id),
                None => self.said = "nothing is asked of you there".into(),
            },
            KeyCode::Char('t') => match first_ask {
                Some(a) if a.kind != pb::ApprovalKind::Permission as i32 => {
                    self.mode = Mode::Answer {
                        approval: a.id,
                        text: String::new(),
                    }
                }
                Some(a) => self.said = format!("{} asks permission: a approves, d denies", a.id),
                None => self.said = "nothing is asked of you there".into(),
            },
            KeyCode::Enter => return Action::Attach(id),
            KeyCode::Char('s') => return Action::Stop(id),
            KeyCode::Char('r') => return Action::Restart(id),
            KeyCode::Char('x') => {
                self.mode = Mode::ConfirmDelete(id);
            }
            _ => {}
        }
        Action::None
    }

    /// Draws the dashboard; fits 80×24 (and narrower, cutting the activity column first).
    pub fn render(&self, f: &mut Frame) {
        let [head, table, detail, foot] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Min(3),
            Constraint::Length(4),
            Constraint::Length(1),
        ])
        .areas(f.area());
        let rows = self.order();
        let waiting = rows.iter().filter(|r| self.waiting(r)).count();
        let working = rows
            .iter()
            .filter(|r| r.info.status == Status::Working.number())
            .count();
        let mut title = vec![
            Span::styled("paddock top", Style::new().add_modifier(Modifier::BOLD)),
            Span::raw(format!(
                "  {} session(s) · {working} working · ",
                rows.len()
            )),
        ];
        let w = format!("{waiting} waiting for you");
        title.push(if waiting > 0 {
            Span::styled(
                w,
                Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD),
            )
        } else {
            Span::raw(w)
        });
        f.render_widget(Paragraph::new(Line::from(title)), head);

        let header = Row::new([
            "", "NAME", "PROVIDER", "DRIVER", "STATE", "DOING", "TOKENS", "AGE",
        ])
        .style(Style::new().add_modifier(Modifier::BOLD));
        let body = rows.iter().map(|r| {
            let i = &r.info;
            let wait = self.waiting(r);
            let name = if i.agent_name.is_empty() {
                short_id(&i.id)
            } else {
                i.agent_name.clone()
            };
            let doing = match self.asks(&i.id).first() {
                Some(a) => format!("asks: {}", a.summary),
                None if !r.activity.is_empty() => r.activity.clone(),
                None => i.error_message.clone(),
            };
            let style = if wait {
                Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD)
            } else if state_of(i) == "failed" {
                Style::new().fg(Color::Red)
            } else if Status::from_number(i.status).is_some_and(|s| s.is_terminal()) {
                Style::new().fg(Color::DarkGray)
            } else {
                Style::new()
            };
            Row::new([
                Cell::from(if wait { "!" } else { " " }),
                Cell::from(for_terminal(&one_line(&name, 14)).into_owned()),
                Cell::from(provider_name(i.provider)),
                Cell::from(driver_of(i)),
                Cell::from(state_of(i)),
                Cell::from(for_terminal(&one_line(&doing, 200)).into_owned()),
                Cell::from(tokens(i.tokens_input + i.tokens_output)),
                Cell::from(age(&i.created_at, self.now_ms)),
            ])
            .style(style)
        });
        let widths = [
            Constraint::Length(1),
            Constraint::Length(14),
            Constraint::Length(11),
            Constraint::Length(6),
            Constraint::Length(8),
            Constraint::Min(10),
            Constraint::Length(6),
            Constraint::Length(4),
        ];
        let selected = self
            .selected_row()
            .and_then(|s| rows.iter().position(|r| r.info.id == s.info.id));
        let mut state = TableState::default().with_selected(selected);
        f.render_stateful_widget(
            Table::new(body, widths)
                .header(header)
                .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED)),
            table,
            &mut state,
        );
        f.render_widget(
            Paragraph::new(self.detail()).wrap(Wrap { trim: true }),
            detail,
        );
        let foot_line = match &self.mode {
            Mode::Normal if !self.said.is_empty() => Line::from(self.said.clone()),
            Mode::Normal => Line::from(
                "a approve  d deny  t answer  ⏎ attach  s stop  r restart  x delete  ↑↓  q quit",
            ),
            Mode::Answer { text, .. } => {
                Line::from(format!("answer (⏎ sends, esc drops): {text}▏"))
            }
            Mode::Deny { text, .. } => {
                Line::from(format!("deny, because (⏎ sends, esc drops): {text}▏"))
            }
            Mode::ConfirmDelete(id) => Line::from(Span::styled(
                format!(
                    "delete {} and everything stored about it? y/N",
                    short_id(id)
                ),
                Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
            )),
        };
        f.render_widget(Paragraph::new(foot_line), foot);
    }

    /// The selected session's lines under the table: what it asks, or how it ended.
    fn detail(&self) -> Vec<Line<'static>> {
        let Some(r) = self.selected_row() else {
            return vec![Line::from(
                "no sessions yet: `paddock session create …` starts one",
            )];
        };
        let i = &r.info;
        let mut lines = vec![Line::from(
            for_terminal(&format!(
                "{}  {} {}  {}",
                i.id,
                provider_name(i.provider),
                i.model,
                i.working_dir
            ))
            .into_owned(),
        )];
        match self.asks(&i.id).first() {
            Some(a) => {
                let how = if a.kind == pb::ApprovalKind::Permission as i32 {
                    "a approves · d denies"
                } else {
                    "t answers"
                };
                lines.push(Line::from(Span::styled(
                    for_terminal(&format!(
                        "{}: {} — {how}  [{}, {}]",
                        kind_name(a.kind),
                        a.summary,
                        state_name(a.state),
                        a.id
                    ))
                    .into_owned(),
                    Style::new().fg(Color::Yellow),
                )));
            }
            None if !i.error_message.is_empty() => lines.push(Line::from(Span::styled(
                for_terminal(&format!("{} {}", i.error_code, i.error_message)).into_owned(),
                Style::new().fg(Color::Red),
            ))),
            None => lines.push(Line::from(
                for_terminal(&one_line(&r.activity, 300)).into_owned(),
            )),
        }
        lines
    }
}

/// Where the session runs: paddock runs every agent as a local supervised process.
fn driver_of(_: &pb::SessionInfo) -> &'static str {
    super::view::DRIVERS[0]
}

/// The end of a ULID: its random part, unique enough on one screen.
fn short_id(id: &str) -> String {
    let n = id.chars().count();
    id.chars().skip(n.saturating_sub(10)).collect()
}

/// 950, 12.3k, 4.1M.
fn tokens(n: i64) -> String {
    match n {
        n if n < 1000 => n.to_string(),
        n if n < 1_000_000 => format!("{:.1}k", n as f64 / 1e3),
        n => format!("{:.1}M", n as f64 / 1e6),
    }
}

/// One line for a session's newest activity.
fn activity_line(a: &pb::SessionActivityEvent) -> String {
    let kind = super::view::activity_name(a.r#type).to_lowercase();
    let what = if a.tool_name.is_empty() {
        a.content.clone()
    } else {
        format!("{} {}", a.tool_name, a.content)
    };
    one_line(&format!("{kind}: {what}"), 300)
}

/// Turns the daemon's watch streams into updates until they end (or `tx` is dropped).
async fn feed(ch: client::Conn, tx: mpsc::Sender<Update>) {
    let why = match feed_inner(ch, &tx).await {
        Ok(()) => "the daemon closed its streams".to_string(),
        Err(e) => e.to_string(),
    };
    let _ = tx.send(Update::Lost(why)).await;
}

async fn feed_inner(ch: client::Conn, tx: &mpsc::Sender<Update>) -> Result<()> {
    let mut c = client::client_of(ch);
    // Subscribed before listing, so nothing falls between the list and the streams.
    let mut statuses = c
        .watch_all_sessions(pb::WatchAllSessionsRequest::default())
        .await?
        .into_inner();
    let mut approvals = c
        .watch_approvals(pb::WatchApprovalsRequest::default())
        .await?
        .into_inner();
    let mut watches: BTreeMap<String, tokio::task::JoinHandle<()>> = BTreeMap::new();
    let mut known = BTreeSet::new();
    let mut resync = tokio::time::interval(RESYNC);
    loop {
        tokio::select! {
            // The first tick is at once: the initial list. Later ones catch what has no
            // status event (a session another client deleted).
            _ = resync.tick() => {
                let all = super::list_sessions(
                    &mut c,
                    pb::ListSessionsRequest {
                        include_terminated: true,
                        view: pb::SessionView::Basic.into(),
                        ..Default::default()
                    },
                )
                .await?;
                let now: BTreeSet<String> = all.iter().map(|s| s.id.clone()).collect();
                for gone in known.difference(&now) {
                    if tx.send(Update::Gone(gone.clone())).await.is_err() {
                        return Ok(());
                    }
                }
                known = now;
                for s in all {
                    follow(&c, &s, &mut watches, tx);
                    if tx.send(Update::Session(Box::new(s))).await.is_err() {
                        return Ok(());
                    }
                }
            }
            ev = statuses.message() => {
                let Some(ev) = ev? else { return Ok(()) };
                let got = c
                    .get_session(pb::GetSessionRequest { session_id: ev.session_id.clone() })
                    .await;
                let update = match got {
                    Ok(s) => {
                        let s = s.into_inner();
                        known.insert(s.id.clone());
                        follow(&c, &s, &mut watches, tx);
                        Update::Session(Box::new(s))
                    }
                    Err(st) if st.code() == tonic::Code::NotFound => Update::Gone(ev.session_id),
                    Err(st) => return Err(st.into()),
                };
                if tx.send(update).await.is_err() {
                    return Ok(());
                }
            }
            a = approvals.message() => {
                let Some(a) = a? else { return Ok(()) };
                if tx.send(Update::Approval(Box::new(a))).await.is_err() {
                    return Ok(());
                }
            }
            _ = tx.closed() => return Ok(()),
        }
    }
}

/// Follows a live session's activity (from its newest event), unless already followed or
/// [`ACTIVITY_WATCHES_MAX`] are.
fn follow(
    c: &Client,
    s: &pb::SessionInfo,
    watches: &mut BTreeMap<String, tokio::task::JoinHandle<()>>,
    tx: &mpsc::Sender<Update>,
) {
    watches.retain(|_, h| !h.is_finished());
    let live = Status::from_number(s.status).is_some_and(|st| !st.is_terminal());
    if !live || watches.contains_key(&s.id) || watches.len() >= ACTIVITY_WATCHES_MAX {
        return;
    }
    let (mut c, tx, id) = (c.clone(), tx.clone(), s.id.clone());
    let handle = tokio::spawn(async move {
        let req = pb::WatchActivityRequest {
            session_id: id.clone(),
            after_seq: -1,
        };
        let Ok(stream) = c.watch_activity(req).await else {
            return;
        };
        let mut stream = stream.into_inner();
        while let Ok(Some(a)) = stream.message().await {
            let text = activity_line(&a);
            let update = Update::Activity {
                session: id.clone(),
                text,
            };
            if tx.send(update).await.is_err() {
                return;
            }
        }
    });
    watches.insert(s.id.clone(), handle);
}

/// Reads keys on a thread of its own (crossterm's read blocks); paused while `attach` owns the
/// terminal.
struct Keys {
    paused: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Keys {
    fn start(tx: mpsc::Sender<Update>) -> Keys {
        let paused = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (paused.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if p.load(Ordering::Relaxed) {
                    std::thread::sleep(KEY_POLL);
                    continue;
                }
                match event::poll(KEY_POLL) {
                    Ok(true) => {
                        if let Ok(Event::Key(k)) = event::read() {
                            if tx.blocking_send(Update::Key(k)).is_err() {
                                return;
                            }
                        }
                    }
                    Ok(false) => {}
                    Err(_) => return,
                }
            }
        });
        Keys { paused, stop }
    }

    /// Stops reading, and waits out a read in progress.
    fn pause(&self) {
        self.paused.store(true, Ordering::Relaxed);
        std::thread::sleep(KEY_POLL * 2);
    }

    fn resume(&self) {
        self.paused.store(false, Ordering::Relaxed);
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// How often the whole list is read again (the streams carry every change but a deletion).
const RESYNC: Duration = Duration::from_secs(10);

/// How long the key thread waits for a key before it looks at its flags again.
const KEY_POLL: Duration = Duration::from_millis(50);

/// `paddock top`.
pub async fn run(ctx: &Ctx) -> Result<()> {
    if ctx.json || !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        return Err(Error::Usage(
            "top is a terminal dashboard (`paddock session list` prints a table, \
             `paddock --json session list` JSON)"
                .into(),
        ));
    }
    let ch = client::connect_channel(ctx).await?;
    let (tx, mut rx) = mpsc::channel(1024);
    tokio::spawn(feed(ch.clone(), tx.clone()));
    let keys = Keys::start(tx.clone());
    let mut dash = Dashboard::new(crate::paths::now_ms());
    let mut terminal = ratatui::init();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let result = loop {
        if let Err(e) = terminal.draw(|f| dash.render(f)) {
            break Err(Error::io("the terminal")(e));
        }
        if dash.take_bell() {
            super::output::bell();
        }
        let update = tokio::select! {
            u = rx.recv() => match u {
                Some(u) => u,
                None => break Ok(()),
            },
            _ = tick.tick() => Update::Tick(crate::paths::now_ms()),
        };
        match dash.apply(update) {
            Action::None => {}
            Action::Quit => break Ok(()),
            Action::Attach(id) => {
                keys.pause();
                ratatui::restore();
                let mut c = client::client_of(ch.clone());
                if let Err(e) = super::attach::run(&mut c, id).await {
                    eprintln!("{e}");
                }
                terminal = ratatui::init();
                keys.resume();
            }
            action => {
                let (c, tx) = (client::client_of(ch.clone()), tx.clone());
                tokio::spawn(async move {
                    let deleted = match &action {
                        Action::Delete(id) => Some(id.clone()),
                        _ => None,
                    };
                    let said = match act(c, action).await {
                        Ok(said) => {
                            // A deletion has no status event: the row goes now.
                            if let Some(id) = deleted {
                                let _ = tx.send(Update::Gone(id)).await;
                            }
                            said
                        }
                        Err(e) => e.to_string(),
                    };
                    let _ = tx.send(Update::Said(said)).await;
                });
            }
        }
    };
    ratatui::restore();
    drop(keys);
    result
}

/// Carries out an RPC action; what to show.
async fn act(mut c: Client, action: Action) -> Result<String> {
    use pb::ApprovalDecision as D;
    let decided = match &action {
        Action::Approve(id) => Some((id.clone(), D::Approve, String::new(), "approved")),
        Action::Deny { approval, reason } => {
            Some((approval.clone(), D::Deny, reason.clone(), "denied"))
        }
        Action::Answer { approval, text } => {
            Some((approval.clone(), D::Answer, text.clone(), "answered"))
        }
        _ => None,
    };
    if let Some((approval_id, decision, text, verb)) = decided {
        let a = c
            .resolve_approval(pb::ResolveApprovalRequest {
                approval_id,
                decision: decision as i32,
                text,
                is_error: false,
                resolved_by: "top".into(),
            })
            .await?
            .into_inner();
        return Ok(format!("{verb} {}", a.id));
    }
    Ok(match action {
        Action::Stop(id) => {
            c.stop_session(pb::StopSessionRequest {
                session_id: id.clone(),
                graceful: true,
            })
            .await?;
            format!("stopped {}", short_id(&id))
        }
        Action::Restart(id) => {
            c.restart_session(pb::RestartSessionRequest {
                session_id: id.clone(),
                provider_config: Default::default(),
            })
            .await?;
            format!("restarted {}", short_id(&id))
        }
        Action::Delete(id) => {
            let info = c
                .get_session(pb::GetSessionRequest {
                    session_id: id.clone(),
                })
                .await?
                .into_inner();
            super::latis::stop_and_delete(&mut c, &info).await?;
            format!("deleted {}", short_id(&id))
        }
        Action::None
        | Action::Quit
        | Action::Attach(_)
        | Action::Approve(_)
        | Action::Deny { .. }
        | Action::Answer { .. } => String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    const NOW: u64 = 1_800_000_000_000;

    fn session(id: &str, name: &str, status: Status, turns: i64) -> Update {
        Update::Session(Box::new(pb::SessionInfo {
            id: id.into(),
            agent_name: name.into(),
            provider: pb::SessionProvider::ClaudeCode as i32,
            model: "sonnet".into(),
            status: status.number(),
            turns_completed: turns,
            tokens_input: 1200,
            tokens_output: 345,
            working_dir: "/home/me/project".into(),
            created_at: Some(prost_types::Timestamp {
                seconds: (NOW / 1000 - 125) as i64,
                nanos: 0,
            }),
            ..Default::default()
        }))
    }

    fn ask(id: &str, session: &str, kind: pb::ApprovalKind, state: pb::ApprovalState) -> Update {
        Update::Approval(Box::new(pb::Approval {
            id: id.into(),
            session_id: session.into(),
            kind: kind as i32,
            state: state as i32,
            summary: "Bash: rm -rf build".into(),
            ..Default::default()
        }))
    }

    fn key(c: KeyCode) -> Update {
        Update::Key(KeyEvent::new(c, KeyModifiers::NONE))
    }

    fn screen(d: &Dashboard) -> String {
        let mut t = Terminal::new(TestBackend::new(80, 24)).unwrap();
        t.draw(|f| d.render(f)).unwrap();
        let buf = t.backend().buffer().clone();
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
                    .trim_end()
                    .to_string()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Three sessions, one of them asking: the asking one is listed first, marked, and the
    /// selection starts on it.
    fn three() -> Dashboard {
        let mut d = Dashboard::new(NOW);
        d.apply(session("01AAA", "idle-one", Status::Running, 1));
        d.apply(session("01BBB", "busy", Status::Working, 0));
        d.apply(session("01CCC", "needs-me", Status::Waiting, 0));
        d.apply(ask(
            "apr_1",
            "01CCC",
            pb::ApprovalKind::Permission,
            pb::ApprovalState::Pending,
        ));
        d.apply(Update::Activity {
            session: "01BBB".into(),
            text: "tool_call: Read src/main.rs".into(),
        });
        d
    }

    #[test]
    fn waiting_sessions_come_first_and_the_screen_fits_80_by_24() {
        let d = three();
        let s = screen(&d);
        insta::assert_snapshot!(s);
        let rows: Vec<&str> = s.lines().skip(2).take(3).collect();
        assert!(rows[0].starts_with("! needs-me"), "{s}");
        assert!(
            rows[1].contains("busy") && rows[1].contains("tool_call: Read"),
            "{s}"
        );
        assert!(
            rows[2].contains("idle-one") && rows[2].contains("complete"),
            "{s}"
        );
    }

    #[test]
    fn a_new_request_rings_the_bell_once() {
        let mut d = three();
        assert!(d.take_bell());
        assert!(!d.take_bell());
        d.apply(ask(
            "apr_1",
            "01CCC",
            pb::ApprovalKind::Permission,
            pb::ApprovalState::Pending,
        ));
        assert!(!d.take_bell(), "the same request again is not new");
    }

    #[test]
    fn keys_approve_deny_answer_and_confirm_deletes() {
        let mut d = three();
        assert_eq!(
            d.apply(key(KeyCode::Char('a'))),
            Action::Approve("apr_1".into())
        );
        // Deny asks why; Enter sends it.
        assert_eq!(d.apply(key(KeyCode::Char('d'))), Action::None);
        for c in "no".chars() {
            d.apply(key(KeyCode::Char(c)));
        }
        assert!(screen(&d).contains("deny, because (⏎ sends, esc drops): no"));
        assert_eq!(
            d.apply(key(KeyCode::Enter)),
            Action::Deny {
                approval: "apr_1".into(),
                reason: "no".into()
            }
        );
        // A permission is not answered with text, and a question is not approved.
        assert_eq!(d.apply(key(KeyCode::Char('t'))), Action::None);
        assert!(d.said.contains("a approves"), "{}", d.said);
        d.apply(ask(
            "apr_1",
            "01CCC",
            pb::ApprovalKind::Permission,
            pb::ApprovalState::Approved,
        ));
        d.apply(ask(
            "apr_2",
            "01CCC",
            pb::ApprovalKind::Question,
            pb::ApprovalState::Pending,
        ));
        assert_eq!(d.apply(key(KeyCode::Char('a'))), Action::None);
        assert!(d.said.contains("is a question"), "{}", d.said);
        d.apply(key(KeyCode::Char('t')));
        d.apply(key(KeyCode::Char('4')));
        d.apply(key(KeyCode::Char('2')));
        assert_eq!(
            d.apply(key(KeyCode::Enter)),
            Action::Answer {
                approval: "apr_2".into(),
                text: "42".into()
            }
        );
        // Moving down selects the next row; x asks first, only y deletes.
        d.apply(key(KeyCode::Down));
        assert_eq!(
            d.apply(key(KeyCode::Char('s'))),
            Action::Stop("01BBB".into())
        );
        d.apply(key(KeyCode::Char('x')));
        assert!(screen(&d).contains("delete 01BBB and everything stored about it? y/N"));
        assert_eq!(d.apply(key(KeyCode::Char('n'))), Action::None);
        d.apply(key(KeyCode::Char('x')));
        assert_eq!(
            d.apply(key(KeyCode::Char('y'))),
            Action::Delete("01BBB".into())
        );
        assert_eq!(d.apply(key(KeyCode::Enter)), Action::Attach("01BBB".into()));
        assert_eq!(
            d.apply(key(KeyCode::Char('r'))),
            Action::Restart("01BBB".into())
        );
        assert_eq!(d.apply(key(KeyCode::Char('q'))), Action::Quit);
    }

    #[test]
    fn the_selection_follows_its_session_when_rows_reorder() {
        let mut d = three();
        d.apply(key(KeyCode::Down)); // busy
                                     // needs-me is answered and goes idle: busy moves to the top, still selected.
        d.apply(ask(
            "apr_1",
            "01CCC",
            pb::ApprovalKind::Permission,
            pb::ApprovalState::Approved,
        ));
        d.apply(session("01CCC", "needs-me", Status::Running, 1));
        assert_eq!(
            d.apply(key(KeyCode::Char('s'))),
            Action::Stop("01BBB".into())
        );
        d.apply(Update::Gone("01BBB".into()));
        assert!(!screen(&d).contains("busy"));
    }

    #[test]
    fn agent_text_cannot_drive_the_terminal() {
        let mut d = three();
        d.apply(Update::Activity {
            session: "01BBB".into(),
            text: "evil \u{1b}]0;pwned\u{7} text".into(),
        });
        let s = screen(&d);
        assert!(!s.contains('\u{1b}'), "{s}");
    }

    #[test]
    fn tokens_read_short() {
        assert_eq!(tokens(950), "950");
        assert_eq!(tokens(12_345), "12.3k");
        assert_eq!(tokens(4_100_000), "4.1M");
    }
}
