//! Provider adapters: how to start each agent and how to read its lines.
//!
//! An adapter turns the agent's own protocol into core [`ProviderEvent`]s and nothing more: no
//! adapter carries lifecycle logic (that is the core's). The built-in `scripted` agent and
//! Claude Code speak the same stream-json line protocol, so one parser serves both and every
//! scripted test exercises the Claude Code parser.

pub mod ask;
pub mod bridge;
pub mod claude_stream;
pub mod credentials;
mod lenient;
pub mod mcp;
pub mod scripted;
pub mod stream_json;

use std::path::{Path, PathBuf};

use paddock_core::{Error, ErrorCode, Provider, ProviderEvent, SessionConfig, SpawnSpec};

use paddock_sys::proc::LaunchPlan;

/// One parsed stdout line's consequences.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// Something for the core.
    Event(ProviderEvent),
    /// A line to write back on the agent's stdin (a permission answer).
    Reply(String),
    /// A line the parser does not know: kept in the log and counted, never fatal.
    Unrecognized(String),
}

/// Reads one agent's stdout, line by line.
pub trait LineParser: Send {
    fn parse_line(&mut self, line: &str) -> Vec<Parsed>;

    /// The agent is taken back mid-turn after a daemon restart: `tokens` (input, output) were
    /// already counted for the turn in progress.
    fn resume_turn(&mut self, tokens: (u64, u64)) {
        let _ = tokens;
    }
}

/// What a session may let its agent do without asking (`provider_config["permissions"]`):
/// the core's policy (the core applies it; bridges map it onto their agents' own flags).
pub use paddock_core::Policy as PermissionPolicy;

/// `provider_config["client_tools"]`: the tools a client runs (sunbeam's), offered to every
/// agent ([`paddock_core::AgentSettings::client_tools`]).
pub use paddock_core::CLIENT_TOOLS_KEY;

/// A new stream-json reader (Claude Code, the scripted agent, every bridge).
pub fn stream_json() -> Box<dyn LineParser> {
    stream_json_serving(Vec::new())
}

/// A stream-json reader that also serves paddock's MCP server with the client's `tools`
/// (Claude Code's client-side tools, [`mcp`]).
pub(crate) fn stream_json_serving(tools: Vec<bridge::openai::ClientTool>) -> Box<dyn LineParser> {
    Box::new(StreamJson {
        parser: claude_stream::ClaudeStreamParser::new(),
        client_tools: tools,
    })
}

/// The stream-json reader shared by Claude Code, the scripted agent and every bridge. A
/// permission prompt, question or client-tool call becomes a core `Ask` (the core answers it
/// by the session's policy or from a human); any other control request is refused at once.
struct StreamJson {
    parser: claude_stream::ClaudeStreamParser,
    /// The tools paddock's MCP server offers (none: it answers no `tools/call`).
    client_tools: Vec<bridge::openai::ClientTool>,
}

impl LineParser for StreamJson {
    fn resume_turn(&mut self, tokens: (u64, u64)) {
        self.parser.resume_turn(tokens);
    }

    fn parse_line(&mut self, line: &str) -> Vec<Parsed> {
        self.parser
            .parse_line(line)
            .into_iter()
            .map(|p| match p {
                claude_stream::Parsed::Event(e) => Parsed::Event(e),
                claude_stream::Parsed::Unrecognized(l) => Parsed::Unrecognized(l),
                claude_stream::Parsed::ControlRequest {
                    request_id,
                    subtype,
                    tool_name,
                    input,
                } if subtype == "mcp_message" => {
                    // `tool_name` is the server, `input` the JSON-RPC message (see
                    // `claude_stream::on_control_request`).
                    match mcp::handle(&request_id, &tool_name, &input, &self.client_tools) {
                        mcp::Step::Reply(line) => Parsed::Reply(line),
                        mcp::Step::Call {
                            key,
                            tool,
                            arguments,
                        } => {
                            let approval = ulid::Ulid::new().to_string().to_lowercase();
                            match ask::ask_event(approval, key, "client_tool", tool, &arguments) {
                                Some(ev) => Parsed::Event(ev),
                                None => unreachable!("client_tool is a request for the core"),
                            }
                        }
                    }
                }
                claude_stream::Parsed::ControlRequest {
                    request_id,
                    subtype,
                    tool_name,
                    input,
                } => {
                    let approval = ulid::Ulid::new().to_string().to_lowercase();
                    match ask::ask_event(approval, request_id.clone(), &subtype, tool_name, &input)
                    {
                        Some(ev) => Parsed::Event(ev),
                        // Hook callbacks, MCP messages, …: nothing paddock registered, so none
                        // should come; answer anyway, so the agent never waits on us.
                        None => Parsed::Reply(claude_stream::control_response_error(
                            &request_id,
                            &format!("paddock: control request {subtype:?} is not supported"),
                        )),
                    }
                }
            })
            .collect()
    }
}

