//! The payload store on S3: one object per payload, named by [`PayloadRef::key`] in the stack's
//! bucket (`PAYLOAD_BUCKET`); and the objects users name in other buckets (a distributed
//! forEach's list), read only.

use crate::domain::payload::{LinesWriter, MAX_PAYLOAD_BYTES};
use crate::domain::run::ObjectLocation;
use crate::domain::{PayloadRef, TaskId};
use crate::ports::{LineStream, PayloadError, Payloads};
use async_trait::async_trait;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart, Delete, ObjectIdentifier,
};
use base64::Engine as _;
use sha2::Digest as _;
use tracing::{info, warn};

/// The size of a JSON Lines payload's parts ([`Payloads::put_lines`]) for its first
/// [`PARTS_PER_STEP`] parts: over S3's 5 MiB least part, and what the writer holds at once.
/// One that ends within its first part is one `PutObject`.
pub const PART_BYTES: usize = 8 * 1024 * 1024;
/// Each this many parts, the parts grow by [`PART_BYTES`]: S3 takes at most 10,000 parts, so
/// an upload may reach about 430 GiB (S3's own bound is 5 TiB per object), while a writer
/// holds at most one part.
const PARTS_PER_STEP: usize = 1000;

/// The size a JSON Lines payload's part `n` (from 1) is cut at.
fn part_target(n: usize) -> usize {
    PART_BYTES * (1 + (n.saturating_sub(1)) / PARTS_PER_STEP)
}

/// How many S3 calls a JSON Lines payload of `bytes` takes ([`Payloads::put_lines`]): one
/// `PutObject` within a part, else a `CreateMultipartUpload`, an `UploadPart` per part and a
/// `CompleteMultipartUpload`. `(put_objects, parts)`: `(1, 0)` or `(0, parts)`.
pub fn lines_calls(bytes: u64) -> (usize, usize) {
    let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    if bytes < PART_BYTES {
        return (1, 0);
    }
    let (mut parts, mut cut) = (0, 0usize);
    while cut < bytes {
        parts += 1;
        cut = cut.saturating_add(part_target(parts));
    }
    (0, parts)
}

