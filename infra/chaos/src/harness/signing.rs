//! The applicant of the run's agreements (`definitions::AGREEMENT`): delivers each agreement's
//! answer as an e-sign webhook would (`POST /tasks/{id}/events/{name}`, an `Event-Id`, 5xx and
//! contention retried under the same id), in one of the [`Way`]s drawn by the agreement's
//! place: early (before its wait is reached) and again, twice at once, withdrawn, never, so
//! late that the cooling-off outlasts the deadline, after the window. Two agreements share each
//! `Event-Id` (an id is the task's, not global). Once every task has settled, [`Signing::finish`]
//! delivers once more to every ended agreement (refused, changing nothing: the record is read
//! before and after). Every answer is kept for `checks/events.rs`.

use super::load::workflow_of;
use sas::{StateRecord, TaskId};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How an agreement's answer comes, by its place among the run's agreements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Way {
    /// `signed` at once (usually before the wait is reached: kept), then again under its id.
    Early,
    /// `signed` a simulated day in, twice at once under one id.
    Twice,
    /// `withdrawn` a day in.
    Withdrawn,
    /// Nothing: the window (7 days) runs out.
    Never,
    /// `signed` on day 6: the 5-day cooling-off outlasts the 10-day deadline.
    NearTheEnd,
    /// `signed` on day 9, after the window (refused, unless the hold took days).
    Late,
}

impl Way {
    pub fn of(agreement: usize) -> Self {
        [
            Way::Early,
            Way::Twice,
            Way::Withdrawn,
            Way::Never,
            Way::NearTheEnd,
            Way::Late,
        ][agreement % 6]
    }

    /// When the answer is sent (in simulated days after the acceptance), its name, and how
    /// many times at once.
    fn plan(self) -> Option<(f64, &'static str)> {
        match self {
            Way::Early => Some((0.0, "signed")),
            Way::Twice => Some((1.0, "signed")),
            Way::Withdrawn => Some((1.0, "withdrawn")),
            Way::Never => None,
            Way::NearTheEnd => Some((6.0, "signed")),
            Way::Late => Some((9.0, "signed")),
        }
    }
}

/// The index among the run's agreements of task `i`, if it is one.
pub(super) fn agreement_of(i: usize) -> Option<usize> {
    (workflow_of(i) == "agreement").then(|| i / super::load::WORKFLOWS.len())
}

/// The `Event-Id` of agreement `a`'s answer: shared by two agreements.
pub(super) fn event_id(seed: u64, a: usize) -> String {
    format!("answer-{seed}-{}", a / 2)
}

/// The applicant's name in agreement `i`'s answer (task `i`'s own).
pub(super) fn signer(i: usize) -> String {
    format!("chaos-{i}")
}

/// One delivery and its last answer.
#[derive(Debug, Clone)]
pub(super) struct Sent {
    pub task: TaskId,
    pub name: String,
    pub event_id: String,
    pub by: String,
    /// The last answer's status (after retries), `None`: never answered.
    pub status: Option<u16>,
    /// Its `error.code`, or `duplicate`, `kept`, `taken`.
    pub answer: String,
    /// Tries made (more than one: an earlier try's answer was a 5xx, contention, or lost).
    pub tries: u32,
    /// Sent to a task that had ended (the last round), with its record before and after.
    pub after_end: Option<(Box<StateRecord>, Option<Box<StateRecord>>)>,
}

