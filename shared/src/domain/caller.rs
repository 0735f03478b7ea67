//! Who started a task: the caller, as the task API's authorizer established it.
//!
//! A caller owns the tasks it starts: it reads, lists and cancels only those, and its
//! idempotency keys are its own. The operator API sees every caller's tasks.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;

/// The longest caller id kept (IAM ARNs are at most 2048 characters; a JWT `sub` far less).
pub const MAX_CALLER_LEN: usize = 2048;

/// A caller id: an IAM principal ARN (`IAM` mode), the `sub` claim of a JWT (`JWT` mode), or
/// `anonymous` (an API deployed with `None`: every request is the same caller).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Caller(String);

/// A caller id that cannot be kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("caller id must be 1 to {MAX_CALLER_LEN} visible characters")]
pub struct InvalidCaller;

/// Why an authenticated principal cannot be a caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrincipalError {
    #[error(transparent)]
    Invalid(#[from] InvalidCaller),
    /// The id is one of sas's own callers' ([`Caller::RESERVED_PREFIX`]).
    #[error(
        "{0:?} is reserved: ids starting {prefix:?} are sas's own callers (a schedule's tasks belong to arn:sas:schedule:<name>)",
        prefix = Caller::RESERVED_PREFIX
    )]
    Reserved(String),
}

impl Caller {
    /// The one caller of an API without authentication, and the owner of tasks stored before
    /// callers were recorded.
    pub const ANONYMOUS: &'static str = "anonymous";

    pub fn new(id: impl Into<String>) -> Result<Self, InvalidCaller> {
        let id = id.into();
        if id.is_empty() || id.len() > MAX_CALLER_LEN || id.chars().any(char::is_control) {
            return Err(InvalidCaller);
        }
        Ok(Self(id))
    }

    pub fn anonymous() -> Self {
        Self(Self::ANONYMOUS.to_owned())
    }

    /// The prefix of sas's own callers' ids (`arn:sas:schedule:<name>`: a schedule's tasks),
    /// which no authenticated principal may have: a JWT subject of that form would own, list
    /// and cancel a schedule's tasks, and take its runs' idempotency keys first.
    pub const RESERVED_PREFIX: &'static str = "arn:sas:";

    /// The caller schedule `name`'s runs start their tasks as.
    pub fn schedule(name: &str) -> Result<Self, InvalidCaller> {
        Self::new(format!("{}schedule:{name}", Self::RESERVED_PREFIX))
    }

    /// The caller a distributed forEach's run and elements belong to (`arn:sas:run:<run id>`):
    /// sas's own, so they stay out of the task's caller's list (ten thousand entries for one
    /// step); the caller sees the step's result on its own task.
    pub fn run(run: &crate::domain::TaskId) -> Self {
        Self(format!("{}run:{run}", Self::RESERVED_PREFIX))
    }

    /// The caller an authenticated principal (a JWT's subject, an IAM principal) names: as
    /// [`Caller::new`], and never one of sas's own ([`Caller::RESERVED_PREFIX`]).
    pub fn principal(id: impl Into<String>) -> Result<Self, PrincipalError> {
        let caller = Self::new(id)?;
        if caller.is_reserved() {
            return Err(PrincipalError::Reserved(caller.0));
        }
        Ok(caller)
    }

    /// Whether the caller's list holds this caller's tasks: every caller's but a distributed
    /// forEach's run's ([`Caller::run`]), which no one lists (its run and elements are reached
    /// from the task's step), so their task items make no entry in the caller's index.
    pub fn listed(&self) -> bool {
        !self
            .0
            .strip_prefix(Self::RESERVED_PREFIX)
            .is_some_and(|rest| rest.starts_with("run:"))
    }

    /// One of sas's own callers ([`Caller::RESERVED_PREFIX`]).
    pub fn is_reserved(&self) -> bool {
        self.0.starts_with(Self::RESERVED_PREFIX)
    }

