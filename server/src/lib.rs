//! The session layer of a Nyala server: what a client has and does on the server, whatever
//! wire protocol it speaks. Flight SQL (`nyala-flight`) and PostgreSQL (`nyala-pg`) are front
//! ends over it: they decode requests, find the client's [`ClientSession`], run statements
//! through it ([`run`]) and say its errors ([`ServerError`]) in their protocol's terms.
//!
//! - [`session`]: sessions (settings, the transaction, prepared statements, queries waiting to
//!   be fetched), found by id, token or connection.
//! - [`auth`]: passwords checked against the catalog's users.
//! - [`run`]: statements run, tracked and cancellable.
//! - [`activity`]: the statements running and run, for operators, and their metrics.
//! - [`limits`]: what one request may ask and one session may hold.

pub mod activity;
pub mod auth;
mod error;
pub mod limits;
pub mod run;
pub mod session;

pub use error::{Result, ServerError};
pub use session::{ClientSession, Sessions};

/// The user statements are shown as run by when the server does not authenticate.
pub const ANONYMOUS: &str = "anonymous";

/// `text`, or its start and end with the middle left out when it is longer than `max` chars.
pub fn excerpt(text: &str, max: usize) -> String {
    let chars = text.chars().count();
    if chars <= max {
        return text.to_string();
    }
    let head: String = text.chars().take(max * 2 / 3).collect();
    let tail: String = text.chars().skip(chars - max / 3).collect();
    let left_out = chars - head.chars().count() - tail.chars().count();
    format!("{head} [... {left_out} characters left out ...] {tail}")
}
