//! The script format (the module docs of [`super`] are its specification), serde-derived.
//!
//! A script is read in two passes so that an error names the turn and step it is in: the
//! outer shape ([`Script`], [`Turn`]) with each step still a JSON object, then each step. A
//! step names its kind by which key it has (`{"text": …, "tokens_in": 3}`), so its kind key is
//! found first, the keys the kind allows are checked (the error lists them), and then the
//! object is deserialized as that variant of [`StepKind`], whose fields say what each key
//! takes: an error names the key (`"text" must be a string`).

use std::fmt;
use std::fs;
use std::io;
use std::path::Path;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess, VariantAccess,
    Visitor,
};
use serde::Deserialize;
use serde_json::{Map, Value};

/// The largest script read (the daemon checks it at CreateSession; the agent reads no more).
pub const SCRIPT_BYTES_MAX: u64 = 8 * 1024 * 1024;

/// A parsed script. `Script::default()` is the built-in behaviour.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script<S = Step> {
    #[serde(default = "Vec::new")]
    pub turns: Vec<Turn<S>>,
    #[serde(default = "yes")]
    pub repeat_last: bool,
    #[serde(default)]
    pub startup_delay_ms: u64,
    #[serde(default)]
    pub crash_on_start: Option<i32>,
    #[serde(default)]
    pub ignore_sigterm: bool,
    #[serde(default)]
    pub stderr: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    comment: Comment,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            turns: Vec::new(),
            repeat_last: true,
            startup_delay_ms: 0,
            crash_on_start: None,
            ignore_sigterm: false,
            stderr: None,
            session_id: None,
            model: None,
            comment: Comment,
        }
    }
}

fn yes() -> bool {
    true
}

/// The answer to one user message.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn<S = Step> {
    #[serde(default = "Vec::new")]
    pub steps: Vec<S>,
    #[serde(default)]
    comment: Comment,
}

/// A `"comment"` (allowed anywhere, any value): read and forgotten.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Comment;

impl<'de> Deserialize<'de> for Comment {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        de::IgnoredAny::deserialize(d).map(|_| Comment)
    }
}

/// One step of a turn: wait `delay_ms`, then do `kind`.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub delay_ms: u64,
    pub kind: StepKind,
}

/// What a step does; a variant's name (snake_case) is its kind key, its fields the keys it
/// allows (each but the kind key's value optional).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum StepKind {
    /// Only the delay (a step with nothing but `delay_ms`).
    #[serde(skip)]
    Wait,
    Thinking {
        #[serde(rename = "thinking", deserialize_with = "text")]
        text: String,
        #[serde(default, deserialize_with = "count")]
        tokens_in: u64,
        #[serde(default, deserialize_with = "count")]
        tokens_out: u64,
        #[serde(default, deserialize_with = "string")]
        message_id: Option<String>,
    },
    Text {
        #[serde(deserialize_with = "text")]
        text: String,
        #[serde(default, deserialize_with = "count")]
        tokens_in: u64,
        #[serde(default, deserialize_with = "count")]
        tokens_out: u64,
        #[serde(default, deserialize_with = "string")]
        message_id: Option<String>,
    },
    Tool {
        #[serde(rename = "tool", deserialize_with = "text")]
        name: String,
        #[serde(default = "empty_object", deserialize_with = "object")]
        input: Value,
        #[serde(default, deserialize_with = "string")]
        id: Option<String>,
        #[serde(default, deserialize_with = "count")]
        tokens_in: u64,
        #[serde(default, deserialize_with = "count")]
        tokens_out: u64,
        #[serde(default, deserialize_with = "string")]
        message_id: Option<String>,
    },
    ToolResult {
        #[serde(rename = "tool_result", deserialize_with = "text")]
        content: String,
        #[serde(default, deserialize_with = "flag")]
        is_error: bool,
        #[serde(default, deserialize_with = "string")]
        id: Option<String>,
    },
    Result {
        #[serde(rename = "result", deserialize_with = "text")]
        text: String,
        #[serde(default, deserialize_with = "opt_count")]
        tokens_in: Option<u64>,
        #[serde(default, deserialize_with = "opt_count")]
        tokens_out: Option<u64>,
        #[serde(default, deserialize_with = "flag")]
        is_error: bool,
        #[serde(default = "success", deserialize_with = "subtype")]
        subtype: String,
        #[serde(default, deserialize_with = "status")]
        api_error_status: Value,
        #[serde(default, deserialize_with = "opt_count")]
        num_turns: Option<u64>,
    },
    #[serde(alias = "garbage", deserialize_with = "text")]
    Raw(String),
    #[serde(deserialize_with = "text")]
    Stderr(String),
    #[serde(deserialize_with = "integer")]
    Crash(i32),
    #[serde(deserialize_with = "signal_number")]
    Signal(i32),
    #[serde(deserialize_with = "must_be_true")]
    Hang,
    #[serde(deserialize_with = "must_be_true")]
    Builtin,
    /// A `can_use_tool` permission prompt for `tool`.
    Ask {
        #[serde(rename = "ask", deserialize_with = "text")]
        tool: String,
        #[serde(default = "empty_object", deserialize_with = "object")]
        input: Value,
        /// The result when allowed (tools other than LS / Read).
        #[serde(default, deserialize_with = "string")]
        allowed_result: Option<String>,
    },
    /// Claude Code's `AskUserQuestion` tool.
    Question {
        #[serde(rename = "question", deserialize_with = "text")]
        text: String,
        #[serde(default, deserialize_with = "labels")]
        options: Vec<String>,
    },
    /// paddock's `client_tool` request: a tool the client runs.
    ClientTool {
        #[serde(rename = "client_tool", deserialize_with = "text")]
        tool: String,
        #[serde(default = "empty_object", deserialize_with = "object")]
        input: Value,
    },
}

