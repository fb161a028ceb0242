//! Flight RPC's session actions — `SetSessionOptions`, `GetSessionOptions`, `CloseSession` —
//! over a client's session. Session options are the session's SQL settings: setting one is
//! `SET name = value`, and getting them lists every setting with its current value.
//!
//! The messages are those of Arrow's `Flight.proto` (arrow-flight does not generate them yet);
//! action bodies and results are the serialized messages themselves.

use std::collections::HashMap;

use prost::Message;
use tonic::Status;

use nyala_server::{ClientSession, Sessions};

pub const SET_SESSION_OPTIONS: &str = "SetSessionOptions";
pub const GET_SESSION_OPTIONS: &str = "GetSessionOptions";
pub const CLOSE_SESSION: &str = "CloseSession";

#[derive(Clone, PartialEq, Message)]
pub struct StringListValue {
    #[prost(string, repeated, tag = "1")]
    pub values: Vec<String>,
}

/// The variants keep the names of `Flight.proto`'s oneof fields.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum OptionValue {
    #[prost(string, tag = "1")]
    StringValue(String),
    #[prost(bool, tag = "2")]
    BoolValue(bool),
    #[prost(sfixed64, tag = "3")]
    Int64Value(i64),
    #[prost(double, tag = "4")]
    DoubleValue(f64),
    #[prost(message, tag = "5")]
    StringListValue(StringListValue),
}

#[derive(Clone, PartialEq, Message)]
pub struct SessionOptionValue {
    #[prost(oneof = "OptionValue", tags = "1, 2, 3, 4, 5")]
    pub option_value: Option<OptionValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct SetSessionOptionsRequest {
    #[prost(map = "string, message", tag = "1")]
    pub session_options: HashMap<String, SessionOptionValue>,
}

/// `SetSessionOptionsResult.ErrorValue`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum ErrorValue {
    Unspecified = 0,
    InvalidName = 1,
    InvalidValue = 2,
    Error = 3,
}

#[derive(Clone, PartialEq, Message)]
pub struct SetSessionOptionsError {
    #[prost(enumeration = "ErrorValue", tag = "1")]
    pub value: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct SetSessionOptionsResult {
    #[prost(map = "string, message", tag = "1")]
    pub errors: HashMap<String, SetSessionOptionsError>,
}

#[derive(Clone, PartialEq, Message)]
pub struct GetSessionOptionsResult {
    #[prost(map = "string, message", tag = "1")]
    pub session_options: HashMap<String, SessionOptionValue>,
}

/// `CloseSessionResult.Status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum CloseStatus {
    Unspecified = 0,
    Closed = 1,
    Closing = 2,
    NotCloseable = 3,
}

#[derive(Clone, PartialEq, Message)]
pub struct CloseSessionResult {
    #[prost(enumeration = "CloseStatus", tag = "1")]
    pub status: i32,
}

/// Applies each option as `SET name = value`; the options refused, with why.
pub async fn set_options(session: &ClientSession, body: &[u8]) -> Result<Vec<u8>, Status> {
    let request = SetSessionOptionsRequest::decode(body)
        .map_err(|_| Status::invalid_argument("malformed SetSessionOptionsRequest"))?;
    let known: std::collections::HashSet<String> = session
        .sql()
        .settings()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let mut errors = HashMap::new();
    for (name, value) in request.session_options {
        let error = if !known.contains(&name.to_ascii_lowercase()) {
            Some(ErrorValue::InvalidName)
        } else {
            match value.option_value.map(text) {
                None => Some(ErrorValue::InvalidValue),
                Some(text) => match session.sql().set(&name, &text).await {
                    Ok(()) => None,
                    Err(_) => Some(ErrorValue::InvalidValue),
                },
            }
        };
        if let Some(error) = error {
            errors.insert(
                name,
                SetSessionOptionsError {
                    value: error as i32,
                },
            );
        }
    }
    Ok(SetSessionOptionsResult { errors }.encode_to_vec())
}

/// A setting's value as `SET` takes it.
fn text(value: OptionValue) -> String {
    match value {
        OptionValue::StringValue(s) => s,
        OptionValue::BoolValue(b) => b.to_string(),
        OptionValue::Int64Value(i) => i.to_string(),
        OptionValue::DoubleValue(d) => d.to_string(),
        OptionValue::StringListValue(list) => list.values.join(","),
    }
}

/// Every setting of the session with its current value (settings without one are left out).
pub fn get_options(session: &ClientSession) -> Vec<u8> {
    let session_options = session
        .sql()
        .settings()
        .into_iter()
        .filter_map(|(name, value)| {
            let value = SessionOptionValue {
                option_value: Some(OptionValue::StringValue(value?)),
            };
            Some((name, value))
        })
        .collect();
    GetSessionOptionsResult { session_options }.encode_to_vec()
}

/// Ends the session.
pub fn close(sessions: &Sessions, session: &ClientSession) -> Vec<u8> {
    sessions.close(session.id());
    CloseSessionResult {
        status: CloseStatus::Closed as i32,
    }
    .encode_to_vec()
}
