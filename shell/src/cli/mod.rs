//! The CLI: `paddock campaign …`, `paddock session …`, and the daemon's housekeeping
//! commands. Every command is a gRPC call on the daemon's socket; errors print the daemon's
//! message (`OBEY-2010: session "x" not found`) and exit 1.

pub mod approvals;
pub mod attach;
pub mod client;
pub mod demo;
pub mod latis;
pub mod output;
pub mod task;

use std::path::PathBuf;

use clap::Subcommand;
use paddock_core::{ActivityKind, Provider, Status};
use paddock_proto::obey::local::v1 as pb;
use serde_json::json;
use tokio_stream::StreamExt;

use client::Client;
use output::*;

/// What every command needs.
pub struct Ctx {
    pub socket: PathBuf,
    pub data_dir: PathBuf,
    pub json: bool,
    pub autostart: bool,
}

#[derive(Subcommand, Debug)]
pub enum CampaignCmd {
    /// Register a project directory as a campaign
    Add { name: String, path: PathBuf },
    /// List campaigns
    List,
    /// Unregister a campaign (by id or name)
    Remove { campaign: String },
}

#[derive(Subcommand, Debug)]
pub enum SessionCmd {
    /// Create and start an agent session (`--task "…"` runs in the current directory)
    Create(Box<latis::CreateArgs>),
    /// List sessions (active ones unless --all)
    List {
        #[arg(long)]
        campaign: Option<String>,
        /// Include stopped and failed sessions
        #[arg(long)]
        all: bool,
        /// Only these statuses (e.g. running, failed); repeatable
        #[arg(long = "status")]
        statuses: Vec<String>,
        #[arg(long)]
        provider: Option<String>,
    },
    /// Show one session (every field)
    Info { id: String },
    /// A session's latis state (creating, starting, working, waiting, ready, complete,
    /// stopping, stopped, failed), its task and details, its error if any
    Status { id: String },
    /// Talk to a session: its recent history, then live activity; a line you type is sent as
    /// a message. Ctrl-D (or Ctrl-C) detaches and the agent keeps working
    Attach { id: String },
    /// Delete a session and everything stored about it (a live one is force-stopped first)
    Delete { id: String },
    /// Delete every stopped and failed session and everything stored about them
    Prune {
        /// Only this campaign's (id or name)
        #[arg(long)]
        campaign: Option<String>,
    },
    /// Send a message and stream the agent's activity until the turn ends
    Send { id: String, message: String },
    /// Follow a session: its status changes and activity, until it ends
    Watch { id: String },
    /// Stop a session (gracefully: the current turn may finish first)
    Stop {
        id: String,
        /// Interrupt at once
        #[arg(long)]
        force: bool,
    },
    /// Restart a session with the same configuration
    Restart {
        id: String,
        /// Override provider configuration, KEY=VALUE (repeatable)
        #[arg(long = "config", value_parser = parse_kv)]
        config: Vec<(String, String)>,
    },
    /// Print a session's stored activity
    Logs {
        id: String,
        /// Only activity after this sequence number
        #[arg(long, default_value_t = 0)]
        after: i64,
    },
    /// Print a session's conversation: each turn's message, then what the agent did and said
    History {
        id: String,
        /// At most this many of the newest entries
        #[arg(long, default_value_t = 1000)]
        limit: i32,
    },
}

pub(crate) fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

pub(crate) fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("error: {msg}");
    1
}

fn grpc_fail(s: tonic::Status) -> i32 {
    fail(s.message())
}

macro_rules! tryc {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return fail(e),
        }
    };
}

macro_rules! tryg {
    ($e:expr) => {
        match $e {
            Ok(v) => v.into_inner(),
            Err(e) => return grpc_fail(e),
        }
    };
}

pub(crate) fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).expect("json"));
}

fn now_ms() -> u64 {
    crate::paths::now_ms()
}

pub async fn campaign(ctx: &Ctx, cmd: CampaignCmd) -> i32 {
    let mut c = tryc!(client::connect(ctx).await);
    match cmd {
        CampaignCmd::Add { name, path } => {
            let camp = tryg!(
                c.add_campaign(pb::AddCampaignRequest {
                    name,
                    root_path: path.display().to_string(),
                })
                .await
            );
            if ctx.json {
                print_json(&campaign_json(&camp));
            } else {
                println!("campaign {} ({}) → {}", camp.name, camp.id, camp.root_path);
            }
        }
        CampaignCmd::List => {
            let list = tryg!(c.list_campaigns(pb::ListCampaignsRequest {}).await).campaigns;
            if ctx.json {
                print_json(&json!(list.iter().map(campaign_json).collect::<Vec<_>>()));
            } else {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|c| vec![c.name.clone(), c.id.clone(), c.root_path.clone()])
                    .collect();
                println!("{}", table(&["NAME", "ID", "ROOT"], &rows));
            }
        }
        CampaignCmd::Remove { campaign } => {
            let r = tryg!(
                c.remove_campaign(pb::RemoveCampaignRequest {
                    campaign: campaign.clone()
                })
                .await
            );
            if ctx.json {
                print_json(&json!({ "removed": r.removed }));
            } else {
                println!("campaign {campaign} removed");
            }
        }
    }
    0
}