/// The `control_response` line telling an agent the outcome of its request.
pub use ask::answer_line;

/// Checks a configuration at CreateSession: OBEY-2002 for a provider this build cannot run,
/// OBEY-2003 for a model it does not accept, OBEY-2004 for a missing CLI binary or a
/// provider_config this agent cannot run with (its settings were parsed where it came in:
/// [`paddock_core::ProviderConfig`]).
pub fn validate(config: &SessionConfig) -> Result<(), Error> {
    let policy = config.provider_config.policy();
    if policy.asks() && matches!(config.provider, Provider::Codex | Provider::Gemini) {
        // `codex exec` and `gemini -p` run without anyone to ask: they have no way to wait
        // for an answer. (Gemini over ACP, `--provider acp` with `gemini --acp`, can ask.)
        return Err(Error::new(
            ErrorCode::CreationFailed,
            format!(
                "permissions \"ask\" needs an agent that can wait for an answer; the {} CLI \
                 cannot (use allow-all, deny or allow:Tool1,Tool2{})",
                config.provider.name(),
                if config.provider == Provider::Gemini {
                    ", or run gemini over ACP: --provider acp --config command=\"gemini --acp\""
                } else {
                    ""
                }
            ),
        ));
    }
    match config.provider {
        Provider::Scripted => {
            check_model(config)?;
            if let Some(script) = &config.provider_config.agent().script {
                // A request names this file: only a regular file inside the campaign root, of
                // bounded size (a FIFO or /dev/zero must not stall or fill the daemon).
                let bad = |e: String| {
                    Error::new(
                        ErrorCode::CreationFailed,
                        format!("bad script {script}: {e}"),
                    )
                };
                let text = paddock_sys::confined::read(
                    Path::new(&config.working_dir),
                    script,
                    scripted::SCRIPT_BYTES_MAX,
                )
                .map_err(|e| bad(e.to_string()))?;
                scripted::parse_script(&text).map_err(|e| bad(e.to_string()))?;
            }
            Ok(())
        }
        Provider::ClaudeCode
        | Provider::Codex
        | Provider::Gemini
        | Provider::Acp
        | Provider::OpenClaw => {
            check_model(config)?;
            let argv = agent_command(config.provider, &config.provider_config)
                .map_err(|e| Error::new(ErrorCode::CreationFailed, e.to_string()))?;
            if config.provider == Provider::Codex {
                bridge::codex::validate_config(&config.provider_config)
                    .map_err(|e| Error::new(ErrorCode::CreationFailed, e.to_string()))?;
            }
            find_on_path(&argv[0], config).ok_or_else(|| {
                Error::new(
                    ErrorCode::CreationFailed,
                    format!(
                        "the {} CLI binary \"{}\" was not found on PATH",
                        config.provider.name(),
                        argv[0]
                    ),
                )
            })?;
            can_sign_in(config)
        }
        Provider::OpenAiApi => {
            if config.model.trim().is_empty() {
                return Err(Error::new(
                    ErrorCode::ModelNotSupported,
                    "the openai-api provider needs a model name (the endpoint's own, e.g. gpt-4.1)",
                ));
            }
            bridge::openai::check_config(&config.provider_config)
                .map_err(|e| Error::new(ErrorCode::CreationFailed, e.to_string()))?;
            openai_key_for_openai(config)
        }
    }
}

/// The agent's environment as it will see it: the session's variables over the daemon's.
fn agent_env(config: &SessionConfig) -> impl Fn(&str) -> Option<String> + '_ {
    |k: &str| {
        config
            .environment
            .get(k)
            .filter(|v| !v.is_empty())
            .cloned()
            .or_else(|| credentials::own_env(k))
    }
}

