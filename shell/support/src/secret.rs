//! Which settings are credentials, and how they are shown: never.
//!
//! A key of a session's environment or `provider_config` (or a task's environment) is a secret
//! when it matches one of [`DEFAULT_PATTERNS`] or of the comma-separated globs in
//! `$PADDOCK_SECRET_KEYS` (read once; `*` matches any run of characters; case-insensitive).
//! Secret values are never returned by an RPC (they read [`MASK`], the key stays so a user sees
//! what is set), never logged, and stored sealed (see `store::seal`).

use std::collections::BTreeMap;
use std::sync::LazyLock;

/// What a secret value reads as on the wire and in the CLI.
pub const MASK: &str = "•••";

/// Keys that are credentials unless configured otherwise.
pub const DEFAULT_PATTERNS: &[&str] = &[
    "*_KEY",
    "*_KEYS",
    "*_TOKEN",
    "*_SECRET",
    "*_PASSWORD",
    "*_CREDENTIALS",
    "API_KEY",
    "APIKEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "AUTHORIZATION",
    "*_AUTH",
];

static EXTRA: LazyLock<Vec<String>> = LazyLock::new(|| {
    std::env::var("PADDOCK_SECRET_KEYS")
        .unwrap_or_default()
        .split(',')
        .map(|p| p.trim().to_ascii_uppercase())
        .filter(|p| !p.is_empty())
        .collect()
});

/// Whether the value under `key` is a credential.
pub fn is_secret(key: &str) -> bool {
    DEFAULT_PATTERNS.iter().any(|p| glob(p, key)) || EXTRA.iter().any(|p| glob(p, key))
}

/// `pattern` (upper case) with `*` as "any run of characters" against `text`, an ASCII letter
/// of `text` matching in either case. Nothing is allocated: every listed session's settings
/// are checked key by key.
fn glob(pattern: &str, text: &str) -> bool {
    let same = |a: &[u8], b: &[u8]| a.eq_ignore_ascii_case(b);
    let mut parts = pattern.as_bytes().split(|b| *b == b'*');
    let first = parts.next().unwrap_or_default();
    let text = text.as_bytes();
    if text.len() < first.len() || !same(&text[..first.len()], first) {
        return false;
    }
    let mut rest = &text[first.len()..];
    let mut parts = parts.peekable();
    if parts.peek().is_none() {
        return rest.is_empty(); // no `*`: the whole text
    }
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            // The last part ends the text.
            return rest.len() >= part.len() && same(&rest[rest.len() - part.len()..], part);
        }
        if part.is_empty() {
            continue; // `**`
        }
        match rest.windows(part.len()).position(|w| same(w, part)) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    unreachable!("the loop returns at the last part")
}

/// The map as it may be shown: every secret value replaced by [`MASK`].
pub fn redact<'a, I>(map: I) -> impl Iterator<Item = (String, String)> + 'a
where
    I: IntoIterator<Item = (&'a String, &'a String)>,
    I::IntoIter: 'a,
{
    map.into_iter().map(|(k, v)| {
        let v = if is_secret(k) {
            MASK.to_string()
        } else {
            v.clone()
        };
        (k.clone(), v)
    })
}

/// A new value for a map that came back from a client: a [`MASK`]ed value means "keep what is
/// stored" (a client that shows a session's settings and sends them back does not wipe its
/// credentials). A masked key with nothing stored is an error naming the key.
pub fn unmask(
    new: BTreeMap<String, String>,
    stored: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, MaskedWithoutValue> {
    new.into_iter()
        .map(|(k, v)| {
            if v != MASK {
                return Ok((k, v));
            }
            match stored.get(&k) {
                Some(old) => Ok((k, old.clone())),
                None => Err(MaskedWithoutValue(k)),
            }
        })
        .collect()
}

/// A key sent [`MASK`]ed with nothing stored for it ([`unmask`]).
#[derive(Debug, thiserror::Error)]
#[error("{0} is {MASK}, the mask of a secret, and no value is stored for it: send the value")]
pub struct MaskedWithoutValue(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_keys_are_recognised() {
        for k in [
            "ANTHROPIC_API_KEY",
            "OPENAI_API_KEY",
            "api_key",
            "GITHUB_TOKEN",
            "aws_secret",
            "DB_PASSWORD",
            "password",
            "Authorization",
        ] {
            assert!(is_secret(k), "{k}");
        }
        for k in [
            "PATH",
            "HOME",
            "model",
            "permission_mode",
            "script",
            "KEYBOARD",
            "TOKENS_MAX",
        ] {
            assert!(!is_secret(k), "{k}");
        }
    }

    #[test]
    fn globs() {
        assert!(glob("*_KEY", "A_KEY"));
        assert!(!glob("*_KEY", "A_KEYS"));
        assert!(glob("A*B*C", "AXXBYYC"));
        assert!(!glob("A*B*C", "AXXC"));
        assert!(glob("TOKEN", "TOKEN"));
        assert!(!glob("TOKEN", "TOKENS"));
        assert!(glob("*", ""));
        assert!(!glob("AB*BA", "ABA"), "the two ends may not overlap");
        assert!(glob("A**B", "AxB"));
        assert!(glob("*_KEY", "a_key"), "either case");
        assert!(glob("*_KEY", "é_key") && !glob("*_KEY", "_KÉY"));
    }

    #[test]
    fn redaction_keeps_keys_and_unmask_restores_values() {
        let stored = BTreeMap::from([
            ("api_key".to_string(), "sk-1".to_string()),
            ("model".to_string(), "m".to_string()),
        ]);
        let shown: BTreeMap<String, String> = redact(&stored).collect();
        assert_eq!(shown["api_key"], MASK);
        assert_eq!(shown["model"], "m");
        assert_eq!(unmask(shown.clone(), &stored).unwrap(), stored);
        let err = unmask(shown, &BTreeMap::new()).unwrap_err();
        assert_eq!(err.0, "api_key");
        assert!(err.to_string().starts_with("api_key is "), "{err}");
    }
}
