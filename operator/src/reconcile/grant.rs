//! Grant → the broker grants of its user. A user's broker grants are exactly the union of the
//! Grant resources naming it (`union_grants`), written whole with `PUT /v1/users/{u}/grants`
//! when they differ (`grants_differ`). A Grant waits for its User.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event};
use kube::{Api, ResourceExt};

use super::*;
use crate::crd::validate::check_grant;
use crate::crd::{cond, is_true, Grant, GrantAction, GrantStatus, User, FINALIZER};

/// The union of `grants` naming User `user` of cluster `cluster`: one wire grant per action,
/// patterns sorted and deduplicated; Grants being deleted or invalid are left out.
pub fn union_grants(user: &str, cluster: &str, grants: &[Grant]) -> Vec<narad_api::Grant> {
    let mut by_action: BTreeMap<GrantAction, BTreeSet<String>> = BTreeMap::new();
    for g in grants {
        if g.spec.user != user
            || g.spec.cluster_ref.name != cluster
            || g.metadata.deletion_timestamp.is_some()
            || check_grant(&g.spec).is_err()
        {
            continue;
        }
        by_action
            .entry(g.spec.action)
            .or_default()
            .extend(g.spec.patterns.iter().cloned());
    }
    by_action
        .into_iter()
        .map(|(a, p)| narad_api::Grant {
            action: a.as_str().to_string(),
            patterns: if a == GrantAction::Admin {
                Vec::new()
            } else {
                p.into_iter().collect()
            },
        })
        .collect()
}

/// Grants in a canonical form (action → sorted patterns), for comparison.
fn canonical(grants: &[narad_api::Grant]) -> BTreeMap<String, BTreeSet<String>> {
    let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for g in grants {
        m.entry(g.action.clone())
            .or_default()
            .extend(g.patterns.iter().cloned());
    }
    m
}

/// Whether the broker's grants differ from the desired ones (order does not matter).
pub fn grants_differ(have: &[narad_api::Grant], want: &[narad_api::Grant]) -> bool {
    canonical(have) != canonical(want)
}

/// All Grants in `ns` (the union needs every one naming the user).
pub async fn list_grants(client: &kube::Client, ns: &str) -> Result<Vec<Grant>> {
    let api: Api<Grant> = Api::namespaced(client.clone(), ns);
    Ok(api.list(&ListParams::default()).await?.items)
}

/// Makes the broker user's grants equal `want`; `Ok(false)` when they already were.
pub async fn sync_grants(
    b: &narad_api::Client,
    username: &str,
    want: &[narad_api::Grant],
) -> Result<bool, narad_api::Error> {
    let have = b.get_user(username).await?;
    if !grants_differ(&have.grants, want) {
        return Ok(false);
    }
    b.put_grants(username, want).await?;
    Ok(true)
}

