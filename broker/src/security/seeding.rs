//! Root seeding (SPEC §4.4): the first secured start of a cluster creates the root admin.

use std::time::Duration;

use narad_meta::{Meta, MetaCommand, MetaResponse};
use tokio_util::sync::CancellationToken;

use super::audit;
use super::password::{self, HashParams};
use crate::clock::now_ms;

/// SPEC §4.4: on a secured node whose metadata holds no user, the Raft leader proposes
/// `SeedRoot` with the argon2id hash of `NARAD_ADMIN_PASSWORD`, or of a random 192-bit
/// password that this node then logs exactly once (warn). `SeedRoot` is a no-op once any
/// user exists, so a restart (or another node) never changes an existing root. Retries until
/// the root exists (no leader yet, no quorum) or shutdown.
pub async fn seed_root(meta: Meta, admin_password: Option<String>, shutdown: CancellationToken) {
    let mut changes = meta.subscribe();
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let view = meta.view();
        if view.root_user().is_some() {
            return;
        }
        if !view.users.is_empty() {
            tracing::warn!(
                component = "security",
                users = view.users.len(),
                "security is on but no root admin exists (users were created while security \
                 was off); root is not seeded next to existing users"
            );
            return;
        }
        if meta.is_leader() {
            let (secret, generated) = match admin_password.as_deref() {
                Some(p) if !p.is_empty() => (p.to_string(), false),
                _ => (password::generate_password(), true),
            };
            let hash = match password::hash_async(secret.clone(), HashParams::DEFAULT).await {
                Ok(h) => h,
                Err(e) => {
                    tracing::error!(error = %e, "hashing the root password failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            match meta
                .write(MetaCommand::SeedRoot {
                    password_hash: hash,
                    now_ms: now_ms(),
                })
                .await
            {
                Ok(MetaResponse::User(u)) => {
                    if generated {
                        tracing::warn!(
                            component = "security",
                            username = %u.username,
                            password = %secret,
                            "seeded the root admin with a generated password; it is logged only \
                             this once: store it now, or set NARAD_ADMIN_PASSWORD before the \
                             first start"
                        );
                    } else {
                        tracing::info!(
                            component = "security",
                            username = %u.username,
                            "seeded the root admin with NARAD_ADMIN_PASSWORD"
                        );
                    }
                    audit::event("user.create", "-", &u.username);
                    return;
                }
                // Someone else seeded first (or a user appeared): nothing to do.
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "seeding the root admin failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            }
        }
        tokio::select! {
            r = changes.changed() => {
                if r.is_err() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
