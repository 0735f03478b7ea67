//! AWS adapters.
