//! Issue 16's performance targets, each measured against its baseline in the same run, printed
//! as one table: measure, baseline, paddock, ratio, target, met.
//!
//! ```text
//! cargo bench -p paddock --bench targets                        # the full set (≈2–3 min)
//! PADDOCK_BENCH_SHORT=1 cargo bench -p paddock --bench targets  # CI's short form (≈25 s)
//! ```
//!
//! | #  | paddock | baseline | target |
//! |----|---------|----------|--------|
//! | P1 | a real Claude Code turn through the daemon | the same CLI run directly | ≤ 1.02× |
//! | P2 | N events agent → runner → parser → core → SQLite → gRPC client | the same agent's bytes through the daemon's parser in a bare loop (and, for reference, through a `serde_json::Value` parse) | ≥ 0.5× |
//! | P3 | S sessions in the default mode: daemon + runner RSS; agent write → WatchActivity receive p99 under S × 21 events / 2 s of load | the same probe agents read from a pipe (for scale) | ≤ 100 MiB; ≤ 5 ms |
//! | P4 | `session list` / `session list --all` (the table's first page) on a 10,000-session store | `paddock --version` | ≤ 1.5× |
//! | P5 | daemon start → first Ping on the 10,000 / 1M store | the same on an empty store | ≤ 1.3× (time, RSS) |
//! | P6 | daemon CPU per event at a low rate, 10,000 stopped sessions stored | the same with none | ≤ 1.2× |
//!
//! Knobs: `PADDOCK_BENCH_SHORT=1` (fewer events, sessions and repetitions: P2 100,000 events,
//! P3 100 sessions), `PADDOCK_BENCH_P2_EVENTS`, `PADDOCK_BENCH_P3_SESSIONS`,
//! `PADDOCK_BENCH_REPS` (P2's turns and P6's runs, at least 3 each), `PADDOCK_BENCH_ONLY=P3,P5`
//! (only those rows), `PADDOCK_BENCH_KEEP_STORE=1` (keep the 10,000-session store and print
//! where, to profile a daemon on it). P1 runs only when
//! `tests/npm/node_modules/.bin/claude` exists (`cd tests/npm && npm ci`), otherwise its row
//! says why it was skipped.
//!
//! Exit status: 1 when a figure is more than 2× off its target (≥ 0.5× measured below 0.25×,
//! ≤ 1.5× measured above 3×, ≤ 5 ms above 10 ms): a missed target within 2× is printed as "no"
//! and is not a failure, so the noise of a shared machine does not fail CI where a figure is
//! well inside that margin; a figure that sits near it (see README's table) can.
//!
//! The agents are this bench binary itself (`--bench-agent <mode>`, given to the daemon as a
//! claude-code session's `command`): it speaks Claude Code's stream-json, so the daemon reads it
//! with the parser it reads Claude Code with.
//!
//! The 10,000-session / 1M-activity store is built in seconds, not by running 10,000 turns: one
//! daemon runs one real session (a 100-step turn with two lines no parser reads, a task run in
//! it, then a graceful stop) and shuts down; then one SQL transaction copies that session's
//! rows — in every table keyed by session — 9,999 times under new ids (`INSERT … SELECT` over a
//! counter, every other column as stored). So every row is one the daemon wrote itself, the
//! schema is whatever the migrations made, and the store holds 10,000 stopped sessions,
//! ≈1,010,000 activities, 10,000 ended tasks and 20,000 unrecognized lines: a history that
//! start-up (P5) and the loop (P6) must not pay for.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use paddock::providers::claude_stream::ClaudeStreamParser;
use paddock_proto::aria::v1 as aria;
use paddock_proto::obey::local::v1 as pb;
use pb::local_daemon_service_client::LocalDaemonServiceClient;
use serde_json::json;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_paddock");
type Client = LocalDaemonServiceClient<Channel>;

// ── the fake agent ─────────────────────────────────────────────────────────────────────────

