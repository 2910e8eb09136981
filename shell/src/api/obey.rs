//! `obey.local.v1.LocalDaemonService`: agent sessions bound to campaigns.
//!
//! Validation of the request's shape happens here; every rule about a session or a campaign
//! is the core's, reached through the daemon's port ([`Handle`]: typed commands and queries).

use std::collections::BTreeMap;
use std::pin::Pin;

use paddock_core::campaign::NewCampaign;
use paddock_core::{Error, ErrorCode, Provider, SessionConfig, SessionId, SessionRecord, Status};
use paddock_proto::obey::local::v1 as pb;
use pb::local_daemon_service_server::LocalDaemonService;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status as GrpcStatus, Streaming};

use super::convert;
use super::extensions::Understood;
use super::watch::{self, Watcher};
use crate::daemon::port::{
    Command, Handle, HistoryView, Query, Read, Request as Req, Scope, SessionView,
    TURN_STREAM_BUFFER, WATCH_BUFFER,
};
use crate::daemon::{hear, Heard};
use crate::paths::now_ms;
use crate::secret;
use crate::store::{ExternalActivity, ReportedEvent};
use paddock_core::campaign::CampaignError;

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, GrpcStatus>> + Send>>;

/// Largest page ListActivities returns.
const LIST_ACTIVITIES_MAX: usize = 10_000;
/// ListApprovals' answers when the request names no limit.
const APPROVALS_DEFAULT: usize = 100;
/// GetHistory's entries when the request names no limit.
const HISTORY_DEFAULT: usize = 1000;
/// Rows of pushed activity stored per transaction.
const EXTERNAL_BATCH: usize = 256;
/// Stored activities read per page by WatchActivity.
const WATCH_PAGE: usize = 1000;

pub struct Obey {
    handle: Handle,
}

impl Obey {
    pub fn new(handle: Handle) -> Self {
        Obey { handle }
    }
}

fn st(e: Error) -> GrpcStatus {
    convert::status(&e)
}

/// A store read's answer: a failed read is INTERNAL.
fn read<T>(answer: Result<Read<T>, Error>) -> Result<T, GrpcStatus> {
    answer
        .map_err(st)?
        .map_err(|e| GrpcStatus::internal(e.to_string()))
}

fn invalid(msg: impl std::fmt::Display) -> GrpcStatus {
    GrpcStatus::invalid_argument(crate::transport::status_message(msg.to_string()))
}

/// A campaign change the engine refused: during a shutdown OBEY-2051, as for sessions and
/// tasks; a name or root no campaign may have, INVALID_ARGUMENT; what else stood in the way
/// (a taken name, live sessions), `otherwise`.
fn campaign_refused(e: CampaignError, otherwise: fn(String) -> GrpcStatus) -> GrpcStatus {
    match e {
        CampaignError::Invalid(why) => invalid(why),
        CampaignError::ShuttingDown => st(Error::new(ErrorCode::ShuttingDown, e.to_string())),
        e => otherwise(e.to_string()),
    }
}

