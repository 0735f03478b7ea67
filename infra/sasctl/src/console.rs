//! `sasctl console`: the operator console of a deployed stack in the local browser. A small
//! proxy on a loopback address forwards the console's pages (`/operator/console/...`) to the
//! stack's operator API and signs each request with SigV4, so the AWS credentials stay in
//! this process and never reach the browser.
//!
//! It forwards nothing but the console's own paths (checked once percent-decoded and with dot
//! segments resolved, and forwarded as checked), answers only requests addressed to its own
//! host and port (a page on another site that resolves its name to 127.0.0.1 gets 403: DNS
//! rebinding), and passes the browser's `Sec-Fetch-Site` on so the console refuses forms
//! posted from elsewhere.

use crate::sign::Signer;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use std::net::SocketAddr;
use std::sync::Arc;
use url::Url;

/// The console's path under the operator API's origin.
pub const CONSOLE_PATH: &str = "/operator/console";
/// The largest form the proxy forwards.
const MAX_BODY: usize = 64 * 1024;

/// Headers of the browser's request passed on to the console.
const REQUEST_HEADERS: [header::HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::ACCEPT,
    header::ORIGIN,
    header::HeaderName::from_static("sec-fetch-site"),
];

/// Headers of the console's answer passed back to the browser.
const RESPONSE_HEADERS: [header::HeaderName; 7] = [
    header::CONTENT_TYPE,
    header::LOCATION,
    header::CACHE_CONTROL,
    header::CONTENT_SECURITY_POLICY,
    header::X_CONTENT_TYPE_OPTIONS,
    header::REFERRER_POLICY,
    header::ALLOW,
];

/// Why the proxy cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("--listen {0} is not a loopback address: the proxy signs with your credentials")]
    NotLoopback(SocketAddr),
    #[error("cannot listen on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("{0}")]
    Client(String),
}

struct Proxy {
    /// The operator API's origin and any path before `/operator` (a custom domain's base path).
    upstream: Url,
    http: reqwest::Client,
    signer: Option<Signer>,
    /// The `Host` values a request must carry: this proxy's own address.
    hosts: Vec<String>,
}

/// The origin (and base path) of the operator API at `endpoint` (`.../operator`).
pub fn upstream_of(endpoint: &Url) -> Url {
    let mut up = endpoint.clone();
    let base = endpoint
        .path()
        .trim_end_matches('/')
        .trim_end_matches("/operator")
        .to_owned();
    up.set_path(&base);
    up.set_query(None);
    up.set_fragment(None);
    up
}

/// Binds the proxy on `listen` (loopback only) for the operator API at `endpoint`; returns the
/// address bound and the future that serves until it is dropped.
pub async fn bind(
    endpoint: &Url,
    signer: Option<Signer>,
    listen: SocketAddr,
) -> Result<
    (
        SocketAddr,
        impl Future<Output = std::io::Result<()>> + use<>,
    ),
    ConsoleError,
> {
    if !listen.ip().is_loopback() {
        return Err(ConsoleError::NotLoopback(listen));
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| ConsoleError::Bind(listen, e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| ConsoleError::Bind(listen, e))?;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|e| ConsoleError::Client(e.to_string()))?;
    let port = bound.port();
    let proxy = Arc::new(Proxy {
        upstream: upstream_of(endpoint),
        http,
        signer,
        hosts: vec![
            format!("{}:{port}", bound.ip()),
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
        ],
    });
    let app = axum::Router::new().fallback(forward).with_state(proxy);
    Ok((bound, async move { axum::serve(listener, app).await }))
}

/// The segments of the path `raw` once read as a server may read it (percent-decoded, `\` as
/// a separator, `.` and `..` resolved), if it is the console's or a page under it; `None` for
/// any other path, and for one that is not UTF-8 or is percent-encoded twice (`%252e`: a
/// server that decodes again would find other segments than the ones checked here).
fn console_segments(raw: &str) -> Option<Vec<String>> {
    let decoded = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .ok()?;
    if decoded.contains('%') {
        return None;
    }
    let mut segments: Vec<String> = vec![];
    for s in decoded.split(['/', '\\']) {
        match s {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s.to_owned()),
        }
    }
    let console: Vec<&str> = CONSOLE_PATH.split('/').filter(|s| !s.is_empty()).collect();
    segments
        .starts_with(&console.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
        .then_some(segments)
}

