//! The black-box suites, each a module of this one test binary (`cargo test -p sas-blackbox
//! --test blackbox -- recovery::` runs one). A test binary links the whole SDK, so one binary
//! rather than one per suite keeps a build's disk and link time small. The suites that time
//! what they do or load the machine (chaos, memory, restart, at_scale, console, loan_services)
//! keep a binary each, so that they run alone as they always have.

mod answers;
mod api_document;
mod auth;
mod contract;
mod distributed;
mod doc_commands;
mod docs;
mod events;
mod flow;
mod for_each;
#[path = "fuzz/main.rs"]
mod fuzz;
mod iam;
mod inputs;
mod large_payloads;
mod limits;
mod local;
mod payloads;
mod priority;
mod recovery;
mod search_keys;
mod services;
mod sub_workflows;
mod template;
mod waits;
mod workflows;