/// `produce: a, b; consume: c` (or `none`), for Events.
pub fn describe(grants: &[narad_api::Grant]) -> String {
    if grants.is_empty() {
        return "none".into();
    }
    grants
        .iter()
        .map(|g| match g.patterns.is_empty() {
            true => g.action.clone(),
            false => format!("{}: {}", g.action, g.patterns.join(", ")),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The Event of a grant change made for `g` (`removed`: while it is deleted).
fn grants_notice(g: &Grant, username: &str, want: &[narad_api::Grant], removed: bool) -> Notice {
    let (reason, action, verb) = match removed {
        false => ("GrantsSet", "Update", "applied"),
        true => ("Revoked", "Delete", "removed"),
    };
    Notice::normal(
        reason,
        action,
        format!(
            "Grant {} {verb}: the grants of user {username} are now {}",
            g.name_any(),
            describe(want)
        ),
    )
}

/// The controller's entry point for Grants.
pub async fn reconcile(grant: Arc<Grant>, ctx: Arc<Context>) -> Result<Action> {
    let ns = grant.namespace().unwrap_or_else(|| "default".into());
    let api: Api<Grant> = Api::namespaced(ctx.client.clone(), &ns);
    let key = object_key(&*grant);
    if paused(&*grant) {
        return hold_paused(&ctx, &api, &*grant).await;
    }
    let r = finalizer(&api, FINALIZER, grant, |event| async {
        match event {
            Event::Apply(g) => apply(&api, &g, &ctx).await,
            Event::Cleanup(g) => cleanup(&g, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    if r.is_ok() {
        ctx.succeeded(&key);
    }
    r
}

async fn not_ready(
    ctx: &Context,
    api: &Api<Grant>,
    g: &Grant,
    mut status: GrantStatus,
    reason: &str,
    msg: String,
    err: Error,
) -> Result<Action> {
    set_ready_synced(
        &mut status.conditions,
        (false, reason, &msg),
        (false, reason, &msg),
        g.metadata.generation,
    );
    write_status(ctx, api, g, &status).await?;
    Err(err)
}

async fn apply(api: &Api<Grant>, g: &Grant, ctx: &Context) -> Result<Action> {
    let status = g.status.clone().unwrap_or_default();
    if let Err(msg) = check_grant(&g.spec) {
        return not_ready(
            ctx,
            api,
            g,
            status,
            "Invalid",
            msg.clone(),
            Error::Invalid(msg),
        )
        .await;
    }
    let ns = g.namespace().unwrap_or_else(|| "default".into());
    let users: Api<User> = Api::namespaced(ctx.client.clone(), &ns);
    let user = match users.get_opt(&g.spec.user).await? {
        Some(u) if u.metadata.deletion_timestamp.is_none() => u,
        _ => {
            let msg = format!("User {} does not exist", g.spec.user);
            return not_ready(
                ctx,
                api,
                g,
                status,
                "WaitingForUser",
                msg.clone(),
                Error::Waiting(msg),
            )
            .await;
        }
    };
    let user_ready = user
        .status
        .as_ref()
        .is_some_and(|s| is_true(&s.conditions, cond::READY));
    if !user_ready {
        let msg = format!("User {} is not ready", g.spec.user);
        return not_ready(
            ctx,
            api,
            g,
            status,
            "WaitingForUser",
            msg.clone(),
            Error::Waiting(msg),
        )
        .await;
    }
    let broker = match broker_for(ctx, &ns, &g.spec.cluster_ref.name).await? {
        Ok(b) => b,
        Err(u) => {
            let (reason, msg) = u.condition(&g.spec.cluster_ref.name);
            return not_ready(
                ctx,
                api,
                g,
                status,
                reason,
                msg.clone(),
                Error::Waiting(msg),
            )
            .await;
        }
    };
    let all = list_grants(&ctx.client, &ns).await?;
    let want = union_grants(&g.spec.user, &g.spec.cluster_ref.name, &all);
    match sync_grants(&broker.client, &user.username(), &want).await {
        Ok(changed) => {
            if changed {
                let n = grants_notice(g, &user.username(), &want, false);
                ctx.publish(g, &n).await;
            }
            let mut status = status;
            status.observed_generation = g.metadata.generation;
            set_ready_synced(
                &mut status.conditions,
                (true, "Synced", ""),
                (true, "Synced", ""),
                g.metadata.generation,
            );
            write_status(ctx, api, g, &status).await?;
            Ok(Action::requeue(ctx.resync))
        }
        Err(e) => {
            let reason = broker_reason(&e, "UserNotFound");
            not_ready(ctx, api, g, status, reason, e.to_string(), Error::Broker(e)).await
        }
    }
}

async fn cleanup(g: &Grant, ctx: &Context) -> Result<Action> {
    let ns = g.namespace().unwrap_or_else(|| "default".into());
    let broker = match broker_for(ctx, &ns, &g.spec.cluster_ref.name).await? {
        Ok(b) => b,
        Err(u) => return u.cleanup_error().map_or(Ok(Action::await_change()), Err),
    };
    let users: Api<User> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(user) = users.get_opt(&g.spec.user).await? else {
        return Ok(Action::await_change());
    };
    // This Grant has a deletion timestamp, so the union leaves it out.
    let all = list_grants(&ctx.client, &ns).await?;
    let want = union_grants(&g.spec.user, &g.spec.cluster_ref.name, &all);
    match sync_grants(&broker.client, &user.username(), &want).await {
        Ok(changed) => {
            if changed {
                let n = grants_notice(g, &user.username(), &want, true);
                ctx.publish(g, &n).await;
            }
            Ok(Action::await_change())
        }
        Err(e) if e.status() == Some(404) => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn grant(name: &str, user: &str, action: &str, patterns: &[&str]) -> Grant {
        serde_json::from_value(json!({
            "apiVersion": "narad.io/v1alpha1", "kind": "Grant",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterRef": {"name": "prod"}, "user": user, "action": action,
                     "patterns": patterns},
        }))
        .unwrap()
    }

    fn wire(action: &str, patterns: &[&str]) -> narad_api::Grant {
        narad_api::Grant {
            action: action.into(),
            patterns: patterns.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn union_per_action_sorted_and_deduplicated() {
        let mut deleting = grant("g5", "billing", "consume", &["secret"]);
        deleting.metadata.deletion_timestamp = Some(now());
        let grants = vec![
            grant("g1", "billing", "produce", &["orders-*", "audit"]),
            grant("g2", "billing", "produce", &["audit"]),
            grant("g3", "billing", "consume", &["orders"]),
            grant("g4", "other", "consume", &["x"]),
            deleting,
            grant("g6", "billing", "create", &[]),
        ];
        assert_eq!(
            union_grants("billing", "prod", &grants),
            vec![
                wire("produce", &["audit", "orders-*"]),
                wire("consume", &["orders"])
            ]
        );
        assert!(union_grants("billing", "other-cluster", &grants).is_empty());
        assert!(union_grants("nobody", "prod", &grants).is_empty());
        let admin = vec![grant("a", "ops", "admin", &[])];
        assert_eq!(
            union_grants("ops", "prod", &admin),
            vec![wire("admin", &[])]
        );
    }

    #[test]
    fn comparison_ignores_order() {
        let a = vec![wire("produce", &["b", "a"]), wire("consume", &["x"])];
        let b = vec![wire("consume", &["x"]), wire("produce", &["a", "b"])];
        assert!(!grants_differ(&a, &b));
        assert!(grants_differ(&a, &[wire("consume", &["x"])]));
        assert!(grants_differ(&[], &[wire("admin", &[])]));
        assert!(!grants_differ(&[], &[]));
    }
}