/// The applicant at work.
pub(super) struct Signing {
    http: reqwest::Client,
    base: String,
    seed: u64,
    day: Duration,
    sent: Arc<Mutex<Vec<Sent>>>,
    pending: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Signing {
    pub fn new(base: &str, seed: u64, day: Duration) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: base.to_owned(),
            seed,
            day,
            sent: Arc::default(),
            pending: Mutex::default(),
        }
    }

    /// Task `id`, just accepted as index `i`: if it is an agreement, its answer goes out as
    /// its [`Way`] says (and for the early ones, one to a task that does not exist and one
    /// event the workflow never waits for).
    pub fn accepted(&self, id: TaskId, i: usize) {
        if workflow_of(i) == "loan-application" {
            // A loan's applicant signs at once: `contract-signed`, kept for its signature step.
            let (http, base) = (self.http.clone(), self.base.clone());
            let event_id = format!("esign-{}-{i}", self.seed);
            self.spawn(async move {
                vec![deliver(&http, &base, id, "contract-signed", event_id, signer(i)).await]
            });
            return;
        }
        let Some(a) = agreement_of(i) else {
            return;
        };
        let way = Way::of(a);
        let Some((days, name)) = way.plan() else {
            return;
        };
        let (http, base) = (self.http.clone(), self.base.clone());
        let (event_id, by, after) = (event_id(self.seed, a), signer(i), self.day.mul_f64(days));
        self.spawn(async move {
            tokio::time::sleep(after).await;
            let one = |task: TaskId, name: &'static str| {
                deliver(&http, &base, task, name, event_id.clone(), by.clone())
            };
            match way {
                Way::Twice => {
                    let (a, b) = tokio::join!(one(id, name), one(id, name));
                    vec![a, b]
                }
                Way::Early => vec![
                    one(id, name).await,
                    one(id, name).await,
                    one(TaskId::new_random(), name).await,
                    one(id, "cancelled").await,
                ],
                _ => vec![one(id, name).await],
            }
        });
    }

    /// Runs `deliveries` in the background, keeping what they sent, and waited for by
    /// [`Signing::finish`].
    fn spawn(&self, deliveries: impl Future<Output = Vec<Sent>> + Send + 'static) {
        let sent = self.sent.clone();
        let handle = tokio::spawn(async move {
            let got = deliveries.await;
            if let Ok(mut log) = sent.lock() {
                log.extend(got);
            }
        });
        if let Ok(mut pending) = self.pending.lock() {
            pending.push(handle);
        }
    }

    /// Waits for the answers still to go out, then delivers `signed` (a fresh id) to every
    /// agreement that has ended, reading its record before and after; every delivery made.
    pub async fn finish(
        &self,
        store: &dyn sas::ports::TaskStore,
        agreements: &HashMap<TaskId, usize>,
    ) -> Vec<Sent> {
        let pending: Vec<_> = self
            .pending
            .lock()
            .map(|mut p| p.drain(..).collect())
            .unwrap_or_default();
        for h in pending {
            let _ = h.await;
        }
        let mut after: Vec<Sent> = Vec::new();
        for (id, i) in agreements {
            let Some(before) = read(store, *id).await else {
                continue;
            };
            if !before.process_state.is_terminal() {
                continue;
            }
            let mut s = deliver(
                &self.http,
                &self.base,
                *id,
                "signed",
                format!("after-end-{}", signer(*i)),
                signer(*i),
            )
            .await;
            let later = read(store, *id).await.map(Box::new);
            s.after_end = Some((Box::new(before), later));
            after.push(s);
        }
        let mut out = self.sent.lock().map(|s| s.clone()).unwrap_or_default();
        out.extend(after);
        out
    }
}

/// The task's record, read again on a failure (the store's failpoints throttle and lose
/// answers).
async fn read(store: &dyn sas::ports::TaskStore, id: TaskId) -> Option<StateRecord> {
    for _ in 0..10 {
        match store.get_state(id).await {
            Ok(r) => return r,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    None
}

/// Delivers one event, retrying 5xx answers, contention (`409 conflict`) and connection
/// errors under the same `Event-Id`, as a webhook sender would.
async fn deliver(
    http: &reqwest::Client,
    base: &str,
    task: TaskId,
    name: &str,
    event_id: String,
    by: String,
) -> Sent {
    let mut sent = Sent {
        task,
        name: name.to_owned(),
        event_id,
        by,
        status: None,
        answer: "unanswered".into(),
        tries: 0,
        after_end: None,
    };
    for attempt in 0..20u32 {
        sent.tries = attempt + 1;
        let resp = http
            .post(format!("{base}/tasks/{task}/events/{name}"))
            .header("event-id", &sent.event_id)
            // The agreement's field and the loan's.
            .json(&json!({"by": sent.by, "signedBy": sent.by}))
            .send()
            .await;
        if let Ok(r) = resp {
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            sent.status = Some(status);
            sent.answer = match status {
                202 if body["kept"] == true => "kept".into(),
                202 => "taken".into(),
                200 if body["duplicate"] == true => "duplicate".into(),
                _ => body["error"]["code"].as_str().unwrap_or("?").to_owned(),
            };
            if status < 500 && sent.answer != "conflict" {
                return sent;
            }
        }
        tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt + 1))).await;
    }
    sent
}