/// Every kind key (in the order errors list them) and the other keys its step may have
/// besides `delay_ms` and `comment`: the same as [`StepKind`]'s fields, said here so that an
/// error can list them (a test checks they agree).
const KINDS: &[(&str, &[&str])] = &[
    ("ask", &["input", "allowed_result"]),
    ("question", &["options"]),
    ("client_tool", &["input"]),
    ("thinking", &["tokens_in", "tokens_out", "message_id"]),
    ("text", &["tokens_in", "tokens_out", "message_id"]),
    (
        "tool",
        &["input", "id", "tokens_in", "tokens_out", "message_id"],
    ),
    ("tool_result", &["is_error", "id"]),
    (
        "result",
        &[
            "tokens_in",
            "tokens_out",
            "is_error",
            "subtype",
            "api_error_status",
            "num_turns",
        ],
    ),
    ("raw", &[]),
    ("garbage", &[]),
    ("stderr", &[]),
    ("crash", &[]),
    ("signal", &[]),
    ("hang", &[]),
    ("builtin", &[]),
];

/// Why a script cannot be used: the script format's error. The scripted agent prints it
/// (`paddock scripted agent: <file>: <text>`, exit 2); the daemon refuses a session whose
/// script has one (`bad script <file>: <text>`).
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error(transparent)]
    Read(#[from] io::Error),
    #[error("longer than {SCRIPT_BYTES_MAX} bytes")]
    TooLong,
    /// Not a script's outer shape (turns of steps, the script's own keys).
    #[error("invalid script: {0}")]
    Invalid(#[source] serde_json::Error),
    /// One step (1-based) is wrong.
    #[error("turn {turn} step {step}: {source}")]
    Step {
        turn: usize,
        step: usize,
        #[source]
        source: StepError,
    },
}

/// What is wrong with one step, as the script's author reads it.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("a step has one kind, found {}", .0.join(", "))]
    Kinds(Vec<&'static str>),
    #[error("unknown key {key:?} in a {kind:?} step (allowed: delay_ms{})", after_delay_ms(.allowed))]
    UnknownKey {
        key: String,
        kind: &'static str,
        allowed: &'static [&'static str],
    },
    #[error("unknown key {key:?} (a step needs one of: {})", kind_names())]
    NoKind { key: String },
    #[error("empty step (needs one of: {})", kind_names())]
    Empty,
    /// A key's value, in words that follow the key: `"text" must be a string`.
    #[error("{0}")]
    Value(String),
}

/// Every kind key, as errors list them.
fn kind_names() -> String {
    KINDS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
}

