//! A small typed client of the sas HTTP API.

use crate::api::{ErrorBody, ListPage, OrderView, ProcessState};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::time::Duration;
use url::{Host, Url};

/// How long to wait for a TCP (and TLS) connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take in all.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API answered with an error status. `code` and `message` come from the
    /// `{"error": {...}}` body, or are made up from the status if the body has another shape.
    #[error("{code}: {message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// The endpoint could not be reached, or the connection failed mid-answer.
    #[error("cannot reach {url}: {}", innermost(source))]
    Transport {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The API answered success with a body this client cannot read.
    #[error("unexpected answer to {context}: {message}")]
    Decode { context: String, message: String },
    /// The endpoint is not a usable http(s) base URL.
    #[error("invalid endpoint {0:?}: it must be an http:// or https:// URL with a host")]
    Endpoint(String),
}

/// The deepest cause of an error: the useful part of a reqwest error chain (e.g. "Connection
/// refused (os error 111)").
fn innermost(e: &reqwest::Error) -> String {
    let mut cur: &dyn std::error::Error = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

impl ClientError {
    /// The `sasctl` exit code for this error: [`crate::exit::API`] when the API answered,
    /// [`crate::exit::TRANSPORT`] when it could not be reached, [`crate::exit::USAGE`] for a bad
    /// endpoint.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Api { .. } | Self::Decode { .. } => crate::exit::API,
            Self::Transport { .. } => crate::exit::TRANSPORT,
            Self::Endpoint(_) => crate::exit::USAGE,
        }
    }
}

/// One API call, for [`Client::send`] (which returns the raw JSON answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// `GET /orders?state=..&limit=..&cursor=..`
    List {
        state: &'a ProcessState,
        limit: Option<u32>,
        cursor: Option<&'a str>,
    },
    /// `GET /orders/{id}`
    Show { id: &'a str },
    /// `POST /orders/{id}/retry`
    Retry { id: &'a str },
    /// `POST /orders/{id}/compensate`
    Compensate { id: &'a str },
    /// `POST /orders/{id}/cancel`, with `{"reason": ..}` if a reason is given.
    Cancel {
        id: &'a str,
        reason: Option<&'a str>,
    },
}

impl Request<'_> {
    fn is_post(&self) -> bool {
        !matches!(self, Self::List { .. } | Self::Show { .. })
    }

    /// The path segments under the base URL.
    fn segments(&self) -> Vec<&str> {
        match *self {
            Self::List { .. } => vec!["orders"],
            Self::Show { id } => vec!["orders", id],
            Self::Retry { id } => vec!["orders", id, "retry"],
            Self::Compensate { id } => vec!["orders", id, "compensate"],
            Self::Cancel { id, .. } => vec!["orders", id, "cancel"],
        }
    }
}

/// Decodes a raw answer into a typed one; `context` names the call in the error.
pub fn decode<T: DeserializeOwned>(context: &str, raw: &Value) -> Result<T, ClientError> {
    T::deserialize(raw).map_err(|e| ClientError::Decode {
        context: context.to_owned(),
        message: e.to_string(),
    })
}

/// A client of the sas HTTP API rooted at `base` (e.g. `http://127.0.0.1:3000`, or an API
/// Gateway stage URL such as `https://abc.execute-api.eu-west-1.amazonaws.com/prod`).
#[derive(Debug, Clone)]
pub struct Client {
    base: Url,
    http: reqwest::Client,
}

impl Client {
    /// A client with sasctl's timeouts. Proxies from the environment are honoured, except for
    /// loopback endpoints, which are always reached directly.
    pub fn new(base: Url) -> Result<Self, ClientError> {
        check_endpoint(&base)?;
        let mut builder = reqwest::Client::builder()
            .user_agent(concat!("sasctl/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT);
        if is_loopback(&base) {
            builder = builder.no_proxy();
        }
        let http = builder.build().map_err(|source| ClientError::Transport {
            url: base.to_string(),
            source,
        })?;
        Ok(Self { base, http })
    }

    /// A client using a caller-built `reqwest::Client`.
    pub fn with_http(base: Url, http: reqwest::Client) -> Result<Self, ClientError> {
        check_endpoint(&base)?;
        Ok(Self { base, http })
    }

    /// The base URL.
    pub fn base(&self) -> &Url {
        &self.base
    }

    /// The full URL of a request.
    pub fn url(&self, request: &Request<'_>) -> Result<Url, ClientError> {
        let mut url = self.base.clone();
        url.set_query(None);
        url.set_fragment(None);
        url.path_segments_mut()
            .map_err(|()| ClientError::Endpoint(self.base.to_string()))?
            .pop_if_empty()
            .extend(request.segments());
        if let Request::List {
            state,
            limit,
            cursor,
        } = *request
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("state", state.as_str());
            if let Some(limit) = limit {
                q.append_pair("limit", &limit.to_string());
            }
            if let Some(cursor) = cursor {
                q.append_pair("cursor", cursor);
            }
        }
        Ok(url)
    }

    /// Makes one call and returns the raw JSON of a successful (2xx) answer.
    pub async fn send(&self, request: &Request<'_>) -> Result<Value, ClientError> {
        let url = self.url(request)?;
        let transport = |source| ClientError::Transport {
            url: url.to_string(),
            source,
        };
        let builder = if request.is_post() {
            let b = self.http.post(url.clone());
            match request {
                Request::Cancel {
                    reason: Some(reason),
                    ..
                } => b.json(&serde_json::json!({ "reason": reason })),
                _ => b,
            }
        } else {
            self.http.get(url.clone())
        };
        let response = builder
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(transport)?;
        let status = response.status();
        let body = response.bytes().await.map_err(transport)?;
        if !status.is_success() {
            return Err(api_error(status, &body));
        }
        serde_json::from_slice(&body).map_err(|e| ClientError::Decode {
            context: describe(request, &url),
            message: e.to_string(),
        })
    }

    async fn call<T: DeserializeOwned>(&self, request: &Request<'_>) -> Result<T, ClientError> {
        let raw = self.send(request).await?;
        decode(&describe(request, &self.url(request)?), &raw)
    }

    /// One page of the orders in `state`.
    pub async fn list(
        &self,
        state: &ProcessState,
        limit: Option<u32>,
        cursor: Option<&str>,
    ) -> Result<ListPage, ClientError> {
        self.call(&Request::List {
            state,
            limit,
            cursor,
        })
        .await
    }

    /// One order, with its steps and history.
    pub async fn show(&self, id: &str) -> Result<OrderView, ClientError> {
        self.call(&Request::Show { id }).await
    }

    /// Asks for an order to be processed again from its failed step.
    pub async fn retry(&self, id: &str) -> Result<OrderView, ClientError> {
        self.call(&Request::Retry { id }).await
    }

    /// Asks for an order's completed steps to be undone.
    pub async fn compensate(&self, id: &str) -> Result<OrderView, ClientError> {
        self.call(&Request::Compensate { id }).await
    }

    /// Asks for an order to be cancelled.
    pub async fn cancel(&self, id: &str, reason: Option<&str>) -> Result<OrderView, ClientError> {
        self.call(&Request::Cancel { id, reason }).await
    }
}

/// "GET http://host/orders/x": names a call in errors.
pub(crate) fn describe(request: &Request<'_>, url: &Url) -> String {
    let method = if request.is_post() { "POST" } else { "GET" };
    format!("{method} {url}")
}

fn check_endpoint(base: &Url) -> Result<(), ClientError> {
    if matches!(base.scheme(), "http" | "https") && base.host().is_some() {
        Ok(())
    } else {
        Err(ClientError::Endpoint(base.to_string()))
    }
}

fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(Host::Ipv4(a)) => a.is_loopback(),
        Some(Host::Ipv6(a)) => a.is_loopback(),
        None => false,
    }
}

