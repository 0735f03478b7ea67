//! What `sas-local`'s HTTP API checks before any authorizer or handler, because it listens on
//! a developer's machine, where every web page the developer opens can send it requests:
//!
//! - **Host** (DNS rebinding): a page of `evil.example` whose name was rebound to 127.0.0.1
//!   reaches the port, but with its own name as the `Host`. Only loopback names (`localhost`, a
//!   loopback IP), the bound address, and names given with `--allow-host` are answered, on the
//!   bound port; anything else is `421 misdirected_request`.
//! - **Origin**: a browser names the page behind every cross-origin request (and behind every
//!   `POST`); a request from a page of another origin is `403 cross_origin`, whatever it sends.
//!   Requests without `Origin` (curl, SDKs, `sasctl`) are not a browser's. The console's pages
//!   are left to the console's own check (its forms must be `Sec-Fetch-Site: same-origin`).
//! - **Content-Type**: a request with a body, outside the console's forms, must declare
//!   `application/json`: a cross-site page can post `text/plain`, a form or a `Blob` with no
//!   type without a CORS preflight, and the handlers would read any of those as JSON
//!   (`415 unsupported_media_type`).

use http::{HeaderMap, Method, Response, StatusCode, header};
use std::net::{IpAddr, SocketAddr};

/// The hosts the API answers.
#[derive(Debug, Clone)]
pub struct Hosts {
    bound: SocketAddr,
    extra: Vec<String>,
}

impl Hosts {
    /// The API bound to `bound`; `extra`: more host names to answer (`--allow-host`).
    pub fn new(bound: SocketAddr, extra: &[String]) -> Self {
        Self {
            bound,
            extra: extra.iter().map(|h| normalize(h)).collect(),
        }
    }

    /// Whether `authority` (a `Host` header, or an `Origin`'s host and port) names this API.
    pub fn allows(&self, authority: &str) -> bool {
        let Some((host, port)) = key(authority).filter(|_| !authority.contains('@')) else {
            return false;
        };
        if port != self.bound.port() {
            return false;
        }
        match host.parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || ip == self.bound.ip(),
            Err(_) => host == "localhost" || self.extra.contains(&host),
        }
    }
}

/// A host name as compared: lower case, without IPv6 brackets or a trailing dot.
fn normalize(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// An error answer: `{"error": {"code", "message"}}`.
fn refuse(status: StatusCode, code: &str, message: String) -> Response<String> {
    let mut r =
        Response::new(serde_json::json!({"error": {"code": code, "message": message}}).to_string());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// Checks one request (its path without the query) before it reaches an authorizer: `Err` is
/// the answer.
pub fn check(
    hosts: &Hosts,
    method: &Method,
    uri: &http::Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), Box<Response<String>>> {
    // HTTP/1.1 names the host in `Host`; HTTP/2 and absolute-form requests in the URI.
    let host = match uri.authority() {
        Some(a) => Some(a.as_str().to_owned()),
        None => headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned),
    };
    let Some(host) = host.filter(|h| hosts.allows(h)) else {
        return Err(Box::new(refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "misdirected_request",
            format!(
                "this server answers only requests whose Host is localhost, a loopback address or {} (another name: --allow-host)",
                hosts.bound
            ),
        )));
    };
    let console = uri.path() == "/operator/console" || uri.path().starts_with("/operator/console/");
    // The console's forms check their own origin (`Sec-Fetch-Site`), also through `sasctl
    // console`'s proxy, which forwards its own page's Origin.
    if let Some(origin) = headers.get(header::ORIGIN).filter(|_| !console) {
        // The page's origin must be this very host and port (not another name of it).
        let page = origin
            .to_str()
            .ok()
            .and_then(|o| url::Url::parse(o).ok())
            .filter(|o| o.scheme() == "http")
            .and_then(|o| Some((normalize(o.host_str()?), o.port_or_known_default()?)));
        if page.is_none() || page != key(&host) {
            return Err(Box::new(refuse(
                StatusCode::FORBIDDEN,
                "cross_origin",
                "a request from a web page of another origin is refused (Origin is not this server)"
                    .into(),
            )));
        }
    }
    let reads = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if !reads && !console && !body.is_empty() {
        let declared = headers
            .get(header::CONTENT_TYPE)
            .and_then(|c| c.to_str().ok())
            .and_then(|c| c.split(';').next())
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
        if !declared {
            return Err(Box::new(refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "Content-Type must be application/json: the body is JSON".into(),
            )));
        }
    }
    Ok(())
}