/// `, a, b` for the keys a kind allows besides `delay_ms` (nothing for none).
fn after_delay_ms(allowed: &[&str]) -> String {
    allowed.iter().map(|k| format!(", {k}")).collect()
}

impl Script {
    /// Reads and parses a script file (see the module docs).
    pub fn load(path: &Path) -> Result<Script, ScriptError> {
        let mut text = String::new();
        fs::File::open(path).and_then(|f| {
            let mut bounded = io::Read::take(f, SCRIPT_BYTES_MAX + 1);
            io::Read::read_to_string(&mut bounded, &mut text)
        })?;
        if text.len() as u64 > SCRIPT_BYTES_MAX {
            return Err(ScriptError::TooLong);
        }
        parse_script(&text)
    }
}

/// Parses a script file's text. Errors name the turn and step (1-based).
pub fn parse_script(text: &str) -> Result<Script, ScriptError> {
    let outer: Script<Map<String, Value>> =
        serde_json::from_str(text).map_err(ScriptError::Invalid)?;
    let mut turns = Vec::with_capacity(outer.turns.len());
    for (ti, t) in outer.turns.into_iter().enumerate() {
        let steps = t
            .steps
            .into_iter()
            .enumerate()
            .map(|(si, s)| {
                step(s).map_err(|source| ScriptError::Step {
                    turn: ti + 1,
                    step: si + 1,
                    source,
                })
            })
            .collect::<Result<_, _>>()?;
        turns.push(Turn {
            steps,
            comment: Comment,
        });
    }
    Ok(Script {
        turns,
        repeat_last: outer.repeat_last,
        startup_delay_ms: outer.startup_delay_ms,
        crash_on_start: outer.crash_on_start,
        ignore_sigterm: outer.ignore_sigterm,
        stderr: outer.stderr,
        session_id: outer.session_id,
        model: outer.model,
        comment: Comment,
    })
}

/// One step's object → a [`Step`]: its kind key found, its keys checked, then derived.
fn step(mut m: Map<String, Value>) -> Result<Step, StepError> {
    // In the object's key order, as the error lists them.
    let kinds: Vec<&(&'static str, &'static [&'static str])> = m
        .keys()
        .filter_map(|k| KINDS.iter().find(|(kind, _)| kind == k))
        .collect();
    let (kind, options) = match kinds.as_slice() {
        [] => (None, &[][..]),
        [(k, o)] => (Some(*k), *o),
        _ => return Err(StepError::Kinds(kinds.iter().map(|(k, _)| *k).collect())),
    };
    for k in m.keys() {
        let k = k.as_str();
        if k != "delay_ms" && k != "comment" && Some(k) != kind && !options.contains(&k) {
            return Err(match kind {
                Some(kind) => StepError::UnknownKey {
                    key: k.to_string(),
                    kind,
                    allowed: options,
                },
                None => StepError::NoKind { key: k.to_string() },
            });
        }
    }
    m.remove("comment");
    let waits = m.contains_key("delay_ms");
    let delay_ms = match m.remove("delay_ms") {
        None => 0,
        Some(v) => count_value::<serde_json::Error>(v)
            .map_err(|e| about("delay_ms", e))?
            .unwrap_or(0),
    };
    let kind = match kind {
        None if waits => StepKind::Wait,
        None => return Err(StepError::Empty),
        Some(kind) => StepKind::deserialize(StepObject { kind, fields: m })?,
    };
    Ok(Step { delay_ms, kind })
}

// ---------------------------------------------------------------------------------------------
// What each key takes. Each reads any JSON value and says what was wrong in words the script's
// author reads after the key: `"text" must be a string`.

fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => Ok(s),
        Value::Null => Err(de::Error::custom("is required")),
        _ => Err(de::Error::custom("must be a string")),
    }
}

fn string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => Ok(Some(s)),
        Value::Null => Ok(None),
        _ => Err(de::Error::custom("must be a string")),
    }
}

fn subtype<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(string(d)?.unwrap_or_else(success))
}

fn success() -> String {
    "success".to_string()
}

fn opt_count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    count_value(Value::deserialize(d)?)
}

fn count_value<E: de::Error>(v: Value) -> Result<Option<u64>, E> {
    match v {
        Value::Null => Ok(None),
        v => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| E::custom("must be a non-negative integer")),
    }
}

