use crate::ports::{
    DEDUP_WINDOW, FairMessage, GroupedMessage, Queue, QueueError, ReceiveRequest, ReceivedMessage,
};
use async_trait::async_trait;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A queue's settings, as SQS has them.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    pub visibility_timeout: Duration,
    /// After this many receives a message moves to `dead_letter_url` instead.
    pub max_receive_count: Option<u32>,
    pub dead_letter_url: Option<String>,
    /// A FIFO queue ([`Queue::send_grouped`] only): delivered in order within a group, one
    /// group's messages in flight to one consumer at a time, deduplicated. Its dead-letter
    /// queue must be FIFO too, as SQS requires.
    pub fifo: bool,
    /// When a standard queue's tenant (the group its messages name, [`Queue::send_fair`]) is
    /// noisy, as SQS fair queues tell.
    pub fair: FairShare,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            visibility_timeout: Duration::from_secs(30),
            max_receive_count: None,
            dead_letter_url: None,
            fifo: false,
            fair: FairShare::default(),
        }
    }
}

/// When a tenant of a fair queue is noisy: it holds more than `percent`% of the messages in
/// flight and at least `at_least` of them (SQS: 10% and 30, approximately). A noisy tenant's
/// messages wait while a quiet tenant's are there; among noisy tenants, the one with the fewest
/// in flight goes first. (SQS also counts a tenant noisy by its share of the consumers'
/// processing time; memory, which does not see the consumers' time, counts messages only.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairShare {
    pub percent: u32,
    pub at_least: usize,
}

impl Default for FairShare {
    fn default() -> Self {
        Self {
            percent: 10,
            at_least: 30,
        }
    }
}

/// The order in which a standard queue's messages are looked at for a receive: quiet tenants'
/// (and messages of no tenant, each a tenant of its own) as sent, then the noisy tenants', the
/// one with the fewest messages in flight first (see [`FairShare`]).
fn fair_order(messages: &VecDeque<Message>, now: Instant, fair: FairShare) -> Vec<usize> {
    let mut in_flight: HashMap<&str, usize> = HashMap::new();
    let mut total = 0usize;
    for m in messages {
        if m.receipt.is_some() && m.visible_at > now {
            total += 1;
            if let Some(g) = &m.group {
                *in_flight.entry(g.as_str()).or_default() += 1;
            }
        }
    }
    let noisy = |g: &str| {
        let n = in_flight.get(g).copied().unwrap_or(0);
        n >= fair.at_least && n * 100 > total * fair.percent as usize
    };
    let mut order: Vec<(usize, usize)> = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let rank = match &m.group {
                // Quiet: rank 0, in the order sent (the sort is stable).
                Some(g) if noisy(g) => in_flight.get(g.as_str()).copied().unwrap_or(0),
                _ => 0,
            };
            (rank, i)
        })
        .collect();
    if order.iter().any(|(rank, _)| *rank > 0) {
        order.sort_by_key(|(rank, _)| *rank);
    }
    order.into_iter().map(|(_, i)| i).collect()
}

/// Named queues with SQS standard-queue semantics: at-least-once delivery, a visibility
/// timeout after which an undeleted message is delivered again, `DelaySeconds`, and redrive to
/// a dead-letter queue after `max_receive_count` receives. And FIFO queues
/// ([`QueueConfig::fifo`]) with SQS FIFO semantics: a group's messages in send order, none
/// received while an earlier one of its group is in flight, and deduplication by id.
#[derive(Debug, Default)]
pub struct MemoryQueues {
    queues: Mutex<HashMap<String, MemQueue>>,
    arrived: Notify,
}

#[derive(Debug, Default)]
struct MemQueue {
    config: QueueConfig,
    messages: VecDeque<Message>,
    next_id: u64,
    /// A FIFO queue's deduplication ids sent within [`DEDUP_WINDOW`], oldest first (sends come
    /// in time order, so the expired ones are at the front), and the same ids for lookup.
    dedup_order: VecDeque<(Instant, String)>,
    dedup_ids: HashSet<String>,
}

