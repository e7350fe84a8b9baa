//! Users, grants, authentication and authorization (SPEC §4). Pure and tested; the HTTP
//! layer wires it in (`api::authenticate` middleware → `Caller` extractor → `authz` in each
//! handler; `/v1/users` in `api::users`), and `node` seeds the root admin.
//!
//! - [`password`]: argon2id hashing and verification (PHC strings), the root password
//!   generator.
//! - [`authn`]: HTTP Basic parsing and the [`Authenticator`] (verified-credential cache,
//!   negative cache, per-username throttle → `401`/`429`).
//! - [`throttle`]: the token bucket and the injectable [`Clock`].
//! - [`authz`]: pattern matching, name validation and one decision function per route
//!   category, answering the exact SPEC status (`Ok`, `403`, `404`).
//! - [`users`]: conversion between the replicated records (`narad_meta::{User, Grant}`) and
//!   the wire types (`narad_api::{User, Grant}`), and request validation (`400`).
//!
//! # Wiring (for the HTTP layer)
//!
//! ```text
//! security on:  creds = credentials_from_headers(&headers)?             // 401
//!               principal = authenticator.authenticate(&view, &creds)?  // 401 / 429
//!               caller = Caller::User(principal)
//! security off: caller = Caller::SecurityOff                             // no credentials
//! then e.g.     authz::produce(&caller, name, view.topic(name).map(|t| &**t))?   // 403 / 404
//! ```
//!
//! Users live in the Raft metadata (`MetaCommand::{CreateUser, SetGrants, SetPassword,
//! DeleteUser, SeedRoot}`); passwords are hashed by the proposer (`password::hash_async`)
//! before proposing, so apply stays deterministic.

pub mod authn;
pub mod authz;
pub mod password;
pub mod quotas;
pub mod sealing;
pub mod seeding;
pub mod throttle;
pub mod users;

pub use authn::{AuthConfig, AuthError, Authenticator, Credentials};
pub use authz::Denied;
pub use throttle::{Clock, ManualClock, MonotonicClock};

use axum::response::{IntoResponse, Response};
use narad_meta::{Action, Grant, Quotas, User};

use crate::error::{ApiError, ErrorCode};

/// An authenticated user, as of the record it was checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub username: String,
    pub root: bool,
    pub grants: Vec<Grant>,
    /// (ext) The user's quotas (none for root).
    pub quotas: Quotas,
}

impl Principal {
    pub fn from_user(u: &User) -> Self {
        Principal {
            username: u.username.clone(),
            root: u.root,
            grants: u.grants.clone(),
            quotas: u.quotas,
        }
    }

    /// Root or holding the `admin` grant.
    pub fn is_admin(&self) -> bool {
        self.root || self.grants.iter().any(|g| g.action == Action::Admin)
    }

    /// Whether a grant allows `action` on topic `name` (admin: everything). Ownership is not
    /// considered here; see [`authz::can`].
    pub fn holds(&self, action: Action, name: &str) -> bool {
        self.is_admin()
            || self.grants.iter().any(|g| {
                g.action == action && g.patterns.iter().any(|p| authz::pattern_matches(p, name))
            })
    }

    /// Whether any grant pattern (of any action) matches `name` (visibility, SPEC §4.3).
    pub fn any_pattern_matches(&self, name: &str) -> bool {
        self.grants
            .iter()
            .any(|g| g.patterns.iter().any(|p| authz::pattern_matches(p, name)))
    }
}

/// Who is asking: an authenticated user, or nobody because security is off (`--dev`,
/// `NARAD_SECURITY_ENABLED=false`): then everything is allowed and topics get no owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    SecurityOff,
    User(Principal),
}

impl Caller {
    pub fn principal(&self) -> Option<&Principal> {
        match self {
            Caller::SecurityOff => None,
            Caller::User(p) => Some(p),
        }
    }

    /// The owner of a topic this caller creates (`None` with security off).
    pub fn owner(&self) -> Option<String> {
        self.principal().map(|p| p.username.clone())
    }

    /// The `actor` of audit events.
    pub fn actor(&self) -> &str {
        match self {
            Caller::SecurityOff => "-",
            Caller::User(p) => &p.username,
        }
    }
}

/// Security audit events (SPEC §9): `component=audit`, `event`, `actor`, `target`.
pub mod audit {
    /// Logs one audit event at info level. Never pass secrets.
    pub fn event(event: &str, actor: &str, target: &str) {
        tracing::info!(component = "audit", event, actor, target, "{event}");
    }

    /// A username for a log line: as is when it is a valid username, else a placeholder (the
    /// header is attacker-controlled; keep logs readable and bounded).
    fn loggable(username: &str) -> &str {
        if super::authz::validate_username(username).is_ok() {
            username
        } else {
            "<invalid>"
        }
    }

    /// Authentication-failure lines logged per window at most: a client hammering wrong or
    /// unknown credentials must not turn the log into its megaphone.
    pub const AUTH_FAILURE_LINES_PER_WINDOW: u32 = 20;
    pub const AUTH_FAILURE_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

    /// Counts authentication-failure lines per window; past the limit they are dropped and
    /// counted, and the first line of a later window reports how many were dropped.
    pub(crate) struct FailureLogLimiter {
        state: parking_lot::Mutex<(std::time::Instant, u32, u64)>,
    }

