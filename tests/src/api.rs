//! Narad-shaped helpers on [`Http`] and the consumed message [`Msg`].
//!
//! Helpers named after an operation return the raw [`Resp`] (for tests of status codes);
//! `*_ok` / `expect_*` variants assert the success status of SPEC §3.11 and return the data.
//! Produce is asynchronous to visibility (202 = in the WAL; consumable once committed to the
//! partition), so tests that need messages visible wait with [`Http::wait_visible`].

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use reqwest::Method;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::http::{Http, Resp};
use crate::util::pct;
use crate::wait::eventually;

/// How long tests wait for a produced message to become visible.
pub const VISIBLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Most bytes of one consume answer (SPEC §11).
pub const MAX_CONSUME_ANSWER: usize = 16 * 1024 * 1024;

/// `/v1/topics/<percent-encoded name>`.
pub fn topic_path(topic: &str) -> String {
    format!("/v1/topics/{}", pct(topic))
}

fn with_query(path: String, query: &str) -> String {
    if query.is_empty() {
        path
    } else {
        format!("{path}?{query}")
    }
}

impl Http {
    // ---- topics ----

    /// `POST /v1/topics` with `body`; expects `201` and returns the record.
    pub async fn create_topic(&self, body: &Value) -> Value {
        self.post_json("/v1/topics", body).await.expect_json(201)
    }

    /// Creates a topic with default settings; returns the record.
    pub async fn create_topic_named(&self, name: &str) -> Value {
        self.create_topic(&serde_json::json!({ "name": name }))
            .await
    }

    /// `GET /v1/topics/{topic}` (with `query`, e.g. `partition=1`); expects `200`.
    pub async fn get_topic(&self, topic: &str, query: &str) -> Value {
        self.get(with_query(topic_path(topic), query))
            .await
            .expect_json(200)
    }

    /// The topic's `backlog`: (messages waiting, messages in flight).
    pub async fn backlog(&self, topic: &str) -> (u64, u64) {
        let rec = self.get_topic(topic, "").await;
        let count = |field: &str| {
            rec["backlog"][field]
                .as_u64()
                .unwrap_or_else(|| panic!("GET {topic}: no backlog.{field}: {rec}"))
        };
        (count("messages"), count("in_flight"))
    }

    /// The topic's `partition_stats`, indexed by partition.
    pub async fn partition_stats(&self, topic: &str) -> Vec<Value> {
        let rec = self.get_topic(topic, "").await;
        rec["partition_stats"]
            .as_array()
            .unwrap_or_else(|| panic!("GET {topic}: no partition_stats array: {rec}"))
            .clone()
    }

    /// Each partition's `high_watermark`, by index.
    pub async fn high_watermarks(&self, topic: &str) -> anyhow::Result<BTreeMap<u64, u64>> {
        let r = self
            .request(Method::GET, topic_path(topic))
            .try_send()
            .await?;
        if r.status != 200 {
            bail!("{}", r.describe());
        }
        let v = r.json();
        let stats = v["partition_stats"]
            .as_array()
            .ok_or_else(|| anyhow!("no partition_stats: {v}"))?;
        stats
            .iter()
            .map(|s| {
                let i = s["index"]
                    .as_u64()
                    .ok_or_else(|| anyhow!("bad index in {s}"))?;
                let h = s["high_watermark"]
                    .as_u64()
                    .ok_or_else(|| anyhow!("bad high_watermark in {s}"))?;
                Ok((i, h))
            })
            .collect()
    }

    /// Waits until partition `partition`'s high watermark reaches `hwm`.
    pub async fn wait_visible(&self, topic: &str, partition: u64, hwm: u64) {
        eventually(VISIBLE_TIMEOUT, Duration::from_millis(20), || async {
            let h = self.high_watermarks(topic).await?;
            match h.get(&partition) {
                Some(&v) if v >= hwm => Ok(()),
                other => bail!("{topic}/{partition}: high_watermark {other:?}, waiting for {hwm}"),
            }
        })
        .await
    }

