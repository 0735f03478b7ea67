//! Reading a request: its media type, JSON bodies, an action's optional body and reason, a
//! list's query. Each refusal is the [`ApiError`] that names the field.

use super::error::ApiError;
use crate::ports::Cursor;
use http::HeaderMap;
use serde_json::Value;

/// The most tasks one list page returns.
pub const MAX_PAGE: usize = 100;
/// The longest reason an operator may give for an action.
pub const MAX_REASON_CHARS: usize = 500;
/// A list page's size unless `limit` says.
const DEFAULT_PAGE: usize = 50;

/// Checks the Content-Type (absent, or `application/json` with any parameters).
pub fn json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    if let Some(ct) = headers.get(http::header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or_default();
        // The media type, without parameters; media types are case-insensitive (RFC 9110).
        let media = ct.split(';').next().unwrap_or_default().trim();
        if !media.eq_ignore_ascii_case("application/json") {
            return Err(ApiError::UnsupportedMediaType(ct.to_owned()));
        }
    }
    Ok(())
}

/// A JSON body (any JSON), under a JSON Content-Type.
pub fn json_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    json_content_type(headers)?;
    serde_json::from_slice(body).map_err(|e| ApiError::InvalidJson(e.to_string()))
}

/// Parses a body that must be one JSON object of shape `T`: `invalid_json` if it is not JSON at
/// all, `invalid_request` if it is JSON of another shape (an array is not an object, although
/// serde would build a struct from one by position).
pub fn json_object<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    // A full parse checks the syntax (and the UTF-8 of every string) before the shape, so a
    // body that is not JSON is named as such even when its shape is wrong early on.
    if let Err(e) = serde_json::from_slice::<Value>(body) {
        return Err(ApiError::InvalidJson(e.to_string()));
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::InvalidRequest(
            "the body must be a JSON object".into(),
        ));
    }
    serde_json::from_slice(body).map_err(|e| ApiError::InvalidRequest(e.to_string()))
}

/// An action's optional JSON body (empty: the default), and its `reason` held to
/// [`MAX_REASON_CHARS`].
pub fn action_body<T: serde::de::DeserializeOwned + Default>(
    body: &[u8],
    reason: impl Fn(&T) -> Option<&String>,
) -> Result<T, ApiError> {
    let parsed = if body.iter().all(u8::is_ascii_whitespace) {
        T::default()
    } else {
        json_object::<T>(body)?
    };
    if reason(&parsed).is_some_and(|r| r.chars().count() > MAX_REASON_CHARS) {
        return Err(ApiError::validation(format!(
            "reason is over {MAX_REASON_CHARS} characters"
        )));
    }
    Ok(parsed)
}

/// A list's page: its size and where it starts.
pub struct PageQuery {
    pub limit: usize,
    pub cursor: Option<Cursor>,
}

impl Default for PageQuery {
    fn default() -> Self {
        Self {
            limit: DEFAULT_PAGE,
            cursor: None,
        }
    }
}

impl PageQuery {
    /// Reads `limit` or `cursor`; `Ok(false)`: `key` is neither.
    pub fn read(&mut self, key: &str, value: &str) -> Result<bool, ApiError> {
        match key {
            "limit" => match value.parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => self.limit = n,
                _ => return Err(ApiError::InvalidLimit { max: MAX_PAGE }),
            },
            "cursor" => match Cursor::decode(value) {
                Some(c) => self.cursor = Some(c),
                None => return Err(ApiError::InvalidCursor),
            },
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// A search by key's parameters (`key=name:value`, `from`, `to` as RFC 3339 times).
#[derive(Debug, Default)]
pub struct SearchQuery {
    pub key: Option<crate::domain::keys::SearchKey>,
    pub from: Option<chrono::DateTime<chrono::Utc>>,
    pub to: Option<chrono::DateTime<chrono::Utc>>,
}

impl SearchQuery {
    /// Reads `key`, `from` or `to`; `Ok(false)`: `name` is none of them.
    pub fn read(&mut self, name: &str, value: &str) -> Result<bool, ApiError> {
        let time = |v: &str| {
            chrono::DateTime::parse_from_rfc3339(v)
                .map(|t| t.with_timezone(&chrono::Utc))
                .map_err(|e| {
                    ApiError::InvalidSearch(format!(
                        "{name} must be an RFC 3339 time, as in 2026-11-30T12:00:00Z ({e})"
                    ))
                })
        };
        match name {
            "key" => {
                let key = crate::domain::keys::SearchKey::parse(value, "key")
                    .map_err(|e| ApiError::InvalidSearch(e.to_string()))?;
                self.key = Some(key);
            }
            "from" => self.from = Some(time(value)?),
            "to" => self.to = Some(time(value)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The search's key, which `from` and `to` need.
    pub fn key(&self) -> Result<Option<&crate::domain::keys::SearchKey>, ApiError> {
        match &self.key {
            None if self.from.is_some() || self.to.is_some() => Err(ApiError::InvalidSearch(
                "from and to narrow a search by key: give key=name:value".into(),
            )),
            key => Ok(key.as_ref()),
        }
    }
}
