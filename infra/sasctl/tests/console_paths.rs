//! `sasctl console` forwards the console's pages and nothing else, whatever the path spells:
//! a path that leaves `/operator/console` once its dot segments are resolved (`..`, `%2e%2e`,
//! encoded slashes and backslashes) would otherwise reach the rest of the operator API signed
//! with the operator's credentials. The proxy is driven over raw HTTP (a client would resolve
//! the dots itself) in front of an operator API that records what reaches it.

use axum::extract::Request;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// Sends one request with `path` exactly as written; the status of the answer.
async fn raw(proxy: SocketAddr, method: &'static str, path: &str) -> u16 {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {proxy}\r\nSec-Fetch-Site: same-origin\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(proxy).expect("connects");
        s.write_all(request.as_bytes()).expect("writes");
        let mut answer = String::new();
        s.read_to_string(&mut answer).expect("reads");
        answer
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"))
    })
    .await
    .expect("joins")
}

#[tokio::test]
async fn the_console_proxy_forwards_nothing_that_leaves_the_console_once_normalised() {
    // The operator API: records the method and path (with query) of what reaches it.
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = seen.clone();
    let app = axum::Router::new().fallback(move |req: Request| {
        let record = record.clone();
        async move {
            let line = format!(
                "{} {}",
                req.method(),
                req.uri().path_and_query().map_or("", |p| p.as_str())
            );
            record.lock().expect("lock").push(line);
            "ok"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let upstream = listener.local_addr().expect("address");
    let api = tokio::spawn(async move { axum::serve(listener, app).await });
    let endpoint: url::Url = format!("http://{upstream}/operator").parse().expect("url");
    let (proxy, serving) =
        sasctl::console::bind(&endpoint, None, "127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("binds");
    let serving = tokio::spawn(serving);

    let mut answered = vec![];
    for path in [
        "/operator/console/../services/x",
        "/operator/console/%2e%2e/services/x",
        "/operator/console/%2E%2e/services/x",
        "/operator/console/.%2E/.%2e/workflows/w/tasks",
        "/operator/console/..%2fservices%2fx",
        "/operator/console/%2e%2e%2Fservices/x",
        "/operator/console/..%5cservices/x",
        "/operator/console/tasks/../../tasks?state=Error",
        "/operator/console/a/b/../../../workflows/w",
        "/operator/console/%252e%252e/services/x",
        "/operator/console%2f..%2f..%2fservices/x",
    ] {
        let status = raw(proxy, "PUT", path).await;
        if !(400..500).contains(&status) {
            answered.push(format!("{path}: {status}"));
        }
    }
    assert_eq!(
        answered,
        Vec::<String>::new(),
        "the proxy should refuse these"
    );
    assert_eq!(
        *seen.lock().expect("lock"),
        Vec::<String>::new(),
        "paths outside the console reached the operator API"
    );

    // The console's own pages still go through, as the path they resolve to.
    for (path, forwarded) in [
        (
            "/operator/console/tasks/abc?state=Pending",
            "GET /operator/console/tasks/abc?state=Pending",
        ),
        ("/operator/console", "GET /operator/console"),
        (
            "/operator/console/./tasks/x/../y",
            "GET /operator/console/tasks/y",
        ),
        ("/operator/console/%74asks", "GET /operator/console/tasks"),
    ] {
        assert_eq!(raw(proxy, "GET", path).await, 200, "{path}");
        assert_eq!(
            seen.lock().expect("lock").pop().as_deref(),
            Some(forwarded),
            "{path}"
        );
    }
    serving.abort();
    api.abort();
}
