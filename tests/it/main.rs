//! The end-to-end test binary (one binary, modules per area).

// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used)]

mod admin;
mod authoring;
mod cli;
mod crash;
mod evolve;
mod hotload;
mod initial_state;
mod integrity;
mod kafka;
mod keyed;
mod languages;
mod sandbox;
mod scenarios;
mod sensor;
mod sessions;
mod state_view;
mod ttl;
