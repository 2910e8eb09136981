//! Telling a human when an agent needs them, as the configuration's `[notify]` says: a request
//! for approval, a question, a session that failed, one that ran out of budget, a turn that
//! ended. Each event goes to a shell command (`sh -c`, contained and bounded in time like every
//! supervised process), a webhook (a JSON POST) and the desktop (`notify-send`, where a session
//! bus exists), whichever are configured.
//!
//! It only listens: events come from the hub's broadcasts, after they were committed, and a
//! slow or failing hook never holds anything up. At most `QUEUE` deliveries wait; past that
//! they are dropped and counted in the log.

use std::collections::BTreeSet;
use std::time::Duration;

use paddock_core::{AskKind, Status};
use serde_json::json;
use tokio::sync::{broadcast, mpsc};

use super::fanout::{hear, Heard};
use super::port::Hub;
use crate::config::{NotifyConfig, NOTIFY_DEFAULT};

/// Deliveries waiting at most.
const QUEUE: usize = 64;
/// How long a hook command may run before it is killed.
const COMMAND_WAIT: Duration = Duration::from_secs(10);
/// How long a webhook POST may take.
const WEBHOOK_WAIT: Duration = Duration::from_secs(5);

/// One thing to tell.
#[derive(Debug, Clone)]
pub struct Note {
    /// `approval`, `question`, `failure`, `budget` or `turn_done`.
    pub event: &'static str,
    pub session: String,
    pub message: String,
    /// The request's id, for `approval` and `question`.
    pub approval: String,
}

/// Where notes go, from the configuration.
#[derive(Debug, Clone, Default)]
pub struct Notifier {
    on: BTreeSet<String>,
    command: Option<String>,
    webhook: Option<String>,
    desktop: bool,
}

impl Notifier {
    pub fn from_config(c: &NotifyConfig) -> Notifier {
        let on = match &c.on {
            Some(on) => on.get_ref().iter().cloned().collect(),
            None => NOTIFY_DEFAULT.iter().map(|s| s.to_string()).collect(),
        };
        let desktop = c.desktop.as_ref().is_none_or(|d| *d.get_ref())
            && std::env::var_os("DBUS_SESSION_BUS_ADDRESS").is_some()
            && crate::paths::find_on_own_path("notify-send").is_some();
        Notifier {
            on,
            command: c.command.as_ref().map(|c| c.get_ref().clone()),
            webhook: c.webhook.as_ref().map(|w| w.get_ref().clone()),
            desktop,
        }
    }

    fn has_outlet(&self) -> bool {
        self.command.is_some() || self.webhook.is_some() || self.desktop
    }

    /// Starts listening on `hub`; nothing when nothing is configured to receive.
    pub fn start(self, hub: &Hub) {
        if !self.has_outlet() || self.on.is_empty() {
            return;
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(listen(
            hub.approval.subscribe(),
            hub.status.subscribe(),
            self.on.clone(),
            tx,
        ));
        tokio::spawn(deliver(self, rx));
    }
}

/// What a status change is worth telling, if anything.
pub fn status_note(previous: Option<Status>, new: Status, message: &str) -> Option<&'static str> {
    match (previous, new) {
        // A FAILED status's message is its error as the core renders it (`OBEY-NNNN: …`).
        (_, Status::Failed)
            if paddock_core::ErrorCode::parse(message)
                == Some(paddock_core::ErrorCode::BudgetExceeded) =>
        {
            Some("budget")
        }
        (_, Status::Failed) => Some("failure"),
        (Some(Status::Working), Status::Running) => Some("turn_done"),
        _ => None,
    }
}

