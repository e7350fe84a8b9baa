//! `narad-tests`: the black-box harness. Every test runs the real `narad` binary as a
//! child process and checks it against SPEC.md over plain HTTP, exactly as a client sees it.
//!
//! Module map (what each owns):
//! - [`auth_matrix`]: the authorization matrix (every route × every kind of caller, with the
//!   exact status), its users and topics, shared by the one-node and the cluster test.
//! - [`browser`]: a headless Chromium under chromedriver (WebDriver over HTTP) for the
//!   console tests: find, click, type, wait on the DOM, console log, screenshots; skipped
//!   where the browser is missing unless `NARAD_REQUIRE_CHROMIUM=1`.
//! - [`server`]: one `narad server start --dev` process (or a secured one,
//!   [`ServerOpts::secured`]) — binary lookup, port choice, temp data dir, log file,
//!   start/kill -9/SIGTERM/restart; printing the log tail on failure.
//! - [`http`]: a keep-alive HTTP client ([`Http`], with Basic credentials via
//!   [`Http::as_user`]) returning complete responses ([`Resp`]), with checks for the uniform
//!   error body (`{"error":"…"}`, SPEC §3.1).
//! - [`api`]: Narad-shaped helpers on [`Http`] (create topic, produce, consume, ack, stats)
//!   and the consumed message ([`Msg`]) with the rendering rules of SPEC §2.9.
//! - [`ledger`]: bookkeeping for durability runs — which ids got `202`, which are
//!   ambiguous, which were consumed (and intact); consumer loops and the final report.
//! - [`payload`]: unique self-checking payloads (id + CRC32C + deterministic filler).
//! - [`openapi`]: every answer [`Http`] gets, checked against `api/openapi.json` (declared
//!   status, body schema); the operations met so far.
//! - [`metrics`]: reading `/metrics` samples ([`metric_sum`], [`metric_sum_where`]).
//! - [`certs`]: test certificates (a CA and what it signs) as PEM files, for the TLS tests.
//! - [`cluster_port`]: a cluster-port client from the SPEC alone (frames, the HMAC handshake),
//!   to check what the port lets an outsider do.
//! - [`wait`]: [`eventually`], the only way tests wait for a condition.
//! - [`checks`]: [`Checks`], a soft-assert collector for validation tables, so one run
//!   reports every wrong answer instead of the first.
//! - [`util`]: FNV-1a-32 (SPEC §2.3), percent-encoding, seeded RNGs, clocks.
//!
//! Conventions: helpers that "expect" something panic with the full request and response;
//! `try_*` variants return errors for tests that must tolerate a dead server.

pub mod api;
pub mod auth_matrix;
pub mod browser;
pub mod certs;
pub mod checks;
pub mod cluster_port;
pub mod http;
pub mod ledger;
pub mod metrics;
pub mod openapi;
pub mod payload;
pub mod server;
pub mod util;
pub mod wait;

pub use api::{topic_path, Msg};
pub use checks::Checks;
pub use http::{basic_auth, Http, Resp};
pub use ledger::{Ledger, Report};
pub use metrics::{metric_sum, metric_sum_where, series};
pub use server::{narad_bin, Server, ServerOpts};
pub use util::{fnv1a32, now_ms, now_s, partition_for_key, pct, rss_bytes, test_rng};
pub use wait::{eventually, try_eventually};

pub use reqwest::Method;
pub use serde_json::{json, Value};
