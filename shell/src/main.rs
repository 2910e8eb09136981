//! `paddock`: a local daemon that supervises AI coding agents, and its CLI.

use paddock::{cli, daemon, paths, providers};

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "paddock",
    version,
    about = "Supervise AI coding agents: one daemon, every agent, every event stored",
    after_help = cli::EXIT_CODES_HELP
)]
pub struct Cli {
    /// The daemon's Unix socket [default: $XDG_RUNTIME_DIR/paddock/daemon.sock]
    #[arg(long, global = true, env = "PADDOCK_SOCKET")]
    socket: Option<PathBuf>,
    /// Where the daemon keeps its database [default: $XDG_DATA_HOME/paddock]
    #[arg(long, global = true, env = "PADDOCK_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Print JSON instead of tables
    #[arg(long, global = true)]
    json: bool,
    /// Fail instead of starting a daemon when none answers on the socket
    #[arg(long, global = true)]
    no_autostart: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the daemon in the foreground
    Daemon {
        /// How long a graceful stop waits for the current turn, in seconds
        #[arg(long, default_value_t = 30)]
        stop_grace_secs: u64,
        /// How long a TERMed agent gets before KILL, in seconds
        #[arg(long, default_value_t = paddock_core::process::KILL_GRACE.millis() / 1000)]
        kill_grace_secs: u64,
        /// How long a gracefully stopped agent gets to end its own way (its input closed)
        /// before TERM, in seconds (0: TERM at once)
        #[arg(long, default_value_t = paddock_core::process::END_GRACE.millis() / 1000)]
        end_grace_secs: u64,
        /// How long a session may take from its create until its agent says it is ready (its
        /// environment made, its process started, paddock's ready request answered), in seconds
        #[arg(long, default_value_t = paddock_core::process::STARTUP_TIMEOUT.millis() / 1000)]
        startup_timeout_secs: u64,
        /// Live sessions at most
        #[arg(long, default_value_t = 64)]
        max_sessions: usize,
        /// Output bytes kept per task (past it, one truncation marker line)
        #[arg(long, default_value_t = 4 * 1024 * 1024)]
        task_output_max_bytes: u64,
        /// The Aria runtime socket [default: ~/.aria/runtime.sock]
        #[arg(long, env = "ARIA_RUNTIME_SOCK")]
        aria_socket: Option<PathBuf>,
        /// Events of each agent's output the runner keeps while the daemon is away (a crash
        /// or restart); past it the oldest are dropped and the session records the loss
        #[arg(long, default_value_t = paddock::runner::Limits::default().events_per_run)]
        runner_buffer_events: usize,
        /// Bytes of each agent's output the runner keeps while the daemon is away
        #[arg(long, default_value_t = paddock::runner::Limits::default().bytes_per_run)]
        runner_buffer_bytes: usize,
        /// Do not serve the Aria runtime socket
        #[arg(long)]
        no_aria_socket: bool,
        /// Also serve the daemon's API on obey's socket [default: $XDG_RUNTIME_DIR/obey/daemon.sock
        /// when the daemon runs on its default socket]
        #[arg(long)]
        obey_socket: Option<PathBuf>,
        /// Do not serve obey's socket
        #[arg(long)]
        no_obey_socket: bool,
        /// Where Aria sessions run [default: <data dir>/aria-workspace]
        #[arg(long)]
        aria_workspace: Option<PathBuf>,
        /// The provider Aria sessions run
        #[arg(long, default_value = "scripted")]
        aria_provider: String,
        /// The model Aria sessions use
        #[arg(long, default_value = "")]
        aria_model: String,
        /// Run agents and tasks as the daemon's own children (they die with it) instead of in
        /// the runner process (`paddock runner`), where they survive a daemon crash and are
        /// taken back when the daemon restarts
        #[arg(long)]
        no_runner: bool,
        /// Users (names or uids) besides the daemon's own who may use its sockets; checked on
        /// every connection (SO_PEERCRED)
        #[arg(
            long = "allow-user",
            env = "PADDOCK_ALLOW_USERS",
            value_delimiter = ','
        )]
        allow_users: Vec<String>,
        /// Groups (names or gids) whose members may use the daemon's sockets
        #[arg(
            long = "allow-group",
            env = "PADDOCK_ALLOW_GROUPS",
            value_delimiter = ','
        )]
        allow_groups: Vec<String>,
        #[command(flatten)]
        log: paths::LogArgs,
    },
    /// Watch a whole session of the built-in scripted agent, start to finish (no API key)
    Demo {
        /// The message to send the agent
        #[arg(long, default_value = "What is in this project?")]
        message: String,
    },
    /// Campaigns: named project roots that sessions run in
    #[command(subcommand)]
    Campaign(cli::CampaignCmd),
    /// The configuration file ($PADDOCK_CONFIG, else $XDG_CONFIG_HOME/paddock/config.toml)
    #[command(subcommand)]
    Config(cli::ConfigCmd),
    /// Requests waiting for a human: permission prompts, questions, client-side tool calls
    Approvals {
        /// Only this session's (its name, id or a unique part of the id)
        #[arg(long)]
        session: Option<String>,
        /// Keep going: print each request as it is opened and resolved (the bell rings for a
        /// new one on a terminal) until Ctrl-C
        #[arg(long, short)]
        watch: bool,
        /// Resolved ones too
        #[arg(long)]
        all: bool,
        /// At most this many, newest first
        #[arg(long, default_value_t = 100)]
        limit: i32,
    },
    /// Let an agent go ahead with what it asked
    Approve { id: String },
    /// Refuse what an agent asked; the reason is passed on to it
    Deny {
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Answer an agent's question (or give a client-side tool's result)
    Answer { id: String, text: String },
    /// Agent sessions
    #[command(subcommand)]
    Session(cli::SessionCmd),
    /// Aria tasks: commands run to completion, their output stored
    #[command(subcommand)]
    Task(cli::task::TaskCmd),
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell), e.g.
    /// `paddock completions bash > ~/.local/share/bash-completion/completions/paddock`
    Completions { shell: clap_complete::Shell },
    /// Print the man page (roff), e.g. `paddock man | man -l -`; with a command, that
    /// command's page (`paddock man session create`: paddock-session-create(1), as SEE ALSO
    /// names them)
    Man {
        /// The command whose page to print
        command: Vec<String>,
    },
    /// A live dashboard of every session, those waiting for you first: approve, deny, answer,
    /// attach, stop, restart and delete from it (needs a terminal)
    Top,
    /// Can each agent run here? Its CLI, version and credentials, the openai-api endpoint,
    /// the daemon and the drivers, with what to do about each problem
    Doctor,
    /// Check that the daemon answers
    Ping,
    /// The daemon's state and its active sessions
    State,
    /// Stop every session gracefully and stop the daemon
    Shutdown {
        /// Interrupt running turns instead of waiting for them
        #[arg(long)]
        force: bool,
    },
    /// Run the centaurx runner service (runner.v1.Runner) in the foreground: it runs codex exec
    /// and shell commands for a client and owns them across that client's restarts
    Runner {
        /// The Unix socket to serve on (its directory is created 0700, the socket is 0600)
        #[arg(long)]
        socket: PathBuf,
        /// Runs (agents and commands) live at once; more are refused (the daemon starts its
        /// runner with its own session plus task limits)
        #[arg(long, default_value_t = paddock::runner::registry::DEFAULT_LIVE_RUNS)]
        max_runs: usize,
        /// Events of a run kept for a client that is away (a daemon restarting); older ones
        /// are dropped, and the client is told how many
        #[arg(long, default_value_t = paddock::runner::Limits::default().events_per_run)]
        buffer_events: usize,
        /// Bytes of a run's events kept for a client that is away
        #[arg(long, default_value_t = paddock::runner::Limits::default().bytes_per_run)]
        buffer_bytes: usize,
        #[command(flatten)]
        log: paths::LogArgs,
    },
    /// The built-in scripted agent (started by the daemon; speaks Claude Code's stream-json)
    #[command(name = "__scripted-agent", hide = true)]
    ScriptedAgent {
        #[arg(long)]
        script: Option<PathBuf>,
        /// Text for the `{system_prompt}` placeholder (Claude Code's flag of the same name)
        #[arg(long)]
        append_system_prompt: Option<String>,
    },
    /// paddock's MCP server for an agent that starts MCP servers as processes (gemini): copies
    /// stdin and stdout to and from the bridge's socket
    #[command(name = "__mcp-relay", hide = true)]
    McpRelay { socket: PathBuf },
    /// Runs the program in the paddock runner of an ssh host or a pod and relays it (an ssh,
    /// qemu or kubernetes session's agent and commands): reconnects when the connection drops,
    /// losing nothing
    #[command(name = "__ssh-run", hide = true)]
    SshRun {
        /// The ssh host (unless --pod)
        #[arg(long, default_value = "")]
        host: String,
        /// A pod, NAMESPACE/NAME, reached through the API server of the kubeconfig's cluster
        #[arg(long)]
        pod: Option<String>,
        /// The pod's container
        #[arg(long, default_value = "")]
        container: String,
        /// The kubeconfig files, `:`-separated (empty: KUBECONFIG, else ~/.kube/config)
        #[arg(long, default_value = "")]
        kubeconfig: String,
        #[arg(long, default_value = "")]
        kube_context: String,
        /// The paddock binary there
        #[arg(long)]
        remote_paddock: String,
        #[arg(long, default_value_t = 0)]
        port: u16,
        #[arg(long, default_value = "")]
        user: String,
        #[arg(long, default_value = "")]
        key: String,
        #[arg(long, default_value = "")]
        known_hosts: String,
        #[arg(long)]
        accept_new_host_key: bool,
        /// An installed paddock on the host (empty: paddock's own copy)
        #[arg(long, default_value = "")]
        paddock: String,
        /// Where paddock keeps its binary and runner on the host (empty: ~/.cache/paddock)
        #[arg(long, default_value = "")]
        remote_dir: String,
        /// The host is the session's VM (started again when found stopped)
        #[arg(long)]
        vm: bool,
        /// The run is the session's agent (one at a time), not a command run in it
        #[arg(long)]
        agent: bool,
        /// The runner's socket on the host
        #[arg(long)]
        remote_socket: String,
        /// The session's environment directory here (the forwarded socket goes there)
        #[arg(long)]
        dir: PathBuf,
        /// The working directory on the host
        #[arg(long)]
        cwd: String,
        /// A variable of this process's environment to pass on (repeated)
        #[arg(long = "env")]
        env: Vec<String>,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Makes sure a runner answers on DIR/runner.sock (starting one detached) and prints that
    /// path: run on an ssh host when a session's environment is made there. With --stop, stops
    /// the runs whose id starts with PREFIX instead (a deleted session's)
    #[command(name = "__ssh-runner", hide = true)]
    SshRunner {
        dir: PathBuf,
        #[arg(long, value_name = "PREFIX")]
        stop: Option<String>,
    },
    /// Joins the control groups (their cgroup.procs files), then runs the program: how a
    /// bubblewrap session's processes come under its memory and process limits
    #[command(name = "__join-cgroups", hide = true)]
    JoinCgroups {
        #[arg(required = true)]
        procs: Vec<PathBuf>,
        /// The program and its arguments, after `--`
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// A bridge between the daemon's stream-json and an agent's own protocol (started by the
    /// daemon for codex, gemini, ACP agents and the openai-api loop)
    #[command(name = "__bridge", hide = true)]
    Bridge(providers::bridge::BridgeArgs),
}

/// jemalloc rather than glibc's malloc: see the dependency's note in shell/Cargo.toml.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options (its `malloc_conf`), which it reads once, when it starts: at the first
/// allocation, before `main`. Null (its defaults) unless [`choose_malloc_conf`] sets them.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: std::sync::atomic::AtomicPtr<std::ffi::c_char> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Run before `main` (and before the first allocation), with `main`'s arguments, as glibc
/// calls every `.init_array` function: [`choose_malloc_conf`].
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[used]
#[unsafe(link_section = ".init_array")]
static CHOOSE_MALLOC_CONF: extern "C" fn(
    std::ffi::c_int,
    *const *const std::ffi::c_char,
    *const *const std::ffi::c_char,
) = choose_malloc_conf;

/// A command of the user's (`paddock session list`, `paddock --version`) has jemalloc back its
/// heap with transparent huge pages where the system lets a program ask (`madvise`, the
/// default): a process that lives a few milliseconds then takes one page fault where it took
/// hundreds. jemalloc spreads small allocations over a page per size class, and a command's
/// first page faults were most of its time past start-up: `session list --all` on a
/// 10,000-session store, `perf stat -r 200`, alternated: 641 → 411 page faults, 1.99 → 1.85
/// ms (`--version` unchanged, 1.39 ms). The long-lived processes — the daemon, the runner and
/// the hidden helpers (`__bridge`, `__scripted-agent`, …), one per agent — keep jemalloc's
/// defaults: huge pages took the daemon and runner of P3 from 90 to 130 MiB.
///
/// An argument that names one of those (`daemon`, `runner`, `__…`) anywhere keeps the
/// defaults: a command in doubt is not sped up, and nothing else changes.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" fn choose_malloc_conf(
    argc: std::ffi::c_int,
    argv: *const *const std::ffi::c_char,
    _envp: *const *const std::ffi::c_char,
) {
    let argc = usize::try_from(argc).unwrap_or(0);
    if argv.is_null() {
        return;
    }
    let long_lived = (1..argc).any(|i| {
        // SAFETY: glibc passes `main`'s argc and argv: argc valid C strings at argv.
        let arg = unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) }.to_bytes();
        arg == b"daemon" || arg == b"runner" || arg.starts_with(b"__")
    });
    if !long_lived {
        MALLOC_CONF.store(
            c"thp:always".as_ptr().cast_mut(),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

fn main() {
    use clap::{CommandFactory, FromArgMatches};
    // The binary answers to the name it was invoked by: as `obey` (a link), `obey --version`
    // and every usage line say obey, as that system's CLI did.
    let as_obey = std::env::args_os()
        .next()
        .is_some_and(|a| std::path::Path::new(&a).file_name() == Some("obey".as_ref()));
    let mut command = Cli::command();
    if as_obey {
        command = command.name("obey");
    }
    // Parsed in place: the tree (every command's arguments) lives until the exit below, which
    // frees nothing (dropping it was 0.07 ms of a `session list`).
    let matches = command
        .try_get_matches_from_mut(std::env::args_os())
        .unwrap_or_else(|e| usage_error(e));
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| usage_error(e));
    // Whether a `daemon` flag was given (on the command line or by its variable): the
    // configuration file's value applies only where it was not.
    let daemon_flag = |id: &str| {
        matches
            .subcommand_matches("daemon")
            .and_then(|m| m.value_source(id))
            .is_some_and(|s| s != clap::parser::ValueSource::DefaultValue)
    };
    let socket = cli.socket.clone().unwrap_or_else(paths::default_socket);
    // A daemon on another socket than the default one (a test's, a second daemon) leaves
    // obey's socket alone; an autostarted daemon is given the default path explicitly.
    let explicit_socket = socket != paths::default_socket();
    let data_dir = cli.data_dir.clone().unwrap_or_else(paths::default_data_dir);
    let code = match cli.command {
        Command::ScriptedAgent {
            script,
            append_system_prompt,
        } => match providers::scripted::run(script.as_deref(), append_system_prompt.as_deref()) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("scripted agent: {e}");
                1
            }
        },
        Command::Bridge(args) => providers::bridge::run(args),
        Command::McpRelay { socket } => paddock::providers::bridge::mcp_socket::relay(&socket),
        Command::SshRun {
            host,
            pod,
            container,
            kubeconfig,
            kube_context,
            remote_paddock,
            port,
            user,
            key,
            known_hosts,
            accept_new_host_key,
            paddock,
            remote_dir,
            vm,
            agent,
            remote_socket,
            dir,
            cwd,
            env,
            command,
        } => paddock::env::relay::relay(paddock::env::relay::RelayArgs {
            place: match pod.as_deref().map(|p| p.split_once('/')) {
                Some(Some((namespace, name))) => {
                    paddock::env::relay::Place::Pod(paddock::env::kube::PodRef {
                        kubeconfig,
                        context: kube_context,
                        namespace: namespace.to_string(),
                        name: name.to_string(),
                        container,
                    })
                }
                Some(None) => {
                    eprintln!("paddock: --pod is NAMESPACE/NAME");
                    std::process::exit(2);
                }
                None => paddock::env::relay::Place::Ssh(paddock_core::SshTarget {
                    host,
                    port,
                    user,
                    key_file: key,
                    known_hosts,
                    accept_new_host_key,
                    paddock,
                    remote_dir,
                    workdir: String::new(),
                }),
            },
            remote_paddock,
            remote_socket,
            dir,
            cwd,
            env,
            argv: command,
            vm,
            agent,
        }),
        Command::SshRunner {
            dir,
            stop: Some(prefix),
        } => match paddock::env::ssh::stop_runs(&dir, &prefix) {
            Ok(n) => {
                println!("{n}");
                0
            }
            Err(e) => {
                eprintln!("paddock: {e}");
                1
            }
        },
        Command::SshRunner { dir, stop: None } => match paddock::env::ssh::ensure_runner(&dir) {
            Ok(socket) => {
                println!("{}", socket.display());
                0
            }
            Err(e) => {
                eprintln!("paddock: {e}");
                1
            }
        },
        Command::JoinCgroups { procs, command } => {
            let e = paddock::env::limits::join_and_exec(&procs, &command[0], &command[1..]);
            eprintln!("paddock: cannot start {}: {e}", command[0]);
            127
        }
        // Generated into memory, then written: a reader that stops early (`| head`) ends the
        // output quietly.
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "paddock", &mut out);
            print_quietly(&out)
        }
        Command::Man { command } => man_page(&command),
        Command::Runner {
            socket,
            max_runs,
            buffer_events,
            buffer_bytes,
            log,
        } => paddock::runner::run(
            socket,
            &log,
            paddock::runner::Limits {
                live_runs: max_runs.max(1),
                events_per_run: buffer_events.max(1),
                bytes_per_run: buffer_bytes.max(paddock::runner::registry::MIN_BUFFER_BYTES),
                ..paddock::runner::Limits::default()
            },
        ),
        Command::Daemon {
            stop_grace_secs,
            kill_grace_secs,
            end_grace_secs,
            startup_timeout_secs,
            max_sessions,
            task_output_max_bytes,
            runner_buffer_events,
            runner_buffer_bytes,
            aria_socket,
            no_aria_socket,
            obey_socket,
            no_obey_socket,
            aria_workspace,
            aria_provider,
            aria_model,
            no_runner,
            allow_users,
            allow_groups,
            log,
        } => {
            log.init();
            let config = match paddock::config::load() {
                Ok(c) => c.map(|l| l.config).unwrap_or_default(),
                Err(e) => {
                    eprintln!("{}{e}", cli::client::DAEMON_ERROR);
                    std::process::exit(2);
                }
            };
            let d = &config.daemon;
            let pick = |flag: &str, given: u64, file: Option<&toml::Spanned<u64>>| match file {
                Some(v) if !daemon_flag(flag) => *v.get_ref(),
                _ => given,
            };
            let stop_grace_secs = pick(
                "stop_grace_secs",
                stop_grace_secs,
                d.stop_grace_secs.as_ref(),
            );
            let kill_grace_secs = pick(
                "kill_grace_secs",
                kill_grace_secs,
                d.kill_grace_secs.as_ref(),
            );
            let end_grace_secs = pick("end_grace_secs", end_grace_secs, d.end_grace_secs.as_ref());
            let startup_timeout_secs = pick(
                "startup_timeout_secs",
                startup_timeout_secs,
                d.startup_timeout_secs.as_ref(),
            );
            let max_sessions = match &d.max_sessions {
                Some(v) if !daemon_flag("max_sessions") => *v.get_ref(),
                _ => max_sessions,
            };
            let peers = match paddock::socket::Peers::parse(&allow_users, &allow_groups) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("{}{e}", cli::client::DAEMON_ERROR);
                    std::process::exit(2);
                }
            };
            let limits = paddock_core::Limits {
                stop_grace: paddock_core::Duration::from_secs(stop_grace_secs),
                kill_grace: paddock_core::Duration::from_secs(kill_grace_secs),
                end_grace: paddock_core::Duration::from_secs(end_grace_secs),
                startup_timeout: paddock_core::Duration::from_secs(startup_timeout_secs.max(1)),
                max_live_sessions: max_sessions,
                tasks: paddock_core::task::TaskLimits {
                    kill_grace: paddock_core::Duration::from_secs(kill_grace_secs),
                    max_output_bytes: task_output_max_bytes,
                    ..paddock_core::task::TaskLimits::default()
                },
            };
            let Some(aria_provider) = paddock_core::Provider::from_name(&aria_provider) else {
                eprintln!(
                    "{}unknown --aria-provider {aria_provider}",
                    cli::client::DAEMON_ERROR
                );
                std::process::exit(2);
            };
            let aria_socket =
                (!no_aria_socket).then(|| aria_socket.unwrap_or_else(paths::default_aria_socket));
            // obey's clients find the daemon at obey's path: served beside the default socket
            // (a daemon given a socket of its own, a test's, does not take obey's).
            let obey_socket = match (no_obey_socket, obey_socket) {
                (true, _) => None,
                (false, Some(path)) => Some(path),
                (false, None) if explicit_socket => None,
                (false, None) => paths::default_obey_socket(),
            };
            let aria_workspace = aria_workspace.unwrap_or_else(|| data_dir.join("aria-workspace"));
            // The runner never refuses what the daemon accepted.
            let live_runs = limits.max_live_sessions.max(1) + limits.tasks.max_live_tasks.max(1);
            let opts = daemon::Options {
                socket,
                data_dir,
                limits,
                aria_socket,
                obey_socket,
                aria_workspace,
                aria_provider,
                aria_model,
                use_runner: !no_runner,
                runner_limits: paddock::runner::Limits {
                    live_runs,
                    events_per_run: runner_buffer_events.max(1),
                    bytes_per_run: runner_buffer_bytes
                        .max(paddock::runner::registry::MIN_BUFFER_BYTES),
                    ..paddock::runner::Limits::default()
                },
                peers,
                notify: daemon::notify::Notifier::from_config(&config.notify),
            };
            let rt = paddock::serve::runtime().expect("tokio runtime");
            match rt.block_on(paddock::serve::run(opts)) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("{}{e}", cli::client::DAEMON_ERROR);
                    1
                }
            }
        }
        command => {
            let json = cli.json;
            let ctx = cli::Ctx {
                socket,
                data_dir,
                json,
                autostart: !cli.no_autostart,
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            let rt = std::mem::ManuallyDrop::new(rt);
            // The process exits once the command is done: its runtime is not torn down first
            // (its connection task, its timers; 0.05 ms), and a blocking read of stdin left
            // unanswered (a question a second Ctrl-C cut short) never holds the exit.
            cli::exit_code(
                rt.block_on(async move {
                    match command {
                        Command::Demo { message } => cli::demo::run(&ctx, &message).await,
                        Command::Campaign(c) => cli::campaign(&ctx, c).await,
                        Command::Approvals {
                            session,
                            watch,
                            all,
                            limit,
                        } => {
                            let args = cli::approvals::ListArgs {
                                session,
                                watch,
                                all,
                                limit,
                            };
                            cli::approvals::list(&ctx, args).await
                        }
                        Command::Approve { id } => {
                            let d = paddock_proto::obey::local::v1::ApprovalDecision::Approve;
                            cli::approvals::resolve(&ctx, id, d, String::new()).await
                        }
                        Command::Deny { id, reason } => {
                            let d = paddock_proto::obey::local::v1::ApprovalDecision::Deny;
                            cli::approvals::resolve(&ctx, id, d, reason).await
                        }
                        Command::Answer { id, text } => {
                            let d = paddock_proto::obey::local::v1::ApprovalDecision::Answer;
                            cli::approvals::resolve(&ctx, id, d, text).await
                        }
                        Command::Session(c) => cli::session(&ctx, c).await,
                        Command::Task(c) => cli::task::run(&ctx, c).await,
                        Command::Top => cli::top::run(&ctx).await,
                        Command::Doctor => cli::doctor::run(&ctx).await,
                        Command::Config(cli::ConfigCmd::Show) => cli::settings::show(&ctx),
                        Command::Ping => cli::ping(&ctx).await,
                        Command::State => cli::state(&ctx).await,
                        Command::Shutdown { force } => cli::shutdown(&ctx, force).await,
                        Command::Daemon { .. }
                        | Command::ScriptedAgent { .. }
                        | Command::JoinCgroups { .. }
                        | Command::SshRun { .. }
                        | Command::SshRunner { .. }
                        | Command::McpRelay { .. }
                        | Command::Bridge(_)
                        | Command::Completions { .. }
                        | Command::Man { .. }
                        | Command::Runner { .. } => unreachable!(),
                    }
                }),
                json,
            )
        }
    };
    std::process::exit(code);
}

