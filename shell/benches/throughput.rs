//! How much the daemon costs an agent's output: one turn of N activities through the whole
//! path — the agent's stdout, the parser, the core, one SQLite transaction per batch, the
//! client's stream — against a baseline measured in the same run: the same agent process with
//! its stdout read straight from a pipe (the least any supervisor must do).
//!
//! `cargo bench -p paddock --bench throughput` (release build; `PADDOCK_BENCH_N` activities per
//! turn, default 20,000; `PADDOCK_BENCH_RUNS` runs of each, default 3, the best counted).
//! Prints both times, events per second and the ratio; the ratio is the number to watch.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use paddock_proto::obey::local::v1 as pb;
use pb::local_daemon_service_client::LocalDaemonServiceClient;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_paddock");

fn env_num(k: &str, default: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A script: one turn of `n` narration steps, then the answer.
fn script(n: usize) -> String {
    let mut steps: Vec<serde_json::Value> = (0..n)
        .map(|i| json!({"text": format!("step {i} of the benchmark turn"), "tokens_in": 1, "tokens_out": 1}))
        .collect();
    steps.push(json!({"result": "done"}));
    json!({"turns": [{"steps": steps}]}).to_string()
}

/// The baseline: the scripted agent run directly, its stdout read line by line until the
/// turn's result.
fn baseline(script_path: &Path, root: &Path) -> Duration {
    let t0 = Instant::now();
    let mut child = Command::new(BIN)
        .args(["__scripted-agent", "--script"])
        .arg(script_path)
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the scripted agent");
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", paddock::providers::user_message_line("go")).unwrap();
    let mut lines = 0usize;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        lines += 1;
        if line.contains("\"type\":\"result\"") {
            break;
        }
    }
    let took = t0.elapsed();
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    assert!(lines > 0);
    took
}

/// A daemon (and the runner it started) that goes away with the benchmark, even on a panic.
struct DaemonGuard {
    child: std::process::Child,
    data: std::path::PathBuf,
}

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Ok(pid) = std::fs::read_to_string(self.data.join("runner.sock.pid")) {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

/// The daemon path: a session of the scripted agent, one SendMessage, every activity streamed
/// back (committed before it is sent). Times the turn only (the session is started first).
async fn through_daemon(dir: &Path, script_rel: &str, n: usize) -> Duration {
    let socket = dir.join("run/daemon.sock");
    let data = dir.join("data");
    let daemon = Command::new(BIN)
        .arg("daemon")
        .arg("--socket")
        .arg(&socket)
        .arg("--data-dir")
        .arg(&data)
        .arg("--no-aria-socket")
        .env("HOME", dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the daemon");
    let mut daemon = DaemonGuard {
        child: daemon,
        data: data.clone(),
    };
    let ch = loop {
        if let Ok(ch) = paddock::transport::channel(&socket).await {
            if LocalDaemonServiceClient::new(ch.clone())
                .ping(pb::PingRequest {})
                .await
                .is_ok()
            {
                break ch;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut c = LocalDaemonServiceClient::new(ch);
    let camp = c
        .add_campaign(pb::AddCampaignRequest {
            name: "bench".into(),
            root_path: dir.join("project").display().to_string(),
        })
        .await
        .unwrap()
        .into_inner();
    let s = c
        .create_session(pb::CreateSessionRequest {
            campaign_id: camp.id,
            provider: pb::SessionProvider::Scripted as i32,
            provider_config: [("script".to_string(), script_rel.to_string())]
                .into_iter()
                .collect(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let t0 = Instant::now();
    let mut stream = c
        .send_message(pb::SendMessageRequest {
            session_id: s.id.clone(),
            message: "go".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut got = 0usize;
    let mut last = None;
    while let Some(ev) = stream.message().await.unwrap() {
        got += 1;
        let end = ev.r#type == pb::ActivityType::Completion as i32;
        last = Some(ev);
        if end {
            break;
        }
    }
    if got != n + 1 {
        eprintln!("last event: {last:?}");
    }
    let took = t0.elapsed();
    assert_eq!(got, n + 1, "every activity and the answer");
    let _ = c
        .shutdown(pb::ShutdownRequest {
            ..Default::default()
        })
        .await;
    let _ = daemon.child.wait();
    took
}

fn main() {
    let n = env_num("PADDOCK_BENCH_N", 20_000);
    let runs = env_num("PADDOCK_BENCH_RUNS", 3).max(1);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut best_base = Duration::MAX;
    let mut best_daemon = Duration::MAX;
    for _ in 0..runs {
        let tmp = tempfile::Builder::new()
            .prefix("pdk-bench-")
            .tempdir()
            .unwrap();
        let dir = std::fs::canonicalize(tmp.path()).unwrap();
        let root = dir.join("project");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("bench.json"), script(n)).unwrap();
        best_base = best_base.min(baseline(&root.join("bench.json"), &root));
        best_daemon = best_daemon.min(rt.block_on(through_daemon(&dir, "bench.json", n)));
    }
    let per_sec = |d: Duration| (n as f64 + 1.0) / d.as_secs_f64();
    println!("throughput: one turn of {n} activities, best of {runs}");
    println!(
        "  baseline (agent → pipe):            {:>8.1} ms  {:>10.0} events/s",
        best_base.as_secs_f64() * 1e3,
        per_sec(best_base)
    );
    println!(
        "  daemon (agent → core → SQLite → client): {:>8.1} ms  {:>10.0} events/s",
        best_daemon.as_secs_f64() * 1e3,
        per_sec(best_daemon)
    );
    println!(
        "  ratio daemon / baseline: {:.2}",
        best_daemon.as_secs_f64() / best_base.as_secs_f64()
    );
}
