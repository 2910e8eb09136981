//! Campaigns: named root directories sessions run in, and the rules for adding and removing
//! them.
//!
//! The daemon keeps every campaign in memory (there are few) and decides here, in one step,
//! whether a write is allowed; the accepted write then goes to the store with the batch like
//! every other record. Deciding against memory (which already holds the batch's uncommitted
//! adds and removals) is what makes "is the name free?" and "add it" one step: two clients
//! adding the same name in one batch cannot both be told yes.

use std::collections::BTreeMap;

use crate::time::Timestamp;

/// A campaign: a named root directory sessions run in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Campaign {
    pub id: String,
    pub name: String,
    pub root_path: String,
    pub created_at: Timestamp,
}

/// A campaign write the rules refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CampaignError {
    /// Another campaign has this name (or this id).
    NameTaken(String),
    /// The campaign still has this many live sessions.
    LiveSessions(usize),
    /// The name or the root is not one a campaign may have (says why).
    Invalid(String),
    /// The daemon is shutting down: nothing new is written.
    ShuttingDown,
}

/// The longest campaign name, in bytes.
pub const NAME_BYTES_MAX: usize = 128;

/// A campaign name is short printable text without `/` (it is shown in tables and used in
/// paths and sunbeam project keys).
pub fn check_name(name: &str) -> Result<(), CampaignError> {
    let why = if name.trim().is_empty() {
        Some("a campaign name must not be empty".to_string())
    } else if name.len() > NAME_BYTES_MAX {
        Some(format!("a campaign name is at most {NAME_BYTES_MAX} bytes"))
    } else if name.chars().any(|c| c.is_control() || c == '/') {
        Some("a campaign name may not contain '/' or control characters".to_string())
    } else {
        None
    };
    why.map_or(Ok(()), |w| Err(CampaignError::Invalid(w)))
}

/// A campaign root (already canonical) is a project directory: not the file system's root and
/// not inside a kernel file system (agents run with their campaign root as working directory).
pub fn check_root(root: &str) -> Result<(), CampaignError> {
    let under = |top: &str| root == top || root.starts_with(&format!("{top}/"));
    if root == "/" || ["/proc", "/sys", "/dev"].into_iter().any(under) {
        return Err(CampaignError::Invalid(format!(
            "{root} cannot be a campaign root: choose a project directory"
        )));
    }
    Ok(())
}

impl std::fmt::Display for CampaignError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CampaignError::NameTaken(name) => {
                write!(f, "a campaign named \"{name}\" already exists")
            }
            CampaignError::LiveSessions(n) => {
                write!(f, "campaign has {n} live session(s); stop them first")
            }
            CampaignError::Invalid(why) => f.write_str(why),
            CampaignError::ShuttingDown => f.write_str("the daemon is shutting down"),
        }
    }
}

/// How a new campaign is named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NewCampaign {
    /// This name; refused if it is taken.
    Named(String),
    /// The campaign of this name if there is one, else a new one of this name.
    NamedOrExisting(String),
    /// The oldest campaign of the root directory if there is one, else a new one named after
    /// the directory (`base`, `base-2`, … `base-99`, then `base-<id>`): one way for every
    /// client that starts work "here", so a directory gets the same campaign whoever comes
    /// first.
    ForRoot { base: String },
}

/// Names tried for a directory's campaign before `base-<id>`.
pub const ROOT_NAMES_MAX: usize = 99;

/// Every campaign, by id.
#[derive(Debug, Clone, Default)]
pub struct Campaigns {
    by_id: BTreeMap<String, Campaign>,
}

impl Campaigns {
    pub fn new(list: impl IntoIterator<Item = Campaign>) -> Self {
        Campaigns {
            by_id: list.into_iter().map(|c| (c.id.clone(), c)).collect(),
        }
    }

    /// The campaign with this id or, failing that, this name.
    pub fn get(&self, id_or_name: &str) -> Option<&Campaign> {
        self.by_id
            .get(id_or_name)
            .or_else(|| self.by_id.values().find(|c| c.name == id_or_name))
    }

