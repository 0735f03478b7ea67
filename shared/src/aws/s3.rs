//! The payload store on S3: one object per payload, named by [`PayloadRef::key`] in the stack's
//! bucket (`PAYLOAD_BUCKET`); and the objects users name in other buckets (a distributed
//! forEach's list), read only.

use crate::domain::payload::MAX_PAYLOAD_BYTES;
use crate::domain::run::ObjectLocation;
use crate::domain::{PayloadRef, TaskId};
use crate::ports::{PayloadError, Payloads};
use async_trait::async_trait;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{Delete, ObjectIdentifier};
use base64::Engine as _;

/// The most keys one `DeleteObjects` call takes (S3's limit).
const DELETE_BATCH: usize = 1000;

/// S3 error codes that a retry may change: throttling, S3's own failures, a request that took
/// too long or whose bytes were damaged in transit (the checksum S3 computed is not the one
/// sent), a clock out of step. Every other 4xx answer is [`PayloadError::Rejected`] (access
/// denied, no such bucket, a malformed request); 5xx answers, timeouts and network errors are
/// [`PayloadError::Unavailable`].
const RETRYABLE: [&str; 11] = [
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "OperationAborted",
    "BadDigest",
    "XAmzContentSHA256Mismatch",
    "IncompleteBody",
];

/// Payloads in an S3 bucket.
#[derive(Debug, Clone)]
pub struct S3Payloads {
    client: aws_sdk_s3::Client,
    bucket: String,
}

impl S3Payloads {
    pub fn new(client: aws_sdk_s3::Client, bucket: impl Into<String>) -> Self {
        Self {
            client,
            bucket: bucket.into(),
        }
    }

    /// On the shared SDK configuration: with an endpoint override (an emulator on loopback,
    /// `AWS_ENDPOINT_URL` or `AWS_ENDPOINT_URL_S3`) the bucket is addressed in the path, as
    /// no `<bucket>.127.0.0.1` host name resolves.
    pub fn from_config(sdk: &aws_config::SdkConfig, bucket: impl Into<String>) -> Self {
        Self::new(s3_client(sdk), bucket)
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    async fn keys(&self, prefix: &str) -> Result<Vec<String>, PayloadError> {
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let out = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(prefix)
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| classify(prefix, &e))?;
            keys.extend(
                out.contents()
                    .iter()
                    .filter_map(|o| o.key().map(str::to_owned)),
            );
            match out.next_continuation_token() {
                Some(t) if out.is_truncated() == Some(true) => token = Some(t.to_owned()),
                _ => return Ok(keys),
            }
        }
    }
}

