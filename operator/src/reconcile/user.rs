//! User → broker user. Created with its password and the union of its Grants; the password
//! is re-applied (admin reset) whenever its Secret changes (`status.passwordSecretVersion`);
//! grants are corrected when they drift.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event};
use kube::{Api, ResourceExt};
use narad_api::CreateUserRequest;

use super::grant::{grants_differ, list_grants, union_grants};
use super::*;
use crate::crd::validate::check_user;
use crate::crd::{DeletionPolicy, User, UserStatus, FINALIZER};

/// One broker call for a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserAction {
    /// `POST /v1/users` with password and grants.
    Create,
    /// `PUT /v1/users/{u}/password` (admin reset).
    SetPassword,
    /// `PUT /v1/users/{u}/grants`.
    PutGrants,
    /// `PUT /v1/users/{u}/quotas`.
    PutQuotas,
}

/// The calls that converge the broker user: `observed` is its record (`None` if absent),
/// `applied_version`/`secret_version` the password Secret versions applied and current.
/// `want_quotas` is `None` when the spec leaves quotas out (not managed).
pub fn plan_user(
    observed: Option<&narad_api::User>,
    want_grants: &[narad_api::Grant],
    want_quotas: Option<&narad_api::Quotas>,
    applied_version: Option<&str>,
    secret_version: &str,
) -> Vec<UserAction> {
    let none = narad_api::Quotas::default();
    let Some(u) = observed else {
        let mut plan = vec![UserAction::Create];
        if want_quotas.is_some_and(|q| *q != none) {
            plan.push(UserAction::PutQuotas);
        }
        return plan;
    };
    let mut plan = Vec::new();
    if applied_version != Some(secret_version) {
        plan.push(UserAction::SetPassword);
    }
    if grants_differ(&u.grants, want_grants) {
        plan.push(UserAction::PutGrants);
    }
    if let Some(want) = want_quotas {
        if u.quotas.as_ref().unwrap_or(&none) != want {
            plan.push(UserAction::PutQuotas);
        }
    }
    plan
}

/// The version of a password Secret: its uid and resourceVersion (a new Secret of the same
/// name, or any change of it, is a new version). Never derived from the password itself.
pub fn secret_version(s: &Secret) -> String {
    format!(
        "{}/{}",
        s.metadata.uid.as_deref().unwrap_or_default(),
        s.metadata.resource_version.as_deref().unwrap_or_default()
    )
}

