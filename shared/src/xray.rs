//! X-Ray subsegments that name the task: with the stack's `Tracing=Active`, Lambda traces each
//! invocation, and each record a function works on adds a subsegment annotated with its
//! `task_id` (and `workflow` when the message names it), so a trace can be found by task in
//! the X-Ray console (`annotation.task_id = "…"`).
//!
//! A subsegment is one UDP datagram to the X-Ray daemon Lambda runs beside the function
//! (`AWS_XRAY_DAEMON_ADDRESS`): the header `{"format": "json", "version": 1}`, a newline, the
//! segment document. Its parent is the invocation's segment, named in `_X_AMZN_TRACE_ID`
//! (`Root=…;Parent=…;Sampled=1`), which the Lambda runtime sets for each invocation. Nothing
//! is sent when tracing is off, the invocation is not sampled, or no daemon is configured; a
//! send that fails is dropped (tracing must never fail a handler).

use serde_json::{Map, Value, json};
use std::net::{SocketAddr, UdpSocket};
use std::sync::OnceLock;

/// The invocation's trace, from `_X_AMZN_TRACE_ID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceHeader {
    pub root: String,
    pub parent: String,
    pub sampled: bool,
}

impl TraceHeader {
    /// Parses `Root=1-…;Parent=…;Sampled=1` (fields in any order, others ignored).
    pub fn parse(header: &str) -> Option<Self> {
        let mut root = None;
        let mut parent = None;
        let mut sampled = false;
        for part in header.split(';') {
            match part.trim().split_once('=') {
                Some(("Root", v)) => root = Some(v.to_owned()),
                Some(("Parent", v)) => parent = Some(v.to_owned()),
                Some(("Sampled", v)) => sampled = v == "1",
                _ => {}
            }
        }
        Some(Self {
            root: root.filter(|r| r.starts_with("1-"))?,
            parent: parent.filter(|p| p.len() == 16)?,
            sampled,
        })
    }
}

/// A subsegment document: `name`, a fresh 16-hex-digit id, under `trace`, from `start` to
/// `end` (seconds since the epoch), with `annotations` (string values).
pub fn subsegment(
    name: &str,
    trace: &TraceHeader,
    start: f64,
    end: f64,
    annotations: &[(&str, &str)],
) -> Value {
    let id = format!("{:016x}", rand::random::<u64>());
    let mut notes = Map::new();
    for (k, v) in annotations {
        notes.insert((*k).to_owned(), Value::String((*v).to_owned()));
    }
    json!({
        "type": "subsegment",
        "name": name,
        "id": id,
        "trace_id": trace.root,
        "parent_id": trace.parent,
        "start_time": start,
        "end_time": end,
        "annotations": notes,
    })
}

/// The datagram for a document: header line, then the document.
pub fn datagram(document: &Value) -> String {
    format!("{{\"format\": \"json\", \"version\": 1}}\n{document}")
}

/// Sends subsegments to one daemon address.
pub struct Emitter {
    socket: UdpSocket,
    daemon: SocketAddr,
}

impl Emitter {
    pub fn new(daemon: SocketAddr) -> std::io::Result<Self> {
        let socket = UdpSocket::bind(if daemon.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        })?;
        socket.set_nonblocking(true)?;
        Ok(Self { socket, daemon })
    }

    /// Sends `document` (best effort).
    pub fn send(&self, document: &Value) {
        let _ = self
            .socket
            .send_to(datagram(document).as_bytes(), self.daemon);
    }
}

/// The process's emitter: set up once from `AWS_XRAY_DAEMON_ADDRESS` (`host:port`, or
/// `udp:host:port tcp:host:port`); `None` without a daemon.
fn emitter() -> Option<&'static Emitter> {
    static EMITTER: OnceLock<Option<Emitter>> = OnceLock::new();
    EMITTER
        .get_or_init(|| {
            let raw = std::env::var("AWS_XRAY_DAEMON_ADDRESS").ok()?;
            let udp = raw
                .split_whitespace()
                .find_map(|p| p.strip_prefix("udp:"))
                .unwrap_or(raw.as_str());
            Emitter::new(udp.parse().ok()?).ok()
        })
        .as_ref()
}

/// Whether subsegments can be sent at all (a daemon is configured).
pub fn enabled() -> bool {
    emitter().is_some()
}

/// Seconds since the epoch: a subsegment's start, for [`record`].
pub fn now_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// Records a subsegment `name` from `start` to now with `annotations`, when this invocation
/// is traced and sampled (else nothing).
pub fn record(name: &str, start: f64, annotations: &[(&str, &str)]) {
    let header = std::env::var("_X_AMZN_TRACE_ID").ok();
    record_with(emitter(), header.as_deref(), name, start, annotations);
}

/// [`record`] with the emitter and the trace header given: sends only for a sampled trace.
pub fn record_with(
    emitter: Option<&Emitter>,
    header: Option<&str>,
    name: &str,
    start: f64,
    annotations: &[(&str, &str)],
) -> bool {
    let trace = header.and_then(TraceHeader::parse).filter(|t| t.sampled);
    match (emitter, trace) {
        (Some(emitter), Some(trace)) => {
            emitter.send(&subsegment(name, &trace, start, now_seconds(), annotations));
            true
        }
        _ => false,
    }
}