impl MemQueue {
    /// Whether `dedup_id` was sent within the window; if not, it is remembered from `now`.
    fn seen(&mut self, dedup_id: &str, now: Instant) -> bool {
        while let Some((at, _)) = self.dedup_order.front()
            && now.duration_since(*at) >= DEDUP_WINDOW
        {
            if let Some((_, id)) = self.dedup_order.pop_front() {
                self.dedup_ids.remove(&id);
            }
        }
        if self.dedup_ids.contains(dedup_id) {
            return true;
        }
        self.dedup_ids.insert(dedup_id.to_owned());
        self.dedup_order.push_back((now, dedup_id.to_owned()));
        false
    }
}

#[derive(Debug)]
struct Message {
    id: String,
    /// Its FIFO group (`None` on a standard queue).
    group: Option<String>,
    body: String,
    visible_at: Instant,
    receive_count: u32,
    receipt: Option<String>,
}

/// Visible, in flight and delayed messages of a queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Depth {
    pub visible: usize,
    pub invisible: usize,
}

impl MemoryQueues {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, HashMap<String, MemQueue>>, QueueError> {
        self.queues
            .lock()
            .map_err(|_| QueueError("memory queue lock poisoned".into()))
    }

    /// Creates the queue (or keeps it if it exists) and returns its URL. A FIFO queue's name
    /// ends in `.fifo`, as SQS requires: the suffix is added to one that lacks it (callers use
    /// the URL returned, never build it). A standard queue's name must not end in `.fifo` (SQS
    /// refuses it); that is not checked here.
    pub fn create_queue(&self, name: &str, config: QueueConfig) -> String {
        let suffix = if config.fifo && !name.ends_with(FIFO_SUFFIX) {
            FIFO_SUFFIX
        } else {
            ""
        };
        let url = format!("memory://sas/{name}{suffix}");
        if let Ok(mut q) = self.queues.lock() {
            q.entry(url.clone()).or_insert_with(|| MemQueue {
                config,
                ..MemQueue::default()
            });
        }
        url
    }

    /// How many messages the queue holds, visible and not.
    pub fn depth(&self, url: &str) -> Depth {
        let now = Instant::now();
        self.queues
            .lock()
            .ok()
            .and_then(|q| {
                q.get(url).map(|q| {
                    let visible = q.messages.iter().filter(|m| m.visible_at <= now).count();
                    Depth {
                        visible,
                        invisible: q.messages.len() - visible,
                    }
                })
            })
            .unwrap_or_default()
    }

    fn push(
        queues: &mut HashMap<String, MemQueue>,
        url: &str,
        body: String,
        visible_at: Instant,
    ) -> Result<(), QueueError> {
        Self::push_to(queues, url, None, body, visible_at)
    }

    /// Appends a message to the queue at `url`, in `group` if it has one. Redrive comes here
    /// too: a dead letter keeps its group, and is not deduplicated (SQS moves it as it is).
    fn push_to(
        queues: &mut HashMap<String, MemQueue>,
        url: &str,
        group: Option<String>,
        body: String,
        visible_at: Instant,
    ) -> Result<(), QueueError> {
        let q = queues
            .get_mut(url)
            .ok_or_else(|| QueueError(format!("no such queue: {url}")))?;
        // A standard queue takes a group too (a fair queue's tenant); a FIFO queue needs one.
        if q.config.fifo && group.is_none() {
            return Err(QueueError(format!(
                "MissingParameter: {url} is a FIFO queue: a message needs a MessageGroupId"
            )));
        }
        q.next_id += 1;
        q.messages.push_back(Message {
            id: format!("{url}#{}", q.next_id),
            group,
            body,
            visible_at,
            receive_count: 0,
            receipt: None,
        });
        Ok(())
    }

