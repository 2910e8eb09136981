//! A session's `provider_config`: the string map a client sends and an agent reads, with
//! what paddock itself decides from it parsed once, where the map comes in.
//!
//! The map enters at the edges: a create or a restart (the protocol modules) and a stored
//! row (the store). Each builds a [`ProviderConfig`] with [`ProviderConfig::parse`], which
//! refuses an invalid value; past that point paddock reads typed settings and never parses a
//! string again: the permission policy, how long a request waits and what happens then, the
//! agent's own settings paddock acts on ([`AgentSettings`]: its command line, its script, its
//! system prompt, the tools its client runs) and where the session comes from (its sunbeam
//! project). An agent's other
//! options (a codex profile, an endpoint) stay in the map for the bridges, separate processes
//! that get the map in their environment.

use std::collections::BTreeMap;
use std::fmt;

use crate::approval::{ApprovalSettings, Policy};

/// The key of the permission policy ([`Policy`]).
pub const PERMISSIONS: &str = "permissions";

/// The key of the agent's command line (split as a shell would: `"gemini --acp"`).
pub const COMMAND_KEY: &str = "command";

/// The key of the scripted agent's script (a file in the campaign root).
pub const SCRIPT_KEY: &str = "script";

/// The key of text for the agent's system prompt (sunbeam's project context, or a user's
/// own). An agent with a channel for it gets it there; the others get it ahead of the
/// session's first message ([`crate::Provider::takes_system_prompt`]).
pub const SYSTEM_PROMPT_KEY: &str = "system_prompt";

/// The key of the tools the session's client runs (sunbeam's `client_tools`): a JSON list of
/// `{"name", "description", "schema_json"}` (`schema_json` a JSON schema as text, or
/// `parameters` as an object), offered to the agent ([`ClientTool`]).
pub const CLIENT_TOOLS_KEY: &str = "client_tools";

/// At most this many client tools.
pub const CLIENT_TOOLS_MAX: usize = 64;

/// The openai-api loop's own tools: no client tool may take one of their names.
pub const OWN_TOOLS: [&str; 4] = ["shell", "read_file", "write_file", "list_dir"];

/// Where a system prompt starts and ends when it goes ahead of a first message.
const PROMPT_OPEN: &str = "<project-context>\n";
const PROMPT_CLOSE: &str = "\n</project-context>\n\n";

/// The first message of a session whose agent takes no system prompt, as the agent gets it:
/// the prompt, marked, then the message. The message is stored without it.
pub fn with_system_prompt(prompt: &str, message: &str) -> String {
    format!("{PROMPT_OPEN}{prompt}{PROMPT_CLOSE}{message}")
}

/// `text` without a system prompt put ahead of it (as messages stored by older versions,
/// which stored what the agent got, carry it).
pub fn without_system_prompt(text: &str) -> &str {
    text.strip_prefix(PROMPT_OPEN)
        .and_then(|rest| rest.split_once(PROMPT_CLOSE))
        .map(|(_, message)| message)
        .unwrap_or(text)
}

/// A `provider_config` whose settings are valid (see the module documentation).
///
/// The default is the empty map: every tool allowed, requests wait the default time and are
/// then denied, exactly what parsing an empty map gives.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProviderConfig {
    map: BTreeMap<String, String>,
    policy: Policy,
    approvals: ApprovalSettings,
    /// Boxed: a configuration travels in every create and restart input.
    agent: Box<AgentSettings>,
    project: Option<String>,
}

/// The settings of the agent paddock itself acts on, parsed from the map.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AgentSettings {
    /// The command line that starts it, split into its argv (never empty); none: the
    /// provider's own.
    pub command: Option<Vec<String>>,
    /// The scripted agent's script (a path in the campaign root).
    pub script: Option<String>,
    /// Text for its system prompt (none when empty).
    pub system_prompt: Option<String>,
    /// The tools the session's client runs, offered to the agent (none: no client tools).
    pub client_tools: Vec<ClientTool>,
}