/// Accepts a full session id or a unique prefix of one (or of its part after `sess_`).
pub(crate) async fn resolve(c: &mut Client, id: &str) -> Result<String, String> {
    if c.get_session(pb::GetSessionRequest {
        session_id: id.to_string(),
    })
    .await
    .is_ok()
    {
        return Ok(id.to_string());
    }
    let all = c
        .list_sessions(pb::ListSessionsRequest {
            include_terminated: true,
            ..Default::default()
        })
        .await
        .map_err(|e| e.message().to_string())?
        .into_inner()
        .sessions;
    let needle = id.to_ascii_lowercase();
    let hits: Vec<&pb::SessionInfo> = all
        .iter()
        .filter(|s| {
            let full = s.id.to_ascii_lowercase();
            full.starts_with(&needle)
                || full.trim_start_matches("sess_").starts_with(&needle)
                || full.ends_with(&needle)
        })
        .collect();
    match hits.as_slice() {
        [one] => Ok(one.id.clone()),
        [] => Ok(id.to_string()), // let the daemon say OBEY-2010
        many => Err(format!(
            "\"{id}\" matches {} sessions; give more of the id",
            many.len()
        )),
    }
}

fn print_session(ctx: &Ctx, s: &pb::SessionInfo) {
    if ctx.json {
        return print_json(&session_json(s));
    }
    let v = session_json(s);
    let obj = v.as_object().expect("object");
    let mut rows = Vec::new();
    for (k, val) in obj {
        let text = match val {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => "-".into(),
            other => other.to_string(),
        };
        if text.is_empty() || text == "{}" {
            continue;
        }
        rows.push(vec![k.clone(), text]);
    }
    println!("{}", table(&["FIELD", "VALUE"], &rows));
}