    fn take_visible(&self, url: &str, max: u32) -> Result<Vec<ReceivedMessage>, QueueError> {
        let now = Instant::now();
        let mut queues = self.lock()?;
        let fifo = queues.get(url).map(|q| q.config.fifo);
        let dead_letter_fifo = queues
            .get(url)
            .and_then(|q| q.config.dead_letter_url.as_ref())
            .and_then(|dlq| queues.get(dlq))
            .map(|dlq| dlq.config.fifo);
        // SQS refuses such a redrive policy; here it is found before a message is moved, so
        // none is lost on the way to a queue that cannot take it.
        if let (Some(fifo), Some(dead_letter_fifo)) = (fifo, dead_letter_fifo)
            && fifo != dead_letter_fifo
        {
            return Err(QueueError(format!(
                "InvalidParameterValue: {url} and its dead-letter queue must both be FIFO or \
                 both standard"
            )));
        }
        let q = queues
            .get_mut(url)
            .ok_or_else(|| QueueError(format!("no such queue: {url}")))?;
        let config = q.config.clone();
        let mut out = Vec::new();
        let mut dead = Vec::new();
        // The order messages are looked at: as sent, but on a standard queue whose messages
        // name tenants, a quiet tenant's before a noisy one's (SQS fair queues).
        let order = if config.fifo {
            (0..q.messages.len()).collect()
        } else {
            fair_order(&q.messages, now, config.fair)
        };
        // The groups of a FIFO queue that hold a message not visible (in flight): none of
        // their later messages is delivered before it is deleted, or comes back first.
        let mut held: HashSet<String> = HashSet::new();
        let mut gone = Vec::new();
        for i in order {
            if out.len() >= max as usize {
                break;
            }
            let m = &mut q.messages[i];
            if config.fifo
                && let Some(group) = &m.group
                && (held.contains(group) || m.visible_at > now)
            {
                held.insert(group.clone());
                continue;
            }
            if m.visible_at > now {
                continue;
            }
            if let (Some(limit), Some(_)) = (config.max_receive_count, &config.dead_letter_url)
                && m.receive_count >= limit
            {
                gone.push(i);
                continue;
            }
            m.receive_count += 1;
            m.visible_at = now + config.visibility_timeout;
            let receipt = uuid::Uuid::new_v4().to_string();
            m.receipt = Some(receipt.clone());
            out.push(ReceivedMessage {
                message_id: m.id.clone(),
                receipt_handle: receipt,
                body: m.body.clone(),
                receive_count: m.receive_count,
            });
        }
        // Latest first, so each index still points at its message.
        gone.sort_unstable_by(|a, b| b.cmp(a));
        for i in gone {
            if let Some(m) = q.messages.remove(i) {
                dead.push((m.group, m.body));
            }
        }
        if let Some(dlq) = config.dead_letter_url {
            for (group, body) in dead {
                Self::push_to(&mut queues, &dlq, group, body, now)?;
            }
        }
        Ok(out)
    }
}

/// The largest message SQS takes (256 KiB).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// How a FIFO queue's name ends, in SQS.
pub const FIFO_SUFFIX: &str = ".fifo";

/// The longest FIFO group or deduplication id SQS takes.
const MAX_FIFO_ID: usize = 128;

/// What SQS answers a message with a group sent to a standard queue.
fn not_fifo(url: &str) -> QueueError {
    QueueError(format!(
        "InvalidParameterValue: {url} is not a FIFO queue (MessageGroupId is for FIFO queues only)"
    ))
}

/// SQS's bound on a message: a sender that relies on more fails here too.
fn check_size(body: &str) -> Result<(), QueueError> {
    if body.len() > MAX_MESSAGE_BYTES {
        return Err(QueueError(format!(
            "MessageTooLong: {} bytes (SQS takes at most {MAX_MESSAGE_BYTES})",
            body.len()
        )));
    }
    Ok(())
}

/// A FIFO id (`what`: `MessageGroupId` or `MessageDeduplicationId`) as SQS takes it: 1 to 128
/// of `A-Z a-z 0-9` and ASCII punctuation, which is every ASCII graphic character. Memory
/// refuses the others too, so a caller that passes one fails here before it fails on SQS.
fn check_fifo_id(what: &str, id: &str) -> Result<(), QueueError> {
    if id.is_empty() || id.len() > MAX_FIFO_ID || !id.chars().all(|c| c.is_ascii_graphic()) {
        return Err(QueueError(format!(
            "InvalidParameterValue: {what} {id:?} must be 1 to {MAX_FIFO_ID} characters of \
             A-Z, a-z, 0-9 and ASCII punctuation"
        )));
    }
    Ok(())
}

#[async_trait]
impl Queue for MemoryQueues {
    async fn send(&self, queue_url: &str, body: &str, delay: Duration) -> Result<(), QueueError> {
        check_size(body)?;
        let visible_at = Instant::now() + delay;
        Self::push(&mut *self.lock()?, queue_url, body.to_owned(), visible_at)?;
        self.arrived.notify_waiters();
        Ok(())
    }

