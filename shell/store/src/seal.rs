//! Credentials at rest: secret values (see [`paddock_support::secret`]) of a session's environment and
//! `provider_config`, and of a task's environment, are stored sealed with ChaCha20-Poly1305
//! under a key kept **outside** the database, in `secret.key` (0600) beside it. A copy of the
//! database alone reveals no credential; the key file alone is 32 random bytes.
//!
//! A sealed value is `sealed:v1:` + base64(nonce ‖ ciphertext ‖ tag), bound to its key name
//! (the name is the AEAD's associated data, so a value moved to another key does not open).
//! A value that does not open (the key file was lost or replaced) loads as empty, with a
//! warning naming the key, never the value: the session's other data stays usable.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

use super::{Result, StoreError};
use paddock_support::secret::is_secret;

const PREFIX: &str = "sealed:v1:";
const KEY_LEN: usize = 32;

/// The sealing key of one store.
pub struct Sealer {
    key: LessSafeKey,
    rng: SystemRandom,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(••• )")
    }
}

impl Sealer {
    /// The key in `path`, created (0600, random) when the file does not exist.
    pub fn load_or_create(path: &Path) -> Result<Sealer> {
        let rng = SystemRandom::new();
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = random_key(&rng)?;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(|e| StoreError::Corrupt(format!("{}: {e}", path.display())))?;
                f.write_all(&key)
                    .and_then(|()| f.sync_all())
                    .map_err(|e| StoreError::Corrupt(format!("{}: {e}", path.display())))?;
                key.to_vec()
            }
            Err(e) => return Err(StoreError::Corrupt(format!("{}: {e}", path.display()))),
        };
        if bytes.len() != KEY_LEN {
            return Err(StoreError::Corrupt(format!(
                "{}: a sealing key is {KEY_LEN} bytes, this file has {}",
                path.display(),
                bytes.len()
            )));
        }
        Sealer::from_bytes(&bytes, rng)
    }

    /// A key that lives as long as the process (an in-memory store).
    pub fn ephemeral() -> Result<Sealer> {
        let rng = SystemRandom::new();
        let key = random_key(&rng)?;
        Sealer::from_bytes(&key, rng)
    }

    fn from_bytes(bytes: &[u8], rng: SystemRandom) -> Result<Sealer> {
        let key = UnboundKey::new(&CHACHA20_POLY1305, bytes)
            .map_err(|_| StoreError::Corrupt("bad sealing key".into()))?;
        Ok(Sealer {
            key: LessSafeKey::new(key),
            rng,
        })
    }

    /// The map as stored: secret values sealed (an already sealed one stays as it is).
    pub fn seal(&self, map: &BTreeMap<String, String>) -> Result<BTreeMap<String, String>> {
        map.iter()
            .map(|(k, v)| {
                if is_secret(k) && !v.starts_with(PREFIX) {
                    Ok((k.clone(), self.seal_value(k, v)?))
                } else {
                    Ok((k.clone(), v.clone()))
                }
            })
            .collect()
    }

    /// The map as loaded: sealed values opened.
    pub fn open(&self, mut map: BTreeMap<String, String>) -> BTreeMap<String, String> {
        for (k, v) in map.iter_mut() {
            if let Some(sealed) = v.strip_prefix(PREFIX) {
                *v = self.open_value(k, sealed).unwrap_or_else(|| {
                    tracing::warn!(
                        key = %k,
                        "a sealed credential does not open with this data dir's secret.key; it reads as empty"
                    );
                    String::new()
                });
            }
        }
        map
    }

    /// Whether the map holds a secret value stored in the clear (an older install's rows).
    pub fn needs_sealing(map: &BTreeMap<String, String>) -> bool {
        map.iter()
            .any(|(k, v)| is_secret(k) && !v.is_empty() && !v.starts_with(PREFIX))
    }

    fn seal_value(&self, key: &str, value: &str) -> Result<String> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .map_err(|_| StoreError::Corrupt("no randomness for a nonce".into()))?;
        let mut buf = value.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(key.as_bytes()),
                &mut buf,
            )
            .map_err(|_| StoreError::Corrupt("sealing failed".into()))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        Ok(format!(
            "{PREFIX}{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(out)
        ))
    }

    fn open_value(&self, key: &str, sealed: &str) -> Option<String> {
        let raw = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(sealed)
            .ok()?;
        if raw.len() < NONCE_LEN {
            return None;
        }
        let (nonce, rest) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = rest.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(key.as_bytes()), &mut buf)
            .ok()?;
        String::from_utf8(plain.to_vec()).ok()
    }
}

fn random_key(rng: &SystemRandom) -> Result<[u8; KEY_LEN]> {
    let mut key = [0u8; KEY_LEN];
    rng.fill(&mut key)
        .map_err(|_| StoreError::Corrupt("no randomness for a sealing key".into()))?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn secrets_are_sealed_others_are_not_and_they_open_again() {
        let s = Sealer::ephemeral().unwrap();
        let plain = map(&[("api_key", "sk-XYZ"), ("model", "m")]);
        let sealed = s.seal(&plain).unwrap();
        assert!(sealed["api_key"].starts_with(PREFIX));
        assert!(!sealed["api_key"].contains("sk-XYZ"));
        assert_eq!(sealed["model"], "m");
        assert_eq!(s.seal(&sealed).unwrap(), sealed, "sealing is idempotent");
        assert!(Sealer::needs_sealing(&plain));
        assert!(!Sealer::needs_sealing(&sealed));
        assert_eq!(s.open(sealed), plain);
    }

    #[test]
    fn a_value_moved_to_another_key_or_another_store_does_not_open() {
        let s = Sealer::ephemeral().unwrap();
        let sealed = s.seal(&map(&[("api_key", "sk-XYZ")])).unwrap();
        let moved = map(&[("OTHER_TOKEN", &sealed["api_key"])]);
        assert_eq!(s.open(moved)["OTHER_TOKEN"], "");
        let other = Sealer::ephemeral().unwrap();
        assert_eq!(other.open(sealed)["api_key"], "");
    }

    #[test]
    fn the_key_file_is_private_and_reused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("secret.key");
        let a = Sealer::load_or_create(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let sealed = a.seal(&map(&[("api_key", "sk-1")])).unwrap();
        let b = Sealer::load_or_create(&path).unwrap();
        assert_eq!(b.open(sealed)["api_key"], "sk-1");
        std::fs::write(&path, b"short").unwrap();
        assert!(Sealer::load_or_create(&path).is_err());
    }
}
