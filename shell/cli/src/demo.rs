//! `paddock demo`: a whole session of the built-in scripted agent, live, in one command.
//!
//! Nothing is faked: a real daemon starts on a fresh socket and data dir, a campaign is
//! registered on a small sample project, a real agent process answers over the same line
//! protocol as Claude Code, every event goes through SQLite before it is shown, and at the end
//! the session is stopped and the daemon shut down.

use std::path::Path;
use std::time::Duration;

use paddock_core::Provider;
use paddock_proto::obey::local::v1 as pb;
use tokio_stream::StreamExt;

use super::output::*;
use super::view::*;
use super::{Ctx, Error, Result};
use crate::transport::conn;

pub async fn run(_ctx: &Ctx, message: &str) -> Result<()> {
    demo(message).await
}

fn sample_project(root: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(root.join("src"))?;
    std::fs::write(
        root.join("README.md"),
        "# sample\nA tiny project for the paddock demo.\n",
    )?;
    std::fs::write(
        root.join("Cargo.toml"),
        "[package]\nname = \"sample\"\nversion = \"0.1.0\"\n",
    )?;
    std::fs::write(root.join("src/main.rs"), "fn main() { outln!(\"hi\"); }\n")?;
    Ok(())
}

async fn demo(message: &str) -> Result<()> {
    let base = std::env::temp_dir().join(format!("paddock-demo-{}", std::process::id()));
    let socket = base.join("daemon.sock");
    let data = base.join("data");
    let project = base.join("sample-project");
    sample_project(&project).map_err(Error::io(format!(
        "cannot write the sample project in {}",
        project.display()
    )))?;

    outln!("▶ starting a paddock daemon on {}", socket.display())?;
    let exe = std::env::current_exe().map_err(Error::io("this program's path"))?;
    let mut daemon = tokio::process::Command::new(exe)
        .args(["daemon", "--socket"])
        .arg(&socket)
        .arg("--data-dir")
        .arg(&data)
        .env("PADDOCK_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .map_err(Error::io("cannot start the daemon"))?;
    let result = session(&socket, &project, message).await;
    // Shut the daemon down whatever happened, and wait for it.
    if let Ok(ch) = conn(&socket).await {
        let mut c = super::client::client_of(ch);
        let _ = c.shutdown(pb::ShutdownRequest { force: false }).await;
    }
    match tokio::time::timeout(Duration::from_secs(20), daemon.wait()).await {
        Ok(Ok(status)) => outln!("▶ daemon exited ({status})")?,
        _ => {
            let _ = daemon.kill().await;
        }
    }
    outln!(
        "▶ the session's database is kept at {}",
        data.join("paddock.db").display()
    )?;
    result
}

async fn session(socket: &Path, project: &Path, message: &str) -> Result<()> {
    let mut waited = 0;
    let ch = loop {
        match conn(socket).await {
            Ok(ch) => break ch,
            Err(e) if waited > 200 => return Err(Error::NoDaemon(e)),
            Err(_) => {
                waited += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let mut c = super::client::client_of(ch);
    let camp = c
        .add_campaign(pb::AddCampaignRequest {
            name: "demo".into(),
            root_path: project.display().to_string(),
        })
        .await?
        .into_inner();
    outln!("▶ campaign \"{}\" → {}", camp.name, camp.root_path)?;

    // Watch every status change of every session, in the background.
    let mut watch = c
        .watch_all_sessions(pb::WatchAllSessionsRequest::default())
        .await?
        .into_inner();
    // Status changes and activity come on two streams; a turn's end (WORKING → …) is printed
    // once the turn's own stream has ended, so the output reads in the order things happened.
    let (status_tx, mut statuses) = tokio::sync::mpsc::unbounded_channel();
    let watcher = tokio::spawn(async move {
        while let Some(Ok(e)) = watch.next().await {
            if status_tx.send(e).is_err() {
                break;
            }
        }
    });
    let print_status = |e: &pb::SessionStatusEvent| {
        outln!(
            "  status  {:>9} → {:<9} {}",
            status_name(e.previous_status),
            status_name(e.new_status),
            e.message
        )
    };

    let s = c
        .create_session(pb::CreateSessionRequest {
            campaign_id: "demo".into(),
            provider: Provider::Scripted.number(),
            agent_name: "demo-agent".into(),
            max_tokens: 100_000,
            ..Default::default()
        })
        .await?
        .into_inner()
        .session
        .unwrap_or_default();
    while let Ok(e) = statuses.try_recv() {
        print_status(&e)?;
    }
    outln!("▶ session {} created (pid {})", s.id, s.pid)?;

    outln!("▶ you: {message}")?;
    let mut stream = c
        .send_message(pb::SendMessageRequest {
            session_id: s.id.clone(),
            message: message.to_string(),
        })
        .await?
        .into_inner();
    let mut held = Vec::new();
    loop {
        tokio::select! {
            item = stream.next() => match item {
                Some(item) => {
                    let a = item?;
                    outln!("  agent   {}", activity_line(&a))?;
                }
                None => break,
            },
            Some(e) = statuses.recv() => {
                if e.previous_status == paddock_core::Status::Working.number() {
                    held.push(e);
                } else {
                    print_status(&e)?;
                }
            }
        }
    }
    // The turn's end, now that its stream has ended (it may still be on its way).
    if held.is_empty() {
        if let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(500), statuses.recv()).await
        {
            held.push(e);
        }
    }
    for e in held.drain(..) {
        print_status(&e)?;
    }

    let stopped = c
        .stop_session(pb::StopSessionRequest {
            session_id: s.id.clone(),
            graceful: true,
        })
        .await?
        .into_inner()
        .session
        .unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(100)).await;
    while let Ok(e) = statuses.try_recv() {
        print_status(&e)?;
    }
    watcher.abort();
    outln!(
        "▶ session {} is {}: {} input + {} output tokens, {} activities stored",
        stopped.id,
        status_name(stopped.status),
        stopped.tokens_input,
        stopped.tokens_output,
        c.list_activities(pb::ListActivitiesRequest {
            session_id: stopped.id.clone(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().activities.len())
        .unwrap_or(0)
    )?;
    Ok(())
}