/// Agents that cannot sign in are refused at create, with what to do, instead of a session
/// that looks ready: Claude Code would fail every turn ("Not logged in · Please run /login"),
/// and codex does not fail at all — it waits for the network forever ("Reconnecting… waiting
/// for network"). What counts as signed in is [`credentials`]' (doctor's too).
fn can_sign_in(config: &SessionConfig) -> Result<(), Error> {
    if config.env.driver.is_remote() {
        // Its login is the other machine's, which this one cannot see.
        return Ok(());
    }
    let env = agent_env(config);
    let (found, advice) = match config.provider {
        Provider::ClaudeCode => (
            credentials::claude(&env, Path::new(&config.working_dir)),
            "claude-code is not logged in here (no $ANTHROPIC_API_KEY, $ANTHROPIC_AUTH_TOKEN or \
             $CLAUDE_CODE_OAUTH_TOKEN, no ~/.claude/.credentials.json from /login, no apiKeyHelper), \
             so every turn would fail with \"Not logged in\": run `claude` once and /login, or pass \
             --env ANTHROPIC_API_KEY=…; `paddock doctor` checks",
        ),
        Provider::Codex => (
            credentials::codex(&env, &config.provider_config),
            "codex has no credentials here (no $OPENAI_API_KEY or $CODEX_API_KEY, no auth.json from \
             `codex login`), and without them it waits for the network forever: run `codex login`, \
             or pass --env OPENAI_API_KEY=…; `paddock doctor` checks",
        ),
        _ => return Ok(()),
    };
    match found {
        Some(_) => Ok(()),
        None => Err(Error::new(ErrorCode::CreationFailed, advice)),
    }
}

/// OpenAI's own endpoint answers nothing without a key: a session for it without one is
/// refused at create (with what to do), not left to fail its first turn. Another endpoint (a
/// local server) may need none.
fn openai_key_for_openai(config: &SessionConfig) -> Result<(), Error> {
    let env = agent_env(config);
    let setting = |config_key: &str, env_key: &str| {
        config
            .provider_config
            .get(config_key)
            .filter(|v| !v.is_empty())
            .cloned()
            .or_else(|| env(env_key))
    };
    let base = setting("base_url", "OPENAI_BASE_URL")
        .unwrap_or_else(|| "https://api.openai.com/v1".into());
    let openai = base
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split(['/', ':']).next())
        .is_some_and(|host| host == "api.openai.com");
    if openai && setting("api_key", "OPENAI_API_KEY").is_none() {
        return Err(Error::new(
            ErrorCode::CreationFailed,
            format!(
                "the openai-api provider has no key for {base}: pass --env OPENAI_API_KEY=… \
                 (or set it in the daemon's environment, or --config api_key=…), or point \
                 --config base_url= at a server that needs none (e.g. http://localhost:11434/v1)"
            ),
        ));
    }
    Ok(())
}

/// OBEY-2003 for a model the provider's own service cannot serve, caught at CreateSession
/// rather than at the first turn. Only the plain vendor endpoints are judged: with a custom
/// endpoint (`ANTHROPIC_BASE_URL`, Bedrock/Vertex, `GOOGLE_GEMINI_BASE_URL`, a codex
/// `model_provider`) any name may be valid, so any name is accepted. ACP agents list their
/// models only once started: the bridge checks the name against that list (the session then
/// fails with the list in its reason). The openai-api loop needs a name; its endpoint judges it.
pub fn check_model(config: &SessionConfig) -> Result<(), Error> {
    let model = config.model.trim();
    if model.is_empty() {
        return Ok(());
    }
    let env_set = |k: &str| {
        config.environment.get(k).is_some_and(|v| !v.is_empty())
            || std::env::var_os(k).is_some_and(|v| !v.is_empty())
    };
    let (ok, expected) = match config.provider {
        Provider::ClaudeCode => (
            env_set("ANTHROPIC_BASE_URL")
                || env_set("CLAUDE_CODE_USE_BEDROCK")
                || env_set("CLAUDE_CODE_USE_VERTEX")
                || model.starts_with("claude-")
                || CLAUDE_ALIASES.contains(&model.trim_end_matches("[1m]")),
            "a Claude model (sonnet, opus, haiku, opusplan, or a claude-… name)",
        ),
        Provider::Codex => (
            config
                .provider_config
                .values()
                .any(|v| v.contains("model_provider"))
                || ["gpt-", "o1", "o3", "o4", "codex-"]
                    .iter()
                    .any(|p| model.starts_with(p)),
            "an OpenAI model codex can use (gpt-…, o3…, o4…, codex-…)",
        ),
        Provider::Gemini => (
            env_set("GOOGLE_GEMINI_BASE_URL")
                || env_set("GOOGLE_GENAI_USE_VERTEXAI")
                || model.starts_with("gemini-")
                || GEMINI_ALIASES.contains(&model),
            "a Gemini model (auto, pro, flash, flash-lite, or a gemini-… name)",
        ),
        Provider::Scripted => (model == "scripted", "\"scripted\""),
        Provider::Acp | Provider::OpenClaw | Provider::OpenAiApi => (true, ""),
    };
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            ErrorCode::ModelNotSupported,
            format!(
                "{} does not serve model \"{model}\": expected {expected}",
                config.provider.name()
            ),
        ))
    }
}