    /// Waits until the high watermarks of all partitions add up to at least `total`.
    pub async fn wait_total_visible(&self, topic: &str, total: u64) {
        eventually(VISIBLE_TIMEOUT, Duration::from_millis(20), || async {
            let h = self.high_watermarks(topic).await?;
            let sum: u64 = h.values().sum();
            if sum >= total {
                Ok(())
            } else {
                bail!("{topic}: high watermarks {h:?} sum to {sum}, waiting for {total}")
            }
        })
        .await
    }

    // ---- produce ----

    /// `POST …/produce?<query>` with `body` (as `application/octet-stream`, like the Go SDK).
    pub async fn produce(&self, topic: &str, query: &str, body: impl Into<Vec<u8>>) -> Resp {
        self.request(
            Method::POST,
            with_query(format!("{}/produce", topic_path(topic)), query),
        )
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
    }

    /// Produce expecting `202` with an empty body.
    pub async fn produce_ok(&self, topic: &str, query: &str, body: impl Into<Vec<u8>>) {
        let r = self.produce(topic, query, body).await;
        r.expect(202);
        assert!(
            r.body.is_empty(),
            "produce 202 must have an empty body: {}",
            r.describe()
        );
    }

    /// `POST …/produce/batch` with a JSON body.
    pub async fn produce_batch(&self, topic: &str, body: &Value) -> Resp {
        self.post_json(format!("{}/produce/batch", topic_path(topic)), body)
            .await
    }

    /// A batch of one `element` refused with `400` that names it (`message 0: …`); returns
    /// the error message.
    pub async fn batch_element_refused(&self, topic: &str, element: Value) -> String {
        let r = self
            .produce_batch(topic, &serde_json::json!({ "messages": [element] }))
            .await;
        let msg = r.expect_error(400);
        assert!(msg.starts_with("message 0: "), "{}", r.describe());
        msg
    }

    // ---- consume ----

    /// `GET …/consume?<query>`.
    pub async fn consume(&self, topic: &str, query: &str) -> Resp {
        self.get(with_query(format!("{}/consume", topic_path(topic)), query))
            .await
    }

    /// Consume expecting `200` with a single message.
    pub async fn consume_msg(&self, topic: &str, query: &str) -> Msg {
        let r = self.consume(topic, query).await;
        r.expect_json(200);
        Msg::parse(&r.body).unwrap_or_else(|e| panic!("{}: {e:#}", r.describe()))
    }

    /// Consume expecting `204` (nothing available) with an empty body.
    pub async fn consume_none(&self, topic: &str, query: &str) -> Resp {
        let r = self.consume(topic, query).await;
        r.expect(204);
        assert!(r.body.is_empty(), "204 must have no body: {}", r.describe());
        r
    }

    /// Batch consume (`max` in `query`) expecting `200 {"messages":[…]}`. Each message keeps
    /// the exact bytes of its payload.
    pub async fn consume_batch(&self, topic: &str, query: &str) -> Vec<Msg> {
        let r = self.consume(topic, query).await;
        self.consume_batch_of(&r)
    }

