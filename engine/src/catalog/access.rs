//! Who may do what: the users the catalog knows ([`UserInfo`], passwords kept as salted Argon2id
//! hashes, and as SCRAM-SHA-256 verifiers for PostgreSQL clients) and, on every table and view,
//! its owner and the privileges granted on it ([`Access`]). The catalog only stores them; the
//! SQL layer decides what a statement needs.

use std::collections::{BTreeMap, BTreeSet};

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use serde::{Deserialize, Serialize};

use crate::{EngineError, Result};

/// What a user may be granted on a table (a view: SELECT only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Privilege {
    Select,
    Insert,
    Update,
    Delete,
}

impl Privilege {
    pub const ALL: [Privilege; 4] = [
        Privilege::Select,
        Privilege::Insert,
        Privilege::Update,
        Privilege::Delete,
    ];

    /// The SQL keyword.
    pub fn name(self) -> &'static str {
        match self {
            Privilege::Select => "SELECT",
            Privilege::Insert => "INSERT",
            Privilege::Update => "UPDATE",
            Privilege::Delete => "DELETE",
        }
    }
}

impl std::fmt::Display for Privilege {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A table's or view's owner and the privileges granted on it, by user.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Access {
    /// The user who created it (None: created while authentication was off).
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub grants: BTreeMap<String, BTreeSet<Privilege>>,
}

impl Access {
    pub fn owned_by(owner: Option<String>) -> Self {
        Self {
            owner,
            grants: BTreeMap::new(),
        }
    }

    /// Whether `user` owns it or was granted `privilege` on it.
    pub fn allows(&self, user: &str, privilege: Privilege) -> bool {
        self.owner.as_deref() == Some(user)
            || self
                .grants
                .get(user)
                .is_some_and(|granted| granted.contains(&privilege))
    }

    /// Whether `user` owns it or holds any privilege on it (what makes it visible).
    pub fn sees(&self, user: &str) -> bool {
        self.owner.as_deref() == Some(user) || self.grants.contains_key(user)
    }

    /// `privileges` granted to `user` (`grant`) or taken back (`!grant`).
    pub fn change(&mut self, user: &str, privileges: &[Privilege], grant: bool) {
        let granted = self.grants.entry(user.to_string()).or_default();
        for privilege in privileges {
            match grant {
                true => granted.insert(*privilege),
                false => granted.remove(privilege),
            };
        }
        if granted.is_empty() {
            self.grants.remove(user);
        }
    }
}

/// A user as the catalog stores it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    pub name: String,
    /// The password's Argon2id hash in PHC string form (algorithm, parameters, salt, hash).
    pub password_hash: String,
    /// The administrator may do everything, and alone manages users.
    #[serde(default)]
    pub admin: bool,
    /// What SCRAM-SHA-256 checks the password against (PostgreSQL clients); None for
    /// passwords set before Nyala stored it.
    #[serde(default)]
    pub scram: Option<ScramVerifier>,
}

impl std::fmt::Debug for UserInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserInfo")
            .field("name", &self.name)
            .field("admin", &self.admin)
            .finish_non_exhaustive()
    }
}

impl UserInfo {
    /// A user whose password is `password` (hashed here with a fresh salt).
    pub fn new(name: &str, password: &str, admin: bool) -> Result<Self> {
        Ok(Self {
            name: name.to_string(),
            password_hash: hash_password(password)?,
            admin,
            scram: Some(ScramVerifier::new(password)),
        })
    }

    /// Whether `password` is this user's.
    pub fn verify(&self, password: &str) -> bool {
        PasswordHash::new(&self.password_hash).is_ok_and(|hash| {
            Argon2::default()
                .verify_password(password.as_bytes(), &hash)
                .is_ok()
        })
    }
}

/// Iterations of SCRAM-SHA-256's key derivation (PostgreSQL's default).
pub const SCRAM_ITERATIONS: usize = 4096;

/// What SCRAM-SHA-256 (RFC 5802, 7677) needs to check a password it is never sent: a random
/// salt and the password derived with it (PBKDF2-HMAC-SHA-256, [`SCRAM_ITERATIONS`]), base64.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScramVerifier {
    salt: String,
    salted_password: String,
}

impl ScramVerifier {
    /// The verifier of `password`, with a fresh salt.
    pub fn new(password: &str) -> Self {
        use base64::Engine;
        let salt: [u8; 16] = rand::random();
        // As PostgreSQL: SASLprep, or the password as it is where that fails.
        let normalized = stringprep::saslprep(password)
            .map(|p| p.into_owned())
            .unwrap_or_else(|_| password.to_string());
        let mut salted = [0u8; 32];
        ring::pbkdf2::derive(
            ring::pbkdf2::PBKDF2_HMAC_SHA256,
            std::num::NonZeroU32::new(SCRAM_ITERATIONS as u32).expect("non-zero"),
            &salt,
            normalized.as_bytes(),
            &mut salted,
        );
        let b64 = base64::engine::general_purpose::STANDARD;
        Self {
            salt: b64.encode(salt),
            salted_password: b64.encode(salted),
        }
    }

    /// The salt and the salted password; None if what the catalog holds is damaged.
    pub fn salted(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        Some((
            b64.decode(&self.salt).ok()?,
            b64.decode(&self.salted_password).ok()?,
        ))
    }
}

impl std::fmt::Debug for ScramVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramVerifier").finish_non_exhaustive()
    }
}

/// Shortest password accepted.
const MIN_PASSWORD_CHARS: usize = 8;

/// `password`'s salted Argon2id hash (PHC string).
pub fn hash_password(password: &str) -> Result<String> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(EngineError::Unsupported(format!(
            "a password needs at least {MIN_PASSWORD_CHARS} characters"
        )));
    }
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|e| EngineError::Unsupported(format!("cannot hash the password: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_verify_against_their_salted_hash_only() {
        let user = UserInfo::new("alice", "correct horse", false).unwrap();
        assert!(user.verify("correct horse"));
        assert!(!user.verify("correct horsE"));
        assert!(!user.password_hash.contains("correct"));
        let again = UserInfo::new("alice", "correct horse", false).unwrap();
        assert_ne!(user.password_hash, again.password_hash, "salted");
        assert!(UserInfo::new("bob", "short", false).is_err());
    }

    #[test]
    fn owners_and_grantees_are_allowed_what_they_hold() {
        let mut access = Access::owned_by(Some("alice".into()));
        assert!(access.allows("alice", Privilege::Delete));
        assert!(!access.sees("bob"));
        access.change("bob", &[Privilege::Select, Privilege::Insert], true);
        assert!(access.allows("bob", Privilege::Select));
        assert!(!access.allows("bob", Privilege::Update));
        access.change("bob", &[Privilege::Select, Privilege::Insert], false);
        assert!(!access.sees("bob"));
        assert!(access.grants.is_empty());
    }
}