/// A pushed activity as a row to store, or why it is refused.
fn external_row(ev: pb::AgentActivityEvent) -> Result<ExternalActivity, GrpcStatus> {
    let at = match &ev.timestamp {
        Some(t) => convert::timestamp_ms(t).map_err(invalid)?,
        None => now_ms(),
    };
    if paddock_core::ActivityKind::from_number(ev.r#type).is_none() {
        return Err(invalid(format!("unknown activity type {}", ev.r#type)));
    }
    if ev.tokens_input < 0 || ev.tokens_output < 0 {
        return Err(invalid("token counts must not be negative"));
    }
    Ok(ExternalActivity {
        session_id: ev.session_id,
        campaign_id: ev.campaign_id,
        agent_name: ev.agent_name,
        kind: ev.r#type,
        content: ev.content,
        tool_name: ev.tool_name,
        tool_call_id: ev.tool_call_id,
        tool_success: ev.tool_success,
        tokens_input: ev.tokens_input,
        tokens_output: ev.tokens_output,
        at,
    })
}

fn session_id(id: &str) -> Result<SessionId, GrpcStatus> {
    if id.trim().is_empty() {
        return Err(invalid("session_id is required"));
    }
    Ok(SessionId(id.trim().to_string()))
}

impl Obey {
    /// Stores a reported event; answers with its id.
    /// Stores a reported event of `kind` (its time the client's, else now) and answers its id.
    async fn report(
        &self,
        kind: &'static str,
        campaign_id: String,
        festival_id: String,
        r: Reported,
    ) -> Result<Response<pb::EventResponse>, GrpcStatus> {
        let event = ReportedEvent {
            kind,
            campaign_id,
            festival_id,
            event_type: r.event_type,
            payload_json: r.payload_json,
            at: match &r.timestamp {
                Some(t) => convert::timestamp_ms(t).map_err(invalid)?,
                None => now_ms(),
            },
            received_at: now_ms(),
        };
        let id = self
            .handle
            .ask(|reply| Command::Report { event, reply })
            .await
            .map_err(st)?;
        Ok(Response::new(pb::EventResponse {
            accepted: true,
            event_id: id.to_string(),
        }))
    }

    async fn session(&self, id: SessionId) -> Result<SessionView, GrpcStatus> {
        let found = self.handle.session(id.clone()).await.map_err(st)?;
        found.ok_or_else(|| {
            st(Error::new(
                ErrorCode::SessionNotFound,
                format!("session \"{id}\" not found"),
            ))
        })
    }

    async fn record(&self, id: SessionId) -> Result<paddock_core::SessionRecord, GrpcStatus> {
        let record = self.session(id).await?.record;
        Ok(std::sync::Arc::unwrap_or_clone(record))
    }

    /// A session's info, with the counts the loop keeps (as of now) and `rec` as answered.
    async fn info(&self, rec: &paddock_core::SessionRecord) -> Result<pb::SessionInfo, GrpcStatus> {
        let now = self.session(rec.id.clone()).await?;
        Ok(convert::session_info_full(
            rec,
            now.unrecognized,
            now.pending,
        ))
    }

    async fn campaign(&self, key: String) -> Result<crate::store::Campaign, GrpcStatus> {
        let k = key.clone();
        let found = self
            .handle
            .query(|reply| Query::Campaign(k, reply))
            .await
            .map_err(st)?;
        found.ok_or_else(|| {
            st(Error::new(
                ErrorCode::CampaignNotFound,
                format!("campaign \"{key}\" not found"),
            ))
        })
    }
}

/// What a campaign or festival event request reports, whichever it is.
struct Reported {
    event_type: String,
    payload_json: String,
    timestamp: Option<prost_types::Timestamp>,
}

#[tonic::async_trait]
impl LocalDaemonService for Obey {
    async fn report_campaign_event(
        &self,
        request: Request<pb::CampaignEventRequest>,
    ) -> Result<Response<pb::EventResponse>, GrpcStatus> {
        let r = request.into_inner();
        if r.campaign_id.is_empty() || r.event_type.is_empty() {
            return Err(invalid("campaign_id and event_type are required"));
        }
        let c = self.campaign(r.campaign_id.clone()).await?;
        let reported = Reported {
            event_type: r.event_type,
            payload_json: r.payload_json,
            timestamp: r.timestamp,
        };
        self.report("campaign", c.id, String::new(), reported).await
    }

    async fn report_festival_event(
        &self,
        request: Request<pb::FestivalEventRequest>,
    ) -> Result<Response<pb::EventResponse>, GrpcStatus> {
        let r = request.into_inner();
        if r.festival_id.is_empty() || r.event_type.is_empty() {
            return Err(invalid("festival_id and event_type are required"));
        }
        let campaign_id = if r.campaign_id.is_empty() {
            String::new()
        } else {
            self.campaign(r.campaign_id.clone()).await?.id
        };
        let reported = Reported {
            event_type: r.event_type,
            payload_json: r.payload_json,
            timestamp: r.timestamp,
        };
        self.report("festival", campaign_id, r.festival_id, reported)
            .await
    }

    async fn stream_agent_activity(
        &self,
        request: Request<Streaming<pb::AgentActivityEvent>>,
    ) -> Result<Response<pb::ActivityAck>, GrpcStatus> {
        let mut stream = request.into_inner();
        let mut received = 0i64;
        let mut rows = Vec::with_capacity(EXTERNAL_BATCH);
        loop {
            // An event with an unknown type, negative token counts or an impossible time
            // ends the stream with INVALID_ARGUMENT; the events before it are stored.
            let (done, refused) = match stream.next().await {
                Some(Ok(ev)) => match external_row(ev) {
                    Ok(row) => {
                        rows.push(row);
                        (false, None)
                    }
                    Err(e) => (true, Some(e)),
                },
                Some(Err(e)) => (true, Some(e)),
                None => (true, None),
            };
            if rows.len() >= EXTERNAL_BATCH || (done && !rows.is_empty()) {
                let rows = std::mem::take(&mut rows);
                let n = self
                    .handle
                    .ask(|reply| Command::External { rows, reply })
                    .await
                    .map_err(st)?;
                received += n as i64;
            }
            if let Some(e) = refused {
                return Err(e);
            }
            if done {
                break;
            }
        }
        Ok(Response::new(pb::ActivityAck { received }))
    }

    async fn ping(
        &self,
        _request: Request<pb::PingRequest>,
    ) -> Result<Response<pb::PingResponse>, GrpcStatus> {
        let d = read(self.handle.query(Query::Daemon).await)?;
        Ok(Response::new(pb::PingResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime: Some(convert::duration(now_ms().saturating_sub(d.started_at))),
        }))
    }

    async fn get_state(
        &self,
        request: Request<pb::StateRequest>,
    ) -> Result<Response<pb::StateResponse>, GrpcStatus> {
        let understood = Understood::of(&request);
        let d = read(self.handle.query(Query::Daemon).await)?;
        let resp = pb::StateResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: Some(convert::timestamp(paddock_core::Timestamp::from_millis(
                d.started_at,
            ))),
            campaign_count: d.campaigns as i32,
            session_count: d.sessions as i32,
            socket_path: d.socket.display().to_string(),
            data_dir: d.data_dir.display().to_string(),
            active_sessions: d
                .live
                .iter()
                .map(|r| understood.summary(convert::session_summary(r)))
                .collect(),
        };
        Ok(Response::new(resp))
    }

    type ExecuteStream = Stream_<pb::ExecuteResponse>;

    /// A command in the campaign's root, run as a task of the engine (kind
    /// [`EXECUTE_KIND`](paddock_core::task::EXECUTE_KIND)): contained, limited and stopped like
    /// every task (TERM, then KILL after the grace; the live-task limit; cancelled by a
    /// shutdown), its output stored with the task's bound and streamed line by line (each line
    /// at most 64 KiB) as it is stored. The call answers once the command runs, or with
    /// FAILED_PRECONDITION when it cannot be started; a client that goes away cancels it.
    async fn execute(
        &self,
        request: Request<pb::ExecuteRequest>,
    ) -> Result<Response<Self::ExecuteStream>, GrpcStatus> {
        use paddock_core::task::{TaskInput, TaskReply, TaskSpec, TaskStatus, EXECUTE_KIND};
        let user = crate::socket::peer_user(&request);
        let r = request.into_inner();
        if r.command.trim().is_empty() {
            return Err(invalid("command is required"));
        }
        if r.timeout_seconds < 0 {
            return Err(invalid("timeout_seconds must not be negative"));
        }
        paddock_core::check_environment(&r.environment).map_err(invalid)?;
        let c = self.campaign(r.campaign_id.clone()).await?;
        let command = if r.use_shell {
            let mut line = r.command.clone();
            for a in &r.args {
                line.push(' ');
                line.push_str(a);
            }
            vec!["sh".to_string(), "-c".to_string(), line]
        } else {
            std::iter::once(r.command.clone()).chain(r.args).collect()
        };
        let id = format!("exec_{}", ulid::Ulid::new());
        let spec = TaskSpec {
            session_id: String::new(),
            kind: EXECUTE_KIND.to_string(),
            command,
            environment: r.environment.into_iter().collect(),
            timeout_ms: r.timeout_seconds as u64 * 1000,
            working_dir: c.root_path,
            user,
            container_id: String::new(),
            parent_task_id: String::new(),
        };
        // Subscribed before the launch: nothing the task says falls in between.
        let mut outputs = self.handle.hub.task_output.subscribe(&id);
        let mut statuses = self.handle.hub.task_status.subscribe();
        let launch = TaskInput::Launch {
            req: 0,
            id: id.clone(),
            spec: Box::new(spec),
        };
        match self.handle.task(launch).await.map_err(st)? {
            TaskReply::Launched(_) => {}
            other => return Err(GrpcStatus::internal(format!("unexpected reply {other:?}"))),
        }
        // Answer once it runs (or could not be started).
        let handle = self.handle.clone();
        let record = move |id: String| {
            let handle = handle.clone();
            async move {
                handle
                    .query(|reply| Query::Task(id, reply))
                    .await
                    .map_err(st)?
                    .map_err(|e| GrpcStatus::internal(e.to_string()))?
                    .ok_or_else(|| GrpcStatus::internal("the command's task vanished"))
            }
        };
        loop {
            let status = match hear(&mut statuses).await {
                Heard::Event(ev) if ev.task == id => ev.status,
                Heard::Event(_) => continue,
                // Fell behind: the task's record says where it is.
                Heard::Behind(_) => record(id.clone()).await?.status,
                Heard::Over => return Err(GrpcStatus::unavailable("the daemon is shutting down")),
            };
            match status {
                TaskStatus::Pending => continue,
                TaskStatus::Failed if record(id.clone()).await?.started_at.is_none() => {
                    let why = record(id.clone()).await?.error_message.unwrap_or_default();
                    return Err(GrpcStatus::failed_precondition(
                        crate::transport::status_message(format!(
                            "cannot run {}: {why}",
                            r.command
                        )),
                    ));
                }
                _ => break,
            }
        }
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let handle = self.handle.clone();
        tokio::spawn(async move {
            let line = |o: &paddock_core::task::TaskOutput| {
                use paddock_core::task::OutputKind;
                use pb::execute_response::Output;
                let output = match &o.kind {
                    OutputKind::Stdout(t) => Output::Stdout(format!("{t}\n")),
                    OutputKind::Stderr(t) => Output::Stderr(format!("{t}\n")),
                    // Not parsed for an Execute (`reports_progress`); kept whole if it were.
                    OutputKind::Progress { centi, operation } => Output::Stdout(format!(
                        "::progress {}.{:02} {operation}\n",
                        centi / 100,
                        centi % 100
                    )),
                };
                Ok(pb::ExecuteResponse {
                    output: Some(output),
                })
            };
            // Everything stored after `last`, in order.
            let catch_up = |last: u64| {
                let handle = handle.clone();
                let task = id.clone();
                async move {
                    handle
                        .query(|reply| Query::TaskOutput {
                            task,
                            after: last,
                            limit: 1000,
                            reply,
                        })
                        .await
                }
            };
            let mut last = 0u64;
            let end = loop {
                tokio::select! {
                    biased;
                    _ = tx.closed() => {
                        // Nobody reads any more: the command goes (TERM, then KILL).
                        let cancel = TaskInput::Cancel { req: 0, id: id.clone() };
                        let _ = handle.task(cancel).await;
                        return;
                    }
                    o = outputs.hear() => match o {
                        Heard::Event(o) if o.seq > last => {
                            last = o.seq;
                            if tx.send(line(&o)).await.is_err() {
                                continue; // cancelled above, on the next turn
                            }
                        }
                        Heard::Event(_) => {}
                        // Fell behind the hub: the store has every line, sent at the end.
                        Heard::Behind(_) => {}
                        Heard::Over => {
                            break Err(GrpcStatus::unavailable("the daemon shut down"));
                        }
                    },
                    ev = hear(&mut statuses) => match ev {
                        Heard::Event(ev) if ev.task == id && ev.status.is_terminal() => break Ok(ev),
                        Heard::Event(_) => {}
                        Heard::Behind(_) => {
                            match record(id.clone()).await {
                                Ok(t) if t.status.is_terminal() => {
                                    break Ok(paddock_core::task::TaskStatusEvent {
                                        task: t.id.clone(),
                                        status: t.status,
                                        message: t.error_message.clone().unwrap_or_default(),
                                        exit_code: t.exit_code,
                                        at: t.completed_at.unwrap_or(t.created_at),
                                    })
                                }
                                Ok(_) => {}
                                Err(e) => break Err(e),
                            }
                        }
                        Heard::Over => {
                            break Err(GrpcStatus::unavailable("the daemon shut down"));
                        }
                    },
                }
            };
            // The output before the end is stored by now: send what the hub did not.
            loop {
                let page = match catch_up(last).await {
                    Ok(Ok(page)) => page,
                    Ok(Err(e)) => {
                        let _ = tx.send(Err(GrpcStatus::internal(e.to_string()))).await;
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(st(e))).await;
                        return;
                    }
                };
                if page.is_empty() {
                    break;
                }
                for o in &page {
                    last = o.seq;
                    if tx.send(line(o)).await.is_err() {
                        return;
                    }
                }
            }
            let last_word = match end {
                Ok(ev) => match ev.status {
                    TaskStatus::Timeout => Err(GrpcStatus::deadline_exceeded(format!(
                        "command {}",
                        ev.message
                    ))),
                    TaskStatus::Cancelled => Err(GrpcStatus::unavailable(
                        "the command was cancelled (the daemon is shutting down)",
                    )),
                    _ => Ok(pb::ExecuteResponse {
                        output: Some(pb::execute_response::Output::ExitCode(
                            ev.exit_code.unwrap_or(-1),
                        )),
                    }),
                },
                Err(e) => Err(e),
            };
            let _ = tx.send(last_word).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn shutdown(
        &self,
        request: Request<pb::ShutdownRequest>,
    ) -> Result<Response<pb::ShutdownResponse>, GrpcStatus> {
        let force = request.into_inner().force;
        let n = self.handle.shutdown(!force).await.map_err(st)?;
        Ok(Response::new(pb::ShutdownResponse {
            accepted: true,
            active_sessions: n as i32,
        }))
    }

    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, GrpcStatus> {
        let understood = Understood::of(&request);
        let r = request.into_inner();
        if r.campaign_id.trim().is_empty() {
            return Err(invalid("campaign_id is required"));
        }
        let provider = Provider::from_number(r.provider).ok_or_else(|| {
            st(Error::new(
                ErrorCode::ProviderNotSupported,
                format!("provider {} is not a supported provider", r.provider),
            ))
        })?;
        if r.max_tokens < 0 {
            return Err(invalid("max_tokens must not be negative"));
        }
        paddock_core::check_environment(&r.environment).map_err(invalid)?;
        let env_spec =
            convert::env_spec(r.environment_spec.as_ref()).map_err(|e| invalid(e.to_string()))?;
        let timeout_ms = match &r.timeout {
            Some(d) => convert::duration_ms(d).map_err(|e| invalid(format!("timeout: {e}")))?,
            None => 0,
        };
        let campaign = self.campaign(r.campaign_id.trim().to_string()).await?;
        if !std::path::Path::new(&campaign.root_path).is_dir() {
            return Err(st(Error::new(
                ErrorCode::SandboxInitFailed,
                format!(
                    "campaign \"{}\" root {} is not a directory",
                    campaign.name, campaign.root_path
                ),
            )));
        }
        let (id, short) = super::new_session_id();
        let agent_name = if r.agent_name.trim().is_empty() {
            format!("{}-{short}", provider.name())
        } else {
            r.agent_name.trim().to_string()
        };
        let mut provider_config: std::collections::BTreeMap<String, String> =
            r.provider_config.into_iter().collect();
        // A session that says nothing of permissions gets the safe default (the core's rule:
        // on the host writes and commands wait for a human; in a sandbox the sandbox guards).
        provider_config
            .entry("permissions".into())
            .or_insert_with(|| {
                paddock_core::approval::default_permissions(provider, &env_spec).to_string()
            });
        let provider_config =
            paddock_core::ProviderConfig::parse(provider_config).map_err(|e| st(e.into()))?;
        let config = SessionConfig {
            campaign_id: campaign.id.clone(),
            provider,
            model: r.model.trim().to_string(),
            agent_name,
            festival_id: r.festival_id,
            task_id: r.task_id,
            provider_config,
            environment: r.environment.into_iter().collect(),
            max_tokens: r.max_tokens as u64,
            timeout_ms,
            initial_message: r.initial_message,
            working_dir: campaign.root_path.clone(),
            env: env_spec,
        };
        // What the host lacks for the environment refuses the create before anything is
        // made (no session half-created).
        let (spec, dir) = (config.env.clone(), campaign.root_path.clone());
        tokio::task::spawn_blocking(move || {
            crate::env::check_host(&spec, std::path::Path::new(&dir))
        })
        .await
        .map_err(|e| {
            st(Error::new(
                ErrorCode::Generic,
                format!("environment check: {e}"),
            ))
        })?
        .map_err(|e| st(Error::new(ErrorCode::SandboxInitFailed, e.to_string())))?;
        let record = self.handle.create_session(id, config).await.map_err(st)?;
        Ok(Response::new(pb::CreateSessionResponse {
            session: Some(understood.info(convert::session_info(&record))),
        }))
    }

    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::SessionInfo>, GrpcStatus> {
        let understood = Understood::of(&request);
        let id = session_id(&request.into_inner().session_id)?;
        let v = self.session(id).await?;
        Ok(Response::new(understood.info(convert::session_info_full(
            &v.record,
            v.unrecognized,
            v.pending,
        ))))
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, GrpcStatus> {
        let understood = Understood::of(&request);
        let r = request.into_inner();
        let campaign = if r.campaign_id.trim().is_empty() {
            None
        } else {
            Some(self.campaign(r.campaign_id.trim().to_string()).await?.id)
        };
        let mut statuses = Vec::new();
        for n in &understood.statuses(r.statuses) {
            statuses.push(
                Status::from_number(*n)
                    .ok_or_else(|| invalid(format!("unknown session status {n}")))?,
            );
        }
        let provider = match r.provider {
            0 => None,
            n => Some(Provider::from_number(n).ok_or_else(|| {
                st(Error::new(
                    ErrorCode::ProviderNotSupported,
                    format!("provider {n} is not a supported provider"),
                ))
            })?),
        };
        let include_terminated = r.include_terminated;
        // Only live sessions can match: the loop visits those alone.
        let live_only = if statuses.is_empty() {
            !include_terminated
        } else {
            statuses.iter().all(|s| !s.is_terminal())
        };
        // Newest first (as a list of sessions is read: what was started last on top); the
        // page token is the last id a page gave, and the next page is older.
        let before = r.page_token.trim().to_string();
        let page_size = usize::try_from(r.page_size)
            .map_err(|_| invalid(format!("page_size {} is negative", r.page_size)))?;
        let view = convert::View::from_number(r.view)
            .ok_or_else(|| invalid(format!("unknown session view {}", r.view)))?;
        let scope = Scope {
            live_only,
            before: before.clone(),
            campaign: campaign.clone(),
            working_dir: None,
        };
        // Filtered on the loop, where the sessions are: only what matches is copied.
        let pick = Box::new(move |rec: &SessionRecord| {
            (before.is_empty() || rec.id.0 < before)
                && campaign
                    .as_ref()
                    .is_none_or(|c| &rec.config.campaign_id == c)
                && provider.is_none_or(|p| rec.config.provider == p)
                && if statuses.is_empty() {
                    include_terminated || rec.status.is_active()
                } else {
                    statuses.contains(&rec.status)
                }
        });
        // One more than the page, to know whether more follow.
        let limit = match page_size {
            0 => usize::MAX,
            n => n.saturating_add(1),
        };
        let mut matching = read(
            self.handle
                .query(|reply| Query::Sessions {
                    scope,
                    pick,
                    limit,
                    reply,
                })
                .await,
        )?;
        let more_than_page = page_size > 0 && matching.len() > page_size;
        if more_than_page {
            matching.truncate(page_size);
        }
        let matching = matching.iter().map(|v| {
            understood.info(convert::session_info_as(
                &v.record,
                v.unrecognized,
                v.pending,
                view,
            ))
        });
        let (sessions, more) = convert::page_by_size(matching);
        let next_page_token = if more || more_than_page {
            sessions.last().map(|s| s.id.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(pb::ListSessionsResponse {
            sessions,
            next_page_token,
        }))
    }

    type SendMessageStream = Stream_<pb::SessionActivityEvent>;

    async fn send_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> Result<Response<Self::SendMessageStream>, GrpcStatus> {
        let understood = Understood::of(&request);
        let r = request.into_inner();
        let id = session_id(&r.session_id)?;
        if r.message.trim().is_empty() {
            return Err(invalid("message is required"));
        }
        let (tx, rx) = mpsc::channel(TURN_STREAM_BUFFER);
        self.handle
            .request(
                Req::Send {
                    id,
                    text: r.message,
                },
                Some(tx),
            )
            .await
            .map_err(st)?;
        let stream =
            ReceiverStream::new(rx).map(move |item| match item {
                Ok(ev) => Ok(understood
                    .activity(convert::activity_event(std::sync::Arc::unwrap_or_clone(ev)))),
                Err(e) => Err(convert::status(&e)),
            });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn stop_session(
        &self,
        request: Request<pb::StopSessionRequest>,
    ) -> Result<Response<pb::StopSessionResponse>, GrpcStatus> {
        let r = request.into_inner();
        let id = session_id(&r.session_id)?;
        let rec = self
            .handle
            .request(
                Req::Stop {
                    id,
                    graceful: r.graceful,
                },
                None,
            )
            .await
            .map_err(st)?;
        Ok(Response::new(pb::StopSessionResponse {
            session: Some(self.info(&rec).await?),
        }))
    }

    async fn restart_session(
        &self,
        request: Request<pb::RestartSessionRequest>,
    ) -> Result<Response<pb::CreateSessionResponse>, GrpcStatus> {
        let understood = Understood::of(&request);
        let r = request.into_inner();
        let id = session_id(&r.session_id)?;
        // Checked against the session's configuration by the port. A credential sent back as
        // the mask it was shown as keeps its stored value.
        let mut provider_config = (!r.provider_config.is_empty()).then(|| {
            r.provider_config
                .into_iter()
                .collect::<BTreeMap<String, String>>()
        });
        if let Some(pc) = provider_config.take_if(|pc| pc.values().any(|v| v == secret::MASK)) {
            let stored = self.record(id.clone()).await?;
            provider_config = Some(
                secret::unmask(pc, &stored.config.provider_config)
                    .map_err(|e| invalid(e.to_string()))?,
            );
        }
        let provider_config = provider_config
            .map(paddock_core::ProviderConfig::parse)
            .transpose()
            .map_err(|e| st(e.into()))?;
        // (A new configuration that says nothing of permissions keeps the session's: the core's
        // rule, decided in the same step as the restart.)
        let rec = self
            .handle
            .restart_session(id, provider_config)
            .await
            .map_err(st)?;
        Ok(Response::new(pb::CreateSessionResponse {
            session: Some(understood.info(convert::session_info(&rec))),
        }))
    }

    type WatchSessionStream = Stream_<pb::SessionStatusEvent>;

    async fn watch_session(
        &self,
        request: Request<pb::WatchSessionRequest>,
    ) -> Result<Response<Self::WatchSessionStream>, GrpcStatus> {
        let understood = Understood::of(&request);
        let id = session_id(&request.into_inner().session_id)?;
        // Subscribe first, then look: no event can fall between the two.
        let sub = self.handle.hub.status.subscribe();
        let rec = self.record(id.clone()).await?;
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        if !rec.status.is_terminal() {
            tokio::spawn(forward_status(
                self.handle.clone(),
                sub,
                tx,
                move |ev| ev.session == id,
                true,
                understood,
            ));
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type WatchAllSessionsStream = Stream_<pb::SessionStatusEvent>;

    async fn watch_all_sessions(
        &self,
        request: Request<pb::WatchAllSessionsRequest>,
    ) -> Result<Response<Self::WatchAllSessionsStream>, GrpcStatus> {
        let understood = Understood::of(&request);
        let r = request.into_inner();
        let sub = self.handle.hub.status.subscribe();
        let campaign = if r.campaign_id.trim().is_empty() {
            None
        } else {
            Some(self.campaign(r.campaign_id.trim().to_string()).await?.id)
        };
        // Session → campaign, for the filter; sessions created later are looked up once.
        let handle = self.handle.clone();
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        tokio::spawn(async move {
            let mut campaigns: BTreeMap<SessionId, String> = BTreeMap::new();
            let mut sub = sub;
            let w = Watcher::new(tx, handle.clone());
            while let Some(ev) = w.next(&mut sub).await {
                if let Some(c) = &campaign {
                    if !campaigns.contains_key(&ev.session) {
                        let id = ev.session.clone();
                        let found = match handle.session(id).await {
                            Ok(v) => v.map(|v| v.record.config.campaign_id.clone()),
                            Err(e) => return w.fail(st(e)).await,
                        };
                        campaigns.insert(ev.session.clone(), found.unwrap_or_default());
                    }
                    if campaigns.get(&ev.session) != Some(c) {
                        continue;
                    }
                }
                let Some(ev) = understood.event(convert::status_event(&ev)) else {
                    continue;
                };
                if !w.send(ev).await {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn add_campaign(
        &self,
        request: Request<pb::AddCampaignRequest>,
    ) -> Result<Response<pb::Campaign>, GrpcStatus> {
        let r = request.into_inner();
        let name = r.name.trim().to_string();
        if r.root_path.trim().is_empty() {
            return Err(invalid("root_path is required"));
        }
        let root = std::fs::canonicalize(r.root_path.trim()).map_err(|e| {
            invalid(format!(
                "root_path {} is not usable: {e}",
                r.root_path.trim()
            ))
        })?;
        if !root.is_dir() {
            return Err(invalid(format!(
                "root_path {} is not a directory",
                root.display()
            )));
        }
        let id = super::new_campaign_id();
        let how = if name.is_empty() {
            // The campaign of this directory: found, or registered under its name.
            NewCampaign::ForRoot {
                base: crate::store::campaign_name_for(&root),
            }
        } else {
            NewCampaign::Named(name)
        };
        let root = root.display().to_string();
        let (c, _) = self
            .handle
            .ask(|reply| Command::AddCampaign {
                id,
                root,
                how,
                reply,
            })
            .await
            .map_err(st)?
            .map_err(|e| campaign_refused(e, GrpcStatus::already_exists))?;
        Ok(Response::new(campaign_pb(&c)))
    }

    async fn list_campaigns(
        &self,
        _request: Request<pb::ListCampaignsRequest>,
    ) -> Result<Response<pb::ListCampaignsResponse>, GrpcStatus> {
        let list = self.handle.query(Query::Campaigns).await.map_err(st)?;
        Ok(Response::new(pb::ListCampaignsResponse {
            campaigns: list.iter().map(campaign_pb).collect(),
        }))
    }

    async fn remove_campaign(
        &self,
        request: Request<pb::RemoveCampaignRequest>,
    ) -> Result<Response<pb::RemoveCampaignResponse>, GrpcStatus> {
        let key = request.into_inner().campaign;
        let c = self.campaign(key).await?;
        let result = self
            .handle
            .ask(|reply| Command::RemoveCampaign { key: c.id, reply })
            .await
            .map_err(st)?
            .map_err(|e| campaign_refused(e, GrpcStatus::failed_precondition))?;
        Ok(Response::new(pb::RemoveCampaignResponse {
            removed: result,
        }))
    }

    async fn list_activities(
        &self,
        request: Request<pb::ListActivitiesRequest>,
    ) -> Result<Response<pb::ListActivitiesResponse>, GrpcStatus> {
        let understood = Understood::of(&request);
        let r = request.into_inner();
        let id = session_id(&r.session_id)?;
        self.record(id.clone()).await?;
        let limit = convert::page_limit(r.limit, LIST_ACTIVITIES_MAX, LIST_ACTIVITIES_MAX);
        let after = r.after_seq.max(0) as u64;
        let list = read(
            self.handle
                .query(|reply| Query::Activities {
                    session: id,
                    after,
                    limit,
                    reply,
                })
                .await,
        )?;
        // Paged by size too: the client goes on from the last seq it got.
        let (activities, _more) = convert::page_by_size(
            list.into_iter()
                .map(|a| understood.activity(convert::activity_event(a))),
        );
        Ok(Response::new(pb::ListActivitiesResponse { activities }))
    }

    async fn get_history(
        &self,
        request: Request<pb::GetHistoryRequest>,
    ) -> Result<Response<pb::GetHistoryResponse>, GrpcStatus> {
        let r = request.into_inner();
        let id = session_id(&r.session_id)?;
        self.record(id.clone()).await?;
        let limit = convert::page_limit(r.limit, HISTORY_DEFAULT, LIST_ACTIVITIES_MAX);
        let HistoryView {
            messages,
            activities,
            truncated,
            ..
        } = read(
            self.handle
                .query(|reply| Query::History {
                    session: id,
                    limit,
                    reply,
                })
                .await,
        )?;
        let last_seq = activities.last().map(|a| a.seq as i64).unwrap_or(0);
        let mut items = crate::api::history::merge(&messages, &activities, truncated);
        // The window is of activities; user messages (one per turn) may add a few more.
        let over = items.len().saturating_sub(limit);
        items.drain(..over);
        // The newest entries that fit in one reply (the oldest go first, as with `limit`).
        let (mut newest, cut) =
            convert::page_by_size(items.iter().rev().map(convert::history_item));
        newest.reverse();
        Ok(Response::new(pb::GetHistoryResponse {
            items: newest,
            truncated: truncated || over > 0 || cut,
            last_seq,
        }))
    }

    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, GrpcStatus> {
        let r = request.into_inner();
        let session =
            (!r.session_id.trim().is_empty()).then(|| SessionId(r.session_id.trim().to_string()));
        // A session named is one that exists (OBEY-2010), as for every session RPC: an unknown
        // id is not a session with nothing waiting.
        if let Some(id) = &session {
            self.record(id.clone()).await?;
        }
        let limit = convert::page_limit(r.limit, APPROVALS_DEFAULT, LIST_ACTIVITIES_MAX);
        let all = r.include_resolved;
        let list = read(
            self.handle
                .query(|reply| Query::Approvals {
                    session,
                    all,
                    limit,
                    reply,
                })
                .await,
        )?;
        Ok(Response::new(pb::ListApprovalsResponse {
            approvals: list.iter().map(convert::approval).collect(),
        }))
    }

    async fn resolve_approval(
        &self,
        request: Request<pb::ResolveApprovalRequest>,
    ) -> Result<Response<pb::Approval>, GrpcStatus> {
        let r = request.into_inner();
        let id = r.approval_id.trim().to_string();
        if id.is_empty() {
            return Err(invalid("approval_id is required"));
        }
        if r.text.len() > paddock_core::approval::ANSWER_MAX {
            return Err(invalid(format!(
                "text is {} bytes; at most {} are passed on to the agent",
                r.text.len(),
                paddock_core::approval::ANSWER_MAX
            )));
        }
        let decision = pb::ApprovalDecision::try_from(r.decision)
            .map_err(|_| invalid(format!("unknown decision {}", r.decision)))
            .and_then(|d| convert::decision(d, r.text, r.is_error))?;
        let by = match r.resolved_by.trim() {
            "" => "obey".to_string(),
            b => crate::text::prefix(b, 64).to_string(),
        };
        let a = self
            .handle
            .resolve(id, None, decision, &by)
            .await
            .map_err(st)?;
        Ok(Response::new(convert::approval(&a)))
    }

    type WatchApprovalsStream = Stream_<pb::Approval>;

    async fn watch_approvals(
        &self,
        request: Request<pb::WatchApprovalsRequest>,
    ) -> Result<Response<Self::WatchApprovalsStream>, GrpcStatus> {
        let r = request.into_inner();
        let only = (!r.session_id.trim().is_empty()).then(|| SessionId(r.session_id.trim().into()));
        if let Some(id) = &only {
            self.record(id.clone()).await?;
        }
        // Subscribe before reading what is open, so nothing falls between the two.
        let mut sub = self.handle.hub.approval.subscribe();
        let only_ = only.clone();
        let open = self
            .handle
            .query(|reply| Query::PendingApprovals(only_, reply))
            .await
            .map_err(st)?;
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let handle = self.handle.clone();
        tokio::spawn(async move {
            let snapshot: std::collections::BTreeSet<String> =
                open.iter().map(|a| a.id.clone()).collect();
            let w = Watcher::new(tx, handle);
            for a in &open {
                if !w.send(convert::approval(a)).await {
                    return;
                }
            }
            while let Some(a) = w.next(&mut sub).await {
                if only.as_ref().is_some_and(|id| &a.session != id) {
                    continue;
                }
                // An open request already sent from the snapshot is not sent twice.
                if a.is_pending() && snapshot.contains(&a.id) {
                    continue;
                }
                if !w.send(convert::approval(&a)).await {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delete_session(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> Result<Response<pb::DeleteSessionResponse>, GrpcStatus> {
        let id = session_id(&request.into_inner().session_id)?;
        self.handle
            .request(Req::Delete { id }, None)
            .await
            .map_err(st)?;
        Ok(Response::new(pb::DeleteSessionResponse { deleted: true }))
    }

    type WatchActivityStream = Stream_<pb::SessionActivityEvent>;

    async fn watch_activity(
        &self,
        request: Request<pb::WatchActivityRequest>,
    ) -> Result<Response<Self::WatchActivityStream>, GrpcStatus> {
        let understood = Understood::of(&request);
        let r = request.into_inner();
        let id = session_id(&r.session_id)?;
        // Subscribe before reading the store, then skip what the store already gave.
        let mut acts = self.handle.hub.activity.subscribe(&id);
        let mut stat = self.handle.hub.status.subscribe();
        let rec = self.record(id.clone()).await?;
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let handle = self.handle.clone();
        // A negative after_seq asks for the newest -after_seq stored events (a dashboard's
        // "what is it doing now"), not the whole history.
        let last = match r.after_seq {
            n if n < 0 => rec.last_activity_seq.saturating_sub(n.unsigned_abs()),
            n => n as u64,
        };
        tokio::spawn(async move {
            // Stored history first, in pages.
            let mut page = |after| {
                let (handle, session) = (&handle, id.clone());
                async move {
                    read(
                        handle
                            .query(|reply| Query::Activities {
                                session,
                                after,
                                limit: WATCH_PAGE,
                                reply,
                            })
                            .await,
                    )
                }
            };
            let pb = |ev: &paddock_core::ActivityEvent| {
                understood.activity(convert::activity_event(ev.clone()))
            };
            let stored = watch::send_stored(&tx, last, &mut page, |ev| ev.seq, |ev| Some(pb(ev)));
            let Some(last) = stored.await else { return };
            if rec.status.is_terminal() {
                return;
            }
            let w = Watcher::new(tx, handle.clone());
            let ended = |ev: &paddock_core::StatusEvent| ev.session == id && ev.new.is_terminal();
            let ended_now = || {
                let (handle, id) = (&handle, id.clone());
                async move {
                    // A session no longer stored (deleted) has ended as well.
                    let now = handle.session(id).await.ok()?;
                    Some(now.is_none_or(|s| s.record.status.is_terminal()))
                }
            };
            let seq = |ev: &paddock_core::ActivityEvent| ev.seq;
            w.follow_until(&mut acts, &mut stat, last, page, seq, ended, ended_now, pb)
                .await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

fn campaign_pb(c: &crate::store::Campaign) -> pb::Campaign {
    pb::Campaign {
        id: c.id.clone(),
        name: c.name.clone(),
        root_path: c.root_path.clone(),
        created_at: Some(convert::timestamp(c.created_at)),
    }
}

/// Forwards status events that pass `keep` until the client goes away (or, with
/// `end_on_terminal`, the session ends).
async fn forward_status(
    handle: Handle,
    mut sub: broadcast::Receiver<paddock_core::StatusEvent>,
    tx: mpsc::Sender<Result<pb::SessionStatusEvent, GrpcStatus>>,
    keep: impl Fn(&paddock_core::StatusEvent) -> bool,
    end_on_terminal: bool,
    understood: Understood,
) {
    let w = Watcher::new(tx, handle);
    while let Some(ev) = w.next(&mut sub).await {
        if !keep(&ev) {
            continue;
        }
        if let Some(seen) = understood.event(convert::status_event(&ev)) {
            if !w.send(seen).await {
                return;
            }
        }
        if end_on_terminal && ev.new.is_terminal() {
            return;
        }
    }
}
