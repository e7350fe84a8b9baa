//! User routes (SPEC §3.8, §4.2): create, list, get, replace grants, change password, delete.
//!
//! Every decision is `security::authz`'s; this module only orders the steps: who may ask at
//! all (`403` before anything that could leak user names), the body (`400`), the target and
//! the escalation rules (`404`/`403`), then the write through Raft (`409`, `503`). Passwords
//! are hashed here (argon2id, on the blocking pool) before proposing, so apply stays
//! deterministic; passwords and hashes are never logged or returned. Changes are audited
//! (`component=audit`, events `user.create`, `user.grants`, `user.password`, `user.quotas`,
//! `user.delete`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_api::{CreateUserRequest, ErrorBody, PasswordRequest, PutGrantsRequest, Quotas};
use narad_meta::{MetaCommand, MetaResponse, User};

use super::{json, read_json, AppState, Name};
use crate::clock::now_ms;
use crate::error::{ApiError, ApiResult};
use crate::security::authz::{self, PasswordChange};
use crate::security::password::{self, HashParams};
use crate::security::{audit, users, Caller};

fn user_answer(resp: MetaResponse) -> ApiResult<Arc<User>> {
    match resp {
        MetaResponse::User(u) => Ok(u),
        other => Err(ApiError::internal(format!(
            "unexpected metadata answer {other:?}"
        ))),
    }
}

fn user_not_found(name: &str) -> ApiError {
    ApiError::not_found(format!("user {name} not found"))
}

/// argon2id with the production parameters, off the async threads.
async fn hash(secret: String) -> ApiResult<String> {
    password::hash_async(secret, HashParams::DEFAULT)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// `POST /v1/users` → `201` user. Admin only; only root grants `admin`.
#[utoipa::path(
    post,
    path = "/v1/users",
    tag = "users",
    operation_id = "createUser",
    request_body = CreateUserRequest,
    responses(
        (status = 201, description = "Created.", body = narad_api::User),
        (status = 400, description = "Bad username, empty password, unknown action, a scoped grant without patterns, a bad pattern, an admin grant with patterns.", body = ErrorBody),
        (status = 403, response = super::openapi::Forbidden),
        (status = 409, description = "The username is taken.", body = ErrorBody),
        (status = 413, response = super::openapi::TooLarge),
    ),
)]
pub async fn create(
    State(app): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    authz::user_admin(&caller)?;
    let req: CreateUserRequest = read_json(&headers, body).await?;
    let grants = users::validate_create(&req).map_err(ApiError::bad_request)?;
    authz::create_user(&caller, &grants)?;
    // Refuse a taken name before paying for a hash (the state machine refuses it anyway).
    if app.meta.view().user(&req.username).is_some() {
        return Err(ApiError::conflict(format!(
            "user {} already exists",
            req.username
        )));
    }
    let CreateUserRequest {
        username, password, ..
    } = req;
    let password_hash = hash(password).await?;
    let user = user_answer(
        app.propose(MetaCommand::CreateUser {
            username,
            password_hash,
            grants,
            root: false,
            now_ms: now_ms(),
        })
        .await?,
    )?;
    audit::event("user.create", caller.actor(), &user.username);
    Ok(json(StatusCode::CREATED, &users::to_wire(&user)))
}

/// `GET /v1/users` → `200` array of users, by name. Admin only.
#[utoipa::path(
    get,
    path = "/v1/users",
    tag = "users",
    operation_id = "listUsers",
    responses(
        (status = 200, description = "Every user, by name (hashes never returned).", body = Vec<narad_api::User>),
        (status = 403, response = super::openapi::Forbidden),
    ),
)]
pub async fn list(State(app): State<AppState>, caller: Caller) -> ApiResult<Response> {
    authz::user_admin(&caller)?;
    let view = app.meta.view();
    let all: Vec<narad_api::User> = view
        .users
        .values()
        .map(|u| users::to_wire(u.as_ref()))
        .collect();
    Ok(json(StatusCode::OK, &all))
}

/// `GET /v1/users/{u}` → `200` user. Admin only.
#[utoipa::path(
    get,
    path = "/v1/users/{user}",
    tag = "users",
    operation_id = "getUser",
    params(super::openapi::UserPath),
    responses(
        (status = 200, description = "The user.", body = narad_api::User),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, description = "No such user.", body = ErrorBody),
    ),
)]
pub async fn get(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
) -> ApiResult<Response> {
    authz::user_admin(&caller)?;
    let view = app.meta.view();
    let user = view.user(&name).ok_or_else(|| user_not_found(&name))?;
    Ok(json(StatusCode::OK, &users::to_wire(user)))
}

