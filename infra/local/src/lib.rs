//! The kit: what runs sas outside AWS and tests it, never deployed. The local runner
//! (`sas-local`), the black-box tests, the chaos harness and the bench build on it.

pub mod auth;
pub mod files;
pub mod guard;
pub mod intercept;
pub mod lag;
pub mod provision;
pub mod showcase;
pub mod simulated;
pub mod sqlite;
pub mod system;

pub use system::*;