pub async fn session(ctx: &Ctx, cmd: SessionCmd) -> i32 {
    let mut c = tryc!(client::connect(ctx).await);
    match cmd {
        SessionCmd::Create(args) => return create(ctx, &mut c, *args).await,
        SessionCmd::List {
            campaign,
            all,
            statuses,
            provider,
        } => {
            let mut st = Vec::new();
            for s in statuses {
                let up = s.to_ascii_uppercase();
                match Status::ALL.iter().find(|x| x.name() == up) {
                    Some(x) => st.push(x.number()),
                    None => return fail(format!("unknown status \"{s}\"")),
                }
            }
            let provider = match provider {
                Some(p) => match Provider::from_name(&p) {
                    Some(p) => p.number(),
                    None => return fail(format!("OBEY-2002: unknown provider \"{p}\"")),
                },
                None => 0,
            };
            let list = tryg!(
                c.list_sessions(pb::ListSessionsRequest {
                    campaign_id: campaign.unwrap_or_default(),
                    statuses: st,
                    provider,
                    include_terminated: all,
                })
                .await
            )
            .sessions;
            if ctx.json {
                print_json(&json!(list.iter().map(session_json).collect::<Vec<_>>()));
            } else {
                let now = now_ms();
                let rows: Vec<Vec<String>> = list.iter().map(|s| latis::list_row(s, now)).collect();
                println!("{}", table(&latis::LIST_HEADERS, &rows));
            }
        }
        SessionCmd::Info { id } => {
            let id = tryc!(resolve(&mut c, &id).await);
            let s = tryg!(
                c.get_session(pb::GetSessionRequest { session_id: id })
                    .await
            );
            print_session(ctx, &s);
        }
        SessionCmd::Status { id } => {
            let id = tryc!(resolve(&mut c, &id).await);
            let s = tryg!(
                c.get_session(pb::GetSessionRequest { session_id: id })
                    .await
            );
            if ctx.json {
                print_json(&session_json(&s));
            } else {
                println!("{}", latis::status_text(&s, now_ms()));
            }
        }
        SessionCmd::Attach { id } => {
            if ctx.json {
                return fail("attach is interactive and has no --json (`paddock --json session watch ID` streams JSON)");
            }
            let id = tryc!(resolve(&mut c, &id).await);
            return attach::run(&mut c, id).await;
        }
        SessionCmd::Delete { id } => {
            let id = tryc!(resolve(&mut c, &id).await);
            return latis::delete(ctx, &mut c, &id).await;
        }
        SessionCmd::Prune { campaign } => return latis::prune(ctx, &mut c, campaign).await,
        SessionCmd::Send { id, message } => {
            let id = tryc!(resolve(&mut c, &id).await);
            let mut stream = tryg!(
                c.send_message(pb::SendMessageRequest {
                    session_id: id,
                    message,
                })
                .await
            );
            let mut code = 1;
            let mut ended = false;
            while let Some(item) = stream.next().await {
                let a = match item {
                    Ok(a) => a,
                    Err(e) => return grpc_fail(e),
                };
                if ctx.json {
                    println!("{}", activity_json(&a));
                } else {
                    println!("{}", activity_line(&a));
                }
                match ActivityKind::from_number(a.r#type) {
                    Some(ActivityKind::Completion) => {
                        code = 0;
                        ended = true;
                    }
                    Some(ActivityKind::Error) => ended = true,
                    _ => {}
                }
            }
            if !ended {
                eprintln!("error: the activity stream ended before the turn did (see `paddock session logs`)");
            }
            return code;
        }
        SessionCmd::Watch { id } => {
            let id = tryc!(resolve(&mut c, &id).await);
            return watch(ctx, &mut c, id).await;
        }
        SessionCmd::Stop { id, force } => {
            let id = tryc!(resolve(&mut c, &id).await);
            let s = tryg!(
                c.stop_session(pb::StopSessionRequest {
                    session_id: id,
                    graceful: !force,
                })
                .await
            )
            .session
            .unwrap_or_default();
            if ctx.json {
                print_json(&session_json(&s));
            } else {
                println!("session {} is {}", s.id, status_name(s.status));
            }
        }
        SessionCmd::Restart { id, config } => {
            let id = tryc!(resolve(&mut c, &id).await);
            let s = tryg!(
                c.restart_session(pb::RestartSessionRequest {
                    session_id: id,
                    provider_config: config.into_iter().collect(),
                })
                .await
            )
            .session
            .unwrap_or_default();
            if ctx.json {
                print_json(&session_json(&s));
            } else {
                println!(
                    "session {} is {} (restart #{})",
                    s.id,
                    status_name(s.status),
                    s.restart_count
                );
            }
        }
        SessionCmd::History { id, limit } => {
            let id = tryc!(resolve(&mut c, &id).await);
            let h = tryg!(
                c.get_history(pb::GetHistoryRequest {
                    session_id: id,
                    limit,
                })
                .await
            );
            if h.truncated && !ctx.json {
                println!("(older entries left out; --limit shows more)");
            }
            for item in &h.items {
                if ctx.json {
                    println!("{}", history_json(item));
                } else {
                    println!("{}", history_line(item));
                }
            }
        }
        SessionCmd::Logs { id, after } => {
            let id = tryc!(resolve(&mut c, &id).await);
            let list = tryg!(
                c.list_activities(pb::ListActivitiesRequest {
                    session_id: id,
                    after_seq: after,
                    limit: 0,
                })
                .await
            )
            .activities;
            for a in &list {
                if ctx.json {
                    println!("{}", activity_json(a));
                } else {
                    println!("{:>5}  {}", a.seq, activity_line(a));
                }
            }
        }
    }
    0
}

/// `session create`: the flags over `-c session.yaml`, the place resolved to a campaign (the
/// current directory registered as one if needed), then CreateSession.
async fn create(ctx: &Ctx, c: &mut Client, args: latis::CreateArgs) -> i32 {
    let cwd = tryc!(std::env::current_dir().map_err(|e| format!("the current directory: {e}")));
    let file = match &args.file {
        Some(path) => {
            let f = tryc!(latis::SessionFile::read(path));
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map(|p| cwd.join(p))
                .unwrap_or_else(|| cwd.clone());
            Some((f, dir))
        }
        None => None,
    };
    let plan = tryc!(latis::plan(args, file, &cwd));
    let mut req = plan.request;
    req.campaign_id = tryc!(latis::resolve_place(c, &plan.place).await);
    let s = tryg!(c.create_session(req).await)
        .session
        .unwrap_or_default();
    if ctx.json {
        print_json(&session_json(&s));
    } else {
        println!("Session {} created.", s.id);
        println!(
            "{} ({}, {} driver) is {} in {}",
            s.agent_name,
            provider_name(s.provider),
            plan.driver,
            latis::state_of(&s),
            s.working_dir
        );
    }
    0
}