/// Runs `work` and records it as a subsegment `name` annotated with the task id (and
/// workflow) the message `body` names.
pub async fn around_message<F: Future>(name: &str, body: &str, work: F) -> F::Output {
    if emitter().is_none() {
        return work.await;
    }
    let start = now_seconds();
    let out = work.await;
    let message: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let mut annotations = Vec::new();
    if let Some(id) = message["taskId"].as_str() {
        annotations.push(("task_id", id));
    }
    if let Some(w) = message["workflow"].as_str() {
        annotations.push(("workflow", w));
    }
    record(name, start, &annotations);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields the X-Ray segment document schema requires of a subsegment sent on its own,
    /// and the forms of its ids and times.
    const SUBSEGMENT_SCHEMA: &str = r#"{
      "type": "object",
      "required": ["name", "id", "trace_id", "parent_id", "start_time", "type"],
      "properties": {
        "type": {"const": "subsegment"},
        "name": {"type": "string", "minLength": 1, "maxLength": 200},
        "id": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
        "trace_id": {"type": "string", "pattern": "^1-[0-9a-f]{8}-[0-9a-f]{24}$"},
        "parent_id": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
        "start_time": {"type": "number"},
        "end_time": {"type": "number"},
        "annotations": {
          "type": "object",
          "propertyNames": {"pattern": "^[A-Za-z0-9_]{1,500}$"},
          "additionalProperties": {"type": ["string", "number", "boolean"]}
        }
      }
    }"#;

    fn valid(doc: &Value) -> bool {
        let schema: Value = serde_json::from_str(SUBSEGMENT_SCHEMA).expect("schema");
        jsonschema::validator_for(&schema)
            .map(|v| v.is_valid(doc))
            .unwrap_or(false)
    }

    const HEADER: &str =
        "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1;Lineage=a:1";

    #[test]
    fn the_trace_header_is_read_in_any_order() {
        let t = TraceHeader::parse(HEADER).expect("parses");
        assert_eq!(t.root, "1-5759e988-bd862e3fe1be46a994272793");
        assert_eq!((t.parent.as_str(), t.sampled), ("53995c3f42cd8ad8", true));
        let unsampled = TraceHeader::parse(
            "Sampled=0;Parent=53995c3f42cd8ad8;Root=1-5759e988-bd862e3fe1be46a994272793",
        );
        assert_eq!(unsampled.map(|t| t.sampled), Some(false));
        assert_eq!(
            TraceHeader::parse("Root=1-5759e988-bd862e3fe1be46a994272793"),
            None
        );
        assert_eq!(TraceHeader::parse("garbage"), None);
    }

    #[test]
    fn subsegments_keep_the_segment_document_format() {
        let t = TraceHeader::parse(HEADER).expect("parses");
        let doc = subsegment("scheduler", &t, 1.5, 2.25, &[("task_id", "a065f4fc")]);
        assert!(valid(&doc), "{doc}");
        assert_eq!(doc["annotations"]["task_id"], "a065f4fc");
        assert_eq!(doc["parent_id"], "53995c3f42cd8ad8");
        let mut bad = doc.clone();
        bad["trace_id"] = json!("5759e988");
        assert!(!valid(&bad), "the checker fails a bad trace id");
        let mut bad = doc;
        bad["annotations"] = json!({"task-id": "x"});
        assert!(!valid(&bad), "the checker fails a bad annotation key");
    }

    #[test]
    fn only_a_sampled_trace_is_recorded() {
        let daemon = UdpSocket::bind("127.0.0.1:0").expect("daemon");
        let emitter = Emitter::new(daemon.local_addr().expect("addr")).expect("emitter");
        let unsampled = HEADER.replace("Sampled=1", "Sampled=0");
        assert!(!record_with(
            Some(&emitter),
            Some(&unsampled),
            "x",
            1.0,
            &[]
        ));
        assert!(
            !record_with(Some(&emitter), None, "x", 1.0, &[]),
            "no trace"
        );
        assert!(!record_with(None, Some(HEADER), "x", 1.0, &[]), "no daemon");
        assert!(record_with(
            Some(&emitter),
            Some(HEADER),
            "x",
            1.0,
            &[("task_id", "t")]
        ));
    }

    #[test]
    fn an_emitter_sends_the_header_line_and_the_document_to_the_daemon() {
        let daemon = UdpSocket::bind("127.0.0.1:0").expect("daemon");
        daemon
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .expect("timeout");
        let emitter = Emitter::new(daemon.local_addr().expect("addr")).expect("emitter");
        let t = TraceHeader::parse(HEADER).expect("parses");
        emitter.send(&subsegment(
            "agent",
            &t,
            1.0,
            2.0,
            &[("task_id", "t-1"), ("workflow", "w")],
        ));
        let mut buf = [0u8; 4096];
        let n = daemon.recv(&mut buf).expect("a datagram");
        let text = std::str::from_utf8(&buf[..n]).expect("utf-8");
        let (header, body) = text.split_once('\n').expect("two lines");
        assert_eq!(
            serde_json::from_str::<Value>(header).expect("json"),
            json!({"format": "json", "version": 1})
        );
        let doc: Value = serde_json::from_str(body).expect("json");
        assert!(valid(&doc), "{doc}");
        assert_eq!(
            doc["annotations"],
            json!({"task_id": "t-1", "workflow": "w"})
        );
    }
}