    /// The messages of a `200 {"messages":[…]}` answer, each with the exact bytes of its payload.
    pub fn consume_batch_of(&self, r: &Resp) -> Vec<Msg> {
        #[derive(serde::Deserialize)]
        struct Batch<'a> {
            #[serde(borrow)]
            messages: Vec<&'a RawValue>,
        }
        r.expect_json(200);
        let batch: Batch = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("{}: not {{\"messages\":[…]}}: {e}", r.describe()));
        batch
            .messages
            .iter()
            .map(|m| {
                Msg::parse(m.get().as_bytes()).unwrap_or_else(|e| panic!("{}: {e:#}", r.describe()))
            })
            .collect()
    }

    /// Consumes and acks until a consume answers `204`; returns what was consumed.
    /// `query` must make consume return at once when empty (e.g. `wait=0`, `partition=0`).
    pub async fn drain(&self, topic: &str, query: &str) -> Vec<Msg> {
        let mut out = Vec::new();
        loop {
            let r = self.consume(topic, query).await;
            match r.status {
                204 => return out,
                200 => {
                    let m =
                        Msg::parse(&r.body).unwrap_or_else(|e| panic!("{}: {e:#}", r.describe()));
                    self.ack_ok(topic, m.handle()).await;
                    out.push(m);
                }
                _ => panic!("drain: {}", r.describe()),
            }
        }
    }

    /// Empties `topic` with `max=100` consumes (plus `query`, which must make an empty consume
    /// answer at once), acking each batch. Every answer must be at most
    /// [`MAX_CONSUME_ANSWER`] bytes and hold at least one message; `in_flight` (when given)
    /// reads the topic's leased count after each answer, which must be exactly the batch:
    /// nothing leased that was not handed out. Returns the messages.
    pub async fn drain_batches<F, Fut>(&self, topic: &str, query: &str, in_flight: F) -> Vec<Msg>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = u64>,
    {
        let q = if query.is_empty() {
            "max=100".to_string()
        } else {
            format!("max=100&{query}")
        };
        let mut out: Vec<Msg> = Vec::new();
        loop {
            let r = self.consume(topic, &q).await;
            if r.status == 204 {
                return out;
            }
            assert!(
                r.body.len() <= MAX_CONSUME_ANSWER,
                "a consume answer of {} bytes",
                r.body.len()
            );
            let batch = self.consume_batch_of(&r);
            assert!(!batch.is_empty(), "an empty batch: {}", r.describe());
            assert_eq!(
                in_flight().await,
                batch.len() as u64,
                "leased beyond the answer"
            );
            let handles: Vec<&str> = batch.iter().map(Msg::handle).collect();
            self.ack_batch(topic, None, &handles).await.expect(200);
            out.extend(batch);
        }
    }

    // ---- ack / extend / nack ----

    /// `POST …/ack?receipt_handle=<h>[&extend=<e>]` with no body (Content-Type JSON, as the SDK).
    pub async fn ack(&self, topic: &str, handle: &str, extend: Option<&str>) -> Resp {
        let mut q = format!("receipt_handle={}", pct(handle));
        if let Some(e) = extend {
            q = format!("extend={}&{q}", pct(e));
        }
        self.ack_query(topic, &q).await
    }

    /// `POST …/ack?<query>` with no body.
    pub async fn ack_query(&self, topic: &str, query: &str) -> Resp {
        self.request(
            Method::POST,
            with_query(format!("{}/ack", topic_path(topic)), query),
        )
        .header("content-type", "application/json")
        .send()
        .await
    }

    /// Ack expecting `204`.
    pub async fn ack_ok(&self, topic: &str, handle: &str) {
        let r = self.ack(topic, handle, None).await;
        r.expect(204);
    }

    /// Batch form: `POST …/ack[?extend=<e>]` with `{"receipt_handles":[…]}`.
    pub async fn ack_batch(&self, topic: &str, extend: Option<&str>, handles: &[&str]) -> Resp {
        let q = extend
            .map(|e| format!("extend={}", pct(e)))
            .unwrap_or_default();
        self.post_json(
            with_query(format!("{}/ack", topic_path(topic)), &q),
            &serde_json::json!({ "receipt_handles": handles }),
        )
        .await
    }
}

/// One consumed (or replayed) message, as SPEC §3.5 renders it.
#[derive(Debug, Clone)]
pub struct Msg {
    pub topic: String,
    pub partition: u64,
    pub offset: u64,
    /// Unix seconds.
    pub timestamp: i64,
    pub receipt_handle: Option<String>,
    pub key: Option<String>,
    pub key_encoding: Option<String>,
    /// The exact JSON text of `payload` in the response.
    pub payload_raw: String,
    pub payload_encoding: Option<String>,
    /// The whole message object.
    pub json: Value,
}

#[derive(serde::Deserialize)]
struct WireMsg<'a> {
    #[serde(borrow)]
    payload: &'a RawValue,
}

impl Msg {
    pub fn parse(body: &[u8]) -> anyhow::Result<Msg> {
        let json: Value = serde_json::from_slice(body).context("message is not JSON")?;
        let wire: WireMsg = serde_json::from_slice(body).context("message has no payload")?;
        let str_field = |k: &str| -> anyhow::Result<Option<String>> {
            match json.get(k) {
                None => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(v) => bail!("field {k} is not a string: {v}"),
            }
        };
        let u64_field = |k: &str| -> anyhow::Result<u64> {
            json.get(k)
                .and_then(Value::as_u64)
                .ok_or_else(|| anyhow!("field {k} missing or not a non-negative integer"))
        };
        Ok(Msg {
            topic: str_field("topic")?.ok_or_else(|| anyhow!("field topic missing"))?,
            partition: u64_field("partition")?,
            offset: u64_field("offset")?,
            timestamp: json
                .get("timestamp")
                .and_then(Value::as_i64)
                .ok_or_else(|| anyhow!("field timestamp missing or not an integer"))?,
            receipt_handle: str_field("receipt_handle")?,
            key: str_field("key")?,
            key_encoding: str_field("key_encoding")?,
            payload_raw: wire.payload.get().to_string(),
            payload_encoding: str_field("payload_encoding")?,
            json,
        })
    }