async fn listen(
    mut approvals: broadcast::Receiver<paddock_core::Approval>,
    mut statuses: broadcast::Receiver<paddock_core::StatusEvent>,
    on: BTreeSet<String>,
    tx: mpsc::Sender<Note>,
) {
    let mut dropped = 0u64;
    // Notes are best effort (a hook is told of what it can keep up with), but a gap is said.
    let behind = |n: u64| tracing::warn!("notify hooks fell {n} events behind; those are skipped");
    loop {
        let note = tokio::select! {
            a = hear(&mut approvals) => match a {
                Heard::Event(a) if a.state == paddock_core::ApprovalState::Pending => Note {
                    event: if a.kind == AskKind::Permission { "approval" } else { "question" },
                    session: a.session.0.clone(),
                    message: a.summary.clone(),
                    approval: a.id.clone(),
                },
                Heard::Event(_) => continue,
                Heard::Behind(n) => {
                    behind(n);
                    continue;
                }
                Heard::Over => return,
            },
            s = hear(&mut statuses) => match s {
                Heard::Event(s) => match status_note(s.previous, s.new, &s.message) {
                    Some(event) => Note {
                        event,
                        session: s.session.0.clone(),
                        message: if s.message.is_empty() { s.new.name().to_string() } else { s.message.clone() },
                        approval: String::new(),
                    },
                    None => continue,
                },
                Heard::Behind(n) => {
                    behind(n);
                    continue;
                }
                Heard::Over => return,
            },
        };
        if !on.contains(note.event) {
            continue;
        }
        match tx.try_send(note) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                dropped += 1;
                tracing::warn!(dropped, "notifications are not keeping up; one dropped");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return,
        }
    }
}

async fn deliver(n: Notifier, mut rx: mpsc::Receiver<Note>) {
    while let Some(note) = rx.recv().await {
        if let Some(cmd) = &n.command {
            run_command(cmd, &note).await;
        }
        if let Some(url) = &n.webhook {
            post(url.clone(), &note).await;
        }
        if n.desktop {
            let mut c = tokio::process::Command::new("notify-send");
            c.arg(format!("paddock: {}", note.event))
                .arg(format!("{} — {}", note.message, note.session));
            run(c, "notify-send").await;
        }
    }
}

async fn run_command(cmd: &str, note: &Note) {
    let mut c = tokio::process::Command::new("sh");
    c.arg("-c")
        .arg(cmd)
        .env("PADDOCK_EVENT", note.event)
        .env("PADDOCK_SESSION", &note.session)
        .env("PADDOCK_MESSAGE", &note.message)
        .env("PADDOCK_APPROVAL", &note.approval);
    run(c, "the notify command").await;
}

/// Runs a hook contained and bounded in time: killed (its whole tree) past [`COMMAND_WAIT`].
async fn run(cmd: tokio::process::Command, what: &str) {
    let (process, _pipes) = match crate::proc::spawn(cmd, false, crate::contain::new_tag()) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("{what}: {e}");
            return;
        }
    };
    let pid = process.pid;
    match tokio::time::timeout(COMMAND_WAIT, process.wait()).await {
        Ok(exit) if exit.code == Some(0) => {}
        Ok(exit) => tracing::warn!(?exit, "{what} failed"),
        Err(_) => {
            crate::proc::signal_group(pid, paddock_core::Signal::Kill);
            tracing::warn!("{what} took longer than {COMMAND_WAIT:?}; killed");
        }
    }
}

async fn post(url: String, note: &Note) {
    let body = json!({
        "event": note.event,
        "session": note.session,
        "message": note.message,
        "approval": note.approval,
        "at_ms": crate::paths::now_ms(),
    })
    .to_string();
    let sent = tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(WEBHOOK_WAIT))
            .build()
            .into();
        agent
            .post(&url)
            .header("content-type", "application/json")
            .send(body)
            .map(drop)
    })
    .await;
    match sent {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("notify webhook: {e}"),
        Err(e) => tracing::warn!("notify webhook: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_status_changes_are_told() {
        assert_eq!(
            status_note(
                Some(Status::Working),
                Status::Failed,
                "OBEY-2013: token budget exceeded"
            ),
            Some("budget")
        );
        assert_eq!(
            status_note(Some(Status::Running), Status::Failed, "OBEY-2032: lost"),
            Some("failure")
        );
        assert_eq!(
            status_note(Some(Status::Working), Status::Running, ""),
            Some("turn_done")
        );
        assert_eq!(
            status_note(Some(Status::Running), Status::Working, ""),
            None
        );
        assert_eq!(status_note(None, Status::Created, ""), None);
    }
}