/// The most of a non-JSON error body quoted in a message.
const MAX_QUOTED_BODY: usize = 200;

fn api_error(status: reqwest::StatusCode, body: &[u8]) -> ClientError {
    if let Ok(ErrorBody { error }) = serde_json::from_slice::<ErrorBody>(body) {
        return ClientError::Api {
            status: status.as_u16(),
            code: error.code,
            message: error.message,
        };
    }
    let reason = status.canonical_reason().unwrap_or("error");
    let text = crate::render::clean(String::from_utf8_lossy(body).trim(), MAX_QUOTED_BODY);
    let message = if text.is_empty() {
        format!("HTTP {} {reason}", status.as_u16())
    } else {
        format!("HTTP {} {reason}: {text}", status.as_u16())
    };
    ClientError::Api {
        status: status.as_u16(),
        code: format!("http_{}", status.as_u16()),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(base: &str) -> Result<Client, Box<dyn std::error::Error>> {
        Ok(Client::new(Url::parse(base)?)?)
    }

    #[test]
    fn urls_encode_ids_and_keep_a_base_path() -> Result<(), Box<dyn std::error::Error>> {
        let c = client("http://127.0.0.1:3000")?;
        assert_eq!(
            c.url(&Request::Show { id: "a/b?c" })?.as_str(),
            "http://127.0.0.1:3000/orders/a%2Fb%3Fc"
        );
        let c = client("https://api.example.com/prod/?x=1#f")?;
        assert_eq!(
            c.url(&Request::Cancel {
                id: "o1",
                reason: None
            })?
            .as_str(),
            "https://api.example.com/prod/orders/o1/cancel"
        );
        let state = ProcessState::CompensationFailed;
        let url = c.url(&Request::List {
            state: &state,
            limit: Some(5),
            cursor: Some("a+b=/c"),
        })?;
        assert_eq!(
            url.as_str(),
            "https://api.example.com/prod/orders?state=CompensationFailed&limit=5&cursor=a%2Bb%3D%2Fc"
        );
        Ok(())
    }

    #[test]
    fn rejects_non_http_endpoints() -> Result<(), url::ParseError> {
        for bad in [
            "mailto:ops@example.com",
            "file:///tmp/x",
            "ftp://example.com",
        ] {
            let err = Client::new(Url::parse(bad)?).err();
            assert!(matches!(err, Some(ClientError::Endpoint(_))), "{bad}");
        }
        Ok(())
    }

    #[test]
    fn error_bodies_become_api_errors() {
        let e = api_error(
            reqwest::StatusCode::CONFLICT,
            br#"{"error":{"code":"conflict","message":"order is Processing"}}"#,
        );
        assert!(
            matches!(&e, ClientError::Api { status: 409, code, .. } if code == "conflict"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "conflict: order is Processing");
        assert_eq!(e.exit_code(), crate::exit::API);

        let e = api_error(
            reqwest::StatusCode::BAD_GATEWAY,
            b"<html>\nbad\tgateway</html>",
        );
        assert_eq!(
            e.to_string(),
            "http_502: HTTP 502 Bad Gateway: <html> bad gateway</html>"
        );
        let e = api_error(reqwest::StatusCode::SERVICE_UNAVAILABLE, b"");
        assert_eq!(e.to_string(), "http_503: HTTP 503 Service Unavailable");
    }
}
