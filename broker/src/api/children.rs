//! Child topic routes (SPEC §3.7): attach, list with lag, detach. The rules of §5.1 live in
//! the metadata state machine (`AttachChild`, `DetachChild`), so every node refuses the same;
//! these handlers parse, authorise, propose, and then bring the local fan-out cursors in
//! line before answering (an attach copies everything committed after its answer; a detach
//! copies nothing after its answer).

use axum::body::Body;
use axum::extract::{FromRequestParts, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_api::{
    AttachChildRequest, ChildInfo, ChildList, ErrorBody, RemoteInfo, RemoteTarget, TopicRecord,
};
use narad_meta::{MetaCommand, RemoteEndpoint};

use super::topics::{check_delay, record, validate_name};
use super::{find_topic, json, read_json, AppState, Name};
use crate::children::hosts::HostRefused;
use crate::error::{ApiError, ApiResult};
use crate::security::{audit, authz, Caller};

/// Attach a child: a local topic (`child`, optional `delay_ms`) or (ext) a remote link
/// (`child` + `remote`).
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/children",
    tag = "children",
    operation_id = "attachChild",
    params(super::openapi::TopicPath),
    request_body = AttachChildRequest,
    responses(
        (status = 200, description = "The parent's record.", body = TopicRecord),
        (status = 400, description = "Missing child, delay < 0 or > 1 year, bad URL, `delay_ms` with `remote`.", body = ErrorBody),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, description = "The parent or the local child does not exist.", body = ErrorBody),
        (status = 409, description = "Already attached, a role conflict, too many children, parent retention below delay + 1 h, schema mismatch.", body = ErrorBody),
        (status = 413, response = super::openapi::TooLarge),
    ),
)]
pub async fn attach(
    State(app): State<AppState>,
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
    if let Some(remote) = req.remote {
        if req.delay_ms.is_some() {
            return Err(ApiError::bad_request(
                "delay_ms cannot be combined with remote: remote children have no delay",
            ));
        }
        let endpoint = remote_endpoint(&req.child, remote)?;
        authz::attach(
            &caller,
            &parent,
            find_topic(&app, &parent).await.as_deref(),
            authz::ChildRef::Remote,
        )?;
        let hosts = &app.config.fanout.remote_hosts;
        authz::attach_remote(&caller, hosts.is_configured())?;
        let host = crate::children::remote::url_host(&endpoint.url);
        match hosts.check(&host) {
            Ok(()) => {}
            Err(e @ HostRefused::Forbidden { .. }) => {
                return Err(ApiError::bad_request(e.to_string()))
            }
            Err(e @ HostRefused::NotAllowed(_)) => return Err(ApiError::forbidden(e.to_string())),
        }
        return attach_remote(app, caller, parent, req.child, endpoint).await;
    }
    authz::attach(
        &caller,
        &parent,
        find_topic(&app, &parent).await.as_deref(),
        authz::ChildRef::Local {
            name: &req.child,
            topic: find_topic(&app, &req.child).await.as_deref(),
        },
    )?;
    let topic = app
        .propose_topic(MetaCommand::AttachChild {
            parent: parent.clone(),
            child: req.child.clone(),
            delay_ms: delay,
            now_ms: crate::clock::now_ms(),
        })
        .await?;
    app.apply_topics()?;
    app.children.sync().await;
    app.queries.await_members_applied(&topic).await;
    audit::event(
        "topic.attach",
        caller.actor(),
        &format!("{parent}/{}", req.child),
    );
    let view = app.meta.view();
    let current = view.topics.get(&parent).cloned().unwrap_or(topic);
    Ok(json(StatusCode::OK, &record(&view, &current)))
}

/// Validates a remote link's target (`400`): the link name, an http(s) base URL without
/// credentials, the remote topic name (default: the link name), credentials, the CA bundle.
fn remote_endpoint(link: &str, r: RemoteTarget) -> ApiResult<RemoteEndpoint> {
    validate_name(link).map_err(|e| ApiError::bad_request(format!("child: {}", e.message)))?;
    let bad = |e: crate::children::remote::RemoteConfigError| ApiError::bad_request(e.to_string());
    let url = crate::children::remote::normalize_url(&r.url).map_err(bad)?;
    let topic = match r.topic {
        Some(t) if t.is_empty() => return Err(ApiError::bad_request("remote.topic is empty")),
        Some(t) => t,
        None => link.to_string(),
    };
    validate_name(&topic)
        .map_err(|e| ApiError::bad_request(format!("remote.topic: {}", e.message)))?;
    let username = r.username.filter(|u| !u.is_empty());
    if username.is_none() && r.password.as_deref().is_some_and(|p| !p.is_empty()) {
        return Err(ApiError::bad_request(
            "remote.password needs remote.username",
        ));
    }
    if let Some(u) = &username {
        if u.contains(':') || u.chars().any(char::is_control) {
            return Err(ApiError::bad_request(
                "remote.username must not contain ':' or control characters",
            ));
        }
    }
    if r.password
        .as_deref()
        .is_some_and(|p| p.chars().any(char::is_control))
    {
        return Err(ApiError::bad_request(
            "remote.password must not contain control characters",
        ));
    }
    let ca_pem = r.ca_pem.filter(|c| !c.trim().is_empty());
    if let Some(pem) = &ca_pem {
        crate::children::remote::parse_ca_pem(pem).map_err(bad)?;
    }
    Ok(RemoteEndpoint {
        url,
        topic,
        password: username.as_ref().and(r.password),
        username,
        ca_pem,
    })
}