/// Follows a session's status changes and activity until it ends (or Ctrl-C).
async fn watch(ctx: &Ctx, c: &mut Client, id: String) -> i32 {
    let info = tryg!(
        c.get_session(pb::GetSessionRequest {
            session_id: id.clone()
        })
        .await
    );
    if !ctx.json {
        println!(
            "watching {} ({}): {}",
            info.id,
            info.agent_name,
            status_name(info.status)
        );
    }
    let mut statuses = tryg!(
        c.watch_session(pb::WatchSessionRequest {
            session_id: id.clone()
        })
        .await
    );
    let last = tryg!(
        c.list_activities(pb::ListActivitiesRequest {
            session_id: id.clone(),
            after_seq: 0,
            limit: 0,
        })
        .await
    )
    .activities
    .last()
    .map(|a| a.seq)
    .unwrap_or(0);
    let mut acts = tryg!(
        c.watch_activity(pb::WatchActivityRequest {
            session_id: id.clone(),
            after_seq: last,
        })
        .await
    );
    let (mut s_open, mut a_open) = (true, true);
    while s_open || a_open {
        tokio::select! {
            ev = statuses.next(), if s_open => match ev {
                Some(Ok(e)) => {
                    if ctx.json {
                        println!("{}", status_event_json(&e));
                    } else {
                        println!("STATUS      {} → {}  {}", status_name(e.previous_status), status_name(e.new_status), e.message);
                    }
                }
                Some(Err(e)) => return grpc_fail(e),
                None => s_open = false,
            },
            ev = acts.next(), if a_open => match ev {
                Some(Ok(a)) => {
                    if ctx.json {
                        println!("{}", activity_json(&a));
                    } else {
                        println!("{}", activity_line(&a));
                    }
                }
                Some(Err(e)) => return grpc_fail(e),
                None => a_open = false,
            },
        }
    }
    0
}

pub async fn ping(ctx: &Ctx) -> i32 {
    let mut c = tryc!(client::connect(ctx).await);
    let p = tryg!(c.ping(pb::PingRequest {}).await);
    let up = p.uptime.map(|d| d.seconds).unwrap_or(0);
    if ctx.json {
        print_json(&json!({ "version": p.version, "uptime_seconds": up }));
    } else {
        println!("paddock {} up {}s", p.version, up);
    }
    0
}

pub async fn state(ctx: &Ctx) -> i32 {
    let mut c = tryc!(client::connect(ctx).await);
    let s = tryg!(c.get_state(pb::StateRequest {}).await);
    if ctx.json {
        print_json(&json!({
            "version": s.version,
            "socket_path": s.socket_path,
            "data_dir": s.data_dir,
            "campaign_count": s.campaign_count,
            "session_count": s.session_count,
            "active_sessions": s.active_sessions.iter().map(|a| json!({
                "id": a.id, "campaign_id": a.campaign_id, "provider": provider_name(a.provider),
                "agent_name": a.agent_name, "status": status_name(a.status),
            })).collect::<Vec<_>>(),
        }));
    } else {
        println!(
            "paddock {} on {} (data: {})\n{} campaign(s), {} session(s), {} active",
            s.version,
            s.socket_path,
            s.data_dir,
            s.campaign_count,
            s.session_count,
            s.active_sessions.len()
        );
        if !s.active_sessions.is_empty() {
            let rows: Vec<Vec<String>> = s
                .active_sessions
                .iter()
                .map(|a| {
                    vec![
                        a.id.clone(),
                        a.agent_name.clone(),
                        provider_name(a.provider).into(),
                        status_name(a.status).into(),
                    ]
                })
                .collect();
            println!("{}", table(&["ID", "NAME", "PROVIDER", "STATUS"], &rows));
        }
    }
    0
}

pub async fn shutdown(ctx: &Ctx, force: bool) -> i32 {
    let ctx_no_start = Ctx {
        socket: ctx.socket.clone(),
        data_dir: ctx.data_dir.clone(),
        json: ctx.json,
        autostart: false,
    };
    let mut c = tryc!(client::connect(&ctx_no_start).await);
    let r = tryg!(c.shutdown(pb::ShutdownRequest { force }).await);
    if ctx.json {
        print_json(&json!({ "accepted": r.accepted, "active_sessions": r.active_sessions }));
    } else {
        println!(
            "daemon stopping ({} active session(s) being stopped)",
            r.active_sessions
        );
    }
    0
}