    async fn send_grouped(&self, message: GroupedMessage<'_>) -> Result<(), QueueError> {
        check_size(message.body)?;
        check_fifo_id("MessageGroupId", message.group)?;
        check_fifo_id("MessageDeduplicationId", message.dedup_id)?;
        let now = Instant::now();
        {
            let mut queues = self.lock()?;
            let url = message.queue_url;
            let q = queues
                .get_mut(url)
                .ok_or_else(|| QueueError(format!("no such queue: {url}")))?;
            if !q.config.fifo {
                return Err(not_fifo(url));
            }
            // Accepted and dropped, as SQS answers a duplicate: the sender cannot tell.
            if q.seen(message.dedup_id, now) {
                return Ok(());
            }
            Self::push_to(
                &mut queues,
                url,
                Some(message.group.to_owned()),
                message.body.to_owned(),
                now,
            )?;
        }
        self.arrived.notify_waiters();
        Ok(())
    }

    async fn send_fair(&self, message: FairMessage<'_>) -> Result<(), QueueError> {
        let Some(group) = message.group else {
            return self
                .send(message.queue_url, message.body, message.delay)
                .await;
        };
        check_size(message.body)?;
        check_fifo_id("MessageGroupId", group)?;
        {
            let mut queues = self.lock()?;
            let url = message.queue_url;
            if queues.get(url).is_some_and(|q| q.config.fifo) {
                return Err(QueueError(format!(
                    "InvalidParameterValue: {url} is a FIFO queue: a fair send is a standard \
                     queue's"
                )));
            }
            let visible_at = Instant::now() + message.delay;
            Self::push_to(
                &mut queues,
                url,
                Some(group.to_owned()),
                message.body.to_owned(),
                visible_at,
            )?;
        }
        self.arrived.notify_waiters();
        Ok(())
    }

    async fn receive(&self, ask: ReceiveRequest<'_>) -> Result<Vec<ReceivedMessage>, QueueError> {
        let deadline = Instant::now() + ask.wait;
        loop {
            let got = self.take_visible(ask.queue_url, ask.max.clamp(1, 10))?;
            let now = Instant::now();
            if !got.is_empty() || now >= deadline {
                return Ok(got);
            }
            // Wake on a new message, or poll again soon for delayed and reappearing ones.
            let nap = (deadline - now).min(Duration::from_millis(20));
            let _ = tokio::time::timeout(nap, self.arrived.notified()).await;
        }
    }

    async fn delete(&self, queue_url: &str, receipt_handle: &str) -> Result<(), QueueError> {
        let mut queues = self.lock()?;
        let q = queues
            .get_mut(queue_url)
            .ok_or_else(|| QueueError(format!("no such queue: {queue_url}")))?;
        // A receipt from an earlier receive no longer names the message: deleting with it is a
        // no-op, so a slow consumer cannot delete a message another consumer now holds.
        // Receipts are unique: remove the one message that holds it (a `retain` over the whole
        // queue made every delete cost a pass of swaps over every message in flight).
        if let Some(i) = q
            .messages
            .iter()
            .position(|m| m.receipt.as_deref() == Some(receipt_handle))
        {
            q.messages.remove(i);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grouped<'a>(url: &'a str, group: &'a str, dedup_id: &'a str) -> GroupedMessage<'a> {
        GroupedMessage {
            queue_url: url,
            group,
            dedup_id,
            body: dedup_id,
        }
    }

    fn fifo(max_receive_count: Option<u32>, dead_letter_url: Option<String>) -> QueueConfig {
        QueueConfig {
            visibility_timeout: Duration::from_millis(50),
            max_receive_count,
            dead_letter_url,
            fifo: true,
            fair: FairShare::default(),
        }
    }

    async fn fair_send(q: &MemoryQueues, url: &str, group: Option<&str>, body: &str) {
        q.send_fair(FairMessage {
            queue_url: url,
            group,
            body,
            delay: Duration::ZERO,
        })
        .await
        .expect("fair send");
    }

