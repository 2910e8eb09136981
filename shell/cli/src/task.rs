//! `paddock task …`: Aria tasks from the command line.

use clap::Subcommand;
use paddock_core::task::TaskStatus;
use paddock_proto::aria::v1 as pb;
use pb::task_service_client::TaskServiceClient;
use serde_json::json;
use tokio_stream::StreamExt;

use super::view::{age, one_line, rfc3339, table};
use super::{client, Ctx, Result};

#[derive(Subcommand, Debug)]
pub enum TaskCmd {
    /// Launch a command as a task: `paddock task launch [--session ID] -- make test`
    Launch {
        /// Bind the task to a session (its name, id or a unique part of the id); it runs in the
        /// session's working dir
        #[arg(long)]
        session: Option<String>,
        /// How long before the task is killed: 90s, 30m, 2h, or seconds (0 = none)
        #[arg(long, default_value = "0", value_parser = super::parse_secs)]
        timeout: u64,
        /// Environment, KEY=VALUE (repeatable)
        #[arg(long = "env", value_parser = super::parse_kv)]
        env: Vec<(String, String)>,
        /// Run it in this Aria container (ContainerService; its type is then container:exec)
        #[arg(long)]
        container: Option<String>,
        /// Aria's task type [default: command, or container:exec with --container]
        #[arg(long = "type", default_value = "")]
        kind: String,
        /// The command and its arguments
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// List tasks, newest first
    List {
        /// Only this session's tasks (its name, id or a unique part of the id)
        #[arg(long)]
        session: Option<String>,
        /// At most this many (the daemon answers at most 1000)
        #[arg(long, default_value_t = 100)]
        limit: i32,
    },
    /// Show a task (its id, or a unique part of it)
    Get { id: String },
    /// Print a task's output (with -f: then follow it until it ends); the id or a unique part
    Logs {
        id: String,
        #[arg(short, long)]
        follow: bool,
    },
    /// Cancel a pending or running task (its id, or a unique part of it)
    Cancel { id: String },
}

fn status_name(n: i32) -> &'static str {
    TaskStatus::from_number(n)
        .map(|s| s.name())
        .unwrap_or("UNSPECIFIED")
}

fn task_json(t: &pb::Task) -> serde_json::Value {
    let ts = |t: &Option<prost_types::Timestamp>| t.as_ref().map(|t| rfc3339(t.seconds, t.nanos));
    json!({
        "id": t.id, "session_id": t.session_id, "type": t.r#type, "command_json": t.command_json,
        "status": status_name(t.status), "exit_code": t.exit_code, "error_message": t.error_message,
        "timeout_seconds": t.timeout_seconds, "progress_percent": t.progress_percent,
        "current_operation": t.current_operation, "created_at": ts(&t.created_at),
        "started_at": ts(&t.started_at), "completed_at": ts(&t.completed_at),
    })
}

/// A task's command line as a shell would show it.
fn command_line(command_json: &str) -> String {
    match serde_json::from_str::<Vec<String>>(command_json) {
        Ok(argv) => {
            shlex::try_join(argv.iter().map(String::as_str)).unwrap_or_else(|_| argv.join(" "))
        }
        Err(_) => command_json.to_string(),
    }
}

/// Accepts a task's full id or a unique part of it (its start, its start after `task_`, or
/// its end: what a narrow table shows).
async fn resolve(c: &mut TaskServiceClient<client::Conn>, id: &str) -> Result<String> {
    let tasks = c
        .list_tasks(pb::ListTasksRequest {
            session_id: String::new(),
            limit: 1000,
        })
        .await?
        .into_inner()
        .tasks;
    if tasks.iter().any(|t| t.id == id) {
        return Ok(id.to_string());
    }
    match super::by_part(&tasks, |t| &t.id, id, "task_", "tasks")? {
        Some(one) => Ok(one.id.clone()),
        None => Ok(id.to_string()), // the daemon says it is not found
    }
}

