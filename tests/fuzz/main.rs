//! Property tests of the HTTP API, black-box over `api::handle` on the in-memory system
//! (nothing started: only the handler writes). Arbitrary requests go in, one at a time and in
//! sequences: methods; paths with junk, UUIDs in every spelling and the ids of tasks made
//! earlier; submissions to both example workflows, to one the case may publish and to unknown
//! ones; definitions (`PUT /workflows/{name}`, `PUT /services/{name}`), valid and broken;
//! query strings, content types, idempotency keys, reply queue URLs; bodies of every shape
//! (arbitrary bytes and JSON, mutated inputs, huge bodies). For every answer:
//!
//! - it is a 2xx or a 4xx, never a 5xx, with a JSON object body and `Content-Type:
//!   application/json`; a 4xx carries `error.code` (one of the documented codes) and
//!   `error.message`; a 405 an `Allow`; the only 2xx are 200, 201 and 202;
//! - a 202 names a task (`taskId`); a new task is `Pending`, of the newest version of its
//!   workflow, stored with its input, and its work message is queued;
//! - nothing is written partially: every task has its state record and every record its task,
//!   the record count is the number of distinct tasks created, every record passes `check`, a
//!   201 adds exactly one version of one definition, and any other answer that is not a 202
//!   changes no record, no queue, no event and no definition;
//! - idempotency: a key with the same request (workflow, input up to whitespace and key order,
//!   reply queue) gets the same `taskId`, with a different request a 409;
//! - (the operator API, as an operator: every route the model knows is served there);
//! - the task API's authentication: arbitrary `Authorization` headers (bytes, junk tokens, the
//!   local issuer's JWTs live, expired, for another audience or signed by another key, SigV4
//!   signatures by each caller's key, a wrong secret, at a skew, mangled, over another path)
//!   through the local runner's SigV4 and JWT authorizers name exactly the caller whose valid
//!   credentials were sent; anything else is a 401 that writes nothing; an authenticated caller
//!   reads its own task and gets 404 for another's, also for a cancel;
//! - the exact routes answer as documented: the submission's checks in order (size, media type,
//!   key, reply queue, JSON, workflow, input schema, with every problem's `at` a JSON pointer
//!   into the input), `GET /tasks/{id}`, the operator's actions and list (with its `workflow`
//!   filter), and the definitions' routes (201 for a new version, 200 for the same, 400 with
//!   problems for an invalid one, 404 for an unknown name or version).
//!
//! One module per thing fuzzed; this file holds the shared setup.

mod auth;
mod definitions;
mod model;
mod operator;
mod oracle;
mod render;
mod requests;
mod sequences;
mod task_input;

use chrono::Utc;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sas::api::{self, MAX_BODY_BYTES, MAX_KEY_LEN};
use sas::domain::task::{MAX_INPUT_BYTES, ReplyQueues};
use sas::domain::workflow::{self, MAX_DEFINITION_BYTES, examples};
use sas::ports::{Kind, TaskStore};
use sas::{ProcessState, StateRecord, TaskId, Workflow};
use sas_blackbox::{ECOMMERCE, LOAN, memory_system};
use sas_local::{Settings, System};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use uuid::Uuid;

// Every module sees the others' items and the imports above (`use super::*`).
use definitions::*;
use model::*;
use operator::*;
use oracle::*;
use render::*;
use requests::*;
use sequences::*;
use task_input::*;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn config(cases: u32) -> Config {
    Config {
        cases,
        // No regression files: this test writes nothing next to the sources.
        failure_persistence: None,
        ..Config::default()
    }
}

async fn new_system() -> (System, Model) {
    let system = memory_system(Settings::default()).await;
    let model = Model::new(system.definitions.policy().clone());
    (system, model)
}
