//! The CLI: `paddock campaign …`, `paddock session …`, and the daemon's housekeeping
//! commands. Every command is a gRPC call on the daemon's socket and returns its one error type
//! ([`Error`]); a failure prints the daemon's message (`OBEY-2010: session "x" not found`) and
//! exits 1.

/// `println!` for the CLI's output, as a `Result`: a reader that went away (`paddock session
/// list | head`) is [`Error::StdoutClosed`], which ends the command quietly, where `println!`
/// panics.
macro_rules! outln {
    () => {
        $crate::output::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// [`outln!`] without the line's end.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write_out(format_args!($($arg)*))
    };
}

pub mod approvals;
pub mod attach;
pub mod client;
pub mod demo;
pub mod doctor;
mod error;
pub mod latis;
pub mod line_input;
pub mod output;
pub mod settings;
pub mod task;
pub mod top;
pub mod view;
pub mod workspace;

// The crates below the CLI, under the names the shell gives them (`crate::transport`, …).
use paddock_agents as providers;
use paddock_config as config;
use paddock_env as env;
use paddock_support::{secret, text};
use paddock_sys::{paths, socket, transport};

use std::path::PathBuf;

use clap::Subcommand;
use paddock_core::{ActivityKind, Provider, Status};
use paddock_proto::obey::local::v1 as pb;
use serde_json::json;
use tokio_stream::StreamExt;

use client::Client;
pub use error::{Error, Exit, Result, EXIT_CODES_HELP};
use output::*;
use view::*;

/// What every command needs.
pub struct Ctx {
    pub socket: PathBuf,
    pub data_dir: PathBuf,
    pub json: bool,
    pub autostart: bool,
}

#[derive(Subcommand, Debug)]
pub enum ConfigCmd {
    /// The effective configuration: each value and where it came from (the file and line, an
    /// environment variable, or the default)
    Show,
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

// The variants' doc comments are `--help` text, for a terminal (`<name>` is not HTML).
#[allow(rustdoc::invalid_html_tags)]
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
        /// Only these states as the list shows them (ready, complete, working, failed, …) or
        /// paddock statuses (RUNNING, …); repeatable
        #[arg(long = "status")]
        statuses: Vec<String>,
        #[arg(long)]
        provider: Option<String>,
        /// Show at most this many sessions, newest first (0: all); by default 100 in a table
        /// and all with --json
        #[arg(long)]
        limit: Option<usize>,
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
    Delete {
        id: String,
        /// Do not ask first (on a terminal, delete asks)
        #[arg(long, short = 'y')]
        yes: bool,
        /// Also delete the session's branch (paddock/<name>; kept by default: it is the
        /// agent's work)
        #[arg(long)]
        delete_branch: bool,
    },
    /// What the agent changed in its worktree (commits, edits, new files) since it was made
    Diff {
        id: String,
        /// Only the files and how much changed
        #[arg(long)]
        stat: bool,
    },
    /// Run a command in the session's environment (its sandbox, its worktree) and exit with
    /// its exit code: `paddock session exec ID -- make test`
    Exec {
        id: String,
        /// The command and its arguments
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Delete every stopped and failed session and everything stored about them
    Prune {
        /// Only this campaign's (id or name)
        #[arg(long)]
        campaign: Option<String>,
        /// Do not ask first (on a terminal, prune asks)
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Send a message and stream the agent's activity until the turn ends
    Send {
        id: String,
        /// The message; `-` reads it from standard input (to its end)
        message: String,
    },
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
        /// Print what the driver did to make the session's environment instead (its
        /// worktree, the sign-in files passed into a sandbox)
        #[arg(long)]
        environment: bool,
    },
    /// Print a session's conversation: each turn's message, then what the agent did and said
    History {
        id: String,
        /// At most this many of the newest entries
        #[arg(long, default_value_t = 1000)]
        limit: i32,
    },
}

/// A clap value parser (clap shows the string as the usage error).
pub(crate) fn parse_kv(s: &str) -> std::result::Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

/// A duration flag: `90s`, `15m`, `2h`, `1d`, or a bare number of seconds (the grammar of
/// `approval_timeout`), in whole seconds.
pub(crate) fn parse_secs(s: &str) -> std::result::Result<u64, String> {
    paddock_core::approval::parse_duration_ms(s)
        .map(|ms| ms.div_ceil(1000))
        .ok_or_else(|| {
            format!("expected a duration like 90s, 15m, 2h or 1d (or seconds), got {s:?}")
        })
}

/// A command's end as the process's exit code: 0, or its error printed (as JSON with
/// `--json`) and its [`Exit`] code.
pub fn exit_code(r: Result<()>, json: bool) -> i32 {
    match r {
        // The reader of the output went away (`paddock session list | head`): it has what
        // it wanted, and the command ends as quietly as it would have.
        Ok(()) | Err(Error::StdoutClosed) => 0,
        Err(e @ (Error::Reported | Error::AgentFailed | Error::Interrupted)) => e.exit() as i32,
        Err(e) => {
            if json {
                eprintln!("{}", e.to_json());
            } else {
                eprintln!("error: {e}");
            }
            e.exit() as i32
        }
    }
}

pub(crate) fn print_json(v: &serde_json::Value) -> Result<()> {
    outln!("{}", serde_json::to_string_pretty(v).expect("json"))
}

fn now_ms() -> u64 {
    crate::paths::now_ms()
}

pub async fn campaign(ctx: &Ctx, cmd: CampaignCmd) -> Result<()> {
    let mut c = client::connect(ctx).await?;
    match cmd {
        CampaignCmd::Add { name, path } => {
            let camp = c
                .add_campaign(pb::AddCampaignRequest {
                    name,
                    root_path: path.display().to_string(),
                })
                .await?
                .into_inner();
            if ctx.json {
                print_json(&campaign_json(&camp))?;
            } else {
                outln!("campaign {} ({}) → {}", camp.name, camp.id, camp.root_path)?;
            }
        }
        CampaignCmd::List => {
            let list = c
                .list_campaigns(pb::ListCampaignsRequest {})
                .await?
                .into_inner()
                .campaigns;
            if ctx.json {
                print_json(&json!(list.iter().map(campaign_json).collect::<Vec<_>>()))?;
            } else {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|c| vec![c.name.clone(), c.id.clone(), c.root_path.clone()])
                    .collect();
                outln!("{}", table(&["NAME", "ID", "ROOT"], &rows))?;
            }
        }
        CampaignCmd::Remove { campaign } => {
            let r = c
                .remove_campaign(pb::RemoveCampaignRequest {
                    campaign: campaign.clone(),
                })
                .await?
                .into_inner();
            if ctx.json {
                print_json(&json!({ "removed": r.removed }))?;
            } else {
                outln!("campaign {campaign} removed")?;
            }
        }
    }
    Ok(())
}