    /// The receipt handle (panics if the message has none).
    pub fn handle(&self) -> &str {
        self.receipt_handle
            .as_deref()
            .unwrap_or_else(|| panic!("message has no receipt_handle: {}", self.json))
    }

    /// The stored payload bytes, undoing the rendering of SPEC §2.9. A JSON string payload
    /// is ambiguous (stored text vs. stored JSON string); it is returned as the text.
    pub fn payload_bytes(&self) -> Vec<u8> {
        let v: Value = serde_json::from_str(&self.payload_raw).expect("payload is JSON");
        match (&v, self.payload_encoding.as_deref()) {
            (Value::String(s), Some("base64")) => B64.decode(s).expect("payload base64"),
            (Value::String(s), None) => s.as_bytes().to_vec(),
            _ => self.payload_raw.as_bytes().to_vec(),
        }
    }

    /// `None` if the payload renders `produced` as SPEC §2.9 says: the JSON verbatim if the
    /// bytes are a JSON value; else a JSON string if UTF-8; else padded standard base64 with
    /// `"payload_encoding":"base64"`. Otherwise what is wrong.
    pub fn payload_problem(&self, produced: &[u8]) -> Option<String> {
        let is_json = serde_json::from_slice::<serde::de::IgnoredAny>(produced).is_ok();
        let enc = self.payload_encoding.as_deref();
        let (ok, want) = if is_json {
            (
                self.payload_raw.as_bytes() == produced && enc.is_none(),
                "the JSON verbatim".to_string(),
            )
        } else if let Ok(text) = std::str::from_utf8(produced) {
            let got: Option<Value> = serde_json::from_str(&self.payload_raw).ok();
            (
                got == Some(Value::String(text.into())) && enc.is_none(),
                format!("the JSON string {text:?}"),
            )
        } else {
            let got: Option<Value> = serde_json::from_str(&self.payload_raw).ok();
            (
                got == Some(Value::String(B64.encode(produced))) && enc == Some("base64"),
                format!(
                    "base64 {:?} with payload_encoding base64",
                    B64.encode(produced)
                ),
            )
        };
        (!ok).then(|| {
            format!(
                "payload of {:?} should be {want}; got payload {} payload_encoding {enc:?}",
                String::from_utf8_lossy(produced),
                self.payload_raw
            )
        })
    }

    /// `None` if the key renders `key` as SPEC §2.9 says (absent when `None`; UTF-8 as a
    /// string; other bytes as base64 with `"key_encoding":"base64"`).
    pub fn key_problem(&self, key: Option<&[u8]>) -> Option<String> {
        let got = (self.json.get("key"), self.json.get("key_encoding"));
        let ok = match key {
            None => got.0.is_none() && got.1.is_none(),
            Some(k) => match std::str::from_utf8(k) {
                Ok(s) => self.key.as_deref() == Some(s) && got.1.is_none(),
                Err(_) => {
                    self.key.as_deref() == Some(B64.encode(k).as_str())
                        && self.key_encoding.as_deref() == Some("base64")
                }
            },
        };
        (!ok).then(|| {
            format!(
                "key should render {key:?}; got key {:?} key_encoding {:?}",
                got.0, got.1
            )
        })
    }

    /// Splits the receipt handle into its documented server format `partition:offset:nonce`.
    pub fn handle_parts(&self) -> Option<(u64, u64, u64)> {
        let mut it = self.receipt_handle.as_deref()?.split(':');
        let p = it.next()?.parse().ok()?;
        let o = it.next()?.parse().ok()?;
        let n = it.next()?.parse().ok()?;
        it.next().is_none().then_some((p, o, n))
    }
}