fn count<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(opt_count(d)?.unwrap_or(0))
}

fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match Value::deserialize(d)? {
        Value::Bool(b) => Ok(b),
        Value::Null => Ok(false),
        _ => Err(de::Error::custom("must be true or false")),
    }
}

fn must_be_true<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    match Value::deserialize(d)? {
        Value::Bool(true) => Ok(()),
        _ => Err(de::Error::custom("must be true")),
    }
}

fn integer<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    Value::deserialize(d)?
        .as_i64()
        .and_then(|n| i32::try_from(n).ok())
        .ok_or_else(|| de::Error::custom("must be an integer"))
}

fn signal_number<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    let n = integer(d)?;
    if !(1..=64).contains(&n) {
        return Err(de::Error::custom(format!(
            "must be a signal number, not {n}"
        )));
    }
    Ok(n)
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

fn object<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(empty_object()),
        v @ Value::Object(_) => Ok(v),
        _ => Err(de::Error::custom("must be an object")),
    }
}

fn status<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    match Value::deserialize(d)? {
        v @ (Value::Null | Value::Number(_) | Value::String(_)) => Ok(v),
        _ => Err(de::Error::custom("must be a number or a string")),
    }
}

fn labels<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(Vec::new()),
        Value::Array(a) => a
            .into_iter()
            .map(|o| match o {
                Value::String(s) => Ok(s),
                _ => Err(de::Error::custom("must be strings")),
            })
            .collect(),
        _ => Err(de::Error::custom("must be a list of strings")),
    }
}

// ---------------------------------------------------------------------------------------------
// A step's object as serde's externally tagged enum: the kind key names the variant; a struct
// variant's fields are the whole object (its kind key included), a newtype or unit variant's
// value is the kind key's. Errors are prefixed with the key they are about.

impl de::Error for StepError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        StepError::Value(msg.to_string())
    }
}

fn about(key: &str, e: serde_json::Error) -> StepError {
    StepError::Value(format!("{key:?} {e}"))
}

struct StepObject {
    kind: &'static str,
    fields: Map<String, Value>,
}

impl<'de> Deserializer<'de> for StepObject {
    type Error = StepError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, StepError> {
        visitor.visit_enum(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

impl<'de> EnumAccess<'de> for StepObject {
    type Error = StepError;
    type Variant = StepObject;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), StepError> {
        let variant = seed.deserialize(self.kind.into_deserializer())?;
        Ok((variant, self))
    }
}

impl<'de> VariantAccess<'de> for StepObject {
    type Error = StepError;

    fn unit_variant(self) -> Result<(), StepError> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(
        mut self,
        seed: T,
    ) -> Result<T::Value, StepError> {
        let value = self.fields.remove(self.kind).unwrap_or(Value::Null);
        seed.deserialize(value).map_err(|e| about(self.kind, e))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value, StepError> {
        Err(de::Error::custom("a step is an object"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, StepError> {
        visitor.visit_map(Fields {
            entries: self.fields.into_iter(),
            value: None,
        })
    }
}

/// A step's keys and values; a value's error names its key.
struct Fields {
    entries: serde_json::map::IntoIter,
    value: Option<(String, Value)>,
}

impl<'de> MapAccess<'de> for Fields {
    type Error = StepError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, StepError> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        let k = seed.deserialize(key.as_str().into_deserializer())?;
        self.value = Some((key, value));
        Ok(Some(k))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, StepError> {
        let (key, value) = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value without its key"))?;
        seed.deserialize(value).map_err(|e| about(&key, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key a kind allows deserializes as that kind (the error list and the variants
    /// agree), and every variant but `Wait` has a kind key.
    #[test]
    fn kinds_and_variants_agree() {
        for (kind, options) in KINDS {
            let mut m = Map::new();
            m.insert(kind.to_string(), Value::from("1"));
            for o in *options {
                m.insert(o.to_string(), Value::Null);
            }
            let got = StepKind::deserialize(StepObject { kind, fields: m });
            // A wrong type for the kind key is fine here; an unknown key is not.
            if let Err(e) = got {
                assert!(!e.to_string().contains("unknown"), "{kind}: {e}");
            }
        }
    }
}