/// Accepts a full session id or a unique prefix of one (or of its part after `sess_`).
pub(crate) async fn resolve(c: &mut Client, id: &str) -> Result<String> {
    if c.get_session(pb::GetSessionRequest {
        session_id: id.to_string(),
    })
    .await
    .is_ok()
    {
        return Ok(id.to_string());
    }
    let all = list_sessions(
        c,
        pb::ListSessionsRequest {
            include_terminated: true,
            view: pb::SessionView::Basic.into(),
            ..Default::default()
        },
    )
    .await?;
    // A name (`session create --name`) is as good as an id, when one session has it.
    let named: Vec<&pb::SessionInfo> = all.iter().filter(|s| s.agent_name == id).collect();
    match named.as_slice() {
        [one] => return Ok(one.id.clone()),
        [] => {}
        many => {
            let ids: Vec<&str> = many.iter().map(|s| s.id.as_str()).collect();
            return Err(Error::Usage(format!(
                "{} sessions are named \"{id}\": {}; use the id",
                many.len(),
                ids.join(", ")
            )));
        }
    }
    match by_part(&all, |s| &s.id, id, "sess_", "sessions")? {
        Some(one) => Ok(one.id.clone()),
        None => Ok(id.to_string()), // let the daemon say OBEY-2010
    }
}

/// The one item whose id `part` names — the id's start, its start after `prefix` (`sess_`,
/// `task_`), or its end (what a narrow table shows), in any case — if one does; several are a
/// usage error naming how many `what` it matches.
pub(crate) fn by_part<'a, T>(
    items: &'a [T],
    id: impl Fn(&T) -> &str,
    part: &str,
    prefix: &str,
    what: &str,
) -> Result<Option<&'a T>> {
    let needle = part.to_ascii_lowercase();
    let hits: Vec<&T> = items
        .iter()
        .filter(|t| {
            let full = id(t).to_ascii_lowercase();
            full.starts_with(&needle)
                || full.trim_start_matches(prefix).starts_with(&needle)
                || full.ends_with(&needle)
        })
        .collect();
    match hits.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one)),
        many => Err(Error::Usage(format!(
            "\"{part}\" matches {} {what}; give more of the id",
            many.len()
        ))),
    }
}

