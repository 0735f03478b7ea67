use crate::ports::{Queue, QueueError, ReceiveRequest, ReceivedMessage};
use async_trait::async_trait;
use std::collections::{HashMap, VecDeque};
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
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            visibility_timeout: Duration::from_secs(30),
            max_receive_count: None,
            dead_letter_url: None,
        }
    }
}

/// Named queues with SQS standard-queue semantics: at-least-once delivery, a visibility
/// timeout after which an undeleted message is delivered again, `DelaySeconds`, and redrive to
/// a dead-letter queue after `max_receive_count` receives.
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
}

#[derive(Debug)]
struct Message {
    id: String,
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

    /// Creates the queue (or keeps it if it exists) and returns its URL.
    pub fn create_queue(&self, name: &str, config: QueueConfig) -> String {
        let url = format!("memory://sas/{name}");
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
        let q = queues
            .get_mut(url)
            .ok_or_else(|| QueueError(format!("no such queue: {url}")))?;
        q.next_id += 1;
        q.messages.push_back(Message {
            id: format!("{url}#{}", q.next_id),
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
        let q = queues
            .get_mut(url)
            .ok_or_else(|| QueueError(format!("no such queue: {url}")))?;
        let config = q.config.clone();
        let mut out = Vec::new();
        let mut dead = Vec::new();
        let mut i = 0;
        while i < q.messages.len() && out.len() < max as usize {
            let m = &mut q.messages[i];
            if m.visible_at > now {
                i += 1;
                continue;
            }
            if let (Some(limit), Some(_)) = (config.max_receive_count, &config.dead_letter_url)
                && m.receive_count >= limit
            {
                if let Some(m) = q.messages.remove(i) {
                    dead.push(m.body);
                }
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
            i += 1;
        }
        if let Some(dlq) = config.dead_letter_url {
            for body in dead {
                Self::push(&mut queues, &dlq, body, now)?;
            }
        }
        Ok(out)
    }
}

/// The largest message SQS takes (256 KiB).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

#[async_trait]
impl Queue for MemoryQueues {
    async fn send(&self, queue_url: &str, body: &str, delay: Duration) -> Result<(), QueueError> {
        // SQS's own bound on a message: a sender that relies on more fails here too.
        if body.len() > MAX_MESSAGE_BYTES {
            return Err(QueueError(format!(
                "MessageTooLong: {} bytes (SQS takes at most {MAX_MESSAGE_BYTES})",
                body.len()
            )));
        }
        let visible_at = Instant::now() + delay;
        Self::push(&mut *self.lock()?, queue_url, body.to_owned(), visible_at)?;
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