/// The model aliases Claude Code accepts for `--model`.
const CLAUDE_ALIASES: &[&str] = &["default", "sonnet", "opus", "haiku", "best", "opusplan"];
/// The model aliases gemini-cli accepts for `-m`.
const GEMINI_ALIASES: &[&str] = &["auto", "pro", "flash", "flash-lite"];

/// Why a provider has no command line to start.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(
        "the acp provider needs provider_config.command: the agent's command line \
         (e.g. \"gemini --acp\")"
    )]
    AcpNeedsCommand,
    #[error("provider {} runs no CLI", .0.name())]
    NoCli(Provider),
}

/// The command line that starts a CLI agent: `provider_config["command"]` (split like a shell
/// would where the configuration came in, so `"openclaw acp"` or `"/opt/bin/gemini --acp"`
/// work), else the provider's default.
pub fn agent_command(
    provider: Provider,
    provider_config: &paddock_core::ProviderConfig,
) -> Result<Vec<String>, CommandError> {
    if let Some(argv) = &provider_config.agent().command {
        return Ok(argv.clone());
    }
    let argv: &[&str] = match provider {
        Provider::ClaudeCode => &["claude"],
        Provider::Codex => &["codex"],
        Provider::Gemini => &["gemini"],
        Provider::OpenClaw => &["openclaw", "acp"],
        Provider::Acp => return Err(CommandError::AcpNeedsCommand),
        other => return Err(CommandError::NoCli(other)),
    };
    Ok(argv.iter().map(|a| a.to_string()).collect())
}

/// Resolves a program name the way a shell would (a name with a slash is taken as a path),
/// on the session's own `PATH` if its environment sets one (the agent runs with it), else the
/// daemon's.
pub fn find_on_path(program: &str, config: &SessionConfig) -> Option<PathBuf> {
    if config.env.driver == paddock_core::Driver::Podman || config.env.driver.is_remote() {
        // In a container the agent is the image's own, found on the image's PATH when it
        // starts there (`podman exec` says so if it is not); on another machine (ssh, a VM),
        // that machine's.
        return Some(PathBuf::from(program));
    }
    match config.environment.get("PATH") {
        Some(p) => paddock_sys::paths::find_program(program, Some(std::ffi::OsStr::new(p))),
        None => paddock_sys::paths::find_on_own_path(program),
    }
}

/// `provider_config["system_prompt"]`: text for the agent's system prompt (sunbeam's project
/// context, or a user's own). Claude Code and the scripted agent get it with
/// `--append-system-prompt` (added to their own prompt); the openai-api loop uses it as its
/// system message. The other agents have no such channel (`Provider::takes_system_prompt`):
/// the core gives them the text with the session's first message.
pub use paddock_core::SYSTEM_PROMPT_KEY;

/// `--append-system-prompt TEXT` when the session has a system prompt (an empty one is none).
fn system_prompt_args(config: &SessionConfig) -> Vec<String> {
    match config.provider_config.system_prompt() {
        Some(text) => vec!["--append-system-prompt".into(), text.to_string()],
        None => Vec::new(),
    }
}

/// Why a session's agent cannot be started: its run fails (`SpawnFailed`, with this text).
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("the claude-code CLI binary \"{0}\" was not found")]
    NotFound(String),
}