/// A session's every field (`session info`), and where its worktree is when it has one.
fn print_session(ctx: &Ctx, s: &pb::SessionInfo, worktree: Option<&std::path::Path>) -> Result<()> {
    let mut v = session_json(s);
    if let Some(path) = worktree {
        v["worktree_path"] = json!(path.display().to_string());
    }
    if ctx.json {
        return print_json(&v);
    }
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
    outln!("{}", table(&["FIELD", "VALUE"], &rows))
}

pub async fn session(ctx: &Ctx, cmd: SessionCmd) -> Result<()> {
    let mut c = client::connect(ctx).await?;
    match cmd {
        SessionCmd::Create(args) => return create(ctx, &mut c, *args).await,
        SessionCmd::List {
            campaign,
            all,
            statuses,
            provider,
            limit,
        } => {
            // One vocabulary: what the list shows (latis' states) is accepted as well as
            // paddock's statuses; a state asks the daemon for its statuses, then is matched.
            let (mut by_status, mut states) = (Vec::new(), Vec::new());
            // A state is written as the list shows it (`failed`: every session shown failed,
            // a live one whose last turn failed too); a status in capitals (`FAILED`).
            for s in statuses {
                let up = s.to_ascii_uppercase();
                let is_state = Status::ALL
                    .iter()
                    .any(|x| latis_states_of(*x).contains(&s.to_ascii_lowercase().as_str()));
                if is_state && s != up {
                    states.push(s.to_ascii_lowercase());
                } else if let Some(x) = Status::ALL.iter().find(|x| x.name() == up) {
                    by_status.push(x.number());
                } else if is_state {
                    states.push(s.to_ascii_lowercase());
                } else {
                    return Err(Error::Usage(format!(
                        "unknown status \"{s}\" (one of: ready, complete, creating, starting, \
                         working, waiting, stopping, stopped, failed, or paddock's RUNNING, …)"
                    )));
                }
            }
            let mut st = by_status.clone();
            for x in Status::ALL {
                if states
                    .iter()
                    .any(|w| latis_states_of(x).contains(&w.as_str()))
                {
                    st.push(x.number());
                }
            }
            if st.is_empty() && !all {
                // Every live session, a stopping one too (the daemon's default is the seed's
                // "active" set, which leaves STOPPING out).
                st = Status::ALL
                    .into_iter()
                    .filter(|x| !x.is_terminal())
                    .map(Status::number)
                    .collect();
            }
            let provider = match provider {
                Some(p) => match Provider::from_name(&p) {
                    Some(p) => p.number(),
                    None => return Err(Error::unknown_provider(&p)),
                },
                None => 0,
            };
            // A table shows a first page: listing 10,000 stored sessions costs what 100 cost
            // (the daemon copies and sends only the page); --json gives every one unless told.
            let limit = limit.unwrap_or(if ctx.json { 0 } else { LIST_LIMIT });
            let keep = |s: &pb::SessionInfo| {
                (by_status.is_empty() && states.is_empty())
                    || by_status.contains(&s.status)
                    || states.iter().any(|w| w == view::state_of(s))
            };
            let mut req = pb::ListSessionsRequest {
                campaign_id: campaign.unwrap_or_default(),
                statuses: st,
                provider,
                include_terminated: all,
                page_token: String::new(),
                page_size: i32::try_from(limit).unwrap_or(i32::MAX),
                // The table shows a few fields of each; --json gives all of them.
                view: match ctx.json {
                    true => pb::SessionView::Full,
                    false => pb::SessionView::Basic,
                }
                .into(),
            };
            let mut list = Vec::new();
            let mut more = loop {
                let mut page = c.list_sessions(req.clone()).await?.into_inner();
                page.sessions.retain(keep);
                // The first page is the list (no copy of it).
                if list.is_empty() {
                    list = page.sessions;
                } else {
                    list.append(&mut page.sessions);
                }
                if page.next_page_token.is_empty() {
                    break false;
                }
                if limit > 0 && list.len() >= limit {
                    break true;
                }
                req.page_token = page.next_page_token;
            };
            if limit > 0 && list.len() > limit {
                list.truncate(limit);
                more = true;
            }
            if ctx.json {
                print_json(&json!(list.iter().map(session_json).collect::<Vec<_>>()))?;
            } else {
                let now = now_ms();
                let rows: Vec<_> = list.iter().map(|s| latis::list_row(s, now)).collect();
                outln!("{}", table(&latis::LIST_HEADERS, &rows))?;
            }
            if more {
                eprintln!("(the newest {limit}; more with --limit N, all with --limit 0)");
            }
        }
        SessionCmd::Info { id } => {
            let id = resolve(&mut c, &id).await?;
            let s = c
                .get_session(pb::GetSessionRequest { session_id: id })
                .await?
                .into_inner();
            let worktree = workspace::worktree_path(&mut c, &s).await;
            print_session(ctx, &s, worktree.as_deref())?;
        }
        SessionCmd::Status { id } => {
            let id = resolve(&mut c, &id).await?;
            let s = c
                .get_session(pb::GetSessionRequest { session_id: id })
                .await?
                .into_inner();
            if ctx.json {
                print_json(&session_json(&s))?;
            } else {
                outln!("{}", latis::status_text(&s, now_ms()))?;
            }
        }
        SessionCmd::Attach { id } => {
            if ctx.json {
                return Err(Error::Usage("attach is interactive and has no --json (`paddock --json session watch ID` streams JSON)".into()));
            }
            let id = resolve(&mut c, &id).await?;
            return attach::run(&mut c, id).await;
        }
        SessionCmd::Delete {
            id,
            yes,
            delete_branch,
        } => {
            let id = resolve(&mut c, &id).await?;
            return latis::delete(ctx, &mut c, &id, yes, delete_branch).await;
        }
        SessionCmd::Diff { id, stat } => {
            let id = resolve(&mut c, &id).await?;
            let info = c
                .get_session(pb::GetSessionRequest { session_id: id })
                .await?
                .into_inner();
            return workspace::diff(&mut c, &info, stat).await;
        }
        SessionCmd::Exec { id, command } => {
            let id = resolve(&mut c, &id).await?;
            return task::exec(ctx, id, command).await;
        }
        SessionCmd::Prune { campaign, yes } => {
            return latis::prune(ctx, &mut c, campaign, yes).await
        }
        SessionCmd::Send { id, message } => {
            let message = if message == "-" {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                    .map_err(Error::io("standard input"))?;
                text
            } else {
                message
            };
            let id = resolve(&mut c, &id).await?;
            // Listening before the turn starts: a Ctrl-C as soon as its first line shows must
            // not find the default action (which would end the command without a word).
            let mut ctrl_c =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
                    .map_err(Error::io("SIGINT"))?;
            let mut stream = c
                .send_message(pb::SendMessageRequest {
                    session_id: id.clone(),
                    message,
                })
                .await?
                .into_inner();
            // The turn's last activity: COMPLETION (exit 0) or ERROR (already shown, exit 6).
            let mut end = None;
            loop {
                let item = tokio::select! {
                    item = stream.next() => match item {
                        Some(item) => item,
                        None => break,
                    },
                    _ = ctrl_c.recv() => return interrupt_send(&mut c, &id).await,
                };
                let a = item?;
                if ctx.json {
                    outln!("{}", activity_json(&a))?;
                } else {
                    outln!("{}", activity_line(&a))?;
                }
                if let Some(k @ (ActivityKind::Completion | ActivityKind::Error)) =
                    ActivityKind::from_number(a.r#type)
                {
                    end = Some(k);
                }
            }
            return match end {
                Some(ActivityKind::Completion) => Ok(()),
                Some(_) => Err(Error::AgentFailed),
                None => Err(Error::Protocol(
                    "the activity stream ended before the turn did (see `paddock session logs`)"
                        .into(),
                )),
            };
        }
        SessionCmd::Watch { id } => {
            let id = resolve(&mut c, &id).await?;
            return watch(ctx, &mut c, id).await;
        }
        SessionCmd::Stop { id, force } => {
            let id = resolve(&mut c, &id).await?;
            let what = if force {
                "stopping the agent"
            } else {
                "waiting for the current turn to end, then stopping (--force interrupts it)"
            };
            let s = with_progress(
                what,
                c.stop_session(pb::StopSessionRequest {
                    session_id: id,
                    graceful: !force,
                }),
            )
            .await?
            .into_inner()
            .session
            .unwrap_or_default();
            if ctx.json {
                print_json(&session_json(&s))?;
            } else {
                outln!("session {} is {}", s.id, status_name(s.status))?;
            }
        }
        SessionCmd::Restart { id, config } => {
            let id = resolve(&mut c, &id).await?;
            let s = with_progress(
                "restarting the agent",
                c.restart_session(pb::RestartSessionRequest {
                    session_id: id,
                    provider_config: config.into_iter().collect(),
                }),
            )
            .await?
            .into_inner()
            .session
            .unwrap_or_default();
            if ctx.json {
                print_json(&session_json(&s))?;
            } else {
                outln!(
                    "session {} is {} (restart #{})",
                    s.id,
                    status_name(s.status),
                    s.restart_count
                )?;
            }
        }
        SessionCmd::History { id, limit } => {
            let id = resolve(&mut c, &id).await?;
            let h = c
                .get_history(pb::GetHistoryRequest {
                    session_id: id,
                    limit,
                })
                .await?
                .into_inner();
            if h.truncated && !ctx.json {
                outln!("(older entries left out; --limit shows more)")?;
            }
            for item in &h.items {
                if ctx.json {
                    outln!("{}", history_json(item))?;
                } else {
                    outln!("{}", history_line(item))?;
                }
            }
        }
        SessionCmd::Logs {
            id,
            environment: true,
            ..
        } => {
            let id = resolve(&mut c, &id).await?;
            return workspace::environment_log(&mut c, &id).await;
        }
        SessionCmd::Logs { id, after, .. } => {
            let id = resolve(&mut c, &id).await?;
            // Page after page (the daemon pages by count and by size) until none is left.
            let mut after = after;
            loop {
                let list = c
                    .list_activities(pb::ListActivitiesRequest {
                        session_id: id.clone(),
                        after_seq: after,
                        limit: 0,
                    })
                    .await?
                    .into_inner()
                    .activities;
                let Some(last) = list.last() else { break };
                after = last.seq;
                for a in &list {
                    if ctx.json {
                        outln!("{}", activity_json(a))?;
                    } else {
                        outln!("{:>5}  {}", a.seq, activity_line(a))?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// `session create`: the flags over `-c session.yaml`, the place resolved to a campaign (the
/// current directory registered as one if needed), then CreateSession.
async fn create(ctx: &Ctx, c: &mut Client, args: latis::CreateArgs) -> Result<()> {
    let cwd = std::env::current_dir().map_err(Error::io("the current directory"))?;
    let file = match &args.file {
        Some(path) => {
            let f = latis::SessionFile::read(path)?;
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map(|p| cwd.join(p))
                .unwrap_or_else(|| cwd.clone());
            Some((f, dir))
        }
        None => None,
    };
    let plan = latis::plan(args, file, &cwd)?;
    let mut req = plan.request;
    let config = crate::config::load()
        .map_err(|e| Error::Usage(e.to_string()))?
        .map(|l| l.config)
        .unwrap_or_default();
    latis::apply_config(&mut req, &config)?;
    let host = latis::Host {
        config_provider: config
            .session
            .provider
            .as_ref()
            .map(|p| p.get_ref().clone()),
        ..latis::Host::current()
    };
    if let Some(line) = latis::choose_provider(&mut req, &host)? {
        eprintln!("{line}");
    }
    latis::apply_agent_command(&mut req, &config);
    if let Some(note) = latis::offline_note(&req) {
        eprintln!("{note}");
    }
    if let Some(env) = &req.environment_spec {
        if env.driver == "podman" && !ctx.json {
            latis::pull_image(&env.image)?;
        }
    }
    // The scripted agent is a stand-in (demos, tests): what its default means is not news.
    let default_permissions = !req.provider_config.contains_key("permissions")
        && req.provider != paddock_core::Provider::Scripted.number();
    let place = latis::resolve_place(c, &plan.place).await?;
    req.campaign_id = place.id.clone();
    let s = match with_progress("starting the agent", c.create_session(req)).await {
        Ok(r) => r.into_inner().session.unwrap_or_default(),
        Err(e) => {
            place.undo(c).await;
            return Err(e.into());
        }
    };
    place.keep();
    if default_permissions {
        if let Some(note) = s
            .provider_config
            .get("permissions")
            .and_then(|p| latis::permissions_note(p, provider_name(s.provider)))
        {
            eprintln!("{note}");
        }
    }
    if ctx.json {
        print_json(&session_json(&s))?;
    } else {
        outln!("Session {} created.", s.id)?;
        outln!(
            "{} ({}, {} driver) is {} in {}",
            s.agent_name,
            provider_name(s.provider),
            view::driver_of(&s),
            state_of(&s),
            latis::where_it_works(&s)
        )?;
    }
    Ok(())
}

/// Follows a session's status changes and activity until it ends (or Ctrl-C).
async fn watch(ctx: &Ctx, c: &mut Client, id: String) -> Result<()> {
    let info = c
        .get_session(pb::GetSessionRequest {
            session_id: id.clone(),
        })
        .await?
        .into_inner();
    if !ctx.json {
        outln!(
            "watching {} ({}): {}",
            info.id,
            info.agent_name,
            status_name(info.status)
        )?;
    }
    let mut statuses = c
        .watch_session(pb::WatchSessionRequest {
            session_id: id.clone(),
        })
        .await?
        .into_inner();
    // The newest activity's seq: where the watch starts.
    let last = c
        .get_history(pb::GetHistoryRequest {
            session_id: id.clone(),
            limit: 1,
        })
        .await?
        .into_inner()
        .last_seq;
    let mut acts = c
        .watch_activity(pb::WatchActivityRequest {
            session_id: id.clone(),
            after_seq: last,
        })
        .await?
        .into_inner();
    let print_status = |e: &pb::SessionStatusEvent| {
        if ctx.json {
            outln!("{}", status_event_json(e))
        } else {
            outln!(
                "STATUS      {} → {}  {}",
                status_name(e.previous_status),
                status_name(e.new_status),
                e.message
            )
        }
    };
    let mut order = TurnOrder::new(Status::from_number(info.status));
    let (mut s_open, mut a_open) = (true, true);
    while s_open || a_open {
        let held_until = order.held_until();
        tokio::select! {
            ev = statuses.next(), if s_open => match ev {
                Some(Ok(e)) => {
                    for e in order.status(e) {
                        print_status(&e)?;
                    }
                }
                Some(Err(e)) => return Err(e.into()),
                None => s_open = false,
            },
            ev = acts.next(), if a_open => match ev {
                Some(Ok(a)) => {
                    if ctx.json {
                        outln!("{}", activity_json(&a))?;
                    } else {
                        outln!("{}", activity_line(&a))?;
                    }
                    if let Some(e) = order.activity(&a) {
                        print_status(&e)?;
                    }
                }
                Some(Err(e)) => return Err(e.into()),
                None => a_open = false,
            },
            _ = tokio::time::sleep_until(held_until.unwrap_or_else(tokio::time::Instant::now)), if held_until.is_some() => {
                if let Some(e) = order.expire() {
                    print_status(&e)?;
                }
            }
        }
    }
    if let Some(e) = order.expire() {
        print_status(&e)?;
    }
    Ok(())
}

/// A session's status changes and its activity come on two streams, and either may run ahead
/// of the other: `watch` shows them in the order they happened by holding a status change that
/// ends a turn (WORKING → RUNNING, → FAILED, …) until that turn's last activity (COMPLETION or
/// ERROR) is shown, at most [`TURN_END_WAIT`] (a turn cut short by a crash has none).
struct TurnOrder {
    /// Turns begun (a status change into WORKING, or WORKING when the watch began) less turns
    /// whose last activity was shown; below 0 while an activity stream ahead of the statuses
    /// has shown a turn's end before the status change that began it.
    open: i64,
    held: Option<(pb::SessionStatusEvent, tokio::time::Instant)>,
}

/// How long a status change that ends a turn waits for the turn's last activity.
const TURN_END_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl TurnOrder {
    fn new(now: Option<Status>) -> TurnOrder {
        TurnOrder {
            open: i64::from(now.is_some_and(Status::in_turn)),
            held: None,
        }
    }

    fn in_turn(n: i32) -> bool {
        Status::from_number(n).is_some_and(Status::in_turn)
    }

    /// The status changes to show now for `e`, in order: one held before it, then `e` unless
    /// it ends a turn whose last activity has not been shown yet.
    fn status(&mut self, e: pb::SessionStatusEvent) -> Vec<pb::SessionStatusEvent> {
        let mut now: Vec<_> = self.expire().into_iter().collect();
        let (was, is) = (
            Self::in_turn(e.previous_status),
            Self::in_turn(e.new_status),
        );
        if is && !was {
            self.open += 1;
        }
        if was && !is && self.open > 0 {
            self.held = Some((e, tokio::time::Instant::now() + TURN_END_WAIT));
        } else {
            now.push(e);
        }
        now
    }

    /// An activity was shown: the status change held for it, if it ended the turn.
    fn activity(&mut self, a: &pb::SessionActivityEvent) -> Option<pb::SessionStatusEvent> {
        if !ActivityKind::from_number(a.r#type).is_some_and(ActivityKind::ends_turn) {
            return None;
        }
        self.open -= 1;
        self.held.take().map(|(e, _)| e)
    }

    fn held_until(&self) -> Option<tokio::time::Instant> {
        self.held.as_ref().map(|(_, t)| *t)
    }

    /// The held status change, shown anyway (its wait is over, another change came, or the
    /// streams ended): its turn counts as ended.
    fn expire(&mut self) -> Option<pb::SessionStatusEvent> {
        let (e, _) = self.held.take()?;
        self.open = 0;
        Some(e)
    }
}

#[cfg(test)]
mod turn_order_tests {
    use super::*;

    fn status(from: Status, to: Status) -> pb::SessionStatusEvent {
        pb::SessionStatusEvent {
            previous_status: from.number(),
            new_status: to.number(),
            ..Default::default()
        }
    }

    fn act(kind: ActivityKind) -> pb::SessionActivityEvent {
        pb::SessionActivityEvent {
            r#type: kind.number(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_turns_end_is_shown_after_its_last_activity_whichever_stream_is_ahead() {
        use ActivityKind as A;
        use Status as S;
        // In order: nothing is held.
        let mut o = TurnOrder::new(Some(S::Running));
        assert_eq!(o.status(status(S::Running, S::Working)).len(), 1);
        assert!(o.activity(&act(A::Thinking)).is_none());
        assert!(o.activity(&act(A::Completion)).is_none());
        assert_eq!(o.status(status(S::Working, S::Running)).len(), 1);
        // The statuses ahead: the end waits for the COMPLETION.
        assert_eq!(o.status(status(S::Running, S::Working)).len(), 1);
        assert!(o.status(status(S::Working, S::Running)).is_empty());
        assert!(o.held_until().is_some());
        assert!(o.activity(&act(A::Thinking)).is_none());
        let e = o
            .activity(&act(A::Completion))
            .expect("released by the turn's end");
        assert_eq!(e.new_status, S::Running.number());
        // The activities ahead: the turn's statuses come after its end, and pass at once.
        assert!(o.activity(&act(A::Thinking)).is_none());
        assert!(o.activity(&act(A::Completion)).is_none());
        assert_eq!(o.status(status(S::Running, S::Working)).len(), 1);
        assert_eq!(o.status(status(S::Working, S::Running)).len(), 1);
        // A turn cut short (no COMPLETION): shown when its wait is over; a WAITING in a turn
        // does not end it.
        assert_eq!(o.status(status(S::Running, S::Working)).len(), 1);
        assert_eq!(o.status(status(S::Working, S::Waiting)).len(), 1);
        assert!(o.status(status(S::Waiting, S::Failed)).is_empty());
        assert_eq!(o.expire().unwrap().new_status, S::Failed.number());
        // A watch that began mid-turn holds that turn's end too.
        let mut o = TurnOrder::new(Some(S::Working));
        assert!(o.status(status(S::Working, S::Running)).is_empty());
    }
}

/// How long `ping` waits at most, whatever the call timeout: it answers "is it alive?".
const PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub async fn ping(ctx: &Ctx) -> Result<()> {
    let wait = PING_TIMEOUT.min(client::call_timeout());
    let answer = tokio::time::timeout(wait, async {
        let mut c = client::connect(ctx).await?;
        Ok::<_, Error>(c.ping(pb::PingRequest {}).await?.into_inner())
    })
    .await;
    let p = match answer {
        Ok(p) => p?,
        Err(_) => {
            return Err(Error::Silent {
                socket: ctx.socket.clone(),
                wait_s: wait.as_secs(),
            })
        }
    };
    let up = p.uptime.map(|d| d.seconds).unwrap_or(0);
    if ctx.json {
        print_json(&json!({ "version": p.version, "uptime_seconds": up }))?;
    } else {
        outln!("paddock {} up {}s", p.version, up)?;
    }
    Ok(())
}

pub async fn state(ctx: &Ctx) -> Result<()> {
    let mut c = client::connect(ctx).await?;
    let s = c.get_state(pb::StateRequest {}).await?.into_inner();
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
        }))?;
    } else {
        outln!(
            "paddock {} on {} (data: {})\n{} campaign(s), {} session(s), {} active",
            s.version,
            s.socket_path,
            s.data_dir,
            s.campaign_count,
            s.session_count,
            s.active_sessions.len()
        )?;
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
            outln!("{}", table(&["ID", "NAME", "PROVIDER", "STATUS"], &rows))?;
        }
    }
    Ok(())
}

pub async fn shutdown(ctx: &Ctx, force: bool) -> Result<()> {
    let ctx_no_start = Ctx {
        socket: ctx.socket.clone(),
        data_dir: ctx.data_dir.clone(),
        json: ctx.json,
        autostart: false,
    };
    // Never starts one to stop it; and it is not --no-autostart (unless given) that says so.
    let mut c = match client::connect(&ctx_no_start).await {
        Err(Error::NoAutostart(e)) if ctx.autostart => return Err(Error::NoDaemon(e)),
        c => c?,
    };
    let r = c
        .shutdown(pb::ShutdownRequest { force })
        .await?
        .into_inner();
    if !ctx.json {
        outln!(
            "daemon stopping ({} active session(s) being stopped)",
            r.active_sessions
        )?;
    }
    // Returns once the daemon has exited (its socket no longer answers), so that a script can
    // start another right after; bounded like every call.
    drop(c);
    let deadline = std::time::Instant::now() + client::call_timeout();
    loop {
        let answers = match crate::transport::conn(&ctx.socket).await {
            Err(_) => false,
            Ok(ch) => {
                let mut probe = client::client_of(ch);
                let ping = probe.ping(pb::PingRequest {});
                matches!(
                    tokio::time::timeout(std::time::Duration::from_secs(1), ping).await,
                    Ok(Ok(_))
                )
            }
        };
        if !answers {
            break;
        }
        if std::time::Instant::now() >= deadline {
            return Err(Error::Protocol(format!(
                "the daemon accepted the shutdown but still answers after {} s (its sessions \
                 may still be stopping; see `paddock state`)",
                client::call_timeout().as_secs()
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    if ctx.json {
        print_json(&json!({
            "accepted": r.accepted,
            "active_sessions": r.active_sessions,
            "exited": true,
        }))?;
    } else {
        outln!("daemon stopped")?;
    }
    Ok(())
}

/// Ctrl-C during `send`: on a terminal, asks whether to interrupt the turn (the agent is
/// restarted, which ends the turn and keeps the session and its conversation) or to leave it
/// running; elsewhere it is left running. Either way the command ends (exit 130).
async fn interrupt_send(c: &mut Client, id: &str) -> Result<()> {
    use std::io::{BufRead, IsTerminal, Write};
    let interactive = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    let interrupt = interactive && {
        eprint!("\nInterrupt the turn? The agent is restarted; the session goes on. [y/N] ");
        let _ = std::io::stderr().flush();
        let answer = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).map(|_| line)
        });
        // A second Ctrl-C while asked: the turn is left alone.
        tokio::select! {
            line = answer => matches!(
                line.ok().and_then(|l| l.ok()).map(|l| l.trim().to_ascii_lowercase()).as_deref(),
                Some("y" | "yes")
            ),
            _ = tokio::signal::ctrl_c() => false,
        }
    };
    if interrupt {
        c.restart_session(pb::RestartSessionRequest {
            session_id: id.to_string(),
            provider_config: Default::default(),
        })
        .await
        .map_err(|source| Error::Step {
            step: format!("cannot interrupt session {id}'s turn"),
            source,
        })?;
        eprintln!("Turn interrupted: the agent was restarted and the session goes on.");
    } else {
        eprintln!(
            "The turn goes on without you: `paddock session watch {id}` follows it, \
             `paddock session logs {id}` shows it."
        );
    }
    Err(Error::Interrupted)
}

/// The latis states a session of `status` can show (before and after a turn, the last one
/// completed or failed).
fn latis_states_of(status: Status) -> Vec<&'static str> {
    [(0, false), (1, false), (1, true)]
        .iter()
        .map(|(turns, failed)| view::latis_state(status, *turns, *failed))
        .collect()
}

/// Sessions `session list` shows in a table when no --limit is given.
pub const LIST_LIMIT: usize = 100;

/// Every session a ListSessions request matches, page after page (the daemon pages its replies
/// by size).
pub async fn list_sessions(
    c: &mut Client,
    mut req: pb::ListSessionsRequest,
) -> Result<Vec<pb::SessionInfo>> {
    let mut all = Vec::new();
    loop {
        let page = c.list_sessions(req.clone()).await?.into_inner();
        all.extend(page.sessions);
        if page.next_page_token.is_empty() {
            return Ok(all);
        }
        req.page_token = page.next_page_token;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_flags_take_units_or_seconds() {
        assert_eq!(parse_secs("90s"), Ok(90));
        assert_eq!(parse_secs("15m"), Ok(900));
        assert_eq!(parse_secs("2h"), Ok(7200));
        assert_eq!(parse_secs("1d"), Ok(86_400));
        assert_eq!(parse_secs("3600"), Ok(3600));
        assert_eq!(parse_secs("0"), Ok(0));
        // Never shorter than asked.
        assert_eq!(parse_secs("250ms"), Ok(1));
        assert!(parse_secs("soon").unwrap_err().contains("90s"));
    }
}