/// A tool the session's client runs (a sunbeam `ToolDef`): offered to the agent next to its
/// own; a call becomes a client-tool request the client answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTool {
    /// A word (letters, digits, `_`, `-`; at most 64), unique in the list.
    pub name: String,
    pub description: String,
    /// The JSON schema of its arguments (an object).
    pub parameters: serde_json::Value,
}

impl ClientTool {
    /// `provider_config["client_tools"]` (see [`CLIENT_TOOLS_KEY`]).
    fn parse_list(text: &str) -> Result<Vec<ClientTool>, ClientToolsError> {
        use serde_json::Value;
        let list: Vec<Value> =
            serde_json::from_str(text).map_err(|e| ClientToolsError::NotAList(e.to_string()))?;
        if list.len() > CLIENT_TOOLS_MAX {
            return Err(ClientToolsError::TooMany(list.len()));
        }
        let mut tools: Vec<ClientTool> = Vec::with_capacity(list.len());
        for t in &list {
            let name = t["name"].as_str().unwrap_or("").trim().to_string();
            if name.is_empty()
                || OWN_TOOLS.contains(&name.as_str())
                || tools.iter().any(|o| o.name == name)
            {
                return Err(ClientToolsError::NameNotItsOwn(name));
            }
            // A name is a word (it becomes part of an agent's tool list and flags: a comma or
            // a space must never smuggle in another tool).
            let word = name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !word {
                return Err(ClientToolsError::NameNotAWord(name));
            }
            let parameters = match (&t["parameters"], t["schema_json"].as_str()) {
                (p @ Value::Object(_), _) => p.clone(),
                (p, _) if !p.is_null() => {
                    return Err(ClientToolsError::ParametersNotAnObject {
                        tool: name,
                        parameters: p.clone(),
                    })
                }
                (_, Some(s)) if !s.trim().is_empty() => match serde_json::from_str::<Value>(s) {
                    Ok(p @ Value::Object(_)) => p,
                    Ok(other) => {
                        return Err(ClientToolsError::SchemaNotAnObject {
                            tool: name,
                            schema: other,
                        })
                    }
                    Err(e) => {
                        return Err(ClientToolsError::SchemaNotJson {
                            tool: name,
                            error: e.to_string(),
                        })
                    }
                },
                _ => serde_json::json!({"type": "object", "properties": {}}),
            };
            tools.push(ClientTool {
                name,
                description: t["description"].as_str().unwrap_or("").to_string(),
                parameters,
            });
        }
        Ok(tools)
    }
}

/// Why `provider_config["client_tools"]` is not a list of tools (see [`CLIENT_TOOLS_KEY`]).
/// JSON parse errors are carried as their text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientToolsError {
    #[error("provider_config.client_tools is not a JSON list: {0}")]
    NotAList(String),
    /// The list has this many tools, more than [`CLIENT_TOOLS_MAX`].
    #[error("provider_config.client_tools: at most {CLIENT_TOOLS_MAX} tools")]
    TooMany(usize),
    /// A tool's name is empty, one of [`OWN_TOOLS`] or an earlier tool's.
    #[error(
        "provider_config.client_tools: every tool needs a name of its own, not one \
         of paddock's own ({0:?})"
    )]
    NameNotItsOwn(String),
    /// A tool's name is not a word (letters, digits, `_`, `-`; at most 64).
    #[error(
        "provider_config.client_tools: tool name {0:?}: use at most 64 letters, \
         digits, _ and -"
    )]
    NameNotAWord(String),
    #[error(
        "provider_config.client_tools: {tool}'s parameters are not a JSON \
         object: {parameters}"
    )]
    ParametersNotAnObject {
        tool: String,
        parameters: serde_json::Value,
    },
    #[error(
        "provider_config.client_tools: {tool}'s schema_json is not a \
         JSON object: {schema}"
    )]
    SchemaNotAnObject {
        tool: String,
        schema: serde_json::Value,
    },
    #[error("provider_config.client_tools: {tool}'s schema_json: {error}")]
    SchemaNotJson { tool: String, error: String },
}

