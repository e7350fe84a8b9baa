//! Consume, replay and settle routes (SPEC §3.5, §3.6): parameters in, answers out; the
//! work is `delivery`'s.

use super::openapi::ConsumeAnswer;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_api::{BatchAckRequest, BatchAckResponse, ErrorBody};
use narad_meta::Topic;
use std::sync::Arc;

use super::{find_topic, json, json_response, parse_json, read_body, AppState, Name, Query};
use crate::app::App;
use crate::delivery::{ConsumeAsk, SettleKind, MAX_BATCH};
use crate::error::{ApiError, ApiResult};
use crate::security::{authz, Caller};

/// The topic of a consume, replay, ack, extend or nack: the `consume` grant (`403`, whether
/// or not it exists), then existence (`404`).
pub(super) async fn consume_target(
    app: &App,
    caller: &Caller,
    name: &str,
) -> ApiResult<Arc<Topic>> {
    let topic = find_topic(app, name).await;
    authz::consume(caller, name, topic.as_deref())?;
    topic.ok_or_else(|| ApiError::topic_not_found(name))
}

/// `200` with a rendered answer, `204` without one.
fn answer(found: Option<Vec<u8>>) -> Response {
    match found {
        Some(body) => json_response(StatusCode::OK, body),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// Consume: lease a message (queue consume), up to `max` of them, or replay one at
/// `offset` without a lease.
///
/// A queue consume tries this node's partitions, then live remote owners, then long-polls
/// up to `wait`.
#[utoipa::path(
    get,
    path = "/v1/topics/{topic}/consume",
    tag = "messages",
    operation_id = "consume",
    params(
        super::openapi::TopicPath,
        ("wait" = Option<String>, Query, description = "Long-poll up to this duration (default 0; capped at `http.max_consume_wait`, 10 s)."),
        ("partition" = Option<u32>, Query, description = "Only this partition (needed with `offset`)."),
        ("offset" = Option<u64>, Query, description = "Replay the record at this offset (no lease, no receipt handle)."),
        ("max" = Option<u32>, Query, description = "(ext) Lease up to this many (1-100), answered as `{\"messages\":[…]}`."),
    ),
    responses(
        (status = 200, description = "A message (or, with `max`, a batch of them).", body = ConsumeAnswer),
        (status = 204, description = "Nothing within `wait`, every partition capped or paused, or replay at or past the high watermark."),
        (status = 400, description = "Bad `wait`, `partition`, `offset` or `max`; `offset` without `partition`; `max` with `offset`.", body = ErrorBody),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, response = super::openapi::TopicNotFound),
        (status = 410, description = "The replay offset is gone (retention).", body = ErrorBody),
    ),
)]
pub async fn consume(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let topic = consume_target(&app, &caller, &name).await?;
    let q = Query::parse(q.as_deref());
    let partition = q.partition(topic.config.partitions)?;
    let offset = q.text("offset")?;
    let max = parse_max(q.text("max")?)?;
    let wait = parse_wait(q.text("wait")?, app.config.http.max_consume_wait)?;
    if let Some(o) = offset {
        let offset = parse_offset(o)?;
        let Some(partition) = partition else {
            return Err(ApiError::bad_request("offset needs partition"));
        };
        if max.is_some() {
            return Err(ApiError::bad_request("max cannot be combined with offset"));
        }
        return Ok(answer(
            app.delivery.replay(&topic, partition, offset).await?,
        ));
    }
    let quota = in_flight_quota(&caller);
    let max = match quota {
        Some((user, limit)) => {
            let room = lease_room(&app, user, limit)?;
            max.map(|m| m.min(room.min(MAX_BATCH) as u32))
        }
        None => max,
    };
    let ask = ConsumeAsk {
        partition,
        max,
        wait,
    };
    let found = app.delivery.consume(&topic, ask).await?;
    if let (Some((user, _)), Some(body)) = (quota, &found) {
        let deadline = lease_end(topic.config.visibility_timeout_ms);
        app.lease_counts
            .took(user, receipt_handles(body).map(|h| (h, deadline)));
    }
    Ok(answer(found))
}

/// (ext) The caller's `consume_in_flight` quota: its name and the cluster-wide limit.
fn in_flight_quota(caller: &Caller) -> Option<(&str, u64)> {
    let p = caller.principal()?;
    Some((p.username.as_str(), p.quotas.consume_in_flight?))
}