    impl FailureLogLimiter {
        pub(crate) fn new() -> Self {
            FailureLogLimiter {
                state: parking_lot::Mutex::new((std::time::Instant::now(), 0, 0)),
            }
        }

        /// `Some(dropped since the last logged line)` if this line may be logged now.
        pub(crate) fn admit(&self, now: std::time::Instant) -> Option<u64> {
            let mut st = self.state.lock();
            if now.duration_since(st.0) >= AUTH_FAILURE_WINDOW {
                st.0 = now;
                st.1 = 0;
            }
            if st.1 >= AUTH_FAILURE_LINES_PER_WINDOW {
                st.2 += 1;
                return None;
            }
            st.1 += 1;
            Some(std::mem::take(&mut st.2))
        }
    }

    fn limiter() -> &'static FailureLogLimiter {
        static L: std::sync::OnceLock<FailureLogLimiter> = std::sync::OnceLock::new();
        L.get_or_init(FailureLogLimiter::new)
    }

    /// Whether an authentication-failure line may be logged now (and says so when earlier ones
    /// were dropped).
    fn may_log() -> bool {
        match limiter().admit(std::time::Instant::now()) {
            None => false,
            Some(0) => true,
            Some(dropped) => {
                tracing::warn!(
                    component = "audit",
                    event = "auth.failed.suppressed",
                    dropped,
                    "authentication-failure lines dropped (more than {AUTH_FAILURE_LINES_PER_WINDOW} per {} s)",
                    AUTH_FAILURE_WINDOW.as_secs()
                );
                true
            }
        }
    }

    pub(crate) fn auth_failed(username: &str, reason: &str) {
        if !may_log() {
            return;
        }
        let u = loggable(username);
        tracing::warn!(
            component = "audit",
            event = "auth.failed",
            actor = u,
            target = u,
            reason,
            "authentication failed"
        );
    }

    pub(crate) fn auth_throttled(username: &str) {
        if !may_log() {
            return;
        }
        let u = loggable(username);
        tracing::warn!(
            component = "audit",
            event = "auth.throttled",
            actor = u,
            target = u,
            "failed-login throttle engaged"
        );
    }
}

/// For handlers past authentication (a password change's current password): `429` with
/// `Retry-After`, or `401`.
impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> ApiError {
        match e {
            AuthError::Throttled { retry_after_secs } => {
                ApiError::throttled(e.message(), retry_after_secs)
            }
            AuthError::Unauthenticated(_) => ApiError::new(ErrorCode::Unauthenticated, e.message()),
        }
    }
}

/// `401` (with `WWW-Authenticate: Basic realm="narad"`) or `429` (with `Retry-After`), body
/// `{"error":…}`: the `ApiError` answer (the one mapping, `crate::error`).
impl IntoResponse for AuthError {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

impl From<Denied> for ApiError {
    fn from(d: Denied) -> Self {
        match d {
            Denied::Forbidden(m) => ApiError::forbidden(m),
            Denied::NotFound(m) => ApiError::not_found(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{header, StatusCode};

    #[test]
    fn auth_failure_lines_are_limited_per_window() {
        use audit::{FailureLogLimiter, AUTH_FAILURE_LINES_PER_WINDOW, AUTH_FAILURE_WINDOW};
        let l = FailureLogLimiter::new();
        let t0 = std::time::Instant::now();
        for _ in 0..AUTH_FAILURE_LINES_PER_WINDOW {
            assert_eq!(l.admit(t0), Some(0));
        }
        for _ in 0..5 {
            assert_eq!(l.admit(t0), None);
        }
        // The next window logs again and reports what was dropped, once.
        let t1 = t0 + AUTH_FAILURE_WINDOW;
        assert_eq!(l.admit(t1), Some(5));
        assert_eq!(l.admit(t1), Some(0));
    }

    #[test]
    fn auth_error_responses() {
        let r = AuthError::Unauthenticated("authentication required".into()).into_response();
        assert_eq!(r.status(), 401);
        assert_eq!(
            r.headers()[header::WWW_AUTHENTICATE],
            "Basic realm=\"narad\""
        );
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        let r = AuthError::Throttled {
            retry_after_secs: 7,
        }
        .into_response();
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "7");
        assert!(r.headers().get(header::WWW_AUTHENTICATE).is_none());
    }

    #[test]
    fn denied_to_api_error() {
        let e: ApiError = Denied::Forbidden("no".into()).into();
        assert_eq!(e.status(), StatusCode::FORBIDDEN);
        let e: ApiError = Denied::NotFound("topic x not found".into()).into();
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        assert_eq!(e.message, "topic x not found");
    }

    #[test]
    fn caller_basics() {
        let p = Principal {
            username: "u".into(),
            root: false,
            grants: vec![],
            quotas: Default::default(),
        };
        let c = Caller::User(p.clone());
        assert_eq!(c.owner().as_deref(), Some("u"));
        assert_eq!(c.actor(), "u");
        assert_eq!(c.principal(), Some(&p));
        assert_eq!(Caller::SecurityOff.owner(), None);
        assert_eq!(Caller::SecurityOff.actor(), "-");
    }
}
