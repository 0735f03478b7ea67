//! Local wiring.
