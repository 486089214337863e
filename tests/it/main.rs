//! The end-to-end test binary (one binary, modules per area).

mod cli;
mod crash;
mod scenarios;
mod sensor;
