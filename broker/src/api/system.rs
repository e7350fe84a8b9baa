//! Probes, metrics and the cluster view (SPEC §3.9, §3.10).

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_api::{ErrorBody, MemberInfo, MoveInfo, MoveList, StatusBody};
use narad_meta::MetaCommand;

use super::{json, AppState};
use crate::error::{ApiError, ApiResult};
use crate::security::{audit, authz, Caller};

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "system",
    operation_id = "healthz",
    responses(
        (status = 200, description = "HTTP is served (even while catching up).", body = StatusBody),
        (status = 503, description = "Graceful shutdown has started (`{\"status\":\"shutting down\"}`).", body = StatusBody),
    ),
)]
pub async fn healthz(State(app): State<AppState>) -> Response {
    if app.health.is_shutting_down() {
        return json(
            StatusCode::SERVICE_UNAVAILABLE,
            &StatusBody {
                status: "shutting down".into(),
            },
        );
    }
    json(
        StatusCode::OK,
        &StatusBody {
            status: "ok".into(),
        },
    )
}

#[utoipa::path(
    get,
    path = "/readyz",
    tag = "system",
    operation_id = "readyz",
    responses(
        (status = 200, description = "Ready: metadata caught up, startup reconciliation done, admitted, root admin present (security on).", body = StatusBody),
        (status = 503, description = "Not ready, with why.", body = ErrorBody),
    ),
)]
pub async fn readyz(State(app): State<AppState>) -> Response {
    if app.health.is_stopping() {
        return ApiError::unavailable("shutting down", 1).into_response();
    }
    if !app.health.is_ready() {
        let why = match app.health.not_ready_reason() {
            "starting up" => "starting: recovery not finished".to_string(),
            "root admin not seeded yet" => {
                "starting: waiting for the root admin to be seeded".to_string()
            }
            other => format!("starting: {other}"),
        };
        return ApiError::unavailable(why, 1).into_response();
    }
    if let Some(why) = app.health.out_of_service() {
        return ApiError::unavailable(why, 1).into_response();
    }
    json(
        StatusCode::OK,
        &StatusBody {
            status: "ready".into(),
        },
    )
}

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "system",
    operation_id = "metrics",
    responses(
        (status = 200, description = "Prometheus text (OpenMetrics when asked for).", content_type = "text/plain"),
        (status = 404, description = "Served on the metrics listener (`http.metrics_addr`) instead.", body = ErrorBody),
    ),
)]
pub async fn metrics(State(app): State<AppState>) -> Response {
    app.refresh_gauges();
    let mut resp = (StatusCode::OK, app.metrics.encode()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    resp
}

/// A `GET /v1/cluster/members` element: the shared `MemberInfo` plus, on the metadata
/// leader, why a drained member is not removed yet (`decommission_reason`, ext).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = Member)]
pub struct MemberOut {
    #[serde(flatten)]
    info: MemberInfo,
    /// (ext) On the metadata leader: why a drained member is not removed yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    decommission_reason: Option<String>,
}

/// `GET /v1/cluster/members` answer.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = MemberList)]
pub struct MemberListOut {
    members: Vec<MemberOut>,
}

#[utoipa::path(
    get,
    path = "/v1/cluster/members",
    tag = "cluster",
    operation_id = "listMembers",
    responses(
        (status = 200, description = "The members, sorted by id.", body = MemberListOut),
        (status = 403, response = super::openapi::Forbidden),
    ),
)]
pub async fn members(State(app): State<AppState>, caller: Caller) -> ApiResult<Response> {
    authz::cluster_read(&caller)?;
    let view = app.meta.view();
    let leader = app.meta.current_leader().map(|l| l.0);
    let members = view
        .members
        .values()
        .map(|m| MemberOut {
            decommission_reason: app.controller.decommission_reason(&m.id),
            info: MemberInfo {
                id: m.id.clone(),
                addr: m.api_addr.clone(),
                status: if m.dead {
                    "dead".into()
                } else {
                    "alive".into()
                },
                draining: m.draining,
                owned_partitions: view
                    .topics
                    .values()
                    .flat_map(|t| t.assignments.iter())
                    .filter(|a| a.owner.as_deref() == Some(m.id.as_str()))
                    .count() as u64,
                outbound_moves: view
                    .topics
                    .values()
                    .flat_map(|t| t.assignments.iter())
                    .filter(|a| a.owner.as_deref() == Some(m.id.as_str()) && a.target.is_some())
                    .count() as u64,
                leader: leader.as_deref() == Some(m.id.as_str()),
                version: m.version.clone(),
            },
        })
        .collect();
    Ok(json(StatusCode::OK, &MemberListOut { members }))
}

#[utoipa::path(
    get,
    path = "/v1/cluster/moves",
    tag = "cluster",
    operation_id = "listMoves",
    responses(
        (status = 200, description = "Partition moves in flight.", body = MoveList),
        (status = 403, response = super::openapi::Forbidden),
    ),
)]
pub async fn moves(State(app): State<AppState>, caller: Caller) -> ApiResult<Response> {
    authz::cluster_read(&caller)?;
    let view = app.meta.view();
    let moves: Vec<MoveInfo> =
        view.topics
            .values()
            .flat_map(|t| {
                t.assignments.iter().enumerate().filter_map(move |(p, a)| {
                    match (&a.owner, &a.target) {
                        (Some(from), Some(to)) => Some(MoveInfo {
                            topic: t.name.clone(),
                            partition: p as u32,
                            from: from.clone(),
                            to: to.clone(),
                        }),
                        _ => None,
                    }
                })
            })
            .collect();
    Ok(json(StatusCode::OK, &MoveList { moves }))
}

/// Start draining a member: it leaves once its partitions moved and its WAL and delay store are empty.
///
/// `POST /v1/cluster/members/{id}/decommission` (SPEC §3.9, §6.5): `204`, `404` unknown
/// member, `503` without a leader.
#[utoipa::path(
    post,
    path = "/v1/cluster/members/{id}/decommission",
    tag = "cluster",
    operation_id = "decommission",
    params(("id" = String, Path, description = "The member's node id.")),
    responses(
        (status = 204, description = "Done."),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, description = "No such member.", body = ErrorBody),
    ),
)]
pub async fn decommission(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    set_draining(&app, &caller, id, true).await
}

/// Cancel a decommission.
///
/// `DELETE /v1/cluster/members/{id}/decommission`: cancels a decommission.
#[utoipa::path(
    delete,
    path = "/v1/cluster/members/{id}/decommission",
    tag = "cluster",
    operation_id = "cancelDecommission",
    params(("id" = String, Path, description = "The member's node id.")),
    responses(
        (status = 204, description = "Done."),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, description = "No such member.", body = ErrorBody),
    ),
)]
pub async fn cancel_decommission(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    set_draining(&app, &caller, id, false).await
}

async fn set_draining(
    app: &crate::app::App,
    caller: &Caller,
    id: String,
    draining: bool,
) -> ApiResult<Response> {
    authz::cluster_admin(caller)?;
    app.propose(MetaCommand::SetDraining {
        id: id.clone(),
        draining,
    })
    .await?;
    audit::event(
        if draining {
            "cluster.decommission"
        } else {
            "cluster.decommission.cancel"
        },
        caller.actor(),
        &id,
    );
    Ok(StatusCode::NO_CONTENT.into_response())
}
