//! In-memory implementations of the ports: the zero-setup local mode and unit tests. They keep
//! the semantics of the AWS services they stand for (conditional writes, transactions,
//! visibility timeout and redelivery, delayed messages, redrive to a DLQ) and pass the same
//! contract tests as the AWS adapters.

mod events;
mod payloads;
mod queue;
mod store;

pub use events::MemoryEventBus;
pub use payloads::MemoryPayloads;
pub use queue::{FairShare, MemoryQueues, QueueConfig};
pub use store::MemoryStore;
