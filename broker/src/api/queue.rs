//! Queue administration routes (SPEC (ext) §3.8): pause and resume consumes, purge a topic's
//! backlog, seek its frontier. Each needs the topic's owner or an admin (`manage`).

use narad_api::{ErrorBody, Redriven, TopicRecord};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use narad_api::{Repositioned, SeekRequest};
use narad_meta::{MetaCommand, TopicPatch};

use super::topics::record;
use super::{find_topic, json, managed_topic, read_json, AppState, Name, Query};
use crate::delivery::dead_letter::{DEFAULT_REDRIVE, MAX_REDRIVE};
use crate::error::{ApiError, ApiResult};
use crate::partition::Position;
use crate::security::{audit, authz, Caller};

/// (ext) Pause consumes (they answer `204` without leasing); produce, replay and children go on. Needs the topic's owner or an admin.
///
/// `POST /v1/topics/{t}/pause`: consumes answer `204` until resumed.
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/pause",
    tag = "queue",
    operation_id = "pauseTopic",
    params(super::openapi::TopicPath),
    responses(
        (status = 200, description = "The topic record, `paused` set.", body = TopicRecord),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, response = super::openapi::TopicNotFound),
    ),
)]
pub async fn pause(State(app): State<AppState>, caller: Caller, name: Name) -> ApiResult<Response> {
    set_paused(app, caller, name, true).await
}

/// (ext) Resume consumes.
///
/// `POST /v1/topics/{t}/resume`.
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/resume",
    tag = "queue",
    operation_id = "resumeTopic",
    params(super::openapi::TopicPath),
    responses(
        (status = 200, description = "The topic record.", body = TopicRecord),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, response = super::openapi::TopicNotFound),
    ),
)]
pub async fn resume(
    State(app): State<AppState>,
    caller: Caller,
    name: Name,
) -> ApiResult<Response> {
    set_paused(app, caller, name, false).await
}

async fn set_paused(
    app: AppState,
    caller: Caller,
    Name(name): Name,
    paused: bool,
) -> ApiResult<Response> {
    authz::manage(&caller, &name, find_topic(&app, &name).await.as_deref())?;
    let patch = TopicPatch {
        paused: Some(paused),
        ..Default::default()
    };
    let updated = app
        .propose_topic(MetaCommand::AlterTopic {
            name: name.clone(),
            patch,
        })
        .await?;
    app.apply_topics()?;
    app.queries.await_members_applied(&updated).await;
    audit::event(
        if paused {
            "topic.pause"
        } else {
            "topic.resume"
        },
        caller.actor(),
        &name,
    );
    Ok(json(StatusCode::OK, &record(&app.meta.view(), &updated)))
}

/// (ext) Purge the backlog: every partition's frontier jumps to its high watermark.
///
/// `POST /v1/topics/{t}/purge`: every partition's frontier jumps to its high watermark.
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/purge",
    tag = "queue",
    operation_id = "purgeTopic",
    params(super::openapi::TopicPath),
    responses(
        (status = 200, description = "Each partition's frontier before and after.", body = Repositioned),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, response = super::openapi::TopicNotFound),
    ),
)]
pub async fn purge(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
) -> ApiResult<Response> {
    let topic = managed_topic(&app, &caller, &name).await?;
    let all: Vec<u32> = (0..topic.config.partitions).collect();
    let partitions = app.delivery.reposition(&topic, &all, Position::End).await?;
    audit::event("topic.purge", caller.actor(), &name);
    Ok(json(
        StatusCode::OK,
        &Repositioned {
            topic: name,
            partitions,
        },
    ))
}

/// (ext) Move the queue frontier of one partition to an offset, or of one or every partition to a time.
///
/// `POST /v1/topics/{t}/seek` with `{"partition":p,"offset":o}` or `{"timestamp":s}` (one
/// partition with `partition`, else all).
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/seek",
    tag = "queue",
    operation_id = "seekTopic",
    params(super::openapi::TopicPath),
    request_body = SeekRequest,
    responses(
        (status = 200, description = "Each partition's frontier before and after.", body = Repositioned),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, response = super::openapi::TopicNotFound),
    ),
)]
pub async fn seek(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let topic = managed_topic(&app, &caller, &name).await?;
    let req: SeekRequest = read_json(&headers, body).await?;
    let (partitions, to) = seek_target(&req, topic.config.partitions)?;
    let partitions = app.delivery.reposition(&topic, &partitions, to).await?;
    audit::event("topic.seek", caller.actor(), &name);
    Ok(json(
        StatusCode::OK,
        &Repositioned {
            topic: name,
            partitions,
        },
    ))
}

