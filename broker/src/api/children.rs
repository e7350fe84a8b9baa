//! Child topic routes (SPEC §3.7): attach, list with lag, detach. The rules of §5.1 live in
//! the metadata state machine (`AttachChild`, `DetachChild`), so every node refuses the same;
//! these handlers parse, authorise, propose, and then bring the local fan-out cursors in
//! line before answering (an attach copies everything committed after its answer; a detach
//! copies nothing after its answer).

use axum::body::Body;
use axum::extract::{FromRequestParts, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_api::{AttachChildRequest, ChildInfo, ChildList};
use narad_meta::{MetaCommand, MetaResponse, MAX_FANOUT_DELAY_MS};

use super::topics::record;
use super::{find_topic, json, read_json, AppState, Name};
use crate::error::{ApiError, ApiResult};
use crate::security::{audit, authz, Caller};

/// `delay_ms` / `fanout_delay_ms`: 0 (none) to one year (`400` outside).
pub fn check_delay(field: &str, v: u64) -> ApiResult<u64> {
    if v > MAX_FANOUT_DELAY_MS {
        return Err(ApiError::bad_request(format!(
            "{field} must be between 0 and {MAX_FANOUT_DELAY_MS} (one year)"
        )));
    }
    Ok(v)
}

pub async fn attach(
    State(node): State<AppState>,
    caller: Caller,
    Name(parent): Name,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let req: AttachChildRequest = read_json(&headers, body).await?;
    if req.child.is_empty() {
        return Err(ApiError::bad_request("child is required"));
    }
    let delay = match req.delay_ms {
        Some(d) if d < 0 => return Err(ApiError::bad_request("delay_ms must not be negative")),
        Some(d) => check_delay("delay_ms", d as u64)?,
        None => 0,
    };
    if req.remote.is_some() {
        if req.delay_ms.is_some() {
            return Err(ApiError::bad_request(
                "delay_ms cannot be combined with remote: remote children have no delay",
            ));
        }
        authz::attach(
            &caller,
            &parent,
            find_topic(&node, &parent).await.as_deref(),
            authz::ChildRef::Remote,
        )?;
        return Err(ApiError::bad_request(
            "remote children are not supported by this node yet",
        ));
    }
    authz::attach(
        &caller,
        &parent,
        find_topic(&node, &parent).await.as_deref(),
        authz::ChildRef::Local {
            name: &req.child,
            topic: find_topic(&node, &req.child).await.as_deref(),
        },
    )?;
    let topic = match node
        .propose(MetaCommand::AttachChild {
            parent: parent.clone(),
            child: req.child.clone(),
            delay_ms: delay,
            now_ms: crate::partition::now_ms(),
        })
        .await?
    {
        MetaResponse::Topic(t) => t,
        other => {
            return Err(ApiError::internal(format!(
                "unexpected metadata answer {other:?}"
            )))
        }
    };
    node.apply_topics()?;
    node.fanout.sync().await;
    audit::event(
        "topic.attach",
        caller.actor(),
        &format!("{parent}/{}", req.child),
    );
    let view = node.meta.view();
    let current = view.topics.get(&parent).cloned().unwrap_or(topic);
    Ok(json(StatusCode::OK, &record(&view, &current)))
}

pub async fn list(
    State(node): State<AppState>,
    caller: Caller,
    Name(parent): Name,
) -> ApiResult<Response> {
    let topic = find_topic(&node, &parent).await;
    authz::view(&caller, &parent, topic.as_deref())?;
    let topic = topic.ok_or_else(|| ApiError::topic_not_found(&parent))?;
    let view = node.meta.view();
    let lag = node.children_lag(&view, &topic).await;
    let children = view
        .children_of(&parent)
        .into_iter()
        .map(|l| {
            let (lag_messages, lag_complete) = lag.get(&l.child).copied().unwrap_or((0, false));
            ChildInfo {
                name: l.child.clone(),
                delay_ms: l.delay_ms,
                lag_messages,
                lag_complete,
                kind: l.kind().to_string(),
                ..Default::default()
            }
        })
        .collect();
    Ok(json(StatusCode::OK, &ChildList { parent, children }))
}

/// The `{topic}` and `{child}` segments of the detach route.
pub struct ParentChild(pub String, pub String);

impl<S: Send + Sync> FromRequestParts<S> for ParentChild {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<(String, String)>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path((p, c))) => Ok(ParentChild(p, c)),
            Err(e) => Err(ApiError::bad_request(format!("invalid path: {e}"))),
        }
    }
}

pub async fn detach(
    State(node): State<AppState>,
    caller: Caller,
    ParentChild(parent, child): ParentChild,
) -> ApiResult<Response> {
    authz::manage(
        &caller,
        &parent,
        find_topic(&node, &parent).await.as_deref(),
    )?;
    node.propose(MetaCommand::DetachChild {
        parent: parent.clone(),
        child: child.clone(),
    })
    .await?;
    node.fanout.sync().await;
    audit::event("topic.detach", caller.actor(), &format!("{parent}/{child}"));
    Ok(StatusCode::NO_CONTENT.into_response())
}