    /// The caller an IAM principal ARN names. An assumed-role session
    /// (`arn:aws:sts::<account>:assumed-role/<role>/<session>`) is its role
    /// (`arn:aws:sts::<account>:assumed-role/<role>`): a service's Lambda functions or
    /// containers get a new session name on every start, and must still own the tasks they
    /// started.
    pub fn from_iam_arn(arn: &str) -> Result<Self, PrincipalError> {
        let owner = match arn.split_once(":assumed-role/") {
            Some((head, rest)) => match rest.split_once('/') {
                Some((role, _session)) => format!("{head}:assumed-role/{role}"),
                None => arn.to_owned(),
            },
            None => arn.to_owned(),
        };
        Self::principal(owner)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A fixed-length digest of the id (SHA-256, hex): scopes keys by caller without putting
    /// an ARN of up to 2048 characters into every key.
    pub fn digest(&self) -> String {
        hex::encode(Sha256::digest(self.0.as_bytes()))
    }

    /// The caller's partition `shard` of the index of its tasks: its digest and the shard. A
    /// task is filed under the shard its id hashes to, so one caller's tasks spread over every
    /// shard and no index partition takes all of a busy caller's writes.
    pub fn index_key(&self, shard: u32) -> String {
        format!("{}#{shard}", self.digest())
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assumed_role_session_is_its_role() {
        let a = Caller::from_iam_arn("arn:aws:sts::123456789012:assumed-role/submitter/i-0abc")
            .expect("valid");
        let b = Caller::from_iam_arn("arn:aws:sts::123456789012:assumed-role/submitter/1700000000")
            .expect("valid");
        assert_eq!(a, b);
        assert_eq!(
            a.as_str(),
            "arn:aws:sts::123456789012:assumed-role/submitter"
        );
        let user = Caller::from_iam_arn("arn:aws:iam::123456789012:user/alice").expect("valid");
        assert_eq!(user.as_str(), "arn:aws:iam::123456789012:user/alice");
        assert_ne!(a, user);
    }

    #[test]
    fn no_principal_is_one_of_sas_own_callers() {
        let nightly = Caller::schedule("nightly").expect("valid");
        assert_eq!(nightly.as_str(), "arn:sas:schedule:nightly");
        assert!(nightly.is_reserved());
        for id in ["arn:sas:schedule:nightly", "arn:sas:anything"] {
            assert_eq!(
                Caller::principal(id),
                Err(PrincipalError::Reserved(id.to_owned()))
            );
            assert!(matches!(
                Caller::from_iam_arn(id),
                Err(PrincipalError::Reserved(_))
            ));
        }
        for id in ["alice", "ARN:SAS:schedule:nightly", "x-arn:sas:schedule:n"] {
            assert!(Caller::principal(id).is_ok(), "{id}");
        }
        assert_eq!(
            Caller::principal(""),
            Err(PrincipalError::Invalid(InvalidCaller))
        );
    }

    #[test]
    fn a_runs_caller_alone_is_not_listed() {
        let run = Caller::run(&crate::domain::TaskId::new_random());
        assert!(run.is_reserved());
        assert!(!run.listed());
        for listed in [
            Caller::anonymous(),
            Caller::new("alice").expect("ok"),
            Caller::schedule("nightly").expect("ok"),
            Caller::new("arn:aws:iam::1:user/run:x").expect("ok"),
        ] {
            assert!(listed.listed(), "{listed:?}");
        }
    }

    #[test]
    fn ids_are_bounded_and_digests_differ() {
        assert!(Caller::new("").is_err());
        assert!(Caller::new("x".repeat(MAX_CALLER_LEN + 1)).is_err());
        assert!(Caller::new("a\nb").is_err());
        let (a, b) = (
            Caller::new("alice").expect("ok"),
            Caller::new("bob").expect("ok"),
        );
        assert_eq!(a.digest().len(), 64);
        assert_ne!(a.digest(), b.digest());
    }
}
