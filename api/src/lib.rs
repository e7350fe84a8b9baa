//! Narad's HTTP API, shared by the `narad` CLI, the black-box tests and the operator:
//! - `types`: the `/v1` wire types (SPEC §3);
//! - `admin`: wire types of child topics, users and grants, cluster moves (SPEC §3.7–3.9);
//! - `duration`: Go-style duration strings (`1m30s`) and the CLI's `7d`;
//! - `render`: payload and key rendering (SPEC §2.9);
//! - `client`: an async client over reqwest;
//! - `error`: the client's errors (`http <code>: <message>`).
//! - `retry`: the SDK's retry policy (attempts, full-jitter backoff, Retry-After).

pub mod admin;
pub mod client;
pub mod duration;
pub mod error;
pub mod hosts;
pub mod render;
pub mod retry;
pub mod types;

pub use admin::*;
pub use client::{Client, Replay, Settle};
pub use error::{Error, HttpError};
pub use types::*;

#[cfg(test)]
mod client_tests;