    /// Every campaign, by name.
    pub fn all(&self) -> Vec<Campaign> {
        let mut list: Vec<Campaign> = self.by_id.values().cloned().collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    fn taken(&self, name: &str) -> bool {
        self.by_id.values().any(|c| c.name == name)
    }

    /// Adds a campaign (`id`, rooted at `root_path`) named as `how` says. Returns it and
    /// whether it is new (a new one must be persisted).
    pub fn handle_add(
        &mut self,
        id: &str,
        root_path: &str,
        how: NewCampaign,
        now: Timestamp,
    ) -> Result<(Campaign, bool), CampaignError> {
        check_root(root_path)?;
        if let NewCampaign::Named(name) | NewCampaign::NamedOrExisting(name) = &how {
            check_name(name)?;
        }
        let name = match how {
            NewCampaign::Named(name) if self.taken(&name) => {
                return Err(CampaignError::NameTaken(name))
            }
            NewCampaign::Named(name) => name,
            NewCampaign::NamedOrExisting(name) => {
                match self.by_id.values().find(|c| c.name == name) {
                    Some(c) => return Ok((c.clone(), false)),
                    None => name,
                }
            }
            NewCampaign::ForRoot { base } => {
                let oldest = self
                    .by_id
                    .values()
                    .filter(|c| c.root_path == root_path)
                    .min_by_key(|c| (c.created_at, c.id.clone()));
                if let Some(c) = oldest {
                    return Ok((c.clone(), false));
                }
                let mut names = (1..=ROOT_NAMES_MAX)
                    .map(|i| match i {
                        1 => base.clone(),
                        i => format!("{base}-{i}"),
                    })
                    .chain(std::iter::once(format!(
                        "{base}-{}",
                        id.to_ascii_lowercase()
                    )));
                names
                    .find(|n| !self.taken(n))
                    .ok_or(CampaignError::NameTaken(base))?
            }
        };
        if self.by_id.contains_key(id) {
            return Err(CampaignError::NameTaken(id.to_string()));
        }
        let c = Campaign {
            id: id.to_string(),
            name,
            root_path: root_path.to_string(),
            created_at: now,
        };
        debug_assert!(!self.taken(&c.name), "a new campaign's name is free");
        self.by_id.insert(c.id.clone(), c.clone());
        debug_assert!(self.names_unique(), "no two campaigns share a name");
        Ok((c, true))
    }

    /// Removes the campaign with this id or name: refused while it has live sessions
    /// (`live_in(campaign id)` counts them). Returns the removed campaign (`None`: there was
    /// none).
    pub fn handle_remove(
        &mut self,
        id_or_name: &str,
        live_in: impl FnOnce(&str) -> usize,
    ) -> Result<Option<Campaign>, CampaignError> {
        let Some(id) = self.get(id_or_name).map(|c| c.id.clone()) else {
            return Ok(None);
        };
        let live = live_in(&id);
        if live > 0 {
            return Err(CampaignError::LiveSessions(live));
        }
        let removed = self.by_id.remove(&id);
        debug_assert!(
            removed.is_some() && self.get(&id).is_none_or(|c| c.id != id),
            "a removed campaign is gone"
        );
        Ok(removed)
    }

    /// Every name is one campaign's (checked in debug builds after every change).
    fn names_unique(&self) -> bool {
        let names: std::collections::BTreeSet<&str> =
            self.by_id.values().map(|c| c.name.as_str()).collect();
        names.len() == self.by_id.len()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_and_roots_are_checked() {
        let mut c = Campaigns::new([]);
        let now = Timestamp::from_millis(1);
        for bad in ["", "  ", "a/b", "nul\0", &"n".repeat(NAME_BYTES_MAX + 1)] {
            let r = c.handle_add("c1", "/srv/p", NewCampaign::Named(bad.to_string()), now);
            assert!(matches!(r, Err(CampaignError::Invalid(_))), "{bad:?}");
        }
        for root in ["/", "/proc", "/proc/self", "/sys/fs", "/dev"] {
            let r = c.handle_add("c1", root, NewCampaign::Named("ok".into()), now);
            assert!(matches!(r, Err(CampaignError::Invalid(_))), "{root}");
        }
        assert!(c
            .handle_add("c1", "/srv/process", NewCampaign::Named("ok".into()), now)
            .is_ok());
        assert!(!c.is_empty());
        // The longest name is accepted.
        let longest = "n".repeat(NAME_BYTES_MAX);
        assert!(c
            .handle_add("c2", "/srv/q", NewCampaign::Named(longest), now)
            .is_ok());
        // Each refusal says what was refused.
        let said = |e: CampaignError| e.to_string();
        assert!(said(CampaignError::NameTaken("alpha".into())).contains("\"alpha\""));
        assert!(said(CampaignError::LiveSessions(3)).contains('3'));
        assert!(said(CampaignError::Invalid("why".into())).contains("why"));
    }

    use super::*;

    fn camp(id: &str, name: &str, root: &str, at: u64) -> Campaign {
        Campaign {
            id: id.into(),
            name: name.into(),
            root_path: root.into(),
            created_at: Timestamp::from_millis(at),
        }
    }

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn now(ms: u64) -> crate::Now {
        crate::Now::new(crate::Instant::from_millis(ms), at(ms))
    }

    #[test]
    fn names_are_unique_and_looked_up_by_id_first() {
        let mut c = Campaigns::new([camp("c-1", "alpha", "/a", 1)]);
        let taken = c.handle_add("c-2", "/x", NewCampaign::Named("alpha".into()), at(2));
        assert_eq!(taken, Err(CampaignError::NameTaken("alpha".into())));
        let (d, new) = c
            .handle_add("alpha", "/d", NewCampaign::Named("delta".into()), at(3))
            .unwrap();
        assert!(new);
        assert_eq!(c.get("alpha"), Some(&d), "an id wins over a name");
        let (same, new) = c
            .handle_add(
                "c-9",
                "/z",
                NewCampaign::NamedOrExisting("delta".into()),
                at(4),
            )
            .unwrap();
        assert!(!new);
        assert_eq!(same, d);
        assert_eq!(
            c.all().iter().map(|x| x.name.as_str()).collect::<Vec<_>>(),
            ["alpha", "delta"]
        );
    }

    #[test]
    fn a_directory_has_one_campaign_whoever_asks_first() {
        let mut c = Campaigns::new([camp("c0", "my-repo", "/elsewhere/my-repo", 1)]);
        let root = "/home/me/my repo";
        let base = || NewCampaign::ForRoot {
            base: "my-repo".into(),
        };
        let (first, added) = c.handle_add("c1", root, base(), at(2)).unwrap();
        assert!(added);
        assert_eq!(
            (first.id.as_str(), first.name.as_str()),
            ("c1", "my-repo-2")
        );
        let (again, added) = c.handle_add("c2", root, base(), at(3)).unwrap();
        assert!(!added);
        assert_eq!(again, first);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn every_numbered_name_taken_falls_back_to_the_id() {
        let mut c = Campaigns::new((1..=ROOT_NAMES_MAX).map(|i| {
            let name = if i == 1 {
                "p".to_string()
            } else {
                format!("p-{i}")
            };
            camp(&format!("c{i}"), &name, "/other", 1)
        }));
        let (n, _) = c
            .handle_add("ID", "/p", NewCampaign::ForRoot { base: "p".into() }, at(2))
            .unwrap();
        assert_eq!(n.name, "p-id");
    }

    #[test]
    fn removal_is_refused_while_sessions_live() {
        use crate::{Effect, Engine, Input, Limits, Record, Stored};
        let stored = Stored {
            campaigns: vec![camp("c-1", "alpha", "/a", 1)],
            ..Stored::default()
        };
        let (mut engine, _) =
            Engine::restore(Limits::default(), now(0), stored, &Default::default());
        let config = crate::SessionConfig::new("c-1", crate::Provider::ClaudeCode, "/a");
        engine.handle(
            now(0),
            Input::Create {
                req: 1,
                id: crate::SessionId("s".into()),
                config: config.into(),
            },
        );
        let remove = |req| Input::RemoveCampaign {
            req,
            key: "alpha".into(),
        };
        let fx = engine.handle(now(1), remove(2));
        assert_eq!(
            fx,
            vec![Effect::ReplyRemoveCampaign {
                req: 2,
                result: Err(CampaignError::LiveSessions(1))
            }]
        );
        assert_eq!(
            engine.campaigns().get("alpha").map(|c| c.id.as_str()),
            Some("c-1")
        );
        // The session's process never started: FAILED, not live any more.
        engine.handle(
            now(2),
            Input::Provider {
                id: crate::SessionId("s".into()),
                run: 1,
                cursor: None,
                event: crate::ProviderEvent::SpawnFailed {
                    reason: "no such file".into(),
                },
            },
        );
        assert_eq!(engine.live_sessions(), 0);
        let fx = engine.handle(now(3), remove(4));
        assert_eq!(
            fx,
            vec![
                Effect::Persist(Record::RemoveCampaign("c-1".into())),
                Effect::ReplyRemoveCampaign {
                    req: 4,
                    result: Ok(true)
                }
            ]
        );
        assert!(engine.campaigns().is_empty());
        let fx = engine.handle(now(4), remove(5));
        assert_eq!(
            fx,
            vec![Effect::ReplyRemoveCampaign {
                req: 5,
                result: Ok(false)
            }]
        );
    }
}