impl AgentSettings {
    fn parse(map: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let text = |key: &str| map.get(key).filter(|v| !v.trim().is_empty()).cloned();
        let command = match text(COMMAND_KEY) {
            None => None,
            Some(line) => match shlex::split(line.trim()) {
                Some(argv) if !argv.is_empty() => Some(argv),
                _ => {
                    return Err(ConfigError {
                        key: COMMAND_KEY,
                        reason: format!("provider_config.command is not a command line: {line:?}"),
                    })
                }
            },
        };
        let client_tools = match text(CLIENT_TOOLS_KEY) {
            None => Vec::new(),
            Some(list) => ClientTool::parse_list(&list).map_err(|e| ConfigError {
                key: CLIENT_TOOLS_KEY,
                reason: e.to_string(),
            })?,
        };
        Ok(AgentSettings {
            command,
            script: text(SCRIPT_KEY),
            system_prompt: text(SYSTEM_PROMPT_KEY),
            client_tools,
        })
    }
}

/// A `provider_config` value paddock cannot use: which key, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub key: &'static str,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for ConfigError {}

impl ProviderConfig {
    /// The one place a map becomes settings.
    pub fn parse(map: BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let policy =
            Policy::parse(map.get(PERMISSIONS).map(String::as_str)).map_err(|e| ConfigError {
                key: PERMISSIONS,
                reason: e.to_string(),
            })?;
        let approvals = ApprovalSettings::parse(&map)?;
        let agent = Box::new(AgentSettings::parse(&map)?);
        let project = map.get(crate::PROJECT_KEY).cloned();
        Ok(ProviderConfig {
            map,
            policy,
            approvals,
            agent,
            project,
        })
    }

    /// This configuration with one more entry (parsed again: the key may be a setting).
    pub fn with(
        mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        self.insert(key, value)?;
        Ok(self)
    }

    /// Sets one entry, parsed again as [`ProviderConfig::with`]; a refused value leaves the
    /// configuration as it was.
    pub fn insert(
        &mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<Option<String>, ConfigError> {
        let mut map = self.map.clone();
        let old = map.insert(key.into(), value.into());
        *self = Self::parse(map)?;
        Ok(old)
    }

    /// Takes one entry out. Each setting is parsed from its own key, and a missing key is its
    /// default: what is left is valid.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        let mut map = std::mem::take(&mut self.map);
        let old = map.remove(key);
        *self = Self::parse(map).expect("a valid configuration less one key is valid");
        old
    }

    /// What the agent may do without asking.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// How long a request waits for a human and what happens then.
    pub fn approvals(&self) -> ApprovalSettings {
        self.approvals
    }

    /// The agent's settings paddock acts on.
    pub fn agent(&self) -> &AgentSettings {
        &self.agent
    }

    /// The system prompt's text, if there is any (an empty one is none).
    pub fn system_prompt(&self) -> Option<&str> {
        self.agent.system_prompt.as_deref()
    }

    /// The sunbeam project the session was made for (`PROJECT_KEY`), if any: where it comes
    /// from.
    pub fn project(&self) -> Option<&str> {
        self.project.as_deref()
    }

    /// The map as the client sent it (with the defaults paddock filled in).
    pub fn as_map(&self) -> &BTreeMap<String, String> {
        &self.map
    }

    pub fn into_map(self) -> BTreeMap<String, String> {
        self.map
    }