/// An S3 client on `sdk`, addressing buckets in the path when an endpoint is overridden.
pub fn s3_client(sdk: &aws_config::SdkConfig) -> aws_sdk_s3::Client {
    let overridden =
        sdk.endpoint_url().is_some() || std::env::var_os("AWS_ENDPOINT_URL_S3").is_some();
    let config = aws_sdk_s3::config::Builder::from(sdk)
        .force_path_style(overridden)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// A failed call on an object the user names as a [`PayloadError`]: as [`classify`], but a
/// missing key or bucket is the user's location pointing nowhere ([`PayloadError::NotFound`],
/// saying which), not a deployment without its bucket. Without `s3:ListBucket` on the bucket
/// S3 answers a missing key as `AccessDenied`: [`PayloadError::Rejected`].
fn classify_object<E>(location: &ObjectLocation, e: &SdkError<E, HttpResponse>) -> PayloadError
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
{
    match e.as_service_error().and_then(|se| se.code()) {
        Some("NoSuchKey") => PayloadError::NotFound(format!("object {location}")),
        Some("NoSuchBucket") => {
            PayloadError::NotFound(format!("bucket {} (of {location})", location.bucket))
        }
        _ => classify(&location.to_string(), e),
    }
}

/// A failed call on `key` (or a prefix) as a [`PayloadError`].
fn classify<E>(key: &str, e: &SdkError<E, HttpResponse>) -> PayloadError
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
{
    let what = || format!("{key}: {}", crate::aws::describe(e));
    let code = e.as_service_error().and_then(|se| se.code());
    let status = e.raw_response().map(|r| r.status().as_u16());
    match (code, status) {
        (Some("NoSuchKey"), _) => PayloadError::NotFound(format!("payload {key}")),
        (Some(c), _) if RETRYABLE.contains(&c) => PayloadError::Unavailable(what()),
        (_, Some(408 | 429)) => PayloadError::Unavailable(what()),
        (_, Some(s)) if (400..500).contains(&s) => PayloadError::Rejected(what()),
        _ => PayloadError::Unavailable(what()),
    }
}

#[async_trait]
impl Payloads for S3Payloads {
    async fn put(&self, task_id: TaskId, body: &[u8]) -> Result<PayloadRef, PayloadError> {
        let r = PayloadRef::of(task_id, body);
        let key = r.key();
        let digest =
            hex::decode(&r.sha256).map_err(|e| PayloadError::Unavailable(format!("{key}: {e}")))?;
        // S3 checks the bytes it received against this SHA-256 (`BadDigest` otherwise).
        let checksum = base64::engine::general_purpose::STANDARD.encode(digest);
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(&key)
            .content_type("application/json")
            .checksum_algorithm(aws_sdk_s3::types::ChecksumAlgorithm::Sha256)
            .checksum_sha256(checksum)
            .body(ByteStream::from(body.to_vec()))
            .send()
            .await
            .map_err(|e| classify(&key, &e))?;
        Ok(r)
    }

    async fn get(&self, r: &PayloadRef) -> Result<Vec<u8>, PayloadError> {
        let key = r.key();
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&key)
            .send()
            .await
            .map_err(|e| classify(&key, &e))?;
        let too_large =
            || PayloadError::Corrupt(format!("{key}: more than {MAX_PAYLOAD_BYTES} bytes"));
        if out
            .content_length()
            .is_some_and(|n| n > MAX_PAYLOAD_BYTES as i64)
        {
            return Err(too_large());
        }
        let mut body = Vec::with_capacity((r.bytes as usize).min(MAX_PAYLOAD_BYTES));
        let mut stream = out.body;
        while let Some(chunk) = stream
            .try_next()
            .await
            .map_err(|e| PayloadError::Unavailable(format!("{key}: reading: {e}")))?
        {
            if body.len() + chunk.len() > MAX_PAYLOAD_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        if r.matches(&body) {
            Ok(body)
        } else {
            Err(PayloadError::Corrupt(key))
        }
    }

    async fn delete_task(&self, task_id: TaskId) -> Result<usize, PayloadError> {
        let prefix = PayloadRef::prefix(task_id);
        let keys = self.keys(&prefix).await?;
        let mut deleted = 0;
        for batch in keys.chunks(DELETE_BATCH) {
            let objects = batch
                .iter()
                .map(|k| ObjectIdentifier::builder().key(k).build())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| PayloadError::Unavailable(format!("{prefix}: {e}")))?;
            let delete = Delete::builder()
                .set_objects(Some(objects))
                .quiet(true)
                .build()
                .map_err(|e| PayloadError::Unavailable(format!("{prefix}: {e}")))?;
            let out = self
                .client
                .delete_objects()
                .bucket(&self.bucket)
                .delete(delete)
                .send()
                .await
                .map_err(|e| classify(&prefix, &e))?;
            // Quiet mode answers only the keys it could not delete.
            if let Some(first) = out.errors().first() {
                let what = format!(
                    "{prefix}: {} of {} objects not deleted, first {}: {} {}",
                    out.errors().len(),
                    batch.len(),
                    first.key().unwrap_or_default(),
                    first.code().unwrap_or_default(),
                    first.message().unwrap_or_default()
                );
                return Err(match first.code() {
                    Some(c) if RETRYABLE.contains(&c) => PayloadError::Unavailable(what),
                    _ => PayloadError::Rejected(what),
                });
            }
            deleted += batch.len();
        }
        Ok(deleted)
    }

    async fn delete(&self, r: &PayloadRef) -> Result<(), PayloadError> {
        let key = r.key();
        // S3 answers a key that is not there as deleted.
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(&key)
            .send()
            .await
            .map_err(|e| classify(&key, &e))?;
        Ok(())
    }

    async fn read_object(
        &self,
        location: &ObjectLocation,
        max_bytes: usize,
    ) -> Result<Vec<u8>, PayloadError> {
        // The stack's bucket holds every task's payloads: a location there would read another
        // caller's data as a list. The user's objects are in buckets of their own.
        if location.bucket == self.bucket {
            return Err(PayloadError::Rejected(format!(
                "{location}: the payload bucket holds no user's objects"
            )));
        }
        let out = self
            .client
            .get_object()
            .bucket(&location.bucket)
            .key(&location.key)
            .send()
            .await
            .map_err(|e| classify_object(location, &e))?;
        let too_large = || PayloadError::TooLarge {
            location: location.to_string(),
            max: max_bytes,
        };
        // Refused on its length before a byte of the body is read.
        let length = out.content_length();
        if length.is_some_and(|n| u64::try_from(n).unwrap_or(0) > max_bytes as u64) {
            return Err(too_large());
        }
        // The length may be missing (a chunked answer): the bytes collected are bounded too.
        let expected = length.and_then(|n| usize::try_from(n).ok()).unwrap_or(0);
        let mut body = Vec::with_capacity(expected.min(max_bytes));
        let mut stream = out.body;
        while let Some(chunk) = stream
            .try_next()
            .await
            .map_err(|e| PayloadError::Unavailable(format!("{location}: reading: {e}")))?
        {
            if body.len() + chunk.len() > max_bytes {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}
