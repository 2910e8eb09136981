//! `aria.v1`: the task, notification, session and container services, mapped onto the same
//! engine as every other protocol. Errors are the standard gRPC codes with a `google.rpc.Status`
//! detail (an `ErrorInfo` whose reason names the failure, domain `paddock`).
//!
//! - `TaskService`: tasks are the core's task machine; output is stored and bounded there.
//! - `NotificationService`: every task status change, and session status changes worth a
//!   client's attention (a paddock extension of the `Notification` oneof).
//! - `SessionService`: an Aria session *is* a paddock session, created with the daemon's
//!   default Aria provider in the Aria workspace campaign; `ExecuteTurn` is a SendMessage.
//! - `ContainerService`: a container is an environment of its own (podman from an image, or
//!   bubblewrap over the host's root), its life the core's; `container:exec` tasks run in it,
//!   and its logs are what they wrote.

use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;

use crate::store::tasks::TasksOf;
use paddock_core::campaign::NewCampaign;
use paddock_core::container::{ContainerRecord, ContainerRequest, ContainerSpec};
use paddock_core::task::{OutputKind, TaskInput, TaskRecord, TaskReply, TaskSpec};
use paddock_core::{
    ActivityKind, Driver, Error, ErrorCode, Provider, SessionConfig, SessionId, Status,
};
use paddock_proto::aria::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Code, Request, Response, Status as GrpcStatus};

use super::convert;
use super::watch::{self, Watcher};
use crate::daemon::hear;
use crate::daemon::port::{
    Command, Handle, Query, Request as Req, TURN_STREAM_BUFFER, WATCH_BUFFER,
};
use crate::transport::error_status as status;

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, GrpcStatus>> + Send>>;

/// Largest command_json accepted.
const COMMAND_JSON_MAX: usize = 256 * 1024;
/// The campaign Aria sessions run in.
pub const ARIA_CAMPAIGN: &str = "aria";

fn from_core(e: &Error) -> GrpcStatus {
    convert::status(e)
}

fn unavailable(e: Error) -> GrpcStatus {
    status(Code::Unavailable, "DAEMON_UNAVAILABLE", e.to_string())
}

fn store_failed(e: crate::store::StoreError) -> GrpcStatus {
    status(Code::Internal, "STORE", e.to_string())
}

/// Stored task output read per page by WatchTaskOutput.
const OUTPUT_PAGE: usize = 1000;

/// Tasks of other containers a container's log stream remembers as not its own, at most
/// (`stream_container_logs`).
const OTHER_TASKS_REMEMBERED: usize = 1024;

/// Shared configuration of the Aria services.
#[derive(Clone)]
pub struct AriaConfig {
    pub handle: Handle,
    /// Where Aria sessions (and tasks not bound to a session) run.
    pub workspace: PathBuf,
    /// The provider an Aria session runs.
    pub provider: Provider,
    pub model: String,
    /// The host environments are made on (ContainerService's containers).
    pub env: crate::env::Host,
}

// ── TaskService ────────────────────────────────────────────────────────────

pub struct Tasks(pub AriaConfig);

fn task_pb(t: &TaskRecord) -> pb::Task {
    pb::Task {
        id: t.id.clone(),
        user_id: if t.spec.user.is_empty() {
            user()
        } else {
            t.spec.user.clone()
        },
        session_id: t.spec.session_id.clone(),
        container_id: t.spec.container_id.clone(),
        parent_task_id: Some(t.spec.parent_task_id.clone()).filter(|p| !p.is_empty()),
        r#type: t.spec.kind.clone(),
        command_json: serde_json::to_string(&t.spec.command).unwrap_or_default(),
        environment: crate::secret::redact(&t.spec.environment).collect(),
        timeout_seconds: (t.spec.timeout_ms / 1000) as i32,
        status: t.status.number(),
        created_at: Some(convert::timestamp(t.created_at)),
        started_at: convert::opt_timestamp(t.started_at),
        completed_at: convert::opt_timestamp(t.completed_at),
        exit_code: t.exit_code,
        error_message: t.error_message.clone(),
        progress_percent: f64::from(t.progress_centi) / 100.0,
        current_operation: t.current_operation.clone(),
    }
}

/// The daemon's own user: who a task launched before paddock recorded launchers, and an Aria
/// session, belong to.
fn user() -> String {
    std::env::var("USER").unwrap_or_else(|_| nix::unistd::getuid().to_string())
}