/// (ext) Move messages of a dead-letter topic to `to`, or each back to the topic it was
/// dead-lettered from. Needs `consume` on this topic and `produce` on each target.
///
/// `POST /v1/topics/{t}/redrive?to=<topic>&max=N` (SPEC (ext) §3.9): moves up to `max`
/// (default 1000, at most 100000) messages of dead-letter topic `t` to `to`, or each back to
/// the topic it was dead-lettered from. Needs `consume` on `t` and `produce` on each target.
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/redrive",
    tag = "queue",
    operation_id = "redriveTopic",
    params(
        super::openapi::TopicPath,
        ("to" = Option<String>, Query, description = "The target topic (absent: where each came from)."),
        ("max" = Option<u32>, Query, description = "At most this many (default 1000, at most 100000)."),
    ),
    responses(
        (status = 200, description = "How many were moved, and where.", body = Redriven),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, description = "The topic or the target does not exist.", body = ErrorBody),
    ),
)]
pub async fn redrive(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let from = super::consume::consume_target(&app, &caller, &name).await?;
    let q = Query::parse(q.as_deref());
    let max = match q.uint("max")? {
        None => DEFAULT_REDRIVE,
        Some(m) if (1..=MAX_REDRIVE).contains(&m) => m,
        Some(m) => {
            return Err(ApiError::bad_request(format!(
                "max must be 1 to {MAX_REDRIVE}, got {m}"
            )))
        }
    };
    let view = app.meta.view();
    let target = |t: &str| -> ApiResult<Arc<narad_meta::Topic>> {
        let topic = view.topics.get(t).cloned();
        authz::produce(&caller, t, topic.as_deref())?;
        if t == name {
            return Err(ApiError::bad_request(format!(
                "cannot redrive topic {t} into itself"
            )));
        }
        topic.ok_or_else(|| ApiError::topic_not_found(t))
    };
    let to = q.text("to")?.map(&target).transpose()?;
    let done = app
        .delivery
        .redrive(&from, to.as_ref(), max, target)
        .await?;
    audit::event("topic.redrive", caller.actor(), &name);
    Ok(json(StatusCode::OK, &done))
}

/// The partitions and the position a seek asks for (`400` for a malformed one).
fn seek_target(req: &SeekRequest, count: u32) -> ApiResult<(Vec<u32>, Position)> {
    let partitions = match req.partition {
        Some(p) if p >= count => {
            return Err(ApiError::bad_request(format!(
                "partition {p} out of range: the topic has {count} partitions"
            )))
        }
        Some(p) => vec![p],
        None => (0..count).collect(),
    };
    let to = match (req.offset, req.timestamp) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "give either offset or timestamp, not both",
            ))
        }
        (Some(_), None) if req.partition.is_none() => {
            return Err(ApiError::bad_request(
                "a seek to an offset needs the partition it is in",
            ))
        }
        (Some(o), None) => Position::Offset(o),
        (None, Some(s)) => Position::TimestampMs(s.saturating_mul(1000)),
        (None, None) => {
            return Err(ApiError::bad_request(
                "give offset (with partition) or timestamp",
            ))
        }
    };
    Ok((partitions, to))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn req(partition: Option<u32>, offset: Option<u64>, timestamp: Option<u64>) -> SeekRequest {
        SeekRequest {
            partition,
            offset,
            timestamp,
        }
    }

    #[test]
    fn seek_targets() {
        assert_eq!(
            seek_target(&req(Some(1), Some(7), None), 4).unwrap(),
            (vec![1], Position::Offset(7))
        );
        assert_eq!(
            seek_target(&req(None, None, Some(5)), 3).unwrap(),
            (vec![0, 1, 2], Position::TimestampMs(5000))
        );
        assert_eq!(
            seek_target(&req(Some(2), None, Some(5)), 3).unwrap(),
            (vec![2], Position::TimestampMs(5000))
        );
        for bad in [
            req(None, Some(1), None),
            req(Some(0), Some(1), Some(1)),
            req(Some(0), None, None),
            req(Some(3), Some(1), None),
        ] {
            let e = seek_target(&bad, 3).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn prop_seek_body_is_parsed_or_refused_with_400(body in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(r) = serde_json::from_slice::<SeekRequest>(&body) {
                if let Ok((ps, to)) = seek_target(&r, 4) {
                    prop_assert!(!ps.is_empty() && ps.iter().all(|p| *p < 4));
                    prop_assert!(matches!(to, Position::Offset(_) | Position::TimestampMs(_)));
                }
            }
        }

        #[test]
        fn prop_seek_fields(p in proptest::option::of(0u32..8), o in proptest::option::of(any::<u64>()),
                            t in proptest::option::of(any::<u64>())) {
            match seek_target(&req(p, o, t), 4) {
                Ok((ps, Position::Offset(off))) => {
                    prop_assert_eq!(Some(off), o);
                    prop_assert_eq!(ps, vec![p.unwrap()]);
                }
                Ok((ps, Position::TimestampMs(ms))) => {
                    prop_assert_eq!(ms, t.unwrap().saturating_mul(1000));
                    prop_assert_eq!(ps.len(), if p.is_some() { 1 } else { 4 });
                }
                Ok((_, Position::End)) => prop_assert!(false, "a seek never asks for the end"),
                Err(e) => {
                    prop_assert_eq!(e.status(), StatusCode::BAD_REQUEST);
                    prop_assert!(p.is_some_and(|p| p >= 4) || o.is_some() == t.is_some()
                        || (o.is_some() && p.is_none()));
                }
            }
        }
    }
}
