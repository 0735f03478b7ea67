//! The credentials of HTTP services: read at run time from where a service's `auth` says
//! (Secrets Manager or SSM Parameter Store, see [`crate::aws::AwsCredentials`]), kept for a
//! while per source, and never logged: a [`Secret`] prints as `***`, and no error message
//! carries a value, only the source's name.

use crate::domain::workflow::CredentialSource;
use crate::ports::Clock;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How long a credential is kept by default (`CREDENTIALS_CACHE_SECONDS`).
pub const DEFAULT_CACHE_TTL: chrono::Duration = chrono::Duration::seconds(300);

/// A credential's value. Its `Debug` prints `***`; [`Secret::expose`] is the only way in.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, to put in a request (and nowhere else).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// A credential that could not be read: names the source, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("credential {from} cannot be read: {problem}")]
pub struct CredentialError {
    pub from: CredentialSource,
    pub problem: String,
}

/// Where credentials come from (the port).
#[async_trait]
pub trait Credentials: Send + Sync + fmt::Debug {
    /// Reads the current value of `source`.
    async fn read(&self, source: &CredentialSource) -> Result<Secret, CredentialError>;
}

/// Credentials held in memory (tests and the local runner): set them by source.
#[derive(Default)]
pub struct MemoryCredentials {
    values: Mutex<HashMap<CredentialSource, Secret>>,
    reads: AtomicUsize,
}

impl MemoryCredentials {
    /// Sets (or replaces, as a rotation would) the value of `source`.
    pub fn set(&self, source: CredentialSource, value: impl Into<String>) {
        if let Ok(mut m) = self.values.lock() {
            m.insert(source, Secret::new(value));
        }
    }

    /// How many reads reached this store (what the cache did not answer).
    pub fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for MemoryCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sources: Vec<String> = self
            .values
            .lock()
            .map(|m| m.keys().map(ToString::to_string).collect())
            .unwrap_or_default();
        f.debug_struct("MemoryCredentials")
            .field("sources", &sources)
            .finish()
    }
}

#[async_trait]
impl Credentials for MemoryCredentials {
    async fn read(&self, source: &CredentialSource) -> Result<Secret, CredentialError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.values
            .lock()
            .ok()
            .and_then(|m| m.get(source).cloned())
            .ok_or_else(|| CredentialError {
                from: source.clone(),
                problem: "not found".into(),
            })
    }
}

/// Credentials read only from sources under a name prefix, as a deployment's IAM policy lets
/// the agent read only `SecretsPrefix` (template.yaml, `ReadSecrets` and `ReadParameters`):
/// `sas-local` wraps the developer's profile in it, which may reach far more.
pub struct ScopedCredentials {
    inner: Arc<dyn Credentials>,
    prefix: String,
}

impl ScopedCredentials {
    /// `prefix`: as the template's `SecretsPrefix`, e.g. `sas/dev/` (checked by
    /// [`check_prefix`]).
    pub fn new(inner: Arc<dyn Credentials>, prefix: impl Into<String>) -> Self {
        Self {
            inner,
            prefix: prefix.into(),
        }
    }

    /// Whether `source` is under the prefix: the name a policy's resource ARN ends with
    /// (`secret:<name>`, `parameter/<name without its leading slash>`), also when the source is
    /// given as an ARN.
    pub fn allows(&self, source: &CredentialSource) -> bool {
        let name = match source {
            CredentialSource::Secret(id) => match id.strip_prefix("arn:") {
                Some(arn) => match arn.splitn(5, ':').collect::<Vec<_>>()[..] {
                    [_, "secretsmanager", _, _, resource] => resource.strip_prefix("secret:"),
                    _ => None,
                },
                None => Some(id.as_str()),
            },
            CredentialSource::Parameter(name) => match name.strip_prefix("arn:") {
                Some(arn) => match arn.splitn(5, ':').collect::<Vec<_>>()[..] {
                    [_, "ssm", _, _, resource] => resource.strip_prefix("parameter/"),
                    _ => None,
                },
                None => Some(name.strip_prefix('/').unwrap_or(name)),
            },
        };
        name.is_some_and(|n| n.starts_with(&self.prefix))
    }
}

/// Checks a secrets prefix as the template's `SecretsPrefix` pattern does, and refuses an
/// empty one (that would allow every secret): segments of `A-Za-z0-9_.+=@-`, each ending in
/// `/`.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    let ok = !prefix.is_empty()
        && prefix.ends_with('/')
        && prefix[..prefix.len() - 1].split('/').all(|seg| {
            !seg.is_empty()
                && seg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.+=@-".contains(c))
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "secrets prefix {prefix:?}: must be one or more segments of letters, digits and _.+=@- each ending in / (e.g. sas/dev/)"
        ))
    }
}

impl fmt::Debug for ScopedCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedCredentials")
            .field("prefix", &self.prefix)
            .field("inner", &self.inner)
            .finish()
    }
}

#[async_trait]
impl Credentials for ScopedCredentials {
    async fn read(&self, source: &CredentialSource) -> Result<Secret, CredentialError> {
        if !self.allows(source) {
            return Err(CredentialError {
                from: source.clone(),
                problem: format!(
                    "it is outside the secrets prefix {:?} (SecretsPrefix): not read",
                    self.prefix
                ),
            });
        }
        self.inner.read(source).await
    }
}

/// Credentials kept per source for a time to live, and dropped at once when a service says a
/// credential is no good (401/403), so that a rotated secret is picked up on the next call.
pub struct CachedCredentials {
    inner: Arc<dyn Credentials>,
    ttl: chrono::Duration,
    clock: Arc<dyn Clock>,
    kept: Mutex<HashMap<CredentialSource, (Secret, DateTime<Utc>)>>,
}