/// How many more leases `user` may take through this node under `limit`; `429` with
/// `Retry-After` (until its first lease ends) when none.
fn lease_room(app: &App, user: &str, limit: u64) -> ApiResult<u64> {
    let live = app.meta.view().live_members().len();
    app.lease_counts
        .room(user, limit, live, Instant::now())
        .map_err(|wait| {
            ApiError::throttled(
                format!(
                    "user {user} holds as many unsettled messages as its consume_in_flight quota \
                     allows (this node's share of {limit} over {live} live members); settle some, \
                     or retry in {} ms",
                    wait.as_millis().max(1)
                ),
                wait.as_secs_f64().ceil().max(1.0) as u64,
            )
        })
}

/// The receipt handles of a rendered consume answer (one message or a batch).
fn receipt_handles(body: &[u8]) -> impl Iterator<Item = String> {
    #[derive(serde::Deserialize)]
    struct Leased {
        receipt_handle: Option<String>,
    }
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Answer {
        Batch { messages: Vec<Leased> },
        One(Leased),
    }
    let leased = match serde_json::from_slice::<Answer>(body) {
        Ok(Answer::Batch { messages }) => messages,
        Ok(Answer::One(m)) => vec![m],
        Err(_) => Vec::new(),
    };
    leased.into_iter().filter_map(|m| m.receipt_handle)
}

/// (ext) What a settle by `user` of `handle` through this node does to its lease count.
fn count_settle(app: &App, user: &str, topic: &Topic, handle: &str, how: SettleKind) {
    let deadline = match how {
        SettleKind::Extend => Some(lease_end(topic.config.visibility_timeout_ms)),
        SettleKind::ExtendFor(ms) => Some(lease_end(ms)),
        SettleKind::Ack | SettleKind::Nack | SettleKind::Delay(_) | SettleKind::Release => None,
    };
    app.lease_counts.settled(user, handle, deadline);
}

/// When a lease of `visibility_ms` taken or extended now ends.
fn lease_end(visibility_ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(visibility_ms)
}

/// `max`: a batch of 1 to [`MAX_BATCH`] messages; absent, one message (unbatched body).
fn parse_max(v: Option<&str>) -> ApiResult<Option<u32>> {
    match v {
        None => Ok(None),
        Some(s) => match s.parse::<u64>() {
            Ok(m) if (1..=MAX_BATCH).contains(&m) => Ok(Some(m as u32)),
            _ => Err(ApiError::bad_request(format!(
                "max must be an integer from 1 to {MAX_BATCH}, got {s:?}"
            ))),
        },
    }
}

/// `wait`: a Go duration (absent, empty or negative: no wait), at most `cap`.
fn parse_wait(v: Option<&str>, cap: Duration) -> ApiResult<Duration> {
    let wait = match v {
        None | Some("") => Duration::ZERO,
        Some(s) => narad_api::duration::parse_go_duration_nonnegative(s)
            .map_err(|e| ApiError::bad_request(format!("invalid wait {s:?}: {e}")))?,
    };
    Ok(wait.min(cap))
}

/// `offset` of a replay.
fn parse_offset(o: &str) -> ApiResult<u64> {
    o.parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!("offset must be a non-negative integer, got {o:?}"))
    })
}

fn parse_extend(v: Option<&str>) -> ApiResult<SettleKind> {
    match v {
        None | Some("") | Some("false") => Ok(SettleKind::Ack),
        Some("true") | Some("1") => Ok(SettleKind::Extend),
        Some("0") => Ok(SettleKind::Nack),
        Some(other) => Err(ApiError::bad_request(format!(
            "extend must be true, 1, 0 or false, got {other:?}"
        ))),
    }
}

/// Longest `delay` and `visibility` of a settle: 12 hours.
pub const MAX_SETTLE_DURATION: Duration = Duration::from_secs(12 * 3600);