/// The controller's entry point for Users.
pub async fn reconcile(user: Arc<User>, ctx: Arc<Context>) -> Result<Action> {
    let ns = user.namespace().unwrap_or_else(|| "default".into());
    let api: Api<User> = Api::namespaced(ctx.client.clone(), &ns);
    let key = object_key(&*user);
    if paused(&*user) {
        return hold_paused(&ctx, &api, &*user).await;
    }
    let r = finalizer(&api, FINALIZER, user, |event| async {
        match event {
            Event::Apply(u) => apply(&api, &u, &ctx).await,
            Event::Cleanup(u) => cleanup(&u, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    if r.is_ok() {
        ctx.succeeded(&key);
    }
    r
}

/// Writes `Ready` (`ready`) and `Synced=False` with `reason` and the message of `err`, then
/// returns `err`.
async fn not_ready(
    ctx: &Context,
    api: &Api<User>,
    u: &User,
    mut status: UserStatus,
    (ready, reason): (bool, &str),
    err: Error,
) -> Result<Action> {
    let msg = match &err {
        Error::Invalid(m) | Error::Waiting(m) => m.clone(),
        Error::Broker(e) => e.to_string(),
        other => other.to_string(),
    };
    set_ready_synced(
        &mut status.conditions,
        (ready, reason, &msg),
        (false, reason, &msg),
        u.metadata.generation,
    );
    write_status(ctx, api, u, &status).await?;
    Err(err)
}

async fn get_user(
    b: &narad_api::Client,
    name: &str,
) -> Result<Option<narad_api::User>, narad_api::Error> {
    match b.get_user(name).await {
        Ok(u) => Ok(Some(u)),
        Err(e) if e.status() == Some(404) => Ok(None),
        Err(e) => Err(e),
    }
}

async fn apply(api: &Api<User>, u: &User, ctx: &Context) -> Result<Action> {
    let status = u.status.clone().unwrap_or_default();
    let exists = status.username.is_some();
    let username = u.username();
    if let Err(msg) = check_user(&username, &status) {
        return not_ready(
            ctx,
            api,
            u,
            status,
            (exists, "Invalid"),
            Error::Invalid(msg),
        )
        .await;
    }
    let ns = u.namespace().unwrap_or_else(|| "default".into());
    let broker = match broker_for(ctx, &ns, &u.spec.cluster_ref.name).await? {
        Ok(b) => b,
        Err(un) => {
            let (reason, msg) = un.condition(&u.spec.cluster_ref.name);
            return not_ready(ctx, api, u, status, (false, reason), Error::Waiting(msg)).await;
        }
    };
    let sref = &u.spec.password_secret_ref;
    let secret = match secrets::credentials_secret(ctx, &ns, &sref.name).await? {
        Ok(s) => s,
        Err(r) => {
            return not_ready(
                ctx,
                api,
                u,
                status,
                (exists, r.reason),
                Error::Waiting(r.message),
            )
            .await;
        }
    };
    let password = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&sref.key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .filter(|p| !p.is_empty());
    let Some(password) = password else {
        let msg = format!("Secret {} has no key {}", sref.name, sref.key);
        return not_ready(
            ctx,
            api,
            u,
            status,
            (exists, "SecretNotFound"),
            Error::Waiting(msg),
        )
        .await;
    };
    let version = secret_version(&secret);
    let grants = list_grants(&ctx.client, &ns).await?;
    let want = union_grants(&u.name_any(), &u.spec.cluster_ref.name, &grants);
    let want_quotas = u.spec.quotas.as_ref().map(|q| q.wire());
    let b = &broker.client;
    let mut done = Vec::new();
    let result: Result<(), narad_api::Error> = async {
        let mut observed = get_user(b, &username).await?;
        let mut applied = status.password_secret_version.clone();
        for _attempt in 0..2 {
            let mut conflict = false;
            let plan = plan_user(
                observed.as_ref(),
                &want,
                want_quotas.as_ref(),
                applied.as_deref(),
                &version,
            );
            for a in plan {
                match &a {
                    UserAction::Create => {
                        let req = CreateUserRequest {
                            username: username.clone(),
                            password: password.clone(),
                            grants: want.clone(),
                        };
                        match b.create_user(&req).await {
                            Err(e) if e.status() == Some(409) => {
                                // Exists already: read back, then converge password and grants.
                                conflict = true;
                                applied = None;
                                break;
                            }
                            r => r.map(drop)?,
                        }
                    }
                    UserAction::SetPassword => b.set_password(&username, None, &password).await?,
                    UserAction::PutGrants => b.put_grants(&username, &want).await.map(drop)?,
                    UserAction::PutQuotas => {
                        let q = want_quotas.clone().unwrap_or_default();
                        b.put_quotas(&username, &q).await.map(drop)?
                    }
                }
                done.push(a);
            }
            if !conflict {
                break;
            }
            observed = get_user(b, &username).await?;
        }
        Ok(())
    }
    .await;
    for a in &done {
        ctx.publish(u, &action_notice(u, &username, &want, a)).await;
    }
    match result {
        Ok(()) => {
            let mut status = status;
            status.username = Some(username);
            status.password_secret_version = Some(version);
            status.observed_generation = u.metadata.generation;
            set_ready_synced(
                &mut status.conditions,
                (true, "Synced", ""),
                (true, "Synced", ""),
                u.metadata.generation,
            );
            write_status(ctx, api, u, &status).await?;
            Ok(Action::requeue(ctx.resync))
        }
        Err(e) => {
            let reason = broker_reason(&e, "UserNotFound");
            not_ready(ctx, api, u, status, (exists, reason), Error::Broker(e)).await
        }
    }
}

async fn cleanup(u: &User, ctx: &Context) -> Result<Action> {
    if u.spec.deletion_policy == DeletionPolicy::Retain {
        return Ok(Action::await_change());
    }
    let ns = u.namespace().unwrap_or_else(|| "default".into());
    let broker = match broker_for(ctx, &ns, &u.spec.cluster_ref.name).await? {
        Ok(b) => b,
        Err(un) => return un.cleanup_error().map_or(Ok(Action::await_change()), Err),
    };
    let name = u
        .status
        .as_ref()
        .and_then(|s| s.username.clone())
        .unwrap_or_else(|| u.username());
    if name == crate::resources::ADMIN_USER {
        return Ok(Action::await_change());
    }
    match broker.client.delete_user(&name).await {
        Err(e) if e.status() != Some(404) => Err(e.into()),
        r => {
            if r.is_ok() {
                let msg = format!("deleted user {name} on the broker");
                ctx.publish(u, &Notice::normal("Deleted", "Delete", msg))
                    .await;
            }
            Ok(Action::await_change())
        }
    }
}

/// The Event of an action taken for `u` (broker user `username`, grants `want`). Never
/// names the password, only the Secret it came from.
pub fn action_notice(
    u: &User,
    username: &str,
    want: &[narad_api::Grant],
    a: &UserAction,
) -> Notice {
    let secret = &u.spec.password_secret_ref.name;
    match a {
        UserAction::Create => Notice::normal(
            "Created",
            "Create",
            format!("created user {username} on the broker, password from Secret {secret}"),
        ),
        UserAction::SetPassword => Notice::normal(
            "PasswordSet",
            "Update",
            format!("set the password of user {username} from Secret {secret}"),
        ),
        UserAction::PutGrants => Notice::normal(
            "GrantsSet",
            "Update",
            format!(
                "set the grants of user {username} to the union of its Grants: {}",
                crate::reconcile::grant::describe(want)
            ),
        ),
        UserAction::PutQuotas => {
            let msg = format!("set the quotas of user {username} to the spec");
            change_notice(
                u.metadata.generation,
                u.status.as_ref().and_then(|s| s.observed_generation),
                msg.clone(),
                msg,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(grants: Vec<narad_api::Grant>) -> narad_api::User {
        narad_api::User {
            username: "billing".into(),
            grants,
            ..Default::default()
        }
    }

    fn g(action: &str, p: &[&str]) -> narad_api::Grant {
        narad_api::Grant {
            action: action.into(),
            patterns: p.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn create_when_absent() {
        assert_eq!(
            plan_user(None, &[], None, None, "v1"),
            vec![UserAction::Create]
        );
    }

    #[test]
    fn in_sync_means_no_calls() {
        let u = user(vec![g("produce", &["a"])]);
        assert!(plan_user(Some(&u), &[g("produce", &["a"])], None, Some("v1"), "v1").is_empty());
    }

    #[test]
    fn secret_change_resets_password() {
        let u = user(vec![]);
        assert_eq!(
            plan_user(Some(&u), &[], None, Some("v1"), "v2"),
            vec![UserAction::SetPassword]
        );
        // Never applied (e.g. the user existed before the resource): reset too.
        assert_eq!(
            plan_user(Some(&u), &[], None, None, "v1"),
            vec![UserAction::SetPassword]
        );
    }

    #[test]
    fn grant_drift_is_corrected() {
        let u = user(vec![g("admin", &[])]);
        assert_eq!(
            plan_user(Some(&u), &[g("consume", &["x"])], None, Some("v1"), "v1"),
            vec![UserAction::PutGrants]
        );
    }

    #[test]
    fn quotas_converge_only_when_declared() {
        let q = narad_api::Quotas {
            produce_msgs_per_s: Some(100),
            max_topics: Some(3),
            ..Default::default()
        };
        // Created, then limited (creation takes no quotas).
        assert_eq!(
            plan_user(None, &[], Some(&q), None, "v1"),
            vec![UserAction::Create, UserAction::PutQuotas]
        );
        let none = narad_api::Quotas::default();
        assert_eq!(
            plan_user(None, &[], Some(&none), None, "v1"),
            vec![UserAction::Create]
        );
        let mut u = user(vec![]);
        assert_eq!(
            plan_user(Some(&u), &[], Some(&q), Some("v1"), "v1"),
            vec![UserAction::PutQuotas]
        );
        u.quotas = Some(q.clone());
        assert!(plan_user(Some(&u), &[], Some(&q), Some("v1"), "v1").is_empty());
        // Left out of the spec: not managed; `{}`: lifted.
        assert!(plan_user(Some(&u), &[], None, Some("v1"), "v1").is_empty());
        assert_eq!(
            plan_user(Some(&u), &[], Some(&none), Some("v1"), "v1"),
            vec![UserAction::PutQuotas]
        );
        u.quotas = None;
        assert!(plan_user(Some(&u), &[], Some(&none), Some("v1"), "v1").is_empty());
        // The spec's camelCase fields map to the broker's.
        let spec: crate::crd::UserQuotas =
            serde_json::from_value(serde_json::json!({"produceMsgsPerS": 100, "maxTopics": 3}))
                .unwrap();
        assert_eq!(spec.wire(), q);
    }

    #[test]
    fn versions() {
        let mut s = Secret::default();
        s.metadata.uid = Some("u".into());
        s.metadata.resource_version = Some("7".into());
        assert_eq!(secret_version(&s), "u/7");
    }
}