pub async fn run(ctx: &Ctx, cmd: TaskCmd) -> Result<()> {
    // Connect through the same autostart path as every other command.
    let channel = client::connect_channel(ctx).await?;
    let mut c = TaskServiceClient::new(channel.clone());
    match cmd {
        TaskCmd::Launch {
            session,
            timeout,
            env,
            container,
            kind,
            command,
        } => {
            // A session's name or a unique part of its id, as everywhere.
            let session_id = match session {
                Some(s) => super::resolve(&mut client::client_of(channel), &s).await?,
                None => String::new(),
            };
            let req = pb::LaunchTaskRequest {
                session_id,
                r#type: kind,
                command_json: serde_json::to_string(&command).expect("json"),
                environment: env.into_iter().collect(),
                timeout_seconds: i32::try_from(timeout).map_err(|_| {
                    super::Error::Usage(format!("a timeout of {timeout} s is too long"))
                })?,
                container_id: container.unwrap_or_default(),
                parent_task_id: String::new(),
            };
            let id = c.launch_task(req).await?.into_inner().task_id;
            if ctx.json {
                outln!("{}", json!({ "task_id": id }))?;
            } else {
                outln!("{id}")?;
            }
        }
        TaskCmd::List { session, limit } => {
            let session_id = match session {
                Some(s) => super::resolve(&mut client::client_of(channel), &s).await?,
                None => String::new(),
            };
            let r = c
                .list_tasks(pb::ListTasksRequest { session_id, limit })
                .await?
                .into_inner();
            if ctx.json {
                let tasks: Vec<serde_json::Value> = r.tasks.iter().map(task_json).collect();
                outln!("{}", json!({ "tasks": tasks, "truncated": r.truncated }))?;
                return Ok(());
            }
            let now = crate::paths::now_ms();
            let rows: Vec<Vec<String>> = r
                .tasks
                .iter()
                .map(|t| {
                    vec![
                        t.id.clone(),
                        if t.session_id.is_empty() {
                            "-".into()
                        } else {
                            t.session_id.clone()
                        },
                        status_name(t.status).to_string(),
                        t.exit_code.map_or("-".into(), |c| c.to_string()),
                        age(&t.created_at, now),
                        one_line(&command_line(&t.command_json), 60),
                    ]
                })
                .collect();
            outln!(
                "{}",
                table(
                    &["ID", "SESSION", "STATUS", "EXIT", "AGE", "COMMAND"],
                    &rows
                )
            )?;
            if r.truncated {
                eprintln!("(more tasks: --limit)");
            }
        }
        TaskCmd::Get { id } => {
            let id = resolve(&mut c, &id).await?;
            let t = c
                .get_task(pb::GetTaskRequest { task_id: id })
                .await?
                .into_inner();
            let v = task_json(&t);
            if ctx.json {
                outln!("{}", serde_json::to_string_pretty(&v).expect("json"))?;
            } else {
                let rows: Vec<Vec<String>> = v
                    .as_object()
                    .expect("object")
                    .iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| {
                        vec![
                            k.clone(),
                            v.as_str()
                                .map(str::to_string)
                                .unwrap_or_else(|| v.to_string()),
                        ]
                    })
                    .collect();
                outln!("{}", table(&["FIELD", "VALUE"], &rows))?;
            }
        }
        TaskCmd::Logs { id, follow } => {
            let id = resolve(&mut c, &id).await?;
            print_output(&mut c, id, follow, true).await?;
        }
        TaskCmd::Cancel { id } => {
            let id = resolve(&mut c, &id).await?;
            let initiated = c
                .cancel_task(pb::CancelTaskRequest { task_id: id })
                .await?
                .into_inner()
                .cancellation_initiated;
            if ctx.json {
                outln!("{}", json!({ "cancellation_initiated": initiated }))?;
            } else if initiated {
                outln!("cancelling")?;
            } else {
                outln!("the task had already ended")?;
            }
        }
    }
    Ok(())
}

/// Prints task `id`'s output, stdout lines on stdout and stderr lines on stderr (progress
/// reports there too when `progress`), following it until the task ends when `follow`.
async fn print_output(
    c: &mut TaskServiceClient<client::Conn>,
    id: String,
    follow: bool,
    progress: bool,
) -> Result<()> {
    let mut stream = c
        .stream_task_output(pb::StreamTaskOutputRequest {
            task_id: id,
            follow,
        })
        .await?
        .into_inner();
    use pb::task_output::Output;
    while let Some(item) = stream.next().await {
        match item?.output {
            Some(Output::StdoutLine(l)) => outln!("{l}")?,
            Some(Output::StderrLine(l)) => eprintln!("{l}"),
            Some(Output::Progress(p)) if progress => {
                eprintln!("[{:>5.1}%] {}", p.percent_complete, p.operation_description)
            }
            Some(Output::Progress(_)) | None => {}
        }
    }
    Ok(())
}

/// `session exec ID -- cmd…`: runs `command` as a task of the session, in its environment (in
/// its sandbox, in its worktree), prints its output as it comes and exits with its exit code.
pub async fn exec(ctx: &Ctx, session_id: String, command: Vec<String>) -> Result<()> {
    let channel = client::connect_channel(ctx).await?;
    let mut c = TaskServiceClient::new(channel);
    // Ctrl-C ends the command, not only this client: listening before it starts.
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(super::Error::io("SIGINT"))?;
    let id = c
        .launch_task(pb::LaunchTaskRequest {
            session_id,
            r#type: paddock_core::task::COMMAND_KIND.to_string(),
            command_json: serde_json::to_string(&command).expect("json"),
            environment: Default::default(),
            timeout_seconds: 0,
            ..Default::default()
        })
        .await?
        .into_inner()
        .task_id;
    let mut follow = c.clone();
    tokio::select! {
        r = print_output(&mut follow, id.clone(), true, false) => r?,
        _ = interrupt.recv() => {
            c.cancel_task(pb::CancelTaskRequest { task_id: id.clone() }).await?;
            eprintln!("interrupted: the command was cancelled");
            std::process::exit(130);
        }
    }
    let t = c
        .get_task(pb::GetTaskRequest { task_id: id })
        .await?
        .into_inner();
    let code = match (TaskStatus::from_number(t.status), t.exit_code) {
        (Some(TaskStatus::Completed), _) => 0,
        (_, Some(code)) if code != 0 => code,
        _ => {
            eprintln!(
                "error: {} ({})",
                t.error_message.as_deref().unwrap_or("the command failed"),
                status_name(t.status)
            );
            1
        }
    };
    if code != 0 {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        std::process::exit(code);
    }
    Ok(())
}