/// The settle an ack request asks for: `extend` (SPEC §3.6), with (ext) `delay` only beside
/// `extend=0` (a nack delivered again no earlier than that: 0 to 12 h, 0 = a plain nack) and
/// `visibility` only beside `extend=true` (the lease restarts with that timeout instead of
/// the topic's: 1 s to 12 h).
fn parse_settle(
    extend: Option<&str>,
    delay: Option<&str>,
    visibility: Option<&str>,
) -> ApiResult<SettleKind> {
    let how = parse_extend(extend)?;
    let duration = |name: &str, v: &str| {
        narad_api::duration::parse_go_duration_nonnegative(v)
            .map_err(|e| ApiError::bad_request(format!("invalid {name} {v:?}: {e}")))
            .and_then(|d| {
                if d > MAX_SETTLE_DURATION {
                    Err(ApiError::bad_request(format!(
                        "{name} {v:?} is longer than 12h"
                    )))
                } else {
                    Ok(d)
                }
            })
    };
    match (how, delay, visibility) {
        (_, Some(_), Some(_)) => Err(ApiError::bad_request(
            "give delay (with extend=0) or visibility (with extend=true), not both",
        )),
        (SettleKind::Nack, Some(d), None) => match duration("delay", d)? {
            Duration::ZERO => Ok(SettleKind::Nack),
            d => Ok(SettleKind::Delay(d.as_millis() as u64)),
        },
        (_, Some(_), None) => Err(ApiError::bad_request(
            "delay goes only with extend=0 (a nack)",
        )),
        (SettleKind::Extend, None, Some(v)) => match duration("visibility", v)? {
            d if d < Duration::from_secs(1) => Err(ApiError::bad_request(format!(
                "visibility {v:?} is shorter than 1s"
            ))),
            d => Ok(SettleKind::ExtendFor(d.as_millis() as u64)),
        },
        (_, None, Some(_)) => Err(ApiError::bad_request(
            "visibility goes only with extend=true",
        )),
        (how, None, None) => Ok(how),
    }
}