    #[tokio::test]
    async fn a_fair_queue_serves_a_quiet_tenant_before_a_noisy_ones_backlog() {
        let q = MemoryQueues::new();
        let url = q.create_queue(
            "work",
            QueueConfig {
                visibility_timeout: Duration::from_secs(60),
                ..QueueConfig::default()
            },
        );
        for i in 0..60 {
            fair_send(&q, &url, Some("noisy"), &format!("n{i}")).await;
        }
        fair_send(&q, &url, Some("quiet"), "q0").await;
        fair_send(&q, &url, None, "none").await;
        fair_send(&q, &url, Some("quiet"), "q1").await;
        // Until the noisy tenant holds 30 in flight it is not noisy: as sent.
        for _ in 0..3 {
            let got = bodies(&q, &url).await;
            assert!(got.iter().all(|b| b.starts_with('n')), "{got:?}");
        }
        // Now it is (30 of 30 in flight): the quiet tenants' go first, then its own.
        let got = bodies(&q, &url).await;
        assert_eq!(got[..3], ["q0", "none", "q1"], "{got:?}");
        assert_eq!(got[3..], ["n30", "n31", "n32", "n33", "n34", "n35", "n36"]);
    }

    #[tokio::test]
    async fn among_noisy_tenants_the_one_with_fewer_in_flight_goes_first() {
        let q = MemoryQueues::new();
        let fair = FairShare {
            percent: 10,
            at_least: 2,
        };
        let url = q.create_queue(
            "work",
            QueueConfig {
                visibility_timeout: Duration::from_secs(60),
                fair,
                ..QueueConfig::default()
            },
        );
        for i in 0..6 {
            fair_send(&q, &url, Some("a"), &format!("a{i}")).await;
        }
        for i in 0..4 {
            fair_send(&q, &url, Some("b"), &format!("b{i}")).await;
        }
        let first = q
            .receive(ReceiveRequest {
                queue_url: &url,
                max: 5,
                wait: Duration::ZERO,
            })
            .await
            .expect("receive");
        assert_eq!(first.len(), 5, "a0..a4 as sent: no one in flight yet");
        let first = q
            .receive(ReceiveRequest {
                queue_url: &url,
                max: 2,
                wait: Duration::ZERO,
            })
            .await
            .expect("receive");
        let got: Vec<_> = first.iter().map(|m| m.body.as_str()).collect();
        assert_eq!(got, ["b0", "b1"], "a holds 5 in flight, b none: b's first");
        let third = bodies(&q, &url).await;
        assert_eq!(third, ["b2", "b3", "a5"], "b holds 2, a 5: b's first");
    }

    #[tokio::test]
    async fn a_fair_send_is_a_standard_queues_and_a_grouped_one_a_fifos() {
        let q = MemoryQueues::new();
        let fifo_url = q.create_queue("ends", fifo(None, None));
        let fair = q
            .send_fair(FairMessage {
                queue_url: &fifo_url,
                group: Some("t"),
                body: "x",
                delay: Duration::ZERO,
            })
            .await;
        assert!(fair.is_err(), "a FIFO queue refuses a fair send");
        let url = q.create_queue("work", QueueConfig::default());
        let bad_group = q
            .send_fair(FairMessage {
                queue_url: &url,
                group: Some("a tenant"),
                body: "x",
                delay: Duration::ZERO,
            })
            .await;
        assert!(bad_group.is_err(), "a group SQS does not take");
        fair_send(&q, &url, Some("t"), "x").await;
        assert_eq!(bodies(&q, &url).await, ["x"]);
    }

    async fn bodies(q: &MemoryQueues, url: &str) -> Vec<String> {
        q.receive(ReceiveRequest::visible(url))
            .await
            .expect("receive")
            .into_iter()
            .map(|m| m.body)
            .collect()
    }

    #[tokio::test]
    async fn a_fifo_queue_takes_grouped_sends_only_and_a_standard_queue_plain_ones_only() {
        let q = MemoryQueues::new();
        let url = q.create_queue("ends", fifo(None, None));
        assert!(url.ends_with(".fifo"), "{url}");
        let standard = q.create_queue("work", QueueConfig::default());
        let plain = q.send(&url, "x", Duration::ZERO).await;
        assert!(
            matches!(&plain, Err(QueueError(m)) if m.contains("FIFO")),
            "{plain:?}"
        );
        let grouped_on_standard = q.send_grouped(grouped(&standard, "a", "1")).await;
        assert!(
            matches!(&grouped_on_standard, Err(QueueError(m)) if m.contains("not a FIFO")),
            "{grouped_on_standard:?}"
        );
        assert_eq!(q.depth(&url), Depth::default());
        assert_eq!(q.depth(&standard), Depth::default());
    }

