//! Passwords checked against the catalog's users (`CREATE USER`), for every front end: Flight
//! SQL's Basic handshake and PostgreSQL's startup both come here. Until the catalog has a user,
//! authentication is off and every client is accepted.

use std::sync::Arc;

use nyala_engine::{Client, UserInfo};

use crate::error::{Result, ServerError};

/// The administrator `nyala serve --user/--password` creates at its first start.
#[derive(Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// Checks credentials against the users in the catalog.
#[derive(Clone)]
pub struct Auth {
    client: Client,
}

impl Auth {
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Whether clients must authenticate: the catalog has a user.
    pub fn required(&self) -> bool {
        !self.client.users().is_empty()
    }

    /// The user `name` if `password` is its password; the same error for an unknown user and
    /// a wrong password.
    pub async fn verify(&self, name: &str, password: &str) -> Result<Arc<UserInfo>> {
        let wrong = || ServerError::Unauthenticated("invalid username or password".into());
        let user = self.client.user(name).ok_or_else(wrong)?;
        let password = password.to_string();
        // Argon2 takes tens of milliseconds of CPU by design: off the async threads.
        let checked = user.clone();
        let valid = tokio::task::spawn_blocking(move || checked.verify(&password))
            .await
            .map_err(|_| wrong())?;
        match valid {
            true => Ok(user),
            false => Err(wrong()),
        }
    }

    /// The user `name`, if the catalog has it.
    pub fn user(&self, name: &str) -> Option<Arc<UserInfo>> {
        self.client.user(name)
    }

    /// Whether the user a session logged in as still exists with the password it used.
    pub fn still_valid(&self, login: &nyala_sql::Login) -> bool {
        self.client
            .user(&login.name)
            .is_some_and(|now| now.password_hash == login.password_hash)
    }
}