/// `POST /v1/topics/{parent}/children` with `remote` (SPEC §5.5), after validation and
/// authorisation.
async fn attach_remote(
    app: AppState,
    caller: Caller,
    parent: String,
    link: String,
    mut endpoint: RemoteEndpoint,
) -> ApiResult<Response> {
    // Only the sealed form reaches the Raft log (`security::sealing`).
    if let (Some(key), Some(pw)) = (&app.credentials, &endpoint.password) {
        endpoint.password = Some(key.seal(&parent, &link, pw));
    }
    let topic = app
        .propose_topic(MetaCommand::AttachRemoteChild {
            parent: parent.clone(),
            link: link.clone(),
            endpoint,
            now_ms: crate::clock::now_ms(),
        })
        .await?;
    app.children.sync().await;
    audit::event("topic.attach", caller.actor(), &format!("{parent}/{link}"));
    let view = app.meta.view();
    let current = view.topics.get(&parent).cloned().unwrap_or(topic);
    Ok(json(StatusCode::OK, &record(&view, &current)))
}

/// List a topic's children with their lag (and, for remote links, their state).
#[utoipa::path(
    get,
    path = "/v1/topics/{topic}/children",
    tag = "children",
    operation_id = "listChildren",
    params(super::openapi::TopicPath),
    responses(
        (status = 200, description = "The children (`[]` when none); credentials are never returned.", body = ChildList),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, response = super::openapi::TopicNotFound),
    ),
)]
pub async fn list(
    State(app): State<AppState>,
    caller: Caller,
    Name(parent): Name,
) -> ApiResult<Response> {
    let topic = find_topic(&app, &parent).await;
    authz::view(&caller, &parent, topic.as_deref())?;
    let topic = topic.ok_or_else(|| ApiError::topic_not_found(&parent))?;
    let view = app.meta.view();
    let sees_errors = authz::sees_link_errors(&caller, &topic);
    let (lag, states) = tokio::join!(
        app.queries.children_lag(&view, &topic),
        app.queries.remote_link_states(&view, &topic)
    );
    let mut children: Vec<ChildInfo> = view
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
    // Remote links after the local children; credentials never leave the metadata.
    children.extend(view.remote_links_of(&parent).into_iter().map(|l| {
        let (lag_messages, lag_complete) = lag.get(&l.link).copied().unwrap_or((0, false));
        let status = states.get(&l.link);
        ChildInfo {
            name: l.link.clone(),
            delay_ms: 0,
            lag_messages,
            lag_complete,
            kind: "remote".to_string(),
            remote: Some(RemoteInfo {
                url: l.endpoint.url.clone(),
                topic: l.endpoint.topic.clone(),
            }),
            // The worst of every owner's cursors (absent when none reported).
            state: status.map(|s| s.state.as_str().to_string()),
            // What a remote answered is for the owner and admins only.
            last_error: status
                .filter(|_| sees_errors)
                .and_then(|s| s.last_error.clone()),
        }
    }));
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

/// Detach a child; a local child keeps its data and becomes standalone.
#[utoipa::path(
    delete,
    path = "/v1/topics/{topic}/children/{child}",
    tag = "children",
    operation_id = "detachChild",
    params(
        super::openapi::TopicPath,
        ("child" = String, Path, description = "The child topic or remote link."),
    ),
    responses(
        (status = 204, description = "Detached."),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, description = "The parent does not exist or the child is not attached.", body = ErrorBody),
    ),
)]
pub async fn detach(
    State(app): State<AppState>,
    caller: Caller,
    ParentChild(parent, child): ParentChild,
) -> ApiResult<Response> {
    authz::manage(&caller, &parent, find_topic(&app, &parent).await.as_deref())?;
    app.propose(MetaCommand::DetachChild {
        parent: parent.clone(),
        child: child.clone(),
    })
    .await?;
    app.children.sync().await;
    audit::event("topic.detach", caller.actor(), &format!("{parent}/{child}"));
    Ok(StatusCode::NO_CONTENT.into_response())
}