impl CachedCredentials {
    pub fn new(inner: Arc<dyn Credentials>, ttl: chrono::Duration, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner,
            ttl,
            clock,
            kept: Mutex::new(HashMap::new()),
        }
    }

    /// The value of `source`: the kept one while it is fresh, else read now (and kept).
    pub async fn get(&self, source: &CredentialSource) -> Result<Secret, CredentialError> {
        let now = self.clock.now();
        if let Some(secret) = self.kept.lock().ok().and_then(|m| {
            m.get(source)
                .filter(|(_, until)| now < *until)
                .map(|(s, _)| s.clone())
        }) {
            return Ok(secret);
        }
        let secret = self.inner.read(source).await?;
        if let Ok(mut m) = self.kept.lock() {
            m.insert(source.clone(), (secret.clone(), now + self.ttl));
        }
        Ok(secret)
    }

    /// Drops the kept value of `source` (the service refused it).
    pub fn forget(&self, source: &CredentialSource) {
        if let Ok(mut m) = self.kept.lock() {
            m.remove(source);
        }
    }
}

impl fmt::Debug for CachedCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedCredentials")
            .field("inner", &self.inner)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::OffsetClock;

    fn secret(id: &str) -> CredentialSource {
        CredentialSource::Secret(id.into())
    }

    #[test]
    fn a_secret_never_shows_its_value() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "***");
        let memory = MemoryCredentials::default();
        memory.set(secret("sas/dev/bank"), "hunter2");
        let shown = format!("{memory:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("sas/dev/bank"), "{shown}");
        let cached = CachedCredentials::new(
            Arc::new(memory),
            DEFAULT_CACHE_TTL,
            Arc::new(OffsetClock::default()),
        );
        assert!(!format!("{cached:?}").contains("hunter2"));
    }

    #[tokio::test]
    async fn kept_for_the_ttl_then_read_again() {
        let memory = Arc::new(MemoryCredentials::default());
        memory.set(secret("a"), "one");
        let clock = Arc::new(OffsetClock::default());
        let cached = CachedCredentials::new(
            memory.clone(),
            chrono::Duration::seconds(300),
            clock.clone(),
        );
        assert_eq!(
            cached.get(&secret("a")).await.expect("read").expose(),
            "one"
        );
        memory.set(secret("a"), "two");
        assert_eq!(
            cached.get(&secret("a")).await.expect("kept").expose(),
            "one",
            "kept within the TTL"
        );
        assert_eq!(memory.reads(), 1);
        clock.advance(chrono::Duration::seconds(301));
        assert_eq!(
            cached.get(&secret("a")).await.expect("read").expose(),
            "two",
            "read again after the TTL"
        );
        assert_eq!(memory.reads(), 2);
    }

    #[tokio::test]
    async fn forgetting_reads_the_rotated_value_at_once() {
        let memory = Arc::new(MemoryCredentials::default());
        memory.set(secret("a"), "old");
        let cached = CachedCredentials::new(
            memory.clone(),
            chrono::Duration::seconds(300),
            Arc::new(OffsetClock::default()),
        );
        cached.get(&secret("a")).await.expect("read");
        memory.set(secret("a"), "new");
        cached.forget(&secret("a"));
        assert_eq!(
            cached.get(&secret("a")).await.expect("read").expose(),
            "new"
        );
    }

    #[tokio::test]
    async fn only_sources_under_the_prefix_are_read() {
        let memory = Arc::new(MemoryCredentials::default());
        let param = |n: &str| CredentialSource::Parameter(n.into());
        let all = [
            secret("sas/dev/bank"),
            secret("sas/devx/bank"),
            secret("prod/db"),
            secret("arn:aws:secretsmanager:eu-west-1:123456789012:secret:sas/dev/bank-AbCdEf"),
            secret("arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/db-AbCdEf"),
            secret("arn:aws:ssm:eu-west-1:123456789012:parameter/sas/dev/bank"),
            param("/sas/dev/key"),
            param("sas/dev/key"),
            param("/prod/key"),
            param("arn:aws:ssm:eu-west-1:123456789012:parameter/sas/dev/key"),
            param("arn:aws:ssm:eu-west-1:123456789012:parameter/prod/key"),
        ];
        for s in &all {
            memory.set(s.clone(), "value");
        }
        let scoped = ScopedCredentials::new(memory.clone(), "sas/dev/");
        let read: Vec<bool> = futures::future::join_all(all.iter().map(|s| scoped.read(s)))
            .await
            .iter()
            .map(Result::is_ok)
            .collect();
        assert_eq!(
            read,
            [
                true, false, false, true, false, false, true, true, false, true, false
            ]
        );
        assert_eq!(
            memory.reads(),
            5,
            "a source outside is refused before any read"
        );
        let e = scoped.read(&secret("prod/db")).await.expect_err("outside");
        assert!(
            e.to_string().contains("prod/db") && e.to_string().contains("sas/dev/"),
            "{e}"
        );
        assert!(check_prefix("sas/dev/").is_ok());
        for bad in ["", "/", "sas/dev", "/sas/dev/", "sas//", "sas/*/"] {
            assert!(check_prefix(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_missing_credential_names_its_source() {
        let cached = CachedCredentials::new(
            Arc::new(MemoryCredentials::default()),
            DEFAULT_CACHE_TTL,
            Arc::new(OffsetClock::default()),
        );
        let e = cached
            .get(&CredentialSource::Parameter("/sas/dev/key".into()))
            .await
            .expect_err("missing");
        assert!(e.to_string().contains("/sas/dev/key"), "{e}");
    }
}
