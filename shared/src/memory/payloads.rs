use crate::domain::payload::LinesWriter;
use crate::domain::run::ObjectLocation;
use crate::domain::{PayloadRef, TaskId};
use crate::ports::{LineStream, PayloadError, Payloads};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// Payloads kept in memory, by object name ([`PayloadRef::key`]), as S3 keeps them in the
/// stack's bucket: `get` checks what it reads against its reference, `delete_task` removes
/// every object under the task's prefix. Beside them, in a map of their own, the objects users
/// name ([`MemoryPayloads::put_object`], read by [`Payloads::read_object`]): a user's key never
/// names a payload, and a task's retention never deletes a user's object.
#[derive(Debug, Default)]
pub struct MemoryPayloads {
    objects: Mutex<BTreeMap<String, Vec<u8>>>,
    /// The users' objects, by bucket and key.
    user_objects: Mutex<BTreeMap<(String, String), Vec<u8>>>,
}

impl MemoryPayloads {
    pub fn new() -> Self {
        Self::default()
    }

    fn objects(&self) -> Result<MutexGuard<'_, BTreeMap<String, Vec<u8>>>, PayloadError> {
        self.objects
            .lock()
            .map_err(|_| PayloadError::Unavailable("memory payloads lock poisoned".into()))
    }

    /// Writes `bytes` under `key` as they are, whatever their reference says: how a test
    /// changes an object behind the store's back (feature `testkit`).
    #[cfg(any(test, feature = "testkit"))]
    pub fn overwrite(&self, key: &str, bytes: Vec<u8>) {
        if let Ok(mut o) = self.objects.lock() {
            o.insert(key.to_owned(), bytes);
        }
    }

    /// Places `bytes` as the user's object `s3://bucket/key` (a distributed forEach's list),
    /// replacing one there: how a test or `sas-local` gives a run its list.
    pub fn put_object(&self, bucket: &str, key: &str, bytes: Vec<u8>) {
        if let Ok(mut o) = self.user_objects.lock() {
            o.insert((bucket.to_owned(), key.to_owned()), bytes);
        }
    }

    /// How many objects are kept (every task's).
    pub fn len(&self) -> usize {
        self.objects.lock().map(|o| o.len()).unwrap_or_default()
    }

    /// Whether no object is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl Payloads for MemoryPayloads {
    async fn put(&self, task_id: TaskId, body: &[u8]) -> Result<PayloadRef, PayloadError> {
        let r = PayloadRef::of(task_id, body);
        self.objects()?.insert(r.key(), body.to_vec());
        Ok(r)
    }

    async fn get(&self, r: &PayloadRef) -> Result<Vec<u8>, PayloadError> {
        let key = r.key();
        let body = self
            .objects()?
            .get(&key)
            .cloned()
            .ok_or_else(|| PayloadError::NotFound(format!("payload {key}")))?;
        if r.matches(&body) {
            Ok(body)
        } else {
            Err(PayloadError::Corrupt(key))
        }
    }

    async fn put_lines(
        &self,
        task_id: TaskId,
        mut lines: LineStream<'_>,
    ) -> Result<PayloadRef, PayloadError> {
        use futures::TryStreamExt;
        let mut writer = LinesWriter::new(task_id);
        let mut body = Vec::new();
        while let Some(line) = lines.try_next().await? {
            writer
                .push(&line, &mut body)
                .map_err(|e| PayloadError::Rejected(e.to_string()))?;
        }
        // Kept whole once every line is there: no reader sees part of it.
        let r = writer.finish();
        self.objects()?.insert(r.key(), body);
        Ok(r)
    }

    async fn delete_task(&self, task_id: TaskId) -> Result<usize, PayloadError> {
        let prefix = PayloadRef::prefix(task_id);
        let mut objects = self.objects()?;
        let before = objects.len();
        objects.retain(|k, _| !k.starts_with(&prefix));
        Ok(before - objects.len())
    }

    async fn delete(&self, r: &PayloadRef) -> Result<(), PayloadError> {
        self.objects()?.remove(&r.key());
        Ok(())
    }

    async fn read_object(
        &self,
        location: &ObjectLocation,
        max_bytes: usize,
    ) -> Result<Vec<u8>, PayloadError> {
        let objects = self
            .user_objects
            .lock()
            .map_err(|_| PayloadError::Unavailable("memory objects lock poisoned".into()))?;
        if !objects.keys().any(|(b, _)| *b == location.bucket) {
            return Err(PayloadError::NotFound(format!(
                "bucket {} (of {location})",
                location.bucket
            )));
        }
        let body = objects
            .get(&(location.bucket.clone(), location.key.clone()))
            .ok_or_else(|| PayloadError::NotFound(format!("object {location}")))?;
        if body.len() > max_bytes {
            return Err(PayloadError::TooLarge {
                location: location.to_string(),
                max: max_bytes,
            });
        }
        Ok(body.clone())
    }
}