/// One stream-json assistant line with text `text` (the shape Claude Code and the scripted
/// agent print).
fn assistant_line(i: u64, text: &str) -> String {
    json!({"type": "assistant", "message": {"id": format!("msg_bench_{i}"), "type": "message",
        "role": "assistant", "model": "bench", "content": [{"type": "text", "text": text}],
        "stop_reason": null, "usage": {"input_tokens": 1, "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0, "output_tokens": 1}},
        "parent_tool_use_id": null, "session_id": "bench"})
    .to_string()
}

/// [`assistant_line`]`(i, "ts=<ts>")` and a newline, appended to `out` without building a
/// `serde_json::Value` (the same fields; a paced agent writes one every few milliseconds).
fn paced_line(out: &mut String, i: u64, ts: u128) {
    use std::fmt::Write as _;
    writeln!(
        out,
        "{{\"type\":\"assistant\",\"message\":{{\"id\":\"msg_bench_{i}\",\"type\":\"message\",\
         \"role\":\"assistant\",\"model\":\"bench\",\"content\":[{{\"type\":\"text\",\
         \"text\":\"ts={ts}\"}}],\"stop_reason\":null,\"usage\":{{\"input_tokens\":1,\
         \"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}},\
         \"parent_tool_use_id\":null,\"session_id\":\"bench\"}}"
    )
    .expect("a String takes every write");
}

fn init_line() -> String {
    json!({"type": "system", "subtype": "init", "cwd": "/", "session_id": "bench",
        "tools": [], "mcp_servers": [], "model": "bench", "permissionMode": "default",
        "apiKeySource": "none"})
    .to_string()
}

fn result_line(n: u64) -> String {
    json!({"type": "result", "subtype": "success", "is_error": false, "duration_ms": 0,
        "duration_api_ms": 0, "num_turns": n, "result": "done", "session_id": "bench",
        "total_cost_usd": 0.0, "usage": {"input_tokens": n, "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0, "output_tokens": n}})
    .to_string()
}

fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// `--bench-agent <mode> …`: answers every user message on stdin with one turn.
/// - `cat FILE`: the file's bytes, verbatim (a turn prepared in advance: P2);
/// - `paced N MS [spread]`: N lines `ts=<wall-clock ns at the write>`, MS apart, then the
///   result (P3, P6); `spread` first waits a random part of MS, as an agent of its own would
///   (P3's load: a thousand agents started together would otherwise write in lockstep);
/// - `tiny`: one line and the result.
///
/// It answers paddock's ready request at once, ignores the claude flags the daemon appends,
/// and ends at EOF on stdin.
fn agent(args: &[String]) -> ! {
    let mode = args.first().map(String::as_str).unwrap_or("tiny");
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut turn = 0u64;
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        // paddock's ready request (the first line every agent reads): ready at once.
        if let paddock::providers::stream_json::AgentInput::Control { request_id, .. } =
            paddock::providers::stream_json::AgentInput::read(&line)
        {
            let answer = paddock::providers::stream_json::ready_response(&request_id);
            writeln!(out, "{answer}").unwrap();
            out.flush().unwrap();
            continue;
        }
        if !line.contains("\"type\":\"user\"") {
            continue;
        }
        turn += 1;
        match mode {
            "cat" => {
                let mut f = std::fs::File::open(&args[1]).expect("the turn file");
                std::io::copy(&mut f, &mut out).expect("write the turn");
            }
            "paced" => {
                let n: u64 = args[1].parse().unwrap_or(1);
                let ms: u64 = args[2].parse().unwrap_or(0);
                writeln!(out, "{}", init_line()).unwrap();
                if args.get(3).map(String::as_str) == Some("spread") && ms > 0 {
                    // An independent agent's own phase: its first line at a random point of
                    // its period, so that S agents together write evenly, not S at once.
                    let phase = (wall_ns() ^ (u128::from(std::process::id()) * 0x9E37_79B9))
                        % u128::from(ms * 1000);
                    std::thread::sleep(Duration::from_micros(phase as u64));
                }
                // The load's own cost is kept small (P3 runs a thousand of these on the cores
                // paddock has): each line is written into one buffer, and written at once.
                let mut l = String::new();
                for i in 0..n {
                    if ms > 0 {
                        std::thread::sleep(Duration::from_millis(ms));
                    }
                    l.clear();
                    paced_line(&mut l, turn * 1_000_000 + i, wall_ns());
                    out.write_all(l.as_bytes()).unwrap();
                    out.flush().unwrap();
                }
                writeln!(out, "{}", result_line(n)).unwrap();
            }
            _ => {
                writeln!(out, "{}", init_line()).unwrap();
                writeln!(out, "{}", assistant_line(turn, "hello")).unwrap();
                writeln!(out, "{}", result_line(1)).unwrap();
            }
        }
        out.flush().unwrap();
    }
    std::process::exit(0)
}

/// The fake agent in `mode`, started directly (a baseline), already sent one user message;
/// its stdin is returned too (dropping it ends the agent).
fn agent_process(mode: &[&str]) -> (Child, std::process::ChildStdin) {
    let mut child = Command::new(std::env::current_exe().expect("the bench binary"))
        .arg("--bench-agent")
        .args(mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the fake agent");
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", paddock::providers::user_message_line("go")).unwrap();
    (child, stdin)
}

/// The command line of a fake agent session (`provider_config.command`).
fn agent_command(mode: &[&str]) -> String {
    let exe = std::env::current_exe().expect("the bench binary");
    let mut parts = vec![exe.display().to_string(), "--bench-agent".into()];
    parts.extend(mode.iter().map(|s| s.to_string()));
    shlex::try_join(parts.iter().map(String::as_str)).expect("a command line")
}

/// One turn: `text` sent to session `id`, its activities read until the one that ends it;
/// how many arrived.
async fn turn(mut c: Client, id: String, text: &str) -> Result<u64, tonic::Status> {
    let mut stream = c
        .send_message(pb::SendMessageRequest {
            session_id: id,
            message: text.into(),
        })
        .await?
        .into_inner();
    let mut got = 0;
    while let Some(ev) = stream.message().await? {
        got += 1;
        if ev.r#type == pb::ActivityType::Completion as i32 {
            break;
        }
    }
    Ok(got)
}

// ── a daemon on a directory of its own ─────────────────────────────────────────────────────

struct Daemon {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
    /// Spawn → first Ping answered.
    ready_after: Duration,
}

fn env_of(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    vec![
        ("HOME", dir.join("home")),
        ("XDG_RUNTIME_DIR", dir.join("xdg")),
        ("XDG_CONFIG_HOME", dir.join("home/.config")),
    ]
}

impl Daemon {
    async fn start(dir: &Path, extra: &[&str]) -> Daemon {
        for (_, p) in env_of(dir) {
            std::fs::create_dir_all(&p).unwrap();
        }
        let socket = dir.join("run/daemon.sock");
        let mut cmd = Command::new(BIN);
        cmd.arg("daemon")
            .arg("--socket")
            .arg(&socket)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--no-aria-socket")
            .args(extra)
            .envs(env_of(dir))
            // The fake agents are claude-code sessions: a key makes them creatable (no model
            // is ever called).
            .env("ANTHROPIC_API_KEY", "bench-not-a-key")
            .env_remove("PADDOCK_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let t0 = Instant::now();
        let child = cmd.spawn().expect("spawn the daemon");
        let mut d = Daemon {
            child,
            dir: dir.to_path_buf(),
            socket,
            ready_after: Duration::ZERO,
        };
        let deadline = t0 + Duration::from_secs(60);
        loop {
            if d.socket.exists() {
                if let Ok(ch) = paddock::transport::channel(&d.socket).await {
                    if Client::new(ch).ping(pb::PingRequest {}).await.is_ok() {
                        break;
                    }
                }
            }
            assert!(Instant::now() < deadline, "the daemon did not answer");
            if let Ok(Some(st)) = d.child.try_wait() {
                panic!("the daemon exited at start: {st}");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        d.ready_after = t0.elapsed();
        d
    }

    async fn client(&self) -> Client {
        Client::new(paddock::transport::channel(&self.socket).await.unwrap())
            .max_decoding_message_size(64 << 20)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn runner_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("data/runner.sock.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    async fn campaign(&self) -> String {
        let root = self.dir.join("project");
        std::fs::create_dir_all(&root).unwrap();
        let r = self
            .client()
            .await
            .add_campaign(pb::AddCampaignRequest {
                name: format!("bench-{}", wall_ns()),
                root_path: root.display().to_string(),
            })
            .await
            .unwrap()
            .into_inner();
        r.id
    }

    /// A claude-code session whose agent is this binary in `mode`.
    async fn agent_session(&self, c: &mut Client, campaign: &str, mode: &[&str]) -> String {
        let s = c
            .create_session(pb::CreateSessionRequest {
                campaign_id: campaign.into(),
                provider: pb::SessionProvider::ClaudeCode as i32,
                provider_config: [("command".to_string(), agent_command(mode))]
                    .into_iter()
                    .collect(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("create a {mode:?} session: {e:?}"))
            .into_inner()
            .session
            .unwrap();
        s.id
    }

    /// A clean shutdown, waiting until the daemon and its runner are gone (the next daemon on
    /// this directory must not find the old runner still stopping).
    async fn stop(mut self) {
        let runner = self.runner_pid();
        let _ = self
            .client()
            .await
            .shutdown(pb::ShutdownRequest { force: true })
            .await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(pid) = runner {
            let deadline = Instant::now() + Duration::from_secs(15);
            while alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            kill(pid);
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A panic mid-bench leaves nothing running (a clean stop has already reaped both).
        if let Some(pid) = self.runner_pid() {
            kill(pid);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
}

fn kill(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// CPU time of a process, in nanoseconds: the sum of its threads' run time
/// (`/proc/PID/task/*/schedstat`, exact where `/proc/PID/stat`'s ticks are 10 ms). A thread that
/// ends between two readings takes its time with it; the daemon's threads (tokio's workers, the
/// checkpointer) live as long as it does, so over a measurement this loses nothing.
fn cpu(pid: u32) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Duration::ZERO;
    };
    let ns: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

/// Resident memory in MiB (0 when the process is gone).
fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}

fn tempdir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("pdk-targets-{name}-"))
        .tempdir()
        .unwrap()
}

// ── the table ──────────────────────────────────────────────────────────────────────────────

#[derive(Clone, Copy)]
enum Target {
    /// paddock ÷ baseline at most this.
    RatioMax(f64),
    /// paddock ÷ baseline (a throughput) at least this.
    RatioMin(f64),
    /// The paddock figure itself at most this (an absolute bound, in the row's unit).
    ValueMax(f64),
    /// None: a row for reference, shown beside a target's row (never "met", never a failure).
    Reference,
}

struct Row {
    id: &'static str,
    measure: String,
    baseline: String,
    paddock: String,
    ratio: Option<f64>,
    /// The figure compared with the target (the ratio, or the paddock value).
    value: f64,
    target: Target,
    skipped: Option<String>,
}

impl Row {
    fn ratio(
        id: &'static str,
        measure: impl Into<String>,
        (base, unit): (f64, &str),
        paddock: f64,
        target: Target,
    ) -> Row {
        let ratio = paddock / base;
        Row {
            id,
            measure: measure.into(),
            baseline: format!("{base:.2} {unit}"),
            paddock: format!("{paddock:.2} {unit}"),
            ratio: Some(ratio),
            value: ratio,
            target,
            skipped: None,
        }
    }

    /// Interleaved pairs (`base[i]` and `paddock[i]` ran one after the other, under the same
    /// load): the medians of each, and the median of the pairwise ratios as the ratio.
    fn paired(
        id: &'static str,
        measure: impl Into<String>,
        unit: &str,
        mut base: Vec<f64>,
        mut paddock: Vec<f64>,
        target: Target,
    ) -> Row {
        let mut ratios: Vec<f64> = paddock.iter().zip(&base).map(|(p, b)| p / b).collect();
        let mut row = Row::ratio(
            id,
            measure,
            (median(&mut base), unit),
            median(&mut paddock),
            target,
        );
        let r = median(&mut ratios);
        row.ratio = Some(r);
        row.value = r;
        row
    }

    fn skipped(id: &'static str, measure: &str, target: Target, why: String) -> Row {
        Row {
            id,
            measure: measure.into(),
            baseline: "-".into(),
            paddock: "-".into(),
            ratio: None,
            value: f64::NAN,
            target,
            skipped: Some(why),
        }
    }

    fn met(&self) -> Option<bool> {
        if self.skipped.is_some() || self.value.is_nan() {
            return None;
        }
        Some(match self.target {
            Target::RatioMax(t) | Target::ValueMax(t) => self.value <= t,
            Target::RatioMin(t) => self.value >= t,
            Target::Reference => return None,
        })
    }

    /// More than 2× off the target: what fails CI (noise never does).
    fn far_off(&self) -> bool {
        if self.skipped.is_some() || self.value.is_nan() {
            return false;
        }
        match self.target {
            Target::RatioMax(t) | Target::ValueMax(t) => self.value > 2.0 * t,
            Target::RatioMin(t) => self.value < t / 2.0,
            Target::Reference => false,
        }
    }

    fn target_text(&self) -> String {
        match self.target {
            Target::RatioMax(t) => format!("≤ {t}×"),
            Target::RatioMin(t) => format!("≥ {t}×"),
            Target::ValueMax(t) => {
                let unit = self.paddock.split_whitespace().nth(1).unwrap_or("");
                format!("≤ {t} {unit}")
            }
            Target::Reference => "-".into(),
        }
    }
}

fn print_table(rows: &[Row]) {
    let head = [
        "#", "measure", "baseline", "paddock", "ratio", "target", "met",
    ];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            let met = match (&r.skipped, r.met()) {
                (Some(why), _) => format!("skipped: {why}"),
                (None, Some(true)) => "yes".into(),
                (None, Some(false)) if r.far_off() => "NO (>2× off)".into(),
                (None, Some(false)) => "no".into(),
                (None, None) => "-".into(),
            };
            [
                r.id.into(),
                r.measure.clone(),
                r.baseline.clone(),
                r.paddock.clone(),
                r.ratio.map_or("-".into(), |x| format!("{x:.2}×")),
                r.target_text(),
                met,
            ]
        })
        .collect();
    println!("| {} |", head.join(" | "));
    println!(
        "|{}|",
        head.iter().map(|_| "---").collect::<Vec<_>>().join("|")
    );
    for c in cells {
        println!("| {} |", c.join(" | "));
    }
}

// ── settings ───────────────────────────────────────────────────────────────────────────────

struct Settings {
    short: bool,
    /// `PADDOCK_BENCH_ONLY=P3,P5`: only these rows (for working on one target).
    only: Option<Vec<String>>,
    p2_events: u64,
    p3_sessions: usize,
    reps: usize,
}

fn env_num(k: &str) -> Option<u64> {
    std::env::var(k).ok()?.parse().ok()
}

impl Settings {
    fn runs(&self, id: &str) -> bool {
        self.only.as_ref().is_none_or(|o| o.iter().any(|p| p == id))
    }

    fn read() -> Settings {
        let short = std::env::var("PADDOCK_BENCH_SHORT").is_ok_and(|v| !v.is_empty() && v != "0");
        Settings {
            short,
            only: std::env::var("PADDOCK_BENCH_ONLY").ok().map(|v| {
                v.split(',')
                    .map(|p| p.trim().to_ascii_uppercase())
                    .filter(|p| !p.is_empty())
                    .collect()
            }),
            p2_events: env_num("PADDOCK_BENCH_P2_EVENTS").unwrap_or(if short {
                100_000
            } else {
                1_000_000
            }),
            p3_sessions: env_num("PADDOCK_BENCH_P3_SESSIONS")
                .map_or(if short { 100 } else { 1_000 }, |n| n as usize),
            reps: env_num("PADDOCK_BENCH_REPS")
                .map_or(if short { 1 } else { 3 }, |n| (n as usize).max(1)),
        }
    }
}

// ── the 10,000-session store ───────────────────────────────────────────────────────────────

/// Sessions and activities of the big store.
const STORE_SESSIONS: u64 = 10_000;
const STORE_STEPS: usize = 100;

/// Builds `<dir>/data` holding 10,000 stopped sessions of 101 activities each (see the
/// module's documentation); returns how long it took.
async fn build_store(dir: &Path) -> Duration {
    let t0 = Instant::now();
    let d = Daemon::start(dir, &[]).await;
    let camp = d.campaign().await;
    let mut c = d.client().await;
    // With two lines no parser reads (stored raw and counted, as a CLI's warnings are).
    let steps: Vec<serde_json::Value> = (0..STORE_STEPS)
        .map(|i| json!({"text": format!("step {i} of a stored turn"), "tokens_in": 1, "tokens_out": 1}))
        .chain([
            json!({"raw": "npm warn: a line no parser reads"}),
            json!({"raw": "(node) another"}),
            json!({"result": "done"}),
        ])
        .collect();
    std::fs::write(
        dir.join("project/store.json"),
        json!({"turns": [{"steps": steps}]}).to_string(),
    )
    .unwrap();
    let s = c
        .create_session(pb::CreateSessionRequest {
            campaign_id: camp,
            provider: pb::SessionProvider::Scripted as i32,
            provider_config: [("script".to_string(), "store.json".to_string())]
                .into_iter()
                .collect(),
            initial_message: "go".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    // Wait for the turn to end, then stop the session gracefully.
    loop {
        let got = c
            .get_session(pb::GetSessionRequest {
                session_id: s.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        if got.status == pb::SessionStatus::Running as i32 && got.turns_completed > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And a task run in it (Aria's TaskService, on the same socket), to its end.
    let mut tasks = aria::task_service_client::TaskServiceClient::new(
        paddock::transport::channel(&d.socket).await.unwrap(),
    );
    let task = tasks
        .launch_task(aria::LaunchTaskRequest {
            session_id: s.id.clone(),
            command_json: r#"["true"]"#.into(),
            r#type: "command".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .task_id;
    loop {
        let t = tasks
            .get_task(aria::GetTaskRequest {
                task_id: task.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        if t.status == aria::TaskStatus::Completed as i32 {
            break;
        }
        assert!(
            !matches!(
                aria::TaskStatus::try_from(t.status),
                Ok(aria::TaskStatus::Failed
                    | aria::TaskStatus::Cancelled
                    | aria::TaskStatus::Timeout)
            ),
            "the store's task ended {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.stop_session(pb::StopSessionRequest {
        session_id: s.id.clone(),
        graceful: true,
    })
    .await
    .unwrap();
    d.stop().await;

    let db = rusqlite::Connection::open(dir.join("data/paddock.db")).unwrap();
    db.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;")
        .unwrap();
    let tx = db.unchecked_transaction().unwrap();
    // Every table keyed by a session, and the column naming it.
    let keyed: Vec<(String, String)> = {
        let mut st = tx
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
            .unwrap();
        let tables: Vec<String> = st
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        tables
            .into_iter()
            .filter_map(|t| {
                let cols = columns(&tx, &t);
                let key = if t == "agent_sessions" {
                    "id"
                } else {
                    "session_id"
                };
                cols.iter().any(|c| c == key).then(|| (t, key.to_string()))
            })
            .collect()
    };
    tx.execute_batch(&format!(
        "CREATE TEMP TABLE ids AS WITH RECURSIVE k(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM k \
         WHERE n < {}) SELECT n, substr('{id}', 1, length('{id}') - 5) || printf('%05d', n) AS id \
         FROM k WHERE substr('{id}', 1, length('{id}') - 5) || printf('%05d', n) != '{id}' \
         LIMIT {};",
        STORE_SESSIONS,
        STORE_SESSIONS - 1,
        id = s.id
    ))
    .unwrap();
    for (table, key) in &keyed {
        let cols = columns(&tx, table);
        let select: Vec<String> = cols
            .iter()
            .map(|c| {
                if c == key {
                    "ids.id".to_string()
                } else if c == "id" && table == "tasks" {
                    // A task's id is its own key: one per copy.
                    format!("t.{c} || printf('-%05d', ids.n)")
                } else if c == "created_at" && table == "agent_sessions" {
                    // Distinct creation times, as 10,000 real sessions would have.
                    format!("t.{c} - ids.n * 1000")
                } else {
                    format!("t.\"{c}\"")
                }
            })
            .collect();
        let list: Vec<String> = cols.iter().map(|c| format!("\"{c}\"")).collect();
        // An AUTOINCREMENT id column takes new values, and so does a session's key.
        let (list, select): (Vec<String>, Vec<String>) = list
            .into_iter()
            .zip(select)
            .filter(|(c, _)| {
                let new_id = c == "\"id\"" && key != "id" && table != "tasks";
                let new_key = c == "\"key\"" && table == "session_keys";
                !(new_id || new_key)
            })
            .unzip();
        tx.execute(
            &format!(
                "INSERT INTO \"{table}\" ({}) SELECT {} FROM \"{table}\" AS t, ids WHERE t.\"{key}\" = ?1",
                list.join(", "),
                select.join(", ")
            ),
            [&s.id],
        )
        .unwrap_or_else(|e| panic!("copying {table}: {e}"));
    }
    // Activities are keyed by their session's key (made above for each copy) and their seq.
    let cols: Vec<String> = columns(&tx, "agent_activities")
        .into_iter()
        .filter(|c| c != "key")
        .collect();
    tx.execute(
        &format!(
            "INSERT INTO agent_activities (key, {list}) \
             SELECT (k.key << 32) | (t.key & 4294967295), {select} \
             FROM ids JOIN session_keys AS k ON k.session_id = ids.id, agent_activities AS t \
             WHERE t.key >> 32 = (SELECT key FROM session_keys WHERE session_id = ?1) \
             ORDER BY k.key, t.key",
            list = cols.join(", "),
            select = cols
                .iter()
                .map(|c| format!("t.{c}"))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        [&s.id],
    )
    .unwrap_or_else(|e| panic!("copying agent_activities: {e}"));
    tx.commit().unwrap();
    db.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
    let (sessions, activities, tasks, unrecognized): (i64, i64, i64, i64) = db
        .query_row(
            "SELECT (SELECT count(*) FROM agent_sessions), (SELECT count(*) FROM agent_activities), \
             (SELECT count(*) FROM tasks), (SELECT count(*) FROM provider_unrecognized)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    drop(db);
    eprintln!(
        "store: {sessions} sessions, {activities} activities, {tasks} ended tasks, \
         {unrecognized} unrecognized lines, built in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(sessions as u64, STORE_SESSIONS);
    assert_eq!(tasks as u64, STORE_SESSIONS);
    assert_eq!(unrecognized as u64, 2 * STORE_SESSIONS);
    t0.elapsed()
}

fn columns(db: &rusqlite::Connection, table: &str) -> Vec<String> {
    let mut st = db
        .prepare(&format!("PRAGMA table_info(\"{table}\")"))
        .unwrap();
    st.query_map([], |r| r.get::<_, String>(1))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

// ── P1 ─────────────────────────────────────────────────────────────────────────────────────

// The fake Anthropic Messages server the provider tests run Claude Code against (one file,
// used as is: what the CLI sees here is what the provider tests check). Much of them is for
// the tests' other uses, hence `dead_code` (fake_anthropic.rs allows it itself).
#[path = "../../tests/providers/fake_anthropic.rs"]
mod fake_anthropic;
#[allow(dead_code)]
#[path = "../../tests/providers/fake_http.rs"]
mod fake_http;

fn claude_bin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/npm/node_modules/.bin/claude")
}

/// The CLI's environment against the fake server (as `tests/providers` sets it).
fn claude_env(url: &str) -> Vec<(String, String)> {
    [
        ("ANTHROPIC_BASE_URL", url),
        ("ANTHROPIC_API_KEY", "sk-ant-paddock-bench"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("CLAUDE_CODE_MAX_RETRIES", "0"),
        ("DISABLE_AUTOUPDATER", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The CLI run directly, as a user would script it: spawn → its `result` line.
fn p1_direct(dir: &Path, url: &str) -> f64 {
    let t0 = Instant::now();
    let mut child = Command::new(claude_bin())
        .args([
            "-p",
            "say hi",
            "--output-format",
            "stream-json",
            "--verbose",
        ])
        .current_dir(dir.join("project"))
        .envs(env_of(dir))
        .envs(claude_env(url))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn claude");
    let mut result = false;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        if line.unwrap().contains("\"type\":\"result\"") {
            result = true;
            break;
        }
    }
    let took = t0.elapsed().as_secs_f64();
    let _ = child.wait();
    assert!(result, "claude printed no result line");
    took
}

/// The same turn through the daemon: CreateSession(claude-code) → SendMessage → COMPLETION.
async fn p1_daemon(d: &Daemon, camp: &str, url: &str) -> f64 {
    let mut c = d.client().await;
    let t0 = Instant::now();
    let s = c
        .create_session(pb::CreateSessionRequest {
            campaign_id: camp.into(),
            provider: pb::SessionProvider::ClaudeCode as i32,
            provider_config: [("command".to_string(), claude_bin().display().to_string())]
                .into_iter()
                .collect(),
            environment: claude_env(url).into_iter().collect(),
            ..Default::default()
        })
        .await
        .expect("create a Claude Code session")
        .into_inner()
        .session
        .unwrap();
    let got = turn(c.clone(), s.id.clone(), "say hi")
        .await
        .expect("the turn");
    let took = t0.elapsed().as_secs_f64();
    assert!(got > 0);
    let _ = c
        .stop_session(pb::StopSessionRequest {
            session_id: s.id,
            graceful: false,
        })
        .await;
    took
}

async fn p1(s: &Settings) -> Row {
    let target = Target::RatioMax(1.02);
    let measure = "P1 a Claude Code turn (s; baseline: the CLI run directly)";
    if !claude_bin().exists() {
        return Row::skipped(
            "P1",
            measure,
            target,
            "no tests/npm/node_modules/.bin/claude (cd tests/npm && npm ci)".into(),
        );
    }
    let pairs = if s.short { 3 } else { 20 };
    let fake = fake_anthropic::FakeAnthropic::start(Vec::new()).await;
    fake.push(
        (0..2 * (pairs + 1)).map(|_| fake_anthropic::Reply::text("Hello from the fake model.")),
    );
    let url = fake.url();
    let tmp = tempdir("p1");
    let d = Daemon::start(tmp.path(), &[]).await;
    let camp = d.campaign().await;
    let (mut direct, mut pd) = (Vec::new(), Vec::new());
    for i in 0..=pairs {
        let dir = tmp.path().to_path_buf();
        let u = url.clone();
        let run_direct = move || tokio::task::spawn_blocking(move || p1_direct(&dir, &u));
        let (a, b) = if i % 2 == 0 {
            let b = run_direct().await.unwrap();
            (p1_daemon(&d, &camp, &url).await, b)
        } else {
            let a = p1_daemon(&d, &camp, &url).await;
            (a, run_direct().await.unwrap())
        };
        if i == 0 {
            continue; // warm-up: the CLI's first start fills caches
        }
        pd.push(a);
        direct.push(b);
    }
    d.stop().await;
    Row::paired("P1", measure, "s", direct, pd, target)
}

// ── P2 ─────────────────────────────────────────────────────────────────────────────────────

/// The turn file: init, `n` assistant lines, the result.
fn p2_file(path: &Path, n: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(f, "{}", init_line()).unwrap();
    for i in 0..n {
        writeln!(
            f,
            "{}",
            assistant_line(i, &format!("step {i} of the benchmark turn"))
        )
        .unwrap();
    }
    writeln!(f, "{}", result_line(n)).unwrap();
}

/// The baseline: the same agent process, its stdout read from a pipe line by line and every
/// line given to the daemon's own parser, until the result.
fn p2_baseline(file: &Path) -> Duration {
    let mut parser = ClaudeStreamParser::new();
    p2_bare_loop(file, |line| parser.parse_line(line).len())
}

/// The reference beside it: the same loop building a `serde_json::Value` of every line (the
/// performance review's second baseline, and what the daemon's parser did until 2026-12-06),
/// so that the relay is also compared with a bar that does not move with the parser.
fn p2_value_loop(file: &Path) -> Duration {
    p2_bare_loop(file, |line| {
        usize::from(serde_json::from_str::<serde_json::Value>(line).is_ok())
    })
}

/// The agent's turn read from a pipe line by line, each line given to `parse` (which says how
/// many items it made), until the result.
fn p2_bare_loop(file: &Path, mut parse: impl FnMut(&str) -> usize) -> Duration {
    let t0 = Instant::now();
    let (mut child, stdin) = agent_process(&["cat", &file.display().to_string()]);
    let mut events = 0usize;
    let mut reader = BufReader::with_capacity(64 * 1024, child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        events += parse(line.trim_end());
        if line.contains("\"type\":\"result\"") {
            break;
        }
    }
    let took = t0.elapsed();
    drop(stdin);
    let _ = child.wait();
    assert!(events > 0);
    took
}

/// The daemon path: a session of the same agent, one SendMessage, every activity received.
async fn p2_daemon(file: &Path, n: u64) -> Duration {
    let tmp = tempdir("p2");
    let d = Daemon::start(tmp.path(), &[]).await;
    let camp = d.campaign().await;
    let mut c = d.client().await;
    let id = d
        .agent_session(&mut c, &camp, &["cat", &file.display().to_string()])
        .await;
    let t0 = Instant::now();
    let got = turn(c, id, "go").await.expect("the turn");
    let took = t0.elapsed();
    assert_eq!(got, n + 1, "every activity and the completion");
    d.stop().await;
    took
}

async fn p2(s: &Settings) -> Vec<Row> {
    let tmp = tempdir("p2file");
    let file = tmp.path().join("turn.jsonl");
    p2_file(&file, s.p2_events);
    let (mut base, mut value, mut daemon) = (Vec::new(), Vec::new(), Vec::new());
    // At least 3 even in the short form: a turn takes a second, and one turn's noise should
    // not decide a row that sits near its failure line.
    for _ in 0..s.reps.max(3) {
        base.push(p2_baseline(&file).as_secs_f64());
        value.push(p2_value_loop(&file).as_secs_f64());
        daemon.push(p2_daemon(&file, s.p2_events).await.as_secs_f64());
        let k = |secs: &[f64]| s.p2_events as f64 / secs[secs.len() - 1] / 1000.0;
        eprintln!(
            "P2: parse loop {:.0} k/s, relay {:.0} k/s ({:.2}×)",
            k(&base),
            k(&daemon),
            k(&daemon) / k(&base)
        );
    }
    let n = s.p2_events as f64;
    let b = n / median(&mut base) / 1000.0;
    let v = n / median(&mut value) / 1000.0;
    let p = n / median(&mut daemon) / 1000.0;
    vec![
        Row::ratio(
            "P2",
            format!("relay throughput, {} events (k events/s)", s.p2_events),
            (b, "k/s"),
            p,
            Target::RatioMin(0.5),
        ),
        Row::ratio(
            "P2",
            "the same, for reference: ÷ a serde_json::Value parse loop over the same bytes",
            (v, "k/s"),
            p,
            Target::Reference,
        ),
    ]
}

// ── P3 ─────────────────────────────────────────────────────────────────────────────────────

const PROBES: usize = 20;
const PROBE_EVENTS: &str = "200";
const PROBE_GAP_MS: &str = "5";

/// Latencies (ms) of `ts=` stamped activities on a WatchActivity stream until `n` arrived.
async fn watch_latencies(mut c: Client, id: String, n: usize) -> Vec<f64> {
    let mut stream = c
        .watch_activity(pb::WatchActivityRequest {
            session_id: id,
            after_seq: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let Ok(Some(ev)) = stream.message().await else {
            break;
        };
        if let Some(ts) = ev.content.strip_prefix("ts=") {
            if let Ok(ts) = ts.parse::<u128>() {
                out.push((wall_ns().saturating_sub(ts)) as f64 / 1e6);
            }
        }
    }
    out
}

/// The same probe agents, read from pipes by this process: the latency a bare reader sees.
fn p3_pipe_baseline() -> Vec<f64> {
    let threads: Vec<_> = (0..PROBES)
        .map(|_| {
            std::thread::spawn(move || {
                let (mut child, stdin) = agent_process(&["paced", PROBE_EVENTS, PROBE_GAP_MS]);
                let mut lat = Vec::new();
                for line in BufReader::new(child.stdout.take().unwrap()).lines() {
                    let line = line.unwrap();
                    if let Some(i) = line.find("ts=") {
                        let ts: String = line[i + 3..]
                            .chars()
                            .take_while(char::is_ascii_digit)
                            .collect();
                        if let Ok(ts) = ts.parse::<u128>() {
                            lat.push(wall_ns().saturating_sub(ts) as f64 / 1e6);
                        }
                    }
                    if line.contains("\"type\":\"result\"") {
                        break;
                    }
                }
                drop(stdin);
                let _ = child.wait();
                lat
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

async fn p3(s: &Settings) -> Vec<Row> {
    let n = s.p3_sessions;
    let tmp = tempdir("p3");
    let max = (n + PROBES + 8).to_string();
    let d = Daemon::start(tmp.path(), &["--max-sessions", &max]).await;
    let camp = d.campaign().await;
    // The load: each session answers with 21 lines 100 ms apart (a 2 s turn), each agent at a
    // phase of its own, so that the load is a rate and not 1,000 events at once every 100 ms.
    let t0 = Instant::now();
    let mut ids = Vec::with_capacity(n);
    let mut creating = tokio::task::JoinSet::new();
    let mut next = 0;
    while ids.len() < n {
        while creating.len() < 16 && next < n {
            let mut c = d.client().await;
            let camp = camp.clone();
            let cmd = agent_command(&["paced", "21", "100", "spread"]);
            creating.spawn(async move {
                c.create_session(pb::CreateSessionRequest {
                    campaign_id: camp,
                    provider: pb::SessionProvider::ClaudeCode as i32,
                    provider_config: [("command".to_string(), cmd)].into_iter().collect(),
                    ..Default::default()
                })
                .await
                .map(|r| r.into_inner().session.unwrap().id)
            });
            next += 1;
        }
        match creating.join_next().await {
            Some(Ok(Ok(id))) => ids.push(id),
            Some(Ok(Err(e))) => panic!("P3: session {} of {n} refused: {e:?}", ids.len() + 1),
            Some(Err(e)) => panic!("{e}"),
            None => break,
        }
    }
    let created_in = t0.elapsed();
    let runner = d.runner_pid().expect("the default mode has a runner");
    let mut c = d.client().await;
    let mut probes = Vec::new();
    for _ in 0..PROBES {
        probes.push(
            d.agent_session(&mut c, &camp, &["paced", PROBE_EVENTS, PROBE_GAP_MS])
                .await,
        );
    }
    let (daemon_rss, runner_rss) = (rss_mib(d.pid()), rss_mib(runner));
    let idle_rss = daemon_rss + runner_rss;
    eprintln!(
        "P3: {n} sessions created in {:.1} s; idle: daemon {daemon_rss:.1} MiB + runner {runner_rss:.1} MiB",
        created_in.as_secs_f64()
    );
    // Load on, then the probes, every probe watched.
    let mut load = tokio::task::JoinSet::new();
    for id in &ids {
        load.spawn(turn(c.clone(), id.clone(), "load"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let events: usize = PROBE_EVENTS.parse().unwrap();
    // The watching client is a client of its own (a dashboard), not the connection that
    // drives the load.
    let watching = d.client().await;
    let mut watchers = tokio::task::JoinSet::new();
    for id in &probes {
        watchers.spawn(watch_latencies(watching.clone(), id.clone(), events));
    }
    for id in &probes {
        // Read through, so that the turn stream never holds the daemon back.
        tokio::spawn(turn(c.clone(), id.clone(), "probe"));
    }
    let mut peak = idle_rss;
    let mut lat = Vec::new();
    let sampler = async {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            peak = peak.max(rss_mib(d.pid()) + rss_mib(runner));
        }
    };
    let collect = async {
        while let Some(r) = watchers.join_next().await {
            lat.extend(r.unwrap());
        }
        while let Some(r) = load.join_next().await {
            r.unwrap().expect("a load turn");
        }
    };
    tokio::select! {
        _ = sampler => {}
        _ = collect => {}
    }
    let p99 = percentile(&mut lat, 99.0);
    let p50 = percentile(&mut lat, 50.0);
    let mut base = p3_pipe_baseline();
    let base99 = percentile(&mut base, 99.0);
    eprintln!(
        "P3: latency p50 {p50:.2} ms / p99 {p99:.2} ms over {} events ({} expected); pipe p99 {base99:.3} ms; peak RSS {peak:.1} MiB",
        lat.len(),
        PROBES * events
    );
    let t = Instant::now();
    d.stop().await;
    eprintln!(
        "P3: a forced shutdown of {n} sessions took {:.2} s (daemon and runner gone)",
        t.elapsed().as_secs_f64()
    );
    let load_rate = n * 21 / 2;
    vec![
        Row {
            id: "P3",
            measure: format!("{n} sessions (runner on): daemon + runner peak RSS (MiB)"),
            baseline: "-".into(),
            paddock: format!("{peak:.1} MiB"),
            ratio: None,
            value: peak,
            target: Target::ValueMax(100.0),
            skipped: None,
        },
        Row {
            id: "P3",
            measure: format!(
                "event latency p99, {PROBES} watched agents + {load_rate} events/s load (ms; baseline: a pipe)"
            ),
            baseline: format!("{base99:.2} ms"),
            paddock: format!("{p99:.2} ms"),
            ratio: Some(p99 / base99),
            value: p99,
            target: Target::ValueMax(5.0),
            skipped: None,
        },
    ]
}

// ── P4 ─────────────────────────────────────────────────────────────────────────────────────

/// Wall time of one CLI run (its output read to the end, as a terminal would).
fn time_cli(args: &[&str], socket: &Path, dir: &Path) -> f64 {
    let t0 = Instant::now();
    let mut child = Command::new(BIN)
        .args(args)
        .env("PADDOCK_SOCKET", socket)
        .envs(env_of(dir))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut sink = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut sink).unwrap();
    let st = child.wait().unwrap();
    assert!(st.success(), "paddock {args:?}: {st}");
    t0.elapsed().as_secs_f64() * 1e3
}

fn p4(d: &Daemon, s: &Settings) -> Vec<Row> {
    let pairs = if s.short { 20 } else { 30 };
    let mut rows = Vec::new();
    for (name, args) in [
        ("session list", vec!["session", "list", "--no-autostart"]),
        // The first page: what a terminal shows (the first 100, `--limit`).
        (
            "session list --all",
            vec!["session", "list", "--all", "--no-autostart"],
        ),
    ] {
        let (mut base, mut pd) = (Vec::new(), Vec::new());
        // Warm-up, then A B pairs with the order swapped every other pair.
        time_cli(&args, &d.socket, &d.dir);
        for i in 0..pairs {
            let (a, b) = if i % 2 == 0 {
                let a = time_cli(&args, &d.socket, &d.dir);
                (a, time_cli(&["--version"], &d.socket, &d.dir))
            } else {
                let b = time_cli(&["--version"], &d.socket, &d.dir);
                (time_cli(&args, &d.socket, &d.dir), b)
            };
            pd.push(a);
            base.push(b);
        }
        rows.push(Row::paired(
            "P4",
            format!("`{name}`, 10,000 stored (ms; baseline `paddock --version`)"),
            "ms",
            base,
            pd,
            Target::RatioMax(1.5),
        ));
    }
    rows
}

// ── P5 ─────────────────────────────────────────────────────────────────────────────────────

async fn p5(store: &Path, s: &Settings) -> Vec<Row> {
    // A start takes ~0.1 s: enough pairs even in the short form for the median to hold
    // under a loaded machine's noise.
    let pairs = if s.short { 7 } else { 11 };
    let empty = tempdir("p5empty");
    // The empty store's schema exists already, as the big one's does.
    Daemon::start(empty.path(), &[]).await.stop().await;
    let (mut te, mut tf, mut re, mut rf) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..=pairs {
        let one = |dir: PathBuf| async move {
            let d = Daemon::start(&dir, &[]).await;
            let (t, rss) = (d.ready_after.as_secs_f64() * 1e3, rss_mib(d.pid()));
            d.stop().await;
            (t, rss)
        };
        let (e, f) = if i % 2 == 0 {
            let e = one(empty.path().to_path_buf()).await;
            (e, one(store.to_path_buf()).await)
        } else {
            let f = one(store.to_path_buf()).await;
            (one(empty.path().to_path_buf()).await, f)
        };
        if i == 0 {
            continue; // warm-up (page cache)
        }
        te.push(e.0);
        tf.push(f.0);
        re.push(e.1);
        rf.push(f.1);
    }
    vec![
        Row::paired(
            "P5",
            "daemon start → first Ping, 10,000 / 1M stored (ms; baseline: empty store)",
            "ms",
            te,
            tf,
            Target::RatioMax(1.3),
        ),
        Row::paired(
            "P5",
            "daemon RSS at first Ping, 10,000 / 1M stored (MiB; baseline: empty store)",
            "MiB",
            re,
            rf,
            Target::RatioMax(1.3),
        ),
    ]
}

// ── P6 ─────────────────────────────────────────────────────────────────────────────────────

/// Daemon CPU per event (µs) while `sessions` agents each write `events` lines 5 ms apart.
async fn p6_once(d: &Daemon, sessions: usize, events: usize) -> f64 {
    let camp = d.campaign().await;
    let mut c = d.client().await;
    let n = events.to_string();
    let mut ids = Vec::new();
    for _ in 0..sessions {
        ids.push(d.agent_session(&mut c, &camp, &["paced", &n, "5"]).await);
    }
    // Let start-up settle before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = cpu(d.pid());
    let mut turns = tokio::task::JoinSet::new();
    for id in ids.iter().cloned() {
        turns.spawn(turn(c.clone(), id, "go"));
    }
    let mut total = 0;
    while let Some(r) = turns.join_next().await {
        total += r.unwrap().expect("a turn");
    }
    let used = cpu(d.pid()) - before;
    for id in ids {
        let _ = c
            .stop_session(pb::StopSessionRequest {
                session_id: id,
                graceful: false,
            })
            .await;
    }
    used.as_secs_f64() * 1e6 / total as f64
}

async fn p6(store: &Path, s: &Settings) -> Row {
    let (sessions, events) = if s.short { (10, 200) } else { (20, 300) };
    let empty = tempdir("p6empty");
    let (mut e, mut f) = (Vec::new(), Vec::new());
    // At least 3 even in the short form: one run of 2,000 events read 1.03–1.36× from one CI
    // run to the next with the same code, where the full form reads 1.01–1.05×.
    for _ in 0..s.reps.max(3) {
        let d = Daemon::start(empty.path(), &["--max-sessions", "64"]).await;
        e.push(p6_once(&d, sessions, events).await);
        d.stop().await;
        let d = Daemon::start(store, &["--max-sessions", "64"]).await;
        f.push(p6_once(&d, sessions, events).await);
        d.stop().await;
    }
    Row::ratio(
        "P6",
        format!(
            "daemon CPU per event, {sessions} agents × 200 events/s, 10,000 stopped stored (µs; baseline: none stored)"
        ),
        (median(&mut e), "µs"),
        median(&mut f),
        Target::RatioMax(1.2),
    )
}

// ── main ───────────────────────────────────────────────────────────────────────────────────

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--bench-agent") {
        agent(&args[2..]);
    }
    let mut paced = String::new();
    paced_line(&mut paced, 7, 42);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&paced).unwrap(),
        serde_json::from_str::<serde_json::Value>(&assistant_line(7, "ts=42")).unwrap(),
        "the paced agent's line is the assistant line"
    );
    let s = Settings::read();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "paddock targets ({} form): {cores} cores, {}",
        if s.short { "short" } else { "full" },
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| format!(
                "load {}",
                l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
            ))
            .unwrap_or_default()
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let t0 = Instant::now();
    let stage = |name: &str| eprintln!("[{:>5.1} s] {name}", t0.elapsed().as_secs_f64());
    let mut rows = Vec::new();
    if s.runs("P1") {
        stage("P1");
        rows.push(rt.block_on(p1(&s)));
    }
    if s.runs("P2") {
        stage("P2");
        rows.extend(rt.block_on(p2(&s)));
    }
    if s.runs("P3") {
        stage("P3");
        rows.extend(rt.block_on(p3(&s)));
    }
    let store = tempdir("store");
    if s.runs("P4") || s.runs("P5") || s.runs("P6") {
        stage("the 10,000-session store");
        rt.block_on(build_store(store.path()));
    }
    if s.runs("P4") {
        stage("P4");
        rows.extend(rt.block_on(async {
            let d = Daemon::start(store.path(), &[]).await;
            let rows = p4(&d, &s);
            d.stop().await;
            rows
        }));
    }
    if s.runs("P5") {
        stage("P5");
        rows.extend(rt.block_on(p5(store.path(), &s)));
    }
    if s.runs("P6") {
        stage("P6");
        rows.push(rt.block_on(p6(store.path(), &s)));
    }
    // Removed now: `exit` below runs no destructors, and the store is ~180 MB.
    if std::env::var_os("PADDOCK_BENCH_KEEP_STORE").is_some() {
        eprintln!(
            "the 10,000-session store is kept in {}",
            store.keep().display()
        );
    } else {
        drop(store);
    }
    println!();
    print_table(&rows);
    println!();
    println!("({:.0} s)", t0.elapsed().as_secs_f64());
    let far: Vec<&str> = rows.iter().filter(|r| r.far_off()).map(|r| r.id).collect();
    if !far.is_empty() {
        eprintln!("more than 2× off target: {}", far.join(", "));
        std::process::exit(1);
    }
}