/// An authority's host, as compared, and port.
fn key(authority: &str) -> Option<(String, u16)> {
    let a = authority.parse::<http::uri::Authority>().ok()?;
    Some((normalize(a.host()), a.port_u16().unwrap_or(80)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(bound: &str) -> Hosts {
        Hosts::new(bound.parse().expect("addr"), &["sas.test".to_owned()])
    }

    #[test]
    fn loopback_names_the_bound_address_and_allowed_names_only() {
        let h = hosts("127.0.0.1:3000");
        for ok in [
            "localhost:3000",
            "LOCALHOST:3000",
            "localhost.:3000",
            "127.0.0.1:3000",
            "127.0.0.2:3000",
            "[::1]:3000",
            "sas.test:3000",
        ] {
            assert!(h.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example:3000",
            "localhost.evil.example:3000",
            "localhost:3001",
            "localhost",
            "10.0.0.5:3000",
            "user@localhost:3000",
            "",
        ] {
            assert!(!h.allows(bad), "{bad}");
        }
        let any = hosts("0.0.0.0:80");
        assert!(any.allows("0.0.0.0"));
        assert!(any.allows("localhost"));
        assert!(!any.allows("10.0.0.5"));
    }

    fn request(
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), u16> {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        check(
            &hosts("127.0.0.1:3000"),
            &method,
            &path.parse().expect("uri"),
            &map,
            body,
        )
        .map_err(|r| r.status().as_u16())
    }

    #[test]
    fn origins_and_content_types() {
        let host = ("host", "localhost:3000");
        let json = ("content-type", "application/json");
        assert_eq!(request(Method::GET, "/tasks", &[], b""), Err(421));
        assert_eq!(request(Method::GET, "/tasks", &[host], b""), Ok(()));
        assert_eq!(
            request(Method::POST, "/tasks/x/cancel", &[host], b""),
            Ok(()),
            "no body, nothing to declare"
        );
        assert_eq!(
            request(Method::POST, "/tasks/x/cancel", &[host], b"{}"),
            Err(415)
        );
        assert_eq!(
            request(Method::POST, "/tasks/x/cancel", &[host, json], b"{}"),
            Ok(())
        );
        // Another origin, even another port of localhost, or an opaque one.
        for origin in [
            "http://evil.example",
            "http://localhost:8080",
            "null",
            "https://localhost:3000",
            "http://127.0.0.1:3000",
        ] {
            assert_eq!(
                request(
                    Method::POST,
                    "/tasks/x/cancel",
                    &[host, json, ("origin", origin)],
                    b""
                ),
                Err(403),
                "{origin}"
            );
        }
        assert_eq!(
            request(
                Method::POST,
                "/tasks/x/cancel",
                &[host, json, ("origin", "http://localhost:3000")],
                b""
            ),
            Ok(())
        );
        // The console's forms are forms, checked by the console (through `sasctl console`,
        // from the proxy's origin).
        let form = ("content-type", "application/x-www-form-urlencoded");
        assert_eq!(
            request(
                Method::POST,
                "/operator/console/tasks/x/retry",
                &[host, form, ("origin", "http://127.0.0.1:4000")],
                b"reason=x"
            ),
            Ok(())
        );
        assert_eq!(
            request(
                Method::POST,
                "/operator/tasks/x/retry",
                &[host, form],
                b"reason=x"
            ),
            Err(415)
        );
    }
}