/// Ack, extend or nack a lease by its receipt handle; without `receipt_handle`, (ext) a
/// batch of handles in the body.
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/ack",
    tag = "messages",
    operation_id = "ack",
    params(
        super::openapi::TopicPath,
        ("receipt_handle" = Option<String>, Query, description = "The lease to settle (absent: the batch form)."),
        ("extend" = Option<String>, Query, description = "Absent, empty or `false`: ack; `true` or `1`: extend; `0`: nack."),
        ("delay" = Option<String>, Query, description = "(ext) With `extend=0`: deliver again no earlier than this (up to 12 h)."),
        ("visibility" = Option<String>, Query, description = "(ext) With `extend=true`: the lease restarts with this timeout (1 s to 12 h)."),
    ),
    request_body(content = Option<BatchAckRequest>, description = "(ext) The batch form: 1 to 100 receipt handles."),
    responses(
        (status = 200, description = "(ext) Batch form: one result per handle, in order.", body = BatchAckResponse),
        (status = 204, description = "Settled."),
        (status = 400, description = "Missing, empty or malformed handle; bad `extend`, `delay` or `visibility`.", body = ErrorBody),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, response = super::openapi::TopicNotFound),
        (status = 410, description = "The lease expired, was superseded or settled, or the handle is another topic's: expect a duplicate.", body = ErrorBody),
        (status = 413, response = super::openapi::TooLarge),
    ),
)]
pub async fn ack(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let topic = consume_target(&app, &caller, &name).await?;
    let q = Query::parse(q.as_deref());
    let how = parse_settle(q.text("extend")?, q.text("delay")?, q.text("visibility")?)?;
    let quota = in_flight_quota(&caller);
    if let Some(handle) = q.text("receipt_handle")? {
        app.delivery.settle(&topic, handle, how).await?;
        if let Some((user, _)) = quota {
            count_settle(&app, user, &topic, handle, how);
        }
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let body = read_body(&headers, body).await?;
    if body.is_empty() {
        return Err(ApiError::bad_request("receipt_handle required"));
    }
    let req: BatchAckRequest = parse_json(&body)?;
    if req.receipt_handles.is_empty() || req.receipt_handles.len() as u64 > MAX_BATCH {
        return Err(ApiError::bad_request(format!(
            "receipt_handles holds 1 to {MAX_BATCH} handles, got {}",
            req.receipt_handles.len()
        )));
    }
    let results = app
        .delivery
        .settle_batch(&topic, &req.receipt_handles, how)
        .await;
    if let Some((user, _)) = quota {
        for (h, r) in req.receipt_handles.iter().zip(&results) {
            if r.status == 204 {
                count_settle(&app, user, &topic, h, how);
            }
        }
    }
    Ok(json(StatusCode::OK, &BatchAckResponse { results }))
}

#[cfg(test)]
mod prop_tests {
    use super::*;
    use narad_api::duration::{format_go_duration, parse_go_duration_signed};
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[+-]?[0-9]{0,22}",
            "[0-9:+-]{0,30}",
            "(true|false|0|1|TRUE|True| true|)",
        ]
    }

    proptest! {
        #[test]
        fn prop_extend_accepts_only_its_five_forms(v in proptest::option::of(text())) {
            let want = match v.as_deref() {
                None | Some("") | Some("false") => Some(SettleKind::Ack),
                Some("true") | Some("1") => Some(SettleKind::Extend),
                Some("0") => Some(SettleKind::Nack),
                Some(_) => None,
            };
            prop_assert_eq!(parse_extend(v.as_deref()).ok(), want);
        }

        #[test]
        fn prop_settle_parameters(
            extend in proptest::option::of(text()),
            delay in proptest::option::of(prop_oneof![text(), "[0-9]{1,6}(ms|s|m|h)"]),
            visibility in proptest::option::of(prop_oneof![text(), "[0-9]{1,6}(ms|s|m|h)"]),
        ) {
            let plain = parse_extend(extend.as_deref());
            let dur = |v: &str| {
                parse_go_duration_signed(v)
                    .ok()
                    .map(|d| Duration::from_nanos(d.max(0) as u64))
            };
            match parse_settle(extend.as_deref(), delay.as_deref(), visibility.as_deref()) {
                Ok(SettleKind::Delay(ms)) => {
                    prop_assert_eq!(plain.ok(), Some(SettleKind::Nack));
                    let d = dur(delay.as_deref().unwrap()).unwrap();
                    prop_assert!(d > Duration::ZERO && d <= MAX_SETTLE_DURATION);
                    prop_assert_eq!(ms, d.as_millis() as u64);
                }
                Ok(SettleKind::ExtendFor(ms)) => {
                    prop_assert_eq!(plain.ok(), Some(SettleKind::Extend));
                    prop_assert!((1000..=MAX_SETTLE_DURATION.as_millis() as u64).contains(&ms));
                }
                Ok(how) => {
                    prop_assert_eq!(Some(how), plain.ok());
                    prop_assert!(visibility.is_none());
                    prop_assert!(delay.is_none() || (how == SettleKind::Nack
                        && dur(delay.as_deref().unwrap()) == Some(Duration::ZERO)));
                }
                Err(e) => prop_assert_eq!(e.status(), StatusCode::BAD_REQUEST),
            }
        }

        #[test]
        fn prop_max_is_one_to_max_batch(v in proptest::option::of(prop_oneof![
            text(),
            (0..=MAX_BATCH + 2).prop_map(|n| n.to_string()),
        ])) {
            match (parse_max(v.as_deref()), v.as_deref()) {
                (Ok(None), None) => {}
                (Ok(Some(m)), Some(s)) => {
                    prop_assert_eq!(s.parse::<u64>().ok(), Some(m as u64));
                    prop_assert!((1..=MAX_BATCH).contains(&(m as u64)));
                }
                (Err(e), Some(s)) => {
                    prop_assert_eq!(e.status(), StatusCode::BAD_REQUEST);
                    prop_assert!(s.parse::<u64>().map_or(true, |m| !(1..=MAX_BATCH).contains(&m)));
                }
                (r, v) => prop_assert!(false, "{:?} for {:?}", r, v),
            }
        }

        #[test]
        fn prop_offset_is_any_u64(o in prop_oneof![text(), any::<u64>().prop_map(|n| n.to_string())]) {
            prop_assert_eq!(parse_offset(&o).ok(), o.parse::<u64>().ok());
        }

        /// `wait` is the Go duration, negative as none, capped; anything unparsable is 400.
        #[test]
        fn prop_wait_is_a_capped_go_duration(
            v in prop_oneof![
                text(),
                "[-+]?[0-9]{0,20}(\\.[0-9]{0,3})?(ns|us|ms|s|m|h|d|)",
                any::<u64>().prop_map(|n| format_go_duration(Duration::from_nanos(n >> 1))),
            ],
            cap_ms in 0..120_000u64,
        ) {
            let cap = Duration::from_millis(cap_ms);
            match (parse_wait(Some(&v), cap), parse_go_duration_signed(&v)) {
                (Ok(w), _) if v.is_empty() => prop_assert_eq!(w, Duration::ZERO),
                (Ok(w), Ok(n)) => prop_assert_eq!(w, Duration::from_nanos(n.max(0) as u64).min(cap)),
                (Err(e), Err(_)) => prop_assert_eq!(e.status(), StatusCode::BAD_REQUEST),
                (r, p) => prop_assert!(false, "{:?} {:?} for {:?}", r, p, v),
            }
            prop_assert_eq!(parse_wait(None, cap).unwrap(), Duration::ZERO);
        }
    }
}
