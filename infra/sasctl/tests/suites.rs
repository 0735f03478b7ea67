//! `sasctl`'s suites, each a module of this one test binary (`cargo test -p sasctl --test
//! suites -- signing::` runs one).

mod console_paths;
mod service_check;
mod service_contract_doc;
mod signing;
