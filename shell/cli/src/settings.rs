//! `paddock config show`: the effective configuration, each value with where it came from
//! (the configuration file and line, an environment variable, or the built-in default).

use serde_json::json;

use super::view::table;
use super::{print_json, Ctx, Error, Result};
use crate::config::{Loaded, NOTIFY_DEFAULT};

/// One effective value.
struct Entry {
    key: String,
    value: String,
    source: String,
}

/// A value from the file if it is there, else `default` (from `default_source`).
fn entry<T: std::fmt::Display>(
    loaded: Option<&Loaded>,
    key: &str,
    value: Option<&toml::Spanned<T>>,
    default: String,
    default_source: &str,
) -> Entry {
    match (loaded, value) {
        (Some(l), Some(v)) => Entry {
            key: key.into(),
            value: v.get_ref().to_string(),
            source: l.source(v.span()),
        },
        _ => Entry {
            key: key.into(),
            value: default,
            source: default_source.into(),
        },
    }
}

fn entries(loaded: Option<&Loaded>) -> Vec<Entry> {
    let empty = crate::config::Config::default();
    let c = loaded.map_or(&empty, |l| &l.config);
    let s = &c.session;
    let mut out = Vec::new();
    let provider = match std::env::var("PADDOCK_PROVIDER")
        .ok()
        .filter(|p| !p.trim().is_empty())
    {
        Some(p) => Entry {
            key: "session.provider".into(),
            value: p,
            source: "$PADDOCK_PROVIDER".into(),
        },
        None => entry(
            loaded,
            "session.provider",
            s.provider.as_ref(),
            "the first of claude, codex, gemini on PATH".into(),
            "default",
        ),
    };
    out.push(provider);
    out.push(entry(
        loaded,
        "session.model",
        s.model.as_ref(),
        "(the agent's own)".into(),
        "default",
    ));
    out.push(entry(
        loaded,
        "session.driver",
        s.driver.as_ref(),
        "local".into(),
        "default",
    ));
    out.push(entry(
        loaded,
        "session.permissions",
        s.permissions.as_ref(),
        "(the agent's own policy)".into(),
        "default",
    ));
    out.push(entry(
        loaded,
        "session.max_tokens",
        s.max_tokens.as_ref(),
        "0 (unlimited)".into(),
        "default",
    ));
    out.push(entry(
        loaded,
        "session.timeout_secs",
        s.timeout_secs.as_ref(),
        "0 (none)".into(),
        "default",
    ));
    if let Some(l) = loaded {
        for (name, cmd) in &c.agents {
            out.push(Entry {
                key: format!("agents.{name}"),
                value: cmd.get_ref().clone(),
                source: l.source(cmd.span()),
            });
        }
        for (k, v) in &c.env {
            out.push(Entry {
                key: format!("env.{k}"),
                value: if crate::secret::is_secret(k) {
                    crate::secret::MASK.into()
                } else {
                    v.get_ref().clone()
                },
                source: l.source(v.span()),
            });
        }
    }
    let d = &c.daemon;
    out.push(entry(
        loaded,
        "daemon.max_sessions",
        d.max_sessions.as_ref(),
        "64".into(),
        "default",
    ));
    let secs = |d: paddock_core::Duration| (d.millis() / 1000).to_string();
    for (key, value, default) in [
        (
            "daemon.stop_grace_secs",
            &d.stop_grace_secs,
            "30".to_string(),
        ),
        (
            "daemon.kill_grace_secs",
            &d.kill_grace_secs,
            secs(paddock_core::process::KILL_GRACE),
        ),
        (
            "daemon.end_grace_secs",
            &d.end_grace_secs,
            secs(paddock_core::process::END_GRACE),
        ),
        (
            "daemon.startup_timeout_secs",
            &d.startup_timeout_secs,
            secs(paddock_core::process::STARTUP_TIMEOUT),
        ),
    ] {
        out.push(entry(loaded, key, value.as_ref(), default, "default"));
    }
    let n = &c.notify;
    out.push(match (loaded, &n.on) {
        (Some(l), Some(on)) => Entry {
            key: "notify.on".into(),
            value: on.get_ref().join(", "),
            source: l.source(on.span()),
        },
        _ => Entry {
            key: "notify.on".into(),
            value: NOTIFY_DEFAULT.join(", "),
            source: "default".into(),
        },
    });
    out.push(entry(
        loaded,
        "notify.command",
        n.command.as_ref(),
        "(none)".into(),
        "default",
    ));
    out.push(entry(
        loaded,
        "notify.webhook",
        n.webhook.as_ref(),
        "(none)".into(),
        "default",
    ));
    out.push(entry(
        loaded,
        "notify.desktop",
        n.desktop.as_ref(),
        "true (where a session bus and notify-send exist)".into(),
        "default",
    ));
    out
}

/// `paddock config show`.
pub fn show(ctx: &Ctx) -> Result<()> {
    let path = crate::config::path();
    let loaded = crate::config::load().map_err(|e| Error::Usage(e.to_string()))?;
    let list = entries(loaded.as_ref());
    if ctx.json {
        print_json(&json!({
            "file": path,
            "found": loaded.is_some(),
            "values": list.iter().map(|e| json!({"key": e.key, "value": e.value, "source": e.source})).collect::<Vec<_>>(),
        }))?;
        return Ok(());
    }
    outln!(
        "{} {}",
        path.display(),
        if loaded.is_some() {
            "(read)"
        } else {
            "(not found: built-in defaults)"
        }
    )?;
    let rows: Vec<Vec<String>> = list
        .into_iter()
        .map(|e| vec![e.key, e.value, e.source])
        .collect();
    outln!("{}", table(&["KEY", "VALUE", "SOURCE"], &rows))?;
    Ok(())
}