/// The base64 of the SHA-256 of `bytes`, as S3 checks a body against it.
fn sha256_b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(bytes))
}

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

    /// Uploads part `n` of `upload` of `key`; its record for the completion.
    async fn upload_part(
        &self,
        key: &str,
        upload: &str,
        n: usize,
        part: Vec<u8>,
    ) -> Result<CompletedPart, PayloadError> {
        let number = i32::try_from(n)
            .map_err(|_| PayloadError::Rejected(format!("{key}: part {n} is past S3's parts")))?;
        let checksum = sha256_b64(&part);
        let out = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload)
            .part_number(number)
            .checksum_algorithm(ChecksumAlgorithm::Sha256)
            .checksum_sha256(&checksum)
            .body(ByteStream::from(part))
            .send()
            .await
            .map_err(|e| classify(key, &e))?;
        Ok(CompletedPart::builder()
            .part_number(number)
            .set_e_tag(out.e_tag().map(str::to_owned))
            .checksum_sha256(checksum)
            .build())
    }

    /// The parts after the first of a multipart upload, then its completion: the object is
    /// there, whole, once this answers.
    async fn upload_rest(
        &self,
        key: &str,
        upload: &str,
        first: Vec<u8>,
        writer: &mut LinesWriter,
        lines: &mut LineStream<'_>,
    ) -> Result<(), PayloadError> {
        use futures::TryStreamExt;
        let mut parts = vec![self.upload_part(key, upload, 1, first).await?];
        let mut buffer = Vec::with_capacity(part_target(2));
        while let Some(line) = lines.try_next().await? {
            writer
                .push(&line, &mut buffer)
                .map_err(|e| PayloadError::Rejected(format!("{key}: {e}")))?;
            let n = parts.len() + 1;
            if buffer.len() >= part_target(n) {
                let part = std::mem::replace(&mut buffer, Vec::with_capacity(part_target(n + 1)));
                parts.push(self.upload_part(key, upload, n, part).await?);
            }
        }
        if !buffer.is_empty() {
            let n = parts.len() + 1;
            parts.push(self.upload_part(key, upload, n, buffer).await?);
        }
        self.client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| classify(key, &e))?;
        Ok(())
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

    async fn put_lines(
        &self,
        task_id: TaskId,
        mut lines: LineStream<'_>,
    ) -> Result<PayloadRef, PayloadError> {
        use futures::TryStreamExt;
        let mut writer = LinesWriter::new(task_id);
        let key = writer.key();
        // The first part is held: a payload that ends within it is one PutObject.
        let mut first = Vec::with_capacity(PART_BYTES);
        let mut more = false;
        while let Some(line) = lines.try_next().await? {
            writer
                .push(&line, &mut first)
                .map_err(|e| PayloadError::Rejected(format!("{key}: {e}")))?;
            if first.len() >= PART_BYTES {
                more = true;
                break;
            }
        }
        if !more {
            self.client
                .put_object()
                .bucket(&self.bucket)
                .key(&key)
                .content_type("application/jsonl")
                .checksum_algorithm(ChecksumAlgorithm::Sha256)
                .checksum_sha256(sha256_b64(&first))
                .body(ByteStream::from(first))
                .send()
                .await
                .map_err(|e| classify(&key, &e))?;
            return Ok(writer.finish());
        }
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(&key)
            .content_type("application/jsonl")
            .checksum_algorithm(ChecksumAlgorithm::Sha256)
            .send()
            .await
            .map_err(|e| classify(&key, &e))?;
        let upload = created
            .upload_id()
            .ok_or_else(|| PayloadError::Unavailable(format!("{key}: S3 named no upload")))?
            .to_owned();
        match self
            .upload_rest(&key, &upload, first, &mut writer, &mut lines)
            .await
        {
            Ok(()) => {
                info!(%key, bytes = writer.bytes(), "JSON Lines payload kept in parts");
                Ok(writer.finish())
            }
            Err(e) => {
                // Its parts are freed now; an upload its writer died in (no abort) is freed by
                // the bucket's lifecycle rule (AbortIncompleteMultipartUploads).
                if let Err(a) = self
                    .client
                    .abort_multipart_upload()
                    .bucket(&self.bucket)
                    .key(&key)
                    .upload_id(&upload)
                    .send()
                    .await
                {
                    warn!(%key, error = %classify(&key, &a), "a failed upload not aborted");
                }
                Err(e)
            }
        }
    }

    async fn read_url(
        &self,
        r: &PayloadRef,
        ttl: std::time::Duration,
    ) -> Result<Option<String>, PayloadError> {
        let config = aws_sdk_s3::presigning::PresigningConfig::expires_in(ttl)
            .map_err(|e| PayloadError::Rejected(format!("a read URL's lifetime: {e}")))?;
        let key = r.key();
        let presigned = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&key)
            .presigned(config)
            .await
            .map_err(|e| PayloadError::Unavailable(format!("{key}: no read URL: {e}")))?;
        Ok(Some(presigned.uri().to_owned()))
    }

    async fn get(&self, r: &PayloadRef) -> Result<Vec<u8>, PayloadError> {
        let key = r.key();
        // A JSON Lines payload has no bound but S3's: its reference's length bounds the read.
        let max = if r.lines.is_some() {
            usize::try_from(r.bytes).unwrap_or(usize::MAX)
        } else {
            MAX_PAYLOAD_BYTES
        };
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&key)
            .send()
            .await
            .map_err(|e| classify(&key, &e))?;
        let too_large = || PayloadError::Corrupt(format!("{key}: more than {max} bytes"));
        if out
            .content_length()
            .is_some_and(|n| u64::try_from(n).unwrap_or(0) > max as u64)
        {
            return Err(too_large());
        }
        let mut body = Vec::with_capacity((r.bytes as usize).min(max));
        let mut stream = out.body;
        while let Some(chunk) = stream
            .try_next()
            .await
            .map_err(|e| PayloadError::Unavailable(format!("{key}: reading: {e}")))?
        {
            if body.len() + chunk.len() > max {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_lines_payload_is_one_put_within_a_part_and_grows_its_parts_past_a_thousand() {
        assert_eq!(lines_calls(10), (1, 0));
        assert_eq!(lines_calls(PART_BYTES as u64 - 1), (1, 0));
        assert_eq!(lines_calls(PART_BYTES as u64), (0, 1));
        assert_eq!(lines_calls(20 * 1024 * 1024), (0, 3));
        assert_eq!(part_target(1), PART_BYTES);
        assert_eq!(part_target(1000), PART_BYTES);
        assert_eq!(part_target(1001), 2 * PART_BYTES);
        // S3's 10,000 parts reach past 400 GiB.
        let reach: usize = (1..=10_000).map(part_target).sum();
        assert!(reach > 400 * (1 << 30), "{reach}");
    }
}