/// `paddock man [COMMAND]…`: the page of paddock, or of one of its commands (the pages the
/// top page's SEE ALSO names), generated into memory, then written: a reader that stops early
/// (`| head`) ends the output quietly.
fn man_page(command: &[String]) -> i32 {
    use clap::CommandFactory;
    let mut cli = Cli::command();
    // Built, each subcommand has its page's name (paddock-session-create).
    cli.build();
    let mut page = &cli;
    for name in command {
        match page.find_subcommand(name) {
            Some(sub) => page = sub,
            None => {
                let known: Vec<&str> = page
                    .get_subcommands()
                    .filter(|c| !c.is_hide_set())
                    .map(|c| c.get_name())
                    .collect();
                eprintln!(
                    "error: no command \"{}\" has a page (those of {}: {})",
                    command.join(" "),
                    page.get_display_name().unwrap_or(page.get_name()),
                    known.join(", ")
                );
                return 2;
            }
        }
    }
    let mut out = Vec::new();
    match clap_mangen::Man::new(page.clone()).render(&mut out) {
        Ok(()) => print_quietly(&out),
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

/// A command line clap cannot parse (or `--help`, `--version`): as clap says it, but with
/// `--json` anywhere on the line an error is the same JSON object on stderr as every other
/// failure's (`error`, `exit_code`).
fn usage_error(e: clap::Error) -> ! {
    let json = std::env::args_os().any(|a| a == "--json");
    if json && e.use_stderr() {
        let text = e.render().to_string();
        let text = text.trim().strip_prefix("error: ").unwrap_or(text.trim());
        eprintln!(
            "{}",
            serde_json::json!({ "error": text, "exit_code": e.exit_code() })
        );
        std::process::exit(e.exit_code());
    }
    e.exit()
}

/// Writes `bytes` to stdout; a closed pipe is not an error.
fn print_quietly(bytes: &[u8]) -> i32 {
    use std::io::Write;
    match std::io::stdout().write_all(bytes) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}