    /// A restart's new configuration that says nothing of permissions keeps `old`'s: a
    /// restart never widens (or narrows) what the agent may do unasked by leaving the key
    /// out. Nothing is parsed: the policy is `old`'s, already valid.
    pub fn keep_permissions_of(&mut self, old: &ProviderConfig) {
        if self.map.contains_key(PERMISSIONS) {
            return;
        }
        if let Some(p) = old.map.get(PERMISSIONS) {
            self.map.insert(PERMISSIONS.to_string(), p.clone());
            self.policy = old.policy.clone();
        }
    }
}

/// Reads go straight to the map; writes go through [`ProviderConfig::with`], so the settings
/// never drift from it.
impl std::ops::Deref for ProviderConfig {
    type Target = BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl<'a> IntoIterator for &'a ProviderConfig {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;
    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
}

/// A configuration refused where it came in: OBEY-2004, as any other configuration the session
/// cannot be created (or restarted) with.
impl From<ConfigError> for crate::Error {
    fn from(e: ConfigError) -> Self {
        crate::Error::new(crate::ErrorCode::CreationFailed, e.reason)
    }
}

impl TryFrom<BTreeMap<String, String>> for ProviderConfig {
    type Error = ConfigError;
    fn try_from(map: BTreeMap<String, String>) -> Result<Self, ConfigError> {
        Self::parse(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The configuration a client sends as `pairs`.
    fn parse(pairs: &[(&str, &str)]) -> Result<ProviderConfig, ConfigError> {
        ProviderConfig::parse(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn the_default_is_what_an_empty_map_parses_to() {
        assert_eq!(
            ProviderConfig::default(),
            ProviderConfig::parse(BTreeMap::new()).unwrap()
        );
        assert_eq!(ProviderConfig::default().policy(), &Policy::AllowAll);
        assert_eq!(
            ProviderConfig::default().approvals().timeout_ms,
            ApprovalSettings::DEFAULT_TIMEOUT_MS
        );
    }

    #[test]
    fn settings_are_parsed_once_and_invalid_values_refused_with_their_key() {
        let c = parse(&[
            ("permissions", "ask:Read"),
            ("approval_timeout", "90s"),
            ("approval_default", "allow"),
            ("command", "my-agent --flag"),
        ])
        .unwrap();
        assert_eq!(c.policy(), &Policy::Ask(vec!["Read".into()]));
        assert_eq!(c.approvals().timeout_ms, 90_000);
        assert!(c.approvals().default_allow);
        assert_eq!(
            c.get("command").map(String::as_str),
            Some("my-agent --flag")
        );

        let e = parse(&[("permissions", "maybe")]).unwrap_err();
        assert_eq!(e.key, PERMISSIONS);
        let e = parse(&[("approval_timeout", "soon")]).unwrap_err();
        assert_eq!(e.key, "approval_timeout");
        let e = parse(&[("approval_default", "maybe")]).unwrap_err();
        assert_eq!(e.key, "approval_default");
        // `with` parses again: a setting cannot be written around the check.
        assert!(c.clone().with("permissions", "sometimes").is_err());
        let mut kept = c.clone();
        assert!(kept.insert("approval_timeout", "never").is_err());
        assert_eq!(kept, c, "a refused value changes nothing");
        let mut d = c.with("permissions", "deny").unwrap();
        assert_eq!(d.policy(), &Policy::Deny);
        assert_eq!(d.remove("permissions").as_deref(), Some("deny"));
        assert_eq!(
            d.policy(),
            &Policy::AllowAll,
            "a removed setting is its default"
        );
    }

    #[test]
    fn a_restart_that_names_no_permissions_keeps_the_old_ones() {
        let old = parse(&[("permissions", "allow:Read")]).unwrap();
        let mut new = parse(&[("command", "x")]).unwrap();
        assert_eq!(new.policy(), &Policy::AllowAll);
        new.keep_permissions_of(&old);
        assert_eq!(new.policy(), old.policy());
        assert_eq!(new.get(PERMISSIONS), old.get(PERMISSIONS));
        assert_eq!(new, ProviderConfig::parse(new.as_map().clone()).unwrap());

        let mut named = parse(&[("permissions", "deny")]).unwrap();
        named.keep_permissions_of(&old);
        assert_eq!(named.policy(), &Policy::Deny);
    }

    #[test]
    fn the_agents_settings_and_origin_are_parsed_where_the_map_comes_in() {
        let c = parse(&[
            ("command", "  /opt/bin/gemini --acp 'two words' \"q\\\"x\" "),
            ("script", "scripts/a.json"),
            ("system_prompt", "the rules"),
            (crate::PROJECT_KEY, "/p"),
        ])
        .unwrap();
        let want: Vec<String> = ["/opt/bin/gemini", "--acp", "two words", "q\"x"]
            .map(String::from)
            .to_vec();
        assert_eq!(c.agent().command.as_ref(), Some(&want));
        assert_eq!(c.agent().script.as_deref(), Some("scripts/a.json"));
        assert_eq!(c.system_prompt(), Some("the rules"));
        assert_eq!(c.project(), Some("/p"));

        // Empty is none: the provider's own command, no script, no prompt.
        let c = parse(&[("command", "  "), ("script", ""), ("system_prompt", " ")]).unwrap();
        assert_eq!(c.agent(), &AgentSettings::default());
        assert_eq!(c.project(), None);

        // A line no shell could split is refused, naming its key.
        let e = parse(&[("command", "gemini 'unclosed")]).unwrap_err();
        assert_eq!(e.key, COMMAND_KEY);
        assert!(e.reason.contains("not a command line"), "{e}");
        // ... and one that names no program (a shell comment).
        let e = parse(&[("command", "# gemini --acp")]).unwrap_err();
        assert_eq!(e.key, COMMAND_KEY);
        // ... and so is a change to one.
        let mut c = parse(&[]).unwrap();
        assert!(c.insert(COMMAND_KEY, "a \"b").is_err());
        assert_eq!(
            c,
            parse(&[]).unwrap(),
            "a refused value leaves it as it was"
        );
        c.insert(COMMAND_KEY, "codex --profile x").unwrap();
        assert_eq!(c.agent().command.as_ref().map(Vec::len), Some(3));
        c.remove(COMMAND_KEY);
        assert_eq!(c.agent().command, None);
    }

    #[test]
    fn client_tools_are_typed_where_the_map_comes_in() {
        let c = parse(&[(
            CLIENT_TOOLS_KEY,
            r#"[{"name":" run_tests ","description":"runs the tests","schema_json":"{\"type\":\"object\"}"},
                {"name":"deploy-2","parameters":{"type":"object","required":["env"]}},
                {"name":"open"}]"#,
        )])
        .unwrap();
        let tools = &c.agent().client_tools;
        assert_eq!(tools.len(), 3);
        assert_eq!(tools[0].name, "run_tests");
        assert_eq!(tools[0].description, "runs the tests");
        assert_eq!(tools[0].parameters, serde_json::json!({"type": "object"}));
        assert_eq!(tools[1].parameters["required"][0], "env");
        assert_eq!(
            tools[2].parameters,
            serde_json::json!({"type": "object", "properties": {}}),
            "no schema: one that takes an empty object"
        );
        // Empty is none.
        assert!(parse(&[(CLIENT_TOOLS_KEY, " ")])
            .unwrap()
            .agent()
            .client_tools
            .is_empty());

        // A name is a word of its own: it cannot smuggle in another tool, shadow paddock's
        // own, or repeat another.
        for bad in ["x,Bash", "x Bash", "a\\nb", "", "shell", &"n".repeat(65)] {
            let list = format!(r#"[{{"name":"{bad}"}}]"#);
            let e = parse(&[(CLIENT_TOOLS_KEY, &list)]).unwrap_err();
            assert_eq!(e.key, CLIENT_TOOLS_KEY, "{bad:?}");
        }
        let twice = r#"[{"name":"a"},{"name":"a"}]"#;
        assert!(parse(&[(CLIENT_TOOLS_KEY, twice)]).is_err());
        // Not a list, a schema that is not an object, too many tools.
        for bad in [
            r#"{"name":"a"}"#.to_string(),
            r#"[{"name":"a","schema_json":"[1]"}]"#.to_string(),
            r#"[{"name":"a","schema_json":"{"}]"#.to_string(),
            r#"[{"name":"a","parameters":[1]}]"#.to_string(),
            format!(
                "[{}]",
                (0..=CLIENT_TOOLS_MAX)
                    .map(|i| format!(r#"{{"name":"t{i}"}}"#))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        ] {
            let e = parse(&[(CLIENT_TOOLS_KEY, &bad)]).unwrap_err();
            assert!(e.reason.starts_with("provider_config.client_tools"), "{e}");
        }
    }

    /// Each refusal of a `client_tools` list is a variant of its own, in the words clients get
    /// (and the configuration's refusal says the same).
    #[test]
    fn client_tools_refusals_keep_their_words() {
        use serde_json::json;
        let refused = |list: &str, want: ClientToolsError, words: &str| {
            let e = ClientTool::parse_list(list).unwrap_err();
            assert_eq!(e, want, "{list}");
            assert_eq!(e.to_string(), words);
            let config = parse(&[(CLIENT_TOOLS_KEY, list)]).unwrap_err();
            assert_eq!(
                (config.key, config.reason.as_str()),
                (CLIENT_TOOLS_KEY, words)
            );
        };
        let not_a_list = "provider_config.client_tools is not a JSON list: invalid type: map, \
                          expected a sequence at line 1 column 0";
        refused(
            "{}",
            ClientToolsError::NotAList(not_a_list.split_once("list: ").unwrap().1.into()),
            not_a_list,
        );
        let many = format!(
            "[{}]",
            vec![r#"{"name":"t"}"#; CLIENT_TOOLS_MAX + 1].join(",")
        );
        refused(
            &many,
            ClientToolsError::TooMany(CLIENT_TOOLS_MAX + 1),
            "provider_config.client_tools: at most 64 tools",
        );
        refused(
            r#"[{"name":"a"},{"name":" a "}]"#,
            ClientToolsError::NameNotItsOwn("a".into()),
            "provider_config.client_tools: every tool needs a name of its own, not one of \
             paddock's own (\"a\")",
        );
        refused(
            r#"[{"name":"shell"}]"#,
            ClientToolsError::NameNotItsOwn("shell".into()),
            "provider_config.client_tools: every tool needs a name of its own, not one of \
             paddock's own (\"shell\")",
        );
        refused(
            r#"[{"name":"a b"}]"#,
            ClientToolsError::NameNotAWord("a b".into()),
            "provider_config.client_tools: tool name \"a b\": use at most 64 letters, digits, _ \
             and -",
        );
        refused(
            r#"[{"name":"a","parameters":[1, "x"]}]"#,
            ClientToolsError::ParametersNotAnObject {
                tool: "a".into(),
                parameters: json!([1, "x"]),
            },
            "provider_config.client_tools: a's parameters are not a JSON object: [1,\"x\"]",
        );
        refused(
            r#"[{"name":"a","schema_json":"[1,2]"}]"#,
            ClientToolsError::SchemaNotAnObject {
                tool: "a".into(),
                schema: json!([1, 2]),
            },
            "provider_config.client_tools: a's schema_json is not a JSON object: [1,2]",
        );
        refused(
            r#"[{"name":"a","schema_json":"{"}]"#,
            ClientToolsError::SchemaNotJson {
                tool: "a".into(),
                error: "EOF while parsing an object at line 1 column 1".into(),
            },
            "provider_config.client_tools: a's schema_json: EOF while parsing an object at line \
             1 column 1",
        );
    }
}