    #[tokio::test]
    async fn ids_sqs_refuses_are_refused_naming_them() {
        let q = MemoryQueues::new();
        let url = q.create_queue("ends.fifo", fifo(None, None));
        let long = "r".repeat(MAX_FIFO_ID + 1);
        for (group, dedup_id, named) in [
            ("run 1", "1", "MessageGroupId \"run 1\""),
            ("", "1", "MessageGroupId \"\""),
            (long.as_str(), "1", "MessageGroupId \"rrr"),
            ("run-1", "é", "MessageDeduplicationId \"é\""),
        ] {
            let refused = q.send_grouped(grouped(&url, group, dedup_id)).await;
            assert!(
                matches!(&refused, Err(QueueError(m)) if m.contains(named)),
                "{refused:?}"
            );
        }
        let fits = "r".repeat(MAX_FIFO_ID);
        q.send_grouped(grouped(&url, &fits, "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"))
            .await
            .expect("every id SQS takes");
        assert_eq!(q.depth(&url).visible, 1);
    }

    #[test]
    fn a_dedup_id_is_forgotten_after_the_window() {
        let mut q = MemQueue::default();
        let t = Instant::now();
        assert!(!q.seen("a", t));
        assert!(q.seen("a", t + DEDUP_WINDOW - Duration::from_millis(1)));
        assert!(!q.seen("b", t + Duration::from_secs(1)));
        assert!(
            !q.seen("a", t + DEDUP_WINDOW),
            "forgotten once the window passed"
        );
        // Only what expired was dropped: `b` is still remembered, `a` from its new send.
        assert!(q.seen("b", t + DEDUP_WINDOW));
        assert_eq!(q.dedup_order.len(), 2);
    }

    #[tokio::test]
    async fn an_expired_receive_is_delivered_again_before_the_rest_of_its_group() {
        let q = MemoryQueues::new();
        let url = q.create_queue("ends", fifo(None, None));
        for id in ["a1", "a2"] {
            q.send_grouped(grouped(&url, "a", id)).await.expect("send");
        }
        let first = q
            .receive(ReceiveRequest {
                max: 1,
                ..ReceiveRequest::visible(&url)
            })
            .await
            .expect("receive");
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].body, "a1");
        assert!(bodies(&q, &url).await.is_empty(), "a1 holds its group");
        tokio::time::sleep(Duration::from_millis(80)).await;
        // Not deleted: a1 comes back, and a2 behind it in the same receive.
        assert_eq!(bodies(&q, &url).await, ["a1", "a2"]);
    }

    #[tokio::test]
    async fn a_fifo_queue_redrives_to_its_fifo_dead_letter_queue_keeping_the_group() {
        let q = MemoryQueues::new();
        let dlq = q.create_queue("dlq", fifo(None, None));
        let url = q.create_queue("ends", fifo(Some(1), Some(dlq.clone())));
        for id in ["a1", "a2"] {
            q.send_grouped(grouped(&url, "a", id)).await.expect("send");
        }
        let got = q
            .receive(ReceiveRequest {
                max: 1,
                ..ReceiveRequest::visible(&url)
            })
            .await
            .expect("receive");
        assert_eq!(got[0].body, "a1");
        tokio::time::sleep(Duration::from_millis(80)).await;
        // a1 had its one receive: it moves to the DLQ, and its group goes on with a2.
        assert_eq!(bodies(&q, &url).await, ["a2"]);
        assert_eq!(bodies(&q, &dlq).await, ["a1"]);

        let standard_dlq = q.create_queue("standard-dlq", QueueConfig::default());
        let mismatched = q.create_queue("mismatched", fifo(Some(1), Some(standard_dlq)));
        let refused = q.receive(ReceiveRequest::visible(&mismatched)).await;
        assert!(
            matches!(&refused, Err(QueueError(m)) if m.contains("both be FIFO")),
            "{refused:?}"
        );
    }
}