/// The line that asks a started agent of `provider` to say it takes messages (the core's
/// `AskReady`): Claude Code is asked a cheap question of its control channel
/// ([`stream_json::STATUS_REQUEST`]), every agent of paddock's own (the scripted agent, the
/// bridges) `initialize` ([`stream_json::READY_REQUEST`]). Either answer reads as `Ready`.
pub fn ready_request(provider: Provider) -> &'static str {
    match provider {
        Provider::ClaudeCode => stream_json::STATUS_REQUEST,
        Provider::Scripted
        | Provider::Codex
        | Provider::Gemini
        | Provider::Acp
        | Provider::OpenClaw
        | Provider::OpenAiApi => stream_json::READY_REQUEST,
    }
}

/// How to start the provider of `spec`, and the parser for its output.
pub fn plan(spec: &SpawnSpec, exe: &Path) -> Result<(LaunchPlan, Box<dyn LineParser>), PlanError> {
    let config = &spec.config;
    let cwd = PathBuf::from(&config.working_dir);
    let mut env: Vec<(String, String)> = config
        .environment
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut parser = stream_json();
    let plan = match config.provider {
        Provider::Scripted => {
            let mut args = vec!["__scripted-agent".to_string()];
            if let Some(script) = &config.provider_config.agent().script {
                args.push("--script".into());
                args.push(cwd.join(script).display().to_string());
            }
            args.extend(system_prompt_args(config));
            LaunchPlan {
                program: exe.to_path_buf(),
                args,
                env,
                cwd,
            }
        }
        Provider::ClaudeCode => {
            let argv = agent_command(config.provider, &config.provider_config)?;
            let program = find_on_path(&argv[0], config)
                .ok_or_else(|| PlanError::NotFound(argv[0].clone()))?;
            // Checked against the real CLI (2.1.330, tests/providers): `--verbose` is required
            // for stream-json output in `-p` mode; `--permission-prompt-tool stdio` makes it ask
            // us (`control_request` / `can_use_tool` on stdout, our `control_response` on
            // stdin) — without it, in `-p` mode, it denies every tool that needs permission
            // ("Claude requested permissions to write to …, but you haven't granted it yet").
            // This works as root too (only `--permission-mode bypassPermissions` needs
            // IS_SANDBOX=1 there). `--resume <session_id>` continues the conversation stored
            // under `$HOME/.claude/projects/<cwd>/`, under the same id, so it needs the same
            // HOME and working directory; a lost conversation makes the CLI exit 1 at start
            // ("No conversation found with session ID: …" on stderr).
            // A command line's own arguments come first (`command="claude --debug"`).
            let mut args: Vec<String> = argv[1..].to_vec();
            args.extend(
                [
                    "-p",
                    "--input-format",
                    "stream-json",
                    "--output-format",
                    "stream-json",
                    "--verbose",
                    "--permission-prompt-tool",
                    "stdio",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            if !config.model.is_empty() {
                args.push("--model".into());
                args.push(config.model.clone());
            }
            if let Some(resume) = &spec.resume {
                args.push("--resume".into());
                args.push(resume.clone());
            }
            args.extend(system_prompt_args(config));
            // The client's own tools, served over the control channel (paddock's MCP server).
            let tools = config.provider_config.agent().client_tools.clone();
            args.extend(mcp::claude_args(&tools));
            parser = stream_json_serving(tools);
            // No telemetry, update checks or other side traffic from a supervised agent,
            // unless the session's environment says otherwise.
            if !env
                .iter()
                .any(|(k, _)| k == "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC")
            {
                env.push((
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
                    "1".into(),
                ));
            }
            LaunchPlan {
                program,
                args,
                env,
                cwd,
            }
        }
        Provider::Codex
        | Provider::Gemini
        | Provider::Acp
        | Provider::OpenClaw
        | Provider::OpenAiApi => {
            let kind = match config.provider {
                Provider::Codex => "codex",
                Provider::Gemini => "gemini",
                Provider::OpenAiApi => "openai",
                _ => "acp",
            };
            let mut provider_config = config.provider_config.as_map().clone();
            if config.provider == Provider::OpenClaw && !provider_config.contains_key("command") {
                provider_config.insert("command".into(), "openclaw acp".into());
            }
            let mut args = vec![
                "__bridge".to_string(),
                kind.to_string(),
                "--model".into(),
                config.model.clone(),
            ];
            // In the environment, not on the command line: provider_config may hold a key,
            // and any local user can read a process's arguments.
            env.push((
                bridge::CONFIG_ENV.into(),
                serde_json::to_string(&provider_config).expect("strings serialise"),
            ));
            if let Some(resume) = &spec.resume {
                args.push("--resume".into());
                args.push(resume.clone());
            }
            LaunchPlan {
                program: exe.to_path_buf(),
                args,
                env,
                cwd,
            }
        }
    };
    Ok((plan, parser))
}

/// The stdin line that delivers one user message. Every agent process speaks stream-json:
/// natively (Claude Code, the scripted agent) or through its [`bridge`].
pub fn user_message_line(text: &str) -> String {
    claude_stream::user_message_line(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_policies_parse() {
        assert_eq!(
            PermissionPolicy::parse(None),
            Ok(PermissionPolicy::AllowAll)
        );
        assert_eq!(
            PermissionPolicy::parse(Some("deny")),
            Ok(PermissionPolicy::Deny)
        );
        let p = PermissionPolicy::parse(Some("allow: Read, LS")).unwrap();
        assert!(p.allows("LS") && p.allows("Read") && !p.allows("Bash"));
        assert!(PermissionPolicy::parse(Some("maybe")).is_err());
    }

    fn claude_spec() -> SpawnSpec {
        let mut c = SessionConfig::new("c", Provider::ClaudeCode, "/tmp");
        c.provider_config
            .insert("command", "/bin/sh")
            .expect("a valid setting");
        c.model = "claude-x".into();
        SpawnSpec {
            config: c,
            resume: None,
            restart_count: 0,
        }
    }

    #[test]
    fn claude_code_launch() {
        let mut spec = claude_spec();
        let (p, _) = plan(&spec, Path::new("/paddock")).unwrap();
        assert_eq!(p.program, PathBuf::from("/bin/sh"));
        assert_eq!(
            p.args.join(" "),
            "-p --input-format stream-json --output-format stream-json --verbose \
             --permission-prompt-tool stdio --model claude-x"
        );
        assert_eq!(p.cwd, PathBuf::from("/tmp"));
        assert!(p.env.contains(&(
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
            "1".into()
        )));
        // A restart continues the conversation; the session's own environment wins.
        spec.resume = Some("9f0c".into());
        spec.config.model.clear();
        spec.config.environment.insert(
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
            "0".into(),
        );
        let (p, _) = plan(&spec, Path::new("/paddock")).unwrap();
        assert!(
            p.args.ends_with(&["--resume".into(), "9f0c".into()]),
            "{:?}",
            p.args
        );
        assert!(!p.args.contains(&"--model".to_string()));
        // A system prompt (sunbeam's project context) is appended to Claude Code's own.
        spec.config
            .provider_config
            .insert(SYSTEM_PROMPT_KEY, "Project: /x\nbranch main")
            .expect("a valid setting");
        let (p, _) = plan(&spec, Path::new("/paddock")).unwrap();
        assert!(
            p.args.ends_with(&[
                "--append-system-prompt".into(),
                "Project: /x\nbranch main".into()
            ]),
            "{:?}",
            p.args
        );
        spec.config
            .provider_config
            .insert(SYSTEM_PROMPT_KEY, " ")
            .expect("a valid setting");
        let (p, _) = plan(&spec, Path::new("/paddock")).unwrap();
        assert!(!p.args.contains(&"--append-system-prompt".to_string()));
        spec.config.provider_config.remove(SYSTEM_PROMPT_KEY);
        let v: Vec<_> = p
            .env
            .iter()
            .filter(|(k, _)| k == "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC")
            .collect();
        assert_eq!(
            v,
            [&(
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
                "0".into()
            )]
        );
    }

    #[test]
    fn scripted_launch_passes_the_system_prompt() {
        let mut c = SessionConfig::new("c", Provider::Scripted, "/tmp");
        c.provider_config
            .insert(SYSTEM_PROMPT_KEY, "ctx")
            .expect("a valid setting");
        let spec = SpawnSpec {
            config: c,
            resume: None,
            restart_count: 0,
        };
        let (p, _) = plan(&spec, Path::new("/paddock")).unwrap();
        assert_eq!(
            p.args,
            ["__scripted-agent", "--append-system-prompt", "ctx"]
        );
        assert!(Provider::Scripted.takes_system_prompt());
        assert!(!Provider::Codex.takes_system_prompt());
    }

    #[test]
    fn permission_prompts_go_to_the_core_and_other_requests_are_refused() {
        let spec = claude_spec();
        let (_, mut parser) = plan(&spec, Path::new("/paddock")).unwrap();
        let out = parser.parse_line(
            r#"{"type":"control_request","request_id":"r1","request":{"subtype":"can_use_tool","tool_name":"Bash","input":{"command":"ls"},"tool_use_id":"t"}}"#,
        );
        // The core decides (by the session's policy, or a human): the parser only asks.
        match &out[..] {
            [Parsed::Event(ProviderEvent::Ask(paddock_core::Ask {
                approval,
                key,
                kind,
                tool,
                summary,
                ..
            }))] => {
                assert_eq!(approval.len(), 26, "a ULID");
                assert_eq!(
                    (key.as_str(), *kind, tool.as_str(), summary.as_str()),
                    ("r1", paddock_core::AskKind::Permission, "Bash", "Bash: ls")
                );
            }
            other => panic!("not one Ask: {other:?}"),
        }
        // Not a question for a human: an error answer, so the agent does not wait for one.
        let out = parser.parse_line(
            r#"{"type":"control_request","request_id":"r3","request":{"subtype":"hook_callback","callback_id":"c"}}"#,
        );
        let [Parsed::Reply(r)] = &out[..] else {
            panic!("not one reply: {out:?}")
        };
        let r: serde_json::Value = serde_json::from_str(r).unwrap();
        assert_eq!(r["response"]["subtype"], "error");
        assert_eq!(r["response"]["request_id"], "r3");
    }

    #[test]
    fn ask_is_refused_for_agents_that_cannot_wait_for_an_answer() {
        let mut c = SessionConfig::new("c", Provider::Codex, "/tmp");
        c.provider_config
            .insert("permissions", "ask")
            .expect("a valid setting");
        let e = validate(&c).unwrap_err();
        assert_eq!(e.code, ErrorCode::CreationFailed);
        assert!(e.message.contains("cannot"), "{e}");
        c.provider = Provider::Scripted;
        // Refused where the map comes in, before any agent's check.
        let e = c
            .provider_config
            .insert("approval_timeout", "soon")
            .unwrap_err();
        assert_eq!(e.key, "approval_timeout");
        assert_eq!(paddock_core::Error::from(e).code, ErrorCode::CreationFailed);
    }

    /// A session of `provider` whose CLI (`program`, an empty file) exists, in a temporary
    /// HOME with an empty `config_dir`: signed in nowhere.
    fn signed_out(
        provider: Provider,
        program: &str,
        config_dir: &str,
    ) -> (tempfile::TempDir, SessionConfig) {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join(program);
        std::fs::write(&bin, "").unwrap();
        let home = tmp.path().join("home");
        std::fs::create_dir_all(home.join(config_dir)).unwrap();
        let mut c = SessionConfig::new("c", provider, &tmp.path().display().to_string());
        c.provider_config
            .insert("command", bin.display().to_string())
            .expect("a valid setting");
        c.environment
            .insert("HOME".into(), home.display().to_string());
        (tmp, c)
    }

    #[test]
    fn codex_without_credentials_is_refused_at_create() {
        if ["OPENAI_API_KEY", "CODEX_API_KEY", "CODEX_HOME"]
            .iter()
            .any(|k| std::env::var_os(k).is_some())
        {
            return;
        }
        let (tmp, mut c) = signed_out(Provider::Codex, "codex", ".codex");
        let home = tmp.path().join("home");
        let e = validate(&c).unwrap_err();
        assert_eq!(e.code, ErrorCode::CreationFailed);
        assert!(e.message.contains("codex login"), "{e}");
        // A login, a key, or a custom model provider is enough.
        std::fs::write(home.join(".codex/auth.json"), "{}").unwrap();
        assert!(validate(&c).is_ok());
        std::fs::remove_file(home.join(".codex/auth.json")).unwrap();
        c.environment.insert("OPENAI_API_KEY".into(), "sk-x".into());
        assert!(validate(&c).is_ok());
    }

    #[test]
    fn claude_code_that_is_not_logged_in_is_refused_at_create() {
        if credentials::CLAUDE_KEYS
            .iter()
            .chain(&[
                "CLAUDE_CONFIG_DIR",
                "CLAUDE_CODE_USE_BEDROCK",
                "CLAUDE_CODE_USE_VERTEX",
            ])
            .any(|k| std::env::var_os(k).is_some())
            || Path::new("/etc/claude-code/managed-settings.json").exists()
        {
            return;
        }
        let (tmp, mut c) = signed_out(Provider::ClaudeCode, "claude", ".claude");
        let home = tmp.path().join("home");
        let e = validate(&c).unwrap_err();
        assert_eq!(e.code, ErrorCode::CreationFailed);
        assert!(
            e.message.contains("/login") && e.message.contains("--env ANTHROPIC_API_KEY"),
            "{e}"
        );
        // A login, or a key given to the session, is enough.
        std::fs::write(home.join(".claude/.credentials.json"), "{}").unwrap();
        assert!(validate(&c).is_ok());
        std::fs::remove_file(home.join(".claude/.credentials.json")).unwrap();
        c.environment
            .insert("ANTHROPIC_API_KEY".into(), "sk-ant-x".into());
        assert!(validate(&c).is_ok());
    }

    #[test]
    fn openai_without_a_key_is_refused_at_create_with_what_to_do() {
        // The daemon's own environment may hold a key; this test must not depend on it.
        if std::env::var_os("OPENAI_API_KEY").is_some() {
            return;
        }
        let mut c = SessionConfig::new("c", Provider::OpenAiApi, "/tmp");
        c.model = "gpt-4.1".into();
        let e = validate(&c).unwrap_err();
        assert_eq!(e.code, ErrorCode::CreationFailed);
        assert!(
            e.message.contains("OPENAI_API_KEY") && e.message.contains("base_url"),
            "{e}"
        );
        c.environment
            .insert("OPENAI_API_KEY".into(), "sk-test".into());
        assert!(validate(&c).is_ok());
        c.environment.clear();
        c.provider_config
            .insert("base_url", "http://localhost:11434/v1")
            .expect("a valid setting");
        assert!(validate(&c).is_ok(), "a local server may need no key");
    }

    #[test]
    fn missing_binaries_are_2004_and_bad_models_2003() {
        let mut c = SessionConfig::new("c", Provider::Codex, "/tmp");
        c.provider_config
            .insert("command", "no-such-codex --flag")
            .expect("a valid setting");
        let e = validate(&c).unwrap_err();
        assert_eq!(e.code, ErrorCode::CreationFailed);
        assert!(e.message.contains("\"no-such-codex\""), "{e}");
        c.provider_config = Default::default();
        c.provider = Provider::Acp;
        assert_eq!(validate(&c).unwrap_err().code, ErrorCode::CreationFailed);
        c.provider = Provider::OpenAiApi;
        assert_eq!(validate(&c).unwrap_err().code, ErrorCode::ModelNotSupported);
        // Vendor endpoints: a model of another vendor is refused, with what is expected.
        for (p, bad, good) in [
            (Provider::ClaudeCode, "gpt-5.5", "claude-sonnet-9"),
            (Provider::ClaudeCode, "gemini-3", "opus[1m]"),
            (Provider::Codex, "claude-opus-5", "gpt-5.5"),
            (Provider::Gemini, "gpt-5.5", "gemini-2.5-flash"),
        ] {
            let mut c = SessionConfig::new("c", p, "/tmp");
            c.model = bad.into();
            let e = check_model(&c).unwrap_err();
            assert_eq!(e.code, ErrorCode::ModelNotSupported, "{p:?} {bad}");
            assert!(e.message.contains(bad), "{e}");
            c.model = good.into();
            assert!(check_model(&c).is_ok(), "{p:?} {good}");
        }
        // A custom endpoint may serve any name.
        let mut c = SessionConfig::new("c", Provider::ClaudeCode, "/tmp");
        c.model = "my-local-model".into();
        c.environment
            .insert("ANTHROPIC_BASE_URL".into(), "http://127.0.0.1:9".into());
        assert!(check_model(&c).is_ok());
        c.provider = Provider::Scripted;
        c.model = "gpt-9".into();
        assert_eq!(validate(&c).unwrap_err().code, ErrorCode::ModelNotSupported);
        c.model = String::new();
        assert!(validate(&c).is_ok());
        c.provider = Provider::ClaudeCode;
        c.provider_config
            .insert("command", "definitely-not-a-claude-binary")
            .expect("a valid setting");
        let e = validate(&c).unwrap_err();
        assert_eq!(e.code, ErrorCode::CreationFailed);
        assert!(e.message.contains("definitely-not-a-claude-binary"));
    }
}