/// `PUT /v1/users/{u}/grants` → `200` user. Admin only; root's grants are fixed, nobody
/// changes their own, only root grants `admin`.
#[utoipa::path(
    put,
    path = "/v1/users/{user}/grants",
    tag = "users",
    operation_id = "putGrants",
    params(super::openapi::UserPath),
    request_body = PutGrantsRequest,
    responses(
        (status = 200, description = "The user with its new grants.", body = narad_api::User),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, description = "No such user.", body = ErrorBody),
        (status = 413, response = super::openapi::TooLarge),
    ),
)]
pub async fn put_grants(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    authz::user_admin(&caller)?;
    let req: PutGrantsRequest = read_json(&headers, body).await?;
    let grants = users::validate_put_grants(&req).map_err(ApiError::bad_request)?;
    authz::set_grants(
        &caller,
        &name,
        app.meta.view().user(&name).map(|u| &**u),
        &grants,
    )?;
    let cmd = MetaCommand::SetGrants {
        username: name,
        grants,
        now_ms: now_ms(),
    };
    change_user(&app, &caller, cmd, "user.grants").await
}

/// Proposes a change of a user, audits it as `event`, answers `200` with the user.
async fn change_user(
    app: &AppState,
    caller: &Caller,
    cmd: MetaCommand,
    event: &'static str,
) -> ApiResult<Response> {
    let user = user_answer(app.propose(cmd).await?)?;
    audit::event(event, caller.actor(), &user.username);
    Ok(json(StatusCode::OK, &users::to_wire(&user)))
}

/// `PUT /v1/users/{u}/password` → `204`. One's own needs the right `current_password`
/// (wrong → `403`); an admin resets any non-root password; only root changes root's. The
/// new password applies from the next request (the user record's version changes, which
/// invalidates every cached credential of the user).
#[utoipa::path(
    put,
    path = "/v1/users/{user}/password",
    tag = "users",
    operation_id = "putPassword",
    params(super::openapi::UserPath),
    request_body = PasswordRequest,
    responses(
        (status = 204, description = "Changed; applies from the next request."),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, description = "No such user.", body = ErrorBody),
        (status = 413, response = super::openapi::TooLarge),
    ),
)]
pub async fn put_password(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let req: PasswordRequest = read_json(&headers, body).await?;
    users::validate_password_request(&req).map_err(ApiError::bad_request)?;
    let target = app.meta.view().user(&name).cloned();
    match authz::change_password(
        &caller,
        &name,
        target.as_deref(),
        req.current_password.as_deref(),
    )? {
        PasswordChange::Reset => {}
        PasswordChange::VerifyCurrent => {
            let (Some(target), Some(current)) =
                (target.as_deref(), req.current_password.as_deref())
            else {
                return Err(authz::wrong_current_password().into());
            };
            if !app.auth.verify_current_password(target, current).await? {
                return Err(authz::wrong_current_password().into());
            }
        }
    }
    let PasswordRequest { new_password, .. } = req;
    let password_hash = hash(new_password).await?;
    user_answer(
        app.propose(MetaCommand::SetPassword {
            username: name.clone(),
            password_hash,
            now_ms: now_ms(),
        })
        .await?,
    )?;
    audit::event("user.password", caller.actor(), &name);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// (ext) `PUT /v1/users/{u}/quotas` → `200` user. Replaces the user's quotas (`{}` lifts
/// them). Admin only; root has none, nobody changes their own, only root sets an admin's.
#[utoipa::path(
    put,
    path = "/v1/users/{user}/quotas",
    tag = "users",
    operation_id = "putQuotas",
    params(super::openapi::UserPath),
    request_body = Quotas,
    responses(
        (status = 200, description = "The user with its new quotas.", body = narad_api::User),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, description = "No such user.", body = ErrorBody),
        (status = 413, response = super::openapi::TooLarge),
    ),
)]
pub async fn put_quotas(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    authz::user_admin(&caller)?;
    let req: narad_api::Quotas = read_json(&headers, body).await?;
    let quotas = users::quotas_from_wire(&req).map_err(ApiError::bad_request)?;
    authz::set_quotas(&caller, &name, app.meta.view().user(&name).map(|u| &**u))?;
    let cmd = MetaCommand::SetQuotas {
        username: name,
        quotas,
        now_ms: now_ms(),
    };
    change_user(&app, &caller, cmd, "user.quotas").await
}

/// `DELETE /v1/users/{u}` → `204`. Admin only; root cannot be deleted, nobody deletes
/// themselves.
#[utoipa::path(
    delete,
    path = "/v1/users/{user}",
    tag = "users",
    operation_id = "deleteUser",
    params(super::openapi::UserPath),
    responses(
        (status = 204, description = "Deleted."),
        (status = 403, response = super::openapi::Forbidden),
        (status = 404, description = "No such user.", body = ErrorBody),
    ),
)]
pub async fn delete(
    State(app): State<AppState>,
    caller: Caller,
    Name(name): Name,
) -> ApiResult<Response> {
    authz::user_admin(&caller)?;
    authz::delete_user(&caller, &name, app.meta.view().user(&name).map(|u| &**u))?;
    match app
        .propose(MetaCommand::DeleteUser {
            username: name.clone(),
        })
        .await?
    {
        MetaResponse::UserDeleted(_) => {}
        other => {
            return Err(ApiError::internal(format!(
                "unexpected metadata answer {other:?}"
            )))
        }
    }
    audit::event("user.delete", caller.actor(), &name);
    Ok(StatusCode::NO_CONTENT.into_response())
}