fn output_pb(o: &paddock_core::task::TaskOutput) -> pb::TaskOutput {
    use pb::task_output::Output;
    pb::TaskOutput {
        task_id: o.task.clone(),
        timestamp: Some(convert::timestamp(o.at)),
        output: Some(match &o.kind {
            OutputKind::Stdout(s) => Output::StdoutLine(s.clone()),
            OutputKind::Stderr(s) => Output::StderrLine(s.clone()),
            OutputKind::Progress { centi, operation } => Output::Progress(pb::ProgressUpdate {
                percent_complete: f64::from(*centi) / 100.0,
                operation_description: operation.clone(),
            }),
        }),
    }
}

impl Tasks {
    async fn record(&self, id: &str) -> Result<TaskRecord, GrpcStatus> {
        let key = id.to_string();
        self.0
            .handle
            .query(|reply| Query::Task(key, reply))
            .await
            .map_err(unavailable)?
            .map_err(store_failed)?
            .ok_or_else(|| {
                status(
                    Code::NotFound,
                    "TASK_NOT_FOUND",
                    format!("task \"{id}\" not found"),
                )
            })
    }
}

#[tonic::async_trait]
impl pb::task_service_server::TaskService for Tasks {
    async fn launch_task(
        &self,
        request: Request<pb::LaunchTaskRequest>,
    ) -> Result<Response<pb::LaunchTaskResponse>, GrpcStatus> {
        let user = crate::socket::peer_user(&request);
        let r = request.into_inner();
        let bad = |m: String| status(Code::InvalidArgument, "INVALID_TASK", m);
        // A type paddock does not run is refused, never run as a local command anyway.
        let container_id = r.container_id.trim().to_string();
        let kind = paddock_core::task::kind_of(&r.r#type, !container_id.is_empty())
            .map_err(|e| status(Code::Unimplemented, "TASK_TYPE_UNSUPPORTED", e.to_string()))?;
        if r.command_json.len() > COMMAND_JSON_MAX {
            return Err(bad(format!(
                "command_json is larger than {COMMAND_JSON_MAX} bytes"
            )));
        }
        let command: Vec<String> = serde_json::from_str(&r.command_json).map_err(|e| {
            bad(format!(
                "command_json must be a JSON array of strings, like [\"ls\", \"-l\"]: {e}"
            ))
        })?;
        if command.first().is_none_or(|c| c.is_empty()) {
            return Err(bad("command_json must name a program".into()));
        }
        if r.timeout_seconds < 0 {
            return Err(bad("timeout_seconds must not be negative".into()));
        }
        let working_dir = if !container_id.is_empty() {
            // The container's own workspace (the core sets it at launch).
            String::new()
        } else if r.session_id.is_empty() {
            std::fs::create_dir_all(&self.0.workspace).map_err(|e| {
                status(
                    Code::Internal,
                    "WORKSPACE",
                    format!("cannot create the Aria workspace: {e}"),
                )
            })?;
            self.0.workspace.display().to_string()
        } else {
            let id = SessionId(r.session_id.clone());
            self.0
                .handle
                .session(id)
                .await
                .map_err(unavailable)?
                .map(|v| v.record.config.working_dir.clone())
                .ok_or_else(|| {
                    status(
                        Code::NotFound,
                        "SESSION_NOT_FOUND",
                        format!("session \"{}\" not found", r.session_id),
                    )
                })?
        };
        paddock_core::check_environment(&r.environment)
            .map_err(|e| status(Code::InvalidArgument, "INVALID_ARGUMENT", e.to_string()))?;
        let id = format!("task_{}", ulid::Ulid::new());
        let spec = TaskSpec {
            session_id: r.session_id,
            kind: kind.to_string(),
            command,
            environment: r.environment.into_iter().collect(),
            timeout_ms: r.timeout_seconds as u64 * 1000,
            working_dir,
            user,
            container_id,
            parent_task_id: r.parent_task_id.trim().to_string(),
        };
        match self
            .0
            .handle
            .task(TaskInput::Launch {
                req: 0,
                id,
                spec: Box::new(spec),
            })
            .await
        {
            Ok(TaskReply::Launched(task_id)) => {
                Ok(Response::new(pb::LaunchTaskResponse { task_id }))
            }
            Ok(other) => Err(status(
                Code::Internal,
                "INTERNAL",
                format!("unexpected reply {other:?}"),
            )),
            Err(e)
                if matches!(
                    e.code,
                    ErrorCode::ContainerNotFound
                        | ErrorCode::WrongState
                        | ErrorCode::SessionNotFound
                        | ErrorCode::ShuttingDown
                ) =>
            {
                Err(from_core(&e))
            }
            Err(e) => Err(status(Code::ResourceExhausted, "TASK_REFUSED", e.message)),
        }
    }

    async fn get_task(
        &self,
        request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::Task>, GrpcStatus> {
        let t = self.record(&request.into_inner().task_id).await?;
        Ok(Response::new(task_pb(&t)))
    }

    type StreamTaskOutputStream = Stream_<pb::TaskOutput>;

    async fn stream_task_output(
        &self,
        request: Request<pb::StreamTaskOutputRequest>,
    ) -> Result<Response<Self::StreamTaskOutputStream>, GrpcStatus> {
        let r = request.into_inner();
        // Subscribe first, then read what is stored: nothing falls between.
        let mut outputs = self.0.handle.hub.task_output.subscribe(&r.task_id);
        let mut statuses = self.0.handle.hub.task_status.subscribe();
        let rec = self.record(&r.task_id).await?;
        let handle = self.0.handle.clone();
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        tokio::spawn(async move {
            let id = rec.id.clone();
            let Some(last) = send_stored(&handle, &id, &tx, |o| Some(output_pb(o))).await else {
                return;
            };
            if !r.follow || rec.status.is_terminal() {
                return;
            }
            let w = Watcher::new(tx, handle.clone());
            let ended =
                |ev: &paddock_core::task::TaskStatusEvent| ev.task == id && ev.status.is_terminal();
            let ended_now = || {
                let (handle, key) = (&handle, id.clone());
                async move {
                    let now = handle
                        .query(|reply| Query::Task(key, reply))
                        .await
                        .ok()?
                        .ok()?;
                    Some(now.is_none_or(|t| t.status.is_terminal()))
                }
            };
            let page = |after| output_page(&handle, id.clone(), after);
            w.follow_until(
                &mut outputs,
                &mut statuses,
                last,
                page,
                |o| o.seq,
                ended,
                ended_now,
                output_pb,
            )
            .await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn cancel_task(
        &self,
        request: Request<pb::CancelTaskRequest>,
    ) -> Result<Response<pb::CancelTaskResponse>, GrpcStatus> {
        let id = request.into_inner().task_id;
        self.record(&id).await?;
        match self.0.handle.task(TaskInput::Cancel { req: 0, id }).await {
            Ok(TaskReply::Cancel { initiated }) => Ok(Response::new(pb::CancelTaskResponse {
                cancellation_initiated: initiated,
            })),
            Ok(other) => Err(status(
                Code::Internal,
                "INTERNAL",
                format!("unexpected reply {other:?}"),
            )),
            Err(e) => Err(status(Code::NotFound, "TASK_NOT_FOUND", e.message)),
        }
    }

    async fn list_tasks(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, GrpcStatus> {
        let r = request.into_inner();
        let of = match r.session_id.trim() {
            "" => TasksOf::All,
            s => TasksOf::Session(s.to_string()),
        };
        let limit = convert::page_limit(r.limit, LIST_TASKS_DEFAULT, LIST_TASKS_MAX);
        let (tasks, truncated) = self
            .0
            .handle
            .query(|reply| Query::Tasks { of, limit, reply })
            .await
            .map_err(unavailable)?
            .map_err(store_failed)?;
        Ok(Response::new(pb::ListTasksResponse {
            tasks: tasks.iter().map(task_pb).collect(),
            truncated,
        }))
    }
}

/// A page of task `task`'s stored output after sequence number `after`.
async fn output_page(
    handle: &crate::daemon::port::Handle,
    task: String,
    after: u64,
) -> Result<Vec<paddock_core::task::TaskOutput>, GrpcStatus> {
    handle
        .query(|reply| Query::TaskOutput {
            task,
            after,
            limit: OUTPUT_PAGE,
            reply,
        })
        .await
        .map_err(unavailable)
        .and_then(|r| r.map_err(store_failed))
}

/// Sends task `task`'s stored output, each line as `map` makes it: the last sequence number
/// read, or `None` (the client went away, or was told the read failed).
async fn send_stored<T>(
    handle: &crate::daemon::port::Handle,
    task: &str,
    tx: &mpsc::Sender<Result<T, GrpcStatus>>,
    map: impl Fn(&paddock_core::task::TaskOutput) -> Option<T>,
) -> Option<u64> {
    let page = |after| output_page(handle, task.to_string(), after);
    watch::send_stored(tx, 0, page, |o| o.seq, map).await
}

/// ListTasks' answers when the request names no limit, and at most.
const LIST_TASKS_DEFAULT: usize = 100;
const LIST_TASKS_MAX: usize = 1000;

// ── NotificationService ───────────────────────────────────────────────────

pub struct Notifications(pub AriaConfig);

#[tonic::async_trait]
impl pb::notification_service_server::NotificationService for Notifications {
    type StreamNotificationsStream = Stream_<pb::Notification>;

    async fn stream_notifications(
        &self,
        request: Request<pb::StreamNotificationsRequest>,
    ) -> Result<Response<Self::StreamNotificationsStream>, GrpcStatus> {
        use pb::notification::EventPayload;
        // Session notifications are paddock's payload (100): only for a client that says it
        // understands them; a seed client gets the seed's payloads only.
        let sessions_too = super::extensions::Understood::of(&request).session_notifications;
        let mut tasks = self.0.handle.hub.task_status.subscribe();
        let mut sessions = self.0.handle.hub.status.subscribe();
        let mut notices = self.0.handle.hub.notice.subscribe();
        // Notices of the last NOTICE_REPLAY first (subscribed before they are read, so none
        // falls between): a client that resubscribes after a daemon restart learns what the
        // restart found, which was raised before it could have resubscribed.
        let since = paddock_core::Timestamp::from_millis(
            crate::paths::now_ms().saturating_sub(NOTICE_REPLAY.as_millis() as u64),
        );
        let replay = if sessions_too {
            self.0.handle.hub.recent_notices(since)
        } else {
            Vec::new()
        };
        let handle = self.0.handle.clone();
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        tokio::spawn(async move {
            let replayed: std::collections::BTreeSet<String> =
                replay.iter().map(|n| n.id.clone()).collect();
            let w = Watcher::new(tx, handle);
            for n in replay {
                if !w.send(notice_notification(&n)).await {
                    return;
                }
            }
            loop {
                let (at, payload) = tokio::select! {
                    biased;
                    _ = w.gone() => return,
                    heard = hear(&mut tasks) => {
                        let Some(ev) = w.take(heard).await else { return };
                        (ev.at, EventPayload::TaskStatus(pb::TaskStatusEvent {
                            task_id: ev.task.clone(),
                            new_status: ev.status.number(),
                            status_message: ev.message.clone(),
                            exit_code: ev.exit_code,
                        }))
                    }
                    heard = hear(&mut sessions), if sessions_too => {
                        let Some(ev) = w.take(heard).await else { return };
                        // Worth a client's attention: a session is up, blocked on a human
                        // (and unblocked), or over. Turn-by-turn RUNNING ⇄ WORKING is not.
                        if !worth_notifying(ev.previous, ev.new) {
                            continue;
                        }
                        (ev.at, EventPayload::SessionStatus(pb::SessionStatusNotification {
                            session_id: ev.session.0.clone(),
                            previous_status: ev.previous.map(|s| s.name()).unwrap_or("UNSPECIFIED").to_string(),
                            new_status: ev.new.name().to_string(),
                            message: ev.message.clone(),
                        }))
                    }
                    // Not a status change but as worth attention (output lost while the
                    // daemon was away): the same payload, the status unchanged, the message
                    // saying what happened.
                    heard = hear(&mut notices), if sessions_too => {
                        let Some(n) = w.take(heard).await else { return };
                        if !replayed.contains(&n.id) && !w.send(notice_notification(&n)).await {
                            return;
                        }
                        continue;
                    }
                    // Last: events already queued are delivered before the stream ends.
                    _ = w.daemon_done() => return,
                };
                let n = pb::Notification {
                    id: format!("ntf_{}", ulid::Ulid::new()),
                    timestamp: Some(convert::timestamp(at)),
                    event_payload: Some(payload),
                };
                if !w.send(n).await {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// How far back a new notification subscriber is told of notices (`Hub::recent_notices`).
pub const NOTICE_REPLAY: std::time::Duration = std::time::Duration::from_secs(600);

/// A notice as an Aria notification: a session notification whose status is unchanged and whose
/// message says what happened, with the notice's own id (the same in a replay).
fn notice_notification(n: &crate::daemon::port::IssuedNotice) -> pb::Notification {
    use pb::notification::EventPayload;
    let notice = &n.notice;
    pb::Notification {
        id: n.id.clone(),
        timestamp: Some(convert::timestamp(notice.at)),
        event_payload: Some(EventPayload::SessionStatus(pb::SessionStatusNotification {
            session_id: notice.session.0.clone(),
            previous_status: notice.status.name().to_string(),
            new_status: notice.status.name().to_string(),
            message: notice.message.clone(),
        })),
    }
}

/// Which session status changes the notification stream carries: a session coming up, one
/// blocked on a human or unblocked, one ending; not every turn's RUNNING ⇄ WORKING.
fn worth_notifying(previous: Option<Status>, new: Status) -> bool {
    match (previous, new) {
        (Some(Status::Running), Status::Working) | (Some(Status::Working), Status::Running) => {
            false
        }
        (Some(Status::Waiting), _) => true,
        (_, s) => matches!(
            s,
            Status::Running | Status::Waiting | Status::Stopped | Status::Failed
        ),
    }
}

// ── SessionService ────────────────────────────────────────────────────────

pub struct Sessions(pub AriaConfig);

/// An Aria session as `understood` may see it: the seed's statuses are "active", "completed"
/// and "failed"; "waiting" (blocked on a human, its requests listed by obey's ListApprovals)
/// only for a client that says it understands WAITING (`paddock-extensions`).
fn session_pb(
    r: &paddock_core::SessionRecord,
    understood: super::extensions::Understood,
) -> pb::Session {
    let status = match r.status {
        Status::Stopped => "completed",
        Status::Failed => "failed",
        Status::Waiting if understood.waiting => "waiting",
        _ => "active",
    };
    let mut ctx = std::collections::BTreeMap::new();
    ctx.insert("provider".to_string(), r.config.provider.name().to_string());
    ctx.insert("model".to_string(), r.config.model.clone());
    ctx.insert("paddock_status".to_string(), r.status.name().to_string());
    ctx.insert("working_dir".to_string(), r.config.working_dir.clone());
    ctx.insert("agent_name".to_string(), r.config.agent_name.clone());
    ctx.insert("tokens_input".to_string(), r.tokens_input.to_string());
    ctx.insert("tokens_output".to_string(), r.tokens_output.to_string());
    if let Some(e) = &r.error {
        ctx.insert("error".to_string(), e.to_string());
    }
    pb::Session {
        id: r.id.0.clone(),
        user_id: user(),
        created_at: Some(convert::timestamp(r.created_at)),
        context_data: ctx,
        status: status.to_string(),
    }
}

impl Sessions {
    /// The Aria workspace as a campaign, registered on first use.
    async fn campaign(&self) -> Result<crate::store::Campaign, GrpcStatus> {
        let root = self.0.workspace.clone();
        std::fs::create_dir_all(&root).map_err(|e| {
            status(
                Code::Internal,
                "WORKSPACE",
                format!("cannot create the Aria workspace: {e}"),
            )
        })?;
        let root = root.canonicalize().unwrap_or(root).display().to_string();
        let (c, _) = self
            .0
            .handle
            .ask(|reply| Command::AddCampaign {
                id: super::new_campaign_id(),
                root,
                how: NewCampaign::NamedOrExisting(ARIA_CAMPAIGN.into()),
                reply,
            })
            .await
            .map_err(unavailable)?
            .map_err(|e| status(Code::Internal, "STORE", e.to_string()))?;
        Ok(c)
    }
}

#[tonic::async_trait]
impl pb::session_service_server::SessionService for Sessions {
    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::Session>, GrpcStatus> {
        let understood = super::extensions::Understood::of(&request);
        let campaign = self.campaign().await?;
        let (id, short) = super::new_session_id();
        let mut config = SessionConfig::new(&campaign.id, self.0.provider, &campaign.root_path);
        config.model = self.0.model.clone();
        config.agent_name = format!("aria-{short}");
        let rec = self
            .0
            .handle
            .create_session(id, config)
            .await
            .map_err(|e| from_core(&e))?;
        Ok(Response::new(session_pb(&rec, understood)))
    }

    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::Session>, GrpcStatus> {
        let understood = super::extensions::Understood::of(&request);
        let id = SessionId(request.into_inner().session_id);
        let shown = id.0.clone();
        let rec = self
            .0
            .handle
            .session(id)
            .await
            .map_err(unavailable)?
            .map(|v| v.record)
            .ok_or_else(|| {
                status(
                    Code::NotFound,
                    "SESSION_NOT_FOUND",
                    format!("session \"{shown}\" not found"),
                )
            })?;
        Ok(Response::new(session_pb(&rec, understood)))
    }

    type ExecuteTurnStream = Stream_<pb::TurnOutput>;

    async fn execute_turn(
        &self,
        request: Request<pb::ExecuteTurnRequest>,
    ) -> Result<Response<Self::ExecuteTurnStream>, GrpcStatus> {
        use pb::turn_output::Event;
        let r = request.into_inner();
        if r.input.trim().is_empty() {
            return Err(status(
                Code::InvalidArgument,
                "EMPTY_INPUT",
                "input is required",
            ));
        }
        let (turn_tx, mut turn_rx) = mpsc::channel(TURN_STREAM_BUFFER);
        let rec = self
            .0
            .handle
            .request(
                Req::Send {
                    id: SessionId(r.session_id.clone()),
                    text: r.input.clone(),
                },
                Some(turn_tx),
            )
            .await
            .map_err(|e| from_core(&e))?;
        let (tx, rx) = mpsc::channel(TURN_STREAM_BUFFER);
        let session = rec.id.0.clone();
        let turn = rec.turns;
        tokio::spawn(async move {
            let first = pb::TurnOutput {
                event: Some(Event::Message(pb::Message {
                    id: format!("{session}:{turn}:user"),
                    role: pb::MessageRole::User as i32,
                    content: r.input,
                    created_at: Some(convert::timestamp(crate::paths::wall_clock())),
                })),
            };
            if tx.send(Ok(first)).await.is_err() {
                return;
            }
            while let Some(item) = turn_rx.recv().await {
                let ev = match item {
                    Ok(ev) => ev,
                    Err(e) => {
                        let _ = tx.send(Err(from_core(&e))).await;
                        return;
                    }
                };
                let a = &ev.activity;
                let out = match a.kind() {
                    ActivityKind::Thinking | ActivityKind::Status | ActivityKind::Text => {
                        Event::Message(pb::Message {
                            id: format!("{session}:{}", ev.seq),
                            // A status change (paddock's note about a request, an API retry)
                            // is the system's, not the agent's words.
                            role: if a.kind() == ActivityKind::Status {
                                pb::MessageRole::System as i32
                            } else {
                                pb::MessageRole::Assistant as i32
                            },
                            content: a.content.clone(),
                            created_at: Some(convert::timestamp(ev.at)),
                        })
                    }
                    ActivityKind::ToolCall => Event::ToolCall(pb::ToolCall {
                        tool_name: a.tool_name.clone(),
                        parameters_json: as_json(&a.content),
                    }),
                    ActivityKind::ToolResult => Event::ToolResult(pb::ToolResult {
                        tool_name: a.tool_name.clone(),
                        result_json: as_json(&a.content),
                        success: a.tool_success,
                        error_message: (!a.tool_success).then(|| a.content.clone()),
                    }),
                    ActivityKind::Completion => Event::FinalResponse(a.content.clone()),
                    ActivityKind::Error => {
                        let code = ErrorCode::parse(&a.content).unwrap_or(ErrorCode::Generic);
                        let e = Error::new(code, a.content.clone());
                        let mut st = from_core(&e);
                        if ErrorCode::parse(&a.content).is_none() {
                            st = status(Code::Internal, "PROVIDER_ERROR", a.content.clone());
                        }
                        let _ = tx.send(Err(st)).await;
                        return;
                    }
                };
                if tx
                    .send(Ok(pb::TurnOutput { event: Some(out) }))
                    .await
                    .is_err()
                {
                    return;
                }
                if ev.ends_turn {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Aria carries tool parameters and results as JSON: content that already is JSON is kept,
/// anything else becomes a JSON string.
fn as_json(content: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(content) {
        Ok(_) => content.to_string(),
        Err(_) => serde_json::Value::String(content.to_string()).to_string(),
    }
}

// ── ContainerService ──────────────────────────────────────────────────────

pub struct Containers(pub AriaConfig);

fn container_pb(c: &ContainerRecord) -> pb::Container {
    use paddock_core::container::ContainerState;
    use paddock_core::task::TaskStatus;
    let status = match c.state {
        ContainerState::Creating => TaskStatus::Pending,
        ContainerState::Running => TaskStatus::Running,
        ContainerState::Stopped => TaskStatus::Completed,
        ContainerState::Failed => TaskStatus::Failed,
    };
    pb::Container {
        id: c.id.clone(),
        user_id: c.spec.user.clone(),
        session_id: c.spec.session.as_ref().map(|s| s.0.clone()),
        name: c.spec.name.clone(),
        image_path: c.spec.image.clone(),
        status: status.number(),
        created_at: Some(convert::timestamp(c.created_at)),
    }
}

impl Containers {
    async fn record(&self, id: &str) -> Result<ContainerRecord, GrpcStatus> {
        let key = id.trim().to_string();
        self.0
            .handle
            .query(|reply| Query::Container(key, reply))
            .await
            .map_err(unavailable)?
            .ok_or_else(|| {
                from_core(&Error::new(
                    ErrorCode::ContainerNotFound,
                    format!("container \"{id}\" not found"),
                ))
            })
    }

    async fn ask(
        &self,
        id: &str,
        request: ContainerRequest,
    ) -> Result<ContainerRecord, GrpcStatus> {
        self.0
            .handle
            .container(id.trim().to_string(), request)
            .await
            .map_err(|e| from_core(&e))
    }
}

#[tonic::async_trait]
impl pb::container_service_server::ContainerService for Containers {
    async fn create_container(
        &self,
        request: Request<pb::CreateContainerRequest>,
    ) -> Result<Response<pb::Container>, GrpcStatus> {
        let user = crate::socket::peer_user(&request);
        let r = request.into_inner();
        let bad = |m: String| status(Code::InvalidArgument, "INVALID_CONTAINER", m);
        let image = r.image_path.trim().to_string();
        let driver = match r.driver.trim() {
            "" if image.is_empty() => Driver::Bubblewrap,
            "" => Driver::Podman,
            d => Driver::parse(d)
                .filter(|d| matches!(d, Driver::Bubblewrap | Driver::Podman))
                .ok_or_else(|| {
                    bad(format!(
                        "driver {d:?}: a container is \"podman\" or \"bubblewrap\""
                    ))
                })?,
        };
        let environment: std::collections::BTreeMap<String, String> = r
            .environment
            .into_iter()
            .map(|kv| (kv.key, kv.value))
            .collect();
        paddock_core::check_environment(&environment).map_err(|e| bad(e.to_string()))?;
        let session = Some(r.session_id.trim().to_string())
            .filter(|s| !s.is_empty())
            .map(SessionId);
        let working_dir = match &session {
            Some(id) => self
                .0
                .handle
                .session(id.clone())
                .await
                .map_err(unavailable)?
                // The session's workspace: its worktree if it has one (never the checkout the
                // worktree keeps the agent out of).
                .map(|v| {
                    let c = &v.record.config;
                    if c.env.worktree {
                        crate::env::root_in(&self.0.env.data_dir, id)
                            .join("worktree")
                            .display()
                            .to_string()
                    } else {
                        c.working_dir.clone()
                    }
                })
                .ok_or_else(|| {
                    status(
                        Code::NotFound,
                        "SESSION_NOT_FOUND",
                        format!("session \"{id}\" not found"),
                    )
                })?,
            // A workspace of its own, in its environment.
            None => String::new(),
        };
        let id = format!("ctr_{}", ulid::Ulid::new());
        let spec = ContainerSpec {
            name: Some(r.name.trim().to_string())
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| id.clone()),
            image,
            driver,
            network: r.network,
            environment,
            persistent: r.persistent,
            session,
            user,
            working_dir,
        };
        // What the host lacks (podman, an image, bwrap) refuses the create before anything is
        // made.
        let probe = ContainerRecord {
            id: id.clone(),
            spec: spec.clone(),
            state: paddock_core::container::ContainerState::Creating,
            created_at: paddock_core::Timestamp::from_millis(0),
            error: None,
        };
        let host = self.0.env.clone();
        let check =
            tokio::task::spawn_blocking(move || crate::env::container::check_host(&host, &probe))
                .await
                .map_err(|e| status(Code::Internal, "INTERNAL", e.to_string()))?;
        check.map_err(|e| status(Code::FailedPrecondition, "ENVIRONMENT", e.to_string()))?;
        let c = self
            .ask(&id, ContainerRequest::Create(Box::new(spec)))
            .await?;
        Ok(Response::new(container_pb(&c)))
    }

    async fn start_container(
        &self,
        r: Request<pb::StartContainerRequest>,
    ) -> Result<Response<pb::StartContainerResponse>, GrpcStatus> {
        self.ask(&r.into_inner().container_id, ContainerRequest::Start)
            .await?;
        Ok(Response::new(pb::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        r: Request<pb::StopContainerRequest>,
    ) -> Result<Response<pb::StopContainerResponse>, GrpcStatus> {
        self.ask(&r.into_inner().container_id, ContainerRequest::Stop)
            .await?;
        Ok(Response::new(pb::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        r: Request<pb::RemoveContainerRequest>,
    ) -> Result<Response<pb::RemoveContainerResponse>, GrpcStatus> {
        self.ask(&r.into_inner().container_id, ContainerRequest::Remove)
            .await?;
        Ok(Response::new(pb::RemoveContainerResponse {}))
    }

    async fn get_container(
        &self,
        r: Request<pb::GetContainerRequest>,
    ) -> Result<Response<pb::Container>, GrpcStatus> {
        let c = self.record(&r.into_inner().container_id).await?;
        Ok(Response::new(container_pb(&c)))
    }

    async fn list_containers(
        &self,
        r: Request<pb::ListContainersRequest>,
    ) -> Result<Response<pb::ListContainersResponse>, GrpcStatus> {
        let session = r
            .into_inner()
            .session_id
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .map(SessionId);
        let list = self
            .0
            .handle
            .query(|reply| Query::Containers { session, reply })
            .await
            .map_err(unavailable)?;
        Ok(Response::new(pb::ListContainersResponse {
            containers: list.iter().map(container_pb).collect(),
        }))
    }

    type StreamContainerLogsStream = Stream_<pb::ContainerLog>;

    /// What the commands run in the container wrote, oldest first (since `since`), then — with
    /// `follow` — what they write until the client goes away.
    async fn stream_container_logs(
        &self,
        request: Request<pb::StreamContainerLogsRequest>,
    ) -> Result<Response<Self::StreamContainerLogsStream>, GrpcStatus> {
        let r = request.into_inner();
        let since = match &r.since {
            Some(t) => {
                paddock_core::Timestamp::from_millis(convert::timestamp_ms(t).map_err(|e| {
                    status(Code::InvalidArgument, "INVALID_ARGUMENT", e.to_string())
                })?)
            }
            None => paddock_core::Timestamp::from_millis(0),
        };
        // Subscribe first, then read what is stored: nothing falls between.
        let mut outputs = self.0.handle.hub.task_output_all.subscribe();
        let c = self.record(&r.container_id).await?;
        let handle = self.0.handle.clone();
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        tokio::spawn(async move {
            let line = |o: &paddock_core::task::TaskOutput| -> Option<pb::ContainerLog> {
                let (line, stream) = match &o.kind {
                    OutputKind::Stdout(l) => (l.clone(), pb::container_log::Stream::Stdout),
                    OutputKind::Stderr(l) => (l.clone(), pb::container_log::Stream::Stderr),
                    OutputKind::Progress { .. } => return None,
                };
                (o.at >= since).then(|| pb::ContainerLog {
                    line,
                    stream: stream as i32,
                    timestamp: Some(convert::timestamp(o.at)),
                })
            };
            // Its tasks, oldest first, and where each one's stored output ends.
            let tasks = match handle
                .query(|reply| Query::Tasks {
                    of: TasksOf::Container(c.id.clone()),
                    limit: usize::MAX,
                    reply,
                })
                .await
            {
                Ok(Ok((mut all, _))) => {
                    all.reverse();
                    all
                }
                Ok(Err(e)) => {
                    let _ = tx.send(Err(store_failed(e))).await;
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Err(unavailable(e))).await;
                    return;
                }
            };
            let mut last: HashMap<String, u64> = HashMap::new();
            for t in &tasks {
                let Some(after) = send_stored(&handle, &t.id, &tx, line).await else {
                    return;
                };
                last.insert(t.id.clone(), after);
            }
            if !r.follow {
                return;
            }
            // Whether a task (one launched later too) runs in this container. Every task
            // whose output goes by gets an entry: those of other containers are forgotten past
            // a bound (asked again if they write again), so a stream followed for weeks holds
            // this container's tasks, not the daemon's history.
            let mut ours: HashMap<String, bool> =
                tasks.iter().map(|t| (t.id.clone(), true)).collect();
            let w = Watcher::new(tx, handle.clone());
            while let Some(o) = w.next(&mut outputs).await {
                let mine = match ours.get(&o.task) {
                    Some(m) => *m,
                    None => {
                        let task = o.task.clone();
                        let m = handle
                            .query(|reply| Query::Task(task, reply))
                            .await
                            .ok()
                            .and_then(Result::ok)
                            .flatten()
                            .is_some_and(|t| t.spec.container_id == c.id);
                        if ours.len() >= OTHER_TASKS_REMEMBERED {
                            ours.retain(|_, m| *m);
                        }
                        ours.insert(o.task.clone(), m);
                        m
                    }
                };
                if !mine {
                    continue;
                }
                // What the stored replay sent came again live (committed between the
                // subscription and the read): skipped. Past it a task's output comes in order,
                // and its mark goes.
                if let Some(sent) = last.get(&o.task) {
                    if o.seq <= *sent {
                        continue;
                    }
                    last.remove(&o.task);
                }
                if let Some(l) = line(&o) {
                    if !w.send(l).await {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