fn answer(status: StatusCode, text: &str) -> Response {
    let mut r = Response::new(Body::from(text.to_owned()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

async fn forward(State(proxy): State<Arc<Proxy>>, req: Request) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    if !proxy.hosts.iter().any(|h| h == host) {
        return answer(
            StatusCode::FORBIDDEN,
            "this proxy answers only requests addressed to its own loopback address",
        );
    }
    let path = req.uri().path().to_owned();
    if path == "/" {
        let mut r = answer(StatusCode::SEE_OTHER, "the console");
        r.headers_mut()
            .insert(header::LOCATION, HeaderValue::from_static(CONSOLE_PATH));
        return r;
    }
    // Checked as the operator API would read it, and forwarded as checked.
    let Some(segments) = console_segments(&path) else {
        return answer(
            StatusCode::NOT_FOUND,
            "this proxy forwards the console's pages only",
        );
    };
    let mut url = proxy.upstream.clone();
    match url.path_segments_mut() {
        Ok(mut p) => {
            p.pop_if_empty().extend(&segments);
        }
        Err(()) => {
            return answer(
                StatusCode::BAD_GATEWAY,
                "the operator API's address takes no path",
            );
        }
    }
    url.set_query(req.uri().query());
    let method = req.method().clone();
    let mut headers = http::HeaderMap::new();
    for name in &REQUEST_HEADERS {
        if let Some(v) = req.headers().get(name) {
            headers.insert(name.clone(), v.clone());
        }
    }
    let body: Bytes = match axum::body::to_bytes(req.into_body(), MAX_BODY).await {
        Ok(b) => b,
        Err(_) => return answer(StatusCode::PAYLOAD_TOO_LARGE, "the form is too large"),
    };
    let mut request = match proxy
        .http
        .request(method, url.clone())
        .headers(headers)
        .body(body)
        .build()
    {
        Ok(r) => r,
        Err(e) => return answer(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    if let Some(signer) = &proxy.signer
        && let Err(e) = signer.sign(&mut request).await
    {
        return answer(StatusCode::BAD_GATEWAY, &e.to_string());
    }
    let resp = match proxy.http.execute(request).await {
        Ok(r) => r,
        Err(e) => {
            return answer(
                StatusCode::BAD_GATEWAY,
                &format!("cannot reach the operator API at {url}: {e}"),
            );
        }
    };
    let status = resp.status();
    let mut out_headers = http::HeaderMap::new();
    for name in &RESPONSE_HEADERS {
        if let Some(v) = resp.headers().get(name) {
            out_headers.insert(name.clone(), v.clone());
        }
    }
    let bytes = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => return answer(StatusCode::BAD_GATEWAY, &e.to_string()),
    };
    let mut r = Response::new(Body::from(bytes));
    *r.status_mut() = status;
    *r.headers_mut() = out_headers;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_that_stay_in_the_console_once_normalised_are_forwarded() {
        for (raw, want) in [
            ("/operator/console", Some("operator/console")),
            ("/operator/console/", Some("operator/console")),
            (
                "/operator//console/./tasks/x/../y",
                Some("operator/console/tasks/y"),
            ),
            ("/operator/console/%74asks", Some("operator/console/tasks")),
            ("/operator/console/..", None),
            ("/operator/console/%2E%2e/services", None),
            ("/operator/console/..%2Fservices", None),
            ("/operator/console/..%5Cservices", None),
            ("/operator/console%2f..%2fservices", None),
            ("/operator/console/%252e%252e/services", None),
            ("/operator/console/%ff", None),
            ("/operator/consoles", None),
        ] {
            assert_eq!(
                console_segments(raw).map(|s| s.join("/")).as_deref(),
                want,
                "{raw}"
            );
        }
    }

    #[test]
    fn the_upstream_keeps_a_base_path_and_drops_operator() -> Result<(), url::ParseError> {
        for (endpoint, want) in [
            (
                "https://abc.execute-api.eu-west-1.amazonaws.com/operator",
                "https://abc.execute-api.eu-west-1.amazonaws.com/",
            ),
            (
                "https://ops.example.com/sas/operator/",
                "https://ops.example.com/sas",
            ),
            (
                "http://127.0.0.1:3000/operator?x=1",
                "http://127.0.0.1:3000/",
            ),
        ] {
            assert_eq!(upstream_of(&Url::parse(endpoint)?).as_str(), want);
        }
        Ok(())
    }

    #[tokio::test]
    async fn only_loopback_addresses_are_accepted() -> Result<(), Box<dyn std::error::Error>> {
        let endpoint = Url::parse("http://127.0.0.1:9/operator")?;
        let open = "0.0.0.0:0".parse()?;
        assert!(matches!(
            bind(&endpoint, None, open).await,
            Err(ConsoleError::NotLoopback(_))
        ));
        Ok(())
    }
}
